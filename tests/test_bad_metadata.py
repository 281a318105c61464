"""Metadata and files that disagree in ways that used to pass silently (wrong data) or fail obscurely: each now
fails with a specific exception naming the file and the fix. The cases come from a review's repros."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali.batch_source import CameraFormat
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.dataset_info import DatasetInfo
from lerobot_dali.dataset_location import resolve_location
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.dataset_stats import read_dataset_stats
from lerobot_dali.decode_route import DecodeRoute
from lerobot_dali.episode_table import CameraFiles, check_video_starts
from lerobot_dali.errors import (
    DataFileError,
    DatasetError,
    EpisodeMetadataError,
    FrameTimestampError,
    SchemaMismatchError,
)
from lerobot_dali.generate import text_list_table
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index import PacketIndex, build_packet_index

SPEC = dict(episodes=4, frames_per_episode=20, cameras=1, codec="vp9", fps=10, gop=4, episodes_per_file=2)
CAM = "observation.images.cam0"


@pytest.fixture
def ds(make_ds, copy_ds) -> Path:
    return copy_ds(make_ds(**SPEC, size=(64, 96)))


def _first_pass(root: Path, **kwargs) -> list[dict]:
    it = DALILeRobotIterator(root, **{"batch_size": 4, "shuffle": False, "device": "cpu", "num_workers": 0, **kwargs})
    try:
        return list(it)
    finally:
        it.close()


def _episodes_file(root: Path) -> Path:
    return next((root / "meta/episodes").rglob("*.parquet"))


def _set_episode_column(root: Path, column: str, episode: int, value: float) -> None:
    path = _episodes_file(root)
    table = pq.read_table(path)
    values = table[column].to_pylist()
    values[episode] = value
    pq.write_table(
        table.set_column(table.column_names.index(column), column, pa.array(values, table[column].type)), path
    )


def _rewrite_data(root: Path, edit) -> None:
    for path in sorted((root / "data").rglob("*.parquet")):
        pq.write_table(edit(pq.read_table(path)), path)


def test_a_video_file_of_another_size_names_itself(make_ds, ds: Path) -> None:
    """It failed with DALI's bare 'IsDenseTensor' assert, or, when no batch mixed the files, changed the
    camera's shape mid-epoch."""
    other = make_ds(**SPEC, size=(96, 128))
    shutil.copy(other / f"videos/{CAM}/chunk-000/file-001.mp4", ds / f"videos/{CAM}/chunk-000/file-001.mp4")
    pattern = r"file-001\.mp4 \(episode 2, camera 'observation\.images\.cam0'\) is vp9 96x128 \(HxW\), but the camera"
    with pytest.raises(SchemaMismatchError, match=pattern):
        _first_pass(ds)


def test_a_first_video_file_of_another_size_than_info_json_and_the_others_is_the_one_named(make_ds, ds: Path) -> None:
    """The first file replaced by one of another size was called the norm: the others, of info.json's size, were named
    to be re-encoded at the odd file's size."""
    other = make_ds(**SPEC, size=(96, 128))
    shutil.copy(other / f"videos/{CAM}/chunk-000/file-000.mp4", ds / f"videos/{CAM}/chunk-000/file-000.mp4")
    pattern = (
        r"file-000\.mp4 \(episode 0, camera 'observation\.images\.cam0'\) is vp9 96x128 \(HxW\), but info\.json "
        r"declares 64x96 \(HxW\) frames for the camera, as its other files hold; .*re-encode these files at 64x96$"
    )
    with pytest.raises(SchemaMismatchError, match=pattern):
        _first_pass(ds)


@pytest.mark.parametrize("declared", ["shape", "video"])
def test_videos_of_another_size_than_info_json_declares_are_warned_of_once(ds: Path, declared: str, caplog) -> None:
    """info.json declaring 480x640 for 64x96 videos passed in silence: batches carry the videos' size (as LeRobot's,
    which decode the files), and a policy whose input shapes come from info.json failed at its first step, far
    from the cause. Said once when the iterator is built, by either of info.json's two places for the size."""
    info_path = ds / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    feature = info["features"][CAM]
    video = feature.get("info") or feature.get("video_info") or {}
    assert feature["shape"] == [64, 96, 3] and video.get("video.height") in (64, None)
    if declared == "shape":
        feature["shape"] = [480, 640, 3]
        video.pop("video.height", None), video.pop("video.width", None)
    else:
        video.update({"video.height": 480, "video.width": 640})
        feature["info"] = video
    info_path.write_text(json.dumps(info))
    with caplog.at_level("WARNING", logger="lerobot_dali.camera_plan"):
        batches = _first_pass(ds, image_size=(32, 48))
    assert {tuple(b[CAM].shape[1:]) for b in batches} == {(3, 32, 48)}
    (said,) = [r.getMessage() for r in caplog.records if "info.json declares" in r.getMessage()]
    # (height x width, as a file of another size's error says them: it said "640x480 frames ... hold 96x64", WxH)
    assert said.startswith(f"camera '{CAM}': info.json declares 480x640 (HxW) frames, its videos hold 64x96 (")
    assert "before image_size resizes them" in said


def test_a_camera_on_nvdec_holds_every_file_to_its_first_files_pixel_format_and_colour(
    marker_video, tmp_path: Path
) -> None:
    """NVDEC was probed with the first file, and the graph corrects its colours for the first file's tags: a later
    4:4:4 file would reach NVDEC unprobed, a later BT.709 file would go uncorrected. The CPU decoders convert any
    pixel format and colour space (and each file has a decoder of its own), so there only the size must agree."""
    import av

    first = build_packet_index(marker_video("h264", 2))

    def encode(name: str, pix_fmt: str, colorspace: int | None = None) -> PacketIndex:
        path = tmp_path / name
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=10, options={"g": "2"})
            stream.width, stream.height, stream.pix_fmt = first.width, first.height, pix_fmt
            if colorspace is not None:
                stream.codec_context.colorspace = colorspace
            for frame in range(4):
                image = np.full((first.height, first.width, 3), 40 * frame, np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            container.mux(stream.encode())
        return build_packet_index(path)

    yuv444, bt709 = encode("yuv444.mp4", "yuv444p"), encode("bt709.mp4", "yuv420p", colorspace=1)
    assert (first.pix_fmt, yuv444.pix_fmt) == ("yuv420p", "yuv444p")
    on_nvdec, on_cpu = (
        CameraFormat.of(first, route=DecodeRoute.NVDEC),
        CameraFormat.of(first, route=DecodeRoute.CPU_FALLBACK),
    )
    assert on_nvdec.admits(first) and not on_nvdec.admits(yuv444) and not on_nvdec.admits(bt709)
    assert on_cpu.admits(yuv444) and on_cpu.admits(bt709)
    assert str(on_nvdec) == "h264 64x96 (HxW) yuv420p, colour space 2" and str(on_cpu) == "h264 64x96 (HxW)"
    assert str(CameraFormat.of(bt709, route=DecodeRoute.NVDEC)) == "h264 64x96 (HxW) yuv420p, colour space 1"


def test_rows_the_metadata_does_not_count_are_refused(ds: Path) -> None:
    """Episode 3 said 17 rows where its file's part held 20: frames 17-19 were never served."""
    _set_episode_column(ds, "length", 3, 17)
    _set_episode_column(ds, "dataset_to_index", 3, 77)
    with pytest.raises(EpisodeMetadataError, match=r"places 37 rows in .*file-001\.parquet, which holds 40 .*17"):
        _first_pass(ds)


def _markers(batches: list[dict]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(marker read from each sample's frame, the sample's (episode, frame)) of every sample of ``batches``."""
    from lerobot_dali.frame_marker import read_marker

    return [
        (read_marker(image.numpy()), (int(episode), int(frame)))
        for batch in batches
        for image, episode, frame in zip(batch[CAM], batch["episode_index"], batch["frame_index"], strict=True)
    ]


def test_a_stale_to_timestamp_changes_nothing_read_or_refused(ds: Path) -> None:
    """A v3 to_timestamp that disagrees with from_timestamp + length / fps, which LeRobot never reads (it reads each
    frame at from_timestamp + timestamp): 5 frames early (episode 0) refused the episode's last 5 rows (check: a
    FrameTimestampError; the iterator raised at its first pass), and 10 frames late on a file's first episode
    (episode 2, reaching into episode 3's seconds) refused the dataset at open, though LeRobot reads both right. The
    episode's part of its file now ends where the next episode starts: every sample reads its own frame (80 of 80),
    check finds no problem, and prefetch fetches the same bytes as before."""
    from lerobot_dali.episode_ranges import EpisodeRanges

    sound = EpisodeRanges(open_dataset(ds))
    fetched = [sound.video_ranges(pos) for pos in range(4)]
    _set_episode_column(ds, f"videos/{CAM}/to_timestamp", 0, 1.5)  # (20 rows at 10 fps from 0 s: 2.0)
    _set_episode_column(ds, f"videos/{CAM}/to_timestamp", 1, 5.0)  # (from 2.0 s: 4.0, its file's last)
    _set_episode_column(ds, f"videos/{CAM}/to_timestamp", 2, 3.0)  # (from 0 s of file 1; episode 3 starts at 2.0)
    report = check_dataset(open_dataset(ds), workers=0)
    assert report.problems == []
    samples = _markers(_first_pass(ds, return_uint8=True))
    assert len(samples) == 80 and all(read == row for read, row in samples)
    stale = EpisodeRanges(open_dataset(ds))
    assert [stale.video_ranges(pos) for pos in range(4)] == fetched


@pytest.mark.parametrize("to_timestamp", ["written", "absent"])
def test_rows_past_a_short_video_into_the_next_episode_are_refused(ds: Path, to_timestamp: str) -> None:
    """Episode 0's video holding 15 frames for its 20 rows (episode 1 starts at 1.5 s of the file): its last 5 rows
    would read episode 1's frames. Refused by where the next episode starts, whether meta/episodes writes to_timestamp
    or not (without it, nothing bounded the episode and its rows read episode 1's first 5 frames in silence), and
    with episode 1 left out of the selection too."""
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 1, 1.5)
    if to_timestamp == "written":
        _set_episode_column(ds, f"videos/{CAM}/to_timestamp", 0, 1.5)
    else:
        path = _episodes_file(ds)
        pq.write_table(pq.read_table(path).drop_columns([f"videos/{CAM}/to_timestamp"]), path)
    report = check_dataset(open_dataset(ds), workers=0)
    assert [(p.episode_index, p.error) for p in report.problems] == [(0, "FrameTimestampError")]
    said = (
        "outside this episode's part of the file (0.000000 s to 1.500000 s, where the next episode of the file starts; "
        "5 of 20 queries): that frame belongs to a neighbouring episode, the next in the file (from its "
        "from_timestamp 1.500000 s on). By meta/episodes this episode's 20 rows at 10 fps from its from_timestamp "
        "0.000000 s end at 2.000000 s, 5 frames past that start, where the file's frames go on: the video is not "
        "short, meta/episodes is: the next episode's from_timestamp is most likely 5 frames early (2.000000 s, where "
        "these rows end), or the episode has 5 rows more than its part of the file holds frames"
    )
    assert said in report.problems[0].message
    # The iterator refuses it when built, from the metadata (the check above looked the rows up in the video).
    said = (
        "episode 0's rows run past its part of {}: its 20 rows at 10 fps from its from_timestamp 0.000000 s end at "
        "1.900000 s, but the next episode of the file starts at 1.500000 s (its from_timestamp), so its last 5 rows "
        "would read that episode's frames."
    )
    with pytest.raises(FrameTimestampError, match=re.escape(said.format(ds / f"videos/{CAM}/chunk-000/file-000.mp4"))):
        _first_pass(ds, episodes=[0])


@pytest.mark.parametrize("workers", [0, 1])
def test_a_files_last_episode_starting_two_frames_late_is_told_so_not_that_the_video_is_truncated(
    ds: Path, workers: int
) -> None:
    """Episode 1, the last of file-000, from_timestamp 2.2 s where episode 0's 20 rows end at 2 s (10 fps): its last
    2 rows lie past the file's frames, and the video was said to be 'most likely truncated (a partial download or
    copy)'. The file's 2 frames between the episodes are no episode's: the from_timestamp is named 2 frames late."""
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 1, 2.2)
    with pytest.raises(FrameTimestampError) as info:
        _first_pass(ds, num_workers=workers)
    message = str(info.value)
    assert "episode 1" in message and "most likely truncated" not in message, message
    # (refused when the iterator is built, from the file's header: tests/test_file_timing.py)
    assert message.endswith(
        "ends at 4.000000 s (its header: 10 fps), but episode 1, its last, has 20 rows at 10 fps from its "
        "from_timestamp 2.200000 s, the last at 4.100000 s: the file is not cut short, its frames from where the "
        "episode before it ends (its from_timestamp + its length / fps) to this episode's from_timestamp are no "
        "episode's: the episode's from_timestamp in meta/episodes is most likely 2 frames late (2.000000 s ends its "
        f"rows at the file's last frame): correct videos/{CAM}/from_timestamp in meta/episodes, or leave the episode "
        "out with episodes=[...]"
    ), message
    # The lookup, which check_dataset runs on every row, tells it alike from the file's frames.
    report = check_dataset(open_dataset(ds), workers=0)
    assert [(p.episode_index, p.error) for p in report.problems] == [(1, "FrameTimestampError")]
    assert report.problems[0].message.endswith(
        "its 2 frames from 2.000000 s, where the episode before it in the file ends (its from_timestamp + its length "
        "/ fps), to this episode's from_timestamp are no episode's. The episode's from_timestamp in meta/episodes is "
        "most likely 2 frames late (2.000000 s ends its rows at the file's last frame), or the episode has 2 rows more "
        f"than the file holds frames: correct videos/{CAM}/from_timestamp in meta/episodes, or leave the episode out "
        "with episodes=[...]."
    ), report.problems[0].message


def test_episodes_claiming_the_same_seconds_of_a_video_file_are_refused(ds: Path) -> None:
    """Episode 3 pointed at episode 2's seconds and served episode 2's frames as its own. Refused where either is
    selected (naming both and the file); the other file's episodes still read."""
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 3, 0.0)
    _set_episode_column(ds, f"videos/{CAM}/to_timestamp", 3, 2.0)
    said = r"episodes 2 and 3 start at 0\.000000 s and 0\.000000 s of video file chunk 0 file 1 \(from_timestamp\)"
    for episodes in (None, [3], [0, 2]):
        with pytest.raises(EpisodeMetadataError, match=said):
            open_dataset(ds, episodes=episodes)
    samples = _markers(_first_pass(ds, episodes=[0, 1], return_uint8=True))
    assert len(samples) == 40 and all(read == row for read, row in samples)


def test_episodes_starting_less_than_half_a_frame_apart_are_refused_at_open(ds: Path) -> None:
    """Episode 3 starting 0.04 s after episode 2 in their file (10 fps: half a frame is 0.05 s) opened, and was
    refused only as episode 2's rows were looked up (its part of the file held no frame), possibly hours into
    training; episode 3 alone read episode 2's frames from 0.04 s on (nearest 0.0 s: refused by tolerance only).
    Now refused as the dataset opens, naming both episodes and the file; 0.06 s apart opens (lookup refuses it)."""
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 3, 0.04)
    said = (
        r"episodes 2 and 3 start at 0\.000000 s and 0\.040000 s of video file chunk 0 file 1 .*less than half a frame"
    )
    with pytest.raises(EpisodeMetadataError, match=said):
        open_dataset(ds)
    with pytest.raises(EpisodeMetadataError, match=said):
        open_dataset(ds, episodes=[3])
    assert open_dataset(ds, episodes=[0, 1]).num_episodes == 2
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 3, 0.06)
    assert open_dataset(ds).num_episodes == 4


