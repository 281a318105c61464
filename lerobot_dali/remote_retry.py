"""Retries for remote bulk reads: a transient network failure must cost a delay, not a training run.

A multi-day job reads millions of ranges from S3, GCS or the Hub; some of them will time out, hit a 503 or
a 429, or see a connection reset. :class:`RetryingFileSystem` wraps any fsspec filesystem and redoes those
requests (and reads on the files it opens, from the same offset, on a freshly opened file) with capped
exponential backoff. Errors that retrying cannot fix (missing file, no permission, a malformed dataset)
are raised at once, so a real mistake still fails fast; a 404 for a file the dataset's open found (stamped) is asked
about again within the retry budget first, since a CDN or an eventually consistent store may answer one for a while
for a file it serves. A refusal (HTTP 401/403), and a failure the retries gave up on, is raised as
:class:`~lerobot_dali.errors.RemoteFileError` naming the file and what to do, the client's error as its cause; every
plain HTTP(S) request has a total deadline (:data:`HTTP_DEADLINE_BASE_S`), which a server trickling its bytes reaches.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import inspect
import io
import logging
import os
import re
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from time import monotonic
from typing import Any, NoReturn, TypeVar

import fsspec

from . import io_stats
from .errors import DatasetError, MissingDataFileError, RemoteFileError
from .said_once import warn_once
from .url_secrets import mask_error, mask_request_logs, masked, masking

__all__ = [
    "HTTP_DEADLINE_BASE_S",
    "HTTP_MIN_BYTES_PER_S",
    "IF_MATCH_ENV",
    "REFUSED_HINT",
    "RETRIES_ENV",
    "RetryPolicy",
    "RetryingFile",
    "RetryingFileSystem",
    "StampUntold",
    "changed_on_server",
    "fresh_instance",
    "is_missing",
    "is_refused",
    "is_transient",
    "missing_status",
    "retried",
    "speaks_http",
    "told_change",
]

logger = masking(logging.getLogger(__name__))  # (paths that keep a URL's query name it masked)

#: Environment variable holding the default retry budget (0 disables retries). A request huggingface_hub retries itself
#: (a Hub listing's, :func:`_hub_tries`) keeps its own 6 tries instead.
RETRIES_ENV = "LEROBOT_DALI_REMOTE_RETRIES"
#: ``0`` sends no ``If-Match`` (nor ``If-Unmodified-Since``: :meth:`RetryingFileSystem._pinned`): for servers whose ETag
#: (Last-Modified) for one file differs between their machines (behind a load balancer), which would answer reads 412
#: that re-opening cannot mend.
IF_MATCH_ENV = "LEROBOT_DALI_IF_MATCH"

_T = TypeVar("_T")

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EHOSTUNREACH,
        errno.EAGAIN,
    }
)
_TRANSIENT_STATUS = frozenset({408, 425, 429})
_TRANSIENT_MESSAGES = (
    "client has been closed",
    "connection reset",
    "connection aborted",
    "connection broken",
    "server disconnected",
    "timed out",
    "timeout",
    "temporarily unavailable",
    "too many requests",
    "slow down",
)
#: Exception class names of HTTP client libraries that mean "the network hiccupped", matched by name so
#: this module imports none of them.
_TRANSIENT_TYPE_NAMES = frozenset(
    {
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "ConnectionError",
        "ChunkedEncodingError",
        "ReadTimeout",
        "ConnectTimeout",
        "Timeout",
        "TimeoutError",
        "RemoteDisconnected",
        "IncompleteRead",
        "ProtocolError",
        "ReadTimeoutError",
        "NetworkError",  # httpx's (huggingface_hub's client): ConnectError, ReadError, WriteError, CloseError
        "TimeoutException",  # httpx's: PoolTimeout, WriteTimeout too
    }
)


def _default_retries() -> int:
    raw = os.environ.get(RETRIES_ENV, "5")
    try:
        value = int(raw)
    except ValueError as e:
        raise ValueError(f"{RETRIES_ENV}={raw!r} is not an integer; set it to 0 (fail fast) or a positive count") from e
    if value < 0:
        raise ValueError(f"{RETRIES_ENV}={raw!r} is negative; set it to 0 (fail fast) or a positive count")
    return value


def _if_match_on() -> bool:
    raw = os.environ.get(IF_MATCH_ENV, "1")
    if raw not in ("0", "1"):
        raise ValueError(f"{IF_MATCH_ENV}={raw!r}: set it to 1 (reads ask for the ETag seen at open) or 0 (none)")
    return raw == "1"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to redo a transient failure.

    ``retries`` extra attempts follow the first one (0 = fail fast). The wait before retry ``n`` (1-based)
    is ``min(max_delay_s, base_delay_s * 2 ** (n - 1))`` scaled by a jitter in [0.5, 1.0] derived from the
    path and attempt, so workers hitting the same outage spread out without any shared random state.
    """

    retries: int = field(default_factory=_default_retries)
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0 (0 = fail fast), got {self.retries!r}")
        if not self.base_delay_s >= 0 or not self.max_delay_s >= 0:
            raise ValueError(
                f"base_delay_s and max_delay_s must be >= 0, got {self.base_delay_s!r} and {self.max_delay_s!r}"
            )
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(f"max_delay_s ({self.max_delay_s}) must be >= base_delay_s ({self.base_delay_s})")

    def delay_s(self, attempt: int, key: str = "") -> float:
        """Seconds to wait before retry ``attempt`` (1-based) of the request named ``key``."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        capped = min(self.max_delay_s, self.base_delay_s * 2.0 ** min(attempt - 1, 60))
        jitter = 0.5 + 0.5 * (zlib.crc32(f"{key}#{attempt}".encode()) / 0xFFFFFFFF)
        return capped * jitter


def _status_of(error: BaseException) -> int | None:
    for candidate in (error, getattr(error, "response", None)):
        if candidate is None:
            continue
        for name in ("status", "status_code", "code"):
            value = getattr(candidate, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def is_transient(error: BaseException) -> bool:
    """True when redoing the same request may succeed: timeouts, resets, HTTP 408/425/429/5xx.

    Missing files, permissions, invalid values and dataset errors are never transient: retrying them only
    delays the message the user needs.
    """
    if isinstance(error, FileNotFoundError) and error.__cause__ is not None and error is not error.__cause__:
        # fsspec's HTTP ``info`` answers any failed GET with ``FileNotFoundError(url) from <the HTTP error>``:
        # a 503 behind it is an outage, not a missing file.
        return not isinstance(error.__cause__, FileNotFoundError) and is_transient(error.__cause__)
    if isinstance(error, RemoteFileError):  # (retries given up on: a network failure still, a refusal not)
        return error.__cause__ is not None and is_transient(error.__cause__)
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, DatasetError)):
        return False
    if type(error).__name__ == "OfflineModeIsEnabled":  # (HF_HUB_OFFLINE set, a ConnectionError: no retry reaches)
        return False
    status = _status_of(error)
    if status is not None:
        return status in _TRANSIENT_STATUS or 500 <= status <= 599
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    if isinstance(error, ValueError):
        return False
    if any(cls.__name__ in _TRANSIENT_TYPE_NAMES for cls in type(error).__mro__):
        return True
    # An OSError's (or PyAV error's) str() holds its filename, and a folder named "timeouts" is not a timeout.
    strerror = getattr(error, "strerror", None)
    message = (strerror if isinstance(strerror, str) else str(error)).lower()
    return any(text in message for text in _TRANSIENT_MESSAGES)


def fresh_instance(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """A new client of ``fs``'s class and arguments, bypassing fsspec's instance cache.

    Used as ``fresh_client`` hook: a session that was closed or poisoned (aiohttp "client has been closed")
    keeps failing however often the same object retries.
    """
    cls = type(fs)
    cls.clear_instance_cache()
    return cls(*fs.storage_args, **fs.storage_options)


#: The longest wait a server's ``Retry-After`` may ask for; a longer one is cut to this.
MAX_RETRY_AFTER_S = 300.0
#: The IETF draft ``RateLimit`` header (``"api";r=0;t=55``: 0 requests remain, the window resets in 55 s), which
#: the Hub sends with its 429s.
_RATELIMIT = re.compile(r"\br=(?P<remaining>\d+)\s*;\s*t=(?P<reset>\d+)")


def _retry_after_s(error: BaseException) -> float:
    """Seconds a 429/503 asked to wait (``Retry-After``: seconds, or an HTTP date; else a ``RateLimit`` header
    saying none remain), at most :data:`MAX_RETRY_AFTER_S`; 0 without one. Retrying sooner only spends the retries
    inside the rate limit."""
    for candidate in (error, error.__cause__, getattr(error, "response", None)):
        headers = getattr(candidate, "headers", None)
        if not isinstance(headers, Mapping):
            continue
        value = headers.get("Retry-After")
        if value is None:
            match = _RATELIMIT.search(str(headers.get("RateLimit", "")))
            if match is not None and int(match["remaining"]) == 0:  # (the Hub's 429: no request left for t s)
                return min(MAX_RETRY_AFTER_S, float(match["reset"]))
            continue
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(str(value)).timestamp() - time.time()
            except (TypeError, ValueError):
                continue
        return min(MAX_RETRY_AFTER_S, max(0.0, seconds))
    return 0.0


def _unmasked(error: Exception) -> Exception:
    """The HTTP error behind fsspec's ``FileNotFoundError(url) from <whatever its GET hit>`` (its HTTP ``info``)
    when that was not a 404/410: an outage past the retries (a refused connection too), or a denied access,
    reported as a missing file sent users looking for a file that is there."""
    cause = error.__cause__
    if (
        isinstance(error, FileNotFoundError)
        and isinstance(cause, Exception)
        and not isinstance(cause, FileNotFoundError)
    ):
        status = _status_of(cause)
        if (status is not None and status not in (404, 410)) or (status is None and is_transient(cause)):
            return cause
    return error


def _one_try_hub_fetch(inner: Any, path: str) -> Callable[[int, int], bytes] | None:
    """For a huggingface_hub ``HfFileSystemFile`` (of ``path``): its block fetch, tried once, within the deadline of
    a plain HTTP request (:func:`_bytes_deadline_s`); None for other files.

    Its own ``_fetch_range`` goes through ``http_backoff``'s 6 tries (1 to 8 s apart, ``Retry-After`` + 1 s after a
    429), inside each of this module's: one block of a Hub dataset that kept answering 503 or 429, or cut its
    response short, was asked 36 times (~150 s of waits without Retry-After, not the ~15 s of the policy's 6 tries),
    and ``LEROBOT_DALI_REMOTE_RETRIES=0`` still waited 23 s. This is the same request (its URL and headers), made once:
    the retrying, and the waits a 429 asks for, are this module's. huggingface_hub's timeout
    (``HF_HUB_DOWNLOAD_TIMEOUT``) is httpx's read timeout, restarted at each chunk, so the answer is streamed and the
    deadline checked at each chunk: a server trickling its bytes fails the fetch as a timeout (retried) at most one
    read timeout past it.
    """
    api = getattr(getattr(inner, "fs", None), "_api", None)
    if type(inner).__name__ != "HfFileSystemFile" or not hasattr(inner, "url") or not hasattr(api, "_build_hf_headers"):
        return None  # (another huggingface_hub's file: its own fetch, retries and all, as before)
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    def fetch(start: int, end: int) -> bytes:
        headers = {"range": f"bytes={start}-{end - 1}", **inner.fs._api._build_hf_headers()}
        seconds = _bytes_deadline_s(end - start)
        began = monotonic()
        chunks = []
        with http_stream_backoff(
            "GET", inner.url(), headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, max_retries=0
        ) as response:
            hf_raise_for_status(response)
            received = 0
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                received += len(chunk)
                if received > end - start:  # (a Range ignored, the whole file sent: :func:`_checked_range` names it)
                    break
                if monotonic() - began > seconds:
                    raise _past_deadline(path, start, end, seconds)
        return b"".join(chunks)

    return fetch


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
    (:func:`_bytes_deadline_s`); None where ``fs`` is not HTTP's or its session's timeout sets a total of its own."""
    if not speaks_http(fs):
        return None
    timeout = (getattr(fs, "client_kwargs", None) or {}).get("timeout")
    if timeout is not None and getattr(timeout, "total", None) is not None:
        return None
    return _bytes_deadline_s(_UNSIZED_BYTES if nbytes is None else nbytes)


def _bytes_deadline_s(nbytes: int) -> float:
    """Seconds a request for ``nbytes`` bytes may take, over plain HTTP(S) or to the Hub (huggingface_hub's client):
    :data:`HTTP_DEADLINE_BASE_S` plus the bytes at :data:`HTTP_MIN_BYTES_PER_S`."""
    return HTTP_DEADLINE_BASE_S + max(0, nbytes) / HTTP_MIN_BYTES_PER_S


def _past_deadline(path: str, start: int | None, end: int | None, seconds: float) -> TimeoutError:
    """The error for a request for bytes ``[start, end)`` of ``path`` (the whole file: None) that outlasted its
    deadline (:data:`HTTP_MIN_BYTES_PER_S`): transient, so retried; said with the deadline where the retries end."""
    what = "the file" if start is None or end is None else f"bytes [{start}, {end})"
    return TimeoutError(
        f"{path}: {what} not received within the deadline of {seconds:.1f} s ({HTTP_DEADLINE_BASE_S:g} s plus the "
        f"bytes at {HTTP_MIN_BYTES_PER_S} bytes/s): the server sends too slowly or stalls mid-answer"
    )


def _fetch_by_deadline(fs: Any, path: str, start: int | None, end: int | None, nbytes: int | None, fetch: Any) -> Any:
    """``fetch(extra_kwargs)`` (one request of async filesystem ``fs``, through fsspec's ``sync``, for ``nbytes`` bytes
    of ``path``) given the deadline of :func:`_deadline_s` as fsspec's own ``timeout`` (the request cancelled past it);
    a timeout past it raised as :func:`_past_deadline`."""
    seconds = _deadline_s(fs, nbytes)
    if seconds is None:
        return fetch({})
    began = monotonic()
    try:
        return fetch({"timeout": seconds})
    except (TimeoutError, asyncio.TimeoutError) as e:  # (fsspec's FSTimeoutError; aiohttp's, a read's or connect's)
        if monotonic() - began < seconds:
            raise
        raise _past_deadline(path, start, end, seconds) from e


def _check_block_fetches(inner: Any, path: str) -> None:
    """Make the block fetches of an fsspec buffered file (HTTP's) return exactly the bytes asked, or fail.

    fsspec's read-ahead cache places a response where its request would have put it, so a response cut short
    (or answered from another offset) shifted every byte after it, and the first reader of the file (the packet
    index) stored wrong keyframe flags for good. A short block is a transient failure, redone on a fresh open;
    a server that ignores Range fails with fsspec's ValueError, which names neither the file nor a fix.
    """
    cache, size = getattr(inner, "cache", None), getattr(inner, "size", None)
    fetch = getattr(cache, "fetcher", None)
    if fetch is None or not isinstance(size, int):
        return
    fetch = _one_try_hub_fetch(inner, path) or fetch

    hub_fetch = fetch is not getattr(cache, "fetcher", None)  # (its own client, its own deadline)

    def fetch_once(start: int, end: int, extra: dict[str, Any]) -> bytes:
        return bytes(fetch(start, end, **extra))  # (HTTPFile's: fsspec's sync wrapper, which takes a timeout)

    def checked(start: int, end: int) -> bytes:
        try:
            if hub_fetch:
                data = fetch(start, end)
            else:
                data = _fetch_by_deadline(
                    getattr(inner, "fs", None), path, start, end, end - start, partial(fetch_once, start, end)
                )
        except ValueError as e:
            if "range requests" not in str(e):
                raise
            raise _ignored_range(path) from e
        return _checked_range(path, start, end, data, size)

    cache.fetcher = checked  # type: ignore[union-attr]  # (fetch is not None: neither is cache)


def _ignored_range(path: str) -> DatasetError:
    return _error(
        f"{path}: the server ignored an HTTP Range request (it sent the whole file), which reading a part "
        "of a file needs; serve the dataset from a server that supports Range requests, or copy it locally"
    )


def _checked_range(path: str, start: int, end: int, data: bytes, size: int | None) -> bytes:
    """``data``, the answer to a request for bytes ``[start, end)`` of ``path`` (a file of ``size`` bytes, where
    known), where it holds exactly those: more is a server that ignored the Range (DatasetError naming the fix);
    fewer, where the size tells they exist, a response cut short (ConnectionError: transient, retried)."""
    expected = end - start if size is None else max(0, min(end, size) - start)
    if len(data) > max(0, expected):
        raise _ignored_range(path)
    if size is not None and len(data) != expected:
        raise ConnectionError(
            f"{path}: asked for bytes [{start}, {start + expected}) and received {len(data)} bytes (a response "
            "cut short, or from another offset)"
        )
    return data


def _is_hub(fs: Any) -> bool:
    """Whether ``fs`` is huggingface_hub's ``HfFileSystem`` (matched by name: this module imports no client)."""
    return type(fs).__name__ == "HfFileSystem"


def speaks_http(fs: Any) -> bool:
    """Whether ``fs`` reads over plain HTTP(S) (its protocol, which the retry layer and the prefetch cache repeat):
    folders found through HTML index pages (no sizes), reads that can send If-Match."""
    protocol = getattr(fs, "protocol", ())
    return bool({"http", "https"} & set((protocol,) if isinstance(protocol, str) else protocol))


def _http_date(text: str) -> bool:
    """Whether ``text`` is an HTTP date (a ``Last-Modified``), which ``If-Unmodified-Since`` can send back."""
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError):
        return False


