"""Pick, per camera, where its frames are decoded: NVDEC, DALI's CPU decoder, or the CPU fallback.

What NVDEC decodes depends on the GPU (A100/H100/H200 have no AV1 decoder; L4, L40S, Ada and Blackwell
do) and on the stream (bit depth, chroma format), so the truth is a probe: DALI decodes one real clip of
the file on the GPU, and either its error says "not supported" or its pictures must be PyAV's
(:mod:`.nvdec_check`). A table keyed by compute capability only explains a refusal (DALI's error does not name
the codec). The probe runs in a spawned process by default: DALI's fork-based workers must start before CUDA is
initialised in the training process, so routing must not initialise it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

from . import fork_locks
from .camera_codecs import counts_text
from .clips import build_clip
from .concurrent_calls import KeyedLocks
from .cpu_backends import pyav_can_decode, torchcodec_available
from .dali_video import DALI_CPU_CODECS, DALI_NVDEC_CODECS, dali_error_reason, decode_clip_batch
from .decode_preference import DecodePreference, DecodePreferenceName
from .errors import CodecUnsupportedError
from .nvdec_check import nvdec_disagreement, probe_clips
from .packet_index import PacketIndex
from .said_once import say_once, warn_once
from .video_source import VideoSource
from .worker_start import skipping_main

__all__ = [
    "DecodePreference",
    "DecodePreferenceName",
    "DecodeRoute",
    "GpuInfo",
    "GpuProbe",
    "choose_route",
    "nvcuvid_library",
    "nvdec_table_guess",
    "probe_gpu",
    "route_for_codecs",
    "route_for_video",
    "route_without_nvdec",
]

logger = logging.getLogger(__name__)


class DecodeRoute(Enum):
    """Where a camera's frames are decoded."""

    #: Clips decoded by ``fn.decoders.video(device="mixed")`` on NVDEC; frames land on the GPU.
    NVDEC = "nvdec"
    #: Clips decoded by ``fn.decoders.video(device="cpu")`` (VP8, VP9, MJPEG only); no GPU needed.
    DALI_CPU = "dali_cpu"
    #: Frames decoded by torchcodec/PyAV in the external-source workers; they enter the DALI graph decoded.
    CPU_FALLBACK = "cpu_fallback"

    @property
    def dali_device(self) -> str | None:
        """The ``device`` for :func:`~lerobot_dali.dali_video.decode_clips`, or None (no DALI decode)."""
        return {DecodeRoute.NVDEC: "mixed", DecodeRoute.DALI_CPU: "cpu"}.get(self)


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """The CUDA device decoding would run on."""

    device_id: int
    name: str
    compute_capability: tuple[int, int]

    def __post_init__(self) -> None:
        if self.device_id < 0:
            raise ValueError(f"device_id must be >= 0, got {self.device_id}.")


@dataclass(frozen=True, kw_only=True)
class GpuProbe:
    """What a probe found: the GPU (None when no CUDA device is usable) and, per probed codec, whether
    NVDEC decoded a real clip of it (with DALI's error message when it did not)."""

    gpu: GpuInfo | None
    nvdec: Mapping[str, bool]
    errors: Mapping[str, str]
    #: Per codec NVDEC decoded, its pictures of each clip ((F, H, W, 3) uint8, host memory), to be held to PyAV's
    #: (:mod:`~lerobot_dali.nvdec_check`).
    decoded: Mapping[str, list[np.ndarray]] = field(default_factory=dict)


# Compute capabilities whose NVDEC has no AV1: Volta/Turing (7.x), GA100 (8.0: A100, A30) and
# GH100 (9.0: H100, H200, H20, H800). GA10x (8.6, 8.7), Ada (8.9) and Blackwell (10.x, 12.x) have it.
_NO_AV1_CAPABILITIES = frozenset({(7, 0), (7, 2), (7, 5), (8, 0), (9, 0)})


def nvdec_table_guess(codec: str, gpu: GpuInfo) -> bool | None:
    """NVDEC support for an 8-bit 4:2:0 stream of ``codec`` from the GPU's compute capability, to explain a
    refused probe ("the NVDEC of H100 has no av1 decoder"). None when the table does not know; the probe
    (:func:`probe_gpu`) decides the route in every case.
    """
    major, minor = gpu.compute_capability
    if codec not in DALI_NVDEC_CODECS:
        return False
    if (major, minor) < (6, 0):
        return None
    if codec == "av1":
        if (major, minor) in _NO_AV1_CAPABILITIES or major < 7:
            return False
        return True if (major, minor) >= (8, 6) else None
    if codec in ("h264", "hevc"):
        return True
    if codec == "vp9":
        return True if major >= 7 else None
    return None


