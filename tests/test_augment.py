"""augment_frames on DALI CPU pipelines fed with synthetic FHWC uint8 windows, and the host draws behind it."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvidia.dali import fn, pipeline_def
from nvidia.dali.data_node import DataNode

from lerobot_dali.augment import (
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomAffine,
    RandomResizedCrop,
    RandomSubset,
    SharpnessJitter,
    augment_frames,
)
from lerobot_dali.augment_draws import draw_names, draw_params, stream_name

EXAMPLE_TOML = Path(__file__).resolve().parents[1] / "pipelines" / "recipes" / "augment_example.toml"
B, T, H, W = 4, 3, 32, 48

RANDOM_CONFIGS = {
    "color_jitter": AugmentConfig(color_jitter=ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)),
    "random_resized_crop": AugmentConfig(random_resized_crop=RandomResizedCrop(size=(24, 24), scale=(0.3, 0.9))),
    "affine": AugmentConfig(affine=RandomAffine(degrees=20.0, translate=(0.1, 0.1), scale=(0.8, 1.2))),
    "blur": AugmentConfig(blur=GaussianBlur(sigma=(0.3, 3.0), kernel_size=7)),
}
#: brightness in [0, 1) for keys (0, 0, 0) and (1, 2, 3) of stream "camera0", seed 0 (see test_draws_are_stable...).
PINNED_BRIGHTNESS = [0.31302047, 0.9445902]
EVERYTHING = AugmentConfig(
    resize=(28, 40),
    random_resized_crop=RandomResizedCrop(size=(20, 24), scale=(0.5, 1.0)),
    affine=RandomAffine(degrees=10.0, translate=(0.05, 0.05)),
    color_jitter=ColorJitter(brightness=0.3, saturation=0.3),
    blur=GaussianBlur(sigma=(0.5, 1.5), probability=0.5),
)


def distinct_windows(n: int = B, frames: int = T, seed: int = 0) -> np.ndarray:
    """Every sample and every frame different."""
    return np.random.default_rng(seed).integers(0, 256, (n, frames, H, W, 3), dtype=np.uint8)


def static_windows(n: int = B, frames: int = T) -> np.ndarray:
    """One still image, repeated over every frame of every sample."""
    image = distinct_windows(1, 1, seed=7)
    return np.repeat(np.repeat(image, frames, axis=1), n, axis=0)


def _constant_batch(array: np.ndarray) -> Callable[[], list[np.ndarray]]:
    # A zero-argument callback: DALI passes an epoch index or BatchInfo to callbacks that take one.
    return lambda: list(array)


def run(graph: Callable[..., object], *inputs: np.ndarray, iterations: int = 1) -> list[list[np.ndarray]]:
    """Run ``graph(*frames_nodes)`` on a CPU pipeline; one list of numpy outputs per iteration."""

    @pipeline_def(batch_size=len(inputs[0]), num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        nodes = [fn.external_source(source=_constant_batch(a), layout="FHWC", batch=True) for a in inputs]
        out = graph(*nodes)
        return tuple(out) if isinstance(out, Sequence) else out

    p = pipe()
    p.build()
    results = []
    for _ in range(iterations):
        outs = p.run()
        for o in outs:
            assert o.layout() == "FCHW"
        results.append([o.as_array() for o in outs])
    return results


def draw_keys(n: int, iteration: int = 0, *, first: int = 0, rank: int = 0, epoch: int = 0) -> np.ndarray:
    """(rank, epoch, position) of batch ``iteration``'s samples (from position ``first`` on)."""
    positions = first + iteration * n + np.arange(n)
    return np.stack([np.full(n, rank), np.full(n, epoch), positions], axis=1)


def host_draws(
    config: AugmentConfig | None, *, seed: int, camera_index: int, n: int, first: int = 0
) -> dict[str, DataNode]:
    """Inside a pipeline definition: the draws of ``camera_index``'s stream, fed by external sources."""
    stream = stream_name(config, camera_index)
    frame_size = config.resize if config is not None else None

    def source(name: str) -> Callable[[int], np.ndarray]:
        def batch(iteration: int) -> np.ndarray:
            keys = draw_keys(n, iteration, first=first)
            return draw_params(config, seed=seed, stream=stream, keys=keys, frame_size=frame_size)[name]

        return batch

    return {name: fn.external_source(source=source(name), batch=True) for name in draw_names(config)}


def run_augmented(
    config: AugmentConfig | None,
    *inputs: np.ndarray,
    seed: int = 0,
    iterations: int = 1,
    first: int = 0,
    **kwargs: Any,
) -> list[list[np.ndarray]]:
    """Every input is a camera (index = its position), augmented with the host draws of its stream."""
    n = len(inputs[0])

    def graph(*nodes: DataNode) -> list[DataNode]:
        outputs = []
        for i, x in enumerate(nodes):
            draws = host_draws(config, seed=seed, camera_index=i, n=n, first=first)
            outputs.append(augment_frames(x, config=config, camera_index=i, draws=draws, **kwargs))
        return outputs

    return run(graph, *inputs, iterations=iterations)


def augment(data: np.ndarray, config: AugmentConfig | None, *, seed: int = 0, **kwargs: Any) -> np.ndarray:
    return run_augmented(config, data, seed=seed, **kwargs)[0][0]


def to_lerobot(data: np.ndarray) -> np.ndarray:
    return data.transpose(0, 1, 4, 2, 3).astype(np.float32) / np.float32(255)


# --- hand-over: layout, dtype, size, normalisation ---------------------------------------------------


@pytest.mark.parametrize("frames", [1, T])
def test_no_config_is_exact_lerobot_conversion(frames: int) -> None:
    data = distinct_windows(frames=frames)
    out = augment(data, None)
    assert out.dtype == np.float32
    assert out.shape == (B, frames, 3, H, W)
    np.testing.assert_array_equal(out, to_lerobot(data))


def test_default_config_equals_no_config() -> None:
    data = distinct_windows()
    np.testing.assert_array_equal(augment(data, AugmentConfig()), to_lerobot(data))


def test_return_uint8_is_exact_transpose() -> None:
    data = distinct_windows()
    out = augment(data, None, return_uint8=True)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, data.transpose(0, 1, 4, 2, 3))


