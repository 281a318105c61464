"""Every episode read as a training run reads it, before the run (``lerobot-dali check``).

The iterator checks the first episode when it is built; a worker raises on any other bad episode only when a
batch reaches it, maybe hours into a run on many nodes, and a run stops at the first. :func:`check_dataset`
reads every episode's rows as the workers do (schema, metadata, timestamps, task indices), looks every row
up in every video camera's file (packet index only: codec and size against the camera's first file, the
frame within ``tolerance_s`` and inside the episode's part of the file), reads every image camera's images,
and with ``decode=True`` decodes every frame the rows read (damage FFmpeg flags; each GOP entered at its
keyframe, as a shuffled run enters it) and every image. It lists every problem at once, each as the run would
have raised it. Episodes are checked in worker processes, those sharing a data file together, from one decode of
the file's row groups (:class:`~.episode_rows.DecodedGroups`). Each video file's packet index is kept on disk with
the file's stamp (:mod:`.packet_index_store`), as the iterator keeps it: a second check, or a run after a check,
demuxes only the files changed since (15,000 episodes of three cameras checked again: 16 s of CPU, not 50). Likewise
``decode=True`` keeps which frames of each local file decoded without a fault (:mod:`.verified_decode_store`): a check
again decodes only the files changed since, and the frames it had not decoded (``redecode=True``: all again); the
images stored in local data files alike.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .batch_source import CameraFormat
from .camera_codecs import survey_camera, surveyed_positions
from .cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from .dataset_reader import NO_SUBTASK_INDEX, LeRobotDatasetReader, VideoRef, warn_undeclared_columns
from .dataset_stats import read_dataset_stats, stats_faults
from .dataset_union import datasets_within
from .decode_route import DecodeRoute, route_without_nvdec
from .distributed import usable_cpus
from .episode_rows import DecodedGroups
from .errors import DataFileError, DatasetError, EpisodeMetadataError, SchemaMismatchError, VideoDecodeError
from .file_format_store import FileFormatStore
from .file_stamps import FileStamp
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource, TimestampSourceName, row_frame_numbers
from .image_frames import decode_depth_images, decode_images, first_image_shape, image_label
from .packet_index import PacketIndex
from .packet_index_cache import PacketIndexCache
from .packet_index_store import PacketIndexStore
from .said_once import warn_once
from .value_checks import check_choice, check_int, check_seconds
from .verified_decode_store import (
    PendingVerdicts,
    Verdict,
    VerifiedDecodeStore,
    local_image_verdict,
    local_verdict,
)
from .video_probe import describe_index
from .video_source import local_video_path
from .worker_source import SourceFile
from .worker_start import log_like_trainer, names_main, package_log_level, skipping_main

__all__ = ["CheckReport", "Problem", "check_dataset", "default_workers"]

logger = logging.getLogger(__name__)

#: Most episodes one task checks: episodes of one data file go together, so each process reads it once, but
#: small datasets are cut finer, so that every worker gets some (about 4 tasks each).
_TASK_EPISODES = 64


@dataclass(frozen=True)
class Problem:
    """One episode's failure, as the training run would have raised it."""

    #: The dataset the episode is in (a union's: the one it came from).
    dataset: str
    episode_index: int
    #: The camera whose video or images failed; None: the episode's rows.
    camera: str | None
    #: The exception's type, e.g. ``"FrameTimestampError"``.
    error: str
    message: str


