"""Cameras stored as PNG images in the data files (``dtype: "image"``): rows, windows, decode, errors.

The generated datasets' frames are known exactly (``draw_marker``) and PNG is lossless, so every decoded
frame is compared pixel for pixel with the frame that was written.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import replace
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from lerobot_dali import said_once
from lerobot_dali.augment import AugmentConfig, ColorJitter, Normalize
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.cpu_decode import CpuDecodeOptions
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.dataset_reader import LeRobotDatasetReader, open_dataset
from lerobot_dali.errors import DataFileError, SchemaMismatchError
from lerobot_dali.frame_marker import draw_marker, read_full_marker
from lerobot_dali.generate import expected_state
from lerobot_dali.image_frames import EpisodeImageCache, decode_images
from lerobot_dali.iterator import DALILeRobotIterator

LENGTHS = [5, 1, 7, 4]
FPS = 10
SIZE = (64, 96)
CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"
DELTAS = {CAM0: [-0.2, 0.0, 0.1], "observation.state": [0.0]}


def _images_dataset(make_ds, version: str = "v3.0") -> Path:
    return make_ds(
        episodes=len(LENGTHS), frames_per_episode=LENGTHS, cameras=2, size=SIZE, fps=FPS, version=version,
        image_cameras=True,
    )  # fmt: skip


def _frame(episode: int, frame: int, camera: int) -> np.ndarray:
    return draw_marker(episode, frame, *SIZE, camera)


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_reader_lists_image_cameras_and_returns_their_bytes(make_ds, version: str) -> None:
    reader = open_dataset(_images_dataset(make_ds, version))
    assert reader.camera_keys == [] and reader.image_keys == [CAM0, CAM1]
    assert CAM0 not in reader.tabular_keys
    for pos, length in enumerate(LENGTHS):
        encoded = reader.read_episode_images(pos, CAM1)
        assert len(encoded) == length
        frames = decode_images([encoded[i].as_py() for i in range(length)], label="x")
        np.testing.assert_array_equal(frames, np.stack([_frame(pos, f, 1) for f in range(length)]))
    assert open_dataset(_images_dataset(make_ds, version), cameras=[CAM1]).image_keys == [CAM1]


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_windows_of_image_cameras_follow_lerobot(make_ds, version: str) -> None:
    it = DALILeRobotIterator(
        _images_dataset(make_ds, version), batch_size=4, delta_timestamps=DELTAS, shuffle=False, device="cpu",
        num_workers=0, drop_last=False, return_uint8=True,
    )  # fmt: skip
    seen = []
    for batch in it:
        # windowed image camera: (B, T, C, H, W); without deltas: (B, C, H, W), as LeRobot's image rows
        assert batch[CAM0].shape[1:] == (3, 3, *SIZE) and batch[CAM1].shape[1:] == (3, *SIZE)
        assert batch["observation.state"].shape[1:] == (1, 6)  # a single tabular delta is not squeezed
        for i in range(len(batch["index"])):
            ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
            seen.append((ep, f))
            query = [f + round(d * FPS) for d in DELTAS[CAM0]]
            rows = [min(max(q, 0), LENGTHS[ep] - 1) for q in query]
            window = batch[CAM0][i].permute(0, 2, 3, 1).numpy()
            np.testing.assert_array_equal(window, np.stack([_frame(ep, r, 0) for r in rows]))
            assert batch[f"{CAM0}_is_pad"][i].tolist() == [not 0 <= q < LENGTHS[ep] for q in query]
            np.testing.assert_array_equal(batch[CAM1][i].permute(1, 2, 0).numpy(), _frame(ep, f, 1))
            np.testing.assert_array_equal(batch["observation.state"][i, 0].numpy(), expected_state(ep, f, 6))
    assert seen == [(e, f) for e, n in enumerate(LENGTHS) for f in range(n)]


def test_a_one_step_window_of_an_image_camera_keeps_its_window_axis(make_ds) -> None:
    """An image camera's rows are tabular in LeRobot (stacked per delta, not squeezed): a window of the one step
    ``[0.0]`` is (B, 1, C, H, W), like ``observation.state``'s, while a camera without deltas is (B, C, H, W)."""
    it = DALILeRobotIterator(
        _images_dataset(make_ds), batch_size=4, delta_timestamps={CAM0: [0.0]}, shuffle=False, device="cpu",
        num_workers=0, drop_last=False, return_uint8=True,
    )  # fmt: skip
    batch = next(iter(it))
    it.close()
    assert batch[CAM0].shape == (4, 1, 3, *SIZE) and batch[CAM1].shape == (4, 3, *SIZE)
    assert batch[f"{CAM0}_is_pad"].tolist() == [[False]] * 4
    for i in range(4):
        ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
        np.testing.assert_array_equal(batch[CAM0][i, 0].permute(1, 2, 0).numpy(), _frame(ep, f, 0))


