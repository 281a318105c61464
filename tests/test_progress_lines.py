"""Progress lines in a log: a count's first line once it lasts (ProgressLines), and a wait with no count to show,
which says what it waits for once it lasts and how long it took (said_if_long)."""

from __future__ import annotations

import logging
import re
import threading
from types import SimpleNamespace

import pytest

from lerobot_dali import progress_lines
from lerobot_dali.progress_lines import ProgressLines, said_if_long

LOGGER = "test.progress_lines"


def test_a_count_says_its_first_line_once_it_lasts_though_no_tenth_is_done(caplog, monkeypatch) -> None:
    """A check of 15,000 episodes said nothing until its first tenth, 3-10 s in (its workers started meanwhile):
    past FIRST_LINE_S its next episode done says how far it got; then each tenth, as before, and the end once."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lines = ProgressLines(1000, desc="check", unit="episode", logger=logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for clock.now in (0.5, 1.0, 2.5, 3.0, 3.5):  # (five episodes: no tenth)
            lines.update(1)
        clock.now = 4.0
        lines.update(95)
        clock.now = 5.0
        lines.update(900)
        lines.finish()
    assert _said(caplog) == ["check: 3/1000 episodes (2 s)", "check: 100/1000 episodes (4 s)",
                             "check: 1000/1000 episodes (5 s)"]  # fmt: skip


def test_tenths_reached_within_a_second_of_the_line_before_wait_for_the_next_unit(caplog, monkeypatch) -> None:
    """``bench --quick``'s 8 batches came in the second after its pipeline started (5 s), each a tenth: 8 lines, all
    "(5 s)". A tenth now needs LINE_GAP_S since the line before; the end is said as before."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lines = ProgressLines(8, desc="bench", unit="batch", logger=logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for clock.now in (5.0, 5.1, 5.2, 5.3, 5.4, 6.2, 6.3, 6.4):
            lines.update(1)
        lines.finish()
    assert _said(caplog) == ["bench: 1/8 batches (5 s)", "bench: 6/8 batches (6 s)", "bench: 8/8 batches (6 s)"]


def test_a_count_done_at_once_past_its_first_line_says_the_end_once(caplog, monkeypatch) -> None:
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lines = ProgressLines(1, desc="footers", unit="file", logger=logging.getLogger(LOGGER), delay_s=2.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.now = 3.0
        lines.update(1)
        lines.finish()
    assert _said(caplog) == ["footers: 1/1 files (3 s)"]


def test_a_count_whose_units_take_long_says_its_detail_on_its_timer_without_spam(caplog, monkeypatch) -> None:
    """A warm-up over a slow link said nothing until its first episode arrived (minutes): its timer's looks now say
    the count and the detail once the delay has passed, then at most every LINE_EVERY_S; units done still say tenths."""
    clock, fetched = SimpleNamespace(now=0.0), [0]
    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lines = ProgressLines(10, desc="warming", unit="episode", logger=logging.getLogger(LOGGER), delay_s=2.0,
                          first_line_s=0.0, detail=lambda: f"{fetched[0] / 1e6:.1f} MB fetched")  # fmt: skip
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for clock.now, fetched[0] in ((1.0, 10**6), (2.5, 3 * 10**6), (30.0, 9 * 10**6), (63.0, 20 * 10**6)):
            lines.tick()
        clock.now = 70.0
        lines.update(1)  # (a tenth)
        for clock.now in (100.0, 131.0):
            lines.tick()
        clock.now = 140.0
        lines.update(9)
        lines.tick()  # (all done: the end alone says it)
        lines.finish()
    assert _said(caplog) == [
        "warming: 0/10 episodes, 3.0 MB fetched (2 s)", "warming: 0/10 episodes, 20.0 MB fetched (63 s)",
        "warming: 1/10 episodes, 20.0 MB fetched (70 s)", "warming: 1/10 episodes, 20.0 MB fetched (131 s)",
        "warming: 10/10 episodes, 20.0 MB fetched (140 s)",
    ]  # fmt: skip


def test_a_counter_with_a_detail_ends_its_timer_thread(caplog) -> None:
    from lerobot_dali.progress_lines import progress_counter

    with progress_counter(3, desc="w", unit="episode", logger=logging.getLogger(LOGGER), detail=lambda: "x") as done:
        assert [t.name for t in threading.enumerate()].count("lerobot-dali-progress-line") == 1
        done(3)
    assert "lerobot-dali-progress-line" not in [t.name for t in threading.enumerate()]


def _wait_lines() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lerobot-dali-wait-line"]


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _first_line_said(caplog: pytest.LogCaptureFixture) -> None:
    """Block, as a long call does, until the timer has said its line (a wait past the delay)."""
    for _ in range(500):
        if _said(caplog):
            return
        threading.Event().wait(0.01)
    raise AssertionError("the wait's first line never came")


def test_a_wait_past_the_delay_says_what_it_waits_for_then_how_long_it_took(caplog) -> None:
    waits = logging.getLogger(LOGGER)
    with caplog.at_level(logging.INFO, logger=LOGGER), said_if_long("starting 4 workers", logger=waits, delay_s=0.0):
        _first_line_said(caplog)
    said = _said(caplog)
    assert len(said) == 2 and said[0] == "starting 4 workers...", said
    assert re.fullmatch(r"starting 4 workers: done in \d+\.\d s", said[1]), said
    assert not _wait_lines()


def test_a_wait_done_sooner_says_nothing_and_leaves_no_thread(caplog) -> None:
    """A warm start (the workers up in a second) logs nothing; the timer's thread ends with the wait."""
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with said_if_long("starting 4 workers", logger=logging.getLogger(LOGGER), delay_s=60.0):
            assert len(_wait_lines()) == 1
        with said_if_long("starting 4 workers", logger=logging.getLogger(LOGGER), delay_s=0.0, enabled=False):
            assert not _wait_lines()  # (a node's other ranks: no timer at all)
    assert _said(caplog) == []
    assert not _wait_lines()


def test_a_wait_that_fails_says_no_time_done(caplog) -> None:
    """Its error says more than a "done in" would."""
    with (
        caplog.at_level(logging.INFO, logger=LOGGER),
        pytest.raises(RuntimeError, match="workers failed"),
        said_if_long("starting 4 workers", logger=logging.getLogger(LOGGER), delay_s=0.0),
    ):
        _first_line_said(caplog)
        raise RuntimeError("workers failed")
    assert _said(caplog) == ["starting 4 workers..."]
    assert not _wait_lines()
