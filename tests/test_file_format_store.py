"""Building an iterator reads every local video file's header once per cache folder (:mod:`.file_format_store`): a
rebuild reads only the files changed since, and the survey covers up to 100,000 files a camera, as the data files'
check does (:mod:`~lerobot_dali.checked_files`)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lerobot_dali import DALILeRobotIterator, camera_codecs, file_format_store, open_dataset
from lerobot_dali.camera_codecs import FileFormat
from lerobot_dali.errors import SchemaMismatchError
from lerobot_dali.file_format_store import STAMPS_PER_FILE, FileFormatStore
from lerobot_dali.file_stamps import stamp_from_stat
from tests.other_host import on_another_host
from tests.process_tree import reports_of_processes_at_once

CAM = "observation.images.cam0"
SPEC = dict(episodes=6, frames_per_episode=4, cameras=1, fps=10, codec="h264", gop=2, size=(64, 96), version="v2.1")
FORMAT = FileFormat("h264", 64, 96, "yuv420p", (2, False), 10.0, 0.4)


def _video(root: Path, episode: int) -> Path:
    return root / f"videos/chunk-000/{CAM}/episode_{episode:06d}.mp4"


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every header the survey reads, by path."""
    reads: list[str] = []
    real = camera_codecs.read_file_format

    def counting(reader: Any, path: str) -> FileFormat:
        reads.append(path)
        return real(reader, path)

    monkeypatch.setattr(camera_codecs, "read_file_format", counting)
    return reads


def _build(root: Path) -> None:
    DALILeRobotIterator(open_dataset(root), batch_size=2, device="cpu", num_workers=0).close()


def test_a_rebuild_reads_no_header_and_a_file_changed_since_is_read_again(make_ds, copy_ds, header_reads) -> None:
    """Before, every build (every rank of every run) read all headers again: 2 x 6 here. A file re-encoded at
    another size after the first build is still refused by the second, which reads its header alone."""
    root = copy_ds(make_ds(**SPEC))
    _build(root)
    assert sorted(header_reads) == [str(_video(root, e)) for e in range(6)]
    _build(root)
    assert len(header_reads) == 6  # none more
    shutil.copyfile(_video(make_ds(**{**SPEC, "size": (96, 96)}), 3), _video(root, 3))
    with pytest.raises(SchemaMismatchError, match=r"episode_000003\.mp4 \(episode 3, .*\) is h264 96x96 \(HxW\)"):
        _build(root)
    assert header_reads[6:] == [str(_video(root, 3))]


def test_a_camera_past_the_data_files_bound_has_every_file_surveyed(make_ds, copy_ds, monkeypatch) -> None:
    """Past the data files' bound (20,000 files then, here 2) only the camera's first file was read, so a file of
    another size failed when a batch reached it, maybe hours into training; with the headers kept on disk the bound is
    100,000 files a camera, and a data file check skipped past its own bound leaves the survey whole."""
    from lerobot_dali import episode_data_files

    root = copy_ds(make_ds(**SPEC))
    shutil.copyfile(_video(make_ds(**{**SPEC, "size": (96, 96)}), 4), _video(root, 4))
    monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 2)
    with pytest.raises(SchemaMismatchError, match=r"episode_000004\.mp4 \(episode 4, .*\) is h264 96x96"):
        _build(root)


def test_a_long_survey_logs_its_progress(make_ds, copy_ds, monkeypatch, caplog) -> None:
    from lerobot_dali import concurrent_calls

    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0)
    root = copy_ds(make_ds(**SPEC))
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        _build(root)
    assert f"lerobot-dali: camera {CAM}'s video headers: 6/6 files" in caplog.text


def test_the_cameras_surveys_show_their_progress_once_they_have_taken_the_delay_in_all(
    make_ds, monkeypatch, caplog
) -> None:
    """Each camera's survey counted the delay afresh: 3 cameras of 150 files each (1.2 s apiece, cold) were 3.6 s of
    silence. Here each takes 0.5 s, under the delay (1.2 s), and the three together over it: the last one shows."""
    from lerobot_dali import concurrent_calls

    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 1.2)
    real = camera_codecs.read_file_format
    monkeypatch.setattr(camera_codecs, "read_file_format", lambda reader, path: time.sleep(0.5) or real(reader, path))
    root = make_ds(**{**SPEC, "episodes": 2, "cameras": 3})
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        _build(root)
    lines = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert "lerobot-dali: camera observation.images.cam2's video headers: 2/2 files" in lines, lines
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        _build(root)  # (warm: every header kept)
    assert caplog.records == []