@dataclass
class CheckReport:
    """What :func:`check_dataset` read and what failed."""

    source: str
    episodes: int = 0
    rows: int = 0
    #: Distinct video files whose packet index was read.
    video_files: int = 0
    #: Distinct frames decoded (``decode=True``): video frames and images.
    frames_decoded: int = 0
    #: Video frames and images not decoded (``decode=True``) since an earlier check decoded them, of the files
    #: unchanged since.
    frames_verified_before: int = 0
    #: Video files none of whose frames were decoded (``decode=True``), an earlier check having decoded them all.
    video_files_verified_before: int = 0
    #: The problems found, in episode order; past ``max_problems`` only counted (in ``problem_kinds``).
    problems: list[Problem] = field(default_factory=list)
    #: How many problems of each kind, ``"<error> in <camera or 'rows'>"``, most common first.
    problem_kinds: dict[str, int] = field(default_factory=dict)
    #: How long :func:`check_dataset` took, given the dataset opened.
    seconds: float = 0.0
    #: How long opening the dataset took before (info.json, the episode tables, v2.1's data files' footers): its
    #: opener's to say (``lerobot-dali check`` does); 0 where none did.
    opening_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problem_kinds

    @property
    def problem_count(self) -> int:
        return sum(self.problem_kinds.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problem_count": self.problem_count}

    def add_problems(self, problems: Sequence[Problem]) -> None:
        """``problems`` found besides the episodes' check (a camera with no files, at the open) listed and counted
        as its own are."""
        kinds = Counter(self.problem_kinds)
        kinds.update(map(_kind, problems))
        self.problem_kinds = dict(kinds.most_common())
        self.problems = sorted([*self.problems, *problems], key=_listed_order)


def _kind(problem: Problem) -> str:
    """What :attr:`CheckReport.problem_kinds` counts ``problem`` as."""
    return f"{problem.error} in {problem.camera or 'rows'}"


def _listed_order(problem: Problem) -> tuple[str, int, str]:
    """Where ``problem`` is listed: by dataset, episode, then camera (the rows' first)."""
    return problem.dataset, problem.episode_index, problem.camera or ""


@dataclass
class _Decodes:
    """What one task's decodes did (``decode=True``), besides the frames they decoded."""

    #: Frames and images not decoded, an earlier check having decoded them from the file as it is now.
    frames_verified_before: int = 0
    #: Video files some of whose frames were decoded; those some of whose frames were not, as verified before.
    files_decoded: set[str] = field(default_factory=set)
    files_verified_before: set[str] = field(default_factory=set)
    #: (dataset, verdict) of each local file's frames or images that decoded without a fault, to keep.
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)


@dataclass(frozen=True)
class _Tally:
    """One task's part of the report."""

    episodes: int
    rows: int
    video_files: frozenset[str]
    frames_decoded: int
    problems: tuple[Problem, ...]
    decodes: _Decodes


class _DecodeDue(Exception):
    """A frame or image to decode, met by a check told to decode none (:meth:`_EpisodeChecker.check`)."""


