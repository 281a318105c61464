"""File stamps come from one listing per root (no per-file metadata request), with an info fallback."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.hf_file_system import _cache_info_from_path_info

from lerobot_dali.errors import MissingDataFileError
from lerobot_dali.file_stamps import FileStamp, FileStamps, stamp_from_info
from lerobot_dali.remote_retry import RetryingFileSystem
from lerobot_dali.retry_policy import RetryPolicy
from tests.fake_remote import FakeHTTPError, FakeRemoteFileSystem

_SHA = "a" * 64


def _hub_entry(**extra: Any) -> dict[str, Any]:
    """A file entry exactly as HfFileSystem's listing (and info) builds it from the Hub's tree endpoint."""
    item = {"type": "file", "path": "videos/cam/chunk-000/file-000.mp4", "size": 1234, "oid": "b" * 40, **extra}
    return _cache_info_from_path_info(RepoFile(**item), "datasets/u/d/" + item["path"])


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (
            {"name": "/x.mp4", "size": 5, "type": "file", "mtime": 1700000000.25, "ino": 3},
            FileStamp(5, "mtime:1700000000.25"),
        ),
        (_hub_entry(), FileStamp(1234, "blob:" + "b" * 40)),
        (_hub_entry(lfs={"size": 1234, "oid": _SHA, "pointerSize": 130}), FileStamp(1234, "sha256:" + _SHA)),
        (_hub_entry(xetHash="c" * 64), FileStamp(1234, "xet:" + "c" * 64)),
        (
            {"name": "b/k", "size": 9, "ETag": '"0f3e"', "LastModified": "2024-01-01", "type": "file"},
            FileStamp(9, "etag:0f3e"),
        ),
        (
            {"name": "b/k", "size": 9, "etag": "CJ3/", "md5Hash": "XUFA==", "updated": "2024"},
            FileStamp(9, "md5:XUFA=="),
        ),
        (
            {"name": "https://h/x", "size": 7, "ETag": 'W/"abc"', "Last-Modified": "Mon", "url": "u"},
            FileStamp(7, 'etag:W/"abc'),
        ),
        (
            {"name": "https://h/x", "size": 7, "Last-Modified": "Mon, 01 Jan 2024"},
            FileStamp(7, "mtime:Mon, 01 Jan 2024"),
        ),
        (
            {"name": "https://h/x", "size": 7, "ETag": "", "Last-Modified": "Mon, 01 Jan 2024"},
            FileStamp(7, "mtime:Mon, 01 Jan 2024"),
        ),
        (
            {"name": "hf://buckets/b/x", "size": 3, "last_commit": {"oid": "c1", "title": "add"}},
            FileStamp(3, "commit:c1"),
        ),
        ({"name": "m", "size": 0}, FileStamp(0, "")),
    ],
    ids=[
        "local",
        "hub_git",
        "hub_lfs",
        "hub_xet",
        "s3",
        "gcs",
        "http_etag",
        "http_modified",
        "http_empty_etag",
        "last_commit",
        "unknown",
    ],
)
def test_stamp_from_info_picks_content_identity(info: dict[str, Any], expected: FileStamp) -> None:
    assert stamp_from_info(info) == expected


def test_stamp_from_real_local_info(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(b"x" * 11)
    info = LocalFileSystem().info(str(path))
    assert stamp_from_info(info) == FileStamp(11, f"mtime:{info['mtime']}")


def test_stamp_needs_a_size() -> None:
    with pytest.raises(ValueError, match=r"https://h/x\.mp4: the filesystem reports no size"):
        stamp_from_info({"name": "https://h/x.mp4", "size": None})
    with pytest.raises(ValueError, match=r"https://h/y\.mp4: the filesystem reports no size \(True\)"):
        stamp_from_info({"name": "https://h/y.mp4", "size": True})  # (a bool is an int to isinstance)
    with pytest.raises(ValueError, match=r"https://h/z\.mp4: the filesystem reports no size \(-1\)"):
        stamp_from_info({"name": "https://h/z.mp4", "size": -1})
    assert stamp_from_info({"name": "empty", "size": 0}) == FileStamp(0, "")
    with pytest.raises(ValueError, match="non-negative int"):
        FileStamp(-1, "")


def _tree(root: Path, cameras: int = 3, files: int = 4) -> list[str]:
    """A LeRobot v3-like ``videos/`` tree: cameras x chunk folders x files (plus a non-video file)."""
    names = []
    for c in range(cameras):
        for f in range(files):
            relative = f"videos/observation.images.cam{c}/chunk-00{f % 2}/file-{f:03d}.mp4"
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(bytes(100 + 10 * c + f))
            names.append(relative)
    (root / "videos" / "README").write_text("not a video")
    return [*names, "videos/README"]


def test_local_listing_stamps_every_file(tmp_path: Path) -> None:
    names = _tree(tmp_path)
    fs = LocalFileSystem()
    stamps = FileStamps(fs, [str(tmp_path / "videos")])
    assert (len(stamps), stamps.listing_calls, stamps.info_calls) == (13, 1, 0)
    for name in names:
        path = str(tmp_path / name)
        assert path in stamps
        assert stamps[path] == stamp_from_info(fs.info(path))
    assert stamps[str(tmp_path / names[5])].size == 100 + 10 * 1 + 1
    assert stamps.info_calls == 0


def test_a_listing_stamps_files_only(tmp_path: Path) -> None:
    """A dangling symlink is listed (as type 'other', size 0) but is no file of the dataset: left to a lookup."""
    names = _tree(tmp_path, cameras=1, files=1)
    (tmp_path / "videos" / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    stamps = FileStamps(LocalFileSystem(), [str(tmp_path / "videos")])
    assert sorted(stamps) == sorted(str(tmp_path / name) for name in names)


class ListingFakeRemote(FakeRemoteFileSystem):
    """The fake remote with a one-request recursive ``find``, as the Hub's tree endpoint and object stores."""

    protocol = "fakelisting"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("fakelisting://"))

    def find(
        self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kw: Any
    ) -> Any:
        if kw:  # like HfFileSystem, whose tree listing rejects arguments it does not know (e.g. on_error)
            raise TypeError(f"find() got unexpected keyword arguments {sorted(kw)}")
        self._check("find", path)
        found = self._local.find(self._real(path), detail=True)
        entries = {e["name"]: e for e in (self._public(info) for info in found.values())}
        return entries if detail else sorted(entries)


