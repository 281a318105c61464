"""skipping_main: which spawned processes are told not to import ``__main__`` (the end-to-end run, a script
whose top level runs once and not in its workers, is in test_worker_errors)."""

from __future__ import annotations

import multiprocessing.spawn
import sys
import threading

import numpy as np
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


def test_the_isolated_nvdec_probe_starts_without_the_main_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with a driver the probe runs in a spawned process; here the child finds no driver."""
    from lerobot_dali import decode_route

    with skipping_main(None):  # (installs the wrapper, which the recorder below calls)
        pass
    prepared: list[dict] = []
    wrapped = multiprocessing.spawn.get_preparation_data
    monkeypatch.setattr(multiprocessing.spawn, "get_preparation_data", lambda name: _record(prepared, wrapped(name)))
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    probe = decode_route.probe_gpu({"h264": np.zeros(8, np.uint8)}, isolate=True)
    assert probe.gpu is None and probe.nvdec == {}
    assert len(prepared) == 1 and not _imports_main(prepared[0])


def _record(prepared: list[dict], data: dict) -> dict:
    prepared.append(data)
    return data
