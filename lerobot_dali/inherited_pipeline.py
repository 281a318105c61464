"""A DALI pipeline inherited through ``os.fork``: left to the parent, never shut down in the child.

Its executor's threads and its worker pool's observer thread run in the parent alone. A child that ended normally
(``sys.exit``, the end of its script, an exception) shut the inherited pipeline down in DALI's exit handler,
``Pipeline.__del__`` or the pool's finalizer, none of which checks the process: the child hung for ever in the
executor's destructor (``pthread_cond_destroy`` of a condition the parent's threads wait on), and the pool's close()
told the parent's observer thread, down the pipe both processes hold, to stop the parent's workers. Scripted, the child
hung in 42 of 42 runs (7 ways to end it, 0 or 2 workers), and the parent's next batch failed in each of the 21 with
workers ("Sending tasks to workers failed", or WorkerProcessError). :func:`abandon` makes each of those skip the
pipeline in the child, and costs nothing in the parent.
"""

from __future__ import annotations

import ctypes
import multiprocessing.process
from typing import Any

__all__ = ["abandon"]


def abandon(pipeline: Any) -> None:
    """In a child forked from the process that built ``pipeline`` (a DALI ``Pipeline``): nothing here shuts it down
    or frees its backend, and its worker pool's close() does nothing."""
    # Pipeline._shutdown (DALI's exit handler's, __del__'s) passes a pipeline without a backend by.
    backend, pipeline._pipe = pipeline._pipe, None
    if backend is not None:
        # Its destructor is what hangs. Held by a module instead, it was freed (and hung) as the interpreter
        # finalized, after every exit handler: a reference that nothing holds is never given back.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))
    processes = getattr(getattr(pipeline, "_py_pool", None), "pool", None)
    if processes is not None:
        processes._observer = None  # (its close() then returns at once: the observer thread is the parent's)
        # Not this process's children: multiprocessing's exit handler joined each ("can only join a child process").
        for process in processes._processes:
            multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
