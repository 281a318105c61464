"""Where lerobot_dali keeps what it can rebuild: one root, so a user moves or clears every cache in one place.

``$LEROBOT_DALI_CACHE`` when set, else ``~/.cache/lerobot_dali``; each cache takes a subfolder (``bench``,
``packet_index``). Nothing under it is ever needed for correctness: deleting it only costs rebuild time.
What no run has used for ``$LEROBOT_DALI_CACHE_DAYS`` days (default 30) is deleted by the next run (at most
one sweep a day per cache), so caches of datasets no longer read do not fill the disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from .new_folder import host_name, pid_alive
from .said_once import warn_once

__all__ = [
    "CACHE_DAYS_ENV",
    "CACHE_ENV",
    "LOCK_FILES",
    "TEMP_FILES",
    "EntryStands",
    "atomic_file",
    "cache_days",
    "cache_root",
    "checked_body",
    "checksummed",
    "delete_if_unchanged",
    "delete_tree",
    "delete_unless_held",
    "discard_damaged_entry",
    "folder_refuses",
    "hold_shared",
    "lock_file",
    "locks_unsupported",
    "mark_used",
    "newest_stamps",
    "private_cache_roots",
    "prune_unused_files",
    "read_entry",
    "sweep_cutoff",
    "try_flock",
    "try_flock_where_supported",
    "wait_for_entry_lock",
    "wait_for_flock",
    "write_checksummed",
    "write_whole",
]

logger = logging.getLogger(__name__)

#: Environment variable that moves the cache root (e.g. onto a fast local disk shared by all ranks of a node).
CACHE_ENV = "LEROBOT_DALI_CACHE"
#: Days a cache entry may go unused before a run deletes it; 0 keeps everything.
CACHE_DAYS_ENV = "LEROBOT_DALI_CACHE_DAYS"
DEFAULT_CACHE_DAYS = 30.0
#: Seconds between two sweeps of one cache folder (a sweep lists every entry).
PRUNE_EVERY_S = 24 * 3600.0
#: The lock files the stores take beside their entries (``<entry>.lock``): a holder that stored nothing (a failed
#: build, a killed process) leaves one, which :func:`prune_unused_files` sweeps with the entries.
LOCK_FILES = "*/*.lock"
#: The temporary files :func:`atomic_file` writes beside the stores' entries: a writer killed mid-write leaves one (in
#: the column store, a whole Arrow copy of a data file), which :func:`prune_unused_files` sweeps with the entries.
TEMP_FILES = "*/.*.tmp"
#: Errors that stop every write to a folder: full, over quota, read-only.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
#: Errors of ``flock`` on a filesystem that takes no locks: NFS without its lock daemon (ENOLCK), Lustre mounted
#: without ``-o flock`` (ENOSYS), others (EOPNOTSUPP).
_NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})
#: Errors of ``link`` on a filesystem that makes no hard links (FAT, some FUSE mounts).
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def cache_root() -> Path:
    """``$LEROBOT_DALI_CACHE`` (``~`` expanded) when set and non-empty, else ``~/.cache/lerobot_dali``.

    Where this process has no home directory (``$HOME`` unset and no passwd entry for its uid: a container run as an
    arbitrary ``--user``), ``$XDG_CACHE_HOME/lerobot_dali``, else ``lerobot_dali-<uid>`` in the temporary directory,
    said once: the caches only save work, so their place never stops a run."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    try:
        if configured:
            return Path(configured).expanduser()
        return Path.home() / ".cache" / "lerobot_dali"
    except RuntimeError:  # (Path.home: "Could not determine home directory")
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        root = Path(xdg) / "lerobot_dali" if os.path.isabs(xdg) else _temporary_root()
        warn_once(logger, "no home directory ($HOME unset and uid %d has no passwd entry): caches go to %s; set $%s "
                  "to an absolute folder to keep them elsewhere", os.getuid(), root, CACHE_ENV)  # fmt: skip
        return root


def private_cache_roots() -> list[Path]:
    """Cache roots of this user alone, best first, for a cache whose folder this process cannot write (another user's
    in a shared cache, a read-only mount): ``~/.cache/lerobot_dali`` (where this process has a home), then
    ``lerobot_dali-<uid>`` in the temporary directory."""
    roots = []
    with contextlib.suppress(RuntimeError):  # (no home directory)
        roots.append(Path.home() / ".cache" / "lerobot_dali")
    return [*roots, _temporary_root()]


