"""augment_frames on DALI CPU pipelines fed with synthetic FHWC uint8 windows."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

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

EXAMPLE_TOML = Path(__file__).resolve().parents[1] / "pipelines" / "recipes" / "augment_example.toml"
B, T, H, W = 4, 3, 32, 48

RANDOM_CONFIGS = {
    "color_jitter": AugmentConfig(color_jitter=ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)),
    "random_resized_crop": AugmentConfig(random_resized_crop=RandomResizedCrop(size=(24, 24), scale=(0.3, 0.9))),
    "affine": AugmentConfig(affine=RandomAffine(degrees=20.0, translate=(0.1, 0.1), scale=(0.8, 1.2))),
    "blur": AugmentConfig(blur=GaussianBlur(sigma=(0.3, 3.0), kernel_size=7)),
}
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


def augment(data: np.ndarray, config: AugmentConfig | None, *, seed: int = 0, **kwargs: object) -> np.ndarray:
    return run(lambda x: augment_frames(x, config=config, seed=seed, camera_index=0, **kwargs), data)[0][0]


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


def test_fixed_rotation_turns_counter_clockwise_like_torchvision() -> None:
    dot = np.zeros((1, 1, 33, 33, 3), dtype=np.uint8)
    dot[0, 0, 16, 26] = 255  # ten pixels right of the centre pixel (16, 16)
    rotate = RandomAffine(degrees=(90.0, 90.0))
    # Without a known size the centre comes from the run-time shape; with resize it is a constant.
    for config in (AugmentConfig(affine=rotate), AugmentConfig(resize=(33, 33), affine=rotate)):
        out = augment(dot, config, return_uint8=True)[0, 0, 0]
        assert np.unravel_index(np.argmax(out), out.shape) == (6, 16)  # now ten pixels above it


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
    data = distinct_windows()
    return run(lambda x: augment_frames(x, config=EVERYTHING, seed=seed, camera_index=0), data, iterations=2)


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

    def two_cameras(a, b):  # type: ignore[no-untyped-def]
        return [augment_frames(x, config=config, seed=9, camera_index=i) for i, x in enumerate((a, b))]

    cam0, cam1 = run(two_cameras, data, data.copy())[0]
    assert np.array_equal(cam0, cam1) is shared
    for i in range(B):  # not shared: every sample draws anew per camera
        assert np.array_equal(cam0[i], cam1[i]) is shared


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


def test_from_toml_reads_a_named_table(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text("[augment]\nresize = [8, 8]\n[augment.color_jitter]\nbrightness = 0.25\n")
    config = AugmentConfig.from_toml(path, table="augment")
    assert config == AugmentConfig(resize=(8, 8), color_jitter=ColorJitter(brightness=(0.75, 1.25)))
    with pytest.raises(ValueError, match=r"no \[train\] table"):
        AugmentConfig.from_toml(path, table="train")


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


def test_jitter_numbers_follow_torchvision_ranges() -> None:
    jitter = ColorJitter(brightness=0.5, contrast=2.0, saturation=(0.2, 0.4), hue=0.1)
    assert (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue) == (
        (0.5, 1.5),
        (0.0, 3.0),
        (0.2, 0.4),
        (-0.1, 0.1),
    )
    assert GaussianBlur(sigma=(0.1, 2.0)).effective_kernel_size == 2 * math.ceil(6.0) + 1


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


def test_bad_call_arguments_are_rejected() -> None:
    data = distinct_windows()
    with pytest.raises(ValueError, match="return_uint8"):
        augment(data, AugmentConfig(normalize=Normalize(mean=(0.5,), std=(0.5,))), return_uint8=True)
    with pytest.raises(ValueError, match="camera_index"):
        run(lambda x: augment_frames(x, config=None, seed=0, camera_index=-1), data)
    with pytest.raises(ValueError, match="output_size"):
        augment(data, None, output_size=(0, 4))
    with pytest.raises(TypeError, match="DataNode"):
        augment_frames(data, config=None, seed=0, camera_index=0)  # type: ignore[arg-type]
