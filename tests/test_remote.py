"""Remote reads that survive a flaky network: retry policy, RetryingFileSystem, split roots, iterator parity.

Everything runs against ``tests.fake_remote`` (a local folder behind a fault schedule); nothing touches
the network.
"""

from __future__ import annotations

import email.utils
import errno
import logging
import os
import pickle
import shutil
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import fsspec
import numpy as np
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem
from huggingface_hub.errors import OfflineModeIsEnabled

from lerobot_dali import remote_errors
from lerobot_dali.dataset_location import resolve_location, with_bulk_root
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DatasetError, DatasetNotFoundError, MissingDataFileError, RemoteFileError
from lerobot_dali.remote_errors import (
    REFUSED_HINT,
    changed_on_server,
    first_line,
    is_gone,
    is_missing,
    is_refused,
    is_transient,
    missing_status,
    not_served,
    refusal_noted,
    refused_error,
    refused_without_if_match,
    status_of,
    unmasked_error,
)
from lerobot_dali.remote_retry import RetryingFileSystem, fresh_instance
from lerobot_dali.retry_policy import IF_MATCH_ENV, RETRIES_ENV, RetryPolicy
from tests.fake_remote import FakeHTTPError, FakeRemoteFileSystem
from tests.test_iterator import DELTAS, _check_sample, _dataset, _samples

_Error = TypeVar("_Error", bound=BaseException)
FAST = RetryPolicy(retries=5, base_delay_s=0.0, max_delay_s=0.0)
REPO_ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [5, 1, 7, 4, 6]


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """Backoff waits requested by the library's default policy, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append))
    return waits


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class _HubError(Exception):
    """Shaped like requests' / huggingface_hub's HTTPError: the status lives on ``.response``."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"{status_code} Client Error")
        self.response = _Response(status_code)


class ServerDisconnectedError(Exception):
    """Named like aiohttp's, to check matching by class name."""


class _LibraryOSError(OSError):
    """A library's OSError subclass: built with an errno, it stays itself (OSError alone becomes, say,
    ConnectionRefusedError), so only its errno says what happened."""


class NetworkError(Exception):
    """Named like httpx's (huggingface_hub's HTTP client), as are its subclasses below."""


class ConnectError(NetworkError):
    pass


class TimeoutException(Exception):
    pass


class PoolTimeout(TimeoutException):
    pass


def _raised_from(error: _Error, cause: BaseException) -> _Error:
    error.__cause__ = cause  # (as fsspec's HTTP info raises FileNotFoundError(url) from its GET's error)
    return error


def _given_up_on(cause: BaseException) -> RemoteFileError:
    """The error of retries given up on ``cause`` (raised from it)."""
    return _raised_from(RemoteFileError("x.mp4: read failed 6 time(s)", 503), cause)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (TimeoutError("read timed out"), True),
        (ConnectionResetError("reset by peer"), True),
        (ConnectionAbortedError("aborted"), True),
        (OSError(errno.ETIMEDOUT, "timed out"), True),
        (OSError(errno.ECONNRESET, "reset"), True),
        (FakeHTTPError(503, "unavailable"), True),
        (FakeHTTPError(429, "slow down"), True),
        (FakeHTTPError(408, "request timeout"), True),
        (FakeHTTPError(425, "too early"), True),
        (FakeHTTPError(599, "unknown"), True),  # (the last 5xx)
        (OSError(errno.EAGAIN, "try again"), True),
        *((_LibraryOSError(code, "refused"), True) for code in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EPIPE)),
        (_LibraryOSError(errno.EIO, "refused"), False),
        (FakeHTTPError(500, "internal"), True),
        (FakeHTTPError(404, "not found"), False),
        (FakeHTTPError(403, "forbidden"), False),
        (_HubError(502), True),
        (_HubError(401), False),
        (ServerDisconnectedError(), True),
        (ConnectError("[Errno -2] Name or service not known"), True),
        (PoolTimeout(""), True),
        (RuntimeError("Session is closed: client has been closed"), True),
        (RuntimeError("something else"), False),
        (FileNotFoundError("gone"), False),
        (PermissionError("denied"), False),
        (PermissionError("s3://bucket/timeouts/x.mp4"), False),  # (a refusal naming a path, however named)
        (OSError(errno.EIO, "Input/output error", "/data/timeouts/x.mp4"), False),  # (its strerror says, not its path)
        (ValueError("bad value"), False),
        (ValueError("timeout must be positive"), False),  # (a bad argument that names a timeout)
        (_given_up_on(FakeHTTPError(503, "unavailable")), True),  # (an inner retry loop's, of an outage)
        (_given_up_on(FakeHTTPError(403, "forbidden")), False),
        (DatasetError("bad dataset"), False),
        (OSError(errno.ENOSPC, "no space"), False),
        # HF_HUB_OFFLINE set (a ConnectionError): each read was retried 5 times, ~13 s, and failed alike
        (OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/...: offline mode is enabled."), False),
    ],
)
def test_is_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_backoff_grows_then_caps_with_deterministic_jitter() -> None:
    policy = RetryPolicy(retries=10, base_delay_s=1.0, max_delay_s=8.0)
    delays = [policy.delay_s(n, "s3://b/x") for n in range(1, 8)]
    for n, d in enumerate(delays, start=1):
        assert 0.5 * min(8.0, 2.0 ** (n - 1)) <= d <= min(8.0, 2.0 ** (n - 1))
    assert max(delays) <= 8.0 and delays[5] >= 4.0
    assert delays == [policy.delay_s(n, "s3://b/x") for n in range(1, 8)]  # no global RNG
    assert [policy.delay_s(n, "s3://b/y") for n in range(1, 8)] != delays
    assert policy.delay_s(10_000, "k") <= 8.0


