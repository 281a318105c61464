"""``DALILeRobotIterator``: the drop-in for ``DataLoader(LeRobotDataset(...))`` in a training loop.

The iterator owns the rank's stream position (epoch, samples handed to the trainer) and rebuilds the DALI
pipeline only when that position jumps (``load_state_dict``, a ``set_epoch`` out of sequence); otherwise
DALI's own epochs follow ours and workers keep their caches warm.

This module is the iterator's life cycle: build, passes, batches, state, close. What it is built from lives apart:
its arguments checked and its dataset opened (:mod:`.iterator_arguments`), the shapes the first episode fixes for
every batch (:mod:`.batch_shapes`), each camera's decode route, format and feed (:mod:`.camera_plan`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from . import fork_locks
from .augment_config import AugmentConfig, checked_size
from .augment_semantics import AUGMENT_SEMANTICS_VERSION, saved_version, warn_if_changed
from .batch_shapes import first_episode_rows, image_shapes, listed_scalars
from .batch_source import BatchSource, SourceSpec, batch_bytes_estimate, output_fields
from .camera_plan import CameraPlanner
from .cpu_decode_options import CpuDecodeOptions, checked_cpu_decode
from .dali_graph import HOST_SUBTASK_INDEX, HOST_TASK_INDEX, build_pipeline, source_queue_depth
from .dataset_info import INDEX_COLUMNS
from .dataset_reader import NO_SUBTASK_INDEX, LeRobotDatasetReader, warn_undeclared_columns
from .dataset_union import DATASET_INDEX, DatasetUnion, datasets_held, refuse_another_order, warn_of_other_contents
from .decode_errors import locate_clip_failure
from .decode_route import DecodePreference, DecodePreferenceName
from .depth_maps import DepthUnit, DepthUnitName
from .distributed import cpus_per_local_rank, local_world_size, rank_cuda_device, resolve_rank
from .errors import (
    DatasetError,
    DeltaTimestampsError,
    IteratorClosedError,
    IteratorForkedError,
    ResumeStateError,
    WorkerProcessError,
)
from .exit_close import BatchesHeld, exiting, must_park, park_if_exiting, watch
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource, TimestampSourceName
from .host_values import decode_host_values
from .iterator_arguments import batchable_reader, camera_augment, check_windows, checked_arguments
from .open_files import workers_files_fix
from .parent_watch import children_start_deaf_to_interrupts, task_puts_finish_before_interrupts
from .prefetch import Prefetcher, prefetching_reader, wants_prefetch_cache
from .progress_lines import said_if_long
from .said_once import say_once, warn_once
from .sample_order import DEFAULT_EPISODE_POOL_SIZE, OrderOptions, RankBalance, RankBalanceName
from .stream_state import SampleStream
from .value_checks import check_choice
from .windows import DeltaWindows
from .wording import counted
from .worker_errors import SMALL_SHM_BYTES, dead_worker_error, original_worker_error, shared_memory_note, shm_bytes
from .worker_source import SourceFile, dali_dump
from .worker_start import package_log_level, skipping_main

__all__ = ["DALILeRobotIterator", "builds_said_together", "close_deadline", "wait_for_pass"]

logger = logging.getLogger(__name__)
#: Seconds a pipeline's build runs before it says so: DALI starts its worker processes there, each importing DALI
#: and lerobot-dali (~0.65 s of CPU apiece), which took 1-5 s for 2-4 workers on 2 busy cores.
BUILD_PROGRESS_DELAY_S = 2.0

#: How long close() from another thread waits for a pass inside DALI's next() (or building pipelines: an iterator's, a
#: mixture's datasets') to let the pipeline go.
CLOSE_WAIT_S = 60


class DALILeRobotIterator:
    """Batches of a LeRobot dataset as dicts of tensors on ``device``, decoded and augmented by DALI.

    Keys and shapes follow a ``DataLoader`` over ``LeRobotDataset``: every feature key, ``<key>_is_pad`` for
    keys with deltas, ``index, episode_index, frame_index, timestamp, task_index`` tensors, ``task`` as a
    list of strings (``subtask`` too where the dataset has ``meta/subtasks.parquet``), cameras ``(B, C, H, W)``
    or ``(B, T, C, H, W)`` for a multi-step window.
    Each rank reads its own disjoint episodes: build one per process, never wrap it in
    ``accelerator.prepare`` (that would keep 1/N of an already rank-disjoint stream).

    Arguments, by what they decide (README.md has the details):

    * What is read: ``dataset`` (a folder, Hub repo id, ``hf://``/``s3://``/... URL, or an open reader),
      ``revision``, ``episodes`` (a subset, e.g. a training split), ``episode_filter`` (a predicate over each
      episode's metadata row, as LeRobot's), ``cameras`` and ``keys`` (the rest is never read),
      ``data_files_root`` (data and videos from a mirror of the repo).
    * What a sample holds: ``delta_timestamps`` (LeRobot's windows; padded steps set ``<key>_is_pad``),
      ``timestamp_source`` and ``tolerance_s`` (how rows find their video frames), ``image_size``, ``augment``
      (on the device, one draw per sample for its whole window), ``return_uint8``, ``depth_unit``.
    * The order: ``batch_size``, ``shuffle``, ``seed``, ``episode_pool_size`` (episodes sampled from at once:
      more mixes better and holds more open), ``drop_last`` (default True: every batch full; LeRobot's train
      script passes ``drop_last=False`` to its DataLoader), ``rank``/``world_size`` (default: from
      ``torch.distributed``, then ``RANK``/``WORLD_SIZE``, then accelerate), ``rank_balance`` (how ranks with
      fewer frames reach the common batch count that collective training needs; ``"none"``: they do not, for
      evaluation, every frame once), ``episode_piece_frames``
      (deal episodes to ranks in pieces of at most that many frames: for more ranks than episodes, or few each),
      ``drop_n_first_frames`` and ``drop_n_last_frames`` (never sample an episode's first or last frames, as
      LeRobot's ``EpisodeAwareSampler``, with which it trains Diffusion Policy: their windows still read them).
    * Where the work runs: ``device``, ``decode`` (``"auto"``: NVDEC where the GPU has the codec, else the CPU;
      ``"gpu"``: NVDEC or fail; ``"cpu"``), ``num_workers`` (processes that read rows and decode on the CPU),
      ``dali_threads``, ``prefetch`` (batches DALI prepares ahead; the workers compute one batch each and
      ``prefetch`` more ahead, as /dev/shm allows), ``cpu_decode`` (the CPU decoder's options), ``share_clips``
      (cameras DALI decodes: a batch's samples that read one video file decode one clip, since DALI sets up a
      decoder for every clip, ~30 ms each; off until measured on a GPU, where ``bench`` runs it beside the default).
    * Remote datasets: ``cache_dir`` and ``cache_gb`` (the local cache episodes are prefetched into; 0: off).
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | LeRobotDatasetReader,
        *,
        batch_size: int = 64,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        episode_pool_size: int = DEFAULT_EPISODE_POOL_SIZE,
        device: str | torch.device = "cuda",
        decode: DecodePreference | DecodePreferenceName = "auto",
        num_workers: int = 4,
        image_size: tuple[int, int] | None = None,
        augment: AugmentConfig | None = None,
        return_uint8: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        drop_last: bool = True,
        prefetch: int = 2,
        revision: str | None = None,
        cameras: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        timestamp_source: TimestampSource | TimestampSourceName = TimestampSource.PARQUET_TIMESTAMP,
        rank_balance: RankBalance | RankBalanceName = RankBalance.PAD,
        data_files_root: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_gb: float = 8.0,
        cpu_decode: CpuDecodeOptions | None = None,
        episodes: Sequence[int] | None = None,
        episode_filter: Callable[[dict[str, Any]], bool] | None = None,
        dali_threads: int | None = None,
        depth_unit: DepthUnit | DepthUnitName = DepthUnit.MM,
        episode_piece_frames: int | None = None,
        drop_n_first_frames: int = 0,
        drop_n_last_frames: int = 0,
        share_clips: bool = False,
    ) -> None:
        self._pid = os.getpid()  # the process whose pipeline this is: a forked child's copy leaves it alone
        device = str(device)  # (a torch.device, as accelerator.device is, spells the same)
        (batch_size, num_workers, prefetch, dali_threads), preference = checked_arguments(
            batch_size=batch_size, device=device, decode=decode, num_workers=num_workers, prefetch=prefetch,
            dali_threads=dali_threads,
        )  # fmt: skip
        self.reader = batchable_reader(
            dataset,
            revision=revision,
            cameras=cameras,
            keys=keys,
            data_files_root=data_files_root,
            episodes=episodes,
            episode_filter=episode_filter,
        )
        ranks = resolve_rank(rank, world_size)
        self.rank, self.world_size = ranks.rank, ranks.world_size
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._device = torch.device(device if device != "cuda" else rank_cuda_device(ranks))
        self._shows_progress = ranks.local_rank == 0  # (one bar per node, not one per rank on one terminal)
        #: Whether a pipeline's build says so itself where it takes long (not while :func:`builds_said_together`).
        self._says_build = True
        self._device_id = None if self._device.type == "cpu" else self._device.index or 0
        self._num_workers = num_workers
        self._dali_threads = dali_threads if dali_threads is not None else default_dali_threads(num_workers)
        self._prefetch = prefetch
        #: This pipeline's part of the rank's /dev/shm budget (:meth:`_source_depth`): a mixture's datasets each run a
        #: pipeline of their own on the rank, which share it by batch share.
        self._shm_fraction = 1.0
        self._depth_quantizers = self.reader.info.depth_quantizers(self.reader.camera_keys)
        self._depth_image_units = self.reader.info.depth_image_units(self.reader.image_keys)
        self._depth_cameras = {*self._depth_quantizers, *self._depth_image_units}
        self._depth_unit = check_choice(DepthUnit, "depth_unit", depth_unit)
        self._image_shapes = image_shapes(self.reader)
        first_rows = first_episode_rows(self.reader)  # (read once: for the scalars' shapes and the frames' lookup)
        self._listed_scalars = listed_scalars(self.reader, first_rows)
        # Cameras of other than 3 channels: grey image cameras, depth cameras (1).
        grey = {key: shape[2] for key, shape in self._image_shapes.items() if shape[2] != 3}
        self._image_channels = grey | dict.fromkeys(self._depth_cameras, 1)
        self._augment = camera_augment(
            augment, self.reader, self._image_channels, self._depth_cameras, return_uint8=return_uint8
        )
        self._image_size = None if image_size is None else checked_size(type(self).__name__, "image_size", image_size)
        self._return_uint8 = return_uint8
        self._tolerance_s = tolerance_s
        self._cpu_decode = checked_cpu_decode(cpu_decode)
        self._timestamp_source = check_choice(TimestampSource, "timestamp_source", timestamp_source)
        try:
            self.windows = DeltaWindows(
                delta_timestamps=dict(delta_timestamps or {}),
                fps=self.reader.fps,
                tolerance_s=tolerance_s,
                camera_keys=self.reader.camera_keys,
                feature_keys=[*self.reader.info.features, *INDEX_COLUMNS],  # (derived where a dataset lacks them)
            )
        except DeltaTimestampsError:
            # The first episode's rows refused (an fps in info.json its timestamps say is wrong) say so first: the
            # deltas were held to that fps, and were told to be multiples of its frames.
            if first_rows is None and self.reader.num_episodes:
                self.reader.read_episode(0)
            raise
        check_windows(self.windows, self.reader)
        options = OrderOptions(
            seed=seed,
            shuffle=shuffle,
            episode_pool_size=episode_pool_size,
            rank_balance=check_choice(RankBalance, "rank_balance", rank_balance),
            piece_frames=episode_piece_frames,
            drop_n_first_frames=drop_n_first_frames,
            drop_n_last_frames=drop_n_last_frames,
        )
        #: The seed= it was built with, which a loaded state's seed is told apart from (not the seed of a state
        #: loaded before: built with 2, a seed-2 state loaded after a seed-1 one was said to be 'another seed').
        self._built_seed = options.seed
        self._stream = SampleStream(
            self.reader.episodes.length,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=batch_size,
            options=options,
        )
        planner = CameraPlanner(
            reader=self.reader,
            device_id=self._device_id,
            depth_cameras=self._depth_cameras,
            depth_unit=self._depth_unit,
            timestamp_source=self._timestamp_source,
            tolerance_s=self._tolerance_s,
            unread_tail={key: self.windows.unread_tail(key, drop_n_last_frames) for key in self.reader.camera_keys},
            image_size=self._image_size,
            cpu_decode=self._cpu_decode,
            augment=self._augment,
            num_workers=self._num_workers,
            share_clips=bool(share_clips),
        )
        # (the planner's stores, built as diagnose's: the workers read the packet indexes kept there)
        self._index_store, self._remote_index_store = planner.index_store, planner.remote_index_store
        self._format_store = planner.format_store
        for store in (self._index_store, self._format_store, self.reader.column_store):
            if store is not None:  # (a sweep a day at most)
                store.prune_unused()
        self.routes = planner.choose_routes(preference, first_rows)
        self._camera_formats, self._pix_fmts = planner.camera_formats, planner.pix_fmts
        warn_undeclared_columns(self.reader)
        self._feeds = planner.plan_feeds(self.routes)
        self._tabular_keys = tuple(self.reader.tabular_keys)
        self._host_value_keys = tuple(k for k in self._tabular_keys if self.reader.info.features[k].is_host_value)
        # Remote datasets: file stamps (reader.stamps, one listing per root) and packet indexes on disk mean
        # no per-file requests from any worker; workers read through a cache a prefetcher fills on admission.
        self._cache_dir, self._cache_bytes = cache_dir, int(cache_gb * 1e9)
        self._take_prefetch_slot(self._cache_bytes)
        self._pipeline: Any = None
        self._source: BatchSource | None = None  # the pipeline's, which its reference cycles keep: closed with it
        self._dali_iter: Any = None
        self._fingerprint: str | None = None
        # Held while a pass builds its pipeline or is inside DALI's next(): close() from another thread must not
        # shut the pipeline down under it (a close() in a signal handler inside next() is deferred, see close()).
        self._next_lock = fork_locks.rlock()
        # Of the latest iter(): only that pass reads, as a DataLoader's newest iterator does. Every pipeline is
        # built by an iter(), so a pass that reads only while its id is the latest reads only its own pipeline.
        self._pass_id = 0
        # close() was called by a signal handler on a thread holding that lock: that thread's id, else 0
        self._close_deferred = 0
        self._closes_left_to_pass = 0  # close() calls from another thread that found a pass holding the lock
        self._pass_start: int | None = None  # samples_consumed when the pass in progress began
        self._pipeline_next: tuple[int, int] | None = None  # (epoch, sample) the pipeline's next batch starts at
        self._pipeline_loads = 0  # the stream's loads (load_state_dict() calls) the pipeline was built under
        # Its checks' data files: batches read through the source's copy of the reader, and one left open here made
        # this reader one more cache splitting the data files' share of the open-file limit (open_files.FileShare).
        self.reader.close_files()
        self._say_how_it_reads(ranks.source_said)
        watch(self)  # closed at exit, before DALI's own handler shuts its pipeline down under a pass

    def _take_prefetch_slot(self, cache_bytes: int) -> None:
        """The workers' reader and the prefetcher (:func:`~.prefetch.prefetching_reader`): a remote dataset's workers
        read through a slot of the prefetch cache taken now, which close() gives up."""
        self._worker_reader, self._prefetcher = prefetching_reader(
            self.reader,
            self._stream.order,
            rank=self.rank,
            lookahead=prefetch_lookahead(self.batch_size, self._prefetch, self._num_workers),
            cache_dir=self._cache_dir,
            cache_bytes=cache_bytes,
            index_store=self._remote_index_store,
        )
        # None taken where one is wanted (every slot busy: other runs on this cache_dir; a disk that refused): the next
        # pass that builds its pipeline asks again, as one after close() does; a run that found the slots busy at its
        # start read every range remotely to its end, however soon one was freed.
        self._slot_given_up = self._prefetcher is None and wants_prefetch_cache(self.reader, cache_bytes)

    def _say_how_it_reads(self, rank_source: str) -> None:
        """Log what the built iterator reads (its samples, routes, threads), and warn of what a run would regret:
        a small /dev/shm, an unbalanced epoch that leaves samples out, an epoch too short for one batch."""
        repeated = self._stream.order.repeated_samples(self._stream.epoch)
        logger.info(
            "%s: rank %d/%d (%s): %s per epoch%s, routes %s, %s",
            self.reader.location.description, self.rank, self.world_size, rank_source,
            counted(self._stream.num_samples(), "sample"),
            f" ({repeated} of them its first ones again, to match the fullest rank)" if repeated else "",
            {k: r.value for k, r in self.routes.items()}, counted(self._dali_threads, "DALI thread"),
        )  # fmt: skip
        shm = shm_bytes()
        if self._num_workers and shm is not None and shm < SMALL_SHM_BYTES:  # a container's default: SIGBUS ahead
            warn_once(logger, "/dev/shm is small: %s", shared_memory_note(shm))
        if self._stream.order.options.rank_balance is RankBalance.NONE and self.world_size > 1:
            say_once(logger, logging.INFO,
                "rank_balance='none': ranks read %s samples this epoch, unequal; run no collective per batch",
                self._stream.order.rank_frame_counts(self._stream.epoch).tolist(),
            )  # fmt: skip
        left_out = self._stream.num_samples() % self.batch_size
        if self._stream.order.options.rank_balance is RankBalance.NONE and self.drop_last and left_out:
            logger.warning(
                "rank_balance='none' reads every frame once across ranks only with drop_last=False: drop_last=True "
                "leaves out the last samples of each rank's epoch that do not fill a batch (%d of rank %d's in epoch "
                "%d); pass drop_last=False to evaluate every frame",
                left_out, self.rank, self._stream.epoch,
            )  # fmt: skip
        elif self._stream.order.options.rank_balance is RankBalance.NONE and self.drop_last and self.world_size > 1:
            logger.info(
                "rank_balance='none' with drop_last=True: rank %d's epoch %d fills whole batches, but the ranks' "
                "counts change between epochs, so a later epoch may leave samples out; drop_last=False never does",
                self.rank, self._stream.epoch,
            )  # fmt: skip
        if self.drop_last and self._stream.num_samples() < self.batch_size:
            logger.warning(
                "rank %d gets %d samples an epoch, fewer than batch_size=%d: with drop_last=True every epoch is "
                "empty; lower batch_size or pass drop_last=False",
                self.rank, self._stream.num_samples(), self.batch_size,
            )  # fmt: skip

    # -- epochs and state --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches a pass over the current epoch yields: a full epoch, or what is left of a resumed or
        interrupted one. Counted from where the pass in progress started, so it holds still while the loop
        runs, as a ``DataLoader``'s length does (``step == len(it) - 1`` checks, schedulers). Once a pass ends,
        the current epoch is the next one, whose count may differ by a few samples where several ranks are
        balanced (:class:`~.sample_order.RankBalance`)."""
        start = self._pass_start if self._pass_start is not None else self._stream.samples_consumed
        remaining = self._stream.num_samples() - start
        return remaining // self.batch_size if self.drop_last else -(-remaining // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to: 0 at first, the checkpoint's after :meth:`load_state_dict`, and the
        next one once a pass has read an epoch to its end (so ``range(it.epoch, epochs)`` resumes a loop)."""
        return self._stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (no-op for the epoch in progress, so it never undoes a resume). From another thread, as a
        load: a pass reading meanwhile ends with :class:`~.errors.IteratorClosedError`, the batch it read in the old
        epoch dropped, and the next pass reads ``epoch`` from its start."""
        self._stream.set_epoch(epoch)

    def epoch_samples(self, epoch: int) -> int:
        """Samples each rank reads in ``epoch`` (before ``drop_last``), known before it starts."""
        return self._stream.order.num_samples(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs to continue exactly: seed, epoch, samples the trainer has taken, world and
        batch size, and the options that shape the order (a resume under others is refused where they change it).
        Shuffled, also this rank's episode pool at that position (a few integers per pooled episode), so a resume
        starts there instead of replaying the epoch's pool up to it (3 s of CPU 13.7M samples in); the ranks' states
        then differ in it alone.

        It also says what it was read from: the episodes (a count and a digest) and each dataset, a union's in its
        order (a digest of the episodes read, one of the dataset whatever episodes are read: info.json and task
        table, and its path or URL). A resume over other episodes, a union listed otherwise or swapped datasets
        fails instead of continuing a different order, wherever the datasets are read from; one over the same
        episodes with other contents (edited, re-encoded, re-generated) warns, naming both. ``augment_version``
        (:mod:`.augment_semantics`) makes a resume by a lerobot_dali that augments the config otherwise warn.

        Safe from another thread (an asynchronous checkpoint): it is always a position the stream passed through.
        """
        return {
            **self._stream.state_dict(),
            "episodes": self._episodes_fingerprint(),
            **datasets_held([self.reader]),
            "augment_version": AUGMENT_SEMANTICS_VERSION,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue where ``state_dict`` (a :meth:`state_dict`) left off: the next pass starts there. Safe from another
        thread: a pass reading meanwhile ends with :class:`~.errors.IteratorClosedError`, the batch it read at the old
        position dropped, so the stream stands where the state says.

        The state's seed is kept, whatever ``seed=`` this iterator was built with, so the saved run's order and
        augmentation draws go on (this epoch and later ones); where they differ, a warning names both."""
        self._load(state_dict, "load_state_dict()")
        warn_of_another_seed(self._built_seed, self._stream.order.options.seed, "this iterator")

    def _load(self, state_dict: Mapping[str, Any], moved_by: str) -> None:
        """:meth:`load_state_dict`; a pass it ends names ``moved_by`` as what moved the stream (a mixture's
        set_epoch() moves its datasets by a load)."""
        _refuse_mixture_state(state_dict)
        if isinstance(state_dict, Mapping):  # (before the episodes: says why)
            if isinstance(self.reader, DatasetUnion):  # (its datasets listed: a union within counted as its own)
                refuse_another_order(state_dict, self.reader.members, "the union")
            else:
                refuse_another_order(state_dict, [self.reader], "the dataset")
        saved = state_dict.get("episodes") if isinstance(state_dict, Mapping) else None
        if saved is not None and saved != self._episodes_fingerprint():
            raise ResumeStateError(
                f"this stream state was saved over other episodes ({saved}) than this iterator reads "
                f"({self._episodes_fingerprint()}, {self.reader.location.description}); resume with the same "
                "dataset and episodes= selection"
            )
        version = saved_version(state_dict.get("augment_version") if isinstance(state_dict, Mapping) else None)
        loads = self._stream.load_state_dict(state_dict, moved_by=moved_by)
        # Under the pass's lock, as every other close of the pipeline: another thread's close() keeps the pipeline and
        # its source until they are closed, and this one, run meanwhile (a mixture restoring its datasets' positions as
        # a watchdog closes it), closed the source under that close's running Shutdown() (1 of 1).
        with self._next_lock:
            # Only a pipeline built before this load (at the position it replaced): one a pass started from another
            # thread built since, at the loaded position, was closed under that pass, which ended in a spurious
            # IteratorClosedError ('the iterator was closed', nothing lost: 140 of 1,049 passes that
            # fuzzed loads and set_epoch calls from another thread ended, in 90 of 200 runs).
            if self._pipeline_loads < loads:
                self._close_pipeline()
        augmented = any(camera not in self._depth_cameras for camera in self.reader.all_camera_keys)
        warn_if_changed(version, self._augment if augmented else None)
        warn_of_other_contents(state_dict, [self.reader])

    def _episodes_fingerprint(self) -> str:
        if self._fingerprint is None:  # (hashed once: a mixture saves its datasets' states before every batch)
            episodes = self.reader.episodes
            digest = hashlib.sha256(episodes.episode_index.astype("<i8").tobytes())
            digest.update(episodes.length.astype("<i8").tobytes())
            self._fingerprint = f"{len(episodes)} episodes, sha256 {digest.hexdigest()[:16]}"
        return self._fingerprint

    # -- iteration ---------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """A pass over the rest of the current epoch: batches from the last one handed out (a loop left early
        carries on; a resume, from the state), to the epoch's end, after which :attr:`epoch` is the next one. A new
        ``iter()`` ends the pass before it, whose generator then raises :class:`~.errors.IteratorClosedError`."""
        # An epoch whose samples are all taken (a checkpoint saved after its last batch) gives an empty pass
        # that ends it, as a drop_last tail does; starting the next epoch here would run it twice in a loop
        # that calls set_epoch.
        self._refuse_if_forked()
        while True:
            park_if_exiting()  # (a daemon thread starting a pass after the exit handler closed the iterator)
            try:
                try:
                    with self._next_lock:  # a close() from another thread meanwhile waits, then closes what was built
                        if must_park():  # (the exit handler's close() held the lock: built now, nothing would close it)
                            continue
                        closes = self._closes_left_to_pass
                        # (before the build: a load from another thread during it left the pipeline at the old
                        # position, and the pass counted its first batch, read there, on the loaded one: 1 of 1)
                        loads = self._stream.loads
                        self._ensure_pipeline(loads)
                        self._pass_id += 1  # an older pass's generator, if still held, now raises instead of sharing
                        self._pass_start = self._stream.samples_consumed
                        batches = self._epoch_batches(self._pass_id, loads)
                        if self._closes_left_to_pass != closes:  # (one found this build: its close, left to us)
                            self.close()
                finally:  # (a signal handler's close() in the build: closed here, the pass raises IteratorClosedError)
                    self._close_if_deferred()
            except BaseException:  # (a second signal's exception, a Ctrl-C, landed in that close: run again)
                self._close_if_deferred()
                raise
            return batches

    def _ensure_pipeline(self, loads: int) -> None:
        # The running pipeline serves the stream if it stands where the stream does: right after the last
        # batch handed out (an interrupted pass continues), or at the start of the epoch after a finished one.
        # ``loads``: the stream's, read before the stream's position is.
        if not self._builds_pipeline():
            return
        self._close_pipeline()
        self._pipeline_loads = loads
        # Walked here once (from the pool walk a resumed state carried: one chunk; else from the epoch's start), the
        # order's copies (each worker's, the prefetcher's) start at the stream's position: each replayed the epoch up
        # to there (at 13.7M samples in, 2.8 s of CPU per copy).
        self._stream.order.prepare(self._stream.epoch, self._stream.samples_consumed)
        if self._slot_given_up:
            # Closed, then iterated again (or no slot was free when one was last asked for): a slot is taken again, as
            # a new iterator would. The workers read on through the one close() gave up, with no prefetcher: every
            # range the folder lacked came remotely, and a run that took the slot meanwhile served this one's reads
            # from its own entries (adopted, evicted under them).
            # Not once the exit handler closed everything: nothing would close that prefetcher before the interpreter
            # ends (:mod:`.exit_close`), so the workers read remotely, through no cache folder. One whose close a
            # signal's exception ended (a Ctrl-C in close()) is closed first: replaced, its thread and slot ran on.
            self._close_prefetcher()
            self._take_prefetch_slot(0 if exiting() else self._cache_bytes)
        if self._prefetcher is not None:
            self._prefetcher.set_order(self._stream.order)
            self._prefetcher.warm(self._stream.epoch, self._stream.samples_consumed, progress=self._shows_progress)
        spec = SourceSpec(
            reader=self._worker_reader.for_workers(),
            order=self._stream.order,
            delta_index={k: np.asarray(v) for k, v in self.windows.delta_index.items()},
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            first_epoch=self._stream.epoch,
            start_position=self._stream.samples_consumed,
            camera_feeds=self._feeds,
            tabular_keys=self._tabular_keys,
            host_value_keys=self._host_value_keys,
            timestamp_source=self._timestamp_source,
            tolerance_s=self._tolerance_s,
            index_store=self._index_store,
            cpu_decode=self._cpu_decode,
            image_keys=tuple(self.reader.image_keys),
            image_shapes=self._image_shapes,
            listed_scalars=self._listed_scalars,
            depth_quantizers=self._depth_quantizers,
            depth_image_units=self._depth_image_units,
            depth_unit=self._depth_unit,
            camera_formats=self._camera_formats,
            pix_fmts=self._pix_fmts,
            seed=self._stream.order.options.seed,
            rank=self.rank,
            augment=self._augment,
            log_level=package_log_level(),
        )
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self._spec = spec
        source = BatchSource(spec)
        source_file = SourceFile(dali_dump)  # (read by each worker once started: a 0.8 MB source held each start ~1 s)
        pipe, names = build_pipeline(
            source,
            output_fields(spec),
            source_depth=self._source_depth(spec),
            batch_size=self.batch_size,
            device_id=self._device_id,
            num_workers=self._num_workers,
            num_threads=self._dali_threads,
            prefetch=self._prefetch,
            seed=spec.seed,
            augment=self._augment,
            image_size=self._image_size,
            return_uint8=self._return_uint8,
            source_pickler=source_file,
        )
        self._names = names
        self._pipeline_next = (self._stream.epoch, self._stream.samples_consumed)
        try:
            with said_if_long(
                _build_line(self._num_workers, f"the DALI pipeline of {self.reader.location.description}"),
                logger=logger,
                delay_s=BUILD_PROGRESS_DELAY_S,
                enabled=self._shows_progress and self._says_build,
            ):
                try:
                    task_puts_finish_before_interrupts()
                    with skipping_main(source), children_start_deaf_to_interrupts():
                        pipe.build()
                finally:  # (every worker has read it once started: build() waits for them)
                    source_file.remove()
                self._dali_iter = DALIGenericIterator(
                    pipe, names, auto_reset=True, last_batch_policy=LastBatchPolicy.PARTIAL, prepare_first_batch=False
                )
        except BaseException as e:
            # Not this iterator's pipeline yet, so nothing else closes it: workers started before the failure ran on
            # (one set per failed pass) until the cycle collector freed this frame from the error's traceback.
            try:
                _close_and_shut_down(pipe)
                source.close()
            except Exception as cleanup:  # (a half-built pipeline: the build's own error is the one to raise)
                logger.debug("closing the pipeline that failed to build: %r", cleanup)
            if not isinstance(e, Exception):
                raise
            if "Workers initialization failed" in str(e):
                raise WorkerProcessError(
                    f"DALI's {counted(self._num_workers, 'worker process')} did not start ({e}). They start with "
                    "spawn, which imports the main module again where what they run names a class defined in it: a "
                    "script that builds the iterator at its top level must then do so under "
                    '`if __name__ == "__main__":`. '
                    "Otherwise the workers' traceback above says why."
                ) from e
            if isinstance(e, OSError) and e.errno == errno.EMFILE:  # (other processes' files, or a limit lowered since)
                raise WorkerProcessError(
                    f"DALI's {counted(self._num_workers, 'worker process')} did not start: this process ran out of "
                    f"open files ({e}); " + workers_files_fix(self._num_workers)
                ) from e
            _raise_original(e)
        self._pipeline, self._source = pipe, source

    def _builds_pipeline(self) -> bool:
        """Whether the next pass builds a pipeline: none runs, or the one running stands elsewhere than the stream, or
        reads an order a load from another thread replaced (its close of it still to come: the same position, another
        seed)."""
        stream = self._stream
        return (
            self._dali_iter is None
            or self._pipeline_loads != stream.loads
            or self._pipeline_next != (stream.epoch, stream.samples_consumed)
        )

    def _epoch_batches(self, pass_id: int, loads: int) -> Iterator[dict[str, Any]]:
        """Pass ``pass_id``'s batches, begun where the stream stood after its ``loads``-th load: a load_state_dict()
        from another thread since (as a batch was read) ends it, that batch read at the old position dropped."""
        held = BatchesHeld()  # (the exit handler waits for the thread holding them to park: :mod:`.exit_close`)
        ended = None  # the epoch of the batches counted
        try:
            while (batch := self._next_of_pass(pass_id, loads, held)) is not None:
                try:
                    # The stream counts the batch last, right before handing it out: a signal's exception (Ctrl-C, a
                    # SIGTERM handler's sys.exit) in the followers below lost it, counted but never seen by the loop.
                    epoch, taken = self._stream.epoch, self._stream.samples_consumed + len(batch["index"])
                    if self._stream.loads != loads:  # (the followers are told of the old position's batch: none)
                        raise self._loaded_error()
                    if self._num_workers:  # (the workers walk their copies: this one follows, for state_dict)
                        self._stream.order.follow(epoch, taken)
                    prefetcher = self._prefetcher  # (read once: a close() from another thread sets it to None)
                    if prefetcher is not None:
                        prefetcher.advance(epoch, taken)
                    if not self._stream.advance(len(batch["index"]), loads=loads):  # (a load after the check above)
                        raise self._loaded_error()
                    self._pipeline_next, ended = (epoch, taken), epoch
                except BaseException:  # Ctrl-C before the stream counted the batch DALI handed out: rebuild
                    try:
                        with self._next_lock:
                            self._close_pipeline()
                    finally:
                        self._close_if_deferred()
                    raise
                yield batch
        finally:  # the pass is over: finished, failed, or left by the loop (the generator is closed)
            held.end()
            if pass_id == self._pass_id:  # (a replaced pass's generator collected later leaves the new one's)
                self._pass_start = None
            self._close_if_deferred()  # (a second signal's exception landed in the pass's own: run again)
        if not self._stream.set_epoch(self._stream.epoch + 1, loads=loads):  # (the end of the epoch it replaced)
            # Unless it moved to where this end would: a set_epoch(next) at the last batch (the loop's, in its body).
            # Each batch was counted before it: the epoch was read whole; the next pass reads the next from its start.
            if ended is None or (self._stream.epoch, self._stream.samples_consumed) != (ended + 1, 0):
                raise self._loaded_error()
            return
        self._pipeline_next = (self._stream.epoch, 0)  # DALI reset itself (auto_reset) for the next epoch

    def _next_of_pass(self, pass_id: int, loads: int, held: BatchesHeld) -> dict[str, Any] | None:
        """The pass's next batch (:meth:`_next_batch_or_park`); where the pipeline was closed by a load from another
        thread since the pass began (``loads``: the stream's then), the error names that load, not a close() (a newer
        pass that replaced it is named as such): a pass that began as the load came built its pipeline at the loaded
        position, which the load then closed, and ended saying 'the iterator was closed' (35 of 1,007 fuzzed passes
        ended by a load or set_epoch, with the load's close of a pipeline built since left out; 0 of 1,088 now)."""
        try:
            return self._next_batch_or_park(pass_id, held)
        except IteratorClosedError as e:
            if self._stream.loads == loads or pass_id != self._pass_id:
                raise
            raise self._loaded_error() from e

    def _next_batch_or_park(self, pass_id: int, held: BatchesHeld) -> dict[str, Any] | None:
        held.claim()  # (before the read: its batch is handed out to this thread, which frees its last one then)
        try:
            return self._next_batch(pass_id)
        except Exception:
            # (closed by the exit handler, or failed by it: a worker it killed at its deadline, :mod:`.exit_close`. A
            # daemon thread waits to be stopped, silent: it printed a WorkerProcessError's traceback in 3 of 6 exits)
            park_if_exiting()
            raise
        finally:  # (a signal handler's close() while the pass held the pipeline: closed now that it is let go)
            self._close_if_deferred()

    def _close_if_deferred(self) -> None:
        """Close now where a close() on this thread (a signal handler's) landed while a frame below held the pass's
        lock (building the pipeline, inside DALI's next()) and was left to it, once none holds it.

        Called in a ``finally`` around ``with self._next_lock``, not by a context manager of both: with one, a signal
        handler's exception (Ctrl-C, a SIGTERM handler's sys.exit) in its Python ``__enter__`` after the lock was
        taken, or at the start of its ``__exit__``, left the lock held by this thread while the exception lived, so
        the loop's close() in its except body was deferred and the pipeline ran on (a KeyboardInterrupt at each point
        a handler runs: 6 such points in the three blocks; none with the RLock's own C ``__enter__``/``__exit__``)."""
        # (this thread's alone: another's, left set where a pass of this one built as its close() let the lock go,
        # closed every pass of this one as it let the lock go, which that close() cannot clear: 3 of 3 passes)
        if self._close_deferred == threading.get_ident() and not fork_locks.held_here(self._next_lock):
            self.close()

    def _next_batch(self, pass_id: int) -> dict[str, Any] | None:
        """The next batch of pass ``pass_id``, or None at the end of the epoch; any failure closes the pipeline.
        (A pass holds its id, not the pipeline: the frames of a raised error must not keep the pipeline's
        workers' shared memory alive.)"""
        self._refuse_if_forked()  # (before the lock: a thread of the parent may have held it at the fork)
        with self._next_lock:
            dali_iter = self._dali_iter
            if dali_iter is None or pass_id != self._pass_id:
                if dali_iter is None and self._pipeline is not None:
                    # A close() marked the pipeline closed and left it running: another thread's that gave up on
                    # this pass inside DALI's next(), or a signal handler's left to the close() its thread ran, which
                    # a second exception ended before it closed anything (a pass runs only its own thread's deferral).
                    # Left to this pass's finally: both ran on after the IteratorClosedError, until a close() or exit.
                    self.close()
                raise self._closed_error()
            outer = sys.exc_info()[1]  # the caller's own error, if it asks for batches while handling one
            # The pipeline stands nowhere until the stream counts the batch: a signal's exception before that (as this
            # lock is let go) carried the pass on one batch past the stream, that batch never seen. The next pass
            # rebuilds it at the stream's position instead.
            self._pipeline_next = None
            batch: dict[str, Any] | None
            try:
                batch = self._to_batch(next(dali_iter)[0])
            except StopIteration:
                batch = None
            except (KeyboardInterrupt, SystemExit) as e:
                # Raised inside DALI's next(): the batch it was producing is off DALI's schedule, and reusing
                # this pipeline skipped it (a review: 8-16 samples lost, others repeated). The next pass rebuilds
                # it at the stream's position.
                dali_iter = None
                self._close_pipeline()
                _release_pipeline_frames(e, outer)
                raise
            except Exception as e:
                dali_iter = None  # this frame stays in the error's traceback, running, so it cannot be cleared
                # Forked in there (a signal handler's fork), carrying on: the pipeline is the parent's, left to it.
                # It failed in DALI ('NoneType' object has no attribute 'SetExternalTLInput', 133 of 144 forks).
                self._refuse_if_forked()
                if self._dali_iter is None:  # close() from another thread ended the workers
                    self._close_pipeline()
                    _release_pipeline_frames(e, outer)
                    raise self._closed_error() from e
                error, whole = self._failed_batch_error(e)
                _release_pipeline_frames(e, outer)
                if whole:
                    # A worker's, naming the file, episode and camera: raised alone, where it chained the same text
                    # 3 times more through DALI (94 lines for a damaged video). How it was raised stays at DEBUG.
                    logger.debug("rank %d: how %s was raised", self.rank, type(error).__name__, exc_info=e)
                    raise error from None
                if error is e:
                    raise
                raise error from e
            if self._dali_iter is None and os.getpid() == self._pid:
                # A close() meanwhile: another thread's that gave up waiting for this pass (CLOSE_WAIT_S), or a signal
                # handler's here. Done now, not at the next batch: a loop that stopped after this one (or an epoch that
                # ended here) left the pipeline and the prefetcher running until the next close() or exit (1 of 1).
                # Not in a child forked in there (a signal handler's fork, carrying on): what it would close is the
                # parent's, as close() leaves it (it closed the parent's source and prefetcher: 1 of 1); its next
                # batch raises IteratorForkedError.
                self._close_held()
            return batch

    def _refuse_if_forked(self) -> None:
        if os.getpid() != self._pid:
            raise IteratorForkedError(
                f"rank {self.rank}: this iterator was built in process {self._pid}, and process {os.getpid()} is a "
                "fork of it (os.fork, or multiprocessing's 'fork' start method): its DALI pipeline and worker "
                "processes stay the parent's and do not survive the fork. Build a DALILeRobotIterator in the child "
                "itself, after the fork"
            )

    def _closed_error(self) -> IteratorClosedError:
        return IteratorClosedError(
            f"rank {self.rank}: the pass was reading the batches after sample {self._stream.samples_consumed} of "
            f"epoch {self._stream.epoch} when the iterator was closed (close() was called, from this thread or "
            "another) or a newer pass (a second iter()) replaced it. No sample was lost: iterating again continues "
            "at that position."
        )

    def _loaded_error(self) -> IteratorClosedError:
        """The error of a pass the stream was moved under (:attr:`SampleStream.moved`), naming the call and where it
        came from: called on the pass's own thread (the loop's body, a signal handler), 'from another thread' misled."""
        (moved_by, thread), stream = self._stream.moved, self._stream
        moved = f"rank {self.rank}: {moved_by} moved the stream to sample {stream.samples_consumed} of epoch "
        moved += str(stream.epoch)
        if thread != threading.get_ident():
            return IteratorClosedError(
                f"{moved} (from another thread) while this pass was reading: what it read, at the old position, is "
                "dropped and the pass ends. Iterating again reads on from the position it moved to."
            )
        return IteratorClosedError(
            f"{moved} during this pass, on its own thread (in the loop's body, or a signal handler): the pass ends, "
            f"what it read on at the old position dropped. Iterating again reads on from the position it moved to; "
            f"called between passes, {moved_by} ends none."
        )

    def _failed_batch_error(self, e: Exception) -> tuple[BaseException, bool]:
        """The error to raise for a failed batch, after closing the pipeline: a dead worker, a named clip, or
        the original; and whether it is a worker's error about the batch's data, rebuilt from DALI's text, whose
        message says it all (its cause is DALI's hand-over of that text: the message 3 times more)."""
        where = (
            f"the batches after sample {self._stream.samples_consumed} of epoch {self._stream.epoch} "
            f"(rank {self.rank}, {counted(self._num_workers, 'worker process')})"
        )
        pipeline = self._pipeline
        dead = dead_worker_error(e, pipeline, where, lambda: _close_workers(pipeline))
        self._close_pipeline()
        if dead is not None:
            return dead, False
        # DALI's decoder names no file; a worker's error and the batch's own checks do (with num_workers=0, here:
        # looked for again, the batch's check raised the same error a second time).
        original = e if isinstance(e, DatasetError) else original_worker_error(e)
        if original is None:
            located = self._locate_decode_failure(e)
            return (e, False) if located is None else (located, False)
        return original, original is not e and isinstance(original, DatasetError)

    def _source_depth(self, spec: SourceSpec) -> int:
        """Batches the workers compute ahead: one per worker and ``prefetch`` more, as many as fit in half of this
        rank's share of /dev/shm (the node's ranks share it, and NCCL uses it too; a mixture's datasets split it by
        batch share), with a warning where fewer."""
        if not self._num_workers:  # (no parallel source: the depth is unused)
            return self._prefetch
        shm = shm_bytes()
        batch = batch_bytes_estimate(spec)
        budget = None if shm is None else int(shm // local_world_size() // 2 * self._shm_fraction)
        depth = source_queue_depth(self._prefetch, self._num_workers, batch_bytes=batch, shm_budget=budget)
        wanted = source_queue_depth(self._prefetch, self._num_workers)
        if depth < wanted:
            warn_once(
                logger,
                "/dev/shm holds %d MiB for this rank's batches (half its share): the workers compute %d batches ahead "
                "instead of %d (a batch is about %.0f MiB), so some of the %d wait; %s",
                (budget or 0) >> 20, depth, wanted, batch / 2**20, self._num_workers, shared_memory_note(shm),
            )  # fmt: skip
        return depth

    def _locate_decode_failure(self, error: Exception) -> Exception | None:
        """A failure in the pipeline itself (not a worker) may be DALI rejecting a clip; name its file."""
        if all(route.dali_device is None for route in self.routes.values()):
            return None
        epoch, start = self._stream.epoch, self._stream.samples_consumed
        # The batches DALI's decoder may have had: those in the pipeline (prefetch), the one failing among them, and
        # as many more (the source's queue is deeper, but its batches reach no decoder before these).
        stop = min(self._stream.num_samples(), start + (2 * self._prefetch + 2) * self.batch_size)
        source = BatchSource(self._spec)
        try:
            return locate_clip_failure(source, epoch, start, stop, device_id=self._device_id, cause=error)
        except DatasetError as e:  # rebuilding the clips failed: that error names its file
            return e
        except Exception:  # anything else says less than the original (which names the samples): keep that
            logger.warning("rebuilding the clips after a pipeline failure failed too", exc_info=True)
            return None
        finally:
            source.close()

    def _to_batch(self, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for name in self._names:
            if name in (HOST_TASK_INDEX, HOST_SUBTASK_INDEX):
                continue
            tensor = out[name]
            if name in self._host_value_keys:
                batch[name] = decode_host_values(tensor.numpy())
                continue
            if name in self.routes and self.windows.squeeze_camera(name):
                tensor = tensor.squeeze(1)
            elif name in self.reader.image_keys and name not in self.windows.delta_index:
                tensor = tensor.squeeze(1)  # as LeRobot: image rows are tabular, windowed only with deltas
            if tensor.device != self._device:
                tensor = tensor.to(self._device, non_blocking=True)
            batch[name] = tensor
        task_index = out.get(HOST_TASK_INDEX, out.get("task_index"))
        episodes, datasets = out["episode_index"], out.get(DATASET_INDEX)
        batch["task"] = self._task_strings(task_index, episodes, datasets) if task_index is not None else []
        subtask_index = out.get(HOST_SUBTASK_INDEX, out.get("subtask_index"))
        if self.reader.subtasks is not None and subtask_index is not None:  # (LeRobot 0.4-0.5's `subtask`)
            batch["subtask"] = self._task_strings(subtask_index, episodes, datasets, name="subtask")
        return batch

    def _task_strings(
        self,
        task_index: torch.Tensor,
        episode_index: torch.Tensor,
        dataset_index: torch.Tensor | None = None,
        *,
        name: str = "task",
    ) -> list[str]:
        """The texts of ``task_index`` (``name="subtask"``: of ``subtask_index``, from ``meta/subtasks.parquet``).
        ``dataset_index``: a union's rows', which name the dataset of a row whose index the list lacks."""
        tasks = self.reader.tasks if name == "task" else self.reader.subtasks or {}
        # (a row no subtask annotates: "", unless the list gives -1 a text, as LeRobot reads it)
        none = NO_SUBTASK_INDEX if name == "subtask" and NO_SUBTASK_INDEX not in tasks else None
        indices = task_index.cpu().reshape(-1).tolist()
        try:
            return ["" if i == none else tasks[int(i)] for i in indices]
        except KeyError:
            bad = [row for row, i in enumerate(indices) if int(i) not in tasks and i != none]
            row, more = bad[0], len(bad) - 1

            def of_row(values: torch.Tensor) -> int:  # (a sample's first, where a window gave it several)
                return int(values.cpu().reshape(len(indices), -1)[row, 0])

            dataset = None if dataset_index is None else of_row(dataset_index)
            error = self.reader.unlisted_index_error(name, int(indices[row]), of_row(episode_index), dataset, more=more)
            raise error from None

    def _close_pipeline(self) -> None:
        """Shut the pipeline and its worker processes down now: a generator from ``iter(it)`` (or the traceback
        of a failed pass) may still hold it, and would keep the workers running until garbage collection.

        The pipeline and its source are let go once closed: let go before, a signal's exception (Ctrl-C) as DALI's
        shutdown began, as its backend's Shutdown() returned or as the source's close began left them to the cycle
        collector or DALI's exit handler, and the next close() found nothing to close (3 of 22 points a handler runs
        in close() and the functions it calls; 0 of 29 now). One whose close failed (an Exception) is let go too:
        kept, it failed again in every later close() and pass."""
        pipeline, source = getattr(self, "_pipeline", None), getattr(self, "_source", None)
        self._pipeline_next = None
        self._dali_iter = None
        try:
            if pipeline is not None:
                self._let_go_once_closed("_pipeline", lambda: _close_and_shut_down(pipeline))
        finally:
            if source is not None:  # (without workers it ran here, and opened files): closed even if DALI failed
                self._let_go_once_closed("_source", source.close)

    def _let_go_once_closed(self, name: str, close: Callable[[], None]) -> None:
        """``close()``, then the attribute ``name`` let go (None), also where the close failed (an Exception); not where
        a signal's exception (Ctrl-C, a SIGTERM handler's sys.exit) ended it: the next close() finishes it."""
        try:
            close()
        except Exception:
            setattr(self, name, None)
            raise
        setattr(self, name, None)

    def __enter__(self) -> DALILeRobotIterator:
        """``with DALILeRobotIterator(...) as it:`` closes it (:meth:`close`) as the block ends, by an error too."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (and the prefetcher) and close the files and decoders a pipeline without workers
        opened here, now rather than at garbage collection.

        Safe from another thread: a pass waiting in DALI's next() there is woken (its workers are stopped) and
        raises :class:`IteratorClosedError`; this call returns once that pass has let the pipeline go, or after
        ``CLOSE_WAIT_S`` with a warning, leaving the pipeline to that pass (or to one still building it), which closes
        it as DALI's next() returns (its next batch raises IteratorClosedError), or once the build ends. From a signal
        handler on the thread of a pass holding the pipeline it is left to that pass, which closes everything as it
        lets go.

        In a child forked from the process that built the iterator it does nothing: what it would close is the
        parent's. Iterating again builds them anew; a remote dataset's prefetcher takes a cache slot again, as a new
        iterator does (the one given up may be another run's by then)."""
        self._close_by(close_deadline())

    def _close_by(self, deadline: float) -> bool:
        """close(), waiting for another thread's pass until ``deadline`` (:func:`close_deadline`) at most: a mixture's
        close() waits once in all, not once per dataset. Whether it closed everything (else it is left to a pass)."""
        if getattr(self, "_pid", None) != os.getpid():
            return True  # (nothing here is this process's to close)
        lock = getattr(self, "_next_lock", None)
        if lock is None:  # (__del__ of an iterator whose __init__ raised before making it: no pass to wait for)
            self._close_held()
            return True
        if fork_locks.held_here(lock):
            # A signal handler on the thread of a pass that holds the pipeline: inside DALI's next(), closing the
            # workers waits for a condition that thread holds (a hang); building it, the build went on to hand a
            # working pass out, its workers running, after this close(). The pass closes everything as it lets go.
            self._dali_iter = None
            self._close_deferred = threading.get_ident()
            return False
        # The lock is taken inside the try whose finally lets it go, and let go only where this thread holds it (no
        # other statement can note a taking: a signal's exception lands right after acquire() returns, before the
        # next one runs). Taken before that try, a Ctrl-C there left the lock held by this thread for ever: every
        # later close() on it was left to a pass that never came and one on another thread (__del__, the exit
        # handler's) waited CLOSE_WAIT_S and gave up, the pipeline and prefetcher left running (a KeyboardInterrupt
        # after each call close() makes: 1 of 12 points; 1 of 14 as another thread's pass is inside DALI's next()).
        try:
            if not lock.acquire(blocking=False):
                self._dali_iter = None  # tells the pass in next() that its failure (or batch) is a close
                # A pass building its pipeline (a remote dataset's warm-up, workers slow to start) overwrote the None
                # above and read on, after this close(), with its pipeline and workers (3 of 3 batches): counted, so
                # that it closes what it built once built. Counted before the wait (no call between the two: no
                # signal's exception lands there), not once it gave up: a Ctrl-C on this thread in the wait or its
                # warning left it uncounted (5 of 10 points a signal's handler runs at in close() and its callees),
                # and a build that ended as the wait gave up checked the count before it changed, and read on (1 of
                # 1). Where this close takes the lock after all, the pass's close of what it built is one more.
                self._closes_left_to_pass += 1
                _close_workers(self._pipeline)  # ends the wait on the workers; the pass shuts the rest down
                left = (
                    "inside DALI's next() or building its pipeline",
                    "the pipeline is left to it (shutting it down under the call could crash the process): that pass "
                    "closes it as the call returns, or once the build ends",
                )
                if not wait_for_pass(lock, deadline, *left):
                    return False  # (given up: left to the pass, counted above)
            self._close_held()
            # (another thread's handler's close(), left to frames of its own that let the lock go, is done: left set,
            # it closed the next pass that thread started, which came after this close(): 1 of 1)
            if self._close_deferred != threading.get_ident():
                self._close_deferred = 0
        finally:
            try:  # (no call before it: a signal's exception lands only after a call returns, or a jump back)
                lock.release()
            except RuntimeError:  # not taken: a pass holds it still, or the exception landed before acquire()
                pass
            else:
                # A signal handler's close() while this one held the lock was left to this one, which did it. Cleared
                # once the lock is let go: one landing between the clearing and the release stayed left, and the next
                # pass closed what it built (a close() at each line close() runs: 2 of 12). Left set if a second
                # signal's exception landed before the pipeline was closed: the deferred close is run again. Another
                # thread's (set while that thread held the lock) is cleared above once everything is closed, and
                # left set where closing failed: that thread's pass runs it.
                # (getattr: also run by __del__ of an iterator whose __init__ raised before setting them)
                closed = getattr(self, "_pipeline", None) is None
                if closed and getattr(self, "_close_deferred", 0) == threading.get_ident():
                    self._close_deferred = 0
        return True

    def _close_held(self) -> None:
        """close() with the pass's lock taken: the pipeline, then the prefetcher (even when DALI's shutdown failed)."""
        try:
            self._close_pipeline()
        finally:
            self._close_prefetcher()

    def _close_prefetcher(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            self._slot_given_up = True  # (its cache's slot, for the next run to take: a next pass takes one again)
            prefetcher.close()
            self._prefetcher = None

    @property
    def camera_channels(self) -> dict[str, int]:
        """Colour channels of each camera's frames, in batch order: 3, or 1 for grey image cameras (a model's
        input layers need it before the first batch)."""
        return {camera: self._image_channels.get(camera, 3) for camera in self.reader.all_camera_keys}

    @property
    def prefetcher(self) -> Prefetcher | None:
        """The prefetcher of a remote dataset (its ``stats`` count cached and fetched ranges), else None (also once
        closed, until the next pass starts another)."""
        return self._prefetcher

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # As the interpreter ends, the exit handler has closed every live iterator, and the modules this close would
        # call may be emptied already (an iterator kept alive by a module that keeps __main__, as dill does: "TypeError:
        # 'NoneType' object is not callable" printed at exit, 1 of 1 with `import dill`, so with LeRobot).
        if not _finalizing():
            self.close()  # the prefetcher's thread refers to itself: without this it outlives the iterator


#: DALI's worker pool closes are not safe to run in two threads at once (a foreign close() and the pass).
#: Reentrant: the cycle collector may run inside a close, and an iterator it frees closes its own pool there (a plain
#: lock hung that thread for good). That pool is another one: the one being closed is held by the frames below.
_workers_close_lock = fork_locks.rlock()


def _build_line(workers: int, pipelines: str) -> str:
    """What a build is doing, where it takes long: mostly starting the worker processes."""
    starting = f"starting {workers} worker process{'es' * (workers != 1)} and " if workers else ""
    return f"lerobot-dali: {starting}building {pipelines}"


@contextmanager
def builds_said_together(parts: Sequence[DALILeRobotIterator]) -> Iterator[None]:
    """Within, ``parts`` whose passes start (their pipelines built side by side: a mixture's datasets) say their
    builds as one wait, their workers summed, where it takes long: each said its own pair of lines (12 for a
    mixture of 6 datasets)."""
    building = [part for part in parts if part._builds_pipeline()]
    if len(building) == 1:
        pipelines = f"the DALI pipeline of {building[0].reader.location.description}"
    else:
        pipelines = f"the DALI pipelines of {len(building)} datasets"
    workers = sum(part._num_workers for part in building)
    for part in parts:
        part._says_build = False
    try:
        with said_if_long(
            _build_line(workers, pipelines),
            logger=logger,
            delay_s=BUILD_PROGRESS_DELAY_S,
            enabled=bool(building) and parts[0]._shows_progress,
        ):
            yield
    finally:
        for part in parts:
            part._says_build = True


def _shut_down(pipeline: Any) -> None:
    """DALI's ``pipeline._shutdown()``, its backend taken from it before its Shutdown(): no signal's handler runs
    between the two (no call), so one landing as Shutdown() returns leaves no backend for a later close() (or DALI's
    exit handler, or ``__del__``) to shut down a second time, as ``_shutdown`` left it."""
    backend, pipeline._pipe = pipeline._pipe, None  # (DALI's private backend, which _shutdown() passes by if None)
    if backend is not None:
        backend.Shutdown()
    pipeline._shutdown()  # (no backend left: it drops the pipeline from DALI's registry of those to shut down at exit)


def close_deadline() -> float:
    """When a close() starting now stops waiting for passes (``time.monotonic()``): ``CLOSE_WAIT_S`` from now."""
    return time.monotonic() + CLOSE_WAIT_S


def wait_for_pass(lock: Any, deadline: float, doing: str, left: str) -> bool:
    """close() from a thread other than the pass's: whether it took ``lock``, which the pass holds while ``doing``,
    by ``deadline`` (:func:`close_deadline`: one for all the waits of a close, a mixture's for its own lock and each
    dataset's, which waited up to ``CLOSE_WAIT_S`` each, 3 times as long for 2 datasets); else a warning says what is
    ``left`` to that pass, and close() returns."""
    if lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return True
    if exiting():  # (the exit handler says once what it left, for every iterator: :mod:`.exit_close`)
        return False
    logger.warning(
        "close(): a pass is still %s after %g s; %s, and raises IteratorClosedError at its next batch",
        doing, CLOSE_WAIT_S, left,
    )  # fmt: skip
    return False


def _close_and_shut_down(pipeline: Any) -> None:
    """Stop the pipeline's worker processes, then shut it down (even where stopping them failed)."""
    try:
        _close_workers(pipeline)
    finally:
        _shut_down(pipeline)


def _close_workers(pipeline: Any) -> None:
    workers = getattr(pipeline, "_py_pool", None)  # DALI's worker pool (private; no public close)
    if workers is not None:
        with _workers_close_lock:
            workers.close()


def _release_pipeline_frames(error: BaseException, outer: BaseException | None) -> None:
    """Drop the local variables of the finished frames in ``error``'s tracebacks (and its causes', down to
    ``outer``, the caller's own error being handled, whose frames are the caller's): DALI's frames hold the
    closed pipeline, whose workers' shared memory (a few batches) would otherwise live as long as the caller
    keeps the error, or until the cycle collector runs. The tracebacks still print in full."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and current is not outer and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def warn_of_another_seed(seed: int | None, saved: int | None, what: str) -> None:
    """Warn once that a state loaded into ``what`` (built with ``seed``) was ``saved`` with another seed (None: one not
    known), which the resume keeps: a run resumed with another ``seed=`` said so at INFO alone, though it shuffled and
    augmented by the saved one, not by the seed it was given."""
    if saved == seed:
        return
    saved_with = "another seed" if saved is None else f"seed={saved}"
    warn_once(logger,
        "resuming a state saved with %s in %s built with seed=%s: the saved seed is kept, so the saved run's order and "
        "augmentation draws go on (this epoch and later ones); build it with %s to say so, or start without the state "
        "for seed=%s's",
        saved_with, what, seed, "the saved run's seed" if saved is None else f"seed={saved}", seed,
    )  # fmt: skip


def _refuse_mixture_state(state_dict: object) -> None:
    """A :class:`~lerobot_dali.mixture.DALILeRobotMixture`'s state (one stream state per dataset) is not one
    iterator's: say so, rather than call it a state of another lerobot_dali version."""
    if isinstance(state_dict, Mapping) and "mixture" in state_dict and "version" not in state_dict:
        raise ResumeStateError(
            "this is the state of a DALILeRobotMixture (DALILeRobotMixture.state_dict: one stream state per "
            "dataset), not of one iterator: load it into a mixture of the same datasets, or start this iterator "
            "afresh (a union, concat_datasets, deals its episodes in another order)"
        )


def _raise_original(error: Exception) -> None:
    original = original_worker_error(error)
    if original is not None:
        raise original from error
    raise error


def prefetch_lookahead(batch_size: int, prefetch: int, num_workers: int) -> int:
    """Samples past the consumed ones whose episodes a remote dataset's prefetcher keeps local: every batch that may
    be in flight (the source's queue, :func:`~.dali_graph.source_queue_depth`, and the pipeline's ``prefetch``) and
    one more, or the older count where larger, ``(prefetch + 1)`` batches a worker and one more. With 1 worker that
    older count was a batch short of those in flight, whose last one's episodes were read remotely."""
    in_flight = 1 + source_queue_depth(prefetch, num_workers) + prefetch if num_workers else 1 + prefetch
    return batch_size * max(in_flight, (prefetch + 1) * max(1, num_workers) + 1)


def default_dali_threads(num_workers: int) -> int:
    """DALI's own threads for a rank: what its CPUs leave after the source's worker processes, 2 to 8. They run
    the CPU operators, and on a GPU the NVDEC decoder decodes as many clips at once as it has threads (an H100
    has 7 NVDEC engines)."""
    return max(2, min(8, cpus_per_local_rank() - num_workers))
