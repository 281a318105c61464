"""MP4 sample tables (ISO/IEC 14496-12): the per-track facts FFmpeg's demuxer index does not expose.

Reading only the top-level box headers and ``moov`` lets the packet index take every packet's timestamps
from the file's own tables instead of demuxing the whole file (what makes indexing a remote file cheap).
PyAV >= 16 exposes FFmpeg's index (decode times, offsets, sizes, keyframes), and only ``ctts`` is read here;
older PyAV does not, so :class:`SampleTable` reads those from ``stts``, ``stsc``, ``stco``/``co64``, ``stsz`` and
``stss`` too, for the tracks whose tables FFmpeg reads the same way (no sample groups, at most one edit, and one
that hides no sample: FFmpeg demuxes a sample an edit list hides, flagged to be decoded and not shown).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import IO

import numpy as np

__all__ = ["Edit", "Mp4Track", "SampleTable", "mp4_file_cut", "read_mp4_tracks"]

# Largest moov box read into memory; real moov boxes are about 20 bytes per sample.
_MAX_MOOV_BYTES = 512 * 1024 * 1024
# mdat boxes walked for Mp4Track.media_data; past this many, media_data is not known (a header read each).
_MAX_MEDIA_BOXES = 64
#: Bytes read at once for the top-level box headers of a fragmented movie, past a fragment no larger: a remote file
#: without ``mfra`` took a request per fragment (a 256 KiB read-ahead block each: 61 for a 28 MB file of 1 s fragments,
#: 152 for 44 MB of 2-frame fragments), now one per 4 MiB (7 and 11), reading about the file (a fragmented MP4's index
#: demuxes it whole anyway).
_WALK_BATCH_BYTES = 4 * 1024 * 1024
#: The type :func:`_top_level_boxes` gives a header that is zeros from within its type on (no box type holds a zero
#: byte): the file is zero-filled from there.
_ZERO_HEADER = b"\x00\x00\x00\x00"


@dataclass(frozen=True)
class SampleTable:
    """Each sample of a track, in decode order: its decode time in the track's time base counted from 0 (the
    edit list not applied: FFmpeg shifts every timestamp by the edit's start), byte offset, size and sync flag."""

    dts: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    keyframe: np.ndarray


@dataclass(frozen=True)
class Edit:
    """One entry of a track's edit list (``elst``): which part of the media plays, in the media's time base."""

    #: Where in the media the entry starts, in media ticks; -1 for an empty edit (a gap before the media plays).
    media_time: int
    #: How long the entry plays, in media ticks (its duration in the movie's timescale, rounded down).
    duration: int
    #: Whether it plays at normal rate (rate 1): a dwell (rate 0) or other rates FFmpeg applies otherwise.
    normal_rate: bool


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
    #: Every sample from the tables, or None where they hold what FFmpeg reads otherwise than plainly (sample
    #: groups, partial sync samples, an edit list other than one shift of every timestamp, compact sizes) or do not
    #: add up.
    samples: SampleTable | None = None
    #: The type of the first sample description (``avc1``, ``av01``...): the codec the file names, for errors.
    sample_entry: bytes | None = None
    #: Where the file's media data lies, the same for every track: each top-level ``mdat`` box's payload (start,
    #: end), in file order. Every sample's bytes lie in one, which tells damaged sample tables (a changed size
    #: shifts every later sample of its chunk) from sound ones. None where it is not known: a fragmented movie
    #: (not walked), or boxes after ``moov`` that do not parse.
    media_data: tuple[tuple[int, int], ...] | None = None
    #: The entries of the track's edit list (none without one), or None where it does not parse.
    edits: tuple[Edit, ...] | None = ()
    #: A fragmented movie's whole duration, fragments included, in seconds, the same for every track: its longest
    #: track's, as its ``mehd`` box gives it; None without one (FFmpeg writes none; GPAC and Bento4 do) or where it
    #: gives 0 (not known when written).
    movie_duration_s: Fraction | None = None

    def composition_offsets(self) -> np.ndarray | None:
        """Each sample's composition offset (zeros without ``ctts``), or None when ``ctts`` does not fit."""
        if len(self.ctts_counts) == 0:
            return np.zeros(self.sample_count, dtype=np.int64)
        if int(self.ctts_counts.sum()) != self.sample_count:
            return None
        return np.repeat(self.ctts_offsets, self.ctts_counts)


