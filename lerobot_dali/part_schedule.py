"""Where a mixture's non-anchor dataset stands when each mixture epoch starts.

Such a dataset reads its own epochs one after another across the mixture's epochs: its epoch ``k + 1`` follows
``k`` whether or not a mixture epoch ended in between. So its pipeline runs on at a mixture epoch's start (no
restart, no worker start-up) and every one of its samples comes equally often over the run. The start of mixture
epoch ``e`` is still a pure function of ``e`` (``set_epoch`` may jump, and every rank agrees): the batches the
anchor gives in the epochs before, taken from the dataset's epochs in turn.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["PartSchedule"]


class PartSchedule:
    """``start(e)``: ``(epoch, batches taken in it)`` of one dataset when mixture epoch ``e`` starts.

    ``mixture_batches(e)`` is how many batches mixture epoch ``e`` takes (the anchor's), ``part_batches(k)`` how
    many the dataset's epoch ``k`` gives. A dataset whose last batch of an epoch ends a mixture epoch stands at
    that epoch's end (``taken == part_batches(k)``), as its iterator does until a pass finds the epoch over.
    Starts are kept once computed; a jump to epoch ``e`` computes those before it (one epoch plan per epoch).
    """

    def __init__(
        self,
        mixture_batches: Callable[[int], int],
        part_batches: Callable[[int], int],
        starved: Callable[[int], Exception],
    ) -> None:
        self._mixture_batches = mixture_batches
        self._part_batches = part_batches
        self._starved = starved  # the error for a dataset that gives no batch in two epochs in a row (from the 2nd)
        self._starts: list[tuple[int, int]] = [(0, 0)]

    def start(self, epoch: int) -> tuple[int, int]:
        while len(self._starts) <= epoch:
            last = len(self._starts) - 1
            self._starts.append(self._advance(self._starts[last], self._mixture_batches(last)))
        return self._starts[epoch]

    def _advance(self, position: tuple[int, int], batches: int) -> tuple[int, int]:
        epoch, taken = position
        empty = 0
        while batches:
            left = self._part_batches(epoch) - taken
            if left > 0:
                step = min(left, batches)
                taken, batches, empty = taken + step, batches - step, 0
                continue
            if taken == 0:
                empty += 1
                if empty == 2:
                    raise self._starved(epoch)
            epoch, taken = epoch + 1, 0
        return epoch, taken