def test_one_listing_per_root_and_no_info_requests(tmp_path: Path) -> None:
    names = _tree(tmp_path)
    remote = ListingFakeRemote(str(tmp_path))
    fs = RetryingFileSystem(remote)  # as dataset_location wraps every remote filesystem
    stamps = FileStamps(fs, ["videos"])
    assert dict(remote.requests) == {"find": 1}
    assert all(stamps[name] == stamp_from_info(LocalFileSystem().info(str(tmp_path / name))) for name in names)
    assert stamps["fakelisting://videos/observation.images.cam0/chunk-000/file-000.mp4"].size == 100
    assert dict(remote.requests) == {"find": 1}
    assert (stamps.listing_calls, stamps.info_calls) == (1, 0)

    worker_copy = pickle.loads(pickle.dumps(stamps))  # what a spawned worker receives
    assert worker_copy.fs.fs is not remote and not worker_copy.fs.fs.requests
    assert [worker_copy[name] for name in names] == [stamps[name] for name in names]
    assert not worker_copy.fs.fs.requests


def test_generic_find_lists_folder_by_folder(tmp_path: Path) -> None:
    """A filesystem without its own ``find`` is walked: one ``ls`` per folder, still no per-file request."""
    names = _tree(tmp_path)
    remote = FakeRemoteFileSystem(str(tmp_path))
    stamps = FileStamps(RetryingFileSystem(remote), ["videos"])
    folders = 1 + 3 + 3 * 2  # videos/, one per camera, two chunks per camera
    assert dict(remote.requests) == {"ls": folders}
    assert [stamps[name].size for name in names[:2]] == [100, 101]
    assert dict(remote.requests) == {"ls": folders}


def test_a_reset_during_a_folder_walk_redoes_the_listing_instead_of_skipping_the_folder(tmp_path: Path) -> None:
    """fsspec's walk would skip a folder whose ``ls`` raised OSError; the listing must be complete or retried."""
    names = _tree(tmp_path)
    remote = FakeRemoteFileSystem(str(tmp_path), fault_every=4, faults=("reset",))
    policy = RetryPolicy(retries=3, base_delay_s=0.0, max_delay_s=0.0)
    stamps = FileStamps(RetryingFileSystem(remote, policy=policy), ["videos"])
    assert remote.faults_injected["reset"] > 0
    assert sorted(stamps) == sorted(stamps._key(name) for name in names) and stamps.info_calls == 0


