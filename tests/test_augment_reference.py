"""augment_frames on the CPU against references written apart from it: numpy for the colour jitter and the
normalisation, torch's ``interpolate`` for the random resized crop (torchvision's ``resized_crop`` is a crop then
that resize), each applied frame by frame with the draws the pipeline was fed (``draw_params``), on windows whose
frames differ, one a repeat of its neighbour as an ``_is_pad`` frame is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from nvidia.dali import fn
from nvidia.dali.data_node import DataNode

from lerobot_dali.augment import AugmentConfig, ColorJitter, Normalize, RandomResizedCrop, augment_frames
from lerobot_dali.augment_draws import draw_params
from tests.test_augment import _constant_batch as _constant
from tests.test_augment import augment, draw_keys, run

B, T, H, W = 6, 3, 32, 48
#: RGB -> YIQ, the basis in which DALI's colour twist turns hue and scales saturation.
YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])


def _windows(*, smooth: bool, channels: int = 3, seed: int = 0) -> np.ndarray:
    """(B, T, H, W, C) uint8, every sample and frame its own, except frame 1, a copy of frame 0 (a padded frame)."""
    rng = np.random.default_rng(seed)
    if smooth:  # few levels between neighbours, so two resamplers differ only by rounding
        y, x = np.mgrid[0:H, 0:W]
        p = rng.uniform(0.05, 0.3, (3, B, T, 1, 1, channels))  # per sample, frame and channel: x and y rates, phase
        data = np.round(127 + 120 * np.sin(p[0] * x[..., None] + p[1] * y[..., None] + 6 * p[2])).astype(np.uint8)
    else:
        data = rng.integers(0, 256, (B, T, H, W, channels), dtype=np.uint8)
    data[:, 1] = data[:, 0]
    return data


def _draws(config: AugmentConfig, seed: int) -> dict[str, np.ndarray]:
    return draw_params(config, seed=seed, stream="camera0", keys=draw_keys(B), frame_size=config.resize)


def _jitter(frames: np.ndarray, draws: dict[str, np.ndarray], i: int) -> np.ndarray:
    """Sample ``i``'s (T, H, W, 3) frames through its colour jitter, float: hue and saturation in YIQ, then contrast
    about 128, then brightness (the order augment.py states)."""
    turn, s = -2 * math.pi * float(draws["hue"][i]), float(draws["saturation"][i])
    chroma = s * np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
    twist = np.linalg.inv(YIQ) @ np.block([[np.eye(1), np.zeros((1, 2))], [np.zeros((2, 1)), chroma]]) @ YIQ
    x = frames.astype(np.float64) @ twist.T
    return float(draws["brightness"][i]) * (128 + float(draws["contrast"][i]) * (x - 128))


def _crop(frames: np.ndarray, draws: dict[str, np.ndarray], i: int, size: tuple[int, int]) -> np.ndarray:
    """Sample ``i``'s (T, H, W, C) frames cropped to its window (whole pixels) and resized to ``size`` by torch's
    antialiased bilinear interpolate, rounded to uint8 levels: (T, H', W', C) float."""
    (y0, x0), (y1, x1) = (np.round(draws[k][i] * (H, W)).astype(int) for k in ("crop_start", "crop_end"))
    window = torch.from_numpy(frames[:, y0:y1, x0:x1]).permute(0, 3, 1, 2).double()
    resized = F.interpolate(window, size=size, mode="bilinear", antialias=True, align_corners=False)
    return resized.round().clamp(0, 255).permute(0, 2, 3, 1).numpy()


def test_colour_jitter_applies_each_samples_draw_to_every_frame_as_numpy_does() -> None:
    config = AugmentConfig(color_jitter=ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.2))
    data = _windows(smooth=False)
    out = augment(data, config, seed=2, return_uint8=True).transpose(0, 1, 3, 4, 2).astype(np.float64)
    draws = _draws(config, seed=2)
    for i in range(B):
        expected = np.clip(np.round(_jitter(data[i], draws, i)), 0, 255)
        np.testing.assert_allclose(out[i], expected, rtol=0, atol=1, err_msg=f"sample {i}")  # (YIQ's 3 decimals)
        np.testing.assert_array_equal(out[i, 1], out[i, 0], err_msg=f"sample {i}: the padded frame")
        assert float(np.mean(out[i] != expected)) < 0.2
    assert len({float(draws["hue"][i]) for i in range(B)}) == B


def test_grey_jitter_is_numpys_brightness_and_contrast_exactly() -> None:
    config = AugmentConfig(color_jitter=ColorJitter(brightness=(0.3, 1.8), contrast=(0.2, 2.0)))
    data = _windows(smooth=False, channels=1)
    out = augment(data, config, seed=5, return_uint8=True, channels=1)
    assert out.shape == (B, T, 1, H, W) and out.dtype == np.uint8
    draws = _draws(config, seed=5)
    b, c = (draws[k].astype(np.float64).reshape(B, 1, 1, 1, 1) for k in ("brightness", "contrast"))
    expected = np.clip(np.round(b * (128 + c * (data.astype(np.float64) - 128))), 0, 255)
    np.testing.assert_array_equal(out.transpose(0, 1, 3, 4, 2), expected)


@pytest.mark.parametrize("size", [(16, 16), (20, 36), (40, 60)], ids=["down", "non-square", "up"])
def test_random_resized_crop_is_torchs_crop_then_resize(size: tuple[int, int]) -> None:
    # It read the frame beyond the window at the window's edges, where torchvision crops first: 9-16 levels off at most
    # (0.2-0.55 on average). Upsampled, the edges are now within a level too; shrunk, DALI's filter at the frame's
    # border differs from torch's (up to 5 levels in the outer pixel, 0.23 on average at (16, 16)).
    config = AugmentConfig(resize=(H, W), random_resized_crop=RandomResizedCrop(size=size, scale=(0.2, 1.0)))
    data = _windows(smooth=True)
    out = augment(data, config, seed=4).transpose(0, 1, 3, 4, 2) * 255.0
    draws = _draws(config, seed=4)
    edge = 0 if size == (40, 60) else 1
    inside = (slice(None), slice(edge, size[0] - edge), slice(edge, size[1] - edge))
    for i in range(B):
        expected = _crop(data[i], draws, i, size)
        np.testing.assert_allclose(out[i][inside], expected[inside], rtol=0, atol=1.001, err_msg=f"sample {i}")
        assert float(np.abs(out[i] - expected).mean()) < 0.4, f"sample {i}"
        np.testing.assert_array_equal(out[i, 1], out[i, 0], err_msg=f"sample {i}: the padded frame")
    assert len({tuple(draws["crop_start"][i]) for i in range(B)}) == B


def _black_window_in_white(resize: tuple[int, int] | None) -> np.ndarray:
    """Window rows [8, 24), columns [12, 36) of black in a white frame, cut by a crop of exactly that window and
    upsampled 2.5x: (40, 60) of the red channel, int."""
    frame = np.full((1, 1, H, W, 3), 255, dtype=np.uint8)
    frame[..., 8:24, 12:36, :] = 0
    crop = RandomResizedCrop(size=(40, 60), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    config = AugmentConfig(resize=resize, random_resized_crop=crop)
    draws = {"crop_start": np.array([[8 / H, 12 / W]]), "crop_end": np.array([[24 / H, 36 / W]])}

    def graph(x: DataNode) -> DataNode:
        fed = {k: fn.external_source(source=_constant(v.astype(np.float32)), batch=True) for k, v in draws.items()}
        return augment_frames(x, config=config, camera_index=0, draws=fed, return_uint8=True)

    return run(graph, frame)[0][0][0, 0, 0].astype(int)


def test_a_window_of_whole_pixels_reads_nothing_beyond_it() -> None:
    # With a resize the window is whole pixels of a known frame: cut, then resized, as torchvision's resized_crop.
    # It was resized with an ROI, which samples the frame as a continuous picture: the first output row's centre lies
    # 0.3 pixel beyond the window, so it came out 30 % white (76) and its corner 130; torchvision's are black.
    assert _black_window_in_white((H, W)).max() == 0


def test_a_relative_window_reads_the_frame_just_beyond_it() -> None:
    # Without a resize the window is not on whole pixels (RandomResizedCrop's docstring): it stays a continuous crop.
    out = _black_window_in_white(None)
    assert {out[0, 10], out[-1, 10], out[10, 0], out[10, -1]} <= {76, 77}
    assert out[1:-1, 1:-1].max() == 0


def test_crop_jitter_and_normalise_chain_as_numpy_and_torch_would() -> None:
    mean, std = (0.45, 0.5, 0.4), (0.2, 0.25, 0.3)
    config = AugmentConfig(
        resize=(H, W),
        random_resized_crop=RandomResizedCrop(size=(24, 20), scale=(0.3, 1.0)),
        color_jitter=ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.05),
        normalize=Normalize(mean=mean, std=std),
    )
    data = _windows(smooth=True, seed=3)
    out = augment(data, config, seed=8)
    assert out.shape == (B, T, 3, 24, 20) and out.dtype == np.float32
    draws = _draws(config, seed=8)
    m, s = np.array(mean), np.array(std)
    for i in range(B):
        levels = np.clip(np.round(_jitter(_crop(data[i], draws, i, (24, 20)), draws, i)), 0, 255)
        expected = ((levels / 255 - m) / s).transpose(0, 3, 1, 2)  # FHWC -> FCHW, as LeRobot's (T, C, H, W)
        # a level of the crop, one of the YIQ twist, through contrast and brightness up to 1.3 each: 4 levels
        np.testing.assert_allclose(out[i], expected, rtol=0, atol=4 / 255 / min(std), err_msg=f"sample {i}")
        assert float(np.abs(out[i] - expected).mean()) < 1.5 / 255 / min(std), f"sample {i}"


@pytest.mark.parametrize(("ratio", "empty"), [((64.0, 100.0), "32 x 0"), ((0.01, 1 / 64), "0 x 32")])
def test_a_ratio_whose_fallback_window_is_empty_is_refused(ratio: tuple[float, float], empty: str) -> None:
    # torchvision's centre-crop fallback rounds to 0 pixels; the cut window was empty, and so were the frames: a
    # (3, 0, 16) output for a crop of size (16, 16), said nowhere.
    crop = RandomResizedCrop(size=(16, 16), ratio=ratio)
    with pytest.raises(ValueError, match=f"fallback centre crop would be {empty} .*least ratio below 64"):
        AugmentConfig(resize=(32, 32), random_resized_crop=crop)
    assert RandomResizedCrop(size=(16, 16), ratio=ratio) == crop  # (the crop alone, its frames unknown, is valid)


@pytest.mark.parametrize("ratio", [63.0, 1 / 63], ids=["one-row", "one-column"])
def test_a_ratio_whose_fallback_window_is_one_pixel_crops_it(ratio: float) -> None:
    """Both ends of the ratio: 32 / 63 and 32 * (1 / 63) are 0.51, which rounds to 1 pixel (truncated, 0: refused)."""
    config = AugmentConfig(resize=(32, 32), random_resized_crop=RandomResizedCrop(size=(16, 16), ratio=(ratio, ratio)))
    data = np.zeros((B, 1, 32, 32, 3), dtype=np.uint8)
    if ratio > 1:
        data[:, :, 15] = 200  # no try fits: the fallback, 32 x 1 (w x h), rows [15, 16)
    else:
        data[:, :, :, 15] = 200  # the fallback, 1 x 32, columns [15, 16)
    out = augment(data, config, seed=1, return_uint8=True)
    assert out.shape == (B, 1, 3, 16, 16)
    assert (out == 200).all()
