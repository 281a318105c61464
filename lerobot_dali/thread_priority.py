"""Give back the scheduling policy that opening an encoder took from the calling thread.

SVT-AV1 (``libsvtav1``, PyAV's AV1 encoder), run as root, switches the thread that opens it to real-time
``SCHED_FIFO`` priority 99 (``svt_av1_enc_init_handle`` calls ``pthread_setschedparam`` on it, 4.1.0 as PyAV 18
bundles it) and never switches it back. The encoder's threads, started next, inherit that, as does every thread or
process the caller starts afterwards. FIFO threads of one priority take turns only when one blocks, and ordinary
processes share the 5% of each CPU that the kernel holds back from real-time ones. Measured on a 2-CPU machine as
root, both processes on one CPU, beside a process that had encoded one AV1 clip and went on computing: a
``make-dataset`` of 0.6 s alone had not finished after 50 s, stuck in ``svt_av1_enc_init_handle`` until that process
ended (4.3 s with the policy given back); an ordinary process got 5% of the CPU they shared (half, given back). Such a
process is a ``make-dataset`` or ``reencode`` run as root (in a container, say), a test session from its first AV1
fixture on, or a trainer that generated its dataset first. During the open itself the thread is still raised: beside
a process left real-time by another program (or an older lerobot-dali) it waits there as before (measured: 32 s,
until that process ended).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

__all__ = ["kept_thread_priority"]

logger = logging.getLogger(__name__)

_TASKS = "/proc/self/task"


def _policy(thread_id: int) -> tuple[int, int] | None:
    """(policy, priority) of a thread of this process; None once it has ended."""
    try:
        return os.sched_getscheduler(thread_id), os.sched_getparam(thread_id).sched_priority
    except OSError:
        return None


def _thread_ids() -> set[int]:
    try:
        return {int(name) for name in os.listdir(_TASKS)}
    except OSError:  # (no /proc)
        return set()


@contextlib.contextmanager
def kept_thread_priority() -> Iterator[None]:
    """On leaving the block, the calling thread, and the threads started within it that share the calling thread's
    new policy, get the policy the calling thread had on entering (Linux; elsewhere nothing is done)."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    caller = threading.get_native_id()
    before = _policy(caller)
    existing = _thread_ids()
    try:
        yield
    finally:
        raised = _policy(caller)
        if before is not None and raised is not None and raised != before:
            policy, priority = before
            changed = [t for t in (_thread_ids() - existing) | {caller} if _policy(t) == raised]
            for thread_id in changed:
                with contextlib.suppress(OSError):  # (a thread that ended meanwhile)
                    os.sched_setscheduler(thread_id, policy, os.sched_param(priority))
            logger.debug(
                "scheduling policy %s of %d thread(s) set back to %s (an encoder had raised it)", raised,
                len(changed), before,
            )  # fmt: skip
