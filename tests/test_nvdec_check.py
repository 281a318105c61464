"""The NVDEC probe's clips and the check of their pictures against PyAV's, with DALI's CPU decoder (VP9) standing in
for NVDEC: a second decoder, with a YUV->RGB conversion of its own, as NVDEC's is."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from lerobot_dali import decode_route, nvdec_check
from lerobot_dali.clips import build_clip
from lerobot_dali.concurrent_calls import KeyedLocks
from lerobot_dali.cpu_decode import CpuFrameDecoder
from lerobot_dali.dali_video import decode_clip_batch
from lerobot_dali.decode_route import DecodeRoute, GpuInfo, route_for_video
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.nvdec_check import PROBE_MAX_MEAN_DIFF, nvdec_disagreement, probe_clips, recolored
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.yuv_frames import frame_planes, stream_color
from tests.fake_remote import FakeRemoteFileSystem
from tests.test_clips import CLOSED, OPEN, _encode_open_gop, _synthetic
from tests.test_edit_lists import _with_edit
from tests.test_yuv_frames import _nvdec_like, encode_flat_patches
from tests.video_fixtures import MarkerVideo, clip_pictures, count_decodes, encode_open_keyframes, r1_video

H200 = GpuInfo(device_id=0, name="NVIDIA H200", compute_capability=(9, 0))


def _listed(clips: list[np.ndarray]) -> list[list[int]]:
    return [clip.tolist() for clip in clips]


def test_probe_clips_are_the_first_frame_and_a_later_keyframe_with_the_frames_after_it() -> None:
    # CLOSED: display 0..8, its second keyframe shows at 5; OPEN: at 6 (leading pictures 4, 5 come before it).
    assert _listed(probe_clips(CLOSED)) == [[0], [5, 6, 7, 8]]
    assert _listed(probe_clips(OPEN)) == [[0], [6, 7, 8]]
    one_gop = _synthetic(list(range(9)), [True] + [False] * 8)
    assert _listed(probe_clips(one_gop)) == [[0, 1, 2, 3]]
    # Keyframes at display 0, 4, 8, 12, 16: the later ones are 4..16, the one halfway through them 12.
    five_gops = _synthetic(list(range(20)), [i % 4 == 0 for i in range(20)])
    assert _listed(probe_clips(five_gops)) == [[0], [12, 13, 14, 15]]
    assert _listed(probe_clips(_synthetic([0], [True]))) == [[0]]


def test_probe_clips_hold_frames_shown_only(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Frames an edit list hides (before those shown, or past the edit's end) are decoded, never shown: the probe
    asks for none of them."""
    hidden = np.zeros(20, bool)
    hidden[:3] = True  # display 0..2 hidden; keyframes shown at 4, 8, 12, 16
    index = dataclasses.replace(_synthetic(list(range(20)), [i % 4 == 0 for i in range(20)]), hidden=hidden)
    assert index.shown == range(3, 20)
    assert _listed(probe_clips(index)) == [[3], [12, 13, 14, 15]]
    # A real file whose edit hides its last episode: its keyframe at 60 is hidden, the one halfway through is 30.
    path = _with_edit(marker_video("h264", 30), tmp_path / "trimmed_end.mp4", "trimmed_end")
    index = build_packet_index(path)
    assert index.shown == range(60)
    assert _listed(probe_clips(index)) == [[0], [30, 31, 32, 33]]