def test_resize_gives_configured_size_and_keeps_flat_colour() -> None:
    data = distinct_windows()
    assert augment(data, AugmentConfig(resize=(16, 20))).shape == (B, T, 3, 16, 20)
    flat = np.zeros_like(data)
    flat[..., :] = (10, 128, 250)
    out = augment(flat, AugmentConfig(resize=(17, 61)), return_uint8=True)
    assert out.shape == (B, T, 3, 17, 61)
    np.testing.assert_array_equal(out[:, :, :, 5, 7], np.broadcast_to([10, 128, 250], (B, T, 3)))


def test_output_size_adds_or_replaces_the_last_resampling() -> None:
    data = distinct_windows()
    assert augment(data, None, output_size=(10, 12)).shape == (B, T, 3, 10, 12)
    config = AugmentConfig(resize=(30, 30), random_resized_crop=RandomResizedCrop(size=(20, 20)))
    assert augment(data, config).shape == (B, T, 3, 20, 20)
    assert augment(data, config, output_size=(8, 14)).shape == (B, T, 3, 8, 14)


def test_normalize_matches_numpy() -> None:
    data = distinct_windows()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = augment(data, AugmentConfig(normalize=Normalize(mean=mean, std=std)))
    expected = (to_lerobot(data) - np.array(mean).reshape(3, 1, 1)) / np.array(std).reshape(3, 1, 1)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


# --- operator semantics ------------------------------------------------------------------------------


def test_fixed_brightness_scales_values() -> None:
    data = distinct_windows()
    out = augment(data, AugmentConfig(color_jitter=ColorJitter(brightness=(1.5, 1.5))), return_uint8=True)
    expected = np.clip(np.round(data.astype(np.float64) * 1.5), 0, 255).astype(np.uint8)
    np.testing.assert_allclose(out.astype(int), expected.transpose(0, 1, 4, 2, 3), atol=1)


def test_hue_turns_the_yiq_chroma_plane_not_the_hsv_hue() -> None:
    # As ColorJitter documents: a rotation of (I, Q) that keeps luma, turning red towards yellow for a positive hue.
    yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    data = distinct_windows()
    for hue in (0.1, -0.3):
        turn = -2 * math.pi * hue  # (I, Q) turn the other way in this basis
        rotation = np.array([[1, 0, 0], [0, math.cos(turn), -math.sin(turn)], [0, math.sin(turn), math.cos(turn)]])
        expected = np.clip(np.round(data @ (np.linalg.inv(yiq) @ rotation @ yiq).T), 0, 255)
        out = augment(data, AugmentConfig(color_jitter=ColorJitter(hue=(hue, hue))), return_uint8=True)
        np.testing.assert_allclose(out.transpose(0, 1, 3, 4, 2), expected, atol=2, err_msg=f"hue {hue}")
    red = np.zeros((1, 1, 4, 4, 3), dtype=np.uint8)
    red[..., 0] = 255
    out = augment(red, AugmentConfig(color_jitter=ColorJitter(hue=(1 / 6, 1 / 6))), return_uint8=True)
    np.testing.assert_allclose(out[0, 0, :, 0, 0], [128, 111, 0], atol=1)  # torchvision's HSV shift: (255, 255, 0)


def test_cpu_colour_jitter_gives_dalis_own_uint8_colour_twist_bytes() -> None:
    """On the CPU the jitter twists to float and casts once (less CPU than DALI's uint8 twist, which rounds inside its
    per-pixel loop): the same bytes as DALI's uint8 ``color_twist`` given the same draws, over wide draws and frames
    whose twisted values run past both ends of uint8 (the cast must round and saturate as the twist does)."""
    jitter = ColorJitter(brightness=(0.0, 2.5), contrast=(0.0, 2.5), saturation=(0.0, 3.0), hue=(-0.5, 0.5))
    config = AugmentConfig(color_jitter=jitter)
    data = distinct_windows(n=16)
    data[:, :, : H // 4] = np.where(data[:, :, : H // 4] > 127, 255, 0)  # saturated colours

    def graph(x: DataNode) -> list[DataNode]:
        d = host_draws(config, seed=3, camera_index=0, n=len(data))
        ours = augment_frames(x, config=config, camera_index=0, draws=d, return_uint8=True)
        twist = fn.color_twist(
            x, brightness=d["brightness"], contrast=d["contrast"], saturation=d["saturation"], hue=d["hue"] * 360.0
        )
        return [ours, fn.transpose(twist, perm=[0, 3, 1, 2], output_layout="FCHW")]

    ours, dalis = run(graph, data)[0]
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, dalis)
    plain = data.transpose(0, 1, 4, 2, 3)
    assert (dalis == 0).sum() > (plain == 0).sum() and (dalis == 255).sum() > (plain == 255).sum()  # (both ends met)


def test_fixed_rotation_turns_clockwise_as_torchvisions_random_affine() -> None:
    # torchvision's RandomAffine (its F.affine) turns clockwise on screen for a positive angle; only its F.rotate
    # turns the other way. RandomAffine(degrees=(90, 90)) moves this dot to (26, 16) (torchvision 0.25, LeRobot
    # 0.4.4's venv); here it went to (6, 16), so an uneven range such as (0, 10) turned every frame the other way.
    dot = np.zeros((1, 1, 33, 33, 3), dtype=np.uint8)
    dot[0, 0, 16, 26] = 255  # ten pixels right of the centre pixel (16, 16)
    rotate = RandomAffine(degrees=(90.0, 90.0))
    # Without a known size the centre comes from the run-time shape; with resize it is a constant.
    for config in (AugmentConfig(affine=rotate), AugmentConfig(resize=(33, 33), affine=rotate)):
        out = augment(dot, config, return_uint8=True)[0, 0, 0]
        assert np.unravel_index(np.argmax(out), out.shape) == (26, 16)  # now ten pixels below it


