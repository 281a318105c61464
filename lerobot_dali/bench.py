"""``lerobot-dali bench``: data-loading throughput of lerobot-dali next to the loaders people use today.

Only loading is measured: the consumer moves each batch to the device and nothing else, so the numbers
are what a training loop could at most consume. Every loader gets the same dataset, windows, batch size
and worker count, and runs in a fresh spawned process of its own, so peak memory (the loader's whole
process tree: its process and every worker) and GPU memory belong to that loader alone, and no loader
inherits another's warm caches or threads.

Timing: the first ``warmup`` batches (at least one: the window starts at a delivered batch, and a loader's
start-up is its first-batch latency; by default as many as a loader queues ahead, see :func:`default_warmup`) are
not measured; throughput is frames (or samples) over the wall
clock from the end of the warm-up to the end of the last measured batch, which counts stalls between
batches that a sum of per-batch times would hide (the bench's own bookkeeping between epochs is left out).
Batch latency percentiles are over the gaps between consecutive measured batches; first-batch latency runs
from constructing the loader to its first batch.

Loaders (see :data:`LOADERS`): ``lerobot-dali`` (on a GPU: NVDEC where the GPU decodes the codec, CPU
fallback otherwise; on the CPU: the CPU mode), ``lerobot-dali-shared-clips`` (GPU machines only: the same with
``share_clips=True``, one clip per group of a batch's samples of a file), ``lerobot-dali-cpu-decode`` (GPU machines
only: frames
decoded by the CPU fallback, converted to RGB and augmented on the GPU), ``lerobot-dali-cpu-decode-rgb``
(the same with RGB made in the workers, to show what converting on the GPU gains),
``lerobot-dali-cpu-mode`` (GPU machines only: the whole pipeline on the CPU, batches moved to the GPU by the
consumer like the peers'), ``pyav-dataloader``
(always), and LeRobot's
``lerobot`` / ``lerobot-streaming`` when ``import lerobot`` works (skipped with a note otherwise). A GPU-only
loader ``--loaders`` names on the CPU is skipped with a note too.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .bench_limits import measure_ceilings
from .bench_measure import LoaderJob, progress_log, run_in_child
from .bench_report import BenchReport, format_table, write_report
from .bench_types import (
    _EXTERNAL,
    _GPU_ONLY,
    _OURS,
    DALI_LOADER,
    LEROBOT_STREAMING_LOADER,
    LOADERS,
    METRIC_FIELDS,
    BenchDataset,
    ClipFootprint,
    LoaderResult,
    LoadPlan,
)
from .cache_dirs import cache_root
from .cli_options import check_image_size
from .cpu_backends import cpu_decoders
from .distributed import require_cuda, usable_cpus
from .errors import DatasetError
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from .new_folder import refuse_inside_datasets, refuse_unwritable, remove_dead_run_folders, run_folder
from .sample_order import DEFAULT_EPISODE_POOL_SIZE
from .url_secrets import without_credentials
from .value_checks import check_choice, check_int_fields, check_seconds, cli_flag

__all__ = [
    "LOADERS",
    "METRIC_FIELDS",
    "BenchConfig",
    "BenchDataset",
    "BenchMode",
    "BenchReport",
    "LoaderResult",
    "ResultsNotWritten",
    "default_warmup",
    "format_table",
    "run_bench",
]

logger = logging.getLogger(__name__)

SARM_OFFSETS_S: tuple[float, ...] = tuple(float(k) for k in range(-7, 1))
"""Camera window of the ``sarm`` mode: 8 frames spaced 1 s, ending at the sample's frame."""

DEFAULT_CACHE = cache_root() / "bench"

RESULTS_DIR = Path("bench") / "results"
"""Where a run's results go without ``--out``: a folder per run, named by its start time."""


class BenchMode(Enum):
    """Which frames every sample asks of every camera."""

    #: One frame per camera (the sample's own; a recipe's camera window if it has one).
    SINGLE = "single"
    #: 8 frames per camera spaced 1 s (``delta_timestamps`` ``[-7, ..., 0]`` s), as reward models such as
    #: SARM read long-horizon context; overrides a recipe's camera window.
    SARM = "sarm"


@dataclass(frozen=True, kw_only=True)
class GeneratedSpec:
    """A synthetic dataset the benchmark generates (once, into the cache) when no ``--dataset`` is given."""

    codec: str
    cameras: int
    size: tuple[int, int]
    fps: int
    gop: int
    episodes: int
    frames_per_episode: int

    @property
    def folder(self) -> str:
        h, w = self.size
        return (
            f"{self.codec}_{self.cameras}cam_{h}x{w}_{self.fps}fps_gop{self.gop}_"
            f"{self.episodes}ep_{self.frames_per_episode}f"
        )


