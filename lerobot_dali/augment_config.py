"""Augmentation options: frozen dataclasses validated on construction, loadable from TOML.

Apart from the graph (:mod:`.augment`) so that configs, recipes and the command line build and check them
without importing DALI. What each option does to the frames is described in :mod:`.augment`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from types import ModuleType
from typing import Any, Literal

import numpy as np

from .errors import StatsError
from .frozen_mapping import FrozenMapping
from .said_once import warn_once
from .value_checks import is_int, is_number, plain_data

__all__ = [
    "NORMALIZE_FROM_STATS",
    "SUBSET_MEMBERS",
    "AugmentConfig",
    "ColorJitter",
    "GaussianBlur",
    "Normalize",
    "Pair",
    "RandomAffine",
    "RandomResizedCrop",
    "RandomSubset",
    "SharpnessJitter",
    "checked_size",
    "range_of",
    "refuse_uint8_normalize",
    "toml_parser",
]

logger = logging.getLogger(__name__)

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


def _listed(value: Any) -> tuple[Any, ...] | None:
    """A list, tuple or 1-D numpy array as a tuple (its items unchecked); None for anything else, a str included."""
    if isinstance(value, np.ndarray):
        return tuple(value.tolist()) if value.ndim == 1 else None
    return tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else None


def _pair(owner: str, name: str, value: Any, *, low: float, high: float, allowed: str) -> Pair:
    """A (lo, hi) range with low <= lo <= hi <= high."""
    listed = _listed(value)
    if listed is not None and len(listed) == 2:
        lo, hi = listed
        if is_number(lo) and is_number(hi) and low <= lo <= hi <= high:
            return (float(lo), float(hi))
    raise _fail(owner, name, value, allowed)


def _jitter_range(owner: str, name: str, value: Any, *, center: float, low: float, high: float) -> Pair:
    """torchvision's convention: a bare number v means [max(low, center - v), center + v]."""
    allowed = f"a number >= 0 or a pair (lo, hi) with {low} <= lo <= hi <= {high}"
    if is_number(value):
        if value < 0 or center + value > high:
            raise _fail(owner, name, value, allowed)
        return (float(max(low, center - value)), float(center + value))
    return _pair(owner, name, value, low=low, high=high, allowed=allowed)


def checked_size(owner: str, name: str, value: Any) -> tuple[int, int]:
    """``value`` as an (H, W) pair of positive ints, or a ValueError naming ``owner.name``."""
    listed = _listed(value)
    if listed is not None and len(listed) == 2:
        h, w = listed
        if all(is_int(v) and v > 0 for v in (h, w)):
            return (int(h), int(w))
    raise _fail(owner, name, value, "a pair (height, width) of positive integers")