class StampUntold(ValueError):
    """A remote file's stamp asked again (:meth:`FileStamps.change_now <lerobot_dali.file_stamps.FileStamps.
    change_now>`), answered with neither its size (no Content-Length to a HEAD, no Content-Range to a ranged GET) nor
    its version (no ETag, Last-Modified or hash): an answer that tells nothing of the file, not a missing one."""


def _error(message: str) -> DatasetError:
    """The DatasetError saying ``message``, the credentials of the paths it names masked (:func:`.masked`): a
    filesystem that keeps a URL's query in its paths (``memory://b/ds?token=...``) named them in each."""
    return DatasetError(masked(message))


def changed_on_server(path: str, how: str, *, if_match_unsure: bool = False) -> DatasetError:
    """The error for remote file ``path`` found changed since the dataset was opened (``how``: its size, or its
    version: ETag, hash, mtime): its bytes read now, mixed with what was read, cached or indexed of the old ones, are
    neither file, so neither retrying nor mending the file helps. ``if_match_unsure``: told by a 412 to its If-Match
    alone, which the server, asked again, did not confirm (it gives no ETag now, or refused, or gave no answer): the
    way out of a server whose If-Match or ETags are unreliable (machines behind a load balancer, a CDN that drops
    ETags) is named, :data:`IF_MATCH_ENV`."""
    unsure = (
        f" (or, if it did not change and the server's If-Match or ETags are unreliable, set {IF_MATCH_ENV}=0 to read "
        "without If-Match)"
        if if_match_unsure
        else ""
    )
    return _error(f"{path} changed on the server while it was read ({how}); re-open the dataset{unsure}")


