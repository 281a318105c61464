"""Synthetic LeRobot datasets encoded with real codecs, for tests and benchmarks.

Real datasets are few and fixed; tests need many small ones whose every value is predictable. Each video
frame carries a marker (see :mod:`lerobot_dali.frame_marker`) naming its episode, frame and camera, and
each data row holds values given by :func:`expected_state` / :func:`expected_action`, so a loader's output
can be checked exactly after a lossy encode.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_dali.concurrent_calls import in_threads
from lerobot_dali.frame_marker import (
    MAX_CAMERA_INDEX,
    MAX_EPISODE_INDEX,
    MAX_FRAME_INDEX,
    MIN_MARKER_SIZE,
    draw_marker,
)
from lerobot_dali.new_folder import refuse_inside_a_dataset, refuse_taken, write_new_folder
from lerobot_dali.thread_priority import kept_thread_priority
from lerobot_dali.video_encoding import CODECS, check_codec, encoder_settings
from lerobot_dali.video_encoding import check_bounded_int as _check_int
from lerobot_dali.wording import counted

__all__ = [
    "CODECS",
    "MAX_VECTOR_DIM",
    "DatasetSpec",
    "DatasetVersion",
    "camera_key",
    "encode_video",
    "expected_action",
    "expected_state",
    "expected_task_index",
    "make_dataset",
    "task_name",
    "text_list_table",
]

logger = logging.getLogger(__name__)


# libx265 hands FFmpeg a garbage DTS (which the mp4 muxer rejects) for the first clip of a process when the
# clip is shorter than its B-frame lookahead; such clips are encoded without B-frames.
_SHORT_CLIP_FRAMES = 4


#: FFmpeg's options are C ints: a larger ``gop`` or ``fps`` failed in avcodec_open2 (OverflowError, "Numerical result
#: out of range").
_MAX_C_INT = 2**31 - 1


@dataclass(frozen=True)
class _EncoderLimits:
    """The largest frames and frame rate a codec's encoder (or the mp4 muxer) takes, as tried with PyAV 18 (FFmpeg
    8, SVT-AV1 4.1): past them the encoder refused to open (EINVAL) once a dataset's first video was written."""

    height: int
    width: int
    pixels: int
    """height * width: the encoders also refuse a frame whose sides each pass but whose area does not."""
    fps: int


# Each measured at its edge: the largest value taken, the next even one refused (a height at width 16384 for the
# pixels; 16250x16250 taken and 16256x16256 refused by libx264, 11940x11940 and 11944x11944 by libx265). The sides
# of hevc and vp9 are the mp4 muxer's (65536 refused). libvpx's pixel count is no product alone (16384x16128 and
# 65534x3960 at most): the smaller is kept.
_ENCODER_LIMITS: dict[str, _EncoderLimits] = {
    "av1": _EncoderLimits(height=8704, width=16384, pixels=8704 * 16384, fps=240),
    "h264": _EncoderLimits(height=16384, width=16384, pixels=16128 * 16384, fps=_MAX_C_INT),
    "hevc": _EncoderLimits(height=65534, width=65534, pixels=8704 * 16384, fps=_MAX_C_INT),
    "vp9": _EncoderLimits(height=65534, width=65534, pixels=3960 * 65534, fps=10**9),
}


def _check_encode_args(codec: str, *, fps: int, gop: int, crf: int | None) -> int:
    check_codec(codec)
    _check_int("fps", fps, 1)
    crf = encoder_settings(codec, gop=gop, crf=crf).crf
    _check_int("gop (maximum keyframe interval in frames)", gop, 1, _MAX_C_INT)
    return crf


def _check_encoder_limits(codec: str, *, height: int, width: int, fps: int) -> None:
    """ValueError naming the value, the limit and one that works where ``codec``'s encoder would refuse frames of
    ``height`` x ``width`` at ``fps`` (:data:`_ENCODER_LIMITS`), before anything is encoded."""
    limits = _ENCODER_LIMITS[codec]
    encoder = encoder_settings(codec, gop=1).encoder
    if fps > limits.fps:
        raise ValueError(
            f"fps {fps} is more than {encoder} (codec {codec}) encodes: at most {limits.fps}; pass fps {limits.fps} "
            "or less, or another codec"
        )
    height_fits, width_fits = min(height, limits.height), min(width, limits.width)
    if height_fits * width_fits > limits.pixels:  # (scaled down alike, to even sides)
        scale = math.sqrt(limits.pixels / (height_fits * width_fits))
        height_fits, width_fits = int(height_fits * scale) // 2 * 2, int(width_fits * scale) // 2 * 2
    if (height_fits, width_fits) != (height, width):
        raise ValueError(
            f"size {height}x{width} (height x width) is more than {encoder} (codec {codec}) encodes: height at most "
            f"{limits.height}, width at most {limits.width}, height x width at most {limits.pixels} pixels; "
            f"{height_fits}x{width_fits} works"
        )