def refuse_uint8_normalize(return_uint8: bool, normalize: object) -> None:
    """ValueError where normalised frames would be handed out as uint8, which cannot hold them."""
    if return_uint8 and normalize is not None:
        raise ValueError(
            "return_uint8=True cannot be combined with AugmentConfig.normalize: normalised values do not fit "
            "uint8. Drop normalize (normalise in the policy) or return float32."
        )


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, kw_only=True)
class RandomResizedCrop:
    """Crop a random area fraction ``scale`` with aspect ratio ``ratio`` (width/height), resize to ``size``.

    ``scale`` and ``ratio`` mean what they mean in torchvision's ``RandomResizedCrop`` (same retries and
    centre-crop fallback) when ``AugmentConfig.resize`` gives the frame the crop cuts: the window is whole pixels,
    cut and then resized (antialiased bilinear), within a level of torchvision's inside the output; at its outer
    pixel a shrinking resize's border filter differs, more the more it shrinks (on smooth frames up to 6 levels of
    255 shrunk up to 2x, 13 up to 4x, 22 at 14x). Without a resize the crop cuts full frames of a size not known
    when the window is drawn: ``scale`` is still the area fraction, but ``ratio`` is relative to the frame's own
    aspect (see :mod:`lerobot_dali.augment_draws`), and the window, not on whole pixels, is resized as a region of
    the frame: output pixels at its edge blend in the frame just beyond it (30 % of the pixel beyond at a 2.5x
    enlargement).
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

    The ranges are torchvision's, the hue's effect is not: DALI turns the chroma plane (YIQ), which keeps a
    pixel's luma where no channel clips, while torchvision shifts the HSV hue, which keeps its largest channel.
    Colours turn the same way by other amounts: pure red at hue 1/6 becomes (128, 111, 0), not torchvision's
    yellow; on the frames of ``r1_v30_h264`` at hue 0.05 the two differ by 4 levels on average (torchvision's
    own change: 2.3).
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
        sigma: Any = (self.sigma, self.sigma) if is_number(self.sigma) else self.sigma
        _set(self, "sigma", _pair(owner, "sigma", sigma, low=1e-6, high=1e6, allowed="a number > 0 or 0 < lo <= hi"))
        if not is_number(self.probability) or not 0.0 <= self.probability <= 1.0:
            raise _fail(owner, "probability", self.probability, "a number in [0, 1]")
        _set(self, "probability", float(self.probability))
        k = self.kernel_size
        if k is not None and (not is_int(k) or k < 1 or k % 2 == 0):
            raise _fail(owner, "kernel_size", k, "None or an odd integer >= 1")
        _set(self, "kernel_size", None if k is None else int(k))

    @property
    def effective_kernel_size(self) -> int:
        hi = range_of(self.sigma)[1]
        return self.kernel_size if self.kernel_size is not None else 2 * math.ceil(3 * hi) + 1


@dataclass(frozen=True, kw_only=True)
class RandomAffine:
    """torchvision ``RandomAffine`` without shear: rotate and scale about the centre, then translate.

    ``degrees``: a number d draws in [-d, d], or a pair; positive turns clockwise on screen, as torchvision's
    ``RandomAffine`` does (its ``rotate`` turns the other way). ``translate``: maximum shift as a fraction of
    (width, height). ``scale``: isotropic factor range. Areas uncovered by the moved image are 0. Unlike
    torchvision's defaults, frames are resampled bilinearly (not nearest) and shifted by fractions of a pixel
    (not rounded to whole pixels).
    """

    degrees: float | Pair = 0.0
    translate: Pair = (0.0, 0.0)
    scale: Pair = (1.0, 1.0)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _set(self, "degrees", _jitter_range(owner, "degrees", self.degrees, center=0.0, low=-180.0, high=180.0))
        translate = _listed(self.translate)
        if translate is None or len(translate) != 2 or not all(is_number(t) and 0.0 <= t <= 1.0 for t in translate):
            raise _fail(owner, "translate", self.translate, "a pair (fx, fy) of fractions in [0, 1]")
        _set(self, "translate", (float(translate[0]), float(translate[1])))
        _set(self, "scale", _pair(owner, "scale", self.scale, low=1e-6, high=1e6, allowed="0 < lo <= hi"))


@dataclass(frozen=True, kw_only=True)
class SharpnessJitter:
    """LeRobot's ``SharpnessJitter``: torchvision's ``adjust_sharpness`` with a factor drawn in ``factor``.

    The frame is blended with its 3x3 smoothed copy (kernel ``[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13``; the
    one-pixel border keeps its values): 0 gives the smoothed frame, 1 the frame, 2 doubles its detail. A number v
    draws in [max(0, 1 - v), 1 + v]; a pair gives the range (factors >= 0).
    """

    factor: float | Pair

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _set(self, "factor", _jitter_range(owner, "factor", self.factor, center=1.0, low=0.0, high=math.inf))


#: The transforms :class:`RandomSubset` picks among, each one of LeRobot's: a single colour-jitter factor, the
#: sharpness jitter, or the whole affine (rotation, scale and translation together).
SUBSET_MEMBERS = ("brightness", "contrast", "saturation", "hue", "sharpness", "affine")

#: The section each subset member lives in.
_MEMBER_SECTION = {**dict.fromkeys(SUBSET_MEMBERS[:4], "color_jitter"), "sharpness": "sharpness", "affine": "affine"}


@dataclass(frozen=True, kw_only=True)
class RandomSubset:
    """Apply only ``max_num_transforms`` of the weighted transforms to each sample, as LeRobot's
    ``RandomSubsetApply`` does: a draw without replacement with probabilities in proportion to ``weights``
    (``{member: weight > 0}``, members from :data:`SUBSET_MEMBERS`), so a transform of weight 2 is picked first
    twice as often as one of weight 1. A transform not picked gets its identity (factor 1, shift 0) for that
    sample; transforms not weighted here (crop, blur, an unweighted factor) apply to every sample. The picked
    ones still run in the fixed order of :mod:`lerobot_dali.augment` (LeRobot's ``random_order=False``).
    ``max_num_transforms`` above the number of weights means all of them, as in LeRobot. The weights are kept
    read-only (:class:`~lerobot_dali.frozen_mapping.FrozenMapping`), so the config hashes as a frozen one should.
    """

    max_num_transforms: int
    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        n = self.max_num_transforms
        if not is_int(n) or n < 1:
            raise _fail(owner, "max_num_transforms", n, "an integer >= 1")
        _set(self, "max_num_transforms", int(n))
        weights = self.weights
        if (
            not isinstance(weights, Mapping)
            or not weights
            or not all(k in SUBSET_MEMBERS and is_number(v) and v > 0 for k, v in weights.items())
        ):
            allowed = f"a non-empty {{member: weight > 0}} mapping, members from {list(SUBSET_MEMBERS)}"
            raise _fail(owner, "weights", weights, allowed)
        _set(self, "weights", FrozenMapping({m: float(weights[m]) for m in SUBSET_MEMBERS if m in weights}))

    @property
    def count(self) -> int:
        """How many transforms each sample gets."""
        return min(self.max_num_transforms, len(self.weights))


#: What LeRobot adds to every std it normalises by; here, what a std of 0 in a dataset's statistics becomes.
STD_EPSILON = 1e-8


@dataclass(frozen=True, kw_only=True)
class Normalize:
    """Per-channel ``(x - mean) / std`` with x in [0, 1], as LeRobot's stats are computed."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("mean", "std"):
            value = getattr(self, name)
            listed = _listed(value)
            if not listed or not all(is_number(v) and (name == "mean" or v > 0) for v in listed):
                bound = "finite numbers" if name == "mean" else "numbers > 0"
                raise _fail(owner, name, value, f"a non-empty list of {bound}, one per channel")
            _set(self, name, tuple(float(v) for v in listed))
        if len(self.mean) != len(self.std):
            raise _fail(owner, "std", self.std, f"as many values as mean ({len(self.mean)})")

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], key: str) -> Normalize:
        """Read ``meta/stats.json``'s ``{key: {"mean": [[[r]], [[g]], [[b]]], "std": ...}}`` (shape (C, 1, 1))."""
        if not stats:  # (read_dataset_stats' answer where there is no file)
            raise ValueError("the dataset has neither file")
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
        if len(values["mean"]) != len(values["std"]):  # (said of the entry: Normalize would blame the std alone)
            raise ValueError(
                f"stats[{key!r}] holds {len(values['mean'])} mean values and {len(values['std'])} std values; "
                "expected one of each per channel"
            )
        constant = [channel for channel, std in enumerate(values["std"]) if std == 0]
        if constant:  # (a dead or masked camera channel): LeRobot divides by std + 1e-8 and carries on
            warn_once(logger,
                "stats[%r]: std is 0 in channel(s) %s (constant across the dataset): dividing by %g there, as "
                "LeRobot's normalisation (std + %g) does; a frame that differs from the mean there becomes huge",
                key, constant, STD_EPSILON, STD_EPSILON,
            )  # fmt: skip
            values["std"] = [std or STD_EPSILON for std in values["std"]]
        return cls(mean=tuple(values["mean"]), std=tuple(values["std"]))


