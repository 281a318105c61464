"""Ctrl-C in the training scripts (``pipelines/train.py``, ``pipelines/lerobot_policy.py``): in every phase one logged
line that says what a rerun continues from, and exit status 130 (128 + SIGINT), never a traceback.

This module imports nothing heavy (no torch, numpy or lerobot_dali): :func:`run_main` runs before the scripts' own
imports, which take seconds (torch's, LeRobot's), so that a Ctrl-C in them is said as in the later phases.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

#: What schedulers send before they kill a job: SIGTERM (SLURM at the time limit or scancel, Kubernetes, spot
#: instances' shutdown, torchrun passing on its own), SIGUSR1 (SLURM's ``--signal``, ahead of time). (Here, not in
#: ``preemption.py``, which imports torch: :func:`run_main` ignores them once the script's status is known.)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

__all__ = ["LOG_LEVEL_ENV", "Interrupted", "configure_logging", "ignore_preemption_signals", "run_main", "said"]


#: The scripts' log level, where not INFO: ``DEBUG`` adds what one-line errors leave out (a data error's traceback and
#: causes, a waiting rank's collective's), ``WARNING`` drops the progress lines. (Not torchrun's ``LOGLEVEL``, which
#: a user sets for torchrun's own lines.)
LOG_LEVEL_ENV = "LEROBOT_DALI_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging() -> None:
    """INFO (or :data:`LOG_LEVEL_ENV`'s level) and up to stderr, each line with its time and the launcher's ``RANK``
    (torchrun, accelerate launch)."""
    wanted = os.environ.get(LOG_LEVEL_ENV, "").strip().upper() or "INFO"
    logging.basicConfig(
        level=wanted if wanted in _LEVELS else logging.INFO,
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if wanted not in _LEVELS:
        logging.getLogger(__name__).warning(
            "%s=%s is not a log level (one of %s): logging at INFO", LOG_LEVEL_ENV, os.environ[LOG_LEVEL_ENV],
            ", ".join(_LEVELS),
        )  # fmt: skip


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT's KeyboardInterrupt) in a training loop (``preemption.py``'s ``PreemptibleLoop``), after
    ``step`` steps (in the next one, or ``after_step``: in what follows the step, its checkpoint's save or closing the
    run), while ``setting_up`` (before the loop: nothing trained) or while ``starting`` (the script's imports and the
    checks of its flags: nothing read or written yet, so no checkpoint is named): unlike a preemption signal it saves
    nothing, so the message says which checkpoint a resume continues from (and which steps it trains again);
    ``exit_status`` (``train.py``'s) logs it as one line on each rank and gives 128 + SIGINT, as the shell does."""

    def __init__(
        self,
        step: int,
        saved: int | None,
        checkpoint_dir: Path | None,
        *,
        after_step: bool = False,
        setting_up: bool = False,
        starting: bool = False,
    ) -> None:
        self.step, self.saved, self.checkpoint_dir = step, saved, checkpoint_dir
        if starting:
            where = "interrupted (Ctrl-C) while starting (imports, flags)"
        elif setting_up:
            where = "interrupted (Ctrl-C) while setting up (datasets, iterator, model, resume): nothing was trained"
        else:
            where = f"interrupted (Ctrl-C) {f'after step {step}' if after_step else f'during step {step + 1}'}"
        if starting:
            told = "nothing was read, written or trained: the same command starts the run"
        elif checkpoint_dir is None:
            told = "nothing is saved without --checkpoint-dir: a new run starts from step 0"
        elif saved is None:
            told = f"no checkpoint was saved in {checkpoint_dir} yet: the same command starts again from step 0"
        else:
            since = f"steps {saved + 1}..{step} since are trained again" if step > saved else "no step since"
            told = (
                f"its last checkpoint is {checkpoint_dir / f'step_{saved:08d}'} ({since}): to continue from it, run "
                "the same command with --resume"
            )
        super().__init__(f"{where}; {told} (exit status {self.exit_status})")

    @classmethod
    def while_starting(cls) -> Interrupted:
        """A Ctrl-C in a script's imports or the checks of its flags."""
        return cls(0, None, None, starting=True)

    @property
    def exit_status(self) -> int:
        return 128 + signal.SIGINT


def said(log: logging.Logger, program: str, interrupted: Interrupted) -> int:
    """Log ``interrupted`` as the one line ``program: message``; returns its exit status."""
    log.error("%s: %s", program, interrupted)
    return interrupted.exit_status


def run_main(module: str, program: str, logger: str) -> NoReturn:
    """Run a training script as ``python pipelines/<script>.py`` runs it: import ``module`` (its torch, accelerate and
    LeRobot imports take seconds) and exit with its ``main()``'s status. A Ctrl-C while it imports is one line and
    exit status 130 (logged by ``logger``, the script's), as ``main()`` says one in any later phase: it was Python's
    traceback, the process killed by SIGINT. Once ``main()`` has returned, or exited (argparse's refusal of a flag:
    status 2), a Ctrl-C or a preemption signal in the interpreter's exit changes nothing of its status."""
    atexit.register(_ignore_ctrl_c)  # (first: the last exit callback, after those of the script's imports)
    try:
        main = importlib.import_module(module).main
        status = main()
    except KeyboardInterrupt:  # (main() says its own: only one before it started is left)
        configure_logging()
        status = said(logging.getLogger(logger), program, Interrupted.while_starting())
    except SystemExit as e:  # argparse's refusal of a flag (its line logged) or --help: main()'s status, raised
        if e.code is not None and not isinstance(e.code, int):
            raise  # (a message, which Python's exit prints)
        status = e.code or 0
    signal.signal(signal.SIGINT, functools.partial(_exit_now, status))
    # The status is known: a preemption signal in the interpreter's exit (seconds: 3.1 s after main() returned, on 2
    # cores, 2.6 s of it past the exit callbacks) killed a run that had trained, saved and closed (status 143, nothing
    # said: a job's time limit as it ended read as a job killed; a preempted run's 75 likewise). Ignored, not handled:
    # Python's finalisation sets a signal handled in Python back to the default, one ignored stays ignored.
    ignore_preemption_signals()
    sys.exit(status)


def ignore_preemption_signals() -> None:
    """From here on a preemption signal changes nothing (the run's status is known): ignored, not handled, so that
    Python's finalisation, which sets a signal handled in Python back to the default, leaves it so."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _exit_now(status: int, signum: int, frame: object) -> None:
    """SIGINT's handler once the script's ``status`` is known: a Ctrl-C in the interpreter's exit (a second one, as
    people press it after the first one's line, or one at a run's end) ends the process at once with that status. It
    was a KeyboardInterrupt in an exit callback (DALI's ``_unload_dali``: a traceback after the line) or the process
    killed by SIGINT (status -2), then 130 whatever the status: a run that had trained and saved read as one
    interrupted (a preempted one's 75 too)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a stream mid-write, closed: nothing more to say)
            stream.flush()
    os._exit(status)


def _ignore_ctrl_c() -> None:
    """The last exit callback: SIGINT ignored from here on. Python's finalisation, which follows, sets a signal handled
    in Python (:func:`_exit_now`) back to the default, and a Ctrl-C after it (as C++'s static destructors run, torch's
    and DALI's) killed the process: status -2 for a run that had finished (or 130 under a shell)."""
    with contextlib.suppress(ValueError):  # (not the main thread: nothing to do)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
