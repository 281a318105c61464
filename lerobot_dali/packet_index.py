"""Per-file packet index: where every frame of a video lies, read once by demuxing (never decoding).

Everything on the video route (timestamp lookup, clip cutting, CPU seeking) needs the same facts about a
file: each packet's presentation and decode timestamps, byte range and keyframe flag. Demuxing a file costs
one pass over its headers; keeping the result per worker (bounded, keyed by path, size and mtime) makes
every later request pure arithmetic plus one ranged read.

Frames are numbered in display order: frame ``k`` is the packet with the ``k``-th smallest pts, the same
numbering DALI's video decoder and any sequential decode use (one shown frame per packet, as in MP4).
"""

from __future__ import annotations

import io
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import IO, TYPE_CHECKING, Any, TypeAlias

import av
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from numpy.typing import ArrayLike

from .errors import CodecUnsupportedError, DatasetError, MissingDataFileError, VideoDecodeError
from .remote_retry import is_transient

if TYPE_CHECKING:
    from .file_stamps import FileStamp
    from .packet_index_store import PacketIndexStore

__all__ = [
    "PacketIndex",
    "PacketIndexCache",
    "VideoSource",
    "build_packet_index",
    "load_packet_index",
    "open_video_source",
    "source_cache_key",
    "source_label",
    "source_url",
    "template_container",
]

logger = logging.getLogger(__name__)

VideoSource: TypeAlias = str | os.PathLike[str] | IO[bytes]
"""A video file: a local path, a path on ``filesystem`` (fsspec), or an open binary file object."""

#: Open stream templates kept per process (:func:`template_container`): a few KB each plus FFmpeg's state.
TEMPLATE_CACHE_SIZE = 64
_templates: OrderedDict[tuple[int, bytes], Any] = OrderedDict()
_templates_lock = threading.Lock()

# Packets whose stored bytes are compared with the file at their byte offset, to prove offsets are exact.
_BYTE_CHECK_PACKETS = 3
# Packets demuxed to check the timestamps read from MP4 sample tables (a whole GOP start of most files).
_TIMESTAMP_CHECK_PACKETS = 6


