"""A rank's pool walk as a saved stream state carries it, and the checks that it fits the plan it is loaded into.

A shuffled rank emits from a pool of episodes whose state at a position (which episodes are pooled, how many
draws each has given, the generator's state) is known only by walking the pool from the epoch's start: ~17 us a
chunk of draws, 3 s of CPU 13.7M samples into an epoch. A state that carries the walk at its position lets a
resume start there, at a cost that does not grow with the position (one chunk walked, at most).

The walk kept is the one at the chunk boundary at or before the position (chunks are a pure function of it). It
is plain ints and lists (JSON and ``torch.save`` take it): the pooled episodes' stream indices and draws (at most
``episode_pool_size`` each) and the Philox state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ResumeStateError
from .value_checks import is_int

__all__ = ["SavedWalk", "WalkMismatchError"]

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
        slots, drawn = _int_list(saved["slots"], "slots"), _int_list(saved["drawn"], "drawn")
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
        stream_size = lengths.size
        problem = None
        if list(self.rng["key"]) != [int(v) for v in start_rng["state"]["key"]]:
            problem = "its generator key is not this plan's (another seed, epoch, world size or rank)"
        elif self.next_admit > stream_size or np.any(slots < 0) or np.any(slots >= self.next_admit):
            problem = f"its pool (next admitted {self.next_admit}) is not of this rank's {stream_size} episodes"
        elif np.any(np.diff(slots) <= 0):
            problem = "its pooled episodes are not in admission order"
        elif slots.size != min(pool_size, stream_size) and self.next_admit < stream_size:
            problem = f"its pool holds {slots.size} episodes, not episode_pool_size={pool_size}"
        elif np.any(drawn < first_draw[slots]) or np.any(drawn >= lengths[slots]):
            problem = "its draws per pooled episode do not fit those episodes' lengths"
        else:
            admitted = int((lengths[: self.next_admit] - first_draw[: self.next_admit]).sum())
            emitted = admitted - int((lengths[slots] - drawn).sum())
            if emitted != self.emitted:
                problem = f"its episodes give {emitted} draws behind it, not the {self.emitted} it says"
            elif self.emitted > natural_position:
                problem = f"it stands at draw {self.emitted}, past the position it serves ({natural_position})"
        if problem is not None:
            raise WalkMismatchError(
                f"the pool walk this stream state carries does not fit this stream: {problem}. The state belongs to "
                "another dataset, episode selection or order options: resume with those, or leave its 'walk' out to "
                "replay the pool to the position (slower)"
            )
        inner = {"counter": self._words("counter"), "key": self._words("key")}
        rng_state: dict[str, Any] = {"bit_generator": "Philox", "state": inner, "buffer": self._words("buffer")}
        rng_state |= {name: self.rng[name] for name in _RNG_INTS}
        try:  # (numpy checks the rest: sizes, buffer_pos)
            np.random.Philox().state = rng_state  # type: ignore[assignment]
        except (TypeError, ValueError) as e:
            raise WalkMismatchError(f"the pool walk this stream state carries has a broken Philox state: {e}") from e
        return slots, drawn, rng_state

    def _words(self, name: str) -> np.ndarray:
        try:
            return np.array(self.rng[name], dtype=np.uint64)
        except OverflowError as e:
            raise WalkMismatchError(f"the saved pool walk's rng {name} is not uint64 words: {e}") from e


def _int_list(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(is_int(v) for v in value):
        raise ResumeStateError(f"stream state walk {name} must be a list of ints, got {value!r}")
    return tuple(int(v) for v in value)


def _rng_words(rng: object) -> dict[str, Any]:
    """A saved Philox state (:data:`_RNG_ARRAYS` of words, :data:`_RNG_INTS`) as ints, its form checked."""
    wrong = ResumeStateError(f"stream state walk rng must be a Philox state as state_dict() saves it, got {rng!r}")
    if not isinstance(rng, Mapping) or not all(is_int(rng.get(name)) for name in _RNG_INTS):
        raise wrong
    arrays = {name: _int_list(rng.get(name), f"rng {name}") for name in _RNG_ARRAYS}
    if any(len(arrays[name]) != size for name, size in _RNG_ARRAYS.items()):
        raise wrong
    return arrays | {name: int(rng[name]) for name in _RNG_INTS}
