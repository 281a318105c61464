"""RetryingFileSystem's retry loop, case by case: which errors it retries, how often, and what it raises at last.

Each request of :class:`_Scripted` (a fake remote over a local folder) raises the next error of its script, so a test
knows what each try met; waits are zero (:data:`FAST`), nothing sleeps.
"""

from __future__ import annotations

import logging
import pickle
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fsspec
import pytest

from lerobot_dali import io_stats, remote_retry, url_secrets
from lerobot_dali.errors import DatasetError, RemoteFileError
from lerobot_dali.remote_retry import RetryingFileSystem, _Retrier, fresh_instance
from lerobot_dali.retry_policy import RetryPolicy
from tests.fake_remote import FakeHTTPError, FakeRemoteFileSystem

FAST = RetryPolicy(retries=3, base_delay_s=0.0, max_delay_s=0.0)
DATA = bytes(range(256)) * 40


class _Scripted(FakeRemoteFileSystem):
    """A fake remote whose requests (reads of its files too) raise ``errors`` in turn (None: that one is answered),
    then answer; each counted by kind in ``requests``."""

    def __init__(self, root: str, *errors: Exception | None) -> None:
        super().__init__(root)
        self.errors = list(errors)

    def _request(self, kind: str, path: str) -> str | None:
        super()._request(kind, path)
        if self.errors and (error := self.errors.pop(0)) is not None:
            raise error
        return None


def _raising(error: Exception) -> Any:
    """A callable raising ``error``, whatever it is called with."""

    def raise_it(*args: Any, **kwargs: Any) -> None:
        raise error

    return raise_it


