"""Merging into a store entry that several processes add to at once, so none drops what another added.

A merge reads an entry, adds to it and writes it whole (:func:`~lerobot_dali.cache_dirs.write_checksummed`): two
processes merging at once each wrote over what the other added. Where the filesystem takes ``flock``, merges take
turns under the lock beside the entry. Where it takes none (NFS without its lock daemon, Lustre mounted without ``-o
flock``) they took no turns (8 processes adding 5 files each to one entry: 20-35 of the 41 lost in 10 of 10 runs);
they now go by renames and hard links, which such filesystems make atomically: a merge merges the entry as it stands,
renames it out of the others' way (one rename of it succeeds; merged again where another's entry stood by then), and
links its entry in only where none stands. Where another merge linked one meanwhile, that one is taken and merged in
turn: what an entry held is always under a name one merge holds until its own entry is written (a merge killed in
between loses it: the next reads those files again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .cache_dirs import EntryStands, drop_lock_file, lock_file, try_flock_where_supported, write_checksummed
from .said_once import say_once

__all__ = ["merge_entry"]

logger = logging.getLogger(__name__)

#: Turns of taking the entry and linking a merged one in, before a merge writes over whatever stands: a turn is
#: lost only where another merge's entry was linked in meanwhile, so 8 processes at once lose a few at most.
_TURNS = 64

_Lock = contextlib.AbstractContextManager[object]


def merge_entry(
    entry: Path,
    body: Callable[[list[Path]], bytes],
    *,
    locked: bool = False,
    wait_s: float,
    poll_s: float = 0.05,
    directory: Path,
    store_logger: logging.Logger,
    what: str,
    otherwise: str,
) -> None:
    """Write ``body(files)`` to store entry ``entry`` (:func:`~lerobot_dali.cache_dirs.write_checksummed`, which says
    ``what`` and ``otherwise`` on ``store_logger`` where it fails): ``files`` hold what the entry holds now, to merge
    with what the caller adds (none where it holds nothing; several where merges crossed).

    One merge at a time: under the lock beside ``entry`` (``locked``: the caller holds it), taken once no other
    process holds it; after ``wait_s`` (a holder that stalls), or where none can be made (a read-only folder), without
    it. Where the filesystem takes no locks, by renames (said once)."""

    def write(data: bytes, *, exclusive: bool = False) -> bool:
        return write_checksummed(
            entry, data, directory=directory, logger=store_logger, what=what, otherwise=otherwise, exclusive=exclusive
        )

    if locked:
        write(body([entry]))
        return
    lock, supported = _lock(entry, wait_s=wait_s, poll_s=poll_s)
    if not supported:
        say_once(logger, logging.INFO,
            "cache folder %s: its filesystem takes no file locks, so processes sharing it do not wait for one "
            "another (each builds what another is building); they merge into its entries by renames",
            directory,
        )  # fmt: skip
        drop_lock_file(entry)  # (made by the try: of no use here)
        _merge_by_renames(entry, body, write)
        return
    if lock is None:
        write(body([entry]))
        return
    with lock:
        try:
            write(body([entry]))
        finally:
            drop_lock_file(entry)


def _lock(entry: Path, *, wait_s: float, poll_s: float) -> tuple[_Lock | None, bool]:
    """The lock beside ``entry`` once no other process holds it (None after ``wait_s``, or where none can be made),
    and whether the filesystem takes locks."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        while True:
            lock, supported = try_flock_where_supported(lock_file(entry))
            if lock is not None or not supported or time.monotonic() >= deadline:
                return (None if not supported else lock), supported
            time.sleep(poll_s)
    except OSError as e:
        logger.debug("%s: no lock can be made beside it (%s); merging into it without one", entry, e)
        return None, True


def _merge_by_renames(entry: Path, body: Callable[[list[Path]], bytes], write: Callable[..., bool]) -> None:
    """Merge with ``entry`` read in place, then take it (renamed aside, as a temporary file a sweep removes where a
    crash leaves one) and write the merge only where no entry stands, else take that one too: see the module
    docstring. The entry is away for a rename and a write, not for the merge too, where none changed it meanwhile:
    readers found none (and each read again what it held) for most of a merge's time."""
    taken: list[Path] = []
    try:
        for _ in range(_TURNS):
            read = _identity(entry)
            data = body([*taken, entry])
            aside = entry.with_name(f".{entry.stem[:16]}.{uuid.uuid4().hex[:12]}.taken.tmp")
            try:
                os.rename(entry, aside)
            except FileNotFoundError:
                pass  # (none yet, or another merge holds it: its link then finds this one's and takes it in)
            except OSError as e:  # (another user's entry in a shared folder): written over, as without a lock
                logger.debug("%s cannot be renamed (%s); merging into it in place", entry, e)
                write(data)
                return
            else:
                taken.append(aside)
                if _identity(aside) != read:  # (another merge's entry stood when it was taken: merged with it too)
                    data = body(taken)
            try:
                if not write(data, exclusive=True) and taken:
                    with contextlib.suppress(OSError):  # (not written, a full disk: what it held stays)
                        os.link(taken[0], entry)
                return
            except EntryStands:
                continue
        write(body([*taken, entry]))
    finally:
        for aside in taken:
            aside.unlink(missing_ok=True)


def _identity(path: Path) -> tuple[int, ...] | None:
    """Which file ``path`` names, as written (device, inode, size, mtime: an inode freed and reused differs); None
    where none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
