"""Packet indexes of MP4 files come from the moov sample tables: few bytes read, same index as a full demux.

The tables are read through FFmpeg's index where PyAV exposes it (>= 16) and by lerobot-dali itself otherwise
(LeRobot >= 0.5 pins PyAV < 16); tests marked ``index_source`` run both ways.
"""

from __future__ import annotations

import io
import logging
import struct
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import fsspec
import numpy as np
import pytest

import lerobot_dali.packet_index as packet_index
from lerobot_dali import mp4_tables
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.mp4_tables import Edit, Mp4Track, read_mp4_tracks
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from tests.video_fixtures import MarkerVideo, _child_box, cr5_video, r1_video, remux

_ARRAYS = ("pts", "dts", "byte_offset", "size_bytes", "keyframe", "hidden")
_FIELDS = ("codec", "width", "height", "pix_fmt", "time_base", "template", "byte_exact", "file_size_bytes")


@pytest.fixture(params=["ffmpeg_index", "own_tables"])
def index_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the MP4 route takes each sample's dts, offset, size and keyframe flag from: FFmpeg's index (PyAV >= 16
    exposes it) or the sample tables as :mod:`lerobot_dali.mp4_tables` reads them (what PyAV < 16 gets)."""
    if request.param == "ffmpeg_index":
        if int(av.__version__.split(".")[0]) < 16:
            pytest.skip("PyAV < 16 exposes no demuxer index")
    else:
        monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)
    return str(request.param)


class CountingReader(io.RawIOBase):
    """A seekable local file that counts the bytes read through it."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115
        self.bytes_read = 0

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def demux_index(path: Path | str, monkeypatch: pytest.MonkeyPatch) -> PacketIndex:
    """The index built by demuxing every packet (the fallback path), as before moov parsing existed."""
    with monkeypatch.context() as patch:
        patch.setattr(packet_index, "read_mp4_tracks", lambda handle, size: None)
        return build_packet_index(path)


def assert_same_index(actual: PacketIndex, expected: PacketIndex) -> None:
    for name in _ARRAYS:
        np.testing.assert_array_equal(getattr(actual, name), getattr(expected, name), err_msg=name)
    for name in _FIELDS:
        assert getattr(actual, name) == getattr(expected, name), name


def top_level_boxes(path: Path) -> list[bytes]:
    raw, kinds, position = path.read_bytes(), [], 0
    while position < len(raw):
        size, kind = struct.unpack_from(">I4s", raw, position)
        size = struct.unpack_from(">Q", raw, position + 8)[0] if size == 1 else size
        kinds.append(kind)
        position += size
    return kinds


def test_moov_index_reads_few_bytes_of_a_large_file(monkeypatch: pytest.MonkeyPatch, index_source: str) -> None:
    path = cr5_video(0)
    reader = CountingReader(path)
    with reader:
        index = build_packet_index(reader)
    assert reader.bytes_read < 0.05 * index.file_size_bytes, (reader.bytes_read, index.file_size_bytes)
    assert_same_index(index, demux_index(path, monkeypatch))


def test_fsspec_source_reads_few_bytes(monkeypatch: pytest.MonkeyPatch, index_source: str) -> None:
    path = cr5_video(1)
    memory = fsspec.filesystem("memory")
    memory.pipe("/remote/cam.mp4", path.read_bytes())
    reads: list[int] = []
    real_open = memory.open

    def counting_open(name: str, mode: str = "rb", **kwargs: object) -> object:
        handle = real_open(name, mode, **kwargs)
        read = handle.read
        handle.read = lambda size=-1: reads.append(len(chunk := read(size))) or chunk  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(memory, "open", counting_open)
    index = build_packet_index("/remote/cam.mp4", filesystem=memory)
    assert sum(reads) < 0.05 * index.file_size_bytes
    assert_same_index(index, demux_index(path, monkeypatch))


