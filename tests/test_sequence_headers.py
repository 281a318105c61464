"""Sequence headers found in keyframes' bytes, on packets written by hand: what each codec's units look like, and
the packets that do not parse (None, so the packet index decodes that keyframe to learn its size)."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from lerobot_dali.sequence_headers import h264_parameter_sets, keyframe_sequence_headers
from tests.video_fixtures import nal_packet


def _found(
    codec: str, packet: bytes, *, length_size: int = 4, short_reads: Collection[int] = ()
) -> tuple[bytes, ...] | None:
    """The headers of ``packet``, read through a reader whose reads numbered ``short_reads`` (1 the first) hand one
    byte fewer than asked (a read cut short)."""
    reads = []

    def read(start: int, length: int) -> bytes:
        reads.append(start)
        return packet[start : start + length - (len(reads) in short_reads)]

    return keyframe_sequence_headers(codec, read, len(packet), length_size=length_size)


# H.264 NAL units: the type is the first byte's low 5 bits (SEI 6, SPS 7, PPS 8; IDR slice 5, non-IDR slice 1).
SEI, PPS = b"\x06\x05\x01", b"\x68\xee"
SPS, SPS_2 = b"\x67\x64\x00\x1f", b"\x27\x4d\x40"  # (types 7 both: 0x67 & 0x1F, 0x27 & 0x1F)
IDR, SLICE = b"\x65\x88", b"\x41\x9a"


@pytest.mark.parametrize("length_size", [4, 2, 1])
def test_h264_headers_are_the_spses_before_the_first_slice_each_whole(length_size: int) -> None:
    packet = nal_packet(SEI, SPS, PPS, SPS_2, IDR, SPS, SLICE, length_size=length_size)
    assert _found("h264", packet, length_size=length_size) == (SPS, SPS_2)  # (the SPS after the slice is not read)
    assert _found("h264", nal_packet(SLICE, SPS, length_size=length_size), length_size=length_size) == ()
    packet = nal_packet(PPS, length_size=length_size)
    assert _found("h264", packet, length_size=length_size) == ()  # (no slice: every unit read)


def test_hevc_headers_are_the_spses_before_the_first_picture_unit() -> None:
    # HEVC NAL units: the type is bits 1-6 of the first of two header bytes (VPS 32, SPS 33, PPS 34; IDR_W_RADL 19,
    # CRA 21, a trailing picture 1: every type under 32 is picture data).
    vps, sps, pps, idr, cra = b"\x40\x01\x0c", b"\x42\x01\x01\x60", b"\x44\x01\xc1", b"\x26\x01\xaf", b"\x2a\x01\xad"
    assert _found("hevc", nal_packet(vps, sps, pps, idr, sps)) == (sps,)
    assert _found("hevc", nal_packet(vps, pps, cra, sps)) == ()
    # (an H.264 SPS's first byte is an HEVC VCL unit's, type 51 >> 1 & 0x3F = 51: not picture data, not an SPS)
    assert _found("hevc", nal_packet(SPS, sps, idr)) == (sps,)


@pytest.mark.parametrize(
    "packet",
    [
        nal_packet(SPS, b"\x06", IDR),  # a unit of one byte: none is shorter than its header
        nal_packet(SPS) + (100).to_bytes(4, "big") + IDR,  # a unit said to run past the packet
        b"\x00\x00\x00\x03" + SPS + nal_packet(IDR),  # a length one short: the next misread from the SPS's last byte
    ],
)
def test_units_that_do_not_parse_give_none(packet: bytes) -> None:
    assert _found("h264", packet) is None


def test_a_read_cut_short_gives_none_and_a_tail_too_short_for_a_unit_is_left() -> None:
    packet = nal_packet(SPS, PPS, IDR)
    assert _found("h264", packet) == (SPS,)
    assert _found("h264", packet, short_reads=[2]) is None  # (the SPS's body read one byte short)
    assert _found("h264", packet, short_reads=[3]) is None  # (the PPS's head)
    assert _found("h264", packet, short_reads=[5]) == (SPS,)  # (the IDR's body is never read)
    av1 = _obu(1, b"\x0a\x0b\x0c") + _obu(6, b"\x01")
    assert (_found("av1", av1), _found("av1", av1, short_reads=[2])) == ((b"\x0a\x0b\x0c",), None)  # (its payload)
    assert _found("h264", nal_packet(SPS) + b"\x00\x00\x00\x09\x65") == (SPS,)  # (5 bytes: no unit's length and header)
    assert _found("h264", b"") == () and _found("av1", b"") == ()


def test_other_codecs_carry_none_in_band() -> None:
    packet = nal_packet(SPS, IDR)
    assert [_found(codec, packet) for codec in ("vp9", "vp8", "mjpeg", "h265")] == [None] * 4


def _obu(obu_type: int, payload: bytes, *, extension: bool = False, sized: bool = True) -> bytes:
    """An AV1 OBU: its header byte (type in bits 3-6, the extension flag bit 2, the size flag bit 1), the extension
    byte, the payload's size in LEB128, the payload."""
    header = bytes([obu_type << 3 | (0x04 if extension else 0) | (0x02 if sized else 0)])
    size, value = b"", len(payload)
    while sized:
        size += bytes([value & 0x7F | (0x80 if value >= 0x80 else 0)])
        value >>= 7
        sized = value > 0
    return header + (b"\x00" if extension else b"") + size + payload


