"""The errors a training run (``pipelines/train.py``, ``pipelines/lerobot_policy.py``) says as one logged line and
exit status 2, as a flag's mistake, where anything else keeps its traceback: the run's own refusals
(:class:`RunRefused`) and the library's errors about what it reads while it is set up (:func:`setting_up`,
:class:`SetupError`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lerobot_dali.errors import CudaUnavailableError, DatasetError, ResumeStateError, ShardingError

__all__ = ["SETUP_ERRORS", "RunRefused", "SetupError", "setting_up"]


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
