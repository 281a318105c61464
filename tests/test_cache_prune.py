"""Caches under the cache root drop what no run has used for LEROBOT_DALI_CACHE_DAYS days; used entries stay."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lerobot_dali.cache_dirs import (
    CACHE_DAYS_ENV,
    LOCK_FILES,
    EntryStands,
    atomic_file,
    cache_root,
    checked_body,
    checksummed,
    delete_if_unchanged,
    newest_stamps,
    private_cache_roots,
    prune_unused_files,
    try_flock,
    wait_for_entry_lock,
    write_checksummed,
    write_whole,
)
from lerobot_dali.file_stamps import FileStamp
from lerobot_dali.new_folder import host_name
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.packet_index_store import PacketIndexStore
from lerobot_dali.range_cache import ByteRange, CacheBusyError, RangeCache, prune_unused_slots
from tests.foreign_folder import not_writable
from tests.video_fixtures import MarkerVideo

DAY = 86400.0


def _aged(path: Path, days: float) -> Path:
    then = time.time() - days * DAY
    os.utime(path, (then, then))
    return path


def _file(path: Path, days: float, size: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(size))
    return _aged(path, days)


def _write(entry: Path, data: bytes, *, exclusive: bool) -> None:
    """``data`` written to ``entry`` by :func:`atomic_file`, as the stores write theirs."""
    with atomic_file(entry, prefix=".entry.json.", exclusive=exclusive) as out:
        out.write(data)


def test_files_unused_for_the_set_days_go_and_a_folder_is_swept_once_a_day(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    stale, fresh = _file(tmp_path / "ab" / "old.npz", 8, 300_000), _file(tmp_path / "cd" / "new.npz", 6)
    other = _file(tmp_path / "ab" / "old.txt", 8)  # not the pattern's
    with caplog.at_level(logging.INFO, logger="lerobot_dali.cache_dirs"):
        prune_unused_files(tmp_path, "*/*.npz")
    assert not stale.exists() and fresh.exists() and other.exists()
    assert caplog.messages == [f"{tmp_path}: deleted 1 cache file(s), 0.3 MB, unused for 7 days"]
    later = _file(tmp_path / "ab" / "later.npz", 8)
    prune_unused_files(tmp_path, "*/*.npz")  # swept less than a day ago
    assert later.exists()
    _aged(tmp_path / ".swept", 1.01)
    prune_unused_files(tmp_path, "*/*.npz")
    assert not later.exists()


def test_a_folder_is_due_a_sweep_a_full_day_after_its_last(tmp_path: Path, monkeypatch) -> None:
    """Not a second before :data:`~lerobot_dali.cache_dirs.PRUNE_EVERY_S` (a day) has passed since the last sweep's
    marker; from then on, and the stale cutoff is the set days before now."""
    import lerobot_dali.cache_dirs as cache_dirs

    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    marker = _file(tmp_path / ".swept", 0)
    os.utime(marker, (1_000_000, 1_000_000))
    now = 1_000_000 + 86_400.0
    monkeypatch.setattr(cache_dirs, "time", SimpleNamespace(time=lambda: now))
    now -= 1
    assert cache_dirs.sweep_cutoff(tmp_path) is None
    now += 1
    assert cache_dirs.sweep_cutoff(tmp_path) == now - 7 * 86_400


def test_lock_files_left_beside_entries_are_swept_with_them(tmp_path: Path, monkeypatch) -> None:
    """A lock file stays where its holder stored nothing (a failed build, a killed process) or, in the column store
    until now, after every conversion: the sweeps deleted the entries alone, so those stayed for good."""
    from lerobot_dali.column_store import ColumnStore
    from lerobot_dali.row_count_store import Footer, cached_footers

    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    stores = {
        "columns": (ColumnStore(tmp_path / "columns").prune_unused, "arrow"),
        "packet_index": (PacketIndexStore(tmp_path / "packet_index").prune_unused, "pidx"),
    }
    for name, (prune, suffix) in stores.items():
        stale_lock = _file(tmp_path / name / "ab" / "old.lock", 8, 0)
        fresh_lock = _file(tmp_path / name / "cd" / "new.lock", 1, 0)
        stale = _file(tmp_path / name / "ab" / f"old.{suffix}", 8)
        prune()
        assert not stale.exists() and not stale_lock.exists() and fresh_lock.exists(), name
    stale_lock = _file(tmp_path / "row_counts" / "ab" / "old.lock", 8, 0)
    stamps = {"a.parquet": FileStamp(10, "etag:a")}
    read = lambda paths: [Footer(1, ("a",))] * len(paths)  # noqa: E731
    cached_footers(stamps, ["a.parquet"], read, directory=tmp_path / "row_counts")
    assert not list((tmp_path / "row_counts").rglob("*.lock"))


def test_temporary_files_left_by_killed_writers_are_swept(tmp_path: Path, monkeypatch) -> None:
    """A process killed mid-write leaves its temporary file (``.<entry>.<random>.tmp``, a whole Arrow copy of a data
    file in the column store): the sweeps matched stored entries and lock files alone, so those stayed for good."""
    from lerobot_dali.column_store import ColumnStore
    from lerobot_dali.row_count_store import Footer, cached_footers

    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    for name, prune in {
        "columns": ColumnStore(tmp_path / "columns").prune_unused,
        "packet_index": PacketIndexStore(tmp_path / "packet_index").prune_unused,
    }.items():
        stale = _file(tmp_path / name / "ab" / ".ab12.x7k2.tmp", 8, 1000)
        fresh = _file(tmp_path / name / "cd" / ".cd34.q9z1.tmp", 1, 1000)  # (maybe still being written)
        prune()
        assert not stale.exists() and fresh.exists(), name
    stale = _file(tmp_path / "row_counts" / "ab" / ".rowsx7k2.tmp", 8)
    stamps = {"a.parquet": FileStamp(10, "etag:a")}
    cached_footers(stamps, ["a.parquet"], lambda paths: [Footer(1, ("a",))], directory=tmp_path / "row_counts")
    assert not stale.exists()


def test_a_held_lock_file_is_not_swept_however_old(tmp_path: Path, monkeypatch) -> None:
    """A lock file's mtime is its creation (taking it writes nothing): a process indexing a video under a lock file
    older than the set days had it deleted by a sweep, and the next process made a new one and indexed the same
    video at the same time."""
    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    held_path = _file(tmp_path / "ab" / "held.lock", 8, 0)
    free_path = _file(tmp_path / "ab" / "free.lock", 8, 0)
    held = try_flock(held_path)
    assert held is not None
    with held:
        prune_unused_files(tmp_path, LOCK_FILES)
        assert held_path.exists() and not free_path.exists()
        assert try_flock(held_path) is None  # a second process still waits for the holder


def test_a_lock_taken_on_a_file_deleted_meanwhile_is_not_held(tmp_path: Path, monkeypatch) -> None:
    """A process that opened a lock file just before a sweep (or the holder that stored the entry) deleted it, and
    locked it just after, held a lock on a file no other process can open: the next one made a new lock file and
    took that too."""
    import fcntl

    from lerobot_dali import cache_dirs

    path = tmp_path / "ab" / "entry.lock"
    path.parent.mkdir()
    real_flock = fcntl.flock

    def flock_after_a_sweep(fd: int, operation: int) -> None:
        path.unlink(missing_ok=True)
        real_flock(fd, operation)

    monkeypatch.setattr(cache_dirs.fcntl, "flock", flock_after_a_sweep)
    assert try_flock(path) is None
    monkeypatch.setattr(cache_dirs.fcntl, "flock", real_flock)
    lock = try_flock(path)
    assert lock is not None and path.exists() and os.fstat(lock.fileno()).st_ino == path.stat().st_ino
    lock.close()


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS], ids=["nfs-without-lock-daemon", "lustre-noflock"])
def test_lock_files_on_a_filesystem_without_locks_are_swept(tmp_path: Path, monkeypatch, code: int) -> None:
    """NFS without its lock daemon refuses ``flock`` (ENOLCK), Lustre mounted without ``-o flock`` (ENOSYS): the
    stores build without a lock there, but the lock file each made stayed for good, since a sweep deleted only the
    lock files it could take (one empty file per entry ever built). None can hold one there."""
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setenv(CACHE_DAYS_ENV, "7")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    stale, fresh = _file(tmp_path / "ab" / "old.lock", 8, 0), _file(tmp_path / "ab" / "new.lock", 6, 0)
    prune_unused_files(tmp_path, LOCK_FILES)
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("days", ["0", "-1"])
def test_zero_days_keeps_everything(tmp_path: Path, monkeypatch, days: str) -> None:
    monkeypatch.setenv(CACHE_DAYS_ENV, days)
    stale = _file(tmp_path / "ab" / "old.npz", 1000)
    prune_unused_files(tmp_path, "*/*.npz")
    assert stale.exists() and not (tmp_path / ".swept").exists()


def test_a_loaded_packet_index_counts_as_used(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Indexes are written once and then only read: without a read refreshing them, every index of a dataset in
    daily use would be deleted 30 days after it was built."""
    store = PacketIndexStore(tmp_path / "store")
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    used, unused = FileStamp(index.file_size_bytes, "etag:a"), FileStamp(index.file_size_bytes, "run:b")
    store.save("https://host/v.mp4", used, index)
    store.save("https://host/v.mp4", unused, index)
    for stamp in (used, unused):
        _aged(store.path_for("https://host/v.mp4", stamp), 40)
    assert store.load("https://host/v.mp4", used) is not None
    store.prune_unused()
    assert store.path_for("https://host/v.mp4", used).exists()
    assert not store.path_for("https://host/v.mp4", unused).exists()


