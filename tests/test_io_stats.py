"""io_stats: counters summed over processes through per-process files (what the bench reads for remote runs)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_dali import io_stats

ROOT = Path(__file__).resolve().parents[1]


def _child(folder: str) -> None:
    import os

    os.environ[io_stats.STATS_ENV] = folder
    io_stats.add("requests", 3)
    io_stats.add("fetched_bytes", 100)
    io_stats.flush()


def test_counts_of_several_processes_add_up(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(io_stats.STATS_ENV, str(tmp_path))
    monkeypatch.setattr(io_stats, "_stats", None)  # a fresh singleton that sees the variable
    io_stats.add("requests")
    with io_stats.timed("fetch_s"):
        pass
    io_stats.flush()
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_child, args=(str(tmp_path),)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
        assert child.exitcode == 0
    totals = io_stats.collect(tmp_path)
    assert totals["requests"] == 7 and totals["fetched_bytes"] == 200 and 0 <= totals["fetch_s"] < 1
    assert len(list(tmp_path.glob("*.json"))) == 3


def _count_only() -> None:
    io_stats.add("requests", 2)  # (no flush: the process ends at once)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_multiprocessing_childs_last_counts_are_written_at_its_end(tmp_path: Path, monkeypatch, method: str) -> None:
    # It ends in os._exit, no atexit handler run: what it counted since the flush thread's last write was lost (2 of
    # the 3 children in each of 3 scripted runs; here fork and forkserver, a spawned one, slower to end, not always).
    # A DALI worker or a DataLoader's ends so too.
    monkeypatch.setenv(io_stats.STATS_ENV, str(tmp_path))
    child = multiprocessing.get_context(method).Process(target=_count_only)
    child.start()
    child.join()
    assert child.exitcode == 0
    assert io_stats.collect(tmp_path) == {"requests": 2.0}


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(io_stats.STATS_ENV, raising=False)
    monkeypatch.setattr(io_stats, "_stats", None)
    io_stats.add("requests")
    io_stats.flush()
    assert io_stats.collect(tmp_path) == {} and not list(tmp_path.iterdir())


def test_a_folder_removed_by_its_maker_is_not_made_again(tmp_path: Path, monkeypatch) -> None:
    """A DALI worker that outlived the bench's loader flushed into the counters' folder the bench had removed, and
    made it again: it stayed in /tmp. Counting ends there, without an error in the flush thread."""
    folder = tmp_path / "lerobot-dali-io-x"
    folder.mkdir()
    monkeypatch.setenv(io_stats.STATS_ENV, str(folder))
    monkeypatch.setattr(io_stats, "_stats", None)
    io_stats.add("requests")
    io_stats.flush()
    assert io_stats.collect(folder) == {"requests": 1.0}
    (folder / f"{os.getpid()}.json").unlink()
    folder.rmdir()  # the bench is done with it
    io_stats.add("requests")
    io_stats.flush()
    assert not folder.exists()


def test_a_flush_meeting_the_flush_threads_keeps_counting(tmp_path: Path, monkeypatch) -> None:
    """The bench flushes its process's counters itself while the flush thread does so every 0.2 s: both wrote the
    one temporary file, the later rename found it gone, and the FileNotFoundError was taken for a removed folder,
    so the process counted no more (its requests stayed at the first flush's for the rest of the run). Forced
    here: a second flush runs while the first is about to rename."""
    import threading

    monkeypatch.delenv(io_stats.STATS_ENV, raising=False)
    stats = io_stats._ProcessStats()  # (without the variable: no flush thread of its own)
    stats.folder = str(tmp_path)
    real_replace = os.replace

    def second_flush_meanwhile(source, target) -> None:
        if threading.current_thread().name == "first":
            stats.values["requests"] = 2.0
            stats.dirty = True
            second = threading.Thread(target=stats.flush, name="second")
            second.start()
            second.join(1.0)  # (with the flushes taking turns it waits for this one: go on after a while)
        real_replace(source, target)

    monkeypatch.setattr(io_stats.os, "replace", second_flush_meanwhile)
    stats.values["requests"] = 1.0
    stats.dirty = True
    first = threading.Thread(target=stats.flush, name="first")
    first.start()
    first.join(30)
    for thread in threading.enumerate():
        if thread.name == "second":
            thread.join(30)
    stats.values["requests"] = 3.0
    stats.dirty = True
    stats.flush()
    assert io_stats.collect(tmp_path) == {"requests": 3.0}


#: Counts 1 request, forks (the parent's flush thread holding its lock at that moment where asked), counts 1 more and
#: writes both, then lets the child end normally (sys.exit), killing it if it has not within 20 s: prints the child's
#: exit and the counts the folder sums to.
FORK_AFTER_COUNTING = """
import json, os, signal, sys, time
from lerobot_dali import io_stats

io_stats._FLUSH_INTERVAL_S = 3600.0  # (the flush thread would write the first count before the fork, now and then)
io_stats.add("requests")
stats = io_stats._current()
if sys.argv[1] == "flushing":
    stats.flush_lock.acquire()  # as the flush thread holds it while it writes
go_read, go_write = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(go_read, 1)
    io_stats.add("child_requests")
    sys.exit(0)
if sys.argv[1] == "flushing":
    stats.flush_lock.release()
io_stats.add("requests")
io_stats.flush()
os.write(go_write, b"x")
deadline = time.monotonic() + 20
while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
    time.sleep(0.05)
if not ended[0]:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
child_exit = os.waitstatus_to_exitcode(ended[1]) if ended[0] else "hung"
print(json.dumps({"child_exit": child_exit, "totals": io_stats.collect(stats.folder)}))
"""


@pytest.mark.parametrize("parent", ["idle", "flushing"])
def test_a_forked_childs_exit_leaves_the_parents_counts(tmp_path: Path, parent: str) -> None:
    # The child's exit handler flushed the counters it inherited into the parent's file, as they stood at the fork:
    # the parent's 2 requests read 1 (12 of 30 scripted children). Where the parent's flush thread held the flush
    # lock at the fork, the child waited for it for ever (2 of 105).
    env = {**os.environ, io_stats.STATS_ENV: str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_COUNTING, parent], capture_output=True, text=True, timeout=120, env=env
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    report = json.loads(done.stdout)
    assert report == {"child_exit": 0, "totals": {"requests": 2.0, "child_requests": 1.0}}
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".json", ".json"]
