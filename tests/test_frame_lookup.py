"""Frame lookup of real datasets' rows in videos that lost their last frames, and at the edges of its tolerance."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import pytest

from lerobot_dali import frame_lookup
from lerobot_dali.dataset_reader import VideoRef, open_dataset
from lerobot_dali.errors import DataFileError, FrameRequestError, FrameTimestampError
from lerobot_dali.frame_lookup import (
    ITERATORS_LOOKUP,
    FrameLookup,
    FrameRequestContext,
    TimestampSource,
    episode_frames,
    file_frame_numbers,
    frame_index_timestamps_s,
    nearest_frame_indices,
    row_frame_numbers,
)
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from tests.conftest import shared_dataset
from tests.video_fixtures import remux, top_level_boxes

FRAGMENTED = "frag_keyframe+empty_moov+default_base_moof"


def _without_last_gops(source: Path, target: Path, gops: int) -> Path:
    """``source``'s packets before its ``gops``-th last keyframe, remuxed: the file whole, its last GOPs gone."""
    with av.open(str(source)) as src, av.open(str(target), "w") as dst:
        packets = [packet for packet in src.demux(src.streams.video[0]) if packet.size]
        stop = [i for i, packet in enumerate(packets) if packet.is_keyframe][-gops]
        stream = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        for packet in packets[:stop]:
            packet.stream = stream
            dst.mux(packet)
    return target


def _cut_after_fragment(source: Path, target: Path) -> Path:
    """``source`` remuxed as a fragmented MP4 and cut before its last fragment (``moof``): nothing in what is left
    says that the file had more."""
    raw = remux(source, target, movflags=FRAGMENTED).read_bytes()
    last = [start for kind, start, _ in top_level_boxes(raw) if kind == b"moof"][-1]
    target.write_bytes(raw[:last])
    return target


