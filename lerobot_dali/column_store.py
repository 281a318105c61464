"""Data files written as one big row group, kept on local disk as memory-mapped Arrow so an episode read slices.

Parquet decodes whole row groups (pyarrow cannot skip pages within one), and LeRobot's v2.1 -> v3.0 converter
writes each data file (up to ~100 MB, thousands of episodes) as a single row group. Every episode read then
decoded the whole file to use a few hundred rows of it: 0.2-0.4 s and a peak RSS of ~0.9 GB per read for a
file of 1M rows (``bench/row_groups.py``), against 0.2-0.4 ms to slice the rows from a memory-mapped Arrow file.

So the columns a reader reads of such a file are written once per cache folder as one uncompressed Arrow IPC file
(1.3-2.3x the parquet file, measured) under ``cache_root()/columns``; every worker, rank and later run maps it,
and the OS page cache shares its pages between them (HF ``datasets``, under LeRobot's own loader, keeps Arrow
files for the same reason). Entries are keyed by the sha256 of (path, size, version, columns) and record their
key, so a changed file simply misses; stale entries stay until a sweep finds them unused
(:meth:`ColumnStore.prune_unused`), damaged ones are deleted at once. Arrow IPC holds no checksum, and a mapped
copy is read as it lies on disk: each record batch carries the crc32 of its buffers, checked the first time a read
touches it (0.5 ms per MB, once per process; a check of the whole file at each map cost 0.1-0.2 s per 200 MB in
each worker), so bytes the disk changed are found, logged and converted again rather than served as actions.

A file whose server gives no version (a ``run:`` stamp, new each run, shared by the ranks one ``torchrun`` starts on
a node) is copied for one run: its conversion first deletes the copies of earlier runs that no process maps now (its
readers hold a shared ``flock`` on it) and what their killed converters left, else each run left one more until the
sweep. One process converts a file (an ``flock``, where the filesystem takes locks), written under a temporary name
and renamed; the others read the row group directly meanwhile rather than wait. A store that cannot be written or
read is logged and skipped: it is never needed for correctness, and deleting it only costs the conversion again. A
folder that refuses writes (full, over quota, read-only) stops the process's conversions for good, with one warning;
mapped entries stay in use.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import fork_locks
from .cache_dirs import (
    CACHE_ENV,
    LOCK_FILES,
    TEMP_FILES,
    atomic_file,
    cache_root,
    delete_if_unchanged,
    delete_unless_held,
    drop_lock_file,
    folder_refuses,
    hold_shared,
    lock_file,
    mark_used,
    prune_unused_files,
    try_flock_where_supported,
)
from .file_stamps import FileStamp
from .remote_errors import is_transient
from .said_once import warn_once
from .url_secrets import masked_key

__all__ = ["STORE_FORMAT", "ColumnStore", "default_column_dir"]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout, part of every key: a new layout misses the old files.
STORE_FORMAT = 2

#: Schema metadata key of a stored file: the key it was written for, checked when mapped (a file copied over
#: another entry's name, or left by a store of another layout, is never served).
_KEY_METADATA = b"lerobot_dali.column_store.key"

#: Custom metadata key of each record batch: the crc32 of its buffers as the file holds them (:func:`_batch_sum`).
_SUM_METADATA = b"lerobot_dali.column_store.crc32"

#: The share of the disk a conversion leaves free (checkpoints and logs write there too).
_KEEP_FREE = 0.05

#: Rows decoded per batch while converting: bounds the memory of a conversion besides the compressed group.
_CONVERT_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class _Entry:
    """One stored file: the data file it copies, its key (recorded in the file), where it lies, its columns."""

    path: str
    key: str
    target: Path
    columns: list[str]
    #: A copy valid for one run (a ``run:`` stamp): it supersedes the earlier runs' copies of the same file and
    #: columns, and the processes mapping it hold a shared ``flock`` on it (:meth:`ColumnStore._drop_superseded`).
    superseding: bool


@dataclass
class _Mapped:
    """A mapped file: its table, its record batches with the checksums they were written with, which are checked."""

    table: pa.Table
    batches: list[pa.RecordBatch]
    #: The row each batch ends before.
    ends: list[int]
    sums: list[bytes]
    #: How the file stood when mapped: deleted when damaged unless another process replaced it meanwhile.
    read: os.stat_result
    checked: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        self.checked = [False] * len(self.batches)


def default_column_dir() -> Path:
    """``$LEROBOT_DALI_CACHE/columns``, else ``~/.cache/lerobot_dali/columns``."""
    return cache_root() / "columns"


class ColumnStore:
    """Columns of big-row-group parquet files as memory-mapped Arrow files in one folder, shared by processes.

    A read goes through the store when the row groups it must decode hold at least ``min_group_rows`` rows
    and ``min_ratio`` times the rows it wants. A direct read decodes the whole group for each episode, and
    training reads every episode of a file once per worker and epoch: with state and action of 14, 0.7 us
    per row (29 ms per read of a 40,000-row group, 2.8 ms at the 4,096-row floor), against ~0.3 ms to slice
    the mapped copy. Pickles as its settings: each process maps its own files.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        min_group_rows: int = 4_096,
        min_ratio: int = 8,
        max_open: int = 64,
    ) -> None:
        self.directory = Path(directory) if directory is not None else default_column_dir()
        self.min_group_rows = min_group_rows
        self.min_ratio = min_ratio
        self.max_open = max_open
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._open: OrderedDict[Path, _Mapped] = OrderedDict()
        #: The open files holding a shared lock on one-run copies this process maps (:meth:`_drop_superseded`).
        self._held: dict[Path, Any] = {}
        #: Entries this process failed to write or read: not tried again (each try decodes the whole group).
        self._failed: set[Path] = set()
        #: Entries this process found damaged on disk: converted again once, then read from the parquet.
        self._damaged: set[Path] = set()
        #: Why the folder takes no writes in this process (a full disk, a quota, read-only): no file is tried again.
        self._unwritable: str | None = None
        self._lock = fork_locks.lock()

    def __repr__(self) -> str:
        return f"ColumnStore({str(self.directory)!r}, min_group_rows={self.min_group_rows})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("directory", "min_group_rows", "min_ratio", "max_open")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def prune_unused(self) -> None:
        """Delete the stored files no run has mapped for a while (:func:`~lerobot_dali.cache_dirs.prune_unused_files`);
        a process mapping one keeps reading its copy."""
        prune_unused_files(self.directory, "*/*.arrow", LOCK_FILES, TEMP_FILES)

    def wants(self, group_rows: int, rows: int) -> bool:
        """Whether decoding ``group_rows`` rows to use ``rows`` of them costs enough to go through the store."""
        return group_rows >= self.min_group_rows and group_rows >= self.min_ratio * max(rows, 1)

    def holds(self, path: str, stamp: FileStamp, columns: list[str]) -> bool:
        """Whether ``columns`` of ``path`` at ``stamp`` are stored (so prefetching need not fetch its row groups)."""
        return self.path_for(path, stamp, columns).exists()

    def path_for(self, path: str, stamp: FileStamp, columns: list[str]) -> Path:
        """The Arrow file holding ``columns`` of ``path`` at ``stamp`` (two-level fan-out keeps folders small)."""
        return self._entry(path, stamp, columns).target

    def _entry(self, path: str, stamp: FileStamp, columns: list[str]) -> _Entry:
        named = masked_key(path)  # (written in the file: a path that keeps a URL's query named its token)
        key = json.dumps([STORE_FORMAT, named, stamp.size, stamp.version, sorted(columns)])
        if not _run_only(stamp):
            digest = hashlib.sha256(key.encode()).hexdigest()
            return _Entry(path, key, self.directory / digest[:2] / f"{digest}.arrow", columns, superseding=False)
        # One run's copy (its server gives no version): named for the file and columns, then the run, so the next
        # run's copy finds the ones it supersedes (:meth:`_drop_superseded`).
        # (The size goes with the run: a file of another size on the server is the same file in another run.)
        file = hashlib.sha256(json.dumps([STORE_FORMAT, named, sorted(columns)]).encode()).hexdigest()
        run = hashlib.sha256(json.dumps([stamp.version, stamp.size]).encode()).hexdigest()[:16]
        return _Entry(path, key, self.directory / file[:2] / f"{file}.{run}.arrow", columns, superseding=True)

    def rows(
        self,
        parquet: pq.ParquetFile,
        read_lock: threading.RLock,
        *,
        path: str,
        stamp: FileStamp,
        stored_columns: list[str],
        columns: list[str],
        row_start: int,
        length: int,
    ) -> pa.Table | None:
        """Rows ``[row_start, row_start + length)`` of ``columns`` (some of ``stored_columns``, the entry's), or
        None where the caller must read the parquet itself (another process is converting the file, or the store
        failed: logged)."""
        entry = self._entry(path, stamp, stored_columns)
        mapped = self._table(parquet, read_lock, entry)
        if mapped is None or not self._intact(entry, mapped, row_start, length):
            return None
        return mapped.table.slice(row_start, length).select(columns)

    def _intact(self, entry: _Entry, mapped: _Mapped, row_start: int, length: int) -> bool:
        """Whether the batches holding rows ``[row_start, row_start + length)`` match their checksums; a file that
        does not is logged, dropped and deleted (converted again at the next read, once per process)."""
        if length <= 0 or not mapped.batches:
            return True
        last = len(mapped.batches) - 1
        first = min(bisect.bisect_right(mapped.ends, row_start), last)
        for i in range(first, min(bisect.bisect_right(mapped.ends, row_start + length - 1), last) + 1):
            if mapped.checked[i]:
                continue
            if _batch_sum(mapped.batches[i]) != mapped.sums[i]:
                break
            mapped.checked[i] = True  # (a race checks a batch twice: same answer)
        else:
            return True
        target = entry.target
        start = mapped.ends[i - 1] if i else 0
        with self._lock:
            self._open.pop(target, None)
            self._held.pop(target, None)
            again = target in self._damaged
            self._damaged.add(target)
        logger.warning(
            "column store file %s: rows %d-%d of %s disagree with their checksum (changed on disk); deleting it and "
            "reading the parquet%s",
            target,
            start,
            mapped.ends[i] - 1,
            entry.path,
            ", as every later read of this process (its second copy was damaged too: check that disk)" if again else "",
        )
        if again:
            self._give_up(target)
        try:
            delete_if_unchanged(target, mapped.read)  # (not a good one another process stored meanwhile)
        except OSError as e:
            logger.warning("cannot delete %s (%s)", target, e)
        return False

    def _table(self, parquet: pq.ParquetFile, read_lock: threading.RLock, entry: _Entry) -> _Mapped | None:
        target = entry.target
        with self._lock:
            mapped = self._open.get(target)
            if mapped is not None:
                self._open.move_to_end(target)
                return mapped
            if target in self._failed:
                return None
        expected_rows = parquet.metadata.num_rows
        mapped = self._map(entry, expected_rows)
        if mapped is None:
            if not self._convert(parquet, read_lock, entry):
                return None
            mapped = self._map(entry, expected_rows)
            if mapped is None:
                self._give_up(target)
                return None
        with self._lock:
            self._open[target] = mapped
            while len(self._open) > self.max_open:
                evicted, _ = self._open.popitem(last=False)
                self._held.pop(evicted, None)
        return mapped

    def _map(self, entry: _Entry, expected_rows: int) -> _Mapped | None:
        """The stored table, or None when absent or unusable: a damaged or mismatched file is logged and deleted;
        one that cannot be opened here (no file descriptors left, no permission) is logged and kept for others."""
        target, key = entry.target, entry.key
        read: os.stat_result | None = None
        try:
            mapped = pa.memory_map(str(target))
            read = os.fstat(mapped.fileno())
            reader = pa.ipc.open_file(mapped)
            batches, sums = [], []
            for i in range(reader.num_record_batches):
                batch, metadata = reader.get_batch_with_custom_metadata(i)
                batches.append(batch)
                sums.append((metadata or {}).get(_SUM_METADATA, b""))
            table = pa.Table.from_batches(batches, schema=reader.schema)
        except (FileNotFoundError, NotADirectoryError):  # (the latter: the store's folder is a file)
            return None
        except pa.ArrowInvalid as e:  # truncated, empty or not Arrow
            problem = f"is damaged ({e})"
        except (OSError, pa.ArrowException) as e:
            logger.warning(
                "column store file %s cannot be opened (%s: %s); reading the parquet", target, type(e).__name__, e
            )
            return None
        else:
            stored_key = (table.schema.metadata or {}).get(_KEY_METADATA, b"").decode(errors="replace")
            missing = [c for c in entry.columns if c not in table.column_names]
            if stored_key == key and not missing and table.num_rows == expected_rows and all(sums):
                if entry.superseding:  # (the next run deletes it only once no process holds it)
                    if not hold_shared(mapped, target):
                        return None  # (deleted meanwhile: converted again)
                    with self._lock:
                        self._held[target] = mapped
                mark_used(target)
                return _Mapped(table, batches, list(itertools.accumulate(b.num_rows for b in batches)), sums, read)
            problem = (
                f"was written for {stored_key or 'no key'} with {table.num_rows} rows, not for {key} with "
                f"{expected_rows} rows"
                if all(sums)
                else "holds record batches without a checksum"
            )
        logger.warning("column store file %s %s; deleting it", target, problem)
        try:
            delete_if_unchanged(target, read)  # (not a good one another process stored meanwhile)
        except OSError as e:
            logger.warning("cannot delete %s (%s)", target, e)
        return None

    def _convert(self, parquet: pq.ParquetFile, read_lock: threading.RLock, entry: _Entry) -> bool:
        """Write the entry's columns of ``parquet`` to its file; False while another process converts it, when
        the data file cannot be read (the caller's direct read reports why) or the store cannot be written.

        A transient error reading a remote data file (after its retries) is raised, as a direct read raises it.
        """
        path, target = entry.path, entry.target
        if self._unwritable is not None:
            return False
        fresh: Any = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            lock, locked = try_flock_where_supported(lock_file(target))
            if lock is None:
                return False  # another process converts it: read directly this time
            with lock:
                if target.exists():  # converted by the process that held the lock before
                    drop_lock_file(target)
                    return True
                if entry.superseding:  # (first: with room for one copy, an earlier run's took this run's room)
                    self._drop_superseded(entry)
                if not _room_for(parquet, entry.columns, target.parent, path):
                    self._give_up(target)
                    return False
                prefix = f".{target.stem}."
                for stale in target.parent.glob(f"{prefix}*.tmp") if locked else ():  # a killed converter's
                    stale.unlink(missing_ok=True)  # (unlocked, maybe another process's under way: swept when old)
                started = time.perf_counter()
                with atomic_file(target, prefix=prefix, durable=True) as tmp, read_lock:  # (mapped, unchecked)
                    _write_arrow(parquet, entry.columns, entry.key, tmp)
                    if entry.superseding:  # (held through the rename until this process maps it)
                        fresh = open(tmp.name, "rb")  # noqa: SIM115
                        hold_shared(fresh, Path(tmp.name))
                drop_lock_file(target)
            if fresh is not None:
                with self._lock:
                    self._held.setdefault(target, fresh)
        except _DataReadError as e:
            if is_transient(e.cause):
                raise e.cause from None
            return False
        except OSError as e:
            fix = folder_refuses(self.directory, e)
            if fix is None:
                self._write_failed(path, target, e)
                return False
            self._unwritable = f"{type(e).__name__}: {e}"
            warn_once(
                logger,
                "column store: cannot write to %s (%s); this process reads data files with big row groups from "
                "their parquet row groups, decoding each whole group per read: %s or move the store with $%s",
                self.directory,
                self._unwritable,
                fix,
                CACHE_ENV,
            )
            return False
        except pa.ArrowException as e:
            self._write_failed(path, target, e)
            return False
        logger.info(
            "column store: wrote %d rows of %s (%d column(s)) to %s in %.2f s",
            parquet.metadata.num_rows,
            path,
            len(entry.columns),
            target,
            time.perf_counter() - started,
        )
        return True

    def _drop_superseded(self, entry: _Entry) -> None:
        """Delete the copies of ``entry``'s file and columns that earlier runs wrote and no process maps now, and what
        their converters killed mid-write left (a temporary copy, up to a whole one, and a lock file no process holds):
        the server gives the file no version, so each run's copy (1.3-2.3x the parquet) is valid for that run alone,
        and they stayed until the sweep, one more per run. Those of runs still reading or converting stay theirs."""
        target = entry.target
        file = target.name.split(".")[0]
        for other in target.parent.glob(f"{file}.*.arrow"):
            if other != target and delete_unless_held(other):
                logger.info(
                    "column store: deleted %s, an earlier run's copy of %s: its server gives no version, so no "
                    "later run can use it",
                    other,
                    entry.path,
                )
        for other in target.parent.glob(f"{file}.*.lock"):
            if other == lock_file(target):
                continue
            with contextlib.suppress(OSError):
                lock, locked = try_flock_where_supported(other)
                if lock is None or not locked:  # (converting now; or no lock tells a killed converter apart)
                    continue
                with lock:
                    for left in target.parent.glob(f".{other.stem}.*.tmp"):
                        left.unlink(missing_ok=True)
                    other.unlink()

    def _write_failed(self, path: str, target: Path, error: Exception) -> None:
        warn_once(
            logger,
            "column store: cannot write %s for %s (%s: %s); its episodes are read from the parquet row groups, "
            "decoding each whole group per read",
            target,
            path,
            type(error).__name__,
            error,
        )
        self._give_up(target)

    def _give_up(self, target: Path) -> None:
        with self._lock:
            self._failed.add(target)


