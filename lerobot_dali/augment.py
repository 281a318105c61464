"""On-device augmentation of camera windows, and the hand-over to LeRobot's tensor convention.

Input: one camera's batch of uint8 sequences, layout ``FHWC`` (F = the frames of one sample's
``delta_timestamps`` window, possibly 1), on the CPU or the GPU. Output: ``FCHW`` float32 in [0, 1]
(or normalised), or ``FCHW`` uint8 with ``return_uint8``. Every step is a DALI operator, so the same
graph runs on ``cpu`` and ``gpu`` DataNodes; only the random parameters (tiny per-sample arrays) live on
the CPU, as DALI argument inputs.

Order of operations (each skipped when not configured):

1. ``resize``: deterministic resize to (H, W) (``fn.resize``, linear, antialiased); skipped with
   ``presized`` when the CPU decoding worker already resized the frames (see :func:`leading_resize`).
2. ``random_resized_crop``: a random area/aspect window resized to its ``size`` (``fn.resize`` with a
   per-sample relative ROI; the window is sampled as torchvision does, see :mod:`.augment_draws`).
3. ``affine``: rotation and scale about the image centre, then translation (``fn.transforms.*`` +
   ``fn.warp_affine``, outside filled with 0).
4. ``color_jitter``: one fused ``fn.color_twist``: hue and saturation (a linear transform in RGB), then
   contrast about mid-grey (128), then brightness. torchvision shuffles these four and takes contrast
   about the image mean; the fixed order and centre keep every frame of a window on the same transform.
5. ``blur``: ``fn.gaussian_blur`` with a random sigma, applied with ``probability`` (a skipped sample gets
   a 1-tap kernel, which is the identity).
6. Hand-over: ``FHWC`` -> ``FCHW``. Plain float output is ``transpose / 255`` (bit-identical to
   LeRobot's ``frames.float() / 255``); with ``normalize`` it is one fused ``fn.crop_mirror_normalize``
   with mean and std scaled by 255; ``return_uint8`` is the transpose alone.

Why one draw per sample: a DALI argument input holds one value per sample, and an operator given a
sequence applies that value to every frame, so a window sees one crop, one rotation, one colour shift
-- as LeRobot's transforms do when applied to a (T, C, H, W) tensor. Velocity-like cues between frames
survive; only the sample-to-sample variety is random.

Why host draws: the random parameters are not drawn by DALI's random operators, whose streams restart
whenever a pipeline is built (so a resumed run would augment differently from the uninterrupted one) and
are the same on every rank. The external source computes them instead
(:func:`~lerobot_dali.augment_draws.draw_params`), each sample's from its own identity (seed, rank, epoch,
position in the rank's stream, camera stream), and hands them to this graph as ``draws``. With
``shared_across_cameras`` all cameras of a sample read the stream ``"shared"``, so they get the same draws.

Affine without a known size reads the frame shape at run time (``DataNode.shape``); on GPU frames that
needs DALI's dynamic executor (the default). Configure ``resize``, ``random_resized_crop`` or pass
``output_size`` to make the size static.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from types import ModuleType
from typing import Any, Literal, cast

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode

from .augment_draws import draw_names
from .errors import StatsError

__all__ = [
    "NORMALIZE_FROM_STATS",
    "AugmentConfig",
    "ColorJitter",
    "GaussianBlur",
    "Normalize",
    "RandomAffine",
    "RandomResizedCrop",
    "augment_frames",
    "checked_size",
    "leading_resize",
    "toml_parser",
]

_LOG = logging.getLogger(__name__)

Pair = tuple[float, float]

#: ``AugmentConfig.normalize`` value: each camera by its own mean/std in the dataset's statistics.
NORMALIZE_FROM_STATS = "stats"


# --------------------------------------------------------------------------------------------------
# Validation helpers: every message names the field, the value and what is allowed.


def toml_parser() -> ModuleType:
    """``tomllib`` (Python 3.11+), or ``tomli``, the same parser from PyPI and a dependency on 3.10, for the
    augmentation and recipe files."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    return tomllib


