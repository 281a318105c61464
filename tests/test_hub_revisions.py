"""Hub revisions: how ``hf://`` URLs and ``revision=`` are parsed, and which commit bulk reads are pinned to.

Nothing touches the network: ``snapshot_download`` is stubbed to return a snapshot folder named by a fake
commit SHA (as huggingface_hub names them), and HfFileSystem's own ``resolve_path``, with its Hub existence
check stubbed, decides which revision and path a bulk read really asks for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import ssl
import struct
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import HfFileSystem
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hub_tqdm

from lerobot_dali.dataset_location import DatasetLocation, resolve_location
from lerobot_dali.dataset_union import concat_datasets
from lerobot_dali.errors import DatasetNotFoundError, RemoteFileError
from lerobot_dali.mixture import DALILeRobotMixture
from lerobot_dali.remote_errors import REFUSED_HINT

SNAPSHOT_SHA = "c0ffee" * 6 + "c0ff"
USER_SHA = "0123456789abcdef" * 2 + "01234567"
DATA_FILE = "data/chunk-000/file-000.parquet"


@pytest.fixture
def hub(monkeypatch, tmp_path) -> list[dict[str, Any]]:
    """The calls ``snapshot_download`` gets; it answers ``<cache>/snapshots/<commit>``, the commit being the
    revision when that is a full SHA, else ``SNAPSHOT_SHA`` (where the branch or tag points now)."""
    calls: list[dict[str, Any]] = []

    def fake_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        revision = kwargs.get("revision")
        commit = revision if revision and len(revision) == 40 else SNAPSHOT_SHA
        folder = tmp_path / "snapshots" / commit
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(HfFileSystem, "_repo_and_revision_exist", lambda self, *args, **kwargs: (True, None))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # (as on a terminal, where the Hub's own bars show)
    return calls


def _hf_resolve(path: str) -> Any:
    """What HfFileSystem makes of ``path``: its ``revision`` and ``path_in_repo``."""
    return HfFileSystem().resolve_path(path)


@pytest.mark.parametrize(
    ("target", "revision", "asked", "subfolder", "description"),
    [
        ("user/ds", "feature/x", "feature/x", "", "hf://datasets/user/ds@feature%2Fx"),
        ("hf://datasets/user/ds@refs/pr/3", None, "refs/pr/3", "", "hf://datasets/user/ds@refs%2Fpr%2F3"),
        ("hf://datasets/user/ds@refs/pr/13/sub/set", None, "refs/pr/13", "sub/set", None),  # (a PR past 9)
        ("hf://datasets/user/ds@refs/convert/parquet", None, "refs/convert/parquet", "", None),
        ("hf://datasets/user/ds@feature%2Fx", None, "feature/x", "", "hf://datasets/user/ds@feature%2Fx"),
        ("hf://datasets/user/ds@feature%2Fx/sub", None, "feature/x", "sub", None),
        ("hf://datasets/user/ds@v1.0", "v1.0", "v1.0", "", "hf://datasets/user/ds@v1.0"),
        ("hf://datasets/user/ds", None, None, "", "hf://datasets/user/ds"),
        ("hf://datasets/user/ds/", None, None, "", "hf://datasets/user/ds"),
        ("hf://datasets/user/ds/sub", None, None, "sub", None),
        ("user/ds", None, None, "", "hf://datasets/user/ds"),
        ("hf://datasets/user/ds/sub/", None, None, "sub", "hf://datasets/user/ds/sub"),
    ],
)
def test_revision_is_parsed_as_hf_file_system_does_and_bulk_reads_are_pinned(
    hub, target: str, revision: str | None, asked: str | None, subfolder: str, description: str | None
) -> None:
    location = resolve_location(target, revision=revision)
    prefix = f"{subfolder}/" if subfolder else ""
    assert hub == [
        {"repo_id": "user/ds", "repo_type": "dataset", "revision": asked, "allow_patterns": [f"{prefix}meta/**"]}
    ]
    if target.startswith("hf://"):  # the same split HfFileSystem makes of the URL the user typed
        typed = _hf_resolve(target)
        assert (typed.revision, typed.path_in_repo) == (asked or "main", subfolder)
    bulk = _hf_resolve(location.path(DATA_FILE))
    assert (bulk.repo_id, bulk.revision, bulk.path_in_repo) == ("user/ds", SNAPSHOT_SHA, prefix + DATA_FILE)
    assert location.meta_path("meta/info.json").endswith(f"snapshots/{SNAPSHOT_SHA}/{prefix}meta/info.json")
    if description is not None:
        assert location.description == description


def test_a_revision_given_beside_an_hf_url_without_one_is_read(hub) -> None:
    location = resolve_location("hf://datasets/user/ds/sub", revision="v2")
    assert [call["revision"] for call in hub] == ["v2"] and location.description == "hf://datasets/user/ds@v2/sub"


@pytest.mark.parametrize("target", ["hf://datasets/user/ds@" + USER_SHA, "user/ds"])
def test_a_commit_sha_given_by_the_user_is_kept(hub, target: str, caplog) -> None:
    caplog.set_level(logging.INFO, logger="lerobot_dali.dataset_location")
    location = resolve_location(target, revision=None if "@" in target else USER_SHA)
    assert hub[0]["revision"] == USER_SHA
    bulk = _hf_resolve(location.path(DATA_FILE))
    assert (bulk.revision, bulk.path_in_repo) == (USER_SHA, DATA_FILE)
    assert location.description == f"hf://datasets/user/ds@{USER_SHA}"
    assert "is commit" not in caplog.text


def test_branch_resolution_is_logged(hub, caplog) -> None:
    caplog.set_level(logging.INFO, logger="lerobot_dali.dataset_location")
    resolve_location("user/ds", revision="feature/x")
    resolve_location("hf://datasets/user/ds")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "is commit" in r.getMessage()]
    assert infos == [
        f"user/ds: revision feature/x is commit {SNAPSHOT_SHA}; data files are read there",
        f"user/ds: revision main is commit {SNAPSHOT_SHA}; data files are read there",
    ]


def test_every_read_of_one_location_sees_one_commit_while_the_branch_moves(hub, monkeypatch, tmp_path) -> None:
    """The branch moves after the metadata was downloaded: the location opened before keeps its commit."""
    before = resolve_location("hf://datasets/user/ds@main")
    moved = "beef" * 10

    def moved_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        folder = tmp_path / "snapshots" / moved
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", moved_snapshot_download)
    after = resolve_location("hf://datasets/user/ds@main")
    assert _hf_resolve(before.path(DATA_FILE)).revision == SNAPSHOT_SHA
    assert _hf_resolve(after.path("videos/a.mp4")).revision == moved
    assert before.description == after.description == "hf://datasets/user/ds@main"


def test_snapshot_not_named_by_a_commit_reads_at_the_encoded_revision(monkeypatch, tmp_path, caplog) -> None:
    """A snapshot folder that is not a commit SHA cannot pin; bulk reads then follow the revision, encoded."""
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(tmp_path))
    monkeypatch.setattr(HfFileSystem, "_repo_and_revision_exist", lambda self, *args, **kwargs: (True, None))
    location = resolve_location("user/ds", revision="feature/x")
    bulk = _hf_resolve(location.path(DATA_FILE))
    assert (bulk.revision, bulk.path_in_repo) == ("feature/x", DATA_FILE)
    assert "not named by a commit SHA" in caplog.text
    assert location.hub_snapshot is None  # (no commit's folder: its files are not the pinned ones)


def test_token_and_endpoint_reach_snapshot_download(hub) -> None:
    options = {"token": "hf_fake", "endpoint": "http://127.0.0.1:9"}
    location = resolve_location("user/ds", revision="v1", storage_options=options)
    assert hub[0]["token"] == "hf_fake"
    assert hub[0]["endpoint"] == "http://127.0.0.1:9"
    assert isinstance(location, DatasetLocation)


def test_no_token_is_passed_when_none_is_given(hub) -> None:
    resolve_location("user/ds")
    assert "token" not in hub[0] and "endpoint" not in hub[0]


def test_only_a_nodes_first_rank_draws_the_hubs_progress_bars(hub, monkeypatch, capsys) -> None:
    """snapshot_download draws three bars per call, cached files too, and every rank of a node calls it at once:
    ranks other than LOCAL_RANK 0 hand it a bar that is never drawn."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    resolve_location("user/ds")
    monkeypatch.setenv("LOCAL_RANK", "1")
    resolve_location("user/ds")
    assert "tqdm_class" not in hub[0]  # huggingface_hub's own bars, as they are
    with hub[1]["tqdm_class"](total=3, desc="Fetching 3 files", disable=False) as bar:  # as on a terminal
        assert isinstance(bar, hub_tqdm) and bar.disable
        bar.update(3)
    assert "Fetching" not in capsys.readouterr().err  # (where huggingface_hub's own bar writes its line)


