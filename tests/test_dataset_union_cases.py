"""``concat_datasets``: cases a mutation pass over :mod:`lerobot_dali.dataset_union` found untested, most on the two
datasets of :mod:`tests.test_dataset_union` (5 + 7 + 4 and 9 + 3 frames, v3.0 and v2.1, task seeds 0 and 1)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali import DALILeRobotIterator, concat_datasets, open_dataset
from lerobot_dali.dataset_info import Feature
from lerobot_dali.errors import RenameMapError, SchemaMismatchError, StatsError
from tests.http_server import serve_folder
from tests.test_dataset_union import _datasets, _rewritten
from tests.test_mixture import _keys, _marker


def test_the_unions_info_counts_every_datasets_episodes_frames_and_tasks_and_declares_dataset_index(make_ds) -> None:
    """The union's info.json (``union.info``) holds the totals of both datasets (3 + 2 episodes, 16 + 12 frames, 2 + 2
    tasks), and declares ``dataset_index`` as a scalar int64 feature (LeRobot's ``MultiLeRobotDataset`` gives one
    per sample), which batches to shape (B,) beside the other scalars."""
    union = concat_datasets(_datasets(make_ds))
    assert (union.info.total_episodes, union.info.total_frames, union.info.total_tasks) == (5, 28, 4)
    assert union.info.features["dataset_index"] == Feature("dataset_index", "int64", (1,))
    assert union.info.features["dataset_index"].is_scalar
    it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    batches = list(it)
    it.close()
    assert [tuple(batch["dataset_index"].shape) for batch in batches] == [(4,)] * 7
    assert [d for batch in batches for d in batch["dataset_index"].tolist()] == [0] * 16 + [1] * 12


def test_statistics_that_cannot_pool_for_another_reason_than_a_missing_count_add_no_advice(make_ds, copy_ds) -> None:
    """Where every dataset has mean, std and count but they do not pool (here the first's state mean holds 4 values,
    the second's 6), the refusal is the pooling's error alone: no "add what is lacking to the meta/stats.json of {}"
    naming no dataset."""
    first, second = _datasets(make_ds)
    first = copy_ds(first)
    stats = json.loads((first / "meta/stats.json").read_text())
    stats["observation.state"]["mean"] = stats["observation.state"]["mean"][:4]
    (first / "meta/stats.json").write_text(json.dumps(stats))
    union = concat_datasets([first, second])
    said = (
        r"^the union pools its datasets' statistics by frame count, and cannot: "
        rf"{re.escape(union.location.description)}: observation\.state: episodes disagree on the statistics' shape "
        r"\(mean: \[\(4,\), \(6,\)\]\)$"
    )
    with pytest.raises(StatsError, match=said):
        union.read_stats()


def test_a_row_of_a_dataset_the_union_holds_is_told_as_that_datasets_with_its_own_index(make_ds) -> None:
    """A row's task_index no list holds, in a dataset the union has: that dataset's error, naming its own data file and
    its own task_index (the union's 9 less the second dataset's task offset 2: 7); a subtask_index is not offset."""
    first, second = _datasets(make_ds)
    union = concat_datasets([first, second])
    assert union.task_offsets == (0, 2)
    said = str(union.unlisted_index_error("task", 9, 1, 1))
    assert said.startswith(
        f"{second}/data/chunk-000/episode_000001.parquet: episode 1's rows hold task_index 7, which is not in the "
        "dataset's task list (meta/tasks.jsonl, which holds task indices [0, 1])"
    ), said
    said = str(union.unlisted_index_error("subtask", 9, 1, 1))
    assert said.startswith(f"{second}/data/chunk-000/episode_000001.parquet: episode 1's rows hold subtask_index 9,")
    said = str(union.unlisted_index_error("task", 9, 1, 0))
    assert said.startswith(f"{first}/data/chunk-000/file-000.parquet: episode 1's rows hold task_index 9, which"), said


def test_a_rename_map_entry_for_a_camera_cameras_leaves_out_renames_nothing(make_ds) -> None:
    """cameras=[cam0] leaves the second dataset's cam1 unread: its map's entry for cam1 renames nothing, and is not
    refused as renaming a key the dataset does not read."""
    first, second = _datasets(make_ds, cameras=2)
    union = concat_datasets(
        [first, second],
        cameras=["observation.images.cam0"],
        rename_maps=[None, {"observation.images.cam1": "observation.images.side"}],
    )
    assert union.camera_keys == ["observation.images.cam0"]
    assert [member.camera_keys for member in union.members] == [["observation.images.cam0"]] * 2
    assert [dict(rename.to_batch) for rename in union.renames] == [{}, {}]
    # Without cameras=, a dataset given opened with cam0 alone does not read cam1: the entry is refused as such.
    opened = open_dataset(second, cameras=["observation.images.cam0"])
    said = r"renames \['observation\.images\.cam1'\], which it does not read; it reads \['observation\.images\.cam0',"
    with pytest.raises(RenameMapError, match=said):
        concat_datasets([first, opened], rename_maps=[None, {"observation.images.cam1": "observation.images.side"}])


def test_a_union_narrowed_to_cameras_alone_keeps_every_key(make_ds) -> None:
    """select(cameras=...) without keys= keeps every tabular key, dataset_index among them, in each dataset (the
    second's extra camera was left out when the union was built)."""
    union = concat_datasets(_datasets(make_ds, cameras=2)).select(cameras=["observation.images.cam0"])
    assert union.camera_keys == ["observation.images.cam0"]
    every = ["observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"]
    assert union.tabular_keys == [*every, "dataset_index"]
    assert [(m.camera_keys, m.tabular_keys) for m in union.members] == [(["observation.images.cam0"], every)] * 2


def test_a_unions_content_digest_is_its_datasets_in_their_order(make_ds) -> None:
    """A union's content_digest has its datasets' form (16 hex digits), is the same for the same datasets opened
    again, and changes with their order."""
    first, second = _datasets(make_ds)
    union = concat_datasets([first, second])
    digest = union.content_digest()
    assert re.fullmatch(r"[0-9a-f]{16}", digest) and re.fullmatch(r"[0-9a-f]{16}", union.members[0].content_digest())
    assert concat_datasets([first, second]).content_digest() == digest
    assert concat_datasets([second, first]).content_digest() != digest


def test_a_union_without_a_column_store_says_no_rows_are_stored(make_ds, tmp_path_factory) -> None:
    """Prefetching skips an episode's row groups only where a column store holds them: a union of local datasets
    (no stamps: no dataset holds the path) and one over HTTP without a column store hold none, for every episode."""
    paths = _datasets(make_ds)
    local = concat_datasets(paths)
    assert [local.rows_stored(local.data_path(pos), 4, 5) for pos in range(5)] == [False] * 5
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        remote = concat_datasets([f"{server.url}/{p.parent.name}/{p.name}" for p in paths])
        assert all(remote.data_path(pos) in remote.members[pos // 3].stamps for pos in range(5))
        assert [remote.rows_stored(remote.data_path(pos), 4, 5) for pos in range(5)] == [False] * 5
        # (each episode's data file stamped as its own dataset lists it)
        stamps = [remote.data_file_stamp(pos) for pos in range(5)]
        assert stamps == [remote.members[pos // 3].stamps[remote.data_path(pos)] for pos in range(5)]
        assert None not in stamps


def test_a_malformed_rename_map_of_a_dataset_given_opened_names_its_location(make_ds) -> None:
    """A dataset given as a reader is named by its path in the refusal of its map, as one given by path is, not by
    the reader's repr."""
    first, second = _datasets(make_ds)
    said = re.escape(f"{second}: rename_map has entries with an empty name, {{'action': ''}}: each gives")
    for given in (second, open_dataset(second)):
        with pytest.raises(ValueError, match=f"^{said}"):
            concat_datasets([first, given], rename_maps=[None, {"action": ""}])


def test_an_image_unions_frames_are_each_datasets_own(make_ds) -> None:
    """Cameras stored as images: every sample's frame is its own dataset's (the marker of its episode and frame)."""
    images = [
        make_ds(episodes=n, frames_per_episode=length, fps=10, image_cameras=True, size=(64, 64), seed=seed)
        for n, length, seed in ((2, 3, 0), (1, 4, 1))
    ]
    union = concat_datasets(images)
    assert [len(union.read_episode_images(pos, "observation.images.cam0")) for pos in range(3)] == [3, 3, 4]
    it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    frames = "observation.images.cam0"
    read = [(key, _marker(frame)) for batch in it for key, frame in zip(_keys(batch), batch[frames], strict=True)]
    it.close()
    expected = [(0, ep, f) for ep in range(2) for f in range(3)] + [(1, 0, f) for f in range(4)]
    assert read == [(key, (key[1], key[2], 0)) for key in expected]


def test_a_unions_undeclared_columns_are_each_episodes_own_datasets(make_ds, copy_ds) -> None:
    """A column the second dataset's data files hold and its info.json does not declare is that dataset's episodes'
    alone; every episode reads every declared key but where keys= left some out (the warning of such columns is then
    said at INFO)."""
    first, second = _datasets(make_ds)
    second = copy_ds(second)
    for path in sorted((second / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        pq.write_table(table.append_column("extra.gripper", pa.array([0.5] * table.num_rows, pa.float32())), path)
    union = concat_datasets([first, second])
    assert [union.undeclared_columns(pos) for pos in range(5)] == [[]] * 3 + [["extra.gripper"]] * 2
    assert [union.reads_every_key(pos) for pos in range(5)] == [True] * 5
    narrowed = concat_datasets([first, second], keys=["action"])
    assert [narrowed.reads_every_key(pos) for pos in range(5)] == [False] * 5


def test_a_data_file_lacking_a_declared_column_is_refused_before_the_first_batch_naming_its_dataset(
    make_ds, tmp_path
) -> None:
    """The second dataset's data files lack its declared 'action': the union refuses it when the iterator is built
    (as a dataset alone is), naming that dataset's file, not once an episode of it is read."""
    first, second = _datasets(make_ds)
    second = _rewritten(second, tmp_path / "no_action", lambda table: table.drop(["action"]))
    union = concat_datasets([first, second])
    said = rf"^{re.escape(str(second))}/data/chunk-000/episode_000000\.parquet.*'action'"
    with pytest.raises(SchemaMismatchError, match=said):
        union.check_data_columns()
    with pytest.raises(SchemaMismatchError, match=said):
        DALILeRobotIterator(union, batch_size=4, device="cpu", num_workers=0)


def test_a_union_of_more_than_three_datasets_names_three_and_a_digest_of_all(make_ds) -> None:
    """Past three datasets the description (which names the union's prefetch cache folder too) names the first three,
    the count and 8 hex digits of all of them, in their order."""
    first, second = _datasets(make_ds)
    union = concat_datasets([first, second, first, second])
    said = rf"^union of {re.escape(f'{first}, {second}, {first}')}, \.\.\. \(4 datasets, ([0-9a-f]{{8}})\)$"
    digest = re.fullmatch(said, union.location.description)
    assert digest is not None, union.location.description
    assert concat_datasets([first, second, first, first]).location.description != union.location.description
    assert concat_datasets([first, second]).location.description == f"union of {first}, {second}"
