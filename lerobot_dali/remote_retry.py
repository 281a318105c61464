"""Retries for remote bulk reads: a transient network failure must cost a delay, not a training run.

A multi-day job reads millions of ranges from S3, GCS or the Hub; some of them will time out, hit a 503 or
a 429, or see a connection reset. :class:`RetryingFileSystem` wraps any fsspec filesystem and redoes those
requests (and reads on the files it opens, from the same offset, on a freshly opened file) with capped
exponential backoff. Errors that retrying cannot fix (missing file, no permission, a malformed dataset)
are raised at once, so a real mistake still fails fast; a 404 for a file the dataset's open found (stamped) is asked
about again within the retry budget first, since a CDN or an eventually consistent store may answer one for a while
for a file it serves. A refusal (HTTP 401/403), and a failure the retries gave up on, is raised as
:class:`~lerobot_dali.errors.RemoteFileError` naming the file and what to do, the client's error as its cause; every
plain HTTP(S) request has a total deadline (:data:`~.request_checks.HTTP_DEADLINE_BASE_S`), which a server trickling
its bytes reaches.

The policy is :mod:`~.retry_policy`'s; which failures are transient, and the errors raised, :mod:`~.remote_errors`';
a request's deadline and range checks, :mod:`~.request_checks`'; huggingface_hub's own retries, :mod:`~.hub_retries`'.
"""

from __future__ import annotations

import email.utils
import io
import logging
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NoReturn, TypeVar

import fsspec

from . import io_stats
from .errors import DatasetError, RemoteFileError
from .http_ranges import cat_range, reads_itself
from .hub_retries import hub_tries, is_hub, one_try_hub_fetch
from .remote_errors import (
    StampUntold,
    changed_on_server,
    first_line,
    given_yet_missing,
    ignored_range,
    is_gone,
    is_missing,
    is_refused,
    is_transient,
    not_served,
    precondition_without_if_match,
    refusal_noted,
    refused_error,
    refused_without_if_match,
    sent_only_whole,
    status_of,
    told_change,
    unanswered,
    unmasked_error,
)
from .request_checks import checked_range, fetch_by_deadline, speaks_http
from .retry_policy import IF_MATCH_ENV, RETRIES_ENV, RetryPolicy, if_match_on, retry_after_s
from .said_once import warn_once
from .url_secrets import mask_error, mask_request_logs, masked, masking

__all__ = ["RetryingFile", "RetryingFileSystem", "fresh_instance", "retried"]

logger = masking(logging.getLogger(__name__))  # (paths that keep a URL's query name it masked)
_T = TypeVar("_T")


def fresh_instance(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """A new client of ``fs``'s class and arguments, bypassing fsspec's instance cache.

    Used as ``fresh_client`` hook: a session that was closed or poisoned (aiohttp "client has been closed")
    keeps failing however often the same object retries.
    """
    cls = type(fs)
    cls.clear_instance_cache()
    return cls(*fs.storage_args, **fs.storage_options)


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
    fetch = one_try_hub_fetch(inner, path) or fetch

    hub_fetch = fetch is not getattr(cache, "fetcher", None)  # (its own client, its own deadline)

    def fetch_once(start: int, end: int, extra: dict[str, Any]) -> bytes:
        return bytes(fetch(start, end, **extra))  # (HTTPFile's: fsspec's sync wrapper, which takes a timeout)

    def checked(start: int, end: int) -> bytes:
        try:
            if hub_fetch:
                data = fetch(start, end)
            else:
                data = fetch_by_deadline(
                    getattr(inner, "fs", None), path, start, end, end - start, partial(fetch_once, start, end)
                )
        except ValueError as e:
            if "range requests" not in str(e):
                raise
            raise ignored_range(path) from e
        return checked_range(path, start, end, data, size)

    cache.fetcher = checked  # type: ignore[union-attr]  # (fetch is not None: neither is cache)


def _check_bounds(path: str, start: int | None, end: int | None) -> None:
    """Raise ValueError for bounds ``[start, end)`` that cross (see :meth:`RetryingFileSystem.cat_file`): of the
    same sign (both negative where the file's size is not known: left to the filesystem, which asks it itself)."""
    if not (isinstance(start, int) and isinstance(end, int)):
        return
    if (start < 0) == (end < 0) and start > end:
        raise ValueError(masked(f"bytes [{start}, {end}) of {path} asked: a range cannot start past its end"))


def _mixed_signs(start: int | None, end: int | None) -> bool:
    """Whether one bound counts from the file's start and the other from its end: fsspec's HTTP reads sent such a
    range crossed for any file shorter than their gap (``bytes=995-99`` for ``[-5, 100)`` of 1,000 bytes), which a
    server ignores and answers with the whole file, handed out as the range."""
    return isinstance(start, int) and isinstance(end, int) and (start < 0) != (end < 0)


def _http_date(text: str) -> bool:
    """Whether ``text`` is an HTTP date (a ``Last-Modified``), which ``If-Unmodified-Since`` can send back."""
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError):
        return False


