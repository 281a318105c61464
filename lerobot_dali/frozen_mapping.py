"""A read-only dict that hashes, for the tables inside frozen option dataclasses.

A ``dict`` field left a frozen config (``RandomSubset.weights``, ``AugmentConfig.normalize`` per camera) unhashable,
so it could not be a set member, a dict key or a ``functools.cache`` argument, and editable through the field. This
one is still a dict where code asks for one: ``dataclasses.asdict`` turns the dataclasses in it into dicts and
``json.dumps`` writes it (as a ``Mapping`` that was not a dict, neither did: ``json.dumps(asdict(config))`` raised
TypeError); it compares equal to a dict of the same items and pickles as itself.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NoReturn, TypeVar

__all__ = ["FrozenMapping"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class FrozenMapping(dict[K, V]):
    """``dict(*args)``, read-only; hashed by its items (so every value must hash, as a config's do)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]  # (dict's is None)
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:  # (pickle's default for a dict fills it through __setitem__)
        return type(self), (dict(self),)

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: make a new config (dataclasses.replace) to change it")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only