def told_change(change: tuple[str, str]) -> str:
    """A file's change as :func:`changed_on_server` says it, from ``(when opened, now)``
    (:meth:`FileStamps.change_now <lerobot_dali.file_stamps.FileStamps.change_now>`'s)."""
    return f"{change[0]} when opened, {change[1]} now"


#: HTTP's answer to a read whose ``If-Match`` names another ETag than the file's (:meth:`RetryingFileSystem._pinned`).
_PRECONDITION_FAILED = 412


def _sent_only_whole(path: str, why: str) -> DatasetError:
    """The error for a file fsspec can only stream from its start (HTTP's streaming file: the server answered
    ``Accept-Ranges: none`` or gave no size): reading a part of it, as parquet and MP4 readers do, cannot work."""
    return _error(
        f"{path}: the server sends this file only whole ({why}), and reading a part of a file needs HTTP Range "
        "requests and its size; serve the dataset from a server that supports Range requests and sends "
        "Content-Length, or copy it locally"
    )


#: What to do about a remote file the server refused (HTTP 401/403): said with the error, never retried.
REFUSED_HINT = (
    "a private or gated file needs credentials that grant it: for a Hub dataset log in (`hf auth login`) or pass "
    "storage_options={'token': ...}, and accept a gated dataset's terms on its page; for another server pass its "
    "credentials in storage_options"
)


def is_refused(error: BaseException) -> bool:
    """True when a remote server refused the request: HTTP 401/403 (a filesystem's PermissionError is one only
    where a remote filesystem raised it)."""
    return _status_of(error) in (401, 403)


def _refused(error: Exception, what: str, path: str) -> Exception:
    """``error`` (a refusal) with a note naming the request and :data:`REFUSED_HINT`: aiohttp's says only
    "403, message='Forbidden'", which tells neither that retrying is useless nor what to pass."""
    note = f"lerobot_dali: {what} {path!r} was refused (not retried): {REFUSED_HINT}"
    if sys.version_info >= (3, 11) and note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error


