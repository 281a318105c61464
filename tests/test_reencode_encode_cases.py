"""``lerobot_dali.reencode``'s steps one at a time, in this process (a whole re-encode runs them in workers): what
one file's re-encode hands its decoder and encoder, what it logs, flushes and closes, and what the resume folder's
check writes and says. Each case is one no whole re-encode in tests/test_reencode.py shows."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

from lerobot_dali import reencode
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_marker import draw_marker, read_full_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.video_encoding import CODECS
from tests.video_fixtures import reference_frames, remux

FPS = 15
FRAMES = 8
RELATIVE = "videos/observation.images.cam0/chunk-000/file-000.mp4"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset's video as ``make_dataset`` writes it (AV1, yuv420p, no audio), at ``RELATIVE`` under its root;
    128 pixels high, so that libx264 may slice a frame between threads."""
    root = tmp_path_factory.mktemp("source")
    path = root / RELATIVE
    path.parent.mkdir(parents=True)
    encode_video(path, [draw_marker(0, f, 128, 128) for f in range(FRAMES)], fps=FPS, codec="av1", gop=30)
    return path


def _job(source: Path | str, target: Path, *, codec: str = "h264", filesystem: Any = None) -> reencode._Job:
    return reencode._Job(str(source), filesystem, str(target), RELATIVE, "observation.images.cam0", codec, 2, None, 1)


def _reencode_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.reencode"]


