"""``concat_datasets``: several datasets read as one by one iterator, every sample from its own dataset's files.

The two datasets differ in layout version, episode lengths and task assignment, so a sample read from the wrong
dataset shows in its rows, its frame's marker or its task string.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import shutil
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture, concat_datasets, open_dataset
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.dataset_stats import read_dataset_stats
from lerobot_dali.errors import (
    CameraSelectionError,
    DatasetError,
    FrameTimestampError,
    RenameMapError,
    SchemaMismatchError,
)
from lerobot_dali.generate import expected_action, expected_state, expected_task_index, task_name
from tests.conftest import shared_dataset
from tests.http_server import serve_folder
from tests.test_mixture import _keys, _marker  # (dataset, episode, frame) of each sample; a frame's marker
from tests.video_fixtures import assert_frames_decoded, gr00t_video, reference_frames

#: Per dataset: episode lengths, layout, task seed.
SPECS = (([5, 7, 4], "v3.0", 0), ([9, 3], "v2.1", 1))
FPS = 10
DELTAS = {"action": [0.0, 0.1], "observation.images.cam0": [-0.1, 0.0]}
#: (dataset, episode, frame) of every frame of the two datasets, in the union's order.
EVERY_FRAME = [(d, ep, f) for d, (lengths, _, _) in enumerate(SPECS) for ep, n in enumerate(lengths) for f in range(n)]


@pytest.fixture
def read_as_packets(monkeypatch) -> list[str]:
    """Paths of the videos read packet by packet (remote files' route) in this process (workers=0)."""
    from lerobot_dali import batch_source

    paths: list[str] = []
    payloads = batch_source.read_packet_payloads
    monkeypatch.setattr(
        batch_source, "read_packet_payloads", lambda path, *a, **k: paths.append(path) or payloads(path, *a, **k)
    )
    return paths


def _datasets(make_ds, codec: str = "vp9", **second) -> list[Path]:
    """The two datasets; ``second``: other arguments for the second."""
    return [
        make_ds(**{"episodes": len(lengths), "frames_per_episode": lengths, "cameras": 1, "codec": codec, "fps": FPS,
                   "gop": 4, "episodes_per_file": 2, "version": version, "seed": seed, **(second if i else {})})
        for i, (lengths, version, seed) in enumerate(SPECS)
    ]  # fmt: skip


@pytest.mark.parametrize("where", ["local", "http", "http-uncached"])
def test_every_sample_is_its_own_datasets_row_frame_and_task(make_ds, where: str, tmp_path_factory) -> None:
    """Local, and over HTTP through the prefetch cache (every dataset's ranges in one) or without it."""
    paths = _datasets(make_ds)
    if where == "local":
        _read_every_sample(concat_datasets(paths))
        return
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([f"{server.url}/{p.parent.name}/{p.name}" for p in paths])
        assert not union.location.is_local and union.location.description.startswith("union of http")
        cached = where == "http"
        # Through the cache, the workers read every dataset's ranges from one: a second epoch asks for nothing.
        # (prefetch=6: the warm-up before the first batch holds all 28 samples' episodes. Else the background
        # prefetcher may fall behind the worker under load, and an episode the worker read remotely is fetched
        # into the cache in the second epoch.)
        options = {"cache_gb": 8.0, "prefetch": 6} if cached else {"cache_gb": 0.0}
        _read_every_sample(union, num_workers=1, between=server.reset_stats, **options)
        assert not cached or [(r.method, r.path) for r in server.records] == []


@pytest.mark.parametrize("cached", [False, True])
def test_remote_datasets_with_their_own_storage_options_are_each_read_with_them(
    make_ds, cached: bool, tmp_path_factory
) -> None:
    """Two HTTP servers, each asking for its own token: every file of each dataset was read through the first's
    filesystem, so the second's server got the first's token (HTTP 401 on all its data and video reads). Each
    dataset's files are read with its own options now, each asking for its own ETag (If-Match)."""
    paths = _datasets(make_ds)
    with serve_folder(tmp_path_factory.getbasetemp()) as a, serve_folder(tmp_path_factory.getbasetemp()) as b:
        servers = (a, b)
        readers = []
        for server, path, token in zip(servers, paths, ("a", "b"), strict=True):
            server.required_headers = {"Authorization": f"Bearer {token}"}
            url = f"{server.url}/{path.parent.name}/{path.name}"
            readers.append(open_dataset(url, storage_options={"headers": {"Authorization": f"Bearer {token}"}}))
        union = concat_datasets(readers)
        options = {"cache_gb": 8.0, "prefetch": 6} if cached else {"cache_gb": 0.0}
        _read_every_sample(union, num_workers=1, **options)
        for server in servers:
            kinds = Counter(r.kind for r in server.records)
            assert kinds["unauthorized"] == kinds["precondition"] == 0 and kinds["range"] > 0, kinds
            bulk = [r for r in server.records if r.method == "GET" and r.kind == "range"]
            assert {r.path.split("/")[3] for r in bulk} == {"data", "videos"}
            assert all(r.if_match is not None for r in bulk), [(r.path, r.range) for r in bulk if r.if_match is None]


def _read_every_sample(union, between=None, **options) -> None:
    """Two epochs (``between()`` called between them), every sample checked."""
    assert (union.num_episodes, union.num_frames) == (5, 28)
    # Task indices are the union's: the first dataset's two tasks, then the second's.
    assert union.tasks == {i: task_name(i % 2) for i in range(4)}
    options = {"num_workers": 0, **options}
    it = DALILeRobotIterator(
        union, batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", drop_last=False, **options
    )
    for epoch in range(2):
        if epoch and between is not None:
            between()
        _check_epoch(it)
    it.close()


def _check_epoch(it: DALILeRobotIterator, timestamp=lambda d, f: f / FPS) -> None:
    """``timestamp(dataset, frame)``: a row's parquet timestamp."""
    taken = []
    for batch in it:
        for i, (d, ep, f) in enumerate(_keys(batch)):
            taken.append((d, ep, f))
            lengths, _, seed = SPECS[d]
            n = lengths[ep]
            assert int(batch["index"][i]) == sum(lengths[:ep]) + f  # the dataset's own
            assert float(batch["timestamp"][i]) == pytest.approx(timestamp(d, f))
            np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(ep, f))
            task = expected_task_index(ep, seed=seed)
            assert int(batch["task_index"][i]) == 2 * d + task and batch["task"][i] == task_name(task)
            query = [f + round(delta * FPS) for delta in DELTAS["action"]]
            rows = [min(max(q, 0), n - 1) for q in query]
            np.testing.assert_array_equal(batch["action"][i].numpy(), expected_action(ep, np.array(rows)))
            assert batch["action_is_pad"][i].tolist() == [not 0 <= q < n for q in query]
            query = [f + round(delta * FPS) for delta in DELTAS["observation.images.cam0"]]
            rows = [min(max(q, 0), n - 1) for q in query]
            assert [_marker(frame) for frame in batch["observation.images.cam0"][i]] == [(ep, r, 0) for r in rows]
    assert taken == EVERY_FRAME


def test_ranks_and_workers_share_the_union_exactly_once_and_resume(make_ds) -> None:
    """Shuffled over two ranks with worker processes (H.264: the CPU-fallback decoders), each epoch covers every
    frame of both datasets once; a resume in the middle gives the rest of the uninterrupted run."""
    paths = _datasets(make_ds, codec="h264")

    def iterator(rank: int) -> DALILeRobotIterator:
        return DALILeRobotIterator(
            concat_datasets(paths), batch_size=3, seed=5, device="cpu", num_workers=2, rank=rank, world_size=2,
            rank_balance="drop", drop_last=False, episode_piece_frames=4,
        )  # fmt: skip

    everything = Counter(EVERY_FRAME)
    runs = []
    for rank in (0, 1):
        it = iterator(rank)
        epochs = []
        for epoch in range(2):
            it.set_epoch(epoch)
            epochs.append([k for batch in it for k in _keys(batch)])
        it.close()
        runs.append(epochs)
    for epoch in range(2):
        both = Counter(runs[0][epoch]) + Counter(runs[1][epoch])
        assert set(both) <= set(everything) and max(both.values()) == 1  # none twice (drop: the fuller rank's end)
        assert len(runs[0][epoch]) == len(runs[1][epoch]) >= 12
    assert runs[0][0] != runs[0][1]  # reshuffled
    it = iterator(0)
    head = []
    for batch in it:
        head.extend(_keys(batch))
        if len(head) >= 6:
            break
    state = it.state_dict()
    it.close()
    resumed = iterator(0)
    resumed.load_state_dict(state)
    assert head + [k for batch in resumed for k in _keys(batch)] == runs[0][0]
    resumed.close()


def _read_saving_at(it: DALILeRobotIterator, keys_of, state: dict | None, stop: int | None) -> tuple[list, dict | None]:
    """``keys_of`` every batch ``it`` reads from ``state`` (where given) on, and its state after batch ``stop`` (where
    given: it stops there), ``it`` closed."""
    if state is not None:
        it.load_state_dict(state)
    read: list = []
    for n, batch in enumerate(it):
        read += keys_of(batch)
        if n == stop:
            saved = it.state_dict()
            it.close()
            return read, saved
    it.close()
    return read, None


def test_a_union_resumed_with_its_datasets_in_another_order_is_refused(make_ds, tmp_path_factory) -> None:
    """A union's stream state was known by its episodes' indices and lengths alone: two datasets of the same shape
    (a local and an HTTP one, 6 and 4 frames each) resumed listed the other way round went on without a word, each
    position now the other dataset's sample: of the 12 samples after the resume all 12 were the other dataset's, 6 of
    the epoch's 20 read twice and 6 never. Refused now, naming the order, whether or not one of them was moved too
    (its name, a digest of which the state held, then another: passed before); the same datasets in the saved order,
    one of them moved to the server, still resume exactly where they stood. A state saved before it held its
    datasets' contents resumes as it did."""
    from lerobot_dali.errors import ResumeStateError

    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=FPS, gop=4, seed=seed)
        for seed in (0, 1)
    )
    options = {"batch_size": 4, "shuffle": True, "seed": 7, "device": "cpu", "num_workers": 0, "decode": "cpu"}
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        url_a, url_b = (f"{server.url}/{p.parent.name}/{p.name}" for p in (a, b))
        which = {str(a): "a", url_a: "a", str(b): "b", url_b: "b"}

        def keys(given: list, state: dict | None = None, stop: int | None = None) -> tuple[list, dict | None]:
            def named(batch: dict) -> list:  # (each sample by its own dataset, whatever its place in the union)
                indices = zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
                return [(which[str(given[d])], i) for d, i in indices]

            it = DALILeRobotIterator(concat_datasets(given), cache_gb=0.0, drop_last=False, **options)
            return _read_saving_at(it, named, state, stop)

        whole, _ = keys([a, url_b])
        head, state = keys([a, url_b], stop=1)
        assert state is not None and len(head) == 8
        for swapped in ([url_b, a], [b, url_a]):  # (the second: b read from disk now, a from the server)
            with pytest.raises(ResumeStateError, match=r"datasets in another order.* is dataset 0, was 1"):
                keys(swapped, state)
        for same in ([url_a, url_b], [a, url_b], [a, b]):  # (the local one served now, as saved, b on disk)
            rest, _ = keys(same, state)
            assert head + rest == whole
        older = {k: v for k, v in state.items() if k != "dataset_contents"}
        assert keys([url_a, url_b], older)[0] == whole[8:]
    assert len(whole) == len(set(whole)) == 20


