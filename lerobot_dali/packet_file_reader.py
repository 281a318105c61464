"""The CPU fallback's reader of a local MP4: its planned packets read by byte range, decoded from them alone.

The file's packet index (:mod:`.packet_index`) already holds each packet's byte range, so a file needs no demuxer:
one file descriptor, read with ``pread`` (no shared offset, no buffer), and a decoder opened from the stream template
(:class:`~.packet_decoder.PacketDecoder`). An open container kept FFmpeg's sample tables of the whole file besides
(~1.4 MB for 30,000 frames): ~1.9 MB per open 64x64 H.264 file against ~0.9 MB so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import av
import numpy as np

from .clips import packets_read_at, plan_clip
from .errors import VideoDecodeError, missing_video
from .open_files import out_of_files
from .packet_decoder import PacketDecoder
from .packet_index import PacketIndex

__all__ = ["REORDER_LOOKAHEAD", "PacketFileReader"]

#: Packets read past each run's last needed one: the most pictures an H.264 or HEVC decoder may hold back to
#: reorder (16). Read in the run's one ``pread``; only those the decoder needs before the frames come out are decoded.
REORDER_LOOKAHEAD = 16


class PacketFileReader:
    """One local MP4 (``index.byte_exact``) open as a file descriptor, its packets decoded by a PacketDecoder."""

    def __init__(self, path: str, index: PacketIndex, *, threads: int, label: str) -> None:
        self.label = label
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)  # (not inherited by processes started from here)
        except FileNotFoundError as e:
            raise missing_video(label) from e
        except OSError as e:
            raise out_of_files(e) or VideoDecodeError(f"{label}: cannot open the video ({e}).") from e
        try:
            size = os.fstat(self._fd).st_size
            if size != index.file_size_bytes:
                raise VideoDecodeError(
                    f"{label}: the file has {size} bytes but its packet index was built from {index.file_size_bytes}: "
                    "it changed since it was indexed; re-open the dataset (or rerun) to index it again."
                )
            self._decoder = PacketDecoder(index, threads=threads)
        except BaseException:
            self.close()
            raise

    def frames_at(
        self, index: PacketIndex, frame_indices: np.ndarray, convert: Callable[[av.VideoFrame], Any]
    ) -> dict[int, Any]:
        """``convert(frame)`` of each of display frames ``frame_indices``, keyed by its pts in ``index``.

        Each run's packets go on past its last needed one (:data:`REORDER_LOOKAHEAD`) and are fed only until the
        frames come out, as from an open file: drained at the run's end instead, the decoder showed a damaged
        file's P-frame as the display frame its timestamps claim (the B-frames that display before it never fed)."""
        plan = plan_clip(index, frame_indices, lookahead=REORDER_LOOKAHEAD)
        payloads = packets_read_at(self._read_at, index, plan)
        by_rank = self._decoder.frames_at(index, plan, payloads, convert)
        clip_pts = np.sort(index.pts[plan.packet_positions])
        return {int(clip_pts[rank]): value for rank, value in by_rank.items()}

    def _read_at(self, offset: int, length: int) -> bytes:
        if self._fd is None:
            raise ValueError(f"{self.label}: read after close().")
        try:
            return os.pread(self._fd, length, offset)
        except OSError as e:
            raise VideoDecodeError(f"{self.label}: reading {length} bytes at offset {offset} failed ({e}).") from e

    def close(self) -> None:
        decoder = getattr(self, "_decoder", None)
        if decoder is not None:
            decoder.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
