"""The plain data every part of ``lerobot-dali bench`` shares: the loader names, the dataset under test, what
every loader reads from it (:class:`LoadPlan`), and one loader's measured result (:class:`LoaderResult`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from .value_checks import check_choice

__all__ = [
    "DALI_CPU_DECODE_LOADER",
    "DALI_CPU_DECODE_RGB_LOADER",
    "DALI_LOADER",
    "DALI_SHARED_CLIPS_LOADER",
    "LEROBOT_LOADER",
    "LEROBOT_STREAMING_LOADER",
    "LOADERS",
    "METRIC_FIELDS",
    "PLAIN_LOADER",
    "BenchDataset",
    "ClipFootprint",
    "LoadPlan",
    "LoaderResult",
]

DALI_LOADER = "lerobot-dali"
DALI_SHARED_CLIPS_LOADER = "lerobot-dali-shared-clips"
DALI_CPU_DECODE_LOADER = "lerobot-dali-cpu-decode"
DALI_CPU_DECODE_RGB_LOADER = "lerobot-dali-cpu-decode-rgb"
DALI_CPU_MODE_LOADER = "lerobot-dali-cpu-mode"
PLAIN_LOADER = "pyav-dataloader"
LEROBOT_LOADER = "lerobot"
LEROBOT_STREAMING_LOADER = "lerobot-streaming"
LOADERS: tuple[str, ...] = (
    DALI_LOADER,
    DALI_SHARED_CLIPS_LOADER,
    DALI_CPU_DECODE_LOADER,
    DALI_CPU_DECODE_RGB_LOADER,
    DALI_CPU_MODE_LOADER,
    PLAIN_LOADER,
    LEROBOT_LOADER,
    LEROBOT_STREAMING_LOADER,
)
"""Every loader name ``--loaders`` accepts, in the order they run."""

_OURS = (
    DALI_LOADER,
    DALI_SHARED_CLIPS_LOADER,
    DALI_CPU_DECODE_LOADER,
    DALI_CPU_DECODE_RGB_LOADER,
    DALI_CPU_MODE_LOADER,
)
# GPU machines only: on the CPU lerobot-dali decodes on the CPU already, makes RGB in its workers, and is the
# CPU mode; on a GPU the CPU mode (pipeline on the CPU, batches copied to the GPU) runs beside the GPU routes.
_GPU_ONLY = (DALI_SHARED_CLIPS_LOADER, DALI_CPU_DECODE_LOADER, DALI_CPU_DECODE_RGB_LOADER, DALI_CPU_MODE_LOADER)
# Peers from another library: an exception there is reported, not a failed run (zero frames still is).
_EXTERNAL = (LEROBOT_LOADER, LEROBOT_STREAMING_LOADER)


@dataclass(frozen=True)
class BenchDataset:
    """A dataset under test: a label for the report, where it is, and what of it is read."""

    label: str
    path: str
    codec: str | None = None
    #: Cameras and tabular keys to read (None: all declared), as ``open_dataset``'s ``cameras`` and ``keys``:
    #: for datasets that declare a camera never recorded, or a column that drifted from info.json.
    cameras: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None
    #: How rows find their video frames, as ``DALILeRobotIterator``'s options of the same names: ``"frame_index"``
    #: for wall-clock parquet timestamps (``cr5_*``), a wider tolerance for data slower than its video (``r1``).
    timestamp_source: str = TimestampSource.PARQUET_TIMESTAMP.value
    tolerance_s: float = DEFAULT_TOLERANCE_S
    #: Several datasets of one layout read as one (``path`` is the first's): lerobot-dali's ``concat_datasets``,
    #: LeRobot's ``MultiLeRobotDataset``, a ``ConcatDataset`` of the plain peer's.
    members: tuple[str, ...] = ()
    #: With ``members``: how each one's rows find their frames (``concat_datasets``' per-dataset values, which
    #: override ``timestamp_source`` and ``tolerance_s``); empty: those two, for every member.
    member_timestamp_sources: tuple[str, ...] = ()
    member_tolerances_s: tuple[float, ...] = ()

    def open(self) -> Any:
        """The dataset's reader (``concat_datasets`` of the members where there are several)."""
        if self.members:
            from .dataset_union import concat_datasets

            sources = [check_choice(TimestampSource, "timestamp_sources", s) for s in self.member_timestamp_sources]
            return concat_datasets(
                self.members, cameras=self.cameras, keys=self.keys,
                timestamp_sources=sources or None, tolerances_s=self.member_tolerances_s or None,
            )  # fmt: skip
        from .dataset_reader import open_dataset

        return open_dataset(self.path, cameras=self.cameras, keys=self.keys)

    @property
    def remote(self) -> bool:
        """Whether any dataset read is off this machine (a union may mix local and remote members)."""
        return any(not os.path.isdir(path) for path in self.members or (self.path,))

    def lookups(self) -> list[tuple[str, str, float]]:
        """``(path, timestamp_source, tolerance_s)`` of each dataset read: the one, or each member."""
        paths = self.members or (self.path,)
        sources = self.member_timestamp_sources or (self.timestamp_source,) * len(paths)
        tolerances = self.member_tolerances_s or (self.tolerance_s,) * len(paths)
        return list(zip(paths, sources, tolerances, strict=True))