def test_prefetch_slots_unused_for_a_while_go_unless_a_run_holds_them(tmp_path: Path, caplog) -> None:
    root = tmp_path / "prefetch"
    blob = bytes(range(200))

    def slot(name: str, days: float, *, hold: bool = False) -> tuple[Path, RangeCache | None]:
        cache = RangeCache(root / name, max_bytes=1000)
        cache.acquire("ep", [ByteRange("p", 0, 100)], lambda key: blob[key.start : key.end])
        _aged(root / name / ".lock", days)
        if not hold:
            cache.close()
        return root / name, cache if hold else None

    gone, _ = slot("dataset-a/rank-0", 40)
    kept, _ = slot("dataset-b/rank-0", 5)
    held, holder = slot("dataset-b/rank-1", 40, hold=True)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        prune_unused_slots(root)
    assert f"deleted prefetch cache {gone}: no run has used it for 30 days" in caplog.text
    assert not gone.exists() and not gone.parent.exists()  # its dataset folder went with its last slot
    assert kept.exists() and held.exists()
    assert holder is not None and holder.bytes_cached == 100
    holder.close()
    again = RangeCache(kept, max_bytes=1000)  # a run opening a slot marks it used
    assert time.time() - (kept / ".lock").stat().st_mtime < 60 and again.bytes_cached == 100
    again.close()


