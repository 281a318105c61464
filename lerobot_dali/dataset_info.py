"""``meta/info.json``: the dataset's declared schema, frame rate and file layout.

Only the keys the loader needs are read; unknown keys are ignored so newer writers stay readable. Path
templates are checked once here, so a template that escapes the dataset root fails at open time, not deep
inside a worker process.
"""

from __future__ import annotations

import math
import posixpath
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .depth_maps import DepthQuantizer, is_depth_map
from .errors import DatasetError, InvalidPathTemplateError, UnsupportedVersionError
from .file_timing import RATE_SLACK
from .value_checks import whole_number
from .video_encoding import CODEC_OF_ENCODER

__all__ = [
    "INDEX_COLUMNS",
    "SUPPORTED_VERSIONS",
    "DatasetInfo",
    "Feature",
    "VideoInfo",
    "format_path",
    "template_pattern",
]

#: Codebase versions whose layout this loader reads. v2.0 and v2.1 share one layout (one parquet and one
#: video per episode); v3.0 packs many episodes per file.
SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
#: Encoders' names some writers put in ``video.codec`` for the codec they write (FFmpeg's codec names otherwise).
_CODEC_OF_ENCODER = {
    **CODEC_OF_ENCODER,
    "libaom-av1": "av1", "librav1e": "av1", "av1_nvenc": "av1",
    "h264_nvenc": "h264", "avc": "h264",
    "hevc_nvenc": "hevc", "h265": "hevc",
    "libvpx": "vp8",
}  # fmt: skip
#: Columns LeRobot batches for every dataset, one value per frame; ``frame_index`` is derived when a dataset omits it.
INDEX_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")

_LEROBOT_TEMPLATES = {  # the templates LeRobot writes, offered where info.json lacks one
    "v3": {
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    },
    "v2": {
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    },
}
_TEMPLATE_FIELDS = {
    "v3": {"data_path": {"chunk_index", "file_index"}, "video_path": {"chunk_index", "file_index", "video_key"}},
    "v2": {
        "data_path": {"episode_chunk", "episode_index"},
        "video_path": {"episode_chunk", "episode_index", "video_key"},
    },
}


@dataclass(frozen=True)
class VideoInfo:
    """What ``info.json`` claims about a camera's video. The files are the truth; see ``video_probe``."""

    codec: str | None = None
    fps: float | None = None
    height: int | None = None
    width: int | None = None
    pix_fmt: str | None = None
    #: Depth-map cameras (:mod:`.depth_maps`): the quantiser their 12-bit codes decode with; None for colour.
    depth: DepthQuantizer | None = None

    @property
    def is_depth_map(self) -> bool:
        return self.depth is not None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, depth_map: bool = False) -> VideoInfo:
        def opt_int(key: str) -> int | None:
            value = raw.get(key)
            return int(value) if value is not None else None

        fps = raw.get("video.fps")
        return cls(
            codec=raw.get("video.codec"),
            fps=float(fps) if fps is not None else None,
            height=opt_int("video.height"),
            width=opt_int("video.width"),
            pix_fmt=raw.get("video.pix_fmt"),
            depth=DepthQuantizer.from_info(raw) if depth_map else None,
        )


