"""A visible code in each synthetic frame naming its episode, frame and camera.

Checking a loader means knowing which frame it returned after a lossy encode, so the identity is drawn
as an 8x8 grid of large flat bright/dark cells covering the whole frame, protected by a CRC-16. Cell
borders are fractions of the frame size and only cell centres are read, so the code survives AV1/H.264/
HEVC/VP9 at default quality for frames of 64x64 and up, and also a resize. Cameras differ in the code and
in the tint of the cells, so frames of two cameras never look alike.
"""

from __future__ import annotations

import binascii
from typing import NamedTuple

import numpy as np

from .value_checks import is_int

__all__ = [
    "MAX_CAMERA_INDEX",
    "MAX_EPISODE_INDEX",
    "MAX_FRAME_INDEX",
    "MIN_MARKER_SIZE",
    "Marker",
    "draw_marker",
    "read_full_marker",
    "read_marker",
]

_GRID = 8
_EPISODE_BITS = 24
_FRAME_BITS = 20
_CAMERA_BITS = 4
_PAYLOAD_BITS = _EPISODE_BITS + _FRAME_BITS + _CAMERA_BITS  # 48 bits = 6 bytes
_CRC_BITS = 16
# XOR-ed over the 64 cells so that low indices still give a mix of bright and dark cells.
_WHITENING = 0x9E3779B97F4A7C15

MAX_EPISODE_INDEX = 2**_EPISODE_BITS - 1
MAX_FRAME_INDEX = 2**_FRAME_BITS - 1
MAX_CAMERA_INDEX = 2**_CAMERA_BITS - 1
MIN_MARKER_SIZE = 64
"""Smallest height and width, in pixels, for which the marker is known to survive lossy codecs."""

# Bright ("1") and dark ("0") cell colours per camera, cycling; luma stays far from the threshold.
_BRIGHT = np.array(
    [[232, 232, 232], [240, 214, 150], [150, 222, 240], [240, 190, 240], [196, 236, 160]], dtype=np.uint8
)
_DARK = np.array([[24, 24, 24], [40, 24, 8], [8, 32, 44], [36, 12, 36], [20, 40, 12]], dtype=np.uint8)
_LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114])
_THRESHOLD = 128.0
# A cell centre whose mean luma falls inside this band is neither clearly bright nor clearly dark.
_AMBIGUOUS = (96.0, 160.0)


class Marker(NamedTuple):
    """What a frame's marker says."""

    episode_index: int
    frame_index: int
    camera_index: int


def _check_index(name: str, value: int, maximum: int) -> None:
    if not is_int(value) or not 0 <= value <= maximum:
        raise ValueError(f"{name} must be an int in [0, {maximum}], got {value!r}.")


def _edges(size: int) -> np.ndarray:
    return (np.arange(_GRID + 1) * size) // _GRID