@pytest.mark.parametrize(("video_fps", "opens", "refused"), [(20, 0.04, 0.02), (5, 0.06, 0.04)])
def test_half_a_frame_is_of_the_faster_of_the_rows_and_the_declared_video_rate(
    ds: Path, video_fps: int, opens: float, refused: float
) -> None:
    """The bound on two starts is half a frame at the faster rate: 10 fps rows over a video declared 20 fps (half a
    frame 0.025 s) open with starts 0.04 s apart and refuse 0.02 s; declared 5 fps, the rows' 10 fps bounds it (0.05 s):
    0.06 s apart opens, 0.04 s is refused. Half a frame at the slower rate would refuse 0.04 s and 0.06 s."""
    info = json.loads((ds / "meta/info.json").read_text())
    info["features"][CAM]["info"]["video.fps"] = video_fps
    (ds / "meta/info.json").write_text(json.dumps(info))
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 3, opens)
    assert open_dataset(ds).num_episodes == 4
    _set_episode_column(ds, f"videos/{CAM}/from_timestamp", 3, refused)
    said = re.escape(f"episodes 2 and 3 start at 0.000000 s and {refused:.6f} s of video file chunk 0 file 1 (")
    with pytest.raises(EpisodeMetadataError, match=said + ".*less than half a frame"):
        open_dataset(ds)


class _Episodes(SimpleNamespace):
    """What check_video_starts reads of an episode table."""

    def __len__(self) -> int:
        return len(self.episode_index)


def _check_starts(starts: list[float], files: list[int], *, episodes: list[int] | None = None) -> None:
    """check_video_starts over episodes 0, 1, ... from ``starts`` s of chunk 0's video files ``files``, at 10 fps."""
    start, file = np.asarray(starts, dtype=np.float64), np.asarray(files, dtype=np.int64)
    later = [start[(file == file[i]) & (start > start[i])] for i in range(len(start))]
    following = np.array([s.min() if s.size else np.nan for s in later])
    table = _Episodes(episode_index=np.arange(len(start)), cameras={CAM: CameraFiles(0 * file, file, start, following)})
    info = SimpleNamespace(fps=10.0, features={CAM: SimpleNamespace(declared_fps=None)})
    info.fastest_fps = partial(DatasetInfo.fastest_fps, info)  # (the real rule over the stand-in's features)
    check_video_starts(table, info, source="ds", episodes=episodes)


def _close_starts(a: int, b: int, start_a: float, start_b: float, file: int) -> str:
    return (
        f"ds: camera '{CAM}': episodes {a} and {b} start at {start_a:.6f} s and {start_b:.6f} s of video file chunk 0 "
        f"file {file} (from_timestamp), less than half a frame apart: episode {a} holds no frame of its own, and one "
        "of the two starts is wrong (a row of either would read the other's frame); leave both out with "
        "episodes=[...], or regenerate the episode metadata"
    )


def test_starts_exactly_half_a_frame_apart_are_not_close() -> None:
    """At 10 fps half a frame is 0.05 s: starts 0.05 s apart are not less than it (each has its frame), 0.0499 s are."""
    _check_starts([0.0, 0.05], [0, 0])
    with pytest.raises(EpisodeMetadataError) as info:
        _check_starts([0.0, 0.0499], [0, 0])
    assert str(info.value) == _close_starts(0, 1, 0.0, 0.0499, 0)


@pytest.mark.parametrize(("episodes", "refused"), [(None, True), ([2], True), ([0], True), ([1, 3], False)])
def test_close_starts_name_the_next_episode_of_the_file_by_start_not_index(
    episodes: list[int] | None, refused: bool
) -> None:
    """File 1 holds episodes 0 (from 1.0 s), 1 (0.0 s) and 2 (1.02 s), file 0 episode 3: episode 0's next in its file is
    2, 0.02 s on. Named as such where either is selected; episodes 1 and 3 alone open."""
    starts, files = [1.0, 0.0, 1.02, 1.01], [1, 1, 1, 0]
    if not refused:
        _check_starts(starts, files, episodes=episodes)
        return
    with pytest.raises(EpisodeMetadataError) as info:
        _check_starts(starts, files, episodes=episodes)
    assert str(info.value) == _close_starts(0, 2, 1.0, 1.02, 1)


def test_of_several_close_starts_the_first_pair_is_named() -> None:
    """Episodes 0 and 1 start 0.02 s apart, 2 and 3 0.03 s: the first pair is named."""
    with pytest.raises(EpisodeMetadataError) as info:
        _check_starts([0.0, 0.02, 1.0, 1.03], [0, 0, 0, 0])
    assert str(info.value) == _close_starts(0, 1, 0.0, 0.02, 0)


def test_of_several_unknown_starts_in_a_file_the_first_is_named() -> None:
    """Episodes 1 and 2 of episode 0's file have no from_timestamp: the first, 1, is named as where 0 may end."""
    with pytest.raises(EpisodeMetadataError) as info:
        _check_starts([0.0, float("nan"), float("nan")], [0, 0, 0])
    assert str(info.value) == (
        f"ds: camera '{CAM}': where episode 0's part of video file chunk 0 file 0 lies is unknown: column "
        f"'videos/{CAM}/from_timestamp' is missing or not finite for episode 1 of the same file (where it may end) "
        "(2 episode(s) in all); leave those episodes and the others of their video files out with episodes=[...], "
        "or download or copy ds again"
    )


def _set_fps(root: Path, fps: int) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = fps
    (root / "meta/info.json").write_text(json.dumps(info))


@pytest.mark.parametrize("fps", [20, 14, 13])
def test_an_fps_that_disagrees_with_the_timestamps_is_refused(ds: Path, fps: int) -> None:
    """fps 20 over 10 fps rows turned a -0.05 s window into the row 0.1 s back. (13: 30% off, past the 25% refused.)"""
    _set_fps(ds, fps)
    with pytest.raises(DatasetError, match=rf"rows are 0\.100000 s apart \(median\), but info\.json's fps {fps}"):
        _first_pass(ds)


def test_an_fps_the_timestamps_refuse_is_said_before_deltas_held_to_it(ds: Path) -> None:
    """fps 5 over 10 fps rows, with a window of whole 10 fps frames: the deltas were refused first, 'not a multiple
    of 1/fps (fps=5.0) ... give each offset as k / 5 s', the user told to change the right window to fit the wrong
    fps; the rows' refusal, to fix fps in meta/info.json, came only once they had."""
    _set_fps(ds, 5)
    with pytest.raises(DatasetError, match=r"rows are 0\.100000 s apart \(median\), but info\.json's fps 5 .*fix fps"):
        _first_pass(ds, delta_timestamps={"action": [-0.1, 0.0]})


@pytest.mark.parametrize("rows", [3, 2])
def test_an_episode_of_three_rows_is_held_to_the_fps(make_ds, copy_ds, rows: int) -> None:
    """Two steps between its rows have a median: an episode of 3 rows is checked as a longer one is. One of 2 rows
    has one step, no median: it is read, unchecked."""
    root = copy_ds(make_ds(**{**SPEC, "frames_per_episode": rows, "cameras": 0}))
    _set_fps(root, 20)
    if rows == 2:
        assert open_dataset(root).read_episode(1)["timestamp"].tolist() == pytest.approx([0.0, 0.1])
        return
    with pytest.raises(
        DatasetError, match=r"episode 1's rows are 0\.100000 s apart \(median\), but info\.json's fps 20"
    ):
        open_dataset(root).read_episode(1)


