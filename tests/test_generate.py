"""The synthetic dataset generator writes real codecs, exact values and LeRobot's own layouts."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.frame_marker import (
    MAX_CAMERA_INDEX,
    MAX_EPISODE_INDEX,
    MAX_FRAME_INDEX,
    draw_marker,
    read_full_marker,
    read_marker,
)
from lerobot_dali.generate import (
    CODECS,
    DatasetSpec,
    camera_key,
    encode_video,
    expected_action,
    expected_state,
    expected_task_index,
    make_dataset,
    task_name,
)
from lerobot_dali.video_encoding import DEFAULT_CRF, encoder_settings
from tests.conftest import thread_policies


def _decode(path: Path) -> list[tuple[float, np.ndarray]]:
    with av.open(str(path)) as container:
        return [(float(f.time), f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]


def _packets(path: Path) -> list[tuple[int, int, bool]]:
    """(pts, dts, is_keyframe) of every packet, in decode order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.dts, p.is_keyframe) for p in container.demux(stream) if p.size]


# --- frame marker -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("episode_index", "frame_index", "camera_index"),
    [(0, 0, 0), (2**20, 2**16, 3), (MAX_EPISODE_INDEX, MAX_FRAME_INDEX, MAX_CAMERA_INDEX), (12345, 678, 1)],
)
def test_marker_round_trip_exact(episode_index: int, frame_index: int, camera_index: int) -> None:
    frame = draw_marker(episode_index, frame_index, 64, 96, camera_index)
    assert frame.shape == (64, 96, 3) and frame.dtype == np.uint8
    assert read_marker(frame) == (episode_index, frame_index)
    assert read_full_marker(frame) == (episode_index, frame_index, camera_index)


def test_marker_accepts_chw_float_and_resized_frames() -> None:
    frame = draw_marker(7, 9, 96, 128, 2)
    assert read_marker(np.moveaxis(frame, -1, 0)) == (7, 9)  # CHW uint8
    assert read_marker(frame.astype(np.float32) / 255.0) == (7, 9)  # float in [0, 1]
    assert read_marker(frame[::2, ::2]) == (7, 9)  # half-size
    assert read_marker(np.repeat(np.repeat(frame, 3, 0), 2, 1)) == (7, 9)  # enlarged


def test_marker_differs_between_cameras_frames_and_episodes() -> None:
    base = draw_marker(3, 4, 64, 64, 0)
    for other in (draw_marker(3, 4, 64, 64, 1), draw_marker(3, 5, 64, 64, 0), draw_marker(4, 4, 64, 64, 0)):
        assert not np.array_equal(base, other)
    # Cameras also differ in tint, not only in the code.
    assert not np.array_equal(
        np.unique(base.reshape(-1, 3), axis=0), np.unique(draw_marker(3, 4, 64, 64, 1).reshape(-1, 3), axis=0)
    )


@pytest.mark.parametrize(
    "frame",
    [
        np.zeros((64, 64, 3), np.uint8),
        np.full((64, 64, 3), 255, np.uint8),
        np.full((64, 64, 3), 128, np.uint8),
        np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8),
    ],
    ids=["black", "white", "grey", "noise"],
)
def test_read_marker_rejects_frames_without_marker(frame: np.ndarray) -> None:
    with pytest.raises(ValueError, match="no valid marker"):
        read_marker(frame)


