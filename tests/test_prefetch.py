"""Prefetch-on-admit: pool windows, the bounded ref-counted range cache, read-through files, and the
iterator over a fake remote reading local bytes (a warm second epoch makes no data requests)."""

from __future__ import annotations

import dataclasses
import errno
import gc
import io
import logging
import os
import random
import re
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dali.cached_filesystem import CachedFileSystem, cache_version
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.episode_ranges import EpisodeRanges
from lerobot_dali.errors import DataFileError
from lerobot_dali.range_cache import ByteRange, CacheBusyError, RangeCache, entry_dir, list_entries
from lerobot_dali.sample_order import OrderOptions, SampleOrder
from tests.fake_remote import FakeRemoteFileSystem
from tests.foreign_folder import not_writable
from tests.process_tree import open_files_under
from tests.test_iterator import DELTAS, LENGTHS, _check_sample, _dataset, _samples

DATA_KINDS = ("open", "read", "cat_file")


# -- pool windows ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [True, False])
def test_pool_window_holds_every_episode_its_positions_draw(shuffle: bool) -> None:
    lengths = np.random.default_rng(0).integers(1, 40, size=60)
    order = SampleOrder(
        lengths, rank=1, world_size=3, options=OrderOptions(seed=3, shuffle=shuffle, episode_pool_size=5)
    )
    total = order.num_samples(0)
    rng = random.Random(1)
    for _ in range(40):
        start = rng.randrange(total)
        stop = min(total, start + rng.randrange(1, 200))
        window = order.pool_window(0, start, stop)
        episodes, _ = order.samples(0, start, stop)
        assert set(episodes.tolist()) <= set(window.tolist())
        assert len(set(window.tolist())) == len(window)
        # No more than the pool plus what gets admitted: each admission needs an episode to finish.
        finished = len(set(order.samples(0, 0, stop)[0].tolist()) - set(order.samples(0, stop, total)[0].tolist()))
        assert len(window) <= 5 + finished + 1 if shuffle else len(window) <= len(set(episodes.tolist()))
    assert order.pool_window(0, total, total + 10).size == 0


# -- range cache ------------------------------------------------------------------------------------------------
def _fetcher(blob: bytes, calls: list[ByteRange]):
    def fetch(key: ByteRange) -> bytes:
        calls.append(key)
        return blob[key.start : key.end]

    return fetch


def _disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.suffix in (".bin", ".adopted"))


def test_range_cache_refcounts_shared_ranges_and_keeps_released_ones_until_needed(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 40
    calls: list[ByteRange] = []
    cache = RangeCache(tmp_path, max_bytes=3000)
    shared, a_only, b_only = ByteRange("f", 0, 1000), ByteRange("f", 1000, 2000), ByteRange("f", 2000, 3000)
    cache.acquire("a", [shared, a_only], _fetcher(blob, calls))
    cache.acquire("b", [shared, b_only], _fetcher(blob, calls))
    assert calls == [shared, a_only, b_only] and cache.bytes_cached == 3000 == _disk_bytes(tmp_path)
    cache.release("a")  # the shared footer-like range stays held by b
    assert cache.holds(shared) and cache.holds(a_only)  # released, kept on disk until room is needed
    cache.acquire("c", [ByteRange("f", 3000, 3500)], _fetcher(blob, calls))
    assert not cache.holds(a_only) and cache.holds(shared) and cache.holds(b_only)
    assert cache.bytes_cached == 2500 == _disk_bytes(tmp_path)
    cache.release("b")
    cache.acquire("a", [shared], _fetcher(blob, calls))  # reused from disk: no fetch
    assert calls[-1] == ByteRange("f", 3000, 3500) and cache.stats.reused_ranges == 2
    folder = entry_dir(tmp_path, "f")
    assert (folder / f"0-1000-{zlib.crc32(blob[:1000]):08x}.bin").read_bytes() == blob[:1000]


def test_range_cache_never_exceeds_its_bound(tmp_path: Path) -> None:
    blob = bytes(random.Random(0).randbytes(50_000))
    cache = RangeCache(tmp_path, max_bytes=10_000)
    rng = random.Random(2)
    held: list[str] = []
    for step in range(300):
        if held and rng.random() < 0.4:
            cache.release(held.pop(rng.randrange(len(held))))
        else:
            owner = f"ep{step}"
            ranges = []
            for _ in range(rng.randrange(1, 4)):
                start = rng.randrange(0, 46_000)
                ranges.append(ByteRange("v", start, start + rng.randrange(1, 4000)))
            cache.acquire(owner, ranges, _fetcher(blob, []))
            held.append(owner)
        assert cache.bytes_cached <= 10_000 and _disk_bytes(tmp_path) == cache.bytes_cached
    assert cache.stats.refused_ranges > 0 and cache.stats.evicted_ranges > 0


def test_a_range_that_cannot_fit_evicts_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A range that does not fit even with every released entry evicted (held ones fill the cache, or it is larger
    than the cache) evicted them all the same, then was refused: a warm cache flushed for nothing, each time such an
    episode came into the pool (2 of 2 released ranges here)."""
    blob = bytes(range(256)) * 10
    cache = RangeCache(tmp_path, max_bytes=1000)
    calls: list[ByteRange] = []
    released = [ByteRange("p", 0, 200), ByteRange("p", 200, 400)]
    cache.acquire("a", released, _fetcher(blob, calls))
    cache.release("a")
    cache.acquire("b", [ByteRange("p", 400, 900)], _fetcher(blob, calls))  # held
    cache.acquire("c", [ByteRange("p", 900, 1500)], _fetcher(blob, calls))  # 600 bytes beside b's 500
    cache.acquire("d", [ByteRange("q", 0, 1001)], _fetcher(blob, calls))  # larger than the cache
    assert cache.stats.refused_ranges == 2 and cache.stats.evicted_ranges == 0
    assert all(cache.holds(key) for key in released) and _disk_bytes(tmp_path) == cache.bytes_cached == 900
    assert "is full (500 of 1000 bytes held by pooled episodes)" in caplog.text  # (not the 400 released)
    cache.acquire("e", [ByteRange("p", 900, 1200)], _fetcher(blob, calls))  # fits once the oldest is evicted
    assert not cache.holds(released[0]) and cache.holds(released[1]) and cache.bytes_cached == 1000
    fetched = len(calls)
    cache.acquire("f", [released[1]], _fetcher(blob, calls))  # back in the pool: reused
    assert len(calls) == fetched and cache.stats.reused_ranges == 1


def test_range_cache_adopts_an_earlier_runs_entries(tmp_path: Path) -> None:
    blob = bytes(range(200))
    first = RangeCache(tmp_path, max_bytes=150)
    first.acquire("x", [ByteRange("p", 0, 100, "v1"), ByteRange("p", 100, 150, "v1")], _fetcher(blob, []))
    (entry_dir(tmp_path, "p", "v1") / ".junk.tmp").write_bytes(b"partial")
    first.close()  # the run ends: its directory is free for the next
    second = RangeCache(tmp_path, max_bytes=120)  # smaller bound: the oldest entries go
    assert second.bytes_cached <= 120 and _disk_bytes(tmp_path) == second.bytes_cached
    calls: list[ByteRange] = []
    second.acquire("y", [ByteRange("p", 100, 150, "v1")], _fetcher(blob, calls))
    assert calls == []
    assert not (entry_dir(tmp_path, "p", "v1") / ".junk.tmp").exists()  # a crashed writer's temporary
    unlabelled = entry_dir(tmp_path, "q", "v1")  # a crash between the entry's rename and its folder's label
    unlabelled.mkdir()
    (unlabelled / "0-10-00000000.bin").write_bytes(bytes(10))
    second.close()
    RangeCache(tmp_path, max_bytes=120)
    assert not (unlabelled / "0-10-00000000.bin").exists()


def test_a_folder_whose_entries_were_all_evicted_goes_at_the_next_open(tmp_path: Path) -> None:
    """A folder (one file's version) whose entries were all evicted stayed, label only, for as long as runs used the
    directory: one per file and run where the server gives no version (30 runs over 100 such files: 3,000 folders,
    2,900 empty, the 30th open 328 ms; now 200 folders, 34 ms)."""
    fetch = _fetcher(bytes(range(100)), [])
    for run, name in enumerate(["a", "b", "c"]):
        cache = RangeCache(tmp_path, max_bytes=100)
        assert cache.bytes_cached == (100 if run else 0)  # the previous run's entry, adopted
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(
            entry_dir(tmp_path, key, "1").name for key in ["a", "b"][max(0, run - 1) : run]
        )
        cache.acquire(run, [ByteRange(name, 0, 100, "1")], fetch)  # evicts the previous run's
        cache.release(run)
        cache.close()


def test_adopted_entries_survive_an_unchecked_run_and_a_vanished_one_is_fetched_again(tmp_path: Path) -> None:
    """A run that adopts entries and ends before checking them leaves them hidden (``.adopted``): the next run adopts
    them as they are and reuses them unfetched; an adopted entry whose file vanished before its check is fetched again,
    and the bytes counted stay those on disk."""
    blob = random.Random(16).randbytes(300)
    keys = [ByteRange("p", 0, 100, "v1"), ByteRange("p", 100, 300, "v1")]
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("x", keys, _fetcher(blob, []))
    first.close()
    RangeCache(tmp_path, max_bytes=1000).close()  # adopts both (hidden), checks none
    folder = entry_dir(tmp_path, "p", "v1")
    hidden = sorted(f for f in folder.iterdir() if f.suffix == ".adopted")
    assert len(hidden) == 2 and list_entries(folder) == []
    third = RangeCache(tmp_path, max_bytes=1000)
    assert third.bytes_cached == 300
    hidden[1].unlink()  # the [100, 300) entry vanishes before the run checks it
    calls: list[ByteRange] = []
    assert third.acquire("y", keys, _fetcher(blob, calls)) == 200
    assert calls == [keys[1]] and third.bytes_cached == 300 == _disk_bytes(tmp_path)
    readable = [(a, b, f.read_bytes()) for a, b, f in list_entries(folder)]
    assert readable == [(0, 100, blob[:100]), (100, 300, blob[100:])]


def test_a_cache_directory_has_one_writer_and_a_second_run_takes_a_sibling_slot(tmp_path: Path) -> None:
    """Two runs sharing a directory evicted each other's held entries (and crashed adopting a vanishing one)."""
    blob = bytes(range(200))
    first = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100)], _fetcher(blob, []))
    with pytest.raises(CacheBusyError, match="held by another prefetch cache"):
        RangeCache(tmp_path / "rank-0", max_bytes=1000)
    second = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=50)  # a bound that would evict a's range
    assert second.directory == tmp_path / "rank-0.1" and second.bytes_cached == 0
    assert first.holds(ByteRange("p", 0, 100)) and _disk_bytes(first.directory) == 100
    first.close()
    second.close()
    again = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)  # free again: starts warm
    assert again.directory == tmp_path / "rank-0" and again.bytes_cached == 100


def test_a_run_taking_a_sibling_slot_says_so_and_one_taking_its_own_says_nothing(tmp_path: Path, caplog) -> None:
    """A run whose slot another run holds starts cold in a sibling: it logs which one, the only sign of why its
    cache is cold; a run in its own slot logs no such line."""
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        first = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)
        assert "in use by another run" not in caplog.text
        second = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)
    assert (
        f"prefetch cache {tmp_path / 'rank-0'} is in use by another run; using {tmp_path / 'rank-0.1'}" in caplog.text
    )
    first.close()
    second.close()