@dataclass
class _EpisodeChecker:
    """Checks episodes in one process; sent to each worker once (the reader pickles small)."""

    reader: LeRobotDatasetReader
    timestamp_source: TimestampSource
    tolerance_s: float
    decode: bool
    #: Every camera's first file's format (:class:`~.batch_source.CameraFormat`), which the workers hold its other
    #: files to.
    formats: dict[str, CameraFormat]
    #: (H, W, C) of each image camera's first image (``decode=True``), which its other images must have.
    image_shapes: dict[str, tuple[int, ...]]
    task_indices: frozenset[int]
    #: The subtask list's indices and -1 (no subtask), where batches carry subtask texts; None where they carry none.
    subtask_indices: frozenset[int] | None
    #: Where the indexes of the files read are kept and found: a file changed since it was indexed (another stamp:
    #: size, version; a local file's inode, mtime and ctime) misses, and is read again.
    index_store: PacketIndexStore
    #: Cameras every run sends to the workers: depth maps, and a union's whose datasets' first files differ in codec.
    workers_only: set[str] = field(default_factory=set)
    #: Passes of earlier checks (``decode=True``, local files): frames or images of a file at a stamp not decoded
    #: again.
    verified: frozenset[Verdict] = frozenset()
    _indexes: PacketIndexCache = field(default_factory=lambda: _index_cache())
    _decoder: CpuFrameDecoder = field(
        default_factory=lambda: CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_indexes": None}  # (its lock does not pickle; each process builds its own)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _indexes=_index_cache())

    def close(self) -> None:
        """Close this process's open video files."""
        self._decoder.close()

    def check(self, positions: Sequence[int], *, decodes_here: bool = True) -> _Tally:
        """Check episodes ``positions`` (of one data file, :func:`_tasks`: its row groups decoded once for all).
        ``decodes_here=False``: raise :class:`_DecodeDue` instead of decoding any frame or image (``decode=True``),
        as :func:`_tallies` leaves decoding to workers it starts only then."""
        rows_read, files, decoded, problems = 0, set(), 0, []
        done = _Decodes()
        groups = DecodedGroups()
        for pos in positions:
            episode_index = int(self.reader.episodes.episode_index[pos])
            try:
                rows = self.reader.read_episode(pos, decoded=groups)
            except Exception as e:  # (the run would have stopped on it: list it, go on)
                problems.append(self._problem(pos, episode_index, None, e))
                index_rows = self._index_rows(pos, groups)
                if index_rows is None:
                    continue
                rows = index_rows
            try:
                self._check_tasks(pos, rows, episode_index)
            except EpisodeMetadataError as e:
                problems.append(self._problem(pos, episode_index, None, e))
            rows_read += len(rows["frame_index"])
            for camera in self.reader.camera_keys:
                try:
                    video, index = self.packet_index(pos, camera)
                    files.add(video.path)
                    frames = self._check_video(pos, camera, rows, video, index)
                    if self.decode and frames.size:
                        decoded += self._decode_video(pos, video, index, frames, done, here=decodes_here)
                except _DecodeDue:
                    raise
                except Exception as e:
                    problems.append(self._problem(pos, episode_index, camera, e))
            for camera in self.reader.image_keys:
                try:
                    length = len(rows["frame_index"])
                    decoded += self._check_images(pos, camera, length, groups, done, here=decodes_here)
                except _DecodeDue:
                    raise
                except Exception as e:
                    problems.append(self._problem(pos, episode_index, camera, e))
        return _Tally(len(positions), rows_read, frozenset(files), decoded, tuple(problems), done)

    def _index_rows(self, pos: int, groups: DecodedGroups) -> dict[str, np.ndarray] | None:
        """Episode ``pos``'s index columns alone (timestamp, frame_index, ...), where its rows failed to read: a bad
        tabular column (a shape info.json misstates, say) leaves the frame lookups to check, which need only these,
        so one check lists both (they showed only once the column was left out). None where these fail too."""
        try:
            return self.reader.read_episode(pos, keys=[], decoded=groups)
        except Exception as e:  # (the same fault, most likely: listed already)
            logger.debug("episode position %d: its index columns do not read either: %s", pos, e)
            return None

    def _check_tasks(self, pos: int, rows: dict[str, np.ndarray], episode_index: int) -> None:
        """Raise where episode ``pos``'s rows hold a ``task_index`` the task list lacks, or a ``subtask_index`` the
        subtask list does (where batches carry its texts): a batch of them fails. (An index a list holds out of
        order, which LeRobot reads another row for, is refused as the rows are read.)"""
        lists = (
            ("task", self.task_indices, "meta/tasks.parquet or meta/tasks.jsonl"),
            ("subtask", self.subtask_indices, "meta/subtasks.parquet"),
        )
        for name, listed, file in lists:
            if listed is None or f"{name}_index" not in rows:
                continue
            unknown = sorted(set(np.unique(rows[f"{name}_index"]).tolist()) - listed)
            if unknown:
                raise EpisodeMetadataError(
                    f"{self.reader.data_path(pos)}: episode {episode_index}'s {name}_index {unknown[:10]} is not in "
                    f"the dataset's {name} list ({file}); the data rows and the {name} list disagree"
                )

    def packet_index(
        self, pos: int, camera: str, *, dataset: LeRobotDatasetReader | None = None
    ) -> tuple[VideoRef, PacketIndex]:
        """Episode ``pos``'s video of ``camera`` and its packet index (``dataset``: of one of a union's datasets)."""
        return self._indexes.of_episode(dataset or self.reader, pos, camera, store=self.index_store)

    def _decode_images(self, pos: int, camera: str, encoded: list[bytes], first_row: int) -> np.ndarray:
        """Episode ``pos``'s images of ``camera`` from its row ``first_row`` on, decoded as the workers decode them."""
        depth = camera in self.reader.info.depth_image_units([camera])
        rows = range(first_row, first_row + len(encoded))
        label = image_label(self.reader, pos, camera)
        return (decode_depth_images if depth else decode_images)(encoded, label=label, rows=rows)

    def _check_video(
        self, pos: int, camera: str, rows: dict[str, np.ndarray], video: VideoRef, index: PacketIndex
    ) -> np.ndarray:
        """The display frames of ``video`` (of ``camera``) that episode ``pos``'s rows read, distinct and sorted."""
        reader = self.reader
        expected = self.formats.get(camera)
        if expected is not None:
            episode = int(reader.episodes.episode_index[pos])
            expected.check(index, path=video.path, episode=episode, camera=camera)
            if index.codec != expected.codec and camera not in self.workers_only:  # (a run on NVDEC would refuse it)
                warn_once(logger,
                    "camera %s mixes codecs (its first file is %s, %s is %s), which the workers decode, as on a "
                    "machine without NVDEC; where NVDEC decodes %s, a run sends the camera there (it reads the codecs "
                    "of a camera's files when built up to a bound, which this camera's count exceeds) and refuses "
                    "such files: pass it decode='cpu', or copy the dataset with one codec (lerobot-dali reencode)",
                    camera, expected.codec, video.path, index.codec, expected.codec,
                    key=f"mixed codecs {camera} {reader.location.description}",
                )  # fmt: skip
        every_row = np.arange(len(rows["frame_index"]))
        numbers = row_frame_numbers(
            reader, pos, camera, rows, every_row, index,
            timestamp_source=self.timestamp_source, tolerance_s=self.tolerance_s, video=video,
        )  # fmt: skip
        return np.unique(numbers)

    def _decode_video(
        self, pos: int, video: VideoRef, index: PacketIndex, frames: np.ndarray, done: _Decodes, *, here: bool
    ) -> int:
        """Frames decoded of ``frames`` of ``video``: none where an earlier check decoded them from the file as it is
        now (a local one), and a pass kept where they decode and the file did not change meanwhile (``here=False``:
        :class:`_DecodeDue` raised instead of decoding)."""
        fs = self.reader.filesystem_of(video.path)
        path = local_video_path(video.path, filesystem=fs)
        before = local_verdict(path, frames)
        if before is not None and before in self.verified:
            done.frames_verified_before += len(frames)
            done.files_verified_before.add(video.path)
            return 0
        if not here:
            raise _DecodeDue
        done.files_decoded.add(video.path)
        decoded = self._decoder.verify(video.path, index, frames, filesystem=fs)
        if before is not None and local_verdict(path, frames) == before:  # (a file rewritten meanwhile: none kept)
            done.verdicts.append((self.reader.source_of(pos), before))
        return decoded

    def _check_images(
        self, pos: int, camera: str, length: int, groups: DecodedGroups, done: _Decodes, *, here: bool
    ) -> int:
        """Images decoded of episode ``pos``'s of ``camera`` (``length``, its rows'): none where an earlier check
        decoded them from the data file as it is now (a local one), and a pass kept where they decode and the file
        did not change meanwhile (``here=False``: :class:`_DecodeDue` raised instead of decoding)."""
        expected = self.image_shapes.get(camera)
        data_path = self.reader.data_path(pos)
        path = local_video_path(data_path, filesystem=self.reader.filesystem_of(data_path))
        first_row = int(self.reader.episodes.data_row_start[pos])
        rows, depth = range(first_row, first_row + length), camera in self.reader.info.depth_image_units([camera])
        # (stamped before the images are read: a file replaced just after their read is another stamp after them)
        before = local_image_verdict(path, camera, rows, depth=depth, shape=expected) if self.decode else None
        images = self.reader.read_episode_images(pos, camera, decoded=groups)
        if len(images) != length:
            raise SchemaMismatchError(f"camera {camera!r} has {len(images)} images for the episode's {length} rows")
        if not self.decode:
            return 0
        if before is not None and before in self.verified:
            done.frames_verified_before += length
            return 0
        if not here:
            raise _DecodeDue
        for start in range(0, length, 64):  # (a few decoded at a time, not the episode's all)
            shape = self._decode_images(pos, camera, images[start : start + 64].to_pylist(), start).shape[1:]
            if expected is not None and shape != expected:
                raise DataFileError(
                    f"{self.reader.data_path(pos)} (camera {camera}): images are {shape} (H, W, C) but the camera's "
                    f"first image is {expected}; a camera's images share one size and channel count"
                )
        # (read from the file it names, too: a data file replaced by a rename is read from the handle kept open)
        now = local_image_verdict(path, camera, rows, depth=depth, shape=expected)
        if before is not None and now == before and self.reader.data_file_stamp(pos) == FileStamp(before[1], before[2]):
            done.verdicts.append((self.reader.source_of(pos), before))
        return length

    def _problem(self, pos: int, episode_index: int, camera: str | None, error: Exception) -> Problem:
        """``error`` as a problem; a remote file's failed decode or parse as its change on the server, where it changed
        since the dataset was opened (one metadata request: a file replaced by one of its size is no damaged file)."""
        if isinstance(error, (VideoDecodeError, DataFileError)):
            videos = self.reader.camera_keys  # (else the rows' or an image camera's: the data file)
            path = self.reader.video(pos, camera).path if camera in videos and camera else self.reader.data_path(pos)
            error = self.reader.changed_on_server([path]) or error
        return Problem(self.reader.source_of(pos), episode_index, camera, type(error).__name__, str(error))


def _index_cache() -> PacketIndexCache:
    return PacketIndexCache(max_bytes=256 * 2**20)


_WORKER_CHECKER: _EpisodeChecker | None = None


def _start_worker(checker_file: bytes, log_level: int) -> None:
    global _WORKER_CHECKER
    log_like_trainer(log_level)
    _WORKER_CHECKER = SourceFile.loads(checker_file)


def _check_in_worker(positions: list[int]) -> _Tally:
    assert _WORKER_CHECKER is not None, "the pool's initializer sets the checker"
    return _WORKER_CHECKER.check(positions)


def check_dataset(
    reader: LeRobotDatasetReader,
    *,
    timestamp_source: TimestampSource | TimestampSourceName = TimestampSource.PARQUET_TIMESTAMP,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    decode: bool = False,
    redecode: bool = False,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    max_problems: int = 10_000,
) -> CheckReport:
    """Check every episode of ``reader`` (its selection of episodes, cameras and keys) as the iterator's workers
    read it, with the same ``timestamp_source`` and ``tolerance_s``, listing every problem.

    ``decode``: every frame the rows read decoded too, but those an earlier check decoded from a local file unchanged
    since (:mod:`.verified_decode_store`); ``redecode``: those too. ``workers`` processes (0: this one; None:
    :func:`default_workers`, those to decode started at the first frame to decode) share the episodes;
    ``progress(n)`` is called as each ``n`` more are done.
    Past ``max_problems`` (a fault every episode shares, in a big dataset) problems are counted, not kept.
    Raises TypeError for a path: open it as the run will (its cameras, keys and episodes) and pass the reader.
    """
    if not isinstance(reader, LeRobotDatasetReader):
        raise TypeError(
            f"check_dataset takes a reader, got {type(reader).__name__} {reader!r}: pass open_dataset({reader!r}) "
            "(with the cameras=, keys= and episodes= the run reads) or concat_datasets([...])"
        )
    started = time.perf_counter()
    # Workers to decode are started at the first frame to decode: none where every frame was decoded by an earlier
    # check (a check again of a dataset unchanged), or where no camera is read; the rest is checked here meanwhile,
    # as without decode (their start took ~2 s of 3 on cr5_v30_av1's 12 episodes, all decoded before).
    when_decoding = workers is None and decode and not default_workers(reader, decode=False)
    workers = default_workers(reader, decode=decode) if workers is None else check_int("workers", workers, minimum=0)
    checker = _EpisodeChecker(
        reader=reader.for_workers(),
        timestamp_source=check_choice(TimestampSource, "timestamp_source", timestamp_source),
        tolerance_s=check_seconds("tolerance_s", tolerance_s),  # (else every episode listed its ValueError)
        decode=bool(decode),
        formats={},
        image_shapes={},
        task_indices=frozenset(int(i) for i in reader.tasks),
        subtask_indices=None if reader.subtasks is None else frozenset([*reader.subtasks, NO_SUBTASK_INDEX]),
        # Local files' indexes too, keyed by their stat (as the iterator keeps them): a check again, or a run after
        # it, loads each unchanged file's index instead of demuxing it (15,000 episodes: 450 files, ~0.1 s each).
        index_store=PacketIndexStore(),
    )
    verdicts = PendingVerdicts(VerifiedDecodeStore()) if decode and reader.holds_local_files() else None
    if verdicts is not None and not redecode:
        sources = dict.fromkeys(reader.source_of(pos) for pos in range(reader.num_episodes))  # (a union's datasets)
        checker.verified = frozenset(v for source in sources for v in verdicts.store.verdicts(source))
    warn_undeclared_columns(reader)
    _warn_stats_faults(reader)
    _set_references(checker)
    _warn_info_json_unlike(checker)
    report = CheckReport(source=reader.location.description)
    files: set[str] = set()
    decoded_files: set[str] = set()
    skipped_files: set[str] = set()  # (those of them never decoded here: verified before, all their frames)
    kinds: Counter[str] = Counter()
    most = max(1, min(_TASK_EPISODES, -(-reader.num_episodes // (4 * max(workers, 1)))))
    try:
        for tally in _tallies(checker, list(_tasks(reader, most)), workers, when_decoding=when_decoding):
            report.episodes += tally.episodes
            report.rows += tally.rows
            report.frames_decoded += tally.frames_decoded
            report.frames_verified_before += tally.decodes.frames_verified_before
            report.problems.extend(tally.problems[: max(0, max_problems - len(report.problems))])
            kinds.update(map(_kind, tally.problems))
            files |= tally.video_files
            decoded_files |= tally.decodes.files_decoded
            skipped_files |= tally.decodes.files_verified_before
            if verdicts is not None:
                verdicts.add(tally.decodes.verdicts)
            if progress is not None:
                progress(tally.episodes)
    finally:  # (a check cut short keeps what it verified)
        if verdicts is not None:
            verdicts.save()
            verdicts.store.prune_unused()
    report.video_files = len(files)
    report.video_files_verified_before = len(skipped_files - decoded_files)
    report.problem_kinds = dict(kinds.most_common())
    report.problems.sort(key=_listed_order)
    report.seconds = time.perf_counter() - started
    logger.info(
        "checked %d episodes (%d rows, %d video files) of %s in %.1f s: %d problem(s)",
        report.episodes, report.rows, report.video_files, report.source, report.seconds, report.problem_count,
    )  # fmt: skip
    return report


def _warn_stats_faults(reader: LeRobotDatasetReader) -> None:
    """Warn, per dataset (a union's datasets' own), of statistics of the features ``reader`` reads that normalising by
    them refuses or turns wrong (:func:`~.dataset_stats.stats_faults`), or of statistics that do not read: a run
    that normalises by them (``normalize="stats"``; ``pipelines/train.py``'s state and action; LeRobot's policies)
    fails as it starts, or trains on wrong values; one that does not reads on, so they are no episode's problem."""
    for dataset in datasets_within(reader):  # (a nested union's each too: its own location reads its first's files)
        keys = [*dataset.camera_keys, *dataset.image_keys, *dataset.tabular_keys]
        try:
            stats = read_dataset_stats(dataset.location, dataset.info, warn_not_finite=False)  # (said below)
            faults = stats_faults(stats, dataset.info, keys)
        except DatasetError as e:
            logger.warning(
                "%s: its statistics do not read, so normalising by them fails: %s", dataset.location.description, e
            )
            continue
        if faults:
            said = "; ".join(f"{key!r}: {', '.join(what)}" for key, what in faults.items())
            logger.warning(
                "%s: statistics (meta/stats.json; v2.1: meta/episodes_stats.jsonl aggregated) that normalising by "
                "fails or turns values wrong: %s; recompute them from the data files, or download or copy the file "
                "again", dataset.location.description, said,
            )  # fmt: skip


def default_workers(reader: LeRobotDatasetReader, *, decode: bool) -> int:
    """Processes worth starting (each takes about a second): up to 8, one per CPU, to decode (:func:`check_dataset`
    starts them at the first frame to decode, where none would be started without), to read remote files, or for
    2,000 episodes or more; else none. Checked without decoding, a local episode takes 1-3 ms
    here (400 episodes of two cameras: 0.4 s in v3.0, 1.1 s in v2.1), two workers 1.1 and 1.8 s."""
    if decode or not reader.location.is_local or reader.num_episodes >= 2000:
        return min(8, usable_cpus())
    return 0


def _set_references(checker: _EpisodeChecker) -> None:
    """What the workers hold every file to, as the iterator's do on a machine without NVDEC: each camera's first
    file's size (and codec where DALI's CPU decoder decodes the camera: VP8/VP9/MJPEG, unless its files mix codecs),
    and (``decode=True``) each image camera's first image's shape, from the first episode that has them."""
    reader = checker.reader
    surveys_since = time.monotonic()  # (one wait, however many cameras: its progress shows past 2 s in all)
    for camera in reader.camera_keys:
        for pos in range(reader.num_episodes):
            try:
                index = checker.packet_index(pos, camera)[1]
                break
            except Exception as e:  # (its episode's check lists it; the next episode's file may serve)
                logger.debug("camera %s: no format from episode position %d: %s", camera, pos, e)
        else:
            continue
        try:
            mixes = _mixes_codecs(reader, camera, since=surveys_since)
        except PermissionError as e:  # (a file this user may not read: its episodes list it, as a damaged one's)
            logger.debug("camera %s: its files' codecs not surveyed: %s", camera, e)
            mixes = False
        if reader.info.features[camera].is_depth_map or mixes:
            checker.workers_only.add(camera)
        route = DecodeRoute.CPU_FALLBACK if camera in checker.workers_only else route_without_nvdec(index.codec)
        checker.formats[camera] = CameraFormat.of(index, route=route)
    for camera in reader.image_keys if checker.decode else ():
        for pos in range(reader.num_episodes):
            try:
                shape = first_image_shape(checker.reader, pos, camera)
            except Exception as e:
                logger.debug("camera %s: no image shape from episode position %d: %s", camera, pos, e)
                continue
            if shape is not None:
                checker.image_shapes[camera] = shape
                break


def _warn_info_json_unlike(checker: _EpisodeChecker) -> None:
    """Warn, per dataset (a union's datasets' own), of what info.json declares of a camera's video (codec, fps, size)
    that its first episode's file does not hold: the workers read the files as they are, so it is no episode's
    problem, but tools that read info.json instead are told wrong (``lerobot-dali info`` says it too)."""
    for dataset in datasets_within(checker.reader):
        for camera in dataset.camera_keys if dataset.num_episodes else ():
            try:
                index = checker.packet_index(0, camera, dataset=dataset)[1]
            except Exception as e:  # (its episode's check lists it)
                logger.debug("camera %s: info.json not compared with its first file: %s", camera, e)
                continue
            found = describe_index(index)
            unlike = dataset.info.features[camera].unlike_video(found.codec, found.fps, (found.height, found.width))
            if unlike:
                logger.warning(
                    "%s: camera %r: info.json declares %s: the check and a run read the files as they are; tools "
                    "that read info.json instead are told wrong: correct meta/info.json",
                    dataset.location.description, camera, ", ".join(unlike),
                )  # fmt: skip


def _mixes_codecs(reader: LeRobotDatasetReader, camera: str, *, since: float | None = None) -> bool:
    """Whether ``camera``'s files that open differ in codec, as the iterator surveys them (:mod:`.camera_codecs`): it
    sends such a camera to the workers."""
    format_store = FileFormatStore() if reader.holds_local_files() else None
    survey = survey_camera(
        reader, camera, surveyed_positions(reader, camera), skip_unreadable=True, format_store=format_store, since=since
    )
    return len(survey.codecs()) > 1


def _tasks(reader: LeRobotDatasetReader, most: int) -> Iterator[list[int]]:
    """Episode positions in runs of one data file, at most ``most`` each."""
    episodes = reader.episodes
    files = np.stack([episodes.data_chunk_index, episodes.data_file_index], axis=1)
    order = np.lexsort((np.arange(len(files)), files[:, 1], files[:, 0]))
    starts = np.flatnonzero(np.any(np.diff(files[order], axis=0) != 0, axis=1)) + 1
    for run in np.split(order, starts):
        for start in range(0, len(run), most):
            yield run[start : start + most].tolist()


def _tallies(
    checker: _EpisodeChecker, tasks: list[list[int]], workers: int, *, when_decoding: bool = False
) -> Iterator[_Tally]:
    """Each task's tally, in this process or in ``workers`` spawned ones (a few tasks in flight per worker);
    ``when_decoding``: in this process up to the first task with a frame or image to decode, that one and the rest in
    the workers (started then: none where nothing is to decode)."""
    if when_decoding and workers > 0:
        checked = 0
        try:
            for task in tasks:
                tally = checker.check(task, decodes_here=False)
                checked += 1
                yield tally
        except _DecodeDue:  # (the task is checked again by a worker, whole)
            logger.debug("frames to decode from task %d of %d on: starting %d workers", checked, len(tasks), workers)
        finally:
            checker.close()
        tasks = tasks[checked:]
        if not tasks:
            return
    if workers <= 0 or len(tasks) <= 1:
        try:
            for task in tasks:
                yield checker.check(task)
        finally:
            checker.close()
        return
    main_named = names_main(checker)  # (the checker pickled once, not at each submit)
    # Each process reads the checker from a file once started: sent down each start (15,000 episodes: ~0.8 MB), it
    # held the start until the process had imported lerobot-dali, one after another (0.7-1.4 s each of 4).
    checker_file = SourceFile()
    try:
        with ProcessPoolExecutor(
            min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
            initargs=(checker_file.dumps(checker), package_log_level()),
        ) as pool:  # fmt: skip
            queued = iter(tasks)

            def submit(count: int) -> set[Future[_Tally]]:
                """The next ``count`` tasks. The pool starts a process, in this thread, at any submit while it runs
                fewer than it may and none is idle: at a refill too, where a task ended while the last processes
                were starting (a check of 15,000 episodes on 4 workers started its 4th so, and it imported
                __main__)."""
                with skipping_main(checker, main_named=main_named):
                    return {pool.submit(_check_in_worker, task) for task in itertools.islice(queued, count)}

            pending = submit(2 * workers)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                pending |= submit(len(done))
                yield from (f.result() for f in done)
    finally:  # (the pool shut down: every process it started has read it)
        checker_file.remove()