def test_a_prefetch_slot_the_sweep_cannot_delete_is_not_logged_as_deleted(tmp_path: Path, monkeypatch, caplog) -> None:
    """Another user's slot in a shared cache (or a read-only one): its rename aside and every file's deletion fail,
    yet the sweep logged "deleted prefetch cache ..." (1 of 1), leaving the disk as full as it was and nobody told."""
    slot = _old_slot(tmp_path)
    (slot / "large.bin").write_bytes(bytes(250_000))  # (what stays is said in MB)
    kept = sorted(p.name for p in slot.iterdir())

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(Path, "rename", refused)
    monkeypatch.setattr(os, "unlink", refused)
    monkeypatch.setattr(os, "rmdir", refused)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        prune_unused_slots(tmp_path / "prefetch")
    monkeypatch.undo()
    assert sorted(p.name for p in slot.iterdir()) == kept
    assert "deleted prefetch cache" not in caplog.text
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    files = sum(1 for p in slot.rglob("*") if p.is_file())
    assert record.getMessage().startswith(f"cannot delete prefetch cache {slot}, which no run has used for 30 days")
    assert f"PermissionError: [Errno {errno.EACCES}]" in record.getMessage()
    assert f"{files} file(s), 0.3 MB of it stay in {slot}: delete it as its owner" in record.getMessage()


