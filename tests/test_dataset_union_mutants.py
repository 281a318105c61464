"""``DatasetUnion``: behaviour a second mutation pass over :mod:`lerobot_dali.dataset_union` found untested, on the
two datasets of :mod:`tests.test_dataset_union` (5 + 7 + 4 and 9 + 3 frames, v3.0 and v2.1, task seeds 0 and 1)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import fsspec
import numpy as np
import pytest

from lerobot_dali import concat_datasets, open_dataset
from lerobot_dali.dataset_union import (
    DATASET_IDENTITIES,
    DatasetUnion,
    MemberFileSystems,
    datasets_held,
    open_all,
    refuse_another_order,
)
from lerobot_dali.errors import ResumeStateError
from lerobot_dali.frame_lookup import ITERATORS_LOOKUP
from tests.http_server import serve_folder
from tests.test_dataset_union import _datasets, _without
from tests.test_extra_features import SUBTASKS, _with_subtasks


@pytest.mark.parametrize("position", [5, 6, -1])
def test_a_position_past_the_unions_episodes_is_refused_naming_the_union(make_ds, position: int) -> None:
    """The union holds 3 + 2 episodes: position 5 (one past the end), 6 or -1 is no episode of it, refused naming the
    union and its positions; without the check, -1 was the last dataset's position -6 (refused naming that dataset)
    and 5 its position 2 of a third dataset the union does not have."""
    union = concat_datasets(_datasets(make_ds))
    said = re.escape(
        f"episode position {position} is not one of the 5 episodes {union.location.description} reads (positions 0..4"
    )
    for asked in (union.member, union.read_episode, union.data_path, union.source_of):
        with pytest.raises(IndexError, match=f"^{said}"):
            asked(position)
    assert [union.member(pos) for pos in range(5)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_a_union_without_its_dataset_index_reads_rows_without_it(make_ds) -> None:
    """A union read beside other datasets (a mixture's) carries no dataset_index in its rows, nor declares it; the
    union itself gives every row of the second dataset's episodes dataset_index 1."""
    union = concat_datasets(_datasets(make_ds))
    rows = union.read_episode(3)
    np.testing.assert_array_equal(rows["dataset_index"], np.ones(9, dtype=np.int64))
    assert rows["dataset_index"].dtype == np.int64
    bare = union.without_dataset_index()
    for pos in range(5):
        assert "dataset_index" not in bare.read_episode(pos)
    assert "dataset_index" not in bare.tabular_keys and "dataset_index" not in bare.info.features
    assert set(bare.read_episode(3)) == set(rows) - {"dataset_index"}


def test_a_union_of_datasets_without_task_index_reads_their_rows_without_it(make_ds, tmp_path) -> None:
    """Datasets that declare no task_index (refused by the iterator, which batches it) still read their rows through
    the union: without a task_index, none offset."""
    first, second = _datasets(make_ds)
    paths = [_without(path, tmp_path / f"no_task_index_{i}", "task_index") for i, path in enumerate((first, second))]
    union = concat_datasets(paths)
    rows = union.read_episode(3)
    assert "task_index" not in rows
    np.testing.assert_array_equal(rows["frame_index"], np.arange(9))
    np.testing.assert_array_equal(rows["dataset_index"], np.ones(9, dtype=np.int64))
    assert "task_index" not in union.read_episode(0) and len(union.read_episode(0)["index"]) == 5


class _HoldsEvery:
    """A column store that wants every read and holds every file: records the (path, stamp) it was asked of."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, object]] = []

    def wants(self, group_rows: int, rows: int) -> bool:
        return True

    def holds(self, path: str, stamp: object, columns: list[str]) -> bool:
        self.asked.append((path, stamp))
        return True


def test_a_remote_unions_stored_rows_are_asked_of_the_dataset_holding_the_file(make_ds, tmp_path_factory) -> None:
    """Whether an episode's rows are stored is asked of the column store of the dataset whose listing holds its data
    file, with that dataset's stamp of it (another dataset's listing has no such file)."""
    paths = _datasets(make_ds)
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([f"{server.url}/{p.parent.name}/{p.name}" for p in paths])
        stores = [_HoldsEvery(), _HoldsEvery()]
        for member, store in zip(union.members, stores, strict=True):
            member.column_store = store
        assert [union.rows_stored(union.data_path(pos), 4, 5) for pos in range(5)] == [True] * 5
        for d, store in enumerate(stores):
            own = [pos for pos in range(5) if union.member(pos)[0] == d]
            expected = [(union.data_path(pos), union.members[d].stamps[union.data_path(pos)]) for pos in own]
            assert sorted(set(store.asked)) == sorted(set(expected)), (d, store.asked)
        # (a path no dataset's listing holds: no store is asked)
        assert not union.rows_stored(f"{server.url}/elsewhere/data.parquet", 4, 5)


def test_a_unions_copy_for_workers_drops_the_task_texts_and_a_selection_keeps_them(make_ds) -> None:
    """Workers never read task texts: the union's copy for them holds none (nor do its datasets), while its rows keep
    the union's task_index (the second dataset's offset by the first's two tasks); a selection keeps the texts."""
    union = concat_datasets(_datasets(make_ds))
    assert union.tasks == {0: union.tasks[0], 1: union.tasks[1], 2: union.tasks[2], 3: union.tasks[3]}
    workers = union.for_workers()
    assert workers.tasks == {} and [member.tasks for member in workers.members] == [{}, {}]
    assert workers.task_offsets == union.task_offsets == (0, 2)
    for pos in range(5):
        np.testing.assert_array_equal(workers.read_episode(pos)["task_index"], union.read_episode(pos)["task_index"])
    assert set(union.read_episode(3)["task_index"].tolist()) <= {2, 3}
    assert union.select(keys=["action"]).tasks == union.tasks


