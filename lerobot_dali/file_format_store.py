"""The headers of local video files that building an iterator surveys (:mod:`.camera_codecs`), kept on disk, so a
rebuild of the same dataset reads none of them again.

Surveying reads each file's header, 0.3-0.5 ms of CPU a file: a v2.1 dataset of 15,000 episodes and two cameras cost
every rank of every run 12.6-12.8 s of CPU before its first batch; kept, 0.28-0.38 s (a ``stat`` a file, stamps
compared as plain values). One entry per dataset and camera holds each file's format with its stamp
(:func:`~lerobot_dali.file_stamps.stamp_from_stat`: size, inode, mtime, ctime), so a file re-encoded or replaced since
is read again, and only it (its last :data:`STAMPS_PER_FILE` stamps: hosts that each copy a dataset to a local disk at
one path, their cache folder shared, each find their copy's). An entry is written whole to a temporary name and renamed
(:func:`~lerobot_dali.cache_dirs.atomic_file`), so processes sharing the folder never read half a file; one whose
checksum or contents disagree is logged, deleted and written again. The first process to survey a camera whose entry
does not exist yet does it under an ``flock`` beside the entry (:data:`WAIT_S` at most); the node's other ranks wait
and load its result (where the entry is stale, each reads the changed files itself and merges them in, one at a time:
:mod:`.entry_merge`). Files that do not open are never kept: read again each build, they fail as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cache_dirs import (
    LOCK_FILES,
    TEMP_FILES,
    cache_root,
    checked_body,
    discard_damaged_entry,
    drop_lock_file,
    mark_used,
    newest_stamps,
    prune_unused_files,
    read_entry,
    wait_for_entry_lock,
)
from .camera_codecs import FileFormat
from .entry_merge import merge_entry
from .file_stamps import stat_version

__all__ = ["STORE_FORMAT", "SUFFIX", "WAIT_S", "FileFormatStore", "default_file_format_dir"]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout, part of every key (2: stamps without the device, which each host numbers a network
#: share by; an entry of either kind read by the other version was all stale, and both rewrote it in turn. Several
#: stamps a file, as rows of (path, size, version, format). 3: a format holds the stream's rate and end).
STORE_FORMAT = 3
#: Longest a process waits for another that surveys the same camera before it reads the headers itself.
WAIT_S = 300.0
#: Seconds between two looks at a lock another process holds.
_POLL_S = 0.05
#: The suffix of an entry: its sha256 on the first line, JSON after.
SUFFIX = ".formats"

#: A local file's stamp (:func:`~lerobot_dali.file_stamps.stamp_from_stat`) as (size, version): compared for 30,000
#: files a rebuild, a tuple each costs a fraction of a ``FileStamp``.
Stamp = tuple[int, str]
#: (path, stamp) -> format of the files an entry holds, each file's stamps oldest first.
Kept = dict[tuple[str, Stamp], FileFormat]
#: Stamps an entry keeps of one file: one host's copy of it each (a file re-encoded again and again: its last ones).
STAMPS_PER_FILE = 16


def default_file_format_dir() -> Path:
    """``$LEROBOT_DALI_CACHE/file_formats``, else ``~/.cache/lerobot_dali/file_formats``."""
    return cache_root() / "file_formats"


class FileFormatStore:
    """A folder of local video files' formats, an entry per dataset and camera; safe to share between processes."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_file_format_dir()

    def __repr__(self) -> str:
        return f"FileFormatStore({str(self.directory)!r})"

    def entry_for(self, dataset: str, camera: str) -> Path:
        """The file holding ``camera``'s formats of ``dataset`` (its root; two-level fan-out keeps folders small)."""
        digest = hashlib.sha256(json.dumps([STORE_FORMAT, dataset, camera]).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}{SUFFIX}"

    def formats(
        self,
        dataset: str,
        camera: str,
        paths: Sequence[str],
        read: Callable[[list[str]], list[FileFormat | None]],
    ) -> list[FileFormat | None]:
        """The format of each of ``paths`` (local files of ``camera`` of ``dataset``), from the entry where it
        holds the file at its stamp now, else ``read(the others)`` (None: a file that did not open), which are then
        kept. What ``read`` raises is raised, and nothing kept."""
        entry = self.entry_for(dataset, camera)
        stamps = {path: _stamp(path) for path in paths}  # (before any header is read: a file replaced meanwhile misses)
        kept = _load(entry)
        lock = None
        if kept is None and paths:
            lock = wait_for_entry_lock(entry, wait_s=WAIT_S, poll_s=_POLL_S)  # (the node's other ranks too)
            kept = _load(entry)
        try:
            kept = kept or {}
            found = {
                path: kept[key]
                for path, stamp in stamps.items()
                if stamp is not None and (key := (path, stamp)) in kept
            }
            missing = [path for path in paths if path not in found]
            if missing:
                logger.debug("camera %s: %d of %d video headers to read (%s)", camera, len(missing), len(paths), entry)
            fresh = dict(zip(missing, read(missing), strict=True)) if missing else {}
            new = {
                (path, stamp): f for path, f in fresh.items() if f is not None and (stamp := stamps[path]) is not None
            }
            if new:  # (over what another process stored since it was loaded: another host's copies, say)
                self._merge(entry, kept, new, locked=lock is not None)
            else:
                mark_used(entry)
        finally:
            if lock is not None:
                if entry.exists():
                    drop_lock_file(entry)
                lock.close()
        return [fresh[path] if path in fresh else found[path] for path in paths]

    def prune_unused(self) -> None:
        """Delete the entries no run has loaded for a while (:func:`~lerobot_dali.cache_dirs.prune_unused_files`)."""
        prune_unused_files(self.directory, f"*/*{SUFFIX}", LOCK_FILES, TEMP_FILES)

    def _merge(self, entry: Path, kept: Kept, new: Kept, *, locked: bool) -> None:
        """Write ``new`` into ``entry`` over what it holds now (``kept`` where nothing readable), one process at a time
        (:func:`~lerobot_dali.entry_merge.merge_entry`; ``locked``: the lock beside it held already): processes
        reading other files at once (ranks of other ``episodes=`` selections) each wrote over what another added
        between its load and its write (8 of 5 files each: 20-35 of their 40 headers lost). A failed write is logged
        once, never raised."""

        def body(files: list[Path]) -> bytes:
            held: Kept = {}
            for file in files:
                held.update(_load(file) or {})
            return _body(_with_newest(held or kept, new))

        merge_entry(
            entry, body, locked=locked, wait_s=WAIT_S, poll_s=_POLL_S, directory=self.directory, store_logger=logger,
            what="video file headers", otherwise="every build reads them again",
        )  # fmt: skip


