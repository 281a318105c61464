"""The DALI graph fragments for colour: worker-shipped planes into RGB (see :mod:`lerobot_dali.yuv_frames`),
and NVDEC's RGB into the colour space its stream is tagged with (:func:`recolor`).

Three DALI operators, the same on ``cpu`` and ``gpu`` DataNodes: ``fn.resize`` brings the chroma plane
to the luma plane's size by nearest-neighbour sampling (each 4:2:0 sample covers its 2x2 block, as
swscale does; a full-size plane passes unchanged), ``fn.cat`` stacks (Y, Cb, Cr) per pixel, and
``fn.coord_transform`` applies each sample's ``[M | T]``, rounding and saturating to uint8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode

__all__ = ["planes_to_rgb", "recolor"]


def planes_to_rgb(luma: Any, chroma: Any, matrix: Any, *, on_gpu: bool) -> Any:
    """uint8 ``FHWC`` RGB from ``luma`` (F, H, W, 1), ``chroma`` (F, h, w, 2) and ``matrix`` (3, 4) per sample.

    All three are CPU DataNodes (external source outputs); with ``on_gpu`` the planes move to the GPU first
    and only the sizes and matrices stay on the CPU, where DALI reads argument inputs.
    """
    size = luma.shape(dtype=types.DALIDataType.FLOAT)[1:3]  # (H, W), read on the CPU before any copy
    if on_gpu:
        luma, chroma = luma.gpu(), chroma.gpu()
    # One output (no save_attrs); nearest: each 4:2:0 sample covers its 2x2 block, as in swscale.
    full_chroma = cast(
        DataNode, fn.resize(chroma, size=size, interp_type=types.DALIInterpType.INTERP_NN, antialias=False)
    )
    return fn.coord_transform(fn.cat(luma, full_chroma, axis=3), MT=matrix, dtype=types.DALIDataType.UINT8)


def recolor(rgb: Any, fix: Sequence[Sequence[float]]) -> Any:
    """uint8 ``FHWC`` RGB through the constant ``[M | T]`` ``fix`` (:func:`~lerobot_dali.yuv_frames.nvdec_color_fix`),
    rounded and saturated to uint8, on whichever device ``rgb`` is."""
    return fn.coord_transform(rgb, MT=np.asarray(fix, dtype=np.float32), dtype=types.DALIDataType.UINT8)
