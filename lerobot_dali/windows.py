"""Delta windows with LeRobot's semantics, value for value.

``delta_timestamps={key: [seconds, ...]}`` asks, for a sample at frame ``i`` of an episode of ``n`` frames,
for the rows ``i + delta_index`` of ``key``. As ``LeRobotDataset`` (v3.0: ``check_delta_timestamps``,
``get_delta_indices``, ``_get_query_indices``, ``_get_query_timestamps``, ``_query_videos``) does it:

* every delta ``d`` must satisfy ``abs(d * fps - round(d * fps)) / fps <= tolerance_s``, else
  :class:`~lerobot_dali.errors.DeltaTimestampsError`;
* ``delta_index = round(d * fps)`` (Python's round: halves go to the even integer);
* the query row is clamped to ``[0, n - 1]``; ``<key>_is_pad`` is true where it was clamped, so padded
  positions repeat the edge row's value.

Shapes, and what is squeezed (LeRobot's ``frames.squeeze(0)`` on decoded video, nothing else):

* tabular keys: ``(T, *feature_shape)`` rows, **never squeezed**; a single delta gives ``(1, ...)``;
* ``<key>_is_pad``: ``(T,)`` bool for every key in ``delta_timestamps``, cameras included;
* camera (video) keys: the window is the list of query timestamps, the episode-local ``timestamp`` of each
  clamped row; the video layer decodes ``(T, C, H, W)`` and squeezes the first axis when ``T == 1``
  (:meth:`DeltaWindows.squeeze_camera`). A camera without deltas is queried at the sample's own
  ``timestamp`` and is squeezed too. Cameras stored as images in the parquet are tabular for LeRobot
  (not squeezed); list only video-backed cameras in ``camera_keys``.

Indices here are episode-local (frame within episode); LeRobot clamps absolute indices to
``[dataset_from_index, dataset_to_index)``, which is the same thing shifted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .errors import DeltaTimestampsError, did_you_mean
from .frame_lookup import DEFAULT_TOLERANCE_S
from .value_checks import check_seconds

__all__ = ["PAD_SUFFIX", "DeltaWindows", "query_indices"]

#: A windowed key's mask of padded steps is batched as ``<key>_is_pad``, as LeRobot names it.
PAD_SUFFIX = "_is_pad"


def query_indices(
    frame_index: np.ndarray | int, episode_length: np.ndarray | int, delta_index: np.ndarray | Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Clamped rows and pad flags, ``(N, T)`` each (``(T,)`` for a scalar ``frame_index``).

    ``frame_index`` and ``episode_length`` broadcast against each other, so one call serves a batch of
    samples from different episodes; rows are episode-local.
    """
    frame = np.asarray(frame_index, dtype=np.int64)
    length = np.asarray(episode_length, dtype=np.int64)
    delta = np.asarray(delta_index, dtype=np.int64)
    if delta.ndim != 1:
        raise ValueError(f"delta_index must be 1-D, got shape {delta.shape}")
    if np.any(length < 1):
        raise ValueError("episode_length must be >= 1 (an empty episode has no frame to window)")
    if np.any((frame < 0) | (frame >= length)):
        raise IndexError(f"frame_index must lie in [0, episode_length); got {frame} for lengths {length}")
    query = frame[..., None] + delta
    end = length[..., None]
    is_pad = (query < 0) | (query >= end)
    rows = np.clip(query, 0, end - 1)
    return rows, is_pad


