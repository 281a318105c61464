"""Random augmentation through DALILeRobotIterator (CPU): each sample's draws follow it through batching,
workers, resume and ranks, because the external source computes them from the sample's identity."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lerobot_dali.augment import AugmentConfig, ColorJitter, GaussianBlur, RandomAffine, RandomResizedCrop
from lerobot_dali.augment_draws import draw_params
from lerobot_dali.augment_semantics import AUGMENT_SEMANTICS_VERSION
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.errors import ResumeStateError
from lerobot_dali.iterator import DALILeRobotIterator

LENGTHS = [5, 1, 7, 4, 6]  # the dataset of tests/test_iterator.py, so a session generates it once
CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"
DELTAS = {CAM0: [-0.1, 0.0], "observation.state": [-0.1, 0.0]}
CONFIG = AugmentConfig(
    resize=(48, 64),
    random_resized_crop=RandomResizedCrop(size=(32, 40), scale=(0.5, 1.0)),
    affine=RandomAffine(degrees=10.0, translate=(0.05, 0.05), scale=(0.9, 1.1)),
    color_jitter=ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.05),
    blur=GaussianBlur(sigma=(0.5, 1.5), probability=0.5, kernel_size=5),
)


def _dataset(make_ds) -> Path:
    return make_ds(episodes=5, frames_per_episode=LENGTHS, cameras=2, codec="vp9", fps=10, episodes_per_file=2, gop=4)


def _iterator(root: Path, **kwargs: Any) -> DALILeRobotIterator:
    options: dict[str, Any] = dict(
        batch_size=4, delta_timestamps=DELTAS, shuffle=False, seed=0, device="cpu", num_workers=0, augment=CONFIG
    )
    options.update(kwargs)
    return DALILeRobotIterator(root, **options)


def _batches(it: DALILeRobotIterator, count: int | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in it:
        out.append(batch)
        if count is not None and len(out) == count:
            break
    return out


def _assert_batches_equal(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, b[key]), f"batch {k}: {key} differs"
            else:
                assert value == b[key], f"batch {k}: {key} differs"


def test_shapes_and_the_seed_decides_the_augmentation(make_ds) -> None:
    root = _dataset(make_ds)
    first = _batches(_iterator(root, seed=5))
    assert len(first) == 5  # 23 samples, last partial batch dropped
    batch = first[0]
    assert batch[CAM0].shape == (4, 2, 3, 32, 40) and batch[CAM0].dtype == torch.float32
    assert batch[CAM1].shape == (4, 3, 32, 40) and batch[CAM1].dtype == torch.float32
    assert float(batch[CAM0].min()) >= 0.0 and float(batch[CAM0].max()) <= 1.0
    assert not any(".__augment." in key for key in batch), "draws are inputs of the graph, not batch entries"
    _assert_batches_equal(_batches(_iterator(root, seed=5)), first)
    other = _batches(_iterator(root, seed=6))
    for a, b in zip(first, other, strict=True):
        assert torch.equal(a["index"], b["index"])  # unshuffled: the seed changes the augmentation only
        assert not torch.equal(a[CAM0], b[CAM0]) and not torch.equal(a[CAM1], b[CAM1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_reproduces_the_augmented_frames(make_ds, num_workers: int) -> None:
    root = _dataset(make_ds)
    kwargs = dict(shuffle=True, seed=7, episode_pool_size=2, num_workers=num_workers, batch_size=3)
    full = _iterator(root, **kwargs)
    whole = _batches(full)
    full.set_epoch(1)
    whole += _batches(full)
    full.close()

    first = _iterator(root, **kwargs)
    seen = _batches(first, 2)
    state = first.state_dict()
    first.close()
    resumed = _iterator(root, **kwargs)
    resumed.load_state_dict(state)
    seen += _batches(resumed)
    resumed.set_epoch(1)
    seen += _batches(resumed)
    resumed.close()
    _assert_batches_equal(seen, whole)


@pytest.mark.parametrize(
    ("augment", "warns"),
    [(CONFIG, True), (AugmentConfig(color_jitter=CONFIG.color_jitter, blur=CONFIG.blur), False), (None, False)],
)
def test_a_state_saved_before_the_affine_changed_warns_where_the_resume_turns(
    make_ds, caplog: pytest.LogCaptureFixture, augment: AugmentConfig | None, warns: bool
) -> None:
    # States recorded no augmentation semantics: one saved before RandomAffine turned the other way and moved after
    # the colour jitter resumed silently, augmenting otherwise than the run so far.
    it = _iterator(_dataset(make_ds), augment=augment)
    state = it.state_dict()
    assert state["augment_version"] == AUGMENT_SEMANTICS_VERSION
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        it.load_state_dict(state)
        assert caplog.text == ""  # saved by this version
        it.load_state_dict({k: v for k, v in state.items() if k != "augment_version"})  # saved before it
    it.close()
    said = f"saved by an earlier lerobot_dali (augmentation semantics 1, now {AUGMENT_SEMANTICS_VERSION})"
    assert (said in caplog.text) == warns, caplog.text
    assert ("now turns clockwise" in caplog.text and "runs after the colour jitter" in caplog.text) == warns
    with pytest.raises(ResumeStateError, match="augment_version must be a version"):
        it.load_state_dict({**state, "augment_version": "2"})


def _brightness_of(augmented: torch.Tensor, plain: torch.Tensor) -> np.ndarray:
    """Per sample, the factor that turns ``plain`` into ``augmented`` (least squares over unsaturated pixels)."""
    factors = []
    for out, raw in zip(augmented.double().numpy(), plain.double().numpy(), strict=True):
        keep = (out < 250) & (raw > 20)
        factors.append(float((out[keep] * raw[keep]).sum() / (raw[keep] ** 2).sum()))
    return np.array(factors)


def _epochs(it: DALILeRobotIterator, epochs: int) -> list[list[dict[str, Any]]]:
    out = []
    for epoch in range(epochs):
        it.set_epoch(epoch)
        out.append(_batches(it))
    it.close()
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_applies_the_draws_of_its_own_keys(make_ds, rank: int) -> None:
    # Brightness only, on uint8 frames: the factor each sample got can be read back from the frames.
    root = _dataset(make_ds)
    config = AugmentConfig(color_jitter=ColorJitter(brightness=(0.4, 1.0)))
    options = dict(delta_timestamps=None, rank=rank, world_size=2, return_uint8=True)
    plain = _epochs(_iterator(root, augment=None, **options), 2)
    bright = _epochs(_iterator(root, augment=config, **options), 2)

    def drawn(for_rank: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        keys = np.stack([np.full(len(positions), for_rank), np.full(len(positions), epoch), positions], axis=1)
        return draw_params(config, seed=0, stream="camera1", keys=keys, frame_size=None)["brightness"]

    for epoch in range(2):
        assert len(bright[epoch]) == len(plain[epoch]) >= 2
        got = np.concatenate(
            [_brightness_of(b[CAM1], p[CAM1]) for b, p in zip(bright[epoch], plain[epoch], strict=True)]
        )
        for b, p in zip(bright[epoch], plain[epoch], strict=True):
            assert torch.equal(b["index"], p["index"])
        positions = np.arange(len(got))  # the rank's stream positions of this epoch, across batches
        np.testing.assert_allclose(got, drawn(rank, epoch, positions), atol=0.01, err_msg=f"epoch {epoch}")
        for other in (drawn(1 - rank, epoch, positions), drawn(rank, 1 - epoch, positions)):
            assert np.mean(np.abs(got - other) < 0.01) < 0.5, "another rank or epoch would draw the same"


def test_every_frame_of_a_window_gets_the_same_transform(make_ds) -> None:
    # An episode's first sample has a padded window: both frames show row 0, so they must come out equal.
    root = _dataset(make_ds)
    batches = _batches(_iterator(root, batch_size=23, drop_last=False))
    (batch,) = batches
    padded = batch[f"{CAM0}_is_pad"][:, 0]
    assert int(padded.sum()) == len(LENGTHS)
    for i in np.flatnonzero(padded.numpy()):
        assert torch.equal(batch[CAM0][i, 0], batch[CAM0][i, 1]), f"sample {i}: frames of one window differ"
    for i in np.flatnonzero(~padded.numpy()):
        assert not torch.equal(batch[CAM0][i, 0], batch[CAM0][i, 1]), f"sample {i}: distinct frames came out equal"
    # Distinct samples still get distinct draws: the padded windows show different images after augmentation.
    firsts = [batch[CAM0][i, 0] for i in np.flatnonzero(padded.numpy())]
    assert all(not torch.equal(firsts[0], other) for other in firsts[1:])


def test_a_lerobot_subset_config_picks_per_camera_as_drawn(make_ds) -> None:
    # LeRobot's transforms, one per sample of brightness 0.5 and (identity) sharpness, each camera on its own.
    root = _dataset(make_ds)
    jitter = {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": [0.5, 0.5]}}
    sharp = {"weight": 1.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [1.0, 1.0]}}
    config = AugmentConfig.from_lerobot(
        {"enable": True, "max_num_transforms": 1, "tfs": {"brightness": jitter, "sharpness": sharp}}
    )
    options = dict(delta_timestamps=None, return_uint8=True)
    (plain,) = _epochs(_iterator(root, augment=None, **options), 1)
    (augmented,) = _epochs(_iterator(root, augment=config, **options), 1)
    keys = np.stack([np.zeros(23, int), np.zeros(23, int), np.arange(23)], axis=1)
    picked = {}
    for camera, stream in ((CAM0, "camera0"), (CAM1, "camera1")):
        drawn = draw_params(config, seed=0, stream=stream, keys=keys, frame_size=None)["brightness"]
        got = np.concatenate([_brightness_of(a[camera], p[camera]) for a, p in zip(augmented, plain, strict=True)])
        np.testing.assert_allclose(got, drawn[: len(got)], atol=0.01, err_msg=camera)
        picked[camera] = drawn[: len(got)] == 0.5
    assert 0 < picked[CAM0].sum() < len(picked[CAM0])
    assert (picked[CAM0] != picked[CAM1]).any(), "cameras draw their subsets on their own"


def test_a_resume_on_other_ranks_draws_no_key_an_old_rank_drew(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-sharded rest of an epoch counted its positions from 0 again, so the rank resumed on 1 rank drew the
    very parameters old rank 0 had drawn for the samples it consumed (18 of 84 samples of the epoch in a review:
    2 ranks x 3 batches of 6, then 1 rank); it counts on from the old ranks' position, in a chain of resumes too."""
    import lerobot_dali.batch_source as batch_source
    from lerobot_dali.stream_state import merge_rank_states

    drawn: list[tuple[int, int, int]] = []

    def recorded(config: Any, *, keys: np.ndarray, **kwargs: Any) -> dict[str, np.ndarray]:
        drawn.extend((int(r), int(e), int(p)) for r, e, p in keys)
        return draw_params(config, keys=keys, **kwargs)

    monkeypatch.setattr(batch_source, "draw_params", recorded)
    root = _dataset(make_ds)
    config = AugmentConfig(color_jitter=ColorJitter(brightness=(0.5, 1.5)))
    options = dict(augment=config, delta_timestamps=None, shuffle=True, episode_pool_size=2, batch_size=2)

    def consume(states: list[dict[str, Any]], world_size: int, batches: int | None) -> tuple[list[Any], list[Any]]:
        """Each rank's keys of the samples it took (not what prefetching drew beyond), and its state."""
        taken_keys, saved = [], []
        for rank in range(world_size):
            it = _iterator(root, rank=rank, world_size=world_size, **options)
            if states:
                it.load_state_dict(merge_rank_states(states))
            drawn.clear()
            taken = _batches(it, batches) if batches is not None else _batches(it)
            once = list(dict.fromkeys(drawn))  # (a rebuilt pipeline draws its first batches again)
            taken_keys += once[: sum(len(b["index"]) for b in taken)]
            saved.append(it.state_dict())
            it.close()
        return taken_keys, saved

    first, states = consume([], 2, 1)  # 2 ranks: positions 0, 1 each
    assert sorted(first) == [(r, 0, p) for r in (0, 1) for p in (0, 1)]
    second, states = consume(states, 3, 1)  # re-sharded on 3 ranks: positions 2, 3 each
    assert sorted(second) == [(r, 0, p) for r in (0, 1, 2) for p in (2, 3)]
    rest, _ = consume(states, 1, None)  # the rest of the epoch on 1 rank: from position 4
    assert len(rest) == 12 and not set(rest) & set(first + second), rest  # 13 left, the last batch's 1 dropped
    assert rest == [(0, 0, p) for p in range(4, 4 + len(rest))]


