"""Several datasets of one layout read as one dataset (:func:`concat_datasets`), as LeRobot's
``MultiLeRobotDataset`` reads them: one iterator, one pipeline, one pool of worker processes.

:class:`~lerobot_dali.mixture.DALILeRobotMixture` gives each dataset an iterator of its own (a pipeline, at least
one worker, a share of every batch), which suits a few datasets that differ (fps, codecs, options per dataset).
Tens or hundreds of datasets need one pipeline. The union puts their episodes one dataset after another; the
iterator samples, deals to ranks and pools them as one dataset's, so samples come in proportion to frames, and
every batch carries ``dataset_index``. Rows keep each dataset's own ``index`` and ``episode_index``; ``task_index``
is the union's (each dataset's tasks in turn: one index, one task string, across datasets). A dataset's keys may
be read under other names (LeRobot's ``rename_map``), so datasets recorded with other camera names join.

They must share a layout, which one pipeline and one batch tensor per key need: the fps (windows count frames),
each camera stored one way (video or images) with one size (checked on each dataset's first file or image; every
other is held to the union's first by the workers, as within one dataset; a camera whose datasets' first files differ
in codec is decoded by the workers, a decoder per file) and, for depth, one set of
depth parameters; each feature's dtype and shape. Statistics are pooled as LeRobot pools them. The datasets may
be on different filesystems (local folders, the Hub, HTTP servers, S3..., each remote one with its own storage
options): each file is read through its own dataset's (:class:`MemberFileSystems`), a local one by path (decoded
from disk, never copied into the prefetch cache), remote ones' ranges through one prefetch cache, each stamped by
its own dataset's listing.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from .concurrent_calls import in_threads
from .dataset_info import Feature
from .dataset_location import DatasetLocation
from .dataset_reader import (
    LeRobotDatasetReader,
    LocatedDataset,
    VideoRef,
    data_files_kept,
    locate_dataset,
    open_dataset,
    open_located,
)
from .dataset_stats import POOLED_STATS, FeatureStats, aggregate_episode_stats
from .episode_data_files import open_stamped
from .episode_rows import DecodedGroups, ParquetCache
from .episode_table import EpisodeTable
from .errors import DatasetError, EpisodeMetadataError, ResumeStateError, SchemaMismatchError, StatsError
from .file_stamps import FileStamp, FileStamps, client_of
from .frame_lookup import ITERATORS_LOOKUP, FrameLookup, TimestampSource, TimestampSourceName
from .image_frames import first_image_shape
from .key_rename import KeyRename, check_rename_map, own_cameras, shared_selection, without_cameras_left_out
from .packet_index_cache import load_episode_packet_index
from .packet_index_store import PacketIndexStore
from .remote_retry import RetryingFileSystem
from .said_once import say_once, warn_once
from .stream_state import DATASET_DESCRIPTIONS

__all__ = [
    "DATASET_INDEX",
    "DatasetUnion",
    "MemberFileSystems",
    "concat_datasets",
    "dataset_contents",
    "dataset_identities",
    "datasets_held",
    "datasets_within",
    "refuse_another_order",
    "warn_of_other_contents",
]

logger = logging.getLogger(__name__)

#: The key of each sample's dataset (its position in the union), as in LeRobot's ``MultiLeRobotDataset``.
DATASET_INDEX = "dataset_index"

#: The key of a stream state holding its datasets' :func:`dataset_identities` (beside ``dataset_contents``).
DATASET_IDENTITIES = "dataset_identities"
#: One of several datasets read together: its path or URL, or a reader from ``open_dataset``.
Dataset = str | os.PathLike[str] | LeRobotDatasetReader


def open_all(
    datasets: Sequence[Dataset],
    opener: Callable[[LocatedDataset, Sequence[str] | None], LeRobotDatasetReader] | None = None,
    *,
    cameras: Sequence[str] | None = None,
    rename_maps: Sequence[Mapping[str, str] | None] | None = None,
    revision: str | None = None,
) -> list[LeRobotDatasetReader]:
    """Each of ``datasets`` (a list, :func:`dataset_list`) opened, several at once. ``cameras`` (the batches' names;
    None: every camera each declares): each dataset given by path or URL is opened with only its own keys for them,
    mapped back through its ``rename_maps`` entry (one ``{own key: batch key}`` or None per dataset) by
    :func:`~.key_rename.own_cameras`, so that a camera it declares but never recorded is not looked for; one given
    opened is as opened (:func:`opened`). Each is located once (:func:`~.dataset_reader.locate_dataset`: ``revision``
    resolved, info.json read), and its cameras chosen and its open made there: one commit of a Hub branch, one
    request for info.json. ``opener(located, its own cameras)`` opens one (default
    :func:`~.dataset_reader.open_located`)."""
    datasets = dataset_list(datasets)
    maps = _one_each("rename_maps", rename_maps, len(datasets))
    for dataset, rename_map in zip(datasets, maps, strict=True):  # (a malformed map: refused before any file is read)
        if rename_map is not None:
            check_rename_map(rename_map, _described(dataset))

    def open_one(dataset: Dataset, rename_map: Mapping[str, str] | None) -> LeRobotDatasetReader:
        if isinstance(dataset, LeRobotDatasetReader):
            return opened(dataset)
        located = locate_dataset(dataset, revision=revision)
        own = own_cameras(located, cameras, rename_map)
        return opener(located, own) if opener is not None else open_located(located, cameras=own)

    return in_threads(
        lambda each: open_one(*each), list(zip(datasets, maps, strict=True)), progress="lerobot-dali: opening datasets"
    )


def _described(dataset: Dataset) -> str:
    """How errors name ``dataset`` before it is opened: its location, or its path or URL as given."""
    return dataset.location.description if isinstance(dataset, LeRobotDatasetReader) else str(dataset)


def dataset_list(datasets: Sequence[Dataset]) -> list[Dataset]:
    """``datasets`` as a list, refusing one dataset given alone (a string is a sequence too) or none."""
    if isinstance(datasets, str | os.PathLike | LeRobotDatasetReader) or not datasets:
        raise TypeError(f"datasets must be a non-empty list of datasets, got {datasets!r}")
    return list(datasets)


def opened(dataset: Dataset) -> LeRobotDatasetReader:
    """``dataset`` opened, to be read beside others. A union among them is read without its own
    :data:`DATASET_INDEX`: where datasets are read together, that key says which of them a sample came from."""
    if isinstance(dataset, DatasetUnion):
        return dataset.without_dataset_index()
    return dataset if isinstance(dataset, LeRobotDatasetReader) else open_dataset(dataset)


class DatasetUnion(LeRobotDatasetReader):
    """Datasets read as one, episode after episode (build with :func:`concat_datasets`). Each episode is read by its
    own dataset's reader; what the union adds is the order of episodes, the tasks, and ``dataset_index``."""

    def __init__(
        self,
        members: Sequence[LeRobotDatasetReader],
        *,
        renames: Sequence[KeyRename] | None = None,
        task_offsets: Sequence[int] | None = None,
        tasks: dict[int, str] | None = None,
        with_dataset_index: bool = True,
        lookups: Sequence[FrameLookup] | None = None,
    ) -> None:
        """``renames``: each member's keys under the union's names (none by default). ``lookups``: how each
        member's rows find their frames, where not as the iterator says (by default as it says). ``task_offsets`` and
        ``tasks`` default to the members' own tasks one dataset after another (copies whose members carry no task
        texts, the workers', keep the union's). ``with_dataset_index``: rows carry :data:`DATASET_INDEX` (a
        mixture gives its own)."""
        self.members = tuple(members)
        self.with_dataset_index = with_dataset_index
        self.renames = tuple(renames) if renames is not None else (KeyRename(),) * len(self.members)
        self.lookups = tuple(lookups) if lookups is not None else (ITERATORS_LOOKUP,) * len(self.members)
        first, named = self.members[0], self.renames[0]
        #: Position of each member's first episode in the union (and the total at the end).
        self.starts = np.cumsum([0, *(m.num_episodes for m in self.members)])
        if task_offsets is None:
            task_offsets = np.cumsum([0, *(max(m.tasks, default=-1) + 1 for m in self.members)])[:-1].tolist()
        #: Added to each member's ``task_index``.
        self.task_offsets = tuple(int(t) for t in task_offsets)
        if tasks is None:
            tasks = {
                offset + i: text for m, offset in zip(self.members, self.task_offsets, strict=True)
                for i, text in m.tasks.items()
            }  # fmt: skip
        names = ", ".join(m.location.description for m in self.members[:3])
        # (unique to the datasets, since it names the union's prefetch cache folder too)
        every = hashlib.sha256("\n".join(m.location.description for m in self.members).encode()).hexdigest()[:8]
        more = f", ... ({len(self.members)} datasets, {every})" if len(self.members) > 3 else ""
        features = {
            named.batch_name(key): replace(feature, key=named.batch_name(key))
            for key, feature in first.info.features.items()
        }
        if with_dataset_index:
            features[DATASET_INDEX] = Feature(DATASET_INDEX, "int64", (1,))
        info = replace(
            first.info,
            features=features,
            total_episodes=int(self.starts[-1]),
            total_frames=sum(m.num_frames for m in self.members),
            total_tasks=len(tasks),
        )
        stamps = [m.stamps for m in self.members if m.stamps is not None]
        fs = MemberFileSystems.of(self.members)
        super().__init__(
            replace(first.location, fs=fs, description=f"union of {names}{more}"),
            info,
            EpisodeTable.concatenate([_read_cameras(m, r) for m, r in zip(self.members, self.renames, strict=True)]),
            tasks,
            camera_keys=named.batch_names(first.camera_keys),
            tabular_keys=[*named.batch_names(first.tabular_keys), *([DATASET_INDEX] if with_dataset_index else [])],
            image_keys=named.batch_names(first.image_keys),
            stamps=FileStamps.merged(stamps, fs=fs) if stamps else None,
        )
        self.column_store = None  # (each member reads through its own)
        self.holders = MemberRoots.of_members(self.members)
        # Each data file opened through its own dataset's filesystem and stamps (a local one by path, unstamped; a
        # union's through its own datasets').
        openers = tuple(
            m.open_data_file if isinstance(m, DatasetUnion) else partial(open_stamped, m.location, m.stamps)
            for m in self.members
        )
        #: Bulk file ``path`` opened through the dataset that holds it (:func:`_open_in_member`).
        self.open_data_file: Callable[[str], Any] = partial(_open_in_member, self.holders, openers)
        bounds = [m.data_file_bound if isinstance(m, DatasetUnion) else data_files_kept(m.location) for m in members]
        #: The most data files of each dataset's kind kept open (a local one's 128, a remote one's 16; a union's:
        #: its own datasets'): a mixed union kept its remote one's 16 for all, its local files reopened past them.
        self.data_file_bound: Callable[[str], int] = partial(_kept_in_member, self.holders, tuple(bounds))
        kept = max(self.data_file_bound(root) for root in self.holders.roots)
        self._parquet = ParquetCache(self.open_data_file, max_open=kept, bound_of=self.data_file_bound)
        # Subtask strings where every member's subtask_index means the same text (their rows keep their own indices).
        subtask_lists = [m.subtasks for m in self.members]
        if all(s == subtask_lists[0] for s in subtask_lists):
            self.subtasks = subtask_lists[0]
        elif "subtask_index" in self.tabular_keys:  # (else left out of the batches, as said where it was)
            warn_once(
                logger, "%s: its datasets' subtask lists (meta/subtasks.parquet) differ or one has none, so batches "
                "carry each dataset's own subtask_index and no 'subtask' strings", self.location.description,
            )  # fmt: skip
        # One bound on open data files for all, each kind's files within its own: each member's own (128) would let
        # a worker of a union of hundreds of datasets hold tens of thousands open. A nested union's datasets too:
        # they read through their own caches, not the nested union's.
        _share_cache(self.members, self._parquet)

    def content_digest(self) -> str:
        """Its datasets' :meth:`~.dataset_reader.LeRobotDatasetReader.content_digest`, in their order, as one."""
        if self._content is None:
            self._content = hashlib.sha256(" ".join(dataset_contents(self.members)).encode()).hexdigest()[:16]
        return self._content

    def member(self, episode_pos: int) -> tuple[int, int]:
        """(dataset, its episode position) of the union's episode ``episode_pos``."""
        self.check_position(episode_pos)
        d = int(np.searchsorted(self.starts, episode_pos, side="right")) - 1
        return d, int(episode_pos) - int(self.starts[d])

    def filesystem_of(self, path: str) -> fsspec.AbstractFileSystem:
        return self.members[self.holders.of(path)].filesystem_of(path)

    def episode_is_local(self, episode_pos: int) -> bool:
        d, pos = self.member(episode_pos)
        return self.members[d].episode_is_local(pos)

    def holds_local_files(self) -> bool:
        return any(m.holds_local_files() for m in self.members)

    def listed_stamp(self, path: str) -> FileStamp | None:
        return self.members[self.holders.of(path)].listed_stamp(path)  # (a local dataset's file: None)

    def changed_on_server(self, paths: Iterable[str]) -> DatasetError | None:
        by_member: dict[int, list[str]] = {}
        for path in paths:
            by_member.setdefault(self.holders.of(path), []).append(path)
        changes = (self.members[d].changed_on_server(own) for d, own in by_member.items())
        return next((change for change in changes if change is not None), None)

    # -- what each member answers ----------------------------------------------------------------------------
    def read_episode(
        self, episode_pos: int, keys: Sequence[str] | None = None, *, decoded: DecodedGroups | None = None
    ) -> dict[str, np.ndarray]:
        d, pos = self.member(episode_pos)
        rename = self.renames[d]
        own = None if keys is None else rename.own_names(k for k in keys if k != DATASET_INDEX)
        read = self.members[d].read_episode(pos, own, decoded=decoded)
        rows = {rename.batch_name(key): values for key, values in read.items()}
        length = len(rows["frame_index"])
        if "task_index" in rows:
            rows["task_index"] = rows["task_index"] + self.task_offsets[d]
        if self.with_dataset_index:
            rows[DATASET_INDEX] = np.full(length, d, dtype=np.int64)
        return rows

    def read_episode_images(self, episode_pos: int, key: str, *, decoded: DecodedGroups | None = None) -> pa.Array:
        d, pos = self.member(episode_pos)
        return self.members[d].read_episode_images(pos, self.renames[d].own_key(key), decoded=decoded)

    def data_path(self, episode_pos: int) -> str:
        d, pos = self.member(episode_pos)
        return self.members[d].data_path(pos)

    def data_file_stamp(self, episode_pos: int) -> FileStamp | None:
        d, pos = self.member(episode_pos)
        return self.members[d].data_file_stamp(pos)

    def video(self, episode_pos: int, camera: str) -> VideoRef:
        d, pos = self.member(episode_pos)
        return self.members[d].video(pos, self.renames[d].own_key(camera))

    def previous_end_s(self, episode_pos: int, camera: str) -> float | None:
        d, pos = self.member(episode_pos)
        return self.members[d].previous_end_s(pos, self.renames[d].own_key(camera))

    def source_of(self, episode_pos: int) -> str:
        return self.members[self.member(episode_pos)[0]].location.description

    def frame_lookup(self, episode_pos: int) -> FrameLookup:
        return self.lookups[self.member(episode_pos)[0]]

    def undeclared_columns(self, episode_pos: int) -> list[str]:
        d, pos = self.member(episode_pos)
        return self.members[d].undeclared_columns(pos)

    def reads_every_key(self, episode_pos: int) -> bool:
        d, pos = self.member(episode_pos)
        return self.members[d].reads_every_key(pos)

    def unlisted_index_error(
        self, name: str, index: int, episode_index: int, dataset: int | None = None, *, more: int = 0
    ) -> EpisodeMetadataError:
        """The member's error (:meth:`LeRobotDatasetReader.unlisted_index_error`), with the row's own index (a
        union's ``task_index`` is offset by the member's); the union's where rows carry no ``dataset_index``."""
        if dataset is None or not 0 <= dataset < len(self.members):
            return super().unlisted_index_error(name, index, episode_index, more=more)
        own = index - self.task_offsets[dataset] if name == "task" else index
        return self.members[dataset].unlisted_index_error(name, own, episode_index, more=more)

    def _index_list(self, name: str) -> tuple[Mapping[int, str], str]:
        """The union's list, which no one file holds: a row without its ``dataset_index`` is told against it."""
        listed = super()._index_list(name)[0]
        if name == "subtask":
            return listed, "its datasets' meta/subtasks.parquet, the same in each"
        return listed, "its datasets' task lists, numbered one after another"

    def _data_file_of(self, episode_index: int) -> str | None:
        return None  # (every dataset has its own episode 0, 1, ...: the row's dataset_index names its file)

    def first_episodes(self) -> list[int]:
        """Each dataset's first episode, a nested union's datasets' each (numbered as one, its datasets' files after
        its first's were taken for its first's, same chunk and file, and never surveyed)."""
        return [
            int(start) + pos
            for m, start in zip(self.members, self.starts[:-1], strict=True)
            for pos in m.first_episodes()
        ]

    def check_data_columns(self) -> None:
        for member in self.members:
            member.check_data_columns()

    def read_stats(self) -> FeatureStats:
        """The members' statistics pooled as LeRobot pools datasets' (frame-weighted means, pooled variances): each
        member's whole dataset's, whatever its ``episodes=``, as ``MultiLeRobotDataset`` pools ``meta.stats``."""
        stats = [r.batch(m.read_stats()) for m, r in zip(self.members, self.renames, strict=True)]
        for key in sorted({key for part in stats for key in part}):
            lacking = [m.location.description for m, part in zip(self.members, stats, strict=True) if key not in part]
            if lacking:  # (pooled over the others, as LeRobot pools them)
                warn_once(logger, "%s: %s has no statistics in %s; pooled over the other datasets", self, key, lacking)
        try:
            return aggregate_episode_stats(stats, source=self.location.description)
        except DatasetError as e:
            missing = {  # (the error calls a dataset "an episode", naming none)
                m.location.description: sorted({n for entry in part.values() for n in POOLED_STATS if n not in entry})
                for m, part in zip(self.members, stats, strict=True)
            }
            named = {where: names for where, names in missing.items() if names}
            count = any("count" in names for names in named.values())
            add = f"; add what is lacking to the meta/stats.json of {named}" + (
                " (LeRobot before v2.1 wrote no 'count': a total_frames in the dataset's meta/info.json stands for it)"
                if count
                else ""
            )
            raise StatsError(
                f"the union pools its datasets' statistics by frame count, and cannot: {e}{add if named else ''}"
            ) from None

    def rows_stored(self, path: str, group_rows: int, length: int) -> bool:
        holder = next((m for m in self.members if m.stamps is not None and path in m.stamps), None)
        return holder is not None and holder.rows_stored(path, group_rows, length)

    # -- copies ----------------------------------------------------------------------------------------------
    def for_workers(self) -> DatasetUnion:
        members = [m.for_workers() for m in self.members]
        return self._with_members(members, tasks={})

    def select(self, *, cameras: Sequence[str] | None = None, keys: Sequence[str] | None = None) -> DatasetUnion:
        """The union narrowed to ``cameras`` and ``keys``, by the union's names (``dataset_index`` stays)."""
        keys = None if keys is None else [k for k in keys if k != DATASET_INDEX]
        members = [
            m.select(
                cameras=None if cameras is None else r.own_names(cameras),
                keys=None if keys is None else r.own_names(keys),
            )
            for m, r in zip(self.members, self.renames, strict=True)
        ]
        return self._with_members(members)

    def without_dataset_index(self) -> DatasetUnion:
        """This union with no :data:`DATASET_INDEX` in its rows: read beside other datasets (a mixture's), where
        that key says which of them a sample came from."""
        return self._with_members(list(self.members), with_dataset_index=False)

    def with_location(self, location: DatasetLocation) -> DatasetUnion:
        """The union read through ``location``'s filesystem (the prefetch cache in front of the remote ones), which
        every remote member's files are opened through; a local member's are still read from disk by path."""
        members = [
            m if m.location.is_local else m.with_location(replace(m.location, fs=location.fs)) for m in self.members
        ]
        return self._with_members(members)

    def _with_members(
        self,
        members: list[LeRobotDatasetReader],
        *,
        tasks: dict[int, str] | None = None,
        with_dataset_index: bool | None = None,
    ) -> DatasetUnion:
        """This union over ``members`` (copies of its own), with its stamps (:meth:`FileStamps.share`)."""
        union = DatasetUnion(
            members, renames=self.renames, task_offsets=self.task_offsets, tasks=self.tasks if tasks is None else tasks,
            with_dataset_index=self.with_dataset_index if with_dataset_index is None else with_dataset_index,
            lookups=self.lookups,
        )  # fmt: skip
        if isinstance(union.stamps, FileStamps) and isinstance(self.stamps, FileStamps):
            union.stamps.share(self.stamps)
        return union

    def __repr__(self) -> str:
        return f"DatasetUnion({len(self.members)} datasets, episodes={self.num_episodes}, frames={self.num_frames})"