def _fail(owner: str, name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{owner}.{name} = {value!r} is invalid: expected {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pair(owner: str, name: str, value: Any, *, low: float, high: float, allowed: str) -> Pair:
    """A (lo, hi) range with low <= lo <= hi <= high."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        lo, hi = value
        if _is_number(lo) and _is_number(hi) and low <= lo <= hi <= high:
            return (float(lo), float(hi))
    raise _fail(owner, name, value, allowed)


def _jitter_range(owner: str, name: str, value: Any, *, center: float, low: float, high: float) -> Pair:
    """torchvision's convention: a bare number v means [max(low, center - v), center + v]."""
    allowed = f"a number >= 0 or a pair (lo, hi) with {low} <= lo <= hi <= {high}"
    if _is_number(value):
        if value < 0 or center + value > high:
            raise _fail(owner, name, value, allowed)
        return (max(low, center - value), center + value)
    return _pair(owner, name, value, low=low, high=high, allowed=allowed)


def checked_size(owner: str, name: str, value: Any) -> tuple[int, int]:
    """``value`` as an (H, W) pair of positive ints, or a ValueError naming ``owner.name``."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        h, w = value
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
            return (h, w)
    raise _fail(owner, name, value, "a pair (height, width) of positive integers")


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, kw_only=True)
class RandomResizedCrop:
    """Crop a random area fraction ``scale`` with aspect ratio ``ratio`` (width/height), resize to ``size``.

    ``scale`` and ``ratio`` mean what they mean in torchvision's ``RandomResizedCrop`` (same retries and
    centre-crop fallback) when ``AugmentConfig.resize`` gives the frame the crop cuts. Without a resize the
    crop cuts full frames of a size not known when the window is drawn: ``scale`` is still the area
    fraction, but ``ratio`` is relative to the frame's own aspect (see :mod:`lerobot_dali.augment_draws`).
    """

    size: tuple[int, int]
    scale: Pair = (0.08, 1.0)
    ratio: Pair = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _set(self, "size", checked_size(owner, "size", self.size))
        _set(self, "scale", _pair(owner, "scale", self.scale, low=1e-6, high=1.0, allowed="0 < lo <= hi <= 1"))
        _set(self, "ratio", _pair(owner, "ratio", self.ratio, low=1e-6, high=1e6, allowed="0 < lo <= hi"))


@dataclass(frozen=True, kw_only=True)
class ColorJitter:
    """torchvision ``ColorJitter`` ranges; each is stored as its (lo, hi) pair.

    ``brightness``/``contrast``/``saturation``: a number v draws a factor in [max(0, 1 - v), 1 + v]; a pair
    gives the range directly (factors >= 0). ``hue``: a number h <= 0.5 draws a shift in [-h, h] as a
    fraction of the colour circle; a pair gives it directly within [-0.5, 0.5]. 0 (the default) is off.
    """

    brightness: float | Pair = 0.0
    contrast: float | Pair = 0.0
    saturation: float | Pair = 0.0
    hue: float | Pair = 0.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("brightness", "contrast", "saturation"):
            _set(self, name, _jitter_range(owner, name, getattr(self, name), center=1.0, low=0.0, high=math.inf))
        _set(self, "hue", _jitter_range(owner, "hue", self.hue, center=0.0, low=-0.5, high=0.5))


@dataclass(frozen=True, kw_only=True)
class GaussianBlur:
    """Blur with sigma drawn in ``sigma`` (pixels), applied to a sample with ``probability``.

    ``kernel_size`` (odd) is fixed as in torchvision; by default it covers 3 sigma of the largest sigma.
    """

    sigma: float | Pair = (0.1, 2.0)
    probability: float = 1.0
    kernel_size: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        sigma: Any = (self.sigma, self.sigma) if _is_number(self.sigma) else self.sigma
        _set(self, "sigma", _pair(owner, "sigma", sigma, low=1e-6, high=1e6, allowed="a number > 0 or 0 < lo <= hi"))
        if not _is_number(self.probability) or not 0.0 <= self.probability <= 1.0:
            raise _fail(owner, "probability", self.probability, "a number in [0, 1]")
        _set(self, "probability", float(self.probability))
        k = self.kernel_size
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1 or k % 2 == 0):
            raise _fail(owner, "kernel_size", k, "None or an odd integer >= 1")

    @property
    def effective_kernel_size(self) -> int:
        hi = _range_of(self.sigma)[1]
        return self.kernel_size if self.kernel_size is not None else 2 * math.ceil(3 * hi) + 1


@dataclass(frozen=True, kw_only=True)
class RandomAffine:
    """torchvision ``RandomAffine`` without shear: rotate and scale about the centre, then translate.

    ``degrees``: a number d draws in [-d, d], or a pair; positive turns counter-clockwise as in
    torchvision. ``translate``: maximum shift as a fraction of (width, height). ``scale``: isotropic factor
    range. Areas uncovered by the moved image are 0.
    """

    degrees: float | Pair = 0.0
    translate: Pair = (0.0, 0.0)
    scale: Pair = (1.0, 1.0)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _set(self, "degrees", _jitter_range(owner, "degrees", self.degrees, center=0.0, low=-180.0, high=180.0))
        translate = self.translate
        if not (
            isinstance(translate, Sequence)
            and len(translate) == 2
            and all(_is_number(t) and 0.0 <= t <= 1.0 for t in translate)
        ):
            raise _fail(owner, "translate", translate, "a pair (fx, fy) of fractions in [0, 1]")
        _set(self, "translate", (float(translate[0]), float(translate[1])))
        _set(self, "scale", _pair(owner, "scale", self.scale, low=1e-6, high=1e6, allowed="0 < lo <= hi"))


@dataclass(frozen=True, kw_only=True)
class Normalize:
    """Per-channel ``(x - mean) / std`` with x in [0, 1], as LeRobot's stats are computed."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("mean", "std"):
            value = getattr(self, name)
            ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
            ok = ok and all(_is_number(v) and (name == "mean" or v > 0) for v in value)
            if not ok:
                bound = "finite numbers" if name == "mean" else "numbers > 0"
                raise _fail(owner, name, value, f"a non-empty list of {bound}, one per channel")
            _set(self, name, tuple(float(v) for v in value))
        if len(self.mean) != len(self.std):
            raise _fail(owner, "std", self.std, f"as many values as mean ({len(self.mean)})")

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], key: str) -> Normalize:
        """Read ``meta/stats.json``'s ``{key: {"mean": [[[r]], [[g]], [[b]]], "std": ...}}`` (shape (C, 1, 1))."""
        if key not in stats:
            cameras = sorted(k for k, v in stats.items() if isinstance(v, Mapping) and "mean" in v)
            raise ValueError(f"stats have no entry {key!r}; entries with a mean: {cameras}")
        entry = stats[key]
        values: dict[str, list[float]] = {}
        for name in ("mean", "std"):
            if not isinstance(entry, Mapping) or name not in entry:
                raise ValueError(f"stats[{key!r}] has no {name!r}; expected {{'mean': ..., 'std': ...}}")
            array = np.asarray(entry[name], dtype=np.float64)
            if array.ndim not in (1, 3) or array.shape[1:] not in ((), (1, 1)):
                raise ValueError(f"stats[{key!r}][{name!r}] has shape {array.shape}; expected (C, 1, 1) or (C,)")
            values[name] = array.reshape(-1).tolist()
        return cls(mean=tuple(values["mean"]), std=tuple(values["std"]))


