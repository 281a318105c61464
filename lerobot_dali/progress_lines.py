"""Progress of a long command on stderr: a bar on a terminal, plain log lines anywhere else.

A tqdm bar redraws itself with carriage returns. Written to a file or a pipe (a CI log, ``2> log``, a job
scheduler's output file) every redraw stays: one long line of ``\\r``-joined states that a log viewer shows as
one, or as hundreds. There the count is logged instead, a line at each tenth of the total (at most
:data:`LINE_EVERY_S` apart, so a long run still shows it is alive) and one at the end.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["LINE_EVERY_S", "ProgressLines", "progress_counter"]

#: Longest time between two progress lines where no bar is drawn.
LINE_EVERY_S = 60.0


@contextmanager
def progress_counter(
    total: int, *, desc: str, unit: str, logger: logging.Logger, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """``update(n)``, which counts ``n`` more units done (of ``total``). Where stderr is a terminal,
    huggingface_hub's bar (``HF_HUB_DISABLE_PROGRESS_BARS`` hides it), log records written on lines of their own;
    elsewhere INFO lines of ``logger`` (:class:`ProgressLines`). Nothing at all when not ``enabled``."""
    if not enabled:
        yield lambda n: None
        return
    if sys.stderr.isatty():
        from huggingface_hub.utils import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        with (
            tqdm(total=total, desc=desc, unit=unit) as bar,
            logging_redirect_tqdm(tqdm_class=tqdm),  # (a warning on its own line, not after the bar)
        ):
            yield bar.update
        return
    lines = ProgressLines(total, desc=desc, unit=unit, logger=logger)
    yield lines.update
    lines.finish()


class ProgressLines:
    """A count of ``total`` logged as ``desc: done/total units (seconds)`` at each tenth of ``total``, at most
    :data:`LINE_EVERY_S` apart, and by :meth:`finish`."""

    def __init__(self, total: int, *, desc: str, unit: str, logger: logging.Logger) -> None:
        self.total, self.desc, self.unit, self.logger = total, desc, unit, logger
        self.done = 0
        self._started = self._logged = time.monotonic()
        self._next_tenth = 1

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        tenth = self.done * 10 // max(self.total, 1)
        if (tenth >= self._next_tenth and self.done < self.total) or now - self._logged >= LINE_EVERY_S:
            self._next_tenth = tenth + 1
            self._line(now)

    def finish(self) -> None:
        self._line(time.monotonic())

    def _line(self, now: float) -> None:
        self._logged = now
        self.logger.info("%s: %d/%d %ss (%.0f s)", self.desc, self.done, self.total, self.unit, now - self._started)