def dataset_contents(readers: Sequence[LeRobotDatasetReader]) -> list[str]:
    """``readers`` (a union's or a mixture's datasets) in their order, each as the digest of what it holds
    (:meth:`~.dataset_reader.LeRobotDatasetReader.content_digest`), for a stream state to refuse the same datasets
    listed in another order: the episodes' indices and lengths, which are all a stream knows, are alike where two
    datasets have one shape. A union among them is each of its datasets (:func:`datasets_within`): its one digest
    changed with the order inside it, so a union within reordered was a dataset the state did not hold, and resumed."""
    return [each.content_digest() for each in _each_dataset(readers)]


def dataset_identities(readers: Sequence[LeRobotDatasetReader]) -> list[str]:
    """:func:`dataset_contents`' datasets, each as the digest of the dataset whatever episodes of it are read
    (:meth:`~.dataset_reader.LeRobotDatasetReader.identity_digest`), for a stream state to refuse a dataset listed at
    another position with another ``episodes=`` selection, whose contents (its episodes read) differ."""
    return [each.identity_digest() for each in _each_dataset(readers)]


def datasets_held(readers: Sequence[LeRobotDatasetReader]) -> dict[str, list[str]]:
    """What a stream state records of the datasets ``readers`` (a union's among them: each of its own) it runs over:
    their :func:`dataset_contents` and :func:`dataset_identities`, and their descriptions (paths, URLs), in the same
    order, for a resume over others to name them (:func:`warn_of_other_contents`)."""
    within = _each_dataset(readers)
    return {
        "dataset_contents": dataset_contents(within),
        DATASET_IDENTITIES: dataset_identities(within),
        DATASET_DESCRIPTIONS: _descriptions(within),
    }