def test_fixed_scale_without_rotation_scales_about_the_centre() -> None:
    # An affine that scales and turns nothing (augment's branch past the rotation, reached by no test): the dot five
    # pixels right of the centre pixel (16, 16) lands ten right of it at scale 2, spread over its neighbours as
    # torchvision's bilinear F.affine(scale=2.0) spreads it (255 * [1/4, 1/2, 1], rounded; torchvision 0.25 in
    # LeRobot 0.4.4's venv), which scales about the frame's centre.
    dot = np.zeros((1, 1, 33, 33, 3), dtype=np.uint8)
    dot[0, 0, 16, 21] = 255
    expected = np.zeros((33, 33), dtype=np.uint8)
    expected[15:18, 25:28] = [[64, 128, 64], [128, 255, 128], [64, 128, 64]]
    scale = RandomAffine(scale=(2.0, 2.0))
    for config in (AugmentConfig(affine=scale), AugmentConfig(resize=(33, 33), affine=scale)):
        out = augment(dot, config, return_uint8=True)[0, 0]
        for channel in out:
            np.testing.assert_array_equal(channel, expected)


def _dot_through_affine(affine: RandomAffine, resize: tuple[int, int] | None, shift: tuple[float, float]) -> tuple:
    """A dot at row 5, column 30 of a 20 x 40 (h x w) frame through ``affine`` (translation fed as ``shift``, the
    (dx, dy) fractions): where the dot went, (row, column), or None where it left the frame."""
    dot = np.zeros((1, 1, 20, 40, 3), dtype=np.uint8)
    dot[0, 0, 5, 30] = 255
    config = AugmentConfig(resize=resize, affine=affine)

    def graph(x: DataNode) -> DataNode:
        draws = {}
        if "affine_translate" in draw_names(config):
            value = np.array([shift], dtype=np.float32)
            draws["affine_translate"] = fn.external_source(source=_constant_batch(value), batch=True)
        return augment_frames(x, config=config, camera_index=0, draws=draws, return_uint8=True)

    out = run(graph, dot)[0][0][0, 0, 0]
    return None if out.max() == 0 else tuple(int(i) for i in np.unravel_index(np.argmax(out), out.shape))


@pytest.mark.parametrize("resize", [None, (20, 40)], ids=["runtime-size", "known-size"])
def test_affine_on_a_wide_frame_turns_about_its_centre_and_shifts_by_width_and_height(
    resize: tuple[int, int] | None,
) -> None:
    """Every other affine test ran on square frames, where (w, h) and (h, w) agree: a centre or a shift scale taken as
    (h, w) passed them. 180 degrees about (x, y) = (20, 10) takes pixel (5, 30) to (14, 9); about (10, 20) it leaves
    the frame. A shift of (0.1, 0.2) of (width, height) is 4 columns and 4 rows (of (height, width): 2 and 8)."""
    assert _dot_through_affine(RandomAffine(degrees=(180.0, 180.0)), resize, (0.0, 0.0)) == (14, 9)
    assert _dot_through_affine(RandomAffine(translate=(0.1, 0.2)), resize, (0.1, 0.2)) == (9, 34)


def test_affine_moves_the_jittered_frame_so_the_uncovered_area_stays_black() -> None:
    # The affine runs after the colour jitter and the sharpness (LeRobot's default order: its listed tfs, affine
    # last): it ran first, so contrast 0.8 turned the black it uncovered to 26 (LeRobot's frames of r1_v30_h264 at
    # 20 degrees: 26 levels over the 16 % of each frame it uncovers; LeRobot's: 0 there).
    data = distinct_windows()
    rotate = AugmentConfig(affine=RandomAffine(degrees=(30.0, 30.0)))
    jitter = AugmentConfig(color_jitter=ColorJitter(contrast=(0.8, 0.8), brightness=(1.2, 1.2)))
    both = AugmentConfig(affine=rotate.affine, color_jitter=jitter.color_jitter)
    jittered = np.ascontiguousarray(augment(data, jitter, return_uint8=True).transpose(0, 1, 3, 4, 2))
    expected = augment(jittered, rotate, return_uint8=True)
    out = augment(data, both, return_uint8=True)
    np.testing.assert_array_equal(out, expected)
    assert (out[:, :, :, 0, 0] == 0).all()  # a corner the rotation uncovers


def test_blur_probability_zero_is_identity_and_half_blurs_some_samples() -> None:
    data = static_windows(n=8)
    off = augment(data, AugmentConfig(blur=GaussianBlur(sigma=2.0, probability=0.0)))
    np.testing.assert_array_equal(off, to_lerobot(data))
    half = augment(data, AugmentConfig(blur=GaussianBlur(sigma=2.0, probability=0.5)), seed=3)
    untouched = [np.array_equal(half[i], to_lerobot(data)[i]) for i in range(8)]
    assert any(untouched) and not all(untouched), untouched


# --- one draw per sample, shared by its frames ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RANDOM_CONFIGS))
def test_one_draw_per_sample_shared_by_its_frames(name: str) -> None:
    data = static_windows()
    out = augment(data, RANDOM_CONFIGS[name], seed=11)
    for i in range(B):
        for t in range(1, T):
            np.testing.assert_array_equal(out[i, t], out[i, 0], err_msg=f"{name}: sample {i} frame {t}")
    for i in range(1, B):
        assert not np.array_equal(out[i], out[0]), f"{name}: samples 0 and {i} got the same draw"
    assert not np.array_equal(out[0, 0], to_lerobot(data)[0, 0]), f"{name} changed nothing"


def test_single_frame_windows_run_every_step() -> None:
    out = augment(distinct_windows(frames=1), EVERYTHING, seed=1)
    assert out.shape == (B, 1, 3, 20, 24)
    assert out.min() >= 0.0 and out.max() <= 1.0


# --- seeds and cameras ---------------------------------------------------------------------------------


def _two_iterations(seed: int) -> list[list[np.ndarray]]:
    return run_augmented(EVERYTHING, distinct_windows(), seed=seed, iterations=2)


def test_same_seed_repeats_exactly_and_other_seed_differs() -> None:
    first, again, other = _two_iterations(5), _two_iterations(5), _two_iterations(6)
    for k in range(2):
        np.testing.assert_array_equal(first[k][0], again[k][0])
        assert not np.array_equal(first[k][0], other[k][0])
    assert not np.array_equal(first[0][0], first[1][0]), "the second batch must get new draws"


