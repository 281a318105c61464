"""Random augmentation parameters drawn on the host, one set per sample, as a pure function of its identity.

:func:`~lerobot_dali.augment.augment_frames` takes its random parameters as DALI argument inputs (tiny CPU
tensors) that the external source computes here, instead of from DALI's random operators. A sample's
numbers depend only on (seed, rank, epoch, position of the sample in the rank's stream, camera stream,
parameter): never on the batch it lands in, the worker that assembles it, or how often the pipeline was
rebuilt. So a resumed run augments exactly as the uninterrupted one, and ranks draw differently. The rest of an
epoch re-sharded on resume over another number of ranks counts its positions on from where the old ranks stopped
(``SampleOrder.key_offset``), so no rank draws a key an old rank of its number drew for another sample.

How: each (sample, stream) gets a counter-based Philox generator, key = a hash of (seed, stream), counter
= (0, position, epoch, rank), and reads a fixed block of :data:`STREAM_LENGTH` raw 64-bit words. Every
parameter owns fixed slots in that block (:data:`_SLOTS`), so turning one augmentation on or off leaves
the others' draws unchanged. Raw words are turned into floats here (``(x >> 11) * 2**-53``), not by a
``numpy.random.Generator`` method, whose output NumPy may change between versions; Philox's bits do not.

Parameters (arrays with a leading batch dimension; scalars per sample unless a shape is given):

- ``crop_start``, ``crop_end``: float32 (2,), the random resized crop's window as relative (y, x) corners.
- ``brightness``, ``contrast``, ``saturation``: float32 factors; ``hue``: float32 shift as a fraction of
  the colour circle (the config's unit; the graph converts to DALI's degrees).
- ``affine_scale``: float32 factor; ``affine_degrees``: float32, positive = clockwise on screen
  (torchvision's sign); ``affine_translate``: float32 (2,), shift as a fraction of (width, height), so the
  graph scales it by the frame size, known when the graph is built or read from the frame at run time.
- ``blur_sigma``: float32 pixels; ``blur_window``: int32, the kernel size, or 1 (identity) for a sample
  the blur's ``probability`` skips.
- ``sharpness``: float32 factor.

A parameter is drawn only when it is random: a constant range (``brightness=(1.5, 1.5)``) is a constant in
the graph, an identity range is no step at all. With a ``random_subset``, the parameters of its members are
drawn even when constant, and each sample's members are picked from the sample's own stream (one uniform per
member, :func:`_subset_picks`); a member not picked gets its identity value in every one of its parameters.

Random resized crop: the window is sampled as torchvision's ``RandomResizedCrop.get_params`` does (area
fraction in ``scale``, aspect ``ratio`` uniform in log space, up to 10 tries, then a centre crop with the
ratio clamped), in pixels of ``frame_size``, the frame the crop cuts. That is the config's ``resize``, known
before any frame is decoded. Without a ``resize`` the crop cuts full decoded frames of a size unknown here
(it may even differ per camera), so the window is drawn in relative coordinates instead: the area fraction
means the same, but the aspect ratio is relative to the frame's own (``ratio=(1, 1)`` keeps the frame's
shape), and there is no rounding to whole pixels. Configure ``resize`` for torchvision's pixel semantics.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

import numpy as np

from .augment_config import SUBSET_MEMBERS
from .value_checks import is_int

if TYPE_CHECKING:
    from .augment_config import AugmentConfig, RandomSubset

__all__ = ["STREAM_LENGTH", "draw_names", "draw_params", "stream_name"]

#: Tries before the random resized crop falls back to a centre crop (torchvision's number).
CROP_TRIES = 10

# Offsets of each parameter's uniforms in a sample's stream; append new parameters, never move old ones.
_SLOTS: dict[str, tuple[int, int]] = {
    "crop": (0, 4 * CROP_TRIES),  # the tries' areas, then their log-aspects, tops, lefts (CROP_TRIES each)
    "brightness": (40, 1),
    "contrast": (41, 1),
    "saturation": (42, 1),
    "hue": (43, 1),
    "affine_scale": (44, 1),
    "affine_degrees": (45, 1),
    "affine_translate": (46, 2),
    "blur_sigma": (48, 1),
    "blur_window": (49, 1),
    "sharpness": (50, 1),
    "subset": (51, len(SUBSET_MEMBERS)),  # one uniform per member, in SUBSET_MEMBERS order
}
#: Raw 64-bit words each (sample, stream) reads. Philox's stream does not depend on how much is read, so words
#: appended for new parameters leave the earlier ones, and so every older draw, as they were.
STREAM_LENGTH = 57

#: The value of each scalar parameter that leaves the frames unchanged (what a sample gets for a subset member
#: not picked for it).
_IDENTITY = {
    "brightness": 1.0,
    "contrast": 1.0,
    "saturation": 1.0,
    "hue": 0.0,
    "sharpness": 1.0,
    "affine_scale": 1.0,
    "affine_degrees": 0.0,
    "affine_translate": 0.0,
}
#: The parameters of each member of a RandomSubset.
_MEMBER_PARAMS = {
    **{name: (name,) for name in ("brightness", "contrast", "saturation", "hue", "sharpness")},
    "affine": ("affine_scale", "affine_degrees", "affine_translate"),
}


def stream_name(config: AugmentConfig | None, camera_index: int) -> str:
    """The draw stream of a camera: ``"shared"`` for all cameras with ``shared_across_cameras``, else its own."""
    return "shared" if config is not None and config.shared_across_cameras else f"camera{camera_index}"


def _pair(value: float | tuple[float, float]) -> tuple[float, float]:
    # Config sections store (lo, hi) pairs after validation; this only narrows the declared input type.
    return value if isinstance(value, tuple) else (value, value)


def _random(value: float | tuple[float, float]) -> bool:
    lo, hi = _pair(value)
    return lo != hi


def _drawn(config: AugmentConfig, name: str, value: float | tuple[float, float]) -> bool:
    """Whether parameter ``name`` with range ``value`` is drawn per sample: when its range is random, or when it
    belongs to a member of ``config.random_subset`` and is not the identity (a sample the subset skips gets the
    identity instead of the constant)."""
    lo, hi = _pair(value)
    if lo != hi:
        return True
    subset = config.random_subset
    return (
        subset is not None
        and any(name in _MEMBER_PARAMS[m] for m in subset.weights)
        and (lo, hi) != (_IDENTITY[name],) * 2
    )


def draw_names(config: AugmentConfig | None) -> tuple[str, ...]:
    """The parameters ``config`` draws per sample, in a fixed order; empty when nothing is random."""
    if config is None:
        return ()
    names: list[str] = []
    if config.random_resized_crop is not None:
        names += ["crop_start", "crop_end"]
    affine = config.affine
    if affine is not None:
        if _drawn(config, "affine_scale", affine.scale):
            names.append("affine_scale")
        if _drawn(config, "affine_degrees", affine.degrees):
            names.append("affine_degrees")
        if affine.translate != (0.0, 0.0):
            names.append("affine_translate")
    jitter = config.color_jitter
    if jitter is not None:
        names += [n for n in ("brightness", "contrast", "saturation", "hue") if _drawn(config, n, getattr(jitter, n))]
    if config.sharpness is not None and _drawn(config, "sharpness", config.sharpness.factor):
        names.append("sharpness")
    blur = config.blur
    if blur is not None and blur.probability > 0:
        if _random(blur.sigma):
            names.append("blur_sigma")
        if blur.probability < 1:
            names.append("blur_window")
    return tuple(names)


def _stream_key(seed: int, stream: str) -> np.ndarray:
    digest = hashlib.blake2b(f"lerobot_dali.augment/{seed}/{stream}".encode(), digest_size=16).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def _uniforms(seed: int, stream: str, keys: np.ndarray) -> np.ndarray:
    """(B, STREAM_LENGTH) float64 uniforms in [0, 1), row i a pure function of (seed, stream, keys[i])."""
    key = _stream_key(seed, stream)
    raw = np.empty((len(keys), STREAM_LENGTH), dtype=np.uint64)
    for i, (rank, epoch, position) in enumerate(keys.tolist()):
        counter = np.array([0, position, epoch, rank], dtype=np.uint64)
        raw[i] = np.random.Philox(key=key, counter=counter).random_raw(STREAM_LENGTH)
    return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _checked_keys(keys: np.ndarray) -> np.ndarray:
    array = np.asarray(keys)
    if array.ndim != 2 or array.shape[1] != 3 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"keys must be an integer array of shape (B, 3) holding (rank, epoch, position) per sample, "
            f"got {array.dtype} {array.shape}"
        )
    if array.size and array.min() < 0:
        raise ValueError(f"keys (rank, epoch, position) must be >= 0, got a row {array[array.min(axis=1) < 0][0]}")
    return array.astype(np.int64, copy=False)


def draw_params(
    config: AugmentConfig | None,
    *,
    seed: int,
    stream: str,
    keys: np.ndarray,
    frame_size: tuple[int, int] | None,
) -> dict[str, np.ndarray]:
    """Every parameter of :func:`draw_names` for samples ``keys`` ((B, 3) int: rank, epoch, position).

    ``stream``: :func:`stream_name` of the camera. ``frame_size``: (H, W) of the frame the random resized crop
    cuts, i.e. ``config.resize``; None draws the crop in relative terms (module docstring). Returns
    ``name -> array`` with leading dimension B, dtypes as listed in the module docstring.
    """
    if not is_int(seed):
        raise ValueError(f"seed = {seed!r} is invalid: expected an integer")
    keys = _checked_keys(keys)
    if frame_size is not None and not (
        len(frame_size) == 2 and all(isinstance(v, (int, np.integer)) and v > 0 for v in frame_size)
    ):
        raise ValueError(f"frame_size = {frame_size!r} is invalid: expected None or (height, width), positive ints")
    names = draw_names(config)
    if not names or config is None:
        return {}
    u = _uniforms(int(seed), stream, keys)

    def slot(name: str) -> np.ndarray:
        start, length = _SLOTS[name]
        return u[:, start] if length == 1 else u[:, start : start + length]

    def uniform(name: str, value: float | tuple[float, float]) -> np.ndarray:
        lo, hi = _pair(value)
        return (lo + (hi - lo) * slot(name)).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    crop = config.random_resized_crop
    if crop is not None:
        out["crop_start"], out["crop_end"] = _crop_windows(slot("crop"), crop.scale, crop.ratio, frame_size)
    affine = config.affine
    if affine is not None:
        if "affine_scale" in names:
            out["affine_scale"] = uniform("affine_scale", affine.scale)
        if "affine_degrees" in names:
            out["affine_degrees"] = uniform("affine_degrees", affine.degrees)
        if "affine_translate" in names:
            limit = np.array(affine.translate, dtype=np.float64)
            out["affine_translate"] = ((2.0 * slot("affine_translate") - 1.0) * limit).astype(np.float32)
    jitter = config.color_jitter
    if jitter is not None:
        for name in ("brightness", "contrast", "saturation", "hue"):
            if name in names:
                out[name] = uniform(name, getattr(jitter, name))
    if config.sharpness is not None and "sharpness" in names:
        out["sharpness"] = uniform("sharpness", config.sharpness.factor)
    blur = config.blur
    if blur is not None:
        if "blur_sigma" in names:
            out["blur_sigma"] = uniform("blur_sigma", blur.sigma)
        if "blur_window" in names:
            applied = slot("blur_window") < blur.probability
            out["blur_window"] = np.where(applied, blur.effective_kernel_size, 1).astype(np.int32)
    subset = config.random_subset
    if subset is not None:
        for member, picked in _subset_picks(slot("subset"), subset).items():
            for name in _MEMBER_PARAMS[member]:
                if name in out:
                    keep = picked.reshape((-1,) + (1,) * (out[name].ndim - 1))
                    out[name] = np.where(keep, out[name], np.float32(_IDENTITY[name]))
    return out


def _subset_picks(u: np.ndarray, subset: RandomSubset) -> dict[str, np.ndarray]:
    """``member -> (B,) bool``: which weighted members each sample applies, ``subset.count`` per sample.

    Drawn as LeRobot's ``torch.multinomial(weights, count)`` (without replacement) draws, by Efraimidis and
    Spirakis' keys: each member's own uniform u gives the key log(u) / weight, and the ``count`` largest keys win,
    which picks a set with the same probability as drawing one member at a time in proportion to the weights
    of those left. ``u``: (B, len(SUBSET_MEMBERS)) uniforms, one column per member.
    """
    members = list(subset.weights)
    columns = [SUBSET_MEMBERS.index(m) for m in members]
    with np.errstate(divide="ignore"):  # u = 0 (probability 2**-53): key -inf, picked last
        keys = np.log(u[:, columns]) / np.array([subset.weights[m] for m in members])
    order = np.argsort(-keys, axis=1, kind="stable")[:, : subset.count]
    picked = np.zeros(keys.shape, dtype=bool)
    np.put_along_axis(picked, order, True, axis=1)
    return {m: picked[:, i] for i, m in enumerate(members)}


def _crop_windows(
    u: np.ndarray, scale: tuple[float, float], ratio: tuple[float, float], frame_size: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Relative (y, x) start and end corners, (B, 2) float32 each, from (B, 4 * CROP_TRIES) uniforms."""
    pixels = frame_size is not None
    height, width = (float(frame_size[0]), float(frame_size[1])) if frame_size is not None else (1.0, 1.0)
    area_u, ratio_u, top_u, left_u = (u[:, k * CROP_TRIES : (k + 1) * CROP_TRIES] for k in range(4))
    area = height * width * (scale[0] + (scale[1] - scale[0]) * area_u)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * ratio_u)
    w, h = np.sqrt(area * aspect), np.sqrt(area / aspect)
    if pixels:  # whole pixels, and the corner drawn as randint(0, H - h + 1)
        w, h = np.round(w), np.round(h)
        top, left = np.floor(top_u * (height - h + 1)), np.floor(left_u * (width - w + 1))
    else:
        top, left = top_u * (height - h), left_u * (width - w)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)

    # No try fits: the largest centred window whose aspect lies within ratio.
    if width / height < ratio[0]:
        fallback_w, fallback_h = width, width / ratio[0]
    elif width / height > ratio[1]:
        fallback_w, fallback_h = height * ratio[1], height
    else:
        fallback_w, fallback_h = width, height
    fallback_top, fallback_left = (height - fallback_h) / 2, (width - fallback_w) / 2
    if pixels:
        fallback_w, fallback_h = float(round(fallback_w)), float(round(fallback_h))
        fallback_top, fallback_left = (height - fallback_h) // 2, (width - fallback_w) // 2

    rows, first = np.arange(len(u)), np.argmax(fits, axis=1)
    found = fits[rows, first]
    pick_top = np.where(found, top[rows, first], fallback_top)
    pick_left = np.where(found, left[rows, first], fallback_left)
    pick_h = np.where(found, h[rows, first], fallback_h)
    pick_w = np.where(found, w[rows, first], fallback_w)
    start = np.stack([pick_top / height, pick_left / width], axis=1)
    end = np.stack([(pick_top + pick_h) / height, (pick_left + pick_w) / width], axis=1)
    return np.clip(start, 0.0, 1.0).astype(np.float32), np.clip(end, 0.0, 1.0).astype(np.float32)