class UnlistableRemote(FakeRemoteFileSystem):
    """A fake remote whose listing fails in a configurable way (plain HTTP, a 503, links without sizes)."""

    protocol = "fakeunlistable"

    def __init__(self, root: str, *, failure: str = "unsupported", **kwargs: Any) -> None:
        super().__init__(root, failure=failure, **kwargs)
        self.failure = failure

    def find(
        self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kw: Any
    ) -> Any:
        self._check("find", path)
        if self.failure == "unsupported":
            raise NotImplementedError("no listing")
        if self.failure == "missing":
            raise FileNotFoundError(path)
        if self.failure == "http_error":
            raise FakeHTTPError(403, "Forbidden")
        if self.failure == "reset":
            raise ConnectionResetError("reset")
        if self.failure == "empty":
            return {}
        # an HTML link page: names, no sizes (what HTTPFileSystem's ls returns)
        found = self._local.find(self._real(path))
        return {self._public({"name": n})["name"]: {"name": n, "size": None, "type": "file"} for n in found}


@pytest.mark.parametrize("failure", ["unsupported", "missing", "http_error", "empty", "links_without_sizes"])
def test_falls_back_to_one_memoised_info_per_file(tmp_path: Path, failure: str, caplog) -> None:
    names = _tree(tmp_path)
    remote = UnlistableRemote(str(tmp_path), failure=failure)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.file_stamps"):
        stamps = FileStamps(remote, ["videos"])
        assert stamps.add_root("videos") == 0  # (none recorded: listed again, for nothing)
    assert (len(stamps), dict(remote.requests)) == (0, {"find": 2})
    sizeless = "listing videos returned no file with a size; file stamps come from info requests"
    assert (sizeless in caplog.messages) == (failure in ("empty", "links_without_sizes"))
    first, second = names[0], names[7]
    assert stamps[first] == stamp_from_info(LocalFileSystem().info(str(tmp_path / first)))
    assert stamps[second].size == 100 + 10 + 3
    assert stamps[first].size == 100  # memoised
    assert dict(remote.requests) == {"find": 2, "info": 2}
    assert (stamps.listing_calls, stamps.info_calls, len(stamps)) == (2, 2, 2)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    _tree(tmp_path)
    stamps = FileStamps(FakeRemoteFileSystem(str(tmp_path)), ["videos"])
    absent = "videos/observation.images.cam9/chunk-000/file-000.mp4"
    assert absent not in stamps
    with pytest.raises(MissingDataFileError, match=r"cam9/chunk-000/file-000\.mp4 does not exist"):
        stamps[absent]
    assert stamps.info_calls == 1


def test_a_file_not_found_from_an_outage_is_no_missing_file() -> None:
    """fsspec's HTTP ``info`` raises FileNotFoundError from whatever its GET hit: from a 503 it is an outage, raised
    as such for the retries, not named a missing file."""
    outage = FileNotFoundError("http://h/x.mp4")
    outage.__cause__ = FakeHTTPError(503, "Service Unavailable")

    class Down(_ChangingServer):
        def info(self, path: str) -> dict[str, Any]:
            raise outage

    with pytest.raises(FileNotFoundError) as raised:
        FileStamps(Down({}))["http://h/x.mp4"]
    assert raised.value is outage


def test_files_without_a_version_are_versioned_for_one_run(caplog) -> None:
    """A server without ETag, Last-Modified or hash left stamps of size alone, so a same-size rewrite between
    runs was served from the caches on disk: such files get a version of this run (one warning), shared by
    the run's workers through pickling and new in the next run."""
    import logging
    import pickle

    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/unversioned/a.bin", b"xx")
    fs.pipe("/unversioned/b.bin", b"yyy")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.file_stamps"):
        run = FileStamps(fs, ["/unversioned"])
        looked_up = run["/unversioned/a.bin"], FileStamps(fs)["/unversioned/b.bin"]  # listed, and by info
    assert [s.size for s in looked_up] == [2, 3] and all(s.version.startswith("run:") for s in looked_up)
    assert sum("no ETag, Last-Modified or content hash" in r.getMessage() for r in caplog.records) == 2  # per run
    worker = pickle.loads(pickle.dumps(run))
    assert worker["/unversioned/b.bin"] == run["/unversioned/b.bin"]  # one run: one version in every process
    assert FileStamps(fs, ["/unversioned"])["/unversioned/a.bin"] != run["/unversioned/a.bin"]  # the next run


