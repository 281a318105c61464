"""meta/episodes whose data/chunk_index and data/file_index are stale: naming data files that do not exist, as
LeRobot's merge before 0.4.4 wrote them, or files that hold other rows, as its v2.1 -> v3.0 converter before 0.5.0
wrote them (LeRobot itself reads such datasets: it never uses these columns). Episodes are then located by the data
files' own episode_index column; what that cannot explain still fails, naming why."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali import episode_table
from lerobot_dali.episode_table import EpisodeTable
from lerobot_dali.errors import DatasetError, EpisodeMetadataError, MissingDataFileError
from lerobot_dali.iterator import DALILeRobotIterator

LENGTHS = [6, 9, 4, 8, 5]
SPEC = dict(episodes=5, frames_per_episode=LENGTHS, cameras=1, codec="vp9", gop=4, size=(64, 96), episodes_per_file=2)
WINDOWS = {"observation.images.cam0": [-0.1, 0.0], "action": [k / 10 for k in range(4)]}


def _samples(root: Path, **options) -> list[dict]:
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", drop_last=False, **options)
    try:
        return list(it)
    finally:
        it.close()


def _set_episode_columns(root: Path, **columns: list[int]) -> None:
    path = next((root / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    for name, values in columns.items():
        table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.int64()))
    pq.write_table(table, path)


def _episode_rows(table: pa.Table, episode: int) -> pa.Table:
    return table.filter(pc.equal(table["episode_index"], episode))


def _drop_rows(data_file: Path, keep) -> None:
    table = pq.read_table(data_file)
    pq.write_table(table.filter(keep(table)), data_file)


@pytest.fixture
def merged(make_ds, copy_ds) -> tuple[Path, Path]:
    """(original, a copy whose every episode names data/chunk-000/file-007.parquet, which does not exist)"""
    original = make_ds(**SPEC, fps=10)
    stale = copy_ds(original)
    _set_episode_columns(stale, **{"data/chunk_index": [0] * 5, "data/file_index": [7] * 5})
    return original, stale


@pytest.mark.parametrize("num_workers", [0, 2])
def test_episodes_are_found_by_the_data_files_when_their_file_indices_are_stale(merged, caplog, num_workers) -> None:
    original, stale = merged
    expected = _samples(original, delta_timestamps=WINDOWS)
    with caplog.at_level("WARNING", logger="lerobot_dali.episode_data_files"):
        got = _samples(stale, delta_timestamps=WINDOWS, num_workers=num_workers)
    assert len(got) == len(expected) == 8  # 32 samples, batches of 4
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert torch.equal(ours[key], value) if torch.is_tensor(value) else ours[key] == value, key
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "LeRobot's dataset merge before 0.4.4" in warnings[0]
    assert "(3 data file(s))" in warnings[0] and "file-007.parquet" in warnings[0]


def test_an_episode_subset_of_a_stale_merge_reads(merged) -> None:
    original, stale = merged
    got = _samples(stale, episodes=[1, 4], delta_timestamps=WINDOWS)
    expected = _samples(original, episodes=[1, 4], delta_timestamps=WINDOWS)
    assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in expected]
    assert all(torch.equal(a["action"], b["action"]) for a, b in zip(got, expected, strict=True))


def test_the_warning_names_three_missing_data_files_and_marks_more(merged, caplog) -> None:
    """The stale index's missing files are named, the first three of them ("..." past those)."""
    _, stale = merged
    from lerobot_dali.dataset_reader import open_dataset

    for file_index, shown in (([7, 7, 8, 8, 9], "file-009.parquet'])"), ([7, 7, 8, 9, 10], "file-009.parquet'] ...)")):
        _set_episode_columns(stale, **{"data/file_index": file_index})
        caplog.clear()
        with caplog.at_level("WARNING", logger="lerobot_dali.episode_data_files"):
            assert open_dataset(stale).num_episodes == 5
        (said,) = [r.getMessage() for r in caplog.records]
        named = re.search(r"names data files that do not exist \((.*?\))", said)
        assert named is not None and named[1].endswith(shown), said
        assert [name.rsplit("/", 1)[-1] for name in re.findall(r"'([^']*)'", named[1])] == [
            "file-007.parquet",
            "file-008.parquet",
            "file-009.parquet",
        ]