def test_the_hubs_progress_bars_are_not_drawn_where_stderr_is_no_terminal(hub, monkeypatch, capsys) -> None:
    """A training job's log file (or a CI log) kept each of their redraws, joined by carriage returns, on the
    first rank of every node; the INFO line 'downloading metadata of ...' says what is happening there."""
    assert not sys.stderr.isatty()  # (capsys's)
    monkeypatch.setenv("LOCAL_RANK", "0")
    resolve_location("user/ds")
    assert "tqdm_class" in hub[0]
    with hub[0]["tqdm_class"](total=3, desc="Fetching 3 files", disable=False) as bar:
        bar.update(3)
    assert "Fetching" not in capsys.readouterr().err


def test_two_different_revisions_are_refused(hub) -> None:
    with pytest.raises(ValueError, match="revision 'v1' but revision='v2'"):
        resolve_location("hf://datasets/user/ds@v1", revision="v2")
    assert hub == []


def test_an_empty_revision_is_refused(hub, tmp_path) -> None:
    """``--revision ""`` read the Hub's main (or a local folder) unsaid, where ``--revision main`` warns it is ignored
    on a local folder."""
    for target in ("user/ds", "hf://datasets/user/ds", str(tmp_path)):
        with pytest.raises(ValueError, match=r"^revision ' ' is empty: give a branch, tag or commit"):
            resolve_location(target, revision=" ")
    assert hub == []


def test_a_revision_where_no_hub_dataset_is_read_is_named_ignored(hub, tmp_path, caplog) -> None:
    """A local folder or another filesystem's URL is read as it is now: a revision asked for there selects nothing."""
    caplog.set_level(logging.WARNING, logger="lerobot_dali")
    resolve_location(tmp_path)
    resolve_location("memory://somewhere/ds")
    resolve_location("hf://datasets/user/ds", revision="v2")
    assert caplog.records == []
    resolve_location(tmp_path, revision="v2")
    resolve_location("memory://somewhere/ds", revision="v2")
    assert [r.getMessage() for r in caplog.records] == [
        f"revision='v2' is ignored: {tmp_path} is a local folder, read as it is now (a revision selects a Hub "
        "dataset's commit)",
        "revision='v2' is ignored: memory://somewhere/ds is not a Hub dataset, read as it is now (a revision "
        "selects a Hub dataset's commit)",
    ]


