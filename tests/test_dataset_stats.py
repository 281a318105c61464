"""read_dataset_stats: stats.json as stored, v2.1's per-episode statistics aggregated as LeRobot does.

Expected values: LeRobot's own aggregate (its v2.1 -> v3.0 converter wrote cr5_v30's stats.json from the
per-episode statistics that cr5_v21 keeps), and numpy's statistics of the concatenated raw values.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_info import DatasetInfo
from lerobot_dali.dataset_location import resolve_location
from lerobot_dali.dataset_stats import aggregate_episode_stats, read_dataset_stats, stats_faults
from lerobot_dali.errors import DatasetError
from tests.conftest import shared_dataset


def _stats_of(root: Path) -> dict:
    return read_dataset_stats(resolve_location(str(root)))


def test_cr5_v21_aggregate_equals_what_lerobot_converted_into_v30_stats_json() -> None:
    v21 = _stats_of(shared_dataset("cr5_v21_av1"))
    stored = json.loads((shared_dataset("cr5_v30_av1") / "meta/stats.json").read_text())
    for key in ("observation.images.top", "observation.state", "action"):
        for name in ("mean", "std", "min", "max", "count"):
            np.testing.assert_allclose(
                v21[key][name], np.asarray(stored[key][name]), rtol=1e-9, err_msg=f"{key} {name}"
            )
    assert v21["observation.images.top"]["mean"].shape == (3, 1, 1)
    assert float(v21["observation.images.top"]["count"][0]) == 1200  # LeRobot samples 100 frames per episode


@pytest.mark.parametrize("form", ["motors", "two_lists", "nested"])
def test_statistics_by_name_follow_info_json_names_in_the_older_motors_form(tmp_path: Path, form: str) -> None:
    """LeRobot before v2.0 wrote ``names`` as ``{"motors": [...]}``: its one list gives the vector order, as a flat
    list does. r1's info.json with observation.state's names reversed in that form, and statistics by name that
    differ per joint (r1's own are one value for every joint, so no order shows in them), read in that order.
    Names of another form (two lists, or a list not of names) give no order: every component, in the stored order."""
    from lerobot_dali.dataset_reader import read_info

    (tmp_path / "meta").mkdir()
    info = json.loads((shared_dataset("r1_v30_h264") / "meta/info.json").read_text())
    names = info["features"]["observation.state"]["names"]
    info["features"]["observation.state"]["names"] = {
        "motors": {"motors": names[::-1]},
        "two_lists": {"arm": names[:0:-1], "base": names[:1]},
        "nested": [names[::-1]],
    }[form]
    (tmp_path / "meta/info.json").write_text(json.dumps(info))
    by_name = {stat: {n: float(i) + offset for i, n in enumerate(names)} for stat, offset in [("mean", 0), ("max", 9)]}
    (tmp_path / "meta/stats.json").write_text(json.dumps({"observation.state": by_name}))
    location = resolve_location(str(tmp_path))
    stats = read_dataset_stats(location, read_info(location))
    order = list(reversed(range(len(names)))) if form == "motors" else list(range(len(names)))
    assert stats["observation.state"]["mean"].tolist() == [float(i) for i in order]
    assert stats["observation.state"]["max"].tolist() == [float(i) + 9 for i in order]


def test_stats_json_is_read_as_stored() -> None:
    root = shared_dataset("cr5_v30_av1")
    stats = _stats_of(root)
    stored = json.loads((root / "meta/stats.json").read_text())
    assert sorted(stats) == sorted(stored)
    np.testing.assert_array_equal(stats["action"]["std"], np.asarray(stored["action"]["std"]))


def test_r1_statistics_by_joint_name_follow_info_json_names() -> None:
    """r1 stores state/action statistics as {joint name: value}; info.json's names give the vector order."""
    from lerobot_dali.dataset_reader import open_dataset

    root = shared_dataset("r1_v30_h264")
    reader = open_dataset(root)
    stats = read_dataset_stats(reader.location, reader.info)
    stored = json.loads((root / "meta/stats.json").read_text())["observation.state"]
    names = json.loads((root / "meta/info.json").read_text())["features"]["observation.state"]["names"]
    assert stats["observation.state"]["mean"].shape == (17,)
    assert stats["observation.state"]["mean"].tolist() == [stored["mean"][n] for n in names]
    assert stats["observation.state"]["std"][5] == stored["std"][names[5]]
    reversed_names = {"x": {"mean": {"b": 2.0, "a": 1.0}, "std": {"b": 1.0, "a": 1.0}, "count": 3}}
    assert aggregate_episode_stats([reversed_names], source="t", order={"x": ["a", "b"]})["x"]["mean"].tolist() == [
        1,
        2,
    ]
    with pytest.raises(DatasetError, match=r"x: mean has no value for component\(s\) \['c'\]"):
        aggregate_episode_stats([reversed_names], source="t", order={"x": ["a", "c"]})


def test_aggregate_equals_statistics_of_the_concatenated_values() -> None:
    rng = np.random.default_rng(0)
    episodes = [
        rng.normal(loc, scale, size=(n, 3)) for loc, scale, n in ((0.0, 1.0, 7), (5.0, 0.5, 20), (-2.0, 3.0, 1))
    ]
    per_episode = [
        {"x": {"mean": e.mean(0), "std": e.std(0), "min": e.min(0), "max": e.max(0), "count": [len(e)]}}
        for e in episodes
    ]
    out = aggregate_episode_stats(per_episode, source="test")["x"]
    everything = np.concatenate(episodes)
    np.testing.assert_allclose(out["mean"], everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(out["std"], everything.std(0), rtol=1e-12)
    np.testing.assert_array_equal(out["min"], everything.min(0))
    np.testing.assert_array_equal(out["max"], everything.max(0))
    assert out["count"].tolist() == [28]


def test_aggregate_weighs_an_episode_of_count_0_at_nothing_and_pools_what_episodes_have() -> None:
    """A count of 0 is a frame count (its episode weighs nothing); min and max come out only where every episode
    has them; a key only some episodes have pools theirs."""
    full = {"mean": [1.0, 2.0], "std": [0.5, 0.0], "min": [0.0, 2.0], "max": [2.0, 2.0], "count": [4]}
    empty = {"mean": [9.0, 9.0], "std": [3.0, 3.0], "count": [0]}
    out = aggregate_episode_stats([{"x": full, "y": full}, {"x": empty}], source="test")
    assert {name: value.tolist() for name, value in out["x"].items()} == {"mean": [1, 2], "std": [0.5, 0], "count": [4]}
    assert {name: value.tolist() for name, value in out["y"].items()} == full


@pytest.mark.parametrize("name", ["cr5_v21_av1", "cr5_v30_av1"])
def test_an_episodes_selection_normalises_by_the_whole_datasets_statistics(name: str) -> None:
    """``episodes=[0, 1]`` still reads the statistics of all 12 episodes (2,733 rows): LeRobot's policies normalise
    by ``dataset.meta.stats``, the whole dataset's, for v2.1 (0.3.3: ``make_policy(ds_meta=dataset.meta)``, run on
    cr5_v21 with episodes=[0, 1]: its state max and image std are meta.stats') as for v3.0 (0.4.4). LeRobot 0.3's
    ``LeRobotDataset.stats``, which v2.1 aggregates over the selection, is read by none of them; pooled over the
    selection instead, state's last std would be ~10x smaller. Expected: numpy over every data row, within float32
    (LeRobot computed the per-episode statistics in float32)."""
    from lerobot_dali.dataset_reader import open_dataset

    root = shared_dataset(name)
    stats = open_dataset(root, episodes=[0, 1]).read_stats()
    selected = np.isin(data_columns([root], "episode_index").ravel(), [0, 1])
    for key in ("observation.state", "action"):
        rows = data_columns([root], key)
        np.testing.assert_allclose(stats[key]["mean"], rows.mean(0), rtol=1e-4, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(stats[key]["std"], rows.std(0), rtol=1e-4, atol=1e-6, err_msg=key)
        assert stats[key]["count"].tolist() == [len(rows)] == [2733]
        assert not np.allclose(stats[key]["std"], rows[selected].std(0), rtol=0.05), key  # (412 rows: not those)


def test_generated_v21_aggregate_matches_the_generated_v30_totals(make_ds) -> None:
    spec = {"episodes": 3, "frames_per_episode": [4, 6, 5], "cameras": 2, "codec": "vp9", "fps": 10}
    v21 = _stats_of(make_ds(version="v2.1", **spec))
    v30 = _stats_of(make_ds(**spec))
    for key in ("observation.images.cam0", "observation.images.cam1", "observation.state", "action"):
        for name in ("mean", "std", "min", "max", "count"):
            np.testing.assert_allclose(v21[key][name], v30[key][name], rtol=1e-9, atol=1e-12, err_msg=f"{key} {name}")


def test_blank_lines_of_episodes_stats_are_no_records(tmp_path: Path) -> None:
    """A blank line between or after the records (a file added to by hand) is passed over, not refused as JSON."""
    (tmp_path / "meta").mkdir()
    record = '{"stats": {"x": {"mean": [1], "std": [0], "count": [2]}}}\n'
    (tmp_path / "meta/episodes_stats.jsonl").write_text(record + "\n" + record.replace("[1]", "[4]") + "  \n")
    stats = {name: value.tolist() for name, value in _stats_of(tmp_path)["x"].items()}
    assert stats == {"mean": [2.5], "std": [1.5], "count": [4]}


def test_no_statistics_gives_an_empty_mapping(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    assert _stats_of(tmp_path) == {}


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("episodes_stats.jsonl", '{"episode_index": 0, "stats": {}}\nnot json\n', r"episodes_stats.jsonl:2"),
        ("episodes_stats.jsonl", '{"episode_index": 0}\n', r"episodes_stats.jsonl:1: not an episode statistics"),
        ("episodes_stats.jsonl", "[1, 2]\n", r"episodes_stats.jsonl:1: not an episode statistics record \(TypeError"),
        ("episodes_stats.jsonl", '{"stats": [1]}\n', r"episodes_stats.jsonl:1: 'stats' is a list, expected an object"),
        ("episodes_stats.jsonl", '{"stats": {"x": {"mean": [1], "std": [1], "count": [0]}}}\n', r"x: every episode "),
        (
            "episodes_stats.jsonl",
            '{"stats": {"x": {"mean": [1], "std": [1], "count": [2]}}}\n'
            '{"stats": {"x": {"mean": [1, 2], "std": [1, 1], "count": [2]}}}\n',
            r"x: episodes disagree on the statistics' shape",
        ),
        (  # (min and max were stacked unchecked: numpy's bare ValueError came through; found by a fuzz)
            "episodes_stats.jsonl",
            '{"stats": {"x": {"mean": [1], "std": [1], "min": [0], "count": [2]}}}\n'
            '{"stats": {"x": {"mean": [1], "std": [1], "min": [0, 0], "count": [2]}}}\n',
            r"x: episodes disagree on the statistics' shape \(min: \[\(1,\), \(2,\)\]\)",
        ),
        ("episodes_stats.jsonl", '{"stats": {"x": {"mean": [1], "count": [2]}}}\n', r"x: an episode lacks \['std'\]"),
        (  # (a count below 0 weighed its episode negatively: a mean outside every episode's, no error)
            "episodes_stats.jsonl",
            '{"stats": {"x": {"mean": [1], "std": [1], "count": [-2]}}}\n'
            '{"stats": {"x": {"mean": [3], "std": [1], "count": [4]}}}\n',
            r"x: counts \[-2\.0, 4\.0\] are not all frame counts \(finite, 0 or more\)",
        ),
        ("stats.json", "{", r"stats.json is not valid JSON"),
        ("stats.json", "[1]", r"stats.json: expected an object of feature statistics, got list"),
        ("stats.json", '{"x": {"mean": "a lot"}}', r"stats.json: x: mean is not a numeric array"),
    ],
)
def test_malformed_statistics_name_the_file(tmp_path: Path, name: str, content: str, pattern: str) -> None:
    """And say what to do: they named the fault only."""
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / name).write_text(content)
    advice = rf"; the file is not what LeRobot writes: download or copy {tmp_path}/meta/{name} again$"
    with pytest.raises(DatasetError, match=pattern + ".*" + advice):
        _stats_of(tmp_path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (
            "stats.json",
            '{"x": {"mean": [1, NaN], "std": [1, 1]}, "y": {"mean": [0], "std": [Infinity], "min": [-Infinity], '
            '"max": [NaN]}}',
        ),
        (
            "episodes_stats.jsonl",
            '{"stats": {"x": {"mean": [1, 2], "std": [1, 1], "count": [2]}}}\n'
            '{"stats": {"x": {"mean": [NaN, 2], "std": [1, 1], "count": [2]}}}\n',
        ),
    ],
)
def test_statistics_that_are_not_finite_are_said_naming_the_file_and_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, content: str
) -> None:
    """A NaN or infinite mean or std (LeRobot's statistics of data that holds NaN) was read in silence: a policy
    normalising state and action by it, or datasets' statistics pooled with it, made every value NaN (read_stats gave
    mean [1, nan]; 0 of 2 files said). Said, naming the file and entries; what normalises by one refuses it (below,
    and train.py's feature_stats), while the sound entries read on."""
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / name).write_text(content)
    listed = "['x mean', 'x std']" if name.endswith(".jsonl") else "['x mean', 'y std', 'y min', 'y max']"  # (pooled)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_stats"):
        stats = _stats_of(tmp_path)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and f"meta/{name}: the statistics {listed} are not finite" in said[0], said
    assert np.isnan(stats["x"]["mean"]).sum() == 1 and np.isfinite(stats["x"]["mean"]).sum() == 1  # (read on)


