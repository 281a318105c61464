"""Packet index (demux-only) and timestamp -> frame lookup, against independent PyAV demux/decode."""

from __future__ import annotations

import io
import logging
import os
import pickle
import re
import shutil
import struct
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest

import lerobot_dali.packet_index as packet_index
from lerobot_dali import mp4_tables
from lerobot_dali.clips import plan_clip
from lerobot_dali.episode_ranges import episode_span
from lerobot_dali.errors import (
    DAMAGED_VIDEO_ADVICE,
    CodecUnsupportedError,
    FrameRequestError,
    FrameTimestampError,
    MissingDataFileError,
    VideoDecodeError,
)
from lerobot_dali.frame_lookup import (
    FrameRequestContext,
    TimestampSource,
    episode_frames,
    frame_index_timestamps_s,
    nearest_frame_indices,
)
from lerobot_dali.mp4_tables import Mp4Track, mp4_file_cut
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.packet_index_cache import PacketIndexCache, load_packet_index
from lerobot_dali.pyav_reader import PyAvReader
from tests.conftest import shared_dataset
from tests.video_fixtures import (
    EPISODE_LENGTHS,
    FPS,
    MarkerVideo,
    cr5_episodes,
    cr5_video,
    r1_video,
    remux,
    top_level_boxes,
    with_movie_duration,
    write_undecodable_mp4,
)


def _demux_reference(path: Path) -> list[tuple[int, int, bool, bytes]]:
    with av.open(str(path)) as container:
        return [(p.pts, p.dts, p.is_keyframe, bytes(p)) for p in container.demux(container.streams.video[0]) if p.size]


def _decoded_pts(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        return [frame.pts for frame in container.decode(video=0)]


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [2, 30])
def test_index_matches_demux_and_decode(marker_video: MarkerVideo, codec: str, gop: int) -> None:
    path = marker_video(codec, gop)
    index = build_packet_index(path)
    packets = _demux_reference(path)
    assert index.codec == codec
    assert (index.width, index.height) == (96, 64)
    assert index.frame_count == sum(EPISODE_LENGTHS)
    assert index.pts.tolist() == [p[0] for p in packets]
    assert index.dts.tolist() == [p[1] for p in packets]
    assert index.keyframe.tolist() == [p[2] for p in packets]
    # Display order is what a sequential decode outputs, and frame i was encoded at i / fps.
    assert index.frame_pts.tolist() == _decoded_pts(path)
    np.testing.assert_allclose(index.frame_pts_s, np.arange(index.frame_count) / FPS, atol=1e-9)
    assert index.byte_exact
    raw = path.read_bytes()
    for position in (0, 1, index.frame_count // 2, index.frame_count - 1):
        offset, size = int(index.byte_offset[position]), int(index.size_bytes[position])
        assert raw[offset : offset + size] == packets[position][3]
    assert index.file_size_bytes == len(raw)


def test_h264_b_frames_reorder(marker_video: MarkerVideo) -> None:
    index = build_packet_index(marker_video("h264", 30))
    assert not np.array_equal(index.display_order, np.arange(index.frame_count))
    assert np.all(np.diff(index.frame_pts) > 0)
    np.testing.assert_array_equal(index.display_order[index.display_rank], np.arange(index.frame_count))


def test_real_files() -> None:
    r1 = build_packet_index(r1_video())
    assert (r1.codec, r1.width, r1.height, r1.frame_count) == ("h264", 640, 360, 1975)
    np.testing.assert_allclose(r1.frame_pts_s[:5], [0.0, 0.04, 0.08, 0.12, 0.16], atol=1e-9)
    assert not np.array_equal(r1.display_order, np.arange(r1.frame_count))  # B-frames
    episodes = cr5_episodes()
    files = np.asarray(episodes["videos/observation.images.top/file_index"])
    lengths = np.asarray(episodes["length"])
    to_s = np.asarray(episodes["videos/observation.images.top/to_timestamp"])
    for file_index in range(3):
        index = build_packet_index(cr5_video(file_index))
        assert index.codec == "av1"
        assert index.frame_count == lengths[files == file_index].sum()
        assert index.frame_pts_s[-1] + 0.1 == pytest.approx(to_s[files == file_index].max(), abs=1e-6)


def _long_index(pts: np.ndarray, dts: np.ndarray, size_bytes: int = 700) -> packet_index.PacketIndex:
    count = len(pts)
    return packet_index.PacketIndex(
        source_name="long.mp4",
        codec="h264",
        width=64,
        height=64,
        pix_fmt="yuv420p",
        time_base=Fraction(1, 15360),
        pts=pts,
        dts=dts,
        byte_offset=np.arange(count, dtype=np.int64) * size_bytes,
        size_bytes=np.full(count, size_bytes, dtype=np.int64),
        keyframe=np.arange(count) % 15 == 0,
        file_size_bytes=count * size_bytes,
        byte_exact=True,
        template=b"",
    )


def test_an_index_in_display_order_holds_34_bytes_a_frame() -> None:
    """A worker caches the indexes of every file its pool uses (hundreds of 30,000-frame files): a stream without
    B-frames (AV1, LeRobot's codec) keeps one timestamp array and one position array, not three and two (65 bytes)."""
    count = 30_000
    pts = np.arange(count, dtype=np.int64) * 1024
    index = _long_index(pts, pts.copy())
    assert index.nbytes <= 34 * count
    assert index.dts is index.pts and index.frame_pts is index.pts and index.display_rank is index.display_order
    np.testing.assert_array_equal(index.display_order, np.arange(count))
    assert index.size_bytes.tolist() == [700] * count and index.dts.tolist() == pts.tolist()


def test_an_index_with_b_frames_holds_46_bytes_a_frame() -> None:
    """Positions and packet sizes fit int32 (a packet of 2 GiB or more keeps int64); timestamps and offsets stay
    int64; the frames' pts in display order are computed when asked for, not kept."""
    count = 30_000
    pts = (np.arange(count, dtype=np.int64) + np.tile([0, 2, -1, 1, -2], count // 5)) * 1024  # (a shuffled order)
    index = _long_index(pts, np.arange(count, dtype=np.int64) * 1024 - 2048)
    assert index.nbytes <= 46 * count  # (45, and its keyframes' positions)
    np.testing.assert_array_equal(index.frame_pts, np.sort(pts))
    np.testing.assert_array_equal(index.pts_of_frames([4, 0, 29_999]), np.sort(pts)[[4, 0, 29_999]])
    np.testing.assert_array_equal(index.display_order[index.display_rank], np.arange(count))
    np.testing.assert_array_equal(index.pts[index.display_order], np.sort(pts))
    huge = _long_index(pts[:5], pts[:5], size_bytes=2**31)
    assert huge.size_bytes.dtype == np.int64 and huge.size_bytes.tolist() == [2**31] * 5
    largest = _long_index(pts[:5], pts[:5], size_bytes=2**31 - 1)  # (int32's largest value still fits)
    assert largest.size_bytes.dtype == np.int32 and largest.size_bytes.tolist() == [2**31 - 1] * 5


def _gop_index(pts: list[int], keyframes: list[int], hidden: list[int] = ()) -> packet_index.PacketIndex:
    """A 10-packet index (decode order) of ``pts`` (in units of 512) whose keyframes and hidden packets are the decode
    positions given."""
    count = len(pts)
    return replace(
        _long_index(np.asarray(pts, dtype=np.int64) * 512, np.arange(count, dtype=np.int64) * 512 - 1024),
        keyframe=np.isin(np.arange(count), keyframes),
        hidden=np.isin(np.arange(count), hidden),
    )


def test_display_order_keyframes_and_shown_frames_by_hand() -> None:
    """Display order, keyframe slots, the keyframe a clip starts at, the typical frame distance (a median: one long
    gap does not make every frame long) and the frames an edit list shows, worked out by hand for one B-frame stream:
    decode order pts 0 3 1 2 | 4 7 5 6 | 8 12, keyframes at decode positions 0, 4 and 8."""
    index = _gop_index([0, 3, 1, 2, 4, 7, 5, 6, 8, 12], keyframes=[0, 4, 8])
    assert index.display_order.tolist() == [0, 2, 3, 1, 4, 6, 7, 5, 8, 9]
    assert index.display_rank.tolist() == [0, 3, 1, 2, 4, 7, 5, 6, 8, 9]
    assert index.frame_duration == 512 and index.frame_interval_s == pytest.approx(512 / 15360)
    assert index.keyframe_positions.tolist() == [0, 4, 8]
    assert index.keyframe_slots([0, 3, 4, 7, 8, 9]).tolist() == [0, 0, 1, 1, 2, 2]
    assert index.has_leading_pictures is False  # (every picture shows at or after its GOP's keyframe)
    assert index.start_keyframe([5, 1]) == 0  # (display frame 1 is decode position 2, in the first GOP)
    assert index.start_keyframe([7, 4]) == 4
    assert index.start_keyframe([9, 8]) == 8
    assert index.shown == range(10) and index.hidden is None
    # A stream that does not start on a keyframe decodes from its start: position 0 counts as one.
    late = _gop_index([0, 3, 1, 2, 4, 7, 5, 6, 8, 12], keyframes=[4, 8])
    assert late.keyframe_positions.tolist() == [0, 4, 8]
    assert late.keyframe_slots([3, 4]).tolist() == [0, 1] and late.start_keyframe([2]) == 0
    # Display frames map to decode positions through display_order, not its inverse: here a 3-cycle across two GOPs
    # (decode order pts 0 2 3 | 1 4 5) tells them apart. Display frame 1 is decode position 3 (the second keyframe),
    # display frame 2 decode position 1 (the first GOP); display_rank would send them the other way.
    crossed = _gop_index([0, 2, 3, 1, 4, 5], keyframes=[0, 3])
    assert crossed.display_order.tolist() == [0, 3, 1, 2, 4, 5] and crossed.display_rank.tolist() == [0, 2, 3, 1, 4, 5]
    assert [crossed.start_keyframe([frame]) for frame in range(6)] == [0, 3, 0, 0, 3, 3]
    # Decode position 5 (pts 4) shows before its GOP's keyframe (pts 5): a leading picture.
    assert _gop_index([0, 3, 1, 2, 5, 4, 7, 6, 8, 9], keyframes=[0, 4, 8]).has_leading_pictures is True
    # An edit list hiding the first and the last frame shown (decode positions 0 and 9: display 0 and 9).
    trimmed = _gop_index([0, 3, 1, 2, 4, 7, 5, 6, 8, 12], keyframes=[0, 4, 8], hidden=[0, 9])
    assert trimmed.shown == range(1, 9)
    assert trimmed.shown_pts.tolist() == [512 * k for k in range(1, 9)]
    assert trimmed.shown_pts_s.tolist() == pytest.approx([512 * k / 15360 for k in range(1, 9)])
    with pytest.raises(VideoDecodeError, match="hides every one of its 10 frames"):
        _gop_index([0, 3, 1, 2, 4, 7, 5, 6, 8, 12], keyframes=[0, 4, 8], hidden=list(range(10)))
    with pytest.raises(VideoDecodeError, match="hides 1 frame among those it shows"):
        _gop_index([0, 3, 1, 2, 4, 7, 5, 6, 8, 12], keyframes=[0, 4, 8], hidden=[0, 4])


def test_the_frame_duration_is_at_least_one_tick() -> None:
    """The typical frame distance is the median of the pts steps, at least one tick: a stream whose time base is its
    frame (pts 0, 1, 2, ...) has frames 1 tick apart, as has a single frame (no step to measure)."""
    ticks = _long_index(np.arange(5, dtype=np.int64), np.arange(5, dtype=np.int64))
    assert ticks.frame_duration == 1 and ticks.frame_interval_s == pytest.approx(1 / 15360)
    single = _long_index(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    assert single.frame_duration == 1 and single.frame_interval_s == pytest.approx(1 / 15360)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"dts": np.zeros(4, dtype=np.int64)}, r"PacketIndex\.dts has 4 entries, pts has 5\."),
        ({"hidden": np.zeros(6, dtype=bool)}, r"PacketIndex\.hidden has 6 entries, pts has 5\."),
        ({"time_base": Fraction(0)}, r"PacketIndex\.time_base must be positive, got 0\."),
    ],
    ids=["dts_short", "hidden_long", "time_base_0"],
)
def test_an_index_whose_fields_do_not_fit_its_packets_is_refused(changes: dict[str, object], said: str) -> None:
    """Each per-packet array holds one entry a packet (``hidden`` too, where given), and the time base is positive: at
    a time base of 0 every frame would show at 0 s."""
    index = _long_index(np.arange(5, dtype=np.int64) * 512, np.arange(5, dtype=np.int64) * 512)
    with pytest.raises(ValueError, match=said):
        replace(index, **changes)


