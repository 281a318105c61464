"""Sample order: coverage, determinism, mixing, balance, resume (same and changed world size)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from lerobot_dali import sample_order as sample_order_module
from lerobot_dali.episode_pieces import EpisodePieces
from lerobot_dali.errors import ResumeStateError, ShardingError
from lerobot_dali.sample_order import (
    ConsumedSegment,
    OrderOptions,
    RankBalance,
    ResumedEpoch,
    SampleOrder,
    shard_episodes,
)
from lerobot_dali.stream_state import SampleStream, StreamState, merge_rank_states

REPO = Path(__file__).resolve().parents[1]
# 41 episodes of 1..30 frames, single-frame episodes included.
LENGTHS = np.random.default_rng(7).integers(1, 31, size=41)
LENGTHS[[3, 17]] = 1
ALL_FRAMES = {(e, f) for e, n in enumerate(LENGTHS.tolist()) for f in range(n)}


def _options(**kw: object) -> OrderOptions:
    base: dict[str, object] = {"seed": 11, "episode_pool_size": 4, "checkpoint_interval": 37}
    base.update(kw)
    return OrderOptions(**base)  # type: ignore[arg-type]


def _pairs(episodes: np.ndarray, frames: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(episodes.tolist(), frames.tolist(), strict=True))


def _worker_stream(rank: int, world_size: int, workers: int, batch: int, options: OrderOptions) -> np.ndarray:
    """The rank's epoch as W worker processes would build it: batch i from worker i % W, fresh objects."""
    orders = [SampleOrder(LENGTHS, rank=rank, world_size=world_size, options=options) for _ in range(workers)]
    n = orders[0].num_samples(0)
    out = np.empty((n, 2), np.int64)
    for w, order in enumerate(orders):
        for i in range(w, math.ceil(n / batch), workers):
            ep, fr = order.samples(0, i * batch, min(n, (i + 1) * batch))
            out[i * batch : i * batch + ep.size] = np.stack([ep, fr], axis=1)
    return out


@pytest.mark.parametrize(  # (more ranks than the 41 episodes need pieces)
    ("world_size", "piece_frames"), [(1, None), (2, None), (3, None), (8, None), (2, 7), (8, 7), (60, 7)]
)
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_one_epoch_covers_every_frame_once(world_size: int, workers: int, shuffle: bool, piece_frames) -> None:
    options = _options(shuffle=shuffle, piece_frames=piece_frames)
    seen: list[tuple[int, int]] = []
    per_rank = []
    for rank in range(world_size):
        stream = _worker_stream(rank, world_size, workers, batch=5, options=options)
        order = SampleOrder(LENGTHS, rank=rank, world_size=world_size, options=options)
        natural = int(order.rank_frame_counts(0)[rank])
        rank_frames = [tuple(p) for p in stream[:natural].tolist()]
        assert len(set(rank_frames)) == natural  # no frame twice within a rank
        # PAD: past its own frames a rank repeats its first samples.
        tail = stream[natural:]
        np.testing.assert_array_equal(tail, stream[: tail.shape[0]])
        seen += rank_frames
        per_rank.append(stream.shape[0])
    assert len(seen) == len(ALL_FRAMES) and set(seen) == ALL_FRAMES  # disjoint ranks, full coverage
    assert len(set(per_rank)) == 1  # equal per-rank counts


