"""Video files as the video route sees them: a path (local or on an fsspec filesystem) or an open file.

One place decides how a source is opened, named in messages and identified in caches, so the packet index,
clip cutting and CPU decoding agree on when a file changed.
"""

from __future__ import annotations

import io
import os
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import IO, Any, TypeAlias

from fsspec.implementations.local import LocalFileSystem

from .errors import MissingDataFileError, missing_video
from .file_stamps import stat_version
from .special_files import not_a_file

__all__ = ["VideoSource", "local_video_path", "open_video_source", "source_cache_key", "source_label", "source_url"]

#: Read-ahead of a remote video file: its reads are box headers, the ``moov`` and GOPs at known offsets, each
#: one request, so a larger block only fetches bytes no read asks for.
VIDEO_READ_AHEAD_BYTES = 256 * 1024

VideoSource: TypeAlias = str | os.PathLike[str] | IO[bytes]
"""A video file: a local path, a path on ``filesystem`` (fsspec), or an open binary file object."""


def source_label(source: VideoSource) -> str:
    """A name for ``source`` in messages: the path, or the path a file object was opened from."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    for attribute in ("path", "name"):
        value = getattr(source, attribute, None)
        if isinstance(value, str):
            return value
    return repr(source)


@contextmanager
def open_video_source(
    source: VideoSource, *, filesystem: Any | None = None, size: int | None = None, exact_reads: bool = False
) -> Iterator[IO[bytes]]:
    """Yield a binary file object for ``source``; paths are opened (and closed) here, file objects lent.

    ``size`` (bytes: what the file's packet index was built from) spares the metadata request a remote open
    makes for it (an HTTP HEAD per open: per batch and file). ``exact_reads``: the caller reads only byte ranges
    it knows, each in one read (packets at the offsets of their index), so a remote file fetches those bytes and
    none ahead (the prefetch cache's view keeps its read-ahead for what it lacks). Raises MissingDataFileError
    naming the path when it does not exist, or is no file (:func:`~.special_files.not_a_file`: a named pipe's
    open hung).
    """
    if not isinstance(source, (str, os.PathLike)):
        yield source
        return
    path = os.fspath(source)
    local = local_video_path(path, filesystem=filesystem)
    kind = None if local is None else not_a_file(local)
    if kind is not None:
        raise MissingDataFileError(
            f"Video file {path} is {kind}, not a video file: download or copy it again from the dataset's source, or "
            "leave out the episodes it holds (episodes=[...] of the others); `lerobot-dali check` lists every such file"
        )
    try:
        if filesystem is None:
            handle = open(path, "rb")  # noqa: SIM115
        elif isinstance(filesystem, LocalFileSystem):
            handle = filesystem.open(path, "rb")
        else:  # (fsspec's default block, 5 MB, was fetched for every 16-byte box header and every GOP)
            known = {} if size is None else {"size": size}
            cache_type = "none" if exact_reads else "readahead"
            handle = filesystem.open(path, "rb", block_size=VIDEO_READ_AHEAD_BYTES, cache_type=cache_type, **known)
    except FileNotFoundError as e:
        raise MissingDataFileError(
            f"Video file {path} does not exist; check the dataset's videos/ folder and its video_path."
        ) from e
    except IsADirectoryError as e:  # (a download's or copy's leftover: Python's bare error crashed `check`)
        raise MissingDataFileError(
            f"{path} is a folder, not a video file: download or copy the file again from the dataset's source, or "
            "leave out the episodes it holds (episodes=[...] of the others); `lerobot-dali check` lists every such file"
        ) from e
    with handle:
        yield handle


def local_video_path(source: VideoSource, *, filesystem: Any | None = None) -> str | None:
    """The path on this machine's disk of ``source`` (a path, local or on fsspec's local filesystem, which
    ``DatasetLocation.is_local`` checks for), None for a remote path or a file object."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    if filesystem is None:
        return os.fspath(source)
    if isinstance(filesystem, LocalFileSystem):
        return str(filesystem._strip_protocol(os.fspath(source)))
    return None


def source_cache_key(source: VideoSource, *, filesystem: Any | None = None) -> Hashable | None:
    """A key that changes when the file does (path, size and a local file's :func:`~.file_stamps.stat_version`:
    inode, mtime, ctime), or None when ``source`` has no identity. A file replaced by a rename that keeps its size and
    mtime (``rsync -a``, ``cp -p`` then ``mv``) is another key: a decoder kept open on the old file is not reused for
    the new one (whose packet index, keyed by the same stat, is another).

    Called per request in the workers, so local files cost one ``stat`` (the absolute path, not the real path:
    resolving links costs a ``lstat`` per path component, and a linked file only gets a second entry).

    Raises MissingDataFileError for a path that does not exist.
    """
    try:
        if isinstance(source, (str, os.PathLike)):
            path = local_video_path(source, filesystem=filesystem)
            if path is not None:  # (os.stat: ~3x cheaper than fs.info)
                stat = os.stat(path)
                return ("local", os.path.abspath(path), stat.st_size, stat_version(stat))
            return _fsspec_key(filesystem, os.fspath(source))
        fs, fs_path = getattr(source, "fs", None), getattr(source, "path", None)
        if fs is not None and isinstance(fs_path, str):
            return _fsspec_key(fs, fs_path)
        name = getattr(source, "name", None)
        if isinstance(name, str) and hasattr(source, "fileno"):
            stat = os.fstat(source.fileno())
            return ("local", os.path.abspath(name), stat.st_size, stat_version(stat))
    except FileNotFoundError as e:
        raise missing_video(source_label(source)) from e
    except (OSError, io.UnsupportedOperation):
        return None
    return None


def source_url(source: str | os.PathLike[str], *, filesystem: Any | None = None) -> str:
    """The URL of a path on ``filesystem`` (``file://`` plus the absolute path without one): a cache key."""
    if filesystem is None:
        return f"file://{os.path.abspath(os.fspath(source))}"
    return str(filesystem.unstrip_protocol(os.fspath(source)))


def _fsspec_key(fs: Any, path: str) -> Hashable:
    info = fs.info(path)
    stamp = next((info[k] for k in ("mtime", "LastModified", "last_modified", "ETag", "etag") if k in info), None)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return (protocol, path, info.get("size"), str(stamp))