def test_policy_validation_and_env_default(monkeypatch) -> None:
    monkeypatch.setenv(RETRIES_ENV, "2")
    assert RetryPolicy().retries == 2
    monkeypatch.setenv(RETRIES_ENV, "0")  # (fail fast: the least budget, not a negative one)
    assert RetryPolicy().retries == 0
    monkeypatch.setenv(RETRIES_ENV, "many")
    with pytest.raises(ValueError, match=RETRIES_ENV):
        RetryPolicy()
    monkeypatch.setenv(RETRIES_ENV, "-1")
    with pytest.raises(ValueError, match=f"{RETRIES_ENV}='-1' is negative"):
        RetryPolicy()
    for base, most in [(-1.0, 1.0), (float("nan"), 1.0), (0.5, float("nan")), (0.0, -0.5)]:
        with pytest.raises(ValueError, match="base_delay_s and max_delay_s must be >= 0"):
            RetryPolicy(retries=1, base_delay_s=base, max_delay_s=most)
    with pytest.raises(ValueError, match="attempt is 1-based, got 0"):
        RetryPolicy(retries=1).delay_s(0)
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError, match="max_delay_s"):
        RetryPolicy(retries=1, base_delay_s=2.0, max_delay_s=1.0)


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "blob.bin").write_bytes(data)
    return tmp_path, data


def test_retries_zero_fails_fast_on_first_transient_error(blob) -> None:
    root, _ = blob
    fake = FakeRemoteFileSystem(str(root), fault_every=1, faults=("503",))
    fs = RetryingFileSystem(fake, policy=RetryPolicy(retries=0))
    with pytest.raises(RemoteFileError, match=r"^blob.bin: info failed 1 time\(s\), the last with FakeHTTPError: 503"):
        fs.info("blob.bin")
    assert fake.requests == {"info": 1}


def test_budget_spent_raises_last_error_with_attempt_count(blob) -> None:
    root, _ = blob
    fake = FakeRemoteFileSystem(str(root), fault_every=1, faults=("timeout", "429"))
    fresh = []
    fs = RetryingFileSystem(fake, policy=RetryPolicy(retries=3, base_delay_s=0.0, max_delay_s=0.0),
                            fresh_client=lambda: fresh.append(1))  # fmt: skip
    with pytest.raises(RemoteFileError) as info:
        fs.cat_file("blob.bin")
    assert info.value.status == 429 and isinstance(info.value.__cause__, FakeHTTPError)  # (the 4th failure's)
    assert fake.requests == {"cat_file": 4}
    assert "cat_file failed 4 time(s)" in str(info.value) and "failed 4 time(s)" in info.value.__cause__.__notes__[-1]
    assert fresh == [1, 1]  # from the second retry on


class _Translated(Exception):
    """The error a client's own error is raised from (botocore's under s3fs's OSError, httpx's under huggingface_hub's
    HfHubHTTPError), holding what names the request."""


def _raised_from_the_clients_error(kind: str, path: str) -> Exception:
    """A 503 raised from the client's error; or (``missing``) fsspec's FileNotFoundError from a 403 raised from it."""
    error = FakeHTTPError(503 if kind == "503" else 403, "Service Unavailable" if kind == "503" else "Forbidden")
    error.__cause__ = _Translated(f"{path}: x-amz-request-id 4442587FB7D0A2F9")
    if kind == "503":
        return error
    masked = FileNotFoundError(path)
    masked.__cause__ = error
    return masked


@pytest.mark.parametrize("fault", ["503", "missing"], ids=["retries_spent", "refused"])
def test_an_error_given_up_on_keeps_its_own_cause(blob, monkeypatch, fault: str) -> None:
    """An error a client raised from the one it translated (huggingface_hub's HfHubHTTPError from httpx's, s3fs's
    OSError from botocore's, which names the request) lost that cause when the retries gave up on it (a 503 after 2
    retries) or refused it (a 403 behind fsspec's FileNotFoundError): raised ``from None`` (2 of 2 without it). It
    keeps it now, under the RemoteFileError naming the file, and the retry loop's context stays out of the
    traceback."""
    import tests.fake_remote

    monkeypatch.setattr(tests.fake_remote, "fault_exception", _raised_from_the_clients_error)
    root, _ = blob
    fake = FakeRemoteFileSystem(str(root), fault_every=1, faults=(fault,))
    fs = RetryingFileSystem(fake, policy=RetryPolicy(retries=2, base_delay_s=0.0, max_delay_s=0.0))
    with pytest.raises(RemoteFileError) as given_up:
        fs.cat_file("blob.bin")
    failed = given_up.value.__cause__
    assert isinstance(failed, FakeHTTPError) and given_up.value.__suppress_context__
    assert failed.status == given_up.value.status == (503 if fault == "503" else 403)
    assert fake.requests == {"cat_file": 3 if fault == "503" else 1}
    assert isinstance(failed.__cause__, _Translated) and "x-amz-request-id" in str(failed.__cause__)


@pytest.mark.parametrize("retries", [0, 1])
def test_a_file_that_shrank_after_opening_says_it_changed(blob, retries: int) -> None:
    """An early end of stream is a broken connection or a changed file. Without retries the error says both
    (it said only 'ended early'); the reopen before a retry sees the new size and says which (a retried
    'broken connection' spent every retry on it)."""
    from lerobot_dali.errors import DatasetError

    root, data = blob
    fs = RetryingFileSystem(FakeRemoteFileSystem(str(root)), policy=RetryPolicy(retries=retries, base_delay_s=0.0))
    with fs.open("blob.bin", "rb") as f:
        (root / "blob.bin").write_bytes(data[:1000])  # replaced remotely by a shorter file
        f.seek(500)
        if retries:
            changed = r"changed on the server while it was read \(300000 .*, 1000 bytes now\)"
            with pytest.raises(DatasetError, match=changed):
                f.read(2000)
        else:
            with pytest.raises(RemoteFileError, match=r"ended at byte 1000 of the 300000 .*the file changed since"):
                f.read(2000)


