"""Per-file packet index: where every frame of a video lies, read once by demuxing (never decoding).

Everything on the video route (timestamp lookup, clip cutting, CPU seeking) needs the same facts about a
file: each packet's presentation and decode timestamps, byte range and keyframe flag. Demuxing a file costs
one pass over its headers (or, for MP4, a read of its sample tables: :mod:`.mp4_tables`); keeping the result
per worker (:mod:`.packet_index_cache`) makes every later request pure arithmetic plus one ranged read.

Frames are numbered in display order: frame ``k`` is the packet with the ``k``-th smallest pts, the same
numbering DALI's video decoder and any sequential decode use (one shown frame per packet, as in MP4).
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import IO, Any

import av
import numpy as np
from fsspec.implementations.local import LocalFileOpener
from numpy.typing import ArrayLike

from .errors import (
    DAMAGED_VIDEO_ADVICE,
    CodecUnsupportedError,
    DatasetError,
    VideoDecodeError,
    missing_video,
    no_video_stream,
)
from .keyframe_sizes import KEYFRAME_SIZE_CODECS, PacketBytes, ReadAt, check_keyframe_sizes
from .mp4_tables import Mp4Track, mp4_file_cut, read_mp4_tracks
from .random_access import HEAD_BYTES, NalLayout, is_random_access, nal_layout
from .remote_errors import is_transient
from .said_once import warn_once
from .video_source import VideoSource, open_video_source, source_label
from .wording import counted

__all__ = ["PacketIndex", "build_packet_index", "changed_since_listed", "check_stored_index", "no_decoder_error"]

logger = logging.getLogger(__name__)

# Packets whose stored bytes are compared with the file at their byte offset, to prove offsets are exact.
_BYTE_CHECK_PACKETS = 3
# Packets demuxed to check the timestamps read from MP4 sample tables (a whole GOP start of most files).
_TIMESTAMP_CHECK_PACKETS = 6
# Bytes kept of each keyframe a demux passes, to tell whether it is a random-access point without reading it again.
_DEMUXED_HEAD_BYTES = 8 * HEAD_BYTES

#: The largest packet size and frame count held as int32 (half of int64's bytes in every cached index).
_INT32_MAX = int(np.iinfo(np.int32).max)

#: One packet: pts, dts, byte offset, size, keyframe, hidden (by the edit list: decoded, never shown).
Row = tuple[int, int, int, int, bool, bool]


@dataclass(frozen=True, eq=False)
class PacketIndex:
    """Packets of a file's first video stream, in decode order, plus the display-order view.

    Timestamps are integers in ``time_base``; ``byte_offset``/``size_bytes`` address each packet's payload
    in the file when ``byte_exact`` is true (checked at build time; MP4 samples are stored verbatim).
    ``template`` is a tiny MP4 holding the stream's codec parameters and its first keyframe, used as the
    stream template when remuxing clips so no clip ever re-opens the source file.

    Arrays are read-only and as narrow as their values provably allow (positions and packet sizes int32): a worker
    caches hundreds of them. Fields with equal contents share one array (a stream in display order: ``dts`` is
    ``pts``, ``display_rank`` is ``display_order``).
    """

    source_name: str
    codec: str
    width: int
    height: int
    pix_fmt: str | None
    time_base: Fraction
    pts: np.ndarray
    dts: np.ndarray
    byte_offset: np.ndarray
    size_bytes: np.ndarray
    keyframe: np.ndarray
    file_size_bytes: int
    byte_exact: bool
    template: bytes = field(repr=False)
    #: The container's index of the stream indexed: its first video stream (a file may hold audio first, or more
    #: video streams, of which FFmpeg's "best" need not be the first).
    stream_index: int = 0
    #: Whether the build judged every keyframe's frame size (:mod:`.keyframe_sizes`; a local file, read through): a
    #: clip's keyframes then need no check of their own. False for a remote file's index, which reads its first
    #: packets only: each clip checks its keyframes (:func:`~lerobot_dali.clips.remux_clip`).
    keyframe_sizes_checked: bool = False
    #: Per decode position, whether the file's edit list hides the packet's picture (None: it hides none). FFmpeg
    #: demuxes such a packet flagged to be decoded and not shown: a frame before the edit's start (a stream cut from a
    #: longer recording) or after its end, decoded only as a reference for the frames shown. Every decode route
    #: reads the packet, and none may show its picture: no timestamp looks it up (:mod:`.frame_lookup`).
    hidden: np.ndarray | None = None
    #: Display index -> decode position (argsort of ``pts``).
    display_order: np.ndarray = field(init=False, repr=False)
    #: Decode position -> display index (inverse of ``display_order``).
    display_rank: np.ndarray = field(init=False, repr=False)
    #: Presentation time in seconds of each displayed frame, ascending (index = display index).
    frame_pts_s: np.ndarray = field(init=False, repr=False)
    #: Typical distance between consecutive displayed frames, in ``time_base`` units (at least 1).
    frame_duration: int = field(init=False)
    #: Decode positions where decoding can start: the keyframes, and 0 when the stream does not start on one
    #: (decoding can then only start at its beginning). Ascending.
    keyframe_positions: np.ndarray = field(init=False, repr=False)
    #: Whether any packet displays before the keyframe its GOP starts at (open GOPs: HEVC CRA, H.264
    #: recovery points). Without such "leading" pictures a clip is simply keyframe-to-frame runs.
    has_leading_pictures: bool = field(init=False)
    #: Display indices of the frames a decode shows: all but those ``hidden``, which lie before them (before the
    #: edit's start) or after them (past its end).
    shown: range = field(init=False)

    def __post_init__(self) -> None:
        count = len(self.pts)
        if count == 0:
            raise VideoDecodeError(f"{self.source_name}: the video stream holds no packets.")
        for name in ("dts", "byte_offset", "size_bytes", "keyframe"):
            if len(getattr(self, name)) != count:
                raise ValueError(f"PacketIndex.{name} has {len(getattr(self, name))} entries, pts has {count}.")
        if self.time_base <= 0:
            raise ValueError(f"PacketIndex.time_base must be positive, got {self.time_base}.")
        if self.hidden is not None and len(self.hidden) != count:
            raise ValueError(f"PacketIndex.hidden has {len(self.hidden)} entries, pts has {count}.")
        hidden = None if self.hidden is None or not self.hidden.any() else self.hidden.astype(bool)
        if hidden is not None and hidden.all():
            raise VideoDecodeError(
                f"{self.source_name}: its edit list hides every one of its {count} frames: no decoder shows any "
                "(an edit list written for other media); re-encode the video from its source."
            )
        object.__setattr__(self, "hidden", hidden)
        if self.dts is not self.pts and self.dts.dtype == self.pts.dtype and np.array_equal(self.dts, self.pts):
            object.__setattr__(self, "dts", self.pts)  # (most streams without B-frames: one array, not two)
        sizes = self.size_bytes
        if sizes.dtype.itemsize > 4 and sizes.min() >= 0 and sizes.max() <= _INT32_MAX:  # (2 GiB packets: int64)
            object.__setattr__(self, "size_bytes", sizes.astype(np.int32))
        positions = np.int32 if count <= _INT32_MAX else np.int64
        if count == 1 or bool(np.all(np.diff(self.pts) > 0)):  # in display order already: share, do not copy
            order = rank = np.arange(count, dtype=positions)
            sorted_pts = self.pts
        else:
            order = np.argsort(self.pts, kind="stable").astype(positions)
            sorted_pts = self.pts[order]
            if np.any(np.diff(sorted_pts) == 0):
                duplicate = int(sorted_pts[np.flatnonzero(np.diff(sorted_pts) == 0)[0]])
                raise VideoDecodeError(
                    f"{self.source_name}: two packets share pts {duplicate}; frames cannot be told apart by "
                    "presentation time. Re-encode or remux the video."
                )
            rank = np.empty(count, dtype=positions)
            rank[order] = np.arange(count, dtype=positions)
        duration = int(np.median(np.diff(sorted_pts))) if count > 1 else 1
        seconds = sorted_pts * self.time_base.numerator / self.time_base.denominator
        keys = np.flatnonzero(self.keyframe)
        if keys.size == 0 or keys[0] != 0:
            keys = np.concatenate(([0], keys))
        gop_start = keys[np.searchsorted(keys, np.arange(count), side="right") - 1]
        leading = bool(np.any(self.pts < self.pts[gop_start]))
        shown = range(count) if hidden is None else self._shown(np.flatnonzero(~hidden[order]))
        derived = (order, rank, seconds, keys) + (() if hidden is None else (hidden,))
        for array in (self.pts, self.dts, self.byte_offset, self.size_bytes, self.keyframe, *derived):
            array.setflags(write=False)
        object.__setattr__(self, "display_order", order)
        object.__setattr__(self, "display_rank", rank)
        object.__setattr__(self, "frame_pts_s", seconds)
        object.__setattr__(self, "frame_duration", max(duration, 1))
        object.__setattr__(self, "keyframe_positions", keys)
        object.__setattr__(self, "has_leading_pictures", leading)
        object.__setattr__(self, "shown", shown)

    def _shown(self, frames: np.ndarray) -> range:
        """``frames`` (display indices shown, ascending) as a range; VideoDecodeError where hidden frames lie among
        them (an edit list of several pieces: its frames have no one numbering)."""
        shown = range(int(frames[0]), int(frames[-1]) + 1)
        if len(frames) != len(shown):
            raise VideoDecodeError(
                f"{self.source_name}: its edit list hides {counted(len(shown) - len(frames), 'frame')} among those "
                "it shows (an edit list of several pieces): lerobot-dali reads edit lists that hide frames before or "
                "after those shown only. Write the video again with the frames it shows, e.g. re-encode it with FFmpeg "
                "(ffmpeg -i in.mp4 -c:v libx264 out.mp4)."
            )
        return shown

    @property
    def frame_count(self) -> int:
        return len(self.pts)

    @property
    def frame_pts(self) -> np.ndarray:
        """Presentation timestamp (``time_base`` units) of each displayed frame, ascending: ``pts`` itself for a stream
        in display order, else computed at each access (not kept: 8 bytes a frame of every cached index); for a few
        frames, :meth:`pts_of_frames`."""
        return self.pts if self.display_order is self.display_rank else self.pts[self.display_order]

    def pts_of_frames(self, frame_numbers: ArrayLike) -> np.ndarray:
        """``frame_pts[frame_numbers]`` without computing every frame's."""
        return self.pts[self.display_order[np.asarray(frame_numbers)]]

    def keyframe_slots(self, decode_positions: ArrayLike) -> np.ndarray:
        """Per decode position, the index in :attr:`keyframe_positions` of the keyframe that decoding it starts
        from (the last at or before it; position 0 is always one)."""
        return np.searchsorted(self.keyframe_positions, decode_positions, side="right") - 1

    def start_keyframe(self, frame_numbers: ArrayLike) -> int:
        """Decode position of the keyframe at or before the first of display frames ``frame_numbers`` in decode
        order: where decoding them starts, except for a leading picture of an open GOP, whose decoding starts a
        GOP earlier (:func:`~lerobot_dali.clips.plan_clip`)."""
        first = self.display_order[int(np.min(frame_numbers))]
        return int(self.keyframe_positions[self.keyframe_slots(first)])

    @property
    def shown_pts(self) -> np.ndarray:
        """Presentation timestamp (``time_base`` units) of each frame a decode shows, ascending (:attr:`frame_pts` but
        for those the edit list hides)."""
        return self.frame_pts[self.shown.start : self.shown.stop]

    @property
    def shown_pts_s(self) -> np.ndarray:
        """Presentation time in seconds of each frame a decode shows, ascending (:attr:`frame_pts_s` but for those
        the edit list hides; index ``i`` is display index ``shown.start + i``)."""
        return self.frame_pts_s[self.shown.start : self.shown.stop]

    @property
    def frame_interval_s(self) -> float:
        """Typical distance between consecutive displayed frames, in seconds (``frame_duration``)."""
        return self.frame_duration * float(self.time_base)

    @property
    def nbytes(self) -> int:
        """Memory held by this index (what a cache of indices costs per file); an array shared by two fields (a
        stream in display order: ``pts`` and ``dts``; ``display_order`` and ``display_rank``) counts once."""
        arrays = (
            self.pts, self.dts, self.byte_offset, self.size_bytes, self.keyframe, self.display_order,
            self.display_rank, self.frame_pts_s, self.keyframe_positions,
            *(() if self.hidden is None else (self.hidden,)),
        )  # fmt: skip
        return sum({id(a): a.nbytes for a in arrays}.values()) + len(self.template)


