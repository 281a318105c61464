"""Where each episode's rows are when ``meta/episodes`` puts them in the wrong data files.

Two LeRobot writers left ``data/chunk_index`` / ``data/file_index`` stale:

- its dataset merge (``aggregate_datasets``) before 0.4.4 (its PRs #2453, #2799, #2861) kept the sources' indices
  although it had concatenated their rows into other files: they name files that do not exist;
- its v2.1 -> v3.0 converter before 0.5.0 (its issue #2401) recorded the episode that starts each new data file
  as still in the previous one: every converted dataset with more than one data file (100 MB of parquet by
  default) has one stale episode per file, and the files it names hold other row counts than it says.

LeRobot itself loads every data file and never reads those columns, so such datasets train with LeRobot. Here an
episode's rows are found by those columns, so at open every data file the episodes to read name is checked: it must
exist, and its footer must hold the rows the metadata places in it (one footer read per data file, concurrent where
remote, and kept on disk: :mod:`~lerobot_dali.row_count_store`). When one fails, every episode is
located instead by the data files' own ``episode_index`` column (one column of each data file, read once at open),
with a warning that says so. Episodes no data file holds (a data file missing), or holds split or at another
length, still fail at open.

A v2.x dataset has a data file per episode, named by the episode: there is nothing to locate, but its files are
checked alike, each footer once (0.2-0.4 ms of CPU a file on local disk; one ranged read a file where remote; kept on
disk as v3.0's are): an episode of ``episodes.jsonl`` with no data file, or whose file holds another row count than its
``length``, fails at open. Without the check either failed only once a shuffled epoch first reached that episode.
Past :data:`~lerobot_dali.checked_files.CHECKED_FILES` episodes to read (100,000; 2,000 remote), as for the video
headers, the files are checked as their episodes are read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .checked_files import CHECKED_FILES, CHECKED_FILES_REMOTE
from .concurrent_calls import in_threads, one_by_one
from .dataset_info import DatasetInfo, format_path, template_pattern
from .dataset_location import DatasetLocation
from .episode_rows import (
    integer_column_range,
    list_level_widths,
    miscounted_rows_advice,
    open_parquet,
    read_parquet,
)
from .episode_table import CameraFiles, EpisodeTable
from .errors import DataFileError, EpisodeMetadataError, MissingDataFileError
from .file_stamps import FileStamp, FileStamps, local_stamps
from .remote_errors import is_transient
from .row_count_store import Footer, cached_footers
from .said_once import say_once, warn_once
from .special_files import not_a_file

__all__ = [
    "RANGED_COLUMNS",
    "bulk_file_exists",
    "data_file_path",
    "episode_data_path",
    "locate_episode_rows",
    "open_stamped",
    "video_file_path",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Integer columns whose smallest and largest value in each data file the open keeps from the footer's statistics
#: (:attr:`~lerobot_dali.row_count_store.Footer.value_ranges`), to hold them to the metadata when the iterator is
#: built (:meth:`~lerobot_dali.dataset_reader.LeRobotDatasetReader.check_data_columns`).
RANGED_COLUMNS = ("task_index", "subtask_index", "episode_index", "index")


def data_file_path(location: DatasetLocation, info: DatasetInfo, chunk_index: int, file_index: int) -> str:
    """Path of a v3.0 data file on the bulk filesystem, from ``info.json``'s ``data_path`` template."""
    values = {"chunk_index": chunk_index, "file_index": file_index}
    return location.path(format_path(info.data_path, values, name="data_path"))


def episode_data_path(info: DatasetInfo, episodes: EpisodeTable, episode_pos: int) -> str:
    """Path of the data file holding episode ``episode_pos``, relative to the dataset's root, from ``info.json``'s
    ``data_path`` template (v3.0 names chunk and file, v2.x chunk and episode)."""
    chunk = int(episodes.data_chunk_index[episode_pos])
    if info.major_version == "v3":
        values = {"chunk_index": chunk, "file_index": int(episodes.data_file_index[episode_pos])}
    else:
        values = {"episode_chunk": chunk, "episode_index": int(episodes.episode_index[episode_pos])}
    return format_path(info.data_path, values, name="data_path")


