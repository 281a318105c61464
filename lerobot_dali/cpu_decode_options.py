"""How the CPU fallback decodes: which library, where frames turn RGB, how many files a process keeps open.

The options a user sets (``DALILeRobotIterator(cpu_decode=...)``) and the DALI graph reads (where frames turn RGB),
apart from :class:`~.cpu_decode.CpuFrameDecoder`, which decodes by them; with them the memory an open decoder is
estimated to hold, which sets their default budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from .value_checks import check_choice, check_int_fields

__all__ = [
    "DECODER_FRAMES",
    "DECODER_MEMORY_BYTES",
    "DECODER_MIN_BYTES",
    "DEMUXER_BYTES_PER_PACKET",
    "IMAGE_CACHE_BYTES",
    "MIN_OPEN_DECODERS",
    "ColorConversion",
    "ColorConversionName",
    "CpuDecodeOptions",
    "CpuDecoderBackend",
    "CpuDecoderBackendName",
    "checked_cpu_decode",
    "decoder_bytes",
]

#: What a process's open decoders may hold, estimated as :data:`DECODER_FRAMES` YUV 4:2:0 frames each per
#: decoding thread (measured at one thread: 8-13 frames for H.264 with B-frames, 28 MiB at 1080p and 4.2 MiB
#: for r1's 640x360; up to 24 with 16 reference frames; dav1d holds less): at one thread, seven 1080p or 48
#: 480p H.264 decoders.
DECODER_MEMORY_BYTES, DECODER_FRAMES, MIN_OPEN_DECODERS = 256 * 2**20, 12, 8
#: What an open decoder holds at least, whatever its frames: its context, buffer pools and stream template (measured,
#: USS, one thread, 64x64: 0.93 MB an H.264 decoder, 0.45 MB an AV1 one, where 12 frames are 0.07 MB). Small
#: frames alone made the budget count 165 such decoders as 12 MB where they held ~150 MB.
DECODER_MIN_BYTES = 2**20
#: What a file open as a container holds per packet besides its decoder: FFmpeg's index entries (and an MP4's sample
#: tables), read whole at open (measured, USS: 41-50 bytes a packet in 30,000-packet H.264 and AV1 MP4s, 50-100 in
#: 6,000-packet MP4, MKV and WebM files). In long low-resolution files this outweighs the frames: 192 open files of
#: 30,000 64x64 frames hold ~270 MB of tables, against 14 MB estimated for their decoders' frames. A local MP4 is
#: read by byte range with no container (:mod:`.packet_file_reader`), so only other containers and remote files pay it.
DEMUXER_BYTES_PER_PACKET = 50
#: Per worker: encoded images of image cameras kept, by default (:attr:`CpuDecodeOptions.image_cache_bytes`).
IMAGE_CACHE_BYTES = 256 * 2**20


def decoder_bytes(width: int, height: int, threads: int) -> int:
    """What an open decoder of ``width`` x ``height`` frames decoding on ``threads`` threads is counted as holding
    against :attr:`CpuDecodeOptions.max_decoder_memory_bytes`: :data:`DECODER_FRAMES` YUV 4:2:0 frames per thread
    (frame threads each hold frames in flight: measured 2-4x at 4 threads), :data:`DECODER_MIN_BYTES` at least."""
    return max(DECODER_FRAMES * threads * width * height * 3 // 2, DECODER_MIN_BYTES)


class CpuDecoderBackend(Enum):
    """Which library decodes on the CPU."""

    #: torchcodec where it is installed and loads (its PyPI wheels need a CUDA build of torch), PyAV otherwise.
    AUTO = "auto"
    #: PyAV (FFmpeg bundled with the ``av`` wheel); always available.
    PYAV = "pyav"
    #: torchcodec; raises CodecUnsupportedError at first use where it does not load.
    TORCHCODEC = "torchcodec"


#: :class:`CpuDecoderBackend`'s values, as a type checker checks a string given for one (``backend="pyav"``).
CpuDecoderBackendName = Literal["auto", "pyav", "torchcodec"]


class ColorConversion(Enum):
    """Where a frame the CPU fallback decodes turns from the decoder's YUV into RGB."""

    #: In the graph when the pipeline runs on a GPU (the worker then only decodes), else in the worker.
    AUTO = "auto"
    #: In the decoding worker (swscale), which can fold a resize into it: what a CPU pipeline wants.
    WORKER = "worker"
    #: In the DALI graph: the worker ships the decoder's planes, half the bytes of RGB (PyAV only; torchcodec
    #: hands over RGB). On a CPU pipeline this moves the cost from the workers to DALI's threads.
    GRAPH = "graph"


