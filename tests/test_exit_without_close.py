"""A training script that ends without closing its iterator exits cleanly: status 0, nothing on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from lerobot_dali import exit_close

ROOT = Path(__file__).resolve().parents[1]

#: The loader thread is held inside next() (in the source's call for a later batch) while the main thread ends, until
#: the pipeline is shut down.
LOADER_THREAD_AT_EXIT = """
import atexit, sys, threading, time
atexit.register(time.sleep, 1.0)  # (an exit handler of the script's own, run last: the loader thread runs meanwhile)
from lerobot_dali import DALILeRobotIterator
from lerobot_dali.batch_source import BatchSource
from nvidia.dali.pipeline import Pipeline

calls, inside, shut = [], threading.Event(), threading.Event()
call, shutdown = BatchSource.__call__, Pipeline._shutdown

def held_call(self, batch_info):
    calls.append(batch_info)
    if len(calls) == 6 and threading.current_thread() is not threading.main_thread():
        inside.set()
        shut.wait(1.0)  # (inside next() until the pipeline is shut down; 1 s where that waits for this call)
    return call(self, batch_info)

def noted_shutdown(self):
    shutdown(self)
    shut.set()

BatchSource.__call__, Pipeline._shutdown = held_call, noted_shutdown

def main():
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=0)

    def load():
        for _ in it:
            pass

    threading.Thread(target=load, daemon=True).start()
    inside.wait()

if __name__ == "__main__":
    main()
"""


def loader_thread_script(*, num_workers: int, head: str, loop_body: str = "pass") -> str:
    """A script (after ``head``, its imports) whose daemon thread iterates, running ``loop_body`` on each batch, and
    which ends once the thread had two batches (the thread goes on for the third)."""
    return f"""{head}
from lerobot_dali import DALILeRobotIterator

def main():
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers={num_workers})
    got = threading.Semaphore(0)

    def load():
        for batch in it:
            {loop_body}
            got.release()

    threading.Thread(target=load, daemon=True).start()
    got.acquire()
    got.acquire()

if __name__ == "__main__":
    main()
"""


def run_script(
    source: str, *args: str, timeout: float = 120, path: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )  # fmt: skip


def test_a_script_ending_while_its_loader_thread_is_inside_next_exits_silently(make_ds) -> None:
    # DALI's exit handler shut the pipeline down under the thread: AttributeError ('NoneType' object has no attribute
    # 'SetExternalTLInput'), its traceback printed.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = run_script(LOADER_THREAD_AT_EXIT, str(ds))
    assert (done.returncode, done.stderr) == (0, "")


#: A daemon thread loads batches from workers; the script ends once it had two (the thread waits for the third).
LOADER_THREAD_WITH_WORKERS = loader_thread_script(
    num_workers=2,
    head="""
import atexit, sys, threading, time
atexit.register(time.sleep, 1.0)  # (the script's own exit handler, run last: the loader thread runs meanwhile)
""",
)


def test_a_script_ending_while_its_loader_thread_waits_on_workers_exits_silently(make_ds) -> None:
    # The same shutdown under a pass waiting on its workers: that traceback in 39 of 40 runs of such a script (without
    # its exit handler's second), and "terminate called without an active exception" (status -6) in 1.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = run_script(LOADER_THREAD_WITH_WORKERS, str(ds))
    assert (done.returncode, done.stderr) == (0, "")


#: The prefetcher of a remote dataset reads an episode's parquet footer (pyarrow calling the remote file's read) when
#: the script ends, before any pass built a pipeline; the iterator is a global, freed once the interpreter finalizes.
PREFETCH_READING_AT_EXIT = """
import sys, threading, time
from lerobot_dali import DALILeRobotIterator
from lerobot_dali.dataset_reader import open_dataset
from tests.fake_remote import _FakeRemoteFile

prefetching, inside = threading.Event(), threading.Event()
read = _FakeRemoteFile.read

def remote_read(self, size=-1):
    if prefetching.is_set() and self.path.endswith(".parquet") and threading.current_thread().name != "MainThread":
        inside.set()
        time.sleep(0.5)  # (a slow round trip inside pyarrow's footer parse: the script ends meanwhile)
    return read(self, size)

