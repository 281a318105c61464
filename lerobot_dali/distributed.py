"""Which rank am I? Resolved without communication, in the order that is right under every launcher.

``torch.distributed`` is asked first because it is the truth once a process group exists: under
``torchrun`` on CPU, accelerate's ``PartialState`` can report rank 0 of 1 while the gloo group has two
ranks, and trusting it would make every rank read the same data. Then the launcher's environment
(``RANK``/``WORLD_SIZE``/``LOCAL_RANK``), then accelerate, then a single process, unless another launcher's variables
say this process is one of several (``srun``'s, ``mpirun``'s, ``RANK`` without ``WORLD_SIZE``): then
:class:`~lerobot_dali.errors.ShardingError` (:func:`refuse_unresolved_launch`), as each would read everything.

Accelerate is asked only where the trainer uses it: it imported accelerate, or ``accelerate launch`` started it
(its settings come as ``ACCELERATE_*`` variables). Elsewhere ``PartialState`` has nothing to tell: importing and
creating it took 0.14-0.26 s of CPU per process on top of torch's (its imports reach boto3 where installed), and
creating it can start a process group or a TPU's runtime that the trainer never asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import CudaUnavailableError, ShardingError
from .said_once import _SHELLS, _is_launcher, _is_wrapper, _start_time, warn_once
from .value_checks import check_int

logger = logging.getLogger(__name__)

__all__ = [
    "RankInfo",
    "cpus_per_local_rank",
    "draws_progress",
    "launch_key",
    "local_cuda_device",
    "local_world_size",
    "rank_cuda_device",
    "refuse_unresolved_launch",
    "resolve_rank",
    "usable_cpus",
]


#: Where :func:`resolve_rank` found the rank (:attr:`RankInfo.source`), as a log line says it.
_SOURCE_SAID = {
    "arguments": "rank and world_size passed to the iterator",
    "torch.distributed": "from torch.distributed's process group",
    "environment": "from the launcher's RANK and WORLD_SIZE variables",
    "accelerate": "from accelerate",
    "single process": "one process: no launcher set RANK and WORLD_SIZE",
}


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    #: Where the rank came from: ``arguments``, ``torch.distributed``, ``environment``, ``accelerate`` or
    #: ``single process``.
    source: str

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ShardingError(
                f"rank must be in [0, world_size); got rank={self.rank}, world_size={self.world_size} "
                f"({self.source_said})"
            )

    @property
    def source_said(self) -> str:
        """:attr:`source` in words a log reader follows (``from the launcher's RANK and WORLD_SIZE variables``)."""
        return _SOURCE_SAID.get(self.source, self.source)


def _env_count(name: str, *, minimum: int) -> int:
    """The launcher's variable ``name`` as an int: ShardingError naming it where it is not digits alone or is below
    ``minimum`` (``RANK=abc``, ``RANK=1.0`` or ``RANK=" 1"`` failed in a bare ``int()`` ValueError)."""
    value = os.environ[name]
    if not (value.isascii() and value.isdigit()) or int(value) < minimum:
        raise ShardingError(
            f"{name}={value!r} is not a valid {name}: launchers set it to a whole number >= {minimum} in digits alone "
            f"(e.g. {name}={minimum}); fix or unset it"
        )
    return int(value)


def _env_rank(rank_name: str, count_name: str) -> int:
    """The launcher's ``rank_name`` (:func:`_env_count`), checked below its ``count_name`` where that is set too:
    ShardingError naming both where it is not (``RANK=5 WORLD_SIZE=2``, values of another launch or set by hand, failed
    in RankInfo's bare ValueError or, for ``LOCAL_RANK``, passed unsaid)."""
    rank = _env_count(rank_name, minimum=0)
    if count_name in os.environ and rank >= (count := _env_count(count_name, minimum=1)):
        raise ShardingError(
            f"{rank_name}={os.environ[rank_name]!r} with {count_name}={os.environ[count_name]!r}: a launcher numbers "
            f"the processes it starts 0 to {count_name}-1, so {rank_name} must be below {count_name} ({count}); "
            "fix or unset both (left over from another launch, or set by hand?)"
        )
    return rank


def _launcher_local_rank() -> int:
    """This process's rank on its node, as torchrun, accelerate and deepspeed launchers set it (0 without one)."""
    return _env_rank("LOCAL_RANK", "LOCAL_WORLD_SIZE") if "LOCAL_RANK" in os.environ else 0


def draws_progress() -> bool:
    """Whether this process draws progress bars (its launcher's ``LOCAL_RANK`` is 0): one per node, not one per
    rank over each other on one terminal. For code that runs before the ranks are resolved."""
    return _launcher_local_rank() == 0


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> RankInfo:
    """Explicit arguments win; otherwise torch.distributed, then the environment, then accelerate (where the trainer
    uses it), then (0, 1); ShardingError where a launcher started several processes but none of those says this one's
    rank (:func:`refuse_unresolved_launch`)."""
    local_rank = _launcher_local_rank()
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("pass both rank and world_size, or neither (to detect them)")
        # (checked here: a string, e.g. os.environ["RANK"], failed comparing with 0 in a bare TypeError)
        rank, world_size = check_int("rank", rank, minimum=0), check_int("world_size", world_size, minimum=1)
        return RankInfo(rank, world_size, local_rank, "arguments")
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank, "torch.distributed")
    except ImportError:
        pass
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world_size = _env_rank("RANK", "WORLD_SIZE"), _env_count("WORLD_SIZE", minimum=1)
        return RankInfo(rank, world_size, local_rank, "environment")
    if not _trainer_uses_accelerate():
        return _one_of_several(RankInfo(0, 1, 0, "single process"))
    try:
        from accelerate import PartialState

        state = PartialState()
        return _one_of_several(
            RankInfo(state.process_index, state.num_processes, state.local_process_index, "accelerate")
        )
    except ImportError:
        pass
    return _one_of_several(RankInfo(0, 1, 0, "single process"))


