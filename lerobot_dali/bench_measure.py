"""Measuring one loader of ``lerobot-dali bench``, alone in a fresh spawned process.

Only loading is measured: the consumer moves each batch to the device and nothing else. The first ``warmup``
batches are not measured; throughput is frames (or samples) over the wall clock from the end of the warm-up
to the end of the last measured batch. Peak memory is the whole process tree of the loader (its process and
every worker), sampled.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import io_stats
from .bench_types import (
    _EXTERNAL,
    _OURS,
    DALI_CPU_DECODE_RGB_LOADER,
    DALI_CPU_MODE_LOADER,
    DALI_LOADER,
    DALI_SHARED_CLIPS_LOADER,
    LEROBOT_LOADER,
    LEROBOT_STREAMING_LOADER,
    LOADERS,
    PLAIN_LOADER,
    BenchDataset,
    LoaderResult,
    LoadPlan,
)
from .cache_dirs import CACHE_ENV
from .dataset_union import DATASET_INDEX
from .episode_pieces import EpisodePieces
from .frame_lookup import TimestampSource
from .new_folder import remove_dead_run_folders, run_folder
from .parent_watch import exit_with_parent
from .progress_lines import progress_counter
from .value_checks import check_choice

__all__ = ["LoaderJob", "TreeMemorySampler", "measure_loader", "run_in_child"]

logger = logging.getLogger(__name__)
#: The bench's own progress lines (which loader runs, batches done): shown at INFO even where the log level is
#: WARNING (:func:`show_progress`), since a run lasts minutes and a log file or ``docker run`` without ``-t``
#: has no progress bar.
progress_log = logging.getLogger("lerobot_dali.bench.progress")
#: Name beside which, in the system's temporary folder, each measuring process gets a folder of its own.
_SCRATCH = "lerobot-dali-bench"


def show_progress() -> None:
    """Let :data:`progress_log` through whatever the root level is (called by the bench's processes)."""
    if progress_log.getEffectiveLevel() > logging.INFO:
        progress_log.setLevel(logging.INFO)


@dataclass(frozen=True, kw_only=True)
class LoaderJob:
    """Everything the child process needs (picklable: plain data and lerobot_dali types only)."""

    loader: str
    dataset: BenchDataset
    plan: LoadPlan
    batch_size: int
    num_workers: int
    pool_size: int
    device: str
    steps: int
    warmup: int
    seed: int
    log_level: int


class TreeMemorySampler(threading.Thread):
    """Peak memory of this process plus all its descendants (and device memory in use), sampled.

    Two sums, since neither alone says what a machine with one such loader per GPU needs. Resident sizes count
    pages shared between processes (DALI's and a DataLoader's shared-memory batches, fork copy-on-write, shared
    libraries) once per process that maps them: an upper bound. Proportional sizes (PSS, Linux) split each shared
    page among the processes mapping it, so their sum is the tree's own share of the machine's memory.
    """

    def __init__(self, *, interval_s: float = 0.05, cuda_device: int | None = None) -> None:
        super().__init__(name="bench-memory", daemon=True)
        self.interval_s = interval_s
        self.cuda_device = cuda_device
        self.peak_rss_bytes: int | None = None
        #: None where the system gives no proportional size (not Linux) for some process of the tree.
        self.peak_pss_bytes: int | None = None
        self.peak_gpu_used_bytes: int | None = None
        self._gpu_baseline: int | None = None
        self._pss_known = True
        self._stop_event = threading.Event()
        try:
            import psutil

            self._process: Any = psutil.Process()
        except ImportError:
            self._process = None
            logger.warning("psutil is not installed: peak RSS and PSS are not measured (pip install psutil)")

    def _sample(self) -> None:
        if self._process is not None:
            import psutil

            rss = pss = 0
            for proc in [self._process, *self._process.children(recursive=True)]:
                info = self._memory(proc, psutil)
                if info is None:
                    continue  # ended between the listing and the read
                rss += info.rss
                self._pss_known = self._pss_known and hasattr(info, "pss")
                pss += getattr(info, "pss", 0)
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, rss)
            self.peak_pss_bytes = max(self.peak_pss_bytes or 0, pss) if self._pss_known else None
        if self.cuda_device is not None:
            import torch

            free, total_bytes = torch.cuda.mem_get_info(self.cuda_device)
            used = total_bytes - free
            if self._gpu_baseline is None:
                self._gpu_baseline = used
            self.peak_gpu_used_bytes = max(self.peak_gpu_used_bytes or 0, used - self._gpu_baseline)

    def _memory(self, proc: Any, psutil: Any) -> Any:
        """One read for RSS and PSS where PSS is known (/proc/PID/smaps_rollup: ~0.2 ms for a 300 MB process)."""
        try:
            return proc.memory_full_info() if self._pss_known else proc.memory_info()
        except psutil.NoSuchProcess:
            return None
        except psutil.AccessDenied:
            self._pss_known = False  # its smaps are not readable here; its RSS is
        try:
            return proc.memory_info()
        except psutil.Error:
            return None

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._sample()
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self._sample()


