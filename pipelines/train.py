"""Train a small action-chunking policy on a LeRobot dataset through ``DALILeRobotIterator``.

One script for every launcher (see ``pipelines/README.md``)::

    python pipelines/train.py --dataset PATH --steps 1000 --device cuda            # one GPU
    accelerate launch --num_processes 8 pipelines/train.py --dataset PATH ...      # GPUs, nodes
    torchrun --nproc_per_node 2 --standalone pipelines/train.py --device cpu ...   # CPU, gloo

Data parallelism: accelerate wraps the model (DDP) and the optimiser; every rank builds its own iterator,
which reads episodes disjoint from the other ranks' and equally many samples per epoch. The iterator is
never given to ``accelerator.prepare``: accelerate would shard it again and each rank would keep 1/N of a
stream that is already its own 1/N.

Checkpoints: ``CKPT/step_{n:08d}/state`` is ``accelerator.save_state`` (model, optimiser, RNG states) and
``CKPT/step_{n:08d}/stream_rank{r}.json`` is rank ``r``'s iterator position, written under a staging name and
renamed once complete; ``CKPT/latest`` names the newest complete checkpoint and is written last, once every rank
has saved. ``--resume`` continues from it at the
exact next sample of every rank. ``CKPT`` must be visible to all nodes.

Preemption: SIGTERM or SIGUSR1 (a scheduler's notice before it kills the job) on any rank stops every rank at the
same step boundary, saves a checkpoint there and exits with status :data:`EXIT_PREEMPTED`; rerun with ``--resume``
(:class:`PreemptibleLoop`, which ``pipelines/lerobot_policy.py``'s loop shares).

Mixtures: ``--dataset A B ... [--weights ...]`` reads several datasets through ``DALILeRobotMixture``, every
batch a fixed share of each; the policy's normalisation pools their statistics by those shares. ``--rename-map``
gives keys of some datasets the names the others use (a camera recorded as ``rgb`` in one, ``top`` in another).
``--concat`` reads datasets of one layout as one instead (``concat_datasets``: one pipeline, samples in
proportion to frames), for many datasets.

Recipes: ``--recipe act|diffusion|vla|FILE.toml`` (``pipelines/recipes.py``) sets the windows read per sample
(cameras, state, action), the image size, the augmentation and the frames at each episode's end never sampled.
Explicit flags win over the recipe: ``--chunk N`` resizes the recipe's action window to N steps (keeping its first
offset and stride), ``--image-size`` replaces its image size, ``--augment FILE`` its whole augmentation and
``--drop-n-last-frames N`` its frames left out. Without ``--recipe``
a sample is the current frame of every camera, the current state and ``--chunk`` (default 10) actions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: make `pipelines` and the repository's `lerobot_dali` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # as pipelines.train, so that a Ctrl-C in the imports below (seconds) is one line, not a
    from pipelines.interrupts import run_main  # traceback

    run_main("pipelines.train", "train.py", "pipelines.train")

# OpenMP threads busy-wait between torch's parallel regions by default and starve the DALI threads that share
# the cores: CPU steps ran 15-25x slower on 2 cores. A passive wait costs little where the math runs on a GPU.
# Must be set before torch loads OpenMP; an OMP_WAIT_POLICY already in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from lerobot_dali.cache_dirs import write_whole
from lerobot_dali.cli_options import ArgumentParser, add_episode_pool_size, add_image_size, check_image_size
from lerobot_dali.decode_route import DecodePreference
from lerobot_dali.errors import CudaUnavailableError, DatasetError, ResumeStateError, ShardingError, StatsError
from lerobot_dali.new_folder import refuse_inside_datasets, refuse_unwritable
from lerobot_dali.open_files import refuse_workers_past_open_files
from lerobot_dali.sample_order import DEFAULT_EPISODE_POOL_SIZE
from lerobot_dali.stream_state import merge_rank_states
from lerobot_dali.value_checks import check_choice, check_int_fields, check_seconds, cli_flag, is_int, is_number
from pipelines.interrupts import Interrupted, configure_logging, said
from pipelines.policy import ChunkPolicy, FeatureStats, PolicyConfig

if TYPE_CHECKING:
    from lerobot_dali.augment_config import AugmentConfig
    from lerobot_dali.key_rename import KeyRename

logger = logging.getLogger("pipelines.train")

_DEVICES = ("cpu", "cuda")
_PRECISIONS = ("no", "fp16", "bf16")
DEFAULT_CHUNK = 10
"""Actions per sample when neither ``--chunk`` nor a recipe's ``[action]`` window says."""
STATE_KEY = "observation.state"
ACTION_KEY = "action"
#: Exit status of a run stopped by a preemption signal once its checkpoint is saved (sysexits' EX_TEMPFAIL: try
#: again later), so a job script can tell it from a failure and relaunch with ``--resume``.
EXIT_PREEMPTED = 75
#: What schedulers send before they kill a job: SIGTERM (SLURM at the time limit or scancel, Kubernetes, spot
#: instances' shutdown, torchrun passing on its own), SIGUSR1 (SLURM's ``--signal``, ahead of time).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: The largest ``--seed``: accelerate's ``set_seed`` seeds numpy's legacy generator, which takes 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1


def check_seed(seed: object) -> None:
    """``--seed`` of both training scripts: ValueError unless an int from 0 to :data:`MAX_SEED` (else a traceback
    once the run had started: numpy's seeding above it, the sample order's below 0)."""
    if not (is_int(seed) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"--seed must be an int from 0 to 2**32 - 1, got {seed!r}")