def video_file_path(info: DatasetInfo, files: CameraFiles, episode_pos: int, camera: str) -> str:
    """Path of the video holding episode ``episode_pos`` of ``camera``, relative to the dataset's root, from
    ``info.json``'s ``video_path`` template (v3.0 names chunk and file, v2.x chunk and episode)."""
    chunk, file = int(files.chunk_index[episode_pos]), int(files.file_index[episode_pos])
    if info.major_version == "v3":
        values = {"chunk_index": chunk, "file_index": file, "video_key": camera}
    else:
        values = {"episode_chunk": chunk, "episode_index": file, "video_key": camera}
    return format_path(info.video_path or "", values, name="video_path")


def bulk_file_exists(location: DatasetLocation, stamps: FileStamps | None, path: str) -> bool:
    """Whether bulk file ``path`` exists: stamped by ``stamps`` (listed: no request; else the one memoised request
    its stamp costs, which opening it later reuses), else asked of the filesystem."""
    if stamps is None:
        return bool(location.fs.exists(path))
    try:
        stamps[path]
    except MissingDataFileError:
        return False
    return True


def _refuse_no_file(location: DatasetLocation, path: str) -> None:
    """DataFileError where local bulk file ``path`` is no file (:func:`~.special_files.not_a_file`)."""
    kind = not_a_file(location.fs._strip_protocol(path)) if location.is_local else None
    if kind is not None:
        raise DataFileError(
            f"data file {path} is {kind}, not a parquet file: download the dataset again, or leave this file's "
            "episodes out (episodes=[...])"
        )


def open_stamped(location: DatasetLocation, stamps: FileStamps | None, path: str) -> Any:
    """Bulk file ``path`` opened with the size its stamp gives (remote: no metadata request of its own).

    Raises MissingDataFileError naming it when it does not exist (:func:`~.episode_rows.open_parquet` says which), and
    DataFileError where a local one is no file (:func:`~.special_files.not_a_file`: a named pipe's open hung)."""
    _refuse_no_file(location, path)
    return location.open_bulk(path, size=stamps[path].size if stamps is not None else None)


