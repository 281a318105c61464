"""The sample tables :mod:`lerobot_dali.mp4_tables` reads, checked sample by sample against PyAV's demux of the same
file: layouts the marker videos lack (they hold one chunk of listed sizes), and tables FFmpeg reads otherwise.

Mutation testing found these gaps: where the tables were left unknown (``samples`` None) the index fell back to a
demux that gives the same rows, so only a direct comparison tells a table read right from one not read at all.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali import mp4_tables
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.mp4_tables import Edit, Mp4Track, read_mp4_tracks
from tests.test_packet_index_remote import _STBL, _with_box_payload, _with_elst
from tests.video_fixtures import MarkerVideo, _child_box, cr5_video, r1_video, remux


def _tracks(path: Path) -> dict[int, Mp4Track]:
    with open(path, "rb") as handle:
        tracks = read_mp4_tracks(handle, os.path.getsize(path))
    assert tracks is not None
    return tracks


def _demuxed(path: Path, track_id: int) -> dict[str, np.ndarray]:
    """The packets of some bytes PyAV demuxes from track ``track_id``: FFmpeg's own reading of the tables."""
    with av.open(str(path)) as container:
        (stream,) = [s for s in container.streams if s.id == track_id]
        rows = [(p.pts, p.dts, p.pos, p.size, p.is_keyframe) for p in container.demux(stream) if p.size]
    pts, dts, pos, size, keyframe = (np.array(column) for column in zip(*rows, strict=True))
    return {"pts": pts, "dts": dts, "offset": pos, "size": size, "keyframe": keyframe.astype(bool)}


def _assert_samples_demux_as(
    track: Mp4Track, expected: dict[str, np.ndarray], fields: tuple[str, ...] = ("offset", "size", "keyframe")
) -> None:
    """``track``'s own samples are FFmpeg's packets: dts and pts shifted by the one edit's start (FFmpeg's shift),
    and ``fields`` (byte offset, size, sync flag)."""
    assert track.samples is not None
    shift = track.edits[0].media_time if track.edits else 0
    offsets = track.composition_offsets()
    assert offsets is not None
    np.testing.assert_array_equal(track.samples.dts - shift, expected["dts"], err_msg="dts")
    np.testing.assert_array_equal(track.samples.dts + offsets - shift, expected["pts"], err_msg="pts")
    for name in fields:
        np.testing.assert_array_equal(getattr(track.samples, name), expected[name], err_msg=name)


def _table(path: Path, kind: bytes, columns: int) -> list[tuple[int, ...]]:
    """The entries of the first track's ``kind`` box (a count, then ``columns`` 32-bit fields each), read by hand."""
    raw = path.read_bytes()
    start, end = -8, len(raw)  # (each box's children start after its 8-byte header)
    for box in (*_STBL, kind):
        start, end = _child_box(raw, box, start + 8, end)
    (count,) = struct.unpack_from(">I", raw, start + 12)  # (after the header, version and flags)
    return [struct.unpack_from(f">{columns}I", raw, start + 16 + 4 * columns * i) for i in range(count)]