def _build_loader(job: LoaderJob) -> tuple[Iterable[Any], str, Callable[[], None]]:
    """The loader as an iterable of epochs' batches, its decode routes (ours), and how to close it."""
    import torch
    from torch.utils.data import DataLoader

    plan = job.plan
    if job.loader in _OURS:
        from .cpu_decode_options import ColorConversion, CpuDecodeOptions
        from .iterator import DALILeRobotIterator

        rgb_in_workers = job.loader == DALI_CPU_DECODE_RGB_LOADER
        it = DALILeRobotIterator(
            job.dataset.open(), batch_size=job.batch_size, delta_timestamps=plan.delta_timestamps or None,
            shuffle=True, seed=job.seed, episode_pool_size=job.pool_size,
            rank=0, world_size=1,  # one process reads the whole dataset, as the peers do, whatever RANK says
            device="cpu" if job.loader == DALI_CPU_MODE_LOADER else job.device,
            decode="auto" if job.loader in (DALI_LOADER, DALI_SHARED_CLIPS_LOADER) else "cpu",
            share_clips=job.loader == DALI_SHARED_CLIPS_LOADER, num_workers=job.num_workers,
            image_size=plan.image_size, augment=plan.augment, drop_last=True,
            cpu_decode=CpuDecodeOptions(
                color_conversion=ColorConversion.WORKER if rgb_in_workers else ColorConversion.AUTO
            ),
            timestamp_source=check_choice(TimestampSource, "timestamp_source", job.dataset.timestamp_source),
            tolerance_s=job.dataset.tolerance_s,
            drop_n_last_frames=plan.drop_n_last_frames,
        )  # fmt: skip
        routes = " ".join(f"{k.rsplit('.', 1)[-1]}={r.value}" for k, r in it.routes.items())
        return it, routes, it.close
    from . import bench_peers

    close: Callable[[], None] | None = None
    if job.loader == PLAIN_LOADER:
        parts = [
            bench_peers.PyAVFrameDataset(
                path,
                delta_timestamps=plan.delta_timestamps,
                image_size=plan.image_size,
                cameras=job.dataset.cameras,
                keys=job.dataset.keys,
                timestamp_source=source,
                tolerance_s=tolerance,
                dataset_index=i if job.dataset.members else None,
            )
            for i, (path, source, tolerance) in enumerate(job.dataset.lookups())
        ]
        dataset: Any = parts[0] if len(parts) == 1 else torch.utils.data.ConcatDataset(parts)
    elif job.loader == LEROBOT_LOADER and job.dataset.members:
        dataset, close = bench_peers.lerobot_multi_dataset(
            job.dataset.members,
            delta_timestamps=plan.delta_timestamps,
            image_size=plan.image_size,
            tolerances_s=[tolerance for _, _, tolerance in job.dataset.lookups()],
        )
    elif job.loader == LEROBOT_LOADER:
        dataset = bench_peers.lerobot_dataset(
            job.dataset.path,
            delta_timestamps=plan.delta_timestamps,
            image_size=plan.image_size,
            tolerance_s=job.dataset.tolerance_s,
        )
    elif job.loader == LEROBOT_STREAMING_LOADER:
        dataset = bench_peers.lerobot_streaming_dataset(
            job.dataset.path,
            delta_timestamps=plan.delta_timestamps,
            image_size=plan.image_size,
            seed=job.seed,
            tolerance_s=job.dataset.tolerance_s,
        )
    else:
        raise ValueError(f"unknown loader {job.loader!r}; loaders are {', '.join(LOADERS)}")
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    sampler = None
    if plan.drop_n_last_frames and not iterable:
        kept = sampled_frames(job.dataset.open().episodes.length, len(dataset), plan.drop_n_last_frames)
        sampler = torch.utils.data.SubsetRandomSampler(kept.tolist(), generator=torch.Generator().manual_seed(job.seed))
    # Workers fork, as a DataLoader's do by default on Linux; this process was spawned, so say it explicitly.
    # Remote datasets spawn: fsspec's async clients (HTTP, s3, gcs) refuse to run in a forked child.
    context = "fork" if job.num_workers > 0 and sys.platform == "linux" else None
    if context and job.dataset.remote:
        context = "spawn"
    loader = DataLoader(
        dataset, batch_size=job.batch_size, shuffle=not iterable and sampler is None, sampler=sampler,
        num_workers=job.num_workers, drop_last=True,
        pin_memory=job.device.startswith("cuda"), persistent_workers=job.num_workers > 0,
        generator=torch.Generator().manual_seed(job.seed), multiprocessing_context=context,
    )  # fmt: skip
    return loader, "", close or (lambda: None)


