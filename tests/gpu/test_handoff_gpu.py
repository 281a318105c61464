"""GPU-only facts the CPU tests take on trust (desk-checked, never run): skipped without CUDA.

* A batch's tensors are DALI's own buffers (``exec_dynamic``: ``torch.from_dlpack``, no copy). A batch let go while
  torch's stream still reads it must not be overwritten by DALI's next batches before that read runs; nor may one
  held past ``close()`` change.
* A new thread starts on CUDA device 0 (what :class:`~lerobot_dali.mixture.DALILeRobotMixture` passes its thread's
  device on for).
* NVDEC streams the probe lets through in formats other than 8-bit 4:2:0 (10-bit HEVC, 4:4:4) decode to the right
  frames: DALI converts NVDEC's surface as 8-bit NV12 whatever the stream (``frames_decoder_gpu.cc``, read only).
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lerobot_dali import decode_route
from lerobot_dali.clips import build_clip
from lerobot_dali.dali_video import decode_clip_batch
from lerobot_dali.decode_route import DecodeRoute, route_for_video
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index import build_packet_index
from tests.gpu.requires_cuda import GPU_ONLY
from tests.video_fixtures import reference_frames

pytestmark = GPU_ONLY

CAMERA = "observation.images.cam0"
# NVDEC's minimum sizes (HEVC 144x144)
GPU_SIZE = (160, 192)


def _h264_iterator(make_ds, **options) -> DALILeRobotIterator:
    from tests.test_iterator import _dataset

    root = _dataset(make_ds, "h264", size=GPU_SIZE)
    it = DALILeRobotIterator(root, device="cuda", batch_size=2, num_workers=2, shuffle=False, drop_last=False,
                             return_uint8=True, **options)  # fmt: skip
    assert {route.value for route in it.routes.values()} == {"nvdec"}
    return it


def test_a_batch_let_go_while_torch_still_reads_it_is_not_overwritten(make_ds) -> None:
    """Each batch is summed once at once (synchronised) and once behind a long kernel on torch's stream, queued
    before the batch is let go; DALI goes on decoding into freed buffers meanwhile. Unequal sums: DALI reuses a
    buffer a torch kernel has yet to read (the DLPack hand-off is not ordered after torch's stream)."""
    it = _h264_iterator(make_ds, prefetch=2)
    expected, pending = [], []
    try:
        for _ in range(2):  # two epochs: more batches, each in a buffer of the one before
            for batch in it:
                frames = batch[CAMERA]
                expected.append(int(frames.sum(dtype=torch.int64).item()))
                torch.cuda._sleep(20_000_000)  # (tens of ms of GPU time on torch's stream, the CPU runs on)
                pending.append(frames.sum(dtype=torch.int64))
                del frames, batch
        torch.cuda.synchronize()
    finally:
        it.close()
    assert len(expected) > 4
    assert [int(p.item()) for p in pending] == expected


def test_a_batch_held_past_close_keeps_its_values(make_ds) -> None:
    it = _h264_iterator(make_ds)
    batch = next(iter(it))
    expected = batch[CAMERA].cpu().clone()
    it.close()
    gc.collect()
    other = _h264_iterator(make_ds)  # another pipeline's buffers come from the same memory pool
    try:
        for _ in other:
            pass
    finally:
        other.close()
    torch.cuda.synchronize()
    assert batch[CAMERA].device.type == "cuda"
    assert torch.equal(batch[CAMERA].cpu(), expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_new_thread_starts_on_device_0() -> None:
    """The premise of the mixture's passing its thread's device to the threads that build its datasets."""
    torch.cuda.set_device(1)
    try:
        seen: list[int] = []
        thread = threading.Thread(target=lambda: seen.append(torch.cuda.current_device()))
        thread.start()
        thread.join()
        assert seen == [0]
    finally:
        torch.cuda.set_device(0)


def _encode_smooth(path: Path, codec: str, pix_fmt: str, *, frames: int = 12) -> Path:
    """Smooth colour gradients drifting a little each frame: decoders agree on them to a level or two, so a wrong
    reading of the surface (10-bit or 4:4:4 taken for 8-bit NV12) stands out by tens of levels."""
    height, width = GPU_SIZE
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        for i in range(frames):
            rgb = np.stack([x * 255 / width, y * 255 / height, (x + y + 8 * i) % 256 * 0.8], axis=-1)
            stream_frames = stream.encode(av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24"))
            container.mux(stream_frames)
        container.mux(stream.encode())
    return path


@pytest.mark.parametrize(
    ("codec", "pix_fmt"), [("libx265", "yuv420p10le"), ("libx265", "yuv444p"), ("libx264", "yuv444p")]
)
def test_a_format_nvdec_is_routed_for_decodes_right(tmp_path: Path, codec: str, pix_fmt: str) -> None:
    """Where the probe routes the stream to NVDEC (it decoded one frame without an error), the frames must be the
    stream's; where it does not, the CPU fallback takes it (the right answer too)."""
    path = _encode_smooth(tmp_path / f"{codec}_{pix_fmt}.mp4", codec, pix_fmt)
    index = build_packet_index(path)
    assert index.pix_fmt == pix_fmt
    decode_route._probe_cache.clear()
    route = route_for_video(path, index, label=f"{codec} {pix_fmt}")
    if route is not DecodeRoute.NVDEC:
        assert route is DecodeRoute.CPU_FALLBACK
        return
    window = np.array([0, 5, index.frame_count - 1])
    clip = build_clip(path, index, window)
    (frames,) = decode_clip_batch([clip.data], [clip.relative_indices], device_id=0)
    reference = reference_frames(path, {int(p) for p in index.frame_pts[window]})
    assert frames.shape == (len(window), *GPU_SIZE, 3)
    for position, frame in zip(window.tolist(), frames, strict=True):
        diff = np.abs(frame.astype(np.int16) - reference[int(index.frame_pts[position])])
        assert diff.mean() <= 3.0, (pix_fmt, position, diff.mean())
