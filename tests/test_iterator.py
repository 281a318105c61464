"""DALILeRobotIterator in CPU mode: LeRobot-semantics parity, epochs, partial batches, resume, worker errors.

Expected values are computed here independently: tabular rows from the generator's formulas, windows by
hand (clamp + pad), frames by reading each decoded frame's marker and by a full sequential PyAV decode.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import itertools
import json
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from lerobot_dali import camera_plan
from lerobot_dali import iterator as iterator_module
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend
from lerobot_dali.errors import (
    CodecUnsupportedError,
    CudaUnavailableError,
    DataFileError,
    DatasetError,
    DeltaTimestampsError,
    EpisodeMetadataError,
    FrameTimestampError,
    IteratorClosedError,
    MissingDataFileError,
    ResumeStateError,
    ShardingError,
    VideoDecodeError,
)
from lerobot_dali.frame_lookup import TimestampSource
from lerobot_dali.frame_marker import read_full_marker
from lerobot_dali.generate import expected_action, expected_state, expected_task_index, task_name
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.mixture import DALILeRobotMixture
from lerobot_dali.packet_index import build_packet_index
from tests.conftest import shared_dataset
from tests.video_fixtures import count_decodes, reference_frames, write_undecodable_mp4

LENGTHS = [5, 1, 7, 4, 6]
FPS = 10
DELTAS = {
    "observation.state": [-0.1, 0.0],
    "action": [0.0, 0.1, 0.2],
    "observation.images.cam0": [-0.2, 0.0],
}


def _dataset(make_ds, codec: str, size: tuple[int, int] | None = None, **spec: Any) -> Path:
    """The tests' dataset; ``size`` only for GPU tests (NVDEC's minimum sizes), so CPU tests share one; ``spec``: other
    arguments of ``make_dataset`` (``version="v2.1"``)."""
    extra = spec if size is None else {"size": size, **spec}
    return make_ds(
        episodes=5, frames_per_episode=LENGTHS, cameras=2, codec=codec, fps=FPS, episodes_per_file=2, gop=4, **extra
    )


def _as_hwc_uint8(frame: torch.Tensor) -> np.ndarray:
    return (frame.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def _samples(it: DALILeRobotIterator) -> list[dict]:
    out = []
    for batch in it:
        for i in range(len(batch["index"])):
            out.append({k: v[i] for k, v in batch.items()})
    return out


def _check_sample(
    s: dict,
    size: tuple[int, int] = (96, 128),
    size1: tuple[int, int] | None = None,
    *,
    lengths: list[int] = LENGTHS,
    deltas: dict[str, list[float]] = DELTAS,
) -> None:
    """Every value of one sample against LeRobot semantics computed by hand; camera 1's frames ``size1`` (where it
    differs from camera 0's ``size``); a dataset of episodes ``lengths`` read with ``deltas`` (keys as DELTAS')."""
    ep, f = int(s["episode_index"]), int(s["frame_index"])
    n = lengths[ep]
    assert int(s["index"]) == sum(lengths[:ep]) + f
    assert float(s["timestamp"]) == pytest.approx(f / FPS, abs=1e-6)
    assert int(s["task_index"]) == expected_task_index(ep) and s["task"] == task_name(expected_task_index(ep))
    for key in ("index", "episode_index", "frame_index", "task_index"):
        assert s[key].dtype == torch.int64, key
    assert s["timestamp"].dtype == torch.float32
    for key, offsets, formula, dim in (
        ("observation.state", deltas["observation.state"], expected_state, 6),
        ("action", deltas["action"], expected_action, 7),
    ):
        query = [f + round(d * FPS) for d in offsets]
        rows = [min(max(q, 0), n - 1) for q in query]
        np.testing.assert_array_equal(s[key].numpy(), np.stack([formula(ep, r, dim) for r in rows]))
        assert s[f"{key}_is_pad"].tolist() == [not 0 <= q < n for q in query]
        assert s[f"{key}_is_pad"].dtype == torch.bool
    query = [f + round(d * FPS) for d in deltas["observation.images.cam0"]]
    frames0 = s["observation.images.cam0"]
    assert frames0.shape == (len(query), 3, *size) and frames0.dtype == torch.float32
    assert [tuple(read_full_marker(_as_hwc_uint8(x))) for x in frames0] == [
        (ep, min(max(q, 0), n - 1), 0) for q in query
    ]
    assert s["observation.images.cam0_is_pad"].tolist() == [not 0 <= q < n for q in query]
    frame1 = s["observation.images.cam1"]  # no deltas: squeezed to (C, H, W)
    assert frame1.shape == (3, *(size1 or size))
    assert tuple(read_full_marker(_as_hwc_uint8(frame1))) == (ep, f, 1)


def assert_each_frame_read_once_as_its_own(
    root: Path,
    episodes: Sequence[int],
    *,
    selected: bool = False,
    sizes: tuple[tuple[int, int], tuple[int, int]] = ((96, 128), (96, 128)),
    lengths: list[int] = LENGTHS,
    deltas: dict[str, list[float]] = DELTAS,
    route: str | None = None,
    **options: Any,
) -> None:
    """An epoch of ``root`` (``episodes=`` those where ``selected``, else the whole dataset, which holds ``episodes``;
    other iterator ``options``) holds each frame of ``episodes`` once, in episode order unshuffled and in another
    order shuffled, every sample its own episode's (index, state, action, task, ``deltas`` windows and both cameras'
    markers by hand, camera k's frames ``sizes[k]``; episode e of the generated set ``lengths[e]`` frames long), every
    camera on ``route`` where given."""
    every = [(e, f) for e in episodes for f in range(lengths[e])]
    for shuffle in (False, True):
        it = DALILeRobotIterator(
            root, batch_size=4, delta_timestamps=deltas, shuffle=shuffle, seed=1, episode_pool_size=2,
            device="cpu", num_workers=0, drop_last=False, episodes=list(episodes) if selected else None, **options,
        )  # fmt: skip
        assert route is None or {r.value for r in it.routes.values()} == {route}
        samples = _samples(it)
        it.close()
        keys = [(int(s["episode_index"]), int(s["frame_index"])) for s in samples]
        assert keys == every if not shuffle else Counter(keys) == Counter(every) and keys != every
        for s in samples:
            _check_sample(s, *sizes, lengths=lengths, deltas=deltas)


@pytest.mark.parametrize(
    ("codec", "route"),
    [("vp9", "dali_cpu"), ("av1", "cpu_fallback"), ("h264", "cpu_fallback"), ("hevc", "cpu_fallback")],
)
def test_cpu_parity_in_dataset_order(make_ds, codec: str, route: str) -> None:
    it = DALILeRobotIterator(
        _dataset(make_ds, codec), batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu",
        num_workers=0, drop_last=False,
    )  # fmt: skip
    assert {r.value for r in it.routes.values()} == {route}
    assert len(it) == 6  # 23 samples in batches of 4, last one partial
    samples = _samples(it)
    assert [(int(s["episode_index"]), int(s["frame_index"])) for s in samples] == [
        (e, f) for e, n in enumerate(LENGTHS) for f in range(n)
    ]
    for s in samples:
        _check_sample(s)


def assert_frames_equal_an_independent_decode(root: Path, samples: list[dict]) -> None:
    """Each sample's ``observation.images.cam1`` frame (uint8, no deltas) equals its frame in an independent full PyAV
    decode of :func:`_dataset`'s video file under ``root`` (two episodes a file)."""
    refs: dict[Path, list[np.ndarray]] = {}
    for s in samples:
        ep, f = int(s["episode_index"]), int(s["frame_index"])
        path = root / f"videos/observation.images.cam1/chunk-000/file-{ep // 2:03d}.mp4"
        if path not in refs:
            refs[path] = [frame for _, frame in sorted(reference_frames(path).items())]
        expected = refs[path][sum(LENGTHS[ep // 2 * 2 : ep]) + f]
        np.testing.assert_array_equal(s["observation.images.cam1"].permute(1, 2, 0).numpy(), expected)


def test_worker_decoded_frames_equal_an_independent_full_decode(make_ds) -> None:
    root = _dataset(make_ds, "h264")
    it = DALILeRobotIterator(
        root, batch_size=8, shuffle=False, device="cpu", num_workers=0, drop_last=False, return_uint8=True
    )
    samples = _samples(it)
    assert len(samples) == sum(LENGTHS)
    assert_frames_equal_an_independent_decode(root, samples)


@pytest.mark.parametrize("color", ["worker", "planes"])
def test_samples_in_one_gop_decode_it_once(make_ds, monkeypatch: pytest.MonkeyPatch, color: str) -> None:
    """A batch's samples of one local file with closed GOPs are decoded as one request: with a 30-frame GOP,
    dataset order and batches of 8, each batch asks the decoder once, also across a GOP or episode boundary,
    never once per sample; every frame is still its own sample's."""
    from lerobot_dali.cpu_decode import ColorConversion, CpuDecodeOptions

    root = make_ds(episodes=2, frames_per_episode=[45, 35], cameras=1, codec="h264", fps=FPS, gop=30)
    calls = count_decodes(monkeypatch)
    conversion = ColorConversion.GRAPH if color == "planes" else ColorConversion.WORKER
    it = DALILeRobotIterator(
        root, batch_size=8, shuffle=False, device="cpu", num_workers=0, drop_last=False, return_uint8=True,
        cpu_decode=CpuDecodeOptions(color_conversion=conversion),
    )  # fmt: skip
    seen = 0
    for batch in it:
        for i in range(len(batch["index"])):
            frame = batch["observation.images.cam0"][i].permute(1, 2, 0).numpy()
            ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
            assert tuple(read_full_marker(frame)) == (ep, f, 0)
            seen += 1
    assert seen == 80
    # One file of 80 frames, keyframes at 0, 30 and 60; batches of 8 in dataset order. Batch 3 (24-31) and
    # batch 7 (56-63) straddle a keyframe; batch 5 (40-47) spans both episodes inside one GOP. Later calls,
    # if any, are the next epoch's batches that DALI's prefetch already asked for.
    assert calls[:12] == [8] * 12, calls


def test_the_keyframe_a_request_starts_from() -> None:
    """Remote requests of a batch group by it."""
    from tests.test_clips import CLOSED, OPEN

    # CLOSED: keyframes at decode positions 0 (display 0) and 5 (display 5); OPEN: 0 and 4 (display 6).
    assert CLOSED.start_keyframe([1, 8]) == CLOSED.start_keyframe([4]) == 0 and CLOSED.start_keyframe([8, 5]) == 5
    # Display 4 and 5 are leading pictures of the keyframe at 4: decoding them starts at 0 (plan_clip), but the
    # keyframe at or before them in decode order is 4.
    assert OPEN.start_keyframe([3]) == 0 and OPEN.start_keyframe([8, 5]) == 4


def test_dali_cpu_decode_is_close_to_an_independent_decode(make_ds) -> None:
    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(root, batch_size=23, shuffle=False, device="cpu", num_workers=0, return_uint8=True)
    batch = next(iter(it))
    ref = sorted(reference_frames(root / "videos/observation.images.cam1/chunk-000/file-001.mp4").items())
    for i in range(len(batch["index"])):
        ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
        if ep in (2, 3):
            got = batch["observation.images.cam1"][i].permute(1, 2, 0).numpy().astype(int)
            expected = ref[(0 if ep == 2 else LENGTHS[2]) + f][1].astype(int)
            assert np.abs(got - expected).mean() < 2.0  # different YUV->RGB conversions, same decoded frame


def test_shuffled_epochs_cover_every_frame_once_and_differ(make_ds) -> None:
    it = DALILeRobotIterator(
        _dataset(make_ds, "vp9"), batch_size=4, shuffle=True, seed=3, episode_pool_size=2, device="cpu",
        num_workers=2, drop_last=False,
    )  # fmt: skip
    orders = []
    for epoch in range(2):
        it.set_epoch(epoch)
        keys = [(int(s["episode_index"]), int(s["frame_index"])) for s in _samples(it)]
        assert Counter(keys) == Counter((e, f) for e, n in enumerate(LENGTHS) for f in range(n))
        orders.append(keys)
    assert orders[0] != orders[1]
    it.close()


def test_episode_split_reads_exactly_its_episodes_across_ranks(make_ds) -> None:
    # LeRobot's episodes=: a train/validation split. Values keep the dataset's own indices (checked by hand).
    root = _dataset(make_ds, "h264")
    split = {"train": [4, 0, 2], "val": [1, 3]}
    for name, chosen in split.items():
        per_rank = []
        for rank in (0, 1):
            it = DALILeRobotIterator(
                root, batch_size=2, delta_timestamps=DELTAS, shuffle=True, seed=5, device="cpu", num_workers=2,
                drop_last=False, rank=rank, world_size=2, episodes=chosen,
            )  # fmt: skip
            samples = _samples(it)
            it.close()
            for s in samples:
                _check_sample(s)
            per_rank.append({(int(s["episode_index"]), int(s["frame_index"])) for s in samples})
        # ranks are disjoint (the shorter one repeats some of its own samples to keep batch counts equal)
        assert not per_rank[0] & per_rank[1], name
        assert per_rank[0] | per_rank[1] == {(e, f) for e in chosen for f in range(LENGTHS[e])}, name
    with pytest.raises(DatasetError, match=r"episodes \[7\] are not in this dataset"):
        DALILeRobotIterator(root, batch_size=2, device="cpu", episodes=[0, 7])


def test_episode_pieces_let_more_ranks_than_episodes_read_each_frame_once(make_ds) -> None:
    """Two episodes (7 and 6 frames) on four ranks, dealt in pieces of at most 3 frames (7 -> 2 + 2 + 3, 6 -> 3 + 3):
    windows still reach across pieces and pad at the episodes' own edges (``_check_sample``)."""
    root = _dataset(make_ds, "vp9")
    options = dict(batch_size=2, delta_timestamps=DELTAS, seed=5, device="cpu", episodes=[2, 4], drop_last=False)
    with pytest.raises(ShardingError, match="episode_piece_frames"):
        DALILeRobotIterator(root, num_workers=0, rank=0, world_size=4, **options).set_epoch(0)
    per_rank, counts = [], set()
    for rank in range(4):
        it = DALILeRobotIterator(root, num_workers=1, rank=rank, world_size=4, episode_piece_frames=3, **options)
        samples = _samples(it)
        it.close()
        for s in samples:
            _check_sample(s)
        counts.add(len(samples))
        per_rank.append([(int(s["episode_index"]), int(s["frame_index"])) for s in samples])
    assert counts == {4}  # 13 frames: 4, 3, 3, 3 (greedy on 3, 3, 3, 2, 2), padded to 4 each
    distinct = [set(keys) for keys in per_rank]
    assert sum(len(keys) for keys in distinct) == 13  # disjoint ranks
    assert set().union(*distinct) == {(e, f) for e in (2, 4) for f in range(LENGTHS[e])}


@pytest.mark.parametrize(("first", "last"), [(0, 2), (1, 3)])
def test_frames_left_out_of_sampling_still_fill_windows(make_ds, first: int, last: int) -> None:
    """``drop_n_first_frames``/``drop_n_last_frames`` (LeRobot's EpisodeAwareSampler): two ranks with workers
    sample each kept frame once, episodes no longer than both give none, and the kept frames' windows still read
    the frames left out, padding only at the episodes' own edges (``_check_sample``). A resume needs the same."""
    root = _dataset(make_ds, "vp9")
    options = dict(batch_size=2, delta_timestamps=DELTAS, seed=3, device="cpu", drop_last=False, num_workers=1,
                   world_size=2, drop_n_first_frames=first, drop_n_last_frames=last)  # fmt: skip
    taken = []
    for rank in range(2):
        it = DALILeRobotIterator(root, rank=rank, **options)
        samples = _samples(it)
        natural = int(it._stream.order.rank_frame_counts(0)[rank])  # (then PAD repeats)
        it.close()
        for s in samples:
            _check_sample(s)
        taken += [(int(s["episode_index"]), int(s["frame_index"])) for s in samples[:natural]]
    kept = [(e, f) for e, n in enumerate(LENGTHS) for f in range(first, n - last)]
    assert sorted(taken) == kept
    state = DALILeRobotIterator(root, rank=0, **options).state_dict()
    with pytest.raises(ResumeStateError, match=f"saved with drop_n_last_frames={last}, but .* drop_n_last_frames=0"):
        DALILeRobotIterator(root, rank=0, **{**options, "drop_n_last_frames": 0}).load_state_dict(state)
    with pytest.raises(ShardingError, match="drop_n_first_frames=4 and drop_n_last_frames=4 leave out the rest"):
        DALILeRobotIterator(root, rank=0, **{**options, "drop_n_first_frames": 4, "drop_n_last_frames": 4})


def test_unbalanced_ranks_evaluate_every_frame_once(make_ds, caplog) -> None:
    """``rank_balance="none"`` (evaluation): three ranks with workers read the 23 frames in unequal counts, each
    frame once, with no padding repeated, and say so in the log. A mixture refuses it."""
    root = _dataset(make_ds, "vp9")
    options = dict(batch_size=3, delta_timestamps=DELTAS, seed=2, device="cpu", drop_last=False, num_workers=1,
                   world_size=3, rank_balance="none")  # fmt: skip
    taken, lengths = [], []
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        for rank in range(3):
            it = DALILeRobotIterator(root, rank=rank, **options)
            lengths.append((len(it), it.epoch_samples(0)))
            samples = _samples(it)
            it.close()
            for s in samples:
                _check_sample(s)
            taken += [(int(s["episode_index"]), int(s["frame_index"])) for s in samples]
    assert sorted(taken) == [(e, f) for e, n in enumerate(LENGTHS) for f in range(n)]
    counts = [n for _, n in lengths]
    assert sum(counts) == 23 and len(set(counts)) > 1
    assert [b for b, _ in lengths] == [-(-n // 3) for n in counts]  # (batches of 3, the last short)
    assert "rank_balance='none': ranks read" in caplog.text
    with pytest.raises(ValueError, match="rank_balance='none'.*not a mixture"):
        DALILeRobotMixture([root, root], rank_balance="none", device="cpu")


def test_unbalanced_ranks_with_drop_last_are_warned_of_the_frames_left_out(make_ds, caplog) -> None:
    """``rank_balance="none"`` is for evaluating every frame once, which the default ``drop_last=True`` silently
    did not: each rank left out its last samples short of a batch (here 23 frames on one rank, batches of 4: 3)."""
    root = _dataset(make_ds, "vp9")
    options = dict(batch_size=4, device="cpu", num_workers=0, rank=0, world_size=1, rank_balance="none")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, **options)
    assert sum(len(b["index"]) for b in it) == 20
    it.close()
    assert "only with drop_last=False" in caplog.text and "(3 of rank 0's in epoch 0)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.iterator"):
        DALILeRobotIterator(root, drop_last=False, **options).close()
    assert "drop_last" not in caplog.text
    # Batches that divide the epoch leave nothing out, and one rank's counts are the same every epoch: no warning.
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        DALILeRobotIterator(root, **{**options, "batch_size": 23}).close()
    assert "drop_last" not in caplog.text
    # Several ranks: batches that divide rank 0's epoch leave nothing out of it, but its count changes between
    # epochs (said at INFO; iterator line 318, reached by no test), and a later epoch's does not divide.
    two = {**options, "world_size": 2}
    first = DALILeRobotIterator(root, **{**two, "batch_size": 1})
    counts = [first.epoch_samples(epoch) for epoch in range(6)]
    first.close()
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        DALILeRobotIterator(root, **{**two, "batch_size": counts[0]}).close()
    assert "rank 0's epoch 0 fills whole batches, but the ranks' counts change between epochs" in caplog.text
    assert "only with drop_last=False" not in caplog.text and any(n % counts[0] for n in counts[1:])


def test_a_long_pipeline_build_says_it_starts_the_workers_and_how_long_it_took(make_ds, caplog, monkeypatch) -> None:
    """DALI starts the worker processes inside the pipeline's build, each importing DALI and lerobot-dali: 1-5 s
    for 2-4 workers on 2 busy cores, with no word. Past the delay (here none) the build says so, and when it ends,
    how long it took; a build done sooner (the default delay, no workers) says nothing, nor does a node's other
    ranks'."""
    root = _dataset(make_ds, "vp9")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(iterator_module, "BUILD_PROGRESS_DELAY_S", 0.0, raising=False)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=1)
        try:
            next(iter(it))
        finally:
            it.close()
    said = [r.getMessage() for r in caplog.records if "building the DALI pipeline" in r.getMessage()]
    what = f"lerobot-dali: starting 1 worker process and building the DALI pipeline of {root}"
    assert len(said) == 2 and said[0] == f"{what}...", said
    assert re.fullmatch(rf"{re.escape(what)}: done in \d+\.\d s", said[1]), said
    assert not [t for t in threading.enumerate() if t.name == "lerobot-dali-wait-line"]
    caplog.clear()
    monkeypatch.setenv("LOCAL_RANK", "1")  # (a node's second rank: its first says it)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=1, rank=1, world_size=2)
        try:
            next(iter(it))
        finally:
            it.close()
    assert "building the DALI pipeline" not in caplog.text
    caplog.clear()
    monkeypatch.undo()  # (the default delay: a build without workers takes a moment)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0)
        try:
            next(iter(it))
        finally:
            it.close()
    assert "building the DALI pipeline" not in caplog.text


def test_opening_options_with_an_open_reader_are_refused_not_ignored(make_ds) -> None:
    """cameras=, keys=, revision=, data_files_root= and episodes= apply while opening; with a reader already
    open they were silently dropped (cameras=["cam0"] read every camera). The error said "episodes= apply while
    opening"; it says one option as one, several as several."""
    from lerobot_dali.dataset_reader import open_dataset

    reader = open_dataset(_dataset(make_ds, "vp9"))
    for option in ({"cameras": ["observation.images.cam0"]}, {"keys": ["action"]}, {"revision": "main"},
                   {"data_files_root": "/elsewhere"}, {"episodes": [0]}):  # fmt: skip
        name = next(iter(option))
        said = rf"^{name}= is an option for opening a dataset, but this reader is open already and would ignore it: "
        with pytest.raises(ValueError, match=said + "pass it to open_dataset, or pass the dataset's path here"):
            DALILeRobotIterator(reader, device="cpu", **option)
    both = r"^cameras=, keys= and episodes= are options for opening a dataset, .* would ignore them: pass them to "
    with pytest.raises(ValueError, match=both):
        DALILeRobotIterator(reader, device="cpu", cameras=["observation.images.cam0"], keys=["action"], episodes=[0])


def test_several_datasets_given_as_one_are_refused_naming_the_ways_to_read_several(make_ds) -> None:
    """A list (or tuple) of datasets is refused before anything is opened, naming concat_datasets and
    DALILeRobotMixture (iterator_arguments line 80, reached by no test); open_dataset's own error said neither."""
    root = make_ds(episodes=2, frames_per_episode=10, cameras=0)
    for several in ([root, root], (root,)):
        with pytest.raises(TypeError, match=r"^dataset is one dataset; .*concat_datasets\(\[\.\.\.\]\).*"
                           r"DALILeRobotMixture\(\[\.\.\.\]\)"):  # fmt: skip
            DALILeRobotIterator(several, device="cpu")


def test_workers_that_did_not_start_are_said_with_what_spawn_needs_and_lose_no_sample(make_ds, monkeypatch) -> None:
    """DALI's 'Workers initialization failed' at the build becomes a WorkerProcessError saying what spawn needs of a
    script (iterator lines 533-539, reached by no test; test_worker_errors fails a build with another error, raised
    as it is). The failed build costs no sample: the next pass builds and reads the whole epoch once."""
    said = (
        r"^DALI's 1 worker process did not start \(Workers initialization failed: a worker exited\)\. .*"
        r'`if __name__ == "__main__":`'
    )
    _a_failed_build_is_said_and_costs_no_sample(
        make_ds, monkeypatch, RuntimeError("Workers initialization failed: a worker exited"), 1, said
    )


def _a_failed_build_is_said_and_costs_no_sample(
    make_ds, monkeypatch, error: Exception, num_workers: int, said: str
) -> None:
    """The pipeline's build raising ``error`` with ``num_workers`` workers: the pass raises WorkerProcessError
    matching ``said``, holds no pipeline, and the next pass reads the 20 samples once."""
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali.errors import WorkerProcessError

    def failing(pipe: Pipeline) -> None:
        raise error

    root = make_ds(episodes=2, frames_per_episode=10, cameras=0)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=num_workers, drop_last=False)
    build = Pipeline.build
    monkeypatch.setattr(Pipeline, "build", failing)
    with pytest.raises(WorkerProcessError, match=said):
        iter(it)
    assert it._pipeline is None and it._dali_iter is None
    monkeypatch.setattr(Pipeline, "build", build)
    assert [i for batch in it for i in batch["index"].tolist()] == list(range(20))
    it.close()


def _open_file_limit(monkeypatch, soft: int, hard: int) -> None:
    """This process's RLIMIT_NOFILE read as (soft, hard), without lowering the real one."""
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda r: (soft, hard) if r == resource.RLIMIT_NOFILE else real(r))