def sampled_frames(episode_lengths: Sequence[int] | np.ndarray, dataset_len: int, drop_last: int) -> np.ndarray:
    """The indices a map-style peer samples when every episode's last ``drop_last`` frames are left out, as
    LeRobot's ``EpisodeAwareSampler`` gives them (its frames are the episodes' in order, as the reader's are)."""
    lengths = np.asarray(episode_lengths, dtype=np.int64)
    if int(lengths.sum()) != dataset_len:
        raise ValueError(
            f"the peer holds {dataset_len} frames where the dataset's episodes hold {int(lengths.sum())}: cannot "
            "tell which frames drop_n_last_frames leaves out"
        )
    kept = EpisodePieces.cut(lengths, None, drop_last=drop_last)
    first = np.cumsum(lengths) - lengths + kept.offset  # each episode's first kept frame in the dataset
    within = np.arange(int(kept.length.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(kept.length) - kept.length, kept.length
    )
    return np.repeat(first, kept.length) + within


def _frames_in(batch: Mapping[str, Any], camera_keys: Sequence[str]) -> int:
    """Frames a batch holds: ``B`` per camera, ``B * T`` for a camera window ``(B, T, C, H, W)``."""
    total = 0
    for key in camera_keys:
        shape = batch[key].shape
        total += int(shape[0]) * (int(shape[1]) if len(shape) == 5 else 1)
    return total


def _distinct_episodes(batch: Mapping[str, Any]) -> int:
    """Episodes a batch draws from. Datasets read as one keep their own episode numbers, so there an episode is a
    ``(dataset_index, episode_index)`` pair (episode 0 of two datasets counted once)."""
    import torch

    episodes = batch["episode_index"].cpu().reshape(-1)
    if DATASET_INDEX not in batch:
        return int(torch.unique(episodes).numel())
    pairs = torch.stack([batch[DATASET_INDEX].cpu().reshape(-1).long(), episodes.long()], dim=1)
    return int(torch.unique(pairs, dim=0).shape[0])


def _to_device(batch: Mapping[str, Any], device: Any) -> None:
    """The dummy consumer: every tensor of the batch onto the training device, and wait for the copies."""
    import torch

    moved = [v.to(device, non_blocking=True) for v in batch.values() if isinstance(v, torch.Tensor)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del moved


class _IoCounters:
    """Worker time of a lerobot-dali loader (decoding vs reading the dataset) and, on a remote dataset, its
    requests and bytes per epoch (see io_stats)."""

    def __init__(self, job: LoaderJob) -> None:
        self.enabled = job.loader in _OURS
        self.remote = job.dataset.remote
        self.per_epoch: list[int] = []
        self._seen = 0.0
        if self.enabled:
            self.folder = tempfile.mkdtemp(prefix="lerobot-dali-io-")
            os.environ[io_stats.STATS_ENV] = self.folder  # inherited by the DALI workers spawned later

    def close(self) -> None:
        """Remove the counters' folder once the loader and its workers are closed."""
        if self.enabled:
            os.environ.pop(io_stats.STATS_ENV, None)
            shutil.rmtree(self.folder, ignore_errors=True)

    def totals(self) -> dict[str, float]:
        io_stats.flush()
        time.sleep(0.3)  # the workers' flush threads write every 0.2 s
        return io_stats.collect(self.folder)

    def epoch_end(self) -> None:
        if self.enabled and self.remote:
            requests = self.totals().get("requests", 0.0)
            self.per_epoch.append(int(requests - self._seen))
            self._seen = requests

    def fields(self, loader: Any) -> dict[str, Any]:
        if not self.enabled:
            return {}
        totals = self.totals()
        # Decode: decoding plus cutting clips (reading their packets). Fetch: network reads on a remote dataset;
        # reading episode rows from parquet on a local one (local video bytes are read inside the decoder).
        times = {
            "decode_s": totals.get("decode_s", 0.0) + totals.get("clip_s", 0.0),
            "fetch_s": totals.get("fetch_s" if self.remote else "rows_s", 0.0),
        }
        if not self.remote:
            return times
        files_mb = None
        reader = getattr(loader, "reader", None)
        if reader is not None and reader.stamps is not None:
            files_mb = sum(stamp.size for stamp in reader.stamps.values()) / 2**20
        hit, miss = totals.get("cache_hit_bytes", 0.0), totals.get("cache_miss_bytes", 0.0)
        return {
            **times,
            "remote_requests": int(totals.get("requests", 0)),
            "remote_requests_per_epoch": " ".join(str(n) for n in self.per_epoch),
            "fetched_mb": totals.get("fetched_bytes", 0.0) / 2**20,
            "dataset_files_mb": files_mb,
            "cache_hit_ratio": hit / (hit + miss) if hit + miss else None,
        }


def measure_loader(job: LoaderJob) -> LoaderResult:
    """Run one loader for ``warmup + steps`` batches (over as many epochs as that takes) and measure it."""
    import torch

    device = torch.device("cuda", 0) if job.device.startswith("cuda") else torch.device("cpu")
    cuda_index = 0 if device.type == "cuda" else None
    if cuda_index is not None:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(cuda_index)
    sampler = TreeMemorySampler(cuda_device=cuda_index)
    sampler.start()
    total = job.warmup + job.steps
    counters = _IoCounters(job)
    built = time.perf_counter()
    loader, routes, close = _build_loader(job)
    window_start = previous = time.perf_counter()  # both reset by the warm-up's last batch (warmup >= 1)
    first_batch_s: float | None = None
    delivered = frames = samples = 0
    gaps: list[float] = []
    episodes: list[int] = []
    try:
        with progress_counter(
            total, desc=f"{_shortened(job.dataset.label, _LABEL_CHARS)} {job.loader}", unit="batch", logger=progress_log
        ) as progress:
            while delivered < total:
                epoch_batches = 0
                for batch in loader:
                    _to_device(batch, device)
                    now = time.perf_counter()
                    epoch_batches += 1
                    delivered += 1
                    progress(1)
                    if first_batch_s is None:
                        first_batch_s = now - built
                    if delivered <= job.warmup:
                        window_start = now
                    else:
                        gaps.append(now - previous)
                        frames += _frames_in(batch, job.plan.camera_keys)
                        samples += len(batch["index"])
                        episodes.append(_distinct_episodes(batch))
                    previous = now
                    if delivered >= total:
                        break
                paused = time.perf_counter()
                counters.epoch_end()
                bookkeeping = time.perf_counter() - paused  # the bench's own (it waits for the workers' counters)
                window_start, previous = window_start + bookkeeping, previous + bookkeeping
                if epoch_batches == 0:
                    break  # an epoch without a batch (dataset smaller than one batch): nothing more will come
        io_fields = counters.fields(loader)
    finally:
        close()
        counters.close()
        sampler.stop()
    window_s = previous - window_start if gaps else 0.0
    note = ""
    if frames == 0:
        note = (
            f"measured 0 frames ({delivered} batches delivered, {job.warmup} warm-up); a dataset smaller than "
            "one batch, or a loader that yields nothing"
        )
    ms = np.percentile(np.asarray(gaps) * 1000, [50, 95, 99]).tolist() if gaps else [None] * 3
    return LoaderResult(
        dataset=job.dataset.label,
        loader=job.loader,
        status="ok" if frames > 0 else "zero-frames",
        note=note,
        routes=routes,
        batches=len(gaps),
        samples=samples,
        frames=frames,
        window_s=window_s,
        frames_per_s=frames / window_s if window_s > 0 else 0.0,
        samples_per_s=samples / window_s if window_s > 0 else 0.0,
        first_batch_s=first_batch_s,
        batch_p50_ms=ms[0],
        batch_p95_ms=ms[1],
        batch_p99_ms=ms[2],
        peak_rss_mb=sampler.peak_rss_bytes / 2**20 if sampler.peak_rss_bytes else None,
        peak_pss_mb=sampler.peak_pss_bytes / 2**20 if sampler.peak_pss_bytes else None,
        gpu_max_allocated_mb=torch.cuda.max_memory_allocated(cuda_index) / 2**20 if cuda_index is not None else None,
        gpu_peak_used_mb=(sampler.peak_gpu_used_bytes or 0) / 2**20 if cuda_index is not None else None,
        episodes_per_batch=float(np.mean(episodes)) if episodes else None,
        **io_fields,
    )


_NOTE_CHARS = 1000
"""Most characters of a failed loader's note: this library's longest messages whole (their advice comes last)."""
_LABEL_CHARS = 40
"""Most characters of a dataset's label in a progress line (the bar's, or the log's), its start and end kept: cut to
its first 24, ``so100_pick_and_place_left_h264`` and ``..._av1`` read alike, as did the datasets read as one
(``a_v30_h264+a_v30_av1``); a generated set's (``h264_3cam_480x640_30fps_gop2_12ep_300f``) is whole."""


def _error_note(error: BaseException) -> str:
    """The report's note for a loader that raised: the error's type and message, shortened in the middle to
    :data:`_NOTE_CHARS`, so the advice at a message's end (what to pass instead) stays. An error a ``DataLoader``
    worker raised reads "Caught X in DataLoader worker process N." and then the worker's whole traceback: the note
    keeps the first line and the worker's error."""
    text = str(error)
    head, wrapped, worker_traceback = text.partition("\nOriginal Traceback")
    if not wrapped:
        return _shortened(f"{type(error).__name__}: {text}")
    lines = worker_traceback.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line.startswith(" ")), default=0)
    raised = " ".join(line.strip() for line in lines[last_frame + 1 :] if line.strip())
    return _shortened(f"{type(error).__name__}: {head.strip()} {raised}")