#: The options that are one table each; ``normalize`` (a table, a table per camera, or ``"stats"``) is read
#: on its own.
_SECTIONS: dict[str, type] = {
    "random_resized_crop": RandomResizedCrop,
    "color_jitter": ColorJitter,
    "blur": GaussianBlur,
    "affine": RandomAffine,
}


@dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    """Which augmentations run, in the fixed order of this module's docstring. The default does nothing.

    ``shared_across_cameras``: the cameras of one sample get the same draws (same crop, same jitter),
    which keeps multi-view geometry consistent; otherwise each camera draws on its own, as LeRobot does.

    ``normalize``: one :class:`Normalize` for every camera; ``{camera key: Normalize}``, one per camera; or
    ``"stats"``, each camera by its own mean/std in the dataset's statistics (as LeRobot's policies normalise
    images), which :class:`~lerobot_dali.DALILeRobotIterator` reads when it opens the dataset
    (:meth:`with_stats`).
    """

    resize: tuple[int, int] | None = None
    random_resized_crop: RandomResizedCrop | None = None
    affine: RandomAffine | None = None
    color_jitter: ColorJitter | None = None
    blur: GaussianBlur | None = None
    normalize: Normalize | Mapping[str, Normalize] | Literal["stats"] | None = None
    shared_across_cameras: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.resize is not None:
            _set(self, "resize", checked_size(owner, "resize", self.resize))
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                raise _fail(owner, name, value, f"None or a {cls.__name__}")
        norm = self.normalize
        if isinstance(norm, Mapping):
            if not norm or not all(isinstance(k, str) and isinstance(v, Normalize) for k, v in norm.items()):
                raise _fail(owner, "normalize", norm, "a non-empty {camera key: Normalize} mapping")
            _set(self, "normalize", dict(norm))
        elif norm is not None and norm != NORMALIZE_FROM_STATS and not isinstance(norm, Normalize):
            allowed = f"None, a Normalize, a {{camera key: Normalize}} mapping, or {NORMALIZE_FROM_STATS!r}"
            raise _fail(owner, "normalize", norm, allowed)
        if not isinstance(self.shared_across_cameras, bool):
            raise _fail(owner, "shared_across_cameras", self.shared_across_cameras, "true or false")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AugmentConfig:
        """Build from plain data (a TOML table); unknown keys are rejected by name.

        ``normalize`` is ``"stats"``, a table with ``mean`` and ``std``, or a table of such tables by camera key.
        """
        kwargs = _checked_keys(cls, raw, cls.__name__)
        for name, section in _SECTIONS.items():
            if kwargs.get(name) is not None:
                kwargs[name] = section(**_checked_keys(section, kwargs[name], f"{cls.__name__}.{name}"))
        norm = kwargs.get("normalize")
        where = f"{cls.__name__}.normalize"
        if isinstance(norm, Mapping) and norm and all(isinstance(v, Mapping) for v in norm.values()):
            kwargs["normalize"] = {k: Normalize(**_checked_keys(Normalize, v, f"{where}.{k}")) for k, v in norm.items()}
        elif isinstance(norm, Mapping):
            kwargs["normalize"] = Normalize(**_checked_keys(Normalize, norm, where))
        return cls(**kwargs)

    def with_stats(self, stats: Mapping[str, Any], cameras: Sequence[str], *, source: str) -> AugmentConfig:
        """``normalize="stats"`` made concrete: one :class:`Normalize` per camera from ``stats`` (a dataset's
        ``meta/stats.json`` content, see :func:`~lerobot_dali.dataset_stats.read_dataset_stats`). Any other
        config is returned as it is. ``source`` names the dataset in errors."""
        if self.normalize != NORMALIZE_FROM_STATS:
            return self
        per_camera = {}
        for camera in cameras:
            try:
                per_camera[camera] = Normalize.from_stats(stats, camera)
            except ValueError as e:
                raise StatsError(
                    f"{source}: normalize='stats' needs the mean/std of camera {camera!r} from meta/stats.json "
                    f"(or v2.1's meta/episodes_stats.jsonl), but {e}. Give AugmentConfig.normalize a Normalize "
                    "(e.g. ImageNet's), one per camera, or leave it unset."
                ) from e
        return replace(self, normalize=per_camera or None)  # no cameras: nothing to normalise

    def for_channels(self, channels: int) -> AugmentConfig:
        """This config for frames of ``channels`` channels: grey ones (1) keep brightness and contrast jitter only,
        since saturation and hue leave grey unchanged (as torchvision's do); so those are neither applied nor
        drawn."""
        jitter = self.color_jitter
        if channels != 1 or jitter is None:
            return self
        return replace(self, color_jitter=replace(jitter, saturation=0.0, hue=0.0))

    def for_camera(self, camera: str) -> AugmentConfig:
        """This config with ``normalize`` narrowed to ``camera``'s :class:`Normalize` (what the graph of one
        camera applies)."""
        norm = self.normalize
        if norm == NORMALIZE_FROM_STATS:
            raise ValueError("normalize='stats' reads the dataset's statistics: resolve it with with_stats() first")
        if isinstance(norm, Mapping):
            if camera not in norm:
                raise ValueError(
                    f"AugmentConfig.normalize has no Normalize for camera {camera!r}; it has {sorted(norm)}. "
                    "Give one for every camera, or one Normalize for all."
                )
            return replace(self, normalize=norm[camera])
        return self

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], *, table: str | None = None) -> AugmentConfig:
        """Read a TOML file: the whole document, or its ``table`` (e.g. ``"augment"`` in a recipe)."""
        with open(path, "rb") as f:
            document = toml_parser().load(f)
        if table is not None:
            if not isinstance(document.get(table), Mapping):
                raise ValueError(f"{os.fspath(path)} has no [{table}] table; tables: {sorted(document)}")
            document = document[table]
        return cls.from_dict(document)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for TOML/JSON: tuples become lists, unset sections are left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, Mapping):
                value = {camera: _section_dict(norm) for camera, norm in value.items()}
            elif f.name in _SECTIONS or isinstance(value, Normalize):
                value = _section_dict(value)
            out[f.name] = _plain(value)
        return out


