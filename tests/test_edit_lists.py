"""Frames an MP4 edit list hides: FFmpeg demuxes them, flagged to be decoded as references and never shown.

The reference is a full PyAV decode, which applies the edit list. LeRobot decodes with torchcodec or PyAV, so it
never sees a hidden frame either: a row whose time only a hidden frame matches fails its tolerance check there, and
here too (the frame lookup knows only the frames shown); every route serves, at every other time, what the full
decode shows. Before, the index numbered the hidden frames among the others and the lookup found them: at each
of the 384 hidden frames' times in 20 edited H.264, HEVC, VP9 and AV1 files, the packet routes (local file, remote
packets, DALI's clips) served a picture the full decode never shows (1,219 frames), and the open-container route
called the file corrupt.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path

import av
import fsspec
import numpy as np
import pytest

from lerobot_dali import packet_index
from lerobot_dali.clips import build_clip, plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.errors import FrameRequestError, FrameTimestampError, VideoDecodeError
from lerobot_dali.file_stamps import FileStamp
from lerobot_dali.frame_lookup import FrameRequestContext, episode_frames, nearest_frame_indices
from lerobot_dali.frame_marker import read_marker
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from lerobot_dali.packet_index_file import packet_index_bytes, read_packet_index
from lerobot_dali.video_probe import describe_index
from tests.test_clips import _encode_open_gop
from tests.video_fixtures import MarkerVideo, reference_frames, with_edit_list

#: Ticks per frame of the marker videos (30 fps in the MP4 muxer's 1/15360 time base) and ms per frame (the movie's).
_TICKS, _MS = 512, 1000 // 30

#: Edit lists from the file's own (segment duration in ms, media time: the B-frame delay), as entries.
EDITS: dict[str, Callable[[int, int], list[tuple[int, int]]]] = {
    # a stream cut from a longer recording: 5 frames before the edit's start decode as references only
    "trimmed_start": lambda duration, delay: [(duration - 5 * _MS, delay + 5 * _TICKS)],
    # the edit ends at 2 s: the last 30 frames are not shown
    "trimmed_end": lambda duration, delay: [(2000, delay)],
    # an empty edit: every frame shown, 0.1 s late
    "leading_gap": lambda duration, delay: [(100, -1), (duration, delay)],
    # a gap, then a trimmed start: hidden frames at 0 s to 0.067 s, where a LeRobot row's time may fall
    "gap_then_trimmed": lambda duration, delay: [(100, -1), (2000, delay + 5 * _TICKS)],
}


def _edited(marker_video: MarkerVideo, tmp_path: Path, codec: str, edit: str) -> Path:
    return _with_edit(marker_video(codec, 30), tmp_path / f"{codec}_{edit}.mp4", edit)


def _with_edit(source: Path, target: Path, edit: str) -> Path:
    """``source`` (an MP4 of 30 fps) written to ``target`` with its edit list replaced by ``EDITS[edit]``."""
    raw = source.read_bytes()
    duration, delay = struct.unpack_from(">Ii", raw, raw.find(b"elst") + 12)  # (version 0, first entry)
    return with_edit_list(source, target, EDITS[edit](duration, delay))


def _hidden_pts(path: Path) -> list[int]:
    """The pts FFmpeg's demuxer flags to be discarded (independent of the index)."""
    with av.open(str(path)) as container:
        return sorted(int(p.pts) for p in container.demux(video=0) if p.size and p.is_discard)


def _seconds(index: PacketIndex, pts: list[int]) -> np.ndarray:
    return np.array([float(p * index.time_base) for p in pts])


@pytest.fixture(scope="module")
def decoder() -> CpuFrameDecoder:
    return CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))


def _packet_file(decoder: CpuFrameDecoder, path: Path, index: PacketIndex, frames: np.ndarray) -> np.ndarray:
    return decoder.decode(path, index, frames)


def _open_container(decoder: CpuFrameDecoder, path: Path, index: PacketIndex, frames: np.ndarray) -> np.ndarray:
    return decoder.decode(io.BytesIO(path.read_bytes()), index, frames)  # (a file object: PyAvReader)


def _remote_packets(decoder: CpuFrameDecoder, path: Path, index: PacketIndex, frames: np.ndarray) -> np.ndarray:
    plan = plan_clip(index, frames)
    return decoder.decode_packets(index, plan, read_packet_payloads(path, index, plan))