@pytest.mark.parametrize("shared", [True, False])
def test_cameras_share_draws_only_when_asked(shared: bool) -> None:
    config = AugmentConfig(
        random_resized_crop=RandomResizedCrop(size=(24, 24), scale=(0.3, 0.9)),
        color_jitter=ColorJitter(brightness=0.4, hue=0.1),
        shared_across_cameras=shared,
    )
    data = distinct_windows()
    cam0, cam1 = run_augmented(config, data, data.copy(), seed=9)[0]
    assert np.array_equal(cam0, cam1) is shared
    for i in range(B):  # not shared: every sample draws anew per camera
        assert np.array_equal(cam0[i], cam1[i]) is shared


def test_a_sample_keeps_its_augmentation_in_any_batch() -> None:
    data = distinct_windows()
    whole = run_augmented(EVERYTHING, data, seed=4)[0][0]
    tail = run_augmented(EVERYTHING, data[2:].copy(), seed=4, first=2)[0][0]  # positions 2, 3 alone
    np.testing.assert_array_equal(tail, whole[2:])
    shifted = run_augmented(EVERYTHING, data[2:].copy(), seed=4, first=0)[0][0]  # same frames, other positions
    assert not np.array_equal(shifted, whole[2:])


@pytest.mark.parametrize("resize", [None, (H, W)], ids=["relative", "pixels"])
def test_random_crop_cuts_the_drawn_window(resize: tuple[int, int] | None) -> None:
    # A ramp image: red = 4 x, green = 6 y (pixel centres), so every output pixel tells where it was read.
    y, x = np.mgrid[0:H, 0:W]
    ramp = np.stack([4 * x, 6 * y, np.zeros_like(x)], axis=-1).astype(np.uint8)
    data = np.broadcast_to(ramp, (B, 1, H, W, 3)).copy()
    size = 16
    config = AugmentConfig(resize=resize, random_resized_crop=RandomResizedCrop(size=(size, size), scale=(0.3, 0.6)))
    out = augment(data, config, seed=2, return_uint8=True).astype(np.float64)
    draws = draw_params(config, seed=2, stream="camera0", keys=draw_keys(B), frame_size=resize)
    # Away from the window's border: the filter clamps there (without a resize, it reads the frame beyond it).
    inner = slice(3, size - 3)
    centres = (np.arange(size) + 0.5) / size
    for i in range(B):
        (y0, x0), (y1, x1) = draws["crop_start"][i] * (H, W), draws["crop_end"][i] * (H, W)
        expected_x = x0 + centres * (x1 - x0) - 0.5
        expected_y = y0 + centres * (y1 - y0) - 0.5
        np.testing.assert_allclose(out[i, 0, 0, inner, inner], 4 * np.broadcast_to(expected_x[inner], (10, 10)), atol=2)
        np.testing.assert_allclose(out[i, 0, 1, inner, inner], 6 * expected_y[inner, None].repeat(10, 1), atol=2)
    assert len({tuple(draws["crop_start"][i]) for i in range(B)}) == B


def test_missing_or_unexpected_draws_are_rejected() -> None:
    data = distinct_windows()
    config = RANDOM_CONFIGS["color_jitter"]
    with pytest.raises(ValueError, match=r"missing \['brightness', 'contrast', 'saturation', 'hue'\]"):
        run(lambda x: augment_frames(x, config=config, camera_index=0), data)

    def extra(x: DataNode) -> DataNode:
        draws: Mapping[str, DataNode] = host_draws(RANDOM_CONFIGS["blur"], seed=0, camera_index=0, n=B)
        return augment_frames(x, config=None, camera_index=0, draws=draws)

    with pytest.raises(ValueError, match=r"unexpected \['blur_sigma'\]"):
        run(extra, data)


# --- host draws (pure numpy) -----------------------------------------------------------------------------


def _mixed_keys() -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.stack([rng.integers(0, 8, 40), rng.integers(0, 5, 40), rng.integers(0, 10_000, 40)], axis=1)


def _draw(config: AugmentConfig, keys: np.ndarray, *, seed: int = 0, stream: str = "camera0") -> dict[str, np.ndarray]:
    return draw_params(config, seed=seed, stream=stream, keys=keys, frame_size=config.resize)


def test_draws_of_a_key_do_not_depend_on_the_batch() -> None:
    keys = _mixed_keys()
    whole = _draw(EVERYTHING, keys)
    assert set(whole) == set(draw_names(EVERYTHING))
    order = np.random.default_rng(2).permutation(len(keys))
    shuffled = _draw(EVERYTHING, keys[order])
    pieces = [_draw(EVERYTHING, keys[i : i + 1]) for i in (5, 0, 17)]
    for name, values in whole.items():
        np.testing.assert_array_equal(shuffled[name], values[order], err_msg=name)
        for i, piece in zip((5, 0, 17), pieces, strict=True):
            np.testing.assert_array_equal(piece[name][0], values[i], err_msg=name)


@pytest.mark.parametrize("change", ["rank", "epoch", "position", "stream", "seed"])
def test_draws_differ_in_every_part_of_the_key(change: str) -> None:
    keys = _mixed_keys()
    other_keys = keys.copy()
    column = {"rank": 0, "epoch": 1, "position": 2}.get(change)
    if column is not None:
        other_keys[:, column] += 1
    config = dataclasses.replace(EVERYTHING, resize=None)  # crop windows in relative terms: no ties on whole pixels
    base = _draw(config, keys)
    other = _draw(
        config,
        other_keys,
        seed=1 if change == "seed" else 0,
        stream="camera1" if change == "stream" else "camera0",
    )
    for name in ("crop_start", "affine_degrees", "affine_translate", "brightness", "saturation", "blur_sigma"):
        rows_equal = np.all(base[name].reshape(len(keys), -1) == other[name].reshape(len(keys), -1), axis=1)
        assert not rows_equal.any(), f"{name}: {change} changed nothing for rows {np.flatnonzero(rows_equal)}"


def test_draws_are_stable_across_runs() -> None:
    # Pinned values: a change of key derivation, counter layout or float conversion must show up here.
    config = AugmentConfig(color_jitter=ColorJitter(brightness=(0.0, 1.0)))
    values = draw_params(config, seed=0, stream="camera0", keys=np.array([[0, 0, 0], [1, 2, 3]]), frame_size=None)
    np.testing.assert_allclose(values["brightness"], PINNED_BRIGHTNESS, rtol=0, atol=1e-7)