@pytest.mark.parametrize("fps", [12, 8])
def test_an_fps_20_percent_off_the_timestamps_is_warned_once(ds: Path, fps: int, caplog) -> None:
    """20% off is a common rate mislabelled (25 for 30: every window scaled by 1.2), which passed in silence, or
    a recording loop slower than its nominal rate, which reads right by frame_index: warned, not refused."""
    _set_fps(ds, fps)
    reader = open_dataset(ds)
    with caplog.at_level("WARNING", logger="lerobot_dali.dataset_reader"):
        for episode in range(reader.num_episodes):
            reader.read_episode(episode)
    (warning,) = [r.getMessage() for r in caplog.records if "apart (median)" in r.getMessage()]
    assert f"but info.json's fps {fps} says" in warning and "(20% off)" in warning
    assert "fix it in meta/info.json" in warning and "timestamp_source='frame_index'" in warning


def _set_value(root: Path, column: str, row: int, value, kind: pa.DataType) -> None:
    """Row ``row`` of the second data file (episodes 2 and 3, 20 rows each) set to ``value``."""
    path = sorted((root / "data").rglob("*.parquet"))[1]
    table = pq.read_table(path)
    values = table[column].to_pylist()
    values[row] = value
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values, kind)), path)


@pytest.mark.parametrize(
    ("column", "value", "kind", "error", "pattern"),
    [
        # NaN is neither > 0 nor <= 0: the order check raised a bare IndexError
        ("timestamp", float("nan"), pa.float32(), EpisodeMetadataError,
         r"episode 3's timestamp at its row 7 is not a finite number \(nan"),
        ("timestamp", None, pa.float32(), SchemaMismatchError, r"column 'timestamp' has 1 null row\(s\)"),
        # read as NaN, then refused as a "fractional value"
        ("frame_index", None, pa.int64(), SchemaMismatchError, r"column 'frame_index' has 1 null row\(s\)"),
        # read as NaN, silently
        ("observation.state", [None, 0.0, 0.0, 0.0, 0.0, 0.0], pa.list_(pa.float32()), SchemaMismatchError,
         r"column 'observation\.state' has 1 null value\(s\) inside its vectors"),
        # said what is wrong only
        ("observation.state", None, pa.list_(pa.float32()), SchemaMismatchError,
         r"column 'observation\.state' has 1 null row\(s\); rewrite the data file without them$"),
    ],
    ids=["nan-timestamp", "null-timestamp", "null-int", "null-in-vector", "null-vector"],
)  # fmt: skip
def test_missing_values_are_refused_naming_the_column(ds: Path, column, value, kind, error, pattern) -> None:
    _set_value(ds, column, 27, value, kind)  # episode 3's row 7
    reader = open_dataset(ds)
    reader.read_episode(2)
    with pytest.raises(error, match=pattern):
        reader.read_episode(3)


def test_a_signalling_nan_timestamp_is_refused_without_a_numpy_warning(ds: Path) -> None:
    """Damaged float32 bytes can make a signalling NaN, whose cast to float64 made numpy warn ("invalid value
    encountered in cast") in front of the error (a damage sweep's seed 11212)."""
    path = sorted((ds / "data").rglob("*.parquet"))[1]
    table = pq.read_table(path)
    timestamps = table["timestamp"].to_numpy().copy()
    timestamps.view(np.uint32)[27] = 0x7F800001  # episode 3's row 7
    pq.write_table(table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(timestamps)), path)
    reader = open_dataset(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(EpisodeMetadataError, match=r"episode 3's timestamp at its row 7 is not a finite number"):
            reader.read_episode(3)


@pytest.mark.parametrize(
    ("held", "said"),
    [([40] * 5 + [7] * 15, "at its row 1 (40 then 40)"), ([40, 41, 42] + [7] * 17, "at its row 3 (42 then 7)")],
)
def test_a_v2_index_column_that_repeats_is_refused(make_ds, copy_ds, held: list[int], said: str) -> None:
    """v2.x metadata has no index range, and an episode whose rows all said index 0 was read: 46 samples came
    to the trainer as index 0. The error names the first row that does not rise by 1, after the row before it."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "data/chunk-000/episode_000002.parquet"
    table = pq.read_table(path)
    table = table.set_column(table.column_names.index("index"), "index", pa.array(held, pa.int64()))
    pq.write_table(table, path)
    reader = open_dataset(root)
    np.testing.assert_array_equal(reader.read_episode(1)["index"], np.arange(20, 40))
    with pytest.raises(EpisodeMetadataError, match=re.escape(f"episode 2's 'index' column does not rise by 1 {said};")):
        reader.read_episode(2)


def test_rows_out_of_time_order_are_refused(ds: Path) -> None:
    def swap(table: pa.Table) -> pa.Table:
        ts = table["timestamp"].to_pylist()
        ts[5], ts[6] = ts[6], ts[5]
        return table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(ts, pa.float32()))

    _rewrite_data(ds, swap)
    advice = r"the rows are out of order: rewrite the data file .*, or leave episode 0 out \(episodes=\[\.\.\.\]\)$"
    with pytest.raises(DatasetError, match=r"episode 0's timestamps go back at its row 6 .*" + advice):
        _first_pass(ds)
    # As told: the episodes whose rows are in order still read (rows 5 and 6 of each file are episodes 0 and 2's).
    assert sum(len(batch["index"]) for batch in _first_pass(ds, episodes=[1, 3])) == 40


def test_rows_that_share_a_timestamp_are_read_as_lerobot_reads_them(make_ds, copy_ds, caplog) -> None:
    """Two rows at one time (a recorder that logged one camera frame twice) were refused as "out of order", even
    read by frame_index. LeRobot reads them, both rows the frame their timestamp finds; so do these, with a warning
    that says so and how to read each row's own frame."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=[12, 10], codec="vp9", size=(64, 64), episodes_per_file=2))
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    ts = table["timestamp"].to_pylist()
    ts[6] = ts[5]
    pq.write_table(
        table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(ts, pa.float32())), path
    )
    frames = {}
    for source in ("parquet_timestamp", "frame_index"):
        with caplog.at_level("WARNING", logger="lerobot_dali.dataset_reader"):
            it = DALILeRobotIterator(
                root, batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False, return_uint8=True,
                timestamp_source=source,
            )  # fmt: skip
            batches = list(it)
            it.close()
        index = torch.cat([b["index"] for b in batches]).tolist()
        assert index == list(range(22))
        frames[source] = torch.cat([b["observation.images.cam0"] for b in batches])
        assert torch.cat([b["timestamp"] for b in batches])[6].item() == pytest.approx(ts[5])
    assert torch.equal(frames["parquet_timestamp"][6], frames["parquet_timestamp"][5])  # (LeRobot's: the same frame)
    assert torch.equal(frames["frame_index"][5], frames["parquet_timestamp"][5])
    assert not torch.equal(frames["frame_index"][6], frames["frame_index"][5])  # (row 6's own frame)
    assert "episode 0's rows 5 and 6 share the timestamp 0.166667 s" in caplog.text


_REWRITE = r"the data file and info\.json disagree: correct the dtype in info\.json, or rewrite the data file$"


@pytest.mark.parametrize(
    ("column", "values", "pattern"),
    [
        ("task_index", lambda n: [0.5] * n, r"'task_index' holds fractional values .* reading them would round them: "
         + _REWRITE),
        ("timestamp", lambda n: ["n/a"] * n, r"'timestamp' of type string cannot be read .*could not convert.*\); "
         + _REWRITE),
        ("action", lambda n: [["n/a"] * 7] * n, r"'action' of type list<.*string> cannot be read .*could not convert.*"
         r"\); the data file and info\.json disagree: correct the dtype in info\.json, or read the other features "
         r"only \(keys= without 'action'; --keys on the command line\); where the dataset's other data files hold "
         r"info\.json's, this one alone differs: rewrite it, or leave out its episodes \(episodes=\[\.\.\.\] of the "
         r"others\)$"),
    ],
    ids=["fractional-int", "text-in-float", "text-in-vector"],
)  # fmt: skip
def test_column_values_the_declared_dtype_cannot_hold_are_refused(ds: Path, column: str, values, pattern: str) -> None:
    """A fractional task_index was rounded silently; text in a float column raised a bare ValueError. Each error says
    what to do (they named the mismatch only): an index column is read whatever keys= says."""

    def edit(table: pa.Table) -> pa.Table:
        return table.set_column(table.column_names.index(column), column, pa.array(values(len(table))))

    _rewrite_data(ds, edit)
    with pytest.raises(SchemaMismatchError, match=pattern):
        open_dataset(ds).read_episode(0)


def test_vectors_of_another_length_in_one_data_file_alone_are_told_to_rewrite_it_or_leave_its_episodes_out(
    ds: Path,
) -> None:
    """The second of two data files holding 6-value actions where info.json and the first hold 7: the advice was to
    correct the shape in info.json (which the first file's rows then refuse) or to read no action at all."""
    path = ds / "data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    six = pa.array([row[:6] for row in table["action"].to_pylist()], pa.list_(pa.float32()))
    pq.write_table(table.set_column(table.column_names.index("action"), "action", six), path)
    with pytest.raises(
        SchemaMismatchError,
        match=r"file-001\.parquet: column 'action' holds vectors of length \[6\] but info\.json declares shape \[7\] "
        r".*this one alone differs: rewrite it, or leave out its episodes \(episodes=\[\.\.\.\] of the others\)$",
    ):
        _first_pass(ds)


@pytest.mark.parametrize("workers", [0, 1])
def test_vectors_of_another_length_in_one_episodes_rows_name_the_episode(ds: Path, workers: int) -> None:
    """Episode 3's actions 6 values long in file-001, which also holds episode 2's of 7 (info.json's): found as its
    rows are read (in a worker, or in the training process), the error named the data file and the column, not the
    episode, which a file of several episodes leaves to guess. Now it says 'episode 3's rows', as a missing or
    damaged data file's error does."""
    path = ds / "data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    rows = [
        row if episode == 2 else row[:6]
        for row, episode in zip(table["action"].to_pylist(), table["episode_index"].to_pylist(), strict=True)
    ]
    pq.write_table(
        table.set_column(table.column_names.index("action"), "action", pa.array(rows, pa.list_(pa.float32()))), path
    )
    with pytest.raises(
        SchemaMismatchError,
        match=r"^episode 3's rows: \S*/file-001\.parquet: column 'action' holds vectors of length \[6\] but ",
    ):
        _first_pass(ds, num_workers=workers)


def test_an_undeclared_episode_index_is_derived(ds: Path) -> None:
    """It raised a bare KeyError('episode_index') on the first batch; like index and frame_index, it is implied."""
    info = json.loads((ds / "meta/info.json").read_text())
    del info["features"]["episode_index"]
    (ds / "meta/info.json").write_text(json.dumps(info))
    _rewrite_data(ds, lambda table: table.drop_columns(["episode_index"]))
    batches = _first_pass(ds)
    episodes = np.concatenate([b["episode_index"].numpy() for b in batches])
    assert episodes.tolist() == [e for e in range(4) for _ in range(20)]


def test_a_missing_task_text_in_the_v3_episode_metadata_is_read_and_digested(ds: Path) -> None:
    """A null in an episode's ``tasks`` list (descriptive metadata: batches take their task from each row's task_index,
    as LeRobot's do) failed the stream state's digest with a bare TypeError ("sequence item 1: expected str instance,
    NoneType found"), so every state_dict() of a dataset LeRobot reads raised. It reads, and its digest tells it from
    the dataset without the null."""
    before = open_dataset(ds).content_digest()
    path = _episodes_file(ds)
    table = pq.read_table(path)
    tasks = table["tasks"].to_pylist()
    tasks[2] = [*tasks[2], None]
    column = table.column_names.index("tasks")
    pq.write_table(table.set_column(column, "tasks", pa.array(tasks, table["tasks"].type)), path)
    reader = open_dataset(ds)
    assert reader.episodes.tasks[2].as_py()[-1] is None
    assert reader.content_digest() != before
    frames = _first_pass(ds)
    assert sum(len(batch["index"]) for batch in frames) == 80