def test_shuffled_workers_cover_every_frame_once_and_augment(make_ds) -> None:
    augment = AugmentConfig(color_jitter=ColorJitter(brightness=0.3))  # one draw stream per image camera
    it = DALILeRobotIterator(
        _images_dataset(make_ds), batch_size=3, shuffle=True, seed=2, episode_pool_size=2, device="cpu",
        num_workers=2, drop_last=False, image_size=(32, 48), augment=augment,
    )  # fmt: skip
    keys = []
    for batch in it:
        assert batch[CAM0].shape[1:] == (3, 32, 48) and batch[CAM0].dtype == torch.float32
        assert float(batch[CAM0].min()) >= 0.0 and float(batch[CAM0].max()) <= 1.0
        keys += [(int(e), int(f)) for e, f in zip(batch["episode_index"], batch["frame_index"], strict=True)]
    it.close()
    assert Counter(keys) == Counter((e, f) for e, n in enumerate(LENGTHS) for f in range(n))
    assert keys != sorted(keys)


def _rewrite_image(root: Path, row: int, value: dict | None, file: str = "file-000") -> Path:
    path = root / f"data/chunk-000/{file}.parquet"
    table = pq.read_table(path)
    images = table[CAM0].to_pylist()
    images[row] = value
    column = pa.array(images, type=table.schema.field(CAM0).type)
    pq.write_table(table.set_column(table.schema.get_field_index(CAM0), CAM0, column), path)
    return path


def _noise_png() -> bytes:
    """A PNG of 64 x 96 RGB noise (its image data in one IDAT chunk)."""
    out = BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def _png_with_a_short_idat() -> bytes:
    """A PNG whose IDAT chunk says half its length: the next chunk header is read from inside the image data."""
    raw = bytearray(_noise_png())
    at = raw.index(b"IDAT") - 4
    raw[at : at + 4] = (int.from_bytes(raw[at : at + 4], "big") // 2).to_bytes(4, "big")
    return bytes(raw)


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (
            {"bytes": b"\x89PNG not really", "path": None},
            r"episode 0, camera observation\.images\.cam0\): the image of the episode's row 2 ",
        ),
        (None, r"row 2 has no image bytes for 'observation\.images\.cam0'"),
        # Pillow raises SyntaxError ("broken PNG file") for a chunk read from inside another: a builtin came through
        # (found by tests/test_damaged_files.py at seed 9266: one byte zeroed in a data file).
        (
            {"bytes": _png_with_a_short_idat(), "path": None},
            r"the image of the episode's row 2 cannot be decoded \(broken PNG",
        ),
    ],
    ids=["corrupt", "missing", "broken-chunk"],
)
def test_bad_images_name_the_file_episode_and_row(make_ds, copy_ds, value: dict | None, pattern: str) -> None:
    root = copy_ds(_images_dataset(make_ds))
    path = _rewrite_image(root, 2, value)
    with pytest.raises(DataFileError, match=pattern) as info:  # a missing image of episode 0 fails at construction
        it = DALILeRobotIterator(root, batch_size=5, shuffle=False, device="cpu", num_workers=0, cameras=[CAM0])
        next(iter(it))
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda png: png[: len(png) // 2], "image file is truncated"),  # (an OSError, as its pixels are read)
        (lambda png: png[:11] + b"\0" + png[12:], "Truncated IHDR chunk"),  # (a ValueError: a header of length 0)
    ],
    ids=["cut-short", "empty-header"],
)
def test_an_image_pillow_fails_on_in_another_way_is_named_by_its_row(damage, why: str) -> None:
    """Pillow fails on a damaged image with one of several errors: a PNG cut short, or whose header chunk says it is
    empty, is named by its row and said to be corrupt as the others are, not left to come through as Pillow's own."""
    pattern = rf"^cam: the image of the episode's row 7 cannot be decoded \({why}\); the data file is corrupt: "
    with pytest.raises(DataFileError, match=pattern):
        decode_images([damage(_noise_png())], label="cam", rows=[7])


def test_a_missing_image_is_named_by_its_row_in_the_file() -> None:
    """The row named is the file's, ``row_start`` on from the column's first: the third of rows from 10 is row 12."""
    from lerobot_dali.episode_rows import image_bytes

    column = pa.array([{"bytes": b"a", "path": None}, {"bytes": b"b", "path": None}, None])
    assert image_bytes(column[:2], path="f.parquet", key=CAM0, row_start=10).to_pylist() == [b"a", b"b"]
    with pytest.raises(DataFileError, match=r"^f\.parquet: row 12 has no image bytes for 'observation\.images\.cam0'"):
        image_bytes(column, path="f.parquet", key=CAM0, row_start=10)