@dataclass(frozen=True)
class Feature:
    """One declared feature. ``shape`` is as declared: cameras are (H, W, C); scalars are (1,)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    names: Any = None
    video: VideoInfo | None = None
    #: Image cameras of depth (:mod:`.depth_maps`): flagged ``is_depth_map``, stored in ``depth_unit`` ("m",
    #: "mm", or None: unknown, read as stored) as 16-bit or float images.
    depth_image: bool = False
    depth_unit: str | None = None

    @property
    def is_depth_map(self) -> bool:
        return self.depth_image or (self.video is not None and self.video.is_depth_map)

    @property
    def is_camera(self) -> bool:
        return self.dtype in ("video", "image")

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def declared_size(self) -> tuple[int, int] | None:
        """A camera's (height, width) as info.json declares it (``video.height``/``video.width``, else the shape by
        its ``names``); None where it does not say."""
        if self.video is not None and self.video.height and self.video.width:
            return self.video.height, self.video.width
        names = [str(n).lower() for n in self.names] if isinstance(self.names, list) else []
        if len(names) == len(self.shape) and "height" in names and "width" in names:
            return int(self.shape[names.index("height")]), int(self.shape[names.index("width")])
        return None

    @property
    def declared_fps(self) -> float | None:
        """The frame rate info.json declares for a camera's video (``video.fps``), where it is a positive number."""
        rate = self.video.fps if self.video is not None else None
        return rate if rate is not None and math.isfinite(rate) and rate > 0 else None

    def unlike_video(self, codec: str, fps: float | None, size: tuple[int, int]) -> list[str]:
        """What info.json declares of this camera's video that a video file of it (``codec``, ``fps``, ``size`` as
        (H, W)) does not hold, each as ``"video.fps 10 (the file: 25)"``. Reading follows the files; tools that read
        info.json instead (a policy's input shape, a dataset viewer, LeRobot's dataset edits) are told wrong."""
        unlike = []
        declared = self.video.codec if self.video is not None else None
        if declared and _CODEC_OF_ENCODER.get(declared.lower(), declared.lower()) != codec:
            unlike.append(f"video.codec {declared!r} (the file: {codec})")
        rate = self.declared_fps
        if rate is not None and fps is not None and abs(rate - fps) > RATE_SLACK * fps:
            unlike.append(f"video.fps {rate:g} (the file: {fps:g})")
        size_declared = self.declared_size
        if size_declared is not None and size_declared != size:
            unlike.append(f"{size_declared[0]}x{size_declared[1]} (HxW) frames (the file: {size[0]}x{size[1]})")
        return unlike

    @property
    def is_host_value(self) -> bool:
        """Strings and LeRobot's ``language`` annotations: read as Python objects, batched as lists (as LeRobot's
        collate leaves them), never as tensors."""
        return self.dtype in ("string", "language")

    @property
    def is_scalar(self) -> bool:
        """Scalars are stored as plain parquet columns and batch to shape (B,), as in LeRobot."""
        return self.shape in ((), (1,))

    @classmethod
    def from_json(cls, key: str, raw: Mapping[str, Any]) -> Feature:
        try:
            dtype = str(raw["dtype"])
            shape = tuple(_dimension(d) for d in raw.get("shape", ()))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(
                f"feature {key!r} in info.json needs 'dtype' and an integer 'shape' ({type(e).__name__}: {e}); correct "
                'it in meta/info.json (e.g. {"dtype": "float32", "shape": [6]}), or re-download the dataset\'s meta/'
            ) from e
        video_raw = raw.get("info") or raw.get("video_info")  # 'video_info' is the v2.0 name
        video = None
        if dtype == "video":
            infos = [i for i in (raw.get("info"), raw.get("video_info")) if isinstance(i, Mapping)]
            try:
                video = VideoInfo.from_json(
                    video_raw if isinstance(video_raw, Mapping) else {}, depth_map=is_depth_map(*infos)
                )
            except (TypeError, ValueError) as e:
                raise DatasetError(
                    f"video feature {key!r} in info.json has an unusable 'info' ({e}); correct that entry in "
                    "meta/info.json or remove it (the video files' streams say the same), or re-download the "
                    "dataset's meta/"
                ) from e
        depth_image = dtype == "image" and is_depth_map(
            raw.get("info") if isinstance(raw.get("info"), Mapping) else None
        )
        depth_unit = raw["info"].get("depth_unit") if depth_image else None
        if depth_unit not in (None, "m", "mm"):
            raise DatasetError(
                f"depth image feature {key!r} in info.json has depth_unit {depth_unit!r}; set it to the unit its "
                "pixel values count, 'm' or 'mm', in meta/info.json"
            )
        return cls(
            key=key, dtype=dtype, shape=shape, names=raw.get("names"), video=video, depth_image=depth_image,
            depth_unit=depth_unit,
        )  # fmt: skip


