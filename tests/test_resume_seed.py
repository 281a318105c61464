"""A resume keeps the seed its state was saved with, whatever ``seed=`` the resuming iterator or mixture was built with
(the saved run's order and augmentation draws go on: exact resume); where they differ, one warning names both seeds.

Before, the stream said so at INFO alone ('resuming with the saved seed 1 instead of 2'), and a mixture's line named its
datasets' derived seeds (10-digit numbers), never the ``seed=`` its user passed.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture
from lerobot_dali.errors import ResumeStateError
from tests.test_mixture import _datasets, _keys


def _seed_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "seed" in r.getMessage()]


def _pairs(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def test_an_iterator_resumed_with_another_seed_warns_naming_both_and_reads_the_saved_order(make_ds, caplog) -> None:
    root = make_ds(episodes=3, frames_per_episode=[5, 7, 4], cameras=1, codec="vp9", fps=10, gop=4)
    options = dict(batch_size=3, shuffle=True, episode_pool_size=2, device="cpu", num_workers=0)
    saved = DALILeRobotIterator(root, seed=1, **options)
    batches = iter(saved)
    next(batches)
    state = saved.state_dict()
    rest = [_pairs(batch) for batch in batches]
    saved.close()
    assert state["seed"] == 1
    same = DALILeRobotIterator(root, seed=1, **options)
    assert _load_warnings(same, state, caplog) == []
    same.close()
    resumed = DALILeRobotIterator(root, seed=2, **options)
    assert _load_warnings(resumed, state, caplog) == [
        "resuming a state saved with seed=1 in this iterator built with seed=2: the saved seed is kept, so the "
        "saved run's order and augmentation draws go on (this epoch and later ones); build it with seed=1 to say so, "
        "or start without the state for seed=2's"
    ]
    assert [_pairs(batch) for batch in resumed] == rest
    resumed.close()


def test_a_mixture_resumed_with_another_seed_warns_naming_its_seeds_not_its_datasets(make_ds, caplog) -> None:
    """The warning names the mixture's seeds (the state now carries it), once, not each dataset's derived one; a state
    saved after that resume names the seed its datasets run with, so resuming it under that seed says nothing. A
    refused resume says nothing of seeds."""
    paths = _datasets(make_ds)
    options = dict(batch_size=4, device="cpu", num_workers=0)
    saved = DALILeRobotMixture(paths, seed=3, **options)
    batches = iter(saved)
    for _ in range(2):
        next(batches)
    state = saved.state_dict()
    rest = [_keys(batch) for batch in batches]
    saved.close()
    assert state["mixture"]["seed"] == 3
    resumed = DALILeRobotMixture(paths, seed=5, **options)
    # Refused (the second dataset's episodes differ): the first dataset's state, loaded, is put back, seed and all;
    # neither that load nor the putting back warns.
    fresh = resumed.state_dict()
    refused = {**state, "datasets": [state["datasets"][0], {**state["datasets"][1], "episodes": "0 episodes"}]}
    with caplog.at_level(logging.INFO), pytest.raises(ResumeStateError, match="saved over other episodes"):
        resumed.load_state_dict(refused)
    assert _seed_warnings(caplog) == [] and resumed.state_dict() == fresh
    assert _load_warnings(resumed, state, caplog) == [
        "resuming a state saved with seed=3 in a mixture built with seed=5: the saved seed is kept, so the saved run's "
        "order and augmentation draws go on (this epoch and later ones); build it with seed=3 to say so, or start "
        "without the state for seed=5's"
    ]
    assert resumed.state_dict()["mixture"]["seed"] == 3
    batches = iter(resumed)
    next(batches)
    again = resumed.state_dict()
    assert [_keys(batch) for batch in batches] == rest[1:]
    resumed.close()
    caplog.clear()
    third = DALILeRobotMixture(paths, seed=3, **options)
    assert _load_warnings(third, again, caplog) == []
    third.close()


def test_a_mixture_state_saved_without_its_seed_loads_and_warns_of_another_seed(make_ds, caplog) -> None:
    paths = _datasets(make_ds)
    options = dict(batch_size=4, device="cpu", num_workers=0)
    saved = DALILeRobotMixture(paths, seed=3, **options)
    state = saved.state_dict()
    saved.close()
    del state["mixture"]["seed"]  # (as saved before the mixture recorded it)
    same = DALILeRobotMixture(paths, seed=3, **options)
    assert _load_warnings(same, state, caplog) == [] and same.state_dict()["mixture"]["seed"] == 3
    same.close()
    resumed = DALILeRobotMixture(paths, seed=5, **options)
    assert _load_warnings(resumed, state, caplog) == [
        "resuming a state saved with another seed in a mixture built with seed=5: the saved seed is kept, so the saved "
        "run's order and augmentation draws go on (this epoch and later ones); build it with the saved run's seed to "
        "say so, or start without the state for seed=5's"
    ]
    assert resumed.state_dict()["mixture"]["seed"] is None  # (its datasets' seeds are no seed=5 mixture's)
    resumed.close()


def test_a_state_of_the_seed_built_with_loaded_after_another_does_not_warn(make_ds, caplog) -> None:
    """Built with seed=2, a seed-1 state loaded (warned), then a seed-2 state: the second was said to be saved with
    'another seed' in an iterator (or mixture) 'built with seed=1' (the seed of the state loaded before, not the
    seed= given: 2 of 2 wrong warnings); it is the seed it was built with, and says nothing now."""
    root = make_ds(episodes=3, frames_per_episode=[5, 7, 4], cameras=1, codec="vp9", fps=10, gop=4)
    iterator = _loads_the_built_seed_last(
        lambda seed: DALILeRobotIterator(root, seed=seed, batch_size=3, shuffle=True, device="cpu", num_workers=0),
        (1, 2),
        caplog,
    )
    assert iterator["seed"] == 2
    paths = _datasets(make_ds)
    mixture = _loads_the_built_seed_last(
        lambda seed: DALILeRobotMixture(paths, seed=seed, batch_size=4, device="cpu", num_workers=0), (3, 5), caplog
    )
    assert mixture["mixture"]["seed"] == 5


def _loads_the_built_seed_last(build, seeds: tuple[int, int], caplog) -> dict:
    """Built with ``seeds[1]``: a state saved with ``seeds[0]`` loaded, then one saved with ``seeds[1]``, which must
    warn of nothing; the state after it."""
    states = {}
    for seed in seeds:
        saved = build(seed)
        states[seed] = saved.state_dict()
        saved.close()
    resumed = build(seeds[1])
    resumed.load_state_dict(states[seeds[0]])
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed.load_state_dict(states[seeds[1]])
    assert _seed_warnings(caplog) == []
    state = resumed.state_dict()
    resumed.close()
    return state


def _load_warnings(loader, state, caplog) -> list[str]:
    """The seed warnings logged so far, once ``loader`` loaded ``state``."""
    with caplog.at_level(logging.INFO):
        loader.load_state_dict(state)
    return _seed_warnings(caplog)


def test_a_mixture_built_with_a_numpy_seed_saves_a_state_json_takes(make_ds) -> None:
    # The state's new seed was the seed= given as it was: a numpy integer (check_int takes them) left a state
    # json.dumps refused ("Object of type int64 is not JSON serializable"), as train.py's stream_rank*.json is written.
    mixture = DALILeRobotMixture(_datasets(make_ds), seed=np.int64(3), batch_size=4, device="cpu", num_workers=0)
    state = json.loads(json.dumps(mixture.state_dict()))
    mixture.close()
    assert state["mixture"]["seed"] == 3 and type(state["mixture"]["seed"]) is int
