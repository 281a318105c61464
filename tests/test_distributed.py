"""Rank detection: explicit arguments, then torch.distributed, then the launcher's environment, then accelerate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from lerobot_dali.distributed import resolve_rank
from lerobot_dali.iterator import DALILeRobotIterator

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture
def clean_env(monkeypatch) -> pytest.MonkeyPatch:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_arguments_win_and_must_come_in_pairs(clean_env) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    info = resolve_rank(2, 3)
    assert (info.rank, info.world_size, info.source) == (2, 3, "arguments")
    with pytest.raises(ValueError, match="both rank and world_size"):
        resolve_rank(1, None)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        resolve_rank(3, 3)


def test_launcher_environment(clean_env) -> None:
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "1")
    info = resolve_rank()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 4, 1, "environment")


def test_an_initialised_process_group_wins_over_the_environment(clean_env, tmp_path: Path) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")  # stale or foreign values: the process group is the truth
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        info = resolve_rank()
    finally:
        dist.destroy_process_group()
    assert (info.rank, info.world_size, info.source) == (0, 1, "torch.distributed")


def test_accelerate_then_single_process(clean_env) -> None:
    pytest.importorskip("accelerate")
    info = resolve_rank()
    assert (info.rank, info.world_size, info.source) == (0, 1, "accelerate")


def test_iterator_reads_its_rank_from_the_launcher(make_ds, clean_env) -> None:
    root = make_ds(episodes=4, frames_per_episode=[3, 4, 2, 5], cameras=1, codec="vp9", size=(64, 64))
    seen = []
    for rank in (0, 1):
        clean_env.setenv("RANK", str(rank))
        clean_env.setenv("WORLD_SIZE", "2")
        it = DALILeRobotIterator(root, batch_size=1, device="cpu", num_workers=0, shuffle=False, drop_last=False)
        assert (it.rank, it.world_size) == (rank, 2)
        seen.append({int(i) for batch in it for i in batch["index"]})
        it.close()
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] <= set(range(14))
