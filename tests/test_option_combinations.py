"""Random combinations of datasets and options, each checked against values computed from the generator.

The other tests pick their combinations by hand; these draw them (codec, fps, episode lengths, files per
episode, v2.1/v3.0, image cameras, windows, batch size, shuffle, pool size, workers, ranks, balance (none too,
for evaluation), resize, uint8, drop_last, episode subsets, episodes dealt in pieces, first and last frames never
sampled, the CPU decoder's options, DALI's threads, timestamps or frame indices (a union's: per dataset); every
third case over HTTP, its prefetch cache off, tiny or roomy), over one dataset, a mixture or a union
(``concat_datasets``) of 2-3, from a seeded generator, so a case that fails is reproduced by its seed. Every
sample is checked: ``index``, ``timestamp``, tasks, tabular windows and masks against the generator's formulas,
each camera frame against its marker; each epoch's coverage across ranks; and a resume in the middle of an epoch
(under other worker counts) against the uninterrupted run.

``LEROBOT_DALI_COMBINATIONS=N`` draws N single-dataset cases and N/3 of each other kind (default: a few, for CI)
from seed ``LEROBOT_DALI_COMBINATIONS_FROM=K`` on (default 0; a higher K draws cases earlier sweeps did not); a drawn
case the loader refuses with a clear error (more ranks than episodes, a dataset smaller than its share of a batch)
is skipped.
The first run of this module found a mixture of a video and an image dataset failing on one-step windows.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture, concat_datasets
from lerobot_dali.cpu_decode import ColorConversion, CpuDecodeOptions
from lerobot_dali.errors import ShardingError
from lerobot_dali.frame_lookup import TimestampSource
from lerobot_dali.frame_marker import read_full_marker
from lerobot_dali.generate import camera_key, expected_action, expected_state, expected_task_index, task_name
from tests.http_server import FolderServer

CASES = int(os.environ.get("LEROBOT_DALI_COMBINATIONS", "6"))
FIRST = int(os.environ.get("LEROBOT_DALI_COMBINATIONS_FROM", "0"))
SIZE = (64, 64)  # the smallest a marker survives encoding at


@dataclass(frozen=True)
class Data:
    """A generated dataset's arguments: what its values follow."""

    codec: str
    fps: int
    lengths: tuple[int, ...]
    cameras: int
    gop: int
    episodes_per_file: int
    version: str
    seed: int
    image_cameras: bool

    def make(self, make_ds: Callable[..., Path]) -> Path:
        return make_ds(
            episodes=len(self.lengths), frames_per_episode=list(self.lengths), cameras=self.cameras, size=SIZE,
            fps=self.fps, codec=self.codec, gop=self.gop, episodes_per_file=self.episodes_per_file,
            version=self.version, seed=self.seed, image_cameras=self.image_cameras,
        )  # fmt: skip


@dataclass
class Case:
    data: list[Data]
    options: dict[str, Any]
    world_size: int
    remote: bool
    #: Several datasets read as one (``concat_datasets``), not a mixture.
    union: bool = False
    #: A union's datasets' own ways to find their frames (None: the iterator's; generated rows agree with both).
    timestamp_sources: list[str | None] | None = None
    cameras: int = field(init=False)

    def __post_init__(self) -> None:
        self.cameras = min(d.cameras for d in self.data)  # a mixture reads the cameras every dataset has


def _draw_data(rng: random.Random, fps: int) -> Data:
    return Data(
        codec=rng.choice(["vp9", "vp9", "h264", "av1"]),  # VP9 through DALI's CPU decoder, the others by workers
        fps=fps,
        lengths=tuple(rng.randint(1, 25) for _ in range(rng.randint(1, 7))),
        cameras=rng.choice([1, 2]),
        gop=rng.choice([1, 2, 5, 12]),
        episodes_per_file=rng.choice([1, 2, 3, 100]),
        version=rng.choice(["v3.0", "v3.0", "v2.1"]),
        seed=rng.randint(0, 5),
        image_cameras=rng.random() < 0.15,
    )


