"""DALILeRobotIterator on a CUDA GPU: NVDEC parity for H.264/HEVC/VP9, AV1 routed by what NVDEC supports.

Skipped without a CUDA device. The same hand-computed expectations as the CPU tests apply; frames are also
compared with the CPU-only mode's output for the same samples.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lerobot_dali.iterator import DALILeRobotIterator
from tests.test_depth_cameras import DEPTH, depth_ds  # noqa: F401 (a fixture)
from tests.test_iterator import DELTAS, _check_sample, _dataset

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


# NVDEC refuses tiny videos (HEVC needs >= 144x144, VP9/AV1 >= 128x128).
GPU_SIZE = (160, 192)


def _all(it: DALILeRobotIterator) -> list[dict]:
    """Every sample of one pass, on the host; the iterator is closed after (its workers stop)."""
    out = []
    try:
        for batch in it:
            for i in range(len(batch["index"])):
                out.append({k: (v[i].cpu() if isinstance(v, torch.Tensor) else v[i]) for k, v in batch.items()})
    finally:
        it.close()
    return out


def _cuda_and_cpu_samples(root, **kwargs) -> list[tuple[dict, dict]]:
    """The same samples from a cuda iterator and a CPU-mode one, paired."""
    on_gpu = _all(DALILeRobotIterator(root, device="cuda", **kwargs))
    on_cpu = _all(DALILeRobotIterator(root, device="cpu", **kwargs))
    assert len(on_gpu) == len(on_cpu) > 0
    assert on_gpu[0].keys() == on_cpu[0].keys()  # the same batch keys (the GPU graph's host copies stay inside)
    return list(zip(on_gpu, on_cpu, strict=True))


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9", "av1"])
def test_cuda_parity_and_agreement_with_cpu_mode(
    make_ds, codec: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lerobot_dali import decode_route

    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())  # said once per process: not by an earlier test
    root = _dataset(make_ds, codec, size=GPU_SIZE)
    kwargs = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, num_workers=2, drop_last=False)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        gpu = DALILeRobotIterator(root, device="cuda", **kwargs)
    capability = torch.cuda.get_device_capability(0)
    if codec == "av1" and capability in ((8, 0), (9, 0)):
        # A100/H100/H200: no AV1 in NVDEC -> the CPU fallback, said once in the log.
        assert {r.value for r in gpu.routes.values()} == {"cpu_fallback"}
        assert sum("cannot decode" in r.getMessage() for r in caplog.records) >= 1
    elif codec != "av1":
        assert {r.value for r in gpu.routes.values()} == {"nvdec"}
    batch = next(iter(gpu))
    assert batch["observation.images.cam0"].device.type == "cuda"
    assert batch["observation.state"].device.type == "cuda"
    gpu.close()
    on_gpu = _all(DALILeRobotIterator(root, device="cuda", **kwargs))
    for s in on_gpu:
        _check_sample(s, GPU_SIZE)
    on_cpu = _all(DALILeRobotIterator(root, device="cpu", **kwargs))
    assert len(on_cpu) == len(on_gpu)
    for a, b in zip(on_gpu, on_cpu, strict=True):
        for key in ("observation.images.cam0", "observation.images.cam1"):
            diff = (a[key] - b[key]).abs().mean().item() * 255
            assert diff < 3.0, (key, int(a["episode_index"]), int(a["frame_index"]), diff)
        np.testing.assert_array_equal(a["action"].numpy(), b["action"].numpy())


def test_image_cameras_on_cuda_equal_cpu_mode(make_ds) -> None:
    """Cameras stored as PNG rows: decoded by the workers, moved to the GPU, exactly the CPU-mode frames."""
    from tests.test_image_cameras import DELTAS as IMAGE_DELTAS
    from tests.test_image_cameras import _images_dataset

    root = _images_dataset(make_ds)
    kwargs = dict(batch_size=4, delta_timestamps=IMAGE_DELTAS, shuffle=False, num_workers=2, drop_last=False,
                  return_uint8=True)  # fmt: skip
    for a, b in _cuda_and_cpu_samples(root, **kwargs):
        for key in ("observation.images.cam0", "observation.images.cam1"):
            assert torch.equal(a[key], b[key]), key


def test_stats_normalisation_on_cuda_equals_cpu_mode(make_ds) -> None:
    """``normalize="stats"``: each camera by its own dataset statistics, in the GPU graph as in the CPU one."""
    from lerobot_dali.augment import AugmentConfig

    root = _dataset(make_ds, "h264", size=GPU_SIZE)
    kwargs = dict(batch_size=4, shuffle=False, num_workers=2, drop_last=False, augment=AugmentConfig(normalize="stats"))
    for a, b in _cuda_and_cpu_samples(root, **kwargs):
        for key in ("observation.images.cam0", "observation.images.cam1"):
            # NVDEC against the CPU decode differ by a few levels; divided by std (~0.1-0.3) that is < 0.2
            assert (a[key] - b[key]).abs().mean().item() < 0.2, key
            assert (a[key] < 0).any(), key  # normalised: below-mean pixels are negative, unlike [0, 1] frames


def test_depth_cameras_on_cuda_equal_cpu_mode(depth_ds) -> None:  # noqa: F811 (the fixture)
    """Depth is made by the workers and only resized (nearest) on the device: the same values as CPU mode."""
    kwargs = dict(batch_size=4, shuffle=False, num_workers=2, drop_last=False, image_size=(24, 40),
                  delta_timestamps={DEPTH: [-0.1, 0.0]})  # fmt: skip
    for a, b in _cuda_and_cpu_samples(depth_ds, **kwargs):
        assert a[DEPTH].shape == (2, 1, 24, 40) and a[DEPTH].dtype == torch.float32
        assert torch.equal(a[DEPTH], b[DEPTH])


def test_an_av1_dataset_reencoded_in_h264_decodes_on_nvdec(make_ds, tmp_path) -> None:
    """Where NVDEC has no AV1 (A100/H100/H200) the AV1 set falls back to the CPU; its ``lerobot-dali reencode`` copy
    in H.264 routes to NVDEC and gives every sample by LeRobot semantics, frames close to the source's CPU decode."""
    from lerobot_dali.reencode import reencode_dataset

    source = _dataset(make_ds, "av1", size=GPU_SIZE)
    copy = reencode_dataset(source, tmp_path / "h264", codec="h264", gop=2).out
    kwargs = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, num_workers=2, drop_last=False)
    it = DALILeRobotIterator(copy, device="cuda", **kwargs)
    assert {r.value for r in it.routes.values()} == {"nvdec"}
    on_copy = _all(it)
    on_source = _all(DALILeRobotIterator(source, device="cpu", **kwargs))
    assert len(on_copy) == len(on_source) > 0
    for a, b in zip(on_copy, on_source, strict=True):
        _check_sample(a, GPU_SIZE)
        assert int(a["index"]) == int(b["index"])
        for key in ("observation.images.cam0", "observation.images.cam1"):
            diff = (a[key] - b[key]).abs().mean().item() * 255
            assert diff < 4.0, (key, int(a["index"]), diff)