def build_packet_index(source: VideoSource, *, filesystem: Any | None = None) -> PacketIndex:
    """Index the first video stream of ``source`` (no decoding) into a :class:`PacketIndex`.

    MP4/MOV files are indexed from their ``moov`` sample tables (FFmpeg's own index plus the ``ctts``
    composition offsets), reading the header and the first few packets only; other containers, and any MP4
    whose tables disagree with the demuxer, are demuxed packet by packet (the reason is logged at DEBUG).

    ``keyframe`` holds the random-access points among the packets the container flags: an H.264 or HEVC packet
    whose first slice is a P or B picture (x264's intra refresh flags those), or an H.264 I picture that is neither
    an IDR nor a recovery point, is not one (:mod:`~lerobot_dali.random_access`; one read of a packet's first bytes
    more for most files).

    Raises MissingDataFileError (no such file), VideoDecodeError (unreadable, truncated, no video stream,
    no packets) and CodecUnsupportedError (a codec this FFmpeg build does not know), each naming the file.
    """
    label = source_label(source)
    with open_video_source(source, filesystem=filesystem) as handle:
        file_size = _file_size(handle)
        start = handle.tell() if hasattr(handle, "tell") else 0
        try:
            tracks = read_mp4_tracks(handle, file_size) if start == 0 else None
            if tracks is None and start == 0:
                _check_matroska_segment(handle, file_size, label=label)
            elif tracks is not None and any(track.fragmented for track in tracks.values()):
                _check_fragments(handle, file_size, label=label)
            if tracks is None:
                logger.debug("%s: not an MP4 with a moov box (or not read from byte 0); demuxing.", label)
            handle.seek(start)
            with av.open(handle, mode="r") as container:
                index = _index_container(container, handle, tracks, demux=False, label=label, file_size=file_size)
            if index is None:  # the sample tables were not usable: demux a fresh container
                handle.seek(start)
                with av.open(handle, mode="r") as container:
                    index = _index_container(container, handle, tracks, demux=True, label=label, file_size=file_size)
                assert index is not None  # without sample tables every failure raises
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:  # (PyAV: I/O as OSError, bad metadata)
            if is_transient(e):  # the network failed (after its retries): the file is not to blame
                raise
            raise VideoDecodeError(
                f"{label}: cannot read the video container ({e}); the file is truncated or corrupt: "
                f"{DAMAGED_VIDEO_ADVICE}"
            ) from e
        finally:
            if hasattr(handle, "seek"):
                handle.seek(start)
    logger.debug(
        "Indexed %d packets of %s (%s %dx%d)", index.frame_count, label, index.codec, index.width, index.height
    )
    return index


