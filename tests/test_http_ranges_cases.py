"""What one remote request must meet (:mod:`lerobot_dali.request_checks`) and how a plain HTTP(S) range's answer is
judged (:mod:`lerobot_dali.http_ranges`), by hand: the exact bytes a range may hold, the deadlines, the offsets an
answer may start from and the 416's words. ``test_http_remote`` tests them over a real server, slowly; these pin
their bounds in milliseconds. (Written ahead of a mutation pass over both modules, which is still to be run.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lerobot_dali import request_checks
from lerobot_dali.errors import DatasetError
from lerobot_dali.http_ranges import _answered_from, _unsatisfiable, cat_range
from lerobot_dali.remote_errors import ignored_range
from lerobot_dali.request_checks import (
    byteranges_framing,
    bytes_deadline_s,
    checked_range,
    fetch_by_deadline,
    past_deadline,
    speaks_http,
)

_FRAMED = b"--b\r\nContent-Range: bytes 10-19/40\r\n\r\n0123456789\r\n--b--\r\n"


def _multipart(start: int, end: int) -> str:
    """The DatasetError's message for bytes ``[start, end)`` of ``p`` answered in a multipart body of boundary b."""
    return (
        f"p: bytes [{start}, {end}) asked in one range, answered HTTP 206 as 'multipart/byteranges; boundary=b': the "
        "range in a multipart body, which HTTP forbids for a single range (RFC 9110 15.3.7.2) and fsspec's HTTP reads "
        "cannot take apart; serve the dataset from a server (or through a proxy or CDN) that answers a single range "
        "with its bytes and a Content-Range, or copy it locally"
    )


@pytest.mark.parametrize(
    ("start", "end", "data", "size"),
    [
        (10, 20, b"x" * 10, None),
        (10, 20, b"x" * 4, None),  # (short, its size unknown: the file may end there)
        (10, 20, b"x" * 5, 15),  # (to the end of the file as listed)
        (10, 20, b"", 10),  # (from the end of the file: nothing)
        (30, 40, b"", 10),  # (past it)
        (10, 20, b"x" * 10, 20),
    ],
)
def test_a_range_holding_the_bytes_it_asked_is_handed_out(start: int, end: int, data: bytes, size: int | None) -> None:
    """The answer to bytes ``[start, end)`` holding them, as many as the file's size leaves, is the data itself."""
    assert checked_range("p", start, end, data, size) is data


@pytest.mark.parametrize(
    ("start", "end", "data", "size", "received"),
    [(10, 20, b"x" * 4, 15, 4), (10, 20, b"x" * 9, 20, 9), (0, 1, b"", 5, 0)],
)
def test_a_range_answered_short_of_a_file_of_known_size_is_a_connection_error(
    start: int, end: int, data: bytes, size: int, received: int
) -> None:
    """Fewer bytes than the file's size leaves is an answer cut short: a ConnectionError (retried) naming the bytes
    asked (up to the file's end) and those received."""
    with pytest.raises(ConnectionError) as info:
        checked_range("p", start, end, data, size)
    asked = min(end, size)
    assert str(info.value) == (
        f"p: asked for bytes [{start}, {asked}) and received {received} bytes (a response cut short, or from another "
        "offset)"
    )


@pytest.mark.parametrize(
    ("start", "end", "data", "size"),
    [(10, 20, b"x" * 11, None), (10, 20, b"x" * 6, 15), (30, 40, b"x", 10), (10, 20, b"--" + b"x" * 9, None)],
)
def test_a_range_answered_longer_is_a_server_that_ignored_range(
    start: int, end: int, data: bytes, size: int | None
) -> None:
    """More bytes than asked (than the file's size leaves; any past its end) is a server that ignored the Range,
    named with the fix, also where the body starts as a multipart one but frames no range."""
    with pytest.raises(DatasetError) as info:
        checked_range("p", start, end, data, size)
    assert str(info.value) == str(ignored_range("p"))


def test_a_range_answered_in_a_multipart_body_is_named_as_such() -> None:
    """A longer answer that frames exactly the bytes asked in a multipart body is named as that, with its boundary."""
    with pytest.raises(DatasetError) as info:
        checked_range("p", 10, 20, _FRAMED, 40)
    assert str(info.value) == _multipart(10, 20)
    with pytest.raises(DatasetError) as clipped:  # (the range clipped to the file's end is the one framed)
        checked_range("p", 10, 30, _FRAMED, 20)
    assert str(clipped.value) == _multipart(10, 30)


