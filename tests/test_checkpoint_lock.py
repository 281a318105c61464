"""``pipelines/checkpoint_lock.py`` in one process: a held ``--checkpoint-dir`` is refused naming its holder, a folder
the run made is removed where nothing was saved in it and kept where something was, and a filesystem that takes no
locks runs unlocked with a warning (``test_train_pipeline.py`` runs two real runs on one folder)."""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

import pytest

from pipelines import checkpoint_lock
from pipelines.checkpoint_lock import LOCK_NAME, one_run_at_a_time
from pipelines.run_errors import RunRefused


def test_a_held_folder_is_refused_naming_its_holder_and_free_once_the_holder_ends(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with one_run_at_a_time(ckpt, rank=0, world_size=1):
        holder = (ckpt / LOCK_NAME).read_text()
        assert holder.startswith(f"pid {os.getpid()} on {socket.gethostname()}, started 20"), holder
        with pytest.raises(RunRefused) as refused, one_run_at_a_time(ckpt, rank=0, world_size=1):
            pytest.fail("entered a folder another run holds")
        assert str(refused.value).startswith(
            f"--checkpoint-dir {ckpt} is in use by another run ({holder.strip()}): wait for it to end"
        ), refused.value
    with one_run_at_a_time(ckpt, rank=0, world_size=1):  # (released: the first block ended)
        pass
    assert ckpt.is_dir() and sorted(p.name for p in ckpt.iterdir()) == []  # (the lock file gone, a found folder kept)


def test_the_folders_a_run_made_go_where_it_saved_nothing_and_stay_where_it_did(tmp_path: Path) -> None:
    ckpt = tmp_path / "runs" / "a" / "ckpt"
    with one_run_at_a_time(ckpt, rank=0, world_size=1):
        assert ckpt.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # (runs/a/ckpt: all three made, all three gone)
    with pytest.raises(RuntimeError), one_run_at_a_time(ckpt, rank=0, world_size=1):
        raise RuntimeError("a run that fails before its first save")
    assert not (tmp_path / "runs").exists()
    with one_run_at_a_time(ckpt, rank=0, world_size=1):
        (ckpt / "latest").write_text("step_00000001")
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest"]


def test_ranks_past_0_take_no_lock(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with one_run_at_a_time(ckpt, rank=0, world_size=1), one_run_at_a_time(ckpt, rank=1, world_size=1):
        pass  # (rank 1 of the same run: not refused by its rank 0's lock)


def test_a_filesystem_that_takes_no_locks_runs_unlocked_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(path: Path) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(checkpoint_lock, "try_flock", no_locks)
    ckpt = tmp_path / "ckpt"
    first, second = (one_run_at_a_time(ckpt, rank=0, world_size=1) for _ in range(2))
    with caplog.at_level(logging.WARNING, "pipelines.train"), first, second:
        pass  # (both enter: nothing refuses the second)
    assert not ckpt.exists()  # (made, nothing saved: removed, with no lock file)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("its filesystem takes no locks (No locks available)" in line for line in said), said


def test_the_folder_is_checked_again_once_locked(tmp_path: Path) -> None:
    """A run that ended between the checks of ``check_files`` and the lock could have saved a ``latest`` there: a run
    without --resume then trained from step 0 and replaced it (a review hit it twice). ``still_usable`` runs once the
    lock is held; its refusal is every rank's, and names no holder (the lock file is this run's own)."""
    from pipelines.checkpoints import check_checkpoint_dir

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest").write_text("step_00000400")
    check = lambda: check_checkpoint_dir(ckpt, resume=False, locked=True)  # noqa: E731
    with pytest.raises(RunRefused) as refused, one_run_at_a_time(ckpt, rank=0, world_size=1, still_usable=check):
        pytest.fail("entered a folder holding another run's checkpoint without --resume")
    assert str(refused.value) == (
        f"--checkpoint-dir {ckpt} holds a checkpoint (step_00000400): pass --resume to continue that run, or give a "
        "new --checkpoint-dir (a run from step 0 would replace its checkpoints)"
    )
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest"]


def test_a_refusal_before_the_lock_names_the_run_its_lock_file_names(tmp_path: Path) -> None:
    """A second run without --resume while the first trains was told to pass --resume, which the lock then refused."""
    from pipelines.checkpoints import check_checkpoint_dir

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest").write_text("step_00000205")
    (ckpt / LOCK_NAME).write_text("pid 18174 on node-3, started 2026-12-04 07:00:00 UTC\n")
    with pytest.raises(FileExistsError) as refused:
        check_checkpoint_dir(ckpt, resume=False)
    assert str(refused.value) == (
        f"--checkpoint-dir {ckpt} holds a checkpoint (step_00000205), of a run that may still be going (pid 18174 on "
        "node-3, started 2026-12-04 07:00:00 UTC): once it has ended, pass --resume to continue that run, or give a "
        "new --checkpoint-dir (a run from step 0 would replace its checkpoints)"
    )


def test_a_lock_file_this_user_may_only_read_is_locked_unnamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's lock file, left by a killed run in a shared folder, opens read-only (``try_flock``): naming this
    run in it raised io.UnsupportedOperation, a traceback. The lock is taken all the same, the file left as it was."""
    import fcntl

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LOCK_NAME).write_text("pid 1 on other, started 2026-01-01 00:00:00 UTC\n")

    def read_only(path: Path) -> object:
        handle = open(path, "rb")  # noqa: SIM115 (held as try_flock's is)
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle

    monkeypatch.setattr(checkpoint_lock, "try_flock", read_only)
    with one_run_at_a_time(ckpt, rank=0, world_size=1):
        assert (ckpt / LOCK_NAME).read_text().startswith("pid 1 on other")


_TWO_RANKS = """
import datetime, errno, os, sys
from pathlib import Path
import torch.distributed as dist
from pipelines import checkpoint_lock
from pipelines.checkpoint_lock import one_run_at_a_time

store, ckpt, failing = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=20))

def no_entry(path):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

def broken_check():
    raise KeyError("latest")

if failing == "lock":
    checkpoint_lock.try_flock = no_entry
try:
    with one_run_at_a_time(ckpt, rank=rank, world_size=2, still_usable=broken_check if failing == "check" else None):
        said = "entered"
except Exception as e:
    said = f"{type(e).__name__}: {e}"
dist.destroy_process_group()
print(said)
"""


@pytest.mark.parametrize("failing", ["lock", "check"])
def test_a_failure_of_rank_0_at_the_lock_is_said_on_every_rank(tmp_path: Path, failing: str) -> None:
    """A lock rank 0 cannot take (a folder it may not write) raised there only: the other ranks waited in the
    broadcast of its answer until the process group's timeout, then a gloo traceback. Each rank now says why: a
    refusal naming the file where it is an OSError; rank 0's own exception (and its name on the others) otherwise."""
    from launched_ranks import run_ranks

    ckpt = tmp_path / "ckpt"
    out = [line.strip() for line in run_ranks(_TWO_RANKS, 2, str(tmp_path / "store"), str(ckpt), failing)]
    if failing == "lock":
        refusal = (
            f"RunRefused: --checkpoint-dir {ckpt}: its lock file {ckpt / LOCK_NAME} cannot be taken: Permission denied"
        )
        assert out == [refusal, refusal], out
    else:
        assert out == [
            "KeyError: 'latest'",
            f"RunRefused: rank 0 failed checking --checkpoint-dir {ckpt} (KeyError: 'latest')",
        ], out
    assert not ckpt.exists()  # (made for the run, nothing saved: removed)
