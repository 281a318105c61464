"""Which remote failures retrying may mend (:func:`is_transient`), which are a refusal or a missing file, and the
errors that name each for the user: a change on the server, a range ignored, a file sent only whole, a refusal, a
404 the server would not confirm. :mod:`~lerobot_dali.remote_retry` raises them; so do the requests made beside it
(:mod:`~lerobot_dali.http_ranges`, :mod:`~lerobot_dali.file_stamps`)."""

from __future__ import annotations

import errno
import sys

from .errors import DatasetError, MissingDataFileError, RemoteFileError
from .retry_policy import IF_MATCH_ENV, RETRIES_ENV
from .url_secrets import masked

__all__ = [
    "REFUSED_HINT",
    "StampUntold",
    "changed_on_server",
    "first_line",
    "given_yet_missing",
    "ignored_range",
    "is_gone",
    "is_missing",
    "is_refused",
    "is_transient",
    "missing_status",
    "multipart_range",
    "not_served",
    "precondition_without_if_match",
    "refusal_noted",
    "refused_error",
    "refused_without_if_match",
    "sent_only_whole",
    "status_of",
    "told_change",
    "unanswered",
    "unmasked_error",
]

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


def status_of(error: BaseException) -> int | None:
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
    status = status_of(error)
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


def unmasked_error(error: Exception) -> Exception:
    """The HTTP error behind fsspec's ``FileNotFoundError(url) from <whatever its GET hit>`` (its HTTP ``info``)
    when that was not a 404/410: an outage past the retries (a refused connection too), or a denied access,
    reported as a missing file sent users looking for a file that is there."""
    cause = error.__cause__
    if (
        isinstance(error, FileNotFoundError)
        and isinstance(cause, Exception)
        and not isinstance(cause, FileNotFoundError)
    ):
        status = status_of(cause)
        if (status is not None and status not in (404, 410)) or (status is None and is_transient(cause)):
            return cause
    return error


def ignored_range(path: str) -> DatasetError:
    """The error for a server that answered a Range request of ``path`` with the whole file: reading a part of a
    file, as parquet and MP4 readers do, cannot work from it."""
    return _error(
        f"{path}: the server ignored an HTTP Range request (it sent the whole file), which reading a part "
        "of a file needs; serve the dataset from a server that supports Range requests, or copy it locally"
    )


def multipart_range(url: str, start: int, end: int, content_type: str) -> DatasetError:
    """The error for the one range ``[start, end)`` of ``url`` answered as ``multipart/byteranges``: HTTP forbids it
    (RFC 9110 15.3.7.2: a server MUST NOT answer a single range so), and fsspec's HTTP reads, which the dataset's files
    are opened with, hand out such a body whole, its framing as the file's bytes; a server's configuration, so not
    retried. It was named as a server ignoring Range, which it had not."""
    return DatasetError(
        masked(
            f"{url}: bytes [{start}, {end}) asked in one range, answered HTTP 206 as {content_type.strip()!r}: the "
            "range in a multipart body, which HTTP forbids for a single range (RFC 9110 15.3.7.2) and fsspec's HTTP "
            "reads cannot take apart; serve the dataset from a server (or through a proxy or CDN) that answers a "
            "single range with its bytes and a Content-Range, or copy it locally"
        )
    )


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


def sent_only_whole(path: str, why: str) -> DatasetError:
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
    return status_of(error) in (401, 403)


def refusal_noted(error: Exception, what: str, path: str) -> Exception:
    """``error`` (a refusal) with a note naming the request and :data:`REFUSED_HINT`: aiohttp's says only
    "403, message='Forbidden'", which tells neither that retrying is useless nor what to pass."""
    note = f"lerobot_dali: {what} {path!r} was refused (not retried): {REFUSED_HINT}"
    if sys.version_info >= (3, 11) and note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error


def first_line(error: BaseException, fallback: str = "(no message)") -> str:
    """``error``'s message's first line (``fallback`` where it says nothing), for a log line or our message:
    huggingface_hub's go on for lines (a link to the status's page, the server's body), which stay on the error itself
    (the cause, its traceback)."""
    return (str(error).strip().splitlines() or [fallback])[0]