def _frames_end_s(path: Path) -> float:
    """End of the last frame a full decode of ``path`` shows (its pts plus one frame), in seconds."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        last = max(frame.pts for frame in container.decode(stream))
        return float(last * stream.time_base + 1 / stream.average_rate)


@pytest.mark.parametrize(
    ("dataset", "camera", "episode", "cut", "stated_s"),
    [
        # v3: file-002 holds episodes 10 and 11; episode 11's to_timestamp is 45.3 s
        ("cr5_v30_av1", "observation.images.top", 11, "fragment", 45.3),
        # v2.1 (no to_timestamp): 198 rows at 10 fps
        ("cr5_v21_av1", "observation.images.top", 11, "gop", 19.8),
        # v2.0, H.264 with B-frames: 328 rows at 20 fps
        ("gr00t_v20_h264", "observation.images.ego_view", 4, "gop", 16.4),
    ],
)
def test_rows_past_a_truncated_video_are_told_to_download_it_again(
    tmp_path: Path, dataset: str, camera: str, episode: int, cut: str, stated_s: float
) -> None:
    """A video that lost its last frames (cut between two fragments of a fragmented MP4, or between two GOPs) reads
    as a shorter video: its episode's last rows have no frame. The error said to re-encode a video with fewer frames
    than rows (97 of 97 such cuts of the four real datasets' files); now it names where the frames end, the episode's
    end in meta/episodes, and says to download the file again (97 of 97)."""
    reader = open_dataset(shared_dataset(dataset), cameras=[camera])
    video = reader.video(episode, camera)
    cut_file = tmp_path / "cut.mp4"
    if cut == "fragment":
        _cut_after_fragment(Path(video.path), cut_file)
    else:
        _without_last_gops(Path(video.path), cut_file, 1)
    rows = reader.read_episode(episode, keys=[])
    with pytest.raises(FrameTimestampError) as info:
        row_frame_numbers(
            reader, episode, camera, rows, np.arange(len(rows["frame_index"])), build_packet_index(cut_file),
            timestamp_source=TimestampSource.FRAME_INDEX, tolerance_s=1e-4, video=video,
        )  # fmt: skip
    message = str(info.value)
    frames_end_s = _frames_end_s(cut_file)
    assert frames_end_s < stated_s
    assert f"frames end at {frames_end_s:.6f} s, before the episode's end at {stated_s:.6f} s" in message
    assert "truncated" in message and "Download or copy it again" in message


@pytest.mark.parametrize(
    ("name", "camera", "episode"),
    [("gr00t_v20_h264", "observation.images.ego_view", 4), ("cr5_v21_av1", "observation.images.top", 0)],
)
def test_rows_past_a_whole_video_are_told_their_timestamps_are_off(name: str, camera: str, episode: int) -> None:
    """GR00T's rows are a frame ahead of its videos by their timestamps (0.05 s to length / fps), cr5's are wall-clock
    (episode 0's last row at 20.55 s over 197 frames at 10 fps): the last row lies past the last frame of a whole file,
    whose frames end at the episode's length / fps, and past where the episode's last row belongs ((length - 1) /
    fps). That is no truncated file, nor a video with fewer frames than the rows (both hold as many frames as rows),
    which the advice said: the timestamps are off, and frame_index / fps reads them."""
    reader = open_dataset(shared_dataset(name), cameras=[camera], keys=[])
    video = reader.video(episode, camera)
    rows = reader.read_episode(episode, keys=[])
    length = len(rows["timestamp"])
    index = build_packet_index(video.path)
    assert len(index.shown_pts_s) == length  # (one file per episode, as many frames as rows)
    last_row_s = (length - 1) / reader.fps  # (from_timestamp 0: one file per episode)
    with pytest.raises(FrameTimestampError) as info:
        row_frame_numbers(
            reader, episode, camera, rows, np.array([0, length - 1]), index,
            timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4, video=video,
        )  # fmt: skip
    message = str(info.value)
    assert f"past the video's last frame and past where the episode's last row belongs ({last_row_s:.6f} s" in message
    assert "--timestamp-source frame_index" in message
    assert "fewer frames" not in message and "truncated" not in message and "download" not in message.lower()
    found = row_frame_numbers(
        reader, episode, camera, rows, np.array([0, length - 1]), index,
        timestamp_source=TimestampSource.FRAME_INDEX, tolerance_s=1e-4, video=video,
    )  # fmt: skip
    assert found.tolist() == [0, length - 1]


def test_a_row_past_the_video_is_told_the_video_is_short_only_within_the_episodes_rows(marker_video) -> None:
    """One row more than the video's frames (30 fps both): the last row, where it belongs, is past the video's last
    frame: the video is short. The same row 7.6 ms later (cr5's wall-clock episode 5 ends so over a whole video), or
    a frame later (GR00T's), is past where the episode's last row belongs by more than tolerance_s: its time is off."""
    index = build_packet_index(marker_video("h264", 30))
    last_row_s = index.frame_count / 30  # (rows 0 .. frame_count)
    context = FrameRequestContext(camera="c", rows_fps=30.0, last_row_s=last_row_s)
    for late_s, short in ((0.0, True), (5e-5, True), (0.0076, False), (1 / 30, False)):
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, [0.0, last_row_s + late_s], tolerance_s=1e-4, context=context)
        message = str(info.value)
        assert ("fewer frames than the episode has rows" in message) is short, (late_s, message)
        assert ("past where the episode's last row belongs" in message) is not short, (late_s, message)


@pytest.mark.parametrize("by_frame_index", [False, True])
def test_a_video_whose_frames_reach_the_episodes_end_keeps_the_re_encode_advice(
    marker_video, by_frame_index: bool
) -> None:
    """Frames that end at (or within half a frame of) the episode's stated end: the file is whole, only shorter than
    its rows. One frame short of the end it is judged cut short."""
    index = build_packet_index(marker_video("h264", 30))
    interval_s = index.frame_interval_s
    frames_end_s = float(index.shown_pts_s[-1]) + interval_s
    past_the_end = [0.0, frames_end_s + interval_s]
    for stated_s, truncated in ((frames_end_s, False), (frames_end_s + 0.49 * interval_s, False),
                                (frames_end_s + interval_s, True), (None, False)):  # fmt: skip
        context = FrameRequestContext(camera="c", by_frame_index=by_frame_index, episode_end_s=stated_s)
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, past_the_end, tolerance_s=1e-4, context=context)
        message = str(info.value)
        assert ("most likely truncated" in message) is truncated, (stated_s, message)
        assert ("Download or copy it again" in message) is truncated, (stated_s, message)
        assert "fewer frames than the episode has rows" in message


def test_a_video_is_judged_cut_short_only_past_half_a_frame_and_told_how_many_frames_it_lacks() -> None:
    # 2 fps, frames at 0, 0.5, 1 and 1.5 s (binary-exact), ending at 2 s: an episode stated to end at 2.25 s, exactly
    # half a frame later, holds no frame more (not cut short); at 2.5 s it lacks about 1 frame, at 3 s about 2.
    index = _constant_rate_index(4, 2)
    assert index.frame_interval_s == 0.5
    for stated_s, missing in ((2.25, None), (2.5, "about 1 frame missing"), (3.0, "about 2 frames missing")):
        context = FrameRequestContext(camera="c", episode_end_s=stated_s)
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, [0.0, 2.0], tolerance_s=1e-4, context=context)
        message = str(info.value)
        assert ("most likely truncated" in message) is (missing is not None), (stated_s, message)
        assert missing is None or f"end at {stated_s:.6f} s in meta/episodes ({missing})" in message


@pytest.mark.parametrize(("previous_end_s", "late"), [(2.0, True), (2.5, False), (3.0, False), (None, False)])
def test_a_late_from_timestamp_of_a_files_last_episode_is_told_from_a_file_cut_short(
    previous_end_s: float | None, late: bool
) -> None:
    """A file's last episode whose from_timestamp is 2 frames late (3 s, where the episode before it ends at 2 s)
    runs its rows 2 frames past the file's end: it was judged 'most likely truncated' (download it again, which gives
    the same file). 8 frames at 2 fps end at 4 s; 4 rows from 3 s end at 5 s. The file's 2 frames from 2 s, where the
    episode before ends, to 3 s are no episode's: the from_timestamp is named late, and where it belongs. With fewer
    such frames than are missing (1: the episode before ends at 2.5 s), none, or no episode before it read, the file
    is judged cut short as before."""
    index = _constant_rate_index(8, 2)
    context = FrameRequestContext(
        camera="c", rows_fps=2.0, episode_end_s=5.0, from_timestamp_s=3.0, previous_end_s=lambda: previous_end_s
    )
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, [3.0, 4.5], tolerance_s=1e-4, context=context, episode_span_s=(3.0, None))
    message = str(info.value)
    assert ("most likely truncated" in message) is not late, message
    said = (
        "The video's frames end at 4.000000 s, before the episode's end at 5.000000 s by meta/episodes (4 rows at 2 "
        "fps from its from_timestamp 3.000000 s), 2 frames short, but the file is not cut short: its 2 frames from "
        "2.000000 s, where the episode before it in the file ends (its from_timestamp + its length / fps), to this "
        "episode's from_timestamp are no episode's. The episode's from_timestamp in meta/episodes is most likely 2 "
        "frames late (2.000000 s ends its rows at the file's last frame), or the episode has 2 rows more than the "
        "file holds frames: correct videos/c/from_timestamp in meta/episodes, or leave the episode out with "
        "episodes=[...]."
    )
    assert message.endswith(said) is late, message


@pytest.mark.parametrize(
    ("from_s", "next_from_s", "previous_end_s", "cause"),
    [
        (0.5, 2.0, None, "this episode's from_timestamp is 1 frame late (0.000000 s ends its rows where the next "
                         "episode starts), or the next episode's 1 frame early (2.500000 s)"),
        (2.5, 4.0, 2.0, "this episode's from_timestamp is most likely 1 frame late (2.000000 s ends its rows where the "
                        "next episode starts: the file's frames from where the episode before it ends are no "
                        "episode's)"),
        (0.0, 1.5, None, "the next episode's from_timestamp is most likely 1 frame early (2.000000 s, where these rows "
                         "end)"),
    ],
)  # fmt: skip
def test_rows_past_the_next_episodes_start_by_meta_episodes_name_the_from_timestamps(
    from_s: float, next_from_s: float, previous_end_s: float | None, cause: str
) -> None:
    """An episode of 4 rows at 2 fps whose from_timestamp is a frame late (0.5 s: its rows end at 2.5 s, where the next
    starts at 2 s), or before which the next starts a frame early (1.5 s): its last row read the next episode's frame,
    and the advice began with 'the video holds fewer frames than its rows', of a file whose frames go on. It names
    both starts and the end by meta/episodes now; a start before the file's first frame is no cause, and a frame
    between the episode before it (ending at 2 s) and its start at 2.5 s, no episode's, makes the late start the
    likely one."""
    index = _constant_rate_index(12, 2)
    context = FrameRequestContext(
        camera="c", rows_fps=2.0, episode_end_s=from_s + 2.0, from_timestamp_s=from_s,
        previous_end_s=lambda: previous_end_s,
    )  # fmt: skip
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(
            index, [from_s, from_s + 1.5], tolerance_s=1e-4, context=context, episode_span_s=(from_s, next_from_s)
        )
    assert str(info.value).endswith(
        f"that frame belongs to a neighbouring episode, the next in the file (from its from_timestamp "
        f"{next_from_s:.6f} s on). By meta/episodes this episode's 4 rows at 2 fps from its from_timestamp "
        f"{from_s:.6f} s end at {from_s + 2.0:.6f} s, 1 frame past that start, where the file's frames go on: the "
        f"video is not short, meta/episodes is: {cause}, or the episode has 1 row more than its part of the file "
        "holds frames. Correct videos/c/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]."
    ), str(info.value)


def test_a_video_of_a_frame_for_each_row_at_another_rate_is_judged_written_at_that_rate_not_cut_short() -> None:
    """A 60 fps file in place of a 30 fps one, of as many frames as its episodes' rows, was judged 'most likely
    truncated' (download it again, which gives the same file). 4 frames at 2 fps end at 2 s; rows at 1 fps stated to
    end at 4 s have a frame each: the file's rate is named; at 4.5 s (half a row further) alike. Stated to end at 5 s,
    a frame is missing too: cut short."""
    index = _constant_rate_index(4, 2)
    for stated_s, other_rate in ((4.0, True), (4.5, True), (5.0, False)):
        context = FrameRequestContext(camera="c", rows_fps=1.0, episode_end_s=stated_s)
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, [0.0, 3.0], tolerance_s=1e-4, context=context)
        message = str(info.value)
        assert ("most likely truncated" in message) is not other_rate, (stated_s, message)
        said = (
            "holds 4 frames, a frame for each row up to that end at info.json's fps (1): its frames are 0.500000 s "
            "apart (2 fps), not 1 / 1 s"
        )
        assert (said in message and "write it again at 1 fps" in message) is other_rate, (stated_s, message)


def _constant_rate_index(frame_count: int, fps: int) -> PacketIndex:
    """A synthetic index of ``frame_count`` frames at ``fps``, in display order (time base ``1 / (512 * fps)``, as
    FFmpeg's MP4 muxer writes)."""
    pts = np.arange(frame_count, dtype=np.int64) * 512
    return PacketIndex(
        source_name="long.mp4", codec="h264", width=64, height=64, pix_fmt="yuv420p", time_base=Fraction(1, 512 * fps),
        pts=pts, dts=pts, byte_offset=np.arange(frame_count, dtype=np.int64) * 10,
        size_bytes=np.full(frame_count, 10, dtype=np.int64), keyframe=np.arange(frame_count) % 30 == 0,
        file_size_bytes=10 * frame_count, byte_exact=True, template=b"",
    )  # fmt: skip


def _one_episode_reader(length: int, fps: float) -> Any:
    """What the lookups read of a dataset holding one episode of ``length`` rows at ``fps``, in a file of its own."""
    episodes = SimpleNamespace(episode_index=np.array([0]), length=np.array([length]))
    return SimpleNamespace(
        episodes=episodes, fps=fps, frame_lookup=lambda pos: ITERATORS_LOOKUP, source_of=lambda pos: "long",
        previous_end_s=lambda pos, camera: None,  # (no episode before it in its file)
    )  # fmt: skip


def test_float32_timestamps_of_a_long_episode_find_their_frames() -> None:
    """LeRobot stores timestamps as float32, whose step is 244 us from 2,048 s on: a row at its frame's time is stored
    up to 122 us off it, more than the default tolerance_s. 6,208 of the 108,000 rows of a one-hour episode at 30 fps
    missed their frames (FrameTimestampError), which LeRobot (rounding the frame times to float32 too) reads; 0 now,
    each at its own frame, by the lookup of one episode and of a file's episodes. A row off its frame by more
    than the tolerance plus its own rounding still fails."""
    fps, length = 30, 30 * 3600
    index = _constant_rate_index(length, fps)
    reader = _one_episode_reader(length, float(fps))
    video = VideoRef("long.mp4", 0.0, None)
    rows = {"timestamp": (np.arange(length) / fps).astype(np.float32)}
    everything = np.arange(length)
    lookup = partial(row_frame_numbers, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4)
    np.testing.assert_array_equal(lookup(reader, 0, "c", rows, everything, index, video=video), everything)
    together = file_frame_numbers(
        reader, "c", index, [(0, rows, everything, video)], timestamp_source=TimestampSource.PARQUET_TIMESTAMP,
        tolerance_s=1e-4,
    )  # fmt: skip
    np.testing.assert_array_equal(together[0], everything)
    frame, step_s = 3000 * fps, float(np.spacing(np.float32(3000.0)))  # (244 us; 3,000 s itself is a float32)
    for steps, fails in ((0, False), (1, True), (-1, True)):  # (one step off: 244 us > 100 us + 122 us)
        late = {"timestamp": np.array([3000.0 + steps * step_s], dtype=np.float32)}
        if fails:
            with pytest.raises(FrameTimestampError, match=r"query timestamp (3000|2999)\.\d+ s has no video frame"):
                lookup(reader, 0, "c", late, np.array([0]), index, video=video)
        else:
            assert lookup(reader, 0, "c", late, np.array([0]), index, video=video).tolist() == [frame]


class _CountedDiff:
    """numpy, its ``diff`` calls counted (by the length of the array diffed)."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def diff(self, array: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        self.lengths.append(len(array))
        return np.diff(array, *args, **kwargs)


def test_an_episodes_frame_index_column_is_checked_once_while_it_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows looked up by frame_index / fps: each lookup diffed the episode's whole frame_index column for a repeated
    number or a step back, 33 us of the 63 us a sample's lookup took in a 20,000-row episode (a batch looks its
    samples' rows up, each a few, in episodes it read once). 200 lookups of one episode's rows diffed its column 200
    times; once now. A column read again (a new array, at a freed one's id too) is checked again: a fault in it is
    found."""
    length = 20_000
    index = _constant_rate_index(length, 30)
    reader = _one_episode_reader(length, 30.0)
    reader.data_path = lambda pos: "data/file-000.parquet"
    video = VideoRef("long.mp4", 0.0, None)
    lookup = partial(row_frame_numbers, timestamp_source=TimestampSource.FRAME_INDEX, tolerance_s=1e-4, video=video)
    counted = _CountedDiff()
    monkeypatch.setattr(frame_lookup, "np", counted)
    rows = {"frame_index": np.arange(length), "timestamp": np.zeros(length, np.float32)}
    picks = np.random.default_rng(0).integers(0, length, 200)
    found = [int(lookup(reader, 0, "c", rows, np.array([row]), index)[0]) for row in picks]
    assert found == picks.tolist()
    assert counted.lengths.count(length) == 1
    for value in range(3):  # (each column freed before the next: its id is free for the next to take)
        column = np.arange(length)
        column[5] = [5, 4, 5][value]  # (the second repeats frame 4)
        rows = {"frame_index": column, "timestamp": np.zeros(length, np.float32)}
        if value == 1:
            with pytest.raises(DataFileError, match="repeats frame 4 at its row 5"):
                lookup(reader, 0, "c", rows, np.array([9]), index)
        else:
            assert lookup(reader, 0, "c", rows, np.array([9]), index).tolist() == [9]
        del rows, column
    assert counted.lengths.count(length) == 4


def test_rows_halfway_between_frames_read_the_earlier_one_in_a_long_episode() -> None:
    """10 fps rows over a 25 fps video: every other row lies halfway between two frames, and with tolerance_s at half
    a frame reads the earlier one. Its float32 timestamp lies up to half a float32 step to either side, more than the
    tie margin (40 us) from 512 s on: 5,664 of the 18,000 halfway rows of a one-hour episode read the later frame
    (88 of the 3,000 of its first 10 minutes), so the frames a window shows stepped unevenly. 0 now."""
    length = 10 * 3600
    index = _constant_rate_index(25 * 3600, 25)
    reader = _one_episode_reader(length, 10.0)
    video = VideoRef("long.mp4", 0.0, None)
    rows = {"timestamp": (np.arange(length) / 10).astype(np.float32)}
    everything = np.arange(length)
    earlier = everything * 5 // 2  # (row k at k / 10 s: frame 2.5 k, the earlier of the two for odd k)
    options: dict[str, Any] = {"timestamp_source": TimestampSource.PARQUET_TIMESTAMP, "tolerance_s": 0.0201}
    alone = row_frame_numbers(reader, 0, "c", rows, everything, index, video=video, **options)
    np.testing.assert_array_equal(alone, earlier)
    within = everything[everything < 20480]  # (before 2,048 s a halfway row's float32 time is within tolerance_s, so
    # the file's lookup keeps its own result instead of looking each episode up alone)
    together = file_frame_numbers(reader, "c", index, [(0, rows, within, video)], **options)
    np.testing.assert_array_equal(together[0], earlier[within])


def _video_at(path: Path, rate: Fraction, frames: int, dropped: tuple[int, ...] = ()) -> Path:
    """An H.264 MP4 of ``frames`` frames at ``rate`` fps (frame ``i`` at ``i / rate`` s, in a ``1 / rate.numerator``
    time base: 30000/1001 fps as NTSC video stores it), but for the frames in ``dropped``."""
    time_base = Fraction(1, rate.numerator)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=rate, options={"g": "8", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.time_base = stream.codec_context.time_base = time_base
        for i in (i for i in range(frames) if i not in dropped):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 2 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = i * rate.denominator, time_base
            container.mux(stream.encode(frame.reformat(format="yuv420p")))
        container.mux(stream.encode())
    return path


def test_a_row_off_halfway_by_exactly_the_tolerance_is_told_it_lies_halfway() -> None:
    # 1 fps rows over 4 fps video (frames 0.25 s apart, binary-exact), tolerance_s 1/32 s: a row 0.09375 s after a
    # frame lies exactly tolerance_s from halfway (0.125 s) and is told so; one 0.09 s after it, farther, is not.
    index = _constant_rate_index(8, 4)
    context = FrameRequestContext(camera="c", rows_fps=1.0)
    for query_s, halfway in ((0.09375, True), (0.09, False)):
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, [0.0, query_s], tolerance_s=1 / 32, context=context)
        assert ("The row lies halfway between two video frames" in str(info.value)) is halfway, str(info.value)


@pytest.mark.parametrize(
    ("video_fps", "rows_fps", "named"),
    [
        (Fraction(30000, 1001), 30.0, "runs at 29.97 fps (its frames' timestamps), but info.json's fps is 30:"),
        (Fraction(30), 30000 / 1001, "runs at 30 fps (its frames' timestamps), but info.json's fps is 29.97:"),
        (Fraction(30), 25.0, "runs at 30 fps (its frames' timestamps), but info.json's fps is 25:"),
        (Fraction(25), 30.0, "fewer frames per second (25) than info.json's fps (30)"),  # (told so before)
    ],
)
def test_a_video_at_another_rate_than_info_json_names_both(
    tmp_path: Path, video_fps: Fraction, rows_fps: float, named: str
) -> None:
    """Rows at 30 fps over a 29.97 fps video drift 33 us a frame off theirs: the fourth failed the default tolerance,
    and the advice was to raise tolerance_s (or look frames up by frame_index, which fails alike), never the rates;
    a wider tolerance only moves the failure later, and past half a frame reads the neighbours' frames. 30 fps video
    under 25 fps rows said the video holds fewer frames than the rows. The advice now names both rates."""
    index = build_packet_index(_video_at(tmp_path / "v.mp4", video_fps, 90))
    for by_frame_index in (False, True):
        context = FrameRequestContext(
            dataset="d", episode_index=0, camera="c", rows_fps=rows_fps, by_frame_index=by_frame_index
        )
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, np.arange(90) / rows_fps, tolerance_s=1e-4, context=context)
        message = str(info.value)
        assert named in message
        assert "raise tolerance_s" not in message.lower() and "fewer frames than the episode has rows" not in message
        if "runs at" in message:
            assert f"Write the video again at {rows_fps:g} fps" in message
            assert f"set info.json's fps to {float(video_fps):.10g}" in message
            assert ("look frames up by frame_index" in message) is not by_frame_index  # (not where they are already)
    if "runs at" in message:
        # (which reads each row's own frame, by frame_index / the video's rate)
        found = nearest_frame_indices(index, np.arange(90) / float(f"{float(video_fps):.10g}"), tolerance_s=1e-4)
        np.testing.assert_array_equal(found, np.arange(90))


def test_a_video_at_the_rows_rate_is_not_told_of_a_rate(tmp_path: Path) -> None:
    """A 30 fps video whose rows are off for another cause (the episode's from_timestamp 2 ms late; frames dropped,
    which leave no one rate) keeps its advice: its rate is the rows'."""
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=30.0)
    steady = build_packet_index(_video_at(tmp_path / "steady.mp4", Fraction(30), 60))
    dropped = build_packet_index(_video_at(tmp_path / "dropped.mp4", Fraction(30), 60, dropped=(20, 40)))
    for index, rows_s in ((steady, 0.002 + np.arange(60) / 30), (dropped, np.arange(60) / 30)):
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, rows_s, tolerance_s=1e-4, context=context)
        assert "runs at" not in str(info.value) and "info.json's fps" not in str(info.value), str(info.value)


def _index_of(pts: np.ndarray, time_base: Fraction, name: str, keyframe: np.ndarray | None = None) -> PacketIndex:
    """A synthetic index of frames at ``pts`` (display order, 10 bytes each), every one a keyframe unless told."""
    n = len(pts)
    codec, pix_fmt = ("mjpeg", "yuvj420p") if name.endswith(".avi") else ("h264", "yuv420p")
    return PacketIndex(
        source_name=name,
        codec=codec,
        width=8,
        height=8,
        pix_fmt=pix_fmt,
        time_base=time_base,
        pts=pts,
        dts=pts,
        byte_offset=np.arange(n, dtype=np.int64) * 10,
        size_bytes=np.full(n, 10, dtype=np.int64),
        keyframe=np.ones(n, dtype=bool) if keyframe is None else keyframe,
        file_size_bytes=10 * n,
        byte_exact=True,
        template=b"",
    )


def test_a_dropped_frame_under_a_time_base_of_one_frame_is_not_told_of_a_rate() -> None:
    """A 25 fps stream whose time base is one frame (1/25 s, as an AVI's) with frame 100 of 200 dropped: its
    intervals (1 or 2 ticks) lay within two ticks of rounding, so it was taken for an even stream at 24.87 fps and
    told to set info.json's fps to 24.87437186 (1 of 1); it has no one rate, and is told of none now."""
    pts = np.delete(np.arange(200, dtype=np.int64), 100)
    index = _index_of(pts, Fraction(1, 25), "dropped.avi")
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=25.0)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, np.arange(199) / 25, tolerance_s=1e-4, context=context)
    assert "query timestamp 4.000000 s" in str(info.value)
    assert "runs at" not in str(info.value) and "info.json's fps" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("step", "time_base", "short", "rows_fps", "said"),
    [
        # 100 frames 40 ms apart on a millisecond clock (25 fps), rows at 24 fps, one interval 2 ms short: within two
        # ticks of rounding, the stream runs at 25.01 fps, 1.69 ms a frame off the rows (1 / 25.0126 - 1 / 24 s a
        # frame: 99 frames over 3.958 s), and is told so; 3 ms short, its frames are not evenly spaced (a frame
        # dropped or moved: no one rate), and no rate is named.
        (40, Fraction(1, 1000), 2, 24.0, ["runs at 25.01 fps", "by 1.69 ms a frame"]),
        (40, Fraction(1, 1000), 3, 24.0, []),
        # 100 frames 4 ticks apart (time base 1/128 s: 32 fps, binary-exact), rows at 30 fps, one interval 1 tick
        # short: told the stream's rate; 2 ticks short, as much as half a frame (within two ticks, as coarse as this
        # time base is), the frames are not evenly spaced, and no rate is named.
        (4, Fraction(1, 128), 1, 30.0, ["runs at 32.08 fps"]),
        (4, Fraction(1, 128), 2, 30.0, []),
    ],
    ids=["ms-2-ticks", "ms-3-ticks", "128th-1-tick", "128th-half-a-frame"],
)
def test_a_stream_is_told_its_rate_only_where_its_frames_are_evenly_spaced_to_within_two_ticks(
    step: int, time_base: Fraction, short: int, rows_fps: float, said: list[str]
) -> None:
    pts = np.arange(100, dtype=np.int64) * step
    pts[50:] -= short
    context = FrameRequestContext(camera="c", rows_fps=rows_fps)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(_index_of(pts, time_base, "even.mkv"), np.arange(100) / rows_fps, tolerance_s=1e-4,
                              context=context)  # fmt: skip
    message = str(info.value)
    assert ("The video's stream runs at" in message) is bool(said), message
    assert all(part in message for part in said), message