def locate_episode_rows(
    location: DatasetLocation,
    info: DatasetInfo,
    table: EpisodeTable,
    *,
    stamps: FileStamps | None,
    episodes: Sequence[int] | None = None,
) -> tuple[EpisodeTable, dict[str, Footer]]:
    """``table`` (all episodes), or where a data file named by the ``episodes`` to read (all: None) does not
    exist or holds another row count than the metadata places in it, ``table`` with each episode's data file and
    first row taken from the data files' ``episode_index`` column. Only the episodes to read must be found; the
    file row counts stay the metadata's (the rows of the episodes found in each file).

    Also the footers of the data files read (those the metadata names, where they exist), by path:
    :meth:`~lerobot_dali.dataset_reader.LeRobotDatasetReader.check_data_columns` checks them. v2.x: ``table``, its
    episodes to read each checked to have a data file of their length (:func:`_check_episode_files`)."""
    if len(table) == 0:
        return table, {}
    wanted = np.ones(len(table), bool) if episodes is None else np.isin(table.episode_index, np.asarray(episodes))
    if info.major_version != "v3":
        most = CHECKED_FILES if location.is_local else CHECKED_FILES_REMOTE
        if int(wanted.sum()) > most:
            say_once(logger, logging.INFO,
                "%s: %d episodes to read, a data file each: more than %d, so their files are not each checked at "
                "open (a missing or miscounted one fails when read); `lerobot-dali check` checks them all",
                location.description, int(wanted.sum()), most,
            )  # fmt: skip
            return table, {}
        return table, _check_episode_files(location, info, table, stamps=stamps, wanted=wanted)
    firsts = table.first_of_each_data_file(wanted)
    placed = {  # path -> rows the metadata places in it
        data_file_path(location, info, chunk, file): rows
        for chunk, file, rows in zip(
            table.data_chunk_index[firsts].tolist(),
            table.data_file_index[firsts].tolist(),
            table.data_file_rows[firsts].tolist(),
            strict=True,
        )
    }
    missing, problem, footers = _stale_index(location, stamps, placed)
    if problem is None:
        return table, footers
    listed = _listed_data_files(location, info, stamps)
    if not listed:
        raise MissingDataFileError(
            f"{location.description}: meta/episodes {problem}, and no data file matching {info.data_path!r} could "
            "be listed to find the episodes by; re-download the dataset"
        )
    found = _episode_runs(location, stamps, listed, problem=problem)
    runs = np.array([found.get(int(e), (-1, -1, -1, -1)) for e in table.episode_index], dtype=np.int64).reshape(-1, 4)
    absent = table.episode_index[wanted & (runs[:, 0] < 0)]
    if absent.size:  # most often a data file that was never downloaded, or deleted
        shown = f"{absent[:10].tolist()}{' ...' if absent.size > 10 else ''}"
        if missing:
            more = f" (and {len(missing) - 1} more data files)" if len(missing) > 1 else ""
            where = f"{missing[0]} is missing{more}: meta/episodes places episodes there, and episodes {shown} are in "
            where += "no other data file either"
        else:
            where = f"{location.description}: meta/episodes {problem}, and episodes {shown} are in no data file"
        raise MissingDataFileError(f"{where}; re-download the dataset")
    wrong = np.flatnonzero(wanted & (runs[:, 3] != table.length))
    if wrong.size:
        i = int(wrong[0])
        path = data_file_path(location, info, int(runs[i, 0]), int(runs[i, 1]))
        # (the episodes of every such file: with the first file's alone left out, the open failed on the next)
        files = {(chunk, file) for chunk, file in runs[wrong, :2].tolist()}
        in_files = [tuple(run) in files for run in runs[:, :2].tolist()]
        raise EpisodeMetadataError(
            f"{location.description}: meta/episodes {problem}; episode {int(table.episode_index[i])} has length "
            f"{int(table.length[i])} there but {int(runs[i, 3])} rows in {path}: "
            f"{miscounted_rows_advice(_episodes_of_files(table.episode_index[in_files], len(files)), at_open=True)}"
        )
    same = (runs[:, 0] == table.data_chunk_index) & (runs[:, 1] == table.data_file_index)
    if (same & (runs[:, 2] == table.data_row_start))[wanted].all():
        # Every episode is where the metadata says: the files hold rows no episode reads (dropped by a filter, or
        # left by an interrupted write), which reading them would lose.
        paths = {path for path in placed if footers[path].rows != placed[path]}
        in_files = [data_file_path(location, info, chunk, file) in paths for chunk, file in runs[:, :2].tolist()]
        raise EpisodeMetadataError(
            f"{location.description}: meta/episodes {problem}, yet every episode to read is where it says: "
            f"{miscounted_rows_advice(_episodes_of_files(table.episode_index[in_files], len(paths)), at_open=True)}"
        )
    # Episodes not to read that no file holds stay at (-1, -1), a file of their own that no real file's row count
    # includes; the selection drops them.
    warn_once(logger,
        "%s: meta/episodes %s: its data/chunk_index and data/file_index are stale, as LeRobot's dataset merge before "
        "0.4.4 and its v2.1 -> v3.0 converter before 0.5.0 wrote them; each episode's rows were located by the data "
        "files' episode_index column instead (%d data file(s)). Rewrite meta/episodes to open faster.",
        location.description, problem, len(listed),
    )  # fmt: skip
    return table.with_data_rows(runs[:, 0], runs[:, 1], runs[:, 2]), footers


def _episodes_of_files(episodes: np.ndarray, files: int) -> str:
    """Names the episodes of the ``files`` data files that disagree with meta/episodes, to leave out: reading any of
    them checks its file's row count."""
    whose = "its episodes" if files == 1 else f"the episodes of those {files} files,"
    return f"{whose} {episodes[:10].tolist()}{' ...' if episodes.size > 10 else ''}"


