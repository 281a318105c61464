"""Read-through view of a remote filesystem that serves bytes from the prefetch cache when it has them.

DALI workers open data and video files through this wrapper. A read is split at cached-entry boundaries:
covered parts come from local files, gaps from the remote file (opened lazily, so a read that the cache
covers makes no request at all). File sizes come from the dataset's file stamps, so a cached open needs no
metadata request either.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec

from . import io_stats
from .errors import DataFileError
from .file_stamps import FileStamp, FileStamps
from .range_cache import entry_dir, list_entries
from .said_once import warn_once
from .url_secrets import masked, masking

__all__ = ["CachedFileSystem", "CachedRangeFile", "cache_version"]

logger = masking(logging.getLogger(__name__))  # (paths that keep a URL's query name it masked)

#: What :attr:`CachedFileSystem.counters` counts: reads served locally or remotely, and their bytes.
COUNTERS = ("cached_reads", "cached_bytes", "remote_reads", "remote_bytes")

#: Read-ahead of the remote handle used for gaps (the same bound :mod:`dataset_location` uses).
GAP_READ_AHEAD_BYTES = 4 * 1024 * 1024


def cache_version(size: int, version: str) -> str:
    """The cache's name for one content of a file: its size and its etag/blob id/mtime."""
    return f"{size}:{version}"