def _http_error(cls: type[HfHubHTTPError], status: int, message: str) -> HfHubHTTPError:
    """An error as huggingface_hub raises it for an HTTP ``status`` (only ``status_code`` and headers are read)."""
    return cls(message, response=SimpleNamespace(status_code=status, headers={}, request=None))


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (_http_error(RepositoryNotFoundError, 404, "404 Client Error.\n\nRepo Not Found"), "not found on the Hub"),
        (_http_error(GatedRepoError, 403, "403 Client Error.\n\nCannot access gated repo"), "gated dataset needs"),
        (_http_error(HfHubHTTPError, 401, "401 Client Error: Unauthorized"), "not found on the Hub"),
        (_http_error(RevisionNotFoundError, 404, "404 Client Error.\n\nRevision Not Found"), "has no revision 'v9'"),
        (LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nAn error happened"),
         "the Hub could not be reached"),
    ],
)  # fmt: skip
def test_a_missing_repo_or_an_unreachable_hub_is_dataset_not_found(monkeypatch, error: Exception, said: str) -> None:
    """Library users and the command line get the package's own error, naming the repo and the cause in one line."""

    def failing_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing_snapshot_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # (offline: it says so instead)
    with pytest.raises(DatasetNotFoundError) as caught:
        resolve_location("user/ds", revision="v9")
    message = str(caught.value)
    assert "'user/ds'" in message and said in message and "\n" not in message
    # 'data/ds9' may be a mistyped local folder, unless the Hub knows the repo (gated, or another revision)
    maybe_path = not isinstance(error, (GatedRepoError, RevisionNotFoundError))
    assert (f"; nor is it a local folder under {os.getcwd()} (" in message) is maybe_path
    assert f"{type(error).__name__}: {str(error).splitlines()[0]}" in message
    assert caught.value.__cause__ is error


@pytest.mark.parametrize(
    ("target", "meant"),
    [
        ("hf://user/ds", "hf://datasets/user/ds"),  # (a model repo's URL)
        ("hf://dataset/user/ds@v1.0/sub", "hf://datasets/user/ds@v1.0/sub"),
        ("hf://datasets/user", None),
        ("hf://models/user/ds", "hf://datasets/user/ds"),  # (it said 'hf://datasets/models/user/ds')
        ("hf://spaces/user/ds@v1.0", "hf://datasets/user/ds@v1.0"),
        ("hf://datasets/user/ds@", "hf://datasets/user/ds"),  # (it named the URL refused as the one meant)
        ("hf://datasets/user/ds@/sub", "hf://datasets/user/ds/sub"),
        ("hf://-user/ds", None),  # (no URL meant where the user or the name is no repo id's: "-" starts neither)
        ("hf://user/-ds", None),
    ],
)
def test_an_hf_url_that_names_no_dataset_repo_says_how_to_write_one(
    monkeypatch, target: str, meant: str | None
) -> None:
    """They went to HfFileSystem as they were: a model repo's URL was retried offline (then huggingface_hub's
    OfflineModeIsEnabled) or said 'meta/info.json is missing'; a singular 'dataset/' raised its HfUriError."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (nothing reaches the network)
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "0")
    with pytest.raises(DatasetNotFoundError) as caught:
        resolve_location(target)
    message = str(caught.value)
    assert message.startswith(f"{target!r} names no Hub dataset: write one as hf://datasets/<user>/<name>"), message
    assert (f"here {meant!r}" in message) if meant else message.endswith("where needed)"), message


def test_a_hub_bucket_url_is_read_as_a_remote_folder(monkeypatch) -> None:
    """``hf://buckets/...`` is a Hub storage bucket, not a dataset repo: read as a remote folder, not refused as an
    ``hf://`` URL naming no dataset."""
    from lerobot_dali.file_stamps import client_of

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (nothing reaches the network)
    location = resolve_location("hf://buckets/user/b/ds")
    assert isinstance(client_of(location.fs), HfFileSystem) and location.root == "buckets/user/b/ds"
    assert (location.description, location.hub_snapshot, location.is_local) == ("hf://buckets/user/b/ds", None, False)


def test_a_path_spelled_as_a_repo_id_that_is_a_local_file_is_named_so_not_asked_of_the_hub(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "ds").write_text("not a dataset")
    with pytest.raises(DatasetNotFoundError, match=r"^dataset 'user/ds' is a file, not a dataset folder: pass the"):
        resolve_location("user/ds")