def test_a_plain_video_is_reencoded_without_a_warning(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The audio and pixel-format warnings are for videos that have audio or another pixel format; said of every
    file, each of a dataset's files would warn of what it does not have."""
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.reencode"):
        video = reencode._reencode_file(_job(source, tmp_path / "copy.mp4"))
    assert _reencode_messages(caplog) == []
    assert (video.path, video.frames, video.resumed) == (RELATIVE, FRAMES, False)


def test_a_videos_seconds_are_the_time_its_reencode_took(source: Path, tmp_path: Path) -> None:
    """``seconds`` (logged for each file) is the time from the start of the file's re-encode to its end, so within
    the time the call took."""
    started = time.perf_counter()
    video = reencode._reencode_file(_job(source, tmp_path / "copy.mp4"))
    took = time.perf_counter() - started
    assert 0 < video.seconds <= took


def test_the_copy_keeps_the_frame_rate_and_the_jobs_encoder_threads(source: Path, tmp_path: Path) -> None:
    """The encoder is told the source's frame rate, which gives the copy's last frame its duration (told 30 fps, that
    frame lasts 1/30 s and the copy's mean rate is no longer the source's 15), and the job's thread count (the
    workers share the CPUs), which libx264 writes into the copy's settings."""
    copy = tmp_path / "copy.mp4"
    reencode._reencode_file(_job(source, copy))
    with av.open(str(source)) as before, av.open(str(copy)) as after:
        assert before.streams.video[0].average_rate == after.streams.video[0].average_rate == FPS
        packets = [packet for packet in after.demux(video=0) if packet.size]
        assert [packet.duration * packet.time_base for packet in packets] == [Fraction(1, FPS)] * FRAMES
    settings = re.search(rb"x264 - core [^\x00]*", copy.read_bytes())
    assert settings is not None
    assert re.findall(rb" threads=\d+", settings.group()) == [b" threads=1"]  # (libx264 picks 2 or more itself)


def _without_a_frame_rate(path: Path, out: Path) -> Path:
    """``path``'s first frame alone in ``out``, with no duration and no edit list: a file whose stream has neither an
    average nor a guessed frame rate."""
    with av.open(str(path)) as src, av.open(str(out), "w", format="mp4", options={"use_editlist": "0"}) as dst:
        stream = dst.add_stream_from_template(src.streams.video[0], opaque=True)
        packet = next(packet for packet in src.demux(video=0) if packet.size)
        packet.stream, packet.duration = stream, 0
        dst.mux(packet)
    return out


def test_a_video_without_a_frame_rate_is_reencoded_at_30_fps(source: Path, tmp_path: Path) -> None:
    """With no rate in the source the encoder is told 30 fps, which the copy's one frame lasts."""
    bare = _without_a_frame_rate(source, tmp_path / "bare.mp4")
    with av.open(str(bare)) as container:
        assert (container.streams.video[0].average_rate, container.streams.video[0].guessed_rate) == (None, None)
    copy = tmp_path / "copy.mp4"
    assert reencode._reencode_file(_job(bare, copy)).frames == 1
    with av.open(str(copy)) as container:
        assert container.streams.video[0].average_rate == 30
        assert [p.duration * p.time_base for p in container.demux(video=0) if p.size] == [Fraction(1, 30)]


def test_frames_off_the_frame_rates_grid_keep_their_instants(tmp_path: Path) -> None:
    """The encoder works in the source's time base: in 1/rate's (15 fps) a frame between two of its ticks would be
    rounded onto one, and the copy refused as moved in time."""
    source, time_base, pts = tmp_path / "uneven.mp4", Fraction(1, 15360), [0, 1000, 2100, 3000, 4444, 5120]
    with av.open(str(source), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.time_base = stream.time_base = time_base
        stream.options = {"bf": "0", "g": "2"}
        for i, at in enumerate(pts):
            frame = av.VideoFrame.from_ndarray(draw_marker(0, i, 64, 96), format="rgb24")
            frame.pts, frame.time_base = at, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    copy = tmp_path / "copy.mp4"
    assert reencode._reencode_file(_job(source, copy)).frames == len(pts)
    with av.open(str(copy)) as container:
        stream = container.streams.video[0]
        assert [frame.pts * stream.time_base for frame in container.decode(stream)] == [at * time_base for at in pts]


def test_progress_is_said_each_time_progress_every_s_has_passed_since_it_was_last_said(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A clock that moves 10 s at each reading, against ``PROGRESS_EVERY_S`` of 30: the first line once 30 s have
    passed since the start (frame 2), the next 30 s after that line (frame 5), not after each frame."""
    clock = itertools.count(0.0, 10.0)
    monkeypatch.setattr(reencode, "PROGRESS_EVERY_S", 30.0)
    monkeypatch.setattr(reencode, "time", SimpleNamespace(monotonic=clock.__next__, perf_counter=time.perf_counter))
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        reencode._reencode_file(_job(source, tmp_path / "copy.mp4"))
    lines = [message for message in _reencode_messages(caplog) if message.endswith("frames re-encoded")]
    assert lines == [f"{source}: {done} of {FRAMES} frames re-encoded" for done in (2, 5)]


def test_the_source_is_decoded_with_the_jobs_threads(source: Path, tmp_path: Path) -> None:
    """The decoder takes the job's thread count, frame and slice threads both, as the encoder does (a worker's
    share of the CPUs), not FFmpeg's default (slices only, as many threads as it likes)."""
    copy = tmp_path / "copy.mp4"
    with av.open(str(source)) as container:
        reencode._encode(container, _job(source, copy), copy, build_packet_index(source))
        stream = container.streams.video[0]
        assert (stream.thread_type, stream.codec_context.thread_count) == (av.codec.context.ThreadType.AUTO, 1)


def test_frames_without_a_timestamp_are_refused(tmp_path: Path) -> None:
    """A decoded frame without a pts (here from a raw H.264 stream) has no place to keep in the copy: refused, not
    handed to the encoder."""
    mp4, raw = tmp_path / "h264.mp4", tmp_path / "h264.h264"
    encode_video(mp4, [draw_marker(0, f, 64, 96) for f in range(4)], fps=FPS, codec="h264", gop=2)
    remux(mp4, raw, "h264")
    index = build_packet_index(mp4)
    with av.open(str(raw)) as container, pytest.raises(VideoDecodeError) as refused:
        reencode._encode(container, _job(mp4, tmp_path / "copy.mp4"), tmp_path / "copy.mp4", index)
    assert str(refused.value) == f"{mp4}: a decoded frame has no timestamp; it cannot keep its place."


def test_the_copy_is_on_disk_before_it_is_named_finished(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole copy is flushed to disk under its ``.unfinished`` name, so a power loss never leaves a stub under
    the finished name that a resume would take as done."""
    real_fsync, synced = os.fsync, []

    def fsync(fd: int) -> None:
        stat = os.fstat(fd)
        synced.append((stat.st_ino, stat.st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    copy = tmp_path / "copy.mp4"
    reencode._reencode_file(_job(source, copy))
    finished = copy.stat()
    assert [s for s in synced if s[0] == finished.st_ino] == [(finished.st_ino, finished.st_size)]
    assert sorted(tmp_path.iterdir()) == [copy]


class _Bucket(DirFileSystem):
    """A remote file system (paths relative to its folder) that keeps every file it opened."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened: list[Any] = []

    def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
        handle = super().open(path, *args, **kwargs)
        self.opened.append(handle)
        return handle


def test_a_remote_sources_files_are_closed_and_its_failure_is_told_from_it(source: Path, tmp_path: Path) -> None:
    """PyAV leaves a file object it was handed open: the re-encode closes the remote file it opened (a worker
    re-encodes file after file). A failure's message decodes the remote file alone through its file system, not as a
    local path (where it is not: "cannot be opened again")."""
    bucket = _Bucket(path=str(source.parents[3]), fs=LocalFileSystem())
    copy = tmp_path / "copy.mp4"
    video = reencode._reencode_file(_job(RELATIVE, copy, filesystem=bucket))
    assert video.frames == FRAMES and bucket.opened and all(handle.closed for handle in bucket.opened)
    before, after = reference_frames(source), reference_frames(copy)
    assert [read_full_marker(after[pts]) for pts in sorted(after)] == [
        read_full_marker(before[pts]) for pts in sorted(before)
    ]
    assert not Path(RELATIVE).exists()  # (relative to this process's folder: only the bucket has it)
    error = reencode._reencode_failed(_job(RELATIVE, copy, filesystem=bucket), RELATIVE, OSError("disk full"))
    assert str(error) == (
        f"{RELATIVE}: re-encoding failed (disk full), though the file decodes alone: the fault is the h264 encoder's "
        "or writing the copy's, not the file's: check that the disk holding the copy has room, or re-encode in "
        f"another codec (codec= one of {list(CODECS)}; on the command line --codec) or at another crf (crf=, --crf)"
    )
    assert all(handle.closed for handle in bucket.opened)


def test_a_new_plan_is_written_without_a_word_and_a_resume_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a file system that locks, a new unfinished copy gets its plan and no warning; one holding this plan is
    resumed, which is said."""
    folder = tmp_path / ".out.partial"
    folder.mkdir()
    plan = {"source": "user/tiny", "codec": "h264", "gop": 2, "files": {"meta/info.json": 10}}
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        with reencode._resumable(folder, plan):
            assert json.loads((folder / ".reencode-plan.json").read_text()) == plan
        assert _reencode_messages(caplog) == []
        with reencode._resumable(folder, plan):
            pass
    assert _reencode_messages(caplog) == [f"resuming the unfinished re-encode in {folder}"]