_FakeRemoteFile.read = remote_read

def main():
    global it
    reader = open_dataset("fakeremote://", storage_options={"root": sys.argv[1]})
    options = dict(batch_size=2, shuffle=False, device="cpu", num_workers=0, cache_dir=sys.argv[2], cache_gb=1.0)
    it = DALILeRobotIterator(reader, **options)
    prefetching.set()
    it.prefetcher.advance(0, 0)  # (as a pass does)
    inside.wait()

if __name__ == "__main__":
    main()
"""


def test_a_script_ending_while_the_prefetcher_reads_a_footer_exits_cleanly(make_ds, tmp_path: Path) -> None:
    # A prefetch thread, stopped by the interpreter inside pyarrow's call of the remote file's read, aborted the
    # process: "Fatal Python error: PyGILState_Release: thread state ... must be current when releasing", status -6
    # (3 of 6 runs of such a script with 50 ms per request, every run here): it was closed only in the interpreter's
    # teardown, once its threads were stopped.
    ds = make_ds(episodes=4, frames_per_episode=4, version="v2.1")
    done = run_script(PREFETCH_READING_AT_EXIT, str(ds), str(tmp_path / "cache"))
    assert (done.returncode, done.stderr) == (0, "")


#: A loader thread starts a pass (``iter``) just as the script ends: it has passed the exit check and waits for the lock
#: that the exit handler's close() holds (held here 0.5 s, as a worker pool's shutdown holds it).
ITERATING_AGAIN_AT_EXIT = """
import atexit, sys, threading, time
atexit.register(time.sleep, 1.0)  # (the script's own exit handler, run last: the loader thread runs meanwhile)
from lerobot_dali import DALILeRobotIterator, exit_close, iterator

checked, closing = threading.Event(), threading.Event()
park = iterator.park_if_exiting
close_pipeline, ensure = DALILeRobotIterator._close_pipeline, DALILeRobotIterator._ensure_pipeline

def late_park():
    park()
    if threading.current_thread().name == "loader" and not checked.is_set():
        checked.set()
        closing.wait()

def held_close_pipeline(self):
    if exit_close._exiting.is_set():
        closing.set()
        time.sleep(0.5)
    close_pipeline(self)

def noted_ensure(self):
    if exit_close._exiting.is_set():
        print("a pipeline built after the exit handler closed the iterator", file=sys.stderr, flush=True)
    ensure(self)

iterator.park_if_exiting = late_park
DALILeRobotIterator._close_pipeline, DALILeRobotIterator._ensure_pipeline = held_close_pipeline, noted_ensure

def main():
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=0)
    threading.Thread(target=iter, args=(it,), name="loader", daemon=True).start()
    checked.wait()

if __name__ == "__main__":
    main()
