"""Resume state of a rank's sample stream, and the small stream object that produces and loads it.

Resuming starts the tabular order (no decode) at the saved position: a shuffled rank's pool walk from the one
the state carries (:mod:`.saved_walk`), at a cost that does not grow with the position; states saved without one
(by version 2), or loaded on another world size or rank, replay the pool from the epoch's start. What is guaranteed:

* **Same world size** (the usual case): the stream continues at exactly the next sample; the concatenation
  of the interrupted and resumed streams equals the uninterrupted one.
* **Another world size** (a warning is logged): the rest of the interrupted epoch is exactly the frames the
  old ranks had not yet consumed, each once (before :class:`~lerobot_dali.sample_order.RankBalance`
  padding), re-sharded over the new ranks. No frame consumed before the change comes again in that epoch
  (PAD repeats aside), and none is skipped, except by DROP balancing, or when fewer unconsumed episodes are
  left than ranks (then the epoch ends early, logged; a resume of that on fewer ranks before its next batch
  reads them after all). Not consumed includes what ``drop_last`` was about to leave out: resumed after an
  epoch's last full batch, the old ranks' tails (each short of a batch) are re-sharded, and the new ranks may read
  them in whole batches where the uninterrupted run would have dropped them (each once all the same). Later epochs
  are those of a fresh run on the new world size. Computing the residual
  replays every old rank's consumed prefix but the saving rank's (its walk): CPU proportional to the samples
  consumed in the epoch (~0.2 us a sample; 4.5 s at 95% of an epoch of 92,000 episodes on 8 old ranks), once per
  rank (DALI's workers get it with the order), memory O(episodes). States saved in the rest of that epoch carry
  every old rank's pool at its position (``segment_pools``, ~130 ints a rank), so a later resume replays none.
  Where every old rank saved its state, :func:`merge_rank_states` gathers their walks into one state
  (``rank_walks``), whose first resume on another world size replays none either (0.06 s of CPU, not 4.6).

The state holds the :class:`~lerobot_dali.sample_order.OrderOptions` that define the order. A resume adopts the
saved seed (logged) but refuses another shuffle, pool size (when shuffled) or balance (on several ranks): under
those the saved position means other samples, so the rest of the epoch would repeat some and skip others.
The state also names the episode lengths it ran over (a count, the frames and a digest; states saved before it lack
it): a resume over others is refused, as the saved position would mean other samples. (``DALILeRobotIterator`` adds
which episodes it reads too, by index, and which datasets, by content: a resume over others of the same shape warns.)
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import fork_locks
from .errors import ResumeStateError
from .said_once import say_once, warn_once
from .sample_order import ConsumedSegment, OrderOptions, RankBalance, ResumedEpoch, SampleOrder
from .saved_walk import SavedWalk, pools_from_lists, pools_to_lists
from .value_checks import check_int_fields, is_int, plain_data
from .wording import counted

__all__ = ["SampleStream", "StreamState", "merge_rank_states"]

logger = logging.getLogger(__name__)

#: 2: ranks get episodes by a greedy deal and the state records the order options. Version 1 states still load
#: where the deal does not matter (one rank, or at an epoch's start). 3: the state carries the pool walk at its
#: position (``walk``); version 2 states load by replaying the pool.
_VERSION = 3
_VERSIONS = (1, 2, _VERSION)
_FIELDS = ("seed", "epoch", "samples_consumed", "world_size", "batch_size")
#: The order options besides the seed that a state records, and a resume must match.
_ORDER_FIELDS = (
    "shuffle", "episode_pool_size", "rank_balance", "piece_frames", "drop_n_first_frames", "drop_n_last_frames"
)  # fmt: skip
#: Order fields states saved before them lack, and the value they ran as.
_LATER_ORDER_FIELDS = {"piece_frames": None, "drop_n_first_frames": 0, "drop_n_last_frames": 0}
#: The iterator's argument for an order field whose name differs (what an error tells a user to pass).
_ARGUMENT_NAMES = {"piece_frames": "episode_piece_frames"}


def _order_of(options: OrderOptions) -> dict[str, Any]:
    """The :data:`_ORDER_FIELDS` of ``options`` as a state holds them (enums by value)."""
    values = {name: getattr(options, name) for name in _ORDER_FIELDS}
    return {name: value.value if isinstance(value, enum.Enum) else value for name, value in values.items()}


@dataclass(frozen=True, kw_only=True)
class StreamState:
    """Where a rank's stream stands: ``samples_consumed`` samples of ``epoch`` taken by each rank.

    ``prior_segments`` is empty unless the world size changed inside this epoch: then it lists, oldest
    first, how many samples each earlier world size's ranks took, and ``samples_consumed`` counts within
    the residual plan (each with its ranks' pools there where shuffled: ``segment_pools`` in the dict, which states
    saved before them lack). ``order`` holds the :data:`_ORDER_FIELDS` it was saved with (None in states saved
    before they were recorded: not checked). ``walk`` is the saving rank's pool walk at this position (None where
    unshuffled, or saved before version 3); ``rank_walks`` the other ranks' walks at this position, where
    :func:`merge_rank_states` gathered them (``rank_walks`` in the dict). ``gathered``: how many ranks' states
    :func:`merge_rank_states` found at this one position, each rank once (``gathered_ranks`` in the dict; 0: one
    rank's own state); ``gathered_rank_ids`` which of them named their rank (sorted), so a merge of merged states counts
    each rank it holds, the ranks walks do not name too (``rank_balance='none'``, unshuffled).
    ``rank``: the rank that saved it, kept where ``rank_balance='none'`` on several ranks (``saved_rank`` in the
    dict; None elsewhere, where every rank stands at one position): each rank's count there is its own.
    """

    seed: int
    epoch: int
    samples_consumed: int
    world_size: int
    batch_size: int
    prior_segments: tuple[ConsumedSegment, ...] = ()
    order: Mapping[str, Any] | None = None
    walk: SavedWalk | None = None
    rank_walks: tuple[SavedWalk, ...] = ()
    lengths: str | None = None
    gathered: int = 0
    gathered_rank_ids: tuple[int, ...] = ()
    rank: int | None = None
    version: int = _VERSION

    def __post_init__(self) -> None:
        minimums = ((name, 1 if name in ("world_size", "batch_size") else 0) for name in _FIELDS)
        check_int_fields(self, minimums, label="stream state field {!r}".format, error=ResumeStateError)
        object.__setattr__(self, "prior_segments", tuple(self.prior_segments))
        object.__setattr__(self, "rank_walks", tuple(self.rank_walks))
        object.__setattr__(self, "gathered_rank_ids", tuple(self.gathered_rank_ids))
        self._check_ranks()

    def _check_ranks(self) -> None:
        """Refuse ranks past the world size the state was saved on: ``gathered_rank_ids`` [0, 2] of 2 ranks (an edited
        state, or one put together from another run's) counted as both ranks, and under rank_balance='none' stood for
        rank 1 at that position where rank 1 never saved there."""
        named = {
            "saved_rank": [] if self.rank is None else [self.rank],
            "gathered_rank_ids": list(self.gathered_rank_ids),
            "walks": [walk.rank for walk in self.walks],
        }
        beyond = {name: [rank for rank in ranks if rank >= self.world_size] for name, ranks in named.items()}
        said = "; ".join(f"{name} {ranks}" for name, ranks in beyond.items() if ranks)
        if said or self.gathered > self.world_size:
            raise ResumeStateError(
                f"stream state names ranks past the {self.world_size} it was saved on ("
                f"{said or f'gathered_ranks {self.gathered}'}; world_size {self.world_size}: ranks 0 to "
                f"{self.world_size - 1}): it was edited, or put together from the states of runs on other world sizes. "
                "Load a state_dict() as saved, or merge_rank_states() of the states every rank of one run saved at "
                "one step"
            )

    @property
    def walks(self) -> tuple[SavedWalk, ...]:
        """Every rank's pool walk this state carries: the saving rank's, then those gathered."""
        return (self.walk, *self.rank_walks) if self.walk is not None else self.rank_walks

    def to_dict(self) -> dict[str, Any]:
        """Plain ints and lists only, so it goes into any checkpoint format."""
        out: dict[str, Any] = {"version": self.version}
        out.update({name: int(getattr(self, name)) for name in _FIELDS})
        out["prior_segments"] = [[s.world_size, s.samples_consumed] for s in self.prior_segments]
        if any(s.pools is not None for s in self.prior_segments):
            out["segment_pools"] = [pools_to_lists(s.pools) for s in self.prior_segments]
        if self.order is not None:
            out["order"] = dict(self.order)
        if self.walk is not None:
            out["walk"] = self.walk.to_dict()
        if self.rank_walks:
            out["rank_walks"] = [walk.to_dict() for walk in self.rank_walks]
        if self.lengths is not None:
            out["episode_lengths"] = self.lengths
        if self.gathered:
            out["gathered_ranks"] = int(self.gathered)
        if self.gathered_rank_ids:
            out["gathered_rank_ids"] = [int(rank) for rank in self.gathered_rank_ids]
        if self.rank is not None:
            out["saved_rank"] = int(self.rank)
        return out

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> StreamState:
        if not isinstance(state, Mapping):
            raise ResumeStateError(f"a stream state is a dict, got {type(state).__name__}")
        if state.get("version") not in _VERSIONS:
            raise ResumeStateError(
                f"stream state version {state.get('version')!r} is not supported (expected one of {_VERSIONS}); "
                "it was saved by another lerobot_dali version"
            )
        missing = [name for name in (*_FIELDS, "prior_segments") if name not in state]
        if missing:
            raise ResumeStateError(f"stream state lacks {missing}; pass the dict that state_dict() returned")
        try:
            segments = tuple(ConsumedSegment(int(ws), int(n)) for ws, n in state["prior_segments"])
        except (TypeError, ValueError) as e:
            raise ResumeStateError(
                f"stream state prior_segments must be [[world_size, samples_consumed], ...], "
                f"got {state['prior_segments']!r}"
            ) from e
        pools = state.get("segment_pools")
        if isinstance(pools, list | tuple) and len(pools) == len(segments):  # (else others': a state edited)
            segments = tuple(
                dataclasses.replace(segment, pools=pools_from_lists(pool, segment.world_size))
                for segment, pool in zip(segments, pools, strict=True)
            )
        order = state.get("order")
        required = set(_ORDER_FIELDS) - set(_LATER_ORDER_FIELDS)
        if order is not None and (not isinstance(order, Mapping) or not required <= set(order) <= set(_ORDER_FIELDS)):
            raise ResumeStateError(f"stream state order must be a dict of {list(_ORDER_FIELDS)}, got {order!r}")
        fields = {name: state[name] for name in _FIELDS}
        walk = SavedWalk.from_dict(state["walk"]) if state.get("walk") is not None else None
        rank_walks = state.get("rank_walks", ())
        if not isinstance(rank_walks, list | tuple):
            raise ResumeStateError(
                f"stream state rank_walks must be a list of walks, got {rank_walks!r}; pass what merge_rank_states() "
                "returned, or leave its 'rank_walks' out (the resume then replays those ranks)"
            )
        lengths = state.get("episode_lengths")
        if lengths is not None and not isinstance(lengths, str):
            raise ResumeStateError(
                f"stream state episode_lengths must be the text state_dict() saved, got {lengths!r}; leave it out to "
                "resume without checking the episodes"
            )
        # (ints as the other fields take them, numpy's too: a checkpoint format may give those)
        gathered = state.get("gathered_ranks", 0)
        if not is_int(gathered) or gathered < 0:
            raise ResumeStateError(
                f"stream state gathered_ranks must be the count merge_rank_states() saved, got {gathered!r}"
            )
        rank_ids = state.get("gathered_rank_ids", [])
        if not isinstance(rank_ids, list | tuple) or not all(is_int(r) and r >= 0 for r in rank_ids):
            raise ResumeStateError(
                f"stream state gathered_rank_ids must be the ranks merge_rank_states() saved, got {rank_ids!r}"
            )
        rank = state.get("saved_rank")
        if rank is not None and (not is_int(rank) or rank < 0):
            raise ResumeStateError(f"stream state saved_rank must be the rank state_dict() saved, got {rank!r}")
        return cls(
            **fields,
            prior_segments=segments,
            gathered=int(gathered),
            gathered_rank_ids=tuple(int(r) for r in rank_ids),
            rank=None if rank is None else int(rank),
            order=order,
            walk=walk,
            rank_walks=tuple(SavedWalk.from_dict(w) for w in rank_walks),
            lengths=lengths,
            version=state["version"],
        )


def merge_rank_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state for a resume on another world size, from the states that all ranks of a run saved at one step.

    A resume on another world size must know every old rank's pool where it stopped; a state knows its own rank's
    (``walk``), and the others' are replayed from the epoch's start (~0.2 us of CPU a sample: 4.6 s per new rank at
    95% of an epoch of 92,000 episodes saved on 8 ranks). The merged state is the first of ``states`` carrying the
    others' walks too (``rank_walks``, ~140 ints a rank), so that resume replays none. States of other positions or
    runs (an iterator's over other ``episodes``) are refused (:class:`~lerobot_dali.errors.ResumeStateError`), as
    states without a walk (unshuffled or from an older version: nothing to gather) add none. The merged state counts
    the ranks whose states it gathered, each once (``gathered_ranks``; which, ``gathered_rank_ids``, so a merge of
    merged states counts every rank they hold): with ``rank_balance='none'`` a resume on another world size takes only
    a state of every old rank, all at the start of one epoch (ranks of unequal counts finish epochs apart); on the same
    world size a state of every rank resumes each, mid-epoch too."""
    if not states:
        raise ResumeStateError("merge_rank_states needs at least one stream state (each rank's state_dict())")
    parsed = [StreamState.from_dict(state) for state in states]
    first = parsed[0]
    for other in states[1:]:
        _check_same_extras(states[0], other)

    def position(state: StreamState) -> StreamState:
        return dataclasses.replace(state, walk=None, rank_walks=(), gathered=0, gathered_rank_ids=(), rank=None)

    for state in parsed[1:]:
        if position(state) != position(first):
            where = [
                f"sample {s.samples_consumed} of epoch {s.epoch} on {s.world_size} ranks, seed {s.seed}"
                for s in (first, state)
            ]
            raise ResumeStateError(
                f"merge_rank_states needs the states every rank of one run saved at one step: {where[0]} and "
                f"{where[1]} (or their segments or options) stand at other positions or were saved by other runs"
            )
    walks = {walk.rank: walk for state in parsed for walk in state.walks}
    ranks = {*walks, *(rank for state in parsed for rank in _named_ranks(state))}  # (each below the world size)
    own = first.walk.rank if first.walk is not None else None
    others = [walks[rank] for rank in sorted(walks) if rank != own]
    merged = dataclasses.replace(
        first, rank_walks=tuple(others), gathered=_ranks_gathered(parsed, ranks), gathered_rank_ids=tuple(sorted(ranks))
    )
    return {**states[0], **merged.to_dict()}


def _named_ranks(state: StreamState) -> set[int]:
    """The ranks ``state`` names besides its walks': the one that saved it, and those a merge gathered it from (a merge
    of merged states kept only the first state's ``saved_rank``, so under rank_balance='none', unshuffled, where no
    walk names a rank, ``merge_rank_states([merge_rank_states([s0, s1]), s2])`` counted 2 of 3 ranks)."""
    return {*state.gathered_rank_ids, *([] if state.rank is None else [state.rank])}


def _names_a_rank(state: StreamState) -> bool:
    """Whether ``state`` says which rank(s) it is: by ``saved_rank``, a walk or the ranks a merge gathered it from.
    States saved before ``saved_rank`` (unshuffled, or by version 2) do not, nor balanced ones (every rank at one
    position: no need)."""
    return bool(_named_ranks(state) or state.walks)


def _ranks_held(state: StreamState) -> int:
    """How many ranks' positions ``state`` stands for: what :func:`merge_rank_states` gathered (0: one rank's own
    state), but at most one where it names no rank (:func:`_names_a_rank`): every rank's such states look alike, as
    one rank's passed for each (``[state] * world_size`` of a job that saves rank 0's alone) does, so a merge of them
    (which counted each, before) may be one rank's."""
    return state.gathered if _names_a_rank(state) else min(state.gathered, 1)


def _ranks_gathered(states: Sequence[StreamState], ranks: set[int]) -> int:
    """How many ranks ``states`` (at one position) stand for: each rank once, by the rank that saved it, its walk or the
    ranks a merge gathered it from (``ranks``; one rank's state passed twice, as ``[state] * world_size`` of a job that
    saves rank 0's alone, is one rank's: counted as every rank's, it let rank_balance='none' take it as every rank at
    that epoch's start); states that name no rank (saved before ``saved_rank``, or balanced) count as one together
    (each counted, ``[state] * world_size`` of such a state let rank_balance='none' take it as every rank's), and as
    none beside states that name ranks (it may be one of theirs: rank 1's state saved before saved_rank beside its
    own saved after counted 2 ranks, taken under 'none' as both of 2 ranks'), and a state merged before without
    ``gathered_rank_ids`` (saved before them) at least as the ranks it gathered."""
    unnamed = not ranks and not all(_names_a_rank(state) for state in states)
    return max(len(ranks) + unnamed, *(_ranks_held(state) for state in states))


#: The keys a :class:`StreamState`'s dict holds; an iterator's adds others (``episodes``, its episodes' digest, its
#: datasets' contents, identities and descriptions, :func:`~.dataset_union.datasets_held`, and ``augment_version``).
_STATE_KEYS = frozenset(
    {"version", *_FIELDS, "prior_segments", "segment_pools", "order", "walk", "rank_walks", "episode_lengths",
     "gathered_ranks", "gathered_rank_ids", "saved_rank"}
)  # fmt: skip


#: The key of an iterator's state naming its datasets (paths, URLs: :func:`~.dataset_union.datasets_held`), which
#: names them alone: each rank of one run may read its own copy (a node-local path), so gathered states may differ in
#: it (their contents may not).
DATASET_DESCRIPTIONS = "dataset_descriptions"


def _check_same_extras(first: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Refuse to gather states whose keys beyond the stream's differ: an iterator's ``episodes`` says which episodes
    it read, and another run's walk over other episodes was gathered, its resume failing with WalkMismatchError (or,
    where the walk happened to fit, reading another order)."""
    extras = (first.keys() | state.keys()) - _STATE_KEYS - {DATASET_DESCRIPTIONS}
    # (as plain data: one state through JSON holds a list where another, through a serializer keeping tuples, a tuple)
    differ = sorted(k for k in extras if plain_data(first.get(k)) != plain_data(state.get(k)))
    if differ:
        said = "; ".join(f"{k}: {first.get(k)!r} and {state.get(k)!r}" for k in differ)
        raise ResumeStateError(
            f"merge_rank_states needs the states every rank of one run saved at one step, but they differ in {said}: "
            "pass only the states of the run being resumed (another run's, over other episodes, does not fit)"
        )


class SampleStream:
    """One rank's stream across epochs: batches in order, ``set_epoch``, ``state_dict``/``load_state_dict``.

    ``samples_consumed`` counts samples handed out by :meth:`next_batch`; save the state when the trainer
    has taken them (not when a prefetcher has), so resume continues where training stopped.

    Safe across threads: a :meth:`load_state_dict` from another thread takes effect between two batches, never inside
    one (a batch read at the old position, completed after the load, moved the loaded position one batch on). Where
    batches are read elsewhere (DALI's workers), :meth:`advance` and :meth:`set_epoch` take the :attr:`loads` the read
    began under, and count nothing where a load came since.
    """

    def __init__(
        self,
        episode_lengths: np.ndarray,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        options: OrderOptions | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        #: Held to move the position, so a load from another thread lands between two moves (an RLock: a signal
        #: handler's state_dict() or load on the thread holding it goes on).
        self._lock = fork_locks.lock()
        self._loads = 0
        #: What made the last of those moves (``load_state_dict()``, ``set_epoch()``, or a mixture's call that moved
        #: its datasets), and the thread that called it: named by the pass it ended.
        self.moved: tuple[str, int] = ("load_state_dict()", threading.get_ident())
        self._lengths = np.asarray(episode_lengths)
        self._fingerprint = _lengths_fingerprint(self._lengths)
        self._batch_size = batch_size
        self._order = SampleOrder(self._lengths, rank=rank, world_size=world_size, options=options)
        #: (epoch, samples consumed), one attribute so a ``state_dict()`` taken from another thread (an asynchronous
        #: checkpoint) never pairs a new epoch with the old one's count.
        self._position = (0, 0)

    @property
    def order(self) -> SampleOrder:
        return self._order

    @property
    def epoch(self) -> int:
        return self._position[0]

    @property
    def samples_consumed(self) -> int:
        return self._position[1]

    @property
    def loads(self) -> int:
        """How many times the position was moved from outside the reads: states :meth:`load_state_dict` loaded, and
        :meth:`set_epoch` calls (without ``loads``) that started another epoch. A read that began under one count
        belongs to the position before any later move (pass it to :meth:`advance` and :meth:`set_epoch`)."""
        return self._loads

    def num_samples(self) -> int:
        """Samples in the current epoch (equal on every rank)."""
        return self._order.num_samples(self.epoch)

    def set_epoch(self, epoch: int, *, loads: int | None = None) -> bool:
        """Start ``epoch`` from its beginning; the current epoch keeps its position (so a training loop that
        calls ``set_epoch`` after ``load_state_dict`` does not undo the resume). ``loads``: the :attr:`loads` of the
        pass that ended; where a load came since, the stream stays where it put it (False). Without ``loads`` (the
        trainer's call), starting another epoch counts as a load: a read in progress (from another thread) belongs to
        the epoch it replaced, and is not counted on the new one."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        with self._lock:
            if loads is not None and loads != self._loads:
                return False
            if epoch != self.epoch:
                self._position = (int(epoch), 0)
                if loads is None:
                    self._loads += 1
                    self.moved = ("set_epoch()", threading.get_ident())
            return True

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``batch_size`` ``(episode_pos, frame_in_episode)`` samples; the last batch of an epoch may
        be short, and the call after it starts the next epoch."""
        with self._lock:
            epoch, consumed = self._position
            while consumed >= self._order.num_samples(epoch):
                epoch, consumed = epoch + 1, 0
            stop = min(consumed + self._batch_size, self._order.num_samples(epoch))
            batch = self._order.samples(epoch, consumed, stop)
            self._position = (epoch, stop)
            return batch

    def advance(self, samples: int, *, loads: int | None = None) -> bool:
        """Record that the trainer took ``samples`` more samples of the current epoch, produced elsewhere
        (DALI workers call :meth:`SampleOrder.samples` themselves). ``loads``: the :attr:`loads` they were read under;
        where a load came since, they were read at the position it replaced: not counted (False)."""
        if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 0:
            raise ValueError(f"samples must be a non-negative int, got {samples!r}")
        samples = int(samples)
        with self._lock:
            if loads is not None and loads != self._loads:
                return False
            epoch, consumed = self._position
            if consumed + samples > self._order.num_samples(epoch):
                raise ValueError(
                    f"cannot advance {samples} samples: {consumed} of {self._order.num_samples(epoch)} in epoch "
                    f"{epoch} are already consumed; call set_epoch() for the next epoch"
                )
            self._position = (epoch, consumed + samples)
            return True

    def state(self) -> StreamState:
        with self._lock:  # (one order and its position: load_state_dict may replace both, from another thread)
            (epoch, consumed), order = self._position, self._order
        return StreamState(
            seed=order.options.seed,
            epoch=epoch,
            samples_consumed=consumed,
            world_size=order.world_size,
            batch_size=self._batch_size,
            prior_segments=order.consumed_segments(epoch),
            order=_order_of(order.options),
            walk=order.walk_state(epoch, consumed),
            lengths=self._fingerprint,
            rank=order.rank if order.options.rank_balance is RankBalance.NONE and order.world_size > 1 else None,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.state().to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], *, moved_by: str = "load_state_dict()") -> int:
        """Continue where ``state_dict`` left off; see the module docstring for what a world-size change keeps.
        Returns :attr:`loads` as this load left it: a read begun under that count or a later one reads the loaded
        position (or one further moved). ``moved_by``: the call a pass this load ends names (:attr:`moved`)."""
        order, position = self._loaded(state_dict)
        with self._lock:
            self._loads += 1
            self.moved = (moved_by, threading.get_ident())
            self._order, self._position = order, position
            return self._loads

    def _loaded(self, state_dict: Mapping[str, Any]) -> tuple[SampleOrder, tuple[int, int]]:
        """The order and position that ``state_dict`` puts this stream at (it is left as it is)."""
        state = StreamState.from_dict(state_dict)
        if state.lengths is not None and state.lengths != self._fingerprint:
            raise ResumeStateError(
                f"this stream state was saved over {state.lengths}, but this stream runs over {self._fingerprint}: the "
                "saved position would mean other samples; resume over the same episodes (dataset and selection)"
            )
        options = self._order.options
        _check_order(state, options, world_size=self._order.world_size)
        if state.seed != options.seed:
            # (the callers warn, naming the seeds their users pass: a mixture's datasets' are derived from its own)
            logger.debug("resuming with the saved seed %d instead of %d", state.seed, options.seed)
            options = dataclasses.replace(options, seed=state.seed)
        if state.batch_size != self._batch_size:
            say_once(logger, logging.INFO,
                "saved batch size %d differs from %d; resuming at sample %d (positions count samples)",
                state.batch_size, self._batch_size, state.samples_consumed,
            )  # fmt: skip
        segments = state.prior_segments
        epoch, consumed = state.epoch, state.samples_consumed
        world_size, rank = self._order.world_size, self._order.rank
        if options.rank_balance is RankBalance.NONE:
            _refuse_unbalanced_position(state, rank=rank, world_size=world_size)
            if state.world_size != world_size:  # (an epoch not begun starts afresh on these ranks)
                return SampleOrder(self._lengths, rank=rank, world_size=world_size, options=options), (epoch, 0)
        old = None
        if state.world_size != world_size:
            old = SampleOrder(
                self._lengths,
                rank=0,
                world_size=state.world_size,
                options=options,
                resumed_epoch=ResumedEpoch(epoch, segments) if segments else None,
            )
            _checked_samples(state, old)
            # An epoch the old ranks finished stays the current one with nothing left (its pass is empty and
            # ends it), so a loop that calls set_epoch(saved epoch + 1) next does not run that epoch twice.
            segments, consumed = (*segments, ConsumedSegment(state.world_size, consumed)), 0
        resumed = ResumedEpoch(epoch, segments) if segments else None
        order = SampleOrder(self._lengths, rank=rank, world_size=world_size, options=options, resumed_epoch=resumed)
        if old is None:
            _checked_samples(state, order)
            _start_saved_walk(state, order)
        else:
            logger.debug(
                "resuming on %s a state saved on %d: every old rank's pool is replayed to its position but "
                "ranks %s, whose walks the state carries",
                counted(world_size, "rank"), state.world_size, sorted(walk.rank for walk in state.walks) or "-",
            )  # fmt: skip
            order.resume_from(old, state.walks)
            _say_resharded(epoch, world_size, state.world_size, left=order.num_samples(epoch))
        return order, (epoch, consumed)


def _say_resharded(epoch: int, world_size: int, saved_on: int, *, left: int) -> None:
    """The warning of a resume on another world size; at an epoch's end (``left``: none of it for these ranks), that
    the next epoch is dealt to them: it said the rest of the epoch was re-sharded, of a rest that was none."""
    ranks = counted(world_size, "rank")
    if not left:
        warn_once(logger,
            "resuming on %s a state saved on %d at the end of epoch %d (nothing of it left to read): later epochs "
            "follow the new world size",
            ranks, saved_on, epoch,
        )  # fmt: skip
        return
    warn_once(logger,
        "resuming epoch %d on %s, saved on %d: the rest of the epoch is re-sharded over what the old ranks had not "
        "consumed (none of it is read twice, beyond rank_balance's padding); later epochs follow the new world size",
        epoch, ranks, saved_on,
    )  # fmt: skip


def _refuse_unbalanced_position(state: StreamState, *, rank: int, world_size: int) -> None:
    """ResumeStateError where, with ``rank_balance='none'``, ``state`` does not say where rank ``rank`` of
    ``world_size`` stands: each rank reads its own count, so only its own state does, or every rank's gathered
    (:func:`merge_rank_states`, at one position): on the same world size anywhere in an epoch, on another at one
    epoch's start."""
    epoch, consumed, segments = state.epoch, state.samples_consumed, state.prior_segments
    if state.world_size != world_size or segments:
        if consumed or segments:
            raise ResumeStateError(
                f"with rank_balance='none' each rank reads its own count, so one rank's position (saved on "
                f"{state.world_size} ranks) does not say where the others stood: resume epoch {epoch} on "
                f"{state.world_size} ranks, or start epoch {epoch + 1} here without it (set_epoch({epoch + 1}), no "
                "state loaded)"
            )
        held = _ranks_held(state)
        if state.world_size > 1 and held < state.world_size:
            # (ranks of unequal counts finish an epoch apart: one rank at the start of this epoch says nothing of
            # another still reading the epoch before, whose rest would be lost, or one further on, whose frames of
            # this epoch would come again)
            if not _names_a_rank(state):
                raise ResumeStateError(
                    f"with rank_balance='none' ranks finish epochs apart, and this state (at the start of epoch "
                    f"{epoch}, saved on {state.world_size} ranks) names no rank (saved before lerobot_dali recorded "
                    "saved_rank), so it does not say that every rank stood there: such states of every rank look "
                    "alike, as one rank's passed for each does, and merge_rank_states counts them as one. Resume on "
                    f"{state.world_size} ranks with each rank's own state, or, where every old rank stood at the start "
                    f"of epoch {epoch}, start it here without the state (seed {state.seed}, set_epoch({epoch}), no "
                    "state loaded)"
                )
            who = (
                f"a state gathered from {held} of the {state.world_size} ranks (merge_rank_states counts each rank "
                "once)"
                if held
                else "one rank's state"
            )
            raise ResumeStateError(
                f"with rank_balance='none' ranks finish epochs apart, so {who} at the start of epoch {epoch} does "
                f"not say that the other {state.world_size - max(held, 1)} rank(s) stood there too: "
                f"resume on {state.world_size} ranks with each rank's own state, or pass merge_rank_states([every "
                "old rank's state_dict()]), which refuses states that stand apart"
            )
    elif world_size > 1 and _ranks_held(state) < world_size:
        # (each rank's count is its own: another rank's position is not where this one stood. Every rank's state
        # gathered is each rank's, mid-epoch too: merge_rank_states gathers only states at one position, with their
        # walks, so this rank's stood there, and its walk is among them; so does each rank a merge names)
        named = _named_ranks(state) | {walk.rank for walk in state.walks}  # (each stood at this one position)
        if not named:
            # (saved before saved_rank, unshuffled or by version 2: rank 0's state handed to every rank, as a job
            # saving one state does, looks as each rank's own does, and put rank 1 at rank 0's count, silently)
            raise ResumeStateError(
                f"with rank_balance='none' each rank reads its own count, and this state (sample {consumed} of epoch "
                f"{epoch}, saved on {state.world_size} ranks) names no rank (saved before lerobot_dali recorded "
                f"saved_rank), so it does not say that it is rank {rank}'s: another rank's would put this one at that "
                f"rank's count. Where it is rank {rank}'s own state_dict() (each rank loading its own), load "
                f"{{**state, 'saved_rank': {rank}}}; another rank's does not resume this one"
            )
        if rank not in named:
            saved = state.rank if state.rank is not None else min(named)
            raise ResumeStateError(
                f"with rank_balance='none' each rank reads its own count, so rank {saved}'s state (sample "
                f"{consumed} of epoch {epoch}) does not say where rank {rank} stood: load each rank's own "
                "state_dict() on it, or merge_rank_states([every rank's state_dict()]) on every rank"
            )


def _lengths_fingerprint(lengths: np.ndarray) -> str:
    """Episode ``lengths`` named in a few words: their count, their frames and a digest of them in order."""
    digest = hashlib.sha256(np.asarray(lengths, dtype="<i8").tobytes()).hexdigest()[:16]
    return f"{len(lengths)} episodes of {int(np.sum(lengths))} frames (sha256 {digest})"


def _check_order(state: StreamState, options: OrderOptions, *, world_size: int) -> None:
    """Refuse a resume whose saved position means other samples under ``options`` (or this version's deal)."""
    several_ranks = max(state.world_size, world_size) > 1 or bool(state.prior_segments)
    if state.version == 1 and several_ranks and (state.samples_consumed or state.prior_segments):
        raise ResumeStateError(
            f"this stream state was saved by an earlier lerobot_dali, whose split of episodes across ranks "
            f"differed: resuming epoch {state.epoch} part-way would repeat some samples and skip others. Resume "
            f"at the next epoch instead: load {{**state, 'epoch': {state.epoch + 1}, 'samples_consumed': 0, "
            "'prior_segments': []}"
        )
    if state.order is None:
        return
    now = _order_of(options)
    # An unshuffled pool emits its episodes in order whatever its size; one rank needs no balance.
    relevant = [
        name
        for name in _ORDER_FIELDS
        if (name != "episode_pool_size" or now["shuffle"]) and (name != "rank_balance" or several_ranks)
    ]
    saved_order = {**_LATER_ORDER_FIELDS, **state.order}  # (a state saved before a later field ran as its default)
    differ = [name for name in relevant if saved_order.get(name) != now[name]]
    if differ:
        saved = ", ".join(f"{_ARGUMENT_NAMES.get(name, name)}={saved_order.get(name)!r}" for name in differ)
        ours = ", ".join(f"{_ARGUMENT_NAMES.get(name, name)}={now[name]!r}" for name in differ)
        raise ResumeStateError(
            f"this stream state was saved with {saved}, but this stream runs with {ours}: the saved position "
            f"would mean other samples, repeating some and skipping others; resume with {saved}"
        )


def _start_saved_walk(state: StreamState, order: SampleOrder) -> None:
    """Start ``order``'s pool where ``state``'s walk stands, if that walk is this rank's at this position; else the
    pool is replayed from the epoch's start (on the first batch), as for a state saved without a walk."""
    walks = [walk for walk in state.walks if walk.rank == order.rank]
    walk = walks[0] if walks else state.walk
    if walk is None:
        return
    if (walk.epoch, walk.samples_consumed, walk.rank) != (state.epoch, state.samples_consumed, order.rank):
        # (another rank's state, as a job that saves rank 0's alone hands every rank, or one moved to another position)
        logger.debug(
            "the stream state's pool walk is rank %d's at sample %d of epoch %d, not rank %d's at sample %d of epoch "
            "%d: the pool is replayed to the position instead",
            walk.rank, walk.samples_consumed, walk.epoch, order.rank, state.samples_consumed, state.epoch,
        )  # fmt: skip
        return
    order.start_walk(state.epoch, state.samples_consumed, walk)


def _checked_samples(state: StreamState, order: SampleOrder) -> int:
    """Samples per rank in the saved epoch under ``order``, which must cover what the state says was consumed."""
    num_samples = order.num_samples(state.epoch)
    if state.samples_consumed > num_samples:
        raise ResumeStateError(
            f"stream state says {state.samples_consumed} samples of epoch {state.epoch} were consumed, but that "
            f"epoch has {num_samples} per rank; the state belongs to another dataset or other order options"
        )
    return num_samples