def choose_route(
    codec: str,
    *,
    decode: DecodePreference | str = DecodePreference.AUTO,
    gpu: GpuInfo | None,
    nvdec_supported: bool | None,
    label: str = "",
    reason: str = "",
) -> DecodeRoute:
    """The route for a camera whose videos use ``codec``, given the GPU and whether its NVDEC decodes it.

    ``nvdec_supported`` comes from a probe (None: unknown, treated as no);
    ``reason`` is the probe's error, quoted where NVDEC is not used (e.g. a driver without libnvcuvid).
    Raises CodecUnsupportedError when the preference cannot be met or nothing decodes the codec.
    """
    preference = DecodePreference.parse(decode)
    what = f"{label} ({codec})" if label else codec
    because = f" ({reason})" if reason else ""
    if preference is DecodePreference.GPU:
        if codec not in DALI_NVDEC_CODECS:
            raise CodecUnsupportedError(
                f"decode='gpu' was asked for {what}, but DALI sends only {', '.join(sorted(DALI_NVDEC_CODECS))} "
                "to NVDEC; use decode='auto' or 'cpu', or re-encode the video."
            )
        if gpu is None:
            raise CodecUnsupportedError(
                f"decode='gpu' was asked for {what}, but no CUDA GPU is usable here; use decode='auto' or 'cpu'."
            )
        if not nvdec_supported:
            raise CodecUnsupportedError(
                f"decode='gpu' was asked for {what}, but NVDEC on {gpu.name} cannot decode it{because}; use "
                "decode='auto' to fall back to the CPU, or re-encode the video (H.264/HEVC decode everywhere: "
                "lerobot-dali reencode --codec h264)."
            )
        return DecodeRoute.NVDEC
    if preference is DecodePreference.AUTO and gpu is not None and nvdec_supported:
        return DecodeRoute.NVDEC
    route = _cpu_route(codec, what)
    if preference is DecodePreference.AUTO and gpu is not None:
        _log_fallback_once(what, gpu, route, because, codec=codec)
    return route


def route_for_codecs(
    codecs: Mapping[str, int],
    *,
    decode: DecodePreference | str = DecodePreference.AUTO,
    on_gpu: bool,
    label: str,
    formats: Mapping[str, int] | None = None,
) -> DecodeRoute:
    """The route for camera ``label`` whose files mix ``codecs`` (codec -> files: a union's datasets' first files, or
    every file, :mod:`~lerobot_dali.camera_codecs`), or share one codec in several ``formats`` of a DALI decoder's
    (format -> files): the workers, which give each file a decoder of its own, since NVDEC and DALI's CPU decoder
    decode a camera in one codec and colour space (NVDEC in one pixel format too). Where a DALI decoder is passed
    over (NVDEC on a GPU, DALI's CPU decoder for VP8/VP9/MJPEG), one warning says so and how to copy the dataset in
    one codec.
    Raises CodecUnsupportedError for ``decode="gpu"`` and where PyAV and torchcodec lack a decoder for one of them."""
    preference = DecodePreference.parse(decode)
    what = f"{label} (files of {counts_text(formats, colon=True) if formats else counts_text(codecs)})"
    one = "one pixel format and colour space" if formats else "one codec"
    dali_cpu = " (DALI's CPU decoder one colour space)"
    takes = f"NVDEC takes {one}{dali_cpu}" if formats else f"NVDEC and DALI's CPU decoder take {one}"
    # (reencode keeps each file's colour tags: a copy in one codec, not in one colour space)
    copy = "" if formats else "; lerobot-dali reencode copies a dataset in one codec"
    if preference is DecodePreference.GPU:
        raise CodecUnsupportedError(
            f"decode='gpu' was asked for {what}, but NVDEC decodes a camera in {one}; use decode='auto' or "
            f"'cpu' (the workers decode each file){copy}."
        )
    lacking = [codec for codec in codecs if not (pyav_can_decode(codec) or torchcodec_available())]
    if lacking:
        raise CodecUnsupportedError(
            f"No decoder handles {what}: PyAV/torchcodec have none for {lacking}, and NVDEC and DALI's CPU decoder "
            "decode a camera in one codec. Re-encode the video."
        )
    message = "%s: decoded in the workers (route %s), a decoder per file: %s"
    nvdec_passed_over = on_gpu and preference is DecodePreference.AUTO  # (a copy in one format may decode there)
    if nvdec_passed_over or any(codec in DALI_CPU_CODECS for codec in codecs):
        warn_once(logger, f"{message}{copy}", what, DecodeRoute.CPU_FALLBACK.value, takes)
    else:
        say_once(logger, logging.INFO, message, what, DecodeRoute.CPU_FALLBACK.value, takes)
    return DecodeRoute.CPU_FALLBACK