def _temporary_root() -> Path:
    return Path(_temporary_dir()) / f"lerobot_dali-{os.getuid()}"


def _temporary_dir() -> str:
    try:
        return tempfile.gettempdir()
    except FileNotFoundError:  # (no usable temporary directory either)
        return "/tmp"


@contextmanager
def atomic_file(path: Path, *, prefix: str, durable: bool = False, exclusive: bool = False) -> Iterator[IO[bytes]]:
    """A temporary file beside ``path`` (named ``prefix*.tmp``) that replaces ``path`` when the block ends, and
    is removed if it raises: workers and ranks sharing a cache never read half a file. ``durable``: synced to
    disk before it replaces ``path`` (else a crash may leave a zero-filled file of the right size). ``exclusive``:
    it takes ``path``'s name only where none stands (a hard link), else raises :class:`EntryStands` (a filesystem
    without hard links: it replaces ``path`` as without). The temporary file's name holds this host and PID
    (``prefix@<host>-<pid>-<random>.tmp``): those a writer killed outright left (SIGKILL, the OOM killer) are deleted
    by this process's first write in that folder (:func:`_remove_dead_writers_files`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_files(str(path.parent))
    tmp = tempfile.NamedTemporaryFile(  # noqa: SIM115
        dir=path.parent, prefix=f"{prefix}@{host_name()}-{os.getpid()}-", suffix=".tmp", delete=False
    )
    try:
        with tmp:
            yield tmp
            if durable:
                tmp.flush()
                os.fsync(tmp.fileno())
        os.chmod(tmp.name, 0o644)  # temporary files are private; other users sharing the cache may read it
        if not (exclusive and _linked(tmp.name, path)):
            os.replace(tmp.name, path)
    finally:
        Path(tmp.name).unlink(missing_ok=True)


@functools.lru_cache(maxsize=4096)
def _remove_dead_writers_files(folder: str) -> None:
    """Delete the :func:`atomic_file` temporary files in ``folder`` that writers on this host left when killed (a PID
    no process has), once per process and folder (each sweep lists the folder: at every write, 29 ms a write in a
    range cache folder of 10,000 entries, against 0.6 ms): they were never removed (a bench's or a checkpoint's
    folder is no cache a sweep goes through; a cache's went after its days unused, a whole Arrow copy of a data file
    each). Another host's (the name after its last ``@``), a live writer's and those named otherwise are left."""
    owned = re.compile(r"\..*@" + re.escape(host_name()) + r"-(\d+)-\w+\.tmp")  # (no host name holds an "@")
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for left in entries:
            owner = owned.fullmatch(left.name)
            if owner is None or pid_alive(int(owner.group(1))):
                continue
            with contextlib.suppress(OSError):  # (removed meanwhile, or not ours to delete)
                os.unlink(left.path)
                logger.debug("removed %s, left by a writer on this host (PID %s) that was killed", left.path,
                             owner.group(1))  # fmt: skip


def write_whole(path: Path, data: bytes) -> None:
    """``data`` as ``path``, whole or not at all and on disk before it replaces ``path`` (:func:`atomic_file`,
    ``durable``): a crash or a signal mid-write leaves the old file or the new one, never one cut short or zero-filled
    that a later reader takes for whole."""
    with atomic_file(path, prefix=f".{path.name}.", durable=True) as out:
        out.write(data)


class EntryStands(Exception):
    """An exclusive write (:func:`atomic_file`) found a file under its name: another process wrote one meanwhile."""


def _linked(source: str, path: Path) -> bool:
    """Whether ``source`` now has ``path``'s name too, taken only where none stood (:class:`EntryStands` else); False
    on a filesystem that makes no hard links."""
    try:
        os.link(source, path)
    except FileExistsError as e:
        raise EntryStands(path) from e
    except OSError as e:
        if e.errno not in _NO_LINK_ERRNOS:
            raise
        return False
    return True


def folder_refuses(folder: Path, error: OSError) -> str | None:
    """What to do about ``error`` of a write under cache ``folder`` when it stops every write there (full, over
    quota, read-only, not a writable folder); None when it is one entry's (another user's file in a shared cache)."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space"
    if error.errno in _FULL_ERRNOS or not (folder.is_dir() and os.access(folder, os.W_OK)):
        return "make it a writable folder"
    return None


