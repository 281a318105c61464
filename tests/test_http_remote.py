"""The loader over real HTTP: fsspec's HTTPFileSystem (aiohttp) against ``tests.http_server`` on 127.0.0.1.

Parity with the local folder (same rows; same batches in the same shuffled order, no sample lost or
duplicated) without faults, with 503 / 429 / dropped connections on schedule, in-process and with spawned
workers; the server's log checks that video bytes travel as range requests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fsspec
import numpy as np
import pytest

from lerobot_dali.cli import main
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DatasetError, EpisodeMetadataError, MissingDataFileError, RemoteFileError
from lerobot_dali.remote_errors import REFUSED_HINT, is_transient, status_of
from lerobot_dali.remote_retry import RetryingFileSystem
from lerobot_dali.retry_policy import RETRIES_ENV, RetryPolicy
from tests.http_server import FolderServer, RequestRecord, parse_range, serve_folder
from tests.test_iterator import DELTAS, LENGTHS, _dataset, _samples, assert_frames_equal_an_independent_decode
from tests.test_remote import _assert_samples_equal, importable_in_workers, use_fast_retries

aiohttp = pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")

#: The Range of the GET that asks a stamped file's size and version again where its server's HEAD gives no size
#: (``FileStamps.change_now``): an ask, sent without If-Match, not a read.
_STAMP_ASKED = "bytes=0-0"
OPTIONS = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=3, episode_pool_size=2, device="cpu",
               drop_last=False)  # fmt: skip
FAULTS = ("503", "429", "drop")


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """Backoff waits of the library's default policy, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append))
    return waits


@pytest.fixture
def root(make_ds) -> Path:
    return _dataset(make_ds, "vp9")


@pytest.fixture
def server(root: Path) -> Iterator[FolderServer]:
    """The dataset's parent folder on an ephemeral port; the dataset is at ``server.url + "/dataset"``."""
    with serve_folder(root.parent) as running:
        yield running


@pytest.fixture(scope="module")
def local_epoch(make_ds) -> list[dict]:
    """One shuffled epoch over the local folder, in-process: the reference every remote run must equal."""
    from lerobot_dali.iterator import DALILeRobotIterator

    return _samples(DALILeRobotIterator(_dataset(make_ds, "vp9"), num_workers=0, **OPTIONS))


def _url(server: FolderServer, root: Path) -> str:
    return f"{server.url}/{root.name}"


def _get(server: FolderServer, method: str, path: str, headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


# -- the server itself -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 10)),
        ("bytes=10-", (10, 100)),
        ("bytes=90-500", (90, 100)),
        ("bytes=-30", (70, 100)),
        ("bytes=-300", (0, 100)),
        ("bytes=100-", "unsatisfiable"),
        ("bytes=-0", "unsatisfiable"),
        ("bytes=5-2", None),
        ("bytes=0-1,5-9", None),
        ("items=0-9", None),
    ],
)
def test_parse_range(header: str | None, expected) -> None:
    assert parse_range(header, 100) == expected


def test_server_ranges_head_missing_and_listing(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a b.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        status, headers, body = _get(server, "GET", "/sub/a%20b.bin", {"Range": "bytes=100-199"})
        assert (status, body, headers["Content-Range"]) == (206, data[100:200], "bytes 100-199/100000")
        assert headers["Content-Length"] == "100" and headers["Accept-Ranges"] == "bytes"
        assert headers["ETag"].startswith('"') and headers["Last-Modified"].endswith("GMT")
        assert _get(server, "GET", "/sub/a%20b.bin", {"Range": "bytes=-10"})[2] == data[-10:]
        assert _get(server, "GET", "/sub/a%20b.bin", {"Range": "bytes=99990-"})[2] == data[-10:]
        status, headers, body = _get(server, "GET", "/sub/a%20b.bin", {"Range": "bytes=100000-"})
        assert status == 416 and headers["Content-Range"] == "bytes */100000"
        status, headers, body = _get(server, "HEAD", "/sub/a%20b.bin")
        assert (status, headers["Content-Length"], body) == (200, "100000", b"")
        assert _get(server, "GET", "/sub/a%20b.bin")[2] == data
        assert _get(server, "GET", "/sub/absent.bin")[0] == 404
        assert _get(server, "GET", "/../etc/passwd")[0] == 404
        assert _get(server, "PUT", "/sub/a%20b.bin")[0] == 405
        status, _, page = _get(server, "GET", "/sub/")
        assert status == 200 and b'href="a%20b.bin"' in page
        assert server.counts == {("GET", "range"): 4, ("HEAD", "full"): 1, ("GET", "full"): 1, ("GET", "missing"): 2,
                                 ("PUT", "rejected"): 1, ("GET", "listing"): 1}  # fmt: skip
        assert server.sent_bytes == 100 + 10 + 10 + len(data) + len(page)
    with serve_folder(tmp_path, listings=False) as server:
        assert _get(server, "GET", "/sub/")[0] == 404


def test_server_fault_schedule(tmp_path: Path) -> None:
    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path, fault_every=2, faults=FAULTS) as server:
        got = []
        for _ in range(6):
            try:
                status, _, body = _get(server, "GET", "/f.bin")
                got.append((status, len(body)))
            except http.client.IncompleteRead as e:
                got.append(("short", len(e.partial)))
        full = len(data)
        assert got == [(200, full), (503, 19), (200, full), (429, 19), (200, full), ("short", full // 2)]
        assert server.faults_injected == {"503": 1, "429": 1, "drop": 1}
        server.set_faults(0)
        assert _get(server, "GET", "/f.bin")[0] == 200


# -- retry classification of real aiohttp errors ---------------------------------------------------------


def _response_error(status: int) -> Exception:
    return aiohttp.ClientResponseError(None, (), status=status, message="injected")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_response_error(503), True),
        (_response_error(429), True),
        (_response_error(404), False),
        (_response_error(403), False),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("Response payload is not completed"), True),
        (aiohttp.ClientConnectionError("Connection lost"), True),
    ],
)
def test_aiohttp_errors_are_classified(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


def test_exists_is_a_head_and_a_503_is_retried_not_reported_missing(root: Path) -> None:
    """fsspec's HTTP ``exists`` GETs the whole file and answers False on a 503; through the wrapper it is
    ``info`` (a HEAD; fsspec falls back to a GET when the HEAD fails), and a 503 is retried."""
    import fsspec

    with serve_folder(root.parent, fault_every=3, faults=("503",)) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=3, base_delay_s=0.0))
        video = f"{_url(server, root)}/videos/observation.images.cam0/chunk-000/file-000.mp4"
        assert [fs.exists(video) for _ in range(3)] == [True, True, True]  # the 3rd HEAD fails, its GET answers
        # HEAD 404, GET 503 -> FileNotFoundError from the 503: retried; HEAD 404, GET 404 -> absent
        assert fs.exists(f"{_url(server, root)}/videos/absent.mp4") is False
        assert [(r.method, r.status) for r in server.records] == [
            ("HEAD", 200), ("HEAD", 200), ("HEAD", 503), ("GET", 200),
            ("HEAD", 404), ("GET", 503), ("HEAD", 404), ("GET", 404),
        ]  # fmt: skip


def test_isdir_tells_a_served_folder_and_retries_its_listing(tmp_path: Path, slept: list[float]) -> None:
    """fsspec's HTTP ``info`` calls every URL a file: ``isdir`` over it answered False for a served folder, where the
    wrapped filesystem (its index page) answers True. Its listing's 503 is retried, not answered False."""
    import fsspec

    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_bytes(b"{}")
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"))
        folder, file, absent = (f"{server.url}/{name}" for name in ("meta/", "meta/info.json", "nope/"))
        assert [fs.isdir(folder), fs.isdir(file), fs.isdir(absent)] == [True, False, False]
        assert [fs.isfile(file), fs.isfile(absent)] == [True, False]
        server.fail_next("503", "503")
        assert fs.isdir(folder) is True and server.faults_injected == {"503": 2} and len(slept) == 2


def test_a_retrying_file_reads_seeks_and_decodes_text_as_a_local_file(tmp_path: Path) -> None:
    """The file API parquet, PyAV and ``open(..., "r")`` use (``seek`` from the end and the current position,
    ``readinto``, text mode) gives a local file's bytes; over a server that sends no ``Content-Length`` (fsspec's
    streaming file), the whole file is still read, and a seek from its end, which needs its size, names
    the file and the fix instead of fsspec's ``TypeError``."""
    import io

    import fsspec

    data = "".join(f"line {i}: é\n" for i in range(500)).encode()
    (tmp_path / "a.txt").write_bytes(data)
    local = io.BytesIO(data)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=0))
        url = f"{server.url}/a.txt"
        with fs.open(url, "rb") as f:
            for offset, whence, n in [(-40, io.SEEK_END, 15), (-30, io.SEEK_CUR, 8), (100, io.SEEK_SET, 5)]:
                assert f.seek(offset, whence) == local.seek(offset, whence) and f.read(n) == local.read(n)
            buffer, expected = bytearray(64), bytearray(64)
            assert f.readinto(buffer) == local.readinto(expected) == 64 and buffer == expected
            with pytest.raises(ValueError, match="invalid whence 3; use io.SEEK_SET"):
                f.seek(0, 3)
            with pytest.raises(ValueError, match=f"negative seek position -1 in {url}"):
                f.seek(-1 - f.tell(), io.SEEK_CUR)
        with fs.open(url, "r", encoding="utf-8") as text:
            assert text.readlines() == data.decode().splitlines(keepends=True)
        server.content_length = frozenset()  # (fsspec's streaming file: no size)
        with fs.open(url, "rb") as f:
            assert f.size is None and f.read() == data and f.read() == b""
        with fs.open(url, "rb") as f, pytest.raises(DatasetError, match=f"{url}: .*only whole .*no Content-Length"):
            f.seek(-10, io.SEEK_END)


# -- the reader and the iterator over HTTP -----------------------------------------------------------------


def _video_gets(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.method == "GET" and "/videos/" in r.path and r.kind in ("range", "full")]


@pytest.mark.parametrize("fault_every", [0, 4])
def test_open_dataset_over_http_reads_rows_equal_to_local(root: Path, server, monkeypatch, slept, fault_every) -> None:
    monkeypatch.setenv(RETRIES_ENV, "6")
    server.set_faults(fault_every, FAULTS)
    remote = open_dataset(_url(server, root))
    assert isinstance(remote.location.fs, RetryingFileSystem) and not remote.location.is_local
    local = open_dataset(root)
    assert (remote.num_episodes, remote.num_frames, remote.camera_keys) == (
        local.num_episodes, local.num_frames, local.camera_keys,
    )  # fmt: skip
    for pos in range(len(LENGTHS)):
        a, b = local.read_episode(pos), remote.read_episode(pos)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        assert remote.video(pos, "observation.images.cam1").path.startswith(server.url)
    assert server.counts[("GET", "listing")] >= 1  # meta/episodes/ found by glob over the index page
    if fault_every:
        assert set(server.faults_injected) == set(FAULTS) and slept  # retried, waits recorded, not slept
    else:
        assert not server.faults_injected and not slept


def test_v3_over_http_without_directory_listings_names_the_glob(root: Path) -> None:
    with (
        serve_folder(root.parent, listings=False) as server,
        pytest.raises(EpisodeMetadataError, match="meta/episodes"),
    ):
        open_dataset(_url(server, root))


def test_a_server_without_directory_listings_is_named(root: Path, make_ds, tmp_path: Path, capsys) -> None:
    """A v3.0 dataset's episode files, and every video reencode copies, are found by listing folders: on a server
    that lists none the command said "no episode metadata found" / "no video file found" of files that are there."""
    v21 = make_ds(codec="vp9", version="v2.1", episodes=1, frames_per_episode=2)
    for dataset, argv, said in (
        (root, ["info"], "EpisodeMetadataError: no episode metadata found"),
        (v21, ["reencode", "--codec", "h264"], "no video file of ['observation.images.cam0'] found under videos/"),
    ):
        with serve_folder(dataset.parent, listings=False) as server:
            out = [str(tmp_path / "copy")] if argv[0] == "reencode" else []
            assert main([argv[0], _url(server, dataset), *out, *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
        assert "over HTTP files are found through the server's directory listings" in err, err
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize(
    ("links", "prefix"),
    [(("./",), ""), (("./file-000.parquet",), ""), (("../x/",), ""), ((), "./")],
    ids=["self", "self_file", "sibling", "caddy"],
)
def test_index_pages_linking_to_themselves_or_out_of_their_folder_list_each_file_once(
    root: Path, server, links: tuple[str, ...], prefix: str
) -> None:
    """A v3.0 open over a server whose index pages link './' (to the page itself), a file again as './file', or
    '../x/' (out of the folder), or write every link './name' (Caddy's): find_files walked './' 8 levels deep (45
    listings of meta/episodes/ and 36 GETs of its 1 file; 'episode_index values are not unique'), read the './file'
    copy as a second file (the same error), and listed '../x/' as a folder of meta/episodes/ (404: 'no episode
    metadata found'). Each file once now: 2 listings, 1 GET, the local dataset's episodes; names without './'."""
    from lerobot_dali.file_stamps import find_files

    server.index_links, server.link_prefix = links, prefix
    reader = open_dataset(_url(server, root))
    local = open_dataset(root)
    assert reader.episodes.episode_index.tolist() == local.episodes.episode_index.tolist()
    assert reader.episodes.length.tolist() == local.episodes.length.tolist()
    episodes = Counter((r.method, r.kind) for r in server.records if "/meta/episodes" in r.path)
    assert dict(episodes) == {("GET", "listing"): 2, ("GET", "full"): 1}
    if links != ("./file-000.parquet",):  # (that link names a file in every folder, where it is missing too)
        files = find_files(reader.location.meta_fs, f"{_url(server, root)}/meta")
        meta = (p.relative_to(root).as_posix() for p in (root / "meta").rglob("*") if p.is_file())
        assert sorted(files) == sorted(f"{_url(server, root)}/{name}" for name in meta)


def test_a_dataset_url_typed_with_spaces_or_accents_finds_files_a_server_links_by_absolute_path(
    root: Path, tmp_path: Path
) -> None:
    """A v3.0 dataset in a folder named 'my ds ä', its URL typed as named, on a server whose index pages link by
    absolute path, percent-encoded ('/my%20ds%20%C3%A4/meta/episodes/chunk-000/'): fsspec keeps only links under the
    folder's URL as spelled, so none was found ('no episode metadata found', 1 of 1; typed percent-encoded it opened).
    The root is spelled as aiohttp sends it now: the local dataset's episodes, whichever way it is typed."""
    shutil.copytree(root, tmp_path / "my ds ä")
    local = open_dataset(root)
    with serve_folder(tmp_path) as server:
        server.link_prefix = "absolute"
        for typed in ("my ds ä", "my%20ds%20%C3%A4"):
            reader = open_dataset(f"{server.url}/{typed}")
            assert reader.episodes.episode_index.tolist() == local.episodes.episode_index.tolist(), typed
            assert reader.num_frames == local.num_frames
            assert reader.stamps is not None and reader.stamps[reader.data_path(0)].size > 0


def test_a_plain_ascii_dataset_url_keeps_its_spelling(root: Path, tmp_path: Path) -> None:
    """A root needing no percent-encoding is used as typed: yarl's spelling of the whole URL also lowercased its host,
    dropped a default port, decoded '%7E' and took '/./' out, so each file's URL, which keys the packet-index cache
    on disk (and names files in errors), changed from the one used before (4 of 4 such spellings), and indexes
    stored then were not found (each remote video indexed again). Encoded as needed, it is the typed one."""
    shutil.copytree(root, tmp_path / "a~b")
    local = open_dataset(root)
    with serve_folder(tmp_path) as server:
        host = f"LOCALHOST:{server.port}"
        for typed in (f"http://{host}/a~b", f"{server.url}/a%7Eb", f"{server.url}/./a~b", f"http://{host}/a%7eb"):
            reader = open_dataset(typed)
            assert reader.location.root == typed
            assert reader.data_path(0) == f"{typed}/{reader.info.data_path.format(chunk_index=0, file_index=0)}"
            assert reader.episodes.episode_index.tolist() == local.episodes.episode_index.tolist(), typed


def test_v3_episode_metadata_is_read_from_chunk_folders_alone(root: Path, copy_ds) -> None:
    """``meta/episodes/chunk-*/file-*.parquet`` is read, not a copy nested deeper: the v3.0 episode listing walked all
    of meta/episodes/ and matched its files from the right, so a copy kept in
    meta/episodes/chunk-000/old/meta/episodes/chunk-000/ was read too ('episode_index values are not unique', locally
    and over HTTP), and over HTTP every folder below was listed (9 listings with that copy and an a/b/c folder); the
    chunk folders alone now (2 listings), the dataset's own episodes."""
    local = open_dataset(root)
    dataset = copy_ds(root)
    episodes = dataset / "meta" / "episodes" / "chunk-000"
    nested = episodes / "old" / "meta" / "episodes" / "chunk-000"
    nested.mkdir(parents=True)
    for file in episodes.glob("file-*.parquet"):
        shutil.copy(file, nested / file.name)
    (episodes / "a" / "b" / "c").mkdir(parents=True)
    (episodes / "a" / "b" / "c" / "notes.txt").write_text("kept beside the metadata")
    with serve_folder(dataset.parent) as server:
        for reader in (open_dataset(dataset), open_dataset(_url(server, dataset))):
            assert reader.episodes.episode_index.tolist() == local.episodes.episode_index.tolist()
            assert reader.episodes.length.tolist() == local.episodes.length.tolist()
        listed = [r.path for r in server.records if r.kind == "listing" and "/meta/episodes" in r.path]
    assert sorted(listed) == [f"/{dataset.name}/meta/episodes", f"/{dataset.name}/meta/episodes/chunk-000"]


@pytest.mark.parametrize("fault_every", [0, 5])
def test_iterator_over_http_equals_local(root: Path, server, local_epoch, monkeypatch, tmp_path, fault_every) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    use_fast_retries(monkeypatch)
    server.set_faults(fault_every, FAULTS)
    it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_dir=tmp_path / "cache", **OPTIONS)
    remote = _samples(it)
    it.close()
    indices = [int(s["index"]) for s in remote]
    assert indices == [int(s["index"]) for s in local_epoch]
    assert sorted(indices) == list(range(sum(LENGTHS))) and indices != sorted(indices)  # each once, shuffled
    _assert_samples_equal(local_epoch, remote)
    _assert_video_bytes_ranged(server, root)
    if fault_every:
        assert set(server.faults_injected) == set(FAULTS)


def test_a_dataset_read_with_the_options_headers_reads_its_videos(root: Path, server, local_epoch, tmp_path) -> None:
    """A video opened with no known size (HTTP listings give none) made fsspec ask for it with the options' headers
    and If-Match's both: "Video file ... does not exist" for every dataset opened with storage_options headers."""
    from lerobot_dali.iterator import DALILeRobotIterator

    server.required_headers = {"Authorization": "Bearer t"}
    reader = open_dataset(_url(server, root), storage_options={"headers": {"Authorization": "Bearer t"}})
    it = DALILeRobotIterator(reader, num_workers=0, cache_dir=tmp_path / "cache", **OPTIONS)
    remote = _samples(it)
    it.close()
    _assert_samples_equal(local_epoch, remote)
    assert server.counts[("GET", "unauthorized")] == 0 and server.counts[("GET", "range")] > 0
    assert all(r.if_match is not None for r in _video_gets(server.records) if r.kind == "range")


def test_a_prefetcher_whose_close_was_interrupted_is_closed_before_a_slot_is_taken_again(
    root: Path, server, local_epoch, monkeypatch, tmp_path
) -> None:
    """A Ctrl-C in close() as it closed the prefetcher left it set (the next close() finishes it); iterating again
    (cb4f86c) then took a slot over it: the old prefetcher was dropped unclosed, its thread running and its slot
    (rank-0) held, so the new one took rank-0.1 and nothing closed the old one. It is closed first now: the slot
    taken again is the one given up, and every prefetcher the iterator started is closed once it is."""
    from lerobot_dali.iterator import DALILeRobotIterator
    from lerobot_dali.prefetch import Prefetcher

    real_close, closed, interrupt = Prefetcher.close, [], [True]

    def close(prefetcher: Prefetcher) -> None:
        if interrupt and interrupt.pop():
            raise KeyboardInterrupt  # (as it began)
        real_close(prefetcher)
        closed.append(prefetcher)

    monkeypatch.setattr(Prefetcher, "close", close)
    cache = tmp_path / "cache"
    it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_dir=cache, cache_gb=1.0, **OPTIONS)
    first, got = it.prefetcher, []
    assert first is not None and first.cache.directory == cache / "rank-0"
    batches = iter(it)
    got += [{k: v[i] for k, v in b.items()} for b in (next(batches), next(batches)) for i in range(len(b["index"]))]
    with pytest.raises(KeyboardInterrupt):
        it.close()
    for batch in it:
        got += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
    second = it.prefetcher
    it.close()
    _assert_samples_equal(local_epoch, got)
    assert second is not None and second is not first and second.cache.directory == cache / "rank-0"
    assert closed == [first, second]


