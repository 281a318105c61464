"""What a frame the CPU fallback decodes becomes in the worker, and how a request's frames are stacked.

RGB comes from swscale, which folds a resize (CPU mode, ``size``; see ``dali_graph.camera_feed``) into the YUV -> RGB
conversion it does anyway (:data:`WORKER_RESIZE_INTERPOLATION`); planes are the decoder's own, for the graph to
convert (:mod:`.yuv_frames`); depth cameras give their 12-bit codes (:mod:`.depth_maps`). Stacking sets how many
copies and allocations a batch's frames cost on their way to shared memory (:func:`stacked_each`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import av
import numpy as np
from av.video.reformatter import Interpolation

from .yuv_frames import frame_planes, reformat_array, stack_planes, swscale_colors

__all__ = [
    "WORKER_RESIZE_INTERPOLATION",
    "Pixels",
    "checked_size",
    "frame_conversion",
    "stacked_each",
    "stacked_frames",
]


#: What a decode hands over: RGB, the decoder's planes (:mod:`.yuv_frames`) or depth codes (:mod:`.depth_maps`).
Pixels = Literal["rgb", "planes", "depth"]

#: swscale flags for resizing in the worker: bilinear (swscale widens it when shrinking, i.e. antialiased,
#: like DALI's ``fn.resize``) with chroma interpolated at full resolution. Against DALI's resize of the
#: full RGB frame, on the four real datasets in ../shared and the generated bench set, to 224x224, 96x128
#: and 240x320: mean abs difference 0.6-1.2, p99 <= 7, max 49 (at sharp colour edges, where 4:2:0 chroma
#: meets a different filter). Plain BILINEAR: max 62; AREA, BICUBIC, GAUSS, LANCZOS: further off. The chroma
#: flags are swscale's ``SWS_FULL_CHR_H_INT`` and ``SWS_FULL_CHR_H_INP``, spelled as numbers: PyAV names them only
#: from 18 (LeRobot 0.5+ pins PyAV < 16), and every PyAV passes an int through to swscale.
WORKER_RESIZE_INTERPOLATION = int(Interpolation.BILINEAR) | 0x2000 | 0x4000


def _to_rgb(frame: av.VideoFrame, size: tuple[int, int] | None) -> np.ndarray:
    colors = swscale_colors(frame)
    if size is None or size == (frame.height, frame.width):
        return reformat_array(frame, format="rgb24", **colors)
    height, width = size
    return reformat_array(
        frame, format="rgb24", width=width, height=height, interpolation=WORKER_RESIZE_INTERPOLATION, **colors
    )


def _to_depth_codes(frame: av.VideoFrame) -> np.ndarray:
    """A depth camera's 12-bit codes (H, W) uint16, taken as LeRobot takes them (``gray12le``)."""
    return reformat_array(frame, format="gray12le")


def checked_size(size: Any) -> tuple[int, int]:
    """``size`` as a (height, width) pair of positive ints; ValueError naming it where it is not one."""
    ok = isinstance(size, (tuple, list)) and len(size) == 2
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    if not ok:
        raise ValueError(f"size must be a pair (height, width) of positive ints, got {size!r}.")
    return int(size[0]), int(size[1])


def frame_conversion(pixels: Pixels | None, size: tuple[int, int] | None) -> Callable[[av.VideoFrame], Any]:
    """What each PyAV frame becomes for ``pixels`` (None: its pts)."""
    if pixels is None:
        return _frame_pts
    if pixels == "rgb":
        return functools.partial(_to_rgb, size=None if size is None else checked_size(size))
    if pixels not in ("planes", "depth"):
        raise ValueError(f"pixels must be 'rgb', 'planes' or 'depth', got {pixels!r}.")
    if size is not None:
        raise ValueError(f"size resizes RGB frames only; pixels={pixels!r} come at the video's size.")
    return frame_planes if pixels == "planes" else _to_depth_codes


def _frame_pts(frame: av.VideoFrame) -> int | None:
    return frame.pts


def stacked_frames(frames: list[Any], pixels: Pixels, *, label: str) -> Any:
    """One request's converted frames as one array (planes: :func:`~.yuv_frames.stack_planes`)."""
    if pixels == "planes":
        return stack_planes(frames, label=label)
    if len(frames) == 1:  # every request of a single-frame camera: the worker's copy to shared memory is the only one
        return np.ascontiguousarray(frames[0])[np.newaxis]
    return np.stack(frames)


def stacked_each(frames: list[Any], rows: list[list[int]], pixels: Pixels, *, label: str) -> list[Any]:
    """Each request's frames (its ``rows`` of ``frames``): RGB or depth windows of several frames as slices of one
    stack, one allocation per file of a batch, not one per request.

    Measured with each batch's outputs dropped as soon as it was built (``bench/batch_fallback.py`` before 2026-12-01),
    which glibc then gave back to the kernel, so every batch's were fresh memory paged in as first written, one stack
    per file was faster (two 480x640 RGB frames per sample: batch 64, AV1 126 -> 102 ms and H.264 168 -> 111 ms). A
    DALI worker holds a batch's outputs until the next batch's are built, so its heap is reused, and there the two
    cost the same (H.264, batch 32: 45.7 ms per file, 45.6-46.2 per request). Planes stay stacked per request.
    Requests of one frame each keep their frames' own memory (:func:`stacked_frames`).
    """
    if pixels == "planes" or all(len(r) == 1 for r in rows):
        return [stacked_frames([frames[row] for row in r], pixels, label=label) for r in rows]
    everything = stacked_frames([frames[row] for r in rows for row in r], pixels, label=label)
    stops = np.cumsum([len(r) for r in rows]).tolist()
    return [everything[start:stop] for start, stop in zip([0, *stops[:-1]], stops, strict=True)]
