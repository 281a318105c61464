"""Rename hints (``key_rename.rename_hint``): each map a refusal tells, passed back as told, gets past that refusal.

A dataset lacking several keys, or having several it could give the name, was told ``{'<its key>': name}``, a map
no dataset takes. Fuzzed (concat_datasets and DALILeRobotMixture over two or three of a 3-, 2- and 1-camera
dataset, random maps, cameras= and windows; 300 cases for each of 3 seeds): 378 of 900 refusals told '<its key>',
and 19 of 177 maps told, passed, were refused on that dataset again; 0 and 0 of 511 now.
"""

from __future__ import annotations

import ast
import re
from itertools import permutations

import pytest

from lerobot_dali import DALILeRobotMixture, concat_datasets, key_rename, open_dataset
from lerobot_dali.dataset_reader import locate_dataset
from lerobot_dali.errors import CameraSelectionError, DatasetError, DeltaTimestampsError, RenameMapError
from lerobot_dali.key_rename import KeyRename, own_cameras, rename_hint, rename_map_from_json

CAM0, CAM1, CAM2, SIDE, TOP, WRIST = (
    f"observation.images.{n}" for n in ("cam0", "cam1", "cam2", "side", "top", "wrist")
)


def _maps_told(error: BaseException) -> list[dict[str, str]]:
    """Each map the rename hint of ``error`` tells to pass."""
    found = re.search(r"with a rename_map \((.*?): DALILeRobotMixture's", str(error))
    assert found is not None, error
    return [ast.literal_eval(told) for told in re.findall(r"\{[^{}]*\}", found.group(1))]


@pytest.fixture
def cameras3(make_ds):
    return make_ds(episodes=2, frames_per_episode=6, cameras=3, size=(64, 64), fps=10, codec="vp9", gop=2)


@pytest.fixture
def cameras2(make_ds):
    return make_ds(episodes=2, frames_per_episode=6, cameras=2, size=(64, 64), fps=10, codec="vp9", gop=2, seed=1)


def test_a_camera_lacking_where_several_could_be_it_tells_each_map_and_each_opens(cameras3, cameras2) -> None:
    """cameras=['top'], which neither dataset has: '<its key>' was told; now one map per camera of the first (3),
    each of which, passed (the second's camera 1 named 'top'), opens reading that camera."""
    with pytest.raises(CameraSelectionError) as caught:
        concat_datasets([cameras3, cameras2], cameras=[TOP])
    assert "<its key>" not in str(caught.value), caught.value
    told = _maps_told(caught.value)
    assert told == [{CAM0: TOP}, {CAM1: TOP}, {CAM2: TOP}]
    for rename_map in told:
        union = concat_datasets([cameras3, cameras2], cameras=[TOP], rename_maps=[rename_map, {CAM1: TOP}])
        assert [member.all_camera_keys for member in union.members] == [(next(iter(rename_map)),), (CAM1,)]


def test_several_cameras_lacking_are_told_every_pairing_or_said_not_to_be_guessed(cameras3, cameras2) -> None:
    """Two cameras lacking: the 2-camera dataset is told both pairings, each of which opens; the 3-camera one has
    six, and is told its cameras and that which is which is not to be guessed, with no map (was '<its key>')."""
    located = locate_dataset(cameras2)
    with pytest.raises(CameraSelectionError) as caught:
        own_cameras(located, [TOP, WRIST], None)
    told = _maps_told(caught.value)
    assert told == [{CAM0: TOP, CAM1: WRIST}, {CAM1: TOP, CAM0: WRIST}]
    assert [own_cameras(located, [TOP, WRIST], rename_map) for rename_map in told] == [[CAM0, CAM1], [CAM1, CAM0]]
    with pytest.raises(CameraSelectionError) as caught:
        own_cameras(locate_dataset(cameras3), [TOP, WRIST], None)
    assert str(caught.value).endswith(
        f"; if it records ['{TOP}', '{WRIST}'] under other names, give each the key it is recorded as with a "
        f"rename_map (which of its keys left, ['{CAM0}', '{CAM1}', '{CAM2}'], records which is not to be guessed: "
        "DALILeRobotMixture's dataset_options=[..., {'rename_map': ...}], concat_datasets' rename_maps=[...] (a map or "
        "None per dataset), on the command line --rename-map)"
    ), caught.value
    # More cameras asked than it has: no map gives them all (it was told '<its key>')
    with pytest.raises(CameraSelectionError) as caught:
        own_cameras(located, [CAM0, TOP, WRIST], None)
    assert str(caught.value).endswith(
        f"; it lacks ['{TOP}', '{WRIST}'] and has only ['{CAM1}'] of its cameras left to give those names: no "
        "rename_map gives it them all"
    ), caught.value