def _retimed(video: Path, rate: Fraction, fps: int) -> None:
    """``video`` (frame ``k`` at ``k / fps`` s) remuxed in place with frame ``k`` at ``k / rate`` s, its packets
    unchanged (no B-frames: VP9)."""
    target = video.with_suffix(".retimed.mp4")
    time_base = Fraction(1, rate.numerator)
    with av.open(str(video)) as src, av.open(str(target), "w") as dst:
        source = src.streams.video[0]
        stream = dst.add_stream_from_template(source, opaque=True)
        stream.time_base = time_base
        for packet in src.demux(source):
            if packet.size:
                frame = round(packet.pts * source.time_base * fps)
                packet.stream, packet.time_base = stream, time_base
                packet.pts = packet.dts = frame * rate.denominator
                dst.mux(packet)
    target.replace(video)


def test_a_dataset_whose_videos_are_at_29_97_fps_under_30_in_info_json(make_ds, tmp_path: Path) -> None:
    """A generated dataset whose videos were remuxed to 30000/1001 fps while info.json says 30: the iterator's lookup
    names both rates; the second fix it names (info.json's fps set to the video's, frames looked up by frame_index)
    reads every row."""
    root = shutil.copytree(
        make_ds(episodes=2, frames_per_episode=45, codec="vp9", gop=8, episodes_per_file=1), tmp_path / "ntsc"
    )
    for video in sorted((root / "videos").rglob("*.mp4")):
        _retimed(video, Fraction(30000, 1001), 30)
    with pytest.raises(FrameTimestampError) as info:
        DALILeRobotIterator(root, device="cpu", batch_size=4, num_workers=0, shuffle=False)
    message = str(info.value)
    assert "The video's stream runs at 29.97 fps (its frames' timestamps), but info.json's fps is 30:" in message
    assert "set info.json's fps to 29.97002997 and look frames up by frame_index / fps" in message
    info_json = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info_json, "fps": 29.97002997}))
    it = DALILeRobotIterator(
        root, device="cpu", batch_size=4, num_workers=0, shuffle=False, drop_last=False, timestamp_source="frame_index"
    )
    assert sum(len(batch["index"]) for batch in it) == 90
    it.close()


