"""A script that forks (``os.fork``) while an iterator is live: the child's exit leaves the parent's pipeline and
workers alone, and the child cannot read the inherited iterator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lerobot_dali import DALILeRobotIterator, io_stats
from lerobot_dali.errors import IteratorForkedError

ROOT = Path(__file__).resolve().parents[1]

#: Reads 2 batches, forks, and reads 2 more in the parent once the child ended (killed if it has not within 30 s):
#: prints what the child said, then the parent's batches (their rows, and the episode and frame each frame's marker
#: shows), the child's exit and the worker processes before and after the parent's close().
FORK_WHILE_READING = """
import json, os, signal, sys, time
import psutil
from lerobot_dali import DALILeRobotIterator
from lerobot_dali.frame_marker import read_marker

def seen(batch):
    return [batch["index"].tolist(), [list(read_marker(f)) for f in batch["observation.images.cam0"]]]

def child(it, pass_, how):
    if how == "read":
        for read in (lambda: next(pass_), lambda: iter(it)):
            try:
                read()
            except Exception as e:
                print(json.dumps([type(e).__name__, str(e)]), flush=True)
    sys.exit(0)  # (exit handlers, the iterator's __del__ and DALI's finalizers run)

def main():
    options = dict(batch_size=2, device="cpu", decode="cpu", num_workers=int(sys.argv[2]), shuffle=False)
    it = DALILeRobotIterator(sys.argv[1], **options)
    pass_ = iter(it)
    got = [seen(next(pass_)) for _ in range(2)]
    pid = os.fork()
    if pid == 0:
        child(it, pass_, sys.argv[3])
    deadline = time.monotonic() + 30
    while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ended[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    child_exit = os.waitstatus_to_exitcode(ended[1]) if ended[0] else "hung"
    try:
        got += [seen(next(pass_)) for _ in range(2)]
    except Exception as e:
        got.append(f"{type(e).__name__}: {e}")
    workers = lambda: len([p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())])
    running = workers()
    it.close()
    print(json.dumps({"child_exit": child_exit, "got": got, "workers": [running, workers()]}))

if __name__ == "__main__":
    main()
"""


#: The first 4 batches of 2 in order: rows 0-7, frames 0-7 of episode 0.
FIRST_BATCHES = [[[i, i + 1], [[0, i], [0, i + 1]]] for i in range(0, 8, 2)]


def fork_while_reading(ds: Path, num_workers: int, child: str) -> tuple[dict, list[list[str]]]:
    """The parent's report, and what the child printed (an error's type and message per line)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_WHILE_READING), str(ds), str(num_workers), child],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    *said, report = done.stdout.splitlines()
    return json.loads(report), [json.loads(line) for line in said]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_forked_child_ending_normally_leaves_the_parents_iterator_reading(make_ds, num_workers: int) -> None:
    # Its exit shut the inherited pipeline down: the child hung in DALI's executor destructor (both cases), and with
    # workers the parent's next batch failed, "Sending tasks to workers failed" or WorkerProcessError (every run).
    ds = make_ds(episodes=2, frames_per_episode=30)
    report, said = fork_while_reading(ds, num_workers, "exit")
    assert said == []
    assert report == {"child_exit": 0, "got": FIRST_BATCHES, "workers": [num_workers, 0]}


def test_an_inherited_iterator_refuses_to_read_in_the_forked_child(make_ds) -> None:
    # next() on the inherited pass and a new pass both say to build an iterator in the child; the parent reads on. (The
    # child hung; in a multiprocessing 'fork' child, which exits without exit handlers, next() read the parent's next
    # batch too, 2 of 2 runs, and with workers took one from their queue in 1 of 2: the parent failed, KeyError '6'.)
    ds = make_ds(episodes=2, frames_per_episode=30)
    report, said = fork_while_reading(ds, 0, "read")
    assert [kind for kind, _ in said] == [IteratorForkedError.__name__] * 2
    assert all("Build a DALILeRobotIterator in the child" in message for _, message in said)
    assert report == {"child_exit": 0, "got": FIRST_BATCHES, "workers": [0, 0]}


def test_a_child_forked_inside_next_that_carries_on_is_told_to_build_its_own(make_ds, monkeypatch) -> None:
    # A signal handler's fork inside DALI's next() (without workers the source runs on the reading thread), the child
    # carrying on from there: it met the pipeline left to the parent, AttributeError ('NoneType' object has no
    # attribute 'SetExternalTLInput') in 133 of 144 forks at each line of a batch that held a lock of the package.
    ds = make_ds(episodes=2, frames_per_episode=30)
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", decode="cpu", num_workers=0, shuffle=False)
    pass_ = iter(it)
    assert next(pass_)["index"].tolist() == [0, 1]
    counted, forks = io_stats.add, []

    def count_then_fork(name: str, amount: float = 1.0) -> None:
        counted(name, amount)
        if not forks:
            forks.append(os.fork())

    monkeypatch.setattr(io_stats, "add", count_then_fork)
    parent = os.getpid()
    try:
        batch = next(pass_)
    except BaseException as e:
        if os.getpid() != parent:  # (never back into pytest: os._exit)
            os._exit(0 if isinstance(e, IteratorForkedError) and "in the child itself" in str(e) else 1)
        raise
    if os.getpid() != parent:
        os._exit(2)
    monkeypatch.undo()
    assert os.waitstatus_to_exitcode(os.waitpid(forks[0], 0)[1]) == 0
    assert batch["index"].tolist() == [2, 3]  # (the parent reads on)
    it.close()