@pytest.mark.parametrize(
    ("data", "framing"),
    [
        (_FRAMED, "multipart/byteranges; boundary=b"),
        (_FRAMED.replace(b"Content-Range:", b"content-range :"), "multipart/byteranges; boundary=b"),
        (
            b"--b\r\nContent-Type: video/mp4\r\nContent-Range: bytes 10-19/*\r\n\r\n0123456789\r\n--b",
            "multipart/byteranges; boundary=b",
        ),
        (_FRAMED.replace(b"--b--", b"--c--"), None),  # (another boundary after the bytes)
        (_FRAMED.replace(b"0123456789\r\n", b"012345678\r\n"), None),  # (a byte short)
        (_FRAMED.replace(b"Content-Range: bytes 10-19/40\r\n", b""), None),  # (no Content-Range)
        (_FRAMED.replace(b"bytes 10-19", b"bytes 11-19"), None),
        (_FRAMED[1:], None),  # (no boundary line)
        (b"--b\r\n" + b"X-Pad: " + b"p" * 4100 + b"\r\nContent-Range: bytes 10-19/40\r\n\r\n0123456789\r\n--b", None),
        (b"--b\r\nContent-Range: bytes 10-19/40\r\n\r\n0123456789\r\n--", None),  # (the boundary cut short)
    ],
    ids=[
        "framed",
        "header_case",
        "second_header",
        "other_boundary",
        "short",
        "no_range",
        "other_range",
        "no_dashes",
        "long_headers",
        "cut",
    ],
)
def test_a_multipart_body_frames_bytes_10_to_20_exactly(data: bytes, framing: str | None) -> None:
    """:func:`byteranges_framing` of bytes [10, 20): a boundary line, part headers (any case, its first
    Content-Range the one read) ended within 4 KiB by a blank line, the bytes asked, then the boundary again."""
    assert byteranges_framing(data, 10, 20) == framing


def test_a_request_deadline_is_the_base_plus_the_bytes_at_the_least_rate() -> None:
    """60 s plus a second per 64 KiB, none less for a negative count; a file of unknown size counts as 256 MiB; none
    where the filesystem is not HTTP's or its session's timeout has a total of its own."""
    assert (bytes_deadline_s(0), bytes_deadline_s(65_536), bytes_deadline_s(-65_536)) == (60.0, 61.0, 60.0)
    http = SimpleNamespace(protocol=("http", "https"), client_kwargs={})
    assert request_checks._deadline_s(http, None) == 60.0 + 4096.0
    assert request_checks._deadline_s(http, 131_072) == 62.0
    untotalled = SimpleNamespace(protocol="https", client_kwargs={"timeout": SimpleNamespace(total=None)})
    assert request_checks._deadline_s(untotalled, 0) == 60.0
    totalled = SimpleNamespace(protocol="https", client_kwargs={"timeout": SimpleNamespace(total=5)})
    assert request_checks._deadline_s(totalled, 0) is None
    assert request_checks._deadline_s(SimpleNamespace(protocol="s3"), 0) is None


@pytest.mark.parametrize(
    ("protocol", "speaks"),
    [("http", True), ("https", True), (("http", "https"), True), (("s3", "s3a"), False), ("file", False), ((), False)],
)
def test_a_filesystem_speaks_http_by_its_protocol(protocol: object, speaks: bool) -> None:
    assert speaks_http(SimpleNamespace(protocol=protocol)) is speaks
    assert speaks_http(object()) is False


def test_a_request_past_its_deadline_is_a_timeout_naming_the_range_or_the_file() -> None:
    said = "not received within the deadline of 61.5 s (60 s plus the bytes at 65536 bytes/s): the server sends too "
    tail = "slowly or stalls mid-answer"
    assert str(past_deadline("p", 10, 20, 61.5)) == f"p: bytes [10, 20) {said}{tail}"
    assert str(past_deadline("p", None, 20, 61.5)) == f"p: the file {said}{tail}"
    assert str(past_deadline("p", 10, None, 61.5)) == f"p: the file {said}{tail}"


