"""``pipelines/train.py`` end to end on CPU: it learns, ranks read disjoint data, and ``--resume`` is exact.

Each run is a real subprocess (``python pipelines/train.py`` or ``python -m torch.distributed.run``, which is
``torchrun``); what each rank consumed comes back through ``--record DIR`` (per step: epoch, dataset
``index`` values, loss) and the models through the checkpoints' ``model.safetensors``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lerobot_dali.errors import CudaUnavailableError, ResumeStateError
from pipelines.policy import ChunkPolicy, FeatureStats, PolicyConfig, masked_l1
from pipelines.train import TrainOptions, build_iterator, data_plan, parse_args
from tests.conftest import refuse_opening

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "pipelines" / "train.py"
COMMON = ["--device", "cpu", "--num-workers", "1", "--chunk", "4", "--lr", "3e-3", "--seed", "0", "--log-every", "4"]

# Single process: 130 frames, batch 8 -> 16 full batches per epoch and a dropped tail of 2.
UNEVEN = dict(episodes=6, frames_per_episode=[20, 24, 16, 30, 18, 22], cameras=2, size=(64, 64), fps=10, codec="vp9")
# Two ranks: 6 x 20 frames, three episodes per rank, batch 6 -> exactly 10 batches per rank per epoch.
EVEN = dict(episodes=6, frames_per_episode=20, cameras=2, size=(64, 64), fps=10, codec="vp9")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(args: list[str], *, procs: int = 1, accelerate: bool = False) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run train.py with ``args`` on ``procs`` ranks."""
    # `python -m torch.distributed.run` is torchrun, bound to this interpreter. `accelerate launch --cpu
    # --num_processes 2` starts a single process on this machine; `--multi_gpu` takes accelerate's
    # multi-process launcher, which also runs on CPUs (train.py --device cpu joins its gloo group).
    launcher = [sys.executable]
    if procs > 1 and accelerate:
        launcher += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(procs)]
        launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        launcher += ["--main_process_port", str(_free_port())]
    elif procs > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--standalone"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return [*launcher, str(TRAIN), *args], env


def _train(
    args: list[str], *, procs: int = 1, timeout: float = 240, accelerate: bool = False
) -> subprocess.CompletedProcess[str]:
    command, env = _command(args, procs=procs, accelerate=accelerate)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert result.returncode == 0, f"train.py exited with {result.returncode}:\n{result.stderr[-30000:]}"
    return result


def _train_until_signalled(
    args: list[str], *, after: str, send: Callable[[subprocess.Popen[str]], None], procs: int = 1, timeout: float = 240
) -> tuple[int, str]:
    """Run train.py in a session of its own and call ``send(process)`` once its log has a line holding ``after``;
    returns its exit status and log."""
    command, env = _command(args, procs=procs)
    return _run_until_signalled(command, env, after=after, send=send, timeout=timeout)


def _run_until_signalled(
    command: list[str],
    env: dict[str, str],
    *,
    after: str,
    send: Callable[[subprocess.Popen[str]], None],
    timeout: float = 240,
) -> tuple[int, str]:
    """Run ``command`` (from the repository) in a session of its own and call ``send(process)`` once its log has a
    line holding ``after``; returns its exit status and log (``tests/test_lerobot_parity.py`` runs
    ``pipelines/lerobot_policy.py`` so)."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
    watchdog = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))  # (a hang fails the test)
    watchdog.start()
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if after and after in line:
                send(process)
                after = ""
        return process.wait(), "".join(lines)
    finally:
        watchdog.cancel()


def _rank_pid(launcher: subprocess.Popen[str], rank: int) -> int:
    """The process of ``rank`` among the launcher's children (by its RANK variable)."""
    for task in Path(f"/proc/{launcher.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                return int(child)
    raise AssertionError(f"no rank {rank} among the children of {launcher.pid}")


def _records(directory: Path, world_size: int) -> list[dict[str, Any]]:
    records = [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert [(r["rank"], r["world_size"]) for r in records] == [(r, world_size) for r in range(world_size)]
    return records


def _model(checkpoint_dir: Path, step: int) -> dict[str, torch.Tensor]:
    assert (checkpoint_dir / "latest").read_text() == f"step_{step:08d}"
    return load_file(checkpoint_dir / f"step_{step:08d}" / "state" / "model.safetensors")


def _assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def _run(
    tmp: Path,
    dataset: Path | Sequence[Path],
    *,
    steps: int,
    batch: int,
    procs: int,
    extra: Sequence[str] = (),
    accelerate: bool = False,
) -> tuple[Path, Path, str]:
    ckpt, record = tmp / "ckpt", tmp / "record"
    paths = [str(dataset)] if isinstance(dataset, Path) else [str(path) for path in dataset]
    args = [*COMMON, "--dataset", *paths, "--steps", str(steps), "--batch-size", str(batch)]
    result = _train(
        [*args, "--checkpoint-dir", str(ckpt), "--record", str(record), *extra], procs=procs, accelerate=accelerate
    )
    return ckpt, record, result.stderr


# -- single process -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single_run(make_ds: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """24 uninterrupted steps, checkpoint at 16 (the last full batch of epoch 0)."""
    tmp = tmp_path_factory.mktemp("single")
    return _run(tmp, make_ds(**UNEVEN), steps=24, batch=8, procs=1, extra=["--save-every", "16"])


def test_single_process_run_learns_and_logs_throughput(single_run: tuple[Path, Path, str]) -> None:
    ckpt, record_dir, log = single_run
    (record,) = _records(record_dir, 1)
    losses = record["losses"]
    assert len(losses) == 24 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-6:]) / 6 < 0.6 * sum(losses[:6]) / 6, losses
    assert record["epochs"] == [0] * 16 + [1] * 8  # 16 full batches of 8 in 130 frames, then epoch 1
    epoch0 = [i for step in record["indices"][:16] for i in step]
    assert len(epoch0) == len(set(epoch0)) == 128 and set(epoch0) <= set(range(130))
    assert epoch0 != sorted(epoch0)  # shuffled
    assert "samples/s" in log and "frames/s" in log and "step 24 epoch 1 loss" in log
    assert "rank 0/1: steps 0..24, batch 8, 16 batches left in epoch 0, cameras" in log
    last = re.escape(str(ckpt / "step_00000024"))
    assert re.search(rf"trained steps 0\.\.24 in \d+\.\d s, to epoch 1; last checkpoint {last}\n", log), log
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000016", "step_00000024"]
    # A save is one line naming the checkpoint; accelerate's own four named the staging folder (.step_N.partial).
    assert log.count("saved checkpoint") == 2 and "accelerate." not in log and ".partial" not in log, log


def test_single_process_resume_at_the_dropped_tail_is_exact(
    single_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    full_ckpt, full_record_dir, _ = single_run
    (full,) = _records(full_record_dir, 1)
    dataset = make_ds(**UNEVEN)
    ckpt, record_dir, _ = _run(tmp_path, dataset, steps=16, batch=8, procs=1)
    (first,) = _records(record_dir, 1)
    assert first["indices"] == full["indices"][:16]  # the run is deterministic
    _, _, log = _run(tmp_path, dataset, steps=24, batch=8, procs=1, extra=["--resume"])
    (resumed,) = _records(record_dir, 1)
    assert "resumed from" in log and resumed["first_step"] == 17
    # (at epoch 0's dropped tail: it said "0 batches left in epoch 0")
    assert "rank 0/1: steps 16..24, batch 8, epoch 0 read to its end, cameras" in log
    assert "accelerate." not in log, log  # ("All scheduler states loaded successfully", "Loading in 0 custom states")
    assert resumed["indices"] == full["indices"][16:]
    assert resumed["epochs"] == [1] * 8
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(full["losses"][16:]), rtol=1e-5, atol=1e-6)
    _assert_same_model(_model(ckpt, 24), _model(full_ckpt, 24))
    _, _, log = _run(tmp_path, dataset, steps=24, batch=8, procs=1, extra=["--resume"])  # "24 more steps"?
    assert "the checkpoint is at step 24 and --steps is 24: nothing to train" in log
    assert "rank 0/1: steps" not in log  # (it said "steps 24..24" after it)