def test_the_probe_clips_are_cut_as_the_loader_cuts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first frame and the later keyframe each get a clip of their own, as samples of them would: one clip of both
    was decoded from frame 0 on where the later keyframe is an open one (x264 open GOPs, x265's default), half the
    file, and never from that keyframe, the picture NVDEC might get wrong. PyAV's reference decodes each on its own."""
    path = encode_open_keyframes(tmp_path / "open_keyframes.mp4", frames=40)
    index = build_packet_index(path)
    assert _listed(probe_clips(index)) == [[0], [21, 22, 23, 24]]
    assert build_clip(path, index, [0, 21, 22, 23, 24]).frame_count == 25  # (one clip: frames 0-24 decoded)
    assert build_clip(path, index, [21, 22, 23, 24]).frame_count == 4  # (from the I picture at 21, no IDR)
    path = tmp_path / "open_gop.mp4"
    _encode_open_gop(path, "libx264")  # (leading pictures before each keyframe)
    index = build_packet_index(path)
    wanted = probe_clips(index)
    assert _listed(wanted) == [[0], [50, 51, 52, 53]]
    clips = [build_clip(path, index, frames) for frames in wanted]
    assert [clip.frame_count for clip in clips] == [1, 5]  # (one clip of both: 55)
    decodes = count_decodes(monkeypatch)
    pictures = [clip_pictures(clip.data, clip.relative_indices) for clip in clips]
    assert nvdec_disagreement(pictures, path, index, wanted) == ""
    assert decodes == [1, 4]


@pytest.mark.parametrize("gop", [2, 30])
def test_another_decoders_pictures_agree_and_broken_ones_do_not(marker_video: MarkerVideo, gop: int) -> None:
    path = marker_video("vp9", gop)
    index = build_packet_index(path)
    wanted = probe_clips(index)
    assert _listed(wanted) == ([[0], [46, 47, 48, 49]] if gop == 2 else [[0], [60, 61, 62, 63]])
    clips = [build_clip(path, index, frames) for frames in wanted]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=None)
    assert nvdec_disagreement(decoded, path, index, wanted) == ""
    # The first clip's picture given for every frame (a decoder that lost its place), a grey one, a cropped one.
    first, later = decoded
    reason = nvdec_disagreement([first, first[[0, 0, 0, 0]]], path, index, wanted)
    assert reason.startswith(f"NVDEC's frame {wanted[1][0]} of {path} is ")
    assert reason.endswith(
        f" levels from PyAV's in brightness on average (two decoders' rounding stays under {PROBE_MAX_MEAN_DIFF:g})"
    )
    assert float(reason.split(" is ")[1].split()[0]) > 10
    assert " is " in nvdec_disagreement([np.full_like(first, 128), later], path, index, wanted)
    cropped = np.ascontiguousarray(later[:, :, :-2])
    assert nvdec_disagreement([first, cropped], path, index, wanted) == (
        f"NVDEC gave frames of shape (4, 64, 94, 3) for {path}, PyAV (4, 64, 96, 3)"
    )


def test_real_footage_within_two_decoders_rounding_agrees() -> None:
    """r1's camera (H.264 with B-frames): PyAV's pictures with rounding noise (+-2 levels per channel) agree; the
    file's first picture given for frames 1000-1003 (33 s later, 6.1 levels off in RGB) does not. (Frames 0 and 100
    are 3.9 apart: a frame for another of a still camera can pass, as the bound's comment says.)"""
    path = r1_video()
    index = build_packet_index(path)
    wanted = probe_clips(index)
    assert _listed(wanted) == [[0], [1000, 1001, 1002, 1003]]
    decoder = CpuFrameDecoder()
    try:
        exact = [decoder.decode(path, index, frames) for frames in wanted]
    finally:
        decoder.close()
    rng = np.random.default_rng(0)
    rounded = [np.clip(p.astype(np.int16) + rng.integers(-2, 3, size=p.shape), 0, 255).astype(np.uint8) for p in exact]
    assert nvdec_disagreement(rounded, path, index, wanted) == ""
    stale = [exact[0], exact[0][[0, 0, 0, 0]]]
    assert nvdec_disagreement(stale, path, index, wanted).startswith(f"NVDEC's frame 1000 of {path} is ")


def test_saturated_colours_that_two_decoders_convert_apart_agree_in_brightness(tmp_path: Path) -> None:
    """DALI interpolates chroma where swscale repeats it: on saturated colour blocks of 8 pixels their RGB is over
    10 levels apart on average (emulated from DALI's source), their luma within the bound."""
    rng = np.random.default_rng(1)
    blocks = rng.choice(np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8), size=(12, 16))
    image = np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)
    path = tmp_path / "blocks.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10, options={"crf": "10"})
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        for _ in range(3):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    index = build_packet_index(path)
    with av.open(str(path)) as container:
        planes = [frame_planes(f) for f in container.decode(video=0)]
    nvdec = np.stack([_bilinear_nvdec(p) for p in planes])
    wanted = [np.arange(index.frame_count)]
    decoder = CpuFrameDecoder()
    try:
        rgb_off = np.abs(nvdec.astype(np.int16) - decoder.decode(path, index, wanted[0])).mean()
    finally:
        decoder.close()
    assert rgb_off > 10
    assert nvdec_disagreement([nvdec], path, index, wanted) == ""


