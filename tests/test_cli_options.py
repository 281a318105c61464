"""The options lerobot-dali bench, pipelines/train.py and pipelines/lerobot_policy.py share take each other's spelling:
``--image-size 224x224`` (the bench's) and ``--image-size 224 224`` (train.py's), ``--pool-size`` (the bench's) and
``--episode-pool-size`` (the training scripts')."""

from __future__ import annotations

import pytest

from lerobot_dali.cli import _parser
from pipelines import lerobot_policy
from pipelines.train import parse_args

BENCH = ["bench", "--quick"]
TRAIN = ["--dataset", "d", "--steps", "1", "--device", "cpu"]


@pytest.mark.parametrize("size", [["224x160"], ["224X160"], ["224", "160"]])
def test_image_size_is_taken_as_hxw_or_as_h_w_by_bench_and_train(size: list[str]) -> None:
    assert _parser().parse_args([*BENCH, "--image-size", *size]).image_size == (224, 160)
    assert parse_args([*TRAIN, "--image-size", *size]).image_size == (224, 160)


@pytest.mark.parametrize("flag", ["--pool-size", "--episode-pool-size"])
def test_the_episode_pool_size_is_taken_under_either_name(flag: str) -> None:
    assert _parser().parse_args([*BENCH, flag, "5"]).pool_size == 5
    assert parse_args([*TRAIN, flag, "6"]).episode_pool_size == 6
    assert lerobot_policy.parse_args(["--dataset", "d", flag, "7"]).episode_pool_size == 7


def test_the_defaults_are_unchanged() -> None:
    from lerobot_dali.sample_order import DEFAULT_EPISODE_POOL_SIZE

    bench = _parser().parse_args(BENCH)
    assert (bench.image_size, bench.pool_size) == (None, DEFAULT_EPISODE_POOL_SIZE)
    train = parse_args(TRAIN)
    assert (train.image_size, train.episode_pool_size) == (None, 64)


@pytest.mark.parametrize("size", [["224"], ["224x"], ["224", "x"], ["1", "2", "3"], ["2x3", "4"]])
def test_an_image_size_of_neither_form_is_refused_saying_both(size: list[str], capsys) -> None:
    for parse in (lambda: _parser().parse_args([*BENCH, "--image-size", *size]),
                  lambda: parse_args([*TRAIN, "--image-size", *size])):  # fmt: skip
        with pytest.raises(SystemExit):
            parse()
        err = capsys.readouterr().err
        assert f"--image-size: takes HxW (224x224) or H W (224 224), got {' '.join(size)!r}" in err, err
