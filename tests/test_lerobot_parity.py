"""Every sample against LeRobot's own ``LeRobotDataset``, where LeRobot is installed (skipped otherwise).

The rest of the suite checks LeRobot semantics against values the tests compute themselves; a shared
misreading of LeRobot would pass both sides. These tests read the same datasets with LeRobot and compare
every sample: keys, dtypes, shapes, tabular values, ``<key>_is_pad``, task strings and frames. The datasets
come from this package's generator and from LeRobot's own writer (``LeRobotDataset.create``), whose frames
carry markers (:mod:`lerobot_dali.frame_marker`) so the frames are checked for identity as well.

LeRobot pins its own torch and decodes with torchcodec, so they run in a separate environment:
``.ci/lerobot-parity [VENV]`` builds one (LeRobot 0.4.4, torch 2.13 from PyPI, torchcodec 0.17) and runs them;
``LEROBOT=0.3.3 .ci/lerobot-parity`` does the same with LeRobot 0.3.3, which reads v2.1 datasets only, so the
generated datasets are then v2.1 (what needs LeRobot 0.4 is skipped).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from lerobot_dali import DALILeRobotIterator
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, torchcodec_unavailable
from lerobot_dali.frame_marker import draw_marker, read_full_marker

pytestmark = pytest.mark.lerobot


def _installed_lerobot() -> tuple[int, int] | None:
    import importlib.metadata

    try:
        major, minor = importlib.metadata.version("lerobot").split(".")[:2]
    except importlib.metadata.PackageNotFoundError:
        return None
    return int(major), int(minor)


#: LeRobot 0.4 reads v3.0 datasets only and 0.3 v2.1 only: the generated datasets follow the LeRobot installed.
LEROBOT_03 = (_installed_lerobot() or (0, 4)) < (0, 4)
DATASET_VERSION = "v2.1" if LEROBOT_03 else "v3.0"
#: What needs LeRobot 0.4: its writer's codec choice, its policy processors.
needs_lerobot_04 = pytest.mark.skipif(LEROBOT_03, reason="needs LeRobot 0.4 (LeRobot 0.3 is installed)")

FPS = 30
LENGTHS = [12, 30, 7, 25, 16]
#: Windows that pad at both ends of the short episodes (7 frames < the 8-step action chunk).
WINDOWS = {
    "observation.images.cam0": [-2 / FPS, 0.0],
    "observation.state": [-1 / FPS, 0.0],
    "action": [k / FPS for k in range(8)],
}


@pytest.fixture(autouse=True)
def _needs_lerobot() -> None:
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401
    except Exception as e:  # ImportError, or an install whose torchvision/torchcodec/PyAV does not load
        why = f"LeRobot's LeRobotDataset does not import here ({type(e).__name__}: {e})"
        if _installed_lerobot() is not None:  # installed to be compared with: every test skipping would pass
            pytest.fail(f"{why}, although LeRobot is installed: fix the environment (.ci/lerobot-parity builds one)")
        pytest.skip(f"{why}; see .ci/lerobot-parity")
    why_not = torchcodec_unavailable()  # LeRobot's default video backend is torchcodec
    if why_not is not None:
        pytest.skip(why_not)


def _sample_key(sample: Mapping[str, Any]) -> Any:
    """Which sample it is: its ``index``, with its ``dataset_index`` where several datasets each keep their own."""
    index = int(sample["index"])
    return (int(sample["dataset_index"]), index) if "dataset_index" in sample else index


def _ours(dataset: Any, windows: Mapping[str, Sequence[float]], **options: Any) -> dict[Any, dict[str, Any]]:
    """Every sample lerobot-dali reads from ``dataset`` (a folder, or a reader such as a union), by its key."""
    it = DALILeRobotIterator(
        dataset, batch_size=7, shuffle=False, device="cpu", delta_timestamps=windows, drop_last=False, **options
    )
    samples: dict[Any, dict[str, Any]] = {}
    try:
        for batch in it:
            for row in range(len(batch["index"])):
                sample = {key: values[row] for key, values in batch.items()}
                key = _sample_key(sample)
                assert key not in samples, f"sample {key} delivered twice"
                samples[key] = sample
    finally:
        it.close()
    return samples


def _lerobot(
    root: Path, windows: Mapping[str, Sequence[float]], episodes: list[int] | None = None, **options: Any
) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(
        f"local/{root.name}",
        root=root,
        delta_timestamps={k: list(v) for k, v in windows.items()},
        episodes=episodes,
        **options,
    )


def _assert_same_samples(
    ours: dict[Any, dict[str, Any]],
    theirs: Any,
    *,
    frame_check: Callable[[torch.Tensor, torch.Tensor], None],
    video_keys: Sequence[str] | None = None,
    expected_of: Callable[[dict[str, Any]], dict[str, Any]] = lambda sample: sample,
) -> None:
    """Every sample of ``theirs`` (LeRobot's, ``expected_of`` applied: where ours means to differ) equals ours.
    ``video_keys``: the keys ``frame_check`` compares (default: ``theirs.meta.video_keys``)."""
    video_keys = theirs.meta.video_keys if video_keys is None else video_keys
    expected_keys = sorted(_sample_key(theirs[i]) for i in range(len(theirs)))
    assert sorted(ours) == expected_keys
    for position in range(len(theirs)):
        expected = expected_of(theirs[position])
        got = ours[_sample_key(expected)]
        where = f"sample {_sample_key(expected)}"
        assert set(got) == set(expected), f"{where}: keys differ by {sorted(set(got) ^ set(expected))}"
        for key, value in expected.items():
            if not isinstance(value, torch.Tensor):  # task strings, language annotations: Python values
                assert _typed(got[key]) == _typed(value), f"{where}, {key}"
                continue
            assert (got[key].dtype, got[key].shape) == (value.dtype, value.shape), f"{where}, {key}"
            if key in video_keys:
                frame_check(got[key], value)
            else:
                assert torch.equal(got[key], value), f"{where}, {key}: {got[key]} != {value}"


def _typed(value: Any) -> Any:
    """``value`` (str, list, dict, number, None, nested) with each leaf's type beside it: equal only where both
    hold the same values of the same Python types (``1 == 1.0 == True`` would not tell an int from a float)."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return type(value), value


def _same_decode(got: torch.Tensor, expected: torch.Tensor) -> None:
    """FFmpeg's decoders (PyAV's, torchcodec's) are bit-exact by the codec's spec; what may differ is the
    YUV -> RGB conversion (measured: identical with torchcodec 0.17 against PyAV 18.1, both FFmpeg 8)."""
    assert (got - expected).abs().max().item() * 255 <= 3.01


def _exactly(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(got, expected), f"values differ by up to {(got - expected).abs().max().item()}"


def _dali_cpu_decode(got: torch.Tensor, expected: torch.Tensor) -> None:
    """DALI's CPU VP9 decoder converts YUV -> RGB its own way: the same frame, a few levels apart on average."""
    assert (got - expected).abs().mean().item() * 255 < 2.0


@pytest.mark.parametrize(
    ("codec", "gop", "frame_check"),
    [("av1", 2, _same_decode), ("h264", 30, _same_decode), ("hevc", 8, _same_decode), ("vp9", 4, _dali_cpu_decode)],
)
def test_every_sample_matches_lerobot(make_ds, codec: str, gop: int, frame_check: Callable[..., None]) -> None:
    root = make_ds(codec=codec, gop=gop, episodes=5, frames_per_episode=LENGTHS, cameras=2, version=DATASET_VERSION)
    _assert_same_samples(_ours(root, WINDOWS), _lerobot(root, WINDOWS), frame_check=frame_check)


def test_a_reencoded_dataset_reads_in_lerobot_as_its_source(make_ds, tmp_path: Path) -> None:
    """``lerobot-dali reencode``'s copy is a dataset LeRobot loads: every sample as the source's, each frame the
    same picture (its marker; a few levels apart after the lossy re-encode), and lerobot-dali reads it as LeRobot."""
    from lerobot_dali.reencode import reencode_dataset

    source = make_ds(codec="h264", gop=30, episodes=5, frames_per_episode=LENGTHS, cameras=2, version=DATASET_VERSION)
    copy = reencode_dataset(source, tmp_path / "copy", gop=2).out
    theirs_source, theirs_copy = _lerobot(source, WINDOWS), _lerobot(copy, WINDOWS)
    assert len(theirs_copy) == len(theirs_source) == sum(LENGTHS)
    for position in range(len(theirs_source)):
        expected, got = theirs_source[position], theirs_copy[position]
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            if key not in theirs_source.meta.video_keys:
                assert got[key] == value if isinstance(value, str) else torch.equal(got[key], value), (position, key)
                continue
            assert got[key].shape == value.shape and (got[key] - value).abs().mean().item() * 255 < 4, (position, key)
            for frame_got, frame_expected in zip(
                got[key].reshape(-1, *value.shape[-3:]), value.reshape(-1, *value.shape[-3:]), strict=True
            ):
                as_hwc = [(f.permute(1, 2, 0) * 255).round().byte().numpy() for f in (frame_got, frame_expected)]
                assert read_full_marker(as_hwc[0]) == read_full_marker(as_hwc[1]), (position, key)
    _assert_same_samples(_ours(copy, WINDOWS), theirs_copy, frame_check=_same_decode)


def test_workers_and_the_pyav_decoder_match_lerobot(make_ds) -> None:
    """torchcodec decodes for lerobot-dali too where it loads; PyAV in two workers is the other path."""
    root = make_ds(codec="h264", gop=30, episodes=5, frames_per_episode=LENGTHS, cameras=2, version=DATASET_VERSION)
    ours = _ours(root, WINDOWS, num_workers=2, cpu_decode=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    _assert_same_samples(ours, _lerobot(root, WINDOWS), frame_check=_same_decode)


def test_image_cameras_match_lerobot(make_ds) -> None:
    root = make_ds(
        episodes=4, frames_per_episode=[9, 14, 5, 11], cameras=2, image_cameras=True, version=DATASET_VERSION
    )
    windows = {"observation.images.cam0": [-3 / FPS, 0.0, 2 / FPS], "action": [k / FPS for k in range(-2, 20)]}
    _assert_same_samples(_ours(root, windows), _lerobot(root, windows), frame_check=_same_decode)


def test_windows_longer_than_episodes_match_lerobot(make_ds) -> None:
    """10 fps, episodes of 1 to 14 frames, windows reaching 1 s back and 1.1 s ahead."""
    root = make_ds(
        codec="h264", gop=4, fps=10, episodes=4, frames_per_episode=[3, 14, 1, 8], cameras=1, episodes_per_file=3,
        version=DATASET_VERSION,
    )  # fmt: skip
    windows = {
        "observation.images.cam0": [-1.0, -0.5, 0.0, 0.3],
        "observation.state": [-0.2, -0.1, 0.0],
        "action": [k / 10 for k in range(12)],
    }
    _assert_same_samples(_ours(root, windows), _lerobot(root, windows), frame_check=_same_decode)


@pytest.mark.parametrize(("first", "last"), [(0, 7), (2, 3)])
def test_frames_left_out_of_sampling_match_lerobots_episode_aware_sampler(make_ds, first: int, last: int) -> None:
    """``drop_n_first_frames``/``drop_n_last_frames`` sample what LeRobot's ``EpisodeAwareSampler`` does (its
    train script's, for Diffusion Policy: ``drop_n_last_frames=7``), with the same windows around each sample,
    reaching into the frames left out. The 7-frame episode has nothing left at (0, 7)."""
    from lerobot.datasets.sampler import EpisodeAwareSampler
    from torch.utils.data import Subset

    root = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2,
                   version=DATASET_VERSION)  # fmt: skip
    theirs = _lerobot(root, WINDOWS)
    drops = {"drop_n_first_frames": first, "drop_n_last_frames": last}
    if hasattr(theirs, "episode_data_index"):  # (LeRobot 0.3)
        sampler = EpisodeAwareSampler(theirs.episode_data_index, **drops)
    else:
        episodes = theirs.meta.episodes
        sampler = EpisodeAwareSampler(episodes["dataset_from_index"], episodes["dataset_to_index"], **drops)
    sampled = [int(i) for i in sampler]
    assert len(sampled) == sum(max(n - first - last, 0) for n in LENGTHS)
    _assert_same_samples(
        _ours(root, WINDOWS, **drops), Subset(theirs, sampled), frame_check=_same_decode,
        video_keys=theirs.meta.video_keys,
    )  # fmt: skip


@pytest.mark.skipif((_installed_lerobot() or (0, 0)) < (0, 6), reason="LeRobot maps a subset's indices from 0.6")
def test_frames_left_out_of_an_episode_subset_match_lerobots_train_script(make_ds) -> None:
    """LeRobot 0.6's train script samples an ``episodes=`` subset through ``EpisodeAwareSampler`` with
    ``absolute_to_relative_idx``; ``episodes=`` with ``drop_n_last_frames`` samples the same frames."""
    from lerobot.datasets.sampler import EpisodeAwareSampler
    from torch.utils.data import Subset

    root = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    subset = [1, 3, 4]
    theirs = _lerobot(root, WINDOWS, episodes=subset)
    episodes = theirs.meta.episodes
    sampler = EpisodeAwareSampler(
        episodes["dataset_from_index"], episodes["dataset_to_index"], episode_indices_to_use=theirs.episodes,
        drop_n_last_frames=7, absolute_to_relative_idx=theirs.absolute_to_relative_idx,
    )  # fmt: skip
    sampled = [int(i) for i in sampler]
    assert len(sampled) == sum(LENGTHS[e] - 7 for e in subset)
    ours = _ours(root, WINDOWS, episodes=subset, drop_n_last_frames=7)
    _assert_same_samples(ours, Subset(theirs, sampled), frame_check=_same_decode, video_keys=theirs.meta.video_keys)


@pytest.mark.skipif(LEROBOT_03, reason="LeRobot 0.3 reads windows of an episodes= subset wrong (its issue #1783)")
def test_an_episode_subset_matches_lerobot(make_ds) -> None:
    root = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    subset = [1, 3, 4]
    theirs = _lerobot(root, WINDOWS, episodes=subset)
    assert sorted({int(theirs[i]["episode_index"]) for i in range(len(theirs))}) == subset
    _assert_same_samples(_ours(root, WINDOWS, episodes=subset), theirs, frame_check=_same_decode)
    assert np.sum([LENGTHS[e] for e in subset]) == len(theirs)


#: The generated dataset of OPTION_COMBINATIONS' video cases: two cameras, two episodes per file.
VIDEO_SPEC = {"codec": "av1", "gop": 2, "cameras": 2, "episodes_per_file": 2}
#: Option combinations users train with, each against LeRobot: (dataset options, windows, episodes, tolerance_s).
#: Episodes of 7-30 frames under 50-step action chunks and 2-step histories pad at both ends.
OPTION_COMBINATIONS = {
    # An unsorted, non-contiguous split; a history of 2 on the state and a camera, a camera at one past step
    # (squeezed to (C, H, W) as a camera without deltas).
    "unsorted-subset-chunk50-history2": (
        VIDEO_SPEC,
        {
            "action": [k / FPS for k in range(50)], "observation.state": [-1 / FPS, 0.0],
            "observation.images.cam0": [-1 / FPS, 0.0], "observation.images.cam1": [-1 / FPS],
        },
        [4, 0, 2], None,
    ),
    # Offsets off the frame grid by less than the default tolerance_s (1e-4 s): they round to whole frames.
    "off-grid-deltas-within-default-tolerance": (
        VIDEO_SPEC,
        {
            "action": [k / FPS + 4e-5 for k in range(-3, 5)], "observation.state": [-1 / FPS - 9e-5, 0.0],
            "observation.images.cam0": [-2 / FPS + 5e-5, 1 / FPS - 5e-5],
        },
        None, None,
    ),
    # tolerance_s 0.02 s at 30 fps takes any offset: half frames round to the even step (Python's round), 0.01 s
    # (0.3 frame) to 0, 0.02 s (0.6 frame) to 1, on the tabular keys and a camera alike; the state at one step ahead
    # (never squeezed: (1, 6)).
    "tolerance-0.02-half-frame-deltas": (
        VIDEO_SPEC,
        {
            "action": [-1.5 / FPS, -0.5 / FPS, 0.5 / FPS, 1.5 / FPS, 2.5 / FPS, -0.02, -0.01, 0.01, 0.02, 0.05],
            "observation.images.cam0": [-0.5 / FPS, -0.02, 0.0, 0.02, 1.5 / FPS], "observation.state": [2 / FPS],
        },
        None, 0.02,
    ),
    "png-images-unsorted-subset-chunk": (
        {"image_cameras": True, "cameras": 2},
        {
            "action": [k / FPS for k in range(-2, 20)], "observation.images.cam0": [-1 / FPS, 0.0],
            "observation.images.cam1": [0.0],
        },
        [3, 0], None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(OPTION_COMBINATIONS))
def test_option_combinations_match_lerobot(make_ds, name: str) -> None:
    """Every sample, keys, dtypes, ``_is_pad`` masks and frames as LeRobot's, for each of OPTION_COMBINATIONS."""
    spec, windows, episodes, tolerance_s = OPTION_COMBINATIONS[name]
    if LEROBOT_03 and episodes is not None:
        pytest.skip("LeRobot 0.3 reads windows of an episodes= subset wrong (its issue #1783)")
    root = make_ds(episodes=5, frames_per_episode=LENGTHS, version=DATASET_VERSION, **spec)
    tolerance = {} if tolerance_s is None else {"tolerance_s": tolerance_s}
    theirs = _lerobot(root, windows, episodes=episodes, **tolerance)
    ours = _ours(root, windows, episodes=episodes, **tolerance)
    assert len(ours) == sum(LENGTHS[e] for e in (episodes or range(len(LENGTHS))))
    _assert_same_samples(ours, theirs, frame_check=_same_decode)


@pytest.mark.parametrize("tolerance_s", [1e-4, 1e-5])
def test_a_delta_off_the_frame_grid_beyond_tolerance_is_refused_as_by_lerobot(make_ds, tolerance_s: float) -> None:
    """Half a frame (0.5 / 30 s) is off the grid by 16.7 ms, far past either tolerance: both refuse it when built,
    with a ValueError (here a DeltaTimestampsError, which is one)."""
    from lerobot_dali.errors import DeltaTimestampsError

    root = make_ds(episodes=5, frames_per_episode=LENGTHS, version=DATASET_VERSION, **VIDEO_SPEC)
    windows = {"action": [0.0, 0.5 / FPS]}
    with pytest.raises(ValueError, match="tolerance"):
        _lerobot(root, windows, tolerance_s=tolerance_s)
    with pytest.raises(DeltaTimestampsError, match=r"holds 0\.01666.* s, which is not a multiple of 1/fps"):
        _ours(root, windows, tolerance_s=tolerance_s)
    assert issubclass(DeltaTimestampsError, ValueError)


@pytest.mark.skipif(
    LEROBOT_03 or (_installed_lerobot() or (0, 0)) >= (0, 6), reason="LeRobot 0.4-0.5 give subtask strings"
)
def test_subtask_strings_match_lerobot(make_ds, tmp_path: Path) -> None:
    """A dataset with subtask annotations (``subtask_index`` rows, ``meta/subtasks.parquet`` as pandas writes it):
    every sample carries LeRobot's ``subtask`` string, over an episode subset and windows too."""
    import pandas as pd

    from tests.test_extra_features import SUBTASKS, _with_subtasks

    src = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    root = _with_subtasks(src, tmp_path / "dataset", subtask_list=False)
    subtasks = pd.DataFrame({"subtask_index": range(len(SUBTASKS))}, index=pd.Index(SUBTASKS, name="subtask"))
    subtasks.to_parquet(root / "meta" / "subtasks.parquet")
    subset = [4, 0, 2]
    theirs = _lerobot(root, WINDOWS, episodes=subset)
    assert {theirs[i]["subtask"] for i in range(len(theirs))} == set(SUBTASKS)
    _assert_same_samples(_ours(root, WINDOWS, episodes=subset), theirs, frame_check=_same_decode)


def _tasks_column(kind: str) -> Callable[[Any], Any]:
    """meta/episodes' ``tasks`` column rewritten as ``kind``: "plain-strings" (one text per episode) or
    "lists-of-numbers" (each episode's task indices)."""
    import pyarrow as pa

    def rewrite(lists: list[list[str]]) -> Any:
        if kind == "plain-strings":
            return pa.array([each[0] for each in lists], pa.string())
        return pa.array([[int(each[0].split()[2].rstrip(":"))] for each in lists], pa.list_(pa.int64()))

    return rewrite


@needs_lerobot_04
@pytest.mark.parametrize("kind", ["plain-strings", "lists-of-numbers"])
def test_a_tasks_column_lerobot_does_not_read_gives_lerobots_tasks(make_ds, copy_ds, kind: str) -> None:
    """LeRobot reads no episode's ``tasks`` (a frame's task is tasks.parquet's text of its task_index), so it reads a
    dataset whose column holds plain strings or numbers: so does this, every frame's task LeRobot's (refused before)."""
    import pyarrow.parquet as pq

    root = copy_ds(make_ds(episodes=4, frames_per_episode=[5, 6, 4, 7], cameras=0, num_tasks=2, episodes_per_file=2))
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = _tasks_column(kind)(table["tasks"].to_pylist())
    at = table.column_names.index("tasks")
    pq.write_table(table.set_column(at, "tasks", column).replace_schema_metadata(None), path)
    theirs = _lerobot(root, {})
    ours = _ours(root, {})
    assert {i: ours[i]["task"] for i in ours} == {
        int(theirs[i]["index"]): theirs[i]["task"] for i in range(len(theirs))
    }
    assert len(ours) == 22


def _renumber(root: Path, column: str, data: dict[int, int]) -> None:
    """Integer ``column`` of every data file of ``root`` with each value ``data`` names replaced by its value there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        values = [data.get(i, i) for i in table[column].to_pylist()]
        at = table.column_names.index(column)
        pq.write_table(table.set_column(at, column, pa.array(values, pa.int64())), path)


@needs_lerobot_04
@pytest.mark.parametrize(("indices", "data"), [([1, 0], {}), ([0, 2], {1: 2})], ids=["rows-swapped", "gap"])
def test_a_task_list_lerobot_reads_by_row_position_is_refused_naming_lerobots_reading(
    make_ds, copy_ds, indices: list[int], data: dict[int, int]
) -> None:
    """LeRobot takes a frame's task from the row of meta/tasks.parquet at position task_index: with two rows swapped
    (their task_index columns too) it gives every frame the other task, and past the last row it fails (IndexError)
    at the first such frame. This refuses both at the open, saying what LeRobot reads there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lerobot_dali.errors import EpisodeMetadataError
    from lerobot_dali.generate import task_name

    root = copy_ds(make_ds(episodes=4, frames_per_episode=[5, 6, 4, 7], cameras=0, num_tasks=2, episodes_per_file=2))
    tasks = pq.read_table(root / "meta/tasks.parquet")
    texts = pa.array([task_name(i) for i in sorted(indices)])
    order = [sorted(indices).index(i) for i in indices]
    rows = pa.table({"task_index": pa.array(indices, pa.int64()), "__index_level_0__": texts.take(order)})
    pq.write_table(rows.replace_schema_metadata(tasks.schema.metadata), root / "meta/tasks.parquet")
    _renumber(root, "task_index", data)
    theirs = _lerobot(root, {})
    if data:
        with pytest.raises(IndexError):
            [theirs[i]["task"] for i in range(len(theirs))]
        said = rf"for task_index 2 it fails \(no such row\) where the list says '{task_name(2)}'"
    else:
        by_index = {i: task_name(i) for i in indices}
        assert all(theirs[i]["task"] != by_index[int(theirs[i]["task_index"])] for i in range(len(theirs)))
        said = rf"for task_index 0 it reads row 0's '{theirs[0]['task']}' where the list says '{task_name(0)}'"
    with pytest.raises(EpisodeMetadataError, match=rf"meta/tasks\.parquet does not hold .*{said}"):
        _ours(root, {})


@pytest.mark.skipif(
    LEROBOT_03 or (_installed_lerobot() or (0, 0)) >= (0, 6), reason="LeRobot 0.4-0.5 give subtask strings"
)
@pytest.mark.parametrize(("order", "data"), [((2, 0, 1), {}), ((0, 1, 3), {2: 3})], ids=["rows-rotated", "gap"])
def test_a_subtask_list_lerobot_reads_by_row_position_is_refused_naming_lerobots_reading(
    make_ds, tmp_path: Path, order: tuple[int, ...], data: dict[int, int]
) -> None:
    """LeRobot takes a frame's subtask from the row of meta/subtasks.parquet at position subtask_index, as its task:
    with the rows rotated it gives every frame another subtask than the list's for its index, and past the last row
    it fails (IndexError). This refuses both at the open, saying what LeRobot reads there."""
    import pyarrow.parquet as pq

    from lerobot_dali.errors import EpisodeMetadataError
    from lerobot_dali.generate import text_list_table
    from tests.test_extra_features import SUBTASKS, _with_subtasks

    root = _with_subtasks(make_ds(episodes=4, frames_per_episode=[5, 6, 4, 7], cameras=0), tmp_path / "dataset")
    texts = {**dict(enumerate(SUBTASKS)), 3: "put it down"}
    pq.write_table(text_list_table("subtask", [(i, texts[i]) for i in order]), root / "meta/subtasks.parquet")
    _renumber(root, "subtask_index", data)
    theirs = _lerobot(root, {})
    if data:
        with pytest.raises(IndexError):
            [theirs[i]["subtask"] for i in range(len(theirs))]
        said = r"for subtask_index 3 it fails \(no such row\) where the list says 'put it down'"
    else:
        by_position = [texts[i] for i in order]
        frames = [(int(theirs[i]["subtask_index"]), theirs[i]["subtask"]) for i in range(len(theirs))]
        assert all(text == by_position[index] != texts[index] for index, text in frames) and len(frames) == 22
        said = rf"for subtask_index 0 it reads row 0's '{texts[2]}' where the list says '{texts[0]}'"
    with pytest.raises(EpisodeMetadataError, match=rf"meta/subtasks\.parquet does not hold .*{said}"):
        _ours(root, {})


@pytest.mark.skipif(
    LEROBOT_03 or (_installed_lerobot() or (0, 0)) >= (0, 6), reason="LeRobot 0.4-0.5 give subtask strings"
)
def test_subtask_index_minus_one_is_no_subtask_where_lerobot_gives_the_lists_last_text(make_ds, tmp_path) -> None:
    """Deliberately unlike LeRobot: subtask writers (rosbag2lerobot's DatasetWriter for an episode without subtask
    spans; lerobot-annotate's export for frames no segment covers) write ``subtask_index`` -1 for "no subtask".
    LeRobot 0.4 gives those frames ``subtasks.iloc[-1]``, the list's last text, as if annotated with it; batches here
    carry "" (and ``subtask_index`` -1), every other frame LeRobot's text."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tests.test_extra_features import SUBTASKS, _with_subtasks

    root = _with_subtasks(make_ds(episodes=4, frames_per_episode=[5, 6, 4, 7], cameras=0), tmp_path / "dataset")
    for path in sorted((root / "data").rglob("*.parquet")):  # (episodes 1 and 3 not annotated)
        table = pq.read_table(path)
        unannotated = pc.is_in(table["episode_index"], pa.array([1, 3]))
        values = pc.if_else(unannotated, -1, table["subtask_index"])
        at = table.column_names.index("subtask_index")
        pq.write_table(table.set_column(at, "subtask_index", values.cast(pa.int64())), path)
    theirs = _lerobot(root, {})
    ours = _ours(root, {})
    assert len(ours) == len(theirs) == 22
    none = 0
    for i in range(len(theirs)):
        sample = theirs[i]
        mine = ours[_sample_key(sample)]
        assert int(mine["subtask_index"]) == int(sample["subtask_index"])
        if int(sample["subtask_index"]) == -1:
            none += 1
            assert (mine["subtask"], sample["subtask"]) == ("", SUBTASKS[-1])
        else:
            assert mine["subtask"] == sample["subtask"] != ""
    assert none == 6 + 7


@needs_lerobot_04
@pytest.mark.parametrize("layout", ["plain-columns", "index-named-instruction"])
def test_a_task_list_without_lerobots_pandas_index(make_ds, copy_ds, layout: str) -> None:
    """LeRobot 0.4 takes a frame's task from ``tasks.iloc[task_index].name``: the DataFrame's index, whatever the
    file's pandas metadata names it ("instruction": every frame LeRobot's text here too, which was refused). A file
    without a pandas index (pyarrow's or polars' writer: columns ``task_index`` and ``task``) deliberately differs:
    LeRobot gives each frame the row's number as its ``task``, not a text; batches here carry the ``task`` column's
    text of each row's ``task_index``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lerobot_dali.generate import task_name

    root = copy_ds(make_ds(episodes=4, frames_per_episode=[5, 6, 4, 7], cameras=0, num_tasks=2, episodes_per_file=2))
    texts = [task_name(0), task_name(1)]
    if layout == "plain-columns":
        pq.write_table(pa.table({"task_index": [0, 1], "task": texts}), root / "meta/tasks.parquet")
    else:
        import pandas as pd

        frame = pd.DataFrame({"task_index": [0, 1]}, index=pd.Index(texts, name="instruction"))
        frame.to_parquet(root / "meta/tasks.parquet")
    theirs = _lerobot(root, {})
    ours = _ours(root, {})
    assert len(ours) == len(theirs) == 22
    for i in range(len(theirs)):
        sample = theirs[i]
        index = int(sample["task_index"])
        assert ours[_sample_key(sample)]["task"] == texts[index]
        assert sample["task"] == (index if layout == "plain-columns" else texts[index])


@pytest.mark.parametrize("late", [False, True], ids=["", "late-rows-own-tolerance"])
def test_a_union_matches_lerobots_multi_dataset(make_ds, copy_ds, tmp_path: Path, late: bool) -> None:
    """``concat_datasets`` against LeRobot's ``MultiLeRobotDataset`` over two datasets that differ in episodes,
    tasks and cameras (the second's extra camera is left out by both): every sample, ``dataset_index`` included.
    Where the union means to differ: its ``task_index`` counts the first dataset's tasks before the second's (one
    index, one task string), where LeRobot's repeats each dataset's own; the statistics are pooled alike.
    ``late``: the second's rows sit 0.3 frame after their frames, which its own tolerance (``tolerances_s``, as
    LeRobot takes it per dataset) reads, and the first's default does not."""
    try:
        from lerobot.datasets.multi_dataset import MultiLeRobotDataset  # (LeRobot >= 0.5)
    except ImportError:
        from lerobot.datasets.lerobot_dataset import MultiLeRobotDataset

    from lerobot_dali import concat_datasets

    roots = {
        "a": make_ds(codec="av1", gop=2, episodes=3, frames_per_episode=[12, 7, 20], cameras=1, seed=3,
                     version=DATASET_VERSION),
        "b": make_ds(codec="av1", gop=2, episodes=2, frames_per_episode=[9, 15], cameras=2, seed=4,
                     episodes_per_file=2, version=DATASET_VERSION),
    }  # fmt: skip
    tolerances = [None, None]
    if late:
        from tests.test_dataset_union import _retimed

        fps = json.loads((roots["b"] / "meta/info.json").read_text())["fps"]
        roots["b"] = _retimed(copy_ds(roots["b"]), lambda t: t + 0.3 / fps)
        tolerances = [None, 0.4 / fps]
    (tmp_path / "local").mkdir()
    for name, root in roots.items():
        (tmp_path / "local" / name).symlink_to(root)
    windows = {k: list(v) for k, v in WINDOWS.items()}
    theirs = MultiLeRobotDataset(
        [f"local/{name}" for name in roots], root=tmp_path, delta_timestamps=windows,
        tolerances_s={f"local/{name}": t or 1e-4 for name, t in zip(roots, tolerances, strict=True)},
    )  # fmt: skip
    union = concat_datasets(list(roots.values()), tolerances_s=tolerances)
    ours = _ours(union, WINDOWS)
    assert len(ours) == len(theirs) == 12 + 7 + 20 + 9 + 15

    def union_task_index(sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, "task_index": sample["task_index"] + union.task_offsets[int(sample["dataset_index"])]}

    _assert_same_samples(
        ours, theirs, frame_check=_same_decode, video_keys=theirs.video_frame_keys, expected_of=union_task_index
    )
    assert union.task_offsets == (0, 2)  # (the second dataset's indices did move)
    assert all(union.tasks[int(sample["task_index"])] == sample["task"] for sample in ours.values())
    pooled = union.read_stats()
    for key in ("action", "observation.state"):
        for stat in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(pooled[key][stat], np.asarray(theirs.stats[key][stat]), rtol=1e-6, atol=1e-9)


@pytest.mark.skipif((_installed_lerobot() or (0, 0)) < (0, 6), reason="LeRobot's episode_filter is new in 0.6")
def test_an_episode_filter_matches_lerobot(make_ds) -> None:
    """The filter sees the same metadata rows (every column but the stats) and keeps the same episodes."""
    root = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    seen: dict[str, dict[int, dict[str, Any]]] = {"ours": {}, "theirs": {}}

    def keeper(side: str) -> Callable[[dict[str, Any]], bool]:
        def keep(row: dict[str, Any]) -> bool:
            seen[side][row["episode_index"]] = row
            return row["length"] >= 16 and row["data/file_index"] != 0  # episodes 3 (25 frames) and 4 (16)

        return keep

    theirs = _lerobot(root, WINDOWS, episodes=[0, 1, 3, 4], episode_filter=keeper("theirs"))
    ours = _ours(root, WINDOWS, episodes=[0, 1, 3, 4], episode_filter=keeper("ours"))
    assert sorted({int(theirs[i]["episode_index"]) for i in range(len(theirs))}) == [3, 4]
    assert sorted(seen["ours"]) == sorted(seen["theirs"]) == [0, 1, 3, 4]
    for episode, row in seen["theirs"].items():
        assert seen["ours"][episode] == row, f"episode {episode}'s metadata row"
    _assert_same_samples(ours, theirs, frame_check=_same_decode)


@needs_lerobot_04
def test_datasets_lerobots_v21_converter_writes_match_lerobot(make_ds, copy_ds, monkeypatch, caplog) -> None:
    """Most v3.0 datasets on the Hub were converted from v2.1 by this script; before LeRobot 0.5 it placed the episode
    that starts each data file after the first in the one before (its issue #2401), which these small file sizes
    (2 episodes per data file, 1-2 per video file) reach."""
    import importlib

    try:  # LeRobot 0.5 moved it, and its root= became the dataset's folder rather than its parent
        converter, root_is_parent = importlib.import_module("lerobot.scripts.convert_dataset_v21_to_v30"), False
    except ImportError:
        converter, root_is_parent = importlib.import_module("lerobot.datasets.v30.convert_dataset_v21_to_v30"), True

    def no_hub(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the converter asked the Hub")

    monkeypatch.setattr(converter, "snapshot_download", no_hub, raising=False)
    monkeypatch.setattr(converter, "HfApi", no_hub, raising=False)
    root = copy_ds(make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, version="v2.1"))
    converter.convert_dataset(
        repo_id=root.name, root=root.parent if root_is_parent else root, push_to_hub=False,
        data_file_size_in_mb=0.005, video_file_size_in_mb=0.006,
    )  # fmt: skip
    assert json.loads((root / "meta/info.json").read_text())["codebase_version"] == "v3.0"
    assert len(list((root / "data").rglob("*.parquet"))) > 1
    assert len(list((root / "videos").rglob("*.mp4"))) > 2
    with caplog.at_level("WARNING", logger="lerobot_dali.episode_data_files"):
        _assert_same_samples(_ours(root, WINDOWS), _lerobot(root, WINDOWS), frame_check=_same_decode)
    stale = any("v2.1 -> v3.0 converter before 0.5.0" in r.getMessage() for r in caplog.records)
    assert stale == ((_installed_lerobot() or (0, 0)) < (0, 5))
    subset = [1, 3, 4]
    theirs = _lerobot(root, WINDOWS, episodes=subset)
    _assert_same_samples(_ours(root, WINDOWS, episodes=subset), theirs, frame_check=_same_decode)


# -- real datasets (../shared/datasets) ---------------------------------------------------------------------
#: cr5's camera, a 2-step state history and a 5 s action chunk (10 fps).
CR5_WINDOWS = {
    "observation.images.top": [-0.1, 0.0],
    "observation.state": [-0.2, -0.1, 0.0],
    "action": [k / 10 for k in range(50)],
}


@needs_lerobot_04
def test_a_real_dataset_with_wall_clock_timestamps_matches_lerobot_at_a_wide_tolerance() -> None:
    """cr5_v30_av1 (real data, LeRobot's v2.1 -> v3.0 converter, 5 AV1 episodes per file) has wall-clock parquet
    timestamps, up to 50 ms off its 10 fps video: at tolerance_s=0.06 both read the frame nearest each row. An unsorted
    split [8, 5, 6] (the first of the second file, and two at 19.9 s and 70.7 s into it), sampled past each episode's
    first 150 frames and before its last 15 (which lie past its video in episodes 6 and 8), windows reaching back."""
    from torch.utils.data import Subset

    from tests.conftest import shared_dataset

    root = shared_dataset("cr5_v30_av1")
    split, first, last = [8, 5, 6], 150, 15
    theirs = _lerobot(root, CR5_WINDOWS, episodes=split, tolerance_s=0.06)
    ours = _ours(
        root, CR5_WINDOWS, episodes=split, tolerance_s=0.06, drop_n_first_frames=first, drop_n_last_frames=last
    )
    sampled, start = [], 0
    for length in (199, 211, 223):  # (episodes 5, 6 and 8, in the data's order)
        sampled += range(start + first, start + length - last)
        start += length
    assert len(theirs) == start and len(ours) == len(sampled) == 138
    _assert_same_samples(ours, Subset(theirs, sampled), frame_check=_same_decode, video_keys=theirs.meta.video_keys)


@needs_lerobot_04
def test_a_real_datasets_rows_and_windows_over_an_unsorted_split_of_several_files_match_lerobot() -> None:
    """cr5_v30_av1's rows (no camera: LeRobot's video query is left out, its wall-clock rows miss the default
    tolerance) over episodes [11, 2, 7, 5] of its three data files: every value, ``_is_pad``, task and index."""
    from tests.conftest import shared_dataset

    root = shared_dataset("cr5_v30_av1")
    windows = {k: v for k, v in CR5_WINDOWS.items() if k != "observation.images.top"}
    split = [11, 2, 7, 5]
    theirs = _lerobot(root, windows, episodes=split)
    # (LeRobot 0.6 queries the videos in its DatasetReader; 0.3-0.5 in the dataset itself)
    (theirs._ensure_reader() if hasattr(theirs, "_ensure_reader") else theirs)._query_videos = lambda *args: {}
    ours = _ours(root, windows, episodes=split, cameras=[])
    assert len(ours) == len(theirs) == 198 + 275 + 297 + 199
    _assert_same_samples(ours, theirs, frame_check=_same_decode)


@needs_lerobot_04
def test_rows_past_their_episodes_video_read_a_neighbours_frames_in_lerobot_and_are_refused_here() -> None:
    """Deliberately unlike LeRobot: cr5_v30_av1's episode 0 has 197 frames in its file's first 19.7 s, and rows up to
    20.55 s. At tolerance_s=0.06 LeRobot 0.4.4 gives its last 9 rows frames 197-205 of the file, episode 1's, without
    a word; this refuses, naming the neighbouring episode."""
    import pyarrow.parquet as pq

    from lerobot_dali.errors import FrameTimestampError
    from tests.conftest import shared_dataset

    root = shared_dataset("cr5_v30_av1")
    theirs = _lerobot(root, {}, episodes=[0], tolerance_s=0.06)
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    span_s = [episodes[0][f"videos/observation.images.top/{end}_timestamp"] for end in ("from", "to")]
    assert span_s == [0.0, 19.7]
    frames = [round(float(t) * 10) for t in theirs.hf_dataset["timestamp"]]
    past = [i for i, frame in enumerate(frames) if frame >= 197]
    assert (len(frames), past, frames[-1]) == (197, list(range(188, 197)), 205)
    assert all(theirs[i]["observation.images.top"].shape == (3, 480, 640) for i in past)  # (read, not refused)
    with pytest.raises(FrameTimestampError, match=r"episode 0, .* outside this episode's part .*neighbouring episode"):
        _ours(root, {}, episodes=[0], tolerance_s=0.06)


@needs_lerobot_04
def test_data_files_out_of_episode_order_read_by_position_in_lerobot_and_by_episode_here(make_ds, copy_ds) -> None:
    """Deliberately unlike LeRobot: test_iterator's set with its data files in reverse order (file-000 holds episode 4,
    rows with ``index`` 17-22). LeRobot (0.4.4, 0.6.1) takes item i from the i-th row in file order: item 0 is
    ``index`` 17, and episode 3's items fail in torchcodec (``IndexError``: their frames are looked up past the end of
    another episode's video). This reads each episode's rows from the file and rows meta/episodes names:
    every ``index`` once, with its own row's episode and frame (``tests/test_file_order.py`` checks every value and
    frame by hand)."""
    from tests.test_file_order import REVERSED, out_of_episode_order
    from tests.test_iterator import DELTAS, LENGTHS, _dataset

    root = out_of_episode_order(copy_ds(_dataset(make_ds, "vp9")), REVERSED)
    theirs = _lerobot(root, DELTAS)
    assert len(theirs) == sum(LENGTHS)
    failing = []
    for position in range(len(theirs)):
        try:
            theirs[position]
        except IndexError:
            failing.append(position)
    assert failing == [13, 14, 15, 16]  # (episode 3's rows, at positions 13-16)
    assert [int(theirs.hf_dataset[i]["index"]) for i in (0, 6, 17)] == [17, 6, 0]
    rows = theirs.hf_dataset.with_format(None)
    row_of = {i: (e, f) for i, e, f in zip(rows["index"], rows["episode_index"], rows["frame_index"], strict=True)}
    ours = _ours(root, DELTAS)
    assert sorted(ours) == sorted(row_of) == list(range(sum(LENGTHS)))
    assert {key: (int(s["episode_index"]), int(s["frame_index"])) for key, s in ours.items()} == row_of


@needs_lerobot_04
def test_a_real_h264_dataset_with_more_video_frames_than_rows_matches_lerobot_but_for_ties(copy_ds) -> None:
    """r1_v30_h264 (real data: H.264 with B-frames, 25 fps video under 10 fps rows), read here as published
    (``keys=["action"]``: its state holds 41 values where info.json declares 17), against LeRobot 0.4.4 on a copy it
    opens (rows cut to info.json's features, the state left out, the episode's from/to_timestamp filled in). At
    tolerance_s=0.0201 every value, mask and frame is LeRobot's but at the rows exactly between two frames (odd
    tenths of a second): this reads the earlier frame, LeRobot the one float32 rounding of the row's time picks (the
    later one for 197 of the 395 such rows, README "Timestamps"). Samples from frame 750 on, windows reaching back."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from torch.utils.data import Subset

    from tests.conftest import shared_dataset

    camera = "observation.images.rgb"
    source = shared_dataset("r1_v30_h264")
    root = copy_ds(source)
    info = json.loads((root / "meta/info.json").read_text())
    del info["features"]["observation.state"]
    (root / "meta/info.json").write_text(json.dumps(info))
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data).select([k for k in info["features"] if k != camera])
    at = table.column_names.index("action")
    pq.write_table(table.set_column(at, "action", table["action"].cast(pa.list_(pa.float32(), 17))), data)
    episodes_path = root / "meta/episodes/chunk-000/file-000.parquet"
    episodes = pq.read_table(episodes_path)
    for end, seconds in (("from", 0.0), ("to", 79.0)):
        episodes = episodes.append_column(f"videos/{camera}/{end}_timestamp", pa.array([seconds]))
    pq.write_table(episodes, episodes_path)

    windows = {camera: [-0.1, 0.0], "action": [k / 10 for k in range(50)]}
    theirs = Subset(_lerobot(root, windows, tolerance_s=0.0201), range(750, 790))
    ours = _ours(source, windows, tolerance_s=0.0201, keys=["action"], drop_n_first_frames=750)
    samples = [theirs[i] for i in range(len(theirs))]
    differs, ties_lerobot_reads_later = set(), set()
    for sample in samples:
        frame = int(sample["frame_index"])
        got = ours[frame][camera]
        for step, row in enumerate((max(frame - 1, 0), frame)):
            if (got[step] - sample[camera][step]).abs().max().item() * 255 > 3.01:
                differs.add((frame, step))
            row_s = float(np.float32(row / 10))  # (as LeRobot's float32 timestamp column holds it)
            if round(row_s * 25) != 5 * row // 2:  # LeRobot's frame, not the nearest (of a tie's two, the earlier)
                ties_lerobot_reads_later.add((frame, step))
    assert len(ours) == 40 and differs == ties_lerobot_reads_later and len(differs) == 20  # (of 80 frames)
    # Every other key as LeRobot's, the frames as compared above.
    _assert_same_samples(
        ours, samples, frame_check=_same_decode, video_keys=[camera],
        expected_of=lambda sample: {**sample, camera: ours[int(sample["index"])][camera]},
    )  # fmt: skip


# -- datasets LeRobot writes itself ---------------------------------------------------------------------------
MARKED_CAMERAS = ("observation.images.top", "observation.images.wrist")
MARKED_SIZE = (64, 96)


def _encoder(vcodec: str) -> dict[str, Any]:
    """``LeRobotDataset.create``'s codec option: ``vcodec=`` in LeRobot 0.4, an encoder config since 0.5."""
    try:
        from lerobot.configs.video import RGBEncoderConfig
    except ImportError:
        return {"vcodec": vcodec}
    return {"rgb_encoder": RGBEncoderConfig(vcodec=vcodec)}


@pytest.fixture(scope="session")
def lerobot_written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Path]:
    """``lerobot_written(vcodec, split)``: LENGTHS episodes written by ``LeRobotDataset.create`` with its
    default encoder settings (``vcodec="images"``: image cameras, PNGs in the data files); ``split`` starts a new
    data and video file after every episode, two per chunk. LeRobot 0.3 writes v2.1 (a file per episode; chunks
    of two with ``split``) and encodes AV1 only."""
    written: dict[tuple[str, bool], Path] = {}

    def write(vcodec: str, split: bool) -> Path:
        if (vcodec, split) in written:
            return written[vcodec, split]
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        root = tmp_path_factory.mktemp("lerobot_written") / f"{vcodec}{'_split' if split else ''}"
        images = vcodec == "images"
        features = _marked_features(vcodec)
        if LEROBOT_03 and vcodec not in ("images", "libsvtav1"):
            pytest.skip("LeRobot 0.3's writer encodes AV1 only")
        codec = {"use_videos": False} if images else {} if LEROBOT_03 else _encoder(vcodec)
        dataset = LeRobotDataset.create(f"local/{root.name}", fps=FPS, features=features, root=root, **codec)
        if split:
            _set_in_info(dataset, {"video_files_size_in_mb": 1e-4, "data_files_size_in_mb": 1e-4, "chunks_size": 2})
        _record(dataset, range(len(LENGTHS)))
        if hasattr(dataset, "finalize"):  # (LeRobot 0.4: closes its parquet writers)
            dataset.finalize()
        written[vcodec, split] = root
        return root

    return write


def _set_in_info(dataset: Any, values: Mapping[str, Any]) -> None:
    """``values`` set in the info of LeRobot's writer ``dataset`` (file sizes, chunk size) before it records."""
    info = dataset.meta.info  # a dict before LeRobot 0.5, a dataclass since
    for name, value in values.items():
        if isinstance(info, dict):
            info[name] = value
        else:
            setattr(info, name, value)


def _marked_features(vcodec: str) -> dict[str, dict[str, Any]]:
    """The features ``lerobot_written`` records: state, action, two marked cameras (``"images"``: PNG images)."""
    names = ["height", "width", "channels"]
    camera = {"dtype": "image" if vcodec == "images" else "video", "shape": (*MARKED_SIZE, 3), "names": names}
    return {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (7,), "names": None},
        **dict.fromkeys(MARKED_CAMERAS, camera),
    }