@pytest.mark.parametrize(
    ("page", "meant"),
    [
        ("https://huggingface.co/datasets/user/ds", "'user/ds' (or 'hf://datasets/user/ds';"),
        ("https://huggingface.co/datasets/user/ds/tree/main/meta", "'user/ds' (or 'hf://datasets/user/ds';"),
        ("https://huggingface.co/datasets/user/ds/tree/v1.0", "'hf://datasets/user/ds@v1.0' (its files at revision"),
        ("https://huggingface.co/datasets/user/ds/tree/main/sub/set", "'hf://datasets/user/ds/sub/set' (its files)"),
        ("https://huggingface.co/datasets/user/ds/tree/feature%2Fx/sub/meta/episodes",
         "'hf://datasets/user/ds@feature%2Fx/sub' (its files at revision 'feature/x')"),
        ("https://huggingface.co/datasets/user/ds/blob/main/sub/meta/info.json", "'hf://datasets/user/ds/sub'"),
        ("https://huggingface.co/datasets/user/ds/blob/main/sub/README.md", "'hf://datasets/user/ds/sub' (its files)"),
        ("https://huggingface.co/datasets/user/ds/viewer/default/train", "'user/ds' (or"),
        ("https://huggingface.co/datasets/user/ds?row=3", "'user/ds' (or"),
        ("https://hf.co/datasets/user/ds", "'user/ds' (or"),
        ("https://huggingface.co/datasets/user/ds#top", "'user/ds' (or"),
    ],
)  # fmt: skip
def test_a_hub_dataset_page_url_says_what_to_pass(monkeypatch, page: str, meant: str) -> None:
    """The address a browser shows was read as a plain HTTP server's folder: its meta/info.json is no file there
    (offline: 5 retries and aiohttp's DNS error). A folder's page at a revision, or a file's, or the viewer's, or
    hf.co's were still read so, or were answered the repo id alone (of 10 here: 3 named a revision or folder, which
    it left out; 4 were read over HTTP; 1 was refused for its '#')."""
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "0")
    with pytest.raises(DatasetNotFoundError, match=re.escape(f"{page!r} is the dataset's web page, not its files: pass "
                                                             f"{meant}")):  # fmt: skip
        resolve_location(page)


def test_a_repo_id_not_cached_while_offline_says_so(monkeypatch) -> None:
    """With HF_HUB_OFFLINE set it said the Hub "could not be reached" and to check the network: a typo in the repo
    id, or a dataset never downloaded, is what to look for."""

    def offline_snapshot_download(repo_id: str, **kwargs: Any) -> str:  # (what it raises offline, nothing cached)
        raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder for the specified revision")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline_snapshot_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetNotFoundError, match=re.escape(
        "dataset 'user/ds' cannot be opened: HF_HUB_OFFLINE is set and huggingface_hub's cache holds no metadata of "
        "revision main of it; check the repo id's spelling, or unset HF_HUB_OFFLINE to download it; nor is it a local "
        "folder under"
    )):  # fmt: skip
        resolve_location("user/ds")


def test_a_hub_outage_is_a_remote_file_error_and_other_errors_keep_their_type(monkeypatch) -> None:
    """A 500 past huggingface_hub's retries is the RemoteFileError naming the metadata folder, its error the cause (as
    a plain HTTP server's); an error that is no network failure keeps its type."""
    errors = [_http_error(HfHubHTTPError, 500, "500 Server Error"), ValueError("not a network failure")]

    def failing_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        raise errors[0]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing_snapshot_download)
    with pytest.raises(RemoteFileError) as caught:
        resolve_location("user/ds")
    assert str(caught.value).startswith(
        "hf://datasets/user/ds/meta/: downloading it failed, the last try with HfHubHTTPError: 500 Server Error "
    ), caught.value
    assert caught.value.status == 500 and caught.value.__cause__ is errors[0]
    errors.pop(0)
    with pytest.raises(ValueError) as other:
        resolve_location("user/ds")
    assert other.value is errors[0]


def _served_hub_metadata(folder: Path, commit: str) -> None:
    """What the Hub answers snapshot_download for dataset ``user/ds``'s metadata at ``main`` (``commit``): its
    ``repo_info``, the ``tree`` of its files (``meta/info.json``), and that file, served as files under ``folder``."""
    api = folder / "api" / "datasets" / "user" / "ds"
    (api / "revision").mkdir(parents=True)
    (api / "revision" / "main").write_text(json.dumps({"id": "user/ds", "sha": commit, "siblings": []}))
    (api / "tree").mkdir()
    entry = {"type": "file", "path": "meta/info.json", "size": 2, "oid": "a" * 40}
    (api / "tree" / commit).write_text(json.dumps([entry]))
    served = folder / "datasets" / "user" / "ds" / "resolve" / commit / "meta" / "info.json"
    served.parent.mkdir(parents=True)
    served.write_text("{}")


@contextlib.contextmanager
def _serving_hub_metadata(tmp_path: Path, monkeypatch, waits: list[float]) -> Iterator[Any]:
    """A server answering as the Hub for dataset ``user/ds``'s metadata (:func:`_served_hub_metadata`), with
    huggingface_hub's cache under ``tmp_path``, its own waits not slept and the loader's recorded in ``waits``."""
    import huggingface_hub.utils._http as hub_http

    from tests.http_server import serve_folder
    from tests.test_http_remote import _SleepsRecorded

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub_http, "time", _SleepsRecorded([]))  # (huggingface_hub's own waits, not slept)
    monkeypatch.setattr("lerobot_dali.remote_retry.time", _SleepsRecorded(waits))
    _served_hub_metadata(tmp_path / "hub", SNAPSHOT_SHA)
    with serve_folder(tmp_path / "hub") as server:
        server.file_headers = {"X-Repo-Commit": SNAPSHOT_SHA}  # (the Hub's resolve answers carry it)
        yield server


def _opened_or_raised(server: Any, opens: bool, raises: type[Exception] = RemoteFileError) -> Exception | None:
    """Open ``user/ds`` from ``server``: where it ``opens``, its metadata is there (None); else what it raised."""
    options = {"endpoint": server.url, "token": False}
    if opens:
        location = resolve_location("user/ds", storage_options=options)
        assert Path(location.meta_path("meta/info.json")).read_text() == "{}"
        return None
    with pytest.raises(raises) as caught:
        resolve_location("user/ds", storage_options=options)
    return caught.value


