"""Open a LeRobot dataset (v3.0, v2.1, v2.0) and answer: which episodes, which rows, which video files.

This is the metadata and tabular layer under the sampler: memory is O(episodes), pixels are never touched,
and every file access goes through fsspec so local folders, the Hub and buckets behave the same. The
reader pickles small (no open handles), so DALI worker processes each get their own copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .column_store import ColumnStore
from .dataset_info import INDEX_COLUMNS, DatasetInfo, Feature
from .dataset_location import (
    DatasetLocation,
    dataset_folder_near,
    read_if_present,
    read_whole,
    resolve_location,
    with_bulk_root,
)
from .dataset_stats import FeatureStats, read_dataset_stats
from .episode_data_files import bulk_file_exists, episode_data_path, locate_episode_rows, open_stamped, video_file_path
from .episode_rows import (
    DecodedGroups,
    ParquetCache,
    StoreEntry,
    check_column_shape,
    damaged_parquet_as,
    miscounted_rows_advice,
    missing_columns_advice,
    opened_stamp,
    read_episode_images,
    read_episode_rows,
    read_parquet,
)
from .episode_table import EpisodeTable, check_video_starts, filter_episodes, read_episode_records, read_episode_table
from .errors import (
    CameraSelectionError,
    DataFileError,
    DatasetError,
    DatasetNotFoundError,
    EpisodeMetadataError,
    MissingDataFileError,
    SchemaMismatchError,
    cameras_hint,
    did_you_mean,
)
from .file_stamps import FileStamp, FileStamps
from .frame_lookup import ITERATORS_LOOKUP, FrameLookup
from .hub_cache_files import bulk_files_named, read_bulk_from_cache
from .remote_errors import changed_on_server, told_change
from .row_count_store import Footer
from .said_once import say_once, warn_once
from .url_secrets import masked
from .value_checks import required_whole_number

__all__ = [
    "INFO_PATH",
    "LOCAL_DATA_FILES_KEPT",
    "NO_SUBTASK_INDEX",
    "REMOTE_DATA_FILES_KEPT",
    "LeRobotDatasetReader",
    "LocatedDataset",
    "VideoRef",
    "data_files_kept",
    "locate_dataset",
    "open_dataset",
    "open_located",
    "read_info",
    "read_info_json",
    "warn_undeclared_columns",
]

logger = logging.getLogger(__name__)

#: The ``subtask_index`` of a row no subtask annotates: subtask writers for LeRobot v3.0 write -1 for the rows of an
#: episode they did not annotate (rosbag2lerobot's DatasetWriter) or that no segment covers (lerobot-annotate's
#: export). Its ``subtask`` string is "", deliberately: LeRobot 0.4.4 reads the list's last text (its ``iloc[-1]``),
#: as if those rows were annotated with it (tests/test_lerobot_parity.py).
NO_SUBTASK_INDEX = -1

#: Where a dataset's ``info.json`` is, relative to its root.
INFO_PATH = "meta/info.json"

#: How far an episode's median row step may differ from 1/fps, relative, before a warning (once per dataset and
#: process) and before an error (see ``_check_timestamps``).
FPS_STEP_WARNING, FPS_STEP_TOLERANCE = 0.10, 0.25
_fps_warned: set[str] = set()


@dataclass(frozen=True)
class VideoRef:
    """Where one episode's frames of one camera are: file path on the reader's fs, the episode's start in it
    (``from_timestamp``) and where its part of the file ends: the next episode of the file's ``from_timestamp``
    (None: no episode follows it there), not its own ``to_timestamp``, which LeRobot never reads."""

    path: str
    from_timestamp_s: float
    next_from_timestamp_s: float | None


#: The most data files a local dataset keeps open, and a remote one: each holds a read-ahead buffer (4 MB), fewer stay.
LOCAL_DATA_FILES_KEPT = 128
REMOTE_DATA_FILES_KEPT = 16


def data_files_kept(location: DatasetLocation) -> int:
    """The most data files a dataset at ``location`` keeps open (:class:`~.episode_rows.ParquetCache`)."""
    return LOCAL_DATA_FILES_KEPT if location.is_local else REMOTE_DATA_FILES_KEPT


class LeRobotDatasetReader:
    """Metadata, episode index, tasks and per-episode rows of one dataset. Build with :func:`open_dataset`."""

    def __init__(
        self,
        location: DatasetLocation,
        info: DatasetInfo,
        episodes: EpisodeTable,
        tasks: dict[int, str],
        *,
        camera_keys: list[str],
        tabular_keys: list[str],
        stamps: FileStamps | None = None,
        image_keys: Sequence[str] = (),
        data_file_footers: Mapping[str, Footer] | None = None,
    ) -> None:
        self.location = location
        #: Remote datasets: size and version of every data/video file from one listing per root.
        self.stamps = stamps
        self.info = info
        self.episodes = episodes
        self.tasks = tasks
        #: ``meta/subtasks.parquet`` (LeRobot 0.4-0.5's subtask annotations): ``subtask_index`` -> text, for the
        #: ``subtask`` strings a batch carries beside ``task``; None where the dataset has none (set by
        #: :func:`open_dataset`, which reads it only where info.json declares ``subtask_index``, as LeRobot does).
        self.subtasks: dict[int, str] | None = None
        #: Per list ("task", "subtask"), the indices it names that LeRobot 0.4 reads another text for: the list's text
        #: and LeRobot's (None: it fails): :func:`read_otherwise`. Empty where its rows are in order. Refused where
        #: the data's rows hold one: at the open where a data file's statistics span one (its column then read, to
        #: tell whether its rows hold it), else as the rows are read.
        self.read_otherwise: dict[str, dict[int, tuple[str, str | None]]] = {}
        #: Video cameras.
        self.camera_keys = camera_keys
        #: Cameras stored as encoded images in the data files (``dtype: "image"``): :meth:`read_episode_images`.
        self.image_keys = list(image_keys)
        self.tabular_keys = tabular_keys
        #: Footers of the data files the open read (by path): :meth:`check_data_columns`.
        self.data_file_footers: Mapping[str, Footer] = data_file_footers or {}
        self._parquet = ParquetCache(partial(open_stamped, location, stamps), max_open=data_files_kept(location))
        #: Data files written as one big row group are read from memory-mapped Arrow copies on local disk.
        self.column_store: ColumnStore | None = ColumnStore()
        self._content: str | None = None
        self._identity: str | None = None

    def content_digest(self) -> str:
        """A digest of what this dataset holds as its metadata tells it, the same wherever it is read from (a local
        folder, an HTTP server, the Hub): ``meta/info.json``, the episodes read (indices, lengths, task texts) and the
        task table, all read at the open (no request). Two datasets alike in all of these have one digest: byte-
        identical copies, and two whose data and videos alone differ (their per-episode stats are not read). Hashed
        once (0.13 s at 100,000 episodes)."""
        if self._content is None:
            ep = self.episodes
            digest = hashlib.sha256(self._info_json())
            digest.update(ep.episode_index.astype("<i8").tobytes())
            digest.update(ep.length.astype("<i8").tobytes())
            digest.update(pc.list_value_length(ep.tasks).fill_null(-1).to_numpy(zero_copy_only=False).astype("<i8"))
            # (a missing text, which the episodes' descriptive lists may hold, as "\1": '\0'.join took str alone; a
            # text as itself, so that the digests of states saved before stay)
            texts = ["\1" if text is None else text for text in ep.tasks.flatten().to_pylist()]
            digest.update("\0".join([*texts, self._task_table()]).encode())
            self._content = digest.hexdigest()[:16]
        return self._content

    def identity_digest(self) -> str:
        """A digest of the dataset whatever episodes of it are read: ``meta/info.json`` and the task table, the same
        wherever it is read from. Two ``episodes=`` selections of one dataset, whose :meth:`content_digest` differ
        (it holds the episodes read), share it: a stream state tells by it a dataset listed at another position with
        another selection (:func:`~.dataset_union.refuse_another_order`). Datasets alike in both (two recordings of
        one robot, task and shape) share it too."""
        if self._identity is None:
            digest = hashlib.sha256(self._info_json())
            digest.update(b"\0" + self._task_table().encode())
            self._identity = digest.hexdigest()[:16]
        return self._identity

    def _info_json(self) -> bytes:
        return json.dumps(self.info.raw, sort_keys=True, default=str).encode()

    def _task_table(self) -> str:
        return json.dumps(sorted(self.tasks.items()))

    def close_files(self) -> None:
        """Close the data files this process holds open for the reader (a union's: every member's); the next read
        opens them again."""
        self._parquet.close()

    def with_location(self, location: DatasetLocation) -> LeRobotDatasetReader:
        """The same dataset read through other filesystems (e.g. the prefetch cache in front of the remote)."""
        return self._copy(location, self.episodes, self.tasks)

    def for_workers(self) -> LeRobotDatasetReader:
        """This reader without the task texts (the per-episode lists and the task table) and the data files'
        footers, which workers never read: the texts are about half of what each worker process is sent (~120
        bytes per episode: 12 MB per worker at 100,000 episodes); the footers of a v2.1 dataset of 15,000
        episodes, 1.5 MB, ~70 ms for each worker to unpickle."""
        episodes = replace(self.episodes, tasks=pa.nulls(len(self.episodes), type=self.episodes.tasks.type))
        return self._copy(self.location, episodes, {}, data_file_footers={})

    def select(
        self, *, cameras: Sequence[str] | None = None, keys: Sequence[str] | None = None
    ) -> LeRobotDatasetReader:
        """This reader narrowed to ``cameras`` and ``keys`` (None: all it reads now), for a reader opened before the
        selection was known (a mixture keeps what all its datasets share)."""
        selected_cameras = _select(list(self.all_camera_keys), cameras, "camera", elsewhere=(self.tabular_keys, "keys"))
        selected_keys = _select(self.tabular_keys, keys, "key", elsewhere=(list(self.all_camera_keys), "cameras"))
        return self._copy(
            self.location,
            self.episodes,
            self.tasks,
            camera_keys=[k for k in selected_cameras if k in self.camera_keys],
            image_keys=[k for k in selected_cameras if k in self.image_keys],
            tabular_keys=selected_keys,
        )

    def _copy(
        self,
        location: DatasetLocation,
        episodes: EpisodeTable,
        tasks: dict[int, str],
        *,
        camera_keys: list[str] | None = None,
        image_keys: list[str] | None = None,
        tabular_keys: list[str] | None = None,
        data_file_footers: Mapping[str, Footer] | None = None,
    ) -> LeRobotDatasetReader:
        """This reader with another location, episode table, task table, selection or footers; everything else (its
        column store setting included) carries over."""
        reader = LeRobotDatasetReader(
            location,
            self.info,
            episodes,
            tasks,
            camera_keys=self.camera_keys if camera_keys is None else camera_keys,
            tabular_keys=self.tabular_keys if tabular_keys is None else tabular_keys,
            stamps=self.stamps,
            image_keys=self.image_keys if image_keys is None else image_keys,
            data_file_footers=self.data_file_footers if data_file_footers is None else data_file_footers,
        )
        reader.column_store = self.column_store
        reader.subtasks = self.subtasks
        reader.read_otherwise = self.read_otherwise
        return reader

    @property
    def all_camera_keys(self) -> tuple[str, ...]:
        """Video cameras, then image cameras: every camera a batch carries, in the pipeline's order."""
        return (*self.camera_keys, *self.image_keys)

    @property
    def read_keys(self) -> tuple[str, ...]:
        """Every camera and feature a batch carries from this reader (its selection), besides the index columns."""
        return (*self.all_camera_keys, *self.tabular_keys)

    @property
    def fps(self) -> float:
        """Frames per second of the rows, info.json's ``fps`` (``delta_timestamps`` offsets are multiples of 1/fps)."""
        return self.info.fps

    @property
    def num_episodes(self) -> int:
        """Episodes read: those ``episodes=`` and ``episode_filter=`` keep, else every episode of the dataset."""
        return len(self.episodes)

    @property
    def num_frames(self) -> int:
        """Rows (frames) of the episodes read, :attr:`num_episodes`' lengths added up."""
        return self.episodes.total_frames

    def __repr__(self) -> str:
        return (
            f"LeRobotDatasetReader({self.location.description!r}, version={self.info.codebase_version}, "
            f"episodes={self.num_episodes}, frames={self.num_frames}, cameras={self.camera_keys}"
            + (f", image cameras={self.image_keys})" if self.image_keys else ")")
        )

    def source_of(self, episode_pos: int) -> str:
        """The dataset that holds episode ``episode_pos``, as messages name it (a union's: the one it came from)."""
        return self.location.description

    def filesystem_of(self, path: str) -> fsspec.AbstractFileSystem:
        """The filesystem that bulk file ``path`` is read through (a union's: that of the dataset holding it, which
        may be local where others are remote)."""
        return self.location.fs

    def episode_is_local(self, episode_pos: int) -> bool:
        """Whether episode ``episode_pos``'s files are on this machine's disk (a union's: its own dataset's)."""
        return self.location.is_local

    def holds_local_files(self) -> bool:
        """Whether some of its files are on this machine's disk (a union's: those of any of its datasets, where
        ``location.is_local`` says all are)."""
        return self.location.is_local

    def frame_lookup(self, episode_pos: int) -> FrameLookup:
        """How episode ``episode_pos``'s rows find their frames where the iterator's options do not decide: a
        union's datasets may each have their own; a dataset alone has none."""
        return ITERATORS_LOOKUP

    def first_episodes(self) -> list[int]:
        """Positions of the episodes the iterator checks when it is built (its files' formats, its rows' frames):
        the first; a union's, each dataset's first."""
        return [0] if self.num_episodes else []

    def undeclared_columns(self, episode_pos: int) -> list[str]:
        """Columns of episode ``episode_pos``'s data file that info.json does not declare. They are never read, so a
        feature whose entry was dropped from info.json is simply missing from batches (LeRobot refuses such a file)."""
        names = self._parquet.get(self.data_path(episode_pos)).schema_arrow.names
        return [name for name in names if name not in self.info.features and not name.startswith("__index_level_")]

    def reads_every_key(self, episode_pos: int) -> bool:
        """Whether episode ``episode_pos``'s rows are read for every tabular key info.json declares (no ``keys=``
        selection left one out): only then does a column info.json leaves out cost a batch a key it would hold."""
        return set(self.info.tabular_keys) <= set(self.tabular_keys)

    def check_data_columns(self) -> None:
        """Raise SchemaMismatchError where a data file of the episodes read lacks the column of a feature read, or
        its type (a fixed-size list: LeRobot's v2.1 files) cannot hold the declared shape, as far as the open read
        their footers (those of the episodes read). Such a file failed only once one of its episodes was read,
        maybe hours into training; LeRobot, which loads every data file first, fails at once.

        Raise EpisodeMetadataError, as a batch of its rows would, where the ``task_index`` (or ``subtask_index``)
        statistics of a data file whose rows are all read hold an index the task (subtask) list lacks
        (:meth:`_check_task_indices`)."""
        if not self.data_file_footers:
            return
        firsts = self.episodes.first_of_each_data_file().tolist()
        paths = [self.data_path(first) for first in firsts]
        footers = {path: self.data_file_footers.get(path) for path in paths}
        self._check_task_indices(dict(zip(paths, firsts, strict=True)))
        self._check_episode_ranges(dict(zip(paths, firsts, strict=True)))
        self._check_episode_tasks(dict(zip(paths, firsts, strict=True)))
        wanted = [*self.tabular_keys, *self.image_keys]
        if not wanted:
            return
        lacking = {
            path: missing
            for path, footer in footers.items()
            if footer is not None and (missing := [k for k in wanted if k not in footer.columns])
        }
        if lacking:
            path, missing = next(iter(lacking.items()))
            more = f" (and {len(lacking) - 1} more data file(s) lack some)" if len(lacking) > 1 else ""
            read = sum(footer is not None for footer in footers.values())
            # (a file another recorder's version wrote: info.json and the other files agree, which dropping the
            # features from info.json would undo)
            alone = (
                f"; {read - len(lacking)} of the {read} data files read lack none: rewrite the file(s) lacking "
                "columns, or leave out their episodes (episodes=[...] of the others)"
                if len(lacking) < read
                else ""
            )
            raise SchemaMismatchError(
                f"{path}: declared feature(s) {missing} have no column in the data file{more} (columns present: "
                f"{list(self.data_file_footers[path].columns)}); "
                f"{missing_columns_advice(missing, cameras=self.image_keys)}{alone}"
            )
        checked = set()  # (columns, list widths) of files checked: 15,000 v2.1 files of one schema took 0.3 s
        for path, footer in footers.items():
            if footer is not None and footer.list_widths and (footer.columns, footer.list_widths) not in checked:
                for key in self.tabular_keys:
                    widths = footer.list_widths[footer.columns.index(key)]
                    check_column_shape(self.info.features[key], widths, path)
                checked.add((footer.columns, footer.list_widths))

    def _check_task_indices(self, firsts: Mapping[str, int]) -> None:
        """Raise EpisodeMetadataError where the smallest or largest ``task_index`` of a data file (``firsts``: each
        one's path -> its first episode read), from the statistics its footer holds, is not in the task list; and
        ``subtask_index`` alike where the dataset has a subtask list (``meta/subtasks.parquet``), whose texts
        batches carry too; and that no row of a file holds an index LeRobot 0.4 reads another row of the list for
        (:attr:`read_otherwise`), where its statistics span one (the column is read then: a value between the smallest
        and the largest may be held by no row). Only files all of whose rows the episodes read hold are checked: rows
        of the episodes left out are never read."""
        self._check_listed_indices(firsts, "task")
        if self.subtasks is not None:
            self._check_listed_indices(firsts, "subtask")

    def _check_episode_ranges(self, firsts: Mapping[str, int]) -> None:
        """Raise EpisodeMetadataError, as reading its rows would (:meth:`_check_rows`), where the ``episode_index``
        (v3.0: and ``index``) statistics of a data file whose rows are all read (``firsts``: each one's path -> its
        first episode read) are not those of the episodes the metadata places there: the smallest and largest
        ``episode_index``, and ``dataset_from_index`` to ``dataset_to_index`` - 1. A file whose rows all read
        right has exactly these, so nothing that reads is refused; one that does not failed only when a shuffled
        epoch first reached it."""
        ep = self.episodes
        read_rows = ep.rows_read_per_data_file()
        spans = ep.data_file_spans(ep.episode_index, ep.dataset_from_index, ep.dataset_to_index)
        (first_episode, last_episode), (first_row, _), (_, stop_row) = spans
        checked = ["episode_index", *(["index"] if self.info.major_version == "v3" else [])]
        for path, first in firsts.items():
            footer = self.data_file_footers.get(path)
            if footer is None or footer.rows != read_rows[first]:
                continue  # (rows of episodes left out: the statistics cover them too)
            expected = {
                "episode_index": (int(first_episode[first]), int(last_episode[first])),
                "index": (int(first_row[first]), int(stop_row[first]) - 1),
            }
            for column in checked:
                span = footer.value_ranges.get(column)
                if column not in self.info.features or span is None or span == expected[column]:
                    continue  # (a column not declared is not read, nor checked when read)
                said = {"episode_index": "episodes", "index": "rows (dataset_from_index to dataset_to_index - 1)"}
                raise EpisodeMetadataError(
                    f"{path}: its {column} values run from {span[0]} to {span[1]}, but the episode metadata places "
                    f"{said[column]} {expected[column][0]} to {expected[column][1]} in it; the data file and the "
                    "episode metadata disagree: rebuild the episode metadata from the data files, or leave that "
                    "file's episodes out (episodes=[...])"
                )

    def _check_episode_tasks(self, firsts: Mapping[str, int]) -> None:
        """Warn where every row of a data file (``firsts``: each one's path -> its first episode read) holds one
        ``task_index`` (its statistics' min and max), yet the episode metadata's ``tasks`` of one of its episodes
        lacks that index's text: the task list was most likely renumbered or edited apart from the data, so the
        ``task`` strings batches carry (the task list's text of each row's index, as LeRobot's) may be another
        task's. Not refused: LeRobot reads it, and the episode lists are only metadata."""
        ep = self.episodes
        read_rows = ep.rows_read_per_data_file()
        ids = ep.data_file_ids()
        single: dict[int, int] = {}  # data file id -> its one task_index
        for path, first in firsts.items():
            footer = self.data_file_footers.get(path)
            span = None if footer is None else footer.value_ranges.get("task_index")
            if footer is None or span is None or span[0] != span[1] or span[0] not in self.tasks:
                continue
            if footer.rows == read_rows[first]:
                single[int(ids[first])] = span[0]
        if not single:
            return
        files = np.fromiter(single, np.int64, len(single))
        order = np.argsort(files)
        positions = np.flatnonzero(np.isin(ids, files))
        task_index = np.fromiter(single.values(), np.int64, len(single))[order][
            np.searchsorted(files[order], ids[positions])
        ]
        lacking = ep.lacking_task(positions, task_index, self.tasks)
        if not lacking.size:
            return
        at = int(lacking[0])
        pos = int(positions[at])
        warn_once(logger,
            "%s: every row holds task_index %d, %r in the task list, but the episode metadata lists episode %d's "
            "tasks as %s (%d such episode(s)): the task list may have been renumbered apart from the data files; "
            "batches carry the task list's text of each row's task_index (as LeRobot's do): check the task list",
            self.data_path(pos), int(task_index[at]), self.tasks[int(task_index[at])], int(ep.episode_index[pos]),
            ep.tasks[pos].as_py(), lacking.size,
        )  # fmt: skip

    def _index_list(self, name: str) -> tuple[Mapping[int, str], str]:
        """The list ``{name}_index`` values name (``name``: "task" or "subtask") and the file it was read from."""
        if name == "subtask":
            return self.subtasks or {}, "meta/subtasks.parquet"
        return self.tasks, "meta/tasks.parquet" if self.info.major_version == "v3" else "meta/tasks.jsonl"

    def _check_listed_indices(self, firsts: Mapping[str, int], name: str) -> None:
        """:meth:`_check_task_indices` for column ``{name}_index`` and its list (:meth:`_index_list`)."""
        listed, file = self._index_list(name)
        read_rows = self.episodes.rows_read_per_data_file()
        column = f"{name}_index"
        wrong: list[tuple[str, tuple[int, int], list[int]]] = []
        for path, first in firsts.items():
            footer = self.data_file_footers.get(path)
            span = None if footer is None else footer.value_ranges.get(column)
            if footer is None or span is None:
                continue  # (a writer that wrote no statistics: a batch of its rows fails, as before)
            if footer.rows != read_rows[first]:
                continue
            unknown = sorted({i for i in span if i not in listed and (name, i) != ("subtask", NO_SUBTASK_INDEX)})
            if unknown:
                wrong.append((path, span, unknown))
            misplaced = self.read_otherwise.get(name, {})
            if not unknown and any(span[0] <= i <= span[1] for i in misplaced):
                # (min and max are values rows hold, those between maybe not: the column says which are)
                held = self._column_values(path, column)
                misread = [i for i in held if i in misplaced]
                if misread:
                    raise self.read_otherwise_error(name, path, misread, f"its rows hold {column} {misread[:10]}")
        if not wrong:
            return
        path, (low, high), unknown = wrong[0]
        more = f" (and {len(wrong) - 1} more data file(s))" if len(wrong) > 1 else ""
        raise EpisodeMetadataError(
            f"{path}: its {column} values run from {low} to {high}, and {column} {unknown} is not in the "
            f"dataset's {name} list ({file}, which holds {name} indices {sorted(listed)[:20]}){more}; the data "
            f"rows and the {name} list disagree: fix one of them, or leave that file's episodes out (episodes=[...])"
        )

    def _column_values(self, path: str, column: str) -> list[int]:
        """The distinct values, in order, of integer column ``column`` of data file ``path`` (all its rows)."""
        with self._parquet.reading(path) as parquet, damaged_parquet_as(DataFileError, path):
            values = parquet.read(columns=[column])[column]
        return sorted(int(v) for v in pc.unique(values).drop_null().to_pylist())

    def read_otherwise_error(self, name: str, path: str, indices: Sequence[int], said: str) -> EpisodeMetadataError:
        """The error for data file ``path``, whose rows may hold ``{name}_index`` values ``indices`` (``said``: how it
        is known), each of which LeRobot 0.4 reads another text for than the list gives it (:attr:`read_otherwise`)."""
        file = self._index_list(name)[1]
        index = indices[0]
        ours, theirs = self.read_otherwise[name][index]
        read = "fails (no such row)" if theirs is None else f"reads row {index}'s {theirs!r}"
        return EpisodeMetadataError(
            f"{path}: {said}, and {file} does not hold {name}_index {list(indices)[:10]} at row {name}_index (its "
            f"rows are not in {name}_index order from 0): LeRobot 0.4 takes a frame's {name} from the row at position "
            f"{name}_index of that file, not by its {name}_index column, so for {name}_index {index} it {read} where "
            f"the list says {ours!r}; "
            f"rewrite {file} with its rows in {name}_index order, numbered 0, 1, ... (renumbering the data's "
            f"{name}_index to match), as LeRobot writes it"
        )

    def unlisted_index_error(
        self, name: str, index: int, episode_index: int, dataset: int | None = None, *, more: int = 0
    ) -> EpisodeMetadataError:
        """The error for a batched row of episode ``episode_index`` whose ``{name}_index`` (``name``: "task" or
        "subtask") is ``index``, which the list lacks: naming the data file, the episode, the value and the list's
        indices. ``dataset``: the row's ``dataset_index`` in a union (which names the member). ``more``: other
        such rows in the batch."""
        listed, file = self._index_list(name)
        where = self._data_file_of(episode_index) or self.location.description
        others = f" (and {more} more row(s) of the batch)" if more else ""
        return EpisodeMetadataError(
            f"{where}: episode {episode_index}'s rows hold {name}_index {index}{others}, which is not in the "
            f"dataset's {name} list ({file}, which holds {name} indices {sorted(listed)[:20]}); the data rows and the "
            f"{name} list disagree: fix one of them, or leave the episode out (episodes=[...])"
        )

    def _data_file_of(self, episode_index: int) -> str | None:
        """The data file of the episode whose ``episode_index`` this is, None where none is read."""
        ep = self.episodes
        pos = int(np.searchsorted(ep.episode_index, episode_index))
        return self.data_path(pos) if pos < len(ep) and int(ep.episode_index[pos]) == episode_index else None

    def read_stats(self) -> FeatureStats:
        """The dataset's feature statistics, as LeRobot reads them (:func:`~.dataset_stats.read_dataset_stats`): of
        every episode, not only those :attr:`episodes` keeps, as LeRobot's policies normalise (``meta.stats``)."""
        return read_dataset_stats(self.location, self.info)

    # -- files ---------------------------------------------------------------------------------------------
    def data_path(self, episode_pos: int) -> str:
        """The data file that holds episode ``episode_pos`` (a position among the episodes read), as a path or URL."""
        return self.location.path(episode_data_path(self.info, self.episodes, episode_pos))

    def data_file_stamp(self, episode_pos: int) -> FileStamp | None:
        """The stamp of the data file that episode ``episode_pos``'s reads go through: a remote one's listing, a local
        one's open handle's, taken when it was opened (a file replaced by a rename since is still read from it, so
        the path's stamp is not what was read)."""
        path = self.data_path(episode_pos)
        return self._data_stamp(path, self._parquet.get(path))

    def changed_on_server(self, paths: Iterable[str]) -> DatasetError | None:
        """The error to raise for remote files ``paths`` that failed to decode or parse, where one of them changed on
        the server since the dataset was opened (:meth:`FileStamps.first_changed`: a metadata request each, so only on
        an error path); None where none did (or the dataset is local)."""
        if self.stamps is None:
            return None
        change = self.stamps.first_changed(paths)
        return None if change is None else changed_on_server(change[0], told_change(change[1:]))

    def video(self, episode_pos: int, camera: str) -> VideoRef:
        """The video file holding camera ``camera`` of the episode at position ``episode_pos`` (see
        :meth:`read_episode`), where in it the episode starts, and where the next episode of the file starts."""
        self.check_position(episode_pos)
        files = self.episodes.cameras[camera]
        path = self.location.path(video_file_path(self.info, files, episode_pos, camera))
        stop = float(files.next_from_timestamp_s[episode_pos])
        return VideoRef(path, float(files.from_timestamp_s[episode_pos]), None if np.isnan(stop) else stop)

    def previous_end_s(self, episode_pos: int, camera: str) -> float | None:
        """Where the episode read before the one at ``episode_pos`` in its video file of ``camera`` ends by its rows
        (its ``from_timestamp + length / fps``): the one whose part of the file ends where this one's starts; None
        where none read is (the file's first, or one left out). For a failed lookup's advice (a pass over the
        episodes): the file's frames from there to this episode's start are no episode's."""
        self.check_position(episode_pos)
        files = self.episodes.cameras[camera]
        same_file = (files.chunk_index == files.chunk_index[episode_pos]) & (
            files.file_index == files.file_index[episode_pos]
        )
        before = np.flatnonzero(same_file & (files.next_from_timestamp_s == files.from_timestamp_s[episode_pos]))
        if not before.size:
            return None
        pos = int(before[0])
        return float(files.from_timestamp_s[pos]) + int(self.episodes.length[pos]) / self.fps

    def check_position(self, episode_pos: int) -> None:
        """Refuse a position that is no episode read (IndexError): numpy's indexing raised a bare IndexError past
        the end, and read a negative position from the end. Names the position of an episode index given instead."""
        count = len(self.episodes)
        if 0 <= episode_pos < count:
            return
        at = np.flatnonzero(self.episodes.episode_index == episode_pos)
        hint = f"; episode {episode_pos} is at position {', '.join(map(str, at))}" if len(at) else ""
        raise IndexError(
            f"episode position {episode_pos} is not one of the {count} episodes {self.location.description} reads "
            f"(positions 0..{count - 1}, in episodes.episode_index order: a position is an episode index only where "
            f"the whole dataset is read){hint}"
        )

    def open(self, path: str) -> Any:
        """A binary file object for ``path`` on the dataset's filesystem (lazy, range reads for remote)."""
        try:
            return open_stamped(self.location, self.stamps, path)
        except MissingDataFileError:
            raise
        except FileNotFoundError as e:
            raise MissingDataFileError(f"{path} is missing (referenced by {self.location.description})") from e

    # -- rows ----------------------------------------------------------------------------------------------
    def read_episode(
        self, episode_pos: int, keys: Sequence[str] | None = None, *, decoded: DecodedGroups | None = None
    ) -> dict[str, np.ndarray]:
        """All rows of one episode as ``{key: (length, *shape)}`` plus the index columns LeRobot batches.

        ``episode_pos`` is the episode's position among those read (``0 .. num_episodes - 1``, in
        ``episodes.episode_index`` order), its episode index only where the whole dataset is read: with
        ``episodes=[5, 7]``, episode 7 is at position 1 (any other position raises IndexError).

        Rows are checked against the episode metadata (episode_index, length, global index) so a data file
        that drifted from its metadata fails here, naming the file and episode. ``decoded``: row groups earlier
        reads decoded, reused (:class:`~.episode_rows.DecodedGroups`: many episodes of one file read in a row).
        """
        self.check_position(episode_pos)
        ep = self.episodes
        wanted = self._with_index_columns(self.tabular_keys if keys is None else keys)
        features = {k: self._feature(k) for k in wanted}
        path = self.data_path(episode_pos)
        length = int(ep.length[episode_pos])
        with self._parquet.reading(path) as parquet:
            if parquet.metadata.num_rows != ep.data_file_rows[episode_pos]:
                episode = int(ep.episode_index[episode_pos])
                raise EpisodeMetadataError(
                    f"{path}: holds {parquet.metadata.num_rows} rows but the episode metadata places "
                    f"{int(ep.data_file_rows[episode_pos])} in it (episode {episode} has length {length}); "
                    f"{miscounted_rows_advice(f'episode {episode} and any other episode in this file')}"
                )
            rows = read_episode_rows(
                parquet,
                path=path,
                row_start=int(ep.data_row_start[episode_pos]),
                length=length,
                features=features,
                store=self._store_entry(path, parquet, self._with_index_columns(self.tabular_keys)),
                decoded=decoded,
            )
        episode_index = int(ep.episode_index[episode_pos])
        self._check_rows(rows, path, episode_pos, episode_index, length)
        # Some writers (GR00T's v2.0) omit columns that are implied by the episode's position.
        if "frame_index" not in rows:
            rows["frame_index"] = np.arange(length, dtype=np.int64)
        if "index" not in rows:
            rows["index"] = np.arange(ep.dataset_from_index[episode_pos], ep.dataset_to_index[episode_pos])
        if "episode_index" not in rows:
            rows["episode_index"] = np.full(length, episode_index, dtype=np.int64)
        return rows

    def read_episode_images(self, episode_pos: int, key: str, *, decoded: DecodedGroups | None = None) -> pa.Array:
        """The encoded images (PNG/JPEG bytes, one per row) of image camera ``key`` for the episode at position
        ``episode_pos`` (``episode_pos`` and ``decoded``: as in :meth:`read_episode`)."""
        self.check_position(episode_pos)
        if key not in self.image_keys:
            raise DatasetError(f"{key!r} is not an image camera of this reader; image cameras: {self.image_keys}")
        path = self.data_path(episode_pos)
        ep = self.episodes
        with self._parquet.reading(path) as parquet:
            return read_episode_images(
                parquet,
                path=path,
                row_start=int(ep.data_row_start[episode_pos]),
                length=int(ep.length[episode_pos]),
                key=key,
                store=self._store_entry(path, parquet, [key]),
                decoded=decoded,
            )

    def rows_stored(self, path: str, group_rows: int, length: int) -> bool:
        """Whether workers read an episode of ``length`` rows in row groups of ``group_rows`` rows of remote data
        file ``path`` from the column store, which already holds every column they read of it: prefetching then
        need not fetch the row groups."""
        store = self.column_store
        if store is None or self.stamps is None or not store.wants(group_rows, length):
            return False
        stamp = self.stamps[path]
        stored = [self._with_index_columns(self.tabular_keys), *([key] for key in self.image_keys)]
        return all(store.holds(path, stamp, columns) for columns in stored)

    def listed_stamp(self, path: str) -> FileStamp | None:
        """The identity of remote file ``path`` from the dataset's listing (no request), None for a local one:
        what keys its packet index and cached ranges, so every process agrees on which version it reads."""
        return self.stamps[path] if self.stamps is not None else None

    def _with_index_columns(self, keys: Sequence[str]) -> list[str]:
        """``keys`` and the index columns LeRobot batches that the dataset declares."""
        return [*keys, *(k for k in INDEX_COLUMNS if k in self.info.features and k not in keys)]

    def _store_entry(self, path: str, parquet: pq.ParquetFile, stored_columns: list[str]) -> StoreEntry | None:
        if self.column_store is None:
            return None
        return StoreEntry(self.column_store, lambda: self._data_stamp(path, parquet), stored_columns)

    def _data_stamp(self, path: str, parquet: pq.ParquetFile) -> FileStamp | None:
        """What identifies the content of data file ``path`` read through ``parquet`` (the column store's key):
        the remote listing's stamp, or the stat of the local handle taken when it was opened."""
        return self.listed_stamp(path) or opened_stamp(parquet)

    def _feature(self, key: str) -> Feature:
        try:
            feature = self.info.features[key]
        except KeyError:
            raise DatasetError(
                f"{self.location.description}: unknown key {key!r}; tabular keys are {self.info.tabular_keys}"
                f"{did_you_mean([key], list(self.info.tabular_keys))}: pass keys from those"
            ) from None
        if feature.is_camera:
            raise DatasetError(
                f"{key!r} is a camera; frames come from the video layer, not the data rows: read them through "
                "DALILeRobotIterator (cameras=[...]), or an image camera's with read_episode_images"
            )
        return feature

    def _check_rows(self, rows: dict[str, np.ndarray], path: str, pos: int, episode_index: int, length: int) -> None:
        if "episode_index" in rows and not (rows["episode_index"] == episode_index).all():
            found = sorted(set(np.unique(rows["episode_index"]).tolist()))[:5]
            raise EpisodeMetadataError(
                f"{path}: rows [{int(self.episodes.data_row_start[pos])}, +{length}) should all be episode "
                f"{episode_index} per the episode metadata but hold episode_index {found}; "
                f"{_disagree_advice(episode_index)}"
            )
        if self.info.major_version == "v3" and "index" in rows:
            expected = np.arange(self.episodes.dataset_from_index[pos], self.episodes.dataset_to_index[pos])
            if not np.array_equal(rows["index"], expected):
                raise EpisodeMetadataError(
                    f"{path}: episode {episode_index}'s 'index' column does not run from dataset_from_index="
                    f"{int(expected[0])} to dataset_to_index={int(expected[-1]) + 1}; {_disagree_advice(episode_index)}"
                )
        elif "index" in rows and length and not np.array_equal(rows["index"], rows["index"][0] + np.arange(length)):
            # v2.x metadata has no index range to hold the column to, but an episode's rows are consecutive:
            # repeated values would hand the trainer the same `index` for different frames.
            row = int(np.flatnonzero(np.diff(rows["index"]) != 1)[0]) + 1
            raise EpisodeMetadataError(
                f"{path}: episode {episode_index}'s 'index' column does not rise by 1 at its row {row} "
                f"({int(rows['index'][row - 1])} then {int(rows['index'][row])}); rewrite the data file"
            )
        for name, misread in self.read_otherwise.items():
            held = rows.get(f"{name}_index")
            if misread and held is not None:  # (the open checked files with statistics; this, those without)
                found = [i for i in np.unique(held).tolist() if i in misread]
                if found:
                    said = f"episode {episode_index}'s rows hold {name}_index {found[:10]}"
                    raise self.read_otherwise_error(name, path, found, said)
        if "timestamp" in rows:
            with np.errstate(invalid="ignore"):  # (damaged bytes' signalling NaN: refused below, not warned of)
                timestamps = np.asarray(rows["timestamp"], dtype=np.float64)
            self._check_timestamps(timestamps, path, episode_index)

    def _check_timestamps(self, timestamps: np.ndarray, path: str, episode_index: int) -> None:
        """Rows in time order, about 1/fps apart: out-of-order rows would read swapped frames, and a wrong fps in
        info.json scales every delta_timestamps window. The median step is checked, not each one, so wall-clock
        timestamps with jitter pass (cr5's medians are 1.5% short of 1/fps). 10% off warns: an fps mislabelled by
        one common rate for another (25 for 30, 15 for 18) is 20% off, but so is a recording loop that ran
        slower than its nominal rate, which reads right by frame_index. Past 25% it fails."""
        not_finite = np.flatnonzero(~np.isfinite(timestamps))
        if not_finite.size:
            row = int(not_finite[0])
            raise EpisodeMetadataError(
                f"{path}: episode {episode_index}'s timestamp at its row {row} is not a finite number "
                f"({timestamps[row]}; {not_finite.size} such rows); the data file is damaged: rewrite it"
            )
        steps = np.diff(timestamps)
        if steps.size and not (steps >= 0).all():
            row = int(np.flatnonzero(steps < 0)[0]) + 1
            raise EpisodeMetadataError(
                f"{path}: episode {episode_index}'s timestamps go back at its row {row} "
                f"({timestamps[row - 1]:.6f} s then {timestamps[row]:.6f} s); the rows are out of order: rewrite "
                f"the data file with each episode's rows in time order, or leave episode {episode_index} out "
                "(episodes=[...])"
            )
        repeats = np.flatnonzero(steps == 0)
        if repeats.size:  # (a recorder that logged one camera frame twice)
            row = int(repeats[0]) + 1
            more = f" (and {repeats.size - 1} more pairs of rows)" if repeats.size > 1 else ""
            warn_once(logger,
                "%s: episode %d's rows %d and %d%s share the timestamp %.6f s: found by timestamp (the default, as "
                "LeRobot finds them) both read one video frame; timestamp_source='frame_index' reads each row's own",
                path, episode_index, row - 1, row, more, timestamps[row],
            )  # fmt: skip
        if steps.size >= 2:
            median, frame = float(np.median(steps)), 1.0 / self.info.fps
            off = abs(median - frame) / frame
            said = (
                f"{path}: episode {episode_index}'s rows are {median:.6f} s apart (median), but info.json's fps "
                f"{self.info.fps:g} says {frame:.6f} s"
            )
            if off > FPS_STEP_TOLERANCE:
                raise DatasetError(
                    f"{said}; fix fps in meta/info.json (delta_timestamps windows and frame_index lookups rest on it)"
                )
            if off > FPS_STEP_WARNING and self.location.description not in _fps_warned:
                _fps_warned.add(self.location.description)
                warn_once(logger,
                    "%s (%.0f%% off). If fps is wrong, fix it in meta/info.json: delta_timestamps windows count rows "
                    "at fps, so they are scaled by the error. If the timestamps are wall-clock and fps is right, "
                    "read video by frame_index (timestamp_source='frame_index').", said, 100 * off,
                )  # fmt: skip