def _section_dict(section: Any) -> dict[str, Any]:
    return {g.name: _plain(getattr(section, g.name)) for g in fields(section) if getattr(section, g.name) is not None}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _checked_keys(cls: type, raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} = {raw!r} is invalid: expected a table of options")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(known)}")
    missing = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in raw]
    if missing:
        raise ValueError(f"{where} is missing required key(s) {missing}")
    return dict(raw)


# --------------------------------------------------------------------------------------------------
# The graph


def _range_of(value: float | Pair) -> Pair:
    # Options store pairs after __post_init__; this only narrows the declared input type.
    return value if isinstance(value, tuple) else (value, value)


Arg = float | DataNode  # an operator argument: a constant, or a per-sample draw


def leading_resize(config: AugmentConfig | None, output_size: tuple[int, int] | None) -> tuple[int, int] | None:
    """(H, W) of the deterministic resize :func:`augment_frames` applies first, or None when there is none.

    This is the only step that sees the full decoded frame: every later step (crop, affine, jitter, blur)
    works on its output. So whoever decodes the frames may do this resize instead of the graph
    (``augment_frames(presized=True)``) without changing what the later steps see. None when
    ``output_size`` goes to a random crop that must cut the full frame.
    """
    cfg = config if config is not None else AugmentConfig()
    if output_size is not None and cfg.random_resized_crop is None:
        return checked_size("leading_resize", "output_size", output_size)
    return cfg.resize


