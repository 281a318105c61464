"""dataset_location's Hub download, case by case: the revision given, the log lines, how each error of
``snapshot_download`` is told (missing dataset, refused or failed file, a connection dropped or never made, a request
huggingface_hub made once), and the commits the cache holds.

Nothing touches the network: ``snapshot_download`` is stubbed (``hub`` of test_hub_revisions), and the error helpers
are handed errors built as huggingface_hub raises them.
"""

from __future__ import annotations

import logging
import os
import ssl
from types import SimpleNamespace
from typing import Any

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import HfApi, constants, file_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

from lerobot_dali.dataset_location import (
    _answered_once,
    _cached_commits_starting,
    _hub_answer,
    _metadata_download_failed,
    _missing_on_hub,
    _one_revision,
    _snapshot_commit,
    _took_no_answer,
    resolve_location,
)
from lerobot_dali.errors import DatasetNotFoundError, RemoteFileError
from lerobot_dali.remote_errors import REFUSED_HINT
from tests import test_hub_revisions as revisions

hub = revisions.hub  # (the fixture: snapshot_download's calls, each answered a snapshot folder at SNAPSHOT_SHA)
SNAPSHOT_SHA = revisions.SNAPSHOT_SHA
META = "hf://datasets/user/ds/meta/"
TOKEN = "log in (`hf auth login`) or pass storage_options={'token': ...}"


def _answer(status: int, message: str = "answered", cls: type[Exception] = HfHubHTTPError) -> Exception:
    """An error holding the Hub's HTTP answer ``status``, as huggingface_hub raises it."""
    return revisions._http_error(cls, status, message)


def _raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """``error`` raised (from ``cause``, where given), with its traceback."""
    try:
        raise error from cause
    except BaseException as e:
        return e


def test_the_metadata_download_is_logged_naming_the_revision_asked_or_main(hub, caplog) -> None:
    caplog.set_level(logging.INFO, logger="lerobot_dali.dataset_location")
    resolve_location("user/ds")
    resolve_location("user/ds", revision="v1")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("downloading")]
    assert said == ["downloading metadata of user/ds (revision main)", "downloading metadata of user/ds (revision v1)"]


def test_a_hub_dataset_at_the_top_of_its_repo_keeps_its_snapshot_folder_as_the_metadata_root(hub, tmp_path) -> None:
    location = resolve_location("user/ds")
    assert location.meta_root == str(tmp_path / "snapshots" / SNAPSHOT_SHA)
    sub = resolve_location("hf://datasets/user/ds/sub")
    assert sub.meta_root == str(tmp_path / "snapshots" / SNAPSHOT_SHA / "sub")


def test_the_same_revision_in_the_url_and_as_the_argument_is_read(hub) -> None:
    location = resolve_location("hf://datasets/user/ds@v1", revision="v1")
    assert [call["revision"] for call in hub] == ["v1"] and location.description == "hf://datasets/user/ds@v1"


@pytest.mark.parametrize(
    ("in_url", "argument", "revision"),
    [("v1", None, "v1"), (None, "v2", "v2"), ("v1", "v1", "v1"), (None, None, None)],
)
def test_one_revision_is_the_one_given_once_or_twice_alike(in_url, argument, revision) -> None:
    assert _one_revision("hf://datasets/user/ds", in_url, argument) == revision


def test_a_missing_repo_named_by_an_hf_url_is_not_said_to_be_no_local_folder(monkeypatch) -> None:
    """An ``hf://`` URL names a Hub dataset only: a bare ``user/ds`` may be a mistyped local folder, it may not."""
    error = _answer(404, "404 Client Error.\n\nRepo Not Found", RepositoryNotFoundError)

    def failing_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing_snapshot_download)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(DatasetNotFoundError) as caught:
        resolve_location("hf://datasets/user/ds")
    assert str(caught.value) == (
        f"dataset 'user/ds' not found on the Hub, or private and unreadable with the token given; check the repo id, "
        f"or {TOKEN} (RepositoryNotFoundError: 404 Client Error.)"
    )
    assert str(_missing_on_hub("user/ds", None, error)) == str(caught.value)  # (maybe_path: not unless told)