def test_an_iterator_that_found_every_cache_slot_busy_takes_one_freed_at_its_next_pass(
    root: Path, server, local_epoch, tmp_path
) -> None:
    """An iterator built while every prefetch cache slot of its cache_dir was held by other runs read every range
    remotely to its end: no slot was asked for again, a pass built after one was freed (here after close() and
    iterating on) included (prefetcher None, 0 of 64 slots taken). The next pass that builds its pipeline asks again
    now, as one after close() does: it takes the freed slot, and reads the rest of the epoch equal to a local read."""
    from lerobot_dali.iterator import DALILeRobotIterator
    from lerobot_dali.range_cache import RangeCache

    cache = tmp_path / "cache"
    slots = [cache / ("rank-0" if n == 0 else f"rank-0.{n}") for n in range(64)]
    held = [RangeCache(slot, max_bytes=1000) for slot in slots]  # (other runs')
    it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_dir=cache, cache_gb=1.0, **OPTIONS)
    assert it.prefetcher is None
    batches, got = iter(it), []
    got += [{k: v[i] for k, v in b.items()} for b in (next(batches), next(batches)) for i in range(len(b["index"]))]
    held.pop(5).close()  # (another run ends)
    it.close()
    for batch in it:
        got += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
    taken = it.prefetcher
    it.close()
    for other in held:
        other.close()
    _assert_samples_equal(local_epoch, got)
    assert taken is not None and taken.cache.directory == slots[5]


def _assert_video_bytes_ranged(server: FolderServer, root: Path) -> None:
    """Video bytes came as 206 ranges; a full GET only follows a failed HEAD (fsspec's ``info`` falls back
    to GET), never to read data."""
    gets = _video_gets(server.records)
    assert gets and all(r.status == 206 for r in gets if r.kind == "range")
    full = [r for r in gets if r.kind == "full"]
    failed_heads = Counter(r.path for r in server.records if r.method == "HEAD" and r.kind == "fault")
    assert len(full) <= sum(failed_heads.values()), full
    assert all(failed_heads[r.path] for r in full)
    sizes = {r.path: r.file_size for r in gets}
    real = {path: os.path.getsize(root.parent / path.lstrip("/")) for path in sizes}
    assert sizes == real


@pytest.mark.parametrize("cache_gb", [0.0, 1.0], ids=["workers_read_remote", "prefetch_cache"])
def test_iterator_over_http_with_spawned_workers_and_faults(
    root: Path, server, local_epoch, monkeypatch, tmp_path, cache_gb: float
) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    use_fast_retries(monkeypatch)
    importable_in_workers(monkeypatch)
    it = DALILeRobotIterator(_url(server, root), num_workers=2, cache_dir=tmp_path / "cache", cache_gb=cache_gb,
                             **OPTIONS)  # fmt: skip
    server.reset_stats()
    server.set_faults(6, FAULTS)  # opening is covered above: faults from the first batch on
    remote = _samples(it)
    it.close()
    indices = [int(s["index"]) for s in remote]
    assert indices == [int(s["index"]) for s in local_epoch] and sorted(indices) == list(range(sum(LENGTHS)))
    _assert_samples_equal(local_epoch, remote)
    assert set(server.faults_injected) == set(FAULTS)
    assert any(r.kind == "range" and "/videos/" in r.path for r in server.records)
    _assert_video_bytes_ranged(server, root)


@pytest.mark.parametrize("exiting", [False, True], ids=["iterated_again", "iterated_again_at_exit"])
def test_a_closed_iterator_iterated_again_reads_through_no_slot_another_run_took(
    root: Path, server, local_epoch, monkeypatch, tmp_path, exiting: bool
) -> None:
    """close() gives the prefetch cache's slot up for the next run; iterating again carried on with no prefetcher,
    its reads going through that folder for the rest of the run: all remote but what it held (80 of 80 video ranges of
    a 144-sample epoch read remotely), and from another run's entries once that run took the slot (36 files opened in
    it here). It takes a slot again, as a new iterator does (the other run's taken: the next one); once the exit
    handler closed everything, it reads remotely, through no cache folder (no prefetcher thread left at exit)."""
    import lerobot_dali.cached_filesystem as cached_filesystem
    from lerobot_dali.iterator import DALILeRobotIterator

    cache = tmp_path / "cache"
    reading: list[str] = []  # the run whose batch is being read
    touched: list[tuple[str, Path]] = []  # (run, file or folder of the cache its reads opened or listed)
    real_open, real_list = open, cached_filesystem.list_entries

    def recorded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        touched.append((reading[-1], Path(file)))
        return real_open(file, *args, **kwargs)

    def recorded_list(folder: Path) -> Any:
        touched.append((reading[-1], folder))
        return real_list(folder)

    monkeypatch.setattr(cached_filesystem, "open", recorded_open, raising=False)
    monkeypatch.setattr(cached_filesystem, "list_entries", recorded_list)
    monkeypatch.setattr("lerobot_dali.iterator.exiting", lambda: exiting)
    a = DALILeRobotIterator(_url(server, root), num_workers=0, cache_dir=cache, cache_gb=1.0, **OPTIONS)
    passes, got = {"a": iter(a)}, {"a": [], "b": []}

    def read_batch(run: str) -> bool:
        reading.append(run)
        batch = next(passes[run], None)
        if batch is not None:
            got[run] += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
        return batch is not None

    assert read_batch("a") and read_batch("a")
    a.close()
    b = DALILeRobotIterator(_url(server, root), num_workers=0, cache_dir=cache, cache_gb=1.0, **OPTIONS)
    assert b.prefetcher is not None and b.prefetcher.cache.directory == cache / "rank-0"  # the slot A gave up
    touched.clear()
    passes.update(a=iter(a), b=iter(b))
    running = ["a", "b"]  # batch by batch, in turn
    while running:
        running = [run for run in running if read_batch(run)]
    own = a.prefetcher.cache.directory if a.prefetcher is not None else None
    a.close()
    b.close()
    _assert_samples_equal(local_epoch, got["a"])  # (the first 8 before the close, the rest after)
    _assert_samples_equal(local_epoch, got["b"])
    by_a = [path for run, path in touched if run == "a"]
    assert not [path for path in by_a if path.is_relative_to(cache / "rank-0")]
    if exiting:
        assert own is None and by_a == []
    else:
        assert own == cache / "rank-0.1" and by_a and all(path.is_relative_to(own) for path in by_a)


def test_short_range_answers_are_retried_not_misplaced(tmp_path: Path, monkeypatch) -> None:
    """fsspec's read-ahead cache placed a response cut short where the whole one would have gone, shifting the
    bytes after it (a packet index built so stored wrong keyframe flags for good); a short block is now retried."""
    import fsspec

    data = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=lambda s: None))
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=5, base_delay_s=0.0))
        server.set_faults(3, ("short",))
        reads = [(2000, 100), (1000, 800), (150_000, 5000), (140_000, 20_000)]  # a block, then one just before it
        with fs.open(f"{server.url}/f.bin", "rb") as handle:
            got = []
            for offset, length in reads:  # the cache prepends a fetch that ends where its block starts
                handle.seek(offset)
                got.append(handle.read(length))
        assert server.faults_injected["short"] > 0
    assert [g == data[o : o + n] for g, (o, n) in zip(got, reads, strict=True)] == [True] * len(reads)


def test_a_ranged_cat_file_answered_short_is_retried_and_one_answered_whole_is_named(tmp_path: Path, slept) -> None:
    """The prefetch cache fetches its ranges with ``cat_file``, which took any answer: a range answered short (206 for
    half the bytes) was returned short, and the cache refused it with an OSError that stopped that fill's prefetching
    (2 to 5 fills of an epoch where every 3rd answer was short), rather than a retry; a server that ignored the Range
    returned the whole file as the range's bytes. A short answer of a file of known size is now retried; a longer one
    is named with the fix."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamp

    data = np.random.default_rng(4).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/f.bin"
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=2))
        fs.pin({url: FileStamp(len(data))})  # (its size known, as the dataset's stamps know it; no version)
        server.fail_next("short")
        assert fs.cat_file(url, start=1000, end=51_000) == data[1000:51_000]
        assert fs.cat_file(url, start=299_000, end=400_000) == data[299_000:]  # (past the end: the file's end)
        assert [r.status for r in server.records] == [206, 206, 206] and len(slept) == 1
        server.fail_next("no_range")
        with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request.*supports Range"):
            fs.cat_file(url, start=1000, end=2000)
        assert fs.cat_file(url) == data  # (a whole file asked: no range to check)


@pytest.mark.parametrize("stamped", [False, True], ids=["unstamped", "stamped"])
def test_a_ranged_cat_file_answered_416_names_the_file_the_range_and_its_sizes(tmp_path: Path, slept, stamped) -> None:
    """A range past a plain HTTP(S) file's end (the file shrank on a server giving no ETag, so no If-Match to answer
    412) is answered 416, which reached the caller (the prefetch cache's fill) as aiohttp's ClientResponseError: no
    path of ours, no range, no advice. It is now a DatasetError naming the file, the range, the server's size (its
    Content-Range) and, where the dataset listed the file with another size, the file's change; not retried."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamp

    (tmp_path / "f.bin").write_bytes(bytes(102_400))
    with serve_folder(tmp_path) as server:
        server.versions = False
        url = f"{server.url}/f.bin"
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        if stamped:
            fs.pin({url: FileStamp(102_400)})  # (its size as the dataset listed it)
        (tmp_path / "f.bin").write_bytes(bytes(600))  # (shrank on the server)
        with pytest.raises(DatasetError) as info:
            fs.cat_file(url, start=50_000, end=51_000)
        assert [(r.method, r.status, r.range) for r in server.records] == [("GET", 416, "bytes=50000-50999")]
    said = "bytes [50000, 51000) asked, answered HTTP 416 Range Not Satisfiable"
    assert str(info.value) == (
        f"{url} changed on the server while it was read ({said}: 102400 bytes when opened, 600 bytes now); re-open "
        "the dataset"
        if stamped
        else f"{url}: {said} (the server has 600 bytes of it): the file is shorter than the range was reckoned "
        "for; if it changed on the server, re-open the dataset to read it as it is now"
    )
    assert slept == [] and type(info.value) is DatasetError


def test_a_ranged_cat_file_past_the_end_of_an_unchanged_file_is_named_as_asked_wrongly(tmp_path: Path, slept) -> None:
    """A 416 for a range past the end of a file that did not change (the server's size the listed one) said "the file
    is shorter than the range was reckoned for; if it changed on the server, re-open the dataset", which would not
    help: no read of the dataset asks such a range (its parquet ranges end at the size it opened the file with, its
    videos' inside the size their index was built for), and fsspec's own HTTP cat_file raises for it too (aiohttp's
    416), so it stays an error, now saying the range was asked wrongly. One GET, not retried."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamp

    (tmp_path / "f.bin").write_bytes(bytes(1000))
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/f.bin"
        plain = fsspec.filesystem("http", skip_instance_cache=True)
        with pytest.raises(aiohttp.ClientResponseError, match="416"):  # (fsspec's own: an error, not b"")
            plain.cat_file(url, start=1000, end=1010)
        fs = RetryingFileSystem(plain, policy=RetryPolicy(retries=2))
        fs.pin({url: FileStamp(1000)})
        with pytest.raises(DatasetError) as info:
            fs.cat_file(url, start=1000, end=1010)
        assert [(r.status, r.range) for r in server.records] == [(416, "bytes=1000-1009")] * 2
    assert str(info.value) == (
        f"{url}: bytes [1000, 1010) asked, answered HTTP 416 Range Not Satisfiable (the server has 1000 bytes of it, "
        "the dataset listed it with 1000): the range starts at or past the end of the file as the dataset listed it, "
        "so it was asked wrongly (the dataset's own reads ask none such: please report how it was asked); re-opening "
        "the dataset will not help"
    )
    assert slept == [] and type(info.value) is DatasetError


@pytest.mark.parametrize(
    ("size", "content_range", "said"),
    [
        (None, "bytes */1000", "(the server has 1000 bytes of it): the server refused a range inside the file"),
        (
            1000,
            "bytes */1000",
            "(the server has 1000 bytes of it, the dataset listed it with 1000): the server refused",
        ),
        (1000, "", "(the server gives no size for it, the dataset listed it with 1000): the file is shorter than"),
        (None, "bytes */100", "(the server has 100 bytes of it): the file is shorter than the range was reckoned for"),
    ],
    ids=["unlisted_inside", "listed_inside", "no_size", "shrank_unlisted"],
)
def test_a_416_is_named_by_where_the_range_lies(size, content_range: str, said: str) -> None:
    """The 416 of a range of bytes [500, 600): inside the file as the server gives it, the server's fault (not the
    file's, which "shorter than the range was reckoned for" said); past the server's size, or with no size from it,
    the file's (shrank: re-open)."""
    from lerobot_dali.http_ranges import _unsatisfiable

    error = _unsatisfiable("http://h/f.bin", 500, 600, size, content_range)
    assert str(error).startswith(
        f"http://h/f.bin: bytes [500, 600) asked, answered HTTP 416 Range Not Satisfiable {said}"
    )


def _multipart_refusal(url: str, start: int, end: int) -> str:
    """The DatasetError's message for bytes ``[start, end)`` of ``url`` answered as the test server's multipart body."""
    from tests.http_server import BYTERANGES_BOUNDARY

    return (
        f"{url}: bytes [{start}, {end}) asked in one range, answered HTTP 206 as 'multipart/byteranges; boundary="
        f"{BYTERANGES_BOUNDARY}': the range in a multipart body, which HTTP forbids for a single range (RFC 9110 "
        "15.3.7.2) and fsspec's HTTP reads cannot take apart; serve the dataset from a server (or through a proxy or "
        "CDN) that answers a single range with its bytes and a Content-Range, or copy it locally"
    )


def test_a_single_range_answered_multipart_is_named_as_such(tmp_path: Path, slept) -> None:
    """A range answered 206 as ``multipart/byteranges`` (its one part: HTTP forbids it for a single range, RFC 9110
    15.3.7.2) was named as a server that "ignored an HTTP Range request (it sent the whole file)", which it had not.
    fsspec's HTTP reads take no multipart answer apart: its ``cat_file`` returns the body's framing with the bytes,
    and a file opened (how the dataset's videos and parquet files are read) hands the framing out as the file's bytes,
    so the ranged read refuses it too, naming the answer and the fix: one GET, its body unread, not retried."""
    import fsspec

    from tests.http_server import BYTERANGES_BOUNDARY

    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/f.bin"
        server.fault_paths = {"/f.bin": "multipart"}
        plain = fsspec.filesystem("http", skip_instance_cache=True)
        framed = plain.cat_file(url, start=1000, end=1010)
        assert framed.startswith(f"--{BYTERANGES_BOUNDARY}\r\n".encode()) and data[1000:1010] in framed
        with plain.open(url, "rb", block_size=100) as handle:
            handle.seek(1000)
            assert handle.read(10) == f"--{BYTERANGES_BOUNDARY}"[:10].encode()  # (fsspec's own: the framing)
        server.reset_stats()
        fs = RetryingFileSystem(plain, policy=RetryPolicy(retries=2))
        with pytest.raises(DatasetError) as info:
            fs.cat_file(url, start=1000, end=1010)
        assert [(r.status, r.range) for r in server.records] == [(206, "bytes=1000-1009")]
    assert str(info.value) == _multipart_refusal(url, 1000, 1010)
    assert slept == [] and type(info.value) is DatasetError


def test_a_single_range_answered_multipart_to_an_opened_file_is_named_as_such(tmp_path: Path, slept) -> None:
    """An opened file's block reads (how the dataset's videos and parquet files are read) keep no headers: a block
    answered 206 as ``multipart/byteranges`` came back longer than asked, named as a server that ignored Range. The
    body's framing (boundary, the part's Content-Range naming the very bytes asked, those bytes, the boundary) now
    names it as what it is, the same DatasetError as cat_file's; one GET, not retried. A server ignoring Range whose
    file happens to start with ``--`` is still named as ignoring Range."""
    import fsspec

    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    (tmp_path / "g.bin").write_bytes(b"--" + data)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        url = f"{server.url}/f.bin"
        with fs.open(url, "rb", block_size=100) as handle:
            handle.seek(1000)
            server.reset_stats()
            server.fault_paths = {"/f.bin": "multipart"}
            with pytest.raises(DatasetError) as info:
                handle.read(10)
            assert [(r.status, r.range) for r in server.records] == [(206, "bytes=1000-1109")]  # (and a block ahead)
        with fs.open(f"{server.url}/g.bin", "rb", block_size=100) as handle:
            handle.seek(1000)
            server.fault_paths = {"/g.bin": "no_range"}
            with pytest.raises(DatasetError, match=r"g\.bin: the server ignored an HTTP Range request.*supports Range"):
                handle.read(10)
    assert str(info.value) == _multipart_refusal(url, 1000, 1110)
    assert slept == [] and type(info.value) is DatasetError


_UNENDED_HEAD = b"--b\r\nContent-Range: bytes 0-99/200\r\n"  # (36 bytes: no blank line ends the part's headers)


