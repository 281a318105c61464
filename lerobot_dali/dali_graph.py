"""The DALI pipeline: parallel external source -> (NVDEC decode) -> augmentation -> outputs.

The external source emits one output per :class:`Field`; cameras on the clip route arrive as small encoded
clips plus clip-relative frame indices and are decoded by DALI (``mixed`` = NVDEC, ``cpu`` for VP9 in the
CPU-only mode); cameras on the frames route arrive already decoded by the workers. Either way the frames
meet the same augmentation, so GPU and CPU-fallback cameras get identical treatment, except for two
placement choices for worker-decoded cameras: on a GPU pipeline the worker ships the decoder's YUV planes
and the graph makes RGB (``PLANES_*`` fields); in CPU mode the worker makes RGB and resizes it too
(:func:`camera_feed` decides).
The augmentation's random parameters come from the external source too (``AUGMENT_DRAW`` fields, drawn on
the host by :mod:`.augment_draws`), so they follow the sample, not the pipeline's life.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .augment import AugmentConfig, augment_frames, leading_resize
from .augment_draws import draw_names, stream_name
from .cpu_decode_options import CpuDecodeOptions
from .dali_color import planes_to_rgb, recolor
from .dali_video import decode_clips, decode_shared_clips
from .decode_route import DecodeRoute

__all__ = [
    "CameraFeed",
    "Field",
    "FieldKind",
    "augment_draw_field",
    "build_pipeline",
    "camera_feed",
    "source_queue_depth",
]


class FieldKind(enum.Enum):
    """What one external-source output holds, which decides what the graph does with it."""

    #: A numeric array per sample, passed through (moved to the GPU when the pipeline has one).
    TABULAR = "tabular"
    #: A string or structured value per sample as NUL-padded JSON bytes (:mod:`.host_values`): stays on the
    #: CPU and becomes Python objects again in the iterator.
    HOST_VALUES = "host_values"
    #: Encoded clip bytes (1-D uint8) per sample; the next field holds its frame indices.
    CLIP = "clip"
    #: Clip-relative display frame indices (int32) for the preceding CLIP field: a window's distinct frames,
    #: ascending, when a CLIP_ORDER field follows; else the window's own frames, (T,).
    CLIP_FRAMES = "clip_frames"
    #: Window order (int32, (T,)) of the CLIP field two before: positions into its decoded distinct frames. DALI's
    #: decoder decodes a repeated index again from its keyframe (a whole GOP per repeat; windows repeat their
    #: edge frame as padding), so a windowed camera's repeats decode once and are copied by ``sequence_rearrange``.
    CLIP_ORDER = "clip_order"
    #: Samples sharing clips (:mod:`.clip_sharing`): per sample, the sample (int32 scalar) whose clip holds its frames,
    #: itself where it decodes; the CLIP three before is empty where it does not. Its CLIP_FRAMES are then its group's
    #: distinct frames, and CLIP_ORDER (always present) places its own among them.
    CLIP_TAKE = "clip_take"
    #: Decoded frames (T, H, W, 3) uint8 per sample, from the CPU decode route.
    FRAMES = "frames"
    #: Decoded frames as planes (:mod:`.yuv_frames`), from the CPU decode route: luma (T, H, W, 1) uint8;
    #: the next two fields hold the chroma (PLANES_CHROMA) and the colour matrix (PLANES_MATRIX).
    PLANES_LUMA = "planes_luma"
    #: Chroma (T, h, w, 2) uint8 of the preceding PLANES_LUMA field.
    PLANES_CHROMA = "planes_chroma"
    #: (3, 4) float32 colour matrix of the PLANES_LUMA field two before; stays on the CPU (argument input).
    PLANES_MATRIX = "planes_matrix"
    #: A depth camera's depth (T, H, W, 1) float32 per sample (:mod:`.depth_maps`), decoded by the workers:
    #: resized (nearest) and handed over, never augmented.
    DEPTH = "depth"
    #: One random augmentation parameter per sample (see :mod:`.augment_draws`): stays on the CPU, where
    #: DALI reads argument inputs, and feeds the augmentation of the cameras of its stream; not an output.
    AUGMENT_DRAW = "augment_draw"


@dataclass(frozen=True)
class Field:
    name: str
    kind: FieldKind
    #: For camera fields: "cpu" or "mixed" decode device (CLIP), and the camera's position for random draws.
    decode_device: Literal["cpu", "mixed"] = "cpu"
    camera_index: int = 0
    #: FRAMES only: the worker already resized the frames to the leading resize (``CameraFeed.worker_size``).
    presized: bool = False
    #: Camera fields: colour channels of the frames (1 for grey image cameras).
    channels: int = 3
    #: CLIP (NVDEC, DALI's CPU decoder) only: ``[M | T]`` rows that take DALI's BT.601 RGB to the stream's tagged
    #: colour space (:func:`~lerobot_dali.yuv_frames.nvdec_color_fix`); None where they agree.
    color_fix: tuple[tuple[float, ...], ...] | None = None
    #: AUGMENT_DRAW only: the draw stream (``augment_draws.stream_name``) and the parameter's name.
    stream: str = ""
    param: str = ""


def augment_draw_field(stream: str, param: str) -> Field:
    """The external-source output carrying parameter ``param`` of draw stream ``stream``."""
    return Field(f"{stream}.__augment.{param}", FieldKind.AUGMENT_DRAW, stream=stream, param=param)


@dataclass(frozen=True)
class CameraFeed:
    """What the external source sends the graph for one camera: the one decision that sets its fields.

    Cameras DALI decodes (NVDEC, DALI_CPU) send encoded clips. Cameras the workers decode (CPU_FALLBACK) send
    either the decoder's YUV planes (``planes``: the graph makes RGB) or RGB frames, which the worker may
    already have resized (``worker_size``). Build with :func:`camera_feed`.
    """

    route: DecodeRoute
    #: CPU_FALLBACK only: the worker ships YUV 4:2:0 planes and a colour matrix (``PLANES_*`` fields).
    planes: bool = False
    #: CPU_FALLBACK RGB only: the (H, W) the worker resizes to while converting; None leaves it to the graph.
    worker_size: tuple[int, int] | None = None
    #: CPU_FALLBACK only: a depth-map camera; the worker ships depth (``DEPTH`` field), not colour.
    depth: bool = False
    #: Cameras DALI decodes only: the colour correction its frames need (:attr:`Field.color_fix`).
    color_fix: tuple[tuple[float, ...], ...] | None = None
    #: Cameras DALI decodes only: samples of a batch that read one file decode one clip (:mod:`.clip_sharing`).
    share_clips: bool = False

    def __post_init__(self) -> None:
        worker = self.route is DecodeRoute.CPU_FALLBACK
        if (self.planes or self.worker_size is not None or self.depth) and not worker:
            raise ValueError(f"planes, worker_size and depth apply to CPU_FALLBACK cameras only, got {self.route}")
        if self.planes and self.worker_size is not None:
            raise ValueError("a worker shipping planes never resizes (the graph converts, then resizes)")
        if self.depth and (self.planes or self.worker_size is not None):
            raise ValueError("a depth camera ships depth: no planes, no worker resize")
        if self.color_fix is not None and self.route.dali_device is None:
            raise ValueError(f"color_fix corrects DALI's colour conversion, got route {self.route}")
        if self.share_clips and self.route.dali_device is None:
            raise ValueError(f"only clips DALI decodes are shared, got route {self.route}")


def camera_feed(
    route: DecodeRoute,
    *,
    on_gpu: bool,
    cpu_decode: CpuDecodeOptions,
    augment: AugmentConfig | None,
    image_size: tuple[int, int] | None,
    depth: bool = False,
    color_fix: tuple[tuple[float, ...], ...] | None = None,
    share_clips: bool = False,
) -> CameraFeed:
    """Decide what a camera's worker ships, from its route and where the pipeline runs (``depth``: a depth-map
    camera, whose route is always CPU_FALLBACK; its worker ships depth; ``share_clips``: cameras DALI decodes share
    clips, :mod:`.clip_sharing`).

    Planes: only worker-decoded cameras, by default only where the pipeline runs on a GPU: there the colour
    conversion is nearly free, while in the worker it costs more than decoding (see :mod:`.yuv_frames`);
    ``cpu_decode.color_conversion`` overrides (:class:`~.cpu_decode_options.ColorConversion`).

    Worker resize: only RGB from worker-decoded cameras in a CPU pipeline (on a GPU the device resizes,
    leaving the CPU to decode), and only when the graph's first step is a plain resize
    (:func:`~lerobot_dali.augment.leading_resize`; not a random crop that must cut the full frame). Why: on
    two cores the graph's resize of full frames was the bottleneck (issue #6); the worker folds the resize
    into the YUV -> RGB conversion it does anyway and ships small frames through shared memory.
    """
    if route is not DecodeRoute.CPU_FALLBACK or depth:
        by_dali = route.dali_device is not None
        fix = color_fix if by_dali else None
        return CameraFeed(route, depth=depth, color_fix=fix, share_clips=share_clips and by_dali)
    if cpu_decode.converts_in_graph(on_gpu=on_gpu):
        return CameraFeed(route, planes=True)
    return CameraFeed(route, worker_size=None if on_gpu else leading_resize(augment, image_size))


#: Output name of ``task_index``'s host copy on a GPU pipeline, which the iterator reads to join the task strings:
#: reading the GPU tensor back (``.cpu()``) waited for all the work queued on torch's stream, every batch.
HOST_TASK_INDEX = "task_index.__host"
#: ``subtask_index``'s, for the ``subtask`` strings alike.
HOST_SUBTASK_INDEX = "subtask_index.__host"
_HOST_COPIES = {"task_index": HOST_TASK_INDEX, "subtask_index": HOST_SUBTASK_INDEX}

# Fields that feed another field's graph rather than being outputs of their own.
_AUXILIARY = (
    FieldKind.CLIP_FRAMES,
    FieldKind.CLIP_ORDER,
    FieldKind.CLIP_TAKE,
    FieldKind.AUGMENT_DRAW,
    FieldKind.PLANES_CHROMA,
    FieldKind.PLANES_MATRIX,
)


def source_queue_depth(prefetch: int, num_workers: int, *, batch_bytes: int = 0, shm_budget: int | None = None) -> int:
    """Batches the parallel external source computes ahead: one per worker and ``prefetch`` more. In batch mode DALI
    gives each batch to one worker and schedules only this many ahead, so a depth of ``prefetch`` (2) left all but 2
    of 12 workers idle (a source sleeping 0.5 s a batch, 8 workers: 251 ms a batch at depth 2, 63 ms at depth 8);
    and it takes batches back in order, so at one per worker a slow batch idles the others (6 workers, batch times
    40% apart: 85 batches/s at depth 6, 101 at 8, 111 at 12).

    DALI keeps ``prefetch`` + depth of the source's batches in shared memory: with ``batch_bytes`` (one batch, see
    :func:`~lerobot_dali.batch_source.batch_bytes_estimate`) and ``shm_budget`` (this rank's share of /dev/shm) the
    depth is cut to what fits, never below ``prefetch``: a worker idle is slower, a full /dev/shm kills the workers
    (SIGBUS)."""
    wanted = num_workers + prefetch
    if shm_budget is None or batch_bytes <= 0:
        return wanted
    return max(prefetch, min(wanted, shm_budget // batch_bytes - prefetch))


def build_pipeline(
    source: Callable[..., Sequence[Any]],
    fields: Sequence[Field],
    *,
    batch_size: int,
    device_id: int | None,
    num_workers: int,
    prefetch: int,
    seed: int,
    augment: AugmentConfig | None,
    image_size: tuple[int, int] | None,
    return_uint8: bool,
    num_threads: int = 2,
    source_pickler: Any = None,
    source_depth: int | None = None,
) -> tuple[Any, list[str]]:
    """Build the pipeline and return it with its output names, in order.

    ``num_workers == 0`` runs the source in the main process (no pickling; handy for debugging).
    ``source_pickler``: how the source is sent to the workers (DALI's ``py_callback_pickler``; None: DALI's own
    pickler's bytes, down each one's start). ``source_depth``: batches the workers compute ahead (None:
    :func:`source_queue_depth` without a shared-memory bound).
    """
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    parallel = num_workers > 0
    pipe = Pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        seed=seed,
        prefetch_queue_depth=prefetch,
        py_num_workers=max(num_workers, 1),
        py_start_method="spawn",
        py_callback_pickler=source_pickler,
    )
    framed = (FieldKind.FRAMES, FieldKind.PLANES_LUMA, FieldKind.PLANES_CHROMA, FieldKind.DEPTH)
    layouts = [("FHWC" if f.kind in framed else "") for f in fields]
    on_gpu = device_id is not None
    names: list[str] = []
    with pipe:
        parallel_args: dict[str, Any] = (
            {"parallel": True, "prefetch_queue_depth": source_depth or source_queue_depth(prefetch, num_workers)}
            if parallel
            else {}
        )
        outputs = fn.external_source(
            source=source, num_outputs=len(fields), batch=True, batch_info=True, layout=layouts, **parallel_args
        )
        # Draw streams first: their fields come after the cameras that read them.
        draws: dict[str, dict[str, Any]] = {}
        for i, field in enumerate(fields):
            if field.kind == FieldKind.AUGMENT_DRAW:
                draws.setdefault(field.stream, {})[field.param] = outputs[i]
        results = []
        for i, field in enumerate(fields):
            node = outputs[i]
            if field.kind in _AUXILIARY:
                continue
            if field.kind in (FieldKind.TABULAR, FieldKind.HOST_VALUES):
                results.append(node.gpu() if on_gpu and field.kind == FieldKind.TABULAR else node)
                names.append(field.name)
                if on_gpu and field.name in _HOST_COPIES:
                    # The (sub)task strings' lookup reads it on the host: a copy, since DALI pins a buffer the GPU
                    # reads and torch.from_dlpack refuses pinned (kDLCUDAHost) tensors.
                    results.append(fn.copy(node))
                    names.append(_HOST_COPIES[field.name])
                continue
            if field.kind == FieldKind.DEPTH:
                results.append(_depth_output(node.gpu() if on_gpu else node, image_size))
                names.append(field.name)
                continue
            if field.kind == FieldKind.CLIP:

                def finish(frames: Any, field: Field = field) -> Any:
                    if on_gpu and field.decode_device == "cpu":  # VP9/VP8/MJPEG on DALI's CPU decoder: augment on GPU
                        frames = frames.gpu()  # (before the window order: the distinct frames cross, not their copies)
                    if field.color_fix is not None:  # (on the distinct frames, before the window repeats them)
                        frames = recolor(frames, field.color_fix)
                    return frames

                if i + 3 < len(fields) and fields[i + 3].kind == FieldKind.CLIP_TAKE:
                    frames = decode_shared_clips(
                        node, outputs[i + 1], outputs[i + 3], device=field.decode_device, finish=finish
                    )
                else:
                    frames = finish(decode_clips(node, outputs[i + 1], device=field.decode_device))
                if i + 2 < len(fields) and fields[i + 2].kind == FieldKind.CLIP_ORDER:
                    frames = fn.sequence_rearrange(frames, new_order=outputs[i + 2])
            elif field.kind == FieldKind.PLANES_LUMA:
                frames = planes_to_rgb(node, outputs[i + 1], outputs[i + 2], on_gpu=on_gpu)
            else:
                frames = node.gpu() if on_gpu else node
            config = augment.for_camera(field.name).for_channels(field.channels) if augment is not None else None
            used = draw_names(config)  # a stream may draw more than this camera uses (grey: no saturation, hue)
            stream_draws = draws.get(stream_name(augment, field.camera_index), {})
            results.append(
                augment_frames(
                    frames,
                    config=config,
                    camera_index=field.camera_index,
                    draws={name: node for name, node in stream_draws.items() if name in used},
                    return_uint8=return_uint8,
                    output_size=image_size,
                    presized=field.presized,
                    channels=field.channels,
                )
            )
            names.append(field.name)
        pipe.set_outputs(*results)
    return pipe, names


def _depth_output(depth: Any, output_size: tuple[int, int] | None) -> Any:
    """Depth windows ``FHWC`` -> ``FCHW``, resized to ``output_size`` by nearest neighbour (interpolating
    would invent depths between a near edge and the far wall behind it). No augmentation: LeRobot leaves depth
    out of its image transforms."""
    from nvidia.dali import fn, types

    if output_size is not None:
        depth = fn.resize(depth, size=list(output_size), interp_type=types.INTERP_NN)  # type: ignore[attr-defined]
    return fn.transpose(depth, perm=[0, 3, 1, 2], output_layout="FCHW")
