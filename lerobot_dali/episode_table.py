"""The episode index: one row per episode, held as numpy columns so a million episodes cost megabytes.

Rows are sorted by ``episode_index``; a row's position (``episode_pos``) is how the sampling layer names
episodes. Each row says where its frames live: the data file and the row range inside it, and per camera the
video file and the episode's start time inside that file. v3.0 reads this from ``meta/episodes/*.parquet``;
v2.x derives it from ``episodes.jsonl`` (one data file and one video per episode, starting at 0 s).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import PurePosixPath
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .dataset_info import DatasetInfo
from .dataset_location import fetches_whole, read_if_present, read_whole
from .episode_rows import damaged_parquet_as, read_parquet
from .errors import DatasetError, EpisodeMetadataError, cameras_hint, listing_hint
from .file_stamps import find_files, stripped
from .fork_locks import cached_property
from .pickled_columns import PickledColumn, narrowed, shared, widened
from .said_once import say_once, warn_once
from .value_checks import required_whole_number
from .wording import counted

__all__ = [
    "CameraFiles",
    "EpisodeRecords",
    "EpisodeTable",
    "check_video_starts",
    "filter_episodes",
    "read_episode_records",
    "read_episode_table",
]

logger = logging.getLogger(__name__)


def _index_span(indices: np.ndarray) -> str:
    """Sorted episode indices as "0..11", or with the gaps named (episodes deleted without renumbering): "0..11 but
    for 3 and 5..7", the first 3 gaps then "and N more gaps"."""
    span = f"{int(indices[0])}..{int(indices[-1])}"
    after = np.flatnonzero(np.diff(indices) > 1)
    if not after.size:
        return span
    gaps = [
        f"{first}" if first == last else f"{first}..{last}"
        for first, last in zip((indices[after] + 1).tolist(), (indices[after + 1] - 1).tolist(), strict=True)
    ]
    more = [f"{len(gaps) - 3} more gaps"] if len(gaps) > 3 else gaps[-1:]
    named = gaps[: min(3, len(gaps) - 1)]
    return f"{span} but for {', '.join(named)}{' and ' if named else ''}{more[0]}"


@dataclass(frozen=True)
class CameraFiles:
    """Per episode (aligned with ``EpisodeTable`` rows): which video file, and where in it the episode starts."""

    chunk_index: np.ndarray
    file_index: np.ndarray
    from_timestamp_s: np.ndarray
    #: Where the next episode of the same video file starts (its ``from_timestamp``; NaN for a file's last episode,
    #: and v2.x's one episode a file): the end of this episode's part of the file. Worked out over every episode of
    #: the dataset, before ``select`` leaves any out. A ``from_timestamp`` missing (NaN) leaves those of its file's
    #: episodes unknown: such episodes are refused as the dataset opens where selected (``check_video_starts``).
    next_from_timestamp_s: np.ndarray


