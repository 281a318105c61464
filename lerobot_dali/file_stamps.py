"""What identifies each remote file's content (size + etag/blob id/mtime), from one listing per root.

Caches of per-file facts (packet indexes) must notice when a file changes, but asking the server about every
file is one metadata request per file and worker: a mixture of hundreds of Hub datasets then hits the Hub's
request rate limit before the first batch. A recursive listing returns the same facts for a whole folder in
one paginated request, so the main process lists each root once and hands the picklable result to workers.
Filesystems that cannot list, and plain HTTP (its HTML index pages give no sizes: no folder is listed for stamps),
fall back to one memoised ``info`` per file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem

from . import fork_locks
from .concurrent_calls import KeyedLocks
from .distributed import launch_key
from .errors import MissingDataFileError
from .remote_errors import StampUntold, is_missing, is_transient, missing_status
from .remote_retry import RetryingFileSystem
from .request_checks import speaks_http
from .said_once import say_once, warn_once
from .url_secrets import mask_error, masked, masking

__all__ = [
    "FileStamp",
    "FileStamps",
    "client_of",
    "find_files",
    "local_stamps",
    "stamp_from_info",
    "stamp_from_stat",
    "stat_version",
    "stripped",
]

logger = masking(logging.getLogger(__name__))  # (paths that keep a URL's query name it masked)

# Fields of fsspec ``info`` dicts that identify a file's content, best first, with the prefix each version
# gets (so equal strings from different fields never collide). Content hashes first: the Hub's LFS sha256
# and xet hash, its git blob id (changes with any content change, LFS pointers included), GCS md5; then
# ETags (s3fs ``ETag``, gcsfs/adlfs ``etag``, HTTPFileSystem ``ETag`` from the HEAD response) and digests;
# then modification times (LocalFileSystem ``mtime``, s3fs ``LastModified``, gcsfs ``updated``, HTTP
# ``Last-Modified``, Hub buckets ``mtime``/``uploaded_at``).
_VERSION_FIELDS: tuple[tuple[str, str], ...] = (
    ("xet_hash", "xet"),
    ("blob_id", "blob"),
    ("md5Hash", "md5"),
    ("ETag", "etag"),
    ("etag", "etag"),
    ("Content-MD5", "md5"),
    ("Digest", "digest"),
    ("mtime", "mtime"),
    ("LastModified", "mtime"),
    ("last_modified", "mtime"),
    ("Last-Modified", "mtime"),
    ("updated", "mtime"),
    ("uploaded_at", "mtime"),
)


@dataclass(frozen=True)
class FileStamp:
    """A file's size in bytes and a version string that changes with its content (``""`` when unknown).

    ``version`` carries its kind as a prefix (``sha256:``, ``blob:``, ``etag:``, ``mtime:`` ...). With an
    empty version only the size tells two contents apart, so caches keyed on it may serve a stale entry
    for a same-size rewrite: :class:`FileStamps` gives such files a version valid for one run (``run:``).
    """

    size: int
    version: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"FileStamp.size must be a non-negative int (bytes), got {self.size!r}.")
        if not isinstance(self.version, str):
            raise ValueError(f"FileStamp.version must be a str, got {type(self.version).__name__}.")

    @property
    def versioned(self) -> bool:
        """Whether :attr:`version` is the file's own (a hash, ETag, mtime), which tells a same-size rewrite apart: not
        a run's (``run:``, given where the server gives none) or none."""
        return bool(self.version) and not self.version.startswith("run:")


def stamp_from_info(info: Mapping[str, Any]) -> FileStamp:
    """The stamp of a file from its fsspec ``info`` (or ``find(detail=True)``) entry.

    Raises ValueError naming the file when the entry has no size (an HTTP server without Content-Length).
    """
    size = info.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        said = (
            f"{info.get('name', '<unnamed>')}: the filesystem reports no size ({size!r}), so the file cannot be "
            "identified for caching; serve it with a Content-Length header or copy the dataset locally."
        )
        raise ValueError(masked(said))
    return FileStamp(size=size, version=_version(info))