@pytest.mark.parametrize("fault", ["403", "404", "410", "503"])
def test_a_metadata_file_the_hub_refuses_or_fails_is_a_remote_file_error(tmp_path: Path, monkeypatch, fault) -> None:
    """huggingface_hub's own snapshot_download against a server answering as the Hub, its metadata file refused (403),
    answered 404 though the Hub's listing holds it, or failing past huggingface_hub's retries (503): a 403 and a 503
    were DatasetNotFoundError "the Hub could not be reached ... check the network" (a refusal blamed on the network),
    and the 404 huggingface_hub's raw LocalEntryNotFoundError ("check your connection"). Each is the RemoteFileError
    naming the metadata folder now, with its status and what to do; none is retried by the loader (huggingface_hub
    retried the 503 itself: 7 HEADs)."""
    waits: list[float] = []
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server:
        server.fault_paths = {"/resolve/": fault}
        with pytest.raises(RemoteFileError) as caught:
            resolve_location("user/ds", storage_options={"endpoint": server.url, "token": False})
        heads = [r.status for r in server.records if r.method == "HEAD"]
    message = str(caught.value)
    if fault == "403":
        assert message.startswith(
            f"hf://datasets/user/ds/meta/: downloading it was refused (not retried): {REFUSED_HINT} (HfHubHTTPError: "
            "403 Forbidden"
        ), message
    elif fault in ("404", "410"):
        reason = "Not Found" if fault == "404" else "Gone"
        assert message.startswith(
            f"hf://datasets/user/ds/meta/: the Hub lists a file there that it has not (HTTP {fault}; not retried): "
            "check the revision (branch, tag or commit), and upload the dataset's meta/ files again (HfHubHTTPError: "
            f"Client error '{fault} {reason}'"
        ), message
    else:
        said = "HfHubHTTPError: Server error '503"
        assert message.startswith(f"hf://datasets/user/ds/meta/: downloading it failed, the last try with {said}")
    assert caught.value.status == int(fault)
    assert (heads, waits) == ([int(fault)] * (7 if fault == "503" else 1), [])


@pytest.mark.parametrize("drops", [1, 3])
def test_a_metadata_download_whose_connection_drops_is_retried_by_the_loaders_policy(
    tmp_path: Path, monkeypatch, caplog, drops: int
) -> None:
    """A connection to the Hub closed before its answer (the metadata file's HEAD) is no answer: huggingface_hub does
    not retry it, and it failed the open at once (1 HEAD, RemoteFileError), where a data or video read is retried
    under LEROBOT_DALI_REMOTE_RETRIES. It is retried now with the data reads' policy, waits and log lines: one drop
    costs a retry and the dataset opens; one more than the retries (2 here) is the RemoteFileError after 3 tries."""
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    caplog.set_level(logging.INFO, logger="lerobot_dali.remote_retry")
    waits: list[float] = []
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server:
        server.fault_paths = {"/resolve/": "drop"}
        if drops == 1:
            server.fault_paths = {}
            server.fail_next(None, None, "drop")  # (its repo_info, its listing, then the file's HEAD)
            location = resolve_location("user/ds", storage_options={"endpoint": server.url, "token": False})
            assert Path(location.meta_path("meta/info.json")).read_text() == "{}"
            assert location.meta_root.endswith(f"snapshots/{SNAPSHOT_SHA}")
        else:
            with pytest.raises(RemoteFileError) as caught:
                resolve_location("user/ds", storage_options={"endpoint": server.url, "token": False})
            assert str(caught.value).startswith(
                "hf://datasets/user/ds/meta/: download failed 3 time(s), the last with RemoteProtocolError: Server "
                "disconnected"
            ), caught.value
            assert caught.value.status is None
        heads = [r.method for r in server.records if "/resolve/" in r.path]
    assert len(waits) == min(drops, 2) and heads.count("HEAD") == min(drops, 2) + 1
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "download" in r.getMessage()]
    assert [level for level, _ in said] == ["INFO", "WARNING", "WARNING"][: len(said)] and len(said) == drops, said
    assert said[0][1].startswith(
        "download hf://datasets/user/ds/meta/ failed (RemoteProtocolError: Server disconnected without sending a "
        "response.); retry 1/2 in "
    ), said


def _metadata_heads_timing_out(monkeypatch, timeouts: int) -> None:
    """Make the first ``timeouts`` HEADs of metadata files (huggingface_hub's ``get_hf_file_metadata``) time out."""
    import httpx2
    import huggingface_hub.file_download as file_download

    asked = []

    def timing_out(*args: Any, **kwargs: Any) -> Any:
        asked.append(1)
        if len(asked) <= timeouts:
            raise httpx2.ReadTimeout("timed out")
        return real(*args, **kwargs)

    real = file_download.get_hf_file_metadata
    monkeypatch.setattr(file_download, "get_hf_file_metadata", timing_out)


