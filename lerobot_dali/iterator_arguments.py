"""The iterator's arguments checked, and its dataset opened, before anything else is built.

A typo in a size, device or decode route fails before a remote listing; an augmentation or a window the dataset
cannot serve fails naming what to change, when the iterator is built rather than when the first pass builds its
graph or a batch first reaches the row. Apart from the iterator, whose constructor then reads as what it builds.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Mapping
from typing import Any

from .augment_config import NORMALIZE_FROM_STATS, AugmentConfig, Normalize, refuse_uint8_normalize
from .dataset_info import INDEX_COLUMNS
from .dataset_reader import LeRobotDatasetReader, open_dataset
from .dataset_stats import NORMALIZE_WITHOUT_STATS
from .dataset_union import datasets_within
from .decode_route import DecodePreference
from .distributed import require_cuda
from .errors import CudaUnavailableError, DatasetError, DeltaTimestampsError, SchemaMismatchError
from .open_files import refuse_workers_past_open_files
from .said_once import say_once
from .value_checks import check_int
from .windows import DeltaWindows

__all__ = ["batchable_reader", "camera_augment", "check_windows", "checked_arguments"]

logger = logging.getLogger(__name__)


_INDEX_FEATURES = {  # as LeRobot declares them
    "timestamp": '{"dtype": "float32", "shape": [1], "names": null}',
    "task_index": '{"dtype": "int64", "shape": [1], "names": null}',
}


def checked_arguments(
    *, batch_size: int, device: str, decode: Any, num_workers: int, prefetch: int, dali_threads: int | None
) -> tuple[tuple[int, int, int, int | None], DecodePreference]:
    """Reject bad sizes, devices and decode routes before anything is opened (a typo should not cost a remote
    listing); the counts as ints (numpy integers from a config are taken) and the decode preference."""
    counts = (
        check_int("batch_size", batch_size, minimum=1), check_int("num_workers", num_workers, minimum=0),
        check_int("prefetch", prefetch, minimum=1),
        None if dali_threads is None else check_int("dali_threads (None: automatic)", dali_threads, minimum=1),
    )  # fmt: skip
    refuse_workers_past_open_files(counts[1])
    if not (device in ("cuda", "cpu") or re.fullmatch(r"cuda:\d+", device)):
        raise ValueError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r}")
    preference = DecodePreference.parse(decode)
    if device == "cpu":
        if preference is DecodePreference.GPU:
            raise ValueError(
                "decode='gpu' decodes on NVDEC, which needs device='cuda'; with device='cpu' pass decode='auto' or "
                "'cpu' (both decode on the CPU)"
            )
        return counts, preference
    visible = require_cuda(f"device={device!r}", instead="device='cpu'")
    if device != "cuda" and int(device.split(":")[1]) >= visible:
        raise CudaUnavailableError(
            f"device={device!r} but this process sees {visible} GPU(s) (CUDA_VISIBLE_DEVICES): pass a device from "
            f"'cuda:0' to 'cuda:{visible - 1}' (the GPUs CUDA_VISIBLE_DEVICES lists, renumbered from 0), or widen "
            "CUDA_VISIBLE_DEVICES"
        )
    return counts, preference


def batchable_reader(dataset: str | os.PathLike[str] | LeRobotDatasetReader, **opening: Any) -> LeRobotDatasetReader:
    """``dataset`` opened with ``opening`` (or the reader given), checked to declare what every batch carries."""
    if isinstance(dataset, LeRobotDatasetReader):
        given = [name for name, value in opening.items() if value is not None]
        if given:  # the reader is open already: these would be silently ignored
            named = " and ".join(", ".join(f"{n}=" for n in given).rsplit(", ", 1))
            one = len(given) == 1
            raise ValueError(
                f"{named} {'is an option' if one else 'are options'} for opening a dataset, but this reader is open "
                f"already and would ignore {'it' if one else 'them'}: pass {'it' if one else 'them'} to "
                "open_dataset, or pass the dataset's path here instead of a reader"
            )
        reader = dataset
    elif isinstance(dataset, list | tuple):
        raise TypeError(
            "dataset is one dataset; read several as one with concat_datasets([...]) (one layout, one pipeline) or "
            "side by side with DALILeRobotMixture([...]) (a share of each per batch)"
        )
    else:
        reader = open_dataset(dataset, **opening)
    for each in datasets_within(reader):  # (a union's features are its first dataset's: each is read from its own)
        missing = [k for k in _INDEX_FEATURES if k not in each.info.features]
        if missing:
            raise SchemaMismatchError(
                f"{each.location.description}: info.json declares no {missing} feature(s); every LeRobot "
                "dataset has them and batches carry them: where its data files hold those columns, add them to the "
                "features in meta/info.json ("
                + ", ".join(f'"{k}": {_INDEX_FEATURES[k]}' for k in missing)
                + "); otherwise re-download the dataset"
            )
    reader.check_data_columns()
    return reader


def camera_augment(
    augment: AugmentConfig | None,
    reader: LeRobotDatasetReader,
    image_channels: Mapping[str, int],
    depth_cameras: Collection[str],
    *,
    return_uint8: bool = False,
) -> AugmentConfig | None:
    """The augmentation with ``normalize="stats"`` read from the dataset, and a per-camera ``normalize`` checked
    against the dataset's cameras (and their channels, and ``return_uint8``) now, rather than when the first pass
    builds the graph. Depth cameras are never augmented (as in LeRobot), so they need no statistics and no
    ``Normalize``."""
    if augment is None:
        return None
    if not isinstance(augment, AugmentConfig):
        raise TypeError(
            f"augment must be an AugmentConfig or None, got {type(augment).__name__} {augment!r}; build one with "
            "AugmentConfig(...), AugmentConfig.from_dict(table) or AugmentConfig.from_toml(path)"
        )
    cameras = [camera for camera in reader.all_camera_keys if camera not in depth_cameras]
    if cameras:
        refuse_uint8_normalize(return_uint8, augment.normalize)
    if isinstance(augment.normalize, Mapping):
        depth = sorted(set(augment.normalize) & set(depth_cameras))
        if depth:
            raise ValueError(
                f"AugmentConfig.normalize has a Normalize for depth camera(s) {depth}, which are never augmented or "
                "normalised (LeRobot's image transforms leave depth out): they would come as depth, unnormalised. "
                "Drop them from normalize and normalise depth in the policy, as LeRobot does"
            )
    if augment.normalize == NORMALIZE_FROM_STATS:
        try:
            stats = reader.read_stats()
        except DatasetError as e:  # (said here: other readers of the statistics, a policy's, cannot do without them)
            # Added to its message, not rebuilt from it: a RemoteFileError keeps its status, and each its cause.
            e.args = (f"{e} (normalize='stats' reads them; without them, {NORMALIZE_WITHOUT_STATS})", *e.args[1:])
            raise
        augment = augment.with_stats(stats, cameras, source=reader.location.description, channels=image_channels)
        say_once(logger, logging.INFO, "normalising cameras %s by the dataset's statistics", list(cameras))
    for camera in cameras:
        normalize = augment.for_camera(camera).normalize  # raises naming a camera without a Normalize
        channels = image_channels.get(camera, 3)
        if isinstance(normalize, Normalize) and len(normalize.mean) not in (1, channels):
            raise ValueError(
                f"camera {camera!r} has {channels} channel(s) but its Normalize has {len(normalize.mean)} mean/std "
                "values; give it one per channel or one for all (normalize={camera: Normalize(...)})"
            )
    return augment


def check_windows(windows: DeltaWindows, reader: LeRobotDatasetReader) -> None:
    """Refuse the windows no batch can carry: of ``task_index`` or ``subtask_index`` (one string a sample), or of keys
    the iterator does not read."""
    if "task_index" in windows.delta_index:  # (LeRobot fails on it too, a batch later)
        raise DeltaTimestampsError(
            "delta_timestamps names 'task_index', which gives each sample its one `task` string; it takes no "
            "window: drop it from delta_timestamps"
        )
    if "subtask_index" in windows.delta_index and reader.subtasks is not None:  # (as task_index)
        raise DeltaTimestampsError(
            "delta_timestamps names 'subtask_index', which gives each sample its one `subtask` string; it takes "
            "no window: drop it from delta_timestamps"
        )
    read = {*reader.read_keys, *INDEX_COLUMNS}
    unread = sorted(set(windows.delta_index) - read)
    if unread:
        raise DeltaTimestampsError(
            f"delta_timestamps names {unread}, which this iterator does not read (left out by keys= or "
            "cameras=); select them too, or drop their windows"
        )