def test_an_episode_in_no_data_file_is_named(merged) -> None:
    _, stale = merged
    _drop_rows(stale / "data/chunk-000/file-002.parquet", lambda t: pc.not_equal(t["episode_index"], 4))
    with pytest.raises(MissingDataFileError, match=r"file-007\.parquet is missing: .*episodes \[4\] are in no other"):
        _samples(stale)
    # Only the episodes to read must be found: a selection without episode 4 reads.
    assert [b["episode_index"].unique().tolist() for b in _samples(stale, episodes=[1])] == [[1]] * 3


def test_a_data_file_not_spelt_as_the_template_names_it_is_not_read(merged) -> None:
    """file-002 renamed file-2, which data_path's {file_index:03d} never names: the reader does not read it, so
    episode 4 is in no data file (not found there, nor "missing" as file-002)."""
    from lerobot_dali.dataset_reader import open_dataset

    _, stale = merged
    (stale / "data/chunk-000/file-002.parquet").rename(stale / "data/chunk-000/file-2.parquet")
    with pytest.raises(MissingDataFileError, match=r"file-007\.parquet is missing: .*episodes \[4\] are in no other"):
        open_dataset(stale)


def test_an_episode_not_to_read_and_in_no_file_does_not_count_toward_a_real_files_rows(merged) -> None:
    """Episode 4 is in no data file and its stale place names file-000, which holds episodes 0 and 1: a selection
    of those reads (episode 4's length was counted as file-000's rows)."""
    _, stale = merged
    _set_episode_columns(stale, **{"data/chunk_index": [0] * 5, "data/file_index": [7, 7, 7, 7, 0]})
    _drop_rows(stale / "data/chunk-000/file-002.parquet", lambda t: pc.not_equal(t["episode_index"], 4))
    assert sum(len(b["index"]) for b in _samples(stale, episodes=[0, 1])) == LENGTHS[0] + LENGTHS[1]


