"""Row counts, column names, list widths and index columns' value ranges of parquet data files, kept on local disk, so
that one process per cache folder reads them.

Opening a v3.0 dataset checks that each data file holds the rows ``meta/episodes`` places in it, and the columns (and
where the file's types fix them, the shapes) of the features read (:mod:`~lerobot_dali.episode_data_files`): one footer
read per data file (v2.x: per episode). A remote dataset of 1,000 data files costs every rank of every run 1,000 ranged
reads: 8 ranks of a node starting at once make 8,000, past the Hub's request rate limits, and a resumed job pays them
again. Local files cost CPU instead: a v2.1 dataset of 15,000 episodes, 3-6 s a rank and run. A footer is a fact about a
file's content, so what is checked of it is kept as one small JSON per set of files, keyed by the sha256 of their (path,
size, version): a changed file misses (a local file's version is its ``stat``:
:func:`~lerobot_dali.file_stamps.stamp_from_stat`). The first process to open a set reads it under an ``flock``; the
others, on the same node or on any node that shares the folder, wait for its result rather than read too (at most
:data:`WAIT_S`, then they read themselves). Files of servers that give no version (``run:`` stamps, valid one run) are
never kept. A store that cannot be written or read is skipped: it is never needed for correctness.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from .cache_dirs import (
    LOCK_FILES,
    TEMP_FILES,
    atomic_file,
    cache_root,
    checked_body,
    checksummed,
    discard_damaged_entry,
    drop_lock_file,
    mark_used,
    prune_unused_files,
    read_entry,
    wait_for_entry_lock,
)
from .file_stamps import FileStamp
from .url_secrets import masked_key

__all__ = ["STORE_FORMAT", "WAIT_S", "Footer", "cached_footers"]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout, part of every key (2: column names too; 3: their list widths and ``task_index``'s
#: range; 4: the value ranges of several index columns; 5: each distinct set of columns and list widths once, which
#: 15,000 files of one schema share: loading them took 227 ms of CPU, now 87, parsing and checking the same names;
#: 6: behind a line of its sha256, as the packet index store's: an entry a byte of which the disk changed, still JSON
#: of the right shape, was trusted, 176 of 3,000 such: another row count refused the dataset at each open).
STORE_FORMAT = 6
#: Longest a process waits for another to read the same files' row counts before it reads them itself.
WAIT_S = 300.0
#: Seconds between two looks at a lock another process holds.
_POLL_S = 0.2


class Footer(NamedTuple):
    """What a parquet file's footer says that opening a dataset checks."""

    rows: int
    columns: tuple[str, ...]
    #: Per column, its list levels' sizes, outermost first (-1: lists of varying length; none: a scalar column):
    #: :func:`~lerobot_dali.episode_rows.list_level_widths`. Empty: not known.
    list_widths: tuple[tuple[int, ...], ...] = ()
    #: Column -> its smallest and largest value in the file, from its row groups' statistics, for the index columns
    #: opening checks (``task_index``, ...: :data:`~lerobot_dali.episode_data_files.RANGED_COLUMNS`); a column
    #: the file lacks, or with a row group without statistics, is absent.
    value_ranges: Mapping[str, tuple[int, int]] = {}