def augment_frames(
    frames: DataNode,
    *,
    config: AugmentConfig | None,
    camera_index: int,
    draws: Mapping[str, DataNode] | None = None,
    return_uint8: bool = False,
    output_size: tuple[int, int] | None = None,
    presized: bool = False,
    channels: int = 3,
) -> DataNode:
    """Augment one camera's ``FHWC`` uint8 windows and hand them over as ``FCHW`` (see module docstring).

    ``draws``: ``name -> DataNode`` for every name of :func:`~lerobot_dali.augment_draws.draw_names`
    (``config``), the per-sample random parameters of this camera's stream (CPU argument inputs, e.g. external
    source outputs filled by :func:`~lerobot_dali.augment_draws.draw_params`); not needed when nothing is
    random. ``output_size`` (H, W) replaces the size of the last resampling step (the random crop's, else the
    resize's), or adds a resize when neither is configured, so cameras can be brought to one size without
    resampling twice. ``presized``: the frames already have the :func:`leading_resize` size (the decoding
    worker resized them), so that step is skipped. ``channels``: 1 for grey frames, whose colour jitter is
    brightness and contrast only (saturation and hue leave grey unchanged, as in torchvision).
    Call inside a pipeline definition; works on ``cpu`` and ``gpu`` frames alike.
    """
    if not isinstance(frames, DataNode):
        raise TypeError(f"frames must be a DALI DataNode (inside a pipeline definition), got {type(frames).__name__}")
    if not isinstance(camera_index, int) or isinstance(camera_index, bool) or camera_index < 0:
        raise ValueError(f"camera_index = {camera_index!r} is invalid: expected an integer >= 0")
    cfg = config if config is not None else AugmentConfig()
    if not isinstance(cfg, AugmentConfig):
        raise TypeError(f"config must be an AugmentConfig or None, got {type(cfg).__name__}")
    if output_size is not None:
        output_size = checked_size("augment_frames", "output_size", output_size)
    normalize = cfg.normalize
    if normalize is not None and not isinstance(normalize, Normalize):
        raise ValueError(
            f"camera {camera_index}: augment_frames applies one Normalize, but config.normalize is {normalize!r}; "
            "pass config.for_camera(camera_key) (after with_stats() for 'stats')"
        )
    if return_uint8 and normalize is not None:
        raise ValueError(
            "return_uint8=True cannot be combined with AugmentConfig.normalize: normalised values do not fit "
            "uint8. Drop normalize (normalise in the policy) or return float32."
        )
    d = _checked_draws(cfg, draws, camera_index)

    x = frames
    size: tuple[int, int] | None = None  # (H, W) after geometry, when known while building the graph
    steps: list[str] = []

    resize_to = leading_resize(cfg, output_size)
    crop = cfg.random_resized_crop
    crop_size = crop.size if crop is not None else None
    if output_size is not None and crop is not None:
        crop_size = output_size
    if presized and resize_to is None:
        raise ValueError(
            "presized=True needs a leading resize (AugmentConfig.resize, or output_size without a random crop); "
            "with none, the frames must arrive at full size"
        )

    if resize_to is not None:
        if not presized:
            x = cast(DataNode, fn.resize(x, size=list(resize_to), antialias=True))  # one output without save_attrs
        size = resize_to
        steps.append(f"resize{resize_to}" + (" (in the worker)" if presized else ""))
    if crop is not None and crop_size is not None:
        x = cast(
            DataNode,
            fn.resize(
                x,
                size=list(crop_size),
                roi_start=d["crop_start"],
                roi_end=d["crop_end"],
                roi_relative=True,
                antialias=True,
            ),
        )
        size = crop_size
        steps.append(f"random_resized_crop{crop_size}" + ("" if cfg.resize else " (window relative to the frame)"))
    if cfg.affine is not None:
        x = _affine(x, cfg.affine, size, d)
        steps.append("affine")
    if cfg.color_jitter is not None:
        x = _color_jitter(x, cfg.color_jitter, d, grey=channels == 1)
        steps.append("color_jitter")
    if cfg.blur is not None and cfg.blur.probability > 0:
        x = _blur(x, cfg.blur, d)
        steps.append("blur")
    _LOG.debug("camera %d augmentation: %s", camera_index, " -> ".join(steps) or "none")
    return _hand_over(x, normalize, return_uint8)