def test_bounds_that_cross_or_a_negative_seek_are_refused_before_any_request_and_an_empty_range_is_empty(blob) -> None:
    """``[-5, 100)`` of a 300,000-byte file crosses once the file's size is known (asked once: a Range sent as such is
    ignored and answered whole); ``[5, 5)`` holds no byte; a start before the file's start is its start, as in a
    slice; a seek before the file's start names the file."""
    root, data = blob
    fake = FakeRemoteFileSystem(str(root))
    fs = RetryingFileSystem(fake, policy=FAST)
    with pytest.raises(ValueError, match=r"bytes \[299995, 100\) of blob\.bin asked: a range cannot start past"):
        fs.cat_file("blob.bin", start=-5, end=100)
    assert fs.cat_file("blob.bin", start=5, end=5) == b"" and fs.cat_file("blob.bin", -5, None) == data[-5:]
    assert fs.cat_file("blob.bin", -400_000, 3) == data[-400_000:3] == data[:3]
    with fs.open("blob.bin", "rb") as f, pytest.raises(ValueError, match=r"negative seek position -1 in blob\.bin"):
        f.seek(-1)


class _WholeAnswers(FakeRemoteFileSystem):
    """A fake whose ``cat_file`` answers any range with the whole file, as a server that ignores Range does."""

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        return super().cat_file(path, **kwargs)


@pytest.mark.parametrize(("start", "end"), [(5, 10), (5, 5)])
def test_a_range_answered_with_the_whole_file_is_named_not_handed_out_an_empty_one_too(blob, start, end) -> None:
    """A filesystem that answers a range (``[5, 5)`` too, of no byte) with the whole file is named with the fix."""
    root, _ = blob
    fs = RetryingFileSystem(_WholeAnswers(str(root)), policy=FAST)
    with pytest.raises(DatasetError, match=r"^blob\.bin: the server ignored an HTTP Range request"):
        fs.cat_file("blob.bin", start=start, end=end)


def test_the_stamps_pinned_last_answer_for_a_file_before_those_pinned_earlier(blob) -> None:
    """A union's merged stamps pinned on its first dataset's filesystem, in place of that dataset's own: the file's
    stamp is the later one's (its removal named by the size it had then); pinned again, a table moves to the front."""
    from lerobot_dali.file_stamps import FileStamp

    root, _ = blob
    fs = RetryingFileSystem(FakeRemoteFileSystem(str(root)), policy=FAST)
    own, merged = {"blob.bin": FileStamp(10)}, {"blob.bin": FileStamp(20)}
    fs.pin(own)
    fs.pin(merged)
    assert "(20 bytes when opened, removed now)" in str(fs._removed("blob.bin"))
    fs.pin(own)
    assert "(10 bytes when opened, removed now)" in str(fs._removed("blob.bin")) and fs.pinned == (own, merged)


def test_a_first_retry_is_said_at_info_and_later_ones_at_warning(blob, caplog) -> None:
    """One blip is routine (INFO); a second retry of the same request is trouble worth seeing (WARNING)."""
    root, _ = blob
    fs = RetryingFileSystem(FakeRemoteFileSystem(str(root), fault_every=1, faults=("503",)), policy=RetryPolicy(
        retries=2, base_delay_s=0.0, max_delay_s=0.0))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lerobot_dali.remote_retry"), pytest.raises(RemoteFileError):
        fs.cat_file("blob.bin")
    retries = [(r.levelname, r.getMessage().split("; ")[-1]) for r in caplog.records if "; retry " in r.getMessage()]
    assert retries == [("INFO", "retry 1/2 in 0.00s"), ("WARNING", "retry 2/2 in 0.00s")], caplog.text


@pytest.mark.parametrize("call", ["info", "open", "cat_file"])
def test_non_transient_errors_are_never_retried(blob, call: str) -> None:
    root, _ = blob
    fake = FakeRemoteFileSystem(str(root), fault_every=1, faults=("missing",))
    fs = RetryingFileSystem(fake, policy=FAST)
    with pytest.raises(FileNotFoundError):
        getattr(fs, call)("blob.bin")
    assert sum(fake.requests.values()) == 1


@pytest.mark.parametrize("every", [3, 4, 7])
def test_reads_under_faults_are_byte_identical(blob, every: int) -> None:
    root, data = blob
    fake = FakeRemoteFileSystem(str(root), fault_every=every)
    fs = RetryingFileSystem(fake, policy=FAST)
    assert fs.cat_file("blob.bin") == data
    assert fs.info("blob.bin")["size"] == len(data) and fs.exists("blob.bin")
    with fs.open("blob.bin", "rb") as f:
        got = [f.read(7_000) for _ in range(10)]
        f.seek(-1000, 2)
        tail = f.read()
        f.seek(123_456)
        middle = f.read(50_000)
    assert b"".join(got) == data[:70_000]
    assert tail == data[-1000:] and middle == data[123_456:173_456]
    assert fake.faults_injected.total() >= 2
    if every == 3:  # enough requests for every kind of fault, truncated and reset reads included
        assert set(fake.faults_injected) == {"timeout", "503", "429", "reset", "truncate"}
    assert fake.requests["open"] > 1  # failed reads reopened the file


def test_wrapper_pickles_and_leaves_local_alone(blob, tmp_path: Path) -> None:
    root, data = blob
    fs = RetryingFileSystem(FakeRemoteFileSystem(str(root), fault_every=3), policy=FAST)
    clone = pickle.loads(pickle.dumps(fs))
    assert isinstance(clone.fs, FakeRemoteFileSystem) and clone.policy == FAST
    assert clone.cat_file("blob.bin") == data
    assert resolve_location(root).fs.__class__ is fsspec.implementations.local.LocalFileSystem
    assert not isinstance(resolve_location(root).fs, RetryingFileSystem)


def test_an_update_mode_open_goes_to_the_wrapped_filesystem_and_writes_its_bytes(blob) -> None:
    """Only plain reads get a RetryingFile (read-only): ``r+b`` is a write too, opened by the wrapped filesystem."""
    root, data = blob
    fs = RetryingFileSystem(LocalFileSystem(), policy=FAST)
    with fs.open(str(root / "blob.bin"), "r+b") as f:
        f.seek(10)
        f.write(b"xyz")
    assert (root / "blob.bin").read_bytes() == data[:10] + b"xyz" + data[13:]


