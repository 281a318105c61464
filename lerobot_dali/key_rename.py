"""A dataset's keys under the names a mixture's batches give them (LeRobot's ``rename_map``), so that datasets
recorded with other camera or feature names share them, e.g. ``{"observation.images.rgb": "observation.images.top"}``.

The dataset is still read under its own names (its files, columns and statistics carry them). Names change only
at the edges: what the caller names (cameras, keys, windows, per-camera normalisation) is translated to the
dataset's own names, and the keys of its batches back to the caller's.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import permutations, product
from math import perm, prod
from typing import Any, overload

from .augment_config import AugmentConfig
from .dataset_info import INDEX_COLUMNS, DatasetInfo
from .dataset_reader import LeRobotDatasetReader, LocatedDataset
from .errors import CameraSelectionError, DatasetError, RenamedCameraError, RenameMapError, did_you_mean
from .fork_locks import cached_property
from .said_once import warn_once
from .windows import PAD_SUFFIX

__all__ = [
    "KeyRename",
    "check_rename_map",
    "flag_at_fault",
    "own_cameras",
    "rename_hint",
    "rename_map_from_json",
    "rename_maps_for",
    "shared_selection",
    "without_cameras_left_out",
]

logger = logging.getLogger(__name__)

#: Keys every batch carries under these names, whatever the dataset: never renamed, never a new name.
_FIXED_KEYS = frozenset({*INDEX_COLUMNS, "task"})

#: What a rename map's keys and values are, for errors about one that names keys a dataset does not read.
_MAP_SHAPE = (
    "a rename_map's keys are a dataset's own names (its meta/info.json features), its values the batches' names"
)


@dataclass(frozen=True)
class KeyRename:
    """``{own key: batch key}`` for one dataset; keys it does not name keep their names."""

    to_batch: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def _to_own(self) -> dict[str, str]:
        return {new: old for old, new in self.to_batch.items()}

    @classmethod
    def checked(
        cls, rename_map: Mapping[str, str] | None, reader: LeRobotDatasetReader, *, cameras: Sequence[str] | None = None
    ) -> KeyRename:
        """``rename_map`` for ``reader``: each a camera or feature it reads, to a name no other of its keys has.
        ``cameras``: the batches' cameras it was opened for (:func:`own_cameras`), which a map told it keeps."""
        if rename_map is None:
            return cls()
        where = reader.location.description
        check_rename_map(rename_map, where)
        renamed = {old: new for old, new in rename_map.items() if old != new}
        own = list(reader.read_keys)
        unknown = sorted(set(renamed) - set(own))
        if unknown:
            told = _keeping(where, reader.info, cameras)  # (a map told back keeps the cameras it was opened for)
            raise RenameMapError(
                f"{where}: rename_map renames {unknown}, which it does not read; it reads {own}"
                f"{did_you_mean(unknown, own)}: {_MAP_SHAPE}"
                f"{_reversed(unknown, rename_map, own, lambda fixed: (cls.checked(fixed, reader), told(fixed)))}"
            )
        fixed = sorted((set(renamed) | set(renamed.values())) & _FIXED_KEYS)
        padded = sorted(new for new in renamed.values() if new.endswith(PAD_SUFFIX))
        if fixed or padded:
            raise RenameMapError(
                f"{where}: rename_map names {fixed + padded}: every batch carries {sorted(_FIXED_KEYS)} under those "
                f"names, and '<key>{PAD_SUFFIX}' is a window's mask: rename only cameras and features, to other names"
            )
        new_names = list(renamed.values())
        kept = set(own) - set(renamed)
        taken = sorted({n for n in new_names if new_names.count(n) > 1 or n in kept})
        if taken:
            raise RenameMapError(
                f"{where}: rename_map gives {taken} to a key while another key of the dataset has (or gets) that "
                "name: one key per name: give it another name, rename that other key too, or leave one of them out "
                "(cameras=[...], keys=[...])"
            )
        return cls(renamed)

    def __bool__(self) -> bool:
        return bool(self.to_batch)

    def batch_name(self, own: str) -> str:
        return self.to_batch.get(own, own)

    def own_name(self, batch: str) -> str | None:
        """The dataset's own key under the batch name ``batch``; None for an own key renamed away (no batch key
        has it)."""
        if batch in self._to_own:
            return self._to_own[batch]
        return None if batch in self.to_batch else batch

    def batch_names(self, own: Iterable[str]) -> list[str]:
        return [self.batch_name(key) for key in own]

    def own_key(self, batch: str) -> str:
        """The dataset's own key under the batch name ``batch``, which must not be an own key renamed away."""
        own = self.own_name(batch)
        if own is None:
            raise DatasetError(f"{batch!r} is renamed {self.to_batch[batch]!r} by its rename_map: name it so")
        return own

    def own_names(self, batch: Iterable[str]) -> list[str]:
        return [self.own_key(key) for key in batch]

    def own_windows(self, delta_timestamps: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``delta_timestamps`` by batch name, as this dataset's own keys."""
        if delta_timestamps is None or not self:
            return None if delta_timestamps is None else dict(delta_timestamps)
        return {own: delta_timestamps[key] for key in delta_timestamps if (own := self.own_name(key)) is not None}

    def own_augment(self, augment: AugmentConfig | None) -> AugmentConfig | None:
        """``augment`` with a per-camera ``normalize`` keyed by this dataset's own camera keys."""
        normalize = getattr(augment, "normalize", None)  # (not an AugmentConfig: the iterator refuses it, naming it)
        if augment is None or not self or not isinstance(normalize, Mapping):
            return augment
        by_own = {own: norm for key, norm in normalize.items() if (own := self.own_name(key)) is not None}
        return replace(augment, normalize=by_own) if by_own else augment  # (none: the iterator names what lacks one)

    def batch(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A batch of this dataset's, its keys (and their ``_is_pad`` masks) under their batch names."""
        if not self:
            return dict(values)
        renamed = {}
        for key, value in values.items():
            if key.endswith(PAD_SUFFIX) and key not in self.to_batch:
                base = key[: -len(PAD_SUFFIX)]
                renamed[self.batch_name(base) + PAD_SUFFIX] = value
            else:
                renamed[self.batch_name(key)] = value
        return renamed


def check_rename_map(rename_map: object, where: str = "") -> None:
    """TypeError unless ``rename_map`` maps names (strings) to names; ValueError where one of them is empty or only
    whitespace (no dataset has such a key, no batch should). ``where``: the dataset the map is for, named first."""
    prefix = f"{where}: " if where else ""
    if not isinstance(rename_map, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in rename_map.items()
    ):
        raise TypeError(f"{prefix}a rename_map maps key names to new names ({{old: new}}), got {rename_map!r}")
    blank = {old: new for old, new in rename_map.items() if not old.strip() or not new.strip()}
    if blank:
        raise RenameMapError(
            f"{prefix}rename_map has entries with an empty name, {blank}: each gives a dataset's own key (its "
            'meta/info.json features) the name the batches give it, e.g. {"observation.images.rgb": '
            '"observation.images.top"}: fill in both names, or drop the entry'
        )


def _reversed(
    unknown: Sequence[str], rename_map: Mapping[str, str], own: Iterable[str], check: Callable[[dict[str, str]], Any]
) -> str:
    """``; this one maps the other way round: pass {...}`` where each key ``unknown`` of ``rename_map`` (those
    ``own`` lacks) has a value ``own`` holds (entries written batch name first): the whole map, those entries
    reversed, the others as given, if ``check`` takes it (raises no ValueError); else ""."""
    read = set(own)
    if not all(rename_map[key] in read for key in unknown):
        return ""
    flipped = {(new if old in unknown else old): (old if old in unknown else new) for old, new in rename_map.items()}
    if len(flipped) < len(rename_map):  # (a reversed entry's key is another entry's)
        return ""
    try:
        check(flipped)
    except ValueError:
        return ""
    return f"; this one maps the other way round: pass {_said(flipped)}"


def rename_maps_for(
    rename_map: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None,
    readers: Sequence[LeRobotDatasetReader],
    *,
    cameras: Sequence[str] | None = None,
) -> list[KeyRename]:
    """Each dataset's :class:`KeyRename` from one ``rename_map`` for all (each dataset takes the entries for keys
    it reads; every entry must be some dataset's), or from one per dataset (None: none; every entry the dataset's
    own), so that one map serves datasets of which only some use a name. ``cameras``: as
    :meth:`KeyRename.checked`."""
    if rename_map is None or isinstance(rename_map, Mapping):
        given = dict(rename_map or {})
        check_rename_map(given)  # (before its keys are sorted: 3 among strings raised "'<' not supported")
        unread = set(given) - {key for reader in readers for key in reader.read_keys}
        if unread:
            unknown, read = sorted(unread), sorted({key for reader in readers for key in reader.read_keys})
            raise RenameMapError(
                f"rename_map renames {unknown}, which none of the datasets reads{did_you_mean(unknown, read)}: "
                f"{_MAP_SHAPE}{_reversed(unknown, given, read, lambda fixed: _each_keeping(fixed, readers, cameras))}"
            )
        maps: Sequence[Mapping[str, str] | None] = [
            {k: v for k, v in given.items() if k in reader.read_keys} for reader in readers
        ]
    else:
        maps = rename_map
        if len(maps) != len(readers):
            raise RenameMapError(
                f"one rename_map for all datasets, or one per dataset ({len(readers)}), got {len(maps)}"
            )
    return [KeyRename.checked(m, reader, cameras=cameras) for m, reader in zip(maps, readers, strict=True)]


def own_cameras(
    dataset: LocatedDataset, cameras: Sequence[str] | None, rename_map: Mapping[str, str] | None
) -> list[str] | None:
    """``dataset``'s own keys for ``cameras`` (the batches' names, which ``rename_map``, its ``{own key: batch key}``,
    gives its cameras), to open it with (:func:`~.dataset_reader.open_located`, at the location and with the
    info.json read here), one of several: so that a camera its info.json declares but it never recorded (GR00T
    v2.0's 'egoview') is not looked for; None where ``cameras`` is None (every camera it declares).
    CameraSelectionError names a camera of ``cameras`` it lacks, the dataset, its cameras and the rename that would
    give it; or a camera of ``cameras`` the map gives two of its cameras (which to read is not to guess)."""
    if cameras is None:
        return None
    if isinstance(cameras, str):  # (as open_dataset says it)
        raise TypeError(f"cameras= takes a list of keys, got the string {cameras!r}: pass [{cameras!r}]")
    location = dataset.location
    if rename_map is not None:
        check_rename_map(rename_map, location.description)
    return _own_cameras(location.description, dataset.info, cameras, rename_map)


def _own_cameras(
    where: str, info: DatasetInfo, cameras: Sequence[str], rename_map: Mapping[str, str] | None
) -> list[str]:
    """:func:`own_cameras` of dataset ``where``, its ``info`` read."""
    declared = info.camera_keys
    rename = KeyRename({k: v for k, v in (rename_map or {}).items() if k in declared})  # (checked once opened)
    names = rename.batch_names(declared)
    several = sorted({camera for camera in cameras if names.count(camera) > 1})
    if several:  # (said first: a map told for a camera lacking besides would still give it two)
        raise RenamedCameraError(
            f"{where}: rename_map gives {several} to several of its cameras ({dict(rename.to_batch)}; "
            f"its cameras are {declared}): one camera per name"
        )
    lacking = [camera for camera in cameras if camera not in names]
    if lacking:
        renamed = f" (renamed by its rename_map {dict(rename.to_batch)})" if rename else ""
        away = [camera for camera in lacking if rename.own_name(camera) is None]  # (its own key, renamed)
        told = "".join(
            f"; {camera!r} is renamed {rename.to_batch[camera]!r} by it: name it so, or drop that entry"
            for camera in away
        )
        unknown = [key for key in rename_map or {} if key not in info.features]  # (entries written batch name first?)
        reversal = (
            _reversed(unknown, rename_map, info.features, _keeping(where, info, cameras))
            if unknown and rename_map
            else ""
        )
        # (its whole map in the hint, to be passed back as it is, less the entries renaming away a camera asked for:
        # so it is read under its own name, and is spare for none lacking)
        kept = {own: new for own, new in (rename_map or {}).items() if own not in away}
        kept_names = [kept.get(own, own) for own in declared]
        spare = [own for own, name in zip(declared, kept_names, strict=True) if name not in cameras]
        hint = reversal or _hint([([c for c in cameras if c not in kept_names], spare, "cameras")], kept)
        hidden = RenamedCameraError if away or reversal else CameraSelectionError  # (by the map: it is what to change)
        raise hidden(f"{where} has no camera {lacking}; its cameras are {names}{renamed}{told}{hint}")
    return rename.own_names(cameras)


def _each_keeping(
    rename_map: Mapping[str, str], readers: Sequence[LeRobotDatasetReader], cameras: Sequence[str] | None
) -> None:
    """ValueError unless one ``rename_map`` for all ``readers`` checks (:func:`rename_maps_for`) and gives each of
    them each of ``cameras`` once."""
    for reader in readers:
        _keeping(reader.location.description, reader.info, cameras)(rename_map)
    rename_maps_for(rename_map, readers)


def _keeping(where: str, info: DatasetInfo, cameras: Sequence[str] | None) -> Callable[[Mapping[str, str]], None]:
    """A check that a rename map gives dataset ``where`` (its ``info``) each of ``cameras`` once (None: any map
    does): raises ValueError, saying why, where not."""

    def check(rename_map: Mapping[str, str]) -> None:
        if cameras is not None:
            try:
                _own_cameras(where, info, cameras, rename_map)
            except CameraSelectionError as e:
                raise ValueError(str(e)) from e

    return check


@overload
def without_cameras_left_out(
    rename_map: Mapping[str, str] | None, readers: Sequence[LeRobotDatasetReader]
) -> Mapping[str, str] | None: ...


@overload
def without_cameras_left_out(
    rename_map: Sequence[Mapping[str, str] | None], readers: Sequence[LeRobotDatasetReader]
) -> list[Mapping[str, str] | None]: ...


def without_cameras_left_out(
    rename_map: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None, readers: Sequence[LeRobotDatasetReader]
) -> Mapping[str, str] | list[Mapping[str, str] | None] | None:
    """``rename_map`` (one for all ``readers``, or one per reader, as :func:`rename_maps_for` takes) less its entries
    for cameras the readers declare but were not opened with (``cameras=`` left them out, :func:`own_cameras`): they
    rename nothing, and :meth:`KeyRename.checked` refuses an entry for a key a dataset does not read."""

    def trimmed(given: Mapping[str, str] | None, of: Sequence[LeRobotDatasetReader]) -> Mapping[str, str] | None:
        if not isinstance(given, Mapping):  # (None; or not a map, which KeyRename.checked says)
            return given
        read = {key for reader in of for key in reader.read_keys}
        left_out = {key for reader in of for key in reader.info.camera_keys} - read
        return {old: new for old, new in given.items() if old not in left_out}

    if rename_map is None or isinstance(rename_map, Mapping):
        return trimmed(rename_map, readers)
    if len(rename_map) != len(readers):  # (rename_maps_for says how many it takes)
        return list(rename_map)
    return [trimmed(given, [reader]) for given, reader in zip(rename_map, readers, strict=True)]


def flag_at_fault(error: CameraSelectionError) -> str:
    """The command-line flag to change for ``error``, raised opening datasets for ``--cameras`` with
    ``--rename-map``: the map's where it hides a camera the dataset has (:class:`~.errors.RenamedCameraError`)."""
    return "--rename-map" if isinstance(error, RenameMapError) else "--cameras"


def rename_map_from_json(text: str) -> dict[str, str]:
    """``{"key": "new name"}`` from a command line's JSON; ValueError says what a rename map looks like."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f'a JSON object of names, {{"key": "new name"}}, got {text!r}')
    check_rename_map(value)  # (an empty name: refused here, one line, not once a dataset is opened)
    return value


def shared_selection(
    readers: list[LeRobotDatasetReader],
    *,
    cameras: Sequence[str] | None,
    keys: Sequence[str] | None,
    renames: Sequence[KeyRename] | None = None,
) -> list[LeRobotDatasetReader]:
    """Each reader narrowed to ``cameras`` and ``keys``, by default to those every dataset has (in the first's
    order), under the names ``renames`` give them (one per reader); what is left out is logged, per dataset."""
    renames = list(renames) if renames is not None else [KeyRename()] * len(readers)
    named = list(zip(readers, renames, strict=True))
    chosen = {}
    for what, given, of in (
        ("cameras", cameras, lambda r, n: n.batch_names(r.all_camera_keys)),
        ("keys", keys, lambda r, n: n.batch_names(r.tabular_keys)),
    ):
        if isinstance(given, str):  # (its letters were read as keys: "unknown key(s) ['a', 'c', 't', ...]")
            raise TypeError(f"{what}= takes a list of keys, got the string {given!r}: pass [{given!r}]")
        if given is not None:
            chosen[what] = list(given)
            continue
        shared = [k for k in of(*named[0]) if all(k in of(*pair) for pair in named[1:])]
        for reader, rename in named:
            # (an index column left out still comes in every batch: derived where a dataset's files lack it)
            dropped = [k for k in of(reader, rename) if k not in shared and k not in INDEX_COLUMNS]
            if dropped:
                warn_once(logger,
                    "%s %s of %s are left out: not every dataset read with it has them", what, dropped,
                    reader.location.description,
                )  # fmt: skip
        chosen[what] = shared
    narrowed = []
    for reader, rename in named:
        try:
            own = {what: rename.own_names(chosen[what]) for what in ("cameras", "keys")}
            narrowed.append(reader.select(**own))
        except DatasetError as e:
            hint = ""
            if len(readers) > 1:
                cameras_named = rename.batch_names(reader.all_camera_keys)
                names = [*cameras_named, *rename.batch_names(reader.tabular_keys)]
                wanted = [*chosen["cameras"], *chosen["keys"]]
                lacking = [k for k in wanted if k not in names and rename.own_name(k) is not None]
                spare = [k for k in names if k not in wanted and k not in _FIXED_KEYS]
                hint = rename_hint(lacking, spare, rename, cameras=[*chosen["cameras"], *cameras_named])
            raise DatasetError(f"{reader.location.description}: {e}{hint}") from None
    return narrowed


#: Where a rename_map is given, for hints.
_WHERE_GIVEN = (
    "DALILeRobotMixture's dataset_options=[..., {'rename_map': ...}], concat_datasets' rename_maps=[...] (a map or "
    "None per dataset), on the command line --rename-map"
)

#: Words of a key's name that say it is a camera, not which one ('cam_top' is 'top'): :func:`_alike` leaves them out.
_NO_CAMERA_WORDS = frozenset({"", "cam", "camera", "image", "img", "rgb", "view"})

#: The most maps a hint lists, one per way to give the keys a dataset lacks the names of its spare ones.
_MAPS_TOLD = 3


def rename_hint(
    lacking: Sequence[str],
    spare: Sequence[str],
    rename: KeyRename,
    *,
    cameras: Iterable[str] | None = None,
) -> str:
    """What to add where a dataset read with others lacks keys ``lacking`` that they have (``spare``: the batch
    names of its keys the others lack; ``rename``: its rename_map): a rename_map giving its keys those names, e.g. a
    camera recorded as 'rgb' where the others say 'top' (told as JSON, what ``--rename-map`` takes: those entries
    first, then its map's others, if any, as given); ""
    where it lacks none. Each map told gives every key lacking a spare key's name, a camera a camera's and a feature a
    feature's (``cameras``: the batch names that are cameras, its own and the others'; None: one kind): the one
    pairing where names decide it (:func:`_by_name`), else each pairing (up to :data:`_MAPS_TOLD`), else none
    (which is which is not to be guessed: its spare keys are listed); where it has fewer spare keys of a kind than it
    lacks, no rename gives them all."""
    given = rename.to_batch
    if cameras is None:
        return _hint([(lacking, [rename.own_key(name) for name in spare], "keys")], given)
    are_cameras = set(cameras)
    return _hint(
        [
            (
                [name for name in lacking if (name in are_cameras) == camera],
                [rename.own_key(name) for name in spare if (name in are_cameras) == camera],
                "cameras" if camera else "features",
            )
            for camera in (True, False)
        ],
        given,
    )


def _hint(kinds: Sequence[tuple[Sequence[str], Sequence[str], str]], given: Mapping[str, str]) -> str:
    """:func:`rename_hint` of ``kinds``: (names lacking, spare own keys, what they are) of each kind of key, its map
    as ``given``."""
    kinds = [(lacking, spare, what) for lacking, spare, what in kinds if lacking]
    if not kinds:
        return ""
    for lacking, spare, what in kinds:
        if len(spare) < len(lacking):
            has = f"only {list(spare)}" if spare else "none"
            return (
                f"; it lacks {list(lacking)} and has {has} of its {what} left to give those names: no rename_map gives "
                "it them all"
            )
    lacking = [name for names, _, _ in kinds for name in names]
    spare = [key for _, keys, _ in kinds for key in keys]
    by_name = [_by_name(names, keys) for names, keys, _ in kinds]
    if prod(perm(len(keys), len(rest)) for _, rest, keys in by_name) > _MAPS_TOLD:  # (counted: not listed, as many)
        return (
            f"; if it records {lacking} under other names, give each the key it is recorded as with a rename_map "
            f"(which of its keys left, {spare}, records which is not to be guessed: {_WHERE_GIVEN})"
        )
    each = [
        [{**paired, **dict(zip(order, rest, strict=True))} for order in permutations(keys, len(rest))]
        for paired, rest, keys in by_name
    ]
    added = [{key: name for pairing in pairings for key, name in pairing.items()} for pairings in product(*each)]
    # (the entries that differ first, the map as given after: maps told read apart at their starts)
    maps = [{**entries, **{key: name for key, name in given.items() if key not in entries}} for entries in added]
    if len(lacking) == 1:
        said = f"if a dataset lacking {lacking[0]!r} records it under another name, give it that name"
    else:
        said = f"if a dataset lacking {lacking} records them under other names, give them those names"
    maps_told = _said(maps[0]) if len(maps) == 1 else f"one of {', '.join(map(_said, maps))}"
    return f"; {said} with a rename_map ({maps_told}: {_WHERE_GIVEN})"


def _said(rename_map: Mapping[str, str]) -> str:
    """A map a hint tells, as JSON: a Python dict as written, and what ``--rename-map`` takes."""
    return json.dumps(dict(rename_map), ensure_ascii=False)  # (a key named as the rest of the message names it)


def _by_name(lacking: Sequence[str], spare: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """The pairings of ``lacking`` (names) and ``spare`` (keys) names decide, as ``{key: name}``: a name and a key
    whose last parts name one camera (:func:`_alike`: 'observation.images.top' and 'observation.images.cam_top') and
    each other alone; and the names and keys left, each of which may be any other (every order is a map to tell)."""
    alike = {name: [key for key in spare if _alike(name, key)] for name in lacking}
    paired = {
        alike[name][0]: name
        for name in lacking
        if len(alike[name]) == 1 and [other for other in lacking if alike[name][0] in alike[other]] == [name]
    }
    return (
        paired,
        [name for name in lacking if name not in paired.values()],
        [key for key in spare if key not in paired],
    )


def _alike(name: str, key: str) -> bool:
    """Whether the last parts of ``name`` and ``key`` (after the last '.') have one set of words, less words naming no
    camera (:data:`_NO_CAMERA_WORDS`), and not numbers alone: 'top', 'cam_top' and 'top_cam'; 'wrist' and
    'wrist_image'; not 'top' and 'top_depth', 'wrist' and 'cam_left_wrist', 'image' and 'wrist_image' (a word more
    may name another camera), nor 'camera_1' and 'image_1' (datasets count cameras from 0 or from 1)."""
    words = [set(re.split(r"[^a-z0-9]+", k.rsplit(".", 1)[-1].lower())) - _NO_CAMERA_WORDS for k in (name, key)]
    return not all(word.isdigit() for word in words[0]) and words[0] == words[1]
