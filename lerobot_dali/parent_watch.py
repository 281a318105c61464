"""End a DALI worker process when the training process that started it dies.

DALI's workers wait on a futex for the next task, and nothing wakes them when their parent is killed without
a chance to close the pool (SIGKILL from the out-of-memory killer or a scheduler's preemption): measured,
both workers of a killed trainer were still there a minute later with 380 MB each, reparented to init, and
every restart of a job on the node would leave another set. A daemon thread waits on the parent's
multiprocessing sentinel (readable once the parent is gone) and checks twice a second whether the worker was
reparented; either ends the worker. torch's DataLoader workers watch their parent for the same reason.

A forked child inherits what says a thread watches, not the thread: a child of a watched process (multiprocessing's
'fork') was told it was watched, and outlived its parent killed (3 of 3 scripted). It starts a watch of its own. A
child of ``os.fork`` is no multiprocessing child, yet multiprocessing names the forking process's parent as its own:
watching that one ended it at once, its parent alive (3 of 3). It is not watched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.util
import os
import signal
import threading
import types
import weakref
from collections.abc import Iterator
from typing import Any

from . import fork_locks

__all__ = [
    "HELD_PUT_S",
    "children_start_deaf_to_interrupts",
    "exit_with_parent",
    "leave_interrupts_to_parent",
    "task_puts_finish_before_interrupts",
]

logger = logging.getLogger(__name__)

_lock = fork_locks.lock()
#: The process whose thread watches its parent (a forked child inherits the value, not the thread).
_watching_in: int | None = None
#: Where this process was forked (os.fork, or multiprocessing's 'fork' before it names the new parent): the parent
#: multiprocessing named then, the forking process's, not this one's.
_parent_at_fork: multiprocessing.process.BaseProcess | None = None

#: How often the parent's pid is checked (see ``_wait_then_exit``).
_POLL_S = 0.5


def exit_with_parent() -> bool:
    """In a multiprocessing child, start (once) a thread that exits this process when its parent dies.

    Returns whether this process is watched. The main process has no parent to watch: nothing happens there,
    so a training process that outlives its launching shell is never ended by this; nor does it in a child of
    ``os.fork``, whose parent multiprocessing does not know.
    """
    global _watching_in
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None or parent is _parent_at_fork:
        return False
    with _lock:
        if _watching_in != os.getpid():
            _watching_in = os.getpid()
            name = "lerobot-dali-parent-watch"
            threading.Thread(target=_wait_then_exit, args=(parent,), name=name, daemon=True).start()
    return True


def leave_interrupts_to_parent() -> bool:
    """In a multiprocessing child's main thread, ignore SIGINT and SIGUSR1 and end on SIGTERM by raising SystemExit;
    returns whether it now does.

    Ctrl-C in a terminal reaches the whole process group: the trainer's KeyboardInterrupt ends its workers (they
    exit with it, above), and each worker's own printed one more KeyboardInterrupt traceback. torch's DataLoader
    workers ignore it the same way. SIGUSR1 (SLURM's notice ahead of a preemption, sent to every process of the job)
    is left to the trainer too, whose workers it ended. SIGTERM (torchrun's to each rank's process group, SLURM's to
    every process) still ends a worker, but unwinding, so that it lets go of the locks of DALI's queues it shares
    with the trainer: ended outright while it held one, the trainer (which may outlive the signal to save a
    checkpoint) waited for it for ever, in its next batch or in closing the pool.
    """
    if multiprocessing.parent_process() is None or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_unwinding)
    task_puts_finish_before_interrupts()  # (its SIGTERM's SystemExit: not within its take of a task, either)
    return True


#: What a worker leaves to the trainer (:func:`leave_interrupts_to_parent`), from its start on where it is spawned
#: within :func:`children_start_deaf_to_interrupts`.
_LEFT_TO_PARENT = {signal.SIGINT, signal.SIGUSR1}
_spawning = threading.local()
_WRAPPED = "_lerobot_dali_deaf_children"


@contextlib.contextmanager
def children_start_deaf_to_interrupts() -> Iterator[None]:
    """Within, the processes this thread spawns (multiprocessing's ``spawn``: DALI's workers) start with SIGINT and
    SIGUSR1 blocked, as they keep them: :func:`leave_interrupts_to_parent` ignores them only once a worker runs its
    source, and a Ctrl-C while the workers were still importing DALI printed a KeyboardInterrupt traceback from each
    (2 workers: 2 tracebacks of 10 lines below the trainer's one line). A blocked signal's mask passes through fork and
    exec; this thread blocks them only while it forks, so the trainer still takes its Ctrl-C, once each process it
    starts has what it starts from (:func:`_wrap_start`)."""
    _wrap_spawn()
    previous = getattr(_spawning, "deaf", False)
    _spawning.deaf = True
    try:
        yield
    finally:
        _spawning.deaf = previous


@functools.cache
def _wrap_spawn() -> None:
    with _lock:  # (functools.cache alone lets two threads that ask first both wrap it)
        _wrap_spawnv()
        _wrap_start()


def _wrap_spawnv() -> None:
    original: Any = getattr(multiprocessing.util, "spawnv_passfds", None)
    if original is None or getattr(original, _WRAPPED, False):  # (a Python without it: workers start hearing them)
        return

    @functools.wraps(original)
    def spawnv_passfds(path: Any, args: Any, passfds: Any) -> Any:
        if not getattr(_spawning, "deaf", False):
            return original(path, args, passfds)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _LEFT_TO_PARENT)
        try:
            return original(path, args, passfds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    setattr(spawnv_passfds, _WRAPPED, True)
    multiprocessing.util.spawnv_passfds = spawnv_passfds


def _wrap_start() -> None:
    """A spawned process's start runs a signal's handler (:func:`_signals_held_over`) once the process has its start-up
    data: a Ctrl-C after the fork and exec, before the trainer wrote that data to the new worker's pipe, closed the pipe
    unwritten, and the worker printed ``EOFError: Ran out of input`` below the trainer's one line (1 of 24 Ctrl-C runs
    at random moments; 1 of 1 where it landed after the exec). Nor did the pool know the worker to end it."""
    process_class: Any = getattr(multiprocessing.context, "SpawnProcess", None)
    original: Any = getattr(process_class, "start", None)
    if not isinstance(inspect.getattr_static(process_class, "start", None), types.FunctionType) or getattr(
        original, _WRAPPED, False
    ):  # (another Python: a Ctrl-C may still land there)
        return

    # CPython's SpawnProcess inherits BaseProcess.start: looked up as it is called, not kept from now (a start patched
    # on BaseProcess later, as a tracer or a test's, was skipped for every spawned process).
    own = "start" in vars(process_class)

    def started(process: Any) -> None:
        return original(process) if own else super(process_class, process).start()

    @functools.wraps(original)
    def start(self: Any) -> None:
        if not getattr(_spawning, "deaf", False):
            return started(self)
        # (held to the start's end, not sent again past HELD_PUT_S: its write ends once the process reads or dies, and
        # one slow to read, its imports under way, was written half its data: 'pickle data was truncated', 1 of 1)
        with _signals_held_over(resend=False):
            return started(self)

    setattr(start, _WRAPPED, True)
    process_class.start = start


_SEND_WRAPPED = "_lerobot_dali_puts_finish"


#: The signals whose Python handler (one that raises ends the put) waits for a task put to end: Ctrl-C's, what launchers
#: and schedulers send (torchrun passes on SIGTERM, SIGINT, SIGHUP and SIGQUIT; Slurm sends SIGTERM, and SIGUSR1 or
#: another with ``--signal``) and SIGALRM (``signal.alarm`` timeouts).
_HELD_OVER_PUTS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)


@functools.cache
def task_puts_finish_before_interrupts() -> None:
    """From now on, a signal of :data:`_HELD_OVER_PUTS` with a Python handler (Ctrl-C's KeyboardInterrupt, a SIGTERM
    handler that exits) while the main thread puts tasks to DALI's workers (its pool's ``send``, in DALI's next()) runs
    that handler once the put is done, or where the put is once it has waited :data:`HELD_PUT_S` (a put that never
    ends, to a worker gone, yields to it); a second one of the same signal meanwhile runs it at once.

    The put notifies the worker through a multiprocessing ``Condition`` shared with it, and waits there for the worker
    to wake: interrupted there, the condition was left a wake over its sleepers, and the next notify (the pool's close,
    in DALI's observer thread; the worker's own close) raised "notify: Bug in sleeping_count": a traceback after
    train.py's one line (2 of 10 Ctrl-C runs under load); the same, 1 of 1, where a SIGTERM handler raised SystemExit
    there (only Ctrl-C was held).

    A take from one of DALI's queues (``ShmQueue.get``: the trainer's of the workers' results, a worker's of its next
    task) is held over the same way, its wait for a message cut in :data:`_TAKE_SLICE_S` slices: a signal held ends
    the take at the next slice, nothing taken and the lock let go, its handler run there and the take begun again
    where the handler returns. The wait takes the queue's lock back as it wakes, blocked while the sender holds it:
    interrupted there, the take ended without the lock, and its ``with`` released the sender's: "semaphore or lock
    released too many times" (in a worker's result thread, or in the take itself: train.py's exit status 1 in place of
    130) and "lock is not owned" (the pool's observer thread) after train.py's one line: 1 of 60 exits at random
    moments (Ctrl-C or SIGTERM to the process group), 0 of 60 now. DALI's private pool: nothing is done where it
    changed."""
    _hold_over_takes()
    try:
        from nvidia.dali._multiproc.pool import ProcPool
    except ImportError:  # (a DALI without it: puts are interrupted as before)
        return

    def held_over(original: Any) -> Any:
        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _signals_held_over():
                return original(self, *args, **kwargs)

        return send

    _wrap_method(ProcPool, "send", _SEND_WRAPPED, held_over)


def _wrap_method(cls: type, name: str, marker: str, wrapper: Any) -> None:
    """Sets method ``name`` of DALI's ``cls`` to ``wrapper(original)``, marked ``marker``, once; left as it is where it
    is no plain method, as DALI's is (a static one, wrapped as a method, was called with the pool as its first task)."""
    with _lock:
        original: Any = inspect.getattr_static(cls, name, None)
        if not isinstance(original, types.FunctionType) or getattr(original, marker, False):
            return
        wrapped = functools.wraps(original)(wrapper(original))
        setattr(wrapped, marker, True)
        setattr(cls, name, wrapped)


#: How long a take from DALI's queue waits for a message at a time, a signal held over it: its handler runs this long
#: after the signal, at most (the take's lock held by a sender: once it is let go).
_TAKE_SLICE_S = 0.1
_TAKE_WRAPPED = "_lerobot_dali_takes_yield"
#: The held signals of the main thread's takes in progress, innermost last.
_takes: list[dict[int, Any]] = []


class _SignalHeld(Exception):
    """Ends a take from DALI's queue where nothing was taken, its lock held, so that a signal held over it runs."""


def _hold_over_takes() -> None:
    """Wraps DALI's ``ShmQueue.get`` (see :func:`task_puts_finish_before_interrupts`)."""
    try:
        from nvidia.dali._multiproc.shared_queue import ShmQueue
    except ImportError:  # (a DALI without it: takes are interrupted as before)
        return

    def held_over(original: Any) -> Any:
        def get(self: Any, *args: Any, **kwargs: Any) -> Any:
            condition = getattr(self, "cv_not_empty", None)
            if threading.current_thread() is not threading.main_thread() or condition is None:
                return original(self, *args, **kwargs)
            _wait_in_slices(condition)
            while True:
                with _signals_held_over() as held:
                    _takes.append(held)
                    try:
                        return original(self, *args, **kwargs)
                    except _SignalHeld:
                        pass  # (its handler runs as the hold ends; where it returns, the take begins again)
                    finally:
                        _takes.pop()

        return get

    _wrap_method(ShmQueue, "get", _TAKE_WRAPPED, held_over)


def _wait_in_slices(condition: Any) -> None:
    """The main thread's untimed ``wait`` on ``condition`` (a queue's, within its take) returns after
    :data:`_TAKE_SLICE_S` at most (its caller looks at the queue again and waits on), or raises :class:`_SignalHeld`
    as it returns where a signal is held over the take: the wait has taken the lock back, and the take has taken
    nothing (raised after the take, the handler's exception lost the messages taken)."""
    if getattr(condition.wait, _TAKE_WRAPPED, False):
        return
    # (the class's wait and a weak reference: a closure over the bound method is a cycle through the condition, which
    # kept its four semaphores past the queue's close until a gc; a forked child ending in os._exit never let them go)
    unbound, held_condition = type(condition).wait, weakref.ref(condition)

    def wait(timeout: float | None = None) -> bool:
        own = held_condition()
        if timeout is not None or not _takes or threading.current_thread() is not threading.main_thread():
            return bool(unbound(own, timeout))
        woken = bool(unbound(own, _TAKE_SLICE_S))
        if _takes[-1]:  # (woken or not: the messages are left in the queue, for the next take)
            raise _SignalHeld
        return woken

    setattr(wait, _TAKE_WRAPPED, True)
    condition.wait = wait


_HOLDS = "_lerobot_dali_holds"  # (a hold's attribute: the handlers it holds over, by signal)
#: How long a signal held over a task put waits for the put to end before its handler runs where the put is. A put waits
#: for a worker to wake, and one killed or stopped meanwhile never does: a single SIGTERM (a trainer's handler that
#: exits) then waited for the launcher's SIGKILL, the exit handlers never run (a worker killed while the put waited for
#: it: the trainer was still there 60 s after the SIGTERM, 1 of 1 scripted; now it exits 143, its exit handlers begun
#: 2 s after the SIGTERM). A put to a live worker takes microseconds to milliseconds.
HELD_PUT_S = 2.0
_resend_lock = fork_locks.lock()  # (a held signal is sent again, or the hold ends: one at a time)


@contextlib.contextmanager
def _signals_held_over(*, resend: bool = True) -> Iterator[dict[int, Any]]:
    """Within, in the main thread, the Python handler of a signal of :data:`_HELD_OVER_PUTS` runs as the block ends, in
    the order the signals came (a second one of a signal: at once), with the frame it landed in; ``resend``: where the
    block has run :data:`HELD_PUT_S` since the signal came, the signal is sent to the main thread again, its handler
    run there (once: not again as the block ends).

    From the block's end on, a signal's handler runs where it lands, and the handlers are put back before the held ones
    run (a handler may set its signal's next one). A signal whose handler raises as the handlers are put back
    (``signal.signal()`` runs those of pending signals before it changes one) leaves the others not put back: each
    passes every signal on to its handler, and the next block puts that handler back. (Held over SIGINT alone, a second
    Ctrl-C landing as SIGINT's was put back left it the hold's for good, the put's frame held.)"""
    if threading.current_thread() is not threading.main_thread():  # (Python runs no handler in another thread)
        yield {}
        return
    previous: dict[int, Any] = {}
    for s in _HELD_OVER_PUTS:
        handler = signal.getsignal(s)
        handler = getattr(handler, _HOLDS, {}).get(s, handler)  # (one left by an earlier block: its handler)
        if callable(handler):
            previous[s] = handler
    held: dict[int, Any] = {}  # signal: the frame it landed in, in the order they came
    ending = False
    overdue: list[threading.Timer] = []  # (one a signal held: it sends the signal again past HELD_PUT_S)
    resent: set[int] = set()  # (signals sent again: their handler ran where that one landed, not as the block ends)

    def hold(signum: int, frame: Any) -> None:
        if signum in held or ending:
            previous[signum](signum, frame)
            return
        held[signum] = frame
        if not resend:
            return
        timer = threading.Timer(HELD_PUT_S, send_again, (signum,))
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # (no thread starts at interpreter shutdown: the signal waits for the put, as it did)
            logger.debug("no thread to send signal %d again past a put's %g s", signum, HELD_PUT_S, exc_info=True)
            return
        overdue.append(timer)

    def send_again(signum: int) -> None:
        with _resend_lock:
            if not ending:  # (the put still on: the signal lands in it as a second one, its handler run at once)
                resent.add(signum)
                signal.pthread_kill(threading.main_thread().ident or 0, signum)

    setattr(hold, _HOLDS, previous)
    try:
        for held_over in previous:
            signal.signal(held_over, hold)
        yield held
    finally:
        try:  # (inside it: a held signal's handler still runs where another one's raises as this one is set)
            ending = True  # (the put is over: from here on a signal's handler runs where it lands)
            for timer in overdue:
                timer.cancel()
            if overdue:
                with _resend_lock:  # (a signal being sent again is sent: its handler runs where it lands)
                    pass
            for held_over, handler in previous.items():
                signal.signal(held_over, handler)
        finally:
            error = None
            for came, frame in held.items():
                if came in resent:
                    continue
                try:
                    previous[came](came, frame)
                except BaseException as e:  # (the others' still run, as Python runs those of signals pending)
                    error = error or e  # (no call here: a signal's exception lands only after one)
            if error is not None:
                raise error


def _exit_unwinding(signum: int, frame: object) -> None:
    if not threading.main_thread().is_alive():
        # Exiting already (threading's shutdown is done, exit handlers run): nothing is left to unwind, and raised in
        # an exit handler (DALI's, as the pool closes and sends SIGTERM) it printed "Exception ignored in atexit
        # callback ... SystemExit: 143". The signal ends the process as by default.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise SystemExit(128 + signum)  # (the status a shell gives a process the signal ended)


#: Signals the watching thread never takes: the kernel gives a process's signal to any thread not blocking it, and
#: Python runs the handler in the main thread only once that runs Python again: taken by another thread, a SIGTERM
#: waits until the main thread's wait for its next task ends (a test's child asleep for 120 s, whose queue's thread
#: took it, was still there 60 s later).
_LEFT_TO_MAIN_THREAD = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}


