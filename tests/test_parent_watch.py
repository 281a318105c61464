"""A forked child watches its own parent, or none: what says a thread watches is inherited, not the thread."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lerobot_dali import parent_watch
from lerobot_dali.parent_watch import children_start_deaf_to_interrupts, exit_with_parent


@contextlib.contextmanager
def _handled(handler: Any, *signums: int) -> Iterator[None]:
    """``handler`` for each of ``signums`` within the block; the handlers before it put back after it, however it
    ends (a test's signal handler must not outlive it in pytest's process)."""
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


def _watches() -> tuple[bool, list[str]]:
    """exit_with_parent()'s answer, and the watching threads of this process."""
    watched = exit_with_parent()
    return watched, [t.name for t in threading.enumerate() if t.name == "lerobot-dali-parent-watch"]


def _report(queue: Any) -> None:
    queue.put(_watches())


def _watch_then_fork(queue: Any, how: str) -> None:
    """In a spawned child: watch its parent, then fork a child that says whether it is watched."""
    assert exit_with_parent()
    if how == "multiprocessing":
        child = multiprocessing.get_context("fork").Process(target=_report, args=(queue,))
        child.start()
        child.join()
        return
    pid = os.fork()
    if pid == 0:  # (never back into multiprocessing's bootstrap: os._exit)
        try:
            queue.put(_watches())
            queue.close()
            queue.join_thread()
        finally:
            os._exit(0)
    queue.put(("os.fork child's exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))


def _reports(how: str) -> list[Any]:
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    process = spawn.Process(target=_watch_then_fork, args=(queue, how))
    process.start()
    reports = [queue.get(timeout=120) for _ in range(1 if how == "multiprocessing" else 2)]
    process.join(timeout=120)
    assert process.exitcode == 0
    return reports


def test_a_multiprocessing_fork_child_of_a_watched_process_watches_its_own_parent() -> None:
    # It was told it was watched, and no thread watched: killed, its parent left it running (3 of 3 scripted).
    assert _reports("multiprocessing") == [(True, ["lerobot-dali-parent-watch"])]


def test_an_os_fork_child_of_a_multiprocessing_child_is_not_watched() -> None:
    # multiprocessing names the forking process's parent as the child's: was told it was watched, with no thread (its
    # parent watched first), or a thread watching that process ended it at once, its own parent alive (3 of 3 each).
    assert _reports("os.fork") == [(False, []), ("os.fork child's exit", 0)]


def _blocked_signals(queue: Any) -> None:
    queue.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def _spawned_report(target: Any) -> Any:
    """What a spawned child running ``target(queue)`` puts on the queue."""
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    process = spawn.Process(target=target, args=(queue,))
    process.start()
    report = queue.get(timeout=120)
    process.join(timeout=120)
    return report


def _spawned_blocks() -> list[int]:
    return _spawned_report(_blocked_signals)


def _watch_twice(queue: Any) -> None:
    queue.put((exit_with_parent(), *_watches()))


def _takes_held_once_left(queue: Any) -> None:
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    def held() -> bool:
        return bool(getattr(ShmQueue.get, parent_watch._TAKE_WRAPPED, False))

    queue.put((held(), parent_watch.leave_interrupts_to_parent(), held()))


def test_a_worker_that_leaves_interrupts_to_its_parent_holds_signals_over_its_takes_of_tasks() -> None:
    """A worker's SIGTERM (torchrun's, Slurm's) ends it unwinding: landing in its take of the next task, it let go of a
    lock it did not hold. Its takes are held over signals from the moment it leaves interrupts to its parent."""
    assert _spawned_report(_takes_held_once_left) == (False, True, True)


def test_a_child_that_asks_to_be_watched_twice_is_watched_by_one_thread() -> None:
    """Each of a worker's sources asks (DALI calls them in one process): the second ask is answered watched, and starts
    no second thread polling the parent."""
    assert _spawned_report(_watch_twice) == (True, True, ["lerobot-dali-parent-watch"])


def test_workers_spawned_within_children_start_deaf_to_interrupts_start_with_sigint_and_sigusr1_blocked() -> None:
    """A Ctrl-C while DALI's workers were importing (before leave_interrupts_to_parent) printed a KeyboardInterrupt
    traceback from each; they now start with SIGINT and SIGUSR1 blocked. This thread blocks them only while it spawns,
    and other spawns are as before."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with children_start_deaf_to_interrupts():
        assert _spawned_blocks() == sorted({signal.SIGINT, signal.SIGUSR1} | before)
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert signal.SIGINT not in _spawned_blocks()


def test_a_start_patched_on_base_process_after_the_wrap_still_runs_for_spawned_processes(monkeypatch) -> None:
    """The spawned process's start held over signals kept BaseProcess.start as it was when first wrapped: a start
    patched on BaseProcess later (a tracer's; the process_starts fixture's) was skipped for every spawned process
    (test_dataset_check's fixture saw 0 of 1 starts once an earlier test had spawned workers)."""
    import multiprocessing.process

    with children_start_deaf_to_interrupts():  # (wraps SpawnProcess.start, once per process)
        pass
    real_start = multiprocessing.process.BaseProcess.start
    seen: list[str] = []

    def start(process: multiprocessing.process.BaseProcess) -> None:
        seen.append(process.name)
        real_start(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    with children_start_deaf_to_interrupts():
        assert signal.SIGINT in _spawned_blocks()
    assert signal.SIGINT not in _spawned_blocks()
    assert len(seen) == 2, seen


def _landed_in_start(monkeypatch: pytest.MonkeyPatch, deaf: bool) -> list[str]:
    """The order of a spawned process's start (its class's own, which sends this process SIGUSR2) and the signal's
    handler, the start wrapped afresh and run outside or within :func:`children_start_deaf_to_interrupts`."""
    seen: list[str] = []

    class SpawnProcess:
        def start(self) -> None:
            os.kill(os.getpid(), signal.SIGUSR2)
            seen.append("start returns")

    monkeypatch.setattr(multiprocessing.context, "SpawnProcess", SpawnProcess)
    monkeypatch.setattr(parent_watch, "_spawning", threading.local())  # (a thread that never entered the block)
    own = SpawnProcess.start
    parent_watch._wrap_start()
    parent_watch._wrap_start()  # (a second wrap, as after a reload of the module: none)
    assert SpawnProcess.start.__wrapped__ is own  # type: ignore[attr-defined]
    with _handled(lambda signum, frame: seen.append("handler"), signal.SIGUSR2):
        if deaf:
            with children_start_deaf_to_interrupts():
                SpawnProcess().start()
        else:
            SpawnProcess().start()
    return seen


@pytest.mark.parametrize("deaf", [False, True], ids=["outside", "within"])
def test_a_signal_in_a_spawned_processs_own_start_is_held_to_its_end_only_within_the_block(monkeypatch, deaf) -> None:
    """A start of its own (a Python whose SpawnProcess has one) is the one run, wrapped once however often it is asked
    to be; a signal landing in it runs its handler where it lands outside the block (the trainer's Ctrl-C as before),
    and as the start ends within it (once the new worker has its data)."""
    assert _landed_in_start(monkeypatch, deaf) == (
        ["start returns", "handler"] if deaf else ["handler", "start returns"]
    )


def test_the_spawn_of_a_worker_is_wrapped_once_and_blocks_interrupts_only_within_the_block(monkeypatch) -> None:
    """multiprocessing's fork-and-exec, wrapped however often it is asked to be (as after a reload of the module), is
    wrapped once; it runs with SIGINT and SIGUSR1 blocked within the block alone, and leaves this thread's mask as it
    was."""
    masks: list[set[int]] = []

    def spawnv_passfds(path: Any, args: Any, passfds: Any) -> int:
        masks.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        return 7

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", spawnv_passfds)
    monkeypatch.setattr(parent_watch, "_spawning", threading.local())
    parent_watch._wrap_spawnv()
    parent_watch._wrap_spawnv()
    wrapped = multiprocessing.util.spawnv_passfds
    assert wrapped.__wrapped__ is spawnv_passfds  # type: ignore[attr-defined]
    before = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert wrapped(b"python", [], ()) == 7
    with children_start_deaf_to_interrupts():
        assert wrapped(b"python", [], ()) == 7
    assert set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before
    assert masks == [before, before | {signal.SIGINT, signal.SIGUSR1}]


def test_a_dali_method_is_wrapped_once_however_often_it_is_asked(monkeypatch) -> None:
    """A second wrap (a reload of the module, a cache cleared) would hold each put twice over: the method is wrapped
    once, and the wrapper reaches the original."""

    class Pool:
        def send(self, task: int) -> int:
            return task + 1

    own = Pool.send

    def twice(original: Any) -> Any:
        return lambda self, task: original(self, task) * 2

    for _ in range(2):
        parent_watch._wrap_method(Pool, "send", "_marked", twice)
    assert Pool.send.__wrapped__ is own  # type: ignore[attr-defined]
    assert Pool().send(3) == 8


class Terminated(Exception):
    """What the SIGTERM handler of these tests raises (a script's own, that exits)."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@pytest.mark.parametrize(
    ("signum", "handler", "ends"),
    [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt), (signal.SIGTERM, _terminated, Terminated)],
    ids=["ctrl-c", "sigterm-handler-that-raises"],
)
def test_a_signal_in_a_task_put_raises_as_it_ends_and_a_second_one_at_once(signum, handler, ends) -> None:
    """The hold over DALI's task puts (``task_puts_finish_before_interrupts``): one signal within runs its handler as
    the block ends, its lines all run; a second one runs it where it lands (a put that never ends still yields to
    Ctrl-C); the handler is the caller's again after. Only SIGINT was held: a SIGTERM handler raised inside the put."""
    with _handled(handler, signum):
        ran = []
        with pytest.raises(ends), parent_watch._signals_held_over():
            os.kill(os.getpid(), signum)
            ran.append("after the first")
        assert ran == ["after the first"] and signal.getsignal(signum) is handler
        with pytest.raises(ends), parent_watch._signals_held_over():
            os.kill(os.getpid(), signum)
            ran.append("after the first")
            os.kill(os.getpid(), signum)
            ran.append("after the second")
        assert ran == ["after the first"] * 2 and signal.getsignal(signum) is handler


def test_a_fork_outside_any_hold_leaves_the_childs_handlers_as_they_are() -> None:
    """The at-fork hook puts back only a hold's handlers; a child forked with the handlers of its own (no take, put or
    start under way) keeps them, and the hook raises nothing (an exception there is printed in every forked child)."""
    before = {s: signal.getsignal(s) for s in parent_watch._HELD_OVER_PUTS}
    parent_watch._forked()
    assert {s: signal.getsignal(s) for s in parent_watch._HELD_OVER_PUTS} == before


def test_a_put_that_held_a_signal_leaves_no_thread_to_send_it_again() -> None:
    """A signal held over a put starts a timer to send it again past :data:`HELD_PUT_S`; the put ended first, the timer
    is stopped with it, not left to run out (a thread each, per signal held, for two seconds)."""
    ran: list[int] = []
    before = set(threading.enumerate())
    with _handled(lambda signum, frame: ran.append(signum), signal.SIGUSR2), parent_watch._signals_held_over():
        os.kill(os.getpid(), signal.SIGUSR2)
        timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t not in before]
    assert ran == [signal.SIGUSR2] and len(timers) == 1
    timers[0].join(parent_watch.HELD_PUT_S / 2)
    assert not timers[0].is_alive()


def test_an_ignored_signal_in_a_task_put_stays_ignored() -> None:
    """A signal the caller ignores (a worker's SIGUSR1, left to the trainer) is not held over the put: nothing runs for
    it as the put ends, and it is still ignored after."""
    with _handled(signal.SIG_IGN, signal.SIGUSR2):
        with parent_watch._signals_held_over():
            assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN


def _in_another_thread(call: Any) -> Any:
    """What ``call()`` returns run in a thread other than the main one (where Python runs no signal handler)."""
    returned: list[Any] = []
    thread = threading.Thread(target=lambda: returned.append(call()))
    thread.start()
    thread.join()
    return returned[0]


def _holds_over_puts_of(monkeypatch: pytest.MonkeyPatch, pool: type) -> None:
    """:func:`task_puts_finish_before_interrupts` run afresh over ``pool`` as DALI's ``ProcPool``."""
    import nvidia.dali._multiproc.pool as dali_pool

    monkeypatch.setattr(dali_pool, "ProcPool", pool)
    parent_watch.task_puts_finish_before_interrupts.cache_clear()
    try:
        parent_watch.task_puts_finish_before_interrupts()
    finally:
        parent_watch.task_puts_finish_before_interrupts.cache_clear()


def test_a_task_put_from_another_thread_is_dalis_own(monkeypatch) -> None:
    """Python runs signal handlers in the main thread alone, and sets them only there: a put from another thread (a
    training loop run in a thread) holds nothing over and returns what DALI's put does."""

    class ProcPool:
        def send(self, tasks: list[int], worker: int) -> tuple[list[int], int]:
            return tasks, worker

    _holds_over_puts_of(monkeypatch, ProcPool)
    assert _in_another_thread(lambda: ProcPool().send([1], 0)) == ([1], 0)


@pytest.mark.parametrize("second", [False, True], ids=["one-signal", "two-signals"])
def test_a_signal_at_each_line_of_the_hold_runs_its_handler_once_and_every_handler_is_put_back(second) -> None:
    """A real SIGINT (and a SIGTERM next, for two), both with handlers that raise, sent at each line the hold runs (the
    put is ``pass``): each signal's handler ran once, none is lost, the handlers in place run the caller's, and the next
    put leaves the caller's in place. ``signal.signal()`` runs the handlers of pending signals before it changes one: a
    SIGINT landing as the handlers were put back, SIGINT's back, raised there and left SIGTERM's the hold's for good,
    which held every later SIGTERM for a next put's end (held over SIGINT alone: a second Ctrl-C landing there left
    SIGINT's the hold's)."""
    codes = (parent_watch._signals_held_over.__wrapped__.__code__,)  # type: ignore[attr-defined]
    ran: list[int] = []

    def noted(signum: int, frame: Any) -> None:
        ran.append(signum)
        raise Terminated(signum)

    reached = []
    with _handled(noted, signal.SIGINT, signal.SIGTERM):
        for k in range(1, 200):
            lines, sent = [0], []

            def line(
                frame: Any, event: str, arg: Any, lines: list[int] = lines, sent: list[int] = sent, k: int = k
            ) -> Any:
                if event == "line":
                    lines[0] += 1
                    if lines[0] == k or (second and lines[0] == k + 1):
                        sent.append(signal.SIGINT if not sent else signal.SIGTERM)
                        os.kill(os.getpid(), sent[-1])
                return line

            ran.clear()
            previous_trace = sys.gettrace()
            sys.settrace(lambda frame, event, arg: line if frame.f_code in codes else None)
            try:
                with parent_watch._signals_held_over():
                    pass  # (the put)
            except Terminated:
                pass
            finally:
                sys.settrace(previous_trace)
            if not sent:  # (fewer lines ran)
                break
            reached.append(k)
            assert sorted(ran) == sorted(sent), k
            for s in sent:  # (each handler in place, the hold's left too, runs the caller's once)
                with pytest.raises(Terminated):
                    os.kill(os.getpid(), s)
            assert sorted(ran) == sorted(sent * 2), k
            with parent_watch._signals_held_over():
                pass  # (the next put: it puts back a handler left the hold's)
            assert signal.getsignal(signal.SIGINT) is noted and signal.getsignal(signal.SIGTERM) is noted, k
    assert len(reached) > 5


@pytest.mark.parametrize("changed", ["static", "none", "gone"])
def test_the_hold_leaves_a_dali_pool_whose_send_changed_as_it_is(monkeypatch: pytest.MonkeyPatch, changed) -> None:
    """DALI's private pool: where its ``send`` is no plain method (a static one: wrapped as a method, it was called with
    the pool as its first argument), or is gone, the puts are left as DALI made them."""

    def put(tasks: Any, worker: Any) -> tuple[Any, Any]:
        return tasks, worker

    class ProcPool:
        if changed == "static":
            send = staticmethod(put)
        elif changed == "none":
            send = None

    before = ProcPool.__dict__.get("send")
    _holds_over_puts_of(monkeypatch, ProcPool)
    assert ProcPool.__dict__.get("send") is before
    if changed == "static":
        assert ProcPool().send([1], 0) == ([1], 0)


def test_a_signal_held_over_a_put_that_does_not_end_runs_its_handler_there_once(monkeypatch) -> None:
    """A put waits for a worker to wake: one killed or stopped meanwhile never does, and the signal held over it waited
    for ever (a second one ran it). Past ``HELD_PUT_S`` it is sent again, and its handler runs where the put is, once:
    not again as the block ends."""
    monkeypatch.setattr(parent_watch, "HELD_PUT_S", 0.2)
    ran: list[int] = []
    with _handled(lambda signum, frame: ran.append(signum), signal.SIGTERM):
        with parent_watch._signals_held_over():
            os.kill(os.getpid(), signal.SIGTERM)
            assert ran == []  # (held)
            deadline = time.monotonic() + 60
            while not ran and time.monotonic() < deadline:  # (the put that does not end)
                time.sleep(0.01)
            inside = list(ran)
        assert (inside, ran) == ([signal.SIGTERM], [signal.SIGTERM])


ROOT = Path(__file__).resolve().parents[1]


def _run(source: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *args],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
    )  # fmt: skip


#: A trainer whose SIGTERM handler exits gets one SIGTERM while its main thread puts a task to a worker that will never
#: take it: stopped while it slept waiting for tasks, then killed while the put waited for it to wake.
SIGTERM_IN_A_PUT_TO_A_WORKER_GONE = """
import atexit, os, signal, sys, threading, time
from lerobot_dali import DALILeRobotIterator
from lerobot_dali.exit_close import _worker_processes
from nvidia.dali._multiproc.shared_queue import ShmQueue

putting = threading.Event()
put = ShmQueue.put

def noted_put(self, msgs):
    putting.set()
    return put(self, msgs)

ShmQueue.put = noted_put

def main():
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=1)
    batches = iter(it)
    next(batches)
    time.sleep(1.0)  # (the worker fills its queue, then sleeps waiting for tasks)
    pids = [p.pid for p in _worker_processes(it)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    putting.clear()

    def worker_gone_then_sigterm():
        putting.wait()
        time.sleep(0.5)  # (the put waits for the stopped worker to wake)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=worker_gone_then_sigterm, daemon=True).start()
    for _ in batches:
        pass
    print("the pass ended", flush=True)

if __name__ == "__main__":
    main()
"""


def test_a_sigterm_in_a_put_to_a_worker_gone_ends_the_trainer(make_ds) -> None:
    # Held over the put for it to end, which it never did: the trainer waited for the launcher's SIGKILL (still there
    # 60 s after the SIGTERM, 1 of 1). It now exits 143 by its handler, past HELD_PUT_S, its exit handlers run.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = _run(SIGTERM_IN_A_PUT_TO_A_WORKER_GONE, str(ds))
    assert (done.returncode, done.stdout, done.stderr) == (143, "", "")


#: A Ctrl-C lands just after a worker's fork and exec (its Python handler runs there), before the trainer wrote the
#: worker's start-up data to its pipe.
CTRL_C_AS_A_WORKER_IS_SPAWNED = """
import multiprocessing.util, os, signal, sys

spawnv = multiprocessing.util.spawnv_passfds

def ctrl_c_in_the_spawn(path, args, passfds):
    pid = spawnv(path, args, passfds)
    if "spawn_main" in " ".join(map(str, args)):  # (a worker: not the resource tracker)
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    return pid

multiprocessing.util.spawnv_passfds = ctrl_c_in_the_spawn
from lerobot_dali import DALILeRobotIterator

def main():
    try:
        for _ in DALILeRobotIterator(sys.argv[1], batch_size=2, device="cpu", num_workers=1):
            pass
    except KeyboardInterrupt:
        sys.exit(130)

if __name__ == "__main__":
    main()
"""


def test_a_ctrl_c_as_a_worker_is_spawned_ends_the_trainer_and_the_worker_silently(make_ds) -> None:
    # The trainer's KeyboardInterrupt came before it wrote the worker's start-up data: the worker read its pipe's end
    # and printed "EOFError: Ran out of input" below the trainer's exit (1 of 24 Ctrl-C runs at random moments; 1 of 1
    # here). The Ctrl-C now lands once the worker started: the pool ends it.
    ds = make_ds(episodes=2, frames_per_episode=30)
    done = _run(CTRL_C_AS_A_WORKER_IS_SPAWNED, str(ds))
    assert (done.returncode, done.stderr) == (130, "")
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == 1
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in workers)


#: A worker slow to read its start-up data (an import it needs sleeps, as a trainer's imports take seconds) gets 2 MB
#: of it; a Ctrl-C lands while its start writes them, and a put's HELD_PUT_S is short.
CTRL_C_IN_A_SLOW_START = """
import multiprocessing, os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
import slow_import
from lerobot_dali import parent_watch

os.environ["SLOW_IMPORT"] = "1"  # (the worker's import of it, as it reads its data, takes 1 s)

parent_watch.HELD_PUT_S = 0.2
worker = multiprocessing.get_context("spawn").Process(target=slow_import.work, args=(b"x" * 2_000_000,))
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    with parent_watch.children_start_deaf_to_interrupts():
        worker.start()
except KeyboardInterrupt:
    print("interrupted once started:", worker.pid is not None, flush=True)
worker.join(60)
print(worker.exitcode)
"""


def test_a_ctrl_c_in_a_start_slow_to_be_read_lands_once_the_worker_has_its_data(tmp_path: Path) -> None:
    # A start's hold sent the signal again past HELD_PUT_S (meant for a put to a worker gone), raising in the middle of
    # the write: the worker printed "UnpicklingError: pickle data was truncated" (1 of 1), unknown to its pool.
    (tmp_path / "slow_import.py").write_text(
        "import os, time\n"
        "if os.environ.get('SLOW_IMPORT'):  # (set once the trainer has it: the worker, unpickling its target)\n"
        "    time.sleep(1.0)\n"
        "def work(data):\n"
        "    pass\n"
    )
    done = _run(CTRL_C_IN_A_SLOW_START, str(tmp_path))
    assert (done.returncode, done.stdout, done.stderr) == (0, "interrupted once started: True\n0\n", "")


@pytest.mark.parametrize(
    ("signum", "handler", "ends"),
    [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt), (signal.SIGTERM, _terminated, Terminated)],
    ids=["ctrl-c", "sigterm-handler-that-raises"],
)
def test_a_signal_as_a_take_from_dalis_queue_wakes_leaves_its_lock_as_it_was(signum, handler, ends) -> None:
    """The main thread's take from DALI's queue (the trainer's of the workers' results), a signal landing as its wait
    wakes, before it takes the queue's lock back: the handler's exception ended the take without the lock, and its
    ``with`` released the lock it did not hold: "semaphore or lock released too many times", in the take (train.py's
    exit status 1, not 130) or in the sender's thread (a worker's result thread). The handler now runs with the take
    ended and the lock let go: its own exception, the lock free, the queue usable."""
    from nvidia.dali._multiproc.messages import ShmMessageDesc
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    class SignalledAsItWakes:
        """The condition's count of woken sleepers: the waking take's release of it sends the signal, once."""

        def __init__(self, semaphore: Any) -> None:
            self.semaphore = semaphore

        def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
            return bool(self.semaphore.acquire(block, timeout))

        def release(self) -> None:
            self.semaphore.release()
            if threading.current_thread() is threading.main_thread() and not sent:
                sent.append(signum)
                os.kill(os.getpid(), signum)

    parent_watch.task_puts_finish_before_interrupts()
    queue = ShmQueue(multiprocessing.get_context("spawn"), capacity=4)
    condition = queue.cv_not_empty
    condition._woken_count = SignalledAsItWakes(condition._woken_count)
    sent: list[int] = []
    raised: list[BaseException] = []

    def put_once_the_take_waits() -> None:
        try:
            while condition._sleeping_count._semlock._get_value() == 0:  # (the take is not yet waiting)
                time.sleep(0.001)
            queue.put([ShmMessageDesc(0, 1, 0, 0, 0)])
        except BaseException as e:
            raised.append(e)

    putter = threading.Thread(target=put_once_the_take_waits)
    with _handled(handler, signum):
        try:
            putter.start()
            with pytest.raises(ends):
                queue.get(None)
        finally:
            putter.join()
    assert (sent, raised) == ([signum], [])
    assert queue.lock.acquire(False)  # (free: neither held on nor released twice)
    queue.lock.release()
    queue.put([ShmMessageDesc(0, 2, 0, 0, 0)])
    assert [m.shm_chunk_id for m in queue.get(None)] == [1, 2]  # (the take ended before it took 1: none lost)
    assert parent_watch._takes == []  # (no take's hold outlives it)
    queue.close()


