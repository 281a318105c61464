"""x264's intra refresh flags the P-frame starting each refresh cycle a sync sample: the packet index keeps only real
random-access points as keyframes, so every route starts decoding at one and reads the file's own frames."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

import lerobot_dali.packet_index as packet_index
from lerobot_dali.clips import build_clip, plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.random_access import NalLayout, is_random_access, nal_layout, resets_decoder
from tests.test_clips import _decode_clip, _encode_open_gop
from tests.test_packet_file_reader import _encode_scene_cut_open_gop
from tests.test_packet_index_remote import CountingReader, demux_index, index_source  # noqa: F401 (a fixture)
from tests.video_fixtures import MarkerVideo, encode_intra_refresh, flagged_keyframes, nal_packet, reference_frames


@pytest.fixture(scope="module")
def intra_refresh_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """90 frames at 96x64, a refresh cycle every 20: flagged keyframes at 0 (an IDR), 20, 40, 60 and 80 (P-frames)."""
    frames = [draw_marker(i // 30, i % 30, 64, 96) for i in range(90)]
    path = encode_intra_refresh(tmp_path_factory.mktemp("intra_refresh") / "intra_refresh.mp4", frames)
    assert flagged_keyframes(path) == [0, 20, 40, 60, 80]  # else this file tests nothing
    return path


class CountingCalls(CountingReader):
    """A local file that counts its reads (each a request on a remote file)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls = 0

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self.calls += 1
        return super().readinto(buffer)


def _reads(path: Path) -> tuple[int, int]:
    with CountingCalls(path) as reader:
        build_packet_index(reader)
        return reader.calls, reader.bytes_read


def test_only_real_random_access_points_are_keyframes(
    intra_refresh_video: Path,
    monkeypatch: pytest.MonkeyPatch,
    index_source: str,  # noqa: F811
) -> None:
    index = build_packet_index(intra_refresh_video)
    assert index.keyframe_positions.tolist() == [0]
    assert np.flatnonzero(index.keyframe).tolist() == [0]
    assert np.flatnonzero(demux_index(intra_refresh_video, monkeypatch).keyframe).tolist() == [0]


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_open_gop_keyframes_stay(tmp_path: Path, codec: str, index_source: str) -> None:  # noqa: F811
    path = tmp_path / "open_gop.mp4"
    _encode_open_gop(path, codec)
    index = build_packet_index(path)
    assert index.has_leading_pictures
    keys = flagged_keyframes(path)
    assert len(keys) == 9  # (one every 10 frames)
    assert np.flatnonzero(index.keyframe).tolist() == keys


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_closed_gop_keyframes_stay(marker_video: MarkerVideo, codec: str) -> None:
    path = marker_video(codec, 4)
    keys = flagged_keyframes(path)
    assert len(keys) > 10
    assert np.flatnonzero(build_packet_index(path).keyframe).tolist() == keys


def test_every_frame_through_clips_and_the_cpu_decoder_is_the_files(intra_refresh_video: Path) -> None:
    index = build_packet_index(intra_refresh_video)
    reference = reference_frames(intra_refresh_video)
    want = [reference[int(pts)] for pts in index.frame_pts]
    windows = [np.array([f]) for f in range(index.frame_count)]
    windows += [np.array(w) for w in ([1, 21], [1, 45], [1, 84], [19, 20, 21], [85, 3, 60])]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for window in windows:
            clip = build_clip(intra_refresh_video, index, window)
            frames = _decode_clip(clip.data)
            assert len(frames) == clip.frame_count, f"clip {window}: {len(frames)} of {clip.frame_count} frames shown"
            for frame, relative in zip(window.tolist(), clip.relative_indices.tolist(), strict=True):
                np.testing.assert_array_equal(frames[relative], want[frame], err_msg=f"clip {window}, frame {frame}")
            expected = np.stack([want[f] for f in window.tolist()])
            np.testing.assert_array_equal(decoder.decode(intra_refresh_video, index, window), expected)
            plan = plan_clip(index, window)
            payloads = read_packet_payloads(intra_refresh_video, index, plan)
            np.testing.assert_array_equal(decoder.decode_packets(index, plan, payloads), expected)
    finally:
        decoder.close()


