"""A real HTTP server on 127.0.0.1 serving a local folder read-only, with range requests and scheduled faults.

Tests point fsspec's ``HTTPFileSystem`` (aiohttp) at it, so the loader's remote path and its retry layer see
genuine HTTP: ``GET`` with one ``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` answers 206 with
``Content-Range`` (416 when the range starts past the end), ``HEAD`` answers the headers alone, every file
carries ``Content-Length`` (where ``content_length`` names the method), ``ETag``, ``Last-Modified`` and
``Accept-Ranges: bytes``, a missing file is 404, and a directory answers an HTML index of links (as nginx
``autoindex`` does; off with ``listings=False``), which is how fsspec's ``ls``/``glob`` work over plain HTTP.

Every request is recorded (:class:`RequestRecord`) and counted by ``(method, kind)`` with kind ``range``, ``full``,
``listing``, ``missing``, ``rejected`` (writes: 405), ``unauthorized`` (401: a request without the
``required_headers`` or ``required_query``), ``precondition`` (412: an ``If-Match`` that names another ETag than the
file's; off with ``if_match = False``) or ``fault``. With ``fault_every=N`` the N-th, 2N-th, ... request (all
methods, in arrival order) fails with the next kind of ``faults`` in turn: ``503``, ``429``, ``403``, ``404`` and
``410`` answer that status (``404``: a CDN's or an eventually consistent store's passing 404 for a file it serves);
``drop`` sends the headers and half the body, then closes the connection (a ``HEAD`` or an empty body is closed
before any byte), so aiohttp raises its own payload / disconnect errors; ``stall`` sends the headers, then waits
``stall_s`` seconds before the body (a server that hangs). :meth:`FolderServer.fail_next` scripts the next requests'
faults instead, one each.
"""

from __future__ import annotations

import email.utils
import html
import os
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.fake_remote import nth_fault

__all__ = ["BYTERANGES_BOUNDARY", "HTTP_FAULT_KINDS", "FolderServer", "RequestRecord", "serve_folder"]

#: ``503``/``429``/``403``/``404``/``410``: that status, empty body; ``drop``: half the body, then the connection
#: closes; ``stall``: the headers, then ``stall_s`` seconds of silence before the body; ``short``: a range answered
#: (206, honest headers) for half the bytes asked; ``no_range``: the whole file (200), whatever the Range asked.
#: ``trickle``: the headers, then the body one byte every ``stall_s`` seconds (a server that never stalls long enough
#: for a read timeout, yet never finishes). ``shifted``: a range answered (206, honest headers) from one byte past the
#: start asked, as long where the file allows (a cache answering another request's range). ``multipart``: a range
#: answered (206) as ``multipart/byteranges`` of one part, its ``Content-Range`` in the part (RFC 9110 15.3.7.2 forbids
#: it for a single range; a server or proxy that does it anyway). ``whole_as_range``: the whole file (200), whatever
#: the Range asked, with the ``Content-Range`` the range would have had (a proxy that keeps the origin's header).
HTTP_FAULT_KINDS = (
    "503", "429", "403", "404", "410", "drop", "stall", "short", "no_range", "trickle", "shifted", "multipart",
    "whole_as_range",
)  # fmt: skip
_STATUS_FAULTS = ("503", "429", "403", "404", "410")

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 64 * 1024
#: The boundary of the ``multipart`` fault's parts.
BYTERANGES_BOUNDARY = "3d6b6a416f9b5"


@dataclass(frozen=True)
class RequestRecord:
    """One answered request: what was asked and what was sent (``sent_bytes`` counts body bytes written)."""

    method: str
    path: str
    range: str | None
    status: int
    kind: str
    sent_bytes: int
    file_size: int | None
    query: str = ""
    if_match: str | None = None