def test_takes_the_hold_cannot_serve_are_dalis_own(monkeypatch) -> None:
    """A take from another thread (a training loop run in a thread: Python runs no handler there) and one from a queue
    without the condition the hold waits on (another DALI's) are DALI's take as it is, their messages returned."""
    import nvidia.dali._multiproc.shared_queue as dali_queue

    class ShmQueue:
        def __init__(self, condition: Any) -> None:
            self.cv_not_empty = condition

        def get(self, num_samples: int | None = None) -> list[int]:
            return [7, 8][:num_samples]

    monkeypatch.setattr(dali_queue, "ShmQueue", ShmQueue)
    parent_watch._hold_over_takes()
    assert getattr(ShmQueue.get, parent_watch._TAKE_WRAPPED, False)
    assert ShmQueue(None).get(1) == [7]  # (the main thread, no condition)
    assert _in_another_thread(lambda: ShmQueue(threading.Condition()).get(None)) == [7, 8]


def test_a_take_waiting_past_its_slices_takes_what_comes_and_leaves_the_queues_other_waits_as_they_were() -> None:
    """With no signal, a take waiting longer than a slice (:data:`_TAKE_SLICE_S`) waits on and returns the message put
    meanwhile; the condition keeps the sliced wait for good, and its waits outside a take are its own (a timed one
    waits its time and says it was not woken)."""
    from nvidia.dali._multiproc.messages import ShmMessageDesc
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    parent_watch.task_puts_finish_before_interrupts()
    queue = ShmQueue(multiprocessing.get_context("spawn"), capacity=4)
    putter = threading.Timer(4 * parent_watch._TAKE_SLICE_S, queue.put, ([ShmMessageDesc(0, 5, 0, 0, 0)],))
    putter.start()
    try:
        assert [m.shm_chunk_id for m in queue.get(None)] == [5]
    finally:
        putter.join()
    with queue.cv_not_empty:
        assert queue.cv_not_empty.wait(0.01) is False
    queue.close()


