"""Where a dataset is (:mod:`lerobot_dali.dataset_location`): behaviour a mutation pass over its local, HTTP and
bulk-root functions found untested."""

from __future__ import annotations

import logging
import pickle
from typing import Any
from urllib.parse import urlsplit

import fsspec
import pytest
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.http import HTTPFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from lerobot_dali import url_secrets
from lerobot_dali.dataset_location import DatasetLocation, fetches_whole, resolve_location, with_bulk_root
from lerobot_dali.errors import DatasetNotFoundError
from lerobot_dali.remote_retry import RetryingFileSystem


class _AsyncWithoutCatFile(AsyncFileSystem):
    """An async filesystem that leaves ``_cat_file`` to fsspec's (which opens the file and reads it)."""


class _SyncWithCatFile(fsspec.AbstractFileSystem):
    """A sync filesystem with a ``cat_file`` of its own (as an object store's client may have)."""

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        return b""


@pytest.mark.parametrize(
    ("fs", "whole"),
    [
        (LocalFileSystem(), False),
        (MemoryFileSystem(), True),
        (_SyncWithCatFile(), True),
        (HTTPFileSystem(), True),
        (_AsyncWithoutCatFile(), False),
    ],
    ids=["local", "memory", "sync-own-cat-file", "http", "async-fsspecs-cat-file"],
)
def test_a_file_is_read_whole_in_one_request_where_the_filesystem_under_the_retries_has_a_cat_file_of_its_own(
    fs: fsspec.AbstractFileSystem, whole: bool
) -> None:
    """The answer is a bool, the same through :class:`RetryingFileSystem` as for the filesystem it wraps (whose own
    ``cat_file`` is the generic one's)."""
    assert fetches_whole(fs) is whole
    assert fetches_whole(RetryingFileSystem(fs)) is whole


@pytest.mark.usefixtures("no_credential_known")
@pytest.mark.parametrize(
    ("fs", "root", "known"),
    [
        (LocalFileSystem(), "/data/ds?token=L0CAL", ()),
        (MemoryFileSystem(), "/bucket/ds?token=REM0TE", ("REM0TE",)),
        (MemoryFileSystem(), "/bucket/ds", ()),
    ],
    ids=["local-folder-named-with-a-query", "memory-query", "memory-no-query"],
)
def test_an_unpickled_location_masks_the_credentials_of_a_remote_roots_query_only(
    fs: Any, root: str, known: Any
) -> None:
    """A worker's copy of the location: the query a remote filesystem keeps in its paths holds a credential, masked in
    the worker's records from then on; a local folder whose name holds a '?' has no query, and nothing of its name is
    masked."""
    location = DatasetLocation(fs, root, fs, root, "ds")
    pickle.loads(pickle.dumps(location))
    assert url_secrets._known == known


@pytest.mark.parametrize(
    ("root", "data", "meta"),
    [
        ("", "data/f.parquet", "meta/info.json"),
        ("/bucket/ds", "/bucket/ds/data/f.parquet", "/bucket/ds/meta/info.json"),
        ("/bucket/ds/", "/bucket/ds/data/f.parquet", "/bucket/ds/meta/info.json"),
    ],
)
def test_a_path_of_the_dataset_is_its_roots_with_one_slash_or_the_relative_path_itself_at_the_filesystems_root(
    root: str, data: str, meta: str
) -> None:
    """A root of "" (a filesystem rooted at the dataset) names the file as given, not from the filesystem's top
    ("/data/...")."""
    fs = MemoryFileSystem()
    location = DatasetLocation(fs, root, fs, root, "ds")
    assert (location.path("data/f.parquet"), location.meta_path("meta/info.json")) == (data, meta)


@pytest.mark.parametrize(
    "given", [{"scope": "all", "v": "2"}, [("scope", "all"), ("v", "2")]], ids=["mapping", "pairs"]
)
def test_an_http_urls_query_joins_params_given_as_a_mapping_or_as_pairs_which_win(given: Any) -> None:
    """aiohttp takes ``params`` as a mapping or as (name, value) pairs; either is merged with the URL's query, the
    URL's parameters first and those the options name too left out (a list of pairs was read as a mapping)."""
    location = resolve_location("http://127.0.0.1:9/ds?token=x&scope=read", storage_options={"params": given})
    assert location.root == "http://127.0.0.1:9/ds"
    assert location.fs.fs.kwargs["params"] == [("token", "x"), ("scope", "all"), ("v", "2")]