def _bilinear_nvdec(planes: Any) -> np.ndarray:
    """DALI's NVDEC conversion as its source reads (``_nvdec_like``: BT.601 limited range, rounded to nearest) with
    chroma interpolated bilinearly between sample centres, on a frame's planes."""
    height, width = planes.luma.shape

    def upsampled(plane: np.ndarray) -> np.ndarray:
        ys = np.clip((np.arange(height) + 0.5) / 2 - 0.5, 0, plane.shape[0] - 1)
        xs = np.clip((np.arange(width) + 0.5) / 2 - 0.5, 0, plane.shape[1] - 1)
        y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
        y1, x1 = np.minimum(y0 + 1, plane.shape[0] - 1), np.minimum(x0 + 1, plane.shape[1] - 1)
        wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
        p = plane.astype(np.float64)
        top = p[y0][:, x0] * (1 - wx) + p[y0][:, x1] * wx
        bottom = p[y1][:, x0] * (1 - wx) + p[y1][:, x1] * wx
        return top * (1 - wy) + bottom * wy

    return _nvdec_like(planes, False, upsampled)[0]


@pytest.mark.parametrize("full_range", [False, True])
def test_colours_are_compared_in_the_colour_space_the_stream_is_tagged_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_range: bool
) -> None:
    """NVDEC converts a BT.709 stream as BT.601 (JPEG's BT.601 when full range) and the graph corrects it: its
    pictures agree once corrected, as the check corrects them, and a check without the correction refuses them."""
    path = encode_flat_patches(tmp_path / "bt709.mp4", width=192, height=160, colorspace=1, full=full_range)
    index = build_packet_index(path)
    assert stream_color(index.template) == (1, full_range)
    with av.open(str(path)) as container:
        nvdec = [np.stack([_nvdec_like(frame_planes(f), full_range)[0] for f in container.decode(video=0)])]
    wanted = [np.arange(index.frame_count)]
    assert nvdec_disagreement(nvdec, path, index, wanted) == ""
    monkeypatch.setattr(nvdec_check, "nvdec_color_fix", lambda colorspace, full_range: None)
    assert nvdec_disagreement(nvdec, path, index, wanted).startswith(f"NVDEC's frame 0 of {path} is ")


def test_recolored_rounds_to_nearest_and_saturates() -> None:
    fix = np.array([[1, 0, 0, 0.6], [0, 1, 0, -0.6], [0, 0, 2, 0]], np.float32)
    pixels = np.array([[[[10, 20, 130]]], [[[0, 0, 0]]]], np.uint8)
    assert recolored(pixels, fix).tolist() == [[[[11, 19, 255]]], [[[1, 0, 0]]]]


def test_a_colour_space_without_a_matrix_here_is_not_judged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """YCgCo (8): no matrix here to bring NVDEC's BT.601 to what swscale makes of it, so the pictures are not judged
    (logged) rather than refused for colours the graph would not correct either."""
    path = tmp_path / "ycgco.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 192, 160, "yuv420p"
        stream.codec_context.colorspace = 8  # (the stream's tag only)
        for i in range(3):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((160, 192, 3), 60 * i, np.uint8), "rgb24")))
        container.mux(stream.encode())
    index = build_packet_index(path)
    assert stream_color(index.template)[0] == 8
    assert _not_judged(path, index, caplog, logging.INFO) == [
        f"NVDEC's frames of {path} are not checked: colour space 8 is not converted here"
    ]


