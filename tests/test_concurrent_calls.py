"""Calls made several at once (``in_threads``): results in order, and what a log gets while they run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lerobot_dali import concurrent_calls, progress_lines
from lerobot_dali.concurrent_calls import in_threads


def test_opening_datasets_at_once_logs_lines_not_a_bar_where_stderr_is_no_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A training job's log (no terminal) got the bar's redraws, joined by carriage returns, from every rank."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        assert in_threads(lambda s: time.sleep(s) or s, [2.3, 2.3], progress="opening datasets") == [2.3, 2.3]
    assert "\r" not in capsys.readouterr().err
    said = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert said == ["opening datasets: 1/2 datasets", "opening datasets: 2/2 datasets"]


@pytest.mark.parametrize(("local_rank", "lines"), [("0", 3), ("1", 0)])
def test_only_a_nodes_first_rank_shows_the_datasets_opened(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    local_rank: str, lines: int,
) -> None:  # fmt: skip
    """As the Hub's download and the warm-up: eight ranks of a node said the same count eight times."""
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0, raising=False)
    monkeypatch.setattr(progress_lines, "LINE_GAP_S", 0.0)  # (a line as each call ends, 0.05 s apart)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        in_threads(time.sleep, [0.05, 0.1, 0.15], progress="opening datasets")
    assert "\r" not in capsys.readouterr().err
    assert len(caplog.records) == lines


def test_calls_done_before_the_delay_show_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        in_threads(time.sleep, [0.01, 0.01], progress="opening datasets")
    assert caplog.records == []


def test_a_wait_that_began_before_the_call_counts_toward_the_delay(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Several calls that make one wait (a survey per camera) show their progress once the wait, not each call, has
    taken the delay."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    since = time.monotonic() - concurrent_calls.PROGRESS_DELAY_S
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        in_threads(time.sleep, [0.01, 0.01], progress="surveying", unit="file", since=since)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["surveying: 1/2 files", "surveying: 2/2 files"]


def test_the_first_failure_in_order_is_raised_once_every_call_has_ended() -> None:
    ended: list[int] = []

    def call(i: int) -> int:
        time.sleep(0.05 * (3 - i))
        ended.append(i)
        if i in (1, 2):
            raise ValueError(f"call {i}")
        return i

    with pytest.raises(ValueError, match="call 1"):
        in_threads(call, [0, 1, 2])
    assert sorted(ended) == [0, 1, 2]


def test_a_key_stays_one_threads_while_another_waits_for_it(monkeypatch) -> None:
    """A key's lock was dropped when its holder left, even with a thread waiting on it: that thread then held the
    old lock while a third made a new one, and both did the key's work at once (two packet index builds, two
    NVDEC probe processes after a first try failed). Forced here: A holds the key, B waits for it, A leaves and B
    holds it; C must then wait for B."""
    import threading
    from types import SimpleNamespace

    from lerobot_dali.concurrent_calls import KeyedLocks

    keyed = KeyedLocks()
    real_lock = threading.Lock
    blocked = threading.Semaphore(0)  # released each time a thread starts waiting for a key
    c_decided = threading.Event()  # C waits for the key, or holds it

    class WatchedLock:
        def __init__(self) -> None:
            self._lock = real_lock()

        def __enter__(self) -> None:
            if not self._lock.acquire(blocking=False):
                blocked.release()
                c_decided.set()
                self._lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self._lock.release()

    monkeypatch.setattr(concurrent_calls, "fork_locks", SimpleNamespace(lock=WatchedLock))
    inside: list[str] = []
    entered = {name: threading.Event() for name in "ABC"}
    leave = {name: threading.Event() for name in "ABC"}

    def hold(name: str) -> None:
        with keyed.held("file.mp4"):
            inside.append(name)
            entered[name].set()
            if name == "C":
                c_decided.set()
            assert leave[name].wait(30)
            inside.remove(name)

    threads = {name: threading.Thread(target=hold, args=(name,), daemon=True) for name in "ABC"}
    threads["A"].start()
    assert entered["A"].wait(30)
    threads["B"].start()
    assert blocked.acquire(timeout=30)  # B waits for A's key
    leave["A"].set()
    assert entered["B"].wait(30)
    c_decided.clear()
    threads["C"].start()
    assert c_decided.wait(30)
    assert inside == ["B"], inside  # C waits
    leave["B"].set()
    assert entered["C"].wait(30)
    leave["C"].set()
    for thread in threads.values():
        thread.join(30)
    assert inside == [] and keyed._locks == {}


def test_in_threads_takes_the_items_here_once_the_interpreter_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # Once the main thread ended, no ThreadPoolExecutor takes work ("cannot schedule new futures after interpreter
    # shutdown"): a daemon thread starting a mixture's next pass as the script ended printed that traceback (3 of 4
    # exits). The items are taken in the calling thread instead, in order.
    import concurrent.futures.thread

    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)  # (what the interpreter sets as it shuts down)
    threads: list[str] = []

    def square(x: int) -> int:
        threads.append(threading.current_thread().name)
        return x * x

    assert in_threads(square, [1, 2, 3]) == [1, 4, 9]
    assert threads == [threading.current_thread().name] * 3


#: A daemon thread's in_threads whose items after the first are taken only once the interpreter began shutting down
#: (the script's main thread ended): its pool takes the first item, then no more.
SHUTDOWN_BETWEEN_SUBMITS = """
import atexit, threading, time
import concurrent.futures.thread
from collections.abc import Sequence
from lerobot_dali.concurrent_calls import in_threads

class ShutdownMidway(Sequence):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not 0 <= i < len(self):
            raise IndexError(i)
        while i and not concurrent.futures.thread._shutdown:
            time.sleep(0.01)
        return i

got = []
thread = threading.Thread(target=lambda: got.append(in_threads(lambda x: x * x, ShutdownMidway())), daemon=True)
thread.start()
atexit.register(lambda: (thread.join(60), print(got, flush=True)))
"""


def test_in_threads_takes_the_items_left_here_where_the_interpreter_shuts_down_between_two_submits() -> None:
    # Only the first submit was guarded: the shutdown beginning after it, the second raised "cannot schedule new futures
    # after shutdown" and its traceback was printed (3 of 3 runs of this script); the items left are taken here.
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_BETWEEN_SUBMITS], capture_output=True, text=True, timeout=120, env=env, cwd=root
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "[[0, 1, 4, 9]]\n", "")


def test_an_item_its_pool_queued_before_it_could_not_start_a_thread_is_called_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python 3.12 starts no thread once the interpreter is finalizing: a submit then raises "can't create new thread at
    # interpreter shutdown" after queueing its item, which the pool's busy thread ran as well as the fallback here (a
    # daemon thread's in_threads as the script ended, 4 items: 13 of 30 runs called an item twice on 3.12.1).
    started: list[str] = []
    original_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("lerobot-dali-at-once") and started:
            started.append(thread.name)
            raise RuntimeError("can't create new thread at interpreter shutdown")
        started.append(thread.name)
        original_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    calls: list[int] = []

    def square(x: int) -> int:
        if x == 0:  # (the pool's one thread busy until every submit was made: each then tried to start another)
            for _ in range(3000):
                if len(started) == 4:
                    break
                time.sleep(0.01)
        calls.append(x)
        return x * x

    assert in_threads(square, [0, 1, 2, 3]) == [0, 1, 4, 9]
    assert len(started) == 4 and sorted(calls) == [0, 1, 2, 3]
