"""A read-only mapping that hashes, for the tables inside frozen option dataclasses.

A ``dict`` field left a frozen config (``RandomSubset.weights``, ``AugmentConfig.normalize`` per camera) unhashable,
so it could not be a set member, a dict key or a ``functools.cache`` argument, and editable through the field. This
one compares equal to a dict of the same items and pickles as one.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from typing import TypeVar

__all__ = ["FrozenMapping"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


class FrozenMapping(Mapping[K, V]):
    """``items`` copied, read-only; hashed by its items (so every value must hash)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:  # (as the dict it was given: configs and their errors print it)
        return repr(self._items)
