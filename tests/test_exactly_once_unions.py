"""Exactly-once for unions and mixtures: the whole-job fuzzer of :mod:`tests.test_exactly_once_fuzz` over their
ordering layers (no DALI), on tabular datasets generated once per session.

* A union (:func:`~lerobot_dali.dataset_union.concat_datasets`: one to four datasets, some opened with ``episodes=``,
  one a union itself) is sampled as one dataset: its episodes run through the same jobs (ranks, workers, batch sizes,
  ``drop_last``, balances, resumes on other world sizes), and every sample is read back as the union's row. Each
  epoch, every eligible frame of every dataset (by its own ``episode_index`` and ``frame_index``, from its own episode
  table) comes once, under its own ``dataset_index``, but those the fuzzer's checks let a plan leave unread; a state
  over the datasets listed in another order is refused.
* A mixture (:class:`~lerobot_dali.mixture.DALILeRobotMixture`, its datasets' iterators stood in for by passes over
  their sample streams, as :mod:`tests.test_exactly_once_fuzz` reads them) holds its shares in every batch; each
  dataset reads its own epochs in turn across the mixture's epochs (the anchor's epoch is the mixture's), each epoch's
  frames once across ranks and resumes (a ``drop_last`` tail short of its share left out); a job resumed on the same
  ranks (each its own state, or rank 0's) reads what one uninterrupted run reads, batch for batch; one resumed on other
  ranks stays exactly-once per dataset epoch.

``LEROBOT_DALI_EXACTLY_ONCE=N`` draws N union jobs and N / 4 mixture jobs (default 40: 10; a few seconds).
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from lerobot_dali import mixture as mixture_module
from lerobot_dali.dataset_reader import LeRobotDatasetReader, open_dataset
from lerobot_dali.dataset_union import (
    DATASET_INDEX,
    DatasetUnion,
    concat_datasets,
    dataset_contents,
    datasets_within,
    refuse_another_order,
)
from lerobot_dali.episode_pieces import EpisodePieces
from lerobot_dali.errors import ResumeStateError, ShardingError
from lerobot_dali.mixture import DALILeRobotMixture
from lerobot_dali.sample_order import OrderOptions, RankBalance
from lerobot_dali.stream_state import SampleStream
from tests.test_exactly_once_fuzz import FIRST, JOBS, _check_epochs, _Job, _Rank, _run_job

#: Per dataset: episode lengths (1-3 frame episodes among them), the generator's seed.
SPECS = (([5, 7, 4], 0), ([20, 9], 1), ([1, 3, 12, 2], 2), ([6], 3), ([2, 17, 8, 1, 5], 4), ([5, 7, 4], 5))


@pytest.fixture(scope="module")
def tabular(make_ds) -> list[Path]:
    """The datasets of :data:`SPECS`, without cameras (the order reads none)."""
    return [
        make_ds(episodes=len(lengths), frames_per_episode=lengths, cameras=0, seed=seed, num_tasks=1 + seed % 3)
        for lengths, seed in SPECS
    ]


def _eligible(reader: LeRobotDatasetReader, options: OrderOptions) -> set[tuple[int, int]]:
    """``(episode_index, frame_index)`` of every frame of ``reader`` an epoch samples."""
    units = EpisodePieces.cut(
        reader.episodes.length, None, drop_first=options.drop_n_first_frames, drop_last=options.drop_n_last_frames
    )
    indices = reader.episodes.episode_index
    return {
        (int(indices[e]), int(o) + f)
        for e, o, n in zip(units.episode, units.offset, units.length, strict=True)
        for f in range(n)
    }


def _union(seed: int, paths: list[Path]) -> DatasetUnion:
    """One to four of ``paths``, in a drawn order, some opened with ``episodes=``, the first two a union of theirs."""
    rng = np.random.default_rng([seed, 2])
    chosen = rng.choice(len(paths), size=int(rng.integers(1, 5)), replace=False).tolist()
    members: list[Any] = []
    for i in chosen:
        count = len(SPECS[i][0])
        if count > 1 and rng.random() < 0.3:
            kept = rng.choice(count, size=int(rng.integers(1, count)), replace=False)
            members.append(open_dataset(paths[i], episodes=sorted(kept.tolist())))
        else:
            members.append(paths[i])
    if len(members) >= 3 and rng.random() < 0.4:
        members = [concat_datasets(members[:2]), *members[2:]]
    return concat_datasets(members)


def _leaf(union: DatasetUnion, pos: int) -> tuple[int, int]:
    """``(its dataset in ``union``, its dataset among :func:`datasets_within` it)`` of the union's episode ``pos``."""
    d, own = union.member(pos)
    before = sum(len(datasets_within(m)) for m in union.members[:d])
    member = union.members[d]
    return d, before + (_leaf(member, own)[1] if isinstance(member, DatasetUnion) else 0)


