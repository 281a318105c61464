"""A data file whose ``task_index`` holds an index the task list lacks is refused when the iterator is built, naming
the file, the index and the list's indices: the footer opening read anyway holds each row group's min and max
(statistics, which pyarrow and LeRobot write by default). It failed only once a shuffled epoch first batched one of
its rows, maybe hours into training. A file written without statistics is refused when read, as before."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.dataset_union import concat_datasets
from lerobot_dali.errors import EpisodeMetadataError
from lerobot_dali.mixture import DALILeRobotMixture
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)
from tests.test_extra_features import _with_subtasks
from tests.test_v2_episode_files import _indices, _iterator

LENGTHS = [3, 4, 5, 3, 4, 5]
V3 = dict(episodes=6, frames_per_episode=LENGTHS, cameras=1, codec="vp9", episodes_per_file=2, size=(64, 64))
V3_LAST = "data/chunk-000/file-002.parquet"  # episodes 4 and 5
V2 = dict(V3, version="v2.1", chunks_size=4)
del V2["episodes_per_file"]
V2_LAST = "data/chunk-001/episode_000005.parquet"


def _set_task_index(path: Path, value: int, *, statistics: bool = True, name: str = "task_index") -> None:
    """Every row of data file ``path`` given ``task_index`` (or column ``name``) ``value`` (written with or
    without statistics)."""
    table = pq.read_table(path)
    column = pa.array(np.full(table.num_rows, value), table.schema.field(name).type)
    table = table.set_column(table.schema.get_field_index(name), name, column)
    pq.write_table(table, path, write_statistics=statistics)


@pytest.mark.parametrize(
    ("spec", "last", "tasks_file"), [(V3, V3_LAST, "tasks.parquet"), (V2, V2_LAST, "tasks.jsonl")], ids=["v3", "v2"]
)
def test_a_data_file_with_a_task_index_not_in_the_task_list_is_refused_when_the_iterator_is_built(
    make_ds, copy_ds, spec, last, tasks_file
) -> None:
    root = copy_ds(make_ds(**spec))
    assert sorted(open_dataset(root).tasks) == [0, 1]
    _set_task_index(root / last, 7)
    pattern = (
        rf"{last}: its task_index values run from 7 to 7, and task_index \[7\] is not in the dataset's task list "
        rf"\(meta/{tasks_file}, which holds task indices \[0, 1\]\)"
    )
    with pytest.raises(EpisodeMetadataError, match=pattern):
        _iterator(root)
    with pytest.raises(EpisodeMetadataError, match=pattern):
        _iterator(open_dataset(root))  # (a reader opened first)
    # The other files' episodes still read: every frame once.
    assert _indices(_iterator(root, episodes=[0, 1, 2, 3], shuffle=False)) == list(range(sum(LENGTHS[:4])))


def test_a_negative_task_index_is_refused_and_the_other_files_are_counted(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**V3))
    _set_task_index(root / "data/chunk-000/file-001.parquet", -1)
    _set_task_index(root / V3_LAST, 2)
    with pytest.raises(EpisodeMetadataError, match=r"file-001\.parquet: .* task_index \[-1\] .*and 1 more data file"):
        _iterator(root)


def test_a_file_only_partly_read_is_not_refused_for_the_rows_left_out(make_ds, copy_ds) -> None:
    """Statistics cover the whole file; episode 5 alone of file-002 is read, so the file is not judged by them."""
    root = copy_ds(make_ds(**V3))
    path = root / V3_LAST
    table = pq.read_table(path)
    values = np.where(np.asarray(table["episode_index"]) == 4, 9, np.asarray(table["task_index"]))
    column = pa.array(values, table.schema.field("task_index").type)
    pq.write_table(table.set_column(table.schema.get_field_index("task_index"), "task_index", column), path)
    with pytest.raises(EpisodeMetadataError, match=r"task_index \[9\]"):
        _iterator(root)
    expected = list(range(sum(LENGTHS[:5]), sum(LENGTHS)))
    assert _indices(_iterator(root, episodes=[5], shuffle=False)) == expected


def test_a_file_without_statistics_is_still_refused_when_its_rows_are_read(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**V3))
    _set_task_index(root / V3_LAST, 7, statistics=False)
    it = _iterator(root, shuffle=False)  # (nothing to check it by)
    with pytest.raises(EpisodeMetadataError, match=r"file-002\.parquet: episode 4's rows hold task_index 7\b.*not in"):
        _indices(it)


def test_a_remote_dataset_is_refused_from_the_kept_footers_too(make_ds, copy_ds, monkeypatch) -> None:
    from lerobot_dali import episode_data_files

    root = copy_ds(make_ds(**V3))
    _set_task_index(root / V3_LAST, 7)
    reads: list[str] = []
    real = episode_data_files._footer
    monkeypatch.setattr(
        episode_data_files, "_footer", lambda loc, path, **kw: reads.append(path) or real(loc, path, **kw)
    )
    for _ in range(2):
        with pytest.raises(EpisodeMetadataError, match=r"file-002\.parquet: its task_index values run from 7 to 7"):
            _iterator(open_dataset("fakeremote://", storage_options={"root": str(root)}))
    assert len(reads) == 3  # the second open read no footer: the kept ones held each file's task_index range
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    assert [f.value_ranges["task_index"] for _, f in sorted(reader.data_file_footers.items())][-1] == (7, 7)


def test_a_union_and_a_mixture_check_each_dataset_against_its_own_task_list(make_ds, tmp_path) -> None:
    """A union renumbers each dataset's tasks after the previous ones' (the second's 0 and 1 are its 2 and 3): a
    row of the first with task_index 2 would read as the second's first task, silently. Each dataset's files are
    held to its own list."""
    first = shutil.copytree(make_ds(**V3), tmp_path / "first")
    second = shutil.copytree(make_ds(**V3, seed=1), tmp_path / "second")
    union = concat_datasets([first, second])
    assert _indices(_iterator(union, shuffle=False)) == sorted(list(range(sum(LENGTHS))) * 2)  # (good data reads)
    _set_task_index(first / V3_LAST, 2)
    with pytest.raises(EpisodeMetadataError, match=r"first/data/chunk-000/file-002\.parquet: .*task_index \[2\]"):
        _iterator(concat_datasets([first, second]))
    with pytest.raises(EpisodeMetadataError, match=r"first/data/chunk-000/file-002\.parquet: .*task_index \[2\]"):
        DALILeRobotMixture([second, first], batch_size=4, device="cpu", num_workers=0)


def test_a_subtask_index_not_in_the_subtask_list_is_refused_when_the_iterator_is_built(make_ds, tmp_path) -> None:
    """``subtask_index`` is held to ``meta/subtasks.parquet`` as ``task_index`` is to the task list: batches carry
    its text (``subtask``). It failed only when a batch first held one of the file's rows (wherever a shuffled epoch
    put them). A union holds each dataset to its own list."""
    root = _with_subtasks(make_ds(**V3), tmp_path / "dataset")
    assert _indices(_iterator(root, shuffle=False)) == list(range(sum(LENGTHS)))  # (good data reads)
    _set_task_index(root / V3_LAST, 5, name="subtask_index")
    pattern = (
        r"dataset/data/chunk-000/file-002\.parquet: its subtask_index values run from 5 to 5, and subtask_index \[5\] "
        r"is not in the dataset's subtask list \(meta/subtasks\.parquet, which holds subtask indices \[0, 1, 2\]\)"
    )
    with pytest.raises(EpisodeMetadataError, match=pattern):
        _iterator(root)
    with pytest.raises(EpisodeMetadataError, match=pattern):
        _iterator(concat_datasets([_with_subtasks(make_ds(**V3, seed=1), tmp_path / "other"), root]))
    assert _indices(_iterator(root, episodes=[0, 1, 2, 3], shuffle=False)) == list(range(sum(LENGTHS[:4])))


def _add_task_three(root: Path) -> None:
    """Task 3, 'task three', added to the task list of ``root`` (a v3.0 dataset of tasks 0 and 1): a gap at 2."""
    tasks = pq.read_table(root / "meta/tasks.parquet")
    extra = pa.table({"task_index": [3], tasks.column_names[1]: ["task three"]}, schema=tasks.schema)
    pq.write_table(pa.concat_tables([tasks, extra]), root / "meta/tasks.parquet")


def test_a_union_numbers_the_next_datasets_tasks_after_the_last_index_of_a_list_with_a_gap(make_ds, tmp_path) -> None:
    """Task list {0, 1, 3} and a second dataset's {0, 1}: the second's are the union's 4 and 5, after the first's
    last index, not 3 and 4 after its count (its 0 would be 'task three', the first's 3)."""
    first = shutil.copytree(make_ds(**V3), tmp_path / "first")
    _add_task_three(first)
    second = make_ds(**V3, seed=1)
    union = concat_datasets([first, second])
    own = [open_dataset(root).tasks for root in (first, second)]
    assert union.task_offsets == (0, 4)
    assert union.tasks == {0: own[0][0], 1: own[0][1], 3: "task three", 4: own[1][0], 5: own[1][1]}


def test_a_task_index_in_a_gap_of_the_task_list_names_its_file_episode_and_own_value_when_read(
    make_ds, tmp_path
) -> None:
    """Task list {0, 1, 3}, a file's rows 0, 2 and 1, written without statistics (3, which LeRobot 0.4 reads no row
    of in a list of 3, is not used, so the list reads): only the rows can show 2 is not listed. The batch's error
    named the dataset, the episode and the index; in a union, the union, its offset index (4 for the second
    dataset's 2 here) and the union's list. It names the data file, the episode and the dataset's own index and list."""
    first = shutil.copytree(make_ds(**V3), tmp_path / "first")
    second = shutil.copytree(make_ds(**V3, seed=1), tmp_path / "second")
    _add_task_three(first)
    path = first / V3_LAST
    table = pq.read_table(path)
    episode = np.asarray(table["episode_index"])
    values = np.where(episode == 5, 1, 2)
    values[0] = 0
    column = pa.array(values, table.schema.field("task_index").type)
    table = table.set_column(table.schema.get_field_index("task_index"), "task_index", column)
    pq.write_table(table, path, write_statistics=False)
    pattern = (
        r"first/data/chunk-000/file-002\.parquet: episode 4's rows hold task_index 2\b.*which is not in the dataset's "
        r"task list \(meta/tasks\.parquet, which holds task indices \[0, 1, 3\]\)"
    )
    for dataset in (first, concat_datasets([second, first])):
        it = _iterator(dataset, shuffle=False)  # (nothing in the footer to refuse it by)
        with pytest.raises(EpisodeMetadataError, match=pattern):
            _indices(it)
    # A union in a mixture has no dataset_index in its rows: its error names the union, not a file of a dataset
    # that has an episode 4 of its own.
    mix = DALILeRobotMixture([concat_datasets([second, first])], batch_size=4, device="cpu", num_workers=0)
    with pytest.raises(EpisodeMetadataError, match=r"^union of .*: episode 4's rows hold task_index 4\b"):
        list(mix)
    mix.close()


def _swap_first_two_tasks(root: Path) -> None:
    """The task list's texts of task 0 and 1 swapped (renumbered apart from the data files)."""
    jsonl = root / "meta/tasks.jsonl"
    if jsonl.exists():
        records = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
        records[0]["task"], records[1]["task"] = records[1]["task"], records[0]["task"]
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
        return
    path = root / "meta/tasks.parquet"
    table = pq.read_table(path)
    text = table.column_names[1]
    swapped = pa.array([table[text][1].as_py(), table[text][0].as_py(), *table[text].to_pylist()[2:]])
    pq.write_table(table.set_column(1, text, swapped), path)


@pytest.mark.parametrize("spec", [V2, dict(V3, episodes_per_file=1)], ids=["v2", "v3"])
def test_a_task_list_renumbered_apart_from_the_data_is_warned_of_when_the_iterator_is_built(
    make_ds, copy_ds, spec, caplog
) -> None:
    """Each data file holds one task_index, and the episode metadata names each episode's task: where the task
    list gives that index another text, batches would carry another task's text (as LeRobot's would), silently."""
    root = copy_ds(make_ds(**spec))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_reader"):
        open_dataset(root).check_data_columns()
    assert "renumbered" not in caplog.text
    _swap_first_two_tasks(root)
    reader = open_dataset(root)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.dataset_reader"):
        reader.check_data_columns()
    first = reader.data_path(0)
    said = (
        f"{first}: every row holds task_index 0, 'synthetic task 1: move the marker' in the task list, but the "
        "episode metadata lists episode 0's tasks as ['synthetic task 0: move the marker'] (6 such episode(s)): the "
        "task list may have been renumbered apart from the data files"
    )
    assert said in caplog.text


def test_a_subtask_index_of_minus_one_is_no_subtask_and_reads(make_ds, tmp_path) -> None:
    """Subtask annotators for LeRobot v3.0 (rosbag2lerobot's writer, and others) write ``subtask_index`` -1 for the
    rows of an episode they did not annotate. Such a dataset was refused when the iterator was built ("subtask_index
    [-1] is not in the dataset's subtask list"), and before that at its first batch; LeRobot 0.4.4 reads it (its
    ``iloc[-1]`` gives those rows the list's last text). Those rows read, with subtask "" and subtask_index -1."""
    root = _with_subtasks(make_ds(**V3), tmp_path / "dataset")
    _set_task_index(root / V3_LAST, -1, name="subtask_index")  # (episodes 4 and 5 not annotated)
    it = _iterator(root, shuffle=False)
    try:
        rows = [
            (i, s, t)
            for b in it
            for i, s, t in zip(b["index"].tolist(), b["subtask_index"].tolist(), b["subtask"], strict=True)
        ]
    finally:
        it.close()
    assert [i for i, _, _ in rows] == list(range(sum(LENGTHS)))
    unannotated = sum(LENGTHS[:4])
    assert {(s, t) for i, s, t in rows if i >= unannotated} == {(-1, "")}
    assert all(s >= 0 and t for i, s, t in rows if i < unannotated)
    # Another negative value is still refused.
    _set_task_index(root / V3_LAST, -2, name="subtask_index")
    with pytest.raises(EpisodeMetadataError, match=r"subtask_index \[-2\] is not in the dataset's subtask list"):
        _iterator(root)


def test_a_subtask_index_of_minus_one_the_subtask_list_names_reads_its_text(make_ds, tmp_path) -> None:
    """A subtask list whose last row is -1 ("idle") names the rows no other subtask annotates: LeRobot 0.4.4 reads
    that text for them (its ``iloc[-1]``, the last row), and so does the list; they read "" (9 of 24 frames)."""
    from lerobot_dali.generate import text_list_table

    root = _with_subtasks(make_ds(**V3), tmp_path / "dataset")
    listed = pq.read_table(root / "meta/subtasks.parquet")
    rows = [*zip(listed["subtask_index"].to_pylist(), listed["__index_level_0__"].to_pylist(), strict=True)]
    pq.write_table(text_list_table("subtask", [*rows, (-1, "idle")]), root / "meta/subtasks.parquet")
    _set_task_index(root / V3_LAST, -1, name="subtask_index")  # (episodes 4 and 5 not annotated)
    it = _iterator(root, shuffle=False)
    try:
        texts = {i: t for b in it for i, t in zip(b["index"].tolist(), b["subtask"], strict=True)}
    finally:
        it.close()
    unannotated = sum(LENGTHS[:4])
    assert sorted(texts) == list(range(sum(LENGTHS)))
    assert {t for i, t in texts.items() if i >= unannotated} == {"idle"}
    assert all(t and t != "idle" for i, t in texts.items() if i < unannotated)


def _without_statistics(root: Path) -> None:
    """Every data file of ``root`` rewritten without column statistics (nothing to refuse it by at the open)."""
    for path in sorted((root / "data").rglob("*.parquet")):
        pq.write_table(pq.read_table(path), path, write_statistics=False)


def _tasks_by_index(it) -> dict[int, str]:
    """Each frame's (``index``) task text, over a pass of ``it``."""
    try:
        return {i: t for b in it for i, t in zip(b["index"].tolist(), b["task"], strict=True)}
    finally:
        it.close()


def test_a_task_index_lerobot_reads_another_row_for_is_refused_as_a_file_without_statistics_is_read(
    make_ds, copy_ds
) -> None:
    """Task list rows (0, 1, 3, 2): LeRobot 0.4 takes the row at position task_index, so for 2 it reads task 3's
    text and for 3 task 2's. A data file with statistics whose rows reach 2 or 3 is refused at the open; one written
    without them was read by index, silently (episode 5's 5 frames got 'task two' where LeRobot gives 'task
    three'). It is refused as its rows are read, naming the file, the episode and what LeRobot reads; the episodes
    whose rows hold 0 and 1 alone still read, each frame with its task."""
    from lerobot_dali.generate import task_name, text_list_table

    root = copy_ds(make_ds(**V3))
    rows = [(0, task_name(0)), (1, task_name(1)), (3, "task three"), (2, "task two")]
    pq.write_table(text_list_table("task", rows), root / "meta/tasks.parquet")
    table = pq.read_table(root / V3_LAST)  # episodes 4 (task 0) and 5 (task 1 -> 2)
    values = np.where(np.asarray(table["episode_index"]) == 5, 2, np.asarray(table["task_index"]))
    at = table.column_names.index("task_index")
    pq.write_table(table.set_column(at, "task_index", pa.array(values)), root / V3_LAST)
    said = (
        r"file-002\.parquet: {}, and meta/tasks\.parquet does not hold task_index \[2\] at row "
        r"task_index .* for task_index 2 it reads row 2's 'task three' where the list says 'task two'; rewrite "
        r"meta/tasks\.parquet with its rows in task_index order"
    )
    with pytest.raises(EpisodeMetadataError, match=said.format(r"its rows hold task_index \[2\]")):
        _iterator(root)
    with pytest.raises(EpisodeMetadataError, match=said.format(r"episode 5's rows hold task_index \[2\]")):
        _tasks_by_index(_iterator(root, episodes=[5]))  # (part of its file: the statistics cover episode 4 too)
    _without_statistics(root)
    with pytest.raises(EpisodeMetadataError, match=said.format(r"episode 5's rows hold task_index \[2\]")):
        _tasks_by_index(_iterator(root, shuffle=False))
    with pytest.raises(EpisodeMetadataError, match=said.format(r"episode 5's rows hold task_index \[2\]")):
        _tasks_by_index(_iterator(concat_datasets([make_ds(**V3, seed=1), root]), shuffle=False))
    read = _tasks_by_index(_iterator(root, episodes=[0, 1, 2, 3, 4], shuffle=False))
    starts = np.cumsum([0, *LENGTHS])
    assert read == {i: task_name(e % 2) for e in range(5) for i in range(starts[e], starts[e + 1])}


def test_a_file_whose_task_index_span_covers_a_misplaced_index_its_rows_never_hold_reads(make_ds, copy_ds) -> None:
    """Task list rows (0, 1, 3, 2, 4): LeRobot 0.4 reads another row for 2 and 3 only. A data file whose rows hold 0
    and 4 reads every frame's task in LeRobot, yet its statistics (min 0, max 4) span 2 and 3: the open refused the
    whole dataset by them (0 of 24 frames read). The file's column is read where the statistics cannot tell: every
    frame reads with its task (24 of 24), and a file whose rows do hold 2 is still refused at the open."""
    from lerobot_dali.generate import task_name, text_list_table

    root = copy_ds(make_ds(**V3))
    rows = [(0, task_name(0)), (1, task_name(1)), (3, "task three"), (2, "task two"), (4, "task four")]
    pq.write_table(text_list_table("task", rows), root / "meta/tasks.parquet")
    path = root / V3_LAST  # episodes 4 (task 0) and 5 (task 1 -> 4)
    table = pq.read_table(path)
    at = table.column_names.index("task_index")
    episode = np.asarray(table["episode_index"])
    pq.write_table(table.set_column(at, "task_index", pa.array(np.where(episode == 5, 4, episode % 2))), path)
    starts = np.cumsum([0, *LENGTHS])
    texts = [task_name(0), task_name(1), task_name(0), task_name(1), task_name(0), "task four"]
    expected = {i: texts[e] for e in range(6) for i in range(starts[e], starts[e + 1])}
    assert _tasks_by_index(_iterator(root, shuffle=False)) == expected
    refused = (r"file-002\.parquet: its rows hold task_index \[2\], .* for task_index 2 it reads row 2's 'task three' "
               r"where the list says 'task two'")  # fmt: skip
    pq.write_table(table.set_column(at, "task_index", pa.array(np.where(episode == 5, 4, 2))), path)
    with pytest.raises(EpisodeMetadataError, match=refused):
        _iterator(root)
    _set_task_index(path, 2)  # (its statistics' min and max: 2, the misplaced index at either end of the span)
    with pytest.raises(EpisodeMetadataError, match=refused):
        _iterator(root)


@pytest.mark.parametrize(
    ("order", "said"),
    [
        ((2, 0, 1), r"subtask_index \[0, 1, 2\] .* for subtask_index 0 it reads row 0's 'lift é' where the list says "
         r"'approach'"),
        ((0, 2, 1), r"subtask_index \[1, 2\] .* for subtask_index 1 it reads row 1's 'lift é' where the list says "
         r"'grasp the cup'"),
        ((0, 1, 2), None),
    ],
    ids=["rotated", "two-swapped", "in-order"],
)  # fmt: skip
def test_a_subtask_list_out_of_index_order_is_refused_where_lerobot_reads_other_subtasks(
    make_ds, tmp_path, order, said
) -> None:
    """LeRobot 0.4 gives a frame the subtask at position ``subtask_index`` of meta/subtasks.parquet (``iloc``), as it
    does tasks; this read each frame's subtask by the list's ``subtask_index`` column, silently another text than
    LeRobot's where the rows are out of that order. Refused, as a task list is: at the open by the data files'
    statistics, and as the rows are read for files without them; a list in order reads, each frame its text."""
    from tests.test_extra_features import SUBTASKS, _subtask_of

    root = _with_subtasks(make_ds(**V3), tmp_path / "dataset", order=order)
    if said is None:
        it = _iterator(root, shuffle=False)
        try:
            read = {i: s for b in it for i, s in zip(b["index"].tolist(), b["subtask"], strict=True)}
        finally:
            it.close()
        assert read == {i: SUBTASKS[_subtask_of(i)] for i in range(sum(LENGTHS))}
        return
    advice = r"; rewrite meta/subtasks\.parquet with its rows in subtask_index order, numbered 0, 1, \.\.\."
    with pytest.raises(EpisodeMetadataError, match=r"file-000\.parquet: its rows hold subtask_index \[[0-9, ]+\], "
                       r"and meta/subtasks\.parquet does not hold " + said + advice):  # fmt: skip
        _iterator(root)
    _without_statistics(root)
    with pytest.raises(EpisodeMetadataError, match=r"file-000\.parquet: episode 0's rows hold subtask_index .*" + said):
        _indices(_iterator(root, shuffle=False))


def test_lerobot_dali_check_lists_the_episodes_whose_subtask_index_the_subtask_list_lacks(make_ds, tmp_path) -> None:
    """``check`` held each episode's ``task_index`` to the task list but not its ``subtask_index`` to the subtask
    list, whose texts batches carry: a file written without statistics (nothing to refuse it by at the open) whose
    rows hold one it lacks passed the check, and the run failed at the first batch of its rows. Its episodes are
    listed now; -1 (no subtask) is not."""
    from lerobot_dali.dataset_check import check_dataset

    root = _with_subtasks(make_ds(**V3), tmp_path / "dataset")
    _set_task_index(root / "data/chunk-000/file-001.parquet", -1, statistics=False, name="subtask_index")
    _set_task_index(root / V3_LAST, 5, statistics=False, name="subtask_index")
    problems = check_dataset(open_dataset(root), workers=0, decode=False).problems
    assert sorted(p.episode_index for p in problems) == [4, 5]
    said = r"file-002\.parquet: episode [45]'s subtask_index \[5\] is not in the dataset's subtask list \(meta/subtasks"
    assert all(re.search(said, p.message) for p in problems)