def test_sources_path_fsspec_and_file_objects(marker_video: MarkerVideo) -> None:
    path = marker_video("vp9", 2)
    expected = build_packet_index(path).pts
    memory = fsspec.filesystem("memory")
    memory.pipe("/clips/v.mp4", path.read_bytes())
    np.testing.assert_array_equal(build_packet_index("/clips/v.mp4", filesystem=memory).pts, expected)
    with memory.open("/clips/v.mp4", "rb") as handle:
        np.testing.assert_array_equal(build_packet_index(handle).pts, expected)
    with open(path, "rb") as handle:
        np.testing.assert_array_equal(build_packet_index(handle).pts, expected)


def test_index_pickles(marker_video: MarkerVideo) -> None:
    index = build_packet_index(marker_video("hevc", 30))
    copy = pickle.loads(pickle.dumps(index))
    np.testing.assert_array_equal(copy.display_order, index.display_order)
    assert copy.template == index.template
    assert copy.time_base == index.time_base


def test_cache_reuses_and_notices_changes(marker_video: MarkerVideo, tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    shutil.copyfile(marker_video("av1", 2), path)
    cache = PacketIndexCache(max_entries=2)
    first = cache.get(path)
    assert cache.get(str(path)) is first
    shutil.copyfile(marker_video("av1", 30), path)  # different size and mtime
    os.utime(path, ns=(1, 1))
    second = cache.get(path)
    assert second is not first
    np.testing.assert_array_equal(second.keyframe, build_packet_index(marker_video("av1", 30)).keyframe)
    for codec in ("h264", "hevc"):
        cache.get(marker_video(codec, 2))
    assert len(cache) == 2
    assert load_packet_index(path) is load_packet_index(path)
    with pytest.raises(ValueError, match="max_entries"):
        PacketIndexCache(max_entries=0)


def test_cache_is_bounded_by_bytes_too(marker_video: MarkerVideo) -> None:
    """A worker's pool may use hundreds of files; the indices of long files weigh 34-46 bytes a frame."""
    paths = [marker_video(codec, 2) for codec in ("av1", "h264", "hevc", "vp9")]
    sizes = [build_packet_index(p).nbytes for p in paths]
    cache = PacketIndexCache(max_entries=100, max_bytes=sizes[-1] + sizes[-2])
    for p in paths:
        cache.get(p)
    assert len(cache) == 2 and cache.nbytes == sizes[-1] + sizes[-2]  # the two newest
    cache.get(paths[-1])  # a hit changes nothing
    assert cache.nbytes == sizes[-1] + sizes[-2]
    tiny = PacketIndexCache(max_bytes=1)
    assert tiny.get(paths[0]) is tiny.get(paths[0])  # the newest is always kept
    restored = pickle.loads(pickle.dumps(cache))
    assert (restored.max_entries, restored.max_bytes, len(restored)) == (100, cache.max_bytes, 0)
    with pytest.raises(ValueError, match="max_bytes"):
        PacketIndexCache(max_bytes=0)


def test_missing_file_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    with pytest.raises(MissingDataFileError, match="nope.mp4"):
        build_packet_index(missing)
    with pytest.raises(MissingDataFileError, match="nope.mp4"):
        PacketIndexCache().get(missing)
    with pytest.raises(MissingDataFileError, match="nope.mp4"):
        build_packet_index("/nope.mp4", filesystem=fsspec.filesystem("memory"))


def test_truncated_and_corrupt_files(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Each error says what to do, not only what is wrong ("the file is truncated or corrupt." was all it said)."""
    raw = marker_video("h264", 30).read_bytes()
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(raw[: len(raw) // 2])
    advice = re.escape(f": {DAMAGED_VIDEO_ADVICE}")
    with pytest.raises(VideoDecodeError, match=f"truncated.mp4: cannot read the video container .*{advice}$"):
        build_packet_index(truncated)
    with pytest.raises(VideoDecodeError, match=f"truncated.mp4: cannot open the video .*{advice}$"):
        PyAvReader(str(truncated), filesystem=None, threads=1, label=str(truncated))
    # Cut inside the moov box (written last, after the media data): FFmpeg opens it, with no stream at all.
    mdat = raw.find(b"mdat") - 4
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(raw[: mdat + int.from_bytes(raw[mdat : mdat + 4], "big") + 16])
    with av.open(str(cut)) as container:
        assert len(container.streams) == 0
    with pytest.raises(VideoDecodeError, match=r"cut\.mp4: the file holds no stream: it is truncated"):
        build_packet_index(cut)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(VideoDecodeError, match=f"garbage.mp4: .*{advice}$"):
        build_packet_index(garbage)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(VideoDecodeError, match=f"empty.mp4: .*{advice}$"):
        build_packet_index(empty)


def test_pyav_decode_faults_say_what_to_do(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PyAV reader's decode faults ended at "the file is corrupt or truncated." as its open's once did."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    frames = np.array([5])
    advice = re.escape(f": {DAMAGED_VIDEO_ADVICE}")
    reader = PyAvReader(str(path), filesystem=None, threads=1, label="v.mp4")
    try:
        # A frame at a timestamp the file lacks (its index entry one tick off): the decoder never shows it.
        pts = index.pts.copy()
        pts[index.display_order[5]] += 1
        off = replace(index, pts=pts)
        with pytest.raises(VideoDecodeError, match=f"v.mp4: the decoder produced no frame .*{advice}$"):
            reader.frames_at(off, plan_clip(off, frames), frames, lambda frame: frame.pts)

        def failing(*args: object) -> Iterator[av.Packet]:
            raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input")
            yield  # (a generator, as packets_from_keyframe is)

        monkeypatch.setattr("lerobot_dali.pyav_reader.packets_from_keyframe", failing)
        with pytest.raises(VideoDecodeError, match=f"v.mp4: decoding failed .*{advice}$"):
            reader.frames_at(index, plan_clip(index, frames), frames, lambda frame: frame.pts)
    finally:
        reader.close()


def test_codec_without_any_decoder(tmp_path: Path) -> None:
    """The packet index names the codec its sample description gives; the PyAV reader, opened on such a file without
    an index, says FFmpeg has no decoder for it (its stream's codec context is None), not an AttributeError."""
    path = write_undecodable_mp4(tmp_path / "evc.mp4", frames=3, fps=10, width=64, height=64)
    with pytest.raises(CodecUnsupportedError, match="evc.mp4.*names codec 'evc1': neither NVDEC.*re-encode it"):
        build_packet_index(path)
    with pytest.raises(CodecUnsupportedError, match=r"^evc\.mp4: FFmpeg finds no decoder for the video stream; either"):
        PyAvReader(str(path), filesystem=None, threads=1, label="evc.mp4")


def test_a_header_too_damaged_to_name_its_codec_is_called_damaged(marker_video: MarkerVideo, tmp_path: Path) -> None:
    raw = marker_video("h264", 30).read_bytes()
    entry = raw.index(b"avc1", raw.index(b"stsd"))
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(raw[:entry] + bytes(4) + raw[entry + 4 :])  # the sample description's codec zeroed
    with pytest.raises(CodecUnsupportedError, match=r"damaged.mp4.*codec b'\\x00.*no codec name: the file is damaged"):
        build_packet_index(damaged)


def test_a_sample_description_names_a_codec_in_printable_ascii_only() -> None:
    """A fourcc is printable ASCII, space (0x20) to tilde (0x7E): one with a byte below or above names no codec."""

    def said(entry: bytes | None) -> str:
        track = None if entry is None else Mp4Track(1, 1, np.array([]), np.array([]), False, sample_entry=entry)
        return str(packet_index.no_decoder_error("v.mp4", track))

    assert "names codec ' ~1 ': neither NVDEC" in said(b" ~1 ")
    assert "names codec b'av\\x1f1', which is no codec name: the file is damaged" in said(b"av\x1f1")
    assert "names codec b'av\\x7f1', which is no codec name" in said(b"av\x7f1")
    assert "FFmpeg finds no decoder for the video stream; either the file is damaged" in said(None)


# --- frame lookup -------------------------------------------------------------------------------------


def test_nearest_frames_exact_and_within_tolerance(marker_video: MarkerVideo) -> None:
    index = build_packet_index(marker_video("h264", 30))
    frames = np.array([0, 1, 29, 30, 54, 55, 89, 3, 3])
    exact = nearest_frame_indices(index, frames / FPS, tolerance_s=1e-4)
    np.testing.assert_array_equal(exact, frames)
    jittered = frames / FPS + np.where(frames % 2 == 0, 4e-3, -4e-3)
    np.testing.assert_array_equal(nearest_frame_indices(index, jittered, tolerance_s=5e-3), frames)
    # Halfway between two frames goes to the earlier one.
    assert nearest_frame_indices(index, [0.5 / FPS], tolerance_s=0.1).tolist() == [0]


def test_lookup_error_names_request(marker_video: MarkerVideo) -> None:
    index = build_packet_index(marker_video("vp9", 2))
    context = FrameRequestContext(dataset="user/ds", episode_index=2, camera="observation.images.top")
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, [0.0, 1.0 + 0.01], tolerance_s=1e-4, context=context)
    message = str(info.value)
    for part in ("user/ds", "episode 2", "observation.images.top", "1.010000", "frame 30", "1.000000", "vp9_g2"):
        assert part in message
    with pytest.raises(FrameTimestampError, match="spans"):
        nearest_frame_indices(index, [3.5], tolerance_s=1e-4)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(FrameTimestampError, match="finite"):
            nearest_frame_indices(index, [0.0, bad], tolerance_s=1e-4)
    with pytest.raises(FrameRequestError, match="vp9_g2"):
        nearest_frame_indices(index, [], tolerance_s=1e-4)
    for tolerance_s in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="tolerance_s"):
            nearest_frame_indices(index, [0.0], tolerance_s=tolerance_s)


@pytest.mark.parametrize(("rows_fps", "halfway"), [(12, True), (30, False), (None, False)])
def test_halfway_advice_only_where_the_video_has_more_frames(marker_video: MarkerVideo, rows_fps, halfway) -> None:
    """A row exactly between two 30 fps frames is 'raise tolerance_s' advice only for rows of a lower fps; at
    the video's own fps the row is merely late (wall-clock jitter lands near half a frame too), and the
    advice there is frame_index, which the halfway advice had replaced."""
    index = build_packet_index(marker_video("h264", 30))
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=rows_fps)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, [0.0, 10.5 / FPS], tolerance_s=1e-4, context=context)
    message = str(info.value)
    assert ("halfway between two video frames" in message) is halfway
    assert ("Raise tolerance_s to 0.01677" in message) is halfway
    assert ("frame_index / fps" in message) is not halfway


