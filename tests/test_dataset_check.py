"""``check_dataset`` / ``lerobot-dali check``: every episode read as the workers read it, every problem listed.

Each damage below is one a run would raise on mid-epoch; the check must list exactly the episodes and cameras
it touches, and nothing for the rest.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from lerobot_dali import CpuDecoderBackend, dataset_check, open_dataset
from lerobot_dali.cli import main
from lerobot_dali.dataset_check import check_dataset, default_workers
from lerobot_dali.episode_rows import DecodedGroups
from lerobot_dali.errors import DataFileError, VideoDecodeError
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index import build_packet_index
from tests.conftest import shared_dataset
from tests.http_server import serve_folder
from tests.test_corrupt_frames import _damage_keyframe
from tests.test_file_order import out_of_episode_order

FPS = 10
#: H.264 with B-frames, two cameras, two episodes per file: file-000 holds episodes 0-1, file-001 2-3, file-002 4.
SPEC = dict(
    episodes=5, frames_per_episode=12, cameras=2, codec="h264", fps=FPS, gop=4, episodes_per_file=2, size=(64, 96)
)
CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


def _found(report) -> set[tuple[int, str | None, str]]:
    return {(p.episode_index, p.camera, p.error) for p in report.problems}


def _edit_rows(root: Path, edit) -> None:
    """``edit(table) -> table`` on every data file."""
    for path in sorted((root / "data").rglob("*.parquet")):
        pq.write_table(edit(pq.read_table(path)), path)


def _set_where(table: pa.Table, column: str, episode: int, change) -> pa.Table:
    values = np.asarray(table[column].to_numpy(zero_copy_only=False)).copy()
    rows = np.asarray(table["episode_index"]) == episode
    values[rows] = change(values[rows])
    return table.set_column(table.column_names.index(column), column, pa.array(values, table[column].type))


def test_a_sound_dataset_is_read_whole(make_ds) -> None:
    root = make_ds(**SPEC)
    report = check_dataset(open_dataset(root))
    assert report.ok and report.problems == []
    assert (report.episodes, report.rows, report.video_files, report.frames_decoded) == (5, 60, 6, 0)
    decoded = check_dataset(open_dataset(root), decode=True)
    assert decoded.ok and decoded.frames_decoded == 60 * 2  # every row's frame, in each camera
    # Worker processes (about a second to start) only where there is work for them.
    cpus = min(8, len(os.sched_getaffinity(0)))
    assert default_workers(open_dataset(root), decode=False) == 0
    assert default_workers(open_dataset(root), decode=True) == cpus
    for episodes, workers in ((1999, 0), (2000, cpus)):  # (local, not decoded: from 2,000 episodes on)
        many = SimpleNamespace(location=SimpleNamespace(is_local=True), num_episodes=episodes)
        assert default_workers(many, decode=False) == workers  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestamp_source must be one of 'parquet_timestamp', 'frame_index', got 'w"):
        check_dataset(open_dataset(root), timestamp_source="wall_clock")  # (as the iterator says it, not enum's)
    with pytest.raises(ValueError, match="workers must be >= 0, got -1"):  # (it ran in this process, unsaid)
        check_dataset(open_dataset(root), workers=-1)
    # A path (the README says: a reader, not a path) failed with "'PosixPath' object has no attribute 'location'".
    with pytest.raises(TypeError, match=r"check_dataset takes a reader, got PosixPath .*: pass open_dataset\("):
        check_dataset(root)  # type: ignore[arg-type]


def test_a_tolerance_no_lookup_takes_is_refused_not_listed_against_every_episode(make_ds) -> None:
    # check_dataset(tolerance_s=0) listed a ValueError against each episode and camera (10 of 10 here, the report
    # saying the dataset failed), as did a negative one; a string failed in a bare float() ValueError.
    reader = open_dataset(make_ds(**SPEC))
    for tolerance, said in ((0, "more than 0 seconds"), (-0.1, "positive finite"), ("abc", "positive finite")):
        with pytest.raises(ValueError, match=f"tolerance_s must be (a )?{said}"):
            check_dataset(reader, tolerance_s=tolerance, workers=0)  # type: ignore[arg-type]


def test_the_episodes_of_a_file_are_read_from_one_decode_of_its_row_group(make_ds, copy_ds, monkeypatch) -> None:
    # Four episodes of 5 rows per data file, each file one row group (too small for the column store), checked
    # in tasks of a file each: each episode read used to decode the whole group again, 16 decodes of rows and
    # 16 of images for 4 files.
    root = copy_ds(make_ds(episodes=16, frames_per_episode=5, cameras=1, image_cameras=True, episodes_per_file=4))
    files = sorted((root / "data").rglob("*.parquet"))
    assert [pq.ParquetFile(f).metadata.num_row_groups for f in files] == [1, 1, 1, 1]
    reads: list[tuple[tuple[int, ...], tuple[str, ...]]] = []
    plain = pq.ParquetFile.read_row_groups

    def counted(self, row_groups, columns=None, **kwargs):
        reads.append((tuple(row_groups), tuple(columns or ())))
        return plain(self, row_groups, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counted)
    report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert report.ok and (report.episodes, report.rows, report.frames_decoded) == (16, 80, 80)
    image_reads = [r for r in reads if r[1] == ("observation.images.cam0",)]
    # One decode of each file's rows and one of its images, besides the read of the camera's first image's shape.
    assert len(reads) - len(image_reads) == 4 and len(image_reads) == 4 + 1
    # What the shared decode hands each episode is what a worker's own read of it returns.
    reader = open_dataset(root)
    groups = DecodedGroups()
    for pos in range(16):
        shared, own = reader.read_episode(pos, decoded=groups), reader.read_episode(pos)
        assert shared.keys() == own.keys() and all(np.array_equal(shared[k], own[k]) for k in own)
        assert shared["episode_index"].tolist() == [pos] * 5
        shared_images = reader.read_episode_images(pos, "observation.images.cam0", decoded=groups)
        assert shared_images.equals(reader.read_episode_images(pos, "observation.images.cam0"))
    # Damage to one episode of a shared group is still listed against that episode alone.
    _edit_rows(root, lambda t: _set_where(t, "timestamp", 5, lambda v: v[::-1].copy()))
    damaged = check_dataset(open_dataset(root))
    assert _found(damaged) == {(5, None, "EpisodeMetadataError")}
    assert "episode 5's timestamps go back" in damaged.problems[0].message


def test_an_episode_inside_the_later_of_two_decoded_row_groups_reads_its_own_rows(tmp_path, monkeypatch) -> None:
    """Rows 0..9 in row groups [0, 4), [4, 8), [8, 10): rows [2, 6) decode groups 0 and 1; rows [5, 7) then lie in
    group 1 alone, within that decode, so are sliced from it at 5 - 0 (where the decode starts), not 5 - 4 (where
    group 1 starts: rows 1 and 2), with no second decode."""
    from lerobot_dali.dataset_info import Feature
    from lerobot_dali.episode_rows import read_episode_rows

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"index": pa.array(range(10), pa.int64())}), path, row_group_size=4)
    reads: list[tuple[int, ...]] = []
    plain = pq.ParquetFile.read_row_groups

    def counted(self, row_groups, columns=None, **kwargs):
        reads.append(tuple(row_groups))
        return plain(self, row_groups, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counted)
    parquet, groups = pq.ParquetFile(path), DecodedGroups()
    features = {"index": Feature("index", "int64", (1,))}

    def read(row_start: int, length: int) -> list[int]:
        rows = read_episode_rows(
            parquet, path=str(path), row_start=row_start, length=length, features=features, decoded=groups
        )
        return rows["index"].tolist()

    assert read(2, 4) == [2, 3, 4, 5]
    assert read(5, 2) == [5, 6]
    assert read(0, 1) == [0]  # (group 0 alone, within the decode too)
    assert reads == [(0, 1)]
    assert read(7, 2) == [7, 8]  # (groups 1 and 2: past the decode, so decoded anew)
    assert reads == [(0, 1), (1, 2)]


def test_every_damage_is_listed_against_its_episode_and_camera(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    # Episode 1's rows half a frame late: its frames in both cameras are off by more than the tolerance.
    _edit_rows(root, lambda t: _set_where(t, "timestamp", 1, lambda v: v + 0.5 / FPS))
    # Episode 4's rows name tasks the task list lacks, 99-110 (the message lists the first 10); its frames are still
    # looked up.
    _edit_rows(root, lambda t: _set_where(t, "task_index", 4, lambda v: 99 + np.arange(len(v))))
    # Camera 1's second file (episodes 2 and 3) is missing.
    (root / f"videos/{CAM1}/chunk-000/file-001.mp4").unlink()
    # Camera 0's third file (episode 4) is another size than the camera's first.
    other = make_ds(**{**SPEC, "size": (96, 128)})
    shutil.copy(other / f"videos/{CAM0}/chunk-000/file-002.mp4", root / f"videos/{CAM0}/chunk-000/file-002.mp4")
    expected = {
        (1, CAM0, "FrameTimestampError"),
        (1, CAM1, "FrameTimestampError"),
        (2, CAM1, "MissingDataFileError"),
        (3, CAM1, "MissingDataFileError"),
        (4, None, "EpisodeMetadataError"),
        (4, CAM0, "SchemaMismatchError"),
    }
    report = check_dataset(open_dataset(root))
    assert _found(report) == expected
    assert (report.episodes, report.rows, report.video_files) == (5, 60, 5)  # (one of six files is missing)
    assert report.problem_kinds == {
        f"FrameTimestampError in {CAM0}": 1,
        f"FrameTimestampError in {CAM1}": 1,
        f"MissingDataFileError in {CAM1}": 2,
        "EpisodeMetadataError in rows": 1,
        f"SchemaMismatchError in {CAM0}": 1,
    }
    messages = {(p.episode_index, p.camera): p.message for p in report.problems}
    assert f"task_index {list(range(99, 109))} is not in" in messages[4, None]  # (12 unknown: the first 10)
    assert "file-002.parquet" in messages[4, None]
    assert "96x128" in messages[4, CAM0] and "64x96" in messages[4, CAM0]
    assert "file-001.mp4" in messages[2, CAM1]
    # Two worker processes share the episodes and find the same.
    parallel = check_dataset(open_dataset(root), workers=2)
    assert parallel.problems == report.problems
    # Past max_problems only counted: episode 1's two problems, of one task, both counted though one is kept.
    one = check_dataset(open_dataset(root), max_problems=1)
    assert (one.problems, one.problem_kinds) == (report.problems[:1], report.problem_kinds)
    assert (parallel.episodes, parallel.rows, parallel.video_files) == (5, 60, 5)


def test_a_second_check_demuxes_only_the_videos_changed_since(make_ds, copy_ds, monkeypatch) -> None:
    """Check demuxed every video file afresh each time (15,000 episodes: 450 files, 44 of its 71 s); the iterator
    keeps local files' indexes on disk, keyed by their stat, and so does check now: a file rewritten is read again."""
    from lerobot_dali import packet_index_cache

    root = copy_ds(make_ds(**SPEC))
    demuxed: list[str] = []
    plain = packet_index_cache.build_packet_index

    def counted(source, **kwargs):
        demuxed.append(Path(source).relative_to(root / "videos").as_posix())
        return plain(source, **kwargs)

    monkeypatch.setattr(packet_index_cache, "build_packet_index", counted)
    first = check_dataset(open_dataset(root), workers=0)
    assert first.ok and first.video_files == 6 and len(demuxed) == 6
    demuxed.clear()
    again = check_dataset(open_dataset(root), workers=0)
    assert again.ok and again.video_files == 6 and demuxed == []
    # Camera 1's second file (episodes 2 and 3) rewritten cut short, camera 0's third (episode 4) with another
    # size's video: each is demuxed again, and each damage found as on a first check.
    video = root / f"videos/{CAM1}/chunk-000/file-001.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    other = make_ds(**{**SPEC, "size": (96, 128)})
    shutil.copy(other / f"videos/{CAM0}/chunk-000/file-002.mp4", root / f"videos/{CAM0}/chunk-000/file-002.mp4")
    cut, resized = f"{CAM1}/chunk-000/file-001.mp4", f"{CAM0}/chunk-000/file-002.mp4"
    found = {(2, CAM1, "VideoDecodeError"), (3, CAM1, "VideoDecodeError"), (4, CAM0, "SchemaMismatchError")}
    demuxed.clear()
    assert _found(check_dataset(open_dataset(root), workers=0)) == found
    assert sorted(set(demuxed)) == [resized, cut]
    # A file that fails to index is never stored: each check reads it again, and finds it.
    demuxed.clear()
    assert _found(check_dataset(open_dataset(root), workers=0)) == found
    assert sorted(set(demuxed)) == [cut]


