"""One byte range of a plain HTTP(S) file in one GET, read no further than the bytes asked, a 416 named.

fsspec's HTTP ``cat_file`` reads its answer whole: from a server that ignores Range (200, the whole file) the 10 bytes
the prefetch cache asked of a 32 MiB file read all 33,554,432 (64 MiB at its peak in memory; of a video, its GBs)
before :func:`~.remote_retry.RetryingFileSystem.cat_file` found the answer too long; and a range past the file's end
(answered 416 Range Not Satisfiable: the file shrank on a server giving no ETag) reached the caller as aiohttp's
``ClientResponseError``, naming neither the range nor what to do. This is the same request, through the
filesystem's own session and request options, its answer read until it holds more bytes than asked (then left:
the range check names the server as ignoring Range, as for a Hub range since 690f01e). A subclass of fsspec's
filesystem with reads of its own (its ``_cat_file`` or ``cat_file``: signing, auth) is read through them instead.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from fsspec.asyn import sync

from .errors import DatasetError
from .remote_errors import changed_on_server, ignored_range, multipart_range
from .url_secrets import masked

__all__ = ["cat_range"]

#: HTTP's answer to a Range that no byte of the file satisfies (it starts at or past the file's end).
_RANGE_NOT_SATISFIABLE = 416
#: The most bytes asked of the connection at once.
_CHUNK = 1024 * 1024
#: A ``Content-Range`` of bytes sent (``bytes 100-199/5000``, the size ``*`` where unknown): its first byte's offset.
_SENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-\d+/(?:\d+|\*)\s*", re.IGNORECASE)
#: HTTP's answer with the whole file (to a Range: one ignored).
_WHOLE = 200
#: HTTP's answer with part of a file.
_PARTIAL = 206
#: The media type of a partial answer holding its ranges as parts, each with its own ``Content-Range``.
_BYTERANGES = "multipart/byteranges"


def cat_range(
    fs: Any, url: str, start: int, end: int, *, size: int | None = None, timeout: float | None = None, **kwargs: Any
) -> bytes:
    """Bytes ``[start, end)`` of ``url`` (``0 <= start <= end``) from fsspec HTTP filesystem ``fs``, in one GET with
    ``kwargs`` its request options over the filesystem's (headers given replace its own, as in its ``cat_file``) and
    ``timeout`` seconds in all (fsspec's ``FSTimeoutError`` past it); ``size``: the file's size as the dataset listed
    it, where known. An answer that starts elsewhere than ``start`` (its ``Content-Range``, or a whole file's 200 for
    a range past 0) is refused before its body is read (:func:`_answered_from`); else it is read until it holds more
    than ``end - start`` bytes: a server that ignored the Range is left after about that many, and what came returned
    for the caller's check to name. A 404 is fsspec's FileNotFoundError and any other failing status aiohttp's error,
    as from ``cat_file``; a 416 is a DatasetError naming the file, the range, its sizes and what to do
    (:func:`_unsatisfiable`). Only for a filesystem whose requests this may make (:func:`reads_itself`)."""
    if start == end:
        return b""
    found = sync(fs.loop, _get, fs, url, start, end, kwargs, timeout=timeout)
    if isinstance(found, bytes):
        return found
    raise _unsatisfiable(url, start, end, size, found)


def reads_itself(fs: Any) -> bool:
    """Whether :func:`cat_range` may make ``fs``'s requests itself: ``fs`` is fsspec's HTTPFileSystem or a subclass
    that keeps its reads (``_cat_file``, ``cat_file``) as fsspec wrote them. A subclass's own (a user's, adding a
    signature or a token to each read) were bypassed, its requests made unsigned; another filesystem speaking HTTP
    (fsspec's synchronous one) has no event loop to make them on: each is read through its own ``cat_file``."""
    module = sys.modules.get("fsspec.implementations.http")
    if module is None:  # (never imported: ``fs`` is no HTTPFileSystem, and importing it would load aiohttp)
        return False
    HTTPFileSystem = module.HTTPFileSystem
    kind = type(fs)
    return (
        isinstance(fs, HTTPFileSystem)
        and kind._cat_file is HTTPFileSystem._cat_file
        and kind.cat_file is HTTPFileSystem.cat_file
    )


async def _get(fs: Any, url: str, start: int, end: int, kwargs: dict[str, Any]) -> bytes | str:
    """The bytes of the GET of ``[start, end)`` (at most one more than asked), or a 416's ``Content-Range``."""
    options = {**fs.kwargs, **kwargs}
    headers = {**options.pop("headers", {}), "Range": f"bytes={start}-{end - 1}"}
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **options) as response:
        if response.status == _RANGE_NOT_SATISFIABLE:
            return str(response.headers.get("Content-Range", ""))
        fs._raise_not_found_for_status(response, url)
        if response.status == _PARTIAL and response.content_type == _BYTERANGES:
            raise multipart_range(url, start, end, str(response.headers.get("Content-Type", "")))
        _answered_from(url, start, end, response.status, str(response.headers.get("Content-Range", "")))
        chunks, received = [], 0
        while received <= end - start:  # (more than asked: a Range ignored; not read on)
            chunk = await response.content.read(min(_CHUNK, end - start + 1 - received))
            if not chunk:
                break
            chunks.append(chunk)
            received += len(chunk)
    return b"".join(chunks)


