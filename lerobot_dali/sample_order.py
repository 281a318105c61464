"""Sample order: which (episode, frame) a rank emits at each position of an epoch.

The order is a pure function of ``(seed, epoch, rank, world_size, position)`` and the episode lengths: no
hidden RNG state, so every DALI worker process computes its own batches, ranks agree without talking, and
resume is a replay. Every random stream is a Philox generator keyed by those integers (plus a purpose tag),
never global state.

Per epoch:

1. **Sharding.** Episodes (never frames or files; or, with ``piece_frames``, pieces of consecutive frames of
   them, :mod:`.episode_pieces`, each then standing for an episode below) are split disjointly across ranks by
   :func:`shard_episodes`, balancing frame counts: longest first (shuffled: within 10% bands at random), each
   episode goes to the least-loaded rank, so two ranks differ by at most about the fullest rank's shortest
   episode (at most the longest).
   Every rank computes every rank's count, so :class:`RankBalance` targets are agreed without communication.
   An episode's frames here are those sampled: ``drop_n_first_frames`` and ``drop_n_last_frames`` leave its
   first and last ones out (an episode no longer than both, whole).
2. **Stream.** A rank's episodes are shuffled into its episode stream (``shuffle=False``: dataset order).
3. **Pool.** The rank keeps ``episode_pool_size`` whole episodes admitted from its stream and emits a frame
   uniformly at random among the pool's remaining frames; an episode leaves when all its frames were
   emitted and the next one is admitted. Which frame of an episode comes out is a per-episode permutation
   keyed by ``(seed, epoch, episode)`` alone, so "the first ``k`` draws of an episode" name the same frames
   whatever the world size: that is what lets a resume on another world size skip exactly what was consumed.

Memory is O(episodes + pool): checkpoints of the pool state (a few integers per pooled episode) every few
thousand samples make increasing access cheap and random access a bounded replay. A pickled order carries its
checkpoints: walked to a resumed position first (:meth:`SampleOrder.prepare`), it spares each DALI worker that
replay. A saved stream state carries the walk at its position (:meth:`SampleOrder.walk_state`, :mod:`.saved_walk`),
so a resume starts there (:meth:`SampleOrder.start_walk`) instead of replaying the epoch's pool. Determinism holds
for a fixed numpy version (the Philox stream and ``Generator.choice`` are numpy's).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import heapq
import itertools
import logging
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import fork_locks
from .episode_pieces import EpisodePieces
from .errors import ShardingError
from .pickled_columns import narrowed, widened
from .said_once import warn_once
from .saved_walk import SavedWalk, WalkMismatchError, checked_pool
from .value_checks import check_choice, check_int

__all__ = [
    "DEFAULT_EPISODE_POOL_SIZE",
    "ConsumedSegment",
    "OrderOptions",
    "RankBalance",
    "RankBalanceName",
    "RankPool",
    "ResumedEpoch",
    "SampleOrder",
    "shard_episodes",
]

logger = logging.getLogger(__name__)

# Purpose tags: the random streams for different jobs never share a key.
_SHARD_STREAM = 0
_RANK_STREAM = 1
_POOL_STREAM = 2
_FRAME_STREAM = 3

#: Smallest pool chunk; below this the per-chunk numpy overhead dominates.
_MIN_CHUNK = 64
#: Per-episode frame permutations kept (LRU); pooled episodes recur batch after batch.
_PERMUTATION_CACHE = 4096
#: Epoch plans kept (the DALI prefetch can straddle an epoch boundary).
_PLAN_CACHE = 2
#: Samples a followed walk (:meth:`SampleOrder.follow`) may lag before it walks on: ~25 chunks, ~0.5 ms a step.
_FOLLOW_SAMPLES = 2048


def _generator(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


class RankBalance(enum.Enum):
    """How ranks with fewer frames this epoch reach the common per-rank sample count.

    Unequal batch counts hang collective training, so every rank emits exactly
    :meth:`SampleOrder.num_samples` samples per epoch (but with ``NONE``, for evaluation).
    """

    PAD = "pad"
    """Every rank emits as many samples as the fullest rank; a shorter rank then repeats its own first
    samples of the epoch (cyclically). Nothing is dropped; at most about one episode's worth repeats."""

    DROP = "drop"
    """Every rank emits as many samples as the emptiest rank; the end of each longer rank's epoch is
    skipped (different frames each epoch when shuffled). Nothing repeats; at most about one episode's
    worth per rank is left out."""

    NONE = "none"
    """Every rank emits exactly its own frames, so ranks' counts differ (by up to about an episode): for
    evaluation, where every frame must count once and no collective runs per batch (one would hang), as
    accelerate's ``even_batches=False``. A resume must keep the world size, each rank loading its own state (another
    rank's count is not its own), but at an epoch's start from every rank's state gathered by
    :func:`~.stream_state.merge_rank_states` (ranks finish epochs apart: one rank's state there says nothing of where
    the others stood)."""


#: :class:`RankBalance`'s values, as a type checker checks a string given for one (``rank_balance="none"``).
RankBalanceName = Literal["pad", "drop", "none"]

#: Episodes a rank samples from at once, by default: wide enough to mix a batch across episodes, small enough
#: that a remote pool's prefetch (its episodes' bytes) fits the cache.
DEFAULT_EPISODE_POOL_SIZE = 64