def test_a_camera_renamed_away_is_told_by_its_own_name_and_spare_for_none(cameras3) -> None:
    """cameras=[cam1, side, wrist] with {cam1: wrist}: cam1 is renamed away ('name it so, or drop that entry'); the
    hint counted its new name 'wrist' as asked and told '<its key>' for 'side'; now the map less that entry, with each
    pairing of 'side' and 'wrist' to cam0 and cam2, each of which opens."""
    located = locate_dataset(cameras3)
    with pytest.raises(CameraSelectionError, match=f"'{CAM1}' is renamed '{WRIST}' by it: name it so") as caught:
        own_cameras(located, [CAM1, SIDE, WRIST], {CAM1: WRIST})
    told = _maps_told(caught.value)
    assert told == [{CAM0: SIDE, CAM2: WRIST}, {CAM2: SIDE, CAM0: WRIST}]
    assert [own_cameras(located, [CAM1, SIDE, WRIST], m) for m in told] == [[CAM1, CAM0, CAM2], [CAM1, CAM2, CAM0]]


def test_a_window_hint_keeps_the_keys_windows_name(cameras3, cameras2) -> None:
    """Windows on 'cam0' and 'side'; the second reads its cam0 as 'top', cam1 as 'side', so the first lacks 'side'
    and the second 'cam0'. The first's hint told '<its key>' (its 3 cameras spare, cam0 among them, which a window
    names); now cam1 or cam2, each of which, passed, gets past the first (the second's refusal is next)."""
    windows = {CAM0: [0.0], SIDE: [0.0]}
    second = {"rename_map": {CAM0: TOP, CAM1: SIDE}}
    with pytest.raises(DeltaTimestampsError) as caught:
        DALILeRobotMixture([cameras3, cameras2], delta_timestamps=windows, dataset_options=[{}, second], device="cpu")
    told = _maps_told(caught.value)
    assert told == [{CAM1: SIDE}, {CAM2: SIDE}]
    for rename_map in told:
        with pytest.raises(DeltaTimestampsError) as caught:
            DALILeRobotMixture(
                [cameras3, cameras2], delta_timestamps=windows, dataset_options=[{"rename_map": rename_map}, second],
                device="cpu",
            )  # fmt: skip
        assert f"not every dataset has them ({{'{cameras2}': ['{CAM0}']}})" in str(caught.value), caught.value


def test_names_alike_are_paired_without_listing_every_order() -> None:
    """'top' and 'wrist' lacking, 'cam_top' and 'wrist_cam' spare (their last parts' words, less 'cam', one set):
    one map; where two spare keys are alike one lacking ('wrist_cam', 'cam_wrist'), each pairing; and where one
    spare key is alike two lacking ('top_cam' and 'top', 'cam_top'), each pairing too (it was paired with the last)."""
    named = "observation.images.cam_top", "observation.images.wrist_cam", "observation.images.cam_wrist"
    hint = rename_hint([TOP, WRIST], [named[0], named[1], CAM0], KeyRename())
    assert _maps_told(ValueError(hint)) == [{named[0]: TOP, named[1]: WRIST}]
    hint = rename_hint([WRIST], [named[1], named[2]], KeyRename({CAM0: "x"}))
    assert _maps_told(ValueError(hint)) == [{CAM0: "x", named[1]: WRIST}, {CAM0: "x", named[2]: WRIST}]
    top_cam = "observation.images.top_cam"
    hint = rename_hint([TOP, named[0]], [top_cam, SIDE], KeyRename())
    assert _maps_told(ValueError(hint)) == [{top_cam: TOP, SIDE: named[0]}, {SIDE: TOP, top_cam: named[0]}]


