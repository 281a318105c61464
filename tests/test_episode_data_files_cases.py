"""Cases of the open's data file checks (:mod:`lerobot_dali.episode_data_files`) that a mutation pass found
unpinned: a dataset of one episode is checked as any other, the listing that locates episodes is of the data folder
alone, and the messages name the first of several faults with that fault's own values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DataFileError, EpisodeMetadataError, MissingDataFileError

V2 = dict(episodes=4, frames_per_episode=[3, 4, 5, 3], cameras=0, version="v2.1", chunks_size=2)
MISCOUNTED = "the data file and meta/episodes disagree (a download or copy cut short?): download the dataset again, or "


def _short(path: Path, rows: int) -> None:
    pq.write_table(pq.read_table(path).slice(0, rows), path)


def _relative(message: str) -> str:
    return re.sub(r"\S*/data/", "data/", message)


def test_a_v3_dataset_of_one_episode_whose_data_file_is_cut_short_is_refused_at_open(make_ds, copy_ds) -> None:
    """A table of one episode was checked as any other (only an empty one is passed over): its file's 5 rows where
    the metadata places 7 are refused at open, not first when the episode is read."""
    root = copy_ds(make_ds(episodes=1, frames_per_episode=7, cameras=0))
    _short(root / "data/chunk-000/file-000.parquet", 5)
    with pytest.raises(EpisodeMetadataError) as raised:
        open_dataset(root)
    assert _relative(str(raised.value)) == (
        f"{root}: meta/episodes places 7 rows in data/chunk-000/file-000.parquet, which holds 5 (1 such file(s)); "
        "episode 0 has length 7 there but 5 rows in data/chunk-000/file-000.parquet: "
        f"{MISCOUNTED}leave out its episodes [0] (episodes=[...] of the others)"
    )


def test_a_v2_dataset_of_one_episode_without_its_data_file_is_refused_at_open(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**{**V2, "episodes": 1, "frames_per_episode": 3}))
    (root / "data/chunk-000/episode_000000.parquet").unlink()
    with pytest.raises(MissingDataFileError, match=r"chunk-000/episode_000000\.parquet is missing: meta/episodes"):
        open_dataset(root)


def test_v2_files_cut_short_name_the_first_files_rows_and_episode_and_count_the_others(make_ds, copy_ds) -> None:
    """Episodes 1 (4 rows, cut to 2) and 2 (5 rows, cut to 1) of 4: the message's file, rows held, episode and
    length are all the first one's; the other is counted, and both named to leave out (as a list, not "episode")."""
    root = copy_ds(make_ds(**V2))
    _short(root / "data/chunk-000/episode_000001.parquet", 2)
    _short(root / "data/chunk-001/episode_000002.parquet", 1)
    with pytest.raises(EpisodeMetadataError) as raised:
        open_dataset(root)
    assert _relative(str(raised.value)) == (
        "data/chunk-000/episode_000001.parquet: holds 2 rows, but meta/episodes.jsonl gives episode 1 length 4 "
        f"(and 1 more episodes); {MISCOUNTED}leave out episodes [1, 2] (episodes=[...] of the others)"
    )


@pytest.mark.parametrize(
    ("cut", "named"), [(10, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"), (11, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ...")]
)
def test_v2_files_cut_short_are_named_ten_at_most(make_ds, copy_ds, cut: int, named: str) -> None:
    """Of 12 episodes, the first ``cut`` files each lose a row: the episodes to leave out are listed, the first ten
    of them ("..." past those)."""
    root = copy_ds(make_ds(episodes=12, frames_per_episode=2, cameras=0, version="v2.1"))
    for episode in range(cut):
        _short(root / f"data/chunk-000/episode_{episode:06d}.parquet", 1)
    with pytest.raises(EpisodeMetadataError) as raised:
        open_dataset(root)
    assert str(raised.value).endswith(
        f"gives episode 0 length 2 (and {cut - 1} more episodes); {MISCOUNTED}leave out episodes {named} "
        "(episodes=[...] of the others)"
    )


def test_a_wrong_chunks_size_names_the_first_chunk_holding_the_file(make_ds, copy_ds) -> None:
    """Episode 2's data file lies in chunk 1 (chunks_size 2) and a copy in chunk 3: info.json's chunks_size 1 puts it
    in chunk 2; the message names chunk 1, the first that holds it."""
    root = copy_ds(make_ds(**V2))
    (root / "data/chunk-003").mkdir()
    (root / "data/chunk-003/episode_000002.parquet").write_bytes(
        (root / "data/chunk-001/episode_000002.parquet").read_bytes()
    )
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "chunks_size": 1}))
    with pytest.raises(
        MissingDataFileError,
        match=r"chunk-001/episode_000001\.parquet is missing \(and 2 more episodes' data files\): info\.json's "
        r"chunks_size=1 puts episode 1 in chunk 1, but its data file lies in chunk 0;",
    ):
        open_dataset(root)
    with pytest.raises(MissingDataFileError, match=r"puts episode 2 in chunk 2, but its data file lies in chunk 1;"):
        open_dataset(root, episodes=[2])


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_the_data_files_are_looked_for_in_the_data_folder_alone(make_ds, copy_ds, monkeypatch, version: str) -> None:
    """Locating a stale v3.0 index's episodes, or a v2.x episode's data file in other chunks, lists the folder
    data_path's template starts with, not the whole dataset (its videos, often most of its files)."""
    root = copy_ds(make_ds(**{**V2, "cameras": 1, "codec": "vp9", "size": (64, 64), "version": version}))
    if version == "v3.0":
        path = next((root / "meta/episodes").rglob("*.parquet"))
        table = pq.read_table(path)
        column = table.column_names.index("data/file_index")
        pq.write_table(table.set_column(column, "data/file_index", pa.array([7] * 4, pa.int64())), path)
    else:
        (root / "data/chunk-001/episode_000003.parquet").rename(root / "data/chunk-000/episode_000003.parquet")
    listed: list[str] = []
    find = LocalFileSystem.find

    def listing(self, path, *args, **kwargs):
        listed.append(path)
        return find(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "find", listing)
    if version == "v3.0":
        assert open_dataset(root).num_frames == 15
    else:
        with pytest.raises(MissingDataFileError, match=r"but its data file lies in chunk 0"):
            open_dataset(root)
    folders = [str(Path(p).relative_to(root)) for p in listed]
    assert [f for f in folders if not f.startswith("meta")] == ["data"]  # (meta/episodes' own listing aside)


def test_a_v2_data_file_that_is_a_looping_link_is_named_before_a_missing_one(make_ds, copy_ds) -> None:
    """Episode 0's data file a symbolic link to itself (listed, but no stamp: missing), episode 3's deleted: the
    first missing is checked for what it is, and named so, not called missing."""
    root = copy_ds(make_ds(**V2))
    first = root / "data/chunk-000/episode_000000.parquet"
    first.unlink()
    first.symlink_to(first.name)
    (root / "data/chunk-001/episode_000003.parquet").unlink()
    with pytest.raises(DataFileError, match=rf"data file {re.escape(str(first))} is a symbolic link that loops"):
        open_dataset(root)
