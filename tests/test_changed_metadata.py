"""One value of a dataset's metadata changed (info.json, meta/episodes, the task list, stats, or the data files' index
columns: a value, a row or a line dropped, repeated or swapped, a column or key dropped, a value of another type): a
pass over it ends in values or in one of lerobot-dali's errors (a ``DatasetError``) naming what is wrong, never in a
bare third-party exception. Where it reads, it reads every frame once, or the episodes the metadata still lists, which
the reader warns of.

Where :mod:`tests.test_damaged_files` damages bytes, this changes meaning: files that parse, holding values that do not
fit together. Cases are drawn from a seeded generator: ``LEROBOT_DALI_CHANGES=N`` draws N per dataset (default a few,
for CI) from seed ``LEROBOT_DALI_CHANGES_FROM=K`` on, read by ``LEROBOT_DALI_CHANGES_WORKERS`` worker processes
(default 0: in-process). The first runs (2026-11-25, about 5,000 cases, with a triage of the values that read
against the unchanged pass) found these ways through, each mended with a test of its own: counts, indices and
lengths that are not whole numbers or are missing (bare TypeErrors, or cut: 20.5 read as 20, a null as -2**63), an
index column declared with a shape, a null fps, episode tasks that are not a list, a task list naming two tasks for
one index or none, episode statistics of different shapes (numpy's ValueError), and a depth flag written as the text
"false" (read as a depth map). Which changes read as values (a task string, a row's frame_index or timestamp within
tolerance: the data are the truth, as in LeRobot) was triaged by hand. The image-camera and GR00T datasets joined
later (400 and 250 cases, and a triage of 150 each), and every third case read over HTTP (1,800 cases): no way
through.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_info import INDEX_COLUMNS
from lerobot_dali.errors import DatasetError
from lerobot_dali.iterator import DALILeRobotIterator
from tests.conftest import shared_dataset
from tests.http_server import FolderServer

CASES = int(os.environ.get("LEROBOT_DALI_CHANGES", "8"))
FIRST = int(os.environ.get("LEROBOT_DALI_CHANGES_FROM", "0"))
#: Worker processes per pass (default none: in-process, fast); errors then cross DALI's worker boundary.
WORKERS = int(os.environ.get("LEROBOT_DALI_CHANGES_WORKERS", "0"))
#: v3.0 (episodes and tasks in parquet, two episodes per data file), v2.1 (JSON lines, a file per episode), v3.0
#: with its camera stored as PNG images in the data files, and the real GR00T v2.0 set (stats.json only, no
#: frame_index column, a camera declared without files: read with the options its quirks need).
DATASETS = {
    "v3.0": dict(episodes_per_file=2),
    "v2.1": dict(version="v2.1"),
    "images": dict(image_cameras=True),
    "gr00t": None,
}
GR00T_CAMERA = "observation.images.ego_view"
_DELETE = object()
_samples_unchanged: dict[str, int] = {}


def _dataset(make_ds, name: str) -> Path:
    if DATASETS[name] is None:
        return shared_dataset("gr00t_v20_h264")
    return make_ds(episodes=4, frames_per_episode=20, cameras=1, codec="av1", size=(64, 64), **DATASETS[name])


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path inside a JSON value (its own, ``()``, first)."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, (*path, key))


def _changed(value: Any, rng: random.Random) -> Any:
    """Another value for a JSON value, ``_DELETE`` to drop it: near it, or of another type."""
    if isinstance(value, bool):
        options: list[Any] = [not value, "true", None, 1]
    elif isinstance(value, int):
        options = [value + 1, value - 1, 0, -1, value * 2, str(value), None, value + 0.5]
    elif isinstance(value, float):
        options = [value * 1.01, value + 1, 0.0, -value, str(value), None]
    elif isinstance(value, str):
        options = ["", "x", value + "x", value.upper(), 123, None]
    elif isinstance(value, list):
        options = [[], value[:-1], value + value[-1:], None, "x"] if value else [[1], None]
    else:
        options = [{}, None, []]
    return rng.choice([*options, _DELETE])


def _change_json(document: Any, rng: random.Random) -> str:
    """Change one value inside ``document`` in place; returns what was done."""
    path = rng.choice(list(_paths(document))[1:])
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    before = parent[path[-1]]
    after = _changed(before, rng)
    if after is _DELETE:
        parent.pop(path[-1])
    else:
        parent[path[-1]] = after
    return f"{'/'.join(map(str, path))}: {before!r} -> {'dropped' if after is _DELETE else repr(after)}"


def _change_json_file(path: Path, rng: random.Random) -> str:
    document = json.loads(path.read_text())
    what = _change_json(document, rng)
    path.write_text(json.dumps(document))
    return f"{path.name} {what}"


def _change_lines(path: Path, rng: random.Random) -> str:
    """One line of a JSON-lines file dropped, repeated, swapped with another, or a value in it changed."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    at, mode = rng.randrange(len(lines)), rng.choice(["value", "value", "value", "drop", "repeat", "swap"])
    if mode == "value":
        what = f"line {at} {_change_json(lines[at], rng)}"
    elif mode == "drop":
        what = f"line {at} dropped"
        lines.pop(at)
    elif mode == "repeat":
        what = f"line {at} repeated"
        lines.insert(at, lines[at])
    else:
        other = rng.randrange(len(lines))
        what = f"lines {at} and {other} swapped"
        lines[at], lines[other] = lines[other], lines[at]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return f"{path.name} {what}"