def test_rows_no_episode_reads_still_fail_after_locating(merged) -> None:
    """The metadata leaves episode 2 out (info.json's total_episodes lowered to match, as one removing it on purpose
    would: else the dataset is refused at open); its rows sit in file-001 beside episode 3's: reading episode 3 fails
    rather than dropping them silently (the files' row counts stay the metadata's)."""
    _, stale = merged
    path = next((stale / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    pq.write_table(table.filter(pc.not_equal(table["episode_index"], 2)), path)
    info_path = stale / "meta/info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "total_episodes": info["total_episodes"] - 1}))
    from lerobot_dali.dataset_reader import open_dataset

    reader = open_dataset(stale)
    with pytest.raises(EpisodeMetadataError, match=r"file-001\.parquet: holds 12 rows but the episode metadata places"):
        reader.read_episode(2)  # (position 2: episode 3)


@pytest.mark.parametrize("split", ["in one file", "over two files"])
def test_an_episode_whose_rows_are_not_one_run_is_refused_naming_the_file(merged, split: str) -> None:
    """Located by the data files, an episode's rows must be one run: its first row and length then read them all.
    Episode 0's rows cut in two by episode 1's (in file-000), or episode 4's last row moved from file-002 to the end
    of file-000, are refused naming where its rows continue."""
    _, stale = merged
    first = stale / "data/chunk-000/file-000.parquet"
    table = pq.read_table(first)
    if split == "in one file":  # rows 0-2 of episode 0, then episode 1, then rows 3-5 of episode 0
        order = [0, 1, 2, *range(6, 6 + LENGTHS[1]), 3, 4, 5]
        pq.write_table(table.take(order), first)
        episode, where = 0, "file-000"
    else:
        third = stale / "data/chunk-000/file-002.parquet"
        rows = pq.read_table(third)
        pq.write_table(rows.slice(0, len(rows) - 1), third)
        pq.write_table(pa.concat_tables([table, rows.slice(len(rows) - 1)]), first)
        episode, where = 4, "file-002"
    with pytest.raises(
        EpisodeMetadataError,
        match=rf"meta/episodes names .*, and episode {episode}'s rows are not one run in one data file "
        rf"\(.*{where}\.parquet holds some after others\): rewrite the data files",
    ):
        _samples(stale)


def test_an_episode_whose_rows_disagree_with_its_length_is_named(merged) -> None:
    _, stale = merged
    _drop_rows(stale / "data/chunk-000/file-001.parquet", lambda t: pc.not_equal(t["frame_index"], 7))
    with pytest.raises(
        EpisodeMetadataError,
        match=r"episode 3 has length 8 there but 7 rows in \S*/chunk-000/file-001\.parquet: .*leave out its episodes "
        r"\[2, 3\] \(episodes=",
    ):
        _samples(stale)


@pytest.fixture
def converted(make_ds, copy_ds) -> tuple[Path, Path]:
    """(original, a copy indexed as LeRobot's v2.1 -> v3.0 converter before 0.5.0 indexed it (its issue #2401): the
    episode that starts each data file after the first (2 in file-001, 4 in file-002) is placed in the one before)"""
    original = make_ds(**SPEC, fps=10)
    stale = copy_ds(original)
    _set_episode_columns(stale, **{"data/file_index": [0, 0, 0, 1, 1]})
    return original, stale


@pytest.mark.parametrize("episodes", [None, [1, 3, 4]])
def test_a_converted_dataset_whose_file_indices_name_files_that_hold_others_reads(converted, caplog, episodes) -> None:
    """No file is missing: the footers' row counts (file-000 holds 15, the metadata places 19 there) tell."""
    original, stale = converted
    expected = _samples(original, delta_timestamps=WINDOWS, episodes=episodes)
    with caplog.at_level("WARNING", logger="lerobot_dali.episode_data_files"):
        got = _samples(stale, delta_timestamps=WINDOWS, episodes=episodes, num_workers=2)
    assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in expected]
    for ours, theirs in zip(got, expected, strict=True):
        assert all(torch.equal(ours[k], v) if torch.is_tensor(v) else ours[k] == v for k, v in theirs.items())
    (warning,) = [r.getMessage() for r in caplog.records]
    assert re.search(r"meta/episodes places 19 rows in .*file-000\.parquet, which holds 15 \(2 such", warning), warning
    assert "v2.1 -> v3.0 converter before 0.5.0" in warning


def test_a_converted_dataset_reads_from_a_remote_filesystem(converted) -> None:
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali.dataset_reader import open_dataset

    original, stale = converted
    remote, local = open_dataset("fakeremote://", storage_options={"root": str(stale)}), open_dataset(original)
    for name in ("data_chunk_index", "data_file_index", "data_row_start", "data_file_rows"):
        assert np.array_equal(getattr(remote.episodes, name), getattr(local.episodes, name)), name


def test_rows_no_episode_reads_fail_at_open_when_every_episode_is_where_the_metadata_says(make_ds, copy_ds) -> None:
    """meta/episodes leaves episode 1 out: file-000 holds its 9 rows after episode 0's 6, which nothing reads."""
    from lerobot_dali.dataset_reader import open_dataset

    ds = copy_ds(make_ds(**SPEC, fps=10))
    path = next((ds / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    pq.write_table(table.filter(pc.not_equal(table["episode_index"], 1)), path)
    with pytest.raises(EpisodeMetadataError, match=r"places 6 rows in .*file-000\.parquet, which holds 15 .*yet every"):
        open_dataset(ds)
    with pytest.raises(EpisodeMetadataError, match=r"yet every .* leave out its episodes \[0\] \(episodes="):
        open_dataset(ds)  # (file-000's episodes alone: the other files hold what they should)
    assert open_dataset(ds, episodes=[2, 3]).read_episode(0)["episode_index"].tolist() == [2] * LENGTHS[2]


def test_an_episode_in_its_named_file_at_another_row_is_located_there(make_ds, copy_ds) -> None:
    """file-000 holds episode 1, then episode 0, then episode 2 (moved from file-001): episode 0, read alone, is in
    the file meta/episodes names but not at its row 0, so it is located and read at rows 9-14 (not refused as
    "every episode to read is where it says")."""
    from lerobot_dali.dataset_reader import open_dataset

    ds = copy_ds(make_ds(**SPEC, fps=10))
    first, second = (ds / f"data/chunk-000/file-00{i}.parquet" for i in (0, 1))
    a, b = pq.read_table(first), pq.read_table(second)
    pq.write_table(pa.concat_tables([_episode_rows(a, 1), _episode_rows(a, 0), _episode_rows(b, 2)]), first)
    pq.write_table(_episode_rows(b, 3), second)
    rows = open_dataset(ds, episodes=[0]).read_episode(0)
    assert rows["episode_index"].tolist() == [0] * LENGTHS[0]
    np.testing.assert_array_equal(rows["index"], np.arange(LENGTHS[0]))
    np.testing.assert_array_equal(rows["frame_index"], np.arange(LENGTHS[0]))


def test_open_and_the_column_check_name_each_data_file_once_not_each_episode(make_ds, monkeypatch) -> None:
    """A v3.0 data file holds thousands of episodes; the open's footer check formatted a data path per episode (a
    dataset of 100,000 episodes in 100 files: 100,000 paths, 0.3-0.5 s of every rank's start). 5 episodes in 3 files
    here: 3 paths at open, 3 more for the column check."""
    from lerobot_dali import episode_data_files
    from lerobot_dali.dataset_reader import open_dataset

    formatted: list[str] = []
    format_path = episode_data_files.format_path

    def counting(template: str, values, *, name: str = "path", **kwargs) -> str:
        path = format_path(template, values, name=name, **kwargs)
        if name == "data_path":
            formatted.append(path)
        return path

    monkeypatch.setattr(episode_data_files, "format_path", counting)
    reader = open_dataset(make_ds(**SPEC, fps=10))
    files = ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet", "data/chunk-000/file-002.parquet"]
    assert formatted == files
    formatted.clear()
    reader.check_data_columns()
    assert formatted == files
    assert reader.episodes.first_of_each_data_file().tolist() == [0, 2, 4]
    assert reader.episodes.first_of_each_data_file(np.array([False, True, True, False, True])).tolist() == [1, 2, 4]


def test_the_column_check_numbers_the_data_files_once(make_ds, monkeypatch) -> None:
    """Before, the column check sorted every episode's data file 6 times, 7 with subtasks (rows_read_per_data_file
    3-4 times, data_file_ids, data_file_spans, first_of_each_data_file: ~60 ms each at 1,000,000 episodes); now the
    table numbers them once, keeps that read-only, and pickles without it. Episodes 1, 2, 4 of 5 (files of 2): the
    rows read per file are those episodes' lengths."""
    import pickle

    from lerobot_dali import episode_table
    from lerobot_dali.dataset_reader import open_dataset

    reader = open_dataset(make_ds(**SPEC, fps=10), episodes=[1, 2, 4])
    table = reader.episodes
    sorts: list[int] = []
    file_ids = episode_table._file_ids

    def counting(chunk: np.ndarray, file: np.ndarray) -> np.ndarray:
        sorts.append(len(chunk))
        return file_ids(chunk, file)

    monkeypatch.setattr(episode_table, "_file_ids", counting)
    reader.check_data_columns()
    assert sorts == [3]
    assert table.rows_read_per_data_file().tolist() == [LENGTHS[1], LENGTHS[2], LENGTHS[4]]
    assert table.data_file_ids().tolist() == [0, 1, 2]
    assert table.first_of_each_data_file().tolist() == [0, 1, 2]
    assert not table.rows_read_per_data_file().flags.writeable and not table.data_file_ids().flags.writeable
    assert sorts == [3]
    copy = pickle.loads(pickle.dumps(table))
    assert "_rows_read" not in vars(copy) and "_data_file_id" not in vars(copy)
    assert copy.rows_read_per_data_file().tolist() == [LENGTHS[1], LENGTHS[2], LENGTHS[4]]


def _hand_table() -> EpisodeTable:
    """Episodes 0-4 of lengths 3 2 4 3 1 in data files (chunk, file) (0, 0) (0, 0) (1, 0) (1, 0) (0, 1000): files are
    numbered by (chunk, file), so (0, 1000) comes before (1, 0), and the two are not one file."""
    length = np.array([3, 2, 4, 3, 1])
    to_index = np.cumsum(length)
    from_index = to_index - length
    chunk, file = np.array([0, 0, 1, 1, 0]), np.array([0, 0, 0, 0, 1000])
    tasks = pa.array([["a"], [], None, ["b", "a"], ["c"]], pa.list_(pa.string()))
    return EpisodeTable(
        np.arange(5), length, from_index, to_index, chunk, file, np.zeros(5, np.int64), tasks, {}, np.zeros(5, np.int64)
    )


def test_an_episode_tables_data_files_by_hand() -> None:
    """Per episode: its data file's number, the rows its file's episodes take, where its rows start in the file, the
    first episode of each file (all, or of those wanted: ascending), a column's span over its file's episodes, the
    episodes whose listed tasks lack the one their rows name (an empty or missing list lacks none)."""
    table = _hand_table()
    assert table.data_file_ids().tolist() == [0, 0, 2, 2, 1]
    assert table.rows_read_per_data_file().tolist() == [5, 5, 7, 7, 1]
    row_start = episode_table._row_start_in_file
    assert row_start(table.data_file_ids(), table.dataset_from_index, table.length).tolist() == [0, 3, 0, 4, 0]
    # Episodes written in turn to two files (0, 2, 4 and 1, 3): each file's back to back, in global index order.
    assert row_start(np.array([0, 1, 0, 1, 0]), table.dataset_from_index, table.length).tolist() == [0, 0, 3, 2, 7]
    assert row_start(np.array([0, 0]), np.array([4, 0]), np.array([2, 4])).tolist() == [4, 0]
    assert table.first_of_each_data_file().tolist() == [0, 2, 4]
    assert table.first_of_each_data_file(np.array([False, True, True, True, True])).tolist() == [1, 2, 4]
    [(low, high)] = table.data_file_spans(table.dataset_from_index)
    assert low.tolist() == [0, 0, 5, 5, 12] and high.tolist() == [3, 3, 9, 9, 12]
    lacking = table.lacking_task(np.arange(5), np.array([0, 0, 0, 1, 0]), {0: "a", 1: "b"})
    assert lacking.tolist() == [4]  # (episode 4 lists "c" only; 1's list is empty, 2's missing)
    assert table.select([4, 1]).episode_index.tolist() == [1, 4]
    with pytest.raises(DatasetError, match=r"episodes \[7\] are not in this dataset"):
        table.select([1, 7])
    with pytest.raises(DatasetError, match=r"lists \[4\] more than once"):
        table.select([4, 1, 4])
    with pytest.raises(DatasetError, match="must be a non-empty list of episode indices"):
        table.select(np.array([], np.int64))  # (an empty selection of ints: no episode to read)


def test_a_v2_episode_table_by_hand() -> None:
    """episodes.jsonl in any order: rows sorted by episode index, packed back to back, one data and video file each
    (file_index is the episode's), in chunks of ``chunks_size`` episodes."""
    records = [
        {"episode_index": 3, "length": 2, "tasks": ["d"]},
        {"episode_index": 0, "length": 3, "tasks": ["a"]},
        {"episode_index": 1, "length": 5, "tasks": None},
        {"episode_index": 2, "length": 4, "tasks": ["c"]},
    ]
    info = SimpleNamespace(chunks_size=2)  # (all the v2.x table reads of info.json)
    records_read = episode_table.EpisodeRecords("ds/meta/episodes.jsonl", records)
    table = episode_table.read_episode_table(records_read, info, video_keys=["cam"])  # type: ignore[arg-type]
    assert table.episode_index.tolist() == [0, 1, 2, 3] and table.length.tolist() == [3, 5, 4, 2]
    assert table.dataset_from_index.tolist() == [0, 3, 8, 12] and table.dataset_to_index.tolist() == [3, 8, 12, 14]
    assert table.data_chunk_index.tolist() == [0, 0, 1, 1] and table.data_file_index.tolist() == [0, 1, 2, 3]
    assert table.data_row_start.tolist() == [0] * 4 and table.data_file_rows.tolist() == [3, 5, 4, 2]
    assert table.tasks.to_pylist() == [["a"], [], ["c"], ["d"]]
    cam = table.cameras["cam"]
    assert cam.chunk_index.tolist() == [0, 0, 1, 1] and cam.file_index.tolist() == [0, 1, 2, 3]
    assert cam.from_timestamp_s.tolist() == [0.0] * 4 and np.isnan(cam.next_from_timestamp_s).all()


def test_a_v3_tasks_column_of_plain_texts_reads_as_lists_of_one() -> None:
    """(A missing text reads as a missing list, not a list holding a null.)"""
    table = pa.table({"episode_index": [0, 1, 2], "tasks": pa.array(["a", None, "b"], pa.large_string())})
    assert episode_table._with_task_lists(table, "file-000.parquet")["tasks"].to_pylist() == [["a"], None, ["b"]]


def test_a_stale_merge_reads_from_a_remote_filesystem(merged) -> None:
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali.dataset_reader import open_dataset

    original, stale = merged
    remote = open_dataset("fakeremote://", storage_options={"root": str(stale)})
    assert not remote.location.is_local
    local = open_dataset(original)
    for name in ("data_chunk_index", "data_file_index", "data_row_start", "data_file_rows"):
        assert np.array_equal(getattr(remote.episodes, name), getattr(local.episodes, name)), name
    for pos in range(len(LENGTHS)):
        got, expected = remote.read_episode(pos), local.read_episode(pos)
        assert all(np.array_equal(got[k], expected[k]) for k in expected)


def test_a_stale_merge_whose_data_files_cannot_be_listed_says_so(merged, monkeypatch) -> None:
    from lerobot_dali.dataset_reader import open_dataset

    _, stale = merged
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)

    def cannot_list(fs, root):
        raise NotImplementedError  # as a filesystem without listings: FileStamps records nothing

    monkeypatch.setattr("lerobot_dali.file_stamps.find_files", cannot_list)
    with pytest.raises(MissingDataFileError, match=r"file-007.*no data file matching .* could be listed"):
        open_dataset("fakeremote://", storage_options={"root": str(stale)})


def test_a_timeout_reading_an_episode_index_column_is_raised_as_itself(merged, monkeypatch) -> None:
    """A transient failure reading a data file's episode_index column is raised as such (a retry may read it), not
    named a file without a readable column."""
    from lerobot_dali import episode_data_files
    from lerobot_dali.dataset_reader import open_dataset

    def timing_out(*args, **kwargs):
        raise TimeoutError("read timed out")

    _, stale = merged
    monkeypatch.setattr(episode_data_files, "read_parquet", timing_out)
    with pytest.raises(TimeoutError, match="read timed out"):
        open_dataset(stale)


def test_a_data_file_whose_episode_index_page_does_not_parse_is_named(merged) -> None:
    """Locating reads each listed file's episode_index column: a page header that does not parse made pyarrow raise
    a bare OSError ("Couldn't deserialize thrift") naming neither the file nor why it was read."""
    from lerobot_dali.dataset_reader import open_dataset

    _, stale = merged
    path = stale / "data/chunk-000/file-001.parquet"
    meta = pq.ParquetFile(path).metadata
    names = [meta.row_group(0).column(c).path_in_schema for c in range(meta.num_columns)]
    column = meta.row_group(0).column(names.index("episode_index"))
    at = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[at : at + 4] = bytes(4)
    path.write_bytes(bytes(raw))
    with pytest.raises(
        EpisodeMetadataError,
        match=r"file-007\.parquet.*file-001\.parquet has no readable episode_index column .*deserialize thrift",
    ):
        open_dataset(stale)


@pytest.mark.parametrize(("values", "said"), [("null", "1 of its values are missing"), ("fraction", "truncated")])
def test_a_data_files_episode_index_that_is_not_whole_numbers_is_named(merged, values: str, said: str) -> None:
    """Locating cast the column plainly: a null became episode -2**63 and 1.5 became 1, so the error (if any) spoke
    of rows and lengths instead of the column."""
    from lerobot_dali.dataset_reader import open_dataset

    _, stale = merged
    path = stale / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    episodes = table["episode_index"].to_pylist()
    episodes[3] = None if values == "null" else 0.5
    column = pa.array(episodes, pa.int64() if values == "null" else pa.float64())
    pq.write_table(table.set_column(table.column_names.index("episode_index"), "episode_index", column), path)
    with pytest.raises(EpisodeMetadataError, match=rf"file-000\.parquet has no readable episode_index column .*{said}"):
        open_dataset(stale)


@pytest.mark.parametrize(("local_rank", "said"), [("0", True), ("1", False)])
def test_a_cold_open_shows_the_progress_of_its_data_file_footers(
    make_ds, monkeypatch, caplog, local_rank: str, said: bool
) -> None:
    """A cold open of a v2.1 dataset reads every episode's data file footer (3,000 episodes: 2-4 s; 15,000: ~9 s)
    and said nothing until it was done; now it counts them as the other waits do, on a node's first rank only."""
    from lerobot_dali import concurrent_calls, progress_lines
    from lerobot_dali.dataset_reader import open_dataset

    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(progress_lines, "LINE_GAP_S", 0.0)  # (a line a file, each a tenth, ms apart)
    root = make_ds(**{**SPEC, "version": "v2.1"})
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        open_dataset(root)
    # (the waits' lines alone: an earlier test's in-process `check` may have left other loggers at INFO)
    lines = [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "lerobot_dali.concurrent_calls"]
    assert lines == ([f"lerobot-dali: {root}'s data file footers: {n}/5 files" for n in range(1, 6)] if said else [])


def test_a_warm_open_shows_no_progress(make_ds, monkeypatch, caplog) -> None:
    """The footers are kept (row_count_store): a second open reads none, and its log stays as it was."""
    from lerobot_dali import concurrent_calls
    from lerobot_dali.dataset_reader import open_dataset

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0)
    root = make_ds(**{**SPEC, "version": "v2.1"})
    open_dataset(root)
    caplog.clear()  # (the first open's lines, where an earlier test's in-process `check` left INFO on)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        open_dataset(root)
    assert [r for r in caplog.records if r.name == "lerobot_dali.concurrent_calls"] == []


def test_a_remote_cold_open_shows_the_progress_of_its_data_file_footers(make_ds, monkeypatch, caplog) -> None:
    """Remote footers are read several at once (in_threads), one request each: counted alike."""
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali import concurrent_calls
    from lerobot_dali.dataset_reader import open_dataset

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0)
    root = make_ds(**{**SPEC, "version": "v2.1"})
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        open_dataset("fakeremote://", storage_options={"root": str(root)})
    assert "data file footers: 5/5 files" in caplog.records[-1].getMessage()