@pytest.mark.parametrize(
    ("kind", "texts", "read_as"),
    [
        (pa.string(), lambda tasks: [each[0] for each in tasks], lambda tasks: tasks),
        (pa.large_string(), lambda tasks: [each[0] for each in tasks], lambda tasks: tasks),
        (pa.list_(pa.int64()), lambda tasks: [[1]] * len(tasks), lambda tasks: [None] * len(tasks)),
    ],
    ids=["plain-strings", "plain-large-strings", "lists-of-numbers"],
)
def test_a_v3_tasks_column_not_of_lists_of_texts_reads_as_lerobot_reads_it(
    ds: Path, kind, texts, read_as, caplog: pytest.LogCaptureFixture
) -> None:
    """meta/episodes' ``tasks`` as one plain string per episode, or as lists of numbers, in the second of two files:
    refused at the open, though LeRobot 0.4.4 reads it (it never reads the column: a frame's task is the task list's
    text of its task_index; tests/test_lerobot_parity.py). It reads, its batches' tasks those of task_index: plain
    strings as lists of one (the dataset's digests those of LeRobot's list<string>), another type as no lists, with
    a warning naming the file and the type."""
    path = _episodes_file(ds)
    table = pq.read_table(path)
    before = open_dataset(ds)
    digests, tasks = (before.content_digest(), before.identity_digest()), before.episodes.tasks.to_pylist()
    second = table.slice(2)
    column = second.column_names.index("tasks")
    pq.write_table(table.slice(0, 2), path)
    other = path.with_name("file-001.parquet")
    pq.write_table(second.set_column(column, "tasks", pa.array(texts(second["tasks"].to_pylist()), kind)), other)
    reader = open_dataset(ds)
    assert reader.episodes.tasks.to_pylist() == tasks[:2] + read_as(tasks[2:])
    assert (reader.content_digest() == digests[0]) == (read_as(tasks) == tasks)
    assert reader.identity_digest() == digests[1]
    warned = [r.getMessage() for r in caplog.records if "column 'tasks' is of type" in r.getMessage()]
    assert warned == ([] if read_as(tasks) == tasks else [warned[0]])
    assert all(str(other) in message and "int64" in message for message in warned)
    batches = _first_pass(ds)
    read = [reader.tasks[int(i)] for batch in batches for i in batch["task_index"]]
    assert [text for batch in batches for text in batch["task"]] == read and len(read) == 80