def test_a_missing_image_of_an_episode_read_is_named_by_its_row_in_the_file(make_ds, copy_ds) -> None:
    """Read through the reader, the row named is the file's, not the episode's: episode 3 starts at row 7 of its
    v3.0 file (after episode 2's 7 rows), so its second row's missing image is the file's row 8."""
    root = copy_ds(_images_dataset(make_ds))
    path = open_dataset(root).data_path(3)
    table = pq.read_table(path)
    images = table[CAM0].to_pylist()
    images[8] = None
    pq.write_table(table.set_column(table.schema.get_field_index(CAM0), CAM0, pa.array(images)), path)
    reader = open_dataset(root)
    assert int(reader.episodes.data_row_start[3]) == 7
    with pytest.raises(DataFileError, match=rf": row 8 has no image bytes for '{re.escape(CAM0)}'"):
        reader.read_episode_images(3, CAM0)


def test_an_image_column_of_file_paths_says_what_to_do(make_ds, copy_ds) -> None:
    """Images stored as paths (a datasets.Image written without its bytes embedded, as plain strings) named the
    column's type only."""
    root = copy_ds(_images_dataset(make_ds))
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        paths = pa.array([f"images/{i:06d}.png" for i in range(len(table))])
        pq.write_table(table.set_column(table.schema.get_field_index(CAM0), CAM0, paths), path)
    advice = (
        r"is declared an image but holds string; .*: rewrite the data files with the encoded images in the column "
        rf".*, or leave out camera '{re.escape(CAM0)}' with cameras=\[\.\.\.\] \(on the command line: --cameras"
    )
    with pytest.raises(SchemaMismatchError, match=advice):
        next(iter(DALILeRobotIterator(root, batch_size=5, shuffle=False, device="cpu", num_workers=0)))
    # As told: the other camera reads.
    it = DALILeRobotIterator(root, batch_size=1, shuffle=False, device="cpu", num_workers=0, cameras=[CAM1])
    try:
        assert sum(len(batch["index"]) for batch in it) == sum(LENGTHS)
    finally:
        it.close()


def test_images_of_a_data_file_cut_short_say_what_to_do(make_ds, copy_ds, monkeypatch) -> None:
    """Past the data files checked at open, an episode's images read from a file lacking its rows named the fault
    only."""
    from lerobot_dali import episode_data_files

    monkeypatch.setattr(episode_data_files, "CHECKED_FILES", 1)
    root = copy_ds(_images_dataset(make_ds, "v2.1"))
    path = root / "data/chunk-000/episode_000002.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 3), path)
    reader = open_dataset(root)
    advice = (
        r"places rows \[0, 7\) in this file but it has 3 rows; the data file and meta/episodes disagree .*: download "
        r"the dataset again, or leave out the episodes it places there \(episodes=\[\.\.\.\] of the others\)"
    )
    with pytest.raises(SchemaMismatchError, match=advice):
        reader.read_episode_images(2, CAM0)
    assert len(reader.read_episode_images(3, CAM0)) == LENGTHS[3]


def test_an_undecodable_image_is_named_by_its_file_episode_and_row(make_ds, copy_ds) -> None:
    """The error said 'image 0 of the window' (the image's place in the failing sample's window; in the check
    command's, in its chunk of 64), with Pillow's '<_io.BytesIO object at 0x...>' for the file; and the first image,
    decoded when the iterator is built, named the dataset folder but no data file: nothing led to the row."""
    root = copy_ds(_images_dataset(make_ds))
    path = _rewrite_image(root, 5, {"bytes": b"junk", "path": None}, file="file-001")  # episode 2's row 5
    pattern = (
        rf"{re.escape(str(path))} \(episode 2, camera {CAM0}\): the image of the episode's row 5 cannot be decoded "
        r"\(no format Pillow reads; its bytes begin b'junk'\); the data file is corrupt: download or copy it again, or "
        r"leave out its episode \(episodes=\[\.\.\.\] of the others\) or the camera \(cameras=\[\.\.\.\] .*\); "
        r"`lerobot-dali check --decode` lists every such image"
    )
    for episodes in (None, [1, 2]):  # (selected: episode 2 is the reader's second, still named episode 2)
        it = DALILeRobotIterator(
            root, batch_size=4, shuffle=False, device="cpu", num_workers=0, cameras=[CAM0], drop_last=False,
            delta_timestamps={CAM0: [-0.1, 0.0]}, episodes=episodes,
        )  # fmt: skip
        with pytest.raises(DataFileError, match=pattern):
            list(it)
        it.close()
    problems = check_dataset(open_dataset(root, cameras=[CAM0]), workers=0, decode=True).problems
    assert [p.episode_index for p in problems] == [2] and re.search(pattern, problems[0].message), problems
    first = _rewrite_image(root, 0, {"bytes": b"junk", "path": None})
    with pytest.raises(DataFileError, match=rf"{re.escape(str(first))} \(episode 0, camera {CAM0}\): the image of "):
        DALILeRobotIterator(root, device="cpu", num_workers=0, cameras=[CAM0])