def test_scalar_draws_stay_in_their_ranges_and_cover_them() -> None:
    config = AugmentConfig(
        affine=RandomAffine(degrees=(-5.0, 15.0), translate=(0.1, 0.3), scale=(0.8, 1.25)),
        color_jitter=ColorJitter(brightness=(0.6, 1.4), contrast=0.5, saturation=(0.0, 2.0), hue=(-0.1, 0.2)),
        blur=GaussianBlur(sigma=(0.2, 1.8), probability=0.3, kernel_size=7),
    )
    n = 2000
    draws = _draw(config, draw_keys(n, epoch=3))
    ranges = {
        "affine_degrees": (-5.0, 15.0),
        "affine_scale": (0.8, 1.25),
        "brightness": (0.6, 1.4),
        "contrast": (0.5, 1.5),
        "saturation": (0.0, 2.0),
        "hue": (-0.1, 0.2),
        "blur_sigma": (0.2, 1.8),
    }
    for name, (lo, hi) in ranges.items():
        values = draws[name]
        assert values.shape == (n,) and values.dtype == np.float32, name
        assert values.min() >= np.float32(lo) and values.max() <= np.float32(hi), name
        span = hi - lo
        assert values.min() < lo + 0.01 * span and values.max() > hi - 0.01 * span, f"{name} does not cover its range"
        assert abs(float(values.mean()) - (lo + hi) / 2) < 0.03 * span, f"{name} is not uniform"
    shift = draws["affine_translate"]
    assert shift.shape == (n, 2) and shift.dtype == np.float32
    assert (np.abs(shift) <= np.float32([0.1, 0.3])).all()
    assert (np.abs(shift).max(axis=0) > [0.099, 0.297]).all()
    window = draws["blur_window"]
    assert window.dtype == np.int32 and set(np.unique(window).tolist()) == {1, 7}
    assert abs(float(np.mean(window == 7)) - 0.3) < 0.05


@pytest.mark.parametrize("frame_size", [(90, 160), None], ids=["pixels", "relative"])
def test_crop_windows_follow_scale_and_ratio(frame_size: tuple[int, int] | None) -> None:
    scale, ratio = (0.2, 0.6), (3 / 4, 4 / 3)  # every first try fits: no fallback, so every window is drawn
    config = AugmentConfig(
        resize=frame_size, random_resized_crop=RandomResizedCrop(size=(8, 8), scale=scale, ratio=ratio)
    )
    draws = _draw(config, draw_keys(2000))
    assert draws["crop_start"].shape == draws["crop_end"].shape == (2000, 2)
    assert draws["crop_start"].dtype == draws["crop_end"].dtype == np.float32
    start, end = draws["crop_start"].astype(np.float64), draws["crop_end"].astype(np.float64)
    assert (start >= 0).all() and (end <= 1).all() and (end > start).all()
    height, width = frame_size if frame_size is not None else (1, 1)
    h, w = (end[:, 0] - start[:, 0]) * height, (end[:, 1] - start[:, 1]) * width
    area, aspect = h * w / (height * width), w / h
    if frame_size is not None:  # whole pixels: allow half a pixel of rounding per side
        np.testing.assert_allclose(start * (height, width), np.round(start * (height, width)), atol=1e-3)
        np.testing.assert_allclose(h, np.round(h), atol=1e-3)
        lo = (np.sqrt(scale[0] * height * width) - 0.5) ** 2 / (height * width)
        hi = (np.sqrt(scale[1] * height * width) + 0.5) ** 2 / (height * width)
        slack = 0.5 / h + 0.5 / w
    else:
        lo, hi, slack = scale[0] - 1e-5, scale[1] + 1e-5, 1e-5
    assert lo <= area.min() and area.max() <= hi
    assert (aspect >= ratio[0] * (1 - slack)).all() and (aspect <= ratio[1] * (1 + slack)).all()
    assert area.min() < scale[0] + 0.02 and area.max() > scale[1] - 0.02
    assert np.log(aspect).min() < np.log(ratio[0]) + 0.02 and np.log(aspect).max() > np.log(ratio[1]) - 0.02
    # The corner is uniform over the room the window leaves, on both axes.
    room = 1 - (end - start)
    placed = start[room.min(axis=1) > 0.05] / room[room.min(axis=1) > 0.05]
    assert (placed.min(axis=0) < 0.02).all() and (placed.max(axis=0) > 0.98).all() and (placed <= 1 + 1e-5).all()
    np.testing.assert_allclose(placed.mean(axis=0), 0.5, atol=0.03)


@pytest.mark.parametrize("frame_size", [(100, 100), None], ids=["pixels", "relative"])
def test_crop_falls_back_to_the_centre_when_no_try_fits(frame_size: tuple[int, int] | None) -> None:
    # The whole area at aspect 2..3 never fits a square frame: centre crop at aspect 2 (ratio's lower end).
    config = AugmentConfig(
        resize=frame_size, random_resized_crop=RandomResizedCrop(size=(8, 8), scale=(1.0, 1.0), ratio=(2.0, 3.0))
    )
    draws = _draw(config, draw_keys(5))
    np.testing.assert_allclose(draws["crop_start"], np.tile([0.25, 0.0], (5, 1)))
    np.testing.assert_allclose(draws["crop_end"], np.tile([0.75, 1.0], (5, 1)))


def test_constant_and_identity_ranges_draw_nothing() -> None:
    quiet = AugmentConfig(
        resize=(8, 8),
        affine=RandomAffine(degrees=(90.0, 90.0), scale=(1.5, 1.5)),
        color_jitter=ColorJitter(brightness=(1.5, 1.5)),
        blur=GaussianBlur(sigma=1.0, probability=1.0),
        normalize=Normalize(mean=(0.5,), std=(0.5,)),
    )
    for config in (None, AugmentConfig(), quiet, AugmentConfig(blur=GaussianBlur(sigma=(0.1, 2.0), probability=0.0))):
        assert draw_names(config) == ()
        assert draw_params(config, seed=0, stream="camera0", keys=draw_keys(3), frame_size=None) == {}
    assert draw_names(AugmentConfig(blur=GaussianBlur(sigma=1.0, probability=0.5))) == ("blur_window",)
    assert draw_names(AugmentConfig(affine=RandomAffine(translate=(0.0, 0.1)))) == ("affine_translate",)