def test_damage_the_decoder_flags_is_found_by_decoding(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    video = root / f"videos/{CAM0}/chunk-000/file-001.mp4"  # episodes 2 and 3, 12 frames each
    index = build_packet_index(video)
    # The keyframe of frame 16 of the file: episode 3's second GOP (its frames 4-7 decode from it).
    position = int(np.flatnonzero(index.pts == index.frame_pts[16])[0])
    _damage_keyframe(video, index, position)
    assert check_dataset(open_dataset(root)).ok  # the packets are all there: only decoding shows it
    report = check_dataset(open_dataset(root), decode=True)
    assert _found(report) == {(3, CAM0, "VideoDecodeError")}
    assert "corrupt" in report.problems[0].message and "file-001.mp4" in report.problems[0].message
    assert report.frames_decoded == 60 * 2 - 12  # (episode 3 of camera 0 counts none)


def test_a_keyframe_that_fails_only_where_a_pass_enters_it_is_found(make_ds, copy_ds) -> None:
    """The first byte of a later AV1 keyframe damaged (its sequence header's OBU header): dav1d decodes it in one run
    from the GOP before, and refuses it after a reset, as a shuffled pass enters a GOP. Check decoded each episode
    in one run and reported nothing; the run then failed mid-epoch (a damage sweep's seed 11018)."""
    root = copy_ds(make_ds(episodes=4, frames_per_episode=20, episodes_per_file=2, size=(64, 64), codec="av1"))
    video = root / "videos/observation.images.cam0/chunk-000/file-001.mp4"  # episodes 2 and 3, GOP 2
    index = build_packet_index(video)
    position = int(index.keyframe_positions[3])  # episode 2's frame 6
    data = bytearray(video.read_bytes())
    assert data[int(index.byte_offset[position])] == 0x0A  # (an OBU header: a sequence header, sized)
    data[int(index.byte_offset[position])] = 0xDB  # (its forbidden bit set, another type)
    video.write_bytes(bytes(data))
    report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert _found(report) == {(2, "observation.images.cam0", "VideoDecodeError")}
    assert report.frames_decoded == 80 - 20
    # A pass of one frame a batch enters each GOP at its keyframe (as a shuffled pass mostly does) and fails there.
    with pytest.raises(VideoDecodeError, match=r"file-001\.mp4: decoding failed"):
        for _ in DALILeRobotIterator(root, batch_size=1, device="cpu", num_workers=0, shuffle=False, episodes=[2]):
            pass


def test_image_cameras_are_decoded_and_a_damaged_image_is_named(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(episodes=3, frames_per_episode=6, cameras=1, fps=FPS, image_cameras=True))
    assert check_dataset(open_dataset(root), decode=True).frames_decoded == 18

    larger = io.BytesIO()
    Image.new("RGB", (40, 30)).save(larger, format="PNG")

    def damage(table: pa.Table) -> pa.Table:
        images = table[CAM0].to_pylist()
        episodes = np.asarray(table["episode_index"])
        for episode, row, data in ((1, 2, b"not a png"), (2, 5, larger.getvalue())):  # garbage; another size
            rows = np.flatnonzero(episodes == episode)
            if rows.size:
                images[int(rows[row])] = {**images[int(rows[row])], "bytes": data}
        return table.set_column(table.column_names.index(CAM0), CAM0, pa.array(images, table[CAM0].type))

    _edit_rows(root, damage)
    undecoded = check_dataset(open_dataset(root))
    assert undecoded.ok and undecoded.frames_decoded == 0  # the images are only read, not decoded
    report = check_dataset(open_dataset(root), decode=True)
    assert _found(report) == {(1, CAM0, "DataFileError"), (2, CAM0, "DataFileError")}
    assert "(30, 40, 3)" in report.problems[1].message


def test_each_process_keeps_packet_indexes_up_to_256_mib() -> None:
    """A check reads every video file of a dataset (15,000 episodes of three cameras: 450 files) in each process: the
    indexes it keeps there are bounded by bytes (256 MiB) as well as by count."""
    cache = dataset_check._index_cache()
    assert (cache.max_bytes, cache.max_entries) == (256 * 2**20, 64)


def test_a_check_decodes_with_pyav_whatever_else_is_installed() -> None:
    """A check's decodes (``decode=True``) are PyAV's, as :meth:`~.cpu_decode.CpuFrameDecoder.verify` says: not the
    default backend's pick, torchcodec where it loads."""
    fields = {field.name: field for field in dataclasses.fields(dataset_check._EpisodeChecker)}
    decoder = fields["_decoder"].default_factory()
    try:
        assert decoder.options.backend is CpuDecoderBackend.PYAV
    finally:
        decoder.close()


def _images_replaced(root: Path, episode: int, rows: range | None, data: bytes) -> None:
    """Camera 0's images of ``episode`` (its ``rows``; None: all) replaced by ``data`` in the data files."""

    def replace(table: pa.Table) -> pa.Table:
        images = table[CAM0].to_pylist()
        ours = np.flatnonzero(np.asarray(table["episode_index"]) == episode)
        for row in ours if rows is None else ours[list(rows)]:
            images[int(row)] = {**images[int(row)], "bytes": data}
        return table.set_column(table.column_names.index(CAM0), CAM0, pa.array(images, table[CAM0].type))

    _edit_rows(root, replace)


def test_an_episode_whose_images_all_differ_from_the_cameras_first_is_named(make_ds, copy_ds) -> None:
    """Each episode's images agree among themselves, but a batch is one tensor: episode 1's, all 40x30, against the
    camera's first image's size."""
    root = copy_ds(make_ds(episodes=3, frames_per_episode=6, cameras=1, fps=FPS, image_cameras=True))
    smaller = io.BytesIO()
    Image.new("RGB", (40, 30)).save(smaller, format="PNG")
    _images_replaced(root, 1, None, smaller.getvalue())
    report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert _found(report) == {(1, CAM0, "DataFileError")}
    assert "images are (30, 40, 3) (H, W, C) but the camera's first image is (96, 128, 3)" in report.problems[0].message


def test_an_image_past_an_episodes_first_64_is_named_by_its_row(make_ds, copy_ds) -> None:
    """Images are decoded 64 at a time: a damaged one in the second run is named by its row of the episode (66), not
    by its place in the run (2)."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=70, cameras=1, fps=FPS, image_cameras=True))
    _images_replaced(root, 1, range(66, 67), b"not a png")
    report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert _found(report) == {(1, CAM0, "DataFileError")}
    assert "the image of the episode's row 66 cannot" in report.problems[0].message, report.problems[0].message


def test_rows_sharing_a_frame_decode_it_once_and_rows_without_task_indices_check(make_ds, copy_ds) -> None:
    """Frames decoded are the distinct ones the rows read (episode 0's rows 0 and 1 share timestamp 0: 11 of 12), and
    so are those a check again skips; a dataset whose rows hold no task_index column (none to check against the task
    list) checks as one that does."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=6, cameras=1, fps=FPS, codec="vp9", size=(64, 64)))
    _edit_rows(root, lambda table: _set_where(table, "timestamp", 0, lambda ts: np.r_[ts[0], ts[0], ts[2:]]))
    report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert report.ok and (report.rows, report.frames_decoded) == (12, 11)
    again = check_dataset(open_dataset(root), decode=True, workers=0)  # (decoded before: the same 11 counted)
    assert again.ok and (again.frames_decoded, again.frames_verified_before) == (0, 11)
    _edit_rows(root, lambda table: table.drop(["task_index"]))
    info = json.loads((root / "meta/info.json").read_text())
    del info["features"]["task_index"]
    (root / "meta/info.json").write_text(json.dumps(info))
    report = check_dataset(open_dataset(root), workers=0)
    assert report.ok and (report.episodes, report.rows) == (2, 12)


def test_real_datasets_by_each_timestamp_source() -> None:
    cr5 = open_dataset(shared_dataset("cr5_v30_av1"))
    by_timestamp = check_dataset(cr5)  # wall-clock parquet timestamps: no episode finds its frames
    assert _found(by_timestamp) == {(e, "observation.images.top", "FrameTimestampError") for e in range(12)}
    assert "frame_index / fps" in by_timestamp.problems[0].message
    capped = check_dataset(cr5, max_problems=5)  # (past it, counted only)
    assert len(capped.problems) == 5 and capped.problem_count == 12 and not capped.ok
    assert capped.problem_kinds == {"FrameTimestampError in observation.images.top": 12}
    by_index = check_dataset(cr5, timestamp_source="frame_index", decode=True)
    assert by_index.ok
    assert (by_index.episodes, by_index.rows, by_index.video_files, by_index.frames_decoded) == (12, 2733, 3, 2733)
    r1 = shared_dataset("r1_v30_h264")
    # observation.state holds 41 values, info.json declares 17; the frames are looked up still (they listed only
    # once the column was left out, with keys=).
    drifted = check_dataset(open_dataset(r1))
    assert _found(drifted) == {(0, None, "SchemaMismatchError"), (0, "observation.images.rgb", "FrameTimestampError")}
    assert "observation.state" in drifted.problems[0].message and drifted.rows == 790
    assert "--tolerance-s 0.0201" in drifted.problems[1].message
    # 10 fps rows over 25 fps video: half a frame of tolerance reads every row.
    rest = check_dataset(open_dataset(r1, keys=["action"]), tolerance_s=0.0201, decode=True)
    assert rest.ok and (rest.rows, rest.frames_decoded) == (790, 790)


def test_the_frames_of_an_episode_whose_tabular_column_is_bad_are_looked_up_still(make_ds, copy_ds) -> None:
    """A column whose values disagree with info.json failed the episode's read, and its frames went unchecked: a
    fault there showed only on a second check without the column. The lookups need the index columns alone, so one
    check lists both, and an episode whose index columns fail too is listed once."""
    root = copy_ds(make_ds(**SPEC))
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.state"]["shape"] = [99]
    (root / "meta/info.json").write_text(json.dumps(info))
    _edit_rows(root, lambda t: _set_where(t, "timestamp", 3, lambda v: v + 0.5 / FPS))
    report = check_dataset(open_dataset(root), workers=0)
    schema = {(e, None, "SchemaMismatchError") for e in range(5)}
    assert _found(report) == schema | {(3, CAM0, "FrameTimestampError"), (3, CAM1, "FrameTimestampError")}
    assert (report.episodes, report.rows, report.video_files) == (5, 60, 6)
    assert check_dataset(open_dataset(root, keys=["action"]), workers=0).problem_count == 2  # (as told without it)
    _edit_rows(root, lambda t: t.drop(["timestamp"]))  # (an index column too: each episode listed once, its rows)
    problems = check_dataset(open_dataset(root), workers=0).problems
    assert _found(SimpleNamespace(problems=problems)) == schema and len(problems) == 5
    assert all("declared feature(s) ['timestamp'] have no column" in p.message for p in problems)


def test_problems_are_listed_by_episode_where_the_data_files_hold_the_episodes_in_reverse(make_ds, copy_ds) -> None:
    """Data files 000 {4}, 001 {2, 3}, 002 {0, 1} (and the video files out of order too): the episodes are checked a
    data file at a time, so episode 4's problem is found first; the list is in episode order, then camera."""
    root = out_of_episode_order(copy_ds(make_ds(**SPEC)), [[4], [2, 3], [0, 1]])
    _edit_rows(root, lambda t: _set_where(t, "timestamp", 0, lambda v: v + 0.5 / FPS))
    _edit_rows(root, lambda t: _set_where(t, "task_index", 4, lambda v: np.where(np.arange(len(v)) == 0, 99, v)))
    report = check_dataset(open_dataset(root), workers=0)
    assert [(p.episode_index, p.camera, p.error) for p in report.problems] == [
        (0, CAM0, "FrameTimestampError"),
        (0, CAM1, "FrameTimestampError"),
        (4, None, "EpisodeMetadataError"),
    ]
    assert "file-000.parquet" in report.problems[2].message
    assert (report.episodes, report.rows, report.video_files) == (5, 60, 6)


def test_the_command_exits_by_what_it_found(make_ds, copy_ds, capsys) -> None:
    root = copy_ds(make_ds(**SPEC))
    assert main(["check", str(root)]) == 0  # (a few local episodes: checked in this process)
    assert "5 episodes, 60 rows, 6 video files" in capsys.readouterr().out
    assert main(["check", str(root), "--episodes", "0"]) == 0  # (counts of one said as one: "1 episodes" before)
    assert ": 1 episode, " in capsys.readouterr().out
    (root / f"videos/{CAM1}/chunk-000/file-001.mp4").unlink()
    assert main(["check", str(root), "--workers", "0", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["episodes"] == 5
    assert [(p["episode_index"], p["camera"], p["error"]) for p in report["problems"]] == [
        (2, CAM1, "MissingDataFileError"),
        (3, CAM1, "MissingDataFileError"),
    ]
    assert main(["check", str(root), "--workers", "0", "--show", "1"]) == 1
    out = capsys.readouterr().out
    assert "2 x MissingDataFileError in observation.images.cam1" in out and "... and 1 more" in out
    assert report["problem_count"] == 2 and report["problem_kinds"] == {
        "MissingDataFileError in observation.images.cam1": 2
    }
    assert main(["check", str(root / "nowhere")]) == 2
    assert "DatasetNotFoundError" in capsys.readouterr().err
    assert main(["check", str(root), "--workers", "-2"]) == 2
    assert capsys.readouterr().err == "lerobot-dali check: --workers must be an int >= 0 (0: this process), got -2\n"
    # Several: each in turn, one that does not open among them; the exit code is the worst.
    clean = make_ds(**SPEC)
    assert main(["check", str(clean), str(root), "--json"]) == 1
    assert [(r["source"], r["ok"], r["problem_count"]) for r in json.loads(capsys.readouterr().out)] == [
        (str(clean), True, 0),
        (str(root), False, 2),
    ]
    assert main(["check", str(clean), str(root / "nowhere"), str(root)]) == 2
    out = capsys.readouterr().out
    assert "nowhere: cannot open: DatasetNotFoundError" in out and "2 of 3 datasets have problems" in out
    # With --json stdout is the JSON alone (the line saying which did not open went there, before it, too).
    assert main(["check", str(clean), str(root / "nowhere"), "--json"]) == 2
    captured = capsys.readouterr()
    reports = json.loads(captured.out)
    assert [(r["source"], r["ok"]) for r in reports] == [(str(clean), True), (str(root / "nowhere"), False)]
    assert reports[1]["error"].startswith("DatasetNotFoundError: ")
    # (the same fields as the others': it had source, ok and error alone, and summing problem_count failed)
    assert sorted(reports[1]) == sorted([*reports[0], "error"]) and reports[1]["problem_count"] == 1
    assert reports[1]["problem_kinds"] == {"DatasetNotFoundError opening the dataset": 1}
    assert "nowhere: cannot open: DatasetNotFoundError" in captured.err
    # One the command refuses to open is said without the command's private error type ('_CommandError: ...').
    assert main(["check", str(clean), "http://127.0.0.1:1/ds#x", "--json"]) == 2
    captured = capsys.readouterr()
    said = "cannot open 'http://127.0.0.1:1/ds#x': ValueError: 'http://127.0.0.1:1/ds#x': a '#' in an http(s) URL"
    assert json.loads(captured.out)[1]["error"].startswith(said) and f"ds#x: {said}" in captured.err, captured
    # A negative --show printed all but the last problems, then "... and 3 more" of 2.
    assert main(["check", str(root), "--workers", "0", "--show", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "lerobot-dali check: --show must be an int >= 0 (problems printed in full), got -1\n", err


def test_a_remote_dataset_is_checked_as_a_local_one(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    (root / f"videos/{CAM1}/chunk-000/file-001.mp4").unlink()
    with serve_folder(root.parent) as server:
        remote = open_dataset(f"{server.url}/{root.name}")
        assert default_workers(remote, decode=False) == min(8, len(os.sched_getaffinity(0)))
        report = check_dataset(remote, decode=True, workers=2)
    assert _found(report) == {(2, CAM1, "MissingDataFileError"), (3, CAM1, "MissingDataFileError")}
    assert (report.episodes, report.rows, report.video_files, report.frames_decoded) == (5, 60, 5, 120 - 24)


def _counting_decodes(monkeypatch) -> list[tuple[str, int]]:
    """(video file under the dataset's ``videos``, first frame) of each video decode the checks in this process make."""
    from lerobot_dali.cpu_decode import CpuFrameDecoder

    decodes: list[tuple[str, int]] = []
    plain = CpuFrameDecoder.verify

    def counted(self, source, index, frame_indices, **kwargs):
        decodes.append((str(source).split("/videos/")[-1], int(np.min(frame_indices))))  # (a path, or a URL)
        return plain(self, source, index, frame_indices, **kwargs)

    monkeypatch.setattr(CpuFrameDecoder, "verify", counted)
    return decodes


def _decoded_once(make_ds, copy_ds, monkeypatch) -> tuple[Path, list[tuple[str, int]]]:
    """A copy of a SPEC dataset checked with ``decode=True`` once, and the list the decodes of later checks go to."""
    root = copy_ds(make_ds(**SPEC))
    decodes = _counting_decodes(monkeypatch)
    first = check_dataset(open_dataset(root), decode=True, workers=0)
    assert first.ok and first.frames_decoded == 120 and len(decodes) == 10  # (5 episodes x 2 cameras)
    decodes.clear()
    return root, decodes


def test_a_second_decode_check_decodes_nothing_unchanged(make_ds, copy_ds, monkeypatch) -> None:
    """Every check decoded every frame again, unchanged files too (hours for a large dataset); now a pass is kept with
    the file's stamp and the frames decoded, and a check again decodes only what changed, or failed, since."""
    root, decodes = _decoded_once(make_ds, copy_ds, monkeypatch)
    again = check_dataset(open_dataset(root), decode=True, workers=0)
    assert again.ok and decodes == []
    assert (again.frames_decoded, again.frames_verified_before, again.video_files_verified_before) == (0, 120, 6)
    assert (again.episodes, again.rows, again.video_files) == (5, 60, 6)  # (the rows are all read and looked up)


def test_a_file_changed_since_is_decoded_again(make_ds, copy_ds, monkeypatch) -> None:
    root, decodes = _decoded_once(make_ds, copy_ds, monkeypatch)
    # Camera 0's second file (episodes 2 and 3) rewritten as it was, size and mtime kept: its ctime is another.
    video = root / f"videos/{CAM0}/chunk-000/file-001.mp4"
    st = video.stat()
    video.write_bytes(video.read_bytes())
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
    rewritten = check_dataset(open_dataset(root), decode=True, workers=0)
    assert rewritten.ok and sorted(decodes) == [(f"{CAM0}/chunk-000/file-001.mp4", f) for f in (0, 12)]
    done = (rewritten.frames_decoded, rewritten.frames_verified_before, rewritten.video_files_verified_before)
    assert done == (24, 96, 5)


def test_a_file_replaced_by_a_rename_during_a_check_is_decoded_as_it_is_now(make_ds, copy_ds, monkeypatch) -> None:
    """A video replaced by a rename keeping its size and mtime (rsync -a) after a check decoded one of its episodes:
    the decoder kept open on the old file (keyed by size and mtime) decoded the next episode from it, and the pass was
    kept under the new file's stamp, so later checks skipped the new file's damaged frames (1 of 1 scripted runs)."""
    from lerobot_dali.cpu_decode import CpuFrameDecoder

    root = copy_ds(make_ds(**SPEC))
    video = root / f"videos/{CAM0}/chunk-000/file-001.mp4"  # (episodes 2 and 3)
    damaged = video.with_name("damaged.mp4")
    shutil.copy2(video, damaged)
    index = build_packet_index(damaged)
    _damage_keyframe(damaged, index, int(np.flatnonzero(index.pts == index.frame_pts[16])[0]))  # (episode 3's)
    st = video.stat()
    assert damaged.stat().st_size == st.st_size
    os.utime(damaged, ns=(st.st_atime_ns, st.st_mtime_ns))
    plain = CpuFrameDecoder.verify

    def replaced_after_episode_2(self, source, index, frame_indices, **kwargs):
        decoded = plain(self, source, index, frame_indices, **kwargs)
        if damaged.exists() and str(source) == str(video):
            os.replace(damaged, video)
        return decoded

    monkeypatch.setattr(CpuFrameDecoder, "verify", replaced_after_episode_2)
    assert _found(check_dataset(open_dataset(root), decode=True, workers=0)) == {(3, CAM0, "VideoDecodeError")}
    monkeypatch.setattr(CpuFrameDecoder, "verify", plain)
    assert _found(check_dataset(open_dataset(root), decode=True, workers=0)) == {(3, CAM0, "VideoDecodeError")}


def test_frames_that_failed_are_decoded_again_and_fail_again(make_ds, copy_ds, monkeypatch) -> None:
    root, decodes = _decoded_once(make_ds, copy_ds, monkeypatch)
    # Damaged where episode 3's frames decode from: it fails on every check, never kept as a pass; episode 2's frames
    # of the same file decode, and are not decoded again.
    video = root / f"videos/{CAM0}/chunk-000/file-001.mp4"
    index = build_packet_index(video)
    _damage_keyframe(video, index, int(np.flatnonzero(index.pts == index.frame_pts[16])[0]))
    for decoded in ([(f"{CAM0}/chunk-000/file-001.mp4", f) for f in (0, 12)], [(f"{CAM0}/chunk-000/file-001.mp4", 12)]):
        decodes.clear()
        damaged = check_dataset(open_dataset(root), decode=True, workers=0)
        assert _found(damaged) == {(3, CAM0, "VideoDecodeError")} and sorted(decodes) == decoded
    assert (damaged.frames_decoded, damaged.frames_verified_before, damaged.video_files_verified_before) == (0, 108, 5)


def test_a_decode_check_starts_its_workers_only_to_decode(make_ds, copy_ds, monkeypatch, process_starts) -> None:
    """A decode check started its workers (~1 s each) before any episode, with nothing to decode too: every frame
    decoded by an earlier check, or no camera read. They are started at the first frame to decode, the episodes
    before it checked here, and report as workers started at once do."""
    monkeypatch.setattr(dataset_check, "usable_cpus", lambda: 2)  # (two workers to decode, on any machine)
    root = copy_ds(make_ds(**SPEC))
    first = check_dataset(open_dataset(root), decode=True)  # (frames to decode from the first episode)
    assert first.ok and first.frames_decoded == 120 and process_starts
    process_starts.clear()
    again = check_dataset(open_dataset(root), decode=True)
    assert again.ok and (again.frames_decoded, again.frames_verified_before, again.video_files_verified_before) == (
        0, 120, 6
    )  # fmt: skip
    assert process_starts == []
    started = check_dataset(open_dataset(root), decode=True, workers=2)  # (told to: started, for the same report)
    assert process_starts and dataclasses.replace(started, seconds=0.0) == dataclasses.replace(again, seconds=0.0)
    process_starts.clear()
    tabular = check_dataset(open_dataset(root, cameras=[]), decode=True)
    assert tabular.ok and (tabular.episodes, tabular.rows, tabular.video_files) == (5, 60, 0) and process_starts == []
    # Camera 0's second file (episodes 2 and 3) rewritten as it was: from episode 2 on the workers check, and decode.
    video = root / f"videos/{CAM0}/chunk-000/file-001.mp4"
    video.write_bytes(video.read_bytes())
    rewritten = check_dataset(open_dataset(root), decode=True)
    done = (rewritten.frames_decoded, rewritten.frames_verified_before, rewritten.video_files_verified_before)
    assert rewritten.ok and done == (24, 96, 5) and (rewritten.episodes, rewritten.rows) == (5, 60) and process_starts
    # Images stored in the data files alike.
    images = copy_ds(make_ds(episodes=3, frames_per_episode=6, cameras=1, fps=FPS, image_cameras=True), "images")
    process_starts.clear()
    assert check_dataset(open_dataset(images), decode=True).frames_decoded == 18 and process_starts
    process_starts.clear()
    again = check_dataset(open_dataset(images), decode=True)
    assert again.ok and (again.frames_decoded, again.frames_verified_before) == (0, 18) and process_starts == []


def test_redecode_decodes_every_frame_again(make_ds, copy_ds, monkeypatch) -> None:
    root, decodes = _decoded_once(make_ds, copy_ds, monkeypatch)
    forced = check_dataset(open_dataset(root), decode=True, redecode=True, workers=0)
    assert forced.ok and len(decodes) == 10
    assert (forced.frames_decoded, forced.frames_verified_before, forced.video_files_verified_before) == (120, 0, 0)
    decodes.clear()  # (and keeps what it decoded)
    assert check_dataset(open_dataset(root), decode=True, workers=0).frames_verified_before == 120 and decodes == []


def test_images_in_data_files_decoded_before_are_not_decoded_again(make_ds, copy_ds, monkeypatch, capsys) -> None:
    """Images stored in the data files were decoded by every check, video frames not; now an episode's images of a
    camera are kept as a pass with their data file's stamp alike: not decoded again unless the file changed, the
    check is --redecode's or the file is remote, and a failure is never kept."""
    from lerobot_dali.dataset_check import _EpisodeChecker

    root = copy_ds(make_ds(episodes=3, frames_per_episode=6, cameras=1, fps=FPS, image_cameras=True))
    decodes: list[tuple[int, int]] = []
    plain = _EpisodeChecker._decode_images

    def counted(self, pos: int, camera: str, encoded: list[bytes], first_row: int):
        decodes.append((pos, first_row))
        return plain(self, pos, camera, encoded, first_row)

    monkeypatch.setattr(_EpisodeChecker, "_decode_images", counted)

    def checked(source: str | Path = root, **options) -> tuple[int, int, int]:
        decodes.clear()
        report = check_dataset(open_dataset(source), decode=True, workers=0, **options)
        assert report.ok
        return report.frames_decoded, report.frames_verified_before, len(decodes)

    assert checked() == (18, 0, 3)
    assert checked() == (0, 18, 0)
    assert main(["check", str(root), "--decode", "--workers", "0"]) == 0  # (the images' dataset has no video files)
    assert "0 frames decoded (18 frames skipped: decoded by an earlier check" in capsys.readouterr().out
    assert checked(redecode=True) == (18, 0, 3)
    for path in (root / "data").rglob("*.parquet"):  # rewritten as it was: another ctime
        path.write_bytes(path.read_bytes())
    assert checked() == (18, 0, 3)
    with serve_folder(root.parent) as server:
        assert [checked(f"{server.url}/{root.name}") for _ in range(2)] == [(18, 0, 3)] * 2

    def undecodable(self, pos: int, camera: str, encoded: list[bytes], first_row: int):
        if pos == 1:
            raise DataFileError("episode 1's images do not decode")
        return counted(self, pos, camera, encoded, first_row)

    monkeypatch.setattr(_EpisodeChecker, "_decode_images", undecodable)
    for path in (root / "data").rglob("*.parquet"):
        path.write_bytes(path.read_bytes())
    for _ in range(2):  # (episode 1's failure is not kept: each check decodes it, and fails)
        decodes.clear()
        failed = check_dataset(open_dataset(root), decode=True, workers=0)
        assert _found(failed) == {(1, CAM0, "DataFileError")}
    assert (failed.frames_decoded, failed.frames_verified_before, decodes) == (0, 12, [])


@pytest.mark.parametrize("when", ["after episode 0, its handle kept open", "just after episode 1's read, none kept"])
def test_images_of_a_data_file_replaced_by_a_rename_during_a_check_are_not_kept(
    make_ds, copy_ds, monkeypatch, when: str
) -> None:
    """A data file replaced by a rename (its episode 1's images damaged) during a check: the reader's handle kept open
    still read the old file's images, or (none kept: the data files' share of the open-file limit used up) the file
    was stamped just after their read; either way the old images' pass was kept under the new file's stamp, so later
    checks skipped the damaged images (1 of 1 scripted runs each)."""
    from lerobot_dali import open_files
    from lerobot_dali.dataset_check import _EpisodeChecker
    from lerobot_dali.dataset_reader import LeRobotDatasetReader

    root = copy_ds(make_ds(episodes=3, frames_per_episode=6, cameras=1, fps=FPS, image_cameras=True))
    data = root / "data/chunk-000/file-000.parquet"  # (episodes 0 and 1)
    table = pq.read_table(data)
    images = table[CAM0].to_pylist()
    for row in np.flatnonzero(np.asarray(table["episode_index"]) == 1):
        images[row] = {**images[row], "bytes": b"not an image"}
    damaged = data.with_name("damaged.parquet")
    pq.write_table(table.set_column(table.column_names.index(CAM0), CAM0, pa.array(images, table[CAM0].type)), damaged)

    def replaced(read, *, episode: int):
        def then_replaced(self, pos: int, *args, **kwargs):
            out = read(self, pos, *args, **kwargs)
            if pos == episode and damaged.exists():
                os.replace(damaged, data)
            return out

        return then_replaced

    decode, read = _EpisodeChecker._decode_images, LeRobotDatasetReader.read_episode_images
    if when.startswith("after episode 0"):
        monkeypatch.setattr(_EpisodeChecker, "_decode_images", replaced(decode, episode=0))
    else:
        monkeypatch.setattr(open_files.DATA_FILES, "files_for", lambda holder: 0)
        monkeypatch.setattr(LeRobotDatasetReader, "read_episode_images", replaced(read, episode=1))
    assert check_dataset(open_dataset(root), decode=True, workers=0).ok  # (the old file's images, as read)
    monkeypatch.setattr(_EpisodeChecker, "_decode_images", decode)
    monkeypatch.setattr(LeRobotDatasetReader, "read_episode_images", read)
    again = check_dataset(open_dataset(root), decode=True, workers=0)
    assert _found(again) == {(1, CAM0, "DataFileError")}


def test_passes_are_kept_per_decoder_and_frames_and_never_for_remote_files(make_ds, copy_ds, monkeypatch) -> None:
    root, decodes = _decoded_once(make_ds, copy_ds, monkeypatch)
    # Other frames of a file (one camera's rows moved a frame on, in both files that hold episodes 0-3) are decoded.
    _edit_rows(root, lambda t: _set_where(t, "timestamp", 1, lambda v: v + 1 / FPS))
    moved = check_dataset(open_dataset(root), decode=True, workers=0, tolerance_s=1.5 / FPS)  # (its last row: 0.1 s on)
    assert moved.ok and sorted(decodes) == [(f"{cam}/chunk-000/file-000.mp4", 13) for cam in (CAM0, CAM1)]
    assert (moved.frames_decoded, moved.frames_verified_before) == (2 * 11, 96)  # (frames 13-23, the last read twice)
    # Another PyAV or FFmpeg (or checks of another STORE_FORMAT) decodes everything again.
    from lerobot_dali import verified_decode_store

    monkeypatch.setattr(verified_decode_store, "decoder_versions", lambda: ["another decoder"])
    decodes.clear()
    other = check_dataset(open_dataset(root), decode=True, workers=0, tolerance_s=1.5 / FPS)
    assert other.frames_decoded == 118 and len(decodes) == 10
    # Remote files' passes are not kept: each check decodes them again.
    with serve_folder(root.parent) as server:
        for _ in range(2):
            decodes.clear()
            remote = check_dataset(
                open_dataset(f"{server.url}/{root.name}"), decode=True, workers=0, tolerance_s=1.5 / FPS
            )
            assert remote.ok and (remote.frames_decoded, remote.frames_verified_before) == (118, 0)
            assert len(decodes) == 10


def test_the_command_says_what_it_skipped_and_decodes_it_again_when_asked(make_ds, copy_ds, capsys) -> None:
    root = copy_ds(make_ds(**SPEC))
    assert main(["check", str(root), "--decode", "--workers", "2"]) == 0  # (the workers' passes are kept too)
    assert "6 video files, 120 frames decoded checked in" in capsys.readouterr().out
    assert main(["check", str(root), "--decode", "--workers", "0"]) == 0
    assert "0 frames decoded (6 video files and 120 frames skipped: decoded by an earlier check, unchanged since; " \
        "--redecode decodes them again)" in capsys.readouterr().out  # fmt: skip
    assert main(["check", str(root), "--decode", "--redecode", "--workers", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["frames_decoded"], report["frames_verified_before"], report["video_files_verified_before"]) == (
        120, 0, 0
    )  # fmt: skip
    assert main(["check", str(root), "--redecode"]) == 2
    assert (
        capsys.readouterr().err
        == "lerobot-dali check: --redecode decodes again the frames --decode skips: add --decode\n"
    )


def test_every_submit_to_the_workers_starts_them_without_the_main_module(make_ds, monkeypatch) -> None:
    """The pool starts a process at any submit while it runs fewer than it may and none is idle: a task that ended
    while the last ones started left one to start at a refill, outside skipping_main, where it imported __main__
    (the caller's script; a check of 15,000 episodes on 4 workers did). Each submit here runs its task at once,
    noting what a process started there would be told."""
    import multiprocessing.spawn
    from concurrent.futures import Future

    from lerobot_dali import dataset_check
    from lerobot_dali.worker_start import _MAIN_KEYS

    told: list[dict] = []

    class RunsAtSubmit:
        def __init__(self, workers, *, mp_context, initializer, initargs) -> None:
            initializer(*initargs)

        def __enter__(self) -> RunsAtSubmit:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def submit(self, function, *args) -> Future:
            told.append(multiprocessing.spawn.get_preparation_data("check worker"))
            future: Future = Future()
            future.set_result(function(*args))
            return future

    monkeypatch.setattr(dataset_check, "ProcessPoolExecutor", RunsAtSubmit)
    monkeypatch.setattr(dataset_check, "log_like_trainer", lambda level: None)  # (this process's logging kept)
    monkeypatch.setattr(dataset_check, "_WORKER_CHECKER", None)  # (given back after)
    report = check_dataset(open_dataset(make_ds(**SPEC)), workers=1)
    assert report.ok and report.episodes == 5
    assert len(told) == 3  # (tasks of 2 episodes: two submitted first, one at a refill)
    assert not [data for data in told if any(key in data for key in _MAIN_KEYS)]


def test_the_workers_read_the_checker_from_a_file_not_down_their_starts(make_ds, process_starts) -> None:
    """Sent down each process's start (a pipe of 64 KiB), 15,000 episodes' checker (~0.8 MB) held each start until
    the process had imported lerobot-dali and read it, one after another (0.7-1.4 s each of 4): its file's name is
    sent instead, the file removed once the pool is done."""
    import os

    from lerobot_dali.worker_source import PREFIX

    report = check_dataset(open_dataset(make_ds(**SPEC)), workers=1)
    assert report.ok and report.episodes == 5
    sent = [args[3][0] for args in process_starts]  # (ProcessPoolExecutor's: queues, initializer, its arguments, ...)
    assert len(sent) == 1 and isinstance(sent[0], bytes), sent
    assert os.path.basename(sent[0]).startswith(PREFIX.encode()) and not os.path.exists(sent[0])


def test_statistics_a_run_would_normalise_wrong_by_are_warned_of(make_ds, copy_ds, caplog) -> None:
    """meta/stats.json was never looked at: a NaN mean (train.py refuses it), a mean of 6 values for the 7 of action,
    a min above its max and a camera's negative std (normalising by them turns values wrong in silence), a mean
    without its std (LeRobot's normalising fails) checked as sound, unsaid (0 of 5). Now one warning names each
    feature and entry; features the run does not read are left out. A pass that does not normalise reads such a
    dataset whole, so they are no episode's problem (exit 0)."""
    root = copy_ds(make_ds(**SPEC))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["mean"][2] = float("nan")
    stats["action"]["mean"] = stats["action"]["mean"][:6]
    stats["timestamp"]["min"] = [stats["timestamp"]["max"][0] + 1.0]
    stats[CAM0]["std"][1] = [[-0.5]]
    del stats["frame_index"]["std"]  # (LeRobot's MEAN_STD normalisation of it raises ValueError)
    (root / "meta/stats.json").write_text(json.dumps(stats))

    def warned(dataset: Path, **selection) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_check"):
            assert check_dataset(open_dataset(dataset, **selection), workers=0).ok
        return [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.dataset_check"]

    (message,) = warned(root)
    assert "'observation.state': mean is not finite (NaN or infinity)" in message
    assert "'action': mean has shape (6,), but the feature's is (7,) in info.json" in message
    assert "'timestamp': min is above max at components [0]" in message
    assert f"'{CAM0}': std is negative at components [1]" in message
    assert "'frame_index': mean without std: LeRobot's MEAN_STD normalisation fails on it (a ValueError)" in message
    (message,) = warned(root, keys=["action"], cameras=[CAM1])
    assert "'action'" in message and "observation.state" not in message and CAM0 not in message
    (root / "meta/stats.json").write_text("{")
    (message,) = warned(root)
    assert "its statistics do not read" in message and "is not valid JSON" in message
    assert warned(make_ds(**SPEC)) == []


def test_what_info_json_declares_unlike_the_files_is_warned_of(make_ds, copy_ds, caplog) -> None:
    """info.json's video.codec and video.fps were never compared with the files (r1_v30_h264 declares 10 fps for 25
    fps video): now check warns, per camera, of what its first file does not hold; it reads the files as they are,
    so the dataset has no problem (exit 0), and a camera info.json describes right is not named."""
    root = copy_ds(make_ds(**SPEC))
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][CAM1]["info"].update({"video.codec": "av1", "video.fps": 25})
    (root / "meta/info.json").write_text(json.dumps(info))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_check"):
        assert check_dataset(open_dataset(root), workers=0).ok
    (message,) = [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.dataset_check"]
    assert f"camera '{CAM1}': info.json declares video.codec 'av1' (the file: h264), video.fps 25 (the file: 10): " in (
        message
    )


def test_statistics_not_finite_are_warned_of_once(make_ds, copy_ds, caplog) -> None:
    """A NaN mean was warned of twice by check: the statistics reader's own warning, then check's list of faults."""
    root = copy_ds(make_ds(**SPEC))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["mean"][2] = float("nan")
    (root / "meta/stats.json").write_text(json.dumps(stats))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        assert check_dataset(open_dataset(root), workers=0).ok
    said = [r for r in caplog.records if "not finite" in r.getMessage()]
    assert [r.name for r in said] == ["lerobot_dali.dataset_check"]


def test_statistics_of_each_dataset_in_a_nested_union_are_looked_at(make_ds, tmp_path, caplog) -> None:
    """A union within a union had its statistics read from its own location, its first dataset's: a NaN mean in its
    second dataset was never warned of (1 of 2 faulty datasets said), and the first's were said under the inner
    union's name."""
    from lerobot_dali.dataset_union import concat_datasets

    roots = []
    for n in range(3):
        roots.append(tmp_path / f"d{n}")
        shutil.copytree(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"), roots[-1])
    for root in roots[1:]:
        stats = json.loads((root / "meta/stats.json").read_text())
        stats["observation.state"]["mean"][0] = float("nan")
        (root / "meta/stats.json").write_text(json.dumps(stats))
    union = concat_datasets([concat_datasets([roots[0], roots[1]]), roots[2]])
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_check"):
        assert check_dataset(union, workers=0).ok
    said = [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.dataset_check"]
    assert [m.split(": statistics")[0] for m in said] == [str(roots[1]), str(roots[2])]
    assert all("'observation.state': mean is not finite" in m for m in said)
