"""Rank detection: explicit arguments, then torch.distributed, then the launcher's environment, then accelerate."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist
from conftest import shared_dataset

from lerobot_dali.distributed import (
    RankInfo,
    cpus_per_local_rank,
    draws_progress,
    launch_key,
    local_cuda_device,
    rank_cuda_device,
    resolve_rank,
)
from lerobot_dali.errors import ShardingError
from lerobot_dali.iterator import DALILeRobotIterator
from tests.launched_ranks import run_ranks

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
#: Other launchers' (srun's, mpirun's), which name no rank resolve_rank reads.
OTHER_LAUNCHER_VARS = (
    "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PTY_PORT",
)  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch) -> pytest.MonkeyPatch:
    for name in (*LAUNCHER_VARS, *OTHER_LAUNCHER_VARS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_arguments_win_and_must_come_in_pairs(clean_env) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    info = resolve_rank(2, 3)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (2, 3, 0, "arguments")  # (no LOCAL_RANK)
    with pytest.raises(ValueError, match="both rank and world_size"):
        resolve_rank(1, None)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        resolve_rank(3, 3)
    # A launcher's variables passed as they come (strings) are named, not a bare comparison error.
    with pytest.raises(TypeError, match=r"rank must be an int, got str \('1'\)"):
        resolve_rank("1", 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"world_size must be an int, got str \('4'\)"):
        resolve_rank(1, "4")  # type: ignore[arg-type]


def test_launcher_environment(clean_env) -> None:
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "1")
    info = resolve_rank()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 4, 1, "environment")


@pytest.mark.parametrize(
    ("name", "value", "valid"),
    [("RANK", "abc", "0"), ("RANK", "1.0", "0"), ("RANK", " 1", "0"), ("WORLD_SIZE", "4.0", "1"),
     ("WORLD_SIZE", "0", "1"), ("LOCAL_RANK", "x", "0"), ("LOCAL_RANK", "-1", "0"),
     ("RANK", "\u0661", "0")],  # (an Arabic-Indic 1: a digit to str.isdigit and int(), in no launcher's spelling)
)  # fmt: skip
def test_a_launcher_variable_that_is_no_whole_number_is_named(clean_env, name: str, value: str, valid: str) -> None:
    # (each was a bare int() ValueError, or RankInfo's 'rank must be in [0, world_size)', from deep in resolve_rank)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv(name, value)
    with pytest.raises(ShardingError, match=rf"{name}='{value}' is not a valid {name}: .* >= {valid} .*{name}={valid}"):
        resolve_rank()


@pytest.mark.parametrize(
    ("launched", "named"),
    [("RANK=5 WORLD_SIZE=2", "RANK='5' with WORLD_SIZE='2'"), ("RANK=1 WORLD_SIZE=1", "RANK='1' with WORLD_SIZE='1'"),
     ("RANK=1 WORLD_SIZE=2 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2", "LOCAL_RANK='2' with LOCAL_WORLD_SIZE='2'"),
     ("RANK=1 WORLD_SIZE=4 LOCAL_RANK=5 LOCAL_WORLD_SIZE=1", "LOCAL_RANK='5' with LOCAL_WORLD_SIZE='1'")],
)  # fmt: skip
def test_a_launcher_rank_not_below_its_count_is_named(clean_env, launched: str, named: str) -> None:
    """RANK=5 WORLD_SIZE=2 failed in RankInfo's bare 'rank must be in [0, world_size)' ValueError naming no variable;
    LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 passed unsaid (this rank took another's GPU, cuda:2)."""
    for name_value in launched.split():
        clean_env.setenv(*name_value.split("="))
    rank_name, count_name = (part.split("=")[0] for part in named.split(" with "))
    with pytest.raises(ShardingError, match=rf"{named}: .* {rank_name} must be below {count_name} .*fix or unset"):
        resolve_rank()


def test_rank_info_out_of_range_is_a_sharding_error_saying_where_it_came_from() -> None:
    with pytest.raises(ShardingError, match=r"got rank=2, world_size=2 \(from accelerate\)"):
        RankInfo(2, 2, 0, "accelerate")


def test_an_initialised_process_group_wins_over_the_environment(clean_env, tmp_path: Path) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")  # stale or foreign values: the process group is the truth
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        info = resolve_rank()
    finally:
        dist.destroy_process_group()
    assert (info.rank, info.world_size, info.source) == (0, 1, "torch.distributed")


def test_accelerate_then_single_process(clean_env) -> None:
    pytest.importorskip("accelerate")  # (imported: the trainer uses it)
    info = resolve_rank()
    assert (info.rank, info.world_size, info.source) == (0, 1, "accelerate")


def test_a_trainer_whose_accelerate_does_not_import_is_one_process(clean_env) -> None:
    """``accelerate`` in sys.modules but not importable (None there: an import that failed, or one blocked on purpose):
    the one process, as where the trainer does not use it."""
    clean_env.setitem(sys.modules, "accelerate", None)
    info = resolve_rank()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (0, 1, 0, "single process")


@pytest.mark.parametrize(
    "launched",
    [
        "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2",
        "SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2",
        "PMI_RANK=1 PMI_SIZE=4", "MV2_COMM_WORLD_RANK=0 MV2_COMM_WORLD_SIZE=2",
    ],
)  # fmt: skip
@pytest.mark.parametrize("accelerate", [False, True])
def test_one_process_of_several_a_launcher_started_is_refused(clean_env, launched: str, accelerate: bool) -> None:
    """srun's or mpirun's processes without torchrun (no process group, no RANK and WORLD_SIZE), or RANK without
    WORLD_SIZE: each was rank 0 of 1 ('single process', or 'accelerate' where the trainer uses it) and read the
    whole dataset, every process the same batches."""
    pytest.importorskip("accelerate")  # (imported by the test run; without ACCELERATE_*: the trainer "uses" it)
    for name_value in launched.split():
        clean_env.setenv(*name_value.split("="))
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: accelerate)
    given = ", ".join(v for v in launched.split() if v.split("=")[0] != "SLURM_NTASKS")
    with pytest.raises(ShardingError, match=rf"one of several a launcher started \({given}\).* pass rank=0 and"):
        resolve_rank()
    assert resolve_rank(0, 1).world_size == 1  # (asked for: every process reads everything)


