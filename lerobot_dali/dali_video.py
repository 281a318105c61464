"""The DALI graph fragment that decodes clips: one call inside a pipeline definition.

Clips (see :mod:`lerobot_dali.clips`) arrive as 1-D uint8 samples from an external source together with
the clip-relative display indices of the frames wanted. ``device="mixed"`` decodes on NVDEC and leaves the
frames on the GPU; ``device="cpu"`` uses DALI's libavcodec decoder, which handles VP8, VP9 and MJPEG only.
Both give uint8 frames in FHWC layout, RGB, in the order the indices ask for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from nvidia.dali import fn

__all__ = [
    "DALI_CPU_CODECS",
    "DALI_NVDEC_CODECS",
    "dali_error_reason",
    "decode_clip_batch",
    "decode_clips",
    "decode_shared_clips",
]

DALI_CPU_CODECS: frozenset[str] = frozenset({"vp8", "vp9", "mjpeg"})
"""Codecs (FFmpeg names) that ``fn.decoders.video(device="cpu")`` decodes."""

DALI_NVDEC_CODECS: frozenset[str] = frozenset({"h264", "hevc", "av1", "vp8", "vp9", "mpeg4"})
"""Codecs that ``fn.decoders.video(device="mixed")`` can send to NVDEC (the GPU may still lack some). Not MJPEG,
which DALI 2.4's GPU variant refuses ("not supported by the GPU variant of this operator"; its list has it commented
out) though NVDEC decodes JPEG: an MJPEG camera goes to the CPU fallback without a probe."""


def decode_clips(clips: Any, frame_indices: Any, *, device: Literal["cpu", "mixed"]) -> Any:
    """Decode each sample's clip at its ``frame_indices`` (int32, clip display order) -> uint8 FHWC frames.

    Call inside a ``pipeline_def``; ``clips`` and ``frame_indices`` are CPU DataNodes (external sources).
    Frames are numbered as DALI numbers them, by ascending pts, which is how clips are planned. An index
    past the clip's end raises (``pad_mode="none"``): DALI's default pads it with a black frame, silently.
    """
    if device not in ("cpu", "mixed"):
        raise ValueError(f"device must be 'cpu' or 'mixed', got {device!r}.")
    # affine=False: the mixed decoder pins its threads to cores by default, the same cores in every rank of a
    # node (and one pool per NVDEC camera), on top of the cores the CPU workers use. (The CPU decoder ignores it.)
    return fn.decoders.video(clips, device=device, frames=frame_indices, pad_mode="none", affine=False)


def decode_shared_clips(
    clips: Any, frame_indices: Any, take: Any, *, device: Literal["cpu", "mixed"], finish: Callable[[Any], Any]
) -> Any:
    """Decode clips that samples share (:mod:`lerobot_dali.clip_sharing`): a sample with a clip decodes it at its
    ``frame_indices``, a sample with an empty clip gets the frames of sample ``take`` (a scalar int32; a sample's own
    index where it decodes). ``finish`` runs on the decoded frames only (a move to the GPU, a colour fix).

    Only the samples with clips reach the decoder: DALI's conditional split and merge (the operators its ``if``
    statements become; they need no ``enable_conditionals`` when called directly) give it the smaller batch, and
    the others get an empty (0, 1, 1, 1) placeholder that ``permute_batch`` then replaces by their group's frames.
    """
    decodes = clips.shape()[0] > 0
    own_clips, no_clips = fn._conditional.split(clips, predicate=decodes)  # type: ignore[attr-defined]
    own_indices, _ = fn._conditional.split(frame_indices, predicate=decodes)  # type: ignore[attr-defined]
    frames = finish(decode_clips(own_clips, own_indices, device=device))
    placeholder = fn.reshape(fn.expand_dims(no_clips, axes=[1, 2, 3]), layout="FHWC")
    if frames.device == "gpu":
        placeholder = placeholder.gpu()
    merged = fn._conditional.merge(frames, placeholder, predicate=decodes)  # type: ignore[attr-defined]
    return fn.permute_batch(merged, indices=take)


def decode_clip_batch(
    clips: Sequence[np.ndarray], frame_indices: Sequence[np.ndarray], *, device_id: int | None
) -> list[np.ndarray]:
    """Decode one batch of clips outside the loader: ``device_id=None`` on DALI's CPU decoder, else NVDEC.

    For the NVDEC probe, ``diagnose`` and tests: a throwaway pipeline, frames returned as host arrays
    (one (T, H, W, 3) uint8 array per clip).
    """
    from nvidia.dali import types
    from nvidia.dali.pipeline import Pipeline
    from nvidia.dali.tensors import TensorListGPU

    encoded = [np.ascontiguousarray(c, dtype=np.uint8) for c in clips]
    wanted = [np.asarray(i, dtype=np.int32) for i in frame_indices]
    pipe = Pipeline(batch_size=len(encoded), num_threads=2, device_id=device_id, prefetch_queue_depth=1)
    with pipe:
        data = fn.external_source(source=lambda: encoded, batch=True, dtype=types.UINT8, ndim=1)  # type: ignore[attr-defined]
        frames = fn.external_source(source=lambda: wanted, batch=True, dtype=types.INT32, ndim=1)  # type: ignore[attr-defined]
        pipe.set_outputs(decode_clips(data, frames, device="cpu" if device_id is None else "mixed"))
    try:
        pipe.build()
        (output,) = pipe.run()
        host = output.as_cpu() if isinstance(output, TensorListGPU) else output
        return [np.asarray(host[i]) for i in range(len(encoded))]
    finally:
        del pipe


def dali_error_reason(cause: BaseException) -> str:
    """DALI's own sentence: the line after "encountered:" in its multi-line error, else the last line. (Its
    first line is always "Critical error in pipeline:", which says nothing.)"""
    chain: list[BaseException] = []
    current: BaseException | None = cause
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in chain:
        _, found, after = str(error).partition("encountered:")
        lines = [line.strip() for line in after.splitlines() if line.strip()]
        if found and lines:
            return re.sub(r"^\[[^\]]+:\d+\]\s*", "", lines[0])  # drop DALI's "[file.cc:123]" prefix
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[-1] if lines else type(cause).__name__
