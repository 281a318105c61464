"""A stream state carries its rank's pool walk: a resume starts the pool there instead of replaying the epoch."""

from __future__ import annotations

import json
import logging
import pickle
import sys
import threading
import time

import numpy as np
import pytest

from lerobot_dali.errors import ResumeStateError
from lerobot_dali.sample_order import (
    ConsumedSegment,
    OrderOptions,
    RankBalance,
    ResumedEpoch,
    SampleOrder,
    _PoolSimulator,
)
from lerobot_dali.saved_walk import WalkMismatchError
from lerobot_dali.stream_state import SampleStream, merge_rank_states

# 300 episodes of 5..59 frames: an epoch of ~10,000 samples, ~670 pool chunks on one rank.
LENGTHS = np.random.default_rng(0).integers(5, 60, size=300)
OPTIONS = OrderOptions(seed=5, episode_pool_size=8, checkpoint_interval=10**6)  # (no checkpoint to shorten a replay)


@pytest.fixture
def chunk_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where each pool chunk drawn from now on started (the draws behind it): a replay starts at 0."""
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    return starts


def _stream(rank: int = 0, world_size: int = 1, options: OrderOptions = OPTIONS, lengths=LENGTHS) -> SampleStream:
    return SampleStream(lengths, rank=rank, world_size=world_size, batch_size=7, options=options)


def _saved(position: int, **kw) -> dict:
    """A state saved at ``position`` (as a checkpoint file holds it: through JSON)."""
    stream = _stream(**kw)
    stream.advance(position)
    return json.loads(json.dumps(stream.state_dict()))


def _rest(stream: SampleStream) -> list[tuple[int, int]]:
    episodes, frames = stream.order.samples(stream.epoch, stream.samples_consumed, stream.num_samples())
    return list(zip(episodes.tolist(), frames.tolist(), strict=True))


@pytest.mark.parametrize("fraction", [0.5, 0.97])
def test_a_late_resume_walks_one_chunk_not_the_epoch(chunk_starts: list[int], fraction: float) -> None:
    """Before, load_state_dict then the first batch replayed every chunk from the epoch's start (650 at 97% here; 165k,
    2.8 s of CPU, 13.7M samples into an epoch)."""
    total = _stream().num_samples()
    position = int(total * fraction)
    state = _saved(position)
    chunk_starts.clear()
    resumed = _stream()
    resumed.load_state_dict(state)
    resumed.order.prepare(0, position)  # (what the iterator does before it pickles the order to its workers)
    resumed.next_batch()
    walked = sorted(set(chunk_starts))  # (prepare draws the chunk that holds the position, and the batch again)
    assert walked[0] == state["walk"]["emitted"] > position - 200  # (the chunk that holds the position)
    assert len([start for start in walked if start <= position]) == 1


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize(
    "options",
    [
        OPTIONS,
        OrderOptions(seed=2, episode_pool_size=1),
        OrderOptions(seed=3, episode_pool_size=64, rank_balance=RankBalance.PAD),
        OrderOptions(seed=4, episode_pool_size=5, rank_balance=RankBalance.DROP, piece_frames=9),
        OrderOptions(seed=6, episode_pool_size=3, drop_n_first_frames=2, drop_n_last_frames=1),
        OrderOptions(seed=7, shuffle=False),
    ],
    ids=["pool8", "pool1", "pool64", "drop-pieces", "drop-frames", "unshuffled"],
)
def test_a_resume_from_the_saved_walk_continues_the_uninterrupted_stream(options, world_size: int) -> None:
    for rank in range(world_size):
        whole = _rest(_stream(rank, world_size, options))
        total = len(whole)
        for position in (0, 1, total // 3, total - 1, total):
            state = _saved(position, rank=rank, world_size=world_size, options=options)
            assert ("walk" in state) is options.shuffle
            resumed = _stream(rank, world_size, options)
            resumed.load_state_dict(state)
            assert _rest(resumed) == whole[position:], (rank, position)


def test_a_padded_rank_resumes_in_its_repeats() -> None:
    """Past its own frames a PAD rank repeats its first ones: the walk saved there is the repeats' position."""
    counts = _stream(0, 7).order.rank_frame_counts(0)
    rank = int(np.argmin(counts))
    whole = _rest(_stream(rank, 7))
    assert len(whole) > counts[rank]
    position = len(whole) - 1
    state = _saved(position, rank=rank, world_size=7)
    assert state["walk"]["emitted"] <= position - counts[rank]
    resumed = _stream(rank, 7)
    resumed.load_state_dict(state)
    assert _rest(resumed) == whole[position:]


