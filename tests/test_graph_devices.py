"""The pipeline graph of a GPU run, defined here without a GPU and checked against DALI's operator registry.

A GPU session is rare, so the GPU graph must not wait for one to catch an operator placed on a device DALI
has no kernel for, a deprecated operator, or an output left on the host. Defining the graph needs no GPU
(only ``build()`` does); this walks every operator of it. DALI itself checks argument names, input devices
and that argument inputs are CPU nodes when the graph is defined; whether a kernel exists for the device
it checks only at ``build()``, which is what this adds.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from lerobot_dali.augment import (
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomAffine,
    RandomResizedCrop,
    RandomSubset,
    SharpnessJitter,
)
from lerobot_dali.batch_source import SourceSpec, output_fields
from lerobot_dali.dali_graph import HOST_TASK_INDEX, CameraFeed, Field, FieldKind, augment_draw_field, build_pipeline
from lerobot_dali.decode_route import DecodeRoute
from lerobot_dali.yuv_frames import nvdec_color_fix

FULL = AugmentConfig(
    resize=(120, 160),
    random_resized_crop=RandomResizedCrop(size=(96, 96)),
    affine=RandomAffine(degrees=5.0, translate=(0.1, 0.1), scale=(0.9, 1.1)),
    color_jitter=ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.05),
    sharpness=SharpnessJitter(factor=0.5),
    blur=GaussianBlur(),
    random_subset=RandomSubset(max_num_transforms=3, weights={"brightness": 1, "sharpness": 1, "affine": 1, "hue": 2}),
    normalize=Normalize(mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2)),
)
#: sharpness on frames whose size is known only at run time (no resize or crop)
SHARPNESS = AugmentConfig(sharpness=SharpnessJitter(factor=(0.2, 0.2)))
SHARED = AugmentConfig(color_jitter=ColorJitter(brightness=0.3, hue=0.1), shared_across_cameras=True)
GPU_FEEDS = {
    "cam.nvdec": CameraFeed(DecodeRoute.NVDEC),
    "cam.nvdec_bt709": CameraFeed(DecodeRoute.NVDEC, color_fix=tuple(map(tuple, nvdec_color_fix(1, False).tolist()))),
    "cam.vp9": CameraFeed(DecodeRoute.DALI_CPU),  # decode="cpu", or NVDEC refused it: DALI's CPU decoder
    "cam.planes": CameraFeed(DecodeRoute.CPU_FALLBACK, planes=True),
    "cam.rgb": CameraFeed(DecodeRoute.CPU_FALLBACK),
    "cam.depth": CameraFeed(DecodeRoute.CPU_FALLBACK, depth=True),
}
CPU_FEEDS = {
    "cam.vp9": CameraFeed(DecodeRoute.DALI_CPU),
    "cam.planes": CameraFeed(DecodeRoute.CPU_FALLBACK, planes=True),
    "cam.rgb": CameraFeed(DecodeRoute.CPU_FALLBACK, worker_size=(120, 160)),
    "cam.depth": CameraFeed(DecodeRoute.CPU_FALLBACK, depth=True),
}


#: build_pipeline's arguments that no test here varies but the ones it names.
_PIPELINE_OPTIONS: dict[str, Any] = dict(
    batch_size=2, device_id=None, num_workers=0, prefetch=1, seed=0, augment=None, image_size=None, return_uint8=False
)


def _graph(feeds: dict[str, CameraFeed], *, device_id: int | None, **options: Any) -> tuple[Any, list[str]]:
    # output_fields reads these; a full SourceSpec would need a dataset and a sample order.
    spec = SimpleNamespace(
        tabular_keys=("observation.state", "action", "task_note"),
        host_value_keys=("task_note",),  # strings: stay on the CPU
        delta_index={"action": np.arange(4), "cam.nvdec": np.arange(-1, 1)},  # a windowed clip camera: its order
        camera_feeds=feeds,
        image_keys=("cam.png_rows", "cam.grey_rows", "cam.depth_rows"),  # cameras stored as images in the data files
        image_shapes={"cam.png_rows": (48, 64, 3), "cam.grey_rows": (48, 64, 1)},
        depth_image_units={"cam.depth_rows": "mm"},
        augment=options.get("augment"),
    )
    fields = output_fields(cast(SourceSpec, spec))
    pipe, names = build_pipeline(
        lambda batch_info: (),  # never called: the graph is defined, not run
        fields,
        **{**_PIPELINE_OPTIONS, "device_id": device_id, **options},
    )
    pipe._build_graph()  # DALI's Python-side graph: operators, their devices and inputs; no backend, no GPU
    return pipe, names


def _device_problems(pipe: Any) -> list[str]:
    from nvidia.dali import backend as dali_backend

    backend: Any = dali_backend  # pybind module without stubs
    kernels = {
        "cpu": set(backend.RegisteredCPUOps()),
        "gpu": set(backend.RegisteredGPUOps()),
        "mixed": set(backend.RegisteredMixedOps()),
    }
    problems = []
    for instance in pipe._ops:
        op = instance._op
        name = getattr(op, "schema_name", None) or type(op).__name__
        where = f"{name} ({op.device}, {instance.name})"
        if name not in kernels[op.device]:
            problems.append(f"{where}: DALI has no {op.device} kernel")
            continue
        schema = backend.GetSchema(name)
        if schema.IsDeprecated():
            problems.append(f"{where}: deprecated ({schema.DeprecationMessage()})")
    return problems


@pytest.mark.parametrize(
    "options",
    [
        {"augment": FULL},
        {"augment": SHARED, "image_size": (224, 224)},
        {"augment": SHARED, "return_uint8": True},
        {"augment": SHARPNESS},
        {"image_size": (224, 224)},
        {},
    ],
    ids=["full-augment", "shared-draws", "shared-draws-uint8", "sharpness-any-size", "resize-only", "plain"],
)
def test_gpu_graph_uses_only_kernels_dali_has_and_ends_on_the_gpu(options: dict[str, Any]) -> None:
    pipe, names = _graph(GPU_FEEDS, device_id=0, **options)
    assert _device_problems(pipe) == []
    devices = {name: node.device for name, node in zip(names, pipe._graph_outputs, strict=True)}
    # everything ends on the GPU but strings, which the host turns back into Python values, and the host copy of
    # task_index that the task strings are joined by (reading it back from the GPU waited for torch's stream)
    assert devices == {**dict.fromkeys(names, "gpu"), "task_note": "cpu", HOST_TASK_INDEX: "cpu"}, devices
    assert {*GPU_FEEDS, "cam.png_rows", "cam.grey_rows", "cam.depth_rows"} <= set(names)
    used = {(getattr(i._op, "schema_name", None), i._op.device) for i in pipe._ops}
    # the routes this graph exists for: NVDEC decode, and the planes' colour conversion on the device
    assert {("decoders__Video", "mixed"), ("CoordTransform", "gpu"), ("SequenceRearrange", "gpu")} <= used
    transforms = [
        i for i in pipe._ops if (getattr(i._op, "schema_name", None), i._op.device) == ("CoordTransform", "gpu")
    ]
    assert len(transforms) == 2  # the planes' conversion, and the BT.709 camera's correction of NVDEC's colours
    if options.get("augment") in (FULL, SHARED):  # colour jitter: color_twist for RGB, brightness_contrast for grey
        assert {("ColorTwist", "gpu"), ("BrightnessContrast", "gpu")} <= used
    if options.get("augment") in (FULL, SHARPNESS):  # the sharpness blend: a filter and arithmetic on the device
        assert {("Filter", "gpu"), ("Slice", "gpu"), ("_ArithmeticGenericOp", "gpu")} <= used


def test_no_host_output_of_the_gpu_graph_also_feeds_the_device() -> None:
    """DALI pins a CPU buffer that a GPU or mixed node reads, and hands a pinned output to torch through DLPack as
    kDLCUDAHost, which ``torch.from_dlpack`` refuses ('Unsupported device_type: 3', torch 2.13): the host copy of
    task_index was the very buffer sent to the GPU, so every batch of a GPU run could fail (read from DALI's
    source and tried on torch with a retagged capsule; not yet run on a GPU)."""
    pipe, _ = _graph(GPU_FEEDS, device_id=0, augment=FULL)
    host_outputs = {node.name for node in pipe._graph_outputs if node.device == "cpu"}
    assert host_outputs
    to_device = {node.name for node in pipe._graph_outputs if node.device == "gpu"}
    for instance in pipe._ops:
        for node in instance._inputs:
            if node.device == "gpu" or instance._op.device == "mixed":
                to_device.add(node.name)
    assert host_outputs.isdisjoint(to_device), sorted(host_outputs & to_device)


@pytest.mark.parametrize("options", [{"augment": FULL}, {"image_size": (120, 160)}], ids=["full-augment", "resize"])
def test_cpu_graph_has_no_device_operator(options: dict[str, Any]) -> None:
    pipe, names = _graph(CPU_FEEDS, device_id=None, **options)
    assert _device_problems(pipe) == []
    assert {i._op.device for i in pipe._ops} == {"cpu"}
    assert {node.device for node in pipe._graph_outputs} == {"cpu"}
    assert "task_index" in names and HOST_TASK_INDEX not in names  # already on the host: no copy


@pytest.mark.parametrize(("source_depth", "expected"), [(None, 3), (5, 5)])
def test_the_parallel_source_computes_the_depth_it_is_given_ahead(source_depth: int | None, expected: int) -> None:
    """None: a batch per worker and ``prefetch`` more (2 + 1); else the caller's depth (cut to what /dev/shm holds)."""
    pipe, _ = build_pipeline(
        lambda batch_info: (),
        [Field("observation.state", FieldKind.TABULAR)],
        **{**_PIPELINE_OPTIONS, "num_workers": 2, "source_depth": source_depth},
    )
    pipe._build_graph()  # no workers start before build()
    (source,) = pipe._input_callbacks
    assert source.prefetch_queue_depth == expected


