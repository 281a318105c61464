"""lerobot_dali: a GPU-first input pipeline for LeRobot datasets, built on NVIDIA DALI.

Data flows top to bottom through one module per stage: dataset metadata (``dataset_reader``) -> episode
sampling (``sample_order``) -> windows (``windows``) -> video requests and clips (``frame_lookup``,
``clips``) -> the DALI graph -> the iterator.
"""

from .dataset_reader import LeRobotDatasetReader, VideoRef, open_dataset
from .errors import (
    CodecUnsupportedError,
    DatasetError,
    DatasetNotFoundError,
    DeltaTimestampsError,
    EpisodeMetadataError,
    FrameTimestampError,
    InvalidPathTemplateError,
    MissingDataFileError,
    SchemaMismatchError,
    UnsupportedVersionError,
    VideoDecodeError,
)

__version__ = "0.1.0"

__all__ = [
    "CodecUnsupportedError",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeMetadataError",
    "FrameTimestampError",
    "InvalidPathTemplateError",
    "LeRobotDatasetReader",
    "MissingDataFileError",
    "SchemaMismatchError",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "VideoRef",
    "__version__",
    "open_dataset",
]