def _read_all(reader) -> list[dict[str, np.ndarray]]:
    return [reader.read_episode(pos) for pos in range(len(LENGTHS))]


def _assert_rows_equal(a, b) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for key in ra:
            np.testing.assert_array_equal(ra[key], rb[key])


def _ds(make_ds) -> Path:
    return make_ds(episodes=5, frames_per_episode=LENGTHS, episodes_per_file=2, codec="vp9", fps=10)


def test_open_dataset_over_faulty_remote_reads_rows_equal_to_local(make_ds, monkeypatch, slept) -> None:
    monkeypatch.setenv(RETRIES_ENV, "4")
    root = _ds(make_ds)
    remote = open_dataset("fakeremote://", storage_options={"root": str(root), "fault_every": 4})
    assert isinstance(remote.location.fs, RetryingFileSystem) and not remote.location.is_local
    fake = remote.location.fs.fs
    _assert_rows_equal(_read_all(remote), _read_all(open_dataset(root)))
    assert fake.faults_injected.total() > 0 and fake.requests["read"] > 0
    # Every fault raised is waited on once; a truncate only raises outside reads (reads just come back short).
    faults = fake.faults_injected.total()
    assert faults - fake.faults_injected["truncate"] <= len(slept) <= faults
    assert slept and all(0.25 <= w <= 0.5 for w in slept)


def test_split_roots_metadata_local_bulk_from_fake_remote(make_ds, tmp_path: Path, slept) -> None:
    root = _ds(make_ds)
    meta_only = tmp_path / "meta_only"
    shutil.copytree(root / "meta", meta_only / "meta")
    reader = open_dataset(
        meta_only, data_files_root="fakeremote://", storage_options={"root": str(root), "fault_every": 3}
    )
    assert reader.location.meta_root == str(meta_only) and isinstance(reader.location.fs, RetryingFileSystem)
    assert "data files: fakeremote://" in reader.location.description
    _assert_rows_equal(_read_all(reader), _read_all(open_dataset(root)))
    assert reader.location.fs.fs.faults_injected.total() > 0
    with pytest.raises(MissingDataFileError):  # bulk files are not looked up next to the metadata
        open_dataset(meta_only)


class _QueryRemote(FakeRemoteFileSystem):
    """``queryremote://?a=1&b=2``: the fake remote, its URL's query given to the filesystem as ``query`` (as s3fs
    reads ``?versionId=``, and a signing filesystem its URL's signature), to send with its requests."""

    protocol = "queryremote"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("queryremote://").partition("?")[0])

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        from urllib.parse import parse_qsl, urlsplit

        return {"query": dict(parse_qsl(urlsplit(path).query))}


@pytest.mark.parametrize("remote_part", ["dataset", "data_files_root"])
def test_credentials_in_a_urls_query_are_sent_but_saved_in_no_state(make_ds, caplog, remote_part: str) -> None:
    """A non-HTTP URL's query stayed in the dataset's description, which the logs, reports and every stream state's
    ``dataset_descriptions`` hold (b6697df took a URL's user:password out, an http(s) URL's query goes to the requests'
    params): ``...?versionId=3&X-Amz-Signature=s3cret&X-Amz-Credential=AKIA&token=t0ken`` was saved and logged with its
    3 secrets (2 of 2 routes). Now the credential-like parameters are left out of it, ``versionId`` (no secret: which
    data) kept; the filesystem still gets them all, and reads the dataset's rows."""
    from lerobot_dali.dataset_union import datasets_held

    fsspec.register_implementation("queryremote", _QueryRemote, clobber=True)
    root = _ds(make_ds)
    query = "versionId=3&X-Amz-Signature=s3cret&X-Amz-Credential=AKIA&token=t0ken"
    caplog.set_level(logging.DEBUG)
    if remote_part == "dataset":
        remote = open_dataset(f"queryremote://?{query}", storage_options={"root": str(root)})
        assert remote.location.description == "queryremote://?versionId=3"
    else:
        remote = open_dataset(root, data_files_root=f"queryremote://?{query}", storage_options={"root": str(root)})
        assert remote.location.description == f"{root} (data files: queryremote://?versionId=3)"
    assert remote.location.fs.fs.storage_options["query"] == {
        "versionId": "3", "X-Amz-Signature": "s3cret", "X-Amz-Credential": "AKIA", "token": "t0ken"
    }  # fmt: skip
    _assert_rows_equal(_read_all(remote), _read_all(open_dataset(root)))
    said = repr(datasets_held([remote])) + caplog.text
    assert not [secret for secret in ("s3cret", "AKIA", "t0ken") if secret in said]


