"""AV1, VP9 and H.264 streams may change frame size at any keyframe: a stream copy of videos of several sizes into
one file (as LeRobot's v3.0 concatenation makes) is such a stream. One camera's batches need one size, PyAV's route
refused such frames only when a batch reached them, and DALI's CPU decoder fails on a new VP9 size ("Could not
convert frame data") or decodes it wrongly, so the packet index refuses such a file when it is built, naming the
keyframe and both sizes, and each VP9 clip for DALI checks its keyframes (a remote file's index reads only some)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali import clips as clips_module
from lerobot_dali import packet_index as packet_index_module
from lerobot_dali.clips import build_clip
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.random_access import nal_layout
from lerobot_dali.sequence_headers import keyframe_sequence_headers
from lerobot_dali.video_encoding import SVTAV1_PARAMS, encoder_settings
from lerobot_dali.vp9_frame_size import vp9_keyframe_size
from tests.video_fixtures import FPS, concatenate_stream_copy, reference_frames

FRAMES = 10  # per part
SMALL, LARGE = (64, 96), (96, 128)  # (height, width)


def _part(path: Path, episode: int, size: tuple[int, int], codec: str = "vp9") -> Path:
    encode_video(path, [draw_marker(episode, f, *size) for f in range(FRAMES)], fps=FPS, codec=codec, gop=2)
    return path


def _resized(folder: Path, codec: str, *, check: bool = True) -> Path:
    parts = [_part(folder / "small.mp4", 0, SMALL, codec), _part(folder / "large.mp4", 1, LARGE, codec)]
    path = concatenate_stream_copy(folder / "both.mp4", parts)
    if not check:
        return path
    sizes = [frame.shape[:2] for frame in reference_frames(path).values()]
    assert sizes == [SMALL] * FRAMES + [LARGE] * FRAMES  # (what FFmpeg decodes: else this file tests nothing)
    return path


def _encode(path: Path, codec: str, options: dict[str, str], size: tuple[int, int] = LARGE) -> Path:
    """``FRAMES`` frames of ``size`` encoded as ``encode_video`` does, with ``options`` added."""
    settings = encoder_settings(codec, gop=2, crf=None)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(settings.encoder, rate=FPS)
        (stream.height, stream.width), stream.pix_fmt = size, "yuv420p"
        stream.options = {**settings.options, **options}
        if "svtav1-params" in options:  # (added to ours: lp=1 keeps SVT-AV1's output in order)
            stream.options = {**stream.options, "svtav1-params": f"{SVTAV1_PARAMS}:{options['svtav1-params']}"}
        for i in range(FRAMES):
            frame = av.VideoFrame.from_ndarray(draw_marker(0, i, *size), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@pytest.fixture(scope="module")
def resized_vp9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _resized(tmp_path_factory.mktemp("vp9_size_change"), "vp9")


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv444p", "gbrp"])  # profile 0; profile 1 YUV and RGB
def test_keyframe_sizes_read_from_libvpx_headers(tmp_path: Path, pix_fmt: str) -> None:
    path = tmp_path / "odd.mp4"
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libvpx-vp9", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 98, 66, pix_fmt
        stream.options = {"g": "3", "deadline": "realtime", "cpu-used": "8"}
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((66, 98, 3), 40 * i, np.uint8), format="rgb24")
            frame = frame.reformat(format=pix_fmt)
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    with av.open(str(path)) as container:
        packets = [(packet.is_keyframe, bytes(packet)) for packet in container.demux(video=0) if packet.size]
    assert [key for key, _ in packets] == [True, False, False, True, False]
    assert [vp9_keyframe_size(data) for _, data in packets] == [(98, 66), None, None, (98, 66), None]
    assert vp9_keyframe_size(packets[0][1][:5]) is None  # (cut short: no size)


@pytest.mark.parametrize(("codec", "name"), [("vp9", "VP9"), ("h264", "H.264"), ("av1", "AV1")])
def test_the_index_refuses_a_stream_that_changes_size(tmp_path: Path, codec: str, name: str) -> None:
    path = _resized(tmp_path, codec)
    with pytest.raises(VideoDecodeError) as caught:
        build_packet_index(path)
    message = str(caught.value)
    keyframe = f"its keyframe at {FRAMES / FPS:.6f} s is 128x96 (WxH), the stream 96x64"
    assert f"{path}: the {name} stream changes frame size: {keyframe}" in message
    assert "re-encode the file at one size" in message


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_keyframes_of_one_size_with_other_headers_are_decoded_once(tmp_path: Path, codec: str, monkeypatch) -> None:
    """Parts of one size encoded with other settings carry other sequence headers: the first keyframe of each other
    headers is decoded, once, and the file is indexed."""
    from lerobot_dali import keyframe_sizes

    decoded: list[tuple[int, int] | None] = []
    original = keyframe_sizes._decoded_size
    monkeypatch.setattr(keyframe_sizes, "_decoded_size", lambda *args: decoded.append(original(*args)) or decoded[-1])
    other = {"h264": {"profile": "main"}, "av1": {"svtav1-params": "film-grain=8"}}[codec]
    parts = [_encode(tmp_path / f"{i}.mp4", codec, options) for i, options in enumerate(({}, other, other))]
    with av.open(str(parts[0])) as first, av.open(str(parts[1])) as second:
        assert first.streams.video[0].codec_context.extradata != second.streams.video[0].codec_context.extradata
    index = build_packet_index(concatenate_stream_copy(tmp_path / "all.mp4", parts))
    assert (index.width, index.height, index.frame_count) == (128, 96, 3 * FRAMES)
    assert decoded == [(128, 96)]


def test_in_band_headers_where_the_first_keyframe_has_none_are_checked(tmp_path: Path) -> None:
    """x264 as PyAV opens it keeps its SPS in the extradata; a part whose keyframes repeat theirs (another size)
    stream-copied after it decodes at that size from there on, and is refused."""
    parts = [
        _encode(tmp_path / "small.mp4", "h264", {}, SMALL),
        _encode(tmp_path / "large.mp4", "h264", {"x264-params": "b-adapt=0:repeat-headers=1"}, LARGE),
    ]
    path = tmp_path / "both.mp4"
    with av.open(str(path), "w", format="mp4") as output:
        stream, offset = None, 0
        for part in parts:  # (a plain stream copy: the first part's extradata, each part's packets as they are)
            with av.open(str(part)) as source:
                stream = stream or output.add_stream_from_template(source.streams.video[0])
                packets = [packet for packet in source.demux(video=0) if packet.size]
                for packet in packets:
                    packet.pts, packet.dts, packet.stream = packet.pts + offset, packet.dts + offset, stream
                    output.mux(packet)
                offset += FRAMES * packets[1].duration
    assert [frame.shape[:2] for frame in reference_frames(path).values()] == [SMALL] * FRAMES + [LARGE] * FRAMES
    with pytest.raises(
        VideoDecodeError, match=r"H\.264 stream changes frame size: its keyframe at 0\.333333 s is 128x96"
    ):
        build_packet_index(path)


@pytest.mark.parametrize(("codec", "headers"), [("h264", 2), ("hevc", 0), ("av1", 2)])
def test_sequence_headers_found_in_concatenated_encoder_output(tmp_path: Path, codec: str, headers: int) -> None:
    """SVT-AV1 repeats its sequence header in every keyframe; x264 (as PyAV opens it) keeps its SPS in the extradata,
    but the concat demuxer puts each part's in every keyframe of it; x265's stay in the extradata, and the
    concatenation keeps the first part's alone. Each header found is the whole unit: the two encodes' differ."""
    with av.open(str(_resized(tmp_path, codec, check=False))) as container:
        stream = container.streams.video[0]
        layout = nal_layout(stream.codec_context.codec.canonical_name, stream.codec_context.extradata)
        keys = [bytes(packet) for packet in container.demux(stream) if packet.size and packet.is_keyframe]
    found = [
        keyframe_sequence_headers(codec, lambda start, length, key=key: key[start : start + length], len(key),
                                  length_size=layout.length_size if layout else 4)
        for key in keys
    ]  # fmt: skip
    assert len(keys) == FRAMES
    if headers:
        assert all(len(unit) == 1 for unit in found)
        assert len(set(found[: FRAMES // 2])) == len(set(found[FRAMES // 2 :])) == 1 and found[0] != found[-1]
    else:
        assert set(found) == {()}


def test_an_index_demuxed_refuses_it_too(resized_vp9: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packet_index_module, "read_mp4_tracks", lambda handle, size: None)  # (Matroska's route)
    monkeypatch.setattr(packet_index_module, "_local_reads", lambda handle: None)  # (the demuxed heads tell)
    with pytest.raises(VideoDecodeError, match="changes frame size"):
        build_packet_index(resized_vp9)


@pytest.mark.parametrize("codec", ["vp9", "h264", "av1"])
def test_a_clip_checks_the_keyframes_a_remote_index_did_not_read(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote file's index reads its first packets only; each clip for DALI (VP9 on the CPU, the rest on NVDEC)
    checks its keyframes before DALI decodes them."""
    path = _resized(tmp_path, codec)
    monkeypatch.setattr(packet_index_module, "_local_reads", lambda handle: None)  # (a remote file)
    index = build_packet_index(path)  # (its sample tables and first packets: the change is not among them)
    assert (index.width, index.height) == SMALL[::-1]
    assert not index.keyframe_sizes_checked
    assert build_clip(path, index, [3]).frame_count == 2  # (keyframe 2, frame 3: the first part's size)
    with pytest.raises(VideoDecodeError, match=r"keyframe at 0\.400000 s is 128x96 \(WxH\), the stream 96x64"):
        build_clip(path, index, [FRAMES + 3])


