"""Locks a child forked from this process (``os.fork``, multiprocessing's ``fork``) finds free.

Only the thread that forks lives on in the child: a lock another thread of the parent held at that moment stays held
there for ever, and the child's first use of it waits for ever. A child may build and read an iterator of its own, and
that takes the module-level locks (said_once's, the clip templates') and those of the objects every iterator of a
process shares (the open-file shares, the packet index cache) that a reading thread of the parent may hold at the fork.
The locks made here are made free again in the child, as Python's own are (logging's handlers', concurrent.futures'):
``_at_fork_reinit`` in an ``os.register_at_fork`` hook. The parent's locks are never touched.

A lock the forking thread itself holds at the fork (a signal handler's fork inside a ``with``, or one within a
cached_property's compute) is left as it is in the child, still that thread's: made free, the child carrying on from
the fork raised ``RuntimeError`` as it released it, and another thread of the child entered the critical section
meanwhile. So every lock here is an RLock, whose owner a child can tell; a plain ``threading.Lock`` has none (a child
forked at each line of a pass's batch that held one, carrying on, raised ``RuntimeError`` in 144 of 145). The
difference otherwise: the thread holding one may take it again (a signal handler or a finalizer run on that thread),
where a plain Lock waited for ever (a handler's checkpoint, ``state_dict()``, landing while the reading thread held the
sample order's lock).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["cached_property", "condition", "held_here", "lock", "rlock"]

T = TypeVar("T")

#: Every lock made here that is still in use: renewed in a forked child.
_made: weakref.WeakSet[Any] = weakref.WeakSet()
_guard = threading.Lock()  # (WeakSet.add from several threads)


def lock() -> threading.RLock:
    """A lock for a critical section: :func:`rlock`'s (a plain ``threading.Lock`` cannot be told apart in a child)."""
    return rlock()


def rlock() -> threading.RLock:
    """A ``threading.RLock`` that a forked child finds free, unless the forking thread holds it."""
    return _kept(threading.RLock())


def condition(over: Any = None) -> threading.Condition:
    """A ``threading.Condition`` (over ``over``, one of :func:`lock` or :func:`rlock`'s; default a new RLock) that a
    forked child finds free and without waiters: the parent's threads waiting on it at the fork took the child's
    ``notify()``, and the child's waiter was never woken (1 of 1)."""
    return _kept(threading.Condition(threading.RLock() if over is None else over))


def cached_property(compute: Callable[[Any], T]) -> functools.cached_property[T]:
    """``functools.cached_property`` whose lock a forked child finds free: Python 3.11's takes one lock per class
    attribute, held while any instance computes it (a parent thread computing an episode table's file ids at the fork
    hung the child's own iterator for ever; Python 3.12 takes none)."""
    made = functools.cached_property(compute)
    if hasattr(made, "lock"):
        made.lock = rlock()
    return made


def _kept(made: Any) -> Any:
    with _guard:
        _made.add(made)
    return made


def _free_in_child() -> None:
    _guard._at_fork_reinit()  # type: ignore[attr-defined]
    for made in list(_made):
        if not held_here(made):
            made._at_fork_reinit()  # (a Condition's also forgets its waiters)
        elif isinstance(made, threading.Condition):  # (its waiters are the parent's threads)
            made._waiters.clear()  # type: ignore[attr-defined]


def held_here(made: Any) -> bool:
    """Whether ``made`` is an RLock (or a Condition over one) this thread holds: in a forked child, whether the forking
    thread held it (the child's only thread is that thread, same ident)."""
    is_owned = getattr(made, "_is_owned", None)
    return is_owned is not None and bool(is_owned())


os.register_at_fork(after_in_child=_free_in_child)