def default_specs(quick: bool) -> tuple[GeneratedSpec, ...]:
    """LeRobot-like recordings: 3 cameras 480x640 at 30 fps, GOP 2 (LeRobot's encoder default), 10 s
    episodes, in AV1 (what LeRobot records) and H.264 (what NVDEC decodes everywhere). All episodes of a
    camera share one file, as LeRobot v3.0 packs episodes until a file reaches 200 MB. ``quick``: 2 cameras
    96x128, 6 episodes of 2 s."""
    if quick:
        shape: dict[str, Any] = dict(cameras=2, size=(96, 128), episodes=6, frames_per_episode=60)
    else:
        shape = dict(cameras=3, size=(480, 640), episodes=12, frames_per_episode=300)
    return tuple(GeneratedSpec(codec=codec, fps=30, gop=2, **shape) for codec in ("av1", "h264"))


def default_warmup(num_workers: int) -> int:
    """Batches left out before the window: 2 per worker and 2 more, what the loaders queue ahead from 2 workers on
    (a DataLoader 2 per worker, its ``prefetch_factor``; lerobot-dali 1 per worker and 4 more, its source's
    ``prefetch`` and its pipeline's). The workers fill those queues during start-up, so a shorter warm-up times a
    queue draining, not a steady loader: on an H200 with 12 workers, 3 warm-up and 20 measured batches, the
    DataLoader's p50 gap was 7 ms and its p99 1.6 s."""
    return max(3, 2 * num_workers + 2)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark run; ``None`` for ``batch_size``/``num_workers``/``steps``/``warmup`` picks the default
    for ``quick`` (8 / 2 / 6 / 2) or a full run (32 / min(4, cores) / 30 / :func:`default_warmup`).

    ``augment``: ``None`` follows the recipe (off without one); ``True`` uses the recipe's augmentation or
    a colour jitter; ``False`` turns it off. ``image_size`` overrides the recipe's. ``device="auto"`` is
    ``cuda`` when a GPU is present. ``loaders``: a subset of :data:`LOADERS` (default: all that apply).
    """

    #: A path or repo id; several: read as one (``concat_datasets``, and LeRobot's ``MultiLeRobotDataset``).
    dataset: str | tuple[str, ...] | None = None
    batch_size: int | None = None
    num_workers: int | None = None
    episode_pool_size: int = DEFAULT_EPISODE_POOL_SIZE
    image_size: tuple[int, int] | None = None
    augment: bool | None = None
    mode: BenchMode | str = BenchMode.SINGLE
    device: str = "auto"
    recipe: str | None = None
    quick: bool = False
    out: Path | None = None
    steps: int | None = None
    warmup: int | None = None
    #: Runs of every loader per dataset, each round in another order (round r starts at loader r); the median
    #: run is reported, with every run's frames/s and ratio (a shared machine's load drifts between runs).
    repeats: int = 1
    limits: bool = False
    loaders: tuple[str, ...] | None = None
    seed: int = 0
    #: With ``dataset``: read only these cameras / tabular keys (every loader that can select; LeRobot's cannot).
    cameras: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None
    #: How every loader's rows find their frames (see :class:`BenchDataset`): one value, or with several datasets one
    #: per dataset (as ``concat_datasets``' ``timestamp_sources`` / ``tolerances_s``).
    timestamp_source: str | tuple[str, ...] = TimestampSource.PARQUET_TIMESTAMP.value
    tolerance_s: float | tuple[float, ...] = DEFAULT_TOLERANCE_S
    cache_dir: Path = DEFAULT_CACHE

    def __post_init__(self) -> None:
        defaults = (8, 2, 6) if self.quick else (32, min(4, usable_cpus()), 30)
        for name, default in zip(("batch_size", "num_workers", "steps"), defaults, strict=True):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        if self.warmup is None:
            object.__setattr__(self, "warmup", 2 if self.quick else default_warmup(self.num_workers or 0))
        checked = (
            ("batch_size", 1), ("num_workers", 0), ("episode_pool_size", 1), ("steps", 1), ("warmup", 1),
            ("repeats", 1), ("seed", 0),
        )  # fmt: skip
        check_int_fields(self, checked, label=cli_flag)
        object.__setattr__(self, "mode", check_choice(BenchMode, "--mode", self.mode))
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        # (as their values: taken in any case, and the peers' TimestampSource() takes them in lower case alone)
        sources = tuple(
            check_choice(TimestampSource, "--timestamp-source", s).value for s in _per_dataset(self.timestamp_source)
        )
        object.__setattr__(
            self, "timestamp_source", sources if isinstance(self.timestamp_source, (tuple, list)) else sources[0]
        )
        for tolerance in _per_dataset(self.tolerance_s):
            check_seconds("--tolerance-s", tolerance)
        object.__setattr__(self, "image_size", check_image_size(self.image_size))
        if self.recipe is not None:
            try:  # read now, so a bad recipe fails before any dataset is generated
                _repo_module("pipelines.recipes", "pipelines/recipes.py").get_recipe(self.recipe)
            except (ValueError, OSError, ImportError) as e:
                raise ValueError(f"--recipe: {e}") from e
        if isinstance(self.dataset, (tuple, list)):
            if len(self.dataset) < 2 or not all(isinstance(d, str) for d in self.dataset):
                raise ValueError(f"--dataset takes a dataset, or several to read as one; got {self.dataset!r}")
            object.__setattr__(self, "dataset", tuple(self.dataset))
            if self.limits:
                raise ValueError("--limits measures one dataset's files: bench the datasets one by one for it")
        count = len(self.dataset) if isinstance(self.dataset, tuple) else 1
        for flag, name in (("--timestamp-source", "timestamp_source"), ("--tolerance-s", "tolerance_s")):
            value = getattr(self, name)
            if isinstance(value, (tuple, list)) and len(value) == 1:
                object.__setattr__(self, name, value[0])
            elif isinstance(value, (tuple, list)):
                if len(value) != count:
                    several = f"one per --dataset ({count})" if count > 1 else "one per --dataset, with several"
                    raise ValueError(f"{flag} takes one value, or {several}; got {len(value)}: {list(value)}")
                object.__setattr__(self, name, tuple(value))
        # Checked now: the results are written after every loader ran, and the datasets generated before any.
        refuse_unwritable("--out", self.out if self.out is not None else RESULTS_DIR)
        refuse_inside_datasets("--out", self.out if self.out is not None else RESULTS_DIR)
        if self.dataset is None:
            refuse_unwritable("--cache-dir", self.cache_dir)
            refuse_inside_datasets("--cache-dir", self.cache_dir)
        if (self.cameras or self.keys) and self.dataset is None:
            raise ValueError("--cameras and --keys select parts of --dataset; the generated datasets are read whole")
        if self.loaders is not None:
            unknown = sorted(set(self.loaders) - set(LOADERS))
            if unknown or not self.loaders:
                raise ValueError(f"unknown loader(s) {unknown or '(none given)'}; loaders are {', '.join(LOADERS)}")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            mode=BenchMode(self.mode).value, out=str(self.out) if self.out else None, cache_dir=str(self.cache_dir)
        )
        if self.dataset is not None:  # (the results file keeps it: a signed URL's signature left out)
            out["dataset"] = _named(self.dataset)
        return out


def _named(dataset: str | Sequence[str]) -> Any:
    """``dataset`` (a path or URL, or several) as the results name it: without the credentials a URL carries
    (:func:`.without_credentials`: a signed URL's ``sig``, a ``user:password``), which the results files keep."""
    return without_credentials(dataset) if isinstance(dataset, str) else [without_credentials(d) for d in dataset]


def _per_dataset(value: Any, count: int = 1) -> tuple[Any, ...]:
    """A per-dataset option's values: its one per dataset as given, or its one value ``count`` times."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * count


# -- datasets -------------------------------------------------------------------------------------------------
#: Beside a generated dataset: what wrote it. A dataset the current generator would write differently is
#: written again, so a changed generator never benches files of the old one.
GENERATED_STAMP = ".lerobot_dali_generated.json"


def _generator_stamp(spec: GeneratedSpec) -> str:
    """What decides a generated dataset's bytes: its spec, the code of the modules that write it (the rows, the
    frames, the encoders and their options) and the encoders' build. The code is taken as its syntax tree less
    docstrings, so an edit to a comment, a docstring or the layout reuses the cached set (hashing the source
    wrote every cached set again, minutes at the default size, for any such edit)."""
    import av

    from . import frame_marker, generate, video_encoding

    code = hashlib.sha256()
    for module in (generate, frame_marker, video_encoding):
        code.update(_code_of(Path(str(module.__file__))).encode())
    encoders = {"av": av.__version__, **{name: list(v) for name, v in sorted(av.library_versions.items())}}
    return json.dumps(
        {"spec": dataclasses.asdict(spec), "generator_sha256": code.hexdigest(), "encoders": encoders}, sort_keys=True
    )


def _code_of(source: Path) -> str:
    """``source``'s syntax tree without docstrings or any other lone string statement (no-ops all), line numbers
    or comments: what it does, not how it is written down."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            body[:] = kept or [ast.Pass()]
    return ast.dump(tree)