@pytest.mark.parametrize(("world_size", "piece_frames"), [(1, None), (3, None), (8, None), (8, 4), (30, 4)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("first", "last"), [(2, 3), (0, 7), (1, 0)])
def test_an_epoch_covers_every_frame_but_those_dropped_once(
    world_size: int, piece_frames, shuffle: bool, first: int, last: int
) -> None:
    """LeRobot's EpisodeAwareSampler: frames ``[first, length - last)`` of each episode, each once across ranks
    and workers (episodes no longer than ``first + last``, none); the ranks still balance."""
    options = _options(shuffle=shuffle, piece_frames=piece_frames, drop_n_first_frames=first, drop_n_last_frames=last)
    kept = {(e, f) for e, n in enumerate(LENGTHS.tolist()) for f in range(first, n - last)}
    seen: list[tuple[int, int]] = []
    for rank in range(world_size):
        stream = _worker_stream(rank, world_size, 3, batch=5, options=options)
        natural = int(
            SampleOrder(LENGTHS, rank=rank, world_size=world_size, options=options).rank_frame_counts(0)[rank]
        )
        seen += [tuple(p) for p in stream[:natural].tolist()]
        assert stream.shape[0] == SampleOrder(LENGTHS, rank=0, world_size=world_size, options=options).num_samples(0)
    assert len(seen) == len(kept) and set(seen) == kept


@pytest.mark.parametrize(("world_size", "piece_frames"), [(2, None), (3, None), (8, 7)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_unbalanced_ranks_read_their_own_frames_exactly(world_size: int, piece_frames, shuffle: bool) -> None:
    """RankBalance.NONE (evaluation): each rank emits exactly the frames it owns, so counts differ, and together
    every frame once: no repeat, nothing left out."""
    options = _options(shuffle=shuffle, piece_frames=piece_frames, rank_balance=RankBalance.NONE)
    seen: list[tuple[int, int]] = []
    counts = []
    for rank in range(world_size):
        stream = _worker_stream(rank, world_size, 2, batch=5, options=options)
        order = SampleOrder(LENGTHS, rank=rank, world_size=world_size, options=options)
        assert stream.shape[0] == order.num_samples(0) == order.rank_frame_counts(0)[rank]
        counts.append(stream.shape[0])
        seen += [tuple(p) for p in stream.tolist()]
    assert len(seen) == len(ALL_FRAMES) and set(seen) == ALL_FRAMES
    assert sum(counts) == LENGTHS.sum()
    # Where the episodes do not deal evenly, neither do the counts: 5 and 3 frames on two ranks.
    uneven = [SampleOrder(np.array([5, 3]), rank=r, world_size=2, options=options).num_samples(0) for r in range(2)]
    assert sorted(uneven) == [3, 5]


def test_unbalanced_ranks_resume_on_their_own_world_size_only() -> None:
    options = {"rank_balance": RankBalance.NONE}
    stream = _stream(2, 0, batch=4, **options)
    for _ in range(3):
        stream.next_batch()
    state = stream.state_dict()
    rest = [stream.next_batch() for _ in range(2)]
    resumed = _stream(2, 0, batch=4, **options)
    resumed.load_state_dict(state)
    for want in rest:
        np.testing.assert_array_equal(resumed.next_batch()[1], want[1])
    with pytest.raises(
        ResumeStateError,
        match=r"rank_balance='none'.*resume epoch 0 on 2 ranks, or start epoch 1 here without it \(set_epoch\(1\)",
    ):
        _stream(3, 0, batch=4, **options).load_state_dict(state)
    # At an epoch's start too, one rank's state says nothing of the other's: ranks of unequal counts finish epochs
    # apart (rank 0 at epoch 1's start, rank 1 still reading epoch 0, or further on), so a fresh epoch 1 on 3 ranks
    # lost the rest of one and read the other's again (5 of 597 fuzzed jobs read 7-83 frames twice, one missed one).
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    ranks[0].set_epoch(1)
    with pytest.raises(
        ResumeStateError,
        match=r"so one rank's state at the start of epoch 1 does not say that the other 1 rank\(s\) stood there too: "
        r"resume on 2 ranks.*merge_rank_states",
    ):
        _stream(3, 1, batch=4, **options).load_state_dict(ranks[0].state_dict())
    with pytest.raises(
        ResumeStateError,
        match=r"sample 0 of epoch 1 on 2 ranks, seed 11 and sample 0 of epoch 0 on 2 ranks, seed 11 \(or their "
        "segments",
    ):
        merge_rank_states([r.state_dict() for r in ranks])
    # Every old rank's state gathered at the start of epoch 1: it starts afresh on the new world size.
    ranks[1].set_epoch(1)
    fresh = _stream(3, 1, batch=4, **options)
    fresh.load_state_dict(merge_rank_states([r.state_dict() for r in ranks]))
    expected = SampleOrder(LENGTHS, rank=1, world_size=3, options=_options(**options)).samples(1, 0, 4)
    np.testing.assert_array_equal(fresh.next_batch()[1], expected[1])
    # On the same ranks, rank 0's state is not rank 1's: each rank's count there is its own (rank 1 continued at rank
    # 0's position, which a job saving rank 0's state alone hands every rank; 45 of 597 fuzzed jobs read out of
    # order or failed later), mid-epoch or at an epoch's start (rank 1 may still be reading the epoch before).
    for saved in (state, ranks[0].state_dict()):
        with pytest.raises(ResumeStateError, match=r"rank_balance='none'.*rank 0's state.*where rank 1 stood"):
            _stream(2, 1, batch=4, **options).load_state_dict(saved)
    own = _stream(2, 1, batch=4, **options)
    for _ in range(2):
        own.next_batch()
    mine = own.state_dict()
    assert mine["saved_rank"] == 1
    want = [own.next_batch() for _ in range(2)]
    again = _stream(2, 1, batch=4, **options)
    again.load_state_dict(json.loads(json.dumps(mine)))
    for batch in want:
        np.testing.assert_array_equal(again.next_batch()[1], batch[1])
    # Every rank's state gathered at an epoch's start is each rank's.
    again = _stream(2, 1, batch=4, **options)
    again.load_state_dict(merge_rank_states([r.state_dict() for r in ranks]))
    expected_two = SampleOrder(LENGTHS, rank=1, world_size=2, options=_options(**options)).samples(1, 0, 4)
    np.testing.assert_array_equal(again.next_batch()[1], expected_two[1])
    # One rank's state is every rank's where it ran alone.
    alone = _stream(1, 0, batch=4, **options)
    alone.set_epoch(1)
    fresh = _stream(3, 1, batch=4, **options)
    fresh.load_state_dict(alone.state_dict())
    np.testing.assert_array_equal(fresh.next_batch()[1], expected[1])


@pytest.mark.parametrize("shuffle", [False, True])
def test_unbalanced_rank_state_merged_with_itself_counts_one_rank(shuffle: bool) -> None:
    """merge_rank_states counts each rank once: rank 0's state passed for every rank (``[state] * world_size``, what a
    job saving rank 0's alone has) said gathered_ranks=2, so under rank_balance='none' rank 0 at epoch 1's start
    stood for rank 1 too, still 2 batches into epoch 0: a fresh epoch 1 on 3 ranks (or rank 1 on its own 2) was taken,
    and the rest of rank 1's epoch 0 never read (332 of its 336 frames here)."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    ranks[0].set_epoch(1)
    ranks[1].next_batch()
    assert ranks[1].num_samples() - ranks[1].samples_consumed > 0  # (what a resume from rank 0's state loses)
    doubled = merge_rank_states([ranks[0].state_dict()] * 2)
    assert doubled["gathered_ranks"] == 1
    with pytest.raises(ResumeStateError, match=r"gathered from 1 of the 2 ranks .*epoch 1 .*other 1 rank"):
        _stream(3, 1, batch=4, **options).load_state_dict(json.loads(json.dumps(doubled)))
    with pytest.raises(ResumeStateError, match=r"rank 0's state \(sample 0 of epoch 1\).*where rank 1 stood"):
        _stream(2, 1, batch=4, **options).load_state_dict(doubled)
    # Every rank's, each once: all at epoch 1's start, taken; merged again, still every rank's.
    ranks[1].set_epoch(1)
    every = merge_rank_states([r.state_dict() for r in ranks])
    assert every["gathered_ranks"] == merge_rank_states([every])["gathered_ranks"] == 2
    assert merge_rank_states([every, ranks[1].state_dict()])["gathered_ranks"] == 2
    fresh = _stream(3, 1, batch=4, **options)
    fresh.load_state_dict(every)
    want = SampleOrder(LENGTHS, rank=1, world_size=3, options=_options(**options)).samples(1, 0, 4)
    np.testing.assert_array_equal(fresh.next_batch()[1], want[1])
    # States that name no rank (saved before saved_rank) count as one together, unless their walks name them.
    unnamed = {k: v for k, v in ranks[0].state_dict().items() if k != "saved_rank"}
    assert merge_rank_states([unnamed, unnamed])["gathered_ranks"] == 1
    with pytest.raises(ResumeStateError, match=r"ranks past the 2 it was saved on \(saved_rank \[2\]"):
        merge_rank_states([ranks[0].state_dict(), {**ranks[1].state_dict(), "saved_rank": 2}])


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_state_naming_ranks_past_its_world_size_is_refused(shuffle: bool) -> None:
    """gathered_rank_ids were not checked against the world size: rank 0's state of 2 ranks at epoch 1's start, said
    gathered from ranks [0, 2], was taken under rank_balance='none' as every old rank's and started epoch 1 afresh on
    3 ranks, though rank 1 (2 batches into epoch 0) never saved there: the rest of its epoch 0 lost. A state naming a
    rank past its world size (saved_rank, gathered_rank_ids, a walk) or gathered from more ranks than it has is now
    refused naming the field, on loading and merging."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    ranks[0].set_epoch(1)
    ranks[1].next_batch()
    own = ranks[0].state_dict()
    edited = [
        ({**own, "gathered_ranks": 2, "gathered_rank_ids": [0, 2]}, r"gathered_rank_ids \[2\]"),
        ({**own, "saved_rank": 5}, r"saved_rank \[5\]"),
        ({**own, "gathered_ranks": 3, "gathered_rank_ids": [0, 1]}, r"gathered_ranks 3"),
    ]
    if shuffle:
        edited.append(({**own, "walk": {**own["walk"], "rank": 2}}, r"walks \[2\]"))
    for state, named in edited:
        for refused in (
            lambda: _stream(3, 1, batch=4, **options).load_state_dict(state),  # noqa: B023
            lambda: merge_rank_states([state, ranks[1].state_dict()]),  # noqa: B023
        ):
            with pytest.raises(ResumeStateError, match=rf"ranks past the 2 it was saved on \({named}.*ranks 0 to 1"):
                refused()


@pytest.mark.parametrize("shuffle", [False, True])
def test_unbalanced_state_that_names_no_rank_beside_named_ones_counts_as_none_of_its_own(shuffle: bool) -> None:
    """A state that names no rank (saved before saved_rank) may be one of the named ones': rank 1's own state merged
    with the same state saved without saved_rank counted 2 ranks (the unnamed one as another), so under
    rank_balance='none' rank 1 at epoch 1's start stood for rank 0 too, still 1 batch into epoch 0: a fresh epoch 1 on
    3 ranks was taken, and the rest of rank 0's epoch 0 never read. (A fuzz of merge trees over states of both kinds:
    14 of 1,499 merges taken on another world size without every old rank's state, 0 now.)"""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    ranks[0].next_batch()
    ranks[1].set_epoch(1)
    lost = ranks[0].num_samples() - ranks[0].samples_consumed
    assert lost > 0  # (what a resume from rank 1's state alone loses)
    own = ranks[1].state_dict()
    unnamed = {k: v for k, v in own.items() if k not in ("saved_rank", "walk")}
    for states in ([own, unnamed], [unnamed, own]):
        merged = json.loads(json.dumps(merge_rank_states(states)))
        assert merged["gathered_ranks"] == 1
        with pytest.raises(ResumeStateError, match=r"rank_balance='none'.*start of epoch 1"):
            _stream(3, 1, batch=4, **options).load_state_dict(merged)


@pytest.mark.parametrize("version", [2, 3])
def test_unbalanced_states_that_name_no_rank_passed_for_every_rank_are_refused(version: int) -> None:
    """States saved before saved_rank (version 3 unshuffled, version 2 without a walk) name no rank, so rank 0's
    passed for every rank (``[state] * world_size``) looks as every rank's does: merge_rank_states counted each, said
    gathered_ranks=2, and under rank_balance='none' rank 0 at epoch 1's start stood for rank 1, still 1 batch into
    epoch 0: a fresh epoch 1 on 3 ranks was taken, the rest of rank 1's epoch 0 never read (332 of its 336 frames).
    They count as one now, and the refusal says why and how to go on; a dict merged so before is refused too."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": version == 2}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    ranks[0].set_epoch(1)
    ranks[1].next_batch()
    assert ranks[1].num_samples() - ranks[1].samples_consumed == 332
    old = {k: v for k, v in ranks[0].state_dict().items() if k not in ("saved_rank", "walk")} | {"version": version}
    doubled = merge_rank_states([old] * 2)
    assert doubled["gathered_ranks"] == 1
    refusal = (
        r"names no rank \(saved before lerobot_dali recorded saved_rank\).*merge_rank_states counts them as one.*"
        r"start it here without the state \(seed 11, set_epoch\(1\), no state loaded\)"
    )
    for saved in (doubled, {**doubled, "gathered_ranks": 2}, old):
        with pytest.raises(ResumeStateError, match=refusal):
            _stream(3, 1, batch=4, **options).load_state_dict(json.loads(json.dumps(saved)))
    # What the refusal says to do where every rank did stand at epoch 1's start: the same batches as the merge gave.
    ranks[1].set_epoch(1)
    every = merge_rank_states([r.state_dict() for r in ranks])
    for rank in range(3):
        loaded, fresh = _stream(3, rank, batch=4, **options), _stream(3, rank, batch=4, **options)
        loaded.load_state_dict(every)
        fresh.set_epoch(1)
        for _ in range(3):
            np.testing.assert_array_equal(np.stack(fresh.next_batch()), np.stack(loaded.next_batch()))


@pytest.mark.parametrize("shuffle", [False, True])
def test_unbalanced_ranks_states_merged_mid_epoch_resume_every_rank(shuffle: bool) -> None:
    """Under rank_balance='none', merge_rank_states of every rank's state mid-epoch (all at one position: it refuses
    states that stand apart) holds each rank's position (the same count) and walk: loaded on any rank of that world
    size it continues that rank's stream exactly. It was refused on every rank but the first state's (rank 1 of 2
    here), as one rank's state is; a state gathered from fewer ranks, or loaded on another world size, still is."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    for stream in ranks:
        for _ in range(3):
            stream.next_batch()
    own = ranks[0].state_dict()
    merged = json.loads(json.dumps(merge_rank_states([own, ranks[1].state_dict()])))
    assert merged["gathered_ranks"] == 2 and merged["saved_rank"] == 0 and merged["samples_consumed"] == 12
    for rank, stream in enumerate(ranks):
        rest = []
        while stream.samples_consumed < stream.num_samples():
            rest.append(stream.next_batch()[1])
        resumed = _stream(2, rank, batch=4, **options)
        resumed.load_state_dict(merged)
        assert len(rest) > 1
        for want in rest:
            np.testing.assert_array_equal(resumed.next_batch()[1], want)
        assert resumed.epoch == 0 and resumed.samples_consumed == resumed.num_samples()
    doubled = merge_rank_states([own] * 2)
    with pytest.raises(ResumeStateError, match=r"rank 0's state \(sample 12 of epoch 0\).*where rank 1 stood"):
        _stream(2, 1, batch=4, **options).load_state_dict(doubled)
    with pytest.raises(ResumeStateError, match=r"rank_balance='none'.*resume epoch 0 on 2 ranks"):
        _stream(3, 1, batch=4, **options).load_state_dict(merged)


@pytest.mark.parametrize("shuffle", [False, True])
def test_unbalanced_merge_of_merged_states_counts_every_rank_it_holds(shuffle: bool) -> None:
    """A merge of merged states holds every rank the merges gathered: ``merge_rank_states([merge_rank_states([s0,
    s1]), s2])`` of 3 ranks under rank_balance='none' said gathered_ranks=2 where unshuffled (the inner merge kept only
    s0's saved_rank, and no walk named rank 1), so it was refused on ranks 1 and 2; shuffled, the walks named all 3.
    Loaded on each rank it now continues that rank's stream exactly as the rank's own state does, mid-epoch, and at an
    epoch's start it starts the epoch afresh on another world size."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(3, r, batch=4, **options) for r in range(3)]
    for stream in ranks:
        for _ in range(3):
            stream.next_batch()
    states = [r.state_dict() for r in ranks]
    merges = [
        merge_rank_states([merge_rank_states(states[:2]), states[2]]),
        merge_rank_states([states[0], merge_rank_states(states[1:])]),
        merge_rank_states([merge_rank_states(states[:2]), merge_rank_states(states[1:])]),
        merge_rank_states([merge_rank_states([states[2], states[0]]), merge_rank_states([states[1]])]),
    ]
    merges = [json.loads(json.dumps(merged)) for merged in merges]
    assert [merged["gathered_ranks"] for merged in merges] == [3] * len(merges)
    for rank, stream in enumerate(ranks):
        rest = [np.stack(stream.next_batch()) for _ in range(math.ceil(stream.num_samples() / 4) - 3 + 2)]
        assert stream.epoch == 1  # (read on into the next epoch)
        for saved in (states[rank], *merges):
            resumed = _stream(3, rank, batch=4, **options)
            resumed.load_state_dict(saved)
            for want in rest:
                np.testing.assert_array_equal(np.stack(resumed.next_batch()), want)
    # At an epoch's start on another world size: every old rank's, so a fresh epoch 2 there.
    starts = []
    for stream in ranks:
        stream.set_epoch(2)
        starts.append(stream.state_dict())
    merged = merge_rank_states([merge_rank_states(starts[:2]), starts[2]])
    assert merged["gathered_ranks"] == 3
    for rank in range(4):
        fresh = _stream(4, rank, batch=4, **options)
        fresh.load_state_dict(merged)
        want = SampleOrder(LENGTHS, rank=rank, world_size=4, options=_options(**options)).samples(2, 0, 4)
        np.testing.assert_array_equal(np.stack(fresh.next_batch()), np.stack(want))
    # Fewer ranks' merged, still refused: rank 2's state is not among them.
    with pytest.raises(ResumeStateError, match=r"rank 0's state \(sample 12 of epoch 0\).*where rank 2 stood"):
        _stream(3, 2, batch=4, **options).load_state_dict(merge_rank_states([merge_rank_states(states[:2])]))


def test_a_load_from_another_thread_lands_between_two_batches() -> None:
    """load_state_dict() from another thread while next_batch() read a batch: the batch, read at the old position,
    was counted after the load, on the loaded position (sample 12 became 8, the old position plus a batch: the load
    lost). The load now waits for the batch, and the stream stands where the state says. A count or epoch change
    told of a read begun before a load (``loads``, as the iterator's workers read) is not made."""
    options = {"shuffle": True}
    reference = _stream(1, 0, batch=4, **options)
    batches = [reference.next_batch()[1] for _ in range(4)]
    saver = _stream(1, 0, batch=4, **options)
    for _ in range(3):
        saver.next_batch()
    saved = saver.state_dict()
    stream = _stream(1, 0, batch=4, **options)
    stream.next_batch()
    reading, go, loader_waits = threading.Event(), threading.Event(), threading.Event()
    read = stream.order.samples

    def slow_samples(*args: object) -> tuple[np.ndarray, np.ndarray]:
        reading.set()
        go.wait(30)
        return read(*args)

    stream.order.samples = slow_samples  # type: ignore[method-assign]
    loader = threading.Thread(target=stream.load_state_dict, args=(saved,))

    class NotedLock:  # (says when the loader waits for the stream's lock: the old stream had none)
        def __init__(self, lock: object) -> None:
            self.lock = lock

        def __enter__(self) -> object:
            if threading.current_thread() is loader:
                loader_waits.set()
            return self.lock.__enter__()

        def __exit__(self, *exc: object) -> object:
            return self.lock.__exit__(*exc)

    if hasattr(stream, "_lock"):
        stream._lock = NotedLock(stream._lock)
    reader = threading.Thread(target=stream.next_batch)
    reader.start()
    assert reading.wait(30)
    loader.start()
    while loader.is_alive() and not loader_waits.is_set():  # (loaded, or waiting for the batch)
        loader.join(0.01)
    go.set()
    reader.join(30)
    loader.join(30)
    assert not reader.is_alive() and not loader.is_alive()
    assert (stream.epoch, stream.samples_consumed) == (0, 12)
    np.testing.assert_array_equal(stream.next_batch()[1], batches[3])
    loads = stream.loads
    stream.load_state_dict(saved)
    assert not stream.advance(4, loads=loads) and not stream.set_epoch(1, loads=loads)
    assert (stream.epoch, stream.samples_consumed) == (0, 12)
    assert stream.advance(4, loads=stream.loads) and stream.samples_consumed == 16


def test_unbalanced_state_ranks_load_as_numpy_ints_as_its_other_fields() -> None:
    """saved_rank and gathered_ranks are ints as the state's other fields are, numpy's too (a checkpoint format may
    give those): np.int64 in every field loaded but for saved_rank, refused as 'must be the rank state_dict() saved'."""
    options = {"rank_balance": RankBalance.NONE}
    own = _stream(2, 1, batch=4, **options)
    own.next_batch()
    saved = own.state_dict()
    want = own.next_batch()
    as_numpy = {k: np.int64(v) if isinstance(v, int) else v for k, v in saved.items()}
    assert isinstance(as_numpy["saved_rank"], np.integer)
    again = _stream(2, 1, batch=4, **options)
    again.load_state_dict(as_numpy)
    np.testing.assert_array_equal(again.next_batch()[1], want[1])
    with pytest.raises(ResumeStateError, match=r"rank 1's state \(sample 4 of epoch 0\).*where rank 0 stood"):
        _stream(2, 0, batch=4, **options).load_state_dict(as_numpy)
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    for r in ranks:
        r.set_epoch(1)
    merged = merge_rank_states([r.state_dict() for r in ranks])
    fresh = _stream(3, 0, batch=4, **options)
    fresh.load_state_dict({**merged, "gathered_ranks": np.int64(2)})
    assert fresh.epoch == 1
    for bad in (True, -1, 1.0):
        with pytest.raises(ResumeStateError, match="saved_rank must be the rank state_dict"):
            _stream(2, 1, batch=4, **options).load_state_dict({**saved, "saved_rank": bad})
        with pytest.raises(ResumeStateError, match="gathered_ranks must be the count"):
            _stream(3, 0, batch=4, **options).load_state_dict({**merged, "gathered_ranks": bad})


def test_ranks_agree_on_counts_and_balance_within_longest_episode() -> None:
    orders = [SampleOrder(LENGTHS, rank=r, world_size=3, options=_options()) for r in range(3)]
    counts = [o.rank_frame_counts(2) for o in orders]
    for c in counts[1:]:
        np.testing.assert_array_equal(c, counts[0])
    assert counts[0].sum() == LENGTHS.sum()
    assert counts[0].max() - counts[0].min() <= LENGTHS.max()
    episodes = np.concatenate([o.rank_episodes(2) for o in orders])
    assert sorted(episodes.tolist()) == list(range(LENGTHS.size))


def test_shard_unshuffled_hand_computed() -> None:
    # Longest first, each to the emptier rank (ties: lowest rank): ep2(8)->0 [8, 0], ep0(5)->1 [8, 5],
    # ep4(4)->1 [8, 9], ep1(3)->0 [11, 9], ep3(1)->1 [11, 10]. (The former snake deal gave [12, 9].)
    rank_of = shard_episodes(np.array([5, 3, 8, 1, 4, 0]), world_size=2, rng=None)
    np.testing.assert_array_equal(rank_of, [1, 0, 0, 1, 1, -1])


def test_shuffled_shard_deals_the_longest_to_the_emptiest_rank() -> None:
    """7 episodes on 3 ranks. Greedy, whatever the seed: 40->a, 31->b, 25->c, 19->c (44), 13->b (44), 7->a (47),
    5->b or c (44, a tie) -> frames {44, 47, 49}. A random lane order per sorted round could give one rank the
    longest episode of every round ([38, 64, 38] for 40+19+5: 52 PAD repeats instead of 7)."""
    lengths = np.array([13, 40, 7, 25, 31, 5, 19])
    splits = set()
    for seed in range(6):
        for epoch in range(4):
            orders = [SampleOrder(lengths, rank=r, world_size=3, options=OrderOptions(seed=seed)) for r in range(3)]
            counts = orders[0].rank_frame_counts(epoch)
            assert sorted(counts.tolist()) == [44, 47, 49], (seed, epoch)
            assert orders[0].num_samples(epoch) == 49
            splits.add(tuple(tuple(sorted(o.rank_episodes(epoch).tolist())) for o in orders))
    drop = SampleOrder(lengths, rank=0, world_size=3, options=OrderOptions(rank_balance=RankBalance.DROP))
    assert drop.num_samples(0) == 44
    assert len(splits) > 1  # which rank holds which episodes still changes with the seed and epoch


def _naive_greedy(lengths: np.ndarray, world_size: int) -> np.ndarray:
    """The unshuffled deal by its definition: longest first (ties: lower index), to the emptiest rank (ties: lowest)."""
    loads = np.zeros(world_size, np.int64)
    rank_of = np.full(lengths.size, -1, np.int64)
    for e in sorted(np.flatnonzero(lengths).tolist(), key=lambda e: (-lengths[e], e)):
        rank_of[e] = int(np.argmin(loads))
        loads[rank_of[e]] += lengths[e]
    return rank_of


def test_shard_unshuffled_deals_by_the_definition() -> None:
    """Unshuffled, the deal is the plain definition (random lengths, zero-length episodes, many ties)."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        world_size = int(rng.integers(1, 10))
        lengths = rng.integers(0, int(rng.choice([2, 4, 30, 1000])), size=int(rng.integers(world_size + 2, 90)))
        lengths[:world_size] += 1
        np.testing.assert_array_equal(
            shard_episodes(lengths, world_size=world_size, rng=None), _naive_greedy(lengths, world_size)
        )


@pytest.mark.parametrize("rng", [None, np.random.default_rng(3)], ids=["unshuffled", "shuffled"])
def test_one_rank_takes_every_episode_without_a_deal(rng: np.random.Generator | None, monkeypatch) -> None:
    """Before, one rank's episodes were dealt through the heap too (0.46 s for 1,000,000 episodes, every epoch's
    plan); now each episode with frames is rank 0's at once, as the deal gave."""
    from lerobot_dali import sample_order

    lengths = np.array([5, 0, 8, 1, 0, 4])
    dealt = sample_order._greedy_deal(np.sort(lengths[lengths > 0])[::-1], np.arange(1))
    assert dealt.tolist() == [0, 0, 0, 0]
    monkeypatch.setattr(sample_order, "_greedy_deal", None)  # (a call fails)
    rank_of = shard_episodes(lengths, world_size=1, rng=rng)
    assert rank_of.dtype == np.int64 and rank_of.tolist() == [0, -1, 0, 0, -1, 0]
    order = SampleOrder(lengths, rank=0, world_size=1, options=OrderOptions(shuffle=rng is not None))
    assert sorted(order.rank_episodes(0).tolist()) == [0, 2, 3, 5] and order.num_samples(0) == 18


@pytest.mark.parametrize("shuffle", [True, False])
def test_shard_balance_over_random_length_sets(shuffle: bool) -> None:
    """50 episodes of 100-1000 frames on 8 ranks: every rank gets an episode; two ranks differ by at most the
    fullest rank's shortest episode (so at most the longest); PAD repeats ~2% of the epoch on average (the
    former random-lane deal: ~5.7%; snake: ~3.2%)."""
    rng = np.random.default_rng(0)
    world_size, repeats = 8, []
    for trial in range(40):
        lengths = rng.integers(100, 1000, size=50)
        gen = np.random.Generator(np.random.Philox(trial)) if shuffle else None
        rank_of = shard_episodes(lengths, world_size=world_size, rng=gen)
        assert np.bincount(rank_of, minlength=world_size).min() >= 1
        frames = np.bincount(rank_of, weights=lengths, minlength=world_size).astype(np.int64)
        spread = int(frames.max() - frames.min())
        shortest = lengths[rank_of == np.argmax(frames)].min()  # of the fullest rank; shuffled: within a 10% band
        assert spread <= (1.1 if shuffle else 1.0) * shortest and spread <= lengths.max(), trial
        repeats.append((world_size * frames.max() - lengths.sum()) / lengths.sum())
    assert np.mean(repeats) < 0.03, np.mean(repeats)


def test_shuffled_shards_regroup_episodes_every_epoch() -> None:
    """Dealt in exact length order, episodes of distinct lengths landed in the same groups every epoch (96% of
    pairs sharing a rank in one epoch shared one in the next); within 10% length bands they regroup (12.5% at
    random)."""
    lengths = np.arange(100, 150) * 7  # 50 distinct lengths, 700-1043 frames
    kept = []
    for seed in range(10):
        a, b = (shard_episodes(lengths, world_size=8, rng=np.random.default_rng([seed, e])) for e in (0, 1))
        together_a, together_b = a[:, None] == a[None, :], b[:, None] == b[None, :]
        upper = np.triu_indices(lengths.size, 1)
        kept.append((together_a & together_b)[upper].sum() / together_a[upper].sum())
    assert np.mean(kept) < 0.3, np.mean(kept)


def test_unshuffled_two_ranks_hand_computed() -> None:
    lengths = np.array([5, 3, 8, 1, 4])
    pad = [SampleOrder(lengths, rank=r, world_size=2, options=OrderOptions(shuffle=False)) for r in range(2)]
    # The deal of test_shard_unshuffled_hand_computed: rank 0 holds ep1, ep2; rank 1 ep0, ep3, ep4.
    np.testing.assert_array_equal(pad[0].rank_frame_counts(0), [11, 10])
    assert pad[0].num_samples(0) == 11
    ep, fr = pad[0].samples(0, 0, 11)
    assert _pairs(ep, fr) == [(1, 0), (1, 1), (1, 2)] + [(2, f) for f in range(8)]
    ep, fr = pad[1].samples(0, 0, 11)
    assert _pairs(ep, fr) == [(0, f) for f in range(5)] + [(3, 0)] + [(4, f) for f in range(4)] + [(0, 0)]
    drop_options = OrderOptions(shuffle=False, rank_balance="drop")  # type: ignore[arg-type]  # as from TOML
    drop = SampleOrder(lengths, rank=0, world_size=2, options=drop_options)
    assert drop.options.rank_balance is RankBalance.DROP
    assert drop.num_samples(0) == 10
    ep, fr = drop.samples(0, 8, 10)
    assert _pairs(ep, fr) == [(2, 5), (2, 6)]


def test_unshuffled_single_rank_is_dataset_order_every_epoch() -> None:
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=_options(shuffle=False))
    expected = [(e, f) for e, n in enumerate(LENGTHS.tolist()) for f in range(n)]
    for epoch in (0, 3):
        assert _pairs(*order.samples(epoch, 0, order.num_samples(epoch))) == expected


def test_same_seed_same_order_in_a_fresh_process() -> None:
    order = SampleOrder(LENGTHS, rank=1, world_size=3, options=_options())
    ep, fr = order.samples(1, 10, 60)
    code = (
        "import numpy as np\n"
        "from lerobot_dali.sample_order import OrderOptions, SampleOrder\n"
        f"lengths = np.array({LENGTHS.tolist()})\n"
        "o = SampleOrder(lengths, rank=1, world_size=3, "
        "options=OrderOptions(seed=11, episode_pool_size=4, checkpoint_interval=37))\n"
        "ep, fr = o.samples(1, 10, 60)\n"
        "print(ep.tolist()); print(fr.tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [str(ep.tolist()), str(fr.tolist())]


def test_seed_and_epoch_change_the_order() -> None:
    def first(seed: int, epoch: int) -> list[tuple[int, int]]:
        order = SampleOrder(LENGTHS, rank=0, world_size=2, options=_options(seed=seed))
        return _pairs(*order.samples(epoch, 0, 50))

    assert first(11, 0) == first(11, 0)
    assert first(11, 0) != first(12, 0)
    assert first(11, 0) != first(11, 1)


def test_random_access_equals_sequential() -> None:
    options = _options()
    full = SampleOrder(LENGTHS, rank=0, world_size=1, options=options).samples(0, 0, int(LENGTHS.sum()))
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=options)
    for start, stop in [(400, 410), (3, 9), (0, 1), (200, 520), (519, 519), (100, 101)]:
        ep, fr = order.samples(0, start, stop)
        np.testing.assert_array_equal(ep, full[0][start:stop])
        np.testing.assert_array_equal(fr, full[1][start:stop])
    with pytest.raises(IndexError, match="outside epoch 0"):
        order.samples(0, 0, int(LENGTHS.sum()) + 1)


def test_batches_asked_in_turn_walk_each_chunk_of_the_pool_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Increasing access (a DALI worker's, batch after batch) walks on from where the last batch left the pool: a batch
    that starts where the last chunk walked ended continues that walk, where a replay from the checkpoint before it
    (here the epoch's start) would walk every chunk up to there again, each batch."""
    from lerobot_dali.sample_order import _PoolSimulator

    options = _options(checkpoint_interval=10**6)  # (one checkpoint, at 0: a replay walks from the epoch's start)
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    n = int(LENGTHS.sum())
    whole = SampleOrder(LENGTHS, rank=0, world_size=1, options=options).samples(0, 0, n)
    once = starts.copy()
    starts.clear()
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=options)
    one_by_one = [order.samples(0, position, position + 1) for position in range(n)]  # (every chunk's end a start)
    np.testing.assert_array_equal(np.concatenate([ep for ep, _ in one_by_one]), whole[0])
    np.testing.assert_array_equal(np.concatenate([fr for _, fr in one_by_one]), whole[1])
    assert len(once) > 10 and starts == once  # (each chunk drawn once, in turn)


def test_pickled_order_gives_the_same_samples() -> None:
    order = SampleOrder(LENGTHS, rank=2, world_size=3, options=_options())
    before = order.samples(0, 20, 80)
    clone = pickle.loads(pickle.dumps(order))
    after = clone.samples(0, 20, 80)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_checkpoints_are_spread_to_at_most_max_checkpoints() -> None:
    """An interval of 1 sample is raised to ceil(natural / 4): one checkpoint past each quarter of the epoch."""
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=_options(checkpoint_interval=1, max_checkpoints=4))
    total = order.num_samples(0)
    order.samples(0, 0, total)
    positions = np.asarray(order._plan(0).simulator._checkpoint_positions)
    assert positions[0] == 0 and 4 <= positions.size <= 5
    assert np.all(np.diff(positions // -(-total // 4)) == 1)


@pytest.mark.parametrize("position", [0, 1, 60, 97, 133, 134])  # (134 on rank 4: past its own frames, PAD)
def test_a_copy_of_a_prepared_order_starts_where_it_was_prepared(monkeypatch: pytest.MonkeyPatch, position) -> None:
    """DALI's workers get the order pickled: prepared (walked) to the resumed position first, a copy walks on from
    the chunk boundary at or before it, where each copy used to replay the epoch from its start; a copy of that
    copy too."""
    from lerobot_dali.sample_order import _PoolSimulator

    options = _options(checkpoint_interval=10**6)  # (no checkpoint on the way to hide a replay)
    order = SampleOrder(LENGTHS, rank=4, world_size=5, options=options)
    natural, total = int(order.rank_frame_counts(0)[4]), order.num_samples(0)
    assert (natural, total) == (134, 135)
    order.prepare(0, position)
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    fresh = SampleOrder(LENGTHS, rank=4, world_size=5, options=options).samples(0, position, total)
    walked = position if position < natural else position - natural
    boundary = max(start for start in starts if start <= walked)  # (the fresh order walked from 0)
    for copy in (pickle.loads(pickle.dumps(order)), pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(order))))):
        starts.clear()
        got = copy.samples(0, position, total)
        np.testing.assert_array_equal(got[0], fresh[0])
        np.testing.assert_array_equal(got[1], fresh[1])
        assert starts[0] == boundary