def test_a_remote_unions_copies_share_its_file_stamps(make_ds, tmp_path_factory, tmp_path) -> None:
    """A remote union's copies (a selection, the workers' copy) hold one table of stamps with it: a file first stamped
    through a copy is the union's too (asked again through it after a rewrite, the new file was stamped, and read),
    and the other way round."""
    paths = _datasets(make_ds)
    base = tmp_path_factory.getbasetemp()
    for name in ("first.bin", "second.bin"):
        (tmp_path / name).write_bytes(b"x" * 10)
    with serve_folder(base) as server:
        union = concat_datasets([f"{server.url}/{p.parent.name}/{p.name}" for p in paths])
        files = [f"{server.url}/{(tmp_path / name).relative_to(base)}" for name in ("first.bin", "second.bin")]
        assert not any(path in union.stamps for path in files)
        selected, workers = union.select(keys=["action"]), union.for_workers()
        stamp = selected.stamps[files[0]]
        assert stamp.size == 10
        assert files[0] in union.stamps and files[0] in workers.stamps
        assert union.stamps[files[0]] is stamp and workers.stamps[files[0]] is stamp
        stamp = union.stamps[files[1]]
        assert files[1] in selected.stamps and selected.stamps[files[1]] is stamp and workers.stamps[files[1]] is stamp


def test_a_union_of_three_datasets_names_all_three_and_no_digest(make_ds) -> None:
    """Up to three datasets the description names each of them alone (past three: the count and a digest)."""
    first, second = _datasets(make_ds)
    union = concat_datasets([first, second, first])
    assert union.location.description == f"union of {first}, {second}, {first}"


def test_a_union_built_from_readers_alone_reads_each_under_its_own_keys(make_ds) -> None:
    """``DatasetUnion(readers)`` without renames or lookups: each dataset's keys as its own, its rows finding their
    frames as the iterator says, its tasks numbered after the previous dataset's, dataset_index in every row."""
    first, second = _datasets(make_ds)
    union = DatasetUnion([open_dataset(first), open_dataset(second)])
    built = concat_datasets([first, second])
    assert union.lookups == (ITERATORS_LOOKUP, ITERATORS_LOOKUP)
    assert [dict(rename.to_batch) for rename in union.renames] == [{}, {}]
    assert (union.num_episodes, union.num_frames, union.task_offsets, union.tasks) == (5, 28, (0, 2), built.tasks)
    assert union.camera_keys == built.camera_keys and union.tabular_keys == built.tabular_keys
    for pos in range(5):
        rows, expected = union.read_episode(pos), built.read_episode(pos)
        assert set(rows) == set(expected)
        for key, values in expected.items():
            np.testing.assert_array_equal(rows[key], values)


def test_a_union_of_copies_without_task_texts_keeps_the_texts_it_is_given(make_ds) -> None:
    """A union over its workers' copies of its datasets (which carry no task texts) holds the texts and offsets it is
    given, not an empty task list recomputed from them."""
    union = concat_datasets(_datasets(make_ds))
    workers = [member.for_workers() for member in union.members]
    rebuilt = DatasetUnion(workers, task_offsets=union.task_offsets, tasks=union.tasks)
    assert rebuilt.tasks == union.tasks and len(rebuilt.tasks) == 4 and rebuilt.info.total_tasks == 4
    assert rebuilt.task_offsets == (0, 2)


def test_datasets_without_task_texts_take_up_no_task_indices(make_ds) -> None:
    """Offsets count each dataset's tasks (its highest index plus one): datasets holding no task texts (workers'
    copies) take up none, so every offset is 0; with their texts, the second's follow the first's two."""
    first, second = _datasets(make_ds)
    readers = [open_dataset(first), open_dataset(second)]
    assert DatasetUnion(readers).task_offsets == (0, 2)
    assert DatasetUnion([reader.for_workers() for reader in readers]).task_offsets == (0, 0)
    assert DatasetUnion([readers[0].for_workers(), *readers]).task_offsets == (0, 0, 2)


