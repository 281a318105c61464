"""A data file whose ``episode_index`` (v3.0: and ``index``) column is not that of the episodes the metadata places in
it is refused when the iterator is built, from the footer statistics the open read anyway: it failed only when a
shuffled epoch first read one of its episodes. A file whose rows all read right has exactly the metadata's ranges,
so nothing that reads is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_union import concat_datasets
from lerobot_dali.errors import EpisodeMetadataError
from tests.test_task_index_range import LENGTHS, V2, V2_LAST, V3, V3_LAST
from tests.test_v2_episode_files import _indices, _iterator


def _rewrite(path: Path, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Data file ``path`` with column ``name`` replaced by ``change`` of its values."""
    table = pq.read_table(path)
    column = pa.array(change(np.asarray(table[name])), table.schema.field(name).type)
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, column), path)


@pytest.mark.parametrize(
    ("spec", "path", "name", "change", "said"),
    [
        (V3, V3_LAST, "episode_index", lambda e: np.full_like(e, 5), r"episode_index values run from 5 to 5, but the "
         r"episode metadata places episodes 4 to 5 in it"),
        (V3, "data/chunk-000/file-001.parquet", "index", lambda i: i + 100, r"index values run from 107 to 114, but "
         r"the episode metadata places rows \(dataset_from_index to dataset_to_index - 1\) 7 to 14 in it"),
        (V2, V2_LAST, "episode_index", lambda e: e + 1, r"episode_index values run from 6 to 6, but the episode "
         r"metadata places episodes 5 to 5 in it"),
    ],
    ids=["v3_episode_index", "v3_index", "v2_episode_index"],
)  # fmt: skip
def test_a_data_file_whose_index_columns_leave_its_episodes_is_refused_when_the_iterator_is_built(
    make_ds, copy_ds, spec, path, name, change, said
) -> None:
    root = copy_ds(make_ds(**spec))
    _rewrite(root / path, name, change)
    with pytest.raises(EpisodeMetadataError, match=rf"{path}: its {said}; the data file and the episode metadata"):
        _iterator(root)
    with pytest.raises(EpisodeMetadataError, match=rf"{path}: its {said}"):
        _iterator(concat_datasets([make_ds(**spec, seed=1), root]))
    others = [0, 1, 4, 5] if "file-001" in path else [0, 1, 2, 3]
    rows = [sum(LENGTHS[:e]) + i for e in others for i in range(LENGTHS[e])]
    assert _indices(_iterator(root, episodes=others, shuffle=False)) == rows  # (the other files read)


@pytest.mark.parametrize("spec", [V3, V2], ids=["v3", "v2"])
def test_good_data_files_and_a_partly_read_one_are_not_refused(make_ds, copy_ds, spec) -> None:
    root = copy_ds(make_ds(**spec))
    assert _indices(_iterator(root, shuffle=False)) == list(range(sum(LENGTHS)))
    if spec is V3:  # episode 4 of file-002 says 9: the file is not judged when episode 5 alone is read
        _rewrite(root / V3_LAST, "episode_index", lambda e: np.where(e == 4, 9, e))
        assert _indices(_iterator(root, episodes=[5], shuffle=False)) == list(range(sum(LENGTHS[:5]), sum(LENGTHS)))
