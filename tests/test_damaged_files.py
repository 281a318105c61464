"""Random damage to one file of a dataset (a run of bytes flipped or zeroed, or the file cut short): a pass over it
ends in values or in one of lerobot-dali's errors (a ``DatasetError``) naming what is wrong, never in a bare
third-party exception (numpy's, pyarrow's, Python's own). And damage to a file of the cache a remote pass leaves
is never served: the next pass reads the same values.

Cases are drawn from a seeded generator, so a failing one is reproduced by its seed: ``LEROBOT_DALI_DAMAGE=N`` draws
N per dataset (default a few, for CI) from seed ``LEROBOT_DALI_DAMAGE_FROM=K`` on, read by
``LEROBOT_DALI_DAMAGE_WORKERS`` worker processes (default 0: in-process). The values a damaged file still gives are
not checked: FFmpeg conceals much damage inside frames, and LeRobot's parquet files carry no page checksums (README,
*Errors*). The first runs (about 1,500 cases by hand) found eight ways through, each mended with a test of its own:
sample tables placing frames outside mdat (wrong frames, no error), ctts reordering frames, an AV1 header decoding
1x1 frames (numpy's ValueError), a stsz count of 3.4 billion (a 25 GiB allocation), a parquet page header that does
not parse (pyarrow's OSError), parquet column names and task strings that are not UTF-8, and JSON metadata that is
not UTF-8 (UnicodeDecodeError). The cache test found a ninth: a stored packet index with a damaged zip header
(zipfile's NotImplementedError). A later sweep (seed 9266) found a tenth: a PNG whose chunk lengths no longer fit,
which Pillow answers with a builtin SyntaxError. Holding ``lerobot-dali check`` to a pass found an eleventh (seed
11018): a keyframe that decodes in one run from the GOP before but not after a decoder reset, which check missed.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dali.cache_dirs import cache_root
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.errors import DatasetError
from lerobot_dali.iterator import DALILeRobotIterator
from tests.http_server import FolderServer

CASES = int(os.environ.get("LEROBOT_DALI_DAMAGE", "10"))
FIRST = int(os.environ.get("LEROBOT_DALI_DAMAGE_FROM", "0"))
#: Worker processes per pass (default none: in-process, fast); errors then cross DALI's worker boundary.
WORKERS = int(os.environ.get("LEROBOT_DALI_DAMAGE_WORKERS", "0"))
#: The CPU decode route (AV1; H.264 with B-frames and 30-frame GOPs), DALI's CPU decoder (VP9), v2.1's file per
#: episode and JSON lines, and cameras stored as PNG images in the data files.
DATASETS = {
    "av1": dict(codec="av1"),
    "vp9": dict(codec="vp9"),
    "h264_gop30": dict(codec="h264", gop=30),
    "v2.1": dict(codec="av1", version="v2.1"),
    "images": dict(image_cameras=True),
}


def _damage(root: Path, seed: int) -> str:
    """Damage one file of ``root`` as ``seed`` draws it; returns what was done, for the failure message. Files are
    drawn in order of suffix and size first: a cache's file names hash URLs, whose port changes from run to run."""
    rng = random.Random(seed)
    files = (p for p in root.rglob("*") if p.is_file())
    path = rng.choice(sorted(files, key=lambda p: (p.suffix, p.stat().st_size, p.as_posix())))
    raw = bytearray(path.read_bytes())
    mode = rng.choice(["flip", "zeros", "cut"])
    if mode == "cut" or not raw:
        cut = rng.randrange(max(len(raw), 1))
        path.write_bytes(bytes(raw[:cut]))
        return f"{path.relative_to(root)} cut to {cut} of {len(raw)} bytes"
    at, count = rng.randrange(len(raw)), rng.choice([1, 4, 16])
    for i in range(at, min(at + count, len(raw))):
        raw[i] = 0 if mode == "zeros" else raw[i] ^ rng.randrange(1, 256)
    path.write_bytes(bytes(raw))
    return f"{path.relative_to(root)}: {count} bytes {'zeroed' if mode == 'zeros' else 'flipped'} at {at}"


def _iterator(root: Path | str, seed: int) -> DALILeRobotIterator:
    """``root`` (a folder or a URL) opened as every case reads it."""
    deltas = {"observation.images.cam0": [-0.1, 0.0], "action": [0.0, 0.1]}
    return DALILeRobotIterator(
        root, batch_size=4, device="cpu", num_workers=WORKERS, seed=seed, delta_timestamps=deltas
    )