def test_a_file_url_and_a_relative_folder_are_read_as_local_folders(tmp_path: Path, monkeypatch) -> None:
    """A ``file://`` URL is a local folder (no retries: the workers and caches take it as local), and a relative path
    is kept absolute: a process started in another folder reads the same files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds").mkdir()
    by_url = resolve_location(f"file://{tmp_path}/ds")
    assert by_url.is_local and type(by_url.fs) is LocalFileSystem and by_url.root == f"{tmp_path}/ds"
    relative = resolve_location("ds")
    assert relative.root == relative.meta_root == relative.description == str(tmp_path / "ds")


def test_split_roots_with_a_local_mirror_and_bad_root(make_ds, tmp_path: Path) -> None:
    root = _ds(make_ds)
    location = with_bulk_root(resolve_location(tmp_path), root)
    assert location.is_local and location.root == str(root) and location.meta_root == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="data_files_root"):
        with_bulk_root(location, tmp_path / "absent")


def test_iterator_over_split_roots_with_faults_matches_local(make_ds, tmp_path: Path, monkeypatch, slept) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    monkeypatch.setenv(RETRIES_ENV, "4")
    root = _dataset(make_ds, "vp9")
    meta_only = tmp_path / "meta_only"
    shutil.copytree(root / "meta", meta_only / "meta")
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0,
                   drop_last=False)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, **options))
    reader = open_dataset(
        meta_only, data_files_root="fakeremote://", storage_options={"root": str(root), "fault_every": 7}
    )
    remote = _samples(DALILeRobotIterator(reader, **options))
    assert [int(s["index"]) for s in remote] == [int(s["index"]) for s in local] == list(range(sum(LENGTHS)))
    for a, b in zip(local, remote, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key
        _check_sample(b)
    assert reader.location.fs.fs.faults_injected.total() > 0


def use_fast_retries(monkeypatch: pytest.MonkeyPatch, retries: int = 8) -> RetryPolicy:
    """Remote filesystems resolved from now on retry ``retries`` times without waiting.

    The policy is an argument of the wrapper, so it travels to DALI's spawned workers with the pickled
    filesystem (a patched ``time.sleep`` would not).
    """
    policy = RetryPolicy(retries=retries, base_delay_s=0.0, max_delay_s=0.0)

    def fast(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
        if isinstance(fs, (LocalFileSystem, RetryingFileSystem)):
            return fs
        return RetryingFileSystem(fs, policy=policy, fresh_client=partial(fresh_instance, fs))

    monkeypatch.setattr("lerobot_dali.dataset_location._retrying", fast)
    return policy


def importable_in_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned DALI workers unpickle test filesystems by importing ``tests.*``: put the repo root on their path."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


class _LoggedFakeRemote(FakeRemoteFileSystem):
    """The fake remote, appending ``pid kind fault`` per injected fault to ``fault_log``, so faults suffered in
    spawned workers (each with its own copy and counters) are visible to the test."""

    protocol = "fakeremotelog"

    def __init__(self, root: str, *, fault_log: str, **kwargs: Any) -> None:
        super().__init__(root, fault_log=fault_log, **kwargs)
        self.fault_log = fault_log

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        text = str(path)
        return super()._strip_protocol(text[len("fakeremotelog://") :] if text.startswith("fakeremotelog://") else text)

    def _request(self, kind: str, path: str) -> str | None:
        fault = super()._request(kind, path)
        if fault is not None:
            with open(self.fault_log, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {kind} {fault}\n")
        return fault


fsspec.register_implementation("fakeremotelog", _LoggedFakeRemote, clobber=True)


@pytest.mark.parametrize(
    ("cause", "transient", "unmasked"),
    [
        (FakeHTTPError(503, "unavailable"), True, True),
        (TimeoutError("timed out"), True, True),
        (FakeHTTPError(403, "forbidden"), False, True),  # (a refusal: no missing file, not retried)
        (FakeHTTPError(404, "not found"), False, False),
        (FakeHTTPError(410, "gone"), False, False),
        (FileNotFoundError("really gone"), False, False),
        (RuntimeError("something else"), False, False),  # (no status, not transient: no answer to unmask)
        (None, False, False),
    ],
)
def test_fsspecs_file_not_found_is_transient_or_unmasked_by_what_it_was_raised_from(
    cause: BaseException | None, transient: bool, unmasked: bool
) -> None:
    # fsspec's HTTP info: ``raise FileNotFoundError(url) from exc`` for whatever its fallback GET hit
    try:
        raise FileNotFoundError("http://host/x.mp4") from cause
    except FileNotFoundError as e:
        assert is_transient(e) is transient
        assert unmasked_error(e) is (cause if unmasked else e)


def test_a_stamped_files_404_is_its_removal_to_a_read_and_its_absence_to_exists(blob) -> None:
    """Only a request of a stamped file's bytes (open, read, cat_file) takes its 404 for the file's removal since it
    was stamped; ``exists`` (an ``info``) asked of it answers False, as of any absent file."""
    root, _ = blob
    fake = FakeRemoteFileSystem(str(root))
    fs = RetryingFileSystem(fake, policy=FAST)
    fs.pin({"blob.bin": SimpleNamespace(size=300_000)})
    (root / "blob.bin").unlink()
    assert fs.exists("blob.bin") is False and fake.requests == {"info": 1}
    with pytest.raises(DatasetError, match=r"blob\.bin changed on the server .*removed") as info:
        fs.cat_file("blob.bin")
    assert isinstance(info.value.__cause__, FileNotFoundError) and fake.requests == {"info": 1, "cat_file": 1}


def test_a_401_or_403_is_a_refusal_and_one_without_a_status_is_named_403() -> None:
    assert [is_refused(FakeHTTPError(status, "no")) for status in (401, 403, 404)] == [True, True, False]
    assert [refused_error(error, "read", "x.mp4").status for error in (_HubError(401), PermissionError("no"))] == [
        401,
        403,
    ]


def test_a_refusal_is_noted_once_however_often_it_is_seen() -> None:
    """A refusal passes through several layers (a retry loop, the reader, a worker) that each note it."""
    error = FakeHTTPError(403, "Forbidden")
    for _ in range(3):
        assert refusal_noted(error, "read", "x.mp4") is error
    assert error.__notes__ == [f"lerobot_dali: read 'x.mp4' was refused (not retried): {REFUSED_HINT}"]


def test_a_status_is_an_http_status_100_to_599_of_the_error_or_its_response() -> None:
    """``status``, ``status_code`` or ``code`` (an int, not a bool) in HTTP's range, 100-599, of the error or its
    ``response``; other numbers there (an errno, a library's own code) are no status."""
    for value, status in [(99, None), (100, 100), (599, 599), (600, None), (True, None)]:
        assert status_of(SimpleNamespace(code=value)) == status
    assert status_of(SimpleNamespace(response=SimpleNamespace(status_code=404))) == 404


def test_a_refusal_is_left_without_a_note_before_python_3_11(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exceptions take notes (``add_note``) from Python 3.11 on: on 3.10 a refusal passes on as it is."""
    monkeypatch.setattr(remote_errors, "sys", SimpleNamespace(version_info=(3, 10, 14, "final", 0)))
    error = FakeHTTPError(403, "Forbidden")
    assert refusal_noted(error, "read", "x.mp4") is error and not hasattr(error, "__notes__")


@pytest.mark.parametrize("status", [None, 401, 403])
def test_a_read_refused_again_without_if_match_names_the_status_of_its_refusal(status: int | None) -> None:
    """The status the server refused the read sent again without If-Match with (401 or 403); s3fs's PermissionError
    has none: a 403."""
    error = refused_without_if_match("https://host/x.mp4", status)
    said = f"then refused the read sent again without If-Match (HTTP {status or 403}): it serves the file neither way"
    assert said in str(error)


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("404 Client Error.\n\nEntry Not Found for url: https://huggingface.co/...", "404 Client Error."),
        ("\n  403 Forbidden\nthe server's body", "403 Forbidden"),  # (a message that starts with a blank line)
        ("", "(no message)"),
        (" \n ", "(no message)"),
    ],
)
def test_an_errors_first_line_is_its_first_said_line(message: str, line: str) -> None:
    assert first_line(RuntimeError(message)) == line


@pytest.mark.parametrize(
    ("error", "missing", "status", "gone"),
    [
        (FakeHTTPError(404, "not found"), True, 404, False),
        (FakeHTTPError(410, "gone"), True, 410, True),
        (FakeHTTPError(403, "forbidden"), False, None, False),
        (FileNotFoundError("x.mp4"), True, None, False),  # (an object store's: no server status)
        (_raised_from(FileNotFoundError("x.mp4"), FakeHTTPError(404, "not found")), True, 404, False),
        (_raised_from(FileNotFoundError("x.mp4"), FakeHTTPError(410, "gone")), True, 410, True),
        (_raised_from(FileNotFoundError("x.mp4"), FakeHTTPError(503, "unavailable")), False, None, False),
        (_raised_from(FileNotFoundError("x.mp4"), ConnectionRefusedError("refused")), False, None, False),
        (MissingDataFileError("x.mp4: missing (listed in the episode metadata)"), False, None, False),  # (ours)
        (DatasetNotFoundError("no meta/info.json"), False, None, False),
        (MissingDataFileError("x.mp4: the server has no such file (HTTP 410)", 410), True, 410, True),
    ],
)
def test_a_missing_file_is_one_a_server_said_it_has_not_and_gone_one_it_said_410_for(
    error: BaseException, missing: bool, status: int | None, gone: bool
) -> None:
    """Only the server's answer counts (404, 410, a FileNotFoundError of its client), not fsspec's FileNotFoundError
    of an outage, nor this package's own errors naming a file that a listing or the metadata lacks."""
    assert (is_missing(error), missing_status(error), is_gone(error)) == (missing, status, gone)


@pytest.mark.parametrize("status", [None, 404, 410])
def test_a_file_a_server_has_not_is_a_missing_data_file_of_its_status(status: int | None) -> None:
    error = not_served("https://host/x.mp4", status)
    assert isinstance(error, MissingDataFileError) and error.status == (status or 404)
    assert str(error).startswith(f"https://host/x.mp4: the server has no such file (HTTP {status or 404}): check")


@pytest.mark.parametrize("unsure", [False, True])
def test_a_change_told_by_a_412_alone_names_the_way_out_of_an_unreliable_if_match(unsure: bool) -> None:
    error = changed_on_server("https://host/x.mp4", 'ETag "a" when opened, "b" now', if_match_unsure=unsure)
    way_out = f" (or, if it did not change and the server's If-Match or ETags are unreliable, set {IF_MATCH_ENV}=0 to"
    assert str(error).startswith(
        'https://host/x.mp4 changed on the server while it was read (ETag "a" when opened, "b" now); re-open the '
        "dataset" + (way_out if unsure else "")
    )
    assert (IF_MATCH_ENV in str(error)) is unsure


class _SwallowingFake(FakeRemoteFileSystem):
    """A fake whose ``exists`` swallows errors, as fsspec's HTTP and AbstractFileSystem ``exists`` do."""

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            return super().exists(path, **kwargs)
        except Exception:
            return False


def test_exists_retries_transient_errors_instead_of_answering_false(blob) -> None:
    root, _ = blob
    fake = _SwallowingFake(str(root), fault_every=2, faults=("503",))
    fs = RetryingFileSystem(fake, policy=FAST)
    assert fake.exists("blob.bin") is True and fake.exists("blob.bin") is False  # the 2nd request fails
    assert fs.exists("blob.bin") is True and fs.exists("blob.bin") is True  # retried through info
    assert fake.requests == {"exists": 2, "info": 3} and fake.faults_injected == {"503": 2}
    assert fs.exists("absent.bin") is False  # FileNotFoundError is an answer, not a failure
    down = RetryingFileSystem(_SwallowingFake(str(root), fault_every=1, faults=("503",)), policy=FAST)
    with pytest.raises(RemoteFileError) as info:  # an outage past the budget is raised, never reported as absent
        down.exists("blob.bin")
    assert info.value.status == 503 and "info failed 6 time(s)" in str(info.value)
    denied = RetryingFileSystem(FakeRemoteFileSystem(str(root), fault_every=1, faults=("denied",)), policy=FAST)
    with pytest.raises(RemoteFileError, match="access denied"):  # a 403 is no answer either: "missing" misled
        denied.exists("blob.bin")


@pytest.mark.parametrize("cache_gb", [0.0, 1.0], ids=["workers_read_remote", "prefetch_cache"])
def test_iterator_with_spawned_workers_over_faulty_fake_remote_matches_local(
    make_ds, tmp_path: Path, monkeypatch, cache_gb: float
) -> None:
    """``cache_gb=0``: the two spawned workers read the fake remote themselves and retry its faults;
    otherwise the parent's prefetcher fetches through the faults and the workers read its cache."""
    from lerobot_dali.iterator import DALILeRobotIterator

    use_fast_retries(monkeypatch)
    importable_in_workers(monkeypatch)
    root = _dataset(make_ds, "vp9")
    log = tmp_path / "faults.log"
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=3, episode_pool_size=2, device="cpu",
                   drop_last=False)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, num_workers=0, **options))
    reader = open_dataset(
        "fakeremotelog://", storage_options={"root": str(root), "fault_every": 5, "fault_log": str(log)}
    )
    it = DALILeRobotIterator(reader, num_workers=2, cache_dir=tmp_path / "cache", cache_gb=cache_gb, **options)
    remote = _samples(it)
    prefetched = it.prefetcher is not None
    it.close()
    indices = [int(s["index"]) for s in remote]
    assert indices == [int(s["index"]) for s in local] and sorted(indices) == list(range(sum(LENGTHS)))
    assert indices != sorted(indices)  # shuffled
    _assert_samples_equal(local, remote)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert {line[2] for line in lines} >= {"timeout", "503", "429", "reset"}
    worker_faults = [line for line in lines if int(line[0]) != os.getpid()]
    if cache_gb == 0:
        assert len({line[0] for line in worker_faults}) == 2  # both workers read remotely through faults
        assert any(line[1] == "read" for line in worker_faults)
    else:
        assert prefetched and any(line[1] == "read" for line in lines)