def test_dali_cpu_decoder_frames_cross_to_the_gpu_graph(make_ds) -> None:
    """decode='cpu' on a GPU sends VP9 to DALI's CPU decoder, whose frames cross to the GPU before the window order
    (``dali_graph``: ``frames.gpu()``, a branch no other GPU test runs): the same frames as CPU mode, on the GPU."""
    root = _dataset(make_ds, "vp9", size=GPU_SIZE)
    kwargs = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, num_workers=2, drop_last=False)
    it = DALILeRobotIterator(root, device="cuda", decode="cpu", **kwargs)
    assert {r.value for r in it.routes.values()} == {"dali_cpu"}
    first = next(iter(it))
    assert first["observation.images.cam0"].device.type == "cuda"
    it.close()
    on_gpu = _all(DALILeRobotIterator(root, device="cuda", decode="cpu", **kwargs))
    on_cpu = _all(DALILeRobotIterator(root, device="cpu", **kwargs))
    assert len(on_gpu) == len(on_cpu) > 0
    for a, b in zip(on_gpu, on_cpu, strict=True):
        _check_sample(a, GPU_SIZE)
        for key in ("observation.images.cam0", "observation.images.cam1"):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_a_mixture_on_cuda_joins_its_datasets_on_the_gpu(make_ds) -> None:
    """Each dataset's part comes from its own pipeline on the GPU; the mixture concatenates them there and adds
    ``dataset_index`` on the same device (no GPU test built a mixture before)."""
    from lerobot_dali import DALILeRobotMixture

    roots = [_dataset(make_ds, "h264", size=GPU_SIZE), _dataset(make_ds, "vp9", size=GPU_SIZE)]
    mix = DALILeRobotMixture(
        roots, batch_size=4, device="cuda", num_workers=2, shuffle=False, delta_timestamps=DELTAS
    )  # fmt: skip
    try:
        batch = next(iter(mix))
    finally:
        mix.close()
    assert mix.batch_shares == (2, 2)
    assert batch["dataset_index"].device.type == "cuda" and batch["dataset_index"].tolist() == [0, 0, 1, 1]
    for key in ("observation.images.cam0", "observation.state", "index"):
        assert batch[key].device.type == "cuda" and len(batch[key]) == 4, key
    assert len(batch["task"]) == 4
    for i in range(4):
        _check_sample({k: (v[i].cpu() if isinstance(v, torch.Tensor) else v[i]) for k, v in batch.items()}, GPU_SIZE)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
@pytest.mark.parametrize("window", [True, False])
def test_shared_clips_on_nvdec_equal_clips_decoded_alone(make_ds, codec: str, window: bool) -> None:
    """``share_clips``: NVDEC decodes one clip per group of samples of a file inside DALI's conditional split (the
    GPU route's graph, which CI runs on the CPU decoder only); every sample gets the frames it gets alone."""
    root = _dataset(make_ds, codec, size=GPU_SIZE)
    kwargs = dict(
        batch_size=8, delta_timestamps=DELTAS if window else None, shuffle=True, seed=2, num_workers=2, drop_last=False
    )
    shared = DALILeRobotIterator(root, device="cuda", share_clips=True, **kwargs)
    assert {r.value for r in shared.routes.values()} == {"nvdec"}
    on_shared = _all(shared)
    on_alone = _all(DALILeRobotIterator(root, device="cuda", **kwargs))
    assert len(on_shared) == len(on_alone) > 0
    for a, b in zip(on_shared, on_alone, strict=True):
        assert int(a["index"]) == int(b["index"])
        if window:
            _check_sample(a, GPU_SIZE)
        for key in ("observation.images.cam0", "observation.images.cam1"):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