def test_frame_index_timestamps_refuse_a_negative_index() -> None:
    np.testing.assert_array_equal(frame_index_timestamps_s(np.array([0, 3]), fps=10), [0.0, 0.3])
    with pytest.raises(ValueError, match="non-negative"):
        frame_index_timestamps_s(np.array([2, -1]), fps=10)


def test_query_off_by_exactly_tolerance_plus_rounding_is_accepted() -> None:
    # Frames at 0, 1, 2 s (1 fps, time base 1/512 s, all exact in binary). A query at 0.375 s is 0.375 s from frame 0
    # (its nearest): more than tolerance_s=0.25 but exactly tolerance_s + rounding_s = 0.375, which the lookup
    # allows (it raises only past it); 0.376 s is past it.
    n = 3
    pts = np.arange(n, dtype=np.int64) * 512
    index = _index_of(pts, Fraction(1, 512), "t.mp4", keyframe=np.array([True, False, False]))
    got = nearest_frame_indices(index, [0.375, 2.0], tolerance_s=0.25, rounding_s=0.125)
    np.testing.assert_array_equal(got, [0, 2])
    with pytest.raises(FrameTimestampError):
        nearest_frame_indices(index, [0.376], tolerance_s=0.25, rounding_s=0.125)


def test_a_files_lookup_refuses_rows_off_their_frame_or_in_the_next_episode() -> None:
    # Frames at 0, 0.1, ..., 0.9 s; the episode holds [0, 0.72) of the file, so frames 0 to 6 (the next one's from
    # 0.67 s on, half a frame before 0.72 s; a frame within half a frame of its start, 0.3 s for 0.32 s, is its own).
    index = _constant_rate_index(10, 10)
    assert episode_frames(index, 0.32, 0.72) == range(3, 7)
    reader, video = _one_episode_reader(10, 10.0), VideoRef("long.mp4", 0.0, 0.72)
    lookup = partial(
        file_frame_numbers, reader, "c", index, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4
    )
    rows = {"timestamp": np.array([0.0, 0.05, 0.6, 0.7])}
    assert lookup([(0, rows, np.array([0, 2]), video)])[0].tolist() == [0, 6]
    with pytest.raises(FrameTimestampError, match=r"query timestamp 0\.050000 s has no video frame"):
        lookup([(0, rows, np.array([0, 1]), video)])  # (50 ms off both frames)
    with pytest.raises(FrameTimestampError, match=r"reads video frame 7 .* outside this episode's part of the file"):
        lookup([(0, rows, np.array([0, 3]), video)])


