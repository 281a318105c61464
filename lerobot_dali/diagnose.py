"""``lerobot-dali diagnose``: what this machine can decode, which route each camera takes, and proof.

Routing failures are the most common surprise on a new cluster (AV1 datasets on H100s decode on the CPU),
so the report decodes one real frame per camera by every route available here and says how the routes agree. It
also runs the iterator's own build-time checks of each camera (the first episode's first and last rows find their frames
in its file, as a union's other datasets' first episodes do in theirs; the workers' decoder loads), so a camera the
iterator would refuse with these options says so, and why.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from PIL import Image

from .batch_shapes import first_episode_rows
from .camera_plan import CameraRouter
from .clips import Clip, build_clip
from .cpu_decode import CpuFrameDecoder, cpu_decoders
from .cpu_decode_options import CpuDecodeOptions, checked_cpu_decode
from .dali_video import DALI_CPU_CODECS, decode_clip_batch
from .dataset_reader import LeRobotDatasetReader
from .decode_route import DecodePreference, DecodeRoute, nvcuvid_library
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource, TimestampSourceName
from .image_frames import decode_depth_images, decode_images
from .value_checks import check_choice, check_seconds

__all__ = ["CameraReport", "MachineReport", "diagnose_dataset", "diagnose_machine"]

#: The route of an image camera's frames: decoded from the data files by Pillow in the workers.
_IMAGE_ROUTE = "images (Pillow, in the workers)"


@dataclass
class MachineReport:
    cuda_available: bool
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    nvcuvid_library: str | None
    dali_version: str | None
    #: The CPU fallback's decoders here, and whether torchcodec can decode (see :func:`.cpu_decode.cpu_decoders`).
    cpu_decoders: str


@dataclass
class CameraReport:
    camera: str
    #: ``None`` when the first video could not be opened, indexed or routed (see ``error``).
    codec: str | None
    resolution: tuple[int, int] | None
    route: str | None
    #: route name -> (ok, seconds, detail): one frame decoded by each route available here.
    decodes: dict[str, tuple[bool, float, str]] = field(default_factory=dict)
    #: Why the first video could not be opened, indexed or routed; no decode was tried then.
    error: str | None = None
    #: Why building the iterator with the options diagnosed fails for this camera, its error as the build raises it
    #: (e.g. the first episode's last row finds no frame within ``tolerance_s``: the message says which option reads
    #: it); None where the build's checks of the camera pass. Its decodes are still tried.
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.refused is None and all(ok for ok, _, _ in self.decodes.values())


def diagnose_machine() -> MachineReport:
    import torch

    try:
        import nvidia.dali as dali

        dali_version: str | None = dali.__version__
    except ImportError:
        dali_version = None
    cuda = torch.cuda.is_available()
    name = capability = None
    if cuda:
        props = torch.cuda.get_device_properties(0)
        name, capability = props.name, (props.major, props.minor)
    return MachineReport(cuda, name, capability, nvcuvid_library(), dali_version, cpu_decoders())


def diagnose_dataset(
    reader: LeRobotDatasetReader,
    *,
    machine: MachineReport,
    timestamp_source: TimestampSource | TimestampSourceName = TimestampSource.PARQUET_TIMESTAMP,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    cpu_decode: CpuDecodeOptions | None = None,
) -> list[CameraReport]:
    """Route and decode frame 0 of the first episode for every camera, by every route available, and check each
    video camera as :class:`~lerobot_dali.DALILeRobotIterator` checks it when built with these options (its
    defaults by default): a camera it would refuse gets ``refused``, the build's own error.

    A diagnosis reports every failure instead of stopping at the first: a camera whose video cannot be read
    gets its ``error`` (or a failed decode) and the next camera is still diagnosed. Image cameras (images in the
    data files) decode their first image as the workers do."""
    router = CameraRouter(
        reader=reader,
        device_id=0 if machine.cuda_available else None,  # (the iterator's default)
        timestamp_source=check_choice(TimestampSource, "timestamp_source", timestamp_source),
        tolerance_s=check_seconds("tolerance_s", tolerance_s),
        cpu_decode=checked_cpu_decode(cpu_decode),
    )
    rows = first_episode_rows(reader) if reader.camera_keys else None  # (as the iterator reads them, once)
    videos = [_diagnose_camera(router, camera, rows) for camera in reader.camera_keys]
    return videos + [_diagnose_image_camera(reader, camera) for camera in reader.image_keys]


def _diagnose_image_camera(reader: LeRobotDatasetReader, camera: str) -> CameraReport:
    """An image camera's first image of the first episode, read and decoded as the workers do (Pillow)."""
    try:
        first = reader.read_episode_images(0, camera)[:1].to_pylist()
    except Exception as e:
        return CameraReport(camera, None, None, None, error=_describe(e))
    if not first:
        return CameraReport(camera, None, None, None, error="the first episode holds no image")
    depth = camera in reader.info.depth_image_units([camera])
    decode = decode_depth_images if depth else decode_images
    route = f"{_IMAGE_ROUTE} (depth map)" if depth else _IMAGE_ROUTE
    report = CameraReport(camera, _image_format(first[0]), None, route)
    frame = _timed(report, "pillow", lambda: decode(first, label=f"{reader.source_of(0)}: camera {camera!r}")[0])
    if frame is not None:
        report.resolution = (frame.shape[0], frame.shape[1])
    return report