@pytest.mark.parametrize(
    ("data", "end", "framing"),
    [
        (b"--b\r\nContent-Range: bytes 0-9/20\r\n\r\n0123456789\r\n--b--\r\n", 10, "multipart/byteranges; boundary=b"),
        (b"--b\r\nContent-Range: bytes 0-8/20\r\n\r\n0123456789\r\n--b--\r\n", 10, None),  # (another range)
        (_UNENDED_HEAD + b"x" * 67 + b"\r\n--b\r\n" + b"y" * 20, 100, None),  # (at 103: as if headers ended at -1)
    ],
    ids=["framed", "another_range", "headers_unended"],
)
def test_a_multipart_body_frames_the_range_asked_after_its_part_headers_end(data: bytes, end: int, framing) -> None:
    """byteranges_framing by hand: the part's Content-Range names the bytes asked, a blank line ends its headers,
    those bytes follow, then the boundary again. A body with no blank line (a file sent whole, starting with '--')
    frames nothing, even where the boundary lies where bytes [0, 100) would end after a blank line found at -1."""
    from lerobot_dali.request_checks import byteranges_framing

    assert byteranges_framing(data, 0, end) == framing


@pytest.mark.parametrize("overridden", ["_cat_file", "cat_file", None])
def test_a_ranged_cat_file_goes_through_a_subclass_s_own_reads(tmp_path: Path, overridden: str | None) -> None:
    """The ranged cat_file of plain HTTP(S) makes its own GET (read no further than asked, a 416 named), which
    bypassed a user's HTTPFileSystem subclass that signs its reads in ``_cat_file`` (or ``cat_file``): the prefetch
    cache's ranges went unsigned, refused 401. Such a subclass's reads are now used, once per range; a subclass that
    keeps fsspec's reads still gets the ranged GET (its 416 named: fsspec's own raises aiohttp's)."""
    from fsspec.asyn import sync
    from fsspec.implementations.http import HTTPFileSystem

    from lerobot_dali.file_stamps import FileStamp

    calls: list[tuple[int, int]] = []

    class Signing(HTTPFileSystem):
        if overridden == "_cat_file":

            async def _cat_file(self, url, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
                calls.append((start, end))
                headers = {**kwargs.pop("headers", {}), "X-Signature": "s"}
                return await super()._cat_file(url, start=start, end=end, headers=headers, **kwargs)

        elif overridden == "cat_file":

            def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
                calls.append((start, end))
                headers = {**kwargs.pop("headers", {}), "X-Signature": "s"}
                return sync(self.loop, super()._cat_file, path, start=start, end=end, headers=headers, **kwargs)

    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/f.bin"
        fs = RetryingFileSystem(Signing(skip_instance_cache=True), policy=RetryPolicy(retries=0))
        fs.pin({url: FileStamp(len(data))})
        if overridden is None:
            with pytest.raises(DatasetError, match=r"the range starts at or past the end of the file"):
                fs.cat_file(url, start=len(data), end=len(data) + 10)
            assert fs.cat_file(url, start=1000, end=3000) == data[1000:3000]
        else:
            server.required_headers = {"X-Signature": "s"}
            assert fs.cat_file(url, start=1000, end=3000) == data[1000:3000]
            assert fs.cat_file(url, start=5, end=6) == data[5:6]
        asked = [(r.status, r.range) for r in server.records]
    if overridden is None:
        assert calls == [] and asked == [(416, f"bytes={len(data)}-{len(data) + 9}"), (206, "bytes=1000-2999")]
    else:
        assert calls == [(1000, 3000), (5, 6)] and asked == [(206, "bytes=1000-2999"), (206, "bytes=5-5")]


def test_a_ranged_read_of_another_remote_filesystem_loads_no_http_client() -> None:
    """Whether a ranged read may make its own GET was asked by importing fsspec's HTTP module: every remote
    filesystem's first ranged read (a Hub, S3 or in-memory dataset's) loaded aiohttp and fsspec's HTTP filesystem,
    ~0.2 s and their memory in each worker for nothing. A filesystem of that module exists only once it is loaded."""
    code = (
        "import sys, fsspec\n"
        "from lerobot_dali.remote_retry import RetryingFileSystem\n"
        "memory = fsspec.filesystem('memory'); memory.pipe('/d/v.bin', bytes(range(100)))\n"
        "assert RetryingFileSystem(memory).cat_file('/d/v.bin', 10, 20) == bytes(range(10, 20))\n"
        "print(sorted(m for m in ('aiohttp', 'fsspec.implementations.http') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_a_plain_http_range_answered_whole_is_read_no_further_than_the_bytes_asked(tmp_path: Path) -> None:
    """fsspec's HTTP cat_file reads its answer whole: 10 bytes asked of a 32 MiB file by a server ignoring Range (200,
    the whole file) read all 33,554,432 bytes (64 MiB at its peak in memory) before the range was found too long. The
    answer is now read no further than the bytes asked (then named), as a Hub range's is."""
    import fsspec

    size = 32 * 2**20
    (tmp_path / "f.bin").write_bytes(bytes(size))
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        server.fault_paths = {"/f.bin": "no_range"}
        for start in (0, 1000):  # (from the file's start, fsspec's block fetch reads a 200's first bytes as its own)
            with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request.*supports Range"):
                fs.cat_file(f"{server.url}/f.bin", start=start, end=start + 10)
        sent = [r.sent_bytes for r in server.records]
    assert len(sent) == 2 and max(sent) < size // 2, sent  # (what the sockets' buffers took before the client left)


@pytest.mark.parametrize("fault", ["no_range", "shifted"])
def test_a_plain_http_range_answered_from_another_offset_is_not_handed_out(tmp_path: Path, slept, fault) -> None:
    """A ranged cat_file checked only its answer's length: bytes [10, 200,000) of a 102,400-byte file (not listed
    with its size), from a server ignoring Range (200, the whole file), came back as its first 102,400 bytes; bytes
    [1000, 3000), answered 206 from another offset ('bytes 1001-3000/102400'), as the 2,000 bytes from 1001. Now the
    whole file past 0 is the DatasetError naming the server as ignoring Range (one GET, not retried), and the range
    from another offset a response from another offset, retried (3 GETs) then raised."""
    import fsspec

    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        server.fault_paths = {"/f.bin": fault}
        url = f"{server.url}/f.bin"
        if fault == "no_range":
            with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request.*supports Range"):
                fs.cat_file(url, start=10, end=200_000)
        else:
            with pytest.raises(
                RemoteFileError,
                match=r"asked for bytes \[1000, 3000\) and answered HTTP 206 with "
                r"Content-Range 'bytes 1001-3000/102400' \(a response from another offset\)",
            ):
                fs.cat_file(url, start=1000, end=3000)
        asked = [(r.status, r.range) for r in server.records]
        server.fault_paths = {}
        assert fs.cat_file(url, start=1000, end=3000) == data[1000:3000]  # (answered as asked: read as before)
    assert asked == ([(200, "bytes=10-199999")] if fault == "no_range" else [(206, "bytes=1000-2999")] * 3), asked
    assert len(slept) == (0 if fault == "no_range" else 2)


def test_a_server_that_ignores_range_is_named_with_a_fix(tmp_path: Path) -> None:
    import fsspec

    (tmp_path / "f.bin").write_bytes(bytes(200_000))
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=0))
        with fs.open(f"{server.url}/f.bin", "rb", block_size=50_000) as handle:
            handle.seek(100_000)
            server.set_faults(1, ("no_range",))
            with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request.*supports Range"):
                handle.read(10)


@pytest.mark.parametrize("headers", [False, True], ids=["no_headers", "headers"])
@pytest.mark.parametrize("header", ["Accept-Ranges", "Content-Length"])
def test_a_server_that_sends_files_only_whole_is_named_with_a_fix(
    root: Path, server, monkeypatch, header, headers: bool
) -> None:
    """A server answering ``Accept-Ranges: none``, or giving no size, gets a streaming file from fsspec, which cannot
    seek: reading the dataset failed with "ValueError: Cannot seek streaming HTTP file", or a TypeError from
    ``int(None)``, naming neither the file nor a fix. Its metadata, each file read whole in one GET, opens (it failed
    at info.json, named with the fix); the first file that needs its part or its size read names it. The same with
    storage_options headers: a stamped video opened without its size was opened with it (asked first, to keep its
    If-Match out of fsspec's own HEAD), so fsspec no longer saw 'Accept-Ranges: none' and read it in ranges anyway."""
    handler = server._httpd.RequestHandlerClass
    send_header = handler.send_header

    def no_ranges(self, name: str, value: str) -> None:
        send_header(self, name, "none" if name == "Accept-Ranges" else value)

    if header == "Accept-Ranges":
        monkeypatch.setattr(handler, "send_header", no_ranges)
    else:
        server.content_length = frozenset()
    monkeypatch.setenv(RETRIES_ENV, "0")
    from lerobot_dali.iterator import DALILeRobotIterator

    options = {"headers": {"Authorization": "Bearer t"}} if headers else {}
    server.required_headers = options.get("headers", {})

    def first_batch() -> dict:
        reader = open_dataset(_url(server, root), storage_options=options)
        it = DALILeRobotIterator(reader, num_workers=0, cache_gb=0.0, **OPTIONS)
        try:
            return next(iter(it))
        finally:
            it.close()

    # Without sizes the open stamps the first data file; without ranges the first video read needs one.
    error, fix = (
        (DatasetError, "supports Range requests") if header == "Accept-Ranges" else (ValueError, "Content-Length")
    )
    with pytest.raises(error, match=rf"{server.url}/dataset/(data|videos)/\S+: .*{fix}"):
        first_batch()


@pytest.mark.parametrize(("fault", "retries"), [("403", "5"), ("503", "1")])
def test_a_denied_or_failing_server_is_not_reported_as_a_missing_file(
    root: Path, server, monkeypatch, fault: str, retries: str
) -> None:
    """fsspec's HTTP ``info`` raises FileNotFoundError for whatever its GET hit, and the loader reported a 403,
    or a 503 past the retries, as a missing info.json or video: the HTTP error is raised instead."""
    monkeypatch.setenv(RETRIES_ENV, retries)
    use_fast_retries(monkeypatch)
    server.set_faults(1, (fault,))
    with pytest.raises(Exception) as info:
        open_dataset(_url(server, root))
    assert not isinstance(info.value, FileNotFoundError), repr(info.value)
    assert getattr(info.value, "status", None) == int(fault), repr(info.value)
    server.set_faults(0)


def test_a_refused_read_says_what_to_pass_and_is_not_retried(root: Path, server, slept, capsys) -> None:
    """aiohttp's 403 says only "403, message='Forbidden'": the command line printed its traceback (it is no OSError,
    which the command names), and a batch's error said nothing of credentials. Both say what to pass; not retried."""
    from lerobot_dali.iterator import DALILeRobotIterator

    it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_gb=0.0, **OPTIONS)
    server.set_faults(1, ("403",))
    with pytest.raises(DatasetError) as info:
        next(iter(it))
    it.close()
    message = str(info.value)
    assert f"{server.url}/dataset/" in message and "was refused (not retried): " + REFUSED_HINT in message, message
    assert not slept
    server.reset_stats()
    assert main(["info", _url(server, root)]) == 2
    err = capsys.readouterr().err
    said = f"lerobot-dali info: RemoteFileError: {server.url}/dataset/meta/info.json: cat_file was refused"
    assert err.startswith(f"{said} (not retried): {REFUSED_HINT} (the server answered ClientResponseError: 403, "), err
    assert err.count("\n") == 1, err
    # (info.json read whole: one GET; opened, a HEAD and fsspec's GET fallback)
    assert [(r.method, r.status) for r in server.records] == [("GET", 403)]
    assert not slept
    server.set_faults(0)


#: Files the dataset's open reads or asks the size of: a path each request for one holds.
_OPENED = {"info.json": "meta/info.json", "episodes": "meta/episodes/", "data": "data/", "video": "videos/"}


@pytest.mark.parametrize("fault", ["403", "503"])
@pytest.mark.parametrize("part", list(_OPENED))
def test_a_file_refused_or_failing_at_open_is_a_remote_file_error_naming_it(
    root: Path, server, monkeypatch, capsys, part: str, fault: str
) -> None:
    """A 403, or a 503 past the retries, answered for info.json, the episodes' folder, a data parquet or a video as
    the iterator opened the dataset reached the user as aiohttp's ClientResponseError (8 of 8), what to do only in a
    note: now a RemoteFileError (a DatasetError) naming the file's URL and what to do, as ``lerobot-dali check``."""
    from lerobot_dali.errors import RemoteFileError
    from lerobot_dali.iterator import DALILeRobotIterator

    monkeypatch.setenv(RETRIES_ENV, "1")
    use_fast_retries(monkeypatch, retries=1)
    server.fault_paths = {f"/dataset/{_OPENED[part]}": fault}
    with pytest.raises(RemoteFileError) as info:
        it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_gb=0.0, **OPTIONS)
        with contextlib.closing(it):
            next(iter(it))
    message = str(info.value)
    assert message.startswith(f"{server.url}/dataset/{_OPENED[part]}"), message
    if fault == "403":
        assert "was refused (not retried): " + REFUSED_HINT in message, message
    else:
        gave_up = f"gave up: check the connection and the server, or set {RETRIES_ENV} to retry more"
        assert re.search(rf": \w+ failed 2 time\(s\), the last with ClientResponseError: 503, .*; {gave_up}$", message)
    assert info.value.status == int(fault) and isinstance(info.value.__cause__, aiohttp.ClientResponseError)
    assert main(["check", _url(server, root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lerobot-dali check: RemoteFileError: {server.url}/dataset/{_OPENED[part]}"), err
    server.fault_paths = {}


def test_a_file_refused_in_a_worker_process_is_a_remote_file_error_with_its_status(
    root: Path, server, monkeypatch
) -> None:
    """DALI hands a worker's error to the trainer as its traceback text and message alone: a RemoteFileError a
    worker raised for a 403 was rebuilt there from its message, its ``status`` None (1 of 1). It is 403 now, the
    message the worker's, exactly."""
    from lerobot_dali.iterator import DALILeRobotIterator

    use_fast_retries(monkeypatch)
    importable_in_workers(monkeypatch)
    it = DALILeRobotIterator(_url(server, root), num_workers=2, cache_gb=0.0, **OPTIONS)
    server.fault_paths = {"/videos/": "403"}  # (opened already: the workers' reads are refused)
    with contextlib.closing(it), pytest.raises(RemoteFileError) as info:
        next(iter(it))
    server.fault_paths = {}
    assert type(info.value) is RemoteFileError and info.value.status == 403, repr(info.value)
    message = str(info.value)
    assert message.startswith(f"{server.url}/{root.name}/videos/") and "was refused (not retried): " in message
    assert message.endswith("403, message='Forbidden', url='" + message.split(": ", 1)[0] + "')"), message


@pytest.mark.parametrize("route", ["read", "cat_file"])
def test_a_server_trickling_a_block_fails_the_read_at_its_deadline(tmp_path: Path, monkeypatch, route: str) -> None:
    """aiohttp's read timeout restarts at each chunk and the sessions set no total: a server sending a byte every
    few seconds held a block's read for ever. Each request now has a deadline (60 s plus its bytes at 64 KiB/s; here
    0.6 s), past which it fails as a timeout (retried), and the error names the file and the deadline."""
    from lerobot_dali.dataset_location import resolve_location
    from lerobot_dali.errors import RemoteFileError

    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 40)
    monkeypatch.setenv(RETRIES_ENV, "0")
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_DEADLINE_BASE_S", 0.6)
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_MIN_BYTES_PER_S", 10**9)
    with serve_folder(tmp_path) as server:
        fs = resolve_location(server.url).fs
        server.stall_s = 0.05
        server.fault_paths = {"/blob.bin": "trickle"}
        url = f"{server.url}/blob.bin"
        with pytest.raises(RemoteFileError) as info:
            if route == "read":
                with fs.open(url, "rb", size=10240) as f:
                    f.read(100)
            else:
                fs.cat_file(url, start=0, end=100)
        server.fault_paths = {}
    assert re.match(
        rf"{url}: {route} failed 1 time\(s\), the last with TimeoutError: {url}: bytes \[0, \d+\) not received "
        r"within the deadline of 0.6 s \(0.6 s plus .*\): the server sends too slowly or stalls mid-answer; gave up",
        str(info.value),
    ), str(info.value)


def test_a_stamped_file_read_whole_has_the_deadline_of_its_stamped_size(tmp_path: Path) -> None:
    """A file read whole is a request of unknown size (its deadline 60 s plus 256 MiB at 64 KiB/s) unless it is
    stamped: then of its stamped size (here 128 KiB: 62 s)."""
    from fsspec.implementations.http import HTTPFileSystem

    from lerobot_dali.file_stamps import FileStamp

    timeouts: list[float | None] = []

    class Recording(HTTPFileSystem):
        def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
            timeouts.append(kwargs.get("timeout"))
            return super().cat_file(path, start=start, end=end, **kwargs)

    data = bytes(range(256)) * 512
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/f.bin"
        fs = RetryingFileSystem(Recording(skip_instance_cache=True), policy=RetryPolicy(retries=0))
        assert fs.cat_file(url) == data
        fs.pin({url: FileStamp(len(data))})
        assert fs.cat_file(url) == data
    assert timeouts == [60.0 + 4096.0, 62.0]


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [(None, 76.0), (aiohttp.ClientTimeout(sock_read=30), 76.0), (aiohttp.ClientTimeout(total=5), None)],
)
def test_a_session_timeout_with_a_total_of_its_own_sets_no_deadline(timeout, seconds: float | None) -> None:
    """A request for 1 MiB may take 60 s plus 16 s at 64 KiB/s, unless the session's timeout sets a total: then
    that total is kept for every request, with no deadline of ours."""
    from fsspec.implementations.http import HTTPFileSystem

    from lerobot_dali.request_checks import _deadline_s

    fs = HTTPFileSystem(skip_instance_cache=True, client_kwargs={} if timeout is None else {"timeout": timeout})
    assert _deadline_s(fs, 1 << 20) == seconds


@pytest.mark.parametrize("call", ["glob", "ls", "isdir"])
def test_a_server_trickling_a_folder_listing_fails_it_at_its_deadline(tmp_path: Path, monkeypatch, call: str) -> None:
    """fsspec reads a folder's whole index page (the episodes' folder, listed as a dataset opens): a server trickling
    it held the listing for ever, since the deadline was given to block fetches and cat_file alone. A listing now has
    the deadline of a request of unknown size (here 0.6 s), past which it fails as a timeout naming the folder."""
    from lerobot_dali.dataset_location import resolve_location

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "file-000.parquet").write_bytes(b"x")
    monkeypatch.setenv(RETRIES_ENV, "0")
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_DEADLINE_BASE_S", 0.6)
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_MIN_BYTES_PER_S", 10**12)
    with serve_folder(tmp_path) as server:
        fs = resolve_location(server.url).fs
        assert fs.glob(f"{server.url}/d/*.parquet") == [f"{server.url}/d/file-000.parquet"]
        server.stall_s = 0.05  # (the page, ~130 bytes: 6.5 s)
        server.fault_paths = {"/d": "trickle"}
        folder = f"{server.url}/d/"
        with pytest.raises(RemoteFileError) as info:
            {
                "glob": lambda: fs.glob(f"{folder}*.parquet"),
                "ls": lambda: fs.ls(folder),
                "isdir": lambda: fs.isdir(folder),
            }[call]()
        server.fault_paths = {}
    assert re.match(
        rf"{re.escape(folder)}\S*: {call} failed 1 time\(s\), the last with TimeoutError: \S+: the file not received "
        r"within the deadline of 0.6 s",
        str(info.value),
    ), str(info.value)
    assert info.value.status is None and isinstance(info.value.__cause__, TimeoutError)