def _checksummed(body: bytes) -> bytes:
    """An entry of ``body`` whose checksum holds (written by another version, or by hand)."""
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _paths(tmp_path: Path, n: int = 5) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"v{i}.mp4"
        path.write_bytes(b"x" * (i + 1))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # (a write cut short)
        lambda raw: raw.replace(b"h264", b"h265"),  # (its checksum disagrees)
        lambda raw: b"\x00" * len(raw),  # (a crash before the data reached the disk)
        lambda raw: b"5" * 64 + b"\n{}",  # (no checksum at all)
        lambda raw: _checksummed(b'{"formats": [["h264", "64", 96, null, 2, false, 10.0, 0.4]], "files": {}}'),
        lambda raw: _checksummed(b'{"formats": [["h264", 64, 96, null, 2, false, "10", 0.4]], "files": {}}'),
        lambda raw: _checksummed(b'{"formats": [["h264", 64, 96, null, 2, false]], "files": {}}'),
        lambda raw: _checksummed(b'{"formats": [], "files": {}}'),
        lambda raw: _checksummed(
            b'{"formats": [["h264", 64, 96, null, 2, false, 10.0, 0.4]], "files": [["v.mp4", -1, "", 0]]}'
        ),
        lambda raw: _checksummed(b"[]"),
    ],
    ids=[
        "truncated",
        "altered",
        "zeroed",
        "garbage",
        "a-height-in-text",
        "a-rate-in-text",
        "format-2-rows",
        "files-as-an-object",
        "a-negative-size",
        "a-list",
    ],
)
def test_a_damaged_entry_is_deleted_read_again_and_rewritten(tmp_path: Path, caplog, damage) -> None:
    store, paths, reads = FileFormatStore(tmp_path / "store"), _paths(tmp_path), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [FORMAT] * len(missing)

    assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    entry = store.entry_for("ds", CAM)
    entry.write_bytes(damage(entry.read_bytes()))
    with caplog.at_level(logging.WARNING):
        assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    assert "video file header cache" in caplog.text and "is unreadable" in caplog.text
    assert reads == paths * 2
    assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5 and len(reads) == 10  # (rewritten whole)


def test_an_entry_holds_each_files_stat_stamp_and_format_index(tmp_path: Path) -> None:
    """The layout entries already on disk hold (the store compares stamps as plain values, no object a file): one
    written by hand from each file's :func:`~lerobot_dali.file_stamps.stamp_from_stat` is loaded with no header read,
    and a file changed since is read again."""
    store, paths = FileFormatStore(tmp_path / "store"), _paths(tmp_path, 2)
    stamps = [stamp_from_stat(os.stat(path)) for path in paths]
    files = [[path, stamp.size, stamp.version, 0] for path, stamp in zip(paths, stamps, strict=True)]
    body = json.dumps({"formats": [["h264", 64, 96, "yuv420p", 2, False, 10.0, 0.4]], "files": files}).encode()
    entry = store.entry_for("ds", CAM)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(_checksummed(body))
    assert store.formats("ds", CAM, paths, lambda missing: [None] * len(missing)) == [FORMAT, FORMAT]
    Path(paths[1]).write_bytes(b"zz")  # (its size kept: its ctime and mtime change)
    assert store.formats("ds", CAM, paths, lambda missing: [None] * len(missing)) == [FORMAT, None]


def test_hosts_sharing_the_cache_and_the_files_read_each_header_once(tmp_path: Path, monkeypatch) -> None:
    """On a cluster the cache ($HOME) and the dataset are often one NFS share that each node mounts with a device number
    of its own. Stamps held the device: each host found every file of the other's entry changed, read all headers
    and wrote the entry over, so every build of either host read every header again (here 5 a build, 15 in 3)."""
    store, paths, reads = FileFormatStore(tmp_path / "store"), _paths(tmp_path), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [FORMAT] * len(missing)

    assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    entry = store.entry_for("ds", CAM).stat().st_ino
    with on_another_host(monkeypatch, tmp_path):
        assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    assert reads == paths and store.entry_for("ds", CAM).stat().st_ino == entry  # (never written again)


