"""Damaged H.264 data fails with VideoDecodeError naming the file, on the file and on the packet path.

FFmpeg's H.264 decoder conceals a damaged keyframe (grey or smeared blocks) and only flags it ``is_corrupt``;
the frames predicted from it come out wrong and unflagged. The CPU decoder must raise instead of returning them.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest

from lerobot_dali.clips import plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_file_reader import PacketFileReader
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from tests.video_fixtures import MarkerVideo, damage_av1_frame_size, reference_frames, remux

#: A damaged frame in the first GOP (GOP 30): the keyframe, a frame predicted from it, a window across both.
FIRST_GOP_REQUESTS = [[0], [5], [2, 0, 1]]


def _damage_keyframe(path: Path, index: PacketIndex, position: int) -> None:
    """XOR 6 bytes near the end of the keyframe's payload at decode ``position``: inside its slice data (x264's
    first packet starts with a long SEI text the decoder ignores, so its middle may be harmless). x264 does not
    always encode the same frames to the same bytes, and some 6 bytes damage nothing FFmpeg notices: the damage
    moves toward the payload's start until a full PyAV decode of the file flags a frame corrupt."""
    assert index.keyframe[position]
    clean = path.read_bytes()
    end = int(index.byte_offset[position] + index.size_bytes[position])
    for offset in range(end - 16, end - int(index.size_bytes[position]) // 2, -12):
        data = bytearray(clean)
        for i in range(offset, offset + 6):
            data[i] ^= 0x5A
        path.write_bytes(bytes(data))
        if _flags_corrupt(path):
            return
    raise AssertionError(f"no damage to the keyframe at decode position {position} of {path} was flagged")


def _flags_corrupt(path: Path) -> bool:
    """Whether FFmpeg flags any frame of the file corrupt, decoding it whole."""
    import av

    try:
        with av.open(str(path)) as container:
            return any(frame.is_corrupt for frame in container.decode(video=0))
    except av.error.FFmpegError:
        return True


@pytest.fixture
def damaged_h264(marker_video: MarkerVideo, tmp_path: Path) -> tuple[Path, Path, PacketIndex]:
    """(damaged copy, clean original, index) of the H.264 GOP-30 marker video, its first keyframe damaged."""
    clean = marker_video("h264", 30)
    path = tmp_path / "damaged.mp4"
    shutil.copyfile(clean, path)
    index = build_packet_index(path)
    _damage_keyframe(path, index, 0)
    return path, clean, index


@pytest.fixture
def pyav_decoder() -> Iterator[CpuFrameDecoder]:
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    yield decoder
    decoder.close()


def test_damaged_keyframe_raises_on_the_file_path(
    damaged_h264: tuple[Path, Path, PacketIndex], pyav_decoder: CpuFrameDecoder
) -> None:
    path, clean, index = damaged_h264
    for request in FIRST_GOP_REQUESTS:
        with pytest.raises(
            VideoDecodeError, match=r"damaged\.mp4: .*frame at pts 0\.000000 s as corrupt.*file is corrupt"
        ):
            pyav_decoder.decode(path, index, request)
        assert pyav_decoder.open_decoders == 0  # the failed decoder is closed, not kept
    # The next GOP does not depend on the damaged keyframe: it still decodes exactly.
    window = np.array([30, 45, 89])
    reference = reference_frames(clean, {int(p) for p in index.frame_pts[window]})
    for frame_index, frame in zip(window.tolist(), pyav_decoder.decode(path, index, window), strict=True):
        np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


def test_damaged_keyframe_raises_on_the_packet_path(
    damaged_h264: tuple[Path, Path, PacketIndex], pyav_decoder: CpuFrameDecoder
) -> None:
    path, clean, index = damaged_h264
    for request in FIRST_GOP_REQUESTS:
        plan = plan_clip(index, request)
        payloads = read_packet_payloads(path, index, plan)
        with pytest.raises(
            VideoDecodeError, match=r"damaged\.mp4: .*frame at pts 0\.000000 s as corrupt.*file is corrupt"
        ):
            pyav_decoder.decode_packets(index, plan, payloads)
        assert pyav_decoder.open_decoders == 0
    window = np.array([30, 45, 89])
    plan = plan_clip(index, window)
    frames = pyav_decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
    reference = reference_frames(clean, {int(p) for p in index.frame_pts[window]})
    for frame_index, frame in zip(window.tolist(), frames, strict=True):
        np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


def test_damaged_later_keyframe_names_its_time(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """The error gives the damaged frame's presentation time, also on the packet path, whose decoder sees
    display ranks in place of the file's timestamps."""
    path = tmp_path / "later.mp4"
    shutil.copyfile(marker_video("h264", 30), path)
    index = build_packet_index(path)
    _damage_keyframe(path, index, 30)  # frame 30 at 30 fps: 1 s
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(VideoDecodeError, match=r"later\.mp4: .*frame at pts 1\.000000 s as corrupt"):
        decoder.decode(path, index, [31])
    plan = plan_clip(index, [29, 31])
    with pytest.raises(VideoDecodeError, match=r"later\.mp4: .*frame at pts 1\.000000 s as corrupt"):
        decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
    decoder.close()


def test_damaged_dataset_fails_the_cpu_iterator(make_ds, copy_ds) -> None:
    """End to end: a batch that reads the damaged GOP fails naming the video file, not with grey frames."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=30, size=(64, 96), codec="h264", gop=10))
    video = next((root / "videos").rglob("*.mp4"))
    _damage_keyframe(video, build_packet_index(video), 0)
    it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, shuffle=False, episodes=[0])
    try:
        with pytest.raises(VideoDecodeError, match=rf"{video.name}: .*as corrupt"):
            next(iter(it))
    finally:
        it.close()


def _reordered(clean: Path, tmp_path: Path) -> Path:
    """``clean`` (the H.264 GOP-30 marker video) as ``reordered.mp4``, its composition offsets (ctts) rewritten so the
    P-frame decoded second is stamped display frame 1 and the two B-frames after it 2 and 3."""
    raw = bytearray(clean.read_bytes())
    at = raw.find(b"ctts") + 20  # (type, version and flags, entry count, sample 0's entry): samples 1 (P), 2-3 (B)
    assert struct.unpack_from(">IiIi", raw, at) == (1, 2048, 2, 512)
    struct.pack_into(">IiIi", raw, at, 1, 1024, 2, 1024)
    path = tmp_path / "reordered.mp4"
    path.write_bytes(bytes(raw))
    return path


def test_timestamps_against_the_decoders_order_raise(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Composition offsets (ctts) rewritten so the P-frame decoded second is stamped display frame 1 and the two
    B-frames after it 2 and 3: every timestamp still on the frame grid and no decoder error, so frame 1 would be
    display frame 3's picture. The decoder shows them in picture order, against the timestamps: that raises."""
    clean = marker_video("h264", 30)
    path = _reordered(clean, tmp_path)
    index = build_packet_index(path)
    np.testing.assert_array_equal(index.frame_pts, build_packet_index(clean).frame_pts)
    assert index.display_order[:4].tolist() == [0, 1, 2, 3]  # (clean: [0, 2, 3, 1])
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(
        VideoDecodeError,
        match=r"reordered\.mp4: the decoder shows frames in another order than their timestamps say \(pts 0\.033333 s "
        r"after 0\.100000 s\); the file's timestamps \(its composition offsets, ctts\) are damaged",
    ):
        decoder.decode(path, index, [1])
    plan = plan_clip(index, [1, 2])
    with pytest.raises(VideoDecodeError, match=r"reordered\.mp4: .*\(pts 0\.033333 s after 0\.066667 s\)"):
        decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
    np.testing.assert_array_equal(decoder.decode(path, index, [0])[0], reference_frames(clean, {0})[0])
    decoder.close()


def test_frames_of_another_size_than_the_stream_raise(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """AV1's sequence header (the first packet's first OBU) with its frame size set to 1x1: dav1d decodes the keyframe
    as a 1x1 frame (before FFmpeg 8.1.3, its whole GOP) and flags nothing. Such frames would be stacked with sound
    ones (ValueError from numpy in the worker), or, resized in the worker, handed out as flat frames."""
    clean = marker_video("av1", 30)
    path = tmp_path / "header.mp4"
    shutil.copyfile(clean, path)
    damage_av1_frame_size(path)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    said = r"header\.mp4: the decoder produced a 1x1 frame at pts 0\.000000 s in a 96x64 video: a damaged stream"
    for size in (None, (32, 48)):
        with pytest.raises(VideoDecodeError, match=said):
            decoder.decode(path, index, [0, 40], size=size)
    plan = plan_clip(index, [2])
    with pytest.raises(VideoDecodeError, match=said):
        decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
    pts = int(index.frame_pts[40])  # the second GOP's header is sound
    np.testing.assert_array_equal(decoder.decode(path, index, [40])[0], reference_frames(clean, {pts})[pts])
    decoder.close()


@pytest.mark.parametrize("frames", [[2, 3], [0, 2], [2, 2]])
def test_timestamps_against_the_decoders_order_raise_before_the_frames_between(
    marker_video: MarkerVideo, tmp_path: Path, frames: list[int]
) -> None:
    """The ctts damage above, frames 2 and 3 asked without 1: with 3 threads the packet decoder stopped once they
    were out, before the P-frame stamped 1 came out after them, and handed the pictures of 1 and 2 as 2 and 3 (4 of
    600 random requests): a run now goes on until every frame from its keyframe to its last wanted one is out."""
    path = _reordered(marker_video("h264", 30), tmp_path)
    index = build_packet_index(path)
    reader = PacketFileReader(str(path), index, threads=3, label="reordered.mp4")
    with pytest.raises(VideoDecodeError, match=r"reordered\.mp4: the decoder shows frames in another order"):
        reader.frames_at(index, np.array(frames), lambda frame: frame.to_ndarray(format="rgb24"))
    reader.close()


def test_damaged_keyframe_raises_on_the_container_path(
    damaged_h264: tuple[Path, Path, PacketIndex], pyav_decoder: CpuFrameDecoder, tmp_path: Path
) -> None:
    """A file without byte offsets (Matroska), like a remote one, is decoded from an open container (PyAvReader),
    which checks every frame as the packet path does (its check was reached by no test): the damaged keyframe's GOP
    raises naming the file and the frame's time, and the next GOP still decodes exactly."""
    path, clean, _ = damaged_h264
    mkv = remux(path, tmp_path / "damaged.mkv", "matroska")
    index = build_packet_index(mkv)
    assert not index.byte_exact
    for request in FIRST_GOP_REQUESTS:
        with pytest.raises(
            VideoDecodeError, match=r"damaged\.mkv: .*frame at pts 0\.000000 s as corrupt.*file is corrupt"
        ):
            pyav_decoder.decode(mkv, index, request)
        assert pyav_decoder.open_decoders == 0
    window = np.array([30, 45, 89])
    reference = reference_frames(remux(clean, tmp_path / "clean.mkv", "matroska"))
    for frame_index, frame in zip(window.tolist(), pyav_decoder.decode(mkv, index, window), strict=True):
        np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


def _in_memory(data: bytes, name: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """``data`` as file ``/v/{name}`` of fsspec's memory filesystem: a file that is not local, so decoded from an open
    container (PyAvReader)."""
    memory = fsspec.filesystem("memory")
    memory.pipe(f"/v/{name}", data)
    return memory, f"/v/{name}"


def test_timestamps_against_the_decoders_order_raise_on_the_container_path(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """The ctts damage above in a file that is not local (fsspec's memory filesystem here, as a remote one): it is
    decoded from an open container (PyAvReader), whose order check no test reached; it raises as the local reader
    does, and a frame before the damage decodes exactly."""
    clean = marker_video("h264", 30)
    path = _reordered(clean, tmp_path)
    memory, _ = _in_memory(path.read_bytes(), "reordered.mp4")
    index = build_packet_index("/v/reordered.mp4", filesystem=memory)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(
        VideoDecodeError,
        match=r"reordered\.mp4: the decoder shows frames in another order than their timestamps say \(pts 0\.033333 s "
        r"after 0\.100000 s\); the file's timestamps \(its composition offsets, ctts\) are damaged",
    ):
        decoder.decode("/v/reordered.mp4", index, [1], filesystem=memory)
    frame = decoder.decode("/v/reordered.mp4", index, [0], filesystem=memory)[0]
    np.testing.assert_array_equal(frame, reference_frames(clean, {0})[0])
    decoder.close()
    memory.rm("/v/reordered.mp4")


def test_an_av1_frame_zeroed_on_disk_raises_as_missing(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """An AV1 packet whose bytes are zeroed on disk: fed the packets up to it, dav1d takes it without an error and shows
    no frame for it, so the frame asked for never comes out (that error was raised by no test): the packet path says
    so, naming the file; the local file's reader, which feeds the packets after it too, fails on one of those. The
    next GOP still decodes exactly."""
    clean = marker_video("av1", 30)
    path = tmp_path / "zeroed.mp4"
    index = build_packet_index(clean)
    position = int(index.display_order[5])
    raw = bytearray(clean.read_bytes())
    start = int(index.byte_offset[position])
    raw[start : start + int(index.size_bytes[position])] = bytes(int(index.size_bytes[position]))
    path.write_bytes(bytes(raw))
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(VideoDecodeError, match=r"zeroed\.mp4: decoding failed \(.*Invalid data.*the file is corrupt"):
        decoder.decode(path, index, [5])  # (the packets read ahead of it reach the decoder: it refuses one of those)
    plan = plan_clip(index, [5])
    said = r"zeroed\.mp4: 1 of 1 requested frames did not come out of the decoder \(from 6 packets\); the file is"
    with pytest.raises(VideoDecodeError, match=said):
        decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
    pts = int(index.frame_pts[40])
    np.testing.assert_array_equal(decoder.decode(path, index, [40])[0], reference_frames(clean, {pts})[pts])
    decoder.close()


def _zeroed_in_memory(clean: Path, position: int, name: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """``clean`` with the packet at decode ``position`` zeroed, in fsspec's memory filesystem (:func:`_in_memory`)."""
    index = build_packet_index(clean)
    raw = bytearray(clean.read_bytes())
    start = int(index.byte_offset[position])
    raw[start : start + int(index.size_bytes[position])] = bytes(int(index.size_bytes[position]))
    return _in_memory(bytes(raw), name)


def test_an_av1_last_frame_zeroed_raises_as_missing_on_the_container_path(marker_video: MarkerVideo) -> None:
    """The file's last packet zeroed: dav1d takes it without an error and shows nothing, and no packet follows to
    fail, so the container reader's "no frame at pts" error is all that tells of it (no test reached it; without it
    the frame was silently absent). The frame before it decodes exactly."""
    clean = marker_video("av1", 30)
    memory, path = _zeroed_in_memory(clean, 89, "last_zeroed.mp4")
    index = build_packet_index(path, filesystem=memory)
    assert index.display_order[89] == 89  # (AV1 here has no reordering: the last packet shows last)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(
        VideoDecodeError,
        match=r"^/v/last_zeroed\.mp4: the decoder produced no frame at pts 2\.966667 s \(1 requested frames missing\); "
        r"the file is corrupt or truncated",
    ):
        decoder.decode(path, index, [88, 89], filesystem=memory)
    pts = int(index.frame_pts[88])
    np.testing.assert_array_equal(
        decoder.decode(path, index, [88], filesystem=memory)[0], reference_frames(clean, {pts})[pts]
    )
    decoder.close()
    memory.rm(path)


def test_a_flagged_keyframe_the_decoder_refuses_is_a_corrupt_file_not_a_mid_gop_cut(marker_video: MarkerVideo) -> None:
    """The second GOP's keyframe zeroed on a container route: dav1d shows nothing for it and refuses the next packet.
    A flagged keyframe refused is damage ("decoding failed"); only the file's unflagged first packet may be said to
    start the file mid-GOP, which would send a user to cut frames of a file that needs downloading again. The GOP
    before decodes exactly."""
    clean = marker_video("av1", 30)
    memory, path = _zeroed_in_memory(clean, 30, "key_zeroed.mp4")
    index = build_packet_index(path, filesystem=memory)
    assert index.keyframe[30]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(VideoDecodeError, match=r"^/v/key_zeroed\.mp4: decoding failed \(.*Invalid data") as raised:
        decoder.decode(path, index, [31], filesystem=memory)
    assert "mid-GOP" not in str(raised.value)
    pts = int(index.frame_pts[29])
    np.testing.assert_array_equal(
        decoder.decode(path, index, [29], filesystem=memory)[0], reference_frames(clean, {pts})[pts]
    )
    decoder.close()
    memory.rm(path)


class _TwiceShownPacket:
    """A demuxed packet whose decoding shows each of its frames twice, as a decoder misshowing a damaged stream may."""

    def __init__(self, packet: object) -> None:
        self.packet = packet
        self.pts, self.is_discard = packet.pts, packet.is_discard  # type: ignore[attr-defined]

    def decode(self) -> list[object]:
        return [shown for frame in self.packet.decode() for shown in (frame, frame)]  # type: ignore[attr-defined]


def test_a_frame_shown_twice_is_refused_on_the_container_path(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packet index refuses files whose packets share a pts, so a frame shown twice on the container route is the
    decoder misshowing the stream: refused as out of order (equal pts counts), not handed over as a second frame."""
    import lerobot_dali.pyav_reader as pyav_reader

    demuxed = pyav_reader.packets_from_keyframe
    monkeypatch.setattr(
        pyav_reader, "packets_from_keyframe", lambda *args: (_TwiceShownPacket(p) for p in demuxed(*args))
    )
    clean = marker_video("h264", 30)
    memory, _ = _in_memory(clean.read_bytes(), "twice.mp4")
    index = build_packet_index("/v/twice.mp4", filesystem=memory)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    with pytest.raises(
        VideoDecodeError,
        match=r"^/v/twice\.mp4: the decoder shows frames in another order .*\(pts 1\.000000 s after 1\.000000 s\)",
    ):
        decoder.decode("/v/twice.mp4", index, [31], filesystem=memory)
    decoder.close()
    memory.rm("/v/twice.mp4")
