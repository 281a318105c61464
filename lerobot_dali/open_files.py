"""The process's open-file limit (``RLIMIT_NOFILE``), shared out among the caches that keep files open across calls.

Many clusters set a soft limit of 1024, some 256, and a v2.1 dataset has a data file per episode and a video file per
episode and camera: a cache bounded by a fixed count went past a low limit, and opening a file then failed with EMFILE
("Too many open files"). Each cache keeps at most its share of the limit, read when it opens a file; the rest is left
to the process's own files, pipes, sockets and DALI's shared memory (~12 in a worker, measured).
"""

from __future__ import annotations

import errno
import resource
import sys

__all__ = ["DATA_FILE_SHARE", "DECODER_SHARE", "open_files_limit", "open_files_share", "out_of_files"]

#: Open video files' share (the CPU decoders' pool, :class:`~.cpu_decode.CpuFrameDecoder`).
DECODER_SHARE = 1 / 2
#: Open data files' share (:class:`~.episode_rows.ParquetCache`): 128 at the usual 1024.
DATA_FILE_SHARE = 1 / 8


def open_files_limit() -> int:
    """The process's soft limit on open files (1024 by default on Linux); ``1 << 20`` where it has none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_files_share(share: float) -> int:
    """The open files a cache with ``share`` of the limit may keep: at least one."""
    return max(1, int(open_files_limit() * share))


def out_of_files(error: BaseException) -> OSError | None:
    """``error`` said again with what to do where the process has no file descriptor left (EMFILE; its notes kept),
    else None: no file is at fault (a video whose open fails so is not damaged)."""
    if not isinstance(error, OSError) or error.errno != errno.EMFILE:
        return None
    said = OSError(
        error.errno,
        f"{error.strerror} (this process's soft limit: {open_files_limit()}); raise it before starting "
        "(`ulimit -n 4096`), or keep fewer files open (a smaller episode_pool_size, "
        "CpuDecodeOptions(max_open_decoders=...))",
        error.filename,
    )
    if sys.version_info >= (3, 11):
        for note in getattr(error, "__notes__", ()):
            said.add_note(note)
    return said
