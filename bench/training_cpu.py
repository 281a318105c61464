"""The training process's CPU per batch in CPU mode (``device="cpu"``), against its DALI workers': a real iterator
run, its CPU split three ways: the main thread (Python: DALI's iterator, the batch dict), the other threads (DALI's
executor and thread pool: the graph's operators, i.e. the float hand-over, the augmentation, and DALI's own CPU
decode of VP9 clips) and the worker processes (rows, windows, and the CPU fallback's decode). Batches after
``--warmup`` are timed; the process's CPU is read from /proc (psutil) before and after. Prints one JSON object.

Which operators cost what is not told here: ``perf record -g -p PID`` of the run names DALI's kernels (its thread
pool runs C++ that cProfile and py-spy do not see).

    PYTHONPATH=. python bench/training_cpu.py --dataset DIR [--recipe vla] [--image-size 224x224] [--augment lerobot]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import psutil

from lerobot_dali.cli_options import add_image_size

#: No augmentation, the recipe's, or LeRobot's image transforms at their default ranges, every one applied.
AUGMENTS = ("none", "recipe", "lerobot")


def _augment(name: str, recipe: Any) -> Any:
    from lerobot_dali.augment_config import AugmentConfig, ColorJitter, RandomAffine, SharpnessJitter

    if name == "recipe":
        return None if recipe is None else recipe.augment
    if name == "lerobot":
        jitter = ColorJitter(brightness=(0.8, 1.2), contrast=(0.8, 1.2), saturation=(0.5, 1.5), hue=(-0.05, 0.05))
        return AugmentConfig(
            color_jitter=jitter,
            sharpness=SharpnessJitter(factor=(0.5, 1.5)),
            affine=RandomAffine(degrees=(-5.0, 5.0), translate=(0.05, 0.05)),
        )
    return None


def _cpu_s(process: psutil.Process, main_thread: int) -> tuple[float, float, float]:
    """CPU seconds so far: this process's main thread, its other threads, its child processes (alive ones)."""
    threads = {t.id: t.user_time + t.system_time for t in process.threads()}
    main = threads.get(main_thread, 0.0)
    children = 0.0
    for child in process.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        children += times.user + times.system
    return main, sum(threads.values()) - main, children


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from lerobot_dali import DALILeRobotIterator, open_dataset

    reader = open_dataset(args.dataset)
    options: dict[str, Any] = {"timestamp_source": "frame_index"} if args.frame_index else {}
    recipe = None
    if args.recipe:
        from pipelines.recipes import get_recipe

        recipe = get_recipe(args.recipe)
        options["delta_timestamps"] = recipe.delta_timestamps(reader.fps, reader.camera_keys)
        options["image_size"] = recipe.image_size
    if args.image_size:
        options["image_size"] = args.image_size
    it = DALILeRobotIterator(
        reader, batch_size=args.batch_size, device="cpu", decode="cpu", num_workers=args.num_workers,
        dali_threads=args.dali_threads, augment=_augment(args.augment, recipe), return_uint8=args.uint8, **options,
    )  # fmt: skip
    process, main_thread = psutil.Process(), threading.get_native_id()
    taken, before, start = 0, None, 0.0
    try:
        while before is None or taken < args.warmup + args.batches:
            for _ in it:
                taken += 1
                if taken == args.warmup:
                    before, start = _cpu_s(process, main_thread), time.perf_counter()
                if taken == args.warmup + args.batches:
                    break
        after, wall = _cpu_s(process, main_thread), time.perf_counter() - start
        routes = sorted({route.value for route in it.routes.values()})
    finally:
        it.close()
    main, threads, workers = ((a - b) / args.batches * 1e3 for a, b in zip(after, before, strict=True))
    return {
        "dataset": args.dataset,
        "routes": routes,
        "batch_size": args.batch_size,
        "options": {k: v for k, v in vars(args).items() if k not in ("dataset", "batch_size")},
        "main_thread_ms": round(main, 1),
        "dali_threads_ms": round(threads, 1),
        "workers_ms": round(workers, 1),
        "training_over_workers": round((main + threads) / workers, 3) if workers else None,
        "wall_ms": round(wall / args.batches * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--dataset", required=True, help="a LeRobot dataset folder")
    parser.add_argument("--batch-size", type=int, default=16, help="(default %(default)s)")
    parser.add_argument("--num-workers", type=int, default=2, help="(default %(default)s)")
    parser.add_argument("--dali-threads", type=int, default=None, help="(default: the iterator's)")
    parser.add_argument("--recipe", default=None, help="act, diffusion, vla or a TOML file: windows and image size")
    add_image_size(parser)
    parser.add_argument("--augment", choices=AUGMENTS, default="recipe", help="(default %(default)s)")
    parser.add_argument("--uint8", action="store_true", help="return_uint8=True")
    parser.add_argument("--frame-index", action="store_true", help="look frames up by frame_index / fps (cr5_*)")
    parser.add_argument("--batches", type=int, default=30, help="batches timed, after --warmup (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="(default %(default)s)")
    print(json.dumps(measure(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
