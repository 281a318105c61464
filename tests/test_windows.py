"""Delta windows: hand-computed rows and pads, LeRobot's validation and squeeze rules (values and camera
timestamps through the whole loader: test_iterator, test_image_cameras)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lerobot_dali.errors import DeltaTimestampsError
from lerobot_dali.windows import DeltaWindows, query_indices

# One episode of 5 frames at 10 fps.
ROWS: dict[str, np.ndarray] = {
    "action": np.arange(5, dtype=np.float32) * 10,  # 0, 10, 20, 30, 40
    "observation.state": np.arange(10, dtype=np.float32).reshape(5, 2),
    "timestamp": np.arange(5, dtype=np.float32) / 10,
}


def _windows(deltas: dict[str, list[float]], **kw: object) -> DeltaWindows:
    return DeltaWindows(delta_timestamps=deltas, fps=10, **kw)  # type: ignore[arg-type]


def test_delta_index_is_rounded_seconds_times_fps() -> None:
    w = _windows({"action": [-0.2, -0.1, 0.0, 0.1], "observation.state": [0.30000001]})
    np.testing.assert_array_equal(w.delta_index["action"], [-2, -1, 0, 1])
    np.testing.assert_array_equal(w.delta_index["observation.state"], [3])
    assert w.delta_timestamps["action"] == (-0.2, -0.1, 0.0, 0.1)
    assert DeltaWindows(delta_timestamps={"a": [1 / 30]}, fps=30).delta_timestamps["a"] == (1 / 30,)  # as given


def test_half_frame_rounds_to_even_like_python_round() -> None:
    # 1.25 s * 2 fps = 2.5 frames, within tolerance 0.3 s (0.5 / 2 = 0.25); round(2.5) == 2, round(3.5) == 4.
    w = DeltaWindows(delta_timestamps={"a": [1.25, 1.75]}, fps=2, tolerance_s=0.3)
    np.testing.assert_array_equal(w.delta_index["a"], [2, 4])


@pytest.mark.parametrize(
    ("frame", "rows", "pad", "values"),
    [
        (0, [0, 0, 0, 1], [True, True, False, False], [0, 0, 0, 10]),  # episode start
        (2, [0, 1, 2, 3], [False] * 4, [0, 10, 20, 30]),
        (4, [2, 3, 4, 4], [False, False, False, True], [20, 30, 40, 40]),  # episode end
    ],
)
def test_tabular_window_at_start_middle_end(frame: int, rows: list[int], pad: list[bool], values: list[float]) -> None:
    w = _windows({"action": [-0.2, -0.1, 0.0, 0.1]})
    index, is_pad = query_indices(frame, 5, w.delta_index["action"])
    np.testing.assert_array_equal(index, rows)
    np.testing.assert_array_equal(is_pad, pad)
    assert is_pad.dtype == np.bool_
    np.testing.assert_array_equal(ROWS["action"][index], values)


def test_multidimensional_feature_keeps_its_shape() -> None:
    index, is_pad = query_indices(0, 5, _windows({"observation.state": [-0.1, 0.0]}).delta_index["observation.state"])
    np.testing.assert_array_equal(ROWS["observation.state"][index], [[0, 1], [0, 1]])
    np.testing.assert_array_equal(is_pad, [True, False])


def test_single_frame_episode() -> None:
    index, is_pad = query_indices(0, 1, _windows({"action": [-0.1, 0.0, 0.2]}).delta_index["action"])
    np.testing.assert_array_equal(index, [0, 0, 0])
    np.testing.assert_array_equal(is_pad, [True, False, True])


def test_deltas_longer_than_the_episode() -> None:
    # -10 and +10 frames on a 3-frame episode
    index, is_pad = query_indices(1, 3, _windows({"action": [-1.0, 0.0, 1.0]}).delta_index["action"])
    np.testing.assert_array_equal(index, [0, 1, 2])
    np.testing.assert_array_equal(is_pad, [True, False, True])


def test_cameras_lose_the_window_axis_only_with_one_frame() -> None:
    """LeRobot squeezes decoded video (``frames.squeeze(0)``): a camera without deltas, or with one, gives
    ``(C, H, W)``; tabular windows (shape tested in test_image_cameras) never lose the axis."""
    w = _windows({"cam": [-0.2, 0.0], "action": [0.0]}, camera_keys=["cam", "wrist", "top"])
    w1 = _windows({"top": [0.1]}, camera_keys=["top"])
    assert (w.squeeze_camera("cam"), w.squeeze_camera("wrist"), w1.squeeze_camera("top")) == (False, True, True)
    assert (w.window_length("cam"), w.window_length("wrist"), w.window_length("action")) == (2, 1, 1)
    with pytest.raises(
        KeyError, match=r"not a camera key \(camera keys: \['cam', 'top', 'wrist'\]\): pass one of those"
    ):
        w.squeeze_camera("action")
    with pytest.raises(KeyError, match=r"\(did you mean \['wrist'\]\?\): pass one of those"):
        w.squeeze_camera("wirst")


def test_query_indices_over_episodes_of_different_lengths() -> None:
    rows, pad = query_indices(np.array([0, 2, 0]), np.array([1, 3, 4]), [-1, 0, 2])
    np.testing.assert_array_equal(rows, [[0, 0, 0], [1, 2, 2], [0, 0, 2]])
    np.testing.assert_array_equal(pad, [[True, False, True], [False, False, True], [True, False, False]])
    with pytest.raises(IndexError, match="frame_index"):
        query_indices(3, 3, [0])
    with pytest.raises(IndexError, match="frame_index"):
        query_indices(-1, 3, [1])


def test_matches_lerobot_absolute_index_formula() -> None:
    # LeRobot clamps absolute indices to [ep_start, ep_end); check all frames of three concatenated episodes.
    lengths = [1, 4, 7]
    deltas = [-5, -1, 0, 2, 6]
    starts = np.cumsum([0, *lengths[:-1]])
    for ep_start, n in zip(starts.tolist(), lengths, strict=True):
        ep_end = ep_start + n
        for frame in range(n):
            idx = ep_start + frame
            expected_rows = [max(ep_start, min(ep_end - 1, idx + d)) - ep_start for d in deltas]
            expected_pad = [(idx + d < ep_start) | (idx + d >= ep_end) for d in deltas]
            rows, pad = query_indices(frame, n, deltas)
            assert rows.tolist() == expected_rows and pad.tolist() == expected_pad


@pytest.mark.parametrize(("delta", "either_side"), [(0.05, "0 s and 0.1 s"), (0.1002, "0.1 s and 0.2 s"),
                                                    (-0.149, "-0.2 s and -0.1 s")])  # fmt: skip
def test_non_multiple_deltas_are_rejected(delta: float, either_side: str) -> None:
    """The message says what to give instead (it named the nearest frame only, of two equally near for 0.05)."""
    with pytest.raises(DeltaTimestampsError) as info:
        _windows({"action": [0.0, delta]})
    message = str(info.value)
    assert "'action'" in message and str(delta) in message and "fps=10" in message and "0.0001" in message
    assert "so give each offset as k / 10 s (e.g. [k / 10 for k in range(16)])" in message
    assert message.endswith(f"the frames either side of it are {either_side}"), message


def test_deltas_within_tolerance_are_accepted() -> None:
    # |1.0005 - 1| / 10 = 5e-5 <= 1e-4.
    np.testing.assert_array_equal(_windows({"action": [0.10005]}).delta_index["action"], [1])


def test_invalid_specifications() -> None:
    with pytest.raises(DeltaTimestampsError, match="non-empty list"):
        _windows({"action": []})
    with pytest.raises(DeltaTimestampsError, match="non-empty list of seconds, got '0.1'"):
        _windows({"action": "0.1"})  # type: ignore[dict-item]
    with pytest.raises(DeltaTimestampsError, match="finite"):
        _windows({"action": [float("nan")]})
    said = (
        r"not a feature .* \(did you mean \['action'\]\?\): name one of those, or drop 'actoin' from delta_timestamps$"
    )
    with pytest.raises(DeltaTimestampsError, match=said):
        _windows({"actoin": [0.0]}, feature_keys=["action"])
    with pytest.raises(ValueError, match="fps"):
        DeltaWindows(delta_timestamps={"action": [0.0]}, fps=0)
    with pytest.raises(ValueError, match="fps must be a positive number, got True"):
        DeltaWindows(delta_timestamps={"action": [0.0]}, fps=True)
    with pytest.raises(TypeError, match=r"delta_timestamps must map keys to lists of seconds, got <class 'list'>"):
        DeltaWindows(delta_timestamps=[("action", [0.0])], fps=10)  # type: ignore[arg-type]
    for tolerance_s in (-1e-4, float("inf"), float("nan")):  # an infinite tolerance would accept any delta
        with pytest.raises(ValueError, match="tolerance_s must be a positive finite number"):
            DeltaWindows(delta_timestamps={"action": [0.0]}, fps=10, tolerance_s=tolerance_s)
    with pytest.raises(ValueError, match="episode_length must be >= 1"):
        query_indices(0, 0, [0])
    with pytest.raises(ValueError, match="must be 1-D"):
        query_indices(0, 3, [[0]])


def test_delta_exactly_at_tolerance_is_accepted_like_lerobot() -> None:
    # LeRobot refuses only when abs(d*fps - round(d*fps)) / fps > tolerance_s: 1.25 s at 2 fps is 2.5 frames,
    # off by 0.5 / 2 = 0.25 s, exactly the tolerance, so it is accepted and rounds (half to even) to 2.
    w = DeltaWindows(delta_timestamps={"a": [1.25]}, fps=2, tolerance_s=0.25)
    np.testing.assert_array_equal(w.delta_index["a"], [2])


def test_query_indices_refuses_a_scalar_delta_index() -> None:
    with pytest.raises(ValueError, match="delta_index must be 1-D"):
        query_indices(2, 5, np.int64(1))


def test_windows_are_frozen_and_keyword_only() -> None:
    """Its delta_index is worked out once from fps and delta_timestamps: neither may change after (a new fps would
    leave the rows of the old one), and a call names each (two numbers given in the wrong order would pass)."""
    w = _windows({"action": [0.0, 0.1]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.fps = 20  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        DeltaWindows({"action": [0.0, 0.1]}, 10)  # type: ignore[misc]


def test_windows_of_one_specification_compare_equal() -> None:
    """Equal by what they were given (delta_index, arrays worked out from it, is left out: compared, its arrays of
    several deltas raised ValueError's ambiguous truth value)."""
    w = _windows({"action": [-0.1, 0.0, 0.1]}, camera_keys=["cam"])
    assert w == _windows({"action": [-0.1, 0.0, 0.1]}, camera_keys=["cam"])
    assert w != _windows({"action": [-0.1, 0.0, 0.2]}, camera_keys=["cam"])


def test_query_indices_of_unsigned_frames_or_deltas_are_int64_rows() -> None:
    """Rows index arrays: uint64 frames (or deltas) with int64 ones add up to float64 in numpy, which no array takes
    as an index; each is taken as int64 first."""
    for frame, delta in [(np.array([0, 3], np.uint64), [-1, 0, 2]), (np.array([0, 3]), np.array([0, 1, 2], np.uint64))]:
        rows, pad = query_indices(frame, np.array([4, 4], np.uint64), delta)
        assert rows.dtype == np.int64
        unsigned = isinstance(delta, np.ndarray)
        np.testing.assert_array_equal(rows, [[0, 1, 2], [3, 3, 3]] if unsigned else [[0, 0, 2], [2, 3, 3]])
        pads = (
            [[False, False, False], [False, True, True]] if unsigned else [[True, False, False], [False, False, True]]
        )
        np.testing.assert_array_equal(pad, pads)


@pytest.mark.parametrize(
    ("deltas", "drop", "unread"),
    [([-0.1, 0.0], 7, 7), ([0.0, 0.2], 3, 1), ([0.0, 0.5], 3, 0), ([-1.0], 0, 10), (None, 2, 2)],
)
def test_unread_tail_counts_the_rows_no_window_reaches(deltas: list[float] | None, drop: int, unread: int) -> None:
    """Rows at an episode's end no sample reads: Diffusion Policy's cameras (-1..0, 7 dropped) none of the last 7; a
    window 2 rows on, 3 dropped: the last; 5 on: every row; only 1 s back: the last 10 (10 fps); no window: the
    dropped."""
    windows = _windows({} if deltas is None else {"cam": deltas}, camera_keys=["cam"])
    assert windows.unread_tail("cam", drop) == unread
