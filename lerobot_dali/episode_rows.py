"""Read one episode's rows from its data parquet: declared columns only, typed and shaped as declared.

A v3 data file packs many episodes, so only the row groups that overlap the episode are read. Columns the
dataset declares are checked against ``info.json`` (presence, width, castability) and undeclared extras
(e.g. variable-length ``language_events``) are never read, so schema drift fails loudly, naming the file,
instead of surfacing as a shape error in the model.
"""

from __future__ import annotations

import io
import json
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import fork_locks, open_files
from .column_store import ColumnStore
from .dataset_info import INDEX_COLUMNS, Feature
from .errors import DataFileError, DatasetError, MissingDataFileError, SchemaMismatchError, cameras_hint
from .file_stamps import FileStamp, stamp_from_stat
from .remote_errors import is_transient

__all__ = [
    "DecodedGroups",
    "ParquetCache",
    "StoreEntry",
    "check_column_shape",
    "damaged_parquet_as",
    "image_bytes",
    "integer_column_range",
    "list_level_widths",
    "miscounted_rows_advice",
    "missing_columns_advice",
    "open_parquet",
    "opened_stamp",
    "read_episode_images",
    "read_episode_rows",
    "row_group_starts",
    "row_groups_holding",
]


@dataclass(frozen=True)
class StoreEntry:
    """Where a data file's rows may be read without decoding whole row groups."""

    store: ColumnStore
    #: The file's stamp (the store's key; None: unknown, so the store is not used), asked only when it is wanted.
    stamp: Callable[[], FileStamp | None]
    #: What the store keeps of the file: every column the reader reads of it, so reads of subsets share one copy.
    columns: list[str]


