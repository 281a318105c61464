"""A v3.0 data file that lacks the column of a feature read is refused when the iterator is built, naming the file:
opening read every data file's footer anyway (its row count), and the footer holds the column names. It failed
only once one of its episodes was read, with shuffling at any point of an epoch, maybe hours into training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import SchemaMismatchError
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.mixture import DALILeRobotMixture
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

LENGTHS = [3, 4, 5, 3, 4, 5]
SPEC = dict(episodes=6, frames_per_episode=LENGTHS, cameras=1, codec="vp9", episodes_per_file=2, size=(64, 64))
LAST_FILE = "data/chunk-000/file-002.parquet"  # episodes 4 and 5


def _drop_column(root: Path, relative: str, column: str) -> None:
    path = root / relative
    pq.write_table(pq.read_table(path).drop_columns([column]), path)


def _indices(it: DALILeRobotIterator) -> list[int]:
    try:
        return sorted(i for batch in it for i in batch["index"].tolist())
    finally:
        it.close()


def _iterator(dataset, **kw) -> DALILeRobotIterator:
    return DALILeRobotIterator(dataset, batch_size=2, device="cpu", num_workers=0, drop_last=False, **kw)


def test_a_later_data_file_lacking_a_column_is_refused_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    _drop_column(root, LAST_FILE, "action")
    pattern = r"file-002\.parquet: declared feature\(s\) \['action'\] have no column in the data file \(columns"
    with pytest.raises(SchemaMismatchError, match=pattern):
        _iterator(root)
    with pytest.raises(SchemaMismatchError, match=pattern):
        _iterator(open_dataset(root))  # (a reader opened first)
    # Episodes of the other files, or the other keys, still read: every frame once.
    assert _indices(_iterator(root, episodes=[0, 1, 2, 3], shuffle=False)) == list(range(sum(LENGTHS[:4])))
    assert _indices(_iterator(root, keys=["observation.state"])) == list(range(sum(LENGTHS)))
    with pytest.raises(SchemaMismatchError, match=r"\['action'\] with keys=\[\.\.\.\] naming the features to read"):
        _iterator(root)
    # (the other files hold it, as info.json says: dropping it from info.json, the advice alone, would not mend it)
    alone = r"; 2 of the 3 data files read lack none: rewrite the file\(s\) lacking columns, or leave out their"
    with pytest.raises(SchemaMismatchError, match=alone):
        _iterator(root)


@pytest.mark.parametrize("column", ["timestamp", "frame_index", "index"])
def test_a_lacking_index_column_says_to_mend_the_files_as_keys_cannot_leave_it_out(make_ds, copy_ds, column) -> None:
    """The message told to "select other keys/cameras", which cannot leave out an index column: every batch reads it,
    and with keys= that leave it out the same error came once the first batch was read."""
    root = copy_ds(make_ds(**SPEC))
    _drop_column(root, LAST_FILE, column)
    advice = rf"\['{column}'\] are index columns every batch reads, whatever keys= selects: re-download the dataset"
    with pytest.raises(SchemaMismatchError, match=advice):
        _iterator(root)
    with pytest.raises(SchemaMismatchError, match=advice):
        _indices(_iterator(root, keys=["observation.state"], episodes=[4, 5]))


def test_the_message_counts_the_other_files_lacking_columns(make_ds, copy_ds) -> None:
    root = copy_ds(make_ds(**SPEC))
    _drop_column(root, "data/chunk-000/file-001.parquet", "observation.state")
    _drop_column(root, LAST_FILE, "action")
    with pytest.raises(SchemaMismatchError, match=r"file-001\.parquet: .*\['observation\.state'\].*and 1 more data"):
        _iterator(root)
    with pytest.raises(SchemaMismatchError, match=r"; 1 of the 3 data files read lack none: rewrite"):
        _iterator(root)


def test_a_mixture_refuses_a_drifted_file_of_what_it_reads_and_not_of_what_it_leaves_out(make_ds, tmp_path) -> None:
    first = shutil.copytree(make_ds(**SPEC), tmp_path / "first")
    second = shutil.copytree(make_ds(**SPEC, seed=1), tmp_path / "second")
    _drop_column(second, LAST_FILE, "action")
    with pytest.raises(SchemaMismatchError, match=r"second/data/chunk-000/file-002\.parquet: .*\['action'\]"):
        DALILeRobotMixture([first, second], batch_size=4, device="cpu", num_workers=0)
    mixture = DALILeRobotMixture([first, second], batch_size=4, device="cpu", num_workers=0, keys=["observation.state"])
    assert "action" not in next(iter(mixture))
    mixture.close()


def test_a_remote_dataset_is_refused_from_the_kept_footers_too(make_ds, copy_ds, monkeypatch) -> None:
    from lerobot_dali import episode_data_files

    root = copy_ds(make_ds(**SPEC))
    _drop_column(root, LAST_FILE, "action")
    reads: list[str] = []
    real = episode_data_files._footer
    monkeypatch.setattr(
        episode_data_files, "_footer", lambda loc, path, **kw: reads.append(path) or real(loc, path, **kw)
    )
    for _ in range(2):
        with pytest.raises(SchemaMismatchError, match=r"file-002\.parquet: .*\['action'\] have no column"):
            _iterator(open_dataset("fakeremote://", storage_options={"root": str(root)}))
    assert len(reads) == 3  # the second open read no footer: the kept ones said which columns each file holds


def test_a_fixed_size_column_of_another_width_is_refused_from_the_kept_footers_too(make_ds, copy_ds) -> None:
    """A column stored as fixed-size lists (as LeRobot's v2.1 files are, and a v3.0 file converted from them may be)
    says its width in the footer: a file whose width is not the declared shape is refused when the iterator is
    built, from the footers the open read or, remote, kept."""
    root = copy_ds(make_ds(**SPEC))
    path = root / LAST_FILE
    table = pq.read_table(path)
    wide = pa.array([[*row, 0.0] for row in table["action"].to_pylist()], pa.list_(pa.float32(), 8))
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", wide), path)
    pattern = r"file-002\.parquet: column 'action' holds vectors of length \[8\] but info\.json declares shape \[7\]"
    with pytest.raises(SchemaMismatchError, match=pattern):
        _iterator(root)
    for _ in range(2):  # the second open reads the kept footers
        with pytest.raises(SchemaMismatchError, match=pattern):
            _iterator(open_dataset("fakeremote://", storage_options={"root": str(root)}))