@pytest.mark.parametrize("cached", [False, True], ids=["remote", "prefetch_cache_lacking_it"])
def test_a_video_over_http_fetches_few_bytes_to_index_and_cut_a_clip(tmp_path: Path, cached: bool) -> None:
    """The reads above were few, but fsspec fetched its default block (5 MB) for each: indexing a remote file cost
    5 MB (a smaller file: all of it), and every clip a worker reads without the prefetch cache (cache_gb=0, a
    read-only disk) fetched 5 MB past its GOP: 3 batches of 8 frames of cr5_v30_av1 fetched 92 MB, thrice the
    dataset's videos. What the prefetch cache lacks (a cache smaller than the pool) was read 4 MB ahead: 87 MB."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from lerobot_dali.cached_filesystem import CachedFileSystem
    from lerobot_dali.clips import build_clip, plan_clip
    from lerobot_dali.remote_retry import RetryingFileSystem
    from lerobot_dali.video_source import VIDEO_READ_AHEAD_BYTES
    from tests.http_server import serve_folder

    path = cr5_video(0)
    with serve_folder(path.parent) as server:
        fs, url = RetryingFileSystem(fsspec.filesystem("http")), f"{server.url}/{path.name}"
        if cached:
            fs = CachedFileSystem(fs, tmp_path)
        index = build_packet_index(url, filesystem=fs)
        assert server.sent_bytes < 0.05 * index.file_size_bytes, (server.sent_bytes, index.file_size_bytes)
        frames = [len(index.pts) // 2, len(index.pts) // 2 + 3]
        spans = sum(
            int((index.byte_offset[stop - 1] + index.size_bytes[stop - 1]) - index.byte_offset[start])
            for start, stop in plan_clip(index, frames).segments
        )
        server.reset_stats()
        clip = build_clip(url, index, frames, filesystem=fs)
        assert len(clip.relative_indices) == 2
        assert server.sent_bytes <= spans + VIDEO_READ_AHEAD_BYTES, (server.sent_bytes, spans)


@pytest.mark.parametrize("faststart", [False, True], ids=["moov_at_end", "faststart"])
def test_moov_at_either_end(
    marker_video: MarkerVideo, tmp_path: Path, faststart: bool, monkeypatch: pytest.MonkeyPatch, index_source: str
) -> None:
    source = marker_video("h264", 30)
    options = {"movflags": "faststart"} if faststart else {}
    path = remux(source, tmp_path / "remuxed.mp4", **options)
    kinds = top_level_boxes(path)
    assert (kinds.index(b"moov") < kinds.index(b"mdat")) is faststart
    assert_same_index(build_packet_index(path), demux_index(path, monkeypatch))


def test_non_mp4_falls_back_to_demux(
    marker_video: MarkerVideo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mkv = remux(marker_video("vp9", 30), tmp_path / "v.mkv")
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.packet_index"):
        index = build_packet_index(mkv)
    assert "not an MP4" in caplog.text
    with av.open(str(mkv)) as container:
        expected = [p.pts for p in container.demux(container.streams.video[0]) if p.size]
    assert index.pts.tolist() == expected


def test_disagreeing_tables_fall_back(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, index_source: str
) -> None:
    path = marker_video("h264", 30)
    expected = demux_index(path, monkeypatch)
    real = packet_index.read_mp4_tracks

    def wrong_ctts(handle: io.BufferedIOBase, size: int) -> dict[int, Mp4Track] | None:
        tracks = real(handle, size)
        assert tracks
        return {k: replace(t, ctts_offsets=t.ctts_offsets * 2) for k, t in tracks.items()}

    monkeypatch.setattr(packet_index, "read_mp4_tracks", wrong_ctts)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.packet_index"):
        index = build_packet_index(path)
    assert "disagrees" in caplog.text
    assert_same_index(index, expected)


def test_a_faststart_file_cut_in_its_media_is_called_truncated(
    marker_video: MarkerVideo, tmp_path: Path, index_source: str
) -> None:
    """Its header lists every sample, so the index reaches past the cut and says so (a whole demux, which the
    tables' own route falls back to when its checks fail, would stop quietly where the bytes end)."""
    whole = remux(marker_video("h264", 30), tmp_path / "faststart.mp4", movflags="faststart").read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) * 3 // 4])
    with pytest.raises(
        packet_index.VideoDecodeError, match=rf"but the file has {len(whole) * 3 // 4} bytes; the file is truncated"
    ):
        build_packet_index(cut)


def _mdat_payload(raw: bytes) -> tuple[int, int]:
    at = raw.find(b"mdat") - 4
    (size,) = struct.unpack_from(">I", raw, at)
    return at + 8, at + size


@pytest.mark.parametrize(
    ("layout", "damage"),
    [("moov_last", 4096), ("moov_last", 2**30), ("moov_last", "chunk_moved"), ("faststart", 4096)],
)
def test_sample_tables_that_place_packets_outside_the_media_data_are_called_damaged(
    marker_video: MarkerVideo, tmp_path: Path, index_source: str, layout: str, damage: int | str
) -> None:
    """Sample 45's size grown (every later sample of its one chunk shifts into moov or past the file's end; at
    1 GiB FFmpeg drops the samples from there on and shifts every timestamp by a frame) or the chunk moved 16
    bytes: the file fails as damaged, naming the first packet outside its mdat box, where frames would otherwise
    decode from the wrong bytes, or be handed out a frame late. (Not "truncated": the mdat box is whole.)"""
    source = marker_video("h264", 30)
    if layout == "faststart":
        source = remux(source, tmp_path / "faststart.mp4", movflags="faststart")
    clean = build_packet_index(source)
    raw = bytearray(source.read_bytes())
    offsets, sizes = clean.byte_offset.copy(), clean.size_bytes.copy()
    if damage == "chunk_moved":
        at = raw.find(b"stco") + 12  # (type, version and flags, entry count): the one chunk's offset
        assert struct.unpack_from(">I", raw, at - 4) == (1,)
        struct.pack_into(">I", raw, at, struct.unpack_from(">I", raw, at)[0] + 16)
        offsets += 16
    else:
        at = raw.find(b"stsz") + 16 + 4 * 45  # (type, version and flags, uniform size, count): sample 45's size
        struct.pack_into(">I", raw, at, struct.unpack_from(">I", raw, at)[0] + int(damage))
        sizes[45] += int(damage)
        offsets[46:] += int(damage)
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(raw))
    start, stop = _mdat_payload(raw)
    first = int(np.flatnonzero((offsets < start) | (offsets + sizes > stop))[0])
    assert first == (89 if damage == "chunk_moved" else 45)
    with pytest.raises(
        packet_index.VideoDecodeError,
        match=rf"damaged\.mp4: packet {first} \(bytes {offsets[first]}-{offsets[first] + sizes[first]}\) lies "
        rf"outside the file's media data \(mdat bytes {start}-{stop}\); its sample tables \(stsz/stco\) are damaged",
    ):
        build_packet_index(path)


