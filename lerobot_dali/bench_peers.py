"""The loaders ``lerobot-dali bench`` compares against: a plain PyAV ``DataLoader`` and LeRobot's own.

:class:`PyAVFrameDataset` is what a careful user writes without a special pipeline: a map-style dataset
whose ``__getitem__`` reads the sample's rows from an in-memory pyarrow table and decodes each camera's
frames with PyAV (seek to the keyframe before the frame, decode forward), then resizes on the CPU. It is
always available, so every benchmark run has at least one peer.

LeRobot's ``LeRobotDataset`` and ``StreamingLeRobotDataset`` are built only when ``import lerobot`` works;
:func:`lerobot_unavailable` says why not otherwise, and the benchmark reports the peer as skipped.
Peers do not augment: ``--augment`` is applied by lerobot-dali only (the report notes it).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from .dataset_info import INDEX_COLUMNS
from .dataset_reader import open_dataset
from .dataset_union import DATASET_INDEX
from .depth_maps import DepthUnit, in_unit
from .episode_rows import image_bytes, read_parquet
from .errors import FrameTimestampError
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from .image_frames import decode_depth_images, decode_images
from .value_checks import check_choice, is_int
from .windows import PAD_SUFFIX, DeltaWindows, query_indices

__all__ = [
    "PyAVFrameDataset",
    "Resize",
    "decode_frames_pyav",
    "lerobot_dataset",
    "lerobot_streaming_dataset",
    "lerobot_unavailable",
    "streaming_buffer_size",
]

logger = logging.getLogger(__name__)

# Within this distance of the frame decoded last, a wanted frame is reached by decoding forward; further
# away (a window of frames 1 s apart) a seek to its keyframe is cheaper.
_DECODE_FORWARD_S = 0.5


def decode_frames_pyav(
    source: Any, timestamps_s: Sequence[float], *, tolerance_s: float, pixel_format: str = "rgb24"
) -> np.ndarray:
    """RGB frames ``(T, H, W, 3)`` uint8 nearest each of ``timestamps_s`` (seconds in the file), in request order
    (or ``(T, H, W)`` in another ``pixel_format``: ``gray12le`` for a depth camera's codes, as LeRobot's).

    One container per call, one decoder thread, a seek to the keyframe before each wanted time unless it
    is a short decode forward from the previous one. Raises FrameTimestampError when a time has no frame
    within ``tolerance_s``.
    """
    wanted = sorted(set(float(t) for t in timestamps_s))
    best: dict[float, tuple[float, np.ndarray]] = {}
    with av.open(source, "r") as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        time_base = Fraction(stream.time_base) if stream.time_base is not None else Fraction(1, 1)
        position_s: float | None = None
        frames: Any = None
        for target in wanted:
            if target in best and abs(best[target][0] - target) <= tolerance_s:
                continue
            if frames is None or position_s is None or not (target - _DECODE_FORWARD_S <= position_s <= target):
                if frames is not None:
                    frames.close()  # (PyAV's generators leak their packet when dropped unfinished)
                container.seek(int(max(target - tolerance_s, 0) / time_base), stream=stream, backward=True)
                stream.codec_context.flush_buffers()
                frames = container.decode(stream)
            for frame in frames:
                if frame.pts is None:
                    continue
                position_s = float(frame.pts * time_base)
                for t in wanted:
                    if abs(position_s - t) <= tolerance_s and (
                        t not in best or abs(best[t][0] - t) > abs(position_s - t)
                    ):
                        best[t] = (position_s, frame.to_ndarray(format=pixel_format))
                if position_s > target + tolerance_s:
                    break
        if frames is not None:
            frames.close()
    missing = [t for t in wanted if t not in best]
    if missing:
        raise FrameTimestampError(
            f"{getattr(source, 'path', source)}: no frame within tolerance_s={tolerance_s} of {missing[0]:.6f} s "
            f"({len(missing)} of {len(wanted)} requested times)."
        )
    return np.stack([best[float(t)][1] for t in timestamps_s])


class Resize:
    """``(…, C, H, W)`` float frames resized to ``size`` (bilinear, antialiased); picklable for workers."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = (int(size[0]), int(size[1]))

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        if tuple(frames.shape[-2:]) == self.size:
            return frames
        flat = frames.reshape(-1, *frames.shape[-3:])
        out = torch.nn.functional.interpolate(
            flat, size=self.size, mode="bilinear", antialias=True, align_corners=False
        )
        return out.reshape(*frames.shape[:-2], *self.size)


