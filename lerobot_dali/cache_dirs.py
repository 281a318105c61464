"""Where lerobot_dali keeps what it can rebuild: one root, so a user moves or clears every cache in one place.

``$LEROBOT_DALI_CACHE`` when set, else ``~/.cache/lerobot_dali``; each cache takes a subfolder (``bench``,
``packet_index``). Nothing under it is ever needed for correctness: deleting it only costs rebuild time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["CACHE_ENV", "atomic_file", "cache_root", "try_flock"]

#: Environment variable that moves the cache root (e.g. onto a fast local disk shared by all ranks of a node).
CACHE_ENV = "LEROBOT_DALI_CACHE"


def cache_root() -> Path:
    """``$LEROBOT_DALI_CACHE`` (``~`` expanded) when set and non-empty, else ``~/.cache/lerobot_dali``."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "lerobot_dali"


@contextmanager
def atomic_file(path: Path, *, prefix: str, durable: bool = False) -> Iterator[IO[bytes]]:
    """A temporary file beside ``path`` (named ``prefix*.tmp``) that replaces ``path`` when the block ends, and
    is removed if it raises: workers and ranks sharing a cache never read half a file. ``durable``: synced to
    disk before it replaces ``path`` (else a crash may leave a zero-filled file of the right size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.NamedTemporaryFile(dir=path.parent, prefix=prefix, suffix=".tmp", delete=False)  # noqa: SIM115
    try:
        with tmp:
            yield tmp
            if durable:
                tmp.flush()
                os.fsync(tmp.fileno())
        os.chmod(tmp.name, 0o644)  # temporary files are private; other users sharing the cache may read it
        os.replace(tmp.name, path)
    except BaseException:
        Path(tmp.name).unlink(missing_ok=True)
        raise


def try_flock(path: Path) -> IO[bytes] | None:
    """``path`` opened and exclusively ``flock``ed, or None while another process (or handle) holds it.

    The lock goes with the returned file (closed, or the process gone), so a crash never leaves it taken."""
    handle: IO[bytes]
    try:
        handle = open(path, "a+b")  # noqa: SIM115 (returned open: the caller holds the lock as long as it likes)
    except PermissionError:  # another user's lock file in a shared cache: flock works on a read-only descriptor
        handle = open(path, "rb")  # noqa: SIM115
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        handle.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return handle