def _shortened(text: str, most: int = _NOTE_CHARS) -> str:
    """``text``, or its start and end around " ... " where it is longer than ``most`` characters."""
    if len(text) <= most:
        return text
    head = most * 2 // 5
    return f"{text[:head]} ... {text[len(text) - (most - head - 5) :]}"


def _child_main(job: LoaderJob, conn: Any, scratch: str | None = None) -> None:
    logging.basicConfig(level=job.log_level, format="%(levelname)s %(name)s: %(message)s")
    show_progress()
    if scratch is not None:  # every temporary folder of this process and its workers: the parent removes it
        exit_with_parent()  # (a parent gone leaves its folder to the next run, which must not pull it from under us)
        os.environ["TMPDIR"] = tempfile.tempdir = scratch
    # On-disk caches of its own (packet indexes, the remote prefetch cache): an earlier loader or run would
    # otherwise hand a remote dataset's loader a warm start. Its DALI workers inherit the variable.
    private_cache = tempfile.mkdtemp(prefix="lerobot-dali-bench-cache-")
    os.environ[CACHE_ENV] = private_cache
    try:
        result = measure_loader(job)
    except BaseException as e:
        logger.debug("loader %s failed", job.loader, exc_info=True)
        result = LoaderResult(dataset=job.dataset.label, loader=job.loader, status="error", note=_error_note(e))
        if job.loader not in _EXTERNAL:
            traceback.print_exc()
    finally:
        shutil.rmtree(private_cache, ignore_errors=True)
    conn.send(result)
    conn.close()


def run_in_child(job: LoaderJob) -> LoaderResult:
    """Measure ``job`` in a fresh spawned process; a child that dies without a result is a failure.

    The child's temporary folders (its private caches, its workers' counters) go in one of this process's
    :func:`~lerobot_dali.new_folder.run_folder` folders in the system's temporary folder, removed once the child ends,
    killed or not (a killed child left them in /tmp); the next run removes those of runs killed themselves."""
    base = Path(tempfile.gettempdir()) / _SCRATCH
    remove_dead_run_folders(base, "run", writer="bench")
    scratch = run_folder(base, "run")
    scratch.mkdir(mode=0o700)
    try:
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_child_main, args=(job, send, str(scratch)), name=f"bench-{job.loader}")
        process.start()
        send.close()
        try:
            result: LoaderResult = receive.recv()
        except EOFError:
            process.join()
            result = LoaderResult(
                dataset=job.dataset.label, loader=job.loader, status="error",
                note=f"the loader's process died (exit code {process.exitcode}) before reporting",
            )  # fmt: skip
        process.join()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result