def _changed_cell(value: Any, rng: random.Random) -> Any:
    """Another value for a parquet cell: near it, or missing (a null)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, 0, -1, value + 1000, None])
    if isinstance(value, float):
        return rng.choice(
            [value + 1 / 30, value - 1 / 30, value + 0.5 / 30, value + 1e-5, -1.0, 2 * value, float("nan"), None]
        )
    if isinstance(value, str):
        return rng.choice(["", value + "x", "other", None])
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        at = rng.randrange(len(value))
        return [*value[:at], value[at] + 1, *value[at + 1 :]]
    return None


def _change_parquet(path: Path, rng: random.Random, columns: list[str] | None = None) -> str:
    """One row dropped, repeated or swapped, a column dropped, or one value of a column changed (of ``columns``,
    all if None); the file is written whole again, so it parses."""
    table = pq.read_table(path)
    names = [name for name in table.column_names if columns is None or name in columns]
    mode = rng.choice(["value", "value", "value", "drop row", "repeat row", "swap rows", "drop column"])
    at = rng.randrange(table.num_rows)
    rows = list(range(table.num_rows))
    if mode == "drop column":
        name = rng.choice(names)
        table, what = table.drop_columns([name]), f"column {name} dropped"
    elif mode == "drop row":
        rows.pop(at)
    elif mode == "repeat row":
        rows.insert(at, at)
    elif mode == "swap rows":
        other = rng.randrange(table.num_rows)
        rows[at], rows[other] = rows[other], rows[at]
    else:
        name = rng.choice(names)
        values = table[name].to_pylist()
        before, values[at] = values[at], _changed_cell(values[at], rng)
        table = table.set_column(table.column_names.index(name), name, pa.array(values, table[name].type))
        what = f"{name}[{at}] {before!r} -> {values[at]!r}"
    if mode.endswith(("row", "rows")):
        table, what = table.take(pa.array(rows)), f"{mode} at {at}"
    pq.write_table(table, path)
    return f"{path.parent.name}/{path.name} {what}"


def _change(root: Path, seed: int) -> str:
    """Change one value of ``root``'s metadata as ``seed`` draws it; returns what was done."""
    rng = random.Random(seed)
    meta = root / "meta"
    where = rng.choice(["info", "episodes", "episodes", "data", "data", "tasks", "stats"])
    if where == "info":
        return _change_json_file(meta / "info.json", rng)
    if where == "data":
        # (the columns whose values place rows, and images: the others are values a pass hands out as they are)
        path = rng.choice(sorted((root / "data").rglob("*.parquet")))
        images = [field.name for field in pq.read_schema(path) if pa.types.is_struct(field.type)]
        return _change_parquet(path, rng, [*INDEX_COLUMNS, *images])
    if where == "stats" and not (meta / "episodes_stats.jsonl").exists():  # v3.0, v2.0
        return _change_json_file(meta / "stats.json", rng)
    if (meta / "episodes.jsonl").exists():  # v2.1, v2.0
        return _change_lines(
            meta / {"episodes": "episodes.jsonl", "tasks": "tasks.jsonl"}.get(where, "episodes_stats.jsonl"), rng
        )
    tables = sorted((meta / "episodes").rglob("*.parquet")) if where == "episodes" else [meta / "tasks.parquet"]
    return _change_parquet(rng.choice(tables), rng)


