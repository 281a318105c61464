"""Episodes cut into pieces of consecutive frames, the units the sample order deals to ranks.

Ranks read disjoint units. Whole episodes keep each rank's reads within fewest files, but need an episode per rank
and balance ranks poorly when each has few (one rank's extra episode is padding on all the others). Pieces of at
most ``piece_frames`` frames fix both, for a dataset of few long episodes on many ranks. A piece is only a unit of
the order: windows, padding and masks still follow the episode the piece belongs to.

A unit may also leave out an episode's first and last frames (``drop_first``, ``drop_last``: LeRobot's
``EpisodeAwareSampler``, which policies predicting a long action horizon train with, so that few samples are
mostly padding): those frames are never sampled, but windows of the frames kept still read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .pickled_columns import PickledColumn, narrowed, widened

__all__ = ["EpisodePieces"]


@dataclass(frozen=True)
class EpisodePieces:
    """Each piece's episode position, first frame in that episode, and frame count, in episode order."""

    episode: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    _whole: bool = field(init=False, repr=False, compare=False)

    @classmethod
    def cut(
        cls, episode_lengths: np.ndarray, piece_frames: int | None, *, drop_first: int = 0, drop_last: int = 0
    ) -> EpisodePieces:
        """Every episode's frames but its first ``drop_first`` and last ``drop_last`` (an episode no longer than
        both keeps none), in ``ceil(frames / piece_frames)`` pieces of near-equal length (None: one piece).

        Equal pieces, not ``piece_frames`` then a remainder: a 101-frame episode at 100 is 50 + 51, not 100 + 1,
        which would leave a one-frame unit to balance with.
        """
        lengths = np.asarray(episode_lengths, dtype=np.int64)
        kept = np.maximum(lengths - drop_first - drop_last, 0)
        start = np.where(kept > 0, drop_first, 0)
        if piece_frames is None:
            return cls(np.arange(lengths.size, dtype=np.int64), start, kept)
        counts = np.maximum(1, -(-kept // piece_frames))  # (an empty episode stays one empty unit)
        episode = np.repeat(np.arange(lengths.size, dtype=np.int64), counts)
        first = np.cumsum(counts) - counts
        part = np.arange(episode.size, dtype=np.int64) - first[episode]  # which piece of its episode
        offset = part * kept[episode] // counts[episode]
        end = (part + 1) * kept[episode] // counts[episode]
        return cls(episode, start[episode] + offset, end - offset)

    @property
    def whole(self) -> bool:
        """Whether every piece is a whole episode (the positions then need no mapping)."""
        return self._whole

    def __post_init__(self) -> None:
        one_each = self.episode.size == 0 or bool(self.episode[-1] == self.episode.size - 1)
        object.__setattr__(self, "_whole", one_each and not self.offset.any())

    def __getstate__(self) -> dict[str, PickledColumn]:
        """Pickled for every DALI worker, as :mod:`.pickled_columns` does, whole episodes (one piece each, from their
        first frame: the usual case) as their lengths alone (92,000 episodes: 2.2 -> 0.2 MB). Unpickles as it was."""
        names = ["length"]
        if not self._whole or not np.array_equal(self.episode, np.arange(self.episode.size)):
            names += ["episode", "offset"]
        state = {name: narrowed(getattr(self, name)) for name in names}
        if self._whole and "offset" not in state:  # (the dtypes the positions and the zero offsets come back in)
            state["episode"] = (self.episode.dtype.str, np.empty(0, self.episode.dtype))
            state["offset"] = (self.offset.dtype.str, np.empty(0, self.offset.dtype))
        return state

    def __setstate__(self, state: dict[str, PickledColumn]) -> None:
        done: dict[int, np.ndarray] = {}
        length = widened(state["length"], done)
        episode, offset = (widened(state[name], done) for name in ("episode", "offset"))
        if episode.size != length.size:  # (whole episodes: their positions, each from its first frame)
            episode = np.arange(length.size, dtype=episode.dtype)
            offset = np.zeros(length.size, dtype=offset.dtype)
        for name, value in (("episode", episode), ("offset", offset), ("length", length)):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def frames(self, pieces: np.ndarray, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(episode_pos, frame_in_episode)`` of ``frames`` counted within ``pieces``."""
        if self.whole:
            return pieces, frames
        return self.episode[pieces], self.offset[pieces] + frames

    def episodes(self, pieces: np.ndarray) -> np.ndarray:
        """The episodes ``pieces`` belong to, each once, in the order of their first piece."""
        episodes = np.asarray(pieces, dtype=np.int64) if self.whole else self.episode[pieces]
        _, first = np.unique(episodes, return_index=True)
        return episodes[np.sort(first)]