@dataclass(frozen=True, kw_only=True)
class DeltaWindows:
    """Validated ``delta_timestamps`` and their ``delta_index`` (:func:`query_indices` turns them into rows)."""

    delta_timestamps: Mapping[str, Sequence[float]]
    fps: float
    tolerance_s: float = DEFAULT_TOLERANCE_S
    #: Video-backed camera keys (:meth:`squeeze_camera` answers for these).
    camera_keys: Iterable[str] = ()
    #: If given, every key of ``delta_timestamps`` must be one of these (the dataset's features).
    feature_keys: Iterable[str] | None = None
    delta_index: Mapping[str, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.fps, bool) or not isinstance(self.fps, int | float) or not self.fps > 0:
            raise ValueError(f"fps must be a positive number, got {self.fps!r}")
        check_seconds("tolerance_s", self.tolerance_s)
        if not isinstance(self.delta_timestamps, Mapping):
            raise TypeError(f"delta_timestamps must map keys to lists of seconds, got {type(self.delta_timestamps)}")
        cameras = frozenset(self.camera_keys)
        object.__setattr__(self, "camera_keys", cameras)
        known = None if self.feature_keys is None else frozenset(self.feature_keys)
        object.__setattr__(self, "feature_keys", known)
        deltas: dict[str, tuple[float, ...]] = {}
        indices: dict[str, np.ndarray] = {}
        for key, values in self.delta_timestamps.items():
            if known is not None and key not in known:
                raise DeltaTimestampsError(
                    f"delta_timestamps names {key!r}, which is not a feature of the dataset (features: {sorted(known)})"
                    f"{did_you_mean([key], sorted(known))}: name one of those, or drop {key!r} from delta_timestamps"
                )
            deltas[key], indices[key] = self._validate(key, values)
        object.__setattr__(self, "delta_timestamps", MappingProxyType(deltas))
        object.__setattr__(self, "delta_index", MappingProxyType(indices))

    def _validate(self, key: str, values: Sequence[float]) -> tuple[tuple[float, ...], np.ndarray]:
        if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray) or len(values) == 0:
            raise DeltaTimestampsError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, got {values!r}")
        seconds = []
        for d in values:
            if isinstance(d, bool) or not isinstance(d, int | float | np.integer | np.floating) or not math.isfinite(d):
                raise DeltaTimestampsError(f"delta_timestamps[{key!r}] holds {d!r}, not a finite number of seconds")
            d = float(d)
            # The same expression as LeRobot's check_delta_timestamps, so the boundary cases agree.
            if abs(d * self.fps - round(d * self.fps)) / self.fps > self.tolerance_s:
                fps = f"{self.fps:g}"
                raise DeltaTimestampsError(
                    f"delta_timestamps[{key!r}] holds {d} s, which is not a multiple of 1/fps (fps={self.fps}) within "
                    f"tolerance_s={self.tolerance_s}: windows count the dataset's frames, so give each offset as k / "
                    f"{fps} s (e.g. [k / {fps} for k in range(16)]); the frames either side of it are "
                    f"{math.floor(d * self.fps) / self.fps:.6g} s and {math.ceil(d * self.fps) / self.fps:.6g} s"
                )
            seconds.append(d)
        return tuple(seconds), np.array([round(d * self.fps) for d in seconds], dtype=np.int64)

    def window_length(self, key: str) -> int:
        """``T`` of ``key``'s window (``1`` for a camera without deltas)."""
        return len(self.delta_index[key]) if key in self.delta_index else 1

    def unread_tail(self, key: str, drop_n_last_frames: int) -> int:
        """The rows at an episode's end whose ``key`` values no sample reads: no anchor lies among its last
        ``drop_n_last_frames`` rows, and ``key``'s window reaches its furthest offset past its anchor (a row past the
        episode's end is padding, not read). Diffusion Policy's cameras (offsets -1 and 0, 7 rows dropped) read none
        of the last 7 frames."""
        reach = int(self.delta_index[key].max()) if key in self.delta_index else 0
        return max(0, int(drop_n_last_frames) - reach)

    def squeeze_camera(self, key: str) -> bool:
        """Whether the decoded ``(T, C, H, W)`` of camera ``key`` loses its first axis, as in LeRobot."""
        if key not in self.camera_keys:
            cameras = sorted(self.camera_keys)
            near = did_you_mean([key], cameras)
            raise KeyError(f"{key!r} is not a camera key (camera keys: {cameras}){near}: pass one of those")
        return self.window_length(key) == 1