@pytest.mark.parametrize("seed", range(FIRST, FIRST + JOBS))
def test_a_union_job_reads_every_frame_of_every_dataset_once(seed: int, tabular: list[Path]) -> None:
    union = _union(seed, tabular)
    job = _run_job(seed, union.episodes.length)
    rows = {}  # (each episode's rows, read back by the union, as (its dataset among the leaves, episode, frame))
    for pos in range(union.num_episodes):
        read = union.read_episode(pos, ["episode_index", "frame_index"])
        d, leaf = _leaf(union, pos)
        assert (read[DATASET_INDEX] == d).all()
        rows[pos] = [(leaf, int(e), int(f)) for e, f in zip(read["episode_index"], read["frame_index"], strict=True)]
    leaves = enumerate(datasets_within(union))
    expected = {(leaf, *frame) for leaf, dataset in leaves for frame in _eligible(dataset, job.options)}
    for epoch, (own, missed) in _check_epochs(job).items():
        got = Counter(rows[pos][frame] for pos, frame in own)
        assert max(got.values(), default=1) == 1, f"epoch {epoch}: a dataset's frame came twice"
        assert set(got) <= expected and len(expected - set(got)) == missed, f"epoch {epoch}"
    contents = dataset_contents(union.members)
    if len(set(contents)) > 1:  # (a state names its datasets' contents: listed in another order, it is refused)
        with pytest.raises(ResumeStateError, match="another order"):
            refuse_another_order({"dataset_contents": contents}, union.members[::-1], "the union")


#: The mixture jobs drawn (each reads up to ~100 batches on up to 3 ranks, with resumes).
MIXTURE_JOBS = max(1, JOBS // 4)
#: A mixture's datasets read their own epochs on and on: a job of theirs has no last epoch.
_ENDLESS = 10**9


class _Part:
    """A mixture dataset's iterator over its sample stream alone, as :class:`~lerobot_dali.iterator.DALILeRobotIterator`
    serves a mixture: a pass reads on from where the stream stands (each batch drawn by a worker's copy of the order),
    ends at the epoch's last full batch, and leaves the stream at the next epoch (an epoch read to its end: an empty
    pass); a load moves it. What it reads is its dataset's job's (:class:`_Rank`), keyed by the dataset."""

    jobs: ClassVar[dict[str, _Job]] = {}
    #: Each dataset's share of a batch.
    shares: ClassVar[dict[str, int]] = {}

    def __init__(
        self,
        reader: LeRobotDatasetReader,
        *,
        batch_size: int,
        seed: int,
        num_workers: int,
        drop_last: bool,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        episode_pool_size: int = 64,
        rank_balance: RankBalance | str = RankBalance.PAD,
        drop_n_first_frames: int = 0,
        drop_n_last_frames: int = 0,
        **unused: Any,
    ) -> None:
        self.reader, self.rank, self.world_size, self.batch_size = reader, rank, world_size, batch_size
        options = OrderOptions(
            seed=seed, shuffle=shuffle, episode_pool_size=episode_pool_size, rank_balance=RankBalance(rank_balance),
            drop_n_first_frames=drop_n_first_frames, drop_n_last_frames=drop_n_last_frames,
        )  # fmt: skip
        lengths = reader.episodes.length
        job = self.jobs.setdefault(
            reader.location.description, _Job(lengths, options, np.random.default_rng(0), last_epoch=_ENDLESS)
        )
        assert job.options == options
        self.shares[reader.location.description] = batch_size
        self._stream = SampleStream(lengths, rank=rank, world_size=world_size, batch_size=batch_size, options=options)
        self._num_workers, self._shows_progress, self._says_build = num_workers, False, True
        self._reading = _Rank(job, self._stream, batch_size, num_workers, drop_last)

    def __len__(self) -> int:
        start = self._reading.pass_start
        return (self._stream.num_samples() - (self._stream.samples_consumed if start is None else start)) // (
            self.batch_size
        )

    @property
    def epoch(self) -> int:
        return self._stream.epoch

    def set_epoch(self, epoch: int) -> None:
        self._stream.set_epoch(epoch)

    def epoch_samples(self, epoch: int) -> int:
        return self._stream.order.num_samples(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)
        self._reading.copies = self._reading.pass_start = None  # (the pipeline: built again at the new position)

    def _load(self, state: dict[str, Any], moved_by: str) -> None:  # (the mixture's loads of its datasets)
        self.load_state_dict(state)

    def _builds_pipeline(self) -> bool:
        return False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._reading.pass_start = None
        return self._batches()

    def _batches(self) -> Iterator[dict[str, Any]]:
        while (batch := self._reading.step(loop_ends=True)) is not None:
            episodes, frames = batch
            yield {
                "index": torch.from_numpy(frames),
                "episode_index": torch.from_numpy(self.reader.episodes.episode_index[episodes]),
                "frame_index": torch.from_numpy(frames),
            }

    def close(self) -> None:
        pass

    def _close_by(self, deadline: float) -> None:  # (the mixture's close(): one wait in all)
        pass


_Part.__init__.__signature__ = inspect.signature(mixture_module.DALILeRobotIterator.__init__)  # type: ignore[attr-defined]


