"""Start DALI's worker processes without running the training script again in each.

DALI starts its workers with ``spawn``, and a spawned process first imports the parent's ``__main__`` (the
training script, as ``__mp_main__``) to find what the pickled callback names there. The workers only run
lerobot-dali's own source, which names nothing in ``__main__``, yet each paid for the script's top-level
imports: measured on this machine, a script importing LeRobot's ACT policy and dataset takes 3.7 s and ~1 GB
resident per process, so 8 ranks of 8 workers would hold 64 copies (torch alone: 0.9 s, ~220 MB). It is also
why a script that builds the iterator outside ``if __name__ == "__main__":`` failed: each worker ran it again.

Within :func:`skipping_main`, processes that the calling thread spawns are told not to import ``__main__``
(multiprocessing's preparation data leaves it out), unless the callback's pickle names ``__main__`` (a class
the user defined in the script), where they import it as before. Other threads' processes are untouched.

A spawned worker also starts without the training process's logging set-up: :func:`log_like_trainer` gives
lerobot-dali's loggers there the trainer's level and, where the worker has no handler, one to stderr that names
the worker, so its warnings (remote retries, a decoder passed over) and, at ``-v``, its progress still show;
one that every worker would give alike (a cache folder that takes no writes) shows once for the job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing.spawn
import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import fork_locks
from .said_once import shared_with_children
from .url_secrets import mask_every_record

__all__ = ["log_like_trainer", "names_main", "package_log_level", "skipping_main"]

logger = logging.getLogger(__name__)

_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
_PACKAGE = __name__.rpartition(".")[0]
_local = threading.local()
_install_lock = fork_locks.lock()
_WRAPPED = "_lerobot_dali_skips_main"


@contextlib.contextmanager
def skipping_main(callback: Any, *, main_named: bool | None = None) -> Iterator[bool]:
    """Within, this thread's spawned processes skip importing ``__main__`` if ``callback`` does not need it;
    yields whether they do skip it. They also say no warning that another process of the job said
    (:mod:`~lerobot_dali.said_once`). ``main_named``: :func:`names_main` of ``callback``, where a caller enters this
    at each submit to a pool (any may start a process) and pickles ``callback`` once."""
    skip = _installed() and not (names_main(callback) if main_named is None else main_named)
    previous = getattr(_local, "skip_main", False)
    _local.skip_main = skip
    try:
        with shared_with_children():
            yield skip
    finally:
        _local.skip_main = previous


def names_main(callback: Any) -> bool:
    """Whether ``callback``'s pickle names ``__main__`` (a class the user defined in the script), so that the
    processes that run it must import the main module (True where it does not pickle here)."""
    try:
        data = pickle.dumps(callback, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # (DALI pickles it too, and says why it cannot)
        return True
    named = b"__main__" in data
    if named:
        logger.debug("the workers' source names __main__: each worker imports the main module, as spawn does")
    return named


@functools.cache
def _installed() -> bool:
    """Wrap multiprocessing's preparation data once (it reads the flag of the thread that starts a process)."""
    with _install_lock:  # (functools.cache alone lets two threads that ask first both wrap it)
        return _install()


def _install() -> bool:
    original: Callable[[str], dict[str, Any]] | None = getattr(multiprocessing.spawn, "get_preparation_data", None)
    if original is None:  # (another Python: the workers import __main__ as before)
        logger.debug("multiprocessing.spawn has no get_preparation_data: workers import the main module")
        return False
    if getattr(original, _WRAPPED, False):
        return True

    @functools.wraps(original)
    def preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_local, "skip_main", False):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data

    setattr(preparation_data, _WRAPPED, True)
    multiprocessing.spawn.get_preparation_data = preparation_data
    return True


def package_log_level() -> int:
    """The level lerobot-dali's records pass at in this (the training) process."""
    return logging.getLogger(_PACKAGE).getEffectiveLevel()


def log_like_trainer(level: int) -> None:
    """In a worker: lerobot-dali's records at the trainer's ``level``, to stderr unless a handler exists (a script
    the worker imported set one up); every record of the worker's, any logger's, with the credentials of the URLs it
    names masked (:func:`.mask_every_record`): the worker's DEBUG lines name the paths it reads, which keep a URL's
    query where its filesystem does (``memory://b/ds?token=...``), and only a few modules' loggers masked them."""
    mask_every_record()
    package = logging.getLogger(_PACKAGE)
    package.setLevel(level)
    if not logging.getLogger().handlers and not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s (worker pid %(process)d): %(message)s"))
        package.addHandler(handler)
