"""Where a dataset lives: a local folder, a Hub repo id, or any fsspec URL.

Metadata is small and read once, so for the Hub it is downloaded (``meta/`` only) through huggingface_hub's
cache; bulk ``data/`` and ``videos/`` bytes stay remote and are read lazily through fsspec, which keeps a
multi-terabyte dataset usable from a machine whose disk holds none of it. Those bulk reads are pinned to
the commit the metadata snapshot came from, so a branch that moves mid-training cannot pair old metadata
with new data files (and are read from that snapshot folder where it holds them all:
:mod:`~lerobot_dali.hub_cache_files`).
"""

from __future__ import annotations

import glob
import inspect
import io
import logging
import os
import re
import ssl
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.local import LocalFileSystem

from .distributed import draws_progress
from .errors import DatasetNotFoundError, RemoteFileError
from .file_stamps import client_of
from .remote_errors import REFUSED_HINT, first_line, is_refused, is_transient
from .remote_retry import RetryingFileSystem, fresh_instance, retried
from .said_once import say_once, warn_once
from .special_files import not_a_file
from .url_secrets import mask_path_logs, masked, masking, without_credentials

__all__ = [
    "DatasetLocation",
    "HubSnapshot",
    "dataset_folder_near",
    "dataset_not_found",
    "fetches_whole",
    "is_repo_id",
    "read_if_present",
    "read_whole",
    "resolve_location",
    "with_bulk_root",
]

logger = masking(logging.getLogger(__name__))  # (paths that keep a URL's query name it masked)

#: Read-ahead for remote bulk files: large enough to amortise a request, small against multi-GB files.
READ_AHEAD_BYTES = 4 * 1024 * 1024

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: ``hf://datasets/<user>/<name>[@<revision>][/<subfolder>]``, split as huggingface_hub's HfFileSystem splits it
#: (its ``resolve_path`` asks the Hub whether the repo exists, so it cannot be called here): a revision ends at
#: the first "/" unless it is a special ref (``refs/pr/N``, ``refs/convert/<name>``); a branch or tag holding
#: "/" is written percent-encoded (``@feature%2Fx``) and decoded before use.
_HF_DATASET_URL = re.compile(
    r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)"
    r"(?:@(?P<rev>refs/pr/\d+|refs/convert/[\w.-]+|[^/]+))?"
    r"(?:/(?P<sub>.*))?$"
)
#: The address a browser shows for a Hub dataset (or a folder of it), which no file is read from.
#: A folder's page (``tree/<revision>/<folder>``) or a file's (``blob/...``) names its revision; the viewer's names a
#: config and split, none of them a revision. hf.co is the Hub's short address.
_HUB_PAGE_URL = re.compile(
    r"^https?://(?:www\.)?(?:huggingface|hf)\.co/datasets/(?P<repo>[^/?#]+/[^/?#]+)"
    r"(?:/(?:(?P<kind>tree|blob)/(?P<rev>[^/?#]+)(?:/(?P<sub>[^?#]*))?|viewer(?:/[^?#]*)?))?/?(?:[?#].*)?$"
)
#: A full commit SHA, as huggingface_hub names snapshot folders (``.../snapshots/<sha>``).
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
#: A commit SHA cut short, as the Hub's pages show one (7 characters): only the Hub resolves it, not its cache.
_SHORT_SHA = re.compile(r"^[0-9a-f]{4,39}$")
#: ``storage_options`` keys that also tell ``snapshot_download`` which Hub to ask and as whom.
_HUB_DOWNLOAD_OPTIONS = ("token", "endpoint")


def read_whole(fs: fsspec.AbstractFileSystem, path: str) -> io.BytesIO:
    """Metadata file ``path`` read whole, in one request (``cat_file``), as an in-memory file: over HTTP one GET,
    where opening it asked for its size first (a HEAD and a GET). Through :class:`.RetryingFileSystem` a transient
    failure is retried as the whole file again, so no read mixes two versions of it. A filesystem without a
    ``cat_file`` of its own (local folders, huggingface_hub's) is read as before: opened, then read to its end.
    FileNotFoundError where there is no such file."""
    if not fetches_whole(fs):  # (local files, the Hub: fsspec's would open and read all, another route)
        with fs.open(path, "rb") as f:
            return io.BytesIO(f.read())
    return io.BytesIO(fs.cat_file(path))