def test_a_snapshot_folder_not_named_by_a_commit_warns_naming_the_revision_read(caplog, tmp_path) -> None:
    folder = tmp_path / "not-a-commit"
    assert _snapshot_commit("user/ds", "feature/x", str(folder)) == "feature/x"
    assert _snapshot_commit("user/ds", None, str(folder)) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"user/ds: the metadata snapshot {folder} is not named by a commit SHA, so data files are read at revision "
        f"{revision}; if that branch moves while reading, data and metadata may disagree (pass a commit SHA as "
        "revision)"
        for revision in ("feature/x", "main")
    ]


def test_a_snapshot_folder_named_by_a_commit_pins_the_branch_and_a_commit_given_is_kept(tmp_path) -> None:
    folder = str(tmp_path / "snapshots" / SNAPSHOT_SHA) + "/"
    assert _snapshot_commit("user/ds", "main", folder) == SNAPSHOT_SHA
    assert _snapshot_commit("user/ds", None, folder) == SNAPSHOT_SHA
    given = "ab" * 20
    assert _snapshot_commit("user/ds", given, folder) == given


# ---- the Hub's answer behind an error, and whether huggingface_hub made its request once


def test_the_hubs_answer_is_found_along_the_errors_causes() -> None:
    answer = _answer(503)
    wrapped = _raised(LocalEntryNotFoundError("gave up"), _raised(ValueError("between"), answer))
    assert _hub_answer(wrapped) is answer
    assert _hub_answer(answer) is answer
    assert _hub_answer(LocalEntryNotFoundError("no answer")) is None
    no_status = OSError("a response without a status")
    no_status.response = SimpleNamespace(status_code="503")  # type: ignore[attr-defined]
    assert _hub_answer(no_status) is None


@pytest.mark.timeout(30)
def test_an_error_chain_that_loops_holds_no_answer() -> None:
    looped = LocalEntryNotFoundError("its own cause")
    looped.__cause__ = ValueError("the loop")
    looped.__cause__.__cause__ = looped
    assert _hub_answer(looped) is None


