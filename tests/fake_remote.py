"""A fault-injecting fake remote: an fsspec filesystem over a local folder that misbehaves on schedule.

Protocol ``fakeremote``. Every request (``open``, ``read``, ``info``, ``exists``, ``ls``, ``glob``,
``cat_file``) is counted by kind in :attr:`FakeRemoteFileSystem.requests`; with ``fault_every=N`` the N-th,
2N-th, ... request (counted over all kinds) fails with the next fault of ``faults`` in turn, so a test
knows exactly which requests fail. A failing read may first deliver part of its bytes (``reset``) or just
return fewer bytes than asked (``truncate``), as real HTTP streams do. Spawned workers unpickle the
filesystem by importing this module, so ``tests`` must be importable there (run from the repo root).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["FAULT_KINDS", "FakeHTTPError", "FakeRemoteFileSystem", "fault_exception", "nth_fault"]

#: ``timeout``: TimeoutError; ``503``/``429``: an error with ``.status``; ``reset``: ConnectionResetError
#: (reads deliver half the bytes first); ``truncate``: a read returns half the bytes asked, no error;
#: ``missing``: FileNotFoundError (not transient: must never be retried); ``denied``: PermissionError (s3fs's
#: answer to a 403: not transient, and not "absent" either).
FAULT_KINDS = ("timeout", "503", "429", "reset", "truncate", "missing", "denied")


class FakeHTTPError(Exception):
    """An HTTP error response, shaped like aiohttp's ``ClientResponseError`` (a ``status`` attribute)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status

    def __str__(self) -> str:
        return f"{self.status}, message={self.args[1]!r}"


def nth_fault(n: int, every: int, faults: tuple[str, ...]) -> str | None:
    """The fault of the ``n``-th request (counted from 1) where every ``every``-th one fails (0: none does), with the
    next of ``faults`` in turn."""
    if not every or n % every:
        return None
    return faults[(n // every - 1) % len(faults)]


def fault_exception(kind: str, path: str) -> Exception:
    """The exception a request for ``path`` raises under fault ``kind`` (not used for ``truncate``)."""
    if kind == "timeout":
        return TimeoutError(f"fake remote: request for {path} timed out")
    if kind == "503":
        return FakeHTTPError(503, f"Service Unavailable: {path}")
    if kind == "429":
        return FakeHTTPError(429, f"Too Many Requests: {path}")
    if kind in ("reset", "truncate"):
        return ConnectionResetError(f"fake remote: connection reset while reading {path}")
    if kind == "missing":
        return FileNotFoundError(f"fake remote: {path} not found")
    if kind == "denied":
        return PermissionError(13, f"fake remote: access denied to {path}")
    raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")


class FakeRemoteFileSystem(fsspec.AbstractFileSystem):
    """Paths are relative to ``root`` (a local folder); ``fakeremote://a/b`` is ``root/a/b``."""

    protocol = "fakeremote"
    cachable = False

    def __init__(
        self,
        root: str,
        *,
        fault_every: int = 0,
        faults: tuple[str, ...] = ("timeout", "503", "429", "reset", "truncate"),
        latency_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        unknown = [f for f in faults if f not in FAULT_KINDS]
        if fault_every < 0 or not faults or unknown:
            raise ValueError(f"fault_every must be >= 0 and faults a non-empty subset of {FAULT_KINDS}")
        super().__init__(root, fault_every=fault_every, faults=tuple(faults), latency_s=latency_s, **kwargs)
        self.root = os.path.abspath(root)
        self.fault_every = fault_every
        self.faults = tuple(faults)
        self.latency_s = latency_s
        self.requests: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self._total = 0
        self._lock = threading.Lock()
        self._local = LocalFileSystem()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        text = str(path)
        if text.startswith("fakeremote://"):
            text = text[len("fakeremote://") :]
        return text.strip("/")

    def _real(self, path: str) -> str:
        return os.path.join(self.root, self._strip_protocol(path))

    def _request(self, kind: str, path: str) -> str | None:
        """Count one request; return the fault it suffers, if any."""
        if self.latency_s:
            time.sleep(self.latency_s)
        with self._lock:
            self.requests[kind] += 1
            self._total += 1
            n = self._total
        fault = nth_fault(n, self.fault_every, self.faults)
        if fault is not None:
            self.faults_injected[fault] += 1
        return fault

    def _check(self, kind: str, path: str) -> None:
        fault = self._request(kind, path)
        if fault is not None:
            raise fault_exception(fault, path)

    def _public(self, entry: dict[str, Any]) -> dict[str, Any]:
        out = dict(entry)
        out["name"] = os.path.relpath(entry["name"], self.root).replace(os.sep, "/")
        return out

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._check("info", path)
        return self._public(self._local.info(self._real(path)))

    def exists(self, path: str, **kwargs: Any) -> bool:
        self._check("exists", path)
        return os.path.exists(self._real(path))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._check("ls", path)
        entries = [self._public(e) for e in self._local.ls(self._real(path), detail=True)]
        return entries if detail else [e["name"] for e in entries]

    def glob(self, path: str, **kwargs: Any) -> Any:
        self._check("glob", path)
        return [os.path.relpath(p, self.root).replace(os.sep, "/") for p in self._local.glob(self._real(path))]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self._check("cat_file", path)
        return bytes(self._local.cat_file(self._real(path), start=start, end=end))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> _FakeRemoteFile:
        if mode != "rb":
            raise PermissionError(f"fake remote is read-only; cannot open {path} with mode {mode!r}")
        self._check("open", path)
        return _FakeRemoteFile(self, path, self._real(path))


class _FakeRemoteFile:
    """A read-only file whose reads go through the filesystem's fault schedule."""

    def __init__(self, fs: FakeRemoteFileSystem, path: str, real: str) -> None:
        self._fs, self.path = fs, path
        self._f = open(real, "rb")  # noqa: SIM115 - closed by close()
        self.size = os.fstat(self._f.fileno()).st_size
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        fault = self._fs._request("read", self.path)
        if fault in ("reset", "truncate"):
            want = self.size - self._f.tell() if size is None or size < 0 else size
            part = self._f.read(max(want // 2, 0))
            if fault == "truncate" and part:
                return part
            raise fault_exception("reset", self.path)
        if fault is not None:
            raise fault_exception(fault, self.path)
        return self._f.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()
        self.closed = True

    def __enter__(self) -> _FakeRemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


fsspec.register_implementation("fakeremote", FakeRemoteFileSystem, clobber=True)