def test_a_row_whose_frame_is_in_the_episode_before_is_told_so() -> None:
    # Frames at 0, 0.1, ..., 0.9 s; the episode holds frames 3 to 6 ([0.32, 0.72) of the file): a row at 0.2 s reads
    # frame 2, the episode before's, and is told so (not that its rows run past the video, the next episode's cause).
    index = _constant_rate_index(10, 10)
    with pytest.raises(FrameTimestampError, match=r"frame 2 .*1 of 2 queries\): .*the one before it in the"):
        nearest_frame_indices(index, [0.3, 0.2], tolerance_s=1e-4, episode_span_s=(0.32, 0.72))


def test_a_negative_frame_index_is_named_by_the_rows_looked_up() -> None:
    # A frame_index column holding -1 and -3: rows asking for frame -1 are told of -1 (the least of theirs, not -3,
    # the column's); rows of none are told of the column's least.
    reader, video = _one_episode_reader(4, 10.0), VideoRef("long.mp4", 0.0, None)
    reader.data_path = lambda pos: "data/file-000.parquet"
    rows = {"timestamp": np.zeros(4, np.float32), "frame_index": np.array([0, -1, 2, -3])}
    lookup = partial(
        row_frame_numbers, reader, 0, "c", rows, index=_constant_rate_index(4, 10), video=video,
        timestamp_source=TimestampSource.FRAME_INDEX, tolerance_s=1e-4,
    )  # fmt: skip
    with pytest.raises(DataFileError, match=r"'frame_index' of data/file-000\.parquet holds -1, a negative frame"):
        lookup(row_indices=np.array([0, 1]))
    with pytest.raises(DataFileError, match=r"'frame_index' of data/file-000\.parquet holds -3, a negative frame"):
        lookup(row_indices=np.array([0, 2]))