@dataclass(frozen=True)
class EpisodeTable:
    """Columnar episode metadata, sorted by ``episode_index``."""

    episode_index: np.ndarray
    length: np.ndarray
    dataset_from_index: np.ndarray
    dataset_to_index: np.ndarray
    data_chunk_index: np.ndarray
    data_file_index: np.ndarray
    #: Row of the episode's first frame inside its data file (v3 files pack several episodes).
    data_row_start: np.ndarray
    tasks: pa.Array  # list<string> per episode
    cameras: dict[str, CameraFiles]
    #: Rows the metadata places in the episode's data file, all its episodes together (kept by ``select``): a
    #: file holding more or fewer has rows no episode would read, or rows missing.
    data_file_rows: np.ndarray

    def __len__(self) -> int:
        return len(self.episode_index)

    @property
    def total_frames(self) -> int:
        return int(self.length.sum())

    def first_of_each_data_file(self, wanted: np.ndarray | None = None) -> np.ndarray:
        """Positions of the first episode of each data file (among the ``wanted`` ones, a mask; None: all), ascending:
        for work done once per data file, not once per episode (a v3.0 file holds thousands)."""
        if wanted is None:
            return np.sort(np.unique(self._data_file_id, return_index=True)[1])
        positions = np.flatnonzero(wanted)
        ids = _file_ids(self.data_chunk_index[positions], self.data_file_index[positions])
        return np.sort(positions[np.unique(ids, return_index=True)[1]])

    def rows_read_per_data_file(self) -> np.ndarray:
        """Per episode, the rows this table's episodes take from its data file (all of the file's where the table
        holds every episode of it; fewer where it was opened with some left out). Read-only."""
        return self._rows_read

    def data_file_ids(self) -> np.ndarray:
        """Per episode, a number naming its data file among this table's (0, 1, ...). Read-only."""
        return self._data_file_id

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without what :meth:`data_file_ids` and :meth:`rows_read_per_data_file` keep (16 bytes an episode,
        which the workers' tables never need), and its columns as :mod:`.pickled_columns` does (a camera's files
        often laid out as another's): every DALI worker is sent the table, 172 bytes an episode before, 55 now
        (92,000 episodes of 3 cameras: 15.8 -> 5.1 MB per worker). Unpickles as it was."""
        state = {name: value for name, value in self.__dict__.items() if name not in ("_data_file_id", "_rows_read")}
        packed: list[PickledColumn] = []

        def pack(values: np.ndarray) -> PickledColumn:
            column = shared(narrowed(values), packed)
            packed.append(column)
            return column

        for name, value in state.items():
            if isinstance(value, np.ndarray):
                state[name] = pack(value)
        state["cameras"] = {key: tuple(pack(a) for a in _columns(files)) for key, files in self.cameras.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        done: dict[int, np.ndarray] = {}
        for name, value in state.items():
            if isinstance(value, tuple) and name != "cameras":
                state[name] = widened(value, done)
        state["cameras"] = {
            key: CameraFiles(*(widened(column, done) for column in columns))
            for key, columns in state["cameras"].items()
        }
        self.__dict__.update(state)

    @cached_property
    def _data_file_id(self) -> np.ndarray:
        """:meth:`data_file_ids`, computed once (a sort of every episode's file: ~60 ms at 1,000,000 episodes)."""
        return _read_only(_file_ids(self.data_chunk_index, self.data_file_index))

    @cached_property
    def _rows_read(self) -> np.ndarray:
        return _read_only(_rows_per_file(self._data_file_id, self.length))

    def lacking_task(self, positions: np.ndarray, task_index: np.ndarray, tasks: Mapping[int, str]) -> np.ndarray:
        """Of the episodes at ``positions``, those (indices into ``positions``) whose ``tasks`` list is not empty
        (nor missing) and lacks the text ``tasks`` gives their ``task_index`` (one per position, each in
        ``tasks``)."""
        every = len(positions) == len(self.tasks)  # (positions ascend: all of them in order)
        lists = self.tasks if every else self.tasks.take(pa.array(positions, pa.int64()))
        listed = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        parents = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), dtype=np.int64)
        used = np.unique(task_index)
        texts = pa.array([tasks[int(i)] for i in used], pa.string())
        flat = pc.index_in(pc.list_flatten(lists), value_set=texts)  # (each listed text's place in ``texts``)
        codes = np.asarray(pc.fill_null(flat, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        wanted = np.searchsorted(used, task_index)
        found = np.bincount(parents[codes == wanted[parents]], minlength=len(positions))
        return np.flatnonzero((listed > 0) & (found == 0))

    def data_file_spans(self, *values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each of ``values`` (one per episode): per episode, the smallest and the largest of it over this
        table's episodes of its data file."""
        file_id = self._data_file_id
        count = int(file_id.max()) + 1 if file_id.size else 0
        spans = []
        for column in values:
            low = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
            high = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(low, file_id, column)
            np.maximum.at(high, file_id, column)
            spans.append((low[file_id], high[file_id]))
        return spans

    def with_data_rows(self, chunk_index: np.ndarray, file_index: np.ndarray, row_start: np.ndarray) -> EpisodeTable:
        """This table with each episode's rows found elsewhere: its data file and its first row there. (Call it on
        the whole table: a file's row count is its episodes' lengths together.)"""
        return replace(
            self,
            data_chunk_index=chunk_index,
            data_file_index=file_index,
            data_row_start=row_start,
            data_file_rows=_rows_per_file(_file_ids(chunk_index, file_index), self.length),
        )

    def select(self, episode_indices: Sequence[int], *, source: str = "") -> EpisodeTable:
        """The rows of ``episode_indices`` only (LeRobot's ``episodes=``, e.g. a train/validation split).

        Rows stay sorted by ``episode_index`` whatever the order asked. Raises DatasetError for an empty or
        repeated selection and for episodes the dataset does not hold, naming them.
        """
        where = f"{source}: " if source else ""
        wanted = np.asarray(episode_indices)
        if wanted.ndim != 1 or wanted.size == 0 or wanted.dtype.kind not in "iu":
            raise DatasetError(
                f"{where}episodes must be a non-empty list of episode indices (None for all), got {episode_indices!r}"
            )
        unique, counts = np.unique(wanted.astype(np.int64), return_counts=True)
        if (counts > 1).any():
            raise DatasetError(f"{where}episodes lists {unique[counts > 1].tolist()} more than once: list each once")
        positions = np.minimum(np.searchsorted(self.episode_index, unique), len(self) - 1)
        absent = unique[self.episode_index[positions] != unique]
        if absent.size:
            raise DatasetError(
                f"{where}episodes {absent[:10].tolist()}{' ...' if absent.size > 10 else ''} are not in this dataset, "
                f"which holds {len(self)} episodes with indices {_index_span(self.episode_index)}: pass "
                "episodes=[...] of those (on the command line --episodes N ...)"
            )
        columns = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("tasks", "cameras")}
        cameras = {
            key: CameraFiles(**{f.name: getattr(files, f.name)[positions] for f in fields(files)})
            for key, files in self.cameras.items()
        }
        return EpisodeTable(
            **{name: column[positions] for name, column in columns.items()},
            tasks=self.tasks.take(pa.array(positions)),
            cameras=cameras,
        )

    @staticmethod
    def concatenate(tables: Sequence[EpisodeTable]) -> EpisodeTable:
        """The rows of ``tables`` one table after another (several datasets read as one, :mod:`.dataset_union`):
        each keeps its own values, so ``episode_index`` may repeat. They must have the same cameras."""
        names = [f.name for f in fields(EpisodeTable) if f.name not in ("tasks", "cameras")]
        cameras = {
            key: CameraFiles(
                **{
                    f.name: np.concatenate([getattr(t.cameras[key], f.name) for t in tables])
                    for f in fields(CameraFiles)
                }
            )
            for key in tables[0].cameras
        }
        return EpisodeTable(
            **{name: np.concatenate([getattr(t, name) for t in tables]) for name in names},
            tasks=pa.concat_arrays([t.tasks for t in tables]),
            cameras=cameras,
        )


@dataclass(frozen=True)
class EpisodeRecords:
    """``meta/episodes`` as read (``source``): for v3.0 a table of every column but the ``stats/`` ones, sorted by
    ``episode_index``; for v2.x the ``episodes.jsonl`` records in file order. Read once at open, for the episode
    table and the ``episode_filter`` both."""

    source: str
    rows: pa.Table | list[dict[str, Any]]

    def dicts(self, episodes: Collection[int] | None = None) -> Iterator[dict[str, Any]]:
        """Each episode's row (of ``episodes``; None: all), in order, as a dict of its own (a predicate may change it).
        A v3.0 row is pyarrow's ``to_pylist`` row, its values converted a column at a time as that does; the rows are
        zipped from the columns, not built by its dict comprehension (50,000 episodes: 3x faster), and only for
        ``episodes``."""
        rows = self.rows
        if isinstance(rows, list):
            yield from (dict(record) for record in rows if episodes is None or record["episode_index"] in episodes)
            return
        if episodes is not None:
            index = _i64(rows, "episode_index", self.source)
            rows = rows.filter(pa.array(np.isin(index, np.fromiter(episodes, np.int64, len(episodes)))))
        columns = rows.to_pydict()
        names = list(columns)
        yield from (dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True))


def read_episode_records(fs: fsspec.AbstractFileSystem, meta_root: str, info: DatasetInfo) -> EpisodeRecords:
    """The episode metadata for ``info``'s layout, as read."""
    root = meta_root.rstrip("/")
    if info.major_version == "v3":
        return EpisodeRecords(f"{root}/meta/episodes", _v3_rows(fs, meta_root))
    return EpisodeRecords(f"{root}/meta/episodes.jsonl", _v2_rows(fs, meta_root, info))


def read_episode_table(records: EpisodeRecords, info: DatasetInfo, *, video_keys: list[str]) -> EpisodeTable:
    """The episode index from ``records`` (every episode), validating what later stages rely on; where the episodes
    read lie in their video files is checked by :func:`check_video_starts` once they are chosen."""
    if isinstance(records.rows, pa.Table):
        return _read_v3(records.rows, records.source, video_keys)
    return _read_v2(records.rows, records.source, info, video_keys)


def filter_episodes(
    records: EpisodeRecords,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    candidates: Sequence[int] | None = None,
) -> list[int]:
    """The sorted indices of the episodes (of ``candidates``; None: all) whose metadata row ``predicate`` keeps, as
    LeRobot's ``episode_filter``: a dict of the row's columns but the ``stats/`` ones (v3.0: ``meta/episodes``,
    e.g. ``length``, ``tasks`` and any column the writer added; v2.x: the ``episodes.jsonl`` record).

    Raises DatasetError when ``predicate`` raises (naming the episode and the columns it may read), returns other
    than a bool, or keeps no episode.
    """
    source = records.source
    wanted = None if candidates is None else {int(e) for e in candidates}
    kept: list[int] = []
    tested = 0
    for row in records.dicts(wanted):
        episode = int(row["episode_index"])
        tested += 1
        try:
            keep = predicate(row)
        except Exception as e:
            raise DatasetError(
                f"{source}: episode_filter raised {e!r} on episode {episode}; its rows hold {sorted(row)}"
            ) from e
        if not isinstance(keep, bool | np.bool_):
            raise DatasetError(
                f"{source}: episode_filter must return a bool, and returned {keep!r} ({type(keep).__name__}) for "
                f"episode {episode}"
            )
        if keep:
            kept.append(episode)
    if not kept:
        columns = f" (each row it is given holds {sorted(row)})" if tested else ""
        raise DatasetError(
            f"{source}: episode_filter kept none of the {counted(tested, 'episode')} it was given"
            + ("" if candidates is None else " (those of episodes=)")
            + f", so there is nothing to read: check its condition against the episodes' values{columns}"
        )
    say_once(logger, logging.INFO, "%s: episode_filter kept %d of %d episode(s)", source, len(kept), tested)
    return sorted(kept)


def _i64(table: pa.Table, name: str, source: str) -> np.ndarray:
    """A column of whole numbers as int64 (written as floats or text too). A missing value or a fraction is refused:
    a plain cast turned them into other numbers (-2**63 for a null, 20 for 20.5), which then named other rows."""
    column = table[name]
    if column.null_count:
        raise EpisodeMetadataError(
            f"{source}: column {name!r} has {column.null_count} missing value(s); {_damaged_advice(source)}"
        )
    try:
        return np.asarray(pc.cast(column, pa.int64()).to_numpy(), dtype=np.int64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise EpisodeMetadataError(
            f"{source}: column {name!r} must hold whole numbers ({e}); {_damaged_advice(source)}"
        ) from e


def _damaged_advice(source: str) -> str:
    """What to do where LeRobot's episode metadata ``source`` does not hold what LeRobot writes: no option reads
    around it, since every episode is placed by it."""
    return f"the episode metadata is damaged: download or copy {source} again"


#: A v3.0 dataset's episode metadata files, their paths in ``meta/episodes``.
_EPISODE_FILES = "/chunk-*/file-*.parquet"


def _episode_files(fs: fsspec.AbstractFileSystem, folder: str) -> list[str]:
    """The episode metadata files in ``folder`` (``meta/episodes``): ``chunk-*/file-*.parquet`` in it, not deeper (a
    walk lists its chunk folders alone; an object store's listing has every file, and matched from the right a copy
    in ``meta/episodes/chunk-000/old/meta/episodes/chunk-000/`` was read too: every episode listed twice)."""
    top = stripped(fs, folder)

    def wanted(name: str) -> bool:
        if name.startswith(f"{top}/"):  # (its path in the folder, matched whole)
            return PurePosixPath(name[len(top) :]).match(_EPISODE_FILES)
        return PurePosixPath(name).match(f"meta/episodes{_EPISODE_FILES}")  # (a listing naming files otherwise)

    return sorted(name for name in map(str, find_files(fs, folder, depth=1)) if wanted(name))


def _v3_rows(fs: fsspec.AbstractFileSystem, meta_root: str) -> pa.Table:
    """Every column of ``meta/episodes`` but the ``stats/`` ones (LeRobot's episode rows), by ``episode_index``."""
    folder = f"{meta_root.rstrip('/')}/meta/episodes"
    pattern = f"{folder}/chunk-*/file-*.parquet"
    try:  # (each folder listed once: fsspec's glob over HTTP listed meta/episodes/ twice, and asked for it with a
        # HEAD more; and left out a chunk folder whose listing failed, where this raises, so that it is retried)
        files = _episode_files(fs, folder)
    except FileNotFoundError:
        files = []
    if not files:
        hint = listing_hint(fs) or "; the dataset's files are incomplete: download or copy its meta/episodes/ again"
        raise EpisodeMetadataError(f"no episode metadata found: expected files matching {pattern}{hint}")
    tables = []
    for path in files:
        # (one request where the filesystem fetches whole files; a local or Hub-cache file, large with many episodes'
        # stats, is read for the columns wanted alone; opened outside: a missing file or a refusal is no damage)
        f = read_whole(fs, path) if fetches_whole(fs) else fs.open(path, "rb")
        with f, damaged_parquet_as(EpisodeMetadataError, path):
            schema = pq.read_schema(f)
            wanted = [name for name in schema.names if not name.startswith("stats/")]
            f.seek(0)
            tables.append(read_parquet(f, wanted))
            tables[-1].validate(full=True)  # (strings that are not UTF-8)
        tables[-1] = _with_task_lists(tables[-1], path)
    # "permissive": files from different writers may differ in types (list<string> vs list<large_string>)
    table = pa.concat_tables(tables, promote_options="permissive")
    if "episode_index" not in table.column_names:
        source = f"{meta_root}/meta/episodes"
        raise EpisodeMetadataError(
            f"{source}: episode metadata lacks column(s) ['episode_index']; {_damaged_advice(source)}"
        )
    return table if _ascending(table["episode_index"]) else table.sort_by("episode_index")


#: The type of ``meta/episodes``' ``tasks`` column as read: each episode's task texts.
_TASK_LISTS = pa.list_(pa.string())


def _with_task_lists(table: pa.Table, path: str) -> pa.Table:
    """``table`` (episode metadata file ``path``) with its ``tasks`` column, where it has one, as ``_TASK_LISTS``: lists
    of texts (list, large_list or fixed_size_list of string, large_string or string_view, or of those dictionary-
    encoded, as writers differ; of nulls where none has a text; a column of nulls alone). A column of plain texts
    holds one task per episode: each reads as a list of that one (a missing one as a missing list). A column of
    another type (lists of numbers, ...) reads as missing, with a warning: LeRobot reads neither column, since a
    frame's task is the task list's text of its ``task_index`` (as batches carry it), so it reads such a dataset, and
    the column is a description of the episodes alone."""
    if "tasks" not in table.column_names:
        return table
    kind = table.schema.field("tasks").type
    if pa.types.is_list(kind) and pa.types.is_string(kind.value_type):  # (LeRobot's, whatever its item is named)
        return table
    column = table["tasks"]
    if _is_text(kind) and not pa.types.is_null(kind):  # one text per episode
        texts = column.combine_chunks().cast(pa.string())
        lists = pa.ListArray.from_arrays(pa.array(range(len(texts) + 1), pa.int32()), texts, mask=texts.is_null())
    elif pa.types.is_null(kind) or (_is_list(kind) and _is_text(kind.value_type)):
        lists = column.cast(_TASK_LISTS)
    else:
        _warn_tasks_not_read(path, f"column 'tasks' is of type {kind}")
        lists = pa.nulls(len(table), _TASK_LISTS)
    return table.set_column(table.column_names.index("tasks"), pa.field("tasks", _TASK_LISTS), lists)


def _warn_tasks_not_read(path: str, what: str) -> None:
    """Warn that episode metadata file ``path``'s task lists are not read: ``what`` (its column, or records, and what
    they hold instead) is no text nor list of texts."""
    warn_once(logger,
        "%s: %s, not each episode's task texts (lists of strings, as LeRobot writes them): not read, as LeRobot reads "
        "none; batches carry the task list's text of each row's task_index",
        path, what,
    )  # fmt: skip


def _is_list(kind: pa.DataType) -> bool:
    # (a fixed_size_list: what HF datasets writes for a Sequence of a fixed length)
    return any(check(kind) for check in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list))


#: The checks of a type of texts (or of nulls alone); is_string_view from pyarrow 16 on.
_TEXT_KINDS = tuple(
    getattr(pa.types, name) for name in ("is_string", "is_large_string", "is_string_view", "is_null")
    if hasattr(pa.types, name)
)  # fmt: skip


def _is_text(kind: pa.DataType) -> bool:
    """Whether a ``tasks`` list's item type ``kind`` holds texts (or only nulls), dictionary-encoded or not."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return any(check(kind) for check in _TEXT_KINDS)


def _ascending(column: pa.ChunkedArray) -> bool:
    """Whether ``column`` holds no null and never decreases: sorting it (stably) changes nothing (LeRobot writes its
    episodes in order; sorting 1,000,000 rows that are took 0.15 s)."""
    if column.null_count or len(column) < 2:
        return not column.null_count
    return bool(pc.all(pc.less_equal(column.slice(0, len(column) - 1), column.slice(1))).as_py())


def _read_v3(table: pa.Table, source: str, video_keys: list[str]) -> EpisodeTable:
    required = [
        "episode_index",
        "length",
        "dataset_from_index",
        "dataset_to_index",
        "data/chunk_index",
        "data/file_index",
    ]
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise EpisodeMetadataError(f"{source}: episode metadata lacks column(s) {missing}; {_damaged_advice(source)}")
    episode_index = _i64(table, "episode_index", source)
    length = _i64(table, "length", source)
    from_index = _i64(table, "dataset_from_index", source)
    to_index = _i64(table, "dataset_to_index", source)
    _check_lengths(source, episode_index, length, from_index, to_index)
    chunk = _i64(table, "data/chunk_index", source)
    file = _i64(table, "data/file_index", source)
    file_id = _file_ids(chunk, file)
    row_start = _row_start_in_file(file_id, from_index, length)
    tasks = (
        table["tasks"].combine_chunks()
        if "tasks" in table.column_names
        else pa.nulls(len(table), pa.list_(pa.string()))
    )
    cameras = {key: _v3_camera(source, table, key, chunk.size) for key in video_keys}
    file_rows = _rows_per_file(file_id, length)
    return EpisodeTable(episode_index, length, from_index, to_index, chunk, file, row_start, tasks, cameras, file_rows)


def _v3_camera(source: str, table: pa.Table, key: str, n: int) -> CameraFiles:
    prefix = f"videos/{key}/"
    if f"{prefix}chunk_index" not in table.column_names or f"{prefix}file_index" not in table.column_names:
        raise EpisodeMetadataError(
            f"{source}: camera {key!r} is declared in info.json but the episode metadata has no "
            f"'{prefix}chunk_index'/'{prefix}file_index' columns; select the cameras that have files with "
            f"{cameras_hint()}"
        )
    chunk = _i64(table, f"{prefix}chunk_index", source)
    file = _i64(table, f"{prefix}file_index", source)
    if f"{prefix}from_timestamp" in table.column_names:
        # (a missing one reads as NaN: refused by check_video_starts where a selected episode needs it)
        start = np.asarray(table[f"{prefix}from_timestamp"].to_numpy(zero_copy_only=False), dtype=np.float64)
        start = np.where(np.isfinite(start), start, np.nan)
        # (not its to_timestamp, which LeRobot never reads: a stale one refused rows LeRobot reads right)
        return CameraFiles(chunk, file, start, _next_starts(chunk, file, start))
    # Without from_timestamp the start is only known where a video file holds a single episode (it is 0).
    if (np.bincount(_file_ids(chunk, file)) > 1).any():
        raise EpisodeMetadataError(
            f"{source}: camera {key!r} has no '{prefix}from_timestamp' column and some of its video files hold "
            "several episodes, so where each episode starts is unknown; regenerate the episode metadata"
        )
    say_once(logger, logging.INFO,
        "%s: no %sfrom_timestamp; each video file holds one episode, so episodes start at 0 s", source, prefix,
    )  # fmt: skip
    return CameraFiles(chunk, file, np.zeros(n), np.full(n, np.nan))


def _next_starts(chunk: np.ndarray, file: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per episode, the ``from_timestamp`` of the next episode of its video file (NaN for a file's last): where its
    part of the file ends. Not its ``to_timestamp``, which LeRobot never reads (a stale one refused rows LeRobot reads
    right). Starts not known (NaN) sort last: :func:`check_video_starts` refuses each episode of their file."""
    file_id = _file_ids(chunk, file)
    order = np.lexsort((start, file_id))
    same_file = file_id[order][1:] == file_id[order][:-1]
    following = np.full(start.size, np.nan)
    following[order[:-1][same_file]] = start[order[1:][same_file]]
    return following


def check_video_starts(
    table: EpisodeTable, info: DatasetInfo, *, source: str, episodes: Sequence[int] | None = None
) -> None:
    """Refuse, per camera, each of ``episodes`` (None: all) whose part of its video file is not known: its own
    ``from_timestamp`` is missing, or its file holds an episode whose is (which may be the next one there, where its
    part ends); or it and the next episode of its file start less than half a frame apart (at the rows' rate or the
    camera's declared video rate, the faster), so the earlier holds no frame of its own and one of the two starts is
    wrong (a row of either would read the other's frame). An episode left out reads nothing, so its metadata is
    not refused (LeRobot reads no episode's but those selected either).

    Another episode's unknown start refuses a selected one whose own is known because its part's end is what turns
    rows running past its video into an error rather than the next episode's frames: cr5_v30_av1's episode 0 (rows'
    timestamps to 20.55 s, its part 0-19.7 s), read by timestamp with tolerance_s=0.05, has 9 of 197 rows refused
    where its part ends at episode 1's start; with that start unknown, its part would end at episode 2's (41.2 s)
    and those 9 rows would read episode 1's frames 197-205 as its own. Where an unknown start lies in its file, and
    so which episodes it ends, the metadata does not say."""
    selected = np.ones(len(table), dtype=bool)
    if episodes is not None:
        # (as given: a list not of indices matches none here, and EpisodeTable.select refuses it by name)
        selected = np.isin(table.episode_index, np.asarray(episodes))
    for key, files in table.cameras.items():
        _check_camera_starts(source, key, table.episode_index, files, selected, 0.5 / info.fastest_fps(key))


def _check_camera_starts(
    source: str, key: str, episode_index: np.ndarray, files: CameraFiles, selected: np.ndarray, min_gap_s: float
) -> None:
    """:func:`check_video_starts` for camera ``key``'s ``files``: starts less than ``min_gap_s`` apart are close."""
    start, file_id = files.from_timestamp_s, _file_ids(files.chunk_index, files.file_index)
    unknown = np.isnan(start)
    needy = selected & np.isin(file_id, file_id[unknown])
    if needy.any():
        pos = int(np.flatnonzero(needy)[0])
        missing = int(np.flatnonzero(unknown & (file_id == file_id[pos]))[0])
        whose = "it" if missing == pos else f"episode {int(episode_index[missing])} of the same file (where it may end)"
        raise EpisodeMetadataError(
            f"{source}: camera {key!r}: where episode {int(episode_index[pos])}'s part of {_video_file(files, pos)} "
            f"lies is unknown: column 'videos/{key}/from_timestamp' is missing or not finite for {whose} "
            f"({int(unknown.sum())} episode(s) in all); leave those episodes and the others of their video files out "
            f"with episodes=[...], or download or copy {source} again"
        )
    close = files.next_from_timestamp_s - start < min_gap_s  # (NaN, a file's last episode, compares False)
    if not close.any():
        return
    order = np.lexsort((start, file_id))
    following = np.zeros(start.size, dtype=np.int64)
    following[order[:-1]] = order[1:]
    needy = close & (selected | selected[following])
    if needy.any():
        a = int(np.flatnonzero(needy)[0])
        b = int(following[a])
        raise EpisodeMetadataError(
            f"{source}: camera {key!r}: episodes {int(episode_index[a])} and {int(episode_index[b])} start at "
            f"{start[a]:.6f} s and {start[b]:.6f} s of {_video_file(files, a)} (from_timestamp), less than half a "
            f"frame apart: episode {int(episode_index[a])} holds no frame of its own, and one of the two starts is "
            "wrong (a row of either would read the other's frame); leave both out with episodes=[...], or "
            "regenerate the episode metadata"
        )


def _video_file(files: CameraFiles, pos: int) -> str:
    return f"video file chunk {int(files.chunk_index[pos])} file {int(files.file_index[pos])}"


def _columns(files: CameraFiles) -> tuple[np.ndarray, ...]:
    return tuple(getattr(files, f.name) for f in fields(CameraFiles))


def _file_ids(chunk: np.ndarray, file: np.ndarray) -> np.ndarray:
    """Per episode, a number naming its (chunk, file) among the distinct ones (0, 1, ...)."""
    _, inverse = np.unique(chunk * (1 << 32) + file, return_inverse=True)
    return inverse.reshape(-1)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _rows_per_file(file_id: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Per episode, the rows of all episodes of its data file together: what the file must hold."""
    return np.bincount(file_id, weights=length).astype(np.int64)[file_id]


def _row_start_in_file(file_id: np.ndarray, from_index: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Episodes of one data file are stored back to back in the order of their global indices, so an episode's first
    row there is the rows of the file's episodes before it. Its global index less the file's smallest is that only
    where the file's episodes are consecutive ones: with episodes written in turn to two files (one holding rows 0-4,
    6-12 and 17-22) it read another episode's rows, refused as disagreeing with the metadata. (0.04 s at 1,000,000
    episodes; 0.01 s so.)"""
    order = np.lexsort((from_index, file_id))
    in_order = file_id[order]
    before = np.cumsum(length[order]) - length[order]  # (rows of the files before, and of the file's before it)
    start = np.empty_like(from_index)
    start[order] = before - before[np.searchsorted(in_order, in_order)]
    return start


def _check_lengths(
    source: str, episode_index: np.ndarray, length: np.ndarray, from_index: np.ndarray, to_index: np.ndarray
) -> None:
    repeated = episode_index[1:][np.diff(episode_index) <= 0]  # sorted by the callers: a repeat is a non-increase
    if repeated.size:
        shown = np.unique(repeated)
        raise EpisodeMetadataError(
            f"{source}: episode_index values are not unique: episode(s) {shown[:10].tolist()}"
            f"{' ...' if shown.size > 10 else ''} are listed more than once; list each episode once"
        )
    bad = np.flatnonzero(to_index - from_index != length)
    if bad.size:
        i = int(bad[0])
        raise EpisodeMetadataError(
            f"{source}: episode {int(episode_index[i])} has length {int(length[i])} but "
            f"dataset_to_index - dataset_from_index = {int(to_index[i] - from_index[i])}; {_damaged_advice(source)}"
        )
    if (length <= 0).any():
        i = int(np.flatnonzero(length <= 0)[0])
        raise EpisodeMetadataError(
            f"{source}: episode {int(episode_index[i])} has no frames (length {int(length[i])}), which LeRobot never "
            f"writes; {_damaged_advice(source)}"
        )


def _v2_rows(fs: fsspec.AbstractFileSystem, meta_root: str, info: DatasetInfo) -> list[dict[str, Any]]:
    """The records of ``meta/episodes.jsonl``, in file order, each with an int ``episode_index`` and ``length``."""
    path = f"{meta_root.rstrip('/')}/meta/episodes.jsonl"
    f = read_if_present(fs, path)
    if f is None:
        raise EpisodeMetadataError(
            f"{path} is missing; a {info.codebase_version} dataset lists its episodes there: the dataset's files are "
            "incomplete: download or copy its meta/ again"
        )
    records: list[dict[str, Any]] = []
    unread: list[tuple[int, Any]] = []  # (line, tasks) of the records whose tasks are not texts
    for line_no, line in enumerate(f, start=1):  # (decoded per line: bytes that are not UTF-8 then name their line)
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
            for key in ("episode_index", "length"):
                record[key] = required_whole_number(key, record[key])
        except (ValueError, KeyError, TypeError) as e:
            text = line.decode("utf-8", "replace").strip()[:200]
            raise EpisodeMetadataError(
                f"{path}:{line_no}: bad episode record ({e}): {text}; {_damaged_advice(path)}"
            ) from e
        # As a v3.0 column's (:func:`_with_task_lists`): one text as a list of it (its letters read as its tasks
        # before); a null in a list kept as one (LeRobot's conversion carries it over; str() made it the text "None");
        # anything else not read (LeRobot 0.3 reads none).
        tasks = record.get("tasks")
        if isinstance(tasks, str):
            record["tasks"] = [tasks]
        elif not isinstance(tasks, list | None) or any(not isinstance(t, str | None) for t in tasks or ()):
            unread.append((line_no, tasks))
            record["tasks"] = None
        records.append(record)
    if unread:
        line_no, tasks = unread[0]
        _warn_tasks_not_read(path, f"{len(unread)} record(s)' tasks are not texts (line {line_no}: {tasks!r:.80})")
    return records


def _read_v2(records: list[dict[str, Any]], path: str, info: DatasetInfo, video_keys: list[str]) -> EpisodeTable:
    indices = [record["episode_index"] for record in records]
    lengths = [record["length"] for record in records]
    tasks = [record.get("tasks") or [] for record in records]
    order = np.argsort(np.asarray(indices, dtype=np.int64), kind="stable")
    episode_index = np.asarray(indices, dtype=np.int64)[order]
    length = np.asarray(lengths, dtype=np.int64)[order]
    to_index = np.cumsum(length)
    from_index = to_index - length
    _check_lengths(path, episode_index, length, from_index, to_index)
    chunk = episode_index // info.chunks_size
    zeros = np.zeros(len(order), dtype=np.int64)
    task_array = pc.take(pa.array(tasks, type=pa.list_(pa.string())), pa.array(order))
    # A file per episode: it starts at 0 s, and nothing bounds its end (length / fps would refuse valid rows
    # past it, e.g. an episode whose first rows were dropped but whose video kept them).
    unbounded = np.full(len(order), np.nan)
    cameras = {key: CameraFiles(chunk, episode_index, np.zeros(len(order)), unbounded) for key in video_keys}
    # v2.x: file_index carries the episode index, which is what the v2 path templates are filled with.
    return EpisodeTable(
        episode_index,
        length,
        from_index,
        to_index,
        chunk,
        episode_index.copy(),
        zeros,
        task_array,
        cameras,
        length.copy(),  # a file per episode
    )