class DecodedGroups:
    """Row groups already decoded, for reading many episodes of one data file from one decode of its row groups.

    Without it each episode read decodes every row group it overlaps whole, which for a file of many episodes in
    one row group (too small for the column store) costs the group's rows per episode: :func:`check_dataset
    <lerobot_dali.dataset_check.check_dataset>` read 1,000 episodes of 35 rows from one 35,000-row group, once
    per episode. Keeps the last rows decoded of each column set (as much memory as one read of them takes);
    the iterator's workers, which read an episode of a file once per pool, do not use it. One thread's.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[str, ...], tuple[pq.ParquetFile, range, pa.Table]] = {}

    def get(self, parquet: pq.ParquetFile, groups: range, columns: list[str]) -> tuple[pa.Table, int] | None:
        """The decoded rows of ``columns`` holding row groups ``groups`` of ``parquet``, and the group they start
        at; None when not decoded."""
        held = self._tables.get(tuple(columns))
        if held is None:
            return None
        held_parquet, held_groups, table = held
        if held_parquet is not parquet or not held_groups.start <= groups.start <= groups.stop <= held_groups.stop:
            return None
        return table, held_groups.start

    def put(self, parquet: pq.ParquetFile, groups: range, columns: list[str], table: pa.Table) -> None:
        self._tables[tuple(columns)] = (parquet, groups, table)


#: Memory of a parsed parquet footer over its serialized size (7.5x and 8.4x measured on two LeRobot-like layouts
#: with a row group per episode).
FOOTER_MEMORY_FACTOR = 8


def _footer_memory(parquet: pq.ParquetFile) -> int:
    return FOOTER_MEMORY_FACTOR * parquet.metadata.serialized_size


def read_parquet(handle: Any, columns: Sequence[str] | None = None) -> pa.Table:
    """A whole parquet file (``columns`` of it) from an open binary file object.

    Not ``pq.read_table``: on a file object it goes through the dataset scanner, whose threads outlive it and,
    at interpreter exit, abort the process ("terminate called without an active exception", exit 134: apache/arrow
    issues 34314 and 39162). Measured with pyarrow 26.0.1: a script that only opened a dataset exited 134 in 10 to
    25% of runs; read so, in none of 50. A column the file lacks is left out (``read_table`` raised).
    """
    return pq.ParquetFile(handle).read(columns=None if columns is None else list(columns))


@contextmanager
def damaged_parquet_as(error: type[DatasetError], path: str) -> Iterator[None]:
    """Raise pyarrow's failure to read the parquet file ``path`` as ``error`` naming it.

    pyarrow raises an ArrowException for most damage, but an OSError for bytes that do not parse (a page header's
    thrift) and a UnicodeDecodeError for a column name that is not UTF-8; a network failure (after its retries) is
    raised as itself, since the file is not to blame. String values are not checked as they are read: validate the
    table (``validate(full=True)``) inside, or their first use raises UnicodeDecodeError.
    """
    try:
        yield
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        if is_transient(e):
            raise
        raise error(f"{path} is not a readable parquet file ({e}); re-download it") from e


def open_parquet(open_file: Callable[[str], Any], path: str) -> pq.ParquetFile:
    """``path`` opened with ``open_file`` and its footer parsed; close it with ``close(force=True)``.

    Raises MissingDataFileError or DataFileError naming the file; a network failure (after its retries) is
    raised as itself, since the file is not to blame.
    """
    try:
        handle = open_file(path)
    except FileNotFoundError as e:
        raise MissingDataFileError(
            f"data file {path} is missing (listed in the episode metadata); download the dataset again, or leave "
            "this file's episodes out (episodes=[...])"
        ) from e
    except IsADirectoryError as e:  # (a download's or copy's leftover: Python's bare error named no fix)
        raise MissingDataFileError(
            f"data file {path} is a folder, not a parquet file: download the dataset again, or leave this file's "
            "episodes out (episodes=[...])"
        ) from e
    try:
        # Pages written with checksums (pyarrow's write_page_checksum=True) are verified as they are read: a
        # flipped byte inside a page's values otherwise reads as another value. LeRobot's own files carry none.
        parquet = pq.ParquetFile(handle, page_checksum_verification=True)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # (a column name that is not UTF-8)
        handle.close()
        if is_transient(e):
            raise
        raise DataFileError(f"data file {path} is not readable parquet ({e}); re-download or rewrite it") from e
    stamp = _handle_stamp(handle)
    if stamp is not None:
        _OPENED_STAMPS[parquet] = stamp
    return parquet


class ParquetCache:
    """A per-process LRU of open parquet files: footers are read once, not once per episode.

    Bounded by count, by the data files' share of the open-file limit (:mod:`.open_files`: 32 at ``ulimit -n 256``,
    shared with the process's other caches; a v2.1 pool's file per episode failed there with EMFILE beside
    the video files) and by the parsed footers' memory: an episode pool draws from many files (64 episodes of a large
    v3.0 dataset sit in ~50 files), and a file with a row group per episode has a footer of ~800 bytes per episode
    (8 MB at 10,000), which took 100 ms to parse again each time 16 open files were not enough; parsed, a footer
    takes ~8 times its serialized size (:data:`FOOTER_MEMORY_FACTOR`).
    Keyed by process id too, so a cache inherited through ``fork`` is never reused by the child. Threads read
    through :meth:`reading`: a file evicted while another thread reads it is closed when that read ends (closed at
    once, the read failed as a corrupt file); reads of one file take turns (:func:`_read_lock`), of two run at once.
    """

    def __init__(
        self,
        open_file: Callable[[str], Any],
        *,
        max_open: int = 16,
        max_footer_bytes: int = 192 * 2**20,
        bound_of: Callable[[str], int] | None = None,
    ) -> None:
        """``bound_of``: the most files of ``path``'s kind kept open (a union's local files: 128, its remote ones,
        each holding a read-ahead buffer: 16), within ``max_open`` for all; None: ``max_open`` for every file."""
        self._open_file = open_file
        self._max_open = max_open
        self._bound_of = bound_of
        #: The bound of each open file's kind (:meth:`_trim_kind`), where ``bound_of`` is given.
        self._bounds: dict[tuple[int, str], int] = {}
        self._max_footer_bytes = max_footer_bytes
        self._open: OrderedDict[tuple[int, str], pq.ParquetFile] = OrderedDict()
        self._footer_bytes = 0
        self._lock = fork_locks.lock()
        #: Files handed out by :meth:`reading` whose reads have not all ended -> how many are running.
        self._readers: dict[pq.ParquetFile, int] = {}

    @property
    def max_open(self) -> int:
        """The most files kept open (fewer where the process's open-file share is smaller)."""
        return self._max_open

    def get(self, path: str) -> pq.ParquetFile:
        """``path``'s open file, for its footer: another thread's :meth:`get` may evict and close it at any time."""
        return self._get(path, read=False)

    @contextmanager
    def reading(self, path: str) -> Iterator[pq.ParquetFile]:
        """``path``'s open file, kept open until the block ends even where another thread evicts it meanwhile."""
        parquet = self._get(path, read=True)
        try:
            yield parquet
        finally:
            with self._lock:
                self._readers[parquet] -= 1
                if not self._readers[parquet]:
                    del self._readers[parquet]
                    if all(held is not parquet for held in self._open.values()):  # evicted meanwhile
                        parquet.close(force=True)

    def _get(self, path: str, *, read: bool) -> pq.ParquetFile:
        key = (os.getpid(), path)
        with self._lock:
            asked = open_files.DATA_FILES.asked(self)  # (by another cache that found none of the share left)
            if asked is not None:
                self._trim(asked, self._max_footer_bytes)
            if key in self._open:
                self._open.move_to_end(key)
                return self._counted(self._open[key], read)
        parquet = open_parquet(self._open_file, path)
        with self._lock:
            raced = self._open.get(key)
            if raced is not None:  # another thread opened it meanwhile
                parquet.close(force=True)
                self._open.move_to_end(key)
                return self._counted(raced, read)
            max_open = min(self._max_open, open_files.DATA_FILES.files_for(self))
            if max_open:
                self._open[key] = parquet
                self._footer_bytes += _footer_memory(parquet)
                if self._bound_of is not None:
                    self._bounds[key] = self._bound_of(path)
                    self._trim_kind(self._bounds[key])
                # (the newest stays, whatever its footer's size)
                self._trim(max_open, max(self._max_footer_bytes, _footer_memory(parquet)))
            else:  # the others hold the whole share: kept by none, a read's file closes at its end (a get()'s when
                # its caller drops it)
                self._trim(0, 0)
            return self._counted(parquet, read)

    def _trim(self, files: int, footer_bytes: int) -> None:
        """Keep at most ``files`` open, their footers within ``footer_bytes``: the least recently used close."""
        while len(self._open) > files or self._footer_bytes > footer_bytes:
            self._evict(next(iter(self._open)))
        open_files.DATA_FILES.holding(self, len(self._open))

    def _trim_kind(self, bound: int) -> None:
        """Keep at most ``bound`` files of the kind bounded so open: the least recently used of them close."""
        kind = [key for key in self._open if self._bounds[key] == bound]
        for key in kind[: max(0, len(kind) - bound)]:
            self._evict(key)

    def _evict(self, key: tuple[int, str]) -> None:
        old = self._open.pop(key)
        self._bounds.pop(key, None)
        self._footer_bytes -= _footer_memory(old)
        if old not in self._readers:  # (else its last read closes it)
            old.close(force=True)  # (without force pyarrow leaves a handle it did not open to the GC)

    def close(self) -> None:
        """Close every open file now (one being read closes when its read ends); later reads open them again."""
        with self._lock:
            files = list(self._open.values())
            self._open.clear()
            self._bounds.clear()
            self._footer_bytes = 0
            open_files.DATA_FILES.leaving(self)
            for parquet in files:
                if parquet not in self._readers:
                    parquet.close(force=True)

    def _counted(self, parquet: pq.ParquetFile, read: bool) -> pq.ParquetFile:
        if read:
            self._readers[parquet] = self._readers.get(parquet, 0) + 1
        return parquet

    def __getstate__(self) -> dict[str, object]:
        # Open handles never cross a process boundary; the child opens its own.
        return {
            "_open_file": self._open_file,
            "_max_open": self._max_open,
            "_max_footer_bytes": self._max_footer_bytes,
            "_bound_of": self._bound_of,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._open = OrderedDict()
        self._bounds = {}
        self._footer_bytes = 0
        self._lock = fork_locks.lock()
        self._readers = {}


def read_episode_rows(
    parquet: pq.ParquetFile,
    *,
    path: str,
    row_start: int,
    length: int,
    features: dict[str, Feature],
    store: StoreEntry | None = None,
    decoded: DecodedGroups | None = None,
) -> dict[str, np.ndarray]:
    """Rows ``[row_start, row_start + length)`` of ``parquet`` as ``{key: array (length, *shape)}``.

    Scalar features (declared shape ``(1,)``) come out as ``(length,)``, as LeRobot batches them. ``decoded``:
    row groups decoded by earlier reads of the file, reused and kept.
    """
    _require_columns(parquet, path, list(features))
    table = _read_row_range(parquet, path, row_start, length, list(features), store, decoded)
    return {key: _column_to_numpy(table[key], feature, path) for key, feature in features.items()}


def read_episode_images(
    parquet: pq.ParquetFile,
    *,
    path: str,
    row_start: int,
    length: int,
    key: str,
    store: StoreEntry | None = None,
    decoded: DecodedGroups | None = None,
) -> pa.Array:
    """The encoded images (PNG/JPEG bytes) of camera ``key`` in rows ``[row_start, row_start + length)``."""
    _require_columns(parquet, path, [key], cameras=[key])
    column = _read_row_range(parquet, path, row_start, length, [key], store, decoded)[key].combine_chunks()
    return image_bytes(column, path=path, key=key, row_start=row_start)


def image_bytes(column: pa.Array, *, path: str, key: str, row_start: int = 0) -> pa.Array:
    """The encoded images of an image column's rows (``row_start``: the first row's number, for messages).

    LeRobot stores ``dtype: "image"`` features as ``datasets.Image``: a struct of the file's ``bytes`` and a
    ``path``; a plain binary column is accepted too. A missing image raises DataFileError naming the row.
    """
    if pa.types.is_struct(column.type) and column.type.get_field_index("bytes") >= 0:
        encoded = column.field("bytes")
        missing = pc.or_(column.is_null(), encoded.is_null())
    elif pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        encoded, missing = column, column.is_null()
    else:
        raise SchemaMismatchError(
            f"{path}: column {key!r} is declared an image but holds {column.type}; expected a struct with "
            "'bytes' (datasets.Image) or binary: rewrite the data files with the encoded images in the column (as "
            f"LeRobot writes them), or leave out camera {key!r} with {cameras_hint()}"
        )
    if missing.true_count:
        row = row_start + int(pc.index(missing, True).as_py())
        raise DataFileError(
            f"{path}: row {row} has no image bytes for {key!r} (images stored as paths are not supported); "
            "rewrite the dataset with the images embedded"
        )
    return encoded


def _require_columns(parquet: pq.ParquetFile, path: str, keys: list[str], *, cameras: Sequence[str] = ()) -> None:
    schema = _arrow_schema(parquet)
    missing = [k for k in keys if schema.get_field_index(k) < 0]
    if missing:
        raise SchemaMismatchError(
            f"{path}: declared feature(s) {missing} have no column in the data file "
            f"(columns present: {schema.names}); {missing_columns_advice(missing, cameras=cameras)}"
        )


def missing_columns_advice(missing: Sequence[str], *, cameras: Sequence[str] = ()) -> str:
    """What to do where the data files lack the columns of declared features ``missing`` (``cameras``: which of
    all features are image cameras): an index column is read whatever keys= selects, so only the files can mend it."""
    index = [k for k in missing if k in INDEX_COLUMNS]
    if index:
        return (
            f"{index} are index columns every batch reads, whatever keys= selects: re-download the dataset, or "
            "rewrite its data files with these columns"
        )
    ways = []
    if images := [k for k in missing if k in cameras]:
        ways.append(f"leave out camera(s) {images} with {cameras_hint()}")
    if others := [k for k in missing if k not in cameras]:
        ways.append(
            f"leave out {others} with keys=[...] naming the features to read (on the command line: --keys KEY ...)"
        )
    return (
        f"{' and '.join(ways)}, or, if the dataset never recorded them, drop them from the features in meta/info.json"
    )


def miscounted_rows_advice(episodes: str, *, at_open: bool = False) -> str:
    """What to do where a data file holds other rows than the episode metadata gives ``episodes`` (e.g. "episode
    3"): most often a download or copy cut the file short; no option reads the rows the metadata means.
    ``at_open``: found by the open, which ``lerobot-dali check`` runs too (it fails there, listing nothing), so the
    message names no more than it does; found as an episode is read, check lists every such file."""
    listed = "" if at_open else "; `lerobot-dali check` lists every such file"
    return (
        f"the data file and meta/episodes disagree (a download or copy cut short?): download the dataset again, or "
        f"leave out {episodes} (episodes=[...] of the others){listed}"
    )


def _read_row_range(
    parquet: pq.ParquetFile,
    path: str,
    row_start: int,
    length: int,
    columns: list[str],
    store: StoreEntry | None,
    decoded: DecodedGroups | None = None,
) -> pa.Table:
    meta = parquet.metadata
    stop = row_start + length
    if stop > meta.num_rows:
        raise SchemaMismatchError(
            f"{path}: the episode metadata places rows [{row_start}, {stop}) in this file but it has "
            f"{meta.num_rows} rows; {miscounted_rows_advice('the episodes it places there')}"
        )
    starts = _row_group_starts(parquet)
    groups = row_groups_holding(starts, row_start, length)
    first_row = int(starts[groups.start])
    stored = _stored_rows(store, parquet, path, int(starts[groups.stop]) - first_row, columns, row_start, length)
    if stored is not None:
        return stored
    held = None if decoded is None else decoded.get(parquet, groups, columns)
    if held is not None:
        table, first_group = held
        return table.slice(row_start - int(starts[first_group]), length)
    try:
        with _read_lock(parquet):
            table = parquet.read_row_groups(list(groups), columns=columns)
    except (pa.ArrowException, OSError) as e:
        if is_transient(e):  # as in ParquetCache.get
            raise
        raise DataFileError(
            f"{path}: reading rows [{row_start}, {stop}) failed ({e}); the file is truncated or corrupt: re-download "
            "or rewrite it"
        ) from e
    if decoded is not None:
        decoded.put(parquet, groups, columns, table)
    return table.slice(row_start - first_row, length)


def _stored_rows(
    store: StoreEntry | None,
    parquet: pq.ParquetFile,
    path: str,
    group_rows: int,
    columns: list[str],
    row_start: int,
    length: int,
) -> pa.Table | None:
    """The rows from the column store when decoding ``group_rows`` rows for them costs enough, else None."""
    if store is None or not store.store.wants(group_rows, length) or not set(columns) <= set(store.columns):
        return None
    schema = _arrow_schema(parquet)
    if any(schema.get_field_index(c) < 0 for c in store.columns):  # the direct read names what is missing
        return None
    stamp = store.stamp()
    if stamp is None:
        return None
    return store.store.rows(
        parquet,
        _read_lock(parquet),
        path=path,
        stamp=stamp,
        stored_columns=store.columns,
        columns=columns,
        row_start=row_start,
        length=length,
    )


#: Per open parquet file: the first row of each row group, and the row count after the last. Files written with
#: one row group per episode (as LeRobot writes them) hold thousands, which a loop over the footer per episode
#: read paid for each time (4.5 ms at 10,000 groups).
_ROW_GROUP_STARTS: weakref.WeakKeyDictionary[pq.ParquetFile, np.ndarray] = weakref.WeakKeyDictionary()


#: Per open parquet file: its Arrow schema, which ``ParquetFile.schema_arrow`` converts from the footer again at each
#: access (~80 us; twice per episode read, a tenth of reading a short episode's rows).
_ARROW_SCHEMAS: weakref.WeakKeyDictionary[pq.ParquetFile, pa.Schema] = weakref.WeakKeyDictionary()


def _arrow_schema(parquet: pq.ParquetFile) -> pa.Schema:
    schema = _ARROW_SCHEMAS.get(parquet)
    if schema is None:
        schema = _ARROW_SCHEMAS[parquet] = parquet.schema_arrow
    return schema


#: Per open parquet file on a local disk: the stat of the handle it reads, taken when opened (not the path's now:
#: a file replaced since must not have the old bytes stored under the new file's stamp).
_OPENED_STAMPS: weakref.WeakKeyDictionary[pq.ParquetFile, FileStamp] = weakref.WeakKeyDictionary()


def opened_stamp(parquet: pq.ParquetFile) -> FileStamp | None:
    """The stamp of the file ``parquet`` reads, as it was when opened by :class:`ParquetCache`; None for files
    without a local descriptor (remote ones are stamped by their listing)."""
    return _OPENED_STAMPS.get(parquet)


def _handle_stamp(handle: Any) -> FileStamp | None:
    try:
        return stamp_from_stat(os.fstat(handle.fileno()))
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return None


#: Per open parquet file, a lock its reads take (reads of different files run at once): the cache hands one
#: ParquetFile to every thread of a process, and pyarrow's reader of a file is not safe for two reads at once. Each
#: read pre-buffers (ParquetFile's pre_buffer=True) into a range cache the file's reader keeps, replacing the one
#: another thread's read is using: "ReadRangeCache did not find matching cache entry", or SIGSEGV (the race named in
#: the review of apache/arrow PR 36192). pyarrow 26.0.1, 4 threads reading one file 200 times each: 11 of 12 runs
#: failed or crashed; with pre_buffer=False none of 12, but pre-buffering coalesces a remote file's chunk requests.
_READ_LOCKS: weakref.WeakKeyDictionary[pq.ParquetFile, threading.RLock] = weakref.WeakKeyDictionary()
_READ_LOCKS_LOCK = fork_locks.lock()


def _read_lock(parquet: pq.ParquetFile) -> threading.RLock:
    with _READ_LOCKS_LOCK:
        lock = _READ_LOCKS.get(parquet)
        if lock is None:
            lock = _READ_LOCKS[parquet] = fork_locks.lock()
        return lock


def _row_group_starts(parquet: pq.ParquetFile) -> np.ndarray:
    starts = _ROW_GROUP_STARTS.get(parquet)
    if starts is None:
        starts = _ROW_GROUP_STARTS[parquet] = row_group_starts(parquet.metadata)
    return starts


def row_group_starts(meta: pq.FileMetaData) -> np.ndarray:
    """The first row of each row group, then the file's row count (``num_row_groups + 1`` values)."""
    counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def row_groups_holding(starts: np.ndarray, row_start: int, length: int) -> range:
    """The row groups that rows ``[row_start, row_start + length)`` lie in (``starts``: :func:`row_group_starts`).
    The workers read these and the prefetcher fetches them ahead: one computation, so they cannot disagree."""
    first = int(np.searchsorted(starts, row_start, side="right")) - 1
    return range(first, int(np.searchsorted(starts, row_start + length)))


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _flat_list_values(array: pa.Array, feature: Feature, path: str) -> np.ndarray:
    """The values of a list column, row-major: one list level per declared dimension (``datasets.Array2D``
    and up store ``(2, 3)`` as lists of lists), or one flat list of all of them."""
    level_widths = []
    while _is_list(array.type):
        if array.null_count:
            raise SchemaMismatchError(
                f"{path}: column {feature.key!r} has {array.null_count} null row(s); rewrite the data file without them"
            )
        if pa.types.is_fixed_size_list(array.type):
            widths = np.full(len(array), array.type.list_size)
        else:
            widths = np.diff(array.offsets.to_numpy())
        level_widths.append(widths)
        array = array.flatten()
    if array.null_count:  # a null inside a vector would read as NaN (or fail to cast), silently
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} has {array.null_count} null value(s) inside its vectors; "
            "rewrite the data file without them"
        )
    _check_list_shape(level_widths, feature, path)
    return array.to_numpy(zero_copy_only=False)


