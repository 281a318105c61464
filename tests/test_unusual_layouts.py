"""Valid layouts no generated dataset has but Hub datasets do: episode indices with gaps or not starting at 0
(episodes deleted without renumbering); v3.0 files in several chunks, meta/episodes split over files and chunks out of
episode order; cameras of different sizes and codecs; episodes of 1 and 2 frames under windows past both ends. Each
set is test_iterator's dataset (or one like it) rewritten, so its samples are checked by ``_check_sample`` (rows by
the generator's formulas, frames by their markers)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lerobot_dali import open_dataset
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.errors import DatasetError
from tests.test_cli import _info_json
from tests.test_iterator import LENGTHS, _dataset, assert_each_frame_read_once_as_its_own

CAM1 = "observation.images.cam1"
#: Episodes kept of test_iterator's 5: a gap (episode 2 deleted), and a gap with no episode 0 (0, 1 and 3 deleted).
KEPT = {"gap": [0, 1, 3], "from_2": [2, 4]}
#: meta/episodes files (chunk, file) of test_iterator's dataset with chunks_size=2, and the episodes of each, in the
#: rows' order: none holds the episodes of the data file of its name, and the files sort out of episode order.
EPISODE_FILES = {(1, 0): [1, 0], (0, 0): [4], (0, 1): [3, 2]}
#: Episodes of 1 and 2 frames among longer ones (files {0, 1} and {2, 3}: the 1-frame one ends its file, the
#: 2-frame one starts its own), and windows reaching past both ends of each (all but the camera's of the 5-frame one).
SHORT = [4, 1, 2, 5]
WIDE = {
    "observation.state": [-0.3, 0.0, 0.3],
    "action": [-0.1, 0.0, 0.1, 0.2],
    "observation.images.cam0": [-0.2, 0.0, 0.2],
}


def without_episodes(root: Path, kept: Sequence[int]) -> Path:
    """``root`` (a writable copy of test_iterator's dataset, v3.0 or v2.1) holding only the episodes ``kept``, as a
    hand edit or a tool that does not renumber leaves it: the others' rows, metadata and v2.1 files gone (a v3.0 data
    file left with no rows too), info.json's totals counting the kept; each kept episode keeps its episode_index, its
    rows' ``index`` (and v3.0 ``dataset_from_index``), its files and its seconds of them."""
    keep = pa.array(kept, pa.int64())
    for path in (root / "data").rglob("*.parquet"):
        rows = pq.read_table(path)
        if pc.any(pc.is_in(rows["episode_index"], keep)).as_py():
            pq.write_table(rows.filter(pc.is_in(rows["episode_index"], keep)), path)
        else:
            path.unlink()
    for path in (root / "meta/episodes").rglob("*.parquet"):  # (v3.0)
        table = pq.read_table(path)
        pq.write_table(table.filter(pc.is_in(table["episode_index"], keep)), path)
    for path in (root / "meta").glob("episodes*.jsonl"):  # (v2.1: episodes.jsonl, episodes_stats.jsonl)
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if json.loads(line)["episode_index"] in kept))
    for path in (root / "videos").rglob("episode_*.mp4"):  # (v2.1)
        if int(path.stem.removeprefix("episode_")) not in kept:
            path.unlink()
    info = json.loads((root / "meta/info.json").read_text())
    info.update(total_episodes=len(kept), total_frames=sum(LENGTHS[e] for e in kept))
    if info["codebase_version"] == "v2.1":
        info["total_videos"] = 2 * len(kept)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


def episode_metadata_in_files(root: Path, files: Mapping[tuple[int, int], Sequence[int]]) -> Path:
    """``root`` (a writable copy of a generated v3.0 dataset, its meta/episodes one file) with the rows of the
    episodes ``files[(c, f)]`` in meta/episodes/chunk-c/file-f.parquet, in that order, each row's
    ``meta/episodes/chunk_index`` and ``file_index`` naming its file, as LeRobot writes them."""
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    path.unlink()
    for (chunk, file), episodes in files.items():
        rows = table.take(pa.array(episodes, pa.int64()))
        for name, value in (("chunk_index", chunk), ("file_index", file)):
            column = f"meta/episodes/{name}"
            rows = rows.set_column(rows.column_names.index(column), column, pa.array([value] * len(rows), pa.int64()))
        path = root / f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, path)
    return root


def camera_from(root: Path, other: Path, camera: str) -> Path:
    """``root`` (a writable copy of a generated v3.0 dataset) with ``camera``'s video files and info.json feature
    those of ``other`` (generated with the same episodes and files, at another size or codec)."""
    shutil.rmtree(root / "videos" / camera)
    shutil.copytree(other / "videos" / camera, root / "videos" / camera)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][camera] = json.loads((other / "meta/info.json").read_text())["features"][camera]
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


@pytest.fixture(params=["v3.0", "v2.1"])
def version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("kept", KEPT.values(), ids=KEPT.keys())
def test_episodes_deleted_without_renumbering_read_each_kept_frame_once_as_its_own(
    make_ds, copy_ds, version: str, kept: list[int]
) -> None:
    """Epochs of the whole dataset and of ``episodes=`` all kept but the first."""
    root = without_episodes(copy_ds(_dataset(make_ds, "vp9", version=version)), kept)
    assert_each_frame_read_once_as_its_own(root, kept)
    assert_each_frame_read_once_as_its_own(root, kept[1:], selected=True)


