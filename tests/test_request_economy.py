"""Request economy: opening and iterating a remote dataset costs a number of metadata requests that does not
grow with its number of files, and no worker asks the server about a file it was told about."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.dataset_union import concat_datasets
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)
from tests.http_server import serve_folder

METADATA_KINDS = ("info", "exists")
OPTIONS = dict(batch_size=4, device="cpu", num_workers=0, drop_last=False)


def _open_counting(root: Path):
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    return reader, reader.location.fs.fs.requests


def test_metadata_requests_do_not_grow_with_the_number_of_files(make_ds) -> None:
    few = make_ds(episodes=2, frames_per_episode=3, cameras=2, codec="vp9", episodes_per_file=1, size=(64, 64))
    many = make_ds(episodes=8, frames_per_episode=3, cameras=2, codec="vp9", episodes_per_file=1, size=(64, 64))
    counts = []
    for root in (few, many):
        reader, requests = _open_counting(root)
        assert reader.stamps is not None and len(reader.stamps) == reader.num_episodes * 3  # 1 data + 2 videos each
        counts.append({kind: requests[kind] for kind in METADATA_KINDS})
        for pos in range(reader.num_episodes):  # every file is stamped without asking the server
            for path in [reader.data_path(pos), *(reader.video(pos, c).path for c in reader.camera_keys)]:
                assert reader.stamps[path].size > 0
        assert reader.stamps.info_calls == 0
        assert {kind: requests[kind] for kind in METADATA_KINDS} == counts[-1]
    assert counts[0] == counts[1]


def test_iterating_a_remote_dataset_makes_no_per_sample_metadata_request(make_ds, tmp_path: Path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=4, frames_per_episode=6, cameras=2, codec="av1", episodes_per_file=2, size=(64, 64))
    reader, requests = _open_counting(root)
    it = DALILeRobotIterator(reader, batch_size=4, device="cpu", num_workers=0, cache_dir=tmp_path, cache_gb=0.0)
    before = {kind: requests[kind] for kind in METADATA_KINDS}
    assert sum(len(batch["index"]) for batch in it) == 24
    assert {kind: requests[kind] for kind in METADATA_KINDS} == before
    it.close()


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize("cache_gb", [0.0, 1.0], ids=["remote_reads", "prefetch_cache"])
def test_over_http_a_file_costs_one_head(make_ds, tmp_path: Path, version: str, cache_gb: float) -> None:
    """Plain HTTP lists no sizes, so each file is asked for its stamp once (a HEAD) and its opens reuse that size;
    an MP4 whose packet index is built is asked once more (the build checks the file still has that size). Parquet
    opens asked again (up to 7 HEADs for one data file), the exists checks at open too, an MP4 once per batch that
    read it, and prefetch threads admitting two episodes of one file each stamped and indexed it."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=4, frames_per_episode=6, cameras=2, codec="vp9", episodes_per_file=2, size=(64, 64),
                   version=version)  # fmt: skip
    with serve_folder(root.parent) as server:
        for run in range(2):  # the second finds every packet index built: an MP4 costs its stamp alone
            server.reset_stats()
            it = DALILeRobotIterator(
                f"{server.url}/{root.name}", cache_dir=tmp_path / f"cache{run}", cache_gb=cache_gb, **OPTIONS
            )
            assert sum(len(batch["index"]) for batch in it) == 24
            it.close()
            heads = Counter(r.path for r in server.records if r.method == "HEAD")
            videos = {path: n for path, n in heads.items() if "/videos/" in path}
            data = {path: n for path, n in heads.items() if "/data/" in path}
            assert len(videos) == 2 * len(data) == (4 if version == "v3.0" else 8), heads
            assert set(data.values()) == {1} and set(videos.values()) == {2 - run}, heads