def test_more_workers_than_open_files_allow_are_refused_before_the_dataset_opens(make_ds, monkeypatch) -> None:
    """num_workers=100000 failed at the first pass with a bare "Too many open files" from a socketpair in DALI's pool
    (soft limit 20,000; each worker holds 2 files in this process, /proc/self/fd measured 5, 7, 11, 19 more for 1, 2,
    4, 8 workers). A count past the limit is refused when the iterator is built, before its dataset is opened, naming
    the count and the `ulimit -n` that fits it; the largest count that fits is taken."""
    root = make_ds(episodes=2, frames_per_episode=10, cameras=0)
    open_now = len(os.listdir("/proc/self/fd")) - 1
    _open_file_limit(monkeypatch, open_now + 2 * 3, 10_000)
    said = (
        rf"^num_workers=4 cannot start: each DALI worker holds at least 2 files open in this process \(8 in all\), but "
        rf"{open_now} of its limit of {open_now + 6} are open already; pass fewer workers .*`ulimit -n {open_now + 14}`"
        " in the shell that starts training$"
    )
    with pytest.raises(ValueError, match=said):
        DALILeRobotIterator(root / "not-a-dataset", device="cpu", num_workers=4)
    _open_file_limit(monkeypatch, open_now + 6, open_now + 10)
    with pytest.raises(
        ValueError, match=r"`ulimit -n \d+` .* \(past the hard limit of \d+, which only an administrator"
    ):
        DALILeRobotIterator(root, device="cpu", num_workers=4)
    DALILeRobotIterator(root, device="cpu", num_workers=3).close()


def test_workers_out_of_open_files_at_the_start_are_said_with_the_fix_and_lose_no_sample(make_ds, monkeypatch) -> None:
    """Where the files run out at the start all the same (other files opened since, the pool's own), DALI's bare
    OSError (errno 24) becomes a WorkerProcessError naming the count and the fix; the next pass reads the epoch once."""
    import errno

    said = (
        r"^DALI's 2 worker processes did not start: this process ran out of open files \(\[Errno 24\] Too many open "
        r"files\); pass fewer workers .*`ulimit -n \d+`"
    )
    error = OSError(errno.EMFILE, "Too many open files")
    _a_failed_build_is_said_and_costs_no_sample(make_ds, monkeypatch, error, 2, said)


def test_dali_decodes_a_windows_repeated_frames_once(make_ds) -> None:
    """DALI's decoder decodes a repeated index again from its keyframe (a measured +90% per repeat of a GOP-60
    frame), and windows repeat their edge frame as padding: the clip camera asks for its distinct frames and the
    graph copies them into window order. (Frames against the reference: test_cpu_parity_in_dataset_order.)"""
    from lerobot_dali.batch_source import BatchSource
    from lerobot_dali.dali_graph import FieldKind

    it = DALILeRobotIterator(_dataset(make_ds, "vp9"), batch_size=2, delta_timestamps=DELTAS, shuffle=False,
                             device="cpu", num_workers=0)  # fmt: skip
    next(iter(it))  # the pipeline (and its source's spec) is built on first use
    source = BatchSource(it._spec)
    kinds = [f.kind for f in source.fields]
    at = kinds.index(FieldKind.CLIP)
    assert kinds[at : at + 3] == [FieldKind.CLIP, FieldKind.CLIP_FRAMES, FieldKind.CLIP_ORDER]
    out = source.assemble(np.array([0, 0]), np.array([0, 3]))  # frame 0: [0, 0] padded; frame 3: [1, 3]
    wanted, order = out[at + 1], out[at + 2]
    assert [len(w) for w in wanted] == [1, 2] and [o.tolist() for o in order] == [[0, 0], [0, 1]]
    assert all(np.all(np.diff(w) > 0) for w in wanted)
    it.close()


def test_drop_last_gives_full_batches_only(make_ds) -> None:
    it = DALILeRobotIterator(_dataset(make_ds, "vp9"), batch_size=4, shuffle=False, device="cpu", num_workers=0)
    assert len(it) == 5  # 23 samples: the trailing 3 are dropped
    sizes = [len(b["index"]) for b in it]
    assert sizes == [4] * 5


def test_dali_threads_reach_the_pipeline(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, dali_threads=3)
    next(iter(it))
    assert it._dali_iter._pipes[0].num_threads == 3
    it.close()
    # automatic: what the rank's CPUs leave after the workers, 2 to 8
    for cpus, workers, expected in [(16, 12, 4), (2, 2, 2), (64, 4, 8)]:
        monkeypatch.setattr(iterator_module, "cpus_per_local_rank", lambda cpus=cpus: cpus)
        assert iterator_module.default_dali_threads(workers) == expected
    for bad, error in ((0, ValueError), (2.5, TypeError), ("4", TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"dali_threads \(None: automatic\) must be"):
            DALILeRobotIterator(root, device="cpu", dali_threads=bad)


@pytest.mark.parametrize(
    ("cpus", "workers", "said_counts", "advice"),
    [
        (4, 2, "2 worker processes, with 4 CPUs", "raise num_workers toward the CPU count"),
        (2, 2, "2 worker processes, with 2 CPUs", "more CPUs (fewer ranks per node): its workers already match"),
        (1, 1, "1 worker process, with 1 CPU for", "more CPUs (fewer ranks per node): its workers already match"),
        (1, 2, "2 worker processes, with 1 CPU for", "its workers already outnumber its CPUs"),
    ],
)
def test_the_cpu_decoding_line_asks_for_more_workers_only_where_cpus_are_left(
    make_ds, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cpus, workers, said_counts, advice
) -> None:
    """8 ranks of 8 workers on a 64-core node were told to raise num_workers toward the CPU count (8), as were 2
    workers with 1 CPU: more workers than CPUs only take turns on them. As many workers as CPUs were told "more
    workers than CPUs decode no faster", as if they outnumbered them; and 1 was "1 worker processes", "1 CPUs"."""
    monkeypatch.setattr(camera_plan, "cpus_per_local_rank", lambda: cpus)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.camera_plan"):
        DALILeRobotIterator(_dataset(make_ds, "av1"), batch_size=4, device="cpu", num_workers=workers).close()
    said = [r.getMessage() for r in caplog.records if "decoded on the CPU by" in r.getMessage()]
    assert len(said) == 1 and f"decoded on the CPU by {said_counts}" in said[0] and advice in said[0], said
    assert ("raise num_workers" in said[0]) == (cpus > workers)
    # The condition comes before the advice: "... so give this rank more CPUs (fewer ranks per node): its workers
    # already match its CPUs, and workers beyond the CPU count decode no faster if the loop waits for batches" hung
    # it on the wrong clause.
    advice_said = said[0].partition("so if the loop waits for batches, ")[2]
    assert advice_said.startswith(("raise num_workers", "give this rank more CPUs")), said
    assert said[0].endswith(("toward the CPU count", "decode no faster")), said


@pytest.mark.parametrize(
    ("env", "ranks", "said"),
    [
        ({}, {"rank": 0, "world_size": 1}, "rank 0/1 (rank and world_size passed to the iterator)"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, {}, "rank 1/2 (from the launcher's RANK and WORLD_SIZE variables)"),
    ],
)
def test_the_build_line_names_the_dataset_and_where_its_rank_came_from(
    make_ds, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, env, ranks, said
) -> None:
    """It said "rank 0/1 (arguments): 60 samples per epoch", a mixture one such line per dataset, none named."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    root = _dataset(make_ds, "av1")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, **ranks)
        it.close()
    lines = [r.getMessage() for r in caplog.records if "samples per epoch" in r.getMessage()]
    threads = f"{it._dali_threads} DALI thread{'' if it._dali_threads == 1 else 's'}"  # (1 DALI thread, not threads)
    repeated = it._stream.order.repeated_samples(0)  # (rank 1 of 2: the next test's)
    again = f" ({repeated} of them its first ones again, to match the fullest rank)" if repeated else ""
    assert lines == [
        f"{it.reader.location.description}: {said}: {it._stream.num_samples()} samples per epoch{again}, routes "
        f"{ {k: r.value for k, r in it.routes.items()} }, {threads}"
    ]
    assert str(root) in lines[0]


def test_the_build_line_says_how_many_of_a_ranks_samples_repeat(make_ds, caplog: pytest.LogCaptureFixture) -> None:
    """Ranks owning unequal frames read as many samples as the fullest (RankBalance.PAD), the others their first ones
    again: the build line said only the count, the repeats unsaid (a walk's note)."""
    root = _dataset(make_ds, "av1")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.iterator"):
        for rank in (0, 1):
            DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, rank=rank, world_size=2).close()
    line = r": (\d+) samples per epoch( \((\d+) of them its first ones again, to match the fullest rank\))?, routes"
    said = [re.search(line, r.getMessage()) for r in caplog.records if "samples per epoch" in r.getMessage()]
    assert all(said) and len(said) == 2, [r.getMessage() for r in caplog.records]
    counts = [int(m.group(1)) for m in said]
    repeated = [int(m.group(3) or 0) for m in said]
    assert counts[0] == counts[1] and min(repeated) == 0 < max(repeated)  # (the fullest rank repeats none)
    assert counts[0] * 2 - sum(repeated) == sum(LENGTHS)  # (each frame read once, but for the repeats)


@pytest.mark.parametrize(
    ("option", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"batch_size": True}, TypeError, "batch_size must be an int, got bool"),
        ({"device": "gpu"}, ValueError, "device must be 'cuda', 'cuda:N' or 'cpu'"),
        ({"num_workers": -1}, ValueError, "num_workers must be >= 0"),
        ({"num_workers": 1.0}, TypeError, "num_workers must be an int, got float"),
        ({"prefetch": 0}, ValueError, "prefetch must be >= 1"),
        ({"device": "cuda:x"}, ValueError, "device must be 'cuda', 'cuda:N' or 'cpu'"),
        (
            {"decode": "gpu"},
            ValueError,
            "decode='gpu' decodes on NVDEC, which needs device='cuda'; with device='cpu' pass decode='auto' or 'cpu'",
        ),
        ({"decode": "nvdec"}, ValueError, "decode must be one of 'auto', 'gpu', 'cpu', got 'nvdec'"),
    ],
)
def test_bad_sizes_fail_before_the_dataset_is_opened(tmp_path: Path, option: dict, error: type, match: str) -> None:
    """A typo is reported as itself, not as whatever opening the dataset would fail with (here: no dataset)."""
    with pytest.raises(error, match=match):
        DALILeRobotIterator(tmp_path / "no-such-dataset", **{"device": "cpu", **option})


