"""Which frames of local video files, and which images of local data files, ``check --decode`` decoded without a
fault, kept on disk, so a check again decodes only the files changed since.

Decoding every frame is nearly all of a decode check's time (hours for a large dataset), and its verdict on a file is a
fact about the file's bytes, the frames decoded and the decoder. So each pass is kept as a verdict: the file's path and
stamp (:func:`~lerobot_dali.file_stamps.stamp_from_stat`: size, inode, mtime, ctime, so a file rewritten or replaced
misses), and a digest of the display frames decoded (what the rows, their ``timestamp_source`` and ``tolerance_s``
chose: another choice of frames misses). The entry's key holds the decoder's versions (lerobot_dali's, PyAV's, FFmpeg's
libraries') and :data:`STORE_FORMAT`, so a new decoder, or a version that checks frames otherwise, decodes all again.
An image camera's pass is its episode's rows of a parquet data file, kept alike (:func:`local_image_verdict`): its
digest names the camera, the rows, the size its images are held to and Pillow's version, which decodes them.
A failure is never kept: its frames are decoded again by every check, and fail as before.

One entry per dataset, laid out as :mod:`.file_format_store`'s (a sha256 line, JSON after; written whole to a temporary
name and renamed, an unreadable one logged and deleted; each file's last :data:`STAMPS_PER_FILE` stamps, one per host
copying the dataset to the same path). Only the process running the check reads and writes it, so its workers share it
without a lock; checks of one dataset at once (each of other episodes, say) merge their verdicts into it one at a time
(:mod:`.entry_merge`; before, each dropped the others' verdicts written meanwhile). Remote files are not
kept (see :func:`local_verdict`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import av
import numpy as np

from .cache_dirs import (
    LOCK_FILES,
    TEMP_FILES,
    cache_root,
    checked_body,
    discard_damaged_entry,
    mark_used,
    newest_stamps,
    prune_unused_files,
    read_entry,
)
from .entry_merge import merge_entry
from .file_format_store import STAMPS_PER_FILE
from .file_stamps import stat_version

__all__ = [
    "MERGE_WAIT_S",
    "SAVE_EVERY_S",
    "STORE_FORMAT",
    "SUFFIX",
    "PendingVerdicts",
    "Verdict",
    "VerifiedDecodeStore",
    "default_verified_decode_dir",
    "local_image_verdict",
    "local_verdict",
]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout and of what a pass means, part of every key: raise it when the check decodes or
#: judges frames otherwise (a new damage test), so no earlier pass is taken for one of the new kind.
STORE_FORMAT = 1
#: The suffix of an entry: its sha256 on the first line, JSON after.
SUFFIX = ".verified"
#: Seconds between two writes of a check's new verdicts: an hours-long check that is killed keeps most of its work.
SAVE_EVERY_S = 60.0
#: Seconds a write waits for another process's write of the same entry (a merge of a large entry: ~0.3 s).
MERGE_WAIT_S = 30.0

#: A pass: (local path, size, version of its stamp, digest of the display frames or the images decoded).
Verdict = tuple[str, int, str, str]


def default_verified_decode_dir() -> Path:
    """``$LEROBOT_DALI_CACHE/verified_decodes``, else ``~/.cache/lerobot_dali/verified_decodes``."""
    return cache_root() / "verified_decodes"


@functools.cache
def decoder_versions() -> list[Any]:
    """What a verdict depends on besides the file and its frames: :data:`STORE_FORMAT` (lerobot_dali's version moves
    with releases alone), lerobot_dali's version, PyAV (the check's backend) and FFmpeg's libraries, which flag
    damage."""
    from . import __version__  # (the package's __init__ may be importing this module's importers)

    libraries = sorted([name, list(version)] for name, version in av.library_versions.items())
    return [STORE_FORMAT, __version__, "pyav", av.__version__, libraries]


def local_verdict(path: str | None, frames: np.ndarray) -> Verdict | None:
    """The verdict on decoding display ``frames`` of local file ``path`` as it is now; None for a remote file (None)
    or one that cannot be stat'ed.

    Remote files get none: their stamp comes from the dataset's listing, which is only as good as the server's version
    (a 1 s ``Last-Modified`` over HTTP, none at all on some: a ``run:`` stamp), not a ``stat`` taken around the decode;
    and a remote check is mostly run to learn what the server serves now."""
    return _verdict(path, np.asarray(frames, dtype="<i8").tobytes())


def local_image_verdict(
    path: str | None, camera: str, rows: range, *, depth: bool, shape: tuple[int, ...] | None
) -> Verdict | None:
    """The verdict on decoding rows ``rows`` (a half-open range of the file's rows) of image camera ``camera`` in
    local data file ``path`` as it is now, as depth images or not, each held to ``shape`` (H, W, C; None: to none);
    None as :func:`local_verdict` says. Pillow decodes them (the decoder versions name PyAV's): its version is in
    the digest."""
    described = ["image", camera, rows.start, rows.stop, depth, None if shape is None else list(shape), _pillow()]
    return _verdict(path, json.dumps(described).encode())


def _verdict(path: str | None, decoded: bytes) -> Verdict | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path, st.st_size, stat_version(st), hashlib.sha256(decoded).hexdigest()[:32]


@functools.cache
def _pillow() -> str:
    import PIL

    return PIL.__version__


class VerifiedDecodeStore:
    """A folder of :data:`Verdict` sets, an entry per dataset (and decoder: :func:`decoder_versions`)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_verified_decode_dir()

    def __repr__(self) -> str:
        return f"VerifiedDecodeStore({str(self.directory)!r})"

    def entry_for(self, dataset: str) -> Path:
        """The file holding ``dataset``'s verdicts (its description: a local dataset's absolute root)."""
        digest = hashlib.sha256(json.dumps([dataset, decoder_versions()]).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}{SUFFIX}"

    def verdicts(self, dataset: str) -> list[Verdict]:
        """The passes kept of ``dataset``, oldest first; none where its entry is absent or unreadable (then
        deleted)."""
        entry = self.entry_for(dataset)
        kept = _read(entry)
        mark_used(entry)
        return kept

    def keep(self, dataset: str, new: Iterable[Verdict]) -> None:
        """Add passes ``new`` of ``dataset`` to what its entry holds now (another check's since loaded, too), each
        file's oldest stamps dropped past :data:`STAMPS_PER_FILE`; a failed write is logged once, never raised."""
        new = list(new)
        if not new:
            return

        def body(files: list[Path]) -> bytes:  # (another check's write between this read and write was lost)
            kept = _with_newest([v for file in files for v in _read(file)], new)
            paths: dict[str, int] = {}
            rows = [[paths.setdefault(path, len(paths)), size, version, digest] for path, size, version, digest in kept]
            return json.dumps({"paths": list(paths), "verdicts": rows}).encode()

        merge_entry(
            self.entry_for(dataset), body, wait_s=MERGE_WAIT_S, directory=self.directory, store_logger=logger,
            what="which frames check --decode verified", otherwise="every check decodes them again",
        )  # fmt: skip

    def prune_unused(self) -> None:
        """Delete the entries no check has loaded for a while (:func:`~lerobot_dali.cache_dirs.prune_unused_files`):
        those of another decoder's versions are never loaded again."""
        prune_unused_files(self.directory, f"*/*{SUFFIX}", LOCK_FILES, TEMP_FILES)


class PendingVerdicts:
    """A check's new passes, per dataset, kept in the store :data:`SAVE_EVERY_S` apart and when :meth:`save` is called
    at its end (a Ctrl-C included)."""

    def __init__(self, store: VerifiedDecodeStore) -> None:
        self.store = store
        self._new: defaultdict[str, list[Verdict]] = defaultdict(list)
        self._saved = time.monotonic()

    def add(self, verdicts: Iterable[tuple[str, Verdict]]) -> None:
        """Add ``(dataset, verdict)`` passes; keeps them all once a write is due."""
        for dataset, verdict in verdicts:
            self._new[dataset].append(verdict)
        if time.monotonic() - self._saved >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        """Keep every pass added since the last write."""
        for dataset, verdicts in self._new.items():
            self.store.keep(dataset, verdicts)
        self._new.clear()
        self._saved = time.monotonic()


def _read(entry: Path) -> list[Verdict]:
    """The passes ``entry`` holds; none where it is absent or unreadable (then deleted)."""
    found = read_entry(entry, logger, instead="decoding the files again")
    if found is None:
        return []
    raw, read = found
    try:
        return _parsed(json.loads(checked_body(raw)))
    except (ValueError, KeyError, TypeError) as e:
        discard_damaged_entry(
            entry, read, logger, what="verified decode cache", problem=e, instead="decoding the files again"
        )
        return []


def _with_newest(kept: list[Verdict], new: list[Verdict]) -> list[Verdict]:
    """``kept`` and ``new`` (newest last, each once), each file's verdicts of its oldest stamps dropped past
    :data:`STAMPS_PER_FILE`."""
    fresh = set(new)
    merged = dict.fromkeys(v for v in kept if v not in fresh) | dict.fromkeys(new)
    return newest_stamps(merged, lambda v: (v[0], (v[1], v[2])), STAMPS_PER_FILE)


def _parsed(raw: Any) -> list[Verdict]:
    """The verdicts of an entry's JSON; raises ValueError where it holds anything else."""
    paths = raw["paths"]
    if not isinstance(paths, list) or not all(type(p) is str for p in paths):
        raise ValueError("it holds other values than file paths")
    kept: list[Verdict] = []
    for i, size, version, digest in raw["verdicts"]:
        if type(i) is not int or not 0 <= i < len(paths) or type(size) is not int or size < 0:
            raise ValueError("it holds other values than file stamps")
        if type(version) is not str or type(digest) is not str:
            raise ValueError("it holds other values than file stamps")
        kept.append((paths[i], size, version, digest))
    return kept
