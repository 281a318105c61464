"""Episode reads from a data file written as one big row group (as LeRobot's v3.0 converter writes them), with
the column store off and on, each in a fresh process: per-episode read time, peak RSS, and a tabular-only
iterator's samples/s. Prints one JSON object; the ratios compare runs of this same invocation.

    PYTHONPATH=. python bench/row_groups.py [--episodes 3400] [--frames 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from child_process import run_child

READS = 60


def _peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would report the parent's peak.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reader(root: str, store: str, min_group_rows: int):
    from lerobot_dali import open_dataset
    from lerobot_dali.column_store import ColumnStore

    reader = open_dataset(root)
    reader.column_store = None if store == "off" else ColumnStore(store, min_group_rows=min_group_rows)
    return reader


def measure_reads(root: str, store: str, min_group_rows: int) -> dict[str, float]:
    reader = _reader(root, store, min_group_rows)
    order = np.random.default_rng(0).permutation(reader.num_episodes)[: min(READS, reader.num_episodes)]
    t0 = time.perf_counter()
    reader.read_episode(int(order[0]))
    t1 = time.perf_counter()
    for pos in order[1:]:
        reader.read_episode(int(pos))
    t2 = time.perf_counter()
    return {
        "first_read_ms": (t1 - t0) * 1e3,
        "read_ms": (t2 - t1) / max(len(order) - 1, 1) * 1e3,
        "peak_rss_mb": _peak_rss_mb(),
    }


def measure_iterator(root: str, store: str, min_group_rows: int, batches: int) -> dict[str, float]:
    from lerobot_dali import DALILeRobotIterator

    it = DALILeRobotIterator(
        _reader(root, store, min_group_rows),
        batch_size=256,
        device="cpu",
        num_workers=2,
        delta_timestamps={"action": [i / 30 for i in range(16)]},
    )
    try:
        batches = max(1, min(batches, len(it) - 1))  # within one epoch
        batch_iter = iter(it)
        next(batch_iter)  # DALI's start-up and the first pool fill are not the steady state
        t0 = time.perf_counter()
        for _ in range(batches):
            next(batch_iter)
        return {"samples_per_s": batches * 256 / (time.perf_counter() - t0)}
    finally:
        it.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--episodes", type=int, default=3400, help="(default %(default)s)")
    parser.add_argument("--frames", type=int, default=300, help="per episode (default %(default)s)")
    parser.add_argument(
        "--batches", type=int, default=100, help="iterator batches of 256 timed per setting (default %(default)s)"
    )
    parser.add_argument(
        "--min-group-rows", type=int, default=4_096, help="the store's threshold (default %(default)s, its own)"
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the dataset and store (default: temp)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, root, store, rows, *rest = args.child
        measured = (
            measure_reads(root, store, int(rows))
            if kind == "reads"
            else measure_iterator(root, store, int(rows), int(rest[0]))
        )
        print(json.dumps(measured))
        return

    from lerobot_dali.generate import make_dataset

    work = args.out or Path(tempfile.mkdtemp(prefix="row_groups."))
    root = work / "dataset"
    if not root.exists():
        make_dataset(
            root,
            episodes=args.episodes,
            frames_per_episode=args.frames,
            cameras=0,
            episodes_per_file=args.episodes,
            state_dim=14,
            action_dim=14,
        )
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)  # the first run with the store is a cold one
    data = next((root / "data").rglob("*.parquet"))
    rows = str(args.min_group_rows)
    result: dict[str, object] = {
        "rows": args.episodes * args.frames,
        "data_file_mb": round(data.stat().st_size / 2**20, 1),
        "reads_store_off": run_child(__file__, ["reads", str(root), "off", rows]),
        "reads_store_cold": run_child(__file__, ["reads", str(root), str(store), rows]),
        "reads_store_warm": run_child(__file__, ["reads", str(root), str(store), rows]),
        "iterator_store_off": run_child(__file__, ["iterator", str(root), "off", rows, str(args.batches)]),
        "iterator_store_warm": run_child(__file__, ["iterator", str(root), str(store), rows, str(args.batches)]),
        "store_mb": round(sum(f.stat().st_size for f in store.rglob("*.arrow")) / 2**20, 1),
    }
    off, warm = result["reads_store_off"], result["reads_store_warm"]
    result["read_speedup"] = round(off["read_ms"] / warm["read_ms"], 1)  # type: ignore[index]
    result["iterator_speedup"] = round(
        result["iterator_store_warm"]["samples_per_s"] / result["iterator_store_off"]["samples_per_s"],  # type: ignore[index]
        2,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