@pytest.mark.parametrize(
    "alone", ["", "RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "SLURM_PROCID=0 SLURM_NTASKS=8", "PMI_RANK=0 PMI_SIZE=1"]
)
def test_one_process_as_launchers_start_one_reads_everything(clean_env, alone: str) -> None:
    """Slurm's batch step (``sbatch --ntasks=8``: SLURM_NTASKS of the job, no step's count, SLURM_PROCID 0), one
    process a launcher started, a stray RANK=0: one process, not refused."""
    for name_value in alone.split():
        clean_env.setenv(*name_value.split("="))
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: False)
    assert (resolve_rank().rank, resolve_rank().world_size, resolve_rank().source) == (0, 1, "single process")


def test_rank_0_of_world_size_1_set_by_hand_is_one_process_where_a_launcher_started_several(clean_env) -> None:
    """The refusal says to set RANK and WORLD_SIZE; RANK=0 WORLD_SIZE=1 under ``srun -n 2`` (each task a run of its
    own) resolved to rank 0 of 1 by resolve_rank, but train.py's data_rank, which asks refuse_unresolved_launch
    itself, refused it naming SLURM_PROCID: 1 of 2 callers refused the escape -> 0 of 2."""
    from types import SimpleNamespace

    from pipelines.train import data_rank

    for name, value in {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "RANK": "0", "WORLD_SIZE": "1"}.items():
        clean_env.setenv(name, value)
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: False)
    assert (resolve_rank().rank, resolve_rank().world_size, resolve_rank().source) == (0, 1, "environment")
    assert data_rank(SimpleNamespace(process_index=0, num_processes=1)) == (0, 1)
    clean_env.delenv("WORLD_SIZE")  # (RANK=0 alone says no one of one: srun's variables are still this process's)
    with pytest.raises(
        ShardingError, match=r"\(SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2\).* RANK and WORLD_SIZE are not"
    ):
        resolve_rank()
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv("RANK", "1")  # (a rank above 0 of one process: still refused)
    with pytest.raises(ShardingError, match=r"\(RANK=1, WORLD_SIZE=1\)"):
        data_rank(SimpleNamespace(process_index=0, num_processes=1))


@pytest.mark.parametrize(
    ("name", "value", "valid"),
    [("RANK", " 1", "0"), ("RANK", "1\r", "0"), ("RANK", "x", "0"), ("WORLD_SIZE", "2\r", "1"), ("WORLD_SIZE", "", "1"),
     ("WORLD_SIZE", "0", "1"), ("LOCAL_WORLD_SIZE", "2 ", "1")],
)  # fmt: skip
def test_a_torchrun_variable_alone_and_no_whole_number_is_named(clean_env, name: str, value: str, valid: str) -> None:
    """RANK or WORLD_SIZE without the other (or LOCAL_WORLD_SIZE) set by hand or from a CRLF env file: each was no
    rank above 0 nor count above 1 to refuse_unresolved_launch, and the process read everything as rank 0 of 1 (7 of
    7, through resolve_rank and train.py's data_rank alike), while RANK=" 1" with WORLD_SIZE=2 was named."""
    from types import SimpleNamespace

    from pipelines.train import data_rank

    clean_env.setenv(name, value)
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: False)
    named = rf"{re.escape(f'{name}={value!r}')} is not a valid {name}: .* >= {valid} .*{name}={valid}"
    with pytest.raises(ShardingError, match=named):
        resolve_rank()
    with pytest.raises(ShardingError, match=named):
        data_rank(SimpleNamespace(process_index=0, num_processes=1))