def test_a_union_within_a_union_resumed_with_its_datasets_in_another_order_is_refused(make_ds) -> None:
    """The state held a union within the union as one digest of its datasets' in their order: that union reordered
    inside was a dataset the state did not hold, left to the episodes' check, which two datasets of one shape pass.
    [union(a, b), c] saved after 2 batches of 4 and resumed as [union(b, a), c] read 14 of the 28 samples of the
    epoch from the other dataset than the uninterrupted run (a and b: 6 and 4 frames, seeds 0 and 1). Refused now,
    naming each dataset's position among all the union's; resumed as saved, it reads exactly on."""
    from lerobot_dali.errors import ResumeStateError

    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=FPS, gop=4, seed=seed)
        for seed in (0, 1)
    )
    c = make_ds(episodes=2, frames_per_episode=[5, 3], cameras=1, codec="h264", fps=FPS, gop=4)
    options = {"batch_size": 4, "shuffle": True, "seed": 7, "device": "cpu", "num_workers": 0, "decode": "cpu"}

    def samples(inner: list[Path], state: dict | None = None, stop: int | None = None) -> tuple[list, dict | None]:
        def told(batch: dict) -> list:  # (a's and b's tasks tell them apart: task = (episode + seed) % 2)
            seeds = (batch["task_index"] - batch["episode_index"]) % 2
            return list(zip(batch["dataset_index"].tolist(), seeds.tolist(), _keys(batch), strict=True))

        it = DALILeRobotIterator(concat_datasets([concat_datasets(inner), c]), drop_last=False, **options)
        return _read_saving_at(it, told, state and json.loads(json.dumps(state)), stop)

    whole, _ = samples([a, b])
    head, state = samples([a, b], stop=1)
    assert state is not None and len(head) == 8 and len(whole) == len(set(whole)) == 28
    said = rf"another order.*{re.escape(str(b))} is dataset 0, was 1; {re.escape(str(a))} is dataset 1, was 0"
    with pytest.raises(ResumeStateError, match=said):
        samples([b, a], state)
    assert head + samples([a, b], state)[0] == whole


def test_a_reorder_around_a_union_within_says_its_positions_count_each_dataset_within(make_ds) -> None:
    """Positions in the refusal count each dataset within a union: [c, union(a, b)] resumed as [union(a, b), c] said
    'c is dataset 2, was 0' of a union listed as 2 datasets, a position among none of them (1 of 1 such refusals
    did not say why). Now it says the positions count each dataset within a union."""
    from lerobot_dali.errors import ResumeStateError

    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=FPS, gop=4, seed=seed)
        for seed in (0, 1)
    )
    c = make_ds(episodes=2, frames_per_episode=[5, 3], cameras=1, codec="h264", fps=FPS, gop=4)
    options = {"batch_size": 4, "device": "cpu", "num_workers": 0, "decode": "cpu"}
    saved = DALILeRobotIterator(concat_datasets([c, concat_datasets([a, b])]), **options)
    state = json.loads(json.dumps(saved.state_dict()))
    saved.close()
    it = DALILeRobotIterator(concat_datasets([concat_datasets([a, b]), c]), **options)
    said = (
        rf"{re.escape(str(a))} is dataset 0, was 1; {re.escape(str(b))} is dataset 1, was 2; {re.escape(str(c))} is "
        r"dataset 2, was 0, counting each dataset within a union\); list the datasets"
    )
    with pytest.raises(ResumeStateError, match=said):
        it.load_state_dict(state)
    it.close()
    # (no union within: the positions are the ones listed, said as before)
    flat = DALILeRobotIterator(concat_datasets([a, b, c]), **options)
    with pytest.raises(ResumeStateError, match=rf"{re.escape(str(c))} is dataset 2, was 0\); list the datasets"):
        flat.load_state_dict(state)
    flat.close()


@pytest.mark.parametrize("as_tuple", [False, True])
@pytest.mark.parametrize("now", ["cab", "bc", "aab"])
def test_a_union_resumed_over_other_datasets_or_one_listed_twice_names_each_as_saved(
    make_ds, now: str, as_tuple
) -> None:
    """A dataset added at the front, or the first one removed, moves the others: the state was refused as saved
    'over the union's datasets in another order', naming the moved ones alone, as if they were the same datasets
    listed otherwise ([a, b] resumed as [c, a, b]: 'a is dataset 1, was 0; b is dataset 2, was 1'). Now the error
    says the datasets are others, naming the one not saved over and the count of those that were. The datasets'
    contents given as a tuple (as the stream's own lists may be, from a serializer) are checked as a list: they
    were skipped, as a state from before they were saved. A dataset listed twice is named at each position it held:
    [a, b, a] resumed as [a, a, b] said 'a is dataset 1, was 0', where it was at 2 too."""
    from lerobot_dali.errors import ResumeStateError

    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=FPS, gop=4, seed=seed)
        for seed in (0, 1)
    )
    c = make_ds(episodes=2, frames_per_episode=[5, 3], cameras=1, codec="h264", fps=FPS, gop=4)
    named = {"a": a, "b": b, "c": c}
    saved = [a, b, a] if now == "aab" else [a, b]
    it = DALILeRobotIterator(concat_datasets(saved), batch_size=4, device="cpu", num_workers=0, decode="cpu")
    next(iter(it))
    state = it.state_dict()
    it.close()
    if as_tuple:
        state["dataset_contents"] = tuple(state["dataset_contents"])
    resumed = DALILeRobotIterator(concat_datasets([named[n] for n in now]), device="cpu", num_workers=0)
    with pytest.raises(ResumeStateError) as refused:
        resumed.load_state_dict(state)
    said = str(refused.value)
    if now == "aab":  # (the same datasets, one of them twice, in another order)
        assert f"another dataset's sample ({a} is dataset 1, was 0 or 2; {b} is dataset 2, was 1); list" in said
        assert "in another order" in said
        return
    assert "saved over other datasets than the union: " in said and "in another order" not in said
    assert f"{c} (dataset {now.index('c')}) is not one it was saved over" in said
    assert ("it was saved over 2 datasets, not 3" in said) == (len(now) == 3)
    assert f"{b} is dataset 0, was 1" in said if now == "bc" else f"{a} is dataset 1, was 0" in said


def test_another_selection_of_a_dataset_moved_past_the_end_of_the_saved_list_is_named(make_ds) -> None:
    """[a (episodes 0, 1), b] saved, resumed as [c, b, a (episodes 2, 3)]: a's contents (its episodes read) were not
    the state's, and its identity was looked up only at positions the state held, so a, now past the end of the saved
    list, was not named; the resume was refused by the episodes' check alone ('saved over other episodes', naming no
    dataset). Now a is named as moved from 0 by its identity, beside c, not saved over, and the count."""
    from lerobot_dali.errors import ResumeStateError

    a, b, c = (
        make_ds(episodes=4, frames_per_episode=[6, 4, 6, 4], cameras=1, codec="h264", fps=FPS, gop=4, num_tasks=tasks)
        for tasks in (1, 2, 3)
    )
    options = {"batch_size": 4, "device": "cpu", "num_workers": 0, "decode": "cpu"}
    it = DALILeRobotIterator(concat_datasets([open_dataset(a, episodes=[0, 1]), b]), **options)
    next(iter(it))
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    resumed = DALILeRobotIterator(concat_datasets([c, b, open_dataset(a, episodes=[2, 3])]), **options)
    with pytest.raises(ResumeStateError, match="saved over other datasets than the union") as refused:
        resumed.load_state_dict(state)
    resumed.close()
    said = str(refused.value)
    assert f"{a} is dataset 2, was 0; {c} (dataset 0) is not one it was saved over" in said
    assert "it was saved over 2 datasets, not 3" in said
    # a's other selection added after the saved list, a (episodes 0, 1) still at 0: nothing moved, so no reorder to
    # refuse (left to the episodes' check), not a named as moved from 0, where it still is.
    from lerobot_dali.dataset_union import refuse_another_order

    added = [open_dataset(a, episodes=[0, 1]), open_dataset(b), open_dataset(a, episodes=[2, 3])]
    assert refuse_another_order(state, added, "the union") is None


def test_a_union_resumed_with_one_dataset_regenerated_warns_naming_it_alone(make_ds, caplog) -> None:
    """A union's state held its datasets' contents to refuse another order, but left a dataset it did not hold to
    the episodes' check: [a, c] saved and resumed as [b, c] (b: a of another seed, the same shape) went on without a
    word. It warns now, one line naming a as saved and b as now (c, unchanged, is not named), and resumes at the same
    position; a state saved before it named its datasets names a by its place."""
    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=FPS, gop=4, seed=seed)
        for seed in (0, 1)
    )
    c = make_ds(episodes=2, frames_per_episode=[5, 3], cameras=1, codec="h264", fps=FPS, gop=4)
    options = {"batch_size": 4, "device": "cpu", "num_workers": 0, "decode": "cpu"}
    it = DALILeRobotIterator(concat_datasets([a, c]), **options)
    next(iter(it))
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert state["dataset_descriptions"] == [str(a), str(c)]
    for saved, named in (
        (state, str(a)),
        ({k: v for k, v in state.items() if k != "dataset_descriptions"}, "dataset 0"),
    ):
        caplog.clear()
        resumed = DALILeRobotIterator(concat_datasets([b, c]), **options)
        with caplog.at_level(logging.WARNING):
            resumed.load_state_dict(saved)
        assert resumed.state_dict()["samples_consumed"] == 4
        resumed.close()
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and "\n" not in warned[0] and str(c) not in warned[0]
        assert f"saved over {named} (contents {state['dataset_contents'][0]}), now {b} (contents " in warned[0]


def test_contents_saved_as_a_tuple_warn_only_of_a_dataset_that_changed(make_ds, caplog) -> None:
    """A state from a serializer that gives tuples for lists: the same contents, as a tuple, are no other contents;
    one changed is named alone (by its place: the state names no dataset)."""
    from lerobot_dali.dataset_union import dataset_contents, warn_of_other_contents

    readers = [open_dataset(path) for path in _datasets(make_ds)]
    now = dataset_contents(readers)
    changed = f"saved over dataset 0 (contents {'0' * 16}), now {readers[0].location.description} (contents {now[0]})"
    for contents, warned in ((tuple(now), []), (("0" * 16, now[1]), [changed])):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            warn_of_other_contents({"dataset_contents": contents}, readers)
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == len(warned), said
        for expected, message in zip(warned, said, strict=True):
            assert expected in message and readers[1].location.description not in message, message