def _draw_case(seed: int, datasets: int, *, union: bool = False) -> Case:
    rng = random.Random(seed)
    fps = rng.choice([10, 15, 30])
    data = [_draw_data(rng, fps) for _ in range(datasets)]
    if union:  # one layout: codec, cameras and their storage shared; lengths, files, versions and tasks not
        data = [replace(d, codec=data[0].codec, cameras=data[0].cameras, image_cameras=data[0].image_cameras)
                for d in data]  # fmt: skip
    keys = ["action", "observation.state", *(camera_key(i) for i in range(min(d.cameras for d in data)))]
    windows = {
        key: sorted({rng.randint(-6, 6) / fps for _ in range(rng.randint(1, 5))}) for key in keys if rng.random() < 0.5
    }
    options: dict[str, Any] = {
        "batch_size": rng.choice([1, 2, 3, 5, 8, 16]),
        "delta_timestamps": windows or None,
        "shuffle": rng.random() < 0.7,
        "seed": rng.randint(0, 100),
        "episode_pool_size": rng.choice([1, 2, 3, 64]),
        "num_workers": rng.choice([0, 1, 2]),
        "image_size": rng.choice([None, None, (64, 80)]),
        "return_uint8": rng.random() < 0.5,
        "prefetch": rng.choice([1, 2]),
        "rank_balance": rng.choice(["pad", "drop"]),
    }
    if datasets == 1 or union:
        options["drop_last"] = rng.random() < 0.5
        lengths = data[0].lengths
        if datasets == 1 and len(lengths) > 1 and rng.random() < 0.25:
            options["episodes"] = sorted(rng.sample(range(len(lengths)), rng.randint(1, len(lengths))))
    else:
        options["batch_size"] = max(options["batch_size"], datasets)
        options["weights"] = rng.choice([None, [rng.randint(1, 4) for _ in range(datasets)]])
    # Each rank reads whole episodes: of each dataset in a mixture, of all of them in a union.
    if union:
        episodes = sum(len(d.lengths) for d in data)
    else:
        episodes = min(len(options.get("episodes") or d.lengths) for d in data)
    world_size = min(rng.choice([1, 1, 2, 3]), episodes)
    remote = (datasets == 1 or union) and seed % 3 == 2
    # How the workers decode (a single open decoder evicts at every file change) and how DALI runs.
    options["cpu_decode"] = CpuDecodeOptions(
        threads_per_decoder=rng.choice([1, 2]),
        max_open_decoders=rng.choice([1, 2, 64]),
        color_conversion=rng.choice(list(ColorConversion)),
    )
    options["dali_threads"] = rng.choice([1, 2, 3])
    if datasets == 1 or union:
        options["timestamp_source"] = rng.choice(list(TimestampSource))  # (generated rows agree)
    if remote:  # the prefetch cache off, a few kilobytes (ranges evicted as episodes leave the pool), or roomy
        options["cache_gb"] = rng.choice([0.0, 2e-5, 8.0])
    if rng.random() < 0.3:  # episodes dealt to ranks in pieces: then more ranks than episodes too
        options["episode_piece_frames"] = piece = rng.randint(1, 10)
        chosen = options.get("episodes")
        each = [sum(-(-n // piece) for i, n in enumerate(d.lengths) if chosen is None or i in chosen) for d in data]
        world_size = min(rng.choice([2, 3, 4]), sum(each) if union else min(each))
    case = Case(data, options, world_size=world_size, remote=remote, union=union)
    # (drawn last: the other draws stay those of the seeds swept before these existed)
    if union:
        case.timestamp_sources = [rng.choice([None, *(s.value for s in TimestampSource)]) for _ in data]
    if rng.random() < 0.3:  # an episode's first and last frames never sampled (LeRobot's EpisodeAwareSampler)
        options["drop_n_first_frames"], options["drop_n_last_frames"] = rng.randint(0, 1), rng.randint(0, 3)
    if (datasets == 1 or union) and rng.random() < 0.2:  # evaluation: each rank its own frames, unequal counts
        options["rank_balance"] = "none"
    return case


# -- the checks ------------------------------------------------------------------------------------------------
def _window(fps: int, deltas: list[float], frames: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's window rows, clamped to its episode, and which of them are padding."""
    rows = frames[:, None] + np.round(np.asarray(deltas) * fps).astype(int)[None, :]
    return np.clip(rows, 0, lengths[:, None] - 1), (rows < 0) | (rows >= lengths[:, None])


def _check_batch(batch: dict[str, Any], data: Data, case: Case, task_offset: int = 0) -> None:
    """Every value of a batch of ``data``'s samples against the generator's formulas and the frames' markers
    (``task_offset``: a union's, added to the dataset's own task indices)."""
    windows = case.options["delta_timestamps"] or {}
    episodes, frames = batch["episode_index"].numpy(), batch["frame_index"].numpy()
    lengths = np.asarray(data.lengths)[episodes]
    np.testing.assert_array_equal(batch["index"].numpy(), np.cumsum([0, *data.lengths])[episodes] + frames)
    np.testing.assert_allclose(batch["timestamp"].numpy(), frames / data.fps, atol=1e-6)
    tasks = [expected_task_index(e, num_tasks=2, seed=data.seed) for e in episodes]
    assert batch["task_index"].tolist() == [task_offset + t for t in tasks]
    assert batch["task"] == [task_name(t) for t in tasks]
    for key, values in (("action", expected_action), ("observation.state", expected_state)):
        if key in windows:
            rows, pad = _window(data.fps, windows[key], frames, lengths)
            np.testing.assert_array_equal(batch[key].numpy(), values(episodes[:, None], rows), err_msg=key)
            np.testing.assert_array_equal(batch[f"{key}_is_pad"].numpy(), pad, err_msg=key)
        else:
            np.testing.assert_array_equal(batch[key].numpy(), values(episodes, frames), err_msg=key)
    height, width = case.options["image_size"] or SIZE
    for camera in range(case.cameras):
        key = camera_key(camera)
        images = batch[key]
        assert images.dtype == (torch.uint8 if case.options["return_uint8"] else torch.float32), key
        if key in windows:
            rows, pad = _window(data.fps, windows[key], frames, lengths)
            np.testing.assert_array_equal(batch[f"{key}_is_pad"].numpy(), pad, err_msg=key)
            if len(windows[key]) == 1:  # as LeRobot squeezes a one-frame video window (and a mixture follows it)
                assert images.ndim == 4 or data.image_cameras, key
                images = images if images.ndim == 5 else images[:, None]
        else:
            rows = frames[:, None]
            assert images.ndim == 4, key
            images = images[:, None]
        assert images.shape[1:] == (rows.shape[1], 3, height, width), key
        for i, episode in enumerate(episodes.tolist()):
            for step, row in enumerate(rows[i].tolist()):
                marker = read_full_marker(images[i, step].numpy())
                assert tuple(marker) == (episode, row, camera), (key, i, step)


def _split(batch: dict[str, Any], dataset: int) -> dict[str, Any]:
    """A mixture batch's samples of one dataset."""
    mine = batch["dataset_index"] == dataset
    return {k: v[mine] if torch.is_tensor(v) else [x for x, m in zip(v, mine.tolist(), strict=True) if m]
            for k, v in batch.items()}  # fmt: skip


def _epoch(loader: Any, case: Case, limit: int | None = None) -> list[list[tuple[int, int]]]:
    """Each batch's (dataset, index) pairs, every batch checked, up to ``limit`` batches."""
    batches = []
    for batch in loader:
        datasets = batch["dataset_index"] if "dataset_index" in batch else torch.zeros_like(batch["index"])
        if case.union:
            for i, data in enumerate(case.data):
                _check_batch(_split(batch, i), data, case, task_offset=loader.reader.task_offsets[i])
        elif "dataset_index" in batch:
            counts = [int((datasets == i).sum()) for i in range(len(case.data))]
            assert counts == list(loader.batch_shares)
            for i, data in enumerate(case.data):
                _check_batch(_split(batch, i), data, case)
        else:
            _check_batch(batch, case.data[0], case)
        batches.append(list(zip(datasets.tolist(), batch["index"].tolist(), strict=True)))
        if limit is not None and len(batches) == limit:
            break
    return batches


def _loader(sources: list[Any], case: Case, rank: int, **changes: Any) -> Any:
    options = {**case.options, **changes}
    if case.union:
        union = concat_datasets(sources, timestamp_sources=case.timestamp_sources)
        return DALILeRobotIterator(union, device="cpu", rank=rank, world_size=case.world_size, **options)
    if len(sources) == 1:
        return DALILeRobotIterator(sources[0], device="cpu", rank=rank, world_size=case.world_size, **options)
    return DALILeRobotMixture(sources, device="cpu", rank=rank, world_size=case.world_size, **options)


def _run_case(case: Case, make_ds: Callable[..., Path], server: FolderServer, seed: int) -> None:
    paths = [d.make(make_ds) for d in case.data]
    sources: list[Any] = paths
    if case.remote:
        sources = [f"{server.url}/{p.parent.name}/{p.name}" for p in paths]
    rng = random.Random(seed)
    epochs: list[list[list[list[tuple[int, int]]]]] = []  # rank -> epoch -> batches
    anchor = 0
    try:
        for rank in range(case.world_size):
            loader = _loader(sources, case, rank)
            anchor = getattr(loader, "anchor", 0)
            try:
                # len() is the coming pass's: taken after a pass it is the next epoch's, whose sample count may
                # differ (ranks balanced by dropping or padding to another rank's count of that epoch).
                runs = []
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    length = len(loader)
                    runs.append(_epoch(loader, case))
                    assert len(runs[epoch]) == length, f"epoch {epoch}"
                if len(runs[1]) > 1:  # stop in epoch 1, resume under other workers: the same batches
                    stop = rng.randint(1, len(runs[1]) - 1)
                    loader.set_epoch(1)
                    head = _epoch(loader, case, limit=stop)
                    state = loader.state_dict()
                    loader.close()
                    loader = _loader(sources, case, rank, num_workers=rng.choice([0, 1, 2]))
                    loader.load_state_dict(state)
                    assert head + _epoch(loader, case) == runs[1], f"resume after {stop} batches"
            finally:
                loader.close()
            epochs.append(runs)
    except ShardingError as e:  # more ranks than episodes, a dataset smaller than its share of a batch
        pytest.skip(f"refused, as it should be: {e}")
    _check_coverage(case, epochs, anchor)


def _check_coverage(case: Case, epochs: list[list[list[list[tuple[int, int]]]]], anchor: int) -> None:
    """Each epoch over all ranks: equal counts per rank, and every sample once where nothing pads or drops."""
    balance, world = case.options["rank_balance"], case.world_size
    for epoch in range(2):
        taken = [[pair for batch in rank[epoch] for pair in batch] for rank in epochs]
        pairs = [pair for t in taken for pair in t]
        if balance == "none":  # each rank exactly its own frames (less a short last batch with drop_last)
            every = _every_sample(case)
            assert len(set(pairs)) == len(pairs) and set(pairs) <= set(every)
            assert case.options["drop_last"] or set(pairs) == set(every)
            continue
        assert len({len(t) for t in taken}) == 1, "ranks took different numbers of samples"
        if len(case.data) > 1 and not case.union:  # a mixture's epoch is its anchor's: no anchor sample twice
            read = [p for p in pairs if p[0] == anchor]  # (unless ranks pad)
            assert (world > 1 and balance == "pad") or len(set(read)) == len(read)
            continue
        every = _every_sample(case)
        assert set(pairs) <= set(every)
        batch_size = case.options["batch_size"]
        if world == 1:
            whole = len(every) if not case.options["drop_last"] else len(every) // batch_size * batch_size
            assert len(set(pairs)) == len(pairs) == whole
        elif balance == "drop":
            assert len(set(pairs)) == len(pairs)
        elif not case.options["drop_last"]:
            assert set(pairs) == set(every)


def _every_sample(case: Case) -> list[tuple[int, int]]:
    """(dataset, index) of every sample an epoch holds: of one dataset (its chosen episodes), or a union's."""
    every = []
    first, last = case.options.get("drop_n_first_frames", 0), case.options.get("drop_n_last_frames", 0)
    for d, data in enumerate(case.data):
        chosen = case.options.get("episodes") or range(len(data.lengths))
        starts = np.cumsum([0, *data.lengths])
        every += [(d, i) for e in chosen for i in range(starts[e] + first, starts[e + 1] - last)]
    return every


def _case_id(seed: int, datasets: int, union: bool = False) -> str:
    case = _draw_case(seed, datasets, union=union)
    where = "http" if case.remote else "union" if union else "local"
    return f"{seed}-{'+'.join(d.codec for d in case.data)}-{case.world_size}ranks-{where}"


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES), ids=lambda seed: _case_id(seed, 1))
def test_random_options_over_one_dataset(seed: int, make_ds, basetemp_server: FolderServer) -> None:
    _run_case(_draw_case(seed, datasets=1), make_ds, basetemp_server, seed)


@pytest.mark.parametrize(
    "seed", range(FIRST, FIRST + max(1, CASES // 3)), ids=lambda seed: _case_id(1000 + seed, 2 + seed % 2)
)
def test_random_options_over_a_mixture(seed: int, make_ds, basetemp_server: FolderServer) -> None:
    _run_case(_draw_case(1000 + seed, datasets=2 + seed % 2), make_ds, basetemp_server, seed)


@pytest.mark.parametrize(
    "seed", range(FIRST, FIRST + max(1, CASES // 3)), ids=lambda seed: _case_id(2000 + seed, 2 + seed % 2, True)
)
def test_random_options_over_a_union(seed: int, make_ds, basetemp_server: FolderServer) -> None:
    _run_case(_draw_case(2000 + seed, datasets=2 + seed % 2, union=True), make_ds, basetemp_server, seed)
