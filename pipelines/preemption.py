"""Preemption of a training loop (``pipelines/train.py``'s and ``pipelines/lerobot_policy.py``'s): a scheduler's
signal on any rank stops every rank at the same step boundary, which saves a checkpoint there and exits with
:data:`EXIT_PREEMPTED`, for a rerun with ``--resume`` to continue.

Beside ``pipelines/interrupts.py`` (Ctrl-C, which saves nothing), not in it: that module imports nothing heavy, to run
before the scripts' own imports, while this one needs torch (the ranks agree through an all-reduce) and the
checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pipelines.checkpoints import latest_saved_step, save_checkpoint
from pipelines.interrupts import PREEMPTION_SIGNALS, Interrupted
from pipelines.run_errors import peer_ended

if TYPE_CHECKING:
    from pipelines.progress import FiniteLoss

__all__ = [
    "EXIT_PREEMPTED",
    "PREEMPTION_SIGNALS",
    "Preempted",
    "PreemptibleLoop",
    "PreemptionNotice",
    "log_preemption",
]

#: (The training run's lines, under the name they had in ``train.py``: what a log filter selects them by.)
logger = logging.getLogger("pipelines.train")

#: Exit status of a run stopped by a preemption signal once its checkpoint is saved (sysexits' EX_TEMPFAIL: try
#: again later), so a job script can tell it from a failure and relaunch with ``--resume``.
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """A training loop (:class:`PreemptibleLoop`) stopped early on a preemption signal, every rank at ``step`` (saved
    in ``checkpoint`` where there is a ``--checkpoint-dir``); :func:`~pipelines.train.exit_status` gives
    :attr:`exit_status`."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"{signal.Signals(signum).name}: every rank stopped at step {step}")

    @property
    def exit_status(self) -> int:
        """:data:`EXIT_PREEMPTED` with a checkpoint to resume from; without, 128 + the signal, as the signal itself
        would have ended the process."""
        return EXIT_PREEMPTED if self.checkpoint is not None else 128 + self.signum


class PreemptionNotice:
    """Once installed: :data:`PREEMPTION_SIGNALS` are noted (they no longer end the process) and :meth:`agreed` tells
    every rank, at the same point of the same step, whether any rank has received one.

    A signal often reaches one rank, or reaches the ranks at different steps (SLURM signals the processes one by
    one, a spot instance's notice ends one node's ranks only); a rank that stopped alone would leave the others
    waiting in the gradients' all-reduce or the checkpoint's barrier. The handler only notes the signal: the loop
    acts on it between steps. SIGINT (Ctrl-C) keeps its KeyboardInterrupt. Outside the main thread (where Python
    takes no signal handlers) nothing is installed.

    Several ranks agree through an all-reduce (max) of the signal's number each step: on the CPU, on gloo (the
    process group's own where it is gloo, else a gloo group made for it), so it waits for no GPU work; its cost is
    one small message's round trip a step.
    """

    def __init__(self, world_size: int) -> None:
        self.received = 0
        self._group: Any = None
        self._previous: dict[int, Any] = {}
        import torch.distributed as dist

        self._agree = world_size > 1 and dist.is_available() and dist.is_initialized()
        if world_size > 1 and not self._agree:  # (accelerate on TPUs: ranks without torch.distributed)
            logger.warning("no torch.distributed process group: each rank stops on its own signals")
        if self._agree and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # (a collective: every rank makes it here)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in PREEMPTION_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._note)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _note(self, signum: int, frame: object) -> None:
        self.received = self.received or signum  # (the first: SLURM's early SIGUSR1, then its SIGTERM)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "no signal"

    def agreed(self) -> int:
        """The signal any rank has received (the highest number where several), 0 for none; every rank must call
        it at the same point (a collective)."""
        if not self._agree:
            return self.received
        import torch.distributed as dist

        flag = torch.tensor([self.received], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item())