@pytest.mark.parametrize("kind", ["union", "mixture"])
def test_datasets_swapped_with_their_selections_left_in_place_are_refused(make_ds, copy_ds, kind, caplog) -> None:
    """A dataset's contents digest holds the episodes read, so one listed elsewhere with another ``episodes=`` was a
    dataset the state did not hold: [a (episodes 0, 1), b (2, 3)] saved and resumed as [b (0, 1), a (2, 3)] (the
    datasets swapped, their selections left in place: one shape at each position) resumed with a warning alone, every
    sample now the other dataset's. The state holds each dataset's identity too (info.json, task table: whatever its
    episodes read), so it is refused as a reorder. A dataset edited in place (its info.json: as a re-encode does)
    still resumes with the warning, and a state saved before it held identities resumes as it did."""
    from lerobot_dali.errors import ResumeStateError

    lengths = [6, 4, 6, 4]
    a, b = (
        make_ds(episodes=4, frames_per_episode=lengths, cameras=1, codec="h264", fps=FPS, gop=4, num_tasks=tasks)
        for tasks in (2, 3)
    )
    edited = copy_ds(a)
    info = json.loads((edited / "meta/info.json").read_text())
    (edited / "meta/info.json").write_text(json.dumps({**info, "robot_type": "another"}))
    options = {"batch_size": 4, "device": "cpu", "num_workers": 0, "decode": "cpu"}

    def iterator(first: Path, second: Path) -> DALILeRobotIterator | DALILeRobotMixture:
        datasets = [open_dataset(first, episodes=[0, 1]), open_dataset(second, episodes=[2, 3])]
        return DALILeRobotMixture(datasets, **options) if kind == "mixture" else (
            DALILeRobotIterator(concat_datasets(datasets), **options)
        )  # fmt: skip

    saved = iterator(a, b)
    next(iter(saved))
    state = json.loads(json.dumps(saved.state_dict()))
    saved.close()
    swapped = iterator(b, a)
    said = rf"datasets in another order: .*{re.escape(str(b))} is dataset 0, was 1; {re.escape(str(a))} is dataset 1"
    with pytest.raises(ResumeStateError, match=said + ", was 0"):
        swapped.load_state_dict(state)
    held = state["mixture"] if kind == "mixture" else state
    assert len(held["dataset_identities"]) == 2 and held["dataset_identities"][0] != held["dataset_identities"][1]
    without = {k: v for k, v in held.items() if k != "dataset_identities"}
    older = {**state, "mixture": without} if kind == "mixture" else without
    for resumed_over, loaded in ((swapped, older), (iterator(edited, b), state)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            resumed_over.load_state_dict(loaded)
        resumed_over.close()
        assert any("same episodes and lengths but other contents" in r.getMessage() for r in caplog.records)


def test_statistics_are_pooled_over_every_frame(make_ds, copy_ds, caplog) -> None:
    union = concat_datasets(_datasets(make_ds))
    states = np.concatenate(
        [expected_state(ep, np.arange(n)) for lengths, _, _ in SPECS for ep, n in enumerate(lengths)]
    ).astype(np.float64)
    stats = union.read_stats()["observation.state"]
    np.testing.assert_allclose(stats["mean"], states.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(stats["std"], states.std(axis=0), rtol=1e-4)
    np.testing.assert_array_equal(stats["min"], states.min(axis=0))
    assert int(stats["count"][0]) == 28
    first = read_dataset_stats(open_dataset(_datasets(make_ds)[0]).location)["observation.state"]
    assert not np.allclose(first["mean"], stats["mean"])  # (not the first dataset's alone)
    # A dataset without statistics: pooled over the others, said once per key.
    second = copy_ds(_datasets(make_ds)[1])
    (second / "meta/episodes_stats.jsonl").unlink()
    with caplog.at_level(logging.WARNING):
        alone = concat_datasets([_datasets(make_ds)[0], second]).read_stats()["observation.state"]
    np.testing.assert_array_equal(alone["mean"], first["mean"])
    assert "observation.state has no statistics in" in caplog.text


def test_a_stats_json_without_count_pools_by_its_datasets_frames(make_ds, copy_ds) -> None:
    """A stats.json without 'count' (LeRobot v2.0's) refused to pool, naming the dataset only: it is weighed by its
    dataset's 16 frames now, and the union's statistics are numpy's over both datasets' rows. Only where no frame
    count can be known (no total_frames in info.json, no episode metadata left to add up) is it refused."""
    from lerobot_dali.errors import StatsError
    from tests.test_dataset_stats import data_columns

    first, second = _datasets(make_ds)
    first = copy_ds(first)  # (v3.0: meta/stats.json, here as GR00T's v2.0 one, without counts)
    stats = json.loads((first / "meta/stats.json").read_text())
    stats = {k: {n: x for n, x in v.items() if n != "count"} for k, v in stats.items()}
    (first / "meta/stats.json").write_text(json.dumps(stats))
    pooled = concat_datasets([first, second]).read_stats()
    for key in ("observation.state", "action"):
        rows = data_columns([first, second], key)
        assert int(pooled[key]["count"][0]) == len(rows) == 28
        np.testing.assert_allclose(pooled[key]["mean"], rows.mean(0), rtol=1e-6, err_msg=key)
        np.testing.assert_allclose(pooled[key]["std"], rows.std(0), rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(pooled[key]["min"], rows.min(0), rtol=1e-7, err_msg=key)
        np.testing.assert_allclose(pooled[key]["max"], rows.max(0), rtol=1e-7, err_msg=key)
    info = json.loads((first / "meta/info.json").read_text())
    del info["total_frames"]
    (first / "meta/info.json").write_text(json.dumps(info))
    union = concat_datasets([first, second])
    shutil.rmtree(first / "meta/episodes")
    said = (
        r"an episode lacks \['count'\].*; add what is lacking to the meta/stats\.json of "
        rf"\{{'{first}': \['count'\]\}} \(LeRobot before v2\.1 wrote no 'count': a total_frames in the dataset's "
        r"meta/info\.json stands for it\)$"
    )
    with pytest.raises(StatsError, match=said):
        union.read_stats()


def test_each_dataset_keeps_its_own_episode_selection(make_ds) -> None:
    first, second = _datasets(make_ds)
    union = concat_datasets([open_dataset(first, episodes=[0, 2]), second])
    assert union.episodes.episode_index.tolist() == [0, 2, 0, 1] and union.num_frames == 5 + 4 + 12
    it = DALILeRobotIterator(union, batch_size=3, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    keys = [k for batch in it for k in _keys(batch)]
    it.close()
    assert keys == [(0, ep, f) for ep in (0, 2) for f in range(SPECS[0][0][ep])] + [
        (1, ep, f) for ep, n in enumerate(SPECS[1][0]) for f in range(n)
    ]


def test_renamed_keys_read_each_datasets_own(make_ds) -> None:
    """The second dataset's camera 1 is the union's camera 0 (its own camera 0 renamed away, so left out), and its
    state the union's ``observation.state``: each frame's marker says which camera it came from."""
    first, second = _datasets(make_ds, cameras=2, state_dim=6)
    renames = [
        None,
        {
            "observation.images.cam1": "observation.images.cam0",
            "observation.images.cam0": "observation.images.side",
        },
    ]
    union = concat_datasets([first, second], rename_maps=renames)
    assert union.camera_keys == ["observation.images.cam0"]
    it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=1, drop_last=False)
    seen = []
    for batch in it:
        for i, (d, ep, f) in enumerate(_keys(batch)):
            seen.append(d)
            assert _marker(batch["observation.images.cam0"][i]) == (ep, f, d)  # camera 0 of the first, 1 of the second
            np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(ep, f))
    it.close()
    assert seen.count(0) == 16 and seen.count(1) == 12
    with pytest.raises(ValueError, match="renames .*observation.images.nope.*which it does not read"):
        concat_datasets([first, second], rename_maps=[None, {"observation.images.nope": "observation.images.cam0"}])
    with pytest.raises(TypeError, match=r"rename_maps takes one value \(or None\) per dataset \(2\)"):
        concat_datasets([first, second], rename_maps=[None])


def test_one_rename_map_naming_no_dataset_s_key_says_what_its_keys_are(make_ds) -> None:
    """It named the keys no dataset reads only (as --rename-map and the training script pass one map for all)."""
    from lerobot_dali.key_rename import rename_maps_for

    readers = [open_dataset(path) for path in _datasets(make_ds)]
    cam0 = "observation.images.cam0"
    said = (
        r"rename_map renames \['observation.images.front'\], which none of the datasets reads: a rename_map's keys are "
        rf".*its values the batches' names; this one maps the other way round: pass "
        rf'\{{"{cam0}": "observation\.images\.front"\}}$'
    )
    with pytest.raises(ValueError, match=said):
        rename_maps_for({"observation.images.front": cam0}, readers)
    assert (
        rename_maps_for({cam0: "observation.images.front"}, readers)[0].batch_name(cam0) == "observation.images.front"
    )
    # One map per dataset: as many as the datasets, None for one read under its own names.
    each = rename_maps_for([None, {cam0: "observation.images.front"}], readers)
    assert [rename.to_batch for rename in each] == [{}, {cam0: "observation.images.front"}]
    with pytest.raises(RenameMapError, match=r"one rename_map for all datasets, or one per dataset \(2\), got 1$"):
        rename_maps_for([{cam0: "observation.images.front"}], readers)


def test_a_rename_map_written_partly_the_other_way_round_is_told_whole(make_ds) -> None:
    """The camera's entry written batch name first, the state's right: the map told was the reversed entry alone,
    which dropped the state's (one map for all, as --rename-map passes it, and one per dataset)."""
    from lerobot_dali.key_rename import rename_maps_for

    paths = _datasets(make_ds)
    readers = [open_dataset(path) for path in paths]
    cam0, front, state = "observation.images.cam0", "observation.images.front", "observation.state"
    given, whole = {front: cam0, state: "observation.joints"}, {cam0: front, state: "observation.joints"}
    for opens in (
        lambda rename_map: rename_maps_for(rename_map, readers),
        lambda rename_map: concat_datasets(paths, rename_maps=[whole, rename_map]),
    ):
        with pytest.raises(ValueError, match="maps the other way round: pass ") as raised:
            opens(given)
        found = re.search(r"maps the other way round: pass (\{[^{}]*\})$", str(raised.value))
        assert found is not None and ast.literal_eval(found.group(1)) == whole, raised.value
        opens(whole)
    assert [rename.to_batch for rename in rename_maps_for(whole, readers)] == [whole, whole]
    union = concat_datasets(paths, rename_maps=[whole, whole])
    assert union.camera_keys == [front] and "observation.joints" in union.read_keys and state not in union.read_keys


def test_the_real_v30_and_v21_copies_of_one_recording_read_as_one() -> None:
    """``cr5_v30_av1`` is ``cr5_v21_av1`` converted (its videos joined several episodes to a file): the union of
    both, each by ``frame_index / fps`` as their wall-clock timestamps need (their own setting), gives each
    selected sample once from each, with the same rows, and frames equal to a full decode of the v2.1 episode's own
    file. Episodes 4 and 5 sit on either side of a v3.0 video file boundary; 11 is the last."""
    v30, v21 = shared_dataset("cr5_v30_av1"), shared_dataset("cr5_v21_av1")
    episodes = [4, 5, 11]
    # (each its own frame_index lookup, over the iterator's parquet timestamps, which their rows miss)
    union = concat_datasets(
        [open_dataset(v30, episodes=episodes), open_dataset(v21, episodes=episodes)],
        timestamp_sources=["frame_index"] * 2,
    )
    assert union.tasks == {0: "put the banana on the plate", 1: "put the banana on the plate"}
    it = DALILeRobotIterator(
        union, batch_size=16, device="cpu", num_workers=1, timestamp_source="parquet_timestamp", drop_last=False,
        delta_timestamps={"action": [0.0, 0.1]}, return_uint8=True,
    )  # fmt: skip
    samples: dict[tuple[int, int], dict] = {}
    for batch in it:
        for row, key in enumerate(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)):
            assert key not in samples, f"{key} delivered twice"
            samples[key] = {name: values[row] for name, values in batch.items()}
    it.close()
    lengths = open_dataset(v21).episodes.length
    assert len(samples) == 2 * sum(int(lengths[e]) for e in episodes)
    files = {e: v21 / f"videos/chunk-000/observation.images.top/episode_{e:06d}.mp4" for e in episodes}
    references = {e: [frame for _, frame in sorted(reference_frames(path).items())] for e, path in files.items()}
    for (d, index), got in samples.items():
        twin = samples[1 - d, index]
        assert int(got["task_index"]) == d and got["task"] == twin["task"] == "put the banana on the plate"
        for key in ("episode_index", "frame_index", "action", "action_is_pad", "observation.state", "timestamp"):
            assert torch.equal(got[key], twin[key]), (d, index, key)
        expected = references[int(got["episode_index"])][int(got["frame_index"])]
        np.testing.assert_array_equal(got["observation.images.top"].permute(1, 2, 0).numpy(), expected)


def test_a_union_is_one_dataset_of_a_mixture(make_ds, caplog) -> None:
    """A mixture of a union (the second dataset's camera 1 read as camera 0) and a third dataset: the mixture's
    ``dataset_index`` says union or third, and the union's share of an epoch holds each of its members' samples
    once, each frame its member's (a frame's marker names the camera it was drawn for: 0 for the first, 1 for the
    second)."""
    first, second = _datasets(make_ds, cameras=2)
    third = make_ds(episodes=3, frames_per_episode=4, cameras=1, codec="vp9", fps=FPS, gop=4, seed=2)
    cam0 = "observation.images.cam0"
    union = concat_datasets([first, second], rename_maps=[None, {"observation.images.cam1": cam0, cam0: "x.side"}])
    with caplog.at_level(logging.WARNING):
        mix = DALILeRobotMixture([union, third], weights=[2, 1], batch_size=6, device="cpu", num_workers=0)
    assert "dataset_index" not in caplog.text  # (not "left out": the mixture gives its own)
    assert mix.batch_shares == (4, 2) and len(mix) == 28 // 4  # (the union's epoch is the mixture's)
    seen, epoch = Counter(), []
    for batch in mix:
        epoch.append(_keys(batch))
        assert batch["dataset_index"].tolist() == [0, 0, 0, 0, 1, 1]
        for i, (d, ep, f) in enumerate(_keys(batch)):
            marker_ep, marker_f, camera = _marker(batch[cam0][i])
            assert (marker_ep, marker_f) == (ep, f) and (d == 0 or camera == 0)
            np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(ep, f))
            if d == 0:
                seen[camera, ep, f] += 1
    mix.close()
    assert set(seen) == set(EVERY_FRAME) and set(seen.values()) == {1}  # (member, episode, frame)
    assert union.with_dataset_index  # (the union itself is untouched; the mixture reads a copy without the key)
    # Stopped after 3 batches and resumed with a worker: the rest of the same epoch.
    mix = DALILeRobotMixture([union, third], weights=[2, 1], batch_size=6, device="cpu", num_workers=0)
    head = [_keys(batch) for _, batch in zip(range(3), mix, strict=False)]
    state = mix.state_dict()
    mix.close()
    mix = DALILeRobotMixture([union, third], weights=[2, 1], batch_size=6, device="cpu", num_workers=1)
    mix.load_state_dict(state)
    assert head + [_keys(batch) for batch in mix] == epoch
    mix.close()
    # Unions only: the key every one of them has is still the mixture's own.
    mix = DALILeRobotMixture([union, concat_datasets([third, third])], batch_size=4, device="cpu", num_workers=0)
    batch = next(iter(mix))
    assert batch["dataset_index"].tolist() == [0, 0, 1, 1] and "x.side" not in batch
    mix.close()


