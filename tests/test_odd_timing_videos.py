"""Videos whose frame times are not ``k / fps``, looked up and decoded by every CPU route.

NTSC rates (30000/1001), a variable frame rate, a start long after 0 s (a late episode of a long file, where float32
rows are coarse) and an edit list that hides the first frames: each file is decoded once in full by PyAV alone, and
the frame lookup (exact, float32-rounded and halfway query times) and each route's pixels are checked against it.
Cases kept from a fuzz of these routes (20 generated files, 4 real datasets; none differed).
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali.clips import build_clip, plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.frame_lookup import nearest_frame_indices
from lerobot_dali.frame_marker import draw_marker, read_marker
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from lerobot_dali.pyav_reader import PyAvReader
from lerobot_dali.video_encoding import encoder_settings

HEIGHT, WIDTH = 64, 96
# Request order as a batch gives it: unsorted, a repeat, frames of several GOPs.
WINDOW = np.array([17, 3, 3, 0, 29, 16, 8])


@dataclass(frozen=True)
class Case:
    codec: str
    time_base: Fraction
    pts: tuple[int, ...]
    container: str = "mp4"


def _variable_rate_pts() -> tuple[int, ...]:
    steps = np.random.default_rng(3).integers(25, 60, 29)  # 17-40 fps, in milliseconds
    return tuple(int(p) for p in np.concatenate(([0], np.cumsum(steps))))


CASES = {
    # NTSC frame times start 1.5 s in: 1001/30000 s apart, none a whole multiple of 1/30; B-frames.
    "h264_ntsc_late_start": Case("h264", Fraction(1, 30000), tuple(45045 + 1001 * i for i in range(30))),
    # Frame times of a recorder that drops frames: 25-59 ms apart.
    "av1_variable_rate": Case("av1", Fraction(1, 1000), _variable_rate_pts()),
    # 3,000 s in: a float32 time is 244 us coarse there; Matroska, so read by seeking and demuxing.
    "vp9_at_3000_s": Case("vp9", Fraction(1, 30), tuple(90000 + i for i in range(30)), "matroska"),
    # Frames at negative times: the MP4 muxer writes an edit list that hides them; only those from 0 s are shown.
    "vp9_edit_list": Case("vp9", Fraction(1, 30), tuple(i - 5 for i in range(35))),
}


def _encode(path: Path, case: Case) -> Path:
    settings = encoder_settings(case.codec, gop=8)
    step = int(np.median(np.diff(case.pts)))
    with av.open(str(path), "w", format=case.container) as container:
        stream = container.add_stream(settings.encoder, rate=1 / (case.time_base * step))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.time_base = case.time_base
        stream.time_base = case.time_base
        stream.options = settings.options
        for i, pts in enumerate(case.pts):
            frame = av.VideoFrame.from_ndarray(draw_marker(0, i, HEIGHT, WIDTH), format="rgb24")
            frame.pts, frame.time_base = pts, case.time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@dataclass(frozen=True)
class Shown:
    """A file decoded in full by PyAV alone: the exact time and the RGB pixels of each frame it shows."""

    times: list[Fraction]
    rgb: list[np.ndarray]

    def nearest(self, time: Fraction) -> int:
        """The frame nearest ``time``, exactly; a tie goes to the earlier frame."""
        later = int(np.searchsorted(np.array(self.times, dtype=object), time, side="left"))
        if later in (0, len(self.times)):
            return min(later, len(self.times) - 1)
        return later - 1 if time - self.times[later - 1] <= self.times[later] - time else later


def _decode_all(source: Path | bytes) -> Shown:
    times, rgb = [], []
    with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            times.append(Fraction(frame.pts) * stream.time_base)
            rgb.append(frame.to_ndarray(format="rgb24"))
    assert times == sorted(times)
    return Shown(times, rgb)


@pytest.fixture(scope="module", params=sorted(CASES))
def video(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PacketIndex, Shown]:
    case = CASES[request.param]
    suffix = "mp4" if case.container == "mp4" else "mkv"
    path = _encode(tmp_path_factory.mktemp("odd") / f"{request.param}.{suffix}", case)
    index, shown = build_packet_index(path), _decode_all(path)
    assert len(shown.times) == len(index.shown_pts_s) == 30
    assert [float(t) for t in shown.times] == index.shown_pts_s.tolist()
    return path, index, shown


def test_queries_read_the_exactly_nearest_frame(video: tuple[Path, PacketIndex, Shown]) -> None:
    """Each frame's own time, that time as a float32 episode time (an episode from 0 s: the file's time itself, as
    rows of one long episode store it), and the times halfway between two frames (10 fps rows over 20 fps video
    land there; tolerance_s half a frame), as float64 and as float32: each reads the frame an exact computation
    names, a halfway one the earlier of the two."""
    _, index, shown = video
    times = shown.times
    halfway = [(a + b) / 2 for a, b in itertools.pairwise(times)]
    half_gap_s = float(max(b - a for a, b in itertools.pairwise(times))) / 2
    for exact, tolerance_s in ((times, 1e-4), (halfway, half_gap_s + 1e-4)):
        want = [shown.nearest(t) for t in exact]
        as_float32 = np.array([float(t) for t in exact], dtype=np.float32)
        rounding_s = np.spacing(as_float32).astype(np.float64) / 2
        for queries, rounding in (([float(t) for t in exact], 0.0), (as_float32.astype(np.float64), rounding_s)):
            got = nearest_frame_indices(index, queries, tolerance_s=tolerance_s, rounding_s=rounding)
            assert (got - index.shown.start).tolist() == want
    assert [shown.nearest(t) for t in halfway] == list(range(len(halfway)))  # (every halfway query is a tie)


def test_every_cpu_route_gives_the_full_decodes_pixels(video: tuple[Path, PacketIndex, Shown]) -> None:
    """The window's frames, in request order, from the local MP4's packet reader (or the Matroska seeking reader),
    the seeking reader itself, the packets alone, and a clip decoded by PyAV alone at its relative indices: each the
    full decode's frame, pixel for pixel."""
    path, index, shown = video
    frames = WINDOW + index.shown.start
    want = [shown.rgb[i] for i in WINDOW]
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    reader = PyAvReader(path, filesystem=None, threads=1, label=str(path))
    try:
        plan = plan_clip(index, frames)
        by_pts = reader.frames_at(index, plan, frames, lambda f: f.to_ndarray(format="rgb24"))
        routes = {
            "decode": list(decoder.decode(path, index, frames)),
            "seeking reader": [by_pts[int(p)] for p in index.pts_of_frames(frames)],
            "packets": list(decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))),
        }
    finally:
        reader.close()
        decoder.close()
    clip = build_clip(path, index, frames)
    in_clip = _decode_all(clip.data.tobytes())
    assert len(in_clip.rgb) == clip.frame_count
    routes["clip"] = [in_clip.rgb[i] for i in clip.relative_indices]
    for route, got in routes.items():
        assert len(got) == len(want), route
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert np.array_equal(a, b), f"{route}: request {i} (frame {WINDOW[i]}) differs"


def test_dali_cpu_decodes_vp9_clips_to_the_requested_frames(video: tuple[Path, PacketIndex, Shown]) -> None:
    """DALI's CPU decoder (VP9) numbers a clip's frames as the plan does, hidden frames included in the clip: each
    requested frame carries its own marker."""
    path, index, _ = video
    if index.codec != "vp9":
        pytest.skip("DALI's CPU decoder reads VP9 only")
    from lerobot_dali.dali_video import decode_clip_batch

    frames = WINDOW + index.shown.start
    clip = build_clip(path, index, frames)
    (decoded,) = decode_clip_batch([clip.data], [clip.relative_indices], device_id=None)
    markers = [read_marker(np.asarray(frame)) for frame in decoded]
    assert [f for _, f in markers] == frames.tolist()  # (the marker counts the frames an edit list hides too)