#: What an iterator with ``normalize="stats"`` adds: it can do without the statistics.
WITHOUT_STATS = (
    r" \(normalize='stats' reads them; without them, give AugmentConfig\.normalize a Normalize\(mean=\.\.\., "
    r"std=\.\.\.\) per camera instead of 'stats'\)$"
)


def test_statistics_that_cannot_be_read_say_to_normalize_otherwise_only_where_normalize_reads_them(
    make_ds, copy_ds
) -> None:
    """Every reader of a damaged stats.json was told to give AugmentConfig.normalize a Normalize per camera: a
    policy's normalisation of state and action (pipelines/train.py's build_policy, reader.read_stats()) reads them
    without any normalize, and cannot do so. Only an iterator normalising by them is told it."""
    from lerobot_dali import DALILeRobotIterator, open_dataset
    from lerobot_dali.augment_config import AugmentConfig

    root = copy_ds(make_ds(episodes=2, frames_per_episode=[4, 6], cameras=1, fps=10, size=(64, 96)))
    (root / "meta/stats.json").write_text("{")
    copy_again = rf"stats\.json is not valid JSON: .*download or copy {root}/meta/stats\.json again"
    with pytest.raises(DatasetError, match=copy_again + "$"):
        open_dataset(root).read_stats()
    with pytest.raises(DatasetError, match=copy_again + WITHOUT_STATS):
        DALILeRobotIterator(root, augment=AugmentConfig(normalize="stats"), device="cpu", num_workers=0)


