"""CPU fallback decoder against an independent full sequential PyAV decode, plus fork safety and errors."""

from __future__ import annotations

import io
import multiprocessing
import pickle
import shutil
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import av
import fsspec
import numpy as np
import pytest

from lerobot_dali.clips import plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import (
    CpuDecodeOptions,
    CpuDecoderBackend,
    CpuFrameDecoder,
    pyav_can_decode,
    torchcodec_available,
)
from lerobot_dali.decode_route import DecodeRoute
from lerobot_dali.errors import CodecUnsupportedError, FrameRequestError, MissingDataFileError, VideoDecodeError
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.packet_decoder import PacketDecoder
from lerobot_dali.packet_file_reader import PacketFileReader
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.yuv_frames import frame_planes
from tests.conftest import shared_dataset
from tests.video_fixtures import (
    EPISODE_LENGTHS,
    MarkerVideo,
    count_decodes,
    cr5_episodes,
    cr5_video,
    r1_video,
    reference_frames,
)


def _check(decoder: CpuFrameDecoder, path: Path, windows: list[np.ndarray], **kwargs: object) -> None:
    index = build_packet_index(path)
    reference = reference_frames(path, {int(p) for w in windows for p in index.frame_pts[w]})
    for window in windows:
        frames = decoder.decode(path, index, window, **kwargs)
        assert frames.shape == (len(window), index.height, index.width, 3)
        assert frames.dtype == np.uint8
        for frame_index, frame in zip(window.tolist(), frames, strict=True):
            np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


def _random_windows(frame_count: int, seed: int, count: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    windows = [np.array([0, 1, 2]), np.array([frame_count - 1, frame_count - 2]), np.array([29, 30, 54, 55, 29])]
    for _ in range(count):
        anchor = int(rng.integers(frame_count))
        windows.append(np.clip(anchor + rng.choice([-7, -3, -1, 0, 2, 9], size=4), 0, frame_count - 1))
    return windows


@pytest.fixture
def pyav_decoder() -> Iterator[CpuFrameDecoder]:
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    yield decoder
    decoder.close()


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [2, 30])
def test_generated_windows_match_full_decode(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, codec: str, gop: int
) -> None:
    _check(pyav_decoder, marker_video(codec, gop), _random_windows(sum(EPISODE_LENGTHS), seed=gop))


def test_threads_and_fsspec(marker_video: MarkerVideo) -> None:
    path = marker_video("h264", 30)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, threads_per_decoder=2))
    index = build_packet_index(path)
    memory = fsspec.filesystem("memory")
    memory.pipe("/v/h264.mp4", path.read_bytes())
    window = np.array([88, 3, 45, 45, 0])
    expected = decoder.decode(path, index, window)
    np.testing.assert_array_equal(decoder.decode("/v/h264.mp4", index, window, filesystem=memory), expected)
    with open(path, "rb") as handle:
        np.testing.assert_array_equal(decoder.decode(handle, index, window), expected)
    _check(decoder, path, [window])
    decoder.close()


def test_real_r1_h264_with_b_frames(pyav_decoder: CpuFrameDecoder) -> None:
    path = r1_video()
    windows = [np.arange(0, 3), np.arange(1972, 1975), np.array([999, 1000, 1001, 1500]), np.array([1974, 0])]
    _check(pyav_decoder, path, windows)


def test_gr00t_long_gop_b_frames_seek_to_the_keyframe_itself(pyav_decoder: CpuFrameDecoder) -> None:
    """gr00t's H.264 has B-frames and a 250-frame GOP. Seeking to a keyframe's decode time (earlier than its
    presentation time) landed on the previous keyframe, so every frame of the second GOP decoded 250 extra
    frames; the reader must start at the very keyframe, and the frames must still equal a full decode."""
    import av

    from lerobot_dali.clips import packets_from_keyframe

    path = shared_dataset("gr00t_v20_h264") / "videos/chunk-000/observation.images.ego_view/episode_000000.mp4"
    index = build_packet_index(path)
    keyframes = np.flatnonzero(index.keyframe).tolist()
    assert keyframes == [0, 250] and index.dts[250] < index.pts[250]  # the case the old seek got wrong
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for start in keyframes:
            first = next(packets_from_keyframe(container, stream, index, start))
            assert first.is_keyframe and first.dts == index.dts[start], start
        # a seek that overshoots (lands past the keyframe) falls back to the file's start, then skips forward
        seeks: list[int] = []

        def overshooting_seek(target: int, **kwargs: object) -> None:
            seeks.append(target)
            container.seek(int(index.pts.max()) if len(seeks) == 1 else target, **kwargs)  # lands on keyframe 250

        overshooting = SimpleNamespace(demux=container.demux, seek=overshooting_seek)
        first = next(packets_from_keyframe(overshooting, stream, index, 0))
        assert first.is_keyframe and first.dts == index.dts[0] and len(seeks) == 2
        with pytest.raises(VideoDecodeError, match=r"no packet at the keyframe's decode time"):
            next(packets_from_keyframe(container, stream, replace(index, dts=index.dts + 1), 250))
    _check(pyav_decoder, path, [np.array([249, 250, 251]), np.array([260, 300, 415]), np.array([5, 400])])


def test_real_cr5_av1_across_files_and_episodes(pyav_decoder: CpuFrameDecoder) -> None:
    episodes = cr5_episodes()
    files = np.asarray(episodes["videos/observation.images.top/file_index"])
    lengths = np.asarray(episodes["length"])
    for file_index in range(3):
        path = cr5_video(file_index)
        ends = np.cumsum(lengths[files == file_index])
        boundaries = [np.array([end - 2, end - 1, end, end + 1]) for end in ends[:-1]]
        _check(pyav_decoder, path, [np.array([0, 1]), np.array([ends[-1] - 1]), *boundaries])


def _check_packets(path: Path, windows: list[np.ndarray], *, size: tuple[int, int] | None = None) -> None:
    """The remote route: packets read by byte range and decoded without a container, by one kept decoder."""
    index = build_packet_index(path)
    assert index.byte_exact
    reference = reference_frames(path, {int(p) for w in windows for p in index.frame_pts[w]})
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    for window in windows:
        plan = plan_clip(index, window)
        frames = decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan), size=size)
        assert decoder.open_decoders == 1
        assert frames.shape == (len(window), *(size or (index.height, index.width)), 3)
        if size is None:
            for frame_index, frame in zip(window.tolist(), frames, strict=True):
                np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [2, 30])
def test_packet_decode_matches_full_decode(marker_video: MarkerVideo, codec: str, gop: int) -> None:
    _check_packets(marker_video(codec, gop), _random_windows(sum(EPISODE_LENGTHS), seed=gop + 1))


def test_packet_decode_of_real_videos() -> None:
    _check_packets(r1_video(), [np.array([0, 1, 2]), np.array([1974, 0]), np.array([999, 1000, 1001, 1500])])
    episodes = cr5_episodes()
    files = np.asarray(episodes["videos/observation.images.top/file_index"])
    ends = np.cumsum(np.asarray(episodes["length"])[files == 0])
    _check_packets(cr5_video(0), [np.array([end - 1, end]) for end in ends[:-1]])


def test_packet_decode_resizes_like_the_open_decoder(marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder) -> None:
    path = marker_video("av1", 30)
    index = build_packet_index(path)
    window = np.array([5, 44, 44, 61])
    plan = plan_clip(index, window)
    got = pyav_decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan), size=(32, 40))
    np.testing.assert_array_equal(got, pyav_decoder.decode(path, index, window, size=(32, 40)))


def test_packet_decode_bad_input_names_the_file(marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder) -> None:
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [40])
    payloads = read_packet_payloads(path, index, plan)
    with pytest.raises(ValueError, match="payloads"):
        pyav_decoder.decode_packets(index, plan, payloads[:-1])
    good = pyav_decoder.decode_packets(index, plan, payloads)
    garbage = [b"\xff" * len(p) for p in payloads]
    with pytest.raises(VideoDecodeError, match=index.source_name):
        pyav_decoder.decode_packets(index, plan, garbage)
    assert pyav_decoder.open_decoders == 0  # the failed decoder is closed, not kept
    np.testing.assert_array_equal(pyav_decoder.decode_packets(index, plan, payloads), good)
    with pytest.raises(CodecUnsupportedError, match=index.source_name):
        pyav_decoder.decode_packets(replace(index, codec="evc", template=b"other"), plan, payloads)


