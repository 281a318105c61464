"""Cut the packets a request needs out of a video file and remux them, unchanged, into a small MP4.

DALI's video decoder re-parses its whole input for every sample, so it must never see a whole file. A clip
holds only the GOPs that contain requested frames: for each frame, the packets from the keyframe before it
(in decode order) up to the frame itself; sparse requests get several such runs, not the gaps between
(closed GOPs only: see below).
Packets are copied byte for byte and re-timed to a gap-free constant rate (pts = display rank x frame
duration), so every decoder (NVDEC through DALI, DALI CPU, PyAV) numbers the clip's frames the same way:
frame ``k`` of the clip is the ``k``-th smallest pts, which is what DALI's ``frames=`` argument indexes. Two things
follow from DALI's GPU decoder, which reads a clip without an index: an H.264 clip that starts at a keyframe that is
no IDR picture gets the stream's SPS and PPS before its first packet (the one change to a payload), and a clip
reordered deeper than the pictures that decoder holds is refused (:func:`remux_clip`).

Open-GOP keyframes (HEVC CRA, H.264 recovery points) are followed by "leading" pictures that display
before them and reference the previous GOP; a clip starting at such a keyframe drops those packets, since
they are not decodable there and decoders differ in whether they emit or skip them. Such a keyframe also
does not reset the decoder as an IDR does: after an earlier run, its pictures would be predicted from that
run's stale references (wrong frames with the right timestamps) or reordered with them. So in files with
open GOPs a clip is one unbroken run, from the first needed keyframe to the last needed frame; and where an
open-GOP keyframe has no leading pictures (the index cannot tell it from an IDR), a run starting there is joined
to the one before once its first packet shows it (:func:`joined_for_one_pass`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from numpy.typing import ArrayLike

from . import fork_locks
from .errors import FrameRequestError, VideoDecodeError
from .frame_checks import mid_gop_error
from .keyframe_sizes import KEYFRAME_SIZE_CODECS, ReadAt, check_clip_keyframe_sizes
from .packet_index import PacketIndex
from .random_access import nal_layout, resets_decoder
from .sequence_headers import h264_parameter_sets, keyframe_sequence_headers
from .video_source import VideoSource, open_video_source

__all__ = [
    "Clip",
    "ClipPlan",
    "build_clip",
    "check_request",
    "joined_for_one_pass",
    "packets_from_keyframe",
    "packets_read_at",
    "plan_clip",
    "read_packet_payloads",
    "remux_clip",
]

logger = logging.getLogger(__name__)

#: Pictures DALI 2.4's GPU decoder (``fn.decoders.video``, device "mixed", which reads a clip without an index) holds
#: before it returns the lowest-timestamped one (``num_decode_surfaces_``; ``ReadNextFrameWithoutIndex``): its frames
#: come in display order only where no picture follows as many that show after it in decode order.
DALI_GPU_PICTURE_SLOTS = 8
#: Open stream templates kept per process (:func:`template_container`): a few KB each plus FFmpeg's state.
TEMPLATE_CACHE_SIZE = 64
_templates: OrderedDict[tuple[int, bytes], Any] = OrderedDict()
_templates_lock = fork_locks.lock()


@dataclass(frozen=True, eq=False)
class ClipPlan:
    """Which packets a request needs and where each requested frame lands inside the clip.

    ``segments`` are half-open decode-position ranges ``[start, stop)``, each starting at a keyframe;
    ``packet_positions`` lists the kept packets in decode order (segments minus dropped leading pictures);
    ``relative_indices[i]`` is the clip display index of the ``i``-th requested frame.
    """

    segments: tuple[tuple[int, int], ...]
    packet_positions: np.ndarray
    relative_indices: np.ndarray

    @property
    def frame_count(self) -> int:
        return len(self.packet_positions)

    def payload_bytes(self, index: PacketIndex) -> int:
        """Bytes of packet payload the plan copies from ``index``'s file."""
        return int(index.size_bytes[self.packet_positions].sum())


@dataclass(frozen=True, eq=False)
class Clip:
    """A remuxed MP4 (1-D uint8, the input of ``fn.decoders.video``) and the frames to take from it."""

    data: np.ndarray
    relative_indices: np.ndarray
    frame_count: int
    #: Bytes of packet payload copied from the source file (for bytes-per-clip vs file-size reports).
    payload_bytes: int


