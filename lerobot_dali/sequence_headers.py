"""The sequence-level headers a keyframe carries in-band: H.264 and HEVC sequence parameter sets, AV1 sequence headers.

These name the frame size, and a stream may carry new ones at any keyframe: AV1 and H.264 files of several sizes
stream-copied into one (as LeRobot's v3.0 concatenation does) decode at the new size from there on. The packet index
compares each keyframe's headers with the first keyframe's and has FFmpeg decode a keyframe whose headers differ, to
learn its size (:mod:`.packet_index`): no header is parsed for its fields here, only found. VP9 has no such headers
(each keyframe names its size: :mod:`.vp9_frame_size`).

Only what MP4 and Matroska store is read: length-prefixed NAL units (``avcC``/``hvcC``) and AV1 OBUs with size fields.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SEQUENCE_HEADER_CODECS", "h264_parameter_sets", "keyframe_sequence_headers"]

#: Reads ``length`` bytes of the packet from byte ``offset`` of it (fewer at its end).
ReadBytes = Callable[[int, int], bytes]

#: Codecs whose keyframes may carry sequence-level headers in-band.
SEQUENCE_HEADER_CODECS = frozenset({"h264", "hevc", "av1"})

_H264_SPS = 7
_H264_VCL = range(1, 6)
_HEVC_SPS = 33
_HEVC_FIRST_NON_VCL = 32
_AV1_SEQUENCE_HEADER = 1
_AV1_PICTURE_OBUS = frozenset({3, 4, 6})  # (frame header, tile group, frame: picture data from here on)
_LEB128_BYTES = 8


def keyframe_sequence_headers(
    codec: str, read: ReadBytes, size_bytes: int, *, length_size: int = 4
) -> tuple[bytes, ...] | None:
    """The sequence-level headers (each whole, in stream order) before the picture data of the packet of
    ``size_bytes`` bytes that ``read`` reads; empty when it carries none; None for another codec or a packet whose
    units do not parse. ``length_size``: bytes of each NAL unit's length prefix (H.264, HEVC)."""
    if codec == "av1":
        return _av1_sequence_headers(read, size_bytes)
    if codec not in ("h264", "hevc"):
        return None
    found: list[bytes] = []
    position = 0
    while position + length_size + 2 <= size_bytes:
        head = read(position, length_size + 2)
        if len(head) < length_size + 2:
            return None
        unit_size = int.from_bytes(head[:length_size], "big")
        start = position + length_size
        if unit_size < 2 or start + unit_size > size_bytes:
            return None
        if codec == "h264":
            unit_type = head[length_size] & 0x1F
            vcl, sps = unit_type in _H264_VCL, unit_type == _H264_SPS
        else:
            unit_type = (head[length_size] >> 1) & 0x3F
            vcl, sps = unit_type < _HEVC_FIRST_NON_VCL, unit_type == _HEVC_SPS
        if vcl:
            return tuple(found)
        if sps and not _read_whole(read, start, unit_size, found):
            return None
        position = start + unit_size
    return tuple(found)


def _av1_sequence_headers(read: ReadBytes, size_bytes: int) -> tuple[bytes, ...] | None:
    found: list[bytes] = []
    position = 0
    while position < size_bytes:
        head = read(position, 2 + _LEB128_BYTES)
        if not head:
            return None
        obu_type = (head[0] >> 3) & 0x0F
        header_size = 2 if head[0] & 0x04 else 1  # (extension byte)
        if not head[0] & 0x02:  # no size field: the OBU runs to the packet's end
            payload_start, payload_size = position + header_size, size_bytes - position - header_size
        else:
            size = _leb128(head[header_size:])
            if size is None:
                return None
            payload_size, length = size
            payload_start = position + header_size + length
        if payload_start + payload_size > size_bytes:
            return None
        if obu_type in _AV1_PICTURE_OBUS:
            return tuple(found)
        if obu_type == _AV1_SEQUENCE_HEADER and not _read_whole(read, payload_start, payload_size, found):
            return None
        position = payload_start + payload_size
    return tuple(found)


def _read_whole(read: ReadBytes, start: int, size: int, found: list[bytes]) -> bool:
    """Add the ``size`` bytes at ``start`` to ``found``; False where the read came back short (a file cut since it
    was listed): a header cut short would be taken for another stream's."""
    unit = read(start, size)
    found.append(unit)
    return len(unit) == size


def _leb128(data: bytes) -> tuple[int, int] | None:
    """(value, bytes read) of the unsigned LEB128 number ``data`` starts with, or None when it does not end in it."""
    value = 0
    for i, byte in enumerate(data[:_LEB128_BYTES]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, i + 1
    return None


def h264_parameter_sets(extradata: bytes | None) -> tuple[bytes, ...] | None:
    """The SPS and PPS NAL units an H.264 stream's ``avcC`` extradata holds (each whole, SPS first), or None where it
    is no ``avcC`` record (an Annex B stream's) or does not parse."""
    if not extradata or len(extradata) < 7 or extradata[0] != 1:
        return None
    units: list[bytes] = []
    position = 5
    for mask in (0x1F, 0xFF):  # (the SPS count shares its byte with reserved bits; the PPS count has it whole)
        if position >= len(extradata):
            return None
        count, position = extradata[position] & mask, position + 1
        for _ in range(count):
            size = int.from_bytes(extradata[position : position + 2], "big")
            unit = extradata[position + 2 : position + 2 + size]
            if size < 2 or len(unit) != size:
                return None
            units.append(unit)
            position += 2 + size
    return tuple(units)
