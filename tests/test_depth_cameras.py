"""Depth-map video cameras (LeRobot's ``is_depth_map``: 12-bit codes in lossless HEVC ``gray12le``) read back as
depth: every sample's window against the codes written, dequantised by an independent float64 formula."""

from __future__ import annotations

import io
import json
import math
import re
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dali.augment import AugmentConfig, ColorJitter, Normalize
from lerobot_dali.dataset_info import Feature
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.depth_maps import DepthQuantizer, DepthUnit, in_unit
from lerobot_dali.errors import DatasetError
from lerobot_dali.iterator import DALILeRobotIterator

DEPTH = "observation.depth.front"
CAM = "observation.images.cam0"
FPS = 10
LENGTHS = [6, 4, 7, 5]
QUANTIZER = {"video.depth_min": 0.2, "video.depth_max": 5.0, "video.shift": 1.0, "video.use_log": True}


def _codes(episode: int, frame: int, height: int, width: int) -> np.ndarray:
    """The 12-bit codes written for one frame: every code differs from its neighbours, and from other frames."""
    y, x = np.mgrid[0:height, 0:width]
    return ((episode * 997 + frame * 131 + y * 29 + x * 7) % 4096).astype(np.uint16)


def _expected_depth(codes: np.ndarray, unit: str, q: dict = QUANTIZER) -> np.ndarray:
    """LeRobot's dequantisation written out in float64 (depth_utils.dequantize_depth)."""
    low, high = math.log(q["video.depth_min"] + q["video.shift"]), math.log(q["video.depth_max"] + q["video.shift"])
    metres = np.exp(codes.astype(np.float64) * (high - low) / 4095 + low) - q["video.shift"]
    metres = np.clip(metres, q["video.depth_min"], q["video.depth_max"])
    return metres if unit == "m" else np.clip(np.rint(metres * 1000), 0, 65535)


