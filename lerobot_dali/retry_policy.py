"""The retry policy for remote reads: how many tries (:data:`RETRIES_ENV`), how long between them, and how long a
server's ``Retry-After`` (or the Hub's ``RateLimit``) may ask to wait; and whether reads ask for the version stamped
at open (:data:`IF_MATCH_ENV`). :mod:`~lerobot_dali.remote_retry` applies it."""

from __future__ import annotations

import email.utils
import os
import re
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["IF_MATCH_ENV", "MAX_RETRY_AFTER_S", "RETRIES_ENV", "RetryPolicy", "if_match_on", "retry_after_s"]

#: Environment variable holding the default retry budget (0 disables retries). A request huggingface_hub retries itself
#: (a Hub listing's, :func:`~.hub_retries.hub_tries`) keeps its own 6 tries instead.
RETRIES_ENV = "LEROBOT_DALI_REMOTE_RETRIES"
#: ``0`` sends no ``If-Match`` (nor ``If-Unmodified-Since``: :meth:`~.remote_retry.RetryingFileSystem._pinned`):
#: for servers whose ETag (Last-Modified) for one file differs between their machines (behind a load balancer), which
#: would answer reads 412 that re-opening cannot mend.
IF_MATCH_ENV = "LEROBOT_DALI_IF_MATCH"


def _default_retries() -> int:
    raw = os.environ.get(RETRIES_ENV, "5")
    try:
        value = int(raw)
    except ValueError as e:
        raise ValueError(f"{RETRIES_ENV}={raw!r} is not an integer; set it to 0 (fail fast) or a positive count") from e
    if value < 0:
        raise ValueError(f"{RETRIES_ENV}={raw!r} is negative; set it to 0 (fail fast) or a positive count")
    return value


def if_match_on() -> bool:
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


#: The longest wait a server's ``Retry-After`` may ask for; a longer one is cut to this.
MAX_RETRY_AFTER_S = 300.0
#: The IETF draft ``RateLimit`` header (``"api";r=0;t=55``: 0 requests remain, the window resets in 55 s), which
#: the Hub sends with its 429s.
_RATELIMIT = re.compile(r"\br=(?P<remaining>\d+)\s*;\s*t=(?P<reset>\d+)")


def retry_after_s(error: BaseException) -> float:
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
