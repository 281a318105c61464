"""What a video file really holds (codec, size, frame rate, GOP, B-frames), read from its packets.

``info.json`` can be wrong (``r1_v30_h264`` declares 10 fps for a 25 fps video), and the decode route
depends on the true codec, so routing and ``lerobot-dali info`` ask the file. Only packet headers are read;
nothing is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

import av
import numpy as np

from .errors import VideoDecodeError

__all__ = ["VideoProbe", "probe_video"]


@dataclass(frozen=True)
class VideoProbe:
    codec: str
    width: int
    height: int
    fps: float | None
    pix_fmt: str | None
    #: Largest distance in frames between keyframes among the packets read (``None`` if only one keyframe).
    gop_frames: int | None
    #: Presentation order differs from decode order (B-frames): clips must be cut at keyframes by pts.
    has_b_frames: bool
    packets_read: int


def probe_video(file: str | IO[bytes], *, name: str | None = None, max_packets: int = 600) -> VideoProbe:
    """Probe the first video stream of ``file`` (a path or a binary file object) from its first packets."""
    label = name or (file if isinstance(file, str) else getattr(file, "path", repr(file)))
    try:
        with av.open(file, mode="r") as container:
            if not container.streams.video:
                raise VideoDecodeError(f"{label}: no video stream")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            pts: list[int] = []
            keys: list[bool] = []
            for packet in container.demux(stream):
                if packet.size == 0 or packet.pts is None:
                    continue
                pts.append(packet.pts)
                keys.append(packet.is_keyframe)
                if len(pts) >= max_packets:
                    break
            rate = stream.average_rate or stream.guessed_rate
            return VideoProbe(
                codec=ctx.codec.canonical_name,
                width=ctx.width,
                height=ctx.height,
                fps=float(rate) if rate else None,
                pix_fmt=ctx.pix_fmt,
                gop_frames=_gop(np.asarray(pts), np.asarray(keys, dtype=bool)),
                has_b_frames=bool(len(pts) > 1 and (np.diff(pts) < 0).any()),
                packets_read=len(pts),
            )
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{label}: cannot read the video ({e})") from e


def _gop(pts: np.ndarray, keys: np.ndarray) -> int | None:
    if pts.size == 0:
        return None
    display_rank = np.argsort(np.argsort(pts, kind="stable"), kind="stable")
    key_positions = np.sort(display_rank[keys])
    if key_positions.size < 2:
        return None
    return int(np.diff(key_positions).max())
