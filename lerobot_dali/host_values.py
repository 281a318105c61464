"""Carry non-numeric features (strings, LeRobot's ``language`` annotations) through DALI's numeric outputs.

DALI moves only numeric arrays, so each sample's value travels as the UTF-8 bytes of its JSON text, padded
with NUL to the batch's longest (JSON escapes NUL inside strings, so padding never meets text), and comes
back on the host as the Python object LeRobot's collate gives: a string, or a list/dict structure.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .errors import DataFileError

__all__ = ["decode_host_values", "encode_host_values"]


def encode_host_values(values: np.ndarray, *, key: str) -> np.ndarray:
    """``values`` (an object array, (B,) or (B, T) for a window) as (B, L) uint8 JSON bytes, NUL-padded."""
    texts = []
    for value in values:
        plain = value.tolist() if isinstance(value, np.ndarray) else value
        try:
            texts.append(json.dumps(plain, ensure_ascii=False).encode())
        except (TypeError, ValueError) as e:
            raise DataFileError(
                f"feature {key!r} holds a value JSON cannot carry ({e}); select the keys to read with keys=[...]"
            ) from e
    out = np.zeros((len(texts), max((len(t) for t in texts), default=1)), dtype=np.uint8)
    for row, text in zip(out, texts, strict=True):
        row[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    return out


def decode_host_values(array: np.ndarray) -> list[Any]:
    """The per-sample values of an :func:`encode_host_values` array."""
    return [json.loads(row.tobytes().rstrip(b"\0")) for row in np.asarray(array, dtype=np.uint8)]
