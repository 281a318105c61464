"""Train a small action-chunking policy on a LeRobot dataset through ``DALILeRobotIterator``.

One script for every launcher (see ``pipelines/README.md``)::

    python pipelines/train.py --dataset PATH --steps 1000 --device cuda            # one GPU
    accelerate launch --num_processes 8 pipelines/train.py --dataset PATH ...      # GPUs, nodes
    torchrun --nproc_per_node 2 --standalone pipelines/train.py --device cpu ...   # CPU, gloo

Data parallelism: accelerate wraps the model (DDP) and the optimiser; every rank builds its own iterator,
which reads episodes disjoint from the other ranks' and equally many samples per epoch. The iterator is
never given to ``accelerator.prepare``: accelerate would shard it again and each rank would keep 1/N of a
stream that is already its own 1/N.

Checkpoints (``pipelines/checkpoints.py``): ``CKPT/step_{n:08d}/state`` is ``accelerator.save_state`` (model,
optimiser, RNG states) and ``CKPT/step_{n:08d}/stream_rank{r}.json`` is rank ``r``'s iterator position, written under
a staging name and renamed once complete; ``CKPT/latest`` names the newest complete checkpoint and is written last,
once every rank has saved. ``--resume`` continues from it at the
exact next sample of every rank. ``CKPT`` must be visible to all nodes.

Preemption (``pipelines/preemption.py``): SIGTERM or SIGUSR1 (a scheduler's notice before it kills the job) on any
rank stops every rank at the same step boundary, saves a checkpoint there and exits with status
:data:`~pipelines.preemption.EXIT_PREEMPTED`; rerun with ``--resume`` (:class:`~pipelines.preemption.PreemptibleLoop`).
The loop is ``pipelines/training_loop.py``'s, which ``pipelines/lerobot_policy.py`` shares; the loss's checks and the
progress lines are ``pipelines/progress.py``'s, the errors said in one line ``pipelines/run_errors.py``'s.

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
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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

from lerobot_dali.cli_options import (
    ArgumentParser,
    add_episode_pool_size,
    add_image_size,
    add_timestamp_source,
    add_tolerance_s,
    check_image_size,
    described,
)
from lerobot_dali.decode_route import DecodePreference
from lerobot_dali.errors import StatsError
from lerobot_dali.new_folder import refuse_inside_datasets, refuse_unwritable
from lerobot_dali.open_files import refuse_workers_past_open_files
from lerobot_dali.sample_order import DEFAULT_EPISODE_POOL_SIZE
from lerobot_dali.value_checks import check_choice, check_int_fields, check_seconds, cli_flag, is_int, is_number
from lerobot_dali.wording import counted
from pipelines.checkpoints import (
    augment_signature,
    check_checkpoint_dir,
    held_for_this_run,
    latest_saved_step,
    resume_latest,
)
from pipelines.interrupts import LOG_LEVEL_ENV, Interrupted, configure_logging, ignore_preemption_signals, said
from pipelines.policy import ACTION_KEY, STATE_KEY, ChunkPolicy, FeatureStats, PolicyConfig
from pipelines.preemption import Preempted
from pipelines.progress import SKIPPED_IN_A_ROW, RunRecord
from pipelines.run_errors import DATA_ERRORS, RunRefused, SetupError, peer_ended, setting_up
from pipelines.training_loop import run_steps

if TYPE_CHECKING:
    from lerobot_dali.augment_config import AugmentConfig
    from lerobot_dali.key_rename import KeyRename

logger = logging.getLogger("pipelines.train")

_DEVICES = ("cpu", "cuda")
_PRECISIONS = ("no", "fp16", "bf16")
DEFAULT_CHUNK = 10
"""Actions per sample when neither ``--chunk`` nor a recipe's ``[action]`` window says."""
#: What to do about a loss not finite, in ``train.py``'s flags (:class:`~pipelines.progress.FiniteLoss`' ``remedy``).
NOT_FINITE_REMEDY = "mend the data files or train on episodes without such rows (--episodes), or lower --lr"
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
    #: Cameras DALI decodes: a batch's samples that read one file decode one clip (the iterator's ``share_clips``).
    share_clips: bool = False
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
    keep_checkpoints: int = 0
    resume: bool = False
    log_every: int = 50
    record_dir: Path | None = None

    def __post_init__(self) -> None:
        positive = (("steps", 1), ("batch_size", 1), ("chunk", 1), ("episode_pool_size", 1), ("log_every", 1))
        at_least_0 = (("num_workers", 0), ("save_every", 0), ("keep_checkpoints", 0), ("drop_n_last_frames", 0))
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
        if (self.resume or self.save_every or self.keep_checkpoints) and self.checkpoint_dir is None:
            raise ValueError("--resume, --save-every and --keep-checkpoints need --checkpoint-dir")
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
def parse_args(argv: Sequence[str] | None = None, *, log: logging.Logger | None = None) -> TrainOptions:
    """The options of ``argv`` (None: the command line's); ``log``: the logger that says a flag argparse refuses
    (main's: its lines carry the time and the launcher's rank), else stderr."""
    # (ArgumentParser's HelpFormatter wraps each help to the terminal, where RawTextHelpFormatter kept the helps'
    # lines as written, up to 188 characters, past any terminal)
    p = ArgumentParser(description=described(__doc__.split("\n\n")[0]), usage_on_error=False, log=log)
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
    p.add_argument("--share-clips", action="store_true", help=SHARE_CLIPS_HELP)
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
    p.add_argument(
        "--mixed-precision",
        type=str.lower,
        choices=_PRECISIONS,
        default="no",
        help="fp16 (CUDA): a step whose gradients are not finite is skipped by its gradient scaler, its loss not "
        f"finite warned of, and {SKIPPED_IN_A_ROW} such steps in a row refused (default %(default)s)",
    )
    p.add_argument(
        "--checkpoint-dir", type=Path, help="where checkpoints go, one folder a step and latest (default: none saved)"
    )
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every S steps (0: only at the end)")
    p.add_argument(
        "--keep-checkpoints", type=int, default=0, metavar="K",
        help="keep the K newest checkpoints, removing older ones as each is saved (default 0: keep all)",
    )  # fmt: skip
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
        share_clips=a.share_clips,
        timestamp_source=_one_or_each(a.timestamp_source), tolerance_s=_one_or_each(a.tolerance_s),
        rename_map=_one_or_each(a.rename_map), concat=a.concat,
        mixed_precision=a.mixed_precision,
        checkpoint_dir=a.checkpoint_dir,
        save_every=a.save_every, keep_checkpoints=a.keep_checkpoints, resume=a.resume, log_every=a.log_every,
        record_dir=a.record_dir,
    )  # fmt: skip