def encode_video(
    path: str | os.PathLike[str],
    frames: Iterable[np.ndarray],
    *,
    fps: int,
    codec: str,
    gop: int,
    crf: int | None = None,
) -> None:
    """Encode HxWx3 uint8 RGB ``frames`` into an .mp4 at ``path`` (yuv420p, frame i at pts i / fps).

    ``gop`` is the maximum keyframe interval in frames; encoders may add keyframes (scene cuts) but never
    space them further apart. Every GOP is closed: decoding from any keyframe yields every frame from it
    on. H.264 and HEVC use B-frames, which need ``gop >= 3`` to fit between keyframes (and, for HEVC, at
    least 4 frames). ``crf`` defaults to the codec's usual value (30 for AV1, LeRobot's default).
    Raises ValueError for bad options, an empty ``frames``, or frames of differing or odd shapes.
    """
    crf = _check_encode_args(codec, fps=fps, gop=gop, crf=crf)
    fps, gop = int(fps), int(gop)
    encoder = ""
    time_base = Fraction(1, fps)
    path = Path(path)
    count = 0
    try:
        with av.open(str(path), mode="w", format="mp4") as container:
            stream = None
            remaining = iter(frames)
            head = list(itertools.islice(remaining, _SHORT_CLIP_FRAMES))
            short_clip = len(head) < _SHORT_CLIP_FRAMES
            for frame_index, frame in enumerate(itertools.chain(head, remaining)):
                array = np.asarray(frame)
                if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                    raise ValueError(
                        f"Frame {frame_index} for {path} must be an HxWx3 uint8 RGB array, "
                        f"got shape {array.shape} dtype {array.dtype}."
                    )
                height, width = array.shape[:2]
                if stream is None:
                    if height % 2 or width % 2:
                        raise ValueError(f"yuv420p needs an even frame size, got {height}x{width} for {path}.")
                    _check_encoder_limits(codec, height=height, width=width, fps=fps)
                    settings = encoder_settings(codec, gop=gop, crf=crf, b_frames=not (short_clip and codec == "hevc"))
                    encoder = settings.encoder
                    stream = container.add_stream(encoder, rate=fps)
                    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
                    stream.codec_context.time_base = time_base
                    stream.options = settings.options
                    with kept_thread_priority():  # (SVT-AV1, run as root, left this thread real-time)
                        stream.codec_context.open()
                elif (height, width) != (stream.height, stream.width):
                    raise ValueError(
                        f"Frame {frame_index} for {path} is {height}x{width}, but the first frame "
                        f"was {stream.height}x{stream.width}; all frames of a video must match."
                    )
                video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
                video_frame.pts = frame_index
                video_frame.time_base = time_base
                container.mux(stream.encode(video_frame))
                count += 1
            if stream is None:
                raise ValueError(f"No frames given for {path}; a video needs at least one frame.")
            container.mux(stream.encode(None))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    logger.debug("Encoded %d frames with %s (gop=%d, crf=%d) to %s", count, encoder, gop, crf, path)


# ---------------------------------------------------------------------------------------------------------
# Predictable values
# ---------------------------------------------------------------------------------------------------------

MAX_VECTOR_DIM = 32
"""Largest ``state_dim`` / ``action_dim``: component i adds i/32, which must stay below 1."""

_FRAME_STRIDE = 1000  # base value of a row: episode_index * 1000 + frame_index


def _base_values(episode_index: np.ndarray | int, frame_index: np.ndarray | int) -> np.ndarray:
    return np.asarray(episode_index, dtype=np.float64) * _FRAME_STRIDE + np.asarray(frame_index, dtype=np.float64)


def _vector_values(base: np.ndarray, dim: int, *, negate: bool) -> np.ndarray:
    values = base[..., None] + np.arange(dim, dtype=np.float64) / MAX_VECTOR_DIM
    if negate:
        values = -(values + 1.0 / (2 * MAX_VECTOR_DIM))
    return values.astype(np.float32)