def _wait_then_exit(parent: multiprocessing.process.BaseProcess) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, _LEFT_TO_MAIN_THREAD)
    # The sentinel alone is not enough: it reads end-of-file only once every copy of the parent's end is closed,
    # and a process the trainer forked after starting the workers holds one. Being reparented is the other sign.
    while not multiprocessing.connection.wait([parent.sentinel], timeout=_POLL_S) and os.getppid() == parent.pid:
        pass
    logger.warning("worker %d: the process that started it (%s) is gone; exiting", os.getpid(), parent.pid)
    os._exit(1)


def _forked() -> None:
    global _parent_at_fork
    _parent_at_fork = multiprocessing.parent_process()
    # A child forked by another thread while the main thread was inside a hold (its take of a batch, a put, a worker's
    # start) kept the hold's handler for good, its own signals held over a take it never makes: its first Ctrl-C (or a
    # SIGTERM handler's exit) ran 2 s late, sent again past HELD_PUT_S (1 of 1 scripted), or never, within a start's
    # hold. The child starts with the handlers the hold holds over.
    for signum in _HELD_OVER_PUTS:
        held = getattr(signal.getsignal(signum), _HOLDS, {})
        if signum in held:
            signal.signal(signum, held[signum])


os.register_at_fork(after_in_child=_forked)