def check_stored_index(source: VideoSource, index: PacketIndex, *, filesystem: Any | None = None) -> None:
    """VideoDecodeError where ``source``'s file, whose ``index`` was stored by a version that did not refuse truncated
    and zero-filled files (:data:`~lerobot_dali.packet_index_file.FILE_CHECKS`), is one: such an index holds the
    frames before the cut, and lookups past them blamed the dataset's rows. The checks a build makes before its demux
    (a Matroska segment past the file's end; an MP4's boxes, :func:`~lerobot_dali.mp4_tables.mp4_file_cut`, which also
    finds a plain MP4 cut among its packets by its ``mdat`` past the end) and after it (:func:`_check_zero_filled`),
    from a few small reads: two for a Matroska file, about six for an MP4 (its ``moov``, its ``mfra`` box, its
    top-level box headers, its last packet). A fragmented MP4 whose ``mehd`` box gives the movie more time than the
    index holds (cut between two fragments: :func:`_check_movie_duration`, which needs the demuxer's stream durations)
    is indexed again, and refused as a build refuses it.

    DatasetError where the file has another size than the one indexed (it changed since it was listed: the index is
    another file's), as a build refuses it; MissingDataFileError where it is gone; any other OSError as the read raised
    it: a failed read says nothing of the file, so the caller keeps the index (it was deleted, the file called damaged,
    for a 403 or a file removed while read)."""
    label = source_label(source)
    with open_video_source(source, filesystem=filesystem) as handle:
        file_size = _file_size(handle)
        if file_size != index.file_size_bytes:
            raise changed_since_listed(label, file_size, index.file_size_bytes)
        try:
            index_again = _check_stored_file(handle, file_size, index, label=label)
        except FileNotFoundError as e:  # (removed while read)
            raise missing_video(label) from e
    if index_again:
        build_packet_index(source, filesystem=filesystem)


def changed_since_listed(name: str, size: int, listed_size: int) -> DatasetError:
    """The error for a file found with ``size`` bytes that was listed (and indexed) with ``listed_size``: byte ranges
    are cached under the listed stamp and episode times describe the listed file, so reading on would mix two versions
    of it."""
    return DatasetError(
        f"{name} has {size} bytes but was listed with {listed_size}: it changed on the server since the dataset was "
        "opened; re-open the dataset"
    )


def _check_stored_file(handle: IO[bytes], file_size: int, index: PacketIndex, *, label: str) -> bool:
    """:func:`check_stored_index`'s checks of the open file; whether it must be indexed again (its ``mehd`` box)."""
    _check_matroska_segment(handle, file_size, label=label)
    handle.seek(0)
    tracks = None
    if file_size >= 8 and handle.read(8)[4:].isalnum():  # (an MP4's first box type)
        tracks = read_mp4_tracks(handle, file_size)
        fragmented = tracks is not None and any(track.fragmented for track in tracks.values())
        why = mp4_file_cut(handle, file_size, fragmented=fragmented)
        if why is not None:
            raise _truncated(label, why)
    if index.byte_exact:
        _check_zero_filled(_reads(handle), index.byte_offset, index.size_bytes, index.codec, file_size, label=label)
    stated = None if not tracks else next(iter(tracks.values())).movie_duration_s
    if stated is None:
        return False
    pts = np.sort(index.pts)
    interval = _frame_interval(pts, index.time_base, Fraction(0))  # (one frame: its length unknown, 0)
    return bool(stated - (int(pts[-1]) * index.time_base + interval) > interval / 2)


#: The EBML header's and the Segment's element IDs: a Matroska (WebM) file is the one, then the other.
_EBML_ID, _SEGMENT_ID = b"\x1a\x45\xdf\xa3", b"\x18\x53\x80\x67"
#: The element IDs of a SeekHead, its Seek entries, an entry's SeekID and SeekPosition, and of Cues (Matroska).
_SEEK_HEAD_ID, _SEEK_ENTRY_ID, _CUES_ID = b"\x11\x4d\x9b\x74", b"\x4d\xbb", b"\x1c\x53\xbb\x6b"
_SEEK_ID_ID, _SEEK_POSITION_ID = b"\x53\xab", b"\x53\xac"


