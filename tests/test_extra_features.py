"""Features beyond numeric vectors and cameras, batched as a DataLoader over LeRobotDataset gives them:
N-D arrays (``datasets.Array2D``..., stored as nested lists) as (B, *shape) tensors, a shape-(1,) list column as
(B, 1); ``string`` and LeRobot's
``language`` annotations as lists of Python values, windows included. Expected values are written here."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DataFileError, DeltaTimestampsError, SchemaMismatchError
from lerobot_dali.generate import text_list_table
from lerobot_dali.host_values import decode_host_values, encode_host_values
from lerobot_dali.iterator import DALILeRobotIterator

FPS = 10
LENGTHS = [4, 3]
EVENT = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string()), pa.field("style", pa.string())])


def _note(index: int) -> str:
    return f"note {index} é\x00"  # non-ASCII and a NUL: the transport must carry both


def _events(index: int) -> list[dict]:
    return [{"role": "user", "content": f"pick {index}", "style": None}] * (index % 3)


def _matrix(index: int) -> list[list[float]]:
    return [[index, index + 0.5, -index], [1.0, 2.0, 3.0]]


def _with_columns(src: Path, dst: Path, *, flat_matrix: bool = False) -> Path:
    shutil.copytree(src, dst)
    for path in sorted(dst.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        index = table["index"].to_pylist()
        table = table.append_column("extra.note", pa.array([_note(i) for i in index]))
        table = table.append_column("language_events", pa.array([_events(i) for i in index], pa.list_(EVENT)))
        if flat_matrix:  # as writers that flatten (2, 3) into 6 values per row store it
            matrix = pa.array([np.ravel(_matrix(i)).tolist() for i in index], pa.list_(pa.float32()))
        else:  # as datasets.Array2D stores it
            matrix = pa.array([_matrix(i) for i in index], pa.list_(pa.list_(pa.float32())))
        table = table.append_column("extra.matrix", matrix)
        # shape [1] stored as one-element lists: LeRobot's torch.tensor of each row gives (1,), so (B, 1)
        table = table.append_column("extra.gripper", pa.array([[i / 2] for i in index], pa.list_(pa.float32(), 1)))
        pq.write_table(table, path)
    info_path = dst / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["extra.note"] = {"dtype": "string", "shape": [1], "names": None}
    info["features"]["language_events"] = {"dtype": "language", "shape": [1], "names": None}
    info["features"]["extra.matrix"] = {"dtype": "float32", "shape": [2, 3], "names": None}
    info["features"]["extra.gripper"] = {"dtype": "float32", "shape": [1], "names": ["g"]}
    info_path.write_text(json.dumps(info))
    return dst


@pytest.fixture(scope="module")
def extra_ds(make_ds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    return _with_columns(src, tmp_path_factory.mktemp("extra") / "dataset")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_arrays_strings_and_language_batch_as_lerobot_does(extra_ds: Path, num_workers: int) -> None:
    deltas = {"extra.note": [-1 / FPS, 0.0], "extra.matrix": [0.0, 1 / FPS]}
    it = DALILeRobotIterator(
        extra_ds, batch_size=3, shuffle=False, device="cpu", num_workers=num_workers, drop_last=False,
        delta_timestamps=deltas,
    )  # fmt: skip
    batches = list(it)
    assert [len(b["index"]) for b in batches] == [3, 3, 1]
    starts = np.cumsum([0, *LENGTHS])[:-1]
    for batch in batches:
        index = batch["index"].tolist()
        episode = batch["episode_index"].tolist()
        # Windows clamp to the episode, as LeRobot pads by repeating the boundary row.
        first = [int(starts[e]) for e in episode]
        last = [int(starts[e] + LENGTHS[e] - 1) for e in episode]
        assert batch["extra.note"] == [[_note(max(i - 1, f)), _note(i)] for i, f in zip(index, first, strict=True)]
        assert batch["extra.note_is_pad"].tolist() == [[i == f, False] for i, f in zip(index, first, strict=True)]
        assert batch["language_events"] == [_events(i) for i in index]
        matrix = batch["extra.matrix"]
        assert matrix.dtype == torch.float32 and matrix.shape == (len(index), 2, 2, 3)
        expected = [[_matrix(i), _matrix(min(i + 1, la))] for i, la in zip(index, last, strict=True)]
        np.testing.assert_array_equal(matrix.numpy(), np.asarray(expected, dtype=np.float32))
        assert batch["extra.gripper"].tolist() == [[i / 2] for i in index]
        assert batch["timestamp"].shape == (len(index),)  # a plain scalar column stays (B,)


def test_a_flat_list_for_an_nd_feature_reads_too(make_ds, tmp_path: Path) -> None:
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    root = _with_columns(src, tmp_path / "dataset", flat_matrix=True)
    batch = next(iter(DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0)))
    np.testing.assert_array_equal(batch["extra.matrix"].numpy(), np.asarray([_matrix(0), _matrix(1)], np.float32))


def test_an_nd_feature_of_another_shape_names_the_column(make_ds, tmp_path: Path) -> None:
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    root = _with_columns(src, tmp_path / "dataset")
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["extra.matrix"]["shape"] = [3, 2]
    info_path.write_text(json.dumps(info))
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0)
    with pytest.raises(SchemaMismatchError, match=r"'extra.matrix' holds 2-level lists of lengths \[\[2\], \[3\]\]"):
        next(iter(it))


def test_a_window_on_a_key_left_out_by_the_selection_is_refused(extra_ds: Path) -> None:
    """Otherwise the batch would carry ``extra.note_is_pad`` without ``extra.note``."""
    with pytest.raises(DeltaTimestampsError, match=r"names \['extra.note'\], which this iterator does not read"):
        DALILeRobotIterator(extra_ds, keys=["action"], delta_timestamps={"extra.note": [0.0]}, device="cpu")
    it = DALILeRobotIterator(
        extra_ds, keys=["action"], delta_timestamps={"frame_index": [0.0]}, batch_size=2, device="cpu", num_workers=0
    )  # index columns come with every batch, so their windows stand
    assert "frame_index_is_pad" in next(iter(it))


def test_columns_info_json_does_not_declare_are_named_once_when_built(
    extra_ds: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A feature's entry dropped from info.json leaves its column unread: the batch lacks the key, and the warning
    says why (a KeyError in the loop would not)."""
    caplog.set_level(logging.WARNING, logger="lerobot_dali")
    DALILeRobotIterator(extra_ds, batch_size=2, device="cpu", num_workers=0)
    check_dataset(open_dataset(extra_ds), workers=0)
    assert not [r for r in caplog.records if "does not declare" in r.getMessage()]  # every column declared

    root = shutil.copytree(extra_ds, tmp_path / "dataset")
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    del info["features"]["extra.gripper"], info["features"]["language_events"]
    info_path.write_text(json.dumps(info))
    caplog.clear()
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0)
    warned = [r.getMessage() for r in caplog.records if "does not declare" in r.getMessage()]
    assert warned == [
        f"{root}: the data files hold columns info.json does not declare, ['language_events', 'extra.gripper']: they "
        "are not read, so batches have no such keys; declare them under 'features' in meta/info.json to read them"
    ]
    batch = next(iter(it))
    assert "extra.gripper" not in batch and "language_events" not in batch
    assert batch["extra.note"] == [_note(0), _note(1)]  # the declared columns read as before
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="lerobot_dali.dataset_reader")
    assert check_dataset(open_dataset(root), workers=0).ok
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "does not declare" in r.getMessage()]
    assert said == [("DEBUG", warned[0])]  # (said once per job: the iterator said it)


