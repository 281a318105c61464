"""The keyword options a :class:`~lerobot_dali.mixture.DALILeRobotMixture` passes on to each dataset's iterator, as a
type checker checks them (``DALILeRobotMixture(paths, decode="cpu")``): the iterator's own, less those the mixture
sets itself or that open a dataset. Each means what :class:`~lerobot_dali.iterator.DALILeRobotIterator` says; the
mixture checks the names at run time too."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict

from .augment_config import AugmentConfig
from .cpu_decode_options import CpuDecodeOptions
from .decode_preference import DecodePreference, DecodePreferenceName
from .depth_maps import DepthUnit, DepthUnitName
from .frame_lookup import TimestampSource, TimestampSourceName
from .sample_order import RankBalance

__all__ = ["MixtureOptions"]

if TYPE_CHECKING:
    import torch
else:

    class _Torch:
        """``torch`` to ``typing.get_type_hints``, which imports it on reading ``device: str | torch.device``:
        importing the options loads no torch."""

        def __getattr__(self, name: str) -> object:
            return getattr(importlib.import_module("torch"), name)

    torch = _Torch()


class MixtureOptions(TypedDict, total=False):
    """:class:`~lerobot_dali.iterator.DALILeRobotIterator`'s keyword options that a mixture passes on to every
    dataset's iterator, each typed as the iterator's (a test holds them to its signature), but ``rank_balance``: a
    mixture refuses ``"none"`` (every batch holds a share of each dataset), which the iterator takes."""

    delta_timestamps: Mapping[str, Sequence[float]] | None
    shuffle: bool
    episode_pool_size: int
    device: str | torch.device
    decode: DecodePreference | DecodePreferenceName
    image_size: tuple[int, int] | None
    augment: AugmentConfig | None
    return_uint8: bool
    rank: int | None
    world_size: int | None
    tolerance_s: float
    prefetch: int
    timestamp_source: TimestampSource | TimestampSourceName
    rank_balance: Literal[RankBalance.PAD, RankBalance.DROP, "pad", "drop"]
    cache_dir: str | os.PathLike[str] | None
    cache_gb: float
    cpu_decode: CpuDecodeOptions | None
    dali_threads: int | None
    depth_unit: DepthUnit | DepthUnitName
    episode_piece_frames: int | None
    drop_n_first_frames: int
    drop_n_last_frames: int
    share_clips: bool
