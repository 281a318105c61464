"""Another host's view of a network share (NFS, Lustre) that this one mounts too: its files' ``stat`` differs only by
the device number, which each host allocates itself when it mounts the share (the inode, size and times come from
the server), so a cache folder in a shared ``$HOME`` meets both hosts' stamps of the same files. Or another host's
own copy of them at the same paths (a node-local disk): other inodes too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: The fields of a ``stat_result`` that are not in its tuple.
_NAMED_ONLY = (
    "st_atime",
    "st_mtime",
    "st_ctime",
    "st_atime_ns",
    "st_mtime_ns",
    "st_ctime_ns",
    "st_blksize",
    "st_blocks",
    "st_rdev",
)


def with_identity(st: os.stat_result, inode: int, device: int) -> os.stat_result:
    """``st`` with ``st_ino`` = ``inode`` and ``st_dev`` = ``device``, everything else kept."""
    return os.stat_result((st[0], inode, device, *st[3:]), {name: getattr(st, name) for name in _NAMED_ONLY})


@contextmanager
def on_another_host(
    monkeypatch: pytest.MonkeyPatch, share: Path, *, own_copy: bool = False, host: int = 1
) -> Iterator[None]:
    """Within, ``os.stat`` and ``os.fstat`` of the files under ``share`` report another device number, as another host
    (the ``host``-th) that mounts the same share sees them; ``own_copy``: other inode numbers too, as that host's copy
    of the files."""
    real_stat, real_fstat = os.stat, os.fstat
    root = str(share.resolve())

    def shifted(st: os.stat_result) -> os.stat_result:
        return with_identity(st, st.st_ino + (1_000_003 * host if own_copy else 0), st.st_dev + 7 * host)

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        inside = isinstance(path, str | os.PathLike) and os.path.abspath(os.fspath(path)).startswith(root)  # type: ignore[arg-type]
        return shifted(st) if inside else st

    def fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        try:
            inside = os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        except OSError:
            inside = False
        return shifted(st) if inside else st

    with monkeypatch.context() as patch:
        patch.setattr(os, "stat", stat)
        patch.setattr(os, "fstat", fstat)
        yield
