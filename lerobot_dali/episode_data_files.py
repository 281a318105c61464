"""Where each episode's rows are when ``meta/episodes`` names data files that do not exist.

LeRobot's dataset merge (``aggregate_datasets``) before 0.4.4 (its PRs #2453, #2799, #2861) kept the sources'
``data/chunk_index`` / ``data/file_index`` although it had concatenated their rows into other files. LeRobot itself
loads every data file and never reads those columns, so such merged datasets on the Hub train with LeRobot. Here
an episode's rows are found by those columns; when any of them names a missing file, every episode is located
instead by the data files' own ``episode_index`` column (one column of each data file, read once at open), with a
warning that says so. Episodes no data file holds (a data file missing), or holds split or at another length,
still fail, now at open rather than when a batch first reaches them.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .dataset_info import DatasetInfo, format_path
from .dataset_location import DatasetLocation
from .episode_table import EpisodeTable
from .errors import EpisodeMetadataError, MissingDataFileError

__all__ = ["locate_episode_rows"]

logger = logging.getLogger(__name__)


def locate_episode_rows(
    location: DatasetLocation, info: DatasetInfo, table: EpisodeTable, *, exists: Callable[[str], bool]
) -> EpisodeTable:
    """``table``, or (where its data files do not all exist) ``table`` with every episode's data file and first
    row taken from the data files' ``episode_index`` column. ``exists`` answers for a data file path."""
    if info.major_version != "v3" or len(table) == 0:
        return table
    named = {
        pair: _data_path(location, info, *pair)
        for pair in set(zip(table.data_chunk_index.tolist(), table.data_file_index.tolist(), strict=True))
    }
    missing = sorted(path for path in named.values() if not exists(path))
    if not missing:
        return table
    shown = f"{missing[:3]}{' ...' if len(missing) > 3 else ''}"
    listed = _listed_data_files(location, info)
    if not listed:
        raise MissingDataFileError(
            f"{location.description}: meta/episodes names data files that do not exist ({shown}), and no data file "
            f"matching {info.data_path!r} could be listed to find the episodes by; re-download the dataset"
        )
    found = _episode_runs(location, listed, missing=shown)
    located = [found.get(int(e)) for e in table.episode_index]
    absent = [int(e) for e, where in zip(table.episode_index, located, strict=True) if where is None]
    if absent:  # most often a data file that was never downloaded, or deleted
        raise MissingDataFileError(
            f"{missing[0]} is missing{f' (and {len(missing) - 1} more data files)' if len(missing) > 1 else ''}: "
            f"meta/episodes places episodes there, and episodes {absent[:10]}{' ...' if len(absent) > 10 else ''} "
            "are in no other data file either; re-download the dataset"
        )
    runs = np.array(located, dtype=np.int64)  # (episodes, 5): chunk, file, first row, rows, rows in the file
    wrong = np.flatnonzero(runs[:, 3] != table.length)
    if wrong.size:
        i = int(wrong[0])
        path = _data_path(location, info, int(runs[i, 0]), int(runs[i, 1]))
        raise EpisodeMetadataError(
            f"{location.description}: meta/episodes names data files that do not exist ({shown}); episode "
            f"{int(table.episode_index[i])} has length {int(table.length[i])} there but {int(runs[i, 3])} rows in "
            f"{path}: the episode metadata does not describe these data files; rebuild it"
        )
    logger.warning(
        "%s: meta/episodes' data/chunk_index and data/file_index name data files that do not exist (%s), as LeRobot's "
        "dataset merge before 0.4.4 wrote them; each episode's rows were located by the data files' episode_index "
        "column instead (%d episodes in %d data file(s)). Rewrite meta/episodes to open faster.",
        location.description, shown, len(table), len(np.unique(runs[:, :2], axis=0)),
    )  # fmt: skip
    return table.with_data_rows(runs[:, 0], runs[:, 1], runs[:, 2], file_rows=runs[:, 4])


def _data_path(location: DatasetLocation, info: DatasetInfo, chunk: int, file: int) -> str:
    values = {"chunk_index": chunk, "file_index": file}
    return location.path(format_path(info.data_path, values, name="data_path"))


def _listed_data_files(location: DatasetLocation, info: DatasetInfo) -> dict[tuple[int, int], str]:
    """``(chunk_index, file_index) -> path`` of the data files that exist, found by listing and matched against
    ``info.json``'s ``data_path`` template."""
    pattern = ""
    for literal, field, _, _ in string.Formatter().parse(info.data_path):
        pattern += re.escape(literal)
        if field is not None:
            pattern += rf"(?P<{field}>\d+)" if field in ("chunk_index", "file_index") else r"[^/]*"
    matcher = re.compile(rf"(?:^|/){pattern}$")
    top = location.path(info.data_path.split("/", 1)[0]) if "/" in info.data_path else location.path("")
    listed: dict[tuple[int, int], str] = {}
    for path in location.fs.find(top):
        match = matcher.search(path)
        if match is not None:
            pair = (int(match.group("chunk_index")), int(match.group("file_index")))
            listed[pair] = _data_path(location, info, *pair)
    return listed


def _episode_runs(
    location: DatasetLocation, listed: dict[tuple[int, int], str], *, missing: str
) -> dict[int, tuple[int, int, int, int, int]]:
    """``episode_index -> (chunk, file, first row, rows, rows in the file)`` over every listed data file; an
    episode's rows must be one run in one file."""
    found: dict[int, tuple[int, int, int, int, int]] = {}
    for (chunk, file), path in sorted(listed.items()):
        try:
            with location.open_bulk(path) as handle:
                column = pq.read_table(handle, columns=["episode_index"])["episode_index"]
        except (KeyError, pa.ArrowException) as e:
            raise EpisodeMetadataError(
                f"{location.description}: meta/episodes names data files that do not exist ({missing}), and "
                f"{path} has no readable episode_index column to find the episodes by ({e})"
            ) from e
        except FileNotFoundError as e:
            raise MissingDataFileError(f"{path} is missing (listed a moment ago)") from e
        episodes = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
        starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]]) if episodes.size else episodes
        counts = np.diff(np.r_[starts, episodes.size])
        for episode, start, count in zip(episodes[starts].tolist(), starts.tolist(), counts.tolist(), strict=True):
            if episode in found:
                raise EpisodeMetadataError(
                    f"{location.description}: meta/episodes names data files that do not exist ({missing}), and "
                    f"episode {episode}'s rows are not one run in one data file ({path} holds some after others): "
                    "rewrite the data files"
                )
            found[episode] = (chunk, file, start, count, episodes.size)
    return found