def _millisecond_video(path: Path, pts_ms: list[int]) -> Path:
    """An H.264 MP4 whose frame ``i`` sits at ``pts_ms[i]`` ms (as MKV remuxes and millisecond-clock recorders
    write; the MP4 muxer stores them in a 1/16000 s time base)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30, options={"g": "4", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        for i, pts in enumerate(pts_ms):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 8 * i, np.uint8), format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            container.mux(stream.encode(frame.reformat(format="yuv420p")))
        container.mux(stream.encode())
    return path


def test_millisecond_frame_times_are_named_with_the_tolerance_that_reads_them(tmp_path: Path) -> None:
    """30 fps on a millisecond clock puts frame 29 at 0.967 s, 0.33 ms from its row's 29 / 30 s: LeRobot's
    tolerance (0.1 ms) refuses the row (LeRobot 0.4.4 too), and the advice was frame_index / fps (which reads the
    same 29 / 30 s) or from_timestamp. Now it names the rounding and the tolerance that reads each row's frame."""
    index = build_packet_index(_millisecond_video(tmp_path / "ms.mp4", [round(i * 1000 / 30) for i in range(30)]))
    rows_s = np.arange(30, dtype=np.float32).astype(np.float64) / 30
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=30)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, rows_s, tolerance_s=1e-4, context=context)
    message = str(info.value)
    assert index.time_base == Fraction(1, 16000)
    assert "frame times are whole multiples of a millisecond" in message
    assert "Raise tolerance_s to 0.0006" in message
    assert "frame_index" not in message
    np.testing.assert_array_equal(nearest_frame_indices(index, rows_s, tolerance_s=6e-4), np.arange(30))
    # A row off by more than the rounding (a frame 4 ms late) gets the other advice, naming that frame.
    late = build_packet_index(_millisecond_video(tmp_path / "late.mp4", [0, 33, 71, 100]))
    with pytest.raises(FrameTimestampError, match="nearest frame 2 at 0.071000 s") as info:
        nearest_frame_indices(late, rows_s[:4], tolerance_s=1e-4, context=context)
    assert "whole multiples" not in str(info.value)


@pytest.mark.parametrize("by_frame_index", [False, True])
def test_a_video_that_starts_late_is_named_with_its_first_frame(tmp_path: Path, by_frame_index: bool) -> None:
    """A video whose first frame is at 0.08 s (B-frames muxed without an edit list: two frames of reorder delay at
    25 fps) fails the episode's first row at 0 s. The advice was frame_index / fps (which reads 0 s too) or, by
    frame_index, the video's frame rate; now it names the video's first frame time and from_timestamp."""
    index = build_packet_index(_millisecond_video(tmp_path / "late.mp4", [80 + 40 * i for i in range(5)]))
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=25, by_frame_index=by_frame_index)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, [0.0, 0.16], tolerance_s=1e-4, context=context)
    message = str(info.value)
    assert "query timestamp 0.000000 s" in message
    assert "before the video's first frame (0.080000 s)" in message
    assert "from_timestamp" in message
    assert "frame rate" not in message and "timestamp_source=" not in message


@pytest.mark.parametrize("by_frame_index", [False, True])
def test_rows_of_a_higher_fps_than_the_video_are_told_so(marker_video: MarkerVideo, by_frame_index: bool) -> None:
    """info.json saying 30 fps over a 25 fps video: the first rows off a frame (1/30 s: 6.7 ms from the frame at
    1/25 s) were told to look frames up by frame_index / fps (which fails alike) or to raise tolerance_s, which then
    reads some frames for two rows. The message now names both rates."""
    index = build_packet_index(marker_video("h264", 30))  # (30 fps video: rows of 36 fps stand for 30 over 25)
    context = FrameRequestContext(dataset="d", camera="c", rows_fps=36.0, by_frame_index=by_frame_index)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, np.arange(6) / 36.0, tolerance_s=1e-4, context=context)
    message = str(info.value)
    assert "The video has fewer frames per second (30) than info.json's fps (36)" in message
    assert "raise tolerance_s" not in message.lower()
    for rows_fps in (30.0, 30.1):  # (at the video's own rate, and within 1 %: rows merely off their frames)
        context = FrameRequestContext(dataset="d", camera="c", rows_fps=rows_fps)
        with pytest.raises(FrameTimestampError) as info:
            nearest_frame_indices(index, [0.0, 10.2 / FPS], tolerance_s=1e-4, context=context)
        assert "fewer frames per second" not in str(info.value)