def _raised_from(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error


def _scripted(tmp_path: Path, *errors: Exception | None, **options: Any) -> tuple[_Scripted, RetryingFileSystem]:
    """A :class:`_Scripted` remote holding ``blob.bin`` (:data:`DATA`) and its RetryingFileSystem (``options``: its
    arguments, the policy :data:`FAST` unless given)."""
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Scripted(str(tmp_path), *errors)
    return fake, RetryingFileSystem(fake, **{"policy": FAST, **options})


def test_fsspecs_file_not_found_over_an_answer_neither_missing_nor_refused_raises_that_answer(tmp_path: Path) -> None:
    """fsspec's ``FileNotFoundError(url) from`` a 400 (no outage, no missing file, no refusal): the 400 itself is
    raised, at once, with its own cause, not a FileNotFoundError that sends users looking for a file that is there."""
    client = RuntimeError("x-amz-request-id 4442587FB7D0A2F9")
    bad = _raised_from(FakeHTTPError(400, "Bad Request"), client)
    fake, fs = _scripted(tmp_path, _raised_from(FileNotFoundError("blob.bin"), bad))
    with pytest.raises(FakeHTTPError) as raised:
        fs.info("blob.bin")
    assert raised.value is bad and raised.value.__cause__ is client
    assert fake.requests == {"info": 1}


def test_an_error_of_ours_given_up_on_inside_a_request_is_raised_as_it_is_not_retried_again(tmp_path: Path) -> None:
    """A request that failed past retries of its own (a RemoteFileError from a 503: transient by its cause) is not
    retried by the loop around it, which would multiply the tries and name the file twice over."""
    inner = _raised_from(RemoteFileError("blob.bin: read failed 6 time(s)", 503), FakeHTTPError(503, "Unavailable"))
    fake, fs = _scripted(tmp_path, inner)
    with pytest.raises(RemoteFileError) as raised:
        fs.cat_file("blob.bin")
    assert raised.value is inner and fake.requests == {"cat_file": 1}


def test_each_try_is_counted_and_the_bytes_of_the_one_answered(tmp_path: Path, monkeypatch) -> None:
    """io_stats (what the bench reads for remote runs) counts every try of a request, by its kind too, and the bytes
    of the answer; a listing's answer (no bytes) adds none."""
    monkeypatch.delenv(io_stats.STATS_ENV, raising=False)
    monkeypatch.setattr(io_stats, "_stats", None)  # (fresh counters, written nowhere)
    _, fs = _scripted(tmp_path, FakeHTTPError(503, "Unavailable"))
    assert fs.cat_file("blob.bin", start=10, end=110) == DATA[10:110]
    assert fs.ls("", detail=False) == ["blob.bin"]
    counted = io_stats._current().values
    assert {k: v for k, v in counted.items() if k != "fetch_s"} == {
        "requests": 3, "requests.cat_file": 2, "requests.ls": 1, "fetched_bytes": 100
    }  # fmt: skip


def _raised_while_handling(error: Exception, context: Exception) -> Exception:
    """``error`` as raised inside an ``except`` block of ``context`` (its implicit context, no cause)."""
    try:
        raise context
    except Exception:
        try:
            raise error  # (as a client raises it, without ``from``)
        except Exception as e:
            return e


def test_an_error_not_retried_passes_as_it_was_raised_its_context_kept(tmp_path: Path) -> None:
    """An error retrying cannot fix (here a missing file, raised while its client handled a KeyError) is raised as it
    came, neither retried nor re-raised ``from`` anything: the traceback still shows what the client was handling."""
    missing = _raised_while_handling(FileNotFoundError("blob.bin"), KeyError("etag"))
    fake, fs = _scripted(tmp_path, missing)
    with pytest.raises(FileNotFoundError) as raised:
        fs.info("blob.bin")
    assert raised.value is missing and fake.requests == {"info": 1}
    assert isinstance(missing.__context__, KeyError) and not missing.__suppress_context__ and missing.__cause__ is None


def test_a_fresh_client_is_asked_before_each_retry_from_the_second_on_and_said(tmp_path: Path, caplog) -> None:
    unavailable = [FakeHTTPError(503, "Unavailable") for _ in range(3)]
    asked: list[int] = []
    _, fs = _scripted(tmp_path, *unavailable, fresh_client=lambda: asked.append(1))
    with caplog.at_level(logging.INFO, logger="lerobot_dali.remote_retry"):
        assert fs.cat_file("blob.bin") == DATA
    said = [r.getMessage() for r in caplog.records if "fresh client" in r.getMessage()]
    assert said == [f"cat_file blob.bin: asking for a fresh client before retry {n}" for n in (2, 3)]
    assert asked == [1, 1]


def test_the_filesystem_a_fresh_client_gives_is_the_one_later_tries_read_through(tmp_path: Path) -> None:
    """From the second retry on, a filesystem the fresh-client hook gives replaces the one whose session failed (a
    closed aiohttp client): the third try reads through it, and the old one is asked no more."""
    unavailable = [FakeHTTPError(503, "Unavailable") for _ in range(2)]
    fresh = _Scripted(str(tmp_path))  # (over the folder _scripted writes blob.bin into)
    old, fs = _scripted(tmp_path, *unavailable, fresh_client=lambda: fresh)
    assert fs.cat_file("blob.bin") == DATA
    assert (dict(old.requests), dict(fresh.requests), fs.fs) == ({"cat_file": 2}, {"cat_file": 1}, fresh)


@pytest.mark.parametrize(
    ("failure", "kind", "said"),
    [
        (
            "The HTTP server doesn't appear to support range requests",
            DatasetError,
            "https://h/blob.bin: the server ignored an HTTP Range request (it sent the whole file)",
        ),
        ("I/O operation on closed file", ValueError, "I/O operation on closed file"),
    ],
)
def test_a_block_fetch_failing_as_a_server_ignoring_ranges_is_named_so_and_any_other_as_itself(
    failure: str, kind: type[Exception], said: str
) -> None:
    """fsspec's read-ahead fetch raises ValueError where the server ignores Range (naming neither the file nor a fix):
    raised naming both; any other ValueError is raised as it is, not taken for that."""

    class Cache:
        def fetcher(self, start: int, end: int) -> bytes:
            raise ValueError(failure)

    inner = SimpleNamespace(cache=Cache(), size=len(DATA))
    remote_retry._check_block_fetches(inner, "https://h/blob.bin")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}") as raised:
        inner.cache.fetcher(0, 10)
    assert type(raised.value) is kind


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (FakeHTTPError(401, "Unauthorized"), "refused it (HTTP 401)"),
        (FakeHTTPError(403, "Forbidden"), "refused it (HTTP 403)"),
        (PermissionError("Access Denied"), "refused it (HTTP 403)"),  # (s3fs's 403: no status of its own)
        (FakeHTTPError(503, "Unavailable"), "gave no answer"),
        (ConnectionResetError("reset"), "gave no answer"),
    ],
)
def test_a_stamp_asked_again_and_refused_is_said_refused_with_its_status_else_unanswered(
    tmp_path: Path, answer: Exception, said: str
) -> None:
    """What the server did where it was asked for a stamped file's stamp again and gave none: a refusal (401, 403, a
    filesystem's PermissionError, which carries no status: 403) is named with its status; anything else is no
    answer. It goes into the message of the read's 404 or 412."""
    _, fs = _scripted(tmp_path)
    fs._stamps_holding = lambda path: SimpleNamespace(change_now=_raising(answer))
    assert fs._change_now("blob.bin") == said