def route_without_nvdec(codec: str) -> DecodeRoute:
    """The route of a camera whose first file is ``codec`` on a machine without NVDEC (or with ``decode="cpu"``):
    DALI's CPU decoder for VP8/VP9/MJPEG, else the workers (whether they have a decoder for it is not asked)."""
    return DecodeRoute.DALI_CPU if codec in DALI_CPU_CODECS else DecodeRoute.CPU_FALLBACK


def _cpu_route(codec: str, what: str) -> DecodeRoute:
    if route_without_nvdec(codec) is DecodeRoute.DALI_CPU:
        return DecodeRoute.DALI_CPU
    if pyav_can_decode(codec) or torchcodec_available():
        return DecodeRoute.CPU_FALLBACK
    raise CodecUnsupportedError(
        f"No decoder handles {what}: NVDEC is not usable for it, DALI's CPU decoder takes only "
        f"{', '.join(sorted(DALI_CPU_CODECS))}, and PyAV/torchcodec have no decoder for it. Re-encode the video."
    )


_logged_fallbacks: set[tuple[str, str, str]] = set()


#: Added to the CPU fallback's warning where this GPU's NVDEC lacks the codec but has H.264 (AV1 on A100/H100/H200).
REENCODE_HINT = " A copy re-encoded in H.264 (lerobot-dali reencode DATASET OUT) decodes on NVDEC."


def _log_fallback_once(what: str, gpu: GpuInfo, route: DecodeRoute, because: str, *, codec: str) -> None:
    key = (what, gpu.name, route.value)
    if key not in _logged_fallbacks:
        _logged_fallbacks.add(key)
        # (Not where the driver's NVDEC library is missing: then no copy decodes on NVDEC either.)
        copy = nvdec_table_guess(codec, gpu) is False and nvdec_table_guess("h264", gpu) and nvcuvid_library()
        decoder = f"NVDEC on {gpu.name}" if codec in DALI_NVDEC_CODECS else f"DALI's GPU decoder (on {gpu.name})"
        warn_once(logger,
            "%s cannot decode %s%s; decoding it on the CPU (route %s).%s", decoder, what, because,
            route.value, REENCODE_HINT if copy else "",
        )  # fmt: skip


