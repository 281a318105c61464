"""skipping_main: which spawned processes are told not to import ``__main__`` (the end-to-end run, a script
whose top level runs once and not in its workers, is in test_worker_errors); what a worker imports before its first
batch."""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

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


#: What a DALI worker runs: DALI's worker module (the spawned process's target), then the source it is sent, asked
#: for its first batch. Prints the heavy modules it loaded that it has no use for.
_WORKER_START = """
import pickle, sys
import nvidia.dali._multiproc.worker
source = pickle.loads(open(sys.argv[1], "rb").read())
class BatchInfo:
    epoch_idx = iteration = 0
source(BatchInfo())
heavy = ("torch", "accelerate", "pandas", "datasets", "huggingface_hub", "aiohttp", "s3fs", "gcsfs")
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_a_worker_reaches_its_first_batch_without_torch_accelerate_or_pandas(make_ds, tmp_path: Path) -> None:
    """Each worker pays its own imports before its first sample, 8 ranks of N workers a node: torch alone would add
    about a second of CPU to each. VP9 here is decoded by DALI, so the worker never looks for torchcodec either (which
    imports torch where it is installed); a local dataset needs none of the remote filesystems' libraries."""
    from lerobot_dali.batch_source import BatchSource
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", size=(64, 64))
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0, shuffle=False)
    next(iter(it))  # (builds the workers' spec)
    source = BatchSource(it._spec)
    it.close()
    pickled = tmp_path / "source.pickle"
    pickled.write_bytes(pickle.dumps(source))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_START, str(pickled)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]"]


def test_a_worker_masks_the_credentials_every_logger_names(tmp_path: Path) -> None:
    """A spawned worker set up by log_like_trainer, the dataset's location unpickled there, over a filesystem that keeps
    the URL's query in its paths (``memory://b/ds?token=...``, its token holding a '/'): its DEBUG lines named it, any
    module's but the few that masked their own (the clips' and packet indexes': 42 of an epoch's, one worker), and
    fsspec's and other libraries' where the worker's main module set up the root logger (4 of 4 here); 0 now, the
    file's path after the token kept."""
    from lerobot_dali.dataset_location import resolve_location

    location = resolve_location("memory://bucket/ds?a=1&token=S3CRhead/T41Ltail")
    (tmp_path / "location.pkl").write_bytes(pickle.dumps(location))
    child = (
        "import logging, pickle, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format='%(name)s: %(message)s')\n"
        "from lerobot_dali.worker_start import log_like_trainer\n"
        f"location = pickle.loads(open({str(tmp_path / 'location.pkl')!r}, 'rb').read())\n"
        "log_like_trainer(logging.DEBUG)\n"
        "for name in ('lerobot_dali.clips', 'fsspec.memoryfs', 'aiohttp.client', 'botocore.endpoint'):\n"
        "    logging.getLogger(name).debug('read %s', location.path('videos/f.mp4'))\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and "S3CR" not in done.stdout + done.stderr and "T41L" not in done.stdout + done.stderr
    assert all(line.endswith("read /bucket/ds?a=1&token=***/videos/f.mp4") for line in lines), lines
