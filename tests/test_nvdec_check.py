"""The NVDEC probe's clip and the check of its pictures against PyAV's, with DALI's CPU decoder (VP9) standing in
for NVDEC: a second decoder, with a YUV->RGB conversion of its own, as NVDEC's is."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from lerobot_dali import decode_route
from lerobot_dali.clips import build_clip
from lerobot_dali.concurrent_calls import KeyedLocks
from lerobot_dali.cpu_decode import CpuFrameDecoder
from lerobot_dali.dali_video import decode_clip_batch
from lerobot_dali.decode_route import DecodeRoute, GpuInfo, route_for_video
from lerobot_dali.errors import CodecUnsupportedError, VideoDecodeError
from lerobot_dali.nvdec_check import PROBE_MAX_MEAN_DIFF, nvdec_disagreement, probe_frames
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.yuv_frames import frame_planes
from tests.test_clips import CLOSED, OPEN, _synthetic
from tests.test_yuv_frames import _nvdec_like, encode_flat_patches
from tests.video_fixtures import MarkerVideo, r1_video

H200 = GpuInfo(device_id=0, name="NVIDIA H200", compute_capability=(9, 0))


def test_probe_frames_are_the_first_and_a_later_keyframe_with_the_frames_after_it() -> None:
    # CLOSED: display 0..8, its second keyframe shows at 5; OPEN: at 6 (leading pictures 4, 5 come before it).
    assert probe_frames(CLOSED).tolist() == [0, 5, 6, 7, 8]
    assert probe_frames(OPEN).tolist() == [0, 6, 7, 8]
    one_gop = _synthetic(list(range(9)), [True] + [False] * 8)
    assert probe_frames(one_gop).tolist() == [0, 1, 2, 3]
    # Keyframes at display 0, 4, 8, 12, 16: the later ones are 4..16, the one halfway through them 12.
    five_gops = _synthetic(list(range(20)), [i % 4 == 0 for i in range(20)])
    assert probe_frames(five_gops).tolist() == [0, 12, 13, 14, 15]
    assert probe_frames(_synthetic([0], [True])).tolist() == [0]


def test_probe_frames_are_frames_shown(tmp_path: Path) -> None:
    """An edit list hiding frames before those shown: the probe asks for none of them (no route shows them)."""
    hidden = np.zeros(20, bool)
    hidden[:3] = True  # display 0..2 hidden; keyframes shown at 4, 8, 12, 16
    index = _synthetic(list(range(20)), [i % 4 == 0 for i in range(20)])
    shown = dataclasses.replace(index, hidden=hidden)
    assert shown.shown == range(3, 20)
    assert probe_frames(shown).tolist() == [3, 12, 13, 14, 15]


@pytest.mark.parametrize("gop", [2, 30])
def test_another_decoders_pictures_agree_and_broken_ones_do_not(marker_video: MarkerVideo, gop: int) -> None:
    path = marker_video("vp9", gop)
    index = build_packet_index(path)
    frames = probe_frames(index)
    assert frames.tolist() == ([0, 46, 47, 48, 49] if gop == 2 else [0, 60, 61, 62, 63])
    clip = build_clip(path, index, frames)
    (decoded,) = decode_clip_batch([clip.data], [clip.relative_indices], device_id=None)
    assert nvdec_disagreement(decoded, path, index, frames) == ""
    # The clip's first picture given for every frame (a decoder that lost its place), a grey one, a cropped one.
    reason = nvdec_disagreement(decoded[[0, 0, 0, 0, 0]], path, index, frames)
    assert reason.startswith(f"NVDEC's frame {frames[1]} of {path} differs from the CPU decoder's by ")
    assert reason.endswith(f" levels on average (two decoders' rounding stays under {PROBE_MAX_MEAN_DIFF:g})")
    assert float(reason.split(" by ")[1].split()[0]) > 10
    grey = np.full_like(decoded, 128)
    assert "differs from the CPU decoder's" in nvdec_disagreement(grey, path, index, frames)
    cropped = np.ascontiguousarray(decoded[:, :, :-2])
    assert nvdec_disagreement(cropped, path, index, frames) == (
        f"NVDEC gave frames of shape (5, 64, 94, 3) for {path}, the CPU decoder (5, 64, 96, 3)"
    )


def test_real_footage_within_two_decoders_rounding_agrees() -> None:
    """r1's camera (H.264 with B-frames): PyAV's pictures through DALI-like rounding differences (+-2 levels of noise,
    a mean of 1) agree; the file's first picture given for frames 1000-1003 (33 s later, 6.1 levels off) does not.
    (Frames 0 and 100 are 3.9 apart: a frame for another of a still camera can pass, as the bound's comment says.)"""
    path = r1_video()
    index = build_packet_index(path)
    frames = probe_frames(index)
    assert frames.tolist() == [0, 1000, 1001, 1002, 1003]
    decoder = CpuFrameDecoder()
    try:
        exact = decoder.decode(path, index, frames)
    finally:
        decoder.close()
    noise = np.random.default_rng(0).integers(-2, 3, size=exact.shape)
    rounded = np.clip(exact.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    assert 1.0 < np.abs(rounded.astype(np.int16) - exact).mean() < 1.3
    assert nvdec_disagreement(rounded, path, index, frames) == ""
    stale = exact[[0, 0, 0, 0, 0]]  # frame 0 (the probe's first) for frames 1000-1003
    assert nvdec_disagreement(stale, path, index, frames).startswith(f"NVDEC's frame 1000 of {path} differs")


def test_colours_are_compared_in_the_colour_space_the_stream_is_tagged_with(tmp_path: Path) -> None:
    """NVDEC converts a BT.709 stream as BT.601 and the graph corrects it: its pictures agree once corrected, as the
    check corrects them, and are 5 levels off before (so a check without the correction refused them)."""
    path = encode_flat_patches(tmp_path / "bt709.mp4", width=192, height=160, colorspace=1)
    index = build_packet_index(path)
    with av.open(str(path)) as container:
        nvdec = np.stack([_nvdec_like(frame_planes(f), False)[0] for f in container.decode(video=0)])
    frames = np.arange(index.frame_count)
    assert nvdec_disagreement(nvdec, path, index, frames) == ""
    decoder = CpuFrameDecoder()
    try:
        reference = decoder.decode(path, index, frames)
    finally:
        decoder.close()
    assert np.abs(nvdec.astype(np.int16) - reference).mean(axis=(1, 2, 3)).max() > PROBE_MAX_MEAN_DIFF


def test_pictures_pyav_cannot_decode_are_not_judged(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Routing is no check of the file: where PyAV fails on the probe's frames, NVDEC's pictures stand (logged), and
    a sample reading those frames raises as it would have."""
    path = marker_video("vp9", 30)
    index = build_packet_index(path)

    def fails(*args: Any, **kwargs: Any) -> None:
        raise VideoDecodeError(f"{path}: damaged")

    monkeypatch.setattr(CpuFrameDecoder, "decode", fails)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.nvdec_check"):
        grey = np.full((5, 64, 96, 3), 128, np.uint8)
        assert nvdec_disagreement(grey, path, index, probe_frames(index)) == ""
    assert [r.getMessage() for r in caplog.records] == [
        f"NVDEC's frames of {path} are not checked: the CPU decoder failed ({path}: damaged)"
    ]


def _dali_cpu_as_nvdec(monkeypatch: pytest.MonkeyPatch, broken: bool = False) -> list[np.ndarray]:
    """The probe run in this process on H200 = DALI's CPU decoder (``broken``: its pictures of the clip's first
    frame for every frame asked); returns the clip-relative frames each probe decoded."""
    asked: list[np.ndarray] = []

    def decode(clips: list[np.ndarray], frames: list[np.ndarray], *, device_id: int | None) -> list[np.ndarray]:
        assert device_id == 0
        asked.extend(frames)
        pictures = decode_clip_batch(clips, frames, device_id=None)
        return [p[np.zeros(len(p), int)] for p in pictures] if broken else pictures

    real_probe = decode_route.probe_gpu
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_detect_gpu", lambda device_id: H200)
    monkeypatch.setattr(decode_route, "decode_clip_batch", decode)
    monkeypatch.setattr(
        decode_route, "probe_gpu", lambda samples, **kw: real_probe(samples, **{**kw, "isolate": False})
    )
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "_probing", KeyedLocks())
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    return asked


def test_a_camera_goes_to_nvdec_when_its_pictures_agree(marker_video: MarkerVideo, monkeypatch) -> None:
    asked = _dali_cpu_as_nvdec(monkeypatch)
    path = marker_video("vp9", 30)
    index = build_packet_index(path)
    assert route_for_video(path, index, label="cam") is DecodeRoute.NVDEC
    # One probe, of the probe's frames: 0 from the first GOP, 60-63 from the third.
    (relative,) = asked
    assert relative.tolist() == build_clip(path, index, [0, 60, 61, 62, 63]).relative_indices.tolist()
    assert len(relative) == 5


def test_a_camera_whose_nvdec_pictures_are_broken_is_decoded_on_the_cpu(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _dali_cpu_as_nvdec(monkeypatch, broken=True)
    path = marker_video("vp9", 30)
    index = build_packet_index(path)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        assert route_for_video(path, index, label="cam") is DecodeRoute.DALI_CPU
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"NVDEC on NVIDIA H200 cannot decode cam (vp9) (NVDEC's frame 60 of {path} differs from ")
    assert line.endswith("decoding it on the CPU (route dali_cpu).")
    with pytest.raises(CodecUnsupportedError, match=r"decode='gpu' was asked for cam \(vp9\), but NVDEC on NVIDIA "
                       r"H200 cannot decode it \(NVDEC's frame 60 of .* differs from the CPU decoder's"):  # fmt: skip
        route_for_video(path, index, decode="gpu", label="cam")