def test_a_window_lacking_a_camera_and_a_feature_pairs_each_with_its_kind(cameras3, cameras2) -> None:
    """Windows on 'act' and 'top', which the second's map gives its 'action' and cam1: the first lacks both, and the
    hint paired them all with spare keys of the first's kind ('act' a feature: its 'action' alone), so it said no map
    gives it them all (it was '<its key>' before). Each kind is paired with its own now: 'action' to 'act' and cam1
    or cam2 to 'top'; each map, passed, opens, the first's camera read as 'top'."""
    windows = {"act": [0.0], TOP: [0.0]}
    options = [{}, {"rename_map": {"action": "act", CAM1: TOP}}]
    with pytest.raises(DeltaTimestampsError) as caught:
        DALILeRobotMixture([cameras3, cameras2], delta_timestamps=windows, dataset_options=options, device="cpu")
    told = _maps_told(caught.value)
    assert told == [{"action": "act", CAM1: TOP}, {"action": "act", CAM2: TOP}]
    for rename_map in told:
        mix = DALILeRobotMixture(
            [cameras3, cameras2], delta_timestamps=windows, dataset_options=[{"rename_map": rename_map}, options[1]],
            batch_size=2, device="cpu", num_workers=0,
        )  # fmt: skip
        try:
            own = next(key for key, name in rename_map.items() if name == TOP)
            assert mix.datasets[0].reader.all_camera_keys == (CAM0, own)  # (cam0 both have; 'top')
        finally:
            mix.close()


@pytest.mark.parametrize(
    ("lacking", "spare"),
    [
        ("image", ("wrist_image", "agentview")),  # (LIBERO's main camera is 'image'; 'wrist_image' is not it)
        ("top", ("top_depth", "cam_high")),  # (a depth map of the top camera is not it)
        ("wrist", ("cam_left_wrist", "cam_high")),  # (one arm's wrist camera: which of two arms is not to be guessed)
        ("left", ("cam_left_wrist", "cam_high")),  # (a stereo head's left camera is no wrist camera)
        ("cam_high", ("cam", "top")),  # ('cam' names no camera)
        ("camera_1", ("image_1", "image_0")),  # (a number alone: one dataset may count from 0, the other from 1)
    ],
)
def test_a_name_sharing_only_some_words_decides_no_pairing(lacking: str, spare: tuple[str, ...]) -> None:
    """A spare key whose last part's words were a part of the name's (or held them and more) was paired with it, one
    map told: 'wrist_image' for 'image', 'top_depth' for 'top'. Fuzzed (cameras of 12 roles under 1-7 LeRobot names
    each, 1-3 asked, 1-4 recorded, 3 x 1,000): 90 of 184 maps told alone by names paired cameras of other roles;
    0 of 83 now (each of the others is told among every pairing). Each pairing is told here."""
    named = [f"observation.images.{key}" for key in spare]
    hint = rename_hint([f"observation.images.{lacking}"], named, KeyRename())
    assert _maps_told(ValueError(hint)) == [{key: f"observation.images.{lacking}"} for key in named]


@pytest.mark.parametrize(
    ("lacking", "key"),
    [("top", "cam_top"), ("top", "top_cam"), ("Top", "top"), ("wrist", "wrist_image"), ("high", "cam_high"),
     ("left_wrist", "wrist_left"), ("front", "front_view")],
)  # fmt: skip
def test_a_name_and_a_key_naming_one_camera_are_paired(lacking: str, key: str) -> None:
    """Names alike but for words naming no camera ('cam', 'image', 'view'), case or order: the one map told."""
    named = [f"observation.images.{key}", "observation.images.laptop"]
    hint = rename_hint([f"observation.images.{lacking}"], named, KeyRename())
    assert _maps_told(ValueError(hint)) == [{named[0]: f"observation.images.{lacking}"}]


