"""The CPU fallback's reader of a video file with PyAV: one open container, frames found by seeking.

Each segment of a request's clip plan (:mod:`.clips`) is decoded from its keyframe, the decoder reset there, until
the requested presentation timestamps come out: the frames a full sequential decode gives at those timestamps.
Every frame decoded on the way is checked (:mod:`.frame_checks`): FFmpeg conceals damage rather than failing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import av
import numpy as np

from .clips import ClipPlan, packets_from_keyframe
from .errors import DAMAGED_VIDEO_ADVICE, CodecUnsupportedError, VideoDecodeError, missing_video, no_video_stream
from .frame_checks import check_random_access, damaged_frame_error, is_damaged, mid_gop_error, out_of_order_error
from .open_files import out_of_files
from .packet_index import PacketIndex, no_decoder_error
from .video_source import VideoSource

__all__ = ["PyAvReader"]


class PyAvReader:
    """One open container; frames are fetched by seeking to a keyframe and decoding forward."""

    def __init__(self, source: VideoSource, *, filesystem: Any | None, threads: int, label: str) -> None:
        self.label = label
        self._handle = None
        try:
            if isinstance(source, (str, os.PathLike)) and filesystem is not None:
                self._handle = filesystem.open(os.fspath(source), "rb")
                self.container = av.open(self._handle, mode="r")
            else:
                target = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source
                self.container = av.open(target, "r")
        except FileNotFoundError as e:
            self.close()
            raise missing_video(label) from e
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:  # (PyAV: I/O as OSError, bad metadata)
            self.close()
            raise out_of_files(e) or VideoDecodeError(
                f"{label}: cannot open the video ({e}); the file is truncated or corrupt: {DAMAGED_VIDEO_ADVICE}"
            ) from e
        if not self.container.streams.video:
            streams = no_video_stream(label, self.container)
            self.close()
            raise CodecUnsupportedError(streams)
        if self.container.streams.video[0].codec_context is None:
            self.close()
            raise no_decoder_error(label, None)
        self.stream = self.container.streams.video[0]
        self.stream.codec_context.thread_count = threads
        self.stream.codec_context.thread_type = "AUTO"

    def frames_at(
        self, index: PacketIndex, plan: ClipPlan, frame_indices: np.ndarray, convert: Callable[[av.VideoFrame], Any]
    ) -> dict[int, Any]:
        """``convert(frame)`` of each requested display frame (``plan`` is its clip plan), keyed by pts."""
        wanted = {int(p) for p in index.pts_of_frames(np.unique(frame_indices))}
        found: dict[int, Any] = {}
        try:
            for start, stop in plan.segments:
                segment_pts = {int(p) for p in index.pts[start:stop]} & wanted
                packets = packets_from_keyframe(self.container, self.stream, index, start)
                self.stream.codec_context.flush_buffers()
                self._decode_until(packets, segment_pts, found, convert, index, start)
        except (av.error.FFmpegError, OSError) as e:
            raise VideoDecodeError(
                f"{self.label}: decoding failed ({e}); the file is corrupt or truncated: {DAMAGED_VIDEO_ADVICE}"
            ) from e
        missing = wanted - found.keys()
        if missing:
            first = min(missing) * index.time_base
            raise VideoDecodeError(
                f"{self.label}: the decoder produced no frame at pts {float(first):.6f} s ({len(missing)} "
                f"requested frames missing); the file is corrupt or truncated: {DAMAGED_VIDEO_ADVICE}"
            )
        return found

    def _decode_until(
        self,
        packets: Iterator[av.Packet],
        pending: set[int],
        found: dict[int, Any],
        convert: Callable[[av.VideoFrame], Any],
        index: PacketIndex,
        start: int,
    ) -> None:
        """Decode ``packets`` (from the keyframe at decode position ``start`` on, the decoder just reset) until every
        pts in ``pending`` is in ``found``; the keyframe's own picture must show first, intra-coded
        (:func:`~.frame_checks.check_random_access`; the file's first packet may be no keyframe: a file cut mid-GOP)."""
        key_pts, flagged = int(index.pts[start]), bool(index.keyframe[start])
        seconds = float(key_pts * index.time_base)
        pending = pending - found.keys()
        last: tuple[int, float] | None = None  # (pts, seconds) of the last frame shown
        key_checked, key_discarded = False, False
        for packet in packets:
            if packet.pts == key_pts:
                key_discarded = bool(packet.is_discard)  # (an edit list hides it: no picture to check)
            try:  # (the decoder alone: a read the demuxer fails is the file's or the network's, said by frames_at)
                frames = packet.decode()
            except (av.error.FFmpegError, OSError) as e:
                if flagged or key_checked:
                    raise
                # (the file's first packet, no keyframe, refused before it showed: VP9's and AV1's decoders do)
                raise mid_gop_error(self.label, seconds, f"the decoder refuses it ({e})") from e
            for frame in frames:
                if is_damaged(frame, index):
                    raise damaged_frame_error(self.label, frame, index, frame.time)
                if not key_checked and frame.pts is not None and frame.pts >= key_pts:
                    key_checked = True
                    if frame.pts == key_pts or not key_discarded:
                        check_random_access(self.label, frame, key_pts, seconds, flagged=flagged)
                if frame.pts is not None:
                    if last is not None and frame.pts <= last[0]:
                        raise out_of_order_error(self.label, f"pts {frame.time:.6f} s after {last[1]:.6f} s")
                    last = (frame.pts, float(frame.time))
                if frame.pts in pending:
                    found[frame.pts] = convert(frame)
                    pending.discard(frame.pts)
            if not pending:
                return

    def close(self) -> None:
        container = getattr(self, "container", None)
        if container is not None:
            container.close()
        if self._handle is not None:
            self._handle.close()