def cached_footers(
    stamps: Mapping[str, FileStamp] | None,
    paths: Sequence[str],
    read: Callable[[list[str]], list[Footer]],
    *,
    directory: Path | None = None,
) -> list[Footer]:
    """The footers of ``paths``, ``read(paths)`` once per cache folder for files ``stamps`` versions (remote:
    :class:`~lerobot_dali.file_stamps.FileStamps`; local: :func:`~lerobot_dali.file_stamps.local_stamps`); else
    ``read(paths)`` directly (no stamps, or files without a version)."""
    if stamps is None or not paths or not all(path in stamps for path in paths):
        return read(list(paths))
    if not all(stamps[path].versioned for path in paths):
        return read(list(paths))
    named = [masked_key(path) for path in paths]  # (a filesystem that keeps a URL's query in its paths named its token)
    files = [(name, stamps[path].size, stamps[path].version) for name, path in zip(named, paths, strict=True)]
    digest = hashlib.sha256(json.dumps([STORE_FORMAT, files]).encode()).hexdigest()
    folder = directory if directory is not None else cache_root() / "row_counts"
    entry = folder / digest[:2] / f"{digest}.json"
    found = _load(entry, named)
    if found is not None:
        return found
    lock = wait_for_entry_lock(entry, wait_s=WAIT_S, poll_s=_POLL_S)
    try:
        found = _load(entry, named)  # (written by the process that held the lock)
        if found is not None:
            if lock is not None:  # (made again by this process's wait once that one had deleted it)
                drop_lock_file(entry)
            return found
        footers = read(list(paths))
        if _save(entry, named, footers) and lock is not None:
            drop_lock_file(entry)
        prune_unused_files(folder, "*/*.json", LOCK_FILES, TEMP_FILES)
        return footers
    finally:
        if lock is not None:
            lock.close()


def _load(entry: Path, paths: Sequence[str]) -> list[Footer] | None:
    found = read_entry(entry, logger, instead="reading the files")
    if found is None:
        return None
    body, read = found
    try:
        raw = json.loads(checked_body(body))
        if raw["paths"] != list(paths):
            raise ValueError("it holds other files")
        counts, schema_of, ranges = raw["rows"], raw["schema_of"], raw["value_ranges"]
        if not len(counts) == len(schema_of) == len(ranges) == len(paths):
            raise ValueError("it holds other files")
        schemas = [_schema(columns, widths) for columns, widths in raw["schemas"]]
        if not all(type(n) is int for n in counts):
            raise ValueError("it holds other values than row counts")
        if not all(type(i) is int and 0 <= i < len(schemas) for i in schema_of):
            raise ValueError("it holds other values than the numbers of its column sets")
        spans = [span for rs in ranges for span in (rs.values() if isinstance(rs, dict) else [None])]
        if not all(type(span) is list and len(span) == 2 and all(type(n) is int for n in span) for span in spans):
            raise ValueError("it holds other values than value ranges")
    except (ValueError, KeyError, TypeError) as e:
        discard_damaged_entry(entry, read, logger, what="row count cache file", problem=e, instead="reading the files")
        return None
    mark_used(entry)
    return [
        Footer(n, columns, widths, {name: (r[0], r[1]) for name, r in rs.items()})
        for n, (columns, widths), rs in zip(counts, (schemas[i] for i in schema_of), ranges, strict=True)
    ]


def _schema(columns: object, widths: object) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """An entry's columns and their list widths, as a Footer holds them; raises ValueError where it holds other."""
    if not isinstance(columns, list) or not all(type(c) is str for c in columns):
        raise ValueError("it holds other values than column names")
    if not isinstance(widths, list) or len(widths) != len(columns):
        raise ValueError("it holds other values than the columns' list widths")
    if not all(isinstance(w, list) and all(type(n) is int for n in w) for w in widths):
        raise ValueError("it holds other values than the columns' list widths")
    return tuple(columns), tuple(tuple(w) for w in widths)


def _save(entry: Path, paths: Sequence[str], footers: list[Footer]) -> bool:
    schemas: dict[tuple[tuple[str, ...], tuple[tuple[int, ...], ...]], int] = {}
    schema_of = [schemas.setdefault((f.columns, f.list_widths), len(schemas)) for f in footers]
    kept = {
        "paths": list(paths),
        "rows": [f.rows for f in footers],
        "schemas": [[list(columns), [list(w) for w in widths]] for columns, widths in schemas],
        "schema_of": schema_of,
        "value_ranges": [{name: list(r) for name, r in f.value_ranges.items()} for f in footers],
    }
    try:
        with atomic_file(entry, prefix=".rows") as f:
            f.write(checksummed(json.dumps(kept).encode()))
    except OSError as e:
        logger.debug("cannot keep row counts in %s (%s)", entry, e)
        return False
    return True