def read_mp4_tracks(handle: IO[bytes], file_size: int) -> dict[int, Mp4Track] | None:
    """The tracks of an MP4/MOV file by track id, reading only top-level box headers and ``moov``.

    Returns None when ``handle`` does not hold an MP4 box structure with a ``moov`` box. Past ``moov`` only box
    headers are read, for :attr:`Mp4Track.media_data` (with ``moov`` first, the header after it: one more read).
    """
    media: list[tuple[int, int]] = []
    tracks: dict[int, Mp4Track] | None = None
    for kind, start, end in _top_level_boxes(handle, file_size):
        if kind == b"moov":
            if end - start > _MAX_MOOV_BYTES or end > file_size:
                return None
            handle.seek(start)
            payload = handle.read(end - start)
            tracks = _parse_moov(payload, file_size) if len(payload) == end - start else None
            if tracks is None or any(track.fragmented for track in tracks.values()):  # (fragments: not walked)
                return tracks
        elif kind == b"mdat":
            media.append((start, end))
        if kind is None or kind == _ZERO_HEADER or (tracks is not None and len(media) > _MAX_MEDIA_BOXES):
            return tracks  # (not a box: no MP4 before moov; past it, media_data is not known)
    if tracks is None or len(media) > _MAX_MEDIA_BOXES:
        return tracks
    return {track_id: replace(track, media_data=tuple(media)) for track_id, track in tracks.items()}


def mp4_file_cut(handle: IO[bytes], file_size: int, *, fragmented: bool = False) -> str | None:
    """Where the top-level boxes of an MP4 say its file is cut short or zero-filled, or None where they show neither.
    FFmpeg's demuxer drops the samples past a cut (or a run of zeros where a box should start) without an error, so
    such a file demuxes as a shorter video.

    A file that ends with its ``mfra`` box (FFmpeg writes one unless told ``skip_trailer``; found from the ``mfro`` box
    ending the file: two small reads) is whole. Else every top-level box header is read: the file is cut where a
    ``moov``, ``moof`` or ``mdat`` box (any box, in a fragmented movie: ``moof``/``mdat`` pairs after ``moov``), or the
    byte range a segment index (``sidx``: a global one lists every fragment) covers, extends past the file's end; in a
    fragmented movie also where it ends within a box header or with a fragment's ``moof`` whose media data (the
    ``mdat`` after it) is missing. A box header that is zeros from within its type on (a copy into a pre-allocated file
    that stopped: same size, zeros from there on) is a cut too, unless a plain movie's ``moov`` and ``mdat`` lie whole
    before them, or a fragmented one's ``mfra`` box (it lists every fragment) ends just before them (trailing padding;
    so are fewer bytes than a header after it). ``fragmented``: the ``moov`` has ``mvex``; else a movie is fragmented
    once a ``moof`` box is met, or where its ``moov``, read only where that decides, has ``mvex``. A fragmented file cut
    exactly between two fragments, with neither an ``mfra`` box nor a global ``sidx``, has whole boxes: only a duration
    its ``moov`` gives (:attr:`Mp4Track.movie_duration_s`, which FFmpeg does not write) can say it had more fragments.
    """
    if file_size >= 16 and _ends_with_mfra(handle, file_size):
        return None
    position, last = 0, (b"", 0)  # (the last moof or mdat box, and where its header starts)
    seen: dict[bytes, tuple[int, int]] = {}  # (each box type met: its first box's payload)

    def movie_fragmented() -> bool:  # (a moof met, else the moov's mvex: its payload read only where it decides)
        moov = seen.get(b"moov")
        return fragmented or b"moof" in seen or (moov is not None and _has_mvex(handle, *moov))

    def padded() -> bool:  # (zeros after a plain movie's moov and mdat, or after a fragmented one's mfra box, whole)
        return previous == b"mfra" or ({b"moov", b"mdat"} <= seen.keys() and not movie_fragmented())

    previous = b""
    for kind, start, end in _top_level_boxes(handle, file_size, batch_bytes=_WALK_BATCH_BYTES):
        if kind == _ZERO_HEADER and not padded():
            return f"its box header at byte {position} is zeros: the file is zero-filled from there (a copy cut short)"
        if kind is None or kind == _ZERO_HEADER:
            return None  # (bytes that are no box: not a cut's signature; a plain movie's padding)
        header_at = position
        if end > file_size and (kind in (b"moov", b"moof", b"mdat") or movie_fragmented()):
            name = kind.decode("latin-1")
            return f"its {name} box at byte {header_at} extends to byte {end} but the file has {file_size} bytes"
        if kind == b"sidx":
            covered = _sidx_end(handle, start, end)
            if covered is not None and covered > file_size:
                return (
                    f"its segment index (the sidx box at byte {header_at}) lists fragments to byte {covered} but the "
                    f"file has {file_size} bytes"
                )
        if kind in (b"moof", b"mdat"):
            last = (kind, header_at)
        seen.setdefault(kind, (start, end))
        position, previous = end, kind
    if position < file_size and previous != b"mfra" and movie_fragmented():  # (what is left of a box header)
        return f"it ends within the header of a box at byte {position} (the file has {file_size} bytes)"
    if last[0] == b"moof":
        return f"its last fragment's media data (the mdat box after its moof box at byte {last[1]}) is missing"
    return None