def test_the_episodes_to_leave_out_are_named_ten_at_most() -> None:
    """The advice names the episodes of the files that disagree, the first ten of them ("..." past those)."""
    from lerobot_dali.episode_data_files import _episodes_of_files

    assert _episodes_of_files(np.arange(10), 1) == "its episodes [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
    assert (
        _episodes_of_files(np.arange(3, 14), 2)
        == "the episodes of those 2 files, [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] ..."
    )


@pytest.mark.parametrize(
    ("episodes", "shown"), [(None, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ..."), (range(10), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")]
)
def test_the_episodes_in_no_data_file_are_named_ten_at_most_and_the_missing_files_counted(
    make_ds, copy_ds, episodes, shown: str
) -> None:
    """12 episodes, 0-10 in file-000 (deleted) and 11 in file-001, indexed in file-007 (0-5) and file-008 (6-11),
    neither of which exists: the first missing file is named and the other counted, and of the episodes to read that
    no file holds, the first ten ("..." past those)."""
    from lerobot_dali.dataset_reader import open_dataset

    ds = copy_ds(make_ds(episodes=12, frames_per_episode=2, cameras=0, episodes_per_file=11))
    _set_episode_columns(ds, **{"data/file_index": [7] * 6 + [8] * 6})
    (ds / "data/chunk-000/file-000.parquet").unlink()
    with pytest.raises(MissingDataFileError) as raised:
        open_dataset(ds, episodes=None if episodes is None else list(episodes))
    assert re.sub(r"\S*/data/", "data/", str(raised.value)) == (
        "data/chunk-000/file-007.parquet is missing (and 1 more data files): meta/episodes places episodes there, "
        f"and episodes {shown} are in no other data file either; re-download the dataset"
    )


