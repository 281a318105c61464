"""NVDEC (DALI mixed) decode of clips and the AV1 fallback, on a real GPU. Skipped without one."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from lerobot_dali import decode_route  # noqa: E402
from lerobot_dali.clips import build_clip  # noqa: E402
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder  # noqa: E402
from lerobot_dali.dali_video import decode_clip_batch  # noqa: E402
from lerobot_dali.decode_route import DecodeRoute, nvdec_table_guess, probe_gpu, route_for_video  # noqa: E402
from lerobot_dali.errors import CodecUnsupportedError  # noqa: E402
from lerobot_dali.frame_marker import read_marker  # noqa: E402
from lerobot_dali.packet_index import build_packet_index  # noqa: E402
from tests.video_fixtures import (  # noqa: E402
    EPISODE_LENGTHS,
    EPISODE_STARTS,
    MarkerVideo,
    encode_open_keyframes,
    r1_video,
    reference_frames,
)

pytestmark = pytest.mark.gpu

# NVDEC has minimum sizes (HEVC 144x144, VP9/AV1 128x128), so GPU fixtures are larger than CPU ones.
GPU_SIZE = {"height": 160, "width": 192}
# NVDEC output goes through DALI's YUV->RGB kernel, PyAV's through swscale: same frame, a few levels apart.
CROSS_DECODER_MAX_DIFF = 12
CROSS_DECODER_MAX_MEAN_DIFF = 2.0
# DALI samples chroma bilinearly where swscale repeats each sample over its 2x2 block: on camera footage the two
# part by up to ~40 levels at sharp colour edges (a CPU emulation of DALI's kernel on r1's own planes: max 22,
# on gr00t 41, mean ~1.2), so real content is held to the mean and all but the edge pixels.
REAL_CONTENT_QUANTILE = 0.999


@pytest.fixture(scope="module", autouse=True)
def dali_gpu_pipeline_works() -> None:
    @pipeline_def(batch_size=1, num_threads=1, device_id=0)
    def tiny():  # type: ignore[no-untyped-def]
        data = fn.external_source(source=lambda: [np.zeros(4, np.uint8)], batch=True, dtype=types.UINT8, ndim=1)
        return data.gpu()

    try:
        pipe = tiny()
        pipe.build()
        pipe.run()
    except Exception as e:  # any failure to use device 0 means these tests cannot run here
        pytest.skip(f"DALI cannot run a pipeline on device 0: {e}")


def _windows(total: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    windows = [np.array([0, 1, 2]), np.array([total - 3, total - 2, total - 1]), np.array([total - 1, 0, total // 2])]
    for _ in range(5):
        anchor = int(rng.integers(total))
        windows.append(np.clip(anchor + np.array([-6, -3, -1, 0, 2]), 0, total - 1))
    return windows


def _assert_close(frame: np.ndarray, expected: np.ndarray, *, markers: bool) -> None:
    diff = np.abs(frame.astype(np.int16) - expected)
    assert diff.mean() <= CROSS_DECODER_MAX_MEAN_DIFF, diff.mean()
    bound = diff.max() if markers else np.quantile(diff, REAL_CONTENT_QUANTILE)  # markers: flat grey cells
    assert bound <= CROSS_DECODER_MAX_DIFF, (bound, diff.max())


def _check_mixed(path: Path, windows: list[np.ndarray], *, markers: bool) -> None:
    index = build_packet_index(path)
    clips = [build_clip(path, index, window) for window in windows]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=0)
    # Same decoder on the whole file at its display indices: identical frames.
    whole = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    from_file = decode_clip_batch([whole] * len(windows), [w.astype(np.int32) for w in windows], device_id=0)
    reference = reference_frames(path, {int(p) for w in windows for p in index.frame_pts[w]})
    for window, frames, whole_frames in zip(windows, decoded, from_file, strict=True):
        assert frames.shape == (len(window), index.height, index.width, 3) and frames.dtype == np.uint8
        np.testing.assert_array_equal(frames, whole_frames)
        for frame_index, frame in zip(window.tolist(), frames, strict=True):
            _assert_close(frame, reference[int(index.frame_pts[frame_index])], markers=markers)
            if markers:
                episode = int(np.searchsorted(EPISODE_STARTS, frame_index, side="right") - 1)
                assert read_marker(frame) == (episode, frame_index - EPISODE_STARTS[episode])


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9"])
@pytest.mark.parametrize("gop", [2, 30])
def test_mixed_decode_of_clips(marker_video: MarkerVideo, codec: str, gop: int) -> None:
    _check_mixed(marker_video(codec, gop, **GPU_SIZE), _windows(sum(EPISODE_LENGTHS), seed=gop), markers=True)


def test_mixed_decode_of_real_h264_with_b_frames() -> None:
    path = r1_video()
    windows = [np.arange(0, 4), np.arange(1971, 1975), np.array([700, 702, 704, 710]), np.array([5, 1974])]
    _check_mixed(path, windows, markers=False)


@pytest.mark.parametrize("container_format", ["mp4", "matroska"])
def test_mixed_decode_of_clips_from_open_gop_keyframes(tmp_path: Path, container_format: str) -> None:
    """x264 open-GOP keyframes (I pictures at recovery points, no IDR): a clip starting at one carries the avcC's SPS
    and PPS in-band (``clips._parameter_sets_in_band``), which FFmpeg's h264_mp4toannexb adds before IDR pictures
    alone; without them NVDEC, given DALI's avcC record as it is, had no SPS before the clip's first picture (read in
    DALI 2.4's source, not seen). Every window, sparse ones across keyframes included, reads its own markers."""
    suffix = {"mp4": "mp4", "matroska": "mkv"}[container_format]
    path = encode_open_keyframes(tmp_path / f"open_keyframes.{suffix}", frames=40, container_format=container_format)
    index = build_packet_index(path)
    windows = [np.array(w) for w in ([10, 11, 12], [3], [4, 5], [20], [37, 38, 39], [5, 33], [0, 39], [30, 12, 21])]
    clips = [build_clip(path, index, window) for window in windows]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=0)
    for window, frames in zip(windows, decoded, strict=True):
        assert frames.shape == (len(window), index.height, index.width, 3), (window, frames.shape)
        assert [read_marker(frame) for frame in frames] == [(0, int(f)) for f in window], window


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_mixed_decode_of_open_gop_clips_with_leading_pictures(tmp_path: Path, codec: str) -> None:
    """Open GOPs whose keyframes (x264 recovery-point I pictures, HEVC CRA) are followed by leading B-pictures: a clip
    from such a keyframe drops them (they reference the GOP before), and NVDEC's parser may drop RASL pictures after
    a CRA at a stream's start itself (closed source: not known). Frames just before and after each keyframe, alone
    and across GOPs, read their own markers."""
    from tests.test_clips import _encode_open_gop

    path = tmp_path / "open_gop.mp4"
    _encode_open_gop(path, codec, **GPU_SIZE)
    index = build_packet_index(path)
    assert index.has_leading_pictures
    windows = [np.array([f]) for f in (0, 8, 9, 10, 11, 19, 20, 21, 89)]
    windows += [np.array([7, 8, 9, 10, 11]), np.array([19, 41, 62]), np.array([89, 0, 30, 30]), np.array([12, 13])]
    clips = [build_clip(path, index, window) for window in windows]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=0)
    for window, frames in zip(windows, decoded, strict=True):
        assert [read_marker(frame) for frame in frames] == [(int(f) // 30, int(f) % 30) for f in window], window


def test_av1_route_follows_the_probe(marker_video: MarkerVideo, caplog: pytest.LogCaptureFixture) -> None:
    path = marker_video("av1", 2, **GPU_SIZE)
    index = build_packet_index(path)
    decode_route._probe_cache.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        route = route_for_video(path, index, label="camera av1_g2")
        assert route_for_video(path, index, label="camera av1_g2") is route  # cached, no second log line
    probe = probe_gpu({"av1": build_clip(path, index, [0]).data}, isolate=False)
    assert probe.gpu is not None
    guess = nvdec_table_guess("av1", probe.gpu)
    if guess is not None:
        assert guess == probe.nvdec["av1"]
    fallback_lines = [r.getMessage() for r in caplog.records if "camera av1_g2" in r.getMessage()]
    window = np.array([0, 1, 44, 45, 89])
    reference = reference_frames(path, {int(p) for p in index.frame_pts[window]})
    if probe.nvdec["av1"]:
        assert route is DecodeRoute.NVDEC and not fallback_lines
        _check_mixed(path, [window], markers=True)
        return
    assert route is DecodeRoute.CPU_FALLBACK
    assert len(fallback_lines) == 1 and probe.gpu.name in fallback_lines[0]
    # DALI's own words: on A100/H100/H200 'Failed to create video decoder for "memory file"' (the 8-bit 4:2:0 caps
    # check fails first); "Codec configuration not supported on this GPU" is for 10-bit or 4:4:4 streams.
    assert probe.errors["av1"]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    frames = decoder.decode(path, index, window)
    for frame_index, frame in zip(window.tolist(), frames, strict=True):
        np.testing.assert_array_equal(frame, reference[int(index.frame_pts[frame_index])])
    with pytest.raises(CodecUnsupportedError, match="cannot decode"):
        route_for_video(path, index, decode="gpu")
    decoder.close()


def test_h264_probe_and_route(marker_video: MarkerVideo) -> None:
    path = marker_video("h264", 30, **GPU_SIZE)
    index = build_packet_index(path)
    probe = probe_gpu({"h264": build_clip(path, index, [0]).data}, isolate=True)
    assert probe.gpu is not None and probe.nvdec["h264"] is True
    assert route_for_video(path, index, decode="gpu") is DecodeRoute.NVDEC
    assert route_for_video(path, index, decode="cpu") is DecodeRoute.CPU_FALLBACK


@pytest.mark.parametrize("video", ["r1", "open_keyframes", "bt709"])
def test_the_probe_finds_nvdec_pictures_whole(tmp_path: Path, video: str, caplog: pytest.LogCaptureFixture) -> None:
    """The probe's clips (the first frame; a later keyframe and the frames after it: r1's frame 1000, an x264 open-GOP
    I picture with no IDR before it in its clip, a BT.709 stream's) decoded on NVDEC agree with PyAV
    (``nvdec_check``), so each camera is routed to NVDEC, without a warning. A disagreement here means the bound is
    too tight for NVDEC, or NVDEC's pictures are broken."""
    from lerobot_dali.nvdec_check import nvdec_disagreement, probe_clips
    from tests.test_yuv_frames import encode_flat_patches

    if video == "r1":
        path = r1_video()
    elif video == "open_keyframes":
        path = encode_open_keyframes(tmp_path / "open.mp4", frames=40)
    else:
        path = encode_flat_patches(tmp_path / "bt709.mp4", width=192, height=160, colorspace=1)
    index = build_packet_index(path)
    wanted = probe_clips(index)
    clips = [build_clip(path, index, frames) for frames in wanted]
    codec = index.codec
    probe = probe_gpu({codec: [c.data for c in clips]}, frames={codec: [c.relative_indices for c in clips]})
    assert probe.nvdec[codec], probe.errors
    assert nvdec_disagreement(probe.decoded[codec], path, index, wanted) == ""
    decode_route._probe_cache.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.decode_route"):
        assert route_for_video(path, index, label="cam") is DecodeRoute.NVDEC
    assert not caplog.records


def test_nvdec_colours_of_a_bt709_stream_are_corrected_to_bt709(tmp_path: Path) -> None:
    """DALI's NVDEC path converts with BT.601 whatever the tag (``color_space.cu``, read, not yet run): the
    correction the graph applies (``yuv_frames.nvdec_color_fix``) must bring a BT.709 stream to swscale's RGB.
    Flat patches, compared inside: saturated colours clip under BT.601 (no correction can bring them back) and
    DALI interpolates chroma where swscale repeats it (edges differ whatever the matrix)."""
    from lerobot_dali.yuv_frames import nvdec_color_fix, stream_color
    from tests.test_yuv_frames import _recolor_on_dali_cpu, encode_flat_patches, patch_interiors

    path = encode_flat_patches(tmp_path / "bt709.mp4", width=192, height=160, colorspace=1)
    index = build_packet_index(path)
    fix = nvdec_color_fix(*stream_color(index.template))
    assert fix is not None
    frames = np.arange(index.frame_count)
    clip = build_clip(path, index, frames)
    (nvdec,) = decode_clip_batch([clip.data], [clip.relative_indices], device_id=0)
    reference = reference_frames(path)
    expected = np.stack([reference[int(p)] for p in index.frame_pts[frames]]).astype(np.int16)
    inside = patch_interiors(160, 192)
    before = np.abs(nvdec.astype(np.int16) - expected)[:, inside].mean()
    after = np.abs(np.stack(_recolor_on_dali_cpu(list(nvdec), fix)).astype(np.int16) - expected)[:, inside].mean()
    assert after < before / 2 and after <= CROSS_DECODER_MAX_MEAN_DIFF, (before, after)