@contextlib.contextmanager
def _chunked_server(body: bytes, whole_from: int) -> Iterator[tuple[str, list[int]]]:
    """A server answering every GET with ``body`` in a chunked answer, cut (the connection closed) after half of it
    for the requests before the ``whole_from``-th (0-based); its URL and the count of requests answered."""
    answered: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                sent = body if len(answered) >= whole_from else body[: len(body) // 2]
                answered.append(len(sent))
                head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                end = b"0\r\n\r\n" if sent is body else b""
                conn.sendall(head + f"{len(sent):x}\r\n".encode() + sent + b"\r\n" + end)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/ds", answered
    finally:
        listener.close()


@pytest.mark.parametrize("whole_from", [1, 99])
def test_a_metadata_file_cut_short_in_a_chunked_answer_is_read_again_or_named(monkeypatch, whole_from: int) -> None:
    """A server sending info.json chunked (no Content-Length) that closed the connection mid-answer: aiohttp tells the
    cut (its ClientPayloadError), so the file is read again whole; cut every time, the error raised was aiohttp's own
    (the file named only in a note): now a RemoteFileError naming the file."""
    from lerobot_dali.dataset_location import read_whole, resolve_location
    from lerobot_dali.errors import RemoteFileError

    monkeypatch.setenv(RETRIES_ENV, "1")
    use_fast_retries(monkeypatch, retries=1)
    body = json.dumps({"codebase_version": "v3.0", "fps": 30, "features": {}, "pad": "x" * 4000}).encode()
    with _chunked_server(body, whole_from) as (url, answered):
        location = resolve_location(url)
        if whole_from == 1:
            assert read_whole(location.meta_fs, location.meta_path("meta/info.json")).getvalue() == body
        else:
            with pytest.raises(RemoteFileError, match=rf"^{url}/meta/info.json: cat_file failed 2 time\(s\), the last "
                               "with ClientPayloadError: Response payload is not completed"):  # fmt: skip
                read_whole(location.meta_fs, location.meta_path("meta/info.json"))
    assert answered == [len(body) // 2, len(body)] if whole_from == 1 else [len(body) // 2] * 2


def test_a_server_that_refuses_connections_is_not_reported_as_a_missing_file(monkeypatch, capsys) -> None:
    """fsspec raises FileNotFoundError from aiohttp's ClientConnectorError (an OSError) when nothing listens: past
    the retries that read "not a LeRobot dataset: meta/info.json is missing". The connection error is raised."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/dataset"
    monkeypatch.setenv(RETRIES_ENV, "1")
    use_fast_retries(monkeypatch, retries=1)
    with pytest.raises(Exception) as info:
        open_dataset(url)
    assert not isinstance(info.value, FileNotFoundError) and is_transient(info.value), repr(info.value)
    assert "Cannot connect to host 127.0.0.1" in str(info.value)
    assert main(["info", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lerobot-dali info: RemoteFileError: {url}/meta/info.json: cat_file failed 2 time(s), the "
                          "last with ClientConnectorError: Cannot co"), err  # fmt: skip
    assert err.endswith(f"or set {RETRIES_ENV} to retry more\n") and err.count("\n") == 1, err


@pytest.mark.parametrize("remote_part", ["dataset", "data_files_root"])
def test_a_query_string_is_sent_with_every_request(root: Path, server, remote_part) -> None:
    """Files' paths were appended after the '?' ("...dataset?token=x/meta/info.json is not valid JSON"); the query is
    now sent with every request, as storage_options' params, and kept out of the dataset's name in messages."""
    url = _url(server, root)
    if remote_part == "dataset":
        remote = open_dataset(f"{url}?token=x&scope=read", storage_options={"params": {"scope": "all"}})
        assert remote.location.description == url
    else:
        remote = open_dataset(root, data_files_root=f"{url}?token=x&scope=all")
    local = open_dataset(root)
    for pos in range(len(LENGTHS)):
        np.testing.assert_array_equal(remote.read_episode(pos)["index"], local.read_episode(pos)["index"])
    assert server.records and {r.query for r in server.records} == {"token=x&scope=all"}
    assert "token" not in remote.location.description


def test_an_http_root_keeps_blank_query_values_escapes_a_bare_percent_and_keeps_a_timeout_given() -> None:
    """What a server is sent as typed: a blank query value (``token=``) is a value, a '%' starting no escape is the
    folder name's own (sent as %25); the read timeouts apply unless the options set a timeout of their own."""
    from lerobot_dali.dataset_location import HTTP_TIMEOUTS_S, resolve_location

    location = resolve_location("http://127.0.0.1:9/100%/ds?token=&v=1")
    assert location.root == "http://127.0.0.1:9/100%25/ds"
    assert location.fs.fs.kwargs["params"] == [("token", ""), ("v", "1")]
    assert location.fs.fs.client_kwargs["timeout"].sock_read == HTTP_TIMEOUTS_S["sock_read"]
    own = aiohttp.ClientTimeout(total=5)
    given = resolve_location("http://127.0.0.1:9/ds", storage_options={"client_kwargs": {"timeout": own}})
    assert given.fs.fs.client_kwargs["timeout"] is own


@pytest.mark.parametrize("remote_part", ["dataset", "data_files_root"])
@pytest.mark.parametrize("spelled", ["s3cret", "s3cr%65t"])  # (the second percent-encoded: aiohttp decodes it)
@pytest.mark.filterwarnings("error::DeprecationWarning")  # (aiohttp 3.14's, for its per-request auth: gone in v4)
def test_a_password_in_the_url_is_sent_but_saved_in_no_state(
    root: Path, server, remote_part, spelled, slept, caplog
) -> None:
    """``http://user:password@host/ds`` (aiohttp's basic auth) was the dataset's description, which every stream
    state saves since 311bc83 (``dataset_descriptions``): the password went into each checkpoint. It is still sent
    with every request; the description, the state, the files' paths and so the logs of a retry name the dataset
    without it (each file's path held it: every retry's warning named it)."""
    from lerobot_dali.dataset_union import datasets_held

    url = _url(server, root)
    with_password = url.replace("http://", f"http://alice:{spelled}@", 1)
    # (the header sent beside the storage options' own headers, which it keeps)
    server.required_headers = {"Authorization": "Basic YWxpY2U6czNjcmV0", "X-Team": "robots"}  # (alice:s3cret)
    server.fail_next(*[None] * 3, "503")  # (a read retried: its line names the file)
    caplog.set_level(logging.INFO, logger="lerobot_dali.remote_retry")
    options = {"headers": {"X-Team": "robots"}}
    if remote_part == "dataset":
        remote = open_dataset(with_password, storage_options=options)
        assert remote.location.description == url
    else:
        remote = open_dataset(root, data_files_root=with_password, storage_options=options)
        assert remote.location.description == f"{root} (data files: {url})"
    local = open_dataset(root)
    for pos in range(len(LENGTHS)):
        np.testing.assert_array_equal(remote.read_episode(pos)["index"], local.read_episode(pos)["index"])
    assert server.records and server.counts[("GET", "unauthorized")] == 0
    held = datasets_held([remote])
    for key in ("dataset_contents", "dataset_identities"):  # (the same dataset wherever it is read from)
        assert held[key] == datasets_held([local])[key]
    assert "s3cret" not in repr(held) and "alice" not in repr(held)
    assert server.counts[("GET", "fault")] == 1 and len(slept) == 1  # (retried once)
    assert "s3cret" not in remote.location.root and spelled not in caplog.text and url in caplog.text


@pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning")  # (a user's auth option)
@pytest.mark.parametrize("given", ["header", "auth"])
def test_a_password_in_the_url_beside_credentials_in_options_is_refused_unsaid(tmp_path: Path, given: str) -> None:
    """aiohttp refuses a URL's user and password beside an ``auth`` or ``Authorization`` header in each request, which
    fsspec's ``info`` reported as ``FileNotFoundError('http://alice:s3cret@host/ds/meta/info.json')``: a missing
    file, with the password in it. It is refused at the open, naming the URL without the password and the fix."""
    from lerobot_dali.dataset_location import resolve_location

    options = {"headers": {"Authorization": "Bearer t"}} if given == "header" else {"auth": aiohttp.BasicAuth("a", "b")}
    (tmp_path / "ds" / "meta").mkdir(parents=True)
    (tmp_path / "ds" / "meta" / "info.json").write_bytes(b"{}")
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/ds"
        with pytest.raises(ValueError, match="password in the URL and with credentials in storage_options") as raised:
            location = resolve_location(url.replace("http://", "http://alice:s3cret@"), storage_options=options)
            location.fs.cat_file(location.meta_path("meta/info.json"))
        assert str(raised.value).startswith(f"{url!r} is given") and "s3cret" not in str(raised.value)
        assert server.records == []


@pytest.mark.parametrize("fault", ["503", "403"])
@pytest.mark.parametrize("remote_part", ["dataset", "data_files_root"])
def test_a_signature_in_the_query_is_sent_but_named_in_no_log_or_error(
    root: Path, server, monkeypatch, slept, caplog, remote_part, fault
) -> None:
    """A signed URL's query (``?sig=...``) went into aiohttp's errors, which name the request's URL with its query:
    the warning that gave up on a read ("... ClientResponseError: 503, ..., url='...?sig=SIGSECRET'"), the error
    raised and a 403's all held the signature. It is still sent with every request (the server refuses any without
    it), and the logs, the error raised and its causes name it masked."""
    monkeypatch.setenv(RETRIES_ENV, "1")
    server.required_query = {"sig": "SIGSECRET", "scope": "all"}
    caplog.set_level(logging.DEBUG, logger="lerobot_dali")
    url = f"{_url(server, root)}?sig=SIGSECRET&scope=all"
    remote = open_dataset(url) if remote_part == "dataset" else open_dataset(root, data_files_root=url)
    server.set_faults(1, (fault,))  # (every request: a 503 past its one retry, or a 403, not retried)
    with pytest.raises(Exception) as info:
        remote.read_episode(0)
    server.set_faults(0)
    assert status_of(info.value) == int(fault)  # (aiohttp's error itself, its status kept)
    said = "".join(traceback.format_exception(info.value))  # (the error, its notes and its causes)
    assert "SIGSECRET" not in said and "sig=***&scope=all" in said, said
    ours = [r for r in caplog.records if r.name.startswith("lerobot_dali")]
    assert ours and not [r for r in ours if "SIGSECRET" in logging.Formatter().format(r)], caplog.text  # (+ tracebacks)
    gave_up = [r for r in ours if "gave up" in r.getMessage() and "sig=***&scope=all" in r.getMessage()]
    assert len(gave_up) == (fault == "503"), caplog.text  # (a 403 is raised, not retried: no line)
    local = open_dataset(root)
    for pos in range(len(LENGTHS)):
        np.testing.assert_array_equal(remote.read_episode(pos)["index"], local.read_episode(pos)["index"])
    assert server.faults_injected[fault] >= 1 and not [r for r in server.records if r.kind == "unauthorized"]


def _signed_stamped_file(server: FolderServer, folder: Path) -> tuple[RetryingFileSystem, str, Any]:
    """``folder``'s ``f.bin`` (served by ``server``, which refuses requests without ``?sig=SIGSECRET&scope=all``) on the
    filesystem of the URL signed so, and its stamps holding it (as a dataset's open stamps it)."""
    from lerobot_dali.dataset_location import resolve_location
    from lerobot_dali.file_stamps import FileStamps

    server.required_query = {"sig": "SIGSECRET", "scope": "all"}
    location = resolve_location(f"{server.url}/{folder.name}?sig=SIGSECRET&scope=all")
    stamps = FileStamps(location.fs)
    stamps[location.path("f.bin")]
    assert isinstance(location.fs, RetryingFileSystem)
    return location.fs, location.path("f.bin"), stamps


@pytest.mark.parametrize("route", ["asked_after_a_404", "first_changed"])
def test_a_signature_is_named_in_no_debug_line_of_a_stamp_asked_again(
    tmp_path: Path, monkeypatch, slept, caplog, route: str
) -> None:
    """A stamped file's stamp asked again (:meth:`FileStamps.change_now`: one request, outside the retries, which mask
    the errors they catch) and unanswered (503) logged aiohttp's error at DEBUG with its traceback, the request's URL
    with the signature in it: 2 records of 2 asks after a 404 (``RetryingFileSystem._change_now``), 1 of
    ``first_changed``'s. They name it masked now."""
    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", "0")
    monkeypatch.setenv(RETRIES_ENV, "2")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f.bin").write_bytes(bytes(range(256)) * 40)
    with serve_folder(tmp_path) as server:
        fs, path, stamps = _signed_stamped_file(server, tmp_path / "ds")
        caplog.set_level(logging.DEBUG, logger="lerobot_dali")
        if route == "first_changed":
            server.fail_next("503", "503")  # (its HEAD, and the GET fsspec's info makes where it failed)
            assert stamps.first_changed([path]) is None
        else:
            server.fail_next("404", *["503"] * 4)  # (the read, then each ask: a HEAD and fsspec's GET)
            with pytest.raises(DatasetError, match="asked again whether it has the file, gave no answer"):
                fs.cat_file(path, start=0, end=10)
        assert not [r for r in server.records if r.kind == "unauthorized"]
    asked = [logging.Formatter().format(r) for r in caplog.records if "asking for the stamp" in r.getMessage()]
    assert len(asked) == (1 if route == "first_changed" else 2), caplog.text
    assert not [text for text in asked if "SIGSECRET" in text] and all("sig=***&scope=all" in t for t in asked), asked


def test_a_signature_is_named_in_no_debug_line_of_fsspec(tmp_path: Path, slept, caplog) -> None:
    """fsspec's HTTP filesystem logs at DEBUG the traceback of a HEAD that failed before it asks with a GET (its
    ``info``): aiohttp's error, the request's URL with the signature in it, in 1 record of 1 such HEAD where a user
    logs at DEBUG. Its records are masked now, once a filesystem sends a credential in its query; the file is read."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f.bin").write_bytes(bytes(range(256)) * 40)
    with serve_folder(tmp_path) as server:
        caplog.set_level(logging.DEBUG)
        fs, path, _ = _signed_stamped_file(server, tmp_path / "ds")
        server.fail_next("503")  # (the HEAD; fsspec asks with a GET then)
        assert fs.info(path)["size"] == 10240 and server.records[-1].status == 200
    theirs = [logging.Formatter().format(r) for r in caplog.records if r.name.startswith("fsspec")]
    # (aiohttp's error, not "503" alone: the server's ephemeral port holds it in 1 run of ~70, in every record)
    failed = [text for text in theirs if "503, message='Service Unavailable'" in text]
    assert len(failed) == 1 and "sig=***&scope=all" in failed[0], theirs
    assert not [text for text in theirs if "SIGSECRET" in text], theirs


@pytest.mark.parametrize(
    "verb", [["info"], ["check", "--decode", "none"], ["check", "--json", "--decode", "none"], ["check", "--concat"]]
)
def test_the_cli_names_a_signed_url_it_cannot_open_masked(root: Path, server, capsys, verb: list[str]) -> None:
    """The CLI named a dataset it could not open as typed: a signed URL's query with a fragment (refused at the open), a
    protocol no filesystem reads, in ``info``'s and ``check``'s line ("cannot open 'https://...?sig=SIGSECRET...'") and
    ``check --json``'s report of several datasets (4 of 4 verbs). The signature is masked now; the others checked."""
    server.required_query = {"sig": "SIGSECRET", "scope": "all"}
    signed = f"{_url(server, root)}?sig=SIGSECRET&scope=all"
    given = [f"{signed}#x", "nosuchproto://h/ds?X-Amz-Signature=SIGSECRET"] if verb[0] == "check" else [f"{signed}#x"]
    assert main([*verb, *given[: 1 if "--concat" in verb else None]]) == 2
    said = "".join(capsys.readouterr())
    assert "SIGSECRET" not in said and "sig=***&scope=all#x" in said, said
    if verb == ["info"]:
        assert main(["info", "nosuchproto://h/ds?X-Amz-Signature=SIGSECRET&v=3"]) == 2
        said = capsys.readouterr().err
        assert "SIGSECRET" not in said and "X-Amz-Signature=***&v=3" in said, said


def test_a_fragment_is_refused_naming_the_fix(root: Path, server) -> None:
    with pytest.raises(ValueError, match="starts a fragment, which is never sent to the server; .* as %23"):
        open_dataset(f"{_url(server, root)}#ds")
    with pytest.raises(ValueError, match="starts a fragment"):
        open_dataset(root, data_files_root=f"{_url(server, root)}#")


@pytest.mark.parametrize("remote_part", ["dataset", "data_files_root"])
def test_a_stalled_server_fails_a_read_in_the_read_timeout(root: Path, server, monkeypatch, remote_part) -> None:
    """With aiohttp's default (5 minutes a request) a server that stopped answering held a read for 5 minutes
    per try; reads now give up after HTTP_TIMEOUTS_S of silence (here shortened to 0.5 s), as transient. A
    ``data_files_root`` URL (a mirror of data/ and videos/) had no such timeouts."""
    import time

    monkeypatch.setenv(RETRIES_ENV, "0")
    monkeypatch.setattr("lerobot_dali.dataset_location.HTTP_TIMEOUTS_S", {"sock_connect": 5.0, "sock_read": 0.5})
    if remote_part == "dataset":
        remote = open_dataset(_url(server, root))
    else:
        remote = open_dataset(root, data_files_root=_url(server, root))
    server.stall_s = 3.0
    server.set_faults(1, ("stall",))
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        for pos in range(len(LENGTHS)):
            remote.read_episode(pos)
    assert time.monotonic() - start < 2.5
    assert is_transient(info.value), repr(info.value)
    server.set_faults(0)


def test_a_stalled_read_in_a_batch_names_the_file_it_gave_up_on(root: Path, server, monkeypatch, tmp_path) -> None:
    """fsspec's timeout has no message, and the file that the retries gave up on was only a note on it, which the
    batch's error left out: the loop got "failed with fsspec.exceptions.FSTimeoutError: " and no file."""
    from lerobot_dali.iterator import DALILeRobotIterator

    monkeypatch.setenv(RETRIES_ENV, "0")
    monkeypatch.setattr("lerobot_dali.dataset_location.HTTP_TIMEOUTS_S", {"sock_connect": 5.0, "sock_read": 0.5})
    it = DALILeRobotIterator(_url(server, root), num_workers=0, cache_gb=0.0, **OPTIONS)
    server.stall_s = 3.0
    server.set_faults(1, ("stall",))
    said = r": read failed 1 time\(s\), the last with FSTimeoutError: \(no message\); gave up"
    with pytest.raises(DatasetError, match=rf"^{server.url}/dataset/\S+{said}"):
        next(iter(it))
    server.set_faults(0)
    it.close()


@pytest.mark.parametrize("known_size", [False, True])
def test_a_file_replaced_on_the_server_mid_read_is_named_not_retried(tmp_path: Path, monkeypatch, known_size) -> None:
    """A file that shrank on the server answered 416, which read as a broken connection: retried 6 times, then
    'gave up (set LEROBOT_DALI_REMOTE_RETRIES to retry more)'. The reopened file's new size says what happened.
    Opened with its size known (how the prefetch cache reads gaps, sparing a HEAD), the reopen passed the same
    size again, so the check compared it with itself and every retry was spent on a 'cut short' response."""
    import fsspec

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 400)
    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append))
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http"), policy=RetryPolicy(retries=5, base_delay_s=0.0))
        size = {"size": 102400} if known_size else {}
        with fs.open(f"{server.url}/f.bin", "rb", block_size=1024, **size) as handle:
            assert handle.read(1000) == (bytes(range(256)) * 4)[:1000]
            path.write_bytes(bytes(600))  # replaced by a shorter file
            with pytest.raises(DatasetError, match=r"changed on the server while it was read \(102400 bytes"):
                handle.read(50_000)
    assert len(waits) == 1  # one wait before the reopen that found the new size, then no more tries