def locks_unsupported(error: OSError) -> bool:
    """Whether ``error`` (of :func:`try_flock`) says the filesystem takes no locks at all."""
    return error.errno in _NO_LOCK_ERRNOS


def try_flock(path: Path) -> IO[bytes] | None:
    """``path`` opened and exclusively ``flock``ed, or None while another process (or handle) holds it, or when
    ``path`` was deleted or replaced between the open and the lock (a sweep, or a holder done with it: a lock on a
    file no other process can open excludes nobody; the caller tries again).

    The lock goes with the returned file (closed, or the process gone), so a crash never leaves it taken."""
    handle: IO[bytes]
    try:
        handle = open(path, "a+b")  # noqa: SIM115 (returned open: the caller holds the lock as long as it likes)
    except PermissionError as refused:  # another user's lock file in a shared cache: flock works read-only
        try:
            handle = open(path, "rb")  # noqa: SIM115
        except FileNotFoundError:  # (none to lock, and none may be made here: the refusal, not "no such file")
            raise refused from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        handle.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    if not _same_file(os.fstat(handle.fileno()), path):
        handle.close()
        return None
    return handle


def try_flock_where_supported(path: Path) -> tuple[contextlib.AbstractContextManager[object] | None, bool]:
    """:func:`try_flock` and whether it locks: (the held lock, True), or (None, True) while another process holds
    it; (nothing to hold, False) where the filesystem takes no locks (NFS without its lock daemon, Lustre mounted
    without ``-o flock``), so none holds it either and the caller goes on without one."""
    try:
        return try_flock(path), True
    except OSError as e:
        if not locks_unsupported(e):
            raise
        return contextlib.nullcontext(), False


def _same_file(opened: os.stat_result, path: Path) -> bool:
    """Whether ``path`` still names the file whose ``fstat`` is ``opened``."""
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def wait_for_flock(path: Path, *, ready: Path, wait_s: float, poll_s: float) -> IO[bytes] | None:
    """``path`` exclusively ``flock``ed (:func:`try_flock`) once no other process holds it; None as soon as ``ready``
    exists (the holder's result, to be read instead) or once ``wait_s`` have passed (a holder that stalls: the caller
    goes on without the lock, so it never waits forever). Raises OSError where no lock file can be made or opened
    (a read-only folder): the caller goes on without one."""
    deadline = time.monotonic() + wait_s
    while True:
        lock = try_flock(path)
        if lock is not None or ready.exists() or time.monotonic() > deadline:
            return lock
        time.sleep(poll_s)


def wait_for_entry_lock(entry: Path, *, wait_s: float, poll_s: float) -> IO[bytes] | None:
    """The lock beside store entry ``entry`` (:func:`lock_file`), for a process about to build it: taken once no
    other process holds it (:func:`wait_for_flock`). None as soon as ``entry`` exists (load it instead), after
    ``wait_s`` (a holder that stalls: logged), or where no lock can be made (a read-only folder); the caller then
    builds the entry without one."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = wait_for_flock(lock_file(entry), ready=entry, wait_s=wait_s, poll_s=poll_s)
    except OSError as e:
        logger.debug("%s: no lock can be made beside it (%s); building it without one", entry, e)
        return None
    if lock is None and not entry.exists():
        logger.warning("%s: another process has held its lock for %.0f s; reading without it", entry, wait_s)
    return lock


def delete_if_unchanged(path: Path, read: os.stat_result | None) -> None:
    """Delete ``path`` if it still names the file that was read (``read``: its ``fstat``; None: never opened), not a
    good one another process renamed over it since. Raises OSError where it cannot be deleted."""
    if read is None or _same_file(read, path):
        path.unlink(missing_ok=True)


def delete_tree(folder: Path) -> tuple[OSError | None, int, int]:
    """Delete ``folder`` and all it holds, as far as this process may: (the first error met, or None; the files and
    bytes left, 0 where it is gone). ``shutil.rmtree(ignore_errors=True)`` says nothing of what it could not delete
    (another user's files in a shared cache, a read-only mount), so a caller logging it as deleted was wrong."""
    errors: list[OSError] = []

    def failed(_function: object, _path: str, error: BaseException) -> None:
        if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):  # (gone meanwhile: as wanted)
            errors.append(error)

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=failed)
    else:  # (onerror, deprecated from 3.12 on, is handed sys.exc_info())
        shutil.rmtree(folder, onerror=lambda function, path, info: failed(function, path, info[1]))
    files = size = 0
    for path in folder.rglob("*") if folder.exists() else ():
        with contextlib.suppress(OSError):
            if path.is_file():
                files, size = files + 1, size + path.stat().st_size
    return (errors[0] if errors else None), files, size