def stamp_from_stat(st: os.stat_result) -> FileStamp:
    """The stamp of a local file from its ``stat``: inode, mtime and ctime, so a file replaced (a new inode) or
    rewritten in place with its size and mtime restored (``utime`` cannot set ctime) misses.

    Not the device: each host numbers a network share (NFS, Lustre) it mounts itself, and again at each mount, while
    the inode and times come from the server; with it, hosts sharing a cache folder (a cluster's ``$HOME``) each
    found the others' entries stale."""
    return FileStamp(size=st.st_size, version=stat_version(st))


def stat_version(st: os.stat_result) -> str:
    """The version of :func:`stamp_from_stat`'s stamp, for stores that compare tens of thousands of files' stamps
    and skip building an object each."""
    return f"stat:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def local_stamps(paths: Iterable[str]) -> dict[str, FileStamp]:
    """The stamps (:func:`stamp_from_stat`) of those local files of ``paths`` that can be stat'ed: one ``stat`` each,
    which also says which exist (as ``os.path.exists``: symlinks followed)."""
    stamps = {}
    for path in paths:
        try:
            stamps[path] = stamp_from_stat(os.stat(path))
        except OSError:
            continue
    return stamps


def _version(info: Mapping[str, Any]) -> str:
    lfs = info.get("lfs")
    if isinstance(lfs, Mapping) and lfs.get("sha256"):
        return f"sha256:{lfs['sha256']}"
    for name, prefix in _VERSION_FIELDS:
        value = info.get(name)
        if value is not None and value != "":
            return f"{prefix}:{str(value).strip(chr(34))}"
    commit = info.get("last_commit")
    if isinstance(commit, Mapping) and commit.get("oid"):
        return f"commit:{commit['oid']}"
    return ""


