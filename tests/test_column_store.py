"""Episodes of data files written as one big row group are read from memory-mapped Arrow copies: same values as
the parquet, one conversion per file shared by processes, and every store failure falls back to the parquet."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import shared_dataset

from lerobot_dali import column_store as column_store_module
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DataFileError
from lerobot_dali.file_stamps import FileStamp, stamp_from_stat
from tests.launched_ranks import run_ranks
from tests.other_host import on_another_host
from tests.replace_on_warning import replaced_when_warned

# cr5's data file is one row group of 2,733 rows holding 12 episodes of 127-314 rows, as LeRobot's converter
# wrote it: a store that takes groups from 1,000 rows and 4x the episode reads every episode through it.
SMALL = {"min_group_rows": 1000, "min_ratio": 4}


def _reader(store: ColumnStore | None):
    reader = open_dataset(shared_dataset("cr5_v30_av1"))
    reader.column_store = store
    return reader


def _all_episodes(reader) -> list[dict[str, np.ndarray]]:
    return [reader.read_episode(pos) for pos in range(reader.num_episodes)]


def _assert_same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for key in w:
            assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape, key
            np.testing.assert_array_equal(g[key], w[key], err_msg=key)


def _stored_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.arrow"))


def test_episodes_read_through_the_store_equal_the_parquet_rows_and_convert_once(tmp_path, caplog) -> None:
    direct = _all_episodes(_reader(None))
    # The hand check that "direct" is the episode's own rows: episode 3's rows sit at its place in the file.
    reader = _reader(None)
    start, length = int(reader.episodes.data_row_start[3]), int(reader.episodes.length[3])
    table = pq.read_table(reader.data_path(3), columns=["index", "action"]).slice(start, length)
    np.testing.assert_array_equal(direct[3]["index"], table["index"].to_numpy())
    np.testing.assert_array_equal(direct[3]["action"], np.stack(table["action"].to_numpy(zero_copy_only=False)))

    caplog.set_level(logging.INFO, logger="lerobot_dali.column_store")
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert len(_stored_files(tmp_path)) == 1
    assert sum("column store: wrote 2733 rows" in r.getMessage() for r in caplog.records) == 1

    # Another process (a fresh store over the same folder) maps the file: no second conversion.
    caplog.clear()
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert not [r for r in caplog.records if "wrote" in r.getMessage()]


def test_a_converted_file_leaves_no_lock_file_behind(tmp_path) -> None:
    """Each conversion left its ``.lock`` beside the stored file for good, and the sweep deletes unused ``.arrow``
    files only: a cache in daily use gained an empty file per data file, column selection and version ever read."""
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == [stored]
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))  # mapped by the next run: no lock taken
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == [stored]


def test_hosts_sharing_the_cache_and_the_dataset_keep_one_copy(tmp_path, monkeypatch) -> None:
    """A dataset on an NFS share that each node mounts with a device number of its own, its cache in the shared
    $HOME: local stamps held the device, so each host wrote a copy of its own of every data file (1.3-2.3x the
    parquet each; 2 hosts, 2 copies here)."""
    direct = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    with on_another_host(monkeypatch, shared_dataset("cr5_v30_av1")):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert len(_stored_files(tmp_path)) == 1


def test_files_under_the_threshold_are_read_from_the_parquet(tmp_path) -> None:
    direct = _all_episodes(_reader(None))
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, min_group_rows=5000))), direct)
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, min_group_rows=1000, min_ratio=20))), direct)
    assert _stored_files(tmp_path) == []


def test_a_default_store_takes_a_one_group_file_of_a_few_thousand_rows(make_ds, tmp_path) -> None:
    """A v3.0 data file of 8,000 rows in one row group (20 episodes of 400 rows, as LeRobot writes a file), read
    during training: under the old 65,536-row floor every episode read decoded all 8,000 rows (at 40,000 rows,
    29 ms per read against 1.8 ms from the store), once per episode and worker each epoch."""
    root = make_ds(episodes=20, frames_per_episode=400, cameras=0, episodes_per_file=20, state_dim=14, action_dim=14)
    direct = open_dataset(root)
    direct.column_store = None
    [data] = sorted((root / "data").rglob("*.parquet"))
    assert pq.ParquetFile(data).metadata.num_row_groups == 1
    want = _all_episodes(direct)
    np.testing.assert_array_equal(want[7]["index"], np.arange(2800, 3200))
    stored = open_dataset(root)
    stored.column_store = ColumnStore(tmp_path)  # the defaults
    _assert_same(_all_episodes(stored), want)
    assert len(_stored_files(tmp_path)) == 1


def test_an_unreadable_store_file_is_deleted_and_rebuilt(tmp_path, caplog) -> None:
    direct = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    stored.write_bytes(stored.read_bytes()[:1000])  # truncated
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert any("is damaged" in r.getMessage() and "deleting it" in r.getMessage() for r in caplog.records)
    assert _stored_files(tmp_path) == [stored] and stored.stat().st_size > 1000


def _damage_action(stored: Path, action_row: np.ndarray) -> None:
    """Change one float of ``action_row`` where the stored file holds it, keeping the file's size and layout."""
    data = stored.read_bytes()
    at = data.find(action_row.tobytes())
    assert at > 0 and data.count(action_row.tobytes()) == 1
    with stored.open("r+b") as file:  # (in place: a process may map it)
        file.seek(at)
        file.write(np.float32(action_row[0] + 1000).tobytes())


