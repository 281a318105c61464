"""VP9 with hidden alt-ref frames: libvpx's two-pass encodes pack a hidden frame (decoded, never shown) with a shown
one into a superframe, one packet and one timestamp. Every route must count the packet as one frame and show the
shown one; PyAV's encoder writes no superframes in one pass, so two small files made once are kept here.

``tests/media/vp9_superframes.{mp4,webm}``: 40 marker frames (episode 0, frame i; 96x64, 30 fps), made with FFmpeg 5.1.9
and libvpx 1.12 (Debian 12): ``ffmpeg -f rawvideo -pix_fmt rgb24 -s 96x64 -r 30 -i frames.rgb -c:v libvpx-vp9
-b:v 200k -g 10 -pass 1 -f null /dev/null``, then the same with ``-auto-alt-ref 1 -lag-in-frames 25 -pass 2
-pix_fmt yuv420p -map_metadata -1 -fflags +bitexact -flags +bitexact`` into each container.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali.clips import build_clip, plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.frame_marker import read_marker
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.pyav_reader import PyAvReader

MEDIA = Path(__file__).parent / "media"
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


@pytest.fixture(params=["mp4", "webm"])
def video(request: pytest.FixtureRequest) -> Path:
    path = MEDIA / f"vp9_superframes.{request.param}"
    assert _superframes(path) == 4  # (else this file tests nothing one-pass files do not)
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
