"""Decoded frames as YUV planes plus a colour matrix: the worker's half of converting colour on the GPU.

Where the CPU fallback feeds a GPU pipeline (AV1 on A100/H100/H200), turning each decoded frame into RGB
in the worker costs more than decoding it: on the bench's AV1 videos (480x640, GOP 2) one core decodes
~1,900 frames/s, but only ~690 frames/s once swscale makes RGB. So the worker hands the decoder's own
4:2:0 planes over instead (half the bytes of RGB through shared memory and over PCIe) and the graph turns
them into RGB on the device (:func:`lerobot_dali.dali_color.planes_to_rgb`).

What the worker ships per frame, and what the graph does with it:

- ``luma`` (H, W, 1) and ``chroma`` (h, w, 2) uint8; the graph brings ``chroma`` to (H, W) by
  nearest-neighbour sampling, stacks it behind ``luma``, and applies ``matrix``;
- ``matrix`` (3, 4) float32, ``RGB = M @ (Y, Cb, Cr) + T``, from the frame's colour space and range;
  the graph rounds to nearest, so ``T`` carries swscale's habit of rounding down (:data:`_SWSCALE_BIAS`).

Frames in 8-bit 4:2:0 with even sides and a colour space listed in :data:`_KR_KB` go as they are: the
result is within 3 levels of swscale's RGB (PyAV's ``to_ndarray("rgb24")``, which also repeats each chroma
sample over its 2x2 block). Anything else (odd sides, 10-bit, 4:2:2/4:4:4, other colour spaces) is
converted by swscale in the worker, exactly as the RGB path does, and shipped in the same form: R as
``luma``, (G, B) as a full-size ``chroma`` and an identity ``matrix``; the graph then returns it unchanged.
"""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from .errors import VideoDecodeError

__all__ = [
    "FramePlanes",
    "PlaneFrames",
    "codec_color",
    "color_matrix",
    "frame_planes",
    "has_color_matrix",
    "nvdec_color_fix",
    "reformat_array",
    "ships_half_chroma",
    "stack_planes",
    "stream_color",
    "swscale_colors",
]

#: (Kr, Kb) luma coefficients by FFmpeg ``AVColorSpace`` value: 1 BT.709, 2 unspecified (swscale's default,
#: BT.601), 4 FCC, 5 BT.470BG and 6 SMPTE 170M (both BT.601), 7 SMPTE 240M, 9 BT.2020 non-constant luminance.
_KR_KB: dict[int, tuple[float, float]] = {
    1: (0.2126, 0.0722),
    2: (0.299, 0.114),
    4: (0.30, 0.11),
    5: (0.299, 0.114),
    6: (0.299, 0.114),
    7: (0.212, 0.087),
    9: (0.2627, 0.0593),
}
_FULL_RANGE = 2  # AVCOL_RANGE_JPEG
_PLANAR_420 = {"yuv420p": False, "yuvj420p": True}  # pixel format -> full range by definition
#: swscale's fixed-point conversion lands low: against exact BT.601/709 arithmetic rounded to nearest it is
#: off by a mean 0.70 levels (limited range) and 0.46 (full range) on random YCbCr. Subtracting 0.45 before
#: rounding brings that to 0.43 and 0.17 (-0.5 would be floor, which turns exact values such as white's
#: 255.0 into 254 under round-half-to-even).
_SWSCALE_BIAS = -0.45
_IDENTITY = np.eye(3, 4, dtype=np.float32)
_IDENTITY.setflags(write=False)


class FramePlanes(NamedTuple):
    """One decoded frame's planes, possibly views into the decoder's buffers (they keep the frame alive)."""

    #: (H, W) uint8.
    luma: np.ndarray
    #: Two (h, w) uint8 planes: (Cb, Cr) at half size, or (G, B) at full size with the identity ``matrix``.
    chroma: tuple[np.ndarray, np.ndarray]
    #: (3, 4) float32, read-only.
    matrix: np.ndarray


@dataclass(frozen=True)
class PlaneFrames:
    """N decoded frames of one video as planes (see the module docstring); all share ``matrix``."""

    #: (N, H, W, 1) uint8.
    luma: np.ndarray
    #: (N, h, w, 2) uint8: (Cb, Cr) at half size, or (G, B) at full size when ``matrix`` is the identity.
    chroma: np.ndarray
    #: (3, 4) float32.
    matrix: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.luma.nbytes + self.chroma.nbytes

    def __getitem__(self, rows: Any) -> PlaneFrames:
        """The frames at ``rows``, as a NumPy index takes them (the sub-requests of a merged decode)."""
        return PlaneFrames(luma=self.luma[rows], chroma=self.chroma[rows], matrix=self.matrix)