def test_a_stamped_files_404_asked_again_is_said_at_info_once_then_at_warning(caplog) -> None:
    """The server asked again after a stamped file's 404, still not giving it: the first ask again is routine (INFO),
    later ones trouble worth seeing (WARNING), as a failure's retries; the removal is raised once they are spent."""
    removed = DatasetError("x.mp4 changed on the server while it was read (removed now)")
    retrier = _Retrier(FAST, None, removed=lambda path: removed, removed_now=lambda path: (removed, False),
                       confirmable=lambda path: True)  # fmt: skip

    def read() -> bytes:
        raise FileNotFoundError("x.mp4")

    with caplog.at_level(logging.INFO, logger="lerobot_dali.remote_retry"), pytest.raises(DatasetError) as raised:
        retrier.call("read", "x.mp4", read)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    asked = [(level, message.rpartition("; ")[2]) for level, message in said if "asking again" in message]
    assert asked == [("INFO", "asking again (retry 1/3)"), ("WARNING", "asking again (retry 2/3)")]
    assert raised.value is removed and isinstance(removed.__cause__, FileNotFoundError)


def test_an_error_given_up_on_is_left_without_a_note_before_python_3_11(tmp_path: Path, monkeypatch) -> None:
    """Exceptions take notes (``add_note``) from Python 3.11 on: on 3.10 the last error passes on as it is, under the
    RemoteFileError that says how often it was tried."""
    monkeypatch.setattr(remote_retry, "sys", SimpleNamespace(version_info=(3, 10, 14, "final", 0)))
    last = FakeHTTPError(503, "Unavailable")
    _, fs = _scripted(tmp_path, *[FakeHTTPError(503, "Unavailable") for _ in range(3)], last)
    with pytest.raises(RemoteFileError, match=r"^blob\.bin: info failed 4 time\(s\), the last with FakeHTTPError"):
        fs.info("blob.bin")
    assert not hasattr(last, "__notes__")


@pytest.mark.parametrize(("start", "end"), [(5, 0), (-1, -5)])
def test_bounds_of_one_sign_crossing_at_the_files_first_or_last_byte_are_refused_before_any_request(
    tmp_path: Path, start: int, end: int
) -> None:
    """Bounds of one sign that cross (here ending at the file's first byte, or starting at its last of an unstamped
    file, whose size is not asked) raise ValueError naming them, with no request."""
    fake, fs = _scripted(tmp_path)
    with pytest.raises(ValueError, match=rf"^bytes \[{start}, {end}\) of blob\.bin asked: a range cannot start past"):
        fs.cat_file("blob.bin", start=start, end=end)
    assert fake.requests == {}


@pytest.mark.parametrize(("start", "end"), [(0, -1), (-1, len(DATA))])
def test_a_range_with_one_bound_at_the_files_last_byte_from_its_end_asks_its_size_once(
    tmp_path: Path, start: int, end: int
) -> None:
    """One bound from the file's start, the other from its end (here its last byte): the unstamped file's size is
    asked once (an ``info``), and the range read as one from its start."""
    fake, fs = _scripted(tmp_path)
    assert fs.cat_file("blob.bin", start=start, end=end) == DATA[start:end]
    assert fake.requests == {"info": 1, "cat_file": 1}
    with pytest.raises(ValueError, match=rf"^bytes \[{len(DATA) - 1}, 100\) of blob\.bin asked: a range cannot"):
        fs.cat_file("blob.bin", start=-1, end=100)