def _check_matroska_segment(handle: IO[bytes], file_size: int, *, label: str) -> None:
    """VideoDecodeError where ``handle`` holds a Matroska (WebM) file whose Segment, by the size its header gives,
    ends past the file's end: the file is truncated. FFmpeg's demuxer stops at the cut without an error, so such a file
    was indexed as a shorter video (144 of 180 cuts of VP9 WebM, H.264 and AV1 Matroska files), and a lookup past its
    last packet blamed the dataset's rows. A Segment of unknown size (a live recording's) is not checked. Where the
    SeekHead that opens the Segment (FFmpeg's, mkvmerge's) places the Cues, which follow the clusters, the file must
    not hold zeros there and at its end: a copy into a pre-allocated file that stopped (same size, zeros from there on)
    left every size whole, and FFmpeg stops at the zeros without an error (69 of 87 zero fills of 4 Matroska files
    were indexed as fewer frames). One read more, two where the Cues' first bytes are zeros."""
    handle.seek(0)
    head = handle.read(256)  # (the EBML header: ~40 bytes as FFmpeg and mkvmerge write it)
    if head[:4] != _EBML_ID:
        return
    header = _ebml_size(head, 4)
    if header is None or header[0] is None:
        return
    segment_at = header[1] + header[0]
    segment = _ebml_size(head, segment_at + 4) if head[segment_at : segment_at + 4] == _SEGMENT_ID else None
    if segment is None or segment[0] is None:
        return
    end = segment[1] + segment[0]
    if end > file_size:
        raise _truncated(label, f"its Matroska segment extends to byte {end} but the file has {file_size} bytes")
    cues = _matroska_cues_at(head, segment[1])
    if cues is None or cues + 4 > file_size:
        return
    reads = _reads(handle)
    if reads(cues, 4) == bytes(4) and reads(file_size - 4, 4) == bytes(4):
        why = f"its SeekHead puts its Cues at byte {cues}, where the file holds zeros, as it does at its end"
        raise _truncated(label, f"{why}: the file is zero-filled (a copy cut short)")


def _matroska_cues_at(head: bytes, segment_at: int) -> int | None:
    """Where the SeekHead opening the Segment whose data starts at byte ``segment_at`` of ``head`` (the file's first
    bytes) places the Cues, or None where ``head`` holds no such SeekHead or it lists no Cues."""
    first = next(_ebml_elements(head, segment_at, len(head)), None)
    if first is None or first[0] != _SEEK_HEAD_ID:
        return None
    for kind, start, end in _ebml_elements(head, first[1], first[2]):
        fields = {field: head[at:stop] for field, at, stop in _ebml_elements(head, start, end)}
        if kind == _SEEK_ENTRY_ID and fields.get(_SEEK_ID_ID) == _CUES_ID and _SEEK_POSITION_ID in fields:
            return segment_at + int.from_bytes(fields[_SEEK_POSITION_ID], "big")
    return None


def _ebml_elements(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(ID, data start, data end) of each EBML element in ``data[start:end]``, in order; stops at one that does not
    parse, has an unknown size or ends past ``end``."""
    at = start
    while at < end and data[at]:
        id_length = 9 - data[at].bit_length()  # (an ID's length is marked as a size's is: 1-4 bytes)
        size = _ebml_size(data, at + id_length) if id_length <= 4 else None
        if size is None or size[0] is None or size[1] + size[0] > end:
            return
        yield data[at : at + id_length], size[1], size[1] + size[0]
        at = size[1] + size[0]


def _check_fragments(handle: IO[bytes], file_size: int, *, label: str) -> None:
    """VideoDecodeError where the boxes of a fragmented MP4 (``moof``/``mdat`` pairs after ``moov``, e.g. FFmpeg's
    ``movflags=frag_keyframe+empty_moov``) say the file is cut short or zero-filled (:func:`.mp4_tables.mp4_file_cut`).
    FFmpeg's demuxer drops the samples past the cut without an error, so such a file was indexed as a shorter video:
    4,022 of 5,604 cuts (every top-level box boundary and random bytes of H.264, HEVC and AV1 files in 14 fragmented
    layouts). 356 still are, each exactly between two fragments of a file whose cut took its ``mfra`` box (or that had
    none) and that has no global ``sidx``: unless its ``mehd`` box gives the movie's duration
    (:func:`_check_movie_duration`, after the demux), nothing left in such a file says it had more fragments, so it is
    indexed as the frames it holds, as any demuxer reads it."""
    why = mp4_file_cut(handle, file_size, fragmented=True)
    if why is not None:
        raise _truncated(label, why)


#: Codecs none of whose packets (as MP4 stores them) starts with :data:`_ZERO_HEAD_BYTES` zero bytes (an H.264 or HEVC
#: sample starts with its first NAL unit's length, an AV1 one with an OBU header, whose type 0 is reserved, a VP9 frame
#: with its frame marker, binary 10) or, but for an encoder's padding, ends with :data:`_ZERO_TAIL_BYTES` (an H.264 or
#: HEVC NAL unit's last byte is not 0; 0 of 630 VP9 and 6,096 AV1 packets, generated and real, end with 4 zero bytes,
#: though 350 VP9 ones with 1).
_ZERO_FILL_CODECS = frozenset({"av1", "h264", "hevc", "vp9"})
_ZERO_HEAD_BYTES, _ZERO_TAIL_BYTES = 8, 16
#: Largest packet read whole (one read) for :func:`_check_zero_filled`; a larger one is read at both ends (two).
_WHOLE_PACKET_BYTES = 64 * 1024


def _check_zero_filled(
    read_at: ReadAt, offsets: np.ndarray, sizes: np.ndarray, codec: str, file_size: int, *, label: str
) -> None:
    """VideoDecodeError where the packet stored last in the file starts or ends with zeros no packet of ``codec`` has:
    the file's end is zero-filled (a copy into a pre-allocated file that stopped: the size is whole, the bytes from
    there on zeros). The boxes stay whole where the zeros start in the media data, and FFmpeg reads such packets
    without an error: a plain MP4 was indexed whole, its last frames undecodable; a fragmented one whose zeros start in
    its last fragment, likewise. Such zeros run to the file's end, and a zero fill from within the last packet leaves
    the packet stored before it whole: a packet ending with zeros where the file does not (a plain MP4's ``moov`` after
    them), or after one that ends with zeros too (an encoder's padding: an Annex B stream's ``trailing_zero_8bits``
    that FFmpeg's stream copy keeps in each packet's last NAL unit), is not one. One read (two for a packet over
    :data:`_WHOLE_PACKET_BYTES`), one or two more where it starts or ends with zeros."""
    if codec not in _ZERO_FILL_CODECS or len(offsets) == 0:
        return
    last = int(np.argmax(offsets))
    offset, size = int(offsets[last]), int(sizes[last])
    if size <= _WHOLE_PACKET_BYTES:
        packet = read_at(offset, size)
        head, tail = packet[:_ZERO_HEAD_BYTES], packet[-_ZERO_TAIL_BYTES:]
    else:
        head = read_at(offset, _ZERO_HEAD_BYTES)
        tail = read_at(offset + size - _ZERO_TAIL_BYTES, _ZERO_TAIL_BYTES)
    end = "starts" if not any(head) else "ends" if not any(tail) else None
    if end is None or size == 0 or any(read_at(max(file_size - _ZERO_TAIL_BYTES, 0), _ZERO_TAIL_BYTES)):
        return
    if end == "ends" and len(offsets) > 1:
        before = int(np.argpartition(offsets, -2)[-2])  # (the packet stored before the last)
        before_end, before_size = int(offsets[before] + sizes[before]), int(sizes[before])
        if before_size >= _ZERO_TAIL_BYTES and not any(read_at(before_end - _ZERO_TAIL_BYTES, _ZERO_TAIL_BYTES)):
            return
    raise _truncated(
        label,
        f"its last stored packet (bytes {offset}-{offset + size}) {end} with zeros, as no {codec} packet does: the "
        "file is zero-filled from there (a copy cut short)",
    )


def _reads(handle: IO[bytes]) -> ReadAt:
    """Reads of ``handle`` at an offset: :func:`_local_reads` where it is local, else a seek and a read each."""
    local = _local_reads(handle)
    if local is not None:
        return local

    def read(offset: int, length: int) -> bytes:
        handle.seek(offset)
        return handle.read(length)

    return read


def _truncated(label: str, why: str) -> VideoDecodeError:
    return VideoDecodeError(f"{label}: {why}; the file is truncated. Download or copy it again.")


def _ebml_size(data: bytes, at: int) -> tuple[int | None, int] | None:
    """The EBML variable-length size at byte ``at`` of ``data`` (None where all its bits are set: an unknown size)
    and where the element's data starts; None where ``data`` ends before it or it is not a size."""
    if at >= len(data) or not data[at]:
        return None
    length = 9 - data[at].bit_length()  # (the leading zero bits, plus the marker bit)
    if at + length > len(data):
        return None
    value = int.from_bytes(data[at : at + length], "big") & ((1 << (7 * length)) - 1)
    return (None if value == (1 << (7 * length)) - 1 else value), at + length