def ensure_generated(spec: GeneratedSpec, cache_dir: Path) -> Path:
    """The generated dataset for ``spec`` in ``cache_dir``, written first if absent or written by another
    generator (atomically: a run that dies half-way leaves no dataset that looks complete)."""
    from .generate import make_dataset

    target = cache_dir / spec.folder
    stamp = _generator_stamp(spec)
    if _is_current(target, stamp):
        logger.info("reusing %s", target)
        return target
    if (target / "meta" / "info.json").is_file():
        progress_log.info("%s was written by another version of the generator: writing it again", target)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for kind in ("tmp", "stale"):  # staging or stale copies of runs on this host that were killed
        remove_dead_run_folders(target, kind, writer="bench")
    staging = run_folder(target, "tmp")
    staging.mkdir()  # (make_dataset writes an empty folder in place: no staging folder of its own)
    progress_log.info("generating the benchmark dataset %s (once; later runs reuse it)", target)
    try:
        make_dataset(
            staging,
            episodes=spec.episodes,
            frames_per_episode=spec.frames_per_episode,
            cameras=spec.cameras,
            size=spec.size,
            fps=spec.fps,
            codec=spec.codec,
            gop=spec.gop,
            episodes_per_file=spec.episodes,
        )
        (staging / GENERATED_STAMP).write_text(stamp)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    stale = run_folder(target, "stale")
    if target.exists() and not _is_current(target, stamp):  # an old generator's: set aside, deleted after
        target.rename(stale)
    try:
        staging.rename(target)
    except OSError:  # another run finished the same dataset first: keep theirs (it may be read already)
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(stale, ignore_errors=True)
    return target