"""


def test_a_pass_started_while_the_exit_handler_closes_the_iterator_builds_nothing(make_ds) -> None:
    # The thread went on once close() let the lock go, and built a pipeline (and would start workers and a prefetcher)
    # that nothing closed any more, under DALI's own exit handler.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = run_script(ITERATING_AGAIN_AT_EXIT, str(ds))
    assert (done.returncode, done.stderr) == (0, "")


#: A daemon thread iterates, its loop holding a batch with 20,000 more tensors: the loop frees the last batch (each
#: tensor's free lets go of the GIL) as it takes the next one, while the script ends.
LOADER_THREAD_FREEING_A_BATCH_AT_EXIT = loader_thread_script(
    num_workers=0,
    head="import sys, threading, torch",
    loop_body='batch["more"] = [torch.empty(4) for _ in range(20_000)]',
)


def test_a_script_ending_while_its_loader_thread_frees_a_batch_exits_cleanly(make_ds) -> None:
    # The interpreter, finalizing, stopped the thread as it took the GIL back inside torch's free of a tensor (a C++
    # frame: std::terminate): "terminate called without an active exception", status -6 (11 of 11 runs). The exit
    # handler now waits for the thread to come back for its next batch, where it parks.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = run_script(LOADER_THREAD_FREEING_A_BATCH_AT_EXIT, str(ds))
    assert (done.returncode, done.stderr) == (0, "")


def test_the_exit_handler_takes_a_parked_thread_as_back_whatever_batches_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A mixture's thread is handed each dataset's batch and comes back to the anchor's alone (it parks there), as a
    # loop over zip() of two iterators comes back to the first: counted by what it still held, the handler waited all
    # of RETURN_WAIT_S for a parked thread (1.00 s in 4 of 4 exits of a mixture's, zip()'s, or a held older pass's).
    exiting = threading.Event()
    exiting.set()
    monkeypatch.setattr(exit_close, "_exiting", exiting)
    monkeypatch.setattr(exit_close, "_out", Counter())
    monkeypatch.setattr(exit_close, "_parked", set(), raising=False)
    handed, back = threading.Event(), threading.Event()

    def mixture_thread() -> None:
        second, anchor = exit_close.BatchesHeld(), exit_close.BatchesHeld()  # (two datasets' passes)
        second.claim()  # (the second dataset's batch, still held)
        anchor.claim()
        handed.set()
        back.wait()  # (resumed: the anchor's pass reads its next batch, the exit handler closed the iterator)
        exit_close.park_if_exiting()  # (parks for good: a daemon thread the interpreter stops)

    threading.Thread(target=mixture_thread, daemon=True).start()
    handed.wait()
    assert not exit_close._wait_for_batches_back(0.0)  # (out with the thread: not back)
    back.set()
    assert exit_close._wait_for_batches_back(time.monotonic() + 30.0)


def test_a_thread_reading_its_next_batch_still_holds_its_last(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    # A loop frees its last batch only as the next one is handed out: counted from the handing out to the resume alone,
    # a thread inside DALI's next() as the exit handler closed the iterator was not waited for, and the batch the pass
    # still got there was handed out, the last freed, as the interpreter finalized (2 workers, 20,000-tensor batches:
    # status -6 in 7 of 30 runs, THPVariable_clear under pthread_exit).
    from lerobot_dali import DALILeRobotIterator

    ds = make_ds(episodes=2, frames_per_episode=30)
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", num_workers=0)
    reading, go_on = threading.Event(), threading.Event()
    next_batch, calls = DALILeRobotIterator._next_batch, []

    def held_next_batch(self: DALILeRobotIterator, pass_id: int) -> object:
        calls.append(pass_id)
        if len(calls) == 2:  # (reading the second batch, the first still held by the loop)
            reading.set()
            go_on.wait(30.0)
        return next_batch(self, pass_id)

    monkeypatch.setattr(DALILeRobotIterator, "_next_batch", held_next_batch)

    def load() -> None:
        for i, _batch in enumerate(it):
            if i == 1:
                break

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        reading.wait(30.0)
        assert not exit_close._wait_for_batches_back(0.0)
    finally:
        go_on.set()
        loader.join(30.0)
        it.close()
    assert exit_close._wait_for_batches_back(0.0)  # (the pass is over: its thread holds none of its batches)


#: Two daemon threads each iterate an iterator (no workers) whose source hangs in a later batch: both passes stay inside
#: DALI's next() as the script ends. The exit's wait is 1 s here (EXIT_WAIT_S).
PASSES_STUCK_AT_EXIT = """
import sys, threading, time
from lerobot_dali import DALILeRobotIterator, exit_close
from lerobot_dali.batch_source import BatchSource

exit_close.EXIT_WAIT_S = 1.0
call, stuck = BatchSource.__call__, threading.Semaphore(0)

def hanging_call(self, batch_info):
    if batch_info.iteration >= 4:
        stuck.release()
        time.sleep(3600)
    return call(self, batch_info)

BatchSource.__call__ = hanging_call

def main():
    for ds in sys.argv[1:]:
        it = DALILeRobotIterator(ds, batch_size=2, device="cpu", num_workers=0)
        threading.Thread(target=lambda it=it: [None for _ in it], daemon=True).start()
    for _ in sys.argv[1:]:
        stuck.acquire()
    time.sleep(0.3)  # (each loader thread reaches the batch that hangs)

if __name__ == "__main__":
    main()