def _check_episode_files(
    location: DatasetLocation, info: DatasetInfo, table: EpisodeTable, *, stamps: FileStamps | None, wanted: np.ndarray
) -> dict[str, Footer]:
    """v2.x: the footers of the data files of the ``wanted`` episodes, each of which must exist and hold the
    episode's length in rows (MissingDataFileError, EpisodeMetadataError naming the first and counting the rest)."""
    positions = np.flatnonzero(wanted).tolist()
    placed = {location.path(episode_data_path(info, table, pos)): pos for pos in positions}
    missing, footers = _read_footers(location, stamps, placed)
    if missing:
        pos = placed[missing[0]]
        episode = int(table.episode_index[pos])
        more = f" (and {len(missing) - 1} more episodes' data files)" if len(missing) > 1 else ""
        _refuse_no_file(location, missing[0])  # (a link that loops is listed, but has no stamp)
        chunks = _v2_chunks_holding(location, info, stamps, episode)
        if chunks:  # the files are there, in other chunk folders than chunks_size puts them
            raise MissingDataFileError(
                f"{missing[0]} is missing{more}: info.json's chunks_size={info.chunks_size} puts episode {episode} "
                f"in chunk {episode // info.chunks_size}, but its data file lies in chunk {chunks[0]}; correct "
                "chunks_size in meta/info.json to the number of episodes each chunk folder holds"
            )
        raise MissingDataFileError(
            f"{missing[0]} is missing{more}: meta/episodes.jsonl lists episode {episode}, "
            f"whose data file it is; re-download the dataset, or open without those episodes (episodes=[...] of "
            "the others)"
        )
    miscounted = [path for path, pos in placed.items() if footers[path].rows != table.length[pos]]
    if miscounted:
        pos = placed[miscounted[0]]
        more = f" (and {len(miscounted) - 1} more episodes)" if len(miscounted) > 1 else ""
        episode = int(table.episode_index[pos])
        every = [int(table.episode_index[placed[path]]) for path in miscounted]  # (leaving out the first only failed)
        named = f"episode {episode}" if len(every) == 1 else f"episodes {every[:10]}{' ...' if len(every) > 10 else ''}"
        raise EpisodeMetadataError(
            f"{miscounted[0]}: holds {footers[miscounted[0]].rows} rows, but meta/episodes.jsonl gives episode "
            f"{episode} length {int(table.length[pos])}{more}; {miscounted_rows_advice(named, at_open=True)}"
        )
    return footers


def _read_footers(
    location: DatasetLocation, stamps: FileStamps | None, paths: Collection[str]
) -> tuple[list[str], dict[str, Footer]]:
    """Of the data files ``paths``, those that do not exist; else (none missing) every one's footer. Local files are
    stamped (a ``stat`` each) so that their footers too are read once per cache folder, not by every rank of every
    run (15,000 v2.1 episodes: 3-6 s of CPU)."""
    kept_by: Mapping[str, FileStamp] | None = stamps
    if stamps is None and location.is_local:
        kept_by = local_stamps(paths)
        missing = sorted(path for path in paths if path not in kept_by)
    else:
        missing = sorted(path for path in paths if not bulk_file_exists(location, stamps, path))
    if missing:
        return missing, {}
    ordered = sorted(paths)
    progress = f"lerobot-dali: {location.description}'s data file footers"
    read = partial(_for_each_file, location, partial(_footer, stamps=stamps), progress=progress)
    return [], dict(zip(ordered, cached_footers(kept_by, ordered, read), strict=True))


def _stale_index(
    location: DatasetLocation, stamps: FileStamps | None, placed: dict[str, int]
) -> tuple[list[str], str | None, dict[str, Footer]]:
    """Of the data files ``placed`` (path -> rows the metadata places there), those that do not exist, what is
    wrong with the index (None: nothing): a file missing, or a footer holding another row count; and the footers
    read (none where a file is missing)."""
    missing, footers = _read_footers(location, stamps, placed)
    if missing:
        shown = f"{list(missing[:3])}{' ...' if len(missing) > 3 else ''}"
        return missing, f"names data files that do not exist ({shown})", {}
    paths = sorted(placed)
    miscounted = [path for path in paths if footers[path].rows != placed[path]]
    if not miscounted:
        return [], None, footers
    path, held = miscounted[0], footers[miscounted[0]].rows
    return [], f"places {placed[path]} rows in {path}, which holds {held} ({len(miscounted)} such file(s))", footers


def _for_each_file(
    location: DatasetLocation,
    read: Callable[[DatasetLocation, str], T],
    paths: list[str],
    *,
    progress: str | None = None,
) -> list[T]:
    """``read(location, path)`` for every path, in order; remote files several at once. ``progress``: where that
    takes over :data:`~lerobot_dali.concurrent_calls.PROGRESS_DELAY_S`, the files read so far, under that name."""
    if location.is_local:
        return one_by_one(partial(read, location), paths, progress=progress, unit="file")
    return in_threads(partial(read, location), paths, progress=progress, unit="file")


def _footer(location: DatasetLocation, path: str, *, stamps: FileStamps | None) -> Footer:
    parquet = open_parquet(partial(open_stamped, location, stamps), path)
    try:
        schema = parquet.schema_arrow
        widths = tuple(list_level_widths(field.type) for field in schema)
        ranges = {name: integer_column_range(parquet.metadata, name) for name in RANGED_COLUMNS}
        kept = {name: span for name, span in ranges.items() if span is not None}
        return Footer(int(parquet.metadata.num_rows), tuple(schema.names), widths, kept)
    finally:
        parquet.close(force=True)