def _is_current(target: Path, stamp: str) -> bool:
    written = target / GENERATED_STAMP
    return (target / "meta" / "info.json").is_file() and written.is_file() and written.read_text() == stamp


def bench_datasets(config: BenchConfig) -> list[BenchDataset]:
    if isinstance(config.dataset, tuple):
        names = [Path(d).name or d for d in _named(config.dataset)]
        label = "+".join(names[:3]) + (f"+{len(names) - 3} more" if len(names) > 3 else "")
        count = len(config.dataset)
        return [
            BenchDataset(
                label, config.dataset[0], cameras=config.cameras, keys=config.keys, members=config.dataset,
                member_timestamp_sources=_per_dataset(config.timestamp_source, count),
                member_tolerances_s=tuple(float(t) for t in _per_dataset(config.tolerance_s, count)),
            )
        ]  # fmt: skip
    # One dataset: one value each (BenchConfig refuses several).
    assert not isinstance(config.timestamp_source, tuple) and not isinstance(config.tolerance_s, tuple)
    lookup = partial(BenchDataset, timestamp_source=config.timestamp_source, tolerance_s=float(config.tolerance_s))
    if config.dataset is not None:
        named = _named(config.dataset)
        return [lookup(Path(named).name or named, config.dataset, cameras=config.cameras, keys=config.keys)]
    return [
        lookup(spec.folder, str(ensure_generated(spec, config.cache_dir)), spec.codec)
        for spec in default_specs(config.quick)
    ]