def test_a_prefetch_slot_whose_files_another_sweep_deletes_meanwhile_is_logged_as_deleted(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """Two ranks' sweeps may delete one file: a file gone before its unlink is deleted as wanted, no failure."""
    slot = _old_slot(tmp_path)
    unlink = os.unlink

    def deleted_meanwhile(path, *, dir_fd=None) -> None:
        unlink(path, dir_fd=dir_fd)
        unlink(path, dir_fd=dir_fd)  # (FileNotFoundError: as another sweep's unlink left it)

    monkeypatch.setattr(os, "unlink", deleted_meanwhile)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        prune_unused_slots(tmp_path / "prefetch")
    monkeypatch.undo()
    assert not slot.parent.exists() and [r.levelname for r in caplog.records] == ["INFO"]
    assert caplog.records[0].getMessage().startswith(f"deleted prefetch cache {slot}: no run has used it for 30 days")


def test_a_prefetch_slot_opened_long_ago_and_used_since_is_kept(tmp_path: Path) -> None:
    """A slot's last use was its open: a run of more than the days a sweep waits ($LEROBOT_DALI_CACHE_DAYS, 30)
    restarted, after its preemption or its end, to find its slot swept as unused by the first of its ranks to start
    (1 of 1)."""
    blob = bytes(range(200))
    root = tmp_path / "prefetch"
    cache = RangeCache(root / "dataset-a" / "rank-0", max_bytes=1000)
    _aged(root / "dataset-a" / "rank-0" / ".lock", 40)  # (opened 40 days ago)
    cache.acquire("ep", [ByteRange("p", 0, 100)], lambda key: blob[key.start : key.end])
    cache.close()
    prune_unused_slots(root)
    again = RangeCache(root / "dataset-a" / "rank-0", max_bytes=1000)
    assert again.bytes_cached == 100
    again.close()


def test_prefetch_slots_on_a_filesystem_without_locks_go_once_unused(tmp_path: Path, monkeypatch) -> None:
    """No prefetch cache opens where the filesystem takes no locks (NFS without its lock daemon, Lustre without
    ``-o flock``), but each try left its slot folder, and one made while it still took locks kept its ranges (up to
    cache_gb a rank): sweeps skipped every slot they could not lock, so those stayed for good."""
    import fcntl

    root = tmp_path / "prefetch"
    cache = RangeCache(root / "dataset" / "rank-0", max_bytes=1000)
    cache.acquire("ep", [ByteRange("p", 0, 100)], lambda key: bytes(key.size))
    cache.close()
    _aged(root / "dataset" / "rank-0" / ".lock", 40)

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    prune_unused_slots(root)
    assert not (root / "dataset").exists()


def test_a_slot_swept_by_another_rank_while_this_one_opens_it_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """Each rank sweeps the prefetch root, then opens its own slot: another rank's sweep that deleted this rank's old
    slot between its mkdir and its lock raised FileNotFoundError from the iterator's start (or, when it came between
    the lock file's open and its lock, left a cache on a folder no longer there)."""
    from lerobot_dali import range_cache

    directory = tmp_path / "prefetch" / "dataset" / "rank-1"
    real = range_cache.try_flock
    sweeps: list[Path] = []

    def swept_first(path: Path):
        if not sweeps:  # what prune_unused_slots in another rank does to a slot no run held for a while
            sweeps.append(path)
            shutil.rmtree(path.parent)
        return real(path)

    monkeypatch.setattr(range_cache, "try_flock", swept_first)
    cache = RangeCache(directory, max_bytes=1000)
    blob = bytes(range(200))
    cache.acquire("ep", [ByteRange("p", 0, 100)], lambda key: blob[key.start : key.end])
    assert sweeps == [directory / ".lock"] and cache.bytes_cached == 100 and (directory / ".lock").exists()
    assert real(directory / ".lock") is None  # held by the cache
    cache.close()


def test_a_rank_opening_its_slot_while_another_sweeps_it_gets_it_afresh(tmp_path: Path, monkeypatch) -> None:
    """A restart after a long pause: rank 0's sweep deleted rank 3's old slot under its lock while rank 3 opened it,
    so rank 3 found it held (CacheBusyError: it took ``rank-3.1``, and its next restart found ``rank-3`` empty; 8
    of 8 scripted runs with 3,000 ranges in the slot). The sweep now moves the slot aside before deleting it."""
    from lerobot_dali import range_cache

    slot = tmp_path / "prefetch" / "dataset" / "rank-3"
    old = RangeCache(slot, max_bytes=10_000)
    old.acquire("ep", [ByteRange("p", 0, 100)], lambda key: bytes(key.size))
    old.close()
    _aged(slot / ".lock", 40)
    real_rmtree, opened = shutil.rmtree, []

    def rank_3_opens_meanwhile(path: Path, *args, **kwargs) -> None:
        opened.append(RangeCache(slot, max_bytes=10_000))  # (what the sweep is deleting: its lock held)
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(range_cache.shutil, "rmtree", rank_3_opens_meanwhile)
    prune_unused_slots(tmp_path / "prefetch")
    (cache,) = opened
    assert cache.directory == slot and cache.bytes_cached == 0 and try_flock(slot / ".lock") is None  # held: its own
    assert sorted(p.name for p in slot.parent.iterdir()) == ["rank-3"]  # (the old one gone whole)
    cache.close()


def _old_slot(tmp_path: Path) -> Path:
    """A rank's slot no run has opened for 40 days, holding a range."""
    slot = tmp_path / "prefetch" / "dataset" / "rank-3"
    old = RangeCache(slot, max_bytes=10_000)
    old.acquire("ep", [ByteRange("p", 0, 100)], lambda key: bytes(key.size))
    old.close()
    _aged(slot / ".lock", 40)
    return slot


def _swept(slot: Path) -> None:
    """What another rank's :func:`prune_unused_slots` does to ``slot`` once it holds its lock."""
    swept = slot.with_name(f".{slot.name}.swept-1")
    slot.rename(swept)
    shutil.rmtree(swept)


def test_a_rank_finding_its_slot_locked_by_a_sweep_waits_for_it(tmp_path: Path, monkeypatch) -> None:
    """Another rank's sweep holds an old slot's lock for an instant before it moves the slot aside: a rank opening
    that slot then found it held and took ``rank-3.1`` (its next restart found ``rank-3`` empty; 1 of 800 ranks
    opening their slots while a sweep ran, scripted). A slot no run has used for a while is now tried again."""
    from lerobot_dali import range_cache

    slot, real, tries, sweeps_lock = _old_slot(tmp_path), range_cache.try_flock, [], []

    def opened_during_a_sweep(path: Path):
        tries.append(path)
        if len(tries) == 1:
            sweeps_lock.append(real(path))  # (this try finds it held)
        elif len(tries) == 2:  # (the sweep done)
            sweeps_lock[0].close()
            _swept(slot)
        return real(path)

    monkeypatch.setattr(range_cache, "try_flock", opened_during_a_sweep)
    cache = RangeCache.open_free_slot(slot, max_bytes=10_000)
    assert cache.directory == slot and cache.bytes_cached == 0
    assert sorted(p.name for p in slot.parent.iterdir()) == ["rank-3"]
    cache.close()


@pytest.mark.parametrize("days", ["7", "0"])
def test_a_slot_another_run_holds_is_tried_once_where_no_sweep_may_hold_it(tmp_path: Path, monkeypatch, days) -> None:
    """A slot's lock held where the slot was used lately (a live run's, no sweep's), or where sweeps are off
    (``LEROBOT_DALI_CACHE_DAYS=0``), is busy at the first try: only an old slot's lock is tried again (a sweep's,
    held for an instant), so a run looking for a free slot among others' does not retry each of them."""
    from lerobot_dali import range_cache

    monkeypatch.setenv(CACHE_DAYS_ENV, days)
    slot, real, tries = tmp_path / "dataset" / "rank-0", range_cache.try_flock, []
    held = RangeCache(slot, max_bytes=1000)

    def counted(path: Path):
        tries.append(path)
        return real(path)

    monkeypatch.setattr(range_cache, "try_flock", counted)
    with pytest.raises(CacheBusyError, match="held by another prefetch cache"):
        RangeCache(slot, max_bytes=1000)
    assert tries == [slot / ".lock"]
    held.close()


def test_a_slot_moved_aside_while_a_rank_makes_it_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """``Path.mkdir(exist_ok=True)`` raises FileExistsError where the folder it found is gone by the time it checks it
    is one: a sweep moving the old slot aside then left the rank with no prefetch cache at all (1 of 800 ranks opening
    their slots while a sweep ran, scripted)."""
    slot, real, made = _old_slot(tmp_path), Path.mkdir, []

    def moved_aside_meanwhile(path: Path, *args, **kwargs) -> None:
        if path == slot and not made:
            made.append(path)
            _swept(slot)
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", moved_aside_meanwhile)
    cache = RangeCache.open_free_slot(slot, max_bytes=10_000)
    assert made == [slot] and cache.directory == slot and cache.bytes_cached == 0
    cache.close()


def test_the_iterator_sweeps_the_column_store(make_ds) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator
    from tests.test_iterator import _dataset

    stale = _file(cache_root() / "columns" / "ab" / "stale.arrow", 40)
    it = DALILeRobotIterator(_dataset(make_ds, "vp9"), batch_size=2, device="cpu", num_workers=0)
    it.close()
    assert not stale.exists()


@pytest.mark.parametrize(
    ("configured", "expected"),
    [("~/caches", "HOME/caches"), ("  /fast/disk \n", "/fast/disk"), ("  ", "HOME/.cache/lerobot_dali")],
)
def test_the_cache_root_is_the_variable_home_expanded_else_the_users_cache(monkeypatch, configured, expected) -> None:
    """A blank $LEROBOT_DALI_CACHE (an unset shell variable quoted in a launcher) is no folder named by spaces."""
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("LEROBOT_DALI_CACHE", configured)
    assert cache_root() == Path(expected.replace("HOME", "/home/someone"))


def _without_home(monkeypatch, temporary: Path) -> None:
    """This process as one with no $HOME and no passwd entry, its temporary directory ``temporary``."""
    import pwd
    import tempfile

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("LEROBOT_DALI_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))


def test_a_process_without_a_home_directory_keeps_its_caches_elsewhere(make_ds, tmp_path, monkeypatch, caplog) -> None:
    """$HOME unset and no passwd entry for the uid (a container run as an arbitrary --user): Path.home()'s
    RuntimeError ("Could not determine home directory") came out of every store's construction, so check and the
    iterator failed before reading anything (1 of 1 scripted runs). The caches go to $XDG_CACHE_HOME, else a folder of
    the uid's in the temporary directory, said once."""
    from lerobot_dali import open_dataset
    from lerobot_dali.dataset_check import check_dataset

    _without_home(monkeypatch, tmp_path)
    assert cache_root() == tmp_path / f"lerobot_dali-{os.getuid()}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.cache_dirs"):
        root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="h264", gop=2, size=(64, 96))
        assert check_dataset(open_dataset(root), decode=True, workers=0).frames_decoded == 8
        assert check_dataset(open_dataset(root), decode=True, workers=0).frames_verified_before == 8
    assert cache_root() == tmp_path / "xdg" / "lerobot_dali" and (tmp_path / "xdg" / "lerobot_dali").is_dir()
    assert "no home directory ($HOME unset and uid" in caplog.text