def _checked_draws(cfg: AugmentConfig, draws: Mapping[str, DataNode] | None, camera_index: int) -> dict[str, DataNode]:
    needed = draw_names(cfg)
    given = dict(draws) if draws is not None else {}
    missing = [n for n in needed if n not in given]
    unexpected = sorted(set(given) - set(needed))
    if missing or unexpected:
        raise ValueError(
            f"camera {camera_index}: the augmentation config draws {list(needed)} per sample, but draws holds "
            f"{sorted(given)} (missing {missing}, unexpected {unexpected}). Feed each as an external source "
            "output computed by lerobot_dali.augment_draws.draw_params with the same config."
        )
    for name, node in given.items():
        if not isinstance(node, DataNode):
            raise TypeError(f"draws[{name!r}] must be a DALI DataNode, got {type(node).__name__}")
    return given


def _param(d: Mapping[str, DataNode], name: str, value: float | Pair) -> Arg:
    """The draw ``name`` when its range is random, else the range's constant."""
    lo, hi = _range_of(value)
    return lo if lo == hi else d[name]


def _affine(x: DataNode, affine: RandomAffine, size: tuple[int, int] | None, d: Mapping[str, DataNode]) -> DataNode:
    scale, degrees, translate = _range_of(affine.scale), _range_of(affine.degrees), affine.translate
    if scale == (1.0, 1.0) and degrees == (0.0, 0.0) and translate == (0.0, 0.0):
        return x
    if size is not None:
        wh: np.ndarray | DataNode = np.array([size[1], size[0]], dtype=np.float32)
        center: Any = [size[1] / 2, size[0] / 2]
    else:
        shape = x.shape(dtype=types.DALIDataType.FLOAT)  # F, H, W, C
        wh = fn.stack(shape[2], shape[1])
        center = wh * 0.5
    matrix = None  # chained: each fn.transforms.* appends to the previous transform
    if scale != (1.0, 1.0):
        s = _param(d, "affine_scale", scale)
        matrix = fn.transforms.scale(scale=fn.stack(s, s) if isinstance(s, DataNode) else [s, s], center=center)
    if degrees != (0.0, 0.0):
        # DALI turns clockwise on screen for a positive angle (y points down); torchvision the other way.
        angle = _param(d, "affine_degrees", degrees)
        args = () if matrix is None else (matrix,)
        matrix = fn.transforms.rotation(*args, angle=-angle, center=center)
    if translate != (0.0, 0.0):
        fraction = d["affine_translate"]  # (dx, dy) as fractions of (width, height)
        offset = fraction * (types.Constant(wh) if isinstance(wh, np.ndarray) else wh)
        args = () if matrix is None else (matrix,)
        matrix = fn.transforms.translation(*args, offset=offset)
    return fn.warp_affine(x, matrix=matrix, inverse_map=False, fill_value=0.0)


