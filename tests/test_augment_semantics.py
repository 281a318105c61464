"""The augmentation semantics a state records: a resume from another version warns where the change touches the
config it runs, and nowhere else."""

from __future__ import annotations

import logging

import pytest

from lerobot_dali.augment import AugmentConfig, ColorJitter, RandomAffine, RandomResizedCrop, SharpnessJitter
from lerobot_dali.augment_semantics import AUGMENT_SEMANTICS_VERSION, saved_version, warn_if_changed
from lerobot_dali.errors import ResumeStateError

ROTATE = RandomAffine(degrees=10.0)
JITTER = ColorJitter(contrast=0.2)


def _warning(caplog: pytest.LogCaptureFixture, version: int, config: AugmentConfig | None) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        warn_if_changed(version, config)
    assert len(caplog.records) <= 1
    return caplog.text


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (AugmentConfig(affine=ROTATE), ["now turns clockwise", ": each sample turns the other way"]),
        (AugmentConfig(affine=RandomAffine(degrees=(0.0, 10.0))), ["its range [0, 10] turns the other way"]),
        (AugmentConfig(affine=RandomAffine(scale=(0.9, 1.0)), color_jitter=JITTER), ["runs after the colour jitter"]),
        (
            AugmentConfig(affine=ROTATE, sharpness=SharpnessJitter(factor=0.5)),
            ["turns clockwise", "runs after the colour jitter and the sharpness"],
        ),
    ],
)
def test_a_state_saved_before_the_affine_changed_warns_saying_what_and_how_to_go_on(
    caplog: pytest.LogCaptureFixture, config: AugmentConfig, said: list[str]
) -> None:
    text = _warning(caplog, saved_version(None), config)  # (a state without augment_version)
    assert f"augmentation semantics 1, now {AUGMENT_SEMANTICS_VERSION}" in text
    assert all(part in text for part in said), text
    assert "results differ" in text and "finish the run with the lerobot_dali that started it" in text
    assert config.affine is not None
    assert ("turns clockwise" in text) == (config.affine.degrees != (0.0, 0.0))  # (a turn is named only if it turns)


@pytest.mark.parametrize(
    "config",
    [
        None,
        AugmentConfig(color_jitter=JITTER, sharpness=SharpnessJitter(factor=0.5)),  # no affine
        AugmentConfig(affine=RandomAffine(translate=(0.1, 0.1))),  # neither turned nor after a jitter
    ],
)
def test_a_config_the_change_leaves_alone_resumes_silently(caplog: pytest.LogCaptureFixture, config) -> None:
    assert _warning(caplog, saved_version(None), config) == ""


CROP = RandomResizedCrop(size=(8, 8))


def test_a_state_saved_before_the_crop_cut_its_window_warns_where_a_resize_runs_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Version 3: after a resize the crop's window is cut, then resized; without one it is resized as it was.
    text = _warning(caplog, 2, AugmentConfig(resize=(16, 16), random_resized_crop=CROP, affine=ROTATE))
    assert "augmentation semantics 2, now 3" in text and "now cuts its window before resizing it" in text, text
    assert "turns clockwise" not in text  # (version 2's change is not news to a version 2 state)
    assert _warning(caplog, 2, AugmentConfig(random_resized_crop=CROP, affine=ROTATE)) == ""
    both = _warning(
        caplog, saved_version(None), AugmentConfig(resize=(16, 16), random_resized_crop=CROP, affine=ROTATE)
    )
    assert "turns clockwise" in both and "cuts its window" in both


def test_the_same_version_is_silent_and_a_later_one_warns(caplog: pytest.LogCaptureFixture) -> None:
    config = AugmentConfig(affine=ROTATE, color_jitter=JITTER)
    assert _warning(caplog, saved_version(AUGMENT_SEMANTICS_VERSION), config) == ""
    later = _warning(caplog, AUGMENT_SEMANTICS_VERSION + 1, config)
    assert "saved by a later lerobot_dali" in later and "resume with that lerobot_dali or a later one" in later


@pytest.mark.parametrize("value", [0, "2", 2.0, True, [2]])
def test_an_augment_version_that_is_not_one_is_refused(value: object) -> None:
    with pytest.raises(ResumeStateError, match="augment_version must be a version >= 1"):
        saved_version(value)
