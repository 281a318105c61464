"""Write a dataset folder so that it appears whole or not at all: a half-written dataset that looks complete
would train on missing episodes, and one left behind by a crash would block the re-run."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_new_folder"]


def write_new_folder(out: str | os.PathLike[str], write: Callable[[Path], None], *, writer: str) -> Path:
    """Run ``write(folder)`` so that ``out`` holds a dataset only once every file of it is written.

    A new ``out`` is written as a hidden sibling (``.<name>.tmp-<pid>-<random>``) renamed to ``out`` at the end; an
    existing empty folder (a mount point, say) is written in place and emptied again if writing fails. Either
    way an interrupted or failed run (Ctrl-C, a full disk) leaves nothing that blocks a re-run. Missing parent
    folders are created.
    """
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"Refusing to write a dataset into {root}: it exists and is not an empty directory. "
            f"Pass a new path ({writer} never overwrites)."
        )
    if root.is_dir():
        try:
            write(root)
        except BaseException:
            for entry in list(root.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            raise
        return root
    absolute = Path(os.path.abspath(root))
    try:
        absolute.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        blocker = next(parent for parent in absolute.parents if parent.exists())
        raise NotADirectoryError(f"Cannot write a dataset to {root}: {blocker} is a file, not a directory.") from e
    staging = absolute.parent / f".{absolute.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"  # one per run
    staging.mkdir()  # (not mkdtemp: its 0700 would become the dataset's mode)
    try:
        write(staging)
        try:
            staging.rename(absolute)
        except OSError as e:
            if not absolute.exists():
                raise
            raise FileExistsError(  # another run wrote it meanwhile
                f"Refusing to write a dataset into {root}: it appeared while this one was written (another run?)"
            ) from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
