"""The CPU fallback's reader of a video file with torchcodec: one decoder in exact seek mode, frames found by time.

``CpuDecoderBackend.AUTO`` decodes RGB with it where it loads. It hands over RGB only, turned by the stream's display
matrix, which the reader undoes, and at the video's size: frames asked for at another are resized after decoding,
with torch's antialiased bilinear, like DALI's ``fn.resize``. Where it hands over other frames than those asked for
(keyframes flagged that are no random-access point), it raises :class:`MisplacedFrames` and the file goes to PyAV.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .cpu_backends import torchcodec_unavailable
from .errors import CodecUnsupportedError, VideoDecodeError, missing_video
from .packet_index import PacketIndex
from .video_source import VideoSource

__all__ = ["MisplacedFrames", "TorchCodecReader"]


def _resize_nhwc(frames: Any, size: tuple[int, int]) -> np.ndarray:
    """``(N, H, W, 3)`` uint8 torch frames resized like DALI's ``fn.resize`` (bilinear, antialiased)."""
    import torch

    if tuple(frames.shape[1:3]) == size:
        return frames.numpy()
    nchw = frames.permute(0, 3, 1, 2).float()
    out = torch.nn.functional.interpolate(nchw, size=size, mode="bilinear", antialias=True, align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


class TorchCodecReader:
    """One torchcodec decoder in exact seek mode; frames are fetched by presentation time."""

    def __init__(
        self, source: VideoSource, *, filesystem: Any | None, threads: int, label: str, stream_index: int
    ) -> None:
        why_not = torchcodec_unavailable()
        if why_not is not None:
            raise CodecUnsupportedError(f"{label}: {why_not}; use CpuDecoderBackend.PYAV or AUTO.")
        from torchcodec.decoders import VideoDecoder

        self.label = label
        self._handle = None
        try:
            if isinstance(source, (str, os.PathLike)) and filesystem is not None:
                self._handle = filesystem.open(os.fspath(source), "rb")
                source = self._handle
            elif isinstance(source, os.PathLike):
                source = os.fspath(source)
            # The stream the packet index holds: torchcodec's default is FFmpeg's "best" video stream, which in a
            # file of several need not be the first, that every other route decodes.
            self.decoder = VideoDecoder(
                source,
                stream_index=stream_index,
                seek_mode="exact",
                num_ffmpeg_threads=threads,
                dimension_order="NHWC",
                device="cpu",
            )
        except BaseException as e:
            self.close()  # no reader is returned, so nothing else would close the file opened for it
            if isinstance(e, FileNotFoundError):
                raise missing_video(label) from e
            if isinstance(e, (RuntimeError, ValueError)):
                raise VideoDecodeError(f"{label}: torchcodec cannot open the video ({e}).") from e
            raise
        # torchcodec (>= 0.8) turns frames by the stream's display matrix (a phone's portrait recording); PyAV, DALI
        # and NVDEC hand over the picture as stored, whose size the packet index holds: undo the turn (quarter
        # turns, counter-clockwise), so every route gives one camera the same frames.
        rotation = getattr(self.decoder.metadata, "rotation", None) or 0.0
        self._quarter_turns = round(-rotation / 90) % 4

    def frames_at(
        self, index: PacketIndex, frame_indices: np.ndarray, size: tuple[int, int] | None = None
    ) -> dict[int, np.ndarray]:
        unique = np.unique(frame_indices)
        asked = index.frame_pts_s[unique]
        try:
            batch = self.decoder.get_frames_played_at(seconds=asked.tolist())
        except (RuntimeError, ValueError, IndexError) as e:
            raise VideoDecodeError(f"{self.label}: torchcodec failed to decode ({e}).") from e
        got = batch.pts_seconds.numpy()
        # torchcodec seeks to the keyframes the container flags, which intra refresh flags on P-frames: FFmpeg drops
        # the frames until the picture is whole again, and torchcodec hands over later frames than those asked for.
        # (Half a frame's time: a frame's own pts, read back in seconds, is within rounding of it.)
        wrong = np.flatnonzero(np.abs(got - asked) > 0.5 * index.frame_interval_s)
        if wrong.size:
            first = int(wrong[0])
            raise MisplacedFrames(
                f"gave the frame at {got[first]:.4f} s for the one at {asked[first]:.4f} s"
                f"{f' ({wrong.size} of {len(asked)} frames)' if wrong.size > 1 else ''}"
            )
        frames = batch.data
        if self._quarter_turns:
            frames = frames.rot90(self._quarter_turns, dims=(1, 2)).contiguous()
        # Resized after decoding, in one call: newer torchcodec can resize inside the decoder
        # (``VideoDecoder(transforms=[Resize])``), but no torchcodec loads where this was written to test it.
        data = frames.numpy() if size is None else _resize_nhwc(frames, size)
        return {int(pts): data[i] for i, pts in enumerate(index.pts_of_frames(unique).tolist())}

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class MisplacedFrames(Exception):
    """torchcodec handed over other frames than those asked for: the file is decoded with PyAV instead."""
