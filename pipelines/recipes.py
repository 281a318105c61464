"""Training recipes: which windows a policy family reads, at what image size, with which augmentation.

A policy is defined in steps ("16 actions", "2 observation frames") or in seconds ("a 1 s action chunk"),
while ``delta_timestamps`` are seconds that must land on a dataset's frames. A :class:`Recipe` keeps the
policy's own units and turns them into ``delta_timestamps`` for a given ``fps``, so one recipe serves a
10 fps and a 30 fps dataset alike::

    recipe = get_recipe("act")                      # or get_recipe("my_recipe.toml")
    it = DALILeRobotIterator(
        root, delta_timestamps=recipe.delta_timestamps(reader.fps, reader.camera_keys),
        image_size=recipe.image_size, augment=recipe.augment, drop_n_last_frames=recipe.drop_n_last_frames,
    )

The named recipes live as TOML files next to this module (``recipes/act.toml``, ``diffusion.toml``,
``vla.toml``), the same format a user's own recipe file uses (see :meth:`Recipe.from_toml`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

from lerobot_dali.augment_config import AugmentConfig, toml_parser
from lerobot_dali.cli_options import MAX_IMAGE_SIDE
from lerobot_dali.value_checks import check_int_fields, is_number

__all__ = ["NAMED_RECIPES", "RECIPE_DIR", "Recipe", "StepWindow", "get_recipe"]

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
"""Folder holding the named recipes, one ``<name>.toml`` each."""

NAMED_RECIPES: tuple[str, ...] = ("act", "diffusion", "vla")
"""Names :func:`get_recipe` accepts besides a path to a ``.toml`` file."""

# A stride must land on frames: |stride * fps - round(stride * fps)| below this many frames.
_FRAME_TOLERANCE = 1e-6


@dataclass(frozen=True, kw_only=True)
class StepWindow:
    """Frames ``first, first + 1, ..., first + n - 1`` strides from the sample (negative = the past).

    ``n`` is ``steps``, or ``round(seconds / stride)`` for a window given as a duration (``seconds = 1.0``
    at 30 fps is 30 steps). ``stride_s`` is the spacing in seconds; ``None`` means one frame (``1 / fps``).
    Offsets are computed as ``k / fps`` (or ``k * stride_s``), so ``3 / 10`` gives exactly ``0.3``.
    """

    steps: int | None = None
    seconds: float | None = None
    first: int = 0
    stride_s: float | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.seconds is None):
            raise ValueError(f"StepWindow needs exactly one of steps or seconds, got steps={self.steps!r}, "
                             f"seconds={self.seconds!r}")  # fmt: skip
        if self.steps is not None and (
            isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1
        ):
            raise ValueError(f"StepWindow.steps must be an int >= 1, got {self.steps!r}")
        if self.seconds is not None and not (is_number(self.seconds) and self.seconds > 0):
            raise ValueError(f"StepWindow.seconds must be a number > 0, got {self.seconds!r}")
        if isinstance(self.first, bool) or not isinstance(self.first, int):
            raise ValueError(f"StepWindow.first must be an int (strides from the sample), got {self.first!r}")
        if self.stride_s is not None and not (is_number(self.stride_s) and self.stride_s > 0):
            raise ValueError(f"StepWindow.stride_s must be a number of seconds > 0 or absent, got {self.stride_s!r}")

    def count(self, fps: float) -> int:
        """Frames in the window at ``fps``."""
        if self.steps is not None:
            return self.steps
        seconds = cast(float, self.seconds)
        return max(1, round(seconds * fps if self.stride_s is None else seconds / self.stride_s))

    def offsets_s(self, fps: float) -> list[float]:
        """The window's ``delta_timestamps`` in seconds at ``fps``.

        Raises ValueError when ``fps`` is not positive or ``stride_s`` is not a whole number of frames.
        """
        if not (is_number(fps) and fps > 0):
            raise ValueError(f"fps must be a number > 0, got {fps!r}")
        ks = range(self.first, self.first + self.count(fps))
        if self.stride_s is None:
            return [k / fps for k in ks]
        frames = self.stride_s * fps
        if abs(frames - round(frames)) > _FRAME_TOLERANCE:
            raise ValueError(
                f"stride_s = {self.stride_s} s is {frames:g} frames at {fps:g} fps; a stride must be a whole "
                "number of frames. Pick a stride that is a multiple of 1/fps or give the window in steps."
            )
        return [k * self.stride_s for k in ks]

    @classmethod
    def from_dict(cls, raw: Any, *, where: str) -> StepWindow:
        known = {f.name for f in fields(cls)}
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where} = {raw!r} is invalid: expected a table with steps or seconds")
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(known)}")
        try:
            return cls(**raw)
        except ValueError as e:  # (its checks name StepWindow, not the file or table)
            raise ValueError(f"{where}: {e}") from e


_WINDOWS = ("cameras", "state", "action")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Windows, image size and augmentation of one policy family.

    ``cameras`` / ``state`` / ``action``: the window of every camera, of the state key and of the action
    key; ``None`` reads only the sample's own frame, with no window axis (LeRobot's convention when a key
    has no ``delta_timestamps``). ``image_size`` is the ``(height, width)`` frames are resized to on the
    device (``None``: as stored). ``augment`` is the on-device augmentation, or ``None`` for none.
    ``drop_n_last_frames``: frames at the end of each episode never sampled (their windows would be mostly
    padding), as the policy's LeRobot config asks of its ``EpisodeAwareSampler``.
    """

    name: str
    description: str = ""
    cameras: StepWindow | None = None
    state: StepWindow | None = None
    action: StepWindow | None = None
    image_size: tuple[int, int] | None = None
    augment: AugmentConfig | None = None
    drop_n_last_frames: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Recipe.name must be a non-empty string, got {self.name!r}")
        for role in _WINDOWS:
            value = getattr(self, role)
            if value is not None and not isinstance(value, StepWindow):
                raise ValueError(f"Recipe.{role} must be a StepWindow or None, got {value!r}")
        if self.image_size is not None:
            size = self.image_size
            if not (
                isinstance(size, Sequence)
                and len(size) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_IMAGE_SIDE for v in size)
            ):  # (as --image-size: past it the first batch failed, calling the video corrupt)
                raise ValueError(
                    f"Recipe.image_size must be [height, width] of positive ints up to {MAX_IMAGE_SIDE}, got {size!r}"
                )
            object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        if self.augment is not None and not isinstance(self.augment, AugmentConfig):
            raise ValueError(f"Recipe.augment must be an AugmentConfig or None, got {self.augment!r}")
        check_int_fields(self, [("drop_n_last_frames", 0)], label=lambda name: f"Recipe.{name}")
        object.__setattr__(self, "drop_n_last_frames", int(self.drop_n_last_frames))  # a numpy integer: TOML-ready

    def delta_timestamps(
        self,
        fps: float,
        camera_keys: Iterable[str],
        state_key: str | None = "observation.state",
        action_key: str | None = "action",
    ) -> dict[str, list[float]]:
        """``delta_timestamps`` for a dataset at ``fps``; keys without a window are left out.

        Pass ``state_key=None`` / ``action_key=None`` for a dataset without that feature.
        """
        out: dict[str, list[float]] = {}
        if self.cameras is not None:
            offsets = self.cameras.offsets_s(fps)
            out.update({key: list(offsets) for key in camera_keys})
        if self.state is not None and state_key is not None:
            out[state_key] = self.state.offsets_s(fps)
        if self.action is not None and action_key is not None:
            out[action_key] = self.action.offsets_s(fps)
        return out

    # -- reading TOML -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "recipe") -> Recipe:
        """Build from plain data; unknown keys are rejected by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{source} has unknown key(s) {unknown}; allowed: {sorted(known)}")
        if "name" not in raw:
            raise ValueError(f'{source} has no name; add name = "..." at the top')
        kwargs = dict(raw)
        for role in _WINDOWS:
            if role in kwargs:
                kwargs[role] = StepWindow.from_dict(kwargs[role], where=f"{source} [{role}]")
        if "augment" in kwargs:
            try:
                kwargs["augment"] = AugmentConfig.from_dict(kwargs["augment"])
            except ValueError as e:  # (its messages name AugmentConfig, not the file or table)
                raise ValueError(f"{source} [augment]: {e}") from e
        if "image_size" in kwargs:
            size = kwargs["image_size"]
            kwargs["image_size"] = tuple(size) if isinstance(size, list) else size
        try:
            return cls(**kwargs)
        except ValueError as e:  # (its checks name Recipe, not the file)
            raise ValueError(f"{source}: {e}") from e

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Recipe:
        """Read a recipe file (layout: top-level ``name``, ``image_size``, ``drop_n_last_frames``; tables
        ``[cameras]``, ``[state]``, ``[action]``, ``[augment]`` with :class:`~lerobot_dali.augment.AugmentConfig`'s
        sections)."""
        tomllib = toml_parser()
        with open(path, "rb") as f:
            try:
                document = tomllib.load(f)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # (UnicodeDecodeError: not UTF-8 text)
                raise ValueError(f"{os.fspath(path)} is not valid TOML: {e}") from e
        return cls.from_dict(document, source=os.fspath(path))


def get_recipe(name_or_path: str | os.PathLike[str]) -> Recipe:
    """A named recipe (``act``, ``diffusion``, ``vla``) or a recipe read from a ``.toml`` path.

    Raises ValueError for an unknown name, listing the known ones.
    """
    text = os.fspath(name_or_path)
    if text in NAMED_RECIPES:
        return Recipe.from_toml(RECIPE_DIR / f"{text}.toml")
    if text.endswith(".toml") or os.sep in text:
        if os.path.isdir(text):  # (not said to be missing: it exists)
            raise IsADirectoryError(
                f"recipe {text} is a folder: give a recipe .toml file, or one of {', '.join(NAMED_RECIPES)}"
            )
        if not os.path.isfile(text):
            raise FileNotFoundError(f"recipe file {text} does not exist")
        return Recipe.from_toml(text)
    raise ValueError(
        f"Unknown recipe {text!r}; known recipes are {', '.join(NAMED_RECIPES)}, or give the path of a .toml file."
    )