def _listed_data_files(
    location: DatasetLocation, info: DatasetInfo, stamps: FileStamps | None
) -> dict[tuple[int, int], str]:
    """``(chunk_index, file_index) -> path`` of the data files that exist: from the remote listing ``stamps``
    already made (no request), or a local listing; matched against ``info.json``'s ``data_path`` template, and
    only under the names that template gives (a file the reader could not name is not one it reads)."""
    pattern = template_pattern(info.data_path, {"chunk_index": r"\d+", "file_index": r"\d+"})
    matcher = re.compile(rf"(?:^|/){pattern}$")
    top = info.data_path.split("/", 1)[0] if "/" in info.data_path else ""
    names = iter(stamps) if stamps is not None else location.fs.find(location.path(top))
    listed: dict[tuple[int, int], str] = {}
    for name in names:
        match = matcher.search(str(name))
        if match is None:
            continue
        pair = (int(match.group("chunk_index")), int(match.group("file_index")))
        path = data_file_path(location, info, *pair)
        if path.endswith(match.group(0).lstrip("/")):  # the template's own spelling (file-001, not file-1)
            listed[pair] = path
    return listed


def _v2_chunks_holding(
    location: DatasetLocation, info: DatasetInfo, stamps: FileStamps | None, episode: int
) -> list[int]:
    """The chunks whose folders hold a v2.x data file of ``episode`` under ``data_path``'s name (none where the
    data folder cannot be listed: the caller's error stands)."""
    pattern = template_pattern(info.data_path, {"episode_chunk": r"\d+", "episode_index": r"\d+"})
    matcher = re.compile(rf"(?:^|/){pattern}$")
    top = info.data_path.split("/", 1)[0] if "/" in info.data_path else ""
    try:
        names = list(stamps) if stamps is not None else location.fs.find(location.path(top))
    except OSError as e:
        logger.debug("%s: cannot list %r to look for episode %d's data file: %s", location.description, top, episode, e)
        return []
    found = (matcher.search(str(name)) for name in names)
    return sorted({int(m["episode_chunk"]) for m in found if m is not None and int(m["episode_index"]) == episode})


def _episode_runs(
    location: DatasetLocation, stamps: FileStamps | None, listed: dict[tuple[int, int], str], *, problem: str
) -> dict[int, tuple[int, int, int, int]]:
    """``episode_index -> (chunk, file, first row, rows)`` over every listed data file; an episode's rows must be
    one run in one file."""
    pairs = sorted(listed)
    paths = [listed[pair] for pair in pairs]
    columns = _for_each_file(location, partial(_episode_column, stamps=stamps, problem=problem), paths)
    found: dict[int, tuple[int, int, int, int]] = {}
    for (chunk, file), path, episodes in zip(pairs, paths, columns, strict=True):
        starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]]) if episodes.size else episodes
        counts = np.diff(np.r_[starts, episodes.size])
        for episode, start, count in zip(episodes[starts].tolist(), starts.tolist(), counts.tolist(), strict=True):
            if episode in found:
                raise EpisodeMetadataError(
                    f"{location.description}: meta/episodes {problem}, and "
                    f"episode {episode}'s rows are not one run in one data file ({path} holds some after others): "
                    "rewrite the data files"
                )
            found[episode] = (chunk, file, start, count)
    return found


def _episode_column(location: DatasetLocation, path: str, *, stamps: FileStamps | None, problem: str) -> np.ndarray:
    try:
        with open_stamped(location, stamps, path) as handle:
            column = read_parquet(handle, ["episode_index"])["episode_index"]  # (KeyError: a file without it)
        if column.null_count:  # (a plain cast made a null episode -2**63)
            raise pa.ArrowInvalid(f"{column.null_count} of its values are missing")
        column = pc.cast(column, pa.int64())  # (ArrowInvalid for a fraction, which a plain cast cut)
    except FileNotFoundError as e:
        raise MissingDataFileError(f"{path} is missing (listed a moment ago)") from e
    # (OSError: a page header that does not parse; UnicodeDecodeError: a column name that is not UTF-8)
    except (KeyError, pa.ArrowException, OSError, UnicodeDecodeError) as e:
        if is_transient(e):
            raise
        raise EpisodeMetadataError(
            f"{location.description}: meta/episodes {problem}, and "
            f"{path} has no readable episode_index column to find the episodes by ({e})"
        ) from e
    return np.asarray(column.to_numpy(), dtype=np.int64)