def warn_of_other_contents(saved: Mapping[str, Any], readers: Sequence[LeRobotDatasetReader]) -> None:
    """Warn, in one line naming each dataset as saved and as now, where ``saved`` (a state of :func:`datasets_held`,
    that loaded) ran over datasets of other contents than ``readers``: the episodes' check passed (the same indices and
    lengths), so the position means the same episode and frame indices, but of a dataset whose info.json, episodes'
    tasks or task table changed: edited (a task's text fixed), re-encoded (info.json names the codec) or re-generated
    (another seed), which a resume should continue, or another dataset of the same shape, which it should not. The
    same dataset read from elsewhere (a server, the Hub) has the same contents: no warning. States saved before they
    held contents say nothing; those saved before they held descriptions name the saved dataset by its position."""
    contents = saved.get("dataset_contents")
    if not isinstance(contents, list | tuple):
        return
    readers = _each_dataset(readers)
    now = dataset_contents(readers)
    if list(contents) == now:
        return
    names = saved.get(DATASET_DESCRIPTIONS)
    if not isinstance(names, list | tuple) or len(names) != len(contents):
        names = [f"dataset {i}" for i in range(len(contents))]
    held, reading = zip(names, contents, strict=True), zip(_descriptions(readers), now, strict=True)
    pairs = itertools.zip_longest(held, reading, fillvalue=("none", "-"))
    changed = [f"saved over {a} (contents {x}), now {b} (contents {y})" for (a, x), (b, y) in pairs if x != y]
    warn_once(logger,
        "resuming a stream state over datasets of the same episodes and lengths but other contents (info.json, tasks): "
        "%s; it continues at the same episode and frame indices, read from the dataset as it is now. Expected where "
        "the dataset was edited, re-encoded or re-generated; if it is another dataset, resume over the one saved over "
        "or start without this state",
        "; ".join(changed),
    )  # fmt: skip