@pytest.mark.parametrize(
    ("picture", "found"),
    [
        (np.zeros((80, 96, 3), np.uint8), r"80x96 \(HxW\) with 3 channel"),
        (np.zeros(SIZE, np.uint8), r"64x96 \(HxW\) with 1 channel"),
    ],
    ids=["other-size", "grey"],
)
@pytest.mark.parametrize("image_size", [None, (32, 48)])
def test_an_image_unlike_the_cameras_first_names_its_episode(make_ds, copy_ds, picture, found, image_size) -> None:
    """One image of another size or channel count crashed in DALI's batch ('must have uniform shape', naming no
    file), came out resized without a word (image_size), or changed the batch's shape (every image of an
    episode); every image is now held to the camera's first."""
    root = copy_ds(_images_dataset(make_ds))
    out = BytesIO()
    Image.fromarray(picture).save(out, format="PNG")
    path = _rewrite_image(root, 5, {"bytes": out.getvalue(), "path": None})  # episode 1's only image
    it = DALILeRobotIterator(
        root, batch_size=5, shuffle=False, device="cpu", num_workers=0, cameras=[CAM0], image_size=image_size
    )
    pattern = rf"{path}.*episode 1, camera {CAM0}\): images are {found}.*but the camera's first image is 64x96"
    with pytest.raises(DataFileError, match=pattern):
        list(it)
    it.close()


def test_declared_image_column_missing_from_the_data(make_ds, copy_ds) -> None:
    root = copy_ds(_images_dataset(make_ds))
    path = root / "data/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(path).drop_columns([CAM1]), path)
    reader = open_dataset(root)
    with pytest.raises(
        SchemaMismatchError, match=r"file-000\.parquet: declared feature\(s\) \['observation\.images\.cam1'\]"
    ):
        reader.check_data_columns()  # (as the iterator is built: from the footers the open read)
    pattern = r"\['observation\.images\.cam1'\] have no column.*leave out camera\(s\) \['observation\.images\.cam1'\] "
    pattern += r"with cameras=\[\.\.\.\] \(on the command line: --cameras KEY \.\.\.\)"
    with pytest.raises(SchemaMismatchError, match=pattern):
        reader.read_episode_images(0, CAM1)


def test_decode_images_rejects_mixed_sizes_and_keeps_rgb() -> None:
    def png(array: np.ndarray, mode: str) -> bytes:
        out = BytesIO()
        Image.fromarray(array).convert(mode).save(out, format="PNG")
        return out.getvalue()

    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    frames = decode_images([png(rgb, "RGB"), png(rgb, "RGB")], label="cam")
    np.testing.assert_array_equal(frames, np.stack([rgb, rgb]))
    grey = decode_images([png(rgb[..., 0], "L"), png(rgb[..., 0], "L")], label="cam")  # one channel, as ToTensor
    np.testing.assert_array_equal(grey, np.stack([rgb[..., :1], rgb[..., :1]]))
    with pytest.raises(DataFileError, match=r"cam: the window's images differ in size"):
        decode_images([png(rgb, "RGB"), png(rgb[:2], "RGB")], label="cam")
    with pytest.raises(DataFileError, match=r"cam: the window's images differ in size or channels"):
        decode_images([png(rgb, "RGB"), png(rgb[..., 0], "L")], label="cam")
    depth = BytesIO()
    Image.fromarray(np.full((4, 6), 900, np.uint16)).save(depth, format="PNG")  # 16-bit: uint8 would clip it
    with pytest.raises(DataFileError, match=r"cam: image 0 of the window has more than 8 bits per sample"):
        decode_images([depth.getvalue()], label="cam")


#: Pixels of 2 x 3 images of each Pillow mode, as stored (uint8 but a 16-bit image's), encoded in the tests below.
_PIXELS = {
    "1": np.array([[0, 1, 1], [1, 0, 0]], bool),
    "L": np.array([[0, 7, 128], [200, 254, 255]], np.uint8),
    "RGB": np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]], [[1, 2, 3], [100, 150, 200], [255, 255, 255]]], np.uint8),
    "RGBA": np.array([[[255, 0, 0, 255], [0, 255, 0, 128], [0, 0, 255, 0]], [[1, 2, 3, 4]] * 3], np.uint8),
    "LA": np.array([[[10, 255], [20, 128], [30, 0]], [[40, 1], [50, 2], [60, 3]]], np.uint8),
    "P": np.array([[0, 1, 2], [2, 1, 0]], np.uint8),  # palette numbers of red, green, blue
    "I;16": np.array([[0, 1000, 40000], [65535, 2, 3]], np.uint16),
    "F": np.array([[0.5, 1000.25, -3.0], [1e6, 2.0, 3.0]], np.float32),
}


