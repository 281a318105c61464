"""What a video file really holds (codec, size, frame rate, GOP, B-frames), read from its packet index.

``info.json`` can be wrong (``r1_v30_h264`` declares 10 fps for a 25 fps video), and the decode route
depends on the true codec, so routing and ``lerobot-dali info`` ask the file. Everything here is derived
from :class:`~lerobot_dali.packet_index.PacketIndex` (container header and packet tables; nothing decoded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .packet_index import PacketIndex

__all__ = ["VideoProbe", "describe_index"]


@dataclass(frozen=True)
class VideoProbe:
    codec: str
    width: int
    height: int
    fps: float | None
    pix_fmt: str | None
    #: Largest distance in displayed frames between keyframes (``None`` with a single keyframe).
    gop_frames: int | None
    #: Presentation order differs from decode order (B-frames): clips must be cut at keyframes by pts.
    has_b_frames: bool
    #: Frames a decode shows (not those the file's edit list hides, which FFmpeg decodes as references only).
    frame_count: int


def describe_index(index: PacketIndex) -> VideoProbe:
    key_positions = np.sort(index.display_rank[index.keyframe])
    gop = int(np.diff(key_positions).max()) if key_positions.size > 1 else None
    return VideoProbe(
        codec=index.codec,
        width=index.width,
        height=index.height,
        fps=_frame_rate(index),
        pix_fmt=index.pix_fmt,
        gop_frames=gop,
        has_b_frames=bool(index.frame_count > 1 and (np.diff(index.pts) < 0).any()),
        frame_count=len(index.shown),
    )


def _frame_rate(index: PacketIndex) -> float | None:
    """The rate on whose grid every frame lies, to one tick of the time base: a whole rate or an NTSC one
    (n * 1000/1001), allowing dropped frames. Matroska/WebM keep milliseconds, so 30 fps frames lie 33 or 34 ms
    apart, and the typical interval alone says 30.303 (60 fps: 58.8). Else the typical interval's rate."""
    if index.frame_count < 2:
        return None
    ticks = (index.frame_pts - index.frame_pts[0]).astype(np.float64)
    tick_s = float(index.time_base)
    typical = 1.0 / index.frame_interval_s
    mean = (index.frame_count - 1) / (ticks[-1] * tick_s)
    for estimate in (mean, typical):
        for nominal in (round(estimate), round(estimate * 1.001) / 1.001):
            if nominal > 0:
                step = 1.0 / (nominal * tick_s)  # ticks per frame
                if np.abs(ticks - np.round(ticks / step) * step).max() <= 1:
                    return round(nominal, 6)
    return round(typical, 6)