class FileStamps(Mapping[str, FileStamp]):
    """Stamps of the files under some roots of one filesystem: ``stamps[path]`` makes no request when listed.

    Each root is listed once with ``fs.find(root, detail=True)`` (on the Hub: the paginated ``tree``
    endpoint, one request per 1000 files). A path the listings did not return (a filesystem that cannot
    list, a file outside the roots) costs one ``fs.info`` the first time it is looked up in this process (threads
    looking up the same path at once share that one request).
    ``in`` and iteration cover looked-up and listed paths only and never make a request.

    It pickles as the filesystem plus the stamps (no lock, counters kept), so the main process lists once
    and every worker looks up for free. ``listing_calls`` and ``info_calls`` count the requests made here.
    """

    def __init__(self, fs: Any, roots: Iterable[str] = ()) -> None:
        self.fs = fs
        self.listing_calls = 0
        self.info_calls = 0
        self._stamps: dict[str, FileStamp] = {}
        self._lock = fork_locks.lock()
        self._asking = KeyedLocks()  # (a path's, held while one thread asks the server for its stamp)
        # Files whose server gives no version (no ETag, Last-Modified or hash; a plain HTTP server may not)
        # are versioned by this run: keyed by size alone, a same-size rewrite between runs was served from the
        # caches on disk (old frames, old rows). Pickled with the stamps, so every worker of the run shares it.
        roots = list(roots)
        self._run_version = _run_version(type(fs).__name__, roots)
        self._warned_unversioned = False
        self._pin()
        for root in roots:
            self.add_root(root)

    def _pin(self) -> None:
        """Make reads through :attr:`fs` ask for the stamped versions (:meth:`RetryingFileSystem._pinned`; a union's
        :class:`~.dataset_union.MemberFileSystems` pins them on each dataset's)."""
        if callable(getattr(self.fs, "pin", None)):  # (RetryingFileSystem's, MemberFileSystems')
            self.fs.pin(self)

    @classmethod
    def merged(cls, parts: Sequence[FileStamps], *, fs: Any = None) -> FileStamps:
        """The stamps of ``parts`` (of datasets read as one, each on its own filesystem) as one mapping, on ``fs``
        (None: the first's filesystem; a union's :class:`~.dataset_union.MemberFileSystems`, which routes each path to
        its dataset's): what none listed is looked up through it."""
        merged = cls(parts[0].fs if fs is None else fs)
        for part in parts:
            merged._stamps.update(part._stamps)
            merged.listing_calls += part.listing_calls
            merged.info_calls += part.info_calls
        return merged

    def share(self, other: FileStamps) -> None:
        """Hold one table with ``other`` (in this process): the stamps either holds, ``other``'s first, and what either
        records from now on. A union's copies (for its batches and workers, over the prefetch cache) merge its
        datasets' stamps anew, and lacked those first asked through the union (plain HTTP lists no folder: a video is
        stamped when a reader first asks): asked again after a rewrite, the new file was stamped, and read."""
        with other._lock, self._lock:
            for key, stamp in self._stamps.items():
                other._stamps.setdefault(key, stamp)  # (asked first: the version the run began with)
        self._stamps, self._lock, self._asking = other._stamps, other._lock, other._asking
        self._run_version = other._run_version

    def add_root(self, root: str) -> int:
        """List ``root`` recursively (one call) and record every file's stamp; returns how many were recorded.

        A filesystem that cannot list, one whose listings give no sizes (plain HTTP: not listed), an absent root or a
        failed listing records nothing (logged): lookups then fall back to ``info`` per file, which reports a really
        missing file as MissingDataFileError.
        """
        if speaks_http(self.fs):  # (its HTML index pages give no sizes: not listed, one GET per folder for nothing)
            say_once(logger, logging.INFO,
                "plain HTTP index pages give no file sizes: file stamps come from one info request (HEAD) per file",
            )  # fmt: skip
            return 0
        self.listing_calls += 1
        try:
            listing = find_files(self.fs, root)
        except NotImplementedError:
            say_once(logger, logging.INFO,
                "%s cannot list %s; file stamps come from one info request per file", self.fs, root,
                key=f"unlisted {root}",  # (a filesystem's repr may hold its address: each process's own)
            )  # fmt: skip
            return 0
        except FileNotFoundError:
            say_once(logger, logging.INFO, "%s: listing root does not exist; file stamps come from info requests", root)
            return 0
        except Exception as e:  # a listing is an optimisation: any failure degrades to per-file info requests
            warn_once(
                logger,
                "listing %s failed (%s: %s); file stamps come from one info request per file",
                root,
                type(e).__name__,
                e,
            )
            return 0
        recorded: dict[str, FileStamp] = {}
        for name, info in listing.items():
            if info.get("type", "file") != "file" or not isinstance(info.get("size"), int):
                continue  # HTTP link pages give no sizes: those files are stamped by info on lookup
            recorded[self._key(name)] = self._versioned(stamp_from_info(info), name)
        if not recorded:
            say_once(logger, logging.INFO,
                "listing %s returned no file with a size; file stamps come from info requests", root,
            )  # fmt: skip
        with self._lock:
            self._stamps.update(recorded)
        logger.debug("listed %d files under %s", len(recorded), root)
        return len(recorded)

    def _key(self, path: str) -> str:
        return stripped(self.fs, path)

    def __getitem__(self, path: str) -> FileStamp:
        """The stamp of ``path``; raises MissingDataFileError naming it when it does not exist."""
        key = self._key(path)
        stamp = self._stamps.get(key)
        if stamp is not None:
            return stamp
        with self._asking.held(key):  # (prefetch threads admitting episodes of one file asked the server once each)
            stamp = self._stamps.get(key)
            return stamp if stamp is not None else self._ask(path, key)

    def _ask(self, path: str, key: str) -> FileStamp:
        with self._lock:
            self.info_calls += 1
        try:
            info = self.fs.info(path)
        except FileNotFoundError as e:
            if is_transient(e):  # fsspec's HTTP info raises it from whatever its GET hit: a 503 is no missing file
                raise
            said = (
                f"File {path} does not exist on {type(self.fs).__name__}; check the dataset's files (and the "
                "revision or data_files_root it is read from)."
            )
            raise MissingDataFileError(masked(said), missing_status(e)) from e  # (a server's 404, 410: its status)
        stamp = self._versioned(stamp_from_info({"name": path, **info}), path)
        with self._lock:
            self._stamps[key] = stamp
        return stamp

    def first_changed(self, paths: Iterable[str]) -> tuple[str, str, str] | None:
        """``(path, when recorded, now)`` of the first of ``paths`` that :meth:`change_now` finds changed, or None: for
        error paths only (a file replaced on the server by one of the same size while it was read failed to decode or
        parse, and was called corrupt, which re-encoding or downloading it again does not mend). Asking stops at the
        first file that gets no answer: the read that failed may have failed as the network did, and each file more
        would wait for its own timeout before the read's own error is raised."""
        for path in dict.fromkeys(paths):
            try:
                change = self.change_now(path)
            except Exception:
                logger.debug("asking for the stamp of %s again failed; asking for no more", path, exc_info=True)
                return None
            if change is not None:
                return path, *change
        return None

    def change_now(self, path: str, *, vouching: bool = False) -> tuple[str, str] | None:
        """``(when recorded, now)`` where remote file ``path`` is another file now than its recorded stamp says: its
        size, or its version of the same kind (ETag, hash, mtime), asked anew with one ``info``; None where it is the
        same, was never stamped here, or cannot be told (no version, another kind); ``now`` is 'removed' where the
        server says it has no such file (a 404: fsspec's HTTP info raises FileNotFoundError from it). Over HTTP, where
        the ``info`` gives no size (no Content-Length), the file's first byte is asked (:func:`_asked_by_range`: its
        Content-Range), and where that gives none either, the version the server gave decides alone. Raises where the
        server gives no answer (a 503 too), the credentials of the URL it names masked (:func:`.mask_error`: asked
        outside the retries, which mask the others); :class:`.StampUntold` where it gives neither size nor version.

        ``vouching``: asked whether a read the server refused (412 to its If-Match, 404) may go on as the stamped
        file's: a stamp's version (an ETag) that the server gives no more, another kind (Last-Modified alone) or none
        in its place, cannot tell the file from one of its size put there, so it is a change too ('no etag but
        mtime:... now'): taken for the same, a file replaced while its server stopped sending ETags was read as the
        stamped one."""
        before = self._stamps.get(self._key(path))
        if before is None:
            return None
        # Asked once, not through RetryingFileSystem's retries: on an error path, over a network failing, they waited
        # out the whole backoff schedule for every file asked (16 files: 96 requests and 80 waits, ~3 minutes).
        fs = _client(self.fs, path)
        fs.invalidate_cache(path)  # (s3fs, gcsfs and the Hub answer info from their listings' cache)
        try:
            info = {"name": path, **fs.info(path)}
            if info.get("size") is None and speaks_http(fs):  # (a HEAD without Content-Length: fsspec's GET gave none)
                info.update(_asked_by_range(fs, path))
            size, version = info.get("size"), _version(info)
            if size is None and not version:
                said = (
                    f"{path}: the server, asked for the file's stamp, gave neither its size (Content-Length, or "
                    "Content-Range to a ranged GET) nor its version (ETag, Last-Modified)"
                )
                raise StampUntold(masked(said))
        except Exception as e:
            # (fsspec's HTTP info raises FileNotFoundError from whatever its request hit: a 503, a 403 is no answer)
            if isinstance(e, FileNotFoundError) and is_missing(e):
                return f"{before.size} bytes", "removed"
            mask_error(e)  # (its callers log it: aiohttp's errors name the request's URL, a signed query with it)
            raise
        # (A size not given: the version the server did give tells a change, as where it is given.)
        if size is not None and (now := stamp_from_info(info)).size != before.size:
            return f"{before.size} bytes", f"{now.size} bytes"
        kind = before.version.partition(":")[0]
        if version != before.version and version.partition(":")[0] == kind:
            return before.version, version
        if vouching and before.versioned and version.partition(":")[0] != kind:
            return before.version, f"no {kind} but {version}" if version else "no version"
        return None

    def _versioned(self, stamp: FileStamp, path: str) -> FileStamp:
        if stamp.version:
            return stamp
        if not self._warned_unversioned:
            self._warned_unversioned = True
            warn_once(
                logger,
                "%s (and maybe more files) has no ETag, Last-Modified or content hash: what is cached of such files "
                "on disk serves this run only, since a same-size rewrite could not be told apart",
                path,
            )
        return FileStamp(stamp.size, self._run_version)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._key(path) in self._stamps

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._stamps))

    def __len__(self) -> int:
        return len(self._stamps)

    def __repr__(self) -> str:
        return (
            f"FileStamps({self.fs!r}, {len(self)} files, listing_calls={self.listing_calls}, "
            f"info_calls={self.info_calls})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        with self._lock:  # (a copy: DALI's pickler lets prefetch threads add stamps while it walks the dict)
            state["_stamps"] = dict(self._stamps)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = fork_locks.lock()
        self._pin()  # (the filesystem pickles as its arguments: a worker's copy knows no stamps)


#: How many :class:`FileStamps` this process made of each filesystem kind and roots: the n-th of each rank of one launch
#: shares its run version (:func:`_run_version`).
_made: Counter[tuple[str, ...]] = Counter()
_made_lock = fork_locks.lock()


def _run_version(kind: str, roots: list[str]) -> str:
    """The version (``run:``) of the unversioned files of a new :class:`FileStamps` of ``roots`` on a ``kind``
    filesystem: new for each one, as a new run's, but shared by the ranks that one launcher (``torchrun``, ``srun``,
    ``mpirun``, DeepSpeed's) started on this node for one launch (:func:`~lerobot_dali.distributed.launch_key`), in
    the order each rank makes them of the same roots: with one per rank, 8 ranks of a node wrote 8 Arrow copies of
    each data file per run (column store)."""
    launch = launch_key()
    if launch is None:
        return f"run:{uuid.uuid4().hex}"
    with _made_lock:
        made = (kind, *roots)
        _made[made] += 1
        ordinal = _made[made]
    return f"run:{launch}:{hashlib.sha256(json.dumps([*made, ordinal]).encode()).hexdigest()[:16]}"


#: The headers of an HTTP answer that :func:`_version` reads, as fsspec's HTTP ``info`` names them.
_HTTP_VERSION_HEADERS = ("ETag", "Content-MD5", "Digest", "Last-Modified")


def _asked_by_range(fs: Any, path: str) -> dict[str, Any]:
    """What fsspec's HTTP filesystem ``fs`` is told of ``path`` by a GET of its first byte (its requests' options
    sent, as its reads send them): its size, from ``Content-Range`` (``bytes 0-0/<size>``; a server that ignores the
    Range: its Content-Length, where it sends one unencoded), and its version headers (:data:`_HTTP_VERSION_HEADERS`).
    For a server whose HEAD gives no Content-Length, where fsspec's ``info`` asks with a GET of the whole file, which
    gives none where the server streams it (one byte read, not a file's first blocks)."""
    from fsspec.asyn import sync

    async def ask() -> dict[str, Any]:
        session = await fs.set_session()
        options = dict(fs.kwargs)
        headers = {**(options.pop("headers", None) or {}), "Range": "bytes=0-0", "Accept-Encoding": "identity"}
        async with session.get(fs.encode_url(path), headers=headers, **options) as answer:
            answer.raise_for_status()
            told: dict[str, Any] = {k: answer.headers[k] for k in _HTTP_VERSION_HEADERS if answer.headers.get(k)}
            total = answer.headers.get("Content-Range", "").rpartition("/")[2]
            length = answer.headers.get("Content-Length", "")
            if answer.status == 206 and total.isdigit():
                told["size"] = int(total)
            elif (
                answer.status == 200
                and length.isdigit()
                and answer.headers.get("Content-Encoding", "identity")
                in (
                    "identity",
                    "",
                )
            ):
                told["size"] = int(length)
            return told

    return dict(sync(fs.loop, ask))


def _client(fs: Any, path: str) -> Any:
    """The client that answers for ``path`` under ``fs``'s layers: the prefetch cache (a union's stamps in the workers
    are on it), a union's routing to its dataset's filesystem, the retries."""
    from .cached_filesystem import CachedFileSystem  # (which imports this module)

    while True:
        if isinstance(fs, CachedFileSystem | RetryingFileSystem):
            fs = fs.fs
        elif callable(getattr(fs, "route", None)):  # (MemberFileSystems')
            fs = fs.route(path)
        else:
            return fs


def client_of(fs: Any) -> Any:
    """The filesystem under :class:`RetryingFileSystem`'s retries (``fs`` itself where it has none)."""
    return fs.fs if isinstance(fs, RetryingFileSystem) else fs


def stripped(fs: Any, path: str) -> str:
    """``path`` as ``fs``'s listings name it: its protocol (where the filesystem's names have none) and a trailing
    '/' taken off."""
    return str(client_of(fs)._strip_protocol(path)).rstrip("/")


#: How deep below its root a walk lists folders: LeRobot's nest 3 (videos/<camera>/chunk-000/).
MAX_WALK_DEPTH = 8


def find_files(fs: Any, root: str, *, depth: int | None = None) -> dict[str, dict[str, Any]]:
    """Every file under ``root`` with its info: the filesystem's own recursive ``find`` when it has one (the
    Hub: one tree request; object stores: one paginated listing), else a walk with one ``ls`` per folder (plain
    HTTP, local folders). ``depth``: the walk lists folders that many levels below ``root`` and no deeper (the files
    wanted lie no deeper); None: all, to :data:`MAX_WALK_DEPTH` (deeper ones are named in a warning).

    The walk is ours because fsspec's generic one (``find``'s, ``glob``'s; an async filesystem's too) skips a
    folder whose ``ls`` raised OSError (a reset connection, a timeout) below the top level, returning part of the
    tree (its ``on_error`` does not reach the folders below); ``ls`` through :class:`RetryingFileSystem` is retried
    instead. FileNotFoundError where ``root`` is absent (the walk's; a filesystem's own find may answer none).
    """
    inner = client_of(fs)
    generic = type(inner).find is fsspec.AbstractFileSystem.find or (
        isinstance(inner, AsyncFileSystem) and type(inner)._find is AsyncFileSystem._find
    )
    if not generic:
        listing = fs.find(root, detail=True)
        if not isinstance(listing, Mapping):  # find(detail=True) returns {name: info}; be lenient with lists
            return {entry["name"]: entry for entry in listing}
        return dict(listing)
    files: dict[str, dict[str, Any]] = {}
    pending, seen, deeper = [(root, 0)], set(), []
    limit = MAX_WALK_DEPTH if depth is None else depth
    while pending:
        folder, level = pending.pop()
        here = stripped(fs, folder)
        for info in fs.ls(folder, detail=True):
            name = _below(here, str(info["name"]))
            if name is None:  # (an HTTP index page's link to itself, './', or out of it, '../x/')
                continue
            if info.get("type") != "directory":
                files[name] = info if name == info["name"] else {**info, "name": name}
            # Only folders below this one, each once, at most `limit` down: an HTTP index linking to itself, to its
            # parent, or a server answering every path with the same page would be walked for ever.
            elif name.startswith(f"{here}/") and name not in seen:
                seen.add(name)
                if level < limit:
                    pending.append((name, level + 1))
                elif depth is None:
                    deeper.append(name)
    if deeper:
        logger.warning(
            "%d folder(s) under %s not listed, nesting deeper than %d below it (first: %s): their files are left out",
            len(deeper), root, MAX_WALK_DEPTH, min(deeper),
        )  # fmt: skip
    return files


def _below(here: str, name: str) -> str | None:
    """``name`` (listed in folder ``here``) with its './' and '//' steps taken out, or None where it is ``here`` itself
    or lies outside it ('../'): an HTTP index page's links are joined to the folder's URL as written (Caddy's are
    './name'). Names not under ``here`` are kept as given."""
    name = name.rstrip("/")
    if not name.startswith(f"{here}/"):
        return name
    relative = posixpath.normpath(name[len(here) + 1 :].lstrip("/"))
    return None if relative == "." or relative.startswith("../") or relative == ".." else f"{here}/{relative}"
