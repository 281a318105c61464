"""What the first episode, read once when the iterator is built, fixes for every batch.

Each image camera's (H, W, C), which the workers hold every image to, and the scalar features a data file stores as
one-element lists, which batch as (B, 1), not (B,): every episode's rows are given the first one's shapes, so a
file written another way cannot change a batch's shape. Apart from the iterator, which passes them to its workers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .dataset_reader import LeRobotDatasetReader
from .errors import DatasetError
from .image_frames import first_image_shape

__all__ = ["first_episode_rows", "image_shapes", "listed_scalars"]


def image_shapes(reader: LeRobotDatasetReader) -> dict[str, tuple[int, int, int]]:
    """(H, W, C) of each image camera's first image (of the first episode), which the workers hold every image to.
    A camera of 16-bit images not flagged a depth map fails here, naming itself, rather than in a worker."""
    shapes = {key: first_image_shape(reader, 0, key) for key in reader.image_keys}
    return {key: shape for key, shape in shapes.items() if shape is not None}


def _scalar_keys(reader: LeRobotDatasetReader) -> list[str]:
    features = reader.info.features
    return [k for k in reader.tabular_keys if features[k].is_scalar and not features[k].is_host_value]


def first_episode_rows(reader: LeRobotDatasetReader) -> dict[str, np.ndarray] | None:
    """The first episode's rows of the scalar features and the index columns, read once when the iterator is built
    (its data file's row groups were decoded twice, for :func:`listed_scalars` and for the frame lookup); None
    where there is none or they do not read (the lookup then reads again, failing with the file named)."""
    if not reader.num_episodes:
        return None
    try:
        return reader.read_episode(0, _scalar_keys(reader))
    except DatasetError:
        return None


def listed_scalars(reader: LeRobotDatasetReader, rows: Mapping[str, np.ndarray] | None) -> frozenset[str] | None:
    """The scalar features (declared shape (1,)) that the first episode's data file stores as one-element lists, so
    that they batch as (B, 1), not (B,): the workers give every episode's rows that shape. A data file that stores
    one the other way (another writer's, merged in or in a union) changed the batch's shape, or failed to stack
    with a ValueError naming neither the feature nor the file. None where the first episode's rows do not read:
    each file then keeps its own, and the workers' read of that episode fails naming the file. ``rows``: the first
    episode's (:func:`first_episode_rows`)."""
    keys = _scalar_keys(reader)
    if not keys or not reader.num_episodes:
        return frozenset()
    if rows is None:
        return None
    return frozenset(k for k in keys if rows[k].ndim == 2)