def test_pixels_and_size_are_checked_before_any_file_opens(pyav_decoder: CpuFrameDecoder) -> None:
    """A bad ``pixels`` or a size given to frames that are never resized fails at once, not in the decoder."""
    missing = "/no/such/file.mp4"
    with pytest.raises(ValueError, match="pixels must be 'rgb', 'planes' or 'depth', got 'yuv'"):
        pyav_decoder.decode(missing, None, [0], pixels="yuv")  # type: ignore[arg-type]
    for pixels in ("planes", "depth"):
        with pytest.raises(ValueError, match=f"size resizes RGB frames only; pixels='{pixels}'"):
            pyav_decoder.decode(missing, None, [0], size=(32, 40), pixels=pixels)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size must be a pair"):
        pyav_decoder.decode_packets(None, None, [], size=(0, 40))  # type: ignore[arg-type]
    assert pyav_decoder.open_decoders == 0


def test_decoder_lru_is_bounded(marker_video: MarkerVideo) -> None:
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_open_decoders=2))
    for path in (marker_video("vp9", 2), marker_video("vp9", 30), marker_video("h264", 2)):
        decoder.decode(path, build_packet_index(path), [5])
    assert decoder.open_decoders == 2
    decoder.close()
    assert decoder.open_decoders == 0


def test_the_least_recently_used_decoder_is_closed_first(marker_video: MarkerVideo, monkeypatch) -> None:
    """A decoder used again moves to the back of the LRU: with room for two, ``A B A C A`` closes B for C and keeps A,
    so A opens once (closing the first opened would reopen a hot file every other request). The same for the remote
    route's decoders, kept per file's template."""
    opened: list[str] = []
    plain_file, plain_packets = PacketFileReader.__init__, PacketDecoder.__init__

    def counted_file(self, path, index, **kwargs):
        opened.append(str(path))
        plain_file(self, path, index, **kwargs)

    def counted_packets(self, index, **kwargs):
        opened.append(index.codec)
        plain_packets(self, index, **kwargs)

    monkeypatch.setattr(PacketFileReader, "__init__", counted_file)
    paths = {name: marker_video(codec, 30) for name, codec in (("A", "h264"), ("B", "hevc"), ("C", "av1"))}
    indexes = {name: build_packet_index(path) for name, path in paths.items()}
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_open_decoders=2))
    for name in "ABACA":
        got = decoder.decode(paths[name], indexes[name], [40])
        np.testing.assert_array_equal(got[0], reference_frames(paths[name])[int(indexes[name].frame_pts[40])])
    assert opened == [str(paths[name]) for name in "ABC"]
    decoder.close()
    opened.clear()
    monkeypatch.setattr(PacketDecoder, "__init__", counted_packets)  # (a file's reader makes one too)
    for name in "ABACA":
        plan = plan_clip(indexes[name], [40])
        decoder.decode_packets(indexes[name], plan, read_packet_payloads(paths[name], indexes[name], plan))
    assert opened == ["h264", "hevc", "av1"]
    decoder.close()


def test_open_decoders_are_bounded_by_their_estimated_memory(
    marker_video: MarkerVideo, tmp_path, caplog, monkeypatch
) -> None:
    """64 open files by default, while their decoders fit max_decoder_memory_bytes; never fewer than 8. A budget
    below the files in use (a worker's pool) is said once, with the budget that would hold them."""
    import logging

    from lerobot_dali import open_files
    from lerobot_dali.cpu_decode_options import (
        DECODER_FRAMES,
        DECODER_MEMORY_BYTES,
        DECODER_MIN_BYTES,
        DEMUXER_BYTES_PER_PACKET,
        decoder_bytes,
    )

    # Frames per thread, each thread's own; never under a decoder's own ~1 MB (64x96 frames: 0.1 MB for 12).
    assert decoder_bytes(640, 480, 1) == DECODER_FRAMES * 640 * 480 * 3 // 2
    assert decoder_bytes(640, 480, 2) == 2 * decoder_bytes(640, 480, 1)
    assert decoder_bytes(96, 64, 1) == decoder_bytes(96, 64, 4) == DECODER_MIN_BYTES == 2**20
    source = marker_video("vp9", 2)
    paths = [shutil.copy(source, tmp_path / f"{i}.mp4") for i in range(12)]
    index = build_packet_index(source)
    per_decoder = decoder_bytes(index.width, index.height, 1)  # (a local MP4 is read by byte range: no tables)
    for budget, threads, kept in ((100 * per_decoder, 1, 12), (10 * per_decoder, 1, 10), (per_decoder, 1, 8),
                                  (10 * per_decoder, 2, 10), (5 * per_decoder, 2, 8)):  # fmt: skip
        options = CpuDecodeOptions(
            backend=CpuDecoderBackend.PYAV, threads_per_decoder=threads, max_decoder_memory_bytes=budget
        )
        decoder = CpuFrameDecoder(options=options)
        for path in paths:
            decoder.decode(path, index, [5])
        assert decoder.open_decoders == kept, (budget, threads)  # each thread holds frames of its own
        decoder.close()
    assert CpuDecodeOptions().max_open_decoders is None
    assert CpuDecodeOptions().max_decoder_memory_bytes == DECODER_MEMORY_BYTES == 256 * 2**20
    # A pool of 12 files and a budget for 10: said once, naming the budget that holds all 12.
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=10 * per_decoder)
    decoder = CpuFrameDecoder(options=options, files_in_use=12)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        for path in paths * 2:
            decoder.decode(path, index, [5])
    assert decoder.open_decoders == 10
    [said] = [r.getMessage() for r in caplog.records if "files are in use" in r.getMessage()]
    # (each at the 1 MiB floor: the marker video's frames are small)
    assert "up to 12 files are in use (episode pool x cameras) but 10 open decoders of ~1.0 MB fit" in said
    assert f"max_decoder_memory_bytes=...) (about {12 * per_decoder} per worker holds them all)" in said
    decoder.close()
    # A pool's files, at least the default 64, within half the open-file limit (the 64 too: at ``ulimit -n 64`` they
    # left no descriptor for the data files, EMFILE, test_open_files); an explicit bound as given.
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 1024)
    assert [CpuFrameDecoder(files_in_use=n).max_open for n in (0, 12, 192, 700)] == [64, 64, 192, 512]
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 100)
    assert [CpuFrameDecoder(files_in_use=n).max_open for n in (0, 192)] == [50, 50]
    # A pool's 12 files, 5 kept open at ``ulimit -n 10``: said once, with the limit that keeps all 12 (nothing was).
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 10)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV), files_in_use=12)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        for path in paths * 2:
            decoder.decode(path, index, [5])
    assert decoder.open_decoders == 5
    [said] = [r.getMessage() for r in caplog.records if "open-file" in r.getMessage()]
    assert "up to 12 files are in use (episode pool x cameras) but this process's open-file limit (10) keeps 5" in said
    assert "raise it to 24 or more before starting (ulimit -n)" in said
    decoder.close()
    # Another pool's decoder in this process (a mixture's other dataset: 14 files) says it no more: one fact a job,
    # said with the first one's numbers, as each worker's would be.
    other = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV), files_in_use=14)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        for path in paths * 2:
            other.decode(path, index, [5])
    assert other.open_decoders == 5
    assert [r.getMessage() for r in caplog.records if "open-file" in r.getMessage()] == [said]
    other.close()
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 1024)
    assert CpuFrameDecoder(options=CpuDecodeOptions(max_open_decoders=2), files_in_use=192).max_open == 2
    # A bound over the decoders' half of the limit: said once, with the limit that keeps it, and kept within it (it
    # was taken as given, and the files it kept open failed a later open with EMFILE).
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 256)
    monkeypatch.setattr(open_files, "DECODERS", open_files.FileShare(open_files.DECODER_SHARE))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        bounds = [CpuFrameDecoder(options=CpuDecodeOptions(max_open_decoders=n)).max_open for n in (128, 200, 300)]
    assert bounds == [128, 128, 128]
    [said] = [r.getMessage() for r in caplog.records if "max_open_decoders" in r.getMessage()]
    assert said == (
        "CPU decode: CpuDecodeOptions(max_open_decoders=200) is more than half this process's soft limit on open "
        "files (256), so 128 are kept open at most; raise the limit before starting (`ulimit -n 400`) or lower "
        "max_open_decoders"
    )
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 1024)
    # A remote file opened as a container: its demuxer's tables and its read-ahead buffer count too.
    from tests.fake_remote import FakeRemoteFileSystem

    remote = FakeRemoteFileSystem(str(tmp_path))
    handle = 8 * 2**20  # fsspec's read-ahead block (5 MiB for HTTP), with margin
    budget = 10 * (per_decoder + DEMUXER_BYTES_PER_PACKET * index.frame_count + handle)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=budget))
    for i in range(12):
        decoder.decode(f"{i}.mp4", index, [5], filesystem=remote)
    assert decoder.open_decoders == 10
    decoder.close()


@pytest.mark.parametrize(("cpus", "threads"), [(1, 2), (15, 16), (64, 16)])
def test_ffmpegs_automatic_threads_are_counted_as_the_cpus_plus_one_at_most_16(monkeypatch, cpus, threads) -> None:
    """The threads a decoder of ``threads_per_decoder=0`` is counted to hold frames for: FFmpeg's own choice."""
    from lerobot_dali import cpu_decode

    monkeypatch.setattr(cpu_decode, "usable_cpus", lambda: cpus)
    assert cpu_decode._ffmpeg_auto_threads() == threads


