"""Elastic training: one epoch read by a run of world sizes, each resuming the state the one before saved.

A job on preemptible nodes may come back on another number of ranks more than once inside one epoch. Every
rank of every world size reads its share; across all of them, no frame may come twice and none may be missed,
except by ``rank_balance="drop"`` or where a world size found fewer part-read episodes than ranks (logged as
frames unseen). Each case draws episode lengths, order options, a batch size and 2-4 world sizes, each taking a
random number of batches (the last one the rest of the epoch).

``LEROBOT_DALI_ELASTIC=N`` draws N cases (default 300, a few seconds) from seed ``LEROBOT_DALI_ELASTIC_FROM=K``
on (default 0). A case whose first world size the order refuses (more ranks than episodes) is skipped. The first
sweep found a second change after one whose ranks found the epoch over failing with ShardingError.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import pytest

from lerobot_dali.errors import ShardingError
from lerobot_dali.sample_order import OrderOptions, RankBalance
from lerobot_dali.stream_state import SampleStream

CASES = int(os.environ.get("LEROBOT_DALI_ELASTIC", "300"))
FIRST = int(os.environ.get("LEROBOT_DALI_ELASTIC_FROM", "0"))


def _case(seed: int) -> tuple[np.ndarray, OrderOptions, int, list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, int(rng.integers(2, 25)))
    first, last = (int(rng.integers(0, 3)), int(rng.integers(0, 3))) if rng.random() < 0.4 else (0, 0)
    options = OrderOptions(
        seed=int(rng.integers(1000)),
        shuffle=bool(rng.random() < 0.7),
        episode_pool_size=int(rng.integers(1, 6)),
        rank_balance=RankBalance.PAD if rng.random() < 0.6 else RankBalance.DROP,
        piece_frames=int(rng.integers(2, 12)) if rng.random() < 0.4 else None,
        drop_n_first_frames=first,
        drop_n_last_frames=last,
    )
    world_sizes = rng.integers(1, 6, int(rng.integers(2, 5))).tolist()
    return lengths, options, int(rng.integers(1, 9)), world_sizes


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES))
def test_an_epoch_over_several_world_sizes_reads_each_frame_at_most_once(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    lengths, options, batch, world_sizes = _case(seed)
    rng = np.random.default_rng([seed, 1])
    first, last = options.drop_n_first_frames, options.drop_n_last_frames
    every = {(e, f) for e, n in enumerate(lengths.tolist()) for f in range(first, n - last)}
    read: list[tuple[int, int]] = []
    state = None
    caplog.set_level(logging.WARNING, logger="lerobot_dali")
    for step, world_size in enumerate(world_sizes):
        streams = [
            SampleStream(lengths, rank=rank, world_size=world_size, batch_size=batch, options=options)
            for rank in range(world_size)
        ]
        if state is not None:
            for stream in streams:
                stream.load_state_dict(state)
        try:
            total = streams[0].num_samples()
        except ShardingError:
            if step == 0:
                pytest.skip("more ranks than the episodes can be dealt to (refused with a clear error)")
            raise
        assert streams[0].epoch == 0
        start = streams[0].samples_consumed
        take = total - start if step == len(world_sizes) - 1 else int(rng.integers(0, total - start + 1))
        for rank, stream in enumerate(streams):
            natural = int(stream.order.rank_frame_counts(0)[rank])  # (PAD repeats come after a rank's own)
            assert stream.num_samples() == total
            while stream.samples_consumed < start + take:
                at = stream.samples_consumed
                episodes, frames = stream.next_batch()
                pairs = zip(episodes.tolist(), frames.tolist(), strict=True)
                read += [pair for i, pair in enumerate(pairs) if at + i < natural]
            assert stream.epoch == 0
        states = [stream.state_dict() for stream in streams]
        assert all(s == states[0] for s in states), "the ranks saved different states"
        state = states[0]
    assert len(read) == len(set(read)), "a frame was read twice in the epoch"
    assert set(read) <= every
    missed = len(every - set(read))
    unseen = sum(int(n) for n in re.findall(r"the epoch ends here \((\d+) frame\(s\) unseen", caplog.text))
    if options.rank_balance is RankBalance.PAD:
        assert missed <= unseen, f"{missed} frames never read, {unseen} logged as unseen"