def test_a_take_from_dalis_queue_leaves_no_cycle_that_outlives_its_close() -> None:
    """The wrap of a queue's condition once held the condition's bound wait in a closure set on the condition: a
    reference cycle, so the queue's four semaphores lived past its close until a gc ran, and a forked child ending in
    ``os._exit`` left them registered ("resource_tracker: There appear to be 4 leaked semaphore objects"). Without a
    gc, the queue's condition now goes as the queue does."""
    import gc
    import weakref

    from nvidia.dali._multiproc.messages import ShmMessageDesc
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    parent_watch.task_puts_finish_before_interrupts()
    queue = ShmQueue(multiprocessing.get_context("spawn"), capacity=4)
    queue.put([ShmMessageDesc(0, 3, 0, 0, 0)])
    assert [m.shm_chunk_id for m in queue.get(None)] == [3]  # (the take wraps the condition's wait)
    condition = weakref.ref(queue.cv_not_empty)
    queue.close()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del queue
        assert condition() is None
    finally:
        if was_enabled:
            gc.enable()


def _exit_status(pid: int, *, within_s: float) -> int | None:
    """The forked child's exit status; None where it has not ended within ``within_s``: it is then sent SIGABRT, on
    which faulthandler (pytest's, inherited) prints where each of its threads was. Once, in a full run on a loaded
    machine, such a child never ended: ``waitpid`` held the forking thread, the test's ``join`` of it held the run,
    and the run's 12-minute faulthandler timeout ended it without the child's stack."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGABRT)
    os.waitpid(pid, 0)
    return None


def test_a_child_forked_while_the_main_thread_takes_from_dalis_queue_has_the_handlers_the_take_held() -> None:
    """Another thread forks as the main thread waits in a take from DALI's queue (a trainer's thread starting a
    process while the loop waits for its batch): the child kept the take's hold as its SIGINT handler, its own Ctrl-C
    held over a take it never makes (run 2 s late, sent again past ``HELD_PUT_S``). It now starts with the handler the
    take held over: its Ctrl-C raises at once.

    Run in a fresh interpreter: in pytest's own, whose main thread had converted frames with PyAV's ``to_ndarray``,
    the child hung inside ``os.fork`` itself, freeing that thread's PyAV 18.1.1 swscale context and its thread pool
    (:mod:`tests.test_fork_reformatters`; 3 full runs of 3 on 2026-12-07/08, none of 25 runs of this test alone)."""
    done = _run("from tests.test_parent_watch import forked_while_taking; print(forked_while_taking())")
    assert (done.returncode, done.stdout) == (0, "default_int_handler raised\n"), done.stderr


def forked_while_taking() -> str:
    """What the child forked by another thread as the main thread takes from DALI's queue says of its SIGINT
    handler: its name, and whether it raised (the test above runs this in a fresh interpreter)."""
    from nvidia.dali._multiproc.messages import ShmMessageDesc
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    parent_watch.task_puts_finish_before_interrupts()
    queue = ShmQueue(multiprocessing.get_context("spawn"), capacity=4)
    read, write = os.pipe()
    said: list[str] = []

    def child_says() -> str:
        handler = signal.getsignal(signal.SIGINT)
        try:
            os.kill(os.getpid(), signal.SIGINT)  # (a handler that raises does so before the next line)
            ran = "held"
        except KeyboardInterrupt:
            ran = "raised"
        return f"{getattr(handler, '__name__', handler)} {ran}"

    def fork_then_put() -> None:
        try:
            while queue.cv_not_empty._sleeping_count._semlock._get_value() == 0:  # (the take is not yet waiting)
                time.sleep(0.001)
            pid = os.fork()
            if pid == 0:  # (never back into pytest: os._exit)
                try:
                    os.write(write, child_says().encode())
                finally:
                    os._exit(0)
            if _exit_status(pid, within_s=60) == 0:
                said.append(os.read(read, 1000).decode())
        finally:
            queue.put([ShmMessageDesc(0, 4, 0, 0, 0)])

    forker = threading.Thread(target=fork_then_put)
    try:
        with _handled(signal.default_int_handler, signal.SIGINT):
            try:
                forker.start()
                assert [m.shm_chunk_id for m in queue.get(None)] == [4]
            finally:
                forker.join()
    finally:
        os.close(read)
        os.close(write)
        queue.close()
    [child_said] = said
    return child_said
