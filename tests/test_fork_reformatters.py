"""A process forked while another thread holds its swscale context starts.

CPython's ``os.fork`` clears, in the child, every other thread's thread-local data. PyAV 18.1.1 keeps one swscale
context a thread for ``VideoFrame.reformat`` and ``to_ndarray(format=...)``, with swscale's own thread pool (the
cores + 1 threads): freeing it in the child destroys a condition variable its pool's threads (absent there) wait
on, and glibc's ``pthread_cond_destroy`` waits for them for ever. That hung the child in ``os.fork`` itself in full
test runs (gdb: ``_PyThreadState_DeleteExcept`` -> ``VideoReformatter.__dealloc__`` -> ``sws_freeContext`` ->
``avpriv_slicethread_free`` -> ``pthread_cond_destroy``), where pytest's main thread had converted frames and a
test forked from another thread. The library converts on one swscale context a thread with ``threads=1``
(:func:`lerobot_dali.yuv_frames.reformat_array`): no pool, so a trainer that forks (a DataLoader's workers,
``multiprocessing``'s ``fork``) while its decode threads hold theirs gets a child that runs."""

from __future__ import annotations

import pytest

from tests.test_parent_watch import _run

_FORK_WHILE_HELD = """
    import os, signal, sys, threading, time

    import av

    from lerobot_dali.yuv_frames import reformat_array

    how, within_s = sys.argv[1], float(sys.argv[2])
    frame = av.VideoFrame(96, 64, "yuv420p")
    held, done = threading.Event(), threading.Event()


    def threads() -> int:
        return len(os.listdir("/proc/self/task"))


    def convert() -> None:
        reformat_array(frame, format="rgb24") if how == "library" else frame.to_ndarray(format="rgb24")
        held.set()
        done.wait()


    before = threads()
    holder = threading.Thread(target=convert)
    holder.start()
    held.wait()
    pool = threads() - before - 1
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline, status = time.monotonic() + within_s, None
    while status is None and time.monotonic() < deadline:
        ended, raw = os.waitpid(pid, os.WNOHANG)
        status = os.waitstatus_to_exitcode(raw) if ended else None
        time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    done.set()
    holder.join()
    print(pool, "ran" if status == 0 else "hung")
"""


def _fork_while_held(how: str, within_s: float) -> tuple[int, str]:
    done = _run(_FORK_WHILE_HELD, how, str(within_s))
    assert done.returncode == 0, done.stderr
    pool, said = done.stdout.split()
    return int(pool), said


def test_a_child_forked_while_a_decode_thread_holds_its_context_runs() -> None:
    assert _fork_while_held("library", 60) == (0, "ran")


def test_pyavs_own_per_thread_context_hangs_such_a_child() -> None:
    """Why the library keeps its own: the same fork, the thread having converted with PyAV's ``to_ndarray``."""
    pool, said = _fork_while_held("pyav", 5)
    if pool == 0:
        pytest.skip("PyAV here keeps no swscale thread pool past a conversion (PyAV < 18.1.1, or one core)")
    assert said == "hung"
