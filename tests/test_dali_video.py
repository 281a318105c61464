"""The DALI decode fragment on CPU (VP9 clips) and the decode-route decisions."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest

from lerobot_dali import decode_route
from lerobot_dali.clips import build_clip
from lerobot_dali.concurrent_calls import KeyedLocks
from lerobot_dali.dali_video import DALI_CPU_CODECS, dali_error_reason, decode_clip_batch, decode_clips
from lerobot_dali.decode_route import (
    DecodePreference,
    DecodeRoute,
    GpuInfo,
    choose_route,
    nvdec_table_guess,
    probe_gpu,
    route_for_video,
)
from lerobot_dali.errors import CodecUnsupportedError
from lerobot_dali.frame_marker import read_marker
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import EPISODE_LENGTHS, EPISODE_STARTS, MarkerVideo, clip_pictures, reference_frames

# DALI converts YUV to RGB with its own kernel; PyAV uses swscale. Same frame, a few levels apart.
CROSS_DECODER_MAX_DIFF = 8


def _windows(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    total = sum(EPISODE_LENGTHS)
    windows = [np.array([0, 1, 2]), np.array([total - 3, total - 2, total - 1]), np.array([28, 29, 30, 31])]
    windows.append(np.array([54, 55, 54, 56]))  # episode 1 -> 2 boundary, repeated frame
    windows.append(np.array([89, 0, 45]))  # sparse: file boundaries and the middle
    for _ in range(5):
        anchor = int(rng.integers(total))
        windows.append(np.clip(anchor + np.array([-6, -3, 0, 3]), 0, total - 1))
    return windows


@pytest.mark.parametrize("gop", [2, 30])
def test_vp9_clips_decode_on_dali_cpu(marker_video: MarkerVideo, gop: int) -> None:
    path = marker_video("vp9", gop)
    index = build_packet_index(path)
    windows = _windows(gop)
    clips = [build_clip(path, index, window) for window in windows]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=None)
    # Same decoder on the whole file at the file's display indices: must be identical.
    whole = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    whole_decoded = decode_clip_batch([whole] * len(windows), [w.astype(np.int32) for w in windows], device_id=None)
    reference = reference_frames(path, {int(p) for w in windows for p in index.frame_pts[w]})
    for window, frames, from_file in zip(windows, decoded, whole_decoded, strict=True):
        assert frames.shape == (len(window), 64, 96, 3) and frames.dtype == np.uint8
        np.testing.assert_array_equal(frames, from_file)
        for frame_index, frame in zip(window.tolist(), frames, strict=True):
            expected = reference[int(index.frame_pts[frame_index])]
            assert np.abs(frame.astype(np.int16) - expected).max() <= CROSS_DECODER_MAX_DIFF
            episode = int(np.searchsorted(EPISODE_STARTS, frame_index, side="right") - 1)
            assert read_marker(frame) == (episode, frame_index - EPISODE_STARTS[episode])


def test_dali_frame_k_is_pyav_display_frame_k(marker_video: MarkerVideo) -> None:
    """DALI numbers a clip's frames as PyAV displays them (checked on a sparse two-GOP clip)."""
    path = marker_video("vp9", 30)
    index = build_packet_index(path)
    clip = build_clip(path, index, [5, 70])
    with av.open(io.BytesIO(clip.data.tobytes())) as container:
        pyav_frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    all_frames = np.arange(clip.frame_count, dtype=np.int32)
    (dali_frames,) = decode_clip_batch([clip.data], [all_frames], device_id=None)
    assert len(pyav_frames) == clip.frame_count == len(dali_frames)
    for dali_frame, pyav_frame in zip(dali_frames, pyav_frames, strict=True):
        assert np.abs(dali_frame.astype(np.int16) - pyav_frame).max() <= CROSS_DECODER_MAX_DIFF
        assert read_marker(dali_frame) == read_marker(pyav_frame)