@pytest.mark.parametrize(
    ("kept", "asked", "indices"), [(KEPT["gap"], [2], "0..3 but for 2"), (KEPT["from_2"], [3, 0], "2..4 but for 3")],
    ids=KEPT.keys(),
)  # fmt: skip
def test_asking_a_deleted_episode_names_the_gaps(
    make_ds, copy_ds, version: str, kept: list[int], asked: list[int], indices: str
) -> None:
    """It said the dataset held the episodes "with indices 0..3" where episode 2, inside that span, was the one asked
    and refused; the indices missing from the span are named."""
    root = without_episodes(copy_ds(_dataset(make_ds, "vp9", version=version)), kept)
    said = (
        f"episodes {sorted(asked)} are not in this dataset, which holds {len(kept)} episodes with indices {indices}: "
    )
    with pytest.raises(DatasetError, match=re.escape(said + "pass episodes=[...] of those")):
        open_dataset(root, episodes=asked)


def test_check_and_info_read_the_kept_episodes_and_probe_the_first_of_them(make_ds, copy_ds, version, capsys) -> None:
    """check reads the 2 kept episodes' 13 rows and their 2 files a camera, finding nothing; info counts those files
    and probes episode 2's video (v2.1's episode_000002.mp4, 7 frames; v3.0's file-001, with episode 3's, 11), not a
    deleted episode's (v2.1's episode_000000.mp4 is gone)."""
    root = without_episodes(copy_ds(_dataset(make_ds, "vp9", version=version)), KEPT["from_2"])
    report = check_dataset(open_dataset(root), workers=0)
    assert report.ok and (report.episodes, report.rows, report.video_files) == (2, 13, 4)
    info = _info_json(capsys, str(root))
    assert (info["total_episodes"], info["data_files"], info["episodes_per_data_file"]) == (2, 2, {"min": 1, "max": 1})
    for camera in info["cameras"].values():
        assert (camera["video_files"], camera["episodes_per_file"]) == (2, {"min": 1, "max": 1})
        assert camera["frame_count"] == (LENGTHS[2] if version == "v2.1" else LENGTHS[2] + LENGTHS[3])


def test_v3_files_in_several_chunks_with_episode_metadata_split_out_of_order_read_each_frame_once(
    make_ds, copy_ds, capsys
) -> None:
    """chunks_size=2: data and video files chunk-000/file-000 {0, 1}, chunk-000/file-001 {2, 3}, chunk-001/file-000
    {4}; meta/episodes chunk-000/file-000 {4}, chunk-000/file-001 {3, 2}, chunk-001/file-000 {1, 0}. An epoch reads
    every frame once as its own, and check and info read the 5 episodes, 3 files each and episode 0's video."""
    root = copy_ds(_dataset(make_ds, "vp9", chunks_size=2))
    assert (root / "data/chunk-001/file-000.parquet").is_file()  # (the generator rolls chunks as LeRobot does)
    episode_metadata_in_files(root, EPISODE_FILES)
    assert_each_frame_read_once_as_its_own(root, range(5))
    report = check_dataset(open_dataset(root), workers=0)
    assert report.ok and (report.episodes, report.rows, report.video_files) == (5, sum(LENGTHS), 6)
    info = _info_json(capsys, str(root))
    assert (info["data_files"], info["episodes_per_data_file"]) == (3, {"min": 1, "max": 2})
    for camera in info["cameras"].values():
        assert (camera["video_files"], camera["episodes_per_file"]) == (3, {"min": 1, "max": 2})
        assert camera["frame_count"] == LENGTHS[0] + LENGTHS[1]


@pytest.mark.parametrize("image_size", [None, (48, 64)])
def test_cameras_of_different_sizes_and_codecs_read_each_at_its_size_or_the_one_asked(
    make_ds, copy_ds, capsys, image_size: tuple[int, int] | None
) -> None:
    """Camera 0 VP9 96x128 (DALI's CPU decoder), camera 1 H.264 64x96 (the workers): each camera's frames come at its
    own size, or both at ``image_size``, every one its episode's; info names each camera's codec and size."""
    root = camera_from(copy_ds(_dataset(make_ds, "vp9")), _dataset(make_ds, "h264", size=(64, 96)), CAM1)
    sizes = ((96, 128), (64, 96)) if image_size is None else (image_size, image_size)
    assert_each_frame_read_once_as_its_own(root, range(5), sizes=sizes, image_size=image_size)
    cameras = _info_json(capsys, str(root))["cameras"]
    assert [(c["codec"], c["resolution"]) for c in cameras.values()] == [("vp9", [96, 128]), ("h264", [64, 96])]


@pytest.mark.parametrize("codec", ["vp9", "h264"])  # (DALI's CPU decoder; the workers)
def test_episodes_of_one_and_two_frames_pad_windows_past_both_ends(make_ds, codec: str) -> None:
    """Every window of the 1- and 2-frame episodes reaches before the first frame and past the last: each reads the
    episode's own edge rows and frames, padded (``_is_pad``) where outside it, never a neighbour's in the file."""
    root = make_ds(episodes=4, frames_per_episode=SHORT, cameras=2, codec=codec, fps=10, episodes_per_file=2, gop=4)
    assert_each_frame_read_once_as_its_own(root, range(4), lengths=SHORT, deltas=WIDE)