def expected_state(episode_index: int | np.ndarray, frame_index: int | np.ndarray, dim: int = 6) -> np.ndarray:
    """``observation.state`` of one row: ``episode*1000 + frame + i/32`` for component i (float32).

    Index arrays broadcast: the result has shape ``(*broadcast_shape, dim)``.
    Exact in float32 (no rounding) while ``episode*1000 + frame < 2**18``; always non-negative, so a state
    can never be mistaken for an action.
    """
    return _vector_values(_base_values(episode_index, frame_index), dim, negate=False)


def expected_action(episode_index: int | np.ndarray, frame_index: int | np.ndarray, dim: int = 7) -> np.ndarray:
    """``action`` of one row: ``-(episode*1000 + frame + i/32 + 1/64)`` for component i (float32).

    Exact in float32 while ``episode*1000 + frame < 2**18``; always negative, unlike any state.
    """
    return _vector_values(_base_values(episode_index, frame_index), dim, negate=True)


def expected_task_index(episode_index: int, *, num_tasks: int = 2, seed: int = 0) -> int:
    """Task of an episode: ``(episode_index + seed) % num_tasks``, so the seed shifts the assignment."""
    return (int(episode_index) + int(seed)) % int(num_tasks)


def task_name(task_index: int) -> str:
    """Natural-language task string stored for ``task_index``."""
    return f"synthetic task {task_index}: move the marker"


def camera_key(camera_index: int) -> str:
    """Feature key of a camera: ``observation.images.cam<camera_index>``."""
    return f"observation.images.cam{camera_index}"


# ---------------------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------------------


class DatasetVersion(str, Enum):
    """On-disk layout written by :func:`make_dataset`."""

    V30 = "v3.0"
    """LeRobot >= 0.4: several episodes per data parquet and per mp4 (one encode per file), episodes
    metadata in ``meta/episodes/*.parquet``, tasks in ``meta/tasks.parquet``."""
    V21 = "v2.1"
    """LeRobot 0.3.x: one parquet and one mp4 per episode and camera, metadata in ``meta/*.jsonl``."""


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Everything that determines a synthetic dataset; equal specs give byte-identical parquet files."""

    episodes: int = 4
    frames_per_episode: int | Sequence[int] = 30
    """One length for all episodes, or one per episode; stored as an int when all lengths are equal."""
    cameras: int = 1
    size: tuple[int, int] = (96, 128)
    """(height, width) of every camera, even numbers >= 64 so the marker survives yuv420p, and no more than the codec
    encodes (AV1: height <= 8704, width <= 16384; ValueError says each codec's limit)."""
    fps: int = 30
    codec: str = "av1"
    gop: int = 2
    crf: int | None = None
    episodes_per_file: int = 2
    """v3.0 only: episodes per data parquet and per mp4 (ignored for v2.1, which has one per episode)."""
    version: DatasetVersion = DatasetVersion.V30
    state_dim: int = 6
    action_dim: int = 7
    num_tasks: int = 2
    chunks_size: int = 1000
    seed: int = 0
    image_cameras: bool = False
    """Store the cameras as PNG images in the data files (LeRobot's ``dtype: "image"``) instead of videos."""
    episode_lengths: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        _check_int("episodes", self.episodes, 1, MAX_EPISODE_INDEX + 1)
        lengths = self.frames_per_episode
        if isinstance(lengths, (int, np.integer)) and not isinstance(lengths, bool):
            _check_int("frames_per_episode", lengths, 1, MAX_FRAME_INDEX + 1)
            lengths = (int(lengths),) * self.episodes
        elif isinstance(lengths, Sequence) and not isinstance(lengths, str):
            if len(lengths) != self.episodes:
                raise ValueError(
                    f"frames_per_episode has {len(lengths)} lengths but episodes={self.episodes}; "
                    "give one length per episode or a single int."
                )
            for i, length in enumerate(lengths):
                _check_int(f"frames_per_episode[{i}]", length, 1, MAX_FRAME_INDEX + 1)
            lengths = tuple(int(length) for length in lengths)
        else:
            raise ValueError(
                f"frames_per_episode must be an int or a sequence of ints, got {self.frames_per_episode!r}."
            )
        object.__setattr__(self, "frames_per_episode", lengths if len(set(lengths)) > 1 else lengths[0])
        object.__setattr__(self, "episode_lengths", lengths)

        _check_int("cameras", self.cameras, 0, MAX_CAMERA_INDEX + 1)
        if not isinstance(self.size, Sequence) or len(self.size) != 2:
            raise ValueError(f"size must be (height, width), got {self.size!r}.")
        for name, value in zip(("size[0] (height)", "size[1] (width)"), self.size, strict=True):
            _check_int(name, value, MIN_MARKER_SIZE)
            if value % 2 and self.cameras and self.image_cameras is not True:  # (PNG images take any size)
                raise ValueError(f"{name} must be even for yuv420p video, got {value}.")
        object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))
        _check_encode_args(self.codec, fps=self.fps, gop=self.gop, crf=self.crf)
        if self.cameras and not self.image_cameras:
            _check_encoder_limits(self.codec, height=self.size[0], width=self.size[1], fps=self.fps)
        elif self.fps > _MAX_C_INT:  # (10**50 wrote all-zero float32 timestamps, k / fps underflowing)
            raise ValueError(
                f"fps must be at most {_MAX_C_INT} (the video codecs' C-int limit; the rows' float32 timestamps "
                f"k / fps), got {self.fps}."
            )
        _check_int("episodes_per_file", self.episodes_per_file, 1)
        try:
            object.__setattr__(self, "version", DatasetVersion(self.version))
        except ValueError as e:
            allowed = ", ".join(v.value for v in DatasetVersion)
            raise ValueError(f"version must be one of {allowed}, got {self.version!r}.") from e
        _check_int("state_dim", self.state_dim, 1, MAX_VECTOR_DIM)
        _check_int("action_dim", self.action_dim, 1, MAX_VECTOR_DIM)
        _check_int("num_tasks", self.num_tasks, 1)
        _check_int("chunks_size", self.chunks_size, 1)
        _check_int("seed", self.seed, 0)
        if not isinstance(self.image_cameras, bool):
            raise ValueError(f"image_cameras must be True or False, got {self.image_cameras!r}.")
        for name in ("episodes", "cameras", "fps", "gop", "episodes_per_file", "state_dim", "action_dim",
                     "num_tasks", "chunks_size", "seed"):  # fmt: skip
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints would break json.dumps

    @property
    def total_frames(self) -> int:
        return sum(self.episode_lengths)

    @property
    def video_keys(self) -> tuple[str, ...]:
        return tuple(camera_key(c) for c in range(self.cameras))