def test_a_frame_index_past_the_clip_raises_instead_of_a_black_frame(marker_video: MarkerVideo) -> None:
    path = marker_video("vp9", 2)
    clip = build_clip(path, build_packet_index(path), [4])
    frames = np.array([0, clip.frame_count], dtype=np.int32)  # the second is one past the end
    with pytest.raises(RuntimeError, match="out-of-bounds frame index"):
        decode_clip_batch([clip.data], [frames], device_id=None)


def test_decode_clips_rejects_unknown_device() -> None:
    with pytest.raises(ValueError, match="'cpu' or 'mixed'"):
        decode_clips(None, None, device="gpu")  # type: ignore[arg-type]


DALI_ERROR = (
    "Critical error in pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.video` encountered:\n\n"
    "[/opt/dali/dali/operators/video/video_utils.cc:95] Codec not supported\nCurrent pipeline is no longer valid."
)


def _raised_while_handling(cause: BaseException, error: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException:
            raise error  # noqa: B904 -- the implicit __context__ is the point
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError(DALI_ERROR), "Codec not supported"),  # the sentence after "encountered:", without "[file:line]"
        (_raised_while_handling(RuntimeError(DALI_ERROR), ValueError("probe failed")), "Codec not supported"),
        (RuntimeError("Critical error in pipeline:\nfirst\nlast words\n"), "last words"),  # no "encountered:"
        (RuntimeError("Critical error in pipeline:\nnothing encountered:\n"), "nothing encountered:"),
        (RuntimeError(), "RuntimeError"),
    ],
    ids=["dali", "context", "last-line", "nothing-after", "empty"],
)
def test_dali_error_reason_quotes_dalis_own_sentence(error: BaseException, reason: str) -> None:
    assert dali_error_reason(error) == reason


# --- routing ------------------------------------------------------------------------------------------

H200 = GpuInfo(device_id=0, name="NVIDIA H200", compute_capability=(9, 0))
L4 = GpuInfo(device_id=0, name="NVIDIA L4", compute_capability=(8, 9))


def test_a_gpu_info_is_a_frozen_value_of_a_device_from_0() -> None:
    """Equal and hashed by its fields, not edited in place; device -1 is refused (CUDA counts from 0)."""
    assert {H200, GpuInfo(device_id=0, name="NVIDIA H200", compute_capability=(9, 0))} == {H200}
    with pytest.raises(dataclasses.FrozenInstanceError):
        H200.device_id = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"device_id must be >= 0, got -1\."):
        GpuInfo(device_id=-1, name="gpu", compute_capability=(9, 0))


def test_table_guess() -> None:
    assert nvdec_table_guess("av1", H200) is False
    assert nvdec_table_guess("av1", GpuInfo(device_id=0, name="A100", compute_capability=(8, 0))) is False
    assert nvdec_table_guess("av1", L4) is True
    assert nvdec_table_guess("av1", GpuInfo(device_id=0, name="B200", compute_capability=(10, 0))) is True
    assert nvdec_table_guess("h264", H200) is True and nvdec_table_guess("hevc", L4) is True
    assert nvdec_table_guess("evc", L4) is False
    assert nvdec_table_guess("mjpeg", L4) is False  # (DALI 2.4's GPU decoder refuses it: its list has it commented out)


def test_table_guess_at_each_generations_edge() -> None:
    """NVIDIA's decode matrix at the capabilities where an answer changes: Pascal (6.x) has H.264 and no AV1, Turing
    (7.5) VP9, Volta (7.0, 7.2) and Turing no AV1, GA102 (8.6: RTX 3090, A40) is the first with AV1; GA10B (8.7) has
    it, and (8.1) is not in the table."""

    def guess(codec: str, capability: tuple[int, int]) -> bool | None:
        return nvdec_table_guess(codec, GpuInfo(device_id=0, name="gpu", compute_capability=capability))

    assert guess("h264", (6, 0)) is True and guess("hevc", (6, 1)) is True
    assert guess("h264", (5, 2)) is None and guess("h264", (0, 0)) is None  # (0, 0): a CPU-only torch's GPU
    assert guess("av1", (6, 0)) is False and guess("av1", (6, 1)) is False
    assert guess("av1", (7, 0)) is False and guess("av1", (7, 2)) is False and guess("av1", (7, 5)) is False
    assert guess("av1", (8, 6)) is True and guess("av1", (8, 7)) is True and guess("av1", (8, 1)) is None
    assert guess("vp9", (7, 5)) is True and guess("vp9", (7, 0)) is True and guess("vp9", (6, 1)) is None