def _file_size(handle: IO[bytes]) -> int:
    position = handle.tell()
    size = handle.seek(0, os.SEEK_END)
    handle.seek(position)
    return int(size)


def _index_container(
    container: Any, handle: IO[bytes], tracks: dict[int, Mp4Track] | None, *, demux: bool, label: str, file_size: int
) -> PacketIndex | None:
    """The index from the MP4 ``tracks`` (None when they are unusable), or by demuxing (``demux``, or no tracks).

    In an MP4 every packet must lie in the file's media data, and so must the samples its tables list where the
    demuxer found other than those (:func:`_check_packets_in_media_data`).
    """
    if not container.streams:  # (an MP4 cut before its moov box opens with none: FFmpeg says nothing)
        raise VideoDecodeError(
            f"{label}: the file holds no stream: it is truncated (an MP4's index, the moov box, is missing) or not a "
            "video; restore it from its source or re-encode it."
        )
    if not container.streams.video:
        raise VideoDecodeError(no_video_stream(label, container))
    stream = container.streams.video[0]
    context = stream.codec_context
    track = None if tracks is None else tracks.get(int(stream.id))
    if context is None:
        raise no_decoder_error(label, track)
    samples: dict[int, bytes] = {}
    heads: dict[int, bytes] = {}  # (decode position -> the first bytes of its packet, where the demux had them)
    first_key: bytes | None = None
    rows: list[Row] | None
    if demux or tracks is None:
        rows, first_key = _rows_from_demux(container, stream, samples, heads, label=label)
        _check_listed_samples(track, len(rows), label=label, file_size=file_size)
        _check_movie_duration(container, tracks, rows, label=label)
    else:
        rows = _rows_from_sample_tables(container, stream, tracks, samples, label=label, file_size=file_size)
        if rows is None:
            return None
        if rows and rows[0][4] and 0 in samples:
            first_key = samples[0]
    if not rows:
        raise VideoDecodeError(
            f"{label}: the video stream holds no packets; the file is truncated, empty or its header damaged: "
            f"{DAMAGED_VIDEO_ADVICE}"
        )
    table = np.asarray(rows, dtype=np.int64)
    positioned = bool((table[:, 2] >= 0).all())  # (every packet's byte offset known)
    if positioned and track is not None:
        _check_samples_played_once(table, track, label=label)
    if positioned:
        media = None if track is None else track.media_data
        _check_packet_bytes(table[:, 2], table[:, 3], media, file_size, label=label)
    byte_exact = _offsets_are_exact(handle, table, samples)
    codec = context.codec.canonical_name
    if byte_exact:
        _check_zero_filled(_reads(handle), table[:, 2], table[:, 3], codec, file_size, label=label)
    if first_key is None:
        first_key = _first_keyframe_bytes(handle, table) if byte_exact else None
    template = _make_template(stream, first_key if first_key is not None else samples[0])
    keyframe = table[:, 4].astype(bool)
    layout = nal_layout(codec, context.extradata)
    if layout is not None:
        keyframe = _random_access_keyframes(
            keyframe, table, layout, {**heads, **samples}, handle if byte_exact else None, label=label,
            local=_local_reads(handle) if byte_exact else None,
        )  # fmt: skip
    sizes_checked = False
    if codec in KEYFRAME_SIZE_CODECS and (layout is not None or codec not in ("h264", "hevc")):  # (not Annex B)
        read_at = _local_reads(handle) if byte_exact else None
        sizes_checked = read_at is not None  # (else only the keyframes the demux or the first packets gave)
        check_keyframe_sizes(
            context, np.flatnonzero(keyframe).tolist(), PacketBytes(table, {**heads, **samples}, read_at),
            pts=table[:, 0], time_base=Fraction(stream.time_base), length_size=layout.length_size if layout else 4,
            label=label,
        )  # fmt: skip
    return PacketIndex(
        source_name=label,
        codec=context.codec.canonical_name,
        width=int(context.width),
        height=int(context.height),
        pix_fmt=context.pix_fmt,
        time_base=Fraction(stream.time_base),
        pts=np.ascontiguousarray(table[:, 0]),
        dts=np.ascontiguousarray(table[:, 1]),
        byte_offset=np.ascontiguousarray(table[:, 2]),
        size_bytes=np.ascontiguousarray(table[:, 3]),
        keyframe=keyframe,
        file_size_bytes=file_size,
        byte_exact=byte_exact,
        template=template,
        stream_index=int(stream.index),
        keyframe_sizes_checked=sizes_checked,
        hidden=table[:, 5].astype(bool),
    )


