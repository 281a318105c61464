"""A folder this process may read but not write, as another user's in a shared cache is, for tests run as root (which
may write whatever the permission bits say): every call that would create, replace, delete or touch anything under it
raises PermissionError, as it does for another user; reads go through."""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@contextmanager
def not_writable(folder: Path) -> Iterator[None]:
    """Within, ``folder`` (and what it holds, or will) is read-only for this process."""
    root = os.path.abspath(folder)

    def under(path: Any) -> bool:
        if isinstance(path, int) or not isinstance(path, str | bytes | os.PathLike):
            return False
        name = os.path.abspath(os.fsdecode(path))
        return name == root or name.startswith(root + os.sep)

    def refuse(path: Any) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))

    def guarded(real: Any, *, paths: int = 1) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            for path in args[:paths]:
                if under(path):
                    refuse(path)
            return real(*args, **kwargs)

        return call

    def guarded_open(real: Any) -> Any:
        def call(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if under(file) and set(mode) & set("wax+"):
                refuse(file)
            return real(file, mode, *args, **kwargs)

        return call

    real_os_open = os.open

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if under(path) and flags & _WRITES:  # (O_TMPFILE comes with O_WRONLY or O_RDWR)
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(builtins, "open", guarded_open(builtins.open))
        monkeypatch.setattr(io, "open", guarded_open(io.open))
        for name in ("mkdir", "unlink", "remove", "rmdir", "utime"):
            monkeypatch.setattr(os, name, guarded(getattr(os, name)))
        for name in ("replace", "rename", "link"):
            monkeypatch.setattr(os, name, guarded(getattr(os, name), paths=2))
        real_access = os.access
        monkeypatch.setattr(
            os, "access", lambda path, mode, **k: not (under(path) and mode & os.W_OK) and real_access(path, mode, **k)
        )
        yield