def test_streams_and_bad_keys() -> None:
    assert stream_name(AugmentConfig(shared_across_cameras=True), 3) == "shared"
    assert stream_name(AugmentConfig(), 3) == stream_name(None, 3) == "camera3"
    config = RANDOM_CONFIGS["color_jitter"]
    for keys in (np.zeros((4, 2), np.int64), np.zeros((4, 3), np.float32), np.array([[0, -1, 0]])):
        with pytest.raises(ValueError, match="keys"):
            draw_params(config, seed=0, stream="camera0", keys=keys, frame_size=None)
    with pytest.raises(ValueError, match="seed"):
        draw_params(config, seed=1.5, stream="camera0", keys=draw_keys(2), frame_size=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="frame_size"):
        draw_params(config, seed=0, stream="camera0", keys=draw_keys(2), frame_size=(0, 8))


# --- configuration -------------------------------------------------------------------------------------


def test_example_toml_round_trip() -> None:
    config = AugmentConfig.from_toml(EXAMPLE_TOML)
    assert config.resize == (240, 320)
    assert config.random_resized_crop == RandomResizedCrop(size=(224, 224), scale=(0.8, 1.0), ratio=(1.0, 1.3333))
    assert config.affine is not None and config.affine.degrees == (-5.0, 5.0)
    assert config.color_jitter is not None and config.color_jitter.hue == (-0.05, 0.05)
    assert config.blur is not None and config.blur.effective_kernel_size == 5
    assert config.normalize is not None and config.normalize.std == (0.229, 0.224, 0.225)
    assert AugmentConfig.from_dict(config.to_dict()) == config


def test_example_toml_names_the_order_the_graph_runs(caplog: pytest.LogCaptureFixture) -> None:
    """The example's comment said the affine ran first, before the colour jitter and sharpness (it runs after them
    since the affine moved, augment_version 2): the order it names is the one augment_frames builds (and logs)."""
    said = re.search(r"^# Steps run in this order: (.*)\.$", EXAMPLE_TOML.read_text(), re.M)
    assert said is not None
    named = said.group(1).split(" -> ")
    config = dataclasses.replace(
        EVERYTHING, sharpness=SharpnessJitter(factor=(0.5, 1.5)), normalize=Normalize(mean=(0.5,) * 3, std=(0.2,) * 3)
    )
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.augment"):
        augment(distinct_windows(), config)
    built = next(r.getMessage() for r in caplog.records if "augmentation: " in r.getMessage())
    steps = [re.sub(r"[ (].*", "", step) for step in built.split("augmentation: ")[1].split(" -> ")]
    assert named == [*steps, "normalize"], built  # (normalize is the hand-over, after every logged step)


def test_from_toml_reads_a_named_table(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text("[augment]\nresize = [8, 8]\n[augment.color_jitter]\nbrightness = 0.25\n")
    config = AugmentConfig.from_toml(path, table="augment")
    assert config == AugmentConfig(resize=(8, 8), color_jitter=ColorJitter(brightness=(0.75, 1.25)))
    with pytest.raises(
        ValueError, match=r"no \[train\] table; tables: \['augment'\]: add it, or name one of those \(table=\)$"
    ):
        AugmentConfig.from_toml(path, table="train")


def test_a_required_key_left_out_says_to_add_it() -> None:
    """It named the missing key only."""
    said = r"random_resized_crop is missing required key\(s\) \['size'\]: add them \(allowed: \[.*'size'.*\]\)$"
    with pytest.raises(ValueError, match=said):
        AugmentConfig.from_dict({"random_resized_crop": {"scale": [0.5, 1.0]}})


def test_to_dict_leaves_out_unset_sections() -> None:
    assert AugmentConfig().to_dict() == {"shared_across_cameras": False}
    assert AugmentConfig(blur=GaussianBlur()).to_dict()["blur"] == {"sigma": [0.1, 2.0], "probability": 1.0}


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ({"resise": [8, 8]}, "resise"),
        ({"color_jitter": {"brigthness": 0.2}}, "brigthness"),
        ({"random_resized_crop": {"scale": [0.5, 1.0]}}, "size"),  # required key missing
        ({"blur": 0.5}, "blur"),
    ],
)
def test_from_dict_rejects_unknown_and_missing_keys(raw: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        AugmentConfig.from_dict(raw)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: ColorJitter(brightness=-0.1), "brightness"),
        (lambda: ColorJitter(contrast=(1.2, 0.8)), "contrast"),
        (lambda: ColorJitter(hue=0.6), "hue"),
        (lambda: ColorJitter(hue=(-0.7, 0.0)), "hue"),
        (lambda: RandomResizedCrop(size=(0, 8)), "size"),
        (lambda: RandomResizedCrop(size=(8, 8), scale=(0.9, 0.1)), "scale"),
        (lambda: RandomResizedCrop(size=(8, 8), scale=(0.5, 1.5)), "scale"),
        (lambda: RandomResizedCrop(size=(8, 8), ratio=(0.0, 1.0)), "ratio"),
        (lambda: GaussianBlur(sigma=0.0), "sigma"),
        (lambda: GaussianBlur(probability=1.5), "probability"),
        (lambda: GaussianBlur(kernel_size=4), "kernel_size"),
        (lambda: RandomAffine(degrees=200.0), "degrees"),
        (lambda: RandomAffine(translate=(1.5, 0.0)), "translate"),
        (lambda: RandomAffine(scale=(0.0, 1.0)), "scale"),
        (lambda: Normalize(mean=(0.5, 0.5), std=(0.1,)), "std"),
        (lambda: Normalize(mean=(0.5,), std=(0.0,)), "std"),
        (lambda: AugmentConfig(resize=(8,)), "resize"),
        (lambda: AugmentConfig(shared_across_cameras=1), "shared_across_cameras"),  # type: ignore[arg-type]
        (lambda: AugmentConfig.from_dict({"affine": {"scale": [1.2, 0.8]}}), "scale"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(make: Callable[[], object], name: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        make()


def test_normalize_says_what_mean_and_std_must_hold() -> None:
    """A mean may be any finite number, a std only one > 0: each refusal says its own bound."""
    with pytest.raises(ValueError, match=r"Normalize\.mean = \(nan,\) is invalid: expected a non-empty list of finite"):
        Normalize(mean=(math.nan,), std=(1.0,))
    with pytest.raises(
        ValueError, match=r"Normalize\.std = \(0\.0,\) is invalid: expected a non-empty list of numbers > 0"
    ):
        Normalize(mean=(0.5,), std=(0.0,))


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        (RandomResizedCrop, {"size": (8, 8)}),
        (ColorJitter, {}),
        (GaussianBlur, {}),
        (RandomAffine, {}),
        (SharpnessJitter, {"factor": (0.5, 1.5)}),
        (RandomSubset, {"max_num_transforms": 1, "weights": {"brightness": 1.0}}),
        (Normalize, {"mean": (0.5,), "std": (0.5,)}),
        (AugmentConfig, {}),
    ],
)
def test_every_augment_config_is_frozen_and_takes_keywords_only(config: type, fields: dict[str, Any]) -> None:
    """A config is checked once, hashed into a checkpoint's signature and sent to every worker: a field set after
    that would escape all three. Its fields are given by name only: positional values would bind by the fields'
    order, which changes as fields are added."""
    made = config(**fields)
    first = dataclasses.fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, getattr(made, first))
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        config(getattr(made, first))