def test_a_process_typed_in_an_interactive_srun_shell_of_several_tasks_is_one_process(clean_env) -> None:
    """``srun -n 4 --pty bash``, then ``python train.py`` in its shell: the shell is task 0 of a step of 4 (the other
    tasks' shells exit at once, their output sent nowhere), and Slurm's variables are the shell's, not of several
    processes of ours: refused as one of several (1 of 1) -> rank 0 of 1. The same step without --pty is refused."""
    for name, value in {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}.items():
        clean_env.setenv(name, value)
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: False)
    with pytest.raises(ShardingError, match=r"\(SLURM_PROCID=0, SLURM_STEP_NUM_TASKS=4\)"):
        resolve_rank()
    clean_env.setenv("SLURM_PTY_PORT", "34889")
    assert (resolve_rank().rank, resolve_rank().world_size, resolve_rank().source) == (0, 1, "single process")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")  # (another launcher's several, under it: still refused)
    with pytest.raises(ShardingError, match=r"\(OMPI_COMM_WORLD_SIZE=2\)"):
        resolve_rank()


def test_a_step_started_from_an_interactive_srun_shell_is_still_refused_in_its_other_tasks(clean_env) -> None:
    """``salloc`` (an interactive step: SLURM_PTY_PORT set) or ``srun --pty bash``, then ``srun -n 2 python train.py``
    in its shell: the new step's tasks inherit the shell's SLURM_PTY_PORT, and each read the whole dataset as rank 0
    of 1, unsaid (2 of 2 tasks). Only task 0 of a --pty step has the terminal: another task under it is one of
    several, refused; task 0 is let be (it may be the shell's own)."""
    clean_env.setattr("lerobot_dali.distributed._trainer_uses_accelerate", lambda: False)
    for name, value in {"SLURM_PTY_PORT": "34889", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}.items():
        clean_env.setenv(name, value)
    clean_env.setenv("SLURM_PROCID", "1")
    with pytest.raises(ShardingError, match=r"\(SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2\)"):
        resolve_rank()
    clean_env.setenv("SLURM_PROCID", "0")
    assert (resolve_rank().rank, resolve_rank().world_size) == (0, 1)


_ASK_WITHOUT_ACCELERATE = """
import os, sys
from lerobot_dali.distributed import resolve_rank
alone = resolve_rank()
print(alone.source, alone.rank, alone.world_size, "accelerate" in sys.modules)
os.environ["ACCELERATE_MIXED_PRECISION"] = "no"  # (as `accelerate launch` sets it, even for one process)
launched = resolve_rank()
print(launched.source, launched.rank, launched.world_size, "accelerate" in sys.modules)
"""


def test_accelerate_is_asked_only_where_the_trainer_uses_it() -> None:
    """A trainer that neither imports accelerate nor was started by ``accelerate launch`` does not pay for importing
    it (0.14-0.26 s of CPU), nor get a ``PartialState`` it never asked for; one started by it is asked as before."""
    pytest.importorskip("accelerate")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("ACCELERATE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _ASK_WITHOUT_ACCELERATE], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["single process 0 1 False", "accelerate 0 1 True"]


def test_iterator_reads_its_rank_from_the_launcher(make_ds, clean_env) -> None:
    root = make_ds(episodes=4, frames_per_episode=[3, 4, 2, 5], cameras=1, codec="vp9", size=(64, 64))
    seen = []
    for rank in (0, 1):
        clean_env.setenv("RANK", str(rank))
        clean_env.setenv("WORLD_SIZE", "2")
        it = DALILeRobotIterator(root, batch_size=1, device="cpu", num_workers=0, shuffle=False, drop_last=False)
        assert (it.rank, it.world_size) == (rank, 2)
        seen.append({int(i) for batch in it for i in batch["index"]})
        it.close()
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] <= set(range(14))


def test_cpus_are_shared_among_the_ranks_of_a_node(clean_env) -> None:
    clean_env.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert cpus_per_local_rank() == 16
    clean_env.setenv("LOCAL_WORLD_SIZE", "8")
    assert cpus_per_local_rank() == 2
    clean_env.setenv("LOCAL_WORLD_SIZE", "3")  # (rounded down: 3 ranks of 6 CPUs would be 18 of the node's 16)
    assert cpus_per_local_rank() == 5
    clean_env.setenv("LOCAL_WORLD_SIZE", "32")  # more ranks than CPUs: still one each
    assert cpus_per_local_rank() == 1