def test_an_episode_in_no_data_file_of_a_converted_dataset_is_named(converted) -> None:
    """No data file is missing (the converter's index names files that hold others): the stale index is said as it
    was found, and the episode to read that no file holds is named."""
    from lerobot_dali.dataset_reader import open_dataset

    _, stale = converted
    _drop_rows(stale / "data/chunk-000/file-002.parquet", lambda t: pc.not_equal(t["episode_index"], 4))
    with pytest.raises(MissingDataFileError) as raised:
        open_dataset(stale)
    assert re.sub(r"\S*/data/", "data/", str(raised.value)) == (
        f"{stale}: meta/episodes places 19 rows in data/chunk-000/file-000.parquet, which holds 15 (2 such file(s)), "
        "and episodes [4] are in no data file; re-download the dataset"
    )
    assert open_dataset(stale, episodes=[0, 3]).episodes.data_file_index.tolist() == [0, 1]


def test_a_remote_open_asks_nothing_more_of_a_data_file_its_listing_holds(merged, monkeypatch) -> None:
    """The listing stamps every data file: whether one exists is read from it, and each is opened with the size it
    gives, so no file that is listed costs a request of its own (an HTTP HEAD each). A stale merge's index names
    file-007, which the listing lacks: its stamp is the one metadata request."""
    from lerobot_dali.dataset_reader import open_dataset
    from tests import fake_remote

    sizes: dict[str, int | None] = {}
    real_open = fake_remote.FakeRemoteFileSystem._open

    def opening(self, path: str, mode: str = "rb", **kwargs):
        sizes[path.rsplit("/", 1)[-1]] = kwargs.get("size")
        return real_open(self, path, mode, **kwargs)

    monkeypatch.setattr(fake_remote.FakeRemoteFileSystem, "_open", opening)
    for root, asked in zip(merged, (0, 1), strict=True):
        sizes.clear()
        remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
        requests = remote.location.fs.fs.requests  # (the fake remote under the retrying wrapper)
        assert (requests["exists"], requests["info"]) == (0, asked), dict(requests)
        assert sizes == {f.name: f.stat().st_size for f in (root / "data/chunk-000").iterdir()}