"""


def test_an_exit_with_passes_stuck_waits_once_for_all_and_says_which(make_ds) -> None:
    # Each close() at exit waited CLOSE_WAIT_S (60 s) for its stuck pass: 2 x 60 s here (3 iterators: 202 s from the
    # script's end), with one warning each naming no dataset. One deadline now, and one warning naming both.
    datasets = [str(make_ds(episodes=2, frames_per_episode=30)), str(make_ds(episodes=3, frames_per_episode=30))]
    done = run_script(PASSES_STUCK_AT_EXIT, *datasets, timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 0
    assert len(lines) == 1 and lines[0].startswith("exit: within 1 s, 2 iterators not closed"), done.stderr
    assert all(ds in lines[0] for ds in datasets)


#: Imported by every process of the script (DALI's workers too, which do not import its main module): a worker's source
#: call for a later batch blocks SIGTERM and hangs, so the pool's close at exit joins that worker for ever.
DEAF_WORKER_SITE = """
import os, signal, time
from lerobot_dali.batch_source import BatchSource
from lerobot_dali import exit_close

exit_close.EXIT_WAIT_S = exit_close.STUCK_CLOSE_S = 1.0
call = BatchSource.__call__

def deaf_call(self, batch_info):
    if batch_info.iteration >= 4 and os.environ.get("DEAF_MARK"):
        open(os.path.join(os.environ["DEAF_MARK"], str(os.getpid())), "w").close()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        time.sleep(3600)
    return call(self, batch_info)

BatchSource.__call__ = deaf_call
"""

DEAF_WORKER_AT_EXIT = """
import os, sys, threading, time
from lerobot_dali import DALILeRobotIterator

def main():
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=2)
    threading.Thread(target=lambda: [None for _ in it], daemon=True).start()
    while not os.listdir(os.environ["DEAF_MARK"]):
        time.sleep(0.05)
    time.sleep(0.3)  # (the loader thread reaches the batch that hangs)

if __name__ == "__main__":
    main()