@pytest.mark.parametrize(
    ("lengths", "pool"), [(LENGTHS, 4), (LENGTHS, 64), (np.full(200, 50), 16), (np.full(200, 50), 64)]
)
def test_first_batch_mixes_the_pool(lengths: np.ndarray, pool: int) -> None:
    order = SampleOrder(lengths, rank=0, world_size=1, options=_options(episode_pool_size=pool))
    ep, _ = order.samples(0, 0, 64)  # a batch at least as large as the pool
    assert np.unique(ep).size >= min(pool, lengths.size) / 2


def test_pool_of_one_emits_whole_episodes_in_turn() -> None:
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=_options(episode_pool_size=1))
    ep, fr = order.samples(0, 0, int(LENGTHS.sum()))
    changes = np.flatnonzero(np.diff(ep)) + 1
    blocks = np.split(ep, changes)
    assert len(blocks) == LENGTHS.size  # each episode is one contiguous block
    assert [b.size for b in blocks] == LENGTHS[[b[0] for b in blocks]].tolist()
    assert sorted(fr[: blocks[0].size].tolist()) == list(range(blocks[0].size))


def test_first_draw_is_proportional_to_remaining_frames() -> None:
    # Pool {ep0: 1 frame, ep1: 3 frames}: the first sample is from ep1 with probability 3/4, whichever
    # episode was admitted first (checked per admission order, so biases cannot cancel out).
    lengths = np.array([1, 3])
    hits: dict[int, list[int]] = {0: [], 1: []}
    for seed in range(800):
        order = SampleOrder(lengths, rank=0, world_size=1, options=OrderOptions(seed=seed))
        hits[int(order.rank_episodes(0)[0])].append(int(order.samples(0, 0, 1)[0][0]))
    for first_admitted, outcomes in hits.items():
        assert len(outcomes) > 300, first_admitted
        assert abs(np.mean(outcomes) - 0.75) < 0.08, first_admitted  # sd ~0.022