#: ``--share-clips``' help, train.py's and lerobot_policy.py's.
SHARE_CLIPS_HELP = (
    "the samples of a batch that read one video file decode one clip: made for NVDEC, where DALI makes a decoder\n"
    "per clip (cameras on DALI's CPU decoder share too); off by default until measured on a GPU"
)


def add_reading_options(p: argparse.ArgumentParser, *, several: bool) -> None:
    """``--cameras``, ``--timestamp-source`` and ``--tolerance-s``: which cameras a run reads and how its rows find
    their frames (``cr5_*``'s wall-clock timestamps need ``--timestamp-source frame_index``, ``gr00t_v20_h264``'s
    camera without files ``--cameras``). ``several``: one value, or one per ``--dataset`` (lists); else one (scalars).
    Shared by this script and ``pipelines/lerobot_policy.py``."""
    p.add_argument(
        "--cameras", nargs="+", metavar="KEY", help="read only these cameras (default: all that info.json declares)"
    )
    add_timestamp_source(p, per="--dataset" if several else None)
    add_tolerance_s(p, per="--dataset" if several else None, default=False)  # (None: the iterator's default)


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


@contextlib.contextmanager
def camera_flag_refused() -> Iterator[None]:
    """Around opening the datasets: a camera ``--cameras`` names that one lacks (or that ``--rename-map`` hides) is a
    :class:`RunRefused` naming that flag (``--cameras: unknown camera(s) ...``), one line as a flag's mistake."""
    from lerobot_dali.errors import CameraSelectionError
    from lerobot_dali.key_rename import flag_at_fault

    try:
        yield
    except CameraSelectionError as e:
        raise RunRefused(f"{flag_at_fault(e)}: {e}") from e