def test_a_bulk_root_elsewhere_is_said_once_at_info_naming_it_without_its_credentials(caplog) -> None:
    """Which copy the bytes come from decides their speed and version: the trainer's log says it, once per job (a
    second location made of it says nothing more), its URL's query left out."""
    fs = MemoryFileSystem()
    location = DatasetLocation(fs, "/bucket/ds", fs, "/bucket/ds", "ds")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.dataset_location"):
        moved = with_bulk_root(location, "http://127.0.0.1:9/mirror?token=S3CR")
        with_bulk_root(location, "http://127.0.0.1:9/mirror?token=S3CR")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "lerobot_dali.dataset_location"]
    line = "ds: reading data/ and videos/ from http://127.0.0.1:9/mirror"
    assert said == [(logging.INFO, line)]  # (the second: DEBUG, below the level shown)
    assert moved.description == "ds (data files: http://127.0.0.1:9/mirror)" and "S3CR" not in caplog.text


class _RefusingFileSystem(fsspec.AbstractFileSystem):
    """A filesystem whose constructor refuses its options (as s3fs refuses an unknown one)."""

    protocol = "refusing"

    def __init__(self, **options: Any) -> None:
        raise ValueError("refusing: no such option 'regionn'")


class _LoginFileSystem(fsspec.AbstractFileSystem):
    """A filesystem that reads a user and password from its URL as its own login (as sftp's and ftp's do)."""

    protocol = "login"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        parts = urlsplit(path)
        return {"username": parts.username, "password": parts.password}


@pytest.fixture
def filesystems(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three protocols more: one whose filesystem's module is not installed, one whose filesystem refuses its options,
    one that logs in with the URL's user and password."""
    from fsspec.registry import known_implementations

    monkeypatch.setitem(known_implementations, "absent", {"class": "no_such_module.FS", "err": "pip install absentfs"})
    monkeypatch.setitem(known_implementations, "refusing", {"class": f"{__name__}._RefusingFileSystem"})
    monkeypatch.setitem(known_implementations, "login", {"class": f"{__name__}._LoginFileSystem"})


@pytest.mark.usefixtures("filesystems")
@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "nosuchproto://b/ds",
            "dataset 'nosuchproto://b/ds': no filesystem reads its protocol (Protocol not known: nosuchproto): check "
            "the URL",
        ),
        (
            "absent://b/ds",
            "dataset 'absent://b/ds': its filesystem is not installed here (pip install absentfs): install it, or "
            "read a local copy of the dataset",
        ),
    ],
    ids=["unknown-protocol", "not-installed"],
)
def test_a_url_no_installed_filesystem_reads_is_a_dataset_not_found_saying_why(url: str, said: str) -> None:
    with pytest.raises(DatasetNotFoundError) as caught:
        resolve_location(url)
    assert str(caught.value) == said


@pytest.mark.usefixtures("filesystems")
def test_a_filesystem_that_refuses_its_options_raises_its_own_error() -> None:
    """Its ValueError says what to mend in the options: not told as a protocol nobody reads."""
    with pytest.raises(ValueError, match=r"^refusing: no such option 'regionn'$"):
        resolve_location("refusing://b/ds")


def test_an_http_url_without_a_user_keeps_the_authorization_header_its_options_give() -> None:
    """Only a URL's own user and password clash with an Authorization header (the two cannot be sent together)."""
    location = resolve_location("http://127.0.0.1:9/ds", storage_options={"headers": {"Authorization": "Bearer x"}})
    assert location.fs.fs.kwargs["headers"] == {"Authorization": "Bearer x"}


@pytest.mark.usefixtures("filesystems")
def test_a_user_and_password_in_a_url_other_than_http_are_its_filesystems_login_not_an_http_header() -> None:
    """Only an http(s) URL's user and password become an Authorization header; another filesystem reads them from
    the URL itself (sftp's, ftp's login), so the URL reaches it as typed."""
    location = resolve_location("login://user:pw@host/ds")
    assert location.fs.fs.storage_options == {"username": "user", "password": "pw"}