def _body(kept: Kept) -> bytes:
    """``kept`` as an entry's JSON."""
    formats: dict[FileFormat, int] = {}
    files = [[path, *stamp, formats.setdefault(f, len(formats))] for (path, stamp), f in kept.items()]
    rows = [[f.codec, f.height, f.width, f.pix_fmt, *f.color, f.rate, f.end_s] for f in formats]
    return json.dumps({"formats": rows, "files": files}).encode()


def _stamp(path: str) -> Stamp | None:
    """``path``'s stamp now; None where it cannot be stat'ed (missing: reading its header says so)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, stat_version(st)


def _with_newest(kept: Kept, new: Kept) -> Kept:
    """``kept`` with the files' stamps of ``new`` as their newest, each file's oldest dropped past
    :data:`STAMPS_PER_FILE`."""
    merged = {key: f for key, f in kept.items() if key not in new} | new
    return {key: merged[key] for key in newest_stamps(merged, lambda key: key, STAMPS_PER_FILE)}


def _load(entry: Path) -> Kept | None:
    """What ``entry`` holds; None where it does not exist or cannot be read, or holds anything else (then deleted)."""
    found = read_entry(entry, logger, instead="reading the headers")  # (a folder that is none: its save says so)
    if found is None:
        return None
    raw, read = found
    try:
        return _parsed(json.loads(checked_body(raw)))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        discard_damaged_entry(
            entry, read, logger, what="video file header cache", problem=e, instead="reading the headers"
        )
        return None


def _parsed(raw: Any) -> Kept:
    """The files of an entry's JSON; raises ValueError where it holds anything else."""
    formats = []
    for codec, height, width, pix_fmt, space, full, rate, end_s in raw["formats"]:
        if not (isinstance(codec, str) and type(height) is type(width) is type(space) is int):
            raise ValueError("it holds other values than video formats")
        if not (isinstance(pix_fmt, str | None) and isinstance(full, bool)):
            raise ValueError("it holds other values than video formats")
        if not all(value is None or type(value) is float for value in (rate, end_s)):
            raise ValueError("it holds other values than video formats")
        formats.append(FileFormat(codec, height, width, pix_fmt, (space, full), rate, end_s))
    kept: Kept = {}
    n = len(formats)
    if not isinstance(raw["files"], list):
        raise ValueError("it holds other values than file stamps")
    for path, size, version, i in raw["files"]:
        if type(path) is not str or type(size) is not int or size < 0 or type(version) is not str:
            raise ValueError("it holds other values than file stamps")
        if type(i) is not int or not 0 <= i < n:
            raise ValueError("it holds other values than file stamps")
        kept[path, (size, version)] = formats[i]
    return kept