class FolderServer:
    """The running server: its URL, the request log and counters, and the fault schedule (changeable live)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fault_every: int = 0,
        faults: tuple[str, ...] = ("503",),
        listings: bool = True,
    ) -> None:
        self.root = Path(root).resolve()
        self.listings = listings
        #: Whether a read whose ``If-Match`` names another ETag than the file's, or whose ``If-Unmodified-Since`` is
        #: before the file's ``Last-Modified``, is answered 412 (nginx's, Apache's);
        #: ``"refuse"``: every read with one is (a server whose If-Match disagrees with the ETags it gives);
        #: ``"always"``: every read (GET) is, with If-Match or without (a precondition of its own, or of a header sent).
        self.if_match: bool | str = True
        #: Links added to every folder's index page as written (``"./"``, ``"../x/"``): a server's own odd ones.
        self.index_links: tuple[str, ...] = ()
        #: Written before each entry's link (Caddy's index pages link ``./name``); ``"absolute"``: the folder's path on
        #: the server, percent-encoded (``/my%20ds/meta/name``).
        self.link_prefix = ""
        #: Headers every request must carry (e.g. ``{"Authorization": "Bearer a"}``): one without is answered 401.
        self.required_headers: dict[str, str] = {}
        #: Query parameters every request must carry (``{"sig": "s"}``: a signed URL's): one without is answered 401.
        self.required_query: dict[str, str] = {}
        #: The methods whose answers for a file carry its ``Content-Length``: a ``GET`` left out ends its body by
        #: closing the connection (as a server streaming its output does), a ``HEAD`` gives no size (fsspec then GETs).
        self.content_length: frozenset[str] = frozenset({"GET", "HEAD"})
        #: Whether a file's answers carry its version (``ETag``, ``Last-Modified``); False: a server that sends neither
        #: (its files' stamps hold their sizes alone); ``"last_modified"``: ``Last-Modified`` alone (no ETag).
        self.versions: bool | str = True
        self.stall_s = 5.0
        #: Headers added to every file's answers (``{"X-Repo-Commit": sha}``: what the Hub's resolve answers carry, and
        #: huggingface_hub's download checks for).
        self.file_headers: dict[str, str] = {}
        #: Faults by path: a request whose URL path holds a key suffers its fault (every time), whatever the schedule.
        self.fault_paths: dict[str, str] = {}
        if not self.root.is_dir():
            raise NotADirectoryError(f"cannot serve {self.root}: not a folder")
        self._lock = threading.Condition()
        self._records: list[tuple[int, RequestRecord]] = []  # (each with its arrival number: kept in arrival order)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._faults: Counter[str] = Counter()
        self._total = 0
        self._arrived = 0
        self._in_flight = 0
        self._next_faults: list[str | None] = []
        self.set_faults(fault_every, faults)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._httpd.handle_error = _quiet_handle_error  # type: ignore[method-assign]
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="folder-http", daemon=True
        )

    def set_faults(self, fault_every: int, faults: tuple[str, ...] = ("503",)) -> None:
        unknown = [f for f in faults if f not in HTTP_FAULT_KINDS]
        if fault_every < 0 or not faults or unknown:
            raise ValueError(f"fault_every must be >= 0 and faults a non-empty subset of {HTTP_FAULT_KINDS}")
        with self._lock:
            self.fault_every, self.faults = fault_every, tuple(faults)

    def fail_next(self, *faults: str | None) -> None:
        """The next ``len(faults)`` requests (all methods, in arrival order) each suffer the next of ``faults`` (None:
        answered as is), before and besides the schedule of :meth:`set_faults` (``fail_next("404")``: one 404, then the
        file as it is)."""
        unknown = [f for f in faults if f is not None and f not in HTTP_FAULT_KINDS]
        if unknown:
            raise ValueError(f"faults must be kinds of {HTTP_FAULT_KINDS}, got {unknown}")
        with self._lock:
            self._next_faults.extend(faults)

    def reset_stats(self) -> None:
        with self._settled():
            self._records.clear()
            self._counts.clear()
            self._faults.clear()

    @property
    def records(self) -> list[RequestRecord]:
        """Every answered request in arrival order (a copy; requests still being answered are waited for)."""
        with self._settled():
            return [record for _, record in sorted(self._records, key=lambda pair: pair[0])]

    @property
    def counts(self) -> Counter[tuple[str, str]]:
        """Requests by ``(method, kind)``."""
        with self._settled():
            return Counter(self._counts)

    @property
    def faults_injected(self) -> Counter[str]:
        with self._settled():
            return Counter(self._faults)

    @property
    def sent_bytes(self) -> int:
        """Body bytes written, all requests."""
        return sum(r.sent_bytes for r in self.records)

    @contextmanager
    def _settled(self) -> Iterator[None]:
        """Hold the lock once no request is mid-answer: a client that has read its response sees it recorded."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._in_flight == 0, timeout=10):
                raise TimeoutError(f"{self._in_flight} request(s) still being answered after 10 s")
            yield

    def start(self) -> FolderServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _begin(self, *, scheduled: bool = True) -> tuple[int, str | None]:
        """Count one arriving request: its arrival number, and the fault it suffers, if the schedule says so
        (``scheduled``)."""
        with self._lock:
            self._in_flight += 1
            self._arrived += 1
            return self._arrived, self._scheduled_fault() if scheduled else None

    def _scheduled_fault(self) -> str | None:
        self._total += 1
        n = self._total
        if self._next_faults:
            scripted = self._next_faults.pop(0)
            if scripted is not None:
                self._faults[scripted] += 1
            return scripted
        fault = nth_fault(n, self.fault_every, self.faults)
        if fault is not None:
            self._faults[fault] += 1
        return fault

    def _record(self, arrival: int, record: RequestRecord) -> None:
        """Keep ``record`` at its request's place in arrival order: one recorded once its body was sent (a file's, whose
        size it counts) came after a client's next request on another connection, recorded first (a GET 200 after the
        HEAD 404 that followed it, 1 CI run in a few on 2 loaded cores)."""
        with self._lock:
            self._records.append((arrival, record))
            self._counts[(record.method, record.kind)] += 1

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    def __enter__(self) -> FolderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def serve_folder(
    root: str | os.PathLike[str], *, fault_every: int = 0, faults: tuple[str, ...] = ("503",), listings: bool = True
) -> Iterator[FolderServer]:
    """Serve ``root`` on an ephemeral 127.0.0.1 port for the duration of the block (``listings=False``: a
    folder answers 404, as a static host or bucket website without an index does)."""
    with FolderServer(root, fault_every=fault_every, faults=faults, listings=listings) as server:
        yield server


