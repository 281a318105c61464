"""Request economy: opening and iterating a remote dataset costs a number of metadata requests that does not
grow with its number of files, and no worker asks the server about a file it was told about."""

from __future__ import annotations

from pathlib import Path

from lerobot_dali.dataset_reader import open_dataset
from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

METADATA_KINDS = ("info", "exists")


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