def test_a_child_forked_while_a_cache_holds_its_directory_leaves_it_to_the_parent(tmp_path: Path) -> None:
    """A ``flock`` belongs to the open file, which a fork shares: while a child forked meanwhile lived (a fork-based
    DataLoader, a helper process), the parent's close let the directory go to no one, and the parent's next cache took
    a sibling slot, cold. The child's copy is closed: it writes nothing in the parent's directory."""
    blob = bytes(range(200))
    first = RangeCache(tmp_path / "rank-0", max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100)], _fetcher(blob, []))
    read, write = os.pipe()
    started_read, started_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (never back into pytest: os._exit)
        closed = first.acquire("b", [ByteRange("p", 100, 200)], _fetcher(blob, [])) == 0
        os.write(started_write, b"x")  # (past the fork's hooks)
        os.read(read, 1)  # (alive until the parent has opened its next cache)
        os._exit(0 if closed else 1)
    os.close(read)
    os.close(started_write)
    os.read(started_read, 1)
    os.close(started_read)
    try:
        with pytest.raises(CacheBusyError):  # the parent's lock stays its own
            RangeCache(tmp_path / "rank-0", max_bytes=1000)
        first.close()
        again = RangeCache.open_free_slot(tmp_path / "rank-0", max_bytes=1000)
        assert again.directory == tmp_path / "rank-0" and again.bytes_cached == 100
        again.close()
    finally:
        os.write(write, b"x")
        os.close(write)
        status = os.waitpid(pid, 0)[1]
    assert os.waitstatus_to_exitcode(status) == 0 and _disk_bytes(tmp_path / "rank-0") == 100


def test_a_range_fetched_while_its_cache_closes_is_not_written_into_the_next_writers_folder(tmp_path: Path) -> None:
    """Closing the prefetcher gives the folder up at once and leaves a fetch in flight to its thread; that fetch then
    wrote its entry (and made room, evicting) in a folder another cache held by then (the next run's, or the next
    iterator's of this one): an entry that cache never counted, so the folder held 200 bytes under a bound of 100.
    Forced here: the fetch ends after the close and the second cache's open."""
    import threading

    folder = tmp_path / "cache"
    first = RangeCache(folder, max_bytes=100)
    fetching, answer = threading.Event(), threading.Event()

    def late_fetch(key: ByteRange) -> bytes:
        fetching.set()
        assert answer.wait(30)
        return b"a" * key.size

    late = threading.Thread(target=first.acquire, args=(0, [ByteRange("f", 0, 100)], late_fetch))
    late.start()
    assert fetching.wait(30)
    first.close()
    second = RangeCache(folder, max_bytes=100)
    answer.set()
    late.join(30)
    second.acquire(1, [ByteRange("g", 0, 100)], lambda key: b"b" * key.size)
    entries = sorted(folder.rglob("*.bin"))
    assert [f.read_bytes()[:1] for f in entries] == [b"b"] and second.bytes_cached == 100
    assert first.stats.refused_ranges == 1 and first.stats.fetched_ranges == 0


def test_a_cache_that_cannot_write_refuses_the_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk made the prefetcher's warm-up, on the training thread, raise; the range is now read remotely."""
    blob = bytes(range(200))
    cache = RangeCache(tmp_path, max_bytes=1000)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", disk_full)
        assert cache.acquire("a", [ByteRange("p", 0, 100)], _fetcher(blob, [])) == 0
    assert cache.stats.refused_ranges == 1 and cache.bytes_cached == 0 and not cache.holds(ByteRange("p", 0, 100))
    assert not list(tmp_path.rglob("*.tmp"))
    cache.acquire("a", [ByteRange("p", 0, 100)], _fetcher(blob, []))  # room again: stored as usual
    assert cache.bytes_cached == 100 == _disk_bytes(tmp_path)


@pytest.mark.parametrize("label", [b"\xff\xfe not text", b"", b"\0" * 12, b"p\n", b"q\nv1\n"])
def test_a_cache_folder_whose_label_does_not_name_it_is_dropped(tmp_path: Path, caplog, label: bytes) -> None:
    """A label that is not UTF-8 aborted the next run with a bare UnicodeDecodeError; one cut short or zeroed
    was adopted under another key (the range fetched again, counted twice, and evicting it deleted the file the
    true entry pointed to)."""
    blob = bytes(range(200))
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, []))
    first.close()
    folder = entry_dir(tmp_path, "p", "v1")
    (folder / "path").write_bytes(label)
    with caplog.at_level("WARNING", logger="lerobot_dali.range_cache"):
        second = RangeCache(tmp_path, max_bytes=1000)
    assert second.bytes_cached == 0 and not folder.exists() and "label does not name it" in caplog.text
    calls: list[ByteRange] = []
    second.acquire("b", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, calls))
    assert calls == [ByteRange("p", 0, 100, "v1")] and second.bytes_cached == 100 == _disk_bytes(tmp_path)
    second.close()


def test_an_unwritable_cache_folder_reads_remotely(make_ds, tmp_path: Path, monkeypatch, caplog) -> None:
    """A read-only cache_dir (or default cache root) made a remote dataset fail to open at all."""
    from lerobot_dali.iterator import DALILeRobotIterator

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "cache"))

    monkeypatch.setattr(RangeCache, "open_free_slot", read_only)
    root = _dataset(make_ds, "av1")
    options = dict(batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    with caplog.at_level("WARNING", logger="lerobot_dali.prefetch"):
        it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    assert it.prefetcher is None and "no prefetch cache" in caplog.text and "Read-only file system" in caplog.text
    got = _samples(it)
    it.close()
    assert [int(s["index"]) for s in got] == list(range(sum(LENGTHS)))


def test_a_cache_folder_on_a_read_only_disk_falls_back_to_the_users_own(tmp_path: Path, monkeypatch) -> None:
    import lerobot_dali.prefetch
    from lerobot_dali.prefetch import _open_cache

    shared, private = tmp_path / "shared", tmp_path / "private"
    open_free_slot = RangeCache.open_free_slot

    def read_only_shared(directory: Path, **kwargs):
        if shared in directory.parents:
            raise OSError(errno.EROFS, "Read-only file system", str(directory))
        return open_free_slot(directory, **kwargs)

    monkeypatch.setattr(RangeCache, "open_free_slot", read_only_shared)
    monkeypatch.setattr(lerobot_dali.prefetch, "private_cache_roots", lambda: [private])
    cache = _open_cache(shared / "ds", "ds", rank=1, cache_bytes=10**6)
    try:
        assert cache.directory == private / "prefetch" / "ds" / "rank-1"
    finally:
        cache.close()


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS], ids=["nfs-without-lock-daemon", "lustre-noflock"])
def test_a_cache_folder_without_locks_says_to_move_it(make_ds, tmp_path: Path, monkeypatch, caplog, code) -> None:
    """A cache folder on NFS without its lock daemon (ENOLCK) or on Lustre without ``-o flock`` (ENOSYS), as a
    cluster's $HOME may be, holds no prefetch cache (one writer per folder needs a lock): the warning told to give it
    a writable cache_dir=, which it was."""
    import fcntl

    from lerobot_dali.iterator import DALILeRobotIterator

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    reader = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "av1"))})
    options = dict(batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    with caplog.at_level("WARNING", logger="lerobot_dali.prefetch"):
        it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    it.close()
    assert it.prefetcher is None and os.strerror(code) in caplog.text
    assert "on a filesystem that takes file locks (flock), such as a local disk" in caplog.text
    assert "writable" not in caplog.text


def _entry_file(directory: Path, key: ByteRange) -> Path:
    (file,) = entry_dir(directory, key.path, key.version).glob(f"{key.start}-{key.end}-*")
    return file


def test_an_earlier_runs_damaged_entry_is_fetched_again_and_never_read(tmp_path: Path, caplog) -> None:
    """A byte flipped on disk between runs was served as the file's byte (a training value off by 1e-8, silently):
    an adopted entry is hidden from readers until the writer has checked it against its checksum."""
    blob = random.Random(3).randbytes(10_000)
    version = cache_version(len(blob), "e1")
    good, bad = ByteRange("f.bin", 0, 4000, version), ByteRange("f.bin", 4000, 10_000, version)
    first = RangeCache(tmp_path / "cache", max_bytes=10**6)
    first.acquire("ep", [good, bad], _fetcher(blob, []))
    first.close()
    damaged = _entry_file(tmp_path / "cache", bad)
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0x01
    damaged.write_bytes(bytes(data))
    (entry_dir(tmp_path / "cache", "f.bin", version) / "0-4000.bin").write_bytes(blob[:4000])  # an older layout

    second = RangeCache(tmp_path / "cache", max_bytes=10**6)
    assert second.bytes_cached == 10_000  # both adopted; the old-layout file deleted, not counted
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "f.bin").write_bytes(blob)
    stamps = {"f.bin": type("Stamp", (), {"size": len(blob), "version": "e1"})()}
    fs = CachedFileSystem(FakeRemoteFileSystem(str(remote)), tmp_path / "cache", stamps)
    assert fs.cat_file("f.bin") == blob and fs.counters["cached_reads"] == 0  # unchecked: read remotely
    calls: list[ByteRange] = []
    with caplog.at_level("WARNING", logger="lerobot_dali.range_cache"):
        assert second.acquire("ep", [good, bad], _fetcher(blob, calls)) == bad.size
    assert calls == [bad] and "is damaged" in caplog.text  # the intact entry reused, the damaged one fetched
    assert second.stats.reused_ranges == 1 and second.bytes_cached == 10_000 == _disk_bytes(tmp_path / "cache")
    fs = CachedFileSystem(FakeRemoteFileSystem(str(remote)), tmp_path / "cache", stamps)
    assert fs.cat_file("f.bin") == blob and fs.counters["remote_reads"] == 0  # both entries readable now
    assert sorted(p.name for p in entry_dir(tmp_path / "cache", "f.bin", version).iterdir()) == sorted(
        ["path", _entry_file(tmp_path / "cache", good).name, _entry_file(tmp_path / "cache", bad).name]
    )


def test_an_entry_cut_short_during_the_run_is_read_remotely(tmp_path: Path, caplog) -> None:
    """A truncated entry made reads stop short (1000 of 5000 bytes, no error) in the middle of the file."""
    blob = random.Random(4).randbytes(20_000)
    version = cache_version(len(blob), "e1")
    key = ByteRange("f.bin", 2000, 12_000, version)
    cache = RangeCache(tmp_path / "cache", max_bytes=10**6)
    cache.acquire("ep", [key], _fetcher(blob, []))
    entry = _entry_file(tmp_path / "cache", key)
    entry.write_bytes(entry.read_bytes()[:3000])
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "f.bin").write_bytes(blob)
    stamps = {"f.bin": type("Stamp", (), {"size": len(blob), "version": "e1"})()}
    fs = CachedFileSystem(FakeRemoteFileSystem(str(tmp_path / "remote")), tmp_path / "cache", stamps)
    with caplog.at_level("WARNING", logger="lerobot_dali.cached_filesystem"), fs.open("f.bin") as f:
        f.seek(4000)  # inside what the entry still holds, reading past it
        assert f.read(5000) == blob[4000:9000]
        f.seek(1000)
        assert f.read() == blob[1000:]
    assert "fewer than its 10000 bytes" in caplog.text and fs.counters["remote_reads"] >= 1


@pytest.mark.parametrize(("start", "end"), [(5, 5), (-1, 5), (7, 3)])
def test_a_byte_range_that_is_empty_or_starts_before_the_file_is_refused(start: int, end: int) -> None:
    """An empty range would be an entry of 0 bytes that covers no byte, and a negative start no offset a read can
    seek to: both are refused where they are made, naming the range."""
    with pytest.raises(ValueError, match=rf"byte range of f must satisfy 0 <= start < end, got \[{start}, {end}\)"):
        ByteRange("f", start, end)
    assert ByteRange("f", 0, 1).size == 1 and ByteRange("f", 4, 9).size == 5


