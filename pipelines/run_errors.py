"""The errors a training run (``pipelines/train.py``, ``pipelines/lerobot_policy.py``) says as one logged line and
exit status 2, as a flag's mistake, where anything else keeps its traceback: the run's own refusals
(:class:`RunRefused`) and the library's errors about what it reads while it is set up (:func:`setting_up`,
:class:`SetupError`). Two more are one line and exit status 1 once training has started: the library's errors about
the data a batch reads (:data:`DATA_ERRORS`), and a collective that failed because another rank's process ended
(:func:`peer_ended`), that rank's error being its own.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from lerobot_dali.errors import CudaUnavailableError, DatasetError, ResumeStateError, ShardingError

__all__ = ["DATA_ERRORS", "SETUP_ERRORS", "RunRefused", "SetupError", "peer_ended", "setting_up"]


#: The library's own errors about what the run reads (:mod:`lerobot_dali.errors`: a dataset path that does not exist,
#: a ``--cameras`` key or ``--episodes`` index the dataset lacks, a checkpoint's stream of other episodes, ``--device
#: cuda`` where no GPU is seen): raised while the run is set up, each is the user's to fix and its message says how.
#: Anything else (a bug) keeps its traceback. With them the training scripts' own refusals of what the run reads
#: (:class:`RunRefused`).
class RunRefused(ValueError):
    """What the run reads cannot be trained on as asked (datasets of different fps or of no shared camera, no
    state or action feature), differs from the checkpoint resumed (other windows, image size, cameras or
    augmentation), holds no full batch in an epoch or makes a loss that is not finite; the message says what to
    change."""


SETUP_ERRORS: tuple[type[Exception], ...] = (
    DatasetError, ShardingError, ResumeStateError, CudaUnavailableError, RunRefused
)  # fmt: skip


class SetupError(Exception):
    """An error of :data:`SETUP_ERRORS` before training started; :func:`~pipelines.train.exit_status` logs it as one
    line (each rank its own) and gives status 2, as for a flag's mistake."""


#: Set-up errors said without their type: about the command itself, as ``lerobot-dali`` says a GPU it lacks.
_SAID_UNTYPED = (RunRefused, CudaUnavailableError)


@contextlib.contextmanager
def setting_up() -> Iterator[None]:
    """Around a run's set-up (datasets, iterator, model, resume): an error of :data:`SETUP_ERRORS` raised there, or a
    PermissionError (a file of the dataset or the checkpoint this user may not read), becomes a :class:`SetupError`,
    whose message names the error type first (``DatasetNotFoundError: dataset 'x' not found ...``), as the
    ``lerobot-dali`` command prints it."""
    try:
        yield
    except SETUP_ERRORS as e:
        raise SetupError(str(e) if isinstance(e, _SAID_UNTYPED) else f"{type(e).__name__}: {e}") from e
    except PermissionError as e:  # (a dataset's file this user may not read: a traceback on every rank)
        raise SetupError(f"{type(e).__name__}: {e}: give this user access to it and the folders above it") from e


#: The library's errors about the data a batch reads once training has started (a video whose bytes are damaged, a
#: row's timestamp with no frame, a file gone since the build): the message names the dataset's file, the episode
#: and the camera, and says what to do. Said as one line (its traceback and causes at DEBUG), exit status 1: it was
#: a traceback chaining the same message 2-4 times (the worker's error, DALI's hand-over of it, the batch's).
DATA_ERRORS: tuple[type[Exception], ...] = (DatasetError,)

#: What gloo's collectives raise where the other end of a rank's connection is gone: its process ended (its own
#: error, a signal, the out-of-memory killer), and the collective this rank waited in with it cannot complete.
_GLOO_SAID = re.compile(r"\[[^\]\n]*gloo[^\]\n]*\] (.*?)(?:\. |$)", re.M)  # ([.../gloo/transport/tcp/pair.cc:553] ...)
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_ended(error: BaseException) -> str | None:
    """Where ``error`` is a collective's that failed because another rank's process ended, what gloo said of it
    (``Connection closed by peer [127.0.0.1]:33172``, ``Read error [127.0.0.1]:33172: Connection reset by peer``, a
    broken pipe); else None. Such an error is the other rank's, said by that rank: this one's traceback (34 lines
    under torchrun, ahead of or among the other's lines) told nothing of it. Any other error, a collective's too
    (gloo's timeout), is this rank's own."""
    said = _GLOO_SAID.search(str(error)) if isinstance(error, RuntimeError) else None
    return said[1] if said is not None and any(gone in said[1] for gone in _PEER_GONE) else None