def test_hosts_with_their_own_copies_at_the_same_paths_read_each_header_once(tmp_path: Path, monkeypatch) -> None:
    """Nodes that copy a dataset to a local disk at one path, their cache in the shared $HOME: the files differ (other
    stamps) but the entry is one per dataset path and camera, so each host read every header again and wrote the
    entry over with its own, on every build in turn (5 a build, 20 in 4 here). An entry keeps each host's."""
    store, paths, reads = FileFormatStore(tmp_path / "store"), _paths(tmp_path), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [FORMAT] * len(missing)

    for _ in range(2):
        assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
        with on_another_host(monkeypatch, tmp_path, own_copy=True):
            assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    assert reads == paths * 2  # (each host's once)


def test_an_entry_keeps_each_files_last_stamps(tmp_path: Path, monkeypatch) -> None:
    """17 hosts with a copy each: the 16 last to survey find theirs, the first reads its headers again."""
    store, paths, reads = FileFormatStore(tmp_path / "store"), _paths(tmp_path, 2), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [FORMAT] * len(missing)

    for host in [*range(17), *range(1, 17)]:
        with on_another_host(monkeypatch, tmp_path, own_copy=True, host=host):
            assert store.formats("ds", CAM, paths, read) == [FORMAT, FORMAT]
    assert len(reads) == 17 * 2
    with on_another_host(monkeypatch, tmp_path, own_copy=True, host=0):
        assert store.formats("ds", CAM, paths, read) == [FORMAT, FORMAT]
    assert len(reads) == 18 * 2
    rows = json.loads(store.entry_for("ds", CAM).read_bytes().partition(b"\n")[2])["files"]
    assert len(rows) == 2 * STAMPS_PER_FILE


def test_an_entry_of_the_version_before_is_left_to_it(tmp_path: Path) -> None:
    """Entries of format 1 hold stamps with the device: a version of each kind sharing the folder found the other's
    entry all stale, read every header and wrote it over, each build in turn. Format 2 keeps an entry of its own."""
    store, paths = FileFormatStore(tmp_path / "store"), _paths(tmp_path, 2)
    digest = hashlib.sha256(json.dumps([1, "ds", CAM]).encode()).hexdigest()
    old = tmp_path / "store" / digest[:2] / f"{digest}.formats"
    old.parent.mkdir(parents=True)
    files = {path: [os.stat(path).st_size, f"stat:1:{os.stat(path).st_ino}:0:0", 0] for path in paths}
    old.write_bytes(
        _checksummed(json.dumps({"formats": [["h264", 64, 96, "yuv420p", 2, False]], "files": files}).encode())
    )
    before = old.read_bytes()
    assert store.formats("ds", CAM, paths, lambda missing: [FORMAT] * len(missing)) == [FORMAT, FORMAT]
    assert old.read_bytes() == before and store.entry_for("ds", CAM) != old


def test_files_that_do_not_open_are_not_kept_and_other_files_entries_stay(tmp_path: Path) -> None:
    store, paths, reads = FileFormatStore(tmp_path / "store"), _paths(tmp_path), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [None if path.endswith("v1.mp4") else FORMAT for path in missing]

    assert store.formats("ds", CAM, paths, read) == [FORMAT, None, FORMAT, FORMAT, FORMAT]
    assert store.formats("ds", CAM, paths[:2], read) == [FORMAT, None]  # (a subset of the episodes)
    assert store.formats("ds", CAM, paths, read) == [FORMAT, None, FORMAT, FORMAT, FORMAT]
    assert reads == [*paths, paths[1], paths[1]]


def _survey_at_once(store_dir: str, paths: list[str], barrier: Any, results: Any) -> None:
    """A rank of a node building its iterator the moment another does: reports the headers it read."""
    reads: list[str] = []

    def slow_read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        time.sleep(0.5)  # (thousands of headers: the other process misses the entry meanwhile)
        return [FORMAT] * len(missing)

    barrier.wait(timeout=60)
    formats = FileFormatStore(store_dir).formats("ds", CAM, paths, slow_read)
    results.put((len(reads), formats == [FORMAT] * len(paths)))