def _not_judged(path: Path, index: Any, caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """What the check logs (at ``level``) where it judges no pictures: grey ones, which it would refuse, pass."""
    wanted = probe_clips(index)
    with caplog.at_level(level, logger="lerobot_dali.nvdec_check"):
        grey = [np.full((len(frames), index.height, index.width, 3), 128, np.uint8) for frames in wanted]
        assert nvdec_disagreement(grey, path, index, wanted) == ""
    return [r.getMessage() for r in caplog.records]


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
    assert _not_judged(path, index, caplog, logging.WARNING) == [
        f"NVDEC's frames of {path} are not checked: PyAV failed ({path}: damaged)"
    ]


def _dali_cpu_as_nvdec(monkeypatch: pytest.MonkeyPatch, broken: bool = False) -> list[np.ndarray]:
    """The probe run in this process on H200 = DALI's CPU decoder (``broken``: its picture of the first clip's first
    frame for every frame asked); returns the clip-relative frames of each clip the probes decoded."""
    asked: list[np.ndarray] = []

    def decode(clips: list[np.ndarray], frames: list[np.ndarray], *, device_id: int | None) -> list[np.ndarray]:
        assert device_id == 0
        asked.extend(frames)
        pictures = decode_clip_batch(clips, frames, device_id=None)
        return [np.repeat(pictures[0][:1], len(p), axis=0) for p in pictures] if broken else pictures

    real_probe = decode_route.probe_gpu
    in_this_process = lambda samples, **kw: real_probe(samples, **{**kw, "isolate": False})  # noqa: E731
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_detect_gpu", lambda device_id: H200)
    monkeypatch.setattr(decode_route, "decode_clip_batch", decode)
    monkeypatch.setattr(decode_route, "probe_gpu", in_this_process)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "_probing", KeyedLocks())
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    return asked


def test_a_camera_goes_to_nvdec_when_its_pictures_agree(marker_video: MarkerVideo, monkeypatch) -> None:
    asked = _dali_cpu_as_nvdec(monkeypatch)
    path = marker_video("vp9", 30)
    index = build_packet_index(path)
    assert route_for_video(path, index, label="cam") is DecodeRoute.NVDEC
    # One probe, of two clips cut as the loader cuts them: 0 from the first GOP, 60-63 from the third.
    first, later = asked
    assert first.tolist() == build_clip(path, index, [0]).relative_indices.tolist() == [0]
    assert later.tolist() == build_clip(path, index, [60, 61, 62, 63]).relative_indices.tolist() == [0, 1, 2, 3]


def test_a_camera_whose_nvdec_pictures_are_broken_is_decoded_on_the_cpu(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under decode='auto' the camera goes to the CPU, saying so once, with the probe's numbers; decode='gpu' keeps
    NVDEC (the user's call: the check's bound may be wrong for their footage), saying so too."""
    _dali_cpu_as_nvdec(monkeypatch, broken=True)
    path = marker_video("vp9", 30)
    index = build_packet_index(path)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        assert route_for_video(path, index, label="cam") is DecodeRoute.DALI_CPU
        assert route_for_video(path, index, label="cam") is DecodeRoute.DALI_CPU  # (cached: said once)
        assert route_for_video(path, index, decode="gpu", label="cam") is DecodeRoute.NVDEC
    auto, gpu = [r.getMessage() for r in caplog.records]
    assert auto.startswith(
        f"NVDEC on NVIDIA H200 decodes cam (vp9), but not as PyAV does: NVDEC's frame 60 of {path} is "
    )
    assert auto.endswith(
        "(the probe of this codec, pixel format and frame size); decoding it on the CPU (route dali_cpu). "
        "decode='gpu' keeps it on NVDEC."
    )
    assert gpu.startswith(
        "decode='gpu' keeps cam (vp9) on NVDEC on NVIDIA H200, though its pictures are not PyAV's: NVDEC's frame 60 "
        f"of {path} is "
    )


def test_a_remote_cameras_pictures_are_held_to_the_remote_file(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The reference frames are read through the camera's filesystem, as the probe's clips are: checked, not skipped
    with a warning."""
    _dali_cpu_as_nvdec(monkeypatch)
    (tmp_path / "cam.mp4").write_bytes(marker_video("vp9", 30).read_bytes())
    fs = FakeRemoteFileSystem(str(tmp_path))
    with fs.open("cam.mp4", "rb") as f:
        index = build_packet_index(f)
    checked: list[Any] = []
    real = nvdec_check.CpuFrameDecoder.decode

    def decode(self: Any, source: Any, index: Any, frames: Any, **kwargs: Any) -> Any:
        checked.append((source, kwargs.get("filesystem")))
        return real(self, source, index, frames, **kwargs)

    monkeypatch.setattr(nvdec_check.CpuFrameDecoder, "decode", decode)
    with caplog.at_level(logging.WARNING):
        assert route_for_video("cam.mp4", index, filesystem=fs, label="cam") is DecodeRoute.NVDEC
    assert not caplog.records
    assert checked == [("cam.mp4", fs), ("cam.mp4", fs)]
