"""skipping_main: which spawned processes are told not to import ``__main__`` (the end-to-end run, a script
whose top level runs once and not in its workers, is in test_worker_errors)."""

from __future__ import annotations

import multiprocessing.spawn
import sys
import threading

import pytest

from lerobot_dali.worker_start import _MAIN_KEYS, skipping_main


def _imports_main(data: dict) -> bool:
    return any(key in data for key in _MAIN_KEYS)


def test_only_processes_the_calling_thread_starts_skip_main() -> None:
    assert _imports_main(multiprocessing.spawn.get_preparation_data("before"))  # (pytest's own __main__)
    other: dict = {}
    with skipping_main({"episodes": [1, 2]}) as skip:
        assert skip
        inside = multiprocessing.spawn.get_preparation_data("inside")
        thread = threading.Thread(target=lambda: other.update(multiprocessing.spawn.get_preparation_data("other")))
        thread.start()
        thread.join()
    assert not _imports_main(inside)
    assert inside["sys_path"] == multiprocessing.spawn.get_preparation_data("after")["sys_path"]  # all else kept
    assert _imports_main(other)
    assert _imports_main(multiprocessing.spawn.get_preparation_data("after"))


def test_a_source_that_names_a_class_of_the_main_module_keeps_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    class Probe:
        pass

    Probe.__module__, Probe.__qualname__ = "__main__", "LeRobotDaliProbe"
    monkeypatch.setattr(sys.modules["__main__"], "LeRobotDaliProbe", Probe, raising=False)
    with skipping_main([Probe()]) as skip:
        assert not skip
        assert _imports_main(multiprocessing.spawn.get_preparation_data("inside"))
    with skipping_main(lambda: None) as skip:  # (unpicklable here: left to DALI's own pickler, as before)
        assert not skip