def test_the_state_is_plain_ints_and_lists_no_larger_than_the_pool() -> None:
    state = _saved(5000)
    walk = state["walk"]
    assert walk["epoch"] == 0 and walk["samples_consumed"] == 5000 and walk["rank"] == 0
    assert len(walk["slots"]) == len(walk["drawn"]) == OPTIONS.episode_pool_size
    fresh = _stream()
    fresh.advance(5000)
    made = fresh.state_dict()
    assert json.loads(json.dumps(made)) == made == state  # (plain: no tuple, no numpy type survives JSON unchanged)
    assert pickle.loads(pickle.dumps(made)) == made
    assert state["version"] == 3


def test_a_state_saved_without_a_walk_still_resumes_by_replaying(chunk_starts: list[int]) -> None:
    """Version 2 states (and any without ``walk``) load as before: the pool is replayed to the position."""
    whole = _rest(_stream())
    state = {k: v for k, v in _saved(4000).items() if k != "walk"} | {"version": 2}
    chunk_starts.clear()
    resumed = _stream()
    resumed.load_state_dict(state)
    assert _rest(resumed) == whole[4000:]
    assert chunk_starts[0] == 0


def test_another_ranks_walk_is_ignored_and_the_pool_replayed(chunk_starts: list[int], caplog) -> None:
    """A resume may hand every rank rank 0's state (restore_checkpoint, where a rank has no file of its own)."""
    whole = _rest(_stream(1, 3))
    state = _saved(2000, rank=0, world_size=3)
    chunk_starts.clear()
    resumed = _stream(1, 3)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali"):
        resumed.load_state_dict(state)
        assert _rest(resumed) == whole[2000:]
    assert chunk_starts[0] == 0
    assert "the stream state's pool walk is rank 0's at sample 2000 of epoch 0, not rank 1's" in caplog.text


def test_every_ranks_walk_gathered_starts_each_rank_at_its_own(chunk_starts: list[int]) -> None:
    """A merge_rank_states() of both ranks' states, loaded on the same 2 ranks, starts rank 1 at rank 1's walk (the
    state's ``walk`` is rank 0's): no replay from the epoch's start."""
    states = [_saved(2000, rank=rank, world_size=2) for rank in range(2)]
    merged = merge_rank_states(states)
    whole = _rest(_stream(1, 2))
    chunk_starts.clear()
    resumed = _stream(1, 2)
    resumed.load_state_dict(merged)
    assert _rest(resumed) == whole[2000:]
    assert min(chunk_starts) == states[1]["walk"]["emitted"] > 2000 - 200


def test_a_state_edited_to_another_position_replays_to_it(chunk_starts: list[int]) -> None:
    """(A mixture moves a dataset so: its state with another position.) The walk serves its own position only."""
    whole = _rest(_stream())
    state = _saved(1000) | {"samples_consumed": 6000}
    chunk_starts.clear()
    resumed = _stream()
    resumed.load_state_dict(state)
    assert _rest(resumed) == whole[6000:]
    assert chunk_starts[0] == 0


def test_a_resume_on_another_world_size_starts_the_saving_ranks_replay_at_its_walk(chunk_starts: list[int]) -> None:
    """The residual of the epoch needs every old rank's pool at the position: the saving rank's starts at the walk
    its state carries (one chunk), the others' are replayed; the rest of the epoch is what a replay of all gives.
    Before, the walk was left out and that rank's pool replayed too (all of the replay from 1 rank, an eighth from
    8)."""
    state = _saved(6000)
    replayed = _stream(1, 2)
    replayed.load_state_dict({k: v for k, v in state.items() if k != "walk"})
    whole = _rest(replayed)
    chunk_starts.clear()
    resumed = _stream(1, 2)
    resumed.load_state_dict(state)
    resumed.num_samples()  # (the plan over the residual)
    assert min(chunk_starts) == state["walk"]["emitted"] > 6000 - 200  # (one chunk of the old rank's, then the new)
    assert _rest(resumed) == whole


def test_only_walks_saved_at_the_old_ranks_position_start_their_replay() -> None:
    """resume_from passed a walk of the old rank saved at another sample than its segment's (a later state's) leaves it
    out and replays that rank: started there, the pool would serve position 3000 with later draws."""
    old = _stream()
    old.advance(6000)
    later = old.order.walk_state(0, 6000)
    assert later is not None and later.emitted > 3000
    resumed = ResumedEpoch(0, (ConsumedSegment(1, 3000),))
    replayed, given = (SampleOrder(LENGTHS, rank=1, world_size=2, options=OPTIONS, resumed_epoch=resumed) for _ in "ab")
    replayed.resume_from(old.order)
    given.resume_from(old.order, [later])
    assert given.consumed_segments(0)[0].pools == replayed.consumed_segments(0)[0].pools
    np.testing.assert_array_equal(given.samples(0, 0, 500), replayed.samples(0, 0, 500))