class PyAVFrameDataset(Dataset):
    """Map-style LeRobot samples: rows by pyarrow, frames by PyAV, one sample per ``__getitem__``.

    Items follow ``LeRobotDataset``: tabular windows ``(T, ...)`` with ``<key>_is_pad``, cameras float32 in
    [0, 1] ``(C, H, W)`` or ``(T, C, H, W)`` for a window, the index columns and ``task``. ``dataset_index``: this
    dataset's place among several read as one, which items then carry as ``dataset_index`` (as
    ``MultiLeRobotDataset``'s and ``concat_datasets``' do).
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_size: tuple[int, int] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cameras: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        timestamp_source: str = TimestampSource.PARQUET_TIMESTAMP.value,
        dataset_index: int | None = None,
    ) -> None:
        reader = open_dataset(dataset, cameras=cameras, keys=keys)
        self._dataset_index = dataset_index
        source = check_choice(TimestampSource, "timestamp_source", timestamp_source)  # (any case, as the iterator)
        self._by_frame_index = source is TimestampSource.FRAME_INDEX
        self.camera_keys = list(reader.camera_keys)
        self.fps = reader.fps
        self._tolerance_s = tolerance_s
        self._resize = Resize(image_size) if image_size is not None else None
        self._depth_size = tuple(image_size) if image_size is not None else None
        # Depth cameras read as LeRobot reads them: 12-bit codes dequantised, depth images in millimetres.
        self._quantizers = reader.info.depth_quantizers(reader.camera_keys)
        self._depth_image_units = reader.info.depth_image_units(reader.image_keys)
        windows = DeltaWindows(
            delta_timestamps=dict(delta_timestamps or {}),
            fps=reader.fps,
            tolerance_s=tolerance_s,
            camera_keys=self.camera_keys,
            feature_keys=list(reader.info.features),
        )
        # A plain dict: the dataset is pickled into DataLoader workers, and DeltaWindows holds mappingproxies.
        self._delta_index = {key: np.asarray(value) for key, value in windows.delta_index.items()}
        numeric = [k for k in reader.tabular_keys if not reader.info.features[k].is_host_value]
        self._columns = list(dict.fromkeys([*numeric, *(k for k in INDEX_COLUMNS if k in reader.info.features)]))
        self._table = self._read_rows(reader, self._columns)
        # Cameras stored as images: their encoded rows held in memory, as LeRobot's arrow table holds them.
        self.image_keys = list(reader.image_keys)
        self._images = self._read_rows(reader, self.image_keys)
        self._timestamps = np.asarray(self._table.column("timestamp"), dtype=np.float64)
        episodes = reader.episodes
        self._lengths = np.asarray(episodes.length, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self._tasks = reader.tasks
        self._local = reader.location.is_local
        self._fs = reader.location.fs
        self._videos = {
            camera: [reader.video(pos, camera) for pos in range(len(episodes))] for camera in self.camera_keys
        }

    def _depth(self, depth: np.ndarray) -> torch.Tensor:
        """``(T, 1, H, W)`` depth, resized as lerobot-dali resizes depth (nearest) when an image size is set."""
        frames = torch.from_numpy(np.ascontiguousarray(depth))
        if self._depth_size is None:
            return frames
        return torch.nn.functional.interpolate(frames, size=self._depth_size, mode="nearest-exact")  # pixel centres

    def _read_rows(self, reader: Any, columns: list[str]) -> pa.Table:
        """Every episode's rows of ``columns``, in episode order, read once per data file."""
        tables: dict[str, pa.Table] = {}
        parts = []
        for pos in range(reader.num_episodes):
            path = reader.data_path(pos)
            if path not in tables:
                with reader.open(path) as f:
                    tables[path] = read_parquet(f, columns)
            start, length = int(reader.episodes.data_row_start[pos]), int(reader.episodes.length[pos])
            parts.append(tables[path].slice(start, length))
        return pa.concat_tables(parts).combine_chunks()

    def __len__(self) -> int:
        return self._table.num_rows

    def _rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        taken = self._table.take(pa.array(rows.reshape(-1)))
        out = {}
        for key in self._columns:
            column = taken.column(key)
            if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
                values = np.asarray(column.combine_chunks().flatten()).reshape(len(rows.reshape(-1)), -1)
            else:
                values = np.asarray(column)
            out[key] = values.reshape((*rows.shape, *values.shape[1:]))
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        episode = int(np.searchsorted(self._starts, index, side="right") - 1)
        start, length = int(self._starts[episode]), int(self._lengths[episode])
        frame = index - start
        own = self._rows(np.array(index))
        item: dict[str, Any] = {key: torch.tensor(own[key]) for key in self._columns}
        for key, delta in self._delta_index.items():
            rows, is_pad = query_indices(frame, length, delta)
            item[f"{key}{PAD_SUFFIX}"] = torch.as_tensor(is_pad)
            if key not in self.camera_keys and key not in self.image_keys:
                item[key] = torch.tensor(self._rows(start + rows)[key])
        for camera in self.camera_keys:
            window = self._delta_index.get(camera)
            rows = query_indices(frame, length, window)[0] if window is not None else np.array([frame])
            video = self._videos[camera][episode]
            local_s = rows / self.fps if self._by_frame_index else self._timestamps[start + rows]
            query = (video.from_timestamp_s + local_s).tolist()
            quantizer = self._quantizers.get(camera)
            fmt = "rgb24" if quantizer is None else "gray12le"
            if self._local:
                decoded = decode_frames_pyav(video.path, query, tolerance_s=self._tolerance_s, pixel_format=fmt)
            else:
                with self._fs.open(video.path, "rb") as handle:
                    decoded = decode_frames_pyav(handle, query, tolerance_s=self._tolerance_s, pixel_format=fmt)
            if quantizer is not None:
                frames = self._depth(quantizer.dequantize(decoded, DepthUnit.MM)[:, None])
            else:
                frames = torch.from_numpy(decoded).permute(0, 3, 1, 2).float().div_(255)
                frames = self._resize(frames) if self._resize is not None else frames
            item[camera] = frames[0] if window is None or len(window) == 1 else frames
        for camera in self.image_keys:
            window = self._delta_index.get(camera)
            rows = query_indices(frame, length, window)[0] if window is not None else np.array([frame])
            column = self._images.column(camera).take(pa.array(start + rows)).combine_chunks()
            encoded = image_bytes(column, path=f"dataset rows {(start + rows).tolist()}", key=camera)
            label = f"{camera} row {index}"
            if camera in self._depth_image_units:
                depth = decode_depth_images([b.as_py() for b in encoded], label=label)
                frames = self._depth(
                    in_unit(depth, self._depth_image_units[camera], DepthUnit.MM).transpose(0, 3, 1, 2)
                )
            else:
                frames = torch.from_numpy(decode_images([b.as_py() for b in encoded], label=label))
                frames = frames.permute(0, 3, 1, 2).float().div_(255)
                frames = self._resize(frames) if self._resize is not None else frames
            item[camera] = frames if window is not None else frames[0]  # image rows are tabular in LeRobot
        item["task"] = self._tasks.get(int(own["task_index"]), "") if "task_index" in own else ""
        if self._dataset_index is not None:
            item[DATASET_INDEX] = torch.tensor(self._dataset_index)
        return item


