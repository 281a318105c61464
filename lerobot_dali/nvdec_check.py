"""Hold NVDEC's pictures of a camera to the CPU decoder's before the camera is routed to NVDEC.

Some ways the NVDEC route can fail raise no error (by a reading of DALI's source; no GPU has run this project's
tests yet): a clip that starts at a keyframe which is no IDR picture, a GPU that crops or pads an odd frame size.
So the probe that asks whether NVDEC decodes a camera's codec decodes a clip cut as the loader cuts them
(:func:`probe_frames`: the first frame shown, and a later keyframe with the frames after it, which B-frames
reorder), and :func:`nvdec_disagreement` compares its pictures with PyAV's. A camera whose pictures are broken (on
average further apart than two decoders' rounding) decodes on the CPU instead, with a warning saying by how much.
Whole pictures in the wrong order are beyond this check; ``tests/gpu`` checks those on marker videos.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .cpu_decode import CpuFrameDecoder
from .cpu_decode_options import CpuDecodeOptions, CpuDecoderBackend
from .errors import DatasetError
from .packet_index import PacketIndex
from .video_source import VideoSource
from .yuv_frames import has_color_matrix, nvdec_color_fix, stream_color

__all__ = ["PROBE_MAX_MEAN_DIFF", "nvdec_disagreement", "probe_frames", "recolored"]

logger = logging.getLogger(__name__)

#: The mean |difference| per frame (levels of 255) above which NVDEC's picture is not PyAV's. Two decoders of one
#: stream differ by their YUV->RGB conversion: DALI interpolates chroma where swscale repeats it, ~1.2 on camera
#: footage (``tests/gpu/test_nvdec.py`` holds NVDEC to 2.0). A garbled, grey or green picture is tens of levels off,
#: but two frames of a still camera may not be (``r1_v30_h264``'s frames 0 and 100: 3.9), so this catches broken
#: pictures, not one frame given for another (the GPU tests check that, on marker videos).
PROBE_MAX_MEAN_DIFF = 4.0

# Frames decoded after the probe's later keyframe: enough for x264/x265's B-pyramids to reorder.
_FRAMES_AFTER_KEYFRAME = 3


def probe_frames(index: PacketIndex) -> np.ndarray:
    """The display frames of a probe clip: the first frame shown, then the keyframe halfway through the file (of those
    after the first frame) and the frames after it, ascending. A file of one GOP gives its first frames."""
    shown = index.shown
    keyframes = np.sort(index.display_rank[index.keyframe_positions])
    later = keyframes[(keyframes > shown.start) & (keyframes < shown.stop)]
    start = int(later[len(later) // 2]) if later.size else shown.start
    after = range(start, min(start + 1 + _FRAMES_AFTER_KEYFRAME, shown.stop))
    return np.unique(np.array([shown.start, *after], dtype=np.int64))


def recolored(frames: np.ndarray, fix: np.ndarray) -> np.ndarray:
    """uint8 RGB ``frames`` through the ``[M | T]`` ``fix``, rounded and saturated, as the graph's ``recolor``."""
    rgb = frames.astype(np.float32) @ fix[:, :3].T + fix[:, 3]
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def nvdec_disagreement(
    decoded: np.ndarray, source: VideoSource, index: PacketIndex, frames: np.ndarray, *, filesystem: Any | None = None
) -> str:
    """Why NVDEC's ``decoded`` pictures of display ``frames`` of ``source`` are not PyAV's (their shape, or the first
    frame whose mean difference is over :data:`PROBE_MAX_MEAN_DIFF`), or "" where they agree. NVDEC's BT.601 colours are
    first taken to the colour space the stream is tagged with, as the graph takes them; a stream whose colour space
    has no known matrix, or whose frames PyAV does not decode, is not compared (logged)."""
    colorspace, full_range = stream_color(index.template)
    if not has_color_matrix(colorspace):
        logger.info("NVDEC's frames of %s are not checked: colour space %d is not converted here", index.source_name,
                    colorspace)  # fmt: skip
        return ""
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        reference = decoder.decode(source, index, frames, filesystem=filesystem)
    except DatasetError as e:  # (the loader raises it where a sample reads those frames; routing is no check)
        logger.warning("NVDEC's frames of %s are not checked: the CPU decoder failed (%s)", index.source_name, e)
        return ""
    finally:
        decoder.close()
    if decoded.shape != reference.shape:
        return f"NVDEC gave frames of shape {decoded.shape} for {index.source_name}, the CPU decoder {reference.shape}"
    fix = nvdec_color_fix(colorspace, full_range)
    ours = decoded if fix is None else recolored(decoded, fix)
    means = np.abs(ours.astype(np.int16) - reference.astype(np.int16)).mean(axis=(1, 2, 3))
    over = np.flatnonzero(means > PROBE_MAX_MEAN_DIFF)
    if over.size == 0:
        return ""
    first = int(over[0])
    return (
        f"NVDEC's frame {int(frames[first])} of {index.source_name} differs from the CPU decoder's by "
        f"{means[first]:.1f} levels on average (two decoders' rounding stays under {PROBE_MAX_MEAN_DIFF:g})"
    )
