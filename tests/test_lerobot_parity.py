"""Every sample against LeRobot's own ``LeRobotDataset``, where LeRobot is installed (skipped otherwise).

The rest of the suite checks LeRobot semantics against values the tests compute themselves; a shared
misreading of LeRobot would pass both sides. These tests read the same generated datasets with LeRobot and
compare every sample: keys, dtypes, shapes, tabular values, ``<key>_is_pad``, task strings and frames.

LeRobot pins its own torch and decodes with torchcodec, so they run in a separate environment, e.g.::

    python -m venv --system-site-packages /tmp/lrvenv
    /tmp/lrvenv/bin/pip install torch==2.13.0 torchvision torchcodec  # the CUDA build: torchcodec links it
    /tmp/lrvenv/bin/pip install --no-deps lerobot==0.4.4 && /tmp/lrvenv/bin/pip install 'datasets<5' \\
        'huggingface-hub<0.36' draccus==0.10.0 jsonlines einops deepdiff termcolor
    /tmp/lrvenv/bin/python -m pytest -m lerobot tests/test_lerobot_parity.py

(torchcodec needs FFmpeg's shared libraries: ``lerobot-dali diagnose`` says whether it found them.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lerobot_dali import DALILeRobotIterator
from lerobot_dali.bench_peers import lerobot_unavailable
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, torchcodec_unavailable

pytestmark = pytest.mark.lerobot

FPS = 30
LENGTHS = [12, 30, 7, 25, 16]
#: Windows that pad at both ends of the short episodes (7 frames < the 8-step action chunk).
WINDOWS = {
    "observation.images.cam0": [-2 / FPS, 0.0],
    "observation.state": [-1 / FPS, 0.0],
    "action": [k / FPS for k in range(8)],
}


@pytest.fixture(autouse=True)
def _needs_lerobot() -> None:
    why_not = lerobot_unavailable() or torchcodec_unavailable()  # LeRobot's default video backend is torchcodec
    if why_not is not None:
        pytest.skip(why_not)


def _ours(root: Path, windows: Mapping[str, Sequence[float]], **options: Any) -> dict[int, dict[str, Any]]:
    it = DALILeRobotIterator(
        str(root), batch_size=7, shuffle=False, device="cpu", delta_timestamps=windows, drop_last=False, **options
    )
    samples: dict[int, dict[str, Any]] = {}
    try:
        for batch in it:
            for row, index in enumerate(batch["index"].tolist()):
                assert index not in samples, f"sample {index} delivered twice"
                samples[index] = {key: values[row] for key, values in batch.items()}
    finally:
        it.close()
    return samples


def _lerobot(root: Path, windows: Mapping[str, Sequence[float]], episodes: list[int] | None = None) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(
        f"local/{root.name}", root=root, delta_timestamps={k: list(v) for k, v in windows.items()}, episodes=episodes
    )


def _assert_same_samples(
    ours: dict[int, dict[str, Any]], theirs: Any, *, frame_check: Callable[[torch.Tensor, torch.Tensor], None]
) -> None:
    expected_indices = sorted(int(theirs[i]["index"]) for i in range(len(theirs)))
    assert sorted(ours) == expected_indices
    for position in range(len(theirs)):
        expected = theirs[position]
        got = ours[int(expected["index"])]
        where = f"sample index {int(expected['index'])}"
        assert set(got) == set(expected), f"{where}: keys differ by {sorted(set(got) ^ set(expected))}"
        for key, value in expected.items():
            if isinstance(value, str):
                assert got[key] == value, f"{where}, {key}"
                continue
            assert (got[key].dtype, got[key].shape) == (value.dtype, value.shape), f"{where}, {key}"
            if key in theirs.meta.video_keys:
                frame_check(got[key], value)
            else:
                assert torch.equal(got[key], value), f"{where}, {key}: {got[key]} != {value}"


def _same_decode(got: torch.Tensor, expected: torch.Tensor) -> None:
    """FFmpeg's decoders (PyAV's, torchcodec's) are bit-exact by the codec's spec; what may differ is the
    YUV -> RGB conversion (measured: identical with torchcodec 0.17 against PyAV 18.1, both FFmpeg 8)."""
    assert (got - expected).abs().max().item() * 255 <= 3.01


def _dali_cpu_decode(got: torch.Tensor, expected: torch.Tensor) -> None:
    """DALI's CPU VP9 decoder converts YUV -> RGB its own way: the same frame, a few levels apart on average."""
    assert (got - expected).abs().mean().item() * 255 < 2.0


@pytest.mark.parametrize(
    ("codec", "gop", "frame_check"),
    [("av1", 2, _same_decode), ("h264", 30, _same_decode), ("hevc", 8, _same_decode), ("vp9", 4, _dali_cpu_decode)],
)
def test_every_sample_matches_lerobot(make_ds, codec: str, gop: int, frame_check: Callable[..., None]) -> None:
    root = make_ds(codec=codec, gop=gop, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    _assert_same_samples(_ours(root, WINDOWS), _lerobot(root, WINDOWS), frame_check=frame_check)


def test_workers_and_the_pyav_decoder_match_lerobot(make_ds) -> None:
    """torchcodec decodes for lerobot-dali too where it loads; PyAV in two workers is the other path."""
    root = make_ds(codec="h264", gop=30, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    ours = _ours(root, WINDOWS, num_workers=2, cpu_decode=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    _assert_same_samples(ours, _lerobot(root, WINDOWS), frame_check=_same_decode)


def test_image_cameras_match_lerobot(make_ds) -> None:
    root = make_ds(episodes=4, frames_per_episode=[9, 14, 5, 11], cameras=2, image_cameras=True, episodes_per_file=2)
    windows = {"observation.images.cam0": [-3 / FPS, 0.0, 2 / FPS], "action": [k / FPS for k in range(-2, 20)]}
    _assert_same_samples(_ours(root, windows), _lerobot(root, windows), frame_check=_same_decode)


def test_windows_longer_than_episodes_match_lerobot(make_ds) -> None:
    """10 fps, episodes of 1 to 14 frames, windows reaching 1 s back and 1.1 s ahead."""
    root = make_ds(
        codec="h264", gop=4, fps=10, episodes=4, frames_per_episode=[3, 14, 1, 8], cameras=1, episodes_per_file=3
    )
    windows = {
        "observation.images.cam0": [-1.0, -0.5, 0.0, 0.3],
        "observation.state": [-0.2, -0.1, 0.0],
        "action": [k / 10 for k in range(12)],
    }
    _assert_same_samples(_ours(root, windows), _lerobot(root, windows), frame_check=_same_decode)


def test_an_episode_subset_matches_lerobot(make_ds) -> None:
    root = make_ds(codec="av1", gop=2, episodes=5, frames_per_episode=LENGTHS, cameras=2, episodes_per_file=2)
    subset = [1, 3, 4]
    theirs = _lerobot(root, WINDOWS, episodes=subset)
    assert sorted({int(theirs[i]["episode_index"]) for i in range(len(theirs))}) == subset
    _assert_same_samples(_ours(root, WINDOWS, episodes=subset), theirs, frame_check=_same_decode)
    assert np.sum([LENGTHS[e] for e in subset]) == len(theirs)