def _descriptions(readers: Sequence[LeRobotDatasetReader]) -> list[str]:
    return [reader.location.description for reader in readers]


def _each_dataset(readers: Sequence[LeRobotDatasetReader]) -> list[LeRobotDatasetReader]:
    """``readers``, each union among them as its datasets (:func:`datasets_within`)."""
    return [each for reader in readers for each in datasets_within(reader)]


def refuse_another_order(saved: Mapping[str, Any], readers: Sequence[LeRobotDatasetReader], what: str) -> None:
    """Raise ResumeStateError where ``saved`` (the state holding :func:`dataset_contents`) places a dataset of
    ``readers`` at another position than it holds now: that position would be read as another dataset's.

    Datasets are known by their content, wherever they are read from: reordered and one moved to a server is
    refused as a reorder; moved or renamed in the same order resumes. Two datasets whose metadata is alike (byte-
    identical copies) cannot be told apart, and swapping them changes nothing read. A dataset whose contents the
    state does not hold is refused where its :func:`dataset_identities` (info.json, task table) is another position's,
    not its own (two datasets swapped, their ``episodes=`` selections left in place); else (a new or rewritten
    dataset, one re-encoded, another selection of the same one) it is left to the episodes' check. States saved
    before they held their datasets' contents pass, and those before they held the identities are not checked by them.
    A union among ``readers`` is each of its datasets, counted in the positions with the others."""
    contents = saved.get("dataset_contents")
    if not isinstance(contents, list | tuple):  # (a tuple: as the stream's state takes its lists, from a serializer)
        return
    # (positions count a union's datasets each: said so, or 'dataset 2' of 2 listed reads as none of them)
    within = ", counting each dataset within a union" if any(isinstance(r, DatasetUnion) for r in readers) else ""
    readers = _each_dataset(readers)
    now = dataset_contents(readers)
    identities = saved.get(DATASET_IDENTITIES)
    if not isinstance(identities, list | tuple) or len(identities) != len(contents):
        identities = None
    identities_now = dataset_identities(readers) if identities is not None else []

    def held_at(i: int, d: str) -> list[int]:
        """The positions the state held the dataset now at ``i`` (of contents ``d``) at, none where it held it at
        ``i`` (or held it nowhere): by its contents, else by its identity."""
        if i < len(contents) and contents[i] == d:
            return []
        held = [j for j, saved_as in enumerate(contents) if saved_as == d]
        if held or identities is None:
            return held
        if i < len(identities):
            if identities[i] == identities_now[i]:  # (its own, rewritten or another selection: the episodes' check)
                return []
            return [j for j, saved_as in enumerate(identities) if saved_as == identities_now[i]]
        # Past the end of the saved list (another selection of a dataset, listed after one added): by its identity at
        # a position whose saved dataset is no longer there, so it is named as moved, not left to the episodes' check
        # ('saved over other episodes', naming no dataset).
        return [j for j, saved_as in enumerate(identities) if saved_as == identities_now[i] and contents[j] not in now]

    # (each position it held: a dataset listed twice was named at its first alone, 'was 0' for one saved at 2)
    moved = {i: " or ".join(map(str, held)) for i, d in enumerate(now) if (held := held_at(i, d))}
    if not moved:
        return
    names = _descriptions(readers)
    was = [f"{names[i]} is dataset {i}, was {j}" for i, j in moved.items()]
    # (one added or removed moves the others too: said as such, not as a reorder alone)
    new = [
        f"{names[i]} (dataset {i}) is not one it was saved over"
        for i, d in enumerate(now)
        if d not in contents and i not in moved
    ]
    count = [f"it was saved over {len(contents)} datasets, not {len(now)}"] if len(contents) != len(now) else []
    raise ResumeStateError(
        f"this stream state was saved over "
        f"{f'other datasets than {what}' if new + count else f'{what} with its datasets in another order'}"
        f": each position would be another dataset's sample ({'; '.join(was + new + count)}{within}); list the "
        f"datasets it was saved over, as they were listed then (now: {', '.join(names)})"
    )


