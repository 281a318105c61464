"""Progress of a long command on stderr: a bar on a terminal, plain log lines anywhere else.

A tqdm bar redraws itself with carriage returns. Written to a file or a pipe (a CI log, ``2> log``, a job
scheduler's output file) every redraw stays: one long line of ``\\r``-joined states that a log viewer shows as
one, or as hundreds. There the count is logged instead, a line at each tenth of the total (at most
:data:`LINE_EVERY_S` apart, so a long run still shows it is alive, and at least :data:`LINE_GAP_S`) and one at the
end; none before :data:`FIRST_LINE_S`, so a count done sooner logs its end alone.

Used by ``lerobot-dali check``, the bench's measurements, and the library's own waits (opening several datasets
at once, the prefetch cache's warm-up), which a training job's log gets from each node's first rank only. A wait
with nothing to count (one call that blocks: DALI starting its worker processes) says what it waits for once it has
lasted a while, and how long it took (:func:`said_if_long`). A count whose units each take long (the warm-up's
first episode over a slow link) says so on a timer, with what it can tell of the work under way (``detail``: the
bytes fetched so far): its first line once ``delay_s`` has passed, then at most every :data:`LINE_EVERY_S`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from . import fork_locks
from .wording import plural

__all__ = ["LINE_EVERY_S", "LINE_GAP_S", "ProgressLines", "progress_counter", "said_if_long"]

#: Longest time between two progress lines where no bar is drawn.
LINE_EVERY_S = 60.0
#: Seconds before a count says its first line (at its next unit done, a tenth or not; none sooner but the end): a
#: check of 15,000 episodes reached its first tenth 3-10 s in, after its worker processes started, with no line
#: before, while a check of 12 episodes done in 0 s logged 10 lines (and ``bench --quick`` 8 per loader).
FIRST_LINE_S = 2.0
#: Least seconds between a line and a tenth's after it: the bench's 8 batches came in one second after its pipeline
#: started (5 s), and each was a tenth: 8 lines saying "(5 s)"; a tenth reached sooner waits for the next unit done.
LINE_GAP_S = 1.0
#: Seconds between two looks of a count's timer (``detail`` given) at whether a line is due: a look logs nothing else.
TICK_S = 1.0


@contextmanager
def progress_counter(
    total: int,
    *,
    desc: str,
    unit: str,
    logger: logging.Logger,
    enabled: bool = True,
    delay_s: float = 0.0,
    first_line_s: float = FIRST_LINE_S,
    detail: Callable[[], str] | None = None,
) -> Iterator[Callable[[int], None]]:
    """``update(n)``, which counts ``n`` more units done (of ``total``), from one thread. Where stderr is a
    terminal, huggingface_hub's bar (``HF_HUB_DISABLE_PROGRESS_BARS`` hides it), log records written on lines of
    their own; elsewhere INFO lines of ``logger`` (:class:`ProgressLines`, ``first_line_s`` as there). Neither before
    ``delay_s`` seconds have passed (work done sooner shows nothing); nothing at all when not ``enabled``.

    ``detail``: what the work under way has done so far (``"12.5 MB fetched"``), shown after the count; a timer thread
    (ended when this returns) then shows it every :data:`TICK_S` on the bar and, in a log, says the count at
    ``delay_s`` and at most every :data:`LINE_EVERY_S` (:meth:`ProgressLines.tick`), however long a unit takes."""
    if not enabled:
        yield lambda n: None
        return
    if sys.stderr.isatty():
        from huggingface_hub.utils import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        started = time.monotonic()

        def show_detail() -> None:
            if detail is not None and time.monotonic() - started >= delay_s:
                bar.set_postfix_str(detail(), refresh=True)  # (the bar drawn by then, if not before)

        with (
            tqdm(total=total, desc=desc, unit=unit, delay=delay_s) as bar,
            logging_redirect_tqdm(tqdm_class=tqdm),  # (a warning on its own line, not after the bar)
            _every(TICK_S if detail is not None else None, show_detail),
        ):
            yield bar.update
        return
    lines = ProgressLines(
        total, desc=desc, unit=unit, logger=logger, delay_s=delay_s, first_line_s=first_line_s, detail=detail
    )
    with _every(TICK_S if detail is not None else None, lines.tick):
        yield lines.update
    lines.finish()


@contextmanager
def _every(period_s: float | None, call: Callable[[], None]) -> Iterator[None]:
    """Within, ``call()`` every ``period_s`` on a daemon thread, which has ended when this returns; nothing for None."""
    if period_s is None:
        yield
        return
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period_s):
            call()

    thread = threading.Thread(target=run, name="lerobot-dali-progress-line", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class ProgressLines:
    """A count of ``total`` logged as ``desc: done/total units (seconds)`` at each tenth of ``total`` (at least
    :data:`LINE_GAP_S` after the line before), at most :data:`LINE_EVERY_S` apart, and by :meth:`finish`; the first line
    at the first unit done ``first_line_s`` in (a count done sooner: :meth:`finish`'s line alone); none until
    ``delay_s`` seconds have passed (:meth:`finish` of a count done sooner logs nothing). A wait shown only past its
    ``delay_s`` (the library's own: opening datasets, the prefetch cache's warm-up) passes ``first_line_s=0``: its delay
    is its quiet time, and once shown each tenth counts. ``detail()`` (when given) follows the count on each line:
    ``desc: done/total units, detail (seconds)``."""

    def __init__(
        self,
        total: int,
        *,
        desc: str,
        unit: str,
        logger: logging.Logger,
        delay_s: float = 0.0,
        first_line_s: float = FIRST_LINE_S,
        detail: Callable[[], str] | None = None,
    ) -> None:
        self.total, self.desc, self.logger, self.delay_s = total, desc, logger, delay_s
        self.first_line_s, self.detail = first_line_s, detail
        self.units = plural(unit)
        self.done = 0
        self._started = self._logged = time.monotonic()
        self._next_tenth = 1
        self._shown = False
        self._lock = fork_locks.lock()  # (update and finish on the counting thread, tick on a timer's)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._started < self.delay_s:
                return
            tenth = self.done * 10 // max(self.total, 1)
            at_tenth = self._shown and tenth >= self._next_tenth and now - self._logged >= LINE_GAP_S
            due = self._due_by_time(now) or at_tenth
            if self.done < self.total and due:  # (all: finish)
                self._next_tenth = tenth + 1
                self._line(now)

    def tick(self) -> None:
        """Say the count if no line was said for a while (the first once ``delay_s`` and ``first_line_s`` have
        passed, then every :data:`LINE_EVERY_S`), though no unit was done since: a timer's, for units that take
        long."""
        with self._lock:
            now = time.monotonic()
            if now - self._started >= self.delay_s and self.done < self.total and self._due_by_time(now):
                self._line(now)

    def _due_by_time(self, now: float) -> bool:
        """Whether a line is due by time alone: the first once the count has lasted (whichever tenth it is at), then
        one each :data:`LINE_EVERY_S`."""
        if not self._shown:
            return now - self._started >= self.first_line_s
        return now - self._logged >= LINE_EVERY_S

    def finish(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._shown or now - self._started >= self.delay_s:
                self._line(now)

    def _line(self, now: float) -> None:
        self._logged, self._shown = now, True
        detail = f", {self.detail()}" if self.detail is not None else ""
        self.logger.info(
            "%s: %d/%d %s%s (%.0f s)", self.desc, self.done, self.total, self.units, detail, now - self._started
        )


@contextmanager
def said_if_long(what: str, *, logger: logging.Logger, delay_s: float, enabled: bool = True) -> Iterator[None]:
    """Within, one wait with no count to show: ``what...`` logged at INFO once it has lasted ``delay_s`` seconds,
    and ``what: done in N s`` when it ends (not where it raised: its error says more); nothing for a wait done
    sooner, nor when not ``enabled``. The first line comes from a timer thread, which has ended when this returns."""
    if not enabled:
        yield
        return
    started = time.monotonic()
    said = threading.Event()

    def say() -> None:
        logger.info("%s...", what)
        said.set()

    timer = threading.Timer(delay_s, say)
    timer.name, timer.daemon = "lerobot-dali-wait-line", True  # (never keeps the interpreter from exiting)
    timer.start()
    failed = True
    try:
        yield
        failed = False
    finally:
        timer.cancel()
        timer.join()  # (a line being said is finished first: said tells whether it was)
        if said.is_set() and not failed:
            logger.info("%s: done in %.1f s", what, time.monotonic() - started)