@pytest.mark.parametrize("loader_tries", [1, 2])
def test_a_metadata_file_whose_body_keeps_dropping_is_not_retried_past_huggingface_hubs_own_tries(
    tmp_path: Path, monkeypatch, loader_tries: int
) -> None:
    """A metadata file's GET whose body drops is tried again by huggingface_hub itself (``http_get``: 6 tries from the
    byte it got to, 1 s apart): each of the loader's tries was those 6 GETs (36 with the default policy, a stalled one
    36 read timeouts, ~6 minutes), where its 503s are not stacked. Its 6 tries spent are the RemoteFileError, with no
    wait of the loader's; after a try of the loader's whose HEAD timed out (twice: huggingface_hub asks twice a try),
    7 tries in all, after one wait."""
    import huggingface_hub.file_download as file_download

    from tests.test_http_remote import _SleepsRecorded

    _metadata_heads_timing_out(monkeypatch, 2 * (loader_tries - 1))
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    monkeypatch.setattr(file_download, "time", _SleepsRecorded([]))  # (its waits between its tries, not slept)
    waits: list[float] = []
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server:
        server.fault_paths = {}
        # (each try's repo_info, the first one's listing, the last one's HEAD of the file, its GETs)
        server.fail_next(*[None] * (loader_tries + 2), *["drop"] * 6)
        with pytest.raises(RemoteFileError) as caught:
            resolve_location("user/ds", storage_options={"endpoint": server.url, "token": False})
        gets = [r.method for r in server.records if "/resolve/" in r.path].count("GET")
    assert str(caught.value).startswith(
        f"hf://datasets/user/ds/meta/: download failed {5 + loader_tries} time(s), the last with RemoteProtocolError: "
    ), caught.value
    assert str(caught.value).endswith("huggingface_hub's own retries spent"), caught.value
    assert (gets, len(waits), caught.value.status) == (6, loader_tries - 1, None)


@pytest.mark.parametrize("timeouts", [2, 6])
def test_a_metadata_files_head_that_times_out_is_retried_not_a_hub_that_could_not_be_reached(
    tmp_path: Path, monkeypatch, timeouts: int
) -> None:
    """The Hub answered the repo's revision and listing, then the metadata file's HEAD timed out (huggingface_hub's
    LocalEntryNotFoundError from httpx's ReadTimeout): the open failed at once as DatasetNotFoundError "the Hub could
    not be reached ... nor is it a local folder", where a dropped connection is retried. It is retried now: the
    dataset opens after one wait (2 timeouts: huggingface_hub asks twice a try), or, timing out every try, is the
    RemoteFileError after the retries (2 here)."""
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    _metadata_heads_timing_out(monkeypatch, timeouts)
    waits: list[float] = []
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server:
        server.fault_paths = {}
        error = _opened_or_raised(server, opens=timeouts == 2)
        assert len(waits) == (1 if error is None else 2)
        if error is not None:
            assert str(error).startswith(
                "hf://datasets/user/ds/meta/: download failed 3 time(s), the last with ReadTimeout: timed out"
            ), error


@pytest.mark.parametrize("fault", ["503", "429"])
@pytest.mark.parametrize("times", [1, 3])
def test_the_revisions_request_answered_5xx_or_429_is_retried_by_the_loaders_policy(
    tmp_path: Path, monkeypatch, caplog, fault: str, times: int
) -> None:
    """snapshot_download first asks the Hub which commit the revision is (``repo_info``), once: huggingface_hub retries
    that request not, where its backoff retries the listing's and the files' 5xx and 429. Such an answer failed the
    open at once (1 request, RemoteFileError 'huggingface_hub retries it itself, or not at all'). It is retried now
    with the data reads' policy, waits and log lines: answered once, the dataset opens after one wait; answered every
    try, it is the RemoteFileError naming the metadata folder, the status and what to do after the retries (2 here).
    Each try's log line says huggingface_hub's error's first line (its link and the server's body ran on for 2-3
    lines more)."""
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    caplog.set_level(logging.INFO, logger="lerobot_dali.remote_retry")
    waits: list[float] = []
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server:
        server.fault_paths = {}
        server.fail_next(*[fault] * times)
        error = _opened_or_raised(server, opens=times == 1)
        if isinstance(error, RemoteFileError):
            message = str(error)
            url = f"{server.url}/api/datasets/user/ds/revision/main"
            said = f"Server error '503 Service Unavailable' for url '{url}'" if fault == "503" else None
            said = said or f"429 Too Many Requests for url: {url}."  # (huggingface_hub's words for each)
            assert message == (
                f"hf://datasets/user/ds/meta/: download failed 3 time(s), the last with HfHubHTTPError: {said}; gave "
                "up: check the connection and the server, or set LEROBOT_DALI_REMOTE_RETRIES to retry more"
            ), message
            assert error.status == int(fault)
        asked = [r.status for r in server.records if "/revision/" in r.path]
    assert asked == [int(fault)] * times + ([200] if times == 1 else []) and len(waits) == min(times, 2)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("download ")]
    begins = {"503": "Server error '503 ", "429": "429 "}[fault]  # (huggingface_hub's words for each)
    assert len(said) == min(times, 2), said
    assert said[0].startswith(f"download hf://datasets/user/ds/meta/ failed (HfHubHTTPError: {begins}"), said
    url = f"{server.url}/api/datasets/user/ds/revision/main"  # (each try's line says the error's first line alone)
    first = {
        "503": f"Server error '503 Service Unavailable' for url '{url}'",
        "429": f"429 Too Many Requests for url: {url}.",
    }
    line = rf"download hf://datasets/user/ds/meta/ failed \(HfHubHTTPError: {re.escape(first[fault])}\)"
    line += r"; retry \d/2 in \S+s"
    assert all(re.fullmatch(line, each) for each in said), said