def _dictionary_lists(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` (lists of texts) with its texts dictionary-encoded."""
    lists = column.combine_chunks()
    return pa.chunked_array([pa.ListArray.from_arrays(lists.offsets, lists.values.dictionary_encode())])


@pytest.mark.parametrize(
    "retyped",
    [
        lambda column: column.cast(pa.list_(pa.string(), 1)),
        lambda column: column.cast(pa.large_list(pa.large_string())),
        _dictionary_lists,
    ],
    ids=["fixed-size-lists", "large-lists-of-large-strings", "dictionary-encoded-texts"],
)
def test_a_v3_tasks_column_of_other_list_and_text_types_reads_as_lists_of_strings(ds: Path, retyped) -> None:
    """meta/episodes' ``tasks`` as fixed-size lists (HF datasets' type for a Sequence of a fixed length), or with its
    texts dictionary-encoded: read and digested as lists of strings before the column's type was checked, then
    refused as not lists of texts (2 of these 3 types). Each reads as the same dataset: its task lists and digests
    those of LeRobot's list<string>."""
    path = _episodes_file(ds)
    table = pq.read_table(path)
    before = open_dataset(ds)
    digests, tasks = (before.content_digest(), before.identity_digest()), before.episodes.tasks.to_pylist()
    column = table.column_names.index("tasks")
    pq.write_table(table.set_column(column, "tasks", retyped(table["tasks"])), path)
    assert pq.read_schema(path).field("tasks").type != table.schema.field("tasks").type
    reader = open_dataset(ds)
    assert (
        reader.episodes.tasks.to_pylist() == tasks == [[f"synthetic task {e % 2}: move the marker"] for e in range(4)]
    )
    assert (reader.content_digest(), reader.identity_digest()) == digests


def test_a_v3_tasks_column_of_nulls_alone_reads_as_no_tasks_column(ds: Path) -> None:
    """A ``tasks`` column of type null (every episode's tasks missing, as pandas writes a column of None) opened, and
    every state_dict() failed with Arrow's bare "'list_value_length' has no kernel matching input types (null)". It
    reads as the dataset without the column does (its digest the same), and its batches take their task texts from
    task_index as every dataset's do."""
    path = _episodes_file(ds)
    table = pq.read_table(path)
    tasks = open_dataset(ds).tasks
    pq.write_table(table.drop_columns(["tasks"]), path)
    without = open_dataset(ds).content_digest()
    pq.write_table(table.set_column(table.column_names.index("tasks"), "tasks", pa.nulls(len(table))), path)
    reader = open_dataset(ds)
    assert reader.episodes.tasks.to_pylist() == [None] * 4
    assert reader.content_digest() == without
    batches = _first_pass(ds)
    read = [tasks[int(i)] for batch in batches for i in batch["task_index"]]
    assert [text for batch in batches for text in batch["task"]] == read and len(read) == 80


def test_a_camera_without_file_columns_in_the_v3_episode_metadata_is_named(ds: Path) -> None:
    """meta/episodes lacking a declared camera's videos/<key>/file_index is refused naming the camera and the columns;
    left out with cameras=[], the dataset reads its rows."""
    path = _episodes_file(ds)
    pq.write_table(pq.read_table(path).drop_columns([f"videos/{CAM}/file_index"]), path)
    with pytest.raises(
        EpisodeMetadataError,
        match=rf"meta/episodes: camera '{re.escape(CAM)}' is declared in info\.json but the episode metadata has no "
        rf"'videos/{re.escape(CAM)}/chunk_index'/'videos/{re.escape(CAM)}/file_index' columns; select the cameras "
        r"that have files with cameras=\[\.\.\.\]",
    ):
        open_dataset(ds)
    reader = open_dataset(ds, cameras=[])
    assert reader.episodes.length.tolist() == [20] * 4
    assert reader.read_episode(3)["index"].tolist() == list(range(60, 80))


def test_a_null_task_in_a_v2_episode_record_is_read_as_a_null(make_ds, copy_ds) -> None:
    """``"tasks": [null]`` in episodes.jsonl read as the text "None" (str(None)): its digest was that of a dataset whose
    episode lists the task "None", and the check of episodes' tasks quoted ['None']. A null, as a v3.0 dataset's is
    read (LeRobot 0.4.4's conversion carries it over as one; LeRobot reads either, its batches taking their task
    from task_index): the digest tells it from the text "None", and batches carry the task list's texts."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "meta/episodes.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]

    def reads_with(tasks: list) -> object:
        records[2]["tasks"] = tasks
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        return open_dataset(root)

    named_none = reads_with(["None"]).content_digest()
    reader = reads_with([None])
    assert reader.episodes.tasks[2].as_py() == [None]
    assert reader.content_digest() != named_none
    batches = _first_pass(root)
    assert [t for b in batches for t in b["task"]] == [reader.tasks[int(i)] for b in batches for i in b["task_index"]]


def test_blank_lines_in_v2_episodes_jsonl_are_skipped(make_ds, copy_ds) -> None:
    """Blank lines (a hand edit, a trailing newline too many) hold no episode: the episodes are those of the others."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "meta/episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n" + "\n  \n".join(lines) + "\n\n")
    reader = open_dataset(root)
    assert reader.episodes.episode_index.tolist() == [0, 1, 2, 3]
    assert reader.episodes.length.tolist() == [20] * 4


def test_a_dataset_without_episodes_is_refused(ds: Path) -> None:
    path = _episodes_file(ds)
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    with pytest.raises(
        DatasetError, match="the episode metadata lists no episodes; .*download or copy its meta/ again"
    ):
        open_dataset(ds)


@pytest.mark.parametrize("which", ["episodes", "tasks"])
def test_unreadable_metadata_parquet_names_the_file(ds: Path, which: str) -> None:
    """They raised pyarrow's ArrowInvalid naming no file (for tasks: '<Buffer>')."""
    path = _episodes_file(ds) if which == "episodes" else ds / "meta/tasks.parquet"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match=rf"{path.name} is not a readable parquet file"):
        open_dataset(ds)


@pytest.mark.parametrize(("which", "error"), [("episodes", EpisodeMetadataError), ("tasks", DatasetError)])
def test_metadata_parquet_with_a_damaged_page_names_the_file(ds: Path, which: str, error: type) -> None:
    """A page header that does not parse makes pyarrow raise OSError ("Couldn't deserialize thrift"), not an
    ArrowException: it came through as a bare OSError naming no file (found by a corruption fuzz)."""
    path = _episodes_file(ds) if which == "episodes" else ds / "meta/tasks.parquet"
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    at = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[at : at + 4] = bytes(4)
    path.write_bytes(bytes(raw))
    with pytest.raises(error, match=rf"{path.name} is not a readable parquet file \(Couldn't deserialize thrift"):
        open_dataset(ds)


def test_a_failed_pass_leaves_no_worker_processes(ds: Path) -> None:
    """After a pass failed, its workers ran on (until garbage collection), and close() no longer reached them."""
    import psutil

    video = ds / f"videos/{CAM}/chunk-000/file-001.mp4"
    video.write_bytes(video.read_bytes()[:2000])  # episodes 2 and 3 cannot be read
    it = DALILeRobotIterator(ds, batch_size=4, shuffle=False, device="cpu", num_workers=2)
    me = psutil.Process()
    for _ in range(2):
        with pytest.raises(DatasetError):
            for _batch in it:
                pass
        alive = [p for p in me.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
        psutil.wait_procs(alive, timeout=10)
        assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    it.close()


def test_a_decode_error_names_the_camera_and_episodes(ds: Path) -> None:
    """The decoder's message names the file only; whose frames they were (camera, episodes) is added."""
    from lerobot_dali.errors import VideoDecodeError

    video = ds / f"videos/{CAM}/chunk-000/file-001.mp4"
    video.write_bytes(video.read_bytes()[:2000])
    pattern = r"camera 'observation\.images\.cam0', batch of episodes \[2\]: .*file-001\.mp4"
    with pytest.raises(VideoDecodeError, match=pattern):
        _first_pass(ds)


def test_a_video_file_missing_mid_epoch_names_the_camera_and_episodes(ds: Path) -> None:
    """It said only 'Video file .../file-001.mp4 does not exist.'"""
    from lerobot_dali.errors import MissingDataFileError

    (ds / f"videos/{CAM}/chunk-000/file-001.mp4").unlink()
    pattern = r"camera 'observation\.images\.cam0', batch of episodes \[2\]: .*file-001\.mp4 does not exist: download "
    pattern += r"or copy it again .*, or leave out the episodes it holds \(episodes=\[\.\.\.\] of the others\)"
    with pytest.raises(MissingDataFileError, match=pattern):  # (it said what is wrong only)
        _first_pass(ds)


@pytest.mark.parametrize(
    ("error", "pattern"),
    [
        (
            IndexError("index 0 is out of bounds for axis 0 with size 0"),
            r"reading samples \[0, 4\) of epoch 0 \(episodes \[0\]\): index 0 is out of bounds",
        ),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), r"^'utf-8' codec can't decode byte 0xff"),
    ],
    ids=["IndexError", "UnicodeDecodeError"],
)
def test_a_builtin_error_in_a_worker_names_the_samples(
    ds: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, pattern: str
) -> None:
    """A bare IndexError (a NaN timestamp raised one) named no file, episode or sample. A builtin whose arguments
    are not one message (UnicodeDecodeError) cannot be made again with them named: it is raised as it is."""
    from lerobot_dali.batch_source import BatchSource

    def failing(self, episode_pos, frame, **kwargs):
        raise error

    monkeypatch.setattr(BatchSource, "assemble", failing)
    with pytest.raises(type(error), match=pattern):
        _first_pass(ds)


def test_info_json_totals_that_disagree_with_the_episode_metadata_are_warned_of(ds: Path, caplog) -> None:
    """LeRobot 0.4.4 takes ``len(dataset)`` from ``total_frames``: a stale one made it sample other frames. Reading
    keeps the metadata's episodes and lengths; a stale total_frames went unsaid. A total_episodes below the episodes
    listed is warned of (none is lost); above them is refused (see the cut episodes.jsonl test below)."""
    info_path = ds / "meta/info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "total_episodes": 3, "total_frames": 75}))
    with caplog.at_level("WARNING", logger="lerobot_dali.dataset_reader"):
        reader = open_dataset(ds)
    assert (reader.num_episodes, reader.num_frames) == (4, 80)
    said = caplog.text
    assert "total_episodes=3 but the episode metadata lists 4" in said
    assert "total_frames=75 but the episode metadata's lengths add up to 80" in said


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_episode_metadata_listing_fewer_episodes_than_info_json_is_refused(make_ds, copy_ds, version: str) -> None:
    """A v2.1 episodes.jsonl cut at a line's end (a server without Content-Length closing early), or a v3 dataset
    missing one of its meta/episodes files, opened with fewer episodes (3 of 4) and only a warning that blamed
    info.json's total_episodes: the last episode was never read. LeRobot 0.4.4 refuses it (v3: IndexError 'Episode
    index 3 out of range' at open; its v2.1 converter: an episodes.jsonl listing fewer episodes than the data holds).
    Now refused, naming both counts and saying how to fix either."""
    root = copy_ds(make_ds(**{**SPEC, "episodes_per_file": 1}, version=version, size=(64, 96)))
    if version == "v2.1":
        path = root / "meta/episodes.jsonl"
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    else:
        path = _episodes_file(root)  # (as if the last of two files were missing: the first 3 rows kept)
        pq.write_table(pq.read_table(path).slice(0, 3), path)
    said = r"info\.json says total_episodes=4 but the episode metadata \(.*\) lists 3: it may be cut short"
    with pytest.raises(EpisodeMetadataError, match=said + r".*set total_episodes \(and total_frames\) in meta/info"):
        open_dataset(root)


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_episodes_named_among_those_listed_open_where_info_json_counts_more(
    make_ds, copy_ds, version: str, caplog
) -> None:
    """Episode metadata listing 3 of info.json's 4 episodes is refused where every episode is wanted (and where
    episodes= names one not listed), but episodes=[0, 1], both listed, lost nothing: it opened with a warning before
    the refusal came in, and LeRobot 0.4.4 opens it (it asks for the selected episodes alone); the refusal refused it
    too. It opens again, warned of, and reads each sample's own frame."""
    root = copy_ds(make_ds(**{**SPEC, "episodes_per_file": 1}, version=version, size=(64, 96)))
    if version == "v2.1":
        path = root / "meta/episodes.jsonl"
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    else:
        path = _episodes_file(root)
        pq.write_table(pq.read_table(path).slice(0, 3), path)
    with caplog.at_level("WARNING", logger="lerobot_dali.dataset_reader"):
        reader = open_dataset(root, episodes=[0, 1])
    assert (reader.num_episodes, reader.num_frames) == (2, 40)
    assert "total_episodes=4 but the episode metadata lists 3" in caplog.text
    samples = _markers(_first_pass(root, episodes=[0, 1], return_uint8=True))
    assert len(samples) == 40 and all(read == row for read, row in samples)
    with pytest.raises(EpisodeMetadataError, match=r"total_episodes=4 but the episode metadata \(.*\) lists 3"):
        open_dataset(root, episodes=[1, 3])
    with pytest.raises(EpisodeMetadataError, match=r"total_episodes=4 but the episode metadata \(.*\) lists 3"):
        open_dataset(root, episode_filter=lambda ep: True)


def test_a_repeated_episode_index_is_refused(ds: Path) -> None:
    _set_episode_column(ds, "episode_index", 2, 1)
    with pytest.raises(EpisodeMetadataError, match=r"not unique: episode\(s\) \[1\] are listed more than once"):
        open_dataset(ds)


def test_an_episode_length_that_disagrees_with_its_index_span_or_is_zero_is_refused(ds: Path) -> None:
    _set_episode_column(ds, "length", 1, 19)
    with pytest.raises(EpisodeMetadataError, match=r"episode 1 has length 19 but dataset_to_index - .* = 20; "):
        open_dataset(ds)
    _set_episode_column(ds, "length", 1, 0)
    _set_episode_column(ds, "dataset_to_index", 1, 20)  # (its span agrees: 20..20)
    with pytest.raises(EpisodeMetadataError, match=r"episode 1 has no frames \(length 0\), which LeRobot never"):
        open_dataset(ds)


def test_v3_episode_rows_out_of_order_are_read_by_episode_index(ds: Path) -> None:
    """A meta/episodes file whose rows are not in episode order (rewritten, merged) reads as the sorted one."""
    path = _episodes_file(ds)
    pq.write_table(pq.read_table(path).take([2, 0, 3, 1]), path)
    reader = open_dataset(ds)
    assert reader.episodes.episode_index.tolist() == [0, 1, 2, 3]
    assert reader.episodes.dataset_from_index.tolist() == [0, 20, 40, 60]
    assert [reader.video(e, CAM).from_timestamp_s for e in range(4)] == [0.0, 2.0, 0.0, 2.0]  # (2 a file, 10 fps)


def test_without_from_timestamp_only_one_episode_per_video_file_reads(ds: Path, make_ds, tmp_path: Path) -> None:
    def drop_starts(root: Path) -> None:
        path = _episodes_file(root)
        table = pq.read_table(path)
        pq.write_table(table.drop_columns([f"videos/{CAM}/from_timestamp", f"videos/{CAM}/to_timestamp"]), path)

    drop_starts(ds)  # two episodes per video file: where the second starts is unknown
    with pytest.raises(EpisodeMetadataError, match=r"no 'videos/observation\.images\.cam0/from_timestamp' column"):
        open_dataset(ds)
    alone = Path(shutil.copytree(make_ds(**{**SPEC, "episodes_per_file": 1}, size=(64, 96)), tmp_path / "alone"))
    for p in alone.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    drop_starts(alone)
    assert open_dataset(alone).video(3, CAM).from_timestamp_s == 0.0


@pytest.mark.parametrize(("text", "message"), [("{", "is not valid JSON"), ("[]", "holds a JSON list, not the object")])
def test_an_info_json_that_is_not_an_object_names_itself(ds: Path, text: str, message: str) -> None:
    """A JSON list or string there failed with AttributeError ('list' object has no attribute 'get')."""
    (ds / "meta/info.json").write_text(text)
    with pytest.raises(
        DatasetError, match=rf"meta/info.json {message}.*[:;] download or copy .*/meta/info\.json again$"
    ):
        open_dataset(ds)


@pytest.mark.parametrize("which", ["data_column_name", "task_string"])
def test_parquet_strings_that_are_not_utf8_name_the_file(ds: Path, which: str) -> None:
    """pyarrow checks no string as it reads: a column name in a data file's footer, or a task in tasks.parquet, that
    is not UTF-8 raised a bare UnicodeDecodeError where it was first used (found by a fuzz)."""
    if which == "data_column_name":
        path, text, error = next((ds / "data").rglob("*.parquet")), b"frame_index", DataFileError
    else:
        path, text, error = ds / "meta/tasks.parquet", open_dataset(ds).tasks[0].encode(), DatasetError
    raw = bytearray(path.read_bytes())
    raw[raw.index(text)] = 0xFF  # the first: the footer's schema (the pages hold values), or the task's page
    path.write_bytes(bytes(raw))
    with pytest.raises(error, match=rf"{path.name} is not (a )?readable parquet.*(utf-8|UTF8)"):
        open_dataset(ds)


@pytest.mark.parametrize(
    ("version", "file", "error", "said"),
    [
        ("v3.0", "meta/info.json", DatasetError, r"meta/info\.json is not valid JSON: 'utf-8' codec can't decode"),
        ("v2.1", "meta/info.json", DatasetError, r"meta/info\.json is not valid JSON: 'utf-8' codec can't decode"),
        ("v2.1", "meta/tasks.jsonl", DatasetError, r"meta/tasks\.jsonl:1: bad task record \('utf-8' codec"),
        ("v2.1", "meta/episodes.jsonl", EpisodeMetadataError, r"meta/episodes\.jsonl:1: bad episode record \('utf-8"),
        ("v2.1", "meta/episodes_stats.jsonl", DatasetError, r"episodes_stats\.jsonl:1: not an episode statistics"),
    ],
)
def test_metadata_that_is_not_utf8_names_the_file(make_ds, copy_ds, version, file, error, said) -> None:
    """A byte flipped into one that is not UTF-8 (0xff) inside a string: a bare UnicodeDecodeError naming no file
    came through from reading info.json, and from iterating the lines of the JSON-lines files (found by a fuzz)."""
    root = copy_ds(make_ds(**{**SPEC, "version": version}, size=(64, 96)))
    path = root / file
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"', raw.index(b":")) + 1] = 0xFF  # the first byte of the first string value
    path.write_bytes(bytes(raw))
    with pytest.raises(error, match=said):
        open_dataset(root)
        read_dataset_stats(resolve_location(str(root)))


@pytest.mark.parametrize(
    ("field", "value"),
    [("episode_index", 0.5), ("length", 4.5), ("length", "many")],
)
def test_a_v2_episode_record_of_the_wrong_kind_is_refused(make_ds, copy_ds, field: str, value) -> None:
    """int() cut 0.5 to episode 0 and 4.5 to 4 frames, and the dataset read (found by a fuzz of the metadata's
    values); a whole number written as 4.0 or "4" still reads (its value is not in doubt)."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "meta/episodes.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    original = lines[0][field]
    for written, reads in [(value, False), (float(original), True), (str(original), True)]:
        lines[0][field] = written
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        if reads:
            assert open_dataset(root).num_episodes == SPEC["episodes"]
            continue
        advice = r"; the episode metadata is damaged: download or copy .*/meta/episodes\.jsonl again$"
        with pytest.raises(
            EpisodeMetadataError, match=rf"episodes\.jsonl:1: bad episode record \({field} must be a .*{advice}"
        ):
            open_dataset(root)


@pytest.mark.parametrize(
    ("written", "read_as"),
    [("pick the cube", ["pick the cube"]), (None, []), (["pick", None], ["pick", None]), (["pick", 1], []), (7, [])],
)
def test_v2_episode_tasks_read_as_lerobot_reads_them(make_ds, copy_ds, written, read_as, caplog) -> None:
    """episodes.jsonl's ``tasks`` as a string, or a list holding a number, was refused at the open, though LeRobot
    reads it (0.3 never reads the episodes' tasks: a frame's task is the task list's text of its task_index). A string
    reads as a list of it (its letters read as its tasks before it was refused; its digest that of the list), tasks
    that are no texts as none, with a warning naming the file and the line; null ones as none, as before."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "meta/episodes.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["tasks"] = read_as
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    expected = open_dataset(root)
    lines[0]["tasks"] = written
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reader = open_dataset(root)
    assert reader.episodes.tasks.to_pylist() == expected.episodes.tasks.to_pylist()
    assert reader.episodes.tasks[0].as_py() == read_as
    assert reader.content_digest() == expected.content_digest()
    warned = [r.getMessage() for r in caplog.records if "not each episode's task texts" in r.getMessage()]
    assert len(warned) == (written not in (None, "pick the cube", ["pick", None]))
    assert all(f"{path}: 1 record(s)' tasks are not texts (line 1: {written!r}" in message for message in warned)
    batches = _first_pass(root)
    read = [reader.tasks[int(i)] for batch in batches for i in batch["task_index"]]
    assert [text for batch in batches for text in batch["task"]] == read and len(read) == 80


@pytest.mark.parametrize(
    ("column", "values", "kind", "pattern"),
    [
        ("length", [20.5, 20, 20, 20], pa.float64(), r"column 'length' must hold whole numbers \(Float value 20\.5"),
        ("episode_index", [0, 1, 2.5, 3], pa.float64(), r"column 'episode_index' must hold whole numbers"),
        ("length", [None, 20, 20, 20], pa.int64(), r"column 'length' has 1 missing value"),
        ("data/file_index", [0, None, 1, 1], pa.int64(), r"column 'data/file_index' has 1 missing value"),
        (
            "videos/observation.images.cam0/file_index",
            ["0", "0", "one", "1"],
            pa.string(),
            r"column '.*' must hold whole",
        ),
        ("length", [20.0, 20.0, 20.0, 20.0], pa.float64(), None),
        ("dataset_from_index", ["0", "20", "40", "60"], pa.string(), None),
    ],
)
def test_v3_episode_columns_that_are_not_whole_numbers_are_refused(ds: Path, column, values, kind, pattern) -> None:
    """A cast to int64 cut 20.5 to 20 and made a null -2**63, which then named a file 'file--9223372036854775808'
    (found by a fuzz of the metadata's values); whole numbers written as floats or text still read."""
    path = _episodes_file(ds)
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values, kind)), path)
    if pattern is None:
        assert open_dataset(ds).episodes.length.tolist() == [20] * 4
        return
    advice = r"; the episode metadata is damaged: download or copy .*/meta/episodes again$"
    with pytest.raises(EpisodeMetadataError, match=rf"meta/episodes: {pattern}.*{advice}"):
        open_dataset(ds)


def test_a_v3_episode_index_missing_is_named_with_an_episode_filter_too(ds: Path) -> None:
    """With episode_filter, the filter ran before the episode table was read: a null episode_index reached its
    ``int(row["episode_index"])`` and the open failed with Python's bare TypeError ("int() argument must be ...
    not 'NoneType'"), naming neither the column nor meta/episodes. The table is read first now, as without a filter."""
    path = _episodes_file(ds)
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.column_names.index("episode_index"), "episode_index",
                                    pa.array([0, 1, None, 3], pa.int64())), path)  # fmt: skip
    for opening in ({}, {"episode_filter": lambda ep: True}, {"episodes": [0, 1], "episode_filter": lambda ep: True}):
        with pytest.raises(EpisodeMetadataError, match=r"meta/episodes: column 'episode_index' has 1 missing value"):
            open_dataset(ds, **opening)


@pytest.mark.parametrize("value", [None, float("nan"), float("inf")])
def test_a_v3_episodes_from_timestamp_that_is_no_number_names_its_column(ds: Path, value: float | None) -> None:
    """A null, NaN or infinite videos/<camera>/from_timestamp failed only as the episode's frames were looked up,
    with "query timestamp nan s is not a finite number." (check and iterator alike, 0 of 3 named meta/episodes or
    the column); it is refused as the metadata is read, as a missing length is: where a selected episode is in its
    file (its own, or another's of the file, which may be where it ends). Episodes of the other file read (it
    refused the whole dataset, whatever episodes= selected; LeRobot reads no start but the selected episodes')."""
    column = f"videos/{CAM}/from_timestamp"
    path = _episodes_file(ds)
    table = pq.read_table(path)
    values = table[column].to_pylist()
    values[1] = value
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values, pa.float64())), path)
    said = (
        rf"meta/episodes: camera '{CAM}': where episode 0's part of video file chunk 0 file 0 lies is unknown: column "
        rf"'{column}' is missing or not finite for episode 1 of the same file \(where it may end\) \(1 episode\(s\) "
        r"in all\); leave those episodes and the others of their video files out with episodes=\[\.\.\.\], or "
        r"download or copy"
    )
    # Episode 0's own start is known, but its part may end at episode 1's, which is not (episode_table's
    # check_video_starts says why that refuses it); with episode_filter the check is of the episodes it keeps.
    for opening in ({}, {"episodes": [0]}, {"episode_filter": lambda ep: ep["episode_index"] == 0}):
        with pytest.raises(EpisodeMetadataError, match=said):
            open_dataset(ds, **opening)
    with pytest.raises(EpisodeMetadataError, match=r"where episode 1's part .* missing or not finite for it \("):
        open_dataset(ds, episodes=[1])
    assert open_dataset(ds, episode_filter=lambda ep: ep["episode_index"] >= 2).num_episodes == 2
    samples = _markers(_first_pass(ds, episodes=[2, 3], return_uint8=True))
    assert len(samples) == 40 and all(read == row for read, row in samples)


def test_a_folder_where_a_data_file_belongs_is_named_as_one(ds: Path) -> None:
    """A folder at a data file's path raised Python's bare IsADirectoryError from the open (check: "cannot open ...:
    IsADirectoryError: [Errno 21] Is a directory"); it is now the missing file it stands for, named so."""
    from lerobot_dali.errors import MissingDataFileError

    data = ds / "data/chunk-000/file-001.parquet"
    data.unlink()
    data.mkdir()
    with pytest.raises(MissingDataFileError, match=rf"data file {re.escape(str(data))} is a folder, not a parquet"):
        open_dataset(ds)


def _not_a_file(path: Path, kind: str) -> str:
    """``path`` made ``kind`` (a folder, a named pipe, a symbolic link to itself, one to a device); what an error says
    of it."""
    path.unlink()
    if kind == "folder":
        path.mkdir()
        return "a folder"
    if kind == "pipe":
        os.mkfifo(path)
        return "a named pipe"
    path.symlink_to(path.name if kind == "loop" else "/dev/null")
    return "a symbolic link that loops" if kind == "loop" else "a device"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["folder", "pipe", "loop", "device"])
def test_a_folder_pipe_or_looping_link_where_a_video_file_belongs_is_listed_not_waited_on(ds: Path, kind: str) -> None:
    """A folder at a video file's path (a download tool's or a copy's leftover) crashed `lerobot-dali check` with
    Python's bare IsADirectoryError and its traceback, listing nothing, and a pass raised it too. A named pipe there
    hung the iterator's build and check for good (an open waits for the pipe's writer); a symbolic link to itself
    raised Python's bare OSError from the build and ended check in a traceback. Each is now the missing file it
    stands for, listed by check and raised by a pass, naming what it is; the episodes of the other file are read."""
    from lerobot_dali.errors import MissingDataFileError

    video = ds / f"videos/{CAM}/chunk-000/file-001.mp4"
    said = rf"{re.escape(str(video))} is {_not_a_file(video, kind)}\b.*, not a video file"
    report = check_dataset(open_dataset(ds), workers=0)
    assert [(p.episode_index, p.error) for p in report.problems] == [
        (2, "MissingDataFileError"),
        (3, "MissingDataFileError"),
    ]
    assert all(re.search(said, p.message) for p in report.problems)
    with pytest.raises(MissingDataFileError, match=said):
        _first_pass(ds)
    assert len(_markers(_first_pass(ds, episodes=[0, 1], return_uint8=True))) == 40


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize("kind", ["pipe", "loop"])
def test_a_named_pipe_or_a_looping_link_where_a_data_file_belongs_is_named_not_waited_on(
    make_ds, copy_ds, version: str, kind: str
) -> None:
    """A named pipe at a data file's path hung opening the dataset (the footer's open waits for a writer); a
    symbolic link to itself was named a file that does not exist. Each is now named for what it is."""
    root = copy_ds(make_ds(**SPEC, size=(64, 96), version=version))
    data = sorted((root / "data").rglob("*.parquet"))[-1]
    with pytest.raises(DataFileError, match=rf"data file {re.escape(str(data))} is {_not_a_file(data, kind)}\b"):
        open_dataset(root)


def _write_tasks(root: Path, tasks: list[tuple[object, object]], *, as_lerobot: bool = False) -> None:
    """The task list as (task_index, task) pairs, in the dataset's own format (v3.0: a plain ``task`` column;
    ``as_lerobot``: the texts the pandas index, as LeRobot writes it and reads them by row position)."""
    if as_lerobot:
        pq.write_table(text_list_table("task", tasks), root / "meta/tasks.parquet")  # type: ignore[arg-type]
        return
    if (root / "meta/tasks.jsonl").exists():
        lines = [json.dumps({"task_index": index, "task": task}) for index, task in tasks]
        (root / "meta/tasks.jsonl").write_text("".join(line + "\n" for line in lines))
        return
    indices, texts = zip(*tasks, strict=True)
    table = pa.table({"task_index": pa.array(indices, pa.float64() if 0.5 in indices else pa.int64()), "task": texts})
    pq.write_table(table, root / "meta/tasks.parquet")


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize(
    ("tasks", "said"),
    [
        ([(0, "pick"), (None, "place")], r"task_index must be a whole number, got None"),
        ([(0, "pick"), (0.5, "place")], r"task_index must be a whole number, got 0\.5"),
        ([(0, "pick"), (1, None)], r"task_index 1 has no task"),
        ([(0, "pick"), (1, "place"), (1, "stack")], r"task_index 1 is listed twice, as 'place' and as 'stack'"),
        ([(0, "pick"), (1, "place"), (1, "place")], None),
    ],
)
def test_a_task_list_that_names_no_single_task_per_index_is_refused(make_ds, copy_ds, version, tasks, said) -> None:
    """A null index raised a bare TypeError from int() (found by tests/test_changed_metadata.py), 0.5 was cut to
    task 0, a null task read as the string 'None', and of an index listed twice the last task silently won."""
    root = copy_ds(make_ds(**{**SPEC, "version": version}, size=(64, 96)))
    _write_tasks(root, tasks)
    if said is None:  # (listed twice as the same task: one task)
        assert open_dataset(root).tasks == {0: "pick", 1: "place"}
        return
    with pytest.raises(
        DatasetError,
        match=rf"meta/tasks\.(parquet|jsonl)(:\d+)?: bad task (at row \d+|record) \({said}.*\); download or copy "
        r".*/meta/tasks\.(parquet|jsonl) again$",
    ):
        open_dataset(root)


@pytest.mark.parametrize(
    ("tasks", "data_indices", "said"),
    [
        ([(1, "place"), (0, "pick")], None, r"task_index \[0, 1\] .* for task_index 0 it reads row 0's 'place' where "
         r"the list says 'pick'"),
        ([(0, "pick"), (2, "place")], {1: 2}, r"task_index \[2\] .* for task_index 2 it fails \(no such row\) where "
         r"the list says 'place'"),
        ([(0, "pick"), (0, "pick"), (1, "place")], None, r"task_index \[1\] .* for task_index 1 it reads row 1's "
         r"'pick' where the list says 'place'"),
        ([(0, "pick"), (1, "place"), (3, "stack")], None, None),  # (3 is not used: LeRobot reads the rest alike)
        ([(0, "pick"), (1, "place"), (1, "place")], None, None),
    ],
)  # fmt: skip
def test_a_v3_task_list_out_of_index_order_is_refused_where_lerobot_reads_other_tasks(
    ds: Path, tasks, data_indices, said
) -> None:
    """LeRobot 0.4 takes a frame's task from the row of meta/tasks.parquet at position task_index (pandas' iloc), not
    by the file's task_index column: with rows out of that order it gave every frame of the dataset the other task
    (tests/test_lerobot_parity.py), or failed with an IndexError at the first frame past its last row, where this
    read each frame's task by its index, silently. Refused at the open, naming the data file, the task list, what
    LeRobot reads and what the list says; a list whose disorder no row of the data reaches still reads."""
    _write_tasks(ds, tasks, as_lerobot=True)
    if data_indices is not None:
        _rewrite_data(ds, lambda table: table.set_column(
            table.column_names.index("task_index"), "task_index",
            pa.array([data_indices.get(i, i) for i in table["task_index"].to_pylist()], pa.int64()),
        ))  # fmt: skip
    if said is None:
        batches = _first_pass(ds)
        assert [text for batch in batches for text in batch["task"]] == [
            ["pick", "place"][int(i)] for batch in batches for i in batch["task_index"]
        ]
        return
    pattern = (
        r"data/chunk-000/file-00\d\.parquet: its rows hold task_index \[[\d, ]+\], and meta/tasks\.parquet does "
        r"not hold " + said + r"; rewrite meta/tasks\.parquet with its rows in task_index order, numbered 0, 1, \.\.\. "
        r"\(renumbering the data's task_index to match\), as LeRobot writes it$"
    )
    with pytest.raises(EpisodeMetadataError, match=pattern):
        _first_pass(ds)
    problems = check_dataset(open_dataset(ds), workers=0).problems  # (it lists the episodes, reading their rows)
    told = "LeRobot 0.4 takes a frame's task from the row at position task_index of that file, not by its task_index"
    assert problems and all(told in problem.message for problem in problems)


def _pandas_indexed(table: pa.Table, index: str | list[str]) -> pa.Table:
    """``table`` with pandas metadata making column ``index`` the DataFrame's index, as pandas writes one so named
    (a list: the levels of a MultiIndex)."""
    columns = [
        {
            "name": c,
            "field_name": c,
            "pandas_type": "unicode" if c != "task_index" else "int64",
            "numpy_type": "object" if c != "task_index" else "int64",
            "metadata": None,
        }
        for c in table.column_names
    ]
    meta = {"index_columns": index if isinstance(index, list) else [index], "column_indexes": [], "columns": columns}
    return table.replace_schema_metadata({b"pandas": json.dumps(meta).encode()})


@pytest.mark.parametrize(
    ("table", "index", "read", "warned"),
    [
        (pa.table({"task_index": [0, 1], "instruction": ["pick", "place"]}), "instruction", ["pick", "place"], None),
        (pa.table({"task_index": [0, 1], "task": ["pick", "place"], "other": ["stack", "pour"]}), "other",
         ["stack", "pour"], None),
        (pa.table({"task_index": [0, 1], "__index_level_0__": pa.array(["pick", "place"]).dictionary_encode()}),
         "__index_level_0__", ["pick", "place"], None),
        (pa.table({"task_index": [1, 0], "task": ["place", "pick"]}), None, ["pick", "place"], "task"),
        (pa.table({"task_index": [1, 0], "__index_level_0__": ["place", "pick"]}), None, ["pick", "place"],
         "__index_level_0__"),
        # (a two-level index: LeRobot's row name is a tuple of both, no text; its task column is read)
        (pa.table({"task_index": [0, 1], "task": ["pick", "place"], "other": ["stack", "pour"]}), ["other", "task"],
         ["pick", "place"], "task"),
    ],
    ids=["index-named-instruction", "index-beside-a-task-column", "categorical-index", "plain-task-column",
         "index-column-no-metadata", "two-level-index"],
)  # fmt: skip
def test_a_task_list_gives_the_texts_lerobot_reads_or_its_text_column_said_once(
    ds: Path, table, index, read, warned, caplog
) -> None:
    """LeRobot 0.4 takes a frame's task from the DataFrame pandas reads: ``tasks.iloc[task_index].name``, the index
    the file's pandas metadata names. An index named otherwise than ``task`` ("instruction") was refused ("expected a
    'task_index' column and the task strings"), where LeRobot reads every frame's text; an index beside a ``task``
    column gave the column's texts, not LeRobot's (80 of 80 frames). Without a pandas index (another writer: pyarrow,
    polars) LeRobot gives each frame the row's number, not a text: the ``task`` column's texts are read by index (a
    list out of index order too: LeRobot reads no text of it to differ from), and that is said once. (A categorical
    index, dictionary-encoded, is LeRobot's texts too.)"""
    if index is not None:
        table = _pandas_indexed(table, index)
    pq.write_table(table, ds / "meta/tasks.parquet")
    with caplog.at_level("WARNING", logger="lerobot_dali.dataset_reader"):
        batches = _first_pass(ds)
    frames = [(int(i), text) for batch in batches for i, text in zip(batch["task_index"], batch["task"], strict=True)]
    assert len(frames) == 80 and {i for i, _ in frames} == {0, 1}
    assert all(text == read[i] for i, text in frames)
    said = [r.getMessage() for r in caplog.records if "pandas metadata does not make" in r.getMessage()]
    if warned is None:
        assert not said
    else:
        assert said == [
            f"{ds / 'meta/tasks.parquet'}: its task texts are column {warned!r}, which its pandas metadata does not "
            "make the DataFrame's index (as LeRobot writes it): LeRobot 0.4 gives each frame the row's number (or "
            "the index's value) as its task, not this text; batches here carry the text"
        ]


@pytest.mark.parametrize("key", ["timestamp", "task_index"])
def test_an_index_feature_info_json_lacks_is_refused_with_the_entry_to_add(ds: Path, key: str) -> None:
    """It said every LeRobot dataset has the feature, not what to write; the entry offered reads the data's column."""
    info_path = ds / "meta/info.json"
    info = json.loads(info_path.read_text())
    del info["features"][key]
    info_path.write_text(json.dumps(info))
    advice = rf"add them to the features in meta/info\.json \(\"{key}\": (?P<entry>\{{.*\}})\); otherwise re-download"
    with pytest.raises(SchemaMismatchError, match=advice) as raised:
        _first_pass(ds)
    info["features"][key] = json.loads(re.search(advice, str(raised.value))["entry"])
    info_path.write_text(json.dumps(info))
    assert sum(len(batch[key]) for batch in _first_pass(ds)) == 80


def test_a_task_list_without_its_index_column_says_to_copy_it_again(ds: Path) -> None:
    pq.write_table(pa.table({"task": ["pick"]}), ds / "meta/tasks.parquet")
    with pytest.raises(
        DatasetError, match=r"expected a 'task_index' column .*; download or copy .*tasks\.parquet again$"
    ):
        open_dataset(ds)


@pytest.mark.parametrize("pandas", [b"{not json", b"[1, 2]", b'{"index_columns": 5}', b"\xff\xfe"])
def test_a_task_list_whose_pandas_metadata_is_damaged_says_to_copy_it_again(ds: Path, pandas: bytes) -> None:
    """The pandas metadata names the column LeRobot reads the texts from (its DataFrame's index): damaged, pandas
    (LeRobot) fails to read the file, and this refuses it naming the file, not with a bare JSONDecodeError."""
    table = pa.table({"task_index": [0, 1], "__index_level_0__": ["pick", "place"]})
    pq.write_table(table.replace_schema_metadata({b"pandas": pandas}), ds / "meta/tasks.parquet")
    with pytest.raises(
        DatasetError, match=r"tasks\.parquet: its pandas metadata, .* is damaged .*; download or copy .* again$"
    ):
        open_dataset(ds)


MISCOUNTED = (
    r"the data file and meta/episodes disagree \(a download or copy cut short\?\): download the dataset again, or "
)


def test_a_data_file_cut_short_says_which_episodes_to_leave_out(ds: Path) -> None:
    """It said the episode metadata does not describe the data files and to 'rebuild it' (no tool does), or, with
    the short episode left out, that the files hold rows no episode reads."""
    path = ds / "data/chunk-000/file-000.parquet"  # episodes 0 and 1
    table = pq.read_table(path)
    pq.write_table(table.slice(0, len(table) - 5), path)
    advice = MISCOUNTED + r"leave out its episodes \[0, 1\] \(episodes=\[\.\.\.\] of the others\)$"
    with pytest.raises(
        EpisodeMetadataError, match=r"episode 1 has length 20 there but 15 rows in .*file-000.*" + advice
    ):
        open_dataset(ds)
    with pytest.raises(EpisodeMetadataError, match=r"which holds 35 .*, yet every episode to read is .*" + advice):
        open_dataset(ds, episodes=[0, 2, 3])
    # As told: the other file's episodes read.
    assert sum(len(batch["index"]) for batch in _first_pass(ds, episodes=[2, 3])) == 40


def test_data_files_cut_short_name_the_episodes_of_every_such_file(make_ds, copy_ds) -> None:
    """With two files cut short it named the episodes of the first only: left out as told, the open failed again."""
    root = copy_ds(make_ds(**{**SPEC, "episodes": 6}, size=(64, 96)))  # (episodes 0-1, 2-3 and 4-5 a file each)
    for file in (0, 1):
        path = root / f"data/chunk-000/file-00{file}.parquet"
        table = pq.read_table(path)
        pq.write_table(table.slice(0, len(table) - 5), path)
    advice = (
        MISCOUNTED + r"leave out the episodes of those 2 files, \[0, 1, 2, 3\] \(episodes=\[\.\.\.\] of the others\)$"
    )
    with pytest.raises(
        EpisodeMetadataError, match=r"episode 1 has length 20 there but 15 rows in .*file-000.*" + advice
    ):
        open_dataset(root)
    with pytest.raises(EpisodeMetadataError, match=r"yet every episode to read is where it says: .*" + advice):
        open_dataset(root, episodes=[0, 2, 4])
    assert sum(len(batch["index"]) for batch in _first_pass(root, episodes=[4, 5])) == 40  # (as told)


@pytest.mark.parametrize("checked_at_open", [True, False])
def test_a_v2_data_file_cut_short_says_to_leave_its_episode_out(make_ds, copy_ds, monkeypatch, checked_at_open) -> None:
    """It said to 'rebuild the episode metadata from the data files' (no tool does), or, past the files checked at
    open, named the fault only."""
    from lerobot_dali import episode_data_files

    if not checked_at_open:
        monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 1)
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    path = root / "data/chunk-000/episode_000001.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, len(table) - 5), path)
    advice = (
        MISCOUNTED + r"leave out episode 1( and any other episode in this file)? \(episodes=\[\.\.\.\] of the others\)"
    )
    with pytest.raises(EpisodeMetadataError, match=r"episode_000001\.parquet: holds 15 rows.*" + advice):
        _first_pass(root)
    assert sum(len(batch["index"]) for batch in _first_pass(root, episodes=[0, 2, 3])) == 60


def test_v2_data_files_cut_short_name_every_episode_to_leave_out(make_ds, copy_ds) -> None:
    """With two files cut short it named the first one's episode only: left out as told, the open failed again."""
    root = copy_ds(make_ds(**{**SPEC, "version": "v2.1"}, size=(64, 96)))
    for episode in (1, 2):
        path = root / f"data/chunk-000/episode_00000{episode}.parquet"
        pq.write_table(pq.read_table(path).slice(0, 15), path)
    advice = MISCOUNTED + r"leave out episodes \[1, 2\] \(episodes=\[\.\.\.\] of the others\)$"
    with pytest.raises(
        EpisodeMetadataError, match=r"episode_000001\.parquet: holds 15 rows.*\(and 1 more episodes\); " + advice
    ):
        open_dataset(root)
    assert sum(len(batch["index"]) for batch in _first_pass(root, episodes=[0, 3])) == 40  # (as told)


def _audio_only_mp4(path: Path) -> None:
    """An MP4 holding one AAC track and no video: what a file of another recording's audio looks like."""
    import av

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=16000)
        stream.layout = "mono"
        for i in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def test_a_video_file_without_a_video_stream_says_what_to_do(ds: Path) -> None:
    """It said only that the file has no video stream (PyAV's reader: that none decodes)."""
    from lerobot_dali.camera_codecs import read_file_format
    from lerobot_dali.errors import CodecUnsupportedError, VideoDecodeError
    from lerobot_dali.pyav_reader import PyAvReader

    path = ds / f"videos/{CAM}/chunk-000/file-001.mp4"  # episodes 2 and 3
    _audio_only_mp4(path)
    said = (
        rf"{re.escape(str(path))}: the file has no video stream \(it holds \['audio'\]\): download or copy it again "
        r"from the dataset's source \(`lerobot-dali check --decode` .*\), or leave out the episodes it holds "
        r"\(episodes=\[\.\.\.\] of the others\)$"
    )
    with pytest.raises(VideoDecodeError, match=said):
        _first_pass(ds)
    with pytest.raises(VideoDecodeError, match=said):
        read_file_format(open_dataset(ds), str(path))
    with pytest.raises(CodecUnsupportedError, match=said):
        PyAvReader(path, filesystem=None, threads=1, label=str(path))
    # As told: the other file's episodes read.
    assert sum(len(batch["index"]) for batch in _first_pass(ds, episodes=[0, 1])) == 40


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_data_files_cut_short_found_at_open_send_nobody_to_check(
    make_ds, copy_ds, monkeypatch, capsys, version
) -> None:
    """Found at open, the advice said `lerobot-dali check` lists every such file: check opens the dataset too and
    failed with the same message, listing nothing (2 of 2 layouts). Found as an episode is read (a v2 dataset past the
    files checked at open), check does list them, and the advice still says so."""
    from lerobot_dali import episode_data_files
    from lerobot_dali.cli import main
    from lerobot_dali.dataset_check import check_dataset

    root = copy_ds(make_ds(**{**SPEC, "version": version}, size=(64, 96)))
    for path in sorted((root / "data/chunk-000").glob("*.parquet"))[:2]:  # (v3: both files of 2 episodes each)
        table = pq.read_table(path)
        pq.write_table(table.slice(0, len(table) - 5), path)
    with pytest.raises(EpisodeMetadataError) as at_open:
        open_dataset(root)
    assert "of the others)" in str(at_open.value) and "lerobot-dali check" not in str(at_open.value)
    assert main(["check", str(root)]) != 0  # (as told before: check fails at the open too, listing nothing)
    assert capsys.readouterr().err.strip().endswith(str(at_open.value))
    if version == "v2.1":
        monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 1)
        report = check_dataset(open_dataset(root), workers=0)
        assert [p.episode_index for p in report.problems] == [0, 1]
        assert all(p.message.endswith("; `lerobot-dali check` lists every such file") for p in report.problems)


def _frame_index_set(row: int, value: int) -> Callable[[pa.Table], pa.Table]:
    """A data file rewrite giving ``frame_index`` ``value`` at ``row`` (the rest as it was)."""

    def rewrite(table: pa.Table) -> pa.Table:
        values = table["frame_index"].to_pylist()
        values[row] = value
        column = table.column_names.index("frame_index")
        return table.set_column(column, "frame_index", pa.array(values, table["frame_index"].type))

    return rewrite


def test_a_negative_frame_index_read_by_frame_index_names_its_episode_and_file(ds: Path) -> None:
    """A row's negative frame_index, its video looked up by frame_index / fps, raised a bare ValueError ('frame_indices
    must be non-negative integers, got array([...])') naming neither the dataset, the episode nor the column's file."""

    _rewrite_data(ds, _frame_index_set(3, -1))
    said = r"episode 0: column 'frame_index' of .*data/chunk-000/file-000\.parquet holds -1, a negative frame number"
    with pytest.raises(DataFileError, match=said):
        _first_pass(ds, timestamp_source="frame_index")


@pytest.mark.parametrize(("row", "value", "said"), [(4, 3, "repeats frame 3 at its row 4"), (3, 5, "goes back")])
def test_a_frame_index_out_of_order_read_by_frame_index_is_refused(ds: Path, row: int, value: int, said: str) -> None:
    """A frame_index column repeated or out of order (row 4 given row 3's value), its video looked up by
    frame_index / fps, read the wrong frames in silence: sample 4 held frame 3's picture, frame 4 was never read,
    and `check --timestamp-source frame_index` found no problem (parquet timestamps in order: 0 of 2 cases said)."""

    _rewrite_data(ds, _frame_index_set(row, value))
    pattern = rf"episode 0: column 'frame_index' of .*data/chunk-000/file-000\.parquet {said}"
    with pytest.raises(DataFileError, match=pattern):
        _first_pass(ds, timestamp_source="frame_index")
    report = check_dataset(open_dataset(ds), timestamp_source="frame_index", workers=0)
    assert sorted((p.episode_index, p.error) for p in report.problems) == [(0, "DataFileError"), (2, "DataFileError")]
    assert not check_dataset(open_dataset(ds), workers=0).problems  # (by timestamp each row reads its own frame)


def _frame_index_as(ds: Path, dtype: str, *, edit: Callable[[pa.Table], pa.Table] | None = None) -> None:
    """Store ``ds``'s frame_index columns as ``dtype`` (after ``edit`` of each data table), declared so in info.json."""

    def cast(table: pa.Table) -> pa.Table:
        table = table if edit is None else edit(table)
        column = table.column_names.index("frame_index")
        return table.set_column(column, "frame_index", table["frame_index"].cast(pa.type_for_alias(dtype)))

    _rewrite_data(ds, cast)
    info = json.loads((ds / "meta/info.json").read_text())
    info["features"]["frame_index"]["dtype"] = dtype
    (ds / "meta/info.json").write_text(json.dumps(info))


def test_an_unsigned_frame_index_that_goes_back_is_refused(ds: Path) -> None:
    """A uint32 frame_index (so declared in info.json) going back (row 3 given 5) was let through: its steps,
    unsigned, wrapped around to 4294967295 > 0, and rows 3 and 5 read each other's frames in silence."""

    _frame_index_as(ds, "uint32", edit=_frame_index_set(3, 5))
    pattern = r"episode 0: column 'frame_index' of .*file-000\.parquet goes back at its row 4 \(5 then 4"
    with pytest.raises(DataFileError, match=pattern):
        _first_pass(ds, timestamp_source="frame_index")
    report = check_dataset(open_dataset(ds), timestamp_source="frame_index", workers=0)
    assert sorted((p.episode_index, p.error) for p in report.problems) == [(0, "DataFileError"), (2, "DataFileError")]


def test_a_float_frame_index_read_by_frame_index_names_its_episode_and_file(ds: Path) -> None:
    """A float64 frame_index (so declared in info.json), its video looked up by frame_index / fps, raised a bare
    ValueError ('frame_indices must be non-negative integers, got array([0., 1., ...])') naming neither the dataset,
    the episode nor the column's file, from the iterator and in each of check's problems (4 of 4 episodes)."""

    _frame_index_as(ds, "float64")
    pattern = r"episode 0: column 'frame_index' of .*file-000\.parquet is float64, not integer frame numbers"
    with pytest.raises(DataFileError, match=pattern):
        _first_pass(ds, timestamp_source="frame_index")
    report = check_dataset(open_dataset(ds), timestamp_source="frame_index", workers=0)
    assert sorted((p.episode_index, p.error) for p in report.problems) == [(e, "DataFileError") for e in range(4)]
    assert not check_dataset(open_dataset(ds), workers=0).problems  # (by timestamp each row reads its own frame)


CR5_TASK = "put the banana on the plate"


def _cr5_v21_with_two_tasks(tmp_path: Path, lines: list[dict[str, object]]) -> Path:
    """The real v2.1 dataset cr5_v21_av1 (one task, 12 episodes), its episodes 6-11 given task_index 1 ("place it
    back" in their episodes.jsonl records) and its meta/tasks.jsonl written as ``lines``; the videos are linked, not
    copied (batches of its rows alone read none)."""
    from tests.conftest import shared_dataset

    src = shared_dataset("cr5_v21_av1")
    root = shutil.copytree(src, tmp_path / "cr5_v21", ignore=shutil.ignore_patterns("videos"))
    (root / "videos").symlink_to(src / "videos")
    for episode in range(6, 12):
        path = root / f"data/chunk-000/episode_{episode:06d}.parquet"
        table = pq.read_table(path)
        at = table.column_names.index("task_index")
        pq.write_table(table.set_column(at, "task_index", pa.array([1] * len(table), pa.int64())), path)
    records = [json.loads(line) for line in (root / "meta/episodes.jsonl").read_text().splitlines()]
    for record in records[6:]:
        record["tasks"] = ["place it back"]
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "meta/tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


@pytest.mark.parametrize(
    ("lines", "refused"),
    [
        ([(0, CR5_TASK), (1, "place it back")], None),
        ([(1, "place it back"), (0, CR5_TASK)], None),
        ([(0, CR5_TASK), (1, "place it back"), (3, "unused")], None),
        ([(0, CR5_TASK), (1, "place it back"), (1, "place it back")], None),
        ([(0, CR5_TASK), (1, "place it back"), (1, "put it down")], r"meta/tasks\.jsonl:3: bad task record \("
         r"task_index 1 is listed twice, as 'place it back' and as 'put it down'\)"),
        ([(0, CR5_TASK)], r"episode_000006\.parquet: its task_index values run from 1 to 1, and task_index \[1\] is "
         r"not in the dataset's task list \(meta/tasks\.jsonl, which holds task indices \[0\]\)"),
        ([(0, CR5_TASK), (1, ["place it back", "put it down"])], r"meta/tasks\.jsonl:2: bad task record \(task_index "
         r"1's task is \['place it back', 'put it down'\] \(list\), not a text: write it as one string\)"),
        ([(0, CR5_TASK), (1, 7)], r"meta/tasks\.jsonl:2: bad task record \(task_index 1's task is 7 \(int\), not a "
         r"text"),
    ],
    ids=["in-order", "lines-out-of-order", "unused-gap", "line-twice", "index-twice", "missing", "list", "number"],
)  # fmt: skip
def test_a_v21_task_list_gives_each_frame_lerobot_03s_task_or_is_refused(tmp_path: Path, lines, refused) -> None:
    """LeRobot 0.3.3 (the last to read v2.1) reads meta/tasks.jsonl into a dict by task_index (its lines sorted by
    it), so lines out of order, an index no row holds or a line written twice read as by index: each frame of a
    two-task copy of cr5_v21_av1 gets its own task (2,733 frames). It silently keeps the last text of an index
    listed with two, fails (KeyError) at a frame whose index is not listed, and hands a task written as a list or a
    number to the batch as that value: each refused, naming the file and line or the data file. A task that is not
    a text read as its str() ("['place it back', 'put it down']", "7") before."""
    root = _cr5_v21_with_two_tasks(tmp_path, [{"task_index": i, "task": t} for i, t in lines])
    if refused is not None:
        with pytest.raises((DatasetError, EpisodeMetadataError), match=refused):
            _first_pass(root, cameras=[], drop_last=False)
        return
    batches = _first_pass(root, cameras=[], drop_last=False)
    episodes = [int(e) for batch in batches for e in batch["episode_index"]]
    assert [text for batch in batches for text in batch["task"]] == [
        CR5_TASK if e < 6 else "place it back" for e in episodes
    ]
    assert len(episodes) == 2733 and sorted(set(episodes)) == list(range(12))