@functools.lru_cache(maxsize=32)
def color_matrix(colorspace: int, full_range: bool) -> np.ndarray:
    """(3, 4) float32 ``[M | T]`` taking 8-bit (Y, Cb, Cr) to 8-bit RGB, to be rounded to nearest, for an
    ``AVColorSpace`` value; ``T`` includes :data:`_SWSCALE_BIAS`."""
    if colorspace not in _KR_KB:
        raise ValueError(f"colour space {colorspace} has no YCbCr matrix here; known: {sorted(_KR_KB)}")
    kr, kb = _KR_KB[colorspace]
    kg = 1.0 - kr - kb
    y_scale, c_scale, y_offset = (1.0, 1.0, 0.0) if full_range else (255 / 219, 255 / 224, 16.0)
    m = np.array(
        [
            [y_scale, 0.0, 2 * (1 - kr) * c_scale],
            [y_scale, -2 * (1 - kb) * kb / kg * c_scale, -2 * (1 - kr) * kr / kg * c_scale],
            [y_scale, 2 * (1 - kb) * c_scale, 0.0],
        ]
    )
    t = -m @ np.array([y_offset, 128.0, 128.0]) + _SWSCALE_BIAS
    matrix = np.concatenate([m, t[:, None]], axis=1).astype(np.float32)
    matrix.setflags(write=False)  # shared by every caller (cached)
    return matrix


@functools.lru_cache(maxsize=256)
def stream_color(template: bytes) -> tuple[int, bool]:
    """(``AVColorSpace``, full range) a video stream declares, read from its stream template
    (``PacketIndex.template``: the container header alone, no file access)."""
    with av.open(io.BytesIO(template), "r") as container:
        return codec_color(container.streams.video[0].codec_context)


def codec_color(codec: Any) -> tuple[int, bool]:
    """(``AVColorSpace``, full range) a video stream's codec context (PyAV's) declares."""
    return int(codec.colorspace), codec.color_range == _FULL_RANGE or bool(_PLANAR_420.get(codec.pix_fmt))


def has_color_matrix(colorspace: int) -> bool:
    """Whether :func:`color_matrix` knows ``colorspace`` (else only swscale converts it)."""
    return colorspace in _KR_KB


def nvdec_color_fix(colorspace: int, full_range: bool) -> np.ndarray | None:
    """(3, 4) ``[M | T]`` taking NVDEC's RGB to the RGB this colour space gives on the CPU routes, or None when
    they agree. DALI's NVDEC path converts every stream with BT.601 (limited range, or JPEG's full range;
    ``dali/operators/video/color_space.cu``) whatever matrix it is tagged with; BT.709 or BT.2020 tags make
    saturated colours 10+ levels off. Undoing BT.601 and applying the tagged matrix is exact up to rounding,
    except where DALI's conversion clipped a channel."""
    if colorspace not in _KR_KB or _KR_KB[colorspace] == _KR_KB[2]:
        return None
    dali = color_matrix(2, full_range).astype(np.float64)
    target = color_matrix(colorspace, full_range).astype(np.float64)
    a, a_offset = dali[:, :3], dali[:, 3] - _SWSCALE_BIAS  # DALI rounds to nearest: no swscale bias
    m = target[:, :3] @ np.linalg.inv(a)
    fix = np.concatenate([m, (target[:, 3] - m @ a_offset)[:, None]], axis=1).astype(np.float32)
    fix.setflags(write=False)
    return fix


def _explicit_colors(frame: av.VideoFrame) -> dict[str, int]:
    # RGB has no colour space: the destination's only has to differ from the source's for PyAV 15 to apply it.
    source = int(frame.colorspace)
    return {
        "src_colorspace": source,
        "dst_colorspace": 1 if source == 5 else 5,
        "src_color_range": int(frame.color_range),
        "dst_color_range": _FULL_RANGE,
    }


def _swscale_ignores_tags() -> bool:
    """Whether this PyAV converts a BT.709-tagged frame to RGB as BT.601: PyAV 15 does (up to 27 levels off on a
    BT.709 test clip), even with ``src_colorspace`` given, unless the destination colour space differs; 17 and 18
    do not."""
    frame = av.VideoFrame(16, 16, "yuv420p")
    for plane, value in zip(frame.planes, (120, 60, 200), strict=True):
        plane.update(bytes([value]) * plane.buffer_size)
    frame.colorspace = 1
    default = VideoReformatter().reformat(frame, format="rgb24").to_ndarray()  # (a frame's own reformatter keeps
    explicit = VideoReformatter().reformat(frame, format="rgb24", **_explicit_colors(frame)).to_ndarray()  # options)
    return not np.array_equal(default, explicit)