def _hub_tries(error: BaseException) -> int:
    """How often huggingface_hub's own backoff (``http_backoff``: 6 tries, 1 to 8 s apart, a 429's ``Retry-After`` or
    ``RateLimit`` + 1 s) tried the request ``error`` ends, where it gave up after retrying (its loop's frame in the
    traceback, or in its causes' tracebacks: :func:`_traceback_frames`, past its ``max_retries``); 0 where it did not
    retry it (it retries no ``repo_info`` or ``paths-info``) or did not make it.

    Its tree requests (HfFileSystem's ``ls``, ``find``, and ``info``, which lists the parent folder) go through it: each
    of this module's tries of a listing of a Hub dataset that kept answering 503 or 429 was 6 requests (36 with the
    default 5 retries, ~2.5 minutes of waits without ``Retry-After``; 6 with retries=0). Such a request has had its
    retries (:data:`RETRIES_ENV` does not reach them): retrying it here only stacked its policy inside this one's. Its
    loop is found by its code (a private name: a huggingface_hub that renames it gets 0, the two stacked as before).

    A file's download (``hf_hub_download``: the metadata's) streams its body through ``http_get``, which tries again
    itself, from the byte it got to, on a connection dropped or timed out (6 tries, 1 s apart, its count restarted by
    each byte received): one of its frames per try, the last with ``_nb_retries`` spent. A metadata file whose body
    kept dropping was 6 GETs in each of this module's tries (36, ~43 s, with the default 5 retries; a stalled one 36
    read timeouts, ~6 minutes).
    """
    hub_http = sys.modules.get("huggingface_hub.utils._http")
    loop = getattr(getattr(hub_http, "_http_backoff_base", None), "__code__", None)
    get = getattr(sys.modules.get("huggingface_hub.file_download"), "http_get", None)
    get = getattr(inspect.unwrap(get), "__code__", None) if callable(get) else None  # (under its argument check)
    gets: list[Any] = []
    for frame, _ in _traceback_frames(error):
        if loop is not None and frame.f_code is loop:
            tries, retries = frame.f_locals.get("nb_tries"), frame.f_locals.get("max_retries")
            if isinstance(tries, int) and isinstance(retries, int) and 0 < retries < tries:
                return tries
        if get is not None and frame.f_code is get:
            gets.append(frame)
    left = gets[-1].f_locals.get("_nb_retries") if gets else None
    return len(gets) if len(gets) > 1 and isinstance(left, int) and left <= 0 else 0


