"""A rank's pool walk as a saved stream state carries it, and the checks that it fits the plan it is loaded into.

A shuffled rank emits from a pool of episodes whose state at a position (which episodes are pooled, how many
draws each has given, the generator's state) is known only by walking the pool from the epoch's start: ~17 us a
chunk of draws, 3 s of CPU 13.7M samples into an epoch. A state that carries the walk at its position lets a
resume start there, at a cost that does not grow with the position (one chunk walked, at most).

The walk kept is the one at the chunk boundary at or before the position (chunks are a pure function of it). It
is plain ints and lists (JSON and ``torch.save`` take it): the pooled episodes' stream indices and draws (at most
``episode_pool_size`` each) and the Philox state. A state saved after a change of world size also carries each old
rank's pool at its last position (no generator state: those walks do not go on), checked by :func:`checked_pool`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ResumeStateError
from .value_checks import is_int

__all__ = ["SavedWalk", "WalkMismatchError", "checked_pool", "pools_from_lists", "pools_to_lists"]

_INT_FIELDS = ("epoch", "samples_consumed", "rank", "emitted", "next_admit")
#: The Philox state's arrays and their sizes (numpy's ``bit_generator.state``, uint64 words).
_RNG_ARRAYS = {"counter": 4, "key": 2, "buffer": 4}
_RNG_INTS = ("buffer_pos", "has_uint32", "uinteger")


class WalkMismatchError(ResumeStateError):
    """A saved pool walk claims this stream's position but does not fit its plan (another dataset or order)."""


