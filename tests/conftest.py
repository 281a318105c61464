"""Shared fixtures: small generated datasets and marker videos (cached per session), the real datasets in ../shared,
pytest's base folder over HTTP."""

from __future__ import annotations

import builtins
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: ../shared/datasets beside the checkout; LEROBOT_DALI_SHARED_DATASETS elsewhere (a GPU machine: .ci/gpu-unpack).
SHARED_DATASETS = Path(
    os.environ.get("LEROBOT_DALI_SHARED_DATASETS") or Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
)


def shared_dataset(name: str) -> Path:
    """Path of a real dataset in ../shared/datasets, skipping the test where the folder is absent."""
    path = SHARED_DATASETS / name
    if not path.is_dir():
        pytest.skip(f"real dataset {path} is not present")
    return path


def refuse_opening(monkeypatch: pytest.MonkeyPatch, refused: Path) -> None:
    """``open`` of ``refused`` fails as the system fails it for a user without read permission (tests run as root,
    whom ``chmod 000`` does not stop); fsspec's local files, and so pyarrow's and PyAV's reads through them, open so."""
    real_open, target = builtins.open, os.path.realpath(refused)

    def opening(file: object, *args: object, **kwargs: object) -> object:
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", opening)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``torchcodec`` decode with the real torchcodec: skipped where it does not load (CI's CPU build of
    torch cannot load it), run by ``.ci/lerobot-parity`` in its venv, where it does."""
    marked = [item for item in items if item.get_closest_marker("torchcodec")]
    if not marked:
        return
    from lerobot_dali.cpu_backends import torchcodec_unavailable

    why_not = torchcodec_unavailable()
    if why_not is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=f"needs torchcodec: {why_not}"))


@pytest.fixture(autouse=True)
def _isolated_cache_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches (prefetch ranges, packet indexes) go to a fresh folder per test, never the user's ~/.cache."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path_factory.mktemp("cache_root")))


@pytest.fixture(autouse=True)
def _warnings_said_afresh(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's processes say their warnings once (said_once), whatever an earlier test in this process said."""
    from lerobot_dali import said_once

    monkeypatch.setattr(said_once, "_said", set())
    monkeypatch.setenv(said_once.SAID_ENV, str(tmp_path_factory.mktemp("said")))


@pytest.fixture
def no_credential_known(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The credentials this process knows (url_secrets._known) and its log record factory, as they were after: a test
    that tells it one leaves none known to the next."""
    from lerobot_dali import url_secrets

    monkeypatch.setattr(url_secrets, "_known", (), raising=False)
    factory = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(factory)


@pytest.fixture(autouse=True)
def _open_file_shares_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's caches share the open-file limit among themselves, whatever an earlier test left unclosed."""
    from lerobot_dali import open_files

    monkeypatch.setattr(open_files, "DECODERS", open_files.FileShare(open_files.DECODER_SHARE))
    monkeypatch.setattr(open_files, "DATA_FILES", open_files.FileShare(open_files.DATA_FILE_SHARE))


@pytest.fixture(autouse=True)
def _scheduling_kept() -> Iterator[None]:
    """Each test ends with this thread's scheduling policy as it began: a test that opens libsvtav1 itself, as root,
    left the rest of the session real-time (lerobot_dali.thread_priority), and the machine's other processes with 5%
    of the CPUs while it computed."""
    from lerobot_dali.thread_priority import kept_thread_priority

    with kept_thread_priority():
        yield


@pytest.fixture
def realtime_allowed() -> Iterator[None]:
    """Skip unless this process may switch a thread to real-time priority (root with CAP_SYS_NICE, on Linux), the one
    case where SVT-AV1 does. The test starts with the calling thread at ``SCHED_OTHER`` (another fixture's encode may
    have raised it), and the thread's policy of before is set back afterwards, whatever the test left."""
    if not hasattr(os, "sched_setscheduler") or os.geteuid() != 0:
        pytest.skip("SVT-AV1 raises a thread's priority only when run as root, on Linux")
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        pytest.skip("this process may not use real-time priority (no CAP_SYS_NICE)")
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def thread_policies() -> dict[int, tuple[int, int]]:
    """(policy, priority) of each thread of this process, by thread id."""
    from lerobot_dali.thread_priority import _policy, _thread_ids

    return {thread: policy for thread in _thread_ids() if (policy := _policy(thread)) is not None}


@pytest.fixture(scope="session")
def make_ds(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Generate (once per session and argument set) a dataset with ``lerobot_dali.generate.make_dataset``."""
    from lerobot_dali.generate import make_dataset

    cache: dict[tuple[tuple[str, Any], ...], Path] = {}

    def factory(**kwargs: Any) -> Path:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("ds") / "dataset"
            cache[key] = make_dataset(out, **kwargs)
        return cache[key]

    return factory


@pytest.fixture(scope="session")
def marker_video(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``marker_video(codec, gop, *, height=64, width=96) -> Path``: a marker video (see ``tests.video_fixtures``),
    encoded the first time a test asks for it and shared by the whole session. Tests must not modify it."""
    from tests.video_fixtures import MARKER_HEIGHT, MARKER_WIDTH, encode_marker_video

    cache: dict[tuple[str, int, int, int], Path] = {}

    def factory(codec: str, gop: int, *, height: int = MARKER_HEIGHT, width: int = MARKER_WIDTH) -> Path:
        key = (codec, gop, height, width)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"videos_{height}x{width}") / f"{codec}_g{gop}.mp4"  # tests match the name
            cache[key] = encode_marker_video(path, codec, gop, height=height, width=width)
        return cache[key]

    return factory


@pytest.fixture
def copy_ds(tmp_path: Path) -> Callable[[Path], Path]:
    """A writable copy of a dataset, for tests that damage it on purpose (``name``: the copy's folder's, for several
    copies of one dataset; default the source's)."""

    def copy(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copytree(src, dst)
        for p in dst.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst

    return copy


@pytest.fixture
def process_starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The arguments of each process started while the test runs, in order (each is started as before)."""
    import multiprocessing.process

    started: list[tuple[Any, ...]] = []
    real_start = multiprocessing.process.BaseProcess.start

    def start(process: multiprocessing.process.BaseProcess) -> None:
        started.append(process._args)  # type: ignore[attr-defined]
        real_start(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    return started


@pytest.fixture(scope="module")
def basetemp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """pytest's base folder over HTTP (a ``tests.http_server.FolderServer``): every test's copies and the session's
    generated datasets (``make_ds`` and ``copy_ds`` write under it)."""
    from tests.http_server import serve_folder

    with serve_folder(tmp_path_factory.getbasetemp()) as running:
        yield running