def test_a_request_is_given_its_deadline_and_a_timeout_past_it_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP filesystem's request gets its deadline as fsspec's ``timeout``; a timeout raised past the deadline is
    the one naming it, raised from the original, one before it (a connect's) is raised as it was; another
    filesystem's request gets no timeout."""
    http = SimpleNamespace(protocol="https", client_kwargs={})
    given: list[dict] = []
    assert fetch_by_deadline(SimpleNamespace(protocol="s3"), "p", 0, 1, 1, lambda kw: given.append(kw) or b"a") == b"a"
    assert fetch_by_deadline(http, "p", 0, 65_536, 65_536, lambda kw: given.append(kw) or b"b") == b"b"
    assert given == [{}, {"timeout": 61.0}]
    clock = iter([100.0, 161.0])
    monkeypatch.setattr(request_checks, "monotonic", lambda: next(clock))
    late = TimeoutError("late")

    def times_out(kwargs: dict) -> bytes:
        raise late

    with pytest.raises(TimeoutError) as info:
        fetch_by_deadline(http, "p", 0, 65_536, 65_536, times_out)
    assert str(info.value) == str(past_deadline("p", 0, 65_536, 61.0)) and info.value.__cause__ is late
    clock = iter([100.0, 160.9])
    with pytest.raises(TimeoutError) as early:
        fetch_by_deadline(http, "p", 0, 65_536, 65_536, times_out)
    assert early.value is late


@pytest.mark.parametrize(
    ("status", "content_range", "start"),
    [
        (206, "bytes 100-199/5000", 100),
        (206, " BYTES 100-199/* ", 100),
        (200, "", 0),
        (206, "", 100),  # (no Content-Range to tell: the length check's)
        (200, "bytes 100-199/5000", 100),
    ],
)
def test_an_answer_from_the_byte_asked_is_read(status: int, content_range: str, start: int) -> None:
    assert _answered_from("u", start, start + 100, status, content_range) is None


def test_an_answer_from_another_offset_is_refused_before_its_body_is_read() -> None:
    """A whole file (200, no Content-Range) for a range past 0 is a server ignoring Range; a Content-Range from
    another byte a response from another offset (ConnectionError: retried), its URL's credentials masked."""
    with pytest.raises(DatasetError) as whole:
        _answered_from("u", 1, 10, 200, "")
    assert str(whole.value) == str(ignored_range("u"))
    with pytest.raises(ConnectionError) as shifted:
        _answered_from("https://h/f?sig=S3CR&a=1", 0, 10, 206, " bytes 1-10/40 ")
    assert str(shifted.value) == (
        "https://h/f?sig=***&a=1: asked for bytes [0, 10) and answered HTTP 206 with Content-Range 'bytes 1-10/40' (a "
        "response from another offset)"
    )


@pytest.mark.parametrize(
    ("start", "size", "content_range", "said"),
    [
        (
            500,
            500,
            "bytes */500",
            "(the server has 500 bytes of it, the dataset listed it with 500): the range starts at",
        ),
        (
            499,
            500,
            "bytes */500",
            "(the server has 500 bytes of it, the dataset listed it with 500): the server refused",
        ),
        (500, None, " bytes */500 ", "(the server has 500 bytes of it): the file is shorter than"),
        (500, None, "bytes 0-9/500", "(the server gives no size for it): the file is shorter than"),
    ],
)
def test_a_416_is_named_by_where_the_range_lies_at_its_bounds(
    start: int, size: int | None, content_range: str, said: str
) -> None:
    """A range from the listed size's byte on was asked wrongly, one from the byte before it is inside the file; one
    from the server's size on is past the file's end; only ``bytes */N`` gives the server's size."""
    error = _unsatisfiable("https://h/f?sig=S3CR&a=1", start, start + 10, size, content_range)
    assert type(error) is DatasetError
    assert str(error).startswith(
        f"https://h/f?sig=***&a=1: bytes [{start}, {start + 10}) asked, answered HTTP 416 Range Not Satisfiable {said}"
    )


def test_a_416_of_a_file_listed_with_another_size_is_its_change() -> None:
    error = _unsatisfiable("https://h/f?sig=S3CR&a=1", 500, 510, 600, "bytes */400")
    assert str(error) == (
        "https://h/f?sig=***&a=1 changed on the server while it was read (bytes [500, 510) asked, answered HTTP 416 "
        "Range Not Satisfiable: 600 bytes when opened, 400 bytes now); re-open the dataset"
    )


def test_an_empty_range_is_read_without_a_request() -> None:
    assert cat_range(object(), "https://h/f", 7, 7) == b""