def open_readers(options: TrainOptions) -> list[Any]:
    """The datasets to train on, opened; several keep the keys and cameras all of them have (a mixture's), under
    the names ``--rename-map`` gives them."""
    from lerobot_dali.dataset_reader import open_dataset
    from lerobot_dali.dataset_union import concat_datasets, open_all
    from lerobot_dali.key_rename import rename_maps_for, shared_selection, without_cameras_left_out

    count = len(options.datasets)
    maps = options.rename_map if isinstance(options.rename_map, tuple) else (options.rename_map,) * count
    with camera_flag_refused():  # (each with its own keys for --cameras, names as the mixture's batches: no
        if count == 1:  # unrecorded camera looked for; one dataset's --cameras mistake said as a mixture's)
            return [open_dataset(options.datasets[0], episodes=options.episodes, cameras=options.cameras)]
        readers = open_all(options.datasets, cameras=options.cameras, rename_maps=maps)
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
        share_clips=options.share_clips,
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
    as stored, as LeRobot reads them, and :class:`~pipelines.progress.FiniteLoss` refuses the loss they make."""
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


def no_full_batch(rank: int, batch_size: int, samples: int | None = None) -> RunRefused:
    """The refusal of a ``--batch-size`` larger than a rank's samples in an epoch (``samples``, where known)."""
    of = "" if samples is None else f" of {counted(samples, 'sample')}"
    return RunRefused(
        f"rank {rank} gets no full batch of {batch_size} from an epoch{of}; lower --batch-size or use a dataset "
        "with more frames per rank"
    )


def refuse_short_epochs(iterator: Any, batch_size: int) -> None:
    """:func:`no_full_batch` where neither this epoch nor the next holds ``batch_size`` of this rank's samples, as
    the iterator counts them before it starts: a batch larger than a rank's share of the dataset (on several ranks;
    larger than the whole dataset is refused before the iterator is built) was refused at the first batch, once
    DALI's pipeline and workers had started, its epoch's count unsaid. (Two epochs, as :func:`epoch_batches`: ranks'
    counts differ a little between epochs. A mixture's shares are its datasets' iterators': found at the first
    batch.)"""
    epoch_samples = getattr(iterator, "epoch_samples", None)
    if epoch_samples is None:
        return
    now = epoch_samples(iterator.epoch)
    if now >= batch_size:  # (the common case: the next epoch's order is not dealt at start-up)
        return
    following = epoch_samples(iterator.epoch + 1)
    if following < batch_size:
        raise no_full_batch(iterator.rank, batch_size, max(now, following))


def batches_left(iterator: Any) -> str:
    """Where a run starts in its epoch, for its first line: a resume at an epoch's end said '0 batches left in epoch 0'
    (its next batch is epoch 1's)."""
    left = len(iterator)
    if left == 0:
        return f"epoch {iterator.epoch} read to its end"
    return f"{counted(left, 'batch')} left in epoch {iterator.epoch}"


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


def set_learning_rate(optimizer: Any, lr: float, *, say: bool) -> None:
    """``--lr`` over the rate a resumed optimiser's state brought back: accelerate's ``load_state`` restores its param
    groups, saved rate included, so a resume with another ``--lr`` trained on at the saved one, unsaid. Its moments
    are kept. ``say``: log the change (the main process)."""
    saved = sorted({float(group["lr"]) for group in optimizer.param_groups})
    if saved == [lr]:
        return
    for group in optimizer.param_groups:
        group["lr"] = lr
    if say:
        logger.info("--lr %g replaces the checkpoint's %s from here on (the optimiser's moments are kept)", lr,
                    ", ".join(f"{rate:g}" for rate in saved))  # fmt: skip


