"""Bring an exception raised in a DALI worker process back as itself.

DALI's parallel external source re-raises a worker's failure in the training process as a bare
``Exception`` carrying the worker's traceback text, chained to a ``RuntimeError`` holding ``str()`` of the
original. A user who catches ``FrameTimestampError`` or ``MissingDataFileError`` should not have to parse
that, so the original is rebuilt when it is one of ours or a builtin: the message is the ``RuntimeError``'s,
exactly (several lines, colons and all), and the type is the name the traceback prints right before it. What the
text alone would lose, a :class:`~lerobot_dali.errors.RemoteFileError`'s or
:class:`~lerobot_dali.errors.MissingDataFileError`'s ``status``, the worker writes on its message's last line
(:func:`carry_to_trainer`), and the rebuild takes it back off.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import signal
from collections.abc import Callable
from typing import Any

from . import errors
from .literal_parsing import PARSE_LOCK
from .url_secrets import mask_error

__all__ = [
    "SMALL_SHM_BYTES",
    "carry_to_trainer",
    "dead_worker_error",
    "original_worker_error",
    "shared_memory_note",
    "shm_bytes",
]

_MARKER = "Exception traceback received from worker"
_QUALNAME = re.compile(r"[A-Za-z_][\w.]*\Z")
#: The errors whose ``status`` (the HTTP status their server answered) the text DALI hands over would lose.
_WITH_STATUS = (errors.RemoteFileError, errors.MissingDataFileError)
#: The last line of such an error's message, in a worker, holding its class's name and ``status`` (``None`` too).
_STATUS_LINE = "(lerobot_dali: {}.status {})"
_STATUS = re.compile(r"\n\(lerobot_dali: (\w+)\.status (\d+|None)\)\Z")


def carry_to_trainer(error: BaseException) -> None:
    """Write on ``error``'s message, in a worker process, what DALI's hand-over (the traceback's text and ``str()``
    alone, ``_multiproc/messages.py``) would lose: a RemoteFileError's ``status`` (None in the trainer for a 403), a
    MissingDataFileError's (None for a 404).
    :func:`original_worker_error` takes it off again as it rebuilds the error. Written once, however often raised, and
    for a status of None too: a message whose own last line reads as one is rebuilt whole, not as that status."""
    if isinstance(error, _WITH_STATUS):
        line = f"\n{_STATUS_LINE.format(type(error).__name__, error.status)}"
        if not str(error).endswith(line):
            error.args = (f"{error}{line}", *error.args[1:])


def original_worker_error(error: BaseException) -> BaseException | None:
    """The worker's original exception if ``error`` (or its causes) carries one we can rebuild, else None. DALI's error
    and its cause (the worker's traceback text and its error's) are masked first (:func:`.mask_error`): a builtin
    error of a worker naming a path that keeps a URL's query was rebuilt and raised with its credentials, from DALI's
    text naming them in each error of the worker's chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if _MARKER in text:
            text = str(mask_error(current))
            cause = current.__cause__
            message = str(cause) if isinstance(cause, RuntimeError) else None
            rebuilt = _rebuild(text, message)
            if rebuilt is not None:
                return rebuilt
        current = current.__cause__ or current.__context__
    return None


def _rebuild(traceback_text: str, message: str | None) -> BaseException | None:
    """The exception ``traceback_text`` ends with; ``message`` is its exact ``str()`` when DALI passed it on."""
    text = traceback_text.rstrip("\n")
    if message is None:  # no exact message: the last line, which holds all of a one-line message
        qualname, _, message = text.rpartition("\n")[2].partition(": ")
    elif message and text.endswith(f": {message}"):
        qualname = text[: -len(message) - 2].rpartition("\n")[2]
    elif not message:
        qualname = text.rpartition("\n")[2]
    else:
        return None
    if not _QUALNAME.match(qualname):
        return None
    module, _, name = qualname.rpartition(".")
    if module == errors.__name__:
        cls = getattr(errors, name, None)
    elif module in ("", "builtins"):
        cls = getattr(builtins, name, None)
    else:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    if issubclass(cls, KeyError):  # str(KeyError(k)) is repr(k): take the key back out
        try:
            with PARSE_LOCK:
                key = ast.literal_eval(message)
        except (ValueError, SyntaxError, SystemError):  # SystemError: another thread's parse (literal_parsing)
            key = message
        return cls(key)
    status = _STATUS.search(message) if issubclass(cls, _WITH_STATUS) else None
    if status is not None and status[1] == cls.__name__:
        return cls(message[: status.start()], None if status[2] == "None" else int(status[2]))
    try:
        return cls(message) if message else cls()
    except TypeError:
        return None