def _options(dataset: str) -> dict[str, Any]:
    """How a pass over ``dataset`` reads it: a window on its camera and one on its actions."""
    if dataset != "gr00t":
        return dict(batch_size=4, delta_timestamps={"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1]})
    # (in order: its 250-frame GOPs make a shuffled pass decode about 125 frames a sample, 12 times as long)
    return dict(
        batch_size=64, cameras=[GR00T_CAMERA], timestamp_source="frame_index", shuffle=False,
        delta_timestamps={GR00T_CAMERA: [-0.1, 0.0], "action": [0.0, 0.1]},
    )  # fmt: skip


def _samples(root: Path | str, dataset: str) -> int:
    """One pass's samples; the statistics are read too, as normalisation reads them."""
    it = DALILeRobotIterator(root, device="cpu", num_workers=WORKERS, drop_last=False, **_options(dataset))
    try:
        it.reader.read_stats()
        return sum(len(batch["index"]) for batch in it)
    finally:
        it.close()


def _whole(make_ds, dataset: str) -> int:
    """The unchanged dataset's samples in one pass (once per session)."""
    if dataset not in _samples_unchanged:
        _samples_unchanged[dataset] = _samples(_dataset(make_ds, dataset), dataset)
    return _samples_unchanged[dataset]


def _over_http(root: Path, server: FolderServer, base: Path) -> str:
    return f"{server.url}/{root.relative_to(base).as_posix()}"


@pytest.mark.parametrize("dataset", DATASETS)
def test_unchanged_every_dataset_reads_whole(make_ds, copy_ds, tmp_path_factory, basetemp_server, dataset: str) -> None:
    """The control: an error below is the change's, not the setting's."""
    assert _whole(make_ds, dataset) == (2096 if dataset == "gr00t" else 80)
    served = _over_http(copy_ds(_dataset(make_ds, dataset)), basetemp_server, tmp_path_factory.getbasetemp())
    assert _samples(served, dataset) == _whole(make_ds, dataset)


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES))
@pytest.mark.parametrize("dataset", DATASETS)
def test_a_changed_value_gives_values_or_an_error_of_ours(
    make_ds, copy_ds, tmp_path_factory, basetemp_server, caplog: pytest.LogCaptureFixture, dataset: str, seed: int
) -> None:
    """Every third case over HTTP: remote metadata is read through fsspec and a cache of its own."""
    whole = _whole(make_ds, dataset)
    root = copy_ds(_dataset(make_ds, dataset))
    change = _change(root, seed)
    source = _over_http(root, basetemp_server, tmp_path_factory.getbasetemp()) if seed % 3 == 2 else root
    try:
        samples = _samples(source, dataset)
    except DatasetError:
        return
    except Exception as e:
        pytest.fail(f"{change}: {type(e).__name__} came through: {e}")
    assert samples == whole or "but the episode metadata lists" in caplog.text, change
