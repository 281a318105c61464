"""The process's open-file limit (``RLIMIT_NOFILE``), shared out among the caches that keep files open across calls.

Many clusters set a soft limit of 1024, some 256, and a v2.1 dataset has a data file per episode and a video file per
episode and camera: a cache bounded by a fixed count went past a low limit, and opening a file then failed with EMFILE
("Too many open files"). The caches of each kind keep at most their share of the limit all together, read when one
opens a file (:class:`FileShare`); the rest is left to the process's own files, pipes, sockets and DALI's shared
memory (~12 in a worker, measured).
"""

from __future__ import annotations

import errno
import os
import resource
import sys
import weakref

from . import fork_locks

__all__ = [
    "DATA_FILES",
    "DATA_FILE_SHARE",
    "DECODERS",
    "DECODER_SHARE",
    "FileShare",
    "open_files_limit",
    "open_files_share",
    "out_of_files",
    "refuse_workers_past_open_files",
    "workers_files_fix",
]

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


class FileShare:
    """A kind of cache's share of the open-file limit, shared by this process's caches of that kind: each keeps at
    most an even split of it among those holding files, and no more than the others leave (one alone keeps it all).

    A mixture without workers reads several datasets in one process, each with its own decoders and data files: each
    cache keeping the whole share, 4 datasets kept twice the limit open and failed with EMFILE at ``ulimit -n 256``.
    A split alone was not enough: a pipeline's first batches, read before the next dataset's cache held any file,
    filled the share, which that cache gives up only as it opens files again; what the others leave bounds the
    newcomers meanwhile. Those that had all their files never opened again: a newcomer kept one file all the same,
    the share passed by one per newcomer (65 videos of 64, 18 data files of 16 at ``ulimit -n 128``, 3 datasets),
    and it reopened that file at each request while the others kept more than their split. Now a newcomer keeps
    none where none is left, and asks those over their split to give it up at their next call
    (:meth:`asked`), on their own thread (a decoder in use is never closed under it); it counts in their split until
    it holds files or closes (:meth:`leaving`), else a busy one took the share back at its next opens, batch after
    batch. A forked child counts only the caches it uses itself.
    """

    def __init__(self, share: float) -> None:
        self.share = share
        #: This process's caches holding files (weak references) -> how many, as each said after its latest open.
        self._held: dict[weakref.ref[object], int] = {}
        #: Caches asked to keep at most this many (their split when a newcomer found none left).
        self._asked: dict[weakref.ref[object], int] = {}
        #: Caches that found none of the share left and keep none: counted in the others' split until they hold
        #: files or leave (:meth:`leaving`), else the one asked to trim took it all back at its next opens.
        self._waiting: dict[weakref.ref[object], None] = {}
        self._pid = os.getpid()
        # Reentrant, its dicts changed and copied in single C calls: the cycle collector runs inside any allocation,
        # one under this lock too, and an iterator it frees closes its caches there (holding(cache, 0)); a plain
        # lock hung that thread for good.
        self._lock = fork_locks.rlock()

    def holding(self, holder: object, files: int) -> None:
        """Record that ``holder`` keeps ``files`` open now (0: it has closed them and counts no more)."""
        with self._lock:
            held = self._this_process()
            if files:
                held[weakref.ref(holder)] = files
                self._waiting.pop(weakref.ref(holder), None)
            else:
                held.pop(weakref.ref(holder), None)
                self._asked.pop(weakref.ref(holder), None)
            for kept in (held, self._asked, self._waiting):  # (those collected without saying 0)
                for freed in [cache for cache in kept.copy() if cache() is None]:
                    kept.pop(freed, None)

    def files_for(self, holder: object) -> int:
        """The open files ``holder`` may keep: its split of the share, within what the others left (0: none is
        left, and the file it opened is closed after use). Where that is less than its split, each other holding
        more than its split is asked to give the rest up."""
        with self._lock:
            held = self._this_process().copy()
            others = {cache: files for cache, files in held.items() if cache() is not None and cache() is not holder}
            waiting = [cache for cache in self._waiting.copy() if cache() is not None and cache() is not holder]
            whole = open_files_share(self.share)
            split = max(1, whole // (len(others.keys() | waiting) + 1))
            left = whole - sum(others.values())
            if left < split:
                for cache, files in others.items():
                    if files > split:
                        self._asked[cache] = split
            if left <= 0:
                self._waiting[weakref.ref(holder)] = None
        return max(0, min(split, left))

    def leaving(self, holder: object) -> None:
        """Record that ``holder`` has closed its files and wants none until it opens one again (a closed cache): no
        more counted in the others' split."""
        with self._lock:
            self.holding(holder, 0)
            self._waiting.pop(weakref.ref(holder), None)

    def asked(self, holder: object) -> int | None:
        """The open files ``holder`` was asked to keep at most since it last looked (None: it was not); a cache
        looks at each call, opening a file or not, and trims to it."""
        with self._lock:
            self._this_process()
            return self._asked.pop(weakref.ref(holder), None)

    def _this_process(self) -> dict[weakref.ref[object], int]:
        if self._pid != os.getpid():  # (inherited through fork: the parent's caches hold the parent's files)
            self._held, self._asked, self._waiting = {}, {}, {}
            self._pid = os.getpid()
        return self._held


#: The CPU decoders' open video files.
DECODERS = FileShare(DECODER_SHARE)
#: The parquet caches' open data files.
DATA_FILES = FileShare(DATA_FILE_SHARE)


#: What an EMFILE said again names: the limit (which :func:`out_of_files` says once).
_SAID = "this process's soft limit"


def out_of_files(error: BaseException) -> OSError | None:
    """``error`` said again with what to do where the process has no file descriptor left (EMFILE; its notes kept),
    else None: no file is at fault (a video whose open fails so is not damaged). One said so already is itself (a
    worker's batch met it in a video file's open, which said it first)."""
    if not isinstance(error, OSError) or error.errno != errno.EMFILE:
        return None
    if _SAID in (error.strerror or ""):
        return error
    said = OSError(
        error.errno,
        f"{error.strerror} ({_SAID}: {open_files_limit()}); raise it before starting "
        "(`ulimit -n 4096`), or keep fewer files open (a smaller episode_pool_size, "
        "CpuDecodeOptions(max_open_decoders=...))",
        error.filename,
    )
    if sys.version_info >= (3, 11):
        for note in getattr(error, "__notes__", ()):
            said.add_note(note)
    return said


#: Files each DALI worker holds open in the training process, measured on DALI 2.x from /proc/self/fd after the first
#: batch: 1 worker 5 more than before, 2 workers 7, 4 workers 11, 8 workers 19 (a socket and the process's sentinel
#: each, and 3 for the pool). The check below counts only the 2 a worker cannot start without.
_FILES_PER_WORKER = 2


def workers_files_fix(num_workers: int) -> str:
    """What to do where ``num_workers`` workers would pass this process's open-file limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fewer = f"pass fewer workers (--num-workers; this machine has {os.cpu_count()} CPUs)"
    if soft == resource.RLIM_INFINITY:  # (it said "raise the soft limit of -1 open files: `ulimit -n 1199999`")
        return f"{fewer}: the open-file limit is unlimited, which Linux holds to {open_files_limit()} (fs.nr_open)"
    enough = soft + _FILES_PER_WORKER * num_workers  # (what is open now is under the soft limit)
    over_hard = hard != resource.RLIM_INFINITY and enough > hard
    return (
        f"{fewer}, or raise the soft limit of {soft} open files: `ulimit -n {enough}` in the shell that starts training"
        + (f" (past the hard limit of {hard}, which only an administrator raises)" if over_hard else "")
    )


def refuse_workers_past_open_files(num_workers: int) -> None:
    """Refuse ``num_workers`` workers that could not all start within this process's soft open-file limit (DALI's
    pool failed with a bare "Too many open files" from a socketpair deep within its start)."""
    soft = open_files_limit()
    if num_workers == 0:
        return
    try:
        open_now = len(os.listdir("/proc/self/fd")) - 1  # (less the listing's own)
    except OSError:  # (no /proc: nothing counted, nothing refused; the start still says it)
        return
    needed = _FILES_PER_WORKER * num_workers
    if open_now + needed > soft:
        raise ValueError(
            f"num_workers={num_workers} cannot start: each DALI worker holds at least {_FILES_PER_WORKER} files open "
            f"in this process ({needed} in all), but {open_now} of its limit of {soft} are open already; "
            + workers_files_fix(num_workers)
        )
