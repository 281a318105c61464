"""A v2.x dataset (a data file per episode) whose data files drifted from meta/episodes.jsonl is refused when it is
opened (a file missing, another row count than the episode's length) or when the iterator is built (a column of a
feature read missing), naming the file: each failed only once a shuffled epoch first read that episode, maybe hours
into training. The footers are read once at open, as v3.0's are, and kept for remote datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import EpisodeMetadataError, MissingDataFileError, SchemaMismatchError
from lerobot_dali.iterator import DALILeRobotIterator
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

LENGTHS = [3, 4, 5, 3, 4, 5]
# chunks_size=4: episodes 4 and 5 are in chunk-001.
SPEC = dict(
    episodes=6, frames_per_episode=LENGTHS, cameras=1, codec="vp9", size=(64, 64), version="v2.1", chunks_size=4
)
LAST = "data/chunk-001/episode_000005.parquet"


def _iterator(dataset, **kw) -> DALILeRobotIterator:
    return DALILeRobotIterator(dataset, batch_size=2, device="cpu", num_workers=0, drop_last=False, **kw)


def _indices(it: DALILeRobotIterator) -> list[int]:
    try:
        return sorted(i for batch in it for i in batch["index"].tolist())
    finally:
        it.close()


def test_an_episode_file_lacking_a_column_is_refused_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    pq.write_table(pq.read_table(root / LAST).drop_columns(["action"]), root / LAST)
    pattern = r"chunk-001/episode_000005\.parquet: declared feature\(s\) \['action'\] have no column"
    with pytest.raises(SchemaMismatchError, match=pattern):
        _iterator(root)
    # The other episodes, or the other keys, still read: every frame once.
    assert _indices(_iterator(root, episodes=[0, 1, 2, 3, 4], shuffle=False)) == list(range(sum(LENGTHS[:5])))
    assert _indices(_iterator(root, keys=["observation.state"])) == list(range(sum(LENGTHS)))


def test_an_episode_without_a_data_file_is_refused_at_open(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    (root / "data/chunk-000/episode_000003.parquet").unlink()
    (root / LAST).unlink()
    pattern = (
        r"chunk-000/episode_000003\.parquet is missing \(and 1 more episodes' data files\): meta/episodes\.jsonl "
        r"lists episode 3"
    )
    with pytest.raises(MissingDataFileError, match=pattern):
        open_dataset(root)
    assert open_dataset(root, episodes=[0, 1, 2, 4]).num_frames == 3 + 4 + 5 + 4


@pytest.mark.parametrize("remote", [False, True])
def test_a_wrong_chunks_size_is_named_when_the_files_lie_in_other_chunks(make_ds, copy_ds, remote: bool) -> None:
    root = copy_ds(make_ds(**SPEC))  # files in chunks of 4; info.json now says 2, placing episodes 2-3 in chunk 1
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "chunks_size": 2}))
    pattern = (
        r"chunk-001/episode_000002\.parquet is missing \(and 3 more episodes' data files\): info\.json's chunks_size=2 "
        r"puts episode 2 in chunk 1, but its data file lies in chunk 0; correct chunks_size"
    )
    with pytest.raises(MissingDataFileError, match=pattern):
        open_dataset("fakeremote://", storage_options={"root": str(root)}) if remote else open_dataset(root)


def test_an_episode_whose_file_holds_other_rows_than_its_length_is_refused_at_open(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    records = [json.loads(line) for line in (root / "meta/episodes.jsonl").read_text().splitlines()]
    records[4]["length"] = 3  # its file holds 4 rows
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pattern = r"chunk-001/episode_000004\.parquet: holds 4 rows, but meta/episodes\.jsonl gives episode 4 length 3;"
    with pytest.raises(EpisodeMetadataError, match=pattern):
        open_dataset(root)
    assert _indices(_iterator(root, episodes=[0, 5])) == [0, 1, 2, 19, 20, 21, 22, 23]


def test_a_remote_v2_dataset_reads_each_footer_once_and_keeps_it(make_ds, copy_ds, monkeypatch) -> None:
    from lerobot_dali import episode_data_files

    root = copy_ds(make_ds(**SPEC))
    pq.write_table(pq.read_table(root / LAST).drop_columns(["action"]), root / LAST)
    reads: list[str] = []
    real = episode_data_files._footer
    monkeypatch.setattr(
        episode_data_files, "_footer", lambda loc, path, **kw: reads.append(path) or real(loc, path, **kw)
    )
    for _ in range(2):
        with pytest.raises(SchemaMismatchError, match=r"episode_000005\.parquet: .*\['action'\] have no column"):
            _iterator(open_dataset("fakeremote://", storage_options={"root": str(root)}))
    assert sorted(Path(p).name for p in reads) == [f"episode_{i:06d}.parquet" for i in range(6)]  # the first open's


def _replace_action(path: Path, values: pa.Array) -> None:
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", values), path)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fixed_size_list", r"column 'action' holds vectors of length \[8\] but info\.json declares shape \[7\]"),
        ("string", r"column 'action' is a scalar column but info\.json declares shape \[7\]"),
    ],
)
def test_an_episode_file_whose_column_type_cannot_hold_the_shape_is_refused_when_the_iterator_is_built(
    make_ds, copy_ds, kind: str, message: str
) -> None:
    """LeRobot's v2.1 files store vectors as fixed-size lists: the footer says each one's length."""
    root = copy_ds(make_ds(**SPEC))
    rows = pq.read_table(root / LAST)["action"].to_pylist()
    if kind == "fixed_size_list":
        _replace_action(root / LAST, pa.array([[*row, 0.0] for row in rows], pa.list_(pa.float32(), 8)))
    else:
        _replace_action(root / LAST, pa.array([str(row) for row in rows]))
    advice = r"the data file and info\.json disagree: correct the shape in info\.json, or read the other features only"
    with pytest.raises(SchemaMismatchError, match=rf"chunk-001/episode_000005\.parquet: {message}.*; {advice}"):
        _iterator(root)  # (a scalar column's said no more than the mismatch)
    assert _indices(_iterator(root, keys=["observation.state"])) == list(range(sum(LENGTHS)))


def test_lists_of_varying_length_are_checked_as_their_rows_are_read(make_ds, copy_ds) -> None:
    """A footer does not say how long a variable-length list is: the row read refuses it, naming the file."""
    root = copy_ds(make_ds(**SPEC))
    rows = pq.read_table(root / LAST)["action"].to_pylist()
    _replace_action(root / LAST, pa.array([[*row, 0.0] for row in rows], pa.list_(pa.float32())))
    it = _iterator(root, episodes=[5])
    with pytest.raises(SchemaMismatchError, match=r"episode_000005\.parquet: column 'action' holds vectors of length"):
        next(iter(it))
    it.close()


def test_past_the_checked_episodes_a_missing_file_fails_when_read(make_ds, copy_ds, monkeypatch, caplog) -> None:
    """A footer read per episode is a request each where remote: a v2.1 dataset of 100,000 episodes would cost
    every node 100,000 of them before the first batch. Past a count the open checks none (and says so), and a
    missing file fails when its episode is read, as before the check."""
    from lerobot_dali import episode_data_files

    root = copy_ds(make_ds(**SPEC))
    (root / LAST).unlink()
    monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 5)
    with caplog.at_level("INFO", logger="lerobot_dali.episode_data_files"):
        reader = open_dataset(root)
    assert "6 episodes to read, a data file each: more than 5" in caplog.text
    assert reader.num_episodes == 6 and open_dataset(root, episodes=[0, 1, 2, 3, 4]).num_episodes == 5
    with pytest.raises(MissingDataFileError, match=r"chunk-001/episode_000005\.parquet is missing"):
        open_dataset(root, episodes=[0, 1, 2, 3, 5])  # (5 episodes, not past the count: each file is checked)
    with pytest.raises(MissingDataFileError, match=r"chunk-001/episode_000005\.parquet"):
        reader.read_episode(5)


def test_every_data_file_of_20_001_local_episodes_is_checked_at_open(make_ds, copy_ds) -> None:
    """Past 20,000 local episodes the open checked no data file, so a missing one failed only when a batch reached
    it, though a rebuild reads no footer again (:mod:`~lerobot_dali.row_count_store`). The bound is now the video
    survey's (:mod:`~lerobot_dali.checked_files`), whose headers are kept on disk alike."""
    from lerobot_dali import camera_codecs, episode_data_files

    assert episode_data_files.CHECKED_FILES == camera_codecs.CHECKED_FILES >= 100_000
    root = copy_ds(make_ds(episodes=1, frames_per_episode=3, cameras=1, codec="vp9", size=(64, 64), version="v2.1"))
    info = json.loads((root / "meta/info.json").read_text())
    n = 20_001  # (episode 0 has its data file, the others none)
    info.update(total_episodes=n, total_frames=3 * n, total_chunks=21, splits={"train": f"0:{n}"})
    (root / "meta/info.json").write_text(json.dumps(info))
    episode = json.loads((root / "meta/episodes.jsonl").read_text())
    lines = (json.dumps({**episode, "episode_index": e}) for e in range(n))
    (root / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
    pattern = r"chunk-000/episode_000001\.parquet is missing \(and 19999 more episodes' data files\)"
    with pytest.raises(MissingDataFileError, match=pattern):
        open_dataset(root)