def _one_of_several(found: RankInfo) -> RankInfo:
    """``found``, unless it is one process where a launcher started several (:func:`refuse_unresolved_launch`). (A
    process group of one is not refused: made on purpose, the launcher's variables may be another process's.)"""
    if found.world_size == 1:
        refuse_unresolved_launch("to read everything in every process, pass rank=0 and world_size=1")
    return found


#: The variables in which launchers tell each process they start its rank and how many they started (torchrun's
#: ``RANK``/``WORLD_SIZE`` also where one of the two is missing; Slurm's ``srun`` step; Open MPI's, PMI's (MPICH, Intel
#: MPI, ``srun --mpi=pmi2``) and MVAPICH's ``mpirun``), which :func:`resolve_rank` reads no rank from.
_LAUNCHED = (
    ("RANK", "WORLD_SIZE"),
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
)

#: Torchrun's variables, which :func:`resolve_rank` reads, and the least each may be.
_TORCHRUN_MINIMUMS = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}


def refuse_unresolved_launch(instead: str) -> None:
    """:class:`~lerobot_dali.errors.ShardingError` where a launcher's variables (:data:`_LAUNCHED`) say this process is
    one of several (a rank above 0, a count above 1) but one process was found (no process group of several, no
    ``RANK`` and ``WORLD_SIZE`` together): every process read the whole dataset as rank 0 of 1, each the same batches,
    unsaid (``srun -n 2 python train.py``, ``mpirun -np 2``, ``RANK`` without ``WORLD_SIZE``). Slurm's batch step
    (``sbatch --ntasks=8``, then ``python train.py`` in its script: one process) sets no ``SLURM_STEP_NUM_TASKS``
    and its ``SLURM_PROCID`` is 0. ``RANK=0`` and ``WORLD_SIZE=1`` together say this process is one of one, as the
    message offers (each of ``srun -n 8``'s runs of a sweep): not refused, as :func:`resolve_rank` reads them.
    Slurm's variables under ``srun --pty`` (``SLURM_PTY_PORT`` set: ``srun -n 8 --pty bash``, then ``python train.py``
    typed in its shell) are the interactive shell's step, whose other tasks' shells exit at once: not this process's
    (task 0's: a step started from that shell, ``srun -n 2 python train.py``, inherits ``SLURM_PTY_PORT``, and its
    other tasks are refused).
    Torchrun's variables present are read as :func:`resolve_rank` reads them (:func:`_env_count`): one of them alone
    that is no whole number (``RANK=" 1"``, ``WORLD_SIZE="2\\r"`` from a CRLF env file, ``WORLD_SIZE=""``) was no rank
    above 0 nor count above 1 here, and the process read everything as one, unsaid.
    ``instead``: the message's last words, how to read everything in each process."""
    for name, minimum in _TORCHRUN_MINIMUMS.items():
        if name in os.environ:
            _env_count(name, minimum=minimum)
    if os.environ.get("RANK") == "0" and os.environ.get("WORLD_SIZE") == "1":
        return
    for rank_name, count_name in _LAUNCHED:
        if rank_name == "SLURM_PROCID" and "SLURM_PTY_PORT" in os.environ and os.environ.get(rank_name) == "0":
            continue  # (task 0 alone has --pty's terminal: another is a step's started from that shell, inheriting it)
        rank, count = os.environ.get(rank_name, ""), os.environ.get(count_name, "")
        several = (rank.isdigit() and int(rank) > 0) or (count.isdigit() and int(count) > 1)
        if several:
            given = ", ".join(f"{name}={os.environ[name]}" for name in (rank_name, count_name) if name in os.environ)
            # (both set: a trainer that asks accelerate, not the environment, found one process)
            unread = (
                "accelerate sees one process"
                if {"RANK", "WORLD_SIZE"} <= os.environ.keys()
                else ("RANK and WORLD_SIZE are not both set")
            )
            raise ShardingError(
                f"this process is one of several a launcher started ({given}) but no rank of several was found for "
                f"it: torch.distributed has no process group of several and {unread}, so "
                "each process would read the whole dataset, the same batches as the others. Initialise "
                "torch.distributed first (init_process_group), launch with torchrun or accelerate launch, or set "
                f"RANK and WORLD_SIZE; {instead}"
            )