# -- training -------------------------------------------------------------------------------------------------
def train(options: TrainOptions) -> int:
    """Run to ``options.steps`` optimiser steps; returns the number of steps taken in this process.

    Once training has started, a preemption signal (:func:`~pipelines.training_loop.run_steps`) stops every rank at
    one step boundary, saves a checkpoint there (with ``--checkpoint-dir``) and raises :class:`Preempted` once the run
    is closed. An
    error of :data:`~pipelines.run_errors.SETUP_ERRORS` before the first step raises :class:`SetupError`
    (:func:`setting_up`)."""
    from accelerate.utils import set_seed

    with setting_up():  # (--device cuda where no GPU is seen: one line)
        accelerator = make_accelerator(options.device, options.mixed_precision)
    set_seed(options.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    with setting_up():  # (one process where a launcher started several: one line)
        rank, world_size = data_rank(accelerator)
    held = held_for_this_run(
        options.checkpoint_dir, resume=options.resume, rank=rank, world_size=world_size, device=accelerator.device
    )
    with held:
        return _train_as(accelerator, rank, world_size, options)


def _train_as(accelerator: Any, rank: int, world_size: int, options: TrainOptions) -> int:
    """:func:`train` on ``rank`` of ``world_size``, once its ``--checkpoint-dir`` is this run's alone."""
    from lerobot_dali.key_rename import KeyRename

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
        refuse_short_epochs(iterator, options.batch_size)
        policy = build_policy(readers, plan, iterator.camera_channels, getattr(iterator, "batch_shares", None), renames)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=options.lr)
        # Only the model and optimiser go through prepare; the iterator is already rank-disjoint (see module doc).
        model, optimizer = accelerator.prepare(policy, optimizer)

        step = 0
        data = data_signature(plan, cameras)
        if options.resume and options.checkpoint_dir is not None:
            step = resume_latest(accelerator, options.checkpoint_dir, iterator, data, steps=options.steps)
            set_learning_rate(optimizer, options.lr, say=accelerator.is_main_process)
    start_step = step
    if step < options.steps:  # (else resume_latest said there is nothing to train)
        logger.info(
            "rank %d/%d: steps %d..%d, batch %d, %s, cameras %s, recipe %s, windows %s",
            rank, world_size, step, options.steps, options.batch_size, batches_left(iterator), cameras,
            options.recipe, {k: len(v) for k, v in plan.delta_timestamps.items()},
        )  # fmt: skip
    record = RunRecord(first_step=step + 1)

    def train_step(batch: dict[str, Any]) -> torch.Tensor:
        inputs = {k: v.to(accelerator.device, non_blocking=True) for k, v in batch.items() if torch.is_tensor(v)}
        loss = model(inputs)
        accelerator.backward(loss)
        if options.grad_clip > 0:
            accelerator.clip_grad_norm_(model.parameters(), options.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def recorded(batch: dict[str, Any], loss: torch.Tensor) -> None:
        if not record.batch_shapes:
            record.batch_shapes = {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)}
        record.epochs.append(iterator.epoch)
        record.indices.append(batch["index"].detach())
        if "dataset_index" in batch:
            record.dataset_indices.append(batch["dataset_index"])
        record.losses.append(loss.detach())

    model.train()
    step, loop = run_steps(
        accelerator, iterator, epoch_batches(iterator), train_step, step=step, options=options, data=data,
        cameras=cameras, remedy=NOT_FINITE_REMEDY, after_step=None if options.record_dir is None else recorded,
    )  # fmt: skip
    with loop.finishing(step):
        if options.record_dir is not None:
            record.write(options.record_dir, rank=rank, world_size=world_size, model=accelerator.unwrap_model(model))
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return step - start_step


def exit_status(
    run: Callable[[], object], program: str, log: logging.Logger, *, checkpoint_dir: Path | None = None
) -> int:
    """A pipeline's exit status once it has called ``run`` (its training, with ``checkpoint_dir``): 0; 2 after a
    :class:`SetupError` or a :class:`RunRefused` (:func:`epoch_batches`' batch larger than an epoch), logged as one
    line (``program: message``), as a flag's mistake; after :class:`Preempted` or :class:`Interrupted` (Ctrl-C,
    logged as one line), their ``exit_status``. A Ctrl-C before the training loop (whose
    :class:`~pipelines.preemption.PreemptibleLoop` makes the loop's and closing's :class:`Interrupted`) is one line and
    130 too: it was a traceback, the process killed by SIGINT (status -2, or 130 under a launcher). Once training has
    started, 1 after an error of :data:`DATA_ERRORS` (the data a batch read: one line naming the file, episode and
    camera, its traceback and causes at DEBUG) or a collective failed because another rank ended
    (:func:`peer_ended`: one line saying so, that rank's error being its own); anything else keeps its traceback."""
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
        ignore_preemption_signals()
        return e.exit_status
    except DATA_ERRORS as e:  # a batch's data: the message names it all (it chained the same text 2-4 times)
        log.error("%s: %s: %s (its traceback: %s=DEBUG)", program, type(e).__name__, e, LOG_LEVEL_ENV)
        log.debug("%s: the error's traceback and causes", program, exc_info=e)
        return 1
    except Exception as e:
        gloo_said = peer_ended(e)
        if gloo_said is None:  # (this rank's own error: its traceback, whole)
            raise
        ignore_preemption_signals()  # (torchrun's SIGTERM to the ranks left: the status stays this one)
        log.error(
            "%s: another rank's process ended, and this rank's collective with it failed (gloo: %s): the error is "
            "that rank's, said above in its own lines (torchrun's summary names its exit code); this rank stops "
            "too (exit status 1)",
            program, gloo_said,
        )  # fmt: skip
        log.debug("%s: this rank's traceback", program, exc_info=e)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        options = parse_args(argv, log=logger)  # (argparse's refusal a logged line: with the rank)
        check_files(options)
    except (ValueError, OSError) as e:  # flags, --recipe, --augment, --checkpoint-dir: one line, before training
        logger.error("train.py: %s", e)
        return 2
    except KeyboardInterrupt:  # (one line, as in every phase: it was a traceback)
        return said(logger, "train.py", Interrupted.while_starting())
    return exit_status(lambda: train(options), "train.py", logger, checkpoint_dir=options.checkpoint_dir)
