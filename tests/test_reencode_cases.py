"""``reencode_dataset``'s plan of work (how many files at once, each worker's threads), what it logs per file and
in all, the copy's rewritten info.json, and the checks that keep a copy from an earlier run or refuse it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from lerobot_dali import reencode
from lerobot_dali.errors import DatasetError, VideoDecodeError
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.reencode import _check_same_frames, _finished_copy, reencode_dataset
from tests.test_reencode import _files

CAM = "observation.images.cam0"
FIRST, SECOND = (f"videos/{CAM}/chunk-000/file-00{i}.mp4" for i in range(2))


@pytest.fixture
def tiny(make_ds) -> Path:
    """v3.0, one AV1 camera, two video files (5 and 4 frames): the smallest dataset with two files to encode."""
    return make_ds(episodes=2, frames_per_episode=[5, 4], cameras=1, size=(64, 64), codec="av1", episodes_per_file=1)


@pytest.mark.parametrize(
    ("cpus", "jobs", "workers", "threads"),
    [
        (8, None, 2, 4),  # one worker per file, the CPUs shared out among them
        (3, None, 2, 1),  # fewer CPUs than workers twice over: one thread each, never none
        (8, 1, 1, 8),  # jobs= caps the workers; the one worker gets every CPU
    ],
)
def test_the_workers_and_their_threads_follow_the_cpus_and_jobs(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, cpus: int, jobs: int | None, workers: int,
    threads: int,
) -> None:  # fmt: skip
    """One worker per file at most (``jobs`` or one per CPU), each encoding with its share of the CPUs; local files
    are read by path (no filesystem sent to the workers), with no progress bar unless asked. The jobs are only
    recorded here (no worker starts), so the copy holds every file but the videos."""
    calls: list[tuple[list[Any], int, bool]] = []

    def record(job_list: list[Any], n: int, *, progress: bool) -> list[Any]:
        calls.append((job_list, n, progress))
        return []

    monkeypatch.setattr(reencode, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(reencode, "_run_jobs", record)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        report = reencode_dataset(tiny, tmp_path / "out", jobs=jobs)
    [(job_list, n, progress)] = calls
    assert (n, progress) == (workers, False)
    assert [(j.relative, j.source, j.target, j.filesystem) for j in job_list] == [
        (r, str(tiny / r), str(tmp_path / ".out.partial" / r), None) for r in (FIRST, SECOND)
    ]
    assert {(j.camera, j.codec, j.gop, j.crf, j.threads) for j in job_list} == {(CAM, "h264", 2, None, threads)}
    others = len(_files(tiny)) - 3  # (two videos, and info.json written with the new codec)
    assert f"re-encoding 2 video file(s) of {tiny} to h264 GOP 2 ({workers} at once); copying {others} other " in (
        caplog.text
    )
    assert (report.videos, report.copied_files) == ((), others)
    assert list(_files(tmp_path / "out")) == [f for f in _files(tiny) if f not in (FIRST, SECOND)]


def test_info_json_is_rewritten_as_json_indented_by_4_only_where_a_codec_changed(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The copy's info.json is the source's with the new codec, written as LeRobot writes it (4-space indent, a
    final newline); re-encoded in the source's own codec it is copied byte for byte, and the log says no rewrite."""
    monkeypatch.setattr(reencode, "_run_jobs", lambda job_list, n, *, progress: [])
    reencode_dataset(tiny, tmp_path / "h264", jobs=1)
    info = json.loads((tiny / "meta/info.json").read_text())
    assert info["features"][CAM]["info"]["video.codec"] == "av1"
    info["features"][CAM]["info"]["video.codec"] = "h264"
    assert (tmp_path / "h264/meta/info.json").read_text() == json.dumps(info, indent=4) + "\n"
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        caplog.clear()  # (the first re-encode's lines: logged where an earlier test left the logger at INFO)
        report = reencode_dataset(tiny, tmp_path / "av1", codec="av1", jobs=1)
    assert (tmp_path / "av1/meta/info.json").read_bytes() == (tiny / "meta/info.json").read_bytes()
    others = len(_files(tiny)) - 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("re-encoding ")]
    assert said == [f"re-encoding 2 video file(s) of {tiny} to av1 GOP 2 (1 at once); copying {others} other file(s)"]
    assert report.copied_files == others


