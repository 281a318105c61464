"""lerobot_dali: a GPU-first input pipeline for LeRobot datasets, built on NVIDIA DALI.

Data flows top to bottom through one module per stage: dataset metadata (``dataset_reader``) -> episode
sampling (``sample_order``) -> windows (``windows``) -> video requests and clips (``frame_lookup``,
``clips``) -> the DALI graph -> the iterator.
"""

from typing import TYPE_CHECKING

from .augment_config import AugmentConfig
from .dataset_reader import LeRobotDatasetReader, VideoRef, open_dataset
from .dataset_union import concat_datasets
from .errors import (
    CameraSelectionError,
    CodecUnsupportedError,
    CudaUnavailableError,
    DataFileError,
    DatasetError,
    DatasetNotFoundError,
    DeltaTimestampsError,
    EpisodeMetadataError,
    FrameRequestError,
    FrameTimestampError,
    InvalidPathTemplateError,
    IteratorClosedError,
    IteratorForkedError,
    MissingDataFileError,
    RenamedCameraError,
    RenameMapError,
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
from .stream_state import merge_rank_states

__version__ = "0.1.0"

if TYPE_CHECKING:  # type checkers see the class; at run time it is imported on first use (below)
    from .iterator import DALILeRobotIterator
    from .mixture import DALILeRobotMixture


def __getattr__(name: str) -> object:
    """DALI and torch load only when an iterator is used, so the reader, configs and the CLI start fast."""
    if name == "DALILeRobotIterator":
        from .iterator import DALILeRobotIterator

        return DALILeRobotIterator
    if name == "DALILeRobotMixture":
        from .mixture import DALILeRobotMixture

        return DALILeRobotMixture
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AugmentConfig",
    "CameraSelectionError",
    "CodecUnsupportedError",
    "CudaUnavailableError",
    "DALILeRobotIterator",
    "DALILeRobotMixture",
    "DataFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeMetadataError",
    "FrameRequestError",
    "FrameTimestampError",
    "InvalidPathTemplateError",
    "IteratorClosedError",
    "IteratorForkedError",
    "LeRobotDatasetReader",
    "MissingDataFileError",
    "RankBalance",
    "RenameMapError",
    "RenamedCameraError",
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
    "concat_datasets",
    "merge_rank_states",
    "open_dataset",
]