def test_datasets_are_opened_at_once_and_the_first_failure_in_order_is_raised(make_ds, monkeypatch) -> None:
    """Opening a remote dataset waits on a dozen requests one after another: a union's (and a mixture's) datasets
    open at once, so two opens meet at a barrier that one-by-one opening would leave broken; of several that fail,
    the first in the list is named, whatever finished first."""
    import threading

    from lerobot_dali import dataset_union

    paths = _datasets(make_ds)
    meet = threading.Barrier(2, timeout=30)
    real_open = dataset_union.open_dataset

    def open_together(path, **kwargs):
        meet.wait()
        return real_open(path, **kwargs)

    monkeypatch.setattr(dataset_union, "open_dataset", open_together)
    assert concat_datasets(paths).num_episodes == 5
    meet.reset()
    DALILeRobotMixture(paths, batch_size=2, device="cpu", num_workers=0).close()
    monkeypatch.setattr(dataset_union, "open_dataset", real_open)
    missing = [paths[0].parent / "nowhere-1", paths[1].parent / "nowhere-2"]
    with pytest.raises(DatasetError, match="nowhere-1"):
        concat_datasets([missing[0], paths[0], missing[1]])


def test_the_datasets_share_one_bound_on_open_data_files(make_ds) -> None:
    """v2.1 keeps a data file per episode: eight datasets of three episodes opened 24 files, each dataset's cache
    keeping its own; the union's one bound holds for all."""
    import psutil

    paths = [make_ds(episodes=3, frames_per_episode=4, cameras=1, fps=FPS, codec="vp9", version="v2.1", seed=s)
             for s in range(8)]  # fmt: skip
    union = concat_datasets(paths)
    union._parquet._max_open = 5
    for pos in range(union.num_episodes):
        union.read_episode(pos)
    roots = tuple(f"{p}/" for p in paths)  # (other tests' readers may hold files of theirs)
    opened = [f.path for f in psutil.Process().open_files() if f.path.startswith(roots) and "/data/" in f.path]
    assert len(opened) <= 5, opened


def test_a_mixed_unions_data_files_are_each_kept_open_to_their_own_datasets_bound(
    make_ds, tmp_path_factory, monkeypatch
) -> None:
    """A union of a local and an HTTP dataset kept the remote bound on open data files (16) for its local files too
    (a local dataset alone: 128): a local v2.1 dataset of 60 episodes (a file each) read twice in a shuffled order
    opened its files 120 times, 13 at most kept open. Each kind is held to its own bound now: the local files open
    once each, the remote ones within theirs (here 20 local and 18 remote files, read twice in turn)."""
    from lerobot_dali import episode_rows

    local, remote = (
        make_ds(episodes=n, frames_per_episode=2, cameras=1, fps=FPS, codec="vp9", version="v2.1", seed=s)
        for n, s in ((20, 0), (18, 1))
    )
    opened: Counter = Counter()
    kept = {"local": 0, "http": 0}
    real_open, real_trim = episode_rows.open_parquet, episode_rows.ParquetCache._trim

    def kind(path: str) -> str:
        return "http" if str(path).startswith("http") else "local"

    def counted(open_file, path: str):
        opened[path] += 1
        return real_open(open_file, path)

    def trim(cache, *bounds) -> None:
        real_trim(cache, *bounds)
        for k, n in Counter(kind(path) for _, path in cache._open).items():
            kept[k] = max(kept[k], n)

    monkeypatch.setattr(episode_rows, "open_parquet", counted)
    monkeypatch.setattr(episode_rows.ParquetCache, "_trim", trim)
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([local, f"{server.url}/{remote.parent.name}/{remote.name}"])
        opened.clear()
        order = [*(p for pair in zip(range(18), range(20, 38), strict=True) for p in pair), 18, 19]  # (in turn)
        for _ in range(2):
            for pos in order:
                rows = union.read_episode(pos, ["episode_index"])
                assert rows["episode_index"].tolist() == [pos - 20 * (pos >= 20)] * 2
        union.close_files()
    by_kind = {k: sorted(n for p, n in opened.items() if kind(p) == k) for k in ("local", "http")}
    assert by_kind == {"local": [1] * 20, "http": [2] * 18}
    assert kept == {"local": 20, "http": 16}


def test_a_nested_unions_data_files_are_held_to_the_one_bound_of_the_outer_union(make_ds, monkeypatch) -> None:
    """A union one of whose datasets is a union shares one bound on open data files, as its other datasets do: the
    nested union's datasets kept reading through the nested union's own cache, so the process held that cache's
    files besides the outer one's (here 6 open at once past a bound of 3, read every episode of
    union(union(a, b), c), a file per episode)."""
    from lerobot_dali import dataset_reader, episode_rows

    monkeypatch.setattr(dataset_reader, "LOCAL_DATA_FILES_KEPT", 3)
    a, b, c = (
        make_ds(episodes=4, frames_per_episode=2, cameras=1, fps=FPS, codec="vp9", version="v2.1", seed=s)
        for s in range(3)
    )
    held: dict[int, int] = {}
    most = 0
    real_trim = episode_rows.ParquetCache._trim

    def trim(cache, *bounds) -> None:
        nonlocal most
        real_trim(cache, *bounds)
        held[id(cache)] = len(cache._open)
        most = max(most, sum(held.values()))

    monkeypatch.setattr(episode_rows.ParquetCache, "_trim", trim)
    union = concat_datasets([concat_datasets([a, b]), c])
    for _ in range(2):
        for pos in range(12):
            assert union.read_episode(pos, ["episode_index"])["episode_index"].tolist() == [pos % 4] * 2
    union.close_files()
    assert most == 3


def test_a_data_file_one_thread_reads_stays_open_while_another_thread_evicts_it(make_ds, monkeypatch) -> None:
    """The iterator looks the union's first episodes up in threads, all through the one bound on open data files:
    a thread's open evicted (and closed) the file another thread had just been handed, whose read then failed as
    "the file is truncated or corrupt: re-download or rewrite it" (pyarrow: "operation on closed Python file").
    Forced here: thread A holds dataset 0's file, the main thread opens dataset 1's past a bound of one, then A
    reads. An evicted file is closed once its last read ends."""
    import threading

    import psutil

    from lerobot_dali import dataset_reader

    paths = [make_ds(episodes=3, frames_per_episode=4, cameras=1, fps=FPS, codec="vp9", version="v2.1", seed=s)
             for s in range(2)]  # fmt: skip
    union = concat_datasets(paths)
    union._parquet._max_open = 1
    handed, evicted = threading.Event(), threading.Event()
    real_read = dataset_reader.read_episode_rows

    def read_after_eviction(parquet, **kwargs):
        if threading.current_thread().name == "A":
            handed.set()
            assert evicted.wait(30)
        return real_read(parquet, **kwargs)

    monkeypatch.setattr(dataset_reader, "read_episode_rows", read_after_eviction)
    results: list[object] = []
    a = threading.Thread(target=lambda: results.append(_rows_or_error(union, 0)), name="A")
    a.start()
    assert handed.wait(30)
    second = union.read_episode(3)  # dataset 1's first episode: its file takes the only place
    evicted.set()
    a.join(30)
    assert second["episode_index"].tolist() == [0] * 4 and second["frame_index"].tolist() == list(range(4))
    [first] = results
    assert not isinstance(first, Exception), first
    np.testing.assert_array_equal(first["action"], expected_action(0, np.arange(4), 7))
    roots = tuple(f"{p}/" for p in paths)
    opened = [f.path for f in psutil.Process().open_files() if f.path.startswith(roots) and "/data/" in f.path]
    assert len(opened) == 1, opened  # (dataset 0's, evicted, closed after A's read)


def _rows_or_error(reader, pos: int):
    try:
        return reader.read_episode(pos)
    except Exception as e:
        return e


def test_each_datasets_first_episode_is_looked_up_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    """Rows that miss their frames in a later dataset fail at construction, as in the first, not mid-epoch."""
    first, second = _datasets(make_ds)
    late = _retimed(copy_ds(second), lambda t: t + 0.5 / FPS)  # every row half a frame late
    union = concat_datasets([first, late])
    with pytest.raises(FrameTimestampError, match=rf"episode 0, camera observation.images.cam0 \({late}"):
        DALILeRobotIterator(union, device="cpu", num_workers=0)


def test_each_first_file_is_indexed_once_when_the_iterator_is_built(make_ds, monkeypatch) -> None:
    """The union's check of each dataset's first file and the iterator's build share its index (the on-disk store, a
    local file's too): the first dataset's first files were demuxed twice, once per key they were cached under."""
    from collections import Counter

    from lerobot_dali import packet_index_cache

    built: Counter[str] = Counter()
    real_build = packet_index_cache.build_packet_index
    monkeypatch.setattr(
        packet_index_cache, "build_packet_index", lambda s, **k: built.update([s]) or real_build(s, **k)
    )
    monkeypatch.setattr(packet_index_cache, "_DEFAULT_CACHE", packet_index_cache.PacketIndexCache())
    DALILeRobotIterator(concat_datasets(list(_datasets(make_ds))), device="cpu", num_workers=0).close()
    assert built and set(built.values()) == {1}, built