def test_the_iterator_reads_the_files_frames(make_ds, copy_ds) -> None:
    lengths = [35, 25]
    root = copy_ds(
        make_ds(episodes=2, frames_per_episode=lengths, cameras=1, codec="h264", fps=10, episodes_per_file=2, gop=4)
    )
    path = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    frames = [frame for _, frame in sorted(reference_frames(path).items())]
    encode_intra_refresh(path, frames, fps=10, keyint=10)
    assert len(flagged_keyframes(path)) == 6  # else this dataset tests nothing
    want = [frame for _, frame in sorted(reference_frames(path).items())]
    it = DALILeRobotIterator(
        root, batch_size=8, shuffle=True, seed=1, device="cpu", num_workers=0, drop_last=False, return_uint8=True
    )
    seen = 0
    for batch in it:
        for i in range(len(batch["index"])):
            row = sum(lengths[: int(batch["episode_index"][i])]) + int(batch["frame_index"][i])
            got = batch["observation.images.cam0"][i].permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(got, want[row], err_msg=f"row {row}")
            seen += 1
    assert seen == sum(lengths)


def test_a_normal_file_costs_one_read_more(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second keyframe's first bytes tell a file without intra refresh: one small read."""
    path = marker_video("h264", 4)
    calls, bytes_read = _reads(path)
    with monkeypatch.context() as patch:
        patch.setattr(packet_index, "nal_layout", lambda codec, extradata: None)
        unchecked_calls, unchecked_bytes = _reads(path)
    assert calls - unchecked_calls == 1
    assert 0 < bytes_read - unchecked_bytes <= 128


def test_an_intra_refresh_file_costs_a_read_per_keyframe(
    intra_refresh_video: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, _ = _reads(intra_refresh_video)
    with monkeypatch.context() as patch:
        patch.setattr(packet_index, "nal_layout", lambda codec, extradata: None)
        unchecked_calls, _ = _reads(intra_refresh_video)
    assert calls - unchecked_calls == 4  # (keyframe 0 is among the packets read already)


#: x264's recovery point SEI of an open-GOP keyframe: recovery_frame_cnt 0, exact_match_flag 1.
_RECOVERY = b"\x06\x06\x01\xc4\x80"


@pytest.mark.parametrize(
    ("units", "expected"),
    [
        ((b"\x06\x05\x01\x80", b"\x65\x88"), True),  # SEI, then an IDR slice
        ((b"\x41\xc0",), False),  # first_mb_in_slice 0 (1), slice_type 0 (1): P
        ((b"\x41\x98",), False),  # slice_type 5 (00110): P, as every slice of the picture
        ((_RECOVERY, b"\x41\xb8"), True),  # a recovery point, then slice_type 2 (011): I
        ((_RECOVERY, b"\x41\x88"), True),  # slice_type 7 (0001000): I
        ((b"\x41\xb8",), False),  # an I slice that no IDR or recovery point makes a random-access point
        ((b"\x06\x06\x01\x51\x80", b"\x41\xb8"), False),  # a recovery point 1 frame on (recovery_frame_cnt 1)
        ((b"\x06\x05\x03\x00\x00\x03\x01\x06\x01\xc4\x80", b"\x41\xb8"), True),  # user data, then a recovery point
        ((_RECOVERY, b"\x41\x00\x00\x03\x01\xff\xff\xfe\xc0"), True),  # first_mb_in_slice 2^24 - 2 (emulation byte)
        ((b"\x41\x00\x00\x03\x01\x9e",), None),  # the bits end within first_mb_in_slice
        ((b"\x09\x10", _RECOVERY, b"\x41\xb8"), True),  # an access unit delimiter, a recovery point, an I slice
        ((b"\x06\x05",), None),  # no slice at all
    ],
)
def test_h264_slices_are_read_from_their_header(units: tuple[bytes, ...], expected: bool | None) -> None:
    data = nal_packet(*units)
    reads: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return data[offset : offset + length]

    assert is_random_access(NalLayout("h264", 4), read, len(data)) is expected
    assert len(reads) == 1


def test_a_large_unit_before_the_slice_costs_one_read_more() -> None:
    data = nal_packet(b"\x06" + bytes(700), b"\x41\xc0")
    reads: list[int] = []

    def read(offset: int, length: int) -> bytes:
        reads.append(offset)
        return data[offset : offset + length]

    assert is_random_access(NalLayout("h264", 4), read, len(data)) is False
    assert reads == [0, 4 + 701]


def test_a_flagged_keyframe_that_cannot_be_judged_keeps_its_flag() -> None:
    """The index drops a flagged keyframe that is judged no random-access point, and keeps one whose bytes say nothing
    (no slice read: its offset not exact and no head kept). Made up: four 7-byte packets, flagged 0, 2 and 3; the demux
    kept heads of 0 (an IDR) and 2 (a P slice), none of 3."""
    idr, p_slice = nal_packet(b"\x65\x88\x80"), nal_packet(b"\x41\xc0\x00")
    table = np.array([[k, k, 7 * k, 7, k != 1, 0] for k in range(4)])  # (pts, dts, offset, size, keyframe, hidden)
    keyframe = table[:, 4].astype(bool)
    kept = packet_index._random_access_keyframes(
        keyframe, table, NalLayout("h264", 4), {0: idr, 2: p_slice}, None, label="v.mp4"
    )
    assert kept.tolist() == [True, False, False, True] and keyframe.tolist() == [True, False, True, True]


def test_hevc_irap_and_stream_layouts() -> None:
    def verdict(unit_type: int) -> bool | None:
        data = nal_packet(bytes([unit_type << 1, 1, 0xAF]))
        return is_random_access(NalLayout("hevc", 4), lambda o, n: data[o : o + n], len(data))

    assert [t for t in range(32) if verdict(t)] == list(range(16, 22))
    assert verdict(39) is None  # (a SEI only)
    assert nal_layout("h264", bytes([1, 0x64, 0, 0x0A, 0xFF, 0xE1])) is None  # (too short for avcC)
    assert nal_layout("h264", bytes([1, 0x64, 0, 0x0A, 0xFD, 0xE1, 0])) == NalLayout("h264", 2)
    assert nal_layout("h264", b"\x00\x00\x00\x01\x67") is None  # (Annex B)
    assert nal_layout("av1", bytes([1] * 30)) is None


def test_only_idr_and_bla_pictures_start_a_decoder_afresh() -> None:
    """A clip joins its runs at a keyframe unless it starts a new coded video sequence: an H.264 IDR (after SEI or
    a delimiter), an HEVC IDR or BLA; not an I picture at a recovery point, an HEVC CRA, a P slice or an unparsed
    packet."""
    h264 = NalLayout("h264", 4)
    assert resets_decoder(h264, nal_packet(b"\x06\x05\x01\x80", b"\x65\x88"))
    assert resets_decoder(h264, nal_packet(b"\x09\x10", b"\x65\x88"))
    assert not resets_decoder(h264, nal_packet(_RECOVERY, b"\x41\xb8"))  # (a random-access point all the same)
    assert not resets_decoder(h264, nal_packet(b"\x41\xc0"))
    assert not resets_decoder(h264, nal_packet(b"\x06\x05"))  # (no slice)
    assert not resets_decoder(h264, b"\x00\x00\x00\x01\x65")  # (a unit too short to hold a header)
    assert not resets_decoder(NalLayout("h264", 2), nal_packet(b"\x65\x88"))  # (read with another prefix: no IDR)

    def hevc(unit_type: int) -> bool:
        units = bytes([39 << 1, 1, 0xAF]), bytes([unit_type << 1, 1, 0xAF])
        return resets_decoder(NalLayout("hevc", 4), nal_packet(*units))

    assert [t for t in range(32) if hevc(t)] == list(range(16, 21))


def test_a_scene_cut_idr_second_does_not_hide_the_flagged_p_frames(tmp_path: Path) -> None:
    """x264's intra refresh starts an IDR at a scene cut. Where that IDR was the second flagged keyframe, the
    sample judged (the first two) passed and every flag stood: flagged [0, 5 (scene cut), 25, 45 (P-frames)] were
    all kept, and the CPU decoder refused the file at frame 25 ("the keyframe at pts 1.0 s is not shown when decoding
    starts there"). A local file has every keyframe judged: only the IDRs stay, and every frame is the file's."""
    noise = np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    frames = [np.zeros_like(noise) if i < 5 else np.roll(noise, i, axis=1) for i in range(60)]
    path = encode_intra_refresh(tmp_path / "scene_cut.mp4", frames)
    assert flagged_keyframes(path) == [0, 5, 25, 45]  # (else this file tests nothing)
    index = build_packet_index(path)
    assert np.flatnonzero(index.keyframe).tolist() == [0, 5]
    reference = reference_frames(path)
    want = np.stack([reference[int(pts)] for pts in index.frame_pts])
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for frame in (24, 25, 30, 45, 59):
            np.testing.assert_array_equal(decoder.decode(path, index, np.array([frame]))[0], want[frame])
    finally:
        decoder.close()


def _without_sei(source: Path, out: Path) -> Path:
    """``source``'s H.264 packets stream-copied into the MP4 ``out`` without their SEI units: its open-GOP I-frames
    keep their sync-sample flags, no longer the recovery points that make them random-access points."""
    with av.open(str(source)) as given, av.open(str(out), "w", format="mp4") as output:
        stream = output.add_stream_from_template(template=given.streams.video[0], opaque=True)
        stream.time_base = given.streams.video[0].time_base
        for packet in given.demux(given.streams.video[0]):
            if packet.size == 0:
                continue
            data, units = bytes(packet), []
            while data:
                size = 4 + int.from_bytes(data[:4], "big")
                if data[4] & 0x1F != 6:
                    units.append(data[:size])
                data = data[size:]
            copy = av.Packet(b"".join(units))
            copy.pts, copy.dts, copy.time_base = packet.pts, packet.dts, packet.time_base
            copy.is_keyframe, copy.stream = packet.is_keyframe, stream
            output.mux(copy)
    return out


def test_an_i_frame_without_a_recovery_point_is_no_keyframe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync sample that is a non-IDR I-frame without a recovery point SEI: FFmpeg's decoder, reset there, withholds
    the frames it cannot prove recovered (2 of the next 3 here), so the CPU decoder refused a sound file as corrupt (132
    of 1,200 random requests of such a file): only IDRs and recovery points are keyframes now, and every frame is the
    file's."""
    open_gop = tmp_path / "scene_cuts.mp4"
    _encode_scene_cut_open_gop(open_gop)
    path = _without_sei(open_gop, tmp_path / "no_sei.mp4")
    with monkeypatch.context() as patch:
        patch.setattr(packet_index, "nal_layout", lambda codec, extradata: None)
        assert build_packet_index(path).keyframe_positions.tolist() == [0, 30, 60]  # (flagged: else tests nothing)
    index = build_packet_index(path)
    reference = reference_frames(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for frames in ([31], [32, 33], [61, 62, 89], [29, 30, 31]):
            want = [reference[int(pts)] for pts in index.pts_of_frames(frames)]
            np.testing.assert_array_equal(decoder.decode(path, index, np.array(frames)), np.stack(want))
    finally:
        decoder.close()
    assert index.keyframe_positions.tolist() == [0]
    assert build_packet_index(open_gop).keyframe_positions.tolist() == [0, 30, 60]  # (with their recovery points)