def test_statistics_refused_by_the_server_keep_the_remote_file_error_its_status_and_cause() -> None:
    """normalize='stats' added its advice by rebuilding the error from its message: a RemoteFileError for a stats.json
    the server refused (403) lost its ``status`` (None) and its cause (the HTTP client's error). Both stay now."""
    from types import SimpleNamespace

    from lerobot_dali.augment_config import AugmentConfig
    from lerobot_dali.errors import RemoteFileError
    from lerobot_dali.iterator_arguments import camera_augment

    said = "http://h/ds/meta/stats.json: read was refused (not retried): log in"
    client_error = OSError("403 Forbidden")

    def read_stats() -> None:
        raise RemoteFileError(said, 403) from client_error

    reader = SimpleNamespace(all_camera_keys=["observation.images.top"], read_stats=read_stats)
    with pytest.raises(RemoteFileError, match="^" + re.escape(said) + WITHOUT_STATS) as info:
        camera_augment(AugmentConfig(normalize="stats"), reader, {}, [])  # type: ignore[arg-type]
    assert (info.value.status, info.value.__cause__) == (403, client_error)


GR00T = "gr00t_v20_h264"


def gr00t_part(dst: Path, episodes: list[int], *, total_frames: bool = True, recorded_only: bool = False) -> Path:
    """A v2.0 dataset at ``dst`` of GR00T's ``episodes``: all five keep its own stats.json; fewer get the one LeRobot
    v2.0 writes (mean, std, min, max over every frame; no 'count'). ``total_frames=False``: info.json without it;
    ``recorded_only``: info.json without the camera that has no video files."""
    src = shared_dataset(GR00T)
    info = json.loads((src / "meta/info.json").read_text())
    kept = [json.loads(line) for line in (src / "meta/episodes.jsonl").read_text().splitlines()]
    kept = [record for record in kept if record["episode_index"] in episodes]
    info |= {"total_episodes": len(kept), "total_frames": sum(record["length"] for record in kept)}
    if not total_frames:
        del info["total_frames"]
    if recorded_only:
        del info["features"]["observation.images.egoview"]
    (dst / "meta").mkdir(parents=True)
    (dst / "meta/info.json").write_text(json.dumps(info))
    (dst / "meta/episodes.jsonl").write_text("".join(json.dumps(record) + "\n" for record in kept))
    for name in ("tasks.jsonl", "modality.json"):
        shutil.copy(src / "meta" / name, dst / "meta" / name)
    for ep in episodes:
        for path in (f"data/chunk-000/episode_{ep:06d}.parquet",
                     f"videos/chunk-000/observation.images.ego_view/episode_{ep:06d}.mp4"):  # fmt: skip
            (dst / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / path, dst / path)
    if len(kept) == 5:
        shutil.copy(src / "meta/stats.json", dst / "meta/stats.json")
        return dst
    stats = {}
    for key in ("observation.state", "action", "timestamp", "next.reward"):
        values = data_columns([dst], key)
        stats[key] = {"mean": values.mean(0), "std": values.std(0), "min": values.min(0), "max": values.max(0)}
    (dst / "meta/stats.json").write_text(
        json.dumps({k: {n: v.tolist() for n, v in e.items()} for k, e in stats.items()})
    )
    return dst


