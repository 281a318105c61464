"""What a training run says and keeps as it goes (``pipelines/train.py``, ``pipelines/lerobot_policy.py``): the loss
averaged over ranks and the rates every ``--log-every`` steps (:func:`log_progress`, :class:`Throughput`), a loss that
is not finite refused before a checkpoint keeps its weights (:class:`FiniteLoss`), and ``--record``'s per-step record
(:class:`RunRecord`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lerobot_dali.cache_dirs import write_whole
from pipelines.checkpoints import latest_saved_step
from pipelines.policy import ACTION_KEY, STATE_KEY
from pipelines.run_errors import RunRefused

__all__ = ["FiniteLoss", "RunRecord", "Throughput", "log_progress"]

#: (The training run's lines, under the name they had in ``train.py``: what a log filter selects them by.)
logger = logging.getLogger("pipelines.train")


@dataclass
class Throughput:
    """Samples and decoded frames per second of this rank since the last report, and the share spent waiting
    for data (near 0 when the input pipeline keeps up with the model)."""

    samples: int = 0
    frames: int = 0
    wait_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def add(self, samples: int, frames: int, wait_s: float) -> None:
        self.samples += samples
        self.frames += frames
        self.wait_s += wait_s

    def report(self) -> tuple[float, float, float]:
        """``(samples/s, frames/s, data-wait fraction)``, then start a new window."""
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        out = (self.samples / elapsed, self.frames / elapsed, self.wait_s / elapsed)
        self.samples, self.frames, self.wait_s, self.since = 0, 0, 0.0, time.perf_counter()
        return out


@dataclass
class RunRecord:
    """What ``--record`` writes per rank: per step, the epoch, the dataset ``index`` values consumed and the
    local loss; the shape of every tensor of the first batch; at the end, per parameter tensor the sum of
    absolute values (equal on all ranks under DDP)."""

    first_step: int
    batch_shapes: dict[str, list[int]] = field(default_factory=dict)
    epochs: list[int] = field(default_factory=list)
    indices: list[torch.Tensor] = field(default_factory=list)
    #: A mixture's: per step the ``dataset_index`` of each sample (whose ``index`` it is).
    dataset_indices: list[torch.Tensor] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)

    def write(self, directory: Path, *, rank: int, world_size: int, model: torch.nn.Module) -> None:
        """Tensors are kept on the device during the run and read back here, so recording adds no per-step sync."""
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "rank": rank,
            "world_size": world_size,
            "first_step": self.first_step,
            "epochs": self.epochs,
            "batch_shapes": self.batch_shapes,
            "indices": [t.cpu().tolist() for t in self.indices],
            "dataset_indices": [t.cpu().tolist() for t in self.dataset_indices],
            "losses": [float(t) for t in self.losses],
            "param_abs_sums": [float(p.detach().double().abs().sum()) for p in model.parameters()],
        }
        write_whole(directory / f"rank{rank}.json", json.dumps(payload).encode())


#: Why a loss is not finite (:class:`FiniteLoss`).
_NOT_FINITE_DATA = (
    f"NaN or infinity in its {STATE_KEY!r} or {ACTION_KEY!r} (read as the data files hold them, as LeRobot reads them)"
)
_NOT_FINITE_CAUSE = f"held {_NOT_FINITE_DATA}, or training diverged, and the weights are NaN from there on"


#: Steps in a row whose loss was not finite, each skipped by fp16's gradient scaler, that refuse the run
#: (:class:`FiniteLoss`): the scaler halves its scale at each, which no overflow it recovers from takes so many times.
SKIPPED_IN_A_ROW = 25


class FiniteLoss:
    """Whether every rank's loss has been finite so far, checked (:meth:`check`) where ``train.py`` logs, before each
    checkpoint's save and at the end of the run; a loss that was not is refused (:class:`RunRefused`, naming its step
    and the last checkpoint saved before it): the weights its gradient stepped are NaN from then on, and a checkpoint
    of them would be resumed from.

    A step the optimizer skipped is the exception: fp16's gradient scaler skips a step whose gradients are not finite
    and leaves the weights as they were, which is how such a run goes on (LeRobot's with ``use_amp`` too). Its loss
    not finite is counted and said at the check (a warning: float16 overflowing, or rows of NaN), and refused only
    after :data:`SKIPPED_IN_A_ROW` such steps in a row: the run no longer trains.

    Each step (:meth:`note`) the first step whose loss is not finite is kept on the loss's device (``torch.where``: a
    few kernels, no wait for the device); only :meth:`check` reads it back, once, after gathering every rank's (a
    collective: every rank checks at the same steps and reaches the same verdict). ``remedy`` says what to do, in the
    flags of the script whose loop it checks (:data:`~pipelines.train.NOT_FINITE_REMEDY`: ``train.py``'s)."""

    def __init__(self, accelerator: Any, checkpoint_dir: Path | None, *, remedy: str) -> None:
        self.accelerator, self.checkpoint_dir, self.remedy = accelerator, checkpoint_dir, remedy
        zero = torch.zeros((), dtype=torch.int64, device=accelerator.device)
        self.first_step = zero.clone()  # (0: none)
        self.first_loss = torch.zeros((), dtype=torch.float32, device=accelerator.device)
        #: Skipped steps whose loss was not finite: since the last check, how many, the first and the longest run of
        #: them in a row; and the run going on now (kept across checks).
        self.skipped, self.first_skipped, self.longest, self.in_a_row = zero.clone(), zero.clone(), zero.clone(), zero
        self.checked: int | None = None  # (the step checked last)
        self.noted = 0  # (steps noted since the last check: the same on every rank)

    def note(self, loss: torch.Tensor, step: int, *, skipped: bool = False) -> None:
        """Note step ``step``'s ``loss`` (a scalar, on the device the accelerator's); ``skipped``: the optimizer did not
        step (``accelerator.optimizer_step_was_skipped``: the same on every rank, their gradients all-reduced)."""
        loss = loss.detach().float()
        not_finite = ~torch.isfinite(loss)
        self.noted += 1
        if skipped:
            self.first_skipped = torch.where(not_finite & (self.skipped == 0), step, self.first_skipped)
            self.skipped = self.skipped + not_finite.to(torch.int64)
            self.in_a_row = torch.where(not_finite, self.in_a_row + 1, 0)
            self.longest = torch.maximum(self.longest, self.in_a_row)
            return
        self.in_a_row = torch.zeros_like(self.in_a_row)
        first = not_finite & (self.first_step == 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.first_loss = torch.where(first, loss, self.first_loss)

    def check(self, step: int) -> None:
        """:class:`RunRefused` where a loss noted through step ``step`` on any rank was not finite (every rank must
        call it at the same steps: a collective; a second call at ``step`` is none)."""
        if step == self.checked:
            return
        gathered = self.accelerator.gather(
            torch.stack([self.first_step, self.skipped, self.first_skipped, self.longest])
        )
        by_rank = gathered.reshape(-1, 4).tolist()  # the one read back of a check
        steps = [(first, rank) for rank, (first, *_) in enumerate(by_rank) if first > 0]
        if steps:
            earliest, rank = min(steps)
            losses = self.accelerator.gather(self.first_loss).reshape(-1)
            raise self._refusal(earliest, float(losses[rank]))
        counts = [row[1] for row in by_rank]
        if max(counts) > 0:
            rank = max(range(len(counts)), key=counts.__getitem__)
            self._say_skipped(step, rank, counts[rank], by_rank[rank][2], max(row[3] for row in by_rank))
        zero = torch.zeros_like(self.skipped)
        self.skipped, self.first_skipped, self.longest, self.noted = zero, zero, zero, 0
        self.checked = step

    def _say_skipped(self, step: int, rank: int, count: int, first: int, longest: int) -> None:
        said = (
            f"{count} of the {self.noted} steps through step {step} had a loss not finite on rank {rank} (the first at "
            f"step {first}); the gradient scaler skipped each, leaving the weights as they were"
        )
        why = (
            f"a batch held {_NOT_FINITE_DATA}, or float16 overflows in this model "
            "(--mixed-precision bf16 keeps float32's range)"
        )
        if longest >= SKIPPED_IN_A_ROW:
            raise RunRefused(
                f"{said}, {longest} in a row, which no overflow the scaler recovers from takes: the run no longer "
                f"trains: {why}: {self.remedy}"
            )
        if self.accelerator.is_main_process:
            logger.warning("%s; where it goes on, %s", said, why)

    def _refusal(self, step: int, loss: float) -> RunRefused:
        if self.checkpoint_dir is None:
            resume = "no checkpoint is saved without --checkpoint-dir"
        else:
            saved = latest_saved_step(self.checkpoint_dir)  # (each save checked first: every one before step)
            resume = (
                f"no checkpoint is saved from step {step} on, and none was before it: a new run starts from step 0"
                if saved is None
                else f"no checkpoint is saved from step {step} on: resume only from one saved before it, the last "
                f"{self.checkpoint_dir / f'step_{saved:08d}'} (which --resume continues from)"
            )
        return RunRefused(
            f"the loss at step {step} is {loss} (a rank's at least): the batch of step {step} {_NOT_FINITE_CAUSE}: "
            f"{self.remedy}; {resume}"
        )


def log_progress(
    accelerator: Any, step: int, epoch: int, loss: torch.Tensor, meter: Throughput, world_size: int, losses: FiniteLoss
) -> None:
    """Rank 0 logs the loss averaged over ranks (every rank must call: collectives) and this rank's rates.

    A loss not finite, this step's or one since the last check, on any rank, is refused first (``losses.check``; on
    steps fp16's scaler skipped, said, and logged as it is).
    The mean then sums each rank's share in float32, which cannot overflow: accelerate's mean sums in the loss's dtype,
    where two ranks' finite float16 losses of 40,000 made inf (float32 and bfloat16 only past 1.7e38 each)."""
    losses.check(step)
    mean_loss = float(accelerator.reduce(loss.detach().float() / world_size, reduction="sum"))
    samples_s, frames_s, wait = meter.report()
    if accelerator.is_main_process and samples_s == 0:  # only the warm-up step since the last report
        logger.info("step %d epoch %d loss %.4f | warm-up", step, epoch, mean_loss)
    elif accelerator.is_main_process:
        logger.info(
            "step %d epoch %d loss %.4f | per rank %.1f samples/s %.1f frames/s, data wait %.0f%% "
            "| all ranks ~%.1f samples/s",
            step, epoch, mean_loss, samples_s, frames_s, 100 * wait, samples_s * world_size,
        )  # fmt: skip