def test_the_errors_of_cameras_and_rename_maps_are_exported_where_the_others_are() -> None:
    """CameraSelectionError, RenameMapError and RenamedCameraError were in neither ``lerobot_dali.errors.__all__`` nor
    ``lerobot_dali``'s (3 of the 23 classes the errors module defines; the other 20 in its ``__all__``), so
    ``from lerobot_dali import RenameMapError`` failed and star imports lacked them. Each is what it was (a
    RenamedCameraError is caught as the CameraSelectionError and DatasetError it was before, a RenameMapError as the
    ValueError)."""
    import lerobot_dali
    from lerobot_dali import errors

    defined = {
        name for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__
    }  # fmt: skip
    assert defined - set(errors.__all__) == set()
    for name in defined:  # (FrameRequestError, too, was left out of the package's)
        assert name in lerobot_dali.__all__ and getattr(lerobot_dali, name) is getattr(errors, name), name
    assert issubclass(errors.RenamedCameraError, errors.CameraSelectionError)
    assert issubclass(errors.RenamedCameraError, errors.RenameMapError)
    assert issubclass(errors.RenameMapError, ValueError)


@pytest.mark.parametrize("name", ["caméra_haut", "上", 'top "main"', "back\\slash"])
def test_a_map_told_names_keys_as_the_dataset_does_and_parses_back(name: str) -> None:
    """A map told is JSON that ``--rename-map`` parses back to the map (4 of 4 before and after); a key of letters
    outside ASCII was told escaped ('cam\\u00e9ra_haut', '\\u4e0a', 2 of these 4) where the rest of the message
    names it as the dataset does: as it is now."""
    own = f"observation.images.{name}"
    hint = rename_hint([TOP], [own], KeyRename())
    told = re.search(r"\((\{.*?\}): DALILeRobotMixture's", hint)
    assert told is not None, hint
    assert rename_map_from_json(told.group(1)) == {own: TOP}
    assert [c for c in name if not c.isascii()] == [c for c in told.group(1) if not c.isascii()], told.group(1)


def test_many_keys_lacking_are_said_not_to_be_guessed_without_listing_every_pairing(monkeypatch) -> None:
    """8 features lacking, 10 spare (windows or keys= over datasets of many features, DROID's 20 say): every pairing
    (1,814,400) was listed before a hint found it had more than 3 to tell, 2.6 s and 590 MiB here (10 of 12: 239.5
    million, about 75 GiB at that rate, not run); the pairings are counted now, none listed past those told."""
    drawn = []

    def counted(keys, count):
        for order in permutations(keys, count):
            drawn.append(order)
            assert len(drawn) <= 3, "more pairings listed than a hint tells"
            yield order

    monkeypatch.setattr(key_rename, "permutations", counted)
    lacking = [f"observation.state.lacking{i}" for i in range(8)]
    spare = [f"observation.state.spare{i}" for i in range(10)]
    hint = rename_hint(lacking, spare, KeyRename(), cameras=[])
    assert hint.startswith(f"; if it records {lacking} under other names, give each the key it is recorded as"), hint
    assert drawn == []


