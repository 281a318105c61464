"""Recipes: hand-computed delta_timestamps of the named recipes at 30 and 10 fps, a user recipe file read, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lerobot_dali.augment import AugmentConfig, ColorJitter
from pipelines.recipes import Recipe, StepWindow, get_recipe

CAMS = ["observation.images.top", "observation.images.wrist"]


def test_act_is_current_frame_and_a_one_second_action_chunk() -> None:
    act = get_recipe("act")
    assert act.delta_timestamps(10, CAMS) == {"action": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}
    at30 = act.delta_timestamps(30, CAMS)
    assert list(at30) == ["action"] and len(at30["action"]) == 30
    assert at30["action"][:4] == [0.0, 1 / 30, 2 / 30, 0.1]
    assert at30["action"][-1] == pytest.approx(0.9666666666666667, abs=1e-15)
    assert act.image_size is None and act.augment is None


def test_diffusion_is_two_observation_steps_and_sixteen_actions() -> None:
    diffusion = get_recipe("diffusion")
    at10 = diffusion.delta_timestamps(10, CAMS)
    assert at10 == {
        "observation.images.top": [-0.1, 0.0],
        "observation.images.wrist": [-0.1, 0.0],
        "observation.state": [-0.1, 0.0],
        "action": [-0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4],
    }
    at30 = diffusion.delta_timestamps(30, CAMS, state_key="state", action_key="act")
    assert at30["state"] == [-1 / 30, 0.0] and at30["observation.images.top"] == [-1 / 30, 0.0]
    assert len(at30["act"]) == 16 and at30["act"][0] == -1 / 30 and at30["act"][-1] == pytest.approx(14 / 30)
    assert diffusion.delta_timestamps(30, CAMS, state_key=None).keys() == {*CAMS, "action"}


def test_vla_is_one_224_frame_a_one_second_chunk_and_colour_jitter() -> None:
    vla = get_recipe("vla")
    assert vla.image_size == (224, 224)
    assert vla.delta_timestamps(30, CAMS) == {"action": [k / 30 for k in range(30)]}
    assert vla.delta_timestamps(10, CAMS)["action"][-1] == 0.9
    assert vla.augment == AugmentConfig(
        color_jitter=ColorJitter(brightness=(0.8, 1.2), contrast=(0.8, 1.2), saturation=(0.8, 1.2))
    )


def test_a_user_recipe_with_strides_and_augmentation_is_read(tmp_path: Path) -> None:
    path = tmp_path / "reward.toml"
    # camera keys hold dots (and here a space): table names quoted, as TOML needs them
    path.write_text(
        """name = "reward"
description = "8 frames 1 s apart, \\"long\\" context"
image_size = [240, 320]

[cameras]
steps = 8
first = -7
stride_s = 1.0

[state]
seconds = 0.4
first = -2

[augment]
resize = [240, 320]
shared_across_cameras = true

[augment.blur]
sigma = [0.1, 1.0]
probability = 0.5

[augment.normalize."observation.images.top"]
mean = [0.5, 0.4, 0.3]
std = [0.2, 0.2, 0.2]

[augment.normalize."wrist cam"]
mean = [0.1]
std = [0.3]
"""
    )
    recipe = Recipe(
        name="reward",
        description='8 frames 1 s apart, "long" context',
        cameras=StepWindow(steps=8, first=-7, stride_s=1.0),
        state=StepWindow(seconds=0.4, first=-2),
        image_size=(240, 320),
        augment=AugmentConfig.from_dict(
            {
                "resize": [240, 320],
                "blur": {"sigma": [0.1, 1.0], "probability": 0.5},
                "shared_across_cameras": True,
                "normalize": {
                    "observation.images.top": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]},
                    "wrist cam": {"mean": [0.1], "std": [0.3]},
                },
            }
        ),
    )
    loaded = get_recipe(str(path))
    assert loaded == recipe
    assert loaded.delta_timestamps(15, ["cam"]) == {
        "cam": [-7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0],
        "observation.state": [-2 / 15, -1 / 15, 0.0, 1 / 15, 2 / 15, 3 / 15],
    }


def test_unknown_recipe_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"Unknown recipe 'pi0'; known recipes are act, diffusion, vla"):
        get_recipe("pi0")
    with pytest.raises(FileNotFoundError, match="missing.toml"):
        get_recipe("missing.toml")


def test_bad_recipe_files_and_windows_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\nchunk = 10\n')
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['chunk'\]"):
        Recipe.from_toml(path)
    path.write_text('name = "x"\n[action]\nsteps = 4\nseconds = 1.0\n')
    with pytest.raises(ValueError, match="exactly one of steps or seconds"):
        Recipe.from_toml(path)
    with pytest.raises(ValueError, match=r"stride_s = 0.1 s is 1.5 frames at 15 fps"):
        StepWindow(steps=3, stride_s=0.1).offsets_s(15)
    with pytest.raises(ValueError, match="image_size"):
        Recipe(name="x", image_size=(224, 0))


@pytest.mark.parametrize("bad", [-1, True, 1.0, "7"])
def test_drop_n_last_frames_is_a_whole_count(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"Recipe.drop_n_last_frames must be an int >= 0, got {bad!r}"):
        Recipe(name="x", drop_n_last_frames=bad)  # type: ignore[arg-type]
    path = tmp_path / "r.toml"
    path.write_text(f'name = "x"\ndrop_n_last_frames = {bad!r}\n'.replace("True", "true").replace("'", '"'))
    with pytest.raises(ValueError, match="Recipe.drop_n_last_frames must be an int >= 0"):
        Recipe.from_toml(path)


def test_a_numpy_drop_n_last_frames_is_kept_as_an_int() -> None:
    import numpy as np

    recipe = Recipe(name="x", drop_n_last_frames=np.int64(7))  # type: ignore[arg-type]
    assert type(recipe.drop_n_last_frames) is int and recipe.drop_n_last_frames == 7


def test_a_recipe_file_s_mistakes_name_the_file(tmp_path: Path) -> None:
    """A field's check named Recipe or StepWindow, not the file ('StepWindow.seconds must be a number > 0, got
    -1.0'), and a file that is not UTF-8 text was a UnicodeDecodeError naming neither."""
    path = tmp_path / "r.toml"
    for text, said in (
        ('name = "x"\n[action]\nseconds = -1.0\n', f"{path} [action]: StepWindow.seconds must be a number > 0"),
        ('name = "x"\nimage_size = [0, 5]\n', f"{path}: Recipe.image_size must be"),
        (
            'name = "x"\nimage_size = [70000, 70000]\n',
            f"{path}: Recipe.image_size must be [height, width] of positive ints up to 8192, got (70000, 70000)",
        ),  # (a VideoDecodeError calling the video corrupt at the first batch)
        ('name = "x"\ndrop_n_last_frames = -3\n', f"{path}: Recipe.drop_n_last_frames must be an int >= 0, got -3"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(said)):
            get_recipe(path)
    path.write_bytes(b"\xff\xfe name")
    with pytest.raises(ValueError, match=re.escape(f"{path} is not valid TOML: 'utf-8' codec can't decode")):
        get_recipe(path)