def test_numpy_numbers_configure_as_python_ones() -> None:
    # np.float32 values, numpy ints and 1-D arrays were refused with messages asking for a number or a list.
    f32, i64 = np.float32, np.int64
    from_numpy = AugmentConfig(
        resize=np.array([48, 64]),
        random_resized_crop=RandomResizedCrop(size=(i64(32), i64(40)), scale=np.array([0.5, 1.0], dtype=f32)),
        affine=RandomAffine(degrees=f32(10.0), translate=(f32(0.25), f32(0.125)), scale=(f32(0.5), 2)),
        color_jitter=ColorJitter(brightness=f32(0.25), contrast=i64(1), hue=np.array([-0.25, 0.125], dtype=f32)),
        blur=GaussianBlur(sigma=f32(1.5), probability=f32(0.5), kernel_size=i64(5)),
        normalize=Normalize(mean=np.array([0.5, 0.25, 0.125], dtype=f32), std=[f32(0.25)] * 3),
    )
    from_python = AugmentConfig(
        resize=(48, 64),
        random_resized_crop=RandomResizedCrop(size=(32, 40), scale=(0.5, 1.0)),
        affine=RandomAffine(degrees=10.0, translate=(0.25, 0.125), scale=(0.5, 2.0)),
        color_jitter=ColorJitter(brightness=0.25, contrast=1.0, hue=(-0.25, 0.125)),
        blur=GaussianBlur(sigma=1.5, probability=0.5, kernel_size=5),
        normalize=Normalize(mean=(0.5, 0.25, 0.125), std=(0.25,) * 3),
    )
    assert from_numpy == from_python
    plain = from_numpy.to_dict()
    assert json.loads(json.dumps(plain)) == plain  # stored as Python numbers: JSON and TOML writers take them
    with pytest.raises(ValueError, match=r"Normalize\.mean"):
        Normalize(mean=np.zeros((3, 1, 1)), std=(1.0,) * 3)  # a (C, 1, 1) array: from_stats reads those


def test_jitter_numbers_follow_torchvision_ranges() -> None:
    jitter = ColorJitter(brightness=0.5, contrast=2.0, saturation=(0.2, 0.4), hue=0.1)
    assert (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue) == (
        (0.5, 1.5),
        (0.0, 3.0),
        (0.2, 0.4),
        (-0.1, 0.1),
    )
    assert GaussianBlur(sigma=(0.1, 2.0)).effective_kernel_size == 2 * math.ceil(6.0) + 1


def test_the_documented_range_ends_are_accepted() -> None:
    """ColorJitter's hue takes a number up to 0.5 and RandomAffine's translate fractions in [0, 1], ends included; the
    tests refused only values past them, so a bound made strict (hue 0.5 or translate 1.0 refused) passed."""
    assert ColorJitter(hue=0.5).hue == (-0.5, 0.5)
    assert RandomAffine(translate=(1.0, 1.0)).translate == (1.0, 1.0)


def test_grey_frames_neither_apply_nor_draw_saturation_and_hue() -> None:
    """for_channels(1) zeroes both; with the hue left, a grey camera drew a hue it never applies (its draws named
    differently from what the graph of a grey camera takes)."""
    config = AugmentConfig(color_jitter=ColorJitter(brightness=0.2, saturation=0.3, hue=0.1)).for_channels(1)
    assert config.color_jitter == ColorJitter(brightness=0.2)
    assert draw_names(config) == ("brightness",)


def test_normalize_from_lerobot_stats() -> None:
    stats = {
        "observation.images.top": {"mean": [[[0.1]], [[0.2]], [[0.3]]], "std": [[[0.5]], [[0.25]], [[0.125]]]},
        "action": {"mean": [0.0], "std": [1.0]},
    }
    norm = Normalize.from_stats(stats, "observation.images.top")
    assert norm == Normalize(mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125))
    with pytest.raises(ValueError, match=r"observation\.images\.wrist.*observation\.images\.top"):
        Normalize.from_stats(stats, "observation.images.wrist")
    with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
        Normalize.from_stats({"cam": {"mean": [[0.1, 0.2, 0.3]], "std": [[1, 1, 1]]}}, "cam")


