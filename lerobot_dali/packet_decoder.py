"""The CPU fallback's decoder of a request's packets alone, for MP4s whose packets are read by byte range.

A PyAV decoder opened from the file's stream template (``PacketIndex.template``), and kept open like a file's, is fed
the planned packets (:mod:`.clips`; for a remote file the prefetch cache serves them, a local one is read by
:mod:`.packet_file_reader`): no remux, no demux, no container read beyond them. The packets carry their display rank
as pts, which proves which frame is which, and every frame is checked as a file reader checks it
(:mod:`.frame_checks`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import av
import numpy as np

from .clips import ClipPlan
from .cpu_backends import require_pyav_decoder
from .errors import DAMAGED_VIDEO_ADVICE, VideoDecodeError
from .frame_checks import check_random_access, damaged_frame_error, is_damaged, mid_gop_error, out_of_order_error
from .packet_index import PacketIndex

__all__ = ["PacketDecoder"]


class PacketDecoder:
    """A PyAV decoder opened from a file's stream template (``PacketIndex.template``), fed the packets of one
    request at a time and reset between requests, as a file's open decoder is after each seek.

    The template's container is closed once its codec context is taken (PyAV gives each stream its own context,
    which outlives the container): kept open, it held FFmpeg's stream-probing decoder, +280 KB per open H.264
    decoder (up to 50 KB HEVC or AV1), for nothing."""

    def __init__(self, index: PacketIndex, *, threads: int) -> None:
        require_pyav_decoder(index)
        try:
            with av.open(io.BytesIO(index.template), "r") as container:
                self.codec = container.streams.video[0].codec_context
        except (av.error.FFmpegError, OSError) as e:
            raise VideoDecodeError(f"{index.source_name}: the stream template does not open ({e}).") from e
        self.codec.thread_count = threads
        self.codec.thread_type = "AUTO"

    def frames_at(
        self, index: PacketIndex, plan: ClipPlan, payloads: list[bytes], convert: Callable[[av.VideoFrame], Any]
    ) -> dict[int, Any]:
        """The planned packets decoded: ``convert(frame)`` of each wanted frame, keyed by its display rank in the plan.

        Each frame is checked and converted as it comes out and the others dropped at once, as a file reader does:
        holding a clip's frames until its last grew the decoder's frame pool to the clip's length, which it then
        kept (+6 MB per open 640x480 decoder after an 18-frame clip). A run's packets are fed until every frame from
        its keyframe to its last wanted one is out, the packets ahead of them left unfed (:func:`~.clips.plan_clip`'s
        ``lookahead``), and decoding stops once every run's are."""
        # Errors name this request's file, not the one the decoder was opened for: files of one stream template (a
        # simulator's episodes may all start alike) share a kept decoder.
        label = index.source_name
        if len(payloads) != plan.frame_count:
            raise ValueError(f"decode_packets got {len(payloads)} payloads for a plan of {plan.frame_count} packets.")
        # Display rank as pts: the decoder hands frames back in display order, and the pts proves which is which.
        ranks = np.argsort(np.argsort(index.pts[plan.packet_positions], kind="stable"), kind="stable")
        clip_seconds = np.sort(index.pts[plan.packet_positions]) * float(index.time_base)
        # Each run's keyframe (decoded after the previous run's pictures) must show first, intra-coded.
        firsts = np.searchsorted(plan.packet_positions, [start for start, _ in plan.segments])
        keys = {int(ranks[first]) for first in firsts.tolist()}
        # (The file's first packet starts a run unflagged where it is no keyframe: a file cut mid-GOP.)
        flagged = {int(ranks[first]): bool(index.keyframe[plan.packet_positions[first]]) for first in firsts.tolist()}
        pending = set(np.unique(plan.relative_indices).tolist())
        # Per run (payloads [bounds[i], bounds[i + 1])), the ranks it still owes: its keyframe, its wanted frames and
        # every frame shown between.
        bounds = [*firsts.tolist(), len(payloads)]
        run_of = np.repeat(np.arange(len(firsts)), np.diff(bounds))[np.argsort(ranks)].tolist()  # (by rank)
        owed: list[set[int]] = [set() for _ in firsts]
        for rank in (*pending, *keys):
            owed[run_of[rank]].add(rank)
        for run_owed in owed:  # and every frame shown between, which proves the wanted ones' place (no gap, no swap)
            run_owed.update(range(min(run_owed), max(run_owed)))
        found: dict[int, Any] = {}
        last: int | None = None
        try:
            for frame in self._decoded(index, plan, payloads, ranks, zip(owed, bounds[:-1], bounds[1:], strict=True)):
                rank = frame.pts
                known = rank is not None and 0 <= rank < len(clip_seconds)
                if is_damaged(frame, index):
                    raise damaged_frame_error(label, frame, index, float(clip_seconds[rank]) if known else None)
                if rank is None:
                    continue
                if last is not None and rank <= last:
                    shown = f"pts {clip_seconds[rank]:.6f} s after {clip_seconds[last]:.6f} s"  # (as a file reader)
                    raise out_of_order_error(label, shown)
                last = rank
                if rank in keys:
                    keys.discard(rank)
                    check_random_access(label, frame, rank, float(clip_seconds[rank]), flagged=flagged[rank])
                if rank in pending:
                    found[rank] = convert(frame)
                    pending.discard(rank)
                if known:
                    owed[run_of[rank]].discard(rank)
                if not pending and not keys and not any(owed):
                    break
        except (av.error.FFmpegError, OSError) as e:
            first = int(ranks[firsts[0]])
            if not flagged[first] and first in keys:  # (the file's first packet, no keyframe, refused: VP9, AV1)
                raise mid_gop_error(label, float(clip_seconds[first]), f"the decoder refuses it ({e})") from e
            raise VideoDecodeError(  # (as a file reader says it: a local MP4 is decoded here)
                f"{label}: decoding failed ({e}; {len(payloads)} packets); the file is corrupt or truncated: "
                f"{DAMAGED_VIDEO_ADVICE}"
            ) from e
        for rank in sorted(keys):  # a keyframe never shown
            check_random_access(label, None, rank, float(clip_seconds[rank]), flagged=flagged[rank])
        if pending:
            wanted = len(pending) + len(found)
            raise VideoDecodeError(
                f"{label}: {len(pending)} of {wanted} requested frames did not come out of the decoder "
                f"(from {len(payloads)} packets); the file is corrupt or truncated: {DAMAGED_VIDEO_ADVICE}"
            )
        return found

    def _decoded(
        self,
        index: PacketIndex,
        plan: ClipPlan,
        payloads: list[bytes],
        ranks: np.ndarray,
        runs: Iterable[tuple[set[int], int, int]],
    ) -> Iterator[av.VideoFrame]:
        """The frames of ``payloads`` as the decoder shows them, from a reset decoder, flushed at the end. ``runs``:
        per run, the ranks it owes (emptied by the caller as they come out) and its packets ``[first, stop)``, fed
        while it owes any. Runs are drained and reset between, as at a file reader's seek: a keyframe that is no IDR
        (x264's open-GOP I-frames) does not reset the decoder, so the frames it held back of the previous run came out
        after the next run's, a healthy file refused as misordered."""
        self.codec.flush_buffers()
        keyframes = index.keyframe[plan.packet_positions].tolist()
        display_ranks = ranks.tolist()
        for run, (owed, first, stop) in enumerate(runs):
            if run:
                yield from self.codec.decode(None)
                self.codec.flush_buffers()
            for position in range(first, stop):
                if not owed:
                    break
                packet = av.Packet(payloads[position])
                packet.pts, packet.dts = display_ranks[position], position
                packet.is_keyframe = keyframes[position]
                yield from self.codec.decode(packet)
        yield from self.codec.decode(None)

    def close(self) -> None:
        """Drops the frames the decoder holds; the codec context goes with this object."""
        self.codec.flush_buffers()