@pytest.mark.parametrize("uniform", [0, 154_189_438], ids=["sizes_listed", "one_size"])
def test_a_sample_count_the_file_cannot_hold_fails_as_damaged(
    marker_video: MarkerVideo, tmp_path: Path, index_source: str, uniform: int
) -> None:
    """stsz's count (and its one size for all) damaged to what a fuzz drew: the index asked numpy for 25 GiB
    (MemoryError) instead of leaving the tables to FFmpeg, which finds the file damaged."""
    raw = bytearray(marker_video("av1", 30).read_bytes())
    struct.pack_into(">II", raw, raw.find(b"stsz") + 8, uniform, 3_361_798_706)  # (type, version and flags)
    path = tmp_path / "count.mp4"
    path.write_bytes(bytes(raw))
    with pytest.raises(packet_index.VideoDecodeError, match=r"count\.mp4: .*(header damaged|truncated or corrupt)"):
        build_packet_index(path)


def test_packets_sharing_bytes_or_without_media_data_are_called_damaged() -> None:
    """What a chunk moved into its neighbour looks like (one chunk per marker video: made up here), and an MP4
    with no mdat box at all."""
    offsets, sizes = np.array([100, 150, 140]), np.array([50, 40, 20])
    check = packet_index._check_packets_in_media_data
    check(offsets[:2], sizes[:2], ((100, 190),), label="v.mp4")  # back to back: sound
    with pytest.raises(
        packet_index.VideoDecodeError,
        match=r"v\.mp4: packets 0 \(bytes 100-150\) and 2 \(bytes 140-160\) share bytes; its sample tables",
    ):
        check(offsets, sizes, ((90, 200),), label="v.mp4")
    with pytest.raises(
        packet_index.VideoDecodeError, match=r"packet 1 \(bytes 150-190\) lies outside .*bytes 90-180\)"
    ):
        check(offsets, sizes, ((90, 180),), label="v.mp4")
    with pytest.raises(packet_index.VideoDecodeError, match=r"packet 0 \(bytes 100-150\) .*\(mdat bytes none\)"):
        check(offsets, sizes, (), label="v.mp4")


@pytest.mark.parametrize("edit", ["later_start", "early_end"])
def test_an_edited_edit_list_indexes_as_the_demuxer_reads_it(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_source: str, edit: str
) -> None:
    """An edit that starts 5 frames later (FFmpeg shifts every timestamp by it) or ends halfway through the media."""
    raw = bytearray(marker_video("h264", 30).read_bytes())
    at = raw.find(b"elst") + 12  # the first entry: segment duration, media time (version 0)
    duration, media_time = struct.unpack_from(">Ii", raw, at)
    if edit == "later_start":
        struct.pack_into(">i", raw, at + 4, media_time + 5 * 512)
    else:
        struct.pack_into(">I", raw, at, duration // 2)
    path = tmp_path / "edited.mp4"
    path.write_bytes(bytes(raw))
    expected = demux_index(path, monkeypatch)
    assert_same_index(build_packet_index(path), expected)
    if edit == "later_start":
        assert expected.pts.min() == -5 * 512 and expected.frame_count == 90


@pytest.mark.parametrize(
    ("wrong", "said"),
    [("last_size", "the last packets disagree"), ("first_size", "packet 0 disagrees")],
)
def test_own_tables_that_disagree_with_the_demuxer_fall_back(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, wrong: str, said: str
) -> None:
    """The tables' own rows are checked at both ends: the first packets, and the last (an edit list that ends early,
    which FFmpeg applies by dropping samples, would differ there)."""
    monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)
    path = marker_video("h264", 30)
    expected = demux_index(path, monkeypatch)
    real = packet_index.read_mp4_tracks

    def damaged(handle: io.BufferedIOBase, size: int) -> dict[int, Mp4Track] | None:
        tracks = real(handle, size)
        assert tracks and all(t.samples is not None for t in tracks.values())
        out = {}
        for k, t in tracks.items():
            assert t.samples is not None
            sizes = t.samples.size.copy()
            sizes[-1 if wrong == "last_size" else 0] += 1
            out[k] = replace(t, samples=replace(t.samples, size=sizes))
        return out

    monkeypatch.setattr(packet_index, "read_mp4_tracks", damaged)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.packet_index"):
        index = build_packet_index(path)
    assert said in caplog.text
    assert_same_index(index, expected)