def fetches_whole(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether :func:`read_whole` reads ``fs``'s files in one request: the filesystem under ``fs`` has a ``cat_file``
    of its own (an async one: ``_cat_file``; HTTP's, object stores'), not fsspec's generic one that opens the file
    and reads it."""
    inner = client_of(fs)
    if isinstance(inner, AsyncFileSystem):
        return type(inner)._cat_file is not AsyncFileSystem._cat_file
    return type(inner).cat_file is not fsspec.AbstractFileSystem.cat_file


def read_if_present(fs: fsspec.AbstractFileSystem, path: str) -> io.BytesIO | None:
    """:func:`read_whole`, or None where there is no such file: over HTTP one GET answered 404, where ``exists``
    then ``open`` made two HEADs, and ``open`` of a missing file a HEAD and a GET."""
    try:
        return read_whole(fs, path)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class HubSnapshot:
    """Where huggingface_hub's cache keeps a Hub dataset's files at the commit its bulk reads are pinned to: the
    folder its metadata was read from, which holds ``data/`` and ``videos/`` too once the whole dataset is
    downloaded (``hf download --repo-type dataset``)."""

    repo_id: str
    commit: str  #: full SHA, the name of the snapshot folder
    folder: str  #: the dataset root's counterpart in the snapshot folder (its subfolder, where one is given)
    subfolder: str  #: "" or the dataset's folder in the repo, with a trailing "/"


@dataclass(frozen=True)
class DatasetLocation:
    """A dataset root as two filesystems: one for ``meta/`` and one for bulk files (often the same).
    ``hub_snapshot``: a Hub dataset's snapshot folder in huggingface_hub's cache, of the commit its bulk files are
    read at (None for other datasets, and where ``data_files_root`` serves them)."""

    fs: fsspec.AbstractFileSystem
    root: str
    meta_fs: fsspec.AbstractFileSystem
    meta_root: str
    description: str
    hub_snapshot: HubSnapshot | None = None

    def __repr__(self) -> str:
        """The dataclass's, the credentials its paths name masked (:func:`.masked`: a filesystem that keeps a URL's
        query in its paths, ``memory://b/ds?token=...``, roots the dataset there)."""
        return masked(
            f"DatasetLocation(fs={self.fs!r}, root={self.root!r}, meta_fs={self.meta_fs!r}, "
            f"meta_root={self.meta_root!r}, description={self.description!r}, hub_snapshot={self.hub_snapshot!r})"
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (a DALI worker's, a spawned process's): where its paths keep a URL's query, its credentials are
        masked in this process's records and texts too, as where it was made (:func:`.mask_path_logs`): a worker's
        DEBUG lines named them (42 of an epoch's, one worker)."""
        self.__dict__.update(state)
        for fs, root in ((self.fs, self.root), (self.meta_fs, self.meta_root)):
            if "?" in root and not isinstance(fs, LocalFileSystem):
                mask_path_logs(root.partition("?")[2])

    def path(self, relative: str) -> str:
        """Path of a bulk file (``data/...``, ``videos/...``) on ``fs``."""
        return f"{self.root.rstrip('/')}/{relative}" if self.root else relative

    def meta_path(self, relative: str) -> str:
        return f"{self.meta_root.rstrip('/')}/{relative}" if self.meta_root else relative

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def open_bulk(self, path: str, *, size: int | None = None) -> Any:
        """A binary file on ``fs``; remote reads fetch ahead in bounded blocks, never the whole file. ``size`` (bytes,
        from the file's stamp) spares the metadata request a remote open makes for it (an HTTP HEAD)."""
        if self.is_local:
            return self.fs.open(path, "rb")
        known = {} if size is None else {"size": size}
        return self.fs.open(path, "rb", block_size=READ_AHEAD_BYTES, cache_type="readahead", **known)


def resolve_location(
    path_or_repo: str | os.PathLike[str],
    *,
    revision: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> DatasetLocation:
    """Turn what the user typed into filesystems.

    An existing local folder wins over a repo id of the same spelling. ``revision`` applies to the Hub
    (branch, tag, ``refs/pr/N`` or commit SHA, spelled plainly: ``feature/x``, not ``feature%2Fx``); an
    ``hf://`` URL may carry it after ``@`` instead, percent-encoded where it holds "/".
    """
    target = os.fspath(path_or_repo)
    options = storage_options or {}
    if revision is not None and not str(revision).strip():  # (read as None, main, unsaid)
        raise ValueError(f"revision {revision!r} is empty: give a branch, tag or commit, or none for the default")
    if "://" not in target and os.path.isdir(target):
        _revision_ignored(revision, target, "a local folder")
        local = LocalFileSystem()
        root = os.path.abspath(target)
        return DatasetLocation(local, root, local, root, root)
    match = _HF_DATASET_URL.match(target)
    if match:
        in_url = unquote(match["rev"]) if match["rev"] else None
        return _hub_location(match["repo"], _one_revision(target, in_url, revision), match["sub"] or "", options)
    if target.startswith("hf://") and not target.startswith("hf://buckets/"):
        raise _no_hub_dataset(target)
    page = _HUB_PAGE_URL.match(target)
    if page:
        raise DatasetNotFoundError(f"{target!r} is the dataset's web page, not its files: {_hub_page_advice(page)}")
    if "://" in target:
        _revision_ignored(revision, target, "not a Hub dataset")
        target, options = _http_query_as_params(target, options)
        fs, root = _remote_fs(target, options)
        return DatasetLocation(fs, root, fs, root, without_credentials(target))
    if is_repo_id(target) and not os.path.exists(target):
        return _hub_location(target, revision, "", options, maybe_path=True)
    raise dataset_not_found(target)


def _hub_page_advice(page: re.Match[str]) -> str:
    """What to pass for a Hub dataset's web page ``page``: its repo id, with the revision and the dataset folder
    (the part of its path before a ``meta`` folder or a file) where the page names them."""
    revision = unquote(page["rev"] or "main")
    folder = [part for part in (page["sub"] or "").split("/") if part]
    folder = folder[:-1] if page["kind"] == "blob" else folder  # (a file's page: the folder holding it)
    sub = "/".join(folder[: folder.index("meta")] if "meta" in folder else folder)
    if revision == "main" and not sub:
        return f"pass {page['repo']!r} (or 'hf://datasets/{page['repo']}'; revision= for a branch, tag or commit)"
    url = f"hf://datasets/{page['repo']}{_at(revision if revision != 'main' else None)}/{sub}".rstrip("/")
    return f"pass {url!r} (its files{f' at revision {revision!r}' if revision != 'main' else ''})"


def _no_hub_dataset(target: str) -> DatasetNotFoundError:
    """The error for an ``hf://`` URL that names no dataset repo (a model repo's ``hf://user/name``, a singular
    ``hf://dataset/...``, a ``models/`` or ``spaces/`` one, a repo id cut short), with the URL the user likely meant:
    LeRobot datasets are dataset repos, which HfFileSystem reads only under ``datasets/``."""
    rest = target.removeprefix("hf://")
    rest = rest.split("/", 1)[1] if rest.startswith(("datasets/", "dataset/", "models/", "spaces/")) else rest
    name = re.split(r"[/@]", rest, maxsplit=2)
    url = re.sub(r"@(?=/|$)", "", f"hf://datasets/{rest}")  # (an empty revision: main's)
    meant = url if len(name) > 1 and is_repo_id(f"{name[0]}/{name[1]}") and url != target else None
    return DatasetNotFoundError(
        f"{target!r} names no Hub dataset: write one as hf://datasets/<user>/<name> (@revision and /subfolder after "
        "it where needed)" + (f", here {meant!r}" if meant else "")
    )


def dataset_not_found(target: str) -> DatasetNotFoundError:
    """The error for ``target``, which is no local folder, Hub repo id or URL, naming what to pass instead: a path
    whose "~" no shell expanded, a file inside a dataset (its ``meta/info.json``) or the part of a mistyped path
    that exists."""
    if target.startswith("~"):
        return DatasetNotFoundError(
            f"dataset {target!r} not found: '~' is expanded by a shell, not here: pass {os.path.expanduser(target)!r}"
            " (os.path.expanduser gives it)"
        )
    if not target.strip():  # (abspath('') is the current folder: it was said to lack itself)
        return DatasetNotFoundError(f"dataset {target!r} is an empty path: pass a dataset folder, Hub repo id or URL")
    path = os.path.abspath(target)
    while not os.path.isdir(os.path.dirname(path)):
        path = os.path.dirname(path)
    odd = not_a_file(path)
    broken = not odd and os.path.islink(path) and not os.path.exists(path)
    if odd or broken:  # (a device, pipe or broken link was said to be "not in" the folder it lies in)
        what = f"dataset {target!r} is" if path == os.path.abspath(target) else f"dataset {target!r}: {path!r} is"
        said = f"a symbolic link to {os.readlink(path)!r}, which does not exist" if broken else str(odd).split(" (")[0]
        return DatasetNotFoundError(
            f"{what} {said}, not a dataset folder: pass the folder that holds the dataset's meta/info.json"
        )
    if os.path.isfile(path):  # (the path given, a trailing "/" dropped, or a part of it)
        near = dataset_folder_near(path)
        what = "a file" if path == os.path.abspath(target) else f"under {path!r}, a file"
        return DatasetNotFoundError(
            f"dataset {target!r} is {what}, not a dataset folder: "
            + (near[1] if near else "pass the folder that holds the dataset's meta/info.json")
        )
    missing = os.path.basename(path)
    name = target.split("/")
    hub = (
        f", or for the Hub dataset pass 'hf://{target}'"  # (HfFileSystem's path, without its protocol)
        if name[0] == "datasets" and len(name) > 2 and is_repo_id("/".join(name[1:3]).split("@")[0])
        else ""
    )
    return DatasetNotFoundError(
        f"dataset {target!r} not found: no such local folder ({os.path.dirname(path)!r} exists, {missing!r} not in "
        "it), and it is not a Hub repo id ('user/name') or an fsspec URL (e.g. 'hf://datasets/user/name', "
        f"'s3://bucket/path'): check the path{hub}"
    )


def dataset_folder_near(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """The dataset folder (one holding ``meta/info.json``) a user who gave local ``path`` most likely meant, and
    the advice to pass it: the dataset ``path`` lies in (its ``meta`` folder, a file of it), else the first of
    the datasets ``path`` holds (in its folders, else theirs); None where there is neither."""
    here = os.path.abspath(path)
    above = os.path.dirname(here)
    while above != os.path.dirname(above):
        if os.path.isfile(os.path.join(above, "meta", "info.json")):
            return above, f"pass {above!r}, the dataset folder it lies in"
        above = os.path.dirname(above)
    for depth in (1, 2):  # (a folder of datasets; LeRobot's, HF_LEROBOT_HOME, holds <user>/<name> ones)
        held = sorted(glob.glob(os.path.join(glob.escape(here), *["*"] * depth, "meta", "info.json")))
        if held:
            break
    if not held:
        return None
    first = os.path.dirname(os.path.dirname(held[0]))
    others = (
        f" or another of the {len(held)} it holds; several read as one with concat_datasets" if len(held) > 1 else ""
    )
    return first, f"it holds dataset folders: pass {first!r}{others}"


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is spelled as a Hub repo id (``user/name``)."""
    return _REPO_ID.match(text) is not None


def _revision_ignored(revision: str | None, target: str, what: str) -> None:
    """Warn that ``revision`` names nothing here: the files read are whatever ``target`` holds now."""
    if revision is not None:
        warn_once(logger,
            "revision=%r is ignored: %s is %s, read as it is now (a revision selects a Hub dataset's commit)",
            revision, target, what,
        )  # fmt: skip


#: Plain HTTP(S) servers: seconds to connect and between bytes read. aiohttp's own default bounds only a whole
#: request, at 5 minutes, so a stalled server held a read for 5 minutes per try, with nothing logged.
HTTP_TIMEOUTS_S = {"sock_connect": 30.0, "sock_read": 60.0}


def _http_query_as_params(target: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An http(s) URL without its query string, and ``options`` with that query as ``params``, which fsspec's
    HTTPFileSystem sends with every request: a file's URL is the root's with its path appended, which landed inside
    the query (``ds?token=x/meta/info.json``). Parameters ``options`` already gives win. A ``#`` is refused: it
    starts a fragment, which is never sent to the server.
    """
    if not target.startswith(("http://", "https://")):
        return target, options
    if "#" in target:
        raise ValueError(
            f"{without_credentials(target)!r}: a '#' in an http(s) URL starts a fragment, which is never sent to "
            "the server; write a '#' that is part of a folder name as %23"
        )
    parts = urlsplit(target)
    if not parts.query:
        return target, options
    given = options.get("params") or {}
    given_pairs = list(given.items() if isinstance(given, Mapping) else given)
    named = {name for name, _ in given_pairs}
    in_url = [(name, value) for name, value in parse_qsl(parts.query, keep_blank_values=True) if name not in named]
    return urlunsplit(parts._replace(query="")), {**options, "params": in_url + given_pairs}


def _http_timeouts(target: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`HTTP_TIMEOUTS_S` for an http(s) URL, unless they set a timeout of their own."""
    client = dict(options.get("client_kwargs") or {})
    if not target.startswith(("http://", "https://")) or "timeout" in client:
        return options
    import aiohttp

    client["timeout"] = aiohttp.ClientTimeout(total=None, **HTTP_TIMEOUTS_S)
    return {**options, "client_kwargs": client}


def _one_revision(target: str, in_url: str | None, argument: str | None) -> str | None:
    """The revision of an ``hf://`` URL: given once, or twice alike; two different ones are a mistake, not a choice."""
    if in_url is not None and argument is not None and in_url != argument:
        raise ValueError(
            f"{target!r} names revision {in_url!r} but revision={argument!r} was also given; "
            "give the revision in one place only"
        )
    return in_url if in_url is not None else argument


def _hub_location(
    repo_id: str, revision: str | None, subfolder: str, options: dict[str, Any], *, maybe_path: bool = False
) -> DatasetLocation:
    """Metadata from one snapshot of ``revision`` (decoded), bulk reads at that snapshot's commit.
    ``maybe_path``: ``repo_id`` was typed bare, so it may as well be a mistyped local folder (``data/ds9``).

    The description keeps the revision the user asked for, so it names the dataset the same way (and keys
    the same prefetch cache) after the branch moves; errors about bulk files show the pinned path.
    """
    from huggingface_hub import HfFileSystem, snapshot_download

    prefix = f"{subfolder.strip('/')}/" if subfolder.strip("/") else ""
    say_once(logger, logging.INFO, "downloading metadata of %s (revision %s)", repo_id, revision or "main")
    hub = {key: options[key] for key in _HUB_DOWNLOAD_OPTIONS if options.get(key) is not None}
    if not draws_progress() or not sys.stderr.isatty():  # (a log file keeps each redraw: the line above says it)
        hub["tqdm_class"] = _hidden_bars()
    meta = f"hf://datasets/{repo_id}{_at(revision)}/{prefix}meta/"

    def download() -> str:
        """One try of the download; a failure retrying may mend raised as it is, for the retries to see."""
        try:
            return str(
                snapshot_download(
                    repo_id, repo_type="dataset", revision=revision, allow_patterns=[f"{prefix}meta/**"], **hub
                )
            )
        except Exception as e:
            missing = _missing_on_hub(repo_id, revision, e, maybe_path=maybe_path)
            if missing is not None:
                raise missing from e
            answer = _hub_answer(e)
            if is_transient(e) and answer is None:  # (no answer: a connection dropped)
                raise
            if is_transient(e) and answer is not None and _answered_once(answer):  # (a 5xx, 429 huggingface_hub
                raise answer from answer.__cause__  # did not retry: the retries see its status and Retry-After)
            failed = _metadata_download_failed(meta, e)
            if failed is None:
                raise
            raise failed from e

    local_meta = retried("download", meta, download)
    commit = _snapshot_commit(repo_id, revision, local_meta)
    fs = _retrying(HfFileSystem(**options))
    root = f"datasets/{repo_id}{_at(commit)}/{prefix}".rstrip("/")
    local = LocalFileSystem()
    meta_root = os.path.join(local_meta, prefix.rstrip("/")) if prefix else local_meta
    description = f"hf://datasets/{repo_id}{_at(revision)}/{prefix}".rstrip("/")
    folder_commit = os.path.basename(os.path.normpath(local_meta))
    snapshot = HubSnapshot(repo_id, folder_commit, meta_root, prefix) if commit == folder_commit else None
    return DatasetLocation(fs, root, local, meta_root, description, snapshot)


def _hidden_bars() -> type:
    """huggingface_hub's progress bar, never drawn: ``snapshot_download`` draws three per call, even when the
    files are cached, and every rank of a node calls it at once; where stderr is no terminal (a job's log file)
    each redraw stays, joined to the others by carriage returns."""
    from huggingface_hub.utils import tqdm

    class HiddenBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    return HiddenBar


def _hub_answer(error: BaseException) -> BaseException | None:
    """The first error of ``error``'s chain of causes that holds the Hub's HTTP answer (its ``response``'s status):
    huggingface_hub's ``LocalEntryNotFoundError`` is raised from the answer that made it give up on a file."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(getattr(getattr(current, "response", None), "status_code", None), int):
            return current
        current = current.__cause__
    return None


def _answered_once(answer: BaseException) -> bool:
    """Whether ``answer`` (an error holding the Hub's HTTP answer) ends a request huggingface_hub made once: the one
    resolving the revision to a commit (``HfApi.repo_info``: its ``dataset_info`` frame in the traceback), which
    ``snapshot_download`` makes first, or a metadata file's GET answered 5xx (``http_get``'s frame: its backoff retries
    a GET's 408 and 429 alone). Its backoff retried the others itself (the listing's 5xx and 429, a file's HEAD's, whose
    traceback it drops, and a GET's 429)."""
    from huggingface_hub import HfApi, file_download

    once: list[Any] = [HfApi.dataset_info]
    if getattr(getattr(answer, "response", None), "status_code", None) not in (408, 429):
        once.append(file_download.http_get)
    codes = {getattr(inspect.unwrap(function), "__code__", None) for function in once}  # (under its argument check)
    return any(frame.f_code in codes for frame, _ in traceback.walk_tb(answer.__traceback__))


def _metadata_download_failed(meta: str, error: Exception) -> RemoteFileError | None:
    """The error for downloading a Hub dataset's metadata (``meta``: its folder's URL) that ``error`` ended (not one
    saying the dataset cannot be found: :func:`_missing_on_hub`, nor one the loader retries: :func:`_answered_once`):
    the Hub refused a file (HTTP 401/403), answered 404 (410) for one its listing of the revision holds, or answered in
    a way retrying may mend past huggingface_hub's own retries (5xx, 429); None for other errors, which keep their
    type."""
    answer = _hub_answer(error) or error
    status = getattr(getattr(answer, "response", None), "status_code", None)
    said = f"{type(answer).__name__}: {first_line(answer)}"
    if is_refused(answer):
        return RemoteFileError(
            masked(f"{meta}: downloading it was refused (not retried): {REFUSED_HINT} ({said})"), status
        )
    if is_transient(answer):
        return RemoteFileError(
            masked(
                f"{meta}: downloading it failed, the last try with {said} (after huggingface_hub's own retries); gave "
                "up: check the connection and the Hub (HF_ENDPOINT), then open the dataset again"
            ),
            status if isinstance(status, int) else None,
        )
    if status in (404, 410):
        return RemoteFileError(
            masked(
                f"{meta}: the Hub lists a file there that it has not (HTTP {status}; not retried): check the revision "
                f"(branch, tag or commit), and upload the dataset's meta/ files again ({said})"
            ),
            status,
        )
    return None


def _missing_on_hub(
    repo_id: str, revision: str | None, error: Exception, *, maybe_path: bool = False
) -> DatasetNotFoundError | None:
    """``error`` from ``snapshot_download`` as the package's error when it means the dataset cannot be found
    (no such repo or revision, private or gated without a token, no Hub reachable and nothing cached); ``None``
    for other errors (a Hub outage mid-download, a refused file: :func:`_metadata_download_failed`)."""
    from huggingface_hub import constants, errors
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = "log in (`hf auth login`) or pass storage_options={'token': ...}"
    status = getattr(getattr(error, "response", None), "status_code", None)
    # (huggingface_hub from 2.x: a snapshot its cached listing of the commit shows files missing from, a download cut
    # short, raised where the Hub is not asked)
    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    if isinstance(error, GatedRepoError):
        why = f"cannot be read: a gated dataset needs a token of an account that accepted its terms; {token}"
    elif isinstance(error, RevisionNotFoundError):
        why = f"has no revision {revision or 'main'!r} on the Hub; give an existing branch, tag or commit SHA"
    elif isinstance(error, RepositoryNotFoundError) or (isinstance(error, HfHubHTTPError) and status == 401):
        why = f"not found on the Hub, or private and unreadable with the token given; check the repo id, or {token}"
    elif isinstance(error, incomplete):  # (online too, where the Hub was not reached or refused: not "no metadata")
        refused = getattr(getattr(error.__cause__, "response", None), "status_code", None) in (401, 403)
        if constants.HF_HUB_OFFLINE:
            fix = "HF_HUB_OFFLINE is set: unset it to download the rest"
        elif refused:  # (huggingface_hub raises it from the Hub's answer: a private or gated dataset)
            fix = f"the Hub refused the rest to the token given: {token}"
        else:
            fix = "the Hub could not be reached to download the rest: check the network, HF_ENDPOINT and HF_HUB_OFFLINE"
        why = (
            f"cannot be opened: huggingface_hub's cache holds part of its metadata at revision {revision or 'main'} (a "
            f"download cut short), and {fix}"
        )
    elif (
        isinstance(error, LocalEntryNotFoundError)
        and constants.HF_HUB_OFFLINE
        and (full := _cached_commits_starting(repo_id, revision))
    ):
        why = (
            f"cannot be opened: HF_HUB_OFFLINE is set and revision {revision!r} names no branch or tag the cache "
            "knows, and only the Hub resolves a short commit hash: pass the full one, "
            f"{' or '.join(f'revision={commit!r}' for commit in full)}, whose snapshot the cache holds"
        )
    elif isinstance(error, LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE:  # (not a network failure)
        why = (
            f"cannot be opened: HF_HUB_OFFLINE is set and huggingface_hub's cache holds no metadata of revision "
            f"{revision or 'main'} of it; check the repo id's spelling, or unset HF_HUB_OFFLINE to download it"
        )
    elif isinstance(error, LocalEntryNotFoundError) and _hub_answer(error) is not None:
        return None  # (the Hub was reached: it refused a file, or answered 5xx: its revision's, or a file's)
    elif isinstance(error, LocalEntryNotFoundError) and _took_no_answer(error.__cause__):
        return None  # (the Hub took the connection, then dropped it or gave no answer in time: retried)
    elif isinstance(error, LocalEntryNotFoundError):
        why = (
            f"cannot be opened: the Hub could not be reached and huggingface_hub's cache holds no metadata of "
            f"revision {revision or 'main'}; check the network, HF_ENDPOINT and HF_HUB_OFFLINE"
        )
    else:
        return None
    if maybe_path and not isinstance(error, (GatedRepoError, RevisionNotFoundError, incomplete)):  # (a repo id, surely)
        why += f"; nor is it a local folder under {os.getcwd()}"
    cause = first_line(error, "")
    return DatasetNotFoundError(f"dataset {repo_id!r} {why} ({type(error).__name__}: {cause})")


def _took_no_answer(error: BaseException | None) -> bool:
    """Whether ``error`` (huggingface_hub's request's, behind its LocalEntryNotFoundError) is a transient failure
    after the connection was taken: after it was made (httpx's ReadTimeout, say), or while it was set up, dropped by
    the other end (httpx's ConnectError from a reset or an EOF in the TLS handshake: the Hub is HTTPS); the Hub reached,
    not "could not be reached" (httpx's ConnectError of a refused connection or a name not resolved, ConnectTimeout:
    nothing took the connection)."""
    if error is None or not is_transient(error):
        return False
    if not any(cls.__name__ in ("ConnectError", "ConnectTimeout") for cls in type(error).__mro__):
        return True
    seen: set[int] = set()
    cause = error.__cause__ or error.__context__  # (httpx's ConnectError from httpcore's, raised handling the OSError)
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):  # (the socket's error that ended the connection; those it was raised handling
            return isinstance(cause, _DROPPED)  # are not this connection's: a refusal raised handling a reset)
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


#: The socket's errors of a connection its other end took, then closed (a reset, an EOF in the TLS handshake).
_DROPPED = (ConnectionResetError, ConnectionAbortedError, ssl.SSLEOFError)


def _cached_commits_starting(repo_id: str, revision: str | None) -> list[str]:
    """The commits of dataset ``repo_id`` whose snapshots huggingface_hub's cache holds and whose SHA ``revision``
    begins, where it is spelled as a short one."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if revision is None or not _SHORT_SHA.match(revision):
        return []
    snapshots = os.path.join(
        constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo_id, repo_type="dataset"), "snapshots"
    )
    try:
        return sorted(name for name in os.listdir(snapshots) if name.startswith(revision) and _COMMIT_SHA.match(name))
    except OSError:
        return []


def _snapshot_commit(repo_id: str, revision: str | None, local_meta: str) -> str | None:
    """The commit every bulk read uses: the one the metadata snapshot was taken at.

    A branch or tag is resolved once, here, from the snapshot folder's name; reading data at the branch name
    instead would pick up whatever the branch points to at each read. A commit SHA the user gave is kept.
    """
    if revision is not None and _COMMIT_SHA.match(revision):
        return revision
    folder = os.path.basename(os.path.normpath(local_meta))
    if _COMMIT_SHA.match(folder):
        say_once(logger, logging.INFO, "%s: revision %s is commit %s; data files are read there", repo_id,
                 revision or "main", folder)  # fmt: skip
        return folder
    warn_once(logger,
        "%s: the metadata snapshot %s is not named by a commit SHA, so data files are read at revision %s; "
        "if that branch moves while reading, data and metadata may disagree (pass a commit SHA as revision)",
        repo_id, local_meta, revision or "main",
    )  # fmt: skip
    return revision


def _at(revision: str | None) -> str:
    """``@<revision>`` for an ``hf://`` path, one path segment however many "/" the revision holds."""
    return f"@{quote(revision, safe='')}" if revision else ""


def with_bulk_root(
    location: DatasetLocation, bulk_root: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> DatasetLocation:
    """``location`` with ``data/`` and ``videos/`` read from another root (a bucket mirror, a local copy).

    Metadata stays where ``location`` found it, so a Hub revision still decides which episodes exist while
    the bytes come from storage near the GPUs. ``bulk_root`` is a local folder or an fsspec URL; a remote
    one is wrapped in :class:`RetryingFileSystem`.
    """
    target = os.fspath(bulk_root)
    if "://" not in target:
        if not os.path.isdir(target):
            raise DatasetNotFoundError(
                f"data_files_root {target!r} is not a local folder; pass an existing folder or an fsspec URL "
                "(e.g. 's3://bucket/mirror') holding the dataset's data/ and videos/"
            )
        fs: fsspec.AbstractFileSystem = LocalFileSystem()
        root = os.path.abspath(target)
    else:
        target, options = _http_query_as_params(target, storage_options or {})
        fs, root = _remote_fs(target, options)
    target = without_credentials(target)
    say_once(logger, logging.INFO, "%s: reading data/ and videos/ from %s", location.description, target)
    description = f"{location.description} (data files: {target})"
    return replace(location, fs=fs, root=root, description=description, hub_snapshot=None)


def _remote_fs(target: str, options: dict[str, Any]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and root of an fsspec URL, with HTTP timeouts and retries: every remote root gets both. An
    http(s) root's path is spelled as its requests send it (percent-encoded as aiohttp encodes each request's URL):
    a server's index page that links folders by absolute path (``/my%20ds/meta/episodes/chunk-000/``) names them so,
    and fsspec keeps only the links under the folder's URL as spelled (``/my ds/...`` found none of them)."""
    target, options = _credentials_as_header(target, options)
    if not target.startswith(("http://", "https://")):  # (its query is kept in its paths, which the logs name)
        mask_path_logs(target.partition("?")[2])
    try:
        fs, root = fsspec.core.url_to_fs(_as_sent(target), **_http_timeouts(target, options))
    except (ImportError, ValueError) as e:  # (a traceback in train.py and reencode; the other verbs said it)
        unknown = isinstance(e, ValueError) and str(e).startswith("Protocol not known")
        if not (unknown or isinstance(e, ImportError)):
            raise
        said = "no filesystem reads its protocol" if unknown else "its filesystem is not installed here"
        advice = "check the URL" if unknown else "install it, or read a local copy of the dataset"
        raise DatasetNotFoundError(f"dataset {masked(target)!r}: {said} ({first_line(e)}): {advice}") from e
    return _retrying(fs), root


def _credentials_as_header(target: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An http(s) URL without the user and password it may carry (``https://user:token@host/ds``), and ``options``
    with them as a basic-auth ``Authorization`` header added to their ``headers`` (which fsspec's HTTPFileSystem sends
    with every request, and our If-Match requests keep): the header aiohttp made of the URL's, which it drops on a
    redirect to another host. fsspec kept them in each file's path, which named the password in every retry's
    warning, a failed read's error and the packet indexes stored on disk (:mod:`.packet_index_store`). A header, not
    aiohttp's ``auth`` option: deprecated in aiohttp 3.14 (a DeprecationWarning per request; gone in v4). ``options``
    with an ``auth`` or an ``Authorization`` header of their own and a URL with a user are refused here: aiohttp
    refuses the two together in each request, which fsspec reported as a missing info.json, the password in its
    path. Other URLs are returned as given."""
    if not target.startswith(("http://", "https://")):
        return target, options
    import aiohttp  # (fsspec's HTTP needs it: installed wherever an http(s) URL is read)
    import yarl

    auth = aiohttp.BasicAuth.from_url(yarl.URL(target))  # (decoded as aiohttp decodes the URL's: %40 is '@')
    if auth is None:
        return target, options
    headers = options.get("headers") or {}
    if "auth" in options or any(str(name).lower() == "authorization" for name in headers):
        raise ValueError(
            f"{without_credentials(target)!r} is given with a user and password in the URL and with credentials "
            "in storage_options (auth, or an Authorization header), which cannot be sent together: pass one of them"
        )
    return without_credentials(target), {**options, "headers": {**headers, "Authorization": auth.encode()}}


def _as_sent(target: str) -> str:
    """An http(s) URL with what its path cannot hold as typed percent-encoded as aiohttp sends it (UTF-8: a space as
    %20, 'ä' as %C3%A4; escapes kept), and nothing else changed (host, port, escapes, '.' steps as typed: each file's
    URL keys the packet-index cache on disk, and names the file in errors); others as given."""
    if not target.startswith(("http://", "https://")):
        return target
    parts = urlsplit(target)
    path = _BARE_PERCENT.sub("%25", parts.path)  # (a '%' starting no escape: a name's own, as yarl takes it)
    return urlunsplit(parts._replace(path=quote(path, safe=_PATH_KEPT)))


#: What :func:`_as_sent` keeps in a URL's path: RFC 3986's unreserved characters (``quote`` keeps them), its
#: sub-delimiters, ':', '@', '/' and the '%' of escapes.
_PATH_KEPT = "/%:@!$&'()*+,;="
_BARE_PERCENT = re.compile("%(?![0-9A-Fa-f]{2})")


def _retrying(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """Remote bulk filesystems retry transient failures; local ones are returned untouched."""
    if isinstance(fs, (LocalFileSystem, RetryingFileSystem)):
        return fs
    return RetryingFileSystem(fs, fresh_client=partial(fresh_instance, fs))