def hold_shared(file: IO[bytes] | Any, path: Path) -> bool:
    """Take a shared ``flock`` on open ``file`` (anything with ``fileno()``: a memory map), held while it stays open, so
    :func:`delete_unless_held` leaves ``path`` to its readers; False where ``path`` no longer names it (deleted or
    replaced before the lock: open it again). True without a lock where the filesystem takes none (nothing deletes it
    then either) or refuses one (logged at DEBUG)."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH)  # (blocks only while a deleter holds it: an unlink's instant)
    except OSError as e:
        if not locks_unsupported(e):
            logger.debug("%s: no shared lock (%s); read without one", path, e)
        return True
    return _same_file(os.fstat(file.fileno()), path)


def delete_unless_held(path: Path) -> bool:
    """Delete ``path`` unless a process holds a lock on it (:func:`hold_shared`, taken by its readers); whether it was
    deleted: not where it is held, where the filesystem takes no locks (no reader can be told apart), nor where it
    cannot be deleted (another user's file in a shared cache)."""
    try:
        lock = try_flock(path)
        if lock is None:
            return False
        with lock:
            path.unlink()
    except OSError:
        return False
    return True


def read_entry(entry: Path, logger: logging.Logger, *, instead: str) -> tuple[bytes, os.stat_result] | None:
    """Store entry ``entry``'s bytes and its ``fstat`` (for :func:`discard_damaged_entry`); None where it is absent
    or cannot be opened (a cache folder that is a file, another user's): nothing there is damaged, so only a debug
    line on ``logger`` says so, and ``instead`` what the caller does."""
    try:
        with open(entry, "rb") as file:
            return file.read(), os.fstat(file.fileno())
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            logger.debug("cannot read %s (%s); %s", entry, e, instead)
        return None


def discard_damaged_entry(
    entry: Path, read: os.stat_result, logger: logging.Logger, *, what: str, problem: Exception, instead: str
) -> None:
    """Warn on ``logger`` that ``entry`` (a ``what``) holds something else than it should, and delete it, unless
    another process stored a good one over it since it was read."""
    logger.warning("%s %s is unreadable (%s); deleting it and %s", what, entry, problem, instead)
    with contextlib.suppress(OSError):
        delete_if_unchanged(entry, read)


_Key = TypeVar("_Key")


def newest_stamps(keys: Iterable[_Key], file_stamp: Callable[[_Key], tuple[str, Hashable]], limit: int) -> list[_Key]:
    """``keys`` (oldest first) but those of each file's stamps (``file_stamp(key)``: its path and stamp) older than
    its newest ``limit``: a store entry keeps a file's last few versions (one per host that copies a dataset to one
    path), not every one it had."""
    stamps_of: defaultdict[str, set[Hashable]] = defaultdict(set)
    newest_first = []
    for key in reversed(list(keys)):
        path, stamp = file_stamp(key)
        stamps = stamps_of[path]
        if stamp in stamps or len(stamps) < limit:
            stamps.add(stamp)
            newest_first.append(key)
    return newest_first[::-1]


def write_checksummed(
    entry: Path,
    body: bytes,
    *,
    directory: Path,
    logger: logging.Logger,
    what: str,
    otherwise: str,
    exclusive: bool = False,
) -> bool:
    """Write ``body`` to store entry ``entry`` (in the store's ``directory``) behind a line of its sha256, atomically:
    :func:`checked_body` reads it back. Whether it was written: a failed write is logged once (``cannot keep <what>
    ...; <otherwise>``: what the next run does instead), never raised: the store only saves work. ``exclusive``: only
    where no entry stands (:func:`atomic_file`), else :class:`EntryStands`."""
    try:
        with atomic_file(entry, prefix=f".{entry.stem[:16]}.", exclusive=exclusive) as tmp:
            tmp.write(checksummed(body))
    except OSError as e:
        fix = folder_refuses(directory, e) or "check its permissions"
        warn_once(logger,
            "cannot keep %s in %s (%s: %s); %s: %s or move the cache with $%s",
            what, entry, type(e).__name__, e, otherwise, fix, CACHE_ENV,
        )  # fmt: skip
        return False
    return True


def checksummed(body: bytes) -> bytes:
    """``body`` behind a line of its sha256, as a store entry keeps it: :func:`checked_body` reads it back."""
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def checked_body(raw: bytes) -> bytes:
    """The body of a :func:`checksummed` entry; raises ValueError where the checksum disagrees with it."""
    checksum, _, body = raw.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != checksum:
        raise ValueError("its checksum disagrees with its contents (a write cut short, or damage)")
    return body


def lock_file(entry: Path) -> Path:
    """The lock file beside store entry ``entry`` (matched by :data:`LOCK_FILES`)."""
    return entry.with_suffix(".lock")


def drop_lock_file(entry: Path) -> None:
    """Delete ``entry``'s lock file once ``entry`` is stored (the caller holds the lock): whoever comes next finds
    the entry and takes no lock, and one empty file per entry ever stored would otherwise stay for good (sweeps go
    by last use). Best effort: at worst a sweep removes it later."""
    with contextlib.suppress(OSError):
        lock_file(entry).unlink()


def cache_days() -> float:
    raw = os.environ.get(CACHE_DAYS_ENV, "").strip()
    try:
        days = float(raw) if raw else DEFAULT_CACHE_DAYS
    except ValueError:
        warn_once(logger, "%s=%r is not a number of days; using %g", CACHE_DAYS_ENV, raw, DEFAULT_CACHE_DAYS)
        days = DEFAULT_CACHE_DAYS
    return days


def mark_used(path: Path) -> None:
    """Record a use of cache entry ``path`` (its mtime), so sweeps keep it; best effort."""
    with contextlib.suppress(OSError):  # (another user's file in a shared cache, or gone): at worst rebuilt
        os.utime(path)


def sweep_cutoff(folder: Path) -> float | None:
    """The time (``time.time()`` scale) before which an entry's last use makes it stale, when ``folder`` is due
    a sweep (none for :data:`PRUNE_EVERY_S`: a marker's mtime, set here); None when pruning is off (0 days),
    ``folder`` does not exist or was swept recently."""
    days = cache_days()
    if days <= 0 or not folder.is_dir():
        return None
    marker = folder / ".swept"
    try:
        if time.time() - marker.stat().st_mtime < PRUNE_EVERY_S:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        marker.touch()
    except OSError:
        return None
    return time.time() - days * 86400


def prune_unused_files(folder: Path, *patterns: str) -> None:
    """Delete the files of ``folder`` matching any of ``patterns`` whose last use (:func:`mark_used`) is stale; a
    no-op when pruning is off or ``folder`` was swept recently. Readers holding one open or mapped keep their copy.
    A lock file (``*.lock``: its mtime is its creation, however long it is held) goes only while none holds it, or
    where the filesystem takes no locks."""
    cutoff = sweep_cutoff(folder)
    if cutoff is None:
        return
    removed, freed = 0, 0
    for path in (path for pattern in patterns for path in folder.glob(pattern)):
        try:
            stat = path.stat()
            if stat.st_mtime >= cutoff:
                continue
            if path.suffix == ".lock":
                lock, _ = try_flock_where_supported(path)
                if lock is None:  # held: its holder is building the entry now
                    continue
                with lock:
                    path.unlink()
            else:
                path.unlink()
            removed, freed = removed + 1, freed + stat.st_size
        except OSError:
            continue  # (removed meanwhile, or not ours to delete)
    if removed:
        logger.info("%s: deleted %d cache file(s), %.1f MB, unused for %g days", folder, removed, freed / 1e6,
                    cache_days())  # fmt: skip