def _grey(norm: Normalize, camera: str, source: str) -> Normalize:
    """A grey camera's ``norm`` of 3 values (LeRobot 0.4.4 writes every camera's statistics over its frames as RGB:
    3 equal values for grey ones) as one value. LeRobot's normaliser broadcasts them over the camera's one channel:
    3 channels, each this one normalised by that value. Values that differ would make 3 different channels, which
    a 1-channel frame is not: refused."""
    if len(set(norm.mean)) == 1 and len(set(norm.std)) == 1:
        return Normalize(mean=norm.mean[:1], std=norm.std[:1])
    raise StatsError(
        f"{source}: normalize='stats': camera {camera!r} is grey (1 channel) but its statistics hold 3 different "
        f"values (mean {list(norm.mean)}, std {list(norm.std)}); LeRobot's normaliser would broadcast them into 3 "
        "differently normalised copies of the channel. Give the camera one value (normalize={camera: "
        "Normalize(mean=[m], std=[s])}), or recompute its statistics over its grey frames (3 equal values)"
    )


#: The options that are one table each; ``normalize`` (a table, a table per camera, or ``"stats"``) is read
#: on its own.
_SECTIONS: dict[str, type] = {
    "random_resized_crop": RandomResizedCrop,
    "color_jitter": ColorJitter,
    "blur": GaussianBlur,
    "affine": RandomAffine,
    "sharpness": SharpnessJitter,
    "random_subset": RandomSubset,
}


@dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    """Which augmentations run, in the fixed order :mod:`lerobot_dali.augment` describes. The default does
    nothing.

    ``random_subset``: each sample applies only some of the jitters and the affine, picked as LeRobot's
    ``max_num_transforms`` and weights pick them (:class:`RandomSubset`); :meth:`from_lerobot` maps a LeRobot
    ``ImageTransformsConfig``.

    ``shared_across_cameras``: the cameras of one sample get the same draws (same crop, same jitter),
    which keeps multi-view geometry consistent; otherwise each camera draws on its own, as LeRobot does.

    ``normalize``: one :class:`Normalize` for every camera; ``{camera key: Normalize}``, one per camera; or
    ``"stats"``, each camera by its own mean/std in the dataset's statistics (as LeRobot's policies normalise
    images), which :class:`~lerobot_dali.DALILeRobotIterator` reads when it opens the dataset
    (:meth:`with_stats`). A table per camera is kept read-only, as RandomSubset's weights are.
    """

    resize: tuple[int, int] | None = None
    random_resized_crop: RandomResizedCrop | None = None
    affine: RandomAffine | None = None
    color_jitter: ColorJitter | None = None
    sharpness: SharpnessJitter | None = None
    blur: GaussianBlur | None = None
    random_subset: RandomSubset | None = None
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
        if self.random_subset is not None:
            for member in self.random_subset.weights:
                section = _MEMBER_SECTION[member]
                if getattr(self, section) is None:
                    raise ValueError(
                        f"{owner}.random_subset weights {member!r}, but {owner}.{section} is not set: configure it "
                        f"or drop the weight"
                    )
        norm = self.normalize
        if isinstance(norm, Mapping):
            if not norm or not all(isinstance(k, str) and isinstance(v, Normalize) for k, v in norm.items()):
                raise _fail(owner, "normalize", norm, "a non-empty {camera key: Normalize} mapping")
            _set(self, "normalize", FrozenMapping(norm))
        elif norm is not None and norm != NORMALIZE_FROM_STATS and not isinstance(norm, Normalize):
            allowed = f"None, a Normalize, a {{camera key: Normalize}} mapping, or {NORMALIZE_FROM_STATS!r}"
            raise _fail(owner, "normalize", norm, allowed)
        if not isinstance(self.shared_across_cameras, bool):
            raise _fail(owner, "shared_across_cameras", self.shared_across_cameras, "true or false")
        if self.resize is not None and self.random_resized_crop is not None:
            _refuse_empty_crop(owner, self.resize, self.random_resized_crop.ratio)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AugmentConfig:
        """Build from plain data (a TOML table); unknown keys are rejected by name.

        ``normalize`` is ``"stats"``, a table with ``mean`` and ``std``, or a table of such tables by camera key
        (TOML's ``[normalize.observation.images.top]``, quoted or not: nested tables join into the dotted key).
        """
        kwargs = _checked_keys(cls, raw, cls.__name__)
        for name, section in _SECTIONS.items():
            if kwargs.get(name) is not None:
                kwargs[name] = section(**_checked_keys(section, kwargs[name], f"{cls.__name__}.{name}"))
        norm = kwargs.get("normalize")
        where = f"{cls.__name__}.normalize"
        if isinstance(norm, Mapping) and norm and all(isinstance(v, Mapping) for v in norm.values()):
            cameras = _camera_tables(norm)
            kwargs["normalize"] = {
                k: Normalize(**_checked_keys(Normalize, v, f"{where}.{k}")) for k, v in cameras.items()
            }
        elif isinstance(norm, Mapping):
            kwargs["normalize"] = Normalize(**_checked_keys(Normalize, norm, where))
        return cls(**kwargs)

    @classmethod
    def from_lerobot(cls, image_transforms: object) -> AugmentConfig:
        """LeRobot's ``ImageTransformsConfig`` (or its dict form in a train config) as this config; what maps and
        what differs: :func:`~lerobot_dali.augment_lerobot.augment_config_from_lerobot`."""
        from .augment_lerobot import augment_config_from_lerobot  # it builds on this module

        return augment_config_from_lerobot(image_transforms)

    def with_stats(
        self,
        stats: Mapping[str, Any],
        cameras: Sequence[str],
        *,
        source: str,
        channels: Mapping[str, int] | None = None,
    ) -> AugmentConfig:
        """``normalize="stats"`` made concrete: one :class:`Normalize` per camera from ``stats`` (a dataset's
        ``meta/stats.json`` content, see :func:`~lerobot_dali.dataset_stats.read_dataset_stats`). Any other
        config is returned as it is. ``source`` names the dataset in errors; ``channels`` gives the cameras of
        other than 3 channels: a grey one (1) takes LeRobot's 3 statistics values as one (:func:`_grey`)."""
        if self.normalize != NORMALIZE_FROM_STATS:
            return self
        per_camera = {}
        for camera in cameras:
            count = (channels or {}).get(camera, 3)
            try:
                norm = Normalize.from_stats(stats, camera)
                if len(norm.mean) not in (1, count, 3 if count == 1 else count):  # (a grey one's 3: _grey)
                    raise ValueError(
                        f"stats[{camera!r}] holds {len(norm.mean)} mean/std values for the camera's {count} "
                        "channel(s); expected one per channel, or one for all"
                    )
            except ValueError as e:
                raise StatsError(
                    f"{source}: normalize='stats' needs the mean/std of camera {camera!r} from meta/stats.json "
                    f"(or v2.1's meta/episodes_stats.jsonl), but {e}. Give AugmentConfig.normalize a Normalize "
                    "(e.g. ImageNet's), one per camera, or leave it unset."
                ) from e
            grey = count == 1 and len(norm.mean) == 3
            per_camera[camera] = _grey(norm, camera, source) if grey else norm
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
                raise ValueError(
                    f"{os.fspath(path)} has no [{table}] table; tables: {sorted(document)}: add it, or name one of "
                    "those (table=)"
                )
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
            out[f.name] = plain_data(value)
        return out


