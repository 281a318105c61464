"""PartSchedule: where a mixture's non-anchor dataset starts each mixture epoch, against hand-counted batches."""

from __future__ import annotations

import pytest

from lerobot_dali.errors import DatasetError
from lerobot_dali.part_schedule import PartSchedule


class Starved(DatasetError):
    pass


def _schedule(mixture: list[int] | int, part: list[int] | int) -> tuple[PartSchedule, list[int]]:
    """A schedule over per-epoch batch counts (a list, or one count for every epoch); also the part epochs asked."""
    asked: list[int] = []

    def part_batches(k: int) -> int:
        asked.append(k)
        return part if isinstance(part, int) else part[k]

    def mixture_batches(e: int) -> int:
        return mixture if isinstance(mixture, int) else mixture[e]

    return PartSchedule(mixture_batches, part_batches, lambda k: Starved(f"epoch {k}")), asked


@pytest.mark.parametrize(
    ("mixture", "part", "starts"),
    [
        # 16 batches an epoch from epochs of 9: epoch 0 whole and 7 of 1; then 2, 9, 5; then 4, 9, 3.
        (16, 9, [(0, 0), (1, 7), (3, 5), (5, 3)]),
        # 5 from epochs of 6: 5 of epoch 0; then its last batch alone and 4 of epoch 1.
        (5, 6, [(0, 0), (0, 5), (1, 4)]),
    ],
)
def test_epochs_run_on_across_mixture_epochs(mixture: int, part: int, starts: list[tuple[int, int]]) -> None:
    schedule, _ = _schedule(mixture, part)
    assert [schedule.start(e) for e in range(len(starts))] == starts


def test_a_jump_gives_the_start_a_run_reaches() -> None:
    ran, _ = _schedule([5, 8, 3, 11, 2], [4, 6, 2, 7, 9, 3, 5])
    steps = [ran.start(e) for e in range(5)]
    jumped, _ = _schedule([5, 8, 3, 11, 2], [4, 6, 2, 7, 9, 3, 5])
    assert jumped.start(4) == steps[4] == (4, 8)  # 5+8+3+11 = 27 batches: 4+6+2+7 = 19, then 8 of epoch 4
    assert [jumped.start(e) for e in range(5)] == steps


def test_an_epoch_that_ends_a_mixture_epoch_stands_at_its_end() -> None:
    schedule, asked = _schedule(9, 9)
    assert schedule.start(1) == (0, 9)  # as the dataset's iterator, until a pass finds the epoch over
    assert schedule.start(2) == (1, 9)
    assert asked == [0, 0, 1]  # the epoch after is not planned before a batch is needed from it


def test_an_epoch_without_a_batch_is_passed_over_but_two_in_a_row_fail() -> None:
    schedule, _ = _schedule(5, [3, 0, 4, 0, 0, 1])
    assert schedule.start(1) == (2, 2)  # 3 of epoch 0, none in 1, 2 of 2
    with pytest.raises(Starved, match="epoch 4"):
        schedule.start(2)  # 2 of epoch 2, then epochs 3 and 4 give nothing


def test_two_epochs_without_a_batch_from_a_start_fail_at_the_second() -> None:
    """Epochs 0 and 1 give no batch: mixture epoch 1's start fails naming epoch 1, the second in a row (epoch 2's 5
    batches are not reached), as do epochs 3 and 4 reached from a start at epoch 3 by a rebase."""
    schedule, _ = _schedule(5, [0, 0, 5])
    with pytest.raises(Starved, match="epoch 1"):
        schedule.start(1)
    rebased, _ = _schedule(5, [5, 5, 5, 0, 0, 5])
    with pytest.raises(Starved, match="epoch 4"):
        rebased.rebase(0, (3, 0), 5, at_start=True)


def test_empty_epochs_apart_are_not_two_in_a_row() -> None:
    """Epochs 0 and 2 give no batch, but epoch 1 between them does: 7 batches take 3 of epoch 1, 3 of epoch 3 and
    1 of epoch 4, no error (an epoch with batches resets the count)."""
    schedule, _ = _schedule(7, [0, 3, 0, 3, 3])
    assert schedule.start(1) == (4, 1)


def test_a_rebase_starts_later_epochs_where_the_dataset_stands() -> None:
    """A resume finds the dataset at epoch 4, 2 batches in, with 10 batches of mixture epoch 2 to go: epoch 3
    starts 10 batches on (7 left of epoch 4, 3 of 5), epoch 4 16 on from there; epoch 2 keeps its pure start."""
    schedule, _ = _schedule(16, 9)
    schedule.rebase(2, (4, 2), 10, at_start=False)
    assert [schedule.start(e) for e in (3, 4)] == [(5, 3), (7, 1)]
    assert [schedule.start(e) for e in range(3)] == [(0, 0), (1, 7), (3, 5)]
    at_epoch_0, _ = _schedule(16, 9)
    at_epoch_0.rebase(0, (0, 4), 3, at_start=False)  # 3 batches left of mixture epoch 0, 4 in: epoch 0 is pure
    assert [at_epoch_0.start(e) for e in range(3)] == [(0, 0), (0, 7), (2, 5)]  # (2 of epoch 0, 9, 5 of epoch 2)
    at_start, _ = _schedule(16, 9)
    at_start.rebase(2, (4, 2), 16, at_start=True)
    assert [at_start.start(e) for e in (2, 3)] == [(4, 2), (5, 9)]  # (7 of epoch 4, then 5 whole: at its end)


def test_samples_at_a_share_drop_a_short_last_batch() -> None:
    """Counted in samples at 3 a batch: epochs of 29 give 9 batches (2 dropped); a rebase 4 samples in (at
    another share before) leaves (29 - 4) // 3 = 8 of that epoch."""
    schedule = PartSchedule(lambda e: 10, lambda k: 29, lambda k: Starved(f"epoch {k}"), share=3)
    assert [schedule.start(e) for e in range(3)] == [(0, 0), (1, 3), (2, 6)]
    schedule.rebase(1, (1, 4), 10, at_start=True)
    assert [schedule.start(e) for e in (1, 2)] == [(1, 4), (2, 6)]