def _has_mvex(handle: IO[bytes], start: int, end: int) -> bool:
    """Whether the ``moov`` box whose payload is ``start`` to ``end`` holds ``mvex`` (a fragmented movie)."""
    if end - start > _MAX_MOOV_BYTES:
        return False
    handle.seek(start)
    data = handle.read(end - start)
    return _find_box(data, 0, len(data), (b"mvex",)) is not None


def _ends_with_mfra(handle: IO[bytes], file_size: int) -> bool:
    """Whether the file ends with an ``mfra`` box, as the ``mfro`` box that ends it says."""
    handle.seek(file_size - 16)
    mfro = handle.read(16)
    if len(mfro) < 16 or mfro[:8] != b"\x00\x00\x00\x10mfro":
        return False
    (mfra_size,) = struct.unpack_from(">I", mfro, 12)
    if not 24 <= mfra_size <= file_size:  # (its header and the mfro box at least)
        return False
    handle.seek(file_size - mfra_size)
    return handle.read(8) == struct.pack(">I4s", mfra_size, b"mfra")


def _sidx_end(handle: IO[bytes], start: int, end: int) -> int | None:
    """The end of the byte range a ``sidx`` box (payload ``start`` to ``end``) indexes: from the box's end plus its
    first offset, each reference's size; None where the box does not parse."""
    handle.seek(start)
    payload = handle.read(min(end - start, 1 << 20))
    wide = len(payload) > 0 and payload[0] == 1
    head = ">12xQQ2xH" if wide else ">12xII2xH"
    if len(payload) < struct.calcsize(head):
        return None
    _, first_offset, count = struct.unpack_from(head, payload)
    at = struct.calcsize(head)
    if at + 12 * count > len(payload):
        return None
    sizes = np.frombuffer(payload, dtype=">u4", count=3 * count, offset=at)[::3] & 0x7FFFFFFF
    return end + int(first_offset) + int(sizes.astype(np.int64).sum())


def _top_level_boxes(
    handle: IO[bytes], file_size: int, *, batch_bytes: int = 0
) -> Iterator[tuple[bytes | None, int, int]]:
    """(type, payload start, end) of each top-level box, reading its header only; ends with (None, ...) at bytes
    that are no box header, (:data:`_ZERO_HEADER`, ...) at a header whose bytes are zeros from within its type on (no
    type holds a zero byte). A box may end past ``file_size`` (a file cut short). ``batch_bytes``: once a ``moof`` box
    is met, the header after a box no larger is read with the ``batch_bytes`` from it, so the headers of the fragments
    within are read at once (a remote file's request each: :data:`_WALK_BATCH_BYTES`); 0: each header alone."""
    position, buffer, buffer_at, batch = 0, b"", 0, False
    while position + 8 <= file_size:
        if not buffer_at <= position <= position + 16 <= buffer_at + len(buffer):
            handle.seek(position)
            buffer, buffer_at = handle.read(batch_bytes if batch else 16), position
        header = buffer[position - buffer_at : position - buffer_at + 16]
        if len(header) >= 8 and len(header[4:].rstrip(b"\0")) < 4:  # (zeros from within the type on, or before it)
            yield _ZERO_HEADER, position, file_size
            return
        size, kind = struct.unpack(">I4s", header[:8]) if len(header) >= 8 else (0, b"")
        header_size = 16 if size == 1 else 8
        if size == 1:
            size = struct.unpack(">Q", header[8:16])[0] if len(header) >= 16 else 0
        elif size == 0:
            size = file_size - position
        if not kind.isalnum() or size < header_size:
            yield None, position, file_size
            return
        yield kind, position + header_size, position + size
        position += size
        batch = batch_bytes > 16 and (batch or kind == b"moof") and size <= batch_bytes


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


