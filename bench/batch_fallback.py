"""The CPU work of one batch in a DALI worker that decodes the cameras itself (the CPU fallback: AV1 on
A100/H100/H200, or any codec DALI's CPU decoder lacks in CPU mode), against the floor: a bare PyAV decode of
exactly the same frames in the same process and run.

The external source is called directly, its cameras fed as ``--pixels`` says: ``planes`` as on a GPU machine
(the worker ships the decoder's YUV planes and the graph converts), ``rgb`` as in CPU mode (the worker converts,
resizing with ``--worker-size``). The floor replays each batch's decodes as the worker asked for them: per file
and call, the same keyframe-to-frame runs (the union's clip plan), one PyAV decoder kept open per file, each
needed frame converted once (RGB: one swscale context reused; planes: views of the decoder's), then each
sample's window put together in one copy into one array per call (none for a one-frame RGB window), which is
what the outputs need.
Batches alternate with their floor, so both see the same load, and each keeps its outputs until the next is built,
as a DALI worker does. Prints one JSON object: CPU ms (this process's) per batch and per frame delivered, the floor's,
the ratio, the worker's page faults per batch, and with --profile the worker's costliest functions.

    PYTHONPATH=. python bench/batch_fallback.py --dataset DIR [--pixels planes] [--window chunk] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import resource
import time
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from batch_cpu import top_functions, worker_spec  # (a sibling script, as row_groups imports child_process)

#: Windows a policy trains with: one frame; cameras and state at (-0.1 s, 0) and 16 actions.
WINDOWS = ("frame", "chunk")
PIXELS = ("planes", "rgb")


def fallback_source(
    dataset: str,
    *,
    batch_size: int,
    window: str,
    pixels: str,
    worker_size: tuple[int, int] | None,
    frame_index: bool = False,
) -> Any:
    """A :class:`~lerobot_dali.batch_source.BatchSource` whose video cameras the worker decodes with PyAV, shipping
    ``pixels``: planes as a GPU machine picks for the CPU fallback, or RGB (resized to ``worker_size``) as CPU mode
    does, whatever this machine has and whatever codec the files hold."""
    from lerobot_dali.batch_source import BatchSource, CameraFormat
    from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend
    from lerobot_dali.dali_graph import CameraFeed
    from lerobot_dali.decode_route import DecodeRoute
    from lerobot_dali.packet_index_cache import PacketIndexCache

    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV)
    lookup = {"timestamp_source": "frame_index"} if frame_index else {}
    spec = worker_spec(dataset, batch_size=batch_size, window=window, cpu_decode=options, **lookup)
    feeds, formats = {}, {}
    for camera in spec.camera_feeds:
        route = DecodeRoute.CPU_FALLBACK
        planes = pixels == "planes"
        feeds[camera] = CameraFeed(route, planes=planes, worker_size=None if planes else worker_size)
        index = PacketIndexCache().of_video(spec.reader, spec.reader.video(0, camera), store=None)
        formats[camera] = CameraFormat.of(index, route=route)
    return BatchSource(dataclasses.replace(spec, camera_feeds=feeds, camera_formats=formats))


class _Recorder:
    """Records the decoder calls a batch makes: ``(path, index, requests, size, pixels)`` each."""

    def __init__(self, decoder: Any) -> None:
        self.calls: list[tuple[str, Any, list[np.ndarray], Any, str]] = []
        self.recording = False
        decode, decode_each = decoder.decode, decoder.decode_each

        def recorded_decode(source: Any, index: Any, numbers: Any, **kw: Any) -> Any:
            if self.recording:
                self.calls.append((source, index, [np.asarray(numbers)], kw.get("size"), kw.get("pixels", "rgb")))
            return decode(source, index, numbers, **kw)

        def recorded_each(source: Any, index: Any, requests: Any, **kw: Any) -> Any:
            if self.recording:
                listed = [np.asarray(r) for r in requests]
                self.calls.append((source, index, listed, kw.get("size"), kw.get("pixels", "rgb")))
            return decode_each(source, index, requests, **kw)

        decoder.decode, decoder.decode_each = recorded_decode, recorded_each


class BareDecoder:
    """The floor: PyAV alone, one open decoder per file, decoding the worker's keyframe-to-frame runs."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, Any]] = {}
        self._reformatter = VideoReformatter()

    def _stream(self, path: str) -> tuple[Any, Any]:
        if path not in self._open:
            container = av.open(path)
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            stream.codec_context.thread_type = "AUTO"
            self._open[path] = (container, stream)
        return self._open[path]

    def frames(self, path: str, index: Any, numbers: np.ndarray, convert: Any) -> dict[int, Any]:
        """``convert(frame)`` per distinct display frame of ``numbers``, keyed by display frame number."""
        from lerobot_dali.clips import plan_clip

        container, stream = self._stream(path)
        wanted = {int(index.frame_pts[n]): int(n) for n in np.unique(numbers)}
        out: dict[int, Any] = {}
        for start, stop in plan_clip(index, numbers).segments:
            key_pts = int(index.pts[start])
            pending = {int(p) for p in index.pts[start:stop]} & wanted.keys()
            container.seek(key_pts, stream=stream, backward=True)
            stream.codec_context.flush_buffers()
            started = False
            with contextlib.closing(container.demux(stream)) as packets:
                for packet in packets:
                    started = started or packet.pts == key_pts
                    if not started:
                        continue
                    for frame in packet.decode():
                        if frame.pts in pending:
                            out[wanted[frame.pts]] = convert(frame)
                            pending.discard(frame.pts)
                    if not pending:
                        break
        return out

    def replay(
        self, calls: list[tuple[str, Any, list[np.ndarray], Any, str]], *, decode_only: bool = False
    ) -> tuple[int, list[Any]]:
        """Each call's frames as the worker's outputs hold them; returns the frames delivered and the outputs."""
        delivered, outputs = 0, []  # (the batch's outputs live until it is done, as the worker's do)
        for path, index, requests, size, pixels in calls:
            union = np.unique(np.concatenate(requests))
            convert = _frame_pts if decode_only else self._converter(pixels, size)
            by_number = self.frames(path, index, union, convert)
            delivered += sum(len(numbers) for numbers in requests)
            if not decode_only:
                outputs.append(_windows([[by_number[int(n)] for n in numbers] for numbers in requests], pixels))
        return delivered, outputs

    def _converter(self, pixels: str, size: tuple[int, int] | None) -> Any:
        if pixels == "planes":
            return _planes
        options: dict[str, Any] = {"format": "rgb24", "threads": 1}
        if size is not None:
            from lerobot_dali.cpu_decode import WORKER_RESIZE_INTERPOLATION

            options |= {"height": size[0], "width": size[1], "interpolation": WORKER_RESIZE_INTERPOLATION}
        return lambda frame: self._reformatter.reformat(frame, **options).to_ndarray()


