"""On-device augmentation of camera windows, and the hand-over to LeRobot's tensor convention.

The options (:class:`AugmentConfig` and its sections) live in :mod:`.augment_config`, which needs no DALI;
they are re-exported here.

Input: one camera's batch of uint8 sequences, layout ``FHWC`` (F = the frames of one sample's
``delta_timestamps`` window, possibly 1), on the CPU or the GPU. Output: ``FCHW`` float32 in [0, 1]
(or normalised), or ``FCHW`` uint8 with ``return_uint8``. Every step is a DALI operator, so the same
graph runs on ``cpu`` and ``gpu`` DataNodes; only the random parameters (tiny per-sample arrays) live on
the CPU, as DALI argument inputs.

Order of operations (each skipped when not configured):

1. ``resize``: deterministic resize to (H, W) (``fn.resize``, linear, antialiased); skipped with
   ``presized`` when the CPU decoding worker already resized the frames (see :func:`leading_resize`).
2. ``random_resized_crop``: a random area/aspect window resized to its ``size``; the window is sampled as
   torchvision does (see :mod:`.augment_draws`). After a ``resize`` the window is whole pixels, cut (``fn.slice``)
   and then resized, as torchvision's ``resized_crop``: within a level of it. Without one it is a per-sample
   relative ROI of ``fn.resize``, which samples the frame as a continuous picture: output pixels at the window's
   edge blend in the frame just beyond it (see :class:`RandomResizedCrop`).
3. ``color_jitter``: one fused ``fn.color_twist``: hue and saturation (a linear transform in RGB), then
   contrast about mid-grey (128), then brightness. torchvision shuffles these four and takes contrast
   about the image mean; the fixed order and centre keep every frame of a window on the same transform.
   Hue turns the YIQ chroma plane, not torchvision's HSV hue (:class:`ColorJitter` says how they differ).
   On the CPU the twist gives float and one ``fn.cast`` rounds it to uint8: the same bytes, less CPU.
4. ``sharpness``: torchvision's ``adjust_sharpness`` with a random factor: ``fn.filter`` with its 3x3
   smoothing kernel less the identity over the inside of the frame (the one-pixel border is kept, as there, so
   a frame of 2 pixels or fewer a side is left as it is),
   scaled by (1 - factor) and added to the frame; within half a level of torchvision on float frames.
5. ``affine``: rotation and scale about the image centre, then translation (``fn.transforms.*`` +
   ``fn.warp_affine``, outside filled with 0). After the jitter and the sharpness, as in LeRobot's default
   order, so the area it uncovers stays black.
6. ``blur``: ``fn.gaussian_blur`` with a random sigma, applied with ``probability`` (a skipped sample gets
   a 1-tap kernel, which is the identity).
7. Hand-over: ``FHWC`` -> ``FCHW``. Plain float output is ``transpose / 255`` (bit-identical to
   LeRobot's ``frames.float() / 255``); with ``normalize`` it is one fused ``fn.crop_mirror_normalize``
   with mean and std scaled by 255; ``return_uint8`` is the transpose alone. On the CPU the transpose is
   a uint8 ``fn.crop_mirror_normalize`` (no mean, no std: the same bytes, less CPU).

``random_subset`` (LeRobot's ``max_num_transforms``) adds no step: a sample the subset does not pick a
jitter or the affine for gets that step's identity parameters (factor 1, angle and shift 0), drawn on the
host, so one static graph serves every subset.

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
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali import math as dmath
from nvidia.dali.data_node import DataNode

from .augment_config import (
    NORMALIZE_FROM_STATS,
    AugmentConfig,
    ColorJitter,
    GaussianBlur,
    Normalize,
    Pair,
    RandomAffine,
    RandomResizedCrop,
    RandomSubset,
    SharpnessJitter,
    checked_size,
    range_of,
    refuse_uint8_normalize,
    toml_parser,
)
from .augment_draws import draw_names

__all__ = [
    "NORMALIZE_FROM_STATS",
    "AugmentConfig",
    "ColorJitter",
    "GaussianBlur",
    "Normalize",
    "RandomAffine",
    "RandomResizedCrop",
    "RandomSubset",
    "SharpnessJitter",
    "augment_frames",
    "checked_size",
    "leading_resize",
    "toml_parser",
]

_LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# The graph


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
    refuse_uint8_normalize(return_uint8, normalize)
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
        if cfg.resize is not None:  # a window of whole pixels: cut, then resized, as torchvision's resized_crop
            window = fn.slice(x, rel_start=d["crop_start"], rel_end=d["crop_end"], axis_names="HW")
            x = cast(DataNode, fn.resize(window, size=list(crop_size), antialias=True))
        else:  # a window of the frame as a continuous picture, not on whole pixels (see RandomResizedCrop)
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
    if cfg.color_jitter is not None:
        x = _color_jitter(x, cfg.color_jitter, d, grey=channels == 1)
        steps.append("color_jitter")
    if cfg.sharpness is not None and range_of(cfg.sharpness.factor) != (1.0, 1.0) and not _too_small(size):
        x = _sharpness(x, cfg.sharpness, size, d)
        steps.append("sharpness")
    if cfg.affine is not None:
        x = _affine(x, cfg.affine, size, d)
        steps.append("affine")
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
    """The draw ``name`` when there is one (a random range, or a member of a random subset), else the range's
    constant."""
    return d[name] if name in d else range_of(value)[0]


def _affine(x: DataNode, affine: RandomAffine, size: tuple[int, int] | None, d: Mapping[str, DataNode]) -> DataNode:
    scale, degrees, translate = range_of(affine.scale), range_of(affine.degrees), affine.translate
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
        # DALI turns clockwise on screen for a positive angle (y points down), as torchvision's RandomAffine does.
        angle = _param(d, "affine_degrees", degrees)
        args = () if matrix is None else (matrix,)
        matrix = fn.transforms.rotation(*args, angle=angle, center=center)
    if translate != (0.0, 0.0):
        fraction = d["affine_translate"]  # (dx, dy) as fractions of (width, height)
        offset = fraction * (types.Constant(wh) if isinstance(wh, np.ndarray) else wh)
        args = () if matrix is None else (matrix,)
        matrix = fn.transforms.translation(*args, offset=offset)
    return fn.warp_affine(x, matrix=matrix, inverse_map=False, fill_value=0.0)


def _color_jitter(x: DataNode, jitter: ColorJitter, d: Mapping[str, DataNode], *, grey: bool = False) -> DataNode:
    def arg(name: str, identity: Pair) -> Arg | None:
        value = range_of(getattr(jitter, name))
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
    # On the CPU, DALI's uint8 colour twist rounds and saturates each value inside its per-pixel loop (a libm roundf
    # call apiece); twisted to float and cast, every value is rounded and saturated alike (the same conversion), in one
    # plain loop: the same bytes, 16-21% less CPU (224x224 frames, batch 32: 45 -> 36-38 ms), in the training process.
    on_cpu = x.device == "cpu"
    twisted = fn.color_twist(
        x, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue_degrees,
        dtype=types.DALIDataType.FLOAT if on_cpu else None,
    )  # fmt: skip
    return fn.cast(twisted, dtype=types.DALIDataType.UINT8) if on_cpu else twisted


#: torchvision's ``adjust_sharpness`` smoothing kernel, less the identity: correlating with it gives
#: (smoothed - frame), the detail that a sharpness factor f scales by (1 - f).
_SMOOTHED_LESS_FRAME = np.array([[1, 1, 1], [1, 5 - 13, 1], [1, 1, 1]], dtype=np.float32) / 13


def _too_small(size: tuple[int, int] | None) -> bool:
    """Whether frames of ``size`` have no inside for the sharpness step (a side of 2 pixels or fewer), which
    torchvision's ``adjust_sharpness`` returns as they are."""
    return size is not None and min(size) <= 2