def concat_datasets(
    datasets: Sequence[Dataset],
    *,
    cameras: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    rename_maps: Sequence[Mapping[str, str] | None] | None = None,
    timestamp_sources: Sequence[TimestampSource | TimestampSourceName | None] | None = None,
    tolerances_s: Sequence[float | None] | None = None,
) -> DatasetUnion:
    """``datasets`` (paths, or readers from :func:`~.dataset_reader.open_dataset` for per-dataset ``episodes=``)
    read as one, for :class:`~lerobot_dali.iterator.DALILeRobotIterator`. ``rename_maps`` (one ``{own key: union
    key}``, LeRobot's ``rename_map``, or None per dataset) gives keys recorded under other names the names the
    others use. ``cameras`` and ``keys`` (by the union's names) default to those every dataset has (the rest are left
    out with a warning, as LeRobot's ``MultiLeRobotDataset`` does); each dataset given by path is opened with only its
    own keys for ``cameras`` (through its rename_map), so a camera it declares but never recorded is not looked for
    (CameraSelectionError: one it lacks). Raises SchemaMismatchError, naming the datasets, where layouts differ.
    The datasets may be on different filesystems (local folders, the Hub, HTTP servers...): each file is read
    through its own dataset's.

    ``timestamp_sources`` and ``tolerances_s`` (one per dataset, None: the iterator's ``timestamp_source`` and
    ``tolerance_s``) let datasets of different recorders join: e.g. ``[None, "frame_index"]`` for a second dataset
    whose parquet timestamps are wall-clock (LeRobot's ``MultiLeRobotDataset`` takes ``tolerances_s`` per dataset
    too)."""
    rename_maps = _one_each("rename_maps", rename_maps, len(dataset_list(datasets)))
    readers = open_all(datasets, cameras=cameras, rename_maps=rename_maps)  # (each with its own keys for cameras)
    count = len(readers)
    if cameras is not None:  # (entries for declared cameras that cameras= left out rename nothing)
        rename_maps = without_cameras_left_out(rename_maps, readers)
    renames = [KeyRename.checked(m, r, cameras=cameras) for m, r in zip(rename_maps, readers, strict=True)]
    lookups = [
        FrameLookup(source, tolerance) for source, tolerance in zip(
            _one_each("timestamp_sources", timestamp_sources, count), _one_each("tolerances_s", tolerances_s, count),
            strict=True,
        )
    ]  # fmt: skip
    readers = shared_selection(readers, cameras=cameras, keys=keys, renames=renames)
    _check_layouts(readers, renames)
    union = DatasetUnion(readers, renames=renames, lookups=lookups)
    say_once(logger, logging.INFO,
        "union of %d datasets: %d episodes, %d frames, cameras %s", len(readers), union.num_episodes,
        union.num_frames, list(union.all_camera_keys),
    )  # fmt: skip
    for reader, lookup in zip(readers, lookups, strict=True):
        if lookup != ITERATORS_LOOKUP:
            say_once(logger, logging.INFO, "%s: rows find their frames with %s", reader.location.description, lookup)
    return union


