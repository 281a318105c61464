"""Packet indexes of remote videos kept on local disk, so no process or run indexes the same file twice; local
videos' too, stamped from their ``stat`` (:mod:`.packet_index_cache`: a worker reloads one its bounded cache dropped).

Indexing a remote file costs a few ranged reads (~200 KB) of its ``moov``; every DALI worker of every rank
of every run would pay that per file. The store keeps each index as a ``.pidx`` file (raw arrays and a checksum:
:mod:`.packet_index_file`) keyed by the sha256 of (URL, size, version), so a changed file (new size or etag/blob id)
simply misses. Files are written to a temporary name and renamed into place, so workers and ranks sharing the
folder never read half a file; an unreadable file is logged, deleted and rebuilt. Processes that miss the same
index at once (the DALI workers of a rank, the ranks of a node) take turns on an ``flock`` beside its file
(:meth:`PacketIndexStore.building`): one reads the video, the others load its stored index. A folder that
refuses writes (full, over quota, read-only) is written no more by the process, with one warning. An entry says which
checks of the video file its build made (:data:`~.packet_index_file.FILE_CHECKS`): one from a version that made fewer
is checked against its file's boxes at load (a few small reads, once), not rebuilt as a new format would make every
index. The ``.npz`` files of formats up to 4 are left to older versions sharing the folder, never read, and pruned once
unused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import fork_locks
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
    read_entry,
    wait_for_flock,
)
from .errors import VideoDecodeError
from .file_stamps import FileStamp
from .packet_index import PacketIndex
from .packet_index_file import FILE_CHECKS, STORE_FORMAT, packet_index_bytes, read_packet_index_entry
from .said_once import warn_once

__all__ = ["STORE_FORMAT", "SUFFIX", "WAIT_S", "PacketIndexStore", "default_packet_index_dir"]

logger = logging.getLogger(__name__)

#: Longest a process waits for another that indexes the same video before it indexes it too.
WAIT_S = 300.0
#: Seconds between two looks at a lock another process holds.
_POLL_S = 0.05

#: The suffix of a stored index, and the pattern of the ``.npz`` files of formats up to 4 (a new suffix, so a version
#: that reads one and a version that reads the other share a folder without deleting each other's files).
SUFFIX = ".pidx"
_NPZ_FILES = "*/*.npz"

#: Store folders that refused a write in this process (full, over quota, read-only), and entries that could not be
#: written in one that takes writes: not tried again, so each is warned about once (every store of one folder,
#: a store per reader and worker, shares them).
_REFUSED: set[Path] = set()
_REFUSED_LOCK = fork_locks.lock()


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
        return self.directory / digest[:2] / f"{digest}{SUFFIX}"

    def load(
        self, url: str, stamp: FileStamp, *, recheck: Callable[[PacketIndex], None] | None = None
    ) -> PacketIndex | None:
        """The stored index of ``url`` at ``stamp``, or None when absent or unreadable (then deleted).

        An entry whose build made fewer checks of the video file than this version's
        (:data:`~lerobot_dali.packet_index_file.FILE_CHECKS`: one written before truncated and zero-filled files were
        refused, which may hold the frames before the cut of such a file) is served once ``recheck(index)`` (a few
        small reads of the file's boxes: :func:`~lerobot_dali.packet_index.check_stored_index`) passes, then stored
        again with the checks; without ``recheck`` it is rebuilt. Where ``recheck`` finds the file truncated, the entry
        is deleted and its VideoDecodeError raised; whatever else it raises (a read that failed: the network, a 403; a
        file that changed since it was listed) leaves the entry as it was, to be checked at the next load.
        """
        path = self.path_for(url, stamp)
        found = read_entry(path, logger, instead="indexing the video")  # (a folder that is none: its save says so)
        if found is None:
            return None
        raw, read = found
        try:
            index, file_checks = read_packet_index_entry(raw, url, stamp)
        except Exception as e:  # a stored index is a shortcut: whatever fails to load it (damage, another format,
            # the video's own checks in PacketIndex), it is rebuilt from the file
            logger.warning("packet index cache file %s is unreadable (%s: %s); deleting it", path, type(e).__name__, e)
            self._delete(path, read)
            return None
        if file_checks < FILE_CHECKS:
            if recheck is None:
                return None
            try:
                recheck(index)
            except VideoDecodeError:
                logger.warning("packet index cache file %s indexes a video found truncated; deleting it", path)
                self._delete(path, read)
                raise
            self.save(url, stamp, index)  # (with this version's checks: not checked again)
        mark_used(path)
        logger.debug("Loaded the index of %d packets of %s from %s", index.frame_count, url, path)
        return index

    @staticmethod
    def _delete(path: Path, read: os.stat_result) -> None:
        try:
            delete_if_unchanged(path, read)  # (not a good one another process stored meanwhile)
        except OSError as unlink_error:
            logger.warning("cannot delete %s (%s); it will be overwritten", path, unlink_error)

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
        files of servers without versions (``run:`` stamps) and of older Hub commits are never loaded again, nor the
        ``.npz`` files of formats up to 4."""
        prune_unused_files(self.directory, f"*/*{SUFFIX}", _NPZ_FILES, LOCK_FILES, TEMP_FILES)

    def save(self, url: str, stamp: FileStamp, index: PacketIndex) -> None:
        """Store ``index`` for ``url`` at ``stamp`` atomically; a failed write is logged, never raised, and not
        tried again in this process (nor any write to a folder that refuses them)."""
        path = self.path_for(url, stamp)
        if self.directory in _REFUSED or path in _REFUSED:
            return
        try:
            with atomic_file(path, prefix=f".{path.stem[:16]}.") as tmp:
                tmp.write(packet_index_bytes(index, url, stamp))
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