#: :class:`ColorConversion`'s values, as a type checker checks a string given for one.
ColorConversionName = Literal["auto", "worker", "graph"]


@dataclass(frozen=True, kw_only=True)
class CpuDecodeOptions:
    """How the CPU fallback decodes.

    ``threads_per_decoder``: FFmpeg threads per open decoder (0 lets FFmpeg choose; keep it small when
    several external-source workers decode at once). ``max_open_decoders``: open files kept per process, while
    they fit ``max_decoder_memory_bytes`` (8 are kept whatever their size, unless this is lower); None: 64, or
    in the iterator's workers the files their episode pool draws from (pool size x cameras) where that is more.
    Either way no more than half the process's open-file limit (shared by its decoders; a bound over it is said
    once, with the limit that would keep it).
    A file reopened costs ~6 ms at 640x480 (open, decoder set-up, first conversion): 3 cameras and a pool of 64
    (192 files) reopened a file for 3 of 4 requests under a bound of 64, +71% CPU per sample. An open 640x480
    H.264 decoder holds ~6 MB (measured RSS), as :data:`DECODER_FRAMES` estimates (a file open as a container, not a
    local MP4, adds its index: :data:`DEMUXER_BYTES_PER_PACKET` a packet): such a pool needs ~1.1 GB per worker, over
    the default budget, which a worker then says once.
    ``backend`` and ``color_conversion`` take their enum's members or values, in any case (``backend="pyav"``; a
    type checker takes the values as spelt, in lower case); once built they hold the members.
    ``color_conversion``: where frames become RGB; converting in the graph makes ``backend=AUTO`` decode with
    PyAV, since torchcodec hands over RGB only.
    ``image_cache_bytes``: image cameras (``dtype: "image"``, always decoded in the workers, by Pillow): the
    encoded images of recently read episodes kept per worker (:class:`~.image_frames.EpisodeImageCache`). A
    sample of an episode not kept reads the camera's whole column of that episode again (~2 ms per MB: 85 ms for
    a 40 MB episode, ten times its PNG decode); a worker whose episode pool does not fit says so once, with the
    bytes that would hold it.
    """

    backend: CpuDecoderBackend | CpuDecoderBackendName = CpuDecoderBackend.AUTO
    threads_per_decoder: int = 1
    max_open_decoders: int | None = None
    max_decoder_memory_bytes: int = DECODER_MEMORY_BYTES
    color_conversion: ColorConversion | ColorConversionName = ColorConversion.AUTO
    image_cache_bytes: int = IMAGE_CACHE_BYTES

    def __post_init__(self) -> None:
        for name, kind in (("backend", CpuDecoderBackend), ("color_conversion", ColorConversion)):
            object.__setattr__(self, name, check_choice(kind, name, getattr(self, name)))
        if self.backend is CpuDecoderBackend.TORCHCODEC and self.color_conversion is ColorConversion.GRAPH:
            raise ValueError(
                "color_conversion=ColorConversion.GRAPH needs the decoder's YUV planes, which torchcodec does not "
                "hand over: use backend=CpuDecoderBackend.PYAV or AUTO, or ColorConversion.WORKER."
            )
        check_int_fields(
            self,
            (
                ("threads_per_decoder", 0),
                ("max_open_decoders", 1),
                ("max_decoder_memory_bytes", 1),
                ("image_cache_bytes", 0),
            ),
            optional=("max_open_decoders",),
        )

    def converts_in_graph(self, *, on_gpu: bool) -> bool:
        """Whether worker-decoded cameras ship planes for the graph to convert (:class:`ColorConversion`)."""
        if self.color_conversion is ColorConversion.AUTO:
            return on_gpu and self.backend is not CpuDecoderBackend.TORCHCODEC
        return self.color_conversion is ColorConversion.GRAPH


def checked_cpu_decode(value: object, *, name: str = "cpu_decode") -> CpuDecodeOptions:
    """An iterator's ``cpu_decode`` (a decoder's ``options``: ``name``): the options given, or the defaults for None;
    TypeError for anything else (a string or a dict failed at the first batch with "'str' object has no attribute
    'converts_in_graph'")."""
    if value is None:
        return CpuDecodeOptions()
    if not isinstance(value, CpuDecodeOptions):
        raise TypeError(
            f"{name} must be a CpuDecodeOptions or None, got {type(value).__name__} {value!r}; e.g. "
            f'{name}=CpuDecodeOptions(backend="pyav") (from lerobot_dali import CpuDecodeOptions)'
        )
    return value