def _encode_bits(episode_index: int, frame_index: int, camera_index: int) -> np.ndarray:
    payload = (int(episode_index) << (_FRAME_BITS + _CAMERA_BITS)) | (int(frame_index) << _CAMERA_BITS) | camera_index
    crc = binascii.crc_hqx(payload.to_bytes(_PAYLOAD_BITS // 8, "big"), 0xFFFF)
    word = ((payload << _CRC_BITS) | crc) ^ _WHITENING
    return np.array([(word >> (63 - i)) & 1 for i in range(_GRID * _GRID)], dtype=bool).reshape(_GRID, _GRID)


def draw_marker(episode_index: int, frame_index: int, height: int, width: int, camera_index: int = 0) -> np.ndarray:
    """Return an HxWx3 uint8 RGB frame whose marker names ``episode_index``, ``frame_index``, camera."""
    _check_index("episode_index", episode_index, MAX_EPISODE_INDEX)
    _check_index("frame_index", frame_index, MAX_FRAME_INDEX)
    _check_index("camera_index", camera_index, MAX_CAMERA_INDEX)
    for name, size in (("height", height), ("width", width)):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < _GRID:
            raise ValueError(
                f"{name} must be an int >= {_GRID} (>= {MIN_MARKER_SIZE} to survive lossy codecs), got {size!r}."
            )
    bits = _encode_bits(episode_index, frame_index, int(camera_index))
    tint = int(camera_index) % len(_BRIGHT)
    cells = np.where(bits[..., None], _BRIGHT[tint], _DARK[tint]).astype(np.uint8)  # (GRID, GRID, 3)
    rows = np.repeat(cells, np.diff(_edges(int(height))), axis=0)
    return np.repeat(rows, np.diff(_edges(int(width))), axis=1)


def _as_hwc_255(frame: object) -> np.ndarray:
    """Accept HxWx3 / 3xHxW / HxW arrays (or CPU tensors), uint8 or float in [0, 1] or [0, 255]."""
    array = np.asarray(frame)
    if array.ndim == 3 and array.shape[-1] not in (1, 3) and array.shape[0] in (1, 3):
        array = np.moveaxis(array, 0, -1)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3):
        raise ValueError(
            f"Expected one frame as HxWx3, 3xHxW or HxW, got an array of shape {array.shape}; "
            "pass a single frame, not a batch."
        )
    if array.shape[0] < _GRID or array.shape[1] < _GRID:
        raise ValueError(f"Frame of shape {array.shape} is too small to carry a marker.")
    values = array.astype(np.float64)
    if np.issubdtype(array.dtype, np.floating) and values.size and values.max() <= 1.5:
        values = values * 255.0
    return values


def _cell_lumas(values: np.ndarray) -> np.ndarray:
    luma = values[..., 0] if values.shape[-1] == 1 else values @ _LUMA_WEIGHTS
    row_edges, col_edges = _edges(luma.shape[0]), _edges(luma.shape[1])
    means = np.empty((_GRID, _GRID))
    for r in range(_GRID):
        top, bottom = row_edges[r], row_edges[r + 1]
        inset_r = (bottom - top) // 4
        for c in range(_GRID):
            left, right = col_edges[c], col_edges[c + 1]
            inset_c = (right - left) // 4
            means[r, c] = luma[top + inset_r : bottom - inset_r, left + inset_c : right - inset_c].mean()
    return means


def read_full_marker(frame: object) -> Marker:
    """Read episode, frame and camera index from a frame drawn by :func:`draw_marker`.

    Raises ValueError when the frame carries no valid marker (cells neither bright nor dark, or a
    checksum mismatch), e.g. a blank, blended or foreign frame.
    """
    means = _cell_lumas(_as_hwc_255(frame))
    unclear = (means > _AMBIGUOUS[0]) & (means < _AMBIGUOUS[1])
    if unclear.any():
        r, c = np.argwhere(unclear)[0]
        raise ValueError(
            f"Frame carries no valid marker: {int(unclear.sum())} of {_GRID * _GRID} cells are neither "
            f"bright nor dark (cell ({r}, {c}) has mean luma {means[r, c]:.1f}); was it drawn by "
            "draw_marker, and decoded at its own size and colour range?"
        )
    word = 0
    for bit in means.ravel() > _THRESHOLD:
        word = (word << 1) | int(bit)
    word ^= _WHITENING
    payload, crc = word >> _CRC_BITS, word & 0xFFFF
    if binascii.crc_hqx(payload.to_bytes(_PAYLOAD_BITS // 8, "big"), 0xFFFF) != crc:
        raise ValueError(
            "Frame carries no valid marker: its checksum does not match (a frame not drawn by "
            "draw_marker, or one damaged beyond what the marker tolerates)."
        )
    return Marker(
        episode_index=payload >> (_FRAME_BITS + _CAMERA_BITS),
        frame_index=(payload >> _CAMERA_BITS) & MAX_FRAME_INDEX,
        camera_index=payload & MAX_CAMERA_INDEX,
    )


def read_marker(frame: object) -> tuple[int, int]:
    """Return ``(episode_index, frame_index)`` of a frame drawn by :func:`draw_marker`.

    Raises ValueError when the frame carries no valid marker; see :func:`read_full_marker` for the camera.
    """
    marker = read_full_marker(frame)
    return marker.episode_index, marker.frame_index