def test_a_camera_without_video_files_is_refused_as_nothing_to_reencode(tiny: Path, copy_ds, tmp_path: Path) -> None:
    """Chosen cameras with no video file under videos/ (all deleted) leave nothing to do: said as such, before any
    work, not a ZeroDivisionError from sharing the CPUs among no workers."""
    root = copy_ds(tiny)
    shutil.rmtree(root / "videos")
    with pytest.raises(DatasetError) as refused:
        reencode_dataset(root, tmp_path / "out", jobs=1)
    assert str(refused.value) == f"{root}: no video file of ['{CAM}'] found under videos/; nothing to re-encode"
    assert sorted(tmp_path.iterdir()) == [root]


def _line_args(v: reencode.VideoReencoded) -> tuple[Any, ...]:
    """What the line of re-encoded video ``v`` says: its report's numbers, sizes in MB."""
    resumed = " (re-encoded by an earlier run)" if v.resumed else ""
    before, after = v.decoded_per_frame_before, v.decoded_per_frame_after
    return (v.path, v.frames, before, after, v.bytes_before / 1e6, v.bytes_after / 1e6, v.seconds, resumed)


def test_each_file_and_the_count_are_logged_and_a_resumed_file_says_so(
    tiny: Path, copy_ds, tmp_path: Path, caplog
) -> None:
    """Each file's INFO line carries its report's numbers (sizes in MB), and " (re-encoded by an earlier run)" for a
    file an earlier, failed run finished; the count (asked for with ``progress``) ends at every file done."""
    root = copy_ds(tiny)
    sound = (root / SECOND).read_bytes()
    (root / SECOND).write_bytes(bytes(len(sound)))  # (the same size: the plan's file sizes still hold)
    out = tmp_path / "out"
    with pytest.raises(VideoDecodeError):
        reencode_dataset(root, out, jobs=1)
    assert (tmp_path / ".out.partial" / FIRST).is_file()
    (root / SECOND).write_bytes(sound)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        report = reencode_dataset(root, out, jobs=1, progress=True)
    assert [(v.path, v.resumed) for v in report.videos] == [(FIRST, True), (SECOND, False)]
    lines = [r.args for r in caplog.records if "frames decoded per frame" in r.msg]
    assert sorted(lines) == [_line_args(v) for v in report.videos]
    assert [v.frames for v in report.videos] == [5, 4]
    counts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lerobot-dali reencode: ")]
    assert re.fullmatch(r"lerobot-dali reencode: 2/2 videos \(\d+ s\)", counts[-1]), counts


def test_an_earlier_runs_copy_with_other_frames_is_removed_and_encoded_again(
    tiny: Path, tmp_path: Path, caplog
) -> None:
    """A copy that opens as a video but holds other frames than its source (here the other file's 5 for its 4) is
    not taken as finished: it is removed, with a warning saying why; one holding the same frames is kept."""
    before = build_packet_index(tiny / SECOND)
    target = tmp_path / "file-001.mp4"
    shutil.copyfile(tiny / FIRST, target)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.reencode"):
        assert _finished_copy(target, before) is None
    assert not target.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"{target}: its copy from an earlier run does not check ({tiny / SECOND}: the re-encode holds 5 frames, the "
        "source shows 4, or some frame moved in time; it was not kept); encoding it again"
    ]
    shutil.copyfile(tiny / SECOND, target)
    after = _finished_copy(target, before)
    assert after is not None and after.shown_pts.tolist() == before.shown_pts.tolist() and len(before.shown_pts) == 4
    assert target.exists()


def _index(pts: list[int], time_base: Fraction) -> Any:
    return SimpleNamespace(
        shown_pts=np.array(pts), frame_count=len(pts), time_base=time_base, source_name="cam.mp4"
    )  # fmt: skip


def test_frames_are_compared_by_instant_across_time_bases(caplog) -> None:
    """Frames are the same where their instants are (pts times time base, exact), whatever the time bases: 2/30 s
    is 1/15 s. Nothing is hidden, so nothing is said."""
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.reencode"):
        _check_same_frames(_index([0, 2, 4], Fraction(1, 30)), _index([0, 1, 2], Fraction(1, 15)))
    assert caplog.records == []
    with pytest.raises(VideoDecodeError, match="holds 3 frames, the source shows 3, or some frame moved"):
        _check_same_frames(_index([0, 1, 2], Fraction(1, 30)), _index([0, 1, 2], Fraction(1, 15)))
