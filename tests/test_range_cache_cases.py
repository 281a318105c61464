"""Edge cases of the prefetch range cache (:mod:`lerobot_dali.range_cache`) that its main tests in test_prefetch.py
leave open: its bound's checks, the layout on disk, what adoption cannot delete, the slots and their lock's retries,
warnings said once, threads fetching or writing while another acquires, closes or forks, and the sweeps' cutoff."""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

from lerobot_dali import range_cache
from lerobot_dali.cache_dirs import CACHE_DAYS_ENV
from lerobot_dali.range_cache import (
    ByteRange,
    CacheBusyError,
    CacheStats,
    RangeCache,
    entry_dir,
    prune_unused_slots,
)
from tests.foreign_folder import not_writable
from tests.test_cache_prune import _old_slot
from tests.test_prefetch import _disk_bytes, _entry_file, _fetcher


def _earlier_run(directory: Path, *keys: ByteRange) -> None:
    """``directory`` as a run that fetched ``keys`` (zero bytes each) and ended left it."""
    cache = RangeCache(directory, max_bytes=10**6)
    cache.acquire("ep", keys, lambda key: bytes(key.size))
    cache.close()


def _bytes_adopted(directory: Path) -> int:
    """The bytes a cache opening ``directory`` now adopts."""
    cache = RangeCache(directory, max_bytes=10**6)
    cache.close()
    return cache.bytes_cached


def _stall_writes(monkeypatch, writing: threading.Event, go: threading.Event) -> None:
    """The cache's writes (:func:`.atomic_file`) wait for ``go``, having set ``writing``."""
    real = range_cache.atomic_file

    @contextmanager
    def stalled(path: Path, **kwargs):
        writing.set()
        assert go.wait(30)
        with real(path, **kwargs) as out:
            yield out

    monkeypatch.setattr(range_cache, "atomic_file", stalled)


@pytest.mark.parametrize("max_bytes", [-1, True, 1.0, "10"])
def test_a_cache_bound_that_is_no_non_negative_int_is_refused(tmp_path: Path, max_bytes) -> None:
    with pytest.raises(ValueError, match=rf"^max_bytes must be a non-negative int, got {max_bytes!r}$"):
        RangeCache(tmp_path, max_bytes=max_bytes)


def test_a_cache_of_zero_bytes_opens_and_refuses_every_range(tmp_path: Path) -> None:
    """A bound of 0 bytes is a cache that stores nothing (each range read remotely), not an error."""
    cache = RangeCache(tmp_path, max_bytes=0)
    calls: list[ByteRange] = []
    assert cache.acquire("a", [ByteRange("p", 0, 1)], _fetcher(bytes(1), calls)) == 0
    assert calls == [] and cache.stats.refused_ranges == 1 and cache.bytes_cached == 0 == _disk_bytes(tmp_path)
    cache.close()


def test_an_entry_folder_is_named_by_the_first_32_hex_digits_of_its_files_hash(tmp_path: Path) -> None:
    """The layout on disk is what a restart (of this release or the next) adopts: a folder named otherwise is
    another file's, and its entries would be dropped, starting every run after an upgrade cold."""
    assert entry_dir(tmp_path, "p", "v1") == tmp_path / "8c9af83d72d6a96197ab42f0669a9a1c"


def _stray_folder(folder: Path) -> Path:
    """A folder put in an entry's folder (by hand, another tool), which adoption deletes."""
    stray = folder / "stray"
    stray.mkdir()
    return stray


def _damaged_label(folder: Path) -> Path:
    """``folder`` with a label naming no file, which adoption deletes."""
    (folder / "path").write_bytes(b"\0" * 12)
    return folder


def _entries_evicted(folder: Path) -> Path:
    """``folder`` holding no entry (all evicted), which adoption deletes."""
    for entry in folder.glob("*.bin"):
        entry.unlink()
    return folder


@pytest.mark.parametrize("undeletable", [_stray_folder, _damaged_label, _entries_evicted])
def test_what_adoption_cannot_delete_stays_and_the_cache_opens(tmp_path: Path, undeletable) -> None:
    """What adoption deletes but cannot (another user's folder in a shared cache): a folder in an entry's folder, an
    entry's folder whose label does not name it, or one left holding no entry, stays where it is; the cache opens all
    the same, adopting the true entries beside it."""
    _earlier_run(tmp_path, ByteRange("p", 0, 100, "v1"), ByteRange("q", 0, 50))
    stays = undeletable(entry_dir(tmp_path, "p", "v1"))
    with not_writable(stays):
        cache = RangeCache(tmp_path, max_bytes=1000)
    assert stays.is_dir() and cache.bytes_cached == 150 - 100 * (undeletable is not _stray_folder)
    assert cache.bytes_cached == _disk_bytes(tmp_path)
    cache.close()


