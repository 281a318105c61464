"""The CPU work of one batch in a DALI worker where DALI decodes the cameras (NVDEC, or its CPU decoder for VP9):
sampling, episode rows, windows, frame lookup, and a clip cut and remuxed per sample and camera, timed by calling
the external source directly, so no decode runs and no GPU is needed. Prints one JSON object: CPU ms per batch
and us per sample, and with --profile the functions that cost most (cProfile, which slows Python-heavy code).

    PYTHONPATH=. python bench/batch_cpu.py --dataset DIR [--batch-size 256] [--window chunk] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import time
from types import SimpleNamespace
from typing import Any

#: Windows a policy trains with: one frame; two frames 0.1 s apart (cameras and state); those and 16 actions.
WINDOWS = ("frame", "pair", "chunk")


def _delta_timestamps(window: str, cameras: list[str], fps: float) -> dict[str, list[float]] | None:
    if window == "frame":
        return None
    pair = {key: [-0.1, 0.0] for key in [*cameras, "observation.state"]}
    return pair if window == "pair" else {**pair, "action": [i / fps for i in range(16)]}


def worker_spec(dataset: str, *, batch_size: int, window: str, **options: Any) -> Any:
    """The spec a DALI worker of a CPU-mode iterator over ``dataset`` gets (``options`` as the iterator takes
    them), with ``window``'s delta_timestamps; the iterator is closed."""
    from lerobot_dali import DALILeRobotIterator, open_dataset

    reader = open_dataset(dataset)
    deltas = _delta_timestamps(window, list(reader.camera_keys), reader.fps)
    it = DALILeRobotIterator(
        reader, batch_size=batch_size, delta_timestamps=deltas, device="cpu", num_workers=0, **options
    )
    iter(it)  # (builds the pipeline, and with it the workers' spec)
    spec = it._spec
    it.close()
    return spec


def top_functions(profiler: cProfile.Profile, batches: int, *, batch_size: int | None = None) -> list[str]:
    """The 25 costliest functions, cumulative (callees included): ms per batch, with ``batch_size`` us per sample,
    calls per batch."""
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: item[1][3], reverse=True)  # type: ignore[attr-defined]
    return [
        f"{cumulative / batches * 1e3:8.2f} ms "
        + ("" if batch_size is None else f"{cumulative / batches / batch_size * 1e6:7.1f} us ")
        + f"{calls / batches:7.1f} calls  {path.rsplit('/', 1)[-1]}:{line}({name})"
        for (path, line, name), (_, calls, _, cumulative, _) in rows[:25]
    ]


def clip_route_source(dataset: str, *, batch_size: int, window: str, frame_index: bool) -> Any:
    """A :class:`~lerobot_dali.batch_source.BatchSource` whose cameras all send clips: each camera's route as a GPU
    machine would pick it (NVDEC for what DALI's CPU decoder does not take) whatever this machine has."""
    from lerobot_dali.batch_source import BatchSource, CameraFormat
    from lerobot_dali.dali_graph import CameraFeed
    from lerobot_dali.decode_route import DecodeRoute
    from lerobot_dali.packet_index_cache import PacketIndexCache

    lookup = {"timestamp_source": "frame_index"} if frame_index else {}
    spec = worker_spec(dataset, batch_size=batch_size, window=window, **lookup)
    feeds, formats = {}, {}
    for camera, feed in spec.camera_feeds.items():
        if feed.route is DecodeRoute.CPU_FALLBACK:  # (decoded in the workers here: NVDEC's on a GPU machine)
            feed = CameraFeed(DecodeRoute.NVDEC)
            video = spec.reader.video(0, camera)
            index = PacketIndexCache().of_video(spec.reader, video, store=None)
            formats[camera] = CameraFormat.of(index, route=DecodeRoute.NVDEC)
        feeds[camera] = feed
    formats = {**spec.camera_formats, **formats}
    return BatchSource(dataclasses.replace(spec, camera_feeds=feeds, camera_formats=formats))


def measure(source: Any, *, batches: int, warmup: int, profile: bool) -> dict[str, Any]:
    """CPU seconds (this process's) per batch after ``warmup`` batches, which fill the rows and index caches."""
    for i in range(warmup):
        source(SimpleNamespace(epoch_idx=0, iteration=i))
    profiler = cProfile.Profile() if profile else None
    start = time.process_time()
    if profiler is not None:
        profiler.enable()
    for i in range(warmup, warmup + batches):
        source(SimpleNamespace(epoch_idx=0, iteration=i))
    if profiler is not None:
        profiler.disable()
    per_batch_s = (time.process_time() - start) / batches
    batch_size = source.spec.batch_size
    result: dict[str, Any] = {
        "batch_ms": round(per_batch_s * 1e3, 2),
        "sample_us": round(per_batch_s / batch_size * 1e6, 1),
        "clips_per_batch": batch_size * len(source.spec.camera_feeds),
    }
    if profiler is not None:
        result["top_cumulative"] = top_functions(profiler, batches, batch_size=batch_size)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--dataset", required=True, help="a LeRobot dataset folder (lerobot_dali.generate makes some)")
    parser.add_argument("--batch-size", type=int, default=256, help="(default %(default)s)")
    parser.add_argument(
        "--window",
        choices=WINDOWS,
        default="pair",
        help="frame, pair (-0.1 s, 0) or pair + 16 actions (default %(default)s)",
    )
    parser.add_argument("--batches", type=int, default=10, help="batches timed, after --warmup (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="(default %(default)s)")
    parser.add_argument("--frame-index", action="store_true", help="look frames up by frame_index / fps (cr5_*)")
    parser.add_argument("--profile", action="store_true", help="also the 25 costliest functions, cumulative")
    args = parser.parse_args()
    source = clip_route_source(
        args.dataset, batch_size=args.batch_size, window=args.window, frame_index=args.frame_index
    )
    result = {"dataset": args.dataset, "batch_size": args.batch_size, "window": args.window}
    result |= measure(source, batches=args.batches, warmup=args.warmup, profile=args.profile)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