def _check_list_shape(level_widths: Sequence[np.ndarray], feature: Feature, path: str) -> None:
    """Raise SchemaMismatchError unless lists of ``level_widths`` (per list level, outermost first, each row's
    length; none: not known) hold ``feature``'s declared shape: one level per dimension, or one of all values."""
    shape = tuple(feature.shape) or (1,)
    expected = shape if len(level_widths) == len(shape) else (math.prod(shape),) if len(level_widths) == 1 else None
    if expected is None or any(len(w) and not (w == n).all() for w, n in zip(level_widths, expected, strict=True)):
        found = [sorted(set(w.tolist()))[:5] for w in level_widths]
        holds = f"vectors of length {found[0]}" if len(found) == 1 else f"{len(found)}-level lists of lengths {found}"
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} holds {holds} but info.json declares shape {list(feature.shape)} "
            f"({math.prod(shape)} values); {_disagree_advice(feature, 'shape')}"
        )


def _disagree_advice(feature: Feature, what: str) -> str:
    """What to do where ``feature``'s column holds another ``what`` (shape, dtype) than info.json declares: an index
    column is read whatever keys= says, so there the data file is to be rewritten; another column may differ in this
    file alone (a file written by another recorder's version), which correcting info.json would not mend."""
    instead = (
        "rewrite the data file"
        if feature.key in INDEX_COLUMNS
        else f"read the other features only (keys= without {feature.key!r}; --keys on the command line); where the "
        "dataset's other data files hold info.json's, this one alone differs: rewrite it, or leave out its episodes "
        "(episodes=[...] of the others)"
    )
    return f"the data file and info.json disagree: correct the {what} in info.json, or {instead}"


