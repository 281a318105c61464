"""A Hub dataset whose data and video files are in huggingface_hub's cache is read from there (offline too).

Nothing touches the network: a generated dataset is laid out as huggingface_hub's cache keeps a repo
(``datasets--user--ds/refs/main``, ``snapshots/<commit>/...`` links to ``blobs/``), which huggingface_hub's own
``scan_cache_dir`` and ``try_to_load_from_cache`` are asked to recognise. Offline, the real ``snapshot_download``
finds the metadata there; online it is stubbed to answer that snapshot folder, as it does once the Hub names the
commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import huggingface_hub
import numpy as np
import pytest
import torch
from huggingface_hub import HfFileSystem

from lerobot_dali.dataset_location import resolve_location
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import DatasetNotFoundError
from lerobot_dali.hub_cache_files import bulk_files_named, read_bulk_from_cache
from lerobot_dali.iterator import DALILeRobotIterator
from tests.test_iterator import DELTAS, LENGTHS, _dataset, _samples

REPO = "user/ds"
COMMIT = "feed" * 10
DOWNLOAD = f"hf download {REPO} --repo-type dataset --revision {COMMIT}"


def _cache_a_copy(cache: Path, dataset: Path, *, keep: Callable[[str], bool] = lambda relative: True,
                  subfolder: str = "") -> Path:  # fmt: skip
    """``dataset``'s files (those ``keep`` takes) as huggingface_hub's cache holds repo REPO at COMMIT, under
    ``subfolder`` of it; its snapshot folder. Each file is a blob named by its hash, linked from the snapshot."""
    repo = cache / "datasets--user--ds"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(exist_ok=True)
    for path in sorted(p for p in dataset.rglob("*") if p.is_file()):
        relative = path.relative_to(dataset).as_posix()
        if not keep(relative):
            continue
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        link = snapshot / subfolder / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """huggingface_hub's cache folder (HF_HUB_CACHE), empty, with HF_HUB_OFFLINE set and no LeRobot copy."""
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot"))
    return folder


def _rows(reader) -> list[dict[str, np.ndarray]]:
    return [reader.read_episode(pos) for pos in range(reader.num_episodes)]


def _assert_rows_equal(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for key in ra:
            np.testing.assert_array_equal(ra[key], rb[key])


def test_the_fake_cache_is_laid_out_as_huggingface_hub_keeps_one(cache, make_ds) -> None:
    dataset = _dataset(make_ds, "vp9")
    snapshot = _cache_a_copy(cache, dataset)
    (repo,) = huggingface_hub.scan_cache_dir(cache).repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "dataset")
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT and revision.refs == {"main"}
    assert revision.nb_files == sum(1 for p in dataset.rglob("*") if p.is_file())
    found = huggingface_hub.try_to_load_from_cache(REPO, "videos/observation.images.cam0/chunk-000/file-000.mp4",
                                                   cache_dir=cache, repo_type="dataset")  # fmt: skip
    assert found == str(snapshot / "videos/observation.images.cam0/chunk-000/file-000.mp4")


@pytest.mark.parametrize(
    ("version", "target", "revision", "subfolder"),
    [
        ("v3.0", REPO, None, ""),  # (main, through refs/main)
        ("v3.0", REPO, COMMIT, ""),
        ("v3.0", "hf://datasets/user/ds/sub/set", None, "sub/set"),
        ("v2.1", REPO, None, ""),  # (a data file and a video per episode)
    ],
)
def test_offline_a_hub_dataset_whose_files_are_cached_reads_them_from_there(
    cache, make_ds, version: str, target: str, revision: str | None, subfolder: str
) -> None:
    """It was refused at open (HF_HUB_OFFLINE: data and videos are read from the Hub), though `hf download` had put
    every file in the snapshot folder its metadata was read from."""
    dataset = make_ds(episodes=5, frames_per_episode=LENGTHS, episodes_per_file=2, codec="vp9", fps=10, version=version)
    snapshot = _cache_a_copy(cache, dataset, subfolder=subfolder)
    reader = open_dataset(target, revision=revision)
    assert reader.location.is_local and reader.location.root == str(snapshot / subfolder).rstrip("/")
    assert reader.location.description == (target if "://" in target else f"hf://datasets/{REPO}") + (
        f"@{revision}" if revision else ""
    )
    _assert_rows_equal(_rows(reader), _rows(open_dataset(dataset)))
    assert reader.video(0, "observation.images.cam0").path.startswith(f"{snapshot}/")