"""


def test_an_exit_kills_a_worker_that_outlives_its_sigterm(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The exit handler's close() joined the worker for ever (DALI's pool close, after its SIGTERM): killed at 300 s, 2
    # workers still running. Now killed at the exit's deadline, said in one line, and the loader thread parks silent
    # (it printed the WorkerProcessError of the killed worker in 3 of 6 exits).
    ds = str(make_ds(episodes=2, frames_per_episode=30))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(textwrap.dedent(DEAF_WORKER_SITE))
    (tmp_path / "mark").mkdir()
    monkeypatch.setenv("DEAF_MARK", str(tmp_path / "mark"))
    done = run_script(DEAF_WORKER_AT_EXIT, ds, timeout=60, path=(str(tmp_path / "site"),))
    lines = done.stderr.splitlines()
    assert done.returncode == 0
    assert len(lines) == 1 and "worker processes that did not stop, killed: " in lines[0] and ds in lines[0], lines


def test_a_thread_reading_the_first_batch_of_a_pass_another_thread_began_holds_its_batches(
    make_ds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted from its first batch handed out, a thread reading the first batch of a pass (one another thread began, or
    # its next epoch's, its loop holding the last epoch's batch) was not waited for, and the batch DALI still gave it
    # was handed out, its last one freed, as the interpreter finalized: status -6 in 5 of 10 exits of a script whose
    # thread read on a pass another thread began (20,000-tensor batches), 9 of 10 with 50 ms from next() to the yield.
    from lerobot_dali import DALILeRobotIterator

    ds = make_ds(episodes=2, frames_per_episode=30)
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", num_workers=0, shuffle=False)
    reading, go_on = threading.Event(), threading.Event()
    next_batch = DALILeRobotIterator._next_batch

    def held_next_batch(self: DALILeRobotIterator, pass_id: int) -> object:
        if threading.current_thread().name == "reader" and not reading.is_set():
            reading.set()  # (its first batch of the pass)
            go_on.wait(30.0)
        return next_batch(self, pass_id)

    monkeypatch.setattr(DALILeRobotIterator, "_next_batch", held_next_batch)
    batches = iter(it)
    first = [next(batches)["index"].tolist() for _ in range(2)]  # (this thread began the pass)
    read: list[list[int]] = []
    reader = threading.Thread(target=lambda: read.extend(b["index"].tolist() for b in batches), name="reader")
    reader.start()
    try:
        assert reading.wait(30.0)
        assert not exit_close._wait_for_batches_back(0.0)  # (the reader holds the pass's batches)
    finally:
        go_on.set()
        reader.join(30.0)
        it.close()
    assert first + read == [[i, i + 1] for i in range(0, 60, 2)]  # (the pass read on whole, in the reader)
    assert exit_close._wait_for_batches_back(0.0)  # (the pass is over)


def test_the_exit_handler_ends_a_pass_left_in_a_reference_cycle(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    # A thread left a pass with its generator in a reference cycle (neither ended nor collected) and went on elsewhere:
    # counted as holding its batches, it held the exit all of RETURN_WAIT_S (1.0 s in 3 of 3 exits) for a pass that
    # never comes back. The handler collects it: the pass ends, and its thread holds none of its batches.
    import gc
    import weakref

    from lerobot_dali import DALILeRobotIterator

    monkeypatch.setattr(exit_close, "_exiting", threading.Event())
    monkeypatch.setattr(exit_close, "_out", Counter())
    monkeypatch.setattr(exit_close, "_parked", set())
    monkeypatch.setattr(exit_close, "RETURN_WAIT_S", 0.0)
    ds = make_ds(episodes=2, frames_per_episode=30)
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", num_workers=0)
    monkeypatch.setattr(exit_close, "_live", weakref.WeakSet([it]))
    left, done = threading.Event(), threading.Event()

    def load() -> None:
        holder: dict[str, object] = {"batches": iter(it)}
        holder["self"] = holder  # (the cycle)
        next(holder["batches"])  # type: ignore[call-overload]
        del holder
        left.set()
        done.wait(30.0)  # (elsewhere: not back for the next batch)

    thread = threading.Thread(target=load, daemon=True)
    gc.disable()
    try:
        thread.start()
        assert left.wait(30.0)
        assert not exit_close._wait_for_batches_back(0.0)  # (counted: its pass still holds it)
        exit_close._close_all()
        assert exit_close._wait_for_batches_back(0.0)  # (the pass ended: its thread holds none of its batches)
    finally:
        gc.enable()
        done.set()
        thread.join(30.0)
        it.close()


#: A script's source that hangs in the 4th batch of the pass of its thread named "stuck" (the parent's, not a worker's),
#: setting ``stuck`` first.
STUCK_THREAD_HANGS = """
call, stuck, parent = BatchSource.__call__, threading.Event(), os.getpid()

def hanging_call(self, batch_info):
    if os.getpid() == parent and threading.current_thread().name == "stuck" and batch_info.iteration >= 4:
        stuck.set()
        time.sleep(3600)
    return call(self, batch_info)
"""


#: One iterator's pass (no workers) is stuck inside DALI's next() (its source hangs) as the script ends, and is closed
#: first (the handler's order is the set's, made here the iterators' own); another's (2 workers) read 2 batches and
#: waits, not stuck. The exit's wait is 1 s here (EXIT_WAIT_S).
STUCK_AND_IDLE_AT_EXIT = (
    """
import os, sys, threading, time
from lerobot_dali import DALILeRobotIterator, exit_close
from lerobot_dali.batch_source import BatchSource

class InOrder(list):
    add = list.append

exit_close.EXIT_WAIT_S, exit_close._live = 1.0, InOrder()
"""
    + STUCK_THREAD_HANGS
    + """
BatchSource.__call__ = hanging_call

def main():
    global idle
    stuck_it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=0)
    idle_it = DALILeRobotIterator(sys.argv[2], batch_size=2, device="cpu", num_workers=2)
    idle = iter(idle_it)
    next(idle), next(idle)
    threading.Thread(target=lambda: [None for _ in stuck_it], name="stuck", daemon=True).start()
    stuck.wait()
    time.sleep(0.3)  # (the loader thread reaches the batch that hangs)

