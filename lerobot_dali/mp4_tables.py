"""MP4 sample tables (ISO/IEC 14496-12): the per-track facts FFmpeg's demuxer index does not expose.

Reading only the top-level box headers and ``moov`` lets the packet index take every packet's timestamps
from the file's own tables instead of demuxing the whole file (what makes indexing a remote file cheap).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

__all__ = ["Mp4Track", "read_mp4_tracks"]

# Largest moov box read into memory; real moov boxes are about 20 bytes per sample.
_MAX_MOOV_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Mp4Track:
    """What the packet index needs from one ``trak`` that FFmpeg's demuxer index does not expose."""

    track_id: int
    sample_count: int
    #: ``ctts`` run lengths and composition offsets (signed, as FFmpeg reads both box versions).
    ctts_counts: np.ndarray
    ctts_offsets: np.ndarray
    #: Whether the movie has fragments (``mvex``): samples then live outside ``moov``.
    fragmented: bool

    def composition_offsets(self) -> np.ndarray | None:
        """Each sample's composition offset (zeros without ``ctts``), or None when ``ctts`` does not fit."""
        if len(self.ctts_counts) == 0:
            return np.zeros(self.sample_count, dtype=np.int64)
        if int(self.ctts_counts.sum()) != self.sample_count:
            return None
        return np.repeat(self.ctts_offsets, self.ctts_counts)


def read_mp4_tracks(handle: IO[bytes], file_size: int) -> dict[int, Mp4Track] | None:
    """The tracks of an MP4/MOV file by track id, reading only top-level box headers and ``moov``.

    Returns None when ``handle`` does not hold an MP4 box structure with a ``moov`` box.
    """
    position = 0
    while position + 8 <= file_size:
        handle.seek(position)
        header = handle.read(16)
        if len(header) < 8:
            return None
        size, kind = struct.unpack(">I4s", header[:8])
        header_size = 8
        if size == 1:
            if len(header) < 16:
                return None
            size, header_size = struct.unpack(">Q", header[8:16])[0], 16
        elif size == 0:
            size = file_size - position
        if not kind.isalnum() or size < header_size:
            return None
        if kind == b"moov":
            if size > _MAX_MOOV_BYTES or position + size > file_size:
                return None
            handle.seek(position + header_size)
            payload = handle.read(size - header_size)
            return _parse_moov(payload) if len(payload) == size - header_size else None
        position += size
    return None


def _child_boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in ``data[start:end]``; stops at a malformed box."""
    position = start
    while position + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, position)
        header_size = 8
        if size == 1 and position + 16 <= end:
            size, header_size = struct.unpack_from(">Q", data, position + 8)[0], 16
        elif size == 0:
            size = end - position
        if size < header_size or position + size > end:
            return
        yield kind, position + header_size, position + size
        position += size


def _find_box(data: bytes, start: int, end: int, path: tuple[bytes, ...]) -> tuple[int, int] | None:
    for kind, child_start, child_end in _child_boxes(data, start, end):
        if kind == path[0]:
            return (child_start, child_end) if len(path) == 1 else _find_box(data, child_start, child_end, path[1:])
    return None


def _parse_moov(data: bytes) -> dict[int, Mp4Track] | None:
    fragmented = _find_box(data, 0, len(data), (b"mvex",)) is not None
    tracks: dict[int, Mp4Track] = {}
    for kind, start, end in _child_boxes(data, 0, len(data)):
        if kind != b"trak":
            continue
        tkhd = _find_box(data, start, end, (b"tkhd",))
        stbl = _find_box(data, start, end, (b"mdia", b"minf", b"stbl"))
        if tkhd is None or stbl is None:
            return None
        track_id_at = tkhd[0] + (20 if data[tkhd[0]] == 1 else 12)
        (track_id,) = struct.unpack_from(">I", data, track_id_at)
        sample_count = _sample_count(data, *stbl)
        if sample_count is None:
            return None
        counts, offsets = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ctts = _find_box(data, *stbl, (b"ctts",))
        if ctts is not None:
            (entries,) = struct.unpack_from(">I", data, ctts[0] + 4)
            if ctts[0] + 8 + 8 * entries > ctts[1]:
                return None
            table = np.frombuffer(data, dtype=">i4", count=2 * entries, offset=ctts[0] + 8).reshape(-1, 2)
            counts = table[:, 0].astype(np.uint32).astype(np.int64)
            offsets = table[:, 1].astype(np.int64)
        tracks[track_id] = Mp4Track(track_id, sample_count, counts, offsets, fragmented)
    return tracks


def _sample_count(data: bytes, start: int, end: int) -> int | None:
    for kind in (b"stsz", b"stz2"):
        box = _find_box(data, start, end, (kind,))
        if box is not None and box[0] + 12 <= box[1]:
            return int(struct.unpack_from(">I", data, box[0] + 8)[0])
    return None