def _rewrite_same_size(path: Path, data: bytes | None = None) -> None:
    """``path`` rewritten on the server as ``data`` (by default: the middle half of its bytes inverted), of its size,
    with the ETag and Last-Modified of a file modified a second later."""
    if data is None:
        flipped = bytearray(path.read_bytes())
        quarter = len(flipped) // 4
        flipped[quarter : 3 * quarter] = bytes(b ^ 0xFF for b in flipped[quarter : 3 * quarter])
        data = bytes(flipped)
    assert len(data) == path.stat().st_size
    modified = path.stat().st_mtime_ns + 10**9
    path.write_bytes(data)
    os.utime(path, ns=(modified, modified))


def _still_parsing(path: Path) -> bytes:
    """Another file of ``path``'s size whose bytes still parse where the old file's footer or packet index says:
    a data file with every float negated (same writer: same layout), a video with the second half of each non-key
    packet's bytes inverted."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for name in ("observation.state", "action"):
            column = table.column(name).combine_chunks()
            negated = pa.FixedSizeListArray.from_arrays(pc.negate(column.flatten()), column.type.list_size)
            table = table.set_column(table.column_names.index(name), name, negated)
        out = pa.BufferOutputStream()
        pq.write_table(table, out, compression="snappy")
        return out.getvalue().to_pybytes()
    from lerobot_dali.packet_index import build_packet_index

    data, index = bytearray(path.read_bytes()), build_packet_index(str(path))
    for start, size, key in zip(
        index.byte_offset.tolist(), index.size_bytes.tolist(), index.keyframe.tolist(), strict=True
    ):
        if not key:
            data[start + size // 2 : start + size] = bytes(b ^ 0x55 for b in data[start + size // 2 : start + size])
    return bytes(data)


def _read_across_a_rewrite(
    make_ds,
    tmp_path: Path,
    codec: str,
    decode: str,
    folder: str,
    *,
    parsing: bool = False,
    if_match: bool = True,
    removed: bool = False,
    cache_gb: float = 0.0,
    versions: bool | str = True,
) -> tuple[str, list[dict], list[dict]]:
    """The message a shuffled-off in-process pass over HTTP raised, where the last file of ``folder`` (episode 4's)
    was rewritten to another of its size (``removed``: deleted) after the first batch; the samples before it, and a
    local pass's."""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = tmp_path / "dataset"
    shutil.copytree(_dataset(make_ds, codec), root)
    options = {**OPTIONS, "shuffle": False, "decode": decode}
    local = _samples(DALILeRobotIterator(root, num_workers=0, cache_gb=0.0, **options))
    target = sorted(root.glob(f"{folder}/**/file-002.*"))[-1]
    new = _still_parsing(target) if parsing else None
    remote: list[dict] = []
    with serve_folder(tmp_path) as server:
        server.if_match, server.versions = if_match, versions
        it = DALILeRobotIterator(
            _url(server, root), num_workers=0, cache_gb=cache_gb, cache_dir=tmp_path / "cache", **options
        )
        with pytest.raises(DatasetError) as raised:
            for batch in it:
                remote += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
                if len(remote) == OPTIONS["batch_size"] and removed:
                    target.unlink()
                elif len(remote) == OPTIONS["batch_size"]:
                    _rewrite_same_size(target, new)
        it.close()
    assert str(raised.value).startswith(f"{server.url}/dataset/{target.relative_to(root).as_posix()}")
    return str(raised.value), remote, local


@pytest.mark.parametrize(
    ("codec", "decode", "folder"),
    [("vp9", "auto", "videos"), ("av1", "cpu", "videos"), ("vp9", "cpu", "data")],
    ids=["video-dali", "video-packets", "parquet"],
)
def test_a_file_replaced_by_one_of_its_size_mid_read_is_named_changed_not_corrupt(
    make_ds, tmp_path: Path, codec: str, decode: str, folder: str
) -> None:
    """A file replaced on the server by one of the same size mid-read was not seen as changed (only a size change
    was): its old packet index or parquet footer read the new bytes, and the user was told to mend a healthy file:
    "the video is corrupt: re-encode or re-download it" (DALI's route), "decoding failed ...; the file is corrupt or
    truncated" (the CPU fallback's packets), "is not readable parquet ...; re-download or rewrite it". With a server
    that ignores If-Match, the error path asks for the file's stamp again, and its ETag says it changed. The batches
    before it equal a local read."""
    message, remote, local = _read_across_a_rewrite(
        make_ds, tmp_path, codec, decode, folder, parsing=False, if_match=False
    )
    assert re.search(r"changed on the server while it was read \(etag:\S+ when opened, etag:\S+ now\); re", message)
    assert 0 < len(remote) < len(local)
    _assert_samples_equal(remote, local[: len(remote)])


@pytest.mark.parametrize(
    ("codec", "decode", "folder"),
    [("vp9", "auto", "videos"), ("h264", "cpu", "videos"), ("vp9", "cpu", "data")],
    ids=["video-dali", "video-packets", "parquet"],
)
def test_a_file_replaced_by_one_of_its_size_that_still_parses_is_never_read(
    make_ds, tmp_path: Path, codec: str, decode: str, folder: str
) -> None:
    """New bytes that still parse at the old file's offsets were handed out with no error at all: negated floats as
    the rows of the 2 batches after the rewrite (4 of their values wrong), other pictures as camera frames (DALI's
    VP9 and the CPU fallback's H.264: 2 batches' frames wrong). Reads over HTTP send the stamped ETag as If-Match,
    so the server answers 412, raised as the file's change, and no batch after the rewrite is served."""
    message, remote, local = _read_across_a_rewrite(
        make_ds, tmp_path, codec, decode, folder, parsing=True, if_match=True
    )
    changed = r"changed on the server while it was read \(etag:\S+ when opened, etag:\S+ now: HTTP 412\); re-open"
    assert re.search(changed + " the dataset$", message), message
    assert 0 < len(remote) < len(local)
    _assert_samples_equal(remote, local[: len(remote)])


@pytest.mark.parametrize(
    ("codec", "decode", "folder"), [("vp9", "auto", "videos"), ("vp9", "cpu", "data")], ids=["video-dali", "parquet"]
)
def test_a_file_replaced_by_one_of_its_size_on_a_server_giving_last_modified_alone_is_never_read(
    make_ds, tmp_path: Path, codec: str, decode: str, folder: str
) -> None:
    """A server that gives Last-Modified and no ETag (a stamp ``mtime:...``) was read with no precondition: a file
    replaced by one of its size that still parses was handed out with no error (other pictures as camera frames,
    negated floats as rows), where an ETag's If-Match was answered 412. Reads now send the stamped date as
    If-Unmodified-Since, which the server answers 412 for the newer file, raised as its change."""
    message, remote, local = _read_across_a_rewrite(
        make_ds, tmp_path, codec, decode, folder, parsing=True, versions="last_modified"
    )
    changed = r"changed on the server while it was read \(mtime:[^)]+ when opened, mtime:[^)]+ now: HTTP 412\); re-open"
    assert re.search(changed + " the dataset$", message), message
    assert 0 < len(remote) < len(local)
    _assert_samples_equal(remote, local[: len(remote)])


@pytest.mark.parametrize("cache_gb", [0.0, 1.0], ids=["uncached", "prefetch_cache"])
@pytest.mark.parametrize(
    ("codec", "decode", "folder"),
    [("vp9", "auto", "videos"), ("h264", "cpu", "videos"), ("vp9", "cpu", "data")],
    ids=["video-dali", "video-packets", "parquet"],
)
def test_a_file_removed_from_the_server_mid_run_is_named_removed(
    make_ds, tmp_path: Path, codec: str, decode: str, folder: str, cache_gb: float
) -> None:
    """A data or video file deleted from the server after the dataset was opened (stamped) answered its reads 404,
    raised as aiohttp's bare "ClientResponseError: 404, message='Not Found', url=..." (6 of 6 runs: DALI's VP9 clips,
    the CPU fallback's packets, parquet rows; read directly or through the prefetch cache), which says neither that
    the file was there when the run began nor what to do. It is now the file's change, named with its stamped size;
    the batches before it equal a local read."""
    message, remote, local = _read_across_a_rewrite(
        make_ds, tmp_path, codec, decode, folder, removed=True, cache_gb=cache_gb
    )
    assert re.search(r" changed on the server while it was read \(\d+ bytes when opened, removed now\); re-open the "
                     r"dataset$", message), message  # fmt: skip
    assert 0 < len(remote) < len(local)
    _assert_samples_equal(remote, local[: len(remote)])


@pytest.mark.parametrize(
    ("change", "num_workers", "nested"),
    [
        ("replaced", 0, False),
        ("replaced", 1, False),
        ("removed", 0, False),
        ("removed", 1, False),
        ("replaced", 0, True),
    ],
)
def test_a_union_file_replaced_or_removed_after_the_first_batch_is_named_changed_and_never_read(
    make_ds, tmp_path: Path, monkeypatch, num_workers: int, change: str, nested: bool
) -> None:
    """A union of two HTTP datasets (a query token each: each read through its own filesystem) stamps a video first
    when a reader asks it (plain HTTP lists no folder): the union's copies for the batches (and workers) re-merged its
    datasets' stamps and lost those asked through the union itself, so a video first asked before the run was asked
    again after a rewrite, stamped as the new file, and read with its new ETag as If-Match: 4 of 46 samples (the
    second dataset's last episode) carried another picture's frames, with no error (0 and 1 workers). Its reads ask
    for the version stamped first now: HTTP 412, raised as its change; the batches before it equal a local read. Removed
    instead, its HEAD's 404 was "does not exist on MemberFileSystems; check the dataset's files": it is named removed
    since it was stamped now. ``nested``: the last dataset within a union of the union, whose datasets after its first
    the build surveyed as its first's files (same chunk and file): its files were first stamped as read, after the
    rewrite, and 4 of 69 samples carried the new file's frames, with no error."""
    from lerobot_dali import concat_datasets
    from lerobot_dali.dataset_union import DatasetUnion
    from lerobot_dali.iterator import DALILeRobotIterator

    importable_in_workers(monkeypatch)
    roots = [tmp_path / f"dataset{i}" for i in range(3 if nested else 2)]
    for root in roots:
        shutil.copytree(_dataset(make_ds, "h264"), root)

    def union_of(datasets: list[Path] | list[str]) -> DatasetUnion:
        return concat_datasets([datasets[0], concat_datasets(datasets[1:])] if nested else datasets)

    options = {**OPTIONS, "shuffle": False, "decode": "cpu"}
    local = _samples(DALILeRobotIterator(union_of(roots), num_workers=0, cache_gb=0.0, **options))
    target = sorted(roots[-1].glob("videos/**/file-002.mp4"))[-1]  # (the last dataset's episode 4's, read last)
    new = _still_parsing(target)
    remote: list[dict] = []
    with serve_folder(tmp_path) as server:
        union = union_of([f"{_url(server, root)}?token=t{i}" for i, root in enumerate(roots)])
        it = DALILeRobotIterator(union, num_workers=num_workers, cache_gb=0.0, **options)
        with pytest.raises(DatasetError) as raised:
            for batch in it:
                remote += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
                if len(remote) == OPTIONS["batch_size"]:
                    target.unlink() if change == "removed" else _rewrite_same_size(target, new)
        it.close()
    how = r"\d+ bytes when opened, removed now"
    if change == "replaced":
        how = r"etag:\S+ when opened, etag:\S+ now: HTTP 412"
    changed = rf"file-002\.mp4 changed on the server while it was read \({how}\)"
    assert re.search(changed + "; re-open the dataset$", str(raised.value)), raised.value
    assert 0 < len(remote) < len(local) == len(roots) * sum(LENGTHS)
    _assert_samples_equal(remote, local[: len(remote)])


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_a_file_stamped_through_the_outer_union_is_read_at_that_version_in_a_nested_one(
    make_ds, tmp_path: Path, nested: bool
) -> None:
    """The prefetch cache stamps each file through the union it is given (its stamps: one HEAD) and reads the ranges it
    lacks through the union's filesystem. The union's stamps were pinned (sent as If-Match) on its own datasets'
    filesystems alone, not on those of a union within it: a video first stamped through [HTTP, union(HTTP, HTTP)]
    and replaced on the server by one of its size was read through the cache as the new file (2,115 of its 2,115 bytes
    the new file's, no error), stored under the old file's version. Now HTTP 412, named its change, as a flat union
    of the same datasets raised already."""
    from lerobot_dali import concat_datasets
    from lerobot_dali.cached_filesystem import CachedFileSystem

    roots = [tmp_path / "served" / f"dataset{i}" for i in range(3)]
    for root in roots:
        shutil.copytree(_dataset(make_ds, "h264"), root)
    with serve_folder(tmp_path / "served") as server:
        urls = [f"{_url(server, root)}?token=t{i}" for i, root in enumerate(roots)]
        union = concat_datasets([urls[0], concat_datasets(urls[1:])] if nested else urls)
        video = union.video(union.num_episodes - 1, "observation.images.cam0").path
        cached = CachedFileSystem(union.location.fs, tmp_path / "cache", union.stamps)
        size = cached.size(video)  # (stamped through the union: asked of the server once)
        target = roots[-1] / video.split("/dataset2/", 1)[1]
        _rewrite_same_size(target)
        with pytest.raises(DatasetError, match=r"changed on the server while it was read \(etag:\S+ when opened"):
            cached.cat_file(video, 0, size)


@pytest.mark.parametrize("replaced", [False, True], ids=["unchanged", "replaced"])
@pytest.mark.parametrize("cache_gb", [0.0, 1.0], ids=["uncached", "prefetch_cache"])
@pytest.mark.parametrize("length", ["sent", "dropped"])
@pytest.mark.parametrize("auth", ["token", "headers_and_token"])
def test_a_dataset_read_with_its_options_asks_each_read_for_the_stamped_version_and_no_head(
    make_ds, tmp_path: Path, monkeypatch, auth: str, length: str, cache_gb: float, replaced: bool
) -> None:
    """A dataset opened with storage_options headers and a query token (or the token alone), read uncached or through
    the prefetch cache over connections that drop: each drop reopens the file without its size, which fsspec's open
    asks with the open's arguments. If-Match among them, that HEAD asked for a version too (9 and 14 of a run's 20 and
    23 HEADs, with no headers in the options); with the options' headers too, where the server gave no size
    (Content-Length missing from the first batch on), a TypeError that fsspec reports as FileNotFoundError: each such
    run failed after its first batches (without headers, the file reopened as fsspec's streaming file: 'the server
    sends this file only whole'). Now every run reads all of its samples, equal to a local read, the frames to an
    independent PyAV decode; a video replaced by one of its size mid-run raises its change (HTTP 412), none of its
    samples served; every range GET of a data or video file asks for its ETag, and no HEAD or listing does."""
    from lerobot_dali.iterator import DALILeRobotIterator

    use_fast_retries(monkeypatch)
    root = tmp_path / "dataset"
    shutil.copytree(_dataset(make_ds, "h264"), root)
    options = {**OPTIONS, "shuffle": False, "decode": "cpu", "return_uint8": True}
    local = _samples(DALILeRobotIterator(root, num_workers=0, cache_gb=0.0, **options))
    target = sorted(root.glob("videos/**/file-002.mp4"))[-1]  # (episode 4's, read last)
    new = _still_parsing(target) if replaced else None
    remote: list[dict] = []
    with serve_folder(tmp_path) as server:
        url, storage_options = _url(server, root), {}
        if "headers" in auth:
            server.required_headers = {"Authorization": "Bearer t"}
            storage_options = {"headers": {"Authorization": "Bearer t"}}
        if "token" in auth:
            url += "?token=x"
        reader = open_dataset(url, storage_options=storage_options)
        it = DALILeRobotIterator(reader, num_workers=0, cache_gb=cache_gb, cache_dir=tmp_path / "cache", **options)
        try:
            for batch in it:
                remote += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]
                if len(remote) == OPTIONS["batch_size"]:
                    server.set_faults(4, ("drop",))
                    if length == "dropped":
                        server.content_length = frozenset()
                    if new is not None:
                        _rewrite_same_size(target, new)
        except DatasetError as e:
            raised: DatasetError | None = e
        else:
            raised = None
        finally:
            it.close()
        server.set_faults(0)
        records = server.records
    if replaced:
        assert raised is not None and "file-002.mp4 changed on the server while it was read (" in str(raised), raised
        assert "HTTP 412); re-open the dataset" in str(raised) and 0 < len(remote) < len(local)
        assert {int(s["episode_index"]) for s in remote} <= {0, 1, 2, 3}  # (none of the replaced video's)
        _assert_samples_equal(remote, local[: len(remote)])
    else:
        assert raised is None and len(remote) == len(local) == sum(LENGTHS)
        _assert_samples_equal(local, remote)
    assert_frames_equal_an_independent_decode(_dataset(make_ds, "h264"), remote)  # (the videos as served at open)
    assert server.faults_injected["drop"] > 0
    bulk = [r for r in records if "/data/" in r.path or "/videos/" in r.path]
    assert all(r.if_match is not None for r in bulk if r.method == "GET" and r.range not in (None, _STAMP_ASKED))
    assert [r for r in records if r.method == "HEAD" and r.if_match is not None] == []
    assert [r for r in records if r.range == _STAMP_ASKED and r.if_match is not None] == []
    assert [r for r in records if r.kind == "listing" and r.if_match is not None] == []
    assert [r for r in records if r.kind == "unauthorized"] == []
    if "token" in auth:
        assert {r.query for r in records} == {"token=x"}