@dataclass(frozen=True, kw_only=True)
class SavedWalk:
    """The pool walk of ``rank`` that serves stream position ``samples_consumed`` of ``epoch``.

    ``emitted`` draws (of the rank's unpadded stream) are behind it; ``slots`` are the pooled episodes' indices in
    the rank's episode stream (admission order), ``drawn`` the draws each has given, ``next_admit`` the stream
    index admitted next, ``rng`` the pool generator's Philox state.
    """

    epoch: int
    samples_consumed: int
    rank: int
    emitted: int
    next_admit: int
    slots: tuple[int, ...]
    drawn: tuple[int, ...]
    rng: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain ints and lists only, as the rest of a stream state."""
        out: dict[str, Any] = {name: int(getattr(self, name)) for name in _INT_FIELDS}
        out["slots"], out["drawn"] = list(self.slots), list(self.drawn)
        out["rng"] = {name: list(self.rng[name]) for name in _RNG_ARRAYS} | {name: self.rng[name] for name in _RNG_INTS}
        return out

    @classmethod
    def from_dict(cls, saved: object) -> SavedWalk:
        """Checks the form only; :meth:`pool_state` checks that it fits a plan."""
        if not isinstance(saved, Mapping) or not {*_INT_FIELDS, "slots", "drawn", "rng"} <= set(saved):
            raise ResumeStateError(
                f"stream state walk must be a dict of {[*_INT_FIELDS, 'slots', 'drawn', 'rng']}, got {saved!r}; pass "
                "the dict that state_dict() returned, or leave its 'walk' out (the resume then replays the pool)"
            )
        ints = {name: saved[name] for name in _INT_FIELDS}
        slots, drawn = _int_list(saved["slots"], "walk slots"), _int_list(saved["drawn"], "walk drawn")
        if not all(is_int(value) and value >= 0 for value in ints.values()) or len(slots) != len(drawn):
            raise ResumeStateError(
                f"stream state walk must hold non-negative ints {list(_INT_FIELDS)} and as many slots as drawn, got "
                f"{saved!r}"
            )
        return cls(
            epoch=int(ints["epoch"]),
            samples_consumed=int(ints["samples_consumed"]),
            rank=int(ints["rank"]),
            emitted=int(ints["emitted"]),
            next_admit=int(ints["next_admit"]),
            slots=slots,
            drawn=drawn,
            rng=_rng_words(saved["rng"]),
        )

    @classmethod
    def of(
        cls, *, epoch: int, samples_consumed: int, rank: int, emitted: int, next_admit: int, slots: np.ndarray,
        drawn: np.ndarray, rng_state: Mapping[str, Any],
    ) -> SavedWalk:  # fmt: skip
        """From a pool walk's arrays and numpy's ``bit_generator.state``."""
        inner = rng_state["state"]
        rng = {"counter": inner["counter"], "key": inner["key"], "buffer": rng_state["buffer"]}
        return cls(
            epoch=epoch,
            samples_consumed=samples_consumed,
            rank=rank,
            emitted=int(emitted),
            next_admit=int(next_admit),
            slots=tuple(slots.tolist()),
            drawn=tuple(drawn.tolist()),
            rng={name: tuple(int(v) for v in value) for name, value in rng.items()}
            | {name: int(rng_state[name]) for name in _RNG_INTS},
        )

    def pool_state(
        self, *, lengths: np.ndarray, first_draw: np.ndarray, pool_size: int, start_rng: Mapping[str, Any],
        natural_position: int,
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:  # fmt: skip
        """``(slots, drawn, rng_state)`` to start the walk from, once checked against the plan it resumes: its rank
        stream's episode ``lengths`` and ``first_draw`` (draws taken before the plan), the pool size, the state of
        its pool generator at the epoch's start (whose key names seed, epoch, world size, segment and rank), and the
        unpadded position the walk must serve. Raises :class:`WalkMismatchError` naming what does not fit."""
        slots = np.asarray(self.slots, dtype=np.int64)
        drawn = np.asarray(self.drawn, dtype=np.int64)
        problem = None
        if list(self.rng["key"]) != [int(v) for v in start_rng["state"]["key"]]:
            problem = "its generator key is not this plan's (another seed, epoch, world size or rank)"
        elif self.emitted > natural_position:
            problem = f"it stands at draw {self.emitted}, past the position it serves ({natural_position})"
        else:
            problem = _pool_problem(self.next_admit, slots, drawn, lengths, first_draw, pool_size, self.emitted)
        if problem is not None:
            raise WalkMismatchError(
                f"the pool walk this stream state carries does not fit this stream: {problem}. The state belongs to "
                "another dataset, episode selection or order options: resume with those, or leave its 'walk' out to "
                "replay the pool to the position (slower)"
            )
        inner = {name: np.array(self.rng[name], dtype=np.uint64) for name in ("counter", "key")}
        buffer = np.array(self.rng["buffer"], dtype=np.uint64)
        rng_state: dict[str, Any] = {"bit_generator": "Philox", "state": inner, "buffer": buffer}
        rng_state |= {name: self.rng[name] for name in _RNG_INTS}
        try:  # (numpy checks the rest: sizes, buffer_pos; an int past its C type's range is an OverflowError)
            np.random.Philox().state = rng_state  # type: ignore[assignment]
        except (TypeError, ValueError, OverflowError) as e:
            raise WalkMismatchError(
                f"the pool walk this stream state carries has a broken Philox state: {e}; leave its 'walk' out to "
                "replay the pool to the position (slower)"
            ) from e
        return slots, drawn, rng_state


def checked_pool(
    pool: tuple[int, tuple[int, ...], tuple[int, ...]], *, lengths: np.ndarray, first_draw: np.ndarray, pool_size: int,
    emitted: int,
) -> tuple[int, np.ndarray, np.ndarray]:  # fmt: skip
    """``(next_admit, slots, drawn)`` of an old rank's pool after its ``emitted`` draws, as a stream state carries it
    (:class:`~.sample_order.ConsumedSegment`), once checked against that rank's plan as :meth:`SavedWalk.pool_state`
    checks a walk. Raises :class:`WalkMismatchError` naming what does not fit."""
    next_admit, slots, drawn = pool[0], np.asarray(pool[1], dtype=np.int64), np.asarray(pool[2], dtype=np.int64)
    problem = _pool_problem(next_admit, slots, drawn, lengths, first_draw, pool_size, emitted)
    if problem is not None:
        raise WalkMismatchError(
            f"an earlier world size's pool this stream state carries does not fit this stream: {problem}. The state "
            "belongs to another dataset, episode selection or order options: resume with those, or leave its "
            "'segment_pools' out to replay those ranks (slower)"
        )
    return next_admit, slots, drawn


def _pool_problem(
    next_admit: int, slots: np.ndarray, drawn: np.ndarray, lengths: np.ndarray, first_draw: np.ndarray,
    pool_size: int, emitted: int,
) -> str | None:  # fmt: skip
    """What keeps a pool (``next_admit``, pooled ``slots`` and their ``drawn``) from being a rank stream's after
    ``emitted`` draws (its episodes' ``lengths``, ``first_draw`` taken before its plan), or None."""
    stream_size = lengths.size
    if next_admit > stream_size or slots.size != drawn.size or np.any(slots < 0) or np.any(slots >= next_admit):
        return f"its pool (next admitted {next_admit}) is not of this rank's {stream_size} episodes"
    if np.any(np.diff(slots) <= 0):
        return "its pooled episodes are not in admission order"
    if slots.size != min(pool_size, stream_size) and next_admit < stream_size:
        return f"its pool holds {slots.size} episodes, not episode_pool_size={pool_size}"
    if np.any(drawn < first_draw[slots]) or np.any(drawn >= lengths[slots]):
        return "its draws per pooled episode do not fit those episodes' lengths"
    behind = int((lengths[:next_admit] - first_draw[:next_admit]).sum()) - int((lengths[slots] - drawn).sum())
    if behind != emitted:
        return f"its episodes give {behind} draws behind it, not the {emitted} it says"
    return None


def pools_to_lists(pools: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...] | None) -> list[Any] | None:
    """Old ranks' pools (:class:`~.sample_order.ConsumedSegment`) as a stream state holds them: plain ints and lists."""
    return None if pools is None else [[next_admit, list(slots), list(drawn)] for next_admit, slots, drawn in pools]