def _remux_to_mkv(source: Path, mkv: Path) -> Path:
    """``source``'s packets in Matroska, a container the packet index opens as such (no byte-exact MP4 tables)."""
    with av.open(str(source)) as mp4, av.open(str(mkv), "w", format="matroska") as out:
        stream = out.add_stream_from_template(mp4.streams.video[0])
        for packet in mp4.demux(mp4.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    return mkv


def test_an_open_long_file_counts_its_demuxers_tables(tmp_path) -> None:
    """An open container holds its file's index (~50 bytes a packet): 192 open MP4s of 30,000 64x64 frames held
    270 MB where their decoders' frames were estimated at 14 MB, so the budget did not bound a worker's memory. A
    local MP4 is now read by byte range, with no container and so no tables: the budget holds more of them."""
    from lerobot_dali.cpu_decode_options import DEMUXER_BYTES_PER_PACKET, decoder_bytes
    from lerobot_dali.generate import encode_video

    source = tmp_path / "long.mp4"
    encode_video(source, (np.full((64, 64, 3), i % 256, np.uint8) for i in range(3000)), fps=15, codec="h264", gop=30)
    _remux_to_mkv(source, tmp_path / "long.mkv")
    frames_bytes = decoder_bytes(64, 64, 1)
    kept = {}
    for name in ("long.mkv", "long.mp4"):
        index = build_packet_index(tmp_path / name)
        budget = 10 * (frames_bytes + DEMUXER_BYTES_PER_PACKET * index.frame_count)
        options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=budget)
        decoder = CpuFrameDecoder(options=options)
        for i in range(12):
            decoder.decode(shutil.copy(tmp_path / name, tmp_path / f"{i}-{name}"), index, [2000])
        kept[name] = decoder.open_decoders
        decoder.close()
    # (3,000 packets' tables: 150 kB, counted for the container alone; 12 and 12 when only frames counted)
    assert kept == {"long.mkv": 10, "long.mp4": 11} and budget // frames_bytes == 11


def test_a_local_file_opened_through_fsspec_counts_no_read_ahead_block(marker_video: MarkerVideo, tmp_path) -> None:
    """A container opened through fsspec's local filesystem holds its demuxer's tables but no remote read-ahead block
    (8 MB each): counted as remote, 8 of 11 MKVs were kept where the budget holds 10."""
    from fsspec.implementations.local import LocalFileSystem

    from lerobot_dali.cpu_decode_options import DEMUXER_BYTES_PER_PACKET, decoder_bytes

    source = marker_video("h264", 30)
    mkv = _remux_to_mkv(source, tmp_path / "clip.mkv")
    index = build_packet_index(mkv)
    assert not index.byte_exact  # (opened as a container)
    per_file = decoder_bytes(index.width, index.height, 1) + DEMUXER_BYTES_PER_PACKET * index.frame_count
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=10 * per_file)
    decoder = CpuFrameDecoder(options=options)
    reference = reference_frames(mkv)
    for i in range(11):
        got = decoder.decode(str(shutil.copy(mkv, tmp_path / f"{i}.mkv")), index, [40], filesystem=LocalFileSystem())
        np.testing.assert_array_equal(got[0], reference[int(index.frame_pts[40])])
    assert decoder.open_decoders == 10
    decoder.close()


def test_the_memory_bound_holds_as_decoders_fail_close_and_reopen(marker_video: MarkerVideo, tmp_path, monkeypatch):
    """The open decoders' memory is kept as a running total: a decoder dropped when its decode fails, or closed,
    gives its share back, so the budget keeps exactly as many open as before."""
    from lerobot_dali.cpu_decode_options import decoder_bytes

    source = marker_video("vp9", 2)
    paths = [shutil.copy(source, tmp_path / f"{i}.mp4") for i in range(14)]
    index = build_packet_index(source)
    per_decoder = decoder_bytes(index.width, index.height, 1)
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=10 * per_decoder)
    decoder = CpuFrameDecoder(options=options)
    first = [decoder.decode(path, index, [5]) for path in paths[:10]]
    assert decoder.open_decoders == 10
    plain = PacketFileReader.frames_at

    def failing(self, *args, **kwargs):
        raise VideoDecodeError("broken")

    monkeypatch.setattr(PacketFileReader, "frames_at", failing)
    with pytest.raises(VideoDecodeError, match="broken"):
        decoder.decode(paths[10], index, [5])  # opened (one evicted for it), then dropped
    monkeypatch.setattr(PacketFileReader, "frames_at", plain)
    assert decoder.open_decoders == 9
    decoder.decode(paths[11], index, [5])
    assert decoder.open_decoders == 10  # its share was given back: room for one more
    decoder.decode(paths[12], index, [5])
    assert decoder.open_decoders == 10
    decoder.close()
    assert decoder.open_decoders == 0
    again = [decoder.decode(path, index, [5]) for path in paths[:10]]
    assert decoder.open_decoders == 10  # after close, the full budget again
    for got, want in zip(again, first, strict=True):
        np.testing.assert_array_equal(got, want)
    decoder.close()


