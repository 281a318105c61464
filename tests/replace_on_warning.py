"""Another process replacing a cache entry at the moment this one finds it unreadable: a handler on the store's logger
that, when the store warns about the entry, renames a good copy over it (as a process's atomic write does)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_when_warned(logger_name: str, entry: Path, good: bytes) -> Iterator[list[str]]:
    """While open, the first warning naming ``entry`` on ``logger_name`` first replaces ``entry`` with ``good``;
    yields the warnings seen."""
    seen: list[str] = []

    class Replace(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.levelno >= logging.WARNING and str(entry) in message and not seen:
                aside = entry.with_name(f".{entry.name}.good.tmp")
                aside.write_bytes(good)
                os.replace(aside, entry)
            seen.append(message)

    logger = logging.getLogger(logger_name)
    handler, level = Replace(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