def open_dataset(
    path_or_repo: str | os.PathLike[str],
    *,
    revision: str | None = None,
    cameras: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    data_files_root: str | os.PathLike[str] | None = None,
    episodes: Sequence[int] | None = None,
    episode_filter: Callable[[dict[str, Any]], bool] | None = None,
) -> LeRobotDatasetReader:
    """Open a dataset from a local folder, a Hub repo id (with ``revision``) or an fsspec URL.

    ``cameras`` selects cameras, video and image ones (default: all declared); ``keys`` selects tabular features
    (default: all declared). Selecting lets a dataset whose info.json declares a camera without files, or a column that
    drifted, still be read for the rest. ``data_files_root`` (a folder or fsspec URL such as
    ``s3://bucket/mirror``) serves ``data/`` and ``videos/`` while metadata comes from ``path_or_repo``. A Hub
    dataset's are read from huggingface_hub's cache where it holds all those to read (:mod:`.hub_cache_files`).
    ``episodes`` keeps only those episode indices, as LeRobot's ``LeRobotDataset(episodes=...)`` does (a
    train/validation split); batches still carry the dataset's own ``index`` and ``episode_index``.
    ``episode_filter`` keeps the episodes (of ``episodes``, if given) whose metadata row it returns True for, as
    LeRobot's does: e.g. ``lambda ep: ep["length"] >= 100``, or on a column the dataset's writer added. It runs
    here, once; the workers only see the episodes it kept.
    """
    located = locate_dataset(path_or_repo, revision=revision, storage_options=storage_options)
    return open_located(
        located, cameras=cameras, keys=keys, storage_options=storage_options, data_files_root=data_files_root,
        episodes=episodes, episode_filter=episode_filter,
    )  # fmt: skip