def test_a_run_warns_once_of_its_unversioned_files(caplog) -> None:
    """One line per run, naming the first such file, not one per file: a plain HTTP server's thousands of files."""
    fs = fsspec.filesystem("memory")
    for name in "abc":
        fs.pipe(f"/unversioned-once/{name}.bin", b"x")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.file_stamps"):
        stamps = FileStamps(fs, ["/unversioned-once"])
    assert len(stamps) == 3
    assert sum("no ETag, Last-Modified or content hash" in r.getMessage() for r in caplog.records) == 1


def test_stamps_sharing_a_table_keep_the_first_stamps_and_one_run_version() -> None:
    """A union's copy shares its dataset's table: what the dataset stamped first is what both serve (the version the
    run began with, not the copy's later answer), and the copy's unversioned files take the dataset's run version."""
    fs = fsspec.filesystem("memory")
    fs.pipe("/shared-table/a.bin", b"xx")
    fs.pipe("/shared-table/b.bin", b"yyy")
    dataset, copy = FileStamps(fs), FileStamps(fs)
    first = dataset["/shared-table/a.bin"]
    assert copy["/shared-table/a.bin"] != first  # (each its own run version)
    fs.pipe("/shared-table/c.bin", b"z")
    own = copy["/shared-table/c.bin"]  # (stamped by the copy alone)
    copy.share(dataset)
    assert copy["/shared-table/a.bin"] == first == dataset["/shared-table/a.bin"]
    assert "/shared-table/c.bin" in dataset and dataset["/shared-table/c.bin"] == own  # (the copy's, in the one table)
    assert copy["/shared-table/b.bin"].version == first.version and "/shared-table/b.bin" in dataset


def test_merged_stamps_hold_every_parts_stamps_and_count_their_requests(tmp_path: Path, caplog) -> None:
    """A union's stamps: each dataset's, the first's filesystem asked for what none listed, and the requests its
    datasets made counted (its repr, logged with a run's requests)."""
    _tree(tmp_path, cameras=1, files=2)
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.file_stamps"):
        listed = FileStamps(FakeRemoteFileSystem(str(tmp_path)), ["videos"])
    assert not [m for m in caplog.messages if "no file with a size" in m] and len(listed) == 3
    asked = FileStamps(UnlistableRemote(str(tmp_path)), ["videos"])
    asked["videos/observation.images.cam0/chunk-000/file-000.mp4"]
    merged = FileStamps.merged([listed, asked])
    assert (merged.listing_calls, merged.info_calls, len(merged), merged.fs) == (2, 1, len(listed), listed.fs)
    assert dict(merged.items()) == {**dict(asked.items()), **dict(listed.items())}


def test_the_ranks_of_one_launch_share_the_nth_run_version_of_one_root(monkeypatch) -> None:
    """Ranks one launcher started (one launch key) version their unversioned files alike, so the caches they write are
    one; each FileStamps of the same roots after the first in a process is another, as in another run."""
    from collections import Counter

    from lerobot_dali import file_stamps

    fs = fsspec.filesystem("memory")
    fs.pipe("/ranks/a.bin", b"xx")
    monkeypatch.setattr(file_stamps, "launch_key", lambda: "launch-1")
    monkeypatch.setattr(file_stamps, "_made", Counter())
    rank0 = [FileStamps(fs, ["/ranks"])["/ranks/a.bin"].version for _ in range(2)]
    monkeypatch.setattr(file_stamps, "_made", Counter())  # (another rank's process)
    rank1 = [FileStamps(fs, ["/ranks"])["/ranks/a.bin"].version for _ in range(2)]
    assert rank0 == rank1 and rank0[0] != rank0[1] and rank0[0].startswith("run:launch-1:")
    monkeypatch.setattr(file_stamps, "launch_key", lambda: None)
    monkeypatch.setattr(file_stamps, "_made", Counter())  # (a run launched alone)
    alone = [FileStamps(fs, ["/ranks"])["/ranks/a.bin"].version for _ in range(2)]
    assert alone[0] != alone[1] and not set(alone) & set(rank0)
    monkeypatch.setattr(file_stamps, "_made", Counter())  # (the next run, launched alone: no version of this one's)
    assert not {FileStamps(fs, ["/ranks"])["/ranks/a.bin"].version for _ in range(2)} & set(alone)