def _check_movie_duration(container: Any, tracks: dict[int, Mp4Track] | None, rows: list[Row], *, label: str) -> None:
    """VideoDecodeError where a fragmented movie's ``mehd`` box gives it a longer duration than its tracks hold after
    a demux, by more than half a frame of the video: the file was cut between two fragments, which its boxes alone
    cannot tell (:func:`_check_fragments`). What the tracks hold is the longer of FFmpeg's longest stream duration
    (every sample's duration summed, the last one's included) and the video's last frame's end counted from time 0
    (a writer without an edit list may count the B-frame delay in). A frame's length is the median distance between
    frames, or where one frame is left (a file of one-frame fragments cut after its first: 16 of 16 such cuts were
    indexed as one frame), its own duration. Not judged where a track is no stream FFmpeg reads (its duration
    unknown)."""
    stated = None if not tracks else next(iter(tracks.values())).movie_duration_s
    if stated is None or not rows or not set(tracks or ()) <= {int(s.id) for s in container.streams}:
        return
    pts = np.sort([row[0] for row in rows])
    video = container.streams.video[0]
    time_base = Fraction(video.time_base)
    interval = _frame_interval(pts, time_base, Fraction(video.duration or 0) * time_base)
    if not interval:
        return
    durations = [Fraction(s.duration) * s.time_base for s in container.streams if s.duration]
    held = max([*durations, int(pts[-1]) * time_base + interval])
    if stated - held > interval / 2:
        why = f"its tracks hold {float(held):.3f} s but its mehd box gives the movie {float(stated):.3f} s"
        raise _truncated(label, f"{why} (a cut between two of its fragments)")


def _frame_interval(pts: np.ndarray, time_base: Fraction, one_frame: Fraction) -> Fraction:
    """A frame's length, in seconds, among the ascending ``pts``: the median distance between frames, or where there is
    one frame, ``one_frame``."""
    return int(np.median(np.diff(pts))) * time_base if len(pts) > 1 else one_frame


def no_decoder_error(label: str, track: Mp4Track | None) -> CodecUnsupportedError:
    """FFmpeg found no decoder for the stream: a codec it lacks, or a header too damaged to name one."""
    entry = None if track is None else track.sample_entry
    damaged = "the file is damaged (cut short, or its header overwritten): download or copy it again"
    unknown = (
        "neither NVDEC (through DALI), DALI's CPU decoder nor PyAV decodes its codec: re-encode it (H.264, HEVC, "
        "AV1 or VP9)"
    )
    if entry is not None and not all(0x20 <= byte < 0x7F for byte in entry):  # a fourcc is printable ASCII
        why = f"its sample description names codec {entry!r}, which is no codec name: {damaged}"
    elif entry is not None:
        why = f"its sample description names codec {entry.decode()!r}: {unknown}, or {damaged}"
    else:
        why = f"either {damaged}, or {unknown}"
    return CodecUnsupportedError(f"{label}: FFmpeg finds no decoder for the video stream; {why}.")


def _rows_from_demux(
    container: Any, stream: Any, samples: dict[int, bytes], heads: dict[int, bytes], *, label: str
) -> tuple[list[Row], bytes | None]:
    """Every packet of ``stream`` by demuxing the whole file; fills ``samples`` with the first payloads and
    ``heads`` with the first bytes of each keyframe."""
    rows: list[Row] = []
    first_key: bytes | None = None
    for packet in container.demux(stream):
        if packet.size == 0:
            continue
        pts = packet.pts if packet.pts is not None else packet.dts
        if pts is None:
            raise VideoDecodeError(f"{label}: packet {len(rows)} has no timestamp; remux the video into MP4.")
        dts = packet.dts if packet.dts is not None else pts
        position = packet.pos if packet.pos is not None else -1
        if first_key is None and packet.is_keyframe:
            first_key = bytes(packet)
        if packet.is_keyframe:
            heads[len(rows)] = bytes(memoryview(packet)[:_DEMUXED_HEAD_BYTES])
        if len(rows) < _BYTE_CHECK_PACKETS:
            samples[len(rows)] = bytes(packet)
        rows.append((pts, dts, position, packet.size, packet.is_keyframe, packet.is_discard))
    return rows, first_key


@functools.cache
def _note_no_demuxer_index() -> None:
    warn_once(
        logger,
        "PyAV %s does not expose FFmpeg's MP4 index (PyAV >= 16 does), and a video's sample tables hold what "
        "lerobot-dali does not read itself (sample groups, several edits): such videos are indexed by demuxing them "
        "whole, which reads a remote video file in full once (the index is then kept on disk) instead of its header.",
        av.__version__,
    )