def test_av1_headers_are_the_sequence_header_obus_payloads_before_the_picture_data() -> None:
    # OBU types: sequence header 1, temporal delimiter 2, frame header 3, tile group 4, metadata 5, frame 6.
    header, long_header = b"\x00\x00\x00\x42\xab", bytes(range(200))  # (200: a two-byte size, 0xC8 0x01)
    delimiter, metadata = _obu(2, b""), _obu(5, b"\x04\x01")
    frame = _obu(6, b"\x10\x20\x30")
    packet = delimiter + _obu(1, header) + metadata + _obu(1, long_header, extension=True) + frame + _obu(1, header)
    assert _found("av1", packet) == (header, long_header)
    for picture in (3, 4, 6):
        assert _found("av1", delimiter + _obu(picture, b"\x01") + _obu(1, header)) == ()
    # an OBU without a size field runs to the packet's end
    assert _found("av1", delimiter + _obu(1, header, sized=False)) == (header,)
    assert _found("av1", delimiter + _obu(1, header, extension=True, sized=False)) == (header,)


@pytest.mark.parametrize(
    "packet",
    [
        _obu(2, b"") + _obu(1, b"\x01\x02\x03")[:-1],  # a payload said to run past the packet
        _obu(2, b"") + b"\x0a" + b"\x80" * 8 + b"\x01",  # a size of more than 8 LEB128 bytes
        _obu(2, b"") + b"\x0a\x80",  # a size cut off at the packet's end
    ],
)
def test_av1_obus_that_do_not_parse_give_none(packet: bytes) -> None:
    assert _found("av1", packet) is None


def test_an_av1_read_that_returns_nothing_gives_none() -> None:
    assert keyframe_sequence_headers("av1", lambda start, length: b"", 4) is None


def test_an_8_byte_leb128_size_after_an_extension_byte_is_read() -> None:
    """A size may take all 8 LEB128 bytes (padded with 0x80s), after the header's 2 bytes: 10 read in all."""
    header = b"\x0a\x0b\x0c"
    padded = b"\x0e\x00" + bytes([0x83, *[0x80] * 6, 0x00]) + header  # (OBU type 1, extension byte, size 3)
    assert _found("av1", _obu(2, b"") + padded + _obu(6, b"\x01")) == (header,)


def _avcc(sps: list[bytes], pps: list[bytes], *, pps_count: int | None = None) -> bytes:
    """An ``avcC`` record: version 1, profile, compatibility, level, the NAL length size byte, then the SPS count
    (in a byte whose top 3 bits are reserved, set), each SPS after its 2-byte size, the PPS count and each PPS."""
    out = b"\x01\x64\x00\x1f\xff" + bytes([0xE0 | len(sps)]) + nal_packet(*sps, length_size=2)
    return out + bytes([len(pps) if pps_count is None else pps_count]) + nal_packet(*pps, length_size=2)


def test_avcc_parameter_sets_are_its_spses_then_its_ppses_each_whole() -> None:
    assert h264_parameter_sets(_avcc([SPS], [PPS])) == (SPS, PPS)
    assert h264_parameter_sets(_avcc([SPS, SPS_2], [PPS, b"\x68\xce\x38"])) == (SPS, SPS_2, PPS, b"\x68\xce\x38")
    assert h264_parameter_sets(_avcc([], [])) == ()  # (7 bytes: the least record)


@pytest.mark.parametrize(
    "extradata",
    [
        None,
        b"",
        _avcc([], [])[:6],  # no PPS count
        b"\x00" + _avcc([SPS], [PPS])[1:],  # version 0: no avcC record (an Annex B stream's starts 00 00 00 01)
        _avcc([SPS], [PPS])[:-1],  # a PPS cut short
        _avcc([SPS], [PPS], pps_count=0x21),  # 33 PPSes said (the count's 8 bits are all its own), one there
        _avcc([SPS], [b"\x68"]),  # a unit of one byte: none is shorter than its header
        _avcc([SPS], [PPS])[: 6 + 2 + len(SPS)],  # the record ends after its SPSes
        _avcc([b""], [PPS]),  # an empty unit
    ],
)
def test_avcc_records_that_do_not_parse_give_none(extradata: bytes | None) -> None:
    assert h264_parameter_sets(extradata) is None
