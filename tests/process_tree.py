"""Tests that kill a process and watch its worker processes: find the workers, check they end with it, and clean
up whatever is left; and what this process holds open."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil


def cmdline(process: Any) -> list[str]:
    """The process's command line, or [] once it has ended."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def spawned_workers(children: list[psutil.Process]) -> list[psutil.Process]:
    """The multiprocessing spawn workers among ``children``."""
    return [p for p in children if "spawn_main" in " ".join(cmdline(p))]


def assert_workers_end_with(parent: subprocess.Popen, workers: list[psutil.Process], *, timeout: float) -> None:
    """SIGKILL ``parent``, then wait for ``workers`` to end by themselves."""
    parent.kill()
    parent.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=timeout)
    assert alive == [], f"workers outlived the killed process: {[p.pid for p in alive]}"


def kill_all(parent: subprocess.Popen, children: list[psutil.Process]) -> None:
    """Kill ``parent`` and ``children``. multiprocessing's resource tracker unlinks the pool's semaphores from
    /dev/shm once every process using it is gone: kill the others, let it finish, and kill it only if it does not."""
    parent.kill()
    trackers = [p for p in children if "resource_tracker" in " ".join(cmdline(p))]
    for child in children:
        if child not in trackers:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    _, stuck = psutil.wait_procs(trackers, timeout=10)
    for tracker in stuck:
        with contextlib.suppress(psutil.NoSuchProcess):
            tracker.kill()


def open_files_under(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open (from /proc/self/fd)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [link for link in links if link.startswith(str(folder))]


def reports_of_processes_at_once(target: Any, args: tuple[Any, ...], count: int = 2) -> list[Any]:
    """What each of ``count`` spawned processes running ``target(*args, barrier, results)`` put on ``results``: they
    pass ``barrier`` together, to race for the same store entry; each must exit cleanly."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(count), context.Queue()
    workers = [context.Process(target=target, args=(*args, barrier, results)) for _ in range(count)]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * count
    return reports