def _trainer_uses_accelerate() -> bool:
    """Whether accelerate may know this process's rank: the trainer imported it, or ``accelerate launch`` (which
    passes its settings as ``ACCELERATE_*`` variables) started the process."""
    return "accelerate" in sys.modules or any(name.startswith("ACCELERATE_") for name in os.environ)


def launch_key() -> str | None:
    """A key the ranks that one launcher process started on this node for one launch share with each other and with
    no other process, or None where this process was not started so or it cannot be told (no ``/proc``: not Linux):
    then no key is safe to share.

    The launcher is this process's parent: a ``torchrun`` agent (``accelerate launch`` on several GPUs runs one too;
    its ranks are told by ``TORCHELASTIC_RUN_ID``), or one :data:`~lerobot_dali.said_once._LAUNCHERS` names: Slurm's
    step manager (``srun``'s tasks, or a batch script run as the batch step's), Open MPI's ``mpirun``/``prterun`` and
    daemons, MPICH's and Intel MPI's hydra proxy, DeepSpeed's ``deepspeed.launcher.launch``. Each starts a rank once
    per launch: per restart for an agent (``TORCHELASTIC_RESTART_COUNT``), per PMIx namespace for Open MPI's daemons,
    which a persistent DVM keeps from launch to launch (none given: no key). Its pid and start time
    (``/proc/<pid>/stat``) under this boot and pid namespace (containers on one host share the boot) name it apart
    from every other process, while the launch's ids do not: torchrun's rendezvous id is "none" in every job without
    ``--standalone``, Slurm reuses job ids (its counter wraps, a requeued job keeps its id), an mpirun's namespace
    names it by host and pid. So the ranks of two nodes get two keys, as do two launches one after another.

    A rank whose parent may run one program after another gets none: a shell or a wrapper started by the launcher
    (``torchrun --no-python bash train.sh``, ``srun bash -c 'python a.py; python b.py'``), or a shell where the
    launcher's variables were set by hand (``export TORCHELASTIC_RUN_ID=... ; python train.py`` twice; a notebook's
    kernel or a sweep script that sets them: an agent is told by its command line, :func:`_is_elastic_agent`).
    """
    parent = os.getppid()
    launch = _launch_of(parent)
    started = _start_time(parent)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    if launch is None or started is None or os.getppid() != parent:  # (or the parent died: its pid is reused)
        return None
    return hashlib.sha256("\0".join([boot, namespace, str(parent), started, *launch]).encode()).hexdigest()[:32]