class _Handles(_Scripted):
    """A :class:`_Scripted` remote keeping each file it opened in ``opened``."""

    def __init__(self, root: str, *errors: Exception | None) -> None:
        super().__init__(root, *errors)
        self.opened: list[Any] = []

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self.opened.append(super()._open(path, mode, **kwargs))
        return self.opened[-1]


def test_a_retried_read_closes_the_file_it_failed_on_and_logs_a_close_that_raised(tmp_path: Path, caplog) -> None:
    """A read that failed is redone on a freshly opened file: the failed one is closed first (a pooled connection
    given back), and its close raising (a socket gone already) is logged with its traceback, not raised."""
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Handles(str(tmp_path), None, FakeHTTPError(503, "Unavailable"))  # (the open answered, its read not)
    with RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb") as f:
        first = fake.opened[0]
        close, gone = first.close, OSError("socket already closed")

        def failing_close() -> None:
            close()
            raise gone

        first.close = failing_close
        with caplog.at_level(logging.DEBUG, logger="lerobot_dali.remote_retry"):
            assert f.read(100) == DATA[:100]
        assert [handle.closed for handle in fake.opened] == [True, False]
    logged = [r for r in caplog.records if r.getMessage() == "closing failed handle of blob.bin raised"]
    assert [r.exc_info[1] for r in logged if r.exc_info] == [gone]


def test_a_seek_refused_by_a_file_other_than_fsspecs_http_stream_is_raised_as_it_is(tmp_path: Path) -> None:
    """Only fsspec's HTTPStreamFile refusing to seek means a server sending files only whole; another file's
    ValueError is its own, raised as it is, not retried."""
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Handles(str(tmp_path))
    refused = ValueError("seek of a closed file")
    with RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb") as f:
        fake.opened[0].seek = _raising(refused)
        f.seek(10)
        with pytest.raises(ValueError) as raised:
            f.read(5)
    assert raised.value is refused and len(fake.opened) == 1


def test_a_read_of_one_byte_returns_one_byte(tmp_path: Path) -> None:
    _, fs = _scripted(tmp_path)
    with fs.open("blob.bin", "rb") as f:
        f.seek(7)
        assert [f.read(1), f.read(1), f.tell()] == [DATA[7:8], DATA[8:9], 9]


def test_a_read_of_no_byte_asks_nothing_and_one_of_the_rest_asks_for_exactly_the_rest(tmp_path: Path) -> None:
    """``read(0)`` is b'' with no request; ``read()`` of a file of known size asks for the bytes left as that many
    (a block fetch, tried once), not for "all"."""
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Handles(str(tmp_path))
    asked: list[int] = []
    with RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb") as f:
        read = fake.opened[0].read

        def counted_read(size: int = -1) -> bytes:
            asked.append(size)
            return read(size)

        fake.opened[0].read = counted_read
        f.seek(10)
        assert [f.read(0), f.read()] == [b"", DATA[10:]]
    assert asked == [len(DATA) - 10]