def _retimed(root: Path, timestamps) -> Path:
    """``root`` with each data row's parquet timestamp ``t`` replaced by ``timestamps(t)``."""
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        changed = pa.array(timestamps(table["timestamp"].to_numpy()), table["timestamp"].type)
        pq.write_table(table.set_column(table.column_names.index("timestamp"), "timestamp", changed), path)
    return root


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind", ["wall-clock", "late"])
def test_each_dataset_finds_its_frames_its_own_way(make_ds, copy_ds, capsys, kind: str, workers: int) -> None:
    """A dataset whose rows miss its video by the iterator's lookup joins with its own: wall-clock timestamps (a
    clock 1.5% fast, as cr5's) read by ``frame_index``; rows 0.3 frame late within a wider ``tolerance_s``. Every
    sample is still its own row and frame (the workers, too, look each dataset's rows up its own way)."""
    first, second = _datasets(make_ds)
    if kind == "wall-clock":
        own, flag = (
            {"timestamp_sources": [None, "frame_index"]},
            ["--timestamp-source", "parquet_timestamp", "frame_index"],
        )
        second, stamp = _retimed(copy_ds(second), lambda t: t * 0.985), lambda f: f / FPS * 0.985
    else:
        own, flag = {"tolerances_s": [None, 0.035]}, ["--tolerance-s", "1e-4", "0.035"]
        second, stamp = _retimed(copy_ds(second), lambda t: t + 0.03), lambda f: f / FPS + 0.03
    with pytest.raises(FrameTimestampError, match=rf"\({second}"):
        DALILeRobotIterator(concat_datasets([first, second]), device="cpu", num_workers=0)
    union = concat_datasets([first, second], **own)
    it = DALILeRobotIterator(
        union, batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", drop_last=False,
        num_workers=workers,
    )  # fmt: skip
    _check_epoch(it, timestamp=lambda d, f: stamp(f) if d else f / FPS)
    it.close()
    report = check_dataset(union)
    assert (report.problems, report.rows) == ([], 28)
    if workers:
        return
    # The command takes one value per dataset too: as one, or each in turn.
    from lerobot_dali.cli import main

    assert main(["check", str(first), str(second), "--concat"]) == 1
    assert "FrameTimestampError" in capsys.readouterr().out
    assert main(["check", str(first), str(second), "--concat", *flag]) == 0
    said = {
        "wall-clock": "timestamp_source=[parquet_timestamp, frame_index], tolerance_s=0.0001",
        "late": "timestamp_source=parquet_timestamp, tolerance_s=[0.0001, 0.035]",
    }[kind]
    assert f"union of {first}, {second}: 5 episodes, 28 rows" in (out := capsys.readouterr().out) and said in out
    assert main(["check", str(first), str(second), *flag]) == 0
    assert "all 2 datasets ok" in capsys.readouterr().out
    assert main(["check", str(first), str(second), *flag, flag[-1]]) == 2
    assert f"{flag[0]} takes one value, or one per dataset (2), got 3" in capsys.readouterr().err


def test_per_dataset_lookups_take_one_value_or_none_per_dataset(make_ds) -> None:
    paths = _datasets(make_ds)
    with pytest.raises(TypeError, match=r"timestamp_sources takes one value \(or None\) per dataset \(2\)"):
        concat_datasets(paths, timestamp_sources="frame_index")
    with pytest.raises(TypeError, match=r"tolerances_s takes one value \(or None\) per dataset \(2\)"):
        concat_datasets(paths, tolerances_s=[0.1])
    bad_source = "timestamp_source must be one of 'parquet_timestamp', 'frame_index', got 'wall_clock'"
    with pytest.raises(ValueError, match=bad_source):
        concat_datasets(paths, timestamp_sources=[None, "wall_clock"])
    with pytest.raises(ValueError, match=r"tolerance_s must be a positive finite number of seconds, got -1"):
        concat_datasets(paths, tolerances_s=[None, -1])


def test_a_union_is_checked_naming_the_dataset_of_each_problem(make_ds, copy_ds) -> None:
    first, second = _datasets(make_ds)
    damaged = copy_ds(second)
    (damaged / "videos/chunk-000/observation.images.cam0/episode_000001.mp4").unlink()  # (v2.1: one per episode)
    report = check_dataset(concat_datasets([first, damaged]))
    assert [(p.dataset, p.episode_index, p.camera, p.error) for p in report.problems] == [
        (str(damaged), 1, "observation.images.cam0", "MissingDataFileError")
    ]
    assert (report.episodes, report.rows) == (5, 28)


def test_the_command_checks_datasets_as_one_under_the_names_a_rename_map_gives(make_ds, copy_ds, capsys) -> None:
    """``check --concat``: the second dataset's camera 1 read as the union's camera 0; a problem names the dataset
    it is in, its own episode, and the camera by the union's name."""
    from lerobot_dali.cli import main

    first, second = _datasets(make_ds, cameras=2)
    second = copy_ds(second)
    rename = json.dumps({"observation.images.cam1": "observation.images.cam0", "observation.images.cam0": "x.side"})
    argv = ["check", str(first), str(second), "--concat", "--rename-map", "{}", rename, "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["rows"], report["video_files"]) == (5, 28, 4)  # (2 + one camera's 2)
    (second / "videos/chunk-000/observation.images.cam1/episode_000001.mp4").unlink()
    assert main(argv) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [(p["dataset"], p["episode_index"], p["camera"], p["error"]) for p in problems] == [
        (str(second), 1, "observation.images.cam0", "MissingDataFileError")
    ]
    assert "observation.images.cam1/episode_000001.mp4" in problems[0]["message"]
    for args, error in (
        ([str(first), "--concat"], "two datasets or more"),
        (
            [str(first), str(second), "--rename-map", "{}"],
            "--rename-map names the keys of datasets checked as one: add --concat",
        ),
        ([str(first), str(second), "--concat", "--episodes", "0"], "no --episodes"),
        ([str(first), str(second), "--concat", "--rename-map", '{"nope": "x"}'], "renames ['nope'], which none"),
        ([str(first), str(second), "--concat", "--rename-map", "{}", "{}", "{}"], "one per dataset (2), got 3"),
        ([str(first), str(_datasets(make_ds, fps=20)[1]), "--concat"], "SchemaMismatchError: the datasets differ in"),
    ):
        assert main(["check", *args]) == 2
        assert error in capsys.readouterr().err


def test_a_feature_named_dataset_index_is_refused_unless_left_out(make_ds, tmp_path) -> None:
    """It would clash with the key the batches give each sample's dataset in; keys=[...] leaving it out reads the
    rest (the union refused even then: it looked at every declared feature)."""
    first, second = (
        shutil.copytree(path, tmp_path / name) for path, name in zip(_datasets(make_ds), "ab", strict=True)
    )
    for root in (first, second):  # (both: a feature one lacks is left out anyway)
        for path in sorted((root / "data").rglob("*.parquet")):
            table = pq.read_table(path)
            pq.write_table(table.append_column("dataset_index", pa.array([7] * table.num_rows, pa.int64())), path)
        info = json.loads((root / "meta/info.json").read_text())
        info["features"]["dataset_index"] = {"dtype": "int64", "shape": [1], "names": None}
        (root / "meta/info.json").write_text(json.dumps(info))

    def mixture(paths, **kw):
        return DALILeRobotMixture(paths, batch_size=4, device="cpu", num_workers=0, **kw)

    for read in (concat_datasets, mixture):
        with pytest.raises(SchemaMismatchError, match="feature 'dataset_index'.*keys="):
            read([first, second])
    union = concat_datasets([first, second], keys=["action", "observation.state"])
    assert union.tabular_keys == ["action", "observation.state", "dataset_index"]
    it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    assert {d for batch in it for d in batch["dataset_index"].tolist()} == {0, 1}
    it.close()
    mixture([first, second], keys=["action", "observation.state"]).close()


def test_layouts_that_cannot_share_one_pipeline_are_refused(make_ds, caplog) -> None:
    paths = _datasets(make_ds)
    with pytest.raises(SchemaMismatchError, match=r"differ in fps .*DALILeRobotMixture"):
        concat_datasets([paths[0], _datasets(make_ds, fps=20)[1]])
    concat_datasets([paths[0], _datasets(make_ds, codec="h264")[1]])  # (the workers decode it: test_mixed_codecs.py)
    with pytest.raises(SchemaMismatchError, match=r"'observation.state'.*keys="):
        concat_datasets([paths[0], _datasets(make_ds, state_dim=4)[1]])
    with caplog.at_level(logging.WARNING):  # a camera only the second has is left out, as LeRobot does
        union = concat_datasets([paths[0], _datasets(make_ds, cameras=2)[1]])
    assert union.camera_keys == ["observation.images.cam0"] and "observation.images.cam1" in caplog.text
    images = [
        make_ds(episodes=2, frames_per_episode=3, fps=FPS, image_cameras=True, size=size)
        for size in ((64, 64), (64, 96))
    ]
    with pytest.raises(
        SchemaMismatchError,
        match=r"images \(H, W, C\) of camera 'observation.images.cam0'.*\(64, 64, 3\).*\(64, 96, 3\)",
    ):
        concat_datasets(images)
    with pytest.raises(TypeError, match="list of datasets"):
        concat_datasets(paths[0])
    with pytest.raises(TypeError, match=r"concat_datasets\(\[...\]\).*DALILeRobotMixture"):  # (str() of a list)
        DALILeRobotIterator(paths, device="cpu")


def test_a_key_whose_layout_differs_is_told_the_selection_of_its_kind(make_ds) -> None:
    """A tabular key whose shape differs (observation.state of 6 and of 4 values) was told to "leave it out with
    cameras=[...] or keys=[...]", as a camera was; cameras= cannot leave out a tabular key, nor keys= a camera. Each
    is now told its own, and that one reads the rest."""
    paths = _datasets(make_ds)
    narrow = _datasets(make_ds, state_dim=4)[1]
    with pytest.raises(SchemaMismatchError) as info:
        concat_datasets([paths[0], narrow])
    message = str(info.value)
    assert "differ in 'observation.state' (a tabular key's dtype and shape)" in message
    assert "('float32', (6,))" in message and "('float32', (4,))" in message
    assert "leave it out with keys=[...]" in message and "cameras=[...]" not in message
    union = concat_datasets([paths[0], narrow], keys=["action"])
    assert union.tabular_keys == ["action", "dataset_index"] and union.camera_keys == ["observation.images.cam0"]
    images = make_ds(episodes=2, frames_per_episode=3, fps=FPS, image_cameras=True, size=(64, 64))
    with pytest.raises(SchemaMismatchError) as info:  # (a camera stored as video in one, as images in the other)
        concat_datasets([paths[0], images])
    message = str(info.value)
    assert "'observation.images.cam0' (a camera's dtype" in message
    assert "('video', " in message and "('image', " in message
    assert "leave it out with cameras=[...]" in message and "keys=[...]" not in message


def test_a_union_selected_with_its_dataset_index_keeps_it_and_selects_its_datasets_without_it(make_ds) -> None:
    """``dataset_index`` is the union's, not a key of its datasets: kept, and not asked of them (which lack it)."""
    union = concat_datasets(_datasets(make_ds)).select(keys=["action", "dataset_index"])
    assert union.tabular_keys == ["action", "dataset_index"]
    assert [member.tabular_keys for member in union.members] == [["action"], ["action"]]


def test_a_row_of_a_dataset_index_the_union_lacks_is_told_as_the_unions(make_ds) -> None:
    """A row's task_index no list holds, its dataset_index out of the union's range (no dataset 2 or -1 of 2): the
    union's error, naming the union and its own task list, not one of the last dataset's (or an IndexError), nor
    the first dataset's file (meta/tasks.jsonl), which holds none of the union's indices past its own."""
    union = concat_datasets(_datasets(make_ds))
    assert sorted(union.tasks) == [0, 1, 2, 3]
    for dataset in (2, -1, None):
        said = str(union.unlisted_index_error("task", 9, 0, dataset))
        assert said.startswith(
            f"{union.location.description}: episode 0's rows hold task_index 9, which is not in the dataset's task "
            "list (its datasets' task lists, numbered one after another, which holds task indices [0, 1, 2, 3]);"
        ), said
        said = str(union.unlisted_index_error("subtask", 9, 0, dataset))
        assert "subtask list (its datasets' meta/subtasks.parquet, the same in each, which holds subtask" in said, said


def test_a_selection_given_as_one_string_is_refused_naming_the_list(make_ds) -> None:
    """keys="action" (one key, not a list) was read letter by letter: "unknown key(s) ['a', 'c', 't', 'i', 'o',
    'n']", by the union and the mixture (the iterator and cameras= said what to pass)."""
    paths = _datasets(make_ds)
    mixture = partial(DALILeRobotMixture, batch_size=4, device="cpu", num_workers=0)
    for read in (concat_datasets, mixture):
        for option, key in (("keys", "action"), ("cameras", "observation.images.cam0")):
            with pytest.raises(TypeError, match=rf"^{option}= takes a list of keys, got the string '{key}': pass"):
                read(paths, **{option: key})


def test_a_camera_only_the_first_dataset_has_is_left_out(make_ds, caplog) -> None:
    """The first dataset's extra camera is left out (warned) as the second's is, not a KeyError while the union's
    episode table is built (it read every camera of the first dataset's table in the others')."""
    paths = _datasets(make_ds)
    with caplog.at_level(logging.WARNING):
        union = concat_datasets([_datasets(make_ds, cameras=2)[1], paths[0]])
    assert union.camera_keys == ["observation.images.cam0"] and "observation.images.cam1" in caplog.text
    assert list(union.episodes.cameras) == ["observation.images.cam0"]
    it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    assert sum(len(batch["index"]) for batch in it) == union.num_frames
    it.close()


def test_an_index_column_one_dataset_derives_is_not_said_left_out(make_ds, tmp_path, caplog) -> None:
    """Every batch carries the index columns, derived where a dataset's data files lack one (GR00T's v2.0 sets have
    no ``frame_index``): read with such a dataset, the others' were warned of as left out ("keys ['frame_index'] of
    ... are left out: not every dataset read with it has them"), by the union and the mixture alike, while every
    sample still came with its frame_index."""
    first, second = _datasets(make_ds)
    second = _without(second, tmp_path / "no_frame_index")
    with caplog.at_level(logging.WARNING):
        union = concat_datasets([first, second])
        DALILeRobotMixture([first, second], batch_size=4, device="cpu", num_workers=0).close()
    assert "frame_index" not in caplog.text, caplog.text
    it = DALILeRobotIterator(
        union, batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", drop_last=False, num_workers=0
    )
    _check_epoch(it)  # (every sample's frame_index, rows and frames: the one derived as the one read)
    it.close()


def _rewritten(root: Path, copy: Path, change) -> Path:
    """A copy of the dataset at ``root`` whose every data file's table is ``change(table)``."""
    copy = shutil.copytree(root, copy)
    for path in sorted((copy / "data").rglob("*.parquet")):
        pq.write_table(change(pq.read_table(path)), path)
    return copy


def _without(root: Path, copy: Path, key: str = "frame_index") -> Path:
    """A copy of the dataset at ``root`` without column ``key`` (GR00T's v2.0 sets have no ``frame_index``), in its
    data files and its info.json."""
    copy = _rewritten(root, copy, lambda table: table.drop([key]))
    info = json.loads((copy / "meta/info.json").read_text())
    del info["features"][key]
    (copy / "meta/info.json").write_text(json.dumps(info))
    return copy


@pytest.mark.parametrize("lacking_first", [True, False])
def test_a_dataset_s_own_frame_index_stored_as_lists_batches_beside_one_derived(
    make_ds, tmp_path, lacking_first: bool
) -> None:
    """A dataset storing ``frame_index`` as one-element lists (counting from 5 here, so its values are not the ones
    derived from row positions) read after one lacking the column: the union held the first's features alone, so
    its rows were never given the batch's scalar shape, and the pipeline failed ("Number of dimensions of the data
    fed to the external source ..."). Every sample carries its own dataset's value now, in one shape: the file's
    where it has the column, its row in the episode where it lacks it."""
    lengths = {d: SPECS[d][0] for d in range(2)}
    first, second = _datasets(make_ds)
    lacking = _without(first, tmp_path / "no_frame_index")

    def listed_from_5(table: pa.Table) -> pa.Table:
        at = table.schema.get_field_index("frame_index")
        values = pa.compute.add(table["frame_index"], 5).combine_chunks()
        return table.set_column(at, "frame_index", pa.FixedSizeListArray.from_arrays(values, 1))

    listed = _rewritten(second, tmp_path / "listed_frame_index", listed_from_5)
    paths, own = ([lacking, listed], [0, 1]) if lacking_first else ([listed, lacking], [1, 0])
    it = DALILeRobotIterator(
        concat_datasets(paths), batch_size=4, shuffle=False, device="cpu", drop_last=False, num_workers=0
    )
    taken = []
    for batch in it:
        assert batch["frame_index"].shape == batch["index"].shape == (len(batch["index"]),)
        for i in range(len(batch["index"])):
            d = own[int(batch["dataset_index"][i])]  # (which of SPECS)
            ep = int(batch["episode_index"][i])
            f = int(batch["index"][i]) - sum(lengths[d][:ep])
            np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(ep, f))
            assert int(batch["frame_index"][i]) == f + 5 * d, (d, ep, f)
            taken.append((d, ep, f))
    it.close()
    assert sorted(taken) == EVERY_FRAME