def test_rows_read_by_frame_index_past_the_video_get_advice_for_that(marker_video: MarkerVideo) -> None:
    """The advice was to look frames up by frame_index / fps, which the failing run already did."""
    index = build_packet_index(marker_video("h264", 30))
    past_the_end = (index.frame_count + 2) / FPS
    for by_frame_index, advice in (
        (True, "fewer frames than the episode has rows"),
        (False, "--timestamp-source frame_index"),
    ):
        context = FrameRequestContext(dataset="d", episode_index=0, camera="c", by_frame_index=by_frame_index)
        with pytest.raises(FrameTimestampError, match=advice):
            nearest_frame_indices(index, [0.0, past_the_end], tolerance_s=1e-4, context=context)


def test_a_row_past_a_video_one_frame_short_is_not_told_to_raise_tolerance(marker_video: MarkerVideo) -> None:
    """A video one frame shorter than its rows: raising tolerance_s, as the advice said, read the last frame twice."""
    index = build_packet_index(marker_video("h264", 30))
    one_past = index.frame_count / FPS
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, [0.0, one_past], tolerance_s=1e-4, context=FrameRequestContext(camera="c"))
    message = str(info.value)
    assert "past the video's last frame" in message and "fewer frames than the episode has rows" in message
    assert "raise tolerance_s" not in message.lower()


def test_wall_clock_timestamps_need_frame_index_opt_in() -> None:
    data = pq.read_table(
        shared_dataset("cr5_v30_av1") / "data" / "chunk-000" / "file-000.parquet",
        columns=["episode_index", "frame_index", "timestamp"],
    ).to_pydict()
    episodes = cr5_episodes()
    episode = 6  # second episode of file-001: from_timestamp 19.9
    from_s = episodes["videos/observation.images.top/from_timestamp"][episode]
    assert episodes["videos/observation.images.top/file_index"][episode] == 1
    index = build_packet_index(cr5_video(1))
    rows = np.asarray(data["episode_index"]) == episode
    wall_clock = np.asarray(data["timestamp"])[rows]
    frame_index = np.asarray(data["frame_index"])[rows]
    context = FrameRequestContext(dataset="cr5_v30_av1", episode_index=episode, camera="observation.images.top")
    with pytest.raises(FrameTimestampError, match="--timestamp-source frame_index"):
        nearest_frame_indices(index, from_s + wall_clock, tolerance_s=1e-4, context=context)
    assert TimestampSource.FRAME_INDEX.value == "frame_index"
    local_s = frame_index_timestamps_s(frame_index, fps=10)
    found = nearest_frame_indices(index, from_s + local_s, tolerance_s=1e-4, context=context)
    np.testing.assert_array_equal(found, 199 + frame_index)  # episode 5 holds the file's first 199 frames


def test_ties_go_to_the_earlier_frame_despite_float32_timestamps() -> None:
    """r1: 10 fps data over 25 fps video, so every odd row's float32 timestamp lies halfway between two frames
    (up to rounding noise either way); each must read the earlier one: row k shows video frame floor(2.5 k)."""
    root = shared_dataset("r1_v30_h264")
    data = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["frame_index", "timestamp"]).to_pydict()
    index = build_packet_index(root / "videos/observation.images.rgb/chunk-000/file-000.mp4")
    query_s = np.asarray(data["timestamp"], dtype=np.float64)
    found = nearest_frame_indices(index, query_s, tolerance_s=0.0201)
    frame_index = np.asarray(data["frame_index"])
    assert (frame_index % 2 == 1).sum() == 395  # the halfway rows
    np.testing.assert_array_equal(found, frame_index * 5 // 2)
    # Farther than the tie band from halfway, the nearer frame wins.
    np.testing.assert_array_equal(nearest_frame_indices(index, [0.1 + 1e-4], tolerance_s=0.0201), [3])


def test_frames_outside_the_episode_raise() -> None:
    """cr5 episode 0's wall-clock rows run to 20.55 s but its part of file-000 ends at 19.7 s, where episode 1
    begins: a loose tolerance finds episode 1's frames, which the episode span refuses."""
    root = shared_dataset("cr5_v30_av1")
    data = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=["episode_index", "timestamp"]).to_pydict()
    episodes = cr5_episodes()
    from_s, to_s = (episodes[f"videos/observation.images.top/{k}_timestamp"][0] for k in ("from", "to"))
    assert (from_s, to_s) == (0.0, pytest.approx(19.7))
    wall_clock = np.asarray(data["timestamp"])[np.asarray(data["episode_index"]) == 0]
    index = build_packet_index(cr5_video(0))
    context = FrameRequestContext(dataset="cr5_v30_av1", episode_index=0, camera="observation.images.top")
    found = nearest_frame_indices(index, wall_clock[-3:], tolerance_s=1.0)
    assert found.tolist() == [204, 204, 205]  # episode 1 starts at frame 197: without the span nothing notices
    with pytest.raises(FrameTimestampError, match=r"episode 0.*frame 204 at 20\.400000 s.*neighbouring episode"):
        nearest_frame_indices(index, wall_clock[-3:], tolerance_s=1.0, context=context, episode_span_s=(from_s, to_s))
    # Every frame of the episode is inside its span; the next episode's first frame (197) is not.
    inside = nearest_frame_indices(index, np.arange(197) / 10, tolerance_s=1e-4, episode_span_s=(from_s, to_s))
    np.testing.assert_array_equal(inside, np.arange(197))
    with pytest.raises(FrameTimestampError, match="3 of 3 queries"):
        nearest_frame_indices(index, [19.7, 19.8, 19.9], tolerance_s=1e-4, episode_span_s=(from_s, to_s))
    # A file's last episode ends with the file (its to_timestamp, which may count n - 1 frames, is not read): r1's
    # last frame (1,975 frames, the last at 78.96 s) is read; a frame at or past the next episode's start is not.
    single = build_packet_index(r1_video())
    span = (0.0, None)
    np.testing.assert_array_equal(nearest_frame_indices(single, [78.96], tolerance_s=1e-4, episode_span_s=span), [1974])
    with pytest.raises(FrameTimestampError, match="neighbouring episode, the next in the file"):
        nearest_frame_indices(single, [78.92], tolerance_s=1e-4, episode_span_s=(0.0, 78.92))
    # Episode 1 starts at 19.7 s: its rows before that belong to episode 0.
    with pytest.raises(FrameTimestampError, match="1 of 2 queries"):
        nearest_frame_indices(index, [19.6, 19.7], tolerance_s=1e-4, episode_span_s=(19.7, None))


def test_prefetch_span_covers_every_frame_the_lookup_accepts() -> None:
    """The bytes prefetched for an episode are those of the frames the lookup reads: for a file's last episode (the
    one-episode r1 file), every frame to the file's end, the last one included (read, not refused, above)."""
    single = build_packet_index(r1_video())
    assert episode_frames(single, 0.0, None) == range(1975)
    last = plan_clip(single, np.array([1974])).packet_positions
    assert episode_span(single, 0.0, None)[1] >= int((single.byte_offset[last] + single.size_bytes[last]).max())
    # A span past the file's last frame (78.96 s) holds no frame: the last one's packets stand in for it.
    last_bytes = int(single.byte_offset[last].min()), int((single.byte_offset[last] + single.size_bytes[last]).max())
    assert episode_span(single, 80.0, None) == last_bytes
    assert episode_span(replace(single, byte_exact=False), 0.0, None) is None  # (demuxed, not range-read)
    # A next episode that starts at the file's last frame holds it (a span ending there gave it to both before).
    assert episode_frames(single, 0.0, 78.96) == range(1974)
    # In a file of several episodes the next episode's first frame (cr5 frame 197 at 19.7 s) stays out.
    index = build_packet_index(cr5_video(0))
    assert episode_frames(index, 0.0, 19.7) == range(197)
    assert episode_frames(index, 19.7, None) == range(197, index.frame_count)