if __name__ == "__main__":
    main()
"""
)


def test_an_exit_closes_the_workers_of_an_iterator_not_stuck_without_killing_them(make_ds) -> None:
    # At the deadline the handler killed the workers of every iterator, also those whose close had not begun (idle):
    # their close, begun as they died, waited for ever in DALI's notify of its task queue (4 of 12 exits hung), and
    # the others named those workers as killed (8 of 8).
    datasets = [str(make_ds(episodes=2, frames_per_episode=30)), str(make_ds(episodes=3, frames_per_episode=30))]
    done = run_script(STUCK_AND_IDLE_AT_EXIT, *datasets, timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 0
    assert len(lines) == 1 and lines[0].startswith("exit: within 1 s, 1 iterator not closed"), done.stderr
    assert datasets[0] in lines[0] and "killed" not in lines[0]


#: A daemon thread's pass is still building its pipeline (held there) as the script ends. The exit's wait is 0.5 s here.
BUILDING_AT_EXIT = """
import sys, threading, time
from lerobot_dali import DALILeRobotIterator, exit_close

exit_close.EXIT_WAIT_S = 0.5
building, ensure = threading.Event(), DALILeRobotIterator._ensure_pipeline

def held_ensure(self, loads):
    if threading.current_thread().name == "loader":
        building.set()
        time.sleep(3600)  # (a build that outlasts the exit's wait: a remote warm-up, workers slow to start)
    ensure(self, loads)

DALILeRobotIterator._ensure_pipeline = held_ensure

def main():
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=0)
    threading.Thread(target=lambda: [None for _ in it], name="loader", daemon=True).start()
    building.wait()

if __name__ == "__main__":
    main()
"""


def test_an_exit_names_a_pass_still_building_its_pipeline(make_ds) -> None:
    # The handler named the iterators whose pipeline a pass still held, and a pass building one holds none yet: the
    # exit left it to its pass, said nothing (1 of 1).
    ds = str(make_ds(episodes=2, frames_per_episode=30))
    done = run_script(BUILDING_AT_EXIT, ds, timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 0
    assert len(lines) == 1 and lines[0].startswith("exit: within 0.5 s, 1 iterator not closed"), done.stderr
    assert ds in lines[0]


#: A pass (no workers) is stuck inside DALI's next() in a daemon thread, and another iterator's 2 workers are idle, as
#: the script gets SIGTERM, whose handler (the script's own) exits; it prints "ready" once both are so.
STUCK_AT_SIGTERM = (
    """
import os, signal, sys, threading, time
from lerobot_dali import DALILeRobotIterator
from lerobot_dali.batch_source import BatchSource

"""
    + STUCK_THREAD_HANGS
    + """
def exits(signum, frame):
    import faulthandler  # (an exit still under way 15 s on shows every thread's stack, in the test's message)
    faulthandler.dump_traceback_later(15, exit=False)
    raise SystemExit(128 + signum)

BatchSource.__call__ = hanging_call
signal.signal(signal.SIGTERM, exits)

def main():
    global idle
    stuck_it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=0)
    idle_it = DALILeRobotIterator(sys.argv[2], batch_size=2, device="cpu", num_workers=2)
    idle = iter(idle_it)
    next(idle)
    threading.Thread(target=lambda: [None for _ in stuck_it], name="stuck", daemon=True).start()
    stuck.wait()
    time.sleep(0.3)  # (the loader thread reaches the batch that hangs)
    print("ready", flush=True)
    time.sleep(3600)

if __name__ == "__main__":
    main()
