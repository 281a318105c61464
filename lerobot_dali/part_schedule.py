"""Where a mixture's non-anchor dataset stands when each mixture epoch starts.

Such a dataset reads its own epochs one after another across the mixture's epochs: its epoch ``k + 1`` follows
``k`` whether or not a mixture epoch ended in between. So its pipeline runs on at a mixture epoch's start (no
restart, no worker start-up) and every one of its samples comes equally often over the run. The start of mixture
epoch ``e`` is still a pure function of ``e`` (``set_epoch`` may jump, and every rank agrees): the batches the
anchor gives in the epochs before, taken from the dataset's epochs in turn. A resume where the dataset stands
elsewhere than that (saved at other shares of the batch) rebases the schedule on where it stands, so it still
reads each of its epochs once, no sample skipped or repeated.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["PartSchedule"]


class PartSchedule:
    """``start(e)``: ``(epoch, samples taken in it)`` of one dataset when mixture epoch ``e`` starts.

    ``mixture_batches(e)`` is how many batches mixture epoch ``e`` takes (the anchor's), ``part_samples(k)`` how
    many samples the dataset's epoch ``k`` holds, ``share`` its samples per batch (a last batch short of it is
    dropped). A dataset whose last batch of an epoch ends a mixture epoch stands at that epoch's end, as its
    iterator does until a pass finds the epoch over. Starts are kept once computed; a jump to epoch ``e``
    computes those before it (one epoch plan per epoch).
    """

    def __init__(
        self,
        mixture_batches: Callable[[int], int],
        part_samples: Callable[[int], int],
        starved: Callable[[int], Exception],
        *,
        share: int = 1,
    ) -> None:
        self._mixture_batches = mixture_batches
        self._part_samples = part_samples
        self._starved = starved  # the error for a dataset that gives no batch in two epochs in a row (from the 2nd)
        self._share = share
        self._starts: dict[int, tuple[int, int]] = {0: (0, 0)}

    def start(self, epoch: int) -> tuple[int, int]:
        if epoch not in self._starts:
            known = max(e for e in self._starts if e < epoch)
            for e in range(known, epoch):
                self._starts[e + 1] = self._advance(self._starts[e], self._mixture_batches(e))
        return self._starts[epoch]

    def rebase(self, epoch: int, position: tuple[int, int], batches_left: int, *, at_start: bool) -> None:
        """The dataset stands at ``position`` in mixture epoch ``epoch``, which has ``batches_left`` batches to go
        (``at_start``: all of them): later epochs start from there. Earlier ones keep their pure starts."""
        self._starts = {e: p for e, p in self._starts.items() if e < epoch} or {0: (0, 0)}
        if at_start:
            self._starts[epoch] = position
        self._starts[epoch + 1] = self._advance(position, batches_left)

    def _advance(self, position: tuple[int, int], batches: int) -> tuple[int, int]:
        epoch, taken = position
        empty = 0
        while batches:
            left = (self._part_samples(epoch) - taken) // self._share
            if left > 0:
                step = min(left, batches)
                taken, batches, empty = taken + step * self._share, batches - step, 0
                continue
            if taken == 0:
                empty += 1
                if empty == 2:
                    raise self._starved(epoch)
            epoch, taken = epoch + 1, 0
        return epoch, taken
