"""The bytes of one stored packet index: read without parsing any Python literal, damage caught by a checksum.

Up to format 4 the store kept numpy ``.npz`` files. ``np.load`` parses each ``.npy`` header with
``ast.literal_eval``, and CPython 3.11 counts the AST constructor's recursion depth per interpreter, not per thread:
a load while any other thread parsed Python (``ast``, ``compile``, 3.11's traceback carets, user code) could fail
with ``SystemError``, and a good index was taken for damage and deleted (seen in CI). This layout is read with
``struct``, ``json`` and ``np.frombuffer`` alone (little-endian throughout):

=========  ============================================================================================
bytes      what
=========  ============================================================================================
8          :data:`MAGIC`
4          format (uint32, :data:`STORE_FORMAT`)
4          length ``h`` of the header
h          the header: JSON of the key (URL, stamp) and the scalar fields, with the packet count ``n`` and the
           template's length ``t``; padded with spaces to a multiple of 8 bytes
8n each    ``pts``, ``dts``, ``byte_offset``, ``size_bytes`` (int64)
n          flags (one byte each): 1 ``keyframe``, 2 ``hidden``
t          ``template``
4          crc32 of every byte before it (uint32)
=========  ============================================================================================

A flipped bit or a cut anywhere fails the checksum (crc32 catches every burst of up to 32 flipped bits), as the
zip's CRC32 did. 100,000 packets take 3.4 MB, as in an ``.npz``. Never pickle: loading a cache must not run code.
"""

from __future__ import annotations

import json
import struct
import zlib
from fractions import Fraction

import numpy as np

from .file_stamps import FileStamp
from .packet_index import PacketIndex

__all__ = ["FILE_CHECKS", "MAGIC", "STORE_FORMAT", "packet_index_bytes", "read_packet_index", "read_packet_index_entry"]

#: Version of the layout; files of another version are deleted and rebuilt. 2: ``keyframe`` holds random-access
#: points only, not every flagged sync sample (x264 intra refresh flags P-frames; :mod:`.random_access`). 3: the
#: stream's index in the container (``stream_index``). 4: whether every keyframe's size was checked
#: (``keyframe_sizes_checked``). 5: this layout, not an ``.npz`` (whose reading parses Python literals). 6: an
#: H.264 I-slice picture that is not IDR is a random-access point only after a recovery point SEI with
#: ``recovery_frame_cnt`` 0 (:mod:`.random_access`); format 5 took every I-slice, and a decoder reset there withholds
#: frames, so a cached index of such a file kept refusing requests as corrupt. 7: which packets the edit list hides
#: (``hidden``); a format-6 index of a trimmed file looked frames up among the hidden ones, which a decode never shows.
STORE_FORMAT = 7
#: Which checks of the video file itself the build made, kept in the header (``file_checks``; entries written before
#: it have none: 0). 1: a truncated or zero-filled file is refused (a cut Matroska segment or fragmented MP4, an MP4 cut
#: among its first packets, a box header or last packet of zeros). An entry with less is served only once its file's
#: boxes pass :func:`~lerobot_dali.packet_index.check_stored_index` (a few small reads; :meth:`PacketIndexStore.load`),
#: not rebuilt as a new :data:`STORE_FORMAT` would make every index be.
FILE_CHECKS = 1
#: The first bytes of every packet index file.
MAGIC = b"LDPKTIDX"

_PREFIX = struct.Struct("<8sII")  # magic, format, header length
_CHECKSUM = struct.Struct("<I")
_INT_ARRAYS = ("pts", "dts", "byte_offset", "size_bytes")
_BYTES_PER_PACKET = 8 * len(_INT_ARRAYS) + 1  # (and a byte of flags)
_KEYFRAME, _HIDDEN = 1, 2