@dataclass(frozen=True)
class DatasetInfo:
    """The parsed ``meta/info.json``."""

    codebase_version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    total_episodes: int
    total_frames: int
    total_tasks: int
    chunks_size: int
    robot_type: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def major_version(self) -> str:
        """``"v3"`` or ``"v2"``: the layout family that decides how files are found."""
        return self.codebase_version.split(".")[0]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_camera]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_video]

    def fastest_fps(self, key: str) -> float:
        """The faster of the rows' rate and camera ``key``'s declared video rate: half a frame at it is the least gap
        that either could mean, where the file's own rate is not read."""
        feature = self.features.get(key)
        return max(self.fps, (feature.declared_fps if feature is not None else None) or self.fps)

    @property
    def depth_keys(self) -> list[str]:
        """Depth cameras (:mod:`.depth_maps`): videos of 12-bit quantised depth, and depth images."""
        return [k for k, f in self.features.items() if f.is_depth_map]

    def depth_quantizers(self, keys: Iterable[str]) -> dict[str, DepthQuantizer]:
        """The depth video cameras among ``keys``, with the quantisers of their codes."""
        features = (self.features[k] for k in keys)
        return {f.key: f.video.depth for f in features if f.video is not None and f.video.depth is not None}

    def depth_image_units(self, keys: Iterable[str]) -> dict[str, str | None]:
        """The depth image cameras among ``keys``, with the unit their images are stored in (None: not said)."""
        return {k: self.features[k].depth_unit for k in keys if self.features[k].depth_image}

    @property
    def image_keys(self) -> list[str]:
        """Cameras stored as encoded images in the data files (``dtype: "image"``)."""
        return [k for k, f in self.features.items() if f.is_camera and not f.is_video]

    @property
    def tabular_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if not f.is_camera]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, source: str) -> DatasetInfo:
        """Parse and validate; ``source`` names the file in error messages."""
        version = raw.get("codebase_version")
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                f"{source}: codebase_version {version!r} is not supported; supported versions are "
                f"{', '.join(SUPPORTED_VERSIONS)}. Convert older datasets with LeRobot's conversion scripts."
            )
        try:
            fps = float(raw["fps"])
            features_raw = raw["features"]
            data_path = str(raw["data_path"])
        except KeyError as e:
            raise DatasetError(
                f"{source}: required key {e.args[0]!r} is missing; every LeRobot dataset's info.json has it: "
                f"{_missing_key_advice(e.args[0], str(version))}"
            ) from e
        except (TypeError, ValueError) as e:  # (null, or text that is not a number)
            raise DatasetError(f"{source}: fps must be a positive number, got {raw['fps']!r}; {_FPS_ADVICE}") from e
        if not math.isfinite(fps) or fps <= 0:
            raise DatasetError(f"{source}: fps must be a positive number, got {raw['fps']!r}; {_FPS_ADVICE}")
        if not isinstance(features_raw, Mapping) or not features_raw:
            raise DatasetError(
                f"{source}: 'features' must be a non-empty mapping of each feature's key to its dtype and shape, got "
                f"{features_raw!r:.80}; the file is damaged or not LeRobot's: re-download the dataset's meta/"
            )
        features = {str(k): Feature.from_json(str(k), v) for k, v in features_raw.items()}
        for key in INDEX_COLUMNS:
            if key in features and not features[key].is_scalar:
                raise DatasetError(
                    f"{source}: feature {key!r} is declared with shape {list(features[key].shape)}, but it is a scalar "
                    "per frame in every LeRobot dataset: declare shape [1]"
                )
        video_path = raw.get("video_path")
        info = cls(
            codebase_version=str(version),
            fps=fps,
            features=features,
            data_path=data_path,
            video_path=str(video_path) if video_path else None,
            total_episodes=_count(raw, "total_episodes", 0, minimum=0, source=source),
            total_frames=_count(raw, "total_frames", 0, minimum=0, source=source),
            total_tasks=_count(raw, "total_tasks", 0, minimum=0, source=source),
            chunks_size=_count(raw, "chunks_size", 1000, minimum=1, source=source),
            robot_type=raw.get("robot_type"),
            raw=dict(raw),
        )
        info._check_templates(source)
        return info

    def _check_templates(self, source: str) -> None:
        allowed = _TEMPLATE_FIELDS[self.major_version]
        templates = {"data_path": self.data_path}
        if self.video_keys:
            if self.video_path is None:
                raise InvalidPathTemplateError(
                    f"{source}: video features are declared but 'video_path' is missing; add the template the videos "
                    f"are stored by (LeRobot's {self.codebase_version}: "
                    f"{_LEROBOT_TEMPLATES[self.major_version]['video_path']!r}), or re-download the dataset's meta/"
                )
            templates["video_path"] = self.video_path
        for name, template in templates.items():
            try:
                fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as e:
                raise InvalidPathTemplateError(
                    f"{source}: {name} {template!r} is not a valid template ({e}); correct it in meta/info.json "
                    f"(LeRobot's {self.codebase_version}: {_LEROBOT_TEMPLATES[self.major_version][name]!r})"
                ) from e
            unknown = fields - allowed[name]
            if unknown:
                raise InvalidPathTemplateError(
                    f"{source}: {name} {template!r} uses unknown field(s) {sorted(unknown)}; "
                    f"a {self.codebase_version} template may use {sorted(allowed[name])}"
                )
            probe = {**dict.fromkeys(allowed[name], 0), "video_key": "camera"}
            format_path(template, probe, name=name, source=source)


