"""DALI pipelines inherited through ``os.fork``: left to the parent, never shut down in the child.

Their executors' threads and their worker pools' observer threads run in the parent alone. A child that ended normally
(``sys.exit``, the end of its script, an exception) shut an inherited pipeline down in DALI's exit handler,
``Pipeline.__del__`` or the pool's finalizer, none of which checks the process: the child hung for ever in the
executor's destructor (``pthread_cond_destroy`` of a condition the parent's threads wait on), and the pool's close()
told the parent's observer thread, down the pipe both processes hold, to stop the parent's workers. Scripted, the child
hung in 42 of 42 runs (7 ways to end it, 0 or 2 workers), and the parent's next batch failed in each of the 21 with
workers ("Sending tasks to workers failed", or WorkerProcessError).

Every pipeline DALI would shut down at the child's exit (its registry, ``Pipeline._pipes``) is left, not only those
of the live iterators: a fork while another thread shut one down (no longer the iterator's) hung the child in 11 of 11
scripted forks at random moments that fell there (of 40 while a thread built, rebuilt and closed iterators), and one
right after another thread's ``build()`` (not yet the iterator's) hung too, and with workers stopped the parent's. And
the parent's worker processes, also of a pool that no pipeline holds yet (being started) or still (being closed), are
no children of the child's: multiprocessing's exit handler joined each ("can only join a child process", 39 of those
40 children; a daemonic one it would have terminated). :func:`abandon_all` does both, and costs nothing in the parent.
"""

from __future__ import annotations

import ctypes
import multiprocessing.process
from typing import Any

__all__ = ["abandon_all"]


def abandon_all() -> None:
    """In a child just forked (``os.fork``): nothing here shuts down any DALI pipeline of the parent's, frees its
    backend or closes its worker pool, and multiprocessing's exit handler leaves the parent's processes alone."""
    from nvidia.dali.pipeline import Pipeline

    for reference in list(getattr(Pipeline, "_pipes", ())):  # (DALI's registry: a private set of weakrefs)
        pipeline = reference()
        if pipeline is not None:
            _abandon(pipeline)
    # None is this process's: multiprocessing empties the set itself in the children it forks, os.fork does not. (A
    # started process no longer says what it runs, so DALI's workers cannot be told from the others.)
    multiprocessing.process._children.clear()  # type: ignore[attr-defined]


def _abandon(pipeline: Any) -> None:
    # Pipeline._shutdown (DALI's exit handler's, __del__'s) passes a pipeline without a backend by.
    backend, pipeline._pipe = pipeline._pipe, None
    if backend is not None:
        # Its destructor is what hangs. Held by a module instead, it was freed (and hung) as the interpreter
        # finalized, after every exit handler: a reference that nothing holds is never given back.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))
    processes = getattr(getattr(pipeline, "_py_pool", None), "pool", None)
    if processes is not None:
        processes._observer = None  # (its close() then returns at once: the observer thread is the parent's)