def test_a_one_frame_video_reads_its_frame() -> None:
    # One frame, at 0 s: a row at it or within tolerance_s after it reads frame 0 (its only neighbour is itself).
    index = _constant_rate_index(1, 10)
    np.testing.assert_array_equal(nearest_frame_indices(index, [0.0], tolerance_s=1e-4), [0])
    np.testing.assert_array_equal(nearest_frame_indices(index, [0.04], tolerance_s=0.05), [0])


def test_a_row_off_by_less_than_a_coarse_time_bases_rounding_is_not_told_to_raise_tolerance_to_it() -> None:
    # A 10 fps video whose time base is one frame (1/10 s, as an AVI's): a row 30 ms off its frame lies within half a
    # tick of it, but half a tick is half a frame, so no rounding explains it (a tolerance_s of 0.05 s would read a
    # neighbouring frame for some rows): it gets the wall-clock advice, not "whole multiples of the time base".
    pts = np.arange(10, dtype=np.int64)
    index = _index_of(pts, Fraction(1, 10), "coarse.avi")
    with pytest.raises(FrameTimestampError, match=r"nearest frame 1 at 0\.100000 s, off by 0\.030000 s") as info:
        nearest_frame_indices(index, [0.0, 0.13], tolerance_s=1e-4)
    assert "If the dataset's parquet timestamps are wall-clock time" in str(info.value)
    assert "whole multiples" not in str(info.value)


