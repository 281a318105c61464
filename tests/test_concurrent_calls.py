"""Calls made several at once (``in_threads``): results in order, and what a log gets while they run."""

from __future__ import annotations

import logging
import time

import pytest

from lerobot_dali import concurrent_calls
from lerobot_dali.concurrent_calls import in_threads


def test_opening_datasets_at_once_logs_lines_not_a_bar_where_stderr_is_no_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A training job's log (no terminal) got the bar's redraws, joined by carriage returns, from every rank."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        assert in_threads(lambda s: time.sleep(s) or s, [2.3, 2.3], progress="opening datasets") == [2.3, 2.3]
    assert "\r" not in capsys.readouterr().err
    said = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert said == ["opening datasets: 1/2 datasets", "opening datasets: 2/2 datasets"]


@pytest.mark.parametrize(("local_rank", "lines"), [("0", 3), ("1", 0)])
def test_only_a_nodes_first_rank_shows_the_datasets_opened(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    local_rank: str, lines: int,
) -> None:  # fmt: skip
    """As the Hub's download and the warm-up: eight ranks of a node said the same count eight times."""
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0, raising=False)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        in_threads(time.sleep, [0.05, 0.1, 0.15], progress="opening datasets")
    assert "\r" not in capsys.readouterr().err
    assert len(caplog.records) == lines


def test_calls_done_before_the_delay_show_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.concurrent_calls"):
        in_threads(time.sleep, [0.01, 0.01], progress="opening datasets")
    assert caplog.records == []


def test_the_first_failure_in_order_is_raised_once_every_call_has_ended() -> None:
    ended: list[int] = []

    def call(i: int) -> int:
        time.sleep(0.05 * (3 - i))
        ended.append(i)
        if i in (1, 2):
            raise ValueError(f"call {i}")
        return i

    with pytest.raises(ValueError, match="call 1"):
        in_threads(call, [0, 1, 2])
    assert sorted(ended) == [0, 1, 2]