def test_adoption_evicts_down_to_the_bound_to_the_byte(tmp_path: Path) -> None:
    """A bound lowered since the earlier run: the oldest entries go until the rest fit, to the byte."""
    older, newer = ByteRange("p", 0, 60), ByteRange("p", 60, 121)
    _earlier_run(tmp_path, older, newer)
    os.utime(_entry_file(tmp_path, older), (1_000_000, 1_000_000))
    cache = RangeCache(tmp_path, max_bytes=120)
    assert not cache.holds(older) and cache.holds(newer) and cache.bytes_cached == 61 == _disk_bytes(tmp_path)
    cache.close()


def test_two_files_of_one_range_adopt_as_one_the_newer(tmp_path: Path, caplog) -> None:
    """An entry beside another of the same range (another checksum: folders merged by hand) was adopted besides it,
    its bytes counted twice and never evicted, so a later run said the cache was full of bytes no episode held. The
    newer is kept, the older deleted."""
    key = ByteRange("p", 0, 100)
    _earlier_run(tmp_path, key)
    older = _entry_file(tmp_path, key)
    newer = older.with_name(f"0-100-{zlib.crc32(b'y' * 100):08x}.bin")
    newer.write_bytes(b"y" * 100)
    os.utime(older, (1_000_000, 1_000_000))
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        cache = RangeCache(tmp_path, max_bytes=150)
    assert f"prefetch cache {tmp_path}: adopted 1 range(s), 100 bytes" in caplog.text
    assert _entry_file(tmp_path, key).stem == newer.stem  # (the one file of the range left)
    assert cache.bytes_cached == 100 == _disk_bytes(tmp_path)
    calls: list[ByteRange] = []
    assert cache.acquire("a", [key], _fetcher(b"y" * 100, calls)) == 0 and calls == []  # (its checksum is the newer's)
    cache.release("a")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.range_cache"):  # (the 100 bytes released: evicted)
        assert cache.acquire("b", [ByteRange("q", 0, 150)], _fetcher(bytes(150), calls)) == 150
    assert "is full" not in caplog.text and cache.bytes_cached == 150 == _disk_bytes(tmp_path)
    cache.close()


def test_a_label_without_its_last_newline_still_names_its_folder(tmp_path: Path) -> None:
    """A label's lines are the file's path and version: one cut short of its last newline names its folder still."""
    key = ByteRange("p", 0, 100, "v1")
    _earlier_run(tmp_path, key)
    (entry_dir(tmp_path, "p", "v1") / "path").write_bytes(b"p\nv1")
    cache = RangeCache(tmp_path, max_bytes=1000)
    assert cache.holds(key) and cache.bytes_cached == 100
    cache.close()


def test_an_entry_whose_checksum_is_below_its_start_is_adopted(tmp_path: Path) -> None:
    """``<start>-<end>-<crc32>``: an entry far into a large file (its start past its checksum's value) is adopted and
    reused like any other."""
    key = ByteRange("p", 3_000_000_000, 3_000_000_100)  # (the checksum of its 100 zero bytes: 2,575,877,834)
    _earlier_run(tmp_path, key)
    cache = RangeCache(tmp_path, max_bytes=1000)
    calls: list[ByteRange] = []
    assert cache.bytes_cached == 100 and cache.acquire("a", [key], _fetcher(bytes(100), calls)) == 0 and calls == []
    cache.close()