def _check_scalar_shape(feature: Feature, path: str, kind: object | None = None) -> None:
    """Raise SchemaMismatchError where ``feature`` declares more than one value per row but its column (of type
    ``kind``, where known) holds a scalar."""
    if (math.prod(feature.shape) if feature.shape else 1) != 1:
        of_type = "" if kind is None else f" of type {kind}"
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} is a scalar column{of_type} but info.json declares "
            f"shape {list(feature.shape)}; {_disagree_advice(feature, 'shape')}"
        )


def list_level_widths(kind: pa.DataType) -> tuple[int, ...]:
    """The list levels of column type ``kind``, outermost first: each one's fixed size, or -1 where its lists vary
    in length (a scalar type: none). What a parquet footer tells of a column's shape."""
    widths: list[int] = []
    while _is_list(kind):
        widths.append(kind.list_size if pa.types.is_fixed_size_list(kind) else -1)
        kind = kind.value_type
    return tuple(widths)


def integer_column_range(metadata: pq.FileMetaData, name: str) -> tuple[int, int] | None:
    """The smallest and largest value of top-level integer column ``name``, from the row groups' statistics in the
    footer ``metadata`` (no read of the column itself); None where there is no such column or a row group holding
    rows has no statistics (not every writer writes them)."""
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    groups = [group for group in groups if group.num_rows]
    if not groups:
        return None
    first = groups[0]
    column = next((j for j in range(first.num_columns) if first.column(j).path_in_schema == name), None)
    if column is None:
        return None
    lows: list[int] = []
    highs: list[int] = []
    for group in groups:
        stats = group.column(column).statistics
        if stats is None or not stats.has_min_max or type(stats.min) is not int or type(stats.max) is not int:
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return min(lows), max(highs)