def test_walks_asked_twice_in_one_chunk_name_each_their_own_position() -> None:
    """The second is the first's walk (kept: one chunk boundary serves both), saved at its own position."""
    order = _stream().order
    first, second = order.walk_state(0, 100), order.walk_state(0, 101)
    assert first is not None and second is not None and second.emitted == first.emitted <= 100
    assert (first.samples_consumed, second.samples_consumed) == (100, 101)


def test_a_walk_that_does_not_fit_the_old_ranks_plan_is_refused_on_another_world_size() -> None:
    state = _saved(3000)
    state["walk"]["emitted"] += 1
    resumed = _stream(0, 2)
    with pytest.raises(WalkMismatchError, match="draws behind it"):
        resumed.load_state_dict(state)
    assert (resumed.order.world_size, resumed.samples_consumed) == (2, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s | {"seed": 6}, "generator key is not this plan's"),
        (lambda s: s | {"walk": s["walk"] | {"emitted": s["walk"]["emitted"] + 1}}, "draws behind it"),
        (lambda s: s | {"walk": s["walk"] | {"next_admit": 10**6}}, "is not of this rank's"),
        # (one past the stream's 300 episodes; a pooled episode not yet admitted: the bounds, not only the draws' sum)
        (lambda s: s | {"walk": s["walk"] | {"next_admit": len(LENGTHS) + 1}}, "is not of this rank's"),
        (
            lambda s: s | {"walk": s["walk"] | {"slots": [*s["walk"]["slots"][:-1], s["walk"]["next_admit"]]}},
            "is not of this rank's",
        ),
        (
            lambda s: s | {"walk": s["walk"] | {"slots": s["walk"]["slots"][:-1], "drawn": s["walk"]["drawn"][:-1]}},
            "its pool holds 7 episodes, not episode_pool_size=8",
        ),  # (mid-epoch: the pool is full)
        (lambda s: s | {"walk": s["walk"] | {"drawn": [10**4] * 8}}, "do not fit those episodes' lengths"),
        (lambda s: s | {"walk": s["walk"] | {"slots": s["walk"]["slots"][::-1]}}, "not in admission order"),
        (
            lambda s: s | {"walk": s["walk"] | {"slots": [s["walk"]["slots"][0], *s["walk"]["slots"][:-1]]}},
            "not in admission order",
        ),  # (an episode pooled twice)
        (lambda s: s | {"walk": s["walk"] | {"slots": [-1, *s["walk"]["slots"][1:]]}}, "is not of this rank's"),
        # (a later position's walk, relabelled: started there, the pool served position 3000 with later draws)
        (lambda s: s | {"walk": _saved(6000)["walk"] | {"samples_consumed": 3000}}, "past the position it serves"),
    ],
    ids=[
        "seed",
        "emitted",
        "admitted",
        "admitted+1",
        "unadmitted",
        "fewer",
        "drawn",
        "slots",
        "twice",
        "negative",
        "later",
    ],
)
def test_a_walk_that_does_not_fit_the_plan_is_refused(change, message) -> None:
    state = change(_saved(3000))
    resumed = _stream()
    with pytest.raises(WalkMismatchError, match=message) as raised:
        resumed.load_state_dict(state)
    assert isinstance(raised.value, ResumeStateError) and "leave its 'walk' out" in str(raised.value)
    assert resumed.samples_consumed == 0  # (refused: the stream stays where it stood)


def test_a_walk_pooling_an_episode_drawn_to_its_end_is_refused() -> None:
    """An episode leaves the pool with its last draw: a walk holding one that has given all its 20 frames is not one."""
    lengths = np.full(300, 20)
    state = _saved(3000, lengths=lengths)
    state["walk"]["drawn"][0] = 20
    with pytest.raises(WalkMismatchError, match="draws per pooled episode do not fit those episodes' lengths"):
        _stream(lengths=lengths).load_state_dict(state)


def test_a_walk_over_another_dataset_or_pool_size_is_refused() -> None:
    """What the state's ``order`` and ``episode_lengths`` do not catch (a state saved before them) the walk does."""
    state = {k: v for k, v in _saved(3000).items() if k not in ("order", "episode_lengths")}
    other_lengths = LENGTHS.copy()
    other_lengths[::2] += 3
    with pytest.raises(WalkMismatchError, match="draws"):
        _stream(lengths=other_lengths).load_state_dict(state)
    with pytest.raises(WalkMismatchError, match="episode_pool_size=4"):
        _stream(options=OrderOptions(seed=5, episode_pool_size=4)).load_state_dict(state)
    with pytest.raises(WalkMismatchError, match="no shuffled pool"):
        _stream(options=OrderOptions(seed=5, shuffle=False)).load_state_dict(state)