@dataclass(frozen=True)
class LocatedDataset:
    """A dataset resolved once (a Hub branch or tag to the commit of its metadata snapshot) and its info.json read
    there (:func:`locate_dataset`): what is decided from its info.json before it is opened (the cameras to open it
    with, :func:`~.key_rename.own_cameras`) and its open (:func:`open_located`) read one commit, and ask the server
    for info.json and the revision once."""

    location: DatasetLocation
    info: DatasetInfo


def locate_dataset(
    path_or_repo: str | os.PathLike[str], *, revision: str | None = None, storage_options: dict[str, Any] | None = None
) -> LocatedDataset:
    """Where ``path_or_repo`` is (:func:`~.dataset_location.resolve_location`) and its info.json, as
    :func:`open_dataset` takes them."""
    location = resolve_location(path_or_repo, revision=revision, storage_options=storage_options)
    return LocatedDataset(location, read_info(location))


def open_located(
    located: LocatedDataset,
    *,
    cameras: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    data_files_root: str | os.PathLike[str] | None = None,
    episodes: Sequence[int] | None = None,
    episode_filter: Callable[[dict[str, Any]], bool] | None = None,
) -> LeRobotDatasetReader:
    """:func:`open_dataset` of a dataset :func:`locate_dataset` located: at its location, with its info.json."""
    location, info = located.location, located.info
    if data_files_root is not None:
        location = with_bulk_root(location, data_files_root, storage_options=storage_options)
    selected = _select(info.camera_keys, cameras, "camera", elsewhere=(info.tabular_keys, "keys"))
    camera_keys = [k for k in selected if info.features[k].is_video]
    image_keys = [k for k in selected if not info.features[k].is_video]
    tabular_keys = _select(info.tabular_keys, keys, "key", elsewhere=(info.camera_keys, "cameras"))
    records = read_episode_records(location.meta_fs, location.meta_root, info)
    named = episodes  # (the user's own selection: episode_filter's replaces it below)
    table = read_episode_table(records, info, video_keys=camera_keys)
    if episode_filter is not None:
        candidates = None
        if episodes is not None:  # (each must be the dataset's: the table's select says which are not)
            candidates = table.select(episodes, source=location.description).episode_index.tolist()
        episodes = filter_episodes(records, episode_filter, candidates=candidates)
    # (where the selected episodes lie in their video files is checked for them alone: one left out reads nothing)
    check_video_starts(table, info, source=records.source, episodes=episodes)
    location = read_bulk_from_cache(location, bulk_files_named(info, table, camera_keys, episodes))
    # Remote: one recursive listing per root stamps every file (no per-file metadata request, here or in
    # any worker); a filesystem that cannot list falls back to one request per file looked up.
    stamps = None if location.is_local else FileStamps(location.fs, [location.path("data"), location.path("videos")])
    table, data_file_footers = locate_episode_rows(location, info, table, stamps=stamps, episodes=episodes)
    if len(table) == 0:
        raise DatasetError(
            f"{location.description}: the episode metadata lists no episodes; nothing to read: the dataset's files "
            "are incomplete: download or copy its meta/ again"
        )
    if info.total_episodes > len(table) and (named is None or not np.isin(named, table.episode_index).all()):
        # (a file cut at a line's end, or a file of meta/episodes missing, reads as fewer episodes; LeRobot 0.4.4
        # refuses such a v3 dataset at open, "IndexError: Episode index 3 out of range", and its v2.1 converter an
        # episodes.jsonl listing fewer episodes than the data files hold. Episodes named with episodes=, each
        # listed, lose nothing: warned of below, as LeRobot 0.4.4 opens them, asking for those alone)
        raise EpisodeMetadataError(
            f"{location.description}: info.json says total_episodes={info.total_episodes} but the episode metadata "
            f"({records.source}) lists {len(table)}: it may be cut short (a download that ended early): download or "
            "copy meta/ again; if episodes were removed on purpose, set total_episodes (and total_frames) in "
            "meta/info.json to what remains"
        )
    if info.total_episodes and info.total_episodes != len(table):
        warn_once(
            logger,
            "%s: info.json says total_episodes=%d but the episode metadata lists %d; using the metadata",
            location.description,
            info.total_episodes,
            len(table),
        )
    if info.total_frames and info.total_frames != table.total_frames:
        warn_once(logger,
            "%s: info.json says total_frames=%d but the episode metadata's lengths add up to %d; reading the "
            "metadata's (LeRobot 0.4.4 takes len(dataset) from total_frames, so it reads other frames): fix "
            "total_frames in meta/info.json",
            location.description, info.total_frames, table.total_frames,
        )  # fmt: skip
    if episodes is not None:
        table = table.select(episodes, source=location.description)
    tasks, task_rows = _read_tasks(location, info.codebase_version)
    reader = LeRobotDatasetReader(
        location,
        info,
        table,
        tasks,
        camera_keys=camera_keys,
        tabular_keys=tabular_keys,
        stamps=stamps,
        image_keys=image_keys,
        data_file_footers=data_file_footers,
    )
    reader.read_otherwise = {"task": read_otherwise(task_rows)}
    subtask_list = _read_subtasks(location) if "subtask_index" in info.features else None
    if subtask_list is not None:  # (LeRobot 0.4 reads it by position too: `subtasks.iloc[subtask_index]`)
        reader.subtasks = dict(subtask_list[0])
        reader.read_otherwise["subtask"] = read_otherwise(subtask_list[1])
    _check_first_files(reader)
    say_once(logger, logging.INFO, "opened %r", reader)
    return reader