def test_every_reader_is_closed_or_kept(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reader opened is either kept open (counted in ``open_decoders``) or closed before the call returns: one
    whose decode fails, a lent file object's (never kept), and the remote route's decoder fed bad packets. One left
    unclosed keeps FFmpeg's decoder and its frames until the collector finds it."""
    from lerobot_dali.pyav_reader import PyAvReader

    live: dict[type, set[int]] = {PacketFileReader: set(), PyAvReader: set(), PacketDecoder: set()}
    for cls, instances in live.items():
        plain_init, plain_close = cls.__init__, cls.close

        def init(self, *args, _plain=plain_init, _live=instances, **kwargs):
            _plain(self, *args, **kwargs)
            _live.add(id(self))

        def close(self, _plain=plain_close, _live=instances):
            _live.discard(id(self))
            _plain(self)

        monkeypatch.setattr(cls, "__init__", init)
        monkeypatch.setattr(cls, "close", close)

    def open_readers() -> int:  # (a local MP4's reader holds a packet decoder of its own)
        assert len(live[PacketDecoder]) == len(live[PacketFileReader])
        return len(live[PacketFileReader]) + len(live[PyAvReader])

    path = marker_video("h264", 30)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    reference = decoder.decode(path, index, [40])
    assert open_readers() == decoder.open_decoders == 1
    with open(path, "rb") as lent:
        np.testing.assert_array_equal(decoder.decode(lent, index, [40]), reference)
    assert open_readers() == decoder.open_decoders == 1  # the lent file's reader closed
    plan = plan_clip(index, [40])
    with pytest.raises(VideoDecodeError):
        decoder.decode_packets(index, plan, [b"\xff" * len(p) for p in read_packet_payloads(path, index, plan)])
    assert open_readers() == decoder.open_decoders == 1  # the remote route's decoder, fed garbage, closed

    def failing(self, *args, **kwargs):
        raise VideoDecodeError("broken")

    monkeypatch.setattr(PacketFileReader, "frames_at", failing)
    with pytest.raises(VideoDecodeError, match="broken"):
        decoder.decode(shutil.copy(path, marker_video("h264", 30).parent / "copy_for_close.mp4"), index, [40])
    assert open_readers() == decoder.open_decoders == 1  # the reader whose decode failed closed
    decoder.close()
    assert open_readers() == 0


def test_a_decoder_left_no_share_of_the_open_file_limit_closes_what_it_holds(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the process's other decoders hold the whole share, a decoder keeps nothing open: the file it opens now
    is closed after use, and so are the ones it held (kept, they outgrew the share and failed a later open with
    EMFILE)."""
    from lerobot_dali import open_files

    paths = [marker_video(codec, 30) for codec in ("h264", "hevc", "av1")]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    for path in paths[:2]:
        decoder.decode(path, build_packet_index(path), [5])
    assert decoder.open_decoders == 2
    monkeypatch.setattr(open_files.DECODERS, "files_for", lambda holder: 0)
    index = build_packet_index(paths[2])
    got = decoder.decode(paths[2], index, [5])
    np.testing.assert_array_equal(got[0], reference_frames(paths[2])[int(index.frame_pts[5])])
    assert decoder.open_decoders == 0
    decoder.close()


def test_a_pool_one_file_over_the_budget_is_said_and_one_over_the_open_file_bound_by_a_miscount_is_not(
    marker_video: MarkerVideo, tmp_path, caplog, monkeypatch
) -> None:
    """11 files in use with a budget for 10 is said (the cycle reopens a file per request); the open-file bound's
    line is for a pool larger than the bound, not for one equal to it that a request outside the pool overflows."""
    import logging

    from lerobot_dali import open_files
    from lerobot_dali.cpu_decode_options import decoder_bytes

    source = marker_video("vp9", 2)
    paths = [shutil.copy(source, tmp_path / f"{i}.mp4") for i in range(11)]
    index = build_packet_index(source)
    per_decoder = decoder_bytes(index.width, index.height, 1)
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=10 * per_decoder)
    decoder = CpuFrameDecoder(options=options, files_in_use=11)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        for path in paths:
            decoder.decode(path, index, [5])
    assert decoder.open_decoders == 10
    [said] = [r.getMessage() for r in caplog.records]
    assert "up to 11 files are in use (episode pool x cameras) but 10 open decoders" in said
    decoder.close()
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 10)  # (keeps 5)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV), files_in_use=5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cpu_decode"):
        for path in paths[:6]:
            decoder.decode(path, index, [5])
    assert decoder.open_decoders == 5
    assert [r.getMessage() for r in caplog.records] == []
    decoder.close()


def test_auto_threads_are_counted_as_ffmpeg_starts_them(marker_video: MarkerVideo, tmp_path, monkeypatch) -> None:
    """``threads_per_decoder=0`` lets FFmpeg choose: the CPUs plus one, at most 16; the memory budget counts each
    decoder's frames for that many threads."""
    from lerobot_dali import cpu_decode
    from lerobot_dali.cpu_decode_options import decoder_bytes

    path = marker_video("h264", 30, height=240, width=320)
    paths = [shutil.copy(path, tmp_path / f"{i}.mp4") for i in range(12)]
    index = build_packet_index(path)
    for cpus, threads in ((1, 2), (3, 4), (40, 16)):
        monkeypatch.setattr(cpu_decode, "usable_cpus", lambda cpus=cpus: cpus)
        budget = 10 * decoder_bytes(320, 240, threads)  # (11 of one thread fewer fit it; 8, the least, of 41)
        options = CpuDecodeOptions(
            backend=CpuDecoderBackend.PYAV, threads_per_decoder=0, max_decoder_memory_bytes=budget
        )
        decoder = CpuFrameDecoder(options=options)
        for p in paths:
            decoder.decode(p, index, [5])
        assert decoder.open_decoders == 10, cpus
        decoder.close()


_FORK_DECODER: CpuFrameDecoder | None = None


def _decode_in_child(path: str, queue: multiprocessing.Queue) -> None:
    assert _FORK_DECODER is not None
    index = build_packet_index(path)
    queue.put((_FORK_DECODER.open_decoders, _FORK_DECODER.decode(path, index, [40, 10])))


def test_inherited_decoders_are_not_used_after_fork(marker_video: MarkerVideo) -> None:
    global _FORK_DECODER
    path = marker_video("hevc", 30)
    index = build_packet_index(path)
    _FORK_DECODER = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        before = _FORK_DECODER.decode(path, index, [40, 10])
        assert _FORK_DECODER.open_decoders == 1
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_decode_in_child, args=(str(path), queue))
        child.start()
        inherited, in_child = queue.get(timeout=60)
        child.join(timeout=60)
        assert child.exitcode == 0
        assert inherited == 0  # the child saw none of the parent's open decoders
        np.testing.assert_array_equal(in_child, before)
        np.testing.assert_array_equal(_FORK_DECODER.decode(path, index, [40, 10]), before)
    finally:
        _FORK_DECODER.close()
        _FORK_DECODER = None


def _decode_each_in_child(paths: list[str], queue: multiprocessing.Queue) -> None:
    assert _FORK_DECODER is not None
    index = build_packet_index(paths[0])
    for path in paths:
        _FORK_DECODER.decode(path, index, [5])
    queue.put(_FORK_DECODER.open_decoders)


def test_a_forked_child_has_the_whole_memory_budget(marker_video: MarkerVideo, tmp_path) -> None:
    """The decoders inherited through fork are dropped, and so is their memory: a child of a parent holding the
    budget's 10 decoders keeps 10 of its own, not the least the budget allows (8)."""
    global _FORK_DECODER
    from lerobot_dali.cpu_decode_options import decoder_bytes

    source = marker_video("vp9", 2)
    paths = [str(shutil.copy(source, tmp_path / f"{i}.mp4")) for i in range(10)]
    index = build_packet_index(source)
    budget = 10 * decoder_bytes(index.width, index.height, 1)
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, max_decoder_memory_bytes=budget)
    _FORK_DECODER = CpuFrameDecoder(options=options)
    try:
        for path in paths:
            _FORK_DECODER.decode(path, index, [5])
        assert _FORK_DECODER.open_decoders == 10
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_decode_each_in_child, args=(paths, queue))
        child.start()
        in_child = queue.get(timeout=60)
        child.join(timeout=60)
        assert child.exitcode == 0
        assert in_child == 10
    finally:
        _FORK_DECODER.close()
        _FORK_DECODER = None


def test_pickles_without_open_decoders(marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder) -> None:
    path = marker_video("vp9", 2)
    index = build_packet_index(path)
    expected = pyav_decoder.decode(path, index, [7])
    copy = pickle.loads(pickle.dumps(pyav_decoder))
    assert copy.open_decoders == 0
    assert copy.options == pyav_decoder.options
    np.testing.assert_array_equal(copy.decode(path, index, [7]), expected)
    copy.close()
    # A worker's decoder keeps its pool's files open: the count travels with it (else it kept the default 64).
    pool = pickle.loads(pickle.dumps(CpuFrameDecoder(options=pyav_decoder.options, files_in_use=100)))
    assert pool.files_in_use == 100


def test_options_validation() -> None:
    with pytest.raises(ValueError, match="threads_per_decoder"):
        CpuDecodeOptions(threads_per_decoder=-1)
    with pytest.raises(ValueError, match="max_open_decoders"):
        CpuDecodeOptions(max_open_decoders=0)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'pyav', 'torchcodec', got 'av'"):
        CpuDecodeOptions(backend="av")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CpuDecodeOptions(CpuDecoderBackend.PYAV)  # type: ignore[misc]


def test_backend_resolution() -> None:
    resolved = CpuFrameDecoder().backend
    expected = CpuDecoderBackend.TORCHCODEC if torchcodec_available() else CpuDecoderBackend.PYAV
    assert resolved is expected
    assert pyav_can_decode("av1") and pyav_can_decode("h264") and not pyav_can_decode("evc")


def test_torchcodec_backend_where_missing(marker_video: MarkerVideo) -> None:
    if torchcodec_available():
        pytest.skip("torchcodec loads here")
    path = marker_video("h264", 2)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    with pytest.raises(CodecUnsupportedError, match="torchcodec"):
        decoder.decode(path, build_packet_index(path), [0])


