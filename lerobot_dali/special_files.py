"""Local paths where a dataset's file belongs but that ``open`` cannot read as a file.

A named pipe's open waits for a writer, forever: building an iterator or running ``lerobot-dali check`` hung with no
word. A symbolic link that loops failed as a bare OSError past the errors a check lists, and ended ``check`` in a
traceback. Each is said here before the open, so the caller raises its dataset error naming the file.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["not_a_file"]


def not_a_file(path: str) -> str | None:
    """What local ``path`` is, where a file belongs and no file is (``"a named pipe ..."``), else None: a regular file,
    or what the open itself says well (a folder: IsADirectoryError; no such path: FileNotFoundError; no permission:
    PermissionError), each said by its caller. One ``stat``: ~1 us beside the open's own."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symbolic link that loops (or a chain of too many)" if e.errno == errno.ELOOP else None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (its open would wait for a writer forever)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"