def _camera_tables(tables: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{camera key: table}`` from TOML's per-camera tables, joining nested tables with dots: LeRobot's camera keys
    hold dots, which TOML splits into tables (``[normalize.observation.images.top]``) unless quoted. A table whose
    values are all tables is a level of a key (a Normalize table holds lists)."""
    out: dict[str, Any] = {}
    for key, value in tables.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
            out.update(_camera_tables(value, name))
        else:
            out[name] = value
    return out


def _section_dict(section: Any) -> dict[str, Any]:
    values = {g.name: getattr(section, g.name) for g in fields(section)}
    return {name: plain_data(value) for name, value in values.items() if value is not None}


def _checked_keys(cls: type, raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} = {raw!r} is invalid: expected a table of options")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(known)}")
    missing = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in raw]
    if missing:
        raise ValueError(f"{where} is missing required key(s) {missing}: add them (allowed: {sorted(known)})")
    return dict(raw)


def range_of(value: float | Pair) -> Pair:
    # Options store pairs after __post_init__; this only narrows the declared input type.
    return value if isinstance(value, tuple) else (value, value)


def _refuse_empty_crop(owner: str, resize: tuple[int, int], ratio: tuple[float, float]) -> None:
    """A ValueError where the random resized crop's centre-crop fallback (torchvision's, whole pixels of the ``resize``
    frame) is 0 pixels high or wide: its window is cut from the frame, and an empty one made empty frames."""
    height, width = resize
    if width / height < ratio[0] and round(width / ratio[0]) == 0:
        empty = f"{width} x 0 (width / {ratio[0]:g} rounds to 0)"
    elif width / height > ratio[1] and round(height * ratio[1]) == 0:
        empty = f"0 x {height} (height * {ratio[1]:g} rounds to 0)"
    else:
        return
    raise ValueError(
        f"{owner}.random_resized_crop ratio {ratio} finds no window in the {width} x {height} (width x height) frames "
        f"of {owner}.resize: its fallback centre crop would be {empty} pixels (torchvision's fails on it too); give it "
        f"a least ratio below {2 * width} and a greatest above {1 / (2 * height):g}, or resize to larger frames"
    )