def _encoded(mode: str, fmt: str = "PNG") -> bytes:
    """A real ``fmt`` file of ``_PIXELS[mode]`` (CMYK: a JPEG of RGBA's four bands; PA: LA's two bands, with P's
    palette), as a writer would store it."""
    bands_of = {"CMYK": "RGBA", "PA": "LA"}.get(mode)
    image = Image.fromarray(_PIXELS[bands_of or mode], mode="P" if mode == "P" else None)
    if bands_of is not None:
        image = Image.frombytes(mode, image.size, image.tobytes())
    if mode in ("P", "PA"):
        image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255])
    out = BytesIO()
    image.save(out, format=fmt)
    assert Image.open(BytesIO(out.getvalue())).mode == mode
    return out.getvalue()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # LeRobot 0.4.4 (datasets' Image() decode, then hf_transform_to_torch's ToTensor) gives these, times 255:
        ("1", _PIXELS["1"][..., None] * np.uint8(255)),  # (0/1 samples; ToTensor multiplies them by 255)
        ("L", _PIXELS["L"][..., None]),
        ("RGB", _PIXELS["RGB"]),
    ],
)
def test_grey_and_rgb_images_decode_to_lerobots_values(mode: str, expected: np.ndarray) -> None:
    frames = decode_images([_encoded(mode)], label="cam")
    assert frames.dtype == np.uint8
    np.testing.assert_array_equal(frames[0], expected)


@pytest.mark.parametrize(
    ("mode", "fmt", "lerobot"),
    [
        # What LeRobot 0.4.4 returns for each (ToTensor of the image as stored), which no grey or RGB frame is; they
        # were read as RGB or grey (alpha dropped, a palette expanded, CMYK converted), values LeRobot gives none of:
        ("RGBA", "PNG", "4 channel(s) R/G/B/A (as stored)"),
        ("LA", "PNG", "2 channel(s) L/A (as stored)"),
        ("P", "PNG", "1 channel(s) P (palette numbers, not colours)"),
        ("PA", "TIFF", "2 channel(s) P/A (palette numbers, not colours)"),
        ("CMYK", "JPEG", "4 channel(s) C/M/Y/K (as stored)"),
    ],
)
def test_images_of_other_modes_are_refused_naming_the_mode_and_the_fix(mode: str, fmt: str, lerobot: str) -> None:
    with pytest.raises(DataFileError) as raised:
        decode_images([_encoded("RGB"), _encoded(mode, fmt)], label="data.parquet (episode 3, camera cam)", rows=[4, 5])
    message = str(raised.value)
    assert message.startswith(
        f"data.parquet (episode 3, camera cam): the image of the episode's row 5 has Pillow mode '{mode}': "
        f"LeRobot returns its {lerobot}, and this loader reads grey (L, 1) and RGB images only; re-encode the "
        "camera's images as RGB or L"
    )
    assert "cameras=[...]" in message


@pytest.mark.parametrize(("mode", "fmt"), [("I;16", "PNG"), ("F", "TIFF")])
def test_images_of_more_than_8_bits_are_refused_as_depth_maps_not_flagged(mode: str, fmt: str) -> None:
    """A 16-bit or a float image (a depth map not flagged is_depth_map) would lose its precision as uint8: refused
    naming its mode and the flag, not told to re-encode as RGB."""
    with pytest.raises(DataFileError) as raised:
        decode_images([_encoded(mode, fmt)], label="cam", rows=[3])
    assert str(raised.value).startswith(
        f"cam: the image of the episode's row 3 has more than 8 bits per sample (Pillow mode '{mode}', e.g. a depth "
        "map not flagged is_depth_map in info.json), which would lose its precision as a colour camera; flag it "
        "is_depth_map or leave the camera out with cameras=[...]"
    )


def test_one_bit_and_palette_depth_images_read_as_lerobot() -> None:
    """A depth map's 8-bit samples divided by 255, as ToTensor: a 1-bit image's 0/1 stayed 0/1 (ToTensor multiplies
    them by 255 first), where 1/255 was read; a palette image's numbers / 255, its 16-bit samples as stored."""
    from lerobot_dali.image_frames import decode_depth_images

    read = {mode: decode_depth_images([_encoded(mode)], label="cam")[0, ..., 0] for mode in ("1", "P", "L", "I;16")}
    np.testing.assert_array_equal(read["1"], _PIXELS["1"].astype(np.float32))
    np.testing.assert_allclose(read["P"], _PIXELS["P"] / np.float32(255))
    np.testing.assert_allclose(read["L"], _PIXELS["L"] / np.float32(255))
    np.testing.assert_array_equal(read["I;16"], _PIXELS["I;16"].astype(np.float32))


