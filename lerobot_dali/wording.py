"""Counts in messages, singular or plural as the number asks: ``1 episode``, ``2 episodes``, ``1 worker process``."""

from __future__ import annotations

__all__ = ["counted", "plural"]


def plural(unit: str) -> str:
    """``unit``'s plural: ``episode`` -> ``episodes``, ``batch`` -> ``batches``, ``worker process`` -> ``worker
    processes``, ``CPU`` -> ``CPUs``."""
    return f"{unit}es" if unit.endswith(("s", "x", "ch", "sh")) else f"{unit}s"


def counted(count: int, unit: str) -> str:
    """``count`` and ``unit``, in the plural but for 1: ``1 episode``, ``0 rows``, ``12 video files``."""
    return f"{count} {unit if count == 1 else plural(unit)}"