def test_rows_the_disk_changed_in_a_store_file_are_refused_and_the_file_rebuilt(tmp_path, monkeypatch, caplog) -> None:
    """Arrow IPC keeps no checksum: bytes changed on disk under a mapped copy were served as the episode's actions."""
    monkeypatch.setattr(column_store_module, "_CONVERT_BATCH_ROWS", 500)  # 6 batches of cr5's 2,733 rows
    reader = _reader(None)
    direct = _all_episodes(reader)
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    _damage_action(stored, direct[8]["action"][5])  # a row of the 4th batch (rows 1500-1999)
    start = int(reader.episodes.data_row_start[8]) + 5
    assert 1500 <= start < 2000

    store = ColumnStore(tmp_path, **SMALL)
    damaged = _reader(store)
    caplog.set_level(logging.INFO, logger="lerobot_dali.column_store")
    _assert_same([damaged.read_episode(pos) for pos in range(3)], direct[:3])  # batches 0-1: checked, intact
    assert not caplog.records
    _assert_same(_all_episodes(damaged), direct)
    [warned] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "rows 1500-1999 of" in warned and "disagree with their checksum" in warned and "deleting it" in warned
    assert sum("column store: wrote 2733 rows" in r.getMessage() for r in caplog.records) == 1  # converted again
    [rebuilt] = _stored_files(tmp_path)
    assert rebuilt.read_bytes().count(direct[8]["action"][5].tobytes()) == 1

    # The copy damaged again in the same process: read from the parquet from then on, the copy not written again.
    _damage_action(rebuilt, direct[8]["action"][5])
    damaged.column_store._open.clear()  # (as a process that mapped it after the damage)
    caplog.clear()
    _assert_same(_all_episodes(damaged), direct)
    [warned] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "its second copy was damaged too" in warned
    assert not _stored_files(tmp_path) and not [r for r in caplog.records if "wrote" in r.getMessage()]


def _in_a_list(names: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(range(len(names) + 1), pa.int32()), names)


@pytest.mark.parametrize(
    "nest, unnest",
    [
        (lambda names: names, lambda values: values),
        (_in_a_list, lambda values: [v[0] for v in values]),
        (lambda names: pa.StructArray.from_arrays([names], ["name"]), lambda values: [v["name"] for v in values]),
    ],
    ids=["column", "list", "struct"],
)
def test_dictionary_columns_are_stored_and_their_values_checked(tmp_path, monkeypatch, caplog, nest, unnest) -> None:
    """A string column written from a dictionary comes back as one, also in a list or a struct: its values lie in the
    file's dictionary batch, apart from the record batches (and summing a batch by IPC's one-batch serialization
    refused dictionaries; a nested dictionary's values were once left out of the sum)."""
    monkeypatch.setattr(column_store_module, "_CONVERT_BATCH_ROWS", 1000)
    data = tmp_path / "data.parquet"
    names = [["pick", "place", "push"][i % 3] for i in range(5000)]
    column = nest(pa.array(names).dictionary_encode())
    pq.write_table(pa.table({"n": range(5000), "task": column}), data, row_group_size=5000)
    parquet = pq.ParquetFile(data)
    assert parquet.schema_arrow.field("task").type == column.type

    def rows(store: ColumnStore, start: int) -> pa.Table | None:
        return store.rows(
            parquet,
            threading.RLock(),
            path=str(data),
            stamp=stamp_from_stat(data.stat()),
            stored_columns=["n", "task"],
            columns=["task", "n"],
            row_start=start,
            length=300,
        )

    store = ColumnStore(tmp_path / "store", min_group_rows=1000, min_ratio=4)
    for start in (0, 2900, 4700):
        got = rows(store, start)
        assert got is not None and unnest(got["task"].to_pylist()) == names[start : start + 300]
        assert got["n"].to_pylist() == list(range(start, start + 300))
    [stored] = _stored_files(tmp_path / "store")
    raw = stored.read_bytes()
    assert raw.count(b"pickplacepush") == 1
    with stored.open("r+b") as file:  # the dictionary's values, in place
        file.seek(raw.find(b"pickplacepush"))
        file.write(b"kcip")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        assert rows(ColumnStore(tmp_path / "store", min_group_rows=1000, min_ratio=4), 2900) is None
    assert any("rows 2000-2999 of" in r.getMessage() for r in caplog.records)


def test_a_store_file_without_checksums_is_refused_and_rebuilt(tmp_path, caplog) -> None:
    direct = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    table = pa.ipc.open_file(pa.BufferReader(stored.read_bytes())).read_all()
    with pa.ipc.new_file(str(stored), table.schema) as writer:  # same key and rows, batches without metadata
        writer.write_table(table)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert any("holds record batches without a checksum" in r.getMessage() for r in caplog.records)
    [rebuilt] = _stored_files(tmp_path)
    with pa.memory_map(str(rebuilt)) as source:
        assert pa.ipc.open_file(source).get_batch_with_custom_metadata(0)[1] is not None


def test_a_store_file_replaced_while_found_damaged_is_kept(tmp_path) -> None:
    """A map that found a damaged file deleted the path after: the good copy another process had renamed over it
    meanwhile went too, and the data file was converted again."""
    direct = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    good = stored.read_bytes()
    stored.write_bytes(good[:1000])
    with replaced_when_warned("lerobot_dali.column_store", stored, good) as messages:
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert sum("is damaged" in m for m in messages) == 1 and not [m for m in messages if "wrote" in m]
    assert stored.read_bytes() == good


def test_a_file_converted_by_another_process_is_read_directly_meanwhile(tmp_path) -> None:
    direct = _all_episodes(_reader(None))
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    target = store.path_for(reader.data_path(0), _stamp(reader), _columns(reader))
    target.parent.mkdir(parents=True)
    with open(target.with_suffix(".lock"), "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another process is converting the file
        _assert_same(_all_episodes(reader), direct)
        assert _stored_files(tmp_path) == []
    _assert_same(_all_episodes(reader), direct)  # the lock released: this process converts it now
    assert _stored_files(tmp_path) == [target]


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS], ids=["nfs-without-lock-daemon", "lustre-noflock"])
def test_a_folder_whose_filesystem_takes_no_locks_still_converts(tmp_path, monkeypatch, caplog, code) -> None:
    """NFS without its lock daemon refuses ``flock`` (ENOLCK), Lustre mounted without ``-o flock`` (ENOSYS): the
    store warned that it could not write the file and never converted one, so every episode read decoded its whole
    row group, on every read; the other stores build without a lock there, and so does it now."""
    direct = _all_episodes(_reader(None))

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert caplog.records == []
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".arrow"]  # (no lock file left either)


def _stamp(reader) -> FileStamp:
    """The stamp the store keys episode 0's data file by."""
    path = reader.data_path(0)
    return reader._data_stamp(path, reader._parquet.get(path))


def _columns(reader) -> list[str]:
    """The columns read_episode asks for, in its order (the store's key holds them)."""
    wanted = list(reader.tabular_keys)
    return wanted + [k for k in ("index", "episode_index", "frame_index", "timestamp", "task_index") if k not in wanted]


def test_a_store_that_cannot_be_written_warns_once_and_reads_the_parquet(tmp_path, caplog) -> None:
    direct = _all_episodes(_reader(None))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(not_a_folder, **SMALL))), direct)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"cannot write to {not_a_folder}" in warnings[0]
    assert "make it a writable folder or move the store" in warnings[0]