def _one_each(name: str, values: Sequence[Any] | None, count: int) -> Sequence[Any]:
    """``values``, one per dataset (None each where not given)."""
    if values is None:
        return [None] * count
    if isinstance(values, str | Mapping) or not isinstance(values, Sequence) or len(values) != count:
        raise TypeError(f"{name} takes one value (or None) per dataset ({count}), got {values!r}")
    return values


def _check_layouts(readers: list[LeRobotDatasetReader], renames: list[KeyRename]) -> None:
    """What one pipeline and one tensor per key need the datasets to share (module docstring), by the union's
    names."""
    named = list(zip(readers, renames, strict=True))

    def differ(what: str, fix: str, values: list[Any]) -> SchemaMismatchError:
        found = {r.location.description: v for r, v in zip(readers, values, strict=True)}
        return SchemaMismatchError(f"the datasets differ in {what} ({found}): {fix}")

    rates = [r.fps for r in readers]
    if len(set(rates)) > 1:
        raise differ("fps", "a union reads one fps; read them side by side with DALILeRobotMixture", rates)
    refuse_dataset_index_feature(readers, renames, "a union's batches")
    first, rename = named[0]
    union_cameras = set(rename.batch_names(first.all_camera_keys))
    for key in rename.batch_names((*first.all_camera_keys, *first.tabular_keys)):
        kinds = [_kind(r.info.features[n.own_key(key)]) for r, n in named]
        if len(set(kinds)) > 1:  # (left out by the selection of the kind it has in the first dataset: the union's)
            raise differ(*_kind_mismatch(key, is_camera=key in union_cameras), kinds)
    firsts: tuple[tuple[Sequence[str], Callable[[LeRobotDatasetReader, str], Any], str, str], ...] = (
        (first.image_keys, _first_image_shape, "the images (H, W, C)", "a camera's images share one size and channels"),
        (first.camera_keys, _first_format, "the video", "a camera's videos share one size: re-encode"),
    )
    for cameras, first_of, what, fix in firsts:  # (what the workers hold every file or image of a camera to)
        for camera in rename.batch_names(cameras):
            found = in_threads(partial(_first_of_member, first_of, camera), named)
            if len({f for f in found if f is not None}) > 1:
                raise differ(f"{what} of camera {camera!r}", f"{fix}, or leave it out with cameras=[...]", found)