def test_threads_looking_up_one_path_ask_once() -> None:
    """Prefetch threads admitting episodes of one file looked its stamp up at once, each with its own request."""
    import threading
    import time

    from fsspec.implementations.memory import MemoryFileSystem

    class SlowInfo(MemoryFileSystem):
        protocol = "slowinfo"

        def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
            time.sleep(0.05)
            return super().info(path, **kwargs)

    fs = SlowInfo()
    fs.pipe("/slow/a.bin", b"xyz")
    stamps = FileStamps(fs)
    barrier = threading.Barrier(4)
    got: list[FileStamp] = []

    def look_up() -> None:
        barrier.wait()
        got.append(stamps["/slow/a.bin"])

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [stamp.size for stamp in got] == [3] * 4 and stamps.info_calls == 1


def test_a_file_stamped_in_another_thread_while_the_stamps_are_pickled_for_the_workers() -> None:
    """DALI pickles the workers' source (the reader and its stamps) with a pickler whose Python hook runs between
    objects, where other threads get their turn: a prefetch thread stamping a file no listing gave (a plain HTTP
    server lists no sizes) grew the dict being pickled, and building the pipeline failed with "RuntimeError:
    dictionary changed size during iteration" (in 50 of 50 pickles beside a thread adding stamps). Forced here:
    the lookup runs in another thread at the pickler's first stamp."""
    import io
    import threading

    import fsspec
    from nvidia.dali.reducers import DaliCallbackPickler

    fs = fsspec.filesystem("memory")
    for name in ("a", "b", "c"):
        fs.pipe(f"/unlisted/{name}.bin", name.encode() * 3)
    stamps = FileStamps(fs)
    first = stamps["/unlisted/a.bin"], stamps["/unlisted/b.bin"]

    class SwitchingPickler(DaliCallbackPickler):
        switched = False

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, FileStamp) and not self.switched:
                self.switched = True
                other = threading.Thread(target=stamps.__getitem__, args=("/unlisted/c.bin",))
                other.start()
                other.join()
            return super().reducer_override(obj)

    out = io.BytesIO()
    SwitchingPickler(out).dump(stamps)
    worker = pickle.loads(out.getvalue())
    assert (worker["/unlisted/a.bin"], worker["/unlisted/b.bin"]) == first
    assert len(stamps) == 3 and stamps["/unlisted/c.bin"].size == 3


def test_a_walk_lists_each_folder_below_its_root_once() -> None:
    """An HTTP index page that links to its parent ('../') or a server answering every folder with the same page
    (each page's 'sub/' one more level down) was walked for ever by find_files' walk (plain HTTP's since the v3.0
    episode listing took it): each folder below the root is listed once, to MAX_WALK_DEPTH down."""
    from fsspec import AbstractFileSystem

    from lerobot_dali.file_stamps import MAX_WALK_DEPTH, find_files

    asked: list[str] = []

    class LoopingIndex(AbstractFileSystem):
        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[dict[str, Any]]:
            asked.append(path)
            if len(asked) > 100:
                raise AssertionError(f"walked for ever: {asked[:12]}")
            here = path.rstrip("/")
            parent = here.rsplit("/", 1)[0]
            return [
                {"name": f"{here}/file-000.parquet", "type": "file", "size": 1},
                {"name": parent, "type": "directory"},  # ('../')
                {"name": here, "type": "directory"},  # ('./')
                {"name": f"{here}/sub", "type": "directory"},  # (the same page, one level down)
            ]

    fs = LoopingIndex()
    files = find_files(fs, "/root/meta/episodes")
    assert len(asked) == MAX_WALK_DEPTH + 1 == len(files)
    assert sorted(files) == [f"/root/meta/episodes{'/sub' * n}/file-000.parquet" for n in range(MAX_WALK_DEPTH + 1)]


def test_a_walk_of_a_server_answering_every_folder_alike_warns_once_and_lists_the_depth_asked(caplog) -> None:
    """A server answering every path with one index page of 2 folder links: the whole walk lists 2**9 - 1 folders to
    MAX_WALK_DEPTH and warned once per folder left at the limit (512 lines); one warning now, naming how many. Asked
    for the chunk folders alone (depth=1, the v3.0 episode listing's), it lists 1 + 2 folders."""
    from fsspec import AbstractFileSystem

    from lerobot_dali.file_stamps import MAX_WALK_DEPTH, find_files

    asked: list[str] = []

    class SamePage(AbstractFileSystem):
        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[dict[str, Any]]:
            asked.append(path)
            here = path.rstrip("/")
            return [{"name": f"{here}/{name}", "type": "directory"} for name in ("a", "b")]

    with caplog.at_level(logging.WARNING, logger="lerobot_dali.file_stamps"):
        assert find_files(SamePage(), "/root/meta/episodes") == {}
    assert len(asked) == 2 ** (MAX_WALK_DEPTH + 1) - 1
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith("512 folder(s) under /root/meta/episodes not listed"), warned
    asked.clear()
    caplog.clear()
    assert find_files(SamePage(), "/root/meta/episodes", depth=1) == {}
    assert asked == ["/root/meta/episodes", "/root/meta/episodes/b", "/root/meta/episodes/a"] and not caplog.records