@dataclass(frozen=True, eq=False)
class PacketIndex:
    """Packets of a file's first video stream, in decode order, plus the display-order view.

    Timestamps are integers in ``time_base``; ``byte_offset``/``size_bytes`` address each packet's payload
    in the file when ``byte_exact`` is true (checked at build time; MP4 samples are stored verbatim).
    ``template`` is a tiny MP4 holding the stream's codec parameters and its first keyframe, used as the
    stream template when remuxing clips so no clip ever re-opens the source file.
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
    #: Display index -> decode position (argsort of ``pts``).
    display_order: np.ndarray = field(init=False, repr=False)
    #: Decode position -> display index (inverse of ``display_order``).
    display_rank: np.ndarray = field(init=False, repr=False)
    #: Presentation timestamp (``time_base`` units) of each displayed frame, ascending.
    frame_pts: np.ndarray = field(init=False, repr=False)
    #: Presentation time in seconds of each displayed frame, ascending (index = display index).
    frame_pts_s: np.ndarray = field(init=False, repr=False)
    #: Typical distance between consecutive displayed frames, in ``time_base`` units (at least 1).
    frame_duration: int = field(init=False)
    #: Decode positions where decoding can start: the flagged keyframes, and 0 when the stream does not
    #: start on one (decoding can then only start at its beginning). Ascending.
    keyframe_positions: np.ndarray = field(init=False, repr=False)
    #: Whether any packet displays before the keyframe its GOP starts at (open GOPs: HEVC CRA, H.264
    #: recovery points). Without such "leading" pictures a clip is simply keyframe-to-frame runs.
    has_leading_pictures: bool = field(init=False)

    def __post_init__(self) -> None:
        count = len(self.pts)
        if count == 0:
            raise VideoDecodeError(f"{self.source_name}: the video stream holds no packets.")
        for name in ("dts", "byte_offset", "size_bytes", "keyframe"):
            if len(getattr(self, name)) != count:
                raise ValueError(f"PacketIndex.{name} has {len(getattr(self, name))} entries, pts has {count}.")
        if self.time_base <= 0:
            raise ValueError(f"PacketIndex.time_base must be positive, got {self.time_base}.")
        order = np.argsort(self.pts, kind="stable")
        sorted_pts = self.pts[order]
        if count > 1 and np.any(np.diff(sorted_pts) == 0):
            duplicate = int(sorted_pts[np.flatnonzero(np.diff(sorted_pts) == 0)[0]])
            raise VideoDecodeError(
                f"{self.source_name}: two packets share pts {duplicate}; frames cannot be told apart by "
                "presentation time. Re-encode or remux the video."
            )
        rank = np.empty(count, dtype=np.int64)
        rank[order] = np.arange(count)
        duration = int(np.median(np.diff(sorted_pts))) if count > 1 else 1
        seconds = sorted_pts * self.time_base.numerator / self.time_base.denominator
        keys = np.flatnonzero(self.keyframe)
        if keys.size == 0 or keys[0] != 0:
            keys = np.concatenate(([0], keys))
        gop_start = keys[np.searchsorted(keys, np.arange(count), side="right") - 1]
        leading = bool(np.any(self.pts < self.pts[gop_start]))
        derived = (order, rank, seconds, keys)
        for array in (self.pts, self.dts, self.byte_offset, self.size_bytes, self.keyframe, *derived):
            array.setflags(write=False)
        sorted_pts.setflags(write=False)
        object.__setattr__(self, "display_order", order)
        object.__setattr__(self, "display_rank", rank)
        object.__setattr__(self, "frame_pts", sorted_pts)
        object.__setattr__(self, "frame_pts_s", seconds)
        object.__setattr__(self, "frame_duration", max(duration, 1))
        object.__setattr__(self, "keyframe_positions", keys)
        object.__setattr__(self, "has_leading_pictures", leading)

    @property
    def frame_count(self) -> int:
        return len(self.pts)

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
    def frame_interval_s(self) -> float:
        """Typical distance between consecutive displayed frames, in seconds (``frame_duration``)."""
        return self.frame_duration * float(self.time_base)

    @property
    def nbytes(self) -> int:
        """Memory held by this index (what a cache of indices costs per file)."""
        arrays = (self.pts, self.dts, self.byte_offset, self.size_bytes, self.keyframe, self.display_order)
        return sum(a.nbytes for a in arrays) + 3 * self.display_order.nbytes + len(self.template)


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


def source_label(source: VideoSource) -> str:
    """A name for ``source`` in messages: the path, or the path a file object was opened from."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    for attribute in ("path", "name"):
        value = getattr(source, attribute, None)
        if isinstance(value, str):
            return value
    return repr(source)


@contextmanager
def open_video_source(source: VideoSource, *, filesystem: Any | None = None) -> Iterator[IO[bytes]]:
    """Yield a binary file object for ``source``; paths are opened (and closed) here, file objects lent.

    Raises MissingDataFileError naming the path when it does not exist.
    """
    if not isinstance(source, (str, os.PathLike)):
        yield source
        return
    path = os.fspath(source)
    try:
        handle = filesystem.open(path, "rb") if filesystem is not None else open(path, "rb")  # noqa: SIM115
    except FileNotFoundError as e:
        raise MissingDataFileError(
            f"Video file {path} does not exist; check the dataset's videos/ folder and its video_path."
        ) from e
    with handle:
        yield handle