@pytest.mark.parametrize("key", ["timestamp", "task_index"])
def test_a_dataset_lacking_a_column_every_batch_carries_is_named_in_either_place(make_ds, tmp_path, key: str) -> None:
    """``timestamp`` and ``task_index`` are read from every dataset's files, never derived; only the union's first
    dataset was held to declare them: one lacking them after it failed in the first batch with a bare
    KeyError('timestamp'), and first, the refusal named the union, not the dataset to mend."""
    first, second = _datasets(make_ds)
    lacking = _without(second, tmp_path / f"no_{key}", key)
    for paths in ([first, lacking], [lacking, first]):
        with pytest.raises(
            SchemaMismatchError, match=rf"^{re.escape(str(lacking))}: info.json declares no \['{key}'\]"
        ):
            DALILeRobotIterator(concat_datasets(paths), batch_size=4, device="cpu", num_workers=0)


EGO_VIEW, TOP = "observation.images.ego_view", "observation.images.top"


@pytest.mark.parametrize("reader", ["concat_datasets", "DALILeRobotMixture"])
def test_gr00t_twice_with_cameras_reads_the_asked_camera_alone_and_its_frames(reader: str) -> None:
    """GR00T v2.0 declares 'egoview', never recorded: each dataset was opened with every camera it declares before
    cameras= narrowed them, so reading it twice refused (MissingDataFileError, advising the cameras= already given).
    Each is opened with only its own key for the camera asked now (through its rename_map for the mixture: its
    'ego_view' read as 'top', the map's entry for 'egoview' renaming nothing), and a batch's frames equal an
    independent PyAV decode of the frames its rows name."""
    gr00t = shared_dataset("gr00t_v20_h264")
    options = dict(batch_size=4, shuffle=False, device="cpu", num_workers=0, timestamp_source="frame_index")
    if reader == "concat_datasets":
        camera = EGO_VIEW
        union = concat_datasets([gr00t, gr00t], cameras=[camera])
        assert [member.all_camera_keys for member in union.members] == [(EGO_VIEW,)] * 2
        batches = DALILeRobotIterator(union, **options)
    else:
        camera, rename = TOP, {EGO_VIEW: TOP, "observation.images.egoview": "observation.images.wide"}
        batches = DALILeRobotMixture(
            [gr00t, gr00t],
            cameras=[camera],
            weights=[1, 1],
            dataset_options=[{"rename_map": rename}, {"rename_map": {EGO_VIEW: TOP}}],
            **options,
        )
        assert [part.reader.all_camera_keys for part in batches.datasets] == [(EGO_VIEW,)] * 2
    try:
        batch = next(iter(batches))
    finally:
        batches.close()
    assert [k for k in batch if k.startswith("observation.images.") and not k.endswith("_is_pad")] == [camera]
    assert batch["dataset_index"].tolist() == ([0, 0, 0, 0] if reader == "concat_datasets" else [0, 0, 1, 1])
    assert_frames_decoded(batch[camera], batch["episode_index"], batch["frame_index"], gr00t_video)


def test_a_camera_a_dataset_lacks_after_its_rename_map_names_the_dataset_and_its_cameras() -> None:
    """cameras=[top], which the first dataset's map gives its 'ego_view' and the second's gives nothing: refused
    before any file is looked for, naming the second dataset, the camera, its cameras and the rename that gives it;
    a map giving two of its cameras that name is refused as one camera per name."""
    gr00t = shared_dataset("gr00t_v20_h264")
    declared = ["observation.images.egoview", EGO_VIEW]
    with pytest.raises(CameraSelectionError) as caught:
        concat_datasets([gr00t, gr00t], cameras=[TOP], rename_maps=[{EGO_VIEW: TOP}, None])
    assert str(caught.value).startswith(
        f"{gr00t} has no camera ['{TOP}']; its cameras are {declared}; if a dataset lacking '{TOP}' records it under"
    ), caught.value
    both = {EGO_VIEW: TOP, "observation.images.egoview": TOP}
    with pytest.raises(CameraSelectionError) as caught:
        DALILeRobotMixture([gr00t, gr00t], cameras=[TOP], dataset_options=[{"rename_map": both}] * 2, device="cpu")
    assert str(caught.value) == (
        f"{gr00t}: rename_map gives ['{TOP}'] to several of its cameras ({both}; its cameras are {declared}): one "
        "camera per name"
    )


def test_a_camera_selection_refusal_tells_a_map_that_opens(make_ds) -> None:
    """Three cameras. A map giving two of them 'cam0', with cameras=['cam0', 'side']: refused for lacking 'side' and
    told to give 'cam2' that name, which, passed, was refused for the two 'cam0's; the two 'cam0's are said first.
    One map for all datasets (the command line's one --rename-map) naming another dataset's 'rgb' as 'cam2':
    'cam2' lacking 'top' was told as its own 'rgb' ({'rgb': 'top'}), which, passed, still lacked it; now {'rgb':
    'cam2', 'cam2': 'top'}, with which it opens."""
    from lerobot_dali.dataset_reader import locate_dataset
    from lerobot_dali.key_rename import own_cameras

    path = make_ds(episodes=2, frames_per_episode=8, cameras=3, size=(64, 64), codec="h264")
    located = locate_dataset(path)
    cam0, cam1, cam2, side, top, rgb = (
        f"observation.images.{n}" for n in ("cam0", "cam1", "cam2", "side", "top", "rgb")
    )
    with pytest.raises(CameraSelectionError) as caught:
        concat_datasets([path, path], cameras=[cam0, side], rename_maps=[{cam1: cam0}, None])
    assert str(caught.value).startswith(f"{path}: rename_map gives ['{cam0}'] to several of its cameras"), caught.value
    with pytest.raises(CameraSelectionError) as caught:
        own_cameras(located, [cam0, cam1, top], {rgb: cam2})
    told = ast.literal_eval(re.search(r"with a rename_map \((\{[^{}]*\})", str(caught.value)).group(1))  # type: ignore[union-attr]
    assert told == {rgb: cam2, cam2: top}
    assert own_cameras(located, [cam0, cam1, top], told) == [cam0, cam1, cam2]


def test_a_map_told_reversed_keeps_the_cameras_asked_for(make_ds) -> None:
    """{'top': 'cam1'} (a key the dataset lacks, to one it reads) with cameras=['cam1']: told to pass it reversed,
    {'cam1': 'top'}, which, passed, renames the camera asked for away and is refused; no reversal is told where the
    reversed map does not give the cameras, per dataset and as one map for all (the command line's)."""
    from lerobot_dali.key_rename import rename_maps_for

    path = make_ds(episodes=2, frames_per_episode=8, cameras=3, size=(64, 64), codec="h264")
    cam1, top = "observation.images.cam1", "observation.images.top"
    with pytest.raises(ValueError, match=r"renames \['observation.images.top'\], which it does not read") as caught:
        concat_datasets([path, path], cameras=[cam1], rename_maps=[{top: cam1}, None])
    assert "other way round" not in str(caught.value), caught.value
    readers = [open_dataset(path, cameras=[cam1]), open_dataset(path, cameras=[cam1])]
    with pytest.raises(ValueError, match=r"which none of the datasets reads") as caught:
        rename_maps_for({top: cam1}, readers, cameras=[cam1])
    assert "other way round" not in str(caught.value), caught.value
    with pytest.raises(CameraSelectionError, match="has no camera"):  # (the reversal, passed: why it is not told)
        concat_datasets([path, path], cameras=[cam1], rename_maps=[{cam1: top}, None])


