"""What an augmentation config means: a version, bumped whenever the same config starts to augment otherwise.

A resume keeps the config (a pipeline refuses another), but the config does not say what this lerobot_dali does
with it: a state saved before RandomAffine turned the other way resumed silently with the new turn. So an iterator's
state records :data:`AUGMENT_SEMANTICS_VERSION`, and a resume from another version warns where one of the changes
between the two touches the config it runs (:func:`warn_if_changed`); a config none touches resumes silently.

Each change is listed in :data:`_CHANGES` under the version that brought it; bump the version with the change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .augment_config import AugmentConfig, range_of
from .errors import ResumeStateError
from .said_once import warn_once
from .value_checks import is_int

__all__ = ["AUGMENT_SEMANTICS_VERSION", "LEGACY_VERSION", "saved_version", "warn_if_changed"]

logger = logging.getLogger(__name__)

#: The version of what this lerobot_dali does with a config. 2: RandomAffine turns clockwise for a positive angle
#: and runs after the colour jitter and the sharpness. 3: a random resized crop after a resize cuts its window, then
#: resizes it, so its edge pixels no longer blend in the frame beyond the window.
AUGMENT_SEMANTICS_VERSION = 3
#: The version of a state saved before states recorded one.
LEGACY_VERSION = 1


@dataclass(frozen=True)
class _Change:
    #: The version that brought it.
    version: int
    #: What changed for ``config``, in words, or None where it augments as before.
    said: Callable[[AugmentConfig], str | None]


def _affine_turn_and_order(config: AugmentConfig) -> str | None:
    affine = config.affine
    if affine is None:
        return None
    changes = []
    lo, hi = range_of(affine.degrees)
    if (lo, hi) != (0.0, 0.0):
        turns = "each sample turns the other way" if lo == -hi else f"its range [{lo:g}, {hi:g}] turns the other way"
        changes.append(
            "RandomAffine now turns clockwise for a positive angle, as torchvision's does (it turned "
            f"counter-clockwise): {turns}"
        )
    if config.color_jitter is not None or config.sharpness is not None:
        changes.append(
            "the affine now runs after the colour jitter and the sharpness (it ran before them), so the area it "
            "uncovers stays black"
        )
    return "; ".join(changes) or None


def _crop_window_edges(config: AugmentConfig) -> str | None:
    if config.random_resized_crop is None or config.resize is None:
        return None
    return (
        "the random resized crop now cuts its window before resizing it, as torchvision's resized_crop does (it "
        "resized the frame's region, whose edge pixels blended in the frame just beyond the window)"
    )


_CHANGES = (_Change(2, _affine_turn_and_order), _Change(3, _crop_window_edges))


def saved_version(saved: object) -> int:
    """The augmentation semantics a state's ``augment_version`` names (None: saved before states recorded one);
    :class:`~lerobot_dali.errors.ResumeStateError` for anything else, so a resume can refuse it before it loads."""
    version = LEGACY_VERSION if saved is None else saved
    if not is_int(version) or version < LEGACY_VERSION:
        raise ResumeStateError(
            f"stream state augment_version must be a version >= {LEGACY_VERSION} as state_dict() saved it, got "
            f"{saved!r}; leave it out for a state saved before it was recorded"
        )
    return int(version)


def warn_if_changed(version: int, config: AugmentConfig | None) -> None:
    """Warn once where the augmentation semantics ``version`` a state was saved under (:func:`saved_version`)
    differ from this lerobot_dali's for ``config``, the augmentation the resume runs (None: it augments nothing)."""
    now = AUGMENT_SEMANTICS_VERSION
    if config is None or version == now:
        return
    if version > now:
        warn_once(logger,
            "this state was saved by a later lerobot_dali (augmentation semantics %d, this one's %d), which may "
            "augment this config otherwise: the frames from here on may be augmented otherwise than the run's so "
            "far. To augment as the run did, resume with that lerobot_dali or a later one",
            version, now,
        )  # fmt: skip
        return
    said = [text for change in _CHANGES if version < change.version <= now if (text := change.said(config))]
    if said:
        warn_once(logger,
            "this state was saved by an earlier lerobot_dali (augmentation semantics %d, now %d), which augmented "
            "this config otherwise: %s. The frames from here on are augmented otherwise than the run's so far, so "
            "its results differ from an uninterrupted run's. To carry on so, nothing is needed (states saved from "
            "here record version %d); to augment as before, finish the run with the lerobot_dali that started it",
            version, now, "; ".join(said), now,
        )  # fmt: skip