def source_cache_key(source: VideoSource, *, filesystem: Any | None = None) -> Hashable | None:
    """A key that changes when the file does (path, size, mtime), or None when ``source`` has no identity.

    Called per request in the workers, so local files cost one ``stat`` (the absolute path, not the real path:
    resolving links costs a ``lstat`` per path component, and a linked file only gets a second entry).

    Raises MissingDataFileError for a path that does not exist.
    """
    try:
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if isinstance(filesystem, LocalFileSystem):  # what DatasetLocation.is_local checks
                path, filesystem = filesystem._strip_protocol(path), None  # os.stat: ~3x cheaper than fs.info
            if filesystem is None:
                stat = os.stat(path)
                return ("local", os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
            return _fsspec_key(filesystem, path)
        fs, fs_path = getattr(source, "fs", None), getattr(source, "path", None)
        if fs is not None and isinstance(fs_path, str):
            return _fsspec_key(fs, fs_path)
        name = getattr(source, "name", None)
        if isinstance(name, str) and hasattr(source, "fileno"):
            stat = os.fstat(source.fileno())
            return ("local", os.path.abspath(name), stat.st_size, stat.st_mtime_ns)
    except FileNotFoundError as e:
        raise MissingDataFileError(f"Video file {source_label(source)} does not exist.") from e
    except (OSError, io.UnsupportedOperation):
        return None
    return None


def source_url(source: str | os.PathLike[str], *, filesystem: Any | None = None) -> str:
    """The URL of a path on ``filesystem`` (``file://`` plus the absolute path without one): a cache key."""
    if filesystem is None:
        return f"file://{os.path.abspath(os.fspath(source))}"
    return str(filesystem.unstrip_protocol(os.fspath(source)))


def _fsspec_key(fs: Any, path: str) -> Hashable:
    info = fs.info(path)
    stamp = next((info[k] for k in ("mtime", "LastModified", "last_modified", "ETag", "etag") if k in info), None)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return (protocol, path, info.get("size"), str(stamp))


def build_packet_index(source: VideoSource, *, filesystem: Any | None = None) -> PacketIndex:
    """Index the first video stream of ``source`` (no decoding) into a :class:`PacketIndex`.

    MP4/MOV files are indexed from their ``moov`` sample tables (FFmpeg's own index plus the ``ctts``
    composition offsets), reading the header and the first few packets only; other containers, and any MP4
    whose tables disagree with the demuxer, are demuxed packet by packet (the reason is logged at DEBUG).

    Raises MissingDataFileError (no such file), VideoDecodeError (unreadable, truncated, no video stream,
    no packets) and CodecUnsupportedError (a codec this FFmpeg build does not know), each naming the file.
    """
    label = source_label(source)
    with open_video_source(source, filesystem=filesystem) as handle:
        file_size = _file_size(handle)
        start = handle.tell() if hasattr(handle, "tell") else 0
        try:
            tracks = read_mp4_tracks(handle, file_size) if start == 0 else None
            if tracks is None:
                logger.debug("%s: not an MP4 with a moov box (or not read from byte 0); demuxing.", label)
            handle.seek(start)
            with av.open(handle, mode="r") as container:
                index = _index_container(container, handle, tracks, label=label, file_size=file_size)
            if index is None:  # the sample tables were not usable: demux a fresh container
                handle.seek(start)
                with av.open(handle, mode="r") as container:
                    index = _index_container(container, handle, None, label=label, file_size=file_size)
                assert index is not None  # without sample tables every failure raises
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:  # (PyAV: I/O as OSError, bad metadata)
            if is_transient(e):  # the network failed (after its retries): the file is not to blame
                raise
            raise VideoDecodeError(
                f"{label}: cannot read the video container ({e}); the file is truncated or corrupt."
            ) from e
        finally:
            if hasattr(handle, "seek"):
                handle.seek(start)
    logger.debug(
        "Indexed %d packets of %s (%s %dx%d)", index.frame_count, label, index.codec, index.width, index.height
    )
    return index


def _file_size(handle: IO[bytes]) -> int:
    position = handle.tell()
    size = handle.seek(0, os.SEEK_END)
    handle.seek(position)
    return int(size)


def _index_container(
    container: Any, handle: IO[bytes], tracks: dict[int, Mp4Track] | None, *, label: str, file_size: int
) -> PacketIndex | None:
    """The index from the MP4 ``tracks`` (None when they are unusable) or, without tracks, by demuxing."""
    if not container.streams.video:
        raise VideoDecodeError(f"{label}: the file has no video stream.")
    stream = container.streams.video[0]
    context = stream.codec_context
    if context is None:
        raise CodecUnsupportedError(
            f"{label}: the video codec is unknown to this FFmpeg build, so neither NVDEC (through DALI), "
            "DALI's CPU decoder nor PyAV can decode it. Re-encode the video (H.264, HEVC, AV1 or VP9)."
        )
    samples: dict[int, bytes] = {}
    first_key: bytes | None = None
    rows: list[tuple[int, int, int, int, bool]] | None
    if tracks is None:
        rows, first_key = _rows_from_demux(container, stream, samples, label=label)
    else:
        rows = _rows_from_sample_tables(container, stream, tracks, samples, label=label)
        if rows is None:
            return None
        if rows and rows[0][4] and 0 in samples:
            first_key = samples[0]
    if not rows:
        raise VideoDecodeError(f"{label}: the video stream holds no packets; the file is truncated or empty.")
    table = np.asarray(rows, dtype=np.int64)
    ends = table[:, 2] + table[:, 3]
    if (table[:, 2] >= 0).all() and ends.max() > file_size:
        raise VideoDecodeError(
            f"{label}: packets extend to byte {int(ends.max())} but the file has {file_size} bytes; "
            "the file is truncated. Download or copy it again."
        )
    byte_exact = _offsets_are_exact(handle, table, samples)
    if first_key is None:
        first_key = _first_keyframe_bytes(handle, table) if byte_exact else None
    template = _make_template(stream, first_key if first_key is not None else samples[0])
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
        keyframe=table[:, 4].astype(bool),
        file_size_bytes=file_size,
        byte_exact=byte_exact,
        template=template,
    )