@pytest.mark.parametrize("now", [b"", b"abc", b"0123456789AB"], ids=["emptied", "shrank", "grew"])
def test_a_pinned_file_whose_size_changed_before_its_open_is_named_changed(tmp_path: Path, now: bytes) -> None:
    """A stamped file whose server size differs from its stamp's when it is opened: emptied, it was opened with the
    server's size of 0 (no If-Match: no bytes to ask for) and read as b'' with no error (3 requests: 2 HEADs and a
    GET of nothing); shrunk or grown, its GET was answered 412. Each is the file's change now, named by the open's
    HEAD, with no GET."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    file = tmp_path / "f.bin"
    file.write_bytes(b"1234567890")
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=1))
        url = f"{server.url}/f.bin"
        FileStamps(fs)[url]  # (stamped at open: 10 bytes)
        _rewrite_same_size(file)  # (a version of its size first: modified a second later)
        modified = file.stat().st_mtime_ns
        file.write_bytes(now)
        os.utime(file, ns=(modified, modified))
        server.reset_stats()
        changed = rf"f\.bin changed on the server while it was read \(10 bytes when opened, {len(now)} bytes now\); re"
        with pytest.raises(DatasetError, match=changed), fs.open(url, "rb") as handle:
            handle.read()
        assert [(r.method, r.status) for r in server.records] == [("HEAD", 200)]


def _opened_stamped(server: FolderServer, data: bytes, *, block_size: int) -> tuple[RetryingFileSystem, str, Any]:
    """A RetryingFileSystem over ``server`` (5 retries: waits recorded), its ``f.bin`` (``data``) stamped as a
    dataset's open stamps it, opened, and its first 1,000 bytes read."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True))
    url = f"{server.url}/f.bin"
    FileStamps(fs)[url]  # (stamped at open)
    opened = fs.open(url, "rb", block_size=block_size)
    assert opened.read(1000) == data[:1000]
    return fs, url, opened


@contextlib.contextmanager
def _serving_stamped(tmp_path: Path) -> Iterator[tuple[FolderServer, RetryingFileSystem, str, Any]]:
    """A server of ``tmp_path`` holding ``f.bin`` (:data:`_DATA`), and that file stamped and opened as
    :func:`_opened_stamped` does (50,000-byte blocks), the server's statistics reset after."""
    (tmp_path / "f.bin").write_bytes(_DATA)
    with serve_folder(tmp_path) as server:
        fs, url, opened = _opened_stamped(server, _DATA, block_size=50_000)
        server.reset_stats()
        yield server, fs, url, opened


#: The bytes of the served file of :func:`_serving_stamped`.
_DATA = bytes(range(256)) * 400


@pytest.mark.parametrize("gone", ["404", "410"])
@pytest.mark.parametrize("if_match", ["1", "0"], ids=["if_match", "no_if_match"])
def test_a_stamped_file_removed_from_the_server_is_named_removed_by_every_read(
    tmp_path: Path, monkeypatch, slept, if_match: str, gone: str
) -> None:
    """Each read of a stamped file the server no longer has raised its bare 404: aiohttp's ClientResponseError for a
    range read of a file opened before (or with its size), FileNotFoundError for an open's HEAD and for cat_file. Each
    is now the file's removal since it was stamped, once the server asked again after each of the policy's backoffs
    (one ``info`` each: a HEAD, and the GET fsspec makes where it fails) agrees until the retries are spent (here 2),
    with no read more; a 410 (gone for good) at once.
    An absent file never stamped (an optional metadata file) is still FileNotFoundError, asked once, which
    read_if_present answers None. With If-Match on or off (the open's HEAD asked by RetryingFileSystem, or by fsspec's
    open)."""

    from lerobot_dali.dataset_location import read_if_present

    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", if_match)
    monkeypatch.setenv(RETRIES_ENV, "2")
    data = bytes(range(256)) * 400
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        fs, url, opened = _opened_stamped(server, data, block_size=1024)
        if gone == "410":
            server.set_faults(1, ("410",))
        else:
            (tmp_path / "f.bin").unlink()
        server.reset_stats()
        reads = [
            lambda: opened.read(5000),
            lambda: fs.open(url, "rb").read(),
            lambda: fs.open(url, "rb", size=len(data)).read(10),
            lambda: fs.cat_file(url, start=5, end=50),
            lambda: fs.cat_file(url),
        ]
        for read in reads:
            with pytest.raises(DatasetError, match=r"f\.bin changed on the server while it was read \(102400 bytes "
                               r"when opened, removed now\); re-open the dataset$"):  # fmt: skip
                read()
        status = int(gone)
        head_then_get = [("HEAD", status), ("GET", status)]  # (fsspec's info: a GET where the HEAD failed)
        asked_again = head_then_get * 2 if gone == "404" else []
        assert [(r.method, r.status) for r in server.records] == [
            *[("GET", status), *asked_again],
            *[*head_then_get, *asked_again],
            *[("GET", status), *asked_again] * 3,
        ]
        assert len(slept) == (2 * len(reads) if gone == "404" else 0)
        server.set_faults(0)
        slept.clear()
        assert read_if_present(fs, f"{server.url}/meta/absent.json") is None
        with pytest.raises(FileNotFoundError) as absent:
            fs.open(f"{server.url}/absent.bin", "rb")
        assert not isinstance(absent.value, DatasetError)
    assert slept == []


@pytest.mark.parametrize("route", ["read", "cat_file", "open"])
def test_a_stamped_files_passing_404_is_asked_again_and_its_read_goes_on(tmp_path: Path, slept, route: str) -> None:
    """A CDN, or a store that is only eventually consistent, may answer 404 for a while for a file it serves: the first
    404 of a stamped file was taken for its removal ("re-open the dataset"), asking nothing more (3 of 3 routes failed
    on a single 404: a read of an opened file, cat_file, an open). The server is asked once more now (one ``info``: a
    HEAD, after the policy's first backoff) and, giving the file as stamped, the read goes on with the file's bytes: one
    wait and one HEAD more (and a file's reopen, its own HEAD)."""

    data = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        fs, url, opened = _opened_stamped(server, data, block_size=50_000)
        server.reset_stats()
        if route == "read":
            server.fail_next("404")
            assert opened.read(100_000) == data[1000:101_000]
        elif route == "cat_file":
            server.fail_next("404")
            assert fs.cat_file(url, start=5, end=100_005) == data[5:100_005]
        else:
            server.fail_next("404", "404")  # (the open's HEAD, and the GET fsspec's info makes where it failed)
            with fs.open(url, "rb") as again:
                assert again.read() == data
        answers = [(r.method, r.status) for r in server.records]
    missed = [("HEAD", 404), ("GET", 404)] if route == "open" else [("GET", 404)]
    asked_again = [("HEAD", 200)] if route == "cat_file" else [("HEAD", 200), ("HEAD", 200)]  # (+ the reopen's)
    assert answers == [*missed, *asked_again, ("GET", 206)]
    assert len(slept) == 1


@pytest.mark.parametrize("retries", ["5", "0"])
@pytest.mark.parametrize("route", ["read", "cat_file", "open"])
def test_a_stamped_files_404_that_outlasts_one_ask_is_asked_again_within_the_retries(
    tmp_path: Path, monkeypatch, slept, route: str, retries: str
) -> None:
    """A CDN node's stale 404 answers its HEADs too: a stamped file's read answered 404, the server asked again (a HEAD,
    and fsspec's GET where it fails) answered 404 as well, and the read was named the file's removal ("re-open the
    dataset"), the server asked once (3 of 3 routes). Measured over this server with every 2nd/3rd/4th request
    answered 404, 400 threaded cat_file reads each: 81/20/5 named removed. The server is asked again after each
    backoff within the retry budget now, as a 5xx is retried: here the second ask gives the file as stamped, and the
    read goes on with its bytes (two waits). With retries=0 the first 404 is the removal, as before (no wait)."""
    monkeypatch.setenv(RETRIES_ENV, retries)
    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        fs, url, opened = _opened_stamped(server, data, block_size=50_000)
        server.reset_stats()
        missed = ["404", "404"] if route == "open" else ["404"]  # (the open's HEAD, and fsspec's GET where it failed)
        server.fail_next(*missed, "404", "404")  # (the first ask: a HEAD, and fsspec's GET where it failed)
        reads = {
            "read": lambda: (opened.read(100_000), slice(1000, 101_000)),
            "cat_file": lambda: (fs.cat_file(url, start=5, end=100_005), slice(5, 100_005)),
            "open": lambda: (fs.open(url, "rb").read(), slice(None)),
        }
        missed_answers = [(method, 404) for method in (("HEAD", "GET") if route == "open" else ("GET",))]
        if retries == "0":
            with pytest.raises(DatasetError, match=r"f\.bin changed on the server while it was read \(300000 bytes "
                               r"when opened, removed now\); re-open the dataset$"):  # fmt: skip
                reads[route]()
            assert [(r.method, r.status) for r in server.records] == missed_answers
            assert slept == []
            return
        got, span = reads[route]()
        assert got == data[span]
        answers = [(r.method, r.status) for r in server.records]
    reopened = [] if route == "cat_file" else [("HEAD", 200)]  # (a file's reopen asks its size)
    assert answers == [*missed_answers, ("HEAD", 404), ("GET", 404), ("HEAD", 200), *reopened, ("GET", 206)]
    assert len(slept) == 2


@pytest.mark.parametrize("answered", ["412", "404"])
@pytest.mark.parametrize("file", ["kept", "replaced"])
def test_a_stamped_etag_the_server_no_longer_gives_vouches_for_no_read(
    tmp_path: Path, monkeypatch, slept, file: str, answered: str
) -> None:
    """A file stamped with its ETag whose server then sends Last-Modified alone (a CDN or proxy in front of it that
    drops ETags): a read answered 412 to its If-Match (or 404, If-Match off) asked the server again, which gave another
    kind of version, and that was taken for the stamped file: the read went on without If-Match, and a file replaced
    by one of its size meanwhile was read as the stamped one (2 of 2 routes, cat_file and open: the new bytes, no
    error; the kept one with a warning that the server 'still gives' the ETag). A version the server gives no more
    cannot tell the file from one put in its place: named so now ('no etag but mtime:... now'), no byte read."""
    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", "1" if answered == "412" else "0")
    data, other = (np.random.default_rng(seed).integers(0, 256, 100_000, dtype=np.uint8).tobytes() for seed in (1, 2))
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        fs, url, _ = _opened_stamped(server, data, block_size=50_000)
        server.versions = "last_modified"
        if file == "replaced":
            (tmp_path / "f.bin").write_bytes(other)
        server.reset_stats()
        if answered == "404":
            server.fail_next("404", "404")  # (the open's HEAD, and fsspec's GET where it failed)
        why = r"etag:\S+ when opened, no etag but mtime:[^)]+ now" + (": HTTP 412" if answered == "412" else "")
        for read in (lambda: fs.cat_file(url, start=0, end=50_000), lambda: fs.open(url, "rb").read(50_000)):
            with pytest.raises(DatasetError, match=rf"f\.bin changed on the server while it was read \({why}\); "):
                read()
            server.fail_next("404", "404") if answered == "404" else None
        assert not [r for r in server.records if r.status == 206]


@pytest.mark.parametrize("case", ["404_ask_refused", "412_ask_refused", "412_read_refused"])
def test_a_refusal_after_a_stamped_files_404_or_412_is_named_with_what_came_before(
    tmp_path: Path, monkeypatch, slept, case: str
) -> None:
    """A 403 where the server is asked again about a stamped file (its HEAD, sent without If-Match), or to the read
    sent again without If-Match after a 412: a 404 whose asks were refused was named the file's removal ('removed
    now'), which the server never said; a 412 whose ask was refused was named a change without the refusal; a read
    refused once sent without If-Match raised aiohttp's bare 403 (with a note about credentials, nothing of the 412).
    Each is a DatasetError now that says what the server answered."""
    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", "0" if case.startswith("404") else "1")
    monkeypatch.setenv(RETRIES_ENV, "2")
    with _serving_stamped(tmp_path) as (server, fs, url, _):
        if case == "404_ask_refused":
            server.fail_next("404", *["403"] * 4)  # (each ask: a HEAD, and fsspec's GET where it failed)
            said = r": answered 'no such file' \(HTTP 404\), and the server, asked again whether it has the file, " \
                   r"refused it \(HTTP 403\): whether it was removed cannot be told"  # fmt: skip
        elif case == "412_ask_refused":
            server.if_match = "refuse"
            server.fail_next(None, "403", "403")
            said = r" changed on the server while it was read \(its ETag when opened no longer matches: HTTP 412; " \
                   r"asked again, the server refused it \(HTTP 403\)\)"  # fmt: skip
        else:
            server.if_match = "refuse"
            server.fail_next(None, None, "403")  # (the 412, the ask giving the ETag, the read without If-Match)
            said = r": the server answered HTTP 412 to the If-Match of the ETag it gives for the file, then refused " \
                   r"the read sent again without If-Match \(HTTP 403\)"  # fmt: skip
        with pytest.raises(DatasetError, match=rf"f\.bin{said}"):
            fs.cat_file(url, start=0, end=5000)


@pytest.mark.parametrize("case", ["etag_dropped", "no_version", "ask_refused", "ask_unanswered", "replaced"])
def test_a_412_the_server_does_not_confirm_names_the_if_match_variable(
    tmp_path: Path, monkeypatch, slept, case: str
) -> None:
    """A read answered 412 to its If-Match, the server asked again not confirming a change (it gives no ETag now, or
    Last-Modified alone; it refused the ask; it gave no answer) was named a change with "re-open the dataset" alone, 4
    of 4: where the server's If-Match or ETags are unreliable (machines behind a load balancer, a CDN dropping ETags),
    re-opening meets the same 412 again, and the way out, as the warning beside it says, is LEROBOT_DALI_IF_MATCH=0.
    Named now. A change the server confirms (another ETag) names none."""
    monkeypatch.setenv(RETRIES_ENV, "2")
    with _serving_stamped(tmp_path) as (server, fs, url, _):
        unconfirmed = "its ETag when opened no longer matches: HTTP 412; asked again, the server"
        how = {
            "etag_dropped": r"etag:\S+ when opened, no etag but mtime:[^)]+ now: HTTP 412",
            "no_version": r"etag:\S+ when opened, no version now: HTTP 412",
            "ask_refused": rf"{unconfirmed} refused it \(HTTP 403\)",
            "ask_unanswered": "its ETag when opened no longer matches: HTTP 412",
            "replaced": r"etag:\S+ when opened, etag:\S+ now: HTTP 412",
        }[case]
        if case in ("etag_dropped", "no_version"):
            server.versions = "last_modified" if case == "etag_dropped" else False
        elif case == "replaced":
            _rewrite_same_size(tmp_path / "f.bin")
        else:
            server.if_match = "refuse"
            server.fail_next(None, *["403" if case == "ask_refused" else "503"] * 2)  # (the 412, then the ask's two)
        with pytest.raises(DatasetError, match=rf"f\.bin changed on the server while it was read \({how}\); ") as error:
            fs.cat_file(url, start=0, end=5000)
        assert not [r for r in server.records if r.status == 206]
    way_out = "(or, if it did not change and the server's If-Match or ETags are unreliable, set LEROBOT_DALI_IF_MATCH=0"
    assert (way_out in str(error.value)) == (case != "replaced"), str(error.value)


@pytest.mark.parametrize("route", ["cat_file", "read"])
def test_a_412_to_a_read_sent_without_if_match_ends_the_retries(tmp_path: Path, slept, route: str) -> None:
    """A read answered 412 to its If-Match, the server giving the stamped ETag when asked, is sent again without
    If-Match: a server that answers that one 412 too (a precondition of its own, or of a header the storage options
    send) was read and asked again and again, with no wait and no retry budget (measured: 500 reads answered 412 and
    500 asks in a row, until the server's script ran out; here 503s end it, named a change). The second 412 is raised
    now, naming it: 2 reads and 1 ask, no wait."""
    with _serving_stamped(tmp_path) as (server, fs, url, opened):
        server.if_match = "always"
        server.fail_next(*[None] * (3 if route == "cat_file" else 4), *["503"] * 100)  # (ends an endless loop)
        read = (lambda: fs.cat_file(url, start=0, end=5000)) if route == "cat_file" else (lambda: opened.read(60_000))
        with pytest.raises(DatasetError, match=r"f\.bin: the server answered HTTP 412 to the read sent again without "
                           r"If-Match too"):  # fmt: skip
            read()
        answers = [(r.method, r.status, r.if_match is not None) for r in server.records]
    reopened = [] if route == "cat_file" else [("HEAD", 200, False)]  # (a file's reopen asks its size)
    assert answers == [("GET", 412, True), ("HEAD", 200, False), *reopened, ("GET", 412, False)]
    assert slept == []


@pytest.mark.parametrize("ask", ["403", "503", "404"])
def test_a_stamped_files_404_asked_again_logs_no_answer_the_server_did_not_give(
    tmp_path: Path, monkeypatch, slept, caplog, ask: str
) -> None:
    """A stamped file's read answered 404, the server asked again (If-Match off) refusing the ask (403) or giving no
    answer (503), was logged "... and so did the server asked again": a 404 it never sent (fuzzed over a fake server,
    516 of 2,368 such lines). The line now says what is known, whatever the ask's answer; the second ask gives the file
    as stamped and the read goes on with its bytes."""
    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", "0")
    with _serving_stamped(tmp_path) as (server, fs, url, _):
        server.fail_next("404", ask, ask)  # (the read, then the first ask: a HEAD and fsspec's GET where it failed)
        caplog.set_level(logging.INFO, logger="lerobot_dali.remote_retry")
        assert fs.cat_file(url, start=5, end=5000) == _DATA[5:5000]
        answers = [(r.method, r.status) for r in server.records]
    assert answers == [("GET", 404), ("HEAD", int(ask)), ("GET", int(ask)), ("HEAD", 200), ("GET", 206)]
    asked = [r.getMessage() for r in caplog.records if "asking again (retry 1/5)" in r.getMessage()]
    assert len(asked) == 1 and "and so did the server" not in asked[0], asked
    assert asked[0].endswith("did not give it as stamped (it said the same, refused or gave no answer); asking again "
                             "(retry 1/5)"), asked  # fmt: skip


