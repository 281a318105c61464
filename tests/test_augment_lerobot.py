"""LeRobot's image transforms here: the sharpness jitter, the per-sample random subset, and the config mapping."""

from __future__ import annotations

import hashlib
import itertools
import json
import pickle
from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from lerobot_dali.augment import (
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomAffine,
    RandomSubset,
    SharpnessJitter,
)
from lerobot_dali.augment_draws import draw_names, draw_params
from tests.test_augment import EVERYTHING, RANDOM_CONFIGS, augment, distinct_windows, draw_keys, run_augmented

#: LeRobot 0.4.4's ``ImageTransformsConfig(enable=True)`` as ``dataclasses.asdict`` (a train config's JSON) gives it.
LEROBOT_DEFAULT: dict[str, Any] = {
    "enable": True,
    "max_num_transforms": 3,
    "random_order": False,
    "tfs": {
        "brightness": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": [0.8, 1.2]}},
        "contrast": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"contrast": [0.8, 1.2]}},
        "saturation": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"saturation": [0.5, 1.5]}},
        "hue": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"hue": [-0.05, 0.05]}},
        "sharpness": {"weight": 1.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}},
        "affine": {
            "weight": 1.0,
            "type": "RandomAffine",
            "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]},
        },
    },
}


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


@pytest.mark.parametrize("size", [(1, 1), (2, 2), (2, 7), (5, 1), (3, 3), (3, 4)])
@pytest.mark.parametrize("channels", [3, 1])
def test_sharpness_of_tiny_frames_keeps_their_border_as_torchvision(size: tuple[int, int], channels: int) -> None:
    # A frame of 2 pixels or fewer a side has no inside: torchvision returns it as it is. Its size known while the
    # graph is built (output_size) or only per sample (frames at their own size): a "valid" 3x3 filter failed both.
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (2, 2, *size, channels), dtype=np.uint8)
    config = AugmentConfig(sharpness=SharpnessJitter(factor=(0.0, 0.0)))
    expected = _sharpened(data, 0.0).transpose(0, 1, 4, 2, 3)
    for out in (
        run_augmented(config, data, return_uint8=True, channels=channels)[0][0],
        run_augmented(config, data, return_uint8=True, channels=channels, output_size=size)[0][0],
    ):
        assert out.shape == expected.shape
        assert np.abs(out - expected).max() <= 0.5 + 1e-6
        if min(size) <= 2:  # (expected is the frame itself there)
            np.testing.assert_array_equal(out, data.transpose(0, 1, 4, 2, 3))


# --- the random subset -------------------------------------------------------------------------------


def _inclusion(weights: list[float], n: int) -> np.ndarray:
    """Each member's chance to be among n drawn one at a time without replacement, in proportion to weights
    (torch.multinomial's replacement=False), summed over every ordered draw."""
    p = np.zeros(len(weights))
    for order in itertools.permutations(range(len(weights)), n):
        chance, left = 1.0, sum(weights)
        for i in order:
            chance *= weights[i] / left
            left -= weights[i]
        p[list(order)] += chance
    return p


SUBSET = AugmentConfig(
    color_jitter=ColorJitter(brightness=(1.1, 1.3), contrast=(0.5, 0.9), saturation=(1.2, 1.4), hue=(0.1, 0.2)),
    sharpness=SharpnessJitter(factor=(1.5, 2.0)),
    random_subset=RandomSubset(
        max_num_transforms=3, weights={"brightness": 1, "contrast": 1, "saturation": 1, "hue": 1, "sharpness": 2}
    ),
)
IDENTITY = {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0, "sharpness": 1.0}


def test_subset_picks_as_lerobots_multinomial_without_replacement() -> None:
    n = 2000
    draws = _draw(SUBSET, n)
    picked = np.stack([draws[m] != IDENTITY[m] for m in IDENTITY], axis=1)
    assert (picked.sum(axis=1) == 3).all()  # exactly max_num_transforms per sample
    expected = _inclusion([1, 1, 1, 1, 2], 3)  # [0.55, 0.55, 0.55, 0.55, 0.8]
    np.testing.assert_allclose(picked.mean(axis=0), expected, atol=0.04)
    # A picked member keeps its range's draw; a skipped one is exactly the identity.
    for m, (lo, hi) in {"brightness": (1.1, 1.3), "hue": (0.1, 0.2), "sharpness": (1.5, 2.0)}.items():
        values = draws[m][draws[m] != IDENTITY[m]]
        assert values.min() >= np.float32(lo) and values.max() <= np.float32(hi), m
        assert set(np.unique(draws[m][draws[m] < lo]).tolist()) <= {IDENTITY[m]}, m