def test_the_cpus_are_those_this_process_may_run_on(clean_env) -> None:
    """Its own affinity (pid 0: this process), not another process's (pid 1, a container's init, may run anywhere)."""
    clean_env.setattr("os.sched_getaffinity", lambda pid: set(range(4 if pid == 0 else 64)), raising=False)
    assert cpus_per_local_rank() == 4


def test_only_the_first_rank_of_a_node_draws_progress(clean_env) -> None:
    """One bar a node: the process of LOCAL_RANK 0, or the one process no launcher started; not the others."""
    assert draws_progress()
    clean_env.setenv("LOCAL_RANK", "0")
    assert draws_progress()
    clean_env.setenv("LOCAL_RANK", "1")
    assert not draws_progress()


@pytest.mark.parametrize("value", ["two", "", " 2 ", "2.0", "0", "-4"])
def test_a_local_world_size_that_is_no_whole_number_is_named(clean_env, value: str) -> None:
    """Each was taken for 1 rank on the node, all its CPUs for each rank's workers (' 2 ' for 2: RANK=' 1' fails)."""
    clean_env.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    clean_env.setenv("LOCAL_WORLD_SIZE", value)
    valid = rf"LOCAL_WORLD_SIZE='{value}' is not a valid LOCAL_WORLD_SIZE: .* >= 1 .*LOCAL_WORLD_SIZE=1"
    with pytest.raises(ShardingError, match=valid):
        cpus_per_local_rank()
    clean_env.setenv("LOCAL_RANK", "0")  # (with a LOCAL_RANK: said as the rank is resolved, before any worker starts)
    with pytest.raises(ShardingError, match=valid):
        resolve_rank()


def test_iterator_says_how_many_workers_decode_on_how_many_cpus(make_ds, clean_env, caplog) -> None:
    root = make_ds(episodes=2, frames_per_episode=3, cameras=1, codec="h264", size=(64, 64))
    clean_env.setattr("os.sched_getaffinity", lambda pid: set(range(12)), raising=False)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):  # (a node's two ranks)
        clean_env.setenv(name, value)
    with caplog.at_level("INFO", logger="lerobot_dali.camera_plan"):
        DALILeRobotIterator(root, batch_size=1, device="cpu", num_workers=3).close()
    (line,) = [r.getMessage() for r in caplog.records if "decoded on the CPU" in r.getMessage()]
    assert "['observation.images.cam0']" in line and "3 worker processes" in line and "6 CPUs" in line