def check_decode(decode: object, device: str) -> None:
    """``--decode`` of both training scripts, with their ``--device``: ValueError for an unknown route, or for ``gpu``
    (NVDEC) on the CPU, which the iterator refused with a traceback once the dataset had opened."""
    route = check_choice(DecodePreference, "--decode", decode.lower() if isinstance(decode, str) else decode)
    if route == DecodePreference.GPU and device == "cpu":
        raise ValueError(
            "--decode gpu decodes on the GPU's NVDEC, which needs --device cuda; with --device cpu use auto or cpu"
        )


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """Everything one run needs; the CLI flags map one to one (``--batch-size`` -> ``batch_size``).

    ``chunk=None`` takes the recipe's action window, or :data:`DEFAULT_CHUNK` actions without one.
    """

    #: One dataset, or several read as a mixture (``DALILeRobotMixture``: each batch a fixed share of each).
    dataset: str | tuple[str, ...]
    steps: int
    #: A mixture's weights, one per dataset (None: their frame counts).
    weights: tuple[float, ...] | None = None
    #: Episode indices to train on (None: all), e.g. the training part of a split.
    episodes: tuple[int, ...] | None = None
    #: Cameras to read (None: every camera info.json declares), e.g. leaving out one declared but never recorded.
    cameras: tuple[str, ...] | None = None
    batch_size: int = 64
    device: str = "cuda"
    num_workers: int = 4
    recipe: str | None = None
    chunk: int | None = None
    lr: float = 1e-3
    grad_clip: float = 10.0
    seed: int = 0
    episode_pool_size: int = DEFAULT_EPISODE_POOL_SIZE
    #: Deal episodes to ranks in pieces of at most this many frames (None: whole episodes).
    episode_piece_frames: int | None = None
    #: Frames at the end of every episode never sampled (None: the recipe's, else 0).
    drop_n_last_frames: int | None = None
    image_size: tuple[int, int] | None = None
    augment: Path | None = None
    decode: str = "auto"
    #: One for every dataset, or one per dataset (in --dataset order).
    timestamp_source: str | tuple[str, ...] = "parquet_timestamp"
    tolerance_s: float | tuple[float, ...] | None = None
    #: A mixture's ``{key: new name}``: one for every dataset (each takes the keys it reads), or one per dataset.
    rename_map: Mapping[str, str] | tuple[Mapping[str, str], ...] | None = None
    #: Several datasets read as one (``concat_datasets``) instead of a mixture.
    concat: bool = False
    mixed_precision: str = "no"
    checkpoint_dir: Path | None = None
    save_every: int = 0
    resume: bool = False
    log_every: int = 50
    record_dir: Path | None = None

    def __post_init__(self) -> None:
        positive = (("steps", 1), ("batch_size", 1), ("chunk", 1), ("episode_pool_size", 1), ("log_every", 1))
        at_least_0 = (("num_workers", 0), ("save_every", 0), ("drop_n_last_frames", 0))
        checked = (*positive, ("episode_piece_frames", 1), *at_least_0)
        optional = ("chunk", "episode_piece_frames", "drop_n_last_frames")
        check_int_fields(self, checked, label=cli_flag, optional=optional)
        refuse_workers_past_open_files(self.num_workers)  # (one line now, not the iterator's traceback later)
        check_seed(self.seed)
        if self.device not in _DEVICES:
            raise ValueError(f"--device must be one of {_DEVICES}, got {self.device!r}")
        if self.mixed_precision not in _PRECISIONS:
            raise ValueError(f"--mixed-precision must be one of {_PRECISIONS}, got {self.mixed_precision!r}")
        if self.mixed_precision == "fp16" and self.device == "cpu":
            raise ValueError("--mixed-precision fp16 does nothing on the CPU (accelerate enables neither autocast "
                             "nor loss scaling there); use bf16, or no")  # fmt: skip
        if (self.resume or self.save_every) and self.checkpoint_dir is None:
            raise ValueError("--resume and --save-every need --checkpoint-dir")
        if not (is_number(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if not (is_number(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"--grad-clip must be a finite number >= 0 (0: no clipping), got {self.grad_clip}")
        tolerances = self.tolerance_s if isinstance(self.tolerance_s, tuple) else (self.tolerance_s,)
        for tolerance in (t for t in tolerances if t is not None):
            check_seconds("--tolerance-s", tolerance)
        if self.weights is not None and not all(is_number(w) and w > 0 for w in self.weights):
            raise ValueError(f"--weights must be finite numbers > 0, got {' '.join(map(str, self.weights))}")
        check_decode(self.decode, self.device)
        check_image_size(self.image_size)
        several = not isinstance(self.dataset, str) and len(self.dataset) > 1
        if self.weights is not None and (not several or len(self.weights) != len(self.dataset)):
            raise ValueError("--weights takes one weight per --dataset, and needs two datasets or more")
        if self.episodes is not None and several:
            raise ValueError("--episodes selects episodes of one dataset; with several, select no episodes")
        if self.rename_map is not None and not several:
            raise ValueError("--rename-map gives the datasets of a mixture shared names; it needs two datasets or more")
        if self.concat and not several:
            raise ValueError("--concat reads two datasets or more as one; got one")
        if self.concat and self.weights:
            raise ValueError(
                "--concat reads the datasets in proportion to their frames: it takes no --weights (a mixture's)"
            )
        for flag, value in (
            ("--timestamp-source", self.timestamp_source),
            ("--tolerance-s", self.tolerance_s),
            ("--rename-map", self.rename_map),
        ):
            if isinstance(value, tuple) and len(value) != len(self.datasets):
                raise ValueError(f"{flag} takes one value, or one per --dataset ({len(self.datasets)}), got {value}")
        from lerobot_dali.key_rename import check_rename_map

        for rename_map in self.rename_map if isinstance(self.rename_map, tuple) else (self.rename_map,):
            if rename_map is not None:  # (an empty name: refused here, not as a TypeError once the datasets open)
                check_rename_map(rename_map, "--rename-map")

    def dataset_options(self) -> list[dict[str, Any]]:
        """Per dataset, its ``timestamp_source`` and ``tolerance_s`` (where given): the iterator's arguments."""
        count = len(self.datasets)

        def each(value: Any) -> tuple[Any, ...]:
            return value if isinstance(value, tuple) else (value,) * count

        return [
            {"timestamp_source": source, **({} if tolerance is None else {"tolerance_s": tolerance})}
            for source, tolerance in zip(each(self.timestamp_source), each(self.tolerance_s), strict=True)
        ]

    @property
    def datasets(self) -> tuple[str, ...]:
        return (self.dataset,) if isinstance(self.dataset, str) else tuple(self.dataset)


# -- command line ---------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> TrainOptions:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--dataset",
        required=True,
        nargs="+",
        metavar="PATH",
        help="local path, Hub repo id or fsspec URL of a LeRobot dataset; several: a mixture, each batch a fixed\n"
        "share of each (by --weights, default their frame counts), with the keys and cameras all of them have",
    )
    p.add_argument("--weights", type=float, nargs="+", metavar="W", help="a mixture's weights, one per --dataset")
    p.add_argument("--steps", type=int, required=True, help="optimiser steps in total (a resumed run stops there too)")
    p.add_argument(
        "--episodes", type=int, nargs="+", metavar="E", help="train on these episode indices only (default: all)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default %(default)s)")
    p.add_argument("--device", type=str.lower, choices=_DEVICES, default="cuda", help="(default %(default)s)")
    p.add_argument(
        "--num-workers", type=int, default=4, help="DALI worker processes per rank (0: in-process; default %(default)s)"
    )
    p.add_argument(
        "--recipe",
        help="act, diffusion, vla or a recipe .toml (pipelines/recipes/): windows, image size, augmentation;\n"
        "--chunk, --image-size, --augment and --drop-n-last-frames given explicitly win over it",
    )
    p.add_argument(
        "--chunk",
        type=int,
        help=f"actions predicted per sample: action deltas 0..chunk-1 frames (default {DEFAULT_CHUNK});\n"
        "with --recipe, the length of its action window (which keeps its first offset)",
    )
    p.add_argument("--lr", type=float, default=1e-3, help="(default %(default)s)")
    p.add_argument(
        "--grad-clip", type=float, default=10.0, help="max gradient norm (0: no clipping; default %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="model init and sample order, same on every rank (default %(default)s)"
    )
    add_episode_pool_size(p, default=64, help="episodes sampled from at once (default %(default)s)")
    p.add_argument(
        "--episode-piece-frames",
        type=int,
        metavar="N",
        help="deal episodes to ranks in pieces of at most N frames: for more ranks than episodes, or few each",
    )
    p.add_argument(
        "--drop-n-last-frames",
        type=int,
        metavar="N",
        help="never sample the last N frames of an episode (their windows would be mostly padding), as LeRobot\n"
        "trains Diffusion Policy (7); default: the recipe's, else 0",
    )
    add_image_size(p)
    p.add_argument(
        "--augment", type=Path,
        help="augmentation TOML (pipelines/recipes/augment_example.toml), or a .json of LeRobot's image transforms "
        "(a train_config.json: its dataset.image_transforms)",
    )  # fmt: skip
    p.add_argument(
        "--decode", default="auto", metavar="{auto,gpu,cpu}",
        help="auto: NVDEC where the GPU has the codec, else the CPU; gpu: NVDEC or fail; cpu (default %(default)s)",
    )  # fmt: skip
    add_reading_options(p, several=True)
    p.add_argument(
        "--rename-map",
        nargs="+",
        type=_json_map,
        metavar="JSON",
        help='a mixture\'s {"key": "new name"}, e.g. \'{"observation.images.rgb": "observation.images.top"}\':\n'
        "one for every dataset (each renames the keys it has), or one per --dataset ('{}': none)",
    )
    p.add_argument(
        "--concat", action="store_true",
        help="read the --dataset datasets as one (one layout: one pipeline, samples in proportion to\n"
        "frames), not as a mixture; for many datasets",
    )  # fmt: skip
    p.add_argument("--mixed-precision", type=str.lower, choices=_PRECISIONS, default="no", help="(default %(default)s)")
    p.add_argument(
        "--checkpoint-dir", type=Path, help="where checkpoints go, one folder a step and latest (default: none saved)"
    )
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every S steps (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from CHECKPOINT_DIR/latest if there is one")
    p.add_argument(
        "--log-every", type=int, default=50, help="log loss and throughput every L steps (default %(default)s)"
    )
    p.add_argument(
        "--record",
        dest="record_dir",
        type=Path,
        help="write DIR/rank{r}.json: per step the dataset `index` values and loss of this rank (tests, debugging)",
    )
    a = p.parse_args(argv)
    return TrainOptions(
        dataset=a.dataset[0] if len(a.dataset) == 1 else tuple(a.dataset), steps=a.steps,
        weights=tuple(a.weights) if a.weights else None, episodes=tuple(a.episodes) if a.episodes else None,
        cameras=tuple(a.cameras) if a.cameras else None,
        batch_size=a.batch_size, device=a.device, num_workers=a.num_workers,
        recipe=a.recipe, chunk=a.chunk, lr=a.lr, grad_clip=a.grad_clip, seed=a.seed,
        episode_pool_size=a.episode_pool_size, episode_piece_frames=a.episode_piece_frames,
        drop_n_last_frames=a.drop_n_last_frames,
        image_size=tuple(a.image_size) if a.image_size else None, augment=a.augment, decode=a.decode,
        timestamp_source=_one_or_each(a.timestamp_source), tolerance_s=_one_or_each(a.tolerance_s),
        rename_map=_one_or_each(a.rename_map), concat=a.concat,
        mixed_precision=a.mixed_precision,
        checkpoint_dir=a.checkpoint_dir,
        save_every=a.save_every, resume=a.resume, log_every=a.log_every, record_dir=a.record_dir,
    )  # fmt: skip


def add_reading_options(p: argparse.ArgumentParser, *, several: bool) -> None:
    """``--cameras``, ``--timestamp-source`` and ``--tolerance-s``: which cameras a run reads and how its rows find
    their frames (``cr5_*``'s wall-clock timestamps need ``--timestamp-source frame_index``, ``gr00t_v20_h264``'s
    camera without files ``--cameras``). ``several``: one value, or one per ``--dataset`` (lists); else one (scalars).
    Shared by this script and ``pipelines/lerobot_policy.py``."""
    each = dict(nargs="+", default=["parquet_timestamp"]) if several else dict(default="parquet_timestamp")
    per = ": one value, or one per --dataset" if several else ""
    p.add_argument(
        "--cameras", nargs="+", metavar="KEY", help="read only these cameras (default: all that info.json declares)"
    )
    p.add_argument(
        "--timestamp-source", type=str.lower, choices=("parquet_timestamp", "frame_index"), **each,
        help=f"how rows find their video frames (frame_index: frame_index / fps, for wall-clock timestamps){per}",
    )  # fmt: skip
    p.add_argument(
        "--tolerance-s", type=float, nargs="+" if several else None,
        help=f"most a row's time may be from its video frame (default: the iterator's){per}",
    )  # fmt: skip


def _json_map(text: str) -> dict[str, str]:
    from lerobot_dali.key_rename import rename_map_from_json

    try:
        return rename_map_from_json(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _one_or_each(values: list[Any] | None) -> Any:
    """A flag's one value, or its several as a tuple (one per dataset)."""
    return values if values is None else values[0] if len(values) == 1 else tuple(values)


# -- processes and ranks --------------------------------------------------------------------------------------
def make_accelerator(device: str, mixed_precision: str = "no", **accelerator_kwargs: Any) -> Any:
    """An ``Accelerator`` whose process count matches the launcher's.

    On CPU ``cpu=True`` is what makes accelerate join torchrun's gloo group (MULTI_CPU): without it accelerate
    1.15 reports one process while torch.distributed has N, and the model would not be wrapped in DDP.
    """
    from accelerate import Accelerator

    from lerobot_dali.distributed import require_cuda

    if device == "cuda":  # else accelerate quietly trains on the CPU
        require_cuda("--device cuda", instead="--device cpu")
    return Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision, **accelerator_kwargs)


def data_rank(accelerator: Any) -> tuple[int, int]:
    """``(rank, world_size)`` for the iterator, from torch.distributed when it is initialised.

    torch.distributed is the truth about the process group; accelerate's view must agree, or gradients
    would not be averaged across the ranks that read different data. One process where a launcher started several
    (``srun -n 2`` or ``mpirun -np 2`` without torchrun, ``RANK`` without ``WORLD_SIZE``): ShardingError (each would
    train alone on the whole dataset, saving into one ``--checkpoint-dir``).
    """
    import torch.distributed as dist

    from lerobot_dali.distributed import refuse_unresolved_launch

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != accelerator.num_processes:
            raise RuntimeError(
                f"torch.distributed has {world} ranks but accelerate sees {accelerator.num_processes} process(es) "
                f"({accelerator.distributed_type}); gradients would not be synchronised. On CPU pass --device cpu; "
                "otherwise launch with `accelerate launch` or `torchrun`"
            )
    else:
        rank, world = accelerator.process_index, accelerator.num_processes
    if world == 1:
        refuse_unresolved_launch("or run the script as one process, with no launcher")
    return rank, world


def iterator_device(device: torch.device) -> str:
    """The iterator's spelling of the accelerator's device (``cpu``, ``cuda:N``)."""
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


# -- data -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """What each sample holds, resolved from ``--recipe`` and the explicit flags for one dataset's fps.

    ``camera_steps`` / ``state_steps``: frames in the camera / state window, ``None`` for the sample's own
    frame with no window axis. ``chunk``: steps in the action window. ``drop_n_last_frames``: frames at the end
    of each episode never sampled.
    """

    delta_timestamps: dict[str, list[float]]
    image_size: tuple[int, int] | None
    augment: AugmentConfig | None
    chunk: int
    camera_steps: int | None
    state_steps: int | None
    drop_n_last_frames: int = 0


def data_plan(options: TrainOptions, *, fps: float, camera_keys: Sequence[str]) -> DataPlan:
    """The iterator's windows, image size and augmentation: the recipe's, each overridden by an explicit flag.

    ``--chunk N`` keeps the recipe's action window start and stride with N steps; without a recipe (or a
    recipe without ``[action]``) the window is ``0, 1/fps, ..., (N-1)/fps`` with N = ``--chunk`` or 10.
    """
    from pipelines.recipes import StepWindow, get_recipe

    recipe = get_recipe(options.recipe) if options.recipe else None
    deltas = recipe.delta_timestamps(fps, camera_keys, STATE_KEY, ACTION_KEY) if recipe else {}
    window = recipe.action if recipe else None
    if options.chunk is not None or window is None:
        first, stride_s = (window.first, window.stride_s) if window else (0, None)
        steps = options.chunk if options.chunk is not None else DEFAULT_CHUNK
        deltas[ACTION_KEY] = StepWindow(steps=steps, first=first, stride_s=stride_s).offsets_s(fps)
    image_size = options.image_size if options.image_size else (recipe.image_size if recipe else None)
    augment = read_augment(options.augment) if options.augment else (recipe.augment if recipe else None)
    windowed_camera = next((k for k in camera_keys if k in deltas), None)
    return DataPlan(
        delta_timestamps=deltas,
        image_size=image_size,
        augment=augment,
        chunk=len(deltas[ACTION_KEY]),
        camera_steps=len(deltas[windowed_camera]) if windowed_camera else None,
        state_steps=len(deltas[STATE_KEY]) if STATE_KEY in deltas else None,
        drop_n_last_frames=(
            options.drop_n_last_frames if options.drop_n_last_frames is not None
            else recipe.drop_n_last_frames if recipe else 0
        ),
    )  # fmt: skip


def read_augment(path: Path) -> AugmentConfig:
    """The ``--augment`` file: a TOML of this project's options, or a ``.json`` of LeRobot's image transforms
    (:func:`read_lerobot_image_transforms`, mapped by ``AugmentConfig.from_lerobot``). ValueError names the flag
    and the file (AugmentConfig's own messages, and an OSError's for a file that is missing or unreadable, do not
    say which flag gave it)."""
    from lerobot_dali.augment_config import AugmentConfig

    if path.suffix.lower() == ".json":
        image_transforms = read_lerobot_image_transforms(path, "--augment")
        try:
            return AugmentConfig.from_lerobot(image_transforms)
        except ValueError as e:
            raise ValueError(f"--augment {path}: {e}") from e
    try:
        return AugmentConfig.from_toml(path)
    except ValueError as e:  # (invalid TOML too: tomllib's error is a ValueError)
        raise ValueError(f"--augment {path}: {e}") from e
    except OSError as e:
        raise ValueError(f"--augment {path}: {e.strerror or e}") from e


def read_lerobot_image_transforms(path: Path, flag: str) -> dict[str, Any]:
    """LeRobot's image-transform options (``ImageTransformsConfig``'s dict form) from a JSON file: a LeRobot
    ``train_config.json``'s ``dataset.image_transforms``, or that dict alone. ValueError names ``flag`` and the file.
    """
    try:
        document = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from e
    except ValueError as e:  # (invalid JSON, or not UTF-8)
        raise ValueError(f"{flag} {path}: not JSON ({e})") from e
    if isinstance(document, dict) and isinstance(document.get("dataset"), dict):
        document = document["dataset"].get("image_transforms")
    if not isinstance(document, dict) or "tfs" not in document:
        raise ValueError(
            f"{flag} {path}: expected LeRobot's image transforms, a train config's dataset.image_transforms or "
            "that table alone (with 'tfs' and, for them to apply, 'enable': true)"
        )
    return document


def check_files(options: TrainOptions) -> None:
    """Read ``--recipe`` and ``--augment`` and check ``--checkpoint-dir`` and ``--record`` (writable, outside the
    datasets: what can be checked before the datasets open): a mistake raises ValueError or an OSError before any
    process group starts or any dataset downloads (``--record``'s was a traceback once the run had trained, its record
    lost)."""
    from pipelines.recipes import get_recipe

    if options.recipe:
        get_recipe(options.recipe)
    if options.augment:
        read_augment(options.augment)
    if options.checkpoint_dir is not None:
        check_checkpoint_dir(options.checkpoint_dir, resume=options.resume)
        refuse_inside_datasets("--checkpoint-dir", options.checkpoint_dir, options.datasets)
    if options.record_dir is not None:
        refuse_unwritable("--record", options.record_dir)
        refuse_inside_datasets("--record", options.record_dir, options.datasets)


def open_readers(options: TrainOptions) -> list[Any]:
    """The datasets to train on, opened; several keep the keys and cameras all of them have (a mixture's), under
    the names ``--rename-map`` gives them."""
    from lerobot_dali.dataset_reader import open_dataset
    from lerobot_dali.dataset_union import concat_datasets, open_all
    from lerobot_dali.errors import CameraSelectionError
    from lerobot_dali.key_rename import flag_at_fault, rename_maps_for, shared_selection, without_cameras_left_out

    count = len(options.datasets)
    maps = options.rename_map if isinstance(options.rename_map, tuple) else (options.rename_map,) * count
    try:  # (each with its own keys for --cameras, names as the mixture's batches: no unrecorded camera looked for)
        if count == 1:  # (its --cameras mistake said as a mixture's)
            return [open_dataset(options.datasets[0], episodes=options.episodes, cameras=options.cameras)]
        readers = open_all(options.datasets, cameras=options.cameras, rename_maps=maps)
    except CameraSelectionError as e:
        raise RunRefused(f"{flag_at_fault(e)}: {e}") from e
    rates = {reader.location.description: reader.fps for reader in readers}
    if len(set(rates.values())) > 1:  # (the library mixes them; this script's windows count frames at one fps)
        raise RunRefused(f"the datasets run at different fps ({rates}); train on datasets of one fps")
    try:
        renames = rename_maps_for(
            without_cameras_left_out(options.rename_map, readers), readers, cameras=options.cameras
        )
    except ValueError as e:  # (a flag's mistake: one line, as the others)
        raise RunRefused(f"--rename-map: {e}") from e
    if options.concat:  # (one reader, its keys under the new names: the rest of this script reads one dataset)
        each = options.dataset_options()  # (the union holds those given per dataset; the iterator the others)
        sources = [o["timestamp_source"] for o in each] if isinstance(options.timestamp_source, tuple) else None
        tolerances = [o.get("tolerance_s") for o in each] if isinstance(options.tolerance_s, tuple) else None
        union = concat_datasets(
            readers, cameras=options.cameras, rename_maps=[dict(r.to_batch) for r in renames],
            timestamp_sources=sources, tolerances_s=tolerances,
        )  # fmt: skip
        _need_a_shared_camera([union], options, union.members)
        return [union]
    readers = shared_selection(readers, cameras=options.cameras, keys=None, renames=renames)
    _need_a_shared_camera(readers, options, readers)
    return readers


def _need_a_shared_camera(readers: Sequence[Any], options: TrainOptions, datasets: Sequence[Any]) -> None:
    """``readers`` (the datasets narrowed to what they share) must keep a camera where ``datasets`` have some."""
    if not readers[0].all_camera_keys and options.cameras is None and any(r.info.camera_keys for r in datasets):
        cameras = {reader.location.description: list(reader.info.camera_keys) for reader in datasets}
        raise RunRefused(
            f"the datasets share no camera key ({cameras}), so the policy would see no image: give cameras of "
            "theirs one name with --rename-map, or mix datasets that have a camera of one name"
        )


def dataset_renames(options: TrainOptions, readers: Sequence[Any]) -> list[KeyRename]:
    """Each dataset's part of ``--rename-map``: its entries for keys the dataset reads (a key a mixture leaves out
    is renamed in none)."""
    from lerobot_dali.key_rename import KeyRename

    given = options.rename_map
    maps = given if isinstance(given, tuple) else (given or {},) * len(readers)
    return [
        KeyRename.checked({k: v for k, v in rename_map.items() if k in reader.read_keys}, reader)
        for rename_map, reader in zip(maps, readers, strict=True)
    ]


def check_policy_features(readers: Sequence[Any], renames: Sequence[KeyRename]) -> None:
    """Read ``observation.state`` and ``action`` of each dataset's first episode: vectors other than info.json
    declares (r1_v30_h264's state holds 41 values a row where info.json declares 17) fail here, before the model,
    optimiser and worker processes are built, and with advice for this policy, which cannot leave either out."""
    from lerobot_dali.errors import SchemaMismatchError

    for reader, rename in zip(readers, renames, strict=True):
        own = [name for k in (STATE_KEY, ACTION_KEY) if (name := rename.own_name(k)) in reader.tabular_keys]
        for pos in reader.first_episodes():  # (a feature missing altogether: build_policy names it)
            try:
                reader.read_episode(pos, own)
            except SchemaMismatchError as e:
                found = str(e).partition("; the data file and info.json disagree")[0]  # (its advice: leave it out)
                raise SchemaMismatchError(
                    f"{found}. train.py's policy reads {STATE_KEY!r} and {ACTION_KEY!r} and cannot leave either out: "
                    "correct the feature's shape and names in the dataset's meta/info.json (and its statistics in "
                    "meta/stats.json) to what the data files hold, or train on another dataset"
                ) from e


def build_iterator(
    readers: Any, plan: DataPlan, options: TrainOptions, *, rank: int, world_size: int, device: str
) -> Any:
    """This rank's iterator over ``readers`` (one reader, or a list: a mixture of several), reading the windows,
    image size and augmentation of ``plan``."""
    from lerobot_dali.iterator import DALILeRobotIterator
    from lerobot_dali.mixture import DALILeRobotMixture

    readers = readers if isinstance(readers, list) else [readers]
    several = len(readers) > 1
    own = options.dataset_options()
    if several:
        renames = dataset_renames(options, readers)
        own = [{**o, "rename_map": dict(rename.to_batch)} for o, rename in zip(own, renames, strict=True)]
    return (DALILeRobotMixture if several else DALILeRobotIterator)(
        readers if several else readers[0],
        **({"weights": options.weights, "dataset_options": own} if several else {"drop_last": True, **own[0]}),
        batch_size=options.batch_size,
        delta_timestamps=plan.delta_timestamps,
        shuffle=True,
        seed=options.seed,
        episode_pool_size=options.episode_pool_size,
        episode_piece_frames=options.episode_piece_frames,
        drop_n_last_frames=plan.drop_n_last_frames,
        device=device,
        decode=DecodePreference.parse(options.decode),
        num_workers=options.num_workers,
        image_size=plan.image_size,
        augment=plan.augment,
        rank=rank,
        world_size=world_size,
    )


def feature_stats(
    reader: Any, key: str, *, max_episodes: int = 32, stats: Mapping[str, Any] | None = None
) -> FeatureStats:
    """Mean/std of a vector feature: the dataset's statistics when they have them (``meta/stats.json``, or v2.1's
    aggregated per-episode statistics; ``stats`` when the caller read them already), else from up to
    ``max_episodes`` episodes spread over the dataset. Identical on every rank: no data order involved. Rows of those
    episodes that are not finite are refused (the mean and std would be NaN); the other episodes' reach the batches
    as stored, as LeRobot reads them, and :class:`FiniteLoss` refuses the loss they make."""
    stats = reader.read_stats() if stats is None else stats
    entry = stats.get(key, {})
    if "mean" in entry and "std" in entry:
        _refuse_unusable_stats(reader, key, entry["mean"], entry["std"])
        return FeatureStats(mean=tuple(entry["mean"].ravel().tolist()), std=tuple(entry["std"].ravel().tolist()))
    positions = np.unique(np.linspace(0, reader.num_episodes - 1, min(max_episodes, reader.num_episodes)).astype(int))
    episodes = []
    for position in positions:
        read = reader.read_episode(int(position), [key])
        if not np.isfinite(read[key]).all():  # (their mean and std NaN: every value normalised by them NaN, unsaid)
            raise StatsError(
                f"{reader.location.description}: the dataset has no statistics of {key!r} and its rows in episode "
                f"{int(read['episode_index'][0])} hold NaN or infinity, which a policy cannot train on: mend the data "
                "files, or train on episodes without them (--episodes)"
            )
        episodes.append(read[key].astype(np.float64))
    rows = np.concatenate(episodes)
    rows = rows.reshape(len(rows), -1)
    return FeatureStats(mean=tuple(rows.mean(0).tolist()), std=tuple(rows.std(0).tolist()))


def _refuse_unusable_stats(reader: Any, key: str, mean: np.ndarray, std: np.ndarray) -> None:
    """Refuse (:class:`StatsError`) the statistics of ``key`` that the policy cannot normalise by: a mean or std that
    is not finite (every value normalised by it NaN), not of the feature's size in info.json (the policy refused
    to build, a bare ValueError) or a negative std (refused by :class:`FeatureStats`, not naming the dataset)."""
    shape = list(reader.info.features[key].shape)
    size = int(np.prod(shape))
    entries = (("mean", mean), ("std", std))
    faults = [f"{name} is not finite (NaN or infinity)" for name, v in entries if not np.isfinite(v).all()]
    faults += [
        f"{name} holds {v.size} values, but the feature has {size} in info.json (shape {shape})"
        for name, v in entries
        if v.size != size
    ]
    if (std < 0).any():
        faults.append(f"std is negative at components {np.flatnonzero(std.ravel() < 0)[:10].tolist()}")
    if faults:
        raise StatsError(
            f"{reader.location.description}: the statistics of {key!r} cannot normalise it: {'; '.join(faults)}: "
            "recompute them from the data files, or download or copy meta/stats.json (v2.1: "
            "meta/episodes_stats.jsonl) again; `lerobot-dali check` lists every statistics fault of a dataset"
        )


def build_policy(
    readers: Any,
    plan: DataPlan,
    camera_channels: Mapping[str, int] | None = None,
    weights: Sequence[float] | None = None,
    renames: Sequence[KeyRename] | None = None,
) -> ChunkPolicy:
    """The policy for the datasets' cameras (``camera_channels``: the iterator's, for grey image cameras) and
    state/action sizes and the plan's windows, with the datasets' normalisation: ``readers`` is one reader, or a
    mixture's list, whose statistics are pooled by ``weights`` (its shares of a batch); ``renames``: a mixture's
    (each dataset's keys under the batches' names)."""
    from lerobot_dali.key_rename import KeyRename

    readers = readers if isinstance(readers, list) else [readers]
    renames = list(renames) if renames is not None else [KeyRename()] * len(readers)
    reader, rename = readers[0], renames[0]  # (a mixture's datasets share the keys, cameras and shapes)
    features = reader.info.features
    own: dict[str, list[str]] = {}  # each dataset's own name of the state and the action
    for key in (STATE_KEY, ACTION_KEY):
        names = [r.own_name(key) for r in renames]
        own[key] = [name for name in names if name is not None]
        if len(own[key]) < len(names) or any(n not in r.tabular_keys for n, r in zip(own[key], readers, strict=True)):
            has = rename.batch_names(reader.tabular_keys)  # (a mixture's: the keys every dataset has)
            raise RunRefused(
                f"the {'datasets read' if len(readers) > 1 else 'dataset has'} no {key!r} feature (only {has}); this "
                "policy needs both"
            )
    cameras = rename.batch_names(reader.all_camera_keys)  # image-dtype cameras too: the policy sees both alike
    config = PolicyConfig(
        camera_keys=tuple(cameras),
        camera_channels=tuple((camera_channels or {}).get(key, 3) for key in cameras),
        state_key=STATE_KEY,
        action_key=ACTION_KEY,
        state_dim=int(np.prod(features[own[STATE_KEY][0]].shape)),
        action_dim=int(np.prod(features[own[ACTION_KEY][0]].shape)),
        chunk=plan.chunk,
        camera_steps=plan.camera_steps,
        state_steps=plan.state_steps,
    )
    stats = [r.read_stats() for r in readers]  # read (for v2.1: aggregated) once for both
    pooled = {
        key: pooled_stats(
            [feature_stats(r, name, stats=s) for r, name, s in zip(readers, own[key], stats, strict=True)], weights
        )
        for key in (STATE_KEY, ACTION_KEY)
    }
    return ChunkPolicy(config, state_stats=pooled[STATE_KEY], action_stats=pooled[ACTION_KEY])


def pooled_stats(parts: Sequence[FeatureStats], weights: Sequence[float] | None = None) -> FeatureStats:
    """Mean/std of the mixture of ``parts`` drawn in proportion to ``weights`` (None: one part)."""
    if len(parts) == 1:
        return parts[0]
    if weights is None or len(weights) != len(parts):
        raise ValueError(f"pooling {len(parts)} statistics needs one weight each, got {weights!r}")
    w = np.asarray(weights, np.float64)[:, None] / float(np.sum(weights))
    means, stds = np.array([p.mean for p in parts]), np.array([p.std for p in parts])
    mean = (w * means).sum(0)
    var = (w * (stds**2 + means**2)).sum(0) - mean**2
    return FeatureStats(mean=tuple(mean.tolist()), std=tuple(np.sqrt(np.maximum(var, 0.0)).tolist()))


def epoch_batches(iterator: Any) -> Iterator[tuple[dict[str, Any], float]]:
    """Batches across epochs, each with the seconds spent waiting for it.

    The iterator rolls to the next epoch by itself when one is done, which also keeps a resumed position (an
    explicit ``set_epoch`` counter here could undo it). A resume exactly at an epoch's end (its last batch, or
    its dropped tail) yields one empty pass; two in a row mean no full batch fits an epoch at all (:class:`RunRefused`:
    one line, exit status 2).
    """
    empty_passes = 0
    while True:
        batches = iter(iterator)
        got = 0
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            got += 1
            yield batch, time.perf_counter() - start
        empty_passes = 0 if got else empty_passes + 1
        if empty_passes > 1:
            raise no_full_batch(iterator.rank, iterator.batch_size)


def no_full_batch(rank: int, batch_size: int) -> RunRefused:
    """The refusal of a ``--batch-size`` larger than a rank's samples in an epoch."""
    return RunRefused(
        f"rank {rank} gets no full batch of {batch_size} from an epoch; lower --batch-size or use a dataset with more "
        "frames per rank"
    )