def check_column_shape(feature: Feature, list_widths: Sequence[int], path: str) -> None:
    """Raise SchemaMismatchError, as reading its rows would, where a column of ``list_widths``
    (:func:`list_level_widths`) cannot hold ``feature``'s declared shape: from its file's footer alone, before
    any row is read. Lists of varying length (-1) are checked as their rows are read."""
    if feature.is_host_value:
        return
    if not list_widths:
        _check_scalar_shape(feature, path)
        return
    known = [np.full(1 if n >= 0 else 0, n, dtype=np.int64) for n in list_widths]
    _check_list_shape(known, feature, path)


def _outside_range(source: np.ndarray, dtype: str) -> Any:
    """The first of ``source``'s numbers that the integer ``dtype`` cannot hold (a NaN or an infinity included), or
    None: numpy's cast wraps an integer around (300 reads as 44 in uint8) and makes anything of a float past the
    range, where LeRobot's cast to the declared dtype fails."""
    try:
        target = np.dtype(dtype)
    except TypeError:  # (not a numpy dtype: the cast says so)
        return None
    if target.kind not in "iu" or source.dtype.kind not in "iuf" or not source.size:
        return None
    low, past = np.iinfo(target).min, np.iinfo(target).max + 1  # (powers of two: exact as floats too)
    if source.dtype.kind == "f":
        outside = ~np.isfinite(source) | (source < low) | (source >= float(past))
    else:
        outside = (source < low) | (source >= past)
    return source[outside].flat[0].item() if outside.any() else None