def _rows_from_demux(
    container: Any, stream: Any, samples: dict[int, bytes], *, label: str
) -> tuple[list[tuple[int, int, int, int, bool]], bytes | None]:
    """Every packet of ``stream`` by demuxing the whole file; fills ``samples`` with the first payloads."""
    rows: list[tuple[int, int, int, int, bool]] = []
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
        if len(rows) < _BYTE_CHECK_PACKETS:
            samples[len(rows)] = bytes(packet)
        rows.append((pts, dts, position, packet.size, packet.is_keyframe))
    return rows, first_key


def _rows_from_sample_tables(
    container: Any, stream: Any, tracks: dict[int, Mp4Track], samples: dict[int, bytes], *, label: str
) -> list[tuple[int, int, int, int, bool]] | None:
    """Every packet from FFmpeg's MP4 index plus ``ctts``, or None (logged) where that cannot be trusted.

    The demuxer's index (built from ``moov`` at open) holds each sample's dts (edit list applied), byte
    offset, size and keyframe flag; pts adds the sample's composition offset and the demuxer's constant dts
    shift, which the first demuxed packets give and check. Fills ``samples`` with those packets' payloads.
    """
    track = tracks.get(int(stream.id))
    if track is None or track.fragmented:
        logger.debug("%s: no plain MP4 track %s (fragmented or missing); demuxing.", label, stream.id)
        return None
    entries = stream.index_entries
    if len(entries) != track.sample_count:
        logger.debug("%s: index has %d entries, stsz %d samples; demuxing.", label, len(entries), track.sample_count)
        return None
    offsets = track.composition_offsets()
    if offsets is None:
        logger.debug("%s: ctts covers a different number of samples than stsz; demuxing.", label)
        return None
    rows: list[tuple[int, int, int, int, bool]] = []
    for entry, offset in zip(entries, offsets.tolist(), strict=True):
        if entry.is_discard:
            logger.debug("%s: the edit list discards samples; demuxing.", label)
            return None
        if entry.size > 0:
            rows.append((entry.timestamp + offset, entry.timestamp, entry.pos, entry.size, entry.is_keyframe))
    shift: int | None = None
    check = min(_TIMESTAMP_CHECK_PACKETS, len(rows))
    demuxed = (packet for packet in container.demux(stream) if packet.size > 0)
    checked = 0
    for row, packet in zip(rows[:check], demuxed, strict=False):
        if shift is None and packet.pts is not None:
            shift = packet.pts - row[0]
        if (packet.pts, packet.dts, packet.pos, packet.size, packet.is_keyframe) != (row[0] + (shift or 0), *row[1:]):
            logger.debug("%s: packet %d disagrees with the MP4 sample tables; demuxing.", label, checked)
            return None
        if checked < _BYTE_CHECK_PACKETS:
            samples[checked] = bytes(packet)
        checked += 1
    if checked != check:
        logger.debug("%s: fewer packets than MP4 samples; demuxing.", label)
        return None
    if shift:
        rows = [(pts + shift, *rest) for pts, *rest in rows]  # type: ignore[misc]
    return rows


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


# --- MP4 sample tables (ISO/IEC 14496-12) ----------------------------------------------------------------

