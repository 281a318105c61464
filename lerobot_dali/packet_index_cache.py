"""Packet indices kept per process (bounded LRU) and, for stamped files, on disk across processes.

Every request on the video route needs its file's index; building one costs a demux or a ``moov`` read
(a remote round trip), so it is done once per file and process and reused until the file changes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from . import fork_locks
from .concurrent_calls import KeyedLocks
from .errors import missing_video
from .file_stamps import stamp_from_stat
from .packet_index import PacketIndex, build_packet_index, changed_since_listed, check_stored_index
from .url_secrets import masked, masked_key
from .video_source import VideoSource, local_video_path, source_cache_key, source_label, source_url

if TYPE_CHECKING:
    from .dataset_reader import LeRobotDatasetReader, VideoRef
    from .file_stamps import FileStamp
    from .packet_index_store import PacketIndexStore

__all__ = ["PacketIndexCache", "load_packet_index"]


class PacketIndexCache:
    """Bounded LRU of packet indices per process, keyed so that an edited file is indexed again.

    Without a stamp the key is (path, size, mtime) from a stat (one metadata request per call on a remote
    filesystem); with a :class:`~lerobot_dali.file_stamps.FileStamp` computed once by the caller it is
    (URL, stamp) and costs no request, and a miss first tries the on-disk ``store`` shared by all processes.
    Indices are immutable, so a cache inherited through fork stays valid; sources without a stable identity
    (anonymous file objects) are indexed every time.
    """

    def __init__(self, *, max_entries: int = 64, max_bytes: int | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}.")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes!r}.")
        self.max_entries = max_entries
        #: Bound on the indices' own bytes (34-46 a frame: :attr:`PacketIndex.nbytes`); the newest is kept.
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, PacketIndex] = OrderedDict()
        self._bytes = 0
        self._lock = fork_locks.lock()
        self._building = KeyedLocks()  # (a key's, held while one thread loads or builds its index)

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        source: VideoSource,
        *,
        filesystem: Any | None = None,
        stamp: FileStamp | None = None,
        store: PacketIndexStore | None = None,
    ) -> PacketIndex:
        """The index of ``source`` (a path on ``filesystem``, local without one), built on first use.

        ``stamp`` identifies the file's content (see :class:`~lerobot_dali.file_stamps.FileStamps`): no
        metadata request is made. ``store`` (used with a stamp, or for a local file, stamped from its ``stat``) is
        read on a miss and written after a build. Raises what :func:`build_packet_index` raises.
        """
        if stamp is None and store is not None:
            stamp = _local_stamp(source, filesystem)
        if stamp is None:
            return self._get_unstamped(source, filesystem=filesystem)
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(
                f"a stamp identifies a path; got a {type(source).__name__} source ({source_label(source)})."
            )
        # (The stored entry's name and header: a filesystem that keeps a URL's query in its paths named its token.)
        url = masked_key(source_url(source, filesystem=filesystem))
        key = ("stamped", url, stamp)
        cached = self._lookup(key)
        if cached is not None:
            return cached
        with self._building.held(key):  # (prefetch threads admitting two episodes of one file each built its index)
            cached = self._lookup(key)
            return cached if cached is not None else self._load_or_build(source, filesystem, url, stamp, store)

    def _load_or_build(
        self, source: VideoSource, filesystem: Any | None, url: str, stamp: FileStamp, store: PacketIndexStore | None
    ) -> PacketIndex:
        key = ("stamped", url, stamp)
        recheck = functools.partial(check_stored_index, source, filesystem=filesystem)  # (an entry of an older build)
        index = store.load(url, stamp, recheck=recheck) if store is not None else None
        if store is None:
            index = self._build(source, filesystem, url, stamp)
        elif index is None:
            with store.building(url, stamp):  # (DALI workers and ranks each read the video to index it)
                index = store.load(url, stamp, recheck=recheck)  # (stored by the process that held the lock meanwhile)
                if index is None:
                    index = self._build(source, filesystem, url, stamp)
                    store.save(url, stamp, index)
        self._insert(key, index)
        return index

    @staticmethod
    def _build(source: VideoSource, filesystem: Any | None, url: str, stamp: FileStamp) -> PacketIndex:
        index = build_packet_index(source, filesystem=filesystem)
        if masked(index.source_name) != index.source_name:  # (stored with the index, and named in its errors)
            index = dataclasses.replace(index, source_name=masked(index.source_name))
        if index.file_size_bytes != stamp.size:
            # Byte ranges are cached under the listed stamp and episode times describe the listed file:
            # reading on would mix two versions of it (as RetryingFile refuses to when a reopen finds this).
            raise changed_since_listed(url, index.file_size_bytes, stamp.size)
        return index

    def _get_unstamped(self, source: VideoSource, *, filesystem: Any | None) -> PacketIndex:
        key = source_cache_key(source, filesystem=filesystem)
        if key is not None:
            cached = self._lookup(key)
            if cached is not None:
                return cached
        index = build_packet_index(source, filesystem=filesystem)
        if key is not None:
            self._insert(key, index)
        return index

    def of_episode(
        self, reader: LeRobotDatasetReader, episode_pos: int, camera: str, *, store: PacketIndexStore | None = None
    ) -> tuple[VideoRef, PacketIndex]:
        """Episode ``episode_pos``'s video of ``camera`` and its index, read through the dataset's filesystem with
        the stamp its listing gave the file."""
        video = reader.video(episode_pos, camera)
        return video, self.of_video(reader, video, store=store)

    def of_video(
        self, reader: LeRobotDatasetReader, video: VideoRef, *, store: PacketIndexStore | None = None
    ) -> PacketIndex:
        """The index of ``reader``'s file ``video``, read through the dataset's filesystem with the stamp its
        listing gave the file (a local file's key is a fresh ``stat``: a file changed since is indexed again)."""
        fs, stamp = reader.filesystem_of(video.path), reader.listed_stamp(video.path)
        return self.get(video.path, filesystem=fs, stamp=stamp, store=store)

    def _lookup(self, key: Hashable) -> PacketIndex | None:
        with self._lock:
            index = self._entries.get(key)
            if index is not None:
                self._entries.move_to_end(key)
            return index

    def _insert(self, key: Hashable, index: PacketIndex) -> None:
        with self._lock:
            replaced = self._entries.pop(key, None)
            self._bytes -= replaced.nbytes if replaced is not None else 0
            self._entries[key] = index
            self._bytes += index.nbytes
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
                self._bytes -= self._entries.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the cached indices."""
        return self._bytes

    def __getstate__(self) -> dict[str, Any]:
        return {"max_entries": self.max_entries, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(max_entries=state["max_entries"], max_bytes=state.get("max_bytes"))  # type: ignore[misc]


def _local_stamp(source: VideoSource, filesystem: Any | None) -> FileStamp | None:
    """A local file's stamp from one ``stat``, None for any other source: a worker loads a stored index instead of
    demuxing the file (a 30,000-frame file: 1-4 ms against ~60 ms), each time its bounded cache dropped it."""
    path = local_video_path(source, filesystem=filesystem)
    if path is None:
        return None
    try:
        return stamp_from_stat(os.stat(path))
    except FileNotFoundError as e:
        raise missing_video(source_label(source)) from e
    except OSError:  # (indexed without the store, as a file that cannot be stat'ed was before)
        return None


_DEFAULT_CACHE = PacketIndexCache()


def load_packet_index(
    source: VideoSource,
    *,
    filesystem: Any | None = None,
    stamp: FileStamp | None = None,
    store: PacketIndexStore | None = None,
) -> PacketIndex:
    """The packet index of ``source`` from this process's default cache (built on first use; see
    :meth:`PacketIndexCache.get` for ``stamp`` and ``store``)."""
    return _DEFAULT_CACHE.get(source, filesystem=filesystem, stamp=stamp, store=store)


def load_episode_packet_index(
    reader: LeRobotDatasetReader, episode_pos: int, camera: str, *, store: PacketIndexStore | None = None
) -> tuple[VideoRef, PacketIndex]:
    """:meth:`PacketIndexCache.of_episode` from this process's default cache."""
    return _DEFAULT_CACHE.of_episode(reader, episode_pos, camera, store=store)