def test_a_walk_takes_a_root_named_with_a_trailing_slash_and_skips_links_to_its_parent() -> None:
    """'root/' is walked as 'root' (its sub-folders too; HTTP's names keep the slash), and a link 'root/sub/..'
    (the parent, as a page may write it) is not walked."""
    from fsspec import AbstractFileSystem

    from lerobot_dali.file_stamps import find_files

    asked: list[str] = []

    class Index(AbstractFileSystem):
        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            return path  # (as HTTPFileSystem's: the URL as given)

        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[dict[str, Any]]:
            asked.append(path)
            here = path.rstrip("/")
            sub = [{"name": f"{here}/sub", "type": "directory"}] if here == "/root" else []
            return [*sub, {"name": f"{here}/..", "type": "directory"}, {"name": f"{here}/f", "type": "file", "size": 1}]

    assert sorted(find_files(Index(), "/root/")) == ["/root/f", "/root/sub/f"]
    assert asked == ["/root/", "/root/sub"]


def test_a_failed_listing_warns_naming_the_error_and_an_absent_root_only_informs(caplog, tmp_path: Path) -> None:
    """A listing that failed (a reset, a refusal) falls back to per-file requests with a warning naming why; a root
    that does not exist says so at INFO (a lookup names a missing file)."""
    _tree(tmp_path, cameras=1, files=1)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.file_stamps"):
        FileStamps(UnlistableRemote(str(tmp_path), failure="reset"), ["videos"])
        FileStamps(UnlistableRemote(str(tmp_path), failure="missing"), ["videos"])
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "listing videos failed (ConnectionResetError: reset); file stamps come from one info request per file",
        ),
        ("INFO", "videos: listing root does not exist; file stamps come from info requests"),
    ]


class _ChangingServer:
    """A filesystem whose files' info the test changes, as a server's answers change when its files are replaced."""

    def __init__(self, infos: dict[str, dict[str, Any]]) -> None:
        self.infos = infos
        self.invalidated: list[str | None] = []

    @staticmethod
    def _strip_protocol(path: str) -> str:
        return path

    def info(self, path: str) -> dict[str, Any]:
        if path not in self.infos:
            raise FileNotFoundError(path)
        return {"name": path, **self.infos[path]}

    def invalidate_cache(self, path: str | None = None) -> None:
        self.invalidated.append(path)


def test_changed_tells_a_same_size_rewrite_by_a_version_of_the_same_kind() -> None:
    """A file replaced by one of its size was not told apart (only a size change was): the error path asks for its
    stamp again (its cached listing dropped first) and compares versions of one kind; with none, or another kind,
    or no answer, it cannot tell."""
    server = _ChangingServer(
        {"e": {"size": 5, "ETag": '"1"'}, "m": {"size": 5, "Last-Modified": "Mon"}, "n": {"size": 5}}
    )
    stamps = FileStamps(server)

    def changed(path: str) -> tuple[str, ...] | None:
        found = stamps.first_changed([path])
        return None if found is None else found[1:]

    assert [stamps[p].version.partition(":")[0] for p in "emn"] == ["etag", "mtime", "run"]
    assert [changed(p) for p in "emn"] == [None, None, None]
    assert server.invalidated == ["e", "m", "n"]
    server.infos["e"]["ETag"] = '"2"'
    server.infos["m"]["Last-Modified"] = "Tue"
    assert changed("e") == ("etag:1", "etag:2")
    assert changed("m") == ("mtime:Mon", "mtime:Tue")
    assert changed("n") is None  # (no version: a same-size rewrite cannot be told)
    server.infos["n"]["size"] = 6
    assert changed("n") == ("5 bytes", "6 bytes")
    server.infos["e"] = {"size": 5, "Last-Modified": "Wed"}  # (another kind of version: not comparable)
    assert changed("e") is None
    del server.infos["m"]
    assert changed("m") == ("5 bytes", "removed") and changed("never-stamped") is None


