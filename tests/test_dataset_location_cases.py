"""Where a dataset is (:mod:`lerobot_dali.dataset_location`): behaviour a mutation pass over its local, HTTP and
bulk-root functions found untested."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.http import HTTPFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from lerobot_dali import url_secrets
from lerobot_dali.dataset_location import DatasetLocation, fetches_whole, resolve_location, with_bulk_root
from lerobot_dali.remote_retry import RetryingFileSystem
from tests.test_url_secrets_fuzz import no_credential_known  # noqa: F401 (a fixture)


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


def test_a_bulk_root_elsewhere_is_said_once_at_info_naming_it_without_its_credentials(tmp_path: Path, caplog) -> None:
    """Which copy the bytes come from decides their speed and version: the trainer's log says it, once per job (a
    second location made of it says nothing more), its URL's query left out."""
    fs = MemoryFileSystem()
    location = DatasetLocation(fs, "/bucket/ds", fs, "/bucket/ds", "ds")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.dataset_location"):
        moved = with_bulk_root(location, "http://127.0.0.1:9/mirror?token=S3CR")
        with_bulk_root(location, "http://127.0.0.1:9/mirror?token=S3CR")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "lerobot_dali.dataset_location"]
    assert said[0] == (logging.INFO, "ds: reading data/ and videos/ from http://127.0.0.1:9/mirror")
    assert [level for level, _ in said[1:]] == [logging.DEBUG] * (len(said) - 1)
    assert moved.description == "ds (data files: http://127.0.0.1:9/mirror)" and "S3CR" not in caplog.text