def _language_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` (a ``language`` column's list of structs) with a float ``timestamp`` field as float32: LeRobot 0.6
    casts the column to its declared feature (``Value("float32")``), so a timestamp its annotation writer stored as
    a double (pyarrow infers one from Python floats) reads as the float32 nearest to it."""
    if not _is_list(kind) or not pa.types.is_struct(kind.value_type):
        return kind
    fields = [kind.value_type.field(i) for i in range(kind.value_type.num_fields)]
    timestamp = [f.name == "timestamp" and pa.types.is_floating(f.type) for f in fields]
    return pa.list_(pa.struct([f.with_type(pa.float32()) if t else f for f, t in zip(fields, timestamp, strict=True)]))


#: pyarrow's JSON extension type (pyarrow >= 19), which LeRobot 0.6 declares for a language row's ``tool_calls``.
_JSON_TYPE: Any = getattr(pa, "JsonType", ())


def _holds_json(kind: pa.DataType) -> bool:
    if isinstance(kind, _JSON_TYPE):
        return True
    if _is_list(kind):
        return _holds_json(kind.value_type)
    return pa.types.is_struct(kind) and any(_holds_json(kind.field(i).type) for i in range(kind.num_fields))


def _parsed_json(value: Any, kind: pa.DataType) -> Any:
    """``value`` (a row of arrow type ``kind``) with its JSON texts parsed, as LeRobot's ``datasets.Json`` feature
    gives them (``to_pylist`` leaves them text)."""
    if value is None:
        return None
    if isinstance(kind, _JSON_TYPE):
        return json.loads(value)
    if _is_list(kind):
        return [_parsed_json(item, kind.value_type) for item in value]
    if pa.types.is_struct(kind):
        return {f.name: _parsed_json(value[f.name], f.type) for f in (kind.field(i) for i in range(kind.num_fields))}
    return value


def _holds_text(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` holds text as a string feature's does: strings (plain, or bytes written without
    parquet's UTF-8 annotation), dictionary-encoded or not, or only nulls."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    text = pa.types.is_null, pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary
    return any(check(kind) for check in text)