def test_a_full_disk_or_quota_stops_every_conversion_of_the_process(tmp_path, monkeypatch, caplog) -> None:
    """A quota does not show in the disk's free space: the write fails, and no other file is tried."""
    writes: list[str] = []

    def over_quota(parquet, columns, key, sink) -> None:
        writes.append(key)
        sink.write(b"x" * 100)
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(column_store_module, "_write_arrow", over_quota)
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    direct = _all_episodes(_reader(None))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(reader), direct)
        path = reader.data_path(0)
        parquet = reader._parquet.get(path)
        other = store.rows(
            parquet, threading.Lock(), path=path, stamp=_stamp(reader), stored_columns=["action"], columns=["action"],
            row_start=0, length=5,
        )  # fmt: skip
    assert other is None and len(writes) == 1  # another entry is not tried
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "Disk quota exceeded" in warnings[0]
    assert "free space or move the store with $LEROBOT_DALI_CACHE" in warnings[0]
    assert _stored_files(tmp_path) == [] and not list(tmp_path.rglob("*.tmp"))


def test_a_changed_file_misses_its_old_entry(tmp_path) -> None:
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    path = reader.data_path(0)
    stamp = _stamp(reader)
    assert stamp.version.startswith("stat:") and stamp.size == Path(path).stat().st_size
    columns = _columns(reader)
    keys = {
        store.path_for(path, stamp, columns),
        store.path_for(path, type(stamp)(stamp.size, "mtime:0"), columns),
        store.path_for(path, type(stamp)(stamp.size + 1, stamp.version), columns),
        store.path_for(path, stamp, columns[:-1]),
        store.path_for(path + "x", stamp, columns),
    }
    assert len(keys) == 5
    assert store.path_for(path, stamp, columns[::-1]) == store.path_for(path, stamp, columns)


def test_image_columns_go_through_the_store(make_ds, tmp_path) -> None:
    root = make_ds(episodes=4, frames_per_episode=[5, 1, 7, 4], cameras=1, size=(64, 96), image_cameras=True,
                   episodes_per_file=4)  # fmt: skip
    plain = open_dataset(root)
    plain.column_store = None
    stored = open_dataset(root)
    stored.column_store = ColumnStore(tmp_path, min_group_rows=10, min_ratio=2)
    key = plain.image_keys[0]
    for pos in range(4):
        assert stored.read_episode_images(pos, key).equals(plain.read_episode_images(pos, key))
    assert len(_stored_files(tmp_path)) == 1


def test_the_store_pickles_as_its_settings(tmp_path) -> None:
    store = ColumnStore(tmp_path, min_group_rows=7, min_ratio=3, max_open=2)
    _all_episodes(_reader(store))
    assert store._open
    copy = pickle.loads(pickle.dumps(store))
    assert (copy.directory, copy.min_group_rows, copy.min_ratio, copy.max_open) == (tmp_path, 7, 3, 2)
    assert repr(copy) == f"ColumnStore({str(tmp_path)!r}, min_group_rows=7)"
    assert not copy._open and not copy._failed
    assert pickle.loads(pickle.dumps(_reader(store).for_workers())).column_store.min_group_rows == 7


def test_the_default_store_sits_under_the_cache_root(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path))
    assert ColumnStore().directory == tmp_path / "columns" == column_store_module.default_column_dir()
    assert _reader(ColumnStore()).for_workers().column_store.directory == tmp_path / "columns"


def test_iterator_workers_read_through_the_store_of_the_reader_they_are_given(tmp_path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    def samples(store: ColumnStore | None) -> dict[int, np.ndarray]:
        reader = open_dataset(shared_dataset("cr5_v30_av1"), cameras=[])
        reader.column_store = store
        it = DALILeRobotIterator(
            reader, batch_size=64, shuffle=True, seed=3, device="cpu", num_workers=1, drop_last=False,
            delta_timestamps={"action": [0.0, 0.1, 0.2]}, timestamp_source="frame_index",
        )  # fmt: skip
        try:
            got = {}
            for batch in it:
                for i, index in enumerate(batch["index"].tolist()):
                    got[index] = np.concatenate([batch["action"][i].numpy().ravel(), batch["action_is_pad"][i].numpy()])
            return got
        finally:
            it.close()

    direct = samples(None)
    stored = samples(ColumnStore(tmp_path, **SMALL))
    assert len(direct) == 2733 and sorted(stored) == sorted(direct)
    for index, values in direct.items():
        np.testing.assert_array_equal(stored[index], values)
    assert len(_stored_files(tmp_path)) == 1  # written by the worker process


def test_remote_files_are_keyed_by_their_listed_stamp_and_read_once(tmp_path) -> None:
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)

    direct = _all_episodes(_reader(None))
    remote = open_dataset("fakeremote://", storage_options={"root": str(shared_dataset("cr5_v30_av1"))})
    remote.column_store = ColumnStore(tmp_path, **SMALL)
    fs = remote.location.fs.fs
    _assert_same(_all_episodes(remote), direct)
    stamp = _stamp(remote)
    assert stamp == remote.stamps[remote.data_path(0)] and stamp.version  # from the listing, not a request
    [stored] = _stored_files(tmp_path)
    key = pa.ipc.open_file(pa.memory_map(str(stored))).schema.metadata[b"lerobot_dali.column_store.key"].decode()
    assert stamp.version in key and str(stamp.size) in key  # what the stored copy was written for
    reads_after_first_pass = fs.requests["read"]
    _assert_same(_all_episodes(remote), direct)
    assert fs.requests["read"] == reads_after_first_pass  # the mapped copy serves every later read


def test_a_conversion_killed_mid_write_leaves_no_file_behind(tmp_path) -> None:
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    target = store.path_for(reader.data_path(0), _stamp(reader), _columns(reader))
    target.parent.mkdir(parents=True)
    stale = target.parent / f".{target.stem}.abc123.tmp"
    stale.write_bytes(b"half an arrow file")
    other = target.parent / ".someotherentry.abc123.tmp"  # another entry's conversion, maybe running now
    other.write_bytes(b"x")
    _all_episodes(reader)
    assert not stale.exists() and other.exists() and target.exists()


