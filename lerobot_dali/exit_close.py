"""At exit, iterators are closed before DALI shuts their pipelines down, and the threads still iterating wait.

DALI shuts every pipeline down in an exit handler (``nvidia.dali.pipeline._shutdown_pipelines``), under any thread
still inside ``next()``: a script that ended while a daemon thread of its own was loading batches printed that
thread's traceback (``AttributeError: 'NoneType' object has no attribute 'SetExternalTLInput'``, or ``'ShareOutputs'``)
in 10 of 40 runs without workers, 39 of 40 with 2, and 1 of those aborted (``terminate called without an active
exception``). Exit handlers run once every non-daemon thread has ended, so a thread still iterating is a daemon the
interpreter is about to stop. :func:`watch` registers, after DALI's (they run last-registered first), a handler that
closes every live iterator, in close()'s order, which is safe under a pass in another thread (workers stopped, the
pass left to let the pipeline go); a pass that then finds its iterator closed waits, silent, to be stopped with its
thread (:func:`park_if_exiting`), as a daemon thread waiting on a queue is. The closes share one deadline,
``EXIT_WAIT_S`` (each close() waited up to ``CLOSE_WAIT_S`` for a pass stuck inside DALI's next(): 3 such iterators held
the exit 202 s), from which the worker processes of a close still running are killed (a worker that outlived its
SIGTERM held the exit for ever in the pool's close), once it has run ``STUCK_CLOSE_S``; those of the iterators not yet
closed are closed as usual after it. One warning names the datasets whose pass it left, and the workers it killed.
``EXIT_WAIT_S`` (10 s; ``$LEROBOT_DALI_EXIT_WAIT_S``) keeps the whole exit inside the 30 s launchers give between their
SIGTERM and SIGKILL: killed mid-close, the process left its workers' semaphores in ``/dev/shm``.

The handler then waits, up to ``RETURN_WAIT_S``, for the threads holding a pass's batch (:class:`BatchesHeld`, reading
the next one too) to come back for the next one and park there: on Python 3.11 the interpreter stops a daemon thread
that takes the GIL back once it has begun to finalize (``pthread_exit``), and one freeing a torch tensor releases it
there (``THPVariable_clear``), so the stop unwound through that C++ frame and aborted the process (``terminate called
without an active exception``, status 134). A loop over the iterator frees its last batch as the next one is handed
out: a script that ended while a daemon thread of its own iterated (without workers) aborted in 4 of 259 runs on 2 busy
cores (0 of 120 now), and in 11 of 11 where its loop's batches held 20,000 tensors (0 of 11). A thread of the script's
own that frees tensors elsewhere as it ends still aborts it (torch and Python's, not the iterator's: 28 of 30 runs of a
thread freeing plain tensors).

Every iterator is watched from its construction: a remote one's prefetcher reads from its first pass's warm-up on,
and closed only once the interpreter was finalizing (the iterator a global), it left a thread inside pyarrow's read of
a remote footer, stopped there, and the process aborted (``Fatal Python error: PyGILState_Release``).

Closing what the user holds is safe here: DALI shuts those pipelines down a moment later whatever we do, and close()
only ends what the iterator built (its pipeline, workers, prefetcher); iterating again (in a later exit handler)
builds the pipeline anew, a remote dataset's read without its prefetch cache (no prefetcher thread starts then).

A child forked from the process (``os.fork``) inherits the live iterators, this handler and DALI's, but not the threads
their pipelines run on. :func:`watch` also registers a fork hook: in the child, every DALI pipeline is left to the
parent (:mod:`.inherited_pipeline`: also one another thread was building or shutting down at the fork), and no
iterator is closed at the child's exit.
"""

from __future__ import annotations

import atexit
import gc
import logging
import math
import os
import threading
import time
import weakref
from collections import Counter
from typing import Any

from . import fork_locks
from .inherited_pipeline import abandon_all
from .wording import counted

__all__ = [
    "EXIT_WAIT_ENV",
    "EXIT_WAIT_S",
    "RETURN_WAIT_S",
    "STUCK_CLOSE_S",
    "BatchesHeld",
    "exit_wait_s",
    "exiting",
    "must_park",
    "park_if_exiting",
    "watch",
]