def test_a_fetch_longer_than_its_range_raises_and_writes_nothing(tmp_path: Path) -> None:
    """Only the exact length is a range's bytes: a fetch that answers more (a server ignoring the range's end) is
    refused like a short one, not stored as an entry larger than what the bound counted."""
    blob = random.Random(17).randbytes(5000)
    cache = RangeCache(tmp_path / "cache", max_bytes=4000)
    key = ByteRange("f.bin", 0, 4000, cache_version(5000, "e1"))
    with pytest.raises(OSError, match=r"f\.bin: fetched 4001 bytes for range \[0, 4000\)"):
        cache.acquire("a", [key], lambda k: blob[k.start : k.end + 1])
    assert cache.bytes_cached == 0 == _disk_bytes(tmp_path / "cache") and not cache.holds(key)


def test_a_released_range_taken_again_is_not_evicted_while_held(tmp_path: Path) -> None:
    """A released entry reused by the next owner leaves the evictable ones: room made for another range evicts what
    is still released, never the range an owner holds again."""
    blob = random.Random(18).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    first, second = ByteRange("p", 0, 600), ByteRange("p", 600, 1000)
    cache.acquire("a", [first, second], _fetcher(blob, []))
    cache.release("a")
    calls: list[ByteRange] = []
    assert cache.acquire("b", [first], _fetcher(blob, calls)) == 0  # reused: held by b again
    cache.acquire("c", [ByteRange("q", 0, 400)], _fetcher(blob, calls))  # room: only `second` may go
    assert cache.holds(first) and not cache.holds(second) and cache.stats.evicted_ranges == 1
    cache.acquire("d", [ByteRange("r", 0, 1)], _fetcher(blob, calls))  # full of held ranges: refused
    assert cache.holds(first) and cache.stats.refused_ranges == 1 and cache.bytes_cached == 1000
    [(start, end, file)] = list_entries(entry_dir(tmp_path, "p"))
    assert (start, end, file.read_bytes()) == (0, 600, blob[:600])


def test_a_released_range_taken_again_is_evictable_once_its_new_owner_releases_it(tmp_path: Path) -> None:
    """The owner that reused a released entry holds it until its own release, then lets it go like one it fetched:
    room made for another range evicts it, not kept held for an owner gone."""
    blob = random.Random(24).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    taken = ByteRange("p", 0, 600)
    cache.acquire("a", [taken], _fetcher(blob, []))
    cache.release("a")
    cache.acquire("b", [taken], _fetcher(blob, []))  # reused
    assert cache.owners() == ["b"]
    cache.release("b")
    assert cache.owners() == []
    cache.acquire("c", [ByteRange("q", 0, 800)], _fetcher(blob, []))
    assert not cache.holds(taken) and cache.stats.evicted_ranges == 1 and cache.stats.refused_ranges == 0
    assert cache.bytes_cached == 800 == _disk_bytes(tmp_path)


def test_a_range_stays_held_by_the_owner_that_fetched_it_when_a_sharer_releases_it(tmp_path: Path) -> None:
    """The owner that fetched a range holds it as much as one that reused it: the sharer's release leaves it held, so
    room made for another range does not evict it."""
    blob = random.Random(19).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    shared = ByteRange("p", 0, 600)
    cache.acquire("a", [shared], _fetcher(blob, []))  # fetched by a
    cache.acquire("b", [shared], _fetcher(blob, []))  # reused by b
    cache.acquire("x", [ByteRange("p", 600, 1000)], _fetcher(blob, []))
    cache.release("b")  # a still holds it
    cache.release("x")
    cache.acquire("c", [ByteRange("q", 0, 400)], _fetcher(blob, []))
    assert cache.holds(shared) and not cache.holds(ByteRange("p", 600, 1000)) and cache.stats.evicted_ranges == 1
    cache.acquire("d", [ByteRange("r", 0, 1)], _fetcher(blob, []))
    assert cache.holds(shared) and cache.stats.refused_ranges == 1


def test_a_range_an_owner_already_holds_is_neither_fetched_nor_counted_again(tmp_path: Path) -> None:
    """An owner acquiring a range it holds (its episode admitted again before its release) saves no request: no
    fetch, no reuse counted, and one release lets it go."""
    blob = bytes(range(100))
    cache = RangeCache(tmp_path, max_bytes=100)
    key = ByteRange("p", 0, 100)
    calls: list[ByteRange] = []
    assert cache.acquire("a", [key], _fetcher(blob, calls)) == 100
    assert cache.acquire("a", [key, key], _fetcher(blob, calls)) == 0
    assert calls == [key] and cache.stats.fetched_ranges == 1 and cache.stats.reused_ranges == 0
    cache.release("a")
    cache.acquire("b", [ByteRange("q", 0, 100)], _fetcher(blob, calls))  # a's range is evictable after one release
    assert not cache.holds(key) and cache.bytes_cached == 100 == _disk_bytes(tmp_path)


def test_an_evicted_range_no_longer_counts_as_evictable(tmp_path: Path) -> None:
    """Bytes freed by evicting are no longer evictable: a range that does not fit beside the held ones afterwards is
    refused evicting nothing, not after evicting the released entries it counted twice."""
    blob = random.Random(20).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    cache.acquire("a", [ByteRange("p", 0, 400)], _fetcher(blob, []))
    cache.release("a")
    cache.acquire("b", [ByteRange("p", 200, 1000)], _fetcher(blob, []))  # 800 held: evicts a's 400
    released = ByteRange("q", 0, 200)
    cache.acquire("c", [released], _fetcher(blob, []))
    cache.release("c")  # 1000 cached, 200 of them evictable
    cache.acquire("d", [ByteRange("r", 0, 300)], _fetcher(blob, []))  # 800 held + 300 > 1000
    assert cache.stats.refused_ranges == 1 and cache.stats.evicted_ranges == 1 and cache.holds(released)
    assert cache.bytes_cached == 1000 == _disk_bytes(tmp_path)


@pytest.mark.parametrize("name", ["10-10-00000000.bin", "10-10-00000000.adopted"])
def test_an_earlier_runs_file_naming_an_empty_range_is_deleted_not_adopted(tmp_path: Path, name: str) -> None:
    """A file in an entry's folder named as an entry of no bytes (its size matches: 0) is no entry this cache writes:
    the next run deletes it and opens (adopting it raised ValueError), keeping the true entry beside it."""
    blob = bytes(range(100))
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, []))
    first.close()
    odd = entry_dir(tmp_path, "p", "v1") / name
    odd.write_bytes(b"")
    second = RangeCache(tmp_path, max_bytes=1000)
    assert not odd.exists() and second.bytes_cached == 100 == _disk_bytes(tmp_path)
    calls: list[ByteRange] = []
    assert second.acquire("b", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, calls)) == 0 and calls == []


def test_an_earlier_runs_entry_cut_short_is_deleted_and_fetched_again(tmp_path: Path) -> None:
    """An entry cut short between runs (a crash as the disk filled) is no entry: adoption deletes it rather than
    counting bytes the disk does not hold, and the range is fetched again whole."""
    blob = random.Random(21).randbytes(3000)
    keys = [ByteRange("p", 0, 1000, "v1"), ByteRange("p", 1000, 3000, "v1")]
    first = RangeCache(tmp_path, max_bytes=10_000)
    first.acquire("a", keys, _fetcher(blob, []))
    first.close()
    cut = _entry_file(tmp_path, keys[1])
    cut.write_bytes(cut.read_bytes()[:1500])
    second = RangeCache(tmp_path, max_bytes=10_000)
    assert not cut.exists() and second.bytes_cached == 1000 == _disk_bytes(tmp_path)
    calls: list[ByteRange] = []
    assert second.acquire("b", keys, _fetcher(blob, calls)) == 2000 and calls == [keys[1]]
    readable = [(a, b, f.read_bytes()) for a, b, f in list_entries(entry_dir(tmp_path, "p", "v1"))]
    assert readable == [(0, 1000, blob[:1000]), (1000, 3000, blob[1000:])]


def test_a_file_named_as_an_entry_but_for_its_suffix_is_no_entry(tmp_path: Path) -> None:
    """Only ``<start>-<end>-<crc32>.bin`` is an entry readers may read: a file that differs in its suffix alone (a
    copy another tool left, ``.bak``) is not listed, and the next run deletes it rather than adopting it, whatever
    its bytes and checksum."""
    blob = bytes(range(100))
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, []))
    folder = entry_dir(tmp_path, "p", "v1")
    odd = folder / f"100-200-{zlib.crc32(blob):08x}.bak"
    odd.write_bytes(blob)
    assert [(start, end) for start, end, _ in list_entries(folder)] == [(0, 100)]
    first.close()
    second = RangeCache(tmp_path, max_bytes=1000)
    assert not odd.exists() and second.bytes_cached == 100
    assert sorted(p.name for p in folder.iterdir()) == [f"0-100-{zlib.crc32(blob):08x}.adopted", "path"]


def test_clear_deletes_every_entry_held_or_released_and_the_next_acquire_fetches_again(tmp_path: Path) -> None:
    """clear() (a test stalls a prefetch with it) leaves no entry on disk, held or released, nor one the cache
    counts: readers find none, and the next acquire of those ranges fetches them again."""
    blob = bytes(range(200))
    cache = RangeCache(tmp_path, max_bytes=1000)
    held, released = ByteRange("p", 0, 100), ByteRange("p", 100, 200)
    cache.acquire("a", [held], _fetcher(blob, []))
    cache.acquire("b", [released], _fetcher(blob, []))
    cache.release("b")
    cache.clear()
    assert not cache.holds(held) and not cache.holds(released) and cache.owners() == []
    assert cache.bytes_cached == 0 == _disk_bytes(tmp_path) and list_entries(entry_dir(tmp_path, "p")) == []
    calls: list[ByteRange] = []
    assert cache.acquire("c", [held, released], _fetcher(blob, calls)) == 200 and calls == [held, released]
    assert cache.bytes_cached == 200 == _disk_bytes(tmp_path)