def test_a_stored_file_reaches_the_disk_before_it_takes_its_name(tmp_path, monkeypatch) -> None:
    """A stored file is mapped as it is, with no checksum: renamed before its bytes reached the disk, a crash (the
    power lost) could leave a file of the right size whose unwritten blocks read as zeros, served as the columns'
    values. Synced first now, as the prefetch cache's entries are (0 of 1 synced before)."""
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    (target,) = _stored_files(tmp_path)
    (renamed,) = [event for event in events if event[0] == "replace" and event[2] == str(target)]
    assert ("fsync", renamed[1]) in events[: events.index(renamed)]


def _copy_of_cr5(tmp_path: Path) -> Path:
    copy = tmp_path / "cr5"
    shutil.copytree(shared_dataset("cr5_v30_av1"), copy)
    return copy


def _rewrite_actions(data_file: Path, value: float) -> None:
    """Replace ``data_file`` (a new inode, as a re-download or a fix script does) with every action set to value."""
    table = pq.read_table(data_file)
    actions = table["action"].combine_chunks()
    filled = pa.array([[value] * len(row) for row in actions.to_pylist()], type=actions.type)
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", filled), f"{data_file}.new")
    os.replace(f"{data_file}.new", data_file)


def test_a_file_replaced_while_open_is_never_stored_under_the_new_files_stamp(tmp_path) -> None:
    root = _copy_of_cr5(tmp_path)
    store_dir = tmp_path / "store"
    reader = open_dataset(root)
    reader.column_store = None
    old = reader.read_episode(0)["action"]  # the reader holds the file open
    data_file = Path(reader.data_path(0))
    _rewrite_actions(data_file, 999.0)
    reader.column_store = ColumnStore(store_dir, **SMALL)
    np.testing.assert_array_equal(reader.read_episode(0)["action"], old)  # the handle it reads: the old file
    fresh = open_dataset(root)  # a later run
    fresh.column_store = ColumnStore(store_dir, **SMALL)
    assert (fresh.read_episode(0)["action"] == 999.0).all()
    assert len(_stored_files(store_dir)) == 2


def test_a_rewrite_in_place_with_size_and_mtime_restored_changes_the_stamp(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 100)
    before = path.stat()
    time.sleep(0.01)
    with open(path, "r+b") as f:
        f.write(b"b" * 100)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert after.st_size == before.st_size and after.st_mtime_ns == before.st_mtime_ns
    assert stamp_from_stat(after) != stamp_from_stat(before)


def test_a_store_file_of_another_entry_is_refused_and_rebuilt(tmp_path, caplog) -> None:
    want = _all_episodes(_reader(None))
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    target = store.path_for(reader.data_path(0), _stamp(reader), _columns(reader))
    other = open_dataset(shared_dataset("r1_v30_h264"))  # 790 rows in one group: stored with a lower threshold
    other.column_store = ColumnStore(tmp_path / "other", min_group_rows=100, min_ratio=1)
    other.read_episode(0, ["action"])
    [other_file] = _stored_files(tmp_path / "other")
    target.parent.mkdir(parents=True)
    shutil.copy(other_file, target)  # another file's copy under cr5's entry name
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(reader), want)
    assert any("was written for" in r.getMessage() and "deleting it" in r.getMessage() for r in caplog.records)


def test_reads_of_column_subsets_share_one_copy_of_every_column_read(tmp_path) -> None:
    direct = _reader(None)
    reader = _reader(ColumnStore(tmp_path, **SMALL))
    for keys in (["action"], [], None, ["observation.state", "action"]):
        got, want = reader.read_episode(5, keys), direct.read_episode(5, keys)
        _assert_same([got], [want])
    assert len(_stored_files(tmp_path)) == 1


def test_a_data_file_deleted_while_open_is_still_read_when_the_store_is_not_wanted(tmp_path) -> None:
    root = _copy_of_cr5(tmp_path)
    reader = open_dataset(root)  # the default store: cr5's 2,733-row group is under its threshold
    first = reader.read_episode(0)
    Path(reader.data_path(0)).unlink()
    np.testing.assert_array_equal(reader.read_episode(0)["index"], first["index"])  # from the open handle


def test_a_disk_without_room_for_the_copy_reads_the_parquet(tmp_path, monkeypatch, caplog) -> None:
    direct = _all_episodes(_reader(None))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        column_store_module.shutil, "disk_usage", lambda _: usage._replace(free=int(0.05 * usage.total) + 1000)
    )
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "would leave less than 5% of the disk free" in warnings[0]
    assert _stored_files(tmp_path) == []


def test_a_network_error_while_converting_is_raised_and_the_store_is_tried_again(tmp_path, monkeypatch) -> None:
    """As a direct read raises it: a blip that outlasts the retries is the network's fault, not the store's."""
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali.errors import RemoteFileError

    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "0")
    want = _all_episodes(_reader(None))
    remote = open_dataset("fakeremote://", storage_options={"root": str(shared_dataset("cr5_v30_av1"))})
    remote.column_store = store = ColumnStore(tmp_path, **SMALL)
    fs = remote.location.fs.fs
    remote._parquet.get(remote.data_path(0))  # the footer read: the file is open
    fs.faults, fs.fault_every = ("timeout",), fs._total + 1  # the next request fails: the conversion's first read
    with pytest.raises(RemoteFileError, match="the last with TimeoutError: fake remote: request for .* timed out"):
        remote.read_episode(0)
    assert fs.faults_injected["timeout"] == 1 and not store._failed and _stored_files(tmp_path) == []
    fs.fault_every = 0
    _assert_same(_all_episodes(remote), want)
    assert len(_stored_files(tmp_path)) == 1