def test_frame_index_timestamps_validation() -> None:
    np.testing.assert_allclose(frame_index_timestamps_s([0, 5, 10], fps=10), [0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="fps"):
        frame_index_timestamps_s([0], fps=0)
    with pytest.raises(ValueError, match="frame_indices"):
        frame_index_timestamps_s([-1], fps=10)
    with pytest.raises(ValueError, match="episode_index"):
        FrameRequestContext(episode_index=-1)


def test_duplicate_pts_rejected(marker_video: MarkerVideo) -> None:
    index = build_packet_index(marker_video("av1", 2))
    pts = index.pts.copy()
    pts[1] = pts[0]
    with pytest.raises(VideoDecodeError, match="share pts"):
        replace(index, pts=pts)


class _Packet(bytes):
    """A demuxed packet as ``_rows_from_demux`` reads it: its payload, timestamps, byte position and flags."""

    def __new__(cls, payload: bytes, pts: int | None, dts: int | None, pos: int | None, key: bool) -> _Packet:
        packet = super().__new__(cls, payload)
        packet.size, packet.pts, packet.dts, packet.pos = len(payload), pts, dts, pos
        packet.is_keyframe, packet.is_discard = key, False
        return packet


class _Demuxed:
    """A container whose demux yields ``packets`` (the stream argument ignored)."""

    def __init__(self, packets: list[_Packet]) -> None:
        self.packets = packets

    def demux(self, stream: object) -> Iterator[_Packet]:
        return iter(self.packets)


def test_a_demuxed_packet_without_pts_takes_its_dts() -> None:
    """A packet without a pts (a container that stores decode times only) is shown at its dts; an empty packet (a
    decoder flush) is no frame; a packet without either timestamp is refused, named by its position. The first three
    payloads are kept whole (to prove byte offsets exact), and each keyframe's first bytes."""
    packets = [
        _Packet(b"k" * 2000, None, 0, 48, True),
        _Packet(b"", None, None, None, False),
        _Packet(b"p", None, 512, None, False),
        _Packet(b"q", 1024, None, 2049, False),
        _Packet(b"K" * 9, 1536, 1536, 2050, True),
    ]
    samples: dict[int, bytes] = {}
    heads: dict[int, bytes] = {}
    rows, first_key = packet_index._rows_from_demux(_Demuxed(packets), None, samples, heads, label="v.avi")
    assert rows == [
        (0, 0, 48, 2000, True, False),
        (512, 512, -1, 1, False, False),
        (1024, 1024, 2049, 1, False, False),
        (1536, 1536, 2050, 9, True, False),
    ]
    assert first_key == b"k" * 2000 and samples == {0: b"k" * 2000, 1: b"p", 2: b"q"}
    assert heads == {0: b"k" * packet_index._DEMUXED_HEAD_BYTES, 3: b"K" * 9}
    with pytest.raises(VideoDecodeError, match=r"v\.avi: packet 1 has no timestamp; remux the video into MP4"):
        packet_index._rows_from_demux(
            _Demuxed([packets[0], _Packet(b"x", None, None, 9, False)]), None, {}, {}, label="v.avi"
        )


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [2, 30])
@pytest.mark.parametrize("own_tables", [False, True], ids=["ffmpeg_index", "own_tables"])
def test_moov_index_equals_demux_index(
    marker_video: MarkerVideo, codec: str, gop: int, own_tables: bool, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Read through FFmpeg's index (PyAV >= 16), or from the sample tables alone (as PyAV < 16 must)."""
    path = marker_video(codec, gop)
    with monkeypatch.context() as patch:
        patch.setattr(packet_index, "read_mp4_tracks", lambda handle, size: None)
        demuxed = build_packet_index(path)
    if own_tables:
        monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.packet_index"):
        index = build_packet_index(path)
    assert "demuxing" not in caplog.text  # (the tables were used, not the fallback)
    for name in ("pts", "dts", "byte_offset", "size_bytes", "keyframe"):
        np.testing.assert_array_equal(getattr(index, name), getattr(demuxed, name), err_msg=name)
    for name in ("codec", "width", "height", "pix_fmt", "time_base", "template", "byte_exact", "file_size_bytes"):
        assert getattr(index, name) == getattr(demuxed, name), name


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_a_faststart_mp4_cut_among_its_first_packets_is_refused(
    marker_video: MarkerVideo, tmp_path: Path, codec: str
) -> None:
    """An MP4 whose moov comes first, cut among its first packets: its tables no longer match what the demuxer finds,
    so the file is demuxed, and the demux stops at the cut: it was indexed as a video of 1-11 frames with no error
    (83 of 180 cuts of five such files within their first 12 packets), and a lookup past them blamed the dataset's
    rows. The tables' samples reach past the file's end, which says it is truncated, as a cut further on is."""
    whole = remux(marker_video(codec, 30), tmp_path / "faststart.mp4", movflags="faststart")
    raw = whole.read_bytes()
    with av.open(str(whole)) as container:
        packets = [(packet.pos, packet.size) for packet in container.demux(video=0) if packet.size]
    cut = tmp_path / "cut.mp4"
    for end in [packets[0][0] + 1, sum(packets[2]), packets[4][0] + packets[4][1] // 2, packets[40][0] + 3]:
        cut.write_bytes(raw[:end])
        said = f"cut.mp4: packets extend to byte {len(raw)} but the file has {end} bytes; the file is truncated"
        with pytest.raises(VideoDecodeError, match=re.escape(said)):
            build_packet_index(cut)


def test_gpac_and_bento4_movie_durations_judge_cuts_between_fragments(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """GPAC and Bento4 write mehd of version 0 or 1 (64-bit) in movie timescales other than FFmpeg's 1000: files of
    one-frame fragments so given 3 s index as their decode shows (88 such whole files of 4 codecs and 6 layouts, with
    mehd v0/v1 at 600, 1000 and 90000 ticks a second or with a sidx instead: none refused), and a cut between two
    fragments is refused, one after the first fragment too (16 of 16 were indexed as one frame: the distance between
    frames, a frame's length, was not known)."""
    flags = "frag_every_frame+empty_moov+default_base_moof+skip_trailer"
    source = remux(marker_video("h264", 30), tmp_path / "source.mp4", movflags=flags)
    whole, cut = tmp_path / "whole.mp4", tmp_path / "cut.mp4"
    for version, timescale in ((0, 600), (1, 90000)):
        raw = with_movie_duration(source, whole, 3.0, version=version, timescale=timescale).read_bytes()
        assert build_packet_index(whole).frame_count == len(_decoded_pts(whole)) == 90
        moofs = [start for kind, start, _ in top_level_boxes(raw) if kind == b"moof"]
        for left in (1, 45):
            cut.write_bytes(raw[: moofs[left]])
            said = r"cut\.mp4: its tracks hold [0-9.]+ s but its mehd box gives the movie 3\.000 s \(a cut between two"
            with pytest.raises(VideoDecodeError, match=said):
                build_packet_index(cut)


@pytest.mark.parametrize("codec", ["h264", "av1", "vp9"])
def test_an_mp4_whose_end_is_zero_filled_is_refused(marker_video: MarkerVideo, tmp_path: Path, codec: str) -> None:
    """A copy into a pre-allocated file that stopped keeps the file's size, its bytes zeros from where it stopped: every
    box stays whole where the zeros start in the media data. A faststart MP4 was indexed whole (its last frames zeros,
    undecodable), a fragmented one as the fragments before a box header of zeros (8,206 of 9,749 zero fills of 58 such
    files, every codec and layout). Now a box header of zeros, or a last packet that starts or ends with zeros, as no
    packet of the codec does, says the file is zero-filled; the whole files index as their decode shows."""
    faststart = remux(marker_video(codec, 30), tmp_path / "faststart.mp4", movflags="faststart")
    flags = "frag_keyframe+empty_moov+default_base_moof"
    fragmented = remux(marker_video(codec, 30), tmp_path / "fragmented.mp4", movflags=flags)
    filled = tmp_path / "filled.mp4"
    for whole in (faststart, fragmented):
        raw = whole.read_bytes()
        assert build_packet_index(whole).frame_count == len(_decoded_pts(whole)) == 90
        boxes = top_level_boxes(raw)
        mdat = next(start for kind, start, _ in boxes if kind == b"mdat")
        with av.open(str(whole)) as container:
            last = max((packet.pos, packet.size) for packet in container.demux(video=0) if packet.size)
        said = rf"its last stored packet \(bytes {last[0]}-{sum(last)}\) (starts|ends) with zeros, as no {codec} packet"
        zero_fills = [(last[0], said), (sum(last) - 16, said), ((mdat + last[0]) // 2, said)]
        if whole is fragmented:
            (_, mdat, _), (_, moof, _) = boxes[-5:-3]  # (the second fragment's mdat, the third's moof)
            header = rf"its box header at byte {moof} is zeros: the file is zero-filled from there"
            zero_fills = [(moof, header), (moof + 4, header), (moof + 7, header), ((mdat + moof) // 2, header)]
        for start, message in zero_fills:
            filled.write_bytes(raw[:start] + bytes(len(raw) - start))
            with pytest.raises(VideoDecodeError, match=rf"filled\.mp4: {message}.*; the file is truncated"):
                build_packet_index(filled)


def test_the_zero_fill_check_reads_the_packet_stored_last_and_the_one_stored_before_it() -> None:
    """Packets in decode order need not be stored in it: here packet 1 lies at bytes 300-400, after packet 2 (100-300)
    and packet 0 (0-100). The file is zero-filled from byte 300: packet 1, stored last, starts with zeros (packet 2,
    last in decode order, does not). A last stored packet that ends with zeros is padding where the packet stored
    before it (packet 2, not packet 0 before it in decode order) ends with zeros too; a one-packet file's, with none
    stored before it, is a zero fill."""
    offsets, sizes = np.array([0, 300, 100]), np.array([100, 100, 200])

    def check(data: bytes, offsets: np.ndarray = offsets, sizes: np.ndarray = sizes) -> None:
        packet_index._check_zero_filled(
            lambda at, n: data[at : at + n], offsets, sizes, "h264", len(data), label="v.mp4"
        )

    with pytest.raises(VideoDecodeError, match=r"v\.mp4: its last stored packet \(bytes 300-400\) starts with zeros"):
        check(b"\x01" * 300 + bytes(100))
    ends = b"\x01" * 84 + bytes(16) + b"\x01" * 200 + b"\x01" * 84 + bytes(16)  # (packets 0 and 1 end with zeros)
    with pytest.raises(VideoDecodeError, match=r"v\.mp4: its last stored packet \(bytes 300-400\) ends with zeros"):
        check(ends)
    check(b"\x01" * 284 + bytes(16) + b"\x01" * 84 + bytes(16))  # (packets 2 and 1 end with zeros: padding)
    padded = b"\x01" * 84 + bytes(16)  # (a file of two packets, each ending with zeros: padding too)
    check(padded * 2, offsets=np.array([0, 100]), sizes=np.array([100, 100]))
    with pytest.raises(VideoDecodeError, match=r"v\.mp4: its last stored packet \(bytes 100-200\) ends with zeros"):
        check(b"\x01" * 100 + padded, offsets=np.array([0, 100]), sizes=np.array([100, 100]))
    with pytest.raises(VideoDecodeError, match=r"v\.mp4: its last stored packet \(bytes 0-100\) ends with zeros"):
        check(padded, offsets=np.array([0]), sizes=np.array([100]))  # (one packet: none stored before it)


def test_offsets_are_exact_only_where_every_packet_has_one() -> None:
    """Byte offsets are exact where every packet has one (-1: the demuxer gave none) and the first packets' payloads
    lie at theirs: made up, a file of a 3-byte header then packets "aa", "bbb" and "cc". A third packet without an
    offset makes them inexact though the first two match; so does a payload not found at its offset ("cx"). Byte 0 is
    an offset like any other (a container without a header of its own): a file of those packets only is exact too."""
    data = io.BytesIO(b"hdr" + b"aa" + b"bbb" + b"cc")
    samples = {0: b"aa", 1: b"bbb"}  # (pts, dts, offset, size, keyframe, hidden)
    table = np.array([[0, 0, 3, 2, 1, 0], [1, 1, 5, 3, 0, 0], [2, 2, 8, 2, 0, 0]])
    headerless = table - [0, 0, 3, 0, 0, 0]
    assert packet_index._offsets_are_exact(io.BytesIO(b"aabbbcc"), headerless, samples) is True
    assert packet_index._offsets_are_exact(data, table, samples) is True
    assert packet_index._offsets_are_exact(data, table, {**samples, 2: b"cx"}) is False
    table[2, 2] = -1
    assert packet_index._offsets_are_exact(data, table, samples) is False


def _pad_last_nal(sample: bytes, padding: int) -> bytes:
    """An H.264 MP4 sample (4-byte NAL unit lengths) whose last NAL unit ends with ``padding`` zero bytes more."""
    at = 0
    while at + 4 + int.from_bytes(sample[at : at + 4], "big") < len(sample):
        at += 4 + int.from_bytes(sample[at : at + 4], "big")
    length = len(sample) - at - 4 + padding
    return sample[:at] + length.to_bytes(4, "big") + sample[at + 4 :] + bytes(padding)


@pytest.mark.parametrize("movflags", ["", "faststart", "frag_keyframe+empty_moov+default_base_moof+skip_trailer"])
def test_an_mp4_whose_packets_end_with_zero_padding_is_indexed(
    marker_video: MarkerVideo, tmp_path: Path, movflags: str
) -> None:
    """An Annex B H.264 stream may pad each NAL unit with zeros (``trailing_zero_8bits``), which FFmpeg's stream copy
    into an MP4 keeps in each packet's last NAL unit (24 such bytes: FFmpeg decodes every frame). Its last packet ends
    with zeros, which was refused as a zero-filled file in each layout (3 of 3); now only where the file ends with zeros
    and the packet stored before it does not: a zero fill from its first byte, whose packet starts with zeros, still
    is refused."""
    source, padded = marker_video("h264", 30), tmp_path / "padded.mp4"
    with (
        av.open(str(source)) as src,
        av.open(str(padded), "w", options={"movflags": movflags} if movflags else {}) as dst,
    ):
        stream = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        for packet in src.demux(video=0):
            if packet.size:
                copy = av.Packet(_pad_last_nal(bytes(packet), 24))
                copy.pts, copy.dts, copy.time_base = packet.pts, packet.dts, packet.time_base
                copy.is_keyframe, copy.stream = packet.is_keyframe, stream
                dst.mux(copy)
    reference = _demux_reference(padded)
    assert all(payload.endswith(bytes(24)) for *_, payload in reference)
    index = build_packet_index(padded)
    assert sorted(index.pts.tolist()) == _decoded_pts(padded) == sorted(pts for pts, *_ in reference)
    assert index.frame_count == len(reference) == 90
    raw = padded.read_bytes()
    last = max(zip(index.byte_offset.tolist(), index.size_bytes.tolist(), strict=True))
    filled = tmp_path / "filled.mp4"
    filled.write_bytes(raw[: last[0]] + bytes(len(raw) - last[0]))
    if movflags:  # (a plain MP4's moov follows the packets: zero-filled, the file holds no stream)
        said = rf"filled\.mp4: its last stored packet \(bytes {last[0]}-{sum(last)}\) starts with zeros"
        with pytest.raises(VideoDecodeError, match=said):
            build_packet_index(filled)


@pytest.mark.parametrize("codec, container_format", [("vp9", "webm"), ("h264", "matroska")])
def test_a_matroska_file_cut_short_is_refused(
    marker_video: MarkerVideo, tmp_path: Path, codec: str, container_format: str
) -> None:
    """FFmpeg's Matroska demuxer stops at a cut without an error: a WebM or MKV file cut anywhere after its header was
    indexed as a shorter video (144 of 180 cuts of VP9 WebM, H.264 and AV1 Matroska files), and a lookup past its last
    packet blamed the dataset's rows. Its Segment's size, which the header gives, says it is truncated; the whole file
    indexes as its demux does."""
    whole = remux(marker_video(codec, 30), tmp_path / f"whole.{container_format}", container_format)
    raw = whole.read_bytes()
    with av.open(str(whole)) as container:
        packets = [(packet.pos, packet.size) for packet in container.demux(video=0) if packet.size]
    assert build_packet_index(whole).frame_count == len(packets) == 90
    cut = tmp_path / f"cut.{container_format}"
    for end in [packets[1][0] + 1, sum(packets[44]), packets[89][0] + packets[89][1] // 2, len(raw) - 1]:
        cut.write_bytes(raw[:end])
        with pytest.raises(VideoDecodeError, match=rf"cut\.{container_format}: its Matroska segment extends to byte "
                           rf"{len(raw)} but the file has {end} bytes; the file is truncated"):  # fmt: skip
            build_packet_index(cut)


def test_a_matroska_segment_of_unknown_size_is_not_judged_by_it(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A Segment whose size field has every value bit set is of unknown size (a live recording's): read as a number it
    ends 2**56 bytes on, and every such file was called cut short. Here FFmpeg's 8-byte Segment size (0x01 then 7 bytes)
    is made unknown: the file indexes as its demux does, its size unchecked."""
    raw = remux(marker_video("vp9", 30), tmp_path / "whole.webm", "webm").read_bytes()
    size_at = raw.index(b"\x18\x53\x80\x67") + 4  # (the Segment's ID, then its size)
    assert raw[size_at] == 0x01 and packet_index._ebml_size(raw, size_at) == (len(raw) - size_at - 8, size_at + 8)
    live = tmp_path / "live.webm"
    live.write_bytes(raw[:size_at] + b"\x01" + b"\xff" * 7 + raw[size_at + 8 :])
    assert packet_index._ebml_size(live.read_bytes(), size_at) == (None, size_at + 8)
    index = build_packet_index(live)
    assert index.frame_count == 90 and index.pts.tolist() == build_packet_index(tmp_path / "whole.webm").pts.tolist()


@pytest.mark.parametrize("codec, container_format", [("vp9", "webm"), ("h264", "matroska")])
def test_a_matroska_file_whose_end_is_zero_filled_is_refused(
    marker_video: MarkerVideo, tmp_path: Path, codec: str, container_format: str
) -> None:
    """A Matroska file zero-filled from some byte on (a copy into a pre-allocated file that stopped) keeps its Segment's
    size whole, and FFmpeg's demuxer stops at the zeros without an error: it was indexed as fewer frames (115 of 132
    zero fills of 6 WebM and MKV files). Its SeekHead places its Cues after the clusters: zeros there and at the end say
    it is zero-filled. Zeros within the Cues alone leave every frame: the file indexes as its demux does."""
    whole = remux(marker_video(codec, 30), tmp_path / f"whole.{container_format}", container_format)
    raw = whole.read_bytes()
    with av.open(str(whole)) as container:
        packets = [(packet.pos, packet.size) for packet in container.demux(video=0) if packet.size]
    cues = raw.rindex(b"\x1c\x53\xbb\x6b")  # (the Cues element, after the clusters)
    assert cues > sum(packets[-1])
    filled = tmp_path / f"filled.{container_format}"
    for start in [packets[1][0] + 1, sum(packets[44]), packets[89][0] + packets[89][1] // 2, cues]:
        filled.write_bytes(raw[:start] + bytes(len(raw) - start))
        said = rf"filled\.{container_format}: its SeekHead puts its Cues at byte {cues}, where the file holds zeros"
        with pytest.raises(VideoDecodeError, match=said + ".*zero-filled.*; the file is truncated"):
            build_packet_index(filled)
    filled.write_bytes(raw[: cues + 8] + bytes(len(raw) - cues - 8))
    assert build_packet_index(filled).frame_count == len(packets) == 90


def test_a_fragmented_mp4_padded_with_zeros_after_its_mfra_box_is_indexed(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """Zeros after a fragmented MP4's mfra box (which lists every fragment) are padding, as they are after a plain
    movie's moov and mdat: the file was refused as zero-filled or ending within a box header (24 of 24 H.264, HEVC, AV1
    and VP9 files padded with 3 to 65,536 zeros); it now indexes whole. Without the mfra box (FFmpeg's skip_trailer)
    the same zeros still say the file is zero-filled: they may hide fragments."""
    for flags in ("frag_keyframe+empty_moov+default_base_moof", "frag_keyframe+empty_moov+skip_trailer"):
        whole = remux(marker_video("h264", 30), tmp_path / "whole.mp4", movflags=flags)
        raw, padded = whole.read_bytes(), tmp_path / "padded.mp4"
        assert [kind for kind, _, _ in top_level_boxes(raw)][-1] == (b"mdat" if "skip" in flags else b"mfra")
        for padding in (3, 8, 1000):
            padded.write_bytes(raw + bytes(padding))
            if "skip" in flags:
                said = "it ends within the header of a box" if padding < 8 else "its box header at byte .* is zeros"
                with pytest.raises(VideoDecodeError, match=rf"padded\.mp4: {said}"):
                    build_packet_index(padded)
            else:
                index = build_packet_index(padded)
                assert sorted(index.pts.tolist()) == _decoded_pts(padded) == _decoded_pts(whole)
                assert index.frame_count == 90


def test_only_an_mfro_box_ending_the_file_says_where_its_mfra_box_starts() -> None:
    """A file that ends with its mfra box is whole without its other box headers read: the mfro box ending it (16
    bytes: size, type, version and flags, the mfra box's size) says so where the box it points to is an mfra box of that
    size. Made up: a 24-byte mfra box holding its mfro box alone. Where the mfro's type or its own size is another, its
    last 4 bytes are no mfra box's size, though here they point to one."""
    mfra = struct.pack(">I4s", 24, b"mfra") + struct.pack(">I4sII", 16, b"mfro", 0, 24)
    assert mp4_tables._ends_with_mfra(io.BytesIO(mfra), 24) is True
    for damaged in (mfra[:12] + b"free" + mfra[16:], mfra[:8] + struct.pack(">I", 17) + mfra[12:]):
        assert mp4_tables._ends_with_mfra(io.BytesIO(damaged), 24) is False


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_fragmented_mp4_cut_short_is_refused(marker_video: MarkerVideo, tmp_path: Path, codec: str) -> None:
    """FFmpeg's demuxer drops a fragmented MP4's samples past a cut without an error: a file of moof/mdat fragments cut
    anywhere after its moov was indexed as a shorter video (4,022 of 5,604 cuts of 43 such files), and a lookup past
    its last packet blamed the dataset's rows. Its boxes say it is cut: one extends past the file's end, the file ends
    within a box header or after a fragment's moof without its mdat, or its segment index lists more; the whole file
    indexes as its decode shows (3 fragments of 30 frames and FFmpeg's mfra box)."""
    flags = "frag_keyframe+empty_moov+default_base_moof"
    whole = remux(marker_video(codec, 30), tmp_path / "whole.mp4", movflags=flags)
    raw = whole.read_bytes()
    boxes = top_level_boxes(raw)
    assert [kind for kind, _, _ in boxes] == [b"ftyp", b"moov", *[b"moof", b"mdat"] * 3, b"mfra"]
    assert build_packet_index(whole).frame_count == len(_decoded_pts(whole)) == 90
    (_, moof, _), (_, mdat, mdat_end), (_, mfra, _) = boxes[4], boxes[5], boxes[-1]
    cut = tmp_path / "cut.mp4"
    for end, said in [
        ((mdat + mdat_end) // 2, f"its mdat box at byte {mdat} extends to byte {mdat_end} but the file has"),
        (mdat, f"its last fragment's media data (the mdat box after its moof box at byte {moof}) is missing"),
        (moof + 4, f"it ends within the header of a box at byte {moof} (the file has {moof + 4} bytes)"),
        (len(raw) - 1, f"its mfra box at byte {mfra} extends to byte {len(raw)} but the file has"),
    ]:
        cut.write_bytes(raw[:end])
        with pytest.raises(VideoDecodeError, match=re.escape(f"cut.mp4: {said}") + ".*; the file is truncated"):
            build_packet_index(cut)


class _CountedReads(io.BytesIO):
    """File bytes whose reads are counted (a remote file's requests)."""

    reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().read(size)


def test_a_fragmented_mp4_without_mfra_is_checked_in_few_reads(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Without an mfra box, every top-level box header of a fragmented MP4 is read to find a cut: each was read alone,
    a remote file's request each (183 reads for 90 one-frame fragments; 61 and 152 requests of 256 KiB over HTTP for
    28-44 MB files of 1 s and 2-frame fragments). Past a moof, the headers are read 4 MiB at a time (5 reads here; 9
    and 13 requests), and say what the one-by-one reads said: nothing for the whole file, the last mdat for a cut."""
    flags = "frag_every_frame+empty_moov+default_base_moof+skip_trailer"
    raw = remux(marker_video("h264", 30), tmp_path / "fragmented.mp4", movflags=flags).read_bytes()
    boxes = top_level_boxes(raw)
    assert [kind for kind, _, _ in boxes] == [b"ftyp", b"moov", *[b"moof", b"mdat"] * 90]
    for end, said in [
        (len(raw), None),
        (len(raw) - 10, f"its mdat box at byte {boxes[-1][1]} extends to byte {len(raw)} but the file has"),
    ]:
        handle = _CountedReads(raw[:end])
        why = mp4_file_cut(handle, end, fragmented=True)
        assert (why if said is None else why[: len(said)]) == said
        assert handle.reads == 5  # (the mfro, the ftyp, moov and first moof headers, then the rest at once)


def test_a_fragmented_mp4_cut_between_fragments_is_refused_by_its_segment_index(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """Cut exactly between two fragments, a fragmented MP4 looks whole but for the boxes that list its fragments: a
    global segment index (sidx) at its start, or FFmpeg's mfra box at its end, which such a cut removes. With a sidx the
    cut is refused; with neither (FFmpeg's skip_trailer), nothing in the file says it had more fragments: it is indexed
    as the frames it holds, as a decode shows them."""
    flags = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
    cut = tmp_path / "cut.mp4"
    for listed in (True, False):
        whole = remux(marker_video("h264", 30), tmp_path / "whole.mp4", movflags=flags + "+global_sidx" * listed)
        raw = whole.read_bytes()
        boxes = top_level_boxes(raw)
        assert [kind for kind, _, _ in boxes] == [b"ftyp", b"moov", *[b"sidx"] * listed, *[b"moof", b"mdat"] * 3]
        assert build_packet_index(whole).frame_count == len(_decoded_pts(whole)) == 90
        end = boxes[-2][1]  # (the third fragment's moof)
        cut.write_bytes(raw[:end])
        if listed:
            said = f"its segment index (the sidx box at byte {boxes[2][1]}) lists fragments to byte {len(raw)} but"
            with pytest.raises(VideoDecodeError, match=re.escape(f"cut.mp4: {said} the file has {end} bytes; the")):
                build_packet_index(cut)
        else:
            assert build_packet_index(cut).frame_count == len(_decoded_pts(cut)) == 60


@pytest.mark.parametrize("faststart", [False, True], ids=["moov_at_end", "faststart"])
def test_a_plain_mp4_cut_short_is_named_by_the_box_it_cuts(
    marker_video: MarkerVideo, tmp_path: Path, faststart: bool
) -> None:
    """A plain (unfragmented) MP4 cut within its last box: the moov (moov at the end) or the mdat (faststart) it cuts
    is named, with where it ends and the file's size, from the box headers alone. A cut within another box at the end
    (free: no media, no index) is no cut the boxes can tell."""
    options = {"movflags": "faststart"} if faststart else {}
    raw = remux(marker_video("h264", 30), tmp_path / "plain.mp4", **options).read_bytes()
    kind, start, end = top_level_boxes(raw)[-1]
    assert (kind, end) == ((b"mdat" if faststart else b"moov"), len(raw))
    cut = len(raw) - 100
    said = f"its {kind.decode()} box at byte {start} extends to byte {len(raw)} but the file has {cut} bytes"
    assert mp4_file_cut(io.BytesIO(raw[:cut]), cut) == said
    assert mp4_file_cut(io.BytesIO(raw), len(raw)) is None
    padded = raw + struct.pack(">I4s", 108, b"free") + bytes(100)
    assert mp4_file_cut(io.BytesIO(padded[:-50]), len(padded) - 50) is None


def test_a_segment_index_entry_that_indexes_another_counts_its_size_only() -> None:
    """A sidx reference's top bit is its type (1: it points at another sidx), the other 31 its size in bytes: read
    whole, a hierarchical index's reference lay 2 GiB past the file's end, and a whole file was called cut short. Made
    up: an ftyp, a sidx with one reference (type 1) over the 100-byte box after it, then that box."""

    def file(size: int) -> bytes:
        ftyp = struct.pack(">I4s4sI", 16, b"ftyp", b"isom", 0)
        # (version and flags, reference id, timescale, earliest time, first offset, reserved, count; one reference)
        sidx = struct.pack(">IIIIIHH", 0, 1, 1000, 0, 0, 0, 1) + struct.pack(">III", 1 << 31 | size, 1000, 0)
        return ftyp + struct.pack(">I4s", 8 + len(sidx), b"sidx") + sidx + struct.pack(">I4s", 100, b"free") + bytes(92)

    assert len(file(100)) == 16 + 44 + 100
    assert mp4_file_cut(io.BytesIO(file(100)), 160) is None
    said = "its segment index (the sidx box at byte 16) lists fragments to byte 161 but the file has 160 bytes"
    assert mp4_file_cut(io.BytesIO(file(101)), 160) == said


def test_a_fragmented_mp4_cut_between_fragments_is_refused_by_its_movie_duration(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """Cut exactly between two fragments, a fragmented MP4 whose moov gives the whole movie's duration (an mehd box, as
    GPAC and Bento4 write) holds less than that: refused (it was indexed as the frames left, 60 of 90); the whole file,
    and a cut file whose mehd gives 0 (not known when written), index as a decode shows them."""
    flags = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
    source = remux(marker_video("h264", 30), tmp_path / "source.mp4", movflags=flags)
    whole, cut = tmp_path / "whole.mp4", tmp_path / "cut.mp4"
    for seconds in (3.0, 0.0):
        raw = with_movie_duration(source, whole, seconds).read_bytes()
        assert build_packet_index(whole).frame_count == len(_decoded_pts(whole)) == 90
        cut.write_bytes(raw[: top_level_boxes(raw)[-2][1]])  # (before the third fragment's moof)
        if seconds:
            said = "cut.mp4: its tracks hold 2.067 s but its mehd box gives the movie 3.000 s (a cut between two of"
            with pytest.raises(VideoDecodeError, match=re.escape(said) + ".*; the file is truncated"):
                build_packet_index(cut)
        else:
            assert build_packet_index(cut).frame_count == len(_decoded_pts(cut)) == 60


def test_a_movie_duration_over_half_a_frame_longer_than_the_tracks_is_refused(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """The mehd check's bound is half a frame (1/60 s at 30 fps): a whole file whose tracks hold 3.067 s (its last frame
    shows at 3.033 s, B-frame delay counted) and whose mehd gives one frame more (3.100 s) is refused as cut; one whose
    mehd gives a quarter of a frame more (3.075 s) is indexed whole."""
    flags = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
    source = remux(marker_video("h264", 30), tmp_path / "source.mp4", movflags=flags)
    longer = with_movie_duration(source, tmp_path / "longer.mp4", 3.1)
    said = r"longer\.mp4: its tracks hold 3\.067 s but its mehd box gives the movie 3\.100 s \(a cut between two"
    with pytest.raises(VideoDecodeError, match=said):
        build_packet_index(longer)
    assert build_packet_index(with_movie_duration(source, tmp_path / "close.mp4", 3.075)).frame_count == 90


def test_a_frames_length_is_the_median_step_between_frames_or_a_lone_frames_own() -> None:
    """The mehd checks' frame length, by hand in ticks of 1/15360 s: two frames 512 ticks apart are 1/30 s long (one
    step measures it), three 512 and 1536 apart 1024 ticks (the median step), and a lone frame is given its own."""
    interval, tick = packet_index._frame_interval, Fraction(1, 15360)
    assert interval(np.array([0, 512]), tick, Fraction(0)) == Fraction(1, 30)
    assert interval(np.array([0, 512, 2048]), tick, Fraction(0)) == Fraction(1, 15)
    assert interval(np.array([0]), tick, Fraction(1, 25)) == Fraction(1, 25)


def test_ebml_sizes_by_hand_and_at_the_end_of_the_bytes_read() -> None:
    """EBML sizes (a marker bit, then the value): one byte 0x81 is 1, two bytes 0x40 0x02 are 2, all value bits set
    (0xFF) an unknown size; none where the bytes end at or within the size, or a zero byte cannot start one. A file
    holding the EBML ID and nothing more (4 bytes) has no size after it: not judged, never an IndexError."""
    ebml_size, ebml_id = packet_index._ebml_size, b"\x1a\x45\xdf\xa3"
    assert ebml_size(b"\x81", 0) == (1, 1)
    assert ebml_size(b"\x1a\x40\x02", 1) == (2, 3)
    assert ebml_size(b"\xff", 0) == (None, 1)
    assert ebml_size(b"\x40", 0) is None  # (a 2-byte size cut after 1)
    assert ebml_size(b"\x00\x81", 0) is None
    assert ebml_size(ebml_id, 4) is None  # (at the end of the bytes)
    assert packet_index._check_matroska_segment(io.BytesIO(ebml_id), 4, label="v.webm") is None
    # Elements: ID (its length marked as a size's), size, data; they stop at one of unknown size or past the end.
    elements = b"\x42\x86\x81\x01" + ebml_id + b"\x82\x00\x00"
    assert list(packet_index._ebml_elements(elements, 0, len(elements))) == [(b"\x42\x86", 3, 4), (ebml_id, 9, 11)]
    assert list(packet_index._ebml_elements(elements, 0, 10)) == [(b"\x42\x86", 3, 4)]
    unknown = b"\x42\x86\x81\x01" + ebml_id + b"\xff\x00"
    assert list(packet_index._ebml_elements(unknown, 0, len(unknown))) == [(b"\x42\x86", 3, 4)]


def test_the_zero_fill_check_reads_a_packet_of_up_to_64_kib_whole_and_a_larger_one_at_its_ends() -> None:
    """The packet stored last is read in one read up to 64 KiB (65,536 bytes) and by its first 8 and last 16 bytes
    (two reads) past that; a file of 1-bytes, so no read of the file's end follows."""

    def reads(size: int) -> list[tuple[int, int]]:
        done: list[tuple[int, int]] = []

        def read_at(at: int, n: int) -> bytes:
            done.append((at, n))
            return b"\x01" * n

        packet_index._check_zero_filled(
            read_at, np.array([0, 100]), np.array([100, size]), "h264", 100 + size, label="v.mp4"
        )
        return done

    assert reads(65_536) == [(100, 65_536)]
    assert reads(65_537) == [(100, 8), (100 + 65_537 - 16, 16)]


def test_reads_at_an_offset_of_a_file_object_that_is_not_local_seek_and_read() -> None:
    """A file object that is neither a local file nor memory (a remote file's: fsspec's HTTP file, made up here as a
    wrapper of bytes) has no ``pread``: its reads at an offset seek and read, and it is never asked for a descriptor."""

    class Remote:
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)
            self.seek, self.read, self.tell = self._data.seek, self._data.read, self._data.tell

        def fileno(self) -> int:
            raise io.UnsupportedOperation("fileno")

    remote = Remote(b"0123456789")
    assert packet_index._local_reads(remote) is None
    assert packet_index._reads(remote)(3, 4) == b"3456"
    local = packet_index._local_reads(io.BytesIO(b"0123456789"))
    assert local is not None and local(3, 4) == b"3456"


def test_the_stream_template_holds_the_first_keyframe_of_a_stream_that_starts_between_keyframes(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """A Matroska stream cut from a longer one may start between keyframes (its offsets not exact: the index demuxes
    it): the stream template holds its first keyframe, which a decoder starts from, not its first packet."""
    cut = tmp_path / "cut.mkv"
    with av.open(str(marker_video("h264", 30))) as src, av.open(str(cut), "w") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        for packet in [p for p in src.demux(video=0) if p.size][1:]:  # (from packet 1 on: no keyframe)
            packet.stream = stream
            dst.mux(packet)
    packets = _demux_reference(cut)
    index = build_packet_index(cut)
    assert not packets[0][2] and not index.byte_exact
    first_keyframe = next(payload for *_, keyframe, payload in packets if keyframe)
    with av.open(io.BytesIO(index.template)) as template:
        assert [bytes(p) for p in template.demux(video=0) if p.size] == [first_keyframe]