def test_the_torchcodec_backend_where_it_cannot_decode_is_refused_when_the_iterator_is_built(
    make_ds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend=torchcodec`` where torchcodec cannot decode built the iterator and failed at the first batch (a
    worker's decoder): refused at construction, naming the cameras the workers decode and the fix; a camera DALI
    decodes (VP9 in CPU mode) needs no torchcodec and builds."""
    from lerobot_dali import DALILeRobotIterator

    _stand_in_torchcodec(monkeypatch, None)  # (imports, found no FFmpeg: torchcodec_unavailable says why)
    torchcodec = CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC)
    root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec="h264")
    with pytest.raises(CodecUnsupportedError) as info:
        DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0, cpu_decode=torchcodec)
    assert str(info.value).startswith(
        "cpu_decode=CpuDecodeOptions(backend=torchcodec) for cameras ['observation.images.cam0'], which the workers "
        "decode, but torchcodec 0.17.0 found no FFmpeg shared libraries"
    ) and str(info.value).endswith("use CpuDecoderBackend.PYAV or AUTO (torchcodec where it decodes, else PyAV), "
                                   "or make torchcodec load")  # fmt: skip
    vp9 = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec="vp9")
    with DALILeRobotIterator(vp9, batch_size=2, device="cpu", num_workers=0, cpu_decode=torchcodec) as it:
        assert it.routes == {"observation.images.cam0": DecodeRoute.DALI_CPU}


def _stand_in_torchcodec(monkeypatch: pytest.MonkeyPatch, ffmpeg_major_version: int | None) -> None:
    """A torchcodec that imports, as torchcodec >= 0.17 does, whether or not it found FFmpeg's libraries."""
    import sys
    import types

    package = types.ModuleType("torchcodec")
    package.__version__ = "0.17.0"  # type: ignore[attr-defined]
    package.ffmpeg_major_version = ffmpeg_major_version  # type: ignore[attr-defined]
    decoders = types.ModuleType("torchcodec.decoders")

    class Unreachable:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("a torchcodec without FFmpeg must not be asked to decode")

    decoders.VideoDecoder = Unreachable  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchcodec", package)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)


def test_a_torchcodec_without_ffmpeg_is_passed_over_for_pyav(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """``pip install lerobot`` brings torchcodec; where FFmpeg's shared libraries are missing it still imports
    (>= 0.17), and ``auto`` picked it, so every batch failed with "torchcodec cannot open the video" and a
    200-line traceback blaming the file. It now decodes with PyAV and logs why, once."""
    from lerobot_dali import cpu_decode, decode_route

    _stand_in_torchcodec(monkeypatch, None)
    cpu_decode._note_torchcodec_skipped.cache_clear()
    assert not torchcodec_available()
    assert "found no FFmpeg shared libraries" in (cpu_decode.torchcodec_unavailable() or "")
    path = marker_video("h264", 2)
    index = build_packet_index(path)
    with caplog.at_level("INFO", logger="lerobot_dali.cpu_decode"):  # (AUTO is resolved at first use)
        decoders = [CpuFrameDecoder(), CpuFrameDecoder()]
        assert [d.backend for d in decoders] == [CpuDecoderBackend.PYAV] * 2
    notes = [r.getMessage() for r in caplog.records if "CPU decode uses PyAV" in r.getMessage()]
    assert len(notes) == 1 and "torchcodec 0.17.0 found no FFmpeg" in notes[0]
    window = np.array([0, 3, 4])
    np.testing.assert_array_equal(decoders[0].decode(path, index, window), pyav_decoder.decode(path, index, window))
    # Asked for by name, it fails with the reason rather than blaming the video.
    named = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    with pytest.raises(CodecUnsupportedError, match="found no FFmpeg shared libraries.*CpuDecoderBackend.PYAV"):
        named.decode(path, index, [0])
    # A codec PyAV lacks is not routed to the fallback on torchcodec's account.
    with pytest.raises(CodecUnsupportedError, match="No decoder handles"):
        decode_route._cpu_route("evc", "camera x")
    assert "torchcodec unused: torchcodec 0.17.0 found no FFmpeg" in cpu_decode.cpu_decoders()


def test_a_torchcodec_that_found_ffmpeg_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    from lerobot_dali.cpu_decode import cpu_decoders

    _stand_in_torchcodec(monkeypatch, 7)
    assert torchcodec_available() and CpuFrameDecoder().backend is CpuDecoderBackend.TORCHCODEC
    assert cpu_decoders().endswith("torchcodec 0.17.0 (FFmpeg 7), which CPU mode decodes with")


def test_frames_torchcodec_misplaces_are_decoded_with_pyav(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """torchcodec seeks to the keyframes the container flags; on an x264 intra-refresh file (P-frames flagged) it
    handed over later frames than those asked for (0.4 s later at 10 fps: 31 of 60 samples of
    test_intra_refresh.py's iterator test were other frames, with torchcodec 0.17). The frames' own times tell: such
    a file is decoded with PyAV from then on, said once. Frames at the times asked for are torchcodec's."""
    import sys

    import torch

    from lerobot_dali import said_once

    _stand_in_torchcodec(monkeypatch, 7)
    shift = {"s": 0.0}
    calls: list[list[float]] = []

    class StandIn:
        metadata = SimpleNamespace(rotation=None)

        def __init__(self, source: object, **kwargs: object) -> None:
            self.height, self.width = build_packet_index(source).height, build_packet_index(source).width

        def get_frames_played_at(self, seconds: list[float]) -> object:
            calls.append(seconds)
            data = torch.full((len(seconds), self.height, self.width, 3), 7, dtype=torch.uint8)
            return SimpleNamespace(data=data, pts_seconds=torch.tensor(seconds, dtype=torch.float64) + shift["s"])

    monkeypatch.setattr(sys.modules["torchcodec.decoders"], "VideoDecoder", StandIn)
    monkeypatch.setattr(said_once, "_folder", lambda: None)
    path = marker_video("h264", 2)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    window = np.array([1, 3, 4])
    assert (decoder.decode(path, index, window) == 7).all() and len(calls) == 1  # (in place: torchcodec's frames)
    shift["s"] = 4 * index.frame_interval_s
    with caplog.at_level("WARNING", logger="lerobot_dali.cpu_decode"):
        for _ in range(2):
            np.testing.assert_array_equal(decoder.decode(path, index, window), pyav_decoder.decode(path, index, window))
    assert len(calls) == 2  # (the second request went to PyAV at once)
    assert decoder.open_decoders == 1  # PyAV's: the torchcodec reader that misread it is dropped, not kept closed
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"{path}: torchcodec gave the frame at " in said and "(3 of 3 frames)" in said
    assert said.endswith("decoding this file with PyAV")
    with open(path, "rb") as lent:  # a file object (remote datasets lend one): never kept, so torchcodec each time
        for _ in range(2):
            np.testing.assert_array_equal(decoder.decode(lent, index, window), pyav_decoder.decode(path, index, window))
    assert len(calls) == 4
    decoder.close()


def test_misplaced_frames_are_blamed_on_a_hidden_keyframe_only_where_one_is_hidden() -> None:
    """The edit list is named only where it hides keyframes *and* open GOPs decode leading pictures from them; open
    GOPs alone (x264's default B-pyramid files) or an edit list alone leave intra refresh the likely cause."""
    from lerobot_dali.cpu_decode import _why_misplaced

    hides = "its edit list hides the keyframes of GOPs that open GOPs' leading pictures are decoded from"
    refresh = "keyframes flagged where decoding cannot start: intra refresh?"
    cases = {(None, False): refresh, (None, True): refresh, (range(0, 2), False): refresh, (range(0, 2), True): hides}
    for (hidden, leading), why in cases.items():
        assert _why_misplaced(SimpleNamespace(hidden=hidden, has_leading_pictures=leading)) == why, (hidden, leading)


def test_a_missing_torchcodec_is_named_as_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from lerobot_dali import cpu_decode

    monkeypatch.setitem(sys.modules, "torchcodec", None)  # import raises ModuleNotFoundError(name="torchcodec")
    assert cpu_decode.torchcodec_unavailable() == "torchcodec is not installed"
    assert CpuFrameDecoder().backend is CpuDecoderBackend.PYAV


def test_a_video_torchcodec_cannot_open_does_not_leave_its_file_open(monkeypatch, tmp_path: Path) -> None:
    """The file opened for torchcodec (remote datasets hand it a file object) stayed open when the decoder refused
    the video: no reader was returned to close it. A stand-in torchcodec refuses here, so it runs without one."""
    import sys
    import types

    from lerobot_dali.torchcodec_reader import TorchCodecReader

    class Refusing:
        def __init__(self, source, **kwargs):
            raise RuntimeError("Could not open input file")

    fake = types.ModuleType("torchcodec.decoders")
    fake.VideoDecoder = Refusing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchcodec", types.ModuleType("torchcodec"))
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", fake)
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    opened = []

    def tracked_open(path, mode="rb"):
        opened.append(open(path, mode))  # noqa: SIM115 (the reader owns it; the test checks that it closes it)
        return opened[-1]

    fs = SimpleNamespace(open=tracked_open)
    with pytest.raises(VideoDecodeError, match="torchcodec cannot open the video"):
        TorchCodecReader(str(tmp_path / "bad.mp4"), filesystem=fs, threads=1, label="bad.mp4", stream_index=0)
    assert len(opened) == 1 and opened[0].closed


@pytest.mark.torchcodec
def test_torchcodec_matches_pyav(marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder) -> None:
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    window = np.array([0, 31, 32, 89, 31])
    got = decoder.decode(path, index, window).astype(np.int16)
    assert np.abs(got - pyav_decoder.decode(path, index, window)).max() <= 3


def _turned(source: Path, target: Path, matrix: tuple[int, ...]) -> Path:
    """A copy of MP4 ``source`` whose track header carries the display ``matrix`` (a rotation, as phones record)."""
    raw = bytearray(source.read_bytes())
    start = raw.find(b"tkhd") + 4
    assert raw[start] == 0  # (version 0: the matrix follows 40 bytes of fields)
    raw[start + 40 : start + 76] = struct.pack(">9i", *matrix)
    target.write_bytes(bytes(raw))
    return target


#: Display matrices (16.16 fixed point) of a quarter turn each way and a half turn, as ``tkhd`` stores them.
_TURNS = {
    "quarter": (0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000),
    "three_quarters": (0, -0x10000, 0, 0x10000, 0, 0, 0, 0, 0x40000000),
    "half": (-0x10000, 0, 0, 0, -0x10000, 0, 0, 0, 0x40000000),
}


@pytest.mark.torchcodec
@pytest.mark.parametrize("turn", sorted(_TURNS))
def test_torchcodec_gives_a_turned_video_as_stored_like_every_other_route(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, tmp_path: Path, turn: str
) -> None:
    """torchcodec 0.17 turns frames upright by the display matrix; PyAV, DALI and NVDEC hand the stored picture over,
    whose size the packet index (and so the camera's format) holds. On a 64x96 file with a quarter turn, CPU mode
    (AUTO picks torchcodec where it loads) gave 96x64 frames, PyAV 64x96: the same camera came turned or not by
    the machine's packages. torchcodec's frames are turned back."""
    path = _turned(marker_video("h264", 30), tmp_path / f"{turn}.mp4", _TURNS[turn])
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    window = np.array([0, 31, 89])
    expected = pyav_decoder.decode(path, index, window)
    assert expected.shape == (3, 64, 96, 3)
    got = decoder.decode(path, index, window)
    assert got.shape == expected.shape
    assert np.abs(got.astype(np.int16) - expected).max() <= 3
    resized = decoder.decode(path, index, window, size=(32, 48))
    assert np.abs(resized.astype(np.int16) - pyav_decoder.decode(path, index, window, size=(32, 48))).max() <= 40
    decoder.close()


def test_a_turned_video_is_turned_back_from_torchcodecs_frames(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with a stand-in for torchcodec where it does not load: one that turns frames as torchcodec 0.17 does
    (its ``metadata.rotation`` -90 for a quarter turn clockwise; each way checked with the real one)."""
    import sys

    import torch

    _stand_in_torchcodec(monkeypatch, 7)
    path = marker_video("h264", 30)
    index = build_packet_index(path)

    class StandIn:
        metadata = SimpleNamespace(rotation=-90.0)

        def __init__(self, source: object, **kwargs: object) -> None:
            pass

        def get_frames_played_at(self, seconds: list[float]) -> object:
            frames = pyav_decoder.decode(path, index, np.searchsorted(index.frame_pts_s, seconds))
            data = torch.from_numpy(np.rot90(frames, -1, axes=(1, 2)).copy())  # (how torchcodec gave them)
            return SimpleNamespace(data=data, pts_seconds=torch.tensor(seconds, dtype=torch.float64))

    monkeypatch.setattr(sys.modules["torchcodec.decoders"], "VideoDecoder", StandIn)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    window = np.array([0, 31, 89])
    np.testing.assert_array_equal(decoder.decode(path, index, window), pyav_decoder.decode(path, index, window))
    decoder.close()


def test_planes_come_from_pyav_where_auto_picks_torchcodec_for_rgb(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchcodec hands over RGB only: where AUTO picks it, a planes request of a file is PyAV's, also right after
    an RGB request of that file left torchcodec's reader open (decoders are kept per file and backend)."""
    import sys

    import torch

    _stand_in_torchcodec(monkeypatch, 7)
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    opened: list[object] = []

    class StandIn:
        metadata = SimpleNamespace(rotation=None)

        def __init__(self, source: object, **kwargs: object) -> None:
            opened.append(source)

        def get_frames_played_at(self, seconds: list[float]) -> object:
            frames = pyav_decoder.decode(path, index, np.searchsorted(index.frame_pts_s, seconds))
            return SimpleNamespace(
                data=torch.from_numpy(frames), pts_seconds=torch.tensor(seconds, dtype=torch.float64)
            )

    monkeypatch.setattr(sys.modules["torchcodec.decoders"], "VideoDecoder", StandIn)
    decoder = CpuFrameDecoder()
    assert decoder.backend is CpuDecoderBackend.TORCHCODEC
    window = np.array([0, 31, 89])
    reference = reference_frames(path)
    with av.open(str(path)) as container:
        full = {f.pts: frame_planes(f) for f in container.decode(video=0)}
    for pixels in ("rgb", "planes", "rgb", "planes"):
        got = decoder.decode(path, index, window, pixels=pixels)
        for row, pts in enumerate(index.frame_pts[window].tolist()):
            if pixels == "rgb":
                np.testing.assert_array_equal(got[row], reference[pts])
            else:
                np.testing.assert_array_equal(got.luma[row, ..., 0], full[pts].luma)
                np.testing.assert_array_equal(got.chroma[row, ..., 0], full[pts].chroma[0])
    assert len(opened) == 1  # torchcodec for the RGB request alone
    assert decoder.open_decoders == 2  # one reader of the file per backend
    decoder.close()


def _with_a_second_video_stream(path: Path, target: Path) -> Path:
    """A copy of ``path`` with a second video stream of noise that FFmpeg's "best stream" picks: flagged default, the
    first not, and of a higher bit rate."""
    import av

    rng = np.random.default_rng(0)
    with av.open(str(path)) as source, av.open(str(target), "w", format="mp4") as out:
        first = out.add_stream_from_template(source.streams.video[0])
        second = out.add_stream("libx264", rate=30)
        second.width, second.height, second.pix_fmt = first.width, first.height, "yuv420p"
        first.disposition, second.disposition = 0, av.stream.Disposition.default.value  # (PyAV 15 takes an int)
        for packet in source.demux(video=0):
            if packet.size:
                packet.stream = first
                out.mux(packet)
        for i in range(sum(EPISODE_LENGTHS)):
            noise = rng.integers(0, 256, (first.height, first.width, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(noise, format="rgb24")
            frame.pts = i
            out.mux(second.encode(frame))
        out.mux(second.encode(None))
    return target


@pytest.mark.parametrize("opened", ["path", "file object"])
def test_the_pyav_routes_decode_the_video_stream_the_index_holds(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, tmp_path: Path, opened: str
) -> None:
    """The packet index times the first video stream's frames, and both PyAV routes decode that stream where a second
    one is FFmpeg's best: a local MP4's packets read by offset (PacketFileReader) and a file object's demuxed from its
    open container (PyAvReader), whose stream taken was untested (the last, the noise, decoded no test's frames)."""
    path = _with_a_second_video_stream(marker_video("h264", 30), tmp_path / "two_streams.mp4")
    index = build_packet_index(path)
    window = np.array([0, 31, 89])
    reference = reference_frames(path, {int(p) for p in index.frame_pts[window]})  # (the first stream's)
    source = path if opened == "path" else io.BytesIO(path.read_bytes())
    for frame_index, frame in zip(window.tolist(), pyav_decoder.decode(source, index, window), strict=True):
        np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])


@pytest.mark.torchcodec
def test_torchcodec_decodes_the_video_stream_the_index_holds(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, tmp_path: Path
) -> None:
    """torchcodec decodes FFmpeg's "best" video stream unless told which; every other route, and the packet index
    that times the frames, take the first. On a file whose second stream is the best (flagged default), CPU mode with
    torchcodec handed over that stream's frames, other pictures at the right times and size with no error (a second
    stream of another size came at that size: 192x256 frames for a 96x128 camera)."""
    path = _with_a_second_video_stream(marker_video("h264", 30), tmp_path / "two_streams.mp4")
    index = build_packet_index(path)
    assert index.stream_index == 0
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    window = np.array([0, 31, 89])
    got = decoder.decode(path, index, window).astype(np.int16)
    assert np.abs(got - pyav_decoder.decode(path, index, window)).max() <= 3
    decoder.close()


def test_the_index_names_its_stream_for_torchcodec(
    marker_video: MarkerVideo, pyav_decoder: CpuFrameDecoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, where torchcodec does not load: the packet index says which stream it holds (1 behind an audio
    stream; 0 of two video streams), and torchcodec is told."""
    import sys

    import av
    import torch

    path = _with_a_second_video_stream(marker_video("h264", 30), tmp_path / "two_streams.mp4")
    audio_first = tmp_path / "audio_first.mp4"
    with av.open(str(path)) as source, av.open(str(audio_first), "w", format="mp4") as out:
        audio = out.add_stream("aac", rate=48000, layout="mono")
        video = out.add_stream_from_template(source.streams.video[0])
        silence = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        silence.sample_rate, silence.pts = 48000, 0
        out.mux(audio.encode(silence))
        out.mux(audio.encode(None))
        for packet in source.demux(source.streams.video[0]):
            if packet.size:
                packet.stream = video
                out.mux(packet)
    _stand_in_torchcodec(monkeypatch, 7)
    asked: list[object] = []

    class StandIn:
        metadata = SimpleNamespace(rotation=None)

        def __init__(self, source: object, **kwargs: object) -> None:
            asked.append(kwargs.get("stream_index"))
            self.source = source

        def get_frames_played_at(self, seconds: list[float]) -> object:
            index = build_packet_index(self.source)
            data = torch.from_numpy(
                pyav_decoder.decode(self.source, index, np.searchsorted(index.frame_pts_s, seconds))
            )
            return SimpleNamespace(data=data, pts_seconds=torch.tensor(seconds, dtype=torch.float64))

    monkeypatch.setattr(sys.modules["torchcodec.decoders"], "VideoDecoder", StandIn)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    for video, stream_index in ((path, 0), (audio_first, 1)):
        index = build_packet_index(video)
        assert index.stream_index == stream_index
        np.testing.assert_array_equal(decoder.decode(video, index, [0, 31]), pyav_decoder.decode(video, index, [0, 31]))
    assert asked == [0, 1]
    decoder.close()


def test_bad_inputs_raise_named_errors(
    marker_video: MarkerVideo, tmp_path: Path, pyav_decoder: CpuFrameDecoder
) -> None:
    path = tmp_path / "clip.mp4"
    shutil.copyfile(marker_video("h264", 30), path)
    index = build_packet_index(path)
    with pytest.raises(FrameRequestError, match="clip.mp4"):
        pyav_decoder.decode(path, index, [])
    with pytest.raises(FrameRequestError, match="outside"):
        pyav_decoder.decode(path, index, [90])
    with pytest.raises(CodecUnsupportedError, match="clip.mp4"):
        pyav_decoder.decode(path, replace(index, codec="evc"), [0])
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated after indexing: moov is gone
    with pytest.raises(VideoDecodeError, match="clip.mp4"):
        pyav_decoder.decode(path, index, [0])
    path.write_bytes(b"\0" * 64 + raw[64:])  # corrupt header
    with pytest.raises(VideoDecodeError, match="clip.mp4"):
        pyav_decoder.decode(path, index, [0])
    path.unlink()
    with pytest.raises(MissingDataFileError, match="clip.mp4"):
        pyav_decoder.decode(path, index, [0])


def test_reused_conversions_give_pyav_own_pixels_across_sizes_and_formats(marker_video: MarkerVideo) -> None:
    """One swscale context per thread replaced PyAV's per-frame ``to_ndarray(format=...)``: the same bytes, also
    when frames of other sizes, resizes and formats alternate on one thread (the context must be rebuilt)."""
    import av

    from lerobot_dali.frame_pixels import WORKER_RESIZE_INTERPOLATION, _to_depth_codes, _to_rgb

    frames = []
    for path in (marker_video("av1", 2), marker_video("h264", 3, height=96, width=128), cr5_video(0)):
        with av.open(str(path)) as container:
            frames += [frame for _, frame in zip(range(3), container.decode(video=0), strict=False)]
    assert len({(f.height, f.width) for f in frames}) == 3
    for frame in frames * 2:
        np.testing.assert_array_equal(_to_rgb(frame, None), frame.to_ndarray(format="rgb24"))
        resized = frame.to_ndarray(format="rgb24", width=40, height=30, interpolation=WORKER_RESIZE_INTERPOLATION)
        np.testing.assert_array_equal(_to_rgb(frame, (30, 40)), resized)
        np.testing.assert_array_equal(_to_depth_codes(frame), frame.to_ndarray(format="gray12le"))


@pytest.mark.parametrize("pixels", ["rgb", "planes"])
def test_decode_each_equals_a_decode_per_request(marker_video: MarkerVideo, pixels: str) -> None:
    path = marker_video("h264", 4)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    requests = [np.array([5, 3, 3]), np.array([40]), np.array([11, 10, 5])]
    together = decoder.decode_each(path, index, requests, pixels=pixels)
    for request, got in zip(requests, together, strict=True):
        want = decoder.decode(path, index, request, pixels=pixels)
        if pixels == "rgb":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got.luma, want.luma)
            np.testing.assert_array_equal(got.chroma, want.chroma)
            np.testing.assert_array_equal(got.matrix, want.matrix)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_decode_each_stacks_a_files_rgb_windows_in_one_array(marker_video: MarkerVideo, codec: str) -> None:
    """A file's RGB windows of several frames are slices of one array; every request, RGB or planes, holds an
    independent full decode's frames bit for bit."""
    path = marker_video(codec, 4)
    index = build_packet_index(path)
    requests = [np.array([5]), np.array([12, 11]), np.array([40, 40]), np.array([3])]
    with av.open(str(path)) as container:
        full = {f.pts: (f.to_ndarray(format="rgb24"), frame_planes(f)) for f in container.decode(video=0)}
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    rgb = decoder.decode_each(path, index, requests)
    planes = decoder.decode_each(path, index, requests, pixels="planes")
    for request, got_rgb, got_planes in zip(requests, rgb, planes, strict=True):
        expected = [full[int(p)] for p in index.frame_pts[request]]
        np.testing.assert_array_equal(got_rgb, np.stack([e[0] for e in expected]))
        np.testing.assert_array_equal(got_planes.luma[..., 0], np.stack([e[1].luma for e in expected]))
        np.testing.assert_array_equal(got_planes.chroma[..., 0], np.stack([e[1].chroma[0] for e in expected]))
        np.testing.assert_array_equal(got_planes.chroma[..., 1], np.stack([e[1].chroma[1] for e in expected]))
        assert all(a.flags.c_contiguous for a in (got_rgb, got_planes.luma, got_planes.chroma))
    one_stack = _memory_owner(rgb[1]) is _memory_owner(rgb[2])
    assert one_stack
    decoder.close()


def _memory_owner(array: np.ndarray) -> object:
    owner: object = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner


def _rgb_rows_padded(path: Path, size: tuple[int, int] | None) -> bool:
    """Whether swscale pads the rows of ``path``'s first frame converted to RGB at ``size`` (height, width). FFmpeg
    chooses: 8.1.3's (PyAV 18.1.1) rounds a row up to a whole number of 64 pixels, so a 96-pixel row's 288 bytes
    take 384; PyAV 18.1.0's did not pad a 96-pixel row."""
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
    height, width = size or (frame.height, frame.width)
    return frame.reformat(width=width, height=height, format="rgb24").planes[0].line_size != width * 3


def test_a_one_frame_request_hands_over_its_frame_without_a_copy(marker_video: MarkerVideo) -> None:
    """A single-frame camera's request is one frame: its converted array goes out as it is (no stacking copy; the
    worker's copy into shared memory is the only one), contiguous as DALI's shared memory takes it. Rows that
    swscale pads (an odd width) are made contiguous; repeats and longer requests are stacked as before."""
    path = marker_video("h264", 4, width=128)  # two whole 64-pixel steps a row: swscale pads none (below)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    reference = reference_frames(path)
    sizes = (None, (37, 101))
    assert [_rgb_rows_padded(path, size) for size in sizes] == [False, True]  # both cases below are met
    for size in sizes:
        one = decoder.decode(path, index, [7], size=size)
        assert one.shape == (1, *(size or (index.height, index.width)), 3)
        assert one.flags.c_contiguous
        # The converted frame's own pixels (PyAV's plane), or for padded rows one contiguous copy.
        assert isinstance(_memory_owner(one), np.ndarray) == (size is not None)
        together = decoder.decode_each(path, index, [np.array([7]), np.array([7, 7]), np.array([8])], size=size)
        np.testing.assert_array_equal(together[0], one)
        np.testing.assert_array_equal(together[1], np.concatenate([one, one]))
        assert isinstance(_memory_owner(together[1]), np.ndarray)
        if size is None:
            np.testing.assert_array_equal(one[0], reference[int(index.frame_pts[7])])
            np.testing.assert_array_equal(together[2][0], reference[int(index.frame_pts[8])])
    decoder.close()


def test_decode_each_of_an_open_gop_file_decodes_each_gop_on_its_own(tmp_path, monkeypatch) -> None:
    """Open GOPs make a union of far-apart requests one unbroken run: decode_each decodes per GOP there."""
    from tests.test_clips import _encode_open_gop

    path = tmp_path / "open_gop.mp4"
    _encode_open_gop(path, "libx264")
    index = build_packet_index(path)
    assert index.has_leading_pictures
    decoded: list[int] = []
    original = PacketDecoder.frames_at

    class Fed(list):  # the packets fed to the decoder, each taken by its place (a run stops once its frames are out)
        def __getitem__(self, position):
            decoded.append(1)
            return super().__getitem__(position)

    def counting(self, index, plan, payloads, *args):
        return original(self, index, plan, Fed(payloads), *args)

    monkeypatch.setattr(PacketDecoder, "frames_at", counting)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    requests = [np.array([2, 3]), np.array([45, 46]), np.array([85, 86])]
    together = decoder.decode_each(path, index, requests)
    packets_together = len(decoded)
    decoded.clear()
    for request, got in zip(requests, together, strict=True):
        np.testing.assert_array_equal(got, decoder.decode(path, index, request))
    assert 0 < packets_together <= len(decoded) < 40, (packets_together, len(decoded))  # not the file's 90


def test_decode_each_groups_a_leading_picture_with_the_gop_its_decoding_starts_in(tmp_path, monkeypatch) -> None:
    from lerobot_dali.clips import plan_clip
    from tests.test_clips import _encode_open_gop

    path = tmp_path / "open_gop.mp4"
    _encode_open_gop(path, "libx264")
    index = build_packet_index(path)
    start = {f: plan_clip(index, [f]).segments[0][0] for f in range(index.frame_count)}
    leading = next(f for f in range(index.frame_count) if start[f] != index.start_keyframe([f]))
    earlier = next(f for f in range(leading) if start[f] == start[leading] and f != leading)
    calls = count_decodes(monkeypatch)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    got = decoder.decode_each(path, index, [np.array([leading]), np.array([earlier])])
    assert calls == [2]  # one decode from the keyframe both start from
    want = reference_frames(path)
    np.testing.assert_array_equal(got[0][0], want[int(index.frame_pts[leading])])
    np.testing.assert_array_equal(got[1][0], want[int(index.frame_pts[earlier])])


def test_keyframes_of_intra_refresh_are_refused_not_decoded_wrongly(tmp_path: Path) -> None:
    """x264's intra refresh flags the P-frame starting each refresh cycle a keyframe: decoded from there, frames
    84-89 came out green, and after another run of the packets (``[1, f]``) frames came out predicted from it, with
    no error. The packet index no longer counts those flags (tests/test_intra_refresh.py); an index that does (one
    built by an older version, say) gets each frame equal to the full decode or refused as read from no
    random-access point."""
    from tests.video_fixtures import encode_intra_refresh, flagged_keyframes

    path = tmp_path / "intra_refresh.mp4"
    encode_intra_refresh(path, [draw_marker(i // 30, i % 30, 64, 96) for i in range(90)])
    flags = np.zeros(90, dtype=bool)
    flags[flagged_keyframes(path)] = True
    index = replace(build_packet_index(path), keyframe=flags)
    assert index.keyframe_positions.tolist() == [0, 20, 40, 60, 80]  # else this file tests nothing
    reference = reference_frames(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    windows = [np.array(w) for w in ([0], [19], [20], [24], [39], [84], [89], [1, 21], [1, 45], [1, 84])]
    outcomes = []
    for window in windows:
        plan = plan_clip(index, window)
        for route in ("file", "packets"):
            try:
                if route == "file":
                    got = decoder.decode(path, index, window)
                else:
                    got = decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))
            except VideoDecodeError as e:
                assert "intra_refresh.mp4: the keyframe at pts" in str(e) and "no random-access point" in str(e)
                outcomes.append("refused")
                continue
            np.testing.assert_array_equal(got, np.stack([reference[int(p)] for p in index.frame_pts[window]]))
            outcomes.append("exact")
    assert outcomes == ["exact"] * 4 + ["refused"] * 16  # (frames 0-19 decode from the first keyframe, an IDR)
    decoder.close()


@pytest.mark.parametrize("gop", ["closed", "open"])
def test_decode_each_refuses_bad_requests_as_decode_does(marker_video: MarkerVideo, tmp_path, gop: str) -> None:
    from tests.test_clips import _encode_open_gop

    if gop == "open":
        path = tmp_path / "open_gop.mp4"
        _encode_open_gop(path, "libx264")
    else:
        path = marker_video("h264", 4)
    index = build_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    for bad in (np.array([], dtype=np.int64), np.array([index.frame_count])):
        with pytest.raises(FrameRequestError):
            decoder.decode_each(path, index, [np.array([1]), bad])


def test_a_worker_keeps_open_every_file_of_its_episode_pool(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 cameras x a pool of 24 one-file episodes (v2.1) draw from 72 files: under the fixed bound of 64 a worker
    reopened files through the epoch (at 640x480, 3 cameras and a pool of 64: 1,450 opens per 640 samples in the
    steady state, +71% CPU per sample). Now each file opens once, and the frames are those of a decoder that
    reopens every file for every request."""
    from lerobot_dali import DALILeRobotIterator
    from lerobot_dali.batch_source import BatchSource

    opened: list[str] = []
    plain = PacketFileReader.__init__

    def counted(self, path, index, **kwargs):
        opened.append(str(path))
        plain(self, path, index, **kwargs)

    monkeypatch.setattr(PacketFileReader, "__init__", counted)
    root = make_ds(episodes=24, frames_per_episode=4, cameras=3, codec="h264", version="v2.1")
    pyav = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV)
    it = DALILeRobotIterator(root, batch_size=8, device="cpu", num_workers=0, episode_pool_size=24, cpu_decode=pyav)
    next(iter(it))
    spec = it._spec
    it.close()
    source = BatchSource(spec)
    reopening = BatchSource(replace(spec, cpu_decode=replace(pyav, max_open_decoders=1)))
    opened.clear()
    batches = [source(SimpleNamespace(epoch_idx=0, iteration=i)) for i in range(12)]  # the whole epoch: 96 samples
    assert len(opened) == len(set(opened)) == 72 and source._decoder.open_decoders == 72
    for i, batch in enumerate(batches):
        for got, want in zip(batch, reopening(SimpleNamespace(epoch_idx=0, iteration=i)), strict=True):
            np.testing.assert_array_equal(np.stack(got), np.stack(want))


def test_cameras_dali_decodes_keep_no_files_open_in_the_worker(make_ds) -> None:
    """VP9 goes to DALI's CPU decoder as clips: the worker opens none of its files, so its open-file bound is
    the default, not pool x cameras (as the counts of worker-decoded H.264 cameras are: of the dataset's 2
    episodes, not the pool of 40 it cannot fill)."""
    from lerobot_dali import DALILeRobotIterator
    from lerobot_dali.batch_source import BatchSource

    counts = {}
    for codec in ("vp9", "h264"):
        root = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec=codec)
        it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0, episode_pool_size=40)
        next(iter(it))
        decoder = BatchSource(it._spec)._decoder
        it.close()
        counts[codec] = (decoder.files_in_use, decoder.max_open)
    assert counts == {"vp9": (0, 64), "h264": (4, 64)}


def _count_torchcodec_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per look for torchcodec, by whichever module looks (each calls torchcodec_unavailable by its own
    name), each answered "not here"."""
    from lerobot_dali import cpu_backends, cpu_decode, torchcodec_reader

    looked: list[int] = []
    for module in (cpu_backends, cpu_decode, torchcodec_reader):
        monkeypatch.setattr(module, "torchcodec_unavailable", lambda: looked.append(1) or "not here")
    return looked


def test_auto_looks_for_torchcodec_only_when_a_worker_decodes(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looking for torchcodec imports torch (about a second and 150 MB per worker where it is installed): a worker
    whose cameras DALI decodes no longer looks."""
    import logging

    from lerobot_dali import DALILeRobotIterator
    from lerobot_dali.batch_source import BatchSource

    looked = _count_torchcodec_lookups(monkeypatch)
    decoder = CpuFrameDecoder()
    assert looked == []
    assert decoder.backend is CpuDecoderBackend.PYAV and decoder.backend is CpuDecoderBackend.PYAV and looked == [1]

    package = logging.getLogger("lerobot_dali")
    level = package.level  # (a source unpickled here sets it, as in a worker)
    try:
        for codec, looks in (("vp9", False), ("h264", True)):  # DALI's CPU decoder, then the workers' fallback
            root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec=codec)
            it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0)
            next(iter(it))
            source = BatchSource(it._spec)
            it.close()
            looked.clear()
            pickle.loads(pickle.dumps(source))  # what each worker does at start
            assert bool(looked) is looks, codec
    finally:
        package.setLevel(level)


def test_a_worker_shipping_planes_does_not_look_for_torchcodec(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planes always come from PyAV (torchcodec hands over RGB only), and planes are what the CPU fallback's workers
    ship on a GPU by default: looking for torchcodec there imported torch in every worker for nothing. GRAPH makes
    the same feed in CPU mode."""
    import logging

    from lerobot_dali import DALILeRobotIterator
    from lerobot_dali.batch_source import BatchSource
    from lerobot_dali.cpu_decode import ColorConversion

    looked = _count_torchcodec_lookups(monkeypatch)
    package = logging.getLogger("lerobot_dali")
    level = package.level  # (a source unpickled here sets it, as in a worker)
    try:
        root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec="h264")
        it = DALILeRobotIterator(
            root, batch_size=2, device="cpu", num_workers=0,
            cpu_decode=CpuDecodeOptions(color_conversion=ColorConversion.GRAPH),
        )  # fmt: skip
        next(iter(it))
        assert all(feed.planes for feed in it._feeds.values())
        source = BatchSource(it._spec)
        it.close()
        looked.clear()
        pickle.loads(pickle.dumps(source))  # what each worker does at start
        assert looked == []
    finally:
        package.setLevel(level)


@pytest.mark.parametrize("options", ["pyav", {"backend": "pyav"}])
def test_options_that_are_no_cpu_decode_options_are_refused_at_construction(options: object) -> None:
    # (each failed in a bare AttributeError, "'str' object has no attribute 'max_open_decoders'")
    with pytest.raises(TypeError, match=r"options must be a CpuDecodeOptions or None, got .*=CpuDecodeOptions\("):
        CpuFrameDecoder(options=options)  # type: ignore[arg-type]
    assert CpuFrameDecoder(options=None).options == CpuDecodeOptions()