def test_the_check_catches_an_operator_without_a_kernel_for_its_device() -> None:
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline(batch_size=1, num_threads=1, device_id=0)
    with pipe:
        angle = fn.external_source(source=lambda: None, batch=True)
        # defined without complaint; DALI has this kernel on the CPU only and would fail at build()
        pipe.set_outputs(fn.transforms.rotation(angle=angle, device="gpu"))
    pipe._build_graph()
    (problem,) = _device_problems(pipe)
    assert problem.startswith("transforms__Rotation (gpu,") and problem.endswith("DALI has no gpu kernel")


class _Defined(Exception):
    """Raised by the patched ``Pipeline.build`` once the graph is defined: nothing runs."""


def test_the_graph_an_iterator_builds_for_a_gpu_set_by_its_process(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline a real iterator builds on ``device="cuda"`` where NVDEC takes its cameras (the probe's answer
    mocked), in a process whose CUDA device is 1 without LOCAL_RANK (an ``mp.spawn`` rank that called
    torch.cuda.set_device(1)): its probe and pipeline were on device 0, as rank 0's. The graph decodes on NVDEC and
    ends on the GPU but for the task strings' host copy; every operator has a kernel for its device."""
    import torch
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali import decode_route
    from lerobot_dali.decode_route import GpuInfo, GpuProbe
    from lerobot_dali.iterator import DALILeRobotIterator
    from tests.test_iterator import DELTAS, _dataset
    from tests.video_fixtures import clip_pictures

    root = _dataset(make_ds, "vp9")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    probed: list[int] = []

    def probe(samples: dict[str, Any], *, frames: dict[str, Any], device_id: int, isolate: bool) -> GpuProbe:
        probed.append(device_id)
        gpu = GpuInfo(device_id=device_id, name="NVIDIA H200", compute_capability=(9, 0))
        decoded = {codec: list(map(clip_pictures, clips, frames[codec])) for codec, clips in samples.items()}
        return GpuProbe(gpu=gpu, nvdec=dict.fromkeys(samples, True), errors={}, decoded=decoded)

    monkeypatch.setattr(decode_route, "probe_gpu", probe)
    built: list[Any] = []

    def build(pipe: Any) -> None:
        pipe._build_graph()
        built.append(pipe)
        raise _Defined

    monkeypatch.setattr(Pipeline, "build", build)
    it = DALILeRobotIterator(root, batch_size=2, device="cuda", num_workers=0, delta_timestamps=DELTAS, rank=1,
                             world_size=2)  # fmt: skip
    try:
        with pytest.raises(_Defined):
            next(iter(it))
    finally:
        it.close()
    assert {route.value for route in it.routes.values()} == {"nvdec"} and set(probed) == {1}
    (pipe,) = built
    assert pipe.device_id == 1
    assert _device_problems(pipe) == []
    used = {(getattr(i._op, "schema_name", None), i._op.device) for i in pipe._ops}
    assert {("decoders__Video", "mixed"), ("SequenceRearrange", "gpu")} <= used  # (cam0 is windowed: its order)
    devices = {node.device for node in pipe._graph_outputs}
    host = [name for name, node in zip(it._names, pipe._graph_outputs, strict=True) if node.device == "cpu"]
    assert devices == {"gpu", "cpu"} and host == [HOST_TASK_INDEX]


def test_each_camera_reads_the_draws_of_its_own_stream() -> None:
    """Two cameras, the same frames, brightness drawn per camera (not shared): camera 1's samples take the factors
    of stream camera1 (1.0, 0.5), camera 0's those of camera0 (0.5, 1.0)."""
    frames = np.full((2, 1, 2, 2, 3), 200, dtype=np.uint8)  # (B, T, H, W, C)
    fields = [
        Field("cam0", FieldKind.FRAMES, camera_index=0),
        Field("cam1", FieldKind.FRAMES, camera_index=1),
        augment_draw_field("camera0", "brightness"),
        augment_draw_field("camera1", "brightness"),
    ]
    factors = [np.array([0.5, 1.0], np.float32), np.array([1.0, 0.5], np.float32)]
    jitter = ColorJitter(brightness=0.5)  # random: a draw per sample, from the source
    outputs = _run_once(
        fields, [list(frames), list(frames), *factors], augment=AugmentConfig(color_jitter=jitter), return_uint8=True
    )
    for camera, factor in (("cam0", factors[0]), ("cam1", factors[1])):
        np.testing.assert_allclose([sample.mean() for sample in outputs[camera]], 200 * factor, atol=1)


def _run_once(fields: list[Field], batch: list[Any], **options: Any) -> dict[str, list[np.ndarray]]:
    """One batch through the CPU graph of ``fields``, the source giving ``batch`` (one entry per field)."""
    pipe, names = build_pipeline(lambda batch_info: batch, fields, **{**_PIPELINE_OPTIONS, **options})
    pipe.build()
    return {name: [np.asarray(sample) for sample in out] for name, out in zip(names, pipe.run(), strict=True)}


def test_each_camera_takes_its_own_normalize() -> None:
    frames = [np.full((1, 2, 2, 3), 51, dtype=np.uint8)] * 2  # 0.2 once scaled to [0, 1]
    normalize = {"cam0": Normalize(mean=(0.0,) * 3, std=(1.0,) * 3), "cam1": Normalize(mean=(0.1,) * 3, std=(0.5,) * 3)}
    fields = [Field("cam0", FieldKind.FRAMES), Field("cam1", FieldKind.FRAMES, camera_index=1)]
    outputs = _run_once(fields, [frames, frames], augment=AugmentConfig(normalize=normalize))
    np.testing.assert_allclose(np.stack(outputs["cam0"]), 0.2, atol=1e-6)
    np.testing.assert_allclose(np.stack(outputs["cam1"]), 0.2, atol=1e-6)  # (0.2 - 0.1) / 0.5


def test_depth_is_resized_by_nearest_neighbour_and_handed_over_channels_first() -> None:
    depth = [np.array([[[[1000.0], [3000.0]]]], dtype=np.float32)] * 2  # (T, H, W, 1): 1 x 2 pixels
    outputs = _run_once([Field("cam.depth", FieldKind.DEPTH)], [depth], image_size=(2, 4))
    expected = np.array([[[[1000.0, 1000.0, 3000.0, 3000.0]] * 2]], dtype=np.float32)  # (T, 1, 2, 4)
    for sample in outputs["cam.depth"]:
        np.testing.assert_array_equal(sample, expected)


@pytest.mark.parametrize(("presized", "resizes"), [(True, 0), (False, 1)])
def test_frames_the_worker_resized_are_not_resized_again(presized: bool, resizes: int) -> None:
    pipe, _ = build_pipeline(
        lambda batch_info: (),
        [Field("cam", FieldKind.FRAMES, presized=presized)],
        **{**_PIPELINE_OPTIONS, "augment": AugmentConfig(resize=(8, 8))},
    )
    pipe._build_graph()
    assert [getattr(i._op, "schema_name", None) for i in pipe._ops].count("Resize") == resizes