def camera_frames(batch: dict[str, Any], camera_keys: Sequence[str]) -> int:
    """Decoded camera frames in a batch: B per camera, B*T for a (B, T, C, H, W) window."""
    return sum(int(np.prod(batch[k].shape[: batch[k].ndim - 3])) for k in camera_keys)


# -- checkpoints ----------------------------------------------------------------------------------------------
def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(directory: Path) -> None:
    """fsync every file under ``directory`` and every folder (a folder's entries are the renames into it).

    Every rank syncs the whole tree: which files a rank wrote depends on accelerate's backend (DDP: rank 0 the
    model, each rank its RNG file; FSDP and DeepSpeed: shards per rank), and a shared filesystem may flush only
    the writer's own writes. It costs each rank one fsync per file of the checkpoint, in parallel."""
    for folder, _, names in os.walk(directory):
        for name in names:
            _fsync(os.path.join(folder, name))
        _fsync(folder)


def data_signature(plan: DataPlan, cameras: Sequence[str]) -> dict[str, Any]:
    """What the policy's shapes follow (windows, image size, cameras) and the frames' augmentation, as a checkpoint
    records them: a resume with other ones fails naming them, not inside ``load_state_dict`` or, where the shapes
    happen to agree (as they always do for other augmentation), not at all.
    The augmentation is compared as mapped: a TOML and a LeRobot JSON that configure the same are the same, and one
    that augments nothing (``enable: false``) is none.
    """
    signature = {
        "delta_timestamps": plan.delta_timestamps, "image_size": plan.image_size, "cameras": list(cameras),
        "augment": augment_signature(plan.augment),
    }  # fmt: skip
    return json.loads(json.dumps(signature))  # as read back: lists, not tuples