def test_range_cache_stats_count_each_range_and_byte_fetched_reused_evicted_and_refused(tmp_path: Path) -> None:
    """``prefetcher.stats`` counts what the cache did, range by range and byte by byte: what a run reports of its
    requests saved and its disk churn."""
    blob = random.Random(22).randbytes(2000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    old, kept = ByteRange("p", 0, 300), ByteRange("p", 300, 700)
    cache.acquire("a", [old, kept], _fetcher(blob, []))
    cache.release("a")
    cache.acquire("b", [kept], _fetcher(blob, []))  # reused
    cache.acquire("c", [ByteRange("q", 0, 500)], _fetcher(blob, []))  # evicts `old` (300 bytes)
    cache.acquire("d", [ByteRange("r", 0, 200)], _fetcher(blob, []))  # held ones fill the cache: refused
    assert dataclasses.asdict(cache.stats) == {
        "fetched_ranges": 3, "fetched_bytes": 1200, "reused_ranges": 1, "evicted_ranges": 1, "evicted_bytes": 300,
        "refused_ranges": 1,
    }  # fmt: skip
    assert cache.bytes_cached == 900 == _disk_bytes(tmp_path)


def test_a_released_range_taken_again_no_longer_counts_as_evictable(tmp_path: Path) -> None:
    """A released entry reused leaves the bytes that evicting could free: a range that does not fit beside the held
    ones afterwards is refused evicting nothing, not after evicting the released entries for room counted twice."""
    blob = random.Random(23).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    taken = ByteRange("p", 0, 400)
    cache.acquire("a", [taken], _fetcher(blob, []))
    cache.release("a")
    cache.acquire("b", [taken], _fetcher(blob, []))  # reused: held again
    released = ByteRange("q", 0, 300)
    cache.acquire("c", [released], _fetcher(blob, []))
    cache.release("c")  # 700 cached, 300 of them evictable
    cache.acquire("d", [ByteRange("r", 0, 700)], _fetcher(blob, []))  # 400 held + 700 > 1000
    assert cache.stats.refused_ranges == 1 and cache.stats.evicted_ranges == 0 and cache.holds(released)
    assert cache.bytes_cached == 700 == _disk_bytes(tmp_path)


def test_a_folder_inside_an_entrys_folder_is_deleted_and_the_cache_opens(tmp_path: Path) -> None:
    """A folder in an entry's folder (put there by hand or by another tool), labelled or not, is no entry: the next
    run deletes it with what it holds and opens, adopting the true entry beside it (it raised IsADirectoryError)."""
    blob = bytes(range(100))
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, []))
    first.close()
    stray = entry_dir(tmp_path, "p", "v1") / "0-100-00000000.bin.d"
    (stray / "inner").mkdir(parents=True)
    (stray / "inner" / "x").write_bytes(b"x")
    unlabelled = entry_dir(tmp_path, "q", "v1")
    (unlabelled / "sub").mkdir(parents=True)
    second = RangeCache(tmp_path, max_bytes=1000)
    assert not stray.exists() and not unlabelled.exists()
    assert second.bytes_cached == 100 == _disk_bytes(tmp_path)
    calls: list[ByteRange] = []
    assert second.acquire("b", [ByteRange("p", 0, 100, "v1")], _fetcher(blob, calls)) == 0 and calls == []


def test_an_unlabelled_folder_an_earlier_run_left_goes_without_a_warning(tmp_path: Path, caplog) -> None:
    """A folder without its label (a run killed as it made it) is deleted with whatever it holds, as a crash's
    leftover, not warned of as a folder whose label names another."""
    RangeCache(tmp_path, max_bytes=1000).close()
    unlabelled = entry_dir(tmp_path, "q", "v1")
    unlabelled.mkdir()
    (unlabelled / "0-10-00000000.bin").write_bytes(bytes(10))
    with caplog.at_level("WARNING", logger="lerobot_dali.range_cache"):
        cache = RangeCache(tmp_path, max_bytes=1000)
    assert not unlabelled.exists() and cache.bytes_cached == 0 and caplog.text == ""


def test_after_clear_eviction_counts_only_the_entries_released_since(tmp_path: Path) -> None:
    """clear() forgets the released entries too: none counted as evictable that is gone (a range that cannot fit
    evicted the others before its refusal), none evicted that is held again since (the held range's file deleted)."""
    blob = random.Random(26).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    held, released = ByteRange("p", 0, 100), ByteRange("p", 100, 200)
    cache.acquire("a", [held, released], _fetcher(blob, []))
    cache.release("a")
    cache.clear()
    cache.acquire("c", [held, released], _fetcher(blob, []))  # held again: 200
    cache.acquire("d", [ByteRange("q", 0, 500)], _fetcher(blob, []))
    evictable = ByteRange("q", 500, 800)
    cache.acquire("e", [evictable], _fetcher(blob, []))
    cache.release("e")  # 1000 cached, 300 evictable
    cache.acquire("f", [ByteRange("r", 0, 400)], _fetcher(blob, []))  # 700 held + 400: refused
    assert cache.stats.refused_ranges == 1 and cache.stats.evicted_ranges == 0 and cache.holds(evictable)
    cache.acquire("g", [ByteRange("r", 0, 300)], _fetcher(blob, []))  # fits once `evictable` goes
    assert cache.stats.evicted_ranges == 1 and not cache.holds(evictable)
    assert cache.holds(held) and cache.holds(released) and cache.bytes_cached == 1000 == _disk_bytes(tmp_path)


def test_a_run_adopting_an_earlier_runs_entries_says_how_many(tmp_path: Path, caplog) -> None:
    """The one line telling a restart starts warm: the ranges and bytes adopted; a cache adopting none says nothing."""
    with caplog.at_level(logging.INFO, logger="lerobot_dali.range_cache"):
        first = RangeCache(tmp_path, max_bytes=1000)
        first.acquire("a", [ByteRange("p", 0, 100), ByteRange("p", 100, 300)], _fetcher(bytes(300), []))
        first.close()
        assert "adopted" not in caplog.text
        RangeCache(tmp_path, max_bytes=1000).close()
    assert f"prefetch cache {tmp_path}: adopted 2 range(s), 300 bytes" in caplog.text


def test_a_released_entry_whose_file_vanished_is_evicted_without_an_error(tmp_path: Path) -> None:
    """An entry's file deleted behind the cache's back (by hand, a tmp cleaner) is evicted like any other when room
    is needed, or by clear(): no FileNotFoundError out of acquire (a prefetch failed), and the bytes it counted are
    freed."""
    blob = random.Random(25).randbytes(1000)
    cache = RangeCache(tmp_path, max_bytes=1000)
    gone = ByteRange("p", 0, 600)
    cache.acquire("a", [gone], _fetcher(blob, []))
    cache.release("a")
    _entry_file(tmp_path, gone).unlink()
    calls: list[ByteRange] = []
    assert cache.acquire("b", [ByteRange("q", 0, 800)], _fetcher(blob, calls)) == 800 and len(calls) == 1
    assert not cache.holds(gone) and cache.stats.evicted_ranges == 1 and cache.bytes_cached == 800
    _entry_file(tmp_path, ByteRange("q", 0, 800)).unlink()  # held, and gone too: clear() deletes the rest
    cache.clear()
    assert cache.bytes_cached == 0 == _disk_bytes(tmp_path)


