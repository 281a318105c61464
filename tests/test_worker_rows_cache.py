"""A worker keeps the rows of every episode in its pool: a sample never reads its episode's rows twice."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lerobot_dali import DALILeRobotIterator
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.dataset_reader import LeRobotDatasetReader
from lerobot_dali.generate import expected_state


def test_a_pool_larger_than_the_rows_cache_reads_each_episode_once(make_ds, monkeypatch) -> None:
    """A pool of 300 episodes over a rows cache of 256: a worker read episodes again as the cache dropped pooled
    ones (435 reads for 300 episodes in one epoch of 4-frame episodes; with long episodes about every other sample
    of a 512-episode pool re-read its episode, a whole row-group decode each under the column store's floor)."""
    root = make_ds(episodes=300, frames_per_episode=4, cameras=0, episodes_per_file=300)
    it = DALILeRobotIterator(root, batch_size=16, device="cpu", num_workers=0, shuffle=True, episode_pool_size=300)
    next(iter(it))
    spec = it._spec
    it.close()
    assert spec.rows_cache_episodes == 256
    read: list[int] = []
    plain = LeRobotDatasetReader.read_episode

    def counted(self, episode_pos, *args, **kwargs):
        read.append(episode_pos)
        return plain(self, episode_pos, *args, **kwargs)

    monkeypatch.setattr(LeRobotDatasetReader, "read_episode", counted)
    source = BatchSource(spec)
    names = [field.name for field in source.fields]
    states, episodes, frames = [], [], []
    for i in range(1200 // 16):  # the whole epoch
        out = dict(zip(names, source(SimpleNamespace(epoch_idx=0, iteration=i)), strict=True))
        states.append(out["observation.state"])
        episodes.append(out["episode_index"])
        frames.append(out["frame_index"])
    assert sorted(read) == list(range(300))
    episode, frame = np.concatenate(episodes), np.concatenate(frames)
    assert len(episode) == 1200 and len(set(zip(episode.tolist(), frame.tolist(), strict=True))) == 1200
    np.testing.assert_allclose(np.concatenate(states), expected_state(episode, frame), rtol=1e-6)