@pytest.mark.parametrize("codec", ["vp9", "h264", "av1"])
def test_a_clip_of_an_index_that_checked_every_keyframe_is_not_checked_again(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, every clip's keyframes were checked (~30 us a clip) though a local file's index had judged them all;
    a remote file's index (its first packets only) still has each clip checked."""
    path = _part(tmp_path / "one_size.mp4", 0, LARGE, codec)
    checked: list[list[float]] = []
    check = clips_module.check_clip_keyframe_sizes

    def recording(template: bytes, codec: str, keyframes: list[tuple[float, bytes]], **kwargs: object) -> None:
        checked.append([seconds for seconds, _ in keyframes])
        check(template, codec, keyframes, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(clips_module, "check_clip_keyframe_sizes", recording)
    local = build_packet_index(path)
    assert local.keyframe_sizes_checked
    assert build_clip(path, local, [3]).frame_count == 2
    assert checked == []
    monkeypatch.setattr(packet_index_module, "_local_reads", lambda handle: None)  # (a remote file)
    remote = build_packet_index(path)
    assert not remote.keyframe_sizes_checked
    assert build_clip(path, remote, [3]).frame_count == 2
    assert checked == [[pytest.approx(2 / FPS)]]  # (keyframe 2's, shown at 2/FPS s)


def test_a_vp9_stream_of_one_size_is_indexed(resized_vp9: Path) -> None:
    path = resized_vp9.parent / "large.mp4"
    index = build_packet_index(path)
    assert (index.width, index.height, index.frame_count) == (128, 96, FRAMES)
    assert build_clip(path, index, [FRAMES - 1]).frame_count == 2


@pytest.mark.parametrize("codec", ["vp9", "h264"])  # (DALI's CPU decoder; PyAV's route)
def test_the_iterator_refuses_a_camera_file_that_changes_size_when_built(
    make_ds, copy_ds, tmp_path: Path, codec: str
) -> None:
    """Before, the iterator was built, and a worker failed only when a batch first reached the larger frames: DALI's
    CPU decoder with "Could not convert frame data" (VP9), PyAV's route with "a damaged stream header ... or a stream
    that changes size" (H.264)."""
    from lerobot_dali import DALILeRobotIterator

    root = copy_ds(make_ds(episodes=2, frames_per_episode=FRAMES, cameras=1, codec=codec, size=SMALL, fps=FPS))
    path = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    parts = [_part(tmp_path / "small.mp4", 0, SMALL, codec), _part(tmp_path / "large.mp4", 1, LARGE, codec)]
    concatenate_stream_copy(path, parts)  # (episode 1 recorded at another size, then the files concatenated)
    with pytest.raises(VideoDecodeError, match=r"file-000\.mp4: the .* stream changes frame size: its keyframe at "):
        DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0)