def test_a_remote_data_file_is_not_taken_for_a_local_path_of_its_name(merged, tmp_path, monkeypatch) -> None:
    """Only a local data file is checked for being a named pipe (its open would hang): a remote one's path, stripped
    of its protocol, is relative, and a pipe of that name under the working folder is none of the dataset's."""
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali.dataset_reader import open_dataset

    original, _ = merged
    (tmp_path / "data/chunk-000").mkdir(parents=True)
    os.mkfifo(tmp_path / "data/chunk-000/file-000.parquet")
    monkeypatch.chdir(tmp_path)
    remote = open_dataset("fakeremote://", storage_options={"root": str(original)})
    assert remote.read_episode(0)["episode_index"].tolist() == [0] * LENGTHS[0]


def test_a_remote_v2_open_checks_the_data_files_of_fewer_episodes_than_a_local_one(
    make_ds, copy_ds, monkeypatch
) -> None:
    """Each v2.x data file checked at open costs a remote dataset a request: past CHECKED_FILES_REMOTE episodes to
    read (CHECKED_FILES local), their files are checked as they are read. 5 episodes here, episode 4's file missing:
    checked (and refused) with a local limit of 5, not with a remote limit of 4."""
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali import episode_data_files
    from lerobot_dali.dataset_reader import open_dataset

    monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 5)
    monkeypatch.setattr(episode_data_files, "CHECKED_FILES_REMOTE", 4)
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}))
    (root / "data/chunk-000/episode_000004.parquet").unlink()
    with pytest.raises(MissingDataFileError, match=r"chunk-000/episode_000004\.parquet is missing: "):
        open_dataset(root)
    assert open_dataset("fakeremote://", storage_options={"root": str(root)}).num_episodes == 5