def _assert_samples_equal(a_samples: list[dict], b_samples: list[dict]) -> None:
    assert len(a_samples) == len(b_samples)
    for a, b in zip(a_samples, b_samples, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_episode_selection_over_a_remote_matches_local(make_ds, tmp_path: Path) -> None:
    """``episodes=`` on a remote dataset: the prefetcher warms and the stream reads only those episodes."""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = _dataset(make_ds, "vp9")
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=1, device="cpu", num_workers=0,
                   drop_last=False)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, episodes=[1, 3], **options))
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)}, episodes=[3, 1])
    it = DALILeRobotIterator(reader, cache_dir=tmp_path / "cache", cache_gb=1.0, **options)
    remote = _samples(it)
    assert it.prefetcher is not None
    it.close()
    assert [int(s["index"]) for s in remote] == [int(s["index"]) for s in local]
    assert sorted(int(s["index"]) for s in remote) == [5, *range(13, 17)]  # episodes 1 (1 frame) and 3 (4)
    _assert_samples_equal(local, remote)


def test_a_rate_limit_waits_as_long_as_the_server_asks(monkeypatch) -> None:
    """A 429 with Retry-After was retried on the policy's backoff alone (0.5, 1, 2, 4 s...), spending the retries
    inside the rate limit; the wait is now at least what the server asked, and at most MAX_RETRY_AFTER_S. The Hub's
    429s say it in a ``RateLimit`` header (none left, reset in t s), which huggingface_hub's own retries honoured
    and this module's, which replace them for Hub reads, did not."""
    from lerobot_dali import remote_retry, retry_policy

    class RateLimited(Exception):
        def __init__(self, after: str, header: str = "Retry-After") -> None:
            super().__init__(429, "Too Many Requests")
            self.status, self.headers = 429, {header: after}

    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append, time=time.time))
    for after, expected in [
        ("7", 7.0),
        ("86400", retry_policy.MAX_RETRY_AFTER_S),
        (('"api";r=0;t=55', "RateLimit"), 55.0),
        (('"api";r=0;t=9000', "RateLimit"), retry_policy.MAX_RETRY_AFTER_S),
        (('"api";r=3;t=55', "RateLimit"), RetryPolicy(retries=2, base_delay_s=0.1).delay_s(1, "read:x.mp4")),
        ("soon", RetryPolicy(retries=2, base_delay_s=0.1).delay_s(1, "read:x.mp4")),  # (neither seconds nor a date)
        ("-5", RetryPolicy(retries=2, base_delay_s=0.1).delay_s(1, "read:x.mp4")),
    ]:
        answers = iter([RateLimited(*after) if isinstance(after, tuple) else RateLimited(after), b"ok"])

        def request(answers=answers):
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

        retrier = remote_retry._Retrier(RetryPolicy(retries=2, base_delay_s=0.1, max_delay_s=0.1), None)
        assert retrier.call("read", "x.mp4", request) == b"ok"
        assert waits.pop() == expected
    later = email.utils.formatdate(time.time() + 20, usegmt=True)  # an HTTP date
    assert 15 < retry_policy.retry_after_s(RateLimited(later)) <= 20