def _traceback_frames(error: BaseException) -> list[tuple[Any, int]]:
    """The frames (with line numbers) ``error`` passed through, those of its causes first: huggingface_hub raises its
    ``LocalEntryNotFoundError`` from the error its request ended with, whose traceback holds its retry loop's frames."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__
    return [step for cause in reversed(chain) for step in traceback.walk_tb(cause.__traceback__)]


def _exhausted(error: BaseException, what: str, path: str, attempts: int, *, hub: bool = False) -> RemoteFileError:
    """The error for ``what`` on ``path`` that failed ``attempts`` times, the last with ``error`` (its cause)."""
    retry = "huggingface_hub's own retries spent" if hub else f"set {RETRIES_ENV} to retry more"
    note = f"lerobot_dali: {what} {path!r} failed {attempts} time(s); gave up ({retry})"
    said = _first_line(error)
    logger.warning("%s (last error %s: %s)", note, type(error).__name__, said)
    if sys.version_info >= (3, 11):
        error.add_note(note)
    return RemoteFileError(
        masked(
            f"{path}: {what} failed {attempts} time(s), the last with {type(error).__name__}: {said}; gave up: check "
            f"the connection and the server, or {retry}"
        ),
        _status_of(error),
    )


def _first_line(error: BaseException) -> str:
    """``error``'s message's first line, for a log line or our message: huggingface_hub's go on for lines (a link to
    the status's page, the server's body), which stay on the error itself (the cause, its traceback)."""
    return (str(error).strip().splitlines() or ["(no message)"])[0]


def _refused_error(error: BaseException, what: str, path: str) -> RemoteFileError:
    """The error for ``what`` on ``path`` that the server refused with ``error`` (its cause): HTTP 401/403."""
    status = _status_of(error)
    return RemoteFileError(
        masked(
            f"{path}: {what} was refused (not retried): {REFUSED_HINT} (the server answered "
            f"{type(error).__name__}: {str(error) or '(no message)'})"
        ),
        status if status is not None else 403,
    )


def _raise_as_itself(error: BaseException) -> NoReturn:
    """Raise ``error`` (a failure the retries end with) with its own cause: huggingface_hub's ``HfHubHTTPError`` is
    raised from httpx's error, s3fs's ``OSError`` from botocore's (with the request's id), and ``raise error from
    None`` took it off them. The retry loop's context (the tries before, the FileNotFoundError fsspec wrapped it in)
    stays out of the traceback, as ``from None`` kept it."""
    raise error from error.__cause__


def _raise_from(error: RemoteFileError, cause: BaseException) -> NoReturn:
    """Raise ``error`` from ``cause`` (the HTTP client's error), the retry loop's context kept out of the traceback:
    the user meets the package's error naming the file, the client's below it (aiohttp's ClientResponseError, say, or
    fsspec's FileNotFoundError without context, as it reached users before)."""
    error.__suppress_context__ = True
    raise error from cause


def _given_yet_missing(path: str, missed: int) -> DatasetError:
    """The error for stamped ``path`` whose reads the server answered 404 ``missed`` times while, asked after each
    (:meth:`RetryingFileSystem._removed_now`), it never said the file was gone: it gave it as stamped, or (where the
    read asks for the stamped version itself) no answer. Not its removal, which the server did not say."""
    return _error(
        f"{path}: answered 'no such file' (HTTP 404) {missed} times, while the server, asked after each, never said "
        f"it was gone (it gave the file as stamped, or no answer: a CDN's or a cache's stale 404, or an outage?); gave "
        f"up (set {RETRIES_ENV} to retry more)"
    )


def _unanswered(path: str, answer: str) -> DatasetError:
    """The error for stamped ``path`` whose read the server answered 404, and which, asked again whether it has the
    file (one ``info``, sent without If-Match), ``answer``: 'refused it (HTTP 403)', 'gave no answer'. Not its
    removal, which the server did not say."""
    return _error(
        f"{path}: answered 'no such file' (HTTP 404), and the server, asked again whether it has the file, {answer}: "
        f"whether it was removed cannot be told; gave up (set {RETRIES_ENV} to retry more)"
    )


def _refused_without_if_match(path: str, status: int | None) -> DatasetError:
    """The error for a read of ``path`` that the server answered 412 to its If-Match (of the ETag it still gives, so
    it is sent again without one: :meth:`RetryingFileSystem._precondition_failed`), then refused without it."""
    return _error(
        f"{path}: the server answered HTTP 412 to the If-Match of the ETag it gives for the file, then refused the "
        f"read sent again without If-Match (HTTP {status or 403}): it serves the file neither way; check the "
        f"credentials ({REFUSED_HINT}), or read the dataset from a server whose If-Match agrees with its ETags"
    )


def _precondition_without_if_match(path: str) -> DatasetError:
    """The error for a read of ``path`` that the server answered 412 to its If-Match (of the ETag it still gives: sent
    again without one, :meth:`RetryingFileSystem._precondition_failed`), then 412 again without it: a precondition not
    ours failed (the server's own, or a header the storage options send), which no retry mends."""
    return _error(
        f"{path}: the server answered HTTP 412 to the read sent again without If-Match too: a precondition other than "
        "ours fails (the server's own, or a header the storage options send: If-Match, If-Unmodified-Since); check "
        "those headers and the server"
    )


def _not_served(path: str, status: int | None) -> MissingDataFileError:
    """The error for a read of ``path`` (never stamped) the server answered it has no such file, HTTP 404 or 410, with
    its HTTP client's error (huggingface_hub's HfHubHTTPError of every Hub read; aiohttp's of a plain HTTP(S) read of
    a file opened with its size), not the FileNotFoundError fsspec raises for one elsewhere: the package's missing
    file, as a plain HTTP(S) file's absence reaches the user (fsspec's FileNotFoundError, named by the reader)."""
    return MissingDataFileError(
        f"{path}: the server has no such file (HTTP {status or 404}): check the revision (branch, tag or commit) or "
        "URL the dataset is read at, and that the file is there: upload or copy it again where it was removed, or "
        "leave out the episodes it holds (episodes=[...] of the others)",
        status or 404,
    )


#: The requests of :class:`_Retrier` that read a file's bytes (an open's HEAD too), whose 404 may be its removal.
_READS = frozenset({"open", "read", "cat_file"})


def is_missing(error: BaseException) -> bool:
    """Whether the server answered a request that it has no such file: 404 or 410 (aiohttp's ClientResponseError of
    fsspec's HTTP range reads), or FileNotFoundError (its other requests', an object store's); not fsspec's HTTP
    ``info``'s FileNotFoundError raised from another failure (a 503, a refused 403: no answer about the file)."""
    answer = _unmasked(error) if isinstance(error, Exception) else error
    return _status_of(answer) in (404, 410) or (
        isinstance(answer, FileNotFoundError) and not isinstance(answer, DatasetError)
    )


def missing_status(error: BaseException) -> int | None:
    """The HTTP status (404, 410) a server answered that it has no such file, of ``error`` or its cause (fsspec's HTTP
    ``info`` raises FileNotFoundError from its client's 404): a MissingDataFileError's ``status``; None where no
    server said so (a local file, a listing that lacks the file, an object store's FileNotFoundError)."""
    for answer in (error, error.__cause__):
        status = _status_of(answer) if answer is not None else None
        if status in (404, _GONE):
            return status
    return None


#: HTTP's answer for a file removed for good (:func:`_is_gone`).
_GONE = 410


def _is_gone(error: BaseException) -> bool:
    """Whether the server answered 410 Gone (itself, or behind fsspec's FileNotFoundError of its HTTP ``info``): the
    file's absence "likely to be permanent" (RFC 9110, 15.5.11), where a 404 says nothing of how long it lasts."""
    return _GONE in (_status_of(error), _status_of(error.__cause__) if error.__cause__ is not None else None)


def retried(what: str, path: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` (a request named ``what`` of ``path`` not made through a :class:`RetryingFileSystem`: huggingface_hub's
    download of a Hub dataset's metadata), its transient failures redone under the default :class:`RetryPolicy`
    (:data:`RETRIES_ENV`) with the waits and log lines of the data reads, and given up on as
    :class:`~lerobot_dali.errors.RemoteFileError`; another error raised at once (a refusal as RemoteFileError)."""
    return _Retrier(RetryPolicy(), None).call(what, path, fn)


class _Retrier:
    """The loop shared by the filesystem and its files: try, classify, wait, maybe refresh the client."""

    def __init__(
        self,
        policy: RetryPolicy,
        fresh_client: Callable[[], Any] | None,
        precondition_failed: Callable[[str], Exception | None] | None = None,
        removed: Callable[[str], Exception | None] = lambda path: None,
        removed_now: Callable[[str], tuple[Exception | None, bool]] = lambda path: (None, False),
        confirmable: Callable[[str], bool] = lambda path: False,
    ) -> None:
        self.policy = policy
        self.fresh_client = fresh_client
        #: The error for a read of a path answered 404 (RetryingFileSystem._removed), or None: the 404's own.
        self.removed = removed
        #: For a path :attr:`removed` names, the server asked once more (RetryingFileSystem._removed_now): ``(error,
        #: settled)``: a change raised at once (settled), the removal (not settled: asked again while retries remain),
        #: or ``(None, _)`` where it serves the file as stamped (the 404 passed).
        self.removed_now = removed_now
        #: Whether the server asked again can tell a path :attr:`removed` names from a file put in its place
        #: (RetryingFileSystem._confirmable); where not, its 404 is the removal at once.
        self.confirmable = confirmable
        #: The error for a read of a path answered 412 to its If-Match (RetryingFileSystem._precondition_failed); None:
        #: read it again at once (the filesystem sends no If-Match any more).
        self.precondition_failed = precondition_failed or (
            lambda path: changed_on_server(path, "its ETag when opened no longer matches: HTTP 412")
        )

    def call(self, what: str, path: str, fn: Callable[[], _T], before_retry: Callable[[int], None] | None = None) -> _T:
        """``fn()``, retried; what it raises at last (its own error, ours naming ``path``, their notes and causes) with
        the credentials it names masked (:func:`.mask_error`: a path that keeps a URL's query names them)."""
        try:
            return self._call(what, path, fn, before_retry)
        except Exception as e:
            mask_error(e)
            raise

    def _call(self, what: str, path: str, fn: Callable[[], _T], before_retry: Callable[[int], None] | None) -> _T:
        attempt = 0
        missed = 0  # (404s of a stamped file: the server, asked again after each but the last, did not call it gone)
        unpinned = False  # (answered 412 to the If-Match of the ETag the server still gives: sent again without it)
        while True:
            try:
                io_stats.add("requests")
                io_stats.add(f"requests.{what}")
                with io_stats.timed("fetch_s"):
                    result = fn()
                if isinstance(result, (bytes, bytearray)):
                    io_stats.add("fetched_bytes", len(result))
                return result
            except Exception as e:
                mask_error(e)  # (aiohttp's errors name the request's URL with its query: a signed URL's signature)
                if isinstance(e, DatasetError):  # (ours, naming the file: a request of its own inside, given up on)
                    raise
                if not is_transient(e):
                    unmasked = _unmasked(e)
                    if _status_of(unmasked) == _PRECONDITION_FAILED:  # (only reads of a pinned ETag send If-Match)
                        if unpinned:  # (sent without If-Match, answered 412 still: no If-Match of ours failed)
                            raise _precondition_without_if_match(path) from unmasked
                        failed = self.precondition_failed(path)
                        if failed is not None:
                            raise failed from unmasked
                        unpinned = True
                        if before_retry is not None:  # (a file reopened: its requests' headers are set at open)
                            before_retry(attempt)
                        continue
                    if what in _READS and is_missing(unmasked) and (failed := self.removed(path)) is not None:
                        # A CDN, or a store that is only eventually consistent, may answer 404 for a while for a file
                        # it serves (its HEADs too): the server is asked again after each backoff, within the retry
                        # budget, until it gives the file as stamped (read again) or another one (its change); the
                        # server's 410 taken as is, and so is a 404 with no retry left, or of a stamp with no version
                        # (nothing tells the file from another).
                        missed += 1
                        if missed > 1 and attempt >= self.policy.retries and not _is_gone(unmasked):
                            raise _given_yet_missing(path, missed) from unmasked
                        if attempt >= self.policy.retries or _is_gone(unmasked) or not self.confirmable(path):
                            raise failed from unmasked
                        attempt = self._until_vouched(what, path, attempt, unmasked)
                        logger.log(
                            logging.INFO if attempt == 1 else logging.WARNING,  # (as a failure's retries)
                            "%s %s: answered 'no such file', but the server, asked again, does not say it is gone; "
                            "reading it again (retry %d/%d)", what, path, attempt, self.policy.retries,
                        )  # fmt: skip
                        if before_retry is not None:
                            before_retry(attempt)
                        continue
                    if what in _READS and not isinstance(unmasked, FileNotFoundError) and is_missing(unmasked):
                        raise _not_served(path, _status_of(unmasked)) from unmasked  # (never stamped: no removal)
                    if is_refused(unmasked) or isinstance(unmasked, PermissionError):  # (s3fs's answer to a 403)
                        if unpinned:
                            raise _refused_without_if_match(path, _status_of(unmasked)) from unmasked
                        _raise_from(_refused_error(_refused(unmasked, what, path), what, path), unmasked)
                    if unmasked is not e:  # a 403, say: no missing file
                        _raise_as_itself(unmasked)
                    raise
                if hub_tries := _hub_tries(e):  # (its policy, not stacked inside this one)
                    cause = _unmasked(e)
                    _raise_from(_exhausted(cause, what, path, attempt + hub_tries, hub=True), cause)
                attempt += 1
                if attempt > self.policy.retries:
                    cause = _unmasked(e)
                    _raise_from(_exhausted(cause, what, path, attempt), cause)
                delay = self._delay(attempt, what, path, e)
                logger.log(
                    logging.INFO if attempt == 1 else logging.WARNING,  # a blip, then a trouble worth seeing
                    "%s %s failed (%s: %s); retry %d/%d in %.2fs",
                    what,
                    path,
                    type(e).__name__,
                    _first_line(e),
                    attempt,
                    self.policy.retries,
                    delay,
                )
                time.sleep(delay)
                if attempt >= 2 and self.fresh_client is not None:
                    logger.info("%s %s: asking for a fresh client before retry %d", what, path, attempt)
                    self.fresh_client()
                if before_retry is not None:
                    before_retry(attempt)

    def _until_vouched(self, what: str, path: str, attempt: int, error: Exception) -> int:
        """For stamped ``path`` whose read ``error`` answered it has no such file, the server asked again after each
        backoff (:attr:`removed_now`) until it vouches for the file (returns the retries spent by then: the read goes
        on), names a change, or, still saying it has no such file (or no answer where the read asks no version), the
        retries are spent: both raised. One answer of a CDN node, or of a store only eventually consistent, may be as
        stale as the read's; a file really removed costs the retry budget's waits before it is named so, as an outage
        does."""
        while True:
            attempt += 1
            time.sleep(self._delay(attempt, what, path, error))
            failed, settled = self.removed_now(path)
            if failed is None:
                return attempt
            if settled or attempt >= self.policy.retries:
                raise failed from error
            logger.log(
                logging.INFO if attempt == 1 else logging.WARNING,
                "%s %s: answered 'no such file', and the server, asked again, did not give it as stamped (it said the "
                "same, refused or gave no answer); asking again (retry %d/%d)",
                what, path, attempt, self.policy.retries,
            )  # fmt: skip

    def _delay(self, attempt: int, what: str, path: str, error: BaseException) -> float:
        """Seconds to wait before retry ``attempt`` of ``what`` on ``path``: the policy's, or what the server asked."""
        return max(self.policy.delay_s(attempt, f"{what}:{path}"), _retry_after_s(error))


class RetryingFile(io.RawIOBase):
    """A read-only file whose failed reads are redone from the same offset on a freshly opened file.

    Short reads are completed by reading on, so a caller asking for ``n`` bytes gets ``n`` unless the file
    ends; an early end of stream (fewer bytes than the known size) counts as a transient failure.
    """

    def __init__(self, fs: RetryingFileSystem, path: str, mode: str, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._fs, self.path, self._mode, self._kwargs = fs, path, mode, kwargs
        self._pos = 0
        self._inner: Any = fs._open_inner(path, mode, kwargs)
        size = getattr(self._inner, "size", None)
        self.size: int | None = size if isinstance(size, int) else None

    def _reopen(self, _attempt: int) -> None:
        try:
            self._inner.close()
        except Exception:
            logger.debug("closing failed handle of %s raised", self.path, exc_info=True)
        # Without the size the caller knew (a HEAD spared per open): after a failure the server is asked anew,
        # or a file that changed would be compared with the size it was opened with, and always agree.
        kwargs = {k: v for k, v in self._kwargs.items() if k != "size"}
        self._inner = self._fs._open_inner(self.path, self._mode, kwargs)
        size = getattr(self._inner, "size", None)
        if isinstance(size, int) and self.size is not None and size != self.size:
            # A definite answer, not a blip: reading on would mix the old file's bytes (cached, indexed) with the new.
            raise changed_on_server(self.path, told_change((f"{self.size} bytes", f"{size} bytes")))

    def _read_once(self, size: int) -> bytes:
        if self._inner.tell() != self._pos:
            try:
                self._inner.seek(self._pos)
            except ValueError as e:
                if type(self._inner).__name__ != "HTTPStreamFile":
                    raise
                raise _sent_only_whole(self.path, "it answered 'Accept-Ranges: none' or no size") from e
        chunks: list[bytes] = []
        # The rest of a file of known size is asked as that many bytes: a block fetch, tried once; "read all" sent
        # some files down another route (huggingface_hub's streaming file: its own 6 tries, inside each of ours).
        want, got = size if size >= 0 or self.size is None else max(0, self.size - self._pos), 0
        while want != 0 and (self.size is None or self._pos + got < self.size):
            chunk = self._inner.read(want)
            if not chunk:
                if self.size is not None:
                    raise ConnectionError(
                        f"connection broken: stream of {self.path} ended at byte {self._pos + got} of the "
                        f"{self.size} it had when opened (or the file changed since: re-open the dataset)"
                    )
                break
            chunks.append(chunk)
            got += len(chunk)
            if want > 0:
                want -= len(chunk)
        return b"".join(chunks)

    def read(self, size: int | None = -1) -> bytes:
        n = -1 if size is None or size < 0 else size
        data = self._fs._retrier.call("read", self.path, lambda: self._read_once(n), self._reopen)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._pos + offset
        elif whence == io.SEEK_END:
            if self.size is None:
                size = self._fs.size(self.path)
                if size is None:
                    raise _sent_only_whole(self.path, "it answered no Content-Length")
                self.size = int(size)
            target = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}; use io.SEEK_SET, io.SEEK_CUR or io.SEEK_END")
        if target < 0:
            raise ValueError(masked(f"negative seek position {target} in {self.path}"))  # (a path keeping a query)
        self._pos = target
        return target

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                super().close()


class RetryingFileSystem(fsspec.AbstractFileSystem):
    """Any fsspec filesystem, with transient failures of metadata calls, opens and reads retried.

    It pickles as its arguments (the wrapped filesystem, policy and hook), so DALI's spawned workers get
    their own copy. ``fresh_client`` is called from the second retry of a request on, when a closed or
    poisoned client is the likely cause; if it returns a filesystem (see :func:`fresh_instance`), that one
    replaces the wrapped one.
    """

    protocol = "retrying"
    cachable = False
    #: The file stamps read through this filesystem, newest first (each :class:`~.file_stamps.FileStamps` of it adds
    #: itself with :meth:`pin`, in every process): reads of a file stamped with a strong ETag over HTTP(S) ask for
    #: that version alone (:meth:`_pinned`). Several: a union's merged stamps and its first dataset's own share one.
    pinned: tuple[Mapping[str, Any], ...] = ()
    #: Set where the server answered 412 to the If-Match of the ETag it still gives: reads send none from then on.
    if_match_refused = False

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        *,
        policy: RetryPolicy | None = None,
        fresh_client: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(fs, fsspec.AbstractFileSystem):
            raise TypeError(f"RetryingFileSystem wraps an fsspec filesystem, got {type(fs).__name__}")
        super().__init__(fs, policy=policy, fresh_client=fresh_client)
        self.fs = fs
        self.policy = policy if policy is not None else RetryPolicy()
        self.protocol = fs.protocol
        self._fresh_client = fresh_client
        if speaks_http(fs):  # (in every process: a worker's copy is made anew from its arguments)
            mask_request_logs(getattr(fs, "kwargs", {}).get("params"))
        self._retrier = _Retrier(
            self.policy,
            self._refresh if fresh_client is not None else None,
            self._precondition_failed,
            self._removed,
            self._removed_now,
            self._confirmable,
        )

    def _refresh(self) -> None:
        if self._fresh_client is None:
            return
        fresh = self._fresh_client()
        if isinstance(fresh, fsspec.AbstractFileSystem):
            self.fs = fresh

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return path

    def __repr__(self) -> str:
        return f"RetryingFileSystem({self.fs!r}, retries={self.policy.retries})"

    def pin(self, stamps: Mapping[str, Any]) -> None:
        """Make reads of the files ``stamps`` holds ask for their stamped versions (:meth:`_pinned`), before those of
        the stamps pinned already: one pinned in place of another (a union's merged stamps on its first dataset's
        filesystem) read the files the other stamped later with no If-Match."""
        self.pinned = (stamps, *(s for s in self.pinned if s is not stamps))

    def _stamps_holding(self, path: str) -> Any:
        """The first pinned stamps that hold ``path`` (``in``: no request), or None."""
        return next((s for s in self.pinned if path in s), None)

    def _pinned_stamp(self, path: str) -> Any:
        """The stamp of ``path`` whose version reads of it ask for (:meth:`_pinned`), or None: over HTTP(S) only, where
        a stamp pinned here holds it with a strong ETag (a weak one never matches If-Match) or, from a server that
        gives no ETag, a Last-Modified date, and If-Match is on."""
        stamped = self._stamps_holding(path) if speaks_http(self.fs) else None
        if stamped is None or self.if_match_refused or not _if_match_on():
            return None
        stamp = stamped[path]
        version = str(getattr(stamp, "version", ""))
        if version.startswith("etag:"):
            return None if version.startswith("etag:W/") else stamp
        return stamp if version.startswith("mtime:") and _http_date(version.removeprefix("mtime:")) else None

    def _pinned(self, path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` of a read of ``path``, with ``If-Match`` its stamped ETag (``If-Unmodified-Since`` its stamped
        Last-Modified, where the server gave no ETag) where fsspec's HTTP filesystem reads it (its request options'
        headers kept) and the stamp holds one (:meth:`_pinned_stamp`).

        A file replaced on the server by one of its size was read at the old file's offsets (its cached parquet
        footer, its packet index): new bytes that still parsed were handed out as rows and frames, with no error. A
        server that keeps If-Match answers such a read 412 instead, raised as :func:`changed_on_server`."""
        stamp = self._pinned_stamp(path)
        if stamp is None:
            return kwargs
        given = getattr(self.fs, "kwargs", {}).get("headers") or {}  # (a request's headers replace the options')
        if stamp.version.startswith("mtime:"):
            condition = {"If-Unmodified-Since": stamp.version.removeprefix("mtime:")}
        else:
            condition = {"If-Match": f'"{stamp.version.removeprefix("etag:")}"'}
        headers = {**given, **(kwargs.get("headers") or {}), **condition}
        return {**kwargs, "headers": headers}

    def _precondition_failed(self, path: str) -> DatasetError | None:
        """The error for a read of ``path`` answered 412 to its If-Match: the file's change on the server; or None,
        where the server still gives the stamped ETag when asked anew: its If-Match disagrees with its own ETags (a
        redirect to another host, machines behind a load balancer), so reads send none from then on (said once), as
        before If-Match was sent, rather than fail on a file that never changed."""
        change = self._change_now(path)
        if change is None:
            self.if_match_refused = True
            warn_once(logger,
                "%s: the server answered a read of the version it still gives for the file (its ETag) with HTTP 412 "
                "to its If-Match: its If-Match disagrees with its own ETags (a redirect to another host, machines "
                "behind a load balancer); reading it without If-Match, so a file replaced on it by one of the same "
                "size mid-run goes unseen (%s=0 skips this check)", path, IF_MATCH_ENV, key="if-match-refused",
            )  # fmt: skip
            return None
        if isinstance(change, tuple):  # (an ETag the server gives no more: 'no etag but mtime:...', 'no version')
            return changed_on_server(path, f"{told_change(change)}: HTTP 412", if_match_unsure=change[1][:3] == "no ")
        told = change.startswith(("refused", "gave neither"))  # (else: no answer)
        asked = f"; asked again, the server {change}" if told else ""
        return changed_on_server(path, f"its ETag when opened no longer matches: HTTP 412{asked}", if_match_unsure=True)

    def _change_now(self, path: str) -> tuple[str, str] | str | None:
        """``(when opened, now)`` of stamped ``path`` asked anew, once (:meth:`FileStamps.change_now
        <lerobot_dali.file_stamps.FileStamps.change_now>`, vouching: ``now`` is 'removed' where the server has no such
        file); None where the server gives it as stamped; where nothing was learnt, what the server did instead
        ('refused it (HTTP 403)', 'gave no answer'; '' where no stamps hold it)."""
        change_now = getattr(self._stamps_holding(path), "change_now", None)
        if change_now is None:
            return ""
        try:
            return change_now(path, vouching=True)
        except StampUntold:
            return "gave neither its size nor its version (no Content-Length, Content-Range, ETag or Last-Modified)"
        except Exception as e:  # (no answer: nothing says the server is wrong)
            logger.debug("asking for the stamp of %s again failed", path, exc_info=True)
            answer = _unmasked(e)
            if is_refused(answer) or isinstance(answer, PermissionError):
                return f"refused it (HTTP {_status_of(answer) or 403})"
            return "gave no answer"

    def _removed(self, path: str) -> DatasetError | None:
        """The error for a read of ``path`` the server answered that it has no such file (404, 410) where ``path`` was
        stamped (:meth:`pin`; listed at the dataset's open, or over plain HTTP asked when first read): removed since,
        as :meth:`FileStamps.change_now <lerobot_dali.file_stamps.FileStamps.change_now>` names it; None where it was
        never stamped (an optional metadata file probed with ``read_if_present``: its absence is the answer asked)."""
        stamps = self._stamps_holding(path)
        if stamps is None:
            return None
        return changed_on_server(path, told_change((f"{stamps[path].size} bytes", "removed")))

    def _confirmable(self, path: str) -> bool:
        """Whether the stamp of ``path`` holds the file's own version (:attr:`FileStamp.versioned
        <lerobot_dali.file_stamps.FileStamp.versioned>`), so that the server asked again (:meth:`_removed_now`) tells
        the file from one of its size put in its place; with its size alone, a 404 is the file's removal at once."""
        stamps = self._stamps_holding(path)
        return stamps is not None and bool(getattr(stamps[path], "versioned", False))

    def _removed_now(self, path: str) -> tuple[DatasetError | None, bool]:
        """For stamped ``path`` answered 404 by a read, the server asked once more (one ``info``: a HEAD over HTTP),
        as ``(error, settled)``: its change where it gives another size or version (settled: raised at once); its
        removal (:meth:`_removed`) where it has no such file still (not settled: a CDN node's stale 404 answers its
        HEAD too, so it is asked again while retries remain); ``(None, False)`` where it gives the stamped one: the
        404 was a CDN's or an eventually consistent store's passing answer, and the read is retried (a file removed
        answers its retry 404 again). With no answer (a 503) the read is retried only where it asks for the stamped
        version itself (If-Match, If-Unmodified-Since: :meth:`_pinned`): else it may read the bytes of a file put in
        its place, so the server is asked again, as for a 404."""
        change = self._change_now(path)
        if isinstance(change, str):
            return (None if self._pinned_stamp(path) is not None else _unanswered(path, change)), False
        if change and change[1] == "removed":
            return changed_on_server(path, told_change(change)), False
        return (changed_on_server(path, told_change(change)), True) if change else (None, False)

    def _open_inner(self, path: str, mode: str, kwargs: dict[str, Any]) -> Any:
        """The wrapped filesystem's file of ``path``, whose every GET of bytes asks for the pinned version.

        fsspec's HTTP open hands its keyword arguments to the file's GETs and, where it is given no size (or 0), to
        ``info`` too, which merges them with the options': If-Match went with that HEAD (and with the GET fsspec makes
        where a HEAD gives no size), and beside the options' headers made a TypeError ("got multiple values for keyword
        argument 'headers'") that fsspec reports as FileNotFoundError, "Video file ... does not exist". So a pinned
        file is opened with a size, and fsspec asks nothing itself: the size given, else its stamp's (the size of the
        version If-Match asks for), once the server's (asked here without If-Match) agrees or it gives none;
        where the server refuses ranges, fsspec's streaming file, as its open picks (one GET, If-Match with it). An
        empty file (fsspec's open takes a size of 0 for none) is opened without If-Match: it has no bytes to ask for.
        A server's size other than the stamp's is the file's change, raised with no GET (emptied, it was read as b'').
        """
        stamp = self._pinned_stamp(path)
        if stamp is not None and not kwargs.get("size"):
            info = self._retrier.call("open", path, lambda: self.fs.info(path))  # (the open's HEAD: 404 is removal)
            if info.get("size") is not None and info["size"] != stamp.size:
                raise changed_on_server(path, told_change((f"{stamp.size} bytes", f"{info['size']} bytes")))
            kwargs = {**kwargs, "size": stamp.size}
            if info.get("partial", True) is False:  # ('Accept-Ranges: none')
                kwargs["block_size"] = 0

        def opened() -> Any:
            return self.fs.open(path, mode, **(self._pinned(path, kwargs) if kwargs.get("size") else kwargs))

        inner = self._retrier.call("open", path, opened)
        _check_block_fetches(inner, path)
        return inner

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        """Reads get a :class:`RetryingFile` (text modes wrap it); writes go straight to the wrapped fs."""
        if "r" not in mode or "+" in mode:
            return self.fs.open(path, mode, **kwargs)
        if "b" in mode:
            return RetryingFile(self, path, "rb", dict(kwargs))
        text_kwargs = {k: kwargs.pop(k) for k in ("encoding", "errors", "newline") if k in kwargs}
        return io.TextIOWrapper(io.BufferedReader(RetryingFile(self, path, "rb", kwargs)), **text_kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> Any:
        """The wrapped filesystem's bytes, retried; a range of bytes (``start`` and ``end`` from the file's start)
        checked to hold them (:func:`_checked_range`, with the stamped size where ``path`` is stamped): fsspec's HTTP
        ``cat_file`` returned a short answer short, and a server's whole file for a range it ignored."""

        stamps = self._stamps_holding(path)
        size = None if stamps is None else int(stamps[path].size)
        ranged = isinstance(start, int) and isinstance(end, int) and 0 <= start <= end
        nbytes = end - start if ranged else (size if start is None and end is None else None)  # type: ignore[operator]

        def fetch_once(extra: dict[str, Any]) -> Any:
            if _is_hub(self.fs):
                return self._hub_cat_file(path, start, end, kwargs)
            if ranged and speaks_http(self.fs):  # (read no further than asked, a 416 named)
                from .http_ranges import cat_range  # (which names a change as this module does)

                pinned = self._pinned(path, {**kwargs, **extra})
                return cat_range(self.fs, path, start, end, size=size, **pinned)  # type: ignore[arg-type]
            return self.fs.cat_file(path, start=start, end=end, **self._pinned(path, {**kwargs, **extra}))

        def fetch() -> Any:
            data = _fetch_by_deadline(self.fs, path, start, end, nbytes, fetch_once)
            if ranged and isinstance(data, bytes):
                return _checked_range(path, start, end, data, size)  # type: ignore[arg-type]
            return data

        return self._retrier.call("cat_file", path, fetch)

    def _hub_cat_file(self, path: str, start: int | None, end: int | None, kwargs: dict[str, Any]) -> bytes:
        """Bytes ``[start, end)`` of Hub file ``path`` (negative: from its end), asked in one request, tried once
        (:func:`_one_try_hub_fetch`). HfFileSystem has no ``cat_file`` of its own: fsspec's opened the file with its
        default read-ahead and read through huggingface_hub's own fetch, so a prefetched range of 10 bytes asked for
        the 5 MB after it too, in up to 6 tries of huggingface_hub's policy with no deadline."""
        with self.fs.open(path, "rb", cache_type="none", **kwargs) as inner:
            _check_block_fetches(inner, path)
            size = int(inner.size)
            first, stop = (
                default if bound is None else (bound if bound >= 0 else max(0, size + bound))
                for bound, default in ((start, 0), (end, size))
            )
            inner.seek(min(first, size))
            return bytes(inner.read(max(0, min(stop, size) - first)))

    def _listed(self, what: str, path: str, list_: Callable[..., _T]) -> _T:
        """``list_(**extra)`` (a listing of ``path``), retried, with the deadline of a request of unknown size over
        plain HTTP(S) (:func:`_fetch_by_deadline`): fsspec reads a folder's whole index page there, which a server
        trickling its bytes held for ever."""
        return self._retrier.call(what, path, lambda: _fetch_by_deadline(self.fs, path, None, None, None, list_))

    def info(self, path: str, **kwargs: Any) -> Any:
        return self._retrier.call("info", path, lambda: self.fs.info(path, **kwargs))

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Asked through :meth:`info`, so a transient failure is retried (and raised once the budget is spent).

        Filesystems' own ``exists`` turn every error into False (fsspec's HTTP one answers False on a 503,
        after a GET of the whole file), which would report a network hiccup, or a denied access, as a missing
        file: only FileNotFoundError means "absent".
        """
        try:
            self.info(path, **kwargs)
        except FileNotFoundError as e:
            if is_transient(e):  # fsspec's HTTP info raises FileNotFoundError from whatever its GET hit
                raise
            return False
        return True

    def glob(self, path: str, **kwargs: Any) -> Any:
        return self._listed("glob", path, lambda extra: self.fs.glob(path, **kwargs, **extra))

    def find(self, path: str, **kwargs: Any) -> Any:
        """The wrapped filesystem's own recursive listing (one paginated request on the Hub, S3, GCS)."""
        return self._listed("find", path, lambda extra: self.fs.find(path, **kwargs, **extra))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self._listed("ls", path, lambda extra: self.fs.ls(path, detail=detail, **kwargs, **extra))

    def size(self, path: str) -> Any:
        return self.info(path).get("size")

    def isfile(self, path: str) -> bool:
        try:
            return bool(self.info(path)["type"] == "file")
        except FileNotFoundError:
            return False

    def isdir(self, path: str) -> bool:
        """The wrapped filesystem's own answer, retried: over HTTP, ``info`` calls every URL a file, and only the
        folder's index page (fsspec's HTTP ``isdir`` lists it) tells a folder."""
        return bool(self._listed("isdir", path, lambda extra: self.fs.isdir(path, **extra)))

    def ukey(self, path: str) -> Any:
        return self.fs.ukey(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        """The wrapped filesystem's listings cache dropped (of ``path``): its next ``info`` asks the server."""
        self.fs.invalidate_cache(path)