def _sharpness(
    x: DataNode, sharpness: SharpnessJitter, size: tuple[int, int] | None, d: Mapping[str, DataNode]
) -> DataNode:
    factor = _param(d, "sharpness", sharpness.factor)
    frames = fn.cast(x, dtype=types.DALIDataType.FLOAT)
    kernel = types.Constant(_SMOOTHED_LESS_FRAME)
    # The detail inside only, then padded back with zeros: torchvision keeps the border pixels, and so leaves a
    # frame of 2 pixels or fewer a side unchanged (a "valid" filter of such a frame fails, so its inside is cut
    # from a "same" one, 0 wide there, when its size is known only per sample).
    if size is not None:
        hw: Any = list(size)
        inside = fn.filter(frames, kernel, mode="valid")
    else:
        hw = x.shape(dtype=types.DALIDataType.INT32)[1:3]  # F, H, W, C
        inner = dmath.max(hw - 2, 0)
        same = fn.filter(frames, kernel, border="constant")
        inside = fn.slice(same, start=[1, 1], shape=inner, axes=[1, 2], out_of_bounds_policy="pad", fill_values=0)
    detail = fn.slice(inside, start=[-1, -1], shape=hw, axes=[1, 2], out_of_bounds_policy="pad", fill_values=0)
    # (DALI moves a CPU factor to the GPU for GPU frames.) float -> uint8 rounds to nearest and saturates, as the
    # clamp of torchvision's blend does.
    return fn.cast(frames + (1.0 - factor) * detail, dtype=types.DALIDataType.UINT8)


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
    if x.device == "cpu":
        # On the CPU, cmn's uint8 -> uint8 re-layout (mean 0, std 1: x * 1 rounds to x) costs ~30% less than
        # fn.transpose's generic kernel (48 frames of 480x640x3: 17-21 ms against 23-34), the same bytes.
        chw = fn.crop_mirror_normalize(x, dtype=types.DALIDataType.UINT8, output_layout="FCHW")
    else:
        chw = fn.transpose(x, perm=[0, 3, 1, 2], output_layout="FCHW")
    # True division, not cmn's multiply by 1/255, so values match LeRobot's float()/255 bit for bit.
    return chw if return_uint8 else chw / 255