NOT_SUPPORTED = "Codec configuration not supported on this GPU"


def test_route_choices() -> None:
    assert choose_route("h264", gpu=H200, nvdec_supported=True) is DecodeRoute.NVDEC
    assert choose_route("vp9", gpu=None, nvdec_supported=None) is DecodeRoute.DALI_CPU
    assert choose_route("h264", gpu=None, nvdec_supported=None) is DecodeRoute.CPU_FALLBACK
    assert choose_route("hevc", decode="cpu", gpu=H200, nvdec_supported=True) is DecodeRoute.CPU_FALLBACK
    assert choose_route("vp9", decode="CPU", gpu=H200, nvdec_supported=True) is DecodeRoute.DALI_CPU
    assert choose_route("h264", decode="gpu", gpu=L4, nvdec_supported=True) is DecodeRoute.NVDEC
    assert DecodeRoute.NVDEC.dali_device == "mixed" and DecodeRoute.DALI_CPU.dali_device == "cpu"
    assert DecodeRoute.CPU_FALLBACK.dali_device is None
    assert set(DALI_CPU_CODECS) == {"vp8", "vp9", "mjpeg"}


def test_mjpeg_goes_to_dalis_cpu_decoder_on_a_gpu(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DALI 2.4's GPU decoder refuses MJPEG ("not supported by the GPU variant of this operator"), though NVDEC
    decodes JPEG: it was in the codecs sent to NVDEC, which decode='gpu' accepted and a probe alone refused."""
    with pytest.raises(CodecUnsupportedError, match="DALI sends only av1, h264, hevc, mpeg4, vp8, vp9 to NVDEC"):
        choose_route("mjpeg", decode="gpu", gpu=L4, nvdec_supported=True)
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: "libnvcuvid.so.1")  # (a driver with NVDEC)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        assert choose_route("mjpeg", gpu=L4, nvdec_supported=None, label="camera m") is DecodeRoute.DALI_CPU
    assert [r.getMessage() for r in caplog.records] == [
        "DALI's GPU decoder (on NVIDIA L4) cannot decode camera m (mjpeg); decoding it on the CPU (route dali_cpu)."
        + decode_route.REENCODE_HINT
    ]


def test_av1_without_nvdec_falls_back_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        for _ in range(3):
            route = choose_route(
                "av1", gpu=H200, nvdec_supported=False, label="cam.top/test_fallback", reason=NOT_SUPPORTED
            )
            assert route is DecodeRoute.CPU_FALLBACK
    lines = [r.getMessage() for r in caplog.records if "cam.top/test_fallback" in r.getMessage()]
    assert len(lines) == 1 and "NVIDIA H200" in lines[0] and "cpu_fallback" in lines[0]
    assert f"(av1) ({NOT_SUPPORTED});" in lines[0]  # the probe's own words say why


def test_a_route_uses_nvdec_only_where_a_gpu_is_known_to_decode_it() -> None:
    """``nvdec_supported=None`` is "unknown", which is no: decode='gpu' refuses it rather than sending the camera to an
    NVDEC not known to decode it; and without a GPU nothing goes to NVDEC, whatever the probe said."""
    with pytest.raises(CodecUnsupportedError, match="NVDEC on NVIDIA L4 cannot decode it; use decode='auto'"):
        choose_route("h264", decode="gpu", gpu=L4, nvdec_supported=None)
    assert choose_route("h264", gpu=L4, nvdec_supported=None) is DecodeRoute.CPU_FALLBACK
    assert choose_route("h264", gpu=None, nvdec_supported=True) is DecodeRoute.CPU_FALLBACK
    assert choose_route("vp9", gpu=None, nvdec_supported=True) is DecodeRoute.DALI_CPU


def test_decode_cpu_on_a_gpu_warns_of_no_fallback(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    """decode='cpu' is the user's choice: no "NVDEC cannot decode it" warning, which names a fault there is not."""
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    with caplog.at_level(logging.INFO, logger="lerobot_dali.decode_route"):
        assert choose_route("av1", decode="cpu", gpu=H200, nvdec_supported=False, label="cam") is (
            DecodeRoute.CPU_FALLBACK
        )
        assert choose_route("h264", decode="cpu", gpu=H200, nvdec_supported=True, label="cam") is (
            DecodeRoute.CPU_FALLBACK
        )
    assert caplog.records == []


def test_a_codec_torchcodec_alone_decodes_goes_to_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchcodec brings an FFmpeg of its own, which may have a decoder PyAV's lacks: the workers decode it."""
    monkeypatch.setattr(decode_route, "pyav_can_decode", lambda codec: False)
    monkeypatch.setattr(decode_route, "torchcodec_available", lambda: True)
    assert choose_route("evc", gpu=None, nvdec_supported=None) is DecodeRoute.CPU_FALLBACK
    monkeypatch.setattr(decode_route, "torchcodec_available", lambda: False)
    with pytest.raises(CodecUnsupportedError, match="No decoder handles evc"):
        choose_route("evc", gpu=None, nvdec_supported=None)


def test_route_errors() -> None:
    with pytest.raises(CodecUnsupportedError, match="no CUDA GPU"):
        choose_route("h264", decode="gpu", gpu=None, nvdec_supported=None)
    with pytest.raises(CodecUnsupportedError, match=rf"NVIDIA H200 cannot decode it \({NOT_SUPPORTED}\)"):
        choose_route(
            "av1", decode=DecodePreference.GPU, gpu=H200, nvdec_supported=False, label="cam", reason=NOT_SUPPORTED
        )
    with pytest.raises(CodecUnsupportedError, match="No decoder handles cam"):
        choose_route("evc", gpu=None, nvdec_supported=None, label="cam")
    with pytest.raises(CodecUnsupportedError, match="sends only"):
        choose_route("evc", decode="gpu", gpu=H200, nvdec_supported=False)
    with pytest.raises(ValueError, match="decode must be one of 'auto', 'gpu', 'cpu', got 'tpu'"):
        DecodePreference.parse("TPU")
    assert DecodePreference.parse("CPU") is DecodePreference.CPU


def test_route_for_video_without_driver(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_route, "_driver_present", lambda: False)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    expected = {("vp9", 2): DecodeRoute.DALI_CPU, ("av1", 2): DecodeRoute.CPU_FALLBACK}
    for (codec, gop), route in expected.items():
        path = marker_video(codec, gop)
        assert route_for_video(path, build_packet_index(path), label="cam") is route
    h264 = marker_video("h264", 30)
    with pytest.raises(CodecUnsupportedError, match="no CUDA GPU"):
        route_for_video(h264, build_packet_index(h264), decode="gpu")


@pytest.mark.parametrize(("cuda_version", "present"), [(0, False), (12080, True)])
def test_a_driver_is_present_where_dali_reads_a_cuda_version(monkeypatch, cuda_version: int, present: bool) -> None:
    """DALI reads the driver's CUDA version as 0 where no driver is installed (this machine): then no probe process
    is spawned to find no GPU; 12080 (CUDA 12.8) is a driver."""
    from nvidia.dali import backend

    monkeypatch.setattr(backend, "GetCudaVersion", lambda: cuda_version)
    assert decode_route._driver_present() is present


def test_the_gpu_is_found_through_torch_else_through_dali(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CUDA names the device and its capability; a CPU-only torch beside a GPU DALI counts gives 'CUDA device
    N' of capability (0, 0) (the table knows none); a device past DALI's count is no GPU."""
    import torch
    from nvidia.dali import backend

    properties = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device_id: properties)
    assert decode_route._detect_gpu(1) == GpuInfo(device_id=1, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(backend, "GetCUDADeviceCount", lambda: 2)
    assert decode_route._detect_gpu(1) == GpuInfo(device_id=1, name="CUDA device 1", compute_capability=(0, 0))
    assert decode_route._detect_gpu(2) is None


def test_decode_cpu_starts_no_probe(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode='cpu' asks nothing of NVDEC: no probe process (a CUDA context of its own) where a driver is present."""

    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("decode='cpu' probed NVDEC")

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "probe_gpu", no_probe)
    for codec, route in (("h264", DecodeRoute.CPU_FALLBACK), ("vp9", DecodeRoute.DALI_CPU)):
        path = marker_video(codec, 2)
        assert route_for_video(path, build_packet_index(path), decode="cpu", label="cam") is route
    assert decode_route._probe_cache == {}


def test_nvdec_is_probed_per_frame_size_too(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVDEC refuses streams below a minimum size: a small camera of the same codec as a large one is probed on
    its own (with one answer per codec, the small one went to NVDEC and failed mid-training)."""
    probed: list[tuple[int, int]] = []

    def fake_probe(samples, *, frames, device_id, isolate):
        ((codec, clips),) = samples.items()
        index = build_packet_index(io.BytesIO(clips[0].tobytes()))
        probed.append((index.height, index.width))
        fits = min(index.height, index.width) >= 128
        decoded = {codec: list(map(clip_pictures, clips, frames[codec]))} if fits else {}
        errors = {} if fits else {codec: "too small"}
        return decode_route.GpuProbe(gpu=H200, nvdec={codec: fits}, errors=errors, decoded=decoded)

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "probe_gpu", fake_probe)
    big, small = marker_video("h264", 2, height=128, width=160), marker_video("h264", 2)
    assert route_for_video(big, build_packet_index(big), label="top") is DecodeRoute.NVDEC
    assert route_for_video(small, build_packet_index(small), label="wrist") is DecodeRoute.CPU_FALLBACK
    assert route_for_video(big, build_packet_index(big), label="top") is DecodeRoute.NVDEC
    assert probed == [(128, 160), (64, 96)]


def test_a_probe_process_that_dies_sends_the_camera_to_the_cpu_saying_so(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver fault that kills the probe process is no NVDEC: the camera is decoded on the CPU, the death said."""
    from concurrent.futures.process import BrokenProcessPool

    def dying_probe(samples, *, frames, device_id, isolate):
        raise BrokenProcessPool("killed by signal 11")

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "probe_gpu", dying_probe)
    path = marker_video("h264", 2)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.decode_route"):
        assert route_for_video(path, build_packet_index(path), label="cam") is DecodeRoute.CPU_FALLBACK
    assert "NVDEC probe for h264 on device 0: probe process died: killed by signal 11" in caplog.text


def test_cameras_routed_at_once_share_one_probe(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixture builds its datasets' iterators in threads; cameras of one codec and size then wait for one probe
    (a process with a CUDA context of its own) instead of each starting one. Other sizes probe beside it."""
    probed: list[tuple[int, int]] = []
    started = threading.Barrier(2, timeout=30)  # the two sizes' probes run at the same time

    def slow_probe(samples, *, frames, device_id, isolate):
        ((codec, clips),) = samples.items()
        index = build_packet_index(io.BytesIO(clips[0].tobytes()))
        probed.append((index.height, index.width))
        started.wait()
        time.sleep(0.2)  # (the other threads of this size arrive meanwhile)
        decoded = {codec: list(map(clip_pictures, clips, frames[codec]))}
        return decode_route.GpuProbe(gpu=H200, nvdec={codec: True}, errors={}, decoded=decoded)

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "_probing", KeyedLocks())
    monkeypatch.setattr(decode_route, "probe_gpu", slow_probe)
    videos = [marker_video("h264", 2, height=128, width=160), marker_video("h264", 2, height=144, width=160)]
    indexes = [build_packet_index(v) for v in videos]
    with ThreadPoolExecutor(8) as pool:
        routes = list(pool.map(lambda i: route_for_video(videos[i % 2], indexes[i % 2], label=f"cam{i}"), range(8)))
    assert routes == [DecodeRoute.NVDEC] * 8
    assert sorted(probed) == [(128, 160), (144, 160)]


def test_isolated_probe_runs_in_a_spawned_process(marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch) -> None:
    if decode_route._driver_present():
        pytest.skip("a CUDA driver is present; tests/gpu covers the real probe")
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)  # in this process only
    path = marker_video("h264", 30)
    clip = build_clip(path, build_packet_index(path), [0]).data
    probe = probe_gpu({"h264": clip}, isolate=True)
    assert probe.gpu is None and dict(probe.nvdec) == {}  # the child found no driver


@pytest.mark.parametrize("library", [None, "libnvcuvid.so.1"])
def test_failed_probe_says_when_the_nvdec_library_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, library: str | None
) -> None:
    # A GPU whose driver lacks libnvcuvid (a container without the "video" capability): every probe fails.
    def no_nvdec(*args: object, **kwargs: object) -> None:  # DALI's shape of error: the sentence after "encountered:"
        raise RuntimeError(
            "Critical error in pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.video`,\n  File ...\n\n"
            "encountered:\n\nCUDA driver API error CUDA_ERROR_NOT_FOUND\nC++ context: [/opt/dali/x.cc:1]\n"
        )

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_detect_gpu", lambda device_id: H200)
    monkeypatch.setattr(decode_route, "decode_clip_batch", no_nvdec)
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: library)
    monkeypatch.setattr(decode_route, "_probe_cache", {})
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    probe = probe_gpu({"h264": np.zeros(8, np.uint8)}, isolate=False)
    assert probe.gpu == H200 and probe.nvdec == {"h264": False}
    reason = probe.errors["h264"]
    assert reason.startswith("CUDA driver API error CUDA_ERROR_NOT_FOUND")
    assert (decode_route.NO_NVCUVID_HINT in reason) is (library is None)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        route = choose_route("h264", gpu=probe.gpu, nvdec_supported=False, label="cam", reason=reason)
    assert route is DecodeRoute.CPU_FALLBACK
    (line,) = [r.getMessage() for r in caplog.records if "cam (h264)" in r.getMessage()]
    assert ("NVIDIA_DRIVER_CAPABILITIES" in line) is (library is None)


def test_the_nvdec_library_is_found_where_dali_finds_it(tmp_path: Path) -> None:
    """DALI dlopens ``libnvcuvid.so``, then ``libnvcuvid.so.1``, so a driver reached through LD_LIBRARY_PATH (GKE's
    /usr/local/nvidia/lib64, outside the loader's cache) decodes; ``ctypes.util.find_library`` reads the cache, and
    elsewhere looks for the unversioned ``libnvcuvid.so`` only, so it found none there: ``diagnose`` printed "NVDEC
    unusable" beside a working NVDEC, and a refused AV1 probe sent the user to NVIDIA_DRIVER_CAPABILITIES."""
    import zlib  # noqa: F401 (maps libz into this process, the stand-in for the driver's library)

    mapped = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    libz = next((line.split()[-1] for line in mapped.splitlines() if "/libz.so" in line), None)
    if libz is None:
        pytest.skip("needs Linux and a shared libz to stand in for libnvcuvid")
    folder = tmp_path / "driver"
    folder.mkdir()
    shutil.copy(libz, folder / "libnvcuvid.so.1")  # the versioned name only, as the driver installs it
    found = subprocess.run(
        [sys.executable, "-c", "from lerobot_dali.decode_route import nvcuvid_library; print(nvcuvid_library())"],
        capture_output=True, text=True, check=True, env={**os.environ, "LD_LIBRARY_PATH": str(folder)},
    ).stdout.strip()  # fmt: skip
    assert found == "libnvcuvid.so.1"


@pytest.mark.parametrize(
    ("codec", "library", "hinted"),
    [("av1", "libnvcuvid.so.1", True), ("av1", None, False), ("h264", "libnvcuvid.so.1", False)],
)
def test_the_cpu_fallback_warning_names_reencode_where_a_copy_would_decode_on_nvdec(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, codec: str, library: str | None, hinted: bool
) -> None:
    # AV1 on an H200 (NVDEC has H.264, not AV1): a copy in H.264 would decode there. Not where the driver's NVDEC
    # library is missing, nor for H.264 itself (NVDEC refused what it has: a driver or file problem).
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: library)
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        route = choose_route(codec, gpu=H200, nvdec_supported=False, label="cam", reason="not supported")
    assert route is DecodeRoute.CPU_FALLBACK
    (line,) = [r.getMessage() for r in caplog.records if f"cam ({codec})" in r.getMessage()]
    assert line.startswith(f"NVDEC on NVIDIA H200 cannot decode cam ({codec}) (not supported); decoding it on the CPU")
    assert line.endswith(decode_route.REENCODE_HINT) is hinted


def test_the_reencode_hint_is_left_out_where_the_table_does_not_know_the_codec(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Pascal GPU (6.1) has H.264 but may have VP9: its refusal of VP9 is no sign that a copy in H.264 would do."""
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: "libnvcuvid.so.1")
    monkeypatch.setattr(decode_route, "_logged_fallbacks", set())
    pascal = GpuInfo(device_id=0, name="Tesla P40", compute_capability=(6, 1))
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        assert choose_route("vp9", gpu=pascal, nvdec_supported=False, label="cam") is DecodeRoute.DALI_CPU
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "NVDEC on Tesla P40 cannot decode cam (vp9); decoding it on the CPU (route dali_cpu)."


def test_a_probe_checks_its_device_and_decodes_each_clips_first_frame_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the table does not know the GPU (a CPU-only torch: capability (0, 0)) a refusal is quoted without a claim
    that its NVDEC lacks the codec; without ``frames``, frame 0 of every clip of the batch is decoded."""
    with pytest.raises(ValueError, match="device_id must be >= 0, got -1"):
        probe_gpu({"h264": np.zeros(8, np.uint8)}, device_id=-1)
    unknown = GpuInfo(device_id=0, name="CUDA device 0", compute_capability=(0, 0))
    asked: list[list[list[int]]] = []

    def decode(clips, frames, device_id):
        asked.append([f.tolist() for f in frames])
        if len(clips) == 1:
            raise RuntimeError("encountered:\n\nFailed to create video decoder\nC++ context: [x.cc:1]\n")
        return [np.zeros((1, 2, 2, 3), np.uint8) for _ in clips]

    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_detect_gpu", lambda device_id: unknown)
    monkeypatch.setattr(decode_route, "decode_clip_batch", decode)
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: "libnvcuvid.so.1")
    clip = np.zeros(8, np.uint8)
    probe = probe_gpu({"av1": clip, "h264": [clip, clip, clip]}, isolate=False)
    assert asked == [[[0]], [[0], [0], [0]]]
    assert probe.nvdec == {"av1": False, "h264": True} and len(probe.decoded["h264"]) == 3
    assert probe.errors == {"av1": "Failed to create video decoder"}


def test_failed_probe_quotes_dalis_sentence_and_the_codec_the_gpu_lacks(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real error of a decoder DALI cannot create (H.264 on its CPU decoder) stands in for AV1 on an H200's
    # NVDEC, which fails the same way: DALI's first line is "Critical error in pipeline:", which says nothing.
    path = marker_video("h264", 2)
    clip = build_clip(path, build_packet_index(path), [0]).data
    monkeypatch.setattr(decode_route, "_driver_present", lambda: True)
    monkeypatch.setattr(decode_route, "_detect_gpu", lambda device_id: H200)
    monkeypatch.setattr(decode_route, "decode_clip_batch", lambda clips, frames, device_id: decode_clip_batch(
        clips, frames, device_id=None))  # fmt: skip
    monkeypatch.setattr(decode_route, "nvcuvid_library", lambda: "libnvcuvid.so.1")
    probe = probe_gpu({"av1": clip, "h264": clip}, isolate=False)
    assert probe.nvdec == {"av1": False, "h264": False}
    assert probe.errors["h264"].endswith('Failed to create video decoder for "memory file"')
    assert "Critical error" not in probe.errors["h264"] and "C++ context" not in probe.errors["h264"]
    assert probe.errors["av1"] == probe.errors["h264"] + "; the NVDEC of NVIDIA H200 has no av1 decoder"