def warn_undeclared_columns(reader: LeRobotDatasetReader) -> None:
    """Warn, per dataset, of data-file columns info.json does not declare: a batch then lacks a key the data holds,
    which a KeyError in the training loop would not explain. Where keys were chosen (``keys=``, ``--keys``), the
    batches hold those alone whatever info.json declares, so the columns are only named, at INFO: a warning on
    every run of a command the user narrowed on purpose taught nothing. A first data file that does not open is
    left to the row reads, which raise naming it."""
    for pos in reader.first_episodes():
        try:
            extra = reader.undeclared_columns(pos)
        except DatasetError:
            continue
        if not extra:
            continue
        if reader.reads_every_key(pos):
            warn_once(logger,
                "%s: the data files hold columns info.json does not declare, %s: they are not read, so batches "
                "have no such keys; declare them under 'features' in meta/info.json to read them",
                reader.source_of(pos), extra,
            )  # fmt: skip
        else:
            say_once(logger, logging.INFO,
                "%s: the data files also hold columns info.json does not declare, %s, which no keys= selection can "
                "name; declare them under 'features' in meta/info.json to read them",
                reader.source_of(pos), extra,
            )  # fmt: skip


def _select(
    available: list[str], chosen: Sequence[str] | None, what: str, *, elsewhere: tuple[list[str], str]
) -> list[str]:
    """``chosen`` of ``available``; ``elsewhere``: the other selection's keys and argument, named when a key
    given here belongs there."""
    if chosen is None:
        return list(available)
    if isinstance(chosen, str):
        raise TypeError(f"{what}s= takes a list of keys, got the string {chosen!r}: pass [{chosen!r}]")
    unknown = [k for k in chosen if k not in available]
    misplaced = [k for k in unknown if k in elsewhere[0]]
    if misplaced:
        raise DatasetError(f"{misplaced}: select these with {elsewhere[1]}=, not {what}s=")
    if unknown:  # (a camera: as datasets read together say it, one class for a --cameras mistake)
        raise (CameraSelectionError if what == "camera" else DatasetError)(
            f"unknown {what}(s) {unknown}; this dataset declares {available}: pass {what}s= from those (--{what}s on "
            f"the command line){did_you_mean(unknown, available)}"
        )
    return list(chosen)


