"""LeRobot's image transforms here: the sharpness jitter."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import numpy as np
import pytest

from lerobot_dali.augment import AugmentConfig, SharpnessJitter
from lerobot_dali.augment_draws import draw_params
from tests.test_augment import EVERYTHING, RANDOM_CONFIGS, augment, distinct_windows, draw_keys


def _draw(config: AugmentConfig, n: int) -> dict[str, np.ndarray]:
    return draw_params(config, seed=0, stream="camera0", keys=draw_keys(n, epoch=1), frame_size=None)


# --- sharpness ---------------------------------------------------------------------------------------


def _sharpened(frames: np.ndarray, factor: float) -> np.ndarray:
    """torchvision's adjust_sharpness on float frames (as LeRobot's are), in uint8 units: (B, T, H, W, C)."""
    x = frames.astype(np.float64)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = x.shape[2:4]
    smoothed = 4 * x / 13  # the centre's 5 / 13, of which 1 / 13 comes back in the 3x3 sum below
    for dy, dx in itertools.product(range(3), range(3)):
        smoothed += padded[:, :, dy : dy + h, dx : dx + w] / 13
    out = x.copy()
    inner = (slice(None), slice(None), slice(1, -1), slice(1, -1))
    out[inner] = factor * x[inner] + (1 - factor) * smoothed[inner]  # the border keeps its pixels
    return np.clip(out, 0, 255)


@pytest.mark.parametrize("factor", [0.0, 0.4, 1.7])
def test_sharpness_matches_torchvision_adjust_sharpness(factor: float) -> None:
    data = distinct_windows()
    out = augment(data, AugmentConfig(sharpness=SharpnessJitter(factor=(factor, factor))), return_uint8=True)
    expected = _sharpened(data, factor).transpose(0, 1, 4, 2, 3)
    assert np.abs(out - expected).max() <= 0.5 + 1e-6  # rounded to the nearest level
    # (torchvision 0.25 on these frames from LeRobot's venv: 0.46 / 0.50 / 0.50 levels at most, as here)


def test_sharpness_draws_a_factor_per_sample_in_its_range() -> None:
    config = AugmentConfig(sharpness=SharpnessJitter(factor=0.5))
    assert config.sharpness is not None and config.sharpness.factor == (0.5, 1.5)
    factors = _draw(config, 2000)["sharpness"]
    assert factors.dtype == np.float32 and 0.5 <= factors.min() < 0.51 and 1.49 < factors.max() <= 1.5
    data = distinct_windows()
    keys = draw_keys(len(data))
    drawn = draw_params(config, seed=0, stream="camera0", keys=keys, frame_size=None)["sharpness"]
    out = augment(data, config, return_uint8=True)
    for i, factor in enumerate(drawn):
        expected = _sharpened(data[i : i + 1], float(factor)).transpose(0, 1, 4, 2, 3)
        assert np.abs(out[i : i + 1] - expected).max() <= 0.5 + 1e-4, i


def test_old_configs_draw_exactly_as_before_the_new_slots() -> None:
    # Digest of these draws as commit e13e363 made them, before new parameters were appended to the stream: no old
    # parameter's slot moved, so saved runs and old recipes augment exactly as they did.
    digest = hashlib.sha256()
    for name, config in sorted({**RANDOM_CONFIGS, "everything": EVERYTHING}.items()):
        params = draw_params(config, seed=3, stream="camera1", keys=draw_keys(16, epoch=2), frame_size=config.resize)
        for param, value in sorted(params.items()):
            digest.update(f"{name}/{param}/{value.dtype}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    assert digest.hexdigest() == "a427a6a314dfa6467cea7d9838d6d92a2a1cdd38d555b68d36cdd258d6b60325"


@pytest.mark.parametrize("factor", [(1.5, 0.5), -0.1, (-0.1, 1.0), "0.5"])
def test_bad_sharpness_factors_are_refused(factor: Any) -> None:
    with pytest.raises(ValueError, match=r"SharpnessJitter\.factor = "):
        SharpnessJitter(factor=factor)