def augment_signature(augment: AugmentConfig | None) -> dict[str, Any] | None:
    """The augmentation as a checkpoint records it (this script's and ``lerobot_policy.py``'s): as mapped, so that
    configs of other forms that configure the same compare equal, and None for one that augments nothing."""
    from lerobot_dali.augment_config import AugmentConfig

    return None if augment is None or augment == AugmentConfig() else augment.to_dict()


def save_checkpoint(
    accelerator: Any,
    root: Path,
    step: int,
    iterator: Any,
    data: Mapping[str, Any] | None = None,
    *,
    stream: Mapping[str, Any] | None = None,
) -> Path:
    """Model, optimiser and RNG via accelerate; this rank's stream position (``stream``, where a batch was taken
    since the step: else ``iterator.state_dict()``) and ``data`` (:func:`data_signature`); then ``latest`` once all
    have saved.

    The ranks write ``.step_{n:08d}.partial``, which becomes ``step_{n:08d}`` once every file is on disk: a step
    saved before (by a run stopped before ``latest`` named it, maybe on more ranks) is replaced whole, never
    written over in place, where its other ranks' files (``random_states_{r}.pkl``, ``stream_rank{r}.json``)
    would stay beside the new ones and be loaded by a later resume on that many ranks."""
    directory = root / f"step_{step:08d}"
    staging = _staging(directory)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging / "state"))
    position = iterator.state_dict() if stream is None else dict(stream)
    saved = {"step": step, "rank": iterator.rank, "world_size": iterator.world_size, "stream": position}
    if data is not None:
        saved["data"] = dict(data)
    write_whole(staging / f"stream_rank{iterator.rank}.json", json.dumps(saved).encode())
    accelerator.wait_for_everyone()
    _sync_tree(staging)  # every rank's files complete: latest must never name one a crash left empty
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _replace_folder(staging, directory)
        write_whole(root / "latest", directory.name.encode())
        _fsync(root)  # the rename of latest itself
        logger.info("saved checkpoint %s", directory)
    accelerator.wait_for_everyone()
    return directory