def test_stats_of_the_wrong_length_are_named_as_the_datasets() -> None:
    """A camera's mean of 2 values beside a std of 3 was said as ``Normalize.std ... expected as many values as mean
    (2)`` (the std blamed, the mean the fault); mean and std of 2 values each for a 3-channel camera as ``its Normalize
    has 2 mean/std values ... normalize={camera: Normalize(...)}``, a ValueError that named neither the dataset nor
    its statistics."""
    from lerobot_dali.augment_config import NORMALIZE_FROM_STATS
    from lerobot_dali.errors import StatsError

    rgb = [[[0.5]], [[0.5]], [[0.5]]]
    with pytest.raises(ValueError, match=r"^stats\['cam'\] holds 2 mean values and 3 std values; expected one of each"):
        Normalize.from_stats({"cam": {"mean": [0.1, 0.2], "std": rgb}}, "cam")
    config = AugmentConfig(normalize=NORMALIZE_FROM_STATS)
    two = {"cam": {"mean": [0.1, 0.2], "std": [0.3, 0.4]}}
    with pytest.raises(StatsError, match=(
        r"^ds: normalize='stats' needs the mean/std of camera 'cam' from meta/stats\.json .* but stats\['cam'\] holds "
        r"2 mean/std values for the camera's 3 channel\(s\); expected one per channel, or one for all\. "
    )):  # fmt: skip
        config.with_stats(two, ["cam"], source="ds")
    grey_stds = {"cam": {"mean": rgb, "std": [[[0.1]], [[0.2]], [[0.3]]]}}  # equal means, 3 different stds
    with pytest.raises(StatsError, match=r"camera 'cam' is grey \(1 channel\) but its statistics hold 3 different"):
        config.with_stats(grey_stds, ["cam"], source="ds", channels={"cam": 1})  # (the stds were not compared)
    with pytest.raises(StatsError, match=r"holds 3 mean/std values for the camera's 4 channel\(s\)"):
        config.with_stats({"cam": {"mean": rgb, "std": rgb}}, ["cam"], source="ds", channels={"cam": 4})  # (C19)
    four = {"cam": {"mean": [0.1, 0.2, 0.3, 0.4], "std": [1.0, 1.0, 1.0, 1.0]}}
    for stats, channels, mean in (({"cam": {"mean": [0.1], "std": [0.3]}}, 3, (0.1,)),
                                  ({"cam": {"mean": rgb, "std": rgb}}, 1, (0.5,)),
                                  (four, 4, (0.1, 0.2, 0.3, 0.4))):  # fmt: skip
        assert config.with_stats(stats, ["cam"], source="ds", channels={"cam": channels}).normalize["cam"].mean == mean


def test_bad_call_arguments_are_rejected() -> None:
    data = distinct_windows()
    with pytest.raises(ValueError, match="return_uint8"):
        augment(data, AugmentConfig(normalize=Normalize(mean=(0.5,), std=(0.5,))), return_uint8=True)
    with pytest.raises(ValueError, match="camera_index"):
        run(lambda x: augment_frames(x, config=None, camera_index=-1), data)
    with pytest.raises(ValueError, match="output_size"):
        augment(data, None, output_size=(0, 4))
    with pytest.raises(TypeError, match="DataNode"):
        augment_frames(data, config=None, camera_index=0)  # type: ignore[arg-type]
    # (augment lines 155, 160 and 230, reached by no test)
    with pytest.raises(TypeError, match="^config must be an AugmentConfig or None, got dict$"):
        run(lambda x: augment_frames(x, config={"resize": (4, 4)}, camera_index=0), data)  # type: ignore[arg-type]
    per_camera = AugmentConfig(normalize={"cam": Normalize(mean=(0.5,), std=(0.5,))})
    with pytest.raises(ValueError, match=r"^camera 2: augment_frames applies one Normalize, .*config\.for_camera"):
        run(lambda x: augment_frames(x, config=per_camera, camera_index=2), data)
    blur = RANDOM_CONFIGS["blur"]
    with pytest.raises(TypeError, match=r"^draws\['blur_sigma'\] must be a DALI DataNode, got float$"):
        run(lambda x: augment_frames(x, config=blur, camera_index=0, draws=dict.fromkeys(draw_names(blur), 1.0)), data)


def test_a_crop_try_as_wide_as_the_frame_fits_like_torchvision() -> None:
    # Frame 4 x 8 (h x w), scale 0.5, ratio 4: every try is area 16 at w/h = 4, i.e. 8 x 2 pixels, as wide as the
    # frame, which torchvision accepts (0 < w <= width). Its top is randint(0, 4 - 2 + 1): 0, 1 or 2 rows, so starts
    # y = 0, 0.25, 0.5 all occur over 64 samples; x spans the whole width. (Refusing w == width would fall back to
    # the centred window every time: top 1, y = 0.25 only.)
    config = AugmentConfig(random_resized_crop=RandomResizedCrop(size=(2, 8), scale=(0.5, 0.5), ratio=(4.0, 4.0)))
    keys = np.stack([np.zeros(64, np.int64), np.zeros(64, np.int64), np.arange(64)], axis=1)
    out = draw_params(config, seed=0, stream="camera0", keys=keys, frame_size=(4, 8))
    start, end = out["crop_start"], out["crop_end"]
    assert set(start[:, 0].tolist()) == {0.0, 0.25, 0.5}
    np.testing.assert_array_equal(end[:, 0] - start[:, 0], np.full(64, 0.5, np.float32))  # 2 of 4 rows
    np.testing.assert_array_equal(start[:, 1], np.zeros(64, np.float32))
    np.testing.assert_array_equal(end[:, 1], np.ones(64, np.float32))


@pytest.mark.parametrize(
    ("resize", "ratio", "empty"),
    [((100, 1), (3, 4), "1 x 0 (width / 3 rounds to 0)"), ((1, 100), (0.1, 0.4), "0 x 1 (height * 0.4 rounds to 0)")],
)
def test_a_crop_ratio_whose_fallback_is_empty_in_the_resized_frame_is_refused(resize, ratio, empty) -> None:
    """A 1-pixel-wide frame with ratios 3-4 (its fallback crop 1 / 3 wide: 0) and a 1-pixel-high one with ratios
    0.1-0.4: each refused naming the empty crop and the ratio end that makes it (a mutation pass found the second
    unchecked, and the first's ratio end unsaid)."""
    crop = RandomResizedCrop(size=(8, 8), ratio=ratio)
    with pytest.raises(ValueError, match=re.escape(f"its fallback centre crop would be {empty} pixels")):
        AugmentConfig(resize=resize, random_resized_crop=crop)