@pytest.mark.parametrize(
    ("local_rank", "visible", "expected"),
    [(3, 8, "cuda:3"), (3, 1, "cuda:0"), (0, 1, "cuda:0"), (3, 0, "cuda:3"), (3, 2, None), (2, 2, None)],
    ids=["all-gpus-visible", "one-gpu-per-rank", "rank-0", "no-gpu", "ambiguous", "rank-past-the-last-gpu"],
)
def test_plain_cuda_picks_the_ranks_gpu(
    monkeypatch: pytest.MonkeyPatch, local_rank: int, visible: int, expected: str | None
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    if expected is None:  # 2 GPUs visible to local rank 2 or 3 (no cuda:2): which one is not ours to guess
        with pytest.raises(ValueError, match=f"LOCAL_RANK is {local_rank} but this process sees 2 GPUs"):
            local_cuda_device(local_rank)
    else:
        assert local_cuda_device(local_rank) == expected


#: (rank, world size, local rank, source, LOCAL_RANK set, GPUs visible, torch's current device or None where CUDA is
#: not initialised[, the GPUs this process holds tensors on]) -> the device plain "cuda" means, and whether it warns
#: that another GPU may be meant
_PLAIN_CUDA_CASES = {
    # mp.spawn: no LOCAL_RANK; the script called torch.cuda.set_device(rank) before building the iterator
    "spawn-set-device": ((1, 2, 0, "torch.distributed", False, 2, 1), ("cuda:1", False)),
    "spawn-set-device-rank-3": ((3, 4, 0, "torch.distributed", False, 4, 3), ("cuda:3", False)),
    # mp.spawn without set_device: cuda:0 as for rank 0, said (it may be meant: another node's first rank)
    "spawn-no-set-device": ((1, 2, 0, "torch.distributed", False, 2, None), ("cuda:0", True)),
    # mp.spawn, model.to(rank) and no set_device: CUDA initialised with rank 1's tensors on GPU 1, current device 0
    "spawn-model-to-rank": ((1, 2, 0, "torch.distributed", False, 2, 0, (1,)), ("cuda:0", True)),
    # srun and init_process_group by hand, one process a node: node 2's rank set_device(0), which is its own GPU
    "another-node-set-device-0": ((1, 2, 0, "torch.distributed", False, 8, 0, (0,)), ("cuda:0", False)),
    "spawn-rank-0": ((0, 2, 0, "torch.distributed", False, 2, None), ("cuda:0", False)),
    "spawn-one-gpu-per-rank": ((1, 2, 0, "torch.distributed", False, 1, None), ("cuda:0", False)),
    # RANK and WORLD_SIZE exported by hand from Slurm's, no LOCAL_RANK, no set_device: said as for a process group
    "environment-no-set-device": ((1, 2, 0, "environment", False, 2, None), ("cuda:0", True)),
    # one process reading rank 1's share by arguments: no process group, torch's "cuda"
    "arguments-one-process": ((1, 2, 0, "arguments", False, 2, None), ("cuda:0", False)),
    "single-process-current-device": ((0, 1, 0, "single process", False, 2, 1), ("cuda:1", False)),
    # a launcher's LOCAL_RANK wins over the current device (CUDA initialised on 0 before set_device)
    "torchrun": ((3, 8, 3, "torch.distributed", True, 8, 0), ("cuda:3", False)),
    "torchrun-one-gpu-per-rank": ((3, 8, 3, "environment", True, 1, None), ("cuda:0", False)),
    "accelerate": ((2, 4, 2, "accelerate", False, 4, None), ("cuda:2", False)),
}


@pytest.mark.parametrize(("case", "expected"), list(_PLAIN_CUDA_CASES.values()), ids=list(_PLAIN_CUDA_CASES))
def test_plain_cuda_is_the_gpu_the_rank_set_or_said(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, case: tuple, expected: tuple[str, bool]
) -> None:
    """A rank without LOCAL_RANK (``mp.spawn``) got cuda:0 for plain "cuda", as rank 0 did, whatever torch's current
    device was: every rank decoded on GPU 0 and handed batches there while its model sat on its own GPU. One whose
    ``model.to(rank)`` initialised CUDA with the current device left 0 got cuda:0 unsaid: now said."""
    import torch

    rank, world_size, local_rank, source, launcher, visible, current, *held = case
    held_on = set(held[0]) if held else set()
    clean_env.setattr(torch.cuda, "memory_allocated", lambda device: 512 if device in held_on else 0)
    if launcher:
        clean_env.setenv("LOCAL_RANK", str(local_rank))
    clean_env.setattr(torch.cuda, "device_count", lambda: visible)
    clean_env.setattr(torch.cuda, "is_initialized", lambda: current is not None)
    clean_env.setattr(torch.cuda, "current_device", lambda: current if current is not None else 0)
    ranks = RankInfo(rank, world_size, local_rank, source)
    device, warns = expected
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.distributed"):
        assert rank_cuda_device(ranks) == device
    said = [r.getMessage() for r in caplog.records if "no torch.cuda.set_device yet" in r.getMessage()]
    assert len(said) == warns, said


def test_an_iterator_on_plain_cuda_uses_the_gpu_its_process_set(clean_env: pytest.MonkeyPatch, make_ds) -> None:
    """Built (not run: no GPU here) in a process that called torch.cuda.set_device(1) without LOCAL_RANK, as an
    ``mp.spawn`` rank does: its pipeline and its NVDEC probe are on device 1 (they were on 0)."""
    import torch

    root = make_ds(episodes=2, frames_per_episode=3, cameras=1, codec="h264", size=(64, 64))
    clean_env.setattr(torch.cuda, "device_count", lambda: 2)
    clean_env.setattr(torch.cuda, "is_initialized", lambda: True)
    clean_env.setattr(torch.cuda, "current_device", lambda: 1)
    it = DALILeRobotIterator(root, batch_size=1, device="cuda", num_workers=0, rank=1, world_size=2)
    try:
        assert (it._device, it._device_id) == (torch.device("cuda:1"), 1)
    finally:
        it.close()


_PRINT_LAUNCH_KEY = "from lerobot_dali.distributed import launch_key; print(launch_key())"


def test_the_ranks_of_one_torchrun_agent_share_a_launch_key_and_no_other_job_does() -> None:
    """A key for what one launch's ranks on a node may share (a run's version of unversioned files): equal across
    the ranks of one agent, another for another agent even with the same rendezvous id ("none", torchrun's default
    without --standalone)."""
    first, second = run_ranks(_PRINT_LAUNCH_KEY, 2), run_ranks(_PRINT_LAUNCH_KEY, 2)
    assert len(set(first)) == 1 and len(set(second)) == 1, (first, second)
    assert first[0].strip() not in ("None", second[0].strip())
    assert len(first[0].strip()) == 32
    # An agent whose program comes after interpreter options (``python -u -m torch.distributed.run``) is one too.
    optioned = run_ranks(_PRINT_LAUNCH_KEY, 2, python_options=("-u", "-B"))
    assert len(set(optioned)) == 1 and len(optioned[0].strip()) == 32, optioned


def test_no_launch_key_under_a_wrapper_that_runs_on_nor_without_torchrun(monkeypatch) -> None:
    """A rank under a shell of its own (``torchrun --no-python bash train.sh``) may be one of several programs that
    shell runs in turn: no key. A process torchrun did not start has none either."""
    wrapped = run_ranks(_PRINT_LAUNCH_KEY, 2, wrapper=["sh", "-c", '"$0" "$@"; true'])
    assert [out.strip() for out in wrapped] == ["None", "None"]
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert launch_key() is None


def test_no_launch_key_where_the_parent_died_while_it_was_read(monkeypatch) -> None:
    """The parent's pid, read again after its start time, is another (this process was reparented: the launcher
    died, and its pid may be reused): the start time read may be another process's, so no key."""
    from lerobot_dali import distributed

    parents = iter([4242, 1])
    monkeypatch.setattr(distributed.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(distributed, "_launch_of", lambda parent: ["launcher", ""])
    monkeypatch.setattr(distributed, "_start_time", lambda parent: "1234")
    assert launch_key() is None


#: A launcher (named by its program's file name, a link to Python) starting 2 ranks that print their launch key, for
#: each PMIx namespace of ``argv[1:]`` in turn (a DVM's launches; none given: one launch), and printing their keys.
_LAUNCHER = """
import json, os, subprocess, sys
for namespace in sys.argv[1:] or [None]:
    env = {**os.environ, **({"PMIX_NAMESPACE": namespace} if namespace else {})}
    ranks = [subprocess.Popen([sys.executable, "-c", os.environ["RANK_CODE"]], env={**env, "PMIX_RANK": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    print(json.dumps([r.communicate()[0].strip() for r in ranks]))
"""


def _launched_keys(tmp_path: Path, launcher: str, *namespaces: str, env: dict[str, str] | None = None) -> list[list]:
    """The launch keys of 2 ranks started by a process named ``launcher``, per launch (see :data:`_LAUNCHER`)."""
    named = tmp_path / launcher
    named.unlink(missing_ok=True)
    named.symlink_to(sys.executable)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PMIX_"))}
    done = subprocess.run(
        [named, "-c", _LAUNCHER, *namespaces], env={**base, **(env or {}), "RANK_CODE": _PRINT_LAUNCH_KEY},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize(
    ("launcher", "namespace"),
    [
        ("slurmstepd", None),  # srun's tasks on a node
        ("prterun", "prterun-node1-4242@1"),  # Open MPI 5's mpirun
        ("mpirun", None),  # Open MPI 4
        ("prted", "prterun-node1-4242@1"),  # Open MPI 5's daemon on another node
        ("orted", "2581397505"),  # Open MPI 4's
        ("hydra_pmi_proxy", None),  # MPICH, Intel MPI
    ],
)
def test_the_ranks_an_mpi_or_slurm_launcher_starts_on_a_node_share_a_launch_key(
    launcher: str, namespace: str | None, tmp_path: Path
) -> None:
    """Only torchrun's ranks had a key: under srun, mpirun or hydra each rank took a run version of its own (8 Arrow
    copies of each unversioned data file on a node of 8). The launcher's process on the node names the launch now:
    shared by its ranks, another for the next launch (same job id, same namespace: Slurm and Open MPI reuse them)."""
    first, second = (_launched_keys(tmp_path, launcher, *[namespace] if namespace else [])[0] for _ in range(2))
    assert first[0] == first[1] and second[0] == second[1], (first, second)
    assert first[0] not in ("None", second[0]) and len(first[0]) == 32


def test_a_dvm_daemon_gives_each_launch_its_own_key_and_none_without_a_namespace(tmp_path: Path) -> None:
    """A persistent DVM's daemon (``prte``, ``prted``) is the parent of the ranks of launch after launch: each
    launch's PMIx namespace tells them apart; without one no key is safe."""
    first, second = _launched_keys(tmp_path, "prte", "prte-node1-4242@1", "prte-node1-4242@2")
    assert first[0] == first[1] and second[0] == second[1] and first[0] not in ("None", second[0])
    assert _launched_keys(tmp_path, "prted") == [["None", "None"]]


def test_no_launch_key_under_a_parent_that_holds_the_ranks_run_id_itself(tmp_path: Path) -> None:
    """A parent whose own environment holds the ranks' TORCHELASTIC_RUN_ID was started under the agent (a wrapper,
    even one whose command line reads as an agent's), so it may run programs one after another: no key. An agent sets
    the run id for its ranks alone."""
    run = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert _launched_keys(tmp_path, "torchrun", env=run) == [["None", "None"]]


def test_the_ranks_deepspeed_starts_on_a_node_share_a_launch_key(tmp_path: Path) -> None:
    """DeepSpeed's runner starts ``python -u -m deepspeed.launcher.launch`` on each node, the parent of its ranks."""
    package = tmp_path / "deepspeed" / "launcher"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").touch()
    (package / "__init__.py").touch()
    (package / "launch.py").write_text(_LAUNCHER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(RANK_CODE=_PRINT_LAUNCH_KEY, PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
    launch = [sys.executable, "-u", "-m", "deepspeed.launcher.launch"]
    first, second = (json.loads(subprocess.run(launch, env=env, capture_output=True, check=True).stdout) for _ in "12")
    assert first[0] == first[1] and second[0] == second[1] and first[0] not in ("None", second[0]), (first, second)


#: Two programs one after another from a shell (the last not exec'd: ``true`` follows), each printing its key.
_TWO_PROGRAMS = f'"$PYTHON" -c "{_PRINT_LAUNCH_KEY}"; "$PYTHON" -c "{_PRINT_LAUNCH_KEY}"; true'


@pytest.mark.parametrize(
    ("parent", "commands"),
    [
        # A shell where the launcher's variables were set by hand (a rank's environment copied to debug it).
        ("bash", f"export TORCHELASTIC_RUN_ID=none TORCHELASTIC_RESTART_COUNT=0 RANK=0; {_TWO_PROGRAMS}"),
        ("bash", f"export PMIX_NAMESPACE=prterun-node1-4242@1; {_TWO_PROGRAMS}"),
        # A batch script (the batch step's slurmstepd starts it), and a shell in a step of tasks.
        ("slurmstepd", f"bash -c '{_TWO_PROGRAMS}'"),
    ],
)
def test_programs_one_after_another_from_a_shell_share_no_key(parent: str, commands: str, tmp_path: Path) -> None:
    """A shell runs program after program: one sharing the key of the one before trusted its run's copies of files
    without versions (test_two_programs_one_after_another_read_a_rewritten_file_each). The shell that exported
    torchrun's variables was taken for torchrun's agent (it was started without them): both programs had one key."""
    named = tmp_path / parent
    named.symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PMIX_"))}
    env["PYTHON"] = sys.executable
    script = f"import subprocess; subprocess.run(['bash', '-c', {commands!r}], check=True)"
    done = subprocess.run([named, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["None", "None"], done.stdout


#: A run reading the actions of every episode of the dataset ``argv[1]`` from a server that gives no file version
#: (``run:`` stamps), through a column store in ``argv[2]``; prints their digest.
_UNVERSIONED_RUN = """
import hashlib, sys
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.file_stamps import _VERSION_FIELDS
from tests.fake_remote import FakeRemoteFileSystem

real, versions = FakeRemoteFileSystem._public, {name for name, _ in _VERSION_FIELDS}
FakeRemoteFileSystem._public = lambda self, entry: {k: v for k, v in real(self, entry).items() if k not in versions}
remote = open_dataset("fakeremote://", storage_options={"root": sys.argv[1]}, keys=["action"])
remote.column_store = ColumnStore(sys.argv[2], min_group_rows=1000, min_ratio=4)
digest = hashlib.sha256()
for pos in range(remote.num_episodes):
    digest.update(remote.read_episode(pos)["action"].tobytes())
print(digest.hexdigest())
"""
#: Rewrites the data file ``argv[1]`` at the same size (plain encoding, no statistics), its actions negated.
_REWRITE_SAME_SIZE = """
import sys
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
table = pq.read_table(sys.argv[1])
action = table.column("action").combine_chunks()
negated = pa.ListArray.from_arrays(action.offsets, pc.negate(action.flatten()))
table = table.set_column(table.schema.get_field_index("action"), "action", negated)
pq.write_table(table, sys.argv[1], compression="NONE", use_dictionary=False, write_statistics=False)
"""


def _actions_digest(data_file: Path) -> str:
    """The digest :data:`_UNVERSIONED_RUN` prints, read here directly (episodes in order, rows in order)."""
    table = pq.read_table(data_file, columns=["episode_index", "index", "action"]).sort_by(
        [("episode_index", "ascending"), ("index", "ascending")]
    )
    digest = hashlib.sha256()
    for episode in sorted(set(table.column("episode_index").to_pylist())):
        rows = table.filter(pc.equal(table.column("episode_index"), episode)).column("action")
        digest.update(np.asarray(rows.to_pylist(), dtype=np.float32).tobytes())
    return digest.hexdigest()


def test_two_programs_one_after_another_read_a_rewritten_file_each(tmp_path: Path) -> None:
    """The harm of a key two launches share: the second takes the first one's run version for files its server gives
    no version, and reads its copies as this run's. A shell that exported torchrun's variables ran two programs, and
    a data file was rewritten at the same size between them: the second read the first's Arrow copy (old actions)."""
    dataset = tmp_path / "dataset"
    source = shared_dataset("cr5_v30_av1")
    shutil.copytree(source / "meta", dataset / "meta")
    shutil.copytree(source / "data", dataset / "data")
    (dataset / "videos").symlink_to(source / "videos")
    data_file = dataset / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(data_file)
    pq.write_table(table, data_file, compression="NONE", use_dictionary=False, write_statistics=False)
    before, size = _actions_digest(data_file), data_file.stat().st_size
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PMIX_"))}
    env.update(PYTHON=sys.executable, RUN=_UNVERSIONED_RUN, REWRITE=_REWRITE_SAME_SIZE, PYTHONPATH=os.getcwd())
    commands = (
        'export TORCHELASTIC_RUN_ID=none TORCHELASTIC_RESTART_COUNT=0; "$PYTHON" -c "$RUN" "$@"; '
        '"$PYTHON" -c "$REWRITE" "$0"; "$PYTHON" -c "$RUN" "$@"; true'
    )
    store = tmp_path / "columns"
    done = subprocess.run(
        ["bash", "-c", commands, str(data_file), str(dataset), str(store)], env=env, capture_output=True, text=True,
        timeout=300, check=True,
    )  # fmt: skip
    assert data_file.stat().st_size == size
    after = _actions_digest(data_file)
    assert before != after
    assert done.stdout.split() == [before, after]


def test_programs_a_python_process_runs_with_torchruns_variables_share_no_key() -> None:
    """A process that sets torchrun's variables for the programs it runs one after another (a notebook's kernel, a
    sweep script) was taken for torchrun's agent, which it is not (its command line says): both had one key."""
    kernel = (
        "import os, subprocess, sys\n"
        "env = {**os.environ, 'TORCHELASTIC_RUN_ID': 'none', 'TORCHELASTIC_RESTART_COUNT': '0', 'RANK': '0'}\n"
        "for _ in range(2):\n"
        f"    subprocess.run([sys.executable, '-c', {_PRINT_LAUNCH_KEY!r}], env=env, check=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    done = subprocess.run([sys.executable, "-c", kernel], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "None"], done.stdout


def test_a_wrapper_named_as_a_launcher_is_none(tmp_path: Path) -> None:
    """``timeout`` under a launcher's name (``mpirun`` a link to it: named as Open MPI's launcher is) is a wrapper, as
    a shell script so named is: its rank gets no key, as under any wrapper."""
    named = tmp_path / "mpirun"
    named.symlink_to(shutil.which("timeout"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PMIX_"))}
    done = subprocess.run([named, "120", sys.executable, "-c", _PRINT_LAUNCH_KEY], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.split() == ["None"], done.stdout


def test_accelerate_launch_runs_a_torchrun_agent(tmp_path: Path) -> None:
    """``accelerate launch`` (its command line: ``accelerate launch ...``) runs torch's elastic agent, as torchrun
    does: its ranks' TORCHELASTIC_RUN_ID is the agent's own; ``accelerate`` with another command is none."""
    from lerobot_dali.distributed import _is_elastic_agent

    (tmp_path / "launch").write_text("import time; time.sleep(60)")
    (tmp_path / "env").write_text("import time; time.sleep(60)")
    agents = {}
    for command in ("launch", "env"):
        process = subprocess.Popen(["accelerate", command], executable=sys.executable, cwd=tmp_path)
        try:
            cmdline, deadline = Path(f"/proc/{process.pid}/cmdline"), time.monotonic() + 60
            while b"\0" + command.encode() not in cmdline.read_bytes():  # (until Python has exec'd)
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.01)
            agents[command] = _is_elastic_agent(process.pid)
        finally:
            process.kill()
            process.wait()
    assert agents == {"launch": True, "env": False}


def test_a_shell_script_named_as_a_launcher_is_none(tmp_path: Path) -> None:
    """A script named ``mpirun`` (a site's wrapper, a stand-in for one node) is named as Open MPI's launcher is, but is
    a shell that runs program after program: both its programs had one key."""
    script = tmp_path / "mpirun"
    script.write_text(f"#!/bin/sh\n{_TWO_PROGRAMS}\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PMIX_"))}
    done = subprocess.run([script], env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "None"], done.stdout
