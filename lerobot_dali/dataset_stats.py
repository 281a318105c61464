"""A dataset's feature statistics (mean, std, min, max, count), read the way LeRobot reads them.

LeRobot v2.0 and v3.0 keep them in ``meta/stats.json``. v2.1 keeps per-episode statistics only
(``meta/episodes_stats.jsonl``) and LeRobot aggregates them when it loads the dataset; so does this module,
with LeRobot's formulas: means weighted by frame count, variances pooled (each episode's variance plus its
mean's squared offset from the overall mean), min of mins, max of maxes. Used for normalisation: camera
frames on the device (``AugmentConfig(normalize="stats")``) and state/action in the training pipeline.

LeRobot before v2.1 wrote ``meta/stats.json`` without ``count``, and pooled datasets' statistics by each dataset's
frame count (its ``aggregate_stats`` over datasets weighed them by ``num_frames``); later versions pool by ``count``,
and fail on such a file. An entry without ``count`` here takes the number of frames its file covers, the dataset's:
``total_frames`` in ``info.json``, else the episode metadata's lengths added up; so datasets pool as if it were there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .dataset_info import DatasetInfo, Feature
from .dataset_location import DatasetLocation, read_if_present
from .episode_table import read_episode_records, read_episode_table
from .errors import DatasetError
from .said_once import say_once

__all__ = [
    "NORMALIZE_WITHOUT_STATS",
    "POOLED_STATS",
    "FeatureStats",
    "aggregate_episode_stats",
    "read_dataset_stats",
    "stats_faults",
]

logger = logging.getLogger(__name__)

#: How ``normalize="stats"`` does without statistics that cannot be read (said where it reads them: the statistics'
#: other readers, a policy's normalisation of state and action, cannot).
NORMALIZE_WITHOUT_STATS = "give AugmentConfig.normalize a Normalize(mean=..., std=...) per camera instead of 'stats'"

#: What pooling statistics (episodes', datasets') needs of each: a frame-weighted mean and pooled variance.
POOLED_STATS = ("mean", "std", "count")

#: ``{feature key: {"mean": array, "std": array, "min": array, "max": array, "count": array}}``, arrays in
#: the stored shape (``(C, 1, 1)`` for cameras, ``(D,)`` for vectors).
FeatureStats = dict[str, dict[str, np.ndarray]]


def read_dataset_stats(
    location: DatasetLocation, info: DatasetInfo | None = None, *, warn_not_finite: bool = True
) -> FeatureStats:
    """The dataset's statistics, from where LeRobot reads them: for v2.x the aggregate of
    ``meta/episodes_stats.jsonl`` where it exists (a ``stats.json`` left from v2.0 is ignored), else
    ``meta/stats.json``, which v3.0 always uses (an ``episodes_stats.jsonl`` left from v2.1 is ignored); ``{}``
    with neither. The whole dataset's, whatever episodes a reader selects (``episodes=``): LeRobot's policies
    normalise by ``dataset.meta.stats``, the whole dataset's, for v2.1 (0.3) as for v3.0 (0.4); the aggregate over
    the selection that LeRobot 0.3 keeps as ``LeRobotDataset.stats`` for v2.1 is read by none of them.

    Some datasets store a vector's statistics by component name (``{"mean": {"joint_a": 0.1, ...}}``, e.g.
    ``r1_v30_h264``); those become arrays in the order of the feature's ``names`` in ``info`` (stored order
    without ``info``).

    ``warn_not_finite``: warn (once) of a mean, std, min or max that is NaN or infinite; ``check`` warns of those
    with its own list of faults, so it reads them without.
    """
    order = _component_order(info)
    fs = location.meta_fs
    episodes_path = location.meta_path("meta/episodes_stats.jsonl")
    v2 = info is None or info.codebase_version.startswith("v2")
    f = read_if_present(fs, episodes_path) if v2 else None
    if f is not None:
        with _advising(episodes_path):  # (decoded per line: bytes that are not UTF-8 name their line)
            per_episode = [_episode_record(line, episodes_path, n) for n, line in enumerate(f, start=1) if line.strip()]
            logger.debug("aggregating the statistics of %d episodes from %s", len(per_episode), episodes_path)
            aggregated = aggregate_episode_stats(per_episode, source=episodes_path, order=order)
        return _finite(aggregated, episodes_path) if warn_not_finite else aggregated
    path = location.meta_path("meta/stats.json")
    f = read_if_present(fs, path)
    if f is None:
        return {}
    with _advising(path):
        try:
            raw = json.loads(f.getvalue().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # (bytes that are not UTF-8 fail as the file is read)
            raise DatasetError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(raw, Mapping):
            raise DatasetError(f"{path}: expected an object of feature statistics, got {type(raw).__name__}")
        stats = {key: _arrays(entry, f"{path}: {key}", order.get(key)) for key, entry in raw.items()}
    return _counted(_finite(stats, path) if warn_not_finite else stats, location, info, path)


def _finite(stats: FeatureStats, path: str) -> FeatureStats:
    """``stats`` (of file ``path``), with a warning naming each mean, std, min or max that is NaN or infinite
    (LeRobot's statistics of data that holds NaN): normalising by one turns every value NaN, so what normalises by
    one refuses it (a camera's :class:`~.augment_config.Normalize`, train.py's state and action), while a dataset
    whose other features' statistics are sound reads on."""
    bad = [f"{key} {name}" for key, entry in stats.items() for name in ("mean", "std", "min", "max")
           if name in entry and not np.isfinite(entry[name]).all()]  # fmt: skip
    if bad:
        say_once(
            logger, logging.WARNING,
            "%s: the statistics %s are not finite (NaN or infinity); normalising by them is refused: recompute them "
            "from the data files (which may hold NaN themselves), or download or copy %s again", path, bad, path,
        )  # fmt: skip
    return stats


def stats_faults(stats: FeatureStats, info: DatasetInfo, keys: Sequence[str]) -> dict[str, list[str]]:
    """What is wrong with the statistics of features ``keys`` (declared in ``info``), per feature: an entry (mean,
    std, min, max, a quantile, count) that is not finite, a count not of one number, one whose shape is not the
    feature's (a camera's: (C, 1, 1) or (C,), C its channels, or LeRobot's (3, 1, 1) or (3,), which it writes for
    every camera; another's: its shape in info.json, a scalar's (1,) or ()), a negative std, a min above its max.
    Normalising by such statistics fails or turns values wrong in silence (a negative std flips their sign;
    LeRobot's min-max mode divides by max - min). A feature without statistics is left out."""
    faults: dict[str, list[str]] = {}
    for key in keys:
        entry, feature = stats.get(key), info.features.get(key)
        if entry is None or feature is None:
            continue
        said = [
            f"{name} is not finite (NaN or infinity)" for name, value in entry.items() if not np.isfinite(value).all()
        ]
        shapes = _stats_shapes(feature)
        if shapes is not None:
            said += [
                f"{name} has shape {value.shape}, but the feature's is {feature.shape} in info.json (its statistics "
                f"are {' or '.join(map(str, shapes))})"
                for name, value in entry.items()
                if name != "count" and value.shape not in shapes
            ]  # fmt: skip
        if "count" in entry and entry["count"].size != 1:  # (a union pools the dataset's by it)
            said.append(f"count holds {entry['count'].size} numbers, not one frame count")
        if "std" in entry and (entry["std"] < 0).any():
            said.append(f"std is negative at components {np.flatnonzero(entry['std'].ravel() < 0)[:10].tolist()}")
        for first, second, mode in _PAIRS_NORMALISED:
            if (first in entry) != (second in entry):
                have, lack = (first, second) if first in entry else (second, first)
                said.append(f"{have} without {lack}: LeRobot's {mode} normalisation fails on it (a ValueError)")
        low, high = entry.get("min"), entry.get("max")
        if low is not None and high is not None and low.shape == high.shape and (low > high).any():
            said.append(f"min is above max at components {np.flatnonzero((low > high).ravel())[:10].tolist()}")
        if said:
            faults[key] = said
    return faults


#: The statistics LeRobot (0.4.4, ``NormalizerProcessorStep``) normalises by in pairs, and its mode that does: the
#: mode asked for of a feature with one of its pair and not the other raises ValueError.
_PAIRS_NORMALISED = (("mean", "std", "MEAN_STD"), ("min", "max", "MIN_MAX"), ("q01", "q99", "QUANTILES"),
                     ("q10", "q90", "QUANTILE10"))  # fmt: skip


def _stats_shapes(feature: Feature) -> list[tuple[int, ...]] | None:
    """The shapes LeRobot gives ``feature``'s statistics (None: not known, a string's)."""
    if feature.is_host_value:
        return None
    if not feature.is_camera:
        return [(), (1,)] if feature.is_scalar else [feature.shape]
    names = [str(n).lower() for n in feature.names] if isinstance(feature.names, list) else []
    at = next((names.index(n) for n in ("channel", "channels") if n in names and len(names) == len(feature.shape)), -1)
    channels = feature.shape[at] if feature.shape else 3
    # (LeRobot computes every camera's over frames it converts to RGB: (3, 1, 1) for a grey or depth camera too)
    return [(channels, 1, 1), (channels,)] + ([(3, 1, 1), (3,)] if channels != 3 else [])


def _counted(stats: FeatureStats, location: DatasetLocation, info: DatasetInfo | None, path: str) -> FeatureStats:
    """``stats`` (of file ``path``), each entry without ``count`` given the dataset's frame count (which the file
    covers: LeRobot computed it over every frame), said once; left without where that count is not known. (Said
    alike read alone or pooled with other datasets': a line on "pooling" for one dataset read alone misled.)"""
    lacking = [key for key, entry in stats.items() if "count" not in entry]
    known = _dataset_frames(location, info) if lacking else None
    if known is None:
        return stats
    frames, source = known
    say_once(logger, logging.INFO,
        "%s gives no 'count' for %s (LeRobot before v2.1 wrote none); they cover the dataset's %d frames (%s), taken "
        "as their count", path, lacking, frames, source,
    )  # fmt: skip
    return {
        key: {**entry, "count": np.array([float(frames)])} if key in lacking else entry for key, entry in stats.items()
    }


def _dataset_frames(location: DatasetLocation, info: DatasetInfo | None) -> tuple[int, str] | None:
    """The dataset's frame count and where it was read: ``total_frames`` in ``info.json`` (LeRobot's
    ``meta.total_frames``), else the episode metadata's lengths added up; None where neither is known."""
    if info is None:
        return None
    if info.total_frames > 0:
        return info.total_frames, "info.json's total_frames"
    try:
        records = read_episode_records(location.meta_fs, location.meta_root, info)
        frames = read_episode_table(records, info, video_keys=[]).total_frames
    except DatasetError as e:  # (the pooling that needs the count says it lacks it; nothing else does)
        logger.debug("%s: no frame count for its statistics: %s", location.description, e)
        return None
    return (frames, f"the episode lengths in {records.source}") if frames > 0 else None


@contextmanager
def _advising(path: str) -> Iterator[None]:
    """Adds to a DatasetError raised while statistics file ``path`` is read what to do."""
    try:
        yield
    except DatasetError as e:
        raise DatasetError(f"{e}; the file is not what LeRobot writes: download or copy {path} again") from e


def aggregate_episode_stats(
    per_episode: Sequence[Mapping[str, Any]], *, source: str, order: Mapping[str, list[str]] | None = None
) -> FeatureStats:
    """One set of statistics from per-episode ones (each ``{key: {"mean", "std", "min", "max", "count"}}``),
    as LeRobot's ``aggregate_stats`` computes it. A key takes the episodes that have it. ``order``: component
    names per key, for statistics stored by name."""
    order = order or {}
    grouped: dict[str, list[dict[str, np.ndarray]]] = {}
    for n, stats in enumerate(per_episode):
        for key, entry in stats.items():
            grouped.setdefault(key, []).append(_arrays(entry, f"{source}: episode record {n}, {key}", order.get(key)))
    return {key: _aggregate(entries, f"{source}: {key}") for key, entries in grouped.items()}


def _episode_record(line: bytes, path: str, line_no: int) -> Mapping[str, Any]:
    try:
        record = json.loads(line.decode("utf-8"))
        stats = record["stats"]
    except (ValueError, KeyError, TypeError) as e:  # (ValueError: not JSON, or not UTF-8)
        raise DatasetError(
            f"{path}:{line_no}: not an episode statistics record ({e!r}); expected {{'stats': ..}}"
        ) from e
    if not isinstance(stats, Mapping):
        raise DatasetError(f"{path}:{line_no}: 'stats' is a {type(stats).__name__}, expected an object")
    return stats


def _component_order(info: DatasetInfo | None) -> dict[str, list[str]]:
    """Component names per feature from ``info.json``: ``names`` as a flat list of strings, or LeRobot's older
    ``{"motors": [...]}`` form with one list."""
    order: dict[str, list[str]] = {}
    for key, feature in (info.features if info is not None else {}).items():
        names = feature.names
        if isinstance(names, Mapping) and len(names) == 1:
            names = next(iter(names.values()))
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            order[key] = names
    return order


def _arrays(entry: Any, where: str, names: list[str] | None) -> dict[str, np.ndarray]:
    if not isinstance(entry, Mapping):
        raise DatasetError(f"{where}: expected an object of statistics, got {type(entry).__name__}")
    out = {}
    for stat, value in entry.items():
        if isinstance(value, Mapping):  # by component name
            wanted = names if names is not None else list(value)
            missing = [n for n in wanted if n not in value]
            if missing:
                raise DatasetError(f"{where}: {stat} has no value for component(s) {missing} named in info.json")
            value = [value[n] for n in wanted]
        try:
            out[stat] = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise DatasetError(f"{where}: {stat} is not a numeric array ({e})") from e
    return out


def _aggregate(entries: list[dict[str, np.ndarray]], where: str) -> dict[str, np.ndarray]:
    for entry in entries:
        missing = [name for name in POOLED_STATS if name not in entry]
        if missing:
            raise DatasetError(f"{where}: an episode lacks {missing}; aggregation needs {list(POOLED_STATS)}")
    odd = next((e["count"].size for e in entries if e["count"].size != 1), None)
    if odd is not None:  # (count [] pooled at weight 0, unsaid; LeRobot's aggregate_stats refuses it)
        raise DatasetError(f"{where}: a count holds {odd} numbers, not one frame count")
    counts = np.array([float(np.sum(e["count"])) for e in entries])
    if not np.all(np.isfinite(counts) & (counts >= 0)):
        raise DatasetError(f"{where}: counts {counts.tolist()} are not all frame counts (finite, 0 or more)")
    if counts.sum() <= 0:
        raise DatasetError(f"{where}: every episode counts 0 frames")
    means, stds = _stacked(entries, "mean", where), _stacked(entries, "std", where)
    weights = (counts / counts.sum()).reshape((-1,) + (1,) * (means.ndim - 1))
    mean = (weights * means).sum(axis=0)
    variance = (weights * (stds**2 + (means - mean) ** 2)).sum(axis=0)
    out = {"mean": mean, "std": np.sqrt(variance), "count": np.array([counts.sum()])}
    for name, reduce in (("min", np.min), ("max", np.max)):
        if all(name in e for e in entries):
            out[name] = reduce(_stacked(entries, name, where), axis=0)
    return out


def _stacked(entries: list[dict[str, np.ndarray]], name: str, where: str) -> np.ndarray:
    try:
        return np.stack([e[name] for e in entries])
    except ValueError as e:
        shapes = sorted({e[name].shape for e in entries})
        raise DatasetError(f"{where}: episodes disagree on the statistics' shape ({name}: {shapes})") from e