def _encode_depth(path: Path, frames: list[np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4") as container:
        options = {"x265-params": "lossless=1:keyint=4:log-level=none"}
        stream = container.add_stream("libx265", rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "gray12le"
        stream.codec_context.time_base = Fraction(1, FPS)
        for i, codes in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(codes, format="gray12le")
            frame.pts, frame.time_base = i, Fraction(1, FPS)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


@pytest.fixture(scope="module")
def depth_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated v3.0 dataset (one colour camera, two episodes per video file) given a depth camera laid out as
    LeRobot lays one out: the colour camera's file and seconds per episode, 12-bit codes, flagged in info.json."""
    from lerobot_dali.generate import make_dataset

    root = make_dataset(
        tmp_path_factory.mktemp("depth") / "ds", episodes=len(LENGTHS), frames_per_episode=LENGTHS, cameras=1,
        size=(64, 96), fps=FPS, codec="vp9", gop=2, episodes_per_file=2,
    )  # fmt: skip
    height, width = 48, 80  # a size of its own: the depth camera is not the colour camera
    episodes_path = next((root / "meta/episodes").rglob("*.parquet"))
    episodes = pq.read_table(episodes_path)
    rows = episodes.to_pylist()
    for file_index in sorted({r[f"videos/{CAM}/file_index"] for r in rows}):
        in_file = sorted((r for r in rows if r[f"videos/{CAM}/file_index"] == file_index),
                         key=lambda r: r[f"videos/{CAM}/from_timestamp"])  # fmt: skip
        frames = [_codes(r["episode_index"], i, height, width) for r in in_file for i in range(r["length"])]
        _encode_depth(root / f"videos/{DEPTH}/chunk-000/file-{file_index:03d}.mp4", frames)
    for part in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
        episodes = episodes.append_column(f"videos/{DEPTH}/{part}", episodes[f"videos/{CAM}/{part}"])
    pq.write_table(episodes, episodes_path)
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    video = {"video.height": height, "video.width": width, "video.codec": "hevc", "video.pix_fmt": "gray12le",
             "video.fps": FPS, "video.channels": 1, "is_depth_map": True, **QUANTIZER}  # fmt: skip
    info["features"][DEPTH] = {"dtype": "video", "shape": [height, width, 1], "names": ["height", "width", "channels"],
                               "info": video}  # fmt: skip
    info_path.write_text(json.dumps(info, indent=2))
    return root


def _samples(root: Path, **kwargs) -> list[dict]:
    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", drop_last=False, **kwargs)
    try:
        out = []
        for batch in it:
            for i in range(len(batch["index"])):
                out.append({k: v[i] for k, v in batch.items()})
        return out
    finally:
        it.close()


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_a_depth_camera_reads_as_lerobots_depth_in_every_window(depth_ds: Path, unit: str) -> None:
    deltas = [-2 / FPS, -1 / FPS, 0.0, 1 / FPS]  # reaches over both ends of every episode: padded rows
    samples = _samples(depth_ds, num_workers=2, delta_timestamps={DEPTH: deltas}, depth_unit=unit)
    assert len(samples) == sum(LENGTHS)
    for s in samples:
        episode, frame = int(s["episode_index"]), int(s["frame_index"])
        depth = s[DEPTH].numpy()
        assert depth.shape == (4, 1, 48, 80) and depth.dtype == np.float32
        wanted = frame + np.array([-2, -1, 0, 1])
        rows = np.clip(wanted, 0, LENGTHS[episode] - 1)  # padding repeats the episode's first/last frame
        np.testing.assert_array_equal(s[f"{DEPTH}_is_pad"].numpy(), wanted != rows)
        expected = np.stack([_expected_depth(_codes(episode, int(r), 48, 80), unit) for r in rows])[:, None]
        if unit == "mm":  # whole millimetres; float32 arithmetic may round a x.5 the other way
            diff = np.abs(depth - expected)
            assert diff.max() <= 1 and np.mean(diff == 0) > 0.999, (episode, frame)
        else:
            np.testing.assert_allclose(depth, expected, rtol=2e-6)


def test_depth_is_resized_by_nearest_neighbour_and_never_augmented(depth_ds: Path) -> None:
    augment = AugmentConfig(color_jitter=ColorJitter(brightness=0.5, contrast=0.5), normalize="stats")
    samples = _samples(depth_ds, num_workers=0, image_size=(24, 40), augment=augment)
    for s in samples[:6]:
        depth, colour = s[DEPTH].numpy(), s[CAM].numpy()
        assert depth.shape == (1, 24, 40) and colour.shape == (3, 24, 40)
        expected = _expected_depth(_codes(int(s["episode_index"]), int(s["frame_index"]), 48, 80), "mm")
        # a 2x nearest-neighbour shrink samples pixel centres (2j + 1): source depths, no jitter, no stats
        assert np.abs(depth[0] - expected[1::2, 1::2]).max() <= 1


def test_a_normalize_given_for_a_depth_camera_is_refused(depth_ds: Path, depth_image_ds: Path) -> None:
    """Depth is never normalised, so a Normalize given for a depth camera by name was dropped without a word: the
    batch held raw millimetres where the caller had asked for normalised depth."""
    colour = Normalize(mean=[0.5] * 3, std=[0.2] * 3)
    for root, depth in ((depth_ds, DEPTH), (depth_image_ds, DEPTH_IMAGE)):
        augment = AugmentConfig(normalize={CAM: colour, depth: Normalize(mean=[2000.0], std=[1000.0])})
        pattern = rf"normalize has a Normalize for depth camera\(s\) \['{re.escape(depth)}'\], which are never"
        with pytest.raises(ValueError, match=pattern):
            DALILeRobotIterator(root, device="cpu", num_workers=0, augment=augment)
    it = DALILeRobotIterator(
        depth_ds, batch_size=2, device="cpu", num_workers=0, augment=AugmentConfig(normalize={CAM: colour})
    )
    assert next(iter(it))[DEPTH].min() >= 200  # millimetres (depth_min 0.2 m), as before
    it.close()


def test_return_uint8_with_a_normalize_is_refused_only_where_a_colour_camera_is_read(depth_ds: Path) -> None:
    """A normalize leaves depth alone, so uint8 batches of depth cameras alone hold no normalised value."""
    augment = AugmentConfig(normalize=Normalize(mean=[0.5] * 3, std=[0.2] * 3))
    options = dict(batch_size=2, device="cpu", num_workers=0, return_uint8=True, augment=augment)
    with pytest.raises(ValueError, match="return_uint8=True cannot be combined with AugmentConfig.normalize"):
        DALILeRobotIterator(depth_ds, **options)
    it = DALILeRobotIterator(depth_ds, cameras=[DEPTH], **options)
    assert next(iter(it))[DEPTH].min() >= 200  # millimetres, not normalised
    it.close()


def test_depth_cameras_are_declared_as_lerobot_declares_them() -> None:
    raw = {"dtype": "video", "shape": [4, 4, 1], "info": {"video.codec": "hevc"}}
    assert Feature.from_json("d", raw).video.depth is None
    legacy = {**raw, "info": {"video.is_depth_map": True, "video.depth_max": 3}}
    assert Feature.from_json("d", legacy).video.depth == DepthQuantizer(depth_max=3.0)  # others: LeRobot's defaults
    v20 = {"dtype": "video", "shape": [4, 4, 1], "video_info": {"is_depth_map": True, "video.use_log": False}}
    assert Feature.from_json("d", v20).video.depth == DepthQuantizer(use_log=False)
    image = Feature.from_json("i", {"dtype": "image", "shape": [4, 4, 1], "info": {"is_depth_map": True}})
    assert image.is_depth_map and image.depth_unit is None  # no unit said: values as stored, as LeRobot
    with pytest.raises(
        DatasetError, match=r"depth image feature 'i' .* depth_unit 'cm'; set it to .*'m' or 'mm', in meta/info\.json"
    ):
        Feature.from_json(
            "i", {"dtype": "image", "shape": [4, 4, 1], "info": {"is_depth_map": True, "depth_unit": "cm"}}
        )
    with pytest.raises(DatasetError, match=r"video feature 'd' .*depth_max \(0\.1\) must exceed depth_min"):
        Feature.from_json("d", {**raw, "info": {"is_depth_map": True, "video.depth_max": 0.1, "video.depth_min": 1}})


@pytest.mark.parametrize(("flag", "depth"), [("false", False), ("False", False), ("true", True), (0, False), (1, True)])
def test_a_depth_flag_written_as_text_reads_as_what_it_says(flag, depth: bool) -> None:
    """Any non-empty string is truthy: "false" made a colour camera a depth map, read as one channel of 12-bit
    codes (found by a fuzz of the metadata's values)."""
    for info in ({"video.is_depth_map": flag}, {"is_depth_map": flag}):
        feature = Feature.from_json("d", {"dtype": "video", "shape": [4, 4, 3], "info": info})
        assert (feature.video.depth is not None) is depth, info
    assert DepthQuantizer.from_info({"video.use_log": flag}).use_log is depth  # (the quantiser's one flag too)


def test_a_bad_depth_unit_and_a_depth_camera_left_out(depth_ds: Path) -> None:
    with pytest.raises(ValueError, match="depth_unit must be one of 'mm', 'm'"):
        DALILeRobotIterator(depth_ds, device="cpu", depth_unit="cm")
    (sample,) = _samples(depth_ds, num_workers=0, cameras=[CAM])[:1]
    assert DEPTH not in sample and sample[CAM].shape == (3, 64, 96)
    assert open_dataset(depth_ds).info.depth_keys == [DEPTH]


def test_depth_codes_survive_the_remote_packet_path(depth_ds: Path) -> None:
    """Remote MP4s are decoded from ranged-read packets (``decode_packets(pixels="depth")``), not from the file."""
    from lerobot_dali.clips import plan_clip, read_packet_payloads
    from lerobot_dali.cpu_decode import CpuFrameDecoder
    from lerobot_dali.packet_index import build_packet_index

    path = depth_ds / f"videos/{DEPTH}/chunk-000/file-000.mp4"
    index = build_packet_index(path)
    wanted = np.array([LENGTHS[0] + 3, 1, 2])  # episode 1 frame 3 (B-frames around it), episode 0 frames 1, 2
    decoder = CpuFrameDecoder()
    plan = plan_clip(index, wanted)
    from_packets = decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan), pixels="depth")
    from_file = decoder.decode(path, index, wanted, pixels="depth")
    decoder.close()
    expected = np.stack([_codes(1, 3, 48, 80), _codes(0, 1, 48, 80), _codes(0, 2, 48, 80)])
    np.testing.assert_array_equal(from_packets, expected)
    np.testing.assert_array_equal(from_file, expected)


def test_diagnose_decodes_a_depth_camera_as_the_iterator_does(depth_ds: Path) -> None:
    from lerobot_dali.diagnose import MachineReport, diagnose_dataset

    machine = MachineReport(cuda_available=False, gpu_name=None, compute_capability=None, nvcuvid_library=None,
                            dali_version=None, cpu_decoders="PyAV")  # fmt: skip
    reports = {r.camera: r for r in diagnose_dataset(open_dataset(depth_ds), machine=machine)}
    depth = reports[DEPTH]
    assert (depth.codec, depth.resolution, depth.route) == ("hevc", (48, 80), "cpu_fallback (depth map)")
    assert list(depth.decodes) == ["cpu_fallback"] and depth.decodes["cpu_fallback"][0]
    assert reports[CAM].route == "dali_cpu" and set(reports[CAM].decodes) == {"cpu_fallback", "dali_cpu"}


def test_info_says_which_camera_is_a_depth_map(depth_ds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lerobot_dali.cli import main

    assert main(["info", str(depth_ds)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"  camera {DEPTH} (depth map): codec hevc 48x80") for line in lines), lines
    assert any(line.startswith(f"  camera {CAM}: codec vp9") for line in lines)


DEPTH_IMAGE = "observation.depth.wrist"


def _depth_image_values(episode: int, frame: int) -> np.ndarray:
    """The uint16 values stored for one depth image (millimetres in the dataset below)."""
    y, x = np.mgrid[0:32, 0:48]
    return (300 + episode * 1000 + frame * 50 + y * 7 + x).astype(np.uint16)


@pytest.fixture(scope="module")
def depth_image_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated dataset of PNG cameras given a depth camera stored as LeRobot stores depth images: 16-bit
    PNG rows in the data files, flagged ``is_depth_map`` with their ``depth_unit``."""
    from PIL import Image

    from lerobot_dali.generate import IMAGE_TYPE, make_dataset

    root = make_dataset(
        tmp_path_factory.mktemp("depth_images") / "ds", episodes=len(LENGTHS), frames_per_episode=LENGTHS,
        cameras=1, size=(64, 96), fps=FPS, episodes_per_file=2, image_cameras=True,
    )  # fmt: skip
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        encoded = []
        for episode, frame in zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True):
            buffer = io.BytesIO()
            Image.fromarray(_depth_image_values(episode, frame)).save(buffer, format="PNG")
            encoded.append({"bytes": buffer.getvalue(), "path": None})
        pq.write_table(table.append_column(DEPTH_IMAGE, pa.array(encoded, type=IMAGE_TYPE)), path)
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"][DEPTH_IMAGE] = {"dtype": "image", "shape": [32, 48, 1], "names": ["height", "width", "channels"],
                                     "info": {"is_depth_map": True, "depth_unit": "mm"}}  # fmt: skip
    info_path.write_text(json.dumps(info, indent=2))
    return root


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_a_depth_image_camera_reads_its_stored_depth_in_the_asked_unit(depth_image_ds: Path, unit: str) -> None:
    samples = _samples(depth_image_ds, num_workers=2, delta_timestamps={DEPTH_IMAGE: [-1 / FPS, 0.0]}, depth_unit=unit)
    assert len(samples) == sum(LENGTHS)
    for s in samples:
        episode, frame = int(s["episode_index"]), int(s["frame_index"])
        rows = np.clip(frame + np.array([-1, 0]), 0, LENGTHS[episode] - 1)
        expected = np.stack([_depth_image_values(episode, int(r)) for r in rows]).astype(np.float32)[:, None]
        if unit == "m":
            expected /= np.float32(1000)  # as LeRobot converts: float32 division
        depth = s[DEPTH_IMAGE].numpy()
        assert depth.dtype == np.float32 and depth.shape == (2, 1, 32, 48)
        np.testing.assert_array_equal(depth, expected)
        assert s[CAM].shape == (3, 64, 96)  # the colour image camera, no window: as LeRobot


def test_depth_stored_in_one_unit_reads_in_the_other_as_lerobot_converts() -> None:
    """Metres to millimetres by float32 multiplication, millimetres to metres by division, in place; a unit the
    dataset does not give leaves the values as stored (the image camera's case above reads millimetres only)."""
    stored = np.array([0.5, 1.25, 3e-4], np.float32)
    for given, unit, expected in (("m", "mm", stored * np.float32(1000)), ("mm", "m", stored / np.float32(1000))):
        depth = stored.copy()
        assert in_unit(depth, given, DepthUnit(unit)) is depth
        np.testing.assert_array_equal(depth, expected)
    for given, unit in (("m", "m"), ("mm", "mm"), (None, "m"), (None, "mm")):
        np.testing.assert_array_equal(in_unit(stored.copy(), given, DepthUnit(unit)), stored)


@pytest.mark.parametrize(
    "params",
    [{}, {"depth_min": 0.1, "depth_max": 5.0, "shift": 1.0}, {"use_log": False}, {"depth_max": 100.0}],
    ids=["default", "log", "linear", "past_uint16_mm"],  # (past 65.535 m, millimetres clamp to uint16's largest)
)
@pytest.mark.parametrize("unit", ["mm", "m"])
def test_every_code_dequantises_to_lerobots_value_to_the_bit(params: dict, unit: str) -> None:
    """LeRobot's DatasetReader dequantises torch tensors (depth_utils.dequantize_depth, its torch path, transcribed
    here); NumPy's float32 exp rounds otherwise (1,561 of 4,096 codes differed by an ulp in metres)."""

    q = DepthQuantizer(**params)
    codes = np.arange(4096, dtype=np.uint16).reshape(64, 64)
    if q.use_log:
        scale = (math.log(q.depth_max + q.shift) - math.log(q.depth_min + q.shift)) / 4095
        offset = math.log(q.depth_min + q.shift)
    else:
        scale, offset = (q.depth_max - q.depth_min) / 4095, q.depth_min
    buf = torch.from_numpy(codes).to(dtype=torch.float32, copy=True)
    buf.mul_(scale).add_(offset)
    if q.use_log:
        buf.exp_().sub_(q.shift)
    buf.clamp_(q.depth_min, q.depth_max)
    if unit == "mm":
        buf.mul_(1000.0).round_().clamp_(0.0, 65535)
    np.testing.assert_array_equal(q.dequantize(codes, DepthUnit(unit)), buf.numpy())


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"depth_min": 2.0, "depth_max": 2.0}, r"depth_max \(2\.0\) must exceed depth_min \(2\.0\)"),
        ({"depth_min": 3.0, "depth_max": 2.0}, r"depth_max \(2\.0\) must exceed depth_min \(3\.0\)"),
        ({"depth_min": 0.5, "shift": -0.5}, r"log quantisation needs depth_min \+ shift > 0, got 0\.5 \+ -0\.5"),
    ],
)
def test_a_quantiser_that_maps_no_depth_range_is_refused(params: dict, message: str) -> None:
    """Equal bounds dequantise every code to one depth, and a log quantiser with ``depth_min + shift <= 0`` takes
    the log of zero or less (NaN depths): both are refused."""
    with pytest.raises(ValueError, match=message):
        DepthQuantizer(**params)
    if "shift" in params:  # (a linear quantiser takes no log: the same shift is fine there)
        assert DepthQuantizer(**params, use_log=False).dequantize(np.array([0, 4095]), DepthUnit.M).tolist() == [
            0.5, 10.0,
        ]  # fmt: skip