def test_each_worker_keeps_the_packet_indices_of_every_pooled_file(make_ds) -> None:
    """64 entries for a pool of 64 episodes over 2+ cameras rebuilt half the indices per request (a review
    measured 620 ms per batch per worker on 30,000-frame files). A pool larger than the dataset holds its episodes:
    those count."""
    from lerobot_dali.batch_source import INDEX_CACHE_BYTES, BatchSource

    root = make_ds(episodes=20, frames_per_episode=2, cameras=2, codec="vp9", size=(64, 64))
    entries = {}
    for pool in (18, 40):
        it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, episode_pool_size=pool)
        next(iter(it))
        assert len(it._spec.camera_feeds) == 2
        cache = BatchSource(it._spec)._indexes
        entries[pool] = (cache.max_entries, cache.max_bytes)
        it.close()
    assert entries == {18: (2 * 18 * 2, INDEX_CACHE_BYTES), 40: (2 * 20 * 2, INDEX_CACHE_BYTES)}


def test_a_local_datasets_packet_indices_are_kept_on_disk(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of local video files outgrow each worker's cache of indices, and a file it dropped was demuxed again
    (~60 ms for 30,000 frames, where the store loads it in 1-4 ms): every file a batch read is stored, keyed by its
    stat, in the cache folder, and the next build (another process) and its batches index no video file."""
    from lerobot_dali import packet_index_cache
    from lerobot_dali.file_stamps import stamp_from_stat
    from lerobot_dali.packet_index_store import PacketIndexStore, default_packet_index_dir
    from lerobot_dali.video_source import source_url

    root = make_ds(episodes=4, frames_per_episode=2, cameras=2, codec="vp9", size=(64, 64))
    options = dict(batch_size=8, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(root, **options)
    assert len(list(it)) == 1
    it.close()
    store, reader = PacketIndexStore(default_packet_index_dir()), it.reader
    videos = {reader.video(pos, camera).path for pos in range(4) for camera in reader.camera_keys}
    assert len(videos) == 4  # (2 files of 2 episodes, 2 cameras)
    for path in videos:
        stored = store.load(source_url(path, filesystem=reader.location.fs), stamp_from_stat(Path(path).stat()))
        assert stored is not None, path
        assert np.array_equal(stored.pts, build_packet_index(path).pts)

    built: list[str] = []
    real_build = packet_index_cache.build_packet_index
    monkeypatch.setattr(packet_index_cache, "build_packet_index", lambda s, **k: built.append(s) or real_build(s, **k))
    monkeypatch.setattr(packet_index_cache, "_DEFAULT_CACHE", packet_index_cache.PacketIndexCache())
    again = DALILeRobotIterator(root, **options)
    assert len(list(again)) == 1
    again.close()
    assert built == []


@pytest.mark.parametrize("stop_after", [0, 2, 5])
def test_resume_mid_epoch_with_workers_continues_exactly(make_ds, stop_after: int) -> None:
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=3, shuffle=True, seed=7, episode_pool_size=2, device="cpu", num_workers=2)
    full = DALILeRobotIterator(root, **kwargs)
    whole = [int(i) for epoch in range(2) for b in (full.set_epoch(epoch) or full) for i in b["index"]]
    full.close()

    first = DALILeRobotIterator(root, **kwargs)
    seen: list[int] = []
    batches = iter(first)
    for _ in range(stop_after):
        seen += [int(i) for i in next(batches)["index"]]
    state = first.state_dict()
    first.close()
    resumed = DALILeRobotIterator(root, **kwargs)
    resumed.load_state_dict(state)
    for b in resumed:
        seen += [int(i) for i in b["index"]]
    resumed.set_epoch(1)
    for b in resumed:
        seen += [int(i) for i in b["index"]]
    assert seen == whole


def test_a_resumed_pipelines_workers_get_the_order_walked_to_the_position(make_ds, monkeypatch) -> None:
    """The order a worker unpickles walks on from the resumed position, not from the epoch's start (each worker
    replayed the epoch up to there: 2.8 s of CPU apiece 13.7M samples in)."""
    import pickle

    from lerobot_dali.sample_order import _PoolSimulator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=3, shuffle=True, seed=7, episode_pool_size=2, device="cpu", num_workers=0)
    it = DALILeRobotIterator(root, **kwargs)
    position = len(it) // 2 * 3
    it.load_state_dict({**it.state_dict(), "samples_consumed": position})
    iter(it)  # (builds the pipeline, whose spec goes to the workers)
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    worker_order = pickle.loads(pickle.dumps(it._spec.order))
    it.close()
    worker_order.samples(0, position, position + 3)
    assert 0 < starts[0] <= position


def test_a_resume_starts_the_pool_at_the_saved_walk(make_ds, monkeypatch) -> None:
    """A state saved part-way through an epoch carries the pool walk there: the resumed iterator draws on from it,
    where it replayed the epoch's pool up to there (3 s of CPU 13.7M samples in), and reads the batches the
    uninterrupted run read."""
    from lerobot_dali.sample_order import _PoolSimulator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=3, shuffle=True, seed=7, episode_pool_size=2, device="cpu", num_workers=0)
    first = DALILeRobotIterator(root, **kwargs)
    batches = iter(first)
    for _ in range(len(first) * 2 // 3):
        next(batches)
    state = first.state_dict()
    rest = [_pairs(b) for b in batches]
    first.close()
    assert state["walk"]["samples_consumed"] == state["samples_consumed"] and state["walk"]["emitted"] > 0
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    resumed = DALILeRobotIterator(root, **kwargs)
    resumed.load_state_dict(state)
    assert [_pairs(b) for b in resumed] == rest
    resumed.close()
    assert starts[0] == state["walk"]["emitted"]  # (then on into epoch 1, which DALI prefetches)


def test_a_state_taken_late_with_workers_walks_a_few_chunks(make_ds, monkeypatch) -> None:
    """With workers the main process draws no batch, so its order stood at the pass's start: the first state_dict()
    walked the epoch's pool from there (6 s of CPU 13.7M samples into an epoch of 92,000 episodes). It follows the
    batches handed out now, a few thousand samples at a time (here 4), and the state is the one the stream holds."""
    from lerobot_dali import sample_order
    from lerobot_dali.sample_order import OrderOptions, _PoolSimulator
    from lerobot_dali.stream_state import SampleStream

    monkeypatch.setattr(sample_order, "_FOLLOW_SAMPLES", 4)
    root = make_ds(episodes=8, frames_per_episode=30, cameras=0, fps=FPS)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=True, seed=7, episode_pool_size=2, device="cpu", num_workers=1)
    batches = iter(it)
    for _ in range(40):
        next(batches)
    starts: list[int] = []
    chunk = _PoolSimulator._chunk
    monkeypatch.setattr(
        _PoolSimulator, "_chunk", lambda self, cursor: starts.append(cursor.emitted) or chunk(self, cursor)
    )
    state = it.state_dict()
    it.close()
    assert len(starts) <= 1  # (the chunk that holds the position, if the last step stopped before it)
    stream = SampleStream(
        np.full(8, 30), rank=0, world_size=1, batch_size=4, options=OrderOptions(seed=7, episode_pool_size=2)
    )
    stream.advance(160)
    iterators_own = ("episodes", "dataset_contents", "dataset_identities", "dataset_descriptions", "augment_version")
    assert {k: v for k, v in state.items() if k not in iterators_own} == stream.state_dict()


def _pairs(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _epoch_loop(it: DALILeRobotIterator, first: int, stop: int) -> list[tuple[int, int, list]]:
    """The README's loop: per epoch, set_epoch, len(it), then the pass's samples."""
    out = []
    for epoch in range(first, stop):
        it.set_epoch(epoch)
        expected = len(it)
        batches = [_pairs(b) for b in it]
        out.append((epoch, expected, batches))
    return out


@pytest.mark.parametrize("world_sizes", [(1, 1), (2, 1)])
def test_checkpoint_after_an_epochs_last_batch_resumes_with_the_next_epoch(make_ds, world_sizes) -> None:
    """Saved right after an epoch's last batch (step-based checkpoints do this), on the same or another world
    size: the resumed loop's pass over the saved epoch is empty and the next epoch runs once, not twice."""
    saved_world, resumed_world = world_sizes
    root = make_ds(episodes=4, frames_per_episode=6, cameras=0, fps=FPS)
    kwargs = dict(batch_size=4, shuffle=True, seed=3, episode_pool_size=2, device="cpu", num_workers=0)
    whole = _epoch_loop(DALILeRobotIterator(root, world_size=resumed_world, rank=0, **kwargs), 1, 3)
    states = []
    for rank in range(saved_world):
        it = DALILeRobotIterator(root, rank=rank, world_size=saved_world, **kwargs)
        steps = len(it)
        for step, _ in enumerate(it):
            if step == steps - 1:
                states.append(it.state_dict())
                break
    assert states[0]["samples_consumed"] == 24 // saved_world
    resumed = DALILeRobotIterator(root, rank=0, world_size=resumed_world, **kwargs)
    resumed.load_state_dict(states[0])
    got = _epoch_loop(resumed, states[0]["epoch"], 3)
    assert got[0] == (0, 0, [])
    assert got[1:] == whole
    assert sum(len(b) for _, _, batches in whole for b in batches) == 48


def test_set_epoch_back_restarts_the_epoch_from_its_start(make_ds) -> None:
    root = make_ds(episodes=4, frames_per_episode=6, cameras=0, fps=FPS)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    first_pass = [_pairs(b) for b in it]
    batches = iter(it)
    next(batches), next(batches)
    del batches  # left epoch 1 after 2 of its 6 batches; the pipeline stands there
    it.set_epoch(np.int64(2))  # numpy ints are epochs too
    it.set_epoch(1)
    assert len(it) == 6
    assert [_pairs(b) for b in it] == first_pass
    assert it.state_dict()["epoch"] == 2


def test_resume_under_another_seed_keeps_the_saved_augmentation(make_ds) -> None:
    """The saved seed drives the order and the random augmentation alike, whatever seed the new run was given."""
    from lerobot_dali.augment import AugmentConfig, ColorJitter

    root = make_ds(episodes=2, frames_per_episode=6, cameras=1, codec="vp9", size=(64, 64), fps=FPS)
    kwargs = dict(
        batch_size=3, shuffle=True, episode_pool_size=2, device="cpu", num_workers=0,
        augment=AugmentConfig(color_jitter=ColorJitter(brightness=0.5, saturation=0.5)),
    )  # fmt: skip
    camera = "observation.images.cam0"
    whole = [b[camera] for b in DALILeRobotIterator(root, seed=1, **kwargs)]
    first = DALILeRobotIterator(root, seed=1, **kwargs)
    next(iter(first))
    state = first.state_dict()
    relaunched = DALILeRobotIterator(root, seed=2, **kwargs)
    relaunched.load_state_dict(state)
    rest = [b[camera] for b in relaunched]
    assert len(rest) == len(whole) - 1
    assert all(torch.equal(a, b) for a, b in zip(rest, whole[1:], strict=True))
    other = [b[camera] for b in DALILeRobotIterator(root, seed=2, **kwargs)]
    assert not torch.equal(other[0], whole[0])  # the seed does change the draws


def test_len_holds_still_during_a_pass(make_ds) -> None:
    """As a DataLoader's: len(it) is what the pass in progress yields; a pass left early leaves what remains."""
    it = DALILeRobotIterator(
        _dataset(make_ds, "vp9"), batch_size=4, shuffle=False, device="cpu", num_workers=2, drop_last=False
    )
    assert len(it) == 6  # 23 samples
    seen = [len(it) for _ in it]
    assert seen == [6] * 6 and len(it) == 6  # the next epoch is whole again
    batches = iter(it)
    next(batches), next(batches)
    assert len(it) == 6
    del batches  # the loop left after 2 batches: the epoch continues where it stopped
    assert len(it) == 4
    assert [len(it) for _ in it] == [4] * 4
    assert len(it) == 6
    it.close()


def test_resume_over_other_episodes_is_refused(make_ds) -> None:
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=3, device="cpu", num_workers=0)
    train = DALILeRobotIterator(root, episodes=[0, 2, 4], **kwargs)
    next(iter(train))
    state = train.state_dict()
    assert state["episodes"].startswith("3 episodes, sha256 ")
    for other in ([0, 2, 3], None):
        with pytest.raises(ResumeStateError, match="saved over other episodes"):
            DALILeRobotIterator(root, episodes=other, **kwargs).load_state_dict(state)
    same = DALILeRobotIterator(root, episodes=[4, 2, 0], **kwargs)
    same.load_state_dict(state)
    assert same.state_dict() == state
    legacy = {k: v for k, v in state.items() if k != "episodes"}  # saved before the digest existed
    DALILeRobotIterator(root, episodes=[0, 2, 4], **kwargs).load_state_dict(legacy)


def test_a_resume_over_another_dataset_of_the_same_shape_warns_naming_both(make_ds, caplog) -> None:
    """A single dataset's state knew its episodes' indices and lengths alone: saved over a generated dataset and
    resumed over one of the same shape made with another seed (other tasks) it went on without a word. It now holds
    the dataset's contents (info.json, episodes, tasks) and where they differ warns, naming both datasets: the position
    still means the same episode and frame indices, read from what the dataset holds now. The same dataset over HTTP
    (contents alike) resumes exactly, without a warning; so does a state saved before it held them, over either."""
    from tests.http_server import serve_folder

    spec = dict(episodes=3, frames_per_episode=[5, 7, 4], cameras=1, codec="h264", fps=FPS, gop=4)
    saved_root, other = (make_ds(**spec, seed=seed) for seed in (0, 1))
    kwargs = dict(batch_size=4, shuffle=True, seed=7, episode_pool_size=2, device="cpu", num_workers=0)

    def read(root: Any, state: dict | None = None, stop: int | None = None) -> tuple[list, dict | None]:
        it = DALILeRobotIterator(root, drop_last=False, **kwargs)
        if state is not None:
            it.load_state_dict(json.loads(json.dumps(state)))  # (as a checkpoint holds it)
        seen, saved = [], None
        for step, batch in enumerate(it):
            seen += [(*pair, int(t)) for pair, t in zip(_pairs(batch), batch["task_index"], strict=True)]
            if step == stop:
                saved = it.state_dict()
                break
        it.close()
        return seen, saved

    whole, _ = read(saved_root)
    head, state = read(saved_root, stop=0)
    assert state is not None and len(head) == 4 and len(whole) == 16
    assert state["dataset_descriptions"] == [str(saved_root)] and len(state["dataset_contents"]) == 1
    with serve_folder(saved_root.parent) as server, caplog.at_level(logging.WARNING):
        for same in (f"{server.url}/{saved_root.name}", saved_root):
            assert head + read(same, state)[0] == whole
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        legacy = {k: v for k, v in state.items() if k not in ("dataset_contents", "dataset_descriptions")}
        assert read(other, legacy)[0] == [(e, f, 1 - t) for e, f, t in whole[4:]]  # (tasks: (episode + seed) % 2)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        rest, _ = read(other, state)
    assert rest == [(e, f, 1 - t) for e, f, t in whole[4:]]  # (the same indices, the other dataset's tasks)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert f"saved over {saved_root} (contents {state['dataset_contents'][0]})" in warned[0]
    assert f"now {other} (contents " in warned[0]


def test_a_mixtures_state_is_refused_as_one(make_ds) -> None:
    """A mixture's state given to one iterator (moving a run from a mixture to a union) was refused as "saved by
    another lerobot_dali version"."""
    root = _dataset(make_ds, "vp9")
    mix = DALILeRobotMixture([root, root], batch_size=4, device="cpu", num_workers=0)
    state = mix.state_dict()
    mix.close()
    it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0)
    with pytest.raises(ResumeStateError, match="state of a DALILeRobotMixture .*load it into a mixture"):
        it.load_state_dict(state)
    it.load_state_dict(state["datasets"][0])  # (one of its datasets' own states loads)
    it.close()


def test_an_episode_filter_reads_its_episodes_only(make_ds) -> None:
    root = _dataset(make_ds, "vp9")
    kept = [e for e, length in enumerate(LENGTHS) if length >= 6]
    assert 0 < len(kept) < len(LENGTHS)
    kwargs = dict(batch_size=3, device="cpu", num_workers=0, shuffle=False, drop_last=False)
    it = DALILeRobotIterator(root, episode_filter=lambda ep: ep["length"] >= 6, **kwargs)
    # The same episodes by number: the same stream, so a state saved by one resumes the other.
    assert it.state_dict() == DALILeRobotIterator(root, episodes=kept, **kwargs).state_dict()
    read = [(int(e), int(f)) for b in it for e, f in zip(b["episode_index"], b["frame_index"], strict=True)]
    assert read == [(e, f) for e in kept for f in range(LENGTHS[e])]
    with pytest.raises(ValueError, match="episode_filter= is an option for opening a dataset"):
        DALILeRobotIterator(it.reader, episode_filter=lambda ep: True, **kwargs)
    it.close()