@pytest.mark.parametrize(
    "rename_map",
    [
        {"observation.images.cam0": ""},
        {"observation.images.cam0": " "},
        {"": "observation.images.cam2"},
        {"\t": "observation.images.cam2", "action": "act"},
    ],
)
def test_a_rename_map_naming_an_empty_name_is_refused_as_the_argument_it_is(make_ds, rename_map) -> None:
    """A map with an empty (or whitespace) name, with cameras= a first dataset lacks: concat_datasets, the mixture
    and one map for all (the command line's) said the first dataset lacks the camera (CameraSelectionError), or
    raised TypeError ('' as a new name), or took ' ' as a batch name; each now refuses the map first, a ValueError
    (not a DatasetError: the argument is wrong, not the dataset) naming the dataset and the entries."""
    from lerobot_dali.key_rename import rename_maps_for

    one, three = (make_ds(episodes=2, frames_per_episode=8, cameras=n, size=(64, 64), codec="h264") for n in (1, 3))
    cam2 = "observation.images.cam2"
    blank = {old: new for old, new in rename_map.items() if not old.strip() or not new.strip()}
    said = re.escape(f"{three}: rename_map has entries with an empty name, {blank}: each gives a dataset's own key")
    for build in (
        lambda: concat_datasets([one, three], cameras=[cam2], rename_maps=[None, rename_map]),
        lambda: DALILeRobotMixture(
            [one, three], cameras=[cam2], dataset_options=[{}, {"rename_map": rename_map}], device="cpu"
        ),
    ):
        with pytest.raises(ValueError, match=f"^{said}") as caught:
            build()
        assert not isinstance(caught.value, DatasetError), type(caught.value)
    readers = [open_dataset(one), open_dataset(three)]
    with pytest.raises(ValueError, match=r"^rename_map has entries with an empty name") as caught:
        rename_maps_for(rename_map, readers, cameras=[cam2])
    assert not isinstance(caught.value, DatasetError), type(caught.value)
    # A name that is no string: TypeError naming the map (it was "'<' not supported between 'int' and 'str'")
    with pytest.raises(TypeError, match=r"^a rename_map maps key names to new names \(\{old: new\}\), got \{3: "):
        rename_maps_for({3: "x", "observation.images.cam0": "y"}, readers)


