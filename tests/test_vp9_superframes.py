"""VP9 with hidden alt-ref frames: libvpx's two-pass encodes pack a hidden frame (decoded, never shown) with a shown
one into a superframe, one packet and one timestamp. Every route must count the packet as one frame and show the
shown one. PyAV's encoder writes no superframes in one pass and cannot run two (FFmpeg's ``stats_out`` is not
exposed), so the videos are made by an ``ffmpeg`` binary with libvpx where one is on PATH (skipped elsewhere, as in
CI's image): 40 marker frames (episode 0, frame i; 96x64, 30 fps), GOP 10, alt-ref on, in MP4 and WebM. Run here
with FFmpeg 5.1.9 and libvpx 1.12 (Debian 12): 4 superframes per file, every route right.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali.clips import build_clip, plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.frame_marker import draw_marker, read_marker
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.pyav_reader import PyAvReader

FRAMES = 40
WINDOWS = [np.array([f]) for f in range(FRAMES)] + [
    np.array(w) for w in ([9, 10, 11], [39, 0, 20, 20], [3, 17, 31], [12, 8, 25, 29, 30], [38, 39])
]


def _superframes(path: Path) -> int:
    """Packets ending in a VP9 superframe index (its marker byte 0b110xxxxx, repeated at the index's start)."""
    count = 0
    with av.open(str(path)) as container:
        for packet in container.demux(video=0):
            data = bytes(packet)
            if data and data[-1] & 0xE0 == 0xC0:
                size = 2 + ((data[-1] >> 3 & 3) + 1) * ((data[-1] & 7) + 1)
                count += len(data) >= size and data[-size] == data[-1]
    return count


def _decode_all(source: Path | io.BytesIO) -> list[np.ndarray]:
    with av.open(source if isinstance(source, io.BytesIO) else str(source)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.fixture(scope="module")
def frames_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.skip("needs an ffmpeg binary with libvpx for two-pass VP9 (PyAV's encoder writes no superframes)")
    raw = tmp_path_factory.mktemp("superframes") / "frames.rgb"
    raw.write_bytes(b"".join(draw_marker(0, i, 64, 96).tobytes() for i in range(FRAMES)))
    return raw


@pytest.fixture(params=["mp4", "webm"])
def video(request: pytest.FixtureRequest, frames_file: Path) -> Path:
    path = frames_file.with_name(f"vp9_superframes.{request.param}")
    if not path.exists():
        command = [shutil.which("ffmpeg") or "ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo"]
        command += ["-pix_fmt", "rgb24", "-s", "96x64", "-r", "30", "-i", str(frames_file), "-c:v", "libvpx-vp9"]
        command += ["-b:v", "200k", "-g", "10", "-passlogfile", str(frames_file.with_suffix(""))]
        first = [*command, "-pass", "1", "-f", "null", os.devnull]
        second = [*command, "-auto-alt-ref", "1", "-lag-in-frames", "25", "-pass", "2", "-pix_fmt", "yuv420p"]
        second.append(str(path))
        for run in (first, second):
            done = subprocess.run(run, capture_output=True, text=True, check=False)
            if done.returncode:
                pytest.skip(f"ffmpeg cannot encode two-pass VP9 here: {done.stderr.strip()[-200:]}")
    assert _superframes(path) > 0  # (else this file tests nothing one-pass files do not)
    return path


def test_superframes_are_one_frame_each_by_every_cpu_route(video: Path) -> None:
    """The index counts 40 frames at i / 30 s (to the ms); each window by the open decoder, the seeking reader, the
    packet decoder, a clip decoded by PyAV and a clip decoded by the CPU route is the full decode's frames, marked
    with the frames asked for."""
    index = build_packet_index(video)
    assert index.frame_count == FRAMES
    assert index.shown_pts_s.tolist() == pytest.approx(np.arange(FRAMES) / 30, abs=5e-4)  # (WebM's time base: 1 ms)
    shown = _decode_all(video)
    assert [read_marker(frame)[1] for frame in shown] == list(range(FRAMES))
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    reader = PyAvReader(video, filesystem=None, threads=1, label=str(video))
    try:
        for window in WINDOWS:
            plan = plan_clip(index, window)
            by_pts = reader.frames_at(index, plan, window, lambda frame: frame.to_ndarray(format="rgb24"))
            clip = build_clip(video, index, window)
            in_clip = _decode_all(io.BytesIO(clip.data.tobytes()))
            assert len(in_clip) == clip.frame_count
            clip_index = build_packet_index(io.BytesIO(clip.data.tobytes()))
            routes = {
                "decode": list(decoder.decode(video, index, window)),
                "seeking reader": [by_pts[int(p)] for p in index.pts_of_frames(window)],
                "packets": list(decoder.decode_packets(index, plan, read_packet_payloads(video, index, plan))),
                "clip": [in_clip[i] for i in clip.relative_indices],
                "clip by the cpu route": list(
                    decoder.decode(io.BytesIO(clip.data.tobytes()), clip_index, clip.relative_indices)
                ),
            }
            for route, frames in routes.items():
                assert len(frames) == len(window), route
                for frame_number, frame in zip(window.tolist(), frames, strict=True):
                    np.testing.assert_array_equal(frame, shown[frame_number], err_msg=f"{route}: {window}")
    finally:
        reader.close()
        decoder.close()


def test_dali_cpu_decodes_superframe_clips_to_the_frames_asked(video: Path) -> None:
    """DALI's CPU decoder (VP9), as CI runs the GPU route's graph: each clip's frames carry the markers asked for."""
    from lerobot_dali.dali_video import decode_clip_batch

    index = build_packet_index(video)
    clips = [build_clip(video, index, window) for window in WINDOWS]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=None)
    for window, frames in zip(WINDOWS, decoded, strict=True):
        assert [read_marker(np.asarray(frame))[1] for frame in frames] == window.tolist()