def test_a_files_lookup_refuses_an_episode_of_no_rows_as_its_own_lookup_does() -> None:
    # Two episodes' rows of one file looked up together, the second's none: it is refused as looked up alone (no
    # empty frame list for it).
    index, reader = _constant_rate_index(10, 10), _one_episode_reader(10, 10.0)
    video, rows = VideoRef("long.mp4", 0.0, None), {"timestamp": np.arange(10) / 10}
    lookup = partial(
        file_frame_numbers, reader, "c", index, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4
    )
    assert [found.tolist() for found in lookup([(0, rows, np.array([1, 2]), video)])] == [[1, 2]]
    with pytest.raises(FrameRequestError, match=r"episode 0, camera c \(long\.mp4\): the request holds no timestamps"):
        lookup([(0, rows, np.array([1, 2]), video), (0, rows, np.array([], dtype=np.int64), video)])


def test_a_datasets_own_lookup_overrides_the_iterators() -> None:
    parquet, by_index = TimestampSource.PARQUET_TIMESTAMP, TimestampSource.FRAME_INDEX
    assert ITERATORS_LOOKUP.over(parquet, 1e-4) == (parquet, 1e-4)
    assert FrameLookup(tolerance_s=0.02).over(parquet, 1e-4) == (parquet, 0.02)
    assert FrameLookup(timestamp_source="frame_index").over(parquet, 1e-4) == (by_index, 1e-4)


def test_a_lookup_is_named_by_its_own_settings() -> None:
    # (as the union's log line names a dataset's lookup: "rows find their frames with ...")
    assert str(ITERATORS_LOOKUP) == "the iterator's"
    assert str(FrameLookup(tolerance_s=0.02)) == "tolerance_s=0.02"
    assert str(FrameLookup("frame_index", 0.02)) == "timestamp_source=frame_index, tolerance_s=0.02"


def test_a_stored_times_rounding_is_half_a_float32_step() -> None:
    # float32 steps 2**-12 s (244 us) from 2,048 s to 4,096 s, 2**-23 s from 1 s to 2 s; float64 times are exact.
    rounding_s = frame_lookup._stored_time_rounding_s(np.array([3000.0, 1.5], dtype=np.float32))
    np.testing.assert_array_equal(rounding_s, [2.0**-13, 2.0**-24])
    assert frame_lookup._stored_time_rounding_s(np.array([3000.0])) == 0.0