def test_frames_within_an_episode_are_reshuffled_each_epoch() -> None:
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=_options(episode_pool_size=1))
    ep0, fr0 = order.samples(0, 0, int(LENGTHS.sum()))
    ep1, fr1 = order.samples(1, 0, int(LENGTHS.sum()))
    changed = [not np.array_equal(fr0[ep0 == e], fr1[ep1 == e]) for e in range(LENGTHS.size) if LENGTHS[e] > 3]
    assert sum(changed) == len(changed)
    assert sorted(fr1[ep1 == 0].tolist()) == list(range(LENGTHS[0]))


def test_too_few_episodes_for_the_ranks() -> None:
    with pytest.raises(ShardingError, match="3 episode.*episode_piece_frames=1 "):
        SampleOrder(np.array([4, 0, 2, 9]), rank=0, world_size=4).num_samples(0)
    # The value the error suggests deals: 150 frames, 4 ranks -> pieces of 9 frames, 5 + 3 + 10 of them.
    with pytest.raises(
        ShardingError,
        match=r"episode_piece_frames=9 gives the ranks 4 pieces or more each on average \(pipelines/train\.py: "
        r"--episode-piece-frames 9\)$",
    ) as raised:
        SampleOrder(np.array([40, 0, 20, 90]), rank=0, world_size=4).num_samples(0)
    suggested = int(re.search(r"episode_piece_frames=(\d+)", str(raised.value)).group(1))
    pieces = [
        SampleOrder(np.array([40, 0, 20, 90]), rank=r, world_size=4, options=OrderOptions(piece_frames=suggested))
        for r in range(4)
    ]
    counts = {o.num_samples(0) for o in pieces}  # padded to the fullest rank, at most a piece over its share
    assert len(counts) == 1 and 150 <= 4 * counts.pop() <= 150 + 4 * suggested
    with pytest.raises(ShardingError, match="3 frame\\(s\\) in all, fewer than the ranks"):
        SampleOrder(np.array([2, 0, 1]), rank=0, world_size=4).num_samples(0)
    # In pieces of at most 3 frames: [4] -> 2 + 2, [2], [9] -> 3 + 3 + 3; six pieces for four ranks.
    options = OrderOptions(shuffle=False, piece_frames=3)
    orders = [SampleOrder(np.array([4, 0, 2, 9]), rank=r, world_size=4, options=options) for r in range(4)]
    taken = [_pairs(*o.samples(0, 0, o.num_samples(0))) for o in orders]
    # Longest first, each to the emptiest rank (ties: the lowest): 3, 3, 3, 2; then 2 to rank 3 and 2 to rank 0.
    assert orders[0].rank_frame_counts(0).tolist() == [5, 3, 3, 4]
    assert sorted(p for t in taken for p in set(t)) == [(0, f) for f in range(4)] + [(2, 0), (2, 1)] + [
        (3, f) for f in range(9)
    ]
    assert all(len(t) == 5 for t in taken)  # PAD: every rank as many as the fullest