def _rows_from_sample_tables(
    container: Any, stream: Any, tracks: dict[int, Mp4Track], samples: dict[int, bytes], *, label: str, file_size: int
) -> list[Row] | None:
    """Every packet from the MP4 index plus ``ctts``, or None (logged) where that cannot be trusted.

    The index is FFmpeg's where PyAV exposes it (>= 16; built from ``moov`` at open: each sample's dts with the
    edit list applied, byte offset, size and keyframe flag), else the sample tables' own
    (:class:`~lerobot_dali.mp4_tables.SampleTable`, the edit list not applied). pts adds the sample's composition
    offset; the constant shift FFmpeg applies (the edit's start) comes from the first demuxed packets, which must
    equal the first rows. The tables' own rows must also end as the demuxer's packets do (an edit that ends early
    drops samples there), unless they reach past ``file_size`` (a truncated file, which the caller names). Fills
    ``samples`` with the first packets' payloads.
    """
    track = tracks.get(int(stream.id))
    if track is None or track.fragmented:
        logger.debug("%s: no plain MP4 track %s (fragmented or missing); demuxing.", label, stream.id)
        return None
    offsets = track.composition_offsets()
    if offsets is None:
        logger.debug("%s: ctts covers a different number of samples than stsz; demuxing.", label)
        return None
    entries = _demuxer_index(stream)
    if entries is not None:
        rows = _rows_from_demuxer_index(entries, offsets, track, label=label)
        if rows is None:
            return None
    elif track.samples is None:
        _note_no_demuxer_index()
        return None
    else:
        table = track.samples
        rows = [
            row
            for row in zip(
                (table.dts + offsets).tolist(), table.dts.tolist(), table.offset.tolist(), table.size.tolist(),
                table.keyframe.tolist(), itertools.repeat(False, len(table.dts)), strict=True,
            )
            if row[3] > 0
        ]  # fmt: skip
    own_dts = entries is None  # (FFmpeg's dts are shifted already)
    shift: int | None = None
    check = min(_TIMESTAMP_CHECK_PACKETS, len(rows))
    checked = 0
    with contextlib.closing(container.demux(stream)) as packets:  # (a PyAV generator dropped unfinished leaks)
        demuxed = (packet for packet in packets if packet.size > 0)
        for row, packet in zip(rows[:check], demuxed, strict=False):
            if shift is None and packet.pts is not None:
                shift = packet.pts - row[0]
            dts_shift = (shift or 0) if own_dts else 0
            expected = (row[0] + (shift or 0), row[1] + dts_shift, *row[2:])
            if _packet_row(packet) != expected:
                logger.debug("%s: packet %d disagrees with the MP4 sample tables; demuxing.", label, checked)
                return None
            if checked < _BYTE_CHECK_PACKETS:
                samples[checked] = bytes(packet)
            checked += 1
    if checked != check:
        logger.debug("%s: fewer packets than MP4 samples; demuxing.", label)
        return None
    if shift:
        rows = [(pts + shift, dts + shift if own_dts else dts, *rest) for pts, dts, *rest in rows]  # type: ignore[misc]
    within_file = max((row[2] + row[3] for row in rows), default=0) <= file_size
    if own_dts and rows and within_file and not _tail_agrees(container, stream, rows):
        logger.debug("%s: the last packets disagree with the MP4 sample tables; demuxing.", label)
        return None
    return rows


def _demuxer_index(stream: Any) -> Any:
    """FFmpeg's index of ``stream`` (PyAV >= 16), or None."""
    return getattr(stream, "index_entries", None)


def _rows_from_demuxer_index(entries: Any, offsets: np.ndarray, track: Mp4Track, *, label: str) -> list[Row] | None:
    if len(entries) != track.sample_count:
        logger.debug("%s: index has %d entries, stsz %d samples; demuxing.", label, len(entries), track.sample_count)
        return None
    rows: list[Row] = []
    for entry, offset in zip(entries, offsets.tolist(), strict=True):
        if entry.is_discard:
            logger.debug("%s: the edit list discards samples; demuxing.", label)
            return None
        if entry.size > 0:
            rows.append((entry.timestamp + offset, entry.timestamp, entry.pos, entry.size, entry.is_keyframe, False))
    return rows


def _packet_row(packet: Any) -> tuple[Any, ...]:
    """A demuxed packet as the row the sample tables give it (its timestamps None where it has none)."""
    return (packet.pts, packet.dts, packet.pos, packet.size, packet.is_keyframe, packet.is_discard)


def _tail_agrees(container: Any, stream: Any, rows: list[Row]) -> bool:
    """Whether the packets the demuxer has from the last row's decode time on are the last rows (one seek to any
    frame, then a read of the last packet or so)."""
    try:
        container.seek(rows[-1][1], stream=stream, backward=True, any_frame=True)
        tail = [_packet_row(p) for p in container.demux(stream) if p.size > 0]
    except av.error.FFmpegError as e:  # (a file cut short among them: the demux that follows names it)
        if is_transient(e):
            raise
        return False
    start = len(rows) - len(tail)
    return bool(tail) and start >= 0 and tail == [tuple(row) for row in rows[start:]]


def _check_samples_played_once(table: np.ndarray, track: Mp4Track, *, label: str) -> None:
    """Raise VideoDecodeError where the track's edit list of several pieces has FFmpeg demux what one frame number
    per packet cannot hold: a sample played twice (several edits over the same media, or a later one starting in an
    earlier one's GOP), demuxed once per piece at two times; or a piece's next frame, kept hidden, at the time the next
    piece's first frame shows. Without this, the shared bytes were called damaged tables, the shared time two packets
    sharing a pts."""
    pieces = [edit for edit in track.edits or () if edit.media_time >= 0]
    if len(pieces) < 2 or (len(np.unique(table[:, 2])) == len(table) and len(np.unique(table[:, 0])) == len(table)):
        return
    raise VideoDecodeError(
        f"{label}: its edit list plays the media in {len(pieces)} pieces, which FFmpeg demuxes as no one numbering of "
        "the frames can hold (some packets once for each piece, or two at one time): lerobot-dali reads edit lists of "
        "one piece (after a gap, if any) only. Write the video again with the frames it shows, e.g. re-encode it with "
        "FFmpeg (ffmpeg -i in.mp4 -c:v libx264 out.mp4)."
    )


def _check_listed_samples(track: Mp4Track | None, found: int, *, label: str, file_size: int) -> None:
    """Where the demuxer found other than the ``track``'s listed samples, those must lie in the file and its media
    data (:func:`_check_packet_bytes`): FFmpeg drops the samples from a damaged size on, and may shift every timestamp
    by a frame, and its demux stops at a truncated file's end (an MP4 whose moov comes first, cut among its first
    packets, was indexed as a shorter video), which a demux of what is left cannot tell."""
    if track is None or track.samples is None:
        return
    listed = track.samples.size > 0
    if int(listed.sum()) != found:
        offsets, sizes = track.samples.offset[listed], track.samples.size[listed]
        _check_packet_bytes(offsets, sizes, track.media_data, file_size, label=label)