_FPS_ADVICE = "set fps in meta/info.json to the frame rate the dataset was recorded at (its timestamps' rate)"


def _missing_key_advice(key: str, version: str) -> str:
    """How to mend an info.json that lacks ``key``: a path template LeRobot writes can be named outright."""
    template = _LEROBOT_TEMPLATES["v3" if version.startswith("v3") else "v2"].get(key)
    if template is not None:
        return f"add it to meta/info.json (LeRobot's {version}: {key}={template!r}), or re-download the dataset's meta/"
    if key == "fps":
        return f"{_FPS_ADVICE}, or re-download the dataset's meta/"
    return "re-download the dataset's meta/ (the file is damaged or not LeRobot's)"


def _dimension(value: object) -> int:
    size = whole_number(value)
    if size is None or size < 0:
        raise ValueError(f"dimension {value!r} is not a whole number >= 0")
    return size


def _count(raw: Mapping[str, Any], key: str, default: int, *, minimum: int, source: str) -> int:
    """A count of info.json (null or absent: ``default``); one written as a string or a whole float reads, since
    its value is not in doubt."""
    value = raw.get(key)
    if value is None:
        return default
    count = whole_number(value)
    if count is None or count < minimum:
        raise DatasetError(f"{source}: {key} must be a whole number >= {minimum}, got {value!r}")
    return count


def format_path(template: str, values: Mapping[str, object], *, name: str = "path", source: str = "info.json") -> str:
    """Fill a path template and refuse results that leave the dataset root."""
    try:
        path = template.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise InvalidPathTemplateError(f"{source}: cannot fill {name} {template!r} with {values}: {e}") from e
    normal = posixpath.normpath(path)
    if path.startswith(("/", "\\")) or normal == ".." or normal.startswith("../") or "://" in path:
        raise InvalidPathTemplateError(
            f"{source}: {name} {template!r} resolves to {path!r}, outside the dataset root; "
            "templates must be relative paths inside the dataset"
        )
    return normal


def template_pattern(template: str, captures: Mapping[str, str]) -> str:
    """A regular expression (unanchored) for the paths ``template`` formats: each field named in ``captures`` as a
    group of that name and pattern, any other field as ``[^/]*``, the rest literal."""
    pattern = ""
    for literal, field_name, _, _ in string.Formatter().parse(template):
        pattern += re.escape(literal)
        if field_name is not None:
            pattern += rf"(?P<{field_name}>{captures[field_name]})" if field_name in captures else r"[^/]*"
    return pattern
