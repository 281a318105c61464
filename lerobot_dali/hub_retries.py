"""huggingface_hub's own retries, seen from outside: how often it tried a request that failed (:func:`hub_tries`), so
they are not stacked inside the loader's, and a Hub file's block fetch made once (:func:`one_try_hub_fetch`), so the
loader's retries and deadline are its only ones. No huggingface_hub import until a Hub file is read."""

from __future__ import annotations

import inspect
import sys
import traceback
from collections.abc import Callable
from time import monotonic
from typing import Any

from .request_checks import bytes_deadline_s, past_deadline

__all__ = ["hub_tries", "is_hub", "one_try_hub_fetch"]


def one_try_hub_fetch(inner: Any, path: str) -> Callable[[int, int], bytes] | None:
    """For a huggingface_hub ``HfFileSystemFile`` (of ``path``): its block fetch, tried once, within the deadline of
    a plain HTTP request (:func:`~.request_checks.bytes_deadline_s`); None for other files.

    Its own ``_fetch_range`` goes through ``http_backoff``'s 6 tries (1 to 8 s apart, ``Retry-After`` + 1 s after a
    429), inside each of :mod:`~.remote_retry`'s: one block of a Hub dataset that kept answering 503 or 429, or cut
    its response short, was asked 36 times (~150 s of waits without Retry-After, not the ~15 s of the policy's 6
    tries), and ``LEROBOT_DALI_REMOTE_RETRIES=0`` still waited 23 s. This is the same request (its URL and headers),
    made once: the retrying, and the waits a 429 asks for, are :mod:`~.remote_retry`'s. huggingface_hub's timeout
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
        seconds = bytes_deadline_s(end - start)
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
                if (
                    received > end - start
                ):  # (a Range ignored, the whole file sent: :func:`~.request_checks.checked_range` names it)
                    break
                if monotonic() - began > seconds:
                    raise past_deadline(path, start, end, seconds)
        return b"".join(chunks)

    return fetch


def is_hub(fs: Any) -> bool:
    """Whether ``fs`` is huggingface_hub's ``HfFileSystem`` (matched by name: no client imported to tell)."""
    return type(fs).__name__ == "HfFileSystem"


def hub_tries(error: BaseException) -> int:
    """How often huggingface_hub's own backoff (``http_backoff``: 6 tries, 1 to 8 s apart, a 429's ``Retry-After`` or
    ``RateLimit`` + 1 s) tried the request ``error`` ends, where it gave up after retrying (its loop's frame in the
    traceback, or in its causes' tracebacks: :func:`_traceback_frames`, past its ``max_retries``); 0 where it did not
    retry it (it retries no ``repo_info`` or ``paths-info``) or did not make it.

    Its tree requests (HfFileSystem's ``ls``, ``find``, and ``info``, which lists the parent folder) go through it: each
    of :mod:`~.remote_retry`'s tries of a listing of a Hub dataset that kept answering 503 or 429 was 6 requests (36
    with the default 5 retries, ~2.5 minutes of waits without ``Retry-After``; 6 with retries=0). Such a request has
    had its retries (:data:`~.retry_policy.RETRIES_ENV` does not reach them): retrying it there only stacked its
    policy inside the loader's. Its loop is found by its code (a private name: a huggingface_hub that renames it gets
    0, the two stacked as before).

    A file's download (``hf_hub_download``: the metadata's) streams its body through ``http_get``, which tries again
    itself, from the byte it got to, on a connection dropped or timed out (6 tries, 1 s apart, its count restarted by
    each byte received): one of its frames per try, the last with ``_nb_retries`` spent. A metadata file whose body
    kept dropping was 6 GETs in each of :mod:`~.remote_retry`'s tries (36, ~43 s, with the default 5 retries; a
    stalled one 36 read timeouts, ~6 minutes).
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
