"""Whether a packet a container flags as a keyframe is a random-access point, from its first slice's header.

A container's keyframe flags (MP4 ``stss``) are the muxer's word, and for H.264 that word can be wrong: x264's
intra refresh (``intra-refresh=1``) flags the P-frame that starts each refresh cycle (a recovery point) a sync
sample. Decoding that starts there shows frames predicted from pictures the decoder never had, with no error.
The first VCL NAL unit of the packet tells: an H.264 IDR picture (type 5) is one, and so is a non-IDR slice that is
intra (``slice_type`` I or SI) after a recovery point SEI that recovers there (``recovery_frame_cnt`` 0: x264's
open-GOP keyframes); a P or B slice is not, nor an I slice without such a recovery point: FFmpeg's decoder, reset
there, withholds the frames it cannot prove recovered (2 of the 3 after a scene cut's), and its demuxer does not flag
it. An HEVC packet is one when its first VCL NAL unit is an IRAP picture (BLA, IDR, CRA: types 16-21); x265's intra
refresh writes no such flag, but another muxer might.

A random-access point need not start the decoder afresh: only an IDR (HEVC: IDR, BLA) begins a new coded video
sequence; an open-GOP keyframe decoded after other pictures keeps their state (:func:`resets_decoder`, which a clip's
runs are joined by).

Only length-prefixed NAL units (MP4/MKV ``avcC``/``hvcC`` extradata) are read; Annex B streams (start codes) and
other codecs keep their flags (:func:`nal_layout` returns None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["HEAD_BYTES", "NalLayout", "is_random_access", "nal_layout", "resets_decoder"]

#: Bytes read at once from a packet: its first NAL units' headers and the first slice's header fit (x264's
#: recovery point SEI is 6 bytes); a larger NAL unit before the slice (x264's first SEI, ~700 bytes) costs a read more.
HEAD_BYTES = 128
# Bytes of a slice header read for (first_mb_in_slice, slice_type): two Exp-Golomb codes of at most 65 bits each.
_SLICE_HEADER_BYTES = 20
_H264_VCL = frozenset({1, 2, 3, 4, 5})
_H264_IDR = 5
_H264_SLICE = frozenset({1, 2})  # (a non-IDR slice, or data partition A: both start with the slice header)
_H264_INTRA_SLICE_TYPES = frozenset({2, 4})  # (slice_type % 5: I, SI)
_H264_SEI = 6
_H264_RECOVERY_POINT = 6  # (the SEI payloadType)
_HEVC_IRAP = range(16, 22)  # (BLA_W_LP .. CRA_NUT)
_HEVC_NEW_SEQUENCE = range(16, 21)  # (BLA_W_LP .. IDR_N_LP: a CRA after other pictures starts none)
_HEVC_FIRST_NON_VCL = 32

#: Reads ``length`` bytes of the packet from byte ``offset`` of it (fewer at its end).
ReadBytes = Callable[[int, int], bytes]


@dataclass(frozen=True)
class NalLayout:
    """How a stream's packets hold NAL units: the codec and the size of each unit's length prefix in bytes."""

    codec: Literal["h264", "hevc"]
    length_size: int


def nal_layout(codec: str, extradata: bytes | None) -> NalLayout | None:
    """The NAL layout of an H.264 (``avcC``) or HEVC (``hvcC``) stream from its extradata, or None for other codecs
    and for Annex B streams (whose extradata, if any, does not start with configuration version 1)."""
    if not extradata or extradata[0] != 1:
        return None
    if codec == "h264" and len(extradata) >= 7:
        return NalLayout("h264", (extradata[4] & 3) + 1)
    if codec == "hevc" and len(extradata) >= 23:
        return NalLayout("hevc", (extradata[21] & 3) + 1)
    return None


def is_random_access(layout: NalLayout, read: ReadBytes, size_bytes: int) -> bool | None:
    """Whether the packet of ``size_bytes`` bytes is a random-access point, judged by its first VCL NAL unit (and an
    H.264 I slice by the SEI units before it); None when it holds none or its NAL units do not parse (a damaged
    packet: not this function's to judge).

    Reads :data:`HEAD_BYTES` at a time through ``read``: one read for most packets, one more per NAL unit before the
    slice that does not fit (and per SEI unit of an I slice that does not).
    """
    buffer, buffer_start = b"", 0

    def take(offset: int, length: int) -> bytes:
        nonlocal buffer, buffer_start
        if offset < buffer_start or offset + length > buffer_start + len(buffer):
            buffer_start, buffer = offset, read(offset, min(max(length, HEAD_BYTES), size_bytes - offset))
        return buffer[offset - buffer_start : offset - buffer_start + length]

    prefix = layout.length_size
    position = 0
    seis: list[tuple[int, int]] = []  # (the payload's offset and size of each SEI unit before the first slice)
    while position + prefix < size_bytes:
        head = take(position, prefix + 2)
        if len(head) < prefix + 2:
            return None
        unit_size = int.from_bytes(head[:prefix], "big")
        if unit_size < 2 or position + prefix + unit_size > size_bytes:
            return None
        if layout.codec == "hevc":
            unit_type = (head[prefix] >> 1) & 0x3F
            if unit_type < _HEVC_FIRST_NON_VCL:
                return unit_type in _HEVC_IRAP
        else:
            unit_type = head[prefix] & 0x1F
            if unit_type == _H264_IDR:
                return True
            if unit_type in _H264_SLICE:
                header = take(position + prefix + 1, min(unit_size - 1, _SLICE_HEADER_BYTES))
                slice_type = _h264_slice_type(header)
                if slice_type is None:
                    return None
                if slice_type % 5 not in _H264_INTRA_SLICE_TYPES:
                    return False
                return any(_recovers_here(take(offset, size)) for offset, size in seis)  # (read only for I slices)
            if unit_type in _H264_VCL:  # (partition B or C first: no slice header to read)
                return None
            if unit_type == _H264_SEI:
                seis.append((position + prefix + 1, unit_size - 1))
        position += prefix + unit_size
    return None


def resets_decoder(layout: NalLayout, packet: bytes) -> bool:
    """Whether ``packet`` (a random-access point) starts a new coded video sequence, which a decoder begins afresh
    after whatever it decoded before: an H.264 IDR picture, an HEVC IDR or BLA one. An open-GOP keyframe (an H.264 I
    picture at a recovery point, an HEVC CRA) does not: decoded after other pictures, it keeps their frame numbers,
    picture order counts and references, and a decoder may withhold or misorder what follows. False where the packet
    does not parse."""
    prefix, position = layout.length_size, 0
    while position + prefix < len(packet):
        unit_size = int.from_bytes(packet[position : position + prefix], "big")
        if unit_size < 2:
            return False
        header = packet[position + prefix]
        if layout.codec == "hevc" and (header >> 1) & 0x3F < _HEVC_FIRST_NON_VCL:
            return (header >> 1) & 0x3F in _HEVC_NEW_SEQUENCE
        if layout.codec == "h264" and header & 0x1F in _H264_VCL:
            return header & 0x1F == _H264_IDR
        position += prefix + unit_size
    return False


def _recovers_here(payload: bytes) -> bool:
    """Whether an H.264 SEI unit's payload (after its NAL header) holds a recovery point message whose
    ``recovery_frame_cnt`` is 0: the picture it precedes, and every one after it in output order, decode right."""
    data = _unescape(payload)
    position = 0
    while position < len(data) and data[position] != 0x80:  # (0x80: the trailing bits)
        values = []
        for _ in range(2):  # payloadType, then payloadSize: a run of 0xFF bytes adding 255 each, then the last byte
            value = 0
            while position < len(data) and data[position] == 0xFF:
                value, position = value + 255, position + 1
            if position >= len(data):
                return False
            values.append(value + data[position])
            position += 1
        message_type, message_size = values
        if message_type == _H264_RECOVERY_POINT:
            # (recovery_frame_cnt, ue(v), is below 2**16, so 33 bits at most: a crafted message of zeros parsed
            # whole took seconds)
            return _BitReader(data[position : position + min(message_size, 8)]).exp_golomb() == 0
        position += message_size
    return False


def _h264_slice_type(header: bytes) -> int | None:
    """``slice_type`` from the first bytes of a slice header (after the NAL header), or None if they end first."""
    bits = _BitReader(_unescape(header))
    if bits.exp_golomb() is None:  # first_mb_in_slice
        return None
    return bits.exp_golomb()


def _unescape(data: bytes) -> bytes:
    """``data`` without emulation-prevention bytes (the 3 of each 00 00 03)."""
    out = bytearray()
    zeros = 0
    for byte in data:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


class _BitReader:
    def __init__(self, data: bytes) -> None:
        self._value = int.from_bytes(data, "big")
        self._remaining = 8 * len(data)

    def _bits(self, count: int) -> int | None:
        if count > self._remaining:
            return None
        self._remaining -= count
        return (self._value >> self._remaining) & ((1 << count) - 1)

    def exp_golomb(self) -> int | None:
        """An unsigned Exp-Golomb code, ue(v); None when the bits end first."""
        zeros = 0
        while (bit := self._bits(1)) == 0:
            zeros += 1
        if bit is None:
            return None
        rest = self._bits(zeros)
        return None if rest is None else (1 << zeros) - 1 + rest
