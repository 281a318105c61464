"""A local MP4 on the CPU route: its packets read by byte range and decoded from them alone, no container."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from lerobot_dali.clips import plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_pixels import frame_conversion
from lerobot_dali.packet_file_reader import PacketFileReader
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.pyav_reader import PyAvReader
from tests.video_fixtures import MarkerVideo, reference_frames

WINDOWS = ([0], [3, 2, 1], [29, 31, 33], [5, 44, 44, 12], [88, 89], [47, 46, 45, 44, 43])


def _open_descriptors(path: Path) -> int:
    """This process's file descriptors open on ``path``."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return names.count(str(path))


@pytest.mark.parametrize(("codec", "gop"), [("h264", 30), ("h264", 4), ("av1", 30), ("hevc", 30), ("vp9", 30)])
def test_a_local_mp4_decodes_without_a_container(
    marker_video: MarkerVideo, codec: str, gop: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open container held FFmpeg's sample tables of the whole file (1.4 MB of a 30,000-frame MP4's ~1.9 MB per
    open file, ~300 MB per worker for a pool's 165 files). A local MP4's packets are now read from one file
    descriptor and decoded from them (H.264 and HEVC with B-frames): the frames of a full decode, and the file is
    never opened by FFmpeg."""
    path = marker_video(codec, gop)
    index = build_packet_index(path)
    want = reference_frames(path)
    others = _open_descriptors(path)  # (a shared fixture's file: other tests' decoders may hold it open)
    opened: list[object] = []
    plain_open = av.open
    monkeypatch.setattr(av, "open", lambda target, *a, **k: opened.append(target) or plain_open(target, *a, **k))
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    for window in WINDOWS:
        got = decoder.decode(path, index, window)
        np.testing.assert_array_equal(got, np.stack([want[int(p)] for p in index.pts_of_frames(window)]))
    assert [t for t in opened if isinstance(t, (str, os.PathLike))] == []  # (the stream template opens from memory)
    assert _open_descriptors(path) == others + 1
    decoder.close()
    assert _open_descriptors(path) == others


def test_open_files_are_bounded_and_closed_with_the_decoder(marker_video: MarkerVideo, tmp_path: Path) -> None:
    source = marker_video("h264", 30)
    index = build_packet_index(source)
    paths = [Path(shutil.copy(source, tmp_path / f"{i}.mp4")) for i in range(3)]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_open_decoders=2))
    for path in paths:
        decoder.decode(path, index, [5])
    assert [_open_descriptors(p) for p in paths] == [0, 1, 1]  # the least recently used one closed
    decoder.close()
    assert [_open_descriptors(p) for p in paths] == [0, 0, 0]


def test_a_file_changed_since_it_was_indexed_is_refused(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A file longer than its index says was opened and decoded by its container, whatever the index's byte ranges
    then addressed."""
    path = Path(shutil.copy(marker_video("h264", 30), tmp_path / "file-000.mp4"))
    index = build_packet_index(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    changed = r"file-000\.mp4: the file has \d+ bytes .* changed since it was indexed"
    with pytest.raises(VideoDecodeError, match=changed):
        decoder.decode(path, index, [5])
    assert decoder.open_decoders == 0 and _open_descriptors(path) == 0


def test_a_packet_read_short_names_the_file(marker_video: MarkerVideo, tmp_path: Path) -> None:
    path = Path(shutil.copy(marker_video("h264", 30), tmp_path / "file-000.mp4"))
    index = build_packet_index(path)
    reader = PacketFileReader(str(path), index, threads=1, label="file-000.mp4")
    convert = frame_conversion("rgb", None)
    assert len(reader.frames_at(index, np.array([80]), convert)) == 1
    os.truncate(path, index.file_size_bytes // 2)  # (truncated while open)
    with pytest.raises(VideoDecodeError, match=r"file-000\.mp4: read \d+ of \d+ bytes .* shorter than its index"):
        reader.frames_at(index, np.array([80]), convert)
    reader.close()
    reader.close()  # (twice: no error)
    assert _open_descriptors(path) == 0


class _CountingCodec:
    """A codec context that counts the packets fed to it (the drain, ``decode(None)``, aside)."""

    def __init__(self, codec: object) -> None:
        self.codec, self.fed = codec, 0

    def decode(self, packet: av.Packet | None) -> list[av.VideoFrame]:
        self.fed += packet is not None
        return self.codec.decode(packet)  # type: ignore[attr-defined,no-any-return]

    def flush_buffers(self) -> None:
        self.codec.flush_buffers()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("codec", "gop", "fed"), [("av1", 2, 7), ("h264", 4, 19)])
def test_frames_of_one_file_far_apart_decode_from_their_own_keyframes(
    marker_video: MarkerVideo, codec: str, gop: int, fed: int
) -> None:
    """A batch's frames of one file go to the reader together. Their runs were joined on the packets read ahead of
    each (16), so frames a few GOPs apart fused into one run, every packet between them decoded (45 packets for these 4
    frames of GOP-2 AV1, 50 of GOP-4 H.264 with B-frames); each run is now fed from its keyframe until its frames are
    out (AV1: 7, the frames' runs alone; H.264: 19, with the packets each needs to show its frames)."""
    path = marker_video(codec, gop)
    index = build_packet_index(path)
    want = reference_frames(path)
    reader = PacketFileReader(str(path), index, threads=1, label=str(path))
    counting = _CountingCodec(reader._decoder.codec)
    reader._decoder.codec = counting  # type: ignore[assignment]
    frames = np.array([5, 17, 30, 51])
    convert = frame_conversion("rgb", None)
    got = reader.frames_at(index, frames, convert)
    assert sorted(got) == sorted(index.pts_of_frames(frames).tolist())
    for pts, frame in got.items():
        np.testing.assert_array_equal(frame, want[pts])
    assert counting.fed == fed
    reader.close()


def _encode_scene_cut_open_gop(path: Path) -> None:
    """x264 open GOPs whose only keyframes are its scene cuts (frames 30 and 60): recovery-point I-frames, no IDR,
    that no picture displays before (no leading pictures, so a clip keeps one run per GOP)."""
    rng = np.random.default_rng(0)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.options = {"preset": "medium", "x264-params": "open-gop=1:bframes=3:keyint=250"}
        for i in range(90):
            if i % 10 == 0:
                scene = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(np.roll(scene, i, axis=1), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def test_runs_after_a_non_idr_keyframe_come_out_in_order(tmp_path: Path) -> None:
    """A run's keyframe that is no IDR did not reset the decoder: fed after the previous run's pictures, their
    held-back frames came out after the next run's and a healthy file was refused as misordered (505 of the 4,005
    frame pairs of this file): runs are now drained and reset between, as a file reader's decoder is at a seek."""
    path = tmp_path / "scene_cuts.mp4"
    _encode_scene_cut_open_gop(path)
    index = build_packet_index(path)
    assert not index.has_leading_pictures and index.keyframe_positions.tolist() == [0, 30, 60]  # else tests nothing
    requests = [[29, 89], [89, 29, 29], [5, 65], [12, 41, 72], [0, 30, 60], [28, 29, 58, 59, 88, 89]]
    reference = reference_frames(path)
    reader = PacketFileReader(str(path), index, threads=1, label="scene_cuts.mp4")
    for frames in requests:
        found = reader.frames_at(index, np.array(frames), lambda frame: frame.to_ndarray(format="rgb24"))
        assert sorted(found) == sorted({int(pts) for pts in index.pts_of_frames(frames)})
        for pts, image in found.items():
            np.testing.assert_array_equal(image, reference[pts])
    reader.close()


def test_a_file_cut_mid_gop_says_its_first_packet_is_no_keyframe(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A file whose first packet is no keyframe (stream-copied from mid-GOP) shows nothing before its first keyframe,
    and the error said the file flags a picture that is no random-access point as a keyframe (intra refresh), which it
    does not (286 of 900 random requests of three such files): it says the file starts mid-GOP. Frames from its first
    keyframe on are the file's."""
    path = _cut_mid_gop(marker_video("h264", 30), tmp_path / "cut.mp4")
    index = build_packet_index(path)
    reader = PacketFileReader(str(path), index, threads=1, label="cut.mp4")
    convert = frame_conversion("rgb", None)
    first_packet = rf"^{re.escape(str(path))}: {_FIRST_PACKET}"
    try:
        for frames in ([3], [20, 40]):
            with pytest.raises(VideoDecodeError, match=first_packet):
                reader.frames_at(index, np.array(frames), convert)
        later = index.display_rank[25] + np.array([0, 1, 7])
        found = reader.frames_at(index, later, convert)
        reference = reference_frames(path)
        for pts in index.pts_of_frames(later).tolist():
            np.testing.assert_array_equal(found[pts], reference[pts])
    finally:
        reader.close()


# (The message for _cut_mid_gop's file: its first packet, the marker video's 6th, is shown at 0.133 s.)
_FIRST_PACKET = r"the file's first packet \(pts 0\.133[0-9]* s\) is no keyframe .* the file starts mid-GOP"


def _cut_mid_gop(source: Path, path: Path) -> Path:
    """``source`` (a marker video) stream-copied from its 6th packet on, mid-GOP: keyframes at 0 (unflagged) and 25;
    ``path``'s suffix names the container."""
    muxer = {".mp4": "mp4", ".mkv": "matroska", ".webm": "webm"}[path.suffix]
    with av.open(str(source)) as given, av.open(str(path), "w", format=muxer) as output:
        stream = output.add_stream_from_template(template=given.streams.video[0], opaque=True)
        stream.time_base = given.streams.video[0].time_base
        for packet in [packet for packet in given.demux(given.streams.video[0]) if packet.size][5:]:
            packet.stream = stream
            output.mux(packet)
    index = build_packet_index(path)
    assert not index.keyframe[0] and index.keyframe_positions.tolist()[:2] == [0, 25]  # (else this tests nothing)
    return path


def test_a_file_cut_mid_gop_says_so_on_the_demuxing_routes(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """The routes that seek the file's demuxer (PyAvReader; a clip's packets of a file that is no byte-exact MP4)
    sought a keyframe at or before the first packet, found none (FFmpeg's EPERM) and said the file was corrupt or
    truncated (2 of 2 requests before the first keyframe): they decode from the first packet as the packet route does,
    and say the file starts mid-GOP. Frames from its first keyframe on are the file's."""
    path = _cut_mid_gop(marker_video("h264", 30), tmp_path / "cut.mp4")
    index = build_packet_index(path)
    demuxed = replace(index, byte_exact=False)  # (as a file in another container: its packets are demuxed)
    reference = reference_frames(path)
    later = index.display_rank[25] + np.array([0, 1, 7])
    reader = PyAvReader(str(path), filesystem=None, threads=1, label="cut.mp4")
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for frames in (np.array([3]), np.array([20, 40])):
            with pytest.raises(VideoDecodeError, match=f"^cut.mp4: {_FIRST_PACKET}"):
                reader.frames_at(index, plan_clip(index, frames), frames, lambda frame: frame.pts)
            plan = plan_clip(demuxed, frames)
            payloads = read_packet_payloads(path, demuxed, plan)
            with pytest.raises(VideoDecodeError, match=_FIRST_PACKET):
                decoder.decode_packets(demuxed, plan, payloads)
        found = reader.frames_at(index, plan_clip(index, later), later, lambda frame: frame.to_ndarray(format="rgb24"))
        plan = plan_clip(demuxed, later)
        got = decoder.decode_packets(demuxed, plan, read_packet_payloads(path, demuxed, plan))
        for i, pts in enumerate(index.pts_of_frames(later).tolist()):
            np.testing.assert_array_equal(found[pts], reference[pts])
            np.testing.assert_array_equal(got[i], reference[pts])
    finally:
        reader.close()
        decoder.close()


@pytest.mark.parametrize(
    ("codec", "name"), [("h264", "cut.mkv"), ("vp9", "cut.webm"), ("vp9", "cut.mp4"), ("av1", "cut.mp4")]
)
def test_a_file_cut_mid_gop_says_so_in_other_containers_and_codecs(
    marker_video: MarkerVideo, tmp_path: Path, codec: str, name: str
) -> None:
    """Matroska's seek lands on a keyframe its cues list whatever the flags, so the file's first packet (no keyframe)
    was never found, said as a file rewritten since it was indexed; VP9's and AV1's decoders refuse that packet, said
    as a corrupt or truncated file (random requests of 1-3 frames, two routes, one file each: 252 of 500 said so,
    every one touching a frame before the first keyframe). Each says the file starts mid-GOP, on both routes."""
    path = _cut_mid_gop(marker_video(codec, 30), tmp_path / name)
    index = build_packet_index(path)
    demuxed = replace(index, byte_exact=False)  # (the packet route of a file that is no byte-exact MP4)
    reader = PyAvReader(str(path), filesystem=None, threads=1, label=name)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    first_packet = r"the file's first packet \(pts [0-9.]+ s\) is no keyframe and .*: the file starts mid-GOP"
    try:
        for frames in (np.array([3]), np.array([20, 40])):
            with pytest.raises(VideoDecodeError, match=first_packet):
                reader.frames_at(index, plan_clip(index, frames), frames, lambda frame: frame.pts)
            plan = plan_clip(demuxed, frames)
            with pytest.raises(VideoDecodeError, match=first_packet):
                decoder.decode_packets(demuxed, plan, read_packet_payloads(path, demuxed, plan))
        later = index.display_rank[25] + np.array([0, 1, 7])  # (from the first keyframe on: the file's frames)
        found = reader.frames_at(index, plan_clip(index, later), later, lambda frame: frame.to_ndarray(format="rgb24"))
        plan = plan_clip(demuxed, later)
        got = decoder.decode_packets(demuxed, plan, read_packet_payloads(path, demuxed, plan))
        for i, pts in enumerate(index.pts_of_frames(later).tolist()):
            np.testing.assert_array_equal(got[i], found[pts])
    finally:
        reader.close()
        decoder.close()


class _ReadsThenTimesOut(io.RawIOBase):
    """A file object whose reads time out once ``failing`` is set (a network file whose retries are spent)."""

    def __init__(self, raw: bytes) -> None:
        self._file, self.failing = io.BytesIO(raw), False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        if self.failing:
            raise TimeoutError("read timed out")
        return self._file.readinto(buffer)


def test_a_read_that_times_out_in_a_file_cut_mid_gop_is_no_decoder_refusal(tmp_path: Path) -> None:
    """A remote file's read that fails for good (its retries spent) while PyAvReader demuxes from a mid-GOP file's
    first packet was said as that packet refused by the decoder, the file starting mid-GOP (2 of 2 requests): a
    network error, which another try may mend, was blamed on the file. It is said as a failed read, as before."""
    rng = np.random.default_rng(0)  # (noise: a file larger than the demuxer's first reads, which the open buffers)
    with av.open(str(tmp_path / "noise.mp4"), "w") as output:
        stream = output.add_stream("libx264", rate=30, options={"g": "30", "bf": "2", "x264-params": "scenecut=0"})
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for _ in range(60):
            output.mux(stream.encode(av.VideoFrame.from_ndarray(rng.integers(0, 256, (120, 160, 3), np.uint8))))
        output.mux(stream.encode())
    path = _cut_mid_gop(tmp_path / "noise.mp4", tmp_path / "cut.mp4")
    index = build_packet_index(path)
    handles: list[_ReadsThenTimesOut] = []

    class Filesystem:
        def open(self, name: str, mode: str) -> _ReadsThenTimesOut:
            handles.append(_ReadsThenTimesOut(path.read_bytes()))
            return handles[-1]

    for frames in (np.array([3]), np.array([20, 40])):
        reader = PyAvReader(str(path), filesystem=Filesystem(), threads=1, label="cut.mp4")
        handles[-1].failing = True
        try:
            with pytest.raises(VideoDecodeError) as info:
                reader.frames_at(index, plan_clip(index, frames), frames, lambda frame: frame.pts)
        finally:
            reader.close()
        assert isinstance(info.value.__cause__, TimeoutError)
        assert "mid-GOP" not in str(info.value) and "decoder refuses" not in str(info.value)
        assert "decoding failed (read timed out)" in str(info.value)