#: Launchers whose one process may start the ranks of launch after launch (a persistent DVM's daemons): each launch's
#: ranks are told apart by its PMIx namespace, without which they get no key.
_DAEMONS = frozenset({"orted", "prted", "prte"})


def _launch_of(parent: int) -> list[str] | None:
    """What names this process's launch among those its parent ``parent`` starts (:func:`launch_key`), None where the
    parent is no launcher or may start programs one after another that are no ranks of one launch."""
    run_id, restart = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if run_id is not None and restart is not None:
        try:
            environment = Path(f"/proc/{parent}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        inherited = f"TORCHELASTIC_RUN_ID={run_id}".encode() in environment  # (a wrapper the agent started)
        return ["torchelastic", run_id, restart] if not inherited and _is_elastic_agent(parent) else None
    if not _is_launcher(parent, wrapped=False) or _runs_programs(parent):  # (a script named mpirun runs on)
        return None
    namespace = os.environ.get("PMIX_NAMESPACE", "")
    return None if not namespace and _names(parent) & _DAEMONS else ["launcher", namespace]


#: The programs and modules (``python -m``) that run a torchrun agent: ``torchrun``, ``accelerate launch``, and
#: DeepSpeed's launcher, whose elastic agent is torch's.
_AGENT_PROGRAMS = frozenset(
    {"torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch"}
)
_AGENT_SCRIPTS = ("torch/distributed/run.py", "torch/distributed/launch.py")


def _is_elastic_agent(pid: int) -> bool:
    """Whether process ``pid`` runs a torchrun agent, by its command line (:data:`_AGENT_PROGRAMS`): a process that set
    ``TORCHELASTIC_RUN_ID`` for the programs it runs by hand (a shell, a notebook's kernel) may run one after another.
    """
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    for at, argument in enumerate(argv[:4]):  # (python [-u] torchrun ...; python -u -m torch.distributed.run ...)
        name = os.path.basename(argument)
        if name in _AGENT_PROGRAMS or argument.endswith(_AGENT_SCRIPTS):
            return True
        if (name == "accelerate" and argv[at + 1 : at + 2] == ["launch"]) or argument == "accelerate.commands.launch":
            return True
    return False


def _runs_programs(pid: int) -> bool:
    """Whether process ``pid`` may run one program after another: a shell (interactive too), or a wrapper
    (:func:`~lerobot_dali.said_once._is_wrapper`: ``timeout``, ``uv run``, Apptainer's starter)."""
    return bool(_names(pid) & _SHELLS) or _is_wrapper(pid)


def _names(pid: int) -> set[str]:
    """The names of process ``pid``: its ``comm``, and its program's file name where this process may read it."""
    process = Path(f"/proc/{pid}")
    names = set()
    with contextlib.suppress(OSError):
        names.add((process / "comm").read_text().rstrip("\n"))
    with contextlib.suppress(OSError):  # (another user's is not readable)
        names.add(Path(os.readlink(process / "exe")).name)
    return names


def usable_cpus() -> int:
    """CPU cores this process may run on (cgroup/affinity aware where the OS says so)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_world_size() -> int:
    """The ranks on this node (``LOCAL_WORLD_SIZE``, set by torchrun and accelerate; 1 without it), which share its
    CPUs and its /dev/shm. ShardingError naming ``LOCAL_WORLD_SIZE`` where it is no whole number >= 1
    (:func:`_env_count`: ``two``, ``""`` or ``0`` were taken for 1 rank)."""
    return _env_count("LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in os.environ else 1


def cpus_per_local_rank() -> int:
    """CPUs this process may run on, shared among the ranks of its node (:func:`local_world_size`): the budget
    for this rank's decoding workers."""
    return max(1, usable_cpus() // local_world_size())


def require_cuda(asked: str, *, instead: str) -> int:
    """The GPUs this process sees, or :class:`~lerobot_dali.errors.CudaUnavailableError` when it sees none: asked
    for a GPU (``asked``, as the user spelled it) without one, DALI fails at the first batch and accelerate quietly
    trains on the CPU. ``instead``: the option that runs on the CPU."""
    import torch

    visible = torch.cuda.device_count()  # asks the driver; creates no CUDA context
    if visible == 0:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise CudaUnavailableError(
            f"{asked} but torch ({torch.__version__}, {build}) sees no CUDA GPU: check the driver and "
            f"CUDA_VISIBLE_DEVICES, or pass {instead} to run on the CPU"
        )
    return visible


def local_cuda_device(local_rank: int) -> str:
    """The GPU of a rank asking for plain ``"cuda"``: its ``LOCAL_RANK``-th, or the only one it sees when a
    launcher or scheduler gives each rank its own GPU through ``CUDA_VISIBLE_DEVICES`` (SLURM's GPU binding),
    where ``LOCAL_RANK`` is no ordinal of this process."""
    import torch

    visible = torch.cuda.device_count()  # asks the driver; creates no CUDA context
    if local_rank < visible or visible == 0:  # no GPU: the iterator's check (require_cuda) says so
        return f"cuda:{local_rank}"
    if visible == 1:
        return "cuda:0"
    raise ValueError(
        f"LOCAL_RANK is {local_rank} but this process sees {visible} GPUs (CUDA_VISIBLE_DEVICES); pass "
        "device='cuda:N' to say which one this rank uses"
    )


def rank_cuda_device(ranks: RankInfo) -> str:
    """The GPU that plain ``"cuda"`` means for the rank ``ranks``: where a launcher numbers the ranks of a node
    (``LOCAL_RANK``, or accelerate's local process index), :func:`local_cuda_device`; else torch's current device, as
    torch itself reads ``"cuda"`` (``mp.spawn`` scripts pick theirs with ``torch.cuda.set_device(rank)``), read only
    where CUDA is initialised already (reading it initialises it). A rank above 0 of a process group (or of
    ``RANK``/``WORLD_SIZE``) that sees several GPUs and never chose one gets ``cuda:0`` with a warning: right for the
    first rank of another node (``srun`` and ``init_process_group`` by hand, one process a node), wrong for an
    ``mp.spawn`` rank that forgot its ``set_device``, which trained on GPU 0 unsaid. So is one whose current device
    is still 0 while it holds tensors on another GPU (an ``mp.spawn`` script's ``model.to(rank)`` without
    ``set_device`` initialises CUDA but leaves the current device 0). Not refused: ``set_device(0)`` on another
    node's rank is right."""
    import torch

    if "LOCAL_RANK" in os.environ or ranks.source == "accelerate":
        return local_cuda_device(ranks.local_rank)
    another_gpu = ranks.source in ("torch.distributed", "environment") and ranks.rank > 0
    if torch.cuda.is_initialized():
        current = torch.cuda.current_device()
        held = []
        if another_gpu and current == 0:  # (the caching allocator's counts: asking creates no CUDA context)
            held = [d for d in range(1, torch.cuda.device_count()) if torch.cuda.memory_allocated(d)]
        if held:
            warn_once(
                logger,
                "rank %d of %d: device='cuda' is cuda:0 here, torch's current device (no LOCAL_RANK, and no "
                "torch.cuda.set_device yet), while this process holds tensors on cuda:%s (an mp.spawn script's "
                "model.to(rank)?): its batches and DALI's decoding would be on GPU 0 with rank 0's; call "
                "torch.cuda.set_device(rank) before building the iterator, or pass device='cuda:N'",
                ranks.rank,
                ranks.world_size,
                ", cuda:".join(map(str, held)),
            )
        return f"cuda:{current}"
    if another_gpu and torch.cuda.device_count() > 1:
        warn_once(
            logger,
            "rank %d of %d: device='cuda' is cuda:0 here (no LOCAL_RANK, and no torch.cuda.set_device yet), as for "
            "rank 0, while this process sees %d GPUs; if this rank has another GPU, call "
            "torch.cuda.set_device(<its GPU>) before building the iterator, or pass device='cuda:N'",
            ranks.rank,
            ranks.world_size,
            torch.cuda.device_count(),
        )
    return "cuda:0"