def _raised_in(module: Any, name: str, error: Exception, monkeypatch) -> BaseException:
    """``error`` raised inside ``module.name`` (stubbed), as huggingface_hub's request there raises it."""

    def request(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(module, name, request)
    try:
        getattr(module, name)()
    except Exception as e:
        return e
    raise AssertionError("not raised")


@pytest.mark.parametrize(("status", "once"), [(503, True), (500, True), (408, False), (429, False)])
def test_a_files_get_answered_5xx_was_made_once_and_one_answered_408_or_429_was_retried(
    monkeypatch, status: int, once: bool
) -> None:
    """huggingface_hub's ``http_get`` retries a GET answered 408 or 429 itself, not one answered 5xx."""
    assert _answered_once(_raised_in(file_download, "http_get", _answer(status), monkeypatch)) is once


@pytest.mark.parametrize("status", [503, 429, 408])
def test_the_revisions_request_was_made_once_whatever_its_answer(monkeypatch, status: int) -> None:
    assert _answered_once(_raised_in(HfApi, "dataset_info", _answer(status), monkeypatch)) is True


def test_an_answer_raised_elsewhere_was_retried_by_huggingface_hub() -> None:
    assert _answered_once(_raised(_answer(503))) is False


# ---- a metadata file's download that failed


def _told(error: BaseException, status: int | None) -> str:
    """The message of the RemoteFileError a metadata file's download failed with ``error`` is told as, its ``status``
    checked."""
    failed = _metadata_download_failed(META, error)
    assert isinstance(failed, RemoteFileError) and failed.status == status
    return str(failed)


@pytest.mark.parametrize("status", [401, 403])
def test_a_metadata_file_refused_is_a_remote_file_error_not_retried(status: int) -> None:
    error = _raised(LocalEntryNotFoundError("gave up"), _answer(status, f"{status} Forbidden\n\nmore"))
    assert _told(error, status) == (
        f"{META}: downloading it was refused (not retried): {REFUSED_HINT} (HfHubHTTPError: {status} Forbidden)"
    )


@pytest.mark.parametrize("status", [503, 429])
def test_a_metadata_file_failing_past_the_retries_is_a_remote_file_error_with_its_status(status: int) -> None:
    assert _told(_answer(status, "Server error"), status) == (
        f"{META}: downloading it failed, the last try with HfHubHTTPError: Server error (after huggingface_hub's own "
        "retries); gave up: check the connection and the Hub (HF_ENDPOINT), then open the dataset again"
    )


def test_a_metadata_download_whose_connection_dropped_is_a_remote_file_error_without_a_status() -> None:
    said = _told(ConnectionResetError(104, "Connection reset by peer"), None)
    assert said.startswith(
        f"{META}: downloading it failed, the last try with ConnectionResetError: [Errno 104] Connection reset by peer "
    ), said


def test_a_dropped_connections_status_that_is_no_number_is_not_told() -> None:
    dropped = ConnectionResetError(104, "Connection reset by peer")
    dropped.response = SimpleNamespace(status_code="503")  # type: ignore[attr-defined]
    _told(dropped, None)


@pytest.mark.parametrize("status", [404, 410])
def test_a_metadata_file_the_hub_lists_but_has_not_says_to_upload_it_again(status: int) -> None:
    assert _told(_answer(status, "Not there"), status) == (
        f"{META}: the Hub lists a file there that it has not (HTTP {status}; not retried): check the revision (branch, "
        "tag or commit), and upload the dataset's meta/ files again (HfHubHTTPError: Not there)"
    )


@pytest.mark.parametrize("error", [_answer(400), _answer(405), _answer(411), ValueError("not a network failure")])
def test_other_metadata_download_errors_keep_their_type(error: Exception) -> None:
    assert _metadata_download_failed(META, error) is None


# ---- errors that mean the dataset cannot be found


def test_metadata_cut_short_online_and_refused_with_403_says_the_hub_refused_the_token(monkeypatch) -> None:
    from huggingface_hub import errors

    if not hasattr(errors, "IncompleteSnapshotError"):
        pytest.skip("huggingface_hub before 2.x raises no IncompleteSnapshotError")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = _raised(errors.IncompleteSnapshotError("missing files", "/cache/snapshot"), _answer(403))
    said = str(_missing_on_hub("user/ds", "v1", error, maybe_path=True))
    assert said == (
        "dataset 'user/ds' cannot be opened: huggingface_hub's cache holds part of its metadata at revision v1 (a "
        f"download cut short), and the Hub refused the rest to the token given: {TOKEN} (IncompleteSnapshotError: "
        "missing files)"
    )


@pytest.mark.parametrize("status", [402, 403, 500])
def test_a_hub_answer_other_than_401_is_not_a_missing_dataset(status: int) -> None:
    assert _missing_on_hub("user/ds", None, _answer(status)) is None


def test_a_hub_that_answered_behind_a_local_entry_error_is_not_a_missing_dataset(monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = _raised(LocalEntryNotFoundError("gave up"), _answer(503))
    assert _missing_on_hub("user/ds", None, error, maybe_path=True) is None


@pytest.mark.parametrize(
    ("cause", "missing"),
    [
        (httpx2.ReadTimeout("timed out"), False),
        (_raised(httpx2.ConnectError("reset"), ConnectionResetError(104, "reset")), False),
        (_raised(httpx2.ConnectError("refused"), ConnectionRefusedError(111, "refused")), True),
        (None, True),
    ],
    ids=["read-timeout", "reset", "refused", "no-cause"],
)
def test_a_local_entry_error_is_a_hub_not_reached_unless_the_connection_was_taken(
    monkeypatch, cause: Exception | None, missing: bool
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = _raised(LocalEntryNotFoundError("Got: an error"), cause)
    said = _missing_on_hub("user/ds", "v1", error)
    if not missing:
        assert said is None
        return
    assert str(said) == (
        "dataset 'user/ds' cannot be opened: the Hub could not be reached and huggingface_hub's cache holds no "
        "metadata of revision v1; check the network, HF_ENDPOINT and HF_HUB_OFFLINE (LocalEntryNotFoundError: Got: an "
        "error)"
    )


def test_offline_a_revision_that_is_no_short_commit_of_the_cache_says_no_metadata(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    said = _missing_on_hub("user/ds", "feed", LocalEntryNotFoundError("nothing cached"))
    assert str(said) == (
        "dataset 'user/ds' cannot be opened: HF_HUB_OFFLINE is set and huggingface_hub's cache holds no metadata of "
        "revision feed of it; check the repo id's spelling, or unset HF_HUB_OFFLINE to download it "
        "(LocalEntryNotFoundError: nothing cached)"
    )


def test_an_error_naming_no_missing_dataset_is_none_and_a_bare_repo_id_may_be_a_local_folder() -> None:
    assert _missing_on_hub("user/ds", None, ValueError("other"), maybe_path=True) is None
    said = str(_missing_on_hub("user/ds", None, _answer(401, "401 Unauthorized"), maybe_path=True))
    assert said == (
        f"dataset 'user/ds' not found on the Hub, or private and unreadable with the token given; check the repo id, "
        f"or {TOKEN}; nor is it a local folder under {os.getcwd()} (HfHubHTTPError: 401 Unauthorized)"
    )


# ---- a connection the Hub took, or one nothing took


def _handling(error: Exception, during: BaseException) -> Exception:
    """``error`` raised while ``during`` was handled (its ``__context__``, no ``__cause__``)."""
    try:
        try:
            raise during
        except BaseException:
            raise error  # noqa: B904
    except Exception as e:
        return e


@pytest.mark.parametrize(
    ("error", "took"),
    [
        (None, False),
        (ValueError("not transient"), False),
        (httpx2.ReadTimeout("timed out"), True),
        (httpx2.ConnectTimeout("timed out"), False),
        (httpx2.ConnectError("no socket error behind it"), False),
        (_raised(httpx2.ConnectError("reset"), ConnectionResetError(104, "reset")), True),
        (_raised(httpx2.ConnectError("aborted"), ConnectionAbortedError(103, "aborted")), True),
        (_handling(httpx2.ConnectError("tls eof"), ssl.SSLEOFError(8, "EOF")), True),
        (_raised(httpx2.ConnectError("refused"), ConnectionRefusedError(111, "refused")), False),
        (_raised(httpx2.ConnectError("deep"), _raised(RuntimeError("between"), ConnectionResetError(104, "r"))), True),
    ],
    ids=["none", "not-transient", "read-timeout", "connect-timeout", "no-cause", "reset", "aborted", "tls-eof-context",
         "refused", "reset-two-deep"],
)  # fmt: skip
def test_a_connection_was_taken_where_it_timed_out_reading_or_was_dropped_as_it_was_made(
    error: BaseException | None, took: bool
) -> None:
    assert _took_no_answer(error) is took


@pytest.mark.timeout(30)
def test_a_connect_error_whose_causes_loop_without_a_socket_error_took_no_connection() -> None:
    error = httpx2.ConnectError("looped")
    between = RuntimeError("between")
    error.__cause__, between.__cause__ = between, error
    assert _took_no_answer(error) is False


# ---- the commits a short hash names in the cache


def test_a_short_commit_hash_names_the_cached_snapshots_whose_commit_it_begins(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    snapshots = tmp_path / "datasets--user--ds" / "snapshots"
    for name in ("feed" * 10, "feedbeef" * 5, "beef" * 10, "feed-not-a-commit"):
        (snapshots / name).mkdir(parents=True)
    assert _cached_commits_starting("user/ds", "feed") == ["feedbeef" * 5, "feed" * 10]  # (sorted)
    assert _cached_commits_starting("user/ds", "feedb") == ["feedbeef" * 5]
    assert _cached_commits_starting("user/ds", "main") == []  # (no commit hash: a branch's name)
    assert _cached_commits_starting("user/ds", None) == []
    assert _cached_commits_starting("user/other", "feed") == []  # (nothing cached)


def test_offline_a_short_commit_hash_of_two_cached_snapshots_names_both(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    for name in ("feed" * 10, "feedbeef" * 5):
        (tmp_path / "datasets--user--ds" / "snapshots" / name).mkdir(parents=True)
    said = str(_missing_on_hub("user/ds", "feed", LocalEntryNotFoundError("nothing cached"), maybe_path=True))
    assert said == (
        "dataset 'user/ds' cannot be opened: HF_HUB_OFFLINE is set and revision 'feed' names no branch or tag the "
        "cache knows, and only the Hub resolves a short commit hash: pass the full one, "
        f"revision={'feedbeef' * 5!r} or revision={'feed' * 10!r}, whose snapshot the cache holds; nor is it a local "
        f"folder under {os.getcwd()} (LocalEntryNotFoundError: nothing cached)"
    )