class _ScriptedHub(httpx2.BaseTransport):
    """huggingface_hub's transport: its requests for the revision (``repo_info``) answered by ``script`` while it
    lasts (an HTTP answer: ``(status, headers)``; a socket's error: the ConnectError httpx raises for it), every
    other request, and those after, by ``served`` (a real server)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.asked = 0
        self.real = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if "/revision/" in request.url.path:
            self.asked += 1
            if self.script:
                step = self.script.pop(0)
                if isinstance(step, OSError):
                    try:
                        raise step
                    except OSError as e:  # (as httpcore raises it: handling the socket's error)
                        raise httpx2.ConnectError(str(e), request=request)  # noqa: B904
                status, headers = step
                return httpx2.Response(status, headers=headers, json={"error": "scripted"}, request=request)
        return self.real.handle_request(request)


@contextlib.contextmanager
def _hub_transport(transport: httpx2.BaseTransport) -> Iterator[None]:
    """huggingface_hub's requests made through ``transport`` (its public client factory)."""
    from huggingface_hub.utils import close_session, set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    set_client_factory(lambda: httpx2.Client(transport=transport, follow_redirects=True))
    close_session()
    try:
        yield
    finally:
        set_client_factory(default_client_factory)
        close_session()


def _raised_handling(error: OSError) -> OSError:
    """``error`` raised while a reset of another connection was handled (its ``__context__``): a refusal whose context
    holds a reset is still a refusal (the Hub could not be reached), not a connection the Hub took and dropped."""
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        try:
            raise error
        except OSError as e:
            return e


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ([ConnectionResetError(104, "Connection reset by peer")], "opens"),
        ([ssl.SSLEOFError(8, "EOF occurred in violation of protocol")], "opens"),
        ([ConnectionRefusedError(111, "Connection refused")], "could not be reached"),
        ([_raised_handling(ConnectionRefusedError(111, "Connection refused"))], "could not be reached"),
        ([socket.gaierror(-2, "Name or service not known")], "could not be reached"),
        ([(404, {"X-Error-Code": "RepoNotFound"})], "not found on the Hub"),
        ([(401, {})], "not found on the Hub"),
        ([(403, {"X-Error-Code": "GatedRepo"})], "gated dataset needs a token"),
    ],
    ids=["reset", "tls-eof", "refused", "refused-handling-a-reset", "dns", "404", "401", "gated"],
)
def test_a_connection_dropped_as_it_is_made_is_retried_and_a_hub_that_says_no_is_not(
    tmp_path: Path, monkeypatch, script: list[Any], outcome: str
) -> None:
    """The Hub is HTTPS: a connection it took and dropped in the TLS handshake is httpx's ConnectError, as a refused
    one is, and huggingface_hub's LocalEntryNotFoundError 'Got: ConnectError' for both: the open failed at once as
    DatasetNotFoundError 'the Hub could not be reached'. A reset or an EOF (the other end took the connection) is
    retried now, as a connection dropped later is: the dataset opens after one wait. A refused connection, a name not
    resolved, a repo not found, unreadable (401) or gated are still the DatasetNotFoundError at once: 1 request; so is
    a refusal raised while a reset was handled (the walk of its causes stops at the socket's error: it was retried)."""
    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    waits: list[float] = []
    transport = _ScriptedHub(list(script))
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server, _hub_transport(transport):
        error = _opened_or_raised(server, opens=outcome == "opens", raises=DatasetNotFoundError)
        assert error is None or re.search(f"dataset 'user/ds' .*{outcome}", str(error)), error
    assert (transport.asked, len(waits)) == ((2, 1) if outcome == "opens" else (1, 0))


class _FailingGets(httpx2.BaseTransport):
    """huggingface_hub's transport: the metadata files' GETs answered ``status`` the first ``times`` times, every
    other request by the real server."""

    def __init__(self, status: int, times: int) -> None:
        self.status, self.times, self.gets = status, times, 0
        self.real = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "GET" and "/resolve/" in request.url.path:
            self.gets += 1
            if self.gets <= self.times:
                return httpx2.Response(self.status, text="scripted", request=request)
        return self.real.handle_request(request)


@pytest.mark.parametrize("status", [503, 500])
@pytest.mark.parametrize("times", [1, 3])
def test_a_metadata_files_get_answered_5xx_is_retried_by_the_loaders_policy(
    tmp_path: Path, monkeypatch, status: int, times: int
) -> None:
    """huggingface_hub retries a file's GET on 408 and 429 only (its HEAD, and the listing, on 5xx too): a metadata
    file's GET answered 503 or 500 once failed the open at once (1 GET, RemoteFileError 'downloading it failed ...
    (after huggingface_hub's own retries)', there were none). It is retried now as the revision's request is: once,
    the dataset opens after one wait; every try, the RemoteFileError after the retries (2 here: 3 GETs)."""
    import huggingface_hub.file_download as file_download

    from tests.test_http_remote import _SleepsRecorded

    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    monkeypatch.setattr(file_download, "time", _SleepsRecorded([]))
    waits: list[float] = []
    transport = _FailingGets(status, times)
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server, _hub_transport(transport):
        error = _opened_or_raised(server, opens=times == 1)
        if isinstance(error, RemoteFileError):
            assert str(error).startswith(
                f"hf://datasets/user/ds/meta/: download failed 3 time(s), the last with HfHubHTTPError: Server error "
                f"'{status} "
            ), error
            assert error.status == status
    assert (transport.gets, len(waits)) == ((2, 1) if times == 1 else (3, 2))


def test_a_metadata_files_get_answered_408_every_time_is_not_retried_again_past_huggingface_hubs_retries(
    tmp_path: Path, monkeypatch
) -> None:
    """huggingface_hub retries a GET answered 408 itself: given up on there, the loader's retries are not stacked on
    its (each of the loader's tries would be all of huggingface_hub's again)."""
    import huggingface_hub.file_download as file_download

    from tests.test_http_remote import _SleepsRecorded

    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    monkeypatch.setattr(file_download, "time", _SleepsRecorded([]))
    waits: list[float] = []
    transport = _FailingGets(408, 100)
    with _serving_hub_metadata(tmp_path, monkeypatch, waits) as server, _hub_transport(transport):
        error = _opened_or_raised(server, opens=False)
    assert isinstance(error, RemoteFileError) and error.status == 408, error
    assert str(error).startswith("hf://datasets/user/ds/meta/: downloading it failed, the last try with "), error
    assert waits == [] and 1 < transport.gets < 100