#: What DALI 2.4 raises when a worker process ends without sending a result, or (having closed its queues on its way
#: out: ended by SIGTERM) before it was sent its next task (``_multiproc/pool.py``).
_DEAD_WORKER = ("Worker data receiving interrupted", "Sending tasks to worker")


def dead_worker_error(
    error: BaseException, pipeline: Any, where: str, close_workers: Callable[[], None]
) -> errors.WorkerProcessError | None:
    """A clear error for DALI's bare message about a worker that died without a word, else None.

    ``pipeline``: the DALI pipeline, whose worker processes' exit codes are read where DALI still holds them
    (best effort: private attributes); ``where``: which batches were being read, for the message;
    ``close_workers``: ends the pool, where no worker has ended yet: one ended by SIGTERM unwinds, closing DALI's
    queues, which interrupts the wait for its batch before it has exited (its code was unknown, the message blamed
    the out-of-memory killer).
    """
    if not any(text in str(error) for text in _DEAD_WORKER):
        return None
    processes = getattr(getattr(getattr(pipeline, "_py_pool", None), "pool", None), "_processes", None) or []
    codes = _exit_codes(processes)
    if not codes:
        close_workers()  # (waits for them: the exit codes are known after)
        codes = _exit_codes(processes)
    how = ", ".join(dict.fromkeys(_describe_exit(code) for code in codes)) or "exit status unknown"
    if -signal.SIGBUS in codes:
        cause = f"A SIGBUS is a full /dev/shm: {shared_memory_note(shm_bytes())}"
    elif _TERMINATED & set(codes) and -signal.SIGKILL not in codes:
        return errors.WorkerProcessError(
            f"a data-loading worker process ended while reading {where} ({how}). A SIGTERM is a preemption or the "
            "end of the job (Slurm, Kubernetes and torchrun send it to every process of the job, the workers too). "
            "No sample was lost: state_dict() still stands before these batches, so a SIGTERM handler that saves a "
            "checkpoint can catch WorkerProcessError and save it then."
        )
    else:
        cause = (
            "A SIGKILL is most often the kernel's out-of-memory killer (see `dmesg`): lower num_workers, "
            "batch_size, prefetch or the frames per sample"
        )
    return errors.WorkerProcessError(
        f"a data-loading worker process died without reporting an error ({how}) while reading {where}. {cause}; "
        "with num_workers=0 the same batches run in this process, where a Python error would show."
    )


#: Below this, /dev/shm is a container's default (Docker's and Kubernetes' 64 MiB), not a machine's half of RAM.
SMALL_SHM_BYTES = 1 << 30


def shared_memory_note(total: int | None) -> str:
    """Why /dev/shm matters and how to grow it, with its size ``total`` (the worker processes hand each batch
    over in shared memory there, several batches per worker in flight)."""
    size = f"{total / 2**20:.0f} MiB here" if total is not None else "its size unknown here"
    return (
        f"the worker processes hand their batches over in shared memory there ({size}, and a batch of 32 "
        "samples of three 480x640 cameras is 88 MiB, one per worker in flight and 2 x prefetch more); in Docker "
        "run with --ipc=host or --shm-size=8g (Kubernetes: an emptyDir of medium Memory on /dev/shm), or lower "
        "num_workers, batch_size or prefetch"
    )


def shm_bytes() -> int | None:
    """The size of /dev/shm (None where there is none)."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


#: How a worker ended by SIGTERM exits: unwinding (:mod:`.parent_watch`), or by the signal itself (while exiting).
_TERMINATED = {128 + signal.SIGTERM, -signal.SIGTERM}


def _exit_codes(processes: list[Any]) -> list[int]:
    """The exit codes of the ``processes`` that have ended (a healthy worker's 0 left out)."""
    return [p.exitcode for p in processes if getattr(p, "exitcode", None)]


def _describe_exit(code: int) -> str:
    if code == 128 + signal.SIGTERM:
        return f"ended by SIGTERM (exit code {code})"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