def _column_to_numpy(column: pa.ChunkedArray, feature: Feature, path: str) -> np.ndarray:
    array = column.combine_chunks()
    n = len(array)
    if feature.is_host_value:
        if feature.dtype == "string" and not _holds_text(array.type):
            # (LeRobot's cast to its declared string feature refuses numbers; they were handed over as lists in silence)
            raise SchemaMismatchError(
                f"{path}: column {feature.key!r} holds {array.type}, not text, but info.json declares 'string': "
                f"{_disagree_advice(feature, 'dtype')}"
            )
        objects = np.empty(n, dtype=object)  # filled, not np.asarray: equal-length lists would become a 2-D array
        try:
            if feature.dtype == "language":
                array = array.cast(_language_type(array.type))
            if feature.dtype == "string" and (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
                # Text written without parquet's UTF-8 annotation reads as bytes, which LeRobot's cast to its declared
                # string feature makes text again (and the batch's JSON transport cannot carry).
                array = array.cast(pa.large_string())
            objects[:] = array.to_pylist()
            if feature.dtype == "language" and _holds_json(array.type):
                objects[:] = [_parsed_json(value, array.type) for value in objects]
        except json.JSONDecodeError as e:  # (a pa.json_() value is text parquet never checks)
            raise DataFileError(
                f"{path}: column {feature.key!r} holds a JSON value that does not parse ({e}); the file is damaged: "
                "re-download or rewrite it"
            ) from e
        except (UnicodeDecodeError, pa.ArrowInvalid) as e:  # (parquet readers do not check strings: their use does)
            raise DataFileError(
                f"{path}: column {feature.key!r} holds a string that is not UTF-8 ({e}); the file is damaged: "
                "re-download or rewrite it"
            ) from e
        return objects
    kind = array.type
    if _is_list(kind):
        values = _flat_list_values(array, feature, path)
    else:
        _check_scalar_shape(feature, path, kind)
        if array.null_count:  # a null int read as a float NaN, then failed as a "fractional value"
            raise SchemaMismatchError(
                f"{path}: column {feature.key!r} has {array.null_count} null row(s); rewrite the data file without them"
            )
        values = array.to_numpy(zero_copy_only=False)
    source = np.asarray(values)
    outside = _outside_range(source, feature.dtype)
    if outside is not None:
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} holds {outside} (type {kind}), outside the range of the declared dtype "
            f"{feature.dtype!r}; reading it would wrap it around: {_disagree_advice(feature, 'dtype')}"
        )
    try:
        values = source.astype(np.dtype(feature.dtype), copy=False)
    except (TypeError, ValueError) as e:  # (ValueError: strings like 'n/a' in a numeric column)
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} of type {kind} cannot be read as the declared dtype {feature.dtype!r} "
            f"({e}); {_disagree_advice(feature, 'dtype')}"
        ) from e
    if source.dtype.kind == "f" and values.dtype.kind in "iub" and not np.array_equal(values, source):
        raise SchemaMismatchError(
            f"{path}: column {feature.key!r} holds fractional values (type {kind}) but info.json declares "
            f"{feature.dtype!r}; reading them would round them: {_disagree_advice(feature, 'dtype')}"
        )
    # A declared (1,) stored as plain values batches to (B,), stored as one-element lists to (B, 1): as LeRobot's
    # torch.tensor of each row gives them.
    return values.reshape((n,) if feature.is_scalar and not _is_list(kind) else (n, *(feature.shape or (1,))))
