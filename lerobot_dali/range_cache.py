"""A bounded on-disk cache of byte ranges of remote files, shared by the prefetcher and the DALI workers.

The prefetcher (one thread of the training process) is the only writer: it stores the byte ranges an
episode needs when the episode enters the pool and releases them when it leaves. v3 files pack several
episodes, so one range (a parquet footer, a row group, a GOP on an episode boundary) can serve several
pooled episodes: entries are reference-counted by the episodes holding them, and a released entry stays on
disk, evictable, until space is needed (a second epoch over a warm cache fetches nothing).

Readers are the DALI worker processes. They share nothing with the writer but the directory: an entry is a
file ``<dir>/<file key>/<start>-<end>-<crc32>.bin`` that appears atomically (written aside, then renamed) and
may vanish when evicted, so a reader that finds no entry, or loses one (or finds it cut short), reads the
remote file instead. The cache can make reads faster, never different. A cache that cannot write (disk
full) refuses the range instead.

Entries an earlier run left are trusted only once their bytes match their checksum: adoption renames them
out of the readers' sight (``.adopted``) and the writer checks each the first time an episode needs it,
fetching it again if the disk damaged it in between.

One writer per directory: a cache takes an exclusive lock on its directory (``flock``), so two runs that would
share one (two jobs on a node, a train and a validation iterator) do not evict each other's held entries;
:meth:`RangeCache.open_free_slot` gives the second one a sibling directory. A child forked from the writer's process
gives its copy of the lock up at once: it is the parent's directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from . import fork_locks
from .cache_dirs import (
    atomic_file,
    cache_days,
    delete_tree,
    mark_used,
    sweep_cutoff,
    try_flock,
    try_flock_where_supported,
)
from .url_secrets import masked_key

__all__ = ["ByteRange", "CacheBusyError", "CacheStats", "RangeCache", "entry_dir", "list_entries", "prune_unused_slots"]

logger = logging.getLogger(__name__)

_LOCK = ".lock"
_SUFFIX = ".bin"  # an entry readers may read: written by this run, or checked against its checksum
_ADOPTED = ".adopted"  # an earlier run's entry, not yet checked
#: Tries to lock a slot (:func:`_lock_directory`), and seconds between two of a slot a sweep may hold.
_LOCK_TRIES = 100
_LOCK_POLL_S = 0.005


@dataclass(frozen=True, order=True)
class ByteRange:
    """Bytes ``[start, end)`` of ``path``; ``version`` names the file's content (size + etag), so a file
    replaced remotely never matches entries cached from its old content."""

    path: str
    start: int
    end: int
    version: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"byte range of {self.path} must satisfy 0 <= start < end, got [{self.start}, {self.end})")

    @property
    def size(self) -> int:
        return self.end - self.start


def entry_dir(root: str | os.PathLike[str], path: str, version: str = "") -> Path:
    """The folder holding the cached ranges of one version of one file (a hash: paths can be long URLs), the
    credentials its path names masked (:func:`.masked_key`), as its label names it."""
    digest = hashlib.sha256(f"{masked_key(path)}\0{version}".encode()).hexdigest()[:32]
    return Path(root) / digest


def list_entries(folder: Path) -> list[tuple[int, int, Path]]:
    """``(start, end, file)`` of the entries readers may read in ``folder``, sorted; empty when there are none."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        parsed = _parse_entry_name(name, _SUFFIX)  # (not temporaries being written, nor unchecked entries)
        if parsed is not None:
            entries.append((parsed[0], parsed[1], folder / name))
    entries.sort()
    return entries


def _entry_name(start: int, end: int, crc: int, suffix: str = _SUFFIX) -> str:
    return f"{start}-{end}-{crc:08x}{suffix}"


def _parse_entry_name(name: str, suffix: str) -> tuple[int, int, int] | None:
    """``(start, end, crc32)`` of an entry file's name ending in ``suffix``, or None for any other name."""
    if not name.endswith(suffix):
        return None
    try:
        start, end, crc = name[: -len(suffix)].split("-")
        return int(start), int(end), int(crc, 16)
    except ValueError:
        return None


@dataclass
class CacheStats:
    """What the cache did, read as ``DALILeRobotIterator.prefetcher.stats`` (nothing logs it; the benchmark counts
    requests with :mod:`.io_stats`): ranges fetched, reused (a request saved), evicted, and refused (no room: read
    remotely)."""

    fetched_ranges: int = 0
    fetched_bytes: int = 0
    reused_ranges: int = 0
    evicted_ranges: int = 0
    evicted_bytes: int = 0
    refused_ranges: int = 0


