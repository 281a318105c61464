"""A Hub dataset's data and video files read from huggingface_hub's cache where it holds every one to read.

Opening a Hub dataset downloads ``meta/`` only, into the snapshot folder of its commit
(``.../datasets--user--name/snapshots/<commit>/``), and streams ``data/`` and ``videos/`` from the Hub at that commit.
Whoever ran ``hf download --repo-type dataset user/name`` (or ``snapshot_download`` without ``allow_patterns``) has
them in that same folder, and expects training with ``HF_HUB_OFFLINE`` set to work, as LeRobot's does. The folder's
files are the commit's, as the streamed bytes are, so where it holds every file the episodes to read name they are
read from it, online too: no request, and no second copy in the prefetch cache.

It is decided at open, a ``stat`` per file named (5 us each on local disk; links to the cache's blobs followed, so a
link whose blob is gone counts as absent), never per read. Online, where the first is absent (only ``meta/`` was
downloaded: one ``stat``), or any is, every read stays on the Hub: a dataset is read through one filesystem.
Offline, the open is refused naming the files absent and the command that fetches them (and a commit of which the
cache holds ``data/``, where the branch has moved on since it was downloaded).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from .dataset_info import DatasetInfo
from .dataset_location import DatasetLocation, HubSnapshot
from .episode_data_files import episode_data_path, video_file_path
from .episode_table import EpisodeTable
from .errors import DatasetNotFoundError
from .said_once import say_once

__all__ = ["bulk_files_named", "read_bulk_from_cache"]

logger = logging.getLogger(__name__)


def bulk_files_named(
    info: DatasetInfo, table: EpisodeTable, cameras: Sequence[str], episodes: Sequence[int] | None
) -> Iterator[str]:
    """The data files, then the videos of ``cameras``, that the ``episodes`` to read (by ``episode_index``; all: None)
    name, relative to the dataset's root, each once. Lazy: a look that ends at the first absent one names no more."""
    chosen = np.arange(len(table)) if episodes is None else np.flatnonzero(np.isin(table.episode_index, episodes))
    data = (episode_data_path(info, table, int(pos)) for pos in chosen)
    videos = (video_file_path(info, table.cameras[camera], int(pos), camera) for camera in cameras for pos in chosen)
    seen: set[str] = set()
    for relative in itertools.chain(data, videos):
        if relative not in seen:
            seen.add(relative)
            yield relative


def read_bulk_from_cache(location: DatasetLocation, named: Iterable[str]) -> DatasetLocation:
    """``location`` with its bulk files read from its Hub snapshot folder where that holds every one of ``named``;
    else ``location`` as it is, but with ``HF_HUB_OFFLINE`` set DatasetNotFoundError saying which are absent and how
    to fetch them (a location whose bulk files are on the Hub with no snapshot folder: that it cannot be read)."""
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    snapshot = location.hub_snapshot
    if snapshot is None:
        if offline and _on_hub(location):
            raise DatasetNotFoundError(
                f"{location.description}: HF_HUB_OFFLINE is set, and its data/ and videos/ are read from the Hub as it "
                "trains: unset HF_HUB_OFFLINE, or give data_files_root= a local copy of its data/ and videos/"
            )
        return location
    total, absent = _absent_files(snapshot.folder, named, whole_count=offline)
    if absent and offline:
        raise _absent_offline(location, snapshot, total, absent)
    if absent:
        if total > len(absent):  # (a download cut short, or of some files: worth a word)
            say_once(logger, logging.INFO,
                "%s: huggingface_hub's cache holds %d of the %d data and video files its episodes to read name "
                "(%s absent): all are read from the Hub; `%s` fetches the rest, read from disk after",
                location.description, total - len(absent), total, absent[0], _download_command(snapshot),
            )  # fmt: skip
        return location
    say_once(logger, logging.INFO, "%s: its %d data and video files to read are in huggingface_hub's cache: read "
             "from %s", location.description, total, snapshot.folder)  # fmt: skip
    return replace(location, fs=LocalFileSystem(), root=snapshot.folder)


def _absent_files(folder: str, named: Iterable[str], *, whole_count: bool) -> tuple[int, list[str]]:
    """How many of ``named`` were looked for under ``folder``, and those absent. Unless ``whole_count``, the look
    ends at the first absent file where none was found before it (the folder holds ``meta/`` only)."""
    total, absent = 0, []
    for relative in named:
        total += 1
        if not os.path.isfile(os.path.join(folder, relative)):
            absent.append(relative)
            if not whole_count and total == 1:
                break
    return total, absent


def _absent_offline(
    location: DatasetLocation, snapshot: HubSnapshot, total: int, absent: list[str]
) -> DatasetNotFoundError:
    from huggingface_hub import constants

    held = "none" if len(absent) == total else f"{total - len(absent)}"
    few = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
    lerobot_home = os.environ.get("HF_LEROBOT_HOME") or os.path.join(constants.HF_HOME, "lerobot")
    lerobot_home = os.path.expanduser(lerobot_home)  # (as LeRobot reads it)
    lerobot_copy = os.path.join(lerobot_home, snapshot.repo_id)
    has_copy = os.path.isfile(os.path.join(lerobot_copy, "meta", "info.json"))
    older = _commits_with_data(snapshot)
    then = f"; or read commit {older[0]} as it was, whose data/ is in the cache: revision={older[0]!r}" if older else ""
    return DatasetNotFoundError(
        f"{location.description}: HF_HUB_OFFLINE is set, and huggingface_hub's cache holds {held} of the {total} data "
        f"and video files its episodes to read name, at commit {snapshot.commit} (absent: {few}): fetch them, "
        f"online, with `{_download_command(snapshot)}`; or unset HF_HUB_OFFLINE to read them from the Hub, pass a "
        f"local copy of the dataset{f' (LeRobot has one: {lerobot_copy!r})' if has_copy else ''}, or give "
        f"data_files_root= a copy of its data/ and videos/{then}"
    )


def _commits_with_data(snapshot: HubSnapshot) -> list[str]:
    """The other commits of the dataset whose snapshot folders hold its ``data/`` (newest first): downloaded
    before the branch read moved on, they read offline at that commit."""
    folder = snapshot.folder
    while os.path.basename(folder) != snapshot.commit:
        folder = os.path.dirname(folder)
    snapshots = os.path.dirname(folder)
    found = [
        os.path.join(snapshots, commit)
        for commit in os.listdir(snapshots)
        if commit != snapshot.commit and os.path.isdir(os.path.join(snapshots, commit, snapshot.subfolder, "data"))
    ]
    return [os.path.basename(path) for path in sorted(found, key=os.path.getmtime, reverse=True)]


def _download_command(snapshot: HubSnapshot) -> str:
    """The command that puts the dataset's files in ``snapshot``'s folder (those already there are kept)."""
    only = f" --include '{snapshot.subfolder}*'" if snapshot.subfolder else ""
    return f"{_cli()} download {snapshot.repo_id} --repo-type dataset --revision {snapshot.commit}{only}"


def _cli() -> str:
    """huggingface_hub's command as installed: ``hf`` from 0.34, ``huggingface-cli`` before (0.24 is taken)."""
    import huggingface_hub

    major, minor = (int(part) for part in re.findall(r"\d+", huggingface_hub.__version__)[:2])
    return "hf" if (major, minor) >= (0, 34) else "huggingface-cli"


def _on_hub(location: DatasetLocation) -> bool:
    protocol = location.fs.protocol
    return "hf" in ((protocol,) if isinstance(protocol, str) else protocol)