@contextlib.contextmanager
def staged_folder(directory: Path) -> Iterator[Path]:
    """A new folder to write ``directory``'s files into (``.<name>.partial`` beside it; one a killed run left is
    removed first) that replaces ``directory`` whole once the block ends, every file on disk first (as
    :func:`save_checkpoint` publishes a checkpoint): a crash or a signal mid-write leaves the old folder, never a
    half-written one that a later run reads as whole. Removed where the block raises. One process writes it.
    ``directory`` a symbolic link: the folder it leads to is replaced, the link kept (the link itself was: the next
    replace failed with NotADirectoryError, on the link set aside)."""
    directory = Path(os.path.realpath(directory))  # ('.' has no name to write beside; a link's folder is replaced)
    staging = _staging(directory)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        _sync_tree(staging)
        _replace_folder(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staging(directory: Path) -> Path:
    """Where :func:`save_checkpoint` and :func:`staged_folder` write ``directory`` until it is whole."""
    return directory.with_name(f".{directory.name}.partial")


def _replace_folder(staging: Path, directory: Path) -> None:
    """Rename ``staging`` to ``directory``, an earlier ``directory`` set aside first and removed after (put back where
    the second rename fails or is interrupted: ``directory`` is never left missing)."""
    old = _set_aside(directory)
    _put_back(directory)  # (a run killed between the two renames)
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    try:
        staging.rename(directory)
    except BaseException:
        _put_back(directory)
        raise
    _fsync(directory.parent)  # both renames
    shutil.rmtree(old, ignore_errors=True)


def _set_aside(directory: Path) -> Path:
    """Where :func:`_replace_folder` keeps ``directory`` while its new copy is renamed into its place."""
    return directory.with_name(f".{directory.name}.replaced")


def _put_back(directory: Path) -> None:
    """``directory`` set aside by a :func:`_replace_folder` killed before its new copy took its place (SIGKILL, a
    power cut between the two renames): renamed back, whole, where ``directory`` is missing. Left there, the next
    replace deleted it, and a resume found no checkpoint where ``latest`` pointed, nor a policy in ``--output-dir``."""
    old = _set_aside(directory)
    if old.is_dir() and not (directory.exists() or directory.is_symlink()):
        with contextlib.suppress(FileNotFoundError):  # (another rank put it back meanwhile)
            old.rename(directory)


def check_checkpoint_dir(root: Path, *, resume: bool) -> None:
    """``root`` as ``--checkpoint-dir``: a folder this process can write or make (else a save would fail only after
    ``--save-every`` steps of training; made by the first save, so a run that fails before leaves none behind), and,
    without ``--resume``, holding no checkpoint: a run from step 0 would replace that run's ``latest`` at its first
    save and its checkpoints step by step (a relaunch that forgot ``--resume`` loses the progress); with ``--resume``,
    a ``latest`` that names no checkpoint (:func:`latest_checkpoint`)."""
    refuse_unwritable("--checkpoint-dir", root)
    marker = root / "latest"
    if resume:
        latest_checkpoint(root)  # (one it cannot resume from: refused before any dataset opens)
    elif _stands(marker):
        name = marker.read_text(errors="replace").strip() if marker.is_file() else "its 'latest' not a file"
        raise FileExistsError(
            f"--checkpoint-dir {root} holds a checkpoint ({name}): pass --resume to continue that run, or give "
            "a new --checkpoint-dir (a run from step 0 would replace its checkpoints)"
        )


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names, None where there is no ``latest``; :class:`RunRefused` where it names no
    checkpoint of ``root`` (``step_NNNNNNNN`` with its ``stream_rank0.json``): edited, or another tool's file. Each
    was a traceback once the dataset had opened (a ``FileNotFoundError``; a ``latest`` that is a folder: after
    training, at the first save)."""
    marker = root / "latest"
    if not _stands(marker):
        return None
    name = marker.read_text(errors="replace").strip() if marker.is_file() else None
    if name is not None and re.fullmatch(r"step_\d{8}", name):
        _put_back(root / name)
    if name is None or not re.fullmatch(r"step_\d{8}", name) or not (root / name / "stream_rank0.json").is_file():
        said = "is not a file" if name is None else f"names {name!r}, no checkpoint there"
        raise RunRefused(
            f"--checkpoint-dir {root}: its 'latest' {said} (a step_NNNNNNNN folder with stream_rank0.json): write the "
            "name of a complete checkpoint of it there, or give a new --checkpoint-dir"
        )
    return root / name


def _stands(marker: Path) -> bool:
    """Whether ``marker`` (``latest``) is there, a link to nothing included: one was taken for no checkpoint, so
    ``--resume`` started from step 0 (a warning), and its first save replaced the run's checkpoints."""
    return marker.exists() or marker.is_symlink()


def latest_saved_step(root: Path | None) -> int | None:
    """The step of the checkpoint ``--resume`` continues from (``latest`` as on disk: a rank interrupted in a save's
    last barrier may not know it is complete), None where there is none (or one that names no step) or no ``root``."""
    marker = root / "latest" if root is not None else None
    try:  # (a Ctrl-C's line: a 'latest' that names no step names none, said where a resume reads it)
        name = marker.read_text(errors="replace").strip() if marker is not None and marker.is_file() else ""
    except OSError:
        return None
    step = re.fullmatch(r"step_(\d{8})", name)
    return int(step.group(1)) if step else None


def _read_checkpoint(path: Path, load: Callable[[], Any], errors: tuple[type[Exception], ...] = ()) -> Any:
    """``load()``, which reads ``path`` (a rank's stream file, or accelerate's ``state``); :class:`RunRefused` naming it
    where it fails with an OSError, ValueError (bad JSON too) or one of ``errors``: a checkpoint damaged (a file
    missing, cut short or edited) or another program's. Each was a traceback."""
    caught: tuple[type[Exception], ...] = (OSError, ValueError, *errors)
    try:
        return load()
    except caught as e:
        first = (str(e).strip() or type(e).__name__).splitlines()[0]
        step = next((p for p in path.parents if re.fullmatch(r"step_\d{8}", p.name)), path.parent)
        raise RunRefused(
            f"{path} cannot be read ({type(e).__name__}: {first}): the checkpoint is damaged or not this script's; "
            f"resume from an earlier one (write its folder's name into {step.parent / 'latest'}) or give a "
            "new --checkpoint-dir"
        ) from e


def _stream_file(path: Path) -> dict[str, Any]:
    """A rank's stream file as :func:`save_checkpoint` writes it (``step``, ``stream``); :func:`_read_checkpoint`."""

    folder = re.fullmatch(r"step_(\d{8})", path.parent.name)

    def load() -> dict[str, Any]:
        saved = json.loads(path.read_text())
        if not (
            isinstance(saved, dict) and is_int(saved.get("step")) and saved["step"] >= 0
            and isinstance(saved.get("stream"), dict) and isinstance(saved.get("data", {}), dict)
        ):  # fmt: skip
            raise ValueError("not a stream file: expected an int 'step' >= 0, a 'stream' object and a 'data' object")
        if folder is not None and int(folder.group(1)) != saved["step"]:  # (a folder renamed, or a file copied in)
            raise ValueError(f"its step {saved['step']} is not its folder's ({path.parent.name})")
        return saved

    return _read_checkpoint(path, load)


#: What a file of torch.load raises, cut short or not one (besides OSError and ValueError): an empty file's EOFError,
#: a pickle's UnpicklingError, a zip archive's RuntimeError.
_TORCH_LOAD_ERRORS: tuple[type[Exception], ...] = (RuntimeError, pickle.UnpicklingError, EOFError)

#: The random states accelerate's ``save_state`` writes for every rank (Python's, NumPy's, torch's CPU generator).
_RANDOM_STATES = ("random_state", "numpy_random_seed", "torch_manual_seed")


def _load_state(accelerator: Any, directory: Path, *, rank: int, saved_world_size: Any) -> None:
    """``accelerator.load_state`` of the checkpoint ``directory``, by :func:`_read_checkpoint` (a file missing or cut
    short: accelerate's OSError or ValueError, safetensors' own error, torch's RuntimeError of a model of other shapes),
    this rank's random states checked first (:func:`_check_random_states`).
    """
    from safetensors import SafetensorError

    state = directory / "state"
    _check_random_states(state, rank=rank, saved_world_size=saved_world_size)
    _read_checkpoint(state, lambda: accelerator.load_state(str(state)), (*_TORCH_LOAD_ERRORS, SafetensorError))


def _check_random_states(state: Path, *, rank: int, saved_world_size: Any) -> None:
    """:class:`RunRefused` naming ``random_states_{rank}.pkl`` in accelerate's ``state`` folder where it is cut short,
    not accelerate's, or missing while the checkpoint was saved on this rank: accelerate's ``load_state`` skipped it
    with an INFO line, and the run resumed with its random generators as they stood, not as saved (other dropout,
    other noise), unsaid. A rank the saved run did not have (more ranks now) has none to load: said in a warning."""
    from accelerate.utils import load

    path = state / f"random_states_{rank}.pkl"
    saved_here = rank < saved_world_size if is_int(saved_world_size) else rank == 0
    if not path.is_file():
        if not saved_here:
            logger.warning(
                "rank %d: the checkpoint %s was saved on %s rank(s) and holds no random states for this one: its "
                "random generators start as a new run's", rank, state.parent, saved_world_size,
            )  # fmt: skip
            return
        if not (state.is_dir() and any(state.iterdir())):
            return  # (no accelerate state at all: load_state says so)

    def read() -> dict[str, Any]:
        states = load(path)
        if not (isinstance(states, dict) and all(key in states for key in _RANDOM_STATES)):
            raise ValueError(f"not accelerate's random states: expected a dict of {', '.join(_RANDOM_STATES)}")
        return states

    states = _read_checkpoint(path, read, _TORCH_LOAD_ERRORS)
    saved_gpus = len(states.get("torch_cuda_manual_seed") or ())
    if torch.cuda.is_available() and saved_gpus != torch.cuda.device_count():  # (accelerate skips them: INFO alone)
        logger.warning(
            "%s holds the random states of %d CUDA device(s), this process sees %d: the CUDA generators (dropout, "
            "noise drawn on the GPU) start as a new run's; resume where the run saved for the same draws",
            path, saved_gpus, torch.cuda.device_count(),
        )  # fmt: skip


def _saved_world_size(saved: Mapping[str, Any]) -> Any:
    """The world size a rank's stream file was written at (a mixture's stream state holds one per dataset)."""
    return saved.get("world_size", saved["stream"].get("world_size"))


def _gathered_stream(directory: Path, saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """``saved``'s stream state with every old rank's pool walk (:func:`~lerobot_dali.stream_state.merge_rank_states`,
    each dataset's in a mixture), so a resume on another world size replays none of their pools (4.6 s of CPU per
    rank at 95% of an epoch of 92,000 episodes saved on 8 ranks); as saved where a rank's file is missing or another
    run's."""
    world_size = _saved_world_size(saved)
    if world_size > sum(1 for _ in directory.glob("stream_rank*.json")):  # (an edited one: 10**12 paths were made)
        return saved["stream"]
    files = [directory / f"stream_rank{rank}.json" for rank in range(world_size)]
    if not all(path.is_file() for path in files):
        return saved["stream"]
    try:
        return _merged([json.loads(path.read_text())["stream"] for path in files])
    except (ValueError, KeyError, IndexError, TypeError) as e:  # (ResumeStateError and JSON's errors are ValueErrors)
        logger.debug("the old ranks' stream states in %s are not one run's (%s): their pools replay", directory, e)
        return saved["stream"]


def _merged(streams: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The ranks' ``streams`` as one (:func:`_gathered_stream`): a mixture's dataset by dataset."""
    first = streams[0]
    if "datasets" not in first:
        return merge_rank_states(streams)
    mixtures = [{k: v for k, v in stream.items() if k != "datasets"} for stream in streams]
    if any(mixture != mixtures[0] for mixture in mixtures) or len({len(s["datasets"]) for s in streams}) != 1:
        raise ResumeStateError(f"the old ranks' mixture states differ, not one run's: {mixtures}")
    datasets = [_merged([stream["datasets"][i] for stream in streams]) for i in range(len(first["datasets"]))]
    return {**first, "datasets": datasets}


#: The flags that set what a checkpoint's data must match (windows, image size, cameras, augmentation), named when it
#: does not.
DATA_OPTIONS = "--recipe, --chunk, --image-size, --cameras and --augment"


def restore_checkpoint(
    accelerator: Any,
    directory: Path,
    iterator: Any,
    data: Mapping[str, Any] | None = None,
    *,
    data_options: str = DATA_OPTIONS,
) -> int:
    """This rank's stream position, then model/optimiser/RNG; returns the step the checkpoint was taken at.

    The data side goes first: a checkpoint of other episodes or (``data``, :func:`data_signature`) other
    windows, image size, cameras or augmentation fails naming that (and ``data_options``, the flags that set them),
    before the model's shapes fail to load.
    After a world-size change a new rank may have no file of its own; any old rank's position serves, since
    all old ranks consumed equally many samples and the iterator re-shards the rest of the epoch; every old rank's
    file gives its pool walk (:func:`_gathered_stream`), so none of their pools is replayed.
    """
    first = _stream_file(directory / "stream_rank0.json")
    own = directory / f"stream_rank{iterator.rank}.json"
    saved = _stream_file(own) if own.is_file() else first
    if _saved_world_size(saved) != _saved_world_size(first):
        saved = first  # a file left by a run of another world size that wrote this step before (and crashed)
    recorded = saved.get("data")
    if data is not None and recorded is not None:
        differ = sorted(k for k in data.keys() & recorded.keys() if data[k] != recorded[k])  # (keys added later)
        if differ:
            raise RunRefused(
                f"{directory} was trained with other {', '.join(differ)} ("
                + "; ".join(f"{k}: saved {recorded[k]}, now {data[k]}" for k in differ)
                + f"): resume with the same {data_options}, or start in a new "
                "--checkpoint-dir"
            )
    stream = saved["stream"]
    world_size = _saved_world_size(saved)
    if is_int(world_size) and world_size != iterator.world_size:
        stream = _gathered_stream(directory, saved)
    iterator.load_state_dict(stream)
    _load_state(accelerator, directory, rank=iterator.rank, saved_world_size=_saved_world_size(saved))
    logger.info("resumed from %s at step %d (rank %d)", directory, saved["step"], iterator.rank)
    return int(saved["step"])


def resume_latest(
    accelerator: Any,
    root: Path,
    iterator: Any,
    data: Mapping[str, Any] | None,
    *,
    steps: int,
    data_options: str = DATA_OPTIONS,
) -> int:
    """The step to go on from: the latest checkpoint's under ``root``, restored (:func:`restore_checkpoint`), or 0
    where there is none yet (the first launch of a job that resumes itself after preemption)."""
    directory = latest_checkpoint(root)
    if directory is None:
        logger.warning("no checkpoint in %s: starting from step 0", root.resolve())
        return 0
    step = restore_checkpoint(accelerator, directory, iterator, data, data_options=data_options)
    if step >= steps:
        logger.warning(
            "the checkpoint is at step %d and --steps is %d: nothing to train (--steps counts from the start of "
            "training, not from the checkpoint)", step, steps,
        )  # fmt: skip
    return step


# -- throughput -----------------------------------------------------------------------------------------------
@dataclass
class Throughput:
    """Samples and decoded frames per second of this rank since the last report, and the share spent waiting
    for data (near 0 when the input pipeline keeps up with the model)."""

    samples: int = 0
    frames: int = 0
    wait_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def add(self, samples: int, frames: int, wait_s: float) -> None:
        self.samples += samples
        self.frames += frames
        self.wait_s += wait_s

    def report(self) -> tuple[float, float, float]:
        """``(samples/s, frames/s, data-wait fraction)``, then start a new window."""
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        out = (self.samples / elapsed, self.frames / elapsed, self.wait_s / elapsed)
        self.samples, self.frames, self.wait_s, self.since = 0, 0, 0.0, time.perf_counter()
        return out


@dataclass
class RunRecord:
    """What ``--record`` writes per rank: per step, the epoch, the dataset ``index`` values consumed and the
    local loss; the shape of every tensor of the first batch; at the end, per parameter tensor the sum of
    absolute values (equal on all ranks under DDP)."""

    first_step: int
    batch_shapes: dict[str, list[int]] = field(default_factory=dict)
    epochs: list[int] = field(default_factory=list)
    indices: list[torch.Tensor] = field(default_factory=list)
    #: A mixture's: per step the ``dataset_index`` of each sample (whose ``index`` it is).
    dataset_indices: list[torch.Tensor] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)

    def write(self, directory: Path, *, rank: int, world_size: int, model: torch.nn.Module) -> None:
        """Tensors are kept on the device during the run and read back here, so recording adds no per-step sync."""
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "rank": rank,
            "world_size": world_size,
            "first_step": self.first_step,
            "epochs": self.epochs,
            "batch_shapes": self.batch_shapes,
            "indices": [t.cpu().tolist() for t in self.indices],
            "dataset_indices": [t.cpu().tolist() for t in self.dataset_indices],
            "losses": [float(t) for t in self.losses],
            "param_abs_sums": [float(p.detach().double().abs().sum()) for p in model.parameters()],
        }
        write_whole(directory / f"rank{rank}.json", json.dumps(payload).encode())


# -- set-up errors --------------------------------------------------------------------------------------------
#: The library's own errors about what the run reads (:mod:`lerobot_dali.errors`: a dataset path that does not exist,
#: a ``--cameras`` key or ``--episodes`` index the dataset lacks, a checkpoint's stream of other episodes, ``--device
#: cuda`` where no GPU is seen): raised while the run is set up, each is the user's to fix and its message says how.
#: Anything else (a bug) keeps its traceback. With them this script's own refusals of what the run reads
#: (:class:`RunRefused`).
class RunRefused(ValueError):
    """What the run reads cannot be trained on as asked (datasets of different fps or of no shared camera, no
    state or action feature), differs from the checkpoint resumed (other windows, image size, cameras or
    augmentation), holds no full batch in an epoch or makes a loss that is not finite; the message says what to
    change."""


SETUP_ERRORS: tuple[type[Exception], ...] = (
    DatasetError, ShardingError, ResumeStateError, CudaUnavailableError, RunRefused
)  # fmt: skip


class SetupError(Exception):
    """An error of :data:`SETUP_ERRORS` before training started; :func:`exit_status` logs it as one line (each rank
    its own) and gives status 2, as for a flag's mistake."""


#: Set-up errors said without their type: about the command itself, as ``lerobot-dali`` says a GPU it lacks.
_SAID_UNTYPED = (RunRefused, CudaUnavailableError)


@contextlib.contextmanager
def setting_up() -> Iterator[None]:
    """Around a run's set-up (datasets, iterator, model, resume): an error of :data:`SETUP_ERRORS` raised there, or a
    PermissionError (a file of the dataset or the checkpoint this user may not read), becomes a :class:`SetupError`,
    whose message names the error type first (``DatasetNotFoundError: dataset 'x' not found ...``), as the
    ``lerobot-dali`` command prints it."""
    try:
        yield
    except SETUP_ERRORS as e:
        raise SetupError(str(e) if isinstance(e, _SAID_UNTYPED) else f"{type(e).__name__}: {e}") from e
    except PermissionError as e:  # (a dataset's file this user may not read: a traceback on every rank)
        raise SetupError(f"{type(e).__name__}: {e}: give this user access to it and the folders above it") from e


# -- preemption -----------------------------------------------------------------------------------------------
class Preempted(Exception):
    """A training loop (:class:`PreemptibleLoop`) stopped early on a preemption signal, every rank at ``step`` (saved
    in ``checkpoint`` where there is a ``--checkpoint-dir``); :func:`exit_status` gives :attr:`exit_status`."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"{signal.Signals(signum).name}: every rank stopped at step {step}")

    @property
    def exit_status(self) -> int:
        """:data:`EXIT_PREEMPTED` with a checkpoint to resume from; without, 128 + the signal, as the signal itself
        would have ended the process."""
        return EXIT_PREEMPTED if self.checkpoint is not None else 128 + self.signum


class PreemptionNotice:
    """Once installed: :data:`PREEMPTION_SIGNALS` are noted (they no longer end the process) and :meth:`agreed` tells
    every rank, at the same point of the same step, whether any rank has received one.

    A signal often reaches one rank, or reaches the ranks at different steps (SLURM signals the processes one by
    one, a spot instance's notice ends one node's ranks only); a rank that stopped alone would leave the others
    waiting in the gradients' all-reduce or the checkpoint's barrier. The handler only notes the signal: the loop
    acts on it between steps. SIGINT (Ctrl-C) keeps its KeyboardInterrupt. Outside the main thread (where Python
    takes no signal handlers) nothing is installed.

    Several ranks agree through an all-reduce (max) of the signal's number each step: on the CPU, on gloo (the
    process group's own where it is gloo, else a gloo group made for it), so it waits for no GPU work; its cost is
    one small message's round trip a step.
    """

    def __init__(self, world_size: int) -> None:
        self.received = 0
        self._group: Any = None
        self._previous: dict[int, Any] = {}
        import torch.distributed as dist

        self._agree = world_size > 1 and dist.is_available() and dist.is_initialized()
        if world_size > 1 and not self._agree:  # (accelerate on TPUs: ranks without torch.distributed)
            logger.warning("no torch.distributed process group: each rank stops on its own signals")
        if self._agree and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # (a collective: every rank makes it here)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in PREEMPTION_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._note)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _note(self, signum: int, frame: object) -> None:
        self.received = self.received or signum  # (the first: SLURM's early SIGUSR1, then its SIGTERM)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "no signal"

    def agreed(self) -> int:
        """The signal any rank has received (the highest number where several), 0 for none; every rank must call
        it at the same point (a collective)."""
        if not self._agree:
            return self.received
        import torch.distributed as dist

        flag = torch.tensor([self.received], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item())


class PreemptibleLoop:
    """A training loop's side of preemption (``train.py``'s and ``lerobot_policy.py``'s): on a preemption signal
    (:class:`PreemptionNotice`) every rank stops at one step boundary and saves a checkpoint there, with the stream
    position before the batch it did not train on; once the run is closed, :meth:`finishing` raises :class:`Preempted`::

        loop = PreemptibleLoop(accelerator, iterator, step=step, checkpoint_dir=checkpoint_dir, data=data)
        with contextlib.closing(iterator), loop:  # (the signals are noted from here on)
            while step < steps:
                got = loop.next_batch(batches, step)
                if got is None:  # every rank stops here
                    break
                ...  # the step
                step += 1
                loop.save_if_due(step, steps=steps, save_every=save_every)
            loop.stop(step)
        with loop.finishing(step):
            accelerator.end_training()
    """

    def __init__(
        self,
        accelerator: Any,
        iterator: Any,
        *,
        step: int,
        checkpoint_dir: Path | None,
        data: Mapping[str, Any],
        losses: FiniteLoss | None = None,
    ) -> None:
        self.accelerator, self.iterator, self.checkpoint_dir, self.data = accelerator, iterator, checkpoint_dir, data
        self.losses = losses  # (checked before each save: no checkpoint of weights a loss not finite has stepped)
        self.notice = PreemptionNotice(iterator.world_size)  # (may make a gloo group: a collective)
        self.saved = step if step else None  # (the checkpoint resumed from: a preemption before a step saves none)
        self.stopped_by = 0
        self.step = step  # (the steps trained: a Ctrl-C's Interrupted names the next, or this one where after_step)
        self.after_step = False  # (past the step's training: in its save, or after the last)
        self.checkpoint: Path | None = None
        self._position: dict[str, Any] | None = None

    def __enter__(self) -> PreemptibleLoop:
        self.notice.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if kind is not None:  # (without an error the handlers stay until finishing: a signal while closing is noted)
            self.notice.uninstall()
        self._interrupted(error, step=self.step, after_step=self.after_step)  # (Ctrl-C: say how to go on)

    def _interrupted(self, error: BaseException | None, *, step: int, after_step: bool) -> None:
        """Where ``error`` is a Ctrl-C (a plain KeyboardInterrupt), raise :class:`Interrupted`: one line that says
        which checkpoint a resume continues from, not a traceback."""
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, Interrupted):
            raise Interrupted(
                step, latest_saved_step(self.checkpoint_dir), self.checkpoint_dir, after_step=after_step
            ) from None

    def next_batch(
        self, batches: Iterator[tuple[dict[str, Any], float]], step: int
    ) -> tuple[dict[str, Any], float] | None:
        """The next ``(batch, wait_s)`` of ``batches`` (:func:`epoch_batches`), step ``step + 1``'s, or None where
        every rank stops at this boundary (a collective: every rank calls it once a step)."""
        self.step, self.after_step = step, False
        self._position = self.iterator.state_dict()  # the stream here: a preemption's checkpoint takes no batch more
        got = None
        try:
            if not self.notice.received:
                got = next(batches)
        except Exception as e:
            if not self.notice.received:
                raise
            # (A signal sent to the process group, as torchrun sends it, or to every process, as SLURM does, ends
            # the DALI workers too. The batch is read again on resume: the position is before it.)
            logger.warning(
                "rank %d: reading the batch of step %d failed after %s (%s: %s); the resumed run reads it",
                self.iterator.rank, step + 1, self.notice.name, type(e).__name__, str(e).partition(". ")[0],
            )  # fmt: skip
        self.stopped_by = self.notice.agreed()
        if self.stopped_by:
            return None
        assert got is not None  # (no rank had a signal: this one read its batch)
        return got

    def save_if_due(self, step: int, *, steps: int, save_every: int) -> None:
        """After step ``step`` of ``steps``, with a checkpoint folder: the checkpoint at the last step and every
        ``save_every`` steps (0: at the last only)."""
        # (trained: a Ctrl-C in the save counts it among the steps trained again, and says it came after it)
        self.step, self.after_step = step, True
        if self.checkpoint_dir is not None and (step == steps or (save_every and step % save_every == 0)):
            self._check_losses(step)
            save_checkpoint(self.accelerator, self.checkpoint_dir, step, self.iterator, self.data)
            self.saved = step

    def stop(self, step: int) -> None:
        """After the loop: where it stopped on a signal, with a checkpoint folder, the checkpoint at ``step`` (unless
        saved there already)."""
        if self.stopped_by and self.checkpoint_dir is not None:
            self.checkpoint = self.checkpoint_dir / f"step_{step:08d}"
            if self.saved != step:
                self._check_losses(step)
                save_checkpoint(
                    self.accelerator, self.checkpoint_dir, step, self.iterator, self.data, stream=self._position
                )

    def _check_losses(self, step: int) -> None:
        if self.losses is not None:
            self.losses.check(step)

    @contextlib.contextmanager
    def finishing(self, step: int) -> Iterator[None]:
        """Around closing the run (every rank: saving, ``end_training``); after it, where the loop stopped on a
        signal, raise :class:`Preempted`, rank 0 logging how to go on (the handlers stay, for :func:`exit_status` to
        ignore the signals from here on); else, or where closing raised, the signals' own handlers come back."""
        try:
            yield
        except BaseException as error:
            self.notice.uninstall()
            self._interrupted(error, step=step, after_step=True)  # (a Ctrl-C closing the run: one line, as in the loop)
            raise
        if self.stopped_by:
            preempted = Preempted(self.stopped_by, step, self.checkpoint)
            if self.accelerator.is_main_process:
                log_preemption(preempted)
            raise preempted
        self.notice.uninstall()


# -- training -------------------------------------------------------------------------------------------------
def train(options: TrainOptions) -> int:
    """Run to ``options.steps`` optimiser steps; returns the number of steps taken in this process.

    Once training has started, a preemption signal (:class:`PreemptibleLoop`) stops every rank at one step boundary,
    saves a checkpoint there (with ``--checkpoint-dir``) and raises :class:`Preempted` once the run is closed. An
    error of :data:`SETUP_ERRORS` before the first step raises :class:`SetupError` (:func:`setting_up`)."""
    from accelerate.utils import set_seed

    from lerobot_dali.key_rename import KeyRename

    with setting_up():  # (--device cuda where no GPU is seen: one line)
        accelerator = make_accelerator(options.device, options.mixed_precision)
    set_seed(options.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    with setting_up():  # (one process where a launcher started several: one line)
        rank, world_size = data_rank(accelerator)
    with setting_up():  # (the library's errors about the data or a checkpoint: main logs them as one line)
        readers = open_readers(options)
        if options.batch_size > sum(reader.num_frames for reader in readers):  # (no rank's epoch fills one: refused
            raise no_full_batch(rank, options.batch_size)  # before the pipeline; past 2**31, DALI's traceback there)
        renames = [KeyRename()] if options.concat else dataset_renames(options, readers)  # (a union's are its own)
        check_policy_features(readers, renames)
        cameras = tuple(renames[0].batch_names(readers[0].all_camera_keys))
        plan = data_plan(options, fps=readers[0].fps, camera_keys=cameras)
        iterator = build_iterator(
            readers, plan, options, rank=rank, world_size=world_size, device=iterator_device(accelerator.device)
        )
        policy = build_policy(readers, plan, iterator.camera_channels, getattr(iterator, "batch_shares", None), renames)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=options.lr)
        # Only the model and optimiser go through prepare; the iterator is already rank-disjoint (see module doc).
        model, optimizer = accelerator.prepare(policy, optimizer)

        step = 0
        data = data_signature(plan, cameras)
        if options.resume and options.checkpoint_dir is not None:
            step = resume_latest(accelerator, options.checkpoint_dir, iterator, data, steps=options.steps)
    start_step = step
    logger.info(
        "rank %d/%d: steps %d..%d, batch %d, %d batches left in epoch %d, cameras %s, recipe %s, windows %s",
        rank, world_size, step, options.steps, options.batch_size, len(iterator), iterator.epoch, cameras,
        options.recipe, {k: len(v) for k, v in plan.delta_timestamps.items()},
    )  # fmt: skip
    record = RunRecord(first_step=step + 1)
    meter = Throughput()
    model.train()
    batches = epoch_batches(iterator)
    losses = FiniteLoss(accelerator, options.checkpoint_dir)
    loop = PreemptibleLoop(
        accelerator, iterator, step=step, checkpoint_dir=options.checkpoint_dir, data=data, losses=losses
    )
    with contextlib.closing(iterator), loop:  # (a signal before: ends the process as before, no step trained to lose)
        while step < options.steps:
            got = loop.next_batch(batches, step)
            if got is None:  # a preemption signal: every rank stops at this step
                break
            batch, wait_s = got
            inputs = {k: v.to(accelerator.device, non_blocking=True) for k, v in batch.items() if torch.is_tensor(v)}
            loss = model(inputs)
            accelerator.backward(loss)
            if options.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), options.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.note(loss, step)
            if step == start_step + 1:
                meter.report()  # the first step carries pipeline start-up and warm-up: keep it out of the rates
            else:
                meter.add(len(batch["index"]), camera_frames(batch, cameras), wait_s)
            if options.record_dir is not None:
                if not record.batch_shapes:
                    record.batch_shapes = {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)}
                record.epochs.append(iterator.epoch)
                record.indices.append(batch["index"].detach())
                if "dataset_index" in batch:
                    record.dataset_indices.append(batch["dataset_index"])
                record.losses.append(loss.detach())
            if step % options.log_every == 0 or step == options.steps:
                log_progress(accelerator, step, iterator.epoch, loss, meter, world_size, losses)
            loop.save_if_due(step, steps=options.steps, save_every=options.save_every)
        loop.stop(step)
        losses.check(step)  # (the end: checked already at the last step; a preempted run's last step may not be)
        if options.record_dir is not None:
            record.write(options.record_dir, rank=rank, world_size=world_size, model=accelerator.unwrap_model(model))
    with loop.finishing(step):
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return step - start_step


def log_preemption(preempted: Preempted) -> None:
    """The line that says how to go on after :class:`Preempted` (rank 0's)."""
    if preempted.checkpoint is None:
        logger.warning(
            "%s; no checkpoint can be saved without --checkpoint-dir: a new run starts from step 0 (exit status %d)",
            preempted, preempted.exit_status,
        )  # fmt: skip
    else:
        logger.warning(
            "%s and saved %s: to continue from it, run the same command with --resume (exit status %d)",
            preempted, preempted.checkpoint, preempted.exit_status,
        )  # fmt: skip


#: Why a loss is not finite (:class:`FiniteLoss`).
_NOT_FINITE_CAUSE = (
    f"held NaN or infinity in its {STATE_KEY!r} or {ACTION_KEY!r} (read as the data files hold them, as LeRobot reads "
    "them), or training diverged, and the weights are NaN from there on"
)
#: What to do about a loss that is not finite, in ``train.py``'s flags (:class:`FiniteLoss`' ``remedy``).
NOT_FINITE_REMEDY = "mend the data files or train on episodes without such rows (--episodes), or lower --lr"


class FiniteLoss:
    """Whether every rank's loss has been finite so far, checked (:meth:`check`) where ``train.py`` logs, before each
    checkpoint's save and at the end of the run; a loss that was not is refused (:class:`RunRefused`, naming its step
    and the last checkpoint saved before it): the weights its gradient stepped are NaN from then on, and a checkpoint
    of them would be resumed from.

    Each step (:meth:`note`) the first step whose loss is not finite is kept on the loss's device (``torch.where``: a
    few kernels, no wait for the device); only :meth:`check` reads it back, once, after gathering every rank's (a
    collective: every rank checks at the same steps and reaches the same verdict). ``remedy`` says what to do, in the
    flags of the script whose loop it checks (:data:`NOT_FINITE_REMEDY`: ``train.py``'s)."""

    def __init__(self, accelerator: Any, checkpoint_dir: Path | None, *, remedy: str = NOT_FINITE_REMEDY) -> None:
        self.accelerator, self.checkpoint_dir, self.remedy = accelerator, checkpoint_dir, remedy
        self.first_step = torch.zeros((), dtype=torch.int64, device=accelerator.device)  # (0: none)
        self.first_loss = torch.zeros((), dtype=torch.float32, device=accelerator.device)
        self.checked: int | None = None  # (the step checked last)

    def note(self, loss: torch.Tensor, step: int) -> None:
        """Note step ``step``'s ``loss`` (a scalar, on the device the accelerator's)."""
        loss = loss.detach().float()
        first = ~torch.isfinite(loss) & (self.first_step == 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.first_loss = torch.where(first, loss, self.first_loss)

    def check(self, step: int) -> None:
        """:class:`RunRefused` where a loss noted through step ``step`` on any rank was not finite (every rank must
        call it at the same steps: a collective; a second call at ``step`` is none)."""
        if step == self.checked:
            return
        none = torch.iinfo(torch.int64).max
        steps = self.accelerator.gather(self.first_step).reshape(-1)  # (by rank)
        steps = torch.where(steps > 0, steps, none)
        earliest = int(steps.min())  # (the one value read back)
        if earliest != none:
            losses = self.accelerator.gather(self.first_loss).reshape(-1)
            raise self._refusal(earliest, float(losses[torch.argmin(steps)]))
        self.checked = step

    def _refusal(self, step: int, loss: float) -> RunRefused:
        if self.checkpoint_dir is None:
            resume = "no checkpoint is saved without --checkpoint-dir"
        else:
            saved = latest_saved_step(self.checkpoint_dir)  # (each save checked first: every one before step)
            resume = (
                f"no checkpoint is saved from step {step} on, and none was before it: a new run starts from step 0"
                if saved is None
                else f"no checkpoint is saved from step {step} on: resume only from one saved before it, the last "
                f"{self.checkpoint_dir / f'step_{saved:08d}'} (which --resume continues from)"
            )
        return RunRefused(
            f"the loss at step {step} is {loss} (a rank's at least): the batch of step {step} {_NOT_FINITE_CAUSE}: "
            f"{self.remedy}; {resume}"
        )


def log_progress(
    accelerator: Any, step: int, epoch: int, loss: torch.Tensor, meter: Throughput, world_size: int, losses: FiniteLoss
) -> None:
    """Rank 0 logs the loss averaged over ranks (every rank must call: collectives) and this rank's rates.

    A loss not finite, this step's or one since the last check, on any rank, is refused first (``losses.check``).
    The mean then sums each rank's share in float32, which cannot overflow: accelerate's mean sums in the loss's dtype,
    where two ranks' finite float16 losses of 40,000 made inf (float32 and bfloat16 only past 1.7e38 each)."""
    losses.check(step)
    mean_loss = float(accelerator.reduce(loss.detach().float() / world_size, reduction="sum"))
    samples_s, frames_s, wait = meter.report()
    if accelerator.is_main_process and samples_s == 0:  # only the warm-up step since the last report
        logger.info("step %d epoch %d loss %.4f | warm-up", step, epoch, mean_loss)
    elif accelerator.is_main_process:
        logger.info(
            "step %d epoch %d loss %.4f | per rank %.1f samples/s %.1f frames/s, data wait %.0f%% "
            "| all ranks ~%.1f samples/s",
            step, epoch, mean_loss, samples_s, frames_s, 100 * wait, samples_s * world_size,
        )  # fmt: skip


def exit_status(
    run: Callable[[], object], program: str, log: logging.Logger, *, checkpoint_dir: Path | None = None
) -> int:
    """A pipeline's exit status once it has called ``run`` (its training, with ``checkpoint_dir``): 0; 2 after a
    :class:`SetupError` or a :class:`RunRefused` (:func:`epoch_batches`' batch larger than an epoch), logged as one
    line (``program: message``), as a flag's mistake; after :class:`Preempted` or :class:`Interrupted` (Ctrl-C,
    logged as one line), their ``exit_status``. A Ctrl-C before the training loop (:class:`PreemptibleLoop` makes the
    loop's and closing's :class:`Interrupted`) is one line and 130 too: it was a traceback, the process killed by
    SIGINT (status -2, or 130 under a launcher)."""
    try:
        run()
    except (SetupError, RunRefused) as e:  # the datasets or the checkpoint (a batch larger than an epoch: in the
        log.error("%s: %s", program, e)  # loop): one line, not a traceback on every rank
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: which checkpoint a resume continues from, not a traceback
        interrupted = (
            e
            if isinstance(e, Interrupted)
            else Interrupted(0, latest_saved_step(checkpoint_dir), checkpoint_dir, setting_up=True)
        )
        return said(log, program, interrupted)
    except Preempted as e:  # (logged where it stopped)
        # Saved and closed: a signal now could only change the exit status (torchrun sends SIGTERM to the ranks left
        # once one has exited, which Python's shutdown, restoring the default handlers, would die of).
        for signum in PREEMPTION_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        return e.exit_status
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        options = parse_args(argv)
        check_files(options)
    except (ValueError, OSError) as e:  # flags, --recipe, --augment, --checkpoint-dir: one line, before training
        logger.error("train.py: %s", e)
        return 2
    except KeyboardInterrupt:  # (one line, as in every phase: it was a traceback)
        return said(logger, "train.py", Interrupted.while_starting())
    return exit_status(lambda: train(options), "train.py", logger, checkpoint_dir=options.checkpoint_dir)