def data_columns(roots: list[Path], key: str) -> np.ndarray:
    """Column ``key`` of every row of the datasets' data files, as ``(rows, components)`` float64."""
    columns = [
        pq.read_table(path, columns=[key])[key] for root in roots for path in sorted(root.glob("data/**/*.parquet"))
    ]
    column = pa.chunked_array([chunk for c in columns for chunk in c.chunks]).combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        return np.asarray(column.flatten(), np.float64).reshape(len(column), -1)
    return np.asarray(column, np.float64).reshape(-1, 1)


def test_stats_without_count_of_one_dataset_are_said_to_take_its_frames_not_to_be_pooled(caplog) -> None:
    """GR00T read alone: the line naming its entries without 'count' said its frames "weigh them where datasets'
    statistics are pooled", though no other dataset was read with it. It says they are taken as their count."""
    from lerobot_dali import open_dataset

    reader = open_dataset(shared_dataset(GR00T), cameras=["observation.images.ego_view"])
    with caplog.at_level(logging.INFO, logger="lerobot_dali.dataset_stats"):
        stats = reader.read_stats()
    (said,) = [r.getMessage() for r in caplog.records if "gives no 'count'" in r.getMessage()]
    assert said.endswith("they cover the dataset's 2096 frames (info.json's total_frames), taken as their count"), said
    assert "pool" not in said, said
    assert int(stats["action"]["count"][0]) == 2096