class CacheBusyError(OSError):
    """Another live cache (of this or another process) writes to this directory."""


@dataclass
class _Entry:
    key: ByteRange
    file: Path
    owners: set[Hashable] = field(default_factory=set)
    #: An earlier run's entry (``.adopted``): its bytes must match ``crc`` before readers see it.
    adopted: bool = False
    crc: int = 0


class RangeCache:
    """The writer side: ``acquire(owner, ranges, fetch)`` makes ranges local, ``release(owner)`` lets them go.

    Bytes on disk never exceed ``max_bytes``: a range that would not fit even with every released entry evicted is
    refused, evicting none (its reads then go remote), and logged once. Entries left in ``directory``
    by an earlier run are adopted as released, so a restart starts warm.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._entries: dict[ByteRange, _Entry] = {}
        self._owned: dict[Hashable, list[ByteRange]] = {}
        self._released: OrderedDict[ByteRange, None] = OrderedDict()  # evictable, oldest first
        self._released_bytes = 0  # theirs: what evicting every one of them would free
        self._bytes = 0
        self._pending: dict[ByteRange, threading.Event] = {}
        self._lock = fork_locks.lock()
        #: Threads writing to the folder now (an entry, or an adopted one checked): close() waits for them, and none
        #: starts once it is closed (the folder may be another cache's by then: a fetch left running wrote there).
        self._writing = 0
        self._written = fork_locks.condition(self._lock)
        self._warned_full = False
        self._warned_write = False
        self._lock_file = _lock_directory(self.directory)
        _holding.add(self)
        mark_used(self.directory / _LOCK)  # the slot's last use, for prune_unused_slots
        try:
            self._adopt()
        except BaseException:  # (entries this process may not rename: the lock, kept, took the slot from its owner)
            self.close()
            raise

    @classmethod
    def open_free_slot(cls, directory: str | os.PathLike[str], *, max_bytes: int) -> RangeCache:
        """A cache in ``directory``, or, while another cache holds it, in the first free ``directory.N``
        sibling (kept across runs, so a restarted second job starts warm too)."""
        base = Path(directory)
        for slot in range(64):
            candidate = base if slot == 0 else base.with_name(f"{base.name}.{slot}")
            try:
                cache = cls(candidate, max_bytes=max_bytes)
            except CacheBusyError:
                continue
            if slot:
                logger.info("prefetch cache %s is in use by another run; using %s", base, candidate)
            return cache
        raise CacheBusyError(f"{base} and its 63 sibling slots are all in use by other prefetch caches")

    def close(self) -> None:
        """Give the directory up (its entries stay, for the next run to adopt) once the writes under way have ended;
        a fetch still running then writes nothing (its range counts as refused)."""
        with self._lock:
            handle, self._lock_file = self._lock_file, None
            while self._writing:
                self._written.wait()
        if handle is not None:
            handle.close()  # releases the flock

    @property
    def bytes_cached(self) -> int:
        return self._bytes

    def holds(self, key: ByteRange) -> bool:
        return key in self._entries

    def owners(self) -> list[Hashable]:
        with self._lock:
            return list(self._owned)

    def acquire(self, owner: Hashable, ranges: Iterable[ByteRange], fetch: Callable[[ByteRange], bytes]) -> int:
        """Hold ``ranges`` for ``owner``, fetching the missing ones; returns the bytes fetched.

        ``fetch`` runs without the lock (it is the slow part); a fetch error propagates and leaves the
        owner holding what it got so far, to be released as usual.

        Marks the directory used (its lock's mtime, a few microseconds): a sweep (:func:`prune_unused_slots`) goes
        by its last use, and a run that opened it more than the days a sweep waits before still uses it.
        """
        if self._lock_file is not None:
            mark_used(self.directory / _LOCK)
        fetched = 0
        held = self._owned.setdefault(owner, [])
        for key in dict.fromkeys(ranges):
            work, adopted = self._claim(owner, key, held)
            if not work:
                continue
            try:
                file = self._writes(partial(self._checked, adopted)) if adopted is not None else None
                reused = file is not None
                if file is None:
                    data = fetch(key)
                    if len(data) != key.size:
                        raise OSError(f"{key.path}: fetched {len(data)} bytes for range [{key.start}, {key.end})")
                    file = self._writes(partial(self._write_or_refuse, key, data))
            except BaseException:
                with self._lock:
                    self._bytes -= key.size
                    self._pending.pop(key).set()
                raise
            if file is None:  # the disk refused it: the range is read remotely
                with self._lock:
                    self._bytes -= key.size
                    self.stats.refused_ranges += 1
                    self._pending.pop(key).set()
                continue
            with self._lock:
                self._entries[key] = _Entry(key, file, {owner})
                held.append(key)
                if reused:
                    self.stats.reused_ranges += 1
                else:
                    self.stats.fetched_ranges += 1
                    self.stats.fetched_bytes += key.size
                self._pending.pop(key).set()
            fetched += 0 if reused else key.size
        return fetched

    def _writes(self, write: Callable[[], Path | None]) -> Path | None:
        """``write()`` (an entry made readable), or None without calling it once the cache is closed."""
        with self._lock:
            if self._lock_file is None:
                return None
            self._writing += 1
        try:
            return write()
        finally:
            with self._lock:
                self._writing -= 1
                self._written.notify_all()

    def _claim(self, owner: Hashable, key: ByteRange, held: list[ByteRange]) -> tuple[bool, _Entry | None]:
        """``(True, None)`` when the caller must fetch ``key`` (room reserved), ``(True, entry)`` when it must
        first check an adopted entry (:meth:`_checked`; its room stays reserved), ``(False, None)`` when the
        range is held, reused or refused."""
        while True:
            with self._lock:
                pending = self._pending.get(key)
                if pending is None:
                    if key in held:
                        return False, None
                    entry = self._entries.get(key)
                    if entry is not None and entry.adopted:  # checked outside the lock, as a fetch would be
                        del self._entries[key]
                        self._unreleased(key)
                        self._pending[key] = threading.Event()
                        return True, entry
                    if entry is not None:
                        entry.owners.add(owner)
                        self._unreleased(key)
                        held.append(key)
                        self.stats.reused_ranges += 1
                        return False, None
                    if self._lock_file is None:  # closed: the folder may be another cache's now
                        return False, None
                    if not self._make_room(key.size):
                        self.stats.refused_ranges += 1
                        self._warn_full(key)
                        return False, None
                    self._bytes += key.size  # reserved while fetching, so concurrent acquires respect the bound
                    self._pending[key] = threading.Event()
                    return True, None
            pending.wait()  # another thread is fetching this very range; then it is an entry (or failed)

    def _checked(self, entry: _Entry) -> Path | None:
        """An adopted entry made readable (renamed to its reader name) if its bytes still match its checksum;
        None, the file deleted, if the disk lost or damaged them since the run that wrote it."""
        key = entry.key
        try:
            data = entry.file.read_bytes()
            if len(data) == key.size and zlib.crc32(data) == entry.crc:
                final = entry.file.with_name(_entry_name(key.start, key.end, entry.crc))
                os.replace(entry.file, final)
                return final
            problem = f"{len(data)} bytes with crc32 {zlib.crc32(data):08x}, not {key.size} with {entry.crc:08x}"
        except OSError as e:
            problem = str(e)
        logger.warning(
            "prefetch cache entry %s (%s [%d, %d)) is damaged (%s); fetching the range again",
            entry.file, key.path, key.start, key.end, problem,
        )  # fmt: skip
        entry.file.unlink(missing_ok=True)
        return None

    def release(self, owner: Hashable) -> None:
        """``owner`` no longer needs its ranges; those no other owner holds become evictable (kept on disk)."""
        with self._lock:
            for key in self._owned.pop(owner, []):
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.owners.discard(owner)
                if not entry.owners:
                    self._evictable(key)

    def clear(self) -> None:
        """Delete every entry (held or not), so the next reads fetch again (a test uses it to stall a prefetch)."""
        with self._lock:
            for entry in self._entries.values():
                entry.file.unlink(missing_ok=True)
            self._entries.clear()
            self._owned.clear()
            self._released.clear()
            self._released_bytes = 0
            self._bytes = 0

    # -- internals -----------------------------------------------------------------------------------------
    def _make_room(self, size: int) -> bool:
        """Whether ``size`` bytes more fit, evicting released entries (oldest first) for them; where they would not fit
        even with every released entry evicted (held ones fill the cache, or the range is larger than it), none is:
        they were all evicted for a range refused after all, and fetched again when their episodes came back."""
        if self._bytes - self._released_bytes + size > self.max_bytes:
            return False
        while self._bytes + size > self.max_bytes and self._released:
            key, _ = self._released.popitem(last=False)
            self._released_bytes -= key.size
            entry = self._entries.pop(key)
            entry.file.unlink(missing_ok=True)
            self._bytes -= key.size
            self.stats.evicted_ranges += 1
            self.stats.evicted_bytes += key.size
        return self._bytes + size <= self.max_bytes

    def _evictable(self, key: ByteRange) -> None:
        if key not in self._released:
            self._released[key] = None
            self._released_bytes += key.size

    def _unreleased(self, key: ByteRange) -> None:
        if key in self._released:
            del self._released[key]
            self._released_bytes -= key.size

    def _warn_full(self, key: ByteRange) -> None:
        if not self._warned_full:
            self._warned_full = True
            logger.warning(
                "prefetch cache %s is full (%d of %d bytes held by pooled episodes); ranges that do not fit "
                "(first: %s [%d, %d)) are read remotely. Raise the cache size or lower episode_pool_size.",
                self.directory, self._bytes - self._released_bytes, self.max_bytes, key.path, key.start, key.end,
            )  # fmt: skip

    def _write_or_refuse(self, key: ByteRange, data: bytes) -> Path | None:
        try:
            return self._write(key, data)
        except OSError as e:
            if not self._warned_write:
                self._warned_write = True
                logger.warning(
                    "prefetch cache %s cannot write (%s); ranges it cannot store are read remotely", self.directory, e
                )
            return None

    def _write(self, key: ByteRange, data: bytes) -> Path:
        folder = entry_dir(self.directory, key.path, key.version)
        label = folder / "path"
        if not label.is_file():  # once per folder, whole or not at all (adoption checks it), before any entry
            with atomic_file(label, prefix=".path.") as out:
                out.write(f"{masked_key(key.path)}\n{key.version}\n".encode())  # (a path that keeps a URL's query)
        final = folder / _entry_name(key.start, key.end, zlib.crc32(data))
        with atomic_file(final, prefix=f".{key.start}-{key.end}.", durable=True) as out:
            out.write(data)
        return final

    def _adopt(self) -> None:
        """Entries of an earlier run become released, unchecked entries (hidden from readers until
        :meth:`_checked`), oldest first; over the bound, evicted. What a crashed writer left (temporaries;
        entries of a folder whose label it never wrote) and files that are no entry are deleted, since nothing
        would ever count or evict them; so is a folder left holding no entry (its file's entries all evicted), else one
        stayed per file and version for as long as runs used the directory: per run where the server gives no
        version."""
        found: list[tuple[float, _Entry]] = []
        for folder in self.directory.iterdir():
            if not folder.is_dir():
                continue
            label = folder / "path"
            for leftover in folder.glob(".*.tmp") if label.is_file() else folder.iterdir():
                _delete(leftover)
            if not label.is_file():
                with contextlib.suppress(OSError):
                    folder.rmdir()
                continue
            try:
                lines = label.read_text(encoding="utf-8").split("\n")
            except (UnicodeDecodeError, OSError):
                lines = []
            path, version = (lines[0], lines[1]) if len(lines) > 1 else ("", "")
            if entry_dir(self.directory, path, version) != folder:
                # A damaged label (cut short, zeroed, not text): adopted, its entries would stand under another
                # file's key, and evicting them would delete what that key's true entries point to.
                logger.warning("dropping prefetch cache folder %s: its label does not name it", folder)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            adopted = len(found)
            for file in folder.iterdir():
                if file.name == "path":
                    continue
                parsed = _parse_entry_name(file.name, _SUFFIX) or _parse_entry_name(file.name, _ADOPTED)
                try:
                    stat = file.stat()
                except FileNotFoundError:  # (removed by hand, or by a run that held the directory before)
                    continue
                if parsed is None or stat.st_size != parsed[1] - parsed[0] or parsed[0] >= parsed[1]:
                    _delete(file)  # not an entry (or one of an older layout), or cut short
                    continue
                start, end, crc = parsed
                hidden = file.with_name(_entry_name(start, end, crc, _ADOPTED))
                if file != hidden:
                    os.replace(file, hidden)
                found.append(
                    (stat.st_mtime, _Entry(ByteRange(path, start, end, version), hidden, adopted=True, crc=crc))
                )
            if len(found) == adopted:
                shutil.rmtree(folder, ignore_errors=True)
        for _, entry in sorted(found, key=lambda item: item[0]):
            if entry.key in self._entries:  # (two files of one range, as folders merged by hand leave: the newer kept)
                _delete(self._entries[entry.key].file)
            else:
                self._evictable(entry.key)
                self._bytes += entry.key.size
            self._entries[entry.key] = entry
        self._make_room(0)
        if found:
            logger.info(
                "prefetch cache %s: adopted %d range(s), %d bytes", self.directory, len(self._entries), self._bytes
            )


def _delete(path: Path) -> None:
    """Delete what :meth:`RangeCache._adopt` found in an entry's folder that is no entry: a file, or a folder put
    there by hand or by another tool (unlinking it raised IsADirectoryError, and the iterator failed to open)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


#: The caches of this process that hold their directory's lock (or did: a closed one holds no file).
_holding: weakref.WeakSet[RangeCache] = weakref.WeakSet()


def _leave_to_parent() -> None:
    """In a child just forked (``os.fork``, multiprocessing's ``fork``: a fork-based DataLoader, a helper process):
    each cache's lock file closed, the cache closed (it writes nothing: the directory is the parent's). A ``flock``
    belongs to the open file, which the fork shares: while such a child lived, the parent's close let its directory go
    to no one, and its next cache took a sibling slot, cold (1 of 1). The parent's threads are not the child's: the
    ranges they were fetching, and the writes they had under way, are dropped from its copy, whose acquire() of such
    a range, or close(), waited for them for ever (2 of 2 children hung)."""
    for cache in list(_holding):
        handle, cache._lock_file = cache._lock_file, None
        cache._pending.clear()
        cache._writing = 0
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()  # (the child's descriptor only: the parent's lock stays)


os.register_at_fork(after_in_child=_leave_to_parent)


def _lock_directory(directory: Path) -> Any:
    """``directory``, made where missing, and an open file holding an exclusive ``flock`` on it; CacheBusyError while
    another cache holds it, PermissionError (or another OSError) where this process may not write in it. Another
    rank's :func:`prune_unused_slots` may sweep an old slot while this one opens it: the slot is then made again. A
    sweep holds an old slot's lock for an instant before it moves the slot aside, so a lock held on a slot no run has
    used for a while (:func:`_sweepable`) is tried again before the slot counts as busy (a rank taking ``rank-N.1``
    meanwhile found its own slot empty at its next restart)."""
    for _ in range(_LOCK_TRIES):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # (Raises where this process may not write here, before it locks: another user's slot in a shared cache
            # locks read-only, and its lock held a while kept the slot from its owner.)
            tempfile.TemporaryFile(dir=directory).close()
            handle = try_flock(directory / _LOCK)
        except (FileNotFoundError, FileExistsError):  # (swept since the mkdir, or while it made it)
            continue
        if handle is not None:
            return handle
        if _sweepable(directory / _LOCK):
            time.sleep(_LOCK_POLL_S)
        elif (directory / _LOCK).exists():
            break
    raise CacheBusyError(f"{directory} is held by another prefetch cache")


def _sweepable(lock: Path) -> bool:
    """Whether a sweep may hold ``lock`` now: no run has opened its slot for the days a sweep waits."""
    days = cache_days()
    try:
        return days > 0 and lock.stat().st_mtime < time.time() - days * 86400
    except OSError:
        return False


def prune_unused_slots(root: Path) -> None:
    """Delete the cache directories ``root/<dataset>/<slot>`` that no run has opened for a while
    (``$LEROBOT_DALI_CACHE_DAYS``, see :mod:`.cache_dirs`) and none holds now: each is up to ``cache_gb`` of one
    dataset and rank, kept for a restart, and would otherwise stay after the dataset is no longer read."""
    cutoff = sweep_cutoff(root)
    if cutoff is None:
        return
    for slot in list(root.glob("*/*")):  # (listed first: a slot swept is renamed aside)
        lock = slot / _LOCK
        try:
            if not slot.is_dir() or (lock if lock.exists() else slot).stat().st_mtime >= cutoff:
                continue
            handle, _ = try_flock_where_supported(lock)  # (a filesystem without locks: no run holds it)
        except OSError:
            continue
        if handle is None:  # a run holds it (a restart after a long pause): its own to keep
            continue
        with handle:  # (out of the way first: the rank whose slot it is, opening it meanwhile, makes a fresh one)
            swept = slot.with_name(f".{slot.name}.swept-{os.getpid()}")
            try:
                slot.rename(swept)
            except OSError:
                swept = slot
            error, files_left, bytes_left = delete_tree(swept)
        if error is None:
            logger.info("deleted prefetch cache %s: no run has used it for %g days", slot, cache_days())
        else:
            logger.warning(
                "cannot delete prefetch cache %s, which no run has used for %g days (%s: %s); %d file(s), %.1f MB "
                "of it stay in %s: delete it as its owner, or check that folder's permissions",
                slot, cache_days(), type(error).__name__, error, files_left, bytes_left / 1e6, swept,
            )  # fmt: skip
        with contextlib.suppress(OSError):
            slot.parent.rmdir()  # (only once empty)