#: Opening a dataset over plain HTTP and reading its statistics, by (method, path under the dataset, status): each
#: metadata file read whole, one GET; a missing optional file one GET answered 404.
OPEN_AND_STATS = {
    "v3.0": {
        ("GET", "meta/info.json", 200): 1,
        ("GET", "meta/episodes", 200): 1,
        ("GET", "meta/episodes/chunk-000", 200): 1,
        ("GET", "meta/episodes/chunk-000/file-000.parquet", 200): 1,
        ("GET", "meta/tasks.parquet", 200): 1,
        ("GET", "meta/stats.json", 200): 1,
    },
    "v2.1": {
        ("GET", "meta/info.json", 200): 1,
        ("GET", "meta/episodes.jsonl", 200): 1,
        ("GET", "meta/tasks.jsonl", 200): 1,
        ("GET", "meta/episodes_stats.jsonl", 200): 1,
    },
}


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_over_http_each_metadata_file_is_one_get(make_ds, tmp_path: Path, version: str) -> None:
    """Opening (and reading the statistics of) a dataset over HTTP: each metadata file is one GET, and a v2.1
    dataset is never asked for v3.0's tasks.parquet. Each was opened, a HEAD for its size then a GET (a ranged one,
    206); before that the task list, episodes.jsonl and the statistics were checked with ``exists`` (a HEAD more),
    and a v2.1 dataset first asked for tasks.parquet (a HEAD and a GET, both 404). Without ``episodes_stats.jsonl`` a
    v2.1 dataset's statistics cost a GET answered 404 and the GET of ``stats.json`` (opening asked the missing file
    with a HEAD and a GET, both 404, and ``stats.json`` with a HEAD and a GET)."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", size=(64, 64), version=version)
    served = tmp_path / "served"
    shutil.copytree(root, served / "ds")
    expected = [OPEN_AND_STATS[version]]
    if version == "v2.1":  # the same dataset with stats.json where LeRobot 2.0 wrote it, in place of the per-episode
        shutil.copytree(root, served / "old")
        stats = open_dataset(root).read_stats()  # (episodes_stats.jsonl's aggregate)
        as_json = {key: {stat: value.tolist() for stat, value in entry.items()} for key, entry in stats.items()}
        (served / "old" / "meta" / "episodes_stats.jsonl").unlink()
        (served / "old" / "meta" / "stats.json").write_text(json.dumps(as_json))
        expected.append(
            {
                **{key: n for key, n in expected[0].items() if key[1] != "meta/episodes_stats.jsonl"},
                ("GET", "meta/episodes_stats.jsonl", 404): 1,
                ("GET", "meta/stats.json", 200): 1,
            }
        )
    local = open_dataset(root)
    local_stats = local.read_stats()
    for name, wanted in zip(["ds", "old"], expected, strict=False):
        with serve_folder(served) as server:
            server.reset_stats()
            reader = open_dataset(f"{server.url}/{name}")
            assert reader.tasks == local.tasks and reader.num_frames == local.num_frames
            stats = reader.read_stats()
            records = server.records
        assert stats.keys() == local_stats.keys()
        for key, entry in stats.items():
            for stat, value in entry.items():
                np.testing.assert_allclose(value, local_stats[key][stat], err_msg=f"{name} {key} {stat}")
        meta = [(r.method, r.path.removeprefix(f"/{name}/"), r.status) for r in records if f"/{name}/meta" in r.path]
        assert dict(Counter(meta)) == wanted, name


#: Every request of an open over plain HTTP (2 episodes, 2 cameras), by (method, top folder, kind): no folder of
#: data/ or videos/ is listed (the file stamps' walk listed each, 7 GETs for v3.0 and 6 for v2.1, and kept nothing:
#: an HTML index page gives no sizes); files are stamped by a HEAD each, as they were.
OPEN_REQUESTS = {
    "v3.0": {
        ("GET", "meta", "full"): 3,
        ("GET", "meta", "listing"): 2,
        ("GET", "data", "range"): 1,
        ("HEAD", "data", "full"): 1,
        ("HEAD", "videos", "full"): 2,
    },
    "v2.1": {
        ("GET", "meta", "full"): 3,
        ("GET", "data", "range"): 2,
        ("HEAD", "data", "full"): 2,
        ("HEAD", "videos", "full"): 2,
    },
}


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_over_http_an_open_lists_no_data_or_video_folder(make_ds, version: str) -> None:
    """Opening a dataset over plain HTTP asks for what it reads and stamps, and lists no folder for stamps: 9
    requests for v3.0 (16 before) and 9 for v2.1 (15 before)."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    root = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec="vp9", size=(64, 64), version=version)
    with serve_folder(root.parent) as server:
        server.reset_stats()
        reader = open_dataset(f"{server.url}/{root.name}")
        records = server.records
    asked = Counter((r.method, r.path.removeprefix(f"/{root.name}/").split("/")[0], r.kind) for r in records)
    assert dict(asked) == OPEN_REQUESTS[version]
    assert reader.num_frames == open_dataset(root).num_frames and reader.stamps is not None
    assert reader.stamps.listing_calls == 0