_SWSCALE_IGNORES_TAGS = _swscale_ignores_tags()


def swscale_colors(frame: av.VideoFrame) -> dict[str, int]:
    """``reformat`` options that make this PyAV convert ``frame`` to RGB by its own colour space and range (none
    where it does so itself); with them, PyAV 15 gives PyAV 18's pixels exactly."""
    return _explicit_colors(frame) if _SWSCALE_IGNORES_TAGS else {}


#: One swscale context per thread, reused from frame to frame on one thread. PyAV's ``to_ndarray(format=...)``
#: builds a new one per frame with an automatic thread pool (``threads=0``), started and joined per frame: 54% of
#: an AV1 worker's time at 96x128 (45 -> 10 us a frame), same pixels.
_REFORMATTERS = threading.local()


def _one_thread() -> dict[str, Any]:
    """``threads=1`` where ``reformat`` takes it; PyAV < 16 has no such option (its swscale runs on the caller's
    thread alone)."""
    try:
        VideoReformatter().reformat(av.VideoFrame(16, 16, "yuv420p"), format="rgb24", threads=1)
    except TypeError:
        return {}
    return {"threads": 1}


_ONE_THREAD = _one_thread()


def reformat_array(frame: av.VideoFrame, **options: Any) -> np.ndarray:
    """``frame`` converted by swscale (``options`` as ``reformat`` takes them) on this thread's own context."""
    reformatter = getattr(_REFORMATTERS, "reformatter", None)
    if reformatter is None:
        reformatter = _REFORMATTERS.reformatter = VideoReformatter()
    return reformatter.reformat(frame, **_ONE_THREAD, **options).to_ndarray()


def _plane(plane: av.video.plane.VideoPlane, height: int, width: int) -> np.ndarray:
    rows = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
    return rows[:height, :width]


def ships_half_chroma(pix_fmt: str | None) -> bool:
    """Whether frames of ``pix_fmt`` ship as the decoder's 4:2:0 planes, half RGB's bytes (None: not known, taken
    as LeRobot's 8-bit 4:2:0); every other format ships at RGB's size (:func:`frame_planes`)."""
    return pix_fmt is None or pix_fmt in _PLANAR_420


def frame_planes(frame: av.VideoFrame) -> FramePlanes:
    """The planes of one decoded frame (module docstring), as views where the decoder's own planes serve."""
    full_range = _PLANAR_420.get(frame.format.name)
    even = frame.width % 2 == 0 and frame.height % 2 == 0
    if full_range is not None and even and frame.colorspace in _KR_KB:
        full_range = full_range or frame.color_range == _FULL_RANGE
        h, w = frame.height // 2, frame.width // 2
        luma = _plane(frame.planes[0], frame.height, frame.width)
        chroma = (_plane(frame.planes[1], h, w), _plane(frame.planes[2], h, w))
        return FramePlanes(luma, chroma, color_matrix(frame.colorspace, full_range))
    rgb = reformat_array(frame, format="rgb24", **swscale_colors(frame))
    return FramePlanes(rgb[:, :, 0], (rgb[:, :, 1], rgb[:, :, 2]), _IDENTITY)


def stack_planes(frames: Sequence[FramePlanes], *, label: str) -> PlaneFrames:
    """The planes of one request's frames in one copy; they must agree on sizes and matrix."""
    if not frames:
        raise ValueError(f"{label}: no frames to stack")
    first = frames[0]
    for f in frames[1:]:
        if (
            f.luma.shape != first.luma.shape
            or f.chroma[0].shape != first.chroma[0].shape
            or not (f.matrix is first.matrix or np.array_equal(f.matrix, first.matrix))
        ):
            raise VideoDecodeError(
                f"{label}: frames of one window differ in size or colour space ({first.luma.shape} vs "
                f"{f.luma.shape}); decode with CpuDecodeOptions(color_conversion=ColorConversion.WORKER)"
            )
    luma = np.empty((len(frames), *first.luma.shape, 1), dtype=np.uint8)
    chroma = np.empty((len(frames), *first.chroma[0].shape, 2), dtype=np.uint8)
    for i, f in enumerate(frames):
        luma[i, :, :, 0] = f.luma
        chroma[i, :, :, 0], chroma[i, :, :, 1] = f.chroma
    return PlaneFrames(luma=luma, chroma=chroma, matrix=np.array(first.matrix))
