"""The keyframe judge's edges (:mod:`lerobot_dali.random_access`) that the intra-refresh files do not reach: the NAL
layouts of real ``avcC``/``hvcC`` extradata and of Annex B streams, damaged packets, and the exact bytes each judgement
reads (each read a request on a remote file)."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from lerobot_dali.random_access import (
    HEAD_BYTES,
    NalLayout,
    _unescape,
    is_random_access,
    nal_layout,
    resets_decoder,
)
from tests.video_fixtures import MarkerVideo, nal_packet

#: An IDR slice's NAL header and first slice-header bytes.
_IDR = b"\x65\x88\x80"
#: A P slice: first_mb_in_slice 0, slice_type 0.
_P_SLICE = b"\x41\xc0"
_H264 = NalLayout("h264", 4)


def _extradata(path: Path) -> bytes:
    with av.open(str(path)) as container:
        return bytes(container.streams.video[0].codec_context.extradata)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_real_files_configuration_record_gives_four_byte_lengths(marker_video: MarkerVideo, codec: str) -> None:
    extradata = _extradata(marker_video(codec, 10))
    assert extradata[0] == 1  # (an avcC/hvcC record, as MP4 keeps it)
    assert nal_layout(codec, extradata) == NalLayout(codec, 4)


def test_an_hevc_records_length_size_is_read_from_its_22nd_byte(marker_video: MarkerVideo) -> None:
    """hvcC byte 21 holds constantFrameRate, numTemporalLayers and temporalIdNested above lengthSizeMinusOne."""
    record = bytearray(_extradata(marker_video("hevc", 10)))
    record[21] = 0b1111_1101
    assert nal_layout("hevc", bytes(record)) == NalLayout("hevc", 2)
    assert nal_layout("hevc", bytes(record[:23])) == NalLayout("hevc", 2)  # (the shortest record read)
    assert nal_layout("hevc", bytes(record[:22])) is None
    assert nal_layout("h264", bytes(record)) == NalLayout("h264", (record[4] & 3) + 1)  # (read as the codec says)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
@pytest.mark.parametrize("extradata", [None, b"", b"\x00\x00\x00\x01\x67" + bytes(30), b"\x02" + bytes(30)])
def test_annex_b_and_missing_extradata_keep_the_containers_flags(codec: str, extradata: bytes | None) -> None:
    """Start codes (or no record at all, or another record version): packets are not length-prefixed."""
    assert nal_layout(codec, extradata) is None


def _judge(data: bytes, layout: NalLayout = _H264) -> tuple[bool | None, list[tuple[int, int]]]:
    reads: list[tuple[int, int]] = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        assert offset >= 0 and offset + length <= len(data)  # (never past the packet: it is the next one's bytes)
        return data[offset : offset + length]

    return is_random_access(layout, read, len(data)), reads


@pytest.mark.parametrize(
    "data",
    [
        nal_packet(_IDR)[:-1],  # the unit's size runs a byte past the packet
        nal_packet(b"\x65"),  # a unit of one byte: no room for a slice header
        nal_packet(b""),  # a unit of no bytes
        b"\x00\x00\x00\x03\x65",  # the packet ends within the unit's first two bytes
        nal_packet(b"\x06\x05\x01\x80")[:-1] + nal_packet(_IDR),  # a SEI one byte short: the IDR is out of step
    ],
    ids=["overrun", "one-byte", "empty-unit", "cut-header", "misaligned"],
)
def test_a_packet_whose_units_do_not_parse_is_not_judged(data: bytes) -> None:
    assert _judge(data)[0] is None


def test_a_packet_is_read_once_from_its_start_no_further_than_its_end() -> None:
    small = nal_packet(b"\x06\x05\x01\x80", _IDR)
    assert _judge(small) == (True, [(0, len(small))])
    large = nal_packet(_P_SLICE + bytes(300))
    assert _judge(large) == (False, [(0, HEAD_BYTES)])


def test_a_unit_past_the_first_read_is_read_from_its_own_start() -> None:
    """The slice after a SEI larger than a read: its head is read where it starts, a read's worth (or to the end)."""
    sei = b"\x06" + bytes(HEAD_BYTES + 50)
    idr_at = 4 + len(sei)
    data = nal_packet(sei, _IDR + bytes(200))
    assert _judge(data) == (True, [(0, HEAD_BYTES), (idr_at, HEAD_BYTES)])
    data = nal_packet(sei, _P_SLICE)
    assert _judge(data) == (False, [(0, HEAD_BYTES), (idr_at, len(data) - idr_at)])