def _mixture_case(seed: int, paths: list[Path]) -> tuple[list[Path], dict[str, Any], np.random.Generator]:
    """Two or three datasets and the mixture's arguments (but ranks and workers), with the job's generator."""
    rng = np.random.default_rng([seed, 3])
    chosen = rng.choice(len(paths), size=int(rng.integers(2, 4)), replace=False).tolist()
    weights = rng.integers(1, 6, len(chosen)).tolist() if rng.random() < 0.5 else None
    arguments = dict(
        weights=weights,
        batch_size=int(rng.integers(len(chosen), len(chosen) + 7)),
        seed=int(rng.integers(1000)),
        shuffle=bool(rng.random() < 0.7),
        episode_pool_size=int(rng.integers(1, 4)),
        rank_balance=["pad", "drop"][int(rng.integers(2))],
        drop_n_last_frames=int(rng.integers(0, 3)) if rng.random() < 0.3 else 0,
        device="cpu",
    )
    return [paths[i] for i in chosen], arguments, rng


def _read_mixture(
    paths: list[Path], arguments: dict[str, Any], phases: Sequence[tuple[int, int]], rng: np.random.Generator
) -> list[list[list[tuple[int, int, int]]]] | None:
    """``phases`` of ``(world size, batches)``, each resumed from the states the one before saved (each rank's own on
    the same ranks, or rank 0's), its last reading into a third mixture epoch: per rank of the last world size, per
    batch, its ``(dataset, episode_index, frame_index)``. None where a dataset cannot fill its share on those ranks."""
    states: list[dict[str, Any]] | None = None
    read: list[list[list[tuple[int, int, int]]]] = []
    for phase, (world_size, batches) in enumerate(phases):
        try:
            mixtures = [
                DALILeRobotMixture(paths, rank=r, world_size=world_size, num_workers=int(rng.integers(4)), **arguments)
                for r in range(world_size)
            ]
        except ShardingError:  # (as refused for a part whose share no rank's epoch fills)
            return None
        if states is not None:
            own = len(states) == world_size and rng.random() < 0.5
            for r, mix in enumerate(mixtures):
                mix.load_state_dict(json.loads(json.dumps(states[r if own else 0])))
        if len(read) != world_size:
            read = [[] for _ in range(world_size)]
        shares = torch.repeat_interleave(torch.arange(len(paths)), torch.tensor(mixtures[0].batch_shares))
        passes = [iter(mix) for mix in mixtures]
        last = phase == len(phases) - 1
        while batches > 0 or (last and mixtures[0].epoch < 3):
            batches -= 1
            for r, mix in enumerate(mixtures):
                batch = next(passes[r], None)
                if batch is None:  # (the mixture's epoch is over: the next pass starts the next)
                    passes[r] = iter(mix)
                    batch = next(passes[r], None)
                if batch is None:
                    continue
                assert torch.equal(batch[DATASET_INDEX], shares), "a batch out of its shares"
                read[r].append(list(zip(*(batch[k].tolist() for k in (DATASET_INDEX, "episode_index", "frame_index")),
                                        strict=True)))  # fmt: skip
            assert len({len(each) for each in read}) == 1, "ranks read unequal batch counts"
        states = [mix.state_dict() for mix in mixtures]
        for mix in mixtures:
            mix.close()
    return read


@pytest.mark.parametrize("seed", range(FIRST, FIRST + MIXTURE_JOBS))
def test_a_mixture_job_reads_each_dataset_epoch_once_and_resumes_its_draws(
    seed: int, tabular: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mixture_module, "DALILeRobotIterator", _Part)
    paths, arguments, rng = _mixture_case(seed, tabular)
    units = min(len(SPECS[[str(p) for p in tabular].index(str(p))][0]) for p in paths)
    ranks = min(3, units)
    phases = [(int(rng.integers(1, ranks + 1)), int(rng.integers(0, 30))) for _ in range(int(rng.integers(2, 5)))]
    same = bool(rng.random() < 0.5)
    if same:
        phases = [(phases[0][0], batches) for _, batches in phases]
    monkeypatch.setattr(_Part, "jobs", {})
    monkeypatch.setattr(_Part, "shares", {})
    read = _read_mixture(paths, arguments, phases, rng)
    if read is None:
        pytest.skip("a dataset gives a rank fewer samples than its share (refused at construction)")
    for name, job in _Part.jobs.items():
        epochs = sorted(e for e, plans in job.epoch_plans.items() if plans)
        _check_epochs(job, epochs)
        for epoch in epochs[:-1]:  # each of its epochs read to its last full batch before the next began
            plan = job.epoch_plans[epoch][-1]
            for r in range(plan[2]):
                left = job.reference(plan, r).num_samples(epoch) - len(job.plans[plan].positions.get(r, []))
                assert left < _Part.shares[name], f"{name}: epoch {epoch} left {left} samples of rank {r} unread"
    if same:  # resumed on the same ranks, each rank reads what an uninterrupted run reads, batch for batch
        monkeypatch.setattr(_Part, "jobs", {})
        whole = _read_mixture(paths, arguments, [(phases[0][0], len(read[0]))], rng)
        assert whole is not None and [w[: len(r)] for w, r in zip(whole, read, strict=True)] == read
