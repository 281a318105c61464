"""A source handed to worker processes through a file, not down each one's start.

DALI pickles the pipeline's source once, then starts its workers one after another, writing each one's arguments,
the pickled source among them, down the pipe that spawn starts it with. A pipe holds 64 KiB: past that, the write
waits for the worker to read, which it does only once it has imported DALI (named first, by the function the worker
runs), so each start waited for the one before. A 15,000-episode dataset's source pickles to ~0.8 MB: each of 4
workers' starts held the training process 0.4-2.1 s, one after another, where a small dataset's took 0.01 s. Given a
:class:`SourceFile` as its ``py_callback_pickler``, DALI has the source pickled (as its own pickler does) to a file
and sends each worker the file's name, which each reads once started, all of them at once. A process pool's
initializer's arguments (``lerobot-dali check``'s checker) travel alike. The files sit in a folder of the process's
own under the temporary directory (:func:`~lerobot_dali.new_folder.run_folder`): one left by a process killed during a
build (a few MB) is deleted by the next build on its host. Where the temporary directory takes no file (full, not
writable), the pickle itself is sent, as DALI's own pickler sends it: slower starts, logged, not a failed build.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .new_folder import remove_dead_run_folders, run_folder
from .said_once import warn_once

__all__ = ["PREFIX", "SourceFile", "dali_dump"]

#: How the source files' names start (in their process's folder, :data:`FOLDER`'s run folder).
PREFIX = "lerobot-dali-source-"
#: The name the processes' folders of source files are named after (``.<FOLDER>.source-<host>-<pid>-<random>``).
FOLDER = "lerobot-dali-sources"

logger = logging.getLogger(__name__)


class SourceFile:
    """DALI's ``py_callback_pickler``, or a pool's initializer's argument: :meth:`dumps` writes a source's pickle
    (by ``dump``: plain pickle, or :func:`dali_dump`) to a file of its own and gives its path; :meth:`loads`, in a
    worker, reads it back. :meth:`remove` the files once every worker has started (``Pipeline.build`` returned:
    each has loaded its source by then; a pool's processes, once it is shut down)."""

    def __init__(self, dump: Callable[[Any, IO[bytes]], None] = pickle.dump) -> None:
        self._dump = dump
        self._folder: Path | None = None

    def dumps(self, source: Any) -> bytes:
        try:
            return self._dump_to_file(source)
        except OSError as e:  # (a temporary directory that is full, or not writable: the build need not fail)
            # (the error names the folder: gettempdir() again would raise where no folder is usable)
            warn_once(logger,
                "cannot write the worker processes' source to a file in the temporary directory (%s: %s); sending "
                "it down each one's start instead, which takes longer for a large dataset: free space there or "
                "point $TMPDIR at a writable folder", type(e).__name__, e, key="worker_source.temporary_directory",
            )  # fmt: skip
            pickled = io.BytesIO()
            self._dump(source, pickled)
            return pickled.getvalue()

    def _dump_to_file(self, source: Any) -> bytes:
        if self._folder is None:
            out = Path(tempfile.gettempdir()) / FOLDER
            remove_dead_run_folders(out, "source", writer="lerobot-dali pipeline build")
            folder = run_folder(out, "source")
            folder.mkdir()
            self._folder = folder
        descriptor, path = tempfile.mkstemp(prefix=PREFIX, suffix=".pickle", dir=self._folder)
        try:
            with os.fdopen(descriptor, "wb") as file:
                self._dump(source, file)
        except BaseException:
            os.unlink(path)
            raise
        return os.fsencode(path)

    @staticmethod
    def loads(data: bytes) -> Any:
        """The source :meth:`dumps` gave: read from the file it names, or the pickle itself (a protocol 2+ pickle
        starts with its PROTO opcode, a file's absolute path with a slash)."""
        if data[:1] == pickle.PROTO:
            return pickle.loads(data)
        with open(data, "rb") as file:
            return pickle.load(file)

    def remove(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def dali_dump(source: Any, file: IO[bytes]) -> None:
    """``source`` pickled as DALI's own pickler does (local functions and lambdas by value)."""
    from nvidia.dali.reducers import DaliCallbackPickler

    DaliCallbackPickler(file, pickle.HIGHEST_PROTOCOL).dump(source)