def test_a_resume_on_other_ranks_draws_alike_in_the_workers(make_ds) -> None:
    """The re-sharded rest's draw keys count on from the old ranks' position (``SampleOrder.key_offset``) in the
    worker processes too: their copies of the order carry the resumed segments, so 2 workers draw as none."""
    from lerobot_dali.stream_state import merge_rank_states

    root = _dataset(make_ds)
    config = AugmentConfig(color_jitter=ColorJitter(brightness=(0.5, 1.5)))
    options = dict(augment=config, delta_timestamps=None, shuffle=True, episode_pool_size=2, batch_size=2)
    states = []
    for rank in range(2):
        it = _iterator(root, rank=rank, world_size=2, **options)
        _batches(it, 1)
        states.append(it.state_dict())
        it.close()
    rests = []
    for workers in (0, 2):
        it = _iterator(root, num_workers=workers, **options)
        it.load_state_dict(merge_rank_states(states))
        rests.append(_batches(it))
        it.close()
    assert len(rests[0]) >= 2
    _assert_batches_equal(rests[1], rests[0])


def test_assemble_refuses_positions_that_do_not_key_each_of_its_samples(make_ds) -> None:
    """Draws are keyed by each sample's stream position: assemble() without one per sample raises, not a batch whose
    draws are keyed short (or broadcast from one position)."""
    it = _iterator(_dataset(make_ds))
    try:
        iter(it)  # (builds the pipeline, and with it the workers' spec)
        source = BatchSource(it._spec)
    finally:
        it.close()
    for positions, got in ((None, "none"), (np.arange(1), "1")):
        with pytest.raises(ValueError, match=f"needs positions for all 2 samples, got {got}$"):
            source.assemble(np.array([0, 0]), np.array([0, 1]), positions=positions)