def test_maps_told_for_a_dataset_of_six_cameras_start_with_the_entries_that_differ() -> None:
    """Six cameras, three renamed by its map and 'side' lacking: three maps told, each its map and one entry for
    'side', 1,491 characters in all; that entry came last, after the three each map repeats, so the maps read alike
    to their ends. It comes first now, the map as given after it (JSON: the order changes nothing passed)."""
    own = [f"observation.images.{n}" for n in ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist", "front")]
    given = {own[2]: "observation.images.left", own[3]: "observation.images.right", own[0]: TOP}
    hint = rename_hint([SIDE], [own[1], own[4], "observation.images.laptop"], KeyRename(given))
    told = _maps_told(ValueError(hint))
    assert [next(iter(m.items())) for m in told] == [
        (key, SIDE) for key in (own[1], own[4], "observation.images.laptop")
    ]
    assert [dict(list(m.items())[1:]) for m in told] == [given] * 3


def test_a_map_whose_reversed_entry_is_another_entrys_key_is_told_no_reversal(cameras2) -> None:
    """``{top: cam0, cam0: wrist}``: 'top' is no key of the dataset's, but reversed (``{cam0: top}``) its entry is the
    other's key; the reversal told would be ``{cam0: wrist}``, the entry for 'top' lost: none is told."""
    reader = open_dataset(cameras2)
    with pytest.raises(RenameMapError) as caught:
        KeyRename.checked({TOP: CAM0, CAM0: WRIST}, reader)
    assert str(caught.value).endswith("its values the batches' names"), caught.value
    # (neither name its key; reversed, two keys named 'top': no reversal either)
    for rename_map in ({TOP: SIDE}, {TOP: CAM0, CAM1: TOP}):
        with pytest.raises(RenameMapError) as caught:
            KeyRename.checked(rename_map, reader)
        assert str(caught.value).endswith("its values the batches' names"), caught.value
    with pytest.raises(RenameMapError, match=re.escape(f'other way round: pass {{"{CAM0}": "{TOP}"}}')):
        KeyRename.checked({TOP: CAM0}, reader)


def test_a_camera_two_of_three_datasets_have_is_left_out(cameras3, cameras2) -> None:
    """'cam2' is the first two datasets', not the third's: left out of all three, as one only the first has is."""
    union = concat_datasets([cameras3, cameras3, cameras2])
    assert [member.all_camera_keys for member in union.members] == [(CAM0, CAM1)] * 3


def test_entries_giving_a_key_its_own_name_rename_nothing(cameras2) -> None:
    """``{index: index}`` (a map written out whole) names no key every batch carries under another name: dropped,
    as ``{cam0: cam0}`` is, not refused."""
    reader = open_dataset(cameras2)
    assert dict(KeyRename.checked({"index": "index", CAM0: CAM0, CAM1: TOP}, reader).to_batch) == {CAM1: TOP}
    assert not KeyRename.checked({CAM0: CAM0}, reader)


def test_a_key_its_map_renames_away_is_told_its_new_name_alone(cameras3, cameras2) -> None:
    """keys= naming a feature by the name the dataset's map renames away: told to name it so, and no map giving some
    other key that name (the dataset has it, under the new name)."""
    state = "observation.state"
    with pytest.raises(DatasetError) as caught:
        concat_datasets([cameras3, cameras2], keys=[state], rename_maps=[{state: "observation.joints"}, None])
    assert str(caught.value).endswith(f"{state!r} is renamed 'observation.joints' by its rename_map: name it so")


@pytest.mark.parametrize("spares", [3, 4])
def test_a_hint_tells_up_to_three_maps_and_past_them_says_which_is_not_to_be_guessed(spares: int) -> None:
    """One camera lacking and 3 spare cameras: each of the 3 maps told (_MAPS_TOLD); 4 spare: none listed, the spare
    ones named and said not to be guessed. (A mutation pass telling up to 4 passed: only 3 and 8 x 10 were asked.)"""
    spare = [f"observation.images.cam{i}" for i in range(spares)]
    hint = rename_hint([TOP], spare, KeyRename())
    if spares == 3:
        assert _maps_told(ValueError(hint)) == [{key: TOP} for key in spare]
    else:
        assert hint.startswith(
            f"; if it records ['{TOP}'] under other names, give each the key it is recorded as with a rename_map "
            f"(which of its keys left, {spare}, records which is not to be guessed: "
        ), hint


def test_a_rename_translates_windows_normalisation_and_batches_at_its_edges() -> None:
    """{cam0: top} by hand: windows and a per-camera normalize named by the batches' names are keyed by the dataset's
    own (a window on 'cam0', renamed away, names no key of its), a batch's keys and their '_is_pad' masks come back
    under the batches' names, and an empty rename hands each back as it was (a copy of the batch; None windows stay
    None). A KeyRename is frozen. (A mutation pass found these checked only through datasets, partly.)"""
    from dataclasses import FrozenInstanceError

    from lerobot_dali.augment_config import AugmentConfig, Normalize

    rename, none = KeyRename({CAM0: TOP}), KeyRename()
    windows = {TOP: [-0.1, 0.0], "action": [0.0, 0.1], CAM0: [0.0]}
    assert rename.own_windows(windows) == {CAM0: [-0.1, 0.0], "action": [0.0, 0.1]}
    assert none.own_windows(windows) == windows and none.own_windows(None) is None and rename.own_windows(None) is None
    norm = Normalize(mean=[0.5, 0.5, 0.5], std=[0.2, 0.2, 0.2])
    augment = AugmentConfig(normalize={TOP: norm, CAM1: norm})
    assert dict(rename.own_augment(augment).normalize) == {CAM0: norm, CAM1: norm}
    assert none.own_augment(augment) is augment and rename.own_augment(None) is None
    alone = AugmentConfig(normalize={CAM0: norm})  # (none for the dataset's names: left for the iterator to name)
    assert rename.own_augment(alone) is alone
    values = {CAM0: 1, f"{CAM0}_is_pad": 2, "index": 3, "action_is_pad": 4}
    assert rename.batch(values) == {TOP: 1, f"{TOP}_is_pad": 2, "index": 3, "action_is_pad": 4}
    assert none.batch(values) == values and none.batch(values) is not values
    with pytest.raises(FrozenInstanceError):
        rename.to_batch = {}  # type: ignore[misc]


@pytest.mark.parametrize("text", ['["a"]', '{"a": 1}', '"a"', "3"])
def test_a_command_lines_rename_map_that_is_no_object_of_names_is_one_value_error(text: str) -> None:
    """``--rename-map`` given JSON that is no object of names: the ValueError the command says in one line, naming the
    text (a mutation pass's and -> or let a list through as an AttributeError, and an object of numbers to
    check_rename_map's TypeError)."""
    with pytest.raises(ValueError, match=re.escape(f'a JSON object of names, {{"key": "new name"}}, got {text!r}')):
        rename_map_from_json(text)


def test_cameras_given_as_a_string_or_maps_of_another_count_are_said_as_given(cameras2, caplog) -> None:
    """cameras='top' (letters read as keys) is a TypeError telling to pass ['top'], opening a dataset or narrowing
    several; one map per dataset of another count, or one that is no map, is handed back as given by
    without_cameras_left_out, for rename_maps_for and KeyRename.checked to say what is wrong; datasets of the same
    keys narrowed to those they share log nothing left out."""
    import logging

    from lerobot_dali.key_rename import shared_selection, without_cameras_left_out

    with pytest.raises(TypeError, match=re.escape(f"got the string {TOP!r}: pass [{TOP!r}]")):
        own_cameras(locate_dataset(cameras2), TOP, None)  # type: ignore[arg-type]
    reader = open_dataset(cameras2)
    with pytest.raises(TypeError, match=re.escape(f"cameras= takes a list of keys, got the string {TOP!r}")):
        shared_selection([reader, reader], cameras=TOP, keys=None)  # type: ignore[arg-type]
    assert without_cameras_left_out([{CAM0: TOP}], [reader, reader]) == [{CAM0: TOP}]
    assert without_cameras_left_out([{CAM0: TOP}, "junk"], [reader, reader]) == [{CAM0: TOP}, "junk"]  # type: ignore[list-item]
    with caplog.at_level(logging.INFO, logger="lerobot_dali.key_rename"):
        narrowed = shared_selection([reader, reader], cameras=None, keys=None)
    assert [r.all_camera_keys for r in narrowed] == [(CAM0, CAM1)] * 2 and caplog.records == []


@pytest.mark.parametrize(
    ("rename_map", "said"),
    [
        ({"action": "index"}, "rename_map names ['index']: every batch carries"),
        ({CAM0: f"{TOP}_is_pad"}, f"rename_map names ['{TOP}_is_pad']: every batch carries"),
        ({CAM0: CAM1}, f"rename_map gives ['{CAM1}'] to a key while another key of the dataset has (or gets)"),
        ({CAM0: TOP, CAM1: TOP}, f"rename_map gives ['{TOP}'] to a key while another key"),
    ],
)
def test_a_map_onto_a_name_every_batch_carries_or_another_key_has_is_refused(cameras2, rename_map, said) -> None:
    """A key renamed to 'index' or to a window's mask ('<key>_is_pad'), or to a name another key has or gets: each
    refused naming it (each refusal of the dataset's own map checked by hand: a mutation pass found them unchecked
    here)."""
    with pytest.raises(RenameMapError, match=re.escape(said)):
        KeyRename.checked(rename_map, open_dataset(cameras2))


def test_narrowing_several_datasets_to_a_camera_one_lacks_tells_the_maps_one_alone_none(cameras2) -> None:
    """shared_selection over two datasets, cameras=['top'] (neither has it): the refusal tells each map giving one of
    its cameras the name; over one dataset (no other to be read with) it tells none."""
    from lerobot_dali.key_rename import shared_selection

    reader = open_dataset(cameras2)
    with pytest.raises(DatasetError) as caught:
        shared_selection([reader, reader], cameras=[TOP], keys=None)
    assert _maps_told(caught.value) == [{CAM0: TOP}, {CAM1: TOP}]
    with pytest.raises(DatasetError) as caught:
        shared_selection([reader], cameras=[TOP], keys=None)
    assert "rename_map" not in str(caught.value), caught.value


def test_a_reversal_that_would_rename_away_a_camera_asked_for_is_not_told(cameras2) -> None:
    """Both datasets opened for cameras=['cam0'], a map ``{side: cam0}`` (no key named 'side'): reversed,
    ``{cam0: side}`` would leave them no 'cam0' for those cameras, so rename_maps_for tells no reversal, the map one
    for all or one per dataset; read for any cameras (None) it tells it. Without ``cameras=`` handed on to the check
    of the map (KeyRename.checked, each reader's), or of its reversal (one map for all), it was told."""
    from lerobot_dali.key_rename import rename_maps_for

    readers = [open_dataset(cameras2, cameras=[CAM0]) for _ in range(2)]
    for rename_map in ({SIDE: CAM0}, [None, {SIDE: CAM0}]):
        with pytest.raises(RenameMapError) as caught:
            rename_maps_for(rename_map, readers, cameras=[CAM0])
        assert str(caught.value).endswith("its values the batches' names"), caught.value
        with pytest.raises(RenameMapError, match=re.escape(f'other way round: pass {{"{CAM0}": "{SIDE}"}}')):
            rename_maps_for(rename_map, readers)


def test_narrowing_to_a_camera_none_has_beside_a_spare_feature_tells_cameras_for_it(cameras2) -> None:
    """shared_selection over two datasets, cameras=['top'] and keys=['action'] (their 'observation.state' left
    spare): the maps told give 'top' to one of their cameras, never to the spare feature."""
    from lerobot_dali.key_rename import shared_selection

    reader = open_dataset(cameras2)
    assert "observation.state" in reader.tabular_keys
    with pytest.raises(DatasetError) as caught:
        shared_selection([reader, reader], cameras=[TOP], keys=["action"])
    assert _maps_told(caught.value) == [{CAM0: TOP}, {CAM1: TOP}]


def test_a_feature_none_has_is_told_the_spare_features_not_the_index_columns(cameras2) -> None:
    """shared_selection over two datasets, keys=['observation.joints'] (neither has it): the maps told give it one of
    their features left unread, 'observation.state' or 'action'; never a column every batch carries ('timestamp',
    'index', ...), nor a key already read."""
    from lerobot_dali.key_rename import shared_selection

    reader = open_dataset(cameras2)
    joints = "observation.joints"
    with pytest.raises(DatasetError) as caught:
        shared_selection([reader, reader], cameras=[CAM0], keys=[joints])
    assert _maps_told(caught.value) == [{"observation.state": joints}, {"action": joints}]


def test_a_dataset_with_no_spare_key_of_a_kind_says_which_kind_it_lacks(cameras2) -> None:
    """shared_selection over two datasets asking for a camera (or a feature) beside every one they have: none of that
    kind is left to rename, which the refusal says naming the kind, cameras or features."""
    from lerobot_dali.key_rename import shared_selection

    reader = open_dataset(cameras2)
    joints = "observation.joints"
    for cameras, keys, lacking, kind in (
        ([CAM0, CAM1, TOP], None, TOP, "cameras"),
        (None, ["observation.state", "action", joints], joints, "features"),
    ):
        with pytest.raises(DatasetError) as caught:
            shared_selection([reader, reader], cameras=cameras, keys=keys)
        assert str(caught.value).endswith(
            f"; it lacks ['{lacking}'] and has none of its {kind} left to give those names: no rename_map gives it "
            "them all"
        ), caught.value
