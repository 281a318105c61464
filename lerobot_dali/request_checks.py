"""What one remote request must meet: a total deadline (plain HTTP(S), and the Hub's block fetches), and exactly
the bytes of the range it asked for. A server trickling its bytes, cutting an answer short or ignoring Range fails
the request (a timeout or a short answer: retried; a Range ignored: named) instead of holding it for ever or
shifting every byte after it."""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any

from .remote_errors import ignored_range, multipart_range

__all__ = [
    "HTTP_DEADLINE_BASE_S",
    "HTTP_MIN_BYTES_PER_S",
    "byteranges_framing",
    "bytes_deadline_s",
    "checked_range",
    "fetch_by_deadline",
    "past_deadline",
    "speaks_http",
]

#: A plain HTTP(S) request for ``n`` bytes must end within ``HTTP_DEADLINE_BASE_S + n / HTTP_MIN_BYTES_PER_S``
#: seconds (a 4 MiB block: 124 s; a whole file of unknown size counts as :data:`_UNSIZED_BYTES`), else it fails as a
#: timeout and is retried. aiohttp's read timeout (``sock_read``) restarts at each chunk, so a server trickling a byte
#: every few seconds held a read for ever. Only where the session's timeout sets no total of its own: one given in
#: ``storage_options={"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=...)}}`` is kept for every request.
HTTP_DEADLINE_BASE_S = 60.0
HTTP_MIN_BYTES_PER_S = 64 * 1024
#: The size a deadline is reckoned for where a request's is not known (a metadata file read whole): 256 MiB.
_UNSIZED_BYTES = 256 * 1024 * 1024


def _deadline_s(fs: Any, nbytes: int | None) -> float | None:
    """Seconds a request of HTTP filesystem ``fs`` for ``nbytes`` bytes (None: unknown) may take
    (:func:`bytes_deadline_s`); None where ``fs`` is not HTTP's or its session's timeout sets a total of its own."""
    if not speaks_http(fs):
        return None
    timeout = (getattr(fs, "client_kwargs", None) or {}).get("timeout")
    if timeout is not None and getattr(timeout, "total", None) is not None:
        return None
    return bytes_deadline_s(_UNSIZED_BYTES if nbytes is None else nbytes)


def bytes_deadline_s(nbytes: int) -> float:
    """Seconds a request for ``nbytes`` bytes may take, over plain HTTP(S) or to the Hub (huggingface_hub's client):
    :data:`HTTP_DEADLINE_BASE_S` plus the bytes at :data:`HTTP_MIN_BYTES_PER_S`."""
    return HTTP_DEADLINE_BASE_S + max(0, nbytes) / HTTP_MIN_BYTES_PER_S


def past_deadline(path: str, start: int | None, end: int | None, seconds: float) -> TimeoutError:
    """The error for a request for bytes ``[start, end)`` of ``path`` (the whole file: None) that outlasted its
    deadline (:data:`HTTP_MIN_BYTES_PER_S`): transient, so retried; said with the deadline where the retries end."""
    what = "the file" if start is None or end is None else f"bytes [{start}, {end})"
    return TimeoutError(
        f"{path}: {what} not received within the deadline of {seconds:.1f} s ({HTTP_DEADLINE_BASE_S:g} s plus the "
        f"bytes at {HTTP_MIN_BYTES_PER_S} bytes/s): the server sends too slowly or stalls mid-answer"
    )


def fetch_by_deadline(fs: Any, path: str, start: int | None, end: int | None, nbytes: int | None, fetch: Any) -> Any:
    """``fetch(extra_kwargs)`` (one request of async filesystem ``fs``, through fsspec's ``sync``, for ``nbytes`` bytes
    of ``path``) given the deadline of :func:`_deadline_s` as fsspec's own ``timeout`` (the request cancelled past it);
    a timeout past it raised as :func:`past_deadline`."""
    seconds = _deadline_s(fs, nbytes)
    if seconds is None:
        return fetch({})
    began = monotonic()
    try:
        return fetch({"timeout": seconds})
    except (TimeoutError, asyncio.TimeoutError) as e:  # (fsspec's FSTimeoutError; aiohttp's, a read's or connect's)
        if monotonic() - began < seconds:
            raise
        raise past_deadline(path, start, end, seconds) from e


def checked_range(path: str, start: int, end: int, data: bytes, size: int | None) -> bytes:
    """``data``, the answer to a request for bytes ``[start, end)`` of ``path`` (a file of ``size`` bytes, where
    known), where it holds exactly those: more is a server that ignored the Range (DatasetError naming the fix);
    fewer, where the size tells they exist, a response cut short (ConnectionError: transient, retried)."""
    expected = end - start if size is None else max(0, min(end, size) - start)
    if len(data) > max(0, expected):
        framing = byteranges_framing(data, start, start + expected)
        raise ignored_range(path) if framing is None else multipart_range(path, start, end, framing)
    if size is not None and len(data) != expected:
        raise ConnectionError(
            f"{path}: asked for bytes [{start}, {start + expected}) and received {len(data)} bytes (a response "
            "cut short, or from another offset)"
        )
    return data


def byteranges_framing(data: bytes, start: int, end: int) -> str | None:
    """The Content-Type (``multipart/byteranges; boundary=...``) of ``data``, where it is a multipart body framing
    exactly bytes ``[start, end)`` in its first part (a boundary line, part headers with ``Content-Range: bytes
    {start}-{end - 1}/...``, a blank line, those bytes, the boundary again): what an HTTP read that keeps no headers
    (fsspec's opened files') receives from a server answering one range so. Else None: a whole file sent for a Range
    ignored does not frame the very range asked."""
    if not data.startswith(b"--"):
        return None
    head_end = data.find(b"\r\n\r\n", 0, 4096)
    if head_end < 0:
        return None
    boundary, *headers = data[2:head_end].split(b"\r\n")
    said = [h.partition(b":")[2].strip() for h in headers if h.partition(b":")[0].strip().lower() == b"content-range"]
    after = head_end + 4 + end - start
    asked = f"bytes {start}-{end - 1}/".encode()
    if not said or not said[0].startswith(asked) or data[after : after + 4 + len(boundary)] != b"\r\n--" + boundary:
        return None
    return f"multipart/byteranges; boundary={boundary.decode('ascii', 'replace')}"


def speaks_http(fs: Any) -> bool:
    """Whether ``fs`` reads over plain HTTP(S) (its protocol, which the retry layer and the prefetch cache repeat):
    folders found through HTML index pages (no sizes), reads that can send If-Match."""
    protocol = getattr(fs, "protocol", ())
    return bool({"http", "https"} & set((protocol,) if isinstance(protocol, str) else protocol))