@dataclass(frozen=True, kw_only=True)
class OrderOptions:
    """What defines the order (with the episode lengths, rank and world size). A saved state records them,
    and a resume under others that would change the order is refused (:mod:`.stream_state`)."""

    seed: int = 0
    shuffle: bool = True
    episode_pool_size: int = DEFAULT_EPISODE_POOL_SIZE
    rank_balance: RankBalance = RankBalance.PAD
    #: Deal episodes to ranks in pieces of at most this many frames (None: whole episodes).
    piece_frames: int | None = None
    #: Frames at the start and the end of every episode never sampled (LeRobot's ``EpisodeAwareSampler``).
    drop_n_first_frames: int = 0
    drop_n_last_frames: int = 0
    #: Samples between pool-state checkpoints (a lower bound; raised to respect ``max_checkpoints``).
    checkpoint_interval: int = 8192
    max_checkpoints: int = 1024

    def __post_init__(self) -> None:
        check_int("seed", self.seed, minimum=0)
        if not isinstance(self.shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {self.shuffle!r}")
        check_int("episode_pool_size", self.episode_pool_size, minimum=1)
        if self.piece_frames is not None:
            check_int("episode_piece_frames", self.piece_frames, minimum=1)  # (the argument's name, as users give it)
        check_int("drop_n_first_frames", self.drop_n_first_frames, minimum=0)
        check_int("drop_n_last_frames", self.drop_n_last_frames, minimum=0)
        check_int("checkpoint_interval", self.checkpoint_interval, minimum=1)
        check_int("max_checkpoints", self.max_checkpoints, minimum=1)
        object.__setattr__(self, "rank_balance", check_choice(RankBalance, "rank_balance", self.rank_balance))


RankPool = tuple[int, tuple[int, ...], tuple[int, ...]]
"""A rank's pool at a position: ``(next_admit, slots, drawn)``, as :class:`~.saved_walk.SavedWalk` names them."""


@dataclass(frozen=True)
class ConsumedSegment:
    """``samples_consumed`` samples taken by each of ``world_size`` ranks from one plan of an epoch.

    ``pools``, where known, is each rank's pool there (shuffled): what it consumed follows from it, where it takes
    replaying that rank's pool up to there (0.2 us a sample) to know. Not compared: a segment is its counts."""

    world_size: int
    samples_consumed: int
    pools: tuple[RankPool, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, minimum=1)
        check_int("samples_consumed", self.samples_consumed, minimum=0)
        if self.pools is not None and len(self.pools) != self.world_size:
            raise ValueError(f"pools must hold one pool per rank ({self.world_size}), got {len(self.pools)}")


@dataclass(frozen=True)
class ResumedEpoch:
    """An epoch interrupted under other world sizes: its plan is rebuilt over what those segments (in
    order, each over the residual of the previous ones) left unconsumed."""

    epoch: int
    segments: tuple[ConsumedSegment, ...]

    def __post_init__(self) -> None:
        check_int("epoch", self.epoch, minimum=0)
        object.__setattr__(self, "segments", tuple(self.segments))
        if not all(isinstance(s, ConsumedSegment) for s in self.segments):
            raise TypeError("segments must be ConsumedSegment objects")


#: Relative width of the length bands a shuffled deal takes in random order (:func:`shard_episodes`).
_SHUFFLE_BAND = 0.10


def shard_episodes(frame_counts: np.ndarray, *, world_size: int, rng: np.random.Generator | None) -> np.ndarray:
    """Rank of every episode (``-1`` where ``frame_counts`` is 0), balancing frames per rank.

    A greedy longest-first deal: episodes in descending frame count each go to the rank holding the fewest
    frames so far, equally loaded ranks taken in a random priority order drawn once per call (``rng=None``:
    lowest rank first). With ``rng``, counts within a 10% band (:data:`_SHUFFLE_BAND`) come in random order:
    exact order would put the same episodes together every epoch where all counts differ (96-100% of pairs
    kept together across epochs, 50 episodes of 100-1000 frames on 8 ranks; 11-17% with the band, 12.5% at
    random), and the balance is the
    same (PAD repeats 2.0-2.1% of an epoch either way; the former round-robin deal: 5.7%). ``rng=None``: exact
    order, ties by episode. The first ``world_size`` episodes reach distinct ranks, and the fullest rank was
    the emptiest when it took its last episode, so two ranks' totals differ by at most that episode (within
    10% of the fullest rank's shortest), never more than the longest. A pure function of the counts and
    ``rng``'s state. O(E log W) on a heap of Python ints: 0.2-0.3 s for 1M episodes on 8 ranks.
    """
    world_size = check_int("world_size", world_size, minimum=1)
    counts = np.asarray(frame_counts)
    selected = np.flatnonzero(counts > 0)
    n = selected.size
    if n < world_size:
        fix = _fewer_units_fix(counts, world_size)
        raise ShardingError(f"{n} episode(s) with frames cannot give each of {world_size} ranks at least one; {fix}")
    if world_size == 1:  # (one rank takes every episode: nothing to balance; the deal took 0.5 s at 1M episodes)
        return np.where(counts > 0, 0, -1).astype(np.int64)
    if rng is None:
        by_length = selected[np.argsort(-counts[selected], kind="stable")]
    else:  # lengths within a 10% band in random order, so the groups change from epoch to epoch
        selected = selected[rng.permutation(n)]
        band = np.floor(np.log(counts[selected]) / np.log1p(_SHUFFLE_BAND))
        by_length = selected[np.argsort(-band, kind="stable")]
    lengths = counts[by_length].astype(np.int64, copy=False)
    priority = np.arange(world_size) if rng is None else rng.permutation(world_size)
    rank_of = np.full(counts.shape[0], -1, dtype=np.int64)
    rank_of[by_length] = _greedy_deal(lengths, priority)
    return rank_of


_DEAL_CHUNK = 65536


def _fewer_units_fix(counts: np.ndarray, world_size: int) -> str:
    """What to do when the units to deal (episodes, or pieces of them) are fewer than the ranks."""
    frames = int(counts.sum())
    if frames < world_size:
        return f"they hold {frames} frame(s) in all, fewer than the ranks: use fewer ranks or more episodes"
    pieces = max(1, frames // (4 * world_size))
    return (
        f"use fewer ranks or more episodes, or deal episodes in pieces: episode_piece_frames={pieces} gives the "
        f"ranks 4 pieces or more each on average (pipelines/train.py: --episode-piece-frames {pieces})"
    )


def _greedy_deal(lengths: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Rank of each of ``lengths`` (in dealing order), dealt in turn to the least-loaded rank, ties to the lowest
    ``priority`` (a permutation of the ranks): a heap of ``load * world_size + priority``."""
    world_size = priority.size
    heap = list(range(world_size))  # every rank at load 0
    taken = np.empty(lengths.size, np.int64)
    for start in range(0, lengths.size, _DEAL_CHUNK):  # chunks: 1M lengths as Python ints would take ~80 MB
        keys = []
        for step in (lengths[start : start + _DEAL_CHUNK] * world_size).tolist():
            keys.append(heap[0])
            heapq.heapreplace(heap, heap[0] + step)
        taken[start : start + len(keys)] = keys
    return np.argsort(priority)[taken % world_size]


@dataclass(frozen=True)
class _RankStream:
    """One rank's episodes in stream order, with draws already consumed before this plan."""

    episodes: np.ndarray
    lengths: np.ndarray
    first_draw: np.ndarray

    @fork_locks.cached_property
    def natural(self) -> int:
        """Draws of the rank's own frames (asked per batch: a sum over its episodes, 0.2 ms at 92,000)."""
        return int((self.lengths - self.first_draw).sum())


class _PoolWalk:
    """The pool state at a chunk boundary. Chunks are a pure function of this state, so replaying from
    any checkpoint reproduces the same chunks, whatever the access pattern that led here."""

    __slots__ = ("drawn", "emitted", "next_admit", "rng_state", "slots")

    def __init__(
        self, emitted: int, next_admit: int, slots: np.ndarray, drawn: np.ndarray, rng_state: Mapping[str, Any]
    ) -> None:
        self.emitted = emitted
        self.next_admit = next_admit
        self.slots = slots  # indices into the rank stream, admission order
        self.drawn = drawn  # draws already made from each pooled episode
        self.rng_state = rng_state


class _Cursor:
    """A walk advanced in place, chunk after chunk. A replay makes no :class:`_PoolWalk`, generator state or
    output per chunk it only passes: 17 us a chunk (10 of them numpy's ``choice``) against 38 when it did, so a
    resume 13.7M samples into an epoch (165k chunks) replays in 2.8 s of CPU, not 6.3."""

    __slots__ = ("emitted", "next_admit", "remaining", "rng", "slots", "total")

    def __init__(self, walk: _PoolWalk, lengths: np.ndarray, rng: np.random.Generator) -> None:
        self.rng = rng  # (set to the walk's state: the generator its chunks draw from, its own while it walks)
        rng.bit_generator.state = walk.rng_state
        self.emitted = walk.emitted
        self.next_admit = walk.next_admit
        self.slots: list[int] = walk.slots.tolist()
        self.remaining = lengths[walk.slots] - walk.drawn  # frames left in each pooled episode
        self.total = int(self.remaining.sum())

    def chunk_size(self) -> int:
        """Draws of the next chunk, unless an episode runs out first."""
        if not self.slots:
            raise RuntimeError(f"pool simulation ran past the rank's {self.emitted} samples (its pool is empty)")
        return min(self.total, max(_MIN_CHUNK, 2 * self.total // len(self.slots)))


class _PoolSimulator:
    """Emits ``(episode, draw_index)`` for positions of one rank's natural (unpadded) stream."""

    def __init__(self, stream: _RankStream, *, pool_size: int, rng_key: tuple[int, ...], interval: int):
        self._stream = stream
        self._interval = interval
        self._pool_size = pool_size
        first = np.arange(min(pool_size, stream.episodes.size), dtype=np.int64)
        rng_state = _generator(*rng_key).bit_generator.state
        start = _PoolWalk(0, first.size, first, stream.first_draw[first].copy(), rng_state)
        self._checkpoints: list[_PoolWalk] = [start]
        self._checkpoint_positions: list[int] = [0]
        #: Generators for walks, each taken by one walk while it runs: a walk re-entered on its own thread (a
        #: signal handler's ``state_dict()`` within a batch's draw: the order's lock is an RLock) set a shared one
        #: to another chunk's state, and the walk it interrupted drew on from there. Kept: making one takes 10 us.
        self._idle_rngs: list[np.random.Generator] = []
        # Live walk plus the outputs of its last chunk, so the next request usually continues in place.
        self._live = start
        self._tail = (0, np.empty(0, np.int64), np.empty(0, np.int64))
        # Where the last state_at calls stopped: the prefetcher asks for a window's two ends, each a batch past
        # the last, which a walk from the checkpoint before each took milliseconds to reach at millions of
        # samples per rank.
        self._state_cursors: list[_PoolWalk] = [start]
        #: The chunk the last lookup stopped in: ``(walk at its start, its end)``. A stream state taken before every
        #: batch asks for the walk a batch further each time, mostly in the same chunk, which it drew again.
        self._last_chunk = (start, 0)

    def draws(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        out_ep = np.empty(stop - start, np.int64)
        out_draw = np.empty(stop - start, np.int64)
        if stop <= start:
            return out_ep, out_draw
        tail_start, tail_ep, tail_draw = self._tail
        if tail_start <= start < self._live.emitted:
            n = min(stop, self._live.emitted) - start
            out_ep[:n] = tail_ep[start - tail_start : start - tail_start + n]
            out_draw[:n] = tail_draw[start - tail_start : start - tail_start + n]
            walk = self._live
        else:  # the live walk or the checkpoint before ``start`` (one adopted from another copy may be nearer)
            walk = self._checkpoint_before(start)
            if walk.emitted < self._live.emitted <= start:
                walk = self._live
        if walk.emitted < stop:
            self._run(walk, start, stop, out_ep, out_draw)
        return out_ep, out_draw

    def state_at(self, position: int) -> tuple[int, np.ndarray, np.ndarray]:
        """``(next_admit, slots, drawn)`` after exactly ``position`` samples (for resume on a new world size)."""
        walk, extra = self._walk_to(position)
        return walk.next_admit, walk.slots, walk.drawn if extra is None else walk.drawn + extra

    def walk_before(self, position: int) -> _PoolWalk:
        """The walk at the chunk boundary at or before ``position``: where a walk that serves ``position`` starts."""
        walk, end = self._last_chunk
        return walk if walk.emitted <= position < end else self._walk_to(position)[0]

    def follow(self, position: int) -> None:
        """Walk on to ``position`` if the last lookup stands :data:`_FOLLOW_SAMPLES` or more before it (or after it)."""
        behind = position - self._state_cursors[-1].emitted
        if behind >= _FOLLOW_SAMPLES or behind < 0:
            self._walk_to(position)

    def _walk_to(self, position: int) -> tuple[_PoolWalk, np.ndarray | None]:
        """The walk at the chunk boundary at or before ``position``, and the draws per pooled episode from there
        to ``position`` (None where that boundary is ``position``)."""
        walk = self._checkpoint_before(position)
        for kept in self._state_cursors:
            if walk.emitted < kept.emitted <= position:
                walk = kept
        extra: np.ndarray | None = None
        if walk.emitted < position:
            cursor = self._cursor(walk)
            while True:
                # (the generator's state before a chunk that may pass ``position``: where this lookup stops)
                before = cursor.rng.bit_generator.state if cursor.emitted + cursor.chunk_size() > position else None
                label, n, left = self._chunk(cursor)
                if before is not None and cursor.emitted + n > position:
                    walk = self._snapshot(cursor, before)
                    extra = np.bincount(label[: position - cursor.emitted], minlength=len(cursor.slots))
                    self._last_chunk = (walk, cursor.emitted + n)
                    break
                self._advance(cursor, label, n, left)
                self._keep_checkpoint(cursor)
                if cursor.emitted == position:
                    walk = self._snapshot(cursor)
                    break
            self._idle_rngs.append(cursor.rng)
        self._state_cursors = [*self._state_cursors[-1:], walk]
        return walk, extra

    def walks(self) -> list[_PoolWalk]:
        """The walk states kept (checkpoints, and where the last lookups stopped), by position: what a copy of
        this order needs to start where this one stands instead of at the epoch's start."""
        kept = {walk.emitted: walk for walk in (*self._checkpoints, *self._state_cursors, self._live)}
        return [kept[position] for position in sorted(kept)]

    def adopt(self, walks: list[_PoolWalk]) -> None:
        """Keep ``walks`` (another copy's :meth:`walks` of this same plan) as checkpoints."""
        kept = {walk.emitted: walk for walk in (*self._checkpoints, *walks)}
        self._checkpoint_positions = sorted(kept)
        self._checkpoints = [kept[position] for position in self._checkpoint_positions]

    def adopt_saved(self, saved: SavedWalk, position: int) -> None:
        """Start from ``saved`` (a :class:`SavedWalk` of this plan serving unpadded ``position``), checked first."""
        slots, drawn, rng_state = saved.pool_state(
            lengths=self._stream.lengths,
            first_draw=self._stream.first_draw,
            pool_size=self._pool_size,
            start_rng=self._checkpoints[0].rng_state,
            natural_position=position,
        )
        self.adopt([_PoolWalk(saved.emitted, saved.next_admit, slots, drawn, rng_state)])

    def _checkpoint_before(self, position: int) -> _PoolWalk:
        return self._checkpoints[bisect.bisect_right(self._checkpoint_positions, position) - 1]

    def _run(self, walk: _PoolWalk, start: int, stop: int, out_ep: np.ndarray, out_draw: np.ndarray) -> None:
        cursor = self._cursor(walk)
        while cursor.emitted < stop:  # (at least once: the caller starts before ``stop``)
            label, n, left = self._chunk(cursor)
            before, after = cursor.emitted, cursor.emitted + n
            if after > start:  # (chunks wholly before ``start`` only move the walk on)
                chunk_ep, chunk_draw = self._outputs(cursor, label[:n])
                lo, hi = max(start, before), min(stop, after)
                out_ep[lo - start : hi - start] = chunk_ep[lo - before : hi - before]
                out_draw[lo - start : hi - start] = chunk_draw[lo - before : hi - before]
            self._advance(cursor, label, n, left)
            self._keep_checkpoint(cursor)
        self._tail = (before, chunk_ep, chunk_draw)
        self._live = self._snapshot(cursor)
        self._idle_rngs.append(cursor.rng)

    def _keep_checkpoint(self, cursor: _Cursor) -> None:
        """Keep the walk as a checkpoint if it is the first past an interval beyond the last checkpoint."""
        if cursor.emitted // self._interval > self._checkpoints[-1].emitted // self._interval:
            self._checkpoints.append(self._snapshot(cursor))
            self._checkpoint_positions.append(cursor.emitted)

    def _cursor(self, walk: _PoolWalk) -> _Cursor:
        """A cursor at ``walk``, with a generator no other walk draws from until it is given back."""
        try:
            rng = self._idle_rngs.pop()
        except IndexError:  # (none idle: the first walk, or one re-entered, or one that raised)
            rng = np.random.Generator(np.random.Philox(0))
        return _Cursor(walk, self._stream.lengths, rng)

    def _snapshot(self, cursor: _Cursor, rng_state: Mapping[str, Any] | None = None) -> _PoolWalk:
        slots = np.array(cursor.slots, dtype=np.int64)
        drawn = self._stream.lengths[slots] - cursor.remaining
        state = cursor.rng.bit_generator.state if rng_state is None else rng_state
        return _PoolWalk(cursor.emitted, cursor.next_admit, slots, drawn, state)

    def _chunk(self, cursor: _Cursor) -> tuple[np.ndarray, int, np.ndarray | None]:
        """One canonical chunk from ``cursor`` (not yet advanced): ``(label, n, left)``, the pooled episode of
        each draw, the draws taken (until the first pooled episode runs out, or ``chunk_size`` draws), and the
        frames left per episode after them when none ran out (else None)."""
        chunk = cursor.chunk_size()
        remaining = cursor.remaining
        # An ordered sample without replacement of the pool's remaining frames is a prefix of a uniform
        # permutation of them: each draw is uniform over what is left.
        picks = cursor.rng.choice(cursor.total, size=chunk, replace=False)
        label = remaining.cumsum().searchsorted(picks, side="right")
        left = remaining - np.bincount(label, minlength=remaining.size)
        emptied = (left <= 0).nonzero()[0]
        if not emptied.size:
            return label, chunk, left
        # The chunk ends at the first draw that empties an episode: some emptied episode's last frame.
        last = min(int((label == slot).nonzero()[0][remaining[slot] - 1]) for slot in emptied.tolist())
        return label, last + 1, None

    def _advance(self, cursor: _Cursor, label: np.ndarray, n: int, left: np.ndarray | None) -> None:
        """Move ``cursor`` past the chunk that :meth:`_chunk` drew; an episode it emptied makes way for the next
        of the stream."""
        cursor.emitted += n
        cursor.total -= n
        if left is not None:
            cursor.remaining = left
            return
        remaining = cursor.remaining - np.bincount(label[:n], minlength=cursor.remaining.size)
        out = int(label[n - 1])  # (the only one emptied: the chunk ended at its last frame)
        del cursor.slots[out]
        admit = cursor.next_admit
        if admit < self._stream.episodes.size:
            frames = int(self._stream.lengths[admit] - self._stream.first_draw[admit])
            remaining[out:-1] = remaining[out + 1 :]  # (in place: the pool keeps admission order)
            remaining[-1] = frames
            cursor.slots.append(admit)
            cursor.next_admit += 1
            cursor.total += frames
        else:
            remaining = np.delete(remaining, out)
        cursor.remaining = remaining

    def _outputs(self, cursor: _Cursor, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(episode, draw_index)`` of a chunk's draws, from ``cursor`` before it advances past them."""
        slots = np.array(cursor.slots, dtype=np.int64)
        drawn = self._stream.lengths[slots] - cursor.remaining
        return self._stream.episodes[slots[label]], drawn[label] + _occurrence_rank(label, slots.size)


def _unpadded(position: int, natural: int) -> int:
    """The position of the rank's own (unpadded) stream that ``position`` draws: past its ``natural`` samples
    (:attr:`RankBalance.PAD`), the epoch's first ones again, cyclically."""
    return position if position < natural else (position - natural) % natural


def _occurrence_rank(label: np.ndarray, n_labels: int) -> np.ndarray:
    """For each entry, how many earlier entries share its label."""
    order = np.argsort(label, kind="stable")
    counts = np.bincount(label, minlength=n_labels)
    starts = np.cumsum(counts) - counts
    ranked = np.empty_like(label)
    ranked[order] = np.arange(label.size) - starts[label[order]]
    return ranked


@dataclass
class _EpochPlan:
    rank_counts: np.ndarray  # natural samples of every rank
    target: int  # samples every rank emits
    stream: _RankStream
    simulator: _PoolSimulator | None  # None when not shuffling
    stream_ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


class SampleOrder:
    """The order of one rank: ``samples(epoch, start, stop)`` for positions ``[start, stop)`` of its epoch.

    Fast for increasing access (what a DALI worker does, batch after batch with a stride); any other
    access is correct and costs a replay from the nearest checkpoint. Pickles without its caches.
    """

    def __init__(
        self,
        episode_lengths: np.ndarray,
        *,
        rank: int,
        world_size: int,
        options: OrderOptions | None = None,
        resumed_epoch: ResumedEpoch | None = None,
    ) -> None:
        lengths = np.asarray(episode_lengths)
        if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
            raise TypeError(f"episode_lengths must be a 1-D integer array, got {lengths.dtype} {lengths.shape}")
        if lengths.size and lengths.min() < 0:
            raise ValueError(f"episode_lengths has a negative length at position {int(np.argmin(lengths))}")
        self._world_size = check_int("world_size", world_size, minimum=1)
        self._rank = check_int("rank", rank, minimum=0)
        if self._rank >= self._world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self._options = options if options is not None else OrderOptions()
        # Everything below deals, pools and draws pieces; only what leaves this class names episodes.
        opts = self._options
        self._pieces = EpisodePieces.cut(
            lengths, opts.piece_frames, drop_first=opts.drop_n_first_frames, drop_last=opts.drop_n_last_frames
        )
        self._lengths = self._pieces.length
        self._resumed = resumed_epoch
        #: Draws per unit the resumed epoch's segments took (each old rank's prefix replayed): computed once, and
        #: pickled, so a copy (each DALI worker's, the prefetcher's) does not replay them all again.
        self._residual: np.ndarray | None = None
        #: The resumed epoch's segments, each with its ranks' pools (those replayed or given): what a state saves.
        self._replayed: tuple[ConsumedSegment, ...] = ()
        self._plans: OrderedDict[int, _EpochPlan] = OrderedDict()
        self._permutations: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        #: Walk states of epochs' pools from the copy this one was unpickled from, adopted when a plan is built.
        self._walks: dict[int, list[_PoolWalk]] = {}
        #: The plans and walks change on every call: a stream state taken from another thread (an asynchronous
        #: checkpoint's :meth:`walk_state`) must not walk a pool while a batch is drawn from it.
        self._lock = fork_locks.lock()
        #: The last :meth:`walk_state`, ``(epoch, pool walk, its saved form)``: a stream state is taken before every
        #: batch (a mixture's several times), mostly at the same chunk boundary as the last.
        self._saved_walk: tuple[int, _PoolWalk, SavedWalk] | None = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def options(self) -> OrderOptions:
        return self._options

    @property
    def resumed_epoch(self) -> ResumedEpoch | None:
        return self._resumed

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # The plans are rebuilt (their streams are O(episodes)), but their pools' walk states travel (at most
        # max_checkpoints a plan, ~1.5 kB each): a copy (a DALI worker's) then starts where this one walked to,
        # not at the epoch's start.
        walks = dict(self._walks)
        walks.update({epoch: plan.simulator.walks() for epoch, plan in self._plans.items() if plan.simulator})
        state["_walks"] = walks
        state["_plans"] = OrderedDict()
        state["_permutations"] = OrderedDict()
        del state["_lengths"]  # (its pieces' lengths: pickled with them, narrowed)
        del state["_lock"]
        if self._residual is not None:
            state["_residual"] = narrowed(self._residual)
        state["_saved_walk"] = None  # (its pool walk is the plan's, which the copy builds again)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_walks", {})
        residual = state.get("_residual")
        state["_residual"] = widened(residual, {}) if residual is not None else None
        self.__dict__.update(state)
        self._lengths = self._pieces.length
        self._lock = fork_locks.lock()

    def num_samples(self, epoch: int) -> int:
        """Samples this rank emits in ``epoch`` (the same on all ranks but with ``RankBalance.NONE``)."""
        with self._lock:
            return self._plan(epoch).target

    def repeated_samples(self, epoch: int) -> int:
        """Of :meth:`num_samples`, those that repeat this rank's first ones (:attr:`RankBalance.PAD`: as many as the
        fullest rank reads)."""
        with self._lock:
            plan = self._plan(epoch)
            return max(plan.target - plan.stream.natural, 0)

    def rank_frame_counts(self, epoch: int) -> np.ndarray:
        """Frames (before balancing) each rank owns in ``epoch``; identical on every rank."""
        with self._lock:
            return self._plan(epoch).rank_counts.copy()

    def rank_episodes(self, epoch: int) -> np.ndarray:
        """Episode positions of this rank in stream (admission) order."""
        with self._lock:
            return self._pieces.episodes(self._plan(epoch).stream.episodes)  # (a new array)

    def samples(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(episode_pos, frame_in_episode)``, int64 arrays for positions ``[start, stop)`` of ``epoch``."""
        with self._lock:
            return self._samples(epoch, start, stop)

    def _samples(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        plan = self._plan(epoch)
        if isinstance(start, bool) or isinstance(stop, bool) or not 0 <= start <= stop <= plan.target:
            raise IndexError(
                f"positions [{start}, {stop}) are outside epoch {epoch} of rank {self._rank}, "
                f"which has {plan.target} samples (0 <= start <= stop <= {plan.target})"
            )
        natural = plan.stream.natural
        runs: list[tuple[np.ndarray, np.ndarray]] = []
        position = start
        while position < stop:
            # Positions past the rank's own frames (RankBalance.PAD) repeat its first samples, cyclically.
            q = _unpadded(position, natural)
            run = min(stop, natural) - position if position < natural else min(stop - position, natural - q)
            runs.append(self._natural_draws(plan, q, q + run))
            position += run
        if not runs:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        units = np.concatenate([r[0] for r in runs])
        draws = np.concatenate([r[1] for r in runs])
        return self._pieces.frames(units, self._frames(epoch, units, draws))

    def pool_window(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Episode positions that serve positions ``[start, stop)`` of ``epoch``, in admission order.

        That is the pool at ``start`` plus every episode admitted before ``stop``: what a prefetcher must
        have local for a consumer between those positions (without shuffling, the episodes those positions
        fall in). Positions past the rank's own frames (:attr:`RankBalance.PAD`) add the episodes they repeat.
        """
        with self._lock:
            return self._pool_window(epoch, start, stop)

    def _pool_window(self, epoch: int, start: int, stop: int) -> np.ndarray:
        plan = self._plan(epoch)
        natural = plan.stream.natural
        start, stop = max(0, start), min(stop, plan.target)
        if natural == 0 or start >= stop:
            return np.empty(0, np.int64)
        parts = []
        if start < natural:
            parts.append(self._natural_window(plan, start, min(stop, natural)))
        if stop > natural:  # PAD: positions from ``natural`` on repeat the epoch's first ones
            parts.append(self._natural_window(plan, 0, min(natural, stop - natural)))
        return self._pieces.episodes(np.concatenate(parts))

    def prepare(self, epoch: int, position: int) -> None:
        """Walk the pool to ``position`` of ``epoch`` now, so that copies of this order pickled after (DALI's
        workers, a prefetcher) start there instead of each replaying the epoch from its start."""
        with self._lock:
            plan = self._plan(epoch)
            natural = plan.stream.natural
            if plan.simulator is not None and natural and position > 0:
                plan.simulator.state_at(_unpadded(position, natural))

    def follow(self, epoch: int, position: int) -> None:
        """Walk the pool along with a consumer at ``position`` of ``epoch`` whose samples other copies of this order
        draw (DALI's workers'), a few thousand samples a step (0.2 us of CPU a sample, as they walk): a
        :meth:`walk_state` there then walks that at most, where one taken first late in an epoch walked its pool up to
        there (5 s of CPU at 95% of an epoch of 92,000 episodes)."""
        with self._lock:
            plan = self._plan(epoch)
            natural = plan.stream.natural
            if plan.simulator is not None and natural:
                plan.simulator.follow(_unpadded(position, natural))

    def walk_state(self, epoch: int, position: int) -> SavedWalk | None:
        """The pool walk that serves ``position`` of ``epoch``, for a saved stream state: a resume that starts it
        there (:meth:`start_walk`) walks one chunk at most instead of the epoch's pool up to ``position``. None
        unshuffled (a position is then found by a search, with no walk) or where this rank has no frames.

        This order walks there from where it last stood: asked every step (``pipelines/train.py``), a chunk now and
        then (~30 us a call at 92,000 episodes); where DALI's workers drew the batches, from where :meth:`follow` left
        it (without, the epoch's pool up to there, once)."""
        with self._lock:
            plan = self._plan(epoch)
            natural = plan.stream.natural
            if plan.simulator is None or not natural:
                return None
            walk = plan.simulator.walk_before(_unpadded(position, natural))
            last = self._saved_walk
            if last is not None and last[0] == epoch and last[1] is walk:
                return dataclasses.replace(last[2], samples_consumed=position)
            saved = SavedWalk.of(
                epoch=epoch,
                samples_consumed=position,
                rank=self._rank,
                emitted=walk.emitted,
                next_admit=walk.next_admit,
                slots=walk.slots,
                drawn=walk.drawn,
                rng_state=walk.rng_state,
            )
            self._saved_walk = (epoch, walk, saved)
            return saved

    def start_walk(self, epoch: int, position: int, saved: SavedWalk) -> None:
        """Start ``epoch``'s pool from ``saved`` (:meth:`walk_state` of an order of this plan at ``position``),
        not from the epoch's start. Raises :class:`~.saved_walk.WalkMismatchError` where it does not fit this
        plan (another dataset, episodes or order options), rather than continue another order."""
        with self._lock:
            plan = self._plan(epoch)
            natural = plan.stream.natural
            if plan.simulator is None or not natural:
                raise WalkMismatchError(
                    f"the stream state carries a pool walk, but epoch {epoch} of rank {self._rank} has "
                    f"{'no shuffled pool' if natural else 'no frames'}: it was saved with other order options or over "
                    "another dataset; resume with those, or leave its 'walk' out"
                )
            plan.simulator.adopt_saved(saved, _unpadded(position, natural))

    def _natural_window(self, plan: _EpochPlan, start: int, stop: int) -> np.ndarray:
        stream = plan.stream
        if plan.simulator is None:
            first = int(np.searchsorted(plan.stream_ends, start, side="right"))
            last = int(np.searchsorted(plan.stream_ends, stop - 1, side="right"))
            return stream.episodes[first : last + 1]
        plan.simulator.draws(stop - 1, stop)  # walks forward, leaving checkpoints for the lookups below
        next_admit, slots, _ = plan.simulator.state_at(start)
        last_admit, _, _ = plan.simulator.state_at(stop)
        return np.concatenate([stream.episodes[slots], stream.episodes[next_admit:last_admit]])

    # -- plan -------------------------------------------------------------------------------------

    def _plan(self, epoch: int) -> _EpochPlan:
        epoch = check_int("epoch", epoch, minimum=0)
        plan = self._plans.get(epoch)
        if plan is None:
            plan = self._build_plan(epoch)
            self._plans[epoch] = plan
            while len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(epoch)
        return plan

    def _build_plan(self, epoch: int) -> _EpochPlan:
        segments = self._resumed.segments if self._resumed is not None and self._resumed.epoch == epoch else ()
        consumed = self._consumed_by(epoch, segments) if segments else np.zeros_like(self._lengths)
        segment = len(segments)
        remaining = self._lengths - consumed
        if segment and np.count_nonzero(remaining) < self._world_size:
            if remaining.any():  # (nothing left: the old ranks had finished the epoch)
                warn_once(logger,
                    "epoch %d: only %d partly-consumed episode(s) remain for %d ranks after the world-size "
                    "change; the epoch ends here (%d frame(s) unseen this epoch)",
                    epoch, np.count_nonzero(remaining), self._world_size, int(remaining.sum()),
                )  # fmt: skip
            empty = _RankStream(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
            return _EpochPlan(np.zeros(self._world_size, np.int64), 0, empty, None)
        shard = self._shard(epoch, segment, self._world_size, remaining)
        plan = self._plan_for(epoch, segment, self._rank, shard, consumed)
        walks = self._walks.pop(epoch, None)
        if walks is not None and plan.simulator is not None:
            plan.simulator.adopt(walks)
        return plan

    def _shard(
        self, epoch: int, segment: int, world_size: int, remaining: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """``(rank_of, rank_counts, target)``: identical on every rank, computed by each."""
        rng = (
            _generator(self._options.seed, _SHARD_STREAM, epoch, world_size, segment) if self._options.shuffle else None
        )
        try:
            rank_of = shard_episodes(remaining, world_size=world_size, rng=rng)
        except ShardingError as e:
            first, last = self._options.drop_n_first_frames, self._options.drop_n_last_frames
            if not first and not last:
                raise
            raise ShardingError(
                f"{e} (frames sampled, that is: drop_n_first_frames={first} and drop_n_last_frames={last} leave "
                "out the rest, all of an episode no longer than both)"
            ) from None
        owned = rank_of >= 0
        rank_counts = np.bincount(rank_of[owned], weights=remaining[owned], minlength=world_size).astype(np.int64)
        pad = self._options.rank_balance is RankBalance.PAD  # (NONE: each rank's own, in _plan_for)
        return rank_of, rank_counts, int(rank_counts.max() if pad else rank_counts.min())

    def _plan_for(
        self,
        epoch: int,
        segment: int,
        rank: int,
        shard: tuple[np.ndarray, np.ndarray, int],
        consumed: np.ndarray,
    ) -> _EpochPlan:
        opts = self._options
        rank_of, rank_counts, target = shard
        if opts.rank_balance is RankBalance.NONE:
            target = int(rank_counts[rank])
        world_size = rank_counts.size
        episodes = np.flatnonzero(rank_of == rank)
        if opts.shuffle:
            episodes = _generator(opts.seed, _RANK_STREAM, epoch, world_size, segment, rank).permutation(episodes)
        stream = _RankStream(episodes, self._lengths[episodes], consumed[episodes])
        if not opts.shuffle:
            ends = np.cumsum(stream.lengths - stream.first_draw)
            return _EpochPlan(rank_counts, target, stream, None, ends)
        interval = max(opts.checkpoint_interval, math.ceil(stream.natural / opts.max_checkpoints))
        simulator = _PoolSimulator(
            stream,
            pool_size=opts.episode_pool_size,
            rng_key=(opts.seed, _POOL_STREAM, epoch, world_size, segment, rank),
            interval=interval,
        )
        return _EpochPlan(rank_counts, target, stream, simulator)

    def key_offset(self, epoch: int) -> int:
        """Samples each rank took of ``epoch`` before it was re-sharded (its segments' counts together): where this
        order's positions start as the keys of a sample's augmentation draws, so that no re-sharded rank draws
        what an old rank of its number drew for another sample (0 for an epoch not resumed from segments)."""
        resumed = self._resumed
        if resumed is None or resumed.epoch != epoch:
            return 0
        return sum(segment.samples_consumed for segment in resumed.segments)

    def consumed_segments(self, epoch: int) -> tuple[ConsumedSegment, ...]:
        """The segments ``epoch`` resumed from (none but for the resumed epoch), each with its ranks' pools at its
        position where shuffled: a state that carries them resumes without replaying those ranks."""
        with self._lock:
            resumed = self._resumed
            if resumed is None or resumed.epoch != epoch or not resumed.segments:
                return ()
            self._consumed_by(epoch, resumed.segments)
            return self._replayed

    def _consumed_by(self, epoch: int, segments: tuple[ConsumedSegment, ...]) -> np.ndarray:
        """Draws per unit ``segments`` (the resumed ``epoch``'s) took, replayed once."""
        if self._residual is None:
            consumed = np.zeros_like(self._lengths)
            replayed = []
            for index, seg in enumerate(segments):
                consumed, pools = self._consume(epoch, index, seg, consumed)
                replayed.append(dataclasses.replace(seg, pools=pools))
            self._residual, self._replayed = consumed, tuple(replayed)
        return self._residual

    def resume_from(self, earlier: SampleOrder, walks: Sequence[SavedWalk] = ()) -> None:
        """Start this order's resumed epoch from what ``earlier`` replayed of it: ``earlier`` is an order of the ranks
        that took its last segment (resumed from the segments before). Only that last segment's ranks are replayed
        then, ~0.2 us of CPU a sample of each (8 ranks at 95% of an epoch of 92,000 episodes: 4.6 s), but the ranks
        whose ``walks`` (:meth:`walk_state` at that segment's position) are given, which start there: with every
        rank's, none is replayed. Raises :class:`~.saved_walk.WalkMismatchError` where one of ``walks`` claims that
        position but does not fit."""
        resumed = self._resumed
        if resumed is None or not resumed.segments:
            raise ValueError("resume_from needs an order whose resumed epoch has segments (resumed_epoch=)")
        *before, last = resumed.segments
        same = (
            earlier._options == self._options
            and earlier._world_size == last.world_size
            and np.array_equal(earlier._lengths, self._lengths)
            and (earlier._resumed.segments if earlier._resumed is not None else ()) == tuple(before)
            and (earlier._resumed is None or earlier._resumed.epoch == resumed.epoch)
        )
        if not same:
            raise ValueError(
                f"resume_from needs the order of the {last.world_size} ranks whose segment epoch {resumed.epoch} "
                f"resumed from (segments {before}), over the same units and options"
            )
        # (a walk not at that segment's position says nothing of where those ranks stood)
        at = {w.rank: w for w in walks if (w.epoch, w.samples_consumed) == (resumed.epoch, last.samples_consumed)}
        with earlier._lock:
            consumed = earlier._consumed_by(resumed.epoch, tuple(before)) if before else np.zeros_like(self._lengths)
            replayed = earlier._replayed if before else ()
        with self._lock:
            self._residual, pools = self._consume(resumed.epoch, len(before), last, consumed, at)
            self._replayed = (*replayed, dataclasses.replace(last, pools=pools))
            self._plans.pop(resumed.epoch, None)  # (a plan built before counted on a replay of its own)

    def _consume(
        self,
        epoch: int,
        segment: int,
        seg: ConsumedSegment,
        consumed: np.ndarray,
        walks: Mapping[int, SavedWalk] | None = None,
    ) -> tuple[np.ndarray, tuple[RankPool, ...] | None]:
        """Draws per episode after every rank of ``seg`` took its first ``samples_consumed`` samples, and each rank's
        pool there (None unshuffled, or where those ranks took nothing).

        Replays each old rank's prefix: CPU proportional to the samples consumed, memory O(episodes); but where
        ``seg`` carries the ranks' pools (checked against their plans), and for the ranks whose pools ``walks`` holds
        (by rank, saved at that position), which start there.
        """
        if np.count_nonzero(self._lengths - consumed) < seg.world_size:
            return consumed, None  # those ranks' epoch had ended (as in _build_plan): they took nothing
        shard = self._shard(epoch, segment, seg.world_size, self._lengths - consumed)
        # Ranks that took every sample of their plan finished the epoch: what DROP balancing left out of it stays out,
        # as in a run not interrupted (re-sharded, it was an extra pass of the epoch, or frames logged unseen)
        finished = seg.samples_consumed >= shard[2]
        after = consumed.copy()
        pools: list[RankPool] = []
        for rank in range(seg.world_size):
            plan = self._plan_for(epoch, segment, rank, shard, consumed)
            stream, natural = plan.stream, plan.stream.natural
            taken = natural if finished else min(seg.samples_consumed, natural)
            if taken == natural:  # everything, and PAD repeats add nothing new
                after[stream.episodes] = stream.lengths
                pools.append((stream.episodes.size, (), ()))
            elif plan.simulator is None:
                idx = int(np.searchsorted(plan.stream_ends, taken, side="right"))
                after[stream.episodes[:idx]] = stream.lengths[:idx]
                before = int(plan.stream_ends[idx - 1]) if idx else 0
                after[stream.episodes[idx]] = stream.first_draw[idx] + taken - before
            else:
                if seg.pools is not None:
                    next_admit, slots, drawn = checked_pool(
                        seg.pools[rank],
                        lengths=stream.lengths,
                        first_draw=stream.first_draw,
                        pool_size=self._options.episode_pool_size,
                        emitted=taken,
                    )
                else:
                    if walks and rank in walks:
                        plan.simulator.adopt_saved(walks[rank], taken)
                    next_admit, slots, drawn = plan.simulator.state_at(taken)
                pools.append((int(next_admit), tuple(slots.tolist()), tuple(drawn.tolist())))
                done = np.ones(next_admit, dtype=bool)
                done[slots] = False
                after[stream.episodes[:next_admit][done]] = stream.lengths[:next_admit][done]
                after[stream.episodes[slots]] = drawn
        return after, tuple(pools) if self._options.shuffle else None

    # -- draws and frames -------------------------------------------------------------------------

    def _natural_draws(self, plan: _EpochPlan, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        if plan.simulator is not None:
            return plan.simulator.draws(start, stop)
        positions = np.arange(start, stop, dtype=np.int64)
        idx = np.searchsorted(plan.stream_ends, positions, side="right")
        stream = plan.stream
        before = plan.stream_ends[idx] - (stream.lengths[idx] - stream.first_draw[idx])
        return stream.episodes[idx], stream.first_draw[idx] + positions - before

    def _frames(self, epoch: int, episodes: np.ndarray, draws: np.ndarray) -> np.ndarray:
        if not self._options.shuffle:
            return draws
        frames = np.empty_like(draws)
        order = np.argsort(episodes, kind="stable")
        grouped = episodes[order]
        bounds = [0, *(np.flatnonzero(np.diff(grouped)) + 1).tolist(), len(order)]
        for begin, end in itertools.pairwise(bounds):  # (slices: np.split's were ~half this loop's time)
            group = order[begin:end]
            if group.size:
                frames[group] = self._permutation(epoch, int(grouped[begin]))[draws[group]]
        return frames

    def _permutation(self, epoch: int, episode: int) -> np.ndarray:
        key = (epoch, episode)
        perm = self._permutations.get(key)
        if perm is None:
            rng = _generator(self._options.seed, _FRAME_STREAM, epoch, episode)
            perm = rng.permutation(int(self._lengths[episode]))
            self._permutations[key] = perm
            while len(self._permutations) > _PERMUTATION_CACHE:
                self._permutations.popitem(last=False)
        else:
            self._permutations.move_to_end(key)
        return perm