def _quiet_handle_error(request: Any, client_address: Any) -> None:
    """Clients hanging up mid-body (aiohttp releasing an unread response) are normal here, not errors."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``(start, stop)`` (half-open) for a single satisfiable byte range, ``None`` to serve the whole file
    (no header, several ranges or a malformed one: RFC 9110 lets a server ignore those), ``"unsatisfiable"``."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size
    start = int(first)
    stop = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, stop


def _handler_for(server: FolderServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall
        server_version = "lerobot-dali-test/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _reject_write(self) -> None:
            self._arrival, _ = server._begin(scheduled=False)
            try:
                self._status_only(405, "read-only server", kind="rejected")
            finally:
                server._end()

        do_PUT = do_POST = do_DELETE = _reject_write

        def _local(self) -> Path | None:
            url_path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            target = (server.root / url_path.lstrip("/")).resolve()
            if target != server.root and server.root not in target.parents:
                return None
            return target

        def _serve(self, *, body: bool) -> None:
            self._arrival, fault = server._begin()
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            fault = next((f for key, f in server.fault_paths.items() if key in path), fault)
            try:
                self._answer(fault, body=body)
            finally:
                server._end()

        def _answer(self, fault: str | None, *, body: bool) -> None:
            rng = self.headers.get("Range")
            if fault in _STATUS_FAULTS:
                extra = {} if fault in ("404", "410") else {"Retry-After": "0"}
                self._status_only(int(fault), "injected fault", kind="fault", extra=extra)
                return
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query, keep_blank_values=True))
            if any(self.headers.get(name) != value for name, value in server.required_headers.items()) or any(
                query.get(name) != value for name, value in server.required_query.items()
            ):
                self._status_only(401, "unauthorized", kind="unauthorized")
                return
            target = self._local()
            if target is None or not target.exists() or (target.is_dir() and not server.listings):
                self._status_only(404, "not found", kind="missing")
                return
            if target.is_dir():
                self._listing(target, body=body, fault=fault)
                return
            stat = target.stat()
            size = stat.st_size
            headers = {
                "Content-Type": "application/octet-stream",
                "Accept-Ranges": "bytes",
                "ETag": f'"{size:x}-{stat.st_mtime_ns:x}"',
                "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
                **server.file_headers,
            }
            if not server.versions:
                del headers["ETag"], headers["Last-Modified"]
            elif server.versions == "last_modified":
                del headers["ETag"]
            wanted = self.headers.get("If-Match")
            if (server.if_match == "always" and body) or (  # (before the Range, as RFC 9110 13.2.2 orders them: a
                server.if_match  # file that shrank answers 412, not 416)
                and wanted is not None
                and (server.if_match == "refuse" or wanted.strip() not in ("*", headers.get("ETag")))
            ):
                self._status_only(412, "precondition failed", kind="precondition")
                return
            since = self.headers.get("If-Unmodified-Since")  # (RFC 9110 13.1.4: ignored beside an If-Match)
            if (
                server.if_match
                and since is not None
                and wanted is None
                and (
                    server.if_match == "refuse"
                    or int(stat.st_mtime) > email.utils.parsedate_to_datetime(since).timestamp()
                )
            ):
                self._status_only(412, "precondition failed", kind="precondition")
                return
            span = parse_range(rng, size)
            if span == "unsatisfiable":
                self._status_only(
                    416, "range not satisfiable", kind="range", extra={"Content-Range": f"bytes */{size}"}
                )
                return
            if isinstance(span, tuple) and fault == "whole_as_range":
                headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{size}"
            if isinstance(span, tuple) and fault not in ("no_range", "whole_as_range"):
                start, stop = span
                if fault == "short":  # an honest answer for fewer bytes than asked
                    stop = start + max(1, (stop - start) // 2)
                elif fault == "shifted":
                    start, stop = min(start + 1, size - 1), min(stop + 1, size)
                status, kind = 206, "range"
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
            else:
                start, stop, status, kind = 0, size, 200, "full"
            head, tail = b"", b""
            if fault == "multipart" and status == 206:  # (the Content-Range in its one part)
                part = f"Content-Type: {headers['Content-Type']}\r\nContent-Range: {headers.pop('Content-Range')}"
                head = f"--{BYTERANGES_BOUNDARY}\r\n{part}\r\n\r\n".encode()
                tail = f"\r\n--{BYTERANGES_BOUNDARY}--\r\n".encode()
                headers["Content-Type"] = f"multipart/byteranges; boundary={BYTERANGES_BOUNDARY}"
            if self.command in server.content_length:
                headers["Content-Length"] = str(len(head) + stop - start + len(tail))
            elif body:
                self.close_connection = True  # (the body's end: the connection's)
            if fault == "drop" and (not body or stop == start):
                self._drop()
                self._record(status, kind, rng, 0, size)
                return
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if fault == "stall":
                time.sleep(server.stall_s)
            sent = 0
            if body and fault == "trickle":
                sent = self._trickle(target, start, stop - start)
            elif body:
                limit = (stop - start) // 2 if fault == "drop" else stop - start
                sent = self._copy(target, start, limit, frame=(head, tail))
            if fault == "drop":
                self._drop()
            self._record(status, kind, rng, sent, size)

        def _copy(self, target: Path, start: int, length: int, frame: tuple[bytes, bytes] = (b"", b"")) -> int:
            """Bytes ``[start, start + length)`` of ``target`` sent, between ``frame``'s two (a multipart answer's
            framing); how many of the file's went out (with the framing's, where all of them did)."""
            sent = 0
            try:
                self.wfile.write(frame[0])
                with open(target, "rb") as f:
                    f.seek(start)
                    while sent < length:
                        chunk = f.read(min(_CHUNK, length - sent))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
                self.wfile.write(frame[1])
                self.wfile.flush()
            except (ConnectionError, BrokenPipeError):  # the client released the response unread
                self.close_connection = True
            return sent + (sum(map(len, frame)) if sent == length else 0)

        def _trickle(self, target: Path, start: int, length: int) -> int:
            sent = 0
            try:
                with open(target, "rb") as f:
                    f.seek(start)
                    while sent < length:
                        self.wfile.write(f.read(1))
                        self.wfile.flush()
                        sent += 1
                        time.sleep(server.stall_s)
            except (ConnectionError, BrokenPipeError):  # the client gave up
                self.close_connection = True
            return sent

        def _listing(self, target: Path, *, body: bool, fault: str | None) -> None:
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
            prefix = server.link_prefix
            if prefix == "absolute":
                folder = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).rstrip("/")
                prefix = urllib.parse.quote(f"{folder}/")
            hrefs = [*(prefix + urllib.parse.quote(n) for n in names), *server.index_links]
            links = "".join(f'<li><a href="{html.escape(h)}">{html.escape(h)}</a></li>\n' for h in hrefs)
            page = f"<!DOCTYPE html><html><body><ul>\n{links}</ul></body></html>\n".encode()
            if fault == "drop":
                self._drop()
                self._record(200, "listing", None, 0, None)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if body and fault == "trickle":
                try:
                    for byte in page:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(server.stall_s)
                except (ConnectionError, BrokenPipeError):  # the client gave up
                    self.close_connection = True
            elif body:
                self.wfile.write(page)
            self._record(200, "listing", None, len(page) if body else 0, None)

        def _status_only(self, status: int, text: str, *, kind: str = "missing", extra: dict[str, str] | None = None):
            payload = f"{status} {text}\n".encode()
            # Recorded before it is answered: recorded after, a client's next request (on another connection, so
            # another handler thread) could be recorded first, and tests of the order of requests failed by chance
            # (a 404's HEAD recorded before the GET it followed, 1 run in ~5 on 2 loaded cores).
            self._record(status, kind, self.headers.get("Range"), 0, None)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _drop(self) -> None:
            """Close the connection now, mid-response: the client sees a disconnect or a short body."""
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _record(self, status: int, kind: str, rng: str | None, sent: int, size: int | None) -> None:
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            if_match = self.headers.get("If-Match")
            record = RequestRecord(self.command, path, rng, status, kind, sent, size, url.query, if_match)
            server._record(self._arrival, record)

    return Handler