def test_an_entry_folder_is_labelled_once(tmp_path: Path) -> None:
    """The label (the file's path and version) is written with the folder's first entry, not again with each."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    cache.acquire("a", [ByteRange("p", 0, 100)], _fetcher(bytes(200), []))
    label = (entry_dir(tmp_path, "p") / "path").stat()
    cache.acquire("a", [ByteRange("p", 100, 200)], _fetcher(bytes(200), []))
    assert (entry_dir(tmp_path, "p") / "path").stat().st_ino == label.st_ino
    cache.close()


def test_deleting_what_another_process_deleted_first_is_no_error(tmp_path: Path) -> None:
    """Two cleanups (another rank's, a tmp cleaner) may delete one leftover: the second finds nothing, as wanted."""
    range_cache._delete(tmp_path / ".0-100.gone.tmp")
    assert list(tmp_path.iterdir()) == []


def test_a_run_takes_the_last_of_64_slots_and_none_past_it(tmp_path: Path) -> None:
    """A cache directory has 64 slots (itself and ``.1`` to ``.63``): with the first 63 held, a run takes the last;
    with all 64 held, it is refused, naming them."""
    base = tmp_path / "rank-0"
    held = [RangeCache.open_free_slot(base, max_bytes=1000) for _ in range(63)]
    last = RangeCache.open_free_slot(base, max_bytes=1000)
    assert [cache.directory.name for cache in held[:2]] == ["rank-0", "rank-0.1"] and last.directory.name == "rank-0.63"
    with pytest.raises(
        CacheBusyError, match=rf"^{base} and its 63 sibling slots are all in use by other prefetch caches$"
    ):
        RangeCache.open_free_slot(base, max_bytes=1000)
    assert not (tmp_path / "rank-0.64").exists()
    for cache in [*held, last]:
        cache.close()


def test_a_lock_file_replaced_while_a_run_locks_it_is_locked_again(tmp_path: Path, monkeypatch) -> None:
    """A lock file deleted between its open and its lock (try_flock answers None: a sweep done with it) is no other
    cache's: the run tries again and opens its own slot, not a cold sibling."""
    real, tries, waits = range_cache.try_flock, [], []
    _earlier_run(tmp_path / "rank-0", ByteRange("p", 0, 100))

    def deleted_first(path: Path):
        tries.append(path)
        if len(tries) == 1:
            path.unlink()
            return None
        return real(path)

    monkeypatch.setattr(range_cache, "try_flock", deleted_first)
    monkeypatch.setattr(range_cache.time, "sleep", waits.append)
    cache = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)
    assert cache.directory == tmp_path / "rank-0" and tries == [tmp_path / "rank-0" / ".lock"] * 2
    assert cache.bytes_cached == 100  # (warm: its own slot)
    assert waits == []  # (no sweep's lock to wait for: tried again at once)
    cache.close()


def test_a_slot_another_user_owns_is_refused_before_its_lock_is_taken(tmp_path: Path) -> None:
    """A slot this process may not write (another user's, in a shared cache) raises PermissionError at once: its lock
    file, which flock takes read-only too, stays free for its owner."""
    slot = tmp_path / "rank-0"
    _earlier_run(slot)
    with not_writable(slot), pytest.raises(PermissionError):
        RangeCache(slot, max_bytes=1000)
    RangeCache(slot, max_bytes=1000).close()  # (free: no CacheBusyError)


@pytest.mark.parametrize(
    ("days", "age_s", "sweepable"),
    [("30", 30 * 86400 + 10, True), ("30", 30 * 86400 - 10, False), ("1", 2 * 86400, True), ("0", 400 * 86400, False)],
)
def test_a_lock_is_a_sweeps_only_once_its_slot_is_older_than_the_days_a_sweep_waits(
    tmp_path: Path, monkeypatch, days: str, age_s: float, sweepable: bool
) -> None:
    """A slot's lock held may be a sweep's only where its slot is old enough to be swept ($LEROBOT_DALI_CACHE_DAYS,
    to the second; none where sweeps are off): only that one is tried again (a live run's is busy at once)."""
    monkeypatch.setenv(CACHE_DAYS_ENV, days)
    lock = tmp_path / ".lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    assert range_cache._sweepable(lock) is sweepable


def test_a_full_cache_says_so_once_naming_the_first_range_refused(tmp_path: Path, caplog) -> None:
    """Held ranges filling the cache refuse the next ones (read remotely), said in one warning, not one a range."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    cache.acquire("a", [ByteRange("p", 0, 800)], _fetcher(bytes(800), []))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.range_cache"):
        for owner, key in [("b", ByteRange("q", 0, 300)), ("c", ByteRange("r", 100, 500))]:
            assert cache.acquire(owner, [key], _fetcher(bytes(500), [])) == 0
    assert cache.stats.refused_ranges == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"prefetch cache {tmp_path} is full (800 of 1000 bytes held by pooled episodes); ranges that do not fit "
        "(first: q [0, 300)) are read remotely. Raise the cache size or lower episode_pool_size."
    ]
    cache.close()


def test_a_range_one_byte_too_large_after_clear_evicts_nothing(tmp_path: Path) -> None:
    """clear() leaves no byte counted as evictable: a range one byte larger than what the held ones leave is refused
    without evicting the entry released since (as it would, to be refused after all, were one byte still counted)."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    cache.acquire("x", [ByteRange("p", 0, 100)], _fetcher(bytes(100), []))
    cache.clear()
    released = ByteRange("q", 0, 200)
    cache.acquire("a", [ByteRange("p", 0, 500)], _fetcher(bytes(500), []))
    cache.acquire("b", [released], _fetcher(bytes(200), []))
    cache.release("b")
    assert cache.acquire("c", [ByteRange("r", 0, 501)], _fetcher(bytes(501), [])) == 0
    assert cache.stats.refused_ranges == 1 and cache.stats.evicted_ranges == 0 and cache.holds(released)
    assert cache.bytes_cached == 700 == _disk_bytes(tmp_path)
    cache.close()


