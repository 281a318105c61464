"""The frame rate `lerobot-dali info` reports for a video, read from its packet index."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.video_probe import describe_index


def _write(
    path: Path, *, rate: Fraction, frames: int, drop: tuple[int, ...] = (), jitter_ms: tuple[int, ...] = (0,)
) -> Path:
    """A VP9 Matroska video (millisecond times) whose frame i lies at i / rate s, plus ``jitter_ms`` in turn after
    the first."""
    source = path.with_suffix(".src.mp4")
    pictures = (np.full((16, 16, 3), 8 * i % 256, np.uint8) for i in range(frames))
    encode_video(source, pictures, fps=30, codec="vp9", gop=frames)
    with av.open(str(source)) as src, av.open(str(path), "w", format="matroska") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for i, packet in enumerate(p for p in src.demux(video=0) if p.size):
            if i in drop:
                continue
            seconds = Fraction(i) / rate + Fraction(jitter_ms[i % len(jitter_ms)] * (i > 0), 1000)
            packet.pts = packet.dts = round(seconds / src.streams.video[0].time_base)
            packet.stream = stream
            dst.mux(packet)
    return path


@pytest.mark.parametrize(
    ("rate", "frames", "drop"),
    [
        (Fraction(30), 90, ()),
        (Fraction(60), 90, ()),
        (Fraction(25), 50, ()),
        (Fraction(30000, 1001), 120, ()),
        (Fraction(30), 90, (10, 11, 50)),  # dropped frames leave the rate as it is
    ],
)
def test_millisecond_timestamps_give_the_video_rate(tmp_path: Path, rate: Fraction, frames: int, drop) -> None:
    index = build_packet_index(_write(tmp_path / "video.mkv", rate=rate, frames=frames, drop=drop))
    assert index.time_base == Fraction(1, 1000)
    assert describe_index(index).fps == round(float(rate), 6)


def test_irregular_frames_give_the_typical_interval(tmp_path: Path) -> None:
    index = build_packet_index(_write(tmp_path / "video.mkv", rate=Fraction(30), frames=60, jitter_ms=(7, 19, 11)))
    found = describe_index(index).fps
    assert found == round(1.0 / index.frame_interval_s, 6) and abs(found - 30) > 0.1