def read_info(location: DatasetLocation) -> DatasetInfo:
    """``meta/info.json`` parsed, as :func:`read_info_json` reads it."""
    return DatasetInfo.from_json(read_info_json(location), source=location.meta_path(INFO_PATH))


def read_info_json(location: DatasetLocation) -> dict[str, Any]:
    """``meta/info.json`` as parsed JSON; DatasetNotFoundError where there is none, DatasetError where it is not a
    JSON object."""
    path = location.meta_path(INFO_PATH)
    shown = masked(path)  # (a filesystem that keeps a URL's query in its paths: memory://b/ds?token=...)
    try:
        raw = json.loads(read_whole(location.meta_fs, path).getvalue().decode("utf-8"))
    except FileNotFoundError as e:
        advice = "pass the folder that holds the dataset's meta/info.json"
        if location.is_local and os.path.isdir(location.meta_path("meta")):
            advice = "the dataset's files are incomplete: copy or download its meta/info.json again"
        elif location.is_local:
            near = dataset_folder_near(location.root)
            advice = near[1] if near else advice
        raise DatasetNotFoundError(
            f"{location.description} is not a LeRobot dataset: {shown} is missing; {advice}"
        ) from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # (bytes that are not UTF-8 fail as the file is read)
        raise DatasetError(f"{shown} is not valid JSON: {e}; the file is damaged: {_copy_again(shown)}") from e
    if not isinstance(raw, dict):
        raise DatasetError(
            f"{shown} holds a JSON {type(raw).__name__}, not the object LeRobot writes; {_copy_again(shown)}"
        )
    return raw


