"""Depth-map video cameras: LeRobot's 12-bit quantised depth, read back as depth.

LeRobot (``DepthEncoderConfig``) stores a depth camera as a video of 12-bit codes (``gray12le``, lossless
HEVC by default) and flags its feature ``is_depth_map``; the feature's ``info`` keeps the quantiser
(``video.depth_min``, ``video.depth_max``, ``video.shift``, ``video.use_log``). Reading it as a colour
camera would turn depth into a grey picture, so the workers decode the codes (PyAV, ``gray12le``; NVDEC
and DALI's decoders give 8-bit RGB only) and :meth:`DepthQuantizer.dequantize` turns them into depth as
LeRobot's ``dequantize_depth`` does: float32 millimetres rounded to whole ones (LeRobot's default) or metres.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["DEPTH_CODE_MAX", "DepthQuantizer", "DepthUnit", "DepthUnitName", "in_unit", "is_depth_map"]

#: Largest code of LeRobot's 12-bit depth quantiser.
DEPTH_CODE_MAX = (1 << 12) - 1


class DepthUnit(str, enum.Enum):
    """What depth cameras are read as: ``mm`` (LeRobot's default ``depth_output_unit``) or ``m``."""

    MM = "mm"
    M = "m"


#: :class:`DepthUnit`'s values, as a type checker checks a string given for one (``depth_unit="m"``).
DepthUnitName = Literal["mm", "m"]


def is_depth_map(*infos: Mapping[str, Any] | None) -> bool:
    """Whether a feature's ``info`` (or v2.0 ``video_info``) flags it a depth map: LeRobot's canonical
    ``is_depth_map`` or its legacy ``video.is_depth_map``."""
    return any(_flag(i.get("is_depth_map")) or _flag(i.get("video.is_depth_map")) for i in infos if i)


def _flag(value: Any) -> bool:
    """A flag as LeRobot writes it (a bool), or as text: "false" is not a depth map, though a string is truthy."""
    return value.strip().lower() == "true" if isinstance(value, str) else bool(value)


def in_unit(depth: np.ndarray, stored: str | None, unit: DepthUnit) -> np.ndarray:
    """A depth image's float32 values (stored in ``stored``: "m", "mm", or None when the dataset does not say,
    then left as they are) in ``unit``, converted in place as LeRobot converts them."""
    if stored is None or DepthUnit(stored) is unit:
        return depth
    if unit is DepthUnit.MM:
        depth *= np.float32(1000.0)
    else:
        depth /= np.float32(1000.0)
    return depth


@dataclass(frozen=True)
class DepthQuantizer:
    """LeRobot's depth quantiser (its defaults): code 0 is ``depth_min`` metres, code 4095 ``depth_max``,
    spaced evenly in ``log(depth + shift)`` when ``use_log``, else in depth."""

    depth_min: float = 0.01
    depth_max: float = 10.0
    shift: float = 3.5
    use_log: bool = True

    def __post_init__(self) -> None:
        if not self.depth_max > self.depth_min:
            raise ValueError(f"depth_max ({self.depth_max}) must exceed depth_min ({self.depth_min})")
        if self.use_log and not self.depth_min + self.shift > 0:
            raise ValueError(f"log quantisation needs depth_min + shift > 0, got {self.depth_min} + {self.shift}")

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> DepthQuantizer:
        """From a depth feature's ``info``; a missing parameter takes LeRobot's default, as LeRobot does."""
        given = {name: info.get(f"video.{name}") for name in ("depth_min", "depth_max", "shift", "use_log")}
        kwargs: dict[str, Any] = {
            k: (_flag(v) if k == "use_log" else float(v)) for k, v in given.items() if v is not None
        }
        return cls(**kwargs)

    def dequantize(self, codes: np.ndarray, unit: DepthUnit) -> np.ndarray:
        """Depth (float32, same shape) of 12-bit ``codes`` (codes above 4095 clamp to ``depth_max``), computed
        by torch in the order LeRobot's ``dequantize_depth`` computes it, so that the values are LeRobot's to the
        bit (NumPy's float32 ``exp`` rounds differently); millimetres are rounded to whole ones, as LeRobot's."""
        import torch

        if self.use_log:
            low, high = math.log(self.depth_min + self.shift), math.log(self.depth_max + self.shift)
        else:
            low, high = self.depth_min, self.depth_max
        depth = torch.from_numpy(np.ascontiguousarray(codes)).to(dtype=torch.float32, copy=True)
        depth.mul_((high - low) / DEPTH_CODE_MAX).add_(low)
        if self.use_log:
            depth.exp_().sub_(self.shift)
        depth.clamp_(self.depth_min, self.depth_max)
        if DepthUnit(unit) is DepthUnit.MM:
            depth.mul_(1000.0).round_().clamp_(0.0, float(np.iinfo(np.uint16).max))
        return depth.numpy()