def _to_mode(root: Path, camera: str, mode: str) -> None:
    """Rewrite ``camera``'s PNGs in ``mode`` (grey "L", "RGBA", or 16-bit "I;16")."""
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        rows = table[camera].to_pylist()
        for row in rows:
            opened = Image.open(BytesIO(row["bytes"]))
            grey = np.asarray(opened.convert("L"))
            out = BytesIO()
            if mode == "RGBA":
                opened.convert("RGBA").save(out, format="PNG")
            else:
                Image.fromarray(grey if mode == "L" else grey.astype(np.uint16) * 257).save(out, format="PNG")
            row["bytes"] = out.getvalue()
        column = pa.array(rows, type=table.schema.field(camera).type)
        pq.write_table(table.set_column(table.schema.get_field_index(camera), camera, column), path)


def test_grey_image_cameras_come_as_one_channel_and_jitter_in_brightness(make_ds, copy_ds) -> None:
    """As LeRobot's ToTensor: (B, 1, H, W) grey; colour jitter applies brightness/contrast to it (saturation and
    hue leave grey alone, as torchvision's do), and a 3-value Normalize for it is refused at construction."""
    root = copy_ds(_images_dataset(make_ds))
    _to_mode(root, CAM0, "L")
    plain = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0)
    batch = next(iter(plain))
    assert batch[CAM0].shape == (4, 1, *SIZE) and batch[CAM1].shape == (4, 3, *SIZE)
    expected = [np.asarray(Image.fromarray(_frame(0, f, 0)).convert("L")) for f in range(4)]
    np.testing.assert_array_equal((batch[CAM0][:, 0].numpy() * 255).round(), np.stack(expected))
    jitter = AugmentConfig(color_jitter=ColorJitter(brightness=(1.5, 1.5), saturation=0.5, hue=0.2))
    bright = next(
        iter(DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0, augment=jitter))
    )
    np.testing.assert_allclose(bright[CAM0][:, 0].numpy() * 255, np.minimum(np.stack(expected) * 1.5, 255), atol=1.01)
    with pytest.raises(ValueError, match=r"camera 'observation\.images\.cam0' has 1 channel\(s\) but its Normalize"):
        DALILeRobotIterator(
            root, device="cpu", augment=AugmentConfig(normalize=Normalize(mean=[0.5] * 3, std=[0.2] * 3))
        )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_images_tagged_with_an_exif_orientation_come_upright_as_in_lerobot(make_ds, copy_ds, fmt: str) -> None:
    """LeRobot's image features (datasets.Image) turn an image as its EXIF orientation says; here a frame stored on
    its side and tagged 'rotate 90 clockwise to show' came on its side, 96x64 where the camera's frames are 64x96."""
    root = copy_ds(_images_dataset(make_ds))
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        rows = table[CAM0].to_pylist()
        for row in rows:
            frame = Image.open(BytesIO(row["bytes"]))
            exif = Image.Exif()
            exif[0x0112] = 6  # Orientation: the stored picture is turned 90 degrees counter-clockwise
            out = BytesIO()
            frame.transpose(Image.Transpose.ROTATE_90).save(out, format=fmt, exif=exif, quality=95)
            row["bytes"] = out.getvalue()
        column = pa.array(rows, type=table.schema.field(CAM0).type)
        pq.write_table(table.set_column(table.schema.get_field_index(CAM0), CAM0, column), path)
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0, cameras=[CAM0])
    batch = next(iter(it))
    it.close()
    assert batch[CAM0].shape == (4, 3, *SIZE)
    got = (batch[CAM0].numpy().transpose(0, 2, 3, 1) * 255).round()
    expected = np.stack([_frame(0, f, 0) for f in range(4)]).astype(np.float32)
    assert np.abs(got - expected).max() <= (0 if fmt == "PNG" else 64) and np.abs(got - expected).mean() < 3


def test_a_16_bit_image_camera_fails_at_construction(make_ds, copy_ds) -> None:
    root = copy_ds(_images_dataset(make_ds))
    _to_mode(root, CAM1, "I;16")
    pattern = r"\(episode 0, camera observation\.images\.cam1\): the image of the episode's row 0 has more than 8 bits"
    with pytest.raises(DataFileError, match=pattern + ".*cameras="):
        DALILeRobotIterator(root, device="cpu", num_workers=0)
    it = DALILeRobotIterator(root, cameras=[CAM0], batch_size=2, device="cpu", num_workers=0)
    assert CAM1 not in next(iter(it))


def test_an_rgba_image_camera_fails_at_construction(make_ds, copy_ds) -> None:
    """Its alpha was dropped (3 channels) where LeRobot gives 4: refused, naming the camera, the mode and the fix."""
    root = copy_ds(_images_dataset(make_ds))
    _to_mode(root, CAM1, "RGBA")
    pattern = (
        r"\(episode 0, camera observation\.images\.cam1\): the image of the episode's row 0 has Pillow mode 'RGBA'"
    )
    with pytest.raises(DataFileError, match=pattern + ".*re-encode the camera's images as RGB.*cameras="):
        DALILeRobotIterator(root, device="cpu", num_workers=0)