def _disagree_advice(episode_index: int) -> str:
    """What to do where an episode's data rows are not those its metadata describes."""
    return (
        "the data file and the episode metadata disagree: download the dataset again, or leave episode "
        f"{episode_index} out (episodes=[...])"
    )


def _copy_again(path: str) -> str:
    """The advice for a metadata file that is not what LeRobot writes: no option reads around meta/."""
    return f"download or copy {path} again"


#: A task (subtask) list's rows as read, in the file's order: (index, text).
TaskRows = list[tuple[int, str]]


def _read_tasks(location: DatasetLocation, version: str) -> tuple[dict[int, str], TaskRows]:
    """The task list (``task_index`` -> text) and its rows LeRobot reads by row position (:func:`read_otherwise`):
    v3.0's, where its texts are the pandas index LeRobot 0.4 reads (:func:`_text_column`); a v2.x list's LeRobot 0.3
    reads by index: none."""
    parquet_path = location.meta_path("meta/tasks.parquet")
    jsonl_path = location.meta_path("meta/tasks.jsonl")
    # Each version's own file asked for first: over HTTP a file that is not there costs requests of its own.
    readers: list[tuple[str, Callable[[Any, str], tuple[TaskRows, TaskRows]]]] = [
        (parquet_path, _tasks_from_parquet),
        (jsonl_path, _tasks_from_jsonl),
    ]
    for path, read in readers[::-1] if version.startswith("v2") else readers:
        f = read_if_present(location.meta_fs, path)
        if f is not None:
            rows, by_position = read(f, path)
            return dict(rows), by_position
    raise DatasetError(
        f"{location.description}: no task list (meta/tasks.parquet or meta/tasks.jsonl); the dataset's files are "
        "incomplete: download or copy its meta/ again"
    )