def test_only_a_dataset_lacking_a_keys_statistics_is_said_to_lack_them(make_ds, copy_ds, caplog) -> None:
    """Every dataset with statistics: nothing said. The second without any: each key is said to lack them in the
    second alone (pooled over the first), never in the first, which has them."""
    first, second = _datasets(make_ds)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        concat_datasets([first, second]).read_stats()
    assert "has no statistics" not in caplog.text, caplog.text
    second = copy_ds(second)
    (second / "meta/episodes_stats.jsonl").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        concat_datasets([first, second]).read_stats()
    said = [r.getMessage() for r in caplog.records if "has no statistics" in r.getMessage()]
    assert any(f"observation.state has no statistics in ['{second}']; pooled over" in line for line in said), said
    assert not any(str(first) in line.split("has no statistics in")[1] for line in said), said


@pytest.mark.parametrize("local_first", [True, False])
def test_a_mixed_unions_filesystem_routes_each_file_to_its_dataset_and_has_the_firsts_protocol(
    make_ds, tmp_path_factory, local_first: bool
) -> None:
    """A local folder and an HTTP dataset: the union's filesystem sends each path to its own dataset's (a local one
    read by path, the remote one's with its options), and speaks its first dataset's protocol."""
    first, second = _datasets(make_ds)
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        url = f"{server.url}/{second.parent.name}/{second.name}"
        union = concat_datasets([first, url] if local_first else [url, first])
        fs = union.location.fs
        assert isinstance(fs, MemberFileSystems) and not union.location.is_local
        member_fs = [member.location.fs for member in union.members]
        assert fs.protocol == member_fs[0].protocol != member_fs[1].protocol
        for pos in range(union.num_episodes):
            d, _ = union.member(pos)
            assert fs.route(union.data_path(pos)) is member_fs[d]
            assert fs.route(union.video(pos, union.camera_keys[0]).path) is member_fs[d]


def test_datasets_read_through_one_client_share_the_first_datasets_filesystem(make_ds, tmp_path_factory) -> None:
    """Local folders alike, and HTTP datasets of one server with the same options: the union reads through its first
    dataset's filesystem itself, no router in front of it."""
    paths = _datasets(make_ds)
    local = concat_datasets(paths)
    assert local.location.fs is local.members[0].location.fs
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        remote = concat_datasets([f"{server.url}/{p.parent.name}/{p.name}" for p in paths])
        assert remote.location.fs is remote.members[0].location.fs
        assert not isinstance(remote.location.fs, MemberFileSystems)


def test_datasets_with_one_subtask_list_give_the_union_its_strings_without_a_warning(make_ds, tmp_path, caplog) -> None:
    """Both datasets hold the same meta/subtasks.parquet: the union holds that list (so batches carry the
    ``subtask`` strings), and says nothing of lists that differ."""
    plain = [make_ds(episodes=2, frames_per_episode=[4, 3], cameras=0, fps=10, seed=seed) for seed in (0, 1)]
    paths = [_with_subtasks(path, tmp_path / f"subtasks_{i}") for i, path in enumerate(plain)]
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        union = concat_datasets(paths, cameras=[])
    assert union.subtasks == dict(enumerate(SUBTASKS))
    assert "subtask lists" not in caplog.text, caplog.text


def test_only_a_dataset_finding_its_frames_its_own_way_is_said_to(make_ds, caplog) -> None:
    """A union says what it holds; where its second dataset reads by frame_index it says so, of that dataset alone;
    where every dataset finds its frames as the iterator says, nothing of it."""
    first, second = _datasets(make_ds)
    with caplog.at_level(logging.INFO, logger="lerobot_dali"):
        concat_datasets([first, second])
    assert "rows find their frames" not in caplog.text, caplog.text
    assert "union of 2 datasets: 5 episodes, 28 frames, cameras ['observation.images.cam0']" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lerobot_dali"):
        concat_datasets([first, second], timestamp_sources=[None, "frame_index"])
    said = [r.getMessage() for r in caplog.records if "rows find their frames" in r.getMessage()]
    assert said == [f"{second}: rows find their frames with timestamp_source=frame_index"], said


def test_opening_one_dataset_given_alone_is_refused_as_not_a_list(make_ds) -> None:
    """open_all takes a list: one path given alone (a string is a sequence too) is refused, not read letter by
    letter."""
    first, _ = _datasets(make_ds)
    for alone in (str(first), first):
        with pytest.raises(TypeError, match="^datasets must be a non-empty list of datasets, got "):
            open_all(alone)


