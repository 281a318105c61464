"""Blocking calls made several at once, for work that waits on the network one request after another: opening
remote datasets, probing their first files, building a mixture's parts, reading data file footers; and the other
side, one call per key at a time (:class:`KeyedLocks`), where threads would repeat one request or build. Calls
that gain nothing from threads (:func:`one_by_one`) show their progress alike.

Results come in order and the first exception in order is raised, once every call has ended (so a caller may
clean up what the others made), as a loop over the items would give them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

from . import fork_locks
from .distributed import draws_progress
from .progress_lines import progress_counter

__all__ = ["MAX_THREADS", "PROGRESS_DELAY_S", "KeyedLocks", "in_threads", "one_by_one"]

logger = logging.getLogger(__name__)

#: Calls made at once, at most.
MAX_THREADS = 16
#: Seconds :func:`in_threads` runs before it shows its progress.
PROGRESS_DELAY_S = 2.0
_T = TypeVar("_T")
_R = TypeVar("_R")


def in_threads(
    function: Callable[[_T], _R],
    items: Sequence[_T],
    *,
    progress: str | None = None,
    unit: str = "dataset",
    since: float | None = None,
) -> list[_R]:
    """``function`` of each item, in order, :data:`MAX_THREADS` at once (20 datasets over HTTP with 50 ms of latency
    took 48 s to open one by one, 3 s so). ``progress``: where it takes over :data:`PROGRESS_DELAY_S`, the items
    (``unit``: datasets, files) done so far under that name, on a node's first rank only
    (:func:`~lerobot_dali.distributed.draws_progress`): a bar on a terminal (``HF_HUB_DISABLE_PROGRESS_BARS`` turns
    it off), INFO lines in a log (:func:`~lerobot_dali.progress_lines.progress_counter`). ``since``: the
    :func:`time.monotonic` at which the wait this call is part of began, where several calls make one wait (a
    survey per camera: 3 cameras of 150 files each were 3.6 s of silence, each under the delay); default: now."""
    if len(items) < 2:
        return [function(item) for item in items]
    with (
        _counted(len(items), progress, unit, since) as done,
        ThreadPoolExecutor(min(len(items), MAX_THREADS), thread_name_prefix="lerobot-dali-at-once") as pool,
    ):
        calls = _OnceEach(function, items)
        for i in range(len(items)):
            try:
                pool.submit(calls.call, i)
            except RuntimeError:  # (the interpreter is shutting down: its main thread ended, and no pool takes work)
                # A daemon thread starting a mixture's next pass as the script ended printed this error's traceback (3
                # of 4 exits; where the shutdown began between two submits, 3 of 3 scripted): the items left are taken
                # here, one by one, as the exit handler expects a pass to start.
                calls.call(i)
        for _ in as_completed(calls.futures):  # (counted here: the counter is one thread's)
            done(1)
        return [future.result() for future in calls.futures]


class _OnceEach(Generic[_T, _R]):
    """``function`` of each of ``items``, each called once, by whichever thread asks first: a pool's, or the one that
    submits where the pool takes no more work. (Python 3.12 starts no thread once the interpreter is finalizing: a
    submit raises "can't create new thread at interpreter shutdown" after queueing its item, which a busy thread of the
    pool then ran too: 13 of 30 scripted exits called an item twice.)"""

    def __init__(self, function: Callable[[_T], _R], items: Sequence[_T]) -> None:
        self._function, self._items = function, items
        #: Each item's result, or what its call raised (in order with the others', once every call has ended).
        self.futures: list[Future[_R]] = [Future() for _ in items]
        self._claimed: set[int] = set()
        self._claiming = fork_locks.lock()

    def call(self, i: int) -> None:
        with self._claiming:
            if i in self._claimed:
                return
            self._claimed.add(i)
        try:
            self.futures[i].set_result(self._function(self._items[i]))
        except BaseException as e:  # (as a pool's thread keeps it: raised by result())
            self.futures[i].set_exception(e)


def one_by_one(
    function: Callable[[_T], _R], items: Sequence[_T], *, progress: str | None = None, unit: str = "file"
) -> list[_R]:
    """``function`` of each item, in order, in this thread (where threads buy nothing: local files' footers are CPU
    work under the GIL), its progress shown as :func:`in_threads` shows it (a cold open of 15,000 v2.1 episodes read
    their data files' footers for 9-17 s with no word)."""
    results = []
    with _counted(len(items), progress, unit) as done:
        for item in items:
            results.append(function(item))
            done(1)
    return results


def _counted(
    total: int, progress: str | None, unit: str, since: float | None = None
) -> AbstractContextManager[Callable[[int], None]]:
    """:func:`~lerobot_dali.progress_lines.progress_counter` of ``total`` ``unit``s named ``progress`` (None: none
    shown), :data:`PROGRESS_DELAY_S` after ``since`` (None: now), on a node's first rank only."""
    waited_s = 0.0 if since is None else time.monotonic() - since
    return progress_counter(
        total, desc=progress or "", unit=unit, logger=logger, delay_s=max(0.0, PROGRESS_DELAY_S - waited_s),
        first_line_s=0.0, enabled=progress is not None and draws_progress(),
    )  # fmt: skip


class KeyedLocks:
    """A lock per key, made when first asked for and dropped once no thread holds or waits for it: threads that want
    one key's work at once (a file's metadata request, its packet index, an NVDEC probe) take turns, so the later
    ones find the first one's result where it keeps it instead of doing the work again. Pickles empty (locks do not
    pickle)."""

    def __init__(self) -> None:
        #: key -> its lock and how many threads hold or wait for it (dropped while one waited, a third thread made a
        #: new lock and did the key's work beside the waiter).
        self._locks: dict[Hashable, tuple[threading.RLock, int]] = {}
        self._guard = fork_locks.lock()

    @contextmanager
    def held(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key) or (fork_locks.lock(), 0)
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                if users := self._locks[key][1] - 1:
                    self._locks[key] = (lock, users)
                else:
                    del self._locks[key]

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyedLocks, ())
