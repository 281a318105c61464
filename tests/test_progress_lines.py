"""A wait with no count to show says what it waits for once it lasts, and how long it took (said_if_long)."""

from __future__ import annotations

import logging
import re
import threading

import pytest

from lerobot_dali.progress_lines import said_if_long

LOGGER = "test.progress_lines"


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
