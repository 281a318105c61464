"""Per-camera normalisation through the iterator: ``normalize="stats"`` (each camera by the dataset's own
statistics, as LeRobot's policies normalise images) and ``{camera: Normalize}``.

Expected values: the same samples read as uint8 by an iterator without augmentation, normalised here with
numpy by the mean/std read straight from ``meta/stats.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from lerobot_dali.augment import AugmentConfig, Normalize
from lerobot_dali.errors import StatsError
from lerobot_dali.iterator import DALILeRobotIterator
from tests.conftest import shared_dataset
from tests.test_image_cameras import CAM0, CAM1, _images_dataset, _to_mode

SPEC = {"episodes": 2, "frames_per_episode": [6, 5], "cameras": 2, "codec": "vp9", "fps": 10}


def _first_batch(root: Path, **kwargs) -> dict:
    it = DALILeRobotIterator(root, batch_size=8, shuffle=False, device="cpu", num_workers=0, **kwargs)
    batch = next(iter(it))
    it.close()
    return batch


def _expected(frames_uint8, mean, std) -> np.ndarray:
    """(B, C, H, W) uint8 -> float, normalised per channel."""
    mean = np.asarray(mean, dtype=np.float64).reshape(1, -1, 1, 1)
    std = np.asarray(std, dtype=np.float64).reshape(1, -1, 1, 1)
    return (frames_uint8.numpy().astype(np.float64) / 255 - mean) / std


def test_stats_normalise_each_camera_by_its_own_entry(make_ds) -> None:
    root = make_ds(**SPEC)
    stats = json.loads((root / "meta/stats.json").read_text())
    cameras = ("observation.images.cam0", "observation.images.cam1")
    assert not np.allclose(stats[cameras[0]]["mean"], stats[cameras[1]]["mean"])  # else the test proves little
    raw = _first_batch(root, return_uint8=True)
    normalised = _first_batch(root, augment=AugmentConfig(normalize="stats"))
    assert raw["index"].tolist() == normalised["index"].tolist()
    for camera in cameras:
        expected = _expected(raw[camera], stats[camera]["mean"], stats[camera]["std"])
        np.testing.assert_allclose(normalised[camera].numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=camera)


def test_stats_not_finite_refuse_the_camera_they_normalise_not_the_others_features(make_ds, copy_ds) -> None:
    """normalize="stats" with a NaN in the statistics of a feature it does not use (the state's) reads on; with one in a
    camera's, that camera's normalisation is refused (it would turn every pixel NaN)."""
    root = copy_ds(make_ds(**SPEC))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["mean"][0] = float("nan")
    (root / "meta/stats.json").write_text(json.dumps(stats))
    camera = "observation.images.cam0"
    normalised = _first_batch(root, augment=AugmentConfig(normalize="stats"))
    assert np.isfinite(normalised[camera].numpy()).all()
    stats[camera]["mean"][0] = [[float("nan")]]
    (root / "meta/stats.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="finite"):
        _first_batch(root, augment=AugmentConfig(normalize="stats"))


def test_per_camera_mapping_and_missing_camera(make_ds) -> None:
    root = make_ds(**SPEC)
    norms = {
        "observation.images.cam0": Normalize(mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125)),
        "observation.images.cam1": Normalize(mean=(0.9, 0.8, 0.7), std=(2.0, 3.0, 4.0)),
    }
    raw = _first_batch(root, return_uint8=True)
    normalised = _first_batch(root, augment=AugmentConfig(normalize=norms))
    for camera, norm in norms.items():
        expected = _expected(raw[camera], norm.mean, norm.std)
        np.testing.assert_allclose(normalised[camera].numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=camera)
    with pytest.raises(ValueError, match=r"no Normalize for camera 'observation.images.cam1'"):
        DALILeRobotIterator(
            root,
            device="cpu",
            augment=AugmentConfig(normalize={"observation.images.cam0": norms["observation.images.cam0"]}),
        )


def test_one_value_normalises_every_channel_and_a_wrong_count_fails_at_construction(make_ds) -> None:
    root = make_ds(**SPEC)
    raw = _first_batch(root, return_uint8=True)
    normalised = _first_batch(root, augment=AugmentConfig(normalize=Normalize(mean=(0.5,), std=(0.25,))))
    camera = "observation.images.cam0"
    expected = _expected(raw[camera], [0.5] * 3, [0.25] * 3)
    np.testing.assert_allclose(normalised[camera].numpy(), expected, rtol=1e-5, atol=1e-5)
    four = Normalize(mean=(0.5,) * 4, std=(0.25,) * 4)  # DALI failed on the first batch with a bare size check
    with pytest.raises(
        ValueError, match=r"camera 'observation.images.cam0' has 3 channel\(s\) but its Normalize has 4"
    ):
        DALILeRobotIterator(root, device="cpu", augment=AugmentConfig(normalize=four))
    with pytest.raises(ValueError, match=r"DALILeRobotIterator.image_size = \(0, 48\) is invalid"):
        DALILeRobotIterator(root, device="cpu", image_size=(0, 48))


def test_a_channel_of_zero_std_divides_by_lerobots_epsilon_with_a_warning(make_ds, copy_ds, caplog) -> None:
    """A dead or masked camera channel has std 0 in the statistics: normalize="stats" refused the dataset, where
    LeRobot divides by std + 1e-8 and trains on."""
    root = copy_ds(make_ds(**SPEC))
    stats = json.loads((root / "meta/stats.json").read_text())
    camera = "observation.images.cam0"
    stats[camera]["std"][1] = [[0.0]]
    (root / "meta/stats.json").write_text(json.dumps(stats))
    raw = _first_batch(root, return_uint8=True)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.augment_config"):
        normalised = _first_batch(root, augment=AugmentConfig(normalize="stats"))
    assert "stats['observation.images.cam0']: std is 0 in channel(s) [1]" in caplog.text
    std = [stats[camera]["std"][0][0][0], 1e-8, stats[camera]["std"][2][0][0]]
    expected = _expected(raw[camera], stats[camera]["mean"], std)
    np.testing.assert_allclose(normalised[camera].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_cr5_v21_normalises_by_the_aggregate_of_its_episode_statistics() -> None:
    """v2.1 has no stats.json: the per-episode statistics aggregate to what LeRobot's converter stored in v3.0."""
    camera = "observation.images.top"
    stored = json.loads((shared_dataset("cr5_v30_av1") / "meta/stats.json").read_text())[camera]
    root = shared_dataset("cr5_v21_av1")
    common = {"timestamp_source": "frame_index", "episodes": [3]}
    raw = _first_batch(root, return_uint8=True, **common)
    normalised = _first_batch(root, augment=AugmentConfig(normalize="stats"), **common)
    expected = _expected(raw[camera], stored["mean"], stored["std"])
    np.testing.assert_allclose(normalised[camera].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_stats_without_the_camera_fail_naming_it() -> None:
    """r1's stats.json has state and action only."""
    root = shared_dataset("r1_v30_h264")
    with pytest.raises(StatsError, match=r"camera 'observation.images.rgb'.*no entry 'observation.images.rgb'"):
        DALILeRobotIterator(root, device="cpu", augment=AugmentConfig(normalize="stats"))


def test_a_dataset_without_statistics_is_said_to_have_none() -> None:
    """It said the statistics had "no entry" for the camera, listing the entries with a mean: []."""
    with pytest.raises(
        StatsError, match=r"from meta/stats\.json \(or v2\.1's .*\), but the dataset has neither file\. Give"
    ):
        AugmentConfig(normalize="stats").with_stats({}, ["observation.images.top"], source="ds")


def test_toml_forms_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "augment.toml"
    path.write_text('normalize = "stats"\n')
    assert AugmentConfig.from_toml(path).normalize == "stats"
    path.write_text("[normalize.cam0]\nmean = [0.5]\nstd = [0.25]\n[normalize.cam1]\nmean = [0.1]\nstd = [2.0]\n")
    config = AugmentConfig.from_toml(path)
    assert config.normalize == {"cam0": Normalize(mean=(0.5,), std=(0.25,)), "cam1": Normalize(mean=(0.1,), std=(2.0,))}
    assert AugmentConfig.from_dict(config.to_dict()) == config
    assert config.for_camera("cam1").normalize == Normalize(mean=(0.1,), std=(2.0,))
    assert AugmentConfig.from_dict(AugmentConfig(normalize="stats").to_dict()).normalize == "stats"
    for bad, pattern in (("everything", r"normalize = 'everything' is invalid"), ({}, r"normalize = \{\} is invalid")):
        with pytest.raises(ValueError, match=pattern):
            AugmentConfig(normalize=bad)  # type: ignore[arg-type]


def test_toml_camera_keys_with_dots_unquoted(tmp_path: Path) -> None:
    """LeRobot's camera keys hold dots, which TOML splits into nested tables unless the key is quoted:
    ``[normalize.observation.images.top]`` means the camera ``observation.images.top`` as the quoted form does
    (it failed as "AugmentConfig.normalize.observation has unknown key(s) ['images']")."""
    path = tmp_path / "augment.toml"
    path.write_text(
        "[normalize.observation.images.top]\nmean = [0.5]\nstd = [0.25]\n"
        '[normalize."observation.images.wrist"]\nmean = [0.1]\nstd = [2.0]\n'
    )
    config = AugmentConfig.from_toml(path)
    assert config.normalize == {
        "observation.images.top": Normalize(mean=(0.5,), std=(0.25,)),
        "observation.images.wrist": Normalize(mean=(0.1,), std=(2.0,)),
    }
    assert AugmentConfig.from_dict(config.to_dict()) == config
    path.write_text("[normalize.observation.images.top]\nmean = [0.5]\nstdev = [0.25]\n")
    with pytest.raises(ValueError, match=r"normalize.observation.images.top has unknown key\(s\) \['stdev'\]"):
        AugmentConfig.from_toml(path)


@pytest.mark.parametrize(
    "normalize",
    ["stats", Normalize(mean=(0.5,), std=(0.25,)), {"observation.images.cam1": Normalize(mean=(0.5,), std=(0.25,))}],
    ids=["stats", "one", "per-camera"],
)
def test_return_uint8_with_normalize_fails_at_construction(make_ds, normalize) -> None:
    """Normalised values do not fit uint8: refused when the iterator is built, as the other option mistakes are,
    not when the first pass builds the graph (with workers, after they started)."""
    root = make_ds(**SPEC)
    if isinstance(normalize, dict):  # one camera left: cameras= narrows what must have a Normalize
        options: dict = {"cameras": ["observation.images.cam1"]}
    else:
        options = {}
    with pytest.raises(ValueError, match=r"return_uint8=True cannot be combined with AugmentConfig.normalize"):
        DALILeRobotIterator(
            root, device="cpu", num_workers=0, return_uint8=True, augment=AugmentConfig(normalize=normalize), **options
        )


def test_an_augment_that_is_not_an_augment_config_is_refused_naming_it(make_ds, tmp_path: Path) -> None:
    """A TOML table or a file name passed as ``augment`` was an AttributeError ('dict' has no 'normalize')."""
    root = make_ds(**SPEC)
    for wrong in ({"resize": [32, 32]}, str(tmp_path / "augment.toml")):
        with pytest.raises(TypeError, match=r"augment must be an AugmentConfig or None, got (dict|str).*from_toml"):
            DALILeRobotIterator(root, device="cpu", num_workers=0, augment=wrong)  # type: ignore[arg-type]


def test_a_grey_image_camera_takes_lerobots_three_equal_statistics_as_one_value(make_ds, copy_ds) -> None:
    """LeRobot 0.4.4 writes every camera's statistics over its frames as RGB: (3, 1, 1), 3 equal values, for a grey
    (mode L) image camera, which its normaliser broadcasts over the camera's one channel (3 equal channels).
    normalize="stats" refused such a dataset (1 channel, 3 values); the one channel is normalised by the one value
    (each of LeRobot's 3 channels), and 3 different values are refused, naming the camera and the fix."""
    root = copy_ds(_images_dataset(make_ds))
    _to_mode(root, CAM0, "L")
    stats = json.loads((root / "meta/stats.json").read_text())
    stats[CAM0]["mean"], stats[CAM0]["std"] = [[[0.4]]] * 3, [[[0.2]]] * 3  # as LeRobot writes a grey camera's
    (root / "meta/stats.json").write_text(json.dumps(stats))
    raw = _first_batch(root, return_uint8=True)
    normalised = _first_batch(root, augment=AugmentConfig(normalize="stats"))
    assert normalised[CAM0].shape == raw[CAM0].shape == (8, 1, 64, 96)
    np.testing.assert_allclose(normalised[CAM0].numpy(), _expected(raw[CAM0], [0.4], [0.2]), rtol=1e-5, atol=1e-5)
    rgb = stats[CAM1]  # the other camera by its own 3 values, as before
    np.testing.assert_allclose(
        normalised[CAM1].numpy(), _expected(raw[CAM1], rgb["mean"], rgb["std"]), rtol=1e-5, atol=1e-5
    )
    stats[CAM0]["mean"][1] = [[0.5]]
    (root / "meta/stats.json").write_text(json.dumps(stats))
    with pytest.raises(
        StatsError,
        match=r"camera 'observation\.images\.cam0' is grey \(1 channel\) but its statistics hold 3 different values "
        r"\(mean \[0\.4, 0\.5, 0\.4\], std \[0\.2, 0\.2, 0\.2\]\).*Give the camera one value",
    ):
        _first_batch(root, augment=AugmentConfig(normalize="stats"))
