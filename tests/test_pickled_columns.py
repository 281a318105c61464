"""What every DALI worker is sent per episode: the episode table and the sample order, small and unpickled exactly."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from lerobot_dali.episode_pieces import EpisodePieces
from lerobot_dali.episode_table import CameraFiles, EpisodeTable
from lerobot_dali.pickled_columns import narrowed, shared, widened
from lerobot_dali.sample_order import OrderOptions, SampleOrder

EPISODES = 20_000


def _lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(150, 441, EPISODES)


def _table(*, aligned: bool) -> EpisodeTable:
    """A v3.0 table of DROID's layout: 400 episodes a data file, 100 a video file, 3 cameras."""
    length = _lengths()
    to_index = np.cumsum(length)
    from_index = to_index - length
    pos = np.arange(EPISODES)
    data_file, video_file = pos // 400, pos // 100
    start = (from_index - from_index[video_file * 100]) / 15
    cameras = {}
    for c in range(3):
        shift = 0 if aligned else c  # (cameras whose files roll over at other episodes)
        file = (pos + shift) // 100
        following = np.append(start[1:] + shift, np.nan)
        cameras[f"cam{c}"] = CameraFiles(
            file // 1000,
            file % 1000,
            start + shift,
            np.where(np.append(file[1:], -1) == file, following, np.nan),  # (where the file's next episode starts)
        )
    return EpisodeTable(
        pos.astype(np.int64), length, from_index, to_index, data_file // 1000, data_file % 1000,
        from_index - from_index[data_file * 400], pa.nulls(EPISODES, pa.list_(pa.string())), cameras,
        np.bincount(data_file, weights=length).astype(np.int64)[data_file],
    )  # fmt: skip


def _assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("aligned", [True, False])
def test_an_episode_table_is_sent_in_a_third_of_its_bytes_and_unpickled_as_it_was(aligned: bool) -> None:
    """172 bytes an episode were sent to every worker (92,000 episodes of 3 cameras: 15.8 MB each)."""
    table = _table(aligned=aligned)
    sent = pickle.dumps(table)
    assert len(sent) / EPISODES < (60 if aligned else 100)
    copy = pickle.loads(sent)
    for name in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "data_chunk_index",
                 "data_file_index", "data_row_start", "data_file_rows"):  # fmt: skip
        _assert_same(getattr(copy, name), getattr(table, name))
    assert copy.tasks.equals(table.tasks)
    for key, files in table.cameras.items():
        for name in ("chunk_index", "file_index", "from_timestamp_s", "next_from_timestamp_s"):
            _assert_same(getattr(copy.cameras[key], name), getattr(files, name))
    _assert_same(copy.data_file_ids(), table.data_file_ids())
    # (a column sent once stays one array there)
    assert (copy.cameras["cam1"].next_from_timestamp_s is copy.cameras["cam0"].next_from_timestamp_s) is aligned


def test_a_sample_order_is_sent_without_its_episodes_positions_and_deals_the_same() -> None:
    lengths = _lengths()
    for options, most in ((OrderOptions(seed=3), 3), (OrderOptions(piece_frames=100), 20)):
        order = SampleOrder(lengths, rank=1, world_size=2, options=options)
        sent = pickle.dumps(order)
        assert len(sent) / EPISODES < most  # (24 bytes before)
        copy = pickle.loads(sent)
        for epoch in (0, 1):
            for a, b in zip(copy.samples(epoch, 0, 500), order.samples(epoch, 0, 500), strict=True):
                _assert_same(a, b)


@pytest.mark.parametrize("options", [{}, {"piece_frames": 100}, {"drop_first": 3, "drop_last": 2}])
def test_episode_pieces_unpickle_as_they_were(options: dict) -> None:
    pieces = EpisodePieces.cut(_lengths(), options.get("piece_frames"), drop_first=options.get("drop_first", 0),
                               drop_last=options.get("drop_last", 0))  # fmt: skip
    copy = pickle.loads(pickle.dumps(pieces))
    for name in ("episode", "offset", "length"):
        _assert_same(getattr(copy, name), getattr(pieces, name))
    assert copy.whole == pieces.whole == (not options)


@pytest.mark.parametrize(
    ("values", "sent"),
    [
        (np.array([0, 255]), np.uint8),
        (np.array([-1, 300]), np.int16),
        (np.array([0, 2**40]), np.int64),
        (np.array([], dtype=np.int64), np.int64),
        (np.array([0.5, np.nan]), np.float64),
        (np.array([1, 2], dtype=np.int32), np.uint8),
        (np.array([-129, 127]), np.int16),
        (np.array([-128, 255]), np.int16),
    ],
)
def test_a_column_is_sent_in_the_narrowest_integer_type_and_comes_back_as_it_was(values: np.ndarray, sent) -> None:
    column = pickle.loads(pickle.dumps(narrowed(values)))
    assert column[1].dtype == sent
    _assert_same(widened(column, {}), values)


def test_only_a_column_of_the_same_bytes_and_dtype_is_shared() -> None:
    zeros, negative_zeros = narrowed(np.zeros(3)), narrowed(np.array([-0.0, 0.0, 0.0]))
    assert shared(negative_zeros, [zeros]) is negative_zeros  # (equal, not the same bytes)
    assert shared(narrowed(np.zeros(3, np.int64)), [zeros]) is not zeros
    assert shared(narrowed(np.zeros(3)), [negative_zeros, zeros]) is zeros


def test_a_strided_column_is_compared_by_its_values() -> None:
    """A column that is a strided view (every other row of a float column) raised ValueError from its byte view."""
    strided = np.arange(10.0)[::2]
    whole = narrowed(strided.copy())
    assert shared(narrowed(strided), [whole]) is whole
    other = narrowed(strided)
    assert shared(whole, [other]) is other
    assert shared(narrowed(np.arange(10.0)[1::2]), [whole]) is not whole