def check_request(index: PacketIndex, frame_indices: ArrayLike) -> np.ndarray:
    """``frame_indices`` as int64; FrameRequestError for an empty request, an index outside the video, or a frame its
    edit list hides (:attr:`~.packet_index.PacketIndex.hidden`: no decoder shows it, so no route may)."""
    requested = np.asarray(frame_indices)
    if requested.ndim != 1 or requested.size == 0:
        raise FrameRequestError(
            f"{index.source_name}: a clip request needs a non-empty 1-D list of frame indices, "
            f"got shape {requested.shape}."
        )
    if requested.dtype.kind not in "iu":
        raise FrameRequestError(f"{index.source_name}: frame indices must be integers, got dtype {requested.dtype}.")
    requested = requested.astype(np.int64, copy=False)
    lowest, highest = int(requested.min()), int(requested.max())  # (the masks below only to name a bad one)
    if lowest < 0 or highest >= index.frame_count:
        bad = requested[(requested < 0) | (requested >= index.frame_count)]
        raise FrameRequestError(
            f"{index.source_name}: frame index {int(bad[0])} is outside the video, "
            f"which has frames 0..{index.frame_count - 1}."
        )
    if lowest < index.shown.start or highest >= index.shown.stop:  # (``shown`` is one range)
        bad = requested[(requested < index.shown.start) | (requested >= index.shown.stop)]
        raise FrameRequestError(
            f"{index.source_name}: frame {int(bad[0])} (at {float(index.frame_pts_s[bad[0]]):.6f} s) is one the "
            "video's edit list hides: FFmpeg decodes it only as a reference and never shows it, so no route serves "
            f"it; ask for the frames shown (the frame lookup finds only those; {len(index.shown_pts)} of "
            f"{index.frame_count} are)."
        )
    return requested


def plan_clip(index: PacketIndex, frame_indices: ArrayLike, *, lookahead: int = 0) -> ClipPlan:
    """Plan the clip for display frame indices (any order, repeats allowed); pure, no I/O.

    ``lookahead``: packets kept after each run's last needed one (within the file, up to the next run), for a reader
    that feeds them to a decoder only until the run's frames come out, as a file's demuxer does, instead of draining
    the decoder at the run's end (:mod:`.packet_file_reader`): a decoder shows its pictures in the bitstream's order
    only once it has the pictures that follow, which is what refuses a file whose timestamps say another order.
    Raises FrameRequestError for an empty request or an index outside the video.
    """
    requested = check_request(index, frame_indices)
    needed = np.unique(requested)
    decode_pos = index.display_order[needed]
    keys = index.keyframe_positions
    key_slot = index.keyframe_slots(decode_pos)
    if not index.has_leading_pictures:  # every GOP is its keyframe onwards: runs from keyframe to frame
        segments = _ahead(_merge(keys[key_slot], decode_pos + 1), lookahead, index.frame_count)
        packet_positions = (
            np.arange(*segments[0]) if len(segments) == 1 else np.concatenate([np.arange(*s) for s in segments])
        )
    else:
        stops = np.minimum(decode_pos + 1 + lookahead, index.frame_count)
        packet_positions, segments = _open_gop_runs(index, decode_pos, key_slot, stops)
    clip_ranks = np.sort(index.display_rank[packet_positions])
    relative = np.searchsorted(clip_ranks, requested)  # a frame's display rank is its display index
    # (A run from keyframe to frame holds the frame: only a dropped leading picture can be missing.)
    if index.has_leading_pictures:
        _check_held(index, requested, clip_ranks, relative)
    return ClipPlan(
        segments=tuple(segments),
        packet_positions=packet_positions,
        relative_indices=relative.astype(np.int32),
    )


def _check_held(index: PacketIndex, requested: np.ndarray, clip_ranks: np.ndarray, relative: np.ndarray) -> None:
    """VideoDecodeError unless every requested frame is among the clip's (``relative``: where each would be)."""
    missing = (relative >= len(clip_ranks)) | (clip_ranks[np.minimum(relative, len(clip_ranks) - 1)] != requested)
    if missing.any():
        frame = int(requested[missing][0])
        raise VideoDecodeError(
            f"{index.source_name}: frame {frame} displays before the file's first keyframe and references "
            "pictures the file does not hold, so no decoder can produce it; re-encode the video."
        )