# -- read-through files -------------------------------------------------------------------------------------
def test_cached_file_reads_equal_remote_bytes_and_skip_the_remote_when_covered(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    root.mkdir()
    blob = random.Random(5).randbytes(100_000)
    (root / "f.bin").write_bytes(blob)
    fake = FakeRemoteFileSystem(str(root))
    size, version = 100_000, cache_version(100_000, "e1")
    stamps = {"f.bin": type("Stamp", (), {"size": size, "version": "e1"})()}
    cache_dir = tmp_path / "cache"
    cache = RangeCache(cache_dir, max_bytes=10**6)
    cache.acquire("ep", [ByteRange("f.bin", 1000, 5000, version), ByteRange("f.bin", 20_000, 30_000, version)],
                  lambda k: blob[k.start : k.end])  # fmt: skip
    fs = CachedFileSystem(fake, cache_dir, stamps)
    before = fake.requests.copy()
    with fs.open("f.bin") as f:  # fully covered reads: no request at all
        f.seek(1500)
        assert f.read(3000) == blob[1500:4500]
        f.seek(21_000)
        assert f.read(9000) == blob[21_000:30_000]
        assert f.seek(0, 2) == size
    assert fake.requests == before and fs.counters["remote_reads"] == 0
    rng = random.Random(6)
    with fs.open("f.bin") as f:
        for _ in range(50):
            start = rng.randrange(size)
            n = rng.randrange(1, 40_000)
            f.seek(start)
            assert f.read(n) == blob[start : start + n]
    assert fs.counters["remote_reads"] > 0 and fs.counters["cached_reads"] > 0
    assert fs.cat_file("f.bin", 999, 5001) == blob[999:5001]


def _partly_cached(
    tmp_path: Path, *, seed: int, cached: tuple[int, int], on_remote: int | None = None
) -> tuple[bytes, CachedFileSystem]:
    """A 5,000-byte f.bin listed (stamped) whole, bytes ``cached`` of it in the prefetch cache, and a CachedFileSystem
    over it; the remote file holds its first ``on_remote`` bytes (all where None)."""
    blob = random.Random(seed).randbytes(5000)
    (tmp_path / "f.bin").write_bytes(blob[:on_remote])
    version = cache_version(len(blob), "e1")
    RangeCache(tmp_path / "cache", max_bytes=10**6).acquire(
        "ep", [ByteRange("f.bin", *cached, version)], lambda k: blob[k.start : k.end]
    )
    stamps = {"f.bin": type("Stamp", (), {"size": len(blob), "version": "e1"})()}
    return blob, CachedFileSystem(FakeRemoteFileSystem(str(tmp_path)), tmp_path / "cache", stamps)


def test_cat_file_counts_negative_bounds_from_the_end(tmp_path: Path) -> None:
    """fsspec's cat_file takes a negative start/end as counted from the end; the cache raised ValueError for a
    negative start (3 of 9 probed ranges wrong). Each range equals the slice fsspec's own cat_file returns."""
    _, fs = _partly_cached(tmp_path, seed=11, cached=(1000, 4990))
    remote = FakeRemoteFileSystem(str(tmp_path))
    for start, end in [(-10, None), (-100, -10), (-6000, 10), (10, -10), (4990, 6000), (None, -4000), (0, 0)]:
        assert fs.cat_file("f.bin", start, end) == remote.cat_file("f.bin", start, end), (start, end)
    assert fs.counters["cached_reads"] > 0 and fs.counters["remote_reads"] > 0


def test_cat_file_from_byte_zero_and_ranges_ending_before_they_start(tmp_path: Path) -> None:
    """A start of 0 is the file's first byte, not a bound counted from the end; a range ending at or before its start
    is empty, as the slice of the file's bytes is, not the rest of the file."""
    blob, fs = _partly_cached(tmp_path, seed=22, cached=(1000, 3000))
    remote = FakeRemoteFileSystem(str(tmp_path))
    assert fs.cat_file("f.bin", 0, 10) == blob[:10] == remote.cat_file("f.bin", 0, 10)
    assert fs.cat_file("f.bin", 0, 2000) == blob[:2000]  # remote gap, then the entry
    assert fs.cat_file("f.bin", 0) == blob and fs.cat_file("f.bin", 0, -4990) == blob[:10]
    for start, end in [(2500, 1500), (100, 50), (-10, -20), (3000, 3000)]:
        assert fs.cat_file("f.bin", start, end) == b"" == blob[start:end], (start, end)


def test_a_file_rewritten_with_another_size_under_the_same_version_is_not_read_from_old_entries(tmp_path: Path) -> None:
    """A file's cache version names its size as well as its etag/mtime: a file replaced within the mtime's second
    (the same version string) by one of another size reads its new bytes, never the old content's entries."""
    old, fs = _partly_cached(tmp_path, seed=24, cached=(0, 5000))
    new = random.Random(25).randbytes(6000)
    (tmp_path / "f.bin").write_bytes(new)
    stamps = {"f.bin": type("Stamp", (), {"size": len(new), "version": "e1"})()}
    fs = CachedFileSystem(FakeRemoteFileSystem(str(tmp_path)), tmp_path / "cache", stamps)
    assert fs.cat_file("f.bin", 100, 200) == new[100:200] != old[100:200]
    assert fs.cat_file("f.bin") == new and fs.counters["cached_reads"] == 0


def test_a_remote_file_shorter_than_its_listing_raises_instead_of_reading_short(tmp_path: Path) -> None:
    """A remote file cut to 3,000 of its listed 5,000 bytes read back 3,000 bytes without a word, whatever the
    cache held past the cut; now the read names the file, the byte it ends at and the fix."""
    blob, fs = _partly_cached(tmp_path, seed=12, cached=(4000, 5000), on_remote=3000)
    with fs.open("f.bin") as f:
        assert f.read(2000) == blob[:2000]  # before the cut: read as listed
        with pytest.raises(DataFileError, match=r"f\.bin ends at byte 3000, but the dataset listed it with 5000"):
            f.read()
        f.seek(4000)
        assert f.read() == blob[4000:]  # the cached range past the cut is still the listed content


def test_a_fetch_of_the_wrong_length_raises_and_frees_its_room(tmp_path: Path) -> None:
    """A fetch that returns fewer bytes than its range is refused with OSError; the room it reserved and the range
    are free again, so the next acquire of that range fetches it (and nothing of the short bytes is on disk)."""
    blob = random.Random(13).randbytes(4000)
    cache = RangeCache(tmp_path / "cache", max_bytes=4000)
    key = ByteRange("f.bin", 0, 4000, cache_version(4000, "e1"))
    with pytest.raises(OSError, match=r"f\.bin: fetched 3999 bytes for range \[0, 4000\)"):
        cache.acquire("a", [key], lambda k: blob[k.start : k.end - 1])
    assert cache.bytes_cached == 0 and not cache.holds(key)
    assert cache.acquire("b", [key], lambda k: blob[k.start : k.end]) == 4000  # the whole bound is free again
    [(start, end, file)] = list_entries(entry_dir(tmp_path / "cache", "f.bin", key.version))
    assert (start, end) == (0, 4000) and file.read_bytes() == blob


def test_an_entry_evicted_after_listing_is_read_remotely(tmp_path: Path) -> None:
    """An entry listed by an open file, then evicted by the prefetcher before the read reaches it, is read from the
    remote file: the bytes equal the file's, and the one left entry is still served locally."""
    blob = random.Random(14).randbytes(6000)
    (tmp_path / "f.bin").write_bytes(blob)
    version = cache_version(len(blob), "e1")
    cache = RangeCache(tmp_path / "cache", max_bytes=10**6)
    keys = [ByteRange("f.bin", 0, 3000, version), ByteRange("f.bin", 3000, 6000, version)]
    for owner, key in zip(("a", "b"), keys, strict=True):
        cache.acquire(owner, [key], lambda k: blob[k.start : k.end])
    stamps = {"f.bin": type("Stamp", (), {"size": len(blob), "version": "e1"})()}
    fs = CachedFileSystem(FakeRemoteFileSystem(str(tmp_path)), tmp_path / "cache", stamps)
    with fs.open("f.bin") as f:
        assert f.read(100) == blob[:100]  # lists both entries, opens the first
        cache.release("b")
        cache.acquire("other", [ByteRange("g.bin", 0, 10**6 - 3000, version)], lambda k: bytes(k.size))  # evicts
        assert not cache.holds(keys[1]) and cache.holds(keys[0])
        assert f.read() == blob[100:]
    assert fs.counters["remote_bytes"] == 3000 and fs.counters["cached_bytes"] == 3000


def test_a_cached_file_reads_through_a_buffered_reader_and_refuses_bad_seeks(tmp_path: Path) -> None:
    """io.BufferedReader reads a CachedRangeFile through readinto: every chunk, across the cached/remote boundary,
    equals the file's bytes; a seek before byte 0 or with an unknown whence raises ValueError naming the problem."""
    blob, fs = _partly_cached(tmp_path, seed=15, cached=(1500, 3500))
    with io.BufferedReader(fs.open("f.bin"), buffer_size=700) as f:
        assert [f.read(333) for _ in range(16)] == [blob[i : i + 333] for i in range(0, 16 * 333, 333)]
        f.seek(1400)
        assert f.read(2200) == blob[1400:3600]
    assert fs.counters["cached_bytes"] == 4000 and fs.counters["remote_bytes"] > 0
    with fs.open("f.bin") as raw:
        with pytest.raises(ValueError, match="negative seek position -1 in f.bin"):
            raw.seek(-1)
        with pytest.raises(ValueError, match="invalid whence 7"):
            raw.seek(0, 7)
        assert raw.seek(-10, io.SEEK_END) == 4990 and raw.read() == blob[-10:]


def test_a_cached_file_holds_one_entry_open_however_many_it_reads(tmp_path: Path) -> None:
    """A long-lived parquet file read through the cache held one open file per entry, evicted ones included."""
    blob = random.Random(7).randbytes(40_000)
    cache_dir = tmp_path / "cache"
    version = cache_version(len(blob), "e1")
    cache = RangeCache(cache_dir, max_bytes=10**6)
    keys = [ByteRange("f.bin", start, start + 1000, version) for start in range(0, 40_000, 1000)]
    cache.acquire("ep", keys, lambda k: blob[k.start : k.end])
    stamps = {"f.bin": type("Stamp", (), {"size": len(blob), "version": "e1"})()}
    fs = CachedFileSystem(FakeRemoteFileSystem(str(tmp_path)), cache_dir, stamps)
    with fs.open("f.bin") as f:
        for key in keys:
            f.seek(key.start + 10)
            assert f.read(500) == blob[key.start + 10 : key.start + 510]
            assert len(open_files_under(cache_dir / entry_dir("", "f.bin", version).name)) <= 1
    assert fs.counters["cached_reads"] == len(keys) and fs.counters["remote_reads"] == 0
    assert open_files_under(cache_dir / entry_dir("", "f.bin", version).name) == []


def test_episode_ranges_cover_every_read_of_the_episode(make_ds, tmp_path: Path) -> None:
    """Reading an episode's rows and clips through a cache that holds only its ranges touches no remote byte."""
    from lerobot_dali.clips import build_clip
    from lerobot_dali.packet_index_cache import load_packet_index

    root = _dataset(make_ds, "h264")
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    fs = remote.location.fs
    cache_dir = tmp_path / "cache"
    cache = RangeCache(cache_dir, max_bytes=10**8)
    cached_fs = CachedFileSystem(fs, cache_dir)
    ranges = EpisodeRanges(remote)
    for pos in range(remote.num_episodes):
        keys = [ByteRange(p, a, b, cached_fs.identity(p)[1]) for p, a, b in ranges.ranges(pos)]
        cache.acquire(pos, keys, lambda k: fs.cat_file(k.path, start=k.start, end=k.end))
    reader = remote.with_location(dataclasses.replace(remote.location, fs=cached_fs))
    for pos in range(reader.num_episodes):
        rows = reader.read_episode(pos)
        np.testing.assert_array_equal(rows["frame_index"], np.arange(LENGTHS[pos]))
        for camera in reader.camera_keys:
            video = reader.video(pos, camera)
            index = load_packet_index(video.path, filesystem=fs)
            first = int(np.searchsorted(index.frame_pts_s, video.from_timestamp_s - 1e-6))
            for frame in (first, first + LENGTHS[pos] - 1):
                build_clip(video.path, index, [frame], filesystem=cached_fs)
    assert cached_fs.counters["remote_reads"] == 0 and cached_fs.counters["cached_reads"] > 0


def test_prefetch_threads_admitting_episodes_of_one_data_file_read_its_footer_once(make_ds, monkeypatch) -> None:
    """A v3.0 data file holds many episodes, and the prefetcher admits the pool's episodes 8 threads at once: each
    thread missed the footer the others were reading and read it too (8 footer reads of one file at warm-up, each
    an open and a ranged read over the network)."""
    import threading
    from multiprocessing.pool import ThreadPool

    root = make_ds(episodes=8, frames_per_episode=5, cameras=1, codec="vp9", fps=10, episodes_per_file=8)
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    opened: list[str] = []
    all_asked = threading.Barrier(8, timeout=30)
    real_open = remote.open

    def slow_open(path: str):
        opened.append(path)
        time.sleep(0.05)  # (a request's latency: the other threads ask meanwhile)
        return real_open(path)

    monkeypatch.setattr(remote, "open", slow_open)
    ranges = EpisodeRanges(remote)

    def admit(pos: int) -> list[tuple[str, int, int]]:
        all_asked.wait()
        return ranges.parquet_ranges(pos)

    with ThreadPool(8) as pool:
        admitted = pool.map(admit, range(8))
    assert opened == [remote.data_path(0)]
    assert admitted == [ranges.parquet_ranges(pos) for pos in range(8)] and len(opened) == 1


def test_footers_past_max_parquet_files_are_dropped_oldest_first(make_ds, monkeypatch) -> None:
    """At most 2 files' footers are kept, the least recently asked dropped: episodes of files 0, 1, 2, 1, 0, 1 read
    file 0's footer again (dropped for 2's), 1's once (asked again before 0's came back, it was 2's that went)."""
    root = make_ds(episodes=3, frames_per_episode=5, cameras=1, codec="vp9", fps=10, episodes_per_file=1)
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    opened: list[str] = []
    real_open = remote.open
    monkeypatch.setattr(remote, "open", lambda path: opened.append(path) or real_open(path))
    ranges = EpisodeRanges(remote, max_parquet_files=2)
    for pos in (0, 1, 2, 1, 0, 1):
        ranges.parquet_ranges(pos)
    assert opened == [remote.data_path(pos) for pos in (0, 1, 2, 0)]


def test_video_ranges_read_indexes_through_the_store_given(make_ds, tmp_path) -> None:
    """The prefetcher's packet index store serves EpisodeRanges too: each video an episode's ranges index is kept there
    (one file a camera), so a worker or a later run reads it from there, not the video's packets from the server."""
    from lerobot_dali.packet_index_store import PacketIndexStore

    root = _dataset(make_ds, "h264")
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    store = PacketIndexStore(tmp_path / "indexes")
    spans = EpisodeRanges(remote, index_store=store).video_ranges(0)
    assert [path for path, _, _ in spans] == [remote.video(0, camera).path for camera in remote.camera_keys]
    assert len([p for p in store.directory.rglob("*") if p.is_file()]) == len(remote.camera_keys) > 0
    assert EpisodeRanges(remote).video_ranges(0) == spans


def test_episode_ranges_hold_bounded_caches_by_default(make_ds) -> None:
    """By default at most 64 files' footers, and packet indexes up to 256 or 512 MiB: a prefetcher over a dataset of
    thousands of files keeps no more (the eviction itself: test_footers_past_max_parquet_files_are_dropped_...)."""
    remote = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "h264"))})
    ranges = EpisodeRanges(remote)
    assert (ranges._max_parquet, ranges._indexes.max_entries, ranges._indexes.max_bytes) == (64, 256, 512 * 2**20)


# -- the iterator over a fake remote ---------------------------------------------------------------------------
def test_iterator_prefetches_and_a_warm_second_epoch_makes_no_data_requests(make_ds, tmp_path: Path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "av1")
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=5, episode_pool_size=2, device="cpu",
                   num_workers=0, drop_last=False)  # fmt: skip
    local_it = DALILeRobotIterator(root, **options)
    local = [_samples(local_it), _samples(local_it)]
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    fake = reader.location.fs.fs
    it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    assert it.prefetcher is not None
    first = _samples(it)
    after_first = {k: fake.requests[k] for k in DATA_KINDS}
    second = _samples(it)
    after_second = {k: fake.requests[k] for k in DATA_KINDS}
    stats = it.prefetcher.stats
    assert stats.fetched_ranges > 0 and stats.refused_ranges == 0
    it.close()
    for got, want in zip([first, second], local, strict=True):
        assert [int(s["index"]) for s in got] == [int(s["index"]) for s in want]
        assert sorted(int(s["index"]) for s in got) == list(range(sum(LENGTHS)))
        for a, b in zip(want, got, strict=True):
            for key in a:
                if isinstance(a[key], torch.Tensor):
                    assert torch.equal(a[key], b[key]), key
            _check_sample(b)
    assert after_second == after_first, "a warm second epoch must not read remote data"
    assert it.prefetcher is None
    # The next run adopts the entries: each is checked against its checksum and reused, none fetched again.
    again = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    restarted = _samples(again)
    assert again.prefetcher is not None
    stats = again.prefetcher.stats
    again.close()
    assert stats.reused_ranges > 0 and stats.fetched_ranges == 0
    assert [int(s["index"]) for s in restarted] == [int(s["index"]) for s in local[0]]


