"""Exactly-once across ranks, workers and resumes: a fuzzer of whole jobs over the sample-order layer (no DALI).

A job is a run of phases. Each phase starts ``world_size`` ranks that load the state the phase before saved (rank 0's,
every rank's own, or all of them gathered by :func:`merge_rank_states`), with its own batch size, ``drop_last``, worker
count and options that must not matter (seed, checkpoint interval, an unshuffled pool's size), and reads a random number
of batches as :class:`~lerobot_dali.iterator.DALILeRobotIterator` does: the pool walked to the pass's start
(``prepare``), then each batch drawn by one of the workers' pickled copies of the order (batch ``i`` by worker ``i %
W``; none: by the order itself), the main order following them, a pass ending (``drop_last``: at its last full batch) by
moving to the next epoch, where the trainer's loop may end (and save). Phases change the world size, worker count and
batch size inside an epoch, more than once, and across epoch boundaries; the last one reads past the end of the job's
last epoch.

Checked, per epoch, across every phase and rank:

* every position of a rank's plan (its epoch, or the rest of one re-sharded after a world-size change) is read once,
  from 0 on in order, whatever the resumes; each sample is the one a fresh order of that plan (no state, no walk, no
  worker copy) gives there, so a resume on the same world size continues the uninterrupted stream, and every epoch
  after a resumed one is a fresh run's;
* a rank's own frames (positions below its count) come once across the epoch: nothing read before a checkpoint comes
  again after it; positions past them (``pad``) repeat that rank's own samples of the plan, as many as the balance
  states (its target less its frames), and ``drop``/``none`` pad nothing;
* every eligible frame is read, but for those of the epoch's last plan its ranks left unread (``drop`` balance, a
  ``drop_last`` tail), or where that plan got fewer part-read units than ranks (then empty, as logged);
* ranks balanced (``pad``/``drop``) stand at the same position after every batch: equal batch counts;
* a resume under other order options (shuffle, a shuffled pool's size, the balance on several ranks, the piece size,
  frames dropped at episode ends) is refused naming the option, leaving the stream as it was; ``none`` refuses a
  world-size change inside an epoch, and at an epoch's start but from every old rank's state gathered
  (:func:`merge_rank_states`, which refuses states that stand apart: a trainer's loop may end a pass, and save, on
  one rank while another, of more frames, still reads the epoch).

``LEROBOT_DALI_EXACTLY_ONCE=N`` draws N jobs (default 40, a few seconds) from seed ``LEROBOT_DALI_EXACTLY_ONCE_FROM``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lerobot_dali.episode_pieces import EpisodePieces
from lerobot_dali.errors import ResumeStateError
from lerobot_dali.sample_order import ConsumedSegment, OrderOptions, RankBalance, ResumedEpoch, SampleOrder
from lerobot_dali.stream_state import SampleStream, merge_rank_states

JOBS = int(os.environ.get("LEROBOT_DALI_EXACTLY_ONCE", "40"))
FIRST = int(os.environ.get("LEROBOT_DALI_EXACTLY_ONCE_FROM", "0"))
#: Epochs a job reads (0, 1, 2): the last phase reads to the end of the last.
LAST_EPOCH = 2

Plan = tuple[int, tuple[tuple[int, int], ...], int]
"""An epoch's plan: ``(epoch, prior segments as (world_size, samples), world_size)``."""


@dataclass
class _Plan:
    """What a plan's ranks read: each rank's positions in order, and their samples."""

    order_of: dict[int, SampleOrder] = field(default_factory=dict)
    positions: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    samples: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))


@dataclass
class _Job:
    lengths: np.ndarray
    options: OrderOptions
    rng: np.random.Generator
    plans: dict[Plan, _Plan] = field(default_factory=dict)
    #: Per epoch, its plans in the order they were read.
    epoch_plans: dict[int, list[Plan]] = field(default_factory=lambda: defaultdict(list))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: The job's last epoch: its last phase reads to its end.
    last_epoch: int = LAST_EPOCH

    def reference(self, plan: Plan, rank: int) -> SampleOrder:
        """A fresh order of ``plan`` for ``rank``: built from nothing but the lengths, options and segments."""
        record = self.plans[plan]
        if rank not in record.order_of:
            epoch, segments, world_size = plan
            resumed = ResumedEpoch(epoch, tuple(ConsumedSegment(*s) for s in segments)) if segments else None
            record.order_of[rank] = SampleOrder(
                self.lengths, rank=rank, world_size=world_size, options=self.options, resumed_epoch=resumed
            )
        return record.order_of[rank]


