"""Train one of LeRobot's own policies (ACT, Diffusion Policy, ...) on batches from ``DALILeRobotIterator``.

LeRobot builds the policy, its normalising processors and its optimiser and learning-rate schedule presets from
the dataset's metadata (features, fps, ``meta/stats.json``) and says which windows the policy reads
(``resolve_delta_timestamps``), as its own training script does; lerobot-dali reads the samples, one disjoint
stream per rank. The batches are what ``DataLoader(LeRobotDataset)`` gives, so LeRobot's preprocessor and
``policy.forward`` take them unchanged (``tests/test_lerobot_parity.py`` checks the loss is the same on both, for
ACT and Diffusion Policy). Needs ``lerobot`` importable: it pins its own torch, so run it from LeRobot's
environment::

    accelerate launch pipelines/lerobot_policy.py --dataset PATH_OR_REPO --policy act --steps 20000 --device cuda \\
        --checkpoint-dir ckpt --save-every 1000 --resume

Checkpoints are ``pipelines/train.py``'s (``pipelines/checkpoints.py``): model, optimiser, schedule and RNG through
accelerate, each rank's stream position, and the policy config, windows and image transforms they were trained with;
``--resume`` continues exactly where the last one stopped. So are the loop (``pipelines/training_loop.py``) and the
rest of the run's handling, from the pieces ``pipelines/train.py`` uses: a preemption signal (SIGTERM, SIGUSR1) on any
rank stops every rank at the same step boundary (``pipelines/preemption.py``), saves a checkpoint there
(``--output-dir`` is left to the resumed run) and exits with status 75 (``EXIT_PREEMPTED``; rerun with ``--resume``),
and lerobot-dali's errors about the dataset or the checkpoint while the run is set up are one logged line on each rank
and exit status 2 (``pipelines/run_errors.py``).

``--cameras``, ``--timestamp-source`` and ``--tolerance-s`` are ``pipelines/train.py``'s (one value each), so it reads
datasets such as ``cr5_*`` (``--timestamp-source frame_index``); the policy is built with the cameras read.

``--image-transforms`` turns on LeRobot's image transforms (its ``--dataset.image_transforms.enable=true``: LeRobot's
default ``ImageTransformsConfig``); ``--image-transforms-config FILE`` reads them from a LeRobot ``train_config.json``
(its ``dataset.image_transforms``) or a JSON of that table, as ``enable`` there says (``--image-transforms`` enables
them). They run on the device in the DALI graph, mapped by ``AugmentConfig.from_lerobot`` (what differs from LeRobot:
:mod:`lerobot_dali.augment_lerobot`).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.error import URLError

if TYPE_CHECKING:
    from lerobot_dali.augment_config import AugmentConfig

if __package__ in (None, ""):  # run as a script: make `pipelines` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # as pipelines.lerobot_policy, so that a Ctrl-C in the imports below (torch: seconds) is one
    from pipelines.interrupts import run_main  # line, not a traceback

    run_main("pipelines.lerobot_policy", "lerobot_policy.py", "lerobot_dali.pipelines.lerobot_policy")

from lerobot_dali.cli_options import ArgumentParser, add_episode_pool_size, described
from lerobot_dali.dataset_location import dataset_not_found, is_repo_id
from lerobot_dali.decode_route import DecodePreference
from lerobot_dali.errors import DatasetNotFoundError
from lerobot_dali.frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from lerobot_dali.new_folder import is_inside, refuse_inside_datasets, refuse_unwritable
from lerobot_dali.value_checks import check_choice, check_int_fields, check_seconds, cli_flag
from pipelines.checkpoints import (
    augment_signature,
    check_checkpoint_dir,
    held_for_this_run,
    resume_latest,
    staged_folder,
)
from pipelines.interrupts import Interrupted, configure_logging, said
from pipelines.run_errors import SetupError, setting_up
from pipelines.train import (
    SHARE_CLIPS_HELP,
    add_reading_options,
    batches_left,
    camera_flag_refused,
    check_decode,
    check_seed,
    data_rank,
    epoch_batches,
    exit_status,
    iterator_device,
    make_accelerator,
    read_lerobot_image_transforms,
    refuse_short_epochs,
)
from pipelines.training_loop import run_steps

logger = logging.getLogger("lerobot_dali.pipelines.lerobot_policy")

#: What to do about a loss that is not finite, in this script's flags (``FiniteLoss``' refusal; ``train.py``'s names
#: its ``--episodes`` and ``--lr``, which this script has not: a LeRobot policy's learning rate is its config's).
NOT_FINITE_REMEDY = "mend the data files, or lower the policy's learning rate (--policy-arg optimizer_lr=...)"


@dataclass(frozen=True, kw_only=True)
class PolicyTrainOptions:
    dataset: str
    revision: str | None = None
    policy: str = "act"
    #: Fields of the policy's LeRobot config (``chunk_size=50``, ``pretrained_backbone_weights=null``).
    policy_args: Mapping[str, Any] = field(default_factory=dict)
    #: LeRobot's ``--dataset.image_transforms.enable=true``: its transforms on (``image_transforms_config``'s, or
    #: LeRobot's defaults).
    image_transforms: bool = False
    #: LeRobot's ``ImageTransformsConfig`` as a dict (a train config's ``dataset.image_transforms``), applied as its
    #: ``enable`` says; None: LeRobot's defaults, where ``image_transforms``.
    image_transforms_config: Mapping[str, Any] | None = None
    steps: int = 1000
    batch_size: int = 8
    num_workers: int = 4
    episode_pool_size: int = 64
    device: str = "cuda"
    decode: str = "auto"
    #: Cameras DALI decodes: a batch's samples that read one file decode one clip (the iterator's ``share_clips``).
    share_clips: bool = False
    #: Read only these cameras (None: every camera info.json declares); the policy sees only these.
    cameras: tuple[str, ...] | None = None
    #: How rows find their frames (``frame_index`` for wall-clock timestamps, as ``cr5_*``'s), and how far a row's time
    #: may be from its frame (None: the iterator's default).
    timestamp_source: str = "parquet_timestamp"
    tolerance_s: float | None = None
    seed: int = 0
    log_every: int = 50
    #: Where the trained policy and its processors are saved (LeRobot's ``save_pretrained`` layout); None: not saved.
    output_dir: Path | None = None
    checkpoint_dir: Path | None = None
    save_every: int = 0  # steps between checkpoints; 0: only at the end (with checkpoint_dir)
    keep_checkpoints: int = 0  # the newest kept, older ones removed as each is saved; 0: all
    resume: bool = False

    def __post_init__(self) -> None:
        checked = (
            ("steps", 1), ("batch_size", 1), ("num_workers", 0), ("episode_pool_size", 1), ("log_every", 1),
            ("save_every", 0), ("keep_checkpoints", 0),
        )  # fmt: skip
        check_int_fields(self, checked, label=cli_flag)
        check_seed(self.seed)
        if not isinstance(self.image_transforms, bool):
            raise ValueError(f"image_transforms = {self.image_transforms!r} is invalid: expected true or false")
        if self.image_transforms_config is not None and not isinstance(self.image_transforms_config, Mapping):
            raise ValueError(
                f"image_transforms_config = {self.image_transforms_config!r} is invalid: expected LeRobot's "
                "ImageTransformsConfig as a dict (a train config's dataset.image_transforms) or None"
            )
        if self.checkpoint_dir is None and (self.resume or self.save_every or self.keep_checkpoints):
            raise ValueError("--resume, --save-every and --keep-checkpoints need --checkpoint-dir")
        check_choice(TimestampSource, "--timestamp-source", self.timestamp_source)
        check_decode(self.decode, self.device)
        if self.tolerance_s is not None:
            check_seconds("--tolerance-s", self.tolerance_s)
        if self.cameras is not None:
            if isinstance(self.cameras, str) or not all(isinstance(c, str) and c for c in self.cameras):
                raise ValueError(f"--cameras takes camera keys, got {self.cameras!r}")
            object.__setattr__(self, "cameras", tuple(self.cameras))


def _policy_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--policy-arg takes KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)  # numbers, null, true/false, lists
    except json.JSONDecodeError:
        return key, value  # a plain string


def parse_args(argv: Sequence[str] | None = None, *, log: logging.Logger | None = None) -> PolicyTrainOptions:
    """The options of ``argv`` (None: the command line's); ``log``: the logger that says a flag argparse refuses
    (main's: its lines carry the time and the launcher's rank), else stderr."""
    parser = ArgumentParser(description=described(__doc__.split("\n\n")[0]), usage_on_error=False, log=log)
    parser.add_argument("--dataset", required=True, help="local LeRobot dataset folder or Hub repo id")
    parser.add_argument("--revision", help="with a Hub repo id: the branch, tag or commit (metadata and data alike)")
    parser.add_argument("--policy", default="act", help="a LeRobot policy type: act, diffusion, ...")
    parser.add_argument(
        "--policy-arg", action="append", type=_policy_arg, default=[], metavar="KEY=VALUE",
        help="a field of the policy's config, VALUE as JSON (chunk_size=50, pretrained_backbone_weights=null)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=1000, help="optimiser steps in total (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step (default %(default)s)")
    parser.add_argument(
        "--num-workers", type=int, default=4, help="DALI worker processes per rank (default %(default)s)"
    )
    add_episode_pool_size(parser, default=64, help="episodes sampled from at once (default %(default)s)")
    parser.add_argument(
        "--device", type=str.lower, choices=("cuda", "cpu"), default="cuda", help="(default %(default)s)"
    )
    parser.add_argument(
        "--decode", type=str.lower, choices=("auto", "gpu", "cpu"), default="auto", help="(default %(default)s)"
    )
    parser.add_argument("--share-clips", action="store_true", help=SHARE_CLIPS_HELP)
    add_reading_options(parser, several=False)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50, help="steps between loss logs (default %(default)s)")
    parser.add_argument(
        "--output-dir", type=Path,
        help="save the trained policy and its processors here (a new or empty folder, or a policy saved before, "
        "which it replaces whole once the new one is written)",
    )  # fmt: skip
    parser.add_argument("--checkpoint-dir", type=Path, help="checkpoints for --resume (as pipelines/train.py's)")
    parser.add_argument("--save-every", type=int, default=0, help="steps between checkpoints (0: at the end only)")
    parser.add_argument(
        "--keep-checkpoints", type=int, default=0, metavar="K",
        help="keep the K newest checkpoints, removing older ones as each is saved (default 0: keep all)",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint, if any")
    parser.add_argument(
        "--image-transforms", action="store_true",
        help="LeRobot's image transforms on, as its --dataset.image_transforms.enable=true (its defaults, or "
        "--image-transforms-config's)",
    )  # fmt: skip
    parser.add_argument(
        "--image-transforms-config", type=Path, metavar="FILE",
        help="LeRobot's image transforms from a train_config.json (its dataset.image_transforms) or a JSON of that "
        "table; they apply as its 'enable' says, or with --image-transforms",
    )  # fmt: skip
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k not in ("policy_arg", "image_transforms_config")}
    path = args.image_transforms_config
    config = read_lerobot_image_transforms(path, "--image-transforms-config") if path is not None else None
    options = PolicyTrainOptions(**values, policy_args=dict(args.policy_arg), image_transforms_config=config)
    if config is not None:
        try:
            policy_augment(options)  # a transform with no counterpart here fails now, not once the run is set up
        except ValueError as e:
            raise ValueError(f"--image-transforms-config {path}: {e}") from e
    return options


def with_cameras(metadata: Any, cameras: Sequence[str] | None) -> Any:
    """``metadata`` (LeRobot's) without the cameras ``--cameras`` leaves out, so the policy LeRobot builds from it
    reads the cameras the batches hold (``gr00t_v20_h264`` declares a camera with no files). A key it lacks is left
    to lerobot-dali's open of the dataset, whose error lists the dataset's cameras (before the policy is built: LeRobot
    refused one left with no camera in a traceback)."""
    if cameras is not None:
        features = metadata.info["features"]
        for key in [k for k in metadata.camera_keys if k not in cameras]:
            del features[key]
    return metadata


def dataset_metadata(dataset: str, revision: str | None = None) -> Any:
    """LeRobot's view of the dataset's metadata: a local folder by path, a Hub repo id (``user/name``) from the Hub.

    LeRobot reads no URL, and took a mistyped folder for a repo id (a traceback of the Hub client's); both raise
    :class:`~lerobot_dali.errors.DatasetNotFoundError` here, one line under :func:`main`."""
    path = Path(dataset)
    if path.is_dir():
        from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

        return LeRobotDatasetMetadata(f"local/{path.resolve().name}", root=path)
    if "://" in dataset:
        raise DatasetNotFoundError(
            f"dataset {dataset!r}: lerobot_policy.py builds the policy from LeRobot's reading of the metadata, which "
            "takes a local folder or a Hub repo id ('user/name'), not a URL: pass the repo id, or a local copy"
        )
    if not is_repo_id(dataset):
        raise dataset_not_found(dataset)
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    return LeRobotDatasetMetadata(dataset, revision=revision)


#: Config fields that say where the policy runs or is published, not what it is: a resume may change them.
_NOT_THE_POLICY = ("device", "push_to_hub", "repo_id", "private", "tags", "license")


def config_signature(config: Any) -> dict[str, Any]:
    """The resolved policy config as a checkpoint records it (a field given explicitly at its default is the same
    config), without :data:`_NOT_THE_POLICY`, so a run may resume on other hardware."""
    from dataclasses import asdict

    resolved = {k: v for k, v in asdict(config).items() if k not in _NOT_THE_POLICY}
    return json.loads(json.dumps(resolved, sort_keys=True, default=str))


def policy_augment(options: PolicyTrainOptions) -> AugmentConfig | None:
    """The augmentation of LeRobot's image transforms the options ask for (``AugmentConfig.from_lerobot``), or
    None where none applies. LeRobot's own defaults (``ImageTransformsConfig``) need ``lerobot`` importable."""
    from lerobot_dali.augment_config import AugmentConfig

    given = options.image_transforms_config
    config: object
    if given is not None:
        config = {**given, "enable": True} if options.image_transforms else given
    elif options.image_transforms:
        config = lerobot_image_transforms_config()(enable=True)
    else:
        return None
    augment = AugmentConfig.from_lerobot(config)
    return None if augment == AugmentConfig() else augment


def lerobot_image_transforms_config() -> type:
    """LeRobot's ``ImageTransformsConfig``, from where the installed LeRobot keeps it: ``lerobot.transforms`` in
    0.6, ``lerobot.datasets.transforms`` in 0.3 and 0.4 (``--image-transforms`` failed with LeRobot 0.6 on the old
    path)."""
    try:
        from lerobot.transforms import ImageTransformsConfig
    except ModuleNotFoundError as e:
        if e.name not in ("lerobot.transforms", "lerobot"):
            raise
        from lerobot.datasets.transforms import ImageTransformsConfig
    return ImageTransformsConfig


def build_policy(options: PolicyTrainOptions, metadata: Any, device: str) -> tuple[Any, Any, Any]:
    """``(policy, preprocessor, delta_timestamps)`` as LeRobot's own training script builds them."""
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors

    config = make_policy_config(options.policy, device=device, **options.policy_args)
    try:
        policy = make_policy(config, ds_meta=metadata)
    except URLError as e:  # (offline, ACT's default: urllib's 140-line traceback on rank 0, the others killed: -15)
        raise SetupError(download_failed(options.policy, config, e)) from e
    preprocessor, _ = make_pre_post_processors(config, dataset_stats=metadata.stats)
    return policy, preprocessor, resolve_delta_timestamps(config, metadata)


def download_failed(policy: str, config: Any, error: URLError) -> str:
    """What to say where building ``policy`` (its LeRobot ``config``) failed to download what it starts from: ACT's
    and Diffusion Policy's pretrained backbone weights by default, which torchvision fetches into torch's hub cache."""
    weights = getattr(config, "pretrained_backbone_weights", None)
    if not weights:
        return f"{policy} policy: LeRobot's build of it failed to download a file ({error.reason})"
    return (
        f"{policy} policy: LeRobot builds it on pretrained backbone weights (pretrained_backbone_weights={weights}), "
        f"which torchvision failed to download ({error.reason}): run it once where the network is reached (torch's "
        "hub cache keeps them, under $TORCH_HOME), or train the backbone from scratch with --policy-arg "
        "pretrained_backbone_weights=null"
    )


def train(options: PolicyTrainOptions) -> list[float]:
    """Train up to ``options.steps`` steps (counted from the start, resumed ones included); returns the loss of
    every step this call took on this rank.

    As ``pipelines/train.py``'s ``train``: once training has started, a preemption signal stops every rank at one step
    boundary, saves a checkpoint there (with ``checkpoint_dir``; ``output_dir`` is left to the resumed run) and
    raises ``Preempted`` once the run is closed; lerobot-dali's errors while setting up (``SETUP_ERRORS``) raise
    ``SetupError``."""
    from accelerate.utils import DistributedDataParallelKwargs

    # As LeRobot's trainer: the schedule steps once per optimiser step, and DDP tolerates parameters a policy
    # leaves unused in a step (VQ-BeT's, TD-MPC's).
    with setting_up():  # (--device cuda where no GPU is seen: one line)
        accelerator = make_accelerator(
            options.device,
            step_scheduler_with_optimizer=False,
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        )
    if importlib.util.find_spec("lerobot") is None:  # (one line, not a traceback; after --device)
        raise SetupError(
            "LeRobot does not import here: this script trains LeRobot's own policies, so run it from LeRobot's "
            "environment (pip install lerobot: it pins its own torch), or train with pipelines/train.py, which needs "
            "no LeRobot"
        )
    with setting_up():  # (one process where a launcher started several: one line)
        rank, world_size = data_rank(accelerator)
    held = held_for_this_run(
        options.checkpoint_dir, resume=options.resume, rank=rank, world_size=world_size, device=accelerator.device
    )
    with held:
        return _train_as(accelerator, rank, world_size, options)


def _train_as(accelerator: Any, rank: int, world_size: int, options: PolicyTrainOptions) -> list[float]:
    """:func:`train` on ``rank`` of ``world_size``, once its ``--checkpoint-dir`` is this run's alone."""
    import torch
    from accelerate.utils import set_seed

    from lerobot_dali import DALILeRobotIterator
    from lerobot_dali.dataset_reader import open_dataset

    set_seed(options.seed)
    with setting_up():  # (lerobot-dali's errors about the data or a checkpoint: main logs them as one line)
        # (every rank at once, as train.py's: a --cameras key the dataset lacks is train.py's line on each, before
        # LeRobot builds a policy without that camera)
        with camera_flag_refused():
            reader = open_dataset(options.dataset, revision=options.revision, cameras=options.cameras)
        # A Hub dataset's metadata downloads once, then the others read it; a local one's every rank reads at once,
        # as train.py's ranks open theirs: an error in the policy's build (its weights' download) is then each rank's
        # line, where the ranks that had waited were killed by torchrun (-15) as the first one exited.
        with contextlib.nullcontext() if reader.location.is_local else accelerator.main_process_first():
            metadata = with_cameras(dataset_metadata(options.dataset, options.revision), options.cameras)
        policy, preprocessor, delta_timestamps = build_policy(options, metadata, accelerator.device.type)
        augment = policy_augment(options)
        optimizer_config = policy.config.get_optimizer_preset()
        optimizer = optimizer_config.build(policy.get_optim_params())
        schedule = policy.config.get_scheduler_preset()
        scheduler = schedule.build(optimizer, options.steps) if schedule is not None else None
        policy, optimizer, scheduler = accelerator.prepare(policy, optimizer, scheduler)
        iterator = DALILeRobotIterator(  # one per rank, never through accelerator.prepare: it shards by itself
            reader, batch_size=options.batch_size,
            delta_timestamps=delta_timestamps, shuffle=True, seed=options.seed,
            episode_pool_size=options.episode_pool_size, device=iterator_device(accelerator.device),
            decode=DecodePreference.parse(options.decode), share_clips=options.share_clips,
            num_workers=options.num_workers, rank=rank, world_size=world_size,
            timestamp_source=check_choice(TimestampSource, "--timestamp-source", options.timestamp_source),
            tolerance_s=DEFAULT_TOLERANCE_S if options.tolerance_s is None else options.tolerance_s,
            # (as LeRobot's train script samples for the policies that ask: Diffusion Policy's last 7 frames)
            drop_n_last_frames=getattr(accelerator.unwrap_model(policy).config, "drop_n_last_frames", None) or 0,
            augment=augment,
        )  # fmt: skip
        refuse_short_epochs(iterator, options.batch_size)  # (before the pipeline starts, as train.py's)
        # What a resume must keep: the policy's shapes, the windows and the frames' augmentation follow these.
        # (a key per config field, so a mismatch names the field)
        config = config_signature(accelerator.unwrap_model(policy).config)
        data = {"policy": options.policy, **{f"policy.{k}": v for k, v in config.items()}}
        data["delta_timestamps"] = json.loads(json.dumps(delta_timestamps))
        # (the augmentation as mapped: transforms that map alike, a weight-0 one left in, are the same)
        data["augment"] = augment_signature(augment)
        step = 0
        if options.resume and options.checkpoint_dir is not None:
            step = resume_latest(
                accelerator, options.checkpoint_dir, iterator, data, steps=options.steps,
                data_options="--policy, --policy-arg, --image-transforms and --image-transforms-config",
            )  # fmt: skip
    if step < options.steps:  # (else resume_latest said there is nothing to train)
        logger.info(  # (as train.py's first line: 'steps 0..6 of 4 samples' read as 4 samples in all)
            "rank %d/%d: %s policy, steps %d..%d, batch %d, %s, windows %s, augmentation %s",
            rank, world_size, options.policy, step, options.steps, options.batch_size, batches_left(iterator),
            delta_timestamps, augment_signature(augment) or "none",
        )  # fmt: skip
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # on the device until a log line reads one back anyway: no wait for the GPU

    def read_back() -> None:  # (one tensor per step kept on the GPU for a whole run: 100,000 allocations)
        if pending:
            losses.extend(torch.stack(pending).float().cpu().tolist())
            pending.clear()

    def train_step(batch: dict[str, Any]) -> torch.Tensor:
        loss, _ = policy(preprocessor(batch))
        accelerator.backward(loss)
        if optimizer_config.grad_clip_norm:
            accelerator.clip_grad_norm_(policy.parameters(), optimizer_config.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        if hasattr(accelerator.unwrap_model(policy), "update"):  # target networks, EMA (TD-MPC)
            accelerator.unwrap_model(policy).update()
        pending.append(loss.detach())
        return loss

    policy.train()
    step, loop = run_steps(
        accelerator, iterator, epoch_batches(iterator), train_step, step=step, options=options, data=data,
        cameras=metadata.camera_keys, remedy=NOT_FINITE_REMEDY, after_log=read_back,
    )  # fmt: skip
    with loop.finishing(step):
        read_back()
        # (a preempted run's policy is not the trained one: the resumed run saves that)
        if options.output_dir is not None and accelerator.is_main_process and not loop.stopped_by:
            save_policy(options.output_dir, accelerator.unwrap_model(policy), preprocessor)
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return losses


#: What LeRobot's ``save_pretrained`` writes of a policy: an ``--output-dir`` holding them holds one saved before.
SAVED_POLICY_FILES = ("config.json", "model.safetensors")
#: Every name :func:`save_policy` writes (the policy's, then its preprocessor's: ``policy_preprocessor.json`` and a
#: ``policy_preprocessor_step_<i>[_<step>].safetensors`` per step with a state, LeRobot 0.4's names): what a save
#: replaces; anything else in ``--output-dir`` is the user's, which no save deletes.
_SAVED_NAMES = (*SAVED_POLICY_FILES, "policy_preprocessor.json", "policy_preprocessor_step_*.safetensors")


def save_policy(folder: Path, policy: Any, preprocessor: Any) -> None:
    """The trained ``policy`` and its ``preprocessor`` saved (LeRobot's ``save_pretrained`` layout) as ``folder``,
    written beside it and renamed into its place once whole (:func:`~pipelines.checkpoints.staged_folder`): written in
    place, a run killed in the save left a ``config.json`` without its weights (or beside the last run's), which
    LeRobot loads as a policy."""
    with staged_folder(folder) as staging:
        policy.save_pretrained(staging)
        preprocessor.save_pretrained(staging)
        _keep_others(folder, staging)


def _others(folder: Path) -> list[str]:
    """The names in ``folder`` that no save writes (:data:`_SAVED_NAMES`): the user's, sorted."""
    return sorted(p.name for p in folder.iterdir() if not any(fnmatch.fnmatchcase(p.name, n) for n in _SAVED_NAMES))


def _keep_others(folder: Path, staging: Path) -> None:
    """The files in ``folder`` that no save wrote, put in ``staging`` too (hard links: no data copied, where the
    filesystem makes them), so the save that replaces ``folder`` with ``staging`` keeps them: put there while the run
    trained (:func:`check_output_dir` refuses them before), a user's notes were deleted with the last policy."""
    if not folder.is_dir():
        return
    for name in _others(folder):
        source, target = folder / name, staging / name
        if target.exists() or target.is_symlink():  # (a name the save wrote: its own)
            continue
        try:
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
            else:
                _link_or_copy(source, target)
        except FileNotFoundError:  # (removed since listed: nothing to keep; raised, it lost the trained policy)
            continue
        logger.warning("--output-dir %s: kept %s, which is not the policy's, beside the saved policy", folder, name)


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:  # (a filesystem without hard links)
        shutil.copy2(source, target, follow_symlinks=False)


def check_output_dir(folder: Path, kept: Sequence[tuple[str, Path | str | None]] = ()) -> None:
    """``folder`` as ``--output-dir``: one this user can write or make (:func:`refuse_unwritable`) and, where it
    exists, one :func:`save_policy` may replace whole: not a mount point (it cannot be renamed), in a folder this user
    can write (its new copy is written beside it), and empty or holding a policy saved before
    (:data:`SAVED_POLICY_FILES`): other files there would be deleted with it. ``kept``: other flags' local folders
    (``--checkpoint-dir``, ``--dataset``), none of which may be inside it: replaced whole, it deleted them (the run's
    checkpoints under ``--output-dir``, LeRobot's own layout, were gone once the policy was saved). ValueError else,
    before training."""
    refuse_unwritable("--output-dir", folder)
    for flag, path in kept:
        if path is None or (isinstance(path, str) and ("://" in path or not Path(path).exists())):
            continue  # (a dataset named by its Hub id or URL is no folder here: 'user/name' under '.' is not it)
        if is_inside(path, folder):
            raise ValueError(
                f"{flag} {path} is inside --output-dir {folder}, which the trained policy replaces whole, deleting "
                f"it: give --output-dir a folder of its own (beside it: {Path(folder).parent / 'policy'})"
            )
    if not folder.is_dir():
        return
    absolute = Path(os.path.realpath(folder))  # (a link: the folder it leads to is replaced, beside itself)
    if os.path.ismount(absolute) or not os.access(absolute.parent, os.W_OK | os.X_OK):
        why = "is a mount point" if os.path.ismount(absolute) else f"is in {absolute.parent}, which is not writable"
        raise ValueError(
            f"--output-dir {folder} {why}: the policy is written beside it, then renamed into its place; give a "
            f"folder inside it ({folder / 'policy'}) or elsewhere"
        )
    if any(folder.iterdir()) and not all((folder / name).is_file() for name in SAVED_POLICY_FILES):
        raise ValueError(
            f"--output-dir {folder} holds files and no saved policy ({' and '.join(SAVED_POLICY_FILES)}): the "
            "trained policy replaces the folder whole; give a new or empty folder, or one a run saved a policy to"
        )
    others = _others(folder)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(
            f"--output-dir {folder} holds {shown} beside a saved policy: the trained policy replaces the folder whole, "
            "which would delete them; move them out of it, or give another folder"
        )


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        options = parse_args(argv, log=logger)  # (argparse's refusal a logged line: with the rank)
        for flag, folder in (("--checkpoint-dir", options.checkpoint_dir), ("--output-dir", options.output_dir)):
            if folder is not None:
                refuse_inside_datasets(flag, folder, [options.dataset])
        if options.checkpoint_dir is not None:
            check_checkpoint_dir(options.checkpoint_dir, resume=options.resume)
        if options.output_dir is not None:  # (written once trained: a traceback then, the policy lost)
            check_output_dir(
                options.output_dir, [("--checkpoint-dir", options.checkpoint_dir), ("--dataset", options.dataset)]
            )
    except (ValueError, OSError) as e:  # flags, --checkpoint-dir, --output-dir: one line, before training
        logger.error("lerobot_policy.py: %s", e)
        return 2
    except KeyboardInterrupt:  # (one line, as in every phase: it was a traceback)
        return said(logger, "lerobot_policy.py", Interrupted.while_starting())
    return exit_status(lambda: train(options), "lerobot_policy.py", logger, checkpoint_dir=options.checkpoint_dir)
