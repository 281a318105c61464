"""A video file whose frame rate or end cannot meet its episodes' rows, and an episode whose rows run into the next
one's part of a file, are refused when the iterator is built (lerobot_dali.file_timing), naming the file, the episode
and the values; before, they failed when a batch first reached such a row, maybe hours into training."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from lerobot_dali import DALILeRobotIterator, open_dataset
from lerobot_dali.camera_codecs import CameraSurvey, FileFormat, read_file_format, survey_camera
from lerobot_dali.dataset_info import DatasetInfo
from lerobot_dali.errors import FrameTimestampError
from lerobot_dali.file_timing import check_file_timing, check_rows_fit_parts
from lerobot_dali.frame_lookup import ITERATORS_LOOKUP, TimestampSource
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index_store import PacketIndexStore
from tests.video_fixtures import reference_frames

FPS = 10
CAM = "observation.images.cam0"
#: file-000 holds episodes 0-1, file-001 2-3 (8 rows each: 0.0-0.7 s and 0.8-1.5 s of the file), file-002 4-5.
SPEC = dict(episodes=6, frames_per_episode=8, cameras=1, fps=FPS, gop=4, episodes_per_file=2, size=(64, 96), seed=3)
ODD = f"videos/{CAM}/chunk-000/file-001.mp4"


def _rewrite(path: Path, *, fps: int, keep: int | None = None, codec: str = "h264") -> None:
    """``path``'s frames written again at ``fps`` (frame k at k / fps), its first ``keep`` only."""
    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    encode_video(path, frames[:keep], fps=fps, codec=codec, gop=4)


def _build(root: Path, **options) -> DALILeRobotIterator:
    return DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=0, drop_last=False, **options)


def _refused_when_built(root: Path, said: str, error: type[Exception] = FrameTimestampError, **options) -> None:
    with pytest.raises(error, match=re.escape(said)):
        _build(root, **options)


def _rows_read(it: DALILeRobotIterator) -> int:
    try:
        return sum(len(batch["index"]) for batch in it)
    finally:
        it.close()


def _first_batch_frames(it: DALILeRobotIterator) -> int:
    batch = next(iter(it))
    it.close()
    return int(batch[CAM].shape[0])