@pytest.mark.parametrize("stale", [False, True], ids=["no-entry", "stale-entry"])
def test_two_processes_surveying_at_once_keep_one_whole_entry(tmp_path: Path, stale: bool) -> None:
    """Without an entry, one process reads the headers and the other waits for its lock and loads them; where the
    entry is stale (every file changed since), both read and both write it: it stays whole either way."""
    paths, store_dir = _paths(tmp_path), str(tmp_path / "store")
    if stale:
        FileFormatStore(store_dir).formats("ds", CAM, paths, lambda missing: [FORMAT] * len(missing))
        for path in paths:
            Path(path).write_bytes(Path(path).read_bytes() + b"y")
    reports = reports_of_processes_at_once(_survey_at_once, (store_dir, paths))
    assert all(whole for _, whole in reports)
    if not stale:
        assert sorted(reads for reads, _ in reports) == [0, 5], reports
    assert FileFormatStore(store_dir).formats("ds", CAM, paths, lambda missing: []) == [FORMAT] * 5  # (none read)
    assert [p.suffix for p in Path(store_dir).rglob("*") if p.is_file()] == [".formats"]  # (no lock file left)


@pytest.mark.parametrize("locks", [True, False], ids=["flock", "no-locks"])
def test_processes_adding_other_files_at_once_each_keep_theirs(tmp_path: Path, monkeypatch, caplog, locks) -> None:
    """Processes reading other files into one existing entry at once (ranks of other ``episodes=`` selections) each
    loaded it again, merged their files in and wrote it: the last to write dropped what another wrote meanwhile (8
    processes of 5 files each: 20-35 of their 40 headers lost in 5 of 5 runs). They now merge one at a time, under
    the lock beside the entry; where the filesystem takes no locks (NFS without its lock daemon), by renames (there
    20-35 of 41 lost in 10 of 10 runs, said nowhere; none now, said once)."""
    if not locks:
        monkeypatch.setattr(fcntl, "flock", _no_locks)
    store, (first, mine, theirs) = FileFormatStore(tmp_path / "store"), _paths(tmp_path, 3)
    store.formats("ds", CAM, [first], lambda missing: [FORMAT] * len(missing))
    plain = file_format_store._with_newest
    other = threading.Thread(target=lambda: store.formats("ds", CAM, [theirs], lambda missing: [FORMAT]))

    def merge_as_another_process_adds(kept: Any, new: Any) -> Any:
        if threading.current_thread() is threading.main_thread() and other.ident is None:
            other.start()  # (another process's merge, between this one's load and its write)
            other.join(timeout=1.0)  # (at once, where nothing holds it back; under the lock it waits for this write)
        return plain(kept, new)

    monkeypatch.setattr(file_format_store, "_with_newest", merge_as_another_process_adds)
    with caplog.at_level(logging.INFO, logger="lerobot_dali"):
        store.formats("ds", CAM, [mine], lambda missing: [FORMAT])
    other.join()
    reads: list[str] = []
    read_again = store.formats("ds", CAM, [first, mine, theirs], lambda missing: reads.extend(missing) or [FORMAT])
    assert read_again == [FORMAT] * 3 and reads == []
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file() and p.parent != tmp_path] == [".formats"]
    said = [r.getMessage() for r in caplog.records if "takes no file locks" in r.getMessage()]
    assert len(said) == (0 if locks else 1) and all(str(store.directory) in line for line in said), said


def _no_locks(fd: int, operation: int) -> None:
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))


def test_a_store_that_takes_no_writes_reads_every_time_with_one_warning(tmp_path: Path, caplog) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_bytes(b"")
    store, paths, reads = FileFormatStore(blocked), _paths(tmp_path), []

    def read(missing: list[str]) -> list[FileFormat | None]:
        reads.extend(missing)
        return [FORMAT] * len(missing)

    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert store.formats("ds", CAM, paths, read) == [FORMAT] * 5
    assert reads == paths * 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "every build reads them again: make it a writable folder" in warned[0], warned
