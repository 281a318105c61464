"""DALI's video decoder on the loader's clips, by frames per clip and decoder threads: the loader sends one clip per
sample and camera, and DALI sets up a decoder for every clip (a demuxer over it, its index, an NVDEC parser and
frame buffers; the NVDEC decoder itself is leased from a cache), so this tells the cost of that set-up from that of
decoding, and whether more threads make it faster. Prints one JSON object per (frames per clip, threads).

    PYTHONPATH=. python bench/nvdec_clips.py [DATASET] [--frames 1 4 16 64] [--threads 1 2 4 8 16] [--cpu]

Without DATASET it reads the bench's generated H.264 set (3 cameras 480x640, GOP 2), generated in --cache-dir first
if absent.

On an H200 the NVDEC route gave 126 frames/s of one-frame clips with 4 threads, and 3,610 frames/s on 128-frame
clips with 2 (bench/README.md). ``--cpu`` decodes on DALI's CPU decoder (VP8, VP9 and MJPEG only), which makes a
decoder per clip too: for trying the script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def cut_clips(dataset: str, *, frames: int, count: int, seed: int = 0) -> list[Any]:
    """``count`` clips of ``frames`` consecutive shown frames each, at random starts over the dataset's files."""
    from lerobot_dali import open_dataset
    from lerobot_dali.clips import build_clip
    from lerobot_dali.packet_index_cache import load_packet_index

    reader = open_dataset(dataset)
    paths = sorted({reader.video(pos, cam).path for cam in reader.camera_keys for pos in range(reader.num_episodes)})
    indexes = {path: load_packet_index(path) for path in paths}
    usable = [p for p in paths if len(indexes[p].shown) >= frames]
    if not usable:
        raise ValueError(f"no video file of {dataset} shows {frames} frames")
    rng = np.random.default_rng(seed)
    clips = []
    for _ in range(count):
        path = usable[int(rng.integers(len(usable)))]
        shown = indexes[path].shown
        start = int(rng.integers(shown.start, shown.stop - frames + 1))
        clips.append(build_clip(path, indexes[path], np.arange(start, start + frames)))
    return clips


def decode_rate(clips: Sequence[Any], *, threads: int, batch_size: int, device_id: int | None) -> dict[str, float]:
    """Clips and frames decoded a second, batch after batch (the first batch untimed: pipeline and memory set-up)."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali.dali_video import decode_clips

    batches = [clips[i : i + batch_size] for i in range(0, len(clips) - batch_size + 1, batch_size)]
    if len(batches) < 2:
        raise ValueError(f"{len(clips)} clips make fewer than 2 batches of {batch_size}")
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id, prefetch_queue_depth=1)
    with pipe:
        data = fn.external_source(name="clips", batch=True, no_copy=False)
        wanted = fn.external_source(name="frames", batch=True, no_copy=False)
        pipe.set_outputs(decode_clips(data, wanted, device="cpu" if device_id is None else "mixed"))
    pipe.build()
    decoded = 0
    start = 0.0
    for i, batch in enumerate(batches):
        if i == 1:
            start = time.perf_counter()
        pipe.feed_input("clips", [c.data for c in batch])
        pipe.feed_input("frames", [np.asarray(c.relative_indices, dtype=np.int32) for c in batch])
        (out,) = pipe.run()
        if i >= 1:
            decoded += sum(int(out[k].shape()[0]) for k in range(len(batch)))  # what came back, not what was asked
    seconds = time.perf_counter() - start
    timed = len(batches) - 1
    del pipe
    return {
        "clips_per_s": timed * batch_size / seconds,
        "frames_per_s": decoded / seconds,
        "batch_ms": seconds / timed * 1e3,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", help="local LeRobot dataset folder (default: the bench's H.264 set)")
    parser.add_argument("--cache-dir", type=Path, help="where the bench keeps its generated sets (the bench's default)")
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 4, 16, 64], help="frames per clip")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="DALI threads")
    parser.add_argument("--batch-size", type=int, default=32, help="clips per batch (default %(default)s)")
    parser.add_argument("--batches", type=int, default=6, help="timed batches (default %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="DALI's CPU decoder (VP8/VP9/MJPEG) instead of NVDEC")
    parser.add_argument("--device-id", type=int, default=0, help="GPU (default %(default)s)")
    args = parser.parse_args(argv)
    device_id = None if args.cpu else args.device_id
    if args.dataset is None:
        from lerobot_dali.bench import DEFAULT_CACHE, default_specs, ensure_generated

        spec = next(s for s in default_specs(False) if s.codec == "h264")
        args.dataset = str(ensure_generated(spec, args.cache_dir or DEFAULT_CACHE))
    for frames in args.frames:
        clips = cut_clips(args.dataset, frames=frames, count=args.batch_size * (args.batches + 1))
        clip_kb = float(np.mean([c.data.nbytes for c in clips])) / 1024
        for threads in args.threads:
            rate = decode_rate(clips, threads=threads, batch_size=args.batch_size, device_id=device_id)
            row = {"decoder": "cpu" if args.cpu else "mixed", "frames_per_clip": frames, "threads": threads}
            # (batch_ms to the microsecond: a CPU run's batches take 1-5 ms, which 0.1 ms rounded by up to 4%)
            rounded = {k: round(v, 3 if k == "batch_ms" else 1) for k, v in rate.items()}
            print(json.dumps({**row, "clip_kb": round(clip_kb, 1), **rounded}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