def refuse_dataset_index_feature(
    readers: Sequence[LeRobotDatasetReader], renames: Sequence[KeyRename], whose: str
) -> None:
    """A feature the datasets read (after their selection) under :data:`DATASET_INDEX`, the key ``whose`` batches
    carry each sample's dataset in, would clash with it: refused."""
    if any(DATASET_INDEX in rename.batch_names(r.tabular_keys) for r, rename in zip(readers, renames, strict=True)):
        raise SchemaMismatchError(
            f"a dataset has a feature {DATASET_INDEX!r}, the key {whose} give each sample's dataset position in; "
            "leave it out with keys=[...]"
        )


def _first_of_member(
    first_of: Callable[[LeRobotDatasetReader, str], Any], camera: str, member: tuple[LeRobotDatasetReader, KeyRename]
) -> Any:
    reader, rename = member
    return first_of(reader, rename.own_key(camera))


def _read_cameras(member: LeRobotDatasetReader, rename: KeyRename) -> EpisodeTable:
    """``member``'s episode table with the files of the cameras it reads only (a narrowed reader's table still
    holds every camera's), under the union's names."""
    episodes = member.episodes
    cameras = {rename.batch_name(k): files for k, files in episodes.cameras.items() if k in member.camera_keys}
    return replace(episodes, cameras=cameras)


def _kind_mismatch(key: str, *, is_camera: bool) -> tuple[str, str]:
    """What :func:`_kind` found to differ for ``key`` (a camera of the union's, or a tabular key), and how to leave it
    out: a camera by ``cameras=``, a tabular key by ``keys=``, which select one kind each."""
    if is_camera:
        return (
            f"{key!r} (a camera's dtype, depth map, depth quantizer and depth unit)",
            "a camera batches as one tensor, so it must be stored alike in every dataset; leave it out with "
            "cameras=[...] listing the other cameras to read (keys= selects tabular keys, not cameras)",
        )
    return (
        f"{key!r} (a tabular key's dtype and shape)",
        f"a key batches as one tensor, so every dataset must declare it with one dtype and shape; leave it out with "
        f"keys=[...] listing the other tabular keys to read (cameras= selects cameras, not {key!r}), or write "
        "the datasets' values in one dtype and shape",
    )


def _kind(feature: Feature) -> tuple[Any, ...]:
    """What must agree across datasets for a key to batch as one tensor: video or image, colour or depth (with
    the parameters its depth is read with, which the union takes from its first dataset), and a feature's dtype
    and shape (a camera's size is its files', checked apart)."""
    if feature.is_camera:
        quantizer = feature.video.depth if feature.video is not None else None
        return (feature.dtype, feature.is_depth_map, quantizer, feature.depth_unit)
    return (feature.dtype, () if feature.is_scalar else tuple(feature.shape))


class MemberRoots:
    """Which of a union's datasets holds a path: the one whose root (a local folder's absolute path, a remote one's
    URL or path on its filesystem; a union's: each of its datasets') it is under, the longest such root; else the
    first. ``owners``: the dataset of each root (default: one root each, in order)."""

    def __init__(self, roots: Sequence[str], owners: Sequence[int] | None = None) -> None:
        self.roots = [root.rstrip("/") + "/" for root in roots]
        self.owners = list(range(len(self.roots)) if owners is None else owners)
        self._longest_first = sorted(range(len(self.roots)), key=lambda i: -len(self.roots[i]))

    @classmethod
    def of_members(cls, members: Sequence[LeRobotDatasetReader]) -> MemberRoots:
        """The roots of ``members``, a union among them by each of its datasets' roots: its first's alone sent the
        paths of its others to the first dataset of all (a local folder's filesystem asked for an HTTP URL)."""
        held = [(root, d) for d, m in enumerate(members) for root in _roots_of(m)]
        return cls([root for root, _ in held], [d for _, d in held])

    def of(self, path: str) -> int:
        return next((self.owners[i] for i in self._longest_first if str(path).startswith(self.roots[i])), 0)