def _read(root: Path | str, seed: int) -> list[dict[str, np.ndarray]]:
    """One pass over ``root``: its batches' arrays (copies: a batch may share memory with the next)."""
    it = _iterator(root, seed)
    try:
        return [{k: v.numpy().copy() for k, v in batch.items() if isinstance(v, torch.Tensor)} for batch in it]
    finally:
        it.close()


def _samples(batches: list[dict[str, np.ndarray]]) -> int:
    return sum(len(batch["index"]) for batch in batches)


def _dataset(make_ds, name: str) -> Path:
    return make_ds(episodes=4, frames_per_episode=20, episodes_per_file=2, size=(64, 64), **DATASETS[name])


def _source(root: Path, remote: bool, server: FolderServer, base: Path) -> Path | str:
    return f"{server.url}/{root.relative_to(base).as_posix()}" if remote else root


@pytest.mark.parametrize("remote", [False, True], ids=["local", "http"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_undamaged_every_dataset_reads_whole(
    make_ds, tmp_path_factory, basetemp_server, dataset: str, remote: bool
) -> None:
    """The control: an error below is the damage's, not the setting's."""
    root = _dataset(make_ds, dataset)
    assert _samples(_read(_source(root, remote, basetemp_server, tmp_path_factory.getbasetemp()), 0)) == 80


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES))
@pytest.mark.parametrize("dataset", DATASETS)
def test_a_damaged_file_gives_values_or_an_error_of_ours(
    make_ds,
    copy_ds,
    tmp_path_factory,
    basetemp_server: FolderServer,
    caplog: pytest.LogCaptureFixture,
    dataset: str,
    seed: int,
) -> None:
    """Every third case over HTTP: the remote route reads packets by byte range, and caches what it reads."""
    root = copy_ds(_dataset(make_ds, dataset))
    damage = _damage(root, seed)
    try:
        samples = _samples(_read(_source(root, seed % 3 == 2, basetemp_server, tmp_path_factory.getbasetemp()), seed))
    except DatasetError:
        return
    except Exception as e:
        pytest.fail(f"{damage}: {type(e).__name__} came through: {e}")
    # Every frame once, as undamaged; or the episodes the metadata lists where they are more than info.json's
    # total_episodes, which the reader warns of (fewer, as a JSON-lines file cut at a line's end, is refused).
    assert samples == 80 or "but the episode metadata lists" in caplog.text, damage


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES))
@pytest.mark.parametrize("dataset", DATASETS)
def test_check_reports_what_a_pass_would_meet(
    make_ds, copy_ds, tmp_path_factory, basetemp_server: FolderServer, dataset: str, seed: int
) -> None:
    """``lerobot-dali check`` is a long run's pre-flight: on a damaged dataset that opens, it reports a problem where a
    pass raises, and none where a pass reads it whole. (Not always the same error: check reports each episode's
    first problem, a shuffled pass meets whichever of them its order reaches first.) Every third case over HTTP."""
    root = copy_ds(_dataset(make_ds, dataset))
    damage = _damage(root, seed)
    try:
        it = _iterator(_source(root, seed % 3 == 2, basetemp_server, tmp_path_factory.getbasetemp()), seed)
    except DatasetError:
        return  # (refused when built, as check refuses when it opens)
    met = None
    try:
        try:
            for _ in it:
                pass
        except DatasetError as e:
            met = type(e).__name__
        found = {problem.error for problem in check_dataset(it.reader, decode=True, workers=0).problems}
    finally:
        it.close()
    assert bool(met) == bool(found), f"{damage}: a pass raises {met or 'nothing'}, check reports {found or 'nothing'}"


@pytest.mark.parametrize("seed", range(FIRST, FIRST + CASES // 2))
@pytest.mark.parametrize("dataset", ["av1", "v2.1"])
def test_a_damaged_cache_file_is_never_served(
    make_ds, tmp_path_factory, basetemp_server, dataset: str, seed: int
) -> None:
    """A remote pass leaves packet indexes and prefetched byte ranges (each with its crc32) under the cache root: one
    of its files damaged, the next pass reads the very same values (it checks, drops and reads again).
    """
    source = _source(_dataset(make_ds, dataset), True, basetemp_server, tmp_path_factory.getbasetemp())
    first = _read(source, seed)
    damage = _damage(cache_root(), seed)
    again = _read(source, seed)
    assert len(again) == len(first), damage
    for batch, before in zip(again, first, strict=True):
        assert batch.keys() == before.keys(), damage
        for key, values in before.items():
            np.testing.assert_array_equal(batch[key], values, err_msg=f"{damage}: {key}")