def test_a_hub_that_drops_every_connection_in_its_tls_handshake_is_a_remote_file_error_after_the_retries(
    monkeypatch,
) -> None:
    """A server that takes each connection and resets it before the TLS handshake ends (one connection a try): 1
    connection and DatasetNotFoundError 'the Hub could not be reached ... nor is it a local folder' before; now the
    RemoteFileError after the retries (2 here, 3 connections), naming the metadata folder and what to do."""
    from tests.test_http_remote import _SleepsRecorded

    monkeypatch.setenv("LEROBOT_DALI_REMOTE_RETRIES", "2")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", _SleepsRecorded(waits))
    accepted: list[int] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def drop_each() -> None:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:  # (closed: the test is over)
                    return
                accepted.append(1)
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # (a reset)
                connection.recv(16)
                connection.close()

        threading.Thread(target=drop_each, daemon=True).start()
        endpoint = f"https://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(RemoteFileError) as caught:
            resolve_location("user/ds", storage_options={"endpoint": endpoint, "token": False})
    assert str(caught.value) == (
        "hf://datasets/user/ds/meta/: download failed 3 time(s), the last with ConnectError: [Errno 104] Connection "
        "reset by peer; gave up: check the connection and the server, or set LEROBOT_DALI_REMOTE_RETRIES to retry more"
    ), caught.value
    assert (len(accepted), len(waits), caught.value.status) == (3, 2, None)


def test_a_request_huggingface_hub_retried_itself_counts_its_tries_behind_its_local_entry_error(
    tmp_path: Path, monkeypatch
) -> None:
    """huggingface_hub raises its LocalEntryNotFoundError from the error its request ended with (the listing of a
    revision that kept dropping, past its backoff's tries): its tries were not counted (0: its loop's frame is in the
    cause's traceback), so the loader's retries were stacked on its (6 requests a try). They are counted now."""
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub.utils import http_backoff

    from lerobot_dali.hub_retries import hub_tries
    from tests.http_server import serve_folder
    from tests.test_http_remote import _SleepsRecorded

    monkeypatch.setattr(hub_http, "time", _SleepsRecorded([]))
    (tmp_path / "listing").write_text("[]")
    with serve_folder(tmp_path) as server:
        server.fault_paths = {"/listing": "drop"}
        try:
            http_backoff("GET", f"{server.url}/listing", max_retries=2)
        except Exception as e:  # (as snapshot_download raises it for its listing's failure)
            wrapped = LocalEntryNotFoundError("Got: RemoteProtocolError")
            wrapped.__cause__ = e
            tries = (hub_tries(e), hub_tries(wrapped))
        asked = len(server.records)
    assert (asked, tries) == (3, (3, 3))


def test_a_hub_nobody_answers_is_dataset_not_found(monkeypatch) -> None:
    """huggingface_hub's own snapshot_download against an endpoint where nothing listens (no network needed)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # (offline: it says so instead)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DatasetNotFoundError, match="'nobody/no-such-dataset'.*the Hub could not be reached"):
        resolve_location("nobody/no-such-dataset", storage_options={"endpoint": f"http://127.0.0.1:{port}"})


def _check_as_one(datasets: list[str], camera: str) -> None:
    from lerobot_dali.cli import main

    assert main(["check", "--concat", *datasets, "--cameras", camera, "--json"]) == 0


@pytest.mark.parametrize(
    "opens",
    [
        lambda datasets, camera: concat_datasets(datasets, cameras=[camera]),
        lambda datasets, camera: DALILeRobotMixture(
            datasets, cameras=[camera], batch_size=2, device="cpu", num_workers=0, cache_gb=0.0
        ).close(),
        _check_as_one,
    ],
    ids=["union", "mixture", "check"],
)
def test_datasets_opened_with_cameras_are_resolved_once_while_the_branch_moves(
    monkeypatch, tmp_path, make_ds, opens
) -> None:
    """Several Hub datasets opened with cameras=, while their branch moves at every resolution: each is resolved once
    (one request for its revision), its cameras chosen and its files read at that one commit. Each was resolved
    twice, its cameras chosen from one commit's info.json and the dataset opened at the next commit."""
    root = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec="vp9", size=(64, 64))
    calls: Counter[str] = Counter()

    def pushed_to_after_each(repo_id: str, **kwargs: Any) -> str:
        calls[repo_id] += 1  # (the n-th resolution finds the n-th commit, a snapshot of the whole dataset)
        folder = tmp_path / repo_id / "snapshots" / f"{calls[repo_id]:040x}"
        shutil.copytree(root, folder)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", pushed_to_after_each)
    monkeypatch.setattr(HfFileSystem, "_repo_and_revision_exist", lambda self, *args, **kwargs: (True, None))
    union = opens(["user/a", "user/b"], "observation.images.cam0")
    assert calls == {"user/a": 1, "user/b": 1}
    for member in getattr(union, "members", ()):
        assert member.location.hub_snapshot.commit == f"{1:040x}"
        assert member.location.meta_root.startswith(str(tmp_path / member.location.hub_snapshot.repo_id))