def test_a_file_held_by_a_reader_is_not_deleted_nor_where_the_filesystem_takes_no_locks(tmp_path, monkeypatch) -> None:
    """What the column store's later runs delete of a server's unversioned files' copies: only those no reader holds
    (cache_dirs.hold_shared), and none where no reader can be told apart."""
    import fcntl

    from lerobot_dali.cache_dirs import delete_unless_held, hold_shared

    copy = _file(tmp_path / "ab" / "copy.arrow", 0)
    with open(copy, "rb") as reader:
        assert hold_shared(reader, copy)
        assert not delete_unless_held(copy) and copy.exists()
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: (_ for _ in ()).throw(OSError(errno.ENOLCK, "no locks")))
    assert not delete_unless_held(copy) and copy.exists()
    with open(copy, "rb") as reader:
        assert hold_shared(reader, copy)  # (read without a lock: nothing deletes it either)
    monkeypatch.undo()
    assert delete_unless_held(copy) and not copy.exists()
    with open(_file(copy, 0), "rb") as reader:
        copy.unlink()
        assert not hold_shared(reader, copy)  # (deleted before its reader's lock: map it again)


def test_a_shared_lock_refused_is_said_at_debug_and_one_the_filesystem_lacks_is_not(tmp_path, monkeypatch, caplog):
    """A reader goes on without its shared lock either way; only a refusal (not a filesystem without locks) is worth
    a debug line."""
    import fcntl

    from lerobot_dali.cache_dirs import hold_shared

    copy = _file(tmp_path / "copy.arrow", 0)
    for code in (errno.ENOLCK, errno.EIO):
        refused = OSError(code, os.strerror(code))
        monkeypatch.setattr(fcntl, "flock", lambda fd, op, refused=refused: (_ for _ in ()).throw(refused))
        with open(copy, "rb") as reader, caplog.at_level(logging.DEBUG, logger="lerobot_dali.cache_dirs"):
            assert hold_shared(reader, copy)
    assert caplog.messages == [
        f"{copy}: no shared lock ([Errno {errno.EIO}] {os.strerror(errno.EIO)}); read without one"
    ]