def test_own_tables_of_b_frames_take_the_edit_lists_shift_on_both_timestamps(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An H.264 stream with B-frames (two frames of delay: 1024 ticks of 1/15360 s at 30 fps) starts its own tables' dts
    at 0 and its pts at 1024; its edit list starts at 1024, so FFmpeg shifts both by -1024: dts from -1024, pts from 0.
    The tables' own rows take that shift on both, agree with the demuxer at both ends and are trusted, with no demux.
    """
    monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)

    def no_demux(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sample tables were not trusted: the whole file was demuxed")

    monkeypatch.setattr(packet_index, "_rows_from_demux", no_demux)
    index = build_packet_index(marker_video("h264", 30))
    assert index.time_base == Fraction(1, 15360) and index.frame_count == 90
    assert index.dts[:6].tolist() == [-1024, -512, 0, 512, 1024, 1536]
    assert index.pts[:6].tolist() == [0, 1536, 512, 1024, 3072, 2048]
    assert index.dts[-3:].tolist() == [43520, 44032, 44544]
    assert index.pts[-3:].tolist() == [44032, 45568, 45056]


def test_own_tables_of_a_one_frame_video_are_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-frame H.264 MP4: the seek to its last packet's dts lands on its first, so the demuxer's tail is every row
    (from row 0); the tables agree at both ends and are trusted, with no demux: one keyframe at pts 0 and dts 0, at
    the bytes PyAV demuxes it from."""
    monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)

    def no_demux(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sample tables were not trusted: the whole file was demuxed")

    monkeypatch.setattr(packet_index, "_rows_from_demux", no_demux)
    path = tmp_path / "one.mp4"
    encode_video(path, [draw_marker(0, 0, 64, 96)], fps=30, codec="h264", gop=30)
    index = build_packet_index(path)
    assert (index.pts.tolist(), index.dts.tolist(), index.keyframe.tolist()) == ([0], [0], [True])
    with av.open(str(path)) as container:
        (packet,) = [(p.pos, p.size) for p in container.demux(video=0) if p.size]
    assert (index.byte_offset.tolist(), index.size_bytes.tolist()) == ([packet[0]], [packet[1]])


def test_tables_with_what_is_not_modelled_are_demuxed_with_a_warning(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)
    path = marker_video("h264", 30)
    expected = demux_index(path, monkeypatch)
    real = packet_index.read_mp4_tracks
    monkeypatch.setattr(
        packet_index,
        "read_mp4_tracks",
        lambda handle, size: {k: replace(t, samples=None) for k, t in (real(handle, size) or {}).items()},
    )
    packet_index._note_no_demuxer_index.cache_clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index"):
        assert_same_index(build_packet_index(path), expected)
        assert_same_index(build_packet_index(path), expected)
    assert caplog.text.count("indexed by demuxing them whole") == 1


def test_real_files_match_demux(monkeypatch: pytest.MonkeyPatch, index_source: str) -> None:
    for path in (r1_video(), cr5_video(0), cr5_video(1), cr5_video(2)):
        assert_same_index(build_packet_index(path), demux_index(path, monkeypatch))


class ResettingReader(CountingReader):
    """Reads like the file until ``after`` bytes, then the connection resets (as aiohttp's ClientOSError)."""

    def __init__(self, path: Path, after: int) -> None:
        super().__init__(path)
        self.after = after

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.bytes_read >= self.after:
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().readinto(buffer)


@pytest.mark.parametrize("after", [0, 2000])
def test_a_network_failure_while_indexing_is_not_called_a_corrupt_file(marker_video: MarkerVideo, after: int) -> None:
    """A reset while the index was built came back as VideoDecodeError '... the file is truncated or corrupt'."""
    path = marker_video("h264", 30)
    with pytest.raises(ConnectionResetError, match="reset by peer"):
        build_packet_index(ResettingReader(path, after))
    truncated = io.BytesIO(path.read_bytes()[:2000])
    with pytest.raises(packet_index.VideoDecodeError, match="truncated or corrupt"):
        build_packet_index(truncated)


def test_a_corrupt_local_file_in_a_folder_named_timeout_is_still_corrupt(marker_video: MarkerVideo, tmp_path) -> None:
    """The transient check read the whole message, which holds the path: a folder named "timeout runs" made a
    corrupt file's FFmpeg error (EOF, ENOMEM) look like a network timeout, and it escaped as a bare av error."""
    data = bytearray(marker_video("h264", 30).read_bytes())
    folder = tmp_path / "timeout runs"
    folder.mkdir()
    failures = []
    for cut in (16, 100, 500, 1000, len(data) // 2):
        damaged = folder / f"cut{cut}.mp4"
        damaged.write_bytes(bytes(data[:cut]))
        try:
            build_packet_index(damaged)
        except Exception as e:
            failures.append(type(e).__name__)
    assert failures and set(failures) == {"VideoDecodeError"}, failures


def _with_box_payload(source: Path, target: Path, path: tuple[bytes, ...], edit: Callable[[bytes], bytes]) -> Path:
    """``source`` (its moov after its mdat: no chunk offset moves) written to ``target`` with the payload of the box
    at ``path`` (types from the top level down) replaced by ``edit(payload)``, its parents' sizes grown to match."""
    raw = bytearray(source.read_bytes())
    boxes: list[tuple[int, int]] = []
    for kind in path:
        boxes.append(_child_box(raw, kind, boxes[-1][0] + 8 if boxes else 0, boxes[-1][1] if boxes else len(raw)))
    assert boxes[0][0] > _child_box(raw, b"mdat", 0, len(raw))[0], "moov before mdat: chunk offsets would move"
    start, end = boxes[-1]
    payload = edit(bytes(raw[start + 8 : end]))
    for at, _ in boxes:
        struct.pack_into(">I", raw, at, struct.unpack_from(">I", raw, at)[0] + len(payload) + 8 - (end - start))
    raw[start + 8 : end] = payload
    target.write_bytes(bytes(raw))
    return target


_TRAK = (b"moov", b"trak")
_STBL = (*_TRAK, b"mdia", b"minf", b"stbl")


def _track(path: Path) -> Mp4Track:
    with open(path, "rb") as handle:
        tracks = read_mp4_tracks(handle, path.stat().st_size)
    assert tracks is not None and list(tracks) == [1]
    return tracks[1]


def _with_movie_timescale(source: Path, target: Path, timescale: int) -> Path:
    """``source`` with its mvhd (version 0: the timescale after its creation and modification times) in
    ``timescale``."""
    return _with_box_payload(source, target, (b"moov", b"mvhd"),
                             lambda p: p[:12] + struct.pack(">I", timescale) + p[16:])  # fmt: skip


def _with_elst(source: Path, target: Path, entries: list[tuple[int, int, int, int]], *, version: int = 0) -> Path:
    """``source`` with its edit list replaced by ``entries`` (duration in the movie's timescale, media time in the
    track's, rate integer and fraction), as an elst box of ``version`` (1: 64-bit duration and media time)."""
    entry = ">QqhH" if version == 1 else ">IihH"
    body = struct.pack(">BxxxI", version, len(entries)) + b"".join(struct.pack(entry, *e) for e in entries)
    return _with_box_payload(source, target, (*_TRAK, b"edts", b"elst"), lambda _: body)


def test_composition_offsets_run_ctts_by_hand() -> None:
    """ctts runs expand to one offset a sample; runs that cover more or fewer samples than stsz lists do not fit (the
    index then demuxes): repeating them anyway gave a table of another length, which failed (zip strict) or misplaced
    every later sample's offset."""
    track = Mp4Track(1, 3, np.array([2, 1]), np.array([512, -512]), fragmented=False)
    assert track.composition_offsets().tolist() == [512, 512, -512]
    assert replace(track, sample_count=4).composition_offsets() is None
    assert replace(track, sample_count=2).composition_offsets() is None
    assert replace(track, ctts_counts=np.zeros(0, dtype=np.int64)).composition_offsets().tolist() == [0, 0, 0]


def test_a_version_1_track_header_gives_its_track_id(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A tkhd of version 1 (64-bit times, as long recordings get) holds its track id 8 bytes further on: read at
    version 0's place, it was the modification time's high word (0), and the track was not found (a whole demux)."""
    source = marker_video("h264", 30)

    def version_1(p: bytes) -> bytes:  # (creation and modification times, track id, reserved, duration: 32 -> 64 bits)
        created, modified, track_id, reserved, duration = struct.unpack_from(">5I", p, 4)
        return b"\x01" + p[1:4] + struct.pack(">QQIIQ", created, modified, track_id, reserved, duration) + p[24:]

    path = _with_box_payload(source, tmp_path / "tkhd1.mp4", (*_TRAK, b"tkhd"), version_1)
    with av.open(str(path)) as container:
        assert container.streams.video[0].id == 1
    plain, wide = _track(source), _track(path)
    assert wide.samples is not None and plain.samples is not None
    for name in ("dts", "offset", "size", "keyframe"):
        np.testing.assert_array_equal(getattr(wide.samples, name), getattr(plain.samples, name), err_msg=name)
    index = build_packet_index(path)
    np.testing.assert_array_equal(index.pts, build_packet_index(source).pts)


@pytest.mark.parametrize("version", [0, 1])
def test_an_edit_is_read_in_media_ticks_rounded_down(marker_video: MarkerVideo, tmp_path: Path, version: int) -> None:
    """1001 ms of the movie's 1/1000 s are 15375.36 ticks of the track's 1/15360 s: 15375 (FFmpeg rounds to the
    nearest: the same here), from either elst version. Frames 0-30 (pts up to 30 * 512 = 15360) start before it: the
    demuxer shows 31 frames."""
    path = _with_elst(marker_video("h264", 30), tmp_path / "edit.mp4", [(1001, 1024, 1, 0)], version=version)
    track = _track(path)
    assert track.edits == (Edit(media_time=1024, duration=15375, normal_rate=True),)
    assert track.samples is None  # (the edit hides frames 31-89: FFmpeg demuxes them flagged, not shown)
    index = build_packet_index(path)
    assert len(index.shown) == 31 and int(index.pts[index.shown].max()) == 30 * 512


def test_an_edit_at_another_rate_is_not_a_plain_shift(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """The rate is 16.16 fixed point: integer 1, fraction 0x8000 is 1.5, not normal rate; the tables are then not read
    as FFmpeg reads them (it applies other rates otherwise)."""
    path = _with_elst(marker_video("h264", 30), tmp_path / "rate.mp4", [(3000, 1024, 1, 0x8000)])
    track = _track(path)
    assert track.edits == (Edit(media_time=1024, duration=46080, normal_rate=False),)
    assert track.samples is None


@pytest.mark.parametrize(
    ("entries", "plain"),
    [
        ([(45569, 1024)], True),  # ends 1 tick after the last frame's start: every frame shown
        ([(45568, 1024)], False),  # ends where the last frame starts: FFmpeg hides it
        ([(100_000, -1)], False),  # one empty edit, longer than the media: no media plays
    ],
    ids=["past_last_frame", "at_last_frame", "empty_edit_only"],
)
def test_whether_one_edit_hides_a_sample_decides_whether_the_tables_are_read_plainly(
    marker_video: MarkerVideo, tmp_path: Path, entries: list[tuple[int, int]], plain: bool
) -> None:
    """The movie in the track's timescale (1/15360 s), so an edit ends on a tick: the last frame's composition time is
    1024 + 89 * 512 = 46592. An edit from 1024 that ends there hides it (a sample is shown before the edit's end),
    one tick later hides none; the tables are read plainly only then, as the demuxer agrees."""
    source = _with_movie_timescale(marker_video("h264", 30), tmp_path / "ticks.mp4", 15360)
    path = _with_elst(source, tmp_path / "edit.mp4", [(d, t, 1, 0) for d, t in entries])
    track = _track(path)
    assert (track.samples is not None) is plain
    if entries[0][1] >= 0:
        index = build_packet_index(path)
        assert index.hidden is None if plain else index.pts[index.hidden].tolist() == [89 * 512]


def _append_sbgp(stbl: bytes) -> bytes:  # (a sample-to-group box of grouping type rap, no entries)
    return stbl + struct.pack(">I4sI4sI", 20, b"sbgp", 0, b"rap ", 0)


def _one_fewer_in_first_stts_run(stbl: bytes) -> bytes:
    at = _child_box(stbl, b"stts", 0, len(stbl))[0] + 16  # (header, version and flags, entry count)
    (count,) = struct.unpack_from(">I", stbl, at)
    return stbl[:at] + struct.pack(">I", count - 1) + stbl[at + 4 :]


def _one_fewer_per_chunk(stbl: bytes) -> bytes:
    at = _child_box(stbl, b"stsc", 0, len(stbl))[0] + 20  # (header, version and flags, entry count, first chunk)
    (per_chunk,) = struct.unpack_from(">I", stbl, at)
    return stbl[:at] + struct.pack(">I", per_chunk - 1) + stbl[at + 4 :]


def _sync_sample_0(stbl: bytes) -> bytes:  # (sync samples are numbered from 1: the first, sample 1, as 0)
    at = _child_box(stbl, b"stss", 0, len(stbl))[0] + 16  # (header, version and flags, entry count)
    assert struct.unpack_from(">I", stbl, at) == (1,)
    return stbl[:at] + struct.pack(">I", 0) + stbl[at + 4 :]


@pytest.mark.parametrize(
    "damage", [None, _append_sbgp, _one_fewer_in_first_stts_run, _one_fewer_per_chunk, _sync_sample_0],
    ids=["clean", "sample_groups", "stts_one_short", "stsc_one_short", "stss_sample_0"],
)  # fmt: skip
def test_tables_that_do_not_add_up_or_hold_sample_groups_are_left_to_ffmpeg(
    marker_video: MarkerVideo, tmp_path: Path, damage: Callable[[bytes], bytes] | None
) -> None:
    """The marker video's 90 samples lie in one chunk: stsc saying 89 a chunk, or stts timing 89, no longer add up to
    stsz's 90 (read anyway, they gave 89 decode times, or failed on arrays of different lengths); sample groups may
    make FFmpeg flag samples keyframes; a sync sample numbered 0 is no sample (they count from 1: read anyway, it
    flagged the last). Each leaves the samples unknown (FFmpeg's index or a demux instead)."""
    source = marker_video("h264", 30)
    path = source if damage is None else _with_box_payload(source, tmp_path / "damaged.mp4", _STBL, damage)
    track = _track(path)
    assert track.sample_count == 90
    if damage is not None:
        assert track.samples is None
    else:
        assert track.samples is not None
        assert track.samples.dts.tolist() == [512 * i for i in range(90)]


def test_ffmpegs_index_indexes_tables_not_read_here_without_a_whole_demux(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sample groups leave the tables' own samples unknown (above), which costs PyAV < 16 a whole demux of the file;
    where PyAV exposes FFmpeg's index, the packets come from it and the first few demuxed, never a whole demux."""
    if int(av.__version__.split(".")[0]) < 16:
        pytest.skip("PyAV < 16 exposes no demuxer index")
    path = _with_box_payload(marker_video("h264", 30), tmp_path / "groups.mp4", _STBL, _append_sbgp)
    assert _track(path).samples is None
    expected = demux_index(path, monkeypatch)
    whole_demuxes: list[Path] = []
    real = packet_index._rows_from_demux
    monkeypatch.setattr(packet_index, "_rows_from_demux", lambda *a, **k: whole_demuxes.append(path) or real(*a, **k))
    assert_same_index(build_packet_index(path), expected)
    assert whole_demuxes == []


def test_a_movie_timescale_of_0_leaves_the_edit_list_unknown(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_source: str
) -> None:
    """A damaged mvhd whose timescale is 0 (FFmpeg then takes 1): the edit's duration cannot be scaled (it raised
    ZeroDivisionError); the edit list is not known, and the index is the demuxer's."""
    path = _with_movie_timescale(marker_video("h264", 30), tmp_path / "zero.mp4", 0)
    track = _track(path)
    assert track.edits is None and track.samples is None
    assert_same_index(build_packet_index(path), demux_index(path, monkeypatch))


def test_a_timescale_is_read_only_whole_within_its_box() -> None:
    """An mvhd or mdhd box gives its timescale after its version and flags and its creation and modification times (4
    bytes each; 8 at version 1): 15360 where the box holds its 4 bytes, unknown where it ends within them."""
    narrow, wide = bytes(12) + struct.pack(">I", 15360), b"\x01" + bytes(19) + struct.pack(">I", 15360)
    assert mp4_tables._timescale(narrow, (0, 16)) == mp4_tables._timescale(wide, (0, 24)) == 15360
    assert mp4_tables._timescale(narrow, (0, 15)) is None and mp4_tables._timescale(wide, (0, 23)) is None


def test_a_64_bit_box_size_cut_short_ends_the_boxes_read() -> None:
    """A box whose size field is 1 gives its size in the 8 bytes after its type (a 16-byte header): where fewer than 16
    bytes are left, it is no box, and the boxes read stop there, as at any malformed box (never a struct.error)."""
    free, large = struct.pack(">I4s", 8, b"free"), struct.pack(">I4sQ", 1, b"skip", 16)
    assert list(mp4_tables._child_boxes(free + large, 0, 24)) == [(b"free", 8, 8), (b"skip", 24, 24)]
    assert list(mp4_tables._child_boxes(free + large[:15], 0, 23)) == [(b"free", 8, 8)]


def test_an_mehd_or_elst_box_cut_within_its_fields_is_unknown() -> None:
    """Made up, each box the last bytes read: an mehd of version 1 gives the movie's duration in the 8 bytes after its
    version and flags (3000 ticks of 1/1000 s: 3 s), unknown where the box holds 7 of them; an elst box holds its entry
    count after its version and flags, its edit list unknown where the box ends within the count (never a
    struct.error)."""

    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I4s", 8 + len(payload), kind) + payload

    mehd = b"\x01\x00\x00\x00" + struct.pack(">Q", 3000)
    assert mp4_tables._fragmented_duration_s(box(b"mvex", box(b"mehd", mehd)), 1000) == 3
    assert mp4_tables._fragmented_duration_s(box(b"mvex", box(b"mehd", mehd[:11])), 1000) is None
    edts = box(b"edts", box(b"elst", bytes(7)))
    assert mp4_tables._edit_list(edts, 0, len(edts), 1000, 15360) is None


def _co64_for_stco(stbl: bytes) -> bytes:  # (the chunk offsets in 64 bits, as a file past 4 GiB holds them)
    start, end = _child_box(stbl, b"stco", 0, len(stbl))
    (count,) = struct.unpack_from(">I", stbl, start + 12)  # (after the header, version and flags)
    wide = stbl[start + 8 : start + 16] + struct.pack(f">{count}Q", *struct.unpack_from(f">{count}I", stbl, start + 16))
    return stbl[:start] + struct.pack(">I4s", 8 + len(wide), b"co64") + wide + stbl[end:]


def test_64_bit_chunk_offsets_give_the_samples_32_bit_ones_do(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_source: str
) -> None:
    """A file whose media reaches past 4 GiB lists its chunks' offsets in a co64 box (8 bytes each), not stco: the
    marker video's one chunk so listed gives each sample the offset stco gave it, and the index a demux gives."""
    source = marker_video("h264", 30)
    path = _with_box_payload(source, tmp_path / "co64.mp4", _STBL, _co64_for_stco)
    plain, wide = _track(source), _track(path)
    assert plain.samples is not None and wide.samples is not None
    np.testing.assert_array_equal(wide.samples.offset, plain.samples.offset)
    assert_same_index(build_packet_index(path), demux_index(path, monkeypatch))


def test_an_stz2_count_must_fit_its_field_sizes() -> None:
    """stz2 packs sizes of 4, 8 or 16 bits: 3 sizes of 4 bits take 2 bytes (the last half a byte). A box with one byte
    of them cannot hold 3, and its count is not trusted (a damaged count made a huge array)."""

    def stbl(count: int, packed: bytes) -> bytes:
        payload = struct.pack(">I3xBI", 0, 4, count) + packed  # (version and flags, reserved, field size, count)
        return struct.pack(">I4s", 8 + len(payload), b"stz2") + payload

    for data, expected in [(stbl(3, b"\x12\x30"), 3), (stbl(3, b"\x12"), None), (stbl(2, b"\x12"), 2)]:
        assert mp4_tables._sample_count(data, 0, len(data), file_size=1 << 20) == expected


def test_a_packet_past_the_end_of_a_file_cut_within_its_media_data_is_called_truncated() -> None:
    """The media data is checked first only where the file holds it whole (a packet outside it: damaged tables). An
    mdat box the file's end cuts (bytes 100-600 of a 500-byte file) says the file is cut short, and a packet past the
    end is named so, though it lies outside that mdat too (bytes 400-700). Without media data (not an MP4) only the
    file's end is checked."""
    check = packet_index._check_packet_bytes
    offsets, sizes = np.array([100, 400]), np.array([300, 300])
    check(offsets, sizes, ((100, 700),), 700, label="v.mp4")  # whole
    with pytest.raises(packet_index.VideoDecodeError, match=r"packet 1 \(bytes 400-700\) lies outside"):
        check(offsets, sizes, ((100, 650),), 700, label="v.mp4")
    cut = r"v\.mp4: packets extend to byte 700 but the file has 500 bytes; the file is truncated"
    with pytest.raises(packet_index.VideoDecodeError, match=cut):
        check(offsets, sizes, ((100, 600),), 500, label="v.mp4")
    check(offsets, sizes, None, 700, label="v.mkv")
    with pytest.raises(packet_index.VideoDecodeError, match=r"v\.mkv: packets extend to byte 700 but the file has 500"):
        check(offsets, sizes, None, 500, label="v.mkv")


def test_listed_samples_of_zero_bytes_are_not_counted_against_the_demuxed_packets() -> None:
    """FFmpeg's demux, and the rows, skip a sample of 0 bytes: a track listing one (at byte 9,999, past the 30-byte
    file's end) and two others, both demuxed, is whole: its samples are not checked. Where the demuxer found fewer,
    the samples of some bytes are (numbered among themselves): one outside the media data is named."""
    samples = mp4_tables.SampleTable(
        dts=np.array([0, 1, 2]), offset=np.array([0, 9_999, 10]), size=np.array([10, 0, 20]), keyframe=np.ones(3, bool)
    )
    track = Mp4Track(1, 3, np.array([]), np.array([]), False, samples=samples, media_data=((0, 30),))
    packet_index._check_listed_samples(track, 2, label="v.mp4", file_size=30)
    damaged = replace(track, samples=replace(samples, offset=np.array([0, 9_999, 25])))
    with pytest.raises(packet_index.VideoDecodeError, match=r"v\.mp4: packet 1 \(bytes 25-45\) lies outside"):
        packet_index._check_listed_samples(damaged, 1, label="v.mp4", file_size=30)


def test_a_gap_before_the_one_piece_an_edit_list_plays_is_no_piece() -> None:
    """An empty edit (media time -1: a gap before the media plays) then one piece plays the media once, whatever its
    packets: here two share bytes, which the media data check names (damaged tables), not this one; two pieces are
    named. Made up: two packets, both at bytes 100-150."""
    table = np.array([[0, 0, 100, 50, 1, 0], [512, 512, 100, 50, 0, 0]])  # (pts, dts, offset, size, keyframe, hidden)
    gap = Edit(media_time=-1, duration=512, normal_rate=True)
    piece = Edit(media_time=0, duration=1024, normal_rate=True)
    track = Mp4Track(1, 2, np.array([]), np.array([]), False, edits=(gap, piece))
    packet_index._check_samples_played_once(table, track, label="v.mp4")
    with pytest.raises(packet_index.VideoDecodeError, match=r"v\.mp4: its edit list plays the media in 2 pieces"):
        packet_index._check_samples_played_once(table, replace(track, edits=(piece, piece)), label="v.mp4")