def _clip(decoder: CpuFrameDecoder, path: Path, index: PacketIndex, frames: np.ndarray) -> np.ndarray:
    """DALI's input, decoded by PyAV (NVDEC needs a GPU; DALI's CPU decoder takes VP9 only: tested below)."""
    clip = build_clip(path, index, frames)
    with av.open(io.BytesIO(clip.data.tobytes())) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack([decoded[int(i)] for i in clip.relative_indices])


Route = Callable[[CpuFrameDecoder, Path, PacketIndex, np.ndarray], np.ndarray]

ROUTES: dict[str, Route] = {
    "packet_file": _packet_file,
    "open_container": _open_container,
    "remote_packets": _remote_packets,
    "clip": _clip,
}


@pytest.mark.parametrize("codec", ["h264", "vp9"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_the_index_knows_which_frames_a_decode_shows(
    marker_video: MarkerVideo, tmp_path: Path, codec: str, edit: str
) -> None:
    path = _edited(marker_video, tmp_path, codec, edit)
    index = build_packet_index(path)
    shown = sorted(reference_frames(path))
    assert index.shown_pts.tolist() == shown
    hidden = [] if index.hidden is None else sorted(index.pts[index.hidden].tolist())
    assert hidden == _hidden_pts(path)
    assert bool(hidden) == (edit != "leading_gap")
    assert index.frame_count == len(shown) + len(hidden)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("edit", list(EDITS))
def test_every_route_serves_what_a_full_decode_shows_and_no_hidden_frame(
    marker_video: MarkerVideo, tmp_path: Path, decoder: CpuFrameDecoder, route: str, edit: str
) -> None:
    """Every time the full decode shows a frame at finds that frame and its picture; every hidden frame's time fails
    the tolerance check; a hidden frame asked for by number is refused, on every route."""
    _serves_what_a_full_decode_shows(ROUTES[route], decoder, _edited(marker_video, tmp_path, "h264", edit))


@pytest.mark.torchcodec
@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9", "av1"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_torchcodec_serves_what_a_full_decode_shows_and_no_hidden_frame(
    marker_video: MarkerVideo, tmp_path: Path, codec: str, edit: str
) -> None:
    """CPU mode's decoder where torchcodec loads, which asks for frames by time: as above, on B-frame H.264 and HEVC,
    VP9 and AV1 (measured with torchcodec 0.17: the full decode's pictures, byte for byte, at 10,672 requested frames
    of these 16 files and the 4 unedited ones; no file handed to PyAV)."""
    torchcodec = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    _serves_what_a_full_decode_shows(_packet_file, torchcodec, _edited(marker_video, tmp_path, codec, edit))
    assert not torchcodec._pyav_files  # (torchcodec's own frames: none it misplaced went to PyAV)
    torchcodec.close()


@pytest.mark.torchcodec
@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_a_leading_picture_torchcodec_misplaces_where_the_edit_list_hides_its_gop_is_said_so(
    tmp_path: Path, codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An open GOP's leading pictures are decoded from the GOP before its keyframe. A cut start (what a stream copy
    from a time writes) hides that GOP's keyframe from the 2nd GOP's leading pictures: torchcodec 0.17 seeks past it
    and hands over the next frame for one of them (display frame 9, 1/30 s late, of these files). The file goes to
    PyAV, whose frames are the full decode's (every shown frame checked, one request each, in shuffled order);
    the warning said 'keyframes flagged where decoding cannot start: intra refresh?' of a file that has none. It now
    names the edit list."""
    source = tmp_path / "open_gop.mp4"
    _encode_open_gop(source, codec)
    path = _with_edit(source, tmp_path / "cut.mp4", "trimmed_start")
    index = build_packet_index(path)
    assert index.has_leading_pictures and index.hidden is not None  # (else this file tests nothing)
    reference = reference_frames(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.TORCHCODEC))
    with caplog.at_level("WARNING", logger="lerobot_dali.cpu_decode"):
        for frame in np.random.default_rng(0).permutation(index.shown).tolist():
            (picture,) = decoder.decode(path, index, [frame])
            np.testing.assert_array_equal(picture, reference[int(index.pts_of_frames([frame])[0])])
    decoder.close()
    (said,) = [r.getMessage() for r in caplog.records]
    assert "torchcodec gave the frame at 0.1667 s for the one at 0.1333 s" in said
    assert "its edit list hides" in said and "intra refresh" not in said


def _serves_what_a_full_decode_shows(decode: Route, decoder: CpuFrameDecoder, path: Path) -> None:
    index = build_packet_index(path)
    reference = reference_frames(path)
    shown = sorted(reference)
    frames = nearest_frame_indices(index, _seconds(index, shown), tolerance_s=1e-4)
    assert index.pts_of_frames(frames).tolist() == shown
    windows = [frames, *(frames[i : i + 3] for i in range(0, len(frames), 13)), frames[-1:]]
    for window in windows:
        for frame_number, picture in zip(window.tolist(), decode(decoder, path, index, window), strict=True):
            np.testing.assert_array_equal(picture, reference[int(index.pts_of_frames([frame_number])[0])])
    for pts in _hidden_pts(path):
        with pytest.raises(FrameTimestampError, match="its edit list hides it"):
            nearest_frame_indices(index, _seconds(index, [pts]), tolerance_s=1e-4)
    for pts in _hidden_pts(path)[:: max(1, len(_hidden_pts(path)) // 3)]:
        hidden_frame = int(np.searchsorted(index.frame_pts, pts))
        with pytest.raises(FrameRequestError, match="edit list hides"):
            decode(decoder, path, index, np.array([hidden_frame]))


def test_a_row_at_a_hidden_frame_fails_as_in_lerobot(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A gap then a trimmed start hides frames at 0, 1/30 and 2/30 s: an episode's first rows there read the hidden
    pictures before (markers (0, 3) to (0, 5), which no decoder shows); LeRobot's decode finds no frame within
    tolerance there, and the error now says why."""
    path = _edited(marker_video, tmp_path, "h264", "gap_then_trimmed")
    index = build_packet_index(path)
    context = FrameRequestContext(dataset="d", episode_index=0, camera="c", rows_fps=30)
    with pytest.raises(FrameTimestampError) as info:
        nearest_frame_indices(index, np.arange(6) / 30, tolerance_s=1e-4, context=context)
    message = str(info.value)
    assert "query timestamp 0.000000 s" in message and "3 of 6 queries fail" in message
    assert "holds a frame at 0.000000 s, but its edit list hides it" in message
    first = nearest_frame_indices(index, [0.1], tolerance_s=1e-4)
    assert read_marker(reference_frames(path)[int(index.pts_of_frames(first)[0])]) == (0, 5)


def test_dali_cpu_decodes_clips_of_an_edited_vp9_file(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """DALI's CPU decoder (VP9) on the clips of every shown frame: the full decode's pictures."""
    from lerobot_dali.dali_video import decode_clip_batch
    from tests.test_dali_video import CROSS_DECODER_MAX_DIFF

    path = _edited(marker_video, tmp_path, "vp9", "gap_then_trimmed")
    index = build_packet_index(path)
    reference = reference_frames(path)
    frames = nearest_frame_indices(index, _seconds(index, sorted(reference)), tolerance_s=1e-4)
    windows = [frames[i : i + 4] for i in range(0, len(frames), 9)]
    clips = [build_clip(path, index, window) for window in windows]
    decoded = decode_clip_batch([c.data for c in clips], [c.relative_indices for c in clips], device_id=None)
    for window, pictures in zip(windows, decoded, strict=True):
        for pts, picture in zip(index.pts_of_frames(window).tolist(), pictures, strict=True):
            assert np.abs(picture.astype(np.int16) - reference[pts]).max() <= CROSS_DECODER_MAX_DIFF
            assert read_marker(picture) == read_marker(reference[pts])


@pytest.mark.parametrize("own_tables", [False, True])
def test_sample_tables_serve_an_edit_list_that_hides_nothing(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_tables: bool
) -> None:
    """The B-frame delay's edit list (what FFmpeg writes for B-frames) hides no frame: indexed from the sample tables,
    no demux. One that hides frames is demuxed, which flags them: the tables' own rows (PyAV < 16) had every sample
    shown, as the demuxer's index (PyAV >= 16) knows they are not."""
    if own_tables:
        monkeypatch.setattr(packet_index, "_demuxer_index", lambda stream: None)
    demuxed: list[str] = []
    real = packet_index._rows_from_demux

    def spy(container, stream, samples, heads, *, label):  # type: ignore[no-untyped-def]
        demuxed.append(label)
        return real(container, stream, samples, heads, label=label)

    monkeypatch.setattr(packet_index, "_rows_from_demux", spy)
    plain = build_packet_index(marker_video("h264", 30))
    assert demuxed == [] and plain.hidden is None and plain.shown == range(90)
    for edit in ("trimmed_start", "trimmed_end"):
        path = _edited(marker_video, tmp_path, "h264", edit)
        index = build_packet_index(path)
        assert demuxed[-1:] == [str(path)]
        assert index.hidden is not None and sorted(index.pts[index.hidden].tolist()) == _hidden_pts(path)


def test_a_remote_file_is_indexed_with_the_frames_it_hides(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Through a filesystem (the remote route's index, then its packets by byte range): the local file's index."""
    path = _edited(marker_video, tmp_path, "h264", "gap_then_trimmed")
    memory = fsspec.filesystem("memory")
    memory.pipe("/remote/cam.mp4", path.read_bytes())
    remote, local = build_packet_index("/remote/cam.mp4", filesystem=memory), build_packet_index(path)
    assert remote.hidden is not None and local.hidden is not None
    np.testing.assert_array_equal(remote.hidden, local.hidden)
    np.testing.assert_array_equal(remote.pts, local.pts)
    assert remote.shown == range(5, 65)


def test_the_stored_index_keeps_the_hidden_frames(marker_video: MarkerVideo, tmp_path: Path) -> None:
    index = build_packet_index(_edited(marker_video, tmp_path, "h264", "gap_then_trimmed"))
    stamp = FileStamp(index.file_size_bytes, "blob:1")
    again = read_packet_index(packet_index_bytes(index, "u", stamp), "u", stamp)
    assert index.hidden is not None and again.hidden is not None
    np.testing.assert_array_equal(again.hidden, index.hidden)
    np.testing.assert_array_equal(again.keyframe, index.keyframe)
    assert again.shown == index.shown == range(5, 65)


@pytest.mark.parametrize(
    "entries",
    [[(1000, 1024), (1000, 1024 + 60 * _TICKS)], [(1000, 1024), (1000, 1024)]],
    ids=["skips_the_middle", "plays_twice"],
)
def test_an_edit_list_of_several_pieces_is_refused_naming_it(
    marker_video: MarkerVideo, tmp_path: Path, entries: list[tuple[int, int]]
) -> None:
    """FFmpeg demuxes packets of such edits once per piece, at two times: this was called damaged sample tables."""
    path = with_edit_list(marker_video("h264", 30), tmp_path / "pieces.mp4", entries)
    with pytest.raises(VideoDecodeError, match="its edit list plays the media in 2 pieces") as info:
        build_packet_index(path)
    assert "damaged" not in str(info.value)


def test_pieces_of_an_edit_list_that_share_a_time_are_refused_naming_it(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """VP9 (no B-frames) cut by two edits, the second from a keyframe: no packet is demuxed twice, but FFmpeg keeps the
    first piece's next frame, hidden, at the time the second piece's first frame shows (1 s), which was said as
    'two packets share pts 15360' (re-encode or remux), naming no edit list."""
    source = marker_video("vp9", 30)
    raw = source.read_bytes()
    delay = struct.unpack_from(">Ii", raw, raw.find(b"elst") + 12)[1]
    path = with_edit_list(source, tmp_path / "pieces.mp4", [(1000, delay), (1000, delay + 60 * _TICKS)])
    with pytest.raises(VideoDecodeError, match="its edit list plays the media in 2 pieces") as info:
        build_packet_index(path)
    assert "share pts" not in str(info.value)


def test_an_edit_list_that_shows_nothing_is_refused(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A zero-length edit: a full decode shows no frame (FFmpeg demuxes 31 packets, two at pts 512: "two packets
    share pts", which said nothing of the edit list)."""
    path = with_edit_list(marker_video("h264", 30), tmp_path / "nothing.mp4", [(0, 1024)])
    assert reference_frames(path) == {}
    with pytest.raises(VideoDecodeError, match="its edit list hides every one of its 31 frames"):
        build_packet_index(path)


def test_an_episode_holds_the_frames_shown_only(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """The frames past a trimmed end are no episode's: an episode to the end of the file holds the 60 shown (90
    before), and one whose next episode starts at the last shown frame's time leaves that frame to it."""
    index = build_packet_index(_edited(marker_video, tmp_path, "h264", "trimmed_end"))
    assert describe_index(index).frame_count == 60  # (what lerobot-dali info says the video holds: 90 before)
    assert episode_frames(index, 0.0, None) == range(0, 60)
    assert episode_frames(index, 1.0, 59 / 30) == range(30, 59)
    start = build_packet_index(_edited(marker_video, tmp_path, "h264", "gap_then_trimmed"))
    assert episode_frames(start, 0.0, 1.0) == range(5, 32)  # (0.1 s to 0.967 s: hidden frames at 0 s to 0.067 s)


def test_the_dataset_check_lists_the_rows_a_trimmed_end_hides(make_ds, copy_ds) -> None:  # type: ignore[no-untyped-def]
    """Camera 0's first file (episodes 0 and 1, 12 rows each at 10 fps) cut 3 frames short by its edit list: episode
    1's last 3 rows have no frame a decoder shows. The check passed before (they read the hidden pictures)."""
    from lerobot_dali import open_dataset
    from lerobot_dali.dataset_check import check_dataset

    spec = dict(episodes=3, frames_per_episode=12, cameras=2, codec="h264", fps=10, gop=4, episodes_per_file=2)
    root = copy_ds(make_ds(**spec, size=(64, 96)))
    video = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    delay = struct.unpack_from(">Ii", video.read_bytes(), video.read_bytes().find(b"elst") + 12)[1]
    with_edit_list(video, video, [(2100, delay)])
    report = check_dataset(open_dataset(root), decode=True)
    assert {(p.episode_index, p.camera, p.error) for p in report.problems} == {
        (1, "observation.images.cam0", "FrameTimestampError")
    }
    assert "query timestamp 2.300000 s" in report.problems[0].message  # (the worst of them)
    assert "3 of 12 queries fail; the video spans 0.000000-2.000000 s" in report.problems[0].message
    assert "its edit list hides it" in report.problems[0].message


def test_decode_ceilings_count_the_frames_shown(make_ds, copy_ds) -> None:  # type: ignore[no-untyped-def]
    """The bench's decode runs cover the frames shown: with 5 frames before the edit's start hidden, the runs began at
    frame 0, whose clip is now refused; they hold the 70 frames a decode shows."""
    from lerobot_dali.bench_limits import decode_runs, measure_ceilings

    root = copy_ds(make_ds(episodes=1, frames_per_episode=75, cameras=1, size=(64, 96), codec="h264", gop=30))
    video = next((root / "videos").rglob("*.mp4"))
    raw = video.read_bytes()
    duration, delay = struct.unpack_from(">Ii", raw, raw.find(b"elst") + 12)
    ticks = int(build_packet_index(video).frame_duration)
    with_edit_list(video, video, [(duration, delay + 5 * ticks)])
    runs = decode_runs(root, max_frames=1000, run_frames=16)
    assert [(r.start, r.stop) for r in runs] == [(5, 30), (30, 60), (60, 75)]
    result = measure_ceilings(root, max_frames=1000, run_frames=16, gpu=False, clips=True)
    assert result["clip_cutting"]["error"] is None and result["clip_cutting"]["frames"] == 70
    assert result["ceilings"]["cpu_pyav"]["frames"] == 70


def test_the_dali_decode_ceiling_counts_the_frames_shown(make_ds, copy_ds, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """DALI shows every frame of a clip, the 5 an edit list hides before the first run's frames among them: its
    ceiling counted 75 frames where PyAV's and clip cutting's count the 70 shown. DALI's CPU decoder (VP9) stands in
    for NVDEC, which needs a GPU; the runs' clips are the same."""
    from nvidia.dali import fn

    from lerobot_dali.bench_limits import decode_runs, gpu_decode_ceiling

    root = copy_ds(make_ds(episodes=1, frames_per_episode=75, cameras=1, size=(64, 96), codec="vp9", gop=30))
    video = next((root / "videos").rglob("*.mp4"))
    raw = video.read_bytes()
    duration, delay = struct.unpack_from(">Ii", raw, raw.find(b"elst") + 12)
    with_edit_list(video, video, [(duration, delay + 5 * int(build_packet_index(video).frame_duration))])
    runs = decode_runs(root, max_frames=1000, run_frames=16)
    assert [(r.start, r.stop) for r in runs] == [(5, 30), (30, 60), (60, 75)]
    real = fn.decoders.video
    monkeypatch.setattr(fn.decoders, "video", lambda clips, device, **kwargs: real(clips, device="cpu", **kwargs))
    result = gpu_decode_ceiling(runs, device_id=None, batch_size=1)  # type: ignore[arg-type]
    assert result.error is None and result.frames == 70
