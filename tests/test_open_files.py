"""The files kept open across calls stay within the process's open-file limit (``ulimit -n``), however many files a
dataset has."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import lerobot_dali
from lerobot_dali import open_files

#: One pass of the CPU route under a lowered soft limit, in a process of its own (the limit is the process's).
_PASS = """
import resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
from lerobot_dali import DALILeRobotIterator
it = DALILeRobotIterator(sys.argv[1], batch_size=8, shuffle=True, seed=0, episode_pool_size=24, device="cpu",
                         decode="cpu", num_workers=0, dali_threads=1)
batches = sum(1 for _ in it)
print(batches, len(it))
it.close()
"""


def test_the_cpu_route_keeps_a_v21_pool_within_a_low_open_file_limit(make_ds: Callable[..., Path]) -> None:
    """24 episodes x 2 cameras in the pool at ``ulimit -n 64``: 48 videos and 24 data files were kept open (the
    decoders' floor of 64 was above half the limit, the data files' 128 a fixed count), and a pass failed with
    EMFILE; within their shares it reads every batch."""
    root = make_ds(episodes=24, frames_per_episode=8, cameras=2, size=(64, 64), codec="h264", version="v2.1")
    env = {**os.environ, "PYTHONPATH": str(Path(lerobot_dali.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _PASS, str(root), "64"], capture_output=True, text=True, timeout=300, env=env
    )
    assert "Too many open files" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["24", "24"]


def test_the_shares_of_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 256)
    assert [open_files.open_files_share(s) for s in (open_files.DECODER_SHARE, open_files.DATA_FILE_SHARE)] == [128, 32]
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 4)
    assert open_files.open_files_share(open_files.DATA_FILE_SHARE) == 1
