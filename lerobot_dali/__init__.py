"""lerobot_dali: a GPU-first input pipeline for LeRobot datasets, built on NVIDIA DALI.

Data flows top to bottom through one module per stage: dataset metadata (``dataset_reader``) -> episode
sampling (``sample_order``) -> windows (``windows``) -> video requests and clips (``frame_lookup``,
``clips``) -> the DALI graph -> the iterator.
"""

from .dataset_reader import LeRobotDatasetReader, VideoRef, open_dataset
from .errors import (
    CodecUnsupportedError,
    DataFileError,
    DatasetError,
    DatasetNotFoundError,
    DeltaTimestampsError,
    EpisodeMetadataError,
    FrameTimestampError,
    InvalidPathTemplateError,
    MissingDataFileError,
    ResumeStateError,
    SchemaMismatchError,
    ShardingError,
    StatsError,
    UnsupportedVersionError,
    VideoDecodeError,
    WorkerProcessError,
)
from .frame_lookup import TimestampSource
from .sample_order import RankBalance

__version__ = "0.1.0"

# DALI and torch load only when the iterator is used, so the reader and the CLI start fast.
_LAZY = {"DALILeRobotIterator": "iterator", "AugmentConfig": "augment"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AugmentConfig",
    "CodecUnsupportedError",
    "DALILeRobotIterator",
    "DataFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeMetadataError",
    "FrameTimestampError",
    "InvalidPathTemplateError",
    "LeRobotDatasetReader",
    "MissingDataFileError",
    "RankBalance",
    "ResumeStateError",
    "SchemaMismatchError",
    "ShardingError",
    "StatsError",
    "TimestampSource",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "VideoRef",
    "WorkerProcessError",
    "__version__",
    "open_dataset",
]