def _color_jitter(x: DataNode, jitter: ColorJitter, d: Mapping[str, DataNode], *, grey: bool = False) -> DataNode:
    def arg(name: str, identity: Pair) -> Arg | None:
        value = _range_of(getattr(jitter, name))
        return None if value == identity else _param(d, name, value)

    brightness, contrast = arg("brightness", (1.0, 1.0)), arg("contrast", (1.0, 1.0))
    if grey:  # color_twist takes RGB only; on equal R=G=B it equals brightness_contrast within 1 level
        if brightness is None and contrast is None:
            return x
        return fn.brightness_contrast(x, brightness=brightness, contrast=contrast)
    saturation, hue = arg("saturation", (1.0, 1.0)), arg("hue", (0.0, 0.0))
    if brightness is None and contrast is None and saturation is None and hue is None:
        return x
    hue_degrees = None if hue is None else hue * 360.0  # the config's fraction of the circle; DALI: degrees
    # DALI leaves an argument given as None at its default (no change).
    return fn.color_twist(x, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue_degrees)


def _blur(x: DataNode, blur: GaussianBlur, d: Mapping[str, DataNode]) -> DataNode:
    sigma = _param(d, "blur_sigma", blur.sigma)
    # A sample the probability skips gets a 1-tap kernel, which leaves it untouched.
    window: int | DataNode = blur.effective_kernel_size if blur.probability >= 1.0 else d["blur_window"]
    return fn.gaussian_blur(x, window_size=window, sigma=sigma)


def _hand_over(x: DataNode, normalize: Normalize | None, return_uint8: bool) -> DataNode:
    if normalize is not None:
        return fn.crop_mirror_normalize(
            x,
            dtype=types.DALIDataType.FLOAT,
            output_layout="FCHW",
            mean=[m * 255.0 for m in normalize.mean],
            std=[s * 255.0 for s in normalize.std],
        )
    chw = fn.transpose(x, perm=[0, 3, 1, 2], output_layout="FCHW")
    # True division, not cmn's multiply by 1/255, so values match LeRobot's float()/255 bit for bit.
    return chw if return_uint8 else chw / 255