#: HTTP's answer to a read whose ``If-Match`` names another ETag than the file's (:meth:`RetryingFileSystem._pinned`).
_PRECONDITION_FAILED = 412


def _exhausted(error: BaseException, what: str, path: str, attempts: int, *, hub: bool = False) -> RemoteFileError:
    """The error for ``what`` on ``path`` that failed ``attempts`` times, the last with ``error`` (its cause)."""
    retry = "huggingface_hub's own retries spent" if hub else f"set {RETRIES_ENV} to retry more"
    note = f"lerobot_dali: {what} {path!r} failed {attempts} time(s); gave up ({retry})"
    said = first_line(error)
    logger.warning("%s (last error %s: %s)", note, type(error).__name__, said)
    if sys.version_info >= (3, 11):
        error.add_note(note)
    return RemoteFileError(
        masked(
            f"{path}: {what} failed {attempts} time(s), the last with {type(error).__name__}: {said}; gave up: check "
            f"the connection and the server, or {retry}"
        ),
        status_of(error),
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


#: The requests of :class:`_Retrier` that read a file's bytes (an open's HEAD too), whose 404 may be its removal.
_READS = frozenset({"open", "read", "cat_file"})


def retried(what: str, path: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` (a request named ``what`` of ``path`` not made through a :class:`RetryingFileSystem`: huggingface_hub's
    download of a Hub dataset's metadata), its transient failures redone under the default
    :class:`~.retry_policy.RetryPolicy` (:data:`~.retry_policy.RETRIES_ENV`) with the waits and log lines of the data
    reads, and given up on as :class:`~lerobot_dali.errors.RemoteFileError`; another error raised at once (a refusal
    as RemoteFileError)."""
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
                    unmasked = unmasked_error(e)
                    if status_of(unmasked) == _PRECONDITION_FAILED:  # (only reads of a pinned ETag send If-Match)
                        if unpinned:  # (sent without If-Match, answered 412 still: no If-Match of ours failed)
                            raise precondition_without_if_match(path) from unmasked
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
                        if missed > 1 and attempt >= self.policy.retries and not is_gone(unmasked):
                            raise given_yet_missing(path, missed) from unmasked
                        if attempt >= self.policy.retries or is_gone(unmasked) or not self.confirmable(path):
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
                        raise not_served(path, status_of(unmasked)) from unmasked  # (never stamped: no removal)
                    if is_refused(unmasked) or isinstance(unmasked, PermissionError):  # (s3fs's answer to a 403)
                        if unpinned:
                            raise refused_without_if_match(path, status_of(unmasked)) from unmasked
                        _raise_from(refused_error(refusal_noted(unmasked, what, path), what, path), unmasked)
                    if unmasked is not e:  # a 403, say: no missing file
                        _raise_as_itself(unmasked)
                    raise
                if tried := hub_tries(e):  # (its policy, not stacked inside this one)
                    cause = unmasked_error(e)
                    _raise_from(_exhausted(cause, what, path, attempt + tried, hub=True), cause)
                attempt += 1
                if attempt > self.policy.retries:
                    cause = unmasked_error(e)
                    _raise_from(_exhausted(cause, what, path, attempt), cause)
                delay = self._delay(attempt, what, path, e)
                logger.log(
                    logging.INFO if attempt == 1 else logging.WARNING,  # a blip, then a trouble worth seeing
                    "%s %s failed (%s: %s); retry %d/%d in %.2fs",
                    what,
                    path,
                    type(e).__name__,
                    first_line(e),
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
        return max(self.policy.delay_s(attempt, f"{what}:{path}"), retry_after_s(error))


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
                raise sent_only_whole(self.path, "it answered 'Accept-Ranges: none' or no size") from e
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
                    raise sent_only_whole(self.path, "it answered no Content-Length")
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
        if stamped is None or self.if_match_refused or not if_match_on():
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
        server that keeps If-Match answers such a read 412 instead, raised as
        :func:`~.remote_errors.changed_on_server`."""
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
            answer = unmasked_error(e)
            if is_refused(answer) or isinstance(answer, PermissionError):
                return f"refused it (HTTP {status_of(answer) or 403})"
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
            return (None if self._pinned_stamp(path) is not None else unanswered(path, change)), False
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
        checked to hold them (:func:`~.request_checks.checked_range`, with the stamped size where ``path`` is
        stamped): fsspec's HTTP ``cat_file`` returned a short answer short, and a server's whole file for a range it
        ignored. Bounds from the file's end are resolved by its size where it is stamped (fsspec asked the server for
        it, a HEAD per read) or where the other bound is from its start (asked once). Bounds that cross then raise
        ValueError before any request: sent as a Range, a server ignores it and sends the whole file."""

        stamps = self._stamps_holding(path)
        size = None if stamps is None else int(stamps[path].size)
        if size is None and _mixed_signs(start, end):  # (whether they cross is the file's size's to say)
            size = int(self.size(path))
        if size is not None:  # (from the start: read as a checked range, fsspec asks no size again)
            start, end = (max(0, b + size) if isinstance(b, int) and b < 0 else b for b in (start, end))
        _check_bounds(path, start, end)
        ranged = isinstance(start, int) and isinstance(end, int) and 0 <= start <= end
        nbytes = end - start if ranged else (size if start is None and end is None else None)  # type: ignore[operator]

        def fetch_once(extra: dict[str, Any]) -> Any:
            if is_hub(self.fs):
                return self._hub_cat_file(path, start, end, kwargs)
            if ranged and reads_itself(self.fs):  # (read no further than asked, a 416 named)
                pinned = self._pinned(path, {**kwargs, **extra})
                return cat_range(self.fs, path, start, end, size=size, **pinned)  # type: ignore[arg-type]
            return self.fs.cat_file(path, start=start, end=end, **self._pinned(path, {**kwargs, **extra}))

        def fetch() -> Any:
            data = fetch_by_deadline(self.fs, path, start, end, nbytes, fetch_once)
            if ranged and isinstance(data, bytes):
                return checked_range(path, start, end, data, size)  # type: ignore[arg-type]
            return data

        return self._retrier.call("cat_file", path, fetch)

    def _hub_cat_file(self, path: str, start: int | None, end: int | None, kwargs: dict[str, Any]) -> bytes:
        """Bytes ``[start, end)`` of Hub file ``path`` (negative: from its end), asked in one request, tried once
        (:func:`~.hub_retries.one_try_hub_fetch`). HfFileSystem has no ``cat_file`` of its own: fsspec's opened the
        file with its default read-ahead and read through huggingface_hub's own fetch, so a prefetched range of 10
        bytes asked for the 5 MB after it too, in up to 6 tries of huggingface_hub's policy with no deadline."""
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
        plain HTTP(S) (:func:`~.request_checks.fetch_by_deadline`): fsspec reads a folder's whole index page there,
        which a server trickling its bytes held for ever."""
        return self._retrier.call(what, path, lambda: fetch_by_deadline(self.fs, path, None, None, None, list_))

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