def _parse_moov(data: bytes, file_size: int) -> dict[int, Mp4Track] | None:
    fragmented = _find_box(data, 0, len(data), (b"mvex",)) is not None
    movie_timescale = _timescale(data, _find_box(data, 0, len(data), (b"mvhd",)))
    movie_duration_s = _fragmented_duration_s(data, movie_timescale)
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
        sample_count = _sample_count(data, *stbl, file_size=file_size)
        if sample_count is None:
            return None
        counts, offsets = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ctts = _find_box(data, *stbl, (b"ctts",))
        if ctts is not None:
            table = _full_box_table(data, ctts, 2, ">i4")
            if table is None:
                return None
            counts = table[:, 0].astype(np.uint32).astype(np.int64)
            offsets = table[:, 1].astype(np.int64)
        media_timescale = _timescale(data, _find_box(data, start, end, (b"mdia", b"mdhd")))
        edits = _edit_list(data, start, end, movie_timescale, media_timescale)
        track = Mp4Track(
            track_id, sample_count, counts, offsets, fragmented, _sample_table(data, stbl, sample_count),
            _sample_entry(data, *stbl), edits=edits, movie_duration_s=movie_duration_s,
        )  # fmt: skip
        tracks[track_id] = track if _shows_every_sample(track) else replace(track, samples=None)
    return tracks


def _timescale(data: bytes, box: tuple[int, int] | None) -> int | None:
    """The timescale of an ``mvhd`` or ``mdhd`` box (after its creation and modification times), or None."""
    if box is None or box[0] + 4 > box[1]:
        return None
    at = box[0] + (20 if data[box[0]] == 1 else 12)
    if at + 4 > box[1]:
        return None
    (timescale,) = struct.unpack_from(">I", data, at)
    return int(timescale) or None


def _fragmented_duration_s(data: bytes, movie_timescale: int | None) -> Fraction | None:
    """The duration, in seconds, the ``mehd`` box in ``mvex`` gives the whole movie; None without one, or 0."""
    mehd = _find_box(data, 0, len(data), (b"mvex", b"mehd"))
    if mehd is None or movie_timescale is None or mehd[0] + 8 > mehd[1]:
        return None
    wide = data[mehd[0]] == 1
    if mehd[0] + (12 if wide else 8) > mehd[1]:
        return None
    (duration,) = struct.unpack_from(">Q" if wide else ">I", data, mehd[0] + 4)
    return Fraction(duration, movie_timescale) if duration else None


def _edit_list(
    data: bytes, trak_start: int, trak_end: int, movie_timescale: int | None, media_timescale: int | None
) -> tuple[Edit, ...] | None:
    """The track's edit list (empty without one), or None where it does not parse."""
    elst = _find_box(data, trak_start, trak_end, (b"edts", b"elst"))
    if elst is None:
        return ()
    if elst[0] + 8 > elst[1] or movie_timescale is None or media_timescale is None:
        return None
    entry = ">QqhH" if data[elst[0]] == 1 else ">IihH"
    (count,) = struct.unpack_from(">I", data, elst[0] + 4)
    if elst[0] + 8 + count * struct.calcsize(entry) > elst[1]:
        return None
    edits = []
    for duration, media_time, rate, fraction in struct.iter_unpack(
        entry, data[elst[0] + 8 : elst[0] + 8 + count * struct.calcsize(entry)]
    ):
        ticks = duration * media_timescale // movie_timescale
        edits.append(Edit(media_time=int(media_time), duration=int(ticks), normal_rate=(rate, fraction) == (1, 0)))
    return tuple(edits)


def _shows_every_sample(track: Mp4Track) -> bool:
    """Whether FFmpeg reads the track's tables (:attr:`Mp4Track.samples`) plainly: no edit list, or one edit at
    normal rate that hides no sample (each sample's composition time at or after the edit's start and before its end,
    the duration rounded down: a shift of every timestamp). An empty edit, several edits, or an edit that hides
    samples (a trimmed start or end, whose samples FFmpeg demuxes flagged to be decoded, not shown) it applies
    otherwise."""
    if track.samples is None or track.edits is None or len(track.edits) > 1:
        return False
    if not track.edits:
        return True
    (edit,) = track.edits
    offsets = track.composition_offsets()
    if edit.media_time < 0 or not edit.normal_rate or offsets is None:
        return False
    composition = track.samples.dts + offsets
    return bool(composition.min() >= edit.media_time and composition.max() < edit.media_time + edit.duration)


def _sample_entry(data: bytes, start: int, end: int) -> bytes | None:
    stsd = _find_box(data, start, end, (b"stsd",))
    if stsd is None or stsd[0] + 16 > stsd[1]:  # (version and flags, entry count, then the first entry's header)
        return None
    return data[stsd[0] + 12 : stsd[0] + 16]