def test_a_size_not_given_again_leaves_the_version_to_tell_a_change() -> None:
    """A server that gave a size when the file was stamped and gives none now (no Content-Length): its version
    decides, as where the size is given."""
    server = _ChangingServer({"e": {"size": 5, "ETag": '"1"'}})
    stamps = FileStamps(server)
    stamps["e"]
    server.infos["e"] = {"size": None, "ETag": '"1"'}
    assert stamps.change_now("e") is None
    server.infos["e"]["ETag"] = '"2"'
    assert stamps.change_now("e") == ("etag:1", "etag:2")


def test_vouching_for_a_refused_read_takes_a_lost_version_for_a_change() -> None:
    """Where a read was refused (412, 404), a stamp's ETag the server gives no more, or gives as another kind, cannot
    vouch for the file: a change, named; not so outside vouching, nor for a file stamped with no version of its own
    (a run's), which nothing vouched for."""
    server = _ChangingServer({"e": {"size": 5, "ETag": '"1"'}, "f": {"size": 5, "ETag": '"1"'}, "n": {"size": 5}})
    stamps = FileStamps(server)
    for path in "efn":
        stamps[path]
    server.infos["e"] = {"size": 5, "Last-Modified": "Wed"}
    server.infos["f"] = {"size": 5}
    assert [stamps.change_now(p, vouching=True) for p in "efn"] == [
        ("etag:1", "no etag but mtime:Wed"),
        ("etag:1", "no version"),
        None,
    ]
    assert [stamps.change_now(p) for p in "efn"] == [None, None, None]


class _DownServer(_ChangingServer, fsspec.AbstractFileSystem):
    """A :class:`_ChangingServer` whose info fails as a network that went down does, once ``down`` is set."""

    # (fsspec caches instances by their arguments: a second run in one process got the first's server, its files
    # already changed, so no change was found)
    cachable = False

    def __init__(self, infos: dict[str, dict[str, Any]]) -> None:
        fsspec.AbstractFileSystem.__init__(self)
        _ChangingServer.__init__(self, infos)
        self.down = False
        self.asked = 0

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.asked += 1
        if self.down:
            raise ConnectionResetError(f"{path}: connection reset by peer")
        return super().info(path)


def test_the_error_paths_stamp_check_over_a_failing_network_asks_once_and_waits_for_nothing(monkeypatch) -> None:
    """A remote read failing past its retries (a network gone: PyAV's I/O error, raised as VideoDecodeError) asked
    for the stamp of every file of the failed batch again, each through the retries: 16 files, 96 info requests and
    80 backoff waits (192 s by the default policy) before the batch's own error was raised. The check asks
    once, and none more after a file it got no answer for: a failing network says nothing of the bytes read."""
    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append))
    server = _DownServer({f"f{i}": {"size": 5, "ETag": f'"{i}"'} for i in range(16)})
    stamps = FileStamps(RetryingFileSystem(server, policy=RetryPolicy(retries=5)))
    for path in server.infos:
        stamps[path]  # (stamped at open)
    server.down, server.asked = True, 0
    assert stamps.first_changed(server.infos) is None
    assert (server.asked, len(waits)) == (1, 0)
    server.down = False
    server.infos["f7"]["ETag"] = '"new"'
    assert stamps.first_changed(server.infos) == ("f7", "etag:7", "etag:new")


def test_the_error_paths_stamp_check_of_a_union_read_through_the_prefetch_cache_asks_once(
    monkeypatch, tmp_path: Path
) -> None:
    """A union's stamps in the workers are on the prefetch cache's filesystem (its copy built over the cache), whose
    info went through the retries and whose invalidate_cache reached no client: over a network gone, 6 requests and
    5 backoff waits for one file (over HTTP, two datasets: 12 requests, 5 waits); once and none now, as for one
    dataset, and a same-size change is named with the client's cache dropped."""
    from lerobot_dali.cached_filesystem import CachedFileSystem

    waits: list[float] = []
    monkeypatch.setattr("lerobot_dali.remote_retry.time", SimpleNamespace(sleep=waits.append))
    server = _DownServer({"a/f0": {"size": 5, "ETag": '"0"'}, "a/f1": {"size": 5, "ETag": '"1"'}})
    own = FileStamps(RetryingFileSystem(server, policy=RetryPolicy(retries=5)))
    for path in server.infos:
        own[path]  # (stamped at open)
    cached = CachedFileSystem(own.fs, tmp_path, own)
    stamps = FileStamps.merged([own], fs=cached)  # (DatasetUnion.with_location's)
    server.down, server.asked = True, 0
    assert stamps.first_changed(server.infos) is None
    assert (server.asked, len(waits)) == (1, 0)
    server.down, server.invalidated = False, []
    server.infos["a/f1"]["ETag"] = '"new"'
    assert stamps.first_changed(server.infos) == ("a/f1", "etag:1", "etag:new")
    assert server.invalidated == ["a/f0", "a/f1"]