def nvcuvid_library() -> str | None:
    """The NVDEC driver library (``libnvcuvid``) as the dynamic loader finds it, or None: NVDEC cannot work.

    The driver installs it; containers get it only with the ``video`` driver capability. Where the loader's cache
    lacks it, it is looked for as DALI does (``dlopen`` of ``libnvcuvid.so``, then ``libnvcuvid.so.1``, which
    searches LD_LIBRARY_PATH too: GKE's /usr/local/nvidia/lib64); loading it initialises no CUDA."""
    found = ctypes.util.find_library("nvcuvid")
    if found is not None:
        return found
    for name in ("libnvcuvid.so", "libnvcuvid.so.1"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


#: Added to a failed probe's reason when the driver's NVDEC library is missing: the usual container pitfall.
NO_NVCUVID_HINT = (
    "libnvcuvid, the driver's NVDEC library, is not found: in a container, add 'video' to "
    "NVIDIA_DRIVER_CAPABILITIES (e.g. compute,utility,video)"
)


def _driver_present() -> bool:
    """Whether a CUDA driver is installed; asks the driver's version only, which creates no CUDA context."""
    from nvidia.dali import backend

    return int(backend.GetCudaVersion()) > 0  # type: ignore[attr-defined]


def _detect_gpu(device_id: int) -> GpuInfo | None:
    import torch

    if torch.cuda.is_available() and device_id < torch.cuda.device_count():
        properties = torch.cuda.get_device_properties(device_id)
        return GpuInfo(
            device_id=device_id, name=properties.name, compute_capability=(properties.major, properties.minor)
        )
    from nvidia.dali import backend

    # A CPU-only torch build next to a GPU that DALI can use.
    if device_id < int(backend.GetCUDADeviceCount()):  # type: ignore[attr-defined]
        return GpuInfo(device_id=device_id, name=f"CUDA device {device_id}", compute_capability=(0, 0))
    return None


def _probe_here(
    device_id: int, samples: Mapping[str, list[np.ndarray]], frames: Mapping[str, list[np.ndarray]]
) -> GpuProbe:
    """Detect the GPU and decode each codec's clips (one batch) with DALI's mixed decoder (initialises CUDA)."""
    gpu = _detect_gpu(device_id) if _driver_present() else None
    if gpu is None:
        return GpuProbe(gpu=None, nvdec={}, errors={})
    nvdec: dict[str, bool] = {}
    errors: dict[str, str] = {}
    decoded: dict[str, list[np.ndarray]] = {}
    for codec, clips in samples.items():
        try:
            decoded[codec] = decode_clip_batch(clips, frames[codec], device_id=device_id)
            nvdec[codec] = True
        except Exception as e:  # DALI raises RuntimeError mostly, but maps some C++ errors to ValueError etc.
            nvdec[codec] = False
            # DALI's sentence alone can say little: a codec NVDEC lacks (AV1 on H100) gives 'Failed to create
            # video decoder for "memory file"' (the codec is named only in a warning on stderr).
            errors[codec] = dali_error_reason(e)
            if nvdec_table_guess(codec, gpu) is False:
                errors[codec] += f"; the NVDEC of {gpu.name} has no {codec} decoder"
            if nvcuvid_library() is None:
                errors[codec] += f"; {NO_NVCUVID_HINT}"
    return GpuProbe(gpu=gpu, nvdec=nvdec, errors=errors, decoded=decoded)


class _Probed(NamedTuple):
    """What the probe found for a camera's stream: the GPU (None: no CUDA device usable), whether NVDEC decoded its
    clips, why not (DALI's error), and how its pictures differ from PyAV's where they do (:mod:`.nvdec_check`)."""

    gpu: GpuInfo | None
    decodes: bool
    reason: str = ""
    differs: str = ""


# (device, codec, pixel format, width, height) -> what the probe found
_ProbeKey = tuple[int, str, str | None, int, int]
_probe_cache: dict[_ProbeKey, _Probed] = {}
_probe_lock = fork_locks.lock()
# One probe per key at a time: a mixture builds its datasets' iterators in threads, whose cameras often share a
# codec and size, and each probe is a process with a CUDA context of its own.
_probing = KeyedLocks()


def probe_gpu(
    samples: Mapping[str, np.ndarray | Sequence[np.ndarray]],
    *,
    frames: Mapping[str, Sequence[np.ndarray]] | None = None,
    device_id: int = 0,
    isolate: bool = True,
) -> GpuProbe:
    """Probe NVDEC on ``device_id`` with real clips of each codec (``{codec: clip bytes}``, or a list of clips decoded
    in one batch), decoding ``frames`` of each (``{codec: [clip-relative indices of each clip]}``; default each
    clip's first frame), which come back in :attr:`GpuProbe.decoded`.

    ``isolate`` runs the probe in a spawned process so this process never initialises CUDA (needed when
    DALI workers are forked later); pass False where CUDA is in use already. Results are not cached here.
    """
    if device_id < 0:
        raise ValueError(f"device_id must be >= 0, got {device_id}.")
    arrays = {
        codec: [np.ascontiguousarray(c, dtype=np.uint8) for c in ([clips] if isinstance(clips, np.ndarray) else clips)]
        for codec, clips in samples.items()
    }
    given = frames or {}
    wanted = {
        codec: [np.asarray(f, dtype=np.int32) for f in given.get(codec, [[0]] * len(clips))]
        for codec, clips in arrays.items()
    }
    if not isolate or not _driver_present():
        return _probe_here(device_id, arrays, wanted)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with skipping_main(_probe_here):  # (the process starts at submit, in this thread)
            probe = pool.submit(_probe_here, device_id, arrays, wanted)
        return probe.result()


def route_for_video(
    source: VideoSource,
    index: PacketIndex,
    *,
    decode: DecodePreference | str = DecodePreference.AUTO,
    device_id: int = 0,
    filesystem: Any | None = None,
    label: str = "",
) -> DecodeRoute:
    """The route for a camera, probing NVDEC once per process with clips of this file (:func:`.probe_clips`), whose
    pictures must be PyAV's (:func:`.nvdec_disagreement`): where they are not, the camera is decoded on the CPU with a
    warning saying by how much they differ (``decode="gpu"`` keeps NVDEC, with a warning).

    The probe result is cached per (device, codec, pixel format, frame size): NVDEC also refuses streams by size
    (DALI: "Video is too small in at least one dimension"; HEVC under 144x144, VP9 and AV1 under 128x128), so a
    small wrist camera must not inherit a large camera's answer. ``label`` names the camera in messages.
    """
    preference = DecodePreference.parse(decode)
    if preference is DecodePreference.CPU:
        return choose_route(index.codec, decode=preference, gpu=None, nvdec_supported=False, label=label)
    key = (device_id, index.codec, index.pix_fmt, index.width, index.height)
    with _probing.held(key):  # (a thread probing this key now: wait for its answer)
        probed = _cached_or_probed(key, source, index, filesystem=filesystem)
    if probed.gpu is not None and probed.decodes and probed.differs:
        return _route_of_differing_pictures(index.codec, preference, probed.gpu, probed.differs, label=label)
    return choose_route(
        index.codec,
        decode=preference,
        gpu=probed.gpu,
        nvdec_supported=probed.decodes,
        label=label,
        reason=probed.reason,
    )


def _route_of_differing_pictures(
    codec: str, preference: DecodePreference, gpu: GpuInfo, differs: str, *, label: str
) -> DecodeRoute:
    """Where NVDEC decodes a camera but its pictures are not PyAV's (``differs`` says how): the CPU, unless
    ``decode="gpu"`` insists."""
    what = f"{label} ({codec})" if label else codec
    if preference is DecodePreference.GPU:
        warn_once(logger,
            "decode='gpu' keeps %s on NVDEC on %s, though its pictures are not PyAV's: %s. If its frames look wrong, "
            "decode='auto' decodes it on the CPU (lerobot-dali diagnose shows a frame by each route)",
            what, gpu.name, differs,
        )  # fmt: skip
        return DecodeRoute.NVDEC
    route = _cpu_route(codec, what)
    warn_once(logger,
        "NVDEC on %s decodes %s, but not as PyAV does: %s (the probe of this codec, pixel format and frame size); "
        "decoding it on the CPU (route %s). decode='gpu' keeps it on NVDEC.",
        gpu.name, what, differs, route.value,
    )  # fmt: skip
    return route


def _cached_or_probed(key: _ProbeKey, source: VideoSource, index: PacketIndex, *, filesystem: Any | None) -> _Probed:
    """The probe's answer for ``key`` (device, codec, format, size): cached, else probed with clips of this file,
    their pictures held to PyAV's, and cached."""
    device_id = key[0]
    with _probe_lock:
        cached = _probe_cache.get(key)
    if cached is None:
        if not _driver_present():
            cached = _Probed(None, False)
        elif index.codec in DALI_NVDEC_CODECS:
            wanted = probe_clips(index)
            clips = [build_clip(source, index, frames, filesystem=filesystem) for frames in wanted]
            codec = index.codec
            try:
                probe = probe_gpu(
                    {codec: [clip.data for clip in clips]},
                    frames={codec: [clip.relative_indices for clip in clips]},
                    device_id=device_id,
                    isolate=True,
                )
            except BrokenProcessPool as e:  # the probe process died (driver fault): do not guess NVDEC works
                logger.warning("NVDEC probe process for %s on device %d died (%s)", codec, device_id, e)
                probe = GpuProbe(gpu=None, nvdec={}, errors={codec: f"probe process died: {e}"})
            supported = bool(probe.nvdec.get(codec, False))
            reason = probe.errors.get(codec, "")
            differs = ""
            if supported:
                differs = nvdec_disagreement(probe.decoded[codec], source, index, wanted, filesystem=filesystem)
            cached = _Probed(probe.gpu, supported, reason, differs)
        else:
            cached = _Probed(None, False, f"DALI has no NVDEC path for {index.codec}")
        said = cached.reason or cached.differs
        if said:
            say_once(logger, logging.INFO,
                "NVDEC probe for %s on device %d: %s", index.codec, device_id, said,
                key=f"NVDEC probe for {index.codec}: {said}",  # (each rank its own device: said by the first)
            )  # fmt: skip
        with _probe_lock:
            _probe_cache[key] = cached
    return cached