@pytest.mark.parametrize("case", ["unversioned", "no_answer", "no_answer_if_match", "refused_if_match"])
@pytest.mark.parametrize("route", ["read", "cat_file", "open"])
def test_a_stamped_file_answered_404_is_read_on_only_where_nothing_else_can_be_read(
    tmp_path: Path, monkeypatch, slept, route: str, case: str
) -> None:
    """A 404 of a stamped file, then a file of its size put in its place: asked again, the server could not tell them
    apart where it gives no version (no ETag, Last-Modified: the stamp holds the size alone) or gave no answer (503)
    where the read asks for no version (If-Match off): 6 of 6 such reads returned the other file's bytes with no error
    (the 404 was taken as a passing one). The removal is raised as before asking again was added at once where the
    stamp holds no version (1 request, the open's 2; no wait); an unanswered ask without If-Match reads nothing: the
    server is asked again after the next backoff, and names the file put in its place (another ETag). With If-Match
    the retried read asks for the stamped version itself: the file still there is read on, its replacement refused. An
    ask answered 403 (behind fsspec's FileNotFoundError) is no answer either: it was named the removal (3 of 3
    routes)."""

    monkeypatch.setenv("LEROBOT_DALI_IF_MATCH", "0" if case == "no_answer" else "1")
    data, other = (np.random.default_rng(seed).integers(0, 256, 300_000, dtype=np.uint8).tobytes() for seed in (3, 4))
    (tmp_path / "f.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        server.versions = case != "unversioned"
        fs, url, opened = _opened_stamped(server, data, block_size=50_000)
        server.reset_stats()
        missed = ["404", "404"] if route == "open" else ["404"]  # (the open's HEAD, and fsspec's GET where it failed)
        refused = "403" if case == "refused_if_match" else "503"
        unanswered = [] if case == "unversioned" else [refused, refused]  # (the HEAD asking again, fsspec's GET)
        server.fail_next(*missed, *unanswered)
        reads = {
            "read": lambda: (opened.read(100_000), slice(1000, 101_000)),
            "cat_file": lambda: (fs.cat_file(url, start=5, end=100_005), slice(5, 100_005)),
            "open": lambda: (fs.open(url, "rb").read(), slice(None)),
        }
        if case.endswith("_if_match"):
            got, span = reads[route]()
            assert got == data[span]  # (its retry asked for the stamped ETag: the file's bytes, or a 412)
        else:
            (tmp_path / "f.bin").write_bytes(other)
            replaced = r"etag:\S+ when opened, etag:\S+ now"  # (asked again: the file put in its place)
            how = replaced if case == "no_answer" else "300000 bytes when opened, removed now"
            with pytest.raises(DatasetError, match=rf"f\.bin changed on the server while it was read \({how}\); "
                               r"re-open the dataset$"):  # fmt: skip
                reads[route]()
            answers = [(r.method, r.status) for r in server.records]
            asked_again = [("HEAD", 503), ("GET", 503), ("HEAD", 200)] if case == "no_answer" else []
            assert answers == [*([("HEAD", 404), ("GET", 404)] if route == "open" else [("GET", 404)]), *asked_again]
            assert len(slept) == (2 if case == "no_answer" else 0)


@pytest.mark.parametrize("between", ["404", "503"])
def test_a_stamped_file_whose_reads_keep_answering_404_while_the_server_gives_it_is_not_named_removed(
    tmp_path: Path, slept, caplog, between: str
) -> None:
    """A server whose reads (GET) of a file answer 404 while its HEAD gives the file as stamped (a CDN's cached 404, an
    origin's reads and metadata served apart): the server was asked after each 404 and gave the file each time, yet the
    read gave up saying "removed now", and the retries were logged at INFO alone (3 GETs, 2 HEADs, 2 waits with 2
    retries; 6, 5 and 12.7 s with the default 5). It now names what was answered, and from the second retry on logs a
    warning, as for other failures. A 503 between two 404s was counted a 404 ("3 times" for 2): its 404s alone now."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 40)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        url = f"{server.url}/f.bin"
        FileStamps(fs)[url]  # (stamped at open)
        server.reset_stats()
        # (the GETs; the HEADs asking again after a 404 answered as is)
        server.fail_next("404", None, *([between, None] if between == "404" else [between]), "404")
        caplog.set_level(logging.INFO, logger="lerobot_dali.remote_retry")
        missed = 3 if between == "404" else 2
        gave_up = rf"f\.bin: answered 'no such file' \(HTTP 404\) {missed} times, while the server, asked after each,"
        gave_up += r" never said it was gone \(it gave the file as stamped"
        with pytest.raises(DatasetError, match=gave_up) as failed:
            fs.cat_file(url, start=0, end=10)
        assert "removed" not in str(failed.value)
        answered = [("GET", 404), ("HEAD", 200), ("GET", int(between)), *([("HEAD", 200)] if between == "404" else [])]
        assert [(r.method, r.status) for r in server.records] == [*answered, ("GET", 404)]
        assert len(slept) == 2
        asked = [r.levelno for r in caplog.records if "does not say it is gone" in r.getMessage()]
        assert asked == [logging.INFO, logging.WARNING][: missed - 1]


@pytest.mark.parametrize("content_length", ["GET HEAD", "GET", "HEAD", ""], ids=["sent", "get", "head", "none"])
@pytest.mark.parametrize("headers", [False, True], ids=["no_headers", "headers"])
def test_a_pinned_file_is_read_at_its_stamped_version_by_every_route(
    tmp_path: Path, monkeypatch, content_length: str, headers: bool
) -> None:
    """Every read of a stamped file over HTTP (opened with or without its size, read in ranges or whole, cat_file of a
    range or the whole) sends its ETag as If-Match, and the HEADs asking its size none, whether or not the server gives
    a Content-Length (here from the stamp on: ``content_length`` names the methods that still give it): a file opened
    without its size made fsspec ask info with the open's arguments, If-Match among them (the HEAD, and the GET fsspec
    makes where a HEAD gives no size, asked for a version), and where the options hold headers and the server gives no
    size, or the file is empty, a TypeError it reports as FileNotFoundError. The same file replaced by one of its size
    is refused by each route as its change."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=lambda s: None))
    data = np.random.default_rng(7).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    (tmp_path / "empty.bin").write_bytes(b"")
    options = {"headers": {"Authorization": "Bearer t"}} if headers else {}
    with serve_folder(tmp_path) as server:
        server.required_headers = options.get("headers", {})
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True, **options), policy=RetryPolicy(2))
        url, empty = f"{server.url}/f.bin", f"{server.url}/empty.bin"
        stamps = FileStamps(fs)
        stamps[url], stamps[empty]  # (stamped while the server gave sizes)
        server.content_length = frozenset(content_length.split())

        def reads() -> list[bytes]:
            with fs.open(url, "rb", block_size=50_000) as f:
                f.seek(120_000)
                part = f.read(70_000)
            with fs.open(url, "rb") as f, fs.open(empty, "rb") as e:
                whole, nothing = f.read(), e.read()
            return [part, whole, nothing, fs.cat_file(url, start=5, end=100_005), fs.cat_file(url)]

        assert reads() == [data[120_000:190_000], data, b"", data[5:100_005], data]

        def opened_and_read() -> bytes:
            with fs.open(url, "rb") as f:
                return bytes(f.read(10))

        _rewrite_same_size(tmp_path / "f.bin")
        for read in (opened_and_read, lambda: fs.cat_file(url, start=0, end=10), lambda: fs.cat_file(url)):
            with pytest.raises(DatasetError, match=r"f\.bin changed on the server while it was read \(.*HTTP 412\)"):
                read()
        records = server.records
    assert [r for r in records if r.method == "HEAD" and r.if_match is not None] == []
    gets = [r for r in records if r.method == "GET" and r.path == "/f.bin" and r.range != _STAMP_ASKED]
    assert all(r.if_match is not None for r in gets if r.range is not None) and gets
    assert [r for r in records if r.range == _STAMP_ASKED and r.if_match is not None] == []
    assert server.counts[("GET", "precondition")] == 3 and server.counts[("GET", "unauthorized")] == 0


class _SleepsRecorded:
    """A stand-in for the ``time`` module whose ``sleep`` records the wait instead."""

    def __init__(self, waits: list[float]) -> None:
        self.waits = waits

    def __getattr__(self, name: str):
        import time

        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def _hub_file_served(tmp_path: Path, monkeypatch, commit: str, *, seed: int, waits: list[float]) -> bytes:
    """300,000 random bytes served as dataset ``user/ds``'s ``f.bin`` at ``commit`` under ``tmp_path`` (the folder a
    :func:`serve_folder` serves as HfFileSystem's endpoint), the Hub's repo check and ``info`` answered here, and the
    loader's retry waits recorded in ``waits``."""
    from huggingface_hub import HfFileSystem

    data = np.random.default_rng(seed).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    served = tmp_path / "datasets" / "user" / "ds" / "resolve" / commit / "f.bin"
    served.parent.mkdir(parents=True)
    served.write_bytes(data)
    monkeypatch.setattr("lerobot_dali.remote_retry.time", _SleepsRecorded(waits))
    monkeypatch.setattr(HfFileSystem, "_repo_and_revision_exist", lambda self, *args, **kwargs: (True, None))
    monkeypatch.setattr(HfFileSystem, "info", lambda self, path, **kwargs: {"name": path, "size": len(data),
                                                                             "type": "file"})  # fmt: skip
    return data


@pytest.mark.parametrize("fault", ["503", "429", "drop"])
@pytest.mark.parametrize("whole", [False, True])
def test_a_hub_file_block_is_asked_once_per_try(tmp_path: Path, monkeypatch, fault: str, whole: bool) -> None:
    """huggingface_hub's HfFileSystemFile fetched each block through its own http_backoff (6 tries, 1 to 8 s apart),
    inside each of the loader's tries: a block of a Hub dataset that kept failing was asked 18 times with 2 retries
    (36 with the default 5, ~150 s of waits), and LEROBOT_DALI_REMOTE_RETRIES=0 still tried 6 times. HfFileSystem
    talks to this server as its endpoint (its resolve URLs are the served folder's paths)."""
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    waits: list[float] = []
    monkeypatch.setattr(hub_http, "time", _SleepsRecorded(waits))  # (the Hub's own waits, on the old code)
    data = _hub_file_served(tmp_path, monkeypatch, commit, seed=5, waits=waits)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=2))
        with fs.open(f"datasets/user/ds@{commit}/f.bin", "rb", block_size=100_000) as handle:
            server.set_faults(1, (fault,))
            handle.seek(0 if whole else 200_000)
            with pytest.raises(Exception) as info:
                handle.read() if whole else handle.read(10)
            assert is_transient(info.value), repr(info.value)
            gets = [r for r in server.records if r.method == "GET"]
            assert len(gets) == 3, [(r.status, r.range) for r in gets]  # 1 try + 2 retries
            assert len(waits) == 2
            server.set_faults(0)
            assert (handle.read() if whole else handle.read(10)) == (data if whole else data[200_000:200_010])


def test_a_hub_file_block_trickled_fails_at_the_deadline_of_a_plain_http_read(tmp_path: Path, monkeypatch) -> None:
    """huggingface_hub's timeout (HF_HUB_DOWNLOAD_TIMEOUT) is httpx's read timeout, restarted at each chunk: a Hub
    endpoint trickling a block held its read for ever, where a plain HTTP(S) server's fails at its deadline. The
    block is streamed now and fails at the same deadline (here 0.6 s) as a timeout, retried, then named."""
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    waits: list[float] = []
    data = _hub_file_served(tmp_path, monkeypatch, commit, seed=7, waits=waits)
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_DEADLINE_BASE_S", 0.6)
    monkeypatch.setattr("lerobot_dali.request_checks.HTTP_MIN_BYTES_PER_S", 10**12)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=1))
        path = f"datasets/user/ds@{commit}/f.bin"
        with fs.open(path, "rb", block_size=1000) as handle:
            server.stall_s = 0.05
            server.fault_paths = {"/f.bin": "trickle"}
            handle.seek(200_000)
            with pytest.raises(RemoteFileError) as info:
                handle.read(10)
            server.fault_paths = {}
            assert handle.read(10) == data[200_000:200_010]  # (the next read, answered as it is)
    assert re.match(
        rf"{re.escape(path)}: read failed 2 time\(s\), the last with TimeoutError: {re.escape(path)}: bytes "
        r"\[200000, 201010\) not received within the deadline of 0.6 s",
        str(info.value),
    ), str(info.value)
    assert len(waits) == 1


def test_a_hub_range_is_asked_alone_and_once_per_try(tmp_path: Path, monkeypatch) -> None:
    """HfFileSystem has no cat_file of its own: fsspec's opened the file with its read-ahead and read through
    huggingface_hub's own fetch, so a range the prefetcher asked of a Hub video (10 bytes here) asked for the rest of
    the file with it (299,000 bytes; 5 MB past it on a larger file), in 6 tries of huggingface_hub's policy whatever
    LEROBOT_DALI_REMOTE_RETRIES says. Now one request for the range alone per try of the loader's policy."""
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    waits: list[float] = []
    monkeypatch.setattr(hub_http, "time", _SleepsRecorded(waits))  # (the Hub's own waits, on the old code)
    data = _hub_file_served(tmp_path, monkeypatch, commit, seed=8, waits=waits)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=2))
        path = f"datasets/user/ds@{commit}/f.bin"
        assert fs.cat_file(path, start=1000, end=1010) == data[1000:1010]
        assert fs.cat_file(path, start=-10) == data[-10:] and fs.cat_file(path) == data
        assert [(r.range, r.sent_bytes) for r in server.records if r.method == "GET"] == [
            ("bytes=1000-1009", 10), ("bytes=299990-299999", 10), ("bytes=0-299999", 300_000)
        ]  # fmt: skip
        server.reset_stats()
        server.set_faults(1, ("503",))
        with pytest.raises(RemoteFileError) as info:
            fs.cat_file(path, start=1000, end=1010)
        server.set_faults(0)
        assert len([r for r in server.records if r.method == "GET"]) == 3 and len(waits) == 2  # 1 try + 2 retries
    assert str(info.value).startswith(f"{path}: cat_file failed 3 time(s), the last with HfHubHTTPError: "), info.value


def test_a_hub_range_with_bounds_past_the_files_ends_is_clipped_to_it(tmp_path: Path, monkeypatch) -> None:
    """Bounds of a Hub range before the file's start (both from its end, the first larger than its size) or past its
    end read as a slice of the file does, and the request asks for no byte past its end."""
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    data = _hub_file_served(tmp_path, monkeypatch, commit, seed=10, waits=[])
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=0))
        path = f"datasets/user/ds@{commit}/f.bin"
        assert fs.cat_file(path, start=-400_000, end=-299_990) == data[:10]  # (both from its end: no size asked)
        assert fs.cat_file(path, start=299_990, end=400_000) == data[299_990:]
        assert [r.range for r in server.records if r.method == "GET"] == ["bytes=0-9", "bytes=299990-299999"]


def test_a_hub_file_block_answered_whole_is_named_not_retried(tmp_path: Path, monkeypatch) -> None:
    """A Hub block answered with the whole file (200: a Range ignored on the way) read as a response cut short: retried
    with the policy's waits, then "asked for bytes [...] and received N bytes". It is the Range's refusal, named with
    the fix at once, as over plain HTTP."""
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    waits: list[float] = []
    _hub_file_served(tmp_path, monkeypatch, commit, seed=6, waits=waits)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=2))
        with fs.open(f"datasets/user/ds@{commit}/f.bin", "rb", block_size=100_000) as handle:
            server.set_faults(1, ("no_range",))
            handle.seek(200_000)
            with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request"):
                handle.read(10)
            assert waits == [] and len([r for r in server.records if r.method == "GET"]) == 1


def test_a_hub_range_answered_whole_is_read_no_further_than_the_bytes_asked(tmp_path: Path, monkeypatch) -> None:
    """A Hub range answered with the whole file (200: its Range ignored on the way) was read to its end before it was
    named: 10 bytes asked of a 32 MiB file took all 32 MiB (of a video, its GBs, in memory). The answer is read no
    further than the bytes asked, as fsspec's plain HTTP reads it, then named."""
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    _hub_file_served(tmp_path, monkeypatch, commit, seed=9, waits=[])
    size = 32 * 2**20
    (tmp_path / "datasets" / "user" / "ds" / "resolve" / commit / "f.bin").write_bytes(bytes(size))
    monkeypatch.setattr(HfFileSystem, "info", lambda self, path, **kwargs: {"name": path, "size": size,
                                                                             "type": "file"})  # fmt: skip
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=2))
        server.fault_paths = {"/f.bin": "no_range"}
        with pytest.raises(DatasetError, match=r"f\.bin: the server ignored an HTTP Range request"):
            fs.cat_file(f"datasets/user/ds@{commit}/f.bin", start=1000, end=1010)
        [sent] = [r.sent_bytes for r in server.records if r.method == "GET"]
    assert sent < size // 2, sent  # (what the sockets' buffers took before the client hung up)


@pytest.mark.parametrize("route", ["read", "cat_file"])
def test_a_hub_file_answered_404_is_a_missing_data_file_naming_it(tmp_path: Path, monkeypatch, route: str) -> None:
    """A Hub file answered 404 (gone from the repo at the commit read, the revision wrong) reached the user as
    huggingface_hub's raw HfHubHTTPError ("Client error '404 Not Found' for url ..."), neither FileNotFoundError nor
    the package's, by both routes: a plain HTTP(S) file's absence is FileNotFoundError naming its URL (fsspec's), which
    the reader names as the missing file. Now it is MissingDataFileError naming the path read, the status (its
    ``status`` too) and what to do, not retried; a plain HTTP(S) file opened with its size and answered 404 at its
    read (aiohttp's raw ClientResponseError before) too."""
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    waits: list[float] = []
    data = _hub_file_served(tmp_path, monkeypatch, commit, seed=9, waits=waits)
    (tmp_path / "plain.bin").write_bytes(data)
    with serve_folder(tmp_path) as server:
        hub = RetryingFileSystem(HfFileSystem(endpoint=server.url, token=False), policy=RetryPolicy(retries=2))
        plain = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=2))
        server.fault_paths = {".bin": "404"}
        for fs, path in ((hub, f"datasets/user/ds@{commit}/f.bin"), (plain, f"{server.url}/plain.bin")):
            server.reset_stats()
            with pytest.raises(FileNotFoundError) as info:
                if route == "read":
                    with fs.open(path, "rb", block_size=100_000, size=len(data)) as handle:
                        handle.read(10)
                else:
                    fs.cat_file(path, start=10, end=20)
            assert [r.status for r in server.records if r.method == "GET"] == [404] and waits == []
            if fs is plain and route == "cat_file":  # (fsspec's own, as before)
                assert str(info.value) == path and type(info.value) is FileNotFoundError
                continue
            assert str(info.value) == (
                f"{path}: the server has no such file (HTTP 404): check the revision (branch, tag or commit) or URL "
                "the dataset is read at, and that the file is there: upload or copy it again where it was removed, or "
                "leave out the episodes it holds (episodes=[...] of the others)"
            )
            assert isinstance(info.value, MissingDataFileError) and status_of(info.value.__cause__) == 404
            assert info.value.status == 404  # (as a RemoteFileError's: it had none, the 404 in its message alone)


def _served_hub_dataset(folder: Path, commit: str, files: dict[str, int]) -> None:
    """What the Hub's API answers HfFileSystem for dataset ``user/ds`` at ``commit``: its ``repo_info``, and the
    ``tree`` of its folder ``data`` holding ``files`` (name -> size), served as files under ``folder``."""
    import json

    api = folder / "api" / "datasets" / "user" / "ds"
    (api / "revision").mkdir(parents=True)
    (api / "revision" / commit).write_text(json.dumps({"id": "user/ds", "sha": commit}))
    (api / "tree" / commit).mkdir(parents=True)
    entries = [{"type": "file", "path": f"data/{name}", "size": size, "oid": f"{i:040x}"}
               for i, (name, size) in enumerate(files.items())]  # fmt: skip
    (api / "tree" / commit / "data").write_text(json.dumps(entries))