def _diagnose_camera(router: CameraRouter, camera: str, rows: dict[str, np.ndarray] | None) -> CameraReport:
    """``camera`` routed and checked as the iterator routes and checks it when built (the iterator's own
    :class:`~.camera_plan.CameraRouter`: its files surveyed through the same stores; the first episode's first and last
    rows, ``rows`` where read, looked up in its file, a union's other datasets' first episodes in theirs:
    :meth:`~.camera_plan.CameraRouter.check_cameras`), then frame 0 of its first file decoded by every route available
    here."""
    depth = camera in router.depth_quantizers  # 12-bit codes: the workers decode them, as the iterator does
    try:
        others = router.other_first_files(camera)  # (a union's: read once, for the route and the checks)
        video, index, route = router.route(camera, DecodePreference.AUTO, others=[i for _, i in others.values()])
    except Exception as e:
        return CameraReport(camera, None, None, None, error=_describe(e))
    path, fs = video.path, router.reader.filesystem_of(video.path)
    shown_route = f"{route.value} (depth map)" if depth else route.value
    report = CameraReport(camera, index.codec, (index.height, index.width), shown_route)
    try:
        router.check_cameras({camera: route}, {camera: index}, rows, {pos: {camera: f} for pos, f in others.items()})
    except Exception as e:  # a diagnosis reports every failure instead of stopping at the first
        report.refused = _describe(e)
    decoder = CpuFrameDecoder()
    try:
        if depth:
            _timed(report, "cpu_fallback", lambda: decoder.decode(path, index, [0], filesystem=fs, pixels="depth")[0])
            return report
        reference = _timed(report, "cpu_fallback", lambda: decoder.decode(path, index, [0], filesystem=fs)[0])
    finally:
        decoder.close()
    # DALI route -> device_id (None: DALI on the CPU)
    dali_routes: dict[str, int | None] = {"dali_cpu": None} if index.codec in DALI_CPU_CODECS else {}
    if route is DecodeRoute.NVDEC:
        dali_routes["nvdec"] = 0
    if not dali_routes:
        return report
    start = time.perf_counter()
    try:
        clip = build_clip(path, index, [index.shown.start], filesystem=fs)
    except Exception as e:  # no clip for DALI: each DALI route fails with the reason
        for name in dali_routes:
            report.decodes[name] = (False, time.perf_counter() - start, _describe(e))
        return report
    for name, device_id in dali_routes.items():
        _timed(report, name, partial(_dali_frame, clip, device_id), reference)
    return report


def _image_format(data: bytes) -> str:
    """The format Pillow finds ``data`` in (png, jpeg, ...), "unknown" where it finds none (the decode says why)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return (image.format or "unknown").lower()
    except Exception:
        return "unknown"


def _dali_frame(clip: Clip, device_id: int | None) -> Any:
    return decode_clip_batch([clip.data], [clip.relative_indices], device_id=device_id)[0][0]


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _timed(report: CameraReport, name: str, decode: Any, reference: np.ndarray | None = None) -> np.ndarray | None:
    start = time.perf_counter()
    try:
        frame = np.asarray(decode())
    except Exception as e:  # a diagnosis reports every failure instead of stopping at the first
        report.decodes[name] = (False, time.perf_counter() - start, _describe(e))
        return None
    detail = f"{frame.shape[0]}x{frame.shape[1]}"  # HxW
    if reference is not None and reference.shape == frame.shape:
        detail += f", mean |diff| vs cpu_fallback {np.abs(frame.astype(int) - reference.astype(int)).mean():.2f}"
    report.decodes[name] = (True, time.perf_counter() - start, detail)
    return frame