def _saved_with_first_two_episodes(first, second) -> dict[str, list[str]]:
    """The datasets' part of a state saved over the first dataset's episodes 0 and 1, then all of the second."""
    return datasets_held([open_dataset(first, episodes=[0, 1]), open_dataset(second)])


def test_another_selection_of_a_dataset_at_its_own_position_is_left_to_the_episodes_check(make_ds) -> None:
    """A dataset read with another ``episodes=`` at the position it was saved at holds other contents but its own
    identity (info.json, task table): no reorder, so not refused here (the episodes' check decides); moved to the
    other position, it is named by that identity as the dataset saved at 0."""
    first, second = _datasets(make_ds)
    saved = _saved_with_first_two_episodes(first, second)
    refuse_another_order(saved, [open_dataset(first, episodes=[1, 2]), open_dataset(second)], "the union")
    said = (
        "this stream state was saved over the union with its datasets in another order: each position would be "
        f"another dataset's sample ({second} is dataset 0, was 1; {first} is dataset 1, was 0)"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(said)}"):
        refuse_another_order(saved, [open_dataset(second), open_dataset(first, episodes=[1, 2])], "the union")


def test_a_state_whose_identities_do_not_match_its_datasets_is_checked_by_contents_alone(make_ds) -> None:
    """Identities held for another number of datasets than the contents (a state edited by hand, or merged) are not
    read: the dataset at 1 is named as one the state was not saved over, not matched by the identity at 0."""
    first, second = _datasets(make_ds)
    saved = _saved_with_first_two_episodes(first, second)
    saved[DATASET_IDENTITIES] = saved[DATASET_IDENTITIES][:1]
    said = (
        "this stream state was saved over other datasets than the union: each position would be another dataset's "
        f"sample ({second} is dataset 0, was 1; {first} (dataset 1) is not one it was saved over)"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(said)}"):
        refuse_another_order(saved, [open_dataset(second), open_dataset(first, episodes=[1, 2])], "the union")


class _Recording(MemberFileSystems):
    """A dataset's filesystem that records the stamps pinned on it and the paths whose cache it was told to drop."""

    def __init__(self, name: str) -> None:
        super().__init__([(f"/{name}", fsspec.filesystem("memory"))])
        self.pinned: list[dict[str, Any]] = []
        self.invalidated: list[str | None] = []

    def pin(self, stamps: Mapping[str, Any]) -> None:
        self.pinned.append(dict(stamps))

    def invalidate_cache(self, path: str | None = None) -> None:
        self.invalidated.append(path)


def _routed(tmp_path) -> tuple[MemberFileSystems, _Recording, _Recording]:
    """Four roots over three filesystems: /a and /c read through one recording filesystem, /b another, and a local
    folder through fsspec's own (no ``pin``)."""
    a, b = _Recording("a"), _Recording("b")
    local = fsspec.filesystem("file")
    return MemberFileSystems([("/a", a), ("/b", b), ("/c", a), (str(tmp_path), local)]), a, b


def test_a_routers_pin_reaches_each_pinnable_filesystem_once(tmp_path) -> None:
    """The union's stamps reach each dataset's filesystem that pins (two roots over one: once), none of them skipped,
    and a filesystem without stamps (a local folder's) is not asked to pin them."""
    router, a, b = _routed(tmp_path)
    stamps = {"/a/x.mp4": "stamp a", "/b/y.mp4": "stamp b"}
    router.pin(stamps)
    assert a.pinned == [stamps] and b.pinned == [stamps]


def test_a_routers_cache_is_dropped_on_every_filesystem_or_on_the_one_holding_a_path(tmp_path) -> None:
    """Without a path every dataset's filesystem drops its cache (each once); with one, only the filesystem of the
    dataset holding it, told that path."""
    router, a, b = _routed(tmp_path)
    router.invalidate_cache("/b/data/file-000.parquet")
    assert (a.invalidated, b.invalidated) == ([], ["/b/data/file-000.parquet"])
    router.invalidate_cache()
    assert (a.invalidated, b.invalidated) == ([None], ["/b/data/file-000.parquet", None])


def test_a_routers_listing_gives_details_unless_told_not_to(tmp_path) -> None:
    """``ls`` answers as fsspec's own do: each entry's details by default (fsspec's ``walk`` and ``find`` read them),
    bare names with ``detail=False``."""
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{}")
    router, _, _ = _routed(tmp_path)
    listed = router.ls(str(tmp_path / "meta"))
    assert [(entry["name"], entry["size"], entry["type"]) for entry in listed] == [
        (str(tmp_path / "meta" / "info.json"), 2, "file")
    ]
    assert router.ls(str(tmp_path / "meta"), detail=False) == [str(tmp_path / "meta" / "info.json")]