# ---------------------------------------------------------------------------------------------------------
# Statistics, in LeRobot's per-feature min/max/mean/std/count form
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Moments:
    """Running sums from which min/max/mean/std are exact to float64 and mergeable across episodes."""

    count: int
    total: np.ndarray
    total_sq: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> _Moments:
        """Moments over axis 0 of an (n, ...) array."""
        as_float = values.astype(np.float64)
        return cls(len(values), as_float.sum(0), (as_float**2).sum(0), values.min(0), values.max(0))

    def merge(self, other: _Moments) -> _Moments:
        return _Moments(
            self.count + other.count,
            self.total + other.total,
            self.total_sq + other.total_sq,
            np.minimum(self.minimum, other.minimum),
            np.maximum(self.maximum, other.maximum),
        )

    def to_stats(self) -> dict[str, Any]:
        mean = self.total / self.count
        std = np.sqrt(np.maximum(self.total_sq / self.count - mean**2, 0.0))
        return {
            "min": np.atleast_1d(self.minimum).tolist(),
            "max": np.atleast_1d(self.maximum).tolist(),
            "mean": np.atleast_1d(mean).tolist(),
            "std": np.atleast_1d(std).tolist(),
            "count": [self.count],
        }


def _image_moments(frame: np.ndarray) -> _Moments:
    """Per-channel moments of one HxWx3 uint8 frame in [0, 1], shaped (3, 1, 1) as LeRobot stores them.

    A frame counts once (its sums are pixel means), so merged moments weight frames equally, as LeRobot's
    frame sampling does.
    """
    # From each channel's histogram: the same numbers as float reductions over the pixels, ~20x faster
    # (generating the bench datasets spent most of its time here).
    levels = np.arange(256, dtype=np.float64) / 255.0
    counts = np.stack([np.bincount(frame[..., c].ravel(), minlength=256) for c in range(3)]).astype(np.float64)
    pixels = frame.shape[0] * frame.shape[1]
    present = counts > 0
    shape = (3, 1, 1)
    return _Moments(
        1,
        (counts @ levels / pixels).reshape(shape),
        (counts @ levels**2 / pixels).reshape(shape),
        levels[np.argmax(present, axis=1)].reshape(shape),
        levels[255 - np.argmax(present[:, ::-1], axis=1)].reshape(shape),
    )


# ---------------------------------------------------------------------------------------------------------
# Rows and frames
# ---------------------------------------------------------------------------------------------------------