def test_read_marker_rejects_flipped_bits() -> None:
    frame = draw_marker(5, 6, 64, 64)
    frame[:8, :8] = 255 - frame[:8, :8]  # invert the first cell: checksum must catch it
    with pytest.raises(ValueError, match="checksum"):
        read_marker(frame)


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 64, 64), (0, MAX_FRAME_INDEX + 1, 64, 64), (MAX_EPISODE_INDEX + 1, 0, 64, 64), (0, 0, 4, 64)],
)
def test_draw_marker_rejects_bad_arguments(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        draw_marker(*args)
    with pytest.raises(ValueError, match="camera_index"):
        draw_marker(0, 0, 64, 64, MAX_CAMERA_INDEX + 1)


def test_read_marker_rejects_batches() -> None:
    with pytest.raises(ValueError, match="single frame"):
        read_marker(np.zeros((2, 64, 64, 3), np.uint8))


# --- encode_video -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_encode_video_round_trip(tmp_path: Path, codec: str) -> None:
    # 96x128 with gop 6 is where a careless encoder preset leaves blocks of the wrong colour.
    ids = [(e, f) for e in (0, 70_000, 2**20) for f in range(8)]
    path = tmp_path / f"{codec}.mp4"
    encode_video(path, (draw_marker(e, f, 96, 128, 1) for e, f in ids), fps=15, codec=codec, gop=6)
    decoded = _decode(path)
    assert [read_full_marker(frame) for _, frame in decoded] == [(e, f, 1) for e, f in ids]
    assert [t for t, _ in decoded] == pytest.approx([i / 15 for i in range(len(ids))], abs=1e-6)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.codec.canonical_name == codec
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert stream.average_rate == Fraction(15)


def _encode_in_fresh_process(
    path: Path, frame_count: int, codec: str, gop: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``encode_video`` of ``frame_count`` marker frames to ``path`` in a new Python process (its stderr kept)."""
    script = (
        "import sys; from lerobot_dali.generate import encode_video; "
        "from lerobot_dali.frame_marker import draw_marker; "
        f"encode_video(sys.argv[1], [draw_marker(0, i, 64, 64) for i in range({frame_count})], "
        f"fps=30, codec={codec!r}, gop={gop})"
    )
    root = Path(__file__).resolve().parents[1]
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **(env or {}), "PYTHONPATH": python_path}
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert [read_marker(frame) for _, frame in _decode(path)] == [(0, i) for i in range(frame_count)]
    return result


@pytest.mark.parametrize("frame_count", [1, 2])
def test_encode_video_short_hevc_clip_in_fresh_process(tmp_path: Path, frame_count: int) -> None:
    # libx265 misreports the first DTS of a process's first short clip; only a fresh process shows it.
    _encode_in_fresh_process(tmp_path / "short.mp4", frame_count, "hevc", 8)


def test_av1_is_encoded_one_picture_at_a_time(tmp_path: Path) -> None:
    """SVT-AV1 4.1, at the level of parallelism it picks from the core count (2 on 2 cores), encodes pictures side by
    side and files each finished one in a ring at its decode order modulo the ring's size, never checking that the
    slot is free. A picture held up (a loaded machine) while a ring's worth of later ones finished lost its slot: the
    encoder returned frame 74 in frame 33's place, which the mp4 muxer refused (EINVAL), or never reached the end of
    the stream, and the flush waited forever. At level 1 a picture starts only once the one before it in decode
    order is packetized. SVT says its level at log level 3, which it reads once per process: hence a fresh one."""
    result = _encode_in_fresh_process(tmp_path / "v.mp4", 8, "av1", 4, env={"SVT_LOG": "3"})
    assert re.findall(r"Level of Parallelism: (\d+)", result.stderr) == ["1"]


def test_an_av1_encode_leaves_no_thread_real_time(tmp_path: Path, realtime_allowed: None) -> None:
    """SVT-AV1, run as root, switched the thread that opened it to real-time FIFO priority 99 for good, and the
    encoder's threads inherited it: a make-dataset beside a process so raised never got past its first encoder, and
    a test session ran real-time from its first AV1 fixture on (lerobot_dali.thread_priority)."""
    while_encoding: dict[int, tuple[int, int]] = {}

    def frames() -> Iterator[np.ndarray]:
        for index in range(8):
            if index == 6:  # (the encoder and its threads run: it opened at frame 0, after the first 4 were drawn)
                while_encoding.update(thread_policies())
            yield draw_marker(0, index, 64, 64)

    encode_video(tmp_path / "v.mp4", frames(), fps=30, codec="av1", gop=30)
    raised = {thread: policy for thread, policy in while_encoding.items() if policy[0] == os.SCHED_FIFO}
    assert len(while_encoding) > 10 and raised == {}  # (SVT-AV1 runs dozens of threads)
    assert thread_policies()[threading.get_native_id()] == (os.SCHED_OTHER, 0)


@pytest.mark.parametrize(("codec", "gop"), [("av1", 2), ("h264", 5), ("hevc", 4), ("vp9", 3), ("h264", 1)])
def test_encode_video_honours_gop(tmp_path: Path, codec: str, gop: int) -> None:
    path = tmp_path / "v.mp4"
    encode_video(path, (draw_marker(0, f, 64, 64) for f in range(20)), fps=30, codec=codec, gop=gop)
    by_pts = sorted(_packets(path))
    keyframe_positions = [i for i, (_, _, key) in enumerate(by_pts) if key]
    assert keyframe_positions[0] == 0
    assert max(np.diff([*keyframe_positions, len(by_pts)])) <= gop
    # Closed GOPs: no packet decoded after a keyframe is shown before it.
    in_decode_order = _packets(path)
    for position, (pts, _, key) in enumerate(in_decode_order):
        if key:
            assert min(p for p, _, _ in in_decode_order[position:]) == pts


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_encode_video_uses_b_frames(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "b.mp4"
    encode_video(path, (draw_marker(1, f, 64, 64) for f in range(16)), fps=30, codec=codec, gop=8)
    pts_in_decode_order = [pts for pts, _, _ in _packets(path)]
    assert pts_in_decode_order != sorted(pts_in_decode_order)  # reordered: B-frames present


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codec": "mpeg2"}, "Unknown codec"),
        ({"fps": 0}, "fps"),
        ({"gop": 0}, "gop"),
        ({"crf": 99}, "crf"),
    ],
)
def test_encode_video_rejects_bad_options(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    options: dict = {"fps": 30, "codec": "h264", "gop": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        encode_video(tmp_path / "x.mp4", [draw_marker(0, 0, 64, 64)], **options)


#: Each codec's crf where none is given, and the largest it takes.
CRFS = {"av1": (30, 63), "h264": (23, 51), "hevc": (28, 51), "vp9": (32, 63)}


@pytest.mark.parametrize("codec", CODECS)
def test_encoder_settings_take_each_crf_from_0_to_the_codecs_largest(codec: str) -> None:
    default, largest = CRFS[codec]
    assert DEFAULT_CRF[codec] == encoder_settings(codec, gop=1).crf == default  # (AV1's 30: LeRobot's)
    assert encoder_settings(codec, gop=1).options["crf"] == str(default)
    for crf in (0, largest):  # (0: lossless, not "none given")
        settings = encoder_settings(codec, gop=1, crf=crf)
        assert (settings.crf, settings.options["crf"]) == (crf, str(crf))
    for crf in (-1, largest + 1):
        with pytest.raises(ValueError, match=rf"^crf for {codec} must be in \[0, {largest}\], got {crf}\.$"):
            encoder_settings(codec, gop=1, crf=crf)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gop": 2.0}, "gop (maximum keyframe interval in frames) must be an int, got 2.0."),
        ({"gop": True}, "gop (maximum keyframe interval in frames) must be an int, got True."),
        ({"crf": "20"}, "crf for h264 must be an int, got '20'."),
    ],
)
def test_encoder_settings_refuse_a_gop_or_crf_of_no_int(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        encoder_settings(**({"codec": "h264", "gop": 2} | kwargs))


@pytest.mark.parametrize(
    ("codec", "frame_shape", "fps", "message"),
    [
        ("av1", (8706, 64), 30, "size 8706x64 (height x width) is more than libsvtav1 (codec av1) encodes: height "
         "at most 8704, width at most 16384, height x width at most 142606336 pixels; 8704x64 works"),
        ("av1", (64, 64), 241, "fps 241 is more than libsvtav1 (codec av1) encodes: at most 240"),
        ("vp9", (64, 65536), 30, "width at most 65534"),
    ],
)  # fmt: skip
def test_encode_video_says_what_the_encoder_refuses_before_it_opens(
    tmp_path: Path, codec: str, frame_shape: tuple[int, int], fps: int, message: str
) -> None:
    """Frames or a frame rate past what the encoder (or the mp4 muxer) takes were an ArgumentError from inside PyAV:
    'avcodec_open2("libsvtav1", {...}) returned 22', naming neither the value nor the limit."""
    with pytest.raises(ValueError, match=re.escape(message)):
        encode_video(tmp_path / "a.mp4", [np.zeros((*frame_shape, 3), np.uint8)], fps=fps, codec=codec, gop=2)
    assert not (tmp_path / "a.mp4").exists()


@pytest.mark.parametrize(("cameras", "image_cameras"), [(1, True), (0, False)])
def test_a_dataset_without_videos_refuses_an_fps_past_the_video_codecs_c_int(cameras: int, image_cameras: bool) -> None:
    """No encoder checked it: fps 10**50 was taken and wrote all-zero float32 timestamps (k / fps underflowing)."""
    limit = 2**31 - 1
    assert DatasetSpec(cameras=cameras, image_cameras=image_cameras, fps=limit).fps == limit
    with pytest.raises(ValueError, match=rf"fps must be at most {limit} .*got {10**50}"):
        DatasetSpec(cameras=cameras, image_cameras=image_cameras, fps=10**50)


def test_encode_video_rejects_bad_frames(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No frames"):
        encode_video(tmp_path / "a.mp4", [], fps=30, codec="vp9", gop=2)
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        encode_video(tmp_path / "b.mp4", [np.zeros((64, 64), np.uint8)], fps=30, codec="vp9", gop=2)
    with pytest.raises(ValueError, match="all frames"):
        frames = [draw_marker(0, 0, 64, 64), draw_marker(0, 1, 64, 96)]
        encode_video(tmp_path / "c.mp4", frames, fps=30, codec="vp9", gop=2)
    assert not (tmp_path / "c.mp4").exists()  # no half-written file left behind


# --- expected values --------------------------------------------------------------------------------------


def test_expected_values_are_exact_and_distinct() -> None:
    state = expected_state(3, 17, 6)
    action = expected_action(3, 17, 7)
    assert state.dtype == np.float32 and state.shape == (6,)
    assert state.tolist() == [3017 + i / 32 for i in range(6)]
    assert action.tolist() == [-(3017 + i / 32 + 1 / 64) for i in range(7)]
    assert expected_task_index(5, num_tasks=3, seed=0) == 2
    assert expected_task_index(5, num_tasks=3, seed=1) == 0


# --- make_dataset: v3.0 -----------------------------------------------------------------------------------


LENGTHS = [4, 1, 6, 3, 2]


@pytest.fixture(scope="module")
def v30_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(
        tmp_path_factory.mktemp("v30") / "ds",
        episodes=5,
        frames_per_episode=LENGTHS,
        cameras=2,
        size=(64, 96),
        fps=10,
        codec="h264",
        gop=3,
        episodes_per_file=2,
        chunks_size=2,
        num_tasks=3,
        seed=1,
    )


def test_v30_info(v30_root: Path) -> None:
    info = json.loads((v30_root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (5, 16, 3)
    assert info["fps"] == 10 and info["chunks_size"] == 2 and info["splits"] == {"train": "0:5"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert {"data_files_size_in_mb", "video_files_size_in_mb"} <= info.keys()
    features = info["features"]
    assert list(features) == [
        "observation.state",
        "observation.images.cam0",
        "observation.images.cam1",
        "action",
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    assert features["observation.state"] == {
        "dtype": "float32",
        "shape": [6],
        "names": [f"state_{i}" for i in range(6)],
        "fps": 10,
    }
    assert features["index"]["dtype"] == "int64" and features["index"]["fps"] == 10
    cam = features["observation.images.cam1"]
    assert cam["dtype"] == "video" and cam["shape"] == [64, 96, 3]
    assert cam["info"] == {
        "video.height": 64,
        "video.width": 96,
        "video.codec": "h264",
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": 10,
        "video.channels": 3,
        "has_audio": False,
    }


def test_v30_files_group_episodes_and_roll_chunks(v30_root: Path) -> None:
    data_files = sorted(p.relative_to(v30_root).as_posix() for p in (v30_root / "data").rglob("*.parquet"))
    assert data_files == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    for key in ("observation.images.cam0", "observation.images.cam1"):
        videos = sorted(
            p.relative_to(v30_root / "videos" / key).as_posix() for p in (v30_root / "videos" / key).rglob("*.mp4")
        )
        assert videos == ["chunk-000/file-000.mp4", "chunk-000/file-001.mp4", "chunk-001/file-000.mp4"]


def test_v30_episodes_metadata(v30_root: Path) -> None:
    table = pq.read_table(v30_root / "meta/episodes/chunk-000/file-000.parquet")
    rows = table.to_pylist()
    assert [r["episode_index"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["length"] for r in rows] == LENGTHS
    starts = np.cumsum([0, *LENGTHS]).tolist()
    assert [r["dataset_from_index"] for r in rows] == starts[:-1]
    assert [r["dataset_to_index"] for r in rows] == starts[1:]
    assert [(r["data/chunk_index"], r["data/file_index"]) for r in rows] == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0)]
    assert [r["tasks"] for r in rows] == [[task_name((e + 1) % 3)] for e in range(5)]
    assert all((r["meta/episodes/chunk_index"], r["meta/episodes/file_index"]) == (0, 0) for r in rows)
    key = "videos/observation.images.cam1"
    assert [r[f"{key}/from_timestamp"] for r in rows] == pytest.approx([0.0, 0.4, 0.0, 0.6, 0.0])
    assert [r[f"{key}/to_timestamp"] for r in rows] == pytest.approx([0.4, 0.5, 0.6, 0.9, 0.2])
    assert table.schema.field("tasks").type == pa.list_(pa.string())
    assert table.schema.field(f"{key}/from_timestamp").type == pa.float64()
    stats_state_min = rows[2]["stats/observation.state/min"]
    assert stats_state_min == expected_state(2, 0, 6).tolist()
    assert rows[2]["stats/observation.images.cam0/count"] == [6]
    assert np.array(rows[2]["stats/observation.images.cam0/mean"]).shape == (3, 1, 1)


def test_v30_video_files_match_episode_timestamps(v30_root: Path) -> None:
    rows = pq.read_table(v30_root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for camera_index in range(2):
        key = camera_key(camera_index)
        for chunk_index, file_index in {(r[f"videos/{key}/chunk_index"], r[f"videos/{key}/file_index"]) for r in rows}:
            in_file = [
                r
                for r in rows
                if (r[f"videos/{key}/chunk_index"], r[f"videos/{key}/file_index"]) == (chunk_index, file_index)
            ]
            path = v30_root / f"videos/{key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
            decoded = _decode(path)
            assert len(decoded) == sum(r["length"] for r in in_file)
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                duration_s = float(stream.duration * stream.time_base)
            assert in_file[-1][f"videos/{key}/to_timestamp"] == pytest.approx(duration_s, abs=1e-3)
            for row in in_file:
                for frame_index in range(row["length"]):
                    wanted_s = row[f"videos/{key}/from_timestamp"] + frame_index / 10
                    nearest = int(np.argmin([abs(t - wanted_s) for t, _ in decoded]))
                    time_s, frame = decoded[nearest]
                    assert time_s == pytest.approx(wanted_s, abs=1e-6)
                    assert read_full_marker(frame) == (row["episode_index"], frame_index, camera_index)


def test_v30_data_rows(v30_root: Path) -> None:
    files = sorted((v30_root / "data").rglob("*.parquet"))
    table = pq.read_table(files[1])
    assert table.schema.field("observation.state").type == pa.list_(pa.float32(), 6)
    assert table.schema.field("action").type == pa.list_(pa.float32(), 7)
    assert table.schema.field("timestamp").type == pa.float32()
    hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.state"] == {"feature": {"dtype": "float32", "_type": "Value"}, "length": 6, "_type": "List"}
    rows = table.to_pylist()
    assert [(r["episode_index"], r["frame_index"]) for r in rows] == [(2, f) for f in range(6)] + [
        (3, f) for f in range(3)
    ]
    assert [r["index"] for r in rows] == list(range(5, 14))
    for r in rows:
        assert r["observation.state"] == expected_state(r["episode_index"], r["frame_index"], 6).tolist()
        assert r["action"] == expected_action(r["episode_index"], r["frame_index"], 7).tolist()
        assert r["timestamp"] == np.float32(r["frame_index"] / 10)
        assert r["task_index"] == (r["episode_index"] + 1) % 3
    all_index = np.concatenate([pq.read_table(f, columns=["index"])["index"].to_numpy() for f in files])
    assert all_index.tolist() == list(range(16))


def test_v30_tasks_and_stats(v30_root: Path) -> None:
    tasks = pq.read_table(v30_root / "meta/tasks.parquet")
    assert tasks.column_names == ["task_index", "__index_level_0__"]
    assert tasks.to_pylist() == [{"task_index": i, "__index_level_0__": task_name(i)} for i in range(3)]
    pandas_meta = json.loads(tasks.schema.metadata[b"pandas"])
    assert pandas_meta["index_columns"] == ["__index_level_0__"]
    stats = json.loads((v30_root / "meta/stats.json").read_text())
    assert stats["index"] == {
        "min": [0],
        "max": [15],
        "mean": [7.5],
        "std": [pytest.approx(np.std(np.arange(16)))],
        "count": [16],
    }
    assert stats["observation.state"]["max"] == expected_state(4, 1, 6).tolist()
    cam = stats["observation.images.cam0"]
    assert cam["count"] == [16] and np.array(cam["max"]).shape == (3, 1, 1)
    assert 0.0 <= min(np.ravel(cam["min"])) < max(np.ravel(cam["max"])) <= 1.0


# --- make_dataset: v2.1 -----------------------------------------------------------------------------------


def test_v21_layout(tmp_path: Path) -> None:
    root = make_dataset(
        tmp_path / "ds",
        episodes=3,
        frames_per_episode=[3, 1, 2],
        cameras=2,
        size=(64, 64),
        fps=15,
        codec="vp9",
        version="v2.1",
        chunks_size=2,
        num_tasks=2,
    )
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1"
    assert (info["total_episodes"], info["total_frames"], info["total_videos"], info["total_chunks"]) == (3, 6, 6, 2)
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    assert info["video_path"] == "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    assert "fps" not in info["features"]["observation.state"]
    assert info["features"]["observation.images.cam0"]["info"]["video.codec"] == "vp9"
    episodes = [json.loads(line) for line in (root / "meta/episodes.jsonl").read_text().splitlines()]
    assert episodes == [
        {"episode_index": 0, "tasks": [task_name(0)], "length": 3},
        {"episode_index": 1, "tasks": [task_name(1)], "length": 1},
        {"episode_index": 2, "tasks": [task_name(0)], "length": 2},
    ]
    tasks = [json.loads(line) for line in (root / "meta/tasks.jsonl").read_text().splitlines()]
    assert tasks == [{"task_index": 0, "task": task_name(0)}, {"task_index": 1, "task": task_name(1)}]
    stats = [json.loads(line) for line in (root / "meta/episodes_stats.jsonl").read_text().splitlines()]
    assert [s["episode_index"] for s in stats] == [0, 1, 2]
    assert stats[2]["stats"]["frame_index"] == {"min": [0], "max": [1], "mean": [0.5], "std": [0.5], "count": [2]}
    assert not (root / "meta/stats.json").exists()

    for episode_index, chunk in ((0, 0), (1, 0), (2, 1)):
        table = pq.read_table(root / f"data/chunk-{chunk:03d}/episode_{episode_index:06d}.parquet")
        hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
        assert hf["action"]["_type"] == "Sequence" and hf["action"]["length"] == 7
        rows = table.to_pylist()
        assert [r["frame_index"] for r in rows] == list(range(episodes[episode_index]["length"]))
        assert [r["index"] for r in rows] == [
            sum(e["length"] for e in episodes[:episode_index]) + f for f in range(len(rows))
        ]
        assert rows[-1]["observation.state"] == expected_state(episode_index, len(rows) - 1, 6).tolist()
        for camera_index in range(2):
            video = root / f"videos/chunk-{chunk:03d}/{camera_key(camera_index)}/episode_{episode_index:06d}.mp4"
            markers = [read_full_marker(frame) for _, frame in _decode(video)]
            assert markers == [(episode_index, f, camera_index) for f in range(len(rows))]


# --- make_dataset: edge cases and arguments ---------------------------------------------------------------


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_single_frame_episodes(tmp_path: Path, version: str) -> None:
    root = make_dataset(tmp_path / "ds", episodes=3, frames_per_episode=1, size=(64, 64), version=version, codec="av1")
    videos = sorted((root / "videos").rglob("*.mp4"))
    markers = [read_marker(frame) for video in videos for _, frame in _decode(video)]
    assert sorted(markers) == [(0, 0), (1, 0), (2, 0)]
    if version == "v3.0":
        rows = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        assert [r["videos/observation.images.cam0/from_timestamp"] for r in rows] == pytest.approx([0.0, 1 / 30, 0.0])
        assert [r["dataset_to_index"] - r["dataset_from_index"] for r in rows] == [1, 1, 1]


def test_make_dataset_is_deterministic(tmp_path: Path) -> None:
    a = make_dataset(tmp_path / "a", episodes=2, frames_per_episode=3, size=(64, 64), seed=3)
    b = make_dataset(tmp_path / "b", episodes=2, frames_per_episode=3, size=(64, 64), seed=3)
    for name in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet", "meta/info.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert pq.read_table(a / "data/chunk-000/file-000.parquet")["task_index"].to_pylist() == [1, 1, 1, 0, 0, 0]


def test_make_dataset_without_cameras(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", episodes=2, frames_per_episode=2, cameras=0)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["video_path"] is None and not (root / "videos").exists()
    assert (
        "videos/observation.images.cam0/from_timestamp"
        not in pq.read_schema(root / "meta/episodes/chunk-000/file-000.parquet").names
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"episodes": 0}, "episodes"),
        ({"frames_per_episode": 0}, "frames_per_episode"),
        ({"frames_per_episode": [3, 3]}, "one length per episode"),
        ({"frames_per_episode": [3, 0, 3, 3]}, r"frames_per_episode\[1\]"),
        ({"frames_per_episode": 2.5}, "frames_per_episode"),
        ({"cameras": -1}, "cameras"),
        ({"size": (63, 64)}, "height"),
        ({"size": (66, 65)}, "even"),
        ({"size": (64,)}, "size"),
        ({"fps": 0}, "fps"),
        ({"codec": "theora"}, "Unknown codec"),
        ({"gop": 0}, "gop"),
        ({"episodes_per_file": 0}, "episodes_per_file"),
        ({"version": "v2.0"}, "version"),
        ({"state_dim": 0}, "state_dim"),
        ({"action_dim": 33}, "action_dim"),
        ({"num_tasks": 0}, "num_tasks"),
        ({"chunks_size": 0}, "chunks_size"),
        ({"seed": -1}, "seed"),
        ({"episodes": True}, "episodes"),
    ],
)
def test_make_dataset_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_dataset(tmp_path / "ds", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "ds").exists()


def test_make_dataset_refuses_non_empty_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep.txt").write_text("x")
    with caplog.at_level(logging.INFO, logger="lerobot_dali"), pytest.raises(FileExistsError, match="not an empty d"):
        make_dataset(tmp_path / "ds")
    assert caplog.records == []  # (it said "Writing a v3.0 dataset ... to ds" first)


def test_an_interrupted_make_dataset_leaves_nothing_that_blocks_a_rerun(tmp_path: Path, monkeypatch) -> None:
    """A new OUT appears only once complete; an empty OUT (a mount point, say) is emptied again."""
    import lerobot_dali.generate as generate

    real_encode = generate.encode_video
    seen: list[bool] = []
    new, empty = tmp_path / "parent" / "new", tmp_path / "empty"
    empty.mkdir()

    def interrupted_encode(*args: object, **kwargs: object) -> None:
        seen.append(new.exists())
        if len(seen) % 2 == 0:
            raise KeyboardInterrupt  # Ctrl-C while the second video is encoded
        real_encode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(generate, "encode_video", interrupted_encode)
    options = {"episodes": 3, "frames_per_episode": 2, "size": (64, 64), "codec": "vp9", "episodes_per_file": 1}
    for out in (new, empty):
        with pytest.raises(KeyboardInterrupt):
            make_dataset(out, **options)  # type: ignore[arg-type]
    assert seen == [False, False, False, False]  # the half-written new dataset is never at OUT
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["empty", "parent"]
    monkeypatch.setattr(generate, "encode_video", real_encode)
    for out in (new, empty):
        assert (make_dataset(out, **options) / "meta/info.json").is_file()  # type: ignore[arg-type]
    assert [p.name for p in new.parent.iterdir()] == ["new"]  # nothing left beside it


def test_make_dataset_under_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for out in ("afile/ds", "afile/sub/ds"):
        with pytest.raises(
            NotADirectoryError,
            match=re.escape(
                f"Cannot write a dataset to {tmp_path / out}: {tmp_path / 'afile'} is a file, not a directory: write "
                f"it elsewhere, or move {tmp_path / 'afile'} aside."
            ),
        ):
            make_dataset(tmp_path / out)


def test_progress_is_logged_per_file_and_says_what_the_cameras_are(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="lerobot_dali.generate")
    options = {"episodes": 3, "frames_per_episode": 2, "size": (64, 64), "episodes_per_file": 2}
    make_dataset(tmp_path / "images", image_cameras=True, **options)  # type: ignore[arg-type]
    make_dataset(tmp_path / "videos", cameras=2, codec="vp9", gop=3, **options)  # type: ignore[arg-type]
    make_dataset(tmp_path / "v21", codec="vp9", version="v2.1", **options)  # type: ignore[arg-type]
    messages = [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.generate"]
    assert messages == [
        f"Writing a v3.0 dataset of 3 episodes (6 frames, 1 image camera as PNG in the data files) "
        f"to {tmp_path / 'images'}",
        "file 1/2: episodes 0-1, data/chunk-000/file-000.parquet with the camera images",
        "file 2/2: episode 2, data/chunk-000/file-001.parquet with the camera images",  # (it said "episodes 2-2")
        f"Writing a v3.0 dataset of 3 episodes (6 frames, 2 cameras as vp9 video, gop 3) to {tmp_path / 'videos'}",
        "file 1/2: episodes 0-1, data/chunk-000/file-000.parquet and 2 video files",
        "file 2/2: episode 2, data/chunk-000/file-001.parquet and 2 video files",
        f"Writing a v2.1 dataset of 3 episodes (6 frames, 1 camera as vp9 video, gop 2) to {tmp_path / 'v21'}",
        "episode 1/3: data/chunk-000/episode_000000.parquet and 1 video file",  # (it said "1 video file(s)")
        "episode 2/3: data/chunk-000/episode_000001.parquet and 1 video file",
        "episode 3/3: data/chunk-000/episode_000002.parquet and 1 video file",
    ]


def test_spec_normalises_lengths() -> None:
    assert DatasetSpec(episodes=3, frames_per_episode=[2, 2, 2]).episode_lengths == (2, 2, 2)
    assert DatasetSpec(episodes=2, frames_per_episode=(1, 5)).total_frames == 6
    assert DatasetSpec(version="v2.1").version.value == "v2.1"  # type: ignore[arg-type]


def test_spec_accepts_numpy_ints_and_stores_plain_ints(tmp_path: Path) -> None:
    spec = DatasetSpec(episodes=np.int64(2), frames_per_episode=np.int64(3), fps=np.int32(15))
    assert type(spec.episodes) is int and type(spec.fps) is int and spec.episode_lengths == (3, 3)
    root = make_dataset(tmp_path / "ds", episodes=np.int64(1), frames_per_episode=[np.int64(2)], fps=np.int64(15))
    assert json.loads((root / "meta/info.json").read_text())["total_frames"] == 2


@pytest.mark.parametrize("shape", [(96, 128), (97, 131), (8, 8)])
def test_image_moments_equal_float_reductions_over_the_pixels(shape: tuple[int, int]) -> None:
    from lerobot_dali.generate import _image_moments

    rng = np.random.default_rng(shape[0])
    frame = rng.integers(3, 250, (*shape, 3), dtype=np.uint8)
    frame[0, 0] = (0, 255, 17)  # the extremes of two channels sit in one pixel
    pixels = frame.reshape(-1, 3).astype(np.float64) / 255.0
    moments = _image_moments(frame)
    assert moments.count == 1 and moments.total.shape == (3, 1, 1)
    np.testing.assert_allclose(moments.total.ravel(), pixels.mean(0), rtol=1e-12)
    np.testing.assert_allclose(moments.total_sq.ravel(), (pixels**2).mean(0), rtol=1e-12)
    assert moments.minimum.ravel().tolist() == pixels.min(0).tolist()
    assert moments.maximum.ravel().tolist() == pixels.max(0).tolist()


def test_a_dataset_another_run_wrote_meanwhile_is_kept(tmp_path: Path, monkeypatch) -> None:
    """Two runs to one new OUT: the one that finishes second refuses cleanly (FileExistsError, one line from the
    CLI) and leaves the other's dataset and no staging folder."""
    import lerobot_dali.generate as generate

    out = tmp_path / "out"
    options = {"episodes": 1, "frames_per_episode": 2, "size": (64, 64), "codec": "vp9"}
    real_encode = generate.encode_video

    def other_run_finishes_first(*args: object, **kwargs: object) -> None:
        real_encode(*args, **kwargs)  # type: ignore[arg-type]
        if not out.exists():
            monkeypatch.setattr(generate, "encode_video", real_encode)
            make_dataset(out, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(generate, "encode_video", other_run_finishes_first)
    with pytest.raises(FileExistsError, match="it appeared while this one was written"):
        make_dataset(out, **options)  # type: ignore[arg-type]
    assert (out / "meta/info.json").is_file() and [p.name for p in tmp_path.iterdir()] == ["out"]


_KILLED_WHILE_ENCODING = """
import sys, time
import lerobot_dali.generate as generate

def stall(*args, **kwargs):
    open(sys.argv[2], "w").close()  # (the test kills the process now)
    time.sleep(600)

generate.encode_video = stall
generate.make_dataset(sys.argv[1], episodes=1, frames_per_episode=2, size=(64, 64), codec="vp9")
"""


def test_the_staging_folder_of_a_killed_make_dataset_is_removed_by_the_next_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A make-dataset killed outright (SIGKILL, the OOM killer) left its ``.OUT.tmp-*`` folder beside OUT forever;
    the next run on its host removes it, and says so. Another host's (a shared filesystem) and a live run's stay."""
    from lerobot_dali.new_folder import host_name

    out, started = tmp_path / "out", tmp_path / "started"
    run = subprocess.Popen([sys.executable, "-c", _KILLED_WHILE_ENCODING, str(out), str(started)])
    try:
        for _ in range(600):
            if started.exists() or run.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), "the run never started encoding"
    finally:
        run.kill()
        run.wait(timeout=30)
    (left,) = tmp_path.glob(".out.tmp-*")
    others = [tmp_path / ".out.tmp-elsewhere-1-0123abcd", tmp_path / f".out.tmp-{host_name()}-{os.getpid()}-0123abcd"]
    for other in others:
        other.mkdir()
    with caplog.at_level(logging.INFO, logger="lerobot_dali.new_folder"):
        make_dataset(out, episodes=1, frames_per_episode=2, size=(64, 64), codec="vp9")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", "started", *(p.name for p in others)])
    assert f"removed {left}, left by a make_dataset run on this host (PID {run.pid}) that was killed" in caplog.text
