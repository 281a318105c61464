"""The test session's own settings end a test that pytest-timeout cannot end: one blocked in C code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A test that waits for ever in C with the GIL held, as in a deadlocked encoder's open or close (PyAV keeps the GIL
# across avcodec_open2 and avcodec_free_context): a default pthread mutex locked twice waits for itself in the kernel,
# and SIGALRM does not end that wait.
_BLOCKED_IN_C = """
import ctypes

def test_blocked_in_c():
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the blocked test locks a glibc pthread mutex")
def test_a_test_blocked_in_c_ends_the_run_with_every_threads_stack(pytestconfig: pytest.Config, tmp_path: Path) -> None:
    """pytest-timeout's SIGALRM ends a test only once Python code runs again, so a test blocked in C ran on past its
    600 s (an SVT-AV1 encode in a marker-video fixture: 25 min, every thread waiting, until killed). faulthandler's
    own thread dumps every thread's stack and ends the run once pytest-timeout has had its turn."""
    assert float(pytestconfig.getini("faulthandler_timeout")) > float(pytestconfig.getini("timeout"))
    (tmp_path / "test_blocked.py").write_text(_BLOCKED_IN_C)
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
            "-p", "no:cacheprovider", "-o", "timeout=0.5", "-o", "faulthandler_timeout=1", "test_blocked.py",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert "Timeout (0:00:01)!" in run.stderr
    assert "test_blocked_in_c" in run.stderr
