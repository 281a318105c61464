"""Worker start-up: DALI's spawned workers that skip the training script (lerobot-dali's default) against workers
that import it again (plain spawn), each setting in a fresh process whose top level imports ``--imports`` as a
training script would. Per setting: seconds from ``iter()`` to the pipeline built, each worker's USS and RSS,
how many processes ran the script, and a mixture of ``--datasets`` datasets' seconds to its first batch (its
pipelines start side by side, a worker each). Prints one JSON object; the ratios compare runs of this invocation.

    PYTHONPATH=. python bench/worker_start.py [--imports torch] [--workers 2] [--datasets 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from child_process import run_child

IMPORTS = "WORKER_START_IMPORTS"  # a training script's top-level imports (each process that runs this file does)
RUNS = "WORKER_START_RUNS"  # a file each process that runs this file's top level appends a line to

for _name in filter(None, os.environ.get(IMPORTS, "").split(",")):
    importlib.import_module(_name)
if os.environ.get(RUNS):
    with open(os.environ[RUNS], "a") as _runs:
        _runs.write(f"{os.getpid()}\n")


def _memory_mb(pid: int) -> tuple[float, float]:
    """(USS, RSS) of a process in MiB, from /proc (Private_* is what it holds alone)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value, *_ = line.split()
        fields[key.rstrip(":")] = int(value)
    return (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024, fields["Rss"] / 1024


def _worker_pids() -> list[int]:
    me = str(os.getpid())
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            command = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if lines.get("PPid", "").strip() == me and b"spawn_main" in command:
            pids.append(int(status.parent.name))
    return pids


def measure(mode: str, roots: list[str], workers: int) -> dict[str, object]:
    """In a fresh process: one dataset's iterator with ``workers`` workers, then the mixture of ``roots``."""
    import lerobot_dali.worker_start
    from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture

    if mode == "spawn":  # as if the source named __main__: every worker imports this file, as plain spawn does
        lerobot_dali.worker_start.names_main = lambda callback: True
    it = DALILeRobotIterator(roots[0], batch_size=4, device="cpu", num_workers=workers)
    try:
        t0 = time.perf_counter()
        batches = iter(it)
        build_s = time.perf_counter() - t0
        next(batches)
        memory = [_memory_mb(pid) for pid in _worker_pids()]
    finally:
        it.close()
    t0 = time.perf_counter()
    mix = DALILeRobotMixture(roots, batch_size=4 * len(roots), device="cpu", num_workers=len(roots))
    try:
        next(iter(mix))
        mixture_s = time.perf_counter() - t0
    finally:
        mix.close()
    return {
        "build_s": build_s,
        "worker_uss_mb": statistics.mean(u for u, _ in memory),
        "worker_rss_mb": statistics.mean(r for _, r in memory),
        "mixture_first_batch_s": mixture_s,
    }


def _child(mode: str, roots: list[Path], workers: int, imports: str, runs: Path) -> dict[str, object]:
    runs.write_text("")
    env = {**os.environ, IMPORTS: imports, RUNS: str(runs)}
    result = run_child(__file__, [mode, str(workers), *map(str, roots)], env=env)
    result["script_runs"] = len(runs.read_text().split())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--imports", default="torch", help="comma-separated modules the script imports at its top")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the one-dataset iterator")
    parser.add_argument("--datasets", type=int, default=6, help="datasets in the mixture (a worker each)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting, alternating; medians reported")
    parser.add_argument("--out", type=Path, default=None, help="folder for the datasets (default: temp)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, workers, *roots = args.child
        print(json.dumps(measure(mode, roots, int(workers))))
        return

    from lerobot_dali.generate import make_dataset

    work = args.out or Path(tempfile.mkdtemp(prefix="worker_start."))
    roots = []
    for i in range(args.datasets):
        root = work / f"dataset{i}"
        if not (root / "meta").exists():
            make_dataset(root, episodes=4, frames_per_episode=30, cameras=1, codec="vp9", fps=10, gop=4, seed=i)
        roots.append(root)
    runs: dict[str, list[dict[str, object]]] = {"skip": [], "spawn": []}
    for _ in range(args.repeats):
        for mode in runs:
            runs[mode].append(_child(mode, roots, args.workers, args.imports, work / "runs.txt"))
    medians = {
        mode: {key: statistics.median(float(r[key]) for r in rows) for key in rows[0]}  # type: ignore[arg-type]
        for mode, rows in runs.items()
    }
    result: dict[str, object] = {
        "imports": args.imports,
        "workers": args.workers,
        "datasets": args.datasets,
        "repeats": args.repeats,
        "skip_main": medians["skip"],
        "import_main": medians["spawn"],
    }
    for key in ("build_s", "worker_uss_mb", "mixture_first_batch_s"):
        result[f"{key}_ratio"] = round(medians["skip"][key] / medians["spawn"][key], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