class CachedRangeFile(io.RawIOBase):
    """A read-only file over ``fs`` whose reads prefer entries of the range cache under ``folder``; what the
    cache lacks is read remotely ``block_size`` bytes ahead."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        size: int,
        folder: Path,
        counters: dict[str, int],
        *,
        block_size: int = GAP_READ_AHEAD_BYTES,
    ):
        super().__init__()
        self.fs, self.path, self.size, self._folder = fs, path, size, folder
        self._block_size = block_size
        self._pos = 0
        self._entries = list_entries(folder)
        self._local: tuple[Path, Any] | None = None  # one open entry: a long-lived file must not hold many
        self._remote: Any = None
        self._counters = counters

    # -- io.RawIOBase --------------------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence!r}")
        if base + offset < 0:
            raise ValueError(masked(f"negative seek position {base + offset} in {self.path}"))
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def read(self, size: int | None = -1) -> bytes:
        stop = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        parts: list[bytes] = []
        position = self._pos
        while position < stop:
            part = self._read_cached(position, stop)
            if part is None:
                part = self._read_remote(position, self._gap_end(position, stop))
            if not part:  # the remote file ends before the size it was listed with
                said = (
                    f"{self.path} ends at byte {position}, but the dataset listed it with {self.size} bytes: it "
                    "changed on the remote since the dataset was opened; open the dataset again to read it as it is now"
                )
                raise DataFileError(masked(said))
            parts.append(part)
            position += len(part)
        self._pos = position
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            if self._local is not None:
                self._local[1].close()
                self._local = None
            if self._remote is not None:
                self._remote.close()
            super().close()

    # -- internals -----------------------------------------------------------------------------------------
    def _covering(self, position: int) -> tuple[int, int, Path] | None:
        for start, end, file in self._entries:
            if start <= position < end:
                return start, end, file
            if start > position:
                break
        return None

    def _read_cached(self, position: int, stop: int) -> bytes | None:
        entry = self._covering(position)
        if entry is None:
            self._entries = list_entries(self._folder)  # the prefetcher may have added it since
            entry = self._covering(position)
            if entry is None:
                return None
        start, end, file = entry
        try:
            if self._local is None or self._local[0] != file:
                if self._local is not None:  # (an evicted entry's open handle would keep its disk space)
                    self._local[1].close()
                    self._local = None
                self._local = (file, open(file, "rb"))  # noqa: SIM115 (closed on the next entry or in close())
            handle = self._local[1]
            handle.seek(position - start)
            data = handle.read(min(end, stop) - position)
        except FileNotFoundError:  # evicted between listing and opening
            self._entries = list_entries(self._folder)
            return None
        if len(data) != min(end, stop) - position:  # cut short on disk: the remote file has the bytes
            _warn_short_entry(file, end - start)
            self._local[1].close()
            self._local = None
            return None
        self._counters["cached_reads"] += 1
        self._counters["cached_bytes"] += len(data)
        io_stats.add("cache_hit_bytes", len(data))
        return data

    def _gap_end(self, position: int, stop: int) -> int:
        following = [start for start, _, _ in self._entries if start > position]
        return min([stop, *following])

    def _read_remote(self, start: int, end: int) -> bytes:
        if self._remote is None:
            self._remote = self.fs.open(
                self.path, "rb", block_size=self._block_size, cache_type="readahead", size=self.size
            )  # a known size spares HTTP's HEAD per open
        self._remote.seek(start)
        data = self._remote.read(end - start)
        self._counters["remote_reads"] += 1
        self._counters["remote_bytes"] += len(data)
        io_stats.add("cache_miss_bytes", len(data))
        return bytes(data)


def _from_end(bound: int | None, size: int, default: int) -> int:
    """``bound`` of a ``cat_file`` range as a position in a file of ``size`` bytes: negative counts from the end."""
    if bound is None:
        return default
    return bound if bound >= 0 else max(0, size + bound)


def _warn_short_entry(file: Path, size: int) -> None:
    warn_once(logger, "prefetch cache entry %s holds fewer than its %d bytes; reading the range remotely", file, size)


class CachedFileSystem(fsspec.AbstractFileSystem):
    """``fs`` with binary reads served from the range cache in ``directory`` where it holds the bytes.

    ``stamps`` maps a path to its identity (``.size``, ``.version``): the dataset's listing, or by default a
    :class:`~lerobot_dali.file_stamps.FileStamps` of ``fs`` that stamps each path with one memoised ``info``.
    Pickles as its arguments, for spawned DALI workers.
    """

    protocol = "lerobot-dali-cached"
    cachable = False

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        directory: str | os.PathLike[str],
        stamps: Mapping[str, FileStamp] | None = None,
    ) -> None:
        super().__init__(fs, directory, stamps)
        self.fs = fs
        self.protocol = fs.protocol  # same URLs as the wrapped fs: packet-index store keys must agree
        self.directory = os.fspath(directory)
        # Without stamps from the dataset, FileStamps stamps each path with one memoised info request.
        self.stamps: Mapping[str, FileStamp] = stamps if stamps is not None else FileStamps(fs)
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CachedFileSystem, (self.fs, self.directory, self.stamps))

    def __repr__(self) -> str:
        return f"CachedFileSystem({self.fs!r}, cache={self.directory})"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return path

    def unstrip_protocol(self, name: str) -> str:
        return str(self.fs.unstrip_protocol(name))

    def identity(self, path: str) -> tuple[int, str]:
        """``(size, cache version)`` of ``path``, from the stamps (one metadata request if not listed)."""
        stamp = self.stamps[path]
        return int(stamp.size), cache_version(int(stamp.size), str(stamp.version))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        """Reads through the cache; a ``block_size`` given (video files: small) is the read-ahead of what it lacks
        (always read ahead: a ``cache_type`` given is not used)."""
        if mode != "rb":
            return self.fs.open(path, mode, **kwargs)
        size, version = self.identity(path)
        folder = entry_dir(self.directory, path, version)
        block_size = kwargs.get("block_size") or GAP_READ_AHEAD_BYTES
        return CachedRangeFile(self.fs, path, size, folder, self.counters, block_size=block_size)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes ``[start, end)`` of ``path``; a negative ``start`` or ``end`` counts from the end (as in fsspec)."""
        with self.open(path, "rb") as f:
            first, stop = (_from_end(bound, f.size, default) for bound, default in ((start, 0), (end, f.size)))
            f.seek(first)
            return bytes(f.read(max(0, stop - first)))

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.fs.info(path, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self.fs.exists(path, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.fs.ls(path, detail=detail, **kwargs)

    def glob(self, path: str, **kwargs: Any) -> Any:
        return self.fs.glob(path, **kwargs)

    def size(self, path: str) -> int:
        return self.identity(path)[0]

    def ukey(self, path: str) -> Any:
        return self.fs.ukey(path)