def test_an_entry_that_cannot_be_read_is_said_at_debug_and_an_absent_one_is_not(tmp_path: Path, caplog) -> None:
    """Neither is damaged (None: the caller builds the entry); an absent entry is the common case, not worth a line."""
    from lerobot_dali.cache_dirs import read_entry

    logger = logging.getLogger("tests.entries")
    with caplog.at_level(logging.DEBUG, logger="tests.entries"):
        assert read_entry(tmp_path / "absent.bin", logger, instead="building it") is None
        assert caplog.messages == []
        assert read_entry(tmp_path, logger, instead="building it") is None  # (a folder under the entry's name)
    assert caplog.messages == [f"cannot read {tmp_path} ([Errno 21] Is a directory: '{tmp_path}'); building it"]


def test_a_tree_not_deleted_whole_gives_its_first_error_and_what_is_left(tmp_path: Path, monkeypatch) -> None:
    """A file refused (another user's) keeps its folders too: the file's refusal is the first error, and comes back,
    not the folders' "not empty" after it; the file and its 100 bytes are left."""
    from lerobot_dali.cache_dirs import delete_tree

    folder = tmp_path / "slot"
    _file(folder / "ab" / "theirs.bin", 0, 100)
    _file(folder / "cd" / "ours.bin", 0, 300)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(path) == "theirs.bin":
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    error, files, size = delete_tree(folder)
    assert isinstance(error, PermissionError) and error.filename == "theirs.bin"
    assert (files, size) == (1, 100) and not (folder / "cd").exists()


def test_a_lock_file_that_may_not_be_made_is_refused_as_such(tmp_path) -> None:
    """In a folder this process may not write (another user's in a shared cache), a lock file none made yet raised
    FileNotFoundError (its read-only second open's), which the column store's one warning gave as why it could not
    write there ('No such file or directory'). (The other user simulated: tests run as root.)"""
    (tmp_path / "theirs.lock").touch()
    with not_writable(tmp_path):
        with pytest.raises(PermissionError):
            try_flock(tmp_path / "none.lock")
        lock = try_flock(tmp_path / "theirs.lock")  # (an existing one locks read-only, as before)
    assert lock is not None
    lock.close()


def _writer_in_a_child(path: Path) -> tuple[int, Path]:
    """A forked child mid-way through an :func:`atomic_file` write of ``path``: (its PID, its temporary file)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: writes, says where, and waits to be killed)
        try:
            with atomic_file(path, prefix=f".{path.name}.") as tmp:
                tmp.write(b"half")
                tmp.flush()
                os.write(write_end, tmp.name.encode())
                time.sleep(60)
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        return pid, Path(os.read(read_end, 4096).decode())  # (one short write: read whole)
    finally:
        os.close(read_end)


def test_a_writer_killed_mid_write_leaves_no_temporary_file_past_the_next_write(tmp_path: Path, caplog) -> None:
    """atomic_file's temporary file of a writer killed outright (SIGKILL, the OOM killer) stayed beside its entry: in
    a bench's or a checkpoint's folder for good (no sweep goes there), in a cache for its days unused (1 of 1 left
    after the next write). The next write beside it deletes it now; a live writer's stays, and so does a file of
    another host's writer."""
    entry = tmp_path / "entry.json"
    live, writing = _writer_in_a_child(entry)
    killed, left = _writer_in_a_child(entry)
    os.kill(killed, signal.SIGKILL)
    os.waitpid(killed, 0)
    other_host = tmp_path / f".entry.json.otherhost-{killed}-abcd1234.tmp"
    other_host.write_bytes(b"another host's")
    try:
        assert left.exists() and left.read_bytes() == b"half"
        with caplog.at_level(logging.DEBUG, logger="lerobot_dali.cache_dirs"):
            _write(entry, b"whole", exclusive=False)
        assert entry.read_bytes() == b"whole"
        assert not left.exists()
        assert caplog.messages == [f"removed {left}, left by a writer on this host (PID {killed}) that was killed"]
        assert writing.exists() and other_host.exists()
    finally:
        os.kill(live, signal.SIGKILL)
        os.waitpid(live, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["entry.json", writing.name, other_host.name])


def _dead_pid() -> int:
    """A PID no process has now (a child that has exited and been reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_folder_is_swept_of_dead_writers_files_once_per_process_whatever_the_prefix(tmp_path: Path) -> None:
    """Each atomic_file write listed its folder for dead writers' files of its prefix: 29 ms a write in a range cache
    folder of 10,000 entries (0.6 ms without), and a range's prefix (``.<start>-<end>.``) never found another range's
    file. The first write of a process in a folder sweeps every prefix's; later ones list nothing; another host's file
    whose name ends with this host's name is kept."""
    dead = _dead_pid()
    ours = f"@{host_name()}-{dead}-abcd1234.tmp"
    other_range = tmp_path / f".0-99{ours}"
    longer_host = tmp_path / f".0-99@x{host_name()}-{dead}-abcd1234.tmp"
    for left in (other_range, longer_host):
        left.write_bytes(b"half")
    with atomic_file(tmp_path / "100-199", prefix=".100-199.") as out:
        out.write(b"whole")
    assert not other_range.exists() and longer_host.exists()
    later = tmp_path / f".200-299{ours}"
    later.write_bytes(b"half")
    with atomic_file(tmp_path / "300-399", prefix=".300-399.") as out:
        out.write(b"whole")
    assert later.exists()  # (swept at this process's first write only)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["100-199", "300-399", later.name, longer_host.name])