def test_subset_picks_each_pair_as_often_as_lerobot() -> None:
    # Which pair, not only how often each member: weights 1, 2, 3, two per sample.
    config = AugmentConfig(
        color_jitter=ColorJitter(brightness=(1.1, 1.3), contrast=(0.5, 0.9), hue=(0.1, 0.2)),
        random_subset=RandomSubset(max_num_transforms=2, weights={"brightness": 1, "contrast": 2, "hue": 3}),
    )
    draws = _draw(config, 4000)
    left_out = np.argmin(np.stack([draws[m] != IDENTITY[m] for m in ("brightness", "contrast", "hue")], axis=1), axis=1)
    # P(pair) = P(the third member is left out) = sum over the two orders of drawing the pair
    weights = [1.0, 2.0, 3.0]
    expected = [
        sum(weights[a] / 6 * weights[b] / (6 - weights[a]) for a, b in itertools.permutations(set(range(3)) - {k}))
        for k in range(3)
    ]  # [0.583, 0.267, 0.15]
    np.testing.assert_allclose(np.bincount(left_out, minlength=3) / 4000, expected, atol=0.025)


def test_subset_of_as_many_as_weighted_applies_every_one() -> None:
    config = AugmentConfig(
        color_jitter=SUBSET.color_jitter,
        random_subset=RandomSubset(max_num_transforms=9, weights={"brightness": 1, "hue": 3}),
    )
    draws = _draw(config, 50)
    assert (draws["brightness"] > 1.05).all() and (draws["hue"] >= 0.1).all()
    # unweighted factors apply to every sample, as without a subset
    assert (draws["contrast"] < 0.95).all() and (draws["saturation"] > 1.15).all()
    assert config.random_subset is not None and config.random_subset.count == 2  # (count read max_num_transforms: 9)


def test_subset_turns_a_constant_member_into_a_draw_and_skips_identities() -> None:
    config = AugmentConfig(
        affine=RandomAffine(scale=(1.2, 1.2), translate=(0.1, 0.0)),
        color_jitter=ColorJitter(brightness=(1.5, 1.5), contrast=(1.3, 1.3)),
        sharpness=SharpnessJitter(factor=(1.0, 1.0)),
        random_subset=RandomSubset(max_num_transforms=1, weights={"brightness": 1, "affine": 1, "sharpness": 1}),
    )
    # Without the subset the constants are graph constants; with it, a skipped sample needs the identity. Contrast
    # is no member: its constant applies to every sample, so it stays a graph constant.
    assert draw_names(config) == ("affine_scale", "affine_translate", "brightness")
    draws = _draw(config, 400)
    affine = draws["affine_scale"] != 1.0
    assert set(np.unique(draws["affine_scale"]).tolist()) == {1.0, np.float32(1.2)}
    assert (draws["affine_translate"][~affine] == 0).all() and (draws["affine_translate"][affine, 0] != 0).all()
    assert set(np.unique(draws["brightness"]).tolist()) == {1.0, 1.5}
    assert not (affine & (draws["brightness"] == 1.5)).any()  # one transform per sample
    # sharpness (identity range) is picked a third of the time and then does nothing
    assert 0.25 < np.mean(~affine & (draws["brightness"] == 1.0)) < 0.42


