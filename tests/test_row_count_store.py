"""Opening a v3.0 dataset (or a v2.1 one) reads each data file's footer (its row count) once per cache folder: later
opens, other ranks on the node and resumed jobs read the kept counts; ranks opening at once wait for the first."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lerobot_dali import row_count_store
from lerobot_dali.cache_dirs import checksummed, try_flock
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import EpisodeMetadataError
from lerobot_dali.file_stamps import FileStamp
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)
from tests.other_host import on_another_host
from tests.replace_on_warning import replaced_when_warned

SPEC = dict(
    episodes=6, frames_per_episode=[3, 4, 5, 3, 4, 5], cameras=1, codec="vp9", episodes_per_file=2, size=(64, 64)
)


@pytest.fixture
def footer_reads(monkeypatch) -> list[str]:
    """Every data file footer read at open, by path."""
    from lerobot_dali import episode_data_files

    reads: list[str] = []
    real = episode_data_files._footer

    def counting(location, path, **kwargs):
        reads.append(path)
        return real(location, path, **kwargs)

    monkeypatch.setattr(episode_data_files, "_footer", counting)
    return reads


def _open_remote(root: Path):
    return open_dataset("fakeremote://", storage_options={"root": str(root)})


def test_a_second_open_reads_no_footer_and_a_changed_file_is_read_again(make_ds, copy_ds, footer_reads) -> None:
    root = copy_ds(make_ds(**SPEC))
    first = _open_remote(root)
    assert sorted(footer_reads) == [f"data/chunk-000/file-00{i}.parquet" for i in range(3)]
    again = _open_remote(root)
    assert len(footer_reads) == 3  # none more
    for name in ("data_chunk_index", "data_file_index", "data_row_start", "data_file_rows"):
        assert np.array_equal(getattr(again.episodes, name), getattr(first.episodes, name)), name
    assert open_dataset(root).num_frames == again.num_frames and len(footer_reads) == 6  # (local: other paths)
    # One data file rewritten with a row less (another size): its set of files misses, and the check fails.
    path = root / "data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    with pytest.raises(EpisodeMetadataError, match=r"places 8 rows in .*file-001\.parquet, which holds 7"):
        _open_remote(root)
    assert sorted(footer_reads[6:]) == [f"data/chunk-000/file-00{i}.parquet" for i in range(3)]


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_a_local_dataset_is_read_once_and_a_rewritten_file_again(make_ds, copy_ds, footer_reads, version) -> None:
    """Local footers are kept by each file's stat (a v2.1 dataset of 15,000 episodes read them all on every rank's
    build: 6.6 s of CPU); a file rewritten since is read again, and the check still fails."""
    root = copy_ds(make_ds(**SPEC, version=version))
    first = open_dataset(root)
    files = sorted(footer_reads)
    assert len(files) == (3 if version == "v3.0" else 6)
    again = open_dataset(root)
    assert len(footer_reads) == len(files)  # none more
    for name in ("data_chunk_index", "data_file_index", "data_row_start", "data_file_rows", "length"):
        assert np.array_equal(getattr(again.episodes, name), getattr(first.episodes, name)), name
    path = Path(files[1])
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    with pytest.raises(EpisodeMetadataError, match=rf"{path.name}.* holds {table.num_rows - 1}"):
        open_dataset(root)
    assert sorted(footer_reads[len(files) :]) == files


def test_hosts_sharing_the_cache_and_the_dataset_read_the_footers_once(
    make_ds, copy_ds, footer_reads, monkeypatch, tmp_path
) -> None:
    """A dataset on an NFS share that each node mounts with a device number of its own, its cache in the shared
    $HOME: local stamps held the device, so each host read every footer and kept an entry of its own (2 hosts: 12
    reads here, 2 entries), and a host did not wait for another reading them at once."""
    root = copy_ds(make_ds(**SPEC, version="v2.1"))
    open_dataset(root)
    with on_another_host(monkeypatch, tmp_path):
        open_dataset(root)
    entries = list((Path(os.environ["LEROBOT_DALI_CACHE"]) / "row_counts").glob("*/*.json"))
    assert len(footer_reads) == 6 and len(entries) == 1


def test_a_cache_folder_that_cannot_be_opened_reads_the_footers_without_a_warning(
    make_ds, footer_reads, monkeypatch, tmp_path, caplog
) -> None:
    """Local footers go through the store too since they are kept: a cache folder that is a file (or another user's)
    warned twice per open that an entry was unreadable and 'deleted' (nothing was), on every open of every dataset."""
    root = make_ds(**SPEC)
    blocked = tmp_path / "not-a-folder"
    blocked.write_bytes(b"")
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(blocked))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.row_count_store"):
        readers = [open_dataset(root) for _ in range(2)]
    assert [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.row_count_store"] == []
    assert len(footer_reads) == 6 and {r.num_frames for r in readers} == {sum(SPEC["frames_per_episode"])}


def test_ranks_opening_at_once_read_the_footers_once(make_ds, footer_reads, monkeypatch) -> None:
    root = make_ds(**SPEC)
    started = threading.Barrier(4)
    real = row_count_store.wait_for_entry_lock

    def together(entry, **kwargs):  # every "rank" asks for the lock only once all have missed the kept counts
        started.wait(timeout=30)
        return real(entry, **kwargs)

    monkeypatch.setattr(row_count_store, "wait_for_entry_lock", together)
    readers: list = []
    threads = [threading.Thread(target=lambda: readers.append(_open_remote(root))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(readers) == 4 and len({r.num_frames for r in readers}) == 1
    assert len(footer_reads) == 3  # one "rank" read them; three waited for its result
    # A waiter made the lock file again once the reader had deleted it, locked it, found the counts and left it.
    assert not list((row_count_store.cache_root() / "row_counts").rglob("*.lock"))


def test_an_entry_replaced_while_found_unreadable_is_kept(make_ds, footer_reads) -> None:
    """An open that found a damaged entry deleted the path after: the good entry another rank had renamed over it
    meanwhile went too, and the open read every footer again."""
    root = make_ds(**SPEC)
    _open_remote(root)
    (entry,) = (row_count_store.cache_root() / "row_counts").glob("*/*")
    good = entry.read_bytes()
    entry.write_bytes(good[:10])
    with replaced_when_warned("lerobot_dali.row_count_store", entry, good) as warnings:
        _open_remote(root)
    assert len(warnings) == 1 and "unreadable" in warnings[0]
    assert entry.read_bytes() == good and len(footer_reads) == 3  # none read again


def test_an_unreadable_entry_or_a_held_lock_falls_back_to_reading(make_ds, footer_reads, monkeypatch, caplog) -> None:
    root = make_ds(**SPEC)
    _open_remote(root)
    (entry,) = (row_count_store.cache_root() / "row_counts").glob("*/*")  # (its lock file gone with the lock)
    other = {"paths": ["elsewhere"], "rows": [1], "columns": [["action"]], "list_widths": [[[7]]]}
    entry.write_bytes(checksummed(json.dumps({**other, "value_ranges": [{}]}).encode()))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.row_count_store"):
        _open_remote(root)
    assert caplog.text.count("unreadable (it holds other files); deleting it") == 1 and len(footer_reads) == 6
    kept = row_count_store._load(entry, sorted(set(footer_reads)))  # rewritten
    assert kept is not None and [footer.rows for footer in kept] == [7, 8, 9]
    schema = pq.read_schema(next((root / "data").rglob("*.parquet")))
    assert {footer.columns for footer in kept} == {tuple(schema.names)}
    assert all("task_index" in footer.value_ranges for footer in kept)
    entry.unlink()
    monkeypatch.setattr(row_count_store, "WAIT_S", 0.3)
    held = try_flock(entry.with_suffix(".lock"))  # a process that stalls holding the lock
    assert held is not None
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.row_count_store"):
        reader = _open_remote(root)
    held.close()
    assert "has held its lock for 0 s; reading without it" in caplog.text and len(footer_reads) == 9
    assert reader.num_frames == sum(SPEC["frames_per_episode"])


def test_an_entry_a_byte_of_which_the_disk_changed_is_read_again_not_trusted(tmp_path, caplog) -> None:
    """Most changes of a byte leave an entry JSON of the right shape (a row count of 123 read as 124): trusted, it
    refused the dataset at each open for a row count its file does not hold (176 of 3,000 random one- and two-byte
    changes served other footers). Behind a line of its sha256 now, as the packet index store's: read again."""
    footer = row_count_store.Footer(123, ("a",), ((),), {"task_index": (0, 5)})
    reads: list[list[str]] = []

    def read(paths: list[str]) -> list[row_count_store.Footer]:
        reads.append(paths)
        return [footer]

    stamps = {"a.parquet": FileStamp(10, "etag:1")}
    folder = tmp_path / "row_counts"
    assert row_count_store.cached_footers(stamps, ["a.parquet"], read, directory=folder) == [footer]
    (entry,) = folder.glob("*/*.json")
    entry.write_bytes(entry.read_bytes().replace(b"[123]", b"[124]"))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.row_count_store"):
        assert row_count_store.cached_footers(stamps, ["a.parquet"], read, directory=folder) == [footer]
    assert len(reads) == 2 and "its checksum disagrees with its contents" in caplog.text
    assert row_count_store.cached_footers(stamps, ["a.parquet"], read, directory=folder) == [footer]
    assert len(reads) == 2  # (kept again)