logger = logging.getLogger(__name__)

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = fork_locks.lock()
_registered = False
_exiting = threading.Event()
#: How long the exit handler waits for the threads holding a batch to come back for the next (a loop's body between two
#: batches); a thread that does not (blocked on a full queue of its own) holds the exit up that long.
RETURN_WAIT_S = 1.0
#: Environment variable: :data:`EXIT_WAIT_S` in seconds, for a launcher whose grace between SIGTERM and SIGKILL is
#: shorter than 30 s (``docker stop``'s 10 s: 2 at most), or a longer wait where nothing kills the process.
EXIT_WAIT_ENV = "LEROBOT_DALI_EXIT_WAIT_S"
_DEFAULT_EXIT_WAIT_S = 10.0


def exit_wait_s() -> float:
    """:data:`EXIT_WAIT_ENV`'s seconds, else 10; a ValueError names a value that is no finite number of seconds >= 0."""
    raw = os.environ.get(EXIT_WAIT_ENV, "").strip()
    if not raw:
        return _DEFAULT_EXIT_WAIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise ValueError(
            f"{EXIT_WAIT_ENV}={raw!r} is not a number of seconds >= 0: set it to how long the exit may wait for a pass "
            f"still inside DALI's next() (default {_DEFAULT_EXIT_WAIT_S:g}), or unset it"
        )
    return seconds


#: How long the exit handler's closes wait for passes in all (one deadline for every live iterator; set by
#: :data:`EXIT_WAIT_ENV`): each close() waited up to ``CLOSE_WAIT_S`` (60 s) for a pass stuck inside DALI's next(), N
#: times that for N such iterators, and a worker process that outlived its SIGTERM held the exit for ever. From the
#: deadline on, a close's workers are killed (:data:`STUCK_CLOSE_S`). The whole handler then ends within about
#: ``EXIT_WAIT_S + STUCK_CLOSE_S + RETURN_WAIT_S`` (16 s), DALI's own exit 1-2 s later, inside the 30 s a launcher gives
#: between its SIGTERM and its SIGKILL (torchrun's ``--shutdown-timeout``, Slurm's ``KillWait``, Kubernetes'
#: ``terminationGracePeriodSeconds``). It was 60 s: a SIGTERM whose handler exits, with a pass stuck, was SIGKILLed
#: mid-close at 30 s (by torchrun, and by a launcher that kills the process group as it does), the exit handlers after
#: this one never ran, and with 2 workers the 8 semaphores of their queues were left in ``/dev/shm`` (the resource
#: tracker was killed too).
EXIT_WAIT_S = exit_wait_s()
#: After the deadline, how long the exit handler's close of one iterator runs before its worker processes still running
#: are killed (its pool's close joins a worker that outlived its SIGTERM for ever); not sooner: killed as the pool's
#: close begins, a worker DALI is waking (its task queue's notify) never answers, and the close waits for ever.
STUCK_CLOSE_S = 5.0
_POLL_S = 0.1  # (past the deadline: how often the closes still running are looked at)
_out: Counter[int] = Counter()  # thread ident: passes whose batches it holds (BatchesHeld)
_parked: set[int] = set()  # thread idents parked for good (park_if_exiting): back, whatever other batches they hold
_returned = fork_locks.condition(_lock)


def watch(iterator: Any) -> None:
    """Close ``iterator`` at exit, before DALI's handler shuts its pipeline down; in a forked child, leave it (and
    every DALI pipeline) to the parent. (Called before the iterator builds a pipeline: from then on, a fork leaves
    what it builds.)"""
    import nvidia.dali.pipeline  # noqa: F401  (its exit handler registered first: this module's runs before it)

    global _registered
    with _lock:
        _live.add(iterator)
        if not _registered:
            atexit.register(_close_all)
            os.register_at_fork(after_in_child=_leave_to_parent)
            _registered = True


def exiting() -> bool:
    """Whether the exit handler ran (it closed every live iterator)."""
    return _exiting.is_set()


def must_park() -> bool:
    """Whether :func:`park_if_exiting` waits here: the exit handler ran, and this is not the main thread."""
    return exiting() and threading.current_thread() is not threading.main_thread()