def _full_box_table(data: bytes, box: tuple[int, int] | None, columns: int, dtype: str) -> np.ndarray | None:
    """The entries of a full box holding a count then ``columns`` values of ``dtype`` each; None if it is cut."""
    if box is None or box[0] + 8 > box[1]:
        return None
    (entries,) = struct.unpack_from(">I", data, box[0] + 4)
    width = np.dtype(dtype).itemsize * columns
    if box[0] + 8 + width * entries > box[1]:
        return None
    return np.frombuffer(data, dtype=dtype, count=columns * entries, offset=box[0] + 8).reshape(-1, columns)


def _sample_table(data: bytes, stbl: tuple[int, int], count: int) -> SampleTable | None:
    def box(kind: bytes) -> tuple[int, int] | None:
        return _find_box(data, *stbl, (kind,))

    unmodelled = (b"sbgp", b"sgpd", b"stps", b"stz2")  # (sample groups: FFmpeg may flag their samples keyframes)
    if count == 0 or any(box(kind) for kind in unmodelled):
        return None
    stts = _full_box_table(data, box(b"stts"), 2, ">u4")
    stsc = _full_box_table(data, box(b"stsc"), 3, ">u4")
    chunks = _full_box_table(data, box(b"stco"), 1, ">u4")
    if chunks is None:
        chunks = _full_box_table(data, box(b"co64"), 1, ">u8")
    stsz = box(b"stsz")
    if stts is None or stsc is None or chunks is None or stsz is None or stsz[0] + 12 > stsz[1]:
        return None
    if int(stts[:, 0].astype(np.int64).sum()) != count or len(stsc) == 0 or len(chunks) == 0:
        return None
    dts = np.r_[0, np.cumsum(np.repeat(stts[:, 1].astype(np.int64), stts[:, 0].astype(np.int64)))[:-1]]
    (uniform,) = struct.unpack_from(">I", data, stsz[0] + 4)
    if uniform:
        size = np.full(count, uniform, dtype=np.int64)
    elif stsz[0] + 12 + 4 * count <= stsz[1]:
        size = np.frombuffer(data, dtype=">u4", count=count, offset=stsz[0] + 12).astype(np.int64)
    else:
        return None
    # stsc: runs of chunks (1-based first chunk) holding a number of samples each; every chunk's samples are
    # stored back to back from the chunk's offset.
    first_chunk = stsc[:, 0].astype(np.int64)
    if first_chunk[0] != 1 or (np.diff(first_chunk) <= 0).any() or first_chunk[-1] > len(chunks):
        return None
    run_chunks = np.diff(np.r_[first_chunk, len(chunks) + 1])
    per_chunk = np.repeat(stsc[:, 1].astype(np.int64), run_chunks)
    if int(per_chunk.sum()) < count:
        return None
    chunk_of = np.repeat(np.arange(len(chunks)), per_chunk)[:count]
    first_of_chunk = (np.cumsum(per_chunk) - per_chunk)[chunk_of]  # the first sample of each sample's chunk
    start = np.cumsum(size) - size  # where each sample would start were all samples in one chunk
    offset = chunks[:, 0].astype(np.int64)[chunk_of] + start - start[first_of_chunk]
    stss = box(b"stss")
    keyframe = np.ones(count, dtype=bool)  # no stss: every sample is a sync sample
    if stss is not None:
        sync = _full_box_table(data, stss, 1, ">u4")
        if sync is None or ((sync < 1) | (sync > count)).any():
            return None
        keyframe[:] = False
        keyframe[sync[:, 0].astype(np.int64) - 1] = True
    return SampleTable(dts=dts, offset=offset, size=size, keyframe=keyframe)


def _sample_count(data: bytes, start: int, end: int, *, file_size: int) -> int | None:
    """The sample count ``stsz`` or ``stz2`` gives, or None where it cannot be (a damaged count: 3.4 billion made an
    array of 25 GiB; FFmpeg reads what is there): more sizes than the box holds, or one size for all that the file
    cannot hold that many times."""
    for kind in (b"stsz", b"stz2"):
        box = _find_box(data, start, end, (kind,))
        if box is not None and box[0] + 12 <= box[1]:
            count = int(struct.unpack_from(">I", data, box[0] + 8)[0])
            if kind == b"stsz":
                uniform = int(struct.unpack_from(">I", data, box[0] + 4)[0])  # (one size for all: no entries)
                if uniform:
                    return count if uniform * count <= file_size else None
                size_bits = 32
            else:
                size_bits = data[box[0] + 7]  # (stz2: the field size, in bits)
            return count if box[0] + 12 + (size_bits * count + 7) // 8 <= box[1] else None
    return None