def _damage(root: Path, how: str) -> None:
    """Break one file of a dataset the way users' datasets break."""
    video = root / "videos/observation.images.cam0/chunk-000/file-001.mp4"
    if how == "truncated_video":  # the packet index of this file cannot be built
        data = video.read_bytes()
        video.write_bytes(data[: len(data) // 3])
    elif how == "missing_video":
        video.unlink()
    elif how == "unknown_codec":  # an MP4 whose codec neither DALI nor PyAV decodes
        video.unlink()
        write_undecodable_mp4(video, frames=12, fps=FPS, width=128, height=96)
    elif how == "corrupt_packets":  # container intact, every packet after the first one garbage
        index = build_packet_index(video)
        raw = bytearray(video.read_bytes())
        rng = np.random.default_rng(0)
        for offset, size in zip(index.byte_offset[1:].tolist(), index.size_bytes[1:].tolist(), strict=True):
            raw[offset : offset + size] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        video.write_bytes(bytes(raw))
    elif how == "rows_past_video":  # episode 3's rows (file-001's second) timed 5 s on, past its video
        # (an episode whose part of the file its rows overrun by their count, from meta/episodes, is refused when the
        # iterator is built: tests/test_file_timing.py; times the rows hold are read in the workers)
        import pyarrow.parquet as pq

        data = root / "data/chunk-000/file-001.parquet"
        table = pq.read_table(data)
        later = np.where(np.asarray(table["episode_index"]) == 3, 5.0, 0.0).astype(np.float32)
        timestamps = pa.array(np.asarray(table["timestamp"]) + later, table.schema.field("timestamp").type)
        pq.write_table(table.set_column(table.column_names.index("timestamp"), "timestamp", timestamps), data)
    elif how == "unknown_task":  # the task list lost task 1, which data rows still name
        import pyarrow.parquet as pq

        tasks = root / "meta/tasks.parquet"
        table = pq.read_table(tasks)
        pq.write_table(table.filter(pc.not_equal(table["task_index"], 1)), tasks)
        # (written without column statistics, from which the iterator's build would refuse it: the workers find it)
        for data in sorted((root / "data").rglob("*.parquet")):
            pq.write_table(pq.read_table(data), data, write_statistics=False)
    elif how == "missing_parquet":
        (root / "data/chunk-000/file-001.parquet").unlink()
    elif how == "corrupt_parquet":
        data = root / "data/chunk-000/file-001.parquet"
        raw = data.read_bytes()
        data.write_bytes(raw[: len(raw) // 2] + raw[-8:])  # footer kept, column chunks cut
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("codec", "how", "error", "pattern"),
    [
        ("av1", "truncated_video", VideoDecodeError, r"file-001\.mp4"),
        ("av1", "missing_video", MissingDataFileError, r"file-001\.mp4"),
        ("av1", "unknown_codec", CodecUnsupportedError, r"file-001\.mp4"),
        ("h264", "corrupt_parquet", DataFileError, r"episode [23]'s rows: .*data/chunk-000/file-001\.parquet"),
        ("h264", "missing_parquet", MissingDataFileError, r"episode [23]'s rows: .*data/chunk-000/file-001\.parquet"),
        ("h264", "unknown_task", EpisodeMetadataError, r"file-00\d\.parquet: episode \d+'s rows hold task_index 1\b"),
        ("h264", "rows_past_video", FrameTimestampError, r"episode 3, .*file-001\.mp4\): query timestamp 5\.\d+ s has"),
        ("vp9", "corrupt_packets", VideoDecodeError, r"file-001\.mp4: DALI cannot decode .* episode [23], camera "),
    ],
)
def test_worker_errors_surface_as_the_original_exception(make_ds, copy_ds, codec, how, error, pattern) -> None:
    """Bad files fail with our exception naming the file, from the workers or from DALI's decoder, without a
    hang; the iterator fails the same way again, and a new one over good data runs (no dead worker pool)."""
    good = _dataset(make_ds, codec)
    root = copy_ds(good)
    # A data file missing or damaged when the iterator is built fails there (below); one damaged later, in a worker.
    late = how in ("missing_parquet", "corrupt_parquet")
    if not late:
        _damage(root, how)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=2)
    if late:
        _damage(root, how)
    for _ in range(2):
        with pytest.raises(error, match=pattern):
            for _ in it:
                pass
    it.close()
    healthy = DALILeRobotIterator(good, batch_size=4, shuffle=False, device="cpu", num_workers=2, drop_last=False)
    assert sum(len(b["index"]) for b in healthy) == sum(LENGTHS)
    healthy.close()


def test_a_missing_data_file_fails_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    root = copy_ds(_dataset(make_ds, "h264"))
    _damage(root, "missing_parquet")
    with pytest.raises(MissingDataFileError, match=r"file-001\.parquet is missing: .*episodes \[2, 3\] are in no"):
        DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=2)


def test_a_damaged_data_file_fails_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    """Its footer is read at open, with every other data file's (their row counts are checked)."""
    root = copy_ds(_dataset(make_ds, "h264"))
    _damage(root, "corrupt_parquet")
    with pytest.raises(DataFileError, match=r"file-001\.parquet is not readable parquet"):
        DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=2)


def test_the_first_episode_is_read_once_when_the_iterator_is_built(make_ds, monkeypatch) -> None:
    """Its rows give the scalars' stored shapes and its first and last rows' frame lookup: it was read twice, each
    read decoding its data file's row groups (a converted v3.0 file's one group: the whole file, twice)."""
    from lerobot_dali.dataset_reader import LeRobotDatasetReader

    read_episode = LeRobotDatasetReader.read_episode
    reads: list[int] = []

    def counting(self, episode_pos: int, keys=None):
        reads.append(episode_pos)
        return read_episode(self, episode_pos, keys)

    monkeypatch.setattr(LeRobotDatasetReader, "read_episode", counting)
    it = DALILeRobotIterator(_dataset(make_ds, "h264"), batch_size=4, shuffle=False, device="cpu", num_workers=0)
    assert reads == [0]
    assert it._listed_scalars == frozenset()  # (the generator writes scalars as plain columns)
    it.close()


def test_a_bad_clip_is_named_with_random_augmentation_too(make_ds, copy_ds) -> None:
    """Finding the clip DALI rejects rebuilds its samples, and with random augmentation their draws need the
    samples' stream positions: without them the search failed and DALI's bare error came through."""
    from lerobot_dali.augment import AugmentConfig, ColorJitter

    root = copy_ds(_dataset(make_ds, "vp9"))
    _damage(root, "corrupt_packets")
    augment = AugmentConfig(color_jitter=ColorJitter(brightness=0.3))
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0, augment=augment)
    with pytest.raises(VideoDecodeError, match=r"file-001\.mp4: DALI cannot decode .* episode [23], camera "):
        for _ in it:
            pass
    it.close()


def test_gr00t_float64_features_come_as_float32_like_lerobot() -> None:
    """LeRobot's items pass through ``torch.tensor`` as Python scalars: float64 columns (all of GR00T's floats)
    arrive float32, integers int64, booleans bool; values are the parquet's, rounded to float32."""
    import pyarrow.parquet as pq

    root = shared_dataset("gr00t_v20_h264")
    it = DALILeRobotIterator(
        root, cameras=["observation.images.ego_view"], batch_size=4, shuffle=False, device="cpu", num_workers=0,
        timestamp_source="frame_index",
    )  # fmt: skip
    batch = next(iter(it))
    table = pq.read_table(root / "data/chunk-000/episode_000000.parquet").to_pydict()
    expected = {
        "observation.state": torch.float32, "action": torch.float32, "timestamp": torch.float32,
        "next.reward": torch.float32, "next.done": torch.bool, "task_index": torch.int64, "index": torch.int64,
        "annotation.human.validity": torch.int64,
    }  # fmt: skip
    assert {k: batch[k].dtype for k in expected} == expected
    for key in ("observation.state", "action", "timestamp", "next.reward"):
        want = torch.tensor(table[key][:4])  # what LeRobot's hf_transform_to_torch makes of the rows
        torch.testing.assert_close(batch[key], want, rtol=0, atol=0)
    assert batch["observation.images.ego_view"].shape == (4, 3, 256, 256)


def test_gr00t_derived_frame_index_takes_a_window_like_a_declared_one() -> None:
    """GR00T declares no frame_index (the reader derives it); a window over it was refused as 'not a feature'."""
    it = DALILeRobotIterator(
        shared_dataset("gr00t_v20_h264"), cameras=["observation.images.ego_view"], keys=["action"], batch_size=3,
        shuffle=False, device="cpu", num_workers=0, timestamp_source="frame_index",
        delta_timestamps={"frame_index": [-0.05, 0.0]},  # 20 fps: the previous row and this one
    )  # fmt: skip
    batch = next(iter(it))
    it.close()
    assert batch["frame_index"].tolist() == [[0, 0], [0, 1], [1, 2]]  # padded at the episode's start, as LeRobot
    assert batch["frame_index_is_pad"].tolist() == [[True, False], [False, False], [False, False]]


def test_gr00t_rows_are_a_frame_ahead_of_their_timestamps() -> None:
    """GR00T's timestamps start at 0.05 s: row i says (i + 1) / 20 s while its video holds as many frames as
    rows, from 0 s. By timestamp every row would read the next frame and the last row none: the iterator
    refuses at construction, naming frame_index; by frame_index, row i reads frame i, the last row too."""
    import pyarrow.parquet as pq

    root = shared_dataset("gr00t_v20_h264")
    camera = "observation.images.ego_view"
    with pytest.raises(FrameTimestampError, match=r"query timestamp 20\.79998\d s .*frame_index / fps"):
        DALILeRobotIterator(root, cameras=[camera], device="cpu", num_workers=0)
    length = pq.read_metadata(root / "data/chunk-000/episode_000000.parquet").num_rows
    it = DALILeRobotIterator(
        root, cameras=[camera], keys=["action"], batch_size=length, shuffle=False, device="cpu", num_workers=0,
        timestamp_source="frame_index", return_uint8=True, episodes=[0],
    )  # fmt: skip
    batch = next(iter(it))
    frames = [
        frame for _, frame in sorted(reference_frames(root / f"videos/chunk-000/{camera}/episode_000000.mp4").items())
    ]
    assert len(frames) == length == len(batch["index"])
    for i in (0, 1, 249, 250, length - 1):
        np.testing.assert_array_equal(batch[camera][i].permute(1, 2, 0).numpy(), frames[i])


def test_cr5_wall_clock_timestamps_fail_clearly_then_read_by_frame_index() -> None:
    """Fails when the iterator is built, not when a worker first reaches the row: the first episode's last
    row (wall-clock 20.55 s) is checked against the video at construction."""
    root = shared_dataset("cr5_v30_av1")
    with pytest.raises(FrameTimestampError, match=r"episode 0, camera observation\.images\.top.*frame_index / fps"):
        DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    it = DALILeRobotIterator(
        root, batch_size=4, shuffle=False, device="cpu", num_workers=0, timestamp_source="frame_index",
        return_uint8=True,
    )  # fmt: skip
    batch = next(iter(it))
    ref = sorted(reference_frames(root / "videos/observation.images.top/chunk-000/file-000.mp4").items())
    for i in range(4):
        got = batch["observation.images.top"][i].permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got, ref[i][1])
    assert batch["task"] == ["put the banana on the plate"] * 4
    assert batch["observation.state"].shape == (4, 6)


