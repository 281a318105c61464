"""Counters of remote requests, bytes and time, summed over the training process and its DALI workers.

Remote reads happen in spawned worker processes that share nothing with the process that wants the totals
(the benchmark). When ``$LEROBOT_DALI_IO_STATS`` names a folder, every process adds to its own counters
and a daemon thread writes them to ``<folder>/<pid>.json`` every 0.2 s (and at exit) while the folder exists;
:func:`collect` sums the files. Without the variable, counting is a dict update and nothing is written.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import fork_locks

__all__ = ["STATS_ENV", "add", "collect", "flush", "timed"]

#: Folder where every process writes its counters (set it before the workers start; they inherit it).
STATS_ENV = "LEROBOT_DALI_IO_STATS"
_FLUSH_INTERVAL_S = 0.2


class _ProcessStats:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.values: dict[str, float] = {}
        self.lock = fork_locks.lock()
        #: Held by a whole flush: two at once (the flush thread's and the bench's) wrote one temporary file, and the
        #: later rename, finding it gone, took the folder for removed and ended the counting.
        self.flush_lock = fork_locks.lock()
        self.dirty = False
        self.folder = os.environ.get(STATS_ENV) or None
        if self.folder:
            threading.Thread(target=self._flush_loop, name="lerobot-dali-io-stats", daemon=True).start()
            atexit.register(self.flush)
            # A multiprocessing child (a DALI worker, a DataLoader's) ends in os._exit, no atexit handler run: its
            # counts since the last 0.2 s flush were lost (2 of 3 scripted children counting just before their end).
            multiprocessing.util.Finalize(None, self.flush, exitpriority=0)

    def _flush_loop(self) -> None:
        while True:
            time.sleep(_FLUSH_INTERVAL_S)
            self.flush()

    def flush(self) -> None:
        if self.pid != os.getpid():
            # A forked child's (os.fork) exit handler, given the parent's counters: the child wrote them into the
            # parent's file as they stood at the fork, over the parent's later counts (12 of 30 scripted children
            # ending normally), and waited for ever on a lock the parent's flush thread held at the fork (2 of 105).
            return
        with self.flush_lock:
            if not self.folder or not self.dirty:
                return
            with self.lock:
                snapshot = dict(self.values)
                self.dirty = False
            folder = Path(self.folder)
            temporary = folder / f".{self.pid}.tmp"
            try:
                temporary.write_text(json.dumps(snapshot), encoding="utf-8")
                os.replace(temporary, folder / f"{self.pid}.json")
            except FileNotFoundError:  # removed by its maker (a worker outliving the benchmark's loader): counting
                self.folder = None  # is over (the folder was made again, and stayed in /tmp)


_stats: _ProcessStats | None = None
_stats_lock = fork_locks.lock()


def _current() -> _ProcessStats:
    global _stats
    stats = _stats
    if stats is None or stats.pid != os.getpid():  # first use, or a forked child: counters of its own
        with _stats_lock:
            if _stats is None or _stats.pid != os.getpid():
                _stats = _ProcessStats()
            stats = _stats
    return stats


def add(name: str, amount: float = 1.0) -> None:
    stats = _current()
    with stats.lock:
        stats.values[name] = stats.values.get(name, 0.0) + amount
        stats.dirty = True


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Adds the block's wall time in seconds to ``name`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - start)


def flush() -> None:
    """Write this process's counters now (the benchmark calls it before :func:`collect`)."""
    _current().flush()


def collect(folder: str | os.PathLike[str]) -> dict[str, float]:
    """The sum of every process's latest counters in ``folder``."""
    total: dict[str, float] = {}
    for file in Path(folder).glob("*.json"):
        try:
            values = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced right now; its next write has the same counts or more
        for name, value in values.items():
            total[name] = total.get(name, 0.0) + float(value)
    return total