def park_if_exiting() -> None:
    """In a thread other than the main one, once the exit handler ran: wait for ever (the interpreter stops this
    daemon thread). Call it outside the iterator's locks: the handler's close() may still want them."""
    if must_park():
        with _returned:  # (parked for good: it frees nothing more, whatever batches of other passes it holds)
            _parked.add(threading.get_ident())
            _returned.notify_all()
        threading.Event().wait()


class BatchesHeld:
    """A pass's batches with the thread that reads them, for the exit handler to wait for: from that thread's first
    read until the pass ends, or the thread parks. A loop holds its last batch while the pass reads the next, and frees
    it only as that one is handed out; counted from the handing out to the resume alone, a thread inside DALI's next()
    as the exit handler closed the iterator was not waited for, and the batch the pass still got there (read before the
    close) was handed out, the last one freed, as the interpreter finalized: with 2 workers, the script of 20,000-tensor
    batches aborted in 7 of 30 runs (``THPVariable_clear`` under ``pthread_exit``). Counted from the first handing out
    on, a thread reading the first batch of a pass (the next epoch's, its loop holding the last one's; or a pass another
    thread began) was not waited for either: 9 of 10 such exits aborted where the pass took 50 ms from DALI's next() to
    its ``yield``, 5 of 10 without that delay where the pass had been begun by another thread."""

    __slots__ = ("_ident",)

    def __init__(self) -> None:
        self._ident: int | None = None  # the thread holding them

    def claim(self) -> None:
        """Before the pass reads its next batch for this thread: it holds the pass's batches until the pass ends (or
        another thread reads on)."""
        ident = threading.get_ident()
        if ident == self._ident:  # (the thread that holds them already: one lock fewer per batch)
            return
        with _returned:
            _out[ident] += 1
            self._let_go()
            self._ident = ident

    def end(self) -> None:
        """The pass is over (finished, failed, or its generator closed): its thread holds none of its batches here."""
        with _returned:
            self._let_go()

    def _let_go(self) -> None:
        ident, self._ident = self._ident, None
        if ident is not None:
            # (none counted where a forked child let go of a pass its forking thread held: _leave_to_parent cleared it)
            if _out[ident] > 1:
                _out[ident] -= 1
            else:
                _out.pop(ident, None)
            _returned.notify_all()


def _close_all() -> None:
    _exiting.set()
    with _lock:  # (a daemon thread building an iterator now would change the set under the copy)
        live = list(_live)
    closes = _Closes(time.monotonic() + EXIT_WAIT_S)
    reaper = threading.Thread(target=_kill_stuck_workers, args=(closes,), daemon=True)
    try:
        reaper.start()
    except RuntimeError:
        # Python 3.12 starts no thread in an exit handler ("can't create new thread at interpreter shutdown"): it
        # raised here, no iterator was closed, and the traceback was printed at every exit. Closed without it, a worker
        # that outlives its SIGTERM holds the exit (as it did before the reaper).
        logger.debug("no thread to kill stuck workers at exit", exc_info=True)
    left: list[str] = []
    try:
        for iterator in live:
            closes.begin(iterator)
            try:
                closed = iterator._close_by(closes.deadline)
            except Exception:  # (DALI's handler still shuts the pipeline down; the exit must go on)
                logger.debug("closing an iterator at exit failed", exc_info=True)
                closed = True
            if closed:
                closes.end(iterator)
            else:  # (given up: left to its pass, inside DALI's next() or building its pipeline)
                left.append(_name(iterator))
    finally:
        closes.done.set()
        if reaper.ident is not None:  # (started)
            reaper.join()
    if left or closes.killed:  # (once, for all: each close() said its own, and named no dataset)
        said = [f"worker processes that did not stop, killed: {', '.join(closes.killed)}"] if closes.killed else []
        if left:
            said.insert(0, f"{counted(len(left), 'iterator')} not closed, a pass of each still inside DALI's next() or "
                        f"building its pipeline (left to DALI's exit handler): {', '.join(left)}")  # fmt: skip
        logger.warning("exit: within %g s, %s", EXIT_WAIT_S, "; ".join(said))
    with _returned:
        held = _held_elsewhere()
    if held:
        # A pass left in a reference cycle (its generator neither ended nor collected) never comes back for its next
        # batch: its thread, alive elsewhere, held the exit all of RETURN_WAIT_S (1.0 s in 3 of 3 exits). Collected
        # here, it ends (BatchesHeld.end), as it would at the interpreter's own collection a moment later.
        gc.collect()
    _wait_for_batches_back(time.monotonic() + RETURN_WAIT_S)