def _check_packet_bytes(
    offsets: np.ndarray,
    sizes: np.ndarray,
    media_data: tuple[tuple[int, int], ...] | None,
    file_size: int,
    *,
    label: str,
) -> None:
    """VideoDecodeError unless every packet lies in the file and in its media data (where known); the media data first
    where the file holds it whole: a packet past the file's end is then damaged tables, not a truncated file."""
    whole = media_data is not None and max((stop for _, stop in media_data), default=0) <= file_size
    if media_data is not None and whole:
        _check_packets_in_media_data(offsets, sizes, media_data, label=label)
    end = int((offsets + sizes).max()) if len(offsets) else 0
    if end > file_size:
        raise _truncated(label, f"packets extend to byte {end} but the file has {file_size} bytes")
    if media_data is not None and not whole:
        _check_packets_in_media_data(offsets, sizes, media_data, label=label)


def _check_packets_in_media_data(
    offsets: np.ndarray, sizes: np.ndarray, media_data: tuple[tuple[int, int], ...], *, label: str
) -> None:
    """Raise VideoDecodeError unless every packet's bytes lie in one ``mdat`` box and no two packets share bytes.

    Damaged sample tables (``stsz``, ``stco``) pass every other check: a changed sample size shifts every later
    sample of its chunk, so their packets start mid-frame or in ``moov``, and FFmpeg decodes what it is given,
    concealing, without an error; or FFmpeg drops the samples from there on and shifts every timestamp by a
    frame, which the rows' timestamps cannot tell. Either way the frames decoded are wrong.
    """
    ends = offsets + sizes
    bounds = np.array(media_data or [(0, 0)], dtype=np.int64).reshape(-1, 2)  # (file order: ascending)
    box = np.searchsorted(bounds[:, 0], offsets, side="right") - 1
    inside = (box >= 0) & (ends <= bounds[box, 1])
    damaged = "its sample tables (stsz/stco) are damaged: download or copy the file again"
    if not inside.all():
        at = int(np.flatnonzero(~inside)[0])
        boxes = ", ".join(f"{start}-{stop}" for start, stop in media_data) or "none"
        raise VideoDecodeError(
            f"{label}: packet {at} (bytes {int(offsets[at])}-{int(ends[at])}) lies outside the file's media data "
            f"(mdat bytes {boxes}); {damaged}."
        )
    order = np.argsort(offsets, kind="stable")
    overlap = np.flatnonzero(offsets[order][1:] < ends[order][:-1])
    if overlap.size:
        first, second = (int(order[overlap[0] + step]) for step in (0, 1))
        raise VideoDecodeError(
            f"{label}: packets {first} (bytes {int(offsets[first])}-{int(ends[first])}) and {second} (bytes "
            f"{int(offsets[second])}-{int(ends[second])}) share bytes; {damaged}."
        )


def _random_access_keyframes(
    keyframe: np.ndarray,
    table: np.ndarray,
    layout: NalLayout,
    heads: dict[int, bytes],
    handle: IO[bytes] | None,
    *,
    label: str,
    local: ReadAt | None = None,
) -> np.ndarray:
    """``keyframe`` without the flagged packets that are no random-access point (:mod:`.random_access`).

    Each verdict reads the packet's first bytes: from ``heads`` (decode position -> its first bytes, where already
    read), else from ``handle`` at the packet's byte offset (None where offsets are not exact: the flag then
    stands). A file either uses intra refresh or not, so the packets in ``heads`` and the second keyframe (the first
    is the stream's IDR either way) are judged first, one small read for most files (a request each on a remote
    one); only if one of those is no random-access point is every keyframe judged, a read each. ``local``: reads of
    a local ``handle`` (:func:`_local_reads`), where a read costs microseconds: every keyframe is judged, through
    it: x264's intra refresh still starts an IDR at a scene cut, and one that is the second keyframe hid the
    P-frames flagged after it.
    """
    verdicts: dict[int, bool] = {}

    def random_access(row: int) -> bool:
        if row not in verdicts:
            head = heads.get(row, b"")
            offset = int(table[row, 2])

            def read(start: int, length: int) -> bytes:
                if start + length <= len(head) or handle is None:
                    return head[start : start + length]
                if local is not None:
                    return local(offset + start, length)
                handle.seek(offset + start)
                return handle.read(length)

            verdicts[row] = is_random_access(layout, read, int(table[row, 3])) is not False  # (None: not judged)
        return verdicts[row]

    keys = np.flatnonzero(keyframe).tolist()
    first = keys if local is not None else [row for row in keys if row in heads] + keys[1:2]
    if all(random_access(row) for row in first):
        return keyframe
    kept = keyframe.copy()
    for row in keys:
        kept[row] = random_access(row)
    logger.debug(
        "%s: %d of %d flagged keyframes are no random-access point (intra refresh, or I-frames without a recovery "
        "point); decoding starts at the others.",
        label,
        len(keys) - int(kept.sum()),
        len(keys),
    )
    return kept


def _local_reads(handle: IO[bytes]) -> ReadAt | None:
    """Reads of ``handle`` at an offset where it is a local file (or memory), or None: a small read of every
    keyframe (:mod:`.keyframe_sizes`) costs a few microseconds each on a local file (``pread``: no buffer filled), and
    a request (or a read-ahead block) each on a remote one."""
    if isinstance(handle, io.BytesIO):
        view = handle.getbuffer()
        return lambda offset, length: bytes(view[offset : offset + length])
    if not isinstance(handle, (io.BufferedReader, io.FileIO, LocalFileOpener)):
        return None
    descriptor = handle.fileno()
    return lambda offset, length: os.pread(descriptor, length, offset)


def _first_keyframe_bytes(handle: IO[bytes], table: np.ndarray) -> bytes | None:
    keys = np.flatnonzero(table[:, 4])
    if len(keys) == 0:
        return None
    handle.seek(int(table[keys[0], 2]))
    return handle.read(int(table[keys[0], 3]))


def _offsets_are_exact(handle: IO[bytes], table: np.ndarray, samples: dict[int, bytes]) -> bool:
    """Whether the file's bytes at each packet's offset are that packet (true for MP4, not Matroska)."""
    if (table[:, 2] < 0).any():
        return False
    for row, payload in samples.items():
        handle.seek(int(table[row, 2]))
        if handle.read(int(table[row, 3])) != payload:
            return False
    return True


def _make_template(stream: Any, payload: bytes) -> bytes:
    """A one-packet MP4 carrying the stream's codec parameters (extradata, size, time base)."""
    output = io.BytesIO()
    with av.open(output, mode="w", format="mp4") as muxer:
        template_stream = muxer.add_stream_from_template(stream, opaque=True)
        copy = av.Packet(payload)
        copy.pts, copy.dts, copy.time_base = 0, 0, stream.time_base
        copy.is_keyframe = True
        copy.stream = template_stream
        muxer.mux(copy)
    return output.getvalue()
