"""Counts in messages, singular or plural as the number asks: ``1 episode``, ``2 episodes``, ``1 worker process``."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

__all__ = ["counted", "first_named", "plural"]

#: How many items a message names before it only counts the others ("(and 3 more files)").
_NAMED = 5


def plural(unit: str) -> str:
    """``unit``'s plural: ``episode`` -> ``episodes``, ``batch`` -> ``batches``, ``worker process`` -> ``worker
    processes``, ``CPU`` -> ``CPUs``."""
    return f"{unit}es" if unit.endswith(("s", "x", "ch", "sh")) else f"{unit}s"


def counted(count: int, unit: str) -> str:
    """``count`` and ``unit``, in the plural but for 1: ``1 episode``, ``0 rows``, ``12 video files``."""
    return f"{count} {unit if count == 1 else plural(unit)}"


def first_named(names: Iterable[str], count: int, unit: str) -> str:
    """The first :data:`_NAMED` of ``names`` (of ``count`` in all; only those are taken) joined by ``"; "``, and how
    many more (``" (and 3 more files)"``): a refusal of thousands of files stays readable, and says how many."""
    said = "; ".join(itertools.islice(names, _NAMED))
    return said + (f" (and {counted(count - _NAMED, f'more {unit}')})" if count > _NAMED else "")