"""
)


def test_a_sigterm_with_a_pass_stuck_exits_within_the_launchers_grace_and_leaves_no_semaphore(
    make_ds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher sends SIGTERM to the process group and SIGKILL after a grace (torchrun's 30 s; 20 s here): the exit
    # waited EXIT_WAIT_S (60 s) for the stuck pass and was killed mid-close, its workers' 8 semaphores left in /dev/shm
    # (the resource tracker killed with it). The wait is LEROBOT_DALI_EXIT_WAIT_S (1 s here; 10 s by default).
    import psutil

    datasets = [str(make_ds(episodes=2, frames_per_episode=30)), str(make_ds(episodes=3, frames_per_episode=30))]
    monkeypatch.setenv("LEROBOT_DALI_EXIT_WAIT_S", "1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = [sys.executable, "-c", textwrap.dedent(STUCK_AT_SIGTERM), *datasets]
    with subprocess.Popen(
        script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            tree = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
            # (multiprocessing's, as the workers open them by name: their creator maps a temporary name, deleted)
            semaphores = {m.path for p in tree for m in p.memory_maps() if m.path.startswith("/dev/shm/sem.mp-")}
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # (as the launcher does once its grace is over)
                child.wait()
            stderr = child.stderr.read() if child.stderr is not None else ""
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
    lines = stderr.splitlines()
    assert semaphores and child.returncode == 128 + signal.SIGTERM, stderr  # (a stuck exit: its threads' stacks)
    assert sorted(path for path in semaphores if os.path.exists(path)) == []
    assert len(lines) == 1 and lines[0].startswith("exit: within 1 s, 1 iterator not closed"), stderr
    assert datasets[0] in lines[0]


def test_the_exit_wait_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(exit_close.EXIT_WAIT_ENV, raising=False)
    assert exit_close.exit_wait_s() == 10.0
    monkeypatch.setenv(exit_close.EXIT_WAIT_ENV, " 2.5 ")
    assert exit_close.exit_wait_s() == 2.5
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(exit_close.EXIT_WAIT_ENV, bad)
        with pytest.raises(ValueError, match=f"LEROBOT_DALI_EXIT_WAIT_S='{bad}' is not a number of seconds >= 0"):
            exit_close.exit_wait_s()


def test_the_exit_handler_closes_every_iterator_where_no_thread_may_start(
    make_ds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.12 starts no thread in an exit handler: starting the one that kills stuck workers raised RuntimeError
    # ("can't create new thread at interpreter shutdown") before any close, a traceback at every exit and no iterator
    # closed (DALI's handler shut their pipelines down under their passes).
    import weakref

    from lerobot_dali import DALILeRobotIterator

    monkeypatch.setattr(exit_close, "_exiting", threading.Event())
    monkeypatch.setattr(exit_close, "_out", Counter())
    monkeypatch.setattr(exit_close, "_parked", set())
    ds = make_ds(episodes=2, frames_per_episode=30)
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", num_workers=0)
    batches = iter(it)
    next(batches)
    monkeypatch.setattr(exit_close, "_live", weakref.WeakSet([it]))

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with monkeypatch.context() as python_3_12:
        python_3_12.setattr(threading.Thread, "start", no_thread)
        exit_close._close_all()
    assert it._pipeline is None  # (closed)
    batches.close()


def test_a_stuck_worker_still_dying_at_the_next_look_is_killed_and_named_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker SIGKILLed at exit is not reaped until the kernel has torn it down (its memory freed: 127-202 ms for a
    # process of 400 MB on 2 busy cores): past the reaper's next look (_POLL_S, 100 ms) it was killed again, and named
    # twice in the warning ("killed: 7 (ds), 7 (ds)").
    from types import SimpleNamespace

    closes = exit_close._Closes(time.monotonic())
    kills: list[int] = []

    class Dying:
        """A worker whose teardown outlasts 3 looks after its SIGKILL (no exit code until then)."""

        pid, exitcode = 7, None

        def kill(self) -> None:
            kills.append(self.pid)

    looks = []

    def processes(iterator: object) -> list[Dying]:
        looks.append(iterator)
        if len(looks) == 4:
            closes.done.set()
        return [worker]

    worker = Dying()
    iterator = SimpleNamespace(reader=SimpleNamespace(location=SimpleNamespace(description="ds")))
    monkeypatch.setattr(exit_close, "STUCK_CLOSE_S", 0.0)
    monkeypatch.setattr(exit_close, "_POLL_S", 0.0)
    monkeypatch.setattr(exit_close, "_worker_processes", processes)
    closes.begin(iterator)
    exit_close._kill_stuck_workers(closes)
    assert len(looks) == 4 and kills == [7] and closes.killed == ["7 (ds)"]