def _frame_pts(frame: Any) -> Any:
    return frame.pts


def _planes(frame: Any) -> tuple[np.ndarray, ...]:
    """Views of a 4:2:0 frame's Y, U and V planes (frame.planes[i] may be padded to a line size)."""
    views = []
    for i, plane in enumerate(frame.planes):
        height, width = (frame.height, frame.width) if i == 0 else (frame.height // 2, frame.width // 2)
        rows = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
        views.append(rows[:height, :width])
    return tuple(views)


def _windows(windows: list[list[Any]], pixels: str) -> list[Any]:
    """Each sample's window in the layout the worker ships, in one copy into one array per call (a one-frame RGB
    window is its frame's own array, no copy)."""
    if pixels == "rgb":
        if all(len(frames) == 1 for frames in windows):
            return [frames[0][np.newaxis] for frames in windows]
        stacked: Any = np.stack([frame for frames in windows for frame in frames])
    else:
        y, u, _ = windows[0][0]
        count = sum(len(frames) for frames in windows)
        luma = np.empty((count, *y.shape, 1), dtype=np.uint8)
        chroma = np.empty((count, *u.shape, 2), dtype=np.uint8)
        for i, (y, u, v) in enumerate(frame for frames in windows for frame in frames):
            luma[i, :, :, 0], chroma[i, :, :, 0], chroma[i, :, :, 1] = y, u, v
        stacked = (luma, chroma)
    out, start = [], 0
    for frames in windows:
        stop = start + len(frames)
        out.append(stacked[start:stop] if pixels == "rgb" else (luma[start:stop], chroma[start:stop]))
        start = stop
    return out


def measure(source: Any, *, batches: int, warmup: int, rounds: int, profile: bool, decode_only: bool) -> dict[str, Any]:
    """CPU seconds per batch of the worker and of the floor, each batch followed by its floor, ``rounds`` times
    over, after ``warmup`` batches (rows, indexes and open decoders cached) and a recording pass.

    Each batch's outputs, the worker's and the floor's, are held until the next batch's are built, as DALI's worker
    loop holds them (``data_batch`` stays bound while the next callback runs, and its dispatcher thread copies them
    to shared memory meanwhile). Dropped at once, as this script did until 2026-12-01, each batch's freed outputs
    were the top of glibc's heap, which it gave back to the kernel, so the next batch's were fresh memory faulted in
    4 KB at a time: 3,000 faults a batch of 32 480x640 planes (~5 ms, ~20% of the batch), where a DALI worker running
    the same batches takes ~280 (bench/README.md)."""
    recorder = _Recorder(source._decoder)
    bare = BareDecoder()
    for i in range(warmup):
        source(SimpleNamespace(epoch_idx=0, iteration=i))
    calls = []
    held: list[Any] = [None, None]  # the last batch's outputs, the worker's and the floor's (docstring)
    for i in range(warmup, warmup + batches):
        recorder.calls, recorder.recording = [], True
        held[0] = source(SimpleNamespace(epoch_idx=0, iteration=i))
        recorder.recording = False
        calls.append(recorder.calls)
        _, held[1] = bare.replay(recorder.calls)  # (opens the floor's files)
    worker_s = floor_s = decode_s = 0.0
    delivered = faults = 0
    profiler = cProfile.Profile() if profile else None
    for _ in range(rounds):
        for i, batch_calls in zip(range(warmup, warmup + batches), calls, strict=True):
            start, faulted = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            if profiler is not None:
                profiler.enable()
            held[0] = source(SimpleNamespace(epoch_idx=0, iteration=i))
            if profiler is not None:
                profiler.disable()
            middle = time.process_time()
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted
            count, held[1] = bare.replay(batch_calls)
            end = time.process_time()
            delivered += count
            if decode_only:
                bare.replay(batch_calls, decode_only=True)
                decode_s += time.process_time() - end
            worker_s, floor_s = worker_s + middle - start, floor_s + end - middle
    timed = batches * rounds
    per_batch, floor_per_batch = worker_s / timed, floor_s / timed
    frames = delivered / timed
    result: dict[str, Any] = {
        "frames_per_batch": frames,
        "batch_ms": round(per_batch * 1e3, 2),
        "frame_us": round(per_batch / frames * 1e6, 1),
        "floor_batch_ms": round(floor_per_batch * 1e3, 2),
        "floor_frame_us": round(floor_per_batch / frames * 1e6, 1),
        "ratio": round(per_batch / floor_per_batch, 3),
        "worker_page_faults_per_batch": round(faults / timed),
    }
    if decode_only:
        result["decode_only_batch_ms"] = round(decode_s / timed * 1e3, 2)
    if profiler is not None:
        result["top_cumulative"] = top_functions(profiler, timed)
    return result


def _size(text: str) -> tuple[int, int]:
    height, width = text.lower().split("x")
    return int(height), int(width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--dataset", required=True, help="a LeRobot dataset folder (lerobot-dali make-dataset)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default %(default)s)")
    parser.add_argument(
        "--window",
        choices=WINDOWS,
        default="frame",
        help="one frame, or (-0.1 s, 0) + 16 actions (default %(default)s)",
    )
    parser.add_argument(
        "--pixels",
        choices=PIXELS,
        default="planes",
        help="planes (as a GPU machine ships them; the default) or rgb (CPU mode)",
    )
    parser.add_argument(
        "--worker-size",
        type=_size,
        default=None,
        help="rgb only: HxW the worker resizes to (default: the video's size)",
    )
    parser.add_argument("--batches", type=int, default=8, help="batches timed, after --warmup (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="times the batches are timed over (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="(default %(default)s)")
    parser.add_argument("--decode-only", action="store_true", help="also the floor without conversion or copies")
    parser.add_argument("--frame-index", action="store_true", help="look frames up by frame_index / fps (cr5_*)")
    parser.add_argument("--profile", action="store_true", help="also the worker's 25 costliest functions")
    args = parser.parse_args()
    if args.worker_size is not None and args.pixels != "rgb":
        parser.error("--worker-size resizes RGB: add --pixels rgb")
    source = fallback_source(
        args.dataset,
        batch_size=args.batch_size,
        window=args.window,
        pixels=args.pixels,
        worker_size=args.worker_size,
        frame_index=args.frame_index,
    )
    result: dict[str, Any] = {
        "dataset": args.dataset,
        "batch_size": args.batch_size,
        "window": args.window,
        "pixels": args.pixels,
    }
    if args.worker_size is not None:
        result["worker_size"] = list(args.worker_size)
    result |= measure(
        source,
        batches=args.batches,
        warmup=args.warmup,
        rounds=args.rounds,
        profile=args.profile,
        decode_only=args.decode_only,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