def _read_subtasks(location: DatasetLocation) -> tuple[TaskRows, TaskRows] | None:
    """The rows of ``meta/subtasks.parquet`` (written as ``tasks.parquet`` is, with ``subtask_index``) and those
    LeRobot reads by row position (as :func:`_read_tasks`), None where absent."""
    path = location.meta_path("meta/subtasks.parquet")
    f = read_if_present(location.meta_fs, path)
    return None if f is None else _tasks_from_parquet(f, path, name="subtask")


def read_otherwise(rows: TaskRows) -> dict[int, tuple[str, str | None]]:
    """Of the indices a task (subtask) list's ``rows`` name, those LeRobot 0.4 reads another text for: it takes the
    text of the row at position ``task_index`` (pandas' ``iloc``), not the row whose ``task_index`` it is, so a list
    not in index order from 0 gives another row's text, or fails past its last row: {index: (the list's text, the text
    LeRobot reads, None where it fails)}. Empty for a list as LeRobot writes it (row i holds index i)."""
    texts = [text for _, text in rows]
    count = len(texts)
    return {
        index: (text, texts[index] if -count <= index < count else None)
        for index, text in rows
        if not (-count <= index < count and texts[index] == text)
    }


def _tasks_from_parquet(f: Any, parquet_path: str, *, name: str = "task") -> tuple[TaskRows, TaskRows]:
    """A task (``name``: "subtask": subtask) list's rows, and those LeRobot 0.4 reads by row position: the rows where
    the texts are its pandas index (:func:`_text_column`), none where LeRobot reads no text of the file."""
    with damaged_parquet_as(DatasetError, parquet_path):
        table = read_parquet(f)
        table.validate(full=True)  # (strings that are not UTF-8)
    text_column, by_position = _text_column(table, parquet_path, name)
    if text_column is None or f"{name}_index" not in table.column_names:
        raise DatasetError(
            f"{parquet_path}: expected a '{name}_index' column and the {name} strings, found {table.column_names}; "
            f"{_copy_again(parquet_path)}"
        )
    tasks: dict[int, str] = {}
    rows: TaskRows = []
    pairs = zip(table[f"{name}_index"].to_pylist(), table[text_column].to_pylist(), strict=True)
    for row, (index, text) in enumerate(pairs):
        try:
            rows.append(_add_task(tasks, index, text, name=name))
        except ValueError as e:
            raise DatasetError(f"{parquet_path}: bad {name} at row {row} ({e}); {_copy_again(parquet_path)}") from e
    return rows, rows if by_position else []