def test_the_error_paths_stamp_check_names_a_file_removed_from_the_server(tmp_path: Path) -> None:
    """A file deleted on the server while it was read: asked for its stamp again, the server's 404 (fsspec's HTTP
    info: FileNotFoundError from it) was taken for no answer, so the read's own error (a decode or parse failure:
    'corrupt') was raised. It is the file's change now: removed; a 503 is still no answer, and so is a 403 behind
    fsspec's FileNotFoundError (a refusal, not the file's absence: it was named removed)."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from tests.http_server import serve_folder

    (tmp_path / "a").mkdir()
    for name in ("f0", "f1"):
        (tmp_path / "a" / name).write_bytes(b"12345")
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=0))
        stamps = FileStamps(fs)
        paths = [f"{server.url}/a/f0", f"{server.url}/a/f1"]
        for path in paths:
            stamps[path]  # (stamped at open)
        for fault in ("503", "403"):  # (every request answered so: no answer)
            server.set_faults(1, (fault,))
            assert stamps.first_changed(paths) is None
        server.set_faults(0)
        (tmp_path / "a" / "f1").unlink()
        assert stamps.first_changed(paths) == (paths[1], "5 bytes", "removed")


def test_a_file_the_server_answers_404_or_410_for_is_missing_with_that_status(tmp_path: Path) -> None:
    """A file stamped by its own request (fsspec's HTTP info) that the server has not: MissingDataFileError naming it,
    without the status the server answered (None), where a read answered so has it (remote_errors.not_served). It
    has it now: 404, 410; a file absent on a local filesystem (no server asked) keeps None."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from tests.http_server import serve_folder

    (tmp_path / "a").mkdir()
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=0))
        statuses = []
        for fault in ("404", "410"):
            server.fault_paths = {"/a/": fault}
            with pytest.raises(MissingDataFileError, match=r"/a/f0 does not exist on RetryingFileSystem") as caught:
                FileStamps(fs)[f"{server.url}/a/f0"]
            statuses.append(caught.value.status)
    with pytest.raises(MissingDataFileError, match=r"/a/f0 does not exist on LocalFileSystem") as local:
        FileStamps(LocalFileSystem())[str(tmp_path / "a" / "f0")]
    assert (statuses, local.value.status) == ([404, 410], None)


def test_a_readers_missing_data_file_error_keeps_the_servers_status(tmp_path: Path) -> None:
    """The parquet reader names the file as a data file the episode metadata lists, in its own MissingDataFileError
    raised from the stamp's: its status was None, the server's 404 on the cause alone. It is the cause's now (its own
    where it has one), and a chain of them that loops ends."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from lerobot_dali.episode_rows import open_parquet
    from tests.http_server import serve_folder

    (tmp_path / "data").mkdir()
    with serve_folder(tmp_path) as server:
        fs = RetryingFileSystem(fsspec.filesystem("http", skip_instance_cache=True), policy=RetryPolicy(retries=0))
        stamps = FileStamps(fs)

        def open_file(path: str) -> Any:
            stamps[path]  # (as open_stamped: the stamp first)
            return fs.open(path)

        with pytest.raises(MissingDataFileError, match=r"^data file .*/data/f\.parquet is missing") as caught:
            open_parquet(open_file, f"{server.url}/data/f.parquet")
    assert (caught.value.status, caught.value.__cause__.status) == (404, 404)
    own = MissingDataFileError("gone", 410)
    own.__cause__ = caught.value
    looped = MissingDataFileError("a")
    looped.__cause__ = MissingDataFileError("b")
    looped.__cause__.__cause__ = looped
    assert (own.status, looped.status, pickle.loads(pickle.dumps(caught.value)).status) == (410, None, 404)