def _open_gop_runs(
    index: PacketIndex, decode_pos: np.ndarray, key_slot: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Kept packets and the one segment where some pictures display before their GOP's keyframe."""
    keys = index.keyframe_positions
    # A leading picture displays before the keyframe it follows; it needs the GOP before that keyframe.
    while True:
        leading = (index.pts[keys[key_slot]] > index.pts[decode_pos]) & (key_slot > 0)
        if not leading.any():
            break
        key_slot = np.where(leading, key_slot - 1, key_slot)
    # One run: a later open-GOP keyframe would not reset the decoder after an earlier run (module docstring).
    start, stop = int(keys[key_slot].min()), int(stops.max())
    positions = np.arange(start, stop)
    # Leading pictures of the run's first keyframe reference packets the clip does not hold.
    return positions[index.pts[positions] >= index.pts[start]], [(start, stop)]


def _merge(starts: np.ndarray, stops: np.ndarray) -> list[tuple[int, int]]:
    """Union of half-open ranges, sorted; touching ranges are joined (one seek, one read)."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(zip(starts.tolist(), stops.tolist(), strict=True)):  # (ties: any order merges alike)
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _ahead(runs: list[tuple[int, int]], lookahead: int, frame_count: int) -> list[tuple[int, int]]:
    """``runs`` each going on ``lookahead`` packets past its end, up to the next run's keyframe and the file's end.

    Runs are joined on the packets they need, not on those ahead: joined on these, a batch's runs of one file in
    GOP-2 AV1 fused into one long run, every packet between its frames decoded (14.5 packets per frame on
    ``cr5_v30_av1``, where a run from its keyframe needs 1.4)."""
    if lookahead <= 0:
        return runs
    starts = [start for start, _ in runs[1:]] + [frame_count]
    return [(start, min(stop + lookahead, next_start)) for (start, stop), next_start in zip(runs, starts, strict=True)]


def joined_for_one_pass(
    source: VideoSource, index: PacketIndex, plan: ClipPlan, payloads: list[bytes], *, filesystem: Any | None = None
) -> tuple[ClipPlan, list[bytes]]:
    """``plan`` and its ``payloads`` as one decoder pass takes them (a clip's): each run whose keyframe would not
    reset the decoder after the run before (an H.264 I picture at a recovery point, an HEVC CRA: module docstring)
    joined to that run, the packets between read too. FFmpeg dropped such a keyframe's picture from an x264 open-GOP
    clip whose runs were cut apart (9 packets, 8 frames out), which shifts every later frame of the clip.

    Only the packets between the joined runs are read (:func:`_gaps_plan`); the runs' own are kept."""
    joined = _runs_joined_at_open_keyframes(index, plan, payloads)
    if joined is None:
        return plan, payloads
    gaps = _gaps_plan(index, plan, joined)
    between = read_packet_payloads(source, index, gaps, filesystem=filesystem)
    by_position = dict(zip(plan.packet_positions.tolist(), payloads, strict=True))
    by_position.update(zip(gaps.packet_positions.tolist(), between, strict=True))
    return joined, [by_position[p] for p in joined.packet_positions.tolist()]


def _gaps_plan(index: PacketIndex, plan: ClipPlan, joined: ClipPlan) -> ClipPlan:
    """The packets ``joined`` holds and ``plan`` does not, as a plan to read: each gap a segment from the keyframe at or
    before it (where a demuxer can seek; a byte-exact read takes the gap's packets alone)."""
    held = np.zeros(index.frame_count, dtype=bool)
    held[plan.packet_positions] = True
    missing = joined.packet_positions[~held[joined.packet_positions]]
    starts = missing[np.flatnonzero(np.diff(missing, prepend=-2) != 1)]
    stops = missing[np.flatnonzero(np.diff(missing, append=index.frame_count + 1) != 1)] + 1
    keys = index.keyframe_positions[index.keyframe_slots(starts)]
    segments = tuple(zip(keys.tolist(), stops.tolist(), strict=True))
    return ClipPlan(segments=segments, packet_positions=missing, relative_indices=np.empty(0, np.int32))


def _runs_joined_at_open_keyframes(index: PacketIndex, plan: ClipPlan, payloads: list[bytes]) -> ClipPlan | None:
    if len(plan.segments) < 2 or index.codec not in ("h264", "hevc"):  # (other codecs' keyframes reset the decoder)
        return None
    layout = nal_layout(index.codec, template_container(index).streams.video[0].codec_context.extradata)
    firsts = np.searchsorted(plan.packet_positions, [start for start, _ in plan.segments[1:]]).tolist()
    segments = [plan.segments[0]]
    for (start, stop), first in zip(plan.segments[1:], firsts, strict=True):
        if layout is not None and resets_decoder(layout, payloads[first]):  # (Annex B: not read, so joined)
            segments.append((start, stop))
        else:
            segments[-1] = (segments[-1][0], stop)
    if len(segments) == len(plan.segments):
        return None
    requested = np.sort(index.display_rank[plan.packet_positions])[plan.relative_indices]
    positions = np.concatenate([np.arange(start, stop) for start, stop in segments])
    relative = np.searchsorted(np.sort(index.display_rank[positions]), requested)
    return ClipPlan(segments=tuple(segments), packet_positions=positions, relative_indices=relative.astype(np.int32))


def read_packet_payloads(
    source: VideoSource, index: PacketIndex, plan: ClipPlan, *, filesystem: Any | None = None
) -> list[bytes]:
    """The payload of each planned packet, in ``plan.packet_positions`` order.

    MP4 (``index.byte_exact``): one ranged read per segment, of its bytes alone where remote (a 256 KB read-ahead
    past each doubled what a sequential pass without the prefetch cache fetched). Other containers: a seek and a
    demux.
    """
    exact = index.byte_exact
    with open_video_source(source, filesystem=filesystem, size=index.file_size_bytes, exact_reads=exact) as handle:
        if index.byte_exact:
            return packets_read_at(functools.partial(_read_block, handle), index, plan)
        return _demux_payloads(handle, index, plan)


def _read_block(handle: Any, offset: int, length: int) -> bytes:
    handle.seek(offset)
    return handle.read(length)


def packets_read_at(read_at: ReadAt, index: PacketIndex, plan: ClipPlan) -> list[bytes]:
    """The payload of each planned packet of a byte-exact file (MP4), in ``plan.packet_positions`` order: one
    ``read_at(offset, length)`` per segment. VideoDecodeError naming the file where a read comes back short.

    A segment's packets are a slice of the plan's (both ascending), their few offsets and sizes Python ints: a mask and
    five array calls per segment took more time than the read itself."""
    payloads: list[bytes] = []
    positions = plan.packet_positions
    all_offsets, all_sizes = index.byte_offset[positions].tolist(), index.size_bytes[positions].tolist()
    firsts = np.searchsorted(positions, [start for start, _ in plan.segments]).tolist()
    for begin, stop in zip(firsts, [*firsts[1:], len(positions)], strict=True):
        offsets, sizes = all_offsets[begin:stop], all_sizes[begin:stop]
        first, end = min(offsets), max(o + s for o, s in zip(offsets, sizes, strict=True))
        block = read_at(first, end - first)
        if len(block) != end - first:
            raise VideoDecodeError(
                f"{index.source_name}: read {len(block)} of {end - first} bytes at offset {first}; the file is "
                "shorter than its index says (truncated or replaced since it was indexed)."
            )
        view = memoryview(block)
        payloads.extend(bytes(view[o - first : o - first + s]) for o, s in zip(offsets, sizes, strict=True))
    return payloads


def packets_from_keyframe(container: Any, stream: Any, index: PacketIndex, start: int) -> Iterator[av.Packet]:
    """``stream``'s packets from the keyframe at decode position ``start`` of ``index`` on (demuxed, not decoded).

    A seek lands on a keyframe at or before its target, and which one depends on the demuxer: with B-frames,
    MP4's seek compares presentation times, so seeking to the keyframe's (earlier) decode time landed a whole
    GOP early (250 frames on gr00t's H.264). So: seek to the keyframe's presentation time, then skip the
    packets before it by demuxing alone; should the seek overshoot, start from the file's first packet instead.

    A generator: it seeks on the first ``next``, and closes PyAV's demux generator when it is closed or dropped
    part-way, as its callers do. PyAV's abi3 wheels build generators that never run their cleanup when dropped
    unfinished, and each leaked the demuxer's packet buffer: ~300 bytes per seek, 34 KB per batch in a worker.
    """
    key_dts, key_pts = int(index.dts[start]), int(index.pts[start])
    # The file's first packet, where it is no keyframe (a file cut mid-GOP), has no keyframe at or before it to seek to
    # (FFmpeg's MP4 seek failed with EPERM, said as a corrupt file): any packet is sought there.
    any_frame = not bool(index.keyframe[start])
    for target in (key_pts, int(index.dts[0])):
        container.seek(target, stream=stream, backward=True, any_frame=any_frame)
        with contextlib.closing(container.demux(stream)) as packets:
            for packet in packets:
                if packet.size == 0:
                    continue
                # Matroska's demuxer gives the packet it seeked to no dts (its pts stood in for it, which looked
                # like an overshoot, so every MKV request demuxed from the file's start): the pts decides then.
                if packet.pts == key_pts and packet.dts in (None, key_dts):
                    yield packet
                    yield from packets
                    return
                dts = packet.dts if packet.dts is not None else packet.pts  # as the index records it
                if dts is None or dts < key_dts:
                    continue
                break  # past the keyframe: the seek overshot
    if any_frame:  # (Matroska's seek lands on a keyframe its cues list, whatever the flags: the first is later)
        seconds = float(key_pts * index.time_base)
        raise mid_gop_error(index.source_name, seconds, "the demuxer does not seek to it (it seeks keyframes only)")
    raise VideoDecodeError(
        f"{index.source_name}: no packet at the keyframe's decode time {key_dts} (position {start}); the file "
        "differs from its packet index (rewritten since it was indexed?)"
    )


def _demux_payloads(handle: Any, index: PacketIndex, plan: ClipPlan) -> list[bytes]:
    wanted = {int(index.pts[p]): i for i, p in enumerate(plan.packet_positions.tolist())}
    payloads: list[bytes | None] = [None] * len(wanted)
    found = 0
    try:
        with av.open(handle, mode="r") as container:
            stream = container.streams.video[0]
            for start, stop in plan.segments:
                pending = {int(index.pts[p]) for p in range(start, stop)}
                for packet in packets_from_keyframe(container, stream, index, start):
                    if packet.size == 0:
                        break
                    pts = packet.pts if packet.pts is not None else packet.dts  # as the index records it
                    if pts is None:
                        continue
                    slot = wanted.get(pts)
                    if slot is not None and payloads[slot] is None:
                        payloads[slot] = bytes(packet)
                        found += 1
                    pending.discard(pts)
                    if not pending:
                        break
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{index.source_name}: demuxing packets for a clip failed ({e}).") from e
    if found != len(payloads):
        raise VideoDecodeError(
            f"{index.source_name}: {len(payloads) - found} packets of the clip were not found when demuxing; "
            "the file changed since it was indexed or is corrupt."
        )
    return [p for p in payloads if p is not None]


def template_container(index: PacketIndex) -> Any:
    """``index.template`` opened as a PyAV container, once per process and file, for remuxing.

    Opening a template probes it (~1 ms for H.264 480x640, ~0.5 ms for AV1), more than the rest of a clip,
    and remuxing only copies the stream's codec parameters, so every clip of a file shares one (never use
    it to decode: a decoder has state). Keyed by process: a forked worker opens its own. Evicted entries are
    dropped, not closed: a clip being muxed in another thread may still hold one, and it closes with its
    last reference.
    """
    key = (os.getpid(), index.template)
    with _templates_lock:
        container = _templates.get(key)
        if container is not None:
            _templates.move_to_end(key)
            return container
    container = av.open(io.BytesIO(index.template), mode="r")
    with _templates_lock:
        _templates[key] = container
        while len(_templates) > max(TEMPLATE_CACHE_SIZE, 1):  # never the one just opened
            _templates.popitem(last=False)
    return container


def remux_clip(index: PacketIndex, plan: ClipPlan, payloads: list[bytes]) -> np.ndarray:
    """Mux ``payloads`` (the planned packets) into an in-memory MP4, re-timed to a gap-free constant rate."""
    if len(payloads) != plan.frame_count:
        raise ValueError(f"remux_clip got {len(payloads)} payloads for a plan of {plan.frame_count} packets.")
    payloads = _parameter_sets_in_band(index, payloads)
    if index.codec in KEYFRAME_SIZE_CODECS and not index.keyframe_sizes_checked:  # (a remote file: its index read some)
        seconds = float(index.time_base)
        keyframes = [
            (int(index.pts[position]) * seconds, payload)
            for position, payload in zip(plan.packet_positions.tolist(), payloads, strict=True)
            if index.keyframe[position]
        ]
        check_clip_keyframe_sizes(
            index.template, index.codec, keyframes, size=(index.width, index.height), label=index.source_name
        )
    count = plan.frame_count
    rank = np.argsort(np.argsort(index.pts[plan.packet_positions], kind="stable"), kind="stable")
    # Decode timestamps must not exceed presentation ones: shift them back by the reorder delay.
    delay = max(0, int((np.arange(count) - rank).max()))
    if delay >= DALI_GPU_PICTURE_SLOTS:
        raise VideoDecodeError(
            f"{index.source_name}: a clip of it has a picture decoded after {delay} that show later, more than the "
            f"{DALI_GPU_PICTURE_SLOTS} DALI's GPU decoder holds to put pictures in display order: it would return "
            "them out of order. Decode this camera on the CPU (decode='cpu'), or re-encode the video with fewer "
            "B-frames (lerobot-dali reencode)."
        )
    duration = index.frame_duration
    output = io.BytesIO()
    try:
        with av.open(output, mode="w", format="mp4") as muxer:
            stream = muxer.add_stream_from_template(template_container(index).streams.video[0], opaque=True)
            keyframes = index.keyframe[plan.packet_positions].tolist()
            packets = zip(payloads, rank.tolist(), keyframes, strict=True)
            for position, (payload, display_rank, keyframe) in enumerate(packets):
                packet = av.Packet(payload)
                packet.pts = display_rank * duration
                packet.dts = (position - delay) * duration
                packet.duration = duration
                packet.time_base = index.time_base
                packet.is_keyframe = keyframe
                packet.stream = stream
                muxer.mux(packet)
    except av.error.FFmpegError as e:
        raise VideoDecodeError(f"{index.source_name}: remuxing a clip of {count} packets failed ({e}).") from e
    return np.frombuffer(output.getvalue(), dtype=np.uint8)


def _parameter_sets_in_band(index: PacketIndex, payloads: list[bytes]) -> list[bytes]:
    """``payloads`` with the stream's SPS and PPS before the first, where that is an H.264 keyframe that is no IDR
    picture (an open-GOP I picture at a recovery point) and carries none of its own. FFmpeg's ``h264_mp4toannexb``,
    which DALI's decoder runs on an MP4, puts the ``avcC``'s parameter sets in-band only before IDR pictures, and
    DALI 2.4 hands NVDEC's parser the ``avcC`` record as it is, not as the units the parser reads (by a reading of
    its source; not yet seen on a GPU): a clip from such a keyframe reached NVDEC with no SPS before its first
    picture. PyAV's decoder reads the ``avcC`` itself, so the CPU tests alone could not show it. The units are the
    ``avcC``'s own: every decoder decodes the same frames."""
    if index.codec != "h264" or not payloads:
        return payloads
    extradata = template_container(index).streams.video[0].codec_context.extradata
    layout, first = nal_layout(index.codec, extradata), payloads[0]
    if layout is None or resets_decoder(layout, first):
        return payloads
    size = layout.length_size
    own = keyframe_sequence_headers("h264", lambda at, n: first[at : at + n], len(first), length_size=size)
    units = h264_parameter_sets(extradata)
    if own or not units or any(len(unit) >= 1 << (8 * size) for unit in units):
        return payloads
    prefix = b"".join(len(unit).to_bytes(size, "big") + unit for unit in units)
    return [prefix + first, *payloads[1:]]


def build_clip(
    source: VideoSource, index: PacketIndex, frame_indices: ArrayLike, *, filesystem: Any | None = None
) -> Clip:
    """Plan, read and remux the clip holding display frames ``frame_indices`` of ``source``.

    ``index`` must be the packet index of ``source`` (see :func:`~lerobot_dali.packet_index_cache.load_packet_index`).
    """
    plan = plan_clip(index, frame_indices)
    payloads = read_packet_payloads(source, index, plan, filesystem=filesystem)
    plan, payloads = joined_for_one_pass(source, index, plan, payloads, filesystem=filesystem)
    data = remux_clip(index, plan, payloads)
    payload_bytes = plan.payload_bytes(index)
    if logger.isEnabledFor(logging.DEBUG):  # (its arguments cost ~1 us a clip, of every sample of a clip route)
        logger.debug(
            "Clip of %d frames (%d segments, %d bytes) from %s (%d bytes)",
            plan.frame_count,
            len(plan.segments),
            data.nbytes,
            index.source_name,
            index.file_size_bytes,
        )
    return Clip(
        data=data, relative_indices=plan.relative_indices, frame_count=plan.frame_count, payload_bytes=payload_bytes
    )