def _text_column(table: pa.Table, parquet_path: str, name: str) -> tuple[str | None, bool]:
    """The column of a task (``name``: "subtask": subtask) list ``table`` holding its texts. LeRobot 0.4 takes a
    row's text from the DataFrame pandas reads (``tasks.iloc[task_index].name``): its index, the column the file's
    pandas metadata names as it (LeRobot's writer: the unnamed ``__index_level_0__``), whatever that column is named.
    Where that is no text column (no pandas metadata: another writer, pyarrow or polars; a RangeIndex; an index of
    numbers), LeRobot gives each frame the row's number (or that number) as its task, not a text: the column named
    ``name`` (or ``__index_level_0__``) is the list's texts then, said once. Returns the column (None where there is
    none) and whether LeRobot reads its texts (by row position). DatasetError where the pandas metadata is damaged
    (LeRobot's pandas fails to read the file)."""
    raw = (table.schema.metadata or {}).get(b"pandas")
    try:
        pandas = json.loads(raw) if raw is not None else None  # (null, as pyarrow reads it: none)
    except ValueError:  # (JSONDecodeError; UnicodeDecodeError)
        pandas = raw
    index = pandas.get("index_columns", []) if isinstance(pandas, dict) else [] if pandas is None else None
    if not isinstance(index, list):
        raise DatasetError(
            f"{parquet_path}: its pandas metadata, which names the column of its {name} texts (the DataFrame's index "
            f"LeRobot reads them from), is damaged ({raw!r:.80}: not a JSON object whose 'index_columns' is a "
            f"list); {_copy_again(parquet_path)}"
        )
    if len(index) == 1 and isinstance(index[0], str) and index[0] in table.column_names:
        kind = table.schema.field(index[0]).type
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind  # (pandas' CategoricalIndex)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            return index[0], True
    column = next((c for c in (name, "__index_level_0__") if c in table.column_names), None)
    if column is not None:
        warn_once(logger,
            "%s: its %s texts are column %r, which its pandas metadata does not make the DataFrame's index (as "
            "LeRobot writes it): LeRobot 0.4 gives each frame the row's number (or the index's value) as its %s, "
            "not this text; batches here carry the text",
            parquet_path, name, column, name,
        )  # fmt: skip
    return column, False


def _tasks_from_jsonl(f: Any, jsonl_path: str) -> tuple[TaskRows, TaskRows]:
    """A v2.x task list's rows (LeRobot 0.3 reads them by index: none by row position)."""
    tasks: dict[int, str] = {}
    rows: TaskRows = []
    for line_no, line in enumerate(f, start=1):  # (decoded per line: bytes that are not UTF-8 then name their line)
        if line.strip():
            try:
                record = json.loads(line.decode("utf-8"))
                rows.append(_add_task(tasks, record["task_index"], record["task"]))
            except (ValueError, KeyError, TypeError) as e:
                raise DatasetError(f"{jsonl_path}:{line_no}: bad task record ({e}); {_copy_again(jsonl_path)}") from e
    return rows, []


def _add_task(tasks: dict[int, str], index: Any, text: Any, *, name: str = "task") -> tuple[int, str]:
    """Add one task of the task list to ``tasks``, and return it (index, text). An index that is not a whole number, a
    missing task, a task that is not a text, or an index listed twice with two tasks raises ValueError: cut to a whole
    number or kept once, it named another task; made a text (str() of a list), it was one LeRobot does not give (its
    batches carry the value as written). ``name``: "subtask" for the subtask list."""
    number = required_whole_number(f"{name}_index", index)
    if text is None:
        raise ValueError(f"{name}_index {number} has no {name}")
    if not isinstance(text, str):
        raise ValueError(
            f"{name}_index {number}'s {name} is {text!r} ({type(text).__name__}), not a text: write it as one string"
        )
    if tasks.setdefault(number, text) != text:
        raise ValueError(f"{name}_index {number} is listed twice, as {tasks[number]!r} and as {text!r}")
    return number, text


def _check_first_files(reader: LeRobotDatasetReader) -> None:
    """One existence check per camera (every data file was checked by
    :func:`.episode_data_files.locate_episode_rows`): cheap, and catches a camera with no files."""
    exists = partial(bulk_file_exists, reader.location, reader.stamps)
    for camera in reader.camera_keys:
        video = reader.video(0, camera).path
        if not exists(video):
            others = [c for c in reader.camera_keys if c != camera]
            raise MissingDataFileError(
                f"{video} is missing: camera {camera!r} is declared in info.json but its video for the first "
                f"episode does not exist. If the camera was never recorded, open with {cameras_hint(others)}",
                camera=camera,
            )