def test_an_adopted_entry_checked_and_held_again_is_not_evictable(tmp_path: Path) -> None:
    """An earlier run's entry, checked when an episode needs it, is that episode's until its release: room made for
    another range does not evict it (the range is refused)."""
    adopted = ByteRange("p", 0, 600)
    _earlier_run(tmp_path, adopted)
    cache = RangeCache(tmp_path, max_bytes=1000)
    calls: list[ByteRange] = []
    assert cache.acquire("a", [adopted], _fetcher(bytes(600), calls)) == 0 and calls == []
    assert cache.acquire("b", [ByteRange("q", 0, 600)], _fetcher(bytes(600), calls)) == 0 and calls == []
    assert cache.stats.reused_ranges == 1 and cache.stats.refused_ranges == 1 and cache.stats.evicted_ranges == 0
    assert cache.holds(adopted) and cache.bytes_cached == 600 == _disk_bytes(tmp_path)
    cache.close()


def test_a_damaged_adopted_entry_whose_fetch_fails_is_no_longer_held(tmp_path: Path) -> None:
    """An earlier run's entry found damaged, then not fetched again (the remote failed), is gone: not held, its bytes
    no longer counted, and the next acquire fetches it."""
    key = ByteRange("p", 0, 100)
    _earlier_run(tmp_path, key)
    (entry,) = entry_dir(tmp_path, "p").glob("0-100-*.bin")
    entry.write_bytes(b"x" * 100)
    cache = RangeCache(tmp_path, max_bytes=1000)

    def remote_down(key: ByteRange) -> bytes:
        raise OSError(errno.ECONNRESET, "Connection reset by peer")

    with pytest.raises(OSError, match="Connection reset by peer"):
        cache.acquire("a", [key], remote_down)
    assert not cache.holds(key) and cache.bytes_cached == 0 == _disk_bytes(tmp_path)
    calls: list[ByteRange] = []
    assert cache.acquire("b", [key], _fetcher(bytes(100), calls)) == 100 and calls == [key]
    assert cache.bytes_cached == 100 == _disk_bytes(tmp_path)
    cache.close()


def test_a_cache_that_cannot_write_says_so_once(tmp_path: Path, monkeypatch, caplog) -> None:
    """A full disk refuses each range the cache cannot store (read remotely), said in one warning naming the cache
    and the error, not one a range."""

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    cache = RangeCache(tmp_path, max_bytes=1000)
    monkeypatch.setattr(os, "fsync", disk_full)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.range_cache"):
        assert cache.acquire("a", [ByteRange("p", 0, 100), ByteRange("p", 100, 300)], _fetcher(bytes(300), [])) == 0
    assert cache.stats.refused_ranges == 2 and cache.bytes_cached == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"prefetch cache {tmp_path} cannot write ([Errno {errno.ENOSPC}] No space left on device); ranges it cannot "
        "store are read remotely"
    ]
    cache.close()


def test_a_range_another_thread_is_fetching_is_waited_for_not_fetched_twice(tmp_path: Path) -> None:
    """Two admissions needing one range at once (episodes sharing a data file's footer): the second waits for the
    first's fetch and holds the entry it made, one request for both."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    key, calls = ByteRange("p", 0, 100), []
    fetching, second_there, go = threading.Event(), threading.Event(), threading.Event()

    def first_fetch(key: ByteRange) -> bytes:
        calls.append("first")
        fetching.set()
        assert go.wait(30)
        return bytes(key.size)

    def second_fetch(key: ByteRange) -> bytes:
        calls.append("second")
        second_there.set()
        return bytes(key.size)

    first = threading.Thread(target=cache.acquire, args=("a", [key], first_fetch))
    first.start()
    assert fetching.wait(30)
    pending = cache._pending[key]
    real_wait = pending.wait
    pending.wait = lambda *args: second_there.set() or real_wait(*args)
    second = threading.Thread(target=cache.acquire, args=("b", [key], second_fetch))
    second.start()
    assert second_there.wait(30)
    go.set()
    first.join(30)
    second.join(30)
    assert calls == ["first"] and cache.stats.fetched_ranges == 1 and cache.stats.reused_ranges == 1
    assert sorted(cache.owners()) == ["a", "b"] and cache.bytes_cached == 100 == _disk_bytes(tmp_path)
    cache.close()


def test_close_gives_the_lock_up_once_and_a_second_close_is_no_error(tmp_path: Path) -> None:
    """close() closes the lock file itself (none left to the collector to close), and closing again does nothing."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cache.close()
        cache.close()
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []
    RangeCache(tmp_path, max_bytes=1000).close()  # (free again)


