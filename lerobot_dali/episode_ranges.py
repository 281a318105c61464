"""The byte ranges of remote files one episode needs: its parquet row groups and its video packets.

This is what prefetch-on-admit copies locally, so it must cover every read a worker makes for the episode
and little else: for parquet, the footer Arrow reads first and the row groups holding the episode's rows;
for each camera, the packets from the keyframe before the episode's first frame to its last packet (the
union of every clip any window of the episode can ask for), never the whole multi-episode file.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import pyarrow.parquet as pq

from . import fork_locks
from .clips import plan_clip
from .concurrent_calls import KeyedLocks
from .dataset_reader import LeRobotDatasetReader
from .episode_rows import damaged_parquet_as, row_group_starts, row_groups_holding
from .errors import DataFileError
from .frame_lookup import episode_frames
from .packet_index import PacketIndex
from .packet_index_cache import PacketIndexCache
from .packet_index_store import PacketIndexStore

__all__ = ["PARQUET_FOOTER_READ_BYTES", "EpisodeRanges", "row_group_spans"]

logger = logging.getLogger(__name__)

#: Arrow's first read of a parquet file is its last 64 KiB (footer and, usually, the whole metadata).
PARQUET_FOOTER_READ_BYTES = 64 * 1024


class EpisodeRanges:
    """``ranges(episode_pos) -> [(path, start, end)]`` for one reader, memoising per-file metadata."""

    def __init__(
        self,
        reader: LeRobotDatasetReader,
        *,
        index_store: PacketIndexStore | None = None,
        max_parquet_files: int = 64,
    ) -> None:
        self.reader = reader
        self._indexes = PacketIndexCache(max_entries=256, max_bytes=512 * 2**20)
        self._store = index_store
        self._lock = fork_locks.lock()
        self._parquet: OrderedDict[str, tuple[int, np.ndarray, np.ndarray]] = OrderedDict()
        self._reading = KeyedLocks()  # (a file's, held while one thread reads its footer)
        self._max_parquet = max_parquet_files
        self._damaged: dict[str, DataFileError] = {}  # (written under the file's KeyedLocks entry)

    def ranges(self, episode_pos: int) -> list[tuple[str, int, int]]:
        return [*self.parquet_ranges(episode_pos), *self.video_ranges(episode_pos)]

    def parquet_ranges(self, episode_pos: int) -> list[tuple[str, int, int]]:
        path = self.reader.data_path(episode_pos)
        size, spans, starts = self._parquet_meta(path)
        episodes = self.reader.episodes
        row_start, length = int(episodes.data_row_start[episode_pos]), int(episodes.length[episode_pos])
        out = [(path, max(0, size - PARQUET_FOOTER_READ_BYTES), size)]
        overlapping = row_groups_holding(starts, row_start, length)
        group_rows = int(starts[overlapping.stop] - starts[overlapping.start])
        if self.reader.rows_stored(path, group_rows, length):
            return out  # workers slice the column store's copy: the footer is all they read of the parquet
        out.extend((path, int(spans[g, 0]), int(spans[g, 1])) for g in overlapping)
        return out

    def video_ranges(self, episode_pos: int) -> list[tuple[str, int, int]]:
        out = []
        for camera in self.reader.camera_keys:
            video, index = self._indexes.of_episode(self.reader, episode_pos, camera, store=self._store)
            span = episode_span(index, video.from_timestamp_s, video.next_from_timestamp_s)
            if span is not None:
                out.append((video.path, *span))
        return out

    def _parquet_meta(self, path: str) -> tuple[int, np.ndarray, np.ndarray]:
        """The file's size, row group byte spans (:func:`row_group_spans`) and starts (:func:`row_group_starts`),
        kept per file."""
        known = self._known_parquet(path)
        if known is not None:
            return known
        with self._reading.held(path):  # (prefetch threads admitting episodes of one file each read its footer)
            known = self._known_parquet(path)
            return known if known is not None else self._read_parquet_meta(path)

    def _known_parquet(self, path: str) -> tuple[int, np.ndarray, np.ndarray] | None:
        with self._lock:
            known = self._parquet.get(path)
            if known is not None:
                self._parquet.move_to_end(path)
            return known

    def _read_parquet_meta(self, path: str) -> tuple[int, np.ndarray, np.ndarray]:
        """The entry of :meth:`_parquet_meta`, read; a damaged file's DataFileError kept, so each of its episodes is
        refused without reading its footer again."""
        damaged = self._damaged.get(path)
        if damaged is not None:
            raise DataFileError(str(damaged)) from damaged
        try:
            with self.reader.open(path) as handle, damaged_parquet_as(DataFileError, path):
                size = int(handle.seek(0, 2))
                handle.seek(0)
                meta = pq.ParquetFile(handle).metadata
            entry = (size, row_group_spans(path, size, meta), row_group_starts(meta))
        except DataFileError as e:
            self._damaged[path] = e
            raise
        with self._lock:
            self._parquet[path] = entry
            while len(self._parquet) > self._max_parquet:
                self._parquet.popitem(last=False)
        return entry


def row_group_spans(path: str, size: int, meta: pq.FileMetaData) -> np.ndarray:
    """Bytes ``[start, end)`` of each row group of parquet file ``path`` (``size`` bytes), one row per group: its
    column chunks from the first one's dictionary (or data) page to the last one's end, as Arrow reckons each chunk.

    A footer whose chunk offsets or sizes do not fit in the file (negative, or reaching past its end: Arrow refuses
    to read those rows too) raises DataFileError naming the file, before any such range is asked of a server.
    """
    spans = np.empty((meta.num_row_groups, 2), dtype=np.int64)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        begins, ends = [], []
        for c in range(group.num_columns):
            column = group.column(c)
            begin, length = column.data_page_offset, column.total_compressed_size
            dictionary = column.dictionary_page_offset if column.has_dictionary_page else None
            if dictionary is not None and 0 < dictionary < begin:  # (Arrow's reckoning, ComputeColumnChunkRange)
                begin = dictionary
            if begin < 0 or length < 0 or begin + length > size:
                raise DataFileError(
                    f"{path}: its parquet footer is damaged: row group {g}'s column {column.path_in_schema!r} claims "
                    f"bytes [{begin}, {begin + length}) of a file of {size} bytes; re-download the file (or re-write "
                    "it from its source)"
                )
            begins.append(begin)
            ends.append(begin + length)
        spans[g] = (min(begins), max(ends)) if begins else (0, 0)
    return spans


def episode_span(index: PacketIndex, from_s: float, to_s: float | None) -> tuple[int, int] | None:
    """Bytes ``[start, end)`` of the packets any clip of frames in ``[from_s, to_s)`` (``to_s``: where the next
    episode of the file starts, None: none does) reads, or None when
    the container's packets are not byte-addressable (non-MP4: those are demuxed, not range-read)."""
    if not index.byte_exact:
        return None
    frames = episode_frames(index, from_s, to_s)
    if not frames:  # no frame inside the span: the first one after its start (or the file's last) instead
        only = min(frames.start, index.shown.stop - 1)
        frames = range(only, only + 1)
    plan = plan_clip(index, np.arange(frames.start, frames.stop))
    positions = plan.packet_positions
    offsets, sizes = index.byte_offset[positions], index.size_bytes[positions]
    return int(offsets.min()), int((offsets + sizes).max())