#: A thread builds an iterator, reads a batch, rebuilds its pipeline (load_state_dict) and reads another; the main
#: thread forks once that thread reaches the point asked (where it waits until the fork is done), and the child ends
#: at once (sys.exit). Prints the child's exit (killed if it has not within 20 s) and the rows of the thread's batches.
FORK_WHILE_BUILDING = """
import json, os, signal, sys, threading, time
import nvidia.dali.plugin.pytorch as dali_torch
from nvidia.dali._multiproc import pool as dali_pool
from lerobot_dali import DALILeRobotIterator, iterator as iterator_module

at_point, forked = threading.Event(), threading.Event()
POINTS = {
    "built": (dali_torch, "DALIGenericIterator"),  # pipe.build() returned: its executor runs, not yet the iterator's
    "workers_started": (dali_pool.ProcPool, "_sync_initialized_workers"),  # the workers run, no pipeline holds them
    "closing": (iterator_module, "_close_workers"),  # load_state_dict shuts it down: no longer the iterator's
}

def wait_for_the_fork_before(owner, name):
    original = getattr(owner, name)
    def waiting(*args, **kwargs):
        if not at_point.is_set():
            at_point.set()
            forked.wait()
        return original(*args, **kwargs)
    setattr(owner, name, waiting)

def build_and_read(ds, workers, got):
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", decode="cpu", num_workers=workers, shuffle=False)
    got.append(next(iter(it))["index"].tolist())
    it.load_state_dict(it.state_dict())
    got.append(next(iter(it))["index"].tolist())
    it.close()

def main():
    ds, workers, point = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    wait_for_the_fork_before(*POINTS[point])
    got = []
    builder = threading.Thread(target=build_and_read, args=(ds, workers, got))
    builder.start()
    at_point.wait()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    forked.set()
    deadline = time.monotonic() + 20
    while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ended[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    builder.join()
    print(json.dumps({"child_exit": os.waitstatus_to_exitcode(ended[1]) if ended[0] else "hung", "got": got}))

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(("point", "num_workers"), [("built", 2), ("workers_started", 2), ("closing", 0)])
def test_a_fork_while_another_thread_builds_or_closes_a_pipeline(make_ds, point: str, num_workers: int) -> None:
    # The pipeline was no live iterator's yet (built) or any more (closing): the child's exit shut it down and hung in
    # DALI's executor destructor, and with workers its pool's finalizer stopped the parent's (WorkerProcessError).
    # The workers of a pool being started (or closed) were joined by multiprocessing's exit handler in the child,
    # which printed "AssertionError: can only join a child process".
    ds = make_ds(episodes=2, frames_per_episode=30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_WHILE_BUILDING), str(ds), str(num_workers), point],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert json.loads(done.stdout) == {"child_exit": 0, "got": [[0, 1], [2, 3]]}


#: A thread holds the locks of the package's shared objects and modules that an iterator takes (what a thread reading
#: batches may hold at any moment) while the main thread forks; the child builds an iterator of its own and reads its
#: epoch (killed if it has not within 60 s). Prints the child's rows, or "hung", and those of the parent's own epoch.
FORK_WHILE_LOCKS_ARE_HELD = """
import json, os, signal, sys, threading, time
from lerobot_dali import DALILeRobotIterator, clips, episode_rows, io_stats, iterator, open_files, packet_index_cache
from lerobot_dali import said_once
from lerobot_dali.episode_table import EpisodeTable

LOCKS = [open_files.DECODERS._lock, open_files.DATA_FILES._lock, said_once._lock, clips._templates_lock,
         io_stats._stats_lock, episode_rows._READ_LOCKS_LOCK, packet_index_cache._DEFAULT_CACHE._lock,
         iterator._workers_close_lock]
LOCKS += [EpisodeTable._data_file_id.lock] if sys.version_info < (3, 12) else []  # (cached_property)

def epoch(ds, workers):
    it = DALILeRobotIterator(ds, batch_size=2, device="cpu", decode="cpu", num_workers=workers, shuffle=False)
    rows = [row for batch in it for row in batch["index"].tolist()]
    it.close()
    return rows

def hold(taken, done):
    for lock in LOCKS:
        lock.acquire()
    taken.set()
    done.wait()
    for lock in LOCKS:
        lock.release()

def main():
    ds, workers = sys.argv[1], int(sys.argv[2])
    read = epoch(ds, workers)
    taken, done = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=(taken, done))
    holder.start()
    taken.wait()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps(epoch(ds, workers)).encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 60
    while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ended[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    child = json.loads(os.read(r, 1 << 16) or b'"hung"') if ended[0] else "hung"
    done.set()
    holder.join()
    print(json.dumps({"child": child, "parent": read}))

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_child_reads_its_own_iterator_while_a_parent_thread_held_the_shared_locks(make_ds, num_workers) -> None:
    # Only the forking thread lives on in the child: a lock another thread held at the fork stayed held for ever there,
    # and the child's own iterator hung on each of these held alone: the open-file shares, said_once, the parquet read
    # locks' guard, the packet index cache, the episode table's file ids (0 or 2 workers), the clip templates and
    # io_stats (0), the worker pools' close (2).
    ds = make_ds(episodes=2, frames_per_episode=30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_WHILE_LOCKS_ARE_HELD), str(ds), str(num_workers)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert json.loads(done.stdout) == {"child": list(range(60)), "parent": list(range(60))}
