"""The rate and end a file's header declares (:func:`lerobot_dali.camera_codecs._stream_timing`), or its packet index
gives (``_index_timing``: remote files), which :mod:`lerobot_dali.file_timing` holds its episodes' rows to: files whose
rate changes part way, that start late, or whose container alone knows the duration."""

from __future__ import annotations

import io
from pathlib import Path

import av
import pytest

from lerobot_dali.camera_codecs import _index_timing, _stream_timing
from lerobot_dali.frame_marker import draw_marker
from lerobot_dali.generate import encode_video
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import FPS


@pytest.fixture(scope="module")
def vp9_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """45 frames at 30 fps, no B-frames: packets in display order."""
    path = tmp_path_factory.mktemp("timing") / "vp9.mp4"
    encode_video(path, [draw_marker(0, i, 64, 96) for i in range(45)], fps=FPS, codec="vp9", gop=10)
    return path


def _retimed(source: Path, target: Path, seconds: list[float]) -> Path:
    """``source``'s packets at times ``seconds`` (each lasting until the next; the last as long as the one before)."""
    with av.open(str(source)) as src, av.open(str(target), "w") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream)
        ends = [*seconds[1:], 2 * seconds[-1] - seconds[-2]]
        packets = (p for p in src.demux(stream) if p.dts is not None)
        for packet, start_s, end_s in zip(packets, seconds, ends, strict=True):
            packet.pts = packet.dts = round(start_s / stream.time_base)
            packet.duration = round((end_s - start_s) / stream.time_base)
            packet.stream = out
            dst.mux(packet)
    return target


def _timing(path: Path) -> tuple[float | None, float | None]:
    with av.open(str(path)) as container:
        return _stream_timing(container, container.streams.video[0])


def test_a_plain_file_declares_its_rate_and_end(vp9_file: Path) -> None:
    assert _timing(vp9_file) == (30.0, 1.5)


@pytest.mark.parametrize("name", ["vfr.mp4", "vfr.webm"])
def test_a_file_whose_rate_halves_part_way_declares_its_first_frames_rate(
    vp9_file: Path, tmp_path: Path, name: str
) -> None:
    """30 frames at 30 fps, then 15 at 15 fps: ends at 2.0 s; its average (45 frames in 2 s: 22.5) is not its rate.
    A WebM's stream declares no duration: its segment's is the end."""
    seconds = [i / 30 for i in range(30)] + [1 + i / 15 for i in range(15)]
    path = _retimed(vp9_file, tmp_path / name, seconds)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert (stream.duration is None) == name.endswith(".webm")  # else this tests nothing of the container's
    rate, end_s = _timing(path)
    assert rate == 30.0 and end_s == pytest.approx(2.0, abs=1e-3)


def test_a_file_starting_late_ends_at_its_start_and_duration(vp9_file: Path, tmp_path: Path) -> None:
    """Its frames from 2 s: the container's duration (1.5 s) leaves its start out."""
    path = _retimed(vp9_file, tmp_path / "late.mp4", [2 + i / 30 for i in range(45)])
    with av.open(str(path)) as container:
        assert container.duration / av.time_base == pytest.approx(1.5)
    assert _timing(path) == (30.0, pytest.approx(3.5))


class _Pipe(io.BytesIO):
    """An output that cannot seek back: a muxer writes no duration it learns only at the end."""

    def seekable(self) -> bool:
        return False

    def seek(self, *_: object) -> int:
        raise OSError("not seekable")


def test_a_webm_written_as_a_stream_declares_no_end(vp9_file: Path, tmp_path: Path) -> None:
    """A live WebM (recorded to a pipe): neither its stream nor its segment says how long it is."""
    pipe = _Pipe()
    with av.open(str(vp9_file)) as src, av.open(pipe, "w", format="webm") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream)
        for packet in src.demux(stream):
            if packet.dts is not None:
                packet.stream = out
                dst.mux(packet)
    path = tmp_path / "live.webm"
    path.write_bytes(pipe.getvalue())
    assert _timing(path) == (30.0, None)


def test_a_packet_index_gives_its_frames_mean_rate_and_the_end_of_its_last(vp9_file: Path, tmp_path: Path) -> None:
    """From the shown frames' times, wherever they start: the rate halving part way gives 44 intervals in 29/15 s."""
    assert _index_timing(build_packet_index(vp9_file)) == (pytest.approx(30.0), pytest.approx(1.5))
    seconds = [i / 30 for i in range(30)] + [1 + i / 15 for i in range(15)]
    vfr = build_packet_index(_retimed(vp9_file, tmp_path / "vfr.mp4", seconds))
    assert _index_timing(vfr) == (pytest.approx(44 * 15 / 29), pytest.approx(29 / 15 + 1 / 30))
    late = build_packet_index(_retimed(vp9_file, tmp_path / "late.mp4", [2 + i / 30 for i in range(45)]))
    assert _index_timing(late) == (pytest.approx(30.0), pytest.approx(3.5))


def test_a_short_files_packet_index_gives_its_rate(tmp_path: Path) -> None:
    """Under a second of frames; one frame (no interval between shown frames): its typical frame's interval."""
    frames = [draw_marker(0, i, 64, 96) for i in range(10)]
    encode_video(tmp_path / "short.mp4", frames, fps=FPS, codec="vp9", gop=10)
    assert _index_timing(build_packet_index(tmp_path / "short.mp4")) == (pytest.approx(30.0), pytest.approx(1 / 3))
    encode_video(tmp_path / "one.mp4", frames[:1], fps=FPS, codec="vp9", gop=10)
    one = build_packet_index(tmp_path / "one.mp4")
    assert _index_timing(one) == (pytest.approx(1 / one.frame_interval_s), pytest.approx(one.frame_interval_s))
