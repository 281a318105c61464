"""Hold NVDEC's pictures of a camera to PyAV's before the camera is routed to NVDEC.

Some ways the NVDEC route can fail raise no error (by a reading of DALI's source; no GPU has run this project's
tests yet): a clip that starts at a keyframe which is no IDR picture, a GPU that crops or pads an odd frame size.
So the probe that asks whether NVDEC decodes a camera's codec decodes two clips cut as the loader cuts them
(:func:`probe_clips`: the first frame shown; a later keyframe with the frames after it, which B-frames reorder), and
:func:`nvdec_disagreement` compares their pictures with PyAV's. A camera whose pictures are broken (their brightness
on average further apart than two decoders' rounding) decodes on the CPU instead, with a warning saying by how much.
Whole pictures in the wrong order are beyond this check; ``tests/gpu`` checks those on marker videos.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .cpu_decode import CpuFrameDecoder
from .cpu_decode_options import CpuDecodeOptions, CpuDecoderBackend
from .errors import DatasetError
from .packet_index import PacketIndex
from .video_source import VideoSource
from .yuv_frames import has_color_matrix, nvdec_color_fix, stream_color

__all__ = ["PROBE_MAX_MEAN_DIFF", "nvdec_disagreement", "probe_clips", "recolored"]

logger = logging.getLogger(__name__)

#: The mean |difference| of a frame's luma (0.299 R + 0.587 G + 0.114 B, levels of 255) above which NVDEC's picture
#: is not PyAV's. Two decoders of one stream differ by their YUV->RGB conversion, mostly in colour: DALI interpolates
#: chroma where swscale repeats it. Luma leaves most of that out: ~1.2 on camera footage (RGB too), 1.1-2.4 on
#: saturated synthetic colour blocks whose RGB differs by 7-35 (with NVDEC's conversion emulated from DALI's source).
#: A garbled, grey or green picture is tens of levels off, but two frames of a still camera may not be
#: (``r1_v30_h264``'s frames 0 and 100: 3.9 in RGB), so this catches broken pictures, not one frame given for another.
PROBE_MAX_MEAN_DIFF = 4.0

# Frames decoded after the probe's later keyframe: enough for x264/x265's B-pyramids to reorder.
_FRAMES_AFTER_KEYFRAME = 3


def probe_clips(index: PacketIndex) -> list[np.ndarray]:
    """The display frames of each probe clip: the first frame shown; the keyframe halfway through the file (of those
    after the first frame) and the frames after it. Two clips, as the loader cuts samples of them: one clip of both
    is decoded from the first frame on where the later keyframe is an open one (x264 open GOPs, x265's default), half
    the file, and never from that keyframe. A file of one GOP gives one clip of its first frames."""
    shown = index.shown
    keyframes = np.sort(index.display_rank[index.keyframe_positions])
    later = keyframes[(keyframes > shown.start) & (keyframes < shown.stop)]
    start = int(later[len(later) // 2]) if later.size else shown.start
    run = np.arange(start, min(start + 1 + _FRAMES_AFTER_KEYFRAME, shown.stop))
    return [np.array([shown.start]), run] if later.size else [run]


def recolored(frames: np.ndarray, fix: np.ndarray) -> np.ndarray:
    """uint8 RGB ``frames`` through the ``[M | T]`` ``fix``, rounded and saturated, as the graph's ``recolor``
    (a frame at a time: float32 copies of a 1080p clip's frames at once took ~350 MB)."""
    out = np.empty_like(frames)
    for i, frame in enumerate(frames):
        rgb = frame.reshape(-1, 3).astype(np.float32) @ fix[:, :3].T + fix[:, 3]
        out[i] = np.clip(np.rint(rgb), 0, 255).astype(np.uint8).reshape(frame.shape)
    return out


_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def nvdec_disagreement(
    decoded: Sequence[np.ndarray],
    source: VideoSource,
    index: PacketIndex,
    clips: Sequence[np.ndarray],
    *,
    filesystem: Any | None = None,
) -> str:
    """Why NVDEC's pictures ``decoded`` of each of ``clips`` (display frames of ``source``: :func:`probe_clips`) are
    not PyAV's (their shape, or the first frame whose luma is on average further off than
    :data:`PROBE_MAX_MEAN_DIFF`), or "" where they agree. NVDEC's BT.601 colours are first taken to the colour space
    the stream is tagged with, as the graph takes them; a stream whose colour space has no known matrix, or whose
    frames PyAV does not decode, is not compared (logged). PyAV decodes each clip's frames on their own, as NVDEC did.
    """
    colorspace, full_range = stream_color(index.template)
    if not has_color_matrix(colorspace):
        logger.info("NVDEC's frames of %s are not checked: colour space %d is not converted here", index.source_name,
                    colorspace)  # fmt: skip
        return ""
    fix = nvdec_color_fix(colorspace, full_range)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for pictures, frames in zip(decoded, clips, strict=True):
            try:
                reference = decoder.decode(source, index, frames, filesystem=filesystem)
            except DatasetError as e:  # (the loader raises it where a sample reads those frames; routing is no check)
                logger.warning("NVDEC's frames of %s are not checked: PyAV failed (%s)", index.source_name, e)
                return ""
            if pictures.shape != reference.shape:
                return f"NVDEC gave frames of shape {pictures.shape} for {index.source_name}, PyAV {reference.shape}"
            ours = pictures if fix is None else recolored(pictures, fix)
            for frame, theirs, frame_index in zip(ours, reference, frames.tolist(), strict=True):
                off = float(np.abs(frame.astype(np.float32) @ _LUMA - theirs.astype(np.float32) @ _LUMA).mean())
                if off > PROBE_MAX_MEAN_DIFF:
                    return (
                        f"NVDEC's frame {frame_index} of {index.source_name} is {off:.1f} levels from PyAV's in "
                        f"brightness on average (two decoders' rounding stays under {PROBE_MAX_MEAN_DIFF:g})"
                    )
    finally:
        decoder.close()
    return ""