def test_a_cache_smaller_than_the_pool_stays_in_bounds_and_changes_no_sample(make_ds, tmp_path: Path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "h264")
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=2, episode_pool_size=3, device="cpu",
                   num_workers=0, drop_last=False)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, **options))
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    bound = 12_000
    it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=bound / 1e9, **options)
    remote = _samples(it)
    stats, cache = it.prefetcher.stats, it.prefetcher.cache
    it.close()  # the prefetcher may still be fetching ahead: its reserved bytes are not on disk yet
    deadline = time.monotonic() + 10
    while cache._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.bytes_cached <= bound and _disk_bytes(tmp_path / "cache") == cache.bytes_cached
    assert stats.refused_ranges + stats.evicted_ranges > 0  # the bound did bite
    assert [int(s["index"]) for s in remote] == [int(s["index"]) for s in local]
    for a, b in zip(local, remote, strict=True):
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key


def test_remote_frames_resized_in_the_worker_equal_local(make_ds, tmp_path: Path) -> None:
    """Remote MP4 cameras decode from byte-ranged packets, local ones from the file: same pixels, resized too."""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "h264")
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=3, episode_pool_size=2, device="cpu",
                   num_workers=0, drop_last=False, image_size=(24, 40), return_uint8=True)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, **options))
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    remote = _samples(it)
    it.close()
    assert [int(s["index"]) for s in remote] == [int(s["index"]) for s in local]
    for a, b in zip(local, remote, strict=True):
        for camera in reader.camera_keys:
            assert b[camera].shape[-2:] == (24, 40)
            assert torch.equal(a[camera], b[camera]), camera


def _pool_prefetcher(
    make_ds, cache_dir: Path | None, *, rank: int = 0, lookahead: int = 3, local_too: bool = False, **options
):
    """A prefetcher over the AV1 test dataset served by the fake remote (``local_too``: in a union before the same
    dataset read from disk; pool of 2 and lookahead 3 unless told; ``options`` for its order's
    :class:`OrderOptions`), and its order."""
    from lerobot_dali import concat_datasets
    from lerobot_dali.prefetch import prefetching_reader

    local = _dataset(make_ds, "av1")
    reader = open_dataset("fakeremote://", storage_options={"root": str(local)})
    if local_too:
        reader = concat_datasets([reader, local])
    options = OrderOptions(**{"seed": 1, "episode_pool_size": 2, **options})
    order = SampleOrder(reader.episodes.length, rank=0, world_size=1, options=options)
    _, prefetcher = prefetching_reader(
        reader, order, rank=rank, lookahead=lookahead, cache_dir=cache_dir, cache_bytes=10**8
    )
    assert prefetcher is not None
    return prefetcher, order


def test_only_a_remote_dataset_given_bytes_for_it_wants_a_prefetch_cache() -> None:
    from types import SimpleNamespace

    from lerobot_dali.prefetch import wants_prefetch_cache

    remote, local = (SimpleNamespace(location=SimpleNamespace(is_local=is_local)) for is_local in (False, True))
    asked = [(remote, 1), (remote, 0), (local, 1)]
    assert [wants_prefetch_cache(reader, cache_bytes) for reader, cache_bytes in asked] == [True, False, False]


def test_a_prefetch_cache_without_cache_dir_is_one_folder_per_dataset_under_the_cache_root(make_ds) -> None:
    """``cache_dir=None``: each rank's slot is ``<cache root>/prefetch/<16 hex of the description>/rank-N``, and the
    ranges it fetched are the bytes on disk there."""
    import hashlib

    from lerobot_dali.cache_dirs import cache_root

    for rank in (0, 1):
        prefetcher, _ = _pool_prefetcher(make_ds, None, rank=rank)
        name = hashlib.sha256(prefetcher.reader.location.description.encode()).hexdigest()[:16]
        try:
            assert prefetcher.cache.directory == cache_root() / "prefetch" / name / f"rank-{rank}"
            prefetcher.warm(0, 0, progress=False)
            assert prefetcher.stats.fetched_ranges > 0
        finally:
            prefetcher.close()
        assert _disk_bytes(cache_root() / "prefetch" / name / f"rank-{rank}") == prefetcher.stats.fetched_bytes


def test_prefetcher_holds_the_pool_window_and_releases_episodes_that_left(make_ds, tmp_path: Path) -> None:
    prefetcher, order = _pool_prefetcher(make_ds, tmp_path)
    try:
        total = order.num_samples(0)
        for position in (0, total // 2, total - 1):
            prefetcher.warm(0, position, progress=False)
            wanted = set(prefetcher.needed(0, position).tolist())
            assert set(prefetcher.cache.owners()) == wanted  # admitted on entry, released on exit
            episodes, _ = order.samples(0, position, min(total, position + 3))
            assert set(episodes.tolist()) <= wanted
        assert prefetcher.stats.fetched_ranges > 0
    finally:
        prefetcher.close()


@pytest.mark.parametrize(
    ("lookahead", "options", "position", "expected"),
    [
        # In order (episodes of 5, 1, 7, 4, 6 frames), one episode pooled: positions 4-6 are episodes 0, 1, 2.
        (3, {"shuffle": False, "episode_pool_size": 1}, 4, [0, 1, 2]),
        (0, {"shuffle": False, "episode_pool_size": 1}, 4, [0]),  # (a lookahead of 0 is taken as 1)
        (3, {"shuffle": False, "episode_pool_size": 1}, 21, [4, 0]),  # 21, 22, then the next epoch's first
        # Shuffled (seed 1, pool of 2): epoch 0's last position is episode 1; epoch 1 starts with episodes 4 and 2
        # pooled, where epoch 0 started with 4 and 3.
        (3, {}, 22, [1, 4, 2]),
        # A union of the remote dataset and the local one (episodes 5-9, copied into no cache): positions 22-24 are
        # episodes 4, 5 and 5.
        (3, {"shuffle": False, "episode_pool_size": 1, "local_too": True}, 22, [4]),
    ],
)
def test_the_episodes_needed_are_those_of_the_lookahead_spilling_into_the_next_epoch(
    make_ds, tmp_path: Path, lookahead: int, options: dict, position: int, expected: list[int]
) -> None:
    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path, lookahead=lookahead, **options)
    try:
        assert prefetcher.needed(0, position).tolist() == expected
    finally:
        prefetcher.close()


def test_a_fill_admits_only_the_episodes_it_does_not_hold_and_releases_only_those_that_left(
    make_ds, tmp_path: Path, monkeypatch
) -> None:
    from lerobot_dali.prefetch import Prefetcher

    admit, released, admitted = Prefetcher._admit, [], []
    monkeypatch.setattr(Prefetcher, "_admit", lambda self, e: admitted.append(e) or admit(self, e))
    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)  # (shuffled: episodes 4 and 3 for 0-6, then 2 and 1 for 20-22)
    monkeypatch.setattr(
        prefetcher.cache, "release", lambda e, release=prefetcher.cache.release: released.append(e) or release(e)
    )
    try:
        prefetcher.warm(0, 0, progress=False)
        prefetcher.warm(0, 4, progress=False)
        assert admitted == [4, 3] and released == []
        prefetcher.warm(0, 20, progress=False)
        assert admitted == [4, 3, 2, 1] and sorted(released) == [3, 4]
    finally:
        prefetcher.close()


def test_an_episode_whose_prefetch_failed_is_tried_again(make_ds, tmp_path: Path, monkeypatch) -> None:
    """It stayed registered as held: the next fills skipped it, and it was read remotely while in the pool."""
    from lerobot_dali.prefetch import Prefetcher

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    fetch, calls = Prefetcher._fetch, []

    def fails_once(self, key):
        calls.append(key)
        if len(calls) == 2:  # the first episode's second range: it has fetched some, not all
            raise OSError(errno.ECONNRESET, "outage")
        return fetch(self, key)

    monkeypatch.setattr(Prefetcher, "_fetch", fails_once)
    try:
        wanted = set(prefetcher.needed(0, 0).tolist())
        prefetcher.warm(0, 0, progress=False)
        assert prefetcher.failures == 1 and set(prefetcher.cache.owners()) < wanted
        prefetcher.warm(0, 0, progress=False)
        assert prefetcher.failures == 1 and set(prefetcher.cache.owners()) == wanted
        fetches = Counter(calls)  # the failed range again, nothing else: what the episode got before is reused
        assert fetches[calls[1]] == 2 and all(n == 1 for key, n in fetches.items() if key != calls[1])
    finally:
        prefetcher.close()


def test_a_failed_fill_waits_for_its_other_admissions(make_ds, tmp_path: Path, monkeypatch) -> None:
    """A fill returned at its first failed admission while others ran on; the next fill could then admit one of
    those again, and two acquires of one episode shared (and one released) its list of held ranges."""

    from lerobot_dali.prefetch import Prefetcher

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    first, finished = int(prefetcher.needed(0, 0)[0]), []

    def admit(self, episode_pos: int) -> None:
        if episode_pos == first:
            raise OSError(errno.ECONNRESET, "outage")
        time.sleep(0.3)
        finished.append(episode_pos)

    monkeypatch.setattr(Prefetcher, "_admit", admit)
    try:
        prefetcher.warm(0, 0, progress=False)
        assert prefetcher.failures == 1
        assert sorted(finished) == sorted(int(e) for e in prefetcher.needed(0, 0) if e != first)
    finally:
        prefetcher.close()


def test_a_failed_fill_is_one_warning_that_says_why_and_what_follows(make_ds, tmp_path: Path, monkeypatch,
                                                                     caplog) -> None:  # fmt: skip
    """It was 'prefetch for epoch 0 position 0 failed' and a traceback, on every failed fill (each batch while
    a server is down): the cause sat at the traceback's end and nothing said that training goes on. Said again at
    the 10th failure (the 100th, ...), with the count; the error named is the first admission's (episode 4, of 4 and
    3), whichever failed last."""
    import logging

    from lerobot_dali.prefetch import Prefetcher

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)

    def admit(self, episode_pos: int) -> None:
        raise OSError(errno.ECONNRESET, f"outage of episode {episode_pos}")

    monkeypatch.setattr(Prefetcher, "_admit", admit)
    try:
        with caplog.at_level(logging.DEBUG, logger="lerobot_dali.prefetch"):
            for _ in range(10):
                prefetcher.warm(0, 0, progress=False)
    finally:
        prefetcher.close()
    assert prefetcher.failures == 10
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and warnings[0].exc_info is None, caplog.text
    said = warnings[0].getMessage()
    assert said.startswith("fakeremote://: prefetching epoch 0 from position 0 failed (ConnectionResetError: "), said
    assert "outage of episode 4)" in said and "fetch remotely instead" in said and "cache_gb=0" in said, said
    assert "so far" not in said and "outage of episode 4), 10 failures so far;" in warnings[1].getMessage()
    assert [r.exc_info is not None for r in caplog.records if r.levelno == logging.DEBUG] == [True] * 10