def _answered_from(url: str, start: int, end: int, status: int, content_range: str) -> None:
    """Check, before its body is read, that the answer (HTTP ``status``, ``Content-Range``) to a GET of bytes
    ``[start, end)`` of ``url`` starts at ``start``. A whole file (200 and no Content-Range: from byte 0) answered to
    a range past 0 is a server that ignored the Range (DatasetError naming the fix); a range from another offset is a
    response from another offset (ConnectionError: transient, retried). Both were handed out as the bytes asked where
    no more came than asked: a file shorter than ``end`` not listed with its size, a range from elsewhere as long."""
    match = _SENT_RANGE.fullmatch(content_range)
    first = int(match.group(1)) if match else (0 if status == _WHOLE else None)
    if first is None or first == start:
        return
    if match is None:
        raise ignored_range(url)
    raise ConnectionError(
        masked(
            f"{url}: asked for bytes [{start}, {end}) and answered HTTP {status} with Content-Range "
            f"{content_range.strip()!r} (a response from another offset)"
        )
    )


def _unsatisfiable(url: str, start: int, end: int, size: int | None, content_range: str) -> DatasetError:
    """The error for bytes ``[start, end)`` of ``url`` answered 416: where the dataset listed the file with a ``size``
    other than the server's now (its ``Content-Range: bytes */N``), the file's change (:func:`changed_on_server`);
    else, with its sizes where known, a range starting past the end of the file as listed (asked wrongly: the
    package's reads ask ranges inside the size the file was opened with, its parquet footer's and row groups', and
    its videos' packets, which their index holds inside the size it was built for; fsspec's ``cat_file`` raises too),
    a range inside the file as the server gives it (the server's fault), or one past the file's end as the server has
    it (the file shrank: re-open)."""
    match = re.fullmatch(r"\s*bytes\s+\*/(\d+)\s*", content_range)
    now = int(match.group(1)) if match else None
    asked = f"bytes [{start}, {end}) asked, answered HTTP 416 Range Not Satisfiable"
    if size is not None and now is not None and now != size:
        return changed_on_server(url, f"{asked}: {size} bytes when opened, {now} bytes now")
    has = "gives no size for it" if now is None else f"has {now} bytes of it"
    listed = "" if size is None else f", the dataset listed it with {size}"
    if size is not None and start >= size:
        why = (
            "the range starts at or past the end of the file as the dataset listed it, so it was asked wrongly (the "
            "dataset's own reads ask none such: please report how it was asked); re-opening the dataset will not help"
        )
    elif now is not None and start < now:
        why = (
            "the server refused a range inside the file as it gives it, a fault of the server or of a proxy or CDN "
            "on the way; try again later, or copy the dataset locally"
        )
    else:
        why = (
            "the file is shorter than the range was reckoned for; if it changed on the server, re-open the dataset "
            "to read it as it is now"
        )
    return DatasetError(masked(f"{url}: {asked} (the server {has}{listed}): {why}"))
