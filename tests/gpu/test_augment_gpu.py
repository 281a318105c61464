"""augment_frames on ``gpu`` DataNodes agrees with the CPU graph (skipped without a CUDA device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from nvidia.dali import fn, pipeline_def

from lerobot_dali.augment import (
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomAffine,
    RandomResizedCrop,
    augment_frames,
)
from tests.gpu.requires_cuda import GPU_ONLY
from tests.test_augment import host_draws

pytestmark = GPU_ONLY

B, T, H, W = 4, 3, 32, 48


def _windows(static: bool = False, channels: int = 3) -> np.ndarray:
    rng = np.random.default_rng(0)
    if static:
        return np.repeat(rng.integers(0, 256, (B, 1, H, W, channels), dtype=np.uint8), T, axis=1)
    return rng.integers(0, 256, (B, T, H, W, channels), dtype=np.uint8)


def _run(data: np.ndarray, *, on_gpu: bool, config: AugmentConfig | None, **kwargs: Any) -> np.ndarray:
    def batch() -> list[np.ndarray]:
        return list(data)

    @pipeline_def(batch_size=B, num_threads=2, device_id=0 if on_gpu else None)
    def pipe():  # type: ignore[no-untyped-def]
        frames = fn.external_source(source=batch, layout="FHWC", batch=True)
        draws = host_draws(config, seed=3, camera_index=0, n=B)  # the same host draws on both backends
        return augment_frames(frames.gpu() if on_gpu else frames, config=config, camera_index=0, draws=draws, **kwargs)

    p = pipe()
    p.build()
    (out,) = p.run()
    assert out.layout() == "FCHW"
    return (out.as_cpu() if on_gpu else out).as_array()


@pytest.mark.parametrize("return_uint8", [False, True])
def test_gpu_conversion_equals_cpu(return_uint8: bool) -> None:
    data = _windows()
    gpu = _run(data, on_gpu=True, config=None, return_uint8=return_uint8)
    cpu = _run(data, on_gpu=False, config=None, return_uint8=return_uint8)
    assert gpu.dtype == cpu.dtype
    np.testing.assert_array_equal(gpu, cpu)


def test_gpu_random_config_keeps_one_draw_per_window() -> None:
    # Affine without resize reads the run-time shape of gpu frames (needs DALI's dynamic executor).
    config = AugmentConfig(
        random_resized_crop=RandomResizedCrop(size=(24, 24), scale=(0.5, 1.0)),
        affine=RandomAffine(degrees=10.0),
        color_jitter=ColorJitter(brightness=0.3),
    )
    no_crop = AugmentConfig(affine=RandomAffine(degrees=10.0), color_jitter=ColorJitter(brightness=0.3))
    data = _windows(static=True)
    gpu = _run(data, on_gpu=True, config=config)
    assert gpu.shape == (B, T, 3, 24, 24)
    for i in range(B):
        for t in range(1, T):
            np.testing.assert_array_equal(gpu[i, t], gpu[i, 0])
    # Same draws on both backends (computed on the host); only rounding may differ, and a few pixels
    # on the edge of the filled border.
    diff = np.abs(_run(data, on_gpu=True, config=no_crop) - _run(data, on_gpu=False, config=no_crop))
    assert diff.mean() < 1 / 255
    assert np.mean(diff <= 2 / 255) > 0.99


@pytest.mark.parametrize("channels", [3, 1], ids=["rgb", "grey"])
def test_every_operator_agrees_across_backends(channels: int) -> None:
    """Every augmentation the package has, on RGB and on grey frames (hue/saturation are colour_twist, grey
    colour jitter is brightness_contrast, the blur window is a per-sample argument): the same host draws give
    the same frames on both backends, up to rounding and a few pixels on the edge of the affine's border."""
    config = AugmentConfig(
        resize=(40, 56),
        random_resized_crop=RandomResizedCrop(size=(32, 32), scale=(0.6, 1.0)),
        affine=RandomAffine(degrees=5.0, translate=(0.1, 0.1), scale=(0.9, 1.1)),
        color_jitter=ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.05),
        blur=GaussianBlur(),
        normalize=Normalize(mean=(0.5,) * channels, std=(0.25,) * channels),
    ).for_channels(channels)
    data = _windows(channels=channels)
    gpu = _run(data, on_gpu=True, config=config, channels=channels)
    cpu = _run(data, on_gpu=False, config=config, channels=channels)
    assert gpu.shape == cpu.shape == (B, T, channels, 32, 32) and gpu.dtype == cpu.dtype == np.float32
    diff = np.abs(gpu - cpu) * 0.25  # back to [0, 1] units (std 0.25)
    assert diff.mean() < 2 / 255, diff.mean()
    assert np.mean(diff <= 3 / 255) > 0.98