def test_a_damaged_data_file_is_reported_by_the_direct_read_not_as_a_store_failure(tmp_path, caplog) -> None:
    root = _copy_of_cr5(tmp_path)
    data_file = next((root / "data").rglob("*.parquet"))
    raw = bytearray(data_file.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    for i in range(4, len(raw) - footer - 8, 7):  # every page damaged, the footer intact
        raw[i] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    reader = open_dataset(root)
    reader.column_store = ColumnStore(tmp_path / "store", **SMALL)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"), pytest.raises(DataFileError):
        reader.read_episode(0)
    assert not caplog.records and _stored_files(tmp_path / "store") == []


def test_a_store_file_that_cannot_be_opened_here_is_kept(tmp_path, monkeypatch, caplog) -> None:
    want = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    real_map = column_store_module.pa.memory_map

    def no_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(column_store_module.pa, "memory_map", no_descriptors)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), want)
    assert stored.exists() and any("cannot be opened" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(column_store_module.pa, "memory_map", real_map)


def test_the_size_estimate_covers_the_decoded_copy(tmp_path) -> None:
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    reader = _reader(None)
    estimate = column_store_module.arrow_bytes(reader._parquet.get(reader.data_path(0)), _columns(reader))
    assert stored.stat().st_size <= estimate <= 3 * stored.stat().st_size
    # Dictionary and run-length encoding shrink a constant column in parquet, not in Arrow.
    zeros = pa.table({"a": pa.array([[0.0] * 19] * 200_000, type=pa.list_(pa.float32()))})
    pq.write_table(zeros, tmp_path / "zeros.parquet")
    parquet = pq.ParquetFile(tmp_path / "zeros.parquet")
    uncompressed = parquet.metadata.row_group(0).column(0).total_uncompressed_size
    with pa.OSFile(str(tmp_path / "zeros.arrow"), "wb") as sink, pa.ipc.new_file(sink, zeros.schema) as writer:
        writer.write_table(zeros)
    actual = (tmp_path / "zeros.arrow").stat().st_size
    assert uncompressed * 5 < actual <= column_store_module.arrow_bytes(parquet, ["a"]) <= 2 * actual


@pytest.mark.parametrize(
    ("column", "expected"),
    [("b", 10 * 1), ("i", 10 * 4), ("l", 10 * 8), ("f", 10 * 4), ("d", 10 * 8), ("t", 10 * 12), ("v", 20 * 4)],
    ids=["BOOLEAN", "INT32", "INT64", "FLOAT", "DOUBLE", "INT96", "list_of_FLOAT"],
)
def test_the_size_estimate_counts_each_value_at_its_width(tmp_path, column: str, expected: int) -> None:
    """10 rows of each of parquet's fixed-width physical types: 1, 4, 8, 4, 8 and 12 bytes a value (a list's values
    counted one by one, 2 a row), plus 9 bytes of offsets and validity a row. Column "bi" is left out of "b"'s (a
    name that only starts with it is another column)."""
    table = pa.table(
        {
            "b": [True] * 10, "bi": pa.array(range(10), pa.int32()), "i": pa.array(range(10), pa.int32()),
            "l": pa.array(range(10), pa.int64()), "f": pa.array([0.5] * 10, pa.float32()), "d": [0.5] * 10,
            "t": pa.array(range(10), pa.timestamp("ns")), "v": pa.array([[0.5, 1.5]] * 10, pa.list_(pa.float32())),
        }
    )  # fmt: skip
    pq.write_table(table, tmp_path / "widths.parquet", use_deprecated_int96_timestamps=True)
    parquet = pq.ParquetFile(tmp_path / "widths.parquet")
    assert column_store_module.arrow_bytes(parquet, [column]) == expected + 9 * 10


@pytest.mark.parametrize(
    ("values", "buffers"),
    [([1, 2, 3], [b"\x01\0\0\0\x02\0\0\0\x03\0\0\0"]), ([1, None, 3], [b"\x05", b"\x01\0\0\0\0\0\0\0\x03\0\0\0"])],
    ids=["no_nulls", "a_null"],
)
def test_a_batchs_checksum_is_the_crc32_of_its_buffers(values: list, buffers: list[bytes]) -> None:
    """The checksum the store writes with each batch, as files already stored hold it: the crc32 of its buffers in
    order from 0, as 8 hex digits (a column without nulls has no validity buffer; with one, its bitmap 0b101)."""
    crc = 0
    for buffer in buffers:
        crc = zlib.crc32(buffer, crc)
    batch = column_store_module._as_written(pa.record_batch({"n": pa.array(values, pa.int32())}))
    assert column_store_module._batch_sum(batch) == b"%08x" % crc


def test_prefetching_skips_the_row_groups_of_a_stored_file(tmp_path) -> None:
    import tests.fake_remote  # noqa: F401 (registers the fakeremote:// protocol)
    from lerobot_dali.episode_ranges import PARQUET_FOOTER_READ_BYTES, EpisodeRanges

    remote = open_dataset("fakeremote://", storage_options={"root": str(shared_dataset("cr5_v30_av1"))})
    remote.column_store = ColumnStore(tmp_path, **SMALL)
    ranges = EpisodeRanges(remote)
    path = remote.data_path(0)
    size = remote.stamps[path].size
    footer = (path, max(0, size - PARQUET_FOOTER_READ_BYTES), size)
    before = ranges.parquet_ranges(3)
    assert before[0] == footer and len(before) == 2  # the footer and the file's one row group
    remote.read_episode(0)  # converts the file
    assert ranges.parquet_ranges(3) == [footer]
    remote.column_store = ColumnStore(tmp_path, min_group_rows=10**6)  # a store that does not want the file
    assert ranges.parquet_ranges(3) == before


def test_another_users_lock_file_is_locked_read_only(tmp_path, monkeypatch) -> None:
    """A shared cache: a lock file left by another user (mode 0644) cannot be opened for writing."""
    import builtins

    from lerobot_dali import cache_dirs

    lock = tmp_path / "entry.lock"
    lock.write_bytes(b"")
    real_open = builtins.open

    def as_another_user(path, mode="r", *args, **kwargs):
        if str(path) == str(lock) and mode != "rb":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", as_another_user)
    held = cache_dirs.try_flock(lock)
    assert held is not None and held.mode == "rb"
    assert cache_dirs.try_flock(lock) is None  # held: another process converts
    held.close()


def test_one_entry_refused_leaves_the_other_entries_converting(tmp_path, monkeypatch, caplog) -> None:
    """A permission error on one entry (another user's fan-out folder) is that entry's, not the folder's."""
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    blocked = store.path_for(reader.data_path(0), _stamp(reader), _columns(reader))
    from lerobot_dali import cache_dirs

    real_try_flock = cache_dirs.try_flock

    def refusing(path):
        if path == blocked.with_suffix(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_try_flock(path)

    monkeypatch.setattr(cache_dirs, "try_flock", refusing)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(reader), _all_episodes(_reader(None)))
        path = reader.data_path(0)
        other = store.rows(
            reader._parquet.get(path), threading.Lock(), path=path, stamp=_stamp(reader), stored_columns=["action"],
            columns=["action"], row_start=0, length=5,
        )  # fmt: skip
    assert other is not None and len(other) == 5 and store._unwritable is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith(f"column store: cannot write {blocked}")


def _unversioned_run(monkeypatch):
    """A run reading cr5 from a server that gives its files no version (no ETag, Last-Modified or hash: ``run:``
    stamps, a new one each run), through the store."""
    from lerobot_dali.file_stamps import _VERSION_FIELDS
    from tests.fake_remote import FakeRemoteFileSystem

    real = FakeRemoteFileSystem._public

    def no_version(self, entry):
        return {k: v for k, v in real(self, entry).items() if k not in {name for name, _ in _VERSION_FIELDS}}

    monkeypatch.setattr(FakeRemoteFileSystem, "_public", no_version)
    remote = open_dataset("fakeremote://", storage_options={"root": str(shared_dataset("cr5_v30_av1"))})
    assert _stamp(remote).version.startswith("run:")
    return remote


def test_a_run_of_a_server_without_versions_deletes_the_copies_earlier_runs_left(tmp_path, monkeypatch) -> None:
    """Each run of a server that gives no file version wrote a new whole Arrow copy (1.3-2.3x the parquet) that no later
    run could use, kept until the 30-day sweep: 3 runs, 3 copies (10 runs of a 44 MB copy: 440 MB). A run's copy now
    deletes those of earlier runs that no process maps; a run still reading keeps its own."""
    direct = _all_episodes(_reader(None))
    runs = []
    for _ in range(3):
        remote = _unversioned_run(monkeypatch)
        remote.column_store = ColumnStore(tmp_path, **SMALL)
        _assert_same(_all_episodes(remote), direct)
        runs.append(remote)
        del remote.column_store  # (the run ends: its process maps nothing any more)
    [stored] = _stored_files(tmp_path)
    key = pa.ipc.open_file(pa.memory_map(str(stored))).schema.metadata[b"lerobot_dali.column_store.key"].decode()
    assert _stamp(runs[-1]).version in key  # the last run's

    first = _unversioned_run(monkeypatch)  # a run still reading while the next one starts (another rank, or job)
    first.column_store = ColumnStore(tmp_path, **SMALL)
    _assert_same(_all_episodes(first), direct)
    second = _unversioned_run(monkeypatch)
    second.column_store = ColumnStore(tmp_path, **SMALL)
    _assert_same(_all_episodes(second), direct)
    assert len(_stored_files(tmp_path)) == 2  # the first run's copy is its own while it maps it
    _assert_same(_all_episodes(first), direct)
    del first.column_store
    third = _unversioned_run(monkeypatch)
    third.column_store = ColumnStore(tmp_path, **SMALL)
    _assert_same(_all_episodes(third), direct)
    assert len(_stored_files(tmp_path)) == 2  # the second's still mapped; the first's gone
    assert third.column_store.path_for(third.data_path(0), _stamp(third), _columns(third)) in _stored_files(tmp_path)


def test_a_runs_new_copy_is_held_from_its_rename_until_it_is_mapped(tmp_path, monkeypatch) -> None:
    """A one-run copy is renamed into place before its converter maps it: the converter holds it meanwhile, so
    another run's converter deleting the copies no process holds (between the two) leaves it."""
    from lerobot_dali.cache_dirs import delete_unless_held

    remote = _unversioned_run(monkeypatch)
    remote.column_store = ColumnStore(tmp_path, **SMALL)
    real_map, deleted = ColumnStore._map, []

    def map_after_another_runs_sweep(self, entry, expected_rows):
        if entry.target.exists():  # (converted, not yet mapped)
            deleted.append(delete_unless_held(entry.target))
        return real_map(self, entry, expected_rows)

    monkeypatch.setattr(ColumnStore, "_map", map_after_another_runs_sweep)
    _assert_same([remote.read_episode(0)], [_reader(None).read_episode(0)])
    assert deleted == [False] and len(_stored_files(tmp_path)) == 1


_UNVERSIONED_RANK = """
import hashlib, logging, os, sys, time
from pathlib import Path
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.file_stamps import _VERSION_FIELDS
from tests.fake_remote import FakeRemoteFileSystem

logging.basicConfig(level=logging.INFO, format="%(message)s")
real, versions = FakeRemoteFileSystem._public, {name for name, _ in _VERSION_FIELDS}
FakeRemoteFileSystem._public = lambda self, entry: {k: v for k, v in real(self, entry).items() if k not in versions}
remote = open_dataset("fakeremote://", storage_options={"root": sys.argv[1]})
remote.column_store = ColumnStore(sys.argv[2], min_group_rows=1000, min_ratio=4)
digest = hashlib.sha256()
for pos in range(remote.num_episodes):
    for key, values in sorted(remote.read_episode(pos).items()):
        digest.update(key.encode() + values.tobytes())
done = Path(sys.argv[3])  # (each rank maps its copy until all have read, as ranks of one job do)
(done / os.environ["RANK"]).touch()
deadline = time.monotonic() + 60
while len(os.listdir(done)) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
    time.sleep(0.01)
print(digest.hexdigest())
"""


def test_the_ranks_of_one_launch_on_a_server_without_versions_write_one_copy(tmp_path) -> None:
    """Each rank took a run version of its own for files its server gives no version, so each wrote its own whole
    Arrow copy of every data file: 2 ranks of one torchrun agent wrote 2 copies, 4 ranks 4 (8 on a node of 8 GPUs).
    The ranks of one launch on a node now share one (another launch gets another: test_distributed)."""
    direct = hashlib.sha256()
    for episode in _all_episodes(_reader(None)):
        for key, values in sorted(episode.items()):
            direct.update(key.encode() + values.tobytes())
    (tmp_path / "done").mkdir()
    store = tmp_path / "columns"
    digests = run_ranks(_UNVERSIONED_RANK, 2, str(shared_dataset("cr5_v30_av1")), str(store), str(tmp_path / "done"))
    assert [d.strip() for d in digests] == [direct.hexdigest()] * 2
    assert len(_stored_files(store)) == 1


def test_a_run_finds_room_for_its_copy_where_an_earlier_runs_took_it(tmp_path, monkeypatch, caplog) -> None:
    """A disk with room for one copy: the earlier runs' copies were deleted only after a conversion, which the room
    check before it refused, so every run after the first read the parquet (whole row groups per read) while a copy
    no run could use filled the room until the sweep: 2 of 2 later runs refused. The earlier copies go first now."""
    direct = _all_episodes(_reader(None))
    usage = shutil.disk_usage(tmp_path)
    need = column_store_module.arrow_bytes(pq.ParquetFile(_reader(None).data_path(0)), _columns(_reader(None)))

    def one_copy_of_room(_folder: object) -> shutil._ntuple_diskusage:
        used = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
        return usage._replace(free=int(0.05 * usage.total) + need + need // 4 - used)

    monkeypatch.setattr(column_store_module.shutil, "disk_usage", one_copy_of_room)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        for _ in range(3):
            remote = _unversioned_run(monkeypatch)
            remote.column_store = store = ColumnStore(tmp_path, **SMALL)
            _assert_same(_all_episodes(remote), direct)
            assert _stored_files(tmp_path) == [store.path_for(remote.data_path(0), _stamp(remote), _columns(remote))]
            del remote.column_store, store
    assert [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.column_store"] == []


def test_what_converters_of_earlier_runs_killed_mid_write_left_is_deleted(tmp_path, monkeypatch) -> None:
    """A converter killed mid-write leaves its temporary copy (up to a whole one) and its lock file; only a converter
    of the same entry deleted them, which for a server without versions (a new entry each run) was none: they stayed
    until the sweep. A later run's conversion deletes them, not those of a converter still at work (its lock held)."""
    left = {}
    for name in ("killed", "converting"):
        earlier = _unversioned_run(monkeypatch)
        target = ColumnStore(tmp_path, **SMALL).path_for(earlier.data_path(0), _stamp(earlier), _columns(earlier))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_suffix(".lock").touch()
        (target.parent / f".{target.stem}.k3y_1x9q.tmp").write_bytes(b"ARROW1" + bytes(4096))  # (cut short)
        left[name] = sorted(target.parent.glob(f"*{target.stem}*"))
    with open(left["converting"][-1], "a+b") as held:  # (its lock file)
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        remote = _unversioned_run(monkeypatch)
        remote.column_store = ColumnStore(tmp_path, **SMALL)
        _assert_same(_all_episodes(remote), _all_episodes(_reader(None)))
    assert not any(path.exists() for path in left["killed"])
    assert all(path.exists() for path in left["converting"])
    assert len(_stored_files(tmp_path)) == 1


def test_without_file_locks_what_earlier_converters_left_is_kept(tmp_path, monkeypatch) -> None:
    """Where the filesystem takes no locks (NFS without its lock daemon), a converter at work cannot be told from a
    killed one: what an earlier run's converter left is kept for the sweep, not deleted under one still writing."""
    earlier = _unversioned_run(monkeypatch)
    target = ColumnStore(tmp_path, **SMALL).path_for(earlier.data_path(0), _stamp(earlier), _columns(earlier))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_suffix(".lock").touch()
    (target.parent / f".{target.stem}.k3y_1x9q.tmp").write_bytes(b"ARROW1" + bytes(4096))
    left = sorted(target.parent.glob(f"*{target.stem}*"))
    monkeypatch.setattr(
        column_store_module, "try_flock_where_supported", lambda path: (contextlib.nullcontext(), False)
    )
    remote = _unversioned_run(monkeypatch)
    remote.column_store = ColumnStore(tmp_path, **SMALL)
    _assert_same(_all_episodes(remote), _all_episodes(_reader(None)))
    assert len(left) == 2 and all(path.exists() for path in left)
    assert len(_stored_files(tmp_path)) == 1


_EARLIER_RUN = """
import sys, threading
import pyarrow.parquet as pq
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.file_stamps import FileStamp
store = ColumnStore(sys.argv[1], min_group_rows=1000, min_ratio=4)
stamp = FileStamp(int(sys.argv[4]), "run:an-earlier-run")
rows = store.rows(pq.ParquetFile(sys.argv[3]), threading.Lock(), path=sys.argv[2], stamp=stamp,
                  stored_columns=["index"], columns=["index"], row_start=0, length=5)
assert rows is not None
"""


def test_a_copy_of_an_earlier_run_when_the_file_had_another_size_is_deleted(tmp_path, monkeypatch) -> None:
    """The copies a run supersedes were found by a name holding the file's size: one of the file at another size (a
    server without versions rewrote it) was never found, and stayed until the sweep (2 copies after 2 runs; 1 now).
    The earlier run is an earlier process, ended (one in this process releases its maps' locks with a lag)."""
    remote = _unversioned_run(monkeypatch)
    path, stamp = remote.data_path(0), _stamp(remote)
    local = _reader(None).data_path(0)
    subprocess.run([sys.executable, "-c", _EARLIER_RUN, str(tmp_path), path, local, str(stamp.size + 100)], check=True)
    assert len(_stored_files(tmp_path)) == 1
    remote.column_store = ColumnStore(tmp_path, **SMALL)
    rows = remote.column_store.rows(
        remote._parquet.get(path), threading.Lock(), path=path, stamp=stamp, stored_columns=["index"],
        columns=["index"], row_start=0, length=5,
    )  # fmt: skip
    assert rows is not None and rows["index"].to_pylist() == _all_episodes(_reader(None))[0]["index"][:5].tolist()
    assert _stored_files(tmp_path) == [remote.column_store.path_for(path, stamp, ["index"])]


def test_an_entry_names_no_credential_its_path_keeps_and_keys_a_file_by_its_other_parameters(tmp_path: Path) -> None:
    """A filesystem that keeps a URL's query in its paths (``fakeremote://ds?token=...``): an entry's key, written in
    its Arrow file's metadata, named the token. Masked now: a file of another parameter (``a=2``) is another entry,
    the file signed anew the same one, and a local file's entry is where it was."""
    store, stamp = ColumnStore(tmp_path), FileStamp(100, "etag:1")
    signed = [store._entry(f"ds?a={a}&token={token}/data/f.parquet", stamp, ["x"]) for a, token in
              [(1, "S3CRone"), (2, "S3CRone"), (1, "S3CRtwo")]]  # fmt: skip
    assert [e for e in signed if "S3CR" in e.key] == []
    assert signed[0].target != signed[1].target and signed[0].target == signed[2].target
    local = "/data/ds/data/f.parquet"
    digest = hashlib.sha256(json.dumps([column_store_module.STORE_FORMAT, local, 100, "etag:1", ["x"]]).encode())
    assert store.path_for(local, stamp, ["x"]) == tmp_path / digest.hexdigest()[:2] / f"{digest.hexdigest()}.arrow"
    # One run's copy: named for the file and columns, then 16 hex digits of the run, in the file's folder.
    file = hashlib.sha256(json.dumps([column_store_module.STORE_FORMAT, local, ["x"]]).encode()).hexdigest()
    run = hashlib.sha256(json.dumps(["run:1", 100]).encode()).hexdigest()[:16]
    assert store.path_for(local, FileStamp(100, "run:1"), ["x"]) == tmp_path / file[:2] / f"{file}.{run}.arrow"


def test_the_store_is_wanted_from_its_row_floor_and_ratio_on() -> None:
    store = ColumnStore("unused", **SMALL)
    assert [store.wants(1000, 250), store.wants(999, 1), store.wants(1000, 251), store.wants(4000, 0)] == [
        True, False, False, True,
    ]  # fmt: skip


class _OneGroupFile:
    """A parquet file of 5,000 rows (``n`` = row, ``v`` = 2 x row) in one row group, read through ``store.rows``."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "data.parquet"
        pq.write_table(pa.table({"n": range(5000), "v": range(0, 10000, 2)}), self.path, row_group_size=5000)
        self.parquet = pq.ParquetFile(self.path)

    def rows(self, store: ColumnStore, start: int, stored: tuple[str, ...] = ("n", "v")) -> pa.Table | None:
        return store.rows(
            self.parquet, threading.RLock(), path=str(self.path), stamp=stamp_from_stat(self.path.stat()),
            stored_columns=list(stored), columns=list(stored), row_start=start, length=300,
        )  # fmt: skip


def _rewritten(stored: Path, table: pa.Table, key: bytes | None = None) -> None:
    """Write ``table`` over the store file ``stored``, each batch with its checksum, under its key or ``key``."""
    metadata = dict(pa.ipc.open_file(pa.BufferReader(stored.read_bytes())).schema.metadata)
    if key is not None:
        metadata[column_store_module._KEY_METADATA] = key
    with pa.ipc.new_file(str(stored), table.schema.with_metadata(metadata)) as writer:
        for batch in table.to_batches():
            summed = column_store_module._batch_sum(column_store_module._as_written(batch))
            writer.write_batch(batch, custom_metadata={column_store_module._SUM_METADATA: summed})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda t, key: (t.slice(0, 4000), None), "with 4000 rows, not for"),  # (rows cut)
        (lambda t, key: (t, key.replace(b'"n"', b'"m"')), "written for [2, "),  # (another entry's key, same rows)
        (lambda t, key: (t.select(["n"]), None), "with 5000 rows, not for"),  # (a column left out)
    ],
    ids=["fewer_rows", "another_key", "a_column_missing"],
)
def test_a_store_file_that_is_not_the_entrys_whole_copy_is_refused(tmp_path, caplog, change, said) -> None:
    """A file under an entry's name is served only if it holds the entry's key, every row of the data file and every
    column asked for; each alone is not enough (each test here changes one of them, its checksums intact)."""
    data = _OneGroupFile(tmp_path)
    store = ColumnStore(tmp_path / "store", **SMALL)
    assert data.rows(store, 0) is not None
    [stored] = _stored_files(tmp_path / "store")
    table = pa.ipc.open_file(pa.BufferReader(stored.read_bytes())).read_all()
    _rewritten(stored, *change(table, table.schema.metadata[column_store_module._KEY_METADATA]))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        got = data.rows(ColumnStore(tmp_path / "store", **SMALL), 4500)
    assert got is not None and got["v"].to_pylist() == list(range(9000, 9600, 2))  # (converted again)
    [warned] = [r.getMessage() for r in caplog.records if "deleting it" in r.getMessage()]
    assert said in warned


def test_damage_in_a_files_first_batch_is_found_and_named_by_its_rows(tmp_path, monkeypatch, caplog) -> None:
    """Rows 100-399 lie in the first of five 1,000-row batches, which alone holds them: it is checked (the check's
    range once stopped short of the last batch it covers) and named as rows 0-999."""
    monkeypatch.setattr(column_store_module, "_CONVERT_BATCH_ROWS", 1000)
    data = _OneGroupFile(tmp_path)
    assert data.rows(ColumnStore(tmp_path / "store", **SMALL), 0) is not None
    [stored] = _stored_files(tmp_path / "store")
    raw = stored.read_bytes()
    at = raw.find(np.array([200, 202], np.int64).tobytes())  # (v of rows 100-101, in the first batch)
    assert at > 0
    with stored.open("r+b") as file:
        file.seek(at)
        file.write(np.int64(7).tobytes())
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        assert data.rows(ColumnStore(tmp_path / "store", **SMALL), 100) is None
    [warned] = [r.getMessage() for r in caplog.records]
    assert "rows 0-999 of" in warned and "disagree with their checksum" in warned


def test_a_process_maps_a_stored_file_once_and_checks_its_batches_once(tmp_path, monkeypatch) -> None:
    """Every read of cr5's 12 episodes, twice, slices the one mapping of its copy (one batch of 2,733 rows): its
    checksum is computed once, not at each read (a read that mapped the file again checked it again)."""
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))  # (converted by an earlier process)
    real_sum, summed = column_store_module._batch_sum, []
    monkeypatch.setattr(column_store_module, "_batch_sum", lambda batch: summed.append(1) or real_sum(batch))
    reader = _reader(ColumnStore(tmp_path, **SMALL))
    _all_episodes(reader)
    [mapped] = reader.column_store._open.values()
    _assert_same(_all_episodes(reader), _all_episodes(_reader(None)))
    [again] = reader.column_store._open.values()
    assert again is mapped and len(summed) == 1


def test_the_least_recently_read_entry_is_unmapped_past_max_open(tmp_path) -> None:
    data = _OneGroupFile(tmp_path)
    store = ColumnStore(tmp_path / "store", **SMALL, max_open=2)
    entries = [("n",), ("v",), ("n", "v")]  # (three column selections: three entries of one file)
    stamp = stamp_from_stat(data.path.stat())
    targets = [store.path_for(str(data.path), stamp, list(columns)) for columns in entries]
    for columns in (entries[0], entries[1], entries[0], entries[2]):
        assert data.rows(store, 0, columns) is not None
    assert list(store._open) == [targets[0], targets[2]]  # (the second entry, read least recently, unmapped)