def test_episode_image_cache_is_bounded_by_bytes(caplog: pytest.LogCaptureFixture) -> None:
    reads: list[tuple[int, str]] = []

    def read(pos: int, camera: str) -> pa.Array:
        reads.append((pos, camera))
        return pa.array([b"x" * 100] * (pos + 1), type=pa.binary())

    # episode p holds p + 1 images of 100 B: 104, 208, 312 bytes with the offsets
    cache = EpisodeImageCache(read, max_bytes=500)
    for pos in (0, 1, 0, 2):  # 0 and 1 kept; 0 hit; 2 evicts 1, the least recently used
        cache.get(pos, "cam")
    assert reads == [(0, "cam"), (1, "cam"), (2, "cam")] and cache.nbytes == 104 + 312
    cache.get(0, "cam")
    cache.get(1, "cam")
    assert reads[-1] == (1, "cam") and len(reads) == 4
    cache.get(9, "cam")  # 1 KB: larger than the bound, returned but not kept
    assert cache.nbytes <= 500
    cache.get(9, "cam")
    assert reads[-2:] == [(9, "cam"), (9, "cam")]
    exact = EpisodeImageCache(read, max_bytes=104)  # episode 0's 104 bytes: the bound reached, not passed, is kept
    exact.get(0, "cam")
    exact.get(0, "cam")
    assert reads[-2:] == [(9, "cam"), (0, "cam")] and exact.nbytes == 104
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.image_frames"):  # (entries in use not told: no
        EpisodeImageCache(read, max_bytes=0).get(0, "cam")  # pool to say that the bound cannot hold)
    assert caplog.records == []


def test_a_workers_image_cache_takes_its_budget_and_says_when_the_pool_does_not_fit(
    make_ds, caplog, monkeypatch, tmp_path: Path
) -> None:
    """CpuDecodeOptions(image_cache_bytes=...) bounds the workers' cache of encoded images; one that cannot hold
    the episode pool's images (pool x image cameras; a pool of 64 holds the dataset's 4 episodes) rereads episodes,
    and is said once with the bytes that would."""
    root = _images_dataset(make_ds, "v2.1")
    reader = open_dataset(root)
    entries = [(p, c) for p in range(len(LENGTHS)) for c in (CAM0, CAM1)]
    need = sum(reader.read_episode_images(p, c).nbytes for p, c in entries)
    reads: list[tuple[int, str]] = []
    plain = LeRobotDatasetReader.read_episode_images

    def counted(self, episode_pos, key, **kwargs):
        reads.append((episode_pos, key))
        return plain(self, episode_pos, key, **kwargs)

    it = DALILeRobotIterator(
        root, batch_size=4, delta_timestamps=DELTAS, seed=1, episode_pool_size=64, device="cpu",
        num_workers=0, drop_last=False, return_uint8=True, cpu_decode=CpuDecodeOptions(image_cache_bytes=need),
    )  # fmt: skip
    next(iter(it))
    spec = it._spec
    it.close()
    monkeypatch.setattr(LeRobotDatasetReader, "read_episode_images", counted)
    epoch = [SimpleNamespace(epoch_idx=0, iteration=i) for i in range(5)]  # 17 samples in batches of 4
    outputs, said = {}, {}
    for budget in (need, need - 1, 0):
        reads.clear()
        caplog.clear()
        monkeypatch.setattr(said_once, "_said", set())  # (each budget a job of its own: said once by its key)
        monkeypatch.setenv(said_once.SAID_ENV, str(tmp_path / f"said-{budget}"))
        (tmp_path / f"said-{budget}").mkdir()
        source = BatchSource(replace(spec, cpu_decode=CpuDecodeOptions(image_cache_bytes=budget)))
        with caplog.at_level(logging.WARNING, logger="lerobot_dali.image_frames"):
            outputs[budget] = [source(info) for info in epoch]
        said[budget] = [r.getMessage() for r in caplog.records if "image_cache_bytes" in r.getMessage()]
        counts = Counter(reads)
        if budget == need:  # the pool's 8 (episode, camera) pairs, each read once
            assert sorted(counts) == entries and set(counts.values()) == {1} and said[budget] == []
        else:
            assert len(reads) > len(entries) and len(said[budget]) == 1
            assert "draw from up to 8 episodes' images (episode pool x image cameras)" in said[budget][0]
            assert f"image_cache_bytes={budget} keeps fewer" in said[budget][0]
            held = int(re.search(r"about (\d+) per worker holds them all", said[budget][0]).group(1))
            assert need // 2 <= held <= 2 * need  # 8 entries of their mean size, not 64 x 2
    assert len(reads) == 2 * sum(LENGTHS)  # nothing kept: every sample reads both cameras' images
    for budget in (need - 1, 0):  # the same samples, whatever is kept
        for batch, same in zip(outputs[need], outputs[budget], strict=True):
            for got, want in zip(batch, same, strict=True):
                np.testing.assert_array_equal(np.stack(got), np.stack(want))
    assert CpuDecodeOptions().image_cache_bytes == 256 * 2**20
    with pytest.raises(ValueError, match="image_cache_bytes must be an int >= 0, got -1"):
        CpuDecodeOptions(image_cache_bytes=-1)