@pytest.mark.parametrize(
    ("rate", "why"),
    [(8, "it has fewer frames than its rows"), (11, "its frames drift off the rows' times")],
)
def test_a_file_written_at_another_rate_is_refused_when_built(make_ds, copy_ds, rate: int, why: str) -> None:
    """file-001 written at 8 fps (or 11: up to 1.2 times the rows' rate, a row lies between two frames) among 10 fps
    files: its rows' frames miss; the first episode's file is right, so the build passed before."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _rewrite(root / ODD, fps=rate)
    said = (
        f"{root / ODD} (episode 2, camera '{CAM}') is written at {rate} fps (its header), but the rows are at "
        f"info.json's fps, 10: {why}, and rows would miss their frames when a batch reaches them. Write it again at "
        "10 fps, frame k at k / 10 s (e.g. ffmpeg -i <video> -vf 'setpts=N/(10*TB)' -r 10 <new video>), or leave its "
        "episodes out with episodes=[...]"
    )
    _refused_when_built(root, said)
    assert _first_batch_frames(_build(root, episodes=[0, 1, 4, 5])) == 4  # (left out: the others read)


def test_a_file_twice_as_fast_as_its_rows_is_told_written_at_another_rate(make_ds, copy_ds) -> None:
    """At 20 fps (more than 1.2 times the rows': a rate that reads) its 16 frames end at 0.8 s, where episode 3's
    rows begin: told as a file written at another rate, not one cut short."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _rewrite(root / ODD, fps=20)
    said = (
        f"{root / ODD} (camera '{CAM}') ends at 0.800000 s (its header: 20 fps), but episode 3, its last, has 8 rows "
        "at 10 fps from its from_timestamp 0.800000 s, the last at 1.500000 s: it holds a frame for each row up to "
        "that end, closer together than 1 / 10 s: written at another frame rate than its rows'. Write it again at 10 "
        "fps"
    )
    _refused_when_built(root, said)


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_a_file_that_lost_its_last_frames_is_refused_when_built(make_ds, copy_ds, version: str) -> None:
    """The file's last episode's last 3 rows have no frame (a copy cut short and re-muxed whole, or a recording cut
    short): refused naming the file, the episode and both ends; a v2.1 episode's own file alike."""
    root = copy_ds(make_ds(**SPEC, codec="h264", version=version))
    cut = ODD if version == "v3.0" else f"videos/chunk-000/{CAM}/episode_000003.mp4"
    frames, start = (13, 0.8) if version == "v3.0" else (5, 0.0)
    _rewrite(root / cut, fps=FPS, keep=frames)
    said = (
        f"{root / cut} (camera '{CAM}') ends at {frames / FPS:.6f} s (its header: 10 fps), but episode 3, its last, "
        f"has 8 rows at 10 fps from its from_timestamp {start:.6f} s, the last at {start + 0.7:.6f} s: the file lost "
        "its last frames (a partial download or copy: download or copy it again; one cut short when recorded: "
        "re-encode the episode from its frames), or the episode's length or from_timestamp in meta/episodes is wrong"
    )
    _refused_when_built(root, said)


def test_a_file_two_frames_short_reads_where_the_tolerance_reaches_its_last_frame(make_ds, copy_ds) -> None:
    """Two frames short: the last row lies 0.1 s past the file's end, refused by default; a tolerance_s of 0.25
    reads it from the last frame (0.2 s off), as the lookup does, so the build does not refuse it."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _rewrite(root / ODD, fps=FPS, keep=14)
    with pytest.raises(FrameTimestampError, match=r"ends at 1\.400000 s .* the last at 1\.500000 s"):
        _build(root)
    assert _rows_read(_build(root, tolerance_s=0.25, episodes=[3])) == 8


_ONE_UNREAD = "the last a sample reads at 1.400000 s (its last 1 lie past every window: drop_n_last_frames)"


@pytest.mark.parametrize(
    ("deltas", "drop", "said"),
    [([-0.1, 0.0], 3, None), ([-0.1, 0.0], 1, _ONE_UNREAD), ([0.0, 0.2], 3, _ONE_UNREAD)],
)
def test_rows_no_sample_reads_are_not_held_to_the_file(make_ds, copy_ds, deltas, drop: int, said: str | None) -> None:
    """Three frames short, read as Diffusion Policy reads (the camera's window -1..0, its episodes' last rows never
    anchors): with drop_n_last_frames=3 no sample reads the frames lost, as in LeRobot, so the build passes and every
    sample reads; with 1 dropped, or a window reaching 2 rows on, the last row read lies past the file's end. (The
    episode read first: its first and last rows looked up when built, the last one read too.)"""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _rewrite(root / ODD, fps=FPS, keep=13)
    options = dict(delta_timestamps={CAM: deltas}, drop_n_last_frames=drop, episodes=[3])
    if said is None:
        assert _rows_read(_build(root, **options)) == 8 - drop
        return
    _refused_when_built(root, f"from its from_timestamp 0.800000 s, {said}", **options)


def test_a_file_one_frame_short_is_left_to_the_lookup(make_ds, copy_ds) -> None:
    """One frame short, the header's end is the last row's time: a remux that lost the last packet's duration looks
    alike, so the build passes it, and the lookup refuses the row when a batch reaches it."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _rewrite(root / ODD, fps=FPS, keep=15)
    with pytest.raises(FrameTimestampError, match=r"query timestamp 1\.500000 s has no video frame"):
        _rows_read(_build(root, episodes=[3]))