def _units(lengths: np.ndarray, options: OrderOptions) -> EpisodePieces:
    return EpisodePieces.cut(
        lengths, options.piece_frames, drop_first=options.drop_n_first_frames, drop_last=options.drop_n_last_frames
    )


def _case(seed: int) -> tuple[np.ndarray, OrderOptions]:
    rng = np.random.default_rng([seed, 0])
    n = int(rng.integers(1, 16))
    lengths = np.where(rng.random(n) < 0.25, rng.integers(1, 4, n), rng.integers(1, 30, n))  # (1-3 frame episodes)
    first, last = (int(rng.integers(0, 4)), int(rng.integers(0, 4))) if rng.random() < 0.4 else (0, 0)
    options = OrderOptions(
        seed=int(rng.integers(1000)),
        shuffle=bool(rng.random() < 0.7),
        episode_pool_size=int(rng.integers(1, 6)),
        rank_balance=[RankBalance.PAD, RankBalance.DROP, RankBalance.NONE][int(rng.choice(3, p=[0.45, 0.35, 0.2]))],
        piece_frames=int(rng.integers(1, 12)) if rng.random() < 0.35 else None,
        drop_n_first_frames=first,
        drop_n_last_frames=last,
        checkpoint_interval=int(rng.integers(3, 40)),
    )
    return lengths, options


def _phase_options(job: _Job, resumed: bool = True) -> OrderOptions:
    """The job's options but for those a resume must not care about: the seed (the saved one wins), the checkpoint
    interval, and an unshuffled pool's size (the first phase: the job's seed)."""
    rng, options = job.rng, job.options
    pool = options.episode_pool_size if options.shuffle else int(rng.integers(1, 6))
    seed = options.seed if rng.random() < 0.5 or not resumed else int(rng.integers(1000))
    return dataclasses.replace(
        options, seed=seed, episode_pool_size=pool, checkpoint_interval=int(rng.integers(1, 50)), max_checkpoints=7
    )


#: Order options a resume must refuse to change, each with a changed value, and the argument an error names.
def _forbidden(options: OrderOptions, saved_world_size: int, world_size: int) -> list[tuple[dict[str, Any], str]]:
    changes: list[tuple[dict[str, Any], str]] = [
        ({"shuffle": not options.shuffle}, "shuffle"),
        ({"piece_frames": None if options.piece_frames else 5}, "episode_piece_frames"),
        ({"drop_n_first_frames": options.drop_n_first_frames + 1}, "drop_n_first_frames"),
        ({"drop_n_last_frames": options.drop_n_last_frames + 2}, "drop_n_last_frames"),
    ]
    if options.shuffle:
        changes.append(({"episode_pool_size": options.episode_pool_size + 1}, "episode_pool_size"))
    if max(saved_world_size, world_size) > 1:
        other = RankBalance.DROP if options.rank_balance is not RankBalance.DROP else RankBalance.PAD
        changes.append(({"rank_balance": other}, "rank_balance"))
    return changes


def _check_refused(job: _Job, state: dict[str, Any], world_size: int, batch: int) -> None:
    """A resume of ``state`` under one forbidden change is refused naming it, and leaves the stream as it was."""
    saved_world_size = int(state["world_size"])
    changes = _forbidden(job.options, saved_world_size, world_size)
    change, name = changes[int(job.rng.integers(len(changes)))]
    options = dataclasses.replace(job.options, **change)
    stream = SampleStream(job.lengths, rank=0, world_size=world_size, batch_size=batch, options=options)
    before = (stream.order, stream.epoch, stream.samples_consumed)
    with pytest.raises(ResumeStateError, match=rf"saved with .*\b{name}="):
        stream.load_state_dict(state)
    assert (stream.order, stream.epoch, stream.samples_consumed) == before
    job.counts["refused"] += 1