# Largest moov box read into memory; real moov boxes are about 20 bytes per sample.
_MAX_MOOV_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Mp4Track:
    """What the packet index needs from one ``trak`` that FFmpeg's demuxer index does not expose."""

    track_id: int
    sample_count: int
    #: ``ctts`` run lengths and composition offsets (signed, as FFmpeg reads both box versions).
    ctts_counts: np.ndarray
    ctts_offsets: np.ndarray
    #: Whether the movie has fragments (``mvex``): samples then live outside ``moov``.
    fragmented: bool

    def composition_offsets(self) -> np.ndarray | None:
        """Each sample's composition offset (zeros without ``ctts``), or None when ``ctts`` does not fit."""
        if len(self.ctts_counts) == 0:
            return np.zeros(self.sample_count, dtype=np.int64)
        if int(self.ctts_counts.sum()) != self.sample_count:
            return None
        return np.repeat(self.ctts_offsets, self.ctts_counts)


def read_mp4_tracks(handle: IO[bytes], file_size: int) -> dict[int, Mp4Track] | None:
    """The tracks of an MP4/MOV file by track id, reading only top-level box headers and ``moov``.

    Returns None when ``handle`` does not hold an MP4 box structure with a ``moov`` box.
    """
    position = 0
    while position + 8 <= file_size:
        handle.seek(position)
        header = handle.read(16)
        if len(header) < 8:
            return None
        size, kind = struct.unpack(">I4s", header[:8])
        header_size = 8
        if size == 1:
            if len(header) < 16:
                return None
            size, header_size = struct.unpack(">Q", header[8:16])[0], 16
        elif size == 0:
            size = file_size - position
        if not kind.isalnum() or size < header_size:
            return None
        if kind == b"moov":
            if size > _MAX_MOOV_BYTES or position + size > file_size:
                return None
            handle.seek(position + header_size)
            payload = handle.read(size - header_size)
            return _parse_moov(payload) if len(payload) == size - header_size else None
        position += size
    return None