def test_offline_batches_from_the_cache_equal_those_of_the_local_copy(cache, make_ds) -> None:
    dataset = _dataset(make_ds, "vp9")
    _cache_a_copy(cache, dataset)
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0,
                   drop_last=False)  # fmt: skip
    local = _samples(DALILeRobotIterator(dataset, **options))
    cached = _samples(DALILeRobotIterator(REPO, **options))
    assert [int(s["index"]) for s in cached] == list(range(sum(LENGTHS)))
    for a, b in zip(local, cached, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


CAM0_FILE0 = "videos/observation.images.cam0/chunk-000/file-000.mp4"
DATA_FILE2 = "data/chunk-000/file-002.parquet"


@pytest.mark.parametrize(
    ("left_out", "said"),
    [
        (lambda r: not r.startswith("meta/"), "holds none of the 9 data and video files its episodes to read name"),
        (lambda r: r in (CAM0_FILE0, DATA_FILE2), f"holds 7 of the 9 data and video files its episodes to read name, "
         f"at commit {COMMIT} (absent: {DATA_FILE2}, {CAM0_FILE0}): fetch them, online, with `{DOWNLOAD}`;"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("lerobot_copy", [False, True])
def test_offline_files_absent_from_the_cache_are_named_with_the_command_that_fetches_them(
    cache, make_ds, tmp_path, left_out: Callable[[str], bool], said: str, lerobot_copy: bool
) -> None:
    """A cache holding only meta/ (what opening online downloads) was refused saying to unset HF_HUB_OFFLINE or pass a
    local copy; one holding all but some files alike, naming none. Now it says how many and which are absent, and the
    command that fetches them; LeRobot's own copy, where there is one, is named."""
    _cache_a_copy(cache, _dataset(make_ds, "vp9"), keep=lambda relative: not left_out(relative))
    copy = tmp_path / "lerobot" / REPO
    if lerobot_copy:
        (copy / "meta").mkdir(parents=True)
        (copy / "meta" / "info.json").write_text("{}")
    with pytest.raises(DatasetNotFoundError) as caught:
        open_dataset(REPO)
    message = str(caught.value)
    assert message.startswith(f"hf://datasets/{REPO}: HF_HUB_OFFLINE is set, and huggingface_hub's cache {said}")
    assert DOWNLOAD in message and "unset HF_HUB_OFFLINE to read them from the Hub, pass a local copy" in message
    assert (f"LeRobot has one: {str(copy)!r}" in message) is lerobot_copy


def test_offline_only_the_files_of_the_episodes_to_read_are_needed(cache, make_ds) -> None:
    """Episodes 0 and 1 are in the first data file and video of each camera; the others' files are absent."""
    dataset = _dataset(make_ds, "vp9")
    firsts = ("meta/", "data/chunk-000/file-000", "videos/observation.images.cam0/chunk-000/file-000",
              "videos/observation.images.cam1/chunk-000/file-000")  # fmt: skip
    _cache_a_copy(cache, dataset, keep=lambda relative: relative.startswith(firsts))
    reader = open_dataset(REPO, episodes=[0, 1])
    assert reader.location.is_local
    _assert_rows_equal(_rows(reader), _rows(open_dataset(dataset, episodes=[0, 1])))
    with pytest.raises(DatasetNotFoundError, match="holds 3 of the 9 data and video files"):
        open_dataset(REPO)


def test_offline_a_link_whose_blob_is_gone_counts_as_absent(cache, make_ds) -> None:
    snapshot = _cache_a_copy(cache, _dataset(make_ds, "vp9"))
    os.remove(os.path.realpath(snapshot / CAM0_FILE0))
    with pytest.raises(DatasetNotFoundError, match=f"holds 8 of the 9 .* \\(absent: {CAM0_FILE0}\\)"):
        open_dataset(REPO)


def test_a_subfolder_is_fetched_alone(cache, make_ds) -> None:
    _cache_a_copy(cache, _dataset(make_ds, "vp9"), keep=lambda relative: relative.startswith("meta/"), subfolder="a")
    with pytest.raises(DatasetNotFoundError, match=f"`{DOWNLOAD} --include 'a/\\*'`"):
        open_dataset("hf://datasets/user/ds/a")


def test_offline_data_files_root_on_the_hub_is_refused(cache, make_ds) -> None:
    """Bulk files on another Hub repo have no snapshot folder here to read them from."""
    _cache_a_copy(cache, _dataset(make_ds, "vp9"))
    with pytest.raises(DatasetNotFoundError, match=re.escape(
        f"hf://datasets/{REPO} (data files: hf://datasets/user/mirror): HF_HUB_OFFLINE is set, and its data/ and "
        "videos/ are read from the Hub as it trains: unset HF_HUB_OFFLINE, or give data_files_root= a local copy"
    )):  # fmt: skip
        open_dataset(REPO, data_files_root="hf://datasets/user/mirror")


@pytest.fixture
def online(cache, monkeypatch) -> list[str]:
    """HF_HUB_OFFLINE unset; ``snapshot_download`` answers the cache's snapshot folder, as it does once the Hub
    names COMMIT. The paths HfFileSystem is asked about, each failing (nothing reaches the network)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    snapshot = cache / "datasets--user--ds" / "snapshots" / COMMIT
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(snapshot))
    asked: list[str] = []

    def no_hub(self: HfFileSystem, path: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(path)
        raise ConnectionRefusedError(f"test: no Hub to ask about {path}")

    for method in ("_open", "info", "ls", "find", "_ls_tree"):
        monkeypatch.setattr(HfFileSystem, method, no_hub)
    return asked


def test_online_cached_files_are_read_from_the_cache_without_asking_the_hub(online, cache, make_ds) -> None:
    """The files are the commit's, as the Hub's reads at that commit are: read from disk, not streamed again and
    copied into the prefetch cache."""
    dataset = _dataset(make_ds, "vp9")
    _cache_a_copy(cache, dataset)
    reader = open_dataset(REPO)
    assert reader.location.is_local and online == []
    _assert_rows_equal(_rows(reader), _rows(open_dataset(dataset)))


@pytest.mark.parametrize(("left_out", "looked"), [(lambda r: not r.startswith("meta/"), 1), (CAM0_FILE0.__eq__, 9)])
def test_online_a_cache_missing_files_leaves_every_read_on_the_hub(
    online, cache, make_ds, monkeypatch, left_out: Callable[[str], bool], looked: int
) -> None:
    """Metadata only (what opening online downloads): one look, at the first file; some absent: all on the Hub."""
    dataset = _dataset(make_ds, "vp9")
    _cache_a_copy(cache, dataset, keep=lambda relative: not left_out(relative))
    location = resolve_location(REPO)
    reader = open_dataset(dataset)
    isfile, looks = os.path.isfile, []
    monkeypatch.setattr(os.path, "isfile", lambda path: looks.append(path) or isfile(path))
    named = bulk_files_named(reader.info, reader.episodes, reader.camera_keys, None)
    assert read_bulk_from_cache(location, named) is location
    assert len(looks) == looked and location.root == f"datasets/{REPO}@{COMMIT}"


@pytest.mark.parametrize(("version", "command"), [("0.24.7", "huggingface-cli"), ("0.33.0", "huggingface-cli"),
                                                   ("0.34.0", "hf"), ("1.0.0rc2", "hf"), ("2.4.0", "hf")])  # fmt: skip
def test_the_download_command_is_the_installed_huggingface_hubs(monkeypatch, version, command):
    """huggingface_hub before 0.34 (this package takes 0.24) has no `hf` command: the advice named one it lacks."""
    import huggingface_hub

    from lerobot_dali.hub_cache_files import _cli

    monkeypatch.setattr(huggingface_hub, "__version__", version)
    assert _cli() == command


@pytest.mark.parametrize("offline", [True, False])
def test_reencode_reads_a_cached_hub_dataset_from_the_cache(cache, online, make_ds, tmp_path, offline) -> None:
    """`lerobot-dali reencode user/ds` listed and read the files on the Hub: offline it failed with huggingface_hub's
    OfflineModeIsEnabled though every file was in the snapshot folder; online it downloaded them again."""
    from lerobot_dali.reencode import reencode_dataset

    huggingface_hub.constants.HF_HUB_OFFLINE = offline  # (monkeypatched by ``cache``: restored after)
    dataset = _dataset(make_ds, "vp9")
    _cache_a_copy(cache, dataset)
    report = reencode_dataset(REPO, tmp_path / "out", gop=2)
    local = reencode_dataset(dataset, tmp_path / "local", gop=2)
    assert online == [] and len(report.videos) == 6 and report.copied_files == local.copied_files == 6
    written = sorted(p.relative_to(report.out).as_posix() for p in report.out.rglob("*") if p.is_file())
    assert written == sorted(p.relative_to(local.out).as_posix() for p in local.out.rglob("*") if p.is_file())
    _assert_rows_equal(_rows(open_dataset(report.out)), _rows(open_dataset(local.out)))


def test_reencode_offline_of_a_hub_dataset_not_cached_says_what_to_do(cache, make_ds, tmp_path) -> None:
    _cache_a_copy(cache, _dataset(make_ds, "vp9"), keep=lambda relative: relative.startswith("meta/"))
    with pytest.raises(DatasetNotFoundError, match=f"holds none of the 9 .*`{DOWNLOAD}`"):
        from lerobot_dali.reencode import reencode_dataset

        reencode_dataset(REPO, tmp_path / "out")


def test_offline_a_branch_that_moved_names_the_cached_commit_that_reads(cache, make_ds) -> None:
    """main moved to a commit of which only meta/ was downloaded, while the commit before it is cached whole: the
    error named the download only, not the revision that reads offline now."""
    snapshot = _cache_a_copy(cache, _dataset(make_ds, "vp9"))
    moved = "beef" * 10
    shutil.copytree(snapshot / "meta", snapshot.parent / moved / "meta", symlinks=True)
    (cache / "datasets--user--ds" / "refs" / "main").write_text(moved)
    with pytest.raises(DatasetNotFoundError, match=re.escape(
        f"holds none of the 9 data and video files its episodes to read name, at commit {moved} (absent: "
    )) as caught:  # fmt: skip
        open_dataset(REPO)
    assert str(caught.value).endswith(f"; or read commit {COMMIT} as it was, whose data/ is in the cache: "
                                      f"revision={COMMIT!r}")  # fmt: skip
    assert open_dataset(REPO, revision=COMMIT).location.root == str(snapshot)


@pytest.mark.parametrize("offline", [True, False])
def test_reencode_of_a_cache_with_a_link_whose_blob_is_gone_reads_nothing_from_there(
    cache, online, make_ds, tmp_path, offline
) -> None:
    """`reencode` copies every file of the snapshot folder, not only those its episodes name: one whose blob is gone
    (README.md here) raised FileNotFoundError once every video was re-encoded (1 of 1, online too, where the Hub
    holds it). It counts as absent, as a video's does: read from the Hub, or offline refused before any work."""
    from lerobot_dali.reencode import _read_from_hub_cache, reencode_dataset

    huggingface_hub.constants.HF_HUB_OFFLINE = offline  # (monkeypatched by ``cache``: restored after)
    dataset = _dataset(make_ds, "vp9")
    (dataset / "README.md").write_text("a dataset card")
    snapshot = _cache_a_copy(cache, dataset)
    os.remove(os.path.realpath(snapshot / "README.md"))
    if offline:
        with pytest.raises(DatasetNotFoundError, match=r"holds 9 of the 10 .* \(absent: README\.md\)"):
            reencode_dataset(REPO, tmp_path / "out", gop=2)
        assert not (tmp_path / "out").exists()
    else:
        location = resolve_location(REPO)
        info = open_dataset(dataset).info
        assert _read_from_hub_cache(location, info) is location  # (every file read from the Hub)


def test_reencode_offline_names_a_video_whose_blob_is_gone_once(cache, make_ds, tmp_path) -> None:
    # (named by its episode and found among the snapshot's links whose blob is gone: counted once)
    from lerobot_dali.reencode import reencode_dataset

    snapshot = _cache_a_copy(cache, _dataset(make_ds, "vp9"))
    os.remove(os.path.realpath(snapshot / CAM0_FILE0))
    with pytest.raises(DatasetNotFoundError, match=f"holds 8 of the 9 .* \\(absent: {CAM0_FILE0}\\)"):
        reencode_dataset(REPO, tmp_path / "out")


def test_offline_a_short_commit_hash_names_the_full_one_the_cache_holds(cache, make_ds) -> None:
    """The Hub's pages show a commit by its first 7 characters, and huggingface_hub's cache resolves only branches,
    tags and full hashes: offline a short one was refused saying to check the repo id's spelling (1 of 1)."""
    _cache_a_copy(cache, _dataset(make_ds, "vp9"))
    with pytest.raises(DatasetNotFoundError, match=re.escape(
        f"HF_HUB_OFFLINE is set and revision {COMMIT[:7]!r} names no branch or tag the cache knows, and only the Hub "
        f"resolves a short commit hash: pass the full one, revision={COMMIT!r}, whose snapshot the cache holds"
    )):  # fmt: skip
        open_dataset(REPO, revision=COMMIT[:7])
    with pytest.raises(DatasetNotFoundError, match="holds no metadata of revision fee of it"):
        open_dataset(REPO, revision="fee")  # (too short for a commit hash: a branch's or a tag's name, which it lacks)


def test_offline_lerobots_copy_under_a_home_given_with_a_tilde_is_named(cache, make_ds, tmp_path, monkeypatch) -> None:
    """LeRobot expands '~' in HF_LEROBOT_HOME (a .env file or a quoted export leaves it): its copy there was not
    named (1 of 1)."""
    _cache_a_copy(cache, _dataset(make_ds, "vp9"), keep=lambda relative: relative.startswith("meta/"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_LEROBOT_HOME", "~/lerobot-home")
    copy = tmp_path / "lerobot-home" / REPO
    (copy / "meta").mkdir(parents=True)
    (copy / "meta" / "info.json").write_text("{}")
    with pytest.raises(DatasetNotFoundError, match=re.escape(f"(LeRobot has one: {str(copy)!r})")):
        open_dataset(REPO)


def test_offline_metadata_cut_short_says_to_download_it_again(cache, make_ds) -> None:
    """huggingface_hub from 2.x keeps each commit's file listing and refuses a snapshot missing some of the files
    asked for (IncompleteSnapshotError: a download of meta/ cut short): that was said as no metadata of the
    revision, to be looked for in the repo id's spelling (1 of 1)."""
    pytest.importorskip("huggingface_hub._tree_cache")
    dataset = _dataset(make_ds, "vp9")
    files = sorted(p.relative_to(dataset).as_posix() for p in dataset.rglob("*") if p.is_file())
    cut = next(relative for relative in files if relative.startswith("meta/episodes/"))
    _cache_a_copy(cache, dataset, keep=lambda relative: relative.startswith("meta/") and relative != cut)
    listing = {relative: {"size": (dataset / relative).stat().st_size, "blob_id": "0" * 40} for relative in files}
    trees = cache / "datasets--user--ds" / "trees"
    trees.mkdir()
    (trees / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    with pytest.raises(DatasetNotFoundError, match=re.escape(
        f"dataset {REPO!r} cannot be opened: huggingface_hub's cache holds part of its metadata at revision main (a "
        "download cut short), and HF_HUB_OFFLINE is set: unset it to download the rest (IncompleteSnapshotError: "
    )) as caught:  # fmt: skip
        open_dataset(REPO)
    assert cut in str(caught.value)  # (named by huggingface_hub's error)


def test_metadata_cut_short_online_says_the_hub_was_unreachable_or_refused(monkeypatch) -> None:
    """huggingface_hub raises IncompleteSnapshotError online too, where the Hub cannot be reached: that was said as
    a cache holding no metadata of the revision, whether the Hub was unreachable or refused a private dataset."""
    errors = pytest.importorskip("huggingface_hub.errors")
    if not hasattr(errors, "IncompleteSnapshotError"):
        pytest.skip("huggingface_hub before 2.x raises no IncompleteSnapshotError")
    from huggingface_hub import constants

    from lerobot_dali.dataset_location import _missing_on_hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = errors.IncompleteSnapshotError("some files are missing from the cached snapshot", "/cache/snapshot")
    said = str(_missing_on_hub(REPO, None, error, maybe_path=True))
    assert said.startswith(
        f"dataset {REPO!r} cannot be opened: huggingface_hub's cache holds part of its metadata at revision main (a "
        "download cut short), and the Hub could not be reached to download the rest: check the network, HF_ENDPOINT "
        "and HF_HUB_OFFLINE (IncompleteSnapshotError: "
    ), said
    answer = OSError("401 Client Error")  # (as an HfHubHTTPError: a private dataset, no token, and the Hub answered)
    answer.response = SimpleNamespace(status_code=401)  # type: ignore[attr-defined]
    try:
        raise error from answer
    except errors.IncompleteSnapshotError as refused:
        said = str(_missing_on_hub(REPO, None, refused, maybe_path=True))
    assert "download cut short), and the Hub refused the rest to the token given: log in (`hf auth login`)" in said