def refused_error(error: BaseException, what: str, path: str) -> RemoteFileError:
    """The error for ``what`` on ``path`` that the server refused with ``error`` (its cause): HTTP 401/403."""
    status = status_of(error)
    return RemoteFileError(
        masked(
            f"{path}: {what} was refused (not retried): {REFUSED_HINT} (the server answered "
            f"{type(error).__name__}: {str(error) or '(no message)'})"
        ),
        status if status is not None else 403,
    )


def given_yet_missing(path: str, missed: int) -> DatasetError:
    """The error for stamped ``path`` whose reads the server answered 404 ``missed`` times while, asked after each
    (:meth:`~.remote_retry.RetryingFileSystem._removed_now`), it never said the file was gone: it gave it as stamped,
    or (where the read asks for the stamped version itself) no answer. Not its removal, which the server did not
    say."""
    return _error(
        f"{path}: answered 'no such file' (HTTP 404) {missed} times, while the server, asked after each, never said "
        f"it was gone (it gave the file as stamped, or no answer: a CDN's or a cache's stale 404, or an outage?); gave "
        f"up (set {RETRIES_ENV} to retry more)"
    )


def unanswered(path: str, answer: str) -> DatasetError:
    """The error for stamped ``path`` whose read the server answered 404, and which, asked again whether it has the
    file (one ``info``, sent without If-Match), ``answer``: 'refused it (HTTP 403)', 'gave no answer'. Not its
    removal, which the server did not say."""
    return _error(
        f"{path}: answered 'no such file' (HTTP 404), and the server, asked again whether it has the file, {answer}: "
        f"whether it was removed cannot be told; gave up (set {RETRIES_ENV} to retry more)"
    )


def refused_without_if_match(path: str, status: int | None) -> DatasetError:
    """The error for a read of ``path`` that the server answered 412 to its If-Match (of the ETag it still gives, so
    it is sent again without one: :meth:`~.remote_retry.RetryingFileSystem._precondition_failed`), then refused
    without it."""
    return _error(
        f"{path}: the server answered HTTP 412 to the If-Match of the ETag it gives for the file, then refused the "
        f"read sent again without If-Match (HTTP {status or 403}): it serves the file neither way; check the "
        f"credentials ({REFUSED_HINT}), or read the dataset from a server whose If-Match agrees with its ETags"
    )


def precondition_without_if_match(path: str) -> DatasetError:
    """The error for a read of ``path`` that the server answered 412 to its If-Match (of the ETag it still gives: sent
    again without one, :meth:`~.remote_retry.RetryingFileSystem._precondition_failed`), then 412 again without it: a
    precondition not ours failed (the server's own, or a header the storage options send), which no retry mends."""
    return _error(
        f"{path}: the server answered HTTP 412 to the read sent again without If-Match too: a precondition other than "
        "ours fails (the server's own, or a header the storage options send: If-Match, If-Unmodified-Since); check "
        "those headers and the server"
    )


def not_served(path: str, status: int | None) -> MissingDataFileError:
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


def is_missing(error: BaseException) -> bool:
    """Whether the server answered a request that it has no such file: 404 or 410 (aiohttp's ClientResponseError of
    fsspec's HTTP range reads), or FileNotFoundError (its other requests', an object store's); not fsspec's HTTP
    ``info``'s FileNotFoundError raised from another failure (a 503, a refused 403: no answer about the file)."""
    answer = unmasked_error(error) if isinstance(error, Exception) else error
    return status_of(answer) in (404, 410) or (
        isinstance(answer, FileNotFoundError) and not isinstance(answer, DatasetError)
    )


def missing_status(error: BaseException) -> int | None:
    """The HTTP status (404, 410) a server answered that it has no such file, of ``error`` or its cause (fsspec's HTTP
    ``info`` raises FileNotFoundError from its client's 404): a MissingDataFileError's ``status``; None where no
    server said so (a local file, a listing that lacks the file, an object store's FileNotFoundError)."""
    for answer in (error, error.__cause__):
        status = status_of(answer) if answer is not None else None
        if status in (404, _GONE):
            return status
    return None


#: HTTP's answer for a file removed for good (:func:`is_gone`).
_GONE = 410


def is_gone(error: BaseException) -> bool:
    """Whether the server answered 410 Gone (itself, or behind fsspec's FileNotFoundError of its HTTP ``info``): the
    file's absence "likely to be permanent" (RFC 9110, 15.5.11), where a 404 says nothing of how long it lasts."""
    return _GONE in (status_of(error), status_of(error.__cause__) if error.__cause__ is not None else None)
