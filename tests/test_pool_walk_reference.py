"""The pool walk against a reference: the walk as ``sample_order`` ran it before its replay was sped up.

The order is a contract (a resume replays it; a saved state means the same samples in any later version with
the same numpy), so the fast walk must give exactly the old one's draws and pool states: here over seeds, pool
sizes, length patterns, ranks, pieces, dropped frames and resumed epochs, at random positions and in random
access patterns, and after a resume.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from lerobot_dali.sample_order import ConsumedSegment, OrderOptions, ResumedEpoch, SampleOrder
from lerobot_dali.stream_state import SampleStream

_REFERENCE_MIN_CHUNK = 64


def _reference_walk(stream, pool_size: int, rng_key: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Every draw of a rank's natural stream, one fresh pool state and generator state per chunk (the old
    ``_PoolSimulator._step``). Returns per position the episode, its draw index and its pool slot, and per
    chunk its first position and the pool ``(next_admit, slots, drawn)`` there."""
    lengths, first_draw = stream.lengths, stream.first_draw
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence(list(rng_key))))
    slots = np.arange(min(pool_size, stream.episodes.size), dtype=np.int64)
    drawn, next_admit, emitted = first_draw[slots].copy(), slots.size, 0
    episodes, draws, labels, bounds, states = [], [], [], [], []
    while slots.size:
        bounds.append(emitted)
        states.append((next_admit, slots, drawn))
        remaining = lengths[slots] - drawn
        total = int(remaining.sum())
        chunk = min(total, max(_REFERENCE_MIN_CHUNK, 2 * total // slots.size))
        picks = rng.choice(total, size=chunk, replace=False)
        label = np.searchsorted(np.cumsum(remaining), picks, side="right")
        occurrence = np.array([np.count_nonzero(label[:i] == label[i]) for i in range(label.size)], np.int64)
        finished = np.flatnonzero(occurrence + 1 == remaining[label])
        n = int(finished[0]) + 1 if finished.size else chunk
        label, occurrence = label[:n], occurrence[:n]
        episodes.append(stream.episodes[slots[label]])
        draws.append(drawn[label] + occurrence)
        labels.append(label)
        drawn = drawn + np.bincount(label, minlength=slots.size)
        if finished.size:
            keep = drawn < lengths[slots]
            slots, drawn = slots[keep], drawn[keep]
            if next_admit < stream.episodes.size:
                slots = np.append(slots, next_admit)
                drawn = np.append(drawn, first_draw[next_admit])
                next_admit += 1
        emitted += n
    return {
        "episode": np.concatenate(episodes),
        "draw": np.concatenate(draws),
        "label": np.concatenate(labels),
        "bounds": np.array(bounds, np.int64),
        "states": states,
    }


def _reference_state(ref: dict, position: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The pool ``(next_admit, slots, drawn)`` after exactly ``position`` draws, from the reference walk."""
    chunk = int(np.searchsorted(ref["bounds"], position, side="right")) - 1
    if chunk == len(ref["states"]) - 1 and position == ref["episode"].size:  # (the end: every episode out)
        next_admit = ref["states"][-1][0]
        return next_admit, np.empty(0, np.int64), np.empty(0, np.int64)
    next_admit, slots, drawn = ref["states"][chunk]
    extra = np.bincount(ref["label"][ref["bounds"][chunk] : position], minlength=slots.size)
    return next_admit, slots, drawn + extra


def _lengths(pattern: str, rng: np.random.Generator) -> np.ndarray:
    if pattern == "short":  # 1..30 frames, single-frame episodes among them
        return rng.integers(1, 31, size=120)
    if pattern == "equal":
        return np.full(90, 17)
    if pattern == "long":  # a pool of 64 over 10,000 frames: numpy's choice then shuffles a whole range
        return rng.integers(150, 441, size=150)
    if pattern == "mixed":  # mostly short, a few long, some empty
        lengths = rng.integers(1, 12, size=200)
        lengths[rng.choice(200, size=8, replace=False)] = rng.integers(300, 900, size=8)
        lengths[rng.choice(200, size=10, replace=False)] = 0
        return lengths
    raise AssertionError(pattern)


_CASES = [  # (length pattern, pool size, world size, extra options)
    ("short", 1, 1, {}),
    ("short", 4, 1, {}),
    ("short", 3, 3, {"drop_n_first_frames": 2, "drop_n_last_frames": 1}),
    ("equal", 8, 2, {}),
    ("equal", 200, 1, {}),
    ("long", 64, 1, {}),
    ("long", 16, 3, {"piece_frames": 100}),
    ("mixed", 5, 4, {}),
    ("mixed", 64, 2, {"piece_frames": 40}),
]


def _order(pattern: str, seed: int, pool: int, world_size: int, rank: int, extra: dict, **kw) -> SampleOrder:
    lengths = _lengths(pattern, np.random.default_rng(seed))
    options = OrderOptions(seed=seed, episode_pool_size=pool, checkpoint_interval=97, **extra)
    return SampleOrder(lengths, rank=rank, world_size=world_size, options=options, **kw)


def _reference_for(order: SampleOrder, epoch: int, segment: int = 0) -> tuple[object, dict]:
    plan = order._plan(epoch)
    opts = order.options
    key = (opts.seed, 2, epoch, order.world_size, segment, order.rank)  # (the pool stream's key)
    return plan, _reference_walk(plan.stream, opts.episode_pool_size, key)


@pytest.mark.parametrize(("pattern", "pool", "world_size", "extra"), _CASES)
@pytest.mark.parametrize("seed", [0, 5, 123])
def test_draws_and_pool_states_equal_the_reference_at_random_positions(
    pattern: str, pool: int, world_size: int, extra: dict, seed: int
) -> None:
    rng = np.random.default_rng(seed + 1000)
    for rank in range(world_size):
        epoch = int(rng.integers(0, 3))
        order = _order(pattern, seed, pool, world_size, rank, extra)
        plan, ref = _reference_for(order, epoch)
        natural = ref["episode"].size
        assert natural == plan.stream.natural
        # In order, as a worker asks (a batch at a time), then windows in random order on the same object.
        got = [plan.simulator.draws(a, min(natural, a + 13)) for a in range(0, natural, 13)]
        np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), ref["episode"])
        np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), ref["draw"])
        for _ in range(12):
            a = int(rng.integers(0, natural))
            b = int(rng.integers(a, min(natural, a + 300) + 1))
            episode, draw = plan.simulator.draws(a, b)
            np.testing.assert_array_equal(episode, ref["episode"][a:b])
            np.testing.assert_array_equal(draw, ref["draw"][a:b])
        # Pool states at random positions, chunk boundaries and both ends, on a fresh object and a reused one.
        positions = [0, natural, *ref["bounds"][rng.choice(ref["bounds"].size, size=3)].tolist()]
        positions += rng.integers(0, natural + 1, size=10).tolist()
        fresh = _order(pattern, seed, pool, world_size, rank, extra)._plan(epoch).simulator
        for position in positions:
            want = _reference_state(ref, int(position))
            for simulator in (fresh, plan.simulator):
                next_admit, slots, drawn = simulator.state_at(int(position))
                assert next_admit == want[0]
                np.testing.assert_array_equal(slots, want[1])
                np.testing.assert_array_equal(drawn, want[2])


@pytest.mark.parametrize(("pattern", "pool", "world_size", "extra"), [c for c in _CASES if c[2] > 1])
def test_a_resumed_epochs_residual_and_walk_equal_the_reference(
    pattern: str, pool: int, world_size: int, extra: dict
) -> None:
    """On another world size the old ranks' consumed draws (their walks' prefixes) become the new plan's
    starting draws, and the new ranks walk from there (a pool of partly drawn episodes, segment 1 keys)."""
    seed = 9
    for consumed in (1, 57, 400):
        old_ranks = [_order(pattern, seed, pool, world_size, r, extra) for r in range(world_size)]
        taken = np.zeros(old_ranks[0]._lengths.size, np.int64)  # draws per unit (episode or piece)
        for order in old_ranks:
            plan, ref = _reference_for(order, 0)
            np.add.at(taken, ref["episode"][:consumed], 1)
        resumed = ResumedEpoch(0, (ConsumedSegment(world_size, consumed),))
        for rank in range(world_size + 1):
            order = _order(pattern, seed, pool, world_size + 1, rank, extra, resumed_epoch=resumed)
            if order.num_samples(0) == 0:  # (too few units left for the new ranks: nothing to walk)
                continue
            plan, ref = _reference_for(order, 0, segment=1)
            np.testing.assert_array_equal(plan.stream.first_draw, taken[plan.stream.episodes])
            episode, draw = plan.simulator.draws(0, ref["episode"].size)
            np.testing.assert_array_equal(episode, ref["episode"])
            np.testing.assert_array_equal(draw, ref["draw"])


@pytest.mark.parametrize(("pattern", "pool", "world_size", "extra"), _CASES[:6])
def test_a_resumed_stream_continues_as_the_uninterrupted_one(
    pattern: str, pool: int, world_size: int, extra: dict
) -> None:
    """A stream resumed (fresh objects; its order pickled as a DALI worker gets it, before it walked and after)
    emits what the uninterrupted stream emits from there, and its pool state there is the reference's."""
    seed = 4
    lengths = _lengths(pattern, np.random.default_rng(seed))
    options = OrderOptions(seed=seed, episode_pool_size=pool, checkpoint_interval=97, **extra)
    rank = world_size - 1
    whole = SampleStream(lengths, rank=rank, world_size=world_size, batch_size=7, options=options)
    total = whole.num_samples()
    batches = [whole.next_batch() for _ in range(-(-total // 7))]
    rng = np.random.default_rng(seed)
    for batch in sorted(rng.integers(0, len(batches), size=4).tolist()):
        state = {**whole.state_dict(), "epoch": 0, "samples_consumed": batch * 7}
        resumed = SampleStream(lengths, rank=rank, world_size=world_size, batch_size=7, options=options)
        resumed.load_state_dict(state)
        worker = pickle.loads(pickle.dumps(resumed.order))
        for want in batches[batch : batch + 3]:
            got = resumed.next_batch()
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        want_episode = np.concatenate([b[0] for b in batches[batch : batch + 3]])
        want_frame = np.concatenate([b[1] for b in batches[batch : batch + 3]])
        start = batch * 7
        carried = pickle.loads(pickle.dumps(resumed.order))  # (with the walk states the resumed order kept)
        for copy in (worker, carried):
            got_episode, got_frame = copy.samples(0, start, start + want_episode.size)
            np.testing.assert_array_equal(got_episode, want_episode)
            np.testing.assert_array_equal(got_frame, want_frame)
        plan, ref = _reference_for(worker, 0)
        natural = ref["episode"].size
        position = min(start, natural)
        want_state = _reference_state(ref, position)
        next_admit, slots, drawn = plan.simulator.state_at(position)
        assert next_admit == want_state[0]
        np.testing.assert_array_equal(slots, want_state[1])
        np.testing.assert_array_equal(drawn, want_state[2])