# -- LeRobot, when it imports ---------------------------------------------------------------------------------
def lerobot_unavailable() -> str | None:
    """None when LeRobot's datasets import here, else a one-line reason for the report."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset  # noqa: F401
    except Exception as e:  # ImportError, or a broken install (torchvision/torchcodec that does not load)
        return (
            f"lerobot is not importable here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "install lerobot (it pins its own torch: a separate virtual environment) to compare against it"
        )
    return None


def _repo_and_root(dataset: str | os.PathLike[str]) -> tuple[str, Path | None]:
    path = Path(dataset)
    if path.is_dir():
        _offline()
        return f"local/{path.resolve().name}", path
    return os.fspath(dataset), None


def _offline() -> None:
    """Local datasets: LeRobot needs a repo id only as a name; never reach the Hub for it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _windows_and_resize(
    delta_timestamps: Mapping[str, Sequence[float]] | None, image_size: tuple[int, int] | None
) -> dict[str, Any]:
    """The arguments of LeRobot's datasets that give the windows and image size the other loaders read."""
    return {
        "delta_timestamps": {k: list(v) for k, v in (delta_timestamps or {}).items()} or None,
        "image_transforms": Resize(image_size) if image_size is not None else None,
    }


def lerobot_dataset(
    dataset: str | os.PathLike[str],
    *,
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    image_size: tuple[int, int] | None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> Any:
    """``LeRobotDataset`` over a local folder (or Hub repo id), with its default video backend."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    repo_id, root = _repo_and_root(dataset)
    return LeRobotDataset(
        repo_id,
        root=root,
        **_windows_and_resize(delta_timestamps, image_size),
        tolerance_s=tolerance_s,
    )


def lerobot_multi_dataset(
    datasets: Sequence[str],
    *,
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    image_size: tuple[int, int] | None,
    tolerances_s: Sequence[float] | None = None,
) -> tuple[Any, Callable[[], None]]:
    """LeRobot's ``MultiLeRobotDataset`` over local folders (or Hub repo ids), with each one's ``tolerances_s``
    (None: LeRobot's default), and what removes the folder of links it reads local ones through (it finds each
    dataset at ``root / repo_id``)."""
    try:
        from lerobot.datasets.multi_dataset import MultiLeRobotDataset  # (LeRobot >= 0.5)
    except ImportError:
        from lerobot.datasets.lerobot_dataset import MultiLeRobotDataset

    local = [Path(d) for d in datasets if Path(d).is_dir()]
    root: Path | None = None
    repo_ids = list(datasets)
    if local:
        if len(local) != len(datasets):
            raise ValueError("MultiLeRobotDataset reads datasets from one root: give local folders, or repo ids only")
        _offline()
        root = Path(tempfile.mkdtemp(prefix="lerobot-multi-"))
        repo_ids = [f"local/{i}-{path.resolve().name}" for i, path in enumerate(local)]
        (root / "local").mkdir()
        for repo_id, path in zip(repo_ids, local, strict=True):
            (root / repo_id).symlink_to(path.resolve())

    def remove_links() -> None:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    try:
        dataset = MultiLeRobotDataset(
            repo_ids,
            root=root,
            **_windows_and_resize(delta_timestamps, image_size),
            tolerances_s=dict(zip(repo_ids, tolerances_s or [DEFAULT_TOLERANCE_S] * len(repo_ids), strict=True)),
        )
    except BaseException:
        remove_links()
        raise
    return dataset, remove_links


def streaming_buffer_size() -> int | None:
    """Samples ``StreamingLeRobotDataset`` decodes into its shuffle buffer before yielding one (its default
    ``buffer_size``; None where this LeRobot has none)."""
    import inspect

    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    parameter = inspect.signature(StreamingLeRobotDataset).parameters.get("buffer_size")
    default = None if parameter is None else parameter.default
    return int(default) if is_int(default) else None


def streaming_looks_up_by_index() -> bool:
    """Whether this LeRobot's ``StreamingLeRobotDataset`` looks a row's frames up at its global ``index`` / fps in
    its episode's video file, as LeRobot 0.4 to 0.6.1 do (LeRobot issue #4524): right only where every episode's
    video starts at that time, so a bench row of it elsewhere measures other frames. Read from its source; where
    there is none to read, as every release up to 0.6.1."""
    import inspect
    import re

    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    try:
        source = inspect.getsource(StreamingLeRobotDataset.make_frame)
    except (AttributeError, OSError, TypeError):
        return True
    return re.search(r"""\[\s*["']index["']\s*\]\s*/\s*self\.fps""", source) is not None


def lerobot_streaming_dataset(
    dataset: str | os.PathLike[str],
    *,
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    image_size: tuple[int, int] | None,
    seed: int,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> Any:
    """``StreamingLeRobotDataset`` (an ``IterableDataset`` that shuffles through its own buffer). A tolerance
    other than the default is passed on; LeRobot versions whose streaming dataset lacks one fail that row."""
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    repo_id, root = _repo_and_root(dataset)
    return StreamingLeRobotDataset(
        repo_id,
        root=root,
        **_windows_and_resize(delta_timestamps, image_size),
        seed=seed,
        **({"tolerance_s": tolerance_s} if tolerance_s != DEFAULT_TOLERANCE_S else {}),
    )
