"""lerobot_dali: a GPU-first input pipeline for LeRobot datasets, built on NVIDIA DALI.

Data flows top to bottom through one module per stage: dataset metadata (``dataset_reader``) -> episode
sampling (``sample_order``) -> windows (``windows``) -> video requests and clips (``frame_lookup``,
``clips``) -> the DALI graph -> the iterator.
"""

import importlib
from typing import TYPE_CHECKING

from .augment_config import (
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomAffine,
    RandomResizedCrop,
    RandomSubset,
    SharpnessJitter,
)
from .cpu_decode_options import (
    ColorConversion,
    ColorConversionName,
    CpuDecodeOptions,
    CpuDecoderBackend,
    CpuDecoderBackendName,
)
from .dataset_reader import LeRobotDatasetReader, VideoRef, open_dataset
from .dataset_union import DatasetUnion, concat_datasets
from .decode_preference import DecodePreference, DecodePreferenceName
from .depth_maps import DepthUnit, DepthUnitName
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
    RemoteFileError,
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
from .frame_lookup import TimestampSource, TimestampSourceName
from .mixture_options import MixtureOptions
from .sample_order import RankBalance, RankBalanceName
from .stream_state import merge_rank_states

__version__ = "0.1.0"

if TYPE_CHECKING:  # type checkers see the names; at run time each is imported on first use (below)
    from .iterator import DALILeRobotIterator
    from .mixture import DALILeRobotMixture
else:  # (hidden from type checkers, to which a module's __getattr__ makes every misspelt name an ``object``)
    #: The names whose modules load DALI or torch, by module: imported on first use. Every other exported name loads
    #: neither.
    _LAZY = {"DALILeRobotIterator": "iterator", "DALILeRobotMixture": "mixture"}

    def __getattr__(name: str) -> object:
        """DALI and torch load only when an iterator is used, so the reader, configs and the CLI start fast."""
        if name in _LAZY:
            return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        """The module's names with those :func:`__getattr__` imports on first use (completion, ``help``)."""
        return sorted({*globals(), *_LAZY})


__all__ = [
    "AugmentConfig",
    "CameraSelectionError",
    "CodecUnsupportedError",
    "ColorConversion",
    "ColorConversionName",
    "ColorJitter",
    "CpuDecodeOptions",
    "CpuDecoderBackend",
    "CpuDecoderBackendName",
    "CudaUnavailableError",
    "DALILeRobotIterator",
    "DALILeRobotMixture",
    "DataFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetUnion",
    "DecodePreference",
    "DecodePreferenceName",
    "DeltaTimestampsError",
    "DepthUnit",
    "DepthUnitName",
    "EpisodeMetadataError",
    "FrameRequestError",
    "FrameTimestampError",
    "GaussianBlur",
    "InvalidPathTemplateError",
    "IteratorClosedError",
    "IteratorForkedError",
    "LeRobotDatasetReader",
    "MissingDataFileError",
    "MixtureOptions",
    "Normalize",
    "RandomAffine",
    "RandomResizedCrop",
    "RandomSubset",
    "RankBalance",
    "RankBalanceName",
    "RemoteFileError",
    "RenameMapError",
    "RenamedCameraError",
    "ResumeStateError",
    "SchemaMismatchError",
    "ShardingError",
    "SharpnessJitter",
    "StatsError",
    "TimestampSource",
    "TimestampSourceName",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "VideoRef",
    "WorkerProcessError",
    "__version__",
    "concat_datasets",
    "merge_rank_states",
    "open_dataset",
]