def test_pieces_are_near_equal_runs_of_each_episode() -> None:
    pieces = EpisodePieces.cut(np.array([5, 101, 0, 3, 100]), 100)
    assert pieces.episode.tolist() == [0, 1, 1, 2, 3, 4]
    assert pieces.offset.tolist() == [0, 0, 50, 0, 0, 0]
    assert pieces.length.tolist() == [5, 50, 51, 0, 3, 100]  # 101 frames: 50 + 51, not 100 + 1
    assert EpisodePieces.cut(np.array([5, 3]), None).whole and EpisodePieces.cut(np.array([5, 3]), 5).whole
    split = EpisodePieces.cut(np.array([5, 3]), 2)  # 5 -> 1 + 2 + 2, 3 -> 1 + 2
    assert (split.length.tolist(), split.offset.tolist()) == ([1, 2, 2, 1, 2], [0, 1, 3, 0, 1])
    episodes, frames = split.frames(np.array([2, 4]), np.array([1, 0]))
    assert (episodes.tolist(), frames.tolist()) == ([0, 1], [4, 1])
    assert split.episodes(np.array([4, 2, 3, 0])).tolist() == [1, 0]
    # Frames dropped at both ends: 5 keeps [1, 3), 3 none, 101 keeps [1, 99) in 49 + 49.
    dropped = EpisodePieces.cut(np.array([5, 3, 101]), 50, drop_first=1, drop_last=2)
    assert dropped.episode.tolist() == [0, 1, 2, 2] and not dropped.whole
    assert (dropped.offset.tolist(), dropped.length.tolist()) == ([1, 0, 1, 50], [2, 0, 49, 49])
    assert EpisodePieces.cut(np.array([5, 3]), None, drop_last=2).whole  # (no mapping: each starts at 0)


def test_pieces_balance_ranks_that_hold_few_episodes() -> None:
    """50 episodes of 200-800 frames on 32 ranks (~780 frames each): ranks differ by up to an episode whole,
    by up to a piece in pieces, so PAD repeats 8.8% of the epoch, 6.1% with pieces of 100 and 1.6% of 50."""
    lengths = np.random.default_rng(0).integers(200, 800, 50)
    repeated = {}
    for piece_frames in (None, 100, 50):
        order = SampleOrder(lengths, rank=0, world_size=32, options=OrderOptions(piece_frames=piece_frames))
        counts = order.rank_frame_counts(0)
        assert counts.sum() == lengths.sum()
        assert counts.max() - counts.min() <= (lengths.max() if piece_frames is None else piece_frames)
        repeated[piece_frames] = round(float((counts.max() * 32 - counts.sum()) / counts.sum()), 3)
    assert repeated == {None: 0.088, 100: 0.061, 50: 0.016}


