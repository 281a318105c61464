"""Checkpoints of the training scripts (``pipelines/train.py``, ``pipelines/lerobot_policy.py``): saved whole or not
at all, found again and restored at the exact next sample of every rank, on as many ranks as saved them or others.

``CKPT/step_{n:08d}/state`` is ``accelerator.save_state`` (model, optimiser, RNG states) and
``CKPT/step_{n:08d}/stream_rank{r}.json`` is rank ``r``'s iterator position, written under a staging name and renamed
once complete; ``CKPT/latest`` names the newest complete checkpoint and is written last, once every rank has saved.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lerobot_dali.cache_dirs import write_whole
from lerobot_dali.errors import ResumeStateError
from lerobot_dali.new_folder import refuse_unwritable
from lerobot_dali.stream_state import merge_rank_states
from lerobot_dali.value_checks import is_int
from pipelines.checkpoint_lock import named_holder, one_run_at_a_time
from pipelines.run_errors import RunRefused

if TYPE_CHECKING:
    from lerobot_dali.augment_config import AugmentConfig

__all__ = [
    "DATA_OPTIONS",
    "CheckpointNotWritten",
    "augment_signature",
    "check_checkpoint_dir",
    "held_for_this_run",
    "latest_checkpoint",
    "latest_saved_step",
    "prune_checkpoints",
    "restore_checkpoint",
    "resume_latest",
    "save_checkpoint",
    "staged_folder",
]

#: (The training run's lines, under the name they had in ``train.py``: what a log filter selects them by.)
logger = logging.getLogger("pipelines.train")


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


def augment_signature(augment: AugmentConfig | None) -> dict[str, Any] | None:
    """The augmentation as a checkpoint records it (``train.py``'s and ``lerobot_policy.py``'s): as mapped, so that
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
    keep: int = 0,
) -> Path:
    """Model, optimiser and RNG via accelerate; this rank's stream position (``stream``, where a batch was taken
    since the step: else ``iterator.state_dict()``) and ``data`` (:func:`~pipelines.train.data_signature`); then
    ``latest`` once all have saved.

    The ranks write ``.step_{n:08d}.partial``, which becomes ``step_{n:08d}`` once every file is on disk: a step
    saved before (by a run stopped before ``latest`` named it, maybe on more ranks) is replaced whole, never
    written over in place, where its other ranks' files (``random_states_{r}.pkl``, ``stream_rank{r}.json``)
    would stay beside the new ones and be loaded by a later resume on that many ranks. ``keep`` > 0: the older
    checkpoints but the ``keep`` newest (this one included) are removed once ``latest`` names it
    (:func:`prune_checkpoints`)."""
    directory = root / f"step_{step:08d}"
    staging = _staging(directory)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
    accelerator.wait_for_everyone()
    position = iterator.state_dict() if stream is None else dict(stream)
    saved = {"step": step, "rank": iterator.rank, "world_size": iterator.world_size, "stream": position}
    if data is not None:
        saved["data"] = dict(data)
    unwritten: CheckpointNotWritten | None = None
    try:
        with _said_where_out_of_space(root, step, staging):
            with _accelerate_quiet():
                accelerator.save_state(str(staging / "state"))
            write_whole(staging / f"stream_rank{iterator.rank}.json", json.dumps(saved).encode())
    except CheckpointNotWritten as e:
        unwritten = e
    if _any_rank(accelerator, unwritten is not None):  # (every rank says it: one alone left the others in a barrier,
        raise unwritten or _not_written(root, step, "another rank found no space to write its files")  # a traceback)
    accelerator.wait_for_everyone()
    _sync_tree(staging)  # every rank's files complete: latest must never name one a crash left empty
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _replace_folder(staging, directory)
        with _said_where_out_of_space(root, step, staging):
            write_whole(root / "latest", directory.name.encode())
        _fsync(root)  # the rename of latest itself
        logger.info("saved checkpoint %s", directory)
        removed = prune_checkpoints(root, step, keep)
        if removed:
            logger.info("removed checkpoint(s) %s (--keep-checkpoints %d)", ", ".join(p.name for p in removed), keep)
    accelerator.wait_for_everyone()
    return directory


class CheckpointNotWritten(RunRefused):
    """A checkpoint's save failed for want of space on its filesystem (full, or over quota); the message says what is
    free and which checkpoint a resume continues from."""


#: Below this many bytes free, a failed write is taken for a full filesystem: torch says it as ``unexpected pos``
#: with no errno (its stream's error), where the filesystem has nothing left.
_FULL_BELOW = 2**20
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_SAID = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")