def test_a_resume_with_another_lr_trains_on_at_it_and_says_so(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    """accelerate's load_state brings back the optimiser's saved rate over --lr: a resume with --lr 0.05 trained on at
    the saved 3e-3, unsaid (a review found its weights equal to a resume's with the saved rate)."""

    def rate(step: int) -> float:
        state = torch.load(ckpt / f"step_{step:08d}/state/optimizer.bin", weights_only=False)
        return state["param_groups"][0]["lr"]

    dataset = make_ds(**UNEVEN)
    ckpt, _, _ = _run(tmp_path, dataset, steps=2, batch=8, procs=1)
    _, _, log = _run(tmp_path, dataset, steps=3, batch=8, procs=1, extra=["--resume", "--lr", "0.05"])
    assert "--lr 0.05 replaces the checkpoint's 0.003 from here on" in log
    assert (rate(2), rate(3)) == (3e-3, 0.05)
    _, _, log = _run(tmp_path, dataset, steps=4, batch=8, procs=1, extra=["--resume", "--lr", "0.05"])
    assert "replaces the checkpoint's" not in log and rate(4) == 0.05


def test_keep_checkpoints_keeps_the_newest_and_a_resume_from_them_goes_on(
    make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """Every checkpoint stayed for good (a long run's filled the disk). --keep-checkpoints 2 keeps the two newest as
    each is saved; a resume continues from the newest and prunes alike. The weights at step 9 equal an uninterrupted
    run's, so pruning took nothing a resume reads."""
    dataset = make_ds(**UNEVEN)
    keep = ["--save-every", "2", "--keep-checkpoints", "2"]
    ckpt, _, log = _run(tmp_path / "a", dataset, steps=7, batch=8, procs=1, extra=keep)
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000006", "step_00000007"]
    assert "removed checkpoint(s) step_00000002 (--keep-checkpoints 2)" in log
    assert "removed checkpoint(s) step_00000004, step_00000006" not in log  # (one at a time: the oldest)
    _, _, log = _run(tmp_path / "a", dataset, steps=9, batch=8, procs=1, extra=[*keep, "--resume"])
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000008", "step_00000009"]
    whole, _, _ = _run(tmp_path / "b", dataset, steps=9, batch=8, procs=1)
    _assert_same_model(_model(ckpt, 9), _model(whole, 9))


def test_pruning_leaves_later_steps_and_sweeps_what_a_crash_left(tmp_path: Path) -> None:
    """Checkpoints of steps after ``latest``'s (a run stopped before ``latest`` named them) are this run's to
    replace, not to prune; a folder a crash left mid-delete goes at the next prune."""
    from pipelines.checkpoints import prune_checkpoints

    for name in ("step_00000002", "step_00000004", "step_00000006", "step_00000010", ".step_00000001.pruned"):
        (tmp_path / name).mkdir()
    assert prune_checkpoints(tmp_path, 6, 0) == []
    assert prune_checkpoints(tmp_path, 6, 2) == [tmp_path / "step_00000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000006", "step_00000010"]
    assert prune_checkpoints(tmp_path, 6, 1) == [tmp_path / "step_00000004"]


def test_a_second_run_on_a_checkpoint_dir_in_use_is_refused_and_a_killed_runs_is_free(
    make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """Two runs on one --checkpoint-dir replaced each other's checkpoints and ``latest``, unsaid (a review saw one
    run's saves silently replaced, once a FileNotFoundError on a rename). While a run trains there, a second one (two
    ranks, no checkpoint there yet, so nothing else refuses it) stops on each rank with one line naming the first's
    process; once the first is killed outright, a run with --resume takes the folder."""
    dataset = make_ds(**EVEN)
    ckpt = tmp_path / "ckpt"
    args = ["--dataset", str(dataset), "--batch-size", "6", *COMMON, "--checkpoint-dir", str(ckpt)]
    second: list[subprocess.CompletedProcess[str]] = []
    first_pid: list[int] = []

    def start_another_then_kill(first: subprocess.Popen[str]) -> None:
        first_pid.append(first.pid)  # (one process: the launcher is the run)
        second.append(_failed([*args, "--steps", "2"], procs=2))
        os.killpg(first.pid, signal.SIGKILL)

    status, log = _train_until_signalled(
        [*args, "--steps", "100000", "--save-every", "100000"], after="rank 0/1: steps", send=start_another_then_kill
    )
    assert status == -signal.SIGKILL, log[-30000:]
    refused = second[0]
    assert "exitcode  : 2" in refused.stderr, refused.stderr[-30000:]
    lines = [line for line in refused.stderr.splitlines() if "train.py: " in line]
    assert len(lines) == 2, refused.stderr[-30000:]  # (each rank's)
    for line in lines:
        assert f"train.py: --checkpoint-dir {ckpt} is in use by another run (pid {first_pid[0]} on " in line, line
        assert line.endswith("give another --checkpoint-dir (two runs saving there replace each other's checkpoints)")
    assert sorted(p.name for p in ckpt.iterdir()) == [".run.lock"]  # (the refused run removed nothing of the first's)
    resumed = _train([*args, "--steps", "2", "--resume"])
    assert "saved checkpoint" in resumed.stderr and (ckpt / "latest").read_text() == "step_00000002"
    assert not (ckpt / ".run.lock").exists()  # (a run that ends removes it)


# -- two processes --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_rank_run(make_ds: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """25 uninterrupted steps on 2 ranks: epochs 0 and 1 complete (10 steps each), half of epoch 2."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    return _run(tmp, make_ds(**EVEN), steps=25, batch=6, procs=2, extra=["--save-every", "10"])


def test_two_ranks_read_disjoint_episodes_and_stay_in_sync(two_rank_run: tuple[Path, Path, str]) -> None:
    ckpt, record_dir, _ = two_rank_run
    ranks = _records(record_dir, 2)
    for r in ranks:
        assert r["epochs"] == [0] * 10 + [1] * 10 + [2] * 5
        assert [len(step) for step in r["indices"]] == [6] * 25
        assert all(math.isfinite(x) for x in r["losses"])
    for epoch in (0, 1):
        sets = [
            {i for e, step in zip(r["epochs"], r["indices"], strict=True) if e == epoch for i in step} for r in ranks
        ]
        assert len(sets[0]) == len(sets[1]) == 60  # each index once per rank per epoch
        assert not sets[0] & sets[1]
        assert sets[0] | sets[1] == set(range(120))  # a complete epoch covers the dataset
        episodes = [{i // 20 for i in s} for s in sets]  # 20 frames per episode: index // 20 is the episode
        assert len(episodes[0]) == len(episodes[1]) == 3 and not episodes[0] & episodes[1]
    assert ranks[0]["indices"][:10] != ranks[0]["indices"][10:20]  # epochs are reshuffled
    # DDP averaged the gradients: both ranks end with the same weights despite different data.
    assert ranks[0]["param_abs_sums"] == pytest.approx(ranks[1]["param_abs_sums"], rel=1e-6)
    assert ranks[0]["losses"] != ranks[1]["losses"]
    saved = sorted(p.name for p in (ckpt / "step_00000010").iterdir())
    assert saved == ["state", "stream_rank0.json", "stream_rank1.json"]


def test_accelerate_launch_runs_the_same_two_ranks(
    two_rank_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """`accelerate launch --multi_gpu --num_processes 2` on CPUs: two ranks reading the same disjoint streams,
    with the same losses, as the torchrun run."""
    _, full_record_dir, _ = two_rank_run
    full = _records(full_record_dir, 2)
    _, record_dir, _ = _run(tmp_path, make_ds(**EVEN), steps=6, batch=6, procs=2, accelerate=True)
    for got, want in zip(_records(record_dir, 2), full, strict=True):
        assert got["indices"] == want["indices"][:6]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"][:6]), rtol=1e-5, atol=1e-6)


def test_two_ranks_resume_mid_epoch_is_exact(
    two_rank_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    full_ckpt, full_record_dir, _ = two_rank_run
    full = _records(full_record_dir, 2)
    dataset = make_ds(**EVEN)
    ckpt, record_dir, _ = _run(tmp_path, dataset, steps=13, batch=6, procs=2, extra=["--save-every", "10"])
    assert (ckpt / "latest").read_text() == "step_00000013"
    _, _, log = _run(tmp_path, dataset, steps=25, batch=6, procs=2, extra=["--resume"])
    resumed = _records(record_dir, 2)
    assert log.count("resumed from") == 2
    for rank in range(2):
        assert resumed[rank]["first_step"] == 14
        assert resumed[rank]["indices"] == full[rank]["indices"][13:]
        assert resumed[rank]["epochs"] == full[rank]["epochs"][13:]
    _assert_same_model(_model(ckpt, 25), _model(full_ckpt, 25))


def test_a_step_saved_again_on_fewer_ranks_keeps_no_file_of_the_earlier_save(
    two_rank_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """A 2-rank run saved step 20 and stopped before ``latest`` named it (``latest``: step 10); a 1-rank resume
    saved step 20 again. That save wrote over the folder in place: the stopped run's ``random_states_1.pkl``
    and ``stream_rank1.json`` stayed beside the new files, so a 2-rank resume from it gave rank 1 the stopped
    run's RNG state. A killed save's staging folder is cleared too."""
    full_ckpt, _, _ = two_rank_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(full_ckpt, ckpt)
    shutil.rmtree(ckpt / "step_00000025")
    (ckpt / "latest").write_text("step_00000010")
    assert (ckpt / "step_00000020" / "state" / "random_states_1.pkl").is_file()
    killed = ckpt / ".step_00000020.partial" / "state"  # a save killed half-way
    killed.mkdir(parents=True)
    (killed / "random_states_1.pkl").write_bytes(b"half")
    args = [*COMMON, "--dataset", str(make_ds(**EVEN)), "--steps", "20", "--batch-size", "6"]
    _train([*args, "--checkpoint-dir", str(ckpt), "--resume"])
    saved = ckpt / "step_00000020"
    assert (ckpt / "latest").read_text() == saved.name
    assert sorted(p.name for p in saved.iterdir()) == ["state", "stream_rank0.json"]
    assert not list(saved.glob("state/random_states_*[!0].pkl"))
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000010", "step_00000020"]


# -- preemption -----------------------------------------------------------------------------------------------
def _preempted_at(log: str, checkpoint_dir: Path, signal_name: str) -> int:
    """The step a preempted run stopped at, from its line saying how to go on, which names its checkpoint (train.py's
    and lerobot_policy.py's alike)."""
    match = re.search(
        rf"{signal_name}: every rank stopped at step (\d+) and saved (\S+): to continue from it, run the same command "
        r"with --resume \(exit status 75\)",
        log,
    )
    assert match, log[-30000:]
    step = int(match.group(1))
    assert match.group(2) == str(checkpoint_dir / f"step_{step:08d}")
    assert (checkpoint_dir / "latest").read_text() == f"step_{step:08d}"
    return step


def test_sigterm_saves_at_the_next_step_and_a_resumed_run_is_exact(
    single_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGTERM to the process group (as torchrun and SLURM send it: the DALI worker ends too) during training:
    train.py checkpoints at the next step boundary and exits with status 75; --resume then gives the uninterrupted
    run's samples, losses and weights. It was killed there, having saved nothing since its last --save-every."""
    full_ckpt, full_record_dir, _ = single_run
    (full,) = _records(full_record_dir, 1)
    ckpt, record_dir = tmp_path / "ckpt", tmp_path / "record"
    args = [*COMMON, "--dataset", str(make_ds(**UNEVEN)), "--steps", "24", "--batch-size", "8"]
    args += ["--checkpoint-dir", str(ckpt), "--record", str(record_dir)]
    status, log = _train_until_signalled(
        [*args, "--log-every", "1"], after="step 3 epoch", send=lambda p: os.killpg(p.pid, signal.SIGTERM)
    )
    assert status == 75, log[-30000:]
    step = _preempted_at(log, ckpt, "SIGTERM")
    assert 3 <= step < 24
    assert "trained steps" not in log  # (the preemption's line says what happened: no closing line of a whole run)
    (first,) = _records(record_dir, 1)
    assert first["indices"] == full["indices"][:step]
    _, _, log = _run(tmp_path, make_ds(**UNEVEN), steps=24, batch=8, procs=1, extra=["--resume"])
    (resumed,) = _records(record_dir, 1)
    assert "resumed from" in log and resumed["first_step"] == step + 1
    assert resumed["indices"] == full["indices"][step:]
    torch.testing.assert_close(
        torch.tensor(resumed["losses"]), torch.tensor(full["losses"][step:]), rtol=1e-5, atol=1e-6
    )
    _assert_same_model(_model(ckpt, 24), _model(full_ckpt, 24))


def test_a_preemption_signal_without_a_checkpoint_dir_says_nothing_is_saved(
    make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGUSR1 (SLURM's --signal) to the trainer alone, its DALI worker left alive: it stops at the next step and
    exits with 128 + the signal, as the signal itself would have ended it (it did, with nothing logged)."""
    args = [*COMMON, "--dataset", str(make_ds(**UNEVEN)), "--steps", "24", "--batch-size", "8", "--log-every", "1"]
    status, log = _train_until_signalled(args, after="step 3 epoch", send=lambda p: p.send_signal(signal.SIGUSR1))
    assert status == 128 + signal.SIGUSR1, log[-30000:]
    assert re.search(
        r"SIGUSR1: every rank stopped at step \d+; no checkpoint can be saved without --checkpoint-dir: a new run "
        r"starts from step 0 \(exit status 138\)",
        log,
    ), log[-30000:]
    assert "Traceback" not in log


def test_ctrl_c_says_which_checkpoint_a_resume_continues_from_in_one_line(
    make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it: the DALI worker gets it too) mid-epoch saves
    nothing, as before; each rank says in one line which checkpoint ``--resume`` continues from and which steps it
    trains again, and exits with 130 (128 + SIGINT). It was a KeyboardInterrupt traceback per rank (through DDP and
    gloo's 'Connection closed by peer' under torchrun: 138 lines), naming no checkpoint."""
    ckpt = tmp_path / "ckpt"
    args = [*COMMON, "--dataset", str(make_ds(**UNEVEN)), "--steps", "24", "--batch-size", "8", "--log-every", "1"]
    args += ["--checkpoint-dir", str(ckpt), "--save-every", "2"]
    status, log = _train_until_signalled(args, after="step 5 epoch", send=lambda p: os.killpg(p.pid, signal.SIGINT))
    assert status == 130, log[-30000:]
    match = re.search(
        r"train\.py: interrupted \(Ctrl-C\) (during|after) step (\d+); its last checkpoint is (\S+) \((.*?)\): to "
        r"continue from it, run the same command with --resume \(exit status 130\)",
        log,
    )
    assert match, log[-30000:]
    saved = int((ckpt / "latest").read_text().removeprefix("step_"))
    trained = int(match.group(2)) - (match.group(1) == "during")  # (after step N: in its save, or after the last)
    assert match.group(3) == str(ckpt / f"step_{saved:08d}") and 4 <= saved <= trained <= 24
    assert match.group(4) == (
        f"steps {saved + 1}..{trained} since are trained again" if trained > saved else "no step since"
    )
    assert "Traceback" not in log


def test_ctrl_c_without_a_checkpoint_says_a_new_run_starts_from_step_0() -> None:
    from pipelines.interrupts import Interrupted

    assert str(Interrupted(3, None, None)) == (
        "interrupted (Ctrl-C) during step 4; nothing is saved without --checkpoint-dir: a new run starts from step 0 "
        "(exit status 130)"
    )
    assert str(Interrupted(3, None, Path("ckpt"))) == (
        "interrupted (Ctrl-C) during step 4; no checkpoint was saved in ckpt yet: the same command starts again from "
        "step 0 (exit status 130)"
    )
    assert isinstance(
        Interrupted(3, 2, None), KeyboardInterrupt
    )  # (a caller of train() that catches Ctrl-C still does)


def test_ctrl_c_in_a_save_counts_the_step_saved_among_those_trained_again(tmp_path: Path, monkeypatch) -> None:
    """A Ctrl-C in the checkpoint's save after step 6 (the last one saved: step 4) said "during step 6" and "steps 5..5
    since are trained again": the loop knew the steps trained as of the batch it last took, so the step being saved,
    trained but lost with its save, was left out (with --save-every 1: "no step since", for the step being saved)."""
    from types import SimpleNamespace

    from pipelines.interrupts import Interrupted
    from pipelines.preemption import PreemptibleLoop

    def interrupted_save(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("pipelines.preemption.save_checkpoint", interrupted_save)
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000004").mkdir(parents=True)
    (ckpt / "latest").write_text("step_00000004")
    iterator = SimpleNamespace(world_size=1, rank=0, state_dict=lambda: {})
    for save_every, trained in [(2, 6), (1, 5)]:
        loop = PreemptibleLoop(SimpleNamespace(is_main_process=True), iterator, step=4, checkpoint_dir=ckpt, data={})
        with pytest.raises(Interrupted) as info, loop:
            for step in range(4, trained):
                assert loop.next_batch(iter([({}, 0.0)]), step) == ({}, 0.0)
                loop.save_if_due(step + 1, steps=24, save_every=save_every if step + 1 == trained else 0)
        assert str(info.value) == (
            f"interrupted (Ctrl-C) after step {trained}; its last checkpoint is {ckpt / 'step_00000004'} (steps "
            f"5..{trained} since are trained again): to continue from it, run the same command with --resume (exit "
            "status 130)"
        )


def test_ctrl_c_before_or_after_the_training_loop_is_one_line_and_status_130(
    make_ds: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Ctrl-C while setting up (opening the datasets, building the iterator, the resume's last steps) or while
    closing the run went through main() as a KeyboardInterrupt: a traceback, the process killed by SIGINT (status -2,
    130 under a launcher). It is one line now, as in the loop, saying nothing was trained where so and which
    checkpoint a resume continues from, and main() returns 130."""
    from pipelines import train as train_module

    def ctrl_c(*args: object, **kwargs: object) -> Any:
        raise KeyboardInterrupt

    def interrupted(argv: list[str]) -> str:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            try:
                status = train_module.main(argv)
            except KeyboardInterrupt as e:  # (not left to pytest, which would take it for its own Ctrl-C)
                pytest.fail(f"the Ctrl-C went through main() ({type(e).__name__}: {e}): a traceback")
        (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert status == 130 and error.exc_info is None
        return error.getMessage()

    ckpt = tmp_path / "ckpt"
    args = [*COMMON, "--dataset", str(make_ds(**UNEVEN)), "--steps", "2", "--batch-size", "8", "--num-workers", "0"]
    setting_up = (
        "train.py: interrupted (Ctrl-C) while setting up (datasets, iterator, model, resume): nothing was trained"
    )
    with monkeypatch.context() as patch:
        patch.setattr("pipelines.train.open_readers", ctrl_c)
        assert interrupted(args) == (
            f"{setting_up}; nothing is saved without --checkpoint-dir: a new run starts from step 0 (exit status 130)"
        )
    with monkeypatch.context() as patch:
        patch.setattr("pipelines.train.build_iterator", ctrl_c)
        assert interrupted([*args, "--checkpoint-dir", str(ckpt)]) == (
            f"{setting_up}; no checkpoint was saved in {ckpt} yet: the same command starts again from step 0 (exit "
            "status 130)"
        )
    make_accelerator = train_module.make_accelerator

    def interrupted_at_its_end(*args: object, **kwargs: object) -> Any:
        accelerator = make_accelerator(*args, **kwargs)  # type: ignore[arg-type]
        accelerator.end_training = ctrl_c
        return accelerator

    resumed = (
        f"its last checkpoint is {ckpt / 'step_00000002'} (no step since): to continue from it, run the same command "
        "with --resume (exit status 130)"
    )
    with monkeypatch.context() as patch:  # (both steps trained and saved)
        patch.setattr("pipelines.train.make_accelerator", interrupted_at_its_end)
        assert (
            interrupted([*args, "--checkpoint-dir", str(ckpt)])
            == f"train.py: interrupted (Ctrl-C) after step 2; {resumed}"
        )
    with monkeypatch.context() as patch:  # (the loop's preemption notice: on several ranks, a gloo group's collective)
        patch.setattr("pipelines.preemption.PreemptionNotice", ctrl_c)
        assert (
            interrupted([*args, "--steps", "4", "--checkpoint-dir", str(ckpt), "--resume"])
            == f"{setting_up}; {resumed}"
        )


#: Sends this process SIGINT when the module named in $SIGINT_AT_IMPORT is first imported: a Ctrl-C at a known point
#: of a script's start-up (as a sitecustomize, which Python imports before the script runs); with $SIGINT_AT_EXIT, a
#: second one in the interpreter's exit.
_SIGINT_AT_IMPORT = """
import atexit, os, signal, sys

if os.environ.get("SIGINT_AT_EXIT"):  # (registered first: the last exit callback, after DALI's, torch's)
    atexit.register(os.kill, os.getpid(), signal.SIGINT)

class SigintAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SIGINT_AT_IMPORT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintAt())
"""

_WHILE_STARTING = (
    "interrupted (Ctrl-C) while starting (imports, flags); nothing was read, written or trained: the same command "
    "starts the run (exit status 130)"
)


@pytest.mark.parametrize(
    ("script", "module", "twice"),
    [
        ("train.py", "torch", False), ("train.py", "pipelines.recipes", False), ("lerobot_policy.py", "torch", False),
        ("train.py", "torch", True), ("lerobot_policy.py", "torch", True),
    ],
)  # fmt: skip
def test_ctrl_c_while_a_script_imports_is_one_line_and_status_130(
    script: str, module: str, twice: bool, tmp_path: Path
) -> None:
    """A Ctrl-C in the scripts' imports (torch's, LeRobot's: seconds) was Python's traceback, the process killed by
    SIGINT (status -2); now one line and 130, as in every later phase (train.py imports pipelines.recipes as it checks
    its flags). A second Ctrl-C in the exit after that line (``twice``) was a KeyboardInterrupt traceback from an exit
    callback (DALI's _unload_dali, measured: 1 of 10 double Ctrl-Cs; 7 more were status -2): it ends the process at
    once, 130, the one line alone."""
    (tmp_path / "sitecustomize.py").write_text(_SIGINT_AT_IMPORT)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "SIGINT_AT_IMPORT": module}
    env.update({"SIGINT_AT_EXIT": "1"} if twice else {})
    argv = [str(REPO / "pipelines" / script), "--dataset", str(tmp_path / "none"), "--steps", "1", "--device", "cpu"]
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    logger = {"train.py": "pipelines.train", "lerobot_policy.py": "lerobot_dali.pipelines.lerobot_policy"}[script]
    assert result.returncode == 130, result.stderr
    assert re.fullmatch(
        rf"\d\d:\d\d:\d\d rank0 {re.escape(logger)}: {script}: {re.escape(_WHILE_STARTING)}\n", result.stderr
    )


@pytest.mark.parametrize("script", ["train", "lerobot_policy"])
def test_ctrl_c_while_checking_the_flags_is_one_line_and_status_130(
    script: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Ctrl-C while main() checked the flags and files (--recipe, --augment, --checkpoint-dir) went through it as a
    KeyboardInterrupt (a traceback); main() returns 130 after one line now."""
    import importlib

    module = importlib.import_module(f"pipelines.{script}")

    def ctrl_c(*args: object, **kwargs: object) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "parse_args", ctrl_c)
    caplog.set_level(logging.ERROR)
    try:
        status = module.main(["--dataset", "d", "--device", "cpu"])
    except KeyboardInterrupt as e:  # (not left to pytest, which would take it for its own Ctrl-C)
        pytest.fail(f"the Ctrl-C went through main() ({type(e).__name__}: {e}): a traceback")
    assert status == 130
    assert [r.getMessage() for r in caplog.records] == [f"{script}.py: {_WHILE_STARTING}"]


#: A script's module for run_main whose main() returns its argument's status (or raises it, as argparse's refusal of
#: a flag does: SystemExit(2)) and whose interpreter exit takes long (as a training script's does: seconds), saying
#: when it has begun.
_SLOW_EXIT_SCRIPT = """
import atexit, pathlib, sys, time

def main():
    atexit.register(slow_exit)
    if sys.argv[3] == "raised":
        sys.exit(int(sys.argv[2]))
    return int(sys.argv[2])

def slow_exit():
    pathlib.Path(sys.argv[1]).write_text("exiting")
    time.sleep(2)
"""


@pytest.mark.parametrize(
    ("status", "signum", "how"),
    [(0, signal.SIGTERM, "returned"), (75, signal.SIGUSR1, "returned"), (2, signal.SIGTERM, "returned"),
     (2, signal.SIGTERM, "raised")],
)  # fmt: skip
def test_a_preemption_signal_in_the_interpreters_exit_keeps_the_scripts_status(
    status: int, signum: int, how: str, tmp_path: Path
) -> None:
    """A run that had trained, saved and closed took seconds more to exit (3.1 s after main() returned, on 2
    cores), and a SIGTERM then (a job's time limit as it ended, walked by hand) killed it: status 143,
    nothing said, a finished run read as a killed one (a preempted run's 75 too). run_main ignores the signals once
    main() has returned: the process ends with its status. (Ignored: a handler would be set back to the default by
    Python's finalisation; one ended a preempted rank that torchrun sent SIGTERM to, -15 for 75.) Likewise once main()
    has raised its status (argparse's refusal of a flag, SystemExit(2)): under torchrun the rank that said it later
    got torchrun's SIGTERM as it exited, the other rank's 2 having ended the job, and its summary read -15 for it."""
    (tmp_path / "slow_exit_script.py").write_text(_SLOW_EXIT_SCRIPT)
    marker = tmp_path / "exiting"
    code = "from pipelines.interrupts import run_main; run_main('slow_exit_script', 'script.py', 'script')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    process = subprocess.Popen([sys.executable, "-c", code, str(marker), str(status), how], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), process.poll()
        process.send_signal(signum)
        assert process.wait(timeout=30) == status
    finally:
        process.kill()


#: A script's module for run_main whose main() returns its argument's status and whose exit takes long in an exit
#: callback (Python's) and after the interpreter's finalisation (C's exit handlers, as C++'s static destructors of torch
#: and DALI: here one reading standard input), saying when each has begun.
_LATE_EXIT_SCRIPT = """
import atexit, ctypes, pathlib, sys, time

def main():
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit(ctypes.cast(libc.getchar, ctypes.c_void_p), None, None)  # (waits for standard input's end)
    atexit.register(pathlib.Path(sys.argv[1]).write_text, "finalising")  # (the first registered runs last)
    atexit.register(slow_exit)
    return int(sys.argv[2])

def slow_exit():
    pathlib.Path(sys.argv[1]).write_text("exiting")
    time.sleep(2)
"""


@pytest.mark.parametrize("status", [0, 75])
@pytest.mark.parametrize("when", ["exiting", "finalising"])
def test_a_ctrl_c_in_the_interpreters_exit_keeps_the_scripts_status(status: int, when: str, tmp_path: Path) -> None:
    """A Ctrl-C once main() had returned (a run that had trained and saved, or a preempted one) ended the process with
    130 in an exit callback (run_main's handler, whatever the status) and with -2 after the interpreter's finalisation
    (its handler set back to the default, as C++'s static destructors ran): a finished run read as an interrupted or a
    killed one. It keeps the run's status now: at once in a callback, at the end after it."""
    (tmp_path / "late_exit_script.py").write_text(_LATE_EXIT_SCRIPT)
    marker = tmp_path / "exiting"
    code = "from pipelines.interrupts import run_main; run_main('late_exit_script', 'script.py', 'script')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(marker), str(status)], stdin=subprocess.PIPE, env=env, cwd=REPO
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text() == when) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == when, process.poll()
        time.sleep(0.5 if when == "finalising" else 0)  # (past the last exit callback, into the finalisation)
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=30) == status
    finally:
        process.kill()


def test_a_run_whose_closing_fails_gives_the_signals_back() -> None:
    """Saving the trained policy or ``end_training`` raising (a full disk, a tracker's upload) left the preemption
    handlers installed in a process that goes on (a notebook, a sweep calling ``train`` in a loop): its SIGTERM was
    then noted by a loop long gone and ignored. A run that closes cleanly gives them back too; a preempted one
    raises :class:`Preempted` and keeps them (``exit_status`` ignores the signals from there on)."""
    from types import SimpleNamespace

    from pipelines.preemption import Preempted, PreemptibleLoop

    iterator = SimpleNamespace(world_size=1, rank=0, state_dict=lambda: {})
    accelerator = SimpleNamespace(is_main_process=True)
    before = signal.getsignal(signal.SIGTERM)
    loop = PreemptibleLoop(accelerator, iterator, step=0, checkpoint_dir=None, data={})
    with loop:
        assert signal.getsignal(signal.SIGTERM) != before
    with pytest.raises(OSError, match="disk full"), loop.finishing(0):
        raise OSError("disk full")
    assert signal.getsignal(signal.SIGTERM) == before
    with loop:
        pass
    with loop.finishing(0):
        pass
    assert signal.getsignal(signal.SIGTERM) == before
    with loop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert loop.next_batch(iter([({}, 0.0)]), 0) is None
    try:
        with pytest.raises(Preempted), loop.finishing(0):
            pass
        assert signal.getsignal(signal.SIGTERM) != before
    finally:
        loop.notice.uninstall()


_GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:33172. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error."
)


def test_a_data_error_in_training_and_a_peer_ranks_end_are_one_line_and_status_1(caplog) -> None:
    """Once training has started, a batch's data error (here chained, as a worker's comes back through DALI) was a
    traceback saying its message 2-4 times, and the rank waiting for it in a collective gave gloo's 34-line traceback
    ('Connection closed by peer'), then died of torchrun's SIGTERM (-15) as Python exited. Each is one line now, exit
    status 1, the traceback at DEBUG, and the waiting rank ignores the SIGTERM from there on. Any other error, gloo's
    timeout too, is the rank's own and keeps its traceback."""
    from lerobot_dali.errors import VideoDecodeError
    from pipelines.train import exit_status

    def failing(error: Exception, cause: Exception | None = None) -> Callable[[], None]:
        def run() -> None:
            raise error from cause

        return run

    log = logging.getLogger("pipelines.train")
    message = "camera 'cam0', batch of episodes [1, 3]: /d/videos/episode_000003.mp4: the VP9 stream changes size"
    data_error = failing(VideoDecodeError(message), RuntimeError(message))
    with caplog.at_level(logging.DEBUG, logger="pipelines.train"):
        assert exit_status(data_error, "train.py", log) == 1
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, f"train.py: VideoDecodeError: {message} (its traceback: LEROBOT_DALI_LOG_LEVEL=DEBUG)"),
        (logging.DEBUG, "train.py: the error's traceback and causes"),
    ]
    assert caplog.records[1].exc_info is not None and isinstance(caplog.records[1].exc_info[1].__cause__, RuntimeError)
    caplog.clear()
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            assert exit_status(failing(RuntimeError(_GLOO_PEER_GONE)), "lerobot_policy.py", log) == 1
        assert [r.getMessage() for r in caplog.records] == [
            "lerobot_policy.py: another rank's process ended, and this rank's collective with it failed (gloo: "
            "Connection closed by peer [127.0.0.1]:33172): the error is that rank's, said above in its own lines "
            "(torchrun's summary names its exit code); this rank stops too (exit status 1)"
        ]
        assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    timeout = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv"
    for own in (RuntimeError(timeout), RuntimeError("Connection closed by peer, says a bug"), KeyError("a bug")):
        with pytest.raises(type(own)):
            exit_status(failing(own), "train.py", log)


@pytest.mark.parametrize(
    ("value", "level", "warned"),
    [("", "INFO", False), ("debug", "DEBUG", False), (" WARNING ", "WARNING", False), ("loud", "INFO", True)],
)
def test_the_scripts_log_at_the_level_lerobot_dali_log_level_names(value: str, level: str, warned: bool) -> None:
    """The one-line data error points at LEROBOT_DALI_LOG_LEVEL=DEBUG for its traceback: the scripts' logging takes
    that level (any case), INFO where it is unset, and says so where it names none."""
    code = (
        "import logging; from pipelines.interrupts import configure_logging; configure_logging(); "
        "print(logging.getLevelName(logging.getLogger().level))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "LEROBOT_DALI_LOG_LEVEL": value}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stdout == f"{level}\n"
    said = "LEROBOT_DALI_LOG_LEVEL=loud is not a log level (one of DEBUG, INFO, WARNING, ERROR): logging at INFO"
    assert (said in result.stderr) is warned


def test_a_collective_failed_by_a_peers_end_keeps_the_preemption_signals_noted() -> None:
    """torchrun sends SIGTERM to the ranks left once one has exited: the waiting rank, its collective failed, got it
    as it closed its iterator, the loop's handlers gone, and died of it (-15) before saying why it stopped. The loop
    keeps noting the signals for such an error (exit_status then ignores them); for any other it gives them back."""
    from types import SimpleNamespace

    from pipelines.preemption import PreemptibleLoop

    iterator = SimpleNamespace(world_size=1, rank=0, state_dict=lambda: {})
    before = signal.getsignal(signal.SIGTERM)
    loop = PreemptibleLoop(SimpleNamespace(is_main_process=True), iterator, step=0, checkpoint_dir=None, data={})
    try:
        with pytest.raises(RuntimeError, match="Connection closed by peer"), loop:
            raise RuntimeError(_GLOO_PEER_GONE)
        assert signal.getsignal(signal.SIGTERM) == loop.notice._note  # (noted, not the default that ends the process)
    finally:
        loop.notice.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(RuntimeError, match="a bug"), loop:
        raise RuntimeError("a bug")
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_batch_failed_by_torchruns_sigterm_is_said_only_once_the_ranks_agree_to_stop(caplog) -> None:
    """torchrun's SIGTERM (to a rank's process group: its DALI workers too) reaches the rank left once another has
    ended; where it read its batch then, the read failed and the rank said 'reading the batch of step 4 failed after
    SIGTERM (...); the resumed run reads it' before its collective found the other rank gone: no checkpoint is saved
    and no run resumes. It is said once the ranks agree to stop, as a preemption does; the collective's failure (one
    line, exit_status's) is all that is said otherwise."""
    from types import SimpleNamespace

    from pipelines.preemption import PreemptibleLoop

    def failed_read() -> Iterator[tuple[dict[str, Any], float]]:
        os.kill(os.getpid(), signal.SIGTERM)  # (noted by the loop's handler)
        raise RuntimeError("Worker data receiving interrupted. The worker process ended")
        yield {}, 0.0

    def peer_gone() -> int:
        raise RuntimeError(_GLOO_PEER_GONE)

    iterator = SimpleNamespace(world_size=1, rank=1, state_dict=lambda: {})
    for agreed, said in ((peer_gone, []), (None, ["rank 1: reading the batch of step 4 failed after SIGTERM "
                                                    "(RuntimeError: Worker data receiving interrupted); the resumed "
                                                    "run reads it"])):  # fmt: skip
        caplog.clear()
        loop = PreemptibleLoop(SimpleNamespace(is_main_process=True), iterator, step=3, checkpoint_dir=None, data={})
        if agreed is not None:
            loop.notice.agreed = agreed  # type: ignore[method-assign]
        try:
            with caplog.at_level(logging.WARNING, logger="pipelines.train"), loop:
                if agreed is None:
                    assert loop.next_batch(failed_read(), 3) is None and loop.stopped_by == signal.SIGTERM
                else:
                    with pytest.raises(RuntimeError, match="Connection closed by peer"):
                        loop.next_batch(failed_read(), 3)
        finally:
            loop.notice.uninstall()
        assert [r.getMessage() for r in caplog.records] == said


def test_a_save_on_a_full_filesystem_is_one_line_naming_the_space_and_the_step_to_resume_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save on a full disk ended the run in torch's traceback, ``RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos 704 vs 598`` (no errno; raised from ``basic_ios::clear``, as torch.save
    to /dev/full raised it once here: it does not always, so the test raises torch's words itself). Now it
    is :class:`CheckpointNotWritten` (a RunRefused: one line, status 2) naming the free space and the checkpoint a
    resume continues from, and the half-written save is removed; where the filesystem has room, torch's error stands.
    An ENOSPC of the stream file's own write is said whatever the free space."""
    import errno
    from types import SimpleNamespace

    from pipelines import checkpoints
    from pipelines.checkpoints import CheckpointNotWritten, save_checkpoint

    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000004").mkdir(parents=True)
    (ckpt / "step_00000004" / "stream_rank0.json").write_text("{}")
    (ckpt / "latest").write_text("step_00000004")

    def save_state(folder: str) -> None:  # (a model file cut short, then torch's error)
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.bin").write_bytes(b"PK" * 299)
        try:
            raise RuntimeError("basic_ios::clear: iostream error")
        except RuntimeError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None

    accelerator = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None, save_state=save_state)
    iterator = SimpleNamespace(world_size=1, rank=0, state_dict=lambda: {})
    with pytest.raises(RuntimeError, match="unexpected pos"):  # (room left: not taken for a full filesystem)
        save_checkpoint(accelerator, ckpt, 6, iterator)
    monkeypatch.setattr(checkpoints, "_free_bytes", lambda folder: 0)
    with pytest.raises(CheckpointNotWritten) as said:
        save_checkpoint(accelerator, ckpt, 6, iterator)
    assert re.fullmatch(
        rf"the checkpoint of step 6 could not be written into {re.escape(str(ckpt))} \(RuntimeError: \[enforce fail "
        r"at inline_container\.cc:\d+\] \. unexpected pos \d+ vs \d+\): its filesystem has 0\.0 MiB free\. Free "
        r"space there \(--keep-checkpoints K keeps only the K newest checkpoints\) and run the same command with "
        r"--resume: it continues from step 4",
        str(said.value),
    ), said.value
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000004"]  # (the save's files gone)

    def no_room(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(checkpoints, "_free_bytes", lambda folder: 10 * 2**30)
    monkeypatch.setattr(checkpoints, "write_whole", no_room)
    accelerator.save_state = lambda folder: Path(folder).mkdir(parents=True)
    with pytest.raises(CheckpointNotWritten, match=r"\(OSError: \[Errno 28\] No space left on device: .*10240\.0 MiB"):
        save_checkpoint(accelerator, ckpt, 6, iterator)
    # Two ranks: the one that wrote its files says what another found (it waited in the save's barrier, then died in
    # a traceback once that rank had exited); accelerate's sum over the ranks here is the other's 1.
    from lerobot_dali.cache_dirs import write_whole

    monkeypatch.setattr(checkpoints, "write_whole", write_whole)  # (this rank's writes go through)
    accelerator = SimpleNamespace(
        is_main_process=False, wait_for_everyone=lambda: None, save_state=lambda folder: None, num_processes=2,
        device=torch.device("cpu"), reduce=lambda flag, reduction: flag + 1,
    )  # fmt: skip
    with pytest.raises(
        CheckpointNotWritten,
        match=r"^the checkpoint of step 6 could not be written into .* \(another "
        r"rank found no space to write its files\): its filesystem has 10240\.0 MiB free\. .* step 4$",
    ):
        save_checkpoint(accelerator, ckpt, 6, SimpleNamespace(world_size=2, rank=1, state_dict=lambda: {}))


def test_a_signal_to_one_rank_or_to_torchrun_stops_both_ranks_at_one_step_and_resumes_exactly(
    two_rank_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGUSR1 to rank 1 alone: both ranks checkpoint the same step (rank 0 had no signal: without agreeing, it
    would wait in the gradients' all-reduce or the save's barrier) and exit with status 75. The resumed run is
    then sent SIGTERM through torchrun (which sends it on to each rank's process group, DALI workers included), as
    Kubernetes stops a pod; a last resume ends with the uninterrupted run's samples and weights."""
    full_ckpt, full_record_dir, _ = two_rank_run
    full = _records(full_record_dir, 2)
    ckpt, record_dir = tmp_path / "ckpt", tmp_path / "record"
    args = [*COMMON, "--dataset", str(make_ds(**EVEN)), "--steps", "25", "--batch-size", "6", "--log-every", "1"]
    args += ["--checkpoint-dir", str(ckpt), "--record", str(record_dir)]
    status, log = _train_until_signalled(
        args, procs=2, after="step 3 epoch", send=lambda p: os.kill(_rank_pid(p, 1), signal.SIGUSR1)
    )
    assert status != 0 and log.count("exitcode  : 75") == 2, log[-30000:]  # (torchrun: 1, each rank's in its summary)
    first = _preempted_at(log, ckpt, "SIGUSR1")
    assert 3 <= first < 20
    saved = sorted(p.name for p in (ckpt / f"step_{first:08d}").iterdir())
    assert saved == ["state", "stream_rank0.json", "stream_rank1.json"]
    for got, want in zip(_records(record_dir, 2), full, strict=True):
        assert got["indices"] == want["indices"][:first]
    status, log = _train_until_signalled(
        [*args, "--resume"], procs=2, after=f"step {first + 1} epoch", send=lambda p: p.send_signal(signal.SIGTERM)
    )
    assert status != 0 and "Unable to shutdown process" not in log, log[-30000:]  # (torchrun's SIGKILL, 30 s on)
    second = _preempted_at(log, ckpt, "SIGTERM")
    assert first < second < 25
    for got, want in zip(_records(record_dir, 2), full, strict=True):
        assert got["first_step"] == first + 1 and got["indices"] == want["indices"][first:second]
    _, _, log = _run(tmp_path, make_ds(**EVEN), steps=25, batch=6, procs=2, extra=["--resume"])
    for got, want in zip(_records(record_dir, 2), full, strict=True):
        assert got["first_step"] == second + 1
        assert got["indices"] == want["indices"][second:] and got["epochs"] == want["epochs"][second:]
        torch.testing.assert_close(
            torch.tensor(got["losses"]), torch.tensor(want["losses"][second:]), rtol=1e-5, atol=1e-6
        )
    _assert_same_model(_model(ckpt, 25), _model(full_ckpt, 25))


def test_a_data_error_on_one_rank_mid_epoch_is_one_line_and_the_other_rank_says_it_stopped_for_it(
    make_ds: Callable[..., Path], copy_ds, tmp_path: Path
) -> None:
    """Rows of episode 5 (one rank's) jump 1 s ahead mid-episode, found as a batch reads them: that rank's error was
    a traceback saying its message 3 times (the worker's, DALI's hand-over, the batch's), and the other rank, waiting
    in a collective, gave gloo's 34-line traceback ('Connection closed by peer'), then was killed by torchrun's
    SIGTERM (exit code -15 in its summary). Now each rank says one line, the failing one its error naming dataset,
    episode and camera, the other that another rank ended; both exit with 1, as does torchrun."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = copy_ds(make_ds(**EVEN))
    for path in sorted((dataset / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        rows = np.flatnonzero(table["episode_index"].to_numpy() == 5)[10:]
        if len(rows):
            times = table["timestamp"].to_numpy().copy()
            times[rows] += 1.0
            table = table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(times))
            pq.write_table(table, path)
    args = [*COMMON, "--dataset", str(dataset), "--steps", "25", "--batch-size", "6"]
    result = _failed([*args, "--checkpoint-dir", str(tmp_path / "ckpt")], procs=2)
    assert result.returncode == 1, result.stderr[-30000:]
    assert "[rank" not in result.stderr and "lerobot_dali.errors" not in result.stderr, result.stderr[-30000:]
    said = {
        line.split()[1]: line.partition("train.py: ")[2] for line in result.stderr.splitlines() if "train.py: " in line
    }
    assert len(said) == 2, result.stderr[-30000:]
    failed = next(rank for rank, line in said.items() if line.startswith("FrameTimestampError: "))
    assert (
        said[failed].startswith(f"FrameTimestampError: dataset {dataset}, episode 5, camera observation.images.cam")
        and result.stderr.count("has no video frame within tolerance_s") == 1
    ), result.stderr[-30000:]
    (waited,) = set(said) - {failed}
    assert re.fullmatch(
        r"another rank's process ended, and this rank's collective with it failed \(gloo: Connection closed by peer "
        r"\[127\.0\.0\.1\]:\d+\): the error is that rank's, said above in its own lines \(torchrun's summary names its "
        r"exit code\); this rank stops too \(exit status 1\)",
        said[waited],
    ), result.stderr[-30000:]
    assert result.stderr.count("exitcode  : 1 ") == 2, result.stderr[-30000:]  # (torchrun's summary: no -15)


def test_two_ranks_train_on_a_mixture_and_resume_it_exactly(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    """Two datasets at 120 and 60 frames: batches of 6 hold 4 and 2 of them. 18 steps on 2 ranks cross the epoch
    (15 batches a rank), checkpointed at 10; a run resumed from that checkpoint continues exactly."""
    second = make_ds(**{**EVEN, "episodes": 4, "frames_per_episode": 15, "codec": "h264", "seed": 1})
    datasets = [make_ds(**EVEN), second]
    full_ckpt, full_dir, log = _run(
        tmp_path / "full", datasets, steps=18, batch=6, procs=2, extra=["--save-every", "10"]
    )
    assert "mixture of 2 datasets, per batch of 6: 4 of" in log
    full = _records(full_dir, 2)
    for r in full:
        assert r["dataset_indices"] == [[0, 0, 0, 0, 1, 1]] * 18
        assert r["epochs"] == [0] * 15 + [1] * 3
        assert all(math.isfinite(x) for x in r["losses"])
    # The first dataset (the anchor) in epoch 0: each of its frames once, on one rank.
    firsts = [{i for step in r["indices"][:15] for i in step[:4]} for r in full]
    assert len(firsts[0]) == len(firsts[1]) == 60 and firsts[0] | firsts[1] == set(range(120))
    assert full[0]["param_abs_sums"] == pytest.approx(full[1]["param_abs_sums"], rel=1e-6)
    ckpt = tmp_path / "resumed" / "ckpt"
    shutil.copytree(full_ckpt / "step_00000010", ckpt / "step_00000010")
    (ckpt / "latest").write_text("step_00000010")
    _, record_dir, log = _run(tmp_path / "resumed", datasets, steps=18, batch=6, procs=2, extra=["--resume"])
    assert log.count("resumed from") == 2
    for got, want in zip(_records(record_dir, 2), full, strict=True):
        assert got["first_step"] == 11
        assert got["indices"] == want["indices"][10:] and got["dataset_indices"] == want["dataset_indices"][10:]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"][10:]), rtol=1e-5, atol=1e-6)
    _assert_same_model(_model(ckpt, 18), _model(full_ckpt, 18))


def test_two_ranks_train_on_datasets_read_as_one(make_ds: Callable[..., Path], copy_ds, tmp_path: Path) -> None:
    """``--concat``: 120 and 60 frames read as one dataset of 180 (15 batches of 6 a rank): each rank's epoch holds
    both datasets' samples in no fixed share, every frame once across the ranks. The second's parquet timestamps
    are wall-clock (a clock 1.5% fast), so it finds its frames by frame_index, the first by its timestamps."""
    from tests.test_dataset_union import _retimed

    second = _retimed(
        copy_ds(make_ds(**{**EVEN, "episodes": 4, "frames_per_episode": 15, "seed": 1})), lambda t: t * 0.985
    )
    extra = ["--concat", "--timestamp-source", "parquet_timestamp", "frame_index"]
    _, record_dir, log = _run(tmp_path, [make_ds(**EVEN), second], steps=15, batch=6, procs=2, extra=extra)
    assert "union of" in log and "mixture" not in log
    assert f"{second}: rows find their frames with timestamp_source=frame_index" in log
    records = _records(record_dir, 2)
    seen = Counter()
    for r in records:
        assert all(math.isfinite(x) for x in r["losses"]) and r["epochs"] == [0] * 15
        for step, datasets in zip(r["indices"], r["dataset_indices"], strict=True):
            seen.update(zip(datasets, step, strict=True))
    assert sorted(seen) == [(0, i) for i in range(120)] + [(1, i) for i in range(60)] and set(seen.values()) == {1}
    assert any(len(set(d)) == 2 for r in records for d in r["dataset_indices"])  # batches mix them
    assert TrainOptions(dataset=("a", "b"), steps=1, rename_map={"x": "y"}, concat=True).concat
    assert TrainOptions(dataset=("a", "b"), steps=1, tolerance_s=(1e-4, 0.02), concat=True).concat
    with pytest.raises(ValueError, match="--concat .*--weights"):
        TrainOptions(dataset=("a", "b"), steps=1, weights=(1.0, 2.0), concat=True)
    with pytest.raises(ValueError, match="^--concat reads two datasets or more as one; got one$"):  # (no --weights)
        TrainOptions(dataset="a", steps=1, concat=True)


# -- recipes --------------------------------------------------------------------------------------------------
def _recipe_run(tmp: Path, dataset: Path, recipe: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    """3 steps of batch 4 with ``--recipe``; the run's record."""
    args = ["--device", "cpu", "--num-workers", "1", "--seed", "0", "--log-every", "1", "--lr", "3e-3"]
    args += ["--dataset", str(dataset), "--steps", "3", "--batch-size", "4", "--recipe", recipe]
    result = _train([*args, "--record", str(tmp / "record"), *extra])
    assert f"recipe {recipe}" in result.stderr and "step 3 epoch 0 loss" in result.stderr
    (record,) = _records(tmp / "record", 1)
    assert len(record["losses"]) == 3 and all(math.isfinite(x) for x in record["losses"])
    return record


def test_diffusion_recipe_trains_on_observation_and_action_windows(
    make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    record = _recipe_run(tmp_path, make_ds(**UNEVEN), "diffusion")
    shapes = record["batch_shapes"]
    cameras = sorted(k for k in shapes if k.startswith("observation.images.") and not k.endswith("_is_pad"))
    assert len(cameras) == 2
    for key in cameras:  # 2 observation steps per camera: (B, T, C, H, W)
        assert shapes[key] == [4, 2, 3, 64, 64]
    assert shapes["observation.state"] == [4, 2, 6] and shapes["observation.state_is_pad"] == [4, 2]
    assert shapes["action"] == [4, 16, 7] and shapes["action_is_pad"] == [4, 16]  # frames -1 .. 14
    # As LeRobot trains it, no sample is one of the last 7 frames of its episode (a third of them here).
    ends = np.cumsum(UNEVEN["frames_per_episode"])
    for index in (i for step in record["indices"] for i in step):
        assert index < ends[np.searchsorted(ends, index, side="right")] - 7, index


@pytest.mark.parametrize("grey", [False, True], ids=["rgb", "grey-cam1"])
def test_training_on_cameras_stored_as_images(
    make_ds: Callable[..., Path], copy_ds, tmp_path: Path, grey: bool
) -> None:
    """A grey image camera comes as one channel, and the policy's encoder for it takes one (it took three)."""
    dataset = make_ds(**{**UNEVEN, "image_cameras": True})
    if grey:
        from tests.test_image_cameras import _to_mode

        dataset = copy_ds(dataset)
        _to_mode(dataset, "observation.images.cam1", "L")
    args = ["--device", "cpu", "--num-workers", "1", "--seed", "0", "--log-every", "1", "--recipe", "diffusion"]
    args += ["--dataset", str(dataset), "--steps", "2", "--batch-size", "4", "--record", str(tmp_path / "rec")]
    stderr = _train(args).stderr
    # the policy encodes both image cameras, each a 2-step window
    assert "cameras ('observation.images.cam0', 'observation.images.cam1')" in stderr
    (record,) = _records(tmp_path / "rec", 1)
    shapes = record["batch_shapes"]
    assert shapes["observation.images.cam0"] == [4, 2, 3, 64, 64]
    assert shapes["observation.images.cam1"] == [4, 2, 1 if grey else 3, 64, 64]


def test_act_recipe_with_explicit_image_size_and_chunk(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    dataset = make_ds(**UNEVEN)
    record = _recipe_run(tmp_path / "recipe", dataset, "act")
    shapes = record["batch_shapes"]
    assert shapes["observation.state"] == [4, 6] and shapes["action"] == [4, 10, 7]  # 1 s at 10 fps
    assert [v for k, v in shapes.items() if k.startswith("observation.images.")] == [[4, 3, 64, 64]] * 2
    # explicit flags win over the recipe
    record = _recipe_run(tmp_path / "flags", dataset, "act", ["--chunk", "5", "--image-size", "32", "48"])
    shapes = record["batch_shapes"]
    assert shapes["action"] == [4, 5, 7]
    assert [v for k, v in shapes.items() if k.startswith("observation.images.")] == [[4, 3, 32, 48]] * 2


def test_episodes_flag_trains_on_those_episodes_only(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    # EVEN: 6 episodes of 20 frames, so dataset index // 20 is the episode. Episodes 1 and 4: 40 frames,
    # 10 steps of 4 = one full epoch, every frame once.
    args = [*COMMON, "--dataset", str(make_ds(**EVEN)), "--steps", "10", "--batch-size", "4", "--episodes", "4", "1"]
    _train([*args, "--record", str(tmp_path / "record")])
    (record,) = _records(tmp_path / "record", 1)
    consumed = [i for step in record["indices"] for i in step]
    assert sorted(consumed) == [*range(20, 40), *range(80, 100)]


def test_two_ranks_train_on_one_episode_dealt_in_pieces(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    # Episode 4 alone (indices 80-99) on two ranks: whole, it cannot give each rank one; in pieces of 10 frames
    # each rank trains on its half, 2 steps of 5 = one epoch.
    args = [*COMMON, "--dataset", str(make_ds(**EVEN)), "--steps", "2", "--batch-size", "5", "--episodes", "4"]
    _train([*args, "--episode-piece-frames", "10", "--record", str(tmp_path / "record")], procs=2)
    ranks = [{i for step in r["indices"] for i in step} for r in _records(tmp_path / "record", 2)]
    assert len(ranks[0]) == len(ranks[1]) == 10 and ranks[0] | ranks[1] == set(range(80, 100))


def test_cameras_flag_trains_gr00t_without_its_unrecorded_camera(tmp_path: Path) -> None:
    """gr00t's info.json declares a camera with no video files; --cameras leaves it out, as the open error says."""
    from tests.conftest import shared_dataset

    args = ["--device", "cpu", "--num-workers", "1", "--seed", "0", "--log-every", "1", "--chunk", "4"]
    args += ["--dataset", str(shared_dataset("gr00t_v20_h264")), "--steps", "2", "--batch-size", "4"]
    args += ["--cameras", "observation.images.ego_view", "--timestamp-source", "frame_index"]
    args += ["--record", str(tmp_path / "rec")]
    _train(args)
    (record,) = _records(tmp_path / "rec", 1)
    cameras = sorted(k for k in record["batch_shapes"] if k.startswith("observation.images."))
    assert cameras == ["observation.images.ego_view"] and record["batch_shapes"][cameras[0]] == [4, 3, 256, 256]


GR00T, EGO_VIEW, TOP = "gr00t_v20_h264", "observation.images.ego_view", "observation.images.top"


def test_concat_of_gr00t_reads_the_asked_camera_alone_and_its_frames(tmp_path: Path) -> None:
    """``--concat`` of GR00T with itself and ``--cameras`` its recorded camera: each dataset was opened with every
    camera its info.json declares before --cameras narrowed them, so the one never recorded ('egoview') refused the
    run (MissingDataFileError, advising the --cameras already given). Each is opened with the camera asked for
    now, and a batch's frames equal an independent PyAV decode of the frames its rows name."""
    from pipelines.train import open_readers
    from tests.conftest import shared_dataset
    from tests.video_fixtures import assert_frames_decoded, gr00t_video

    gr00t = shared_dataset(GR00T)
    argv = ["--dataset", str(gr00t), str(gr00t), "--concat", "--cameras", EGO_VIEW, "--timestamp-source", "frame_index"]
    options = parse_args([*argv, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--batch-size", "4"])
    (union,) = open_readers(options)
    assert [member.all_camera_keys for member in union.members] == [(EGO_VIEW,)] * 2
    plan = data_plan(options, fps=union.fps, camera_keys=[EGO_VIEW])
    iterator = build_iterator(union, plan, options, device="cpu", rank=0, world_size=1)
    try:
        batch = next(iter(iterator))
    finally:
        iterator.close()
    assert [k for k in batch if k.startswith("observation.images.")] == [EGO_VIEW]
    assert_frames_decoded(batch[EGO_VIEW], batch["episode_index"], batch["frame_index"], gr00t_video)


def test_cameras_are_each_dataset_s_own_keys_by_its_rename_map(tmp_path: Path) -> None:
    """A mixture of GR00T twice whose --rename-map names its recorded camera 'top' (and its unrecorded one 'wide'),
    trained with --cameras top: each dataset is opened with its own key for 'top' ('ego_view'), not 'egoview' (whose
    missing video refused the run), and the map's entry for the camera left out renames nothing."""
    from tests.conftest import shared_dataset

    gr00t = shared_dataset(GR00T)
    rename = json.dumps({EGO_VIEW: TOP, "observation.images.egoview": "observation.images.wide"})
    extra = ["--cameras", TOP, "--rename-map", rename, "--timestamp-source", "frame_index", "--num-workers", "0"]
    _, record_dir, _ = _run(tmp_path, [gr00t, gr00t], steps=2, batch=4, procs=1, extra=extra)
    (record,) = _records(record_dir, 1)
    assert len(record["losses"]) == 2 and all(math.isfinite(x) for x in record["losses"])
    cameras = {k: v for k, v in record["batch_shapes"].items() if k.startswith("observation.images.")}
    assert cameras == {TOP: [4, 3, 256, 256]}


def test_a_camera_a_dataset_lacks_after_its_rename_map_is_one_line_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--cameras top, which the first dataset's map gives its 'ego_view' and the second's (none) gives nothing: the
    second was opened with every declared camera and refused for the unrecorded one, advising the --cameras given.
    Now the run is refused naming that dataset, the camera and its cameras, with the rename that would fix it; and a
    map giving two of its cameras the name asked for is refused as the library refuses it, naming --rename-map (it
    named --cameras, which is not what to change)."""
    from pipelines import train as train_module
    from tests.conftest import shared_dataset

    gr00t = str(shared_dataset(GR00T))
    argv = ["--dataset", gr00t, gr00t, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--batch-size", "4"]
    argv += ["--cameras", TOP, "--rename-map", json.dumps({EGO_VIEW: TOP}), "{}"]
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"train.py: --cameras: {gr00t} has no camera ['{TOP}']; its cameras are "
        f"['observation.images.egoview', '{EGO_VIEW}']; if a dataset lacking '{TOP}' records it under another name"
    ), errors[0]
    # One map giving both its cameras that name: which to read is not the run's to guess.
    caplog.clear()
    both = json.dumps({EGO_VIEW: TOP, "observation.images.egoview": TOP})
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*argv[: argv.index("--rename-map")], "--rename-map", both]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"train.py: --rename-map: {gr00t}: rename_map gives ['{TOP}'] to several of its cameras ({json.loads(both)}; "
        f"its cameras are ['observation.images.egoview', '{EGO_VIEW}']): one camera per name"
    ]


def test_the_rename_map_told_for_a_camera_a_dataset_lacks_keeps_its_other_entries(
    make_ds: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """--cameras top, which the first dataset's map gives its camera; the second's map renames only 'action' ('act',
    as the first's does). The hint told the second a map of its camera entry alone ({cam0: top}), dropping 'action':
    'act': passed back, one dataset read 'act' and the other 'action', and the mixture left both out. It tells the
    dataset's whole map with the camera's entry added now; passed back, both datasets read 'act' and 'top'."""
    import ast

    from lerobot_dali.generate import camera_key
    from pipelines import train as train_module

    path = str(make_ds(**{**EVEN, "cameras": 1}))
    argv = ["--dataset", path, path, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--cameras", TOP]
    first = json.dumps({camera_key(0): TOP, "action": "act"})
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*argv, "--rename-map", first, '{"action": "act"}']) == 2
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    told = ast.literal_eval(re.search(r"\((\{.*?\}): DALILeRobotMixture", error).group(1))
    assert told == {"action": "act", camera_key(0): TOP}, error
    options = parse_args([*argv, "--rename-map", first, json.dumps(told)])
    readers = train_module.open_readers(options)
    for reader, rename in zip(readers, train_module.dataset_renames(options, readers), strict=True):
        assert {"act", TOP} <= set(rename.batch_names(reader.read_keys)), (reader.read_keys, rename)


def test_concat_trains_on_gr00t_and_part_of_it_pooling_their_countless_statistics(tmp_path: Path) -> None:
    """``--concat`` of GR00T (a copy, every episode and its own stats.json) and a v2.0 dataset of two of its
    episodes, both stats.json without 'count' (LeRobot v2.0's): build_policy refused ("cannot ... add what is
    lacking"). Each is weighed by its frames now: the policy's normalisation is numpy's mean and std over both
    datasets' rows. (Copies without the camera GR00T declares but never recorded, which --cameras would otherwise
    leave out.)"""
    from tests.test_dataset_stats import data_columns, gr00t_part

    datasets = [
        gr00t_part(tmp_path / name, eps, recorded_only=True)
        for name, eps in (("all", [0, 1, 2, 3, 4]), ("part", [3, 4]))
    ]
    extra = ["--concat", "--timestamp-source", "frame_index"]
    ckpt, record_dir, log = _run(tmp_path, datasets, steps=3, batch=4, procs=1, extra=extra)
    assert "union of 2 datasets: 7 episodes, 2836 frames" in log
    assert "the dataset's 2096 frames (info.json's total_frames), taken as their count" in log
    assert "the dataset's 740 frames (info.json's total_frames), taken as their count" in log
    (record,) = _records(record_dir, 1)
    assert len(record["losses"]) == 3 and all(math.isfinite(x) for x in record["losses"])
    model = _model(ckpt, 3)
    for prefix, key in (("state_norm", "observation.state"), ("action_norm", "action")):
        rows = data_columns(datasets, key)
        std = rows.std(0)
        want = torch.tensor(np.where(std > 0, std, 1.0), dtype=torch.float32)
        torch.testing.assert_close(
            model[f"{prefix}.mean"], torch.tensor(rows.mean(0), dtype=torch.float32), atol=3e-5, rtol=1e-5
        )
        torch.testing.assert_close(model[f"{prefix}.std"], want, atol=3e-5, rtol=1e-5)


def test_tolerance_flag_reaches_the_iterator(make_ds: Callable[..., Path]) -> None:
    """r1's 10 fps rows over 25 fps video need half a video frame of tolerance, which train.py could not pass."""
    from lerobot_dali import open_dataset

    reader = open_dataset(make_ds(**EVEN))
    base = ["--dataset", "d", "--steps", "1", "--device", "cpu", "--num-workers", "0"]
    for extra, expected in (([], 1e-4), (["--tolerance-s", "0.0201"], 0.0201)):
        options = parse_args([*base, *extra])
        plan = data_plan(options, fps=reader.fps, camera_keys=reader.camera_keys)
        iterator = build_iterator(reader, plan, options, device="cpu", rank=0, world_size=1)
        assert iterator._tolerance_s == expected
        iterator.close()
    # A mixture: one value for every dataset, or one per dataset.
    other = open_dataset(make_ds(**{**EVEN, "seed": 1}))
    base = ["--dataset", "a", "b", *base[2:]]
    for extra, sources, tolerances in (
        (["--tolerance-s", "0.0201"], ["parquet_timestamp"] * 2, [0.0201] * 2),
        (["--timestamp-source", "frame_index", "parquet_timestamp", "--tolerance-s", "0.001", "0.0201"],
         ["frame_index", "parquet_timestamp"], [0.001, 0.0201]),
    ):  # fmt: skip
        options = parse_args([*base, *extra])
        plan = data_plan(options, fps=reader.fps, camera_keys=reader.camera_keys)
        mix = build_iterator([reader, other], plan, options, device="cpu", rank=0, world_size=1)
        assert [part._timestamp_source.value for part in mix.datasets] == sources
        assert [part._tolerance_s for part in mix.datasets] == tolerances
        mix.close()
    with pytest.raises(ValueError, match=r"--timestamp-source takes one value, or one per --dataset \(2\)"):
        parse_args([*base, "--timestamp-source", "frame_index", "frame_index", "frame_index"])


def test_data_plan_resolves_recipe_windows_and_overrides(tmp_path: Path) -> None:
    cams = ("observation.images.a", "observation.images.b")
    plain = data_plan(TrainOptions(dataset="d", steps=1), fps=10, camera_keys=cams)
    assert plain.delta_timestamps == {"action": pytest.approx([i / 10 for i in range(10)])}
    assert (plain.chunk, plain.camera_steps, plain.state_steps, plain.image_size, plain.augment) == (
        10,
        None,
        None,
        None,
        None,
    )

    diffusion = data_plan(TrainOptions(dataset="d", steps=1, recipe="diffusion"), fps=10, camera_keys=cams)
    assert diffusion.delta_timestamps == {
        "observation.images.a": [-0.1, 0.0],
        "observation.images.b": [-0.1, 0.0],
        "observation.state": [-0.1, 0.0],
        "action": pytest.approx([k / 10 for k in range(-1, 15)]),
    }
    assert (diffusion.chunk, diffusion.camera_steps, diffusion.state_steps) == (16, 2, 2)
    assert (plain.drop_n_last_frames, diffusion.drop_n_last_frames) == (0, 7)  # (LeRobot's diffusion config)
    # --chunk keeps the recipe's first action offset (-1 frame) and sets the length
    shorter = data_plan(
        TrainOptions(dataset="d", steps=1, recipe="diffusion", chunk=3, drop_n_last_frames=0), fps=20, camera_keys=cams
    )
    assert shorter.delta_timestamps["action"] == pytest.approx([-0.05, 0.0, 0.05]) and shorter.chunk == 3
    assert shorter.drop_n_last_frames == 0
    with pytest.raises(ValueError, match="--drop-n-last-frames"):
        TrainOptions(dataset="d", steps=1, drop_n_last_frames=-1)

    vla = data_plan(TrainOptions(dataset="d", steps=1, recipe="vla"), fps=30, camera_keys=cams)
    assert vla.image_size == (224, 224) and vla.chunk == 30 and vla.augment is not None
    assert vla.augment.color_jitter is not None
    augment = tmp_path / "aug.toml"
    augment.write_text("[blur]\nsigma = [0.5, 1.0]\n")
    vla = data_plan(
        TrainOptions(dataset="d", steps=1, recipe="vla", image_size=(96, 128), augment=augment),
        fps=30,
        camera_keys=cams,
    )
    assert vla.image_size == (96, 128)
    assert vla.augment is not None and vla.augment.color_jitter is None and vla.augment.blur is not None


# -- the policy alone -----------------------------------------------------------------------------------------
def test_masked_l1_ignores_padded_steps() -> None:
    prediction = torch.zeros(2, 3, 2)
    target = torch.tensor([[[1.0, 3.0], [2.0, 2.0], [100.0, 100.0]], [[4.0, 4.0], [-6.0, 6.0], [8.0, 8.0]]])
    is_pad = torch.tensor([[False, False, True], [False, False, False]])
    # per-step errors: [2, 2, (100, padded)], [4, 6, 8] -> mean over the 5 valid steps
    assert masked_l1(prediction, target, is_pad).item() == pytest.approx(22 / 5)
    assert masked_l1(prediction, target, None).item() == pytest.approx(122 / 6)


def test_policy_predicts_chunks_against_normalised_actions() -> None:
    torch.manual_seed(0)
    config = PolicyConfig(camera_keys=("cam",), state_dim=2, action_dim=3, chunk=4)
    stats = FeatureStats(mean=(100.0, -5.0, 0.0), std=(10.0, 1.0, 0.0))  # a zero std divides by 1
    policy = ChunkPolicy(config, state_stats=FeatureStats.identity(2), action_stats=stats)
    batch = {"observation.state": torch.randn(5, 2), "cam": torch.rand(5, 3, 32, 32)}
    normalized = policy._normalized_prediction(batch)
    assert normalized.shape == (5, 4, 3)
    actions = torch.tensor([[110.0, -4.0, 3.0]]).expand(5, 4, 3)
    torch.testing.assert_close(policy.action_norm(actions), torch.tensor([1.0, 1.0, 3.0]).expand(5, 4, 3))
    loss = policy({**batch, "action": actions})
    assert loss.item() == pytest.approx((normalized - torch.tensor([1.0, 1.0, 3.0])).abs().mean().item())
    with pytest.raises(ValueError, match=r"expected \(B, 4, 3\)"):
        policy({**batch, "action": torch.zeros(5, 2, 3)})


def test_policy_stacks_camera_windows_on_channels_and_flattens_the_state_window() -> None:
    torch.manual_seed(0)
    config = PolicyConfig(camera_keys=("cam",), state_dim=2, action_dim=3, chunk=16, camera_steps=2, state_steps=2)
    policy = ChunkPolicy(config, state_stats=FeatureStats.identity(2), action_stats=FeatureStats.identity(3))
    assert policy.cameras[0].net[0].in_channels == 6  # 2 frames x 3 channels
    assert policy.head[0].in_features == 2 * 2 + 64
    frames = torch.rand(5, 2, 3, 32, 32)
    batch = {"observation.state": torch.randn(5, 2, 2), "cam": frames}
    assert policy._normalized_prediction(batch).shape == (5, 16, 3)
    # frame t is channels 3t..3t+2: the window enters the CNN as one (B, 6, H, W) image
    stacked = policy._camera_input("cam", frames)
    torch.testing.assert_close(stacked[:, 3:], frames[:, 1])
    is_pad = torch.zeros(5, 16, dtype=torch.bool)
    is_pad[:, 10:] = True
    target = torch.randn(5, 16, 3)
    changed = target.clone()
    changed[:, 10:] += 100.0  # padded steps do not count
    loss = policy({**batch, "action": target, "action_is_pad": is_pad})
    assert loss.item() == pytest.approx(policy({**batch, "action": changed, "action_is_pad": is_pad}).item())
    with pytest.raises(ValueError, match=r"expected a window \(B, 2, C, H, W\)"):
        policy._normalized_prediction({**batch, "cam": torch.rand(5, 3, 32, 32)})
    with pytest.raises(ValueError, match=r"expected \(B, 2, 2\)"):
        policy._normalized_prediction({**batch, "observation.state": torch.randn(5, 2)})
    one_frame = ChunkPolicy(
        PolicyConfig(camera_keys=("cam",), state_dim=2, action_dim=3, chunk=4),
        state_stats=FeatureStats.identity(2),
        action_stats=FeatureStats.identity(3),
    )
    with pytest.raises(ValueError, match="camera_steps"):
        one_frame._normalized_prediction(batch)


def test_r1s_state_wider_than_info_json_declares_fails_before_training_with_advice_for_the_policy() -> None:
    """r1_v30_h264's observation.state holds 41 values a row where info.json declares 17. train.py built the model,
    the optimiser and the pipeline, logged its start, and failed at the first step advising to leave the state out
    (keys=, --keys: no flag of train.py, whose policy reads the state)."""
    from tests.conftest import shared_dataset

    r1 = shared_dataset("r1_v30_h264")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = ["--dataset", str(r1), "--steps", "1", "--batch-size", "4", "--device", "cpu", "--num-workers", "0"]
    result = subprocess.run(
        [sys.executable, str(TRAIN), *args, "--tolerance-s", "0.0201"],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-30000:]
    assert "samples per epoch" not in result.stderr and "rank 0/1: steps" not in result.stderr  # no pipeline built
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r".* rank0 pipelines\.train: train\.py: .*file-000\.parquet: column 'observation\.state' holds vectors "
        r"of length \[41\] but info\.json declares shape \[17\] \(17 values\)\. train\.py's policy reads "
        r"'observation\.state' and 'action' and cannot leave either out: correct the feature's shape and names in "
        r"the dataset's meta/info\.json .*",
        last,
    ), last
    assert "keys" not in last


def test_feature_stats_read_named_and_per_episode_statistics() -> None:
    """r1 stores state statistics by joint name (ordered by info.json's names); cr5_v21 keeps per-episode
    statistics only, whose aggregate LeRobot's converter stored in cr5_v30's stats.json."""
    from lerobot_dali.dataset_reader import open_dataset
    from pipelines.train import feature_stats
    from tests.conftest import shared_dataset

    r1 = shared_dataset("r1_v30_h264")
    stored = json.loads((r1 / "meta/stats.json").read_text())["observation.state"]
    names = json.loads((r1 / "meta/info.json").read_text())["features"]["observation.state"]["names"]
    stats = feature_stats(open_dataset(r1), "observation.state")
    assert stats.mean == tuple(stored["mean"][n] for n in names) and len(stats.std) == 17

    v30 = json.loads((shared_dataset("cr5_v30_av1") / "meta/stats.json").read_text())["action"]
    stats = feature_stats(open_dataset(shared_dataset("cr5_v21_av1")), "action")
    assert stats.mean == pytest.approx(v30["mean"], rel=1e-9) and stats.std == pytest.approx(v30["std"], rel=1e-9)


def test_feature_stats_refuse_statistics_that_are_not_finite(make_ds, copy_ds) -> None:
    """A NaN in the statistics of the state a policy normalises by made every normalised state NaN, unsaid; the
    dataset's other features' statistics (sound) read as before."""
    from lerobot_dali.dataset_reader import open_dataset
    from lerobot_dali.errors import StatsError
    from pipelines.train import feature_stats

    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["mean"][0] = float("nan")
    (root / "meta/stats.json").write_text(json.dumps(stats))
    reader = open_dataset(root)
    with pytest.raises(StatsError, match=r"the statistics of 'observation.state' .*: mean is not finite"):
        feature_stats(reader, "observation.state")
    assert feature_stats(reader, "action").mean == tuple(stats["action"]["mean"])


def test_statistics_of_a_negative_std_or_another_length_are_refused_as_training_starts(
    make_ds, copy_ds, caplog
) -> None:
    """A negative std failed the policy's build with FeatureStats' bare ValueError (a traceback naming no dataset or
    feature), a mean of 8 values for action's 7 with 'mean and std need the same non-zero length'. Now train.py
    refuses either as it starts: one line (status 2), a StatsError naming the dataset, feature, entry and what to do."""
    from pipelines import train as train_module

    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["std"][3] = -0.5
    stats["action"]["mean"].append(0.0)
    (root / "meta/stats.json").write_text(json.dumps(stats))
    argv = ["--dataset", str(root), "--steps", "1", "--batch-size", "2", "--device", "cpu", "--num-workers", "0"]
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"train.py: StatsError: {root}: the statistics of 'observation.state' cannot normalise it: std is negative at "
        "components [3]: recompute them from the data files, or download or copy meta/stats.json (v2.1: "
        "meta/episodes_stats.jsonl) again; `lerobot-dali check` lists every statistics fault of a dataset"
    ], errors
    stats["observation.state"]["std"][3] = 0.5
    (root / "meta/stats.json").write_text(json.dumps(stats))
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and (
        f"{root}: the statistics of 'action' cannot normalise it: mean holds 8 values, but the feature has 7 in "
        "info.json (shape [7]): recompute them" in errors[0]
    ), errors


def test_a_loss_that_is_not_finite_is_refused(make_ds, copy_ds, caplog) -> None:
    """A NaN in a state row of an episode (read as stored, as LeRobot's dataset reads it) made every loss from the
    first batch holding it NaN, and the weights NaN: 4 of 4 steps logged 'loss nan' and the run exited 0. Now the
    first loss logged that is not finite ends the run with one line, status 2."""
    from pipelines import train as train_module

    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))  # (its stats.json sound)
    _nan_in_episode_1s_second_state(root)
    argv = ["--dataset", str(root), "--steps", "4", "--batch-size", "8", "--device", "cpu", "--num-workers", "0"]
    with caplog.at_level(logging.INFO, logger="pipelines.train"):
        assert train_module.main([*argv, "--log-every", "1"]) == 2
    said = [r.getMessage() for r in caplog.records if r.name == "pipelines.train" and r.getMessage().startswith(
        ("step ", "train.py: "))]  # fmt: skip
    assert len(said) == 1 and said[0].startswith(
        "train.py: the loss at step 1 is nan (a rank's at least): the batch of step 1 held NaN or infinity in its "
        "'observation.state' or 'action'"
    ), said


def test_a_loss_not_finite_between_log_steps_is_refused_before_a_checkpoint_saves_it(
    make_ds, copy_ds, tmp_path: Path, caplog
) -> None:
    """The loss was checked at logged steps only: a run resumed from step 2 on a dataset whose episode 1 now holds a
    NaN (every batch of 8 holds it: the loss NaN from step 3, not a log step, on) saved step 3 (155,718 of 155,744
    weights NaN) and made it ``latest`` before step 4's log refused it. Now every step's loss is checked (on the
    device) before each save: the run ends at step 3's save, naming step 3 and the checkpoint of step 2, ``latest``
    still."""
    from pipelines import train as train_module

    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))
    ckpt = tmp_path / "ckpt"
    argv = ["--dataset", str(root), "--batch-size", "8", "--device", "cpu", "--num-workers", "0", "--log-every", "4"]
    argv += ["--checkpoint-dir", str(ckpt), "--save-every", "3"]
    assert train_module.main([*argv, "--steps", "2"]) == 0
    _nan_in_episode_1s_second_state(root)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipelines.train"):
        assert train_module.main([*argv, "--steps", "8", "--resume"]) == 2
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000002"]
    assert all(torch.isfinite(w).all() for w in _model(ckpt, 2).values())
    said = [r.getMessage() for r in caplog.records if r.name == "pipelines.train" and r.getMessage().startswith(
        ("step ", "train.py: "))]  # fmt: skip
    assert said == [
        "train.py: the loss at step 3 is nan (a rank's at least): the batch of step 3 held NaN or infinity in its "
        "'observation.state' or 'action' (read as the data files hold them, as LeRobot reads them), or training "
        "diverged, and the weights are NaN from there on: mend the data files or train on episodes without such rows "
        "(--episodes), or lower --lr; no checkpoint is saved from step 3 on: resume only from one saved before it, "
        f"the last {ckpt / 'step_00000002'} (which --resume continues from)"
    ], said


def test_finite_loss_keeps_the_first_step_not_finite_on_the_device_and_reads_it_back_only_when_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step's note is device work only (no value read back: on a GPU, no wait for it); a check reads back the
    first step whose loss was not finite, and names it and the last checkpoint saved."""
    from types import SimpleNamespace

    from pipelines.progress import FiniteLoss
    from pipelines.run_errors import RunRefused
    from pipelines.train import NOT_FINITE_REMEDY

    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "latest").write_text("step_00000002")
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t)
    losses = FiniteLoss(accelerator, tmp_path, remedy=NOT_FINITE_REMEDY)
    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            patched.setattr(torch.Tensor, name, lambda *a: pytest.fail("a value read back"), raising=False)
        for step, loss in enumerate([0.5, 0.25], start=1):
            losses.note(torch.tensor(loss), step)
    losses.check(2)
    for step, loss in enumerate([float("nan"), float("inf"), 0.5], start=3):
        losses.note(torch.tensor(loss), step)
    with pytest.raises(
        RunRefused, match=r"^the loss at step 3 is nan \(a rank's at least\): the batch of step 3 "
    ) as e:
        losses.check(5)
    assert str(e.value).endswith(
        f"no checkpoint is saved from step 3 on: resume only from one saved before it, the last "
        f"{tmp_path / 'step_00000002'} (which --resume continues from)"
    )


def test_steps_the_gradient_scaler_skipped_with_a_loss_not_finite_are_said_and_refused_only_many_in_a_row(
    caplog,
) -> None:
    """fp16's gradient scaler skips a step whose gradients are not finite (a batch of NaN, float16 overflowing) and
    leaves the weights as they were, and the run goes on (LeRobot's with use_amp too); FiniteLoss refused the first
    such loss, ending a run whose weights were finite. Now a skipped step's loss not finite is said at the check (how
    many, the first, the rank) and refused only at SKIPPED_IN_A_ROW in a row, counted across checks; a step taken with
    a loss not finite is refused as before (the tests above)."""
    from accelerate import Accelerator

    from pipelines.progress import SKIPPED_IN_A_ROW, FiniteLoss
    from pipelines.run_errors import RunRefused
    from pipelines.train import NOT_FINITE_REMEDY

    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)  # (fp16's: accelerate sets none on the CPU)
    torch.manual_seed(0)
    batches = [torch.randn(4, 3) for _ in range(8)]
    batches[2][1, 0] = batches[4][3, 2] = float("nan")  # steps 3 and 5
    model, plain = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    plain.load_state_dict(model.state_dict())
    optimizer = accelerator.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    by_hand = torch.optim.SGD(plain.parameters(), lr=0.1)
    losses = FiniteLoss(accelerator, None, remedy=NOT_FINITE_REMEDY)
    skipped = []
    for step, x in enumerate(batches, start=1):
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        skipped.append(accelerator.optimizer_step_was_skipped)
        losses.note(loss, step, skipped=skipped[-1])
        if torch.isfinite(x).all():  # the weights the run has: stepped by the finite batches alone
            plain(x).pow(2).mean().backward()
            by_hand.step()
            by_hand.zero_grad()
    assert [step for step, s in enumerate(skipped, start=1) if s] == [3, 5]
    with caplog.at_level(logging.WARNING, logger="pipelines.train"):
        losses.check(8)
    for got, want in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    assert [r.getMessage() for r in caplog.records if r.name == "pipelines.train"] == [
        "2 of the 8 steps through step 8 had a loss not finite on rank 0 (the first at step 3); the gradient scaler "
        "skipped each, leaving the weights as they were; where it goes on, a batch held NaN or infinity in its "
        "'observation.state' or 'action' (read as the data files hold them, as LeRobot reads them), or float16 "
        "overflows in this model (--mixed-precision bf16 keeps float32's range)"
    ]

    nan, step = torch.tensor(float("nan")), 8
    for between in (True, False):  # (a step skipped with a finite loss, or one taken: no run of them is long enough)
        for _ in range(SKIPPED_IN_A_ROW - 1):
            step += 1
            losses.note(nan, step, skipped=True)
        step += 1
        losses.note(torch.tensor(0.5), step, skipped=between)
    losses.check(step)
    for _ in range(SKIPPED_IN_A_ROW - 5):
        step += 1
        losses.note(nan, step, skipped=True)
    losses.check(step)  # (20 in a row so far)
    for _ in range(5):
        step += 1
        losses.note(nan, step, skipped=True)
    with pytest.raises(
        RunRefused,
        match=rf"^5 of the 5 steps through step {step} had a loss not finite on rank 0 "
        rf"\(the first at step {step - 4}\).*, {SKIPPED_IN_A_ROW} in a row, .*the run no longer trains",
    ):
        losses.check(step)


def _two_ranks_alike() -> Any:
    """An accelerator of two ranks whose losses are alike: ``reduce`` sums in the tensor's dtype, then divides for
    ``mean`` (accelerate's all-reduce)."""
    from types import SimpleNamespace

    def reduce(t: torch.Tensor, reduction: str) -> torch.Tensor:
        total = t + t  # (rank 0's plus rank 1's, in t's dtype)
        return total / 2 if reduction == "mean" else total

    return SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, reduce=reduce, is_main_process=True)


def test_log_progress_checks_the_losses_itself_and_means_finite_losses_without_overflow(caplog) -> None:
    """Both loops called ``FiniteLoss.check`` before ``log_progress``, whose own refusal of a mean not finite only a
    mean of finite losses overflowing reached: accelerate's mean sums in the loss's dtype, and two ranks' float16
    losses of 40,000 (measured with torchrun, gloo: inf) refused a run whose weights were finite. Now log_progress
    checks the losses itself (a NaN noted at step 1 refused at step 2's log, naming step 1), and the mean of 40,000
    on two ranks logs 40000."""
    from pipelines.progress import FiniteLoss, Throughput, log_progress
    from pipelines.run_errors import RunRefused
    from pipelines.train import NOT_FINITE_REMEDY

    accelerator = _two_ranks_alike()
    losses = FiniteLoss(accelerator, None, remedy=NOT_FINITE_REMEDY)
    with caplog.at_level(logging.INFO, logger="pipelines.train"):
        for step, loss in enumerate([40000.0, 65504.0], start=1):
            half = torch.tensor(loss, dtype=torch.float16)
            losses.note(half, step)
            log_progress(accelerator, step, 0, half, Throughput(), 2, losses)
    said = [r.getMessage() for r in caplog.records if r.name == "pipelines.train"]
    assert said == ["step 1 epoch 0 loss 40000.0000 | warm-up", "step 2 epoch 0 loss 65504.0000 | warm-up"], said
    losses = FiniteLoss(accelerator, None, remedy=NOT_FINITE_REMEDY)
    losses.note(torch.tensor(float("-inf")), 1)
    losses.note(torch.tensor(float("nan")), 2)
    with pytest.raises(RunRefused, match=r"^the loss at step 1 is -inf \(a rank's at least\): the batch of step 1 "):
        log_progress(accelerator, 2, 0, torch.tensor(float("nan")), Throughput(), 2, losses)


@pytest.mark.parametrize("script", ["train", "lerobot_policy"])
def test_a_scripts_refusal_of_a_loss_not_finite_names_only_its_own_flags(script: str, capsys) -> None:
    """lerobot_policy.py's loop refused a loss not finite with train.py's advice, "train on episodes without such
    rows (--episodes), or lower --lr": 2 flags lerobot_policy.py has not. Each script's advice names its own."""
    import importlib

    from pipelines.progress import FiniteLoss
    from pipelines.run_errors import RunRefused

    module = importlib.import_module(f"pipelines.{script}")
    losses = FiniteLoss(_two_ranks_alike(), None, remedy=module.NOT_FINITE_REMEDY)
    losses.note(torch.tensor(float("nan")), 1)
    with pytest.raises(RunRefused) as refused:
        losses.check(1)
    named = re.findall(r"--[a-z][a-z-]*", str(refused.value))
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    usage = capsys.readouterr().out
    assert named and [flag for flag in named if not re.search(rf"{flag}\b(?!-)", usage)] == [], (named, usage)


def test_two_ranks_agree_on_a_loss_not_finite_on_one_of_them_before_the_first_save(make_ds, copy_ds, tmp_path) -> None:
    """Two ranks, one episode each, episode 1's holding a NaN: its rank's loss is NaN from step 1, the other's from
    step 2 (the weights NaN after step 1's all-reduce). Steps 1 and 2 were saved (155,718 of 155,744 weights NaN,
    ``latest`` step 2) before step 3's log refused the run. Now both ranks refuse at step 1's save, naming step 1
    (the earliest of either rank: a rank that went on alone would wait in the save's barrier); nothing is saved."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))
    _nan_in_episode_1s_second_state(root)
    ckpt = tmp_path / "ckpt"
    args = ["--dataset", str(root), "--batch-size", "4", "--device", "cpu", "--num-workers", "0", "--steps", "3"]
    result = _failed([*args, "--log-every", "4", "--checkpoint-dir", str(ckpt), "--save-every", "1"], procs=2)
    assert "exitcode  : 2" in result.stderr, result.stderr[-30000:]  # (torchrun's summary)
    assert not ckpt.exists() or not any(ckpt.iterdir()), sorted(p.name for p in ckpt.iterdir())
    lines = [line for line in result.stderr.splitlines() if "train.py: " in line]
    assert len({line.split()[1] for line in lines}) == len(lines) >= 1, result.stderr[-30000:]
    for line in lines:
        assert "train.py: the loss at step 1 is nan (a rank's at least): the batch of step 1 held NaN " in line, line
        assert line.endswith(
            "no checkpoint is saved from step 1 on, and none was before it: a new run starts from step 0"
        ), line


def _nan_in_episode_1s_second_state(root: Path) -> None:
    """Write NaN into component 1 of row 5's observation.state (episode 1's second row; 2 episodes of 4 rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    [data] = sorted((root / "data").rglob("*.parquet"))
    table = pq.read_table(data)
    states = table.column("observation.state").to_pylist()
    states[5][1] = float("nan")  # (episode 1's second row)
    column = table.schema.get_field_index("observation.state")
    field = table.schema.field(column)
    pq.write_table(table.set_column(column, field, pa.array(states, type=field.type)), data)


def test_feature_stats_from_rows_refuse_rows_that_are_not_finite(make_ds, copy_ds) -> None:
    """Without statistics, those computed from rows holding a NaN were NaN: every normalised state NaN, unsaid."""
    from lerobot_dali.dataset_reader import open_dataset
    from lerobot_dali.errors import StatsError
    from pipelines.train import feature_stats

    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9"))
    (root / "meta/stats.json").unlink()
    _nan_in_episode_1s_second_state(root)
    reader = open_dataset(root)
    with pytest.raises(StatsError, match=r"no statistics of 'observation.state' and its rows in episode 1 hold NaN"):
        feature_stats(reader, "observation.state")
    assert np.isfinite(feature_stats(reader, "action").mean).all()


@pytest.mark.parametrize(
    ("extra", "files", "message"),
    [
        (["--steps", "0"], {}, r"--steps must be an int >= 1, got 0"),
        # (a traceback once the run had started: numpy's seeding refused both)
        (["--seed", "-1"], {}, r"--seed must be an int from 0 to 2\*\*32 - 1, got -1"),
        (["--seed", "4294967296"], {}, r"--seed must be an int from 0 to 2\*\*32 - 1, got 4294967296"),
        (["--decode", "tpu"], {}, r"--decode must be one of 'auto', 'gpu', 'cpu', got 'tpu'"),
        (["--image-size", "0", "64"], {}, r"--image-size takes a positive height and width up to 8192, .* got 0x64"),
        (["--lr", "inf"], {}, r"--lr must be a finite number > 0, got inf"),
        (["--grad-clip", "nan"], {}, r"--grad-clip must be a finite number >= 0 \(0: no clipping\), got nan"),
        (["--tolerance-s", "-1"], {}, r"--tolerance-s must be a positive finite number of seconds, got -1\.0"),
        (["--dataset", "a", "b", "--tolerance-s", "0.01", "nan"], {}, r"--tolerance-s must be a positive .*nan"),
        (["--dataset", "a", "b", "--weights", "-1", "2"], {}, r"--weights must be finite numbers > 0, got -1\.0 2\.0"),
        (["--recipe", "pi0"], {}, r"Unknown recipe 'pi0'"),
        (["--recipe", "{tmp}/r.toml"], {"r.toml": 'name = "r"\n[action]\nstep = 4\n'},
         r".*/r\.toml \[action\] has unknown key\(s\) \['step'\]"),
        (["--recipe", "{tmp}/r.toml"], {"r.toml": 'name = "r"\n[augment]\nresize = [0, 5]\n'},
         r".*/r\.toml \[augment\]: AugmentConfig\.resize = \[0, 5\] is invalid"),
        (["--recipe", "{tmp}/missing.toml"], {}, r"recipe file .*missing\.toml does not exist"),
        (["--recipe", "{tmp}/"], {}, r"recipe .*/ is a folder: give a recipe \.toml file, or one of act, .*"),
        (["--augment", "{tmp}/a.toml"], {"a.toml": "[blur\n"}, r"--augment .*a\.toml: "),
        (["--augment", "{tmp}/a.toml"], {"a.toml": "[color_jitter]\nbrightnes = 0.2\n"},
         r"--augment .*a\.toml: AugmentConfig\.color_jitter has unknown key\(s\) \['brightnes'\]"),
        (["--augment", "{tmp}/missing.toml"], {}, r"--augment .*missing\.toml: No such file or directory$"),
        (["--augment", "{tmp}/a.json"], {"a.json": "{"}, r"--augment .*a\.json: not JSON \(Expecting"),
        (["--augment", "{tmp}/a.json"], {"a.json": '{"dataset": {"repo_id": "x"}}'},
         r"--augment .*a\.json: expected LeRobot's image transforms, a train config's dataset\.image_transforms"),
        (["--augment", "{tmp}/a.json"],
         {"a.json": '{"enable": true, "tfs": {"crop": {"type": "RandomCrop", "kwargs": {"size": 8}}}}'},
         r"--augment .*a\.json: image_transforms\.tfs\.crop\.type = 'RandomCrop' has no counterpart here"),
    ],
)  # fmt: skip
def test_mistakes_in_flags_recipe_and_augment_files_are_one_line_errors_before_training(
    extra: list[str], files: dict[str, str], message: str, tmp_path: Path, caplog, monkeypatch
) -> None:
    """They were tracebacks (one per rank), and a recipe's or --augment file's only after the process group had
    started and the datasets had opened (a Hub dataset downloaded); an augmentation error named neither file."""
    from pipelines import train as train_module

    monkeypatch.setattr(train_module, "train", lambda options: pytest.fail("training started"))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = ["--dataset", str(tmp_path / "no-dataset"), "--steps", "1", "--device", "cpu"]
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*argv, *(arg.format(tmp=tmp_path) for arg in extra)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and re.match(r"train\.py: " + message, errors[0]), errors


@pytest.mark.parametrize("script", ["train", "lerobot_policy"])
def test_a_flag_argparse_refuses_is_one_line_without_the_usage(
    script: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value argparse refuses (``--batch-size x``) was argparse's usage, train.py's 16 lines, then the error: on
    every rank under torchrun (34 lines for 2). Now the error alone, pointing at --help, exit status 2; lerobot-dali's
    verbs keep argparse's usage (a few lines, one process)."""
    import importlib

    monkeypatch.setattr(sys, "argv", [f"pipelines/{script}.py"])
    with pytest.raises(SystemExit) as refused:
        importlib.import_module(f"pipelines.{script}").parse_args(["--dataset", "d", "--batch-size", "x"])
    assert refused.value.code == 2
    assert capsys.readouterr().err == (
        f"{script}.py: error: argument --batch-size: invalid int value: 'x' ({script}.py --help lists the options)\n"
    )


@pytest.mark.parametrize("script", ["train.py", "lerobot_policy.py"])
def test_a_flag_argparse_refuses_carries_the_rank_as_the_scripts_other_errors(script: str) -> None:
    """Under a launcher each rank's line of a value argparse refuses read 'train.py: error: argument --batch-size:
    ...' alone, where the scripts' own refusals of a flag (--steps 0) read '12:00:00 rank1 pipelines.train:
    train.py: ...': the ranks' lines could not be told apart. main() has argparse's error said as its logged line
    now (parse_args alone writes it to stderr, as before)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "3"}
    argv = [str(REPO / "pipelines" / script), "--dataset", "d", "--batch-size", "x"]
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    logger = {"train.py": "pipelines.train", "lerobot_policy.py": "lerobot_dali.pipelines.lerobot_policy"}[script]
    assert result.returncode == 2
    assert re.fullmatch(
        rf"\d\d:\d\d:\d\d rank3 {re.escape(logger)}: {re.escape(script)}: error: argument --batch-size: invalid int "
        rf"value: 'x' \({re.escape(script)} --help lists the options\)\n",
        result.stderr,
    ), result.stderr


def _failed(args: list[str], *, procs: int = 1) -> subprocess.CompletedProcess[str]:
    command, env = _command(args, procs=procs)
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


def test_dataset_errors_while_setting_up_are_one_line_on_each_rank(
    single_run: tuple[Path, Path, str], make_ds: Callable[..., Path], tmp_path: Path
) -> None:
    """A dataset path that does not exist, a --cameras key or an --episodes index the dataset lacks, a checkpoint
    of other episodes or other windows: each printed a traceback (on every rank) ending in the library's message
    (or train.py's own), as did a --batch-size larger than an epoch (found at the first batch). Now that message is one
    line, exit status 2, as a flag's mistake is."""
    dataset = make_ds(**UNEVEN)
    base = [*COMMON, "--steps", "30", "--batch-size", "8"]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(single_run[0], ckpt)
    cases = [
        (["--dataset", str(tmp_path / "nope")],
         rf"DatasetNotFoundError: dataset '{tmp_path}/nope' not found: no such local folder \(.*"),
        (["--dataset", str(dataset), "--episodes", "0", "9"],
         r".*: episodes \[9\] are not in this dataset, .*0\.\.5: pass episodes=\[\.\.\.\] of those \(on the command "
         r"line --episodes N \.\.\.\)"),
        (["--dataset", str(dataset), "--episodes", "0", "1", "2", "--checkpoint-dir", str(ckpt), "--resume"],
         r"ResumeStateError: this stream state was saved over other episodes \(6 episodes, .*\) than this iterator "
         r"reads \(3 episodes.*"),
        (["--dataset", str(dataset), "--checkpoint-dir", str(ckpt), "--resume", "--chunk", "3"],  # (train.py's own)
         rf"{ckpt}/step_00000024 was trained with other delta_timestamps \(.*\): resume with the same .*"),
        (["--dataset", str(dataset), "--batch-size", "131"],  # (130 frames: found at the first batch; a traceback)
         r"rank 0 gets no full batch of 131 from an epoch; lower --batch-size or use a dataset with more frames per "
         r"rank"),
    ]  # fmt: skip
    for args, message in cases:
        result = _failed([*base, *args])
        assert result.returncode == 2, result.stderr[-30000:]
        assert "Traceback" not in result.stderr, result.stderr[-30000:]
        last = result.stderr.strip().splitlines()[-1]
        assert re.fullmatch(r"\d\d:\d\d:\d\d rank0 pipelines\.train: train\.py: " + message, last), last
    result = _failed([*base, "--dataset", str(make_ds(**EVEN)), "--cameras", "observation.images.top"], procs=2)
    assert "exitcode  : 2" in result.stderr, result.stderr[-30000:]  # (torchrun's summary)
    assert "lerobot_dali.errors" not in result.stderr, result.stderr[-30000:]  # (no rank's traceback)
    lines = [line for line in result.stderr.splitlines() if "train.py: " in line]
    assert len({line.split()[1] for line in lines}) == len(lines) >= 1  # (one a rank: torchrun may end the second
    for line in lines:  # before it logs, once the first has failed)
        assert line.endswith(
            "train.py: --cameras: unknown camera(s) ['observation.images.top']; this dataset declares "
            "['observation.images.cam0', 'observation.images.cam1']: pass cameras= from those (--cameras on the "
            "command line)"
        )


def test_one_process_of_several_a_launcher_started_is_one_line_before_the_dataset_opens(
    monkeypatch, tmp_path: Path
) -> None:
    """``srun -n 2 python train.py`` (or ``mpirun -np 2``): accelerate finds no process group in Slurm's variables, so
    each task trained as rank 0 of 1 on the whole dataset, both saving into one --checkpoint-dir (it trained, exit 0).
    RANK without WORLD_SIZE too (data_rank, in-process)."""
    from types import SimpleNamespace

    from lerobot_dali.errors import ShardingError
    from pipelines.train import data_rank

    command, env = _command([*COMMON, "--dataset", str(tmp_path / "never opened"), "--steps", "1"])
    env.update(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2")
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-30000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d rank0 pipelines\.train: train\.py: ShardingError: this process is one of several a launcher "
        r"started \(SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2\) .* launch with torchrun or accelerate launch, or set "
        r"RANK and WORLD_SIZE; or run the script as one process, with no launcher",
        last,
    ), last
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    alone = SimpleNamespace(process_index=0, num_processes=1)
    assert data_rank(alone) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ShardingError, match=r"\(RANK=1\).*RANK and WORLD_SIZE are not both set"):
        data_rank(alone)
    monkeypatch.setenv("WORLD_SIZE", "2")  # (both set, yet accelerate sees one process: it says so, not "not both set")
    with pytest.raises(ShardingError, match=r"\(RANK=1, WORLD_SIZE=2\).* and accelerate sees one process, so"):
        data_rank(alone)


def test_other_errors_while_setting_up_keep_their_traceback(tmp_path: Path, monkeypatch, caplog) -> None:
    """Only the library's own errors about the data are a user's mistake told in one line; anything else raised
    while setting up (a bug) propagates with its traceback."""
    from types import SimpleNamespace

    from lerobot_dali.errors import DatasetError, IteratorClosedError
    from pipelines import train as train_module

    monkeypatch.setattr(
        train_module,
        "make_accelerator",
        lambda *a, **k: SimpleNamespace(process_index=0, num_processes=1, device=torch.device("cpu")),
    )
    argv = ["--dataset", str(tmp_path), "--steps", "1", "--device", "cpu"]
    for error in (KeyError("a bug"), ValueError("a bug"), IteratorClosedError("a bug")):
        monkeypatch.setattr(train_module, "open_readers", lambda options, error=error: (_ for _ in ()).throw(error))
        with pytest.raises(type(error), match="a bug"):
            train_module.main(argv)
    monkeypatch.setattr(train_module, "open_readers", lambda options: (_ for _ in ()).throw(DatasetError("refused")))
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main(argv) == 2
    # (its type named, as lerobot-dali names it: "lerobot-dali check: DatasetError: refused")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["train.py: DatasetError: refused"]


def test_a_checkpoint_dir_holding_a_checkpoint_needs_resume_and_one_that_cannot_be_written_is_refused(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    """Without --resume, a run in a --checkpoint-dir holding another run's checkpoint trained from step 0 and replaced
    that run's 'latest' at its first save (a relaunch that forgot --resume lost the progress); a --checkpoint-dir
    that is a file failed only at the first save, after --save-every steps of training, as a --record folder did at
    the end of the run (a traceback). Each is one line now, before training starts."""
    from pipelines import train as train_module

    started: list[TrainOptions] = []
    monkeypatch.setattr(train_module, "train", started.append)
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000010").mkdir(parents=True)
    (ckpt / "step_00000010" / "stream_rank0.json").write_text("{}")  # (what a resume's check looks for)
    (ckpt / "latest").write_text("step_00000010")
    argv = ["--dataset", str(tmp_path / "no-dataset"), "--steps", "1", "--device", "cpu", "--checkpoint-dir"]
    file = tmp_path / "file"
    file.write_text("")
    broken = tmp_path / "broken"
    broken.symlink_to(tmp_path / "nowhere")
    for path, message in (
        (ckpt, rf"--checkpoint-dir {ckpt} holds a checkpoint \(step_00000010\): pass --resume to continue that run"),
        (file, rf"--checkpoint-dir {file}: {file} is a file, not a folder; give a folder"),
        (file / "ckpt", rf"--checkpoint-dir {file}/ckpt: {file} is a file, not a folder; give a folder"),
        (
            broken,
            rf"--checkpoint-dir {broken}: {broken} is a symbolic link to '{tmp_path}/nowhere', which does not "
            r"exist \(or loops\); remove the link",
        ),  # (a FileExistsError traceback as the run made the folder)
    ):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            assert train_module.main([*argv, str(path)]) == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and re.match(r"train\.py: " + message, errors[0]), errors
    assert not started
    # (--record's folder: a traceback once the run had trained, its record lost)
    for record, blocker in ((file, file), (file / "rec", file)):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            assert train_module.main([*argv[:-1], "--record", str(record)]) == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [f"train.py: --record {record}: {blocker} is a file, not a folder; give a folder"], errors
    assert not started
    assert train_module.main([*argv, str(ckpt), "--resume"]) == 0
    assert train_module.main([*argv, str(tmp_path / "new" / "ckpt")]) == 0  # (made as the run starts)
    assert len(started) == 2
    from pipelines import lerobot_policy  # (its checkpoints are train.py's)

    monkeypatch.setattr(lerobot_policy, "train", started.append)
    assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--checkpoint-dir", str(ckpt)]) == 2
    assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--checkpoint-dir", str(ckpt), "--resume"]) == 0
    assert len(started) == 3
    caplog.clear()  # (its --output-dir: written once trained, a traceback then, the trained policy lost)
    with caplog.at_level(logging.ERROR):
        assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--output-dir", str(file / "out")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"lerobot_policy.py: --output-dir {file}/out: {file} is a file, not a folder; give a folder"]
    assert len(started) == 3


@pytest.mark.parametrize("where", ["lerobot.transforms", "lerobot.datasets.transforms", None])
def test_image_transforms_take_lerobots_defaults_from_where_the_installed_lerobot_keeps_them(
    monkeypatch: pytest.MonkeyPatch, where: str | None
) -> None:
    """lerobot_policy.py --image-transforms without a config applies LeRobot's default ``ImageTransformsConfig``,
    which LeRobot 0.6 keeps in ``lerobot.transforms`` and 0.3-0.4 in ``lerobot.datasets.transforms`` (the old path
    alone failed with 0.6); a LeRobot with neither raises the import error. (A stand-in LeRobot: CI has none.)"""
    import types

    from lerobot_dali.augment_config import AugmentConfig
    from pipelines import lerobot_policy
    from tests.test_augment_lerobot import LEROBOT_DEFAULT

    for name in ("lerobot", "lerobot.datasets", where):
        if name is not None:
            module = types.ModuleType(name)
            module.__path__ = []  # (a package: importing a module it lacks raises ModuleNotFoundError naming it)
            monkeypatch.setitem(sys.modules, name, module)
    if where is not None:
        sys.modules[where].ImageTransformsConfig = lambda enable: {**LEROBOT_DEFAULT, "enable": enable}  # type: ignore[attr-defined]
    options = lerobot_policy.parse_args(["--dataset", "d", "--device", "cpu", "--image-transforms"])
    if where is None:
        with pytest.raises(ModuleNotFoundError, match="lerobot.datasets.transforms"):
            lerobot_policy.policy_augment(options)
    else:
        assert lerobot_policy.policy_augment(options) == AugmentConfig.from_lerobot(LEROBOT_DEFAULT) != AugmentConfig()


@pytest.mark.parametrize("weights", ["ResNet18_Weights.IMAGENET1K_V1", None])
def test_a_policy_whose_download_fails_as_it_is_built_is_one_line(
    monkeypatch: pytest.MonkeyPatch, weights: str | None
) -> None:
    """ACT's default config (and Diffusion Policy's) starts its backbone from torchvision's ResNet18 weights, downloaded
    as LeRobot builds the policy: on a machine without network, lerobot_policy.py as the README shows it was urllib's
    140-line traceback on rank 0, the other rank killed by torchrun (-15). Now a SetupError (one line on each rank,
    exit status 2) naming the weights and how to train without them. (A stand-in LeRobot: CI has none.)"""
    import types
    from urllib.error import URLError

    from pipelines import lerobot_policy
    from pipelines.run_errors import SetupError

    def make_policy(config: Any, ds_meta: Any) -> None:
        raise URLError(socket.gaierror(-2, "Name or service not known"))

    stand_ins = {
        "make_policy_config": lambda policy, **fields: types.SimpleNamespace(pretrained_backbone_weights=weights),
        "make_policy": make_policy,
        "make_pre_post_processors": lambda config, dataset_stats: (None, None),
        "resolve_delta_timestamps": lambda config, metadata: None,
    }
    packages = ("lerobot", "lerobot.policies", "lerobot.datasets")
    for name in (*packages, "lerobot.policies.factory", "lerobot.datasets.factory"):
        module = types.ModuleType(name)
        module.__path__ = []
        module.__dict__.update(stand_ins)
        monkeypatch.setitem(sys.modules, name, module)
    options = lerobot_policy.PolicyTrainOptions(dataset="d", device="cpu")
    said = (
        r"act policy: LeRobot builds it on pretrained backbone weights \(pretrained_backbone_weights=ResNet18_Weights"
        r"\.IMAGENET1K_V1\), which torchvision failed to download \(\[Errno -2\] Name or service not known\): run it "
        r"once where the network is reached \(.*\), or train the backbone from scratch with --policy-arg "
        r"pretrained_backbone_weights=null"
        if weights
        else r"act policy: LeRobot's build of it failed to download a file \(\[Errno -2\] Name or service not known\)"
    )
    with pytest.raises(SetupError) as refused:
        lerobot_policy.build_policy(options, types.SimpleNamespace(stats={}), "cpu")
    assert re.fullmatch(said, str(refused.value)), str(refused.value)


def test_lerobots_image_transforms_from_a_train_config_or_its_table_reach_both_pipelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A LeRobot recipe's ``--dataset.image_transforms`` (its train_config.json, or that table alone) is
    lerobot_policy.py's --image-transforms-config (--image-transforms enables it, as LeRobot's
    ``--dataset.image_transforms.enable=true``) and train.py's --augment; a transform with no counterpart here is one
    line naming the file, before training. (No LeRobot needed: its dict form maps without it.)"""
    from lerobot_dali.augment_config import AugmentConfig
    from pipelines import lerobot_policy
    from pipelines.train import read_augment
    from tests.test_augment_lerobot import LEROBOT_DEFAULT

    default = AugmentConfig.from_lerobot(LEROBOT_DEFAULT)
    off = {**LEROBOT_DEFAULT, "enable": False}  # (as a train_config.json of a run without them holds it)
    (tmp_path / "train_config.json").write_text(json.dumps({"dataset": {"repo_id": "x", "image_transforms": off}}))
    (tmp_path / "on.json").write_text(json.dumps(LEROBOT_DEFAULT))
    argv = ["--dataset", "d", "--device", "cpu", "--image-transforms-config"]

    def augment(*args: str) -> AugmentConfig | None:
        return lerobot_policy.policy_augment(lerobot_policy.parse_args([*argv, *args]))

    assert augment(str(tmp_path / "train_config.json")) is None
    assert augment(str(tmp_path / "train_config.json"), "--image-transforms") == default
    assert augment(str(tmp_path / "on.json")) == default
    assert lerobot_policy.policy_augment(lerobot_policy.parse_args(argv[:-1])) is None
    assert read_augment(tmp_path / "on.json") == default
    assert read_augment(tmp_path / "train_config.json") == AugmentConfig()  # (enable: false)

    sharp_only = {**LEROBOT_DEFAULT, "tfs": {"sharpness": LEROBOT_DEFAULT["tfs"]["sharpness"]}}
    (tmp_path / "sharp.json").write_text(json.dumps(sharp_only))
    assert augment(str(tmp_path / "sharp.json")) == AugmentConfig.from_lerobot(sharp_only) != default

    monkeypatch.setattr(lerobot_policy, "train", lambda options: pytest.fail("training started"))
    (tmp_path / "bad.json").write_text(json.dumps({**LEROBOT_DEFAULT, "random_order": True}))
    for name, message in (
        ("bad.json", r"image_transforms\.random_order = true is not supported with 3 transforms per sample"),
        ("missing.json", r"No such file or directory$"),
    ):
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert lerobot_policy.main([*argv, str(tmp_path / name), "--image-transforms"]) == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        expected = rf"lerobot_policy\.py: --image-transforms-config {re.escape(str(tmp_path / name))}: {message}"
        assert len(errors) == 1 and re.match(expected, errors[0]), errors


def test_lerobot_policy_takes_train_pys_cameras_timestamp_source_and_tolerance() -> None:
    """lerobot_policy.py had no --timestamp-source, --tolerance-s or --cameras, so it could not train on cr5_*
    (wall-clock timestamps: frame_index) or gr00t_v20_h264 (a declared camera without files); train.py's own
    definitions now serve both, one value each here (one dataset)."""
    from types import SimpleNamespace

    from pipelines import lerobot_policy

    base = ["--dataset", "d", "--device", "cpu"]
    options = lerobot_policy.parse_args(
        [*base, "--cameras", EGO_VIEW, "--timestamp-source", "frame_index", "--tolerance-s", "0.05"]
    )
    assert (options.cameras, options.timestamp_source, options.tolerance_s) == ((EGO_VIEW,), "frame_index", 0.05)
    options = lerobot_policy.parse_args(base)
    assert (options.cameras, options.timestamp_source, options.tolerance_s) == (None, "parquet_timestamp", None)
    with pytest.raises(ValueError, match=r"--tolerance-s must be a positive finite number of seconds, got -1"):
        lerobot_policy.parse_args([*base, "--tolerance-s", "-1"])
    with pytest.raises(ValueError, match=r"--timestamp-source must be one of 'parquet_timestamp', 'frame_index'"):
        lerobot_policy.PolicyTrainOptions(dataset="d", timestamp_source="wall")
    # The policy LeRobot builds sees the cameras read, not the one declared without files.
    features = {EGO_VIEW: {"dtype": "video"}, "observation.images.egoview": {"dtype": "video"}, "action": {}}
    metadata = SimpleNamespace(info={"features": features}, camera_keys=[EGO_VIEW, "observation.images.egoview"])
    assert list(lerobot_policy.with_cameras(metadata, (EGO_VIEW,)).info["features"]) == [EGO_VIEW, "action"]
    assert len(lerobot_policy.with_cameras(metadata, None).info["features"]) == 2


def test_the_lerobot_policy_pipeline_without_lerobot_is_one_line_saying_where_to_run_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where LeRobot does not import, lerobot_policy.py says so in one line with exit status 2 (it ended in a
    ModuleNotFoundError traceback from deep in its set-up)."""
    from pipelines import lerobot_policy

    monkeypatch.setitem(sys.modules, "lerobot", None)  # (not importable, here and in LeRobot's environment)
    with caplog.at_level(logging.ERROR):
        assert lerobot_policy.main(["--dataset", "d", "--device", "cpu"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [errors[0]] and errors[0].startswith("lerobot_policy.py: LeRobot does not import here"), errors
    assert "pipelines/train.py, which needs no LeRobot" in errors[0]


def test_the_lerobot_policy_pipeline_refuses_a_missing_folder_a_url_and_a_pool_of_no_episodes(tmp_path: Path) -> None:
    """A mistyped folder went to LeRobot as a Hub repo id (the Hub client's traceback), a URL the iterator reads
    failed in LeRobot's metadata, and --episode-pool-size 0 in the iterator: each a traceback. Now
    DatasetNotFoundError (one line under main) and a flag error before anything runs."""
    from lerobot_dali.errors import DatasetNotFoundError
    from pipelines.lerobot_policy import PolicyTrainOptions, dataset_metadata

    with pytest.raises(DatasetNotFoundError, match=r"not found: no such local folder \(.*'no' not in it\)"):
        dataset_metadata(str(tmp_path / "no" / "such"))
    with pytest.raises(DatasetNotFoundError, match=r"not a URL: pass the repo id, or a local copy"):
        dataset_metadata("hf://datasets/user/name")
    with pytest.raises(ValueError, match="--episode-pool-size"):
        PolicyTrainOptions(dataset="d", episode_pool_size=0)


def test_the_lerobot_policy_pipeline_logs_each_line_with_its_rank(tmp_path: Path) -> None:
    """Its lines read 'INFO lerobot_dali.pipelines.lerobot_policy: ...' on every rank, so under torchrun the ranks'
    logs could not be told apart; train.py's carry the time and 'rank{RANK}'."""
    (tmp_path / "latest").write_text("step_00000002")  # refused without --resume: a line logged before lerobot loads
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "3"}
    argv = [str(REPO / "pipelines" / "lerobot_policy.py"), "--dataset", "d", "--checkpoint-dir", str(tmp_path)]
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert result.returncode == 2
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d rank3 lerobot_dali\.pipelines\.lerobot_policy: lerobot_policy\.py: --checkpoint-dir .* "
        r"holds a checkpoint \(step_00000002\).*",
        result.stderr.strip(),
    ), result.stderr


def test_fp16_on_the_cpu_is_refused() -> None:
    """accelerate enables neither autocast nor loss scaling for fp16 on the CPU: the run would be plain fp32."""
    with pytest.raises(ValueError, match="fp16 does nothing on the CPU"):
        TrainOptions(dataset="d", steps=1, device="cpu", mixed_precision="fp16")
    TrainOptions(dataset="d", steps=1, device="cpu", mixed_precision="bf16")


@pytest.mark.parametrize("mixture", [False, True])
def test_resume_ignores_a_stream_file_a_run_of_another_world_size_left(tmp_path: Path, mixture: bool) -> None:
    """A 4-rank run wrote step_N and crashed before 'latest'; a 2-rank run then saved step_N over ranks 0-1 only.
    A 4-rank resume must not take ranks 2-3's positions from the crashed run (nor where the stream state is a
    mixture's, which holds a state per dataset)."""
    from types import SimpleNamespace

    from pipelines.checkpoints import restore_checkpoint

    def stream(world_size: int, consumed: int) -> dict[str, Any]:
        state = {"world_size": world_size, "samples_consumed": consumed}
        if mixture:
            state = {"mixture": {"batch_shares": [2, 2], "anchor": 0}, "datasets": [state, state]}
        return {"step": 8, "world_size": world_size, "stream": state}

    (tmp_path / "state").mkdir()
    for rank in range(2):
        (tmp_path / f"stream_rank{rank}.json").write_text(json.dumps(stream(2, 40)))
    for rank in (2, 3):  # left by the crashed 4-rank run
        (tmp_path / f"stream_rank{rank}.json").write_text(json.dumps(stream(4, 20)))
    accelerator = SimpleNamespace(load_state=lambda path: None)
    for rank in range(4):
        loaded: list[dict[str, Any]] = []
        iterator = SimpleNamespace(rank=rank, world_size=4, load_state_dict=loaded.append)
        assert restore_checkpoint(accelerator, tmp_path, iterator) == 8
        assert loaded == [stream(2, 40)["stream"]], rank


@pytest.mark.parametrize("mixture", [False, True])
def test_a_resume_on_other_ranks_gathers_every_old_ranks_pool_walk(tmp_path: Path, mixture: bool) -> None:
    """Each new rank got one old rank's state and replayed the others' pools from the epoch's start (4.6 s of CPU per
    rank at 95% of an epoch of 92,000 episodes saved on 8 ranks); it now gets all their walks (a mixture's, for each
    dataset; as saved where a rank's file is missing)."""
    from types import SimpleNamespace

    from lerobot_dali.stream_state import SampleStream
    from pipelines.checkpoints import restore_checkpoint

    def state(lengths: np.ndarray, rank: int) -> dict[str, Any]:
        stream = SampleStream(lengths, rank=rank, world_size=2, batch_size=4)
        stream.advance(100)
        return stream.state_dict()

    def walks(stream: dict[str, Any]) -> list[list[int]]:
        parts = stream["datasets"] if mixture else [stream]
        return [[part["walk"]["rank"]] + [w["rank"] for w in part.get("rank_walks", [])] for part in parts]

    (tmp_path / "state").mkdir()
    for rank in range(2):
        stream = state(np.arange(5, 45), rank)
        if mixture:
            parts = [stream, state(np.arange(30), rank)]
            stream = {"mixture": {"batch_shares": [2, 2], "anchor": 0}, "datasets": parts}
        saved = {"step": 8, "rank": rank, "world_size": 2, "stream": stream}
        (tmp_path / f"stream_rank{rank}.json").write_text(json.dumps(saved))
    accelerator = SimpleNamespace(load_state=lambda path: None)
    for world_size in (3, 2):
        for rank in range(world_size):
            loaded: list[dict[str, Any]] = []
            iterator = SimpleNamespace(rank=rank, world_size=world_size, load_state_dict=loaded.append)
            assert restore_checkpoint(accelerator, tmp_path, iterator) == 8
            # (on the same ranks, each its own state)
            assert walks(loaded[0]) == [[0, 1] if world_size == 3 else [rank]] * (2 if mixture else 1)
    (tmp_path / "stream_rank1.json").unlink()
    loaded = []
    restore_checkpoint(accelerator, tmp_path, SimpleNamespace(rank=2, world_size=3, load_state_dict=loaded.append))
    assert walks(loaded[0]) == [[0]] * (2 if mixture else 1)


@pytest.mark.parametrize("mixture", [False, True])
def test_a_resume_on_other_ranks_gathers_no_other_runs_state(tmp_path: Path, mixture: bool) -> None:
    """A rank's file left by another run at the same position (over other episodes; a mixture's of other shares) was
    gathered with the others, and the resume failed on its walk: each rank now resumes as saved."""
    from types import SimpleNamespace

    from lerobot_dali.stream_state import SampleStream
    from pipelines.checkpoints import restore_checkpoint

    def state(rank: int, episodes: str) -> dict[str, Any]:
        stream = SampleStream(np.arange(5, 45), rank=rank, world_size=2, batch_size=4)
        stream.advance(100)
        return stream.state_dict() | {"episodes": episodes}

    (tmp_path / "state").mkdir()
    for rank in range(2):
        stream: dict[str, Any] = state(rank, f"40 episodes, sha256 {rank if not mixture else 0}")
        if mixture:
            stream = {"mixture": {"batch_shares": [2, 2 + rank], "anchor": 0}, "datasets": [stream]}
        saved = {"step": 8, "rank": rank, "world_size": 2, "stream": stream}
        (tmp_path / f"stream_rank{rank}.json").write_text(json.dumps(saved))
    first = json.loads((tmp_path / "stream_rank0.json").read_text())["stream"]
    loaded: list[dict[str, Any]] = []
    iterator = SimpleNamespace(rank=2, world_size=3, load_state_dict=loaded.append)
    assert restore_checkpoint(SimpleNamespace(load_state=lambda path: None), tmp_path, iterator) == 8
    assert loaded == [first]


def test_a_mixture_sharing_no_camera_is_refused(make_ds: Callable[..., Path]) -> None:
    """Without a shared camera the mixture leaves every camera out (with a warning): the policy would see none."""
    from pipelines.train import open_readers

    video = make_ds(**{**EVEN, "cameras": 1})
    image = make_ds(**{**EVEN, "cameras": 1, "image_cameras": True})  # the same key, stored as images: shared
    readers = open_readers(TrainOptions(dataset=(str(video), str(image)), steps=1))
    assert [r.all_camera_keys for r in readers] == [("observation.images.cam0",)] * 2
    with pytest.raises(ValueError, match="share no camera key"):
        open_readers(TrainOptions(dataset=(str(video), str(make_ds(**{**EVEN, "cameras": 0}))), steps=1))


def test_rename_map_mixes_datasets_whose_cameras_differ_in_name(make_ds: Callable[..., Path], tmp_path: Path) -> None:
    """The second dataset's cam1 takes the first's camera name, cam0 (one map per dataset), or both datasets' cam0
    is named side (one map for all, each renaming what it has); the policy and the iterator see the batch names."""
    from pipelines.train import build_policy, dataset_renames, open_readers

    one, two = str(make_ds(**{**EVEN, "cameras": 1})), str(make_ds(**{**EVEN, "seed": 1}))
    cam0, cam1, side = "observation.images.cam0", "observation.images.cam1", "observation.images.side"
    swap = json.dumps({cam1: cam0, cam0: side})
    base = ["--dataset", one, two, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--batch-size", "4"]
    options = parse_args([*base, "--rename-map", "{}", swap])
    readers = open_readers(options)
    assert [r.all_camera_keys for r in readers] == [(cam0,), (cam1,)]  # each its own name for the shared camera
    renames = dataset_renames(options, readers)
    assert [dict(r.to_batch) for r in renames] == [{}, {cam1: cam0}]  # (side: left out, so renamed in none)
    plan = data_plan(options, fps=10, camera_keys=[cam0])
    mix = build_iterator(readers, plan, options, device="cpu", rank=0, world_size=1)
    policy = build_policy(readers, plan, mix.camera_channels, mix.batch_shares, renames)
    assert policy.config.camera_keys == (cam0,) and mix.datasets[1].reader.all_camera_keys == (cam1,)
    batch = next(iter(mix))
    assert [k for k in batch if k.startswith("observation.images.")] == [cam0]
    assert torch.isfinite(policy(batch)).all()
    mix.close()

    _train([*COMMON, *base[:3], "--steps", "2", "--batch-size", "4", "--rename-map", json.dumps({cam0: side}),
            "--record", str(tmp_path / "rec")])  # fmt: skip
    one_for_all = _records(tmp_path / "rec", 1)[0]["batch_shapes"]
    assert one_for_all[side] == [4, 3, 64, 64] and cam0 not in one_for_all and cam1 not in one_for_all
    for argv, match in (
        ([*base[:2], "--steps", "1", "--rename-map", "{}"], "needs two datasets or more"),
        ([*base, "--rename-map", "{}", "{}", "{}"], r"--rename-map takes one value, or one per --dataset \(2\)"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_args(argv)
    for maps, match in (
        ([json.dumps({cam1: side}), "{}"], rf"{one}: rename_map renames \['{cam1}'\], which it does not read"),
        ([json.dumps({"observation.images.top": side})], r"renames \['observation.images.top'\], which none of"),
    ):
        with pytest.raises(ValueError, match=match):
            open_readers(parse_args([*base, "--rename-map", *maps]))
    with pytest.raises(SystemExit):
        parse_args([*base, "--rename-map", "[1]"])


def test_a_rename_map_naming_an_empty_name_is_refused_with_the_flags(
    make_ds: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--rename-map '{"cam0": ""}' (or ' ', or an empty key) was taken, and ended in a TypeError's traceback once the
    datasets were opened; it is refused as the flags are read (status 2, one line naming the flag and the entry),
    and so is TrainOptions given such a map in code (ValueError)."""
    from pipelines import train as train_module

    one, two = str(make_ds(**EVEN)), str(make_ds(**{**EVEN, "seed": 1}))
    argv = ["--dataset", one, two, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--batch-size", "4"]
    for rename_map in ({"observation.images.cam0": ""}, {"observation.images.cam0": " "}, {"": "action"}):
        with pytest.raises(SystemExit) as exited:
            train_module.main([*argv, "--rename-map", json.dumps(rename_map)])
        assert exited.value.code == 2
        with pytest.raises(
            ValueError, match=re.escape(f"--rename-map: rename_map has entries with an empty name, {rename_map}")
        ):
            TrainOptions(dataset=(one, two), steps=1, rename_map=({}, rename_map))


def test_a_rename_map_onto_a_name_the_dataset_has_is_one_line_naming_the_flag(
    make_ds: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A --rename-map that gives a key a name another key has is a flag's mistake: one line naming the flag, exit
    status 2 (it was a ValueError's traceback on every rank)."""
    from pipelines import train as train_module

    one, two = str(make_ds(**EVEN)), str(make_ds(**{**EVEN, "seed": 1}))
    argv = ["--dataset", one, two, "--steps", "1", "--device", "cpu", "--num-workers", "0", "--batch-size", "4"]
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*argv, "--rename-map", json.dumps({"observation.state": "action"})]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert re.fullmatch(rf"train\.py: --rename-map: {one}: rename_map gives \['action'\] to a key .*", errors[0])


def test_mixture_options_and_pooled_statistics() -> None:
    from pipelines.train import pooled_stats

    with pytest.raises(ValueError, match="--weights takes one weight per --dataset"):
        TrainOptions(dataset="d", steps=1, weights=(1.0,))
    with pytest.raises(ValueError, match="--weights takes one weight per --dataset"):
        TrainOptions(dataset=("a", "b"), steps=1, weights=(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="--episodes selects episodes of one dataset"):
        TrainOptions(dataset=("a", "b"), steps=1, episodes=(0,))
    options = parse_args(["--dataset", "a", "b", "--weights", "3", "1", "--steps", "1"])
    assert options.datasets == ("a", "b") and options.weights == (3.0, 1.0)
    assert parse_args(["--dataset", "a", "--steps", "1"]).dataset == "a"
    # Mixing N(0, 1) and N(4, 3) 3:1 by hand: mean 1, variance E[x^2] - 1 = 3/4 * (1 + 0) + 1/4 * (9 + 16) - 1 = 6.
    pooled = pooled_stats([FeatureStats(mean=(0.0,), std=(1.0,)), FeatureStats(mean=(4.0,), std=(3.0,))], [3, 1])
    assert pooled.mean == pytest.approx((1.0,)) and pooled.std == pytest.approx((math.sqrt(6),))


def test_resume_with_other_windows_fails_naming_them_before_the_model_loads(tmp_path: Path) -> None:
    """Other windows or image size made the model's shapes fail inside load_state_dict, or, where the shapes
    agreed, resumed silently; other episodes failed there too instead of in the stream's own check."""
    from types import SimpleNamespace

    from pipelines.checkpoints import restore_checkpoint
    from pipelines.train import DataPlan, data_signature

    def plan(chunk: int, image_size: tuple[int, int] | None) -> DataPlan:
        deltas = {"action": [i / 10 for i in range(chunk)]}
        windows = dict(chunk=chunk, camera_steps=None, state_steps=None)
        return DataPlan(delta_timestamps=deltas, image_size=image_size, augment=None, **windows)

    saved = data_signature(plan(10, (96, 128)), ["cam"])
    (tmp_path / "stream_rank0.json").write_text(json.dumps({"step": 8, "stream": {}, "data": saved}))
    loaded: list[str] = []
    accelerator = SimpleNamespace(load_state=lambda path: loaded.append("model"))
    iterator = SimpleNamespace(rank=0, load_state_dict=lambda state: loaded.append("stream"))
    with pytest.raises(
        ValueError, match=r"other delta_timestamps, image_size \(delta_timestamps: saved .*; image_size"
    ):
        restore_checkpoint(accelerator, tmp_path, iterator, data_signature(plan(5, (224, 224)), ["cam"]))
    assert loaded == []
    assert restore_checkpoint(accelerator, tmp_path, iterator, data_signature(plan(10, (96, 128)), ["cam"])) == 8
    assert loaded == ["stream", "model"]  # the data side first: its errors name episodes, not tensor shapes
    later = {**data_signature(plan(10, (96, 128)), ["cam"]), "later": "jitter"}  # a key a later version adds
    assert restore_checkpoint(accelerator, tmp_path, iterator, later) == 8

    def other_episodes(state: dict) -> None:
        raise ResumeStateError("saved over other episodes")

    loaded.clear()
    with pytest.raises(ResumeStateError):
        restore_checkpoint(accelerator, tmp_path, SimpleNamespace(rank=0, load_state_dict=other_episodes), saved)
    assert loaded == []


def test_resume_with_other_windows_says_only_what_differs_and_long_windows_cut(tmp_path: Path) -> None:
    """The refusal said both signatures' values whole: --chunk 20 on a checkpoint of ACT's 30-step action window
    (30 fps) was every offset at 17 digits, the state window both share said twice too (~850 characters); the
    user had to find the difference. Now the windows that differ alone, floats to 6 digits, long ones cut."""
    from types import SimpleNamespace

    from pipelines.checkpoints import restore_checkpoint
    from pipelines.train import DataPlan, data_signature

    def signature(chunk: int) -> dict[str, Any]:
        deltas = {"observation.state": [-1 / 30, 0.0], "action": [i / 30 for i in range(chunk)]}
        windows = dict(chunk=chunk, camera_steps=None, state_steps=2)
        return data_signature(DataPlan(delta_timestamps=deltas, image_size=None, augment=None, **windows), ["cam"])

    (tmp_path / "stream_rank0.json").write_text(json.dumps({"step": 8, "stream": {}, "data": signature(30)}))
    iterator = SimpleNamespace(rank=0, load_state_dict=lambda state: None)
    with pytest.raises(ValueError) as refused:
        restore_checkpoint(SimpleNamespace(load_state=lambda path: None), tmp_path, iterator, signature(20))
    assert str(refused.value) == (
        f"{tmp_path} was trained with other delta_timestamps (delta_timestamps: saved {{'action': [0, 0.0333333, "
        "0.0666667, ..., 0.966667] (30 values)}, now {'action': [0, 0.0333333, 0.0666667, ..., 0.633333] (20 "
        "values)}): resume with the same --recipe, --chunk, --image-size, --cameras and --augment, or start in a new "
        "--checkpoint-dir"
    )


def test_resume_with_other_augmentation_fails_naming_it_and_an_old_checkpoint_resumes(tmp_path: Path) -> None:
    """A resume with another --augment (or recipe [augment]) was accepted, the run silently augmenting otherwise
    than the uninterrupted one (torchrun, 2 ranks: --augment a.json, resumed with b.json, exit 0). The same
    augmentation given as a LeRobot JSON or a TOML, or one that augments nothing, resumes; so does a checkpoint
    written before the augmentation was recorded."""
    from types import SimpleNamespace

    from lerobot_dali.augment_config import AugmentConfig
    from pipelines.checkpoints import restore_checkpoint
    from pipelines.train import DataPlan, data_signature, read_augment

    def signature(augment: AugmentConfig | None) -> dict[str, Any]:
        windows = dict(chunk=2, camera_steps=None, state_steps=None)
        plan = DataPlan(delta_timestamps={"action": [0.0, 0.1]}, image_size=None, augment=augment, **windows)
        return data_signature(plan, ["cam"])

    tfs = {"sharpness": {"type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}}}
    (tmp_path / "lerobot.json").write_text(json.dumps({"dataset": {"image_transforms": {"enable": True, "tfs": tfs}}}))
    (tmp_path / "same.toml").write_text("[sharpness]\nfactor = [0.5, 1.5]\n")
    (tmp_path / "other.toml").write_text("[sharpness]\nfactor = [0.2, 1.5]\n")
    (tmp_path / "off.json").write_text(json.dumps({"enable": False, "tfs": tfs}))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    accelerator = SimpleNamespace(load_state=lambda path: None)
    iterator = SimpleNamespace(rank=0, load_state_dict=lambda state: None)

    def resume(saved: dict[str, Any], now: AugmentConfig | None) -> int:
        (ckpt / "stream_rank0.json").write_text(json.dumps({"step": 4, "stream": {}, "data": saved}))
        return restore_checkpoint(accelerator, ckpt, iterator, signature(now))

    saved = signature(read_augment(tmp_path / "lerobot.json"))
    assert saved["augment"] == {"sharpness": {"factor": [0.5, 1.5]}, "shared_across_cameras": False}
    with pytest.raises(ValueError, match=r"other augment \(augment: saved .*0\.5.*now .*0\.2.*--augment"):
        resume(saved, read_augment(tmp_path / "other.toml"))
    with pytest.raises(ValueError, match=r"other augment \(augment: saved .*, now None\)"):
        resume(saved, None)
    assert resume(saved, read_augment(tmp_path / "same.toml")) == 4
    assert resume(signature(None), read_augment(tmp_path / "off.json")) == 4  # augments nothing: as none
    old = {k: v for k, v in saved.items() if k != "augment"}  # written before the augmentation was recorded
    assert resume(old, read_augment(tmp_path / "other.toml")) == 4


def test_device_cuda_without_a_gpu_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """accelerate quietly picked the CPU, and the run trained there at exit status 0. Then the refusal was a
    traceback on every rank (``--device cuda`` is the default, so every run without a GPU and the flag met it); it is
    one line, exit status 2, in both pipelines."""
    from pipelines import lerobot_policy
    from pipelines import train as train_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(CudaUnavailableError, match="--device cuda but torch .* sees no CUDA GPU: .* pass --device cpu"):
        train_module.make_accelerator("cuda")
    with caplog.at_level(logging.ERROR):
        assert train_module.main(["--dataset", str(tmp_path), "--steps", "1"]) == 2
        assert lerobot_policy.main(["--dataset", str(tmp_path)]) == 2
    errors = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]
    assert [name for name, _ in errors] == ["pipelines.train", "lerobot_dali.pipelines.lerobot_policy"], errors
    for _, message in errors:
        assert re.fullmatch(r"(train|lerobot_policy)\.py: --device cuda but torch .* sees no CUDA GPU: .*", message)


def _trains_nothing(monkeypatch, *scripts) -> list[object]:
    """The training ``scripts`` (pipelines' modules) start no training: their ``train(config)`` calls are listed."""
    started: list[object] = []
    for script in scripts:
        monkeypatch.setattr(script, "train", started.append)
    return started


@pytest.mark.parametrize("latest", ["step_00000009", "../../etc", "", None, "-> nowhere"])
def test_a_resume_from_a_latest_that_names_no_checkpoint_is_one_line_before_the_dataset_opens(
    latest: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 'latest' naming a step folder that is not there (deleted, or never written), one outside the folder, an empty
    one, or a folder named 'latest' were each a traceback once the dataset had opened (FileNotFoundError; with no
    --resume, the folder an IsADirectoryError at the first save, the training lost); a link to nothing was taken for
    no checkpoint (--resume started from step 0, and without it the first save replaced the run's). One line now,
    before the dataset opens, for both scripts (lerobot_policy.py's checkpoints are train.py's)."""
    from pipelines import lerobot_policy
    from pipelines import train as train_module

    started = _trains_nothing(monkeypatch, train_module, lerobot_policy)
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000001").mkdir(parents=True)
    (ckpt / "step_00000001" / "stream_rank0.json").write_text("{}")
    if latest is None:
        (ckpt / "latest").mkdir()
    elif latest == "-> nowhere":
        (ckpt / "latest").symlink_to(tmp_path / "nowhere")
    else:
        (ckpt / "latest").write_text(latest)
    said = "is not a file" if latest in (None, "-> nowhere") else f"names {latest!r}, no checkpoint there"
    args = ["--dataset", "d", "--device", "cpu", "--checkpoint-dir", str(ckpt), "--resume"]
    for main, program in ((train_module.main, "train.py"), (lerobot_policy.main, "lerobot_policy.py")):
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert main([*args, "--steps", "1"]) == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"{program}: --checkpoint-dir {ckpt}: its 'latest' {said} (a step_NNNNNNNN folder with stream_rank0.json): "
            "write the name of a complete checkpoint of it there, or give a new --checkpoint-dir"
        ]
    assert not started
    caplog.clear()
    with caplog.at_level(logging.ERROR):  # (without --resume: refused as a checkpoint a run from step 0 would replace)
        assert train_module.main([*args[:-1], "--steps", "1"]) == 2
    assert "holds a checkpoint" in caplog.records[0].getMessage() and not started


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{broken", "JSONDecodeError: Expecting property name"),
        ("[1, 2]", "ValueError: not a stream file"),
        ('{"step": "two", "stream": {}}', "ValueError: not a stream file"),
        ('{"step": 2}', "ValueError: not a stream file"),
        (b"\xff\xfe", "UnicodeDecodeError"),
        ('{"step": 2, "stream": {}, "data": "x"}', "ValueError: not a stream file"),  # (AttributeError tracebacks)
        ('{"step": 2, "stream": {}, "data": [1]}', "ValueError: not a stream file"),
        ('{"step": -3, "stream": {}}', "ValueError: not a stream file"),  # (resumed at step -3)
        ('{"step": 3, "stream": {}}', "ValueError: its step 3 is not its folder's (step_00000002)"),  # (resumed at 3)
    ],
)
def test_a_damaged_stream_file_is_refused_naming_it(text: str | bytes, said: str, tmp_path: Path) -> None:
    """A stream file cut short or edited was a JSONDecodeError, KeyError, AttributeError or ValueError traceback
    from restore_checkpoint; a RunRefused (one line under main) naming the file and what to do now."""
    from types import SimpleNamespace

    from pipelines.checkpoints import restore_checkpoint
    from pipelines.run_errors import RunRefused

    step = tmp_path / "step_00000002"
    step.mkdir()
    path = step / "stream_rank0.json"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    iterator = SimpleNamespace(rank=0, world_size=1, load_state_dict=lambda state: None)
    with pytest.raises(RunRefused) as refused:
        restore_checkpoint(SimpleNamespace(load_state=lambda path: None), step, iterator)
    assert str(refused.value).startswith(f"{path} cannot be read ({said}"), refused.value
    assert str(refused.value).endswith(
        f"the checkpoint is damaged or not this script's; resume from an earlier one (write its folder's name into "
        f"{tmp_path / 'latest'}) or give a new --checkpoint-dir"
    )


def test_a_damaged_model_state_is_refused_naming_it(tmp_path: Path) -> None:
    """accelerate's state folder missing, or its model file cut short, was a ValueError, FileNotFoundError or
    SafetensorError traceback once the iterator had been built; a RunRefused naming the folder now."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from pipelines.checkpoints import restore_checkpoint
    from pipelines.run_errors import RunRefused

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = tmp_path / "step_00000002"
    accelerator.save_state(str(step / "state"))
    (step / "stream_rank0.json").write_text(json.dumps({"step": 2, "world_size": 1, "stream": {}}))
    iterator = SimpleNamespace(rank=0, world_size=1, load_state_dict=lambda state: None)
    assert restore_checkpoint(accelerator, step, iterator) == 2
    for damage, said in (  # (each on top of the last)
        (lambda: (step / "state" / "optimizer.bin").write_bytes(b"not a pickle"), "UnpicklingError: "),  # (tracebacks)
        (lambda: (step / "state" / "optimizer.bin").write_bytes(b""), "EOFError: "),
        (lambda: (step / "state" / "model.safetensors").write_bytes(b""), "SafetensorError: "),
        (lambda: (step / "state" / "model.safetensors").unlink(), "FileNotFoundError: "),
        (lambda: shutil.rmtree(step / "state"), "ValueError: Tried to find"),
    ):
        damage()
        with pytest.raises(RunRefused, match=re.escape(f"{step / 'state'} cannot be read ({said}")):
            restore_checkpoint(accelerator, step, iterator)


def test_an_output_inside_the_dataset_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """--checkpoint-dir or --record inside the (local) dataset, or the dataset itself, wrote checkpoints and records
    into it, to be copied and uploaded with it (lerobot-dali reencode refused its copy there already); so did
    lerobot_policy.py's --checkpoint-dir and --output-dir. Refused now before anything runs, links followed."""
    from pipelines import lerobot_policy
    from pipelines import train as train_module

    started = _trains_nothing(monkeypatch, train_module, lerobot_policy)
    dataset = tmp_path / "ds"
    (dataset / "meta").mkdir(parents=True)
    (tmp_path / "link").symlink_to(dataset)
    other = tmp_path / "other"
    other.mkdir()
    runs = [
        (train_module.main, "train.py", ["--dataset", str(dataset), "--steps", "1"], flag, folder)
        for flag in ("--checkpoint-dir", "--record")
        for folder in (dataset, dataset / "ckpt", tmp_path / "link" / "ckpt")
    ]
    runs += [
        (
            train_module.main,
            "train.py",
            ["--dataset", str(other), str(dataset), "--steps", "1"],
            "--record",
            dataset / "r",
        )
    ]
    runs += [
        (lerobot_policy.main, "lerobot_policy.py", ["--dataset", str(dataset)], flag, dataset / "out")
        for flag in ("--checkpoint-dir", "--output-dir")
    ]
    for main, program, argv, flag, folder in runs:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert main([*argv, "--device", "cpu", flag, str(folder)]) == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"{program}: {flag} {folder} is inside the dataset {dataset}: give a folder outside the dataset"
        ]
    assert not started and sorted(p.name for p in dataset.iterdir()) == ["meta"]
    assert train_module.main(["--dataset", str(dataset), "--steps", "1", "--checkpoint-dir", str(other / "c")]) == 0
    assert len(started) == 1  # (beside the dataset: taken)


def test_an_output_inside_another_dataset_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Outputs inside a local dataset the run does not train on (its root, a folder below, a link into it) wrote
    checkpoints, records or the policy there, to be uploaded with it: 4 of 4 taken. Refused now, as inside the
    trained one."""
    from pipelines import lerobot_policy
    from pipelines import train as train_module

    started = _trains_nothing(monkeypatch, train_module, lerobot_policy)
    other = tmp_path / "other"
    (other / "meta").mkdir(parents=True)
    (other / "meta" / "info.json").write_text("{}")
    (tmp_path / "link").symlink_to(other)
    runs = [
        (train_module.main, "train.py", ["--steps", "1"], "--checkpoint-dir", other),
        (train_module.main, "train.py", ["--steps", "1"], "--record", other / "r"),
        (lerobot_policy.main, "lerobot_policy.py", [], "--checkpoint-dir", tmp_path / "link" / "c"),
        (lerobot_policy.main, "lerobot_policy.py", [], "--output-dir", other / "meta" / "policy"),
    ]
    for main, program, argv, flag, folder in runs:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert main(["--dataset", "d", *argv, "--device", "cpu", flag, str(folder)]) == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"{program}: {flag} {folder} is inside the dataset {other}: give a folder outside the dataset"
        ]
    assert not started and sorted(str(p.relative_to(other)) for p in other.rglob("*")) == ["meta", "meta/info.json"]


class _SavesFiles:
    """A stand-in for a LeRobot policy or processor: ``save_pretrained`` writes ``files``, then raises ``fails``."""

    def __init__(self, files: dict[str, str], fails: BaseException | None = None) -> None:
        self.files, self.fails = files, fails

    def save_pretrained(self, folder: Path) -> None:
        for name, text in self.files.items():
            (Path(folder) / name).write_text(text)
        if self.fails is not None:
            raise self.fails


def _folder_files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_lerobot_policys_output_dir_holds_one_whole_policy_after_a_save_killed_half_way(tmp_path: Path) -> None:
    """lerobot_policy.py wrote --output-dir in place: a run killed after the policy's files and before its
    preprocessor's (or during the weights) left a folder LeRobot loads as a policy, its config and weights one run's
    and its preprocessor another's (3 of 3 files written, 1 of them stale). The save is staged beside it and renamed
    in whole now: after a save interrupted half-way, --output-dir holds the last run's policy, file for file."""
    from pipelines.lerobot_policy import check_output_dir, save_policy

    out = tmp_path / "policy"
    first = {"config.json": "c1", "model.safetensors": "w1", "policy_preprocessor.json": "p1"}
    save_policy(
        out,
        _SavesFiles({"config.json": "c1", "model.safetensors": "w1"}),
        _SavesFiles({"policy_preprocessor.json": "p1"}),
    )
    assert _folder_files(out) == first
    policy = _SavesFiles({"config.json": "c2", "model.safetensors": "w2"})
    with pytest.raises(KeyboardInterrupt):  # (a Ctrl-C in the preprocessor's save)
        save_policy(out, policy, _SavesFiles({"policy_preprocessor.json": "p2"}, fails=KeyboardInterrupt()))
    assert _folder_files(out) == first and [p.name for p in tmp_path.iterdir()] == ["policy"]
    with pytest.raises(OSError):  # (a full disk in the weights)
        save_policy(out, _SavesFiles({"config.json": "c3"}, fails=OSError(28, "No space left")), policy)
    assert _folder_files(out) == first and [p.name for p in tmp_path.iterdir()] == ["policy"]
    (tmp_path / ".policy.partial").mkdir()  # left by a run killed outright (SIGKILL) in its save
    (tmp_path / ".policy.partial" / "model.safetensors").write_text("cut short")
    save_policy(out, policy, _SavesFiles({"policy_preprocessor.json": "p2"}))
    assert _folder_files(out) == {"config.json": "c2", "model.safetensors": "w2", "policy_preprocessor.json": "p2"}
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]
    (tmp_path / "here").mkdir()
    with pytest.MonkeyPatch.context() as patch:  # ('--output-dir .' in an empty folder: '.' has no name beside it)
        patch.chdir(tmp_path / "here")
        check_output_dir(Path("."))
        save_policy(Path("."), policy, _SavesFiles({}))
    assert _folder_files(tmp_path / "here") == {"config.json": "c2", "model.safetensors": "w2"}


def test_lerobot_policys_output_dir_holding_the_checkpoints_or_the_dataset_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """--checkpoint-dir inside --output-dir (LeRobot's own layout: outputs/<run>/checkpoints) or the dataset inside it:
    the trained policy replaced --output-dir whole, deleting the run's checkpoints (or the dataset) once saved (2 of 2
    taken, and the first run's checkpoints gone after its save). Refused now, in one line, before training; a Hub id
    that happens to name no folder here is no folder inside it."""
    from pipelines import lerobot_policy

    started = _trains_nothing(monkeypatch, lerobot_policy)
    out = tmp_path / "run"
    dataset = out / "ds"
    for argv, flag, folder in (
        (["--dataset", "d", "--checkpoint-dir", str(out / "checkpoints")], "--checkpoint-dir", out / "checkpoints"),
        (["--dataset", str(dataset)], "--dataset", dataset),
    ):
        if flag == "--dataset":  # (beside a policy saved before, which the next replaces whole)
            (dataset / "meta").mkdir(parents=True)
            for name in ("config.json", "model.safetensors"):
                (out / name).write_text("saved")
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert lerobot_policy.main([*argv, "--device", "cpu", "--output-dir", str(out)]) == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"lerobot_policy.py: {flag} {folder} is inside --output-dir {out}, which the trained policy replaces "
            f"whole, deleting it: give --output-dir a folder of its own (beside it: {tmp_path / 'policy'})"
        ]
    assert not started
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert lerobot_policy.main(["--dataset", "user/name", "--device", "cpu", "--output-dir", "."]) == 0
    assert len(started) == 1


def test_lerobot_policys_output_dir_a_link_keeps_the_link_and_saves_again(tmp_path: Path) -> None:
    """--output-dir a symbolic link to a folder: the save replaced the link itself with a folder (the policy not where
    it led, a '.link.replaced' link left beside), and every later save failed with NotADirectoryError once trained
    (2 of 2 saves after the first: the policy lost). The folder it leads to is replaced now, the link kept."""
    from pipelines.lerobot_policy import check_output_dir, save_policy

    (tmp_path / "runs" / "real").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "runs" / "real")
    for run in range(3):
        check_output_dir(link)
        save_policy(link, _SavesFiles({"config.json": f"c{run}", "model.safetensors": f"w{run}"}), _SavesFiles({}))
        assert link.is_symlink() and _folder_files(tmp_path / "runs" / "real") == {
            "config.json": f"c{run}",
            "model.safetensors": f"w{run}",
        }
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "runs"]
        assert [p.name for p in (tmp_path / "runs").iterdir()] == ["real"]


def test_lerobot_policys_output_dir_of_other_files_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The trained policy replaces --output-dir whole, so a folder of other files (a home folder, a project) would be
    deleted with it: refused before training, in one line. A new folder, an empty one and one a run saved a policy to
    are taken."""
    from pipelines import lerobot_policy

    started = _trains_nothing(monkeypatch, lerobot_policy)
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    (other / "config.json").write_text("{}")  # (a config without weights: not a policy)
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--output-dir", str(other)]) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"lerobot_policy.py: --output-dir {other} holds files and no saved policy (config.json and "
        "model.safetensors): the trained policy replaces the folder whole; give a new or empty folder, or one a run "
        "saved a policy to"
    ]
    assert not started and _folder_files(other) == {"config.json": "{}", "notes.txt": "mine"}
    saved = tmp_path / "saved"
    lerobot_policy.save_policy(saved, _SavesFiles({"config.json": "c", "model.safetensors": "w"}), _SavesFiles({}))
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "new", tmp_path / "empty", saved):
        assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--output-dir", str(folder)]) == 0
    assert len(started) == 3


def test_lerobot_policys_output_dir_keeps_the_users_files_beside_a_saved_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """--output-dir holding a policy saved before and a user's own files (notes, a folder of configs): the check took
    it, and the trained policy replaced the folder whole, deleting them (2 of 2 entries lost). Refused before training
    now, naming them; and files put there while the run trained are kept by the save (hard links), while the last
    policy's files go (a stale step file of its preprocessor: replaced, not kept)."""
    from pipelines import lerobot_policy

    started = _trains_nothing(monkeypatch, lerobot_policy)
    out = tmp_path / "policy"
    old = _SavesFiles({"config.json": "c1", "model.safetensors": "w1"})
    lerobot_policy.save_policy(out, old, _SavesFiles({"policy_preprocessor_step_3_normalizer.safetensors": "s1"}))
    (out / "notes.txt").write_text("mine")
    (out / "configs").mkdir()
    (out / "configs" / "run.yaml").write_text("lr: 1")
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert lerobot_policy.main(["--dataset", "d", "--device", "cpu", "--output-dir", str(out)]) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"lerobot_policy.py: --output-dir {out} holds configs, notes.txt beside a saved policy: the trained policy "
        "replaces the folder whole, which would delete them; move them out of it, or give another folder"
    ]
    assert not started
    new = _SavesFiles({"config.json": "c2", "model.safetensors": "w2"})
    lerobot_policy.save_policy(out, new, _SavesFiles({"policy_preprocessor.json": "p2"}))  # (put there meanwhile)
    assert _folder_files(out / "configs") == {"run.yaml": "lr: 1"}
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "configs", "model.safetensors", "notes.txt", "policy_preprocessor.json"
    ]  # fmt: skip
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").read_text() == "w2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


@pytest.mark.parametrize("pattern", ["data/*/*.parquet", "videos/*/*/*.mp4", "meta/stats.json"])
def test_a_dataset_file_this_user_may_not_read_is_one_line_naming_it(
    pattern: str,
    make_ds: Callable[..., Path],
    copy_ds: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A data file, a video file or meta/stats.json the user may not read (its permissions; measured with them really
    refused on cr5_v30_av1) was a PermissionError traceback from train.py's set-up (3 of 3); one line now, naming the
    file, and exit status 2."""
    from pipelines import train as train_module

    dataset = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, episodes_per_file=1))
    refused = sorted(dataset.glob(pattern))[-1]
    refuse_opening(monkeypatch, refused)
    argv = ["--dataset", str(dataset), "--steps", "1", "--batch-size", "2", "--device", "cpu", "--num-workers", "0"]
    with caplog.at_level(logging.ERROR):
        assert train_module.main(argv) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"train.py: PermissionError: [Errno 13] Permission denied: '{refused}': give this user access to it and the "
        "folders above it"
    ]


def test_a_batch_larger_than_the_dataset_is_refused_before_the_pipeline_is_built(
    make_ds: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A --batch-size larger than the dataset's frames was refused at the first batch, once DALI's pipeline and
    workers had started; past 2**31 DALI's pipeline took it for no int (a TypeError traceback). Refused before the
    iterator is built now, with the words of the refusal at the first batch."""
    from pipelines import train as train_module

    def built(*args: object, **kwargs: object) -> None:
        pytest.fail("the iterator was built")

    monkeypatch.setattr(train_module, "build_iterator", built)
    args = [*COMMON, "--dataset", str(make_ds(**UNEVEN)), "--steps", "1", "--num-workers", "0"]
    for batch in (131, 99999999999999):  # (130 frames)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            assert train_module.main([*args, "--batch-size", str(batch)]) == 2
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"train.py: rank 0 gets no full batch of {batch} from an epoch; lower --batch-size or use a dataset with "
            "more frames per rank"
        ]


def test_a_batch_larger_than_a_ranks_epoch_is_refused_before_the_pipeline_starts(
    make_ds: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A --batch-size within the dataset's frames but larger than a rank's share of them (torchrun, 2 ranks: 120
    frames each of 240, --batch-size 200) was refused at the first batch, once DALI's pipeline and workers had started
    (seconds, on every rank), without the count the iterator knew when it was built. Refused once the iterator is
    built now, naming the rank's samples in an epoch."""
    from pipelines import train as train_module

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("the pipeline was started")

    monkeypatch.setattr(train_module, "epoch_batches", started)
    monkeypatch.setattr(train_module, "data_rank", lambda accelerator: (1, 2))  # (rank 1 of 2, in this process)
    args = [*COMMON, "--dataset", str(make_ds(**EVEN)), "--steps", "1", "--num-workers", "0"]
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*args, "--batch-size", "61"]) == 2  # (120 frames: 60 a rank)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "train.py: rank 1 gets no full batch of 61 from an epoch of 60 samples; lower --batch-size or use a dataset "
        "with more frames per rank"
    ]


@pytest.mark.parametrize(("samples", "said"), [(1, " of 1 sample"), (2, " of 2 samples"), (None, "")])
def test_a_refused_batch_counts_the_ranks_samples_in_words_that_fit(samples: int | None, said: str) -> None:
    """A rank whose epoch holds one sample was refused 'from an epoch of 1 samples'."""
    from pipelines.train import no_full_batch

    assert str(no_full_batch(3, 4, samples)) == (
        f"rank 3 gets no full batch of 4 from an epoch{said}; lower --batch-size or use a dataset with more frames "
        "per rank"
    )


def test_decode_gpu_on_the_cpu_is_a_flag_error() -> None:
    """--decode gpu --device cpu was the iterator's ValueError traceback once the dataset had opened."""
    from pipelines.lerobot_policy import PolicyTrainOptions

    said = "--decode gpu decodes on the GPU's NVDEC, which needs --device cuda; with --device cpu use auto or cpu"
    with pytest.raises(ValueError, match=re.escape(said)):
        TrainOptions(dataset="d", steps=1, device="cpu", decode="gpu")
    with pytest.raises(ValueError, match=re.escape(said)):
        PolicyTrainOptions(dataset="d", device="cpu", decode="GPU")
    assert TrainOptions(dataset="d", steps=1, device="cpu", decode="cpu").decode == "cpu"


def test_a_run_that_fails_before_training_leaves_no_checkpoint_dir_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--checkpoint-dir was made while the flags were checked, so a run refused next (--device cuda without a GPU, a
    dataset that is not there) left it behind empty, with its parents; one under a folder that cannot be written
    was refused as "[Errno 2] No such file or directory", naming no flag. The first save makes it now."""
    from pipelines import lerobot_policy
    from pipelines import train as train_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    ckpt = tmp_path / "runs" / "ckpt"
    missing = ["--dataset", str(tmp_path / "no-dataset")]
    with caplog.at_level(logging.ERROR):
        for argv in ([], ["--device", "cpu"]):  # (no GPU; no dataset)
            assert train_module.main([*missing, *argv, "--steps", "1", "--checkpoint-dir", str(ckpt)]) == 2
        assert lerobot_policy.main([*missing, "--checkpoint-dir", str(ckpt)]) == 2
    said = [r.getMessage().split(": ")[1].split(" (")[0] for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == ["--device cuda but torch", "DatasetNotFoundError", "--device cuda but torch"], said
    assert list(tmp_path.iterdir()) == []
    unwritable = Path("/proc/1")  # (not writable, even by root)
    if unwritable.is_dir() and not os.access(unwritable, os.W_OK):
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert (
                train_module.main([*missing, "--device", "cpu", "--steps", "1", "--checkpoint-dir", "/proc/1/c"]) == 2
            )
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            "train.py: --checkpoint-dir /proc/1/c: /proc/1 is not writable; give a folder this user may write"
        ]


def test_the_lerobot_policy_pipeline_reads_policy_fields_as_json() -> None:
    """``pipelines/lerobot_policy.py`` parses without LeRobot (it imports LeRobot only to train)."""
    from pipelines.lerobot_policy import parse_args

    options = parse_args(
        ["--dataset", "d", "--policy", "diffusion", "--policy-arg", "horizon=16", "--policy-arg", "crop_shape=null",
         "--policy-arg", "down_dims=[32, 64]", "--policy-arg", "vision_backbone=resnet34", "--device", "cpu"]
    )  # fmt: skip
    assert (options.policy, options.device) == ("diffusion", "cpu")
    expected = {"horizon": 16, "crop_shape": None, "down_dims": [32, 64], "vision_backbone": "resnet34"}
    assert options.policy_args == expected
    with pytest.raises(SystemExit):
        parse_args(["--dataset", "d", "--policy-arg", "no_equals_sign"])
    with pytest.raises(ValueError, match=r"--seed must be an int from 0 to 2\*\*32 - 1, got -1"):  # (as train.py's)
        parse_args(["--dataset", "d", "--seed", "-1"])
    with pytest.raises(ValueError, match="--steps must be an int >= 1, got 0"):  # 0 trained forever
        parse_args(["--dataset", "d", "--steps", "0"])
    for flags in (["--resume"], ["--keep-checkpoints", "2"]):  # (were ignored)
        with pytest.raises(ValueError, match="--resume, --save-every and --keep-checkpoints need --checkpoint-dir"):
            parse_args(["--dataset", "d", *flags])


def test_decode_takes_what_the_iterator_takes() -> None:
    """The --decode check (c39f719) called .lower() on whatever it got: a DecodePreference given in code failed."""
    from lerobot_dali.decode_route import DecodePreference

    for decode in (DecodePreference.GPU, "GPU", "cpu"):
        assert TrainOptions(dataset="x", steps=1, decode=decode).decode == decode


def test_more_workers_than_open_files_allow_are_one_line_before_anything_opens() -> None:
    """--num-workers 100000 ended the run with the iterator's traceback (DALI's "Too many open files" before); the
    options refuse it, so the script says it in one line before any dataset is opened (soft limit 20,000 here: any
    limit under 200,000 files refuses it)."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 200_000:
        pytest.skip("open-file limit past 200,000")
    with pytest.raises(ValueError, match=r"^num_workers=100000 cannot start: .*`ulimit -n \d+`"):
        TrainOptions(dataset="d", steps=1, num_workers=100_000)
    assert TrainOptions(dataset="d", steps=1, num_workers=2).num_workers == 2


def test_a_damaged_or_missing_random_states_file_is_refused_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """accelerate's load_state skips a random_states_N.pkl it cannot load (cut short, another pickle, deleted) with an
    INFO line, and the run resumed with its generators as they stood, not as saved: 7 of 7 damaged files resumed
    with other random draws. A RunRefused naming the file now; a rank the saved run did not have is warned of."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from pipelines.checkpoints import restore_checkpoint
    from pipelines.run_errors import RunRefused

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = tmp_path / "step_00000002"
    torch.manual_seed(3)
    accelerator.save_state(str(step / "state"))
    saved_draw = torch.rand(4)
    (step / "stream_rank0.json").write_text(json.dumps({"step": 2, "world_size": 1, "stream": {}}))
    iterator = SimpleNamespace(rank=0, world_size=1, load_state_dict=lambda state: None)
    torch.manual_seed(99)
    assert restore_checkpoint(accelerator, step, iterator) == 2
    assert torch.equal(torch.rand(4), saved_draw)  # (the generator as saved)
    path = step / "state" / "random_states_0.pkl"
    whole = path.read_bytes()
    other = tmp_path / "other.pkl"
    torch.save({"step": 2}, other)
    for damaged, said in (
        (b"", "EOFError"),
        (whole[:1], "UnpicklingError"),
        (whole[:100], "RuntimeError"),
        (whole[: len(whole) // 2], "OSError"),
        (whole[:-1], "OSError"),
        (other.read_bytes(), "ValueError: not accelerate's random states"),
        (None, "FileNotFoundError"),
    ):
        path.unlink(missing_ok=True)
        if damaged is not None:
            path.write_bytes(damaged)
        with pytest.raises(RunRefused) as refused:
            restore_checkpoint(accelerator, step, iterator)
        assert str(refused.value).startswith(f"{path} cannot be read ({said}"), refused.value
        assert f"write its folder's name into {tmp_path / 'latest'}" in str(refused.value)
    path.write_bytes(whole)
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.MonkeyPatch.context() as patch:  # (saved without CUDA, now on 2 GPUs)
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "device_count", lambda: 2)
        patch.setattr(accelerator, "load_state", lambda path: None)  # (accelerate's own would skip them: INFO)
        assert restore_checkpoint(accelerator, step, iterator) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"{path} holds the random states of 0 CUDA device(s), this process sees 2: the CUDA generators (dropout, noise "
        "drawn on the GPU) start as a new run's; resume where the run saved for the same draws"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # (a rank the 1-rank run did not have: no random states of its own)
        assert restore_checkpoint(accelerator, step, SimpleNamespace(rank=1, world_size=2, load_state_dict=id)) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"rank 1: the checkpoint {step} was saved on 1 rank(s) and holds no random states for this one: its random "
        "generators start as a new run's"
    ]


_KILLED_BETWEEN_THE_RENAMES = """
import os, signal, sys
from pathlib import Path
from pipelines.checkpoints import _replace_folder
real_rename, renames = Path.rename, []
def rename(self, target):
    renames.append(self)
    if len(renames) == 2:  # (the new copy's, the old one set aside)
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rename(self, target)
Path.rename = rename
_replace_folder(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_a_folder_replaced_is_never_missing_after_a_failure_or_a_kill_between_its_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_replace_folder (a checkpoint saved again, lerobot_policy.py's --output-dir) renamed the old folder aside, then
    the new one into its place: a Ctrl-C or an error between the two left neither at its name (the old one deleted,
    the new one too), and a SIGKILL there left the old one hidden, deleted by the next save, and 'latest' naming no
    checkpoint (resume refused). The old one is put back now: 3 of 3 cases whole (was 0)."""
    from pipelines.checkpoints import latest_checkpoint
    from pipelines.lerobot_policy import save_policy

    out = tmp_path / "policy"
    first = {"config.json": "c1", "model.safetensors": "w1"}
    save_policy(out, _SavesFiles(first), _SavesFiles({}))
    real_rename = Path.rename

    def interrupted(self: Path, target: Any) -> Path:
        if self.name == ".policy.partial":
            raise KeyboardInterrupt
        return real_rename(self, target)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "rename", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_policy(out, _SavesFiles({"config.json": "c2", "model.safetensors": "w2"}), _SavesFiles({}))
    assert _folder_files(out) == first and [p.name for p in tmp_path.iterdir()] == ["policy"]

    root = tmp_path / "ckpt"
    step = root / "step_00000004"
    step.mkdir(parents=True)
    (step / "stream_rank0.json").write_text("old")
    (root / "latest").write_text(step.name)
    staging = root / ".step_00000004.partial"
    staging.mkdir()
    (staging / "stream_rank0.json").write_text("new")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_BETWEEN_THE_RENAMES, str(staging), str(step)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert killed.returncode == -signal.SIGKILL
    assert not step.exists()  # (killed where the old code left it missing)
    assert latest_checkpoint(root) == step and (step / "stream_rank0.json").read_text() == "old"

    shutil.move(out, tmp_path / ".policy.replaced")  # (the same kill in a save of --output-dir)
    assert not out.exists()
    with monkeypatch.context() as patch:  # (the next save fails: the last whole policy is back)
        patch.setattr(Path, "rename", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_policy(out, _SavesFiles({"config.json": "c3", "model.safetensors": "w3"}), _SavesFiles({}))
    assert _folder_files(out) == first and [p.name for p in tmp_path.iterdir()] == ["ckpt", "policy"]


def test_a_users_file_removed_as_the_policy_is_saved_leaves_the_save_whole(tmp_path: Path, monkeypatch) -> None:
    # A file of the user's in --output-dir removed between the save's listing and its link (an editor's swap file, a
    # tool's temporary one) failed the save with FileNotFoundError once training had ended: the trained policy lost
    # (1 of 1). Nothing is left of it to keep: the save goes on.
    from pipelines import lerobot_policy

    out = tmp_path / "policy"
    lerobot_policy.save_policy(out, _SavesFiles({"config.json": "c1", "model.safetensors": "w1"}), _SavesFiles({}))
    (out / ".notes.txt.swp").write_text("gone soon")
    (out / "notes.txt").write_text("mine")
    link = os.link

    def removed_first(source, target, **kwargs) -> None:
        if Path(source).name == ".notes.txt.swp":
            Path(source).unlink()
        link(source, target, **kwargs)

    monkeypatch.setattr(lerobot_policy.os, "link", removed_first)
    lerobot_policy.save_policy(out, _SavesFiles({"config.json": "c2", "model.safetensors": "w2"}), _SavesFiles({}))
    assert _folder_files(out) == {"config.json": "c2", "model.safetensors": "w2", "notes.txt": "mine"}
