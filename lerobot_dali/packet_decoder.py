"""The CPU fallback's decoder of a request's packets alone, for remote MP4s whose packets are read by byte range.

A PyAV decoder opened from the file's stream template (``PacketIndex.template``), and kept open like a file's, is fed
the planned packets (:mod:`.clips`; the prefetch cache serves them): no remux, no demux, no container read beyond
them. The packets carry their display rank as pts, which proves which frame is which, and every frame is checked as
a file reader checks it (:mod:`.frame_checks`).
"""

from __future__ import annotations

import io
import itertools

import av
import numpy as np

from .clips import ClipPlan
from .cpu_backends import require_pyav_decoder
from .errors import VideoDecodeError
from .frame_checks import check_random_access, damaged_frame_error, is_damaged, out_of_order_error
from .packet_index import PacketIndex

__all__ = ["PacketDecoder"]


class PacketDecoder:
    """A PyAV decoder opened from a file's stream template (``PacketIndex.template``), fed the packets of one
    request at a time and reset between requests, as a file's open decoder is after each seek."""

    def __init__(self, index: PacketIndex, *, threads: int) -> None:
        self.label = index.source_name
        require_pyav_decoder(index)
        try:
            self.container = av.open(io.BytesIO(index.template), "r")
        except (av.error.FFmpegError, OSError) as e:
            raise VideoDecodeError(f"{self.label}: the stream template does not open ({e}).") from e
        self.codec = self.container.streams.video[0].codec_context
        self.codec.thread_count = threads
        self.codec.thread_type = "AUTO"

    def frames_at(self, index: PacketIndex, plan: ClipPlan, payloads: list[bytes]) -> dict[int, av.VideoFrame]:
        """The planned packets decoded: the wanted frames keyed by their display rank in the plan."""
        if len(payloads) != plan.frame_count:
            raise ValueError(f"decode_packets got {len(payloads)} payloads for a plan of {plan.frame_count} packets.")
        # Display rank as pts: the decoder hands frames back in display order, and the pts proves which is which.
        ranks = np.argsort(np.argsort(index.pts[plan.packet_positions], kind="stable"), kind="stable")
        frames: list[av.VideoFrame] = []
        try:
            self.codec.flush_buffers()
            for position, (payload, rank) in enumerate(zip(payloads, ranks.tolist(), strict=True)):
                packet = av.Packet(payload)
                packet.pts, packet.dts = rank, position
                packet.is_keyframe = bool(index.keyframe[plan.packet_positions[position]])
                frames.extend(self.codec.decode(packet))
            frames.extend(self.codec.decode(None))
        except (av.error.FFmpegError, OSError) as e:
            raise VideoDecodeError(
                f"{self.label}: decoding {len(payloads)} packets failed ({e}); the file is corrupt."
            ) from e
        damaged = next((frame for frame in frames if is_damaged(frame, index)), None)
        if damaged is not None:
            clip_pts = np.sort(index.pts[plan.packet_positions])
            rank = damaged.pts
            known = rank is not None and 0 <= rank < len(clip_pts)
            seconds = float(int(clip_pts[rank]) * index.time_base) if known else None
            raise damaged_frame_error(self.label, damaged, index, seconds)
        shown = [int(frame.pts) for frame in frames if frame.pts is not None]
        for earlier, later in itertools.pairwise(shown):
            if later <= earlier:
                raise out_of_order_error(self.label, f"display rank {later} of the clip after {earlier}")
        by_rank = {int(frame.pts): frame for frame in frames if frame.pts is not None}
        for start, _ in plan.segments:  # each run's keyframe, decoded after the previous run's pictures
            rank = int(ranks[int(np.searchsorted(plan.packet_positions, start))])
            seconds = float(int(index.pts[start]) * index.time_base)
            check_random_access(self.label, by_rank.get(rank), rank, seconds)
        wanted = np.unique(plan.relative_indices).tolist()
        missing = [rank for rank in wanted if rank not in by_rank]
        if missing:
            raise VideoDecodeError(
                f"{self.label}: {len(missing)} of {len(wanted)} requested frames did not come out of the decoder "
                f"({len(frames)} frames from {len(payloads)} packets); the file is corrupt or truncated."
            )
        return {rank: by_rank[rank] for rank in wanted}

    def close(self) -> None:
        self.container.close()