def test_columns_info_json_does_not_declare_are_named_at_info_where_keys_were_chosen(
    extra_ds: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``keys=["action"]`` (``check --keys action``): the batches hold the keys chosen whatever info.json declares,
    yet every run warned that the columns it leaves out are not read. Named once at INFO there; reading every key,
    a batch lacks a key the data holds: still a warning."""
    root = shutil.copytree(extra_ds, tmp_path / "dataset")
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    del info["features"]["extra.gripper"]
    info_path.write_text(json.dumps(info))
    caplog.set_level(logging.INFO, logger="lerobot_dali")
    DALILeRobotIterator(root, keys=["action"], batch_size=2, device="cpu", num_workers=0)
    assert check_dataset(open_dataset(root, keys=["action"]), workers=0).ok
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "does not declare" in r.getMessage()]
    assert said == [
        (
            "INFO",
            f"{root}: the data files also hold columns info.json does not declare, ['extra.gripper'], which no keys= "
            "selection can name; declare them under 'features' in meta/info.json to read them",
        )
    ]
    caplog.clear()
    DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "does not declare" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING"], said


@pytest.mark.parametrize(
    ("dtype", "stored", "found"),
    [
        ("uint8", pa.array([7, 300]), "300"),
        ("int32", pa.array([7, 2**31]), "2147483648"),
        ("int8", pa.array([7, -129]), "-129"),
        ("int32", pa.array([7.0, 3e9]), r"3000000000\.0"),
        ("int64", pa.array([7.0, float("inf")]), "inf"),
    ],
    ids=["uint8", "int32", "int8-below", "float-past-int32", "inf"],
)
def test_numbers_outside_the_declared_integer_dtype_are_refused(make_ds, tmp_path: Path, dtype, stored, found) -> None:
    """Schema drift: one data file of the dataset holds a value its feature's declared dtype cannot hold. numpy's
    cast wrapped it around without a word (300 read as 44 in a uint8 feature, 2**31 as -2**31 in int32) where
    LeRobot's cast to the declared dtype fails; a float past the range was refused as 'fractional' after numpy
    warned 'invalid value encountered in cast'."""
    import warnings

    root = shutil.copytree(make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS), tmp_path / "dataset")
    for path in sorted(root.glob("data/*/*.parquet")):  # (one file holds both episodes: episode 1 gets the value)
        table = pq.read_table(path)
        episode = np.asarray(table["episode_index"])
        values = pa.array([stored[1].as_py() if e == 1 else stored[0].as_py() for e in episode], stored.type)
        pq.write_table(table.append_column("extra.count", values), path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["extra.count"] = {"dtype": dtype, "shape": [1], "names": None}
    info_path.write_text(json.dumps(info))
    reader = open_dataset(root)
    assert reader.read_episode(0)["extra.count"].tolist() == [7] * LENGTHS[0]
    pattern = rf"column 'extra\.count' holds {found} \(type .*\), outside the range of the declared dtype '{dtype}'"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SchemaMismatchError, match=pattern):
            reader.read_episode(1)


@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_a_narrow_integer_feature_batches_as_int64_as_lerobots(make_ds, tmp_path: Path, dtype: str) -> None:
    """A feature declared a narrower integer than int64 batches as int64, as LeRobot's items do (each value passes
    through torch.tensor as a Python int), with its stored values (batch_source line 177, reached by none of the
    iterator's tests)."""
    root = shutil.copytree(make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS), tmp_path / "dataset")
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        counts = pa.array([i % 200 for i in table["index"].to_pylist()], pa.from_numpy_dtype(np.dtype(dtype)))
        pq.write_table(table.append_column("extra.count", counts), path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["extra.count"] = {"dtype": dtype, "shape": [1], "names": None}
    info_path.write_text(json.dumps(info))
    it = DALILeRobotIterator(root, batch_size=3, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    seen = 0
    for batch in it:
        assert batch["extra.count"].dtype == torch.int64
        assert batch["extra.count"].tolist() == [i % 200 for i in batch["index"].tolist()]
        seen += len(batch["index"])
    it.close()
    assert seen == sum(LENGTHS)


@pytest.mark.parametrize("first_file", ["lists", "values"])
def test_a_scalar_stored_both_ways_batches_as_the_first_episodes_file_stores_it(
    make_ds, tmp_path: Path, first_file: str
) -> None:
    """A shape-(1,) feature stored as one-element lists in one data file and as plain values in the next (two
    writers' files, merged): a batch of both failed with 'all input arrays must have the same shape', naming neither
    the feature nor a file, and a batch of one file's rows had that file's shape, (B, 1) or (B,). Every batch now
    has the first episode's file's shape, with the values stored."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS, episodes_per_file=1)
    root = shutil.copytree(src, tmp_path / "dataset")
    for n, path in enumerate(sorted(root.glob("data/*/*.parquet"))):  # episode 0's file, then episode 1's
        table = pq.read_table(path)
        index = table["index"].to_pylist()
        as_lists = (n == 0) == (first_file == "lists")
        column = (
            pa.array([[i / 2] for i in index], pa.list_(pa.float32())) if as_lists else pa.array([i / 2 for i in index])
        )
        pq.write_table(table.append_column("extra.gripper", column), path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["extra.gripper"] = {"dtype": "float32", "shape": [1], "names": ["g"]}
    info_path.write_text(json.dumps(info))
    shape = (1,) if first_file == "lists" else ()
    for batch_size in (3, 2):  # a batch of both files' rows; batches of one file's rows
        it = DALILeRobotIterator(
            root, batch_size=batch_size, shuffle=False, device="cpu", num_workers=0, drop_last=False
        )
        for batch in it:
            gripper = batch["extra.gripper"]
            assert gripper.dtype == torch.float32 and gripper.shape == (len(batch["index"]), *shape)
            assert gripper.flatten().tolist() == [i / 2 for i in batch["index"].tolist()]
        it.close()


def test_a_string_feature_stored_as_bytes_reads_as_text(make_ds, tmp_path: Path) -> None:
    """A string column written without parquet's UTF-8 annotation (as bytes) in one data file: LeRobot's cast to the
    declared string feature reads it as text; here it failed the batch with 'feature 'extra.note' holds a value JSON
    cannot carry (Object of type bytes ...)', naming no file. Bytes that are not UTF-8 are named with their file."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS, episodes_per_file=1)
    root = _with_columns(src, tmp_path / "dataset")
    second = sorted(root.glob("data/*/*.parquet"))[1]  # episode 1's file

    def store_notes(values: list[bytes]) -> None:
        table = pq.read_table(second)
        at = table.column_names.index("extra.note")
        pq.write_table(table.set_column(at, "extra.note", pa.array(values, pa.binary())), second)

    index = pq.read_table(second)["index"].to_pylist()
    store_notes([_note(i).encode() for i in index])
    it = DALILeRobotIterator(root, batch_size=sum(LENGTHS), shuffle=False, device="cpu", num_workers=0)
    batch = next(iter(it))
    it.close()
    assert batch["extra.note"] == [_note(i) for i in batch["index"].tolist()]
    store_notes([b"\xff\xfe"] * len(index))
    with pytest.raises(DataFileError, match=rf"{re.escape(str(second))}: column 'extra.note' holds a string that is "):
        open_dataset(root).read_episode(1)


@pytest.mark.parametrize(
    ("values", "kind"),
    [(pa.array([1.5, 2.5, 3.5], pa.float32()), "float"), (pa.array([[1, 2]] * 3), "list<element: int64>")],
)
def test_a_string_feature_whose_column_holds_numbers_is_refused(make_ds, tmp_path: Path, values, kind: str) -> None:
    """info.json declares 'extra.note' a string, one data file holds numbers there: LeRobot's cast to the declared
    string feature refuses them; here they were handed over as a list of floats (or of lists) in silence."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS, episodes_per_file=1)
    root = _with_columns(src, tmp_path / "dataset")
    second = sorted(root.glob("data/*/*.parquet"))[1]  # episode 1's file
    table = pq.read_table(second)
    pq.write_table(table.set_column(table.column_names.index("extra.note"), "extra.note", values), second)
    said = f"{second}: column 'extra.note' holds {kind}, not text, but info.json declares 'string'"
    with pytest.raises(SchemaMismatchError, match=re.escape(said)):
        open_dataset(root).read_episode(1)
    assert open_dataset(root).read_episode(0, ["extra.note"])["extra.note"][0] == _note(0)


def _with_language(src: Path, root: Path, call: Callable[[int], str]) -> Path:
    """A copy of ``src`` with a ``language_persistent`` column as LeRobot 0.6 declares it: per row (by its ``index``)
    one entry holding a double ``timestamp`` (as its annotation writer stores it) and the JSON text ``call(index)``
    as a ``pa.json_()`` value."""
    root = shutil.copytree(src, root)
    rows = pa.list_(
        pa.struct([("content", pa.string()), ("timestamp", pa.float64()), ("calls", pa.list_(pa.string()))])
    )
    declared = pa.list_(
        pa.struct([("content", pa.string()), ("timestamp", pa.float64()), ("calls", pa.list_(pa.json_()))])
    )
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        values = [[{"content": f"c{i}", "timestamp": i / 10, "calls": [call(i)]}] for i in table["index"].to_pylist()]
        pq.write_table(table.append_column("language_persistent", pa.array(values, rows).cast(declared)), path)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["language_persistent"] = {"dtype": "language", "shape": [1], "names": None}
    info_path.write_text(json.dumps(info))
    return root


def test_language_rows_read_as_lerobots_declared_feature(make_ds, tmp_path: Path) -> None:
    """LeRobot 0.6 casts a ``language`` column to the feature it declares: a row's float ``timestamp`` reads as
    float32 (its annotation writer stores doubles: 0.1 read as 0.1 here, 0.10000000149011612 there), and a JSON
    value (``pa.json_()``, its declared type for ``tool_calls``) parsed (read as its text here).
    tests/test_lerobot_parity.py checks the same against LeRobot 0.6 itself."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    root = _with_language(src, tmp_path / "dataset", lambda i: f'{{"say": [{i}, null]}}')
    it = DALILeRobotIterator(root, batch_size=sum(LENGTHS), shuffle=False, device="cpu", num_workers=0)
    batch = next(iter(it))
    it.close()
    expected = [
        [{"content": f"c{i}", "timestamp": float(np.float32(i / 10)), "calls": [{"say": [i, None]}]}]
        for i in batch["index"].tolist()
    ]
    assert batch["language_persistent"] == expected


def test_a_language_json_value_that_does_not_parse_names_its_file_and_column(make_ds, tmp_path: Path) -> None:
    """A ``pa.json_()`` value is text parquet never checks: one that is not JSON failed the read with a bare
    JSONDecodeError, naming neither the file nor the column."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS, episodes_per_file=1)
    root = _with_language(src, tmp_path / "dataset", lambda i: '{"say": [' if i == LENGTHS[0] + 1 else "{}")
    second = sorted(root.glob("data/*/*.parquet"))[1]  # episode 1's file, whose second row is cut short
    reader = open_dataset(root)
    assert reader.read_episode(0)["language_persistent"][0] == [{"content": "c0", "timestamp": 0.0, "calls": [{}]}]
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(second))}: column 'language_persistent' holds a JSON "):
        reader.read_episode(1)


def _objects(*values: object) -> np.ndarray:
    """``values`` as a (B,) object array, as a batch's column of strings or structures comes."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def test_host_values_travel_as_nul_padded_utf8_json_and_come_back() -> None:
    """What carries strings and structures through the graph: each sample's JSON text as UTF-8 bytes, padded with
    NUL to the batch's longest; a window's (T,) array as its list."""
    window = np.array(["é", "a\x00"], dtype=object)
    values = _objects(window, ["a", None], {"k": 1})
    encoded = encode_host_values(values, key="extra.note")
    texts = ['["é", "a\\u0000"]', '["a", null]', '{"k": 1}']
    assert encoded.dtype == np.uint8 and encoded.shape == (3, len(texts[0].encode()))  # (é: 2 bytes)
    for row, text in zip(encoded, texts, strict=True):
        assert row.tobytes() == text.encode().ljust(encoded.shape[1], b"\0")
    assert decode_host_values(encoded) == [["é", "a\x00"], ["a", None], {"k": 1}]


@pytest.mark.parametrize(
    ("value", "why"), [(b"note", "Object of type bytes is not JSON serializable"), ("\ud800", "surrogates not allowed")]
)
def test_a_host_value_json_cannot_carry_names_its_feature(value: object, why: str) -> None:
    with pytest.raises(DataFileError, match=rf"^feature 'extra\.note' holds a value JSON cannot carry \(.*{why}"):
        encode_host_values(_objects("fine", value), key="extra.note")


SUBTASKS = ["approach", "grasp the cup", "lift é"]


def _subtask_of(index: int) -> int:
    return (index * 7 // 3) % len(SUBTASKS)


def _with_subtasks(src: Path, dst: Path, *, subtask_list: bool = True, order: tuple[int, ...] = (0, 1, 2)) -> Path:
    """``subtask_index`` rows and ``meta/subtasks.parquet`` as LeRobot 0.4-0.5 read them (its docs'
    ``dataset_subtask``: the subtask strings are the pandas index, ``subtask_index`` the column). ``order``: the
    list's rows (LeRobot takes the row at position ``subtask_index``, so a list out of order is refused where the
    data reaches it)."""
    shutil.copytree(src, dst)
    for path in sorted(dst.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        subtask = [_subtask_of(i) for i in table["index"].to_pylist()]
        pq.write_table(table.append_column("subtask_index", pa.array(subtask, pa.int64())), path)
    info_path = dst / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["subtask_index"] = {"dtype": "int64", "shape": [1], "names": None}
    info_path.write_text(json.dumps(info))
    if subtask_list:
        rows = [(i, SUBTASKS[i]) for i in order]
        pq.write_table(text_list_table("subtask", rows), dst / "meta" / "subtasks.parquet")
    return dst


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subtask_strings_batch_beside_the_task_as_lerobot_gives_them(make_ds, tmp_path: Path, num_workers: int) -> None:
    """LeRobot 0.4-0.5 adds ``subtask`` (the text of the row's ``subtask_index`` in ``meta/subtasks.parquet``) to
    every sample of a dataset with subtask annotations, which its tokenizer processor tokenizes for VLA policies;
    batches had ``subtask_index`` only."""
    root = _with_subtasks(make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS), tmp_path / "dataset")
    it = DALILeRobotIterator(
        root, batch_size=3, shuffle=False, device="cpu", num_workers=num_workers, drop_last=False,
        delta_timestamps={"action": [0.0, 1 / FPS]},
    )  # fmt: skip
    batches = list(it)
    assert sum(len(b["index"]) for b in batches) == sum(LENGTHS)
    for batch in batches:
        index = batch["index"].tolist()
        assert batch["subtask_index"].tolist() == [_subtask_of(i) for i in index]
        assert batch["subtask"] == [SUBTASKS[_subtask_of(i)] for i in index]
    with pytest.raises(DeltaTimestampsError, match="'subtask_index', which gives each sample its one `subtask`"):
        DALILeRobotIterator(root, batch_size=3, device="cpu", delta_timestamps={"subtask_index": [0.0, 1 / FPS]})


def test_a_union_says_of_subtask_lists_only_what_its_batches_carry(make_ds, tmp_path: Path, caplog) -> None:
    """A union of a dataset with subtasks and one without left ``subtask_index`` out (said so), then warned that
    "batches carry each dataset's own subtask_index": they carried none (a review). Two with different lists carry
    each one's index and no strings, which is said."""
    from lerobot_dali import concat_datasets

    plain = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    first = _with_subtasks(plain, tmp_path / "first")
    other = _with_subtasks(plain, tmp_path / "other", subtask_list=False)
    pq.write_table(
        text_list_table("subtask", [(0, "reach"), (1, "pinch"), (2, "raise")]), other / "meta/subtasks.parquet"
    )
    said = []
    for members in ([first, plain], [first, other]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
            it = DALILeRobotIterator(concat_datasets(members, cameras=[]), batch_size=2, device="cpu", num_workers=0)
            batch = next(iter(it))
        said.append([r.getMessage() for r in caplog.records if "subtask lists" in r.getMessage()])
        assert "subtask" not in batch and ("subtask_index" in batch) == (members[1] == other), sorted(batch)
    assert said[0] == [] and len(said[1]) == 1 and "differ or one has none" in said[1][0], said


def test_a_mixture_where_one_dataset_lacks_a_subtask_list_says_so_once(make_ds, tmp_path: Path, caplog) -> None:
    """Its batches carry no ``subtask`` strings (the other dataset's rows have none to give), which is said once;
    every batch after the first logged it again (at DEBUG, through the said-once folder: a hash and a file
    lookup per batch)."""
    from lerobot_dali.mixture import DALILeRobotMixture

    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    with_list = _with_subtasks(src, tmp_path / "with")
    without = _with_subtasks(src, tmp_path / "without", subtask_list=False)
    mix = DALILeRobotMixture([with_list, without], batch_size=2, shuffle=False, device="cpu", num_workers=0)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.mixture"):
        batches = list(mix)
    mix.close()
    assert len(batches) >= 3 and all("subtask" not in b and "subtask_index" in b for b in batches)
    said = [r for r in caplog.records if "carry no 'subtask' strings" in r.getMessage()]
    assert len(said) == 1 and str(without) in said[0].getMessage(), [r.getMessage() for r in said]


def test_without_a_subtask_list_a_batch_has_no_subtask_strings(make_ds, tmp_path: Path) -> None:
    """As LeRobot: ``subtask_index`` without ``meta/subtasks.parquet`` is a plain column (and may take a window)."""
    src = make_ds(episodes=2, frames_per_episode=LENGTHS, cameras=0, fps=FPS)
    root = _with_subtasks(src, tmp_path / "dataset", subtask_list=False)
    it = DALILeRobotIterator(
        root, batch_size=7, shuffle=False, device="cpu", drop_last=False, delta_timestamps={"subtask_index": [0.0]}
    )
    (batch,) = list(it)
    assert "subtask" not in batch
    assert batch["subtask_index"].tolist() == [[_subtask_of(i)] for i in range(sum(LENGTHS))]