def _episode_columns(spec: DatasetSpec, episode_index: int, first_index: int) -> dict[str, np.ndarray]:
    length = spec.episode_lengths[episode_index]
    frame_index = np.arange(length, dtype=np.int64)
    base = _base_values(episode_index, frame_index)
    return {
        "observation.state": _vector_values(base, spec.state_dim, negate=False),
        "action": _vector_values(base, spec.action_dim, negate=True),
        "timestamp": (frame_index / spec.fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.full(length, episode_index, dtype=np.int64),
        "index": np.arange(first_index, first_index + length, dtype=np.int64),
        "task_index": np.full(
            length,
            expected_task_index(episode_index, num_tasks=spec.num_tasks, seed=spec.seed),
            dtype=np.int64,
        ),
    }


def _hf_feature(data_type: pa.DataType, *, list_type: str) -> dict[str, Any]:
    """The ``datasets.Features`` JSON for an arrow type, as ``datasets`` stores it in parquet metadata."""
    if pa.types.is_fixed_size_list(data_type):
        inner = _hf_feature(data_type.value_type, list_type=list_type)
        return {"feature": inner, "length": data_type.list_size, "_type": list_type}
    if pa.types.is_list(data_type):
        inner = _hf_feature(data_type.value_type, list_type=list_type)
        if list_type == "Sequence":  # datasets 3.x writes length -1 for variable-length sequences
            return {"feature": inner, "length": -1, "_type": list_type}
        return {"feature": inner, "_type": list_type}
    if data_type == IMAGE_TYPE:
        return {"_type": "Image"}
    names = {pa.float32(): "float32", pa.float64(): "float64", pa.int64(): "int64", pa.string(): "string"}
    return {"dtype": names[data_type], "_type": "Value"}


def _with_hf_metadata(table: pa.Table, *, list_type: str) -> pa.Table:
    features = {f.name: _hf_feature(f.type, list_type=list_type) for f in table.schema}
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def _data_table(
    spec: DatasetSpec, columns: list[dict[str, np.ndarray]], images: dict[str, pa.Array] | None = None
) -> pa.Table:
    arrays: dict[str, pa.Array] = dict(images or {})
    for name in ("observation.state", "action"):
        values = np.concatenate([c[name] for c in columns])
        arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        arrays[name] = pa.array(np.concatenate([c[name] for c in columns]))
    list_type = "List" if spec.version is DatasetVersion.V30 else "Sequence"
    return _with_hf_metadata(pa.table(arrays), list_type=list_type)


def _encode_cameras(
    spec: DatasetSpec, episode_indices: Sequence[int], paths: Sequence[Path], video_info: dict[str, dict[str, Any]]
) -> dict[str, dict[int, _Moments]]:
    """Encode each camera's frames of ``episode_indices`` into its path of ``paths`` (one per video key), the cameras
    side by side (an encoder keeps about one core busy: SVT-AV1 runs at one level of parallelism,
    :data:`~lerobot_dali.video_encoding.SVTAV1_PARAMS`; 3 cameras took 3.2 s one after another, 2.4 s so on 2 cores);
    the first file of a camera gives its ``video_info``. Returns each camera's moments per episode."""

    def encode(camera: tuple[int, Path]) -> dict[int, _Moments]:
        camera_index, path = camera
        path.parent.mkdir(parents=True, exist_ok=True)
        moments: dict[int, _Moments] = {}
        frames = _camera_frames(spec, episode_indices, camera_index, moments)
        encode_video(path, frames, fps=spec.fps, codec=spec.codec, gop=spec.gop, crf=spec.crf)
        return moments

    per_camera = in_threads(encode, list(enumerate(paths)))
    for key, path in zip(spec.video_keys, paths, strict=True):
        if key not in video_info:
            video_info[key] = _video_info(path)
    return dict(zip(spec.video_keys, per_camera, strict=True))


def _camera_frames(
    spec: DatasetSpec, episode_indices: Sequence[int], camera_index: int, moments: dict[int, _Moments]
) -> Iterator[np.ndarray]:
    """Marker frames of consecutive episodes for one camera; fills ``moments`` per episode on the way."""
    height, width = spec.size
    for episode_index in episode_indices:
        for frame_index in range(spec.episode_lengths[episode_index]):
            frame = draw_marker(episode_index, frame_index, height, width, camera_index)
            frame_moments = _image_moments(frame)
            previous = moments.get(episode_index)
            moments[episode_index] = frame_moments if previous is None else previous.merge(frame_moments)
            yield frame


#: How ``datasets`` stores an ``Image`` feature in parquet: the encoded file and an optional path.
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _image_columns(
    spec: DatasetSpec, episode_indices: Sequence[int], moments: dict[str, dict[int, _Moments]]
) -> dict[str, pa.Array]:
    """PNG-encoded marker frames per camera for the data file of ``episode_indices`` (``image_cameras``)."""
    from PIL import Image

    columns = {}
    for camera_index, key in enumerate(spec.video_keys):
        moments[key] = {}
        encoded = []
        for frame in _camera_frames(spec, episode_indices, camera_index, moments[key]):
            buffer = io.BytesIO()
            Image.fromarray(frame).save(buffer, format="PNG")
            encoded.append({"bytes": buffer.getvalue(), "path": None})
        columns[key] = pa.array(encoded, type=IMAGE_TYPE)
    return columns


def _episode_stats(columns: dict[str, np.ndarray], image_moments: dict[str, _Moments]) -> dict[str, dict[str, Any]]:
    stats = {name: _Moments.of(values).to_stats() for name, values in columns.items()}
    for key, moments in image_moments.items():
        stats[key] = moments.to_stats()
    return stats


def _video_info(path: Path) -> dict[str, Any]:
    """Read back what LeRobot's ``get_video_info`` records, from the encoded file itself."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.codec_context.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(stream.base_rate),
            "video.channels": 3,
            "has_audio": len(container.streams.audio) > 0,
        }


def _features(spec: DatasetSpec, video_info: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    per_feature_fps = spec.version is DatasetVersion.V30
    height, width = spec.size

    def plain(dtype: str, shape: list[int], names: list[str] | None) -> dict[str, Any]:
        feature: dict[str, Any] = {"dtype": dtype, "shape": shape, "names": names}
        if per_feature_fps:
            feature["fps"] = spec.fps
        return feature

    features = {"observation.state": plain("float32", [spec.state_dim], [f"state_{i}" for i in range(spec.state_dim)])}
    for key in spec.video_keys:
        if spec.image_cameras:
            features[key] = plain("image", [height, width, 3], ["height", "width", "channel"])
            continue
        features[key] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channel"],
            "info": video_info[key],
        }
    features["action"] = plain("float32", [spec.action_dim], [f"action_{i}" for i in range(spec.action_dim)])
    features["timestamp"] = plain("float32", [1], None)
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = plain("int64", [1], None)
    return features


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_jsonl(path: Path, rows: Iterable[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


# ---------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------


def _chunk_file(file_ordinal: int, chunks_size: int) -> tuple[int, int]:
    """(chunk_index, file_index) of the n-th file: a chunk directory holds ``chunks_size`` files."""
    return divmod(file_ordinal, chunks_size)


def _tasks_table(spec: DatasetSpec) -> pa.Table:
    """``meta/tasks.parquet`` as pandas writes LeRobot's DataFrame: task strings are the (unnamed) index."""
    return text_list_table("task", [(i, task_name(i)) for i in range(spec.num_tasks)])


def text_list_table(name: str, rows: Sequence[tuple[int, str]]) -> pa.Table:
    """A LeRobot v3.0 text list (``name``: "task" for ``meta/tasks.parquet``, "subtask" for ``meta/subtasks.parquet``)
    as pandas writes LeRobot's DataFrame: column ``{name}_index``, the texts its (unnamed) index, which is what
    LeRobot 0.4 reads a text from (a plain text column it reads as the row's number). ``rows``: (index, text), in
    the file's order (LeRobot writes row i with index i)."""
    indices, texts = zip(*rows, strict=True) if rows else ((), ())
    table = pa.table(
        {
            f"{name}_index": pa.array(indices, pa.int64()),
            "__index_level_0__": pa.array(texts, pa.string()),
        }
    )
    pandas_metadata = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": f"{name}_index",
                "field_name": f"{name}_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({"pandas": json.dumps(pandas_metadata)})


def _write_v30(root: Path, spec: DatasetSpec) -> None:
    starts = np.concatenate([[0], np.cumsum(spec.episode_lengths)]).tolist()
    episode_rows: list[dict[str, Any]] = []
    video_info: dict[str, dict[str, Any]] = {}
    total_moments: dict[str, _Moments] = {}
    data_template = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    video_template = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

    for file_ordinal, first in enumerate(range(0, spec.episodes, spec.episodes_per_file)):
        group = list(range(first, min(first + spec.episodes_per_file, spec.episodes)))
        chunk_index, file_index = _chunk_file(file_ordinal, spec.chunks_size)
        columns = [_episode_columns(spec, e, starts[e]) for e in group]
        data_path = root / data_template.format(chunk_index=chunk_index, file_index=file_index)
        image_moments: dict[str, dict[int, _Moments]] = {}
        images = _image_columns(spec, group, image_moments) if spec.image_cameras else None
        _write_parquet(data_path, _data_table(spec, columns, images))

        if not spec.image_cameras:
            paths = [
                root / video_template.format(video_key=key, chunk_index=chunk_index, file_index=file_index)
                for key in spec.video_keys
            ]
            image_moments.update(_encode_cameras(spec, group, paths, video_info))

        for episode_index, episode_columns in zip(group, columns, strict=True):
            length = spec.episode_lengths[episode_index]
            row: dict[str, Any] = {
                "episode_index": episode_index,
                "data/chunk_index": chunk_index,
                "data/file_index": file_index,
                "dataset_from_index": starts[episode_index],
                "dataset_to_index": starts[episode_index] + length,
            }
            frames_before = starts[episode_index] - starts[group[0]]
            for key in () if spec.image_cameras else spec.video_keys:
                row[f"videos/{key}/chunk_index"] = chunk_index
                row[f"videos/{key}/file_index"] = file_index
                row[f"videos/{key}/from_timestamp"] = frames_before / spec.fps
                row[f"videos/{key}/to_timestamp"] = (frames_before + length) / spec.fps
            row["tasks"] = [task_name(expected_task_index(episode_index, num_tasks=spec.num_tasks, seed=spec.seed))]
            row["length"] = length
            episode_image_moments = {key: image_moments[key][episode_index] for key in spec.video_keys}
            for feature, stats in _episode_stats(episode_columns, episode_image_moments).items():
                for stat, value in stats.items():
                    row[f"stats/{feature}/{stat}"] = value
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
            episode_rows.append(row)

            for name, values in episode_columns.items():
                moments = _Moments.of(values)
                total_moments[name] = total_moments[name].merge(moments) if name in total_moments else moments
            for key, moments in episode_image_moments.items():
                total_moments[key] = total_moments[key].merge(moments) if key in total_moments else moments
        logger.info(
            "file %d/%d: %s, %s%s",
            file_ordinal + 1,
            math.ceil(spec.episodes / spec.episodes_per_file),
            f"episodes {group[0]}-{group[-1]}" if len(group) > 1 else f"episode {group[0]}",
            data_path.relative_to(root),
            _camera_files(spec),
        )

    episodes_table = pa.Table.from_pylist(episode_rows)
    _write_parquet(
        root / "meta/episodes/chunk-000/file-000.parquet",
        _with_hf_metadata(episodes_table, list_type="List"),
    )
    _write_parquet(root / "meta/tasks.parquet", _tasks_table(spec))
    _write_json(root / "meta/stats.json", {key: m.to_stats() for key, m in total_moments.items()})
    info = _info(spec, DatasetVersion.V30, data_template, video_template, video_info)
    _write_json(root / "meta/info.json", {**info, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200})


def _write_v21(root: Path, spec: DatasetSpec) -> None:
    starts = np.concatenate([[0], np.cumsum(spec.episode_lengths)]).tolist()
    data_template = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    video_template = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    video_info: dict[str, dict[str, Any]] = {}
    episodes: list[dict[str, Any]] = []
    episodes_stats: list[dict[str, Any]] = []

    for episode_index in range(spec.episodes):
        episode_chunk = episode_index // spec.chunks_size
        columns = _episode_columns(spec, episode_index, starts[episode_index])
        data_path = root / data_template.format(episode_chunk=episode_chunk, episode_index=episode_index)
        image_moments: dict[str, _Moments] = {}
        images = None
        if spec.image_cameras:
            per_camera: dict[str, dict[int, _Moments]] = {}
            images = _image_columns(spec, [episode_index], per_camera)
            image_moments = {key: moments[episode_index] for key, moments in per_camera.items()}
        _write_parquet(data_path, _data_table(spec, [columns], images))
        if not spec.image_cameras:
            paths = [
                root / video_template.format(episode_chunk=episode_chunk, video_key=key, episode_index=episode_index)
                for key in spec.video_keys
            ]
            for key, moments in _encode_cameras(spec, [episode_index], paths, video_info).items():
                image_moments[key] = moments[episode_index]
        task_index = expected_task_index(episode_index, num_tasks=spec.num_tasks, seed=spec.seed)
        episodes.append(
            {
                "episode_index": episode_index,
                "tasks": [task_name(task_index)],
                "length": spec.episode_lengths[episode_index],
            }
        )
        episodes_stats.append({"episode_index": episode_index, "stats": _episode_stats(columns, image_moments)})
        logger.info(
            "episode %d/%d: %s%s", episode_index + 1, spec.episodes, data_path.relative_to(root), _camera_files(spec)
        )

    _write_jsonl(root / "meta/episodes.jsonl", episodes)
    _write_jsonl(root / "meta/episodes_stats.jsonl", episodes_stats)
    _write_jsonl(
        root / "meta/tasks.jsonl",
        ({"task_index": i, "task": task_name(i)} for i in range(spec.num_tasks)),
    )
    info = _info(spec, DatasetVersion.V21, data_template, video_template, video_info)
    videos = 0 if spec.image_cameras else spec.episodes * spec.cameras
    totals = {"total_videos": videos, "total_chunks": math.ceil(spec.episodes / spec.chunks_size)}
    _write_json(root / "meta/info.json", {**info, **totals})


def _camera_files(spec: DatasetSpec) -> str:
    """What a progress message adds after a data file's path: the cameras written with it."""
    if not spec.cameras:
        return ""
    return " with the camera images" if spec.image_cameras else f" and {counted(spec.cameras, 'video file')}"


def _info(
    spec: DatasetSpec,
    version: DatasetVersion,
    data_template: str,
    video_template: str,
    video_info: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``meta/info.json`` keys both layouts share."""
    return {
        "codebase_version": version.value,
        "robot_type": "synthetic",
        "total_episodes": spec.episodes,
        "total_frames": spec.total_frames,
        "total_tasks": spec.num_tasks,
        "chunks_size": spec.chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{spec.episodes}"},
        "data_path": data_template,
        "video_path": video_template if spec.cameras and not spec.image_cameras else None,
        "features": _features(spec, video_info),
    }


def make_dataset(
    out: str | os.PathLike[str],
    *,
    episodes: int = 4,
    frames_per_episode: int | Sequence[int] = 30,
    cameras: int = 1,
    size: tuple[int, int] = (96, 128),
    fps: int = 30,
    codec: str = "av1",
    gop: int = 2,
    crf: int | None = None,
    episodes_per_file: int = 2,
    version: str | DatasetVersion = "v3.0",
    state_dim: int = 6,
    action_dim: int = 7,
    num_tasks: int = 2,
    chunks_size: int = 1000,
    seed: int = 0,
    image_cameras: bool = False,
) -> Path:
    """Write a LeRobot dataset that LeRobot itself loads (v3.0: lerobot 0.4.x, v2.1: lerobot 0.3.x).

    Rows hold :func:`expected_state` / :func:`expected_action` values, ``timestamp = frame_index / fps``
    and task :func:`expected_task_index`; every video frame carries the marker of its episode, frame and
    camera (:func:`lerobot_dali.frame_marker.read_full_marker`). ``out`` must be new or an empty
    directory; it holds the dataset only once every file is written (a failed or interrupted run leaves it
    as it was), and not inside another dataset (ValueError). Returns ``out`` as a Path.
    """
    spec = DatasetSpec(
        episodes=episodes,
        frames_per_episode=frames_per_episode,
        cameras=cameras,
        size=size,
        fps=fps,
        codec=codec,
        gop=gop,
        crf=crf,
        episodes_per_file=episodes_per_file,
        version=version,  # type: ignore[arg-type]
        state_dim=state_dim,
        action_dim=action_dim,
        num_tasks=num_tasks,
        chunks_size=chunks_size,
        seed=seed,
        image_cameras=image_cameras,
    )
    refuse_taken(out, writer="make_dataset")  # (before saying it writes there)
    refuse_inside_a_dataset(out, writer="make_dataset")
    if not spec.cameras:
        what = "no cameras"
    elif spec.image_cameras:
        what = f"{counted(spec.cameras, 'image camera')} as PNG in the data files"
    else:
        what = f"{counted(spec.cameras, 'camera')} as {spec.codec} video, gop {spec.gop}"
    logger.info(
        "Writing a %s dataset of %d episodes (%d frames, %s) to %s",
        spec.version.value,
        spec.episodes,
        spec.total_frames,
        what,
        out,
    )
    write = partial(_write_v30 if spec.version is DatasetVersion.V30 else _write_v21, spec=spec)
    return write_new_folder(out, write, writer="make_dataset")