class _Rank:
    """One rank of a phase, read as the iterator reads it."""

    def __init__(self, job: _Job, stream: SampleStream, batch: int, workers: int, drop_last: bool) -> None:
        self.job, self.stream, self.batch, self.workers, self.drop_last = job, stream, batch, workers, drop_last
        self.copies: list[SampleOrder] | None = None
        self.pass_start: int | None = None
        self.batch_index = 0

    def step(self, loop_ends: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """One batch; a pass that has none left moves to the next epoch and starts the next pass (none past the job),
        but where ``loop_ends`` (the trainer's loop over the pass ended: it may save there, at the next epoch's
        start). The batch read (``(episodes, frames)``), or None."""
        stream = self.stream
        while True:
            if self.pass_start is None:
                if self.copies is None:  # (the pipeline: built once a phase, its workers' copies pickled then)
                    stream.order.prepare(stream.epoch, stream.samples_consumed)
                    self.copies = [pickle.loads(pickle.dumps(stream.order)) for _ in range(self.workers)]
                self.pass_start = stream.samples_consumed
            epoch, start = stream.epoch, stream.samples_consumed
            if epoch <= self.job.last_epoch:
                self._plan(epoch)
            total = stream.num_samples()
            stop = min(total, start + self.batch)
            if start >= total or (self.drop_last and stop - start < self.batch):
                self.pass_start = None
                stream.set_epoch(epoch + 1)
                if epoch + 1 > self.job.last_epoch or loop_ends:
                    return None  # (past the job: drop_last may leave every epoch empty)
                continue
            order = self.copies[self.batch_index % self.workers] if self.copies else stream.order
            self.batch_index += 1
            episodes, frames = order.samples(epoch, start, stop)
            self._record(epoch, start, episodes, frames)
            if self.workers:
                stream.order.follow(epoch, stop)
            stream.advance(stop - start)
            return episodes, frames

    def _plan(self, epoch: int) -> Plan:
        """The plan this rank reads ``epoch`` from now, registered with the job (an empty one too)."""
        order = self.stream.order
        resumed = order.resumed_epoch
        segments = (
            tuple((s.world_size, s.samples_consumed) for s in resumed.segments)
            if resumed is not None and resumed.epoch == epoch
            else ()
        )
        plan = (epoch, segments, order.world_size)
        job = self.job
        if plan not in job.plans:
            job.plans[plan] = _Plan()
        if plan in job.epoch_plans[epoch]:
            job.epoch_plans[epoch].remove(plan)  # (the last entered, last)
        job.epoch_plans[epoch].append(plan)
        return plan

    def _record(self, epoch: int, start: int, episodes: np.ndarray, frames: np.ndarray) -> None:
        plan = self._plan(epoch)
        job = self.job
        record = job.plans[plan]
        rank = self.stream.order.rank
        positions = list(range(start, start + episodes.size))
        record.positions[rank] += positions
        record.samples[rank] += list(zip(episodes.tolist(), frames.tolist(), strict=True))
        want = job.reference(plan, rank).samples(epoch, start, start + episodes.size)
        np.testing.assert_array_equal(episodes, want[0], err_msg=f"plan {plan} rank {rank} at {start}")
        np.testing.assert_array_equal(frames, want[1], err_msg=f"plan {plan} rank {rank} at {start}")


def _load(job: _Job, ranks: list[SampleStream], states: list[dict[str, Any]], balanced: bool) -> None:
    """Each new rank loads a saved state: rank 0's (what a job that saves one hands every rank), its own (the same
    world size), or every old rank's gathered; round-tripped through JSON, as a checkpoint stores it. Under ``none``
    each loads its own, rank 0's refused on the others (each rank's count is its own), or every rank's gathered where
    they stand at one position (mid-epoch too: each rank's position and walk)."""
    same = len(ranks) == len(states)
    how = int(job.rng.integers(3))
    if not balanced and how and same and len({(s["epoch"], s["samples_consumed"]) for s in states}) == 1:
        merged = merge_rank_states(states)
        job.counts["none_merged"] += 1
        for stream in ranks:
            stream.load_state_dict(json.loads(json.dumps(merged)))
        return
    for rank, stream in enumerate(ranks):
        if not balanced and rank and how == 0 and "gathered_ranks" not in states[0]:
            # (rank 0's own state, handed to every rank: another rank's count there)
            refused = rf"rank_balance='none'.*rank 0's state.*where rank {rank} stood"
            with pytest.raises(ResumeStateError, match=refused):
                stream.load_state_dict(json.loads(json.dumps(states[0])))
            job.counts["refused"] += 1
        if not balanced or (same and how == 1):
            state = states[rank]
        elif how == 2 and not same:
            state = merge_rank_states(states)
        else:
            state = states[0]
        stream.load_state_dict(json.loads(json.dumps(state)))


def _unbalanced_resume(job: _Job, states: list[dict[str, Any]], world_size: int) -> tuple[int, list[dict[str, Any]]]:
    """``none`` on ``world_size`` ranks, saved on others: the world size and the states its ranks load.

    Ranks of unequal counts finish epochs apart, so one rank's state is refused on another world size (mid-epoch, or
    at an epoch's start where it was one of several ranks: another may still read the epoch before, or be further
    on); every old rank's state gathered by :func:`merge_rank_states` is taken where all stand at one epoch's start,
    and the merge is refused where they stand apart. Elsewhere the job resumes on its old ranks, each its own."""
    lengths, options = job.lengths, job.options
    first = states[0]
    mid_epoch = bool(first["samples_consumed"] or first["prior_segments"])
    stream = SampleStream(lengths, rank=0, world_size=world_size, batch_size=1, options=options)
    if mid_epoch or len(states) > 1:
        with pytest.raises(ResumeStateError, match="rank_balance='none'"):
            stream.load_state_dict(states[0])
        job.counts["refused"] += 1
    if len(states) > 1:  # (rank 0's state passed for every rank's is one rank's: merge_rank_states counts it once)
        with pytest.raises(ResumeStateError, match="rank_balance='none'"):
            stream.load_state_dict(merge_rank_states([first] * len(states)))
        job.counts["refused"] += 1
    if len({(s["epoch"], s["samples_consumed"]) for s in states}) > 1:
        with pytest.raises(ResumeStateError, match="stand at other positions"):
            merge_rank_states(states)
        return len(states), states
    if mid_epoch:
        return len(states), states
    job.counts["none_resharded"] += 1
    return world_size, [json.loads(json.dumps(merge_rank_states(states)))] * world_size


def _run_job(seed: int, lengths: np.ndarray | None = None) -> _Job:
    """Job ``seed``'s phases, over ``lengths`` (another layer's episodes: a union's) where given."""
    case_lengths, options = _case(seed)
    lengths = case_lengths if lengths is None else lengths
    job = _Job(lengths, options, np.random.default_rng([seed, 1]))
    units = int(np.count_nonzero(_units(lengths, options).length))
    if units == 0:
        pytest.skip("no frame is eligible (the drops leave none)")
    balanced = options.rank_balance is not RankBalance.NONE
    states: list[dict[str, Any]] | None = None
    finished = False
    phases = int(job.rng.integers(2, 7))
    for phase in range(phases):
        rng = job.rng
        world_size = int(rng.integers(1, min(8, units) + 1))
        if states is not None and not balanced and world_size != len(states):
            world_size, states = _unbalanced_resume(job, states, world_size)
        batch = int(rng.integers(1, 9))
        if states is not None and rng.random() < 0.3:
            _check_refused(job, states[0], world_size, batch)
        phase_options = _phase_options(job, states is not None)  # (one run: every rank's the same)
        streams = [
            SampleStream(lengths, rank=r, world_size=world_size, batch_size=batch, options=phase_options)
            for r in range(world_size)
        ]
        if states is not None:
            _load(job, streams, states, balanced)
            if balanced and finished:  # (an epoch its ranks finished stays finished on any ranks: nothing left)
                assert all(s.num_samples() == s.samples_consumed for s in streams), "a finished epoch came back"
                job.counts["finished_resumes"] += 1
        drop_last = bool(rng.random() < 0.4)
        ranks = [_Rank(job, s, batch, int(rng.integers(0, 4)), drop_last) for s in streams]
        per_epoch = -(-SampleOrder(lengths, rank=0, world_size=world_size, options=options).num_samples(0) // batch)
        steps = int(rng.integers(0, per_epoch * 3 // 2 + 2))  # (stops inside an epoch, mostly)
        last = phase == phases - 1  # (reads to the end of the job's last epoch)
        while (last or steps > 0) and not all(r.stream.epoch > job.last_epoch for r in ranks):
            steps -= 1
            loop_ends = bool(rng.random() < 0.3)
            for rank in ranks:
                if rank.stream.epoch <= job.last_epoch:
                    rank.step(loop_ends)
            if balanced:
                where = {(r.stream.epoch, r.stream.samples_consumed) for r in ranks}
                assert len(where) == 1, f"balanced ranks stand apart after a batch: {where}"
        states = [s.state_dict() for s in streams]
        # (a plan left empty, too few units for its ranks, is not finished: fewer ranks read what it left)
        finished = 0 < streams[0].num_samples() == streams[0].samples_consumed
        job.counts["resumes"] += not last
    return job


def _check_epochs(job: _Job, epochs: Sequence[int] | None = None) -> dict[int, tuple[list[tuple[int, int]], int]]:
    """``epochs`` of ``job`` (default: each to its last) checked; per epoch, the ranks' own samples (``(episode,
    frame)``) and how many eligible frames none read (those its last plan left unread, or too few units left for its
    ranks)."""
    lengths, options = job.lengths, job.options
    units = _units(lengths, options)
    eligible = {
        (int(e), int(o) + f)
        for e, o, n in zip(units.episode, units.offset, units.length, strict=True)
        for f in range(n)
    }
    checked = {}
    for epoch in range(job.last_epoch + 1) if epochs is None else epochs:
        plans = job.epoch_plans[epoch]
        assert plans, f"epoch {epoch} was never entered"
        own: list[tuple[int, int]] = []
        for plan in plans:
            record = job.plans[plan]
            for rank, positions in record.positions.items():
                reference = job.reference(plan, rank)
                natural = int(reference.rank_frame_counts(epoch)[rank])
                target = reference.num_samples(epoch)
                assert positions == list(range(len(positions))), f"plan {plan} rank {rank} read positions out of order"
                assert len(positions) <= target
                samples = record.samples[rank]
                own += samples[:natural]
                padded = samples[natural:]
                if options.rank_balance is RankBalance.PAD:
                    assert target == max(reference.rank_frame_counts(epoch))
                    assert set(padded) <= set(samples[:natural]), "a pad repeated another rank's sample"
                    job.counts["padded"] += len(padded)
                else:
                    assert not padded
        assert len(own) == len(set(own)), f"epoch {epoch}: a frame was read twice"
        assert set(own) <= eligible
        job.counts["frames"] += len(own)
        missed = len(eligible - set(own))
        job.counts["missed"] += missed
        checked[epoch] = (own, missed)
        # What the epoch's last plan with samples left unread: its ranks' own positions past where they stopped; a
        # plan after it is empty, its ranks having finished the epoch, or fewer part-read units than new ranks left.
        full = [p for p in plans if job.reference(p, 0).num_samples(epoch)]
        final = full[-1] if full else plans[-1]
        counts = job.reference(final, 0).rank_frame_counts(epoch)
        read = {rank: len(p) for rank, p in job.plans[final].positions.items()}
        left = sum(max(0, int(counts[r]) - read.get(r, 0)) for r in range(final[2]))
        finished = bool(full) and all(
            read.get(r, 0) == job.reference(final, r).num_samples(epoch) for r in range(final[2])
        )
        if plans[-1] is final or finished:
            assert missed == left, f"epoch {epoch}: {missed} frames missed, the last plan left {left} unread"
            continue
        part_read = {u for u, (e, o, n) in enumerate(zip(units.episode, units.offset, units.length, strict=True))
                     if any((int(e), int(o) + f) not in set(own) for f in range(n))}  # fmt: skip
        assert 0 < len(part_read) < plans[-1][2], f"epoch {epoch} ended with {len(part_read)} units left"
        job.counts["ended_early"] += missed
    return checked


@pytest.mark.parametrize("seed", range(FIRST, FIRST + JOBS))
def test_a_job_of_resumes_reads_every_frame_of_every_epoch_once(seed: int) -> None:
    job = _run_job(seed)
    _check_epochs(job)