def _child_boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in ``data[start:end]``; stops at a malformed box."""
    position = start
    while position + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, position)
        header_size = 8
        if size == 1 and position + 16 <= end:
            size, header_size = struct.unpack_from(">Q", data, position + 8)[0], 16
        elif size == 0:
            size = end - position
        if size < header_size or position + size > end:
            return
        yield kind, position + header_size, position + size
        position += size


def _find_box(data: bytes, start: int, end: int, path: tuple[bytes, ...]) -> tuple[int, int] | None:
    for kind, child_start, child_end in _child_boxes(data, start, end):
        if kind == path[0]:
            return (child_start, child_end) if len(path) == 1 else _find_box(data, child_start, child_end, path[1:])
    return None


def _parse_moov(data: bytes) -> dict[int, Mp4Track] | None:
    fragmented = _find_box(data, 0, len(data), (b"mvex",)) is not None
    tracks: dict[int, Mp4Track] = {}
    for kind, start, end in _child_boxes(data, 0, len(data)):
        if kind != b"trak":
            continue
        tkhd = _find_box(data, start, end, (b"tkhd",))
        stbl = _find_box(data, start, end, (b"mdia", b"minf", b"stbl"))
        if tkhd is None or stbl is None:
            return None
        track_id_at = tkhd[0] + (20 if data[tkhd[0]] == 1 else 12)
        (track_id,) = struct.unpack_from(">I", data, track_id_at)
        sample_count = _sample_count(data, *stbl)
        if sample_count is None:
            return None
        counts, offsets = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ctts = _find_box(data, *stbl, (b"ctts",))
        if ctts is not None:
            (entries,) = struct.unpack_from(">I", data, ctts[0] + 4)
            if ctts[0] + 8 + 8 * entries > ctts[1]:
                return None
            table = np.frombuffer(data, dtype=">i4", count=2 * entries, offset=ctts[0] + 8).reshape(-1, 2)
            counts = table[:, 0].astype(np.uint32).astype(np.int64)
            offsets = table[:, 1].astype(np.int64)
        tracks[track_id] = Mp4Track(track_id, sample_count, counts, offsets, fragmented)
    return tracks


def _sample_count(data: bytes, start: int, end: int) -> int | None:
    for kind in (b"stsz", b"stz2"):
        box = _find_box(data, start, end, (kind,))
        if box is not None and box[0] + 12 <= box[1]:
            return int(struct.unpack_from(">I", data, box[0] + 8)[0])
    return None


class PacketIndexCache:
    """Bounded LRU of packet indices per process, keyed so that an edited file is indexed again.

    Without a stamp the key is (path, size, mtime) from a stat (one metadata request per call on a remote
    filesystem); with a :class:`~lerobot_dali.file_stamps.FileStamp` computed once by the caller it is
    (URL, stamp) and costs no request, and a miss first tries the on-disk ``store`` shared by all processes.
    Indices are immutable, so a cache inherited through fork stays valid; sources without a stable identity
    (anonymous file objects) are indexed every time.
    """

    def __init__(self, *, max_entries: int = 64, max_bytes: int | None = None) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}.")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes!r}.")
        self.max_entries = max_entries
        #: Bound on the indices' own bytes (~70 per frame: a 30,000-frame file's takes 2 MB); the newest is kept.
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, PacketIndex] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        source: VideoSource,
        *,
        filesystem: Any | None = None,
        stamp: FileStamp | None = None,
        store: PacketIndexStore | None = None,
    ) -> PacketIndex:
        """The index of ``source`` (a path on ``filesystem``, local without one), built on first use.

        ``stamp`` identifies the file's content (see :class:`~lerobot_dali.file_stamps.FileStamps`): no
        metadata request is made. ``store`` (used only with a stamp) is read on a miss and written after a
        build. Raises what :func:`build_packet_index` raises.
        """
        if stamp is None:
            return self._get_unstamped(source, filesystem=filesystem)
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(
                f"a stamp identifies a path; got a {type(source).__name__} source ({source_label(source)})."
            )
        url = source_url(source, filesystem=filesystem)
        key = ("stamped", url, stamp)
        cached = self._lookup(key)
        if cached is not None:
            return cached
        index = store.load(url, stamp) if store is not None else None
        if index is None:
            index = build_packet_index(source, filesystem=filesystem)
            if index.file_size_bytes != stamp.size:
                # Byte ranges are cached under the listed stamp and episode times describe the listed file:
                # reading on would mix two versions of it (as RetryingFile refuses to when a reopen finds this).
                raise DatasetError(
                    f"{url} has {index.file_size_bytes} bytes but was listed with {stamp.size}: it changed on the "
                    "server since the dataset was opened; re-open the dataset"
                )
            if store is not None:
                store.save(url, stamp, index)
        self._insert(key, index)
        return index

    def _get_unstamped(self, source: VideoSource, *, filesystem: Any | None) -> PacketIndex:
        key = source_cache_key(source, filesystem=filesystem)
        if key is not None:
            cached = self._lookup(key)
            if cached is not None:
                return cached
        index = build_packet_index(source, filesystem=filesystem)
        if key is not None:
            self._insert(key, index)
        return index

    def _lookup(self, key: Hashable) -> PacketIndex | None:
        with self._lock:
            index = self._entries.get(key)
            if index is not None:
                self._entries.move_to_end(key)
            return index

    def _insert(self, key: Hashable, index: PacketIndex) -> None:
        with self._lock:
            replaced = self._entries.pop(key, None)
            self._bytes -= replaced.nbytes if replaced is not None else 0
            self._entries[key] = index
            self._bytes += index.nbytes
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
                self._bytes -= self._entries.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the cached indices."""
        return self._bytes

    def __getstate__(self) -> dict[str, Any]:
        return {"max_entries": self.max_entries, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(max_entries=state["max_entries"], max_bytes=state.get("max_bytes"))  # type: ignore[misc]


_DEFAULT_CACHE = PacketIndexCache()


def load_packet_index(
    source: VideoSource,
    *,
    filesystem: Any | None = None,
    stamp: FileStamp | None = None,
    store: PacketIndexStore | None = None,
) -> PacketIndex:
    """The packet index of ``source`` from this process's default cache (built on first use; see
    :meth:`PacketIndexCache.get` for ``stamp`` and ``store``)."""
    return _DEFAULT_CACHE.get(source, filesystem=filesystem, stamp=stamp, store=store)