def test_a_new_order_is_followed_at_the_next_fill_of_the_same_position(make_ds, tmp_path: Path) -> None:
    """A resume rebuilds the order and the consumer stands where it stood: the fill for that position must hold the
    new order's episodes, not skip it as done."""
    prefetcher, order = _pool_prefetcher(make_ds, tmp_path)
    reshuffled = SampleOrder(
        prefetcher.reader.episodes.length, rank=0, world_size=1, options=OrderOptions(seed=7, episode_pool_size=2)
    )
    position = order.num_samples(0) // 2
    wanted = set(reshuffled.pool_window(0, position, position + 3).tolist())
    assert wanted != set(order.pool_window(0, position, position + 3).tolist())
    try:
        prefetcher.warm(0, position, progress=False)
        prefetcher.set_order(reshuffled)
        prefetcher.advance(0, position)
        deadline = time.monotonic() + 10
        while set(prefetcher.cache.owners()) != wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(prefetcher.cache.owners()) == wanted
    finally:
        prefetcher.close()


def test_a_fill_stopped_by_close_is_no_failure(make_ds, tmp_path: Path, monkeypatch, caplog) -> None:
    """close() during a background fill stops it: no failed prefetch to count, nor to warn of as the run ends."""
    from lerobot_dali.prefetch import Prefetcher

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    started, release = threading.Event(), threading.Event()

    def admit(self, episode_pos: int) -> None:
        started.set()
        release.wait(10)

    monkeypatch.setattr(Prefetcher, "_admit", admit)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.prefetch"):
        prefetcher.advance(0, 0)
        assert started.wait(10)
        prefetcher.close()
        release.set()
        prefetcher._thread.join(10)
    assert not prefetcher._thread.is_alive() and prefetcher.failures == 0 and not caplog.records, caplog.text


def test_a_cache_dir_whose_slots_are_all_busy_says_to_run_fewer_there(
    make_ds, tmp_path: Path, monkeypatch, caplog
) -> None:
    """Every slot busy (too many runs on one cache_dir): the workers read remotely, and the warning says to run fewer
    there, not to make the folder writable."""
    from lerobot_dali.prefetch import prefetching_reader

    def busy(directory: Path, **kwargs):  # type: ignore[no-untyped-def]
        raise CacheBusyError("every slot busy")

    monkeypatch.setattr(RangeCache, "open_free_slot", staticmethod(busy))
    reader = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "av1"))})
    order = SampleOrder(reader.episodes.length, rank=0, world_size=1, options=OrderOptions(seed=1))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.prefetch"):
        _, prefetcher = prefetching_reader(reader, order, rank=0, lookahead=3, cache_dir=tmp_path, cache_bytes=10**8)
    [warning] = [r.getMessage() for r in caplog.records]
    assert prefetcher is None and "Give it fewer runs on this cache_dir at once" in warning, warning


def test_close_returns_once_the_admissions_read_their_metadata(make_ds, tmp_path: Path, monkeypatch) -> None:
    """close() left an admission inside pyarrow's read of a remote footer (which calls the file's Python read): at exit
    the interpreter stopped that daemon thread there, and the process aborted (Fatal Python error:
    PyGILState_Release)."""
    import threading

    from lerobot_dali.episode_ranges import EpisodeRanges

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    ranges, inside, reading = EpisodeRanges.ranges, threading.Event(), []

    def slow_ranges(self, episode_pos: int) -> list[tuple[str, int, int]]:
        reading.append(episode_pos)
        inside.set()
        time.sleep(1.0)  # (a remote's round trips, under prefetch.READ_WAIT_S)
        try:
            return ranges(self, episode_pos)
        finally:
            reading.remove(episode_pos)

    monkeypatch.setattr(EpisodeRanges, "ranges", slow_ranges)
    prefetcher.advance(0, 0)
    assert inside.wait(10)
    prefetcher.close()
    assert reading == []


def test_close_on_the_thread_inside_warm_does_not_wait_for_the_fill_thread(
    make_ds, tmp_path: Path, monkeypatch
) -> None:
    """A signal handler's close() on the main thread inside warm() waited 5 s for the background thread, which may
    wait on the fill lock warm() holds (measured: close() took 5.0 s); it now leaves that thread to end on its own
    (the wait is recorded, not timed)."""
    from contextlib import contextmanager

    from lerobot_dali import prefetch

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    joins: list[float | None] = []
    monkeypatch.setattr(prefetcher._thread, "join", lambda timeout=None: joins.append(timeout))

    @contextmanager
    def closing_at_first_admission(total: int, enabled: bool, fetched_bytes):
        yield lambda n: prefetcher._closed or prefetcher.close()  # (a signal handler on this thread, in the fill)

    monkeypatch.setattr(prefetch, "_progress_bar", closing_at_first_admission)
    prefetcher.warm(0, 0, progress=False)
    assert prefetcher._closed and joins == []


def test_close_on_a_reading_thread_does_not_wait_for_its_own_read(make_ds, tmp_path: Path, monkeypatch) -> None:
    """close() run on a thread reading an episode's metadata (a finalizer the collector runs there) waited 2 s
    (READ_WAIT_S) for that read, which cannot end before it returns; it waits for other threads' reads only."""
    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    waits: list[bool] = []

    class RecordedWaits(type(prefetcher._reading)):  # type: ignore[misc]
        def wait_for(self, predicate, timeout=None):
            waits.append(predicate())  # (True: nothing to wait for)
            return waits[-1]

    prefetcher._reading = RecordedWaits()
    ranges = EpisodeRanges.ranges

    def closing_ranges(self, episode_pos: int) -> list[tuple[str, int, int]]:
        if not prefetcher._closed:
            prefetcher.close()  # (a finalizer on this reading thread)
        return ranges(self, episode_pos)

    monkeypatch.setattr(EpisodeRanges, "ranges", closing_ranges)
    prefetcher.warm(0, 0, progress=False)
    assert waits and all(waits)


class _ClosesWhenFreed:
    """An iterator's stand-in in a reference cycle: freed by the collector, it closes its prefetcher (its __del__)."""

    def __init__(self, prefetcher, freed_on: list[int]) -> None:
        self.prefetcher, self.freed_on, self.cycle = prefetcher, freed_on, self

    def __del__(self) -> None:
        self.freed_on.append(threading.get_ident())
        self.prefetcher.close()


@pytest.mark.parametrize("inside", ["_make_room", "_write_or_refuse"])  # (under the cache's lock; in its own write)
def test_a_prefetcher_freed_by_the_collector_on_a_thread_inside_its_cache_gives_the_cache_up(
    make_ds, tmp_path: Path, monkeypatch, inside: str
) -> None:
    """The cycle collector runs inside any allocation, on a prefetch thread inside the cache too, and an iterator it
    frees closes its prefetcher there: the cache's close waited for the lock that thread held, or for that thread's
    own write to end, so the thread hung for good and the cache folder stayed locked (the next run took a sibling)."""
    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    original, close = getattr(RangeCache, inside), RangeCache.close
    closed = threading.Event()

    def collecting(self, *args):
        gc.collect()  # (as an allocation there may)
        return original(self, *args)

    def closing(self) -> None:
        close(self)
        closed.set()

    monkeypatch.setattr(RangeCache, inside, collecting)
    monkeypatch.setattr(RangeCache, "close", closing)
    freed_on: list[int] = []
    gc.disable()
    try:
        _ClosesWhenFreed(prefetcher, freed_on)  # (freed by the collector only)
        prefetcher.warm(0, 0, progress=False)
        assert closed.wait(timeout=30), "the thread inside the cache hung closing it"
    finally:
        gc.enable()
    assert len(freed_on) == 1 and freed_on[0] != threading.get_ident()  # (on a prefetch thread)
    assert prefetcher._closed
    RangeCache(prefetcher.cache.directory, max_bytes=1000).close()  # (given up: no CacheBusyError)


def test_close_and_drop_stop_the_prefetcher_and_the_workers(make_ds, tmp_path: Path) -> None:
    """close() waited 30 s for a fetch stalled on the network (and exit waited for it too); an iterator dropped
    without close() left its prefetcher thread running; close() left DALI's workers running while a generator
    from iter(it) was still referenced."""
    import gc
    import threading

    import psutil

    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "av1")
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    fake = reader.location.fs.fs
    options = dict(batch_size=2, shuffle=False, episode_pool_size=1, device="cpu", cache_dir=tmp_path / "cache")
    it = DALILeRobotIterator(reader, num_workers=2, **options)
    batches = iter(it)
    next(batches)
    workers = [psutil.Process(pid) for pid in it._pipeline._py_pool.pids()]
    assert workers and all(w.is_running() for w in workers)
    it.prefetcher.cache.clear()
    fake.latency_s = 8.0  # the network stalls mid-prefetch
    it.prefetcher.advance(0, 12)
    stalled = it.prefetcher._thread
    time.sleep(0.5)
    start = time.perf_counter()
    it.close()
    # not the stalled fetch's 8 s; close() itself waits up to READ_WAIT_S (2 s) for metadata reads, and took 2.55 s
    # on a loaded 2-core machine, so the bound leaves room below the stall, not below that wait
    assert time.perf_counter() - start < 6.0
    psutil.wait_procs(workers, timeout=10)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    del batches
    fake.latency_s = 0.0
    stalled.join(timeout=20)  # its stalled fetch ends: a stable count to compare with

    def prefetchers() -> int:
        return sum(t.name == "lerobot-dali-prefetcher" and t.is_alive() for t in threading.enumerate())

    before = prefetchers()
    dropped = DALILeRobotIterator(reader, num_workers=0, **options)
    assert prefetchers() == before + 1
    del dropped
    gc.collect()
    deadline = time.monotonic() + 10
    while prefetchers() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert prefetchers() == before


def test_close_stops_the_prefetcher_when_dali_shutdown_fails(make_ds, tmp_path: Path, monkeypatch) -> None:
    """DALI's shutdown raising in close() left the prefetcher's thread fetching for a closed iterator."""
    from lerobot_dali.iterator import DALILeRobotIterator

    reader = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "av1"))})
    it = DALILeRobotIterator(reader, batch_size=2, device="cpu", num_workers=0, cache_dir=tmp_path / "cache")
    next(iter(it))
    thread = it.prefetcher._thread
    assert thread.is_alive()

    def failing_shutdown() -> None:
        raise RuntimeError("shutdown failed")

    monkeypatch.setattr(it._pipeline, "_shutdown", failing_shutdown)
    with pytest.raises(RuntimeError, match="shutdown failed"):
        it.close()
    thread.join(timeout=10)
    assert it.prefetcher is None and not thread.is_alive()


def test_row_groups_holding_an_episode_against_a_scan() -> None:
    """The row groups the workers read and the prefetcher fetches come from one function; here against a scan of
    every group (zero-row groups included), for every row range of a few layouts."""
    from lerobot_dali.episode_rows import row_groups_holding

    for counts in ([5], [3, 4, 5], [2, 0, 3, 0, 0, 4], [1] * 9):
        starts = np.concatenate([[0], np.cumsum(counts)])
        for row_start in range(int(starts[-1])):
            for length in range(1, int(starts[-1]) - row_start + 1):
                scan = [g for g in range(len(counts)) if counts[g] and starts[g] < row_start + length
                        and starts[g + 1] > row_start]  # fmt: skip
                held = row_groups_holding(starts, row_start, length)
                assert [g for g in held if counts[g]] == scan, (counts, row_start, length)


