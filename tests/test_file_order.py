"""v3.0 datasets whose data and video files do not follow episode order, as merges, deletions and parallel writers
leave them: each episode is read from the files meta/episodes names (its data file and row range, each camera's file
and from_timestamp), never by where the files sort. Every generated dataset holds its episodes in file order, so
nothing else pins that.

The sets keep what LeRobot writes for the rows: ``index`` and ``dataset_from_index``/``dataset_to_index`` count the
rows in episode order, whichever file holds them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.test_cli import _info_json
from tests.test_iterator import LENGTHS, _dataset, assert_each_frame_read_once_as_its_own

#: test_iterator's dataset (5 episodes, two a file: data and video files 000 {0, 1}, 001 {2, 3}, 002 {4}) with its
#: data files in reverse order.
REVERSED = [[4], [2, 3], [0, 1]]
#: Its episodes written in turn to two data files (as two writers would), so neither file's rows run on from one
#: episode to the next: file-000 holds rows 0-4, 6-12 and 17-22.
TAKEN_IN_TURN = [[0, 2, 4], [1, 3]]


def out_of_episode_order(root: Path, data_files: Sequence[Sequence[int]]) -> Path:
    """``root`` (a writable copy of a generated v3.0 dataset, its files in chunk 000) with data file i rewritten to
    hold the episodes ``data_files[i]`` (their rows in episode order, as one writer appends them), camera k's video
    file i renamed file (i + k + 1) mod n, and meta/episodes naming those files, its rows in reverse order."""
    data = sorted((root / "data/chunk-000").glob("file-*.parquet"))
    rows = pa.concat_tables([pq.read_table(path) for path in data])
    for path in data:
        path.unlink()
    data_file = {}
    for file_index, episodes in enumerate(data_files):
        data_file.update(dict.fromkeys(episodes, file_index))
        kept = rows.filter(pc.is_in(rows["episode_index"], pa.array(episodes, pa.int64())))
        pq.write_table(kept, root / f"data/chunk-000/file-{file_index:03d}.parquet")
    meta = next((root / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(meta)
    columns = {"data/file_index": [data_file[e] for e in table["episode_index"].to_pylist()]}
    for k, camera in enumerate(sorted((root / "videos").iterdir())):
        videos = sorted((camera / "chunk-000").glob("file-*.mp4"))
        moved = {i: (i + k + 1) % len(videos) for i in range(len(videos))}
        for i, path in enumerate(videos):
            path.rename(path.with_name(f"moving-{moved[i]:03d}.mp4"))
        for path in (camera / "chunk-000").glob("moving-*.mp4"):
            path.rename(path.with_name(path.name.replace("moving-", "file-")))
        column = f"videos/{camera.name}/file_index"
        columns[column] = [moved[i] for i in table[column].to_pylist()]
    for name, values in columns.items():
        table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.int64()))
    pq.write_table(table.take(list(reversed(range(len(table))))), meta)
    return root


@pytest.mark.parametrize("data_files", [REVERSED, TAKEN_IN_TURN], ids=["reversed", "taken_in_turn"])
@pytest.mark.parametrize(("codec", "route"), [("vp9", "dali_cpu"), ("h264", "cpu_fallback")])
def test_each_sample_reads_its_episodes_rows_and_frames_from_files_out_of_episode_order(
    make_ds, copy_ds, codec: str, route: str, data_files: list[list[int]]
) -> None:
    """Data files as ``data_files`` lays them out; camera 0's files 000 {4}, 001 {0, 1}, 002 {2, 3}; camera 1's 000
    {2, 3}, 001 {4}, 002 {0, 1}: every sample's rows, windows and frames are its own episode's (index, state, action,
    task and both cameras' markers by hand), in dataset order, each frame once; a shuffled epoch too."""
    root = out_of_episode_order(copy_ds(_dataset(make_ds, codec)), data_files)
    assert_each_frame_read_once_as_its_own(root, range(len(LENGTHS)), route=route)


def test_info_probes_the_first_episodes_own_video_files(make_ds, copy_ds, capsys) -> None:
    """The first video of a camera is episode 0's (6 frames in both cameras), not its file-000 (camera 0's: episode
    4, 6 frames; camera 1's: episodes 2 and 3, 11 frames); the files and episodes per file are counted as before."""
    root = out_of_episode_order(copy_ds(_dataset(make_ds, "vp9")), REVERSED)
    info = _info_json(capsys, str(root))
    assert (info["data_files"], info["episodes_per_data_file"]) == (3, {"min": 1, "max": 2})
    for camera in info["cameras"].values():
        assert (camera["video_files"], camera["episodes_per_file"]) == (3, {"min": 1, "max": 2})
        assert camera["frame_count"] == LENGTHS[0] + LENGTHS[1]
        assert camera["frame_lookup"] == {"parquet_timestamp": "ok", "frame_index": "ok"}
