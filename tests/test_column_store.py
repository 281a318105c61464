"""Episodes of data files written as one big row group are read from memory-mapped Arrow copies: same values as
the parquet, one conversion per file shared by processes, and every store failure falls back to the parquet."""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import shared_dataset

from lerobot_dali import column_store as column_store_module
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.file_stamps import FileStamp, stamp_from_stat

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


def test_files_under_the_threshold_are_read_from_the_parquet(tmp_path) -> None:
    direct = _all_episodes(_reader(None))
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, min_group_rows=5000))), direct)
    _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, min_group_rows=1000, min_ratio=20))), direct)
    assert _stored_files(tmp_path) == []


def test_an_unreadable_store_file_is_deleted_and_rebuilt(tmp_path, caplog) -> None:
    direct = _all_episodes(_reader(None))
    _all_episodes(_reader(ColumnStore(tmp_path, **SMALL)))
    [stored] = _stored_files(tmp_path)
    stored.write_bytes(stored.read_bytes()[:1000])  # truncated
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        _assert_same(_all_episodes(_reader(ColumnStore(tmp_path, **SMALL))), direct)
    assert any("is unreadable" in r.getMessage() and "deleting it" in r.getMessage() for r in caplog.records)
    assert _stored_files(tmp_path) == [stored] and stored.stat().st_size > 1000


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
    assert len(warnings) == 1 and "cannot write" in warnings[0] and "cr5_v30_av1" in warnings[0]


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
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    want_all = _all_episodes(_reader(None))
    want_action = _reader(None).read_episode(0, keys=["action"])["action"]
    _all_episodes(reader)
    [everything] = _stored_files(tmp_path)
    actions_only = store.path_for(reader.data_path(0), _stamp(reader), ["action", *_columns(reader)[-5:]])
    # (keys=["action"] reads action and the index columns)
    actions_only.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(everything, actions_only)  # a file under another entry's name: more columns, same rows
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.column_store"):
        fresh = _reader(ColumnStore(tmp_path, **SMALL))
        np.testing.assert_array_equal(fresh.read_episode(0, keys=["action"])["action"], want_action)
    assert any("was written for" in r.getMessage() for r in caplog.records)
    _assert_same(_all_episodes(fresh), want_all)


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