def test_a_slice_header_is_read_from_its_own_unit_alone() -> None:
    """A slice unit whose header ends within first_mb_in_slice is not judged, whatever units follow it (read in a
    second read, past a SEI larger than the first)."""
    data = nal_packet(b"\x06" + bytes(HEAD_BYTES + 50), b"\x41\x00", b"\x41" + b"\xff" * 12)
    assert _judge(data)[0] is None


def test_a_read_cut_short_is_not_judged() -> None:
    """A file that ends within the packet (cut since its index was read) gives fewer bytes than asked."""
    data = nal_packet(_IDR)
    assert is_random_access(_H264, lambda offset, length: data[offset : offset + 5], len(data)) is None


@pytest.mark.parametrize("first_non_vcl", [32, 33, 34, 35, 39])  # VPS, SPS, PPS, access unit delimiter, SEI
def test_an_hevc_packets_parameter_sets_before_its_picture_are_passed_over(first_non_vcl: int) -> None:
    """x265's ``repeat-headers`` (and other muxers) put the parameter sets in each keyframe's packet."""
    data = nal_packet(bytes([first_non_vcl << 1, 1, 0xAF]), bytes([19 << 1, 1, 0xAF]))  # then an IDR_W_RADL
    assert _judge(data, NalLayout("hevc", 4))[0] is True
    assert resets_decoder(NalLayout("hevc", 4), data) is True


#: An I slice: first_mb_in_slice 0, slice_type 2.
_I_SLICE = b"\x41\xb8"


@pytest.mark.parametrize(
    ("units", "expected"),
    [
        ((b"\x06\x06\x01\x80", _I_SLICE), True),  # a recovery point SEI without its rbsp trailing byte
        ((b"\x0c\x06\x01\x80", _I_SLICE), False),  # filler data whose bytes read as a recovery point: no SEI
        ((b"\x09\x10", _I_SLICE), False),  # a delimiter alone: no recovery point
        ((b"\x06\x05\x01\x07", _I_SLICE), False),  # a SEI of user data alone, without its rbsp trailing byte
        ((b"\x06\x05\xff\x2d" + b"\xaa" * 300 + b"\x06\x01\x80\x80", _I_SLICE), True),  # 300 bytes of user data first
        ((b"\x06\x05\xff\xff", _I_SLICE), False),  # cut within a size of 255s
        ((b"\x06\x06\x00\x80", _I_SLICE), False),  # a recovery point message of no bytes: no count to read
        ((b"\x23\x00", _IDR), None),  # slice data partition B first: no slice header to judge by
        ((b"\x24\x00", _IDR), None),  # partition C first
    ],
    ids=[
        "untrailed-sei",
        "filler",
        "delimiter",
        "untrailed-user-data",
        "long-user-data",
        "cut-size",
        "empty-recovery-point",
        "partition-b",
        "partition-c",
    ],
)
def test_an_h264_i_slice_is_judged_by_the_sei_units_alone(units: tuple[bytes, ...], expected: bool | None) -> None:
    assert _judge(nal_packet(*units))[0] is expected


def test_a_cut_recovery_point_sei_is_not_read_on_into_the_next_unit() -> None:
    """The SEI's message is cut before its recovery_frame_cnt; the next unit's one-byte length (130: 1 bit first)
    would read as a count of 0."""
    data = nal_packet(b"\x06\x06\x01", _I_SLICE + bytes(128), length_size=1)
    assert _judge(data, NalLayout("h264", 1))[0] is False


@pytest.mark.parametrize(
    "packet", [b"\x00\x00\x00\x01\x65", nal_packet(b"\x06\x05"), b""], ids=["short-unit", "no-slice", "empty"]
)
def test_a_packet_that_does_not_parse_starts_no_new_sequence(packet: bytes) -> None:
    """False itself, as its type says (not merely a falsy None)."""
    assert resets_decoder(_H264, packet) is False


@pytest.mark.parametrize(
    ("escaped", "raw"),
    [
        (b"\x00\x00\x03\x01", b"\x00\x00\x01"),
        (b"\x00\x03\x01", b"\x00\x03\x01"),  # one zero: no emulation byte
        (b"\x01\x00\x03", b"\x01\x00\x03"),
        (b"\x00\x00\x03\x03", b"\x00\x00\x03"),  # the byte after an emulation byte is data
        (b"\x00\x00\x03\x00\x03", b"\x00\x00\x00\x03"),  # the zeros count again from it
        (b"\x00\x00\x03\x00\x00\x03\x02", b"\x00\x00\x00\x00\x02"),
    ],
)
def test_only_a_3_after_two_zeros_is_an_emulation_prevention_byte(escaped: bytes, raw: bytes) -> None:
    assert _unescape(escaped) == raw