def test_a_sample_not_picked_for_a_transform_gets_its_identity_in_the_graph() -> None:
    brighter = AugmentConfig(color_jitter=ColorJitter(brightness=(1.5, 1.5)))
    smoothed = AugmentConfig(sharpness=SharpnessJitter(factor=(0.0, 0.0)))
    config = AugmentConfig(
        color_jitter=brighter.color_jitter,
        sharpness=smoothed.sharpness,
        random_subset=RandomSubset(max_num_transforms=1, weights={"brightness": 1, "sharpness": 1}),
    )
    data = distinct_windows(n=8)
    picks = draw_params(config, seed=0, stream="camera0", keys=draw_keys(8), frame_size=None)["brightness"] == 1.5
    assert 0 < picks.sum() < 8
    out = augment(data, config, return_uint8=True)
    alone = {True: augment(data, brighter, return_uint8=True), False: augment(data, smoothed, return_uint8=True)}
    for i, brightened in enumerate(picks):
        np.testing.assert_array_equal(out[i], alone[bool(brightened)][i], err_msg=f"sample {i}")


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


def test_sharpness_draws_stay_in_their_own_slot() -> None:
    # SharpnessJitter came after e13e363, so the digest above holds none of its draws: read from blur_window's slot
    # (49 for its 50), a resumed run or an old recipe drew other factors, and each sample's sharpness decided its blur.
    # Its factors as slot 50 gives them, with a blur drawn beside them or not.
    sharp = AugmentConfig(sharpness=SharpnessJitter(factor=(0.5, 1.5)))
    blurred = replace(sharp, blur=GaussianBlur(sigma=(0.1, 2.0), probability=0.5))
    for config in (sharp, blurred):
        params = draw_params(config, seed=3, stream="camera1", keys=draw_keys(4, epoch=2), frame_size=None)
        np.testing.assert_array_equal(params["sharpness"], np.float32([0.7721861, 1.4152794, 0.96545273, 1.1008083]))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RandomSubset(max_num_transforms=0, weights={"hue": 1}), "max_num_transforms"),
        (lambda: RandomSubset(max_num_transforms=2, weights={"blur": 1}), "weights"),
        (lambda: RandomSubset(max_num_transforms=2, weights={"hue": 0}), "weights"),
        (lambda: RandomSubset(max_num_transforms=2, weights={}), "weights"),
        (lambda: SharpnessJitter(factor=(1.5, 0.5)), "factor"),
        (
            lambda: AugmentConfig(random_subset=RandomSubset(max_num_transforms=1, weights={"sharpness": 1})),
            "AugmentConfig.sharpness is not set",
        ),
    ],
)
def test_bad_subset_and_sharpness_options_are_refused(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_subset_and_sharpness_round_trip_through_a_table() -> None:
    assert AugmentConfig.from_dict(SUBSET.to_dict()) == SUBSET
    assert SUBSET.to_dict()["random_subset"] == {
        "max_num_transforms": 3,
        "weights": {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0, "sharpness": 2.0},
    }
    # to_dict hands out a copy: its weights were the config's own dict, so editing them changed the frozen config
    table = SUBSET.to_dict()
    table["random_subset"]["weights"]["hue"] = 50.0
    assert SUBSET.random_subset is not None and SUBSET.random_subset.weights["hue"] == 1.0


def test_configs_with_weights_or_a_normalize_per_camera_hash_and_stay_frozen() -> None:
    # RandomSubset's weights and a per-camera normalize were dicts: hash() of such a frozen config raised TypeError
    # (no set member, dict key or functools.cache argument), and `weights["hue"] = 50` edited the config in place.
    per_camera = AugmentConfig(normalize={"cam": Normalize(mean=(0.5,), std=(0.25,))})
    for config in (SUBSET, per_camera):
        same = AugmentConfig.from_dict(config.to_dict())
        assert hash(same) == hash(config) and {config: 1}[same] == 1
        assert pickle.loads(pickle.dumps(config)) == config
    assert len({SUBSET, replace(SUBSET, random_subset=RandomSubset(max_num_transforms=1, weights={"hue": 1}))}) == 2
    assert SUBSET.random_subset is not None and SUBSET.random_subset.weights == {
        "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0, "sharpness": 2.0
    }  # fmt: skip
    with pytest.raises(TypeError):
        SUBSET.random_subset.weights["hue"] = 50.0  # type: ignore[index]


def test_configs_with_weights_or_a_normalize_per_camera_stay_plain_data_through_asdict() -> None:
    # As a Mapping that was not a dict, dataclasses.asdict left the weights and a per-camera normalize (its Normalize
    # dataclasses with it) as they were, and json.dumps of the result raised TypeError.
    per_camera = AugmentConfig(normalize={"cam": Normalize(mean=(0.5,), std=(0.25,))})
    assert json.loads(json.dumps(asdict(per_camera)))["normalize"] == {"cam": {"mean": [0.5], "std": [0.25]}}
    assert SUBSET.random_subset is not None
    assert json.loads(json.dumps(asdict(SUBSET)))["random_subset"]["weights"]["sharpness"] == 2.0
    assert json.loads(json.dumps(SUBSET.random_subset.weights)) == SUBSET.random_subset.weights
    for edit in (lambda w: w.update(hue=50.0), lambda w: w.pop("hue"), lambda w: w.clear()):
        with pytest.raises(TypeError, match="read-only"):
            edit(SUBSET.random_subset.weights)
    assert SUBSET.random_subset.weights["hue"] == 1.0


# --- LeRobot's config ----------------------------------------------------------------------------------


def _as_object(raw: dict[str, Any]) -> SimpleNamespace:
    """The dict form as LeRobot's dataclasses (attributes, tuples)."""
    tfs = {
        name: SimpleNamespace(
            weight=tf["weight"], type=tf["type"], kwargs={k: tuple(v) for k, v in tf["kwargs"].items()}
        )
        for name, tf in raw["tfs"].items()
    }
    return SimpleNamespace(**{**raw, "tfs": tfs})


@pytest.mark.parametrize("form", ["dict", "object"])
def test_from_lerobot_maps_lerobots_default_transforms(form: str) -> None:
    config = AugmentConfig.from_lerobot(LEROBOT_DEFAULT if form == "dict" else _as_object(LEROBOT_DEFAULT))
    assert config == AugmentConfig(
        affine=RandomAffine(degrees=(-5.0, 5.0), translate=(0.05, 0.05)),
        color_jitter=ColorJitter(brightness=(0.8, 1.2), contrast=(0.8, 1.2), saturation=(0.5, 1.5), hue=(-0.05, 0.05)),
        sharpness=SharpnessJitter(factor=(0.5, 1.5)),
        random_subset=RandomSubset(max_num_transforms=3, weights=dict.fromkeys(IDENTITY.keys() | {"affine"}, 1.0)),
    )
    assert not config.shared_across_cameras  # LeRobot transforms each camera on its own
    draws = _draw(config, 2000)
    picked = np.stack([draws[m] != IDENTITY[m] for m in IDENTITY] + [draws["affine_translate"][:, 0] != 0], axis=1)
    assert (picked.sum(axis=1) == 3).all()
    np.testing.assert_allclose(picked.mean(axis=0), 0.5, atol=0.04)  # 3 of 6 equal weights


def _lerobot(**changes: Any) -> dict[str, Any]:
    raw = {**LEROBOT_DEFAULT, "tfs": dict(LEROBOT_DEFAULT["tfs"])}
    tfs = changes.pop("tfs", {})
    raw.update(changes)
    for name, tf in tfs.items():
        if tf is None:
            del raw["tfs"][name]
        else:
            raw["tfs"][name] = tf
    return raw


#: Every transform of LeRobot's default table but its sharpness left out.
_ALL_BUT_SHARPNESS: dict[str, None] = {name: None for name in LEROBOT_DEFAULT["tfs"] if name != "sharpness"}


def test_from_lerobot_follows_enable_weights_and_max_num_transforms() -> None:
    assert AugmentConfig.from_lerobot(_lerobot(enable=False)) == AugmentConfig()
    # every weight 0: LeRobot keeps no transform and applies its Identity
    unweighted = {name: {**tf, "weight": 0.0} for name, tf in LEROBOT_DEFAULT["tfs"].items()}
    assert AugmentConfig.from_lerobot(_lerobot(tfs=unweighted)) == AugmentConfig()
    with pytest.raises(TypeError, match="^expected LeRobot's ImageTransformsConfig or its dict form, got int"):
        AugmentConfig.from_lerobot(3)
    every = AugmentConfig.from_lerobot(_lerobot(max_num_transforms=6))
    assert every.random_subset is None and every.sharpness is not None  # all six on every sample
    dropped = AugmentConfig.from_lerobot(
        _lerobot(tfs={"sharpness": {**LEROBOT_DEFAULT["tfs"]["sharpness"], "weight": 0.0}, "hue": None})
    )
    assert dropped.sharpness is None and dropped.random_subset is not None
    assert dropped.random_subset.weights == dict.fromkeys(("brightness", "contrast", "saturation", "affine"), 1.0)
    # one transform per sample: the order does not matter, so random_order is accepted
    assert AugmentConfig.from_lerobot(_lerobot(max_num_transforms=1, random_order=True)).random_subset is not None
    # and so it is where only one transform is left, whatever max_num_transforms says (3 here)
    alone = AugmentConfig.from_lerobot(_lerobot(random_order=True, tfs=_ALL_BUT_SHARPNESS))
    assert alone == AugmentConfig(sharpness=SharpnessJitter(factor=(0.5, 1.5)))
    # numpy's booleans (a config read through numpy) are booleans too
    assert AugmentConfig.from_lerobot(_lerobot(enable=np.bool_(False))) == AugmentConfig()
    # an object with only some of the fields is no config, and a transform with only some is refused by name
    with pytest.raises(TypeError, match="^expected LeRobot's ImageTransformsConfig or its dict form, got Simple"):
        AugmentConfig.from_lerobot(SimpleNamespace(enable=True, tfs={}))
    with pytest.raises(ValueError, match=r"^image_transforms\.tfs\.hue = namespace\(.*\) is invalid: expected a table"):
        AugmentConfig.from_lerobot(_lerobot(tfs={"hue": SimpleNamespace(weight=1.0, type="ColorJitter")}))


def test_from_lerobot_fills_in_lerobots_defaults_and_keeps_each_weight() -> None:
    """A dict form that leaves out max_num_transforms (LeRobot: 3), a weight (1.0) and the affine's translate and
    scale (none): 3 of the 4 transforms per sample, each drawn by its own weight."""
    sharpness = {k: v for k, v in LEROBOT_DEFAULT["tfs"]["sharpness"].items() if k != "weight"}
    affine = {"weight": 2.0, "type": "RandomAffine", "kwargs": {"degrees": [-5.0, 5.0]}}
    hue = {**LEROBOT_DEFAULT["tfs"]["hue"], "weight": 0.5}
    brightness = {**LEROBOT_DEFAULT["tfs"]["brightness"], "weight": 3}
    raw = {"enable": True, "tfs": {"sharpness": sharpness, "affine": affine, "hue": hue, "brightness": brightness}}
    assert AugmentConfig.from_lerobot(raw) == AugmentConfig(
        affine=RandomAffine(degrees=(-5.0, 5.0), translate=(0.0, 0.0), scale=(1.0, 1.0)),
        color_jitter=ColorJitter(brightness=(0.8, 1.2), hue=(-0.05, 0.05)),
        sharpness=SharpnessJitter(factor=(0.5, 1.5)),
        random_subset=RandomSubset(
            max_num_transforms=3, weights={"sharpness": 1.0, "affine": 2.0, "hue": 0.5, "brightness": 3.0}
        ),
    )


def test_from_lerobot_takes_what_lerobot_runs_and_refuses_what_it_refuses() -> None:
    # LeRobot 0.4.4 runs max_num_transforms=0 as its Identity, and a ColorJitter factor of None (torchvision: off)
    assert AugmentConfig.from_lerobot(_lerobot(max_num_transforms=0)) == AugmentConfig()
    off = {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": None, "contrast": [0.8, 1.2]}}
    config = AugmentConfig.from_lerobot(_lerobot(max_num_transforms=1, tfs={"brightness": off, "contrast": None}))
    assert config.color_jitter is not None and config.color_jitter.brightness == (1.0, 1.0)
    assert config.color_jitter.contrast == (0.8, 1.2)
    # and refuses a RandomAffine without degrees (torchvision's TypeError), which ran here unrotated
    shifted = {"weight": 1.0, "type": "RandomAffine", "kwargs": {"translate": [0.1, 0.1]}}
    with pytest.raises(ValueError, match="'degrees'"):
        AugmentConfig.from_lerobot(_lerobot(tfs={"affine": shifted}))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (_lerobot(random_order=True), "random_order = true is not supported with 3 transforms"),
        (_lerobot(tfs={"crop": {"weight": 1.0, "type": "RandomCrop", "kwargs": {"size": 8}}}), "'RandomCrop'"),
        (_lerobot(tfs={"noop": {"weight": 1.0, "type": "Identity", "kwargs": {}}}), "'Identity' has no counterpart"),
        (
            _lerobot(tfs={"affine": {"weight": 1.0, "type": "RandomAffine", "kwargs": {"degrees": 5, "shear": 3}}}),
            r"\['shear'\]",
        ),
        (
            _lerobot(tfs={"both": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": 0.1}}}),
            "also set: \\['brightness'\\]",
        ),
        (
            _lerobot(
                tfs={
                    "brightness": {"weight": 1, "type": "ColorJitter", "kwargs": {"brightness": 0.2, "contrast": 0.2}},
                    "contrast": None,
                }
            ),
            "split it into one ColorJitter per factor",
        ),
        ({"enable": True}, "has no 'tfs'"),
        # a max_num_transforms of no int is refused, not read as 0 (no transforms) or skipped for one transform
        (_lerobot(max_num_transforms=False), r"max_num_transforms = False is invalid: expected an integer >= 1"),
        (_lerobot(max_num_transforms=0.0), r"max_num_transforms = 0\.0 is invalid: expected an integer >= 1"),
        (_lerobot(max_num_transforms=-1, tfs=_ALL_BUT_SHARPNESS), "max_num_transforms = -1 is invalid"),
        # A typo (LeRobot's own config parser refuses it) ran LeRobot's defaults for that key, a string "false"
        # enabled the transforms, and a malformed entry was a TypeError that named no transform.
        (_lerobot(max_num_transform=1), r"unknown key\(s\) \['max_num_transform'\].*allowed: \['enable', "),
        (
            _lerobot(tfs={"hue": {"wieght": 0.0, "type": "ColorJitter", "kwargs": {"hue": 0.1}}}),
            r"image_transforms\.tfs\.hue has unknown key\(s\) \['wieght'\]",
        ),
        (_lerobot(enable="false"), r"image_transforms\.enable = 'false' is invalid: expected true or false"),
        (_lerobot(random_order="false"), r"image_transforms\.random_order = 'false' is invalid"),
        (
            _lerobot(tfs={"hue": {"weight": 1.0, "type": "ColorJitter", "kwargs": [0.1]}}),
            r"image_transforms\.tfs\.hue\.kwargs = \[0\.1\] is invalid: expected a table",
        ),
        (
            {**LEROBOT_DEFAULT, "tfs": {**LEROBOT_DEFAULT["tfs"], "hue": None}},
            r"image_transforms\.tfs\.hue = None is invalid: expected a table",
        ),
        (
            {**LEROBOT_DEFAULT, "tfs": ["brightness"]},
            r"^image_transforms\.tfs = \['brightness'\] is invalid: expected a table of ",
        ),
        (
            _lerobot(tfs={"hue": {"weight": "1", "type": "ColorJitter", "kwargs": {"hue": [-0.05, 0.05]}}}),
            r"^image_transforms\.tfs\.hue\.weight = '1' is invalid: expected a number",
        ),
        (
            _lerobot(tfs={"again": {"weight": 1.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}}}),
            r"^image_transforms\.tfs\.again: one SharpnessJitter with its 'sharpness' range is supported",
        ),
    ],
    ids=[
        "random-order",
        "unknown-type",
        "identity",
        "shear",
        "factor-twice",
        "joined-factors",
        "no-tfs",
        "max-false",
        "max-float-zero",
        "max-negative-one-transform",
        "unknown-key",
        "unknown-tf-key",
        "enable-string",
        "random-order-string",
        "kwargs-list",
        "tf-none",
        "tfs-list",
        "weight-string",
        "sharpness-twice",
    ],
)
def test_from_lerobot_refuses_what_it_cannot_reproduce(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AugmentConfig.from_lerobot(raw)