def test_r1_h264_b_frames_through_parquet_timestamps() -> None:
    """Real H.264 with B-frames, 10 fps rows over 25 fps video, looked up by the parquet timestamps (the default
    route): row k shows video frame floor(2.5 k) (odd rows lie halfway: ties go to the earlier frame), equal to
    a full sequential decode. ``observation.state`` is left out: it holds 41 values where info.json says 17."""
    root = shared_dataset("r1_v30_h264")
    camera = "observation.images.rgb"
    halfway = r"halfway between two video frames.*\(25\) than the rows \(10\)\. Raise tolerance_s to 0\.0201"
    with pytest.raises(FrameTimestampError, match=halfway):  # 0.1 s is 0.02 s from a 25 fps frame
        next(iter(DALILeRobotIterator(root, keys=["action"], batch_size=8, shuffle=False, device="cpu", num_workers=0)))
    it = DALILeRobotIterator(
        root, keys=["action"], batch_size=50, shuffle=True, seed=3, device="cpu", num_workers=2,
        tolerance_s=0.0201, return_uint8=True,
    )  # fmt: skip
    batch = next(iter(it))
    it.close()
    decoded = [frame for _, frame in sorted(reference_frames(root / f"videos/{camera}/chunk-000/file-000.mp4").items())]
    assert len(decoded) == 1975
    for i, k in enumerate(batch["frame_index"].tolist()):
        np.testing.assert_array_equal(batch[camera][i].permute(1, 2, 0).numpy(), decoded[k * 5 // 2])
    assert {k % 2 for k in batch["frame_index"].tolist()} == {0, 1}  # both exact and halfway rows


def test_cr5_full_epoch_parity_with_independent_reads() -> None:
    """Every sample of the real AV1 v3.0 dataset (12 episodes in 3 multi-episode files) against pyarrow reads
    of the parquet files and a full sequential PyAV decode of every video file."""
    import pyarrow.parquet as pq

    root = shared_dataset("cr5_v30_av1")
    camera = "observation.images.top"
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    decoded = {
        f: [
            frame for _, frame in sorted(reference_frames(root / f"videos/{camera}/chunk-000/file-{f:03d}.mp4").items())
        ]
        for f in range(3)
    }
    deltas = {"observation.state": [-0.2, 0.0, 0.1], camera: [-0.1, 0.0]}
    it = DALILeRobotIterator(
        root, batch_size=64, delta_timestamps=deltas, shuffle=False, device="cpu", num_workers=2,
        drop_last=False, timestamp_source="frame_index", return_uint8=True,
    )  # fmt: skip
    seen = 0
    for batch in it:
        for i in range(len(batch["index"])):
            g = int(batch["index"][i])
            meta = episodes[data["episode_index"][g]]
            start, n = meta["dataset_from_index"], meta["length"]
            f = g - start
            assert int(batch["frame_index"][i]) == f == data["frame_index"][g]
            rows = [min(max(f + d, 0), n - 1) for d in (-2, 0, 1)]
            np.testing.assert_array_equal(
                batch["observation.state"][i].numpy(),
                np.array([data["observation.state"][start + r] for r in rows], dtype=np.float32),
            )
            assert batch["observation.state_is_pad"][i].tolist() == [not 0 <= f + d < n for d in (-2, 0, 1)]
            first = round(meta[f"videos/{camera}/from_timestamp"] * 10)
            frames = decoded[meta[f"videos/{camera}/file_index"]]
            for t, d in enumerate((-1, 0)):
                expected = frames[first + min(max(f + d, 0), n - 1)]
                np.testing.assert_array_equal(batch[camera][i, t].permute(1, 2, 0).numpy(), expected)
            seen += 1
    assert seen == 2733
    it.close()


def test_dali_decoded_clips_open_each_mp4_once_per_batch(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """VP9 clips for DALI's decoder: a batch opens each video file once and lends it to all its clips."""
    from types import SimpleNamespace

    import lerobot_dali.batch_source as batch_source_module
    import lerobot_dali.clips as clips_module

    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(root, batch_size=8, shuffle=False, device="cpu", num_workers=0, delta_timestamps=DELTAS)
    iter(it)
    source = batch_source_module.BatchSource(it._spec)
    it.close()
    opened: list[str] = []
    real = clips_module.open_video_source

    def counting(video, **kwargs):
        if isinstance(video, str):
            opened.append(video)
        return real(video, **kwargs)

    monkeypatch.setattr(clips_module, "open_video_source", counting)
    monkeypatch.setattr(batch_source_module, "open_video_source", counting)
    outputs = source(SimpleNamespace(epoch_idx=0, iteration=0))
    episodes = outputs[source.fields.index(next(f for f in source.fields if f.name == "episode_index"))]
    files = {int(e) // 2 for e in np.asarray(episodes).ravel().tolist()}  # 2 episodes per file
    assert len(opened) == 2 * len(files) == len(set(opened)), opened  # 2 cameras, 8 samples of 3 frames each


def test_unattributed_decode_failures_name_the_files(make_ds, copy_ds, monkeypatch) -> None:
    """When no clip can be blamed alone (here: every re-decode fails, as with the decoder itself failing), the
    error still names the camera, the episodes and the files, instead of DALI's bare error."""
    from lerobot_dali import decode_errors

    root = copy_ds(_dataset(make_ds, "vp9"))
    _damage(root, "corrupt_packets")

    def failing(*args, **kwargs):
        raise RuntimeError("Critical error in pipeline:\nout of memory")

    monkeypatch.setattr(decode_errors, "decode_clip_batch", failing)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    pattern = r"camera observation.images.cam0's frames of episodes \[0, .* several files fail on their own: .*mp4"
    with pytest.raises(VideoDecodeError, match=pattern):
        for _ in it:
            pass
    it.close()


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_pipeline_failure_is_located_among_every_batch_the_decoder_may_have_had(
    make_ds, copy_ds, monkeypatch, prefetch: int
) -> None:
    """DALI's error of a batch ahead can surface at an earlier batch's fetch, so the clips rebuilt to find the bad
    one are those of the ``prefetch`` batches in the pipeline, the failing one, and as many more: ``2 * prefetch + 2``
    batches from the consumed position (only ``prefetch`` batches left a bad clip ahead unnamed)."""
    from lerobot_dali.decode_errors import locate_clip_failure

    root = copy_ds(_dataset(make_ds, "vp9"))
    _damage(root, "corrupt_packets")
    ranges = []

    def spied(source, epoch, start, stop, **kwargs):
        ranges.append((epoch, start, stop))
        return locate_clip_failure(source, epoch, start, stop, **kwargs)

    monkeypatch.setattr(iterator_module, "locate_clip_failure", spied)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0, prefetch=prefetch)
    consumed = 0
    with pytest.raises(VideoDecodeError, match="file-001"):
        for batch in it:
            consumed += len(batch["index"])
    total = it._stream.num_samples()
    it.close()
    assert ranges == [(0, consumed, min(total, consumed + (2 * prefetch + 2) * 2))]
    assert consumed + (2 * prefetch + 2) * 2 <= total  # (the range is not cut by the epoch's end)


def test_a_decoder_failing_everything_blames_no_file(monkeypatch) -> None:
    """Bisecting a failed batch keeps the failing half; when the decoder itself fails (a CUDA out-of-memory), every
    half fails and the first clip was called corrupt. Clips of other files that decode alone clear it; otherwise
    the error names the files without blaming one (test_unattributed_decode_failures_name_the_files)."""
    from lerobot_dali import decode_errors

    clips = [np.full(4, k, np.uint8) for k in range(6)]
    wanted = [np.zeros(1, np.int32)] * 6
    files = ["a.mp4", "a.mp4", "b.mp4", "c.mp4", "c.mp4", "d.mp4"]

    def decoder(bad: set[int] | None):
        def decode(batch, _wanted, *, device_id):
            if bad is None or any(int(c[0]) in bad for c in batch):
                raise RuntimeError("Critical error in pipeline: ... out of memory")

        return decode

    unattributed = decode_errors.UNATTRIBUTED
    for bad, expected in [(None, unattributed), ({0}, 0), ({4}, 4), ({0, 2}, 0), ({0, 2, 3, 5}, unattributed),
                          (set(), None)]:  # fmt: skip
        monkeypatch.setattr(decode_errors, "decode_clip_batch", decoder(bad))
        assert decode_errors._first_failing(clips, wanted, files, device_id=None) == expected, bad
    # one file only: nothing clears the decoder, and the blame stands
    monkeypatch.setattr(decode_errors, "decode_clip_batch", decoder(None))
    assert decode_errors._first_failing(clips[:2], wanted[:2], ["a.mp4"] * 2, device_id=None) == 0


def test_a_pipeline_failure_no_clip_explains_names_the_ranks_samples(make_ds, monkeypatch, caplog) -> None:
    """The samples [start, stop) the line names are positions in one rank's epoch: every rank of a job logs its
    own, and the line did not say whose."""
    from lerobot_dali import decode_errors
    from lerobot_dali.batch_source import BatchSource

    monkeypatch.setattr(decode_errors, "decode_clip_batch", lambda *args, **kwargs: None)  # every clip decodes
    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=0, rank=1, world_size=2)
    try:
        next(iter(it))  # (the pipeline, and the spec its source is made from)
        with caplog.at_level("INFO", logger="lerobot_dali.decode_errors"):
            located = decode_errors.locate_clip_failure(
                BatchSource(it._spec), 0, 0, 4, device_id=None, cause=RuntimeError("Critical error in pipeline")
            )
    finally:
        it.close()
    assert located is None
    assert [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.decode_errors"] == [
        "every clip of rank 1's samples [0, 4) of epoch 0 decodes on its own; the failure was elsewhere"
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_interrupted_pass_resumes_without_losing_or_repeating_a_sample(make_ds, monkeypatch, num_workers) -> None:
    """Ctrl-C inside DALI's next() (after DALI took the batch off its schedule) left the pipeline in place, and the
    next pass silently skipped that batch and repeated others."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    original, calls = DALIGenericIterator.__next__, [0]

    def interrupted_once(self):
        outputs = original(self)
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return outputs

    monkeypatch.setattr(DALIGenericIterator, "__next__", interrupted_once)
    assert _indices_across_a_ctrl_c(DALILeRobotIterator(root, **kwargs)) == reference


def test_an_interrupt_while_the_workers_order_follows_loses_no_batch(make_ds, monkeypatch) -> None:
    """A signal's exception (Ctrl-C, a SIGTERM handler's sys.exit) landing after the stream counted a batch but before
    the loop got it (while the order followed the workers, or the prefetcher the stream): the batch was lost, by
    state_dict() and by the next pass (measured: 2 of 6 save-in-handler checkpoints of a remote dataset with 2 workers
    resumed one batch short). The stream now counts the batch last, right before handing it out."""
    from lerobot_dali.sample_order import SampleOrder

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=1, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    original, calls = SampleOrder.follow, [0]

    def interrupted_once(self, epoch, position):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return original(self, epoch, position)

    monkeypatch.setattr(SampleOrder, "follow", interrupted_once)
    it = DALILeRobotIterator(root, **kwargs)
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    assert it.state_dict()["samples_consumed"] == len(seen) == 4
    seen += [int(i) for batch in it for i in batch["index"]]  # the pass carried on with
    it.close()
    assert seen == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_close_from_another_thread_ends_the_waiting_pass_with_a_clear_error(make_ds, monkeypatch, num_workers) -> None:
    """close() from a watchdog thread while the loop waits in DALI's next() shut the pipeline down under it: the
    loop got a false WorkerProcessError (workers) or an AttributeError (no workers). It now gets
    IteratorClosedError, the pipeline is gone, and iterating again carries on from the same sample."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    original, calls, closer = DALIGenericIterator.__next__, [0], []

    def closed_meanwhile(self):
        calls[0] += 1
        if calls[0] == 3:
            closer.append(threading.Thread(target=it.close))
            closer[0].start()
            deadline = time.monotonic() + 30
            while it._dali_iter is not None and time.monotonic() < deadline:  # close() has begun
                time.sleep(0.01)
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", closed_meanwhile)
    seen: list[int] = []
    with pytest.raises(IteratorClosedError, match="when the iterator was closed.*No sample was lost"):
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    closer[0].join(timeout=60)
    assert not closer[0].is_alive() and it._pipeline is None
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    for batch in it:
        seen += [int(i) for i in batch["index"]]
    it.close()
    assert seen == reference


def _epoch_and_state_after_3_batches(root: Path, **kwargs: Any) -> tuple[list[int], dict[str, Any]]:
    """The indices an iterator over ``root`` reads in its first epoch, and the state of another after 3 batches."""
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    saver = DALILeRobotIterator(root, **kwargs)
    for _ in zip(range(3), saver, strict=False):
        pass
    state = saver.state_dict()
    saver.close()
    return reference, state


def _loading_from_another_thread(it: DALILeRobotIterator, state: dict[str, Any]) -> threading.Thread:
    """A thread started to load ``state`` into ``it``, once its stream stands where ``state`` does (or after 30 s)."""
    loader = threading.Thread(target=it.load_state_dict, args=(state,))
    loader.start()
    deadline = time.monotonic() + 30
    while it._stream.samples_consumed != state["samples_consumed"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return loader


@pytest.mark.parametrize("read", ["batch", "end"])
def test_load_state_dict_from_another_thread_during_a_read_keeps_the_loaded_position(
    make_ds, monkeypatch, read
) -> None:
    """load_state_dict() from another thread while the loop waited in DALI's next(): the read completed after the load
    and counted its batch on the loaded position, which moved a batch on (sample 8 for 6, or 10 where the loop's next
    read took the lock before the load's close: 2-4 samples skipped), or, where the read was the pass's last (its
    end), moved it to the next epoch's start (the rest of the loaded epoch lost). The batch read at the old position is
    now dropped and the pass ends with IteratorClosedError naming the load; the stream stands where the state says,
    and iterating again reads the rest from there."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference, state = _epoch_and_state_after_3_batches(root, **kwargs)
    assert state["samples_consumed"] == 6
    it = DALILeRobotIterator(root, **kwargs)
    original, calls, loader = DALIGenericIterator.__next__, [0], []
    at_call = 2 if read == "batch" else -(-len(reference) // 2) + 1  # (the second batch, or the StopIteration after)

    def loaded_meanwhile(self):
        calls[0] += 1
        if calls[0] == at_call:
            loader.append(_loading_from_another_thread(it, state))
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", loaded_meanwhile)
    with pytest.raises(IteratorClosedError, match=r"load_state_dict\(\) moved the stream to sample 6 of epoch 0"):
        for _ in it:
            pass
    loader[0].join(timeout=60)
    assert not loader[0].is_alive()
    assert (it.epoch, it.state_dict()["samples_consumed"]) == (0, 6)
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    rest = [int(i) for b in it for i in b["index"]]
    it.close()
    assert rest == reference[6:]


def test_load_state_dict_from_another_thread_during_the_pipeline_build_keeps_the_loaded_position(
    make_ds, monkeypatch
) -> None:
    """load_state_dict() from another thread while a pass built its pipeline (workers starting: seconds): the pipeline
    stood at the old position, but the pass took the stream's loads count after the build, so its first batch, read
    at the old position (samples 0-1), was counted on the loaded one (6 became 8) and handed out. The pass now counts
    the loads from before its build: that batch is dropped, and what is read after is the rest from sample 6."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference, state = _epoch_and_state_after_3_batches(root, **kwargs)
    it = DALILeRobotIterator(root, **kwargs)
    original, loader = iterator_module.build_pipeline, []

    def loaded_meanwhile(*args, **kwargs):
        if not loader:
            loader.append(_loading_from_another_thread(it, state))
        return original(*args, **kwargs)

    monkeypatch.setattr(iterator_module, "build_pipeline", loaded_meanwhile)
    seen: list[int] = []
    with contextlib.suppress(IteratorClosedError):  # (the load's, or its close's where it took the pipeline first)
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    loader[0].join(timeout=60)
    assert not loader[0].is_alive()
    assert seen == reference[6 : 6 + len(seen)]
    assert (it.epoch, it.state_dict()["samples_consumed"]) == (0, 6 + len(seen))
    rest = [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen + rest == reference[6:]


def _iterator_counting_builds(make_ds, monkeypatch) -> tuple[DALILeRobotIterator, list[int]]:
    """A shuffled iterator over the tests' dataset (23 samples, batches of 2); the epochs it builds a pipeline at."""
    it = DALILeRobotIterator(
        _dataset(make_ds, "vp9"), batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False
    )
    original, builds = iterator_module.build_pipeline, []

    def counted_build(*args, **kwargs):
        builds.append(it.epoch)
        return original(*args, **kwargs)

    monkeypatch.setattr(iterator_module, "build_pipeline", counted_build)
    return it, builds


def test_the_next_epoch_reads_on_through_the_pipeline_the_last_one_ended(make_ds, monkeypatch) -> None:
    """DALI resets itself at an epoch's end (auto_reset) and its source walks on into the next epoch, so the pipeline
    serves the next pass: rebuilt instead, each epoch started its workers again (seconds each) and re-read the order
    up to where it stood. Both epochs are read whole, each sample once, through one build."""
    it, builds = _iterator_counting_builds(make_ds, monkeypatch)
    epochs = [[int(i) for b in it for i in b["index"]] for _ in range(2)]
    it.close()
    assert builds == [0]
    assert [sorted(e) for e in epochs] == [list(range(len(epochs[0])))] * 2
    assert epochs[0] != epochs[1]  # (the second epoch is shuffled anew: not the first read again)


def test_a_loop_left_at_the_epochs_last_partial_batch_reads_on_through_its_pipeline(make_ds, monkeypatch) -> None:
    """A loop that breaks after the epoch's last batch (a partial one: 23 samples in batches of 2) leaves the pipeline
    standing after that batch's 1 sample, not a whole batch's 2: counted as 2, it stood elsewhere than the stream, and
    the next epoch built it again (workers started anew). The next pass ends the epoch, the one after reads the next
    epoch whole, through the one build."""
    it, builds = _iterator_counting_builds(make_ds, monkeypatch)
    first: list[int] = []
    for batch in it:
        first += [int(i) for i in batch["index"]]
        if len(batch["index"]) == 1:
            break
    assert (len(first), it.state_dict()["samples_consumed"]) == (23, 23)
    assert list(it) == [] and it.epoch == 1
    second = [int(i) for b in it for i in b["index"]]
    it.close()
    assert sorted(first) == sorted(second) == list(range(23))
    assert builds == [0]


def test_a_load_of_another_order_at_the_pipeline_position_rebuilds_it_before_the_load_closes_it(make_ds) -> None:
    """load_state_dict() from another thread of a state at the position the pipeline stood at but of another order
    (another seed), a pass starting between the stream's load and the load's close of the pipeline: the pipeline
    stood where the stream did, so the pass read on through it, the old seed's samples counted as the new seed's
    (the batches of 6 onwards of seed 4 for seed 5's). It is built anew for the loaded order."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, device="cpu", num_workers=0, drop_last=False)
    reference, state = _epoch_and_state_after_3_batches(root, seed=5, **kwargs)
    it = DALILeRobotIterator(root, seed=4, **kwargs)
    for _ in zip(range(3), it, strict=False):
        pass
    assert it.state_dict()["samples_consumed"] == 6
    loader = threading.Thread(target=it.load_state_dict, args=(state,))
    with it._next_lock:  # (the load's close of the pipeline waits: a pass starts between its two steps)
        loads = it._stream.loads
        loader.start()
        deadline = time.monotonic() + 30
        while it._stream.loads == loads and time.monotonic() < deadline:  # (the stream loaded)
            time.sleep(0.01)
        rest = [int(i) for b in it for i in b["index"]]
    loader.join(timeout=60)
    assert not loader.is_alive()
    it.close()
    assert rest == reference[6:]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_pass_started_between_a_loads_two_steps_reads_the_loaded_position_without_error(make_ds, num_workers) -> None:
    """load_state_dict() from another thread, a pass starting (building its pipeline at the loaded position) between
    the stream's load and the load's close of the pipeline: the load closed that new pipeline under the pass, which
    ended in IteratorClosedError ('the iterator was closed') though it began after the load and nothing was lost (in
    140 of 1,049 fuzzed passes ended by a load or set_epoch). Only a pipeline built before the load is closed now:
    the pass reads the rest from the loaded position."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference, state = _epoch_and_state_after_3_batches(root, **kwargs)
    it = DALILeRobotIterator(root, **kwargs)
    for _ in zip(range(1), it, strict=False):
        pass
    stream_load, passes = it._stream.load_state_dict, []

    def a_pass_starts_between(state_dict, **kwargs):  # (the other thread's pass, begun once the stream has loaded)
        loads = stream_load(state_dict, **kwargs)
        passes.append(iter(it))
        return loads

    it._stream.load_state_dict = a_pass_starts_between  # type: ignore[method-assign]
    it.load_state_dict(state)
    rest = [int(i) for b in passes[0] for i in b["index"]]
    it.close()
    assert rest == reference[6:]


def test_a_pass_begun_as_a_load_came_ends_naming_the_load(make_ds, monkeypatch) -> None:
    """load_state_dict() from another thread as a pass began (after it took the stream's loads, before its pipeline
    was built): the pipeline was built at the loaded position and the load closed it, so the pass ended saying 'the
    iterator was closed (close() was called ...)', though none was. It names the load now; iterating again reads the
    rest from the loaded position."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference, state = _epoch_and_state_after_3_batches(root, **kwargs)
    it = DALILeRobotIterator(root, **kwargs)
    original, loader = DALILeRobotIterator._ensure_pipeline, []

    def loaded_first(self, loads):
        if not loader:  # (the stream loads; the load's close of the pipeline waits for the pass's lock)
            loader.append(_loading_from_another_thread(it, state))
        return original(self, loads)

    monkeypatch.setattr(DALILeRobotIterator, "_ensure_pipeline", loaded_first)
    batches = iter(it)
    loader[0].join(timeout=60)
    assert not loader[0].is_alive()
    with pytest.raises(IteratorClosedError, match=r"load_state_dict\(\) moved the stream to sample 6 of epoch 0"):
        next(batches)
    rest = [int(i) for b in it for i in b["index"]]
    it.close()
    assert rest == reference[6:]


class _StubPrefetcher:
    """What a pass asks of a remote dataset's prefetcher, doing nothing."""

    def set_order(self, order) -> None:
        pass

    def warm(self, epoch, samples_consumed, *, progress) -> None:
        pass

    def advance(self, epoch, samples_consumed) -> None:
        pass

    def close(self) -> None:
        pass


def test_close_from_another_thread_as_the_pass_tells_the_prefetcher_ends_it_with_a_clear_error(make_ds) -> None:
    """A close() from another thread (the exit handler's, under a daemon loader thread) that set the prefetcher to None
    between the pass's check of it and its call raised AttributeError ('NoneType' object has no attribute 'advance')
    out of the pass; it now gets IteratorClosedError at its next batch, and iterating again carries on."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = _StubPrefetcher()
    lines, first = inspect.getsourcelines(DALILeRobotIterator._epoch_batches)
    advance_line = first + next(i for i, line in enumerate(lines) if "prefetcher.advance(" in line)
    closes = []

    def close_there(frame, event, arg):  # (another thread's close(), run at that line of the pass's first batch)
        if event == "line" and frame.f_lineno == advance_line and not closes:
            closes.append(threading.Thread(target=it.close))
            closes[0].start()
            closes[0].join(timeout=60)
        return close_there

    def traced(frame, event, arg):
        return close_there if frame.f_code is DALILeRobotIterator._epoch_batches.__code__ else None

    seen: list[int] = []
    with tracing(traced), pytest.raises(IteratorClosedError, match="when the iterator was closed"):
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    assert len(closes) == 1 and it._prefetcher is None
    for batch in it:
        seen += [int(i) for i in batch["index"]]
    it.close()
    assert seen == reference


@pytest.mark.parametrize(("where", "num_workers"), [("build_pipeline", 0), ("DALIGenericIterator", 1)])
def test_a_handlers_close_while_a_pass_builds_its_pipeline_closes_it(make_ds, monkeypatch, where, num_workers) -> None:
    """A signal handler's close() on the thread building a pass's pipeline (iter(): a loop's next epoch, a mixture
    part's) took the pass's lock again (an RLock) and closed nothing yet built: the build went on, and the pass read on
    with its pipeline and workers running after close() (close() at each line of iter(): 159 of 160 points without
    workers; 25 of 25 sampled with 2, each leaving both running). The pass now closes what it built and raises
    IteratorClosedError, and the next carries on at the same sample."""
    from nvidia.dali.plugin import pytorch as dali_pytorch

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    module = iterator_module if where == "build_pipeline" else dali_pytorch
    original = getattr(module, where)

    def handler_closes_meanwhile(*args, **kwargs):
        made = original(*args, **kwargs)  # (DALIGenericIterator: built after the workers started)
        it.close()
        return made

    monkeypatch.setattr(module, where, handler_closes_meanwhile)
    batches = iter(it)
    assert it._pipeline is None and multiprocessing.active_children() == []
    with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
        next(batches)
    monkeypatch.setattr(module, where, original)
    seen = [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def test_a_handlers_close_during_close_leaves_the_next_pass_reading(make_ds) -> None:
    """A signal handler's close() inside close() while it held the pass's lock is left to that close(), which clears
    the flag saying so: it cleared it before letting the lock go, and a handler landing between the two left it set,
    so the next pass closed the pipeline it built and raised IteratorClosedError (a close() at each line close() runs:
    2 of 12 lines)."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    code = DALILeRobotIterator._close_by.__code__  # (close()'s body)
    it = DALILeRobotIterator(root, **kwargs)
    reference = [int(i) for b in it for i in b["index"]][:4]
    runs: list[int] = []  # (the lines a close() after a pass runs)

    def lines_run(frame, event, arg):
        if event == "line":
            runs.append(frame.f_lineno)
        return lines_run

    with tracing(lambda frame, event, arg: lines_run if frame.f_code is code else None):
        it.close()
    wrong = []
    for line in dict.fromkeys(runs):
        it = DALILeRobotIterator(root, **kwargs)
        seen = [int(i) for i in next(iter(it))["index"]]
        fired: list[int] = []

        def in_close(frame, event, arg, line=line, it=it, fired=fired):
            if event == "line" and frame.f_lineno == line and not fired:
                fired.append(line)
                it.close()  # (as a signal handler's, landing at that line)
            return in_close

        def calls(frame, event, arg, in_close=in_close, fired=fired):
            return in_close if frame.f_code is code and not fired else None

        with tracing(calls):
            it.close()
        try:
            seen += [int(i) for i in next(iter(it))["index"]]
        except IteratorClosedError:
            wrong.append(line)
        finally:
            it.close()
        assert fired == [line] and (line in wrong or seen == reference)
    assert len(runs) > 5 and wrong == []


def test_a_ctrl_c_before_the_stream_counts_a_batch_resumes_without_losing_it(make_ds, monkeypatch) -> None:
    """A Ctrl-C after DALI handed a batch out but before the stream counted it left the pipeline in place, one
    batch ahead of the stream: the next pass lost that batch."""
    from lerobot_dali.stream_state import SampleStream

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    original, calls = SampleStream.advance, [0]

    def interrupted_once(self, n, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return original(self, n, **kwargs)

    monkeypatch.setattr(SampleStream, "advance", interrupted_once)
    assert _indices_across_a_ctrl_c(DALILeRobotIterator(root, **kwargs)) == reference


class _InterruptedRelease:
    """The pass's lock, whose release after the ``n``-th batch DALI handed out raises KeyboardInterrupt: where a
    signal's handler runs when the signal lands after DALI's next() returned (the check after the lock's C
    ``__exit__``), outside the pass's handlers."""

    def __init__(self, lock: Any, n: int) -> None:
        self._lock, self._left = lock, n

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return self._lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        if sys._getframe(1).f_code.co_name == "_next_batch" and exc == (None, None, None):
            self._left -= 1
            if self._left == 0:
                raise KeyboardInterrupt


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_interrupt_as_the_pass_lets_its_lock_go_loses_no_batch(make_ds, num_workers: int) -> None:
    """A Ctrl-C landing after DALI's next() returned a batch, as the pass let its lock go (before the stream counted
    the batch): the pass carried on with the same pipeline, one batch past the stream, so that batch was never seen
    (measured: 4 of 52 samples lost, 1 of 112 injection points). The pipeline stands nowhere until the batch is
    counted, so the next pass rebuilds it at the stream's position."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._next_lock = _InterruptedRelease(it._next_lock, n=3)
    seen = _indices_across_a_ctrl_c(it)
    assert (len(seen), seen) == (len(reference), reference)


def _indices_across_a_ctrl_c(it: DALILeRobotIterator) -> list[int]:
    """The ``index`` values of a pass that a KeyboardInterrupt ends, then of the pass the user carries on with
    on the same iterator (closed after)."""
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    for batch in it:
        seen += [int(i) for i in batch["index"]]
    it.close()
    return seen


@pytest.mark.parametrize(("device", "visible", "match"), [
    ("cuda", 0, "sees no CUDA GPU: .* or pass device='cpu'"),
    ("cuda:0", 0, "sees no CUDA GPU: .* or pass device='cpu'"),
    ("cuda:2", 2, r"this process sees 2 GPU.*: pass a device from 'cuda:0' to 'cuda:1' \(the GPUs"),
    (torch.device("cuda", 2), 2, r"sees 2 GPU.*: pass a device from 'cuda:0' to 'cuda:1'"),  # accelerator's
])  # fmt: skip
def test_a_gpu_device_the_process_does_not_see_fails_before_the_dataset_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str | torch.device, visible: int, match: str
) -> None:
    """It built, silently decoding on the CPU, and the first batch failed inside DALI (``cuInitChecked``)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    with pytest.raises(CudaUnavailableError, match=match):
        DALILeRobotIterator(tmp_path / "no-such-dataset", device=device)


def test_option_values_in_another_case_are_taken_and_wrong_types_refused_up_front(make_ds) -> None:
    """timestamp_source="FRAME_INDEX", rank_balance="PAD" and depth_unit="MM" were refused (only decode= took any
    case); cpu_decode="pyav" or a dict built, then failed at the first batch ("'str' object has no attribute
    'converts_in_graph'"); tolerance_s=0 built, then failed rows read by frame_index at their own frames."""
    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(
        root, device="cpu", batch_size=4, num_workers=0, drop_last=False, timestamp_source="FRAME_INDEX",
        rank_balance="PAD", depth_unit="MM", cpu_decode=CpuDecodeOptions(backend="PyAV"),  # type: ignore[arg-type]
    )  # fmt: skip
    assert it._timestamp_source is TimestampSource.FRAME_INDEX and it._cpu_decode.backend is CpuDecoderBackend.PYAV
    assert sum(len(batch["index"]) for batch in it) == it.reader.num_frames
    it.close()
    for given in ("pyav", {"backend": "pyav"}):
        with pytest.raises(TypeError, match=r"cpu_decode must be a CpuDecodeOptions or None, got .*CpuDecodeOptions\("):
            DALILeRobotIterator(root, device="cpu", cpu_decode=given)
    with pytest.raises(ValueError, match="tolerance_s must be more than 0 seconds"):
        DALILeRobotIterator(root, device="cpu", tolerance_s=0, timestamp_source="frame_index")


def test_choices_and_counts_from_a_config_are_taken_or_refused_with_the_allowed_values(make_ds) -> None:
    root = _dataset(make_ds, "vp9")
    for option, allowed in (
        ("timestamp_source", "'parquet_timestamp', 'frame_index'"),
        ("rank_balance", "'pad', 'drop', 'none'"),
        ("decode", "'auto', 'gpu', 'cpu'"),
    ):
        with pytest.raises(ValueError, match=f"{option} must be one of {allowed}, got 'even'"):
            DALILeRobotIterator(root, device="cpu", **{option: "even"})
    # numpy integers (a config read with numpy, a sweep) are ints
    it = DALILeRobotIterator(
        root, device="cpu", batch_size=np.int64(3), num_workers=np.int64(0), image_size=(np.int64(32), 48)
    )
    batch = next(iter(it))
    assert batch["observation.images.cam0"].shape == (3, 3, 32, 48) and type(it.batch_size) is int
    it.close()


def test_selections_name_the_argument_a_key_belongs_to(make_ds) -> None:
    root = _dataset(make_ds, "vp9")
    with pytest.raises(TypeError, match=r"takes a list of keys, got the string 'observation.images.cam0'"):
        DALILeRobotIterator(root, device="cpu", cameras="observation.images.cam0")
    with pytest.raises(DatasetError, match=r"\['observation.images.cam0'\]: select these with cameras=, not keys="):
        DALILeRobotIterator(root, device="cpu", keys=["action", "observation.images.cam0"])
    with pytest.raises(DatasetError, match=r"\['action'\]: select these with keys=, not cameras="):
        DALILeRobotIterator(root, device="cpu", cameras=["action"])


def test_a_task_index_window_is_refused_at_construction(make_ds) -> None:
    """It built, then every batch failed turning a (B, T) task index into strings."""
    with pytest.raises(DeltaTimestampsError, match="'task_index'.*takes no window"):
        DALILeRobotIterator(_dataset(make_ds, "vp9"), device="cpu", delta_timestamps={"task_index": [0.0]})


def test_an_epoch_too_short_for_one_batch_is_warned_of(make_ds, caplog: pytest.LogCaptureFixture) -> None:
    root = _dataset(make_ds, "vp9")  # 23 frames
    with caplog.at_level("WARNING", logger="lerobot_dali.iterator"):
        it = DALILeRobotIterator(root, device="cpu", batch_size=24, num_workers=0)
    assert len(it) == 0 and "gets 23 samples an epoch, fewer than batch_size=24" in caplog.text
    it.close()


def test_a_second_iter_at_the_same_position_ends_the_first_pass(make_ds) -> None:
    """Both generators read the same pipeline: the older one went on after the newer one's epoch ended, running
    a whole further epoch (a ``next(iter(it))`` peek kept around does this)."""
    kwargs = dict(batch_size=4, shuffle=True, device="cpu", num_workers=0, drop_last=False)
    root = _dataset(make_ds, "vp9")
    reference = DALILeRobotIterator(root, **kwargs)
    expected = [int(i) for batch in reference for i in batch["index"]]
    reference.close()
    it = DALILeRobotIterator(root, **kwargs)
    first = iter(it)
    seen = [int(i) for i in next(first)["index"]]
    second = iter(it)  # the stream stands where the first pass left it: same pipeline, a new pass
    seen += [int(i) for batch in second for i in batch["index"]]
    assert seen == expected and it.epoch == 1
    with pytest.raises(IteratorClosedError, match="newer pass"):
        next(first)
    assert it.epoch == 1 and len(it) == 6  # the old pass read nothing of epoch 1
    it.close()


def test_a_pass_whose_pipeline_a_newer_pass_replaced_refuses_to_read(make_ds) -> None:
    """A pass takes its pipeline when iter() is called, not at its first batch: it read the newer pass's batches."""
    kwargs = dict(batch_size=2, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(_dataset(make_ds, "vp9"), **kwargs)
    first = iter(it)
    it.set_epoch(1)  # the stream moves: the next iter() builds a new pipeline
    second = iter(it)
    with pytest.raises(IteratorClosedError, match="newer pass"):
        next(first)
    assert next(second)["index"].tolist() == [0, 1]
    it.close()


def test_a_camera_file_of_another_codec_is_refused_naming_it_and_the_copy_that_mends_it() -> None:
    """LeRobot 0.4's delete_episodes and split_dataset re-encode the files they cut as AV1 and keep the others: an
    H.264 camera then mixes codecs. Where DALI decodes the camera (its CPU decoder for VP9 here) and a file of another
    codec is read that the build did not survey (past its bound) the refusal names the file and offers `lerobot-dali
    reencode` (tests/test_mixed_codecs.py: the workers read such a camera); another size alone asks to re-encode the
    file."""
    from types import SimpleNamespace

    from lerobot_dali.batch_source import CameraFormat
    from lerobot_dali.decode_route import DecodeRoute
    from lerobot_dali.errors import SchemaMismatchError

    untagged = (2, False)  # (colour space, full range), which DALI's CPU decoder holds a camera's files to
    first = CameraFormat.of(
        SimpleNamespace(codec="vp9", height=48, width=64, color=untagged), route=DecodeRoute.DALI_CPU
    )
    av1 = SimpleNamespace(codec="av1", height=48, width=64, color=untagged)
    with pytest.raises(SchemaMismatchError, match=r"^cut\.mp4 \(episode 3, camera 'top'\) is av1, but the "
                       r"camera's first file is vp9 48x64 \(HxW\) colour space 2, .*DALI's CPU decoder"
                       r".*`lerobot-dali reencode`.*others\)$"):  # fmt: skip
        first.check(av1, path="cut.mp4", episode=3, camera="top")
    with pytest.raises(SchemaMismatchError, match=r"re-encode this file$"):
        first.check(SimpleNamespace(codec="vp9", height=96, width=64, color=untagged), path="big.mp4", episode=4,
                    camera="top")  # fmt: skip
    first.check(SimpleNamespace(codec="vp9", height=48, width=64, color=untagged), path="same.mp4", episode=5,
                camera="top")  # fmt: skip


class _Workers:
    """A DALI worker pool's stand-in; ``collects``: the cycle collector runs inside its close (as it may in any
    allocation there)."""

    def __init__(self, *, collects: bool = False) -> None:
        self.collects, self.closed = collects, 0

    def close(self) -> None:
        if self.collects:
            gc.collect()
        self.closed += 1


class _Pipeline:
    def __init__(self, workers: _Workers) -> None:
        self._py_pool, self._pipe = workers, None  # (DALI's worker pool and backend)

    def _shutdown(self) -> None:
        pass


def test_an_iterator_freed_by_the_collector_inside_a_worker_pools_close_closes_its_own() -> None:
    """The cycle collector runs inside any allocation, one in DALI's pool close under the lock that keeps those
    closes apart too, and an iterator it frees closes its own pool there (__del__ -> close()): with a plain lock
    that thread hung for good."""
    freed_workers, workers = _Workers(), _Workers(collects=True)
    done = threading.Event()

    def close_a_pipeline() -> None:
        iterator_module._close_workers(_Pipeline(workers))
        done.set()

    gc.disable()
    try:
        freed = object.__new__(DALILeRobotIterator)  # (only what close() reads: its process and pipeline)
        freed._pid, freed._pipeline, freed.cycle = os.getpid(), _Pipeline(freed_workers), freed
        del freed  # (freed by the collector only)
        threading.Thread(target=close_a_pipeline, daemon=True).start()  # (a hang stays in its thread)
        assert done.wait(timeout=30), "the thread hung on the worker pools' close lock"
    finally:
        gc.enable()
    assert (workers.closed, freed_workers.closed) == (1, 1)


def test_close_of_an_iterator_whose_construction_failed_raises_nothing(make_ds) -> None:
    """__del__ closes an iterator whose __init__ raised (a bad argument, a missing data file): close() read the
    deferral flag __init__ had not set yet, AttributeError in __del__ ("Exception ignored in"), a traceback on
    stderr under a pipeline's own one-line error."""
    root = make_ds(episodes=1, frames_per_episode=4, cameras=0)
    failed = object.__new__(DALILeRobotIterator)
    with pytest.raises(ValueError, match="batch_size"):
        failed.__init__(root, batch_size=0, device="cpu")  # type: ignore[misc]
    failed.close()


@contextlib.contextmanager
def tracing(trace: Any) -> Iterator[None]:
    """``sys.settrace(trace)`` for the block, then the trace function before it: ``sys.settrace(None)`` there switched
    coverage.py's off for the rest of the run (every later test's lines counted as not run)."""
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


class SecondSignal:
    """Tracing ``codes``: a KeyboardInterrupt (a second signal's handler) raised at the ``k``-th line they run once
    ``armed()`` (a first signal's close() was left to the pass); ``at`` is that line (None: fewer lines ran)."""

    def __init__(self, k: int, codes: tuple[Any, ...], armed: Any, skip: tuple[int, ...] = ()) -> None:
        self.k, self.codes, self.armed, self.skip = k, codes, armed, skip
        self.lines, self.at = 0, None

    def __enter__(self) -> SecondSignal:
        self._previous = sys.gettrace()
        sys.settrace(self._calls)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)

    def _calls(self, frame, event, arg):
        return self._line if frame.f_code in self.codes and self.at is None else None

    def _line(self, frame, event, arg):
        if event == "line" and self.at is None and frame.f_lineno not in self.skip and self.armed():
            self.lines += 1
            if self.lines == self.k:
                self.at = (frame.f_code.co_name, frame.f_lineno)
                raise KeyboardInterrupt
        return self._line


@pytest.mark.parametrize("where", ["next", "build"])
def test_a_second_signal_in_a_handlers_deferred_close_loses_no_close(make_ds, monkeypatch, where) -> None:
    """A signal handler's close() inside DALI's next() (or as iter() builds the pipeline) is left to the pass, which
    runs it once it lets its lock go; a second signal's exception (a Ctrl-C after a SIGTERM handler's close()) at a line
    of that run before it closed anything lost it: the pipeline ran on after the KeyboardInterrupt (8 of 15 lines, in
    next() and in the build alike). The pass now runs it again as the exception leaves."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    owner, name = (DALIGenericIterator, "__next__") if where == "next" else (iterator_module, "build_pipeline")
    original = getattr(owner, name)
    codes = tuple(getattr(DALILeRobotIterator, name).__code__ for name in ("_close_if_deferred", "close", "_close_by"))
    reached, lost = [], []
    for k in itertools.count(1):
        it = DALILeRobotIterator(root, **kwargs)
        calls = [0]

        def handler_closes(*args, it=it, calls=calls, **kw):
            calls[0] += 1
            made = original(*args, **kw)
            if calls[0] == 2 or where == "build":
                it.close()  # (a signal handler's, on the pass's thread holding its lock: left to the pass)
            return made

        monkeypatch.setattr(owner, name, handler_closes)
        # (KeyboardInterrupt: the second signal; IteratorClosedError: the close, run with no second signal)
        with (
            SecondSignal(k, codes, lambda it=it: it._close_deferred) as second,
            contextlib.suppress(KeyboardInterrupt, IteratorClosedError),
        ):
            for _ in it:
                pass
        monkeypatch.setattr(owner, name, original)
        if second.at is None:
            break
        reached.append(second.at)
        if it._pipeline is not None:
            lost.append(second.at)
        it.close()
    assert len(reached) > 10 and lost == []


def test_a_handlers_close_as_another_threads_close_lets_the_lock_go_is_not_cleared_by_it(make_ds, monkeypatch) -> None:
    """Another thread's close() clears the flag saying a handler's close() was left to it once it lets the pass's lock
    go; a pass that took the lock then, whose handler's close() was left to it meanwhile (as it built its pipeline),
    found the flag cleared: it handed a working pipeline out after the handler's close() (1 of 1). That close() now
    clears only what a handler on its own thread left to it: the pass closes what it built."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(root, **kwargs)
    lines, first = inspect.getsourcelines(DALILeRobotIterator._close_by)  # (close()'s body)
    release = first + next(i for i, line in enumerate(lines) if line.strip() == "lock.release()")
    released, at_clear, go = [], threading.Event(), threading.Event()

    def after_release(frame, event, arg):  # (the closer waits at the line after it let the lock go)
        if event == "line" and released and not at_clear.is_set():
            at_clear.set()
            go.wait(30)
        if event == "line" and frame.f_lineno == release:
            released.append(release)
        return after_release

    def closer() -> None:
        with tracing(
            lambda frame, event, arg: after_release if frame.f_code is DALILeRobotIterator._close_by.__code__ else None
        ):
            it.close()

    thread = threading.Thread(target=closer)
    thread.start()
    assert at_clear.wait(30)
    original = iterator_module.build_pipeline

    def handler_closes_meanwhile(*args, **kwargs):
        made = original(*args, **kwargs)
        it.close()  # (a signal handler's, on the pass's thread holding its lock: left to the pass)
        go.set()
        thread.join(30)
        return made

    monkeypatch.setattr(iterator_module, "build_pipeline", handler_closes_meanwhile)
    batches = iter(it)
    monkeypatch.setattr(iterator_module, "build_pipeline", original)
    assert not thread.is_alive() and it._pipeline is None
    with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
        next(batches)
    it.close()


class SignalAfterCall:
    """Profiling ``in_code`` (a predicate over code objects, or one code): a KeyboardInterrupt (a signal's handler)
    raised at the ``k``-th point where CPython runs one there: right after a call it makes to a C function returns, and
    as a Python function it calls starts (``at``: that point; None: fewer ran). A line tracer's exception lands on a
    try's own line too, outside the try: none can. ``opaque``: codes of Python stand-ins for C functions (a counting
    wrapper), whose return is the point, as a C function's would be."""

    def __init__(self, k: int, in_code: Any, opaque: tuple[Any, ...] = ()) -> None:
        self.in_code = in_code if callable(in_code) else (lambda code: code is in_code)
        self.k, self.opaque, self.points, self.at = k, opaque, 0, None

    def __enter__(self) -> SignalAfterCall:
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _event(self, frame, event, arg):
        if frame.f_code in self.opaque:
            if event != "return":
                return
            event, arg, frame = "c_return", frame.f_code, frame.f_back
        caller = frame if event == "c_return" else frame.f_back
        if self.at is None and event in ("c_return", "call") and caller is not None and self.in_code(caller.f_code):
            self.points += 1
            if self.points == self.k:
                name = getattr(arg, "__name__", getattr(arg, "co_name", frame.f_code.co_name))
                self.at = (event, name, caller.f_code.co_name, caller.f_lineno)
                raise KeyboardInterrupt


class _CountingPrefetcher(_StubPrefetcher):
    def __init__(self) -> None:
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def test_a_ctrl_c_in_close_leaves_the_lock_free_for_the_next_close(make_ds, monkeypatch) -> None:
    """close() took the pass's lock before the try whose finally lets it go: a Ctrl-C right after acquire() returned
    left it held by the thread for ever, so that thread's next close() (its exit handler's) was left to a pass that
    never came, and another thread's (__del__, a watchdog's) waited CLOSE_WAIT_S and gave up: the pipeline and the
    prefetcher ran on (a KeyboardInterrupt at each point close() can take one: 1 of 12). Now none leaves it held."""
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 1)  # (the old code's wait, where the lock stayed held)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    in_close = (DALILeRobotIterator.close.__code__, DALILeRobotIterator._close_by.__code__).__contains__  # (its body)
    reached, left = [], []
    for k in itertools.count(1):
        it = DALILeRobotIterator(root, **kwargs)
        it._prefetcher = prefetcher = _CountingPrefetcher()
        next(iter(it))
        pipeline = it._pipeline
        with SignalAfterCall(k, in_close) as signal, contextlib.suppress(KeyboardInterrupt):
            it.close()
        if signal.at is None:
            it.close()
            break
        reached.append(signal.at)
        held = iterator_module.fork_locks.held_here(it._next_lock)
        closer = threading.Thread(target=it.close)  # (__del__ on the collector's thread, a watchdog)
        closer.start()
        closer.join()
        it.close()  # (this thread's: the exit handler's)
        if held or it._pipeline is not None or pipeline._pipe is not None or prefetcher.closes != 1:
            left.append(signal.at)
            with contextlib.suppress(RuntimeError):
                it._next_lock.release()
            it.close()
    assert len(reached) > 8 and left == []


class _CountingBackend:
    """A DALI pipeline's backend that counts the shutdowns asked of it, each passed on."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.shutdowns = backend, 0

    def Shutdown(self) -> None:  # (DALI's name)
        self.shutdowns += 1
        self.backend.Shutdown()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def test_a_ctrl_c_anywhere_in_close_leaves_what_it_did_not_close_to_the_next_close(make_ds, monkeypatch) -> None:
    """close() let go of the pipeline and its source before shutting them down: a Ctrl-C as DALI's shutdown began, or
    right after its backend's Shutdown() returned, or as the source's close began, left them to the cycle collector or
    DALI's exit handler, and the next close() found nothing to close (a KeyboardInterrupt at each point close() and
    the functions of iterator.py it calls can take one: 3 of 22 points). At each point now (29) the lock is free, and
    the next close() finishes the job: the pipeline shut down exactly once, its source and prefetcher closed once."""
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali.batch_source import BatchSource

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    close_source = BatchSource.close

    def counted_close(source: BatchSource) -> None:
        close_source(source)
        source.closes = getattr(source, "closes", 0) + 1  # type: ignore[attr-defined]

    monkeypatch.setattr(BatchSource, "close", counted_close)

    def in_close(code: Any) -> bool:  # (close() and its callees: iterator.py's, and DALI's shutdown)
        return code.co_filename == iterator_module.__file__ or code is Pipeline._shutdown.__code__

    reached, left = [], []
    for k in itertools.count(1):
        it = DALILeRobotIterator(root, **kwargs)
        it._prefetcher = prefetcher = _CountingPrefetcher()
        next(iter(it))
        pipeline, source = it._pipeline, it._source
        pipeline._pipe = backend = _CountingBackend(pipeline._pipe)
        with (
            SignalAfterCall(k, in_close, opaque=(_CountingBackend.Shutdown.__code__,)) as signal,
            contextlib.suppress(KeyboardInterrupt),
        ):
            it.close()
        held = iterator_module.fork_locks.held_here(it._next_lock)
        it.close()
        shut = pipeline._pipe is None and backend.shutdowns == 1 and it._pipeline is None
        closed = getattr(source, "closes", 0) == 1 and it._source is None and prefetcher.closes == 1
        if held or not shut or not closed:
            left.append(signal.at)
        if signal.at is None:
            break
        reached.append(signal.at)
        if held:
            it._next_lock.release()
        backend.backend.Shutdown()  # (where it was left: a pipeline of each point ran on otherwise)
    assert len(reached) > 15 and left == []


def test_a_handlers_close_left_set_as_another_thread_builds_does_not_close_that_threads_passes(
    make_ds, monkeypatch
) -> None:
    """A handler's close() left to the pass on its thread is cleared by the close() that pass runs once the pipeline
    it saw is closed; another thread that built one meanwhile (after that close() let the lock go, before its check)
    left it set, and every pass of that other thread closed the pipeline it built as it let the lock go, since it ran
    any thread's deferral and its close() cleared only its own: its passes raised IteratorClosedError for ever (3 of
    3). A pass now runs only the deferral of its own thread."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(root, **kwargs)
    close_code, iter_code = DALILeRobotIterator._close_by.__code__, DALILeRobotIterator.__iter__.__code__
    lines, first = inspect.getsourcelines(DALILeRobotIterator._close_by)  # (close()'s body)
    release = first + next(i for i, line in enumerate(lines) if line.strip() == "lock.release()")
    lines, first = inspect.getsourcelines(DALILeRobotIterator.__iter__)
    built = first + next(i for i, line in enumerate(lines) if "self._pass_id += 1" in line)
    b_built, a_checked, failed = threading.Event(), threading.Event(), []

    def other_thread() -> None:  # (its first pass waits, its pipeline built, for the deferred close's check)
        def at_built(frame, event, arg):
            if event == "line" and frame.f_lineno == built and not b_built.is_set():
                b_built.set()
                a_checked.wait(30)
            return at_built

        with tracing(lambda frame, event, arg: at_built if frame.f_code is iter_code else None):
            batches = iter(it)
        for _ in range(3):
            try:
                next(batches)
            except IteratorClosedError:
                failed.append(1)
            batches = iter(it)

    thread = threading.Thread(target=other_thread)

    def after_release(frame, event, arg):  # (the deferred close, once it let the lock go: the other thread builds)
        if event == "line" and frame.f_lineno > release and not thread.is_alive() and not b_built.is_set():
            thread.start()
            b_built.wait(30)
        if event == "return" and b_built.is_set():
            a_checked.set()
        return after_release

    original = iterator_module.build_pipeline

    def handler_closes_meanwhile(*args, **kw):
        made = original(*args, **kw)
        monkeypatch.setattr(iterator_module, "build_pipeline", original)
        it.close()  # (a signal handler's, on the pass's thread holding its lock: left to the pass)
        sys.settrace(lambda frame, event, arg: after_release if frame.f_code is close_code else None)
        return made

    monkeypatch.setattr(iterator_module, "build_pipeline", handler_closes_meanwhile)
    with tracing(sys.gettrace()):  # (the handler sets a trace function; the one before it is put back after)
        iter(it)
    thread.join(60)
    assert b_built.is_set() and a_checked.is_set() and not thread.is_alive()
    it.close()
    assert failed == []


def test_a_close_that_gave_up_on_a_build_is_carried_out_by_the_pass(make_ds, monkeypatch) -> None:
    """close() from another thread waits CLOSE_WAIT_S for a pass holding the pipeline, then leaves it to that pass,
    saying it raises IteratorClosedError once the call returns: a pass building its pipeline (a remote dataset's
    warm-up, workers slow to start) overwrote the mark close() left and read on after it, its pipeline running (3 of 3
    batches). It now closes what it built once built, and the next pass carries on at the same sample."""
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0.2)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    original = iterator_module.build_pipeline
    closer = threading.Thread(target=it.close)

    def built_after_close_gave_up(*args, **kw):
        made = original(*args, **kw)
        closer.start()
        closer.join(30)  # (it waits CLOSE_WAIT_S for this build, and gives up)
        return made

    monkeypatch.setattr(iterator_module, "build_pipeline", built_after_close_gave_up)
    batches = iter(it)
    monkeypatch.setattr(iterator_module, "build_pipeline", original)
    assert not closer.is_alive()
    _closed_pass_then_the_next_carries_on(it, batches, reference)


def _closed_pass_then_the_next_carries_on(it: DALILeRobotIterator, batches, reference: list[int]) -> None:
    """The pipeline closed, the pass ``batches`` raises IteratorClosedError, and the next reads on from its sample:
    ``reference`` (the epoch) in all."""
    assert it._pipeline is None
    with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
        next(batches)
    seen = [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def test_a_build_that_ends_as_a_close_gives_up_on_it_still_closes_what_it_built(make_ds, monkeypatch) -> None:
    """close() from another thread counted the close it left to a pass building its pipeline only after its wait gave
    up and its warning was logged: a build that ended meanwhile (its pass checked the count, unchanged, and let the lock
    go before the count) read on with its pipeline and workers after close() returned, which had said the pass closes
    them once built (held there by a logging handler on the warning: 1 of 1). Counted before the wait now: the pass
    closes what it built, raises IteratorClosedError, and the next pass carries on at the same sample."""
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0)  # (it gives up at once: the pass holds the lock)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    original = iterator_module.build_pipeline
    warned, let_go = threading.Event(), threading.Event()
    closer = threading.Thread(target=it.close)

    class HeldAtTheWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("close(): a pass is still") and threading.current_thread() is closer:
                warned.set()
                let_go.wait(30)  # (until the pass let the lock go)

    def built_as_close_gives_up(*args, **kw):
        made = original(*args, **kw)
        closer.start()
        assert warned.wait(30)  # (the close gave up on this build)
        return made

    handler = HeldAtTheWarning()
    iterator_module.logger.addHandler(handler)
    try:
        monkeypatch.setattr(iterator_module, "build_pipeline", built_as_close_gives_up)
        batches = iter(it)
        monkeypatch.setattr(iterator_module, "build_pipeline", original)
    finally:
        let_go.set()
        closer.join(30)
        iterator_module.logger.removeHandler(handler)
    assert not closer.is_alive()
    _closed_pass_then_the_next_carries_on(it, batches, reference)


def test_a_ctrl_c_in_a_close_giving_up_on_a_build_still_leaves_the_close_to_the_pass(make_ds, monkeypatch) -> None:
    """close() from another thread told a pass building its pipeline to close what it built (counted) only after its
    wait gave up and its warning was logged: a Ctrl-C on the closing thread after it had cleared the pass's mark (in
    the wait, the warning) left it uncounted, and the pass read on with its pipeline and workers (5 of 10 points a
    signal's handler runs at in close() and the functions of iterator.py it calls). Now, from the point the mark is
    cleared, the pass closes what it built and the next pass carries on at the same sample; before it, the close did
    nothing and the pass reads on."""
    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0.2)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    lines, first = inspect.getsourcelines(DALILeRobotIterator._close_by)  # (close()'s body)
    mark = first + next(i for i, line in enumerate(lines) if "lock.acquire(blocking=False)" in line) + 1  # (the None)
    original = iterator_module.build_pipeline

    def in_close(code: Any) -> bool:  # (close() and its callees in iterator.py: the wait, the workers' close)
        return code.co_filename == iterator_module.__file__

    reached, left = [], []
    for k in itertools.count(1):
        it = DALILeRobotIterator(root, **kwargs)
        signals: list[SignalAfterCall] = []

        def interrupted_close(
            k: int = k, it: DALILeRobotIterator = it, signals: list[SignalAfterCall] = signals
        ) -> None:
            with SignalAfterCall(k, in_close) as signal, contextlib.suppress(KeyboardInterrupt):
                it.close()
            signals.append(signal)

        closer = threading.Thread(target=interrupted_close)

        def built_as_close_gives_up(*args, closer: threading.Thread = closer, **kw):
            made = original(*args, **kw)
            closer.start()
            closer.join(30)  # (it waits CLOSE_WAIT_S for this build, and gives up, or takes a Ctrl-C first)
            return made

        monkeypatch.setattr(iterator_module, "build_pipeline", built_as_close_gives_up)
        batches = iter(it)
        monkeypatch.setattr(iterator_module, "build_pipeline", original)
        assert not closer.is_alive()
        at = signals[0].at
        before_mark = at is not None and (
            at[2] in ("close", "close_deadline") or (at[2] == "_close_by" and at[3] < mark)
        )
        if before_mark:  # (nothing closed: the pass reads on)
            seen = [int(i) for i in next(batches)["index"]]
        elif it._pipeline is not None:  # (the pass read on: what it built still runs)
            left.append(at)
            seen = [int(i) for i in next(batches)["index"]]
        else:
            with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
                next(batches)
            seen = []
        seen += [int(i) for b in it for i in b["index"]]
        it.close()
        assert seen == reference, at
        if at is None:
            break
        reached.append(at)
    assert len(reached) > 5 and left == [], (reached, left)


@pytest.mark.parametrize("where", ["next", "build", "signal_in_next", "close"])
def test_a_close_nested_on_the_closing_or_reading_thread_leaves_the_lock_free(make_ds, monkeypatch, where) -> None:
    """close() on the thread that holds the pass's lock (a callback or a signal's handler inside DALI's next() or the
    build; a finalizer the collector runs inside close(), as a mixture's __del__) is left to the frame holding it and
    takes no second hold: once the pass or the close lets go, the lock is free (another thread takes it at once), the
    pipeline and prefetcher are closed, nothing is left deferred, and iterating again carries on at the same sample."""
    import signal as signal_module

    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = prefetcher = _CountingPrefetcher()
    seen = [int(i) for i in next(iter(it))["index"]] if where == "close" else []  # (a pipeline to close)
    owner, name = (iterator_module, "build_pipeline") if where == "build" else (DALIGenericIterator, "__next__")
    original, calls = getattr(owner, name), []
    previous = signal_module.signal(signal_module.SIGUSR1, lambda *_: it.close())

    def nested_close(*args, **kw):
        made = original(*args, **kw)
        if not calls:
            calls.append(iterator_module.fork_locks.held_here(it._next_lock))
            if where == "signal_in_next":
                os.kill(os.getpid(), signal_module.SIGUSR1)  # (its handler runs here, on this, the main thread)
            else:
                it.close()
        return made

    try:
        if where == "close":
            close_held = it._close_held

            def finalizer_closes() -> None:
                calls.append(iterator_module.fork_locks.held_here(it._next_lock))
                it.close()  # (the collector, run inside close(), freeing what closes this iterator)
                close_held()

            monkeypatch.setattr(it, "_close_held", finalizer_closes)
            it.close()
        else:
            monkeypatch.setattr(owner, name, nested_close)
            with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
                for batch in it:
                    seen += [int(i) for i in batch["index"]]
            monkeypatch.setattr(owner, name, original)
    finally:
        signal_module.signal(signal_module.SIGUSR1, previous)
    assert calls == [True]
    assert not iterator_module.fork_locks.held_here(it._next_lock)
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(it._next_lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert taken == [True]  # (free: held by the thread that took it, now ended, so let go here no more)
    assert it._pipeline is None and it._dali_iter is None and it._close_deferred == 0 and prefetcher.closes == 1
    it._next_lock = iterator_module.fork_locks.rlock()  # (the ended thread's hold)
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def test_a_handlers_close_left_undone_by_an_interrupted_close_is_carried_out_by_another_threads_pass(
    make_ds, monkeypatch
) -> None:
    """The loop reads on a thread of its own; the main thread's close() (a finally's) holds the pass's lock when a
    signal's handler there calls close(), left to it, and then raises (sys.exit) before anything was closed: the
    handler's close stays deferred to the main thread, whose frames are gone. The loop's next batch raised
    IteratorClosedError, and its pass, which runs only its own thread's deferral, left the pipeline and the prefetcher
    running until another close() or the exit. That pass now carries the close out as it lets the lock go."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = prefetcher = _CountingPrefetcher()
    read_one, closed, seen, errors = threading.Event(), threading.Event(), [], []

    def loop() -> None:
        batches = iter(it)
        seen.extend(int(i) for i in next(batches)["index"])
        read_one.set()
        closed.wait(30)
        try:
            next(batches)
        except IteratorClosedError as e:
            errors.append(e)

    def handler_then_exit() -> None:
        it.close()  # (the handler's: this thread holds the lock, so it is left to this close())
        raise SystemExit(1)  # (before this close() closed anything)

    reader = threading.Thread(target=loop)
    reader.start()
    read_one.wait(30)
    monkeypatch.setattr(it, "_close_held", handler_then_exit)
    with pytest.raises(SystemExit):
        it.close()
    monkeypatch.undo()
    assert it._close_deferred == threading.get_ident() and it._pipeline is not None
    closed.set()
    reader.join(30)
    assert not reader.is_alive() and len(errors) == 1
    assert it._pipeline is None and prefetcher.closes == 1
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def test_a_handlers_close_left_undone_by_an_interrupted_close_is_done_by_another_threads_close(
    make_ds, monkeypatch
) -> None:
    """As above, the handler's close() left to the main thread's interrupted close(): a watchdog's close() then closed
    everything but left that deferral set (a close() cleared only its own thread's), so the main thread's next pass,
    started after it, closed the pipeline it built and raised IteratorClosedError (1 of 1). It is now cleared by the
    close() that did it, and that pass reads on at the same sample."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    seen = [int(i) for i in next(iter(it))["index"]]

    def handler_then_exit() -> None:
        it.close()  # (the handler's: this thread holds the lock, so it is left to this close())
        raise SystemExit(1)  # (before this close() closed anything)

    monkeypatch.setattr(it, "_close_held", handler_then_exit)
    with pytest.raises(SystemExit):
        it.close()
    monkeypatch.undo()
    assert it._close_deferred == threading.get_ident() and it._pipeline is not None
    watchdog = threading.Thread(target=it.close)
    watchdog.start()
    watchdog.join(30)
    assert not watchdog.is_alive() and it._pipeline is None
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def test_a_close_that_gave_up_on_a_pass_inside_next_is_carried_out_by_it(make_ds, monkeypatch) -> None:
    """close() from another thread that waited CLOSE_WAIT_S for a pass inside DALI's next() and gave up left the
    pipeline and the prefetcher to it: the pass raised IteratorClosedError at its next batch and left both running
    until the next close() (or exit). The pass now closes them as it raises, the given-up count closes no later build,
    and the next pass carries on at the same sample."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0.2)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = prefetcher = _CountingPrefetcher()
    original, calls = DALIGenericIterator.__next__, [0]
    closer = threading.Thread(target=it.close)

    def close_gives_up_meanwhile(self):
        calls[0] += 1
        if calls[0] == 2:
            closer.start()
            closer.join(30)  # (it waits CLOSE_WAIT_S for this pass, inside next(), and gives up)
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", close_gives_up_meanwhile)
    seen: list[int] = []
    with pytest.raises(IteratorClosedError, match="when the iterator was closed"):
        for batch in it:
            seen += [int(i) for i in batch["index"]]
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    assert not closer.is_alive() and it._closes_left_to_pass == 1
    assert it._pipeline is None and prefetcher.closes == 1 and len(seen) == 4
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


@pytest.mark.parametrize("where", ["batch", "end"])
def test_a_close_that_gave_up_on_a_pass_inside_next_is_done_as_next_returns(make_ds, monkeypatch, where) -> None:
    """close() from another thread that gave up on a pass inside DALI's next() (CLOSE_WAIT_S) left the pipeline and the
    prefetcher to that pass, which closed them only at its next batch: a loop that stopped after the batch that next()
    returned (or whose epoch ended there) left both running until the next close() or exit (1 of 1 each). The pass now
    closes them as next() returns, and the next pass carries on at the same sample."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0)  # (it gives up at once: the pass holds the lock)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = prefetcher = _CountingPrefetcher()
    original, calls, pipelines = DALIGenericIterator.__next__, [0], []
    closer = threading.Thread(target=it.close)

    def close_gives_up_meanwhile(self):
        calls[0] += 1
        pipelines.append(it._pipeline)
        ended = True
        try:
            made = original(self)
            ended = False
            return made
        finally:
            if (calls[0] == 2 if where == "batch" else ended) and closer.ident is None:
                closer.start()
                closer.join(30)  # (it finds this pass inside next() and gives up)

    monkeypatch.setattr(DALIGenericIterator, "__next__", close_gives_up_meanwhile)
    seen: list[int] = []
    for batch in it:
        seen += [int(i) for i in batch["index"]]
        if len(seen) == 4 and where == "batch":
            break  # (the loop stops after the batch next() returned)
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    assert closer.ident is not None and not closer.is_alive() and it._closes_left_to_pass == 1
    assert it._pipeline is None and pipelines[-1]._pipe is None and prefetcher.closes == 1  # (shut down, closed)
    assert len(seen) == (4 if where == "batch" else len(reference))
    seen += [int(i) for b in it for i in b["index"]] if where == "batch" else []
    it.close()
    assert seen == reference


def test_a_child_forked_as_next_returns_after_a_close_gave_up_leaves_the_closing_to_the_parent(
    make_ds, monkeypatch
) -> None:
    """A pass whose DALI next() returned after another thread's close() gave up on it closes the pipeline, its source
    and the prefetcher right there, with _close_held(), not close(), which does nothing in a forked child: a child
    forked at that moment (a signal handler's fork) that carried on closed the parent's source and prefetcher (1 of
    1; a prefetcher's close waits for its writes, which are the parent's threads'). The child leaves them to the
    parent now, as close() does; it gets the batch, and the parent closes everything once."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    monkeypatch.setattr(iterator_module, "CLOSE_WAIT_S", 0)  # (it gives up at once: the pass holds the lock)
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=False, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(root, **kwargs)
    it._prefetcher = prefetcher = _CountingPrefetcher()
    pass_ = iter(it)
    assert next(pass_)["index"].tolist() == [0, 1]
    original, forks = DALIGenericIterator.__next__, []

    def close_gives_up_then_fork(self):
        made = original(self)
        closer = threading.Thread(target=it.close)
        closer.start()
        closer.join(30)  # (it finds this pass inside next() and gives up)
        forks.append(os.fork())
        return made

    monkeypatch.setattr(DALIGenericIterator, "__next__", close_gives_up_then_fork)
    parent = os.getpid()
    try:
        batch = next(pass_)
    except BaseException:
        if os.getpid() != parent:  # (never back into pytest: os._exit)
            os._exit(3)
        raise
    if os.getpid() != parent:
        left = it._source is not None and prefetcher.closes == 0
        os._exit(0 if left and batch["index"].tolist() == [2, 3] else 1)
    monkeypatch.undo()
    assert os.waitstatus_to_exitcode(os.waitpid(forks[0], 0)[1]) == 0
    assert batch["index"].tolist() == [2, 3]
    assert it._pipeline is None and it._source is None and prefetcher.closes == 1  # (the parent closed them)
    it.close()


def test_a_load_state_dict_during_another_threads_close_does_not_close_the_source_under_its_shutdown(
    make_ds, monkeypatch
) -> None:
    """load_state_dict() closes the pipeline to rebuild it at the loaded position; it did so without the pass's lock,
    and since close() keeps the pipeline and its source until they are closed (7072cf6), one called while another
    thread's close() was inside DALI's Shutdown() (a mixture restoring its datasets' positions after a Ctrl-C, as a
    watchdog closes it) found them still there: its own shutdown passed by (the backend taken) and it closed the
    source under the running Shutdown(), then the close() closed it again (1 of 1). It now closes under the lock:
    it waits for that close(), and the source is closed once, after the shutdown."""
    from lerobot_dali.batch_source import BatchSource

    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    it = DALILeRobotIterator(root, **kwargs)
    seen = [int(i) for i in next(iter(it))["index"]]
    state = it.state_dict()
    in_shutdown, go, closes = threading.Event(), threading.Event(), []

    class HeldBackend(_CountingBackend):
        def Shutdown(self) -> None:
            in_shutdown.set()
            go.wait(1)  # (until load_state_dict() returned, or at most 1 s where it waits for this close)
            super().Shutdown()
            in_shutdown.clear()

    close_source = BatchSource.close

    def noted_close(source: BatchSource) -> None:
        closes.append(in_shutdown.is_set())
        close_source(source)

    monkeypatch.setattr(BatchSource, "close", noted_close)
    it._pipeline._pipe = backend = HeldBackend(it._pipeline._pipe)
    closer = threading.Thread(target=it.close)
    closer.start()
    assert in_shutdown.wait(30)
    it.load_state_dict(state)
    go.set()
    closer.join(30)
    assert backend.shutdowns == 1 and closes == [False]  # (once, after the shutdown)
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


@pytest.mark.parametrize("fails", [False, True])
def test_an_iterator_used_as_a_context_manager_is_closed_as_the_block_ends(make_ds, fails) -> None:
    """``with DALILeRobotIterator(...) as it:`` raised TypeError (no __enter__): a loop had to close it by hand, or
    through contextlib.closing. The block's end closes it (its workers stopped), an error in the block too, which
    still propagates; iterating again after it carries on at the same sample, as after close()."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=1, drop_last=False)
    reference = [int(i) for b in DALILeRobotIterator(root, **kwargs) for i in b["index"]]
    seen: list[int] = []
    with contextlib.ExitStack() as expect:
        if fails:
            expect.enter_context(pytest.raises(RuntimeError, match="in the block"))
        with DALILeRobotIterator(root, **kwargs) as it:
            seen += [int(i) for i in next(iter(it))["index"]]
            assert it._pipeline is not None and multiprocessing.active_children() != []
            if fails:
                raise RuntimeError("in the block")
    assert it._pipeline is None and multiprocessing.active_children() == []
    seen += [int(i) for b in it for i in b["index"]]
    it.close()
    assert seen == reference


def _epoch_indices(root: Path | Any, kwargs: dict[str, Any], epoch: int = 1) -> list[Any]:
    """The samples of ``epoch``, in order, read by a fresh iterator over ``root`` (``kwargs``): their indices, or for a
    union (``root`` a callable making it) their (dataset, index) pairs."""
    fresh = DALILeRobotIterator(root() if callable(root) else root, **kwargs)
    fresh.set_epoch(epoch)
    indices = [sample for b in fresh for sample in _indices(b)]
    fresh.close()
    return indices


def _indices(batch: dict[str, Any]) -> list[Any]:
    """A batch's sample indices, as (dataset, index) pairs where it carries dataset_index (a union's)."""
    if "dataset_index" in batch:
        return list(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))
    return batch["index"].tolist()


@pytest.mark.parametrize(("source", "num_workers"), [("dataset", 0), ("dataset", 1), ("union", 0), ("union", 1)])
def test_set_epoch_from_another_thread_during_a_read_starts_the_new_epoch(
    make_ds, monkeypatch, source, num_workers
) -> None:
    """set_epoch(1) from another thread while the loop waited in DALI's next() of epoch 0: the pass read on through
    epoch 0, counting 21 of its 23 samples on epoch 1 and then ending epoch 1 (the stream at epoch 2 while the pipeline
    read epoch 1's order next: the next pass's samples were counted as epoch 2's). A set_epoch that moves the stream
    now ends the pass as a load does: the batch read in epoch 0 is dropped, the pass ends with IteratorClosedError
    naming set_epoch, and iterating again reads all of epoch 1. Alike where DALI's workers read the batches (their
    order copies walk on in epoch 0) and for a union of two datasets (one order over both)."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from lerobot_dali.dataset_union import concat_datasets

    root = _dataset(make_ds, "vp9")
    other = make_ds(episodes=3, frames_per_episode=[6, 3, 8], cameras=2, codec="vp9", fps=FPS, gop=4, seed=1)
    dataset = (lambda: concat_datasets([root, other])) if source == "union" else root
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=num_workers, drop_last=False)
    reference = _epoch_indices(dataset, kwargs)
    it = DALILeRobotIterator(dataset() if callable(dataset) else dataset, **kwargs)
    original, calls = DALIGenericIterator.__next__, [0]

    def set_meanwhile(self):
        calls[0] += 1
        if calls[0] == 2:
            setter = threading.Thread(target=it.set_epoch, args=(1,))
            setter.start()
            setter.join(timeout=60)
        return original(self)

    monkeypatch.setattr(DALIGenericIterator, "__next__", set_meanwhile)
    seen = []
    with pytest.raises(IteratorClosedError, match=r"set_epoch\(\) moved the stream to sample 0 of epoch 1"):
        for batch in it:
            seen += _indices(batch)
    assert len(seen) == 2  # (the first batch, of epoch 0)
    assert (it.epoch, it.state_dict()["samples_consumed"]) == (1, 0)
    monkeypatch.setattr(DALIGenericIterator, "__next__", original)
    rest = [sample for b in it for sample in _indices(b)]
    it.close()
    assert rest == reference
    assert sorted(rest) == sorted(set(rest))


def test_set_epoch_of_the_next_epoch_at_the_last_batch_ends_the_pass_there(make_ds) -> None:
    """set_epoch(1) in the loop's body at epoch 0's last batch (a trainer counting its steps): the pass's end then
    started epoch 2, skipping all of epoch 1 (the next pass's samples counted as epoch 2's). Epoch 0 was read whole and
    the stream stands at epoch 1's start: the pass ends quietly there and the next reads epoch 1 whole."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    reference = _epoch_indices(root, kwargs)
    it = DALILeRobotIterator(root, **kwargs)
    batches = len(it)
    for step, _ in enumerate(it, start=1):
        if step == batches:
            it.set_epoch(1)
    assert (it.epoch, it.state_dict()["samples_consumed"]) == (1, 0)
    rest = [int(i) for b in it for i in b["index"]]
    assert (it.epoch, it.state_dict()["samples_consumed"]) == (2, 0)
    it.close()
    assert rest == reference


@pytest.mark.parametrize("move", ["set_epoch", "load_state_dict"])
def test_a_move_in_the_loops_body_ends_the_pass_naming_this_thread(make_ds, move) -> None:
    """set_epoch(1) (or a load_state_dict()) in the loop's body, two batches into epoch 0, ends the pass as a move from
    another thread does, but its error said '(from another thread) while this pass was reading', where the user called
    it from the loop itself (1 of 1 each). It names the pass's own thread now, and says that called between passes
    the move ends none; iterating again reads on from where it moved the stream."""
    root = _dataset(make_ds, "vp9")
    kwargs = dict(batch_size=2, shuffle=True, seed=4, device="cpu", num_workers=0, drop_last=False)
    it = DALILeRobotIterator(root, **kwargs)
    state = it.state_dict()  # (epoch 0's start)
    with pytest.raises(IteratorClosedError) as error:
        for step, _ in enumerate(it, start=1):
            if step == 2:
                it.set_epoch(1) if move == "set_epoch" else it.load_state_dict(state)
    message = str(error.value)
    assert f"{move}() moved the stream to sample 0 of epoch {1 if move == 'set_epoch' else 0}" in message
    assert "another thread" not in message
    assert "on its own thread (in the loop's body, or a signal handler)" in message
    assert f"called between passes, {move}() ends none" in message
    rest = [int(i) for b in it for i in b["index"]]
    it.close()
    expected = _epoch_indices(root, kwargs, 1 if move == "set_epoch" else 0)
    assert rest == expected


def _exits(signum: int, frame: object) -> None:
    """A script's own SIGTERM handler: it exits."""
    raise SystemExit(128 + signum)


@pytest.mark.parametrize(
    ("signum", "handler", "ends"),
    [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt), (signal.SIGTERM, _exits, SystemExit)],
    ids=["ctrl-c", "sigterm-handler-that-exits"],
)
def test_a_signal_while_a_task_is_put_to_a_worker_ends_the_run_without_a_traceback(
    make_ds, monkeypatch, capfd, signum, handler, ends
) -> None:
    """SIGINT while DALI's next() put a task to the worker, in multiprocessing's Condition.notify waiting for the
    worker to wake: the KeyboardInterrupt left the queue's condition a wake over its sleepers, and the pool's close
    (DALI's observer thread notifying the task queue) raised "notify: Bug in sleeping_count", a traceback after
    train.py's one line (2 of 10 Ctrl-C runs of test_train_pipeline's under load); a SIGTERM whose handler raises
    SystemExit there, the same (1 of 1, where only Ctrl-C was held). The handler now runs once the put ends: the pass
    ends with its exception, no thread raises, nothing is printed and the worker ends."""
    import psutil
    from nvidia.dali._multiproc.shared_queue import ShmQueue

    class SignalledInTheWait:
        """The condition's count of woken sleepers, where the notify's wait for the worker gets the signal."""

        def __init__(self, semaphore: Any) -> None:
            self.semaphore = semaphore

        def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
            if block and armed and not fired:
                fired.append(os.getpid())
                os.kill(os.getpid(), signum)
            return self.semaphore.acquire(block, timeout)

        def release(self) -> None:
            self.semaphore.release()

    original_put, fired, armed = ShmQueue.put, [], []

    def put(self, msgs):
        condition = self.cv_not_empty
        condition._woken_count = SignalledInTheWait(woken := condition._woken_count)
        try:
            return original_put(self, msgs)
        finally:
            condition._woken_count = woken

    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    monkeypatch.setattr(ShmQueue, "put", put)
    root = _dataset(make_ds, "vp9")
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=1)
    batches = iter(it)
    next(batches)
    workers = [psutil.Process(pid) for pid in it._pipeline._py_pool.pids()]
    armed.append(True)  # (from the second batch on: the first ones' puts are in the pipeline's build)
    previous = signal.signal(signum, handler)
    try:
        with pytest.raises(ends):
            for _ in batches:
                pass
    finally:
        signal.signal(signum, previous)
    it.close()
    psutil.wait_procs(workers, timeout=30)
    assert fired and raised == []
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert "Traceback" not in capfd.readouterr().err