def test_the_default_pool_is_the_64_episodes_the_docs_and_pipelines_give() -> None:
    """The README's example and pipelines/train.py's --episode-pool-size default say 64: OrderOptions() (and every
    loader left at its default) pools as many, so an order they describe is the one the library makes."""
    assert OrderOptions().episode_pool_size == sample_order_module.DEFAULT_EPISODE_POOL_SIZE == 64


def test_option_validation() -> None:
    with pytest.raises(ValueError, match="episode_pool_size"):
        OrderOptions(episode_pool_size=0)
    with pytest.raises(ValueError, match="drop_n_last_frames"):
        OrderOptions(drop_n_last_frames=-1)
    with pytest.raises(ValueError, match="rank_balance must be one of 'pad', 'drop', 'none', got 'trim'"):
        OrderOptions(rank_balance="trim")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank must be in"):
        SampleOrder(LENGTHS, rank=2, world_size=2)
    with pytest.raises(TypeError, match="shuffle must be a bool"):
        OrderOptions(shuffle=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="1-D integer array, got float64"):
        SampleOrder(LENGTHS.astype(float), rank=0, world_size=1)
    with pytest.raises(ValueError, match="negative length at position 2"):
        SampleOrder(np.array([3, 4, -1, 5]), rank=0, world_size=1)
    with pytest.raises(ValueError, match="one pool per rank \\(2\\), got 1"):
        ConsumedSegment(2, 5, pools=((0, (), ()),))
    with pytest.raises(TypeError, match="ConsumedSegment objects"):
        ResumedEpoch(0, ((2, 5),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive int, got True"):
        SampleStream(LENGTHS, rank=0, world_size=1, batch_size=True)
    stream = SampleStream(LENGTHS, rank=0, world_size=1, batch_size=4)
    with pytest.raises(ValueError, match="epoch must be a non-negative int, got -1"):
        stream.set_epoch(-1)
    with pytest.raises(ValueError, match="samples must be a non-negative int, got True"):
        stream.advance(True)
    assert (stream.epoch, stream.samples_consumed) == (0, 0)
    with pytest.raises(ValueError, match="needs an order whose resumed epoch has segments"):
        SampleOrder(LENGTHS, rank=0, world_size=2).resume_from(SampleOrder(LENGTHS, rank=0, world_size=2))
    resumed = SampleOrder(LENGTHS, rank=0, world_size=2, resumed_epoch=ResumedEpoch(0, (ConsumedSegment(3, 20),)))
    with pytest.raises(ValueError, match="the order of the 3 ranks"):  # (an order of 2 ranks, not the segment's 3)
        resumed.resume_from(SampleOrder(LENGTHS, rank=0, world_size=2))
    twice = ResumedEpoch(0, (ConsumedSegment(2, 10), ConsumedSegment(3, 20)))
    resumed_twice = SampleOrder(LENGTHS, rank=0, world_size=2, resumed_epoch=twice)
    assert [resumed_twice.key_offset(e) for e in (0, 1)] == [30, 0]  # (10 then 20 samples a rank; epoch 1: none)
    with pytest.raises(ValueError, match="the order of the 3 ranks"):  # (of 3 ranks, but not resumed from the 2's)
        resumed_twice.resume_from(SampleOrder(LENGTHS, rank=0, world_size=3))


# -- resume ---------------------------------------------------------------------------------------------


def _stream(world_size: int = 1, rank: int = 0, batch: int = 4, **kw: object) -> SampleStream:
    return SampleStream(LENGTHS, rank=rank, world_size=world_size, batch_size=batch, options=_options(**kw))


def _take(stream: SampleStream, n: int) -> list[tuple[int, int, int]]:
    """``n`` samples as (epoch, episode, frame); ``n`` must end on a batch or epoch boundary."""
    out: list[tuple[int, int, int]] = []
    while len(out) < n:
        ep, fr = stream.next_batch()
        out += [(stream.epoch, e, f) for e, f in _pairs(ep, fr)]
    assert len(out) == n
    return out


@pytest.mark.parametrize("world_size", [1, 3])
def test_resume_continues_exactly(world_size: int) -> None:
    epoch_len = _stream(world_size).num_samples()
    total = 2 * epoch_len + 8
    for rank in range(world_size):
        reference = _take(_stream(world_size, rank), total)
        for k in (0, 12, epoch_len, epoch_len + 8):  # start, mid-pool, epoch boundary, next epoch
            first = _stream(world_size, rank)
            head = _take(first, k)
            state = first.state_dict()
            resumed = _stream(world_size, rank, seed=999)  # the saved seed wins
            resumed.load_state_dict(state)
            rest = _take(resumed, total - k)
            assert head + rest == reference, (rank, k)


def test_advance_counts_samples_produced_elsewhere() -> None:
    stream = _stream()
    stream.advance(10)
    resumed = _stream()
    resumed.load_state_dict(stream.state_dict())
    reference = _stream(batch=10)
    reference.next_batch()
    np.testing.assert_array_equal(resumed.next_batch()[1], reference.next_batch()[1][:4])
    with pytest.raises(ValueError, match="call set_epoch"):
        stream.advance(stream.num_samples())


def test_set_epoch_keeps_the_resumed_position() -> None:
    stream = _stream()
    _take(stream, 8)
    resumed = _stream()
    resumed.load_state_dict(stream.state_dict())
    resumed.set_epoch(0)
    assert resumed.samples_consumed == 8
    resumed.set_epoch(1)
    assert (resumed.epoch, resumed.samples_consumed) == (1, 0)


def test_loads_counts_loads_and_the_trainers_moves_to_another_epoch() -> None:
    """``loads`` counts the moves made from outside the reads: none on a fresh stream or by its reads, one per
    load_state_dict() (which returns the count), and one per set_epoch() without ``loads`` that starts another epoch
    (the trainer's: a read begun before it belongs to the epoch it replaced, and is not counted on the new one). A
    set_epoch() of the epoch in progress moves nothing, and a pass's own (``loads`` given) is no load."""
    stream = _stream()
    assert stream.loads == 0
    _take(stream, 8)
    assert stream.loads == 0
    assert stream.load_state_dict(stream.state_dict()) == 1 and stream.loads == 1
    stream.set_epoch(0)
    assert stream.loads == 1
    stream.set_epoch(1)
    assert stream.loads == 2 and stream.moved[0] == "set_epoch()"
    assert not stream.advance(4, loads=1)  # (read under the load before: not counted on epoch 1)
    assert stream.set_epoch(2, loads=2) and stream.loads == 2
    assert (stream.epoch, stream.samples_consumed) == (2, 0)


def test_a_state_taken_mid_update_never_pairs_a_new_epoch_with_the_old_count() -> None:
    """An asynchronous checkpoint may call ``state_dict()`` from another thread while the loop rolls the epoch
    over: every state it can see is one the stream really passed through."""

    seen: list[tuple[int, int]] = []

    class Watched(SampleStream):
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if "_order" in self.__dict__ and name != "_order":  # (once built) a state taken right after each write
                state = self.state()
                if not seen or seen[-1] != (state.epoch, state.samples_consumed):  # (a write that kept the position)
                    seen.append((state.epoch, state.samples_consumed))

    stream = Watched(np.array([10, 6]), rank=0, world_size=1, batch_size=4)
    seen.clear()
    while stream.epoch == 0:
        stream.next_batch()
    stream.advance(4)
    stream.set_epoch(5)
    stream.advance(4)
    assert seen == [(0, 4), (0, 8), (0, 12), (0, 16), (1, 4), (1, 8), (5, 0), (5, 4)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("old_ws", "new_ws", "consumed"), [(2, 3, 60), (3, 2, 41), (1, 8, 250)])
@pytest.mark.parametrize("piece_frames", [None, 7])
@pytest.mark.parametrize("drops", [(0, 0), (2, 3)])
def test_resume_on_another_world_size_repeats_nothing(
    shuffle: bool, old_ws: int, new_ws: int, consumed: int, piece_frames, drops, caplog: pytest.LogCaptureFixture
) -> None:
    dropping = {"drop_n_first_frames": drops[0], "drop_n_last_frames": drops[1]}
    options = _options(shuffle=shuffle, piece_frames=piece_frames, **dropping)
    every = {(e, f) for e, n in enumerate(LENGTHS.tolist()) for f in range(drops[0], n - drops[1])}
    taken: list[tuple[int, int]] = []
    for rank in range(old_ws):
        order = SampleOrder(LENGTHS, rank=rank, world_size=old_ws, options=options)
        taken += _pairs(*order.samples(0, 0, consumed))
    state = StreamState(seed=11, epoch=0, samples_consumed=consumed, world_size=old_ws, batch_size=4)
    rest: list[tuple[int, int]] = []
    for rank in range(new_ws):
        stream = _stream(new_ws, rank, batch=1000, shuffle=shuffle, piece_frames=piece_frames, **dropping)
        with caplog.at_level(logging.WARNING, logger="lerobot_dali.stream_state"):
            stream.load_state_dict(state.to_dict())
        assert "re-sharded" in caplog.text
        natural = int(stream.order.rank_frame_counts(0)[rank])
        ep, fr = stream.next_batch()
        assert stream.epoch == 0 and ep.size == stream.num_samples()
        rest += _pairs(ep[:natural], fr[:natural])
        saved = StreamState.from_dict(stream.state_dict())
        assert saved.prior_segments[0].world_size == old_ws and saved.world_size == new_ws
        # The next epoch is a fresh run's on the new world size.
        fresh = SampleOrder(LENGTHS, rank=rank, world_size=new_ws, options=options)
        np.testing.assert_array_equal(stream.next_batch()[0], fresh.samples(1, 0, min(1000, fresh.num_samples(1)))[0])
    assert len(set(taken)) == len(taken)
    assert len(taken) + len(rest) == len(every)
    assert set(taken) | set(rest) == every


@pytest.mark.parametrize("balance", [RankBalance.PAD, RankBalance.DROP])
@pytest.mark.parametrize("new_world_size", [1, 3])
def test_world_size_change_at_epoch_end_leaves_that_epoch_finished(
    balance: RankBalance, new_world_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The old ranks finished epoch 0: it stays current with nothing left (so a loop's set_epoch(0) cannot
    replay it), silently, and the next batch is epoch 1's first. With DROP too: the frames it left out of the
    longer ranks' epoch stay out, as in a run that was not interrupted (they came back as an extra pass of epoch 0,
    or, on more ranks than they were episodes, as a warning of frames unseen)."""
    old = SampleOrder(LENGTHS, rank=0, world_size=7, options=_options(rank_balance=balance))
    assert old.rank_frame_counts(0).tolist() == [97, 98, 95, 96, 96, 95, 95]  # (DROP leaves 7 frames out)
    state = StreamState(seed=11, epoch=0, samples_consumed=old.num_samples(0), world_size=7, batch_size=4)
    stream = _stream(new_world_size, new_world_size - 1, rank_balance=balance)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.sample_order"):
        stream.load_state_dict(state.to_dict())
    assert (stream.epoch, stream.samples_consumed, stream.num_samples()) == (0, 0, 0)
    assert "ends here" not in caplog.text
    stream.set_epoch(0)
    assert stream.num_samples() == 0
    fresh = _stream(new_world_size, new_world_size - 1, rank_balance=balance)
    fresh.set_epoch(1)
    assert [a.tolist() for a in stream.next_batch()] == [a.tolist() for a in fresh.next_batch()]
    assert stream.epoch == 1


def test_world_size_change_with_fewer_leftover_episodes_than_ranks_ends_the_epoch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lengths = np.full(4, 10)
    # One rank took 38 of 40 frames: at most two episodes still have frames, too few for three ranks.
    state = StreamState(seed=0, epoch=0, samples_consumed=38, world_size=1, batch_size=2)
    stream = SampleStream(lengths, rank=2, world_size=3, batch_size=2, options=OrderOptions(seed=0))
    with caplog.at_level(logging.WARNING):
        stream.load_state_dict(state.to_dict())
    assert stream.num_samples() == 0 and "the epoch ends here (2 frame(s) unseen" in caplog.text
    stream.next_batch()
    assert (stream.epoch, stream.samples_consumed) == (1, 2)


def test_a_second_world_size_change_after_one_that_found_the_epoch_over_resumes() -> None:
    """3 ranks finish epoch 0; a resume on 1 rank finds nothing left and saves before its first batch; a resume of
    that on 2 ranks has nothing left either, rather than failing to deal the empty rest to the 1-rank segment."""
    done = SampleOrder(LENGTHS, rank=0, world_size=3, options=_options()).num_samples(0)
    state = StreamState(seed=11, epoch=0, samples_consumed=done, world_size=3, batch_size=4).to_dict()
    one = _stream(1)
    one.load_state_dict(state)
    assert one.num_samples() == 0
    for rank in range(2):
        two = _stream(2, rank)
        two.load_state_dict(one.state_dict())
        assert (two.epoch, two.num_samples()) == (0, 0)
        fresh = _stream(2, rank)
        fresh.set_epoch(1)
        assert [a.tolist() for a in two.next_batch()] == [a.tolist() for a in fresh.next_batch()]


def test_leftovers_too_few_for_one_world_size_are_read_once_by_the_next(caplog: pytest.LogCaptureFixture) -> None:
    """1 rank takes 38 of 40 frames; 3 ranks find the 2 partly-read episodes too few and save before their first
    batch; 2 ranks then read the 2 frames left, each once."""
    lengths = np.full(4, 10)
    options = OrderOptions(seed=0, shuffle=True, episode_pool_size=2)
    taken = _pairs(*SampleOrder(lengths, rank=0, world_size=1, options=options).samples(0, 0, 38))
    assert len({e for e, _ in taken if sum(t[0] == e for t in taken) < 10}) == 2  # (two episodes left part-read)
    state = StreamState(seed=0, epoch=0, samples_consumed=38, world_size=1, batch_size=2).to_dict()
    three = SampleStream(lengths, rank=0, world_size=3, batch_size=2, options=options)
    with caplog.at_level(logging.WARNING):
        three.load_state_dict(state)
    assert three.num_samples() == 0 and "the epoch ends here (2 frame(s) unseen" in caplog.text
    rest = []
    for rank in range(2):
        two = SampleStream(lengths, rank=rank, world_size=2, batch_size=2, options=options)
        two.load_state_dict(three.state_dict())
        assert two.num_samples() == 1
        rest += _pairs(*two.next_batch())
    assert sorted(taken + rest) == [(e, f) for e in range(4) for f in range(10)]


def test_state_dict_round_trip_and_validation() -> None:
    state = StreamState(seed=1, epoch=2, samples_consumed=30, world_size=4, batch_size=8)
    as_dict = state.to_dict()
    assert as_dict == {
        "version": 3,
        "seed": 1,
        "epoch": 2,
        "samples_consumed": 30,
        "world_size": 4,
        "batch_size": 8,
        "prior_segments": [],
    }
    assert StreamState.from_dict(as_dict) == state
    with pytest.raises(dataclasses.FrozenInstanceError):  # (a state handed out is not moved by whoever holds it)
        state.samples_consumed = 0  # type: ignore[misc]
    with pytest.raises(ResumeStateError, match="lacks"):
        StreamState.from_dict({k: v for k, v in as_dict.items() if k != "epoch"})
    with pytest.raises(ResumeStateError, match="version"):
        StreamState.from_dict({**as_dict, "version": 7})
    with pytest.raises(ResumeStateError, match="world_size"):
        StreamState.from_dict({**as_dict, "world_size": 0})
    with pytest.raises(ResumeStateError, match="prior_segments"):
        StreamState.from_dict({**as_dict, "prior_segments": [[2]]})
    with pytest.raises(ResumeStateError, match="is a dict, got list"):
        StreamState.from_dict(list(as_dict.items()))  # type: ignore[arg-type]
    with pytest.raises(ResumeStateError, match="rank_walks must be a list"):
        StreamState.from_dict({**as_dict, "rank_walks": {"rank": 1}})
    with pytest.raises(ResumeStateError, match="episode_lengths must be the text"):
        StreamState.from_dict({**as_dict, "episode_lengths": [3, 4]})
    stream = _stream()
    with pytest.raises(ResumeStateError, match="other order options"):
        stream.load_state_dict({**as_dict, "world_size": 1, "samples_consumed": 10**6})


def test_pool_windows_asked_in_any_order_match_fresh_orders() -> None:
    """The pool simulator continues from where its last lookups stopped (the prefetcher asks for windows a batch
    apart); asked forwards, backwards or at random, every window equals the one a fresh order computes."""
    options = _options(episode_pool_size=3)
    total = SampleOrder(LENGTHS, rank=0, world_size=1, options=options).num_samples(0)
    rng = np.random.default_rng(3)
    windows = [(s, s + 9) for s in range(0, total - 9, 7)]
    for queried in (windows, windows[::-1], [windows[i] for i in rng.permutation(len(windows))]):
        reused = SampleOrder(LENGTHS, rank=0, world_size=1, options=options)
        for start, stop in queried:
            fresh = SampleOrder(LENGTHS, rank=0, world_size=1, options=options).pool_window(0, start, stop)
            np.testing.assert_array_equal(reused.pool_window(0, start, stop), fresh)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_pool_window_holds_the_episodes_of_every_sample_it_serves_padded_ones_too(shuffle: bool) -> None:
    """Every window of a rank padded to three times its own frames (PAD: its first samples again, cyclically) holds the
    episode of each sample drawn there; unshuffled, of its own positions, exactly those episodes (the prefetcher
    fetches what a window names: an episode missing from it was read from remote storage at the batch)."""
    lengths = np.array([20, 3, 2, 1])  # (the rank without the long episode owns 6 frames and repeats them to 20)
    options = _options(shuffle=shuffle, episode_pool_size=2, rank_balance=RankBalance.PAD)
    counts = SampleOrder(lengths, rank=0, world_size=2, options=options).rank_frame_counts(0)
    order = SampleOrder(lengths, rank=int(np.argmin(counts)), world_size=2, options=options)
    total, natural = order.num_samples(0), int(counts.min())
    assert (total, natural) == (20, 6)
    windows = [(start, stop) for start in range(total + 1) for stop in range(start, total + 1)]
    for start, stop in windows:
        episodes = set(order.samples(0, start, stop)[0].tolist())
        window = order.pool_window(0, start, stop).tolist()
        assert episodes <= set(window), (start, stop)
        if not shuffle and stop <= natural:
            assert sorted(window) == sorted(episodes), (start, stop)
    assert order.pool_window(0, 7, 7).size == 0 and order.pool_window(0, 20, 25).size == 0


def test_frames_drawn_past_the_permutation_cache_are_those_of_a_fresh_order(monkeypatch) -> None:
    """Each episode's frame permutation is cached, the oldest evicted past ``_PERMUTATION_CACHE`` (4096: a dataset of
    92,000 episodes passes it every epoch). Cut to 3 for 41 episodes, batches read backwards, evicting and recomputing
    throughout, give the samples a fresh order gives in one read."""
    options = _options(episode_pool_size=5)
    expected = _pairs(*SampleOrder(LENGTHS, rank=0, world_size=1, options=options).samples(0, 0, int(LENGTHS.sum())))
    monkeypatch.setattr(sample_order_module, "_PERMUTATION_CACHE", 3)
    order = SampleOrder(LENGTHS, rank=0, world_size=1, options=options)
    starts = range(0, int(LENGTHS.sum()), 16)
    got = {start: _pairs(*order.samples(0, start, min(start + 16, int(LENGTHS.sum())))) for start in starts[::-1]}
    assert [pair for start in starts for pair in got[start]] == expected
    assert len(order._permutations) == 3  # type: ignore[attr-defined]


def test_a_state_taken_by_a_handler_on_the_thread_drawing_a_batch_is_the_streams() -> None:
    # A signal handler saving a checkpoint (SLURM's SIGUSR1 notice) runs on the main thread, which may hold the order's
    # lock (each batch counts the epoch's samples under it): a plain lock waited for ever there (1 of 1 scripted; each
    # of 213 such points in an epoch read with a worker saves a state that resumes as the epoch goes on, now).
    stream = _stream()
    _take(stream, 8)
    expected = _stream()
    expected.load_state_dict(stream.state_dict())
    taken: list[dict[str, object]] = []

    def handler_inside_a_draw() -> None:
        with stream.order._lock:  # type: ignore[attr-defined]  (where the reading thread is when the signal lands)
            taken.append(stream.state_dict())

    handler = threading.Thread(target=handler_inside_a_draw, daemon=True)  # (a daemon: left waiting for ever before)
    handler.start()
    handler.join(timeout=60)
    assert len(taken) == 1
    resumed = _stream()
    resumed.load_state_dict(taken[0])
    assert _take(resumed, 8) == _take(expected, 8)


def test_a_state_taken_by_a_handler_between_two_chunks_of_a_draw_leaves_the_stream_as_it_was(monkeypatch) -> None:
    # The order's lock is an RLock, so a signal handler's state_dict() on the thread drawing a batch runs inside the
    # draw: its walk set the pool simulator's one generator to another chunk's state, and the batch drew on from
    # there (other samples than the stream's at 363 of 1,092 lines of 5 batches of 32 where a handler can land).
    stream, expected = _stream(batch=32, episode_pool_size=3), _stream(batch=32, episode_pool_size=3)
    _take(stream, 64)
    _take(expected, 64)
    simulator = stream.order._plan(0).simulator  # type: ignore[attr-defined]
    advance = simulator._advance
    taken: list[dict[str, object]] = []
    landed: list[bool] = []

    def handler_after_a_chunk(*args: object) -> None:
        advance(*args)
        if not landed:  # (once: the handler's own walk advances too)
            landed.append(True)
            taken.append(stream.state_dict())

    monkeypatch.setattr(simulator, "_advance", handler_after_a_chunk)
    rest = _take(expected, 160)
    assert _take(stream, 160) == rest
    resumed = _stream(batch=32, episode_pool_size=3)
    resumed.load_state_dict(taken[0])
    assert taken[0]["samples_consumed"] == 64 and _take(resumed, 160) == rest


@pytest.mark.parametrize(("version", "shuffle"), [(3, False), (3, True), (2, True)])
@pytest.mark.parametrize("batches", [3, 0])
def test_unbalanced_states_saved_before_saved_rank_load_on_their_own_rank_only(version, shuffle, batches) -> None:
    """Under rank_balance='none', a state saved before saved_rank (by an earlier lerobot_dali) was taken on any rank of
    its world size: rank 0's (what a job saving one state hands every rank) put rank 1 at rank 0's count, mid-epoch or
    at an epoch's start (rank 1 then lost the rest of its epoch 0), silently (6 of 6 cases). A shuffled version 3
    state's walk names its rank, so it is taken as saved_rank is: on that rank alone. One that names no rank
    (unshuffled, or version 2 without a walk) is refused on every rank, saying how to load a rank's own state."""
    options = {"rank_balance": RankBalance.NONE, "shuffle": shuffle}
    ranks = [_stream(2, r, batch=4, **options) for r in range(2)]
    if batches:
        for stream in ranks:
            for _ in range(batches):
                stream.next_batch()
    else:
        ranks[0].set_epoch(1)
        ranks[1].next_batch()
    drop = {"saved_rank"} | ({"walk"} if version == 2 else set())
    old = [{k: v for k, v in r.state_dict().items() if k not in drop} | {"version": version} for r in ranks]
    rest = [np.stack(r.next_batch()) for r in ranks]
    names_its_rank = "walk" in old[0]
    refusal = "rank 0's state" if names_its_rank else r"names no rank.*load \{\*\*state, 'saved_rank': 1\}"
    with pytest.raises(ResumeStateError, match=refusal):
        _stream(2, 1, batch=4, **options).load_state_dict(json.loads(json.dumps(old[0])))
    for rank in range(2):
        loaded = _stream(2, rank, batch=4, **options)
        own = old[rank] if names_its_rank else {**old[rank], "saved_rank": rank}
        loaded.load_state_dict(json.loads(json.dumps(own)))
        np.testing.assert_array_equal(np.stack(loaded.next_batch()), rest[rank])


def test_a_piece_length_under_1_is_named_as_the_argument_users_give() -> None:
    """``episode_piece_frames=0`` was refused as "piece_frames must be >= 1", a name no caller passes (a review)."""
    with pytest.raises(ValueError, match=r"^episode_piece_frames must be >= 1, got 0$"):
        OrderOptions(piece_frames=0)


def test_ranks_shuffle_their_episodes_independently() -> None:
    # 16 equal episodes on 2 ranks: each rank owns 8 and walks them in an order drawn for that rank. Were every rank's
    # order drawn from one key, both would visit their (sorted) episodes in the same pattern of positions every epoch
    # (1 chance in 8! = 40,320 per epoch for independent draws).
    lengths = np.full(16, 10, dtype=np.int64)
    opts = OrderOptions(seed=0, shuffle=True, episode_pool_size=64)
    orders = [SampleOrder(lengths, rank=r, world_size=2, options=opts) for r in range(2)]
    same = []
    for epoch in range(3):
        eps = [o.rank_episodes(epoch) for o in orders]
        assert sorted(np.concatenate(eps).tolist()) == list(range(16))  # exactly once across ranks
        patterns = [np.searchsorted(np.sort(e), e).tolist() for e in eps]
        same.append(patterns[0] == patterns[1])
    assert not all(same)


def _unshuffled_stream():
    lengths = np.array([13, 40, 7, 25, 31, 5, 19])  # 140 frames, one rank: 140 samples an epoch
    return SampleStream(lengths, rank=0, world_size=1, batch_size=5, options=OrderOptions(shuffle=False))


def test_advance_stops_at_the_epochs_last_sample() -> None:
    stream = _unshuffled_stream()
    assert stream.num_samples() == 140
    assert stream.advance(139) is True
    assert stream.advance(1) is True  # the epoch's last sample
    assert stream.samples_consumed == 140
    with pytest.raises(ValueError, match="cannot advance 1 samples: 140 of 140"):
        stream.advance(1)


def test_a_state_past_the_epochs_end_is_refused() -> None:
    stream = _unshuffled_stream()
    stream.advance(140)
    state = stream.state_dict()
    assert state["samples_consumed"] == 140
    _unshuffled_stream().load_state_dict(state)  # the epoch's end itself resumes
    state["samples_consumed"] = 141
    with pytest.raises(ResumeStateError, match="141 samples of epoch 0 were consumed, but that epoch has 140"):
        _unshuffled_stream().load_state_dict(state)


@pytest.mark.parametrize("shuffle", [True, False])
def test_only_unbalanced_states_of_several_ranks_name_the_rank_that_saved_them(shuffle: bool) -> None:
    """``saved_rank`` is kept where rank_balance='none' runs on several ranks (each rank's count its own), and left
    out elsewhere: on one rank, or balanced, every rank stands at one position. One rank's state, naming no rank
    (unshuffled: no walk names it either), resumes that rank mid-epoch: it is every rank's."""
    alone = _stream(1, 0, batch=4, rank_balance=RankBalance.NONE, shuffle=shuffle)
    alone.next_batch()
    state = alone.state_dict()
    assert "saved_rank" not in state and StreamState.from_dict(state).rank is None
    assert (state["epoch"], state["samples_consumed"], state["world_size"]) == (0, 4, 1)
    resumed = _stream(1, 0, batch=4, rank_balance=RankBalance.NONE, shuffle=shuffle)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(np.stack(resumed.next_batch()), np.stack(alone.next_batch()))
    balanced = _stream(2, 1, batch=4)
    balanced.next_batch()
    assert "saved_rank" not in balanced.state_dict()
    unbalanced = _stream(2, 1, batch=4, rank_balance=RankBalance.NONE)
    unbalanced.next_batch()
    assert unbalanced.state_dict()["saved_rank"] == 1
