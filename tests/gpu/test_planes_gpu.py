"""Colour conversion of worker-shipped planes on the GPU (the AV1 fallback's default there); skipped without CUDA."""

from __future__ import annotations

import logging
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.yuv_frames import frame_planes
from tests.gpu.requires_cuda import GPU_ONLY
from tests.test_yuv_frames import CASES, MAX_DIFF, _encode, planes_to_rgb_frames

pytestmark = GPU_ONLY


@pytest.mark.parametrize("case", ["h264_unspecified", "h264_bt709_full_range", "vp9_odd_sides", "hevc_10bit"])
def test_gpu_conversion_equals_cpu_conversion(tmp_path: Path, case: str) -> None:
    codec, pix_fmt, width, height, colorspace, full, _ = CASES[case]
    path = _encode(tmp_path / "v.mp4", codec, pix_fmt, width=width, height=height, colorspace=colorspace, full=full)
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    planes = [frame_planes(f) for f in frames]
    gpu = np.stack(planes_to_rgb_frames(planes, device_id=0))
    cpu = np.stack(planes_to_rgb_frames(planes))
    assert gpu.shape == cpu.shape == (len(frames), height, width, 3)
    assert np.abs(gpu.astype(int) - cpu.astype(int)).max() <= 1  # float rounding on the device
    expected = np.stack([f.to_ndarray(format="rgb24") for f in frames])
    assert np.abs(gpu.astype(int) - expected).max() <= MAX_DIFF


def test_av1_fallback_ships_planes_on_gpu(make_ds, caplog: pytest.LogCaptureFixture) -> None:
    from tests.test_iterator import DELTAS, _dataset

    root = _dataset(make_ds, "av1", size=(160, 192))
    kwargs = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, num_workers=2, drop_last=False)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.camera_plan"):
        gpu = DALILeRobotIterator(root, device="cuda", decode="cpu", return_uint8=True, **kwargs)
    assert any("workers ship YUV planes" in r.getMessage() for r in caplog.records)
    on_gpu = next(iter(gpu))
    gpu.close()
    cpu = DALILeRobotIterator(root, device="cpu", return_uint8=True, **kwargs)
    on_cpu = next(iter(cpu))
    cpu.close()
    assert on_gpu["index"].tolist() == on_cpu["index"].tolist()
    for key in ("observation.images.cam0", "observation.images.cam1"):
        assert on_gpu[key].device.type == "cuda"
        diff = (on_gpu[key].cpu().int() - on_cpu[key].int()).abs()
        assert diff.max() <= MAX_DIFF and diff.float().mean() <= 1.0, (key, diff.max())
    assert torch.equal(on_gpu["action"].cpu(), on_cpu["action"])
