"""Scale of the sample order: 1,000,000 episodes x ~500 frames, one rank of 64, index-only (no data).

Measures, in one fresh process: building the epoch plan, the first 10,000 positions in batches of 256,
a DALI-like worker (every 4th batch), far-ahead random access (a replay), and peak RSS.

    PYTHONPATH=. python bench/order_scale.py [--episodes 1000000] [--world-size 64] [--rank 7]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from lerobot_dali.sample_order import OrderOptions, SampleOrder


def _peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--rank", type=int, default=7)
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--positions", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    rss_start = _peak_rss_mb()
    lengths = np.random.default_rng(0).integers(400, 601, size=args.episodes)  # ~500 frames each
    options = OrderOptions(seed=1, episode_pool_size=args.pool)
    result: dict[str, float | int] = {"episodes": args.episodes, "total_frames": int(lengths.sum())}

    t0 = time.perf_counter()
    order = SampleOrder(lengths, rank=args.rank, world_size=args.world_size, options=options)
    result["samples_per_rank"] = order.num_samples(0)
    t1 = time.perf_counter()
    for start in range(0, args.positions, args.batch):
        order.samples(0, start, min(args.positions, start + args.batch))
    t2 = time.perf_counter()
    counts = order.rank_frame_counts(0)
    result.update(
        plan_s=round(t1 - t0, 3),
        first_positions_s=round(t2 - t1, 3),
        plan_plus_first_positions_s=round(t2 - t0, 3),
        rank_frames_spread=int(counts.max() - counts.min()),
    )

    worker = SampleOrder(lengths, rank=args.rank, world_size=args.world_size, options=options)
    worker.num_samples(0)
    t3 = time.perf_counter()
    n_batches = 400
    for i in range(0, n_batches, 4):  # worker 0 of 4: batches 0, 4, 8, ...
        worker.samples(0, i * args.batch, (i + 1) * args.batch)
    t4 = time.perf_counter()
    result["worker_us_per_stream_sample"] = round((t4 - t3) / (n_batches * args.batch) * 1e6, 3)

    far = order.num_samples(0) // 2
    t5 = time.perf_counter()
    order.samples(0, far, far + args.batch)
    t6 = time.perf_counter()
    result.update(far_position=far, far_random_access_s=round(t6 - t5, 3))
    result.update(rss_at_start_mb=round(rss_start, 1), peak_rss_mb=round(_peak_rss_mb(), 1))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
