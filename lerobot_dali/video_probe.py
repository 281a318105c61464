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
    frame_count: int


def describe_index(index: PacketIndex) -> VideoProbe:
    key_positions = np.sort(index.display_rank[index.keyframe])
    gop = int(np.diff(key_positions).max()) if key_positions.size > 1 else None
    return VideoProbe(
        codec=index.codec,
        width=index.width,
        height=index.height,
        fps=round(1.0 / index.frame_interval_s, 6) if index.frame_count > 1 else None,
        pix_fmt=index.pix_fmt,
        gop_frames=gop,
        has_b_frames=bool(index.frame_count > 1 and (np.diff(index.pts) < 0).any()),
        frame_count=index.frame_count,
    )