@pytest.mark.parametrize(
    "walk",
    [
        [1, 2],
        {"epoch": 0},
        lambda w: w | {"slots": "abc"},
        lambda w: w | {"rng": {"key": [1]}},
        lambda w: w | {"drawn": [2**63, *w["drawn"][1:]]},  # (an OverflowError, not a ResumeStateError)
        lambda w: w | {"epoch": -1},
        lambda w: w | {"drawn": w["drawn"][1:]},
        lambda w: w | {"rng": w["rng"] | {"counter": [0, 0]}},
        lambda w: w | {"rng": w["rng"] | {"counter": [-1, 0, 0, 0]}},  # (an OverflowError later, not told to leave it)
    ],
    ids=["list", "fields", "slots", "rng", "past-int64", "negative-epoch", "fewer-drawn", "rng-words", "negative-word"],
)
def test_a_malformed_walk_is_refused_naming_it(walk) -> None:
    state = _saved(100)
    state["walk"] = walk(state["walk"]) if callable(walk) else walk
    with pytest.raises(ResumeStateError, match="stream state walk"):
        _stream().load_state_dict(state)


@pytest.mark.parametrize(("name", "value"), [("uinteger", 2**80), ("buffer_pos", 2**40), ("has_uint32", 2**64)])
def test_a_walk_whose_rng_ints_pass_their_c_types_is_refused(name: str, value: int) -> None:
    """The Philox state's ints are C ints (``uinteger`` a uint32): one past its type raised numpy's OverflowError out
    of the resume, not a ResumeStateError."""
    state = _saved(100)
    state["walk"]["rng"][name] = value
    with pytest.raises(WalkMismatchError, match="broken Philox state.*leave its 'walk' out"):
        _stream().load_state_dict(state)


def test_a_state_taken_from_another_thread_leaves_the_batches_alone() -> None:
    """An asynchronous checkpoint takes the state (walking the pool to its position) while the trainer's thread
    draws batches from the same order (``num_workers=0``): the two walks share the order's generator, so they take
    turns."""
    whole = _rest(_stream())
    stream = _stream()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch as often as they can)
    stop = threading.Event()
    states: list[dict] = []

    def checkpoints() -> None:
        while not stop.is_set():
            states.append(stream.state_dict())

    thread = threading.Thread(target=checkpoints)
    thread.start()
    try:
        got: list[tuple[int, int]] = []
        batches = 0
        while stream.samples_consumed < stream.num_samples():
            got += list(zip(*(part.tolist() for part in stream.next_batch()), strict=True))
            batches += 1
            if batches % 100 == 0:  # (lets a state be taken now and then: on an idle machine the draws ran through
                # 1,432 batches while 10 states were taken, too few to show anything)
                wanted, deadline = len(states) + 1, time.monotonic() + 30
                while len(states) < wanted and time.monotonic() < deadline:
                    time.sleep(0.001)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert got == whole
    assert len(states) > 10
    for state in states[:: max(1, len(states) // 20)]:  # (each walk it saved resumes the stream exactly)
        resumed = _stream()
        resumed.load_state_dict(state)
        assert _rest(resumed) == whole[state["samples_consumed"] :]


def test_an_order_that_follows_another_copys_batches_saves_the_same_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The iterator's order follows the batches its workers draw (:meth:`SampleOrder.follow`), through a PAD rank's
    repeats into the next epoch: a state taken anywhere is the one a stream that only counted the samples saves."""
    from lerobot_dali import sample_order

    monkeypatch.setattr(sample_order, "_FOLLOW_SAMPLES", 50)
    counts = _stream(0, 7).order.rank_frame_counts(0)
    rank = int(np.argmin(counts))
    followed = _stream(rank, 7)
    total = followed.num_samples()
    assert total > counts[rank]  # (it repeats its first samples at the end)
    rng = np.random.default_rng(3)
    while followed.epoch == 0 or followed.samples_consumed < 300:
        if followed.samples_consumed == total:
            followed.set_epoch(1)
        followed.advance(min(7, followed.num_samples() - followed.samples_consumed))
        followed.order.follow(followed.epoch, followed.samples_consumed)
        if rng.random() < 0.05:
            counted = _stream(rank, 7)
            counted.set_epoch(followed.epoch)
            counted.advance(followed.samples_consumed)
            assert followed.state_dict() == counted.state_dict()
