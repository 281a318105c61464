"""DALILeRobotMixture in CPU mode: per-dataset windows and frames, fixed shares, epochs, coverage, ranks, resume.

Two generated datasets of other fps, codecs (VP9 through DALI's CPU decoder, H.264 by the workers), lengths and
task assignments; expected values come from the generator's formulas and each frame's marker.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import itertools
import logging
import multiprocessing
import os
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali import DALILeRobotMixture, open_dataset
from lerobot_dali import iterator as iterator_module
from lerobot_dali.augment_config import AugmentConfig, Normalize
from lerobot_dali.dataset_union import concat_datasets
from lerobot_dali.errors import (
    DatasetError,
    DeltaTimestampsError,
    FrameTimestampError,
    IteratorClosedError,
    MissingDataFileError,
    ResumeStateError,
    SchemaMismatchError,
    ShardingError,
)
from lerobot_dali.frame_marker import read_full_marker
from lerobot_dali.generate import expected_action, expected_state, expected_task_index, task_name
from lerobot_dali.mixture import batch_shares
from lerobot_dali.sample_order import RankBalance
from tests.conftest import shared_dataset
from tests.test_image_cameras import _to_mode
from tests.test_iterator import SecondSignal

#: Per dataset: lengths, fps, codec, task seed.
SPECS = (([5, 7, 4], 10, "vp9", 0), ([20, 9], 20, "h264", 1))
DELTAS = {"action": [0.0, 0.1], "observation.images.cam0": [-0.1, 0.0]}


def _datasets(make_ds, second: dict | None = None) -> list[Path]:
    """The two datasets; ``second``: other arguments for the second."""
    return [
        make_ds(**{"episodes": len(lengths), "frames_per_episode": lengths, "cameras": 1 + i, "codec": codec,
                   "fps": fps, "gop": 4, "seed": seed, **(second or {} if i else {})})
        for i, (lengths, fps, codec, seed) in enumerate(SPECS)
    ]  # fmt: skip


def _keys(batch: dict) -> list[tuple[int, int, int]]:
    columns = (batch["dataset_index"], batch["episode_index"], batch["frame_index"])
    return list(zip(*(c.tolist() for c in columns), strict=True))


def _marker(frame: torch.Tensor) -> tuple[int, int, int]:
    return tuple(read_full_marker((frame.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)))


def test_batch_shares_follow_weights_with_at_least_one_each() -> None:
    assert batch_shares([16, 29], 4) == (1, 3)
    assert batch_shares([1, 1, 1], 8) == (3, 3, 2)
    assert batch_shares([1000, 1, 1], 8) == (6, 1, 1)  # the minimum of one takes from the largest
    assert batch_shares([0.7, 0.3], 64) == (45, 19)
    assert batch_shares([3], 8) == (8,)  # (one dataset: the whole batch)
    with pytest.raises(ValueError, match="positive"):
        batch_shares([1, 0], 8)
    with pytest.raises(ValueError, match=r"one per dataset, got \[\]"):
        batch_shares([], 8)
    with pytest.raises(ValueError, match="cannot be split"):
        batch_shares([1, 1, 1], 2)


@pytest.mark.parametrize(
    ("weights", "total", "shares"),
    [([1, 3], 6, (2, 4)), ([3, 7], 5, (2, 3)), ([7, 5], 30, (18, 12)), ([1, 2, 4], 14, (2, 4, 8))],
)
def test_weights_in_one_ratio_split_a_batch_alike_however_scaled(weights: list, total: int, shares: tuple) -> None:
    """A share's floor and largest remainder went by the last bit of each weight: ``[0.1, 0.1 * 3]`` split 6 as
    1 + 5, ``[1, 3]`` as 2 + 4 (606 of 80,000 scripted weight lists, scaled four ways, split otherwise)."""
    for scale in (1, 0.1, 1 / 3, 7, 1 / sum(weights), 1e6, 1e-8, 1e-9, 1 / 3e7):  # (tiny: inverse frame counts)
        assert batch_shares([w * scale for w in weights], total) == shares, scale
    assert batch_shares([1e-300, 1], 4) == (1, 3)  # (no ratio of small integers: as given, at least 1 each)


def test_many_weights_of_large_denominators_split_a_batch() -> None:
    """80 datasets weighted by arbitrary floats, each close to a fraction of denominator near 10**6: their lowest
    terms overflowed a float (OverflowError for 163 of 200 scripted lists of 80); each share is its weight's part."""
    weights = np.random.default_rng(0).random(80).tolist()
    shares = batch_shares(weights, 1024)
    exact = np.asarray(weights) / sum(weights) * 1024
    assert sum(shares) == 1024
    assert np.all(np.abs(np.asarray(shares) - exact) < 1)


def test_a_state_saved_with_weights_scaled_otherwise_resumes(make_ds) -> None:
    """Weights ``[3, 7]`` split a batch of 5 as 2 + 3, ``[0.1 * 3, 0.1 * 7]`` as 1 + 4, whose anchor is the other
    dataset: a state saved with the one was refused with the other, though the run was the same."""
    paths = _datasets(make_ds)
    mixtures = [
        DALILeRobotMixture(paths, batch_size=5, weights=weights, seed=3, device="cpu", num_workers=0)
        for weights in ([3, 7], [0.1 * 3, 0.1 * 7])
    ]
    saved, resumed = mixtures
    next(iter(saved))
    state = saved.state_dict()
    assert (resumed.batch_shares, resumed.anchor) == (saved.batch_shares, saved.anchor) == ((2, 3), 1)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    for mix in mixtures:
        mix.close()