class _DataReadError(Exception):
    """Reading the data file failed while converting it: its own error, not the store's."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


#: Bytes per value of parquet's fixed-width physical types, as Arrow holds them decoded.
_VALUE_BYTES = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def arrow_bytes(parquet: pq.ParquetFile, columns: list[str]) -> int:
    """About how many bytes ``columns`` of ``parquet`` take decoded in Arrow: every value at its width (parquet's
    uncompressed size is still dictionary- and run-length-encoded: an all-zero column of 1M rows x 19 floats
    is 2.5 MB there and 76 MB in Arrow), byte arrays at their size, plus offsets and validity per row."""
    meta = parquet.metadata
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(meta.num_columns):
            chunk = group.column(c)  # a leaf: "action.list.element" for the list column "action"
            if not any(chunk.path_in_schema == name or chunk.path_in_schema.startswith(f"{name}.") for name in columns):
                continue
            width = _VALUE_BYTES.get(chunk.physical_type)
            values = chunk.num_values * width if width else chunk.total_uncompressed_size
            total += values + 9 * group.num_rows
    return total


def _room_for(parquet: pq.ParquetFile, columns: list[str], directory: Path, path: str) -> bool:
    """Whether the disk holds the copy and keeps :data:`_KEEP_FREE` of itself free (logged when not)."""
    need = arrow_bytes(parquet, columns)
    disk = shutil.disk_usage(directory)
    if disk.free - need >= _KEEP_FREE * disk.total:
        return True
    logger.warning(
        "column store: %s has %.1f GB free; converting %s needs ~%.2f GB and would leave less than %d%% of the "
        "disk free, so its episodes are read from the parquet row groups (decoding each whole group per read); "
        "free space or move the store with $%s",
        directory,
        disk.free / 1e9,
        path,
        need / 1e9,
        int(100 * _KEEP_FREE),
        CACHE_ENV,
    )
    return False


def _run_only(stamp: FileStamp) -> bool:
    """Whether ``stamp`` identifies its file for one run only (a server that gives no version: ``run:``)."""
    return stamp.version.startswith("run:")


def _write_arrow(parquet: pq.ParquetFile, columns: list[str], key: str, sink: Any) -> None:
    schema = pa.schema([parquet.schema_arrow.field(c) for c in columns], metadata={_KEY_METADATA: key.encode()})
    batches = parquet.iter_batches(batch_size=_CONVERT_BATCH_ROWS, columns=columns, use_threads=False)
    with pa.ipc.new_file(sink, schema) as writer:
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (OSError, pa.ArrowException) as e:
                raise _DataReadError(e) from e
            writer.write_batch(batch, custom_metadata={_SUM_METADATA: _batch_sum(_as_written(batch))})


def _as_written(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as IPC writes it (a buffer cut to its length: a decoded one may be longer), dictionaries too."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


def _batch_sum(batch: pa.RecordBatch) -> bytes:
    """The crc32 of ``batch``'s buffers and its dictionaries' (at any depth): damage, not tampering, is what a check
    finds (sha256 costs twice as much)."""
    crc = 0
    for array in itertools.chain.from_iterable(_summed_arrays(column) for column in batch.columns):
        for buffer in array.buffers():
            if buffer is not None:
                crc = zlib.crc32(buffer, crc)
    return b"%08x" % crc


def _summed_arrays(array: pa.Array) -> Iterator[pa.Array]:
    """``array`` and every dictionary within it: its buffers() hold its children's but only a dictionary's indices
    (a column's, a list's, a struct field's), whose values IPC writes in a batch of their own."""
    yield array
    if pa.types.is_dictionary(array.type):
        yield from _summed_arrays(array.dictionary)
        return
    for child in _children(array):
        if _holds_dictionary(child.type):
            yield from itertools.islice(_summed_arrays(child), 1, None)  # (its buffers are among array's)


def _children(array: pa.Array) -> list[pa.Array]:
    if isinstance(array, (pa.StructArray, pa.UnionArray)):
        return [array.field(i) for i in range(array.type.num_fields)]
    values = getattr(array, "values", None)  # lists, maps, fixed-size lists, list views, run-end encoded
    return [values] if isinstance(values, pa.Array) else []


def _holds_dictionary(data_type: pa.DataType) -> bool:
    return pa.types.is_dictionary(data_type) or any(
        _holds_dictionary(data_type.field(i).type) for i in range(data_type.num_fields)
    )