@pytest.mark.parametrize("call", ["find", "ls", "info"])
@pytest.mark.parametrize("fault", ["503", "429"])
def test_a_hub_listing_is_retried_by_one_policy(tmp_path: Path, monkeypatch, fault: str, call: str) -> None:
    """huggingface_hub retries its tree requests itself (http_backoff: 6 tries, 1 to 8 s apart), and the loader's
    retries redid each listing (find, ls, and info, which lists the parent folder) on top: a listing of a Hub dataset
    that kept answering 503 or 429 cost 18 requests with 2 retries (36 with the default 5, ~2.5 minutes of waits
    without Retry-After). The Hub's 6 tries are its one policy now: 6 requests, none of the loader's waits. One failed
    answer costs the Hub's one retry, the listing right; a request the Hub does not retry (repo_info, which resolving
    a path asks once per filesystem) is still the loader's to retry. HfFileSystem talks to this server as its endpoint
    (the Hub API's answers are served files)."""
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub import HfFileSystem

    commit = "c0ffee" * 6 + "c0ff"
    files = {"episode_000000.parquet": 1234, "episode_000001.parquet": 5678}
    _served_hub_dataset(tmp_path, commit, files)
    hub_waits: list[float] = []
    waits: list[float] = []
    monkeypatch.setattr(hub_http, "time", _SleepsRecorded(hub_waits))
    monkeypatch.setattr("lerobot_dali.remote_retry.time", _SleepsRecorded(waits))
    root = f"datasets/user/ds@{commit}"
    folder = f"{root}/data"
    expected = {f"{folder}/{name}": size for name, size in files.items()}

    def listing(fs: RetryingFileSystem) -> dict[str, int]:
        if call == "find":
            return {name: info["size"] for name, info in fs.find(folder, detail=True).items()}
        if call == "ls":
            return {info["name"]: info["size"] for info in fs.ls(folder, detail=True)}
        return {path: fs.info(path)["size"] for path in expected}

    with serve_folder(tmp_path) as server:

        def hub() -> RetryingFileSystem:
            inner = HfFileSystem(endpoint=server.url, token=False, skip_instance_cache=True)
            return RetryingFileSystem(inner, policy=RetryPolicy(retries=2))

        def asked() -> list[tuple[str, int]]:  # (the API asked, and its answer)
            return [(r.path.split("/")[5], r.status) for r in server.records]

        fs = hub()
        assert fs.info(root)["type"] == "directory"  # (its repo_info)
        server.reset_stats()
        server.set_faults(1, (fault,))
        with pytest.raises(Exception) as failed:
            listing(fs)
        assert is_transient(failed.value), repr(failed.value)
        hub_error = failed.value.__cause__  # (RemoteFileError's: the Hub's error, raised from httpx's)
        assert type(hub_error.__cause__).__name__ == "HTTPStatusError", repr(failed.value)
        assert asked() == [("tree", int(fault))] * 6
        assert (len(hub_waits), waits) == (5, [])
        server.set_faults(0)
        server.reset_stats()
        hub_waits.clear()
        server.fail_next(fault)
        assert listing(fs) == expected
        assert asked() == [("tree", int(fault)), ("tree", 200)]
        assert (len(hub_waits), waits) == (1, [])
        fs = hub()
        server.reset_stats()
        hub_waits.clear()
        server.fail_next(fault)
        assert listing(fs) == expected
        assert asked() == [("revision", int(fault)), ("revision", 200), ("tree", 200)]
        assert (hub_waits, len(waits)) == ([], 1)


@pytest.mark.parametrize(
    ("if_match", "how"),
    [(False, r"etag:\S+ when opened, etag:\S+ now"), (True, r"etag:\S+ when opened, etag:\S+ now: HTTP 412")],
)
def test_a_check_lists_a_video_replaced_by_one_of_its_size_as_changed_not_corrupt(
    make_ds, tmp_path: Path, monkeypatch, if_match: bool, how: str
) -> None:
    """``lerobot-dali check --decode`` of a remote dataset decodes each video with PyAV on the remote file: one
    replaced on the server by one of its size between its indexing and its decode was listed as a VideoDecodeError,
    "cannot open the video (...); the file is truncated or corrupt", for a file that is whole. A server that keeps
    If-Match refuses the read; one that ignores it serves the new bytes, and the failed decode asks for the stamp."""
    from lerobot_dali import dataset_check

    root = tmp_path / "dataset"
    shutil.copytree(_dataset(make_ds, "vp9"), root)
    target = sorted(root.glob("videos/**/file-002.mp4"))[-1]  # (episode 4's, alone in it)
    decode_video = dataset_check._EpisodeChecker._decode_video
    swapped: list[str] = []

    def replaced_first(self, pos, video, index, frames, done, **options):  # type: ignore[no-untyped-def]
        if video.path.endswith(target.relative_to(tmp_path).as_posix()) and not swapped:
            swapped.append(video.path)
            _rewrite_same_size(target)
        return decode_video(self, pos, video, index, frames, done, **options)

    monkeypatch.setattr(dataset_check._EpisodeChecker, "_decode_video", replaced_first)
    with serve_folder(tmp_path) as server:
        server.if_match = if_match
        report = dataset_check.check_dataset(open_dataset(_url(server, root)), decode=True, workers=0)
    assert [(p.episode_index, p.camera, p.error) for p in report.problems] == [
        (4, "observation.images.cam1", "DatasetError")
    ]
    changed = rf"file-002.mp4 changed on the server while it was read \({how}\); re-open the dataset$"
    assert re.search(changed, report.problems[0].message), report.problems[0].message


def test_reads_over_http_ask_for_the_stamped_strong_etag_keeping_the_options_headers() -> None:
    """Only a strong ETag is sent as If-Match (a weak one never matches it: every read would fail), only over HTTP,
    and a request's headers replace the filesystem's: the headers storage_options give (a token) must stay."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamp

    fs = RetryingFileSystem(fsspec.filesystem("http", headers={"Authorization": "Bearer t"}, skip_instance_cache=True))
    fs.pin({"http://h/s": FileStamp(3, "etag:abc"), "http://h/w": FileStamp(3, 'etag:W/"abc'),
            "http://h/m": FileStamp(3, "mtime:Mon")})  # fmt: skip
    assert fs._pinned("http://h/s", {"size": 3}) == {
        "size": 3,
        "headers": {"Authorization": "Bearer t", "If-Match": '"abc"'},
    }
    assert [fs._pinned(p, {}) for p in ("http://h/w", "http://h/m", "http://h/unstamped")] == [{}, {}, {}]
    local = RetryingFileSystem(fsspec.filesystem("memory"))
    local.pin({"/s": FileStamp(3, "etag:abc")})
    assert local._pinned("/s", {}) == {}


def test_if_match_is_turned_off_by_its_environment_variable(monkeypatch) -> None:
    """LEROBOT_DALI_IF_MATCH=0 sends none (a server whose machines give one file different ETags answers 412 to
    reads that re-opening cannot mend); another value is refused naming the two it takes."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamp
    from lerobot_dali.retry_policy import IF_MATCH_ENV

    fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True))
    fs.pin({"http://h/s": FileStamp(3, "etag:abc")})
    monkeypatch.setenv(IF_MATCH_ENV, "0")
    assert fs._pinned("http://h/s", {"size": 3}) == {"size": 3}
    monkeypatch.setenv(IF_MATCH_ENV, "1")
    assert fs._pinned("http://h/s", {})["headers"] == {"If-Match": '"abc"'}
    monkeypatch.setenv(IF_MATCH_ENV, "no")
    with pytest.raises(ValueError, match=r"LEROBOT_DALI_IF_MATCH=.no.: set it to 1 .* or 0 "):
        fs._pinned("http://h/s", {})


def test_stamps_pinned_on_one_filesystem_by_several_each_keep_their_files_if_match(tmp_path: Path) -> None:
    """A union's merged stamps pin themselves on its first dataset's filesystem, where that dataset's own stamps
    were pinned: a file the dataset's own stamps stamped after the merge (one not checked at open, stamped when
    first read) was read with no If-Match (2 of 2 such files before; 0 now), and a worker's copy sent it or not
    as the stamps happened to be unpickled. Each pinned mapping keeps its files' If-Match, the newest first."""
    import pickle

    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    for name in ("early", "late", "other"):
        (tmp_path / name).write_bytes(name.encode())
    with serve_folder(tmp_path) as server:
        url = f"{server.url}/{{}}".format
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True))
        own, other = FileStamps(fs), FileStamps(RetryingFileSystem(fsspec.filesystem("http")))
        own[url("early")], other[url("other")]  # (stamped before the merge)
        merged = FileStamps.merged([own, other])
        own[url("late")]  # (stamped after it, by the dataset's own stamps)
        stamped = {"early": own, "late": own, "other": other}
        sent = {name: fs._pinned(url(name), {}).get("headers", {}).get("If-Match") for name in stamped}
        assert sent == {name: f'"{s[url(name)].version.removeprefix("etag:")}"' for name, s in stamped.items()}
        copied_own, copied_merged = pickle.loads(pickle.dumps((own, merged)))  # (a worker's: one filesystem)
        assert copied_own.fs is copied_merged.fs
        assert copied_own.fs._pinned(url("late"), {})["headers"]["If-Match"] == sent["late"]
        assert copied_merged.fs._pinned(url("other"), {})["headers"]["If-Match"] == sent["other"]


def test_a_server_whose_if_match_disagrees_with_its_etags_is_read_without_it(
    root: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server answering 412 to the If-Match of the very ETag its HEAD still gives (one that redirects reads to
    another host with other ETags, machines behind a load balancer) was reported as the file's change on the server,
    'changed ... while it was read ...; re-open the dataset', for a file that never changed, which re-opening cannot
    mend (1 of 1 episodes read). The 412 now asks for the stamp again, and where it is unchanged the filesystem
    reads on without If-Match, as before it sent any (said once): the rows equal the local ones."""
    from lerobot_dali.retry_policy import IF_MATCH_ENV

    with serve_folder(root.parent) as server:
        server.if_match = "refuse"
        with caplog.at_level(logging.WARNING, logger="lerobot_dali.remote_retry"):
            rows = open_dataset(_url(server, root)).read_episode(0)
    said = [r.getMessage() for r in caplog.records if "If-Match" in r.getMessage()]
    assert len(said) == 1 and "disagrees with its own ETags" in said[0] and f"{IF_MATCH_ENV}=0" in said[0], said
    local = open_dataset(root).read_episode(0)
    assert rows.keys() == local.keys()
    for key, values in local.items():
        np.testing.assert_array_equal(rows[key], values)


def test_a_union_file_rewritten_unreadable_without_if_match_is_named_changed(
    make_ds, tmp_path: Path, monkeypatch
) -> None:
    """With If-Match off (LEROBOT_DALI_IF_MATCH=0: a server whose If-Match disagrees with its ETags), a union's video
    rewritten on the server by bytes of its size that no longer decode is found changed only on the error path, which
    asks the file's stamp anew. Over plain HTTP a video is stamped when first read, through the union: its datasets'
    own stamps never held it, and the union asked them, so the failure was called a corrupt video (re-download it),
    not a change (re-open the dataset)."""
    from lerobot_dali import concat_datasets
    from lerobot_dali.iterator import DALILeRobotIterator
    from lerobot_dali.retry_policy import IF_MATCH_ENV

    monkeypatch.setenv(IF_MATCH_ENV, "0")
    roots = [tmp_path / f"dataset{i}" for i in range(2)]
    for root in roots:
        shutil.copytree(_dataset(make_ds, "h264"), root)
    options = {**OPTIONS, "shuffle": False, "decode": "cpu"}
    target = sorted(roots[1].glob("videos/**/file-002.mp4"))[-1]  # (the second dataset's episode 4's, read last)
    read = 0
    with serve_folder(tmp_path) as server:
        union = concat_datasets([f"{_url(server, root)}?token=t{i}" for i, root in enumerate(roots)])
        it = DALILeRobotIterator(union, num_workers=0, cache_gb=0.0, **options)
        with pytest.raises(DatasetError) as raised:
            for batch in it:
                read += len(batch["index"])
                if read == OPTIONS["batch_size"]:
                    _rewrite_same_size(target)
        it.close()
    changed = r"file-002\.mp4 changed on the server while it was read \(etag:\S+ when opened, etag:\S+ now\)"
    assert re.search(changed, str(raised.value)), raised.value


@pytest.mark.parametrize("case", ["unchanged", "rewritten", "etag_dropped", "told_nothing"])
def test_a_stamp_asked_again_of_a_server_that_gives_no_content_length_uses_what_it_says(
    tmp_path: Path, slept, case: str
) -> None:
    """A stamped file asked again (``FileStamps.change_now``: a 412 to its If-Match, a 404) where the server's HEAD and
    GET give no Content-Length raised "reports no size" (4 of 4 cases), taken as no answer: a file rewritten was named
    "its ETag when opened no longer matches" (the new ETag unsaid, with the If-Match hint), one unchanged could not be
    vouched for. Its first byte is asked now (a ranged GET: Content-Range's size, and the ETag or Last-Modified it
    gives); a server that tells neither size nor version is said so."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps

    (tmp_path / "f.bin").write_bytes(_DATA)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(2))
        url = f"{server.url}/f.bin"
        stamps = FileStamps(fs)
        before = stamps[url].version
        server.content_length = frozenset()
        if case == "rewritten":
            _rewrite_same_size(tmp_path / "f.bin")
        server.versions = {"etag_dropped": "last_modified", "told_nothing": False}.get(case, True)
        server.reset_stats()
        if case == "told_nothing":
            from lerobot_dali.remote_errors import StampUntold

            server.fail_next(None, None, "no_range")  # (the HEAD, fsspec's GET, the ranged GET: whole, no size)
            with pytest.raises(StampUntold, match=r"f\.bin: the server, asked for the file's stamp, gave neither"):
                stamps.change_now(url, vouching=True)
            return
        change = stamps.change_now(url, vouching=True)
        # (among the requests, not last: the server records each as its answer ends, and fsspec's plain GET, read
        # for its headers alone, can end after the ranged GET asked after it)
        assert ("GET", "bytes=0-0") in [(r.method, r.range) for r in server.records]
        if case == "unchanged":
            assert change is None
            assert fs.cat_file(url, start=5, end=5000) == _DATA[5:5000]
        elif case == "etag_dropped":
            assert change is not None and change[0] == before and change[1].startswith("no etag but mtime:")
        else:
            assert change is not None and change[0] == before and change[1].startswith("etag:") and change[1] != before
            with pytest.raises(DatasetError, match=rf"f\.bin changed on the server while it was read \({before} when "
                               r"opened, etag:\S+ now: HTTP 412\); re-open the dataset$"):  # fmt: skip
                fs.cat_file(url, start=0, end=10)


def test_a_stamp_asked_again_takes_no_size_from_an_encoded_length_or_a_whole_answers_content_range(
    tmp_path: Path, slept
) -> None:
    """A server that compresses what it sends whatever the Accept-Encoding asked gives the Content-Length of the
    encoded body: no size of the file (fsspec's info leaves it so too); a whole file (200) answered to the first
    byte's Range with a Content-Range (a proxy keeping the origin's header) does not say its size either. Where no
    version is given either, the stamp asked again is untold, not "N bytes now" for a change or no change."""
    import fsspec

    from lerobot_dali.file_stamps import FileStamps
    from lerobot_dali.remote_errors import StampUntold

    (tmp_path / "f.bin").write_bytes(_DATA)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(2))
        url = f"{server.url}/f.bin"
        stamps = FileStamps(fs)
        assert stamps[url].size == len(_DATA)
        (tmp_path / "f.bin").write_bytes(_DATA[:1000])  # (as the encoded body's length would differ from the file's)
        server.versions = False
        server.file_headers = {"Content-Encoding": "gzip"}
        server.fail_next(None, None, "no_range")  # (the HEAD, fsspec's GET, the ranged GET: whole, its length encoded)
        with pytest.raises(StampUntold, match=r"f\.bin: the server, asked for the file's stamp, gave neither"):
            stamps.change_now(url, vouching=True)
        server.file_headers = {}
        server.content_length = frozenset()
        server.fail_next(None, None, "whole_as_range")  # (its Content-Range, beside a 200, says nothing of the file)
        with pytest.raises(StampUntold, match=r"f\.bin: the server, asked for the file's stamp, gave neither"):
            stamps.change_now(url, vouching=True)


@pytest.mark.parametrize("answer", [206, 200])
def test_a_stamp_asked_again_of_a_server_giving_no_version_tells_a_change_by_the_size_its_first_byte_says(
    tmp_path: Path, slept, monkeypatch, answer: int
) -> None:
    """Where fsspec's info gives no size and the server no version (ETag, Last-Modified), the size the first byte's
    answer tells (a 206's Content-Range; a 200's Content-Length, from a server that ignores the Range) is all that
    tells a rewritten file from the stamped one: the same size is no change, another is named by both sizes."""
    from lerobot_dali.file_stamps import FileStamps

    (tmp_path / "f.bin").write_bytes(_DATA)
    with serve_folder(tmp_path) as server:
        http = fsspec.filesystem("http", skip_instance_cache=True)
        stamps = FileStamps(RetryingFileSystem(http, policy=RetryPolicy(2)))
        url = f"{server.url}/f.bin"
        assert stamps[url].size == len(_DATA)
        info = http.info
        monkeypatch.setattr(http, "info", lambda path, **kw: {k: v for k, v in info(path, **kw).items() if k != "size"})
        server.versions = False
        server.fail_next(*([None, "no_range"] * 2 if answer == 200 else []))  # (each: fsspec's HEAD, the ranged GET)
        assert stamps.change_now(url) is None
        (tmp_path / "f.bin").write_bytes(_DATA[:1000])
        assert stamps.change_now(url) == (f"{len(_DATA)} bytes", "1000 bytes")
        ranged = [(r.method, r.range, r.status) for r in server.records if r.range == "bytes=0-0"]
        assert ranged == [("GET", "bytes=0-0", answer)] * 2


def test_stamps_over_plain_http_list_no_folder_and_ask_each_file_once(tmp_path: Path) -> None:
    """Plain HTTP index pages give no file sizes: a root is not listed (a GET per folder, for nothing); each file's
    stamp is one info request, the first time it is looked up."""
    from lerobot_dali.file_stamps import FileStamps

    (tmp_path / "videos" / "a").mkdir(parents=True)
    (tmp_path / "videos" / "a" / "f.bin").write_bytes(_DATA)
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(2))
        stamps = FileStamps(fs, [f"{server.url}/videos"])
        assert (len(stamps), stamps.listing_calls, stamps.add_root(f"{server.url}/videos")) == (0, 0, 0)
        for _ in range(2):
            assert stamps[f"{server.url}/videos/a/f.bin"].size == len(_DATA)
        assert [r.kind for r in server.records if r.kind == "listing"] == [] and stamps.info_calls == 1
