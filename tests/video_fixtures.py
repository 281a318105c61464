"""Shared helpers of the video tests: marker videos, an independent reference decode, real-dataset paths.

The session fixture ``marker_video`` in conftest.py encodes and caches the marker videos built here.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Collection
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from tests.conftest import shared_dataset

FPS = 30
EPISODE_LENGTHS = (30, 25, 35)
EPISODE_STARTS = np.concatenate(([0], np.cumsum(EPISODE_LENGTHS)[:-1]))
# CPU tests use small frames; NVDEC has minimum sizes (HEVC 144x144, VP9/AV1 128x128), so GPU tests ask for larger.
MARKER_HEIGHT, MARKER_WIDTH = 64, 96

# ``marker_video(codec, gop, *, height=MARKER_HEIGHT, width=MARKER_WIDTH) -> Path`` (the conftest fixture).
MarkerVideo = Callable[..., Path]


def nal_packet(*units: bytes, length_size: int = 4) -> bytes:
    """A packet of H.264/HEVC NAL ``units`` as MP4 carries them: each after its size in ``length_size`` bytes."""
    return b"".join(len(unit).to_bytes(length_size, "big") + unit for unit in units)


def encode_marker_video(
    path: Path, codec: str, gop: int, *, height: int = MARKER_HEIGHT, width: int = MARKER_WIDTH
) -> Path:
    """Encode one file of ``EPISODE_LENGTHS`` episodes at ``FPS``, every frame carrying its (episode, frame) marker."""
    frames = [draw_marker(e, f, height, width) for e, n in enumerate(EPISODE_LENGTHS) for f in range(n)]
    encode_video(path, frames, fps=FPS, codec=codec, gop=gop)
    return path


def remux(source: Path | str, target: Path, container_format: str | None = None, **options: str) -> Path:
    """``source``'s video packets, unchanged, in ``target`` (its format ``container_format``, else the name's; Matroska
    has no byte offsets, so clips are cut by demuxing); ``options``: the muxer's (e.g. ``movflags="faststart"``)."""
    with av.open(str(source)) as src, av.open(str(target), "w", format=container_format, options=options) as dst:
        stream = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        for packet in src.demux(src.streams.video[0]):
            if packet.size:
                packet.stream = stream
                dst.mux(packet)
    return target


def reference_frames(path: Path | str | io.BytesIO, keep_pts: Collection[int] | None = None) -> dict[int, np.ndarray]:
    """Independent full sequential PyAV decode: RGB frames keyed by pts (only those in ``keep_pts`` when given)."""
    frames: dict[int, np.ndarray] = {}
    with av.open(path if isinstance(path, io.BytesIO) else str(path)) as container:
        for frame in container.decode(video=0):
            if keep_pts is None or frame.pts in keep_pts:
                frames[frame.pts] = frame.to_ndarray(format="rgb24")
    return frames


def clip_pictures(clip: np.ndarray, relative_indices: Collection[int]) -> np.ndarray:
    """A remuxed clip's pictures at its ``relative_indices`` (display order), by a full PyAV decode of the clip: what a
    working NVDEC gives, for tests that fake the NVDEC probe."""
    decoded = reference_frames(io.BytesIO(clip.tobytes()))
    shown = [decoded[pts] for pts in sorted(decoded)]
    return np.stack([shown[int(i)] for i in relative_indices])


def assert_frames_decoded(
    frames: torch.Tensor, episodes: torch.Tensor, frame_indices: torch.Tensor, video_of: Callable[[int], Path]
) -> None:
    """Each of ``frames`` (C, H, W floats in [0, 1]) equals frame ``frame_indices[i]``, in presentation order, of
    episode ``episodes[i]``'s video (``video_of(episode)``, one file per episode), decoded in full by PyAV alone."""
    for frame, episode, index in zip(frames, episodes, frame_indices, strict=True):
        decoded = reference_frames(video_of(int(episode)))
        want = decoded[sorted(decoded)[int(index)]]
        torch.testing.assert_close(frame, torch.from_numpy(want).permute(2, 0, 1).float() / 255, atol=1e-6, rtol=0)


def gr00t_video(episode: int) -> Path:
    """The real GR00T v2.0 set's video of ``episode`` for its one recorded camera, 'observation.images.ego_view'."""
    return shared_dataset("gr00t_v20_h264") / f"videos/chunk-000/observation.images.ego_view/episode_{episode:06d}.mp4"