def datasets_within(reader: LeRobotDatasetReader) -> list[LeRobotDatasetReader]:
    """``reader``, or each dataset of a union (a nested union's: each of its own), in order."""
    if isinstance(reader, DatasetUnion):
        return [each for member in reader.members for each in datasets_within(member)]
    return [reader]


def _roots_of(reader: LeRobotDatasetReader) -> list[str]:
    """The roots that ``reader``'s bulk files are under: a union's datasets' each."""
    return [each.location.root for each in datasets_within(reader)]


def _share_cache(readers: Sequence[LeRobotDatasetReader], cache: ParquetCache) -> None:
    """``readers`` (a union's datasets) and, where one is a union, its own datasets read through ``cache``."""
    for reader in readers:
        reader._parquet = cache
        if isinstance(reader, DatasetUnion):
            _share_cache(reader.members, cache)


def _kept_in_member(holders: MemberRoots, kept: Sequence[int | Callable[[str], int]], path: str) -> int:
    """The most data files of the kind of the dataset holding ``path`` kept open (a union's: its own dataset's)."""
    bound = kept[holders.of(path)]
    return bound if isinstance(bound, int) else bound(path)


def _open_in_member(holders: MemberRoots, openers: Sequence[Callable[[str], Any]], path: str) -> Any:
    """Bulk file ``path`` opened by the opener of the dataset that holds it (a dataset's:
    :func:`~.episode_data_files.open_stamped`, through its filesystem with its stamp's size; a union's: its own)."""
    return openers[holders.of(path)](path)


class MemberFileSystems(fsspec.AbstractFileSystem):
    """The filesystems of a union's datasets as one: each path read through the filesystem of the dataset that holds
    it (:class:`MemberRoots`), for a union whose datasets are on different filesystems (a local folder and an HTTP
    server or the Hub) or remote with other storage options (another token or headers, a query-string token, another
    endpoint): read through the first's, every file went with its options to the other datasets' servers (HTTP
    401/403, or another server's files)."""

    cachable = False

    def __init__(self, roots: Sequence[tuple[str, fsspec.AbstractFileSystem]]) -> None:
        super().__init__(tuple(roots))
        self.roots = list(roots)
        self.holders = MemberRoots([root for root, _ in roots])
        self.first = roots[0][1]
        self.protocol = self.first.protocol

    @staticmethod
    def of(members: Sequence[LeRobotDatasetReader]) -> fsspec.AbstractFileSystem:
        """The first member's filesystem where every member's reads through one client (the same options) or every
        member is local (fsspec keeps a LocalFileSystem per thread, and datasets open in threads of their own: routed,
        local folders read as a remote union), else one that routes each path to its member's."""
        clients = {id(client_of(m.location.fs)) for m in members}
        if len(clients) <= 1 or all(m.location.is_local for m in members):
            return members[0].location.fs
        return MemberFileSystems([(root, m.location.fs) for m in members for root in _roots_of(m)])

    def pin(self, stamps: Mapping[str, Any]) -> None:
        """The union's stamps pinned on each dataset's filesystem (:meth:`RetryingFileSystem.pin`; a union's within
        it: on each of its datasets'): a file first looked up through them is stamped there, not in its dataset's own
        (pinned on a nested union's datasets too: read through the prefetch cache, which stamps through the union
        given it, a file replaced on the server was read as the new file)."""
        for fs in {id(fs): fs for _, fs in self.roots}.values():
            if isinstance(fs, (RetryingFileSystem, MemberFileSystems)):
                fs.pin(stamps)

    def route(self, path: str) -> fsspec.AbstractFileSystem:
        return self.roots[self.holders.of(path)][1]

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return path

    def __repr__(self) -> str:
        return f"MemberFileSystems({[root for root, _ in self.roots]})"

    def unstrip_protocol(self, name: str) -> str:
        return str(self.route(name).unstrip_protocol(name))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self.route(path).open(path, mode, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> Any:
        return self.route(path).cat_file(path, start=start, end=end, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.route(path).info(path, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self.route(path).exists(path, **kwargs))

    def glob(self, path: str, **kwargs: Any) -> Any:
        return self.route(path).glob(path, **kwargs)

    def find(self, path: str, **kwargs: Any) -> Any:
        return self.route(path).find(path, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.route(path).ls(path, detail=detail, **kwargs)

    def size(self, path: str) -> Any:
        return self.route(path).size(path)

    def isfile(self, path: str) -> bool:
        return bool(self.route(path).isfile(path))

    def isdir(self, path: str) -> bool:
        return bool(self.route(path).isdir(path))

    def ukey(self, path: str) -> Any:
        return self.route(path).ukey(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        for fs in {id(fs): fs for _, fs in self.roots}.values() if path is None else [self.route(path)]:
            fs.invalidate_cache(path)


def _first_format(reader: LeRobotDatasetReader, camera: str) -> str | None:
    """Size of the camera's first file (what the workers hold every file of a camera to; the codec too where DALI
    decodes the camera, but the iterator sends a camera whose datasets' first files differ in codec to the workers)."""
    if not reader.num_episodes:
        return None
    _, index = load_episode_packet_index(reader, 0, camera, store=PacketIndexStore())  # (the iterator finds it there)
    return f"{index.height}x{index.width} (HxW)"


def _first_image_shape(reader: LeRobotDatasetReader, camera: str) -> tuple[int, ...] | None:
    """(H, W, C) of the camera's first image (what the workers hold every image of a camera to)."""
    return first_image_shape(reader, 0, camera) if reader.num_episodes else None