def test_read_of_none_and_readall_read_the_rest_and_a_seek_from_the_end_asks_no_size_known(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Handles(str(tmp_path))
    f = RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb")
    f.seek(10)
    assert f.read(None) == DATA[10:]
    assert f.seek(-20, 2) == len(DATA) - 20 and f.readall() == DATA[-20:]
    assert fake.requests == {"open": 1, "read": 2}  # (the size known at open: no info)
    f.close()
    assert f.closed and fake.opened[0].closed


class _Sizeless(_Handles):
    """A :class:`_Handles` remote whose files come without a size, and whose ``info`` gives one where ``sized``."""

    sized = True

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        handle.size = None
        return handle

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return {**super().info(path, **kwargs), **({} if self.sized else {"size": None})}


def test_a_seek_from_the_end_of_a_file_opened_without_a_size_asks_it_or_names_the_server(tmp_path: Path) -> None:
    """A file opened without a size (fsspec's streaming file) asks it for a seek from its end; a server that gives
    none is named, with the fix."""
    (tmp_path / "blob.bin").write_bytes(DATA)
    fake = _Sizeless(str(tmp_path))
    with RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb") as f:
        assert f.size is None and f.seek(-5, 2) == len(DATA) - 5 and f.read() == DATA[-5:]
    fake.sized = False
    whole = r"^blob\.bin: the server sends this file only whole \(it answered no Content-Length\)"
    with RetryingFileSystem(fake, policy=FAST).open("blob.bin", "rb") as f, pytest.raises(DatasetError, match=whole):
        f.seek(-5, 2)


def test_a_fresh_client_is_a_new_instance_of_the_filesystems_class_and_arguments_not_fsspecs_cached_one() -> None:
    """The retries' refresh of a closed or poisoned client: fsspec hands back its cached instance for the same
    arguments, which is the broken one."""
    fs = fsspec.filesystem("http", headers={"X-Test": "1"})
    fresh = fresh_instance(fs)
    assert fresh is not fs and type(fresh) is type(fs) and fresh.storage_options == fs.storage_options


_TEN = bytes(range(10))


@pytest.mark.parametrize(
    ("start", "end"),
    [(None, None), (0, 3), (3, 0), (2, 5), (-3, None), (None, -2), (-3, -1), (-100, 3), (5, 100), (8, 4), (12, None)],
)
def test_a_hub_files_bytes_are_those_of_a_slice_with_the_same_bounds(start: int | None, end: int | None) -> None:
    """The Hub's read of a range, asked once (HfFileSystem has no ``cat_file`` of its own): bounds from the file's end,
    past it, or crossed, each give what ``data[start:end]`` gives."""
    memory = fsspec.filesystem("memory", skip_instance_cache=True)
    memory.pipe("/ten.bin", _TEN)
    assert RetryingFileSystem(memory)._hub_cat_file("/ten.bin", start, end, {}) == _TEN[start:end]


class _CutShortFile(fsspec.spec.AbstractBufferedFile):
    """A remote file whose every block fetch answers one byte short (a response cut short)."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        return _TEN[start : end - 1]


class _CutShortFileSystem(fsspec.AbstractFileSystem):
    protocol = "cutshort"

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return {"name": path, "size": len(_TEN), "type": "file"}

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return _CutShortFile(self, path, mode, size=len(_TEN), **kwargs)


def test_a_hub_files_range_answered_short_is_a_transient_failure_not_bytes_handed_out() -> None:
    """A block cut short shifted every byte after it where fsspec's cache placed it; the Hub's read of a range checks
    each block it fetches, as other remote reads do."""
    with pytest.raises(ConnectionError, match=re.escape("/f: asked for bytes [2, 6) and received 3 bytes")):
        RetryingFileSystem(_CutShortFileSystem(skip_instance_cache=True))._hub_cat_file("/f", 2, 6, {})


def test_what_is_no_fsspec_filesystem_is_refused_naming_its_type() -> None:
    """A path or another library's client, wrapped by mistake: without the check, an AttributeError ("'str' object
    has no attribute 'protocol'") said neither what was wrong nor what to pass."""
    with pytest.raises(TypeError, match=r"^RetryingFileSystem wraps an fsspec filesystem, got str$"):
        RetryingFileSystem("s3://bucket/ds")  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_credential_known")
def test_an_http_filesystems_credential_in_its_params_is_masked_where_it_is_wrapped_and_where_it_is_unpickled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An http(s) URL's query is sent as the filesystem's ``params``, named in fsspec's and aiohttp's DEBUG records
    and tracebacks: the wrap tells this process its credentials, and again in each worker, where it is made anew from
    its arguments. Parameters that are no credential are not masked."""
    http = fsspec.filesystem("http", params=[("token", "S3CR"), ("v", "1")], skip_instance_cache=True)
    wrapped = RetryingFileSystem(http)
    assert url_secrets._known == ("S3CR",)
    monkeypatch.setattr(url_secrets, "_known", ())  # (a worker's process)
    pickle.loads(pickle.dumps(wrapped))
    assert url_secrets._known == ("S3CR",)