def damage_av1_frame_size(path: Path) -> None:
    """Set the frame size in the AV1 sequence header that opens ``path``'s first packet to 1x1, in place, and
    nothing else: dav1d then decodes that keyframe as a 1x1 frame and flags nothing (checked here, so a changed
    encoder or decoder fails this, not the test). The frames predicted from it differ by FFmpeg: up to PyAV 18.1.0's
    they came out 1x1 as well; 18.1.1's (FFmpeg 8.1.3) refuses their packets (InvalidDataError)."""
    raw = bytearray(path.read_bytes())
    start = int(build_packet_index(path).byte_offset[0])
    assert raw[start] == 0x0A and raw[start + 1] < 0x80  # an OBU_SEQUENCE_HEADER with a one-byte size field
    bits = np.unpackbits(np.frombuffer(raw, np.uint8, count=raw[start + 1], offset=start + 2))
    position = 0

    def read(count: int) -> int:
        nonlocal position
        position += count
        return int("".join(map(str, bits[position - count : position])), 2)

    assert read(5) & 1 == 0 and read(1) == 0  # no reduced still-picture header, no timing info
    display_delays = read(1)
    for _ in range(read(5) + 1):  # the operating points: each one's idc, level, tier, display delay
        read(12)
        if read(5) > 7:
            read(1)
        if display_delays and read(1):
            read(4)
    width_bits, height_bits = read(4) + 1, read(4) + 1
    bits[position : position + width_bits + height_bits] = 0  # max_frame_{width,height}_minus_1
    raw[start + 2 : start + 2 + raw[start + 1]] = np.packbits(bits).tobytes()
    path.write_bytes(bytes(raw))
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        keyframe = next(container.demux(stream))
        frames = [*keyframe.decode(), *stream.codec_context.decode(None)]
    assert [(frame.width, frame.height, frame.is_corrupt) for frame in frames] == [(1, 1, False)]


def r1_video() -> Path:
    """The H.264 (B-frames) file of the real r1_v30_h264 dataset; skips the test where the dataset is absent."""
    return shared_dataset("r1_v30_h264") / "videos/observation.images.rgb/chunk-000/file-000.mp4"


def cr5_video(file_index: int) -> Path:
    """One AV1 top-camera file of the real cr5_v30_av1 dataset; skips the test where the dataset is absent."""
    return shared_dataset("cr5_v30_av1") / f"videos/observation.images.top/chunk-000/file-{file_index:03d}.mp4"


def cr5_episodes() -> dict[str, list]:
    """The episodes table of the real cr5_v30_av1 dataset, as columns; skips the test where the dataset is absent."""
    return pq.read_table(shared_dataset("cr5_v30_av1") / "meta/episodes/chunk-000/file-000.parquet").to_pydict()


def count_decodes(monkeypatch) -> list[int]:
    """Record the number of frames each decode of ``CpuFrameDecoder`` asks for (one entry per decoder run)."""
    from lerobot_dali.cpu_decode import CpuFrameDecoder

    calls: list[int] = []
    original = CpuFrameDecoder._frames

    def counting(self, source, index, frame_indices, **kwargs):
        calls.append(len(frame_indices))
        return original(self, source, index, frame_indices, **kwargs)

    monkeypatch.setattr(CpuFrameDecoder, "_frames", counting)
    return calls


