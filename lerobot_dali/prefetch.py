"""Prefetch-on-admit: copy what pooled episodes need into the local range cache ahead of the workers.

The sample order says, for any position, which episodes the pool holds, so the prefetcher needs no
feedback from DALI's workers: the training loop reports how far it has consumed, the prefetcher makes the
episodes of the next ``lookahead`` positions local (admission order first, so the pool is warm before the
episodes that come later) and releases the episodes that left the pool behind the consumer. Workers read
through :class:`~lerobot_dali.cached_filesystem.CachedFileSystem`, so a late or failed prefetch costs a
remote read, never a wrong or missing sample.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pickle
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import numpy as np

from . import fork_locks
from .cache_dirs import CACHE_ENV, cache_root, locks_unsupported, private_cache_roots
from .cached_filesystem import CachedFileSystem
from .dataset_reader import LeRobotDatasetReader
from .episode_ranges import EpisodeRanges
from .packet_index_store import PacketIndexStore
from .progress_lines import progress_counter
from .range_cache import ByteRange, CacheBusyError, CacheStats, RangeCache, prune_unused_slots
from .said_once import warn_once
from .sample_order import SampleOrder

__all__ = ["Prefetcher", "prefetching_reader", "wants_prefetch_cache"]

logger = logging.getLogger(__name__)

#: Seconds a warm-up runs before it shows its progress (each epoch warms the cache; most take a moment).
WARM_PROGRESS_DELAY_S = 2.0
#: Seconds close() waits for the admissions reading an episode's parquet footer or packet index (pyarrow and PyAV
#: calling the remote file's Python read; a few round trips): a daemon thread stopped by the interpreter's exit inside
#: such a call aborted the process. One stalled longer on the network is left to its thread, as a fetch is.
READ_WAIT_S = 2.0
#: Seconds close() waits for the background fill thread to stop.
FILL_WAIT_S = 5.0


class Prefetcher:
    """Keeps the range cache holding the episodes of positions ``[consumed, consumed + lookahead)``.

    ``order`` is copied (the prefetcher walks its own; the caller's is not thread-safe). ``version_of``
    maps a path to the cache version of its current content (see :mod:`cached_filesystem`).
    """

    def __init__(
        self,
        reader: LeRobotDatasetReader,
        order: SampleOrder,
        cache: RangeCache,
        *,
        lookahead: int,
        version_of: Any,
        threads: int = 8,
        index_store: PacketIndexStore | None = None,
    ) -> None:
        self.reader = reader
        self.cache = cache
        self.lookahead = max(1, lookahead)
        self._order: SampleOrder = pickle.loads(pickle.dumps(order))
        self._version_of = version_of
        self._ranges = EpisodeRanges(reader, index_store=index_store)
        # Daemon threads (unlike ThreadPoolExecutor's): a fetch stalled on the network never holds up exit.
        self._pool = ThreadPool(threads)
        self._target: tuple[int, int] | None = None
        self._done: tuple[int, int] | None = None
        self._wake = fork_locks.condition()
        self._filling = fork_locks.lock()  # one fill at a time: warm() may meet a background fill
        self._filler: int | None = None  # the thread filling (holding the lock), by ident
        self._reading = fork_locks.condition()  # (notified as each admission's metadata read ends)
        self._readers: set[int] = set()  # threads whose admission reads its episode's metadata, by ident
        self._admitting: set[int] = set()  # threads whose admission is inside the cache, by ident
        self._closed = False
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="lerobot-dali-prefetcher", daemon=True)
        self._thread.start()

    @property
    def stats(self) -> CacheStats:
        return self.cache.stats

    # -- control -------------------------------------------------------------------------------------------
    def warm(self, epoch: int, position: int, *, progress: bool = True) -> None:
        """Fill the cache for ``(epoch, position)`` now, with a progress bar; the first batch then reads local.

        A failure is logged, not raised: the workers then read remotely, and raise if the remote fails them."""
        self._fill_or_log(epoch, position, progress=progress)
        with self._wake:
            self._done = (epoch, position)

    def set_order(self, order: SampleOrder) -> None:
        """Follow another order (after a resume rebuilt it); takes effect at the next fill."""
        copied = pickle.loads(pickle.dumps(order))
        with self._wake:
            self._order = copied
            self._done = None

    def advance(self, epoch: int, position: int) -> None:
        """The consumer stands at ``position`` of ``epoch``; refill in the background."""
        with self._wake:
            self._target = (epoch, position)
            self._wake.notify()

    def close(self) -> None:
        """Stop: queued admissions are dropped and running ones stop at their next range, once they read their
        episode's metadata (:data:`READ_WAIT_S` at most); a fetch stalled on the network is left to its daemon
        thread, so neither this nor the interpreter's exit waits for it. The cache directory is given up for the
        next run.

        On a thread that is itself inside a fill or a read (a signal handler on the main thread in :meth:`warm`,
        a finalizer the collector runs on a reading thread), it waits for neither, which cannot end before it
        returns: it waited 5 s for the background thread (waiting on the fill lock warm() held), or 2 s for its own
        read. On a thread inside the cache (under its lock, or in a write of its own, which the cache's close waits
        for), a thread of its own closes the cache once this one lets them go: that close hung the thread for good."""
        me = threading.get_ident()
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._pool.terminate()
        if self._filler != me and self._thread.ident != me:
            self._thread.join(timeout=FILL_WAIT_S)
        with self._reading:
            if not self._reading.wait_for(lambda: not self._readers - {me}, timeout=READ_WAIT_S):
                logger.debug("close(): %d prefetch threads still read episode metadata", len(self._readers - {me}))
        if me == self._filler or me in self._admitting:
            threading.Thread(target=self.cache.close, name="lerobot-dali-prefetch-cache-close", daemon=True).start()
        else:
            self.cache.close()

    # -- work ----------------------------------------------------------------------------------------------
    def needed(self, epoch: int, position: int) -> np.ndarray:
        """Remote episode positions for ``[position, position + lookahead)``, spilling into the next epoch (a union's
        local datasets' episodes are read from disk: none is copied into the cache)."""
        order = self._order
        total = order.num_samples(epoch)
        parts = [order.pool_window(epoch, position, min(total, position + self.lookahead))]
        spill = position + self.lookahead - total
        if spill > 0:
            parts.append(order.pool_window(epoch + 1, 0, min(order.num_samples(epoch + 1), spill)))
        wanted = (e for e in dict.fromkeys(np.concatenate(parts).tolist()) if not self.reader.episode_is_local(e))
        return np.asarray(list(wanted), dtype=np.int64)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (self._target is None or self._target == self._done):
                    self._wake.wait()
                if self._closed:
                    return
                target = self._target
            assert target is not None
            self._fill_or_log(*target, progress=False)
            with self._wake:
                self._done = target

    def _fill_or_log(self, epoch: int, position: int, *, progress: bool) -> None:
        try:
            with self._filling:
                self._filler = threading.get_ident()
                try:
                    self._fill_locked(epoch, position, progress=progress)
                finally:
                    self._filler = None
        except Exception as e:  # the workers read remotely instead; never take training down from here
            if self._closed:
                return  # (fetches stopped, futures cancelled by close())
            self.failures += 1
            logger.debug("prefetching epoch %d from position %d failed", epoch, position, exc_info=True)
            if str(self.failures).strip("0") == "1":  # (the 1st, 10th, 100th...: a server down fails each fill)
                logger.warning(
                    "%s: prefetching epoch %d from position %d failed (%s: %s)%s; the workers read what it did not "
                    "fetch remotely instead, slower (where that fails too, training stops with the error). "
                    "cache_gb=0 turns prefetching off; each failure's traceback is logged at DEBUG",
                    self.reader.location.description, epoch, position, type(e).__name__, e,
                    f", {self.failures} failures so far" if self.failures > 1 else "",
                )  # fmt: skip

    def _fill_locked(self, epoch: int, position: int, *, progress: bool) -> None:
        wanted = self.needed(epoch, position).tolist()
        keep = set(wanted)
        for owner in self.cache.owners():
            if owner not in keep:
                self.cache.release(owner)
        held = set(self.cache.owners())
        admit = [e for e in wanted if e not in held]
        if not admit:
            return
        failed: Exception | None = None
        stats, fetched_before = self.cache.stats, self.cache.stats.fetched_bytes
        with _progress_bar(len(admit), progress, lambda: stats.fetched_bytes - fetched_before) as admitted:
            results = [self._pool.apply_async(self._admit, (int(e),)) for e in admit]
            for result in results:
                while not result.ready():  # (polled: a closed pool never completes what it dropped)
                    if self._closed:
                        raise _Closed
                    result.wait(0.5)
                try:
                    result.get()
                except Exception as e:  # wait for the others: the next fill must not admit one still running
                    failed = failed or e
                admitted(1)
        if failed is not None:
            raise failed

    def _admit(self, episode_pos: int) -> None:
        with self._reading:  # (counted where close() sees it: a reader starts before close() or not at all)
            if self._closed:
                raise _Closed
            self._readers.add(threading.get_ident())  # (a pool thread runs one admission at a time)
        try:
            ranges = self._ranges.ranges(episode_pos)
        finally:
            with self._reading:
                self._readers.discard(threading.get_ident())
                self._reading.notify_all()
        keys = [ByteRange(path, start, end, self._version_of(path)) for path, start, end in ranges]
        self._admitting.add(threading.get_ident())  # (a pool thread runs one admission at a time)
        try:
            self.cache.acquire(episode_pos, keys, self._fetch)
        except BaseException:
            # Not held, so the next fill tries it again (what it fetched stays on disk for that); held, it was
            # read remotely for as long as it stayed in the pool.
            self.cache.release(episode_pos)
            raise
        finally:
            self._admitting.discard(threading.get_ident())

    def _fetch(self, key: ByteRange) -> bytes:
        if self._closed:
            raise _Closed
        return bytes(self.reader.location.fs.cat_file(key.path, start=key.start, end=key.end))


class _Closed(Exception):
    """The prefetcher was closed while filling."""


def _progress_bar(
    total: int, enabled: bool, fetched_bytes: Callable[[], int]
) -> AbstractContextManager[Callable[[int], None]]:
    """The warm-up's progress where it takes over :data:`WARM_PROGRESS_DELAY_S`: a bar on a terminal (it honours
    ``HF_HUB_DISABLE_PROGRESS_BARS`` like the Hub downloads do), INFO lines in a log. Both say the bytes fetched so far
    (``fetched_bytes()``, counted per range stored) on a timer: over a slow link the first episode took minutes to
    arrive, and nothing showed until it did."""
    return progress_counter(
        total, desc="lerobot-dali: warming prefetch cache", unit="episode", logger=logger, enabled=enabled,
        delay_s=WARM_PROGRESS_DELAY_S, first_line_s=0.0, detail=lambda: f"{fetched_bytes() / 1e6:.1f} MB fetched",
    )  # fmt: skip


def _open_cache(cache_dir: Path, name: str, *, rank: int, cache_bytes: int) -> RangeCache:
    """The rank's cache in ``cache_dir``, or where this process may not write there (another user's folder in a shared
    cache, a read-only mount), in a folder of this user's (:func:`~lerobot_dali.cache_dirs.private_cache_roots`), said
    once: it had no prefetch cache at all, and read every range remotely. That folder's slots no run used for
    ``$LEROBOT_DALI_CACHE_DAYS`` are deleted first, as the shared root's are. Raises the first folder's error where none
    opens."""
    try:
        return RangeCache.open_free_slot(cache_dir / f"rank-{rank}", max_bytes=cache_bytes)
    except OSError as e:
        if not (isinstance(e, PermissionError) or e.errno == errno.EROFS):
            raise
        refused = e
    for root in private_cache_roots():
        private = root / "prefetch" / name
        if private == cache_dir:
            continue
        try:
            prune_unused_slots(private.parent)  # (as the shared root is: nothing else sweeps this one)
            cache = RangeCache.open_free_slot(private / f"rank-{rank}", max_bytes=cache_bytes)
        except OSError:
            continue
        warn_once(
            logger,
            "prefetch cache %s cannot be written by this process (uid %d: %s); prefetching into a cache of this "
            "user's at %s instead. Give it a cache_dir= (or $%s) it may write to keep it elsewhere",
            cache_dir, os.getuid(), refused, private, CACHE_ENV, key=f"private prefetch cache {cache_dir}",
        )  # fmt: skip
        return cache
    raise refused


def wants_prefetch_cache(reader: LeRobotDatasetReader, cache_bytes: int) -> bool:
    """Whether :func:`prefetching_reader` gives ``reader``'s workers a prefetch cache: a remote dataset (a union with
    any), ``cache_bytes`` above 0. Where it found none (every slot busy, a read-only disk), a next pass asks again."""
    return not reader.location.is_local and cache_bytes > 0


def prefetching_reader(
    reader: LeRobotDatasetReader,
    order: SampleOrder,
    *,
    rank: int,
    lookahead: int,
    cache_dir: str | os.PathLike[str] | None,
    cache_bytes: int,
    index_store: PacketIndexStore | None = None,
) -> tuple[LeRobotDatasetReader, Prefetcher | None]:
    """``(reader for the workers, prefetcher)``: for a remote dataset (a union with any, its remote datasets), workers
    read through the cache that the prefetcher fills; a local dataset (or ``cache_bytes == 0``) gets ``(reader,
    None)``, nothing changes.

    Each rank takes its own subfolder (``rank-N``) of ``cache_dir`` (default: under
    :func:`~lerobot_dali.cache_dirs.cache_root`, one folder per dataset), so ranks on a node never evict
    each other's ranges.
    """
    if not wants_prefetch_cache(reader, cache_bytes):
        return reader, None
    name = hashlib.sha256(reader.location.description.encode()).hexdigest()[:16]
    if cache_dir is None:
        prune_unused_slots(cache_root() / "prefetch")  # other datasets' (and ranks') caches left unused
        cache_dir = cache_root() / "prefetch" / name
    try:
        cache = _open_cache(Path(cache_dir), name, rank=rank, cache_bytes=cache_bytes)
    except OSError as e:  # a full disk, every slot busy, no private folder either: the workers read remotely
        fix = "fewer runs on this cache_dir at once" if isinstance(e, CacheBusyError) else "a writable cache_dir="
        if locks_unsupported(e):  # (NFS without its lock daemon, Lustre without -o flock: one writer per folder)
            fix = "a cache_dir= on a filesystem that takes file locks (flock), such as a local disk"
        logger.warning(
            "%s: no prefetch cache (%s); the workers read every range remotely. Give it %s, or cache_gb=0 to "
            "silence this.", reader.location.description, e, fix,
        )  # fmt: skip
        return reader, None
    directory = cache.directory
    cached_fs = CachedFileSystem(reader.location.fs, directory, reader.stamps)
    worker_reader = reader.with_location(replace(reader.location, fs=cached_fs))
    prefetcher = Prefetcher(
        reader,
        order,
        cache,
        lookahead=lookahead,
        version_of=lambda path: cached_fs.identity(path)[1],
        index_store=index_store,
    )
    logger.info(
        "%s: prefetching pooled episodes into %s (at most %.1f GB)",
        reader.location.description, directory, cache_bytes / 1e9,
    )  # fmt: skip
    return worker_reader, prefetcher