@contextlib.contextmanager
def _said_where_out_of_space(root: Path, step: int, staging: Path) -> Iterator[None]:
    """Around the writes of step ``step``'s checkpoint: an error that a full filesystem made (an errno of
    :data:`_NO_SPACE`, its words in a library's message, or almost nothing free after it) becomes
    :class:`CheckpointNotWritten`, one line that names the space and the checkpoint to resume from, where it was
    torch's ``RuntimeError: ... unexpected pos 704 vs 598`` traceback; what was written of the save is removed, to free
    its space. Other errors pass unchanged."""
    try:
        yield
    except Exception as e:
        free = _free_bytes(root)
        if not (_says_no_space(e) or (free is not None and free < _FULL_BELOW)):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        first = (str(e).strip() or type(e).__name__).splitlines()[0]
        raise _not_written(root, step, f"{type(e).__name__}: {first}") from e


def _not_written(root: Path, step: int, cause: str) -> CheckpointNotWritten:
    """The refusal of step ``step``'s checkpoint into ``root`` for want of space (``cause``: the write's error), with
    the space free once what it wrote is removed and the step a resume continues from."""
    free = _free_bytes(root)
    latest = latest_saved_step(root)
    resumes = f"step {latest}" if latest is not None else "step 0 (no checkpoint there is complete)"
    room = f"{free / 2**20:.1f} MiB free" if free is not None else "its free space unknown"
    return CheckpointNotWritten(
        f"the checkpoint of step {step} could not be written into {root} ({cause}): its filesystem has {room}. Free "
        f"space there (--keep-checkpoints K keeps only the K newest checkpoints) and run the same command with "
        f"--resume: it continues from {resumes}"
    )


def _any_rank(accelerator: Any, true: bool) -> bool:
    """Whether ``true`` on any rank (a collective where there are several)."""
    if getattr(accelerator, "num_processes", 1) == 1:
        return true
    flag = torch.tensor([float(true)], device=accelerator.device)
    return float(accelerator.reduce(flag, reduction="sum").item()) > 0


def _says_no_space(error: BaseException) -> bool:
    """Whether ``error`` or an error it was raised from says the filesystem is full or over quota."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return any(
        (isinstance(seen, OSError) and seen.errno in _NO_SPACE) or any(words in str(seen) for words in _NO_SPACE_SAID)
        for seen in chain
    )


def _free_bytes(folder: Path) -> int | None:
    """The bytes this user may still write on ``folder``'s filesystem; None where it cannot be asked."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def prune_checkpoints(root: Path, step: int, keep: int) -> list[Path]:
    """Remove ``root``'s checkpoints of steps up to ``step`` (``latest``'s) but the ``keep`` newest, ``step``'s
    included; returns those removed (none where ``keep`` is 0). Those of later steps (saved by a run stopped before
    ``latest`` named them) are left: this run replaces each as it saves its step. Each goes out of its name before it
    is deleted, so a crash mid-delete leaves no half a checkpoint under a checkpoint's name (the next prune removes
    what it left)."""
    if keep <= 0:
        return []
    steps = sorted(int(found.group(1)) for entry in root.iterdir() if (found := _STEP_NAME.fullmatch(entry.name)))
    removed = [root / f"step_{n:08d}" for n in [n for n in steps if n <= step][:-keep]]
    for folder in removed:
        folder.rename(_pruned(folder))
    for left in root.glob(_pruned(root / "step_*").name):  # (this prune's, and any a crash left)
        shutil.rmtree(left, ignore_errors=True)
    return removed


#: The name of a checkpoint's folder in ``--checkpoint-dir``.
_STEP_NAME = re.compile(r"step_(\d{8})")


def _pruned(directory: Path) -> Path:
    """Where :func:`prune_checkpoints` moves ``directory`` to delete it."""
    return directory.with_name(f".{directory.name}.pruned")


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