def test_image_dataset_over_a_remote_matches_local(make_ds) -> None:
    from tests.test_iterator import _samples
    from tests.test_remote import _assert_samples_equal  # also registers fakeremote://

    root = _images_dataset(make_ds)
    options = dict(batch_size=4, delta_timestamps=DELTAS, shuffle=True, seed=4, device="cpu", num_workers=0,
                   drop_last=False, return_uint8=True)  # fmt: skip
    local = _samples(DALILeRobotIterator(root, **options))
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    it = DALILeRobotIterator(reader, cache_gb=1.0, **options)
    remote = _samples(it)
    it.close()
    assert len(remote) == sum(LENGTHS)
    _assert_samples_equal(local, remote)


def test_video_and_image_cameras_in_one_dataset(make_ds, copy_ds) -> None:
    # A video dataset plus a wrist camera stored as PNG rows (marker camera 2), declared as LeRobot does.
    import json

    from lerobot_dali.generate import IMAGE_TYPE
    from tests.test_iterator import LENGTHS as VIDEO_LENGTHS
    from tests.test_iterator import _dataset

    root = copy_ds(_dataset(make_ds, "h264"))
    wrist = "observation.images.wrist"
    info = json.loads((root / "meta/info.json").read_text())
    height, width = info["features"][CAM0]["shape"][:2]
    info["features"][wrist] = {"dtype": "image", "shape": [height, width, 3], "names": ["height", "width", "channel"]}
    (root / "meta/info.json").write_text(json.dumps(info))
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        encoded = []
        for ep, f in zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True):
            out = BytesIO()
            Image.fromarray(draw_marker(ep, f, height, width, 2)).save(out, format="PNG")
            encoded.append({"bytes": out.getvalue(), "path": None})
        pq.write_table(table.append_column(wrist, pa.array(encoded, type=IMAGE_TYPE)), path)

    augment = AugmentConfig(color_jitter=ColorJitter(brightness=0.3))  # a draw stream per camera, three in all
    it = DALILeRobotIterator(
        root, batch_size=6, delta_timestamps={wrist: [-0.1, 0.0]}, shuffle=False, device="cpu", num_workers=0,
        drop_last=False, return_uint8=True,
    )  # fmt: skip
    assert it.reader.camera_keys == [CAM0, CAM1] and it.reader.image_keys == [wrist]
    samples = 0
    for batch in it:
        assert batch[CAM0].shape[1:] == (3, height, width) and batch[wrist].shape[1:] == (2, 3, height, width)
        for i in range(len(batch["index"])):
            ep, f = int(batch["episode_index"][i]), int(batch["frame_index"][i])
            rows = [max(f - 1, 0), f]
            np.testing.assert_array_equal(
                batch[wrist][i].permute(0, 2, 3, 1).numpy(),
                np.stack([draw_marker(ep, r, height, width, 2) for r in rows]),
            )
            assert tuple(read_full_marker(batch[CAM1][i].permute(1, 2, 0).numpy())) == (ep, f, 1)
            samples += 1
    assert samples == sum(VIDEO_LENGTHS)
    augmented = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, augment=augment)
    assert next(iter(augmented))[wrist].shape == (4, 3, height, width)


def test_image_cameras_of_an_odd_size_are_written_and_read_exactly(make_ds) -> None:
    """An odd height or width was refused for image cameras as for yuv420p video, which PNG is not."""
    from lerobot_dali.generate import DatasetSpec

    with pytest.raises(ValueError, match=r"size\[0\] \(height\) must be even for yuv420p video, got 65"):
        DatasetSpec(episodes=1, frames_per_episode=2, size=(65, 67))
    root = make_ds(episodes=2, frames_per_episode=[3, 2], cameras=1, size=(65, 67), fps=FPS, image_cameras=True)
    it = DALILeRobotIterator(root, batch_size=5, shuffle=False, device="cpu", num_workers=0, return_uint8=True)
    (batch,) = list(it)
    got = batch[CAM0].permute(0, 2, 3, 1).numpy()
    want = [draw_marker(e, f, 65, 67, 0) for e, f in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]]
    np.testing.assert_array_equal(got, np.stack(want))