@pytest.mark.parametrize("codec", ["av1", "vp9"])  # decoded by PyAV, and by DALI from clips cut in the worker
def test_without_the_prefetch_cache_a_remote_video_read_fetches_its_packets_alone(
    make_ds, tmp_path: Path, codec: str
) -> None:
    """With ``cache_gb=0`` each clip read is one ranged GET of the packets the clip plan names: it starts at a
    packet and ends where one ends, no read-ahead past it (a 256 KB read-ahead fetched each file to its end here,
    and on gr00t_v20_h264 doubled the bytes of a sequential pass: 263 MB for 136 MB of packets). The DALI route's
    clips read so too (each batch's file opened once, lent to its clips: it kept the read-ahead)."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    from lerobot_dali.iterator import DALILeRobotIterator
    from lerobot_dali.packet_index import build_packet_index

    root = make_ds(episodes=2, frames_per_episode=24, cameras=1, codec=codec, gop=8, episodes_per_file=2,
                   size=(64, 64))  # fmt: skip
    videos = list(root.glob("videos/**/*.mp4"))
    assert len(videos) == 1
    index = build_packet_index(videos[0])
    starts = set(index.byte_offset.tolist())
    ends = set((index.byte_offset + index.size_bytes).tolist())
    with serve_folder(root.parent) as server:
        for run in range(2):  # the first builds the packet index (header reads); the second reads packets alone
            server.reset_stats()
            it = DALILeRobotIterator(
                f"{server.url}/{root.name}", cache_dir=tmp_path / f"cache{run}", cache_gb=0.0, shuffle=False, **OPTIONS
            )
            assert sum(len(batch["index"]) for batch in it) == 48
            it.close()
        gets = [r for r in server.records if r.method == "GET" and r.path.endswith(".mp4")]
    # One per batch (its four frames lie in one GOP of one episode), and the DALI pipeline's read-ahead of the
    # next epoch's first batches.
    assert len(gets) >= 12
    spans = [tuple(int(v) for v in r.range.removeprefix("bytes=").split("-")) for r in gets if r.range]
    assert len(spans) == len(gets)
    assert all(start in starts and stop + 1 in ends for start, stop in spans), (spans, index.file_size_bytes)
    assert sum(r.sent_bytes for r in gets) == sum(stop + 1 - start for start, stop in spans)
    sent = sum(r.sent_bytes for r in gets)
    if codec == "av1":  # each batch reads its GOP from the keyframe through its last frame's packet (two batches a GOP)
        last_byte = index.byte_offset + index.size_bytes - 1
        keyframes = np.flatnonzero(index.keyframe)
        assert np.diff(keyframes).tolist() == [8] * 5
        wanted = {(int(index.byte_offset[k]), int(last_byte[k + frames - 1])) for k in keyframes for frames in (4, 8)}
        read = Counter(spans)
        assert set(read) == wanted
        # Each once, but the first GOP's two: read again ahead, in order, for the next epoch. (Bounded as "at most
        # twice each packet's bytes", this failed on PyAV 18.1.1's AV1: its GOPs hold more bytes in their first frames.)
        again = [read[int(index.byte_offset[0]), int(last_byte[frames - 1])] - 1 for frames in (4, 8)]
        assert sum(read.values()) == len(wanted) + sum(again) and again in ([0, 0], [1, 0], [1, 1]), read
    else:  # a clip per sample, from its frame's keyframe (no B-frames: decode order is display order)
        keyframes = np.flatnonzero(index.keyframe)
        starts_of = keyframes[np.searchsorted(keyframes, np.arange(len(index.keyframe)), side="right") - 1]
        needed = sum(int(index.size_bytes[k : f + 1].sum()) for f, k in enumerate(starts_of))
        assert needed <= sent <= 2 * needed, (needed, sent)


#: One dataset's metadata requests, opened over plain HTTP, by (method, path under the dataset): info.json, the
#: episode metadata (v3.0: its folders listed, each once, then its parquet file) and the task list, each one GET; no
#: statistics (read where normalising asks for them, not at open). Each file was a HEAD then a GET (v3.0: 8 requests,
#: v2.1: 6; now 5 and 3); before that v3.0's meta/episodes/ was listed twice and asked for with a HEAD more (fsspec's
#: glob).
ALONE = {
    "v3.0": {
        ("GET", "meta/info.json"): 1,
        ("GET", "meta/episodes"): 1,
        ("GET", "meta/episodes/chunk-000"): 1,
        ("GET", "meta/episodes/chunk-000/file-000.parquet"): 1,
        ("GET", "meta/tasks.parquet"): 1,
    },
    "v2.1": {
        ("GET", "meta/info.json"): 1,
        ("GET", "meta/episodes.jsonl"): 1,
        ("GET", "meta/tasks.jsonl"): 1,
    },
}
#: What ``check`` reads more: the statistics, whose faults it warns of (NaN, shapes, a negative std).
CHECK_STATS = {"v3.0": ("GET", "meta/stats.json"), "v2.1": ("GET", "meta/episodes_stats.jsonl")}
CAMERA = "observation.images.cam0"


def _iterator(urls: list[str], tmp_path: Path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    DALILeRobotIterator(urls[0], cache_dir=tmp_path, cache_gb=0.0, **OPTIONS).close()


def _mixture(urls: list[str], tmp_path: Path) -> None:
    from lerobot_dali.mixture import DALILeRobotMixture

    options = {k: v for k, v in OPTIONS.items() if k != "drop_last"}  # (a mixture's batches are all full)
    DALILeRobotMixture(urls, cameras=[CAMERA], cache_dir=tmp_path, cache_gb=0.0, **options).close()


def _check(urls: list[str], tmp_path: Path) -> None:
    from lerobot_dali.cli import main

    assert main(["check", "--concat", *urls, "--cameras", CAMERA, "--json"]) == 0


OPENS = {
    "iterator": _iterator,
    "union": lambda urls, tmp_path: concat_datasets(urls),
    "union_cameras": lambda urls, tmp_path: concat_datasets(urls, cameras=[CAMERA]),
    "mixture_cameras": _mixture,
    "check_concat_cameras": _check,
}


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize("opens", list(OPENS))
def test_over_http_each_dataset_of_an_open_asks_for_its_metadata_as_opened_alone(
    make_ds, tmp_path: Path, version: str, opens: str
) -> None:
    """Each metadata file costs what it costs one dataset opened alone, whether opened by an iterator, in a union or a
    mixture, or checked as one, with cameras= or without. With cameras= each dataset of several asked for info.json
    twice (a HEAD and a GET more), to choose its own cameras and again to open it; a HEAD more, or a GET asked twice,
    fails the comparison."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTPFileSystem needs aiohttp (the 'test' extra)")
    root = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec="vp9", size=(64, 64), version=version)
    names = ["a"] if opens == "iterator" else ["a", "b"]
    for name in names:  # (two datasets: copies of one, each asked for its own files)
        shutil.copytree(root, tmp_path / "served" / name)
    with serve_folder(tmp_path / "served") as server:
        urls = [f"{server.url}/{name}" for name in names]
        server.reset_stats()
        OPENS[opens](urls, tmp_path / "cache")
        records = server.records
    for url in urls:
        prefix = url.removeprefix(server.url) + "/"
        asked = Counter((r.method, r.path.removeprefix(prefix)) for r in records if r.path.startswith(prefix + "meta"))
        expected = {**ALONE[version], CHECK_STATS[version]: 1} if opens.startswith("check") else ALONE[version]
        assert dict(asked) == expected, url