class PreemptibleLoop:
    """A training loop's side of preemption (``train.py``'s and ``lerobot_policy.py``'s): on a preemption signal
    (:class:`PreemptionNotice`) every rank stops at one step boundary and saves a checkpoint there, with the stream
    position before the batch it did not train on; once the run is closed, :meth:`finishing` raises :class:`Preempted`::

        loop = PreemptibleLoop(accelerator, iterator, step=step, checkpoint_dir=checkpoint_dir, data=data)
        with contextlib.closing(iterator), loop:  # (the signals are noted from here on)
            while step < steps:
                got = loop.next_batch(batches, step)
                if got is None:  # every rank stops here
                    break
                ...  # the step
                step += 1
                loop.save_if_due(step, steps=steps, save_every=save_every)
            loop.stop(step)
        with loop.finishing(step):
            accelerator.end_training()
    """

    def __init__(
        self,
        accelerator: Any,
        iterator: Any,
        *,
        step: int,
        checkpoint_dir: Path | None,
        data: Mapping[str, Any],
        losses: FiniteLoss | None = None,
        keep_checkpoints: int = 0,
    ) -> None:
        self.accelerator, self.iterator, self.checkpoint_dir, self.data = accelerator, iterator, checkpoint_dir, data
        self.keep = keep_checkpoints  # (0: all; else the newest, as each save removes older ones)
        self.losses = losses  # (checked before each save: no checkpoint of weights a loss not finite has stepped)
        self.notice = PreemptionNotice(iterator.world_size)  # (may make a gloo group: a collective)
        self.saved = step if step else None  # (the checkpoint resumed from: a preemption before a step saves none)
        self.stopped_by = 0
        self.step = step  # (the steps trained: a Ctrl-C's Interrupted names the next, or this one where after_step)
        self.after_step = False  # (past the step's training: in its save, or after the last)
        self.checkpoint: Path | None = None
        self._position: dict[str, Any] | None = None

    def __enter__(self) -> PreemptibleLoop:
        self.notice.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        # (Without an error the handlers stay until finishing: a signal while closing is noted. So where another rank
        # ended: torchrun's SIGTERM, sent once that rank has exited, killed this one as it closed its iterator, before
        # exit_status said why it stopped.)
        if kind is not None and (error is None or peer_ended(error) is None):
            self.notice.uninstall()
        self._interrupted(error, step=self.step, after_step=self.after_step)  # (Ctrl-C: say how to go on)

    def _interrupted(self, error: BaseException | None, *, step: int, after_step: bool) -> None:
        """Where ``error`` is a Ctrl-C (a plain KeyboardInterrupt), raise :class:`Interrupted`: one line that says
        which checkpoint a resume continues from, not a traceback."""
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, Interrupted):
            raise Interrupted(
                step, latest_saved_step(self.checkpoint_dir), self.checkpoint_dir, after_step=after_step
            ) from None

    def next_batch(
        self, batches: Iterator[tuple[dict[str, Any], float]], step: int
    ) -> tuple[dict[str, Any], float] | None:
        """The next ``(batch, wait_s)`` of ``batches`` (:func:`~pipelines.train.epoch_batches`), step ``step + 1``'s,
        or None where every rank stops at this boundary (a collective: every rank calls it once a step)."""
        self.step, self.after_step = step, False
        self._position = self.iterator.state_dict()  # the stream here: a preemption's checkpoint takes no batch more
        got = None
        failed = ""  # (what reading the batch raised, said as text: its frames let go)
        try:
            if not self.notice.received:
                got = next(batches)
        except Exception as e:
            if not self.notice.received:
                raise
            # (A signal sent to the process group, as torchrun sends it, or to every process, as SLURM does, ends
            # the DALI workers too. The batch is read again on resume: the position is before it.)
            failed = f"{type(e).__name__}: {str(e).partition('. ')[0]}"
        self.stopped_by = self.notice.agreed()
        # Said once the ranks agreed to stop: where another rank's process ended instead (torchrun's SIGTERM, no
        # preemption), the collective's failure says that alone; this line said a resumed run reads the batch too.
        if failed:
            logger.warning(
                "rank %d: reading the batch of step %d failed after %s (%s); the resumed run reads it",
                self.iterator.rank, step + 1, self.notice.name, failed,
            )  # fmt: skip
        if self.stopped_by:
            return None
        assert got is not None  # (no rank had a signal: this one read its batch)
        return got

    def save_if_due(self, step: int, *, steps: int, save_every: int) -> None:
        """After step ``step`` of ``steps``, with a checkpoint folder: the checkpoint at the last step and every
        ``save_every`` steps (0: at the last only)."""
        # (trained: a Ctrl-C in the save counts it among the steps trained again, and says it came after it)
        self.step, self.after_step = step, True
        if self.checkpoint_dir is not None and (step == steps or (save_every and step % save_every == 0)):
            self._check_losses(step)
            save_checkpoint(self.accelerator, self.checkpoint_dir, step, self.iterator, self.data, keep=self.keep)
            self.saved = step

    def stop(self, step: int) -> None:
        """After the loop: where it stopped on a signal, with a checkpoint folder, the checkpoint at ``step`` (unless
        saved there already)."""
        if self.stopped_by and self.checkpoint_dir is not None:
            self.checkpoint = self.checkpoint_dir / f"step_{step:08d}"
            if self.saved != step:
                self._check_losses(step)
                save_checkpoint(
                    self.accelerator, self.checkpoint_dir, step, self.iterator, self.data, stream=self._position,
                    keep=self.keep,
                )  # fmt: skip

    def _check_losses(self, step: int) -> None:
        if self.losses is not None:
            self.losses.check(step)

    @contextlib.contextmanager
    def finishing(self, step: int) -> Iterator[None]:
        """Around closing the run (every rank: saving, ``end_training``); after it, where the loop stopped on a
        signal, raise :class:`Preempted`, rank 0 logging how to go on (the handlers stay, for
        :func:`~pipelines.train.exit_status` to ignore the signals from here on); else, or where closing raised, the
        signals' own handlers come back."""
        try:
            yield
        except BaseException as error:
            self.notice.uninstall()
            self._interrupted(error, step=step, after_step=True)  # (a Ctrl-C closing the run: one line, as in the loop)
            raise
        if self.stopped_by:
            preempted = Preempted(self.stopped_by, step, self.checkpoint)
            if self.accelerator.is_main_process:
                log_preemption(preempted)
            raise preempted
        self.notice.uninstall()


def log_preemption(preempted: Preempted) -> None:
    """The line that says how to go on after :class:`Preempted` (rank 0's)."""
    if preempted.checkpoint is None:
        logger.warning(
            "%s; no checkpoint can be saved without --checkpoint-dir: a new run starts from step 0 (exit status %d)",
            preempted, preempted.exit_status,
        )  # fmt: skip
    else:
        logger.warning(
            "%s and saved %s: to continue from it, run the same command with --resume (exit status %d)",
            preempted, preempted.checkpoint, preempted.exit_status,
        )  # fmt: skip