def test_a_log_quantiser_whose_depth_min_and_shift_sum_below_1_is_valid_and_codes_are_left_as_given() -> None:
    """The log's argument need only be positive (log(0.1) < 0 is a depth like any other); the codes given, of any
    dtype, are read, never written (a float32 array went through torch without a copy)."""
    codes = np.array([0, 4095], np.float32)
    depth = DepthQuantizer(depth_min=0.5, shift=-0.4).dequantize(codes, DepthUnit.MM)
    assert depth.tolist() == [500.0, 10000.0] and codes.tolist() == [0.0, 4095.0]


def test_depth_images_decode_as_lerobot_reads_each_mode() -> None:
    """16-bit and float images as stored; 8-bit ones divided by 255, as LeRobot's ToTensor divides them."""
    from PIL import Image

    from lerobot_dali.image_frames import decode_depth_images

    values = np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000
    encoded = {}
    for name, image, fmt in [
        ("I;16", Image.fromarray(values), "PNG"),
        ("F", Image.fromarray(values.astype(np.float32) / 7), "TIFF"),
        ("L", Image.fromarray((values // 256).astype(np.uint8)), "PNG"),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        encoded[name] = buffer.getvalue()
    read = {name: decode_depth_images([data], label="cam")[0, ..., 0] for name, data in encoded.items()}
    np.testing.assert_array_equal(read["I;16"], values.astype(np.float32))
    np.testing.assert_array_equal(read["F"], values.astype(np.float32) / 7)
    np.testing.assert_array_equal(read["L"], (values // 256).astype(np.float32) / np.float32(255))
    for mode in ("RGB", "LA"):  # (several channels, a grey one among them or not)
        buffer = io.BytesIO()
        Image.new(mode, (4, 3)).save(buffer, format="PNG")
        with pytest.raises(DatasetError, match=rf"cam: depth image 0 of the window has Pillow mode '{mode}', not one "):
            decode_depth_images([buffer.getvalue()], label="cam")


def test_info_marks_a_depth_image_camera(depth_image_ds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lerobot_dali.cli import main

    assert main(["info", str(depth_image_ds)]) == 0
    assert f"  camera {DEPTH_IMAGE} (depth map): images in the data files" in capsys.readouterr().out
    assert main(["info", str(depth_image_ds), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth_image_cameras"] == [DEPTH_IMAGE]


def test_the_bench_peer_reads_depth_as_lerobot_and_lerobot_dali_do(depth_ds: Path, depth_image_ds: Path) -> None:
    """The PyAV DataLoader peer of ``bench`` decodes depth cameras as depth too, so 'vs peer' compares like work."""
    from lerobot_dali.bench_peers import PyAVFrameDataset

    peer = PyAVFrameDataset(depth_ds, delta_timestamps={DEPTH: [-1 / FPS, 0.0]}, image_size=(24, 40))
    item = peer[LENGTHS[0] + 2]  # episode 1, frame 2
    assert item[DEPTH].shape == (2, 1, 24, 40) and item[DEPTH].dtype == torch.float32
    full = np.stack([_expected_depth(_codes(1, f, 48, 80), "mm") for f in (1, 2)])
    assert np.abs(item[DEPTH].numpy()[:, 0] - full[:, 1::2, 1::2]).max() <= 1  # nearest, as lerobot-dali
    images = PyAVFrameDataset(depth_image_ds)[LENGTHS[0] + 2]
    np.testing.assert_array_equal(images[DEPTH_IMAGE].numpy(), _depth_image_values(1, 2)[None].astype(np.float32))


def test_a_worker_with_a_depth_camera_runs_torch_on_one_thread(depth_ds: Path, tmp_path: Path) -> None:
    """As DataLoader's workers do: each DALI worker's torch ops on all cores made two workers thrash on two cores
    (137 frames/s against 2,124 in bench). Unpickling the source is what happens in a worker process."""
    import pickle
    import subprocess
    import sys

    from lerobot_dali.batch_source import BatchSource

    it = DALILeRobotIterator(depth_ds, batch_size=2, device="cpu", num_workers=0)
    next(iter(it))
    it.close()
    pickled = tmp_path / "source.pkl"
    pickled.write_bytes(pickle.dumps(BatchSource(it._spec)))
    code = f"import pickle, torch; torch.set_num_threads(2); pickle.loads(open({str(pickled)!r}, 'rb').read()); "
    code += "print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "1"


def test_a_union_reads_depth_with_one_set_of_parameters(depth_ds: Path, tmp_path: Path) -> None:
    """A union dequantises every dataset's depth with its first dataset's parameters: others are refused."""
    import shutil

    from lerobot_dali import concat_datasets
    from lerobot_dali.errors import SchemaMismatchError

    other = tmp_path / "other"
    shutil.copytree(depth_ds, other)
    assert DEPTH in concat_datasets([depth_ds, other]).camera_keys
    info = json.loads((other / "meta/info.json").read_text())
    info["features"][DEPTH]["info"]["video.depth_max"] = 4.0
    (other / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SchemaMismatchError, match=r"differ in 'observation\.depth\.front'.*depth_max=5\.0.*4\.0"):
        concat_datasets([depth_ds, other])


def test_a_depth_camera_needs_no_torchcodec_where_cpu_decode_asks_for_it(depth_ds, monkeypatch) -> None:
    """PyAV decodes a depth camera's 12-bit codes whatever ``cpu_decode``'s backend: a depth camera alone among the
    worker-decoded ones was refused at build where torchcodec cannot decode (96d57ed's check counted it)."""
    from lerobot_dali.cpu_decode_options import CpuDecodeOptions, CpuDecoderBackend
    from lerobot_dali.decode_route import DecodeRoute
    from tests.test_cpu_decode import _stand_in_torchcodec

    _stand_in_torchcodec(monkeypatch, None)
    torchcodec = CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC)
    with DALILeRobotIterator(depth_ds, batch_size=2, device="cpu", num_workers=0, cpu_decode=torchcodec) as it:
        assert it.routes[DEPTH] is DecodeRoute.CPU_FALLBACK
        assert next(iter(it))[DEPTH].shape == (2, 1, 48, 80)