def pools_from_lists(saved: object, world_size: int) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...] | None:
    """What :func:`pools_to_lists` gave, its form checked (one ``[next_admit, slots, drawn]`` per rank of
    ``world_size``, or None); :func:`checked_pool` checks that each fits its rank's plan."""
    if saved is None:
        return None
    if not isinstance(saved, list | tuple) or len(saved) != world_size:
        raise ResumeStateError(
            f"stream state segment_pools must hold, per prior segment, None or one [next_admit, [slots], [drawn]] per "
            f"rank ({world_size}), got {saved!r}; pass the dict that state_dict() returned, or leave its "
            "'segment_pools' out (the resume then replays those ranks)"
        )
    pools = []
    for pool in saved:
        if not isinstance(pool, list | tuple) or len(pool) != 3 or not is_int(pool[0]):
            raise ResumeStateError(f"stream state segment_pools must hold [next_admit, [slots], [drawn]], got {pool!r}")
        slots, drawn = _int_list(pool[1], "segment_pools slots"), _int_list(pool[2], "segment_pools drawn")
        pools.append((int(pool[0]), slots, drawn))
    return tuple(pools)


def _int_list(value: object, name: str, *, low: int = -(2**63), high: int = 2**63) -> tuple[int, ...]:
    """``value``'s ints, each within ``[low, high)`` (int64's by default: an int past it raised OverflowError as
    the pool's arrays were made, not a ResumeStateError)."""
    if not isinstance(value, list | tuple) or not all(is_int(v) and low <= v < high for v in value):
        raise ResumeStateError(f"stream state {name} must be a list of 64-bit ints, got {value!r}")
    return tuple(int(v) for v in value)


def _rng_words(rng: object) -> dict[str, Any]:
    """A saved Philox state (:data:`_RNG_ARRAYS` of words, :data:`_RNG_INTS`) as ints, its form checked."""
    wrong = ResumeStateError(f"stream state walk rng must be a Philox state as state_dict() saves it, got {rng!r}")
    if not isinstance(rng, Mapping) or not all(is_int(rng.get(name)) for name in _RNG_INTS):
        raise wrong
    # (uint64 words: a negative one passed here raised OverflowError, without the hint, as the pool started)
    arrays = {name: _int_list(rng.get(name), f"walk rng {name}", low=0, high=2**64) for name in _RNG_ARRAYS}
    if any(len(arrays[name]) != size for name, size in _RNG_ARRAYS.items()):
        raise wrong
    return arrays | {name: int(rng[name]) for name in _RNG_INTS}