def test_without_a_home_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch) -> None:
    """The XDG spec says a relative $XDG_CACHE_HOME is invalid: taken, the caches would move with the working folder."""
    _without_home(monkeypatch, tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache_root() == tmp_path / f"lerobot_dali-{os.getuid()}"


def test_a_users_private_cache_roots_are_the_home_cache_then_the_temporary_one(tmp_path, monkeypatch) -> None:
    """Best first: a cache in the home folder outlives one in the temporary directory (a reboot may empty it)."""
    import tempfile

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    temporary = tmp_path / "tmp" / f"lerobot_dali-{os.getuid()}"
    assert private_cache_roots() == [tmp_path / "home" / ".cache" / "lerobot_dali", temporary]
    _without_home(monkeypatch, tmp_path / "tmp")
    assert private_cache_roots() == [temporary]


@pytest.mark.parametrize("exclusive", [False, True])
def test_an_entry_written_is_readable_by_the_other_users_sharing_the_cache(tmp_path: Path, exclusive: bool) -> None:
    """The temporary file is made private (0600): renamed as it is, another user's rank could not read the entry."""
    entry = tmp_path / "entry.json"
    _write(entry, b"whole", exclusive=exclusive)
    assert entry.read_bytes() == b"whole" and entry.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("link_error", "outcome"),
    [(None, "stands"), (errno.EPERM, "replaced"), (errno.EOPNOTSUPP, "replaced"), (errno.EIO, "raised")],
)
def test_an_exclusive_write_takes_the_name_only_where_none_stands(tmp_path, monkeypatch, link_error, outcome) -> None:
    """A merge writes exclusively so that two merges never write over each other's entry: one standing is left (the
    caller merges it in). A filesystem without hard links (FAT, some FUSE mounts) is written over as without; any
    other failure of the link is no such filesystem, and is raised."""
    entry = tmp_path / "entry.json"
    entry.write_bytes(b"theirs")
    if link_error is not None:

        def link(source: str, path: Path) -> None:
            raise OSError(link_error, os.strerror(link_error))

        monkeypatch.setattr(os, "link", link)
    expected = {"stands": EntryStands, "replaced": None, "raised": OSError}[outcome]
    with pytest.raises(expected) if expected else contextlib.nullcontext():
        _write(entry, b"mine", exclusive=True)
    assert entry.read_bytes() == (b"mine" if outcome == "replaced" else b"theirs")
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]  # (no temporary file left)
    if outcome == "stands":  # (and where none stands, it is written)
        entry.unlink()
        _write(entry, b"first", exclusive=True)
        assert entry.read_bytes() == b"first"


def test_a_lock_refused_with_eacces_is_a_lock_held(tmp_path, monkeypatch) -> None:
    """flock(2) answers EWOULDBLOCK, but lock calls on some filesystems answer a held lock with EACCES (POSIX allows
    it): that is another holder, so None (wait and try again), not an error that builds without a lock."""
    import fcntl

    def held(fd: int, operation: int) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fcntl, "flock", held)
    assert try_flock(tmp_path / "entry.lock") is None


@pytest.mark.parametrize("stored", [True, False])
def test_a_lock_held_by_another_builder_is_waited_for_until_its_entry_stands(tmp_path, monkeypatch, caplog, stored):
    """The entry standing ends the wait at once (the waiter loads it; no word said); a holder that stalls past the wait
    is said, and the waiter builds without the lock."""
    import lerobot_dali.cache_dirs as cache_dirs

    entry = tmp_path / "store" / "entry.json"
    entry.parent.mkdir()
    holder = try_flock(entry.with_suffix(".lock"))
    polls: list[float] = []  # (the clock moves only as the waiter sleeps)

    def poll(seconds: float) -> None:
        polls.append(seconds)
        if stored and len(polls) == 2:
            entry.write_bytes(b"built")
        assert len(polls) < 10, "waited on past the entry or the deadline"

    monkeypatch.setattr(cache_dirs.time, "sleep", poll)
    monkeypatch.setattr(cache_dirs.time, "monotonic", lambda: sum(polls))
    with holder, caplog.at_level(logging.DEBUG, logger="lerobot_dali.cache_dirs"):
        assert wait_for_entry_lock(entry, wait_s=60.0 if stored else 1.0, poll_s=0.5) is None
    assert polls == [0.5] * (2 if stored else 3)  # (past the deadline: 1.5 s > 1 s)
    assert ("another process has held its lock for" in caplog.text) is not stored


def test_a_damaged_entry_is_deleted_unless_a_good_one_replaced_it_since_it_was_read(tmp_path: Path) -> None:
    """A store deletes an entry it found damaged; another rank may have renamed a good one over it meanwhile, which
    must stay. An entry never opened (no stat) is deleted outright."""
    entry = tmp_path / "entry.json"
    entry.write_bytes(b"damaged")
    read = entry.stat()
    _write(entry, b"good", exclusive=False)  # (renamed over it meanwhile)
    delete_if_unchanged(entry, read)
    assert entry.read_bytes() == b"good"
    delete_if_unchanged(entry, entry.stat())
    assert not entry.exists()
    entry.write_bytes(b"never opened")
    delete_if_unchanged(entry, None)
    assert not entry.exists()
    delete_if_unchanged(entry, None)  # (gone already, as another process's delete leaves it: no error)