def test_a_share_the_minimum_of_one_raises_past_its_weight_is_warned_of(make_ds, caplog) -> None:
    """``--weights 1 100`` at ``--batch-size 4`` read the first dataset as 1 sample of 4 (25%, not 1%), said only by
    the INFO line of shares; now a warning names it and the batch size that holds it to its weight. Shares that
    round to their weights (16 and 29 frames in 4, the default weights: 1 and 3) are not warned of."""
    paths = _datasets(make_ds)
    for weights, batch, warned in (([1, 100], 4, True), (None, 4, False), ([1, 3], 4, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lerobot_dali.mixture"):
            DALILeRobotMixture(paths, batch_size=batch, weights=weights, device="cpu", num_workers=0).close()
        said = [r.getMessage() for r in caplog.records if "at least 1 sample a batch" in r.getMessage()]
        assert said == (
            [
                f"the mixture's weights (its datasets' frames where none are given) give {paths[0]} 0.0396 of each "
                "batch of 4 (0.99%), but every dataset has at least 1 sample a batch: it gets 1 (25%); a batch_size "
                "of 101 or more holds it to its weight"
            ]
            if warned
            else []
        ), (weights, batch)


def test_a_long_build_of_the_datasets_pipelines_is_said_once_for_all(make_ds, caplog, monkeypatch) -> None:
    """The datasets' pipelines build side by side: each said its own start and end (12 lines for 6 datasets), now
    one pair for all, their worker processes summed."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(iterator_module, "BUILD_PROGRESS_DELAY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        mix = DALILeRobotMixture(_datasets(make_ds), batch_size=4, device="cpu", num_workers=2)
        try:
            next(iter(mix))
        finally:
            mix.close()
    said = [r.getMessage() for r in caplog.records if "building the DALI pipeline" in r.getMessage()]
    what = "lerobot-dali: starting 2 worker processes and building the DALI pipelines of 2 datasets"
    assert len(said) == 2 and said[0] == f"{what}...", said
    assert re.fullmatch(rf"{re.escape(what)}: done in \d+\.\d s", said[1]), said


def test_every_sample_follows_its_own_datasets_fps_rows_frames_and_tasks(make_ds, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.mixture"):
        mix = DALILeRobotMixture(
            _datasets(make_ds), batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0
        )
    assert "observation.images.cam1" in caplog.text and "left out" in caplog.text  # only the second has it
    assert mix.batch_shares == (1, 3) and mix.anchor == 0  # 16 and 29 frames: 16 batches read the first once
    assert len(mix) == 16 and [r.value for r in mix.datasets[1].routes.values()] == ["cpu_fallback"]
    seen: Counter[tuple[int, int, int]] = Counter()
    order: list[tuple[int, int, int]] = []
    for batch in (batch for _ in range(2) for batch in mix):  # two epochs
        order.extend(_keys(batch))
        assert batch["dataset_index"].tolist() == [0, 1, 1, 1]
        assert "observation.images.cam1" not in batch
        for i, (d, ep, f) in enumerate(_keys(batch)):
            seen[d, ep, f] += 1
            lengths, fps, _, seed = SPECS[d]
            n = lengths[ep]
            assert int(batch["index"][i]) == sum(lengths[:ep]) + f
            assert float(batch["timestamp"][i]) == pytest.approx(f / fps)
            np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(ep, f))
            task = expected_task_index(ep, seed=seed)
            assert int(batch["task_index"][i]) == task and batch["task"][i] == task_name(task)
            for key, check in (("action", None), ("observation.images.cam0", _marker)):
                query = [f + round(delta * fps) for delta in DELTAS[key]]  # the same seconds, other frames
                rows = [min(max(q, 0), n - 1) for q in query]
                if check is None:
                    np.testing.assert_array_equal(batch[key][i].numpy(), expected_action(ep, np.array(rows)))
                else:
                    assert [check(frame) for frame in batch[key][i]] == [(ep, r, 0) for r in rows]
                assert batch[f"{key}_is_pad"][i].tolist() == [not 0 <= q < n for q in query]
    assert mix.epoch == 2
    first = [(0, ep, f) for ep, n in enumerate(SPECS[0][0]) for f in range(n)]
    assert [k for k in order if k[0] == 0] == first * 2
    # The second dataset's 48 samples an epoch: its 9-batch epochs (27 of 29 frames, in order) run on across the
    # mixture's epochs (the second starts at its 22nd sample), so its samples come equally often over time.
    second = [(1, ep, f) for ep, n in enumerate(SPECS[1][0]) for f in range(n)]
    assert [k for k in order if k[0] == 1] == (second[:27] * 4)[:96]
    mix.close()
    mix = DALILeRobotMixture(_datasets(make_ds), batch_size=4, shuffle=False, device="cpu", num_workers=0)
    mix.set_epoch(1)  # reached by a jump: the same
    assert [k for batch in mix for k in _keys(batch)] == order[64:]
    mix.close()


def test_a_mixture_resumed_with_its_datasets_in_another_order_is_refused(make_ds, tmp_path_factory) -> None:
    """A mixture's state holds each dataset's stream state, known by its episodes' indices and lengths: two datasets
    of one shape (a local and an HTTP one) resumed listed the other way round went on without a word, each dataset at
    the other's position. Refused now, naming the order, whether or not one of them was moved too (the state held
    their names before: b read from disk and a from the server, 16 of the 16 samples after the resume were the
    other dataset's); the same datasets in the saved order, one of them moved to the server, resume exactly where
    they stood."""
    from tests.http_server import serve_folder

    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=10, gop=4, seed=seed)
        for seed in (0, 1)
    )
    with serve_folder(tmp_path_factory.getbasetemp()) as server:
        url_a, url_b = (f"{server.url}/{p.parent.name}/{p.name}" for p in (a, b))

        def mixture(given: list) -> DALILeRobotMixture:
            options = {"batch_size": 4, "seed": 3, "device": "cpu", "num_workers": 0, "decode": "cpu", "cache_gb": 0.0}
            return DALILeRobotMixture(given, **options)

        mix = mixture([a, url_b])
        whole = [k for batch in mix for k in _keys(batch)]
        mix.close()
        mix = mixture([a, url_b])
        batches = iter(mix)
        head = _keys(next(batches))
        state = mix.state_dict()
        mix.close()
        for swapped in ([url_b, a], [b, url_a]):  # (the second: b read from disk now, a from the server)
            mix = mixture(swapped)
            with pytest.raises(ResumeStateError, match="datasets in another order"):
                mix.load_state_dict(state)
            mix.close()
        mix = mixture([url_a, url_b])  # (the local one served now: same datasets, same order)
        mix.load_state_dict(state)
        rest = [k for batch in mix for k in _keys(batch)]
        mix.close()
    assert head + rest == whole and len(whole) == 20


@pytest.mark.parametrize("now", ["abc", "cab"])
def test_a_mixture_resumed_with_a_dataset_added_is_refused_saying_so(make_ds, now: str) -> None:
    """A mixture's state of 2 datasets resumed over 3 was refused as 'not the state of a mixture of 3 datasets',
    as if it were no mixture's state at all, naming none of them. Now it says the count saved over and names the
    datasets now ([a, b] resumed as [a, b, c]), or the one added that moved the others ([c, a, b])."""
    a, b = (
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=10, gop=4, seed=seed)
        for seed in (0, 1)
    )
    c = make_ds(episodes=2, frames_per_episode=[5, 3], cameras=1, codec="h264", fps=10, gop=4)
    options = {"batch_size": 4, "seed": 3, "device": "cpu", "num_workers": 0, "decode": "cpu"}
    mix = DALILeRobotMixture([a, b], **options)
    next(iter(mix))
    state = mix.state_dict()
    mix.close()
    mix = DALILeRobotMixture([{"a": a, "b": b, "c": c}[n] for n in now], **options)
    with pytest.raises(ResumeStateError) as refused:
        mix.load_state_dict(state)
    mix.close()
    said = str(refused.value)
    if now == "abc":
        assert said.startswith(f"this state was saved over a mixture of 2 datasets, not of these 3 ({a}, {b}, {c})")
    else:
        assert said.startswith("this stream state was saved over other datasets than the mixture: ")
        assert f"{c} (dataset 0) is not one it was saved over" in said and "saved over 2 datasets, not 3" in said


def _run(mix: DALILeRobotMixture, epochs: int, taken: list) -> None:
    for _ in range(epochs):
        for batch in mix:
            taken.extend(_keys(batch))


def test_shuffled_epochs_cover_once_and_resume_exactly_with_workers(make_ds) -> None:
    paths = _datasets(make_ds)

    def mixture() -> DALILeRobotMixture:
        return DALILeRobotMixture(paths, batch_size=4, seed=3, delta_timestamps=DELTAS, device="cpu", num_workers=2)

    builds = []
    build = iterator_module.build_pipeline
    with mock.patch.object(
        iterator_module,
        "build_pipeline",
        lambda *a, **k: builds.append(threading.current_thread().name) or build(*a, **k),
    ):
        mix = mixture()
        full: list[tuple[int, int, int]] = []
        _run(mix, 2, full)
        mix.close()
    # One pipeline per dataset, started side by side; the second's runs on across the mixture's epochs.
    assert len(builds) == 2 and all(name.startswith("lerobot-dali-at-once") for name in builds)
    assert len(full) == 2 * 16 * 4
    for epoch in (full[:64], full[64:]):
        first = [k for k in epoch if k[0] == 0]
        assert sorted(first) == sorted((0, ep, f) for ep, n in enumerate(SPECS[0][0]) for f in range(n))
    # The second dataset's epochs of 27 (9 batches of 3, of 29 frames) follow each other across the mixture's
    # epochs: its 96 samples are its epochs 0, 1 and 2 whole and 15 of epoch 3, each frame at most once in each.
    second = [k for k in full if k[0] == 1]
    chunks = [second[i : i + 27] for i in range(0, 96, 27)]
    assert [len(set(chunk)) for chunk in chunks] == [27, 27, 27, 15]
    assert len({tuple(chunk) for chunk in chunks[:3]}) == 3  # each of its epochs shuffles afresh
    assert full[:64] != full[64:]

    mix = mixture()
    resumed: list[tuple[int, int, int]] = []
    batches = iter(mix)
    for _ in range(10):  # past the second dataset's first epoch (9 batches)
        resumed.extend(_keys(next(batches)))
    state = mix.state_dict()
    assert state["datasets"][0]["samples_consumed"] == 10
    assert state["datasets"][1]["epoch"] == 1 and state["datasets"][1]["samples_consumed"] == 3
    mix.close()
    mix = mixture()
    mix.load_state_dict(state)
    assert len(mix) == 6
    _run(mix, 2, resumed)
    assert resumed == full
    mix.close()

    mix = mixture()
    mix.set_epoch(1)  # a jump: the same epoch as after epoch 0
    jumped: list[tuple[int, int, int]] = []
    _run(mix, 1, jumped)
    assert jumped == full[64:]
    assert mix.datasets[1].epoch == 3
    mix.set_epoch(1)  # back to the epoch just read: the second dataset goes back to where epoch 1 starts it
    again: list[tuple[int, int, int]] = []
    _run(mix, 1, again)
    assert again == full[64:]
    mix.close()


def test_each_dataset_resumes_its_pool_at_its_saved_walk(make_ds) -> None:
    """A mixture's state holds each dataset's pool walk at its position; a resume starts each pool there and
    reads what the uninterrupted run read."""
    paths = _datasets(make_ds)
    kwargs = dict(batch_size=4, seed=3, delta_timestamps=DELTAS, device="cpu", num_workers=0, episode_pool_size=1)
    mix = DALILeRobotMixture(paths, **kwargs)
    batches = iter(mix)
    for _ in range(8):
        next(batches)
    state = mix.state_dict()
    rest = [key for batch in batches for key in _keys(batch)]
    mix.close()
    walks = [part["walk"] for part in state["datasets"]]
    assert [(w["epoch"], w["samples_consumed"]) for w in walks] == [
        (part["epoch"], part["samples_consumed"]) for part in state["datasets"]
    ]
    assert all(w["emitted"] > 0 for w in walks)  # (pool 1: past each dataset's first episode)
    mix = DALILeRobotMixture(paths, **kwargs)
    mix.load_state_dict(state)
    for part, walk in zip(mix.datasets, walks, strict=True):
        simulator = part._stream.order._plan(walk["epoch"]).simulator
        assert walk["emitted"] in simulator._checkpoint_positions  # (adopted: the first batch draws on from it)
    assert [key for batch in mix for key in _keys(batch)] == rest
    mix.close()


def test_a_state_saved_with_the_former_epoch_numbers_resumes_where_it_stood(make_ds) -> None:
    """States saved before the datasets' epochs ran on across mixture epochs number a non-anchor dataset's epochs
    ``e * 2**32 + k`` in mixture epoch ``e``: it continues where it stood, its epochs numbered on from there (it
    joined the schedule at the next mixture epoch, which moved it)."""
    paths = _datasets(make_ds)
    mix = DALILeRobotMixture(paths, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    _run(mix, 1, [])
    batches = iter(mix)
    for _ in range(5):  # of epoch 1
        next(batches)
    state = mix.state_dict()
    assert mix.epoch == 1 and state["datasets"][1]["epoch"] == 2  # its epochs of 9 batches: 21 = 9 + 9 + 3
    rest = [k for _ in range(2) for batch in mix for k in _keys(batch)]  # the rest of epoch 1, then epoch 2
    mix.close()
    legacy = {**state, "datasets": [state["datasets"][0], {**state["datasets"][1], "epoch": 2**32 + 1}]}
    mix = DALILeRobotMixture(paths, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    mix.load_state_dict(legacy)
    batch = next(iter(mix))
    assert mix.datasets[1].state_dict()["epoch"] == 2**32 + 1  # continued, not moved
    assert _keys(batch) + [k for b in mix for k in _keys(b)] + [k for b in mix for k in _keys(b)] == rest
    assert mix.datasets[1].epoch == 2**32 + 4  # 1 batch of 9 in, then 11 + 16 batches: 8 + 9 + 9 + 1
    mix.close()


@pytest.mark.parametrize(("saved_after", "passes", "batches"), [(5, 3, (5, 5 + 8 + 8)), (None, 2, (16, 8 + 8))])
def test_a_resume_at_other_shares_reads_each_epoch_of_the_other_dataset_once(
    make_ds, caplog, saved_after: int | None, passes: int, batches: tuple[int, int]
) -> None:
    """Saved at shares (1, 5) of 6, resumed at (2, 4): the second dataset continues where it stood, and the next
    mixture epochs start it from there. They started it where a run at (2, 4) from the beginning would stand,
    12 samples back into its epoch 1, which it read twice. Saved 5 batches in, or once the first epoch's pass
    ended: the anchor at epoch 1's start, the second dataset 16 batches of 5 in (sample 5 of its epoch 3), where
    a run at (2, 4) from the beginning stands 8 batches of 4 in (sample 4 of its epoch 1); the new pass started it
    there, reading its epochs 1 and 2 again."""
    paths = _datasets(make_ds)

    def mixture(weights: list[float]) -> DALILeRobotMixture:
        return DALILeRobotMixture(paths, batch_size=6, weights=weights, seed=3, device="cpu", num_workers=0)

    def second(mix: DALILeRobotMixture, batch: dict) -> list[tuple[int, tuple[int, int, int]]]:
        return [(mix.datasets[1].epoch, k) for k in _keys(batch) if k[0] == 1]

    mix = mixture([1, 5])
    assert (mix.batch_shares, mix.anchor) == ((1, 5), 0)
    taken = []
    for batch in itertools.islice(iter(mix), saved_after):
        taken.extend(second(mix, batch))
    state = mix.state_dict()
    mix.close()
    mix = mixture([2, 4])
    assert mix.batch_shares == (2, 4)
    mix.load_state_dict(state)
    assert "saved with batch shares [1, 5] at shares [2, 4]" in caplog.text
    for _ in range(passes):
        taken.extend(pair for batch in mix for pair in second(mix, batch))
    mix.close()
    epochs = [epoch for epoch, _ in taken]
    assert epochs == sorted(epochs)  # its epochs in turn
    for epoch in range(max(epochs)):  # (the last one is under way)
        keys = [key for e, key in taken if e == epoch]
        assert len(keys) == len(set(keys)) >= 28 - 4, (
            epoch,
            len(keys),
            len(set(keys)),
        )  # (29 frames, at most 1 batch dropped)
    assert len(taken) == batches[0] * 5 + batches[1] * 4  # at 5; at 4, (16 - 5) // 2 left of epoch 0, then 8 a time


def test_a_resume_on_fewer_ranks_reads_the_rest_of_the_anchor_once(make_ds) -> None:
    """Saved by 2 ranks 5 batches into epoch 0, resumed on 1: the anchor's frames the old ranks had not read, each
    once, then whole epochs; a mixture that had run epochs before loading gives what a fresh one gives."""
    paths = _datasets(make_ds)
    kwargs = dict(batch_size=4, seed=5, device="cpu", num_workers=0)
    states, old = [], []
    for rank in (0, 1):
        mix = DALILeRobotMixture(paths, rank=rank, world_size=2, **kwargs)
        batches = iter(mix)
        old.extend(k for _ in range(5) for k in _keys(next(batches)))
        states.append(mix.state_dict())
        mix.close()
    runs = []
    for warm in (False, True):
        mix = DALILeRobotMixture(paths, **kwargs)
        if warm:
            _run(mix, 2, [])  # (its schedule's starts so far follow the orders before the load)
        mix.load_state_dict(states[0])
        assert len(mix) == 16 - 10
        taken: list[tuple[int, int, int]] = []
        _run(mix, 3, taken)
        runs.append(taken)
        mix.close()
    assert runs[0] == runs[1]
    anchor = [k for k in old if k[0] == 0] + [k for k in runs[0][: 6 * 4] if k[0] == 0]
    assert sorted(anchor) == sorted((0, ep, f) for ep, n in enumerate(SPECS[0][0]) for f in range(n))
    assert len(runs[0]) == (6 + 16 + 16) * 4


def test_ranks_split_the_anchor_disjointly_and_agree_on_length(make_ds) -> None:
    paths = _datasets(make_ds)
    per_rank = []
    for rank in (0, 1):
        mix = DALILeRobotMixture(paths, batch_size=4, rank=rank, world_size=2, device="cpu", num_workers=0)
        taken: list[tuple[int, int, int]] = []
        _run(mix, 1, taken)
        per_rank.append(taken)
        mix.close()
    assert len(per_rank[0]) == len(per_rank[1]) > 0
    anchors = [{k for k in taken if k[0] == 0} for taken in per_rank]
    assert not anchors[0] & anchors[1]
    assert anchors[0] | anchors[1] == {(0, ep, f) for ep, n in enumerate(SPECS[0][0]) for f in range(n)}


def test_an_epoch_giving_a_rank_less_than_its_share_is_passed_over_for_the_next(make_ds) -> None:
    """A dataset's epoch that gives this rank fewer samples than its share of a batch (ranks balanced to the
    fewest, whose count changes with the deal from epoch to epoch) gives no batch: its part comes from the epoch
    after, as its schedule counts it; only two such epochs in a row are refused. Rank 0 of 2 is dealt 33, 32 and 33
    of the second dataset's 16 + 17 + 16 + 17 frames in its epochs 0-2 (seed 4), a share of 33: its second part is
    epoch 2's (a third pass after epoch 0's ended and epoch 1's was empty)."""
    second = make_ds(episodes=4, frames_per_episode=[16, 17, 16, 17], codec="h264", fps=20, gop=4, seed=1)
    paths = [_datasets(make_ds)[0], second]
    options = dict(rank=0, world_size=2, rank_balance="drop", seed=4, device="cpu", num_workers=0)
    with DALILeRobotMixture(paths, weights=[1, 33], batch_size=34, **options) as mix:
        assert [mix.datasets[1].epoch_samples(e) for e in range(3)] == [33, 32, 33]
        batches = iter(mix)
        parts = [[k for k in _keys(next(batches)) if k[0] == 1] for _ in range(2)]
        assert [len(set(part)) for part in parts] == [33, 33]
        state = mix.state_dict()["datasets"][1]
        assert (state["epoch"], state["samples_consumed"]) == (2, 33)


def test_frames_of_other_sizes_need_image_size(make_ds) -> None:
    paths = _datasets(make_ds, {"size": (64, 96)})
    mix = DALILeRobotMixture(paths, batch_size=4, device="cpu", num_workers=0)
    with pytest.raises(SchemaMismatchError, match=r"observation.images.cam0.*\(3, 64, 96\).*image_size"):
        next(iter(mix))
    assert all(part.state_dict()["samples_consumed"] == 0 for part in mix.datasets)  # nothing taken
    mix.close()
    mix = DALILeRobotMixture(paths, batch_size=4, device="cpu", num_workers=0, image_size=(48, 64))
    assert next(iter(mix))["observation.images.cam0"].shape == (4, 3, 48, 64)
    mix.close()


def test_a_one_step_window_of_a_camera_stored_as_video_and_as_images_batches_as_video(make_ds) -> None:
    # LeRobot gives a one-step window (B, C, H, W) on a video camera and (B, 1, C, H, W) on an image camera.
    paths = _datasets(make_ds, {"image_cameras": True})
    deltas = {"observation.images.cam0": [0.1]}  # one frame ahead: 1 row at 10 fps, 2 at 20
    mix = DALILeRobotMixture(paths, batch_size=6, device="cpu", num_workers=0, shuffle=False, delta_timestamps=deltas)
    batch = next(iter(mix))
    mix.close()
    frames, pad = batch["observation.images.cam0"], batch["observation.images.cam0_is_pad"]
    assert frames.shape == (6, 3, 96, 128) and pad.shape == (6, 1)
    for i, key in enumerate(_keys(batch)):
        dataset, episode, frame = key
        lengths, fps = SPECS[dataset][0], SPECS[dataset][1]
        ahead = frame + round(0.1 * fps)
        assert _marker(frames[i]) == (episode, min(ahead, lengths[episode] - 1), 0)
        assert bool(pad[i, 0]) == (ahead >= lengths[episode])
    # A window of two steps batches (B, 2, C, H, W) for both, as before.
    deltas = {"observation.images.cam0": [0.0, 0.1]}
    mix = DALILeRobotMixture(paths, batch_size=6, device="cpu", num_workers=0, shuffle=False, delta_timestamps=deltas)
    assert next(iter(mix))["observation.images.cam0"].shape == (6, 2, 3, 96, 128)
    mix.close()


def test_frames_that_differ_in_more_than_size_are_not_sent_to_image_size(make_ds, copy_ds) -> None:
    paths = _datasets(make_ds, {"image_cameras": True})
    paths[1] = copy_ds(paths[1])
    _to_mode(paths[1], "observation.images.cam0", "L")  # grey: one channel
    mix = DALILeRobotMixture(paths, batch_size=4, device="cpu", num_workers=0, image_size=(48, 64))
    with pytest.raises(SchemaMismatchError, match=r"\(3, 48, 64\).*\(1, 48, 64\).*more than size.*cameras="):
        next(iter(mix))
    mix.close()


def test_bad_mixtures_fail_before_reading(make_ds) -> None:
    paths = _datasets(make_ds)
    with pytest.raises(SchemaMismatchError, match=r"observation.state.*keys="):
        DALILeRobotMixture([paths[0], _datasets(make_ds, {"state_dim": 4})[1]], device="cpu")
    with pytest.raises(DeltaTimestampsError, match="observation.images.cam1"):
        DALILeRobotMixture(paths, delta_timestamps={"observation.images.cam1": [0.0]}, device="cpu")
    for opening in ({"episodes": [0]}, {"episode_filter": lambda ep: True}):
        with pytest.raises(TypeError, match="open_dataset"):
            DALILeRobotMixture(paths, **opening, device="cpu")
    with pytest.raises(TypeError, match="^drop_last: every mixture batch is full"):  # (not 'unexpected argument')
        DALILeRobotMixture(paths, drop_last=False, device="cpu")
    with pytest.raises(TypeError, match="unexpected"):
        DALILeRobotMixture(paths, batchsize=4, device="cpu")
    with pytest.raises(ValueError, match="one number per dataset"):
        DALILeRobotMixture(paths, weights=[1.0], device="cpu")
    with pytest.raises(ValueError, match="cannot give each"):
        DALILeRobotMixture(paths, batch_size=1, device="cpu")
    # (in any case, as the iterator takes it since b3ee995: 'NONE' and 'None' built a mixture of unequal ranks)
    for none in ("none", "NONE", "None", RankBalance.NONE):
        with pytest.raises(ValueError, match="rank_balance='none'.*concat_datasets"):
            DALILeRobotMixture(paths, rank_balance=none, batch_size=4, device="cpu", num_workers=0)
    # 20 of every 24 samples from a dataset of 16 frames: it could never fill its share.
    with pytest.raises(ShardingError, match=r"fewer samples an epoch than its share of a batch \(20\)"):
        DALILeRobotMixture(paths, weights=[5, 1], batch_size=24, device="cpu", num_workers=0)


def test_a_second_pass_replaces_the_first_which_reads_no_more(make_ds) -> None:
    """A second iter() of a mixture replaces the first pass: the first raises IteratorClosedError (reading on, it
    took samples the second also reads) and the second carries on at the next batch of an uninterrupted run. A state
    of another dataset count or anchor is refused, leaving the mixture where it stood; each dataset takes
    ``dali_threads``."""
    paths = _datasets(make_ds)
    options = {"batch_size": 4, "seed": 3, "device": "cpu", "num_workers": 0}
    with DALILeRobotMixture(paths, **options) as whole:
        expected = [_keys(batch) for batch in itertools.islice(iter(whole), 3)]
    with DALILeRobotMixture(paths, dali_threads=2, **options) as mix:
        assert [part._dali_threads for part in mix.datasets] == [2, 2]
        first = iter(mix)
        assert _keys(next(first)) == expected[0]
        second = iter(mix)
        with pytest.raises(IteratorClosedError, match=r"^a newer pass \(a second iter\(\) of the mixture\)"):
            next(first)
        assert [_keys(next(second)), _keys(next(second))] == expected[1:]
        state = mix.state_dict()
        with pytest.raises(ResumeStateError, match="a mixture of 1 datasets, not of these 2"):
            mix.load_state_dict(state | {"datasets": state["datasets"][:1]})
        with pytest.raises(ResumeStateError, match="dataset 1 as the anchor"):
            mix.load_state_dict(state | {"mixture": state["mixture"] | {"anchor": 1 - mix.anchor}})
        with pytest.raises(ResumeStateError, match="not the state of a mixture of 2 datasets"):
            mix.load_state_dict(state["datasets"][0])  # (one dataset's state)
        assert mix.state_dict() == state


def test_the_parts_are_built_at_once_and_a_failed_build_closes_the_others(make_ds, monkeypatch) -> None:
    """Each part checks its dataset's first files as it is built, over a network one request after another, so
    the parts are built at the same time (every build has begun before any ends); one that fails is raised once
    the others have ended, and those are closed."""
    from lerobot_dali import mixture

    paths = [*_datasets(make_ds), _datasets(make_ds)[0]]
    started, closed = threading.Barrier(len(paths), timeout=60), []
    failing: list[str] = []

    class Part(mixture.DALILeRobotIterator):
        def __init__(self, reader, **options) -> None:
            started.wait()
            if reader.location.description in failing:
                raise FrameTimestampError(f"{reader.location.description} fails")
            super().__init__(reader, **options)

        def close(self) -> None:
            if hasattr(self, "reader"):  # (not the one that failed before it was built)
                closed.append(self.reader.location.description)
                super().close()

    Part.__init__.__signature__ = inspect.signature(mixture.DALILeRobotIterator.__init__)  # (options checked by it)
    monkeypatch.setattr(mixture, "DALILeRobotIterator", Part)
    mix = DALILeRobotMixture(paths, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    assert [part.reader.location.description for part in mix.datasets] == [str(p) for p in paths]
    assert next(iter(mix))["dataset_index"].tolist() == [0, 1, 1, 2]  # (shares by frames: 16, 29, 16)
    mix.close()
    closed.clear()
    started.reset()
    failing.append(str(paths[1]))
    with pytest.raises(FrameTimestampError, match=f"{paths[1]} fails"):
        DALILeRobotMixture(paths, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    assert sorted(closed) == sorted([str(paths[0]), str(paths[2])])


def test_frames_left_out_of_sampling_set_the_default_shares(make_ds) -> None:
    """With the last 3 frames of every episode never sampled, 7 of the first dataset's 16 frames and 23 of the
    second's 29 are: the default shares of a batch of 6 follow those (1 and 5, not 2 and 4), and no sample is one
    of the frames left out. ``dataset_options`` may leave out frames of one dataset only."""
    paths = _datasets(make_ds)
    options = dict(batch_size=6, shuffle=False, device="cpu", num_workers=0)
    plain = DALILeRobotMixture(paths, **options)
    assert plain.batch_shares == (2, 4)
    plain.close()
    mix = DALILeRobotMixture(paths, drop_n_last_frames=3, **options)
    assert mix.batch_shares == (1, 5)
    for batch in mix:
        for d, ep, f in _keys(batch):
            assert f < SPECS[d][0][ep] - 3
    mix.close()
    with pytest.raises(ValueError, match="drop_n_last_frames must be"):
        DALILeRobotMixture(paths, drop_n_last_frames=-1, **options)
    # Per dataset (datasets of other fps need other counts): the first keeps 16 frames, the second 23.
    own = DALILeRobotMixture(paths, dataset_options=[{}, {"drop_n_last_frames": 3}], **options)
    assert own.batch_shares == (2, 4)  # (16 : 23 of 6 -> 2.46 : 3.54)
    for batch in own:
        for d, ep, f in _keys(batch):
            assert d == 0 or f < SPECS[d][0][ep] - 3
    own.close()


def test_a_dataset_left_no_frame_to_sample_is_named(make_ds) -> None:
    """Leaving out more frames than the first dataset's episodes hold (7 of 5, 7 and 4) gave it a default weight of
    0, refused as weights the caller never gave; it names the dataset and the options instead, weights or not."""
    paths = _datasets(make_ds)
    options = dict(batch_size=6, device="cpu", num_workers=0, dataset_options=[{"drop_n_last_frames": 7}, {}])
    for weights in (None, [1, 1]):
        refused = rf"{re.escape(str(paths[0]))}.*drop_n_first_frames and drop_n_last_frames leave no frame"
        with pytest.raises(ShardingError, match=refused):
            DALILeRobotMixture(paths, weights=weights, **options)


def test_per_dataset_selection_through_open_dataset(make_ds) -> None:
    first, second = _datasets(make_ds)
    mix = DALILeRobotMixture(
        [first, open_dataset(second, episodes=[1])], weights=[1, 1], batch_size=2, shuffle=False, device="cpu",
        num_workers=0, keys=["action"], cameras=[],
    )  # fmt: skip
    batch = next(iter(mix))
    assert set(batch) == {"action", "index", "episode_index", "frame_index", "timestamp", "task_index", "task",
                          "dataset_index"}  # fmt: skip
    assert _keys(batch) == [(0, 0, 0), (1, 1, 0)]
    mix.close()


def test_a_window_on_an_index_column_reads_with_keys_that_leave_it_out(make_ds) -> None:
    """``keys=['action']`` selects no ``frame_index``, which every batch carries all the same: a window on it reads,
    0.1 s back being a frame of the first dataset (10 fps) and two of the second (20 fps), before frame 0 padded."""
    mix = DALILeRobotMixture(
        _datasets(make_ds), batch_size=4, shuffle=False, keys=["action"], cameras=[],
        delta_timestamps={"frame_index": [-0.1, 0.0]}, device="cpu", num_workers=0,
    )  # fmt: skip
    batch = next(iter(mix))
    mix.close()
    assert _keys({**batch, "frame_index": batch["frame_index"][:, -1]}) == [(0, 0, 0), (1, 0, 0), (1, 0, 1), (1, 0, 2)]
    assert batch["frame_index"].tolist() == [[0, 0], [0, 0], [0, 1], [0, 2]]
    assert batch["frame_index_is_pad"].tolist() == [[True, False], [True, False], [True, False], [False, False]]


def test_a_rename_map_mixes_cameras_of_other_names_windows_and_normalisation_included(make_ds) -> None:
    """The second dataset's two cameras swap names: the mixture's ``cam0`` is its ``cam1`` (frames marked camera
    1), read with the window and the per-camera ``Normalize`` the caller gave ``cam0``."""
    swap = {"observation.images.cam0": "observation.images.cam1", "observation.images.cam1": "observation.images.cam0"}
    norm = Normalize(mean=(0.5,), std=(0.25,))
    mix = DALILeRobotMixture(
        _datasets(make_ds), batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0,
        dataset_options=[None, {"rename_map": swap}],
        augment=AugmentConfig(normalize={"observation.images.cam0": norm}),
    )  # fmt: skip
    assert mix.camera_channels == {"observation.images.cam0": 3}
    part = mix.datasets[1]
    assert part.reader.all_camera_keys == ("observation.images.cam1",)  # its own name, read from its own files
    assert set(part.windows.delta_index) == {"action", "observation.images.cam1"}
    samples = 0
    for batch in (batch for _, batch in zip(range(3), mix, strict=False)):
        assert "observation.images.cam1" not in batch and "observation.images.cam1_is_pad" not in batch
        for i, (d, ep, f) in enumerate(_keys(batch)):
            n, fps = SPECS[d][0][ep], SPECS[d][1]
            query = [f + round(delta * fps) for delta in DELTAS["observation.images.cam0"]]
            rows = [min(max(q, 0), n - 1) for q in query]
            frames = batch["observation.images.cam0"][i] * norm.std[0] + norm.mean[0]
            assert [_marker(frame) for frame in frames] == [(ep, r, d) for r in rows]  # the second's camera 1
            assert batch["observation.images.cam0_is_pad"][i].tolist() == [not 0 <= q < n for q in query]
            samples += d
    assert samples == 9
    mix.close()


def test_bad_rename_maps_fail_naming_the_dataset_and_the_keys(make_ds) -> None:
    paths = _datasets(make_ds)
    cam0, cam1 = "observation.images.cam0", "observation.images.cam1"
    for rename_map, error, match in (
        ({"observation.images.cam9": "x"}, ValueError, r"renames \['observation.images.cam9'\], which it does not"),
        (
            {"observation.stat": "x"},
            ValueError,
            r"renames \['observation.stat'\], which it does not read; .*\(did you mean \['observation\.state'\]\?\): "
            r"a rename_map's keys are a dataset's own names \(its meta/info\.json features\), its values the batches' "
            r"names$",
        ),
        (  # (written the other way round)
            {"observation.images.front": cam0},
            ValueError,
            rf"the batches' names; this one maps the other way round: pass "
            rf'\{{"{cam0}": "observation\.images\.front"\}}$',
        ),
        (
            {"observation.state": "index"},
            ValueError,
            r"names \['index'\]: every batch carries .*: rename only cameras and features, to other names$",
        ),
        ({"observation.state": "action_is_pad"}, ValueError, r"names \['action_is_pad'\].*a window's mask"),
        (
            {cam0: "observation.state"},
            ValueError,
            r"gives \['observation.state'\] to a key while another key .*: give it another name, rename that other "
            r"key too, or leave one of them out \(cameras=\[\.\.\.\], keys=\[\.\.\.\]\)$",
        ),
        ({cam0: "x", cam1: "x"}, ValueError, r"gives \['x'\] to a key"),
        ({cam0: 3}, TypeError, r"maps key names to new names"),
        ([cam0], TypeError, r"maps key names to new names"),
    ):
        with pytest.raises(error, match=match) as raised:
            DALILeRobotMixture(paths, dataset_options=[{}, {"rename_map": rename_map}], device="cpu", num_workers=0)
        assert str(paths[1]) in str(raised.value)
    renamed = [{}, {"rename_map": {cam0: "observation.images.front"}}]
    with pytest.raises(DatasetError, match=rf"{paths[1]}.*'{cam0}' is renamed 'observation.images.front'"):
        DALILeRobotMixture(paths, dataset_options=renamed, cameras=[cam0], device="cpu", num_workers=0)
    with pytest.raises(TypeError, match=r"augment must be an AugmentConfig or None, got dict"):  # (not AttributeError)
        DALILeRobotMixture(paths, dataset_options=renamed, augment={"normalize": {}}, device="cpu", num_workers=0)
    with pytest.raises(DeltaTimestampsError, match=rf"{paths[1]}': \['{cam0}'\]"):  # (left out: not shared)
        DALILeRobotMixture(paths, dataset_options=renamed, delta_timestamps={cam0: [0.0]}, device="cpu")


def _told_map(error: BaseException, before: str) -> dict[str, str]:
    """The rename map an error tells to pass: the ``{...}`` after ``before``."""
    found = re.search(rf"{re.escape(before)}(\{{[^{{}}]*\}})", str(error))
    assert found is not None, error
    return ast.literal_eval(found.group(1))


def test_a_rename_map_written_partly_the_other_way_round_is_told_whole(make_ds) -> None:
    """The second's cam1 read as cam0 (right) and its cam0 as 'side' (written side first): the map told was the
    reversed entry alone, which dropped cam1's and, passed, left the datasets no camera in common (it read none)."""
    paths = _datasets(make_ds)
    cam0, cam1, side = "observation.images.cam0", "observation.images.cam1", "observation.images.side"
    with pytest.raises(ValueError, match="maps the other way round") as raised:
        DALILeRobotMixture(paths, dataset_options=[{}, {"rename_map": {side: cam0, cam1: cam0}}], device="cpu")
    told = _told_map(raised.value, "other way round: pass ")
    assert told == {cam0: side, cam1: cam0}
    mix = DALILeRobotMixture(
        paths, dataset_options=[{}, {"rename_map": told}], batch_size=4, device="cpu", num_workers=0
    )
    try:
        assert mix.camera_channels == {cam0: 3}
        assert mix.datasets[1].reader.all_camera_keys == (cam1,)  # (its camera 1, read as cam0)
    finally:
        mix.close()
    with pytest.raises(ValueError, match=r"the batches' names$"):  # (reversed, it gives two keys one name: not told)
        DALILeRobotMixture(paths, dataset_options=[{}, {"rename_map": {side: cam0, cam1: side}}], device="cpu")


def _assert_r1_rgb_read_as_top(paths: list[Path], options: list[dict]) -> None:
    """The mixture of cr5 and r1 with ``options`` (r1's told map) opens, reading r1's 'rgb' as cr5's 'top'."""
    top, rgb = "observation.images.top", "observation.images.rgb"
    mix = DALILeRobotMixture(
        paths, cameras=[top], keys=[], image_size=(64, 64), tolerance_s=0.03, dataset_options=options, batch_size=4,
        device="cpu", num_workers=0,
    )  # fmt: skip
    try:
        assert mix.datasets[1].reader.all_camera_keys == (rgb,)  # (read as 'top')
    finally:
        mix.close()


def test_a_rename_hint_for_a_key_renamed_already_names_its_own_key() -> None:
    """r1's 'rgb' renamed 'wrist', cameras=['top'] (or a window on it): the map told was {'wrist': 'top'}, a batch
    name where r1's own key belongs, which, passed, was refused (r1 reads no 'wrist')."""
    paths = [shared_dataset("cr5_v30_av1"), shared_dataset("r1_v30_h264")]
    top, rgb, wrist = "observation.images.top", "observation.images.rgb", "observation.images.wrist"
    options = [{"timestamp_source": "frame_index"}, {"rename_map": {rgb: wrist}}]
    for given, error in (
        ({"cameras": [top]}, DatasetError),
        ({"delta_timestamps": {top: [0.0]}}, DeltaTimestampsError),
    ):
        with pytest.raises(error, match="give it that name with a rename_map") as raised:
            DALILeRobotMixture(paths, dataset_options=options, device="cpu", num_workers=0, **given)
        told = _told_map(raised.value, "with a rename_map (")
        assert told == {rgb: top}
    options[1]["rename_map"] = told
    _assert_r1_rgb_read_as_top(paths, options)


def test_a_map_written_the_other_way_round_with_cameras_is_told_reversed() -> None:
    """cameras=['top'] and r1's map written batch name first ({'top': 'rgb'}, 'action' renamed too): each dataset is
    opened with its own keys for cameras= since 4c99de0, and the refusal told {'top': 'top'} (the whole map's
    reverse took r1's 'rgb' for its 'top'), which, passed, was refused again; the map reversed is told, as without
    cameras=, and, passed, opens."""
    paths = [shared_dataset("cr5_v30_av1"), shared_dataset("r1_v30_h264")]
    top, rgb = "observation.images.top", "observation.images.rgb"
    options: list[dict] = [{"timestamp_source": "frame_index"}, {"rename_map": {top: rgb, "action": "act"}}]
    with pytest.raises(DatasetError, match="maps the other way round") as raised:
        DALILeRobotMixture(paths, dataset_options=options, cameras=[top], device="cpu", num_workers=0)
    told = _told_map(raised.value, "other way round: pass ")
    assert told == {rgb: top, "action": "act"}
    with pytest.raises(DatasetError, match="maps the other way round") as raised:
        concat_datasets(paths, cameras=[top], rename_maps=[None, options[1]["rename_map"]])
    assert _told_map(raised.value, "other way round: pass ") == told
    options[1]["rename_map"] = told
    _assert_r1_rgb_read_as_top(paths, options)


def test_a_rename_hint_for_a_camera_names_a_camera_not_a_feature() -> None:
    """r1 (its 'action' renamed 'act') read with cr5 lacks cr5's camera 'top': the hint took r1's one key the
    others lack whatever its kind, 'act' where its camera was asked for too (cameras=[rgb, top]), and told
    {'action': 'top'}, a vector named as a camera, which, passed, was refused again; a window on 'top' with r1's
    camera and 'act' both spare told none. The window's hint tells r1's camera now ({'action': 'act', 'rgb': 'top'}),
    which, passed, opens; with cameras= taking 'rgb' as well, r1 has no camera left to give 'top' (it was told
    {'rgb': 'top'}, which, passed, lacks 'rgb'), and says so."""
    paths = [shared_dataset("r1_v30_h264"), shared_dataset("cr5_v30_av1")]
    top, rgb = "observation.images.top", "observation.images.rgb"
    options = [{"rename_map": {"action": "act"}}, {"timestamp_source": "frame_index"}]
    with pytest.raises(DatasetError) as raised:  # (its one camera, asked for as well: none left to name 'top')
        DALILeRobotMixture(paths, dataset_options=options, cameras=[rgb, top], device="cpu", num_workers=0)
    assert "'action': 'observation.images.top'" not in str(raised.value), raised.value
    assert str(raised.value).endswith(
        f"it lacks ['{top}'] and has none of its cameras left to give those names: no rename_map gives it them all"
    ), raised.value
    with pytest.raises(DeltaTimestampsError, match="give it that name with a rename_map") as raised:
        DALILeRobotMixture(paths[::-1], dataset_options=options[::-1], delta_timestamps={top: [0.0]}, device="cpu")
    told = _told_map(raised.value, "with a rename_map (")
    assert told == {"action": "act", rgb: top}
    mix = DALILeRobotMixture(
        paths[::-1], delta_timestamps={top: [0.0]}, keys=[], image_size=(64, 64), tolerance_s=0.03, batch_size=4,
        dataset_options=[options[1], {"rename_map": told}], device="cpu", num_workers=0,
    )  # fmt: skip
    try:
        assert mix.datasets[1].reader.all_camera_keys == (rgb,)  # (read as 'top')
    finally:
        mix.close()


def test_datasets_naming_a_camera_otherwise_are_told_the_rename_map_that_joins_them() -> None:
    """cr5 records its camera as 'top', r1 as 'rgb': cameras=['top'] and a window on it said only that r1 lacks it
    (and to pick cameras from r1's, which cr5 lacks)."""
    paths = [shared_dataset("cr5_v30_av1"), shared_dataset("r1_v30_h264")]
    top, rgb = "observation.images.top", "observation.images.rgb"
    hint = (
        rf"if a dataset lacking '{re.escape(top)}' records it under another name, give it that name with a rename_map "
        rf"\(\{{\"{re.escape(rgb)}\": \"{re.escape(top)}\"\}}: DALILeRobotMixture's dataset_options=\[\.\.\., "
        r"\{'rename_map': \.\.\.\}\], concat_datasets' rename_maps=\[\.\.\.\] \(a map or None per dataset\), on the "
        r"command line --rename-map\)"
    )
    with pytest.raises(DatasetError, match=rf"r1_v30_h264 has no camera \['{re.escape(top)}'\]; .*{hint}$"):
        DALILeRobotMixture(paths, cameras=[top], device="cpu", num_workers=0)
    with pytest.raises(DeltaTimestampsError, match=rf"which the mixture does not read: .*{hint}, or drop them from"):
        DALILeRobotMixture(paths, delta_timestamps={top: [0.0]}, device="cpu", num_workers=0)
    # concat_datasets takes the map in a list (a dict for all was a TypeError): the camera is joined, its sizes differ
    with pytest.raises(SchemaMismatchError, match=r"differ in the video of camera 'observation\.images\.top'"):
        concat_datasets(paths, cameras=[top], keys=[], rename_maps=[None, {rgb: top}])
    # As told (cr5's timestamps are wall-clock; r1's video has 25 frames a second to its rows' 10):
    options = [{"timestamp_source": "frame_index"}, {"rename_map": {rgb: top}}]
    mix = DALILeRobotMixture(
        paths, cameras=[top], keys=[], image_size=(64, 64), tolerance_s=0.03, dataset_options=options,
        batch_size=4, device="cpu", num_workers=0,
    )  # fmt: skip
    try:
        batch = next(iter(mix))
        assert batch[top].shape == (4, 3, 64, 64) and batch["dataset_index"].tolist() == [0, 0, 0, 1]
    finally:
        mix.close()


def test_a_window_on_a_key_every_dataset_has_but_keys_leaves_out_says_to_add_it() -> None:
    """Every dataset has 'action', keys= leaves it out: the rename hint looked for a dataset lacking it, found none
    and raised StopIteration."""
    path = shared_dataset("cr5_v30_av1")
    said = r"\['action'\], .*: keys= leaves out \['action'\]: add them, keys=\['observation.state', 'action'\], or drop"
    with pytest.raises(DeltaTimestampsError, match=said):
        DALILeRobotMixture([path, path], keys=["observation.state"], delta_timestamps={"action": [0.0]}, device="cpu")


def test_a_window_on_a_camera_cameras_leaves_out_is_told_with_the_cameras_to_pass(make_ds) -> None:
    """cameras=['cam0'] and a window on 'cam2', which the 2-camera dataset lacks: the refusal told a rename alone
    ({'cam1': 'cam2'}), which, passed, was refused again (cameras= still left 'cam2' out). It says now that
    cameras= leaves it out and the cameras to pass; with both, the second dataset's camera 1 is read as 'cam2'
    (each frame's marker: the first's camera 2, the second's camera 1, at the sample's episode and frame)."""
    three, two = (make_ds(episodes=2, frames_per_episode=8, cameras=n, size=(64, 64), codec="h264") for n in (3, 2))
    cam0, cam1, cam2 = (f"observation.images.cam{i}" for i in range(3))
    options = dict(delta_timestamps={cam2: [0.0]}, keys=[], batch_size=4, shuffle=False, device="cpu", num_workers=0)
    with pytest.raises(DeltaTimestampsError) as raised:
        DALILeRobotMixture([three, two], cameras=[cam0], **options)
    said = f"not every dataset has them ({ {str(two): [cam2]} }), and cameras= leaves out ['{cam2}']: add them, "
    assert said in str(raised.value), raised.value
    cameras = ast.literal_eval(re.search(r"add them, cameras=(\[[^\]]*\])", str(raised.value)).group(1))  # type: ignore[union-attr]
    told = _told_map(raised.value, "with a rename_map (")
    assert (cameras, told) == ([cam0, cam2], {cam1: cam2})
    mix = DALILeRobotMixture([three, two], cameras=cameras, dataset_options=[{}, {"rename_map": told}], **options)
    try:
        batch = next(iter(mix))
    finally:
        mix.close()
    assert mix.datasets[1].reader.all_camera_keys == (cam0, cam1)
    frames = batch[cam2].reshape(-1, *batch[cam2].shape[-3:])
    assert [_marker(frame) for frame in frames] == [(ep, f, 2 - d) for d, ep, f in _keys(batch)]


def _jitter_timestamps(root: Path, seconds: float) -> None:
    """Parquet timestamps off the frame grid by up to ``seconds`` either way (cr5's wall-clock ones: 0.03 s at
    10 fps), still in order."""
    rng = np.random.default_rng(0)
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        stamps = table["timestamp"].to_numpy() + rng.uniform(-seconds, seconds, table.num_rows)
        column = table.schema.get_field_index("timestamp")
        pq.write_table(table.set_column(column, "timestamp", pa.array(stamps.astype(np.float32))), path)


def test_dataset_options_read_each_dataset_its_own_way(make_ds, tmp_path: Path) -> None:
    from lerobot_dali import DALILeRobotIterator

    # The first needs timestamp_source="frame_index"; the second's timestamps are within 1 ms of its frames.
    wall_clock, other = (
        shutil.copytree(path, tmp_path / name) for path, name in zip(_datasets(make_ds), "ab", strict=True)
    )
    _jitter_timestamps(wall_clock, 0.03)
    _jitter_timestamps(other, 0.001)
    options = dict(delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0, return_uint8=True)
    for wrong in (None, [{"timestamp_source": "frame_index"}, {}]):  # each fails at the dataset it does not fit
        with pytest.raises(FrameTimestampError, match=str(other if wrong else wall_clock)):
            DALILeRobotMixture([wall_clock, other], batch_size=4, dataset_options=wrong, **options)
    own = [{"timestamp_source": "frame_index"}, {"tolerance_s": 2e-3}]
    mix = DALILeRobotMixture([wall_clock, other], batch_size=4, dataset_options=own, **options)
    batches = [batch for _, batch in zip(range(6), mix, strict=False)]
    mix.close()
    for position, (path, share) in enumerate(zip((wall_clock, other), (1, 3), strict=True)):
        alone = DALILeRobotIterator(path, batch_size=share, cameras=["observation.images.cam0"], **own[position],
                                    **options)  # fmt: skip
        start = 0 if position == 0 else 1
        for batch, single in zip(batches, alone, strict=False):
            for key, value in single.items():
                got = batch[key][start : start + share]
                assert got == value if key == "task" else torch.equal(got, value), key
        alone.close()
    frames = torch.cat([b["observation.images.cam0"][:1] for b in batches])  # the wall-clock dataset's, by marker
    keys = [k for b in batches for k in _keys(b)[:1]]
    assert [_marker(f[-1].float() / 255)[:2] for f in frames] == [k[1:] for k in keys]
    with pytest.raises(TypeError, match=r"dataset_options\[1\] sets \['shuffle'\], which apply to every dataset"):
        DALILeRobotMixture([wall_clock, other], dataset_options=[{}, {"shuffle": False}], device="cpu")
    with pytest.raises(TypeError, match=r"one mapping \(or None\) per dataset \(2\)"):
        DALILeRobotMixture([wall_clock, other], dataset_options=[{}], device="cpu")


def test_a_misspelt_dataset_option_is_named_as_no_option(tmp_path: Path) -> None:
    """Refused before any dataset opens, as no option at all: not as one that applies to every dataset alike."""
    paths = [tmp_path / "a", tmp_path / "b"]  # (never opened)
    with pytest.raises(TypeError, match=r"sets \['timestamp_sorce'\], which DALILeRobotIterator does not take"):
        DALILeRobotMixture(paths, dataset_options=[{}, {"timestamp_sorce": "frame_index"}], device="cpu")


def test_a_refused_resume_leaves_every_dataset_where_it_stood(make_ds) -> None:
    """A state whose second dataset's episodes differ is refused; the first dataset's state, loaded before, was
    kept, so a run that goes on without the resume (the error caught) read that dataset from the saved position."""
    first, second = _datasets(make_ds)
    options = dict(weights=[1, 1], batch_size=4, seed=1, device="cpu", num_workers=0)
    mix = DALILeRobotMixture([first, second], **options)
    batches = iter(mix)
    for _ in range(2):
        next(batches)
    saved = mix.state_dict()
    mix.close()
    other = DALILeRobotMixture([first, open_dataset(second, episodes=[0])], **options)
    fresh = other.state_dict()
    assert saved["datasets"][0]["samples_consumed"] == 4 and fresh["datasets"][0]["samples_consumed"] == 0
    with pytest.raises(ResumeStateError, match="saved over other episodes"):
        other.load_state_dict(saved)
    assert other.state_dict() == fresh
    other.close()


def test_a_failed_part_loses_no_sample_of_the_others(make_ds, copy_ds) -> None:
    first, second = _datasets(make_ds)
    second = copy_ds(make_ds(episodes=2, frames_per_episode=[20, 9], cameras=1, codec="h264", fps=20, gop=4,
                             episodes_per_file=1))  # fmt: skip
    video = next(second.glob("videos/observation.images.cam0/*/file-001.mp4"))
    hidden = video.with_suffix(".away")
    os.rename(video, hidden)
    mix = DALILeRobotMixture([first, second], batch_size=4, shuffle=False, device="cpu", num_workers=0)
    taken: list[tuple[int, int, int]] = []
    with pytest.raises(MissingDataFileError, match="file-001"):
        _run(mix, 1, taken)
    # The second dataset's episode 1 starts in its 7th part, which DALI's prefetch asks for a few batches early;
    # the first dataset's part of the failed batch is given back.
    assert 0 < len(taken) <= 6 * 4
    assert [part.state_dict()["samples_consumed"] for part in mix.datasets] == [len(taken) // 4, len(taken) // 4 * 3]
    os.rename(hidden, video)
    _run(mix, 1, taken)
    mix.close()
    clean = DALILeRobotMixture([first, second], batch_size=4, shuffle=False, device="cpu", num_workers=0)
    expected: list[tuple[int, int, int]] = []
    _run(clean, 1, expected)
    clean.close()
    assert taken == expected


def test_real_v21_and_v30_datasets_mix_into_what_each_gives_alone() -> None:
    """``cr5_v21_av1`` and ``cr5_v30_av1`` (the same recording in both formats; wall-clock parquet timestamps, so
    video is read by frame index): each part of a mixture batch equals that dataset read alone."""
    from lerobot_dali import DALILeRobotIterator
    from tests.conftest import shared_dataset

    paths = [shared_dataset("cr5_v21_av1"), shared_dataset("cr5_v30_av1")]
    options = dict(
        delta_timestamps={"action": [0.0, 0.1, 0.2]}, shuffle=False, device="cpu", num_workers=0,
        timestamp_source="frame_index", return_uint8=True,
    )  # fmt: skip
    mix = DALILeRobotMixture(paths, weights=[1, 1], batch_size=4, **options)
    batches = [batch for _, batch in zip(range(4), mix, strict=False)]
    mix.close()
    for position, path in enumerate(paths):
        alone = DALILeRobotIterator(path, batch_size=2, seed=0, **options)
        for batch, single in zip(batches, alone, strict=False):
            part = slice(2 * position, 2 * position + 2)
            assert batch["dataset_index"][part].tolist() == [position] * 2
            assert batch["task"][part] == single["task"] and set(batch) == {*single, "dataset_index"}
            for key, value in single.items():
                if torch.is_tensor(value):
                    torch.testing.assert_close(batch[key][part], value, rtol=0, atol=0, msg=key)
        alone.close()
    assert [int(i) for i in batches[-1]["frame_index"]] == [6, 7, 6, 7]


def test_real_datasets_of_other_camera_names_and_fps_mix_through_a_rename_map() -> None:
    """``cr5_v30_av1`` (AV1, ``observation.images.top``, wall-clock parquet timestamps) and ``r1_v30_h264`` (H.264
    with B-frames, ``observation.images.rgb``, 25 fps video under 10 fps rows): they share no camera and their
    states differ in size, so they mix only with the rgb camera renamed and state and action left out; each part of a
    batch then equals that dataset read alone under its own names."""
    from lerobot_dali import DALILeRobotIterator
    from tests.conftest import shared_dataset

    paths = [shared_dataset("cr5_v30_av1"), shared_dataset("r1_v30_h264")]
    rgb, top = "observation.images.rgb", "observation.images.top"
    own = [{"timestamp_source": "frame_index"}, {"tolerance_s": 0.021}]  # (r1: rows between two video frames)
    options = dict(
        delta_timestamps={top: [-0.2, 0.0]}, shuffle=False, device="cpu", num_workers=0, return_uint8=True,
        image_size=(48, 64),
    )  # fmt: skip
    with pytest.raises(DeltaTimestampsError, match=rf"r1_v30_h264': \['{top}'\]"):
        DALILeRobotMixture(paths, dataset_options=own, **options)
    renamed = [own[0], {**own[1], "rename_map": {rgb: top}}]
    with pytest.raises(SchemaMismatchError, match=r"'observation.state' has different shapes"):
        DALILeRobotMixture(paths, dataset_options=renamed, **options)
    mix = DALILeRobotMixture(paths, weights=[1, 1], batch_size=4, keys=[], dataset_options=renamed, **options)
    batches = [batch for _, batch in zip(range(3), mix, strict=False)]
    mix.close()
    assert mix.camera_channels == {top: 3}
    for position, path in enumerate(paths):
        windows = {rgb if position else top: [-0.2, 0.0]}
        alone = DALILeRobotIterator(path, batch_size=2, seed=0, keys=[], **{**options, **own[position],
                                    "delta_timestamps": windows})  # fmt: skip
        for batch, single in zip(batches, alone, strict=False):
            part = slice(2 * position, 2 * position + 2)
            assert batch["dataset_index"][part].tolist() == [position] * 2 and batch["task"][part] == single["task"]
            for key, value in single.items():
                if torch.is_tensor(value):
                    mixed = key.replace(rgb, top) if position else key
                    torch.testing.assert_close(batch[mixed][part], value, rtol=0, atol=0, msg=key)
            assert set(batch) == {*(k.replace(rgb, top) for k in single), "dataset_index"}
        alone.close()
    assert batches[-1][f"{top}_is_pad"].tolist() == [[False, False]] * 4
    assert batches[0][f"{top}_is_pad"].tolist() == [[True, False]] * 4


@pytest.mark.parametrize("where", ["_next_part", "_join"])
def test_a_state_taken_while_a_batch_is_read_resumes_at_that_batch(make_ds, monkeypatch, where: str) -> None:
    """A signal handler's checkpoint (state_dict() on the reading thread) inside a mixture batch, after the anchor's
    part was counted (``_next_part``) or all of them (``_join``): the state resumed with the others' parts repeated
    or the whole batch lost (measured, a state at each line of 3 batches: 6,737 of 12,689 points without workers,
    939 of 2,244 with 2). It is the states before the batch: the handler's checkpoint has not trained on it."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    mix = DALILeRobotMixture(paths, **options)
    full = [_keys(batch) for batch in mix]
    mix.close()
    mix = DALILeRobotMixture(paths, **options)
    original, taken = getattr(DALILeRobotMixture, where), []

    def handler_lands_here(self, *args):
        if not taken and len(read) == 2:  # (in the third batch)
            taken.append(self.state_dict())
        return original(self, *args)

    monkeypatch.setattr(DALILeRobotMixture, where, handler_lands_here)
    read: list[list[tuple[int, int, int]]] = []
    for batch in mix:
        read.append(_keys(batch))
    mix.close()
    assert read == full and len(taken) == 1  # (the handler's state_dict() changed nothing the pass reads)
    monkeypatch.setattr(DALILeRobotMixture, where, original)
    resumed = DALILeRobotMixture(paths, **options)
    resumed.load_state_dict(taken[0])
    assert [_keys(batch) for batch in resumed] == full[2:]
    resumed.close()


@pytest.mark.parametrize(
    ("where", "num_workers"), [("_restart", 0), ("in_threads", 2), ("DALILeRobotIterator.__iter__", 0)]
)
def test_a_handlers_close_before_a_part_is_built_closes_it_once_built(make_ds, monkeypatch, where, num_workers) -> None:
    """A signal handler's close() on the reading thread before a part's pipeline was built (in iter(): as the parts
    are restarted at their epochs, ``_restart``, or as their parallel build begins, ``in_threads``; in the batch
    whose part restarts its epoch, the part's iter()): closed one by one, a part not yet built was built after it,
    its pipeline and workers running on until the next close (a close at each line of iter() and two batches: 65
    of 147 points without workers, 28 of 53 with 2). The pass now closes every part once built and raises
    IteratorClosedError, and the next pass carries on at the same sample."""
    from lerobot_dali import mixture

    paths = _datasets(make_ds)
    restart = "." in where  # (in batch 9: the second part's epoch of 9 batches restarts)
    count = 11 if restart else 2
    options = dict(batch_size=4, seed=3, device="cpu")
    mix = DALILeRobotMixture(paths, **options, num_workers=0)
    full = [_keys(batch) for batch in itertools.islice(mix, count)]
    mix.close()
    mix = DALILeRobotMixture(paths, **options, num_workers=num_workers)
    owner, name = (mixture.DALILeRobotIterator, "__iter__") if restart else (mixture, where)
    original, read, closes = getattr(owner, name), [], []

    def handler_closes_first(*args):
        if not closes and len(read) == (9 if restart else 0):
            closes.append(mix.close())
        return original(*args)

    monkeypatch.setattr(owner, name, handler_closes_first)
    batches = iter(mix)
    with pytest.raises(IteratorClosedError):
        while True:
            read.append(_keys(next(batches)))
    monkeypatch.setattr(owner, name, original)
    assert closes and [part._pipeline for part in mix.datasets] == [None, None]
    assert multiprocessing.active_children() == []
    read += [_keys(batch) for batch in itertools.islice(mix, count - len(read))]
    mix.close()
    assert read == full


def test_a_second_signal_in_a_handlers_deferred_close_loses_no_close(make_ds, monkeypatch) -> None:
    """A signal handler's close() as the parts' pipelines start is left to the pass, which runs it once all are built;
    a second signal's exception (a Ctrl-C after a SIGTERM handler's close()) at a line of that run before it closed
    every part lost it: a part's pipeline ran on after the KeyboardInterrupt (9 of 12 lines). The pass now runs it again
    as the exception leaves."""
    from lerobot_dali import mixture

    paths = _datasets(make_ds)
    original = mixture.in_threads
    codes = tuple(getattr(DALILeRobotMixture, name).__code__ for name in ("_start", "_close_if_closed_since", "close"))
    reached, lost = [], []
    for k in itertools.count(1):
        mix = DALILeRobotMixture(paths, batch_size=4, seed=3, device="cpu", num_workers=0)
        closed: list[None] = []

        def handler_closes(*args, mix=mix, closed=closed):
            made = original(*args)
            closed.append(mix.close())  # (a signal handler's, as the pass starts the parts: left to the pass)
            return made

        monkeypatch.setattr(mixture, "in_threads", handler_closes)
        # (KeyboardInterrupt: the second signal; IteratorClosedError: the close, run with no second signal)
        with (
            SecondSignal(k, codes, lambda closed=closed: bool(closed)) as second,
            contextlib.suppress(KeyboardInterrupt, IteratorClosedError),
        ):
            next(iter(mix))
        monkeypatch.setattr(mixture, "in_threads", original)
        if second.at is None:
            break
        reached.append(second.at)
        if any(part._pipeline is not None for part in mix.datasets):
            lost.append(second.at)
        mix.close()
    assert len(reached) > 10 and lost == []


def test_a_close_from_another_thread_gives_up_on_a_pass_starting_the_parts(make_ds, monkeypatch) -> None:
    """close() from another thread waited, with no bound, for a pass starting the datasets' pipelines (a remote
    dataset's warm-up, workers slow to start): it returned only once every build had ended (a build held 10 s: 1 of 1).
    It now waits CLOSE_WAIT_S, as an iterator's close() does, and leaves them to that pass, which closes every part
    once built and raises IteratorClosedError; every pipeline is shut down and the next pass reads on at the same
    sample."""
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0)  # (it gives up at once: the pass holds the lock)
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    mix = DALILeRobotMixture(paths, **options)
    full = [_keys(batch) for batch in itertools.islice(mix, 2)]
    mix.close()
    mix = DALILeRobotMixture(paths, **options)
    original, pipelines, waited = iterator_module.build_pipeline, [], []
    building, release = threading.Event(), threading.Event()

    def held_build(*args, **kwargs):
        if not building.is_set():
            building.set()
            waited.append(release.wait(10))  # (False: close() waited for this build to end)
        made = original(*args, **kwargs)
        pipelines.append(made[0])
        return made

    monkeypatch.setattr(iterator_module, "build_pipeline", held_build)
    errors: list[Exception] = []

    def loop() -> None:
        try:
            next(iter(mix))
        except IteratorClosedError as e:
            errors.append(e)

    reader = threading.Thread(target=loop)
    reader.start()
    assert building.wait(30)
    mix.close()
    release.set()
    reader.join(60)
    monkeypatch.setattr(iterator_module, "build_pipeline", original)
    assert waited == [True] and not reader.is_alive() and len(errors) == 1
    assert len(pipelines) == 2 and [pipeline._pipe for pipeline in pipelines] == [None, None]  # (all shut down)
    assert [part._pipeline for part in mix.datasets] == [None, None]
    assert mix._starting.acquire(blocking=False)  # (free)
    mix._starting.release()
    read = [_keys(batch) for batch in itertools.islice(mix, 2)]
    mix.close()
    assert read == full


def test_a_dataset_whose_close_fails_leaves_no_other_running(make_ds) -> None:
    """close() closed the datasets one after another, and a failure in one's (a source's close, DALI's shutdown) ended
    it there: the datasets after it kept their pipelines and worker processes (1 of 2 left running, the first's
    source failing). Every dataset is closed now, then the failure raised, and the next pass reads on at the same
    sample."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    mix = DALILeRobotMixture(paths, **options)
    full = [_keys(batch) for batch in itertools.islice(mix, 3)]
    mix.close()
    mix = DALILeRobotMixture(paths, **options)
    read = [_keys(next(iter(mix)))]
    pipelines = [part._pipeline for part in mix.datasets]
    source = mix.datasets[0]._source
    close_source = source.close

    def failing_close() -> None:
        close_source()
        raise OSError("the source's close failed")

    source.close = failing_close
    with pytest.raises(OSError, match="the source's close failed"):
        mix.close()
    assert [part._pipeline for part in mix.datasets] == [None, None] and [p._pipe for p in pipelines] == [None, None]
    assert [part._source for part in mix.datasets] == [None, None]
    read += [_keys(batch) for batch in itertools.islice(mix, 2)]
    mix.close()
    assert read == full


def test_a_close_from_another_thread_waits_close_wait_s_in_all(make_ds, monkeypatch) -> None:
    """close() from another thread waited up to CLOSE_WAIT_S for a pass starting the datasets' pipelines, then up to
    CLOSE_WAIT_S again for each dataset whose pass was inside DALI's next(): up to 3 times CLOSE_WAIT_S for 2 datasets
    (2.9 times, on a clock that each wait moves on by the time it waited: the start ended at 90% of the first). The
    waits share one CLOSE_WAIT_S now: each dataset's close gets what the start left, and leaves its pipeline to its
    pass once that is spent."""
    paths = _datasets(make_ds)
    mix = DALILeRobotMixture(paths, batch_size=4, seed=3, device="cpu", num_workers=0)
    wait_s, clock = 60.0, [0.0]
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", wait_s)
    monkeypatch.setattr(iterator_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    class StartEndsLate:  # (a pass starting the datasets: it lets the lock go at 90% of the wait)
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            clock[0] += 0.9 * timeout
            return True

        def release(self) -> None:
            pass

    class HeldInNext:  # (a dataset's pass inside DALI's next(), for longer than any wait)
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            clock[0] += timeout if blocking else 0
            return False

        def release(self) -> None:
            raise RuntimeError("not held")

    locks = [part._next_lock for part in mix.datasets]
    mix._starting = StartEndsLate()
    for part in mix.datasets:
        part._next_lock = HeldInNext()
    mix.close()
    assert clock[0] == pytest.approx(wait_s)
    monkeypatch.undo()
    for part, lock in zip(mix.datasets, locks, strict=True):
        part._next_lock = lock
    mix.close()


def test_a_mixture_used_as_a_context_manager_closes_every_dataset_as_the_block_ends(make_ds) -> None:
    """``with DALILeRobotMixture(...) as mix:`` raised TypeError (no __enter__). The block's end, an error's too,
    closes every dataset's pipeline and workers; the error propagates."""
    paths = _datasets(make_ds)
    with (
        pytest.raises(RuntimeError, match="in the block"),
        DALILeRobotMixture(paths, batch_size=4, device="cpu", num_workers=1) as mix,
    ):
        assert len(_keys(next(iter(mix)))) == 4
        assert all(part._pipeline is not None for part in mix.datasets) and multiprocessing.active_children()
        raise RuntimeError("in the block")
    assert all(part._pipeline is None for part in mix.datasets) and multiprocessing.active_children() == []


def _epoch_and_state_after_3_batches(paths: list[str], options: dict) -> tuple[list, dict]:
    """A whole epoch's batches (their keys) of a mixture of ``paths``, and its state after its first 3 batches."""
    mix = DALILeRobotMixture(paths, **options)
    full = [_keys(batch) for batch in mix]
    mix.close()
    saver = DALILeRobotMixture(paths, **options)
    for _ in zip(range(3), saver, strict=False):
        pass
    state = saver.state_dict()
    saver.close()
    return full, state


def test_a_load_from_another_thread_while_a_batch_is_read_keeps_the_loaded_positions(make_ds, monkeypatch) -> None:
    """load_state_dict() from another thread while a mixture batch was read (in a part's read, DALI's next()): the
    part's pass ended with the load's IteratorClosedError, and the mixture, restoring the states from before the
    batch (as for any failed batch), put every part back where it stood before the load: the load was undone, the
    next pass read on from batch 2, not the loaded batch 3 (1 of 1). The loaded positions now stay."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    full, state = _epoch_and_state_after_3_batches(paths, options)
    mix = DALILeRobotMixture(paths, **options)
    original, calls, loader = DALIGenericIterator.__next__, [0], []
    anchor = mix.datasets[mix.anchor]

    def loaded_meanwhile(self):
        calls[0] += 1
        if calls[0] == 3:  # (the second batch's first part)
            loader.append(threading.Thread(target=mix.load_state_dict, args=(state,)))
            loader[0].start()
            deadline = time.monotonic() + 30
            while anchor._stream.loads == 0 and time.monotonic() < deadline:  # (the anchor's stream loaded)
                time.sleep(0.01)
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", loaded_meanwhile)
    read = []
    with pytest.raises(IteratorClosedError, match=r"load_state_dict\(\) moved the stream"):
        for batch in mix:
            read.append(_keys(batch))
    loader[0].join(timeout=60)
    assert not loader[0].is_alive()
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    assert read == full[:1]
    assert mix.state_dict()["datasets"] == state["datasets"]
    assert [_keys(batch) for batch in mix] == full[3:]
    mix.close()


def test_a_state_taken_after_a_load_from_another_thread_during_a_batch_is_the_loaded_one(make_ds, monkeypatch) -> None:
    """state_dict() while a mixture batch is read gives the states from before that batch; a load_state_dict() from
    another thread inside the batch (after the anchor's part was read) left those pre-load states standing, so a state
    taken then (an asynchronous checkpoint) resumed 3 batches before the loaded position, which the stream stood
    at and read on from (1 of 1). A state taken after the load is the loaded one."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    full, state = _epoch_and_state_after_3_batches(paths, options)
    mix = DALILeRobotMixture(paths, **options)
    original, taken = DALILeRobotMixture._next_part, []

    def loaded_meanwhile(self, *args):
        if not taken:  # (the first batch, its anchor's part read: no lock of the pass held)
            loader = threading.Thread(target=mix.load_state_dict, args=(state,))
            loader.start()
            loader.join(timeout=60)
            assert not loader.is_alive()
            taken.append(mix.state_dict())
        return original(self, *args)

    monkeypatch.setattr(DALILeRobotMixture, "_next_part", loaded_meanwhile)
    with pytest.raises(IteratorClosedError):  # (the part's pipeline, closed by the load)
        for _ in mix:
            pass
    monkeypatch.setattr(DALILeRobotMixture, "_next_part", original)
    assert taken[0]["datasets"] == state["datasets"] == mix.state_dict()["datasets"]
    assert [_keys(batch) for batch in mix] == full[3:]
    mix.close()
    resumed = DALILeRobotMixture(paths, **options)
    resumed.load_state_dict(taken[0])
    assert [_keys(batch) for batch in resumed] == full[3:]
    resumed.close()


def test_a_load_from_another_thread_as_a_pass_restarts_the_datasets_keeps_the_loaded_positions(
    make_ds, monkeypatch
) -> None:
    """A load_state_dict() from another thread as iter() put the datasets at the start of the anchor's epoch (its
    state read there, at that epoch's start, before the load): the restart that followed moved the other dataset back
    to where that epoch starts it, the loaded position lost (its parts read from its epoch's start: 1 of 1). The
    restarts and the load now come one after the other; what is read is the loaded position's rest."""
    from lerobot_dali import mixture

    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    full, state = _epoch_and_state_after_3_batches(paths, options)
    mix = DALILeRobotMixture(paths, **options)
    original, loader = mixture._restart, []

    def loaded_first(*args):
        if not loader:
            loader.append(threading.Thread(target=mix.load_state_dict, args=(state,)))
            loader[0].start()
            loader[0].join(timeout=2)  # (done where nothing holds it off)
        return original(*args)

    monkeypatch.setattr(mixture, "_restart", loaded_first)
    read = []
    with contextlib.suppress(IteratorClosedError):  # (the parts' passes, where the load came as they started)
        for batch in mix:
            read.append(_keys(batch))
    loader[0].join(timeout=60)
    assert not loader[0].is_alive()
    monkeypatch.setattr(mixture, "_restart", original)
    read += [_keys(batch) for batch in itertools.islice(mix, len(full) - 3 - len(read))]
    mix.close()
    assert read == full[3:]


def test_a_load_from_another_thread_as_a_dataset_starts_its_next_epoch_in_a_batch_keeps_the_loaded_positions(
    make_ds, monkeypatch
) -> None:
    """A load_state_dict() from another thread as a batch started the next epoch of a dataset other than the anchor
    (its epoch, 9 batches, over in the mixture's 10th): that dataset's new pass began after the load, at the loaded
    position, so nothing ended the batch, which joined the anchor's part read at the old position to it and was handed
    out; the next batch ended the pass (the anchor's), and the mixture restored the states of that batch's start, the
    dataset one batch past the loaded position (a batch of it lost: 4 of 277 fuzzed load points). A load before the
    dataset's new pass starts now ends the batch, and iterating again reads the rest from the loaded positions."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    full, state = _epoch_and_state_after_3_batches(paths, options)
    mix = DALILeRobotMixture(paths, **options)
    original, loader = DALILeRobotMixture._start, []

    def loaded_first(self, parts, closes):
        if len(parts) == 1 and not loader:  # (a dataset's next epoch, mid-pass)
            loader.append(threading.Thread(target=mix.load_state_dict, args=(state,)))
            loader[0].start()
            loader[0].join(timeout=2)  # (done where nothing holds it off)
        return original(self, parts, closes)

    monkeypatch.setattr(DALILeRobotMixture, "_start", loaded_first)
    read = []
    with pytest.raises(IteratorClosedError, match=r"load_state_dict\(\) moved the stream"):
        for batch in mix:
            read.append(_keys(batch))
    loader[0].join(timeout=60)
    assert not loader[0].is_alive() and read == full[: len(read)] and len(read) >= 9
    rest = [_keys(batch) for batch in mix]
    mix.close()
    assert rest == full[3:]


def test_a_state_taken_after_set_epoch_resumes_that_epoch_as_read_on(make_ds) -> None:
    """set_epoch(2) four batches into epoch 0 moved the anchor alone, the other dataset put where epoch 2 starts it by
    the next iter(): a state_dict() taken between held it where it stood (its batch 4 of epoch 0), and a resume read
    its parts of epoch 2 from there, not those the mixture read on (every batch's other part differed; a broad fuzz of
    loads and set_epoch from another thread found it in 17 of 100 runs). set_epoch moves the others too now."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    mix = DALILeRobotMixture(paths, **options)
    for _ in zip(range(4), mix, strict=False):
        pass
    mix.set_epoch(2)
    state = mix.state_dict()
    read_on = [_keys(batch) for batch in mix]
    mix.close()
    fresh = DALILeRobotMixture(paths, **options)
    fresh.set_epoch(2)
    assert [_keys(batch) for batch in fresh] == read_on
    fresh.close()
    resumed = DALILeRobotMixture(paths, **options)
    resumed.load_state_dict(state)
    assert [_keys(batch) for batch in resumed] == read_on
    resumed.close()


# (in the second batch: its anchor's part, or the other's; where DALI's workers read them too)
@pytest.mark.parametrize(("at_call", "num_workers"), [(3, 0), (4, 0), (3, 2)])
def test_set_epoch_from_another_thread_while_a_batch_is_read_starts_the_new_epoch(
    make_ds, monkeypatch, at_call, num_workers
) -> None:
    """set_epoch(1) from another thread while a mixture batch was read (a part's read, DALI's next()): the anchor's
    pass read on through epoch 0, counting it on epoch 1 (all 16 batches read, the mixture then at epoch 2, its next
    pass not epoch 1's batches). Now the anchor's pass ends with IteratorClosedError naming set_epoch, the mixture
    restores nothing (which put the anchor back in epoch 0: the next pass read epoch 0's rest), and iterating again
    reads epoch 1's batches, as a mixture set to epoch 1 between passes does. set_epoch moves the other dataset by a
    load, so that dataset's own error (the one the mixture's is raised from) said 'load_state_dict() moved the stream',
    never called (at call 4); it names the mixture's set_epoch() now. The setter is waited for until it has moved every
    dataset's stream: at call 4 it then waits for the dataset's read (its pass's lock) to close its pipeline, and
    joined, it held the read off 60 s (the join's timeout), the set_epoch landing after the read."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    reference = DALILeRobotMixture(paths, **options)
    for _ in reference:
        pass
    reference.set_epoch(1)
    epoch_1 = [_keys(batch) for batch in reference]
    reference.close()
    mix = DALILeRobotMixture(paths, **{**options, "num_workers": num_workers})
    original, calls = DALIGenericIterator.__next__, [0]

    def set_meanwhile(self):
        calls[0] += 1
        if calls[0] == at_call:
            loads = [part._stream.loads for part in mix.datasets]
            setter = threading.Thread(target=mix.set_epoch, args=(1,))
            setter.start()
            while setter.is_alive() and any(p._stream.loads == n for p, n in zip(mix.datasets, loads, strict=True)):
                setter.join(timeout=0.01)
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", set_meanwhile)
    read = []
    with pytest.raises(IteratorClosedError, match=r"set_epoch\(\) moved the stream to sample 0 of epoch 1") as error:
        for batch in mix:
            read.append(_keys(batch))
    said = [str(error.value), str(error.value.__cause__ or "")]
    assert not any("load_state_dict()" in message for message in said), said
    assert len(read) == 1  # (the batch being read is dropped, also where its anchor part was read before: set_epoch
    # moves the other dataset too, whose read then ends as the anchor's does)
    assert mix.epoch == 1
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    assert [_keys(batch) for batch in mix] == epoch_1
    assert mix.epoch == 2
    mix.close()


@pytest.mark.parametrize("error", [ResumeStateError, KeyboardInterrupt])
def test_a_set_epoch_whose_second_datasets_move_fails_moves_no_dataset(make_ds, monkeypatch, error) -> None:
    """set_epoch(2) three batches into epoch 0 moved the anchor, then failed moving the other dataset (a refusal, a
    Ctrl-C): the error was raised, yet the anchor stood at the start of epoch 2 and the other at its batch 3 of epoch 0
    (a state taken then held them so; the next iter() read epoch 2). Now every dataset is put back where it stood, the
    error says so, and the mixture reads on as if set_epoch had not been called."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, seed=3, device="cpu", num_workers=0)
    reference = DALILeRobotMixture(paths, **options)
    whole = [_keys(batch) for batch in reference]
    reference.close()
    mix = DALILeRobotMixture(paths, **options)
    for _ in zip(range(3), mix, strict=False):
        pass
    before = mix.state_dict()
    other = mix.datasets[1 - mix.anchor]

    def fail(*args, **kwargs):
        raise error("injected")

    monkeypatch.setattr(other, "_load", fail)
    with pytest.raises(error) as raised:
        mix.set_epoch(2)
    assert mix.epoch == 0
    assert mix.state_dict()["datasets"] == before["datasets"]
    assert raised.value.__notes__ == [
        "the mixture's set_epoch(2) moved no dataset: each stands where it stood (epoch 0); the error above is what "
        "stopped it"
    ]
    monkeypatch.undo()
    assert [_keys(batch) for batch in mix] == whole[3:]
    mix.close()


def test_a_mixture_on_plain_cuda_builds_its_datasets_on_the_gpu_its_thread_set(make_ds, monkeypatch) -> None:
    """A mixture builds its datasets' iterators in threads, and a new thread's CUDA device is 0: in a process that
    called torch.cuda.set_device(1) (an ``mp.spawn`` rank, no LOCAL_RANK) each dataset resolved plain "cuda" to
    cuda:0 while the process (and its model) used cuda:1. Device facts mocked per thread, as CUDA keeps them."""
    roots = [
        make_ds(episodes=2, frames_per_episode=[6, 4], cameras=1, codec="h264", fps=10, gop=4, seed=seed)
        for seed in (0, 1)
    ]
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    devices = threading.local()  # (CUDA's current device is the calling thread's; a new thread's is 0)
    devices.current = 1
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(devices, "current", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(devices, "current", int(device)))
    mix = DALILeRobotMixture(roots, batch_size=2, device="cuda", num_workers=0, decode="cpu", rank=1, world_size=2)
    try:
        assert [str(part._device) for part in mix.datasets] == ["cuda:1", "cuda:1"]
    finally:
        mix.close()


def test_weights_near_but_not_at_a_fraction_split_by_their_ratio_over_the_largest() -> None:
    """1.5e-6 is only near 1/666667 (5e-7 relative, past _CLOSE): taken as that fraction, with 4.5e-6 near 4/888889,
    the ratio drifted below 1 : 3 and 6 split as 1 + 5; over the largest they are exactly 1/3 and 1, so 2 + 4."""
    assert batch_shares([1.5e-6, 4.5e-6], 6) == (2, 4)


def _unshuffled_keys(dataset: int, samples: list[int]) -> list[tuple[int, int, int]]:
    """``(dataset, episode, frame)`` of samples ``samples`` of one rank's unshuffled epoch (dataset order)."""
    flat = [(dataset, e, f) for e, n in enumerate(SPECS[dataset][0]) for f in range(n)]
    return [flat[s] for s in samples]


def test_an_anchor_epoch_short_of_a_whole_batch_starts_the_next_where_the_other_stands(make_ds) -> None:
    """Batches of 5 split 2 + 3: the anchor (29 frames at 3 a batch) gives 9 batches an epoch, its last 2 frames
    dropped, so the other dataset (16 frames at 2) reads 18 samples of its epochs in mixture epoch 0 and epoch 1
    starts it at sample 2 of its epoch 1 (counting 10 batches, rounded up, skipped 2 samples)."""
    paths = _datasets(make_ds)
    mix = DALILeRobotMixture(paths, batch_size=5, shuffle=False, device="cpu", num_workers=0)
    assert (mix.batch_shares, mix.anchor, len(mix)) == ((2, 3), 1, 9)
    taken: list[tuple[int, int, int]] = []
    _run(mix, 2, taken)
    mix.close()
    assert [k for k in taken if k[0] == 0] == _unshuffled_keys(0, [*range(16), *range(16), *range(4)])
    assert [k for k in taken if k[0] == 1] == _unshuffled_keys(1, [*range(27), *range(27)])


def test_set_epoch_of_the_epoch_in_progress_moves_no_dataset(make_ds) -> None:
    """A training loop's set_epoch(0) four batches into epoch 0 (or after resuming there) leaves every dataset where
    it stands: the other dataset's next part is its samples 12-14, not its epoch's first again."""
    paths = _datasets(make_ds)
    mix = DALILeRobotMixture(paths, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    assert (mix.batch_shares, mix.anchor, len(mix)) == ((1, 3), 0, 16)
    head = [k for _, batch in zip(range(4), mix, strict=False) for k in _keys(batch)]
    mix.set_epoch(0)
    assert [part.state_dict()["samples_consumed"] for part in mix.datasets] == [4, 12]
    rest = [k for batch in mix for k in _keys(batch)]
    mix.close()
    # The other dataset's 29 frames at 3 a batch: 9 batches an epoch (27 samples), then its next epoch.
    other = [*range(27), *range(21)]
    assert [k for k in head + rest if k[0] == 1] == _unshuffled_keys(1, other)
    assert [k for k in head + rest if k[0] == 0] == _unshuffled_keys(0, list(range(16)))


def test_set_epoch_back_to_an_epoch_resumed_on_other_ranks_starts_the_other_dataset_where_it_starts(make_ds) -> None:
    """Resumed on 1 rank from 2 ranks' state 5 batches into epoch 1, the anchor stands at sample 0 of what the old
    ranks left of epoch 1 (prior segments): not at that epoch's start. A later set_epoch(1) starts the other dataset
    where mixture epoch 1 starts it on 1 rank (its sample 21: of the 16 batches of 3 in mixture epoch 0, 9 take 27 of
    its epoch 0's 29 frames, 7 take 21 of its epoch 1), not where it stood when the state was loaded."""
    paths = _datasets(make_ds)
    kwargs = dict(batch_size=4, shuffle=False, device="cpu", num_workers=0)
    states = []
    for rank in (0, 1):
        mix = DALILeRobotMixture(paths, rank=rank, world_size=2, **kwargs)
        _run(mix, 1, [])
        batches = iter(mix)
        for _ in range(5):
            next(batches)
        states.append(mix.state_dict())
        mix.close()
    mix = DALILeRobotMixture(paths, **kwargs)
    mix.load_state_dict(states[0])
    assert mix.epoch == 1 and mix.datasets[0].state_dict()["prior_segments"]
    _run(mix, 1, [])
    assert mix.epoch == 2
    mix.set_epoch(1)
    first = _keys(next(iter(mix)))
    mix.close()
    assert [k for k in first if k[0] == 1] == _unshuffled_keys(1, [21, 22, 23])


def test_each_dataset_of_a_mixture_draws_from_its_own_seed(make_ds) -> None:
    """One dataset twice, shuffled, at equal shares: each dataset's seed derives from the mixture's and its place, so
    the two read its frames in other orders (given the mixture's seed alike, they read the same frames in every
    batch)."""
    path = _datasets(make_ds)[0]
    mix = DALILeRobotMixture([path, path], batch_size=4, seed=3, device="cpu", num_workers=0)
    assert mix.batch_shares == (2, 2)
    seeds = [part["seed"] for part in mix.state_dict()["datasets"]]
    assert seeds == [int(np.random.SeedSequence([3, i]).generate_state(1)[0]) for i in range(2)]
    taken: list[tuple[int, int, int]] = []
    _run(mix, 1, taken)
    mix.close()
    orders = [[k[1:] for k in taken if k[0] == i] for i in range(2)]
    assert sorted(orders[0]) == sorted(orders[1]) == [(e, f) for e, n in enumerate(SPECS[0][0]) for f in range(n)]
    assert orders[0] != orders[1]


def test_one_mapping_of_dataset_options_for_every_dataset_is_refused(tmp_path: Path) -> None:
    """A mapping as long as the datasets are many (two options, two datasets) is not one per dataset: iterated, its
    keys were taken for the datasets' mappings (ValueError from dict('decode'))."""
    paths = [tmp_path / "a", tmp_path / "b"]  # (never opened)
    with pytest.raises(TypeError, match=r"one mapping \(or None\) per dataset \(2\), got \{'decode'"):
        DALILeRobotMixture(paths, dataset_options={"decode": "cpu", "tolerance_s": 0.1}, device="cpu")
