"""Packet indexes of remote videos kept on local disk, so no process or run indexes the same file twice.

Indexing a remote file costs a few ranged reads (~200 KB) of its ``moov``; every DALI worker of every rank
of every run would pay that per file. The store keeps each index as a numpy ``.npz`` keyed by the sha256 of
(URL, size, version), so a changed file (new size or etag/blob id) simply misses. Files are written to a
temporary name and renamed into place, so workers and ranks sharing the folder never read half a file;
an unreadable file is logged, deleted and rebuilt. Processes that miss the same index at once (the DALI
workers of a rank, the ranks of a node) take turns on an ``flock`` beside its file
(:meth:`PacketIndexStore.building`): one reads the video, the others load its stored index. A folder that
refuses writes (full, over quota, read-only) is written no more by the process, with one warning. Never
pickle: loading a cache must not run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from .cache_dirs import (
    CACHE_ENV,
    LOCK_FILES,
    TEMP_FILES,
    atomic_file,
    cache_root,
    delete_if_unchanged,
    drop_lock_file,
    folder_refuses,
    lock_file,
    mark_used,
    prune_unused_files,
    wait_for_flock,
)
from .file_stamps import FileStamp
from .literal_parsing import PARSE_LOCK, is_parse_race
from .packet_index import PacketIndex
from .said_once import warn_once

__all__ = ["STORE_FORMAT", "WAIT_S", "PacketIndexStore", "default_packet_index_dir"]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout; files of another version are deleted and rebuilt. 2: ``keyframe`` holds random-access
#: points only, not every flagged sync sample (x264 intra refresh flags P-frames; :mod:`.random_access`). 3: the
#: stream's index in the container (``stream_index``). 4: whether every keyframe's size was checked
#: (``keyframe_sizes_checked``).
STORE_FORMAT = 4

#: Longest a process waits for another that indexes the same video before it indexes it too.
WAIT_S = 300.0
#: Seconds between two looks at a lock another process holds.
_POLL_S = 0.05

_ARRAYS = ("pts", "dts", "byte_offset", "size_bytes", "keyframe")

#: Store folders that refused a write in this process (full, over quota, read-only), and entries that could not be
#: written in one that takes writes: not tried again, so each is warned about once (every store of one folder,
#: a store per reader and worker, shares them).
_REFUSED: set[Path] = set()
_REFUSED_LOCK = threading.Lock()


def default_packet_index_dir() -> Path:
    """``$LEROBOT_DALI_CACHE/packet_index``, else ``~/.cache/lerobot_dali/packet_index``."""
    return cache_root() / "packet_index"


class PacketIndexStore:
    """A folder of packet indexes keyed by (URL, size, version); safe to share between processes and hosts.

    Pickles as its folder, so the main process picks the folder once and workers use the same one.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_packet_index_dir()

    def __repr__(self) -> str:
        return f"PacketIndexStore({str(self.directory)!r})"

    def path_for(self, url: str, stamp: FileStamp) -> Path:
        """The file holding the index of ``url`` at ``stamp`` (two-level fan-out keeps folders small)."""
        digest = hashlib.sha256(json.dumps([url, stamp.size, stamp.version]).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.npz"

    def load(self, url: str, stamp: FileStamp) -> PacketIndex | None:
        """The stored index of ``url`` at ``stamp``, or None when absent or unreadable (then deleted)."""
        path = self.path_for(url, stamp)
        for attempt in range(2):
            read: os.stat_result | None = None
            try:
                with open(path, "rb") as file:
                    read = os.fstat(file.fileno())
                    with PARSE_LOCK, np.load(file, allow_pickle=False) as data:  # (np.load parses headers as Python)
                        index = _decode(data, url, stamp)
                mark_used(path)
                return index
            except FileNotFoundError:
                return None
            except Exception as e:  # a stored index is a shortcut: whatever fails to load it, it is rebuilt from
                # the file (damage reaches zipfile's and numpy's parsers as any type: NotImplementedError for a
                # flipped version)
                if is_parse_race(e):  # another thread's parse collided with ours: the file is fine
                    if attempt == 0:
                        continue
                    logger.debug("packet index cache file %s: %s twice; indexing the video instead", path, e)
                    return None
                logger.warning(
                    "packet index cache file %s is unreadable (%s: %s); deleting it", path, type(e).__name__, e
                )
                try:
                    delete_if_unchanged(path, read)  # (not a good one another process stored meanwhile)
                except OSError as unlink_error:
                    logger.warning("cannot delete %s (%s); it will be overwritten", path, unlink_error)
                return None
        return None

    @contextmanager
    def building(self, url: str, stamp: FileStamp) -> Iterator[None]:
        """Held while this process indexes ``url`` at ``stamp`` (call :meth:`load` again inside: another process
        may have stored it meanwhile). Processes sharing the folder take turns on a lock file beside the entry, so
        the later ones load the first one's index instead of reading the video too (over HTTP, the same requests
        again). A holder that stalls is waited on :data:`WAIT_S` at most (logged), one that dies frees the lock at
        once; a folder where no lock can be made (read-only, refusing writes) is not waited on."""
        path = self.path_for(url, stamp)
        lock_path = lock_file(path)
        lock = None
        if self.directory not in _REFUSED and path not in _REFUSED:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                lock = wait_for_flock(lock_path, ready=path, wait_s=WAIT_S, poll_s=_POLL_S)
            except OSError as e:
                logger.debug("packet index store %s: no lock for %s (%s); indexing without one", self.directory, url, e)
            else:
                if lock is None and not path.exists():
                    logger.warning(
                        "another process has been indexing %s for %.0f s (its lock %s is held); indexing it here too",
                        url, WAIT_S, lock_path,
                    )  # fmt: skip
        try:
            yield
        finally:
            if lock is not None:
                if path.exists():
                    drop_lock_file(path)
                lock.close()

    def prune_unused(self) -> None:
        """Delete the indexes no run has loaded for a while (:func:`~lerobot_dali.cache_dirs.prune_unused_files`):
        files of servers without versions (``run:`` stamps) and of older Hub commits are never loaded again."""
        prune_unused_files(self.directory, "*/*.npz", LOCK_FILES, TEMP_FILES)

    def save(self, url: str, stamp: FileStamp, index: PacketIndex) -> None:
        """Store ``index`` for ``url`` at ``stamp`` atomically; a failed write is logged, never raised, and not
        tried again in this process (nor any write to a folder that refuses them)."""
        path = self.path_for(url, stamp)
        if self.directory in _REFUSED or path in _REFUSED:
            return
        try:
            with atomic_file(path, prefix=f".{path.stem[:16]}.") as tmp:
                arrays: dict[str, Any] = _encode(index, url, stamp)
                np.savez(tmp, allow_pickle=False, **arrays)
        except OSError as e:
            self._write_failed(path, e)

    def _write_failed(self, path: Path, error: OSError) -> None:
        fix = folder_refuses(self.directory, error)
        refused = self.directory if fix is not None else path
        with _REFUSED_LOCK:
            if refused in _REFUSED:  # (another thread's write failed meanwhile)
                return
            _REFUSED.add(refused)
        if fix is None:
            warn_once(logger, "cannot write packet index cache file %s (%s); its video is indexed again", path, error)
            return
        warn_once(
            logger,
            "packet index store: cannot write to %s (%s: %s); each process indexes again each remote video it reads "
            "(a few ranged reads of its header): %s or move the store with $%s",
            self.directory,
            type(error).__name__,
            error,
            fix,
            CACHE_ENV,
        )


def _encode(index: PacketIndex, url: str, stamp: FileStamp) -> dict[str, np.ndarray]:
    return {
        "format": np.array(STORE_FORMAT, dtype=np.int64),
        "url": np.array(url),
        "stamp_size": np.array(stamp.size, dtype=np.int64),
        "stamp_version": np.array(stamp.version),
        "source_name": np.array(index.source_name),
        "codec": np.array(index.codec),
        "width": np.array(index.width, dtype=np.int64),
        "height": np.array(index.height, dtype=np.int64),
        "pix_fmt": np.array("" if index.pix_fmt is None else index.pix_fmt),
        "has_pix_fmt": np.array(index.pix_fmt is not None),
        "time_base": np.array([index.time_base.numerator, index.time_base.denominator], dtype=np.int64),
        "file_size_bytes": np.array(index.file_size_bytes, dtype=np.int64),
        "byte_exact": np.array(index.byte_exact),
        "template": np.frombuffer(index.template, dtype=np.uint8),
        "stream_index": np.array(index.stream_index, dtype=np.int64),
        "keyframe_sizes_checked": np.array(index.keyframe_sizes_checked),
        **{name: np.asarray(getattr(index, name)) for name in _ARRAYS},
    }


def _decode(data: Any, url: str, stamp: FileStamp) -> PacketIndex:
    """The index in an opened ``.npz``; ValueError when it is of another format or for another key."""
    file_format = int(data["format"])
    if file_format != STORE_FORMAT:
        raise ValueError(f"store format {file_format}, this version reads {STORE_FORMAT}")
    stored_key = (str(data["url"]), int(data["stamp_size"]), str(data["stamp_version"]))
    if stored_key != (url, stamp.size, stamp.version):
        raise ValueError(f"the file holds the index of {stored_key}, not of {(url, stamp.size, stamp.version)}")
    numerator, denominator = (int(v) for v in data["time_base"])
    arrays = {name: np.array(data[name]) for name in _ARRAYS}
    if arrays["keyframe"].dtype != np.bool_ or any(arrays[n].dtype != np.int64 for n in _ARRAYS[:-1]):
        raise ValueError("unexpected array types")
    return PacketIndex(
        source_name=str(data["source_name"]),
        codec=str(data["codec"]),
        width=int(data["width"]),
        height=int(data["height"]),
        pix_fmt=str(data["pix_fmt"]) if bool(data["has_pix_fmt"]) else None,
        time_base=Fraction(numerator, denominator),
        file_size_bytes=int(data["file_size_bytes"]),
        byte_exact=bool(data["byte_exact"]),
        template=data["template"].tobytes(),
        stream_index=int(data["stream_index"]),
        keyframe_sizes_checked=bool(data["keyframe_sizes_checked"]),
        **arrays,
    )
