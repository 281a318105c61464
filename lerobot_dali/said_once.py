"""Lines about one fact said once per job on a host, however many processes meet it.

A fact about the machine or the dataset (a cache folder that takes no writes, an old PyAV, columns info.json does
not declare) is met alike by every rank of a node and by each of their DALI worker processes, which start again
each epoch: a read-only cache folder was warned about 8 times by a run of 2 ranks with 2 workers over 2 epochs,
and would be 64 times an epoch on a node of 8 GPUs with 8 workers each. :func:`warn_once` logs such a warning in
the first process of the job that says it and at DEBUG in the others (``-vv`` still shows each); :func:`say_once`
does so at another level (the INFO lines of the dataset opened, how its cameras decode).

The processes agree through empty files named by the message in a folder of the job's under the temporary directory:
the launcher's, the parent of every rank of one launch on the node, which ends with it (torchrun's or accelerate's
agent, told by ``$TORCHELASTIC_RUN_ID``; by the parent's name, Slurm's step manager under ``srun``, Open MPI's or
hydra's daemon under ``mpirun`` (a persistent DVM's, serving launch after launch, keeps one per launch, by its PMIx
namespace); DeepSpeed's launcher), also where each rank runs under a wrapper of its own that the launcher started
(``srun bash -c 'python train.py'``, ``srun ./run.sh``, ``mpirun sh -c ...``, ``timeout``, ``uv run``, ``apptainer
exec``: a shell given a command or a script, a few deep); or else the training process's (an interactive shell, or a
batch script, which Slurm's batch step runs, lives on to start the next run). It is named by its host, PID and start
time (a reused PID never inherits it), and passed on to the worker processes it starts (:func:`shared_with_children`)
through ``$LEROBOT_DALI_SAID_DIR``. The training process removes its own at exit; a launcher's, or one left by a killed
process, is removed by the next job on the host. Runs one after another in one launch share its launcher, and so its
folder (``srun bash -c 'python prepare.py; python train.py'``: train.py says at DEBUG what prepare.py said): nothing in
/proc tells them from the ranks of one run cheaply (numbering the runs under each rank's wrapper would, but a rank
whose shell runs one more, rank 0 alone preparing, would then share with no other rank). Where no folder can be made
(no /proc, no usable temporary directory), each process says each line once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import fork_locks
from .new_folder import host_name

__all__ = ["SAID_ENV", "say_once", "shared_with_children", "warn_once"]

#: The folder of the job's said lines, set for the processes that this one starts.
SAID_ENV = "LEROBOT_DALI_SAID_DIR"
_PREFIX = "lerobot-dali-said-"
#: The parents of the ranks of one launch on a host, each ending with it: Slurm's step manager (one per job step
#: and node: ``srun``'s tasks, or the batch script alone), Open MPI's daemon on each node (4: orted; 5: prted) and
#: mpirun on its own (4: mpirun or its other names; 5: prterun), MPICH's and Intel MPI's hydra proxy on each node.
#: (A persistent DVM's, ``prte`` and its prted, serve job after job: each launch's PMIx namespace tells them apart.)
_LAUNCHERS = frozenset(
    {"slurmstepd", "orted", "prted", "mpirun", "mpiexec", "orterun", "prterun", "prte", "hydra_pmi_proxy"}
)
#: DeepSpeed's runner starts ``python -u -m deepspeed.launcher.launch`` on each node, which starts its ranks.
_DEEPSPEED_LAUNCH = b"deepspeed.launcher.launch"
#: Programs a launcher may start each rank under, which live as long as it (by ``comm``, or the name of ``exe``: a
#: script run by its ``#!`` line is named after the script): shells given a command or a script, and ``timeout``,
#: ``time`` and ``uv`` (``uv run``, ``uvx``), which wait for the command they run (``env``, ``nice`` or ``numactl``
#: exec it: its parent is the launcher).
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh"})
_WRAPPERS = _SHELLS | {"timeout", "time", "uv"}
#: The titles (``argv[0]``) of Apptainer's and Singularity's starter where it runs one command and ends with it
#: (``apptainer exec``, ``singularity run``); an instance's (``Apptainer instance: ...``) lives on.
_CONTAINER_PARENTS = ("Apptainer runtime parent", "Singularity runtime parent")
#: Wrappers between a rank and its launcher, at most (``srun ./run.sh`` whose last line is ``timeout 4h python ...``).
_WRAPPER_DEPTH = 3
#: The title Slurm's step manager gives itself for a step of tasks (``srun``'s: ``slurmstepd: [7.0]``); the batch
#: step's (``[7.batch]``) runs the batch script, the interactive step's (``salloc``) a shell, each run after run.
_TASK_STEP = re.compile(rb"slurmstepd: \[[\d+]+\.[\d+]+\]")  # (a heterogeneous job's parts: 7+1)

_lock = fork_locks.lock()
_said: set[str] = set()  # this process's, whatever the folder
_sharing = 0  # threads within shared_with_children


def say_once(logger: logging.Logger, level: int, message: str, *args: Any, key: str | None = None) -> None:
    """``logger.log(level, message, *args)`` in the first process of the job to say it; DEBUG in the others.

    ``key``: what makes two lines the same, where not their text: a fact each worker measures its own numbers
    for (a cache's shortfall, by the episodes it drew) is said once with the first one's. A process whose logger
    passes no record at ``level`` says nothing, and leaves the line to the others."""
    if not logger.isEnabledFor(level):
        return
    text = message % args if args else message
    logger.log(level if _first(text if key is None else f"key:{key}") else logging.DEBUG, message, *args)


def warn_once(logger: logging.Logger, message: str, *args: Any, key: str | None = None) -> None:
    """:func:`say_once` at WARNING."""
    say_once(logger, logging.WARNING, message, *args, key=key)


@contextmanager
def shared_with_children() -> Iterator[None]:
    """Within, the processes this one starts (its workers) share its folder: they say nothing it said. (Threads
    may be within at once: a mixture builds its datasets' pipelines in threads.)"""
    global _sharing
    with _lock:
        inherited = not _sharing and bool(os.environ.get(SAID_ENV))  # (this process's starter's: kept for them)
        folder = None if inherited else _folder()
        if folder is not None:
            _sharing += 1
            os.environ[SAID_ENV] = str(folder)
    try:
        yield
    finally:
        if folder is not None:
            with _lock:
                _sharing -= 1
                if not _sharing:
                    os.environ.pop(SAID_ENV, None)


def _first(text: str) -> bool:
    name = hashlib.sha256(text.encode()).hexdigest()[:32]
    with _lock:
        if name in _said:
            return False
        _said.add(name)
    folder = _folder()
    if folder is None:
        return True
    try:
        os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:  # (the folder removed or full: say it, as every process did)
        return True
    return True


def _folder() -> Path | None:
    inherited = os.environ.get(SAID_ENV)
    if inherited:
        return Path(inherited)
    return _made_folder()


@functools.cache
def _made_folder() -> Path | None:
    """The job's folder, made once per process (None where it cannot be)."""
    owner = _launcher() or os.getpid()
    started = _start_time(owner)
    if started is None:  # (no /proc: each process says each line once)
        return None
    try:
        root = Path(tempfile.gettempdir())  # (raises where no candidate takes a file: a log line never does)
        folder = root / f"{_PREFIX}{host_name()}-{owner}-{started}"
        launch = os.environ.get("PMIX_NAMESPACE") if owner != os.getpid() else None  # (a DVM's daemons serve many)
        if launch:
            folder = folder.with_name(f"{folder.name}-{hashlib.sha256(launch.encode()).hexdigest()[:16]}")
        _remove_dead(root)
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    if owner == os.getpid():  # (a launcher's stays for its other ranks: the next job removes it)
        atexit.register(_remove_own, folder, owner)
    return folder


def _remove_own(folder: Path, owner: int) -> None:
    """Remove ``folder`` at the exit of ``owner``, not of a child it forked (``os.fork``), which runs its exit
    handlers too: the folder is still its parent's."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _launcher() -> int | None:
    """The PID of the process that starts the ranks of this one's launch on this host and ends with it: its parent,
    or the launcher that started the wrappers (:data:`_WRAPPERS`, at most :data:`_WRAPPER_DEPTH`) it runs under. None
    where there is none: a shell that started this run (interactive, or a batch script) lives on to start the next."""
    pid, wrapped = os.getppid(), False
    for _ in range(_WRAPPER_DEPTH + 1):
        if "TORCHELASTIC_RUN_ID" in os.environ:  # (the agent's ranks: the first process above their wrappers)
            if not _is_wrapper(pid):
                return pid
        elif _is_launcher(pid, wrapped=wrapped):
            return pid
        elif not _is_wrapper(pid):
            return None
        parent = _parent_of(pid)
        if parent is None:
            return None
        pid, wrapped = parent, True
    return None


def _is_launcher(pid: int, *, wrapped: bool) -> bool:
    """Whether process ``pid`` starts the ranks of one launch on this host and ends with it, by its name (/proc's
    ``comm``) or, for DeepSpeed's (a Python process), its command line. The parent of a wrapper (``wrapped``): a
    Slurm step manager only of a step of tasks (an ``srun``'s), not the batch step's, whose script lives on."""
    process = Path(f"/proc/{pid}")
    try:
        name = (process / "comm").read_text().rstrip("\n")
        if name in _LAUNCHERS:
            return not (wrapped and name == "slurmstepd") or bool(_TASK_STEP.match((process / "cmdline").read_bytes()))
        return _DEEPSPEED_LAUNCH in (process / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _is_wrapper(pid: int) -> bool:
    """Whether process ``pid`` runs one command and ends with it (:data:`_WRAPPERS`, :data:`_CONTAINER_PARENTS`): a
    shell only where given a command (``-c``) or a script, and not interactive (``-i``; none given: it reads its
    commands from the terminal)."""
    process = Path(f"/proc/{pid}")
    try:
        names = {(process / "comm").read_text().rstrip("\n")}
        argv = (process / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return False
    if argv[:1] and argv[0].startswith(_CONTAINER_PARENTS):
        return True
    with contextlib.suppress(OSError):  # (another user's is not readable: its comm decides)
        names.add(Path(os.readlink(process / "exe")).name)
    if not names & _WRAPPERS:
        return False
    return not names & _SHELLS or _runs_a_command(argv[1:])


def _runs_a_command(arguments: list[str]) -> bool:
    """Whether a shell's ``arguments`` give it a command (``-c``) or a script to run, not interactive (``-i``)."""
    command = False
    takes_value = False
    for argument in arguments:
        if takes_value:  # (the name of ``-o`` / ``+O``'s option)
            takes_value = False
        elif argument in ("-", "--"):  # (the end of the options)
            continue
        elif argument.startswith("--"):  # (bash's long options: --login, --norc, --rcfile FILE)
            takes_value = argument in ("--rcfile", "--init-file")
        elif argument[:1] in ("-", "+") and len(argument) > 1:
            if "i" in argument[1:]:
                return False
            command = command or "c" in argument[1:]
            takes_value = argument[-1] in "oO"
        else:  # (the command string after -c, or the script)
            return True
    return command


def _parent_of(pid: int) -> int | None:
    """The PID of process ``pid``'s parent (from /proc), None where it does not run or is unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # (field 4; the name before it may hold spaces)


def _remove_dead(root: Path) -> None:
    """Remove this host's folders whose process no longer runs (or whose PID another process has now)."""
    prefix = f"{_PREFIX}{host_name()}-"
    for left in root.glob(f"{prefix}*"):
        match = re.fullmatch(r"(\d+)-(\d+)(?:-[0-9a-f]+)?", left.name[len(prefix) :])
        if match is not None and _start_time(int(match.group(1))) != match.group(2):
            shutil.rmtree(left, ignore_errors=True)


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), None where it does not run or is unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # (field 22; the name before it may hold spaces)
