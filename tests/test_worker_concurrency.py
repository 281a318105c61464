"""Every worker process computes a batch at once: DALI's parallel external source gives each batch to one worker
and schedules only its ``prefetch_queue_depth`` batches ahead, so the graph must ask for at least one per worker."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

import lerobot_dali.iterator as iterator_module
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.dali_graph import source_queue_depth
from lerobot_dali.iterator import DALILeRobotIterator

#: Where the workers write when each batch's assembly ran (they inherit the environment at spawn).
TIMES_ENV = "LEROBOT_DALI_TEST_BATCH_TIMES"
SLEEP_S = 0.4


class _TimedSource(BatchSource):
    """Each batch takes SLEEP_S longer and leaves a file with its start and end (module level: spawned workers
    import it). Sleeping needs no core, so the overlap shows the scheduling, not the 2-core machine."""

    def assemble(self, *args, **kwargs):
        start = time.monotonic()
        time.sleep(SLEEP_S)
        out = super().assemble(*args, **kwargs)
        Path(os.environ[TIMES_ENV], f"{os.getpid()}-{start}").write_text(f"{start} {time.monotonic()}")
        return out


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:  # (an end sorts before a start at the same instant: touching is not overlapping)
        running += step
        most = max(most, running)
    return most


def test_most_at_once_counts_overlaps() -> None:
    assert _most_at_once([(0, 1), (1, 2), (2, 3)]) == 1
    assert _most_at_once([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3


@pytest.mark.parametrize(("prefetch", "workers", "depth"), [(2, 1, 2), (2, 2, 2), (2, 12, 12), (3, 2, 3), (1, 4, 4)])
def test_the_source_keeps_one_batch_per_worker_in_hand(prefetch: int, workers: int, depth: int) -> None:
    assert source_queue_depth(prefetch, workers) == depth


def test_four_workers_assemble_four_batches_at_once(make_ds, monkeypatch, tmp_path: Path) -> None:
    """At the default prefetch of 2, four workers assembled two batches at a time (the other two idle)."""
    root = make_ds(episodes=4, frames_per_episode=8, cameras=1, codec="av1", fps=10, episodes_per_file=4, gop=2)
    times = tmp_path / "times"
    times.mkdir()
    monkeypatch.setenv(TIMES_ENV, str(times))
    monkeypatch.setattr(iterator_module, "BatchSource", _TimedSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=4)
    try:
        batches = sum(1 for _ in it)
    finally:
        it.close()
    assert batches == 16
    intervals = [tuple(map(float, f.read_text().split())) for f in times.iterdir()]
    workers = {f.name.split("-")[0] for f in times.iterdir()}
    assert len(intervals) >= batches and len(workers) == 4
    assert _most_at_once(intervals) >= 3  # type: ignore[arg-type]  (4 expected; 2 before)


def _keys(batch: dict) -> list[tuple[int, int]]:
    return [(int(e), int(f)) for e, f in zip(batch["episode_index"], batch["frame_index"], strict=True)]


def test_more_workers_than_an_epoch_has_batches_lose_and_repeat_nothing(make_ds) -> None:
    """6 workers keep 6 batches in hand where an epoch has 4 (the last one partial): the batches scheduled past an
    epoch's end are dropped, each epoch covers every frame once, and a resume mid-epoch continues exactly."""
    root = make_ds(episodes=3, frames_per_episode=5, cameras=1, codec="vp9", fps=10, episodes_per_file=3, gop=2)
    options = dict(batch_size=4, shuffle=True, seed=11, device="cpu", num_workers=6, drop_last=False)
    it = DALILeRobotIterator(root, **options)
    whole = []
    for epoch in range(3):
        it.set_epoch(epoch)
        batches = [_keys(b) for b in it]
        assert [len(b) for b in batches] == [4, 4, 4, 3]
        assert Counter(key for b in batches for key in b) == Counter((e, f) for e in range(3) for f in range(5))
        whole += [key for b in batches for key in b]
    it.close()
    first = DALILeRobotIterator(root, **options)
    stream = iter(first)
    seen = _keys(next(stream)) + _keys(next(stream))
    state = first.state_dict()
    first.close()
    resumed = DALILeRobotIterator(root, **options)
    resumed.load_state_dict(state)
    for epoch in range(3):
        if epoch:
            resumed.set_epoch(epoch)
        seen += [key for b in resumed for key in _keys(b)]
    resumed.close()
    assert seen == whole
