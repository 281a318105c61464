"""A lock another thread holds at a fork (``os.fork``) is free in the child, and still held in the parent."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali import (
    clips,
    decode_route,
    episode_rows,
    episode_table,
    exit_close,
    fork_locks,
    io_stats,
    iterator,
    key_rename,
    keyframe_sizes,
    literal_parsing,
    open_files,
    packet_index_cache,
    packet_index_store,
    said_once,
    sample_order,
    worker_start,
)


@contextmanager
def held_by_a_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread within the block."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


def free_in_child(lock: Any) -> bool:
    """Whether a child forked now takes ``lock`` at once (and releases it); the parent's is left as it is."""
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        free = lock.acquire(blocking=False)
        if free:
            lock.release()
        os._exit(0 if free else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.mark.parametrize("make", [fork_locks.lock, fork_locks.rlock])
def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child_only(make: Callable[[], Any]) -> None:
    lock = make()
    with held_by_a_thread(lock):
        assert free_in_child(lock)
        assert not lock.acquire(blocking=False)  # (the parent's: still its thread's)
    assert lock.acquire(blocking=False)


def released_in_child(lock: Any, times: int) -> bool:
    """Whether a child forked now, carrying on as the thread that took ``lock`` ``times`` times, releases it as often
    and then finds it free."""
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        try:
            for _ in range(times):
                lock.release()
            free = lock.acquire(blocking=False)
        except RuntimeError:
            os._exit(1)
        os._exit(0 if free else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.mark.parametrize(("make", "times"), [(fork_locks.lock, 1), (fork_locks.rlock, 1), (fork_locks.rlock, 2)])
def test_a_lock_the_forking_thread_holds_stays_its_own_in_the_child(make: Callable[[], Any], times: int) -> None:
    # A signal handler's fork inside a ``with``, the child carrying on: made free, its release raised RuntimeError
    # ("cannot release un-acquired lock"), 1 of 1 at each depth; lock()'s, a plain Lock's, 20 of 20 at depth 1.
    lock = make()
    for _ in range(times):
        lock.acquire()
    assert released_in_child(lock, times)
    for _ in range(times):
        lock.release()  # (the parent's: still its own)


def entered_by_another_thread_in_child(lock: Any) -> bool:
    """Whether, in a child forked now, a thread other than the forking one takes ``lock`` (which the forking thread
    holds) at once."""
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        entered: list[bool] = []
        other = threading.Thread(target=lambda: entered.append(lock.acquire(blocking=False)))
        other.start()
        other.join()
        os._exit(1 if entered[0] else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 1


@pytest.mark.parametrize("make", [fork_locks.lock, fork_locks.rlock])
def test_no_other_thread_of_the_child_enters_what_the_forking_thread_holds(make: Callable[[], Any]) -> None:
    # lock()'s, a plain Lock made free in the child: another of its threads entered the critical section the forking
    # thread was in (20 of 20).
    lock = make()
    with lock:
        assert not entered_by_another_thread_in_child(lock)


def test_a_cached_property_computed_on_the_forking_thread_returns_in_the_child() -> None:
    # Python 3.11 computes under the attribute's lock: a child forked within the compute raised RuntimeError as it
    # returned (1 of 1).
    class Forking:
        @fork_locks.cached_property
        def pid(self) -> int:
            return os.fork()

    parent = os.getpid()
    try:
        pid = Forking().pid
    except RuntimeError:
        if os.getpid() != parent:
            os._exit(1)  # (never back into pytest)
        raise
    if pid == 0:
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_a_condition_forgets_the_parents_waiters_in_a_forked_child() -> None:
    # A parent thread waiting at the fork took the child's notify(): the child's waiter timed out (1 of 1).
    condition = fork_locks.condition()
    waiting = threading.Thread(target=lambda: [condition.acquire(), condition.wait(), condition.release()], daemon=True)
    waiting.start()
    while not condition._waiters:  # type: ignore[attr-defined]
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        woken: list[bool] = []

        def wait() -> None:
            with condition:
                woken.append(condition.wait(timeout=2))

        child_waiter = threading.Thread(target=wait)
        child_waiter.start()
        while not condition._waiters:  # type: ignore[attr-defined]
            time.sleep(0.01)
        time.sleep(0.1)  # (the child's waiter in wait(), behind any parent's)
        with condition:
            condition.notify()
        child_waiter.join()
        os._exit(0 if woken == [True] else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with condition:
        condition.notify()
    waiting.join()


def _parquet_read_lock(tmp_path: Any) -> Any:
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    return episode_rows._read_lock(pq.ParquetFile(tmp_path / "a.parquet"))


#: The locks a child's own iterator takes, and others of the package's modules and shared objects: with a thread of
#: the parent holding one at the fork, a child that built an iterator of its own and read an epoch hung for ever in 10
#: of these (both open-file shares, said_once, clips, io_stats, the parquet read locks' guard, the packet index
#: cache, Python 3.11's cached_property locks of the episode table and the rank stream).
PACKAGE_LOCKS: dict[str, Callable[[Any], Any]] = {
    "open_files.DECODERS": lambda _: open_files.DECODERS._lock,
    "open_files.DATA_FILES": lambda _: open_files.DATA_FILES._lock,
    "said_once": lambda _: said_once._lock,
    "clips.templates": lambda _: clips._templates_lock,
    "io_stats": lambda _: io_stats._stats_lock,
    "episode_rows.read_locks": lambda _: episode_rows._READ_LOCKS_LOCK,
    "episode_rows.a_parquet_read": _parquet_read_lock,
    "episode_rows.parquet_cache": lambda _: episode_rows.ParquetCache(open)._lock,
    "packet_index_cache": lambda _: packet_index_cache._DEFAULT_CACHE._lock,
    "decode_route.probe": lambda _: decode_route._probe_lock,
    "decode_route.probing": lambda _: decode_route._probing._guard,
    "keyframe_sizes": lambda _: keyframe_sizes._template_facts_lock,
    "literal_parsing": lambda _: literal_parsing.PARSE_LOCK,
    "packet_index_store": lambda _: packet_index_store._REFUSED_LOCK,
    "worker_start": lambda _: worker_start._install_lock,
    "iterator.workers_close": lambda _: iterator._workers_close_lock,
    "exit_close": lambda _: exit_close._lock,
    # (Python 3.11's functools.cached_property: one lock per class attribute; 3.12's has none)
    "episode_table.data_file_id": lambda _: getattr(
        episode_table.EpisodeTable._data_file_id, "lock", fork_locks.lock()
    ),
    "episode_table.rows_read": lambda _: getattr(episode_table.EpisodeTable._rows_read, "lock", fork_locks.lock()),
    "sample_order.natural": lambda _: getattr(sample_order._RankStream.natural, "lock", fork_locks.lock()),
    "key_rename": lambda _: getattr(key_rename.KeyRename._to_own, "lock", fork_locks.lock()),
}


@pytest.mark.parametrize("name", PACKAGE_LOCKS)
def test_the_package_locks_are_free_in_a_forked_child(name: str, tmp_path: Any) -> None:
    lock = PACKAGE_LOCKS[name](tmp_path)
    with held_by_a_thread(lock):
        assert free_in_child(lock)


def test_the_package_makes_its_locks_here_only() -> None:
    # A lock made elsewhere stays held for ever in a forked child where a thread of the parent held it at the fork.
    made_elsewhere = re.compile(
        r"threading\.R?Lock\(\)|threading\.Condition\(|functools\.cached_property"
        r"|^from functools import .*cached_property",
        re.M,
    )
    package = Path(fork_locks.__file__).parent
    found = {
        path.name: made_elsewhere.findall(path.read_text(encoding="utf-8"))
        for path in package.glob("*.py")
        if path.name != "fork_locks.py"
    }
    assert {name: made for name, made in found.items() if made} == {}
