"""The checks of decoded frames (:mod:`lerobot_dali.frame_checks`) on frames and indexes made by hand: which frame
is damaged, and which picture decoding may start from. The readers' own tests (test_corrupt_frames,
test_packet_decoder, test_intra_refresh) reach them through real decodes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from av.video.frame import PictureType

from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_checks import check_random_access, is_damaged

INDEX = SimpleNamespace(width=96, height=64)


@pytest.mark.parametrize(
    ("corrupt", "width", "height", "damaged"),
    [(False, 96, 64, False), (True, 96, 64, True), (False, 1, 1, True), (False, 96, 63, True), (False, 95, 64, True)],
)
def test_a_frame_is_damaged_if_flagged_or_of_another_size_on_either_side(
    corrupt: bool, width: int, height: int, damaged: bool
) -> None:
    frame = SimpleNamespace(is_corrupt=corrupt, width=width, height=height)
    assert is_damaged(frame, INDEX) is damaged  # type: ignore[arg-type]


def _frame(pts: int, picture: PictureType) -> SimpleNamespace:
    return SimpleNamespace(pts=pts, pict_type=picture)


def test_decoding_may_start_only_from_the_keyframes_own_intra_picture() -> None:
    check_random_access("cam.mp4", _frame(30, PictureType.I), 30, 1.0)  # type: ignore[arg-type]
    for frame, shown in [
        (None, "is not shown"),
        (_frame(31, PictureType.I), "is not shown"),  # (another intra picture shown first: not the keyframe's own)
        (_frame(30, PictureType.P), "is not an intra picture"),
    ]:
        with pytest.raises(VideoDecodeError, match=rf"cam\.mp4: the keyframe at pts 1\.000000 s {shown} when decod"):
            check_random_access("cam.mp4", frame, 30, 1.0)  # type: ignore[arg-type]


def test_a_first_packet_that_is_no_keyframe_is_told_as_a_file_cut_mid_gop() -> None:
    """Unflagged, the packet decoding started from is the file's first (no keyframe before it): the file was cut
    mid-GOP, which is not the keyframe flag's fault."""
    check_random_access("cam.mp4", _frame(0, PictureType.I), 0, 0.0, flagged=False)  # type: ignore[arg-type]
    pattern = r"cam\.mp4: the file's first packet \(pts 0\.500000 s\) is no keyframe and is not shown when decoding"
    with pytest.raises(VideoDecodeError, match=pattern):
        check_random_access("cam.mp4", _frame(16, PictureType.B), 15, 0.5, flagged=False)  # type: ignore[arg-type]
