"""Per-episode columns made small for pickling: every DALI worker is sent the episode table and the sample order.

A column travels as ``(dtype, values)``: whole numbers in the narrowest integer type that holds them (an episode's
length fits 2 bytes, not 8), and a column that holds another's bytes as that one, which pickle then sends once.
:func:`widened` gives back the column as it was, dtype included.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["PickledColumn", "narrowed", "shared", "widened"]

PickledColumn = tuple[str, np.ndarray]
"""(the column's dtype, its values, whole numbers narrowed)."""


def narrowed(values: np.ndarray) -> PickledColumn:
    """``values`` to pickle, whole numbers in the narrowest integer type that holds them; others as they are."""
    narrow = values
    if values.dtype.kind in "iu" and values.size:
        low, high = int(values.min()), int(values.max())
        dtype = np.result_type(np.min_scalar_type(low), np.min_scalar_type(high if low >= 0 else -high - 1))
        narrow = values.astype(dtype) if dtype.itemsize < values.dtype.itemsize else values
    return values.dtype.str, narrow


def shared(column: PickledColumn, others: Iterable[PickledColumn]) -> PickledColumn:
    """``column``, or the first of ``others`` that holds the same bytes in the same dtype (pickled once)."""
    dtype, values = column
    for other in others:
        other_dtype, other_values = other
        same_layout = other_dtype == dtype and other_values.dtype == values.dtype and other_values.shape == values.shape
        if same_layout and np.array_equal(_bytes_of(other_values), _bytes_of(values)):
            return other
    return column


def _bytes_of(values: np.ndarray) -> np.ndarray:
    """``values``' bytes (NaNs and -0.0 compared as stored), of a strided view too (no byte view of its own)."""
    return np.ascontiguousarray(values).view(np.uint8)


def widened(column: PickledColumn, done: dict[int, np.ndarray]) -> np.ndarray:
    """The column :func:`narrowed` was given, once per unpickled array (``done``, by its id: a column pickled once
    for several stays one array)."""
    dtype, values = column
    if id(values) not in done:
        done[id(values)] = values.astype(dtype) if values.dtype != np.dtype(dtype) else values
    return done[id(values)]
