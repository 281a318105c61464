"""The machine's decode ceilings on a dataset's own videos: what no loader of these files can beat.

A loader that decodes random windows can at best decode as fast as a plain sequential decode of the same
files using every resource the machine has. Two ceilings are measured:

* ``cpu_pyav``: PyAV decodes keyframe-aligned runs of consecutive frames (to RGB, as loaders deliver
  them) in a process pool with one process per usable CPU core and one decoder thread per process;
* ``cpu_pyav_planes``: the same, leaving frames as YUV planes (:mod:`lerobot_dali.yuv_frames`): what the CPU
  fallback's workers do when the pipeline runs on a GPU, which converts colour itself; measured with the
  GPU ceiling (or ``--planes``);
* ``gpu_dali``: DALI's ``fn.decoders.video(device="mixed")`` (NVDEC) decodes the same runs, cut into
  clips, in batches; measured only when a CUDA GPU is present, and reported as unsupported when NVDEC
  lacks the codec (AV1 on A100/H100/H200).

Apart from them, ``clip_cutting`` (with the GPU ceiling, or ``--clips``): every core cuts one-frame clips
of the same frames in random order, as the NVDEC route's workers do. It is no decode rate, so it is not a
ceiling for every loader; it bounds the NVDEC route from the CPU side (compare it with ``gpu_dali``).

``lerobot-dali bench --limits`` runs this on each benchmarked dataset and divides every loader's frames/s
by the best ceiling (``fraction_of_decode_ceiling``). Alone::

    python bench/limits.py DATASET [--max-frames 3000] [--run-frames 128] [--no-gpu] [--planes] [--clips]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import av
import numpy as np

from .clips import build_clip
from .dataset_reader import open_dataset
from .distributed import usable_cpus
from .packet_index_cache import load_packet_index
from .yuv_frames import frame_planes, reformat_array

__all__ = [
    "Ceiling",
    "DecodeRun",
    "clip_cutting_rate",
    "cpu_decode_ceiling",
    "decode_runs",
    "gpu_decode_ceiling",
    "measure_ceilings",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeRun:
    """Display frames ``[start, stop)`` of one local video file; ``start_s``/``stop_s`` are their times."""

    path: str
    start: int
    stop: int
    start_s: float
    stop_s: float


@dataclass(frozen=True)
class Ceiling:
    """One ceiling: frames decoded, wall seconds, and how; ``error`` says why it could not be measured."""

    name: str
    frames: int
    seconds: float
    frames_per_s: float | None
    workers: int
    detail: str = ""
    error: str | None = None


def decode_runs(
    dataset: str | os.PathLike[str], *, max_frames: int, run_frames: int, cameras: Sequence[str] | None = None
) -> list[DecodeRun]:
    """Runs of consecutive frames covering the dataset's video files, up to ``max_frames``: each starts at a
    keyframe and holds whole GOPs, at least ``run_frames`` frames (all of a shorter file), so a run decodes
    exactly the frames it counts (runs cut inside a long GOP decoded its head again: gr00t's 250-frame GOPs
    decoded 1.58 frames per frame counted).

    Files are taken camera by camera, run after run, round-robin over files so a capped total still
    touches every camera. Remote datasets are not supported (a ceiling is about decode, not download).
    """
    reader = open_dataset(dataset, cameras=cameras)
    if not reader.location.is_local:
        raise ValueError(f"decode ceilings need a local dataset; {reader.location.description} is remote")
    files: list[str] = []
    for camera in reader.camera_keys:
        for pos in range(reader.num_episodes):
            path = reader.video(pos, camera).path
            if path not in files:
                files.append(path)
    per_file: list[list[DecodeRun]] = []
    for path in files:
        index = load_packet_index(path)
        times, shown = index.frame_pts_s, index.shown  # (not the frames an edit list hides: no decoder shows them)
        starts = [shown.start]
        for key in np.sort(index.display_rank[index.keyframe_positions]).tolist():
            if key - starts[-1] >= run_frames and key < shown.stop:
                starts.append(int(key))
        runs = []
        for start, stop in zip(starts, [*starts[1:], shown.stop], strict=True):
            end_s = float(times[stop]) if stop < shown.stop else float(times[shown.stop - 1]) + 1e-3
            runs.append(DecodeRun(path, start, stop, float(times[start]), end_s))
        per_file.append(runs)
    chosen: list[DecodeRun] = []
    total = 0
    for layer in range(max((len(r) for r in per_file), default=0)):
        for runs in per_file:
            if layer < len(runs) and total < max_frames:
                chosen.append(runs[layer])
                total += runs[layer].stop - runs[layer].start
    return chosen


def _decode_run_pyav(run: DecodeRun, *, planes: bool = False) -> int:
    """Decode one run to RGB (or planes) with one thread; returns the frames of the run delivered."""
    delivered = 0
    with av.open(run.path) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        time_base = stream.time_base
        container.seek(int(run.start_s / time_base), stream=stream, backward=True)
        with contextlib.closing(container.decode(stream)) as frames:  # (PyAV's generators leak when dropped unfinished)
            for frame in frames:
                t = float(frame.pts * time_base)
                if t >= run.stop_s - 1e-6:
                    break
                if t >= run.start_s - 1e-6:
                    # (not ``to_ndarray(format=...)``: PyAV 18.1.1 runs that on a swscale pool of the cores + 1)
                    frame_planes(frame) if planes else reformat_array(frame, format="rgb24")
                    delivered += 1
    return delivered


def _noop(_: int) -> int:
    return 0


def cpu_decode_ceiling(runs: Sequence[DecodeRun], *, workers: int | None = None, planes: bool = False) -> Ceiling:
    """PyAV on every core: a process pool (started before the clock) decodes all ``runs`` to RGB, or to
    YUV planes with ``planes``."""
    workers = workers or usable_cpus()
    context = multiprocessing.get_context("spawn")  # the parent may run threads (torch, DALI, prefetcher)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        list(pool.map(_noop, range(workers * 2)))
        start = time.perf_counter()
        frames = sum(pool.map(functools.partial(_decode_run_pyav, planes=planes), runs, chunksize=1))
        seconds = time.perf_counter() - start
    return Ceiling(
        name="cpu_pyav_planes" if planes else "cpu_pyav",
        frames=frames,
        seconds=seconds,
        frames_per_s=frames / seconds if seconds > 0 else None,
        workers=workers,
        detail=f"PyAV {av.__version__}, {workers} processes x 1 thread, decode to "
        + ("YUV planes (colour converted on the GPU)" if planes else "RGB"),
    )


def _cut_clips(task: tuple[str, list[int]]) -> int:
    path, frames = task
    index = load_packet_index(path)
    for frame in frames:
        build_clip(path, index, [frame])
    return len(frames)


def clip_cutting_rate(runs: Sequence[DecodeRun], *, workers: int | None = None, seed: int = 0) -> Ceiling:
    """One-frame clips (the packets from the frame's keyframe, remuxed) for every frame of ``runs``, in random
    order within each run, cut by a process pool on every core. Each process reads a file's packet index
    (cached) and opens its template once, as a loader's worker does."""
    workers = workers or usable_cpus()
    rng = np.random.default_rng(seed)
    tasks = [(r.path, rng.permutation(np.arange(r.start, r.stop)).tolist()) for r in runs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        list(pool.map(_noop, range(workers * 2)))
        start = time.perf_counter()
        frames = sum(pool.map(_cut_clips, tasks, chunksize=1))
        seconds = time.perf_counter() - start
    return Ceiling(
        name="clip_cutting",
        frames=frames,
        seconds=seconds,
        frames_per_s=frames / seconds if seconds > 0 else None,
        workers=workers,
        detail=f"{workers} processes cutting one-frame clips for NVDEC (PyAV {av.__version__}); no decoding",
    )


def gpu_decode_ceiling(runs: Sequence[DecodeRun], *, device_id: int = 0, batch_size: int = 4) -> Ceiling:
    """NVDEC through DALI (``fn.decoders.video`` mixed) on the runs cut into clips; clip cutting is untimed."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali.clips import build_clip

    clips = [build_clip(r.path, load_packet_index(r.path), np.arange(r.start, r.stop)) for r in runs]
    # Each clip's frames delivered are its run's: DALI also shows the frames an edit list hides that the run's first
    # keyframe holds, which it decodes as PyAV does, and PyAV's ceiling does not count (75 frames where it and clip
    # cutting count 70, with 5 hidden before the edit's start).
    data = [(c.data, r.stop - r.start) for c, r in zip(clips, runs, strict=True)]
    batches = [data[i : i + batch_size] for i in range(0, len(data), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or batches[:1]
    name = "gpu_dali"
    try:
        # One batch in flight: every run is fed first, so a deeper queue would ask for batches not fed yet.
        pipe = Pipeline(
            batch_size=max(len(b) for b in batches), num_threads=2, device_id=device_id, prefetch_queue_depth=1
        )
        with pipe:
            encoded = fn.external_source(name="clips", batch=True, no_copy=False)
            pipe.set_outputs(fn.decoders.video(encoded, device="mixed"))
        pipe.build()
        pipe.feed_input("clips", [clip for clip, _ in batches[0]])
        pipe.run()  # warm-up: decoder creation and memory pools are not part of the ceiling
        frames = 0
        start = time.perf_counter()
        for batch in batches:
            if len(batch) != pipe.max_batch_size:
                continue
            pipe.feed_input("clips", [clip for clip, _ in batch])
            pipe.run()
            frames += sum(delivered for _, delivered in batch)
        seconds = time.perf_counter() - start
    except Exception as e:  # NVDEC lacking the codec surfaces as a DALI RuntimeError at run time
        from .dali_video import dali_error_reason  # DALI's first line is always "Critical error in pipeline:"

        return Ceiling(name, 0, 0.0, None, 1, error=f"{type(e).__name__}: {dali_error_reason(e)}")
    return Ceiling(
        name=name,
        frames=frames,
        seconds=seconds,
        frames_per_s=frames / seconds if seconds > 0 else None,
        workers=1,
        detail=f"DALI fn.decoders.video(device='mixed'), GPU {device_id}, batches of {pipe.max_batch_size} clips",
    )


def measure_ceilings(
    dataset: str | os.PathLike[str],
    *,
    max_frames: int = 3000,
    run_frames: int = 128,
    gpu: bool | None = None,
    planes: bool | None = None,
    clips: bool | None = None,
    cameras: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ceilings for ``dataset`` as plain data; ``gpu=None`` measures the GPU one when CUDA is present,
    ``planes=None`` and ``clips=None`` the planes ceiling and the clip-cutting rate along with it."""
    runs = decode_runs(dataset, max_frames=max_frames, run_frames=run_frames, cameras=cameras)
    if not runs:
        raise ValueError(f"{dataset}: no video frames to decode")
    ceilings = [cpu_decode_ceiling(runs)]
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    if planes or (planes is None and gpu):
        ceilings.append(cpu_decode_ceiling(runs, planes=True))
    if gpu:
        ceilings.append(gpu_decode_ceiling(runs))
    measured = [c.frames_per_s for c in ceilings if c.frames_per_s]
    result = {
        "runs": len(runs),
        "frames_per_run": run_frames,
        "ceilings": {c.name: asdict(c) for c in ceilings},
        "best_frames_per_s": max(measured) if measured else None,
    }
    if clips or (clips is None and gpu):
        result["clip_cutting"] = asdict(clip_cutting_rate(runs))
    logger.info("decode ceilings of %s: %s", dataset, {c.name: c.frames_per_s for c in ceilings})
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="local LeRobot dataset folder")
    parser.add_argument("--max-frames", type=int, default=3000, help="frames decoded per ceiling (default %(default)s)")
    parser.add_argument(
        "--run-frames", type=int, default=128, help="consecutive frames per decode task, at least (default %(default)s)"
    )
    parser.add_argument("--no-gpu", action="store_true", help="skip the DALI GPU ceiling")
    parser.add_argument("--planes", action="store_true", help="also measure decode to YUV planes without a GPU")
    parser.add_argument("--clips", action="store_true", help="also measure clip cutting for NVDEC without a GPU")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = measure_ceilings(
        args.dataset,
        max_frames=args.max_frames,
        run_frames=args.run_frames,
        gpu=False if args.no_gpu else None,
        planes=True if args.planes else None,
        clips=True if args.clips else None,
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