def test_a_filesystem_that_keeps_the_query_in_its_paths_names_no_credential(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """A filesystem whose paths keep a URL's query (``fakeremote://ds?a=1&token=...``, ``memory://``: their
    ``_strip_protocol`` keeps '?') named the token in the retries' warnings and the error they gave up with, in a
    missing file's error, a change's error, the location's ``repr``, fsspec's DEBUG lines and any module's (the
    clips' name each file read: 74 of an epoch's 98 DEBUG lines): 8 of 8 texts here. Each names it masked now, and the
    file's path after it as it is."""
    import traceback

    from lerobot_dali.file_stamps import FileStamps
    from lerobot_dali.remote_errors import changed_on_server

    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=lambda s: None))
    folder = "ds?a=1&token=SECRET"
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "f.bin").write_bytes(b"x" * 100)
    inner = FakeRemoteFileSystem(str(tmp_path), fault_every=1, faults=("503",))
    fs = RetryingFileSystem(inner, policy=RetryPolicy(retries=1))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RemoteFileError) as failed:
        fs.cat_file(f"{folder}/f.bin")  # (the traceback shows this line)
    inner.fault_every = 0
    with pytest.raises(MissingDataFileError) as missing:
        FileStamps(fs)[f"{folder}/absent.bin"]
    location = resolve_location("memory://bucket/ds?a=1&token=SECRET")
    location.meta_fs.pipe_file(location.meta_path("meta/info.json"), b"{}")
    logging.getLogger("lerobot_dali.clips").debug("Clip from %s", location.path("videos/f.mp4"))  # (any module's)
    said = [
        "".join(traceback.format_exception(failed.value)),
        str(missing.value),
        str(changed_on_server(f"{folder}/f.bin", "its size")),
        repr(location),
    ]
    logged = [logging.Formatter().format(r) for r in caplog.records]
    assert [text for text in said + logged if "SECRET" in text] == []
    assert "ds?a=1&token=***/f.bin" in said[0] and "token=***/absent.bin does not exist" in said[1]
    assert "token=***/f.bin changed" in said[2] and "root='/bucket/ds?a=1&token=***'" in said[3]
    assert [t for t in logged if "gave up" in t and "token=***/f.bin" in t]
    assert [t for t in logged if "token=***/meta/info.json" in t]  # (fsspec's memory filesystem's)
    assert "Clip from /bucket/ds?a=1&token=***/videos/f.mp4" in logged