_NEXT_STARTS = "that frame belongs to a neighbouring episode, the next in the file (from its from_timestamp "
_GENERIC = (
    "the next in the file (from its from_timestamp on). The episode's data rows run past its video (the video holds "
    "fewer frames than its rows), or the rows' timestamps or a from_timestamp in meta/episodes are wrong."
)
_NOT_SHORT = (
    ", where the file's frames go on: the video is not short, meta/episodes is: this episode's from_timestamp is "
)


@pytest.mark.parametrize(
    ("video_fps", "rows_fps", "from_s", "next_from_s", "previous_end_s", "camera", "queries", "said"),
    [
        (2, 2, None, 1.5, None, "c", [0.5, 2.0], _GENERIC),
        (2, 2, 0.25, 2.0, None, "c", [0.5, 2.0], _GENERIC),
        (2, 2, 0.25, 1.75, None, "c", [0.5, 2.0], f"{_NEXT_STARTS}1.750000 s on). By meta/episodes this episode's 4 "
         f"rows at 2 fps from its from_timestamp 0.250000 s end at 2.250000 s, 1 frame past that start{_NOT_SHORT}1 "
         "frame late (-0.250000 s ends its rows where the next episode starts), or the next episode's 1 frame early "
         "(2.250000 s), or the episode has 1 row more than its part of the file holds frames. Correct "
         "videos/c/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]."),
        (4, 2, 0.2, 2.0, None, "", [0.25, 2.0], f"{_NEXT_STARTS}2.000000 s on). By meta/episodes this episode's 4 "
         f"rows at 2 fps from its from_timestamp 0.200000 s end at 2.200000 s, 1 frame past that start{_NOT_SHORT}1 "
         "frame late (0.000000 s ends its rows where the next episode starts), or the next episode's 1 frame early "
         "(2.200000 s), or the episode has 1 row more than its part of the file holds frames. Correct "
         "videos/<camera>/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]."),
        (2, 4, 0.0, 1.8, None, "c", [0.5, 2.0], f"{_NEXT_STARTS}1.800000 s on). By meta/episodes this episode's 8 "
         f"rows at 4 fps from its from_timestamp 0.000000 s end at 2.000000 s, 1 frame past that start{_NOT_SHORT}1 "
         "frame late (-0.200000 s ends its rows where the next episode starts), or the next episode's 1 frame early "
         "(2.000000 s), or the episode has 1 row more than its part of the file holds frames. Correct "
         "videos/c/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]."),
        (2, 2, 4.25, 5.25, 3.5, "c", [4.5, 5.5], f"{_NEXT_STARTS}5.250000 s on). By meta/episodes this episode's 4 "
         f"rows at 2 fps from its from_timestamp 4.250000 s end at 6.250000 s, 2 frames past that start{_NOT_SHORT}2 "
         "frames late (3.250000 s ends its rows where the next episode starts), or the next episode's 2 frames early "
         "(6.250000 s), or the episode has 2 rows more than its part of the file holds frames. Correct "
         "videos/c/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]."),
        (2, 2, 4.25, 5.25, 3.25, "c", [4.5, 5.5], f"{_NEXT_STARTS}5.250000 s on). By meta/episodes this episode's 4 "
         f"rows at 2 fps from its from_timestamp 4.250000 s end at 6.250000 s, 2 frames past that start{_NOT_SHORT}"
         "most likely 2 frames late (3.250000 s ends its rows where the next episode starts: the file's frames from "
         "where the episode before it ends are no episode's), or the episode has 2 rows more than its part of the "
         "file holds frames. Correct videos/c/from_timestamp in meta/episodes, or leave the episode out with "
         "episodes=[...]."),
    ],
    ids=["starts-unknown", "ends-half-a-frame-past", "could-start-half-a-frame-before-the-file", "faster-video",
         "slower-video", "one-frame-unread-before", "two-frames-unread-before"],
)  # fmt: skip
def test_rows_past_the_next_start_are_told_which_from_timestamp_is_wrong_only_as_far_as_known(
    video_fps: int, rows_fps: int, from_s: float | None, next_from_s: float, previous_end_s: float | None,
    camera: str, queries: list[float], said: str,
) -> None:  # fmt: skip
    """Episodes of rows over 2 s (4 at 2 fps) whose last row reads the next episode's frame. Told the generic advice
    where the episode's from_timestamp is not known, or its rows by meta/episodes end half a frame past the next start
    (2.25 s where it starts at 2 s: no further); told that meta/episodes is wrong otherwise, naming both starts where
    this one could start only half a frame before the file's first frame (-0.25 s), or runs less than a row over a
    faster video (4 fps: 0.2 s, 1 frame), or more than half a row (8 rows at 4 fps: 0.2 s) but less than half a frame
    over a slower one (2 fps), or 1 frame of the 2 it runs over lies between the episode before it (ending at 3.5 s)
    and its start at 4.25 s (the frame at 4 s, half a frame before it, is its own); its own start named late where 2
    do (the episode before it ending at 3.25 s: the frame at 3 s, half a frame before that end, is no episode's
    either). A context without a camera says <camera>."""
    index = _constant_rate_index(24, video_fps)
    context = FrameRequestContext(
        camera=camera, rows_fps=float(rows_fps) if from_s is not None else None, from_timestamp_s=from_s,
        episode_end_s=None if from_s is None else from_s + 2.0,
        previous_end_s=None if previous_end_s is None else lambda: previous_end_s,
    )  # fmt: skip
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(
            index, queries, tolerance_s=1e-4, context=context, episode_span_s=(from_s or 0.0, next_from_s)
        )
    assert str(info.value).endswith(said), str(info.value)
