"""A VP9 stream may change frame size at any keyframe: a stream copy of videos of several sizes into one file (as
LeRobot's v3.0 concatenation makes) is such a stream. One camera's batches need one size, and DALI's CPU decoder
fails on the new size ("Could not convert frame data") or decodes it wrongly, so the packet index refuses such a
file when it is built, naming the keyframe and both sizes, and each clip for DALI checks its keyframes (a remote
file's index reads only some)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali import packet_index as packet_index_module
from lerobot_dali.clips import build_clip
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.vp9_frame_size import vp9_keyframe_size
from tests.video_fixtures import FPS, concatenate_stream_copy, reference_frames

FRAMES = 10  # per part
SMALL, LARGE = (64, 96), (96, 128)  # (height, width)


def _part(path: Path, episode: int, size: tuple[int, int]) -> Path:
    encode_video(path, [draw_marker(episode, f, *size) for f in range(FRAMES)], fps=FPS, codec="vp9", gop=2)
    return path


@pytest.fixture(scope="module")
def resized_vp9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vp9_size_change")
    parts = [_part(folder / "small.mp4", 0, SMALL), _part(folder / "large.mp4", 1, LARGE)]
    path = concatenate_stream_copy(folder / "both.mp4", parts)
    sizes = [frame.shape[:2] for frame in reference_frames(path).values()]
    assert sizes == [SMALL] * FRAMES + [LARGE] * FRAMES  # (what FFmpeg decodes: else this file tests nothing)
    return path


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


def test_the_index_refuses_a_vp9_stream_that_changes_size(resized_vp9: Path) -> None:
    with pytest.raises(VideoDecodeError) as caught:
        build_packet_index(resized_vp9)
    message = str(caught.value)
    assert str(resized_vp9) in message
    assert f"keyframe at {FRAMES / FPS:.6f} s is 128x96 (WxH), the stream 96x64" in message
    assert "re-encode the file at one size" in message


def test_an_index_demuxed_refuses_it_too(resized_vp9: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packet_index_module, "read_mp4_tracks", lambda handle, size: None)  # (Matroska's route)
    monkeypatch.setattr(packet_index_module, "_reads_are_local", lambda handle: False)  # (the demuxed heads tell)
    with pytest.raises(VideoDecodeError, match="changes frame size"):
        build_packet_index(resized_vp9)


def test_a_clip_checks_the_keyframes_a_remote_index_did_not_read(
    resized_vp9: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packet_index_module, "_reads_are_local", lambda handle: False)  # (a remote file)
    index = build_packet_index(resized_vp9)  # (its sample tables and first packets: the change is not among them)
    assert (index.width, index.height) == SMALL[::-1]
    assert build_clip(resized_vp9, index, [3]).frame_count == 2  # (keyframe 2, frame 3: the first part's size)
    with pytest.raises(VideoDecodeError, match=r"keyframe at 0\.400000 s is 128x96 \(WxH\), the stream 96x64"):
        build_clip(resized_vp9, index, [FRAMES + 3])


def test_a_vp9_stream_of_one_size_is_indexed(resized_vp9: Path) -> None:
    index = build_packet_index(resized_vp9.parent / "large.mp4")
    assert (index.width, index.height, index.frame_count) == (128, 96, FRAMES)


def test_the_iterator_refuses_a_camera_file_that_changes_size_when_built(make_ds, copy_ds, tmp_path: Path) -> None:
    """Before, the iterator was built and DALI's CPU decoder failed on the larger frames in a worker with "Could not
    convert frame data" (or decoded them wrongly), only when a batch first reached them."""
    from lerobot_dali import DALILeRobotIterator

    root = copy_ds(make_ds(episodes=2, frames_per_episode=FRAMES, cameras=1, codec="vp9", size=SMALL, fps=FPS))
    path = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    parts = [_part(tmp_path / "small.mp4", 0, SMALL), _part(tmp_path / "large.mp4", 1, LARGE)]
    concatenate_stream_copy(path, parts)  # (episode 1 recorded at another size, then the files concatenated)
    with pytest.raises(VideoDecodeError, match=r"file-000\.mp4: the VP9 stream changes frame size: its keyframe at "):
        DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0)