@pytest.mark.parametrize("total_frames", [True, False], ids=["info_total_frames", "episode_lengths"])
def test_gr00ts_stats_without_count_pool_by_their_datasets_frames(tmp_path: Path, caplog, total_frames: bool) -> None:
    """GR00T's v2.0 stats.json has no 'count': a union of it and two of its episodes (a v2.0 dataset of its own,
    stats.json without 'count' too) refused to pool them. Each dataset's frames (info.json's total_frames, or its
    episode lengths added up) weigh them now: the pooled statistics are numpy's over both datasets' rows."""
    from lerobot_dali import concat_datasets, open_dataset

    full, part = shared_dataset(GR00T), gr00t_part(tmp_path / "part", [3, 4], total_frames=total_frames)
    readers = [open_dataset(root, cameras=["observation.images.ego_view"]) for root in (full, part)]
    with caplog.at_level(logging.INFO, logger="lerobot_dali.dataset_stats"):
        pooled = concat_datasets(readers).read_stats()
    source = "info.json's total_frames" if total_frames else f"the episode lengths in {part}/meta/episodes.jsonl"
    assert f"{full}/meta/stats.json gives no 'count' for ['observation.state', 'action', " in caplog.text
    assert f"{part}/meta/stats.json gives no 'count' for ['observation.state', 'action', " in caplog.text
    assert "the dataset's 2096 frames (info.json's total_frames), taken as their count" in caplog.text
    assert f"the dataset's 740 frames ({source}), taken as their count" in caplog.text
    for key in ("observation.state", "action", "timestamp", "next.reward"):
        rows = data_columns([full, part], key)
        assert int(pooled[key]["count"][0]) == len(rows) == 2096 + 740
        # (GR00T's stats.json holds float32 sums: its means and stds are 1e-5 off numpy's over its rows)
        np.testing.assert_allclose(pooled[key]["mean"], rows.mean(0), rtol=1e-5, atol=2e-5, err_msg=key)
        np.testing.assert_allclose(pooled[key]["std"], rows.std(0), rtol=1e-5, atol=3e-5, err_msg=key)
        np.testing.assert_allclose(pooled[key]["min"], rows.min(0), rtol=0, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(pooled[key]["max"], rows.max(0), rtol=0, atol=1e-6, err_msg=key)
    # (the weights matter: the two datasets' means equally weighed are far off)
    own = [read_dataset_stats(r.location, r.info)["action"]["mean"] for r in readers]
    assert np.abs((own[0] + own[1]) / 2 - data_columns([full, part], "action").mean(0)).max() > 1e-2


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_each_version_reads_the_file_lerobot_reads(make_ds, copy_ds, version: str) -> None:
    """v3.0 reads stats.json even beside an episodes_stats.jsonl left from v2.1; v2.1 aggregates that file even
    beside a stats.json left from v2.0."""
    from lerobot_dali.dataset_reader import open_dataset

    root = copy_ds(make_ds(version=version, episodes=2, frames_per_episode=[4, 6], cameras=0, fps=10))
    kept = _stats_of(root)
    stale = {"mean": [1], "std": [1], "min": [1], "max": [1], "count": [1]}
    if version == "v3.0":
        left_over = json.dumps({"episode_index": 0, "stats": {"stale": stale}})
        (root / "meta" / "episodes_stats.jsonl").write_text(left_over + "\n")
    else:
        (root / "meta" / "stats.json").write_text(json.dumps({"stale": stale}))
    reader = open_dataset(root)
    stats = read_dataset_stats(reader.location, reader.info)
    assert "stale" not in stats and sorted(stats) == sorted(kept)
    assert "observation.state" in stats


def test_only_entries_without_count_take_the_datasets_frame_count(make_ds, copy_ds) -> None:
    """A stats.json whose action has no 'count' (LeRobot before v2.1) beside a state that keeps its own (7 here, as a
    camera's counts the frames LeRobot sampled, not every frame): the action takes the dataset's 10 frames, the
    state's stays 7."""
    from lerobot_dali.dataset_reader import open_dataset

    root = copy_ds(make_ds(episodes=2, frames_per_episode=[4, 6], cameras=0, fps=10))
    stored = json.loads((root / "meta/stats.json").read_text())
    del stored["action"]["count"]
    stored["observation.state"]["count"] = [7]
    (root / "meta/stats.json").write_text(json.dumps(stored))
    stats = open_dataset(root).read_stats()
    assert (stats["action"]["count"].tolist(), stats["observation.state"]["count"].tolist()) == ([10], [7])


def test_stats_without_count_stay_so_where_the_frame_count_is_not_known(tmp_path: Path, caplog) -> None:
    """Without 'count' in stats.json, total_frames in info.json or a readable episodes.jsonl, the statistics are read
    as stored, without a count (pooling them then says it lacks one), and why is logged: not an error of the read."""
    from lerobot_dali.dataset_reader import read_info

    part = gr00t_part(tmp_path / "part", [3, 4], total_frames=False)
    (part / "meta/episodes.jsonl").unlink()
    location = resolve_location(str(part))
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.dataset_stats"):
        stats = read_dataset_stats(location, read_info(location))
    stored = json.loads((part / "meta/stats.json").read_text())
    assert sorted(stats) == sorted(stored) and all("count" not in entry for entry in stats.values())
    np.testing.assert_array_equal(stats["action"]["mean"], np.asarray(stored["action"]["mean"]))
    assert f"{part}: no frame count for its statistics: " in caplog.text and "episodes.jsonl is missing" in caplog.text
    (part / "meta/episodes.jsonl").write_text("")  # (no episodes: no frames to count, not a count of 0)
    assert all("count" not in entry for entry in read_dataset_stats(location, read_info(location)).values())


def test_statistics_faults_hold_each_feature_to_the_shape_lerobot_gives_it() -> None:
    """What ``lerobot-dali check`` warns of: a scalar's statistics as (1,) or (), a camera's as (C, 1, 1) or (C,) with
    C its channels (channels first too, by its names), a vector's as its shape; count's shape unchecked. Sound
    statistics of the real datasets have none."""
    features = {
        "state": {"dtype": "float32", "shape": [7]},
        "reward": {"dtype": "float32", "shape": [1]},
        "cam": {"dtype": "video", "shape": [480, 640, 3], "names": ["height", "width", "channels"]},
        "first": {"dtype": "image", "shape": [1, 64, 64], "names": ["channel", "height", "width"]},
        "text": {"dtype": "string", "shape": [1]},
    }
    info = DatasetInfo.from_json(
        {"codebase_version": "v3.0", "fps": 10, "data_path": "d", "video_path": "v", "features": features},
        source="info.json",
    )
    one = np.ones

    def sound(**shapes: tuple[int, ...]) -> dict[str, dict[str, np.ndarray]]:
        return {k: {"mean": one(s), "std": one(s), "min": one(s) - 1, "max": one(s) + 1, "count": one(())}
                for k, s in shapes.items()}  # fmt: skip

    good = sound(state=(7,), reward=(), cam=(3, 1, 1), first=(1,), text=(2,))
    assert stats_faults(good, info, list(features)) == {}
    bad = sound(state=(6,), reward=(2,), cam=(64, 1, 1), first=(2, 1, 1))
    bad["state"]["q01"], bad["state"]["q99"] = np.full(7, np.inf), np.ones(7)  # (q01 alone: a half pair, said)
    faults = stats_faults(bad, info, list(features))
    assert faults["state"][0] == "q01 is not finite (NaN or infinity)"
    assert faults["state"][1].startswith("mean has shape (6,), but the feature's is (7,) in info.json (its statistics")
    assert [len(faults[k]) for k in ("state", "reward", "cam", "first")] == [5, 4, 4, 4]  # (q01 of the right shape)
    assert "(its statistics are (1, 1, 1) or (1,) or (3, 1, 1) or (3,))" in faults["first"][0]
    assert faults["cam"][0].endswith("(its statistics are (3, 1, 1) or (3,))")  # (three channels: said once)
    assert stats_faults({**bad, "undeclared": bad["state"]}, info, ["text", "undeclared"]) == {}
    flipped = sound(state=(7,))
    flipped["state"]["std"][[1, 4]] = -1
    flipped["state"]["min"][[2, 3]] = 5
    assert stats_faults(flipped, info, ["state"]) == {
        "state": ["std is negative at components [1, 4]", "min is above max at components [2, 3]"]
    }
    unlike = sound(state=(7,))
    unlike["state"]["min"] = np.zeros(6)  # (min and max of different shapes: not compared, which numpy cannot)
    assert stats_faults(unlike, info, ["state"]) == {
        "state": ["min has shape (6,), but the feature's is (7,) in info.json (its statistics are (7,))"]
    }
    assert stats_faults(bad, info, ["text"]) == {}
    for name in ("cr5_v30_av1", "cr5_v21_av1", "r1_v30_h264", "gr00t_v20_h264"):
        location = resolve_location(str(shared_dataset(name)))
        real = DatasetInfo.from_json(json.loads((shared_dataset(name) / "meta/info.json").read_text()), source=name)
        assert stats_faults(read_dataset_stats(location, real), real, list(real.features)) == {}, name


def test_statistics_faults_take_lerobots_three_channels_for_every_camera() -> None:
    """LeRobot 0.4.4 computes a camera's statistics over frames it converts to RGB: a dataset it recorded with a grey
    image camera (shape (32, 48, 1), frames given as Pillow 'L' images) holds (3, 1, 1) statistics for it, which
    check warned of as a shape fault (9 entries: mean, std, min, max, q01-q99), as it did of a channel-first camera
    declared without names ([3, 480, 640]: 640 channels expected). Both sound now; another shape is still said."""
    features = {
        "grey": {"dtype": "image", "shape": [32, 48, 1], "names": ["height", "width", "channel"]},
        "depth": {"dtype": "video", "shape": [64, 64, 1], "names": ["height", "width", "channels"]},
        "unnamed": {"dtype": "video", "shape": [3, 480, 640], "names": None},
        "unnamed_grey": {"dtype": "image", "shape": [32, 48, 1], "names": None},  # (channels last, unnamed)
    }
    info = DatasetInfo.from_json(
        {"codebase_version": "v3.0", "fps": 10, "data_path": "d", "video_path": "v", "features": features},
        source="info.json",
    )
    names = ("mean", "std", "min", "max", "q01", "q10", "q50", "q90", "q99")

    def written(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return {**{name: np.full(shape, 0.5) for name in names}, "count": np.array([24.0])}

    assert stats_faults({key: written((3, 1, 1)) for key in features}, info, list(features)) == {}
    assert stats_faults({key: written((3,)) for key in features}, info, list(features)) == {}
    assert stats_faults({"grey": written((1, 1, 1)), "depth": written((1,))}, info, list(features)) == {}
    assert stats_faults({"unnamed_grey": written((1, 1, 1))}, info, list(features)) == {}
    faults = stats_faults({"grey": written((2, 1, 1))}, info, list(features))
    assert len(faults["grey"]) == 9 and faults["grey"][0].startswith("mean has shape (2, 1, 1)")


def test_a_count_not_of_one_number_is_refused_where_pooled_and_said_by_check(make_ds, tmp_path: Path) -> None:
    """A count of [] (no number) pooled its dataset's statistics at weight 0, unsaid: a union of two datasets took
    the state mean of the other alone (LeRobot's aggregate_stats refuses such a count). Now the pooling refuses it
    (a StatsError naming it) and check's faults say it; r1_v30_h264's count of one number stored bare (790) reads."""
    from lerobot_dali.dataset_reader import open_dataset
    from lerobot_dali.dataset_union import concat_datasets
    from lerobot_dali.errors import StatsError

    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        shutil.copytree(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"), root)
    stats = json.loads((roots[1] / "meta/stats.json").read_text())
    stats["observation.state"]["count"] = []
    (roots[1] / "meta/stats.json").write_text(json.dumps(stats))
    with pytest.raises(StatsError, match=r"observation\.state: a count holds 0 numbers, not one frame count"):
        concat_datasets(roots).read_stats()
    reader = open_dataset(roots[1])
    faults = stats_faults(reader.read_stats(), reader.info, reader.tabular_keys)
    assert faults == {"observation.state": ["count holds 0 numbers, not one frame count"]}
    with pytest.raises(DatasetError, match=r"x: a count holds 2 numbers"):
        aggregate_episode_stats([{"x": {"mean": [1.0], "std": [1.0], "count": [3, 4]}}], source="s")
    r1 = open_dataset(shared_dataset("r1_v30_h264"))
    assert float(concat_datasets([r1, r1]).read_stats()["action"]["count"][0]) == 2 * 790


def test_statistics_faults_say_half_of_a_pair_lerobot_normalises_by() -> None:
    """A mean without its std (or min without max, q01 without q99, q10 without q90) was sound to check (0 of 4
    said): LeRobot 0.4.4's NormalizerProcessorStep raises ValueError at the first batch in the mode that normalises
    by the pair (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10). Each is said now; both of a pair, or neither, is sound."""
    info = DatasetInfo.from_json(
        {"codebase_version": "v3.0", "fps": 10, "data_path": "d", "video_path": "v",
         "features": {k: {"dtype": "float32", "shape": [2]} for k in ("a", "b", "c")}},
        source="info.json",
    )  # fmt: skip
    one = np.ones(2)
    stats = {
        "a": {"mean": one, "min": one, "count": np.array([4.0])},
        "b": {"std": one, "max": one, "q01": one, "q99": one, "q90": one},
        "c": {"mean": one, "std": one, "min": one, "max": one},
    }
    assert stats_faults(stats, info, ["a", "b", "c"]) == {
        "a": [
            "mean without std: LeRobot's MEAN_STD normalisation fails on it (a ValueError)",
            "min without max: LeRobot's MIN_MAX normalisation fails on it (a ValueError)",
        ],
        "b": [
            "std without mean: LeRobot's MEAN_STD normalisation fails on it (a ValueError)",
            "max without min: LeRobot's MIN_MAX normalisation fails on it (a ValueError)",
            "q90 without q10: LeRobot's QUANTILE10 normalisation fails on it (a ValueError)",
        ],
    }