def test_a_checksummed_entry_reads_back_and_one_whose_body_changed_is_refused() -> None:
    """An entry is its body's sha256 (hex), a newline, then the body (SHA-256 of no bytes: e3b0...b855). A body cut
    short or changed, or one behind another's checksum, disagrees with its checksum."""
    empty = b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
    assert checksummed(b"") == empty and checked_body(empty) == b""
    entry = checksummed(b"a body\nof two lines")
    assert checked_body(entry) == b"a body\nof two lines"
    for damaged in (entry[:-1], entry.replace(b"two", b"Two"), empty + b"x"):
        with pytest.raises(ValueError, match=r"its checksum disagrees with its contents \(a write cut short"):
            checked_body(damaged)


def test_an_entry_lock_is_taken_in_the_folders_made_for_it(tmp_path: Path) -> None:
    """A store's first entry may go where no folder stands yet (the store's folder and a subfolder in it): both are
    made and the lock beside the entry taken, not given up on as a folder where none can be made."""
    entry = tmp_path / "store" / "ab" / "entry.bin"
    lock = wait_for_entry_lock(entry, wait_s=0, poll_s=0)
    assert lock is not None and entry.with_suffix(".lock").is_file()
    lock.close()


def test_a_store_keeps_every_entry_of_a_files_newest_stamps_oldest_first() -> None:
    """A file copied to one path by two hosts has two versions, each with several entries (one per camera): those of
    its newest ``limit`` versions stay, all of them, in the order given; other files' stamps count apart."""
    keys = [("a", 1, "front"), ("b", 1, "front"), *(("a", v, camera) for v in (2, 3) for camera in ("front", "wrist"))]
    stamp = lambda key: (key[0], key[1])  # noqa: E731
    assert newest_stamps(keys, stamp, 1) == [("b", 1, "front"), ("a", 3, "front"), ("a", 3, "wrist")]
    assert newest_stamps(keys, stamp, 2) == [("b", 1, "front"), *keys[2:]]


@pytest.mark.parametrize(
    ("code", "store", "fix"),
    [
        (errno.ENOSPC, "store", "free space"),
        (errno.EROFS, "store", "make it a writable folder"),
        (errno.EACCES, "no-folder", "make it a writable folder"),  # (the store's folder is none to write in)
        (errno.EACCES, "store", None),
    ],
)
def test_a_store_entry_not_written_says_what_to_do_about_its_folder(
    tmp_path, monkeypatch, caplog, code, store, fix
) -> None:
    """Never raised (the store only saves work), but said once with the fix: a full disk, a read-only one, no folder
    to write in, or where the folder takes writes, this one entry's permissions."""
    import lerobot_dali.cache_dirs as cache_dirs

    error = OSError(code, os.strerror(code))  # (PermissionError for EACCES)

    def refused(**kwargs):
        raise error

    monkeypatch.setattr(cache_dirs.tempfile, "NamedTemporaryFile", refused)
    entry = tmp_path / "store" / f"entry-{code}.json"
    with caplog.at_level(logging.WARNING, logger="test.store"):
        kept = write_checksummed(
            entry, b"body", directory=tmp_path / store, logger=logging.getLogger("test.store"), what="the counts",
            otherwise="the next run counts again",
        )  # fmt: skip
    assert not kept and not entry.exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert message == (
        f"cannot keep the counts in {entry} ({type(error).__name__}: {error}); the next run counts again: "
        f"{fix or 'check its permissions'} or move the cache with $LEROBOT_DALI_CACHE"
    )


def test_write_whole_syncs_its_file_before_it_takes_the_name(tmp_path, monkeypatch) -> None:
    """A crash after the rename but before the data reach the disk left a zero-filled file of the right size, which
    a reader (a resumed run's record) took for whole."""
    record = tmp_path / "record.json"
    synced: list[bytes] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.pread(fd, 100, 0)))
    write_whole(record, b"whole")
    assert synced == [b"whole"] and record.read_bytes() == b"whole"


def test_without_a_usable_temporary_directory_the_last_cache_root_is_in_tmp(monkeypatch) -> None:
    """tempfile.gettempdir raises FileNotFoundError where no candidate is usable: /tmp then, not a traceback."""
    import tempfile

    def none_usable() -> str:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    assert private_cache_roots()[-1] == Path(f"/tmp/lerobot_dali-{os.getuid()}")


def test_a_file_is_the_same_only_on_the_same_device_and_inode(tmp_path: Path) -> None:
    """Inode numbers repeat across filesystems: an entry whose folder is now another mount (a cache moved) with a
    file of the same inode is another file, whose lock or deletion is not the opened one's."""
    from lerobot_dali.cache_dirs import _same_file

    entry = _file(tmp_path / "entry.json", 0)
    opened = entry.stat()
    elsewhere = os.stat_result((opened.st_mode, opened.st_ino, opened.st_dev + 1, *tuple(opened)[3:]))
    assert _same_file(opened, entry) and not _same_file(elsewhere, entry)
    entry.unlink()
    assert not _same_file(opened, entry)
