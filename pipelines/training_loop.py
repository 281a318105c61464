"""The loop both training scripts run (``train.py``'s policy and ``lerobot_policy.py``'s LeRobot ones), written once so
that they cannot drift apart: a step per batch, every loss checked finite (:class:`~pipelines.progress.FiniteLoss`),
progress every ``--log-every`` steps, a checkpoint every ``--save-every``, and every rank stopping at one step on a
preemption signal (:class:`~pipelines.preemption.PreemptibleLoop`). What a step trains is the script's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pipelines.preemption import PreemptibleLoop
from pipelines.progress import FiniteLoss, Throughput, log_progress

__all__ = ["LoopOptions", "camera_frames", "run_steps"]

#: (The training run's lines, under the name they had in ``train.py``: what a log filter selects them by.)
logger = logging.getLogger("pipelines.train")


class LoopOptions(Protocol):
    """The flags the loop reads (``TrainOptions``' and ``PolicyTrainOptions``' alike)."""

    @property
    def steps(self) -> int: ...
    @property
    def log_every(self) -> int: ...
    @property
    def save_every(self) -> int: ...
    @property
    def checkpoint_dir(self) -> Path | None: ...
    @property
    def keep_checkpoints(self) -> int: ...


def camera_frames(batch: dict[str, Any], camera_keys: Sequence[str]) -> int:
    """Decoded camera frames in a batch: B per camera, B*T for a (B, T, C, H, W) window."""
    return sum(int(np.prod(batch[k].shape[: batch[k].ndim - 3])) for k in camera_keys)


def run_steps(
    accelerator: Any,
    iterator: Any,
    batches: Iterator[tuple[dict[str, Any], float]],
    train_step: Callable[[dict[str, Any]], torch.Tensor],
    *,
    step: int,
    options: LoopOptions,
    data: Mapping[str, Any],
    cameras: Sequence[str],
    remedy: str,
    after_step: Callable[[dict[str, Any], torch.Tensor], None] | None = None,
    after_log: Callable[[], None] | None = None,
) -> tuple[int, PreemptibleLoop]:
    """Train from step ``step`` to ``options.steps`` on ``batches`` (``epoch_batches(iterator)``), one
    ``train_step(batch) -> loss`` each (forward, backward, optimizer step), and close ``iterator``; the steps trained
    to and the loop, whose :meth:`~pipelines.preemption.PreemptibleLoop.finishing` the caller closes the run in.

    ``data`` is what a checkpoint records for a resume to compare (the windows, the augmentation); ``cameras`` the
    batch's camera keys (the frames/s); ``remedy`` what to do about a loss not finite, in the script's flags.
    ``after_step(batch, loss)`` runs after each step's bookkeeping (``--record``), ``after_log()`` after each progress
    line (a read back of the losses kept on the device: the line waited for the device already)."""
    start_step, started = step, time.perf_counter()
    meter = Throughput()
    losses = FiniteLoss(accelerator, options.checkpoint_dir, remedy=remedy)
    loop = PreemptibleLoop(
        accelerator, iterator, step=step, checkpoint_dir=options.checkpoint_dir, data=data, losses=losses,
        keep_checkpoints=options.keep_checkpoints,
    )  # fmt: skip
    with contextlib.closing(iterator), loop:  # (a signal before: ends the process as before, no step trained to lose)
        while step < options.steps:
            got = loop.next_batch(batches, step)
            if got is None:  # a preemption signal: every rank stops at this step
                break
            batch, wait_s = got
            loss = train_step(batch)
            step += 1
            losses.note(loss, step, skipped=accelerator.optimizer_step_was_skipped)  # (fp16's scaler: FiniteLoss)
            if step == start_step + 1:
                meter.report()  # the first step carries pipeline start-up and warm-up: keep it out of the rates
            else:
                meter.add(len(batch["index"]), camera_frames(batch, cameras), wait_s)
            if after_step is not None:
                after_step(batch, loss)
            if step % options.log_every == 0 or step == options.steps:
                log_progress(accelerator, step, iterator.epoch, loss, meter, iterator.world_size, losses)
                if after_log is not None:
                    after_log()
            loop.save_if_due(step, steps=options.steps, save_every=options.save_every)
        loop.stop(step)
        losses.check(step)  # (the end: checked already at the last step; a preempted run's last step may not be)
    if accelerator.is_main_process and not loop.stopped_by and step > start_step:  # (a preemption: its own line)
        _say_done(loop, options, start_step, step, iterator.epoch, time.perf_counter() - started)
    return step, loop


def _say_done(
    loop: PreemptibleLoop, options: LoopOptions, start_step: int, step: int, epoch: int, seconds: float
) -> None:
    """The run's last line of its own: what was trained, in how long, and what was kept (the progress lines say each
    step's loss and rates, not the whole)."""
    kept = ""
    if options.checkpoint_dir is not None and loop.saved is not None:
        kept = f"; last checkpoint {options.checkpoint_dir / f'step_{loop.saved:08d}'}"
    logger.info("trained steps %d..%d in %.1f s, to epoch %d%s", start_step, step, seconds, epoch, kept)