def packet_index_bytes(index: PacketIndex, url: str, stamp: FileStamp) -> bytes:
    """The file holding ``index`` of ``url`` at ``stamp``."""
    header = json.dumps(
        {
            "url": url,
            "stamp_size": int(stamp.size),
            "stamp_version": stamp.version,
            "source_name": index.source_name,
            "codec": index.codec,
            "width": int(index.width),
            "height": int(index.height),
            "pix_fmt": index.pix_fmt,
            "time_base": [index.time_base.numerator, index.time_base.denominator],
            "file_size_bytes": int(index.file_size_bytes),
            "byte_exact": bool(index.byte_exact),
            "stream_index": int(index.stream_index),
            "keyframe_sizes_checked": bool(index.keyframe_sizes_checked),
            "file_checks": FILE_CHECKS,
            "packets": len(index.pts),
            "template_bytes": len(index.template),
        }
    ).encode()
    header += b" " * (-len(header) % 8)  # (the arrays start 8-byte aligned)
    body = b"".join(
        [
            _PREFIX.pack(MAGIC, STORE_FORMAT, len(header)),
            header,
            *(np.asarray(getattr(index, name), dtype="<i8").tobytes() for name in _INT_ARRAYS),
            _flags(index).tobytes(),
            index.template,
        ]
    )
    return body + _CHECKSUM.pack(zlib.crc32(body))


def _flags(index: PacketIndex) -> np.ndarray:
    flags = np.where(index.keyframe, _KEYFRAME, 0).astype(np.uint8)
    if index.hidden is not None:
        flags |= np.where(index.hidden, _HIDDEN, 0).astype(np.uint8)
    return flags


def read_packet_index(raw: bytes, url: str, stamp: FileStamp) -> PacketIndex:
    """The index in file content ``raw``; ValueError when it is damaged, of another format or for another key."""
    return read_packet_index_entry(raw, url, stamp)[0]


def read_packet_index_entry(raw: bytes, url: str, stamp: FileStamp) -> tuple[PacketIndex, int]:
    """The index in file content ``raw`` and the :data:`FILE_CHECKS` its build made (0 where the file predates them);
    ValueError as :func:`read_packet_index` raises it."""
    if len(raw) < _PREFIX.size + _CHECKSUM.size:
        raise ValueError(f"{len(raw)} bytes, too short for a packet index file")
    magic, file_format, header_length = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"starts with {magic!r}, not {MAGIC!r}: not a packet index file")
    if file_format != STORE_FORMAT:
        raise ValueError(f"store format {file_format}, this version reads {STORE_FORMAT}")
    body = memoryview(raw)[: -_CHECKSUM.size]
    (stored_crc,), crc = _CHECKSUM.unpack_from(raw, len(body)), zlib.crc32(body)
    if crc != stored_crc:
        raise ValueError(f"crc32 {crc:08x}, stored {stored_crc:08x}: the file is damaged")
    offset = _PREFIX.size + header_length
    header = json.loads(raw[_PREFIX.size : offset])
    stored_key = (header["url"], header["stamp_size"], header["stamp_version"])
    if stored_key != (url, stamp.size, stamp.version):
        raise ValueError(f"the file holds the index of {stored_key}, not of {(url, stamp.size, stamp.version)}")
    count, template_bytes = int(header["packets"]), int(header["template_bytes"])
    expected = offset + _BYTES_PER_PACKET * count + template_bytes + _CHECKSUM.size
    if len(raw) != expected:
        raise ValueError(f"{len(raw)} bytes, not the {expected} its header says")
    arrays: dict[str, np.ndarray] = {}
    for name in _INT_ARRAYS:
        arrays[name] = np.frombuffer(body, dtype="<i8", count=count, offset=offset).astype(np.int64)
        offset += 8 * count
    flags = np.frombuffer(body, dtype=np.uint8, count=count, offset=offset)
    if (flags & ~np.uint8(_KEYFRAME | _HIDDEN)).any():
        raise ValueError(f"a packet's flags hold bits no format-{STORE_FORMAT} index sets")
    arrays["keyframe"] = (flags & _KEYFRAME) != 0
    arrays["hidden"] = (flags & _HIDDEN) != 0
    offset += count
    numerator, denominator = header["time_base"]
    index = PacketIndex(
        source_name=str(header["source_name"]),
        codec=str(header["codec"]),
        width=int(header["width"]),
        height=int(header["height"]),
        pix_fmt=None if header["pix_fmt"] is None else str(header["pix_fmt"]),
        time_base=Fraction(int(numerator), int(denominator)),
        file_size_bytes=int(header["file_size_bytes"]),
        byte_exact=bool(header["byte_exact"]),
        template=bytes(body[offset : offset + template_bytes]),
        stream_index=int(header["stream_index"]),
        keyframe_sizes_checked=bool(header["keyframe_sizes_checked"]),
        **arrays,
    )
    return index, int(header.get("file_checks", 0))