def _record(dataset: Any, episodes: Sequence[int]) -> None:
    """Episodes ``episodes`` of LENGTHS added to LeRobot's writer ``dataset`` and saved: each frame's state
    ``episode * 1000 + frame``, its action the negative, its cameras marked (episode, frame, camera), its task
    ``task {episode % 3}``."""
    for episode in episodes:
        for frame in range(LENGTHS[episode]):
            value = episode * 1000 + frame
            row = {
                "observation.state": np.full(6, value, np.float32),
                "action": np.full(7, -value, np.float32),
                **{cam: draw_marker(episode, frame, *MARKED_SIZE, i) for i, cam in enumerate(MARKED_CAMERAS)},
            }
            task = f"task {episode % 3}"
            if LEROBOT_03:  # (0.3 takes the task beside the frame, 0.4 in it)
                dataset.add_frame(row, task=task)
            else:
                dataset.add_frame({**row, "task": task})
        dataset.save_episode()


MARKED_WINDOWS = {**WINDOWS, MARKED_CAMERAS[0]: WINDOWS["observation.images.cam0"]}
del MARKED_WINDOWS["observation.images.cam0"]


def _assert_marked_frames(
    samples: dict[int, dict[str, Any]],
    source_episodes: Sequence[int] = range(len(LENGTHS)),
    windows: Mapping[str, Sequence[float]] = MARKED_WINDOWS,
) -> None:
    """Every frame is the one its row and window name: the marker drawn into it when it was written (by episode
    ``source_episodes[e]`` of ``lerobot_written``, for a sample of episode ``e``). The SVT-AV1 3.0 that PyAV < 16
    bundles blurs some 64x96 markers past reading (9 of 30 frames at LeRobot's crf 30): there, a marker that reads
    must still be right, and most must read."""
    steps = {camera: [round(d * FPS) for d in windows.get(camera, [0.0])] for camera in MARKED_CAMERAS}
    checked, unreadable = 0, 0
    for sample in samples.values():
        episode, frame = source_episodes[int(sample["episode_index"])], int(sample["frame_index"])
        for camera_index, camera in enumerate(MARKED_CAMERAS):
            if camera not in sample:
                continue
            frames = sample[camera] if sample[camera].dim() == 4 else sample[camera][None]
            for image, step in zip(frames, steps[camera], strict=True):
                wanted = (episode, min(max(frame + step, 0), LENGTHS[episode] - 1), camera_index)
                checked += 1
                try:
                    marker = read_full_marker((image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
                except ValueError:
                    unreadable += 1
                    continue
                got = (marker.episode_index, marker.frame_index, marker.camera_index)
                assert got == wanted, f"{camera} of episode {episode} frame {frame}, step {step}"
    old_svt_av1 = int(av.__version__.split(".")[0]) < 16
    assert unreadable <= (0.4 * checked if old_svt_av1 else 0), f"{unreadable} of {checked} markers do not read"


@pytest.mark.parametrize("split", [False, True], ids=["episodes_share_files", "file_and_chunk_per_episode"])
@pytest.mark.parametrize("vcodec", ["libsvtav1", "h264", "images"])
def test_datasets_lerobot_writes_match_lerobot(lerobot_written, vcodec: str, split: bool) -> None:
    root = lerobot_written(vcodec, split)
    ours = _ours(root, MARKED_WINDOWS)
    _assert_same_samples(ours, _lerobot(root, MARKED_WINDOWS), frame_check=_same_decode)
    _assert_marked_frames(ours)


@pytest.mark.skipif(LEROBOT_03, reason="LeRobot 0.3 reads windows of an episodes= subset wrong (its issue #1783)")
@pytest.mark.parametrize(("vcodec", "split"), [("libsvtav1", True), ("images", False)])
def test_an_unsorted_split_of_a_dataset_lerobot_writes_matches_lerobot(
    lerobot_written, vcodec: str, split: bool
) -> None:
    """Episodes [4, 1, 3] of LeRobot's own AV1 (a file per episode) and PNG datasets, 50-step action chunks, a 2-step
    history on the state and a camera, the other camera at one past step."""
    root = lerobot_written(vcodec, split)
    windows = {
        MARKED_CAMERAS[0]: [-1 / FPS, 0.0], MARKED_CAMERAS[1]: [-2 / FPS], "observation.state": [-1 / FPS, 0.0],
        "action": [k / FPS for k in range(50)],
    }  # fmt: skip
    split_episodes = [4, 1, 3]
    ours = _ours(root, windows, episodes=split_episodes)
    assert len(ours) == sum(LENGTHS[e] for e in split_episodes)
    _assert_same_samples(ours, _lerobot(root, windows, episodes=split_episodes), frame_check=_same_decode)


@needs_lerobot_04
@pytest.mark.parametrize("split", [False, True], ids=["episodes_share_files", "file_and_chunk_per_episode"])
def test_lerobots_streaming_dataset_matches_where_the_bench_counts_it_a_peer(lerobot_written, split: bool) -> None:
    """``StreamingLeRobotDataset`` against lerobot-dali on LeRobot's own H.264 sets: where every episode's video
    starts at its first index / fps (LeRobot's writer, one file for all) each sample it streams is ours; in a file
    per episode, as the bench says (``lerobot_dali.bench``: "not a peer here", LeRobot issue #4524), the
    LeRobot releases that look frames up by index read other frames there or fail."""
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    from lerobot_dali import open_dataset
    from lerobot_dali.bench import _episodes_not_at_index_time
    from lerobot_dali.bench_peers import streaming_looks_up_by_index

    root = lerobot_written("h264", split)
    misplaced = _episodes_not_at_index_time(open_dataset(root), tolerance_s=1e-4)
    assert misplaced == (len(LENGTHS) - 1 if split else 0)  # (episode 0 starts at 0 s either way)
    streaming = StreamingLeRobotDataset(
        f"local/{root.name}", root=root, delta_timestamps={k: list(v) for k, v in MARKED_WINDOWS.items()},
        shuffle=False, buffer_size=10,
    )  # fmt: skip
    ours = _ours(root, MARKED_WINDOWS)
    streamed, failed = {}, None
    try:
        for sample in streaming:
            assert _sample_key(sample) not in streamed, f"sample {_sample_key(sample)} streamed twice"
            streamed[_sample_key(sample)] = sample
    except IndexError as e:  # torchcodec: a frame past the end of the episode's file
        failed = e
    other_frames = sorted(
        key
        for key, sample in streamed.items()
        if any((sample[camera] - ours[key][camera]).abs().max().item() * 255 > 3.01 for camera in MARKED_CAMERAS)
    )
    if misplaced and streaming_looks_up_by_index():
        assert failed is not None or other_frames, "it read every frame right where the bench says it does not"
        return
    assert failed is None and not other_frames, f"{failed!r}; other frames in samples {other_frames}"

    def as_ours(sample: dict[str, Any]) -> dict[str, Any]:
        """It streams scalar columns as Python numbers, which a DataLoader batches as int64 (as ours) and float64
        (``timestamp``; ours float32, bench/README.md): as tensors, to compare."""
        scalars = {k: v for k, v in sample.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        assert sorted(scalars) == ["episode_index", "frame_index", "index", "task_index", "timestamp"]
        tensors = {
            k: torch.tensor(v, dtype=torch.float32 if isinstance(v, float) else None) for k, v in scalars.items()
        }
        return {**sample, **tensors}

    _assert_same_samples(
        ours, list(streamed.values()), frame_check=_same_decode, video_keys=MARKED_CAMERAS, expected_of=as_ours
    )


# -- LeRobot's recording modes: streaming encoding, resume, files rolling over -----------------------------------
#: File sizes that roll over while recording: a data file per episode (its first row group passes 0.001 MB) and, for
#: the 64x96 H.264 cameras (150-200 bytes a frame), a second video file from episode 3 or 4, each camera at its own.
SMALL_FILES = {"video_files_size_in_mb": 0.012, "data_files_size_in_mb": 0.001}
#: What ``lerobot_recorded``'s modes need of ``LeRobotDataset``: a ``create`` option, or a method.
RECORDING_NEEDS = {"streaming": "streaming_encoding", "resumed": "resume", "resumed_streaming": "resume"}


def _writer_has(option: str) -> bool:
    """Whether this LeRobot's writer has ``option``: a ``LeRobotDataset.create`` parameter or a ``LeRobotDataset``
    method (``resume``: LeRobot 0.6). Checked before importing anything only some LeRobot releases have."""
    import inspect

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return hasattr(LeRobotDataset, option) or option in inspect.signature(LeRobotDataset.create).parameters


@pytest.fixture(scope="session")
def lerobot_recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Path]:
    """``lerobot_recorded(mode, small_files)``: LENGTHS episodes, H.264, recorded by LeRobot's writer in ``mode``:
    ``"streaming"`` (``streaming_encoding=True``: a background thread per camera encodes the frames as they are
    added, no PNGs), ``"resumed"`` (episodes 0-2 recorded and finalized, 3-4 added by ``LeRobotDataset.resume``),
    ``"resumed_streaming"`` (both); ``small_files``: SMALL_FILES (``create``'s options from LeRobot 0.6, set in
    the info before). Skips where this LeRobot's writer lacks the mode."""
    recorded: dict[tuple[str, bool], Path] = {}

    def record(mode: str, small_files: bool) -> Path:
        if (mode, small_files) in recorded:
            return recorded[mode, small_files]
        if LEROBOT_03 or not _writer_has(RECORDING_NEEDS[mode]):
            pytest.skip(f"this LeRobot's writer has no {RECORDING_NEEDS[mode]}")
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        root = tmp_path_factory.mktemp("lerobot_recorded") / f"{mode}{'_small_files' if small_files else ''}"
        streaming = {"streaming_encoding": mode.endswith("streaming")}
        sizes = SMALL_FILES if small_files and _writer_has("video_files_size_in_mb") else {}
        dataset = LeRobotDataset.create(
            f"local/{root.name}", fps=FPS, features=_marked_features("h264"), root=root, **_encoder("h264"),
            **streaming, **sizes,
        )  # fmt: skip
        if small_files and not sizes:
            _set_in_info(dataset, SMALL_FILES)
        first = 3 if mode.startswith("resumed") else len(LENGTHS)
        _record(dataset, range(first))
        dataset.finalize()
        if first < len(LENGTHS):
            dataset = LeRobotDataset.resume(f"local/{root.name}", root=root, **_encoder("h264"), **streaming)
            _record(dataset, range(first, len(LENGTHS)))
            dataset.finalize()
        recorded[mode, small_files] = root
        return root

    return record


def _files_per_episode(root: Path) -> list[dict[str, Any]]:
    """Each episode's data file, and first camera's video file and from/to timestamps, from meta/episodes."""
    import pyarrow.parquet as pq

    rows = sorted(
        (row for path in sorted(root.glob("meta/episodes/*/*.parquet")) for row in pq.read_table(path).to_pylist()),
        key=lambda row: row["episode_index"],
    )
    video = f"videos/{MARKED_CAMERAS[0]}"
    return [
        {
            "data": (row["data/chunk_index"], row["data/file_index"]),
            "video": (row[f"{video}/chunk_index"], row[f"{video}/file_index"]),
            "from_s": row[f"{video}/from_timestamp"],
            "to_s": row[f"{video}/to_timestamp"],
        }
        for row in rows
    ]


def _video_timing(path: Path) -> dict[str, Any]:
    """A video file's time base, frame count, pts steps, GOPs (frames between keyframes) and whether it has B-frames
    (packets out of presentation order)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.pts is not None]
        time_base = stream.time_base
    pts = sorted(p for p, _ in packets)
    keyframes = sorted(p for p, key in packets if key)
    return {
        "time_base": time_base,
        "frames": len(packets),
        "first_pts": pts[0],
        "pts_steps": sorted({b - a for a, b in itertools.pairwise(pts)}),
        "gops": sorted({pts.index(b) - pts.index(a) for a, b in itertools.pairwise(keyframes)}),
        "b_frames": [p for p, _ in packets] != pts,
    }


@pytest.mark.parametrize("small_files", [False, True], ids=["default_file_sizes", "small_files"])
@pytest.mark.parametrize("mode", ["streaming", "resumed", "resumed_streaming"])
def test_datasets_lerobots_recording_modes_write_match_lerobot(
    lerobot_recorded, lerobot_written, mode: str, small_files: bool
) -> None:
    """Every sample of LeRobot-recorded datasets as LeRobot's, every frame the one its row and window name.
    What LeRobot 0.6.1 writes: the streaming encoder's videos time as the PNG path's (time base 1/15360, a frame
    every 512, pts from 0, 2-frame GOPs, no B-frames), episode after episode in one file per camera, each episode's
    from/to timestamps its frames' (the file's frames before it / fps); ``resume`` starts new data and video files
    (file-001) and fills them from 0 s; SMALL_FILES roll a data file per episode and each camera's video file once."""
    root = lerobot_recorded(mode, small_files)
    episodes = _files_per_episode(root)
    start_s = 0.0
    for episode, (files, length) in enumerate(zip(episodes, LENGTHS, strict=True)):
        if episode and files["video"] != episodes[episode - 1]["video"]:
            start_s = 0.0
        assert files["from_s"] == pytest.approx(start_s, abs=1e-6), f"episode {episode}: {files}"
        assert files["to_s"] == pytest.approx(start_s + length / FPS, abs=1e-6), f"episode {episode}: {files}"
        start_s = files["to_s"]
    data_files, video_files = [[files[kind] for files in episodes] for kind in ("data", "video")]
    resumed = mode.startswith("resumed")
    if small_files:
        assert len(set(data_files)) == len(LENGTHS)
        assert 1 < len(set(video_files)) < len(LENGTHS)
    else:
        assert data_files == video_files == [(0, 0)] * 3 + [(0, 1 if resumed else 0)] * 2
    for path in sorted(root.glob("videos/*/*/*.mp4")):
        timing = _video_timing(path)
        assert timing["time_base"] * timing["pts_steps"][0] == pytest.approx(1 / FPS), (path, timing)
        assert (timing["first_pts"], len(timing["pts_steps"]), timing["b_frames"]) == (0, 1, False), (path, timing)
    if mode == "streaming" and not small_files:  # the same timing as the PNG path's, which writes the same files
        for camera in MARKED_CAMERAS:
            path = f"videos/{camera}/chunk-000/file-000.mp4"
            assert _video_timing(root / path) == _video_timing(lerobot_written("h264", False) / path), path
    ours = _ours(root, MARKED_WINDOWS)
    _assert_same_samples(ours, _lerobot(root, MARKED_WINDOWS), frame_check=_same_decode)
    _assert_marked_frames(ours)


@needs_lerobot_04
def test_a_frame_lerobots_streaming_encoder_drops_shifts_the_episode_in_lerobot_and_is_refused_here(
    tmp_path: Path,
) -> None:
    """``streaming_encoding`` drops a frame where a camera's encoder queue stays full for 0.1 s (a slow encoder; it
    warns and records on, LeRobot 0.4.4-0.6.1): that camera's video holds a frame fewer than the episode's rows, and
    the episodes' from/to timestamps follow the video. Episode 1's frame 10 of one camera dropped through LeRobot's
    own ``queue.Full`` path: LeRobot gives rows 10-28 frames 11-29 and the last row episode 2's first frame, without
    a word; this refuses the episode when the iterator is built (its rows overrun its part of the file into the next
    episode's), naming the dropped frame as a cause. The other episodes read as LeRobot's."""
    if not _writer_has("streaming_encoding"):
        pytest.skip("this LeRobot's writer has no streaming_encoding")
    import queue

    import pyarrow.parquet as pq
    from lerobot.datasets import video_utils
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from lerobot_dali.errors import FrameTimestampError

    camera, dropped_at = MARKED_CAMERAS[0], LENGTHS[0] + 10  # (episode 1's frame 10: the camera's frame 22 fed)
    feed_frame, fed = video_utils.StreamingVideoEncoder.feed_frame, []

    def full(*args: Any, **kwargs: Any) -> None:
        raise queue.Full

    def feed_once_full(self: Any, video_key: str, image: np.ndarray) -> None:
        fed.append(video_key)
        if video_key != camera or fed.count(camera) != dropped_at + 1:
            return feed_frame(self, video_key, image)
        self._frame_queues[video_key].put = full
        try:
            return feed_frame(self, video_key, image)
        finally:
            del self._frame_queues[video_key].put

    root = tmp_path / "dropped"
    dataset = LeRobotDataset.create(
        f"local/{root.name}", fps=FPS, features=_marked_features("h264"), root=root, **_encoder("h264"),
        streaming_encoding=True,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(video_utils.StreamingVideoEncoder, "feed_frame", feed_once_full)
        _record(dataset, range(len(LENGTHS)))
    dataset.finalize()
    (episodes_file,) = root.glob("meta/episodes/*/*.parquet")
    episodes = sorted(pq.read_table(episodes_file).to_pylist(), key=lambda row: row["episode_index"])

    def frames_in_file(key: str) -> list[int]:
        """Each episode's part of camera ``key``'s video file, in frames (its to - from timestamp, times fps)."""
        video = f"videos/{key}"
        return [round((row[f"{video}/to_timestamp"] - row[f"{video}/from_timestamp"]) * FPS) for row in episodes]

    assert [frames_in_file(key) for key in MARKED_CAMERAS] == [[12, 29, 7, 25, 16], LENGTHS]

    theirs = _lerobot(root, {})
    first = LENGTHS[0]
    markers = []
    for position in range(first, first + LENGTHS[1]):
        image = (theirs[position][camera].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        marker = read_full_marker(image)
        markers.append((marker.episode_index, marker.frame_index))
    assert markers == [(1, f) for f in range(10)] + [(1, f) for f in range(11, 30)] + [(2, 0)]
    # (refused when built: episode 1's 30 rows overrun its 29 frames, the next episode's part, by the metadata)
    said = rf"camera '{camera}': episode 1's rows run past its part of .* so its last row would read that episode's"
    with pytest.raises(FrameTimestampError, match=f"{said} frames. The video holds fewer frames for the episode than"):
        _ours(root, {})
    others = [0, 2, 3, 4]
    ours = _ours(root, MARKED_WINDOWS, episodes=others)
    _assert_same_samples(ours, _lerobot(root, MARKED_WINDOWS, episodes=others), frame_check=_same_decode)
    _assert_marked_frames(ours)


@needs_lerobot_04
def test_lerobots_batch_encoding_fails_recording_a_new_dataset(tmp_path: Path) -> None:
    """``batch_encoding_size=3`` (videos encoded every 3 episodes, the rest at finalize) does not record in LeRobot
    0.4-0.6.1: saving episode 2 encodes the batch, which reads the episodes' metadata before any is written
    (``meta.episodes`` is None: TypeError; LeRobot issues #2404, #2509, #2836; PR #4359, open, fixes it). Pinned:
    where a LeRobot records it, this fails, to become a parity test like the others."""
    if not _writer_has("batch_encoding_size"):
        pytest.skip("this LeRobot's writer has no batch_encoding_size")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "batch3"
    dataset = LeRobotDataset.create(
        f"local/{root.name}", fps=FPS, features=_marked_features("h264"), root=root, **_encoder("h264"),
        batch_encoding_size=3,
    )  # fmt: skip
    with pytest.raises(TypeError, match="'NoneType' object is not subscriptable"):
        _record(dataset, range(len(LENGTHS)))
    assert dataset.meta.total_episodes == 3 and not list(root.glob("videos/**/*.mp4"))


@needs_lerobot_04
def test_tasks_changing_within_episodes_match_lerobot(tmp_path: Path) -> None:
    """LeRobot's writer takes a task per frame: four tasks, each episode's changing every 3 frames; every sample's
    task and task_index as LeRobot's, over the whole dataset and an unsorted split."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "tasks"
    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (3,), "names": None},
    }
    dataset = LeRobotDataset.create("local/tasks", fps=10, features=features, root=root, use_videos=False)
    tasks = ["pick", "place", "push", "wipe"]
    for episode, length in enumerate([6, 9, 4]):
        for frame in range(length):
            value = episode * 100 + frame
            row = {"observation.state": np.full(2, value, np.float32), "action": np.full(3, -value, np.float32)}
            dataset.add_frame({**row, "task": tasks[(episode + frame // 3) % 4]})
        dataset.save_episode()
    dataset.finalize()
    windows = {"action": [k / 10 for k in range(-1, 5)]}
    for episodes, count in ((None, 19), ([2, 0], 10)):
        theirs = _lerobot(root, windows, episodes=episodes)
        ours = _ours(root, windows, episodes=episodes)
        assert len(ours) == count and {theirs[i]["task"] for i in range(len(theirs))} == set(tasks)
        _assert_same_samples(ours, theirs, frame_check=_same_decode)


@needs_lerobot_04
def test_every_feature_dtype_lerobot_writes_matches_lerobot(tmp_path: Path) -> None:
    """bool, int32, int64, float64 and string features, ``(1,)``-shaped columns LeRobot stores as scalars, and
    windows over them."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "dtypes"
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": ["a", "b", "c", "d", "e", "f"]},
        "observation.environment_state": {"dtype": "float64", "shape": (3,), "names": None},
        "action": {"dtype": "float32", "shape": (7,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "step_count": {"dtype": "int64", "shape": (1,), "names": None},
        "grip": {"dtype": "int32", "shape": (2,), "names": None},
        "language_instruction": {"dtype": "string", "shape": (1,), "names": None},
        MARKED_CAMERAS[0]: {"dtype": "video", "shape": (*MARKED_SIZE, 3), "names": ["height", "width", "channels"]},
    }
    dataset = LeRobotDataset.create("local/dtypes", fps=FPS, features=features, root=root, **_encoder("h264"))
    lengths = [5, 9, 3]
    for episode, length in enumerate(lengths):
        for frame in range(length):
            value = episode * 1000 + frame
            dataset.add_frame(
                {
                    "observation.state": np.full(6, value, np.float32),
                    "observation.environment_state": np.full(3, value / 7, np.float64),
                    "action": np.full(7, -value, np.float32),
                    "next.reward": np.array([value / 3], np.float32),
                    "next.done": np.array([frame == length - 1]),
                    "step_count": np.array([value], np.int64),
                    "grip": np.array([value, -value], np.int32),
                    "language_instruction": f"instruction {episode}-{frame}",
                    MARKED_CAMERAS[0]: draw_marker(episode, frame, *MARKED_SIZE),
                    "task": f"task {episode}",
                }
            )
        dataset.save_episode()
    dataset.finalize()
    windows = {
        MARKED_CAMERAS[0]: [-2 / FPS, 0.0],
        "action": [k / FPS for k in range(4)],
        "next.done": [0.0, 1 / FPS],
        "next.reward": [0.0, 1 / FPS],
        "step_count": [-1 / FPS, 0.0],
        "observation.environment_state": [-1 / FPS, 0.0],
    }
    for options in ({"num_workers": 0}, {"num_workers": 2}):
        _assert_same_samples(_ours(root, windows, **options), _lerobot(root, windows), frame_check=_same_decode)


def _annotate(root: Path) -> None:
    """Add ``language_persistent`` and ``language_events`` to ``root`` as ``lerobot-annotate`` does, its VLM modules
    replaced by rows staged here: its writer (one row group per episode, types pyarrow infers from the rows) and its
    info.json update (both features, dtype ``language``, and the ``say`` tool)."""
    from lerobot.annotations.steerable_pipeline.executor import Executor
    from lerobot.annotations.steerable_pipeline.reader import iter_episodes
    from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter, speech_atom

    staging_dir = root.parent / f"{root.name}_staging"
    records = list(iter_episodes(root))
    for record in records:
        episode, times = record.episode_index, record.frame_timestamps
        staging = EpisodeStaging(staging_dir, episode)
        staging.write("plan", [  # persistent: every row of the episode holds them all
            {"role": "assistant", "content": f"1. reach\n2. grasp é {episode}", "style": "plan", "timestamp": 0.0},
            {"role": "assistant", "content": "reach", "style": "subtask", "timestamp": times[1]},
            {"role": "assistant", "content": None, "style": "memory", "timestamp": round(times[-1], 3),
             "tool_calls": [{"type": "function", "function": {"name": "note", "arguments": {"n": episode}}}]},
        ])  # fmt: skip
        staging.write("interjections", [  # events: on the row at their time only
            {"role": "user", "content": "stop", "style": "interjection", "timestamp": times[2]},
            speech_atom(times[2], f"stopping {episode}"),
        ])  # fmt: skip
        staging.write("vqa", [
            {"role": "user", "content": "where?", "style": "vqa", "timestamp": times[-2], "camera": MARKED_CAMERAS[1]},
        ])  # fmt: skip
    LanguageColumnsWriter().write_all(records, staging_dir, root)
    Executor._ensure_annotation_metadata_in_info(root)


def _with_declared_language_types(root: Path) -> None:
    """Rewrite the language columns with the arrow types ``lerobot.datasets.language`` declares (float32
    timestamps, each tool call a ``pa.json_()`` text) in place of those the annotation writer lets pyarrow infer."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobot.datasets.io_utils import write_table_one_row_group_per_episode
    from lerobot.datasets.language import (
        LANGUAGE_EVENTS,
        LANGUAGE_PERSISTENT,
        language_events_arrow_type,
        language_persistent_arrow_type,
    )

    declared = {LANGUAGE_PERSISTENT: language_persistent_arrow_type(), LANGUAGE_EVENTS: language_events_arrow_type()}
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        for name, kind in declared.items():
            as_texts = [
                [{**row, "tool_calls": row["tool_calls"] and list(map(json.dumps, row["tool_calls"]))} for row in rows]
                for rows in table[name].to_pylist()
            ]
            text_type = pa.struct(
                [f.with_type(pa.list_(pa.string())) if f.name == "tool_calls" else f for f in kind.value_type]
            )
            column = pa.array(as_texts, pa.list_(text_type)).cast(kind)
            table = table.set_column(table.column_names.index(name), name, column)
        write_table_one_row_group_per_episode(table, path)


@pytest.mark.skipif((_installed_lerobot() or (0, 0)) < (0, 6), reason="LeRobot's language columns are new in 0.6")
@pytest.mark.parametrize("types", ["inferred", "declared"])
def test_language_annotations_lerobots_pipeline_writes_match_lerobot(lerobot_written, copy_ds, types: str) -> None:
    """Each sample's ``language_persistent`` and ``language_events`` (lists of dicts: strings, None, float
    timestamps, tool calls) as LeRobot gives them, every value of the same Python type, beside windows on the
    other keys; stored as LeRobot's annotation writer stores them (types pyarrow infers: double timestamps, tool
    calls as structs) or with the types LeRobot declares (tool calls as JSON texts, which LeRobot parses).
    LeRobot stacks windowed values as tensors, so it cannot window the language columns (a TypeError);
    lerobot-dali windows them as lists, as it does strings. info.json's new ``tools`` is metadata that LeRobot's
    samples do not carry: both ignore it (the samples' keys are compared)."""
    root = copy_ds(lerobot_written("images", True))  # data files of two episodes or fewer: the writer's per-file path
    _annotate(root)
    if types == "declared":
        _with_declared_language_types(root)
    theirs = _lerobot(root, MARKED_WINDOWS)
    assert {len(theirs[i]["language_events"]) for i in range(len(theirs))} == {0, 1, 2}
    _assert_same_samples(_ours(root, MARKED_WINDOWS), theirs, frame_check=_same_decode)

    window = {"language_events": [0.0, 1 / FPS]}
    with pytest.raises(TypeError, match="expected Tensor"):
        _lerobot(root, window)[0]
    rows = {int(sample["index"]): sample for sample in (theirs[i] for i in range(len(theirs)))}
    for index, sample in _ours(root, window).items():
        pad = index + 1 not in rows or rows[index + 1]["episode_index"] != sample["episode_index"]
        expected = [rows[index]["language_events"], rows[index if pad else index + 1]["language_events"]]
        assert _typed(sample["language_events"]) == _typed(expected), index
        assert sample["language_events_is_pad"].tolist() == [False, pad], index


@pytest.mark.skipif((_installed_lerobot() or (0, 0)) < (0, 6), reason="LeRobot writes depth cameras from 0.6")
@pytest.mark.parametrize("storage", ["video", "image"])
def test_a_depth_camera_lerobot_writes_matches_lerobot(tmp_path: Path, storage: str) -> None:
    """A depth camera written by LeRobot's writer (uint16 millimetres; a video by its default ``DepthEncoderConfig``:
    12-bit log codes in lossless HEVC ``gray12le``, or 16-bit PNGs in the data files), a window over it: every frame
    the float32 depth LeRobot's read gives, in millimetres and in metres, to the bit: from a video both dequantise
    the same lossless codes in float32 by torch, in the same order (metres are not rounded: a float64 path differs
    by up to 2.4e-6 m, measured); from images both divide the stored millimetres by a float32 1000."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    depth = "observation.images.depth"
    size = (24, 32)
    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        depth: {"dtype": storage, "shape": (*size, 1), "names": ["height", "width", "channels"],
                "info": {"is_depth_map": True}},
    }  # fmt: skip
    root = tmp_path / "depth"
    dataset = LeRobotDataset.create("local/depth", fps=FPS, features=features, root=root, use_videos=storage == "video")
    y, x = np.mgrid[0 : size[0], 0 : size[1]]
    written = []  # by index
    for episode, length in enumerate([5, 3]):
        for frame in range(length):
            written.append((20 + (episode * 997 + frame * 131 + y * 293 + x * 37) % 9980).astype(np.uint16))
            row = {"observation.state": np.full(2, frame, np.float32), depth: written[-1][..., None], "task": "look"}
            dataset.add_frame(row)
        dataset.save_episode()
    dataset.finalize()
    windows = {depth: [-1 / FPS, 0.0]}
    for unit, per_mm in (("mm", 1), ("m", 1e-3)):
        ours = _ours(root, windows, depth_unit=unit)
        _assert_same_samples(ours, _lerobot(root, windows, depth_output_unit=unit), frame_check=_exactly)
        for index, sample in ours.items():  # the frame written, to the quantiser's step (under 3 mm up to 10 m)
            assert sample[depth].shape == (2, 1, *size) and sample[depth].dtype == torch.float32
            assert np.abs(sample[depth][1, 0].numpy() / per_mm - written[index]).max() <= 3, (unit, index)


@needs_lerobot_04
def test_lerobot_written_hevc_with_open_gops_gives_the_right_frames(lerobot_written) -> None:
    """LeRobot writes HEVC with libx265's open GOPs: leading pictures display before their keyframe. Measured
    with LeRobot 0.4.4 and torchcodec 0.17, ``LeRobotDataset`` itself fails on such a file (query 0.0333 s
    loads the frame at 0.0667 s, a FrameTimestampError), so only the frames' markers are checked here."""
    root = lerobot_written("hevc", True)
    _assert_marked_frames(_ours(root, MARKED_WINDOWS))
    _assert_marked_frames(
        _ours(root, MARKED_WINDOWS, num_workers=2, cpu_decode=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    )


# -- LeRobot's own policies on lerobot-dali batches ----------------------------------------------------------
TINY_POLICIES = {
    "act": {
        "chunk_size": 8, "n_action_steps": 8, "dim_model": 64, "n_heads": 4, "dim_feedforward": 128,
        "n_encoder_layers": 1, "n_decoder_layers": 1, "use_vae": False, "pretrained_backbone_weights": None,
    },
    "diffusion": {
        "n_obs_steps": 2, "horizon": 8, "n_action_steps": 4, "crop_shape": None, "pretrained_backbone_weights": None,
        "down_dims": [32, 64], "num_train_timesteps": 10, "use_group_norm": True,
    },
}  # fmt: skip


@needs_lerobot_04
@pytest.mark.parametrize("policy_type", sorted(TINY_POLICIES))
def test_a_lerobot_policy_gets_the_same_loss_from_both_loaders(lerobot_written, policy_type: str) -> None:
    """The drop-in claim, end to end: LeRobot's preprocessor and policy take a lerobot-dali batch as they take a
    ``DataLoader(LeRobotDataset)`` batch of the same samples, and compute the same loss."""
    from pipelines.lerobot_policy import PolicyTrainOptions, build_policy, dataset_metadata

    root = lerobot_written("h264", False)
    options = PolicyTrainOptions(dataset=str(root), policy=policy_type, policy_args=TINY_POLICIES[policy_type])
    metadata = dataset_metadata(options.dataset)
    policy, preprocessor, windows = build_policy(options, metadata, "cpu")
    it = DALILeRobotIterator(str(root), batch_size=8, shuffle=False, device="cpu", delta_timestamps=windows)
    try:
        ours = next(iter(it))
    finally:
        it.close()
    theirs = next(iter(torch.utils.data.DataLoader(_lerobot(root, windows), batch_size=8, shuffle=False)))
    assert ours["index"].tolist() == theirs["index"].tolist()
    policy.eval()  # no dropout; the diffusion policy's noise and timesteps come from the seed below
    losses = []
    for batch in (ours, theirs):
        torch.manual_seed(0)
        losses.append(policy.forward(preprocessor(dict(batch)))[0].item())
    assert np.isfinite(losses[0]) and losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7)


@needs_lerobot_04
@pytest.mark.parametrize("policy_type", sorted(TINY_POLICIES))
def test_the_lerobot_policy_pipeline_trains_and_saves(
    lerobot_written, tmp_path: Path, policy_type: str, monkeypatch, caplog
) -> None:
    """Diffusion Policy's preset schedule (cosine with warm-up) runs too: ACT has none. As in LeRobot's train
    script, Diffusion Policy's samples leave out the last ``drop_n_last_frames`` frames of each episode. The first
    line says the batch and where in its epoch the run starts as train.py's does ('steps 0..3 of 4 samples' read as
    4 samples in all)."""
    import lerobot_dali
    from pipelines.lerobot_policy import PolicyTrainOptions, train

    built = []
    monkeypatch.setattr(
        lerobot_dali, "DALILeRobotIterator", lambda *a, **k: built.append(k) or DALILeRobotIterator(*a, **k)
    )
    options = PolicyTrainOptions(
        dataset=str(lerobot_written("libsvtav1", True)), policy=policy_type, policy_args=TINY_POLICIES[policy_type],
        steps=3, batch_size=4, num_workers=1, device="cpu", log_every=1, output_dir=tmp_path / "policy",
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lerobot_dali.pipelines.lerobot_policy"):
        losses = train(options)
    assert [k["drop_n_last_frames"] for k in built] == [7 if policy_type == "diffusion" else 0]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "policy").iterdir()}
    first = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rank 0/1: ")]
    assert len(first) == 1 and re.match(
        rf"rank 0/1: {policy_type} policy, steps 0\.\.3, batch 4, \d+ batches left in epoch 0, windows \{{", first[0]
    ), first


@needs_lerobot_04
def test_a_batch_larger_than_a_ranks_epoch_is_refused_before_the_lerobot_policy_pipeline_starts(
    lerobot_written, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As train.py's: a --batch-size within the dataset's frames (90) but past rank 1 of 2's share is refused once the
    iterator is built, naming the rank's samples (episodes dealt: 42 and 48 frames, each rank padded to 48), not at the
    first batch once DALI's workers had started."""
    from pipelines import lerobot_policy
    from pipelines.run_errors import SetupError

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("the pipeline was started")

    monkeypatch.setattr(lerobot_policy, "epoch_batches", started)
    monkeypatch.setattr(lerobot_policy, "data_rank", lambda accelerator: (1, 2))  # (rank 1 of 2, in this process)
    options = lerobot_policy.PolicyTrainOptions(
        dataset=str(lerobot_written("libsvtav1", True)), policy="act", policy_args=TINY_POLICIES["act"],
        steps=1, batch_size=49, num_workers=0, device="cpu",
    )  # fmt: skip
    with pytest.raises(SetupError, match=r"^rank 1 gets no full batch of 49 from an epoch of 48 samples; lower"):
        lerobot_policy.train(options)


@needs_lerobot_04
def test_the_lerobot_policy_pipeline_resumes_exactly(lerobot_written, tmp_path: Path) -> None:
    """Steps 3-4 after a resume at step 2 give the losses of an uninterrupted run: the stream position, the
    weights, the optimiser and the dropout's RNG all come back."""
    from pipelines.lerobot_policy import PolicyTrainOptions, train

    def run(steps: int, checkpoints: Path, **options: Any) -> list[float]:
        options = {"policy_args": TINY_POLICIES["act"], **options}
        return train(
            PolicyTrainOptions(
                dataset=str(lerobot_written("h264", False)), policy="act", steps=steps, batch_size=4, num_workers=1,
                device="cpu", checkpoint_dir=checkpoints, **options,
            )
        )  # fmt: skip

    uninterrupted = run(4, tmp_path / "a")
    assert run(2, tmp_path / "b", save_every=2) == uninterrupted[:2]
    assert run(4, tmp_path / "b", resume=True) == uninterrupted[2:]
    # The resolved config is compared: a field given at its default is the same policy (nothing left to train).
    assert run(4, tmp_path / "b", resume=True, policy_args={**TINY_POLICIES["act"], "n_obs_steps": 1}) == []
    from pipelines.run_errors import SetupError  # (one line under main, as the library's errors while setting up)

    with pytest.raises(SetupError, match=r"other policy\.dim_model \(policy\.dim_model: saved 64, now 32\): resume w"):
        train(
            PolicyTrainOptions(
                dataset=str(lerobot_written("h264", False)), policy="act",
                policy_args={**TINY_POLICIES["act"], "dim_model": 32}, steps=6, batch_size=4, num_workers=1,
                device="cpu", checkpoint_dir=tmp_path / "b", resume=True,
            )
        )  # fmt: skip


@needs_lerobot_04
def test_the_lerobot_policy_pipeline_with_lerobots_image_transforms_resumes_with_the_same_batches(
    lerobot_written, tmp_path: Path, monkeypatch
) -> None:
    """``image_transforms`` (--image-transforms: LeRobot's default ImageTransformsConfig, enabled) augments the
    batches the policy takes, as ``AugmentConfig.from_lerobot`` maps it; a resume at step 2 takes the uninterrupted
    run's batches 3-4 (the same augmented frames) and gives its losses; one without the transforms is refused, naming
    them."""
    import lerobot_dali
    from lerobot_dali.augment_config import AugmentConfig
    from pipelines import lerobot_policy
    from pipelines.run_errors import SetupError

    built: list[dict[str, Any]] = []
    monkeypatch.setattr(
        lerobot_dali, "DALILeRobotIterator", lambda *a, **k: built.append(k) or DALILeRobotIterator(*a, **k)
    )
    taken: list[dict[str, torch.Tensor]] = []
    epoch_batches = lerobot_policy.epoch_batches

    def recorded(iterator: Any) -> Any:
        for batch, wait_s in epoch_batches(iterator):
            taken.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
            yield batch, wait_s

    monkeypatch.setattr(lerobot_policy, "epoch_batches", recorded)

    def run(steps: int, checkpoints: Path, **options: Any) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
        taken.clear()
        losses = lerobot_policy.train(
            lerobot_policy.PolicyTrainOptions(
                dataset=str(lerobot_written("h264", False)), policy="act", policy_args=TINY_POLICIES["act"],
                steps=steps, batch_size=4, num_workers=1, device="cpu", checkpoint_dir=checkpoints,
                **{"image_transforms": True, **options},
            )
        )  # fmt: skip
        return losses, list(taken)

    _, plain = run(1, tmp_path / "plain", image_transforms=False)
    assert built[-1]["augment"] is None
    uninterrupted, batches = run(4, tmp_path / "a")
    defaults = lerobot_policy.lerobot_image_transforms_config()(enable=True)
    assert built[-1]["augment"] == AugmentConfig.from_lerobot(defaults) != AugmentConfig()
    cameras = [k for k in batches[0] if k.startswith("observation.images.")]
    assert cameras and torch.equal(batches[0]["index"], plain[0]["index"])
    assert all(not torch.equal(batches[0][k], plain[0][k]) for k in cameras)  # (the same frames, augmented)

    def assert_same(ours: list[dict[str, torch.Tensor]], theirs: list[dict[str, torch.Tensor]]) -> None:
        assert [sorted(b) for b in ours] == [sorted(b) for b in theirs]
        for step, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            for key in mine:
                assert torch.equal(mine[key], other[key]), (step, key)

    before, first = run(2, tmp_path / "b", save_every=2)
    assert before == uninterrupted[:2]
    assert_same(first, batches[:2])
    resumed, again = run(4, tmp_path / "b", resume=True)
    assert resumed == uninterrupted[2:]
    assert_same(again, batches[2:])
    refused = r"other augment \(augment: saved \{.*\}, now None\): resume with the same --policy, --policy-arg, --ima"
    with pytest.raises(SetupError, match=refused):
        run(6, tmp_path / "b", resume=True, image_transforms=False)


# -- the pipeline's run as a process: preemption, set-up errors -----------------------------------------------
POLICY_SCRIPT = Path(__file__).resolve().parents[1] / "pipelines" / "lerobot_policy.py"


def _policy_command(dataset: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """``python pipelines/lerobot_policy.py`` training the tiny ACT on ``dataset`` on the CPU as the tests' own
    :func:`train` calls do (the same threads: the losses match to the bit), and its environment."""
    policy_args = [f"--policy-arg={k}={json.dumps(v)}" for k, v in TINY_POLICIES["act"].items()]
    command = [sys.executable, str(POLICY_SCRIPT), "--dataset", str(dataset), "--policy", "act", *policy_args]
    command += ["--batch-size", "4", "--num-workers", "1", "--device", "cpu", *args]
    env = {**os.environ, "PYTHONPATH": str(POLICY_SCRIPT.parents[1]), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return command, env


@needs_lerobot_04
def test_the_lerobot_policy_pipeline_stops_on_sigterm_at_a_step_and_resumes_exactly(
    lerobot_written, tmp_path: Path
) -> None:
    """SIGTERM to the process group (as torchrun and SLURM send it: the DALI worker ends too) during training:
    lerobot_policy.py checkpoints at the next step boundary and exits with status 75, as train.py does; --resume then
    gives the uninterrupted run's losses and weights. It was killed there, having saved nothing since its last
    --save-every."""
    from safetensors.torch import load_file

    from pipelines.lerobot_policy import PolicyTrainOptions, train
    from tests.test_train_pipeline import _preempted_at, _run_until_signalled

    dataset = lerobot_written("h264", False)
    steps = 8

    def run(checkpoints: Path, **options: Any) -> list[float]:
        return train(
            PolicyTrainOptions(
                dataset=str(dataset), policy="act", policy_args=TINY_POLICIES["act"], steps=steps, batch_size=4,
                num_workers=1, device="cpu", checkpoint_dir=checkpoints, **options,
            )
        )  # fmt: skip

    uninterrupted = run(tmp_path / "a")
    ckpt = tmp_path / "b"
    command, env = _policy_command(dataset, "--steps", str(steps), "--checkpoint-dir", str(ckpt), "--log-every", "1")
    command += ["--output-dir", str(tmp_path / "policy")]
    status, log = _run_until_signalled(
        command, env, after="step 2 epoch", send=lambda p: os.killpg(p.pid, signal.SIGTERM)
    )
    assert status == 75, log[-30000:]
    assert "Traceback" not in log, log[-30000:]
    step = _preempted_at(log, ckpt, "SIGTERM")
    assert 2 <= step < steps
    assert not (tmp_path / "policy").exists()  # (not the trained policy: the resumed run saves that)
    assert run(ckpt, resume=True) == uninterrupted[step:]
    ours, theirs = (load_file(c / f"step_{steps:08d}" / "state" / "model.safetensors") for c in (ckpt, tmp_path / "a"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@needs_lerobot_04
def test_the_lerobot_policy_pipelines_dataset_errors_while_setting_up_are_one_line(
    make_ds, copy_ds, tmp_path: Path
) -> None:
    """A data file missing, a checkpoint of other episodes (a resume over another dataset): each printed a traceback
    ending in lerobot-dali's message (exit status 1). Now that message is one line, exit status 2, as train.py's. So is
    a --cameras key the dataset lacks, train.py's line: LeRobot built the policy without a camera first, and refused it
    in a traceback ('You must provide at least one image or the environment state among the inputs')."""
    from pipelines.lerobot_policy import PolicyTrainOptions, train

    spec = {"codec": "h264", "gop": 30, "cameras": 1, "size": (64, 96), "version": DATASET_VERSION}
    dataset = make_ds(episodes=3, frames_per_episode=LENGTHS[:3], **spec)
    damaged = copy_ds(dataset)
    (damaged / "data/chunk-000/file-001.parquet").unlink()
    ckpt = tmp_path / "ckpt"
    options = {"policy_args": TINY_POLICIES["act"], "batch_size": 4, "num_workers": 0, "device": "cpu"}
    train(PolicyTrainOptions(dataset=str(dataset), policy="act", steps=1, checkpoint_dir=ckpt, **options))
    other = make_ds(episodes=2, frames_per_episode=LENGTHS[:2], **spec)
    cases = [
        (damaged, [], r".*/data/chunk-000/file-001\.parquet is missing: meta/episodes places episodes there, .*"),
        (other, ["--checkpoint-dir", str(ckpt), "--resume"],
         r"ResumeStateError: this stream state was saved over other episodes \(3 episodes, .*\) than this iterator "
         r"reads \(2 episodes.*"),
        (dataset, ["--cameras", "observation.images.top"],
         r"--cameras: unknown camera\(s\) \['observation\.images\.top'\]; this dataset declares \['observation\."
         r"images\..*"),
    ]  # fmt: skip
    for data, args, message in cases:
        command, env = _policy_command(data, "--steps", "2", *args)
        result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
        assert result.returncode == 2, result.stderr[-30000:]
        assert "Traceback" not in result.stderr, result.stderr[-30000:]
        last = result.stderr.strip().splitlines()[-1]
        pattern = r"\d\d:\d\d:\d\d rank0 lerobot_dali\.pipelines\.lerobot_policy: lerobot_policy\.py: " + message
        assert re.fullmatch(pattern, last), last


def test_an_iterator_kept_to_the_exit_beside_lerobot_ends_silently(make_ds) -> None:
    """Beside LeRobot (its ``dill`` holds ``__main__`` past the package's own modules as the interpreter ends), an
    iterator a script kept, closed or not, ran its ``__del__`` against emptied modules: "Exception ignored in
    DALILeRobotIterator.__del__ ... TypeError: 'NoneType' object is not callable" at every exit (1 of 1)."""
    root = make_ds(episodes=2, frames_per_episode=8, cameras=1, codec="vp9")
    script = (
        "import lerobot.datasets.lerobot_dataset\n"
        "from lerobot_dali import DALILeRobotIterator\n"
        f"it = DALILeRobotIterator({str(root)!r}, batch_size=2, device='cpu')\n"
        "print(len(next(iter(it))['index']))\n"
        "it.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(POLICY_SCRIPT.parents[1])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "2\n", "")


# -- datasets LeRobot's editing tools write (lerobot.datasets.dataset_tools, LeRobot >= 0.6) ------------------
def _dataset_tools() -> Any:
    """LeRobot's dataset editing tools (``lerobot-edit-dataset``'s), where this LeRobot ships them."""
    if (_installed_lerobot() or (0, 0)) < (0, 6):
        pytest.skip("LeRobot's dataset_tools as tested here are LeRobot 0.6's")
    try:
        from lerobot.datasets import dataset_tools
    except ImportError as e:
        pytest.skip(f"LeRobot's dataset_tools do not import here ({e})")
    return dataset_tools


def _loaded(root: Path) -> Any:
    """``root`` as the editing tools take a dataset: a ``LeRobotDataset`` without windows."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{root.name}", root=root)


def _assert_edit_matches(root: Path, source_episodes: Sequence[int], windows: Mapping[str, Sequence[float]]) -> None:
    """Every sample of the edited dataset at ``root`` as LeRobot's, and every frame the one written for its row:
    ``source_episodes[e]`` is the episode of ``lerobot_written``'s that the edited dataset's episode ``e`` was."""
    ours = _ours(root, windows)
    theirs = _lerobot(root, windows)
    assert len(ours) == len(theirs) == sum(LENGTHS[e] for e in source_episodes)
    assert sorted({int(s["episode_index"]) for s in ours.values()}) == list(range(len(source_episodes)))
    _assert_same_samples(ours, theirs, frame_check=_same_decode)
    _assert_marked_frames(ours, source_episodes, windows)


@pytest.mark.parametrize(
    ("vcodec", "split"),
    [("h264", False), ("h264", True), ("images", False)],
    ids=["reencoded_shared_files", "files_copied_with_gaps", "images"],
)
def test_a_dataset_lerobots_delete_episodes_writes_matches_lerobot(
    lerobot_written, tmp_path: Path, vcodec: str, split: bool
) -> None:
    """``delete_episodes``: where a file holds kept and deleted episodes, it re-encodes the kept ones' frames into
    a new file (new from/to timestamps); a file holding kept episodes only is copied under its old file index,
    leaving the deleted episodes' file indices unused; the rows are renumbered (episode_index, index)."""
    tools = _dataset_tools()
    out = tmp_path / "deleted"
    tools.delete_episodes(_loaded(lerobot_written(vcodec, split)), episode_indices=[1, 3], output_dir=out)
    _assert_edit_matches(out, [0, 2, 4], MARKED_WINDOWS)


def test_datasets_lerobots_split_dataset_writes_match_lerobot(lerobot_written, tmp_path: Path) -> None:
    """``split_dataset`` of episodes sharing their files: each split re-encodes its own episodes' frames."""
    tools = _dataset_tools()
    splits = {"train": [0, 2, 3], "val": [4, 1]}
    tools.split_dataset(_loaded(lerobot_written("h264", False)), splits=splits, output_dir=tmp_path / "splits")
    for name, episodes in splits.items():
        _assert_edit_matches(tmp_path / "splits" / name, sorted(episodes), MARKED_WINDOWS)


@pytest.mark.parametrize("concatenate", [True, False], ids=["concatenated", "file_per_source_file"])
def test_a_dataset_lerobots_merge_datasets_writes_matches_lerobot(
    lerobot_written, tmp_path: Path, concatenate: bool
) -> None:
    """``merge_datasets`` (``aggregate_datasets``) of the shared-files and the file-per-episode datasets: the
    second's episodes follow the first's, packed into the first's files or kept a file per source file."""
    tools = _dataset_tools()
    sources = [_loaded(lerobot_written("h264", split)) for split in (False, True)]
    out = tmp_path / "merged"
    tools.merge_datasets(
        sources, output_repo_id="local/merged", output_dir=out,
        concatenate_videos=concatenate, concatenate_data=concatenate,
    )  # fmt: skip
    _assert_edit_matches(out, [*range(5), *range(5)], MARKED_WINDOWS)


def test_a_dataset_lerobots_modify_features_writes_matches_lerobot(lerobot_written, tmp_path: Path) -> None:
    """``modify_features``: a float32 reward and an int64 per-frame count added (from an array and from a function
    of each row), a camera removed; windows over the added features."""
    tools = _dataset_tools()
    source = _loaded(lerobot_written("h264", True))
    rewards = np.arange(sum(LENGTHS), dtype=np.float32)[:, None] / 4

    def count(row: dict[str, Any], episode: int, frame: int) -> int:
        return episode * 100 + frame

    out = tmp_path / "modified"
    tools.modify_features(
        source,
        add_features={
            "next.reward": (rewards, {"dtype": "float32", "shape": (1,), "names": None}),
            "count": (count, {"dtype": "int64", "shape": (1,), "names": None}),
        },
        remove_features=[MARKED_CAMERAS[1]],
        output_dir=out,
    )
    windows = {**MARKED_WINDOWS, "next.reward": [0.0, 1 / FPS], "count": [-1 / FPS, 0.0]}
    info = json.loads((out / "meta/info.json").read_text())
    assert MARKED_CAMERAS[1] not in info["features"] and "count" in info["features"]
    _assert_edit_matches(out, range(5), windows)


def test_a_dataset_lerobots_modify_tasks_rewrites_matches_lerobot(lerobot_written, copy_ds) -> None:
    """``modify_tasks`` rewrites a dataset in place: a task renamed, one episode's task replaced by a new one."""
    tools = _dataset_tools()
    root = copy_ds(lerobot_written("images", False))
    tools.modify_tasks(_loaded(root), episode_tasks={1: "a new task"}, task_replacements={"task 2": "task two"})
    ours, theirs = _ours(root, MARKED_WINDOWS), _lerobot(root, MARKED_WINDOWS)
    assert {s["task"] for s in ours.values()} == {"task 0", "a new task", "task 1", "task two"}  # (episode 4: task 1)
    _assert_same_samples(ours, theirs, frame_check=_same_decode)


def test_a_dataset_lerobots_image_to_video_conversion_writes_matches_lerobot(lerobot_written, tmp_path: Path) -> None:
    """``convert_image_to_video_dataset`` of the PNG dataset into h264 videos."""
    tools = _dataset_tools()  # (first: it skips below LeRobot 0.6, which has no lerobot.configs.video)
    from lerobot.configs.video import RGBEncoderConfig

    out = tmp_path / "videos"
    tools.convert_image_to_video_dataset(
        _loaded(lerobot_written("images", False)), output_dir=out, repo_id="local/videos",
        rgb_encoder=RGBEncoderConfig(vcodec="h264"), num_workers=1,
    )  # fmt: skip
    assert len(json.loads((out / "meta/info.json").read_text())["features"][MARKED_CAMERAS[0]]["shape"]) == 3
    assert list((out / "videos").rglob("*.mp4"))
    _assert_edit_matches(out, range(5), MARKED_WINDOWS)


def test_a_dataset_lerobots_reencode_dataset_rewrites_matches_lerobot(lerobot_written, copy_ds) -> None:
    """``reencode_dataset`` re-encodes every video in place (AV1 file per episode into HEVC with 4-frame GOPs)."""
    tools = _dataset_tools()  # (first: it skips below LeRobot 0.6, which has no lerobot.configs.video)
    from lerobot.configs.video import RGBEncoderConfig

    root = copy_ds(lerobot_written("libsvtav1", True))
    tools.reencode_dataset(_loaded(root), rgb_encoder=RGBEncoderConfig(vcodec="hevc", g=4))
    _assert_edit_matches(root, range(5), MARKED_WINDOWS)


#: Colour tags and pixel formats users' own videos have, beside what LeRobot's recorder writes (untagged BT.601,
#: limited range yuv420p): name -> (codec, pix_fmt, colour tags (space, primaries, transfer) or None, range).
COLOUR_CASES: dict[str, tuple[str, str, tuple[int, int, int] | None, int | None]] = {
    "untagged": ("h264", "yuv420p", None, None),
    "bt601-tagged": ("h264", "yuv420p", (6, 6, 6), 1),
    "bt709": ("h264", "yuv420p", (1, 1, 1), 1),
    "bt2020": ("h264", "yuv420p", (9, 9, 14), 1),
    "yuvj420p": ("h264", "yuvj420p", None, None),
    "full-range-tag": ("h264", "yuv420p", None, 2),
    "bt709-full-range": ("h264", "yuv420p", (1, 1, 1), 2),
    "yuv444p": ("h264", "yuv444p", None, None),
    "bt709-yuv444p": ("h264", "yuv444p", (1, 1, 1), 1),
    "h264-gray": ("h264", "gray", None, None),
    "hevc-gray": ("hevc", "gray", None, None),
    "hevc-10bit": ("hevc", "yuv420p10le", None, None),
    "hevc-10bit-bt2020": ("hevc", "yuv420p10le", (9, 9, 14), 1),
    "av1-10bit": ("av1", "yuv420p10le", None, None),
    "av1-bt709": ("av1", "yuv420p", (1, 1, 1), 1),
}
#: Saturated bars over the bottom rows of every frame, where a colour matrix or range misread shows most.
_BARS = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (250, 200, 20), (20, 200, 250), (200, 30, 160)], np.uint8)
_COLOUR_GOP = {"h264": 30, "hevc": 8, "av1": 2}


def _recoloured(root: Path, case: str, *, untagged: bool = False, sample_aspect_ratio: Fraction | None = None) -> Path:
    """``root`` (a writable dataset) with each video re-encoded as ``COLOUR_CASES[case]`` says (``untagged``: without
    its colour tags, its range kept), each frame at its own timestamp, saturated bars over its bottom rows
    (``video.pix_fmt`` and ``video.codec`` in info.json follow)."""
    from lerobot_dali.video_encoding import encoder_settings

    codec, pix_fmt, tags, color_range = COLOUR_CASES[case]
    tags = None if untagged else tags
    videos = sorted((root / "videos").rglob("*.mp4"))
    for path in videos:
        with av.open(str(path)) as source:
            stream = source.streams.video[0]
            fps = int(stream.base_rate)
            frames = [(round(f.time * fps), f.to_ndarray(format="rgb24")) for f in source.decode(stream)]
        settings = encoder_settings(codec, gop=_COLOUR_GOP[codec])
        with av.open(str(path), "w", format="mp4") as out:
            stream = out.add_stream(settings.encoder, rate=fps)
            stream.width, stream.height, stream.pix_fmt = frames[0][1].shape[1], frames[0][1].shape[0], pix_fmt
            context = stream.codec_context
            context.time_base = Fraction(1, fps)
            if tags is not None:
                context.colorspace, context.color_primaries, context.color_trc = tags
            if color_range is not None:
                context.color_range = color_range
            if sample_aspect_ratio is not None:
                context.sample_aspect_ratio = sample_aspect_ratio
            stream.options = dict(settings.options)
            for pts, rgb in frames:
                width = rgb.shape[1]
                for bar in range(len(_BARS)):
                    rgb[-24:, bar * width // 6 : (bar + 1) * width // 6] = _BARS[(bar + pts // 3) % len(_BARS)]
                frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pix_fmt)
                if tags is not None:
                    frame.colorspace = tags[0]
                if color_range is not None:
                    frame.color_range = color_range
                frame.pts, frame.time_base = pts, Fraction(1, fps)
                out.mux(stream.encode(frame))
            out.mux(stream.encode(None))
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    with av.open(str(videos[0])) as container:
        context = container.streams.video[0].codec_context
        for feature in info["features"].values():
            if feature.get("dtype") == "video":
                feature["info"].update({"video.codec": context.codec.canonical_name, "video.pix_fmt": context.pix_fmt})
    info_path.write_text(json.dumps(info, indent=4))
    return root


def _colour_ds(make_ds, copy_ds, case: str, size: tuple[int, int] = (96, 128), **options: Any) -> Path:
    """A copy of the generated H.264 set of frames ``size`` (``copy_ds``'s, named for the case) recoloured as
    ``case``."""
    source = make_ds(
        codec="h264", gop=30, episodes=5, frames_per_episode=LENGTHS, cameras=2, version=DATASET_VERSION, size=size
    )
    root = copy_ds(source, f"{case}{'-untagged' if options.get('untagged') else ''}")
    return _recoloured(root, case, **options)


def _pyav_route(**options: Any) -> dict[str, Any]:
    return {"cpu_decode": CpuDecodeOptions(backend=CpuDecoderBackend.PYAV), **options}


#: LeRobot's ``video_backend="pyav"`` decodes with PyAV itself from 0.5; 0.4's is torchvision's ``VideoReader``,
#: which torchvision 0.28 (what LeRobot 0.4.4 installs with torch 2.13) no longer has.
needs_lerobots_pyav_decoder = pytest.mark.skipif(
    (_installed_lerobot() or (0, 0)) < (0, 5), reason="LeRobot's pyav backend decodes with PyAV from 0.5"
)
#: Where torchcodec (LeRobot's default backend) and PyAV's ``to_ndarray("rgb24")`` (LeRobot's pyav backend and
#: lerobot-dali's PyAV route) part: 10-bit 4:2:0 goes through swscale's scaler, torchcodec's with ``SWS_BICUBIC``,
#: PyAV's with ``SWS_BILINEAR``, and their chroma upsampling differs at colour edges.
TEN_BIT_CASES = ("hevc-10bit", "hevc-10bit-bt2020", "av1-10bit")


@pytest.mark.parametrize("case", sorted(COLOUR_CASES))
def test_colour_tags_ranges_and_pixel_formats_match_lerobot(make_ds, copy_ds, case: str) -> None:
    """A camera tagged BT.709 or BT.2020, full range, 4:4:4, grey, 10-bit HEVC or AV1: every sample as LeRobot's
    (its default decoder, torchcodec, converting by the stream's tags as swscale does), on lerobot-dali's default
    CPU route and, but for 10-bit (``TEN_BIT_CASES``), on its PyAV route too. 0 levels apart with LeRobot 0.6.1."""
    root = _colour_ds(make_ds, copy_ds, case)
    theirs = _lerobot(root, WINDOWS)
    _assert_same_samples(_ours(root, WINDOWS), theirs, frame_check=_same_decode)
    if case not in TEN_BIT_CASES:
        _assert_same_samples(_ours(root, WINDOWS, **_pyav_route()), theirs, frame_check=_same_decode)


@pytest.mark.parametrize("case", ["untagged", "bt709", "yuvj420p"])
def test_a_width_torchcodec_converts_with_ffmpegs_filter_graph_matches_lerobot(make_ds, copy_ds, case) -> None:
    """torchcodec converts frames whose width is no multiple of 32 (a RealSense's 848 or 424) with FFmpeg's filter
    graph, not swscale directly: 144 wide, every sample as LeRobot's on both routes (0 levels apart, LeRobot 0.6.1)."""
    root = _colour_ds(make_ds, copy_ds, case, size=(96, 144))
    theirs = _lerobot(root, WINDOWS)
    assert theirs[0]["observation.images.cam1"].shape == (3, 96, 144)
    _assert_same_samples(_ours(root, WINDOWS), theirs, frame_check=_same_decode)
    _assert_same_samples(_ours(root, WINDOWS, **_pyav_route()), theirs, frame_check=_same_decode)


def test_a_non_square_sample_aspect_ratio_is_ignored_as_by_lerobot(make_ds, copy_ds) -> None:
    """Pixels 2:1 wide (the H.264 VUI's aspect ratio): every route and LeRobot give the stored 96x128 frames."""
    root = _colour_ds(make_ds, copy_ds, "untagged", sample_aspect_ratio=Fraction(2, 1))
    with av.open(str(next((root / "videos").rglob("*.mp4")))) as container:
        assert container.streams.video[0].codec_context.sample_aspect_ratio == Fraction(2, 1)
    theirs = _lerobot(root, WINDOWS)
    assert theirs[0]["observation.images.cam1"].shape == (3, 96, 128)
    _assert_same_samples(_ours(root, WINDOWS), theirs, frame_check=_same_decode)
    _assert_same_samples(_ours(root, WINDOWS, **_pyav_route()), theirs, frame_check=_same_decode)


def _max_levels(ours: dict[Any, dict[str, Any]], theirs: Any) -> float:
    """The largest difference, in levels, between any frame of ours and LeRobot's."""
    return max(
        (ours[_sample_key(sample)][key] - sample[key]).abs().max().item() * 255
        for sample in (theirs[i] for i in range(len(theirs)))
        for key in theirs.meta.video_keys
    )


@needs_lerobots_pyav_decoder
@pytest.mark.parametrize("case", ["bt709", "bt2020", "bt709-full-range", "bt709-yuv444p", "av1-bt709"])
def test_lerobots_pyav_backend_converts_bt709_and_bt2020_as_bt601(make_ds, copy_ds, case: str) -> None:
    """LeRobot's ``video_backend="pyav"`` takes PyAV's ``to_ndarray("rgb24")``, which in PyAV 15 (what LeRobot 0.5+
    pins) converts every stream as BT.601 whatever its colour tags: its frames are those of the same video untagged
    (28-30 levels off on saturated colours), where lerobot-dali gives the tagged colours on every route, as
    LeRobot's default decoder (torchcodec) does (test above). Pinned as a deliberate difference."""
    root, plain = _colour_ds(make_ds, copy_ds, case), _colour_ds(make_ds, copy_ds, case, untagged=True)
    theirs = _lerobot(root, WINDOWS, video_backend="pyav")
    for options in ({}, _pyav_route()):
        ours = _ours(root, WINDOWS, **options)
        assert _max_levels(ours, theirs) > 20
        _assert_same_samples(ours, _lerobot(root, WINDOWS), frame_check=_same_decode)
    _assert_same_samples(_ours(plain, WINDOWS, **_pyav_route()), theirs, frame_check=_same_decode)


@pytest.mark.parametrize("case", TEN_BIT_CASES)
def test_ten_bit_video_converts_as_each_of_lerobots_decoders_does(make_ds, copy_ds, case: str) -> None:
    """10-bit 4:2:0 (HEVC, AV1): lerobot-dali's default CPU route decodes with torchcodec where it loads, as LeRobot's
    default backend does, and gives its frames; its PyAV route gives PyAV's ``to_ndarray("rgb24")``, as LeRobot's pyav
    backend does. The two part at colour edges (torchcodec's swscale upsamples chroma bicubically, PyAV's bilinearly:
    up to 70-83 levels there, 0.7 on average, LeRobot 0.6.1): pinned, each side as LeRobot's decoder of its kind."""
    root = _colour_ds(make_ds, copy_ds, case)
    torchcodec_frames = _lerobot(root, WINDOWS)
    _assert_same_samples(_ours(root, WINDOWS), torchcodec_frames, frame_check=_same_decode)
    pyav_route = _ours(root, WINDOWS, **_pyav_route())
    assert _max_levels(pyav_route, torchcodec_frames) > 20
    untagged = COLOUR_CASES[case][2] is None  # (LeRobot's pyav backend converts BT.2020 as BT.601: test above)
    if untagged and (_installed_lerobot() or (0, 0)) >= (0, 5):  # (needs_lerobots_pyav_decoder)
        _assert_same_samples(pyav_route, _lerobot(root, WINDOWS, video_backend="pyav"), frame_check=_same_decode)


def test_a_turned_video_comes_as_stored_where_lerobots_torchcodec_turns_it(make_ds, copy_ds) -> None:
    """A phone's portrait recording (a quarter turn in the track header's display matrix): lerobot-dali gives the
    stored 96x128 picture on every route (README, CPU decoding); LeRobot's torchcodec turns it upright (128x96), its
    pyav backend (0.5+) does not. Pinned: LeRobot's torchcodec frames are ours turned."""
    from tests.test_cpu_decode import _TURNS, _turned

    root = _colour_ds(make_ds, copy_ds, "untagged")
    for path in sorted((root / "videos").rglob("*.mp4")):
        _turned(path, path, _TURNS["quarter"])
    theirs = _lerobot(root, WINDOWS)
    assert theirs[0]["observation.images.cam1"].shape == (3, 128, 96)

    def turned_back(sample: dict[str, Any]) -> dict[str, Any]:
        return {k: torch.rot90(v, 1, dims=(-2, -1)) if k in theirs.meta.video_keys else v for k, v in sample.items()}

    for options in ({}, _pyav_route()):
        ours = _ours(root, WINDOWS, **options)
        _assert_same_samples(ours, theirs, frame_check=_same_decode, expected_of=turned_back)
        if (_installed_lerobot() or (0, 0)) >= (0, 5):
            _assert_same_samples(ours, _lerobot(root, WINDOWS, video_backend="pyav"), frame_check=_same_decode)
