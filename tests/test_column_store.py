"""Episodes of data files written as one big row group are read from memory-mapped Arrow copies: same values as
the parquet, one conversion per file shared by processes, and every store failure falls back to the parquet."""

from __future__ import annotations

import fcntl
import logging
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from conftest import shared_dataset

from lerobot_dali import column_store as column_store_module
from lerobot_dali.column_store import ColumnStore
from lerobot_dali.dataset_reader import open_dataset

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
    target = store.path_for(reader.data_path(0), reader._store_entry(reader.data_path(0))[1], _columns(reader))
    target.parent.mkdir(parents=True)
    with open(target.with_suffix(".lock"), "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another process is converting the file
        _assert_same(_all_episodes(reader), direct)
        assert _stored_files(tmp_path) == []
    _assert_same(_all_episodes(reader), direct)  # the lock released: this process converts it now
    assert _stored_files(tmp_path) == [target]


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
    stamp = reader._store_entry(path)[1]
    assert stamp.version.startswith("mtime:") and stamp.size == Path(path).stat().st_size
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
    stamp = remote._store_entry(remote.data_path(0))[1]
    assert stamp == remote.stamps[remote.data_path(0)] and stamp.version  # from the listing, not a request
    reads_after_first_pass = fs.requests["read"]
    _assert_same(_all_episodes(remote), direct)
    assert fs.requests["read"] == reads_after_first_pass  # the mapped copy serves every later read


def test_a_conversion_killed_mid_write_leaves_no_file_behind(tmp_path) -> None:
    store = ColumnStore(tmp_path, **SMALL)
    reader = _reader(store)
    target = store.path_for(reader.data_path(0), reader._store_entry(reader.data_path(0))[1], _columns(reader))
    target.parent.mkdir(parents=True)
    stale = target.parent / f".{target.stem}.abc123.tmp"
    stale.write_bytes(b"half an arrow file")
    other = target.parent / ".someotherentry.abc123.tmp"  # another entry's conversion, maybe running now
    other.write_bytes(b"x")
    _all_episodes(reader)
    assert not stale.exists() and other.exists() and target.exists()
