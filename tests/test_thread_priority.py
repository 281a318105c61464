"""kept_thread_priority: the calling thread, and the threads started in the block, get their scheduling back."""

from __future__ import annotations

import os
import threading

from lerobot_dali.thread_priority import kept_thread_priority
from tests.conftest import thread_policies


def _native_id(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return thread.native_id


def test_the_caller_and_the_threads_it_started_get_their_policy_back(realtime_allowed: None) -> None:
    """As SVT-AV1 does when opened by root: the caller is raised, and threads it starts next inherit that. A thread
    that ran before the block and was raised within it is another's to set: it stays as it is."""
    caller = threading.get_native_id()
    before = thread_policies()[caller]
    release = threading.Event()
    older, newer = threading.Thread(target=release.wait), threading.Thread(target=release.wait)
    older.start()
    try:
        with kept_thread_priority():
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(7))
            newer.start()
            os.sched_setscheduler(_native_id(older), os.SCHED_FIFO, os.sched_param(7))
            assert thread_policies()[_native_id(newer)] == (os.SCHED_FIFO, 7)
        after = thread_policies()
        assert after[caller] == before and after[_native_id(newer)] == before
        assert after[_native_id(older)] == (os.SCHED_FIFO, 7)
    finally:
        os.sched_setscheduler(_native_id(older), before[0], os.sched_param(before[1]))
        release.set()
        older.join()
        if newer.is_alive():
            newer.join()
