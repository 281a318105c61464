"""LeRobot's image-transform options (``--dataset.image_transforms.*``) as an :class:`AugmentConfig`.

A recipe trained with LeRobot's ``ImageTransformsConfig`` maps here transform by transform, so the same
augmentation runs in the DALI graph. Apart from :mod:`.augment_config` (which it only calls) because it
reads another project's option names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .augment_config import AugmentConfig, ColorJitter, RandomAffine, RandomSubset, SharpnessJitter
from .value_checks import is_int, is_number

__all__ = ["augment_config_from_lerobot"]

#: LeRobot's transform types this maps, and the kwargs each may carry.
_KWARGS = {
    "ColorJitter": ("brightness", "contrast", "saturation", "hue"),
    "SharpnessJitter": ("sharpness",),
    "RandomAffine": ("degrees", "translate", "scale"),
}
#: The fields of LeRobot's ``ImageTransformsConfig`` and of each of its ``tfs`` (``ImageTransformConfig``).
_CONFIG_FIELDS = ("enable", "max_num_transforms", "random_order", "tfs")
_TRANSFORM_FIELDS = ("weight", "type", "kwargs")
#: What LeRobot's options default to when a dict form leaves them out.
_DEFAULTS = {"enable": False, "max_num_transforms": 3, "random_order": False, "weight": 1.0, "type": "Identity"}


def _fields(cfg: object, names: tuple[str, ...], where: str) -> dict[str, Any]:
    """``cfg``'s fields ``names``: the attributes of LeRobot's config object, or the keys of its dict form, where one
    left out takes LeRobot's default and one LeRobot has not is refused (as LeRobot's config parser refuses it: a
    typo must not run the default)."""
    if isinstance(cfg, Mapping):
        unknown = sorted(set(cfg) - set(names), key=str)
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {list(names)}")
        if "tfs" in names and "tfs" not in cfg:
            raise ValueError(f"the LeRobot {where} config has no 'tfs': give its table of transforms")
        fields = {name: cfg.get(name, _DEFAULTS.get(name)) for name in names}
    elif all(hasattr(cfg, name) for name in names):
        fields = {name: getattr(cfg, name) for name in names}
    elif "tfs" in names:
        raise TypeError(f"expected LeRobot's ImageTransformsConfig or its dict form, got {type(cfg).__name__}")
    else:
        raise ValueError(f"{where} = {cfg!r} is invalid: expected a table of {list(names)}")
    for name in ("enable", "random_order"):
        if name in fields and not isinstance(fields[name], bool | np.bool_):
            raise ValueError(f"{where}.{name} = {fields[name]!r} is invalid: expected true or false")
    return fields


def augment_config_from_lerobot(cfg: object) -> AugmentConfig:
    """The :class:`AugmentConfig` that applies what LeRobot's ``ImageTransformsConfig`` ``cfg`` applies.

    ``cfg``: the config object, or its dict form (``config["dataset"]["image_transforms"]`` of a LeRobot
    ``train_config.json``). Each transform of weight > 0 maps by its ``type``: ``ColorJitter`` (one factor per
    transform, as LeRobot's defaults have it; several in one are refused when only some transforms are picked
    per sample), ``SharpnessJitter`` and ``RandomAffine`` (degrees, translate, scale; no shear); any other type
    is refused by name. ``max_num_transforms`` below the number of transforms becomes a :class:`RandomSubset`
    with their weights. ``enable=false`` or ``max_num_transforms=0`` gives the config that does nothing, as in
    LeRobot. Each camera draws on its own, as LeRobot's dataset applies the transform to each camera separately;
    the frames of one window share a draw, as LeRobot's transform of a (T, C, H, W) tensor does.

    What differs from LeRobot (see :mod:`lerobot_dali.augment`): transforms run in this project's fixed order, the
    colour jitter, the sharpness, then the affine, which is the order of LeRobot's default table (LeRobot runs its
    table's order: one that lists the affine first moves the frame before it jitters it); contrast is taken about
    mid-grey (128), not the frame's mean; hue turns the YIQ chroma plane, not the HSV hue; the affine resamples
    bilinearly; frames are rounded to whole levels after each step (LeRobot transforms floats).
    ``random_order=true`` is refused where more than one transform applies: one static graph has one order.
    """
    options = _fields(cfg, _CONFIG_FIELDS, "image_transforms")
    if not options["enable"]:
        return AugmentConfig()
    tfs = options["tfs"]
    if not isinstance(tfs, Mapping):
        raise ValueError(f"image_transforms.tfs = {tfs!r} is invalid: expected a table of named transforms")
    jitter: dict[str, Any] = {}
    sharpness: SharpnessJitter | None = None
    affine: RandomAffine | None = None
    weights: dict[str, float] = {}
    members_of: dict[str, tuple[str, ...]] = {}
    for name, tf in tfs.items():
        where = f"image_transforms.tfs.{name}"
        weight, kind, kwargs = _fields(tf, _TRANSFORM_FIELDS, where).values()
        if not is_number(weight):
            raise ValueError(f"{where}.weight = {weight!r} is invalid: expected a number")
        if weight <= 0:  # LeRobot leaves such a transform out
            continue
        if kind not in _KWARGS:
            raise ValueError(
                f"{where}.type = {kind!r} has no counterpart here; supported: {sorted(_KWARGS)}. "
                "Drop it (or set its weight to 0) to run the others."
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"{where}.kwargs = {kwargs!r} is invalid: expected a table of the {kind}'s options")
        kwargs = dict(kwargs or {})
        unknown = sorted(set(kwargs) - set(_KWARGS[kind]))
        if unknown:
            raise ValueError(f"{where}: {kind} option(s) {unknown} are not supported; allowed: {list(_KWARGS[kind])}")
        if kind == "ColorJitter":
            kwargs = {k: v for k, v in kwargs.items() if v is not None}  # (torchvision: None leaves that factor be)
            factors = tuple(k for k in _KWARGS[kind] if k in kwargs)
            taken = sorted(set(factors) & set(jitter))
            if taken or not factors:
                raise ValueError(
                    f"{where}: a ColorJitter must set at least one factor and none another transform sets "
                    f"(also set: {taken})"
                )
            jitter.update({k: kwargs[k] for k in factors})
            members_of[name] = factors
        elif kind == "SharpnessJitter":
            if sharpness is not None or "sharpness" not in kwargs:
                raise ValueError(f"{where}: one SharpnessJitter with its 'sharpness' range is supported")
            sharpness = SharpnessJitter(factor=kwargs["sharpness"])
            members_of[name] = ("sharpness",)
        else:
            if affine is not None or "degrees" not in kwargs:
                raise ValueError(f"{where}: one RandomAffine with its 'degrees' (as torchvision's needs) is supported")
            affine = RandomAffine(
                degrees=kwargs["degrees"],
                translate=kwargs.get("translate") or (0.0, 0.0),
                scale=kwargs.get("scale") or (1.0, 1.0),
            )
            members_of[name] = ("affine",)
        weights.update(dict.fromkeys(members_of[name], float(weight)))
    max_num_transforms = options["max_num_transforms"]
    if is_int(max_num_transforms) and max_num_transforms == 0:  # LeRobot's RandomSubsetApply of none: its Identity
        return AugmentConfig()
    subset = _subset(max_num_transforms, options["random_order"], weights, members_of)
    return AugmentConfig(
        affine=affine,
        color_jitter=ColorJitter(**jitter) if jitter else None,
        sharpness=sharpness,
        random_subset=subset,
    )


def _subset(
    max_num_transforms: Any, random_order: Any, weights: dict[str, float], members_of: dict[str, tuple[str, ...]]
) -> RandomSubset | None:
    """The RandomSubset of LeRobot's ``RandomSubsetApply``, or None when it applies every transform."""
    count = len(members_of)
    if count == 0:
        return None
    subset = RandomSubset(max_num_transforms=max_num_transforms, weights=weights)  # validates the number
    applied = min(subset.max_num_transforms, count)
    if random_order and applied > 1:
        raise ValueError(
            f"image_transforms.random_order = true is not supported with {applied} transforms per sample: the "
            "DALI graph is built once, with one order of steps. Set it to false (the listed order): on LeRobot "
            "0.4.4's default transforms the order moves frames by 0.16 levels of 255 on average (1.9 at the 99th "
            "percentile), less than this package's other documented differences from torchvision"
        )
    if applied >= count:
        return None
    joined = {name: members for name, members in members_of.items() if len(members) > 1}
    if joined:
        raise ValueError(
            f"image_transforms.tfs {sorted(joined)}: a ColorJitter with several factors is one transform to LeRobot's "
            f"subset draw, here each factor is one; split it into one ColorJitter per factor, or set "
            f"max_num_transforms >= {count} to apply every transform"
        )
    return RandomSubset(max_num_transforms=applied, weights=weights)
