"""Cases of ``meta/info.json``'s parsing (:mod:`lerobot_dali.dataset_info`) that a mutation pass found unpinned: a
frame rate under one frame a second, a path pattern's end, a camera's video info read without a depth flag."""

from __future__ import annotations

import re

import pytest

from lerobot_dali.dataset_info import DatasetInfo, VideoInfo, template_pattern
from lerobot_dali.errors import DatasetError


def _info(fps: object) -> DatasetInfo:
    raw = {
        "codebase_version": "v3.0",
        "fps": fps,
        "features": {"action": {"dtype": "float32", "shape": [6]}},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    }
    return DatasetInfo.from_json(raw, source="meta/info.json")


@pytest.mark.parametrize("fps", [0.5, 1, 1.5])
def test_a_dataset_recorded_at_a_frame_a_second_or_slower_reads_its_rate(fps: float) -> None:
    """Any positive rate is one (a slow sensor's rows, a time lapse): only zero, negatives and non-numbers are not."""
    assert _info(fps).fps == fps


@pytest.mark.parametrize("fps", [0, -0.5])
def test_a_rate_of_zero_or_below_is_refused_naming_it(fps: float) -> None:
    with pytest.raises(DatasetError, match=rf"^meta/info\.json: fps must be a positive number, got {fps}; set fps"):
        _info(fps)


def test_a_template_pattern_ends_where_the_template_does() -> None:
    """The literal after the last field closes the pattern: a file that only starts with a name the template gives
    (a partial download, a backup) is not matched."""
    pattern = template_pattern("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", {"file_index": r"\d+"})
    assert re.fullmatch(pattern, "data/chunk-000/file-012.parquet")["file_index"] == "012"
    assert re.fullmatch(pattern, "data/chunk-000/file-012.parquet.part") is None
    assert re.fullmatch(pattern, "data/chunk-000/file-012.parquetx") is None


def test_a_cameras_video_info_is_of_colour_unless_said_to_be_of_depth() -> None:
    """``VideoInfo.from_json`` reads a depth quantiser only where asked (``depth_map=True``)."""
    raw = {"video.codec": "av1", "video.fps": 30, "video.height": 4, "video.width": 6}
    colour = VideoInfo.from_json(raw)
    assert colour == VideoInfo(codec="av1", fps=30.0, height=4, width=6) and not colour.is_depth_map
    assert VideoInfo.from_json({**raw, "is_depth_map": True}, depth_map=True).is_depth_map