def test_the_command_checks_gr00t_twice_as_one_with_its_recorded_camera(capsys) -> None:
    """``check G G --concat --cameras ego_view``: opened with every declared camera, GR00T's unrecorded 'egoview'
    refused the check (status 2, MissingDataFileError); now it checks the one camera's videos, with no problem."""
    from lerobot_dali.cli import main

    gr00t = str(shared_dataset("gr00t_v20_h264"))
    argv = ["check", gr00t, gr00t, "--concat", "--timestamp-source", "frame_index", "--cameras"]
    assert main([*argv, EGO_VIEW, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["rows"], report["video_files"], report["problems"]) == (
        10,
        4192,
        5,
        [],
    )  # (5 files, each twice)
    assert main([*argv, TOP]) == 2
    said = f"--cameras: {gr00t} has no camera ['{TOP}']; its cameras are ['observation.images.egoview', '{EGO_VIEW}']"
    assert said in capsys.readouterr().err
    assert main([*argv, TOP, "--rename-map", "{}", "{}", "{}"]) == 2  # (counted before a camera is looked for)
    assert "--rename-map takes one value, or one per dataset (2), got 3" in capsys.readouterr().err


def _parquet_rows(root: Path) -> dict[tuple[int, int], dict]:
    """Every row of the dataset at ``root``, read with pyarrow alone, by (episode_index, frame_index)."""
    table = pa.concat_tables([pq.read_table(p) for p in sorted(root.glob("data/**/*.parquet"))])
    return {(row["episode_index"], row["frame_index"]): row for row in table.to_pylist()}


def _mixed_union(make_ds, server, local_first: bool, codec: str) -> tuple[list[Path], list[str]]:
    """The local v3.0 dataset of :data:`SPECS` and its v2.1 one served over HTTP, in union order: their local
    folders and what the union is given."""
    local, remote = _datasets(make_ds, codec=codec)
    paths = [local, remote] if local_first else [remote, local]
    given = [str(p) if p == local else f"{server.url}/{p.parent.name}/{p.name}" for p in paths]
    return paths, given


#: (local first, workers, cache_gb, codec): every order, worker count and cache setting through the workers' PyAV
#: decode (h264), and one through DALI's decode of the workers' clips (vp9).
MIXED_CASES = [
    *((first, workers, cache, "h264") for first in (True, False) for workers in (0, 2) for cache in (0.0, 8.0)),
    (True, 0, 8.0, "vp9"),
]


@pytest.mark.parametrize(("local_first", "workers", "cache_gb", "codec"), MIXED_CASES)
def test_a_local_and_an_http_dataset_read_as_one(
    make_ds,
    tmp_path_factory,
    read_as_packets: list[str],
    local_first: bool,
    workers: int,
    cache_gb: float,
    codec: str,
) -> None:
    """A local folder and an HTTP server's dataset were refused ("a union reads its datasets through one kind of
    filesystem"). Each file is read through its own dataset's filesystem now: every sample once, its rows each
    dataset's parquet rows, its frames an independent PyAV decode of its own dataset's video; the local dataset's
    episodes are never copied into the prefetch cache, nor asked of the server, and its videos are decoded from disk
    by path, not read packet by packet as a remote file's are."""
    camera = "observation.images.cam0"
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        paths, given = _mixed_union(make_ds, server, local_first, codec)
        union = concat_datasets(given)
        local_pos = 0 if local_first else 1
        it = DALILeRobotIterator(
            union, batch_size=4, shuffle=False, device="cpu", drop_last=False, return_uint8=True,
            num_workers=workers, cache_gb=cache_gb, prefetch=6, decode="cpu" if codec == "h264" else "auto",
        )  # fmt: skip
        samples = [{k: v[i] for k, v in batch.items()} for batch in it for i in range(len(batch["index"]))]
        if it._prefetcher is not None:
            starts = union.starts
            held = set(it._prefetcher.cache.owners())
            local_episodes = set(range(int(starts[local_pos]), int(starts[local_pos + 1])))
            assert held and not held & local_episodes, (held, local_episodes)
        it.close()
        local_name = paths[local_pos].parent.name
        assert not [r.path for r in server.records if local_name in r.path]
    if workers == 0 and codec == "h264":
        assert read_as_packets and all(path.startswith(server.url) for path in read_as_packets), read_as_packets
    keys = [(int(s["dataset_index"]), int(s["episode_index"]), int(s["frame_index"])) for s in samples]
    order = [1, 0] if not local_first else [0, 1]  # (the SPECS entry of each union position)
    every = [(d, ep, f) for d, spec in enumerate(order) for ep, n in enumerate(SPECS[spec][0]) for f in range(n)]
    assert sorted(keys) == every and len(keys) == len(every) == 28
    task_offset = [0, 2]
    tolerance = 0 if codec == "h264" else 2  # (PyAV's rgb24 exactly; DALI's YUV to RGB rounds its own way)
    for d, root in enumerate(paths):
        rows = _parquet_rows(root)
        reader = open_dataset(root)
        references: dict[str, list[np.ndarray]] = {}
        for s in (s for s in samples if int(s["dataset_index"]) == d):
            ep, f = int(s["episode_index"]), int(s["frame_index"])
            row = rows[(ep, f)]
            assert int(s["index"]) == row["index"] and float(s["timestamp"]) == pytest.approx(row["timestamp"])
            for key in ("observation.state", "action"):
                np.testing.assert_array_equal(s[key].numpy(), np.asarray(row[key], np.float32))
            assert int(s["task_index"]) == row["task_index"] + task_offset[d]
            video = reader.video(ep, camera)
            if video.path not in references:
                references[video.path] = [frame for _, frame in sorted(reference_frames(video.path).items())]
            expected = references[video.path][round(video.from_timestamp_s * FPS) + f]
            frame = s[camera].permute(1, 2, 0).numpy().astype(np.int16)
            assert np.abs(frame - expected).max() <= tolerance, (d, ep, f, np.abs(frame - expected).max())


def test_the_real_av1_v30_dataset_local_and_over_http_reads_as_one(read_as_packets: list[str]) -> None:
    """The real AV1 v3.0 set (several episodes a video file) as a union of itself, local (episode 10) and served over
    HTTP (episode 11; both in videos' file-002), decoded on CPU: every sample once, its rows the parquet's, its
    frame an independent full PyAV decode's at from_timestamp * fps + frame_index; the server is asked only for the
    HTTP dataset's files, and only its video is read packet by packet (the local one decoded from disk)."""
    root = shared_dataset("cr5_v30_av1")
    camera = "observation.images.top"
    with serve_folder(root.parent) as server:
        union = concat_datasets(
            [open_dataset(root, episodes=[10]), open_dataset(f"{server.url}/{root.name}", episodes=[11])],
            timestamp_sources=["frame_index"] * 2,
        )
        it = DALILeRobotIterator(
            union, batch_size=16, shuffle=True, seed=5, device="cpu", decode="cpu", num_workers=0, cache_gb=0.0,
            drop_last=False, return_uint8=True,
        )  # fmt: skip
        samples = [{k: v[i] for k, v in batch.items()} for batch in it for i in range(len(batch["index"]))]
        it.close()
        records = server.records
    assert records and all(r.path.startswith(f"/{root.name}/") and r.status < 400 for r in records), records
    assert read_as_packets and all(path.startswith(server.url) for path in read_as_packets), read_as_packets
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    rows = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pylist()
    keys = sorted((int(s["dataset_index"]), int(s["index"])) for s in samples)
    spans = [(episodes[ep]["dataset_from_index"], episodes[ep]["dataset_to_index"]) for ep in (10, 11)]
    every = [(d, i) for d, (start, stop) in enumerate(spans) for i in range(start, stop)]
    assert keys == every and len(keys) == 198 + 255
    decoded = [frame for _, frame in sorted(reference_frames(root / f"videos/{camera}/chunk-000/file-002.mp4").items())]
    for s in samples:
        row = rows[int(s["index"])]
        ep, f = row["episode_index"], row["frame_index"]
        assert (int(s["dataset_index"]), int(s["episode_index"]), int(s["frame_index"])) == (ep - 10, ep, f)
        assert float(s["timestamp"]) == pytest.approx(row["timestamp"]) and int(s["task_index"]) == ep - 10
        for key in ("observation.state", "action"):
            np.testing.assert_array_equal(s[key].numpy(), np.asarray(row[key], np.float32))
        start = round(episodes[ep][f"videos/{camera}/from_timestamp"] * 10)
        np.testing.assert_array_equal(s[camera].permute(1, 2, 0).numpy(), decoded[start + f])


@pytest.mark.parametrize("local_first", [True, False], ids=["local_first", "remote_first"])
def test_a_remote_file_of_a_mixed_union_replaced_by_one_of_its_size_is_named_changed(
    make_ds, tmp_path: Path, local_first: bool
) -> None:
    """In a union of a local and an HTTP dataset, a remote video file replaced on the server by another of its size
    once the iterator indexed it is named changed on the server (its stamped ETag sent as If-Match: HTTP 412)."""
    from tests.test_http_remote import _rewrite_same_size

    local, remote = _datasets(make_ds, codec="h264")
    served = tmp_path / "served"
    shutil.copytree(remote, served / "dataset")
    target = sorted((served / "dataset").glob("videos/**/*.mp4"))[-1]
    with serve_folder(served) as server:
        given = [str(local), f"{server.url}/dataset"]
        union = concat_datasets(given if local_first else given[::-1])
        it = DALILeRobotIterator(
            union, batch_size=4, shuffle=False, device="cpu", drop_last=False, num_workers=0, cache_gb=0.0,
            decode="cpu",
        )  # fmt: skip
        _rewrite_same_size(target)  # (after the iterator indexed it: before any batch, which reads ahead)
        read: list[tuple[int, int]] = []
        changed = (
            r"episode_000001.mp4 changed on the server while it was read \(etag:\S+ when opened, etag:\S+ now: HTTP 412"
        )
        with pytest.raises(DatasetError, match=changed):
            for batch in it:
                read += zip(batch["dataset_index"].tolist(), batch["episode_index"].tolist(), strict=True)
        it.close()
    assert (int(local_first), 1) not in read  # (no sample of the file's episode, the remote dataset's 1, served)


def test_a_union_of_local_folders_is_read_as_local(make_ds, tmp_path: Path) -> None:
    """Each dataset is opened in a thread of its own, and fsspec keeps a LocalFileSystem per thread: a union of local
    folders routed its files through MemberFileSystems (its clients differ) and so was read as a remote one: a
    prefetch cache and its thread, no file-format store, 16 data files open where a local dataset keeps 128."""
    from fsspec.implementations.local import LocalFileSystem

    union = concat_datasets(_datasets(make_ds, codec="h264"))
    assert union.location.is_local and isinstance(union.location.fs, LocalFileSystem)
    assert union._parquet.max_open == 128
    it = DALILeRobotIterator(
        union, batch_size=4, shuffle=False, device="cpu", num_workers=0, decode="cpu", cache_dir=tmp_path / "cache"
    )
    assert it._prefetcher is None and it._format_store is not None and not (tmp_path / "cache").exists()
    assert sum(len(batch["index"]) for batch in it) == 28
    it.close()


def test_a_mixed_unions_local_files_are_surveyed_as_a_local_datasets(make_ds, tmp_path_factory, monkeypatch) -> None:
    """A union of a local and an HTTP dataset surveyed its local files as remote ones: each one's packet index
    loaded or built (~0.75 ms a file where the file-format store answers 400 in 3 ms), and held to the remote bound
    on files (2,000, not 100,000). Its local files' headers are kept in the file-format store now: a second build
    reads none of them, and every local file is read whatever the remote bound."""
    from lerobot_dali import camera_codecs

    monkeypatch.setattr(camera_codecs, "CHECKED_FILES_REMOTE", 2)  # (the remote dataset's 2 files; the union has 4)
    read: list[str] = []
    header, index = camera_codecs.read_file_format, camera_codecs.load_episode_packet_index
    monkeypatch.setattr(camera_codecs, "read_file_format", lambda r, path: read.append(path) or header(r, path))
    monkeypatch.setattr(
        camera_codecs,
        "load_episode_packet_index",
        lambda r, pos, camera, **k: read.append(r.video(pos, camera).path) or index(r, pos, camera, **k),
    )
    local, remote = _datasets(make_ds, codec="h264")
    local_files = {str(p) for p in local.glob("videos/**/*.mp4")}
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([local, f"{server.url}/{remote.parent.name}/{remote.name}"])
        for build in range(2):
            read.clear()
            it = DALILeRobotIterator(union, batch_size=4, device="cpu", num_workers=0, cache_gb=0.0, decode="cpu")
            it.close()
            assert {p for p in read if p in local_files} == (local_files if build == 0 else set()), build
            assert read and all(p in local_files or p.startswith(server.url) for p in read)


def test_a_mixed_unions_remote_files_past_their_bound_leave_its_local_ones_surveyed(
    make_ds, tmp_path_factory, monkeypatch
) -> None:
    """A union of a local and an HTTP dataset whose remote files passed the remote bound on files surveyed each
    dataset's first file alone, its local files too (within their own bound, 100,000): a local file of another frame
    size was not found at the build. Each kind is held to its own bound now: every local file is surveyed, the remote
    dataset's first alone."""
    from lerobot_dali import camera_codecs

    monkeypatch.setattr(camera_codecs, "CHECKED_FILES_REMOTE", 1)  # (the remote dataset has 2 files)
    local, remote = _datasets(make_ds, codec="h264")
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        url = f"{server.url}/{remote.parent.name}/{remote.name}"
        for given in ([local, url], [url, local]):
            union = concat_datasets(given)
            surveyed = {
                union.video(p, "observation.images.cam0").path
                for p in camera_codecs.surveyed_positions(union, "observation.images.cam0")
            }
            local_files = {str(p) for p in local.glob("videos/**/*.mp4")}
            assert len(local_files) == 2 and local_files <= surveyed, (surveyed, given)
            assert len(surveyed - local_files) == 1 and all(p.startswith(url) for p in surveyed - local_files)


def test_a_mixed_unions_check_keeps_its_local_datasets_decode_verdicts(make_ds, tmp_path_factory) -> None:
    """check_dataset kept no decode verdict for a union of a local and an HTTP dataset (read as remote): a second
    check decoded the local dataset's 16 frames again. Kept now: only the remote dataset's 12 are decoded again."""
    local, remote = _datasets(make_ds, codec="h264")
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([local, f"{server.url}/{remote.parent.name}/{remote.name}"])
        first, again = (check_dataset(union, decode=True, workers=0) for _ in range(2))
    assert (first.frames_decoded, first.frames_verified_before, first.problem_count) == (28, 0, 0)
    assert (again.frames_decoded, again.frames_verified_before, again.problem_count) == (12, 16, 0)


@pytest.mark.parametrize("cache_gb", [0.0, 8.0])
def test_a_union_holding_a_mixed_union_reads_each_file_through_its_own_dataset(
    make_ds, tmp_path_factory, read_as_packets: list[str], cache_gb: float
) -> None:
    """A union of a local dataset and a union of a local and an HTTP one routed each path by its datasets' roots, the
    inner union's being its first dataset's alone: the HTTP dataset's files went to the first dataset of all, a local
    folder (MissingDataFileError for its videos; through the prefetch cache, its parquet opened as a local path), and
    the inner local dataset's videos were read packet by packet as remote ones. Each goes to its own dataset now."""
    local, remote = _datasets(make_ds, codec="h264")
    extra = make_ds(episodes=2, frames_per_episode=[6, 2], cameras=1, codec="h264", fps=FPS, gop=4, seed=2)
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        url = f"{server.url}/{remote.parent.name}/{remote.name}"
        union = concat_datasets([extra, concat_datasets([local, url])])
        it = DALILeRobotIterator(
            union, batch_size=4, shuffle=False, device="cpu", drop_last=False, num_workers=0, cache_gb=cache_gb,
            prefetch=6, decode="cpu",
        )  # fmt: skip
        samples = [{k: v[i] for k, v in batch.items()} for batch in it for i in range(len(batch["index"]))]
        it.close()
        assert not [r.path for r in server.records if local.parent.name in r.path]
    assert read_as_packets and all(path.startswith(url) for path in read_as_packets), read_as_packets
    own_rows = [[_parquet_rows(extra)], [_parquet_rows(local), _parquet_rows(remote)]]  # (the inner union's: 2)
    keys = Counter((int(s["dataset_index"]), int(s["episode_index"]), int(s["frame_index"])) for s in samples)
    inner = Counter((1, ep, f) for spec in SPECS for ep, n in enumerate(spec[0]) for f in range(n))
    assert keys == Counter((0, ep, f) for ep, n in enumerate([6, 2]) for f in range(n)) + inner
    for s in samples:
        key, state = (int(s["episode_index"]), int(s["frame_index"])), s["observation.state"].numpy()
        candidates = [rows[key]["observation.state"] for rows in own_rows[int(s["dataset_index"])] if key in rows]
        assert any(np.array_equal(state, np.asarray(c, np.float32)) for c in candidates), (key, state)


def test_a_mixed_unions_unattributed_decode_failure_advises_the_cache_only_for_remote_files(
    make_ds, tmp_path_factory, monkeypatch
) -> None:
    """DALI failing clips that no re-decode can blame alone: the error told a union of a local and an HTTP dataset to
    delete the prefetch cache (location.is_local, False for the union) even where every file it named was local,
    which the cache never holds. The advice is now that of the datasets holding the files named."""
    from lerobot_dali import decode_errors
    from lerobot_dali.batch_source import BatchSource

    def failing(*args, **kwargs):
        raise RuntimeError("Critical error in pipeline:\nout of memory")

    local, remote = _datasets(make_ds, codec="vp9")
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        union = concat_datasets([local, f"{server.url}/{remote.parent.name}/{remote.name}"])
        it = DALILeRobotIterator(union, batch_size=4, shuffle=False, device="cpu", num_workers=0, cache_gb=0.0)
        try:
            next(iter(it))  # (the pipeline, and the spec its source is made from)
            monkeypatch.setattr(decode_errors, "decode_clip_batch", failing)
            source, n_local = BatchSource(it._spec), sum(SPECS[0][0])  # (unshuffled: the local dataset's frames first)
            told = {
                name: decode_errors.locate_clip_failure(source, 0, start, stop, device_id=None, cause=RuntimeError("x"))
                for name, (start, stop) in {
                    "local": (0, n_local), "remote": (n_local, len(EVERY_FRAME)), "both": (n_local - 6, n_local + 6),
                }.items()
            }  # fmt: skip
        finally:
            it.close()
    named = {name: re.findall(r"'([^']+\.mp4)'", str(error)) for name, error in told.items()}
    assert named["local"] and all(p.startswith(str(local)) for p in named["local"]), named
    assert named["remote"] and all(p.startswith(server.url) for p in named["remote"]), named
    assert {p.startswith(server.url) for p in named["both"]} == {False, True}, named
    assert {name: "prefetch cache" in str(error) for name, error in told.items()} == {
        "local": False, "remote": True, "both": True
    }  # fmt: skip


def test_a_nested_unions_datasets_each_have_their_files_surveyed(make_ds) -> None:
    """A union within a union counted its datasets as one when the iterator's build surveyed each camera file (codec,
    size; a remote one's stamp asked then): its second dataset's files, numbered (chunk, file) as its first's, were
    taken for them and never surveyed (2 of 5 files here), so one replaced on a server before its first batch was
    stamped and read as the new file (tests/test_http_remote.py). Each dataset's files are surveyed now."""
    from lerobot_dali.camera_codecs import file_positions

    extra = make_ds(episodes=2, frames_per_episode=[6, 2], cameras=1, codec="vp9", fps=FPS, gop=4, seed=2)
    paths = [extra, *_datasets(make_ds)]
    leaves = [open_dataset(p) for p in paths]
    union = concat_datasets([paths[0], concat_datasets(paths[1:])])
    starts = np.cumsum([0, *(leaf.num_episodes for leaf in leaves)])
    camera = "observation.images.cam0"
    expected = [int(s) + p for leaf, s in zip(leaves, starts, strict=False) for p in file_positions(leaf, camera)]
    assert union.first_episodes() == [0, 2, 5]
    assert file_positions(union, camera) == expected and len(expected) == 1 + 2 + 2
    files = {union.video(pos, camera).path for pos in expected}
    assert files == {leaf.video(pos, camera).path for leaf in leaves for pos in range(leaf.num_episodes)}


def test_a_path_is_held_by_the_dataset_of_the_longest_root_it_is_under() -> None:
    """A dataset's folder inside another's: its files are its own, not the outer dataset's; a root is a folder, not a
    prefix of names ('/data/a' holds nothing of '/data/ab'); a path under none is the first dataset's."""
    from lerobot_dali.dataset_union import MemberRoots

    roots = MemberRoots(["/data/a", "/data/a/nested/", "/data/ab"])
    paths = [
        "/data/a/data/x.parquet",
        "/data/a/nested/data/x.parquet",
        "/data/ab/x.parquet",
        "/data/abc/x",
        "/elsewhere",
    ]
    assert [roots.of(path) for path in paths] == [0, 1, 2, 0, 0]
    assert MemberRoots(["/d/x", "/d/y"], owners=[3, 3]).of("/d/y/f") == 3  # (a union's datasets: its own position)


def test_where_the_episode_before_each_in_its_video_file_ends_is_asked_of_its_own_dataset(make_ds) -> None:
    """A failed frame lookup's advice on a late from_timestamp asks where the episode before it in its file ends by its
    rows (``previous_end_s``): a union asks the episode's own dataset. The v3.0 dataset's episode 1 follows episode 0
    (5 rows at 10 fps: 0.5 s) in file 0; its episode 2 starts file 1; the v2.1 dataset's episodes have a file each."""
    union = concat_datasets(_datasets(make_ds))
    assert [union.previous_end_s(pos, "observation.images.cam0") for pos in range(5)] == [None, 0.5, None, None, None]