def check_checkpoint_dir(root: Path, *, resume: bool, locked: bool = False) -> None:
    """``root`` as ``--checkpoint-dir``: a folder this process can write or make (else a save would fail only after
    ``--save-every`` steps of training; made as the run starts, by :func:`~pipelines.checkpoint_lock.one_run_at_a_time`,
    and removed where it ends with nothing saved), and,
    without ``--resume``, holding no checkpoint: a run from step 0 would replace that run's ``latest`` at its first
    save and its checkpoints step by step (a relaunch that forgot ``--resume`` loses the progress); with ``--resume``,
    a ``latest`` that names no checkpoint (:func:`latest_checkpoint`). A refusal names the run a lock file there names
    (one still going, or killed), except where ``locked``: the run checking holds the lock (checked again once it
    does)."""
    refuse_unwritable("--checkpoint-dir", root)
    marker = root / "latest"
    if resume:
        latest_checkpoint(root)  # (one it cannot resume from: refused before any dataset opens)
    elif _stands(marker):
        name = marker.read_text(errors="replace").strip() if marker.is_file() else "its 'latest' not a file"
        holder = None if locked else named_holder(root)  # (locked: the lock file is this run's)
        going = (
            f", of a run that may still be going ({holder or 'unnamed'}): once it has ended, "
            if holder is not None
            else ": "
        )
        raise FileExistsError(
            f"--checkpoint-dir {root} holds a checkpoint ({name}){going}pass --resume to continue that run, or give "
            "a new --checkpoint-dir (a run from step 0 would replace its checkpoints)"
        )


def held_for_this_run(
    root: Path | None, *, resume: bool, rank: int, world_size: int, device: Any
) -> contextlib.AbstractContextManager[None]:
    """``root`` (``--checkpoint-dir``) locked for this run (:func:`~pipelines.checkpoint_lock.one_run_at_a_time`) and
    checked again once locked (:func:`check_checkpoint_dir`): a run may have saved there since ``main`` checked it.
    ``root`` None: nothing held."""
    again = None if root is None else partial(check_checkpoint_dir, root, resume=resume, locked=True)
    return one_run_at_a_time(root, rank=rank, world_size=world_size, device=device, still_usable=again)


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


#: The loggers of accelerate's ``save_state`` and ``load_state``, whose INFO lines :func:`_accelerate_quiet` holds back.
_ACCELERATE_LOGGERS = ("accelerate.accelerator", "accelerate.checkpointing")


@contextlib.contextmanager
def _accelerate_quiet() -> Iterator[None]:
    """Within, accelerate's checkpoint loggers at WARNING: its ``save_state`` logged four INFO lines a save, naming the
    staging folder (``.step_N.partial``, gone once renamed) before ``saved checkpoint`` named the real one, and its
    ``load_state`` seven ("All scheduler states loaded successfully", "Loading in 0 custom states": this script has
    neither), on each plain run. What they could tell (a rank's random states missing) :func:`_check_random_states`
    says itself, as a warning; accelerate's warnings and errors still show."""
    loggers = [logging.getLogger(name) for name in _ACCELERATE_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        if log.getEffectiveLevel() < logging.WARNING:
            log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


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
    with _accelerate_quiet():
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


#: The most values of a list said whole: a longer one is its first three, "..." and its last, with its length.
SAID_VALUES = 6


def said_apart(saved: Any, now: Any) -> tuple[str, str]:
    """``saved`` and ``now``, a checkpoint's record of a setting and this run's, as a refusal says them: of two
    dicts only the entries that differ, floats to 6 digits and long lists cut (:data:`SAID_VALUES`). The values were
    said whole, every window in full at 17 digits: ``--chunk 5`` on a checkpoint of 10 was 300 characters of
    ``0.03333333333333333, 0.06666666666666667, ...``, ``--chunk 20`` on ACT's 30 steps 800, and the windows both
    share were said too. Said whole where the short forms read alike (a difference past 6 digits)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        keys = [k for k in dict.fromkeys([*saved, *now]) if k not in saved or k not in now or saved[k] != now[k]]
        apart = _said({k: saved[k] for k in keys if k in saved}), _said({k: now[k] for k in keys if k in now})
    else:
        apart = _said(saved), _said(now)
    return apart if apart[0] != apart[1] else (repr(saved), repr(now))


def _said(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_said(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        if len(value) <= SAID_VALUES:
            return "[" + ", ".join(_said(v) for v in value) + "]"
        return "[" + ", ".join([*map(_said, value[:3]), "...", _said(value[-1])]) + f"] ({len(value)} values)"
    return repr(value)


def restore_checkpoint(
    accelerator: Any,
    directory: Path,
    iterator: Any,
    data: Mapping[str, Any] | None = None,
    *,
    data_options: str = DATA_OPTIONS,
) -> int:
    """This rank's stream position, then model/optimiser/RNG; returns the step the checkpoint was taken at.

    The data side goes first: a checkpoint of other episodes or (``data``, :func:`~pipelines.train.data_signature`)
    other windows, image size, cameras or augmentation fails naming that (and ``data_options``, the flags that set
    them), before the model's shapes fail to load.
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
                + "; ".join(f"{k}: saved {{}}, now {{}}".format(*said_apart(recorded[k], data[k])) for k in differ)
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