def _set_from_timestamp(root: Path, episode: int, value: float) -> None:
    path = next((root / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    column = f"videos/{CAM}/from_timestamp"
    values = table[column].to_numpy().copy()
    values[np.asarray(table["episode_index"]) == episode] = value
    pq.write_table(table.set_column(table.column_names.index(column), column, [values]), path)


@pytest.mark.parametrize(("early", "past", "frames"), [(0.2, "2 rows", "2 frames"), (0.1, "row", "1 frame")])
def test_an_episode_whose_next_starts_too_early_is_refused_when_built(
    make_ds, copy_ds, early: float, past: str, frames: str
) -> None:
    """Episode 3's from_timestamp two frames early (or one): episode 2's last rows would read episode 3's frames,
    though episode 3 is left out; the first episode's rows find theirs, so the build passed before. Episode 2 starts
    its file: the next one's start is named as the wrong one."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _set_from_timestamp(root, 3, 0.8 - early)
    said = (
        f"{root}: camera '{CAM}': episode 2's rows run past its part of {root / ODD}: its 8 rows at 10 fps from its "
        f"from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the file starts at {0.8 - early:.6f} s "
        f"(its from_timestamp), so its last {past} would read that episode's frames. The next episode's "
        f"from_timestamp in meta/episodes is most likely {frames} early (0.800000 s, where these rows end; this one "
        f"cannot start earlier): correct videos/{CAM}/from_timestamp in meta/episodes, or leave the episode out with "
        "episodes=[...]"
    )
    _refused_when_built(root, said, episodes=[0, 2])


def _declare_video_fps(root: Path, fps: float) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][CAM]["info"]["video.fps"] = fps
    (root / "meta/info.json").write_text(json.dumps(info))


def test_rows_over_a_faster_file_are_held_to_half_its_frame_not_the_declared_rate(make_ds, copy_ds) -> None:
    """file-001 written again at 30 fps (each frame three times: 3 a row), info.json still declaring 10 (as
    r1_v30_h264 declares 10 for 25 fps files), episode 3 from one 30 fps frame after episode 2's last row (0.7 s,
    22 / 30 s): that row reads its own frame, half a file frame before the next episode's first. Held to half a
    frame at the declared 10 fps it was refused when built; each row reads the frame of the file at its time."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    with av.open(str(root / ODD)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    encode_video(root / ODD, [frames[k // 3] for k in range(48)], fps=30, codec="h264", gop=4)
    _set_from_timestamp(root, 3, 22 / 30)
    shown = [frame for _, frame in sorted(reference_frames(root / ODD).items())]
    it = _build(root, episodes=[2, 3], shuffle=False, return_uint8=True)
    try:
        samples = [
            (int(e), int(f), frame.permute(1, 2, 0).numpy())
            for batch in it
            for e, f, frame in zip(batch["episode_index"], batch["frame_index"], batch[CAM], strict=True)
        ]
    finally:
        it.close()
    assert [(e, f) for e, f, _ in samples] == [(e, f) for e in (2, 3) for f in range(8)]
    for episode, row, frame in samples:
        np.testing.assert_array_equal(frame, shown[3 * row + (22 if episode == 3 else 0)])


def test_rows_are_held_to_half_a_frame_of_their_file_though_a_faster_rate_is_declared(make_ds, copy_ds) -> None:
    """info.json declaring 30 fps for 10 fps files: episode 3's from_timestamp 0.06 s early (0.74 s), episode 2's
    last row at 0.7 s lies 0.04 s before it, within half a 10 fps frame, so a batch reading that row failed; held to
    half a 30 fps frame (0.017 s), the build passed it."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    _declare_video_fps(root, 30)
    _set_from_timestamp(root, 3, 0.74)
    said = (
        f"{root}: camera '{CAM}': episode 2's rows run past its part of {root / ODD}: its 8 rows at 10 fps from its "
        "from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the file starts at 0.740000 s (its "
        "from_timestamp), so its last row would read that episode's frames."
    )
    _refused_when_built(root, said, episodes=[0, 2])


def test_an_episode_starting_late_in_the_middle_of_its_file_is_named_late(make_ds, copy_ds) -> None:
    """Episode 1, the middle one of file-000's three, from_timestamp 1.0 s where episode 0's rows end at 0.8 s: its
    last 2 rows would read episode 2's frames, and the file's 2 frames before it are no episode's, so its own start
    is named late."""
    root = copy_ds(make_ds(**{**SPEC, "episodes_per_file": 3}, codec="h264"))
    _set_from_timestamp(root, 1, 1.0)
    said = (
        "so its last 2 rows would read that episode's frames. Its from_timestamp in meta/episodes is most likely 2 "
        "frames late (0.800000 s ends its rows where the next episode starts; the file's frames from where the episode "
        f"before it ends are no episode's): correct videos/{CAM}/from_timestamp in meta/episodes"
    )
    _refused_when_built(root, said)


def test_remote_files_are_timed_from_their_packet_indexes_as_local_ones_from_their_headers(
    make_ds, copy_ds, tmp_path, monkeypatch
) -> None:
    """A remote dataset's files are surveyed from their packet indexes: their rate and end there are the header's
    (a file at 8 fps too), so the iterator refuses such a file alike."""
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    root = copy_ds(make_ds(**SPEC, codec="vp9"))
    _rewrite(root / ODD, fps=8, codec="vp9")
    local = open_dataset(root)
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    positions = [0, 2, 4]
    indexed = survey_camera(remote, CAM, positions, store=PacketIndexStore(tmp_path / "store")).formats
    headers = [read_file_format(local, local.video(pos, CAM).path) for pos in positions]
    assert [(f.rate, f.end_s) for f in headers] == [(10.0, 1.6), (8.0, 2.0), (10.0, 1.6)]
    for f, header in zip(indexed.values(), headers, strict=True):
        assert f.rate == pytest.approx(header.rate, rel=1e-9) and f.end_s == pytest.approx(header.end_s, abs=1e-9)
    with pytest.raises(FrameTimestampError, match=r"file-001\.mp4 \(episode 2, .*\) is written at 8 fps"):
        _build(remote)


def _stand_in(
    starts: list[float], lengths: list[int], files: list[int], headers: list[tuple[float | None, float]], fps: float
) -> tuple[Any, CameraSurvey]:
    """What the checks read of a dataset whose episode ``i`` has ``lengths[i]`` rows at ``fps`` from ``starts[i]`` s of
    file ``files[i]``, and the survey of its files, file ``k``'s header saying ``headers[k]`` (its rate and end)."""
    starts_s, in_file = np.asarray(starts, dtype=np.float64), np.asarray(files)
    later = [starts_s[(in_file == in_file[i]) & (starts_s > starts_s[i])] for i in range(len(starts))]
    next_s = np.array([s.min() if s.size else np.nan for s in later])
    paths = [f"file-{k:03d}.mp4" for k in files]

    def previous_end_s(pos: int, camera: str) -> float | None:
        before = np.flatnonzero((in_file == in_file[pos]) & (next_s == starts_s[pos]))
        return float(starts_s[before[0]] + lengths[before[0]] / fps) if before.size else None

    episodes = SimpleNamespace(
        episode_index=np.arange(len(starts)), length=np.asarray(lengths),
        cameras={CAM: SimpleNamespace(from_timestamp_s=starts_s, next_from_timestamp_s=next_s)},
    )  # fmt: skip
    info = SimpleNamespace(fps=fps, features={CAM: SimpleNamespace(declared_fps=None)})
    info.fastest_fps = partial(DatasetInfo.fastest_fps, info)  # (the real rule over the stand-in's features)
    reader = SimpleNamespace(
        fps=fps, episodes=episodes, info=info,
        video=lambda pos, camera: SimpleNamespace(path=paths[pos]), frame_lookup=lambda pos: ITERATORS_LOOKUP,
        source_of=lambda pos: "ds", previous_end_s=previous_end_s,
    )  # fmt: skip
    first: dict[str, int] = {}
    for pos, path in enumerate(paths):
        first.setdefault(path, pos)
    formats = {
        path: FileFormat("h264", 64, 96, "yuv420p", (2, False), *headers[files[pos]]) for path, pos in first.items()
    }
    return reader, CameraSurvey(CAM, formats, first)


def _timing_refusal(reader: Any, survey: CameraSurvey, **options) -> str:
    with pytest.raises(FrameTimestampError) as info:
        check_file_timing(
            reader, survey, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4, **options
        )
    return str(info.value)


def _fit_refusal(reader: Any, **options) -> str | None:
    """check_rows_fit_parts' refusal of ``reader``'s episodes (camera CAM); None where it passes them."""
    try:
        check_rows_fit_parts(reader, CAM, **options)
    except FrameTimestampError as error:
        return str(error)
    return None


@pytest.mark.parametrize("count", [5, 6])
@pytest.mark.parametrize(
    ("header", "said", "after"),
    [
        ((12.0, 1.0), "{path} (episode {k}, camera '" + CAM + "') is written at 12 fps", " (its header), but the rows"),
        ((10.0, 0.5), "{path} (camera '" + CAM + "') ends at 0.500000 s (its header: 10 fps), but episode {k}, its "
                      "last, has 8 rows at 10 fps from its from_timestamp 0.000000 s, the last at 0.700000 s",
         ": the file lost its last frames"),
    ],
)  # fmt: skip
def test_a_refusal_names_five_files_and_counts_the_others(count: int, header, said: str, after: str) -> None:
    """Files of one episode each, 8 rows at 10 fps: at 12 fps (1.2 times the rows' rate, not more: refused), or
    ending at 0.5 s, 2 frames before the last row at 0.7 s. Five are named; a sixth is counted."""
    reader, survey = _stand_in([0.0] * count, [8] * count, list(range(count)), [header] * count, fps=10)
    named = "; ".join(said.format(path=f"file-{k:03d}.mp4", k=k) for k in range(5))
    more = " (and 1 more file)" if count == 6 else ""
    assert _timing_refusal(reader, survey).startswith(f"{named}{more}{after}")


@pytest.mark.parametrize(
    ("start", "length", "unread_tail", "said"),
    [
        (0.9, 1, 0, "has 1 row at 10 fps from its from_timestamp 0.900000 s, the last at 0.900000 s: the file lost"),
        (1.1, 3, 2, "has 3 rows at 10 fps from its from_timestamp 1.100000 s, the last a sample reads at 1.100000 s "
                    "(its last 2 lie past every window: drop_n_last_frames): the file lost"),
        (1.1, 2, 2, None),
    ],
)  # fmt: skip
def test_a_files_last_episode_is_held_to_its_end_by_its_rows_read_alone(
    start: float, length: int, unread_tail: int, said: str | None
) -> None:
    """A file ending at 0.8 s, where episode 0's 8 rows end, and episode 1 from ``start``: its one row (at 0.9 s, 0.1 s
    past the end; by default every row is read), or the one of 3 a sample reads (at 1.1 s), has no frame: refused.
    With none read (2 rows, both past every window) it is held to nothing."""
    reader, survey = _stand_in([0.0, start], [8, length], [0, 0], [(10.0, 0.8)], fps=10)
    if said is None:
        check_file_timing(reader, survey, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4,
                          unread_tail=unread_tail)  # fmt: skip
        return
    assert said in _timing_refusal(reader, survey, **({"unread_tail": unread_tail} if unread_tail else {}))


@pytest.mark.parametrize(
    ("rate", "end_s", "said"),
    [
        (101.0, 200 / 101, "ends at 1.980198 s (its header: 101 fps), but episode 0, its last, has 200 rows at 100 fps "
                           "from its from_timestamp 0.000000 s, the last at 1.990000 s: the file lost its last frames"),
        (None, 1.5, "ends at 1.500000 s (its header), but episode 0, its last, has 200 rows at 100 fps from its "
                    "from_timestamp 0.000000 s, the last at 1.990000 s: the file lost its last frames"),
    ],
)  # fmt: skip
def test_a_file_at_the_rows_rate_within_the_slack_or_of_no_rate_is_told_it_lost_frames(
    rate: float | None, end_s: float, said: str
) -> None:
    """200 frames at 101 fps, 1% over 200 rows at 100 fps (as close as RATE_SLACK lets a rate be the rows'), end at
    1.980198 s, a frame before the last row's 1.99 s: a frame a row, but the rows' rate, so lost frames, not a file
    written at another rate. A header of no rate alike."""
    reader, survey = _stand_in([0.0], [200], [0], [(rate, end_s)], fps=100)
    assert _timing_refusal(reader, survey).startswith(f"file-000.mp4 (camera '{CAM}') {said}")


@pytest.mark.parametrize(
    ("fps", "length", "starts", "said"),
    [
        (10, 8, [0.0, 0.7, 1.4],
         "episode 0's rows run past its part of file-000.mp4 (2 episodes in all): its 8 rows at 10 fps from its "
         "from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the file starts at 0.700000 s (its "
         "from_timestamp), so its last row would read that episode's frames. The next episode's from_timestamp in "
         "meta/episodes is most likely 1 frame early (0.800000 s, where these rows end; this one cannot start "
         f"earlier): correct videos/{CAM}/from_timestamp in meta/episodes, or leave the episode out with "
         "episodes=[...]"),
        (2, 4, [0.25, 1.75], "episode 0's rows run past its part of file-000.mp4: its 4 rows at 2 fps from its "
         "from_timestamp 0.250000 s end at 1.750000 s, but the next episode of the file starts at 1.750000 s (its "
         "from_timestamp), so its last row would read that episode's frames. The video holds fewer frames"),
    ],
)  # fmt: skip
def test_the_first_episode_whose_rows_overrun_the_next_is_named(
    fps: int, length: int, starts: list[float], said: str
) -> None:
    """Episodes of 8 rows 7 frames apart (0.7 s at 10 fps): the first two each run a row into the next one's part; the
    first is named, the others counted, and as it starts the file, the next one's start is named early. Of 4 rows at
    2 fps from 0.25 s, half a frame after the file's start, a row into the next: it could start a frame earlier, so
    neither start is named."""
    reader, _ = _stand_in(starts, [length] * len(starts), [0] * len(starts), [(float(fps), 9.0)], fps=fps)
    refusal = _fit_refusal(reader)
    assert refusal is not None and refusal.startswith(f"ds: camera '{CAM}': {said}")


def test_late_starts_of_several_files_last_episodes_say_the_first_files() -> None:
    """Two files' last episodes start late: file 0's (a 20 fps file ending at 1.66 s) 1 frame short, where the 2 frames
    from 0.8 s, where the episode before it ends, to its start at 1.0 s are no episode's; file 1's 3 frames short, 3
    frames late (1.1 s). The first's start and count are said."""
    reader, survey = _stand_in([0.0, 1.0, 0.0, 1.1], [8] * 4, [0, 0, 1, 1], [(20.0, 1.66), (10.0, 1.6)], fps=10)
    assert _timing_refusal(reader, survey) == (
        f"file-000.mp4 (camera '{CAM}') ends at 1.660000 s (its header: 20 fps), but episode 1, its last, has 8 "
        f"rows at 10 fps from its from_timestamp 1.000000 s, the last at 1.700000 s; file-001.mp4 (camera '{CAM}') "
        "ends at 1.600000 s (its header: 10 fps), but episode 3, its last, has 8 rows at 10 fps from its "
        "from_timestamp 1.100000 s, the last at 1.800000 s: the file is not cut short, its frames from where the "
        "episode before it ends (its from_timestamp + its length / fps) to this episode's from_timestamp are no "
        "episode's: the episode's from_timestamp in meta/episodes is most likely 1 frame late (0.900000 s ends its "
        f"rows at the file's last frame): correct videos/{CAM}/from_timestamp in meta/episodes, or leave the episode "
        "out with episodes=[...]"
    )


@pytest.mark.parametrize(("declared", "refused"), [(None, True), (5.0, True), (30.0, False)])
def test_a_file_of_no_rate_is_held_to_half_a_frame_at_the_faster_of_the_rows_and_declared_rate(
    declared: float | None, refused: bool
) -> None:
    """A file whose header says no rate: episode 0's last row at 0.7 s lies 0.04 s before episode 1's start (0.74 s).
    Half a frame at the faster of the rows' 10 fps and info.json's declared rate: 0.05 s where none or a slower 5 fps
    is declared (refused), 0.0167 s where 30 is (it passes); at the slower of the two it would refuse that too."""
    reader, _ = _stand_in([0.0, 0.74], [8, 8], [0, 0], [(None, 9.0)], fps=10)
    reader.info.features[CAM].declared_fps = declared
    refusal = _fit_refusal(reader, rates={})
    if not refused:
        assert refusal is None
        return
    assert refusal is not None and refusal.startswith(
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: its 8 rows at 10 fps from its "
        "from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the file starts at 0.740000 s"
    )


@pytest.mark.parametrize(("start", "refused"), [(0.7503, True), (0.7506, False)])
def test_rows_over_a_file_slower_within_the_slack_are_held_to_half_its_frame(start: float, refused: bool) -> None:
    """A 9.9 fps file under 10 fps rows (within RATE_SLACK: its rate is the rows'): half its frame is 0.050505 s, more
    than half a row's 0.05 s. Episode 1 from 0.7503 s, 0.0503 s after episode 0's last row: refused (its last row,
    the one past), though within half a row; from 0.7506 s it passes."""
    reader, _ = _stand_in([0.0, start], [8, 8], [0, 0], [(9.9, 9.0)], fps=10)
    refusal = _fit_refusal(reader, rates={"file-000.mp4": 9.9})
    if not refused:
        assert refusal is None
        return
    assert refusal is not None and refusal.startswith(
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: its 8 rows at 10 fps from its "
        "from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the file starts at 0.750300 s (its "
        "from_timestamp), so its last row would read that episode's frames."
    )


@pytest.mark.parametrize(
    ("unread_tail", "said"),
    [
        (0, "its 8 rows at 10 fps from its from_timestamp 0.000000 s end at 0.700000 s, but the next episode of the "
            "file starts at 0.620000 s (its from_timestamp), so its last 2 rows would read that episode's frames. The "
            "next episode's from_timestamp in meta/episodes is most likely 2 frames early (0.800000 s, where"),
        (1, "its 8 rows at 10 fps from its from_timestamp 0.000000 s, the last a sample reads at 0.600000 s (its last "
            "1 lie past every window: drop_n_last_frames), but the next episode of the file starts at 0.620000 s (its "
            "from_timestamp), so its last row read would read that episode's frames. The next episode's "
            "from_timestamp in meta/episodes is most likely 1 frame early (0.700000 s, where"),
        (2, None),
    ],
)  # fmt: skip
def test_rows_no_sample_reads_do_not_run_into_the_next_episodes_part(unread_tail: int, said: str | None) -> None:
    """Episode 1 from 0.62 s, within episode 0's 8 rows (to 0.7 s): its last 2 rows run into episode 1's part. With the
    last one past every window (drop_n_last_frames), the last row read (0.6 s) still does, and is said so; with 2,
    the last read (0.5 s) lies 0.12 s before episode 1's start: it passes."""
    reader, _ = _stand_in([0.0, 0.62], [8, 8], [0, 0], [(10.0, 9.0)], fps=10)
    refusal = _fit_refusal(reader, unread_tail=unread_tail)
    if said is None:
        assert refusal is None
        return
    assert refusal is not None and refusal.startswith(
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: {said}"
    )


def test_rows_overrunning_by_a_floats_rounding_are_said_to_run_a_row_past() -> None:
    """Episode 0's 2 rows from 0.05 s end at 0.15 s, half a frame before episode 1's start at 0.2 s by their decimals,
    under it by their floats' (0.2 - 0.15 is 0.04999...): refused, and its last row named, not "its last 0 rows"."""
    reader, _ = _stand_in([0.05, 0.2], [2, 8], [0, 0], [(10.0, 9.0)], fps=10)
    refusal = _fit_refusal(reader, rates={"file-000.mp4": 10.0})
    assert refusal is not None and refusal.startswith(
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: its 2 rows at 10 fps from its "
        "from_timestamp 0.050000 s end at 0.150000 s, but the next episode of the file starts at 0.200000 s (its "
        "from_timestamp), so its last row would read that episode's frames."
    )


@pytest.mark.parametrize(("length", "unread_tail"), [(1, 0), (3, 2)])
def test_an_episode_of_one_row_read_is_held_to_the_next_ones_start(length: int, unread_tail: int) -> None:
    """Episode 0's one row read (of 1, or of 3 with 2 past every window), at 0.0 s, 0.03 s before episode 1's start:
    it would read episode 1's frame, refused as a longer episode's last row is."""
    reader, _ = _stand_in([0.0, 0.03], [length, 8], [0, 0], [(10.0, 9.0)], fps=10)
    refusal = _fit_refusal(reader, unread_tail=unread_tail)
    said = (
        " end at 0.000000 s"
        if not unread_tail
        else ", the last a sample reads at 0.000000 s (its last 2 lie past every window: drop_n_last_frames)"
    )
    assert refusal == (
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: its {length} row"
        f"{'s' if length > 1 else ''} at 10 fps from its from_timestamp 0.000000 s{said}, but the next episode of the "
        f"file starts at 0.030000 s (its from_timestamp), so its last row{' read' if unread_tail else ''} would read "
        "that episode's frames. The next episode's from_timestamp in meta/episodes is most likely 1 frame early "
        "(0.100000 s, where these rows end; this one cannot start earlier): correct "
        f"videos/{CAM}/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]"
    )


@pytest.mark.parametrize(
    ("rate", "why"),
    [
        (9.5, "it has fewer frames than its rows"),
        (10.15, "its frames drift off the rows' times"),
        (10.5, "its frames drift off the rows' times"),
        (12.5, None),
    ],
)
def test_a_files_rate_is_told_fewer_frames_under_99_percent_and_read_over_120(rate: float, why: str | None) -> None:
    """Under 10 fps rows: 9.5 fps is under FEWER_FRAMES (0.99) of them, fewer frames; 10.15 (1.5% over: past
    RATE_SLACK) and 10.5, not past MORE_FRAMES (1.2), drifting; 12.5 past it, every row has a frame near it: not
    refused."""
    reader, survey = _stand_in([0.0], [8], [0], [(rate, 1.0)], fps=10)
    if why is None:
        check_file_timing(reader, survey, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4)
        return
    assert _timing_refusal(reader, survey).startswith(
        f"file-000.mp4 (episode 0, camera '{CAM}') is written at {rate:g} fps (its header), but the rows are at "
        f"info.json's fps, 10: {why}, and rows would miss their frames"
    )


@pytest.mark.parametrize(
    ("fps", "length", "next_s", "refused"), [(4, 3, 0.625, False), (4, 3, 0.62, True), (1, 2, 1.498, True)]
)
def test_rows_exactly_half_a_frame_before_the_next_start_pass(
    fps: int, length: int, next_s: float, refused: bool
) -> None:
    """At 4 fps (half a frame 0.125 s, exact in binary), a last row at 0.5 s and the next episode from 0.625 s: not
    less than half a frame before it, so it reads its own frame; from 0.62 s it is refused. At 1 fps a row 0.498 s
    before the next start is within half a frame (0.5 s) too."""
    reader, _ = _stand_in([0.0, next_s], [length, 8], [0, 0], [(float(fps), 9.0)], fps=fps)
    rates = {"file-000.mp4": float(fps)}
    refusal = _fit_refusal(reader, rates=rates)
    if not refused:
        assert refusal is None
        return
    assert refusal is not None and refusal.startswith(
        f"ds: camera '{CAM}': episode 0's rows run past its part of file-000.mp4: its {length} rows at {fps} fps from "
        f"its from_timestamp 0.000000 s end at {(length - 1) / fps:.6f} s, but the next episode of the file starts at "
        f"{next_s:.6f} s (its from_timestamp), so its last row would read that episode's frames."
    )


@pytest.mark.parametrize(("end_s", "refused"), [(0.375, False), (0.37, True)])
def test_a_file_ending_exactly_half_a_frame_before_the_last_row_is_left_to_the_lookup(
    end_s: float, refused: bool
) -> None:
    """3 rows at 4 fps, the last at 0.5 s: a file ending at 0.375 s, exactly half a frame (0.125 s) before it, is not
    past it by more, so it is left to the lookup; ending at 0.37 s it is refused."""
    reader, survey = _stand_in([0.0], [3], [0], [(4.0, end_s)], fps=4)
    if not refused:
        check_file_timing(reader, survey, timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=1e-4)
        return
    assert _timing_refusal(reader, survey).startswith(
        f"file-000.mp4 (camera '{CAM}') ends at 0.370000 s (its header: 4 fps), but episode 0, its last, has 3 rows "
        "at 4 fps from its from_timestamp 0.000000 s, the last at 0.500000 s: the file lost its last frames"
    )