# -- recipes and windows --------------------------------------------------------------------------------------
def _repo_module(name: str, relative: str) -> Any:
    """Import ``name`` (``pipelines.recipes``), else load it from the repository checkout:
    both live beside the package, not in it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        pass
    path = Path(__file__).resolve().parents[1] / relative
    if not path.is_file():
        raise ModuleNotFoundError(
            f"{name} is not importable and {path} does not exist; run from a checkout of the repository "
            "(pip install -e . or PYTHONPATH=<repo>)"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_plan(config: BenchConfig, reader: Any) -> LoadPlan:
    from .augment_config import AugmentConfig, ColorJitter

    recipe = (
        _repo_module("pipelines.recipes", "pipelines/recipes.py").get_recipe(config.recipe) if config.recipe else None
    )
    features = reader.info.features
    cameras = reader.all_camera_keys
    deltas: dict[str, list[float]] = {}
    if recipe is not None:
        deltas = recipe.delta_timestamps(
            reader.fps,
            cameras,
            state_key="observation.state" if "observation.state" in features else None,
            action_key="action" if "action" in features else None,
        )
    if config.mode is BenchMode.SARM:
        deltas.update({camera: list(SARM_OFFSETS_S) for camera in cameras})
    augment = None
    if config.augment is None:
        augment = recipe.augment if recipe is not None else None
    elif config.augment:
        augment = recipe.augment if recipe is not None and recipe.augment is not None else None
        augment = augment or AugmentConfig(color_jitter=ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2))
    image_size = config.image_size or (recipe.image_size if recipe is not None else None)
    frames = sum(len(deltas.get(camera, [0.0])) for camera in cameras)
    drop_last = recipe.drop_n_last_frames if recipe is not None else 0
    return LoadPlan(deltas, image_size, augment, tuple(cameras), frames, drop_n_last_frames=drop_last)


# -- the run --------------------------------------------------------------------------------------------------
def _resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        require_cuda("--device cuda", instead="--device cpu")
    return requested


def _loaders_for(config: BenchConfig, device: str) -> list[str]:
    """The loaders to run, in :data:`LOADERS` order: those ``--loaders`` names (each reported, a GPU-only one
    skipped with why on the CPU), else all that apply to ``device``."""
    chosen = list(config.loaders or (name for name in LOADERS if device == "cuda" or name not in _GPU_ONLY))
    return [name for name in LOADERS if name in chosen]


def machine_info(device: str) -> dict[str, Any]:
    import av
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": usable_cpus(),
        "torch": torch.__version__,
        "av": av.__version__,
        # Which library the CPU fallback and the CPU mode decode with (torchcodec where it loads FFmpeg).
        "cpu_decoders": cpu_decoders(),
        "device": device,
        # Other work on the machine skews every loader's numbers: the load when the run began says how much.
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    try:
        import nvidia.dali

        info["dali"] = nvidia.dali.__version__
    except ImportError:
        info["dali"] = None
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return info


def clip_footprint(
    reader: Any,
    delta_timestamps: Mapping[str, Sequence[float]],
    *,
    samples: int = 24,
    seed: int = 0,
    timestamp_source: str = TimestampSource.PARQUET_TIMESTAMP.value,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> ClipFootprint:
    """What random samples' windows cost the clip route, summed over cameras (see :class:`ClipFootprint`).

    The clip is what lerobot-dali's clip route reads and hands to the decoder for a sample's window (see
    :mod:`lerobot_dali.clips`); the file size is what a loader that opens whole files would touch.
    """
    from .clips import build_clip
    from .frame_lookup import row_frame_numbers
    from .packet_index_cache import load_episode_packet_index
    from .windows import query_indices

    rng = np.random.default_rng(seed)
    fps, fs = reader.fps, reader.location.fs
    source = TimestampSource(timestamp_source)
    lengths = np.asarray(reader.episodes.length)
    clip_bytes = file_bytes = decoded = shown = 0
    for _ in range(samples):
        pos = int(rng.integers(len(lengths)))
        frame = int(rng.integers(lengths[pos]))
        rows = reader.read_episode(pos, [])
        for camera in reader.camera_keys:
            delta = np.array([round(d * fps) for d in delta_timestamps.get(camera, [0.0])], dtype=np.int64)
            window = query_indices(frame, int(lengths[pos]), delta)[0]
            video, index = load_episode_packet_index(reader, pos, camera)
            numbers = row_frame_numbers(
                reader, pos, camera, rows, window, index, timestamp_source=source, tolerance_s=tolerance_s, video=video
            )
            clip = build_clip(video.path, index, numbers, filesystem=fs)
            clip_bytes += clip.data.nbytes
            file_bytes += index.file_size_bytes
            decoded += clip.frame_count
            shown += len(np.unique(numbers))
    return ClipFootprint(clip_bytes / samples, file_bytes / samples, decoded / shown)


def _with_derived(
    results: list[LoaderResult],
    footprint: ClipFootprint | None,
    ceiling_fps: float | None,
    not_peers: Collection[str] = (),
) -> list[LoaderResult]:
    """Add ratios: to the best peer's frames/s (``not_peers``: rows not to divide by), to the decode ceiling;
    clip bytes on our rows."""
    peers = [
        r
        for r in results
        if r.loader not in _OURS and r.loader not in not_peers and r.status == "ok" and r.frames_per_s > 0
    ]
    best_peer = max(peers, key=lambda r: r.frames_per_s) if peers else None
    out = []
    for r in results:
        if r.status != "ok":
            out.append(r)
            continue
        extra: dict[str, Any] = {}
        if best_peer is not None:
            extra.update(vs_best_peer=r.frames_per_s / best_peer.frames_per_s, best_peer=best_peer.loader)
        if ceiling_fps:
            extra["fraction_of_decode_ceiling"] = r.frames_per_s / ceiling_fps
        if footprint is not None and r.loader in _OURS:
            clip, video = footprint.clip_bytes, footprint.file_bytes
            extra.update(clip_bytes_per_sample=clip, video_bytes_per_sample=video, clip_to_file_ratio=clip / video)
        out.append(dataclasses.replace(r, **extra))
    return out


def _unfair_peers(config: BenchConfig, reader: Any, loaders: Sequence[str], tolerance_s: float) -> dict[str, str]:
    """Peers whose measured window would not do a loader's work, with why (their rows say it; no ratio divides
    by them): ``StreamingLeRobotDataset`` decodes its shuffle buffer before its first batch, so on a dataset with
    fewer frames than that buffer plus the samples measured, part of the window only hands out decoded samples
    (``--quick``'s 360 frames: all of it, and it came out fastest); and where it looks frames up by global index,
    it decodes other frames than the rows name in episodes whose video does not start at that index's time."""
    if LEROBOT_STREAMING_LOADER not in loaders:
        return {}
    from .bench_peers import streaming_buffer_size, streaming_looks_up_by_index

    whys = []
    buffered = streaming_buffer_size()
    drawn = (int(config.warmup or 0) + int(config.steps or 1)) * int(config.batch_size or 1)
    if buffered is not None and buffered + drawn > reader.num_frames:
        whys.append(
            f"its shuffle buffer ({buffered} samples, decoded before the first batch) and the {drawn} samples "
            f"measured exceed the dataset's {reader.num_frames} frames, so it decodes little or nothing in the "
            "measured window"
        )
    misplaced = _episodes_not_at_index_time(reader, tolerance_s)
    if misplaced and streaming_looks_up_by_index():
        whys.append(
            f"it looks each row's frames up at its index / fps in its episode's video file (LeRobot issue #4524), "
            f"and {misplaced} of the dataset's {len(reader.episodes)} episodes start elsewhere in theirs, so it "
            "decodes other frames than the rows name there, or fails"
        )
    return {LEROBOT_STREAMING_LOADER: "not a peer here: " + "; and ".join(whys)} if whys else {}


def _episodes_not_at_index_time(reader: Any, tolerance_s: float) -> int:
    """Episodes one of whose cameras' videos does not start at the episode's first global index / fps (more than
    ``tolerance_s`` apart): where a loader that takes that time for the video's finds other frames."""
    starts = np.asarray(reader.episodes.dataset_from_index, dtype=np.float64) / reader.fps
    off = np.zeros(len(starts), dtype=bool)
    for files in reader.episodes.cameras.values():
        off |= ~(np.abs(np.asarray(files.from_timestamp_s, dtype=np.float64) - starts) <= tolerance_s)
    return int(off.sum())


def _median_runs(rounds: list[list[LoaderResult]], loaders: Sequence[str]) -> list[LoaderResult]:
    """Per loader, its median run (the lower middle one for an even count) with ``vs_best_peer`` the median of
    its rounds' ratios, each taken against the best peer of its own round; a run that did not measure stands
    for the loader instead, naming its round."""
    out = []
    for name in loaders:
        runs = [row for rows in rounds for row in rows if row.loader == name]
        failed = [(i, r) for i, r in enumerate(runs) if r.status != "ok"]
        if failed and runs[0].status != "skipped":
            i, first = failed[0]
            note = f"run {i + 1} of {len(runs)}: {first.note}" if len(runs) > 1 else first.note
            out.append(dataclasses.replace(first, note=note, repeats=len(runs)))
            continue
        if failed:  # skipped, the same in every round
            out.append(runs[0])
            continue
        median = sorted(runs, key=lambda r: r.frames_per_s)[(len(runs) - 1) // 2]
        ratios = [r.vs_best_peer for r in runs if r.vs_best_peer is not None]  # (none where no peer ran)
        complete = len(ratios) == len(runs)
        out.append(
            dataclasses.replace(
                median,
                repeats=len(runs),
                frames_per_s_runs=" ".join(f"{r.frames_per_s:.1f}" for r in runs),
                vs_best_peer=sorted(ratios)[(len(ratios) - 1) // 2] if complete else None,
                vs_best_peer_runs=" ".join(f"{x:.3f}" for x in ratios) if complete else None,
                # every round's divisor: "pyav-dataloader / lerobot" where rounds had different fastest peers
                best_peer=" / ".join(dict.fromkeys(r.best_peer for r in runs if r.best_peer)) or None,
            )
        )
    return out


def _dataset_summary(dataset: BenchDataset, reader: Any, plan: LoadPlan) -> dict[str, Any]:
    from .packet_index_cache import load_episode_packet_index

    # Every camera's codec: they may differ ("vp9/h264"; datasets read as one share each camera's) and take two
    # routes on one GPU.
    indexes = [load_episode_packet_index(reader, 0, key)[1] for key in reader.camera_keys]
    camera_codecs = {key: index.codec for key, index in zip(reader.camera_keys, indexes, strict=True)}
    camera_codecs.update(dict.fromkeys(reader.image_keys, "image"))
    kb_per_frame: float | None = None
    if indexes:
        resolution = [indexes[0].height, indexes[0].width]
        kb_per_frame = round(float(np.concatenate([index.size_bytes for index in indexes]).mean()) / 1024, 2)
    else:  # cameras stored as images in the data files only
        resolution = list(reader.info.features[reader.image_keys[0]].shape[:2])
    codec = "/".join(dict.fromkeys(camera_codecs.values()))
    return {
        "label": dataset.label,
        "path": _named(dataset.path),
        "members": _named(dataset.members),
        "codec": codec,
        "camera_codecs": camera_codecs,
        "resolution": resolution,
        # How hard the frames are to decode: synthetic ones compress ~10x better than camera footage.
        "video_kb_per_frame": kb_per_frame,
        "fps": reader.fps,
        "cameras": list(reader.camera_keys),
        "image_cameras": list(reader.image_keys),
        "episodes": reader.num_episodes,
        "frames": reader.num_frames,
        "frames_per_sample": plan.frames_per_sample,
        "delta_timestamps": plan.delta_timestamps,
        "image_size": list(plan.image_size) if plan.image_size else None,
        "augment": plan.augment.to_dict() if plan.augment is not None else None,
        "drop_n_last_frames": plan.drop_n_last_frames,
    }


def run_bench(config: BenchConfig) -> BenchReport:
    """Run every applicable loader on every dataset of ``config`` and write JSON, CSV and PNG to its out dir."""
    device = _resolve_device(config.device)
    machine = machine_info(device)  # now: its load average is the one the run began with
    out_dir = config.out or RESULTS_DIR / time.strftime("%Y%m%d-%H%M%S")
    loaders = _loaders_for(config, device)
    notes: list[str] = []
    lerobot_missing = None
    if any(name in _EXTERNAL for name in loaders):
        from .bench_peers import lerobot_unavailable

        lerobot_missing = lerobot_unavailable()
        if lerobot_missing:
            notes.append(f"LeRobot peers skipped: {lerobot_missing}")
    results: list[LoaderResult] = []
    summaries: list[dict[str, Any]] = []
    for dataset in bench_datasets(config):
        reader = dataset.open()
        if not reader.camera_keys and not reader.image_keys:
            raise DatasetError(
                f"{dataset.label}: no camera to load (info.json declares no video or image feature); the bench "
                "measures camera frames loaded per second: bench a dataset with cameras"
            )
        plan = load_plan(config, reader)
        summary = _dataset_summary(dataset, reader, plan)
        if plan.augment is not None:
            notes.append(f"{dataset.label}: augmentation runs in lerobot-dali only; peers load without it")
        if plan.drop_n_last_frames and LEROBOT_STREAMING_LOADER in loaders:
            notes.append(
                f"{dataset.label}: StreamingLeRobotDataset takes no sampler, so it samples every frame; the other "
                f"loaders leave each episode's last {plan.drop_n_last_frames} frames out, as the recipe says"
            )
        ceiling_fps = None
        if config.limits:
            try:
                summary["ceilings"] = measure_ceilings(dataset.path, gpu=device == "cuda", cameras=dataset.cameras)
                ceiling_fps = summary["ceilings"]["best_frames_per_s"]
            except Exception as e:
                summary["ceilings_error"] = f"{type(e).__name__}: {e}"
                notes.append(f"{dataset.label}: decode ceilings not measured ({summary['ceilings_error']})")
        footprint = None
        if any(name in _OURS for name in loaders) and reader.camera_keys:  # clips exist for video cameras only
            try:
                footprint = clip_footprint(
                    reader,
                    plan.delta_timestamps,
                    seed=config.seed,
                    timestamp_source=dataset.timestamp_source,
                    tolerance_s=dataset.tolerance_s,
                )
                summary["decoded_frames_per_frame"] = footprint.decoded_per_frame
            except Exception as e:
                notes.append(f"{dataset.label}: clip bytes not measured ({type(e).__name__}: {e})")
        skipped: dict[str, LoaderResult] = {}
        by_parquet = all(TimestampSource(s) is TimestampSource.PARQUET_TIMESTAMP for _, s, _ in dataset.lookups())
        for name in loaders:
            if name in _GPU_ONLY and device == "cpu":
                note = f"a GPU route (--device cuda); on the CPU, {DALI_LOADER} decodes in its workers as it would"
                skipped[name] = LoaderResult(dataset=dataset.label, loader=name, status="skipped", note=note)
            elif name in _EXTERNAL and lerobot_missing:
                skipped[name] = LoaderResult(dataset=dataset.label, loader=name, status="skipped", note=lerobot_missing)
            elif name in _EXTERNAL and (dataset.cameras or dataset.keys or not by_parquet):
                note = "LeRobot's datasets read every declared feature by parquet timestamps: they take no "
                note += "--cameras, --keys or --timestamp-source"
                skipped[name] = LoaderResult(dataset=dataset.label, loader=name, status="skipped", note=note)
            elif name == LEROBOT_STREAMING_LOADER and dataset.members:
                note = "StreamingLeRobotDataset reads one dataset (MultiLeRobotDataset is LeRobot's for several)"
                skipped[name] = LoaderResult(dataset=dataset.label, loader=name, status="skipped", note=note)
        measured = [name for name in loaders if name not in skipped]
        unfair = _unfair_peers(config, reader, measured, dataset.tolerance_s)
        rounds = []
        for repeat in range(config.repeats):
            rows = list(skipped.values())
            first = repeat % max(1, len(measured))  # every loader takes every place in the order in turn
            for name in measured[first:] + measured[:first]:
                of = f" (run {repeat + 1} of {config.repeats})" if config.repeats > 1 else ""
                load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None  # (other work skews it)
                at = f" (1-minute load {load:.1f})" if load is not None else ""
                progress_log.info("measuring %s on %s%s%s", name, dataset.label, of, at)
                job = LoaderJob(
                    loader=name, dataset=dataset, plan=plan, batch_size=int(config.batch_size or 1),
                    num_workers=int(config.num_workers or 0), pool_size=config.episode_pool_size, device=device,
                    steps=int(config.steps or 1), warmup=int(config.warmup or 0), seed=config.seed,
                    log_level=logging.getLogger().getEffectiveLevel(),
                )  # fmt: skip
                row = dataclasses.replace(run_in_child(job), load_1m=load)
                if name in unfair:  # (a failed row too: its error may be what the note foretells)
                    row = dataclasses.replace(row, note="; ".join(filter(None, (row.note, unfair[name]))))
                rows.append(row)
                progress_log.info(
                    "%s on %s%s: %s", name, dataset.label, of,
                    f"{row.frames_per_s:.1f} frames/s" if row.status == "ok" else f"{row.status} {row.note}".strip(),
                )  # fmt: skip
            rounds.append(_with_derived(rows, footprint, ceiling_fps, not_peers=unfair))
        results.extend(_median_runs(rounds, loaders))
        summaries.append(summary)
    report = BenchReport(
        config=config.to_dict(),
        machine=machine,
        datasets=summaries,
        results=tuple(results),
        notes=tuple(notes),
        out_dir=out_dir,
    )
    try:
        files = write_report(report, out_dir, notes)
    except OSError as e:  # (a traceback once every loader had run: the measurements lost with it)
        raise ResultsNotWritten(dataclasses.replace(report, notes=tuple(notes)), e) from e
    return dataclasses.replace(report, files=files, notes=tuple(notes))


class ResultsNotWritten(Exception):
    """The bench measured, but its results could not be written to their folder (full, read-only, over quota):
    ``report`` holds the measurements, for the caller to print, and ``error`` the write's error."""

    def __init__(self, report: BenchReport, error: OSError) -> None:
        super().__init__(f"results not written to {report.out_dir}: {error}")
        self.report, self.error = report, error