def test_close_waits_for_the_write_under_way(tmp_path: Path, monkeypatch) -> None:
    """A write under way when the cache closes ends first (the folder may be another cache's once close returns),
    and the next run adopts its entry."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    writing, go = threading.Event(), threading.Event()
    _stall_writes(monkeypatch, writing, go)
    writer = threading.Thread(target=cache.acquire, args=("a", [ByteRange("p", 0, 100)], _fetcher(bytes(100), [])))
    writer.start()
    assert writing.wait(30)
    closer = threading.Thread(target=cache.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # (waiting for the write)
    go.set()
    closer.join(30)
    writer.join(30)
    assert _bytes_adopted(tmp_path) == 100


def test_a_closed_cache_no_longer_marks_its_folder_used(tmp_path: Path) -> None:
    """Once closed, the folder is no longer this cache's (another run's, or swept as unused): an acquire() of the
    closed cache fetches and stores nothing, and leaves the lock's last use as it was."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    cache.close()
    os.utime(tmp_path / ".lock", (1_000_000, 1_000_000))
    calls: list[ByteRange] = []
    assert cache.acquire("a", [ByteRange("p", 0, 100)], _fetcher(bytes(100), calls)) == 0
    assert (tmp_path / ".lock").stat().st_mtime == 1_000_000 and _disk_bytes(tmp_path) == 0
    assert calls == [] and cache.stats == CacheStats()  # (nothing fetched for nothing, nor counted)


# -- sweeps of slots no run used ------------------------------------------------------------------------------
def test_no_slot_is_swept_where_sweeps_are_off(tmp_path: Path, monkeypatch) -> None:
    """``LEROBOT_DALI_CACHE_DAYS=0`` keeps every slot, however old."""
    monkeypatch.setenv(CACHE_DAYS_ENV, "0")
    slot = _old_slot(tmp_path)
    prune_unused_slots(tmp_path / "prefetch")
    assert _bytes_adopted(slot) == 100


def test_a_slot_last_used_at_the_cutoff_itself_is_kept(tmp_path: Path, monkeypatch) -> None:
    """Only a slot used before the cutoff is swept: one used at that very time is kept."""
    slot = _old_slot(tmp_path)
    monkeypatch.setattr(range_cache, "sweep_cutoff", lambda root: (slot / ".lock").stat().st_mtime)
    prune_unused_slots(tmp_path / "prefetch")
    assert _bytes_adopted(slot) == 100


# -- a child forked from the writer's process -------------------------------------------------------------------
def _in_child(work: Callable[[], bool]) -> int:
    """The exit code of a child forked now that runs ``work()`` (True: success), killed if it runs 10 s."""
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(10)
            code = 0 if work() else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_child_forked_mid_fetch_and_mid_write_neither_waits_for_the_parents_threads(tmp_path: Path, monkeypatch):
    """The parent's threads are not the child's: a range one of them was fetching, and the write another had under
    way, left the child's acquire() of that range, and its close(), waiting for ever. The child also closes its copy
    of the lock file itself (no unclosed file left to the collector)."""
    cache = RangeCache(tmp_path, max_bytes=1000)
    fetching, writing, go = threading.Event(), threading.Event(), threading.Event()
    fetched, written = ByteRange("p", 0, 100), ByteRange("q", 0, 100)

    def slow_fetch(key: ByteRange) -> bytes:
        fetching.set()
        assert go.wait(30)
        return bytes(key.size)

    def child() -> bool:
        got = cache.acquire("c", [fetched], slow_fetch)  # (the parent's fetch of it is none of the child's)
        cache.close()  # (nor is the parent's write)
        unclosed = [w for w in seen if issubclass(w.category, ResourceWarning) and str(tmp_path) in str(w.message)]
        return got == 0 and not unclosed

    _stall_writes(monkeypatch, writing, go)
    threads = [
        threading.Thread(target=cache.acquire, args=("a", [fetched], slow_fetch)),
        threading.Thread(target=cache.acquire, args=("b", [written], _fetcher(bytes(100), []))),
    ]
    for thread in threads:
        thread.start()
    assert fetching.wait(30) and writing.wait(30)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code = _in_child(child)
    go.set()
    for thread in threads:
        thread.join(30)
    assert code == 0 and cache.holds(fetched) and cache.holds(written) and cache.bytes_cached == 200
    cache.close()