class ClipFootprint(NamedTuple):
    """Per sample, over its cameras: the bytes of the clips cut for its windows and of the files they come from;
    and the frames decoded per distinct frame shown (from each window's preceding keyframe: 1 where every frame is
    a keyframe, about half the GOP for a single frame in long GOPs). The clip route decodes each sample's clips;
    the CPU route decodes a batch's frames of one file together, so it decodes no more."""

    clip_bytes: float
    file_bytes: float
    decoded_per_frame: float


@dataclass(frozen=True)
class LoadPlan:
    """What every loader reads on one dataset: windows, output size, augmentation (lerobot-dali only)."""

    delta_timestamps: dict[str, list[float]]
    image_size: tuple[int, int] | None
    augment: Any  # AugmentConfig | None; DALI is imported only where it is used
    camera_keys: tuple[str, ...]
    frames_per_sample: int
    #: Frames at the end of every episode never sampled (a recipe's, as LeRobot's train script gives its
    #: ``EpisodeAwareSampler``): lerobot-dali leaves them out itself, the map-style peers through their sampler.
    drop_n_last_frames: int = 0


@dataclass(frozen=True, kw_only=True)
class LoaderResult:
    """One loader on one dataset. Metrics a loader cannot have are ``None`` (never absent)."""

    dataset: str
    loader: str
    #: "ok"; "zero-frames" (ran, measured nothing); "error" (raised, see ``note``); "skipped" (not available).
    status: str
    note: str = ""
    routes: str = ""
    batches: int = 0
    samples: int = 0
    frames: int = 0
    window_s: float = 0.0
    frames_per_s: float = 0.0
    samples_per_s: float = 0.0
    first_batch_s: float | None = None
    batch_p50_ms: float | None = None
    batch_p95_ms: float | None = None
    batch_p99_ms: float | None = None
    peak_rss_mb: float | None = None
    #: The same tree's proportional set size (shared pages split among the processes that map them; Linux only).
    peak_pss_mb: float | None = None
    gpu_max_allocated_mb: float | None = None
    gpu_peak_used_mb: float | None = None
    episodes_per_batch: float | None = None
    clip_bytes_per_sample: float | None = None
    video_bytes_per_sample: float | None = None
    clip_to_file_ratio: float | None = None
    #: Remote datasets (lerobot-dali loaders): requests to the remote, in total and per epoch (``"412 0 0"``;
    #: epochs split where the loop crossed them, so DALI's read-ahead shifts a few requests across), bytes
    #: fetched vs bytes of the dataset's files, seconds spent in requests and in CPU decode (summed over the
    #: process and its workers), and the share of worker reads served by the prefetch cache.
    remote_requests: int | None = None
    remote_requests_per_epoch: str | None = None
    fetched_mb: float | None = None
    dataset_files_mb: float | None = None
    fetch_s: float | None = None
    decode_s: float | None = None
    cache_hit_ratio: float | None = None
    vs_best_peer: float | None = None
    #: The loader ``vs_best_peer`` divides by: the fastest on this dataset that is not lerobot-dali.
    best_peer: str | None = None
    #: ``--repeats``: runs of this loader; the row is the median run, ``vs_best_peer`` the median of the runs'
    #: ratios (each against its own round's best peer). Every run's frames/s and ratio, in run order.
    repeats: int = 1
    frames_per_s_runs: str | None = None
    vs_best_peer_runs: str | None = None
    fraction_of_decode_ceiling: float | None = None
    #: The machine's 1-minute load average as this run started: other work on the machine (or the default run's
    #: dataset generation just before) slows every loader, so a run's frames/s reads against its own load.
    load_1m: float | None = None


METRIC_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LoaderResult))
"""Columns of the CSV and keys of every result in the JSON."""