def _name(iterator: Any) -> str:
    """The dataset ``iterator`` reads, as its errors name it."""
    reader = getattr(iterator, "reader", None)
    return reader.location.description if reader is not None else repr(iterator)


def _worker_processes(iterator: Any) -> list[Any]:
    """The DALI worker processes of ``iterator``'s pipeline (multiprocessing ``Process`` objects; DALI's private
    pool: none where it changed)."""
    pool = getattr(getattr(getattr(iterator, "_pipeline", None), "_py_pool", None), "pool", None)
    return list(getattr(pool, "_processes", ()))


class _Closes:
    """The exit handler's closes, as :func:`_kill_stuck_workers` watches them: their ``deadline``, the iterators whose
    close began and has not closed them (the one closing now, and those left to their passes) with when it began, and
    the workers killed."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.done = threading.Event()
        self.stuck: dict[int, tuple[Any, float]] = {}  # id(iterator): (iterator, when its close began)
        self.killed: list[str] = []

    def begin(self, iterator: Any) -> None:
        self.stuck[id(iterator)] = (iterator, time.monotonic())

    def end(self, iterator: Any) -> None:
        self.stuck.pop(id(iterator), None)


def _kill_stuck_workers(closes: _Closes) -> None:
    """From ``closes.deadline`` on, until the closes are done: kill the worker processes still running of each iterator
    whose close has run ``STUCK_CLOSE_S`` and not closed it (its pool's close joins each worker for ever once it sent
    SIGTERM: a worker stuck where the signal does not end it held the exit for ever, and multiprocessing's own exit
    handler joins them too).

    Not those of the iterators whose close had not begun: killed at the deadline, an idle pool whose close began as
    the worker died waited for ever in DALI's notify of its task queue (a killed worker never wakes to answer it), and
    the exit with it (4 of 12 exits where one other pass was stuck; the other 8 killed the idle pools' 4 workers)."""
    timeout = closes.deadline - time.monotonic()
    while not closes.done.wait(max(0.0, timeout)):
        timeout = _POLL_S
        for iterator, began in list(closes.stuck.values()):
            if time.monotonic() - began < STUCK_CLOSE_S:
                continue
            for process in _worker_processes(iterator):
                said = f"{process.pid} ({_name(iterator)})"
                try:  # (once each: a worker whose teardown outlasts a poll was killed, and named, again)
                    if process.exitcode is None and said not in closes.killed:
                        process.kill()
                        closes.killed.append(said)
                except Exception:  # (reaped meanwhile)
                    logger.debug("killing a worker at exit failed", exc_info=True)


def _held_elsewhere() -> bool:
    """Whether a live thread other than this one holds a pass's batches and has not parked (with ``_lock`` held)."""
    others = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}
    return bool(others.intersection(_out).difference(_parked))


def _wait_for_batches_back(deadline: float) -> bool:
    """Until ``deadline``: wait for every other live thread holding a batch to come back for the next (it parks);
    whether all did.

    A thread that parked is back, whatever batches of other passes it still holds: a mixture's thread holds each of
    its datasets' batches and comes back to the anchor's alone (it parks there), as a loop over ``zip()`` of two
    iterators comes back to the first; counted by what it held, each such exit waited all of ``RETURN_WAIT_S``."""

    with _returned:
        return _returned.wait_for(lambda: not _held_elsewhere(), timeout=max(0.0, deadline - time.monotonic()))


def _leave_to_parent() -> None:
    """In a forked child: the live iterators and every DALI pipeline are the parent's; none is closed here at exit."""
    _live.clear()  # (_lock: a fork_locks lock, free here though a thread of the parent held it at the fork)
    _out.clear()  # (the parent's threads: none lives here)
    _parked.clear()
    abandon_all()