def test_episode_ranges_name_a_data_file_whose_footer_does_not_parse(make_ds, copy_ds) -> None:
    """Prefetch logs what failed: a footer damaged after the dataset was opened came through as a bare OSError
    ("Couldn't deserialize thrift") naming no file."""

    root = copy_ds(_dataset(make_ds, "h264"))
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    path = root / remote.data_path(0)
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    raw[-8 - footer : -8 - footer + 16] = bytes(16)
    path.write_bytes(bytes(raw))
    with pytest.raises(DataFileError, match=rf"{path.name} is not a readable parquet file \(.*thrift"):
        EpisodeRanges(remote).parquet_ranges(0)


@pytest.mark.parametrize(("local_rank", "shown"), [("0", True), ("1", False)])
def test_the_warming_bar_shows_on_each_nodes_first_rank_only(make_ds, tmp_path: Path, monkeypatch, local_rank, shown):
    """Every rank of a node warms its own cache: eight bars on one terminal overwrote each other."""
    from lerobot_dali import prefetch
    from lerobot_dali.iterator import DALILeRobotIterator

    bars: list[bool] = []
    real = prefetch._progress_bar
    monkeypatch.setattr(
        prefetch, "_progress_bar", lambda total, enabled, fetched: bars.append(enabled) or real(total, False, fetched)
    )
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    reader = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "av1"))})
    it = DALILeRobotIterator(reader, batch_size=4, device="cpu", rank=int(local_rank), world_size=2,
                             cache_dir=tmp_path / "cache", cache_gb=1.0)  # fmt: skip
    try:
        next(iter(it))
    finally:
        it.close()
    assert bars and bars[0] is shown


def test_the_warm_up_logs_lines_not_a_bar_where_stderr_is_no_terminal(make_ds, tmp_path: Path, monkeypatch, capsys,
                                                                      caplog) -> None:  # fmt: skip
    """A training job's log (no terminal) got the bar's every redraw, joined by carriage returns, each epoch."""
    import logging

    from lerobot_dali import prefetch
    from lerobot_dali.iterator import DALILeRobotIterator

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(prefetch, "WARM_PROGRESS_DELAY_S", 0.0, raising=False)  # (a warm-up here takes a moment)
    reader = open_dataset("fakeremote://", storage_options={"root": str(_dataset(make_ds, "av1"))})
    it = DALILeRobotIterator(reader, batch_size=4, device="cpu", cache_dir=tmp_path / "cache", cache_gb=1.0)
    try:
        with caplog.at_level(logging.INFO, logger="lerobot_dali.prefetch"):
            next(iter(it))
    finally:
        it.close()
    assert "warming prefetch cache" not in capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records if "warming" in r.getMessage()]
    assert said and said[-1].startswith("lerobot-dali: warming prefetch cache: ")
    assert all(re.search(r" episodes, \d+\.\d MB fetched \(\d+ s\)$", line) for line in said), said


def test_the_warm_up_says_the_bytes_it_fetched_before_its_first_episode_arrives(
    make_ds, tmp_path: Path, monkeypatch, caplog
) -> None:
    """The warm-up's first line came at its first episode done: over a slow link, minutes of nothing (here: 0 lines
    while every range but the first stalls). Its timer now says the count and the bytes fetched so far at the delay,
    then no more than every LINE_EVERY_S: 1 line over 20 looks while the ranges stall (counted, not timed)."""
    import logging

    from lerobot_dali import prefetch, progress_lines
    from lerobot_dali.prefetch import Prefetcher

    prefetcher, _ = _pool_prefetcher(make_ds, tmp_path)
    monkeypatch.setattr(prefetch, "WARM_PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(progress_lines, "TICK_S", 0.001)
    fetch, tick = Prefetcher._fetch, progress_lines.ProgressLines.tick
    fetches, looks, said, released = [], [], [], threading.Event()

    def warming() -> list[str]:
        return [r.getMessage() for r in caplog.records if "warming" in r.getMessage()]

    def looked(self) -> None:  # (a look of the timer: what the line would say, then the look)
        expected = f"0/{self.total} episodes, {prefetcher.stats.fetched_bytes / 1e6:.1f} MB fetched"
        before = len(warming())
        tick(self)
        if len(warming()) > before:
            said.append((warming()[-1], expected))
        if not released.is_set():
            looks.append(len(warming()))
            if said and len(looks) - looks.index(1) >= 20:
                released.set()

    def stalls_after_the_first(self, key):
        fetches.append(key)
        if len(fetches) > 1 and not released.wait(5.0):  # (the old code: no look ever lets them go)
            released.set()
        return fetch(self, key)

    monkeypatch.setattr(progress_lines.ProgressLines, "tick", looked)
    monkeypatch.setattr(Prefetcher, "_fetch", stalls_after_the_first)
    try:
        with caplog.at_level(logging.INFO, logger="lerobot_dali.prefetch"):
            prefetcher.warm(0, 0)
    finally:
        prefetcher.close()
    assert said, "no line while the ranges stalled"
    (line, expected), *_ = said
    assert line.startswith(f"lerobot-dali: warming prefetch cache: {expected} ("), (line, expected)
    assert looks.count(1) >= 20 and set(looks) <= {0, 1}  # (one line however many looks while they stalled)
    assert prefetcher.failures == 0 and prefetcher.stats.fetched_ranges == len(fetches)


def test_a_child_forked_while_the_parents_thread_fetches_or_writes_a_range_does_not_wait_for_it(tmp_path: Path) -> None:
    """Only the forking thread lives on in a child: a range the parent's prefetch thread was fetching at the fork
    stayed pending in the child for ever, so the child's own acquire() of it waited for ever, and a write under way
    left close() waiting for ever (2 of 2 children hung). The child's copy is closed and waits for neither: the range
    is read remotely (refused), its other ranges as before."""
    import signal

    blob = bytes(range(200))
    cache = RangeCache(tmp_path / "cache", max_bytes=1000)
    fetching, writing, answer = threading.Event(), threading.Event(), threading.Event()

    def slow_fetch(key: ByteRange) -> bytes:
        if key.start == 0:
            fetching.set()
            assert answer.wait(30)
        return blob[key.start : key.end]

    real_write = cache._write

    def slow_write(key: ByteRange, data: bytes) -> Path:
        if key.start == 100:
            writing.set()
            assert answer.wait(30)
        return real_write(key, data)

    cache._write = slow_write  # type: ignore[method-assign]
    ended = []  # (each child's exit code)
    for key, started in [(ByteRange("p", 0, 100), fetching), (ByteRange("p", 100, 200), writing)]:
        thread = threading.Thread(target=cache.acquire, args=(key.start, [key], slow_fetch))
        thread.start()
        assert started.wait(30)
        pid = os.fork()
        if pid == 0:  # (never back into pytest: os._exit)
            signal.signal(signal.SIGALRM, lambda *_: os._exit(3))  # (a child that hangs ends with 3)
            signal.alarm(10)
            try:
                fetched = cache.acquire("child", [key], _fetcher(blob, []))
                cache.close()
                os._exit(0 if fetched == 0 and not cache.holds(key) else 1)
            finally:
                os._exit(2)
        status = os.waitpid(pid, 0)[1]
        answer.set()
        thread.join(30)
        answer.clear()
        ended.append(os.waitstatus_to_exitcode(status))
    assert ended == [0, 0]  # (3: it hung)
    assert cache.holds(ByteRange("p", 0, 100)) and cache.holds(ByteRange("p", 100, 200))
    cache.close()


def test_a_cache_dir_another_user_owns_prefetches_into_a_private_one(make_ds, tmp_path: Path, monkeypatch, caplog):
    """A second user on a cache_dir the first one wrote (another user's slot, or a read-only shared cache) got no
    prefetch cache at all: each range read remotely, for every run. It now prefetches into a cache of its own under
    its home, said in one warning naming both folders, and leaves the owner's slot (and its lock) alone. (Another
    uid is simulated: tests run as root here, which writes whatever the permission bits say.)"""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "av1")
    options = dict(batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False, delta_timestamps=DELTAS)
    shared = tmp_path / "shared"
    owner = DALILeRobotIterator(
        open_dataset("fakeremote://", storage_options={"root": str(root)}), cache_dir=shared, cache_gb=1.0, **options
    )
    _samples(owner)
    owner.close()
    owned = sorted(p.relative_to(shared) for p in shared.rglob("*"))
    assert any(p.suffix == ".bin" for p in owned)

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    try:
        with not_writable(shared), caplog.at_level("WARNING", logger="lerobot_dali.prefetch"):
            it = DALILeRobotIterator(reader, cache_dir=shared, cache_gb=1.0, **options)
            prefetcher = it.prefetcher
            assert prefetcher is not None
            got = _samples(it)
            assert sorted(p.relative_to(shared) for p in shared.rglob("*")) == owned  # (untouched)
        RangeCache(shared / "rank-0", max_bytes=10).close()  # (the owner's slot is not held by this run)
    finally:
        it.close()
    private = prefetcher.cache.directory
    assert private.parent.parent == tmp_path / "home" / ".cache" / "lerobot_dali" / "prefetch"
    assert private.name == "rank-0"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"prefetch cache {shared} cannot be written by this process" in warning and str(private.parent) in warning
    assert [int(s["index"]) for s in got] == list(range(sum(LENGTHS)))
    for s in got:
        _check_sample(s)
    assert prefetcher.stats.fetched_ranges > 0 and _disk_bytes(private) == prefetcher.stats.fetched_bytes


def test_a_cache_that_fails_to_adopt_its_slot_gives_the_slot_up(tmp_path: Path, monkeypatch) -> None:
    """An error adopting an earlier run's entries (another user's, which this process may not rename) left the slot's
    lock taken by the cache that raised it, for as long as anything held it: its owner's next run found its slot busy
    and took a cold sibling."""
    first = RangeCache(tmp_path, max_bytes=1000)
    first.acquire("a", [ByteRange("p", 0, 100, "v")], _fetcher(bytes(1000), []))
    first.close()

    def refused(self) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    with monkeypatch.context() as m:
        m.setattr(RangeCache, "_adopt", refused)
        with pytest.raises(PermissionError) as raised:
            RangeCache(tmp_path, max_bytes=1000)
    owner = RangeCache(tmp_path, max_bytes=1000)  # (not CacheBusyError while the failed one lives on in `raised`)
    assert owner.bytes_cached == 100 and raised.value.errno == errno.EACCES
    owner.close()


def test_the_private_cache_a_run_falls_back_to_is_swept_of_slots_no_run_used(tmp_path: Path, monkeypatch) -> None:
    """The private folder a run prefetches into where the shared cache_dir takes no writes was swept by nothing: a slot
    of a dataset no run had read for months (up to cache_gb each) stayed in the user's home for good (1 of 1 stale
    slots left). It is swept as the shared root is, and a slot read lately stays."""
    from lerobot_dali.cache_dirs import cache_days
    from lerobot_dali.prefetch import _open_cache

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    prefetch = tmp_path / "home" / ".cache" / "lerobot_dali" / "prefetch"
    stale, recent = prefetch / "another-dataset" / "rank-0", prefetch / "a-third" / "rank-0"
    long_ago = time.time() - (cache_days() + 1) * 86400
    for slot in (stale, recent):
        RangeCache(slot, max_bytes=1000).close()
        (slot / "entry.bin").write_bytes(b"x" * 100)
    for path in [stale, *stale.iterdir()]:
        os.utime(path, (long_ago, long_ago))
    shared = tmp_path / "shared" / "prefetch" / "this-dataset"
    shared.mkdir(parents=True)
    with not_writable(shared):
        cache = _open_cache(shared, "this-dataset", rank=0, cache_bytes=1000)
    try:
        assert cache.directory == prefetch / "this-dataset" / "rank-0"
        assert not stale.exists() and (recent / "entry.bin").read_bytes() == b"x" * 100
    finally:
        cache.close()