@pytest.mark.parametrize("info", [None, b"{not json", b"[1, 2]"])
def test_a_dataset_under_a_query_kept_in_paths_that_is_none_names_no_credential(info: bytes | None) -> None:
    """A ``memory://...?token=`` root with no meta/info.json, or one that is not JSON or not an object: its error named
    the token in the info file's path (1 of each). Masked now, the file's path after it kept."""
    from lerobot_dali.dataset_reader import open_dataset

    root = f"memory://bucket/ds-{len(info or b'')}?a=1&token=SECRET"
    location = resolve_location(root)
    if info is not None:
        location.meta_fs.pipe_file(location.meta_path("meta/info.json"), info)
    with pytest.raises(DatasetError) as refused:
        open_dataset(root)
    assert "SECRET" not in str(refused.value) and "token=***/meta/info.json" in str(refused.value)


def test_an_epoch_over_a_query_kept_in_paths_names_no_credential_in_any_log_line_or_cache_file(
    make_ds, tmp_path: Path, monkeypatch, caplog, capfd
) -> None:
    """An epoch at DEBUG with two spawned workers and the prefetch cache over a filesystem that keeps the URL's query in
    its paths, the token holding a '/' (which a path alone cannot tell from the file's path after it). Measured
    before: 117 of its 124 log lines named a part of it (84 of the workers', whose loggers masked nothing but a few
    modules', 33 of the parent's, where the '/' left its tail), and 16 of the 44 cache files written (6 packet
    indexes, the row counts' entry, 9 prefetch labels); 0 of each now, the samples those of a local read."""
    from lerobot_dali.cache_dirs import CACHE_ENV
    from lerobot_dali.iterator import DALILeRobotIterator

    importable_in_workers(monkeypatch)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "caches"))
    head, tail = "S3CRhead", "T41Ltail"
    folder = f"ds?a=1&token={head}/{tail}"
    shutil.copytree(_dataset(make_ds, "vp9"), tmp_path / "remote" / folder)
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=3, episode_pool_size=2, device="cpu")
    local = _samples(DALILeRobotIterator(_dataset(make_ds, "vp9"), num_workers=0, **options))
    caplog.set_level(logging.DEBUG)  # (the workers log at the trainer's level: DEBUG too)
    capfd.readouterr()
    reader = open_dataset(f"fakeremote://{folder}", storage_options={"root": str(tmp_path / "remote")})
    it = DALILeRobotIterator(reader, num_workers=2, cache_dir=tmp_path / "prefetch", cache_gb=1.0, **options)
    remote = _samples(it)
    it.close()
    _assert_samples_equal(local, remote)
    workers = capfd.readouterr().err  # (the spawned workers' handler writes to the stderr they inherit)
    lines = [logging.Formatter().format(r) for r in caplog.records] + workers.splitlines()
    assert [line for line in lines if head in line or tail in line] == []
    assert "(worker pid" in workers and "token=***/videos/" in workers  # (the workers' lines, masked)
    files = [p for p in [*(tmp_path / "caches").rglob("*"), *(tmp_path / "prefetch").rglob("*")] if p.is_file()]
    named = [p for p in files if head in str(p) or tail in str(p) or head.encode() in p.read_bytes()]
    assert named + [p for p in files if tail.encode() in p.read_bytes()] == []
    kinds = {p.relative_to(tmp_path).parts[0 if "prefetch" in p.parts else 1] for p in files}
    assert {"packet_index", "row_counts", "prefetch"} <= kinds


@pytest.mark.parametrize("damage", ["missing video", "cut video", "damaged parquet"])
def test_errors_of_a_dataset_under_a_query_kept_in_paths_name_no_credential(
    make_ds, tmp_path: Path, monkeypatch, damage: str
) -> None:
    """A missing video, a cut one and a damaged data file of a dataset whose filesystem keeps the URL's query in its
    paths (the token holding a '/'): each error named the token in its message and ``repr`` (3 of 3). Masked now, as
    the error is made, the file it names kept."""
    from lerobot_dali.cache_dirs import CACHE_ENV
    from lerobot_dali.iterator import DALILeRobotIterator

    head, tail = "S3CRhead", "T41Ltail"
    folder = f"ds?a=1&token={head}/{tail}"
    root = tmp_path / "remote" / folder
    shutil.copytree(_dataset(make_ds, "vp9"), root)
    video = sorted(p for p in (root / "videos").rglob("*") if p.is_file())[0]
    if damage == "missing video":
        video.unlink()
    elif damage == "cut video":
        video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    else:
        data = sorted((root / "data").rglob("*.parquet"))[0]
        data.write_bytes(data.read_bytes()[:-12])
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "caches"))
    with pytest.raises(DatasetError) as failed:
        reader = open_dataset(f"fakeremote://{folder}", storage_options={"root": str(tmp_path / "remote")})
        it = DALILeRobotIterator(reader, batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu")
        try:
            _samples(it)
        finally:
            it.close()
    said = [str(failed.value), repr(failed.value), *map(str, failed.value.args)]
    assert [text for text in said if head in text or tail in text] == []
    assert "token=***" in said[0]