def encode_intra_refresh(path: Path, frames: list[np.ndarray], *, fps: int = FPS, keyint: int = 20) -> Path:
    """Encode RGB ``frames`` (frame i at pts i / fps) with x264's intra refresh, no B-frames: the MP4 flags the
    P-frame starting each refresh cycle (every ``keyint`` frames) a sync sample, though only frame 0 is an IDR."""
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "medium", "x264-params": f"intra-refresh=1:keyint={keyint}:bframes=0"}
        for i, array in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def encode_open_keyframes(path: Path, frames: int = 40, *, container_format: str = "mp4") -> Path:
    """x264 open-GOP keyframes without leading pictures: every keyframe after the first an I picture at a recovery
    point (no IDR), none followed by B-pictures shown before it, so the packet index cannot tell them from IDRs. Marker
    frames (episode 0, frame i) at pts i / 50 s."""
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream("libx264", rate=50)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        params = "keyint=3:min-keyint=1:open-gop=1:b-adapt=0:b-pyramid=none:scenecut=100"
        stream.options = {"preset": "medium", "bf": "2", "x264-params": params}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(draw_marker(0, i, 64, 96), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def flagged_keyframes(path: Path | str) -> list[int]:
    """Decode positions of the packets the container flags as keyframes (demuxed, as FFmpeg reads the file)."""
    with av.open(str(path)) as container:
        packets = [p for p in container.demux(video=0) if p.size]
    return [i for i, packet in enumerate(packets) if packet.is_keyframe]


def concatenate_stream_copy(out: Path, parts: list[Path]) -> Path:
    """Stream-copy the video packets of ``parts`` one after another into the MP4 ``out`` as LeRobot 0.4.4's
    ``concatenate_video_files`` does (FFmpeg's concat demuxer, the first file's stream as the template): parts of
    different sizes give one stream that changes frame size part-way."""
    listing = out.with_suffix(".ffconcat")
    listing.write_text("ffconcat version 1.0\n" + "".join(f"file '{part.resolve()}'\n" for part in parts))
    with (
        av.open(str(listing), "r", format="concat", options={"safe": "0"}) as source,
        av.open(str(out), "w", format="mp4") as output,
    ):
        stream = output.add_stream_from_template(template=source.streams.video[0], opaque=True)
        stream.time_base = source.streams.video[0].time_base
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                output.mux(packet)
    listing.unlink()
    return out


def write_undecodable_mp4(path: Path, *, frames: int, fps: int, width: int, height: int) -> Path:
    """An MP4 of ``frames`` packets in a codec (EVC) FFmpeg muxes but has no decoder for: what neither DALI nor
    PyAV decodes. Skips the test where PyAV (< 16) cannot mux a stream without an encoder."""
    if not hasattr(av.container.OutputContainer, "add_mux_stream"):
        pytest.skip("muxing a stream without an encoder needs PyAV >= 16")
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_mux_stream("evc", rate=fps, width=width, height=height)
        for i in range(frames):
            packet = av.Packet(bytes(range(40)))
            packet.pts = packet.dts = i
            packet.time_base = stream.time_base = Fraction(1, fps)
            packet.is_keyframe, packet.stream = i == 0, stream
            container.mux(packet)
    return path


def top_level_boxes(raw: bytes) -> list[tuple[bytes, int, int]]:
    """(type, start, end) of each top-level box of the MP4 file ``raw``, headers included (no 64-bit sizes)."""
    boxes, start = [], 0
    while start + 8 <= len(raw):
        size, kind = struct.unpack_from(">I4s", raw, start)
        boxes.append((kind, start, start + size))
        start += size
    return boxes


def _child_box(raw: bytes | bytearray, kind: bytes, start: int, end: int) -> tuple[int, int]:
    """(start, end) of the first ``kind`` box among the boxes in ``raw[start:end]``, headers included."""
    while start + 8 <= end:
        size, found = struct.unpack_from(">I4s", raw, start)
        if found == kind:
            return start, start + size
        start += size
    raise AssertionError(f"no {kind!r} box")


def with_movie_duration(
    path: Path, target: Path, seconds: float, *, version: int = 0, timescale: int | None = None
) -> Path:
    """Write the fragmented MP4 ``path`` (written with ``default_base_moof``: its fragments address their data from
    their own moof, so moving them moves nothing they point at) to ``target`` with an ``mehd`` box giving the movie
    ``seconds``, as GPAC and Bento4 write one (FFmpeg writes none): of ``version`` 0 (32-bit) or 1 (64-bit), in the
    movie ``timescale`` (FFmpeg's 1000 unless given; its ``empty_moov`` gives the movie no duration to scale)."""
    raw = bytearray(path.read_bytes())
    moov = _child_box(raw, b"moov", 0, len(raw))
    mvhd = _child_box(raw, b"mvhd", moov[0] + 8, moov[1])
    mvex = _child_box(raw, b"mvex", moov[0] + 8, moov[1])
    assert raw[mvhd[0] + 8] == 0, "mvhd version 0"
    if timescale is not None:
        assert struct.unpack_from(">I", raw, mvhd[0] + 24)[0] == 0, "a movie without a duration"
        struct.pack_into(">I", raw, mvhd[0] + 20, timescale)
    ticks = round(seconds * struct.unpack_from(">I", raw, mvhd[0] + 20)[0])
    wide = version == 1  # (version and flags, then the duration: 32 bits, or 64 in version 1)
    mehd = struct.pack(">I4sIQ" if wide else ">I4sII", 20 if wide else 16, b"mehd", version << 24, ticks)
    for start, _ in (moov, mvex):
        struct.pack_into(">I", raw, start, struct.unpack_from(">I", raw, start)[0] + len(mehd))
    raw[mvex[0] + 8 : mvex[0] + 8] = mehd
    target.write_bytes(bytes(raw))
    return target


def with_edit_list(path: Path, target: Path, entries: list[tuple[int, int]]) -> Path:
    """Write ``path`` (an MP4 whose ``moov`` follows its media, with one track and an edit list) to ``target`` with
    that edit list replaced by ``entries``: (segment duration in the movie's timescale, media time in the track's;
    -1 for an empty edit), at normal rate. FFmpeg then demuxes the frames the edits hide flagged to be decoded and
    not shown."""
    raw = bytearray(path.read_bytes())
    moov = _child_box(raw, b"moov", 0, len(raw))
    assert moov[0] > _child_box(raw, b"mdat", 0, len(raw))[0], "moov before mdat: chunk offsets would move"
    trak = _child_box(raw, b"trak", moov[0] + 8, moov[1])
    edts = _child_box(raw, b"edts", trak[0] + 8, trak[1])
    elst = _child_box(raw, b"elst", edts[0] + 8, edts[1])
    body = struct.pack(">I4sII", 16 + 12 * len(entries), b"elst", 0, len(entries))
    body += b"".join(struct.pack(">IihH", duration, media_time, 1, 0) for duration, media_time in entries)
    grow = len(body) - (elst[1] - elst[0])
    for start, _ in (moov, trak, edts):
        struct.pack_into(">I", raw, start, struct.unpack_from(">I", raw, start)[0] + grow)
    raw[elst[0] : elst[1]] = body
    target.write_bytes(bytes(raw))
    return target