def _h264(path: Path, frames: int, *, with_audio: bool = False, **options: str) -> Path:
    """``frames`` marker frames in H.264 at 30 fps with the encoder's ``options``, in an MP4. ``with_audio``: and 8 kHz
    AAC (128 ms a frame), muxed interleaved, so that the video's samples lie in chunks of 3 or 4 between the audio's
    (its stsc has several runs)."""
    with av.open(str(path), "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=30, options={"threads": "1", **options})
        video.width, video.height, video.pix_fmt = 96, 64, "yuv420p"
        audio = container.add_stream("aac", rate=8000) if with_audio else None
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(draw_marker(0, index, 64, 96), format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
            if audio is not None and index % 4 == 0:
                sound = av.AudioFrame.from_ndarray(np.full((1, 1024), 0.1, np.float32), format="fltp", layout="mono")
                sound.sample_rate, sound.pts = 8000, index // 4 * 1024
                container.mux(audio.encode(sound))
        container.mux(video.encode(None))
        if audio is not None:
            container.mux(audio.encode(None))
    return path


def _interleaved(path: Path) -> Path:
    """45 H.264 frames (B-frames, a keyframe each 10) interleaved with audio: stsc runs of 3 and 4 samples a chunk."""
    return _h264(path, 45, with_audio=True, g="10", bf="2")


def test_a_track_of_several_chunks_and_runs_is_read_as_pyav_demuxes_it(tmp_path: Path) -> None:
    """The video of an interleaved file: stsc runs of 3 and 4 samples a chunk, stss, ctts and an edit (the B-frames'
    delay). Each sample's times, offset, size and flag are the demuxer's."""
    path = _interleaved(tmp_path / "interleaved.mp4")
    track = _tracks(path)[1]
    assert track.sample_entry == b"avc1" and track.sample_count == 45
    _assert_samples_demux_as(track, _demuxed(path, 1))
    assert {per_chunk for _, per_chunk, _ in _table(path, b"stsc", 3)} == {3, 4}
    assert track.samples is not None and 1 < int(track.samples.keyframe.sum()) < 45


@pytest.mark.parametrize("video", [r1_video, lambda: cr5_video(0)], ids=["r1_h264_b_frames", "cr5_av1"])
def test_real_files_own_samples_are_the_demuxers(video: Callable[[], Path]) -> None:
    """Real files: r1's H.264 (B-frames, ctts, 2 chunks) and cr5's AV1 (12 chunks of differing sample counts)."""
    path = video()
    (track,) = _tracks(path).values()
    _assert_samples_demux_as(track, _demuxed(path, track.track_id))
    assert len(_table(path, b"stsc", 3)) > 1


def test_a_track_of_sync_samples_only_has_no_stss_and_every_sample_is_a_keyframe(tmp_path: Path) -> None:
    """FFmpeg writes no stss where every sample is a sync sample (all intra): each is a keyframe."""
    path = _h264(tmp_path / "intra.mp4", 12, g="1", bf="0")
    assert b"stss" not in path.read_bytes()
    track = _tracks(path)[1]
    _assert_samples_demux_as(track, _demuxed(path, 1))
    assert track.samples is not None and track.samples.keyframe.all()


def _one_size_for_all(stbl: bytes) -> bytes:
    """stsz giving every sample its smallest listed size (one size field, no entries), as FFmpeg reads it then."""
    start, end = _child_box(stbl, b"stsz", 0, len(stbl))
    (count,) = struct.unpack_from(">I", stbl, start + 16)
    smallest = min(struct.unpack_from(f">{count}I", stbl, start + 20))
    return stbl[:start] + struct.pack(">I4sIII", 20, b"stsz", 0, smallest, count) + stbl[end:]


def test_one_size_for_all_samples_is_each_samples_size(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """An stsz box with one size for all (as constant-size codecs write it) lists none: every sample has that size,
    stored back to back in the one chunk, as PyAV demuxes the file."""
    source = marker_video("h264", 30)
    path = _with_box_payload(source, tmp_path / "one_size.mp4", _STBL, _one_size_for_all)
    track, listed = _tracks(path)[1], _tracks(source)[1]
    _assert_samples_demux_as(track, _demuxed(path, 1), fields=("offset", "size"))
    assert track.samples is not None and listed.samples is not None
    assert set(track.samples.size.tolist()) == {int(listed.samples.size.min())}
    # (the keyframe flags stss gives; FFmpeg's H.264 parser unflags packets whose misplaced bytes hold no IDR slice)
    np.testing.assert_array_equal(track.samples.keyframe, listed.samples.keyframe)


def _stsc_entry(stbl: bytes, entry: int, first_chunk: int, per_chunk: int | None = None) -> bytes:
    """stsc with the first chunk of its run ``entry`` (0 for the first) set to ``first_chunk`` (1-based), and its
    samples a chunk to ``per_chunk`` where given."""
    at = _child_box(stbl, b"stsc", 0, len(stbl))[0] + 16 + 12 * entry  # (header, version and flags, entry count)
    (kept,) = struct.unpack_from(">I", stbl, at + 4)
    return stbl[:at] + struct.pack(">II", first_chunk, kept if per_chunk is None else per_chunk) + stbl[at + 8 :]


def _last_run_past_the_last_chunk(stbl: bytes, runs: list[tuple[int, ...]], chunks: int) -> bytes:
    """The last run starts past the last chunk, and the run before it holds every sample a chunk: the runs still
    hold every sample, so only where the last one starts tells."""
    before = _stsc_entry(stbl, len(runs) - 2, runs[-2][0], per_chunk=45)
    return _stsc_entry(before, len(runs) - 1, chunks + 1)


@pytest.mark.parametrize(
    "damage",
    [
        lambda stbl, runs, chunks: _stsc_entry(stbl, 0, 2),
        lambda stbl, runs, chunks: _stsc_entry(stbl, 1, runs[0][0]),
        _last_run_past_the_last_chunk,
    ],
    ids=["first_run_not_at_chunk_1", "run_not_after_the_one_before", "run_past_the_last_chunk"],
)
def test_stsc_runs_that_do_not_follow_each_other_leave_the_samples_unknown(
    tmp_path: Path, damage: Callable[[bytes, list[tuple[int, ...]], int], bytes]
) -> None:
    """stsc runs start at chunk 1, each after the one before, none past the last chunk; FFmpeg mends tables that
    break this in its own way, so the samples are left to it (read anyway, runs were lost or failed numpy)."""
    source = _interleaved(tmp_path / "interleaved.mp4")
    runs, chunks = _table(source, b"stsc", 3), len(_table(source, b"stco", 1))
    assert _tracks(source)[1].samples is not None and len(runs) > 2
    path = _with_box_payload(source, tmp_path / "damaged.mp4", _STBL, lambda stbl: damage(stbl, runs, chunks))
    assert _tracks(path)[1].samples is None


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_a_track_without_an_edit_list_is_read_unshifted(marker_video: MarkerVideo, tmp_path: Path, codec: str) -> None:
    """Without an edit list (FFmpeg's ``use_editlist=0``) FFmpeg shifts no timestamp: the tables' own are the packets'
    (H.264's B-frames then start their pts at 1024, their two frames of delay)."""
    path = remux(marker_video(codec, 30), tmp_path / "no_edits.mp4", use_editlist="0")
    assert b"edts" not in path.read_bytes()
    track = _tracks(path)[1]
    assert track.edits == ()
    expected = _demuxed(path, 1)
    _assert_samples_demux_as(track, expected)
    assert int(expected["dts"][0]) == 0 and int(expected["pts"].min()) == (1024 if codec == "h264" else 0)


def test_an_edit_list_of_no_entries_is_no_edit(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """An elst box of 0 entries (its payload only the version, flags and count: 8 bytes) edits nothing: the edit list
    is empty, not unknown, and the AV1 marker video's tables (no B-frames) are its packets, unshifted."""
    path = _with_elst(marker_video("av1", 30), tmp_path / "no_entries.mp4", [])
    track = _tracks(path)[1]
    assert track.edits == ()
    _assert_samples_demux_as(track, _demuxed(path, 1))


def test_one_size_for_all_samples_may_fill_the_file_exactly() -> None:
    """An stsz box with one size for all gives its count where that many samples fit the file (10 of 5 bytes: 50),
    none where they do not (a damaged count)."""
    stbl = struct.pack(">I4sIII", 20, b"stsz", 0, 5, 10)  # (version and flags, the one size, the count)
    assert mp4_tables._sample_count(stbl, 0, len(stbl), file_size=50) == 10
    assert mp4_tables._sample_count(stbl, 0, len(stbl), file_size=49) is None


def test_a_full_box_tables_entries_are_read_only_where_its_box_holds_them() -> None:
    """A table box (stts, ctts, stsc, stss, stco...) holds its version and flags, an entry count, then the entries.
    Made up, the box at bytes 4 on among bytes that are not its own (0xff): whole, its entries (none for a count of
    0); a count its box cannot hold, or a box too short for its count, is unknown, never entries read from the bytes
    after it nor a struct.error."""
    before, after = b"\xff" * 4, b"\xff" * 16

    def table(count: int, *values: int) -> bytes:
        return before + struct.pack(f">4xI{len(values)}I", count, *values)

    whole = table(2, 1, 2, 3, 4)
    read = mp4_tables._full_box_table(whole + after, (4, len(whole)), 2, ">u4")
    assert read is not None and read.tolist() == [[1, 2], [3, 4]]
    empty = mp4_tables._full_box_table(table(0) + after, (4, 12), 2, ">u4")
    assert empty is not None and empty.shape == (0, 2)
    assert mp4_tables._full_box_table(table(3, 1, 2, 3, 4) + after, (4, len(whole)), 2, ">u4") is None
    assert mp4_tables._full_box_table(table(2, 1, 2, 3) + after, (4, len(whole) - 4), 2, ">u4") is None
    assert mp4_tables._full_box_table(table(0)[:11], (4, 11), 2, ">u4") is None  # (the count cut: the data ends)


@pytest.mark.parametrize("kind", [b"stts", b"stsc", b"stco"])
def test_a_track_missing_a_table_leaves_its_samples_unknown(
    marker_video: MarkerVideo, tmp_path: Path, kind: bytes
) -> None:
    """Without its decode times (stts), chunk runs (stsc) or chunk offsets (stco, nor co64), a track's samples cannot be
    placed: they are unknown (never a TypeError), its sample count still the one stsz gives."""

    def renamed(stbl: bytes) -> bytes:  # (the box kept, as a free box: no offset moves)
        start = _child_box(stbl, kind, 0, len(stbl))[0]
        return stbl[: start + 4] + b"free" + stbl[start + 8 :]

    path = _with_box_payload(marker_video("h264", 30), tmp_path / "missing.mp4", _STBL, renamed)
    track = _tracks(path)[1]
    assert track.sample_count == 90 and track.samples is None


def test_an_edit_list_whose_count_its_box_cannot_hold_is_unknown() -> None:
    """Made up: an elst box counting 2 entries of 12 bytes (version 0) but holding 1, a free box after it. The edit
    list is unknown, never 2 edits, the second read from the free box; the box holding its 1 entry gives it."""

    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I4s", 8 + len(payload), kind) + payload

    def trak(count: int) -> bytes:
        elst = struct.pack(">4xI", count) + struct.pack(">IihH", 1000, 1024, 1, 0)
        return box(b"edts", box(b"elst", elst)) + box(b"free", bytes(8))

    assert mp4_tables._edit_list(trak(1), 0, len(trak(1)), 1000, 15360) == (
        Edit(media_time=1024, duration=15360, normal_rate=True),
    )
    assert mp4_tables._edit_list(trak(2), 0, len(trak(2)), 1000, 15360) is None
