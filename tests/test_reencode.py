"""``reencode_dataset`` / ``lerobot-dali reencode``: every frame keeps its instant and its picture, keyframes
end up at most ``gop`` frames apart, and every other file is the source's byte for byte."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from fsspec.implementations.dirfs import DirFileSystem

from lerobot_dali.cli import main
from lerobot_dali.clips import plan_clip
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.frame_marker import read_full_marker
from lerobot_dali.generate import expected_state
from lerobot_dali.packet_index import build_packet_index
from lerobot_dali.reencode import reencode_dataset
from lerobot_dali.video_encoding import CODECS, SVTAV1_PARAMS
from tests.conftest import shared_dataset, thread_policies
from tests.process_tree import assert_workers_end_with, kill_all, spawned_workers
from tests.video_fixtures import damage_av1_frame_size, reference_frames, with_edit_list

LENGTHS = [9, 14, 11, 7]
FPS = 15


@pytest.fixture(scope="module")
def long_gop_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v3.0, two cameras, two episodes per video file, keyframes 30 frames apart (more than any file holds)."""
    from lerobot_dali.generate import make_dataset

    return make_dataset(
        tmp_path_factory.mktemp("long_gop") / "ds", episodes=len(LENGTHS), frames_per_episode=LENGTHS, cameras=2,
        size=(64, 96), fps=FPS, codec="av1", gop=30, episodes_per_file=2,
    )  # fmt: skip


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _instants(path: Path) -> list[Fraction]:
    """Display instants of every frame, from an independent full decode (not the packet index)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [frame.pts * stream.time_base for frame in container.decode(stream)]


def _keyframe_gaps(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        flags = [packet.is_keyframe for packet in container.demux(video=0) if packet.size]
    return np.diff(np.flatnonzero([*flags, True])).tolist()


def _mean_decoded_per_frame(path: Path) -> float:
    index = build_packet_index(path)
    return float(np.mean([plan_clip(index, [i]).frame_count for i in range(index.frame_count)]))


@pytest.mark.parametrize("codec", CODECS)
def test_every_frame_keeps_its_instant_and_its_marker(long_gop_ds: Path, codec: str, tmp_path: Path) -> None:
    report = reencode_dataset(long_gop_ds, tmp_path / "out", codec=codec, gop=2)
    source, out = _files(long_gop_ds), _files(tmp_path / "out")
    assert source.keys() == out.keys()
    videos = sorted(k for k in source if k.startswith("videos/"))
    assert len(videos) == 4  # two cameras x two files
    assert sorted(v.path for v in report.videos) == videos
    for relative in videos:
        assert _instants(out[relative]) == _instants(source[relative])
        assert max(_keyframe_gaps(out[relative])) <= 2 < max(_keyframe_gaps(source[relative]))
        with av.open(str(out[relative])) as container:
            assert container.streams.video[0].codec_context.codec.canonical_name == codec
        before, after = reference_frames(source[relative]), reference_frames(out[relative])
        for pts, frame in after.items():  # markers survive a lossy re-encode exactly; the picture stays close
            assert read_full_marker(frame) == read_full_marker(before[pts])
            assert np.abs(frame.astype(np.int16) - before[pts]).mean() < 6
    info_before, info_after = (json.loads(files["meta/info.json"].read_text()) for files in (source, out))
    for key, feature in info_after["features"].items():
        expected = info_before["features"][key]
        if feature["dtype"] == "video":
            expected = {**expected, "info": {**expected["info"], "video.codec": codec}}
        assert feature == expected
    for relative in set(source) - set(videos) - {"meta/info.json"}:
        assert out[relative].read_bytes() == source[relative].read_bytes(), relative
    assert report.copied_files == len(source) - len(videos) - (codec != "av1")  # info.json unchanged: copied
    for video in report.videos:
        assert video.decoded_per_frame_after == pytest.approx(_mean_decoded_per_frame(out[video.path]))
        assert video.decoded_per_frame_before == pytest.approx(_mean_decoded_per_frame(source[video.path]))


def test_the_iterator_reads_a_reencoded_dataset_as_the_source(long_gop_ds: Path, tmp_path: Path) -> None:
    from lerobot_dali.iterator import DALILeRobotIterator

    out = reencode_dataset(long_gop_ds, tmp_path / "out", codec="h264", gop=2).out
    deltas = {"observation.images.cam0": [-2 / FPS, 0.0], "observation.images.cam1": [0.0, 1 / FPS]}
    it = DALILeRobotIterator(
        out, batch_size=5, shuffle=False, device="cpu", drop_last=False, num_workers=1, delta_timestamps=deltas,
        return_uint8=True,
    )  # fmt: skip
    seen: list[int] = []
    try:
        for batch in it:
            for i in range(len(batch["index"])):
                episode, frame = int(batch["episode_index"][i]), int(batch["frame_index"][i])
                np.testing.assert_array_equal(batch["observation.state"][i].numpy(), expected_state(episode, frame))
                for camera, (key, steps) in enumerate(deltas.items()):
                    for step, delta in enumerate(steps):
                        wanted = min(max(frame + round(delta * FPS), 0), LENGTHS[episode] - 1)
                        marker = read_full_marker(batch[key][i, step].permute(1, 2, 0).numpy())
                        assert (marker.episode_index, marker.frame_index, marker.camera_index) == (
                            episode, wanted, camera,
                        )  # fmt: skip
                seen.append(int(batch["index"][i]))
    finally:
        it.close()
    assert sorted(seen) == list(range(sum(LENGTHS)))


@pytest.mark.parametrize(
    ("name", "camera", "files"),
    [
        ("r1_v30_h264", "observation.images.rgb", 1),  # v3.0, B-frames, 25 fps video under 10 fps rows
        ("gr00t_v20_h264", "observation.images.ego_view", 5),  # v2.0, B-frames, a declared camera with no files
    ],
)
def test_real_long_gop_datasets_become_gop_2_at_the_same_instants(
    name: str, camera: str, files: int, tmp_path: Path
) -> None:
    source_root = shared_dataset(name)
    report = reencode_dataset(source_root, tmp_path / "out", jobs=2)
    source, out = _files(source_root), _files(tmp_path / "out")
    assert source.keys() == out.keys()
    assert len(report.videos) == files and {v.camera for v in report.videos} == {camera}
    for video in report.videos:
        before, after = source[video.path], out[video.path]
        assert _instants(after) == _instants(before)
        assert max(_keyframe_gaps(after)) <= 2 and max(_keyframe_gaps(before)) > 100
        assert video.decoded_per_frame_before > 100 and video.decoded_per_frame_after == pytest.approx(1.5, abs=1e-3)
        reference = reference_frames(before)
        for pts, frame in reference_frames(after).items():
            assert np.abs(frame.astype(np.int16) - reference[pts]).mean() < 3, pts
    for relative in set(source) - {v.path for v in report.videos}:  # info.json too: its codec was h264 already
        assert out[relative].read_bytes() == source[relative].read_bytes(), relative


def test_depth_videos_are_copied_and_cannot_be_chosen(long_gop_ds: Path, copy_ds, tmp_path: Path) -> None:
    root = copy_ds(long_gop_ds)
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    depth = "observation.images.cam1"
    quantizer = {"video.depth_min": 0.2, "video.depth_max": 5.0, "video.shift": 1.0, "video.use_log": True}
    info["features"][depth]["info"].update({"video.is_depth_map": True, **quantizer})
    info_path.write_text(json.dumps(info, indent=4))
    with pytest.raises(ValueError, match=r"\['observation.images.cam1'\] are depth maps"):
        reencode_dataset(root, tmp_path / "refused", cameras=[depth])
    assert not (tmp_path / "refused").exists()
    report = reencode_dataset(root, tmp_path / "out", gop=2)
    kept = sorted(k for k in _files(root) if k.startswith(f"videos/{depth}/"))
    assert report.kept_videos == tuple(kept) and len(kept) == 2 and report.kept_cameras == (depth,)
    assert {v.camera for v in report.videos} == {"observation.images.cam0"}
    for relative in kept:
        assert (tmp_path / "out" / relative).read_bytes() == (root / relative).read_bytes()
    features = json.loads((tmp_path / "out/meta/info.json").read_text())["features"]
    assert features[depth] == info["features"][depth]
    assert features["observation.images.cam0"]["info"]["video.codec"] == "h264"


def test_files_the_metadata_names_but_the_source_lacks_are_warned_of(
    long_gop_ds: Path, copy_ds, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A video or data file missing from the source was left out of the copy without a word, and the run said it
    succeeded. A missing video's camera is named for reading without it (gr00t_v20_h264's ``egoview`` has no file at
    all: leaving out its episodes, the only advice, left none)."""
    source = copy_ds(long_gop_ds)
    gone = "videos/observation.images.cam1/chunk-000/file-001.mp4"  # (episodes 2 and 3 of camera 1)
    (source / gone).unlink()
    data = "data/chunk-000/file-001.parquet"
    (source / data).unlink()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.reencode"):
        report = reencode_dataset(source, tmp_path / "out", jobs=1)
    warned = [r.getMessage() for r in caplog.records if "do not exist" in r.getMessage()]
    assert len(warned) == 1 and f"2 file(s) the episode metadata names do not exist ({data}, {gone})" in warned[0]
    keep = "cameras=['observation.images.cam0'] (on the command line: --cameras observation.images.cam0)"
    assert warned[0].endswith(f"leave those episodes out; or read without their cameras: {keep}"), warned[0]
    assert not (report.out / gone).exists() and len(report.videos) == 3
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.reencode"):
        reencode_dataset(long_gop_ds, tmp_path / "whole", jobs=1)
    assert "do not exist" not in caplog.text


def test_bad_options_and_a_taken_out_fail_before_any_work(long_gop_ds: Path, tmp_path: Path, caplog) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with caplog.at_level(logging.INFO, logger="lerobot_dali"), pytest.raises(FileExistsError, match="never overw"):
        reencode_dataset(long_gop_ds, taken)
    assert caplog.records == []  # (it logged "re-encoding 4 video file(s)" first, having listed the source)
    with pytest.raises(FileExistsError, match="reencode never overwrites"):  # before the source is looked for
        reencode_dataset(tmp_path / "no such dataset", taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    for kwargs, message in [
        ({"codec": "vp8"}, "Unknown codec 'vp8'"),
        ({"gop": 0}, r"gop \(maximum keyframe interval in frames\) must be >= 1"),
        ({"crf": 99}, r"crf for h264 must be in \[0, 51\]"),
        ({"jobs": 0}, "jobs must be >= 1"),
        ({"cameras": ["observation.images.nope"]}, r"cameras \['observation.images.nope'\] are not video features"),
        (
            {"cameras": ["observation.images.cam00"]},
            r"are not video features .*\(did you mean \['observation\.images\.cam0'\]\?\): pass cameras= from those "
            r"\(on the command line --cameras\)$",
        ),
        ({"cameras": "observation.images.cam0"}, "must be a list of video keys"),
    ]:
        with pytest.raises(ValueError, match=message):
            reencode_dataset(long_gop_ds, tmp_path / "new", **kwargs)
    with pytest.raises(ValueError, match="inside the source dataset"):
        reencode_dataset(long_gop_ds, long_gop_ds / "copy")
    assert not (tmp_path / "new").exists() and not (long_gop_ds / "copy").exists()


def test_an_out_inside_the_source_is_refused_through_symbolic_links(long_gop_ds: Path, tmp_path: Path) -> None:
    """A link to the source (or one inside it) hid that ``out`` was in it: the copy was written into the source."""
    link = tmp_path / "link"
    link.symlink_to(long_gop_ds, target_is_directory=True)
    for source, out in [(link, long_gop_ds / "copy"), (long_gop_ds, link / "copy"), (link, link / "copy")]:
        with pytest.raises(ValueError, match="inside the source dataset"):
            reencode_dataset(source, out)
    assert sorted(p.name for p in long_gop_ds.iterdir()) == ["data", "meta", "videos"]


def test_an_out_inside_another_dataset_is_refused(long_gop_ds: Path, tmp_path: Path) -> None:
    """An out inside another local dataset (one below its root, in its meta/, or a link into it) was written there,
    the copy uploaded with that dataset: 3 of 3 written. Refused now (as make-dataset refuses), nothing written."""
    other = tmp_path / "other"
    (other / "meta").mkdir(parents=True)
    (other / "meta" / "info.json").write_text("{}")
    (tmp_path / "link").symlink_to(other / "meta", target_is_directory=True)
    for out in (other / "copy", other / "meta" / "copy", tmp_path / "link" / "copy"):
        with pytest.raises(ValueError) as refused:
            reencode_dataset(long_gop_ds, out)
        assert str(refused.value) == (
            f"Refusing to write a dataset into {out}: it is inside the dataset {other}. Pass a path outside it "
            "(reencode writes a dataset of its own)."
        )
    assert sorted(str(p.relative_to(other)) for p in other.rglob("*")) == ["meta", "meta/info.json"]
    assert not any(p.name.endswith(".partial") for p in tmp_path.rglob("*"))


def test_an_out_that_links_to_an_empty_folder_is_written_there(long_gop_ds: Path, tmp_path: Path) -> None:
    """An out that is a symbolic link to an empty folder (a scratch disk's): the copy was written beside the link, then
    renamed onto it, which failed (ENOTDIR) once every file was re-encoded, said as 'it appeared while this one was
    written (another run?)', and so did every re-run (1 of 1 such out never written). Written into the folder the
    link leads to now, the link kept."""
    (tmp_path / "scratch" / "copy").mkdir(parents=True)
    out = tmp_path / "copy"
    out.symlink_to(tmp_path / "scratch" / "copy", target_is_directory=True)
    report = reencode_dataset(long_gop_ds, out, cameras=["observation.images.cam0"])
    assert report.out == out and out.is_symlink()
    copied = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert copied == sorted(str(p.relative_to(long_gop_ds)) for p in long_gop_ds.rglob("*") if p.is_file())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "scratch"]
    assert [p.name for p in (tmp_path / "scratch").iterdir()] == ["copy"]


def _corrupt(video: Path) -> None:
    data = bytearray(video.read_bytes())
    mdat = data.index(b"mdat") + 4
    data[mdat + 200 : mdat + 1200] = bytes(1000)  # frames' payloads zeroed: the container still opens
    video.write_bytes(bytes(data))


BAD = "videos/observation.images.cam1/chunk-000/file-001.mp4"


def test_a_finished_copy_cut_short_since_is_encoded_again_on_resume(
    long_gop_ds: Path, copy_ds, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A finished video in the unfinished copy cut short after its run stopped (a power loss before the disk had
    it, a full disk): the resume checks it again and failed on it ("the file is truncated or corrupt", the copy's
    own file), a dead end short of deleting the folder; now it is encoded again, with a warning."""
    root = copy_ds(long_gop_ds)
    _corrupt(root / BAD)
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    with pytest.raises(VideoDecodeError):
        reencode_dataset(root, out, jobs=1)
    cut = next(k for k in sorted(_files(partial)) if k.endswith(".mp4"))
    (partial / cut).write_bytes((partial / cut).read_bytes()[:300])
    shutil.copyfile(long_gop_ds / BAD, root / BAD)
    capfd.readouterr()
    report = reencode_dataset(root, out, jobs=1)
    assert sorted(v.path for v in report.videos if not v.resumed) == sorted([BAD, cut])
    assert f"{cut}: its copy from an earlier run does not check" in capfd.readouterr().err  # (a worker's log)
    assert _instants(out / cut) == _instants(long_gop_ds / cut) and max(_keyframe_gaps(out / cut)) <= 2


def test_a_copy_that_cannot_be_written_is_not_called_a_corrupt_file(long_gop_ds: Path, tmp_path: Path) -> None:
    """A write of the copy that fails (here a file size limit: EFBIG, as ENOSPC on a full disk) was reported as the
    source being corrupt or truncated, and that file re-downloaded for nothing: the source is now decoded alone to
    tell."""
    import resource

    said = (
        r"cam1/chunk-000/file-000\.mp4: re-encoding failed \(\[Errno 27\] File too large: .*\), though the file "
        r"decodes alone: the fault is the h264 encoder's or writing the copy's, not the file's: check that the disk "
        r"holding the copy has room, or re-encode in another codec \(codec= one of \['av1', 'h264', 'hevc', 'vp9'\]; "
        r"on the command line --codec\) or at another crf \(crf=, --crf\)$"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8000, hard))  # (the workers inherit it; Python ignores SIGXFSZ)
    try:
        with pytest.raises(VideoDecodeError, match=said):
            reencode_dataset(long_gop_ds, tmp_path / "out", jobs=1, crf=1)  # (cam1's copies: 9-12 kB)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_remote_source_gone_when_a_failure_is_told_still_names_the_failure() -> None:
    """The failure's message opens the source again to decode it alone: a remote file gone or unreachable since
    raised that FileNotFoundError from the message, in place of the re-encode's own error."""
    from lerobot_dali.reencode import _Job, _reencode_failed

    class Gone:
        def open(self, path: str, mode: str) -> Any:
            raise FileNotFoundError(2, "No such file or directory", path)

    job = _Job("bucket/v.mp4", Gone(), "/out/v.mp4", "v.mp4", "cam", "h264", gop=2, crf=None, threads=1)
    error = _reencode_failed(job, "bucket/v.mp4", OSError("connection reset"))
    assert re.fullmatch(
        r"bucket/v\.mp4: re-encoding failed \(connection reset\), and the file cannot be opened again "
        r"\(FileNotFoundError\(.*\)\): check that it is still there, readable and reachable, then run the re-encode "
        r"again \(it resumes\)",
        str(error),
    ), error


def test_a_local_source_gone_when_a_failure_is_told_is_not_called_corrupt(tmp_path: Path) -> None:
    """A local source deleted since the re-encode began was called "corrupt or truncated" (FFmpeg's own
    FileNotFoundError was taken for a decode failure), and its advice was to copy the file again."""
    from lerobot_dali.reencode import _Job, _reencode_failed

    gone = str(tmp_path / "v.mp4")
    job = _Job(gone, None, str(tmp_path / "out.mp4"), "v.mp4", "cam", "h264", gop=2, crf=None, threads=1)
    error = _reencode_failed(job, "v.mp4", OSError("read error"))
    assert re.fullmatch(
        r"v\.mp4: re-encoding failed \(read error\), and the file cannot be opened again \(FileNotFoundError\(.*\)\): "
        r"check that it is still there, readable and reachable, then run the re-encode again \(it resumes\)",
        str(error),
    ), error


def test_a_check_that_fails_otherwise_still_names_the_failure(
    long_gop_ds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding the source alone raised what is neither an FFmpeg error nor an OSError (here a RuntimeError) from
    the message, in place of the re-encode's own error."""
    from lerobot_dali import reencode

    def refuses(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no decoder")

    source = str(long_gop_ds / BAD)
    job = reencode._Job(source, None, "/out/v.mp4", BAD, "cam", "h264", gop=2, crf=None, threads=1)
    monkeypatch.setattr(reencode.av, "open", refuses)
    error = reencode._reencode_failed(job, BAD, OSError("disk full"))
    assert str(error) == (
        f"{BAD}: re-encoding failed (disk full); decoding the file alone, to tell whether the file is at fault, "
        "failed too (RuntimeError('no decoder'))"
    )


def test_a_corrupt_video_fails_naming_it_and_the_same_call_resumes(
    long_gop_ds: Path, copy_ds, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = copy_ds(long_gop_ds)
    _corrupt(root / BAD)
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    said = (  # (it said the file is corrupt or truncated, and not what to do)
        r"file-001\.mp4: re-encoding failed \(.*\), and decoding the file alone fails too \(.*\): the file is corrupt "
        r"or truncated: download or copy it again .*, or leave its camera out of the re-encode \(cameras=\[\.\.\.\] "
        r"\(on the command line: --cameras KEY \.\.\.\); its videos are then copied as they are\)$"
    )
    with pytest.raises(VideoDecodeError, match=said):
        reencode_dataset(root, out, jobs=1)
    assert not out.exists() and sorted(tmp_path.iterdir()) == [partial, root]
    videos = sorted(k for k in _files(long_gop_ds) if k.startswith("videos/"))
    finished = sorted(k for k in _files(partial) if k.endswith(".mp4"))
    assert finished == [v for v in videos if v != BAD]  # jobs=1: the others ran to the end, one at a time
    assert "3 video(s) finished are kept in" in caplog.text and "the same command resumes there" in caplog.text
    kept = {k: (partial / k).stat().st_mtime_ns for k in finished}

    shutil.copyfile(long_gop_ds / BAD, root / BAD)  # mended
    caplog.clear()
    report = reencode_dataset(root, out, jobs=1)
    assert not partial.exists() and report.out == out
    assert [v.path for v in report.videos if not v.resumed] == [BAD]
    assert sorted(v.path for v in report.videos if v.resumed) == finished
    files = _files(out)
    assert {k: files[k].stat().st_mtime_ns for k in finished} == kept  # not encoded again
    assert sorted(files) == sorted(_files(long_gop_ds))  # (no plan, lock or unfinished file left)
    for relative in videos:
        assert _instants(files[relative]) == _instants(long_gop_ds / relative)
        assert max(_keyframe_gaps(files[relative])) <= 2
    assert (
        json.loads(files["meta/info.json"].read_text())["features"]["observation.images.cam1"]["info"]["video.codec"]
        == "h264"
    )


def test_frames_of_a_damaged_header_fail_instead_of_being_scaled_into_the_copy(
    long_gop_ds: Path, copy_ds, tmp_path: Path
) -> None:
    """An AV1 sequence header with its frame size set to 1x1 decodes its keyframe as a 1x1 frame, unflagged. The encoder
    scaled them to the stream's size, so the copy held flat frames and no trace of the damage; the loader's own
    check (frame_checks.is_damaged) now refuses them here too."""
    root = copy_ds(long_gop_ds)
    # Not BAD: its first packet holds a hidden frame predicted from the keyframe too, which FFmpeg 8.1.3 (PyAV 18.1.1)
    # refuses before the 1x1 keyframe comes out, so that file fails as undecodable instead.
    damage_av1_frame_size(root / "videos/observation.images.cam0/chunk-000/file-001.mp4")
    with pytest.raises(
        VideoDecodeError, match=r"cam0/chunk-000/file-001\.mp4: the decoder produced a 1x1 frame at pts 0\.0+ s"
    ):
        reencode_dataset(root, tmp_path / "out", jobs=1)


def test_an_unfinished_copy_of_other_work_is_refused(long_gop_ds: Path, copy_ds, tmp_path: Path) -> None:
    root = copy_ds(long_gop_ds)
    _corrupt(root / BAD)
    out = tmp_path / "out"
    with pytest.raises(VideoDecodeError):
        reencode_dataset(root, out, jobs=1)
    shutil.copyfile(long_gop_ds / BAD, root / BAD)
    for kwargs, change in [
        ({"gop": 3}, "gop 2 -> 3"),
        ({"codec": "hevc"}, "codec 'h264' -> 'hevc'"),
        (
            {"cameras": ["observation.images.cam0"]},
            re.escape("cameras ['observation.images.cam0', 'observation.images.cam1'] -> ['observation.images.cam0']"),
        ),
    ]:
        with pytest.raises(
            FileExistsError, match=rf"\.out\.partial holds an unfinished re-encode of .* other options.*{change}"
        ):
            reencode_dataset(root, out, jobs=1, **kwargs)
    with pytest.raises(FileExistsError, match="holds an unfinished re-encode .*source '.*' -> '.*'"):
        reencode_dataset(long_gop_ds, out, jobs=1)  # another source
    (root / "meta/extra.txt").write_text("a file added since")
    grown = root / BAD
    grown.write_bytes(grown.read_bytes() + bytes(8))  # (a mended file is seldom of the same size)
    files_changed = (
        r"whose files have changed since it started \(added, removed or resized: meta/extra\.txt, "
        rf"{BAD}\): its videos may be of the old files; delete the folder to start over"
    )
    with pytest.raises(FileExistsError, match=files_changed):
        reencode_dataset(root, out, jobs=1)
    (root / "meta/extra.txt").unlink()
    shutil.copyfile(long_gop_ds / BAD, root / BAD)
    assert reencode_dataset(root, out, jobs=1).out == out


def test_a_partial_folder_with_files_but_no_plan_is_refused(long_gop_ds: Path, tmp_path: Path) -> None:
    """A re-encode writes its plan before any file, so files without one are not its work: a copy of the source
    video placed there was taken as re-encoded (its frames matched) and handed out in the source's codec."""
    partial = tmp_path / ".out.partial"
    (partial / BAD).parent.mkdir(parents=True)
    shutil.copyfile(long_gop_ds / BAD, partial / BAD)
    with pytest.raises(FileExistsError, match=r"\.out\.partial holds files but no re-encode plan: .*delete the folder"):
        reencode_dataset(long_gop_ds, tmp_path / "out", jobs=1)
    assert (partial / BAD).is_file() and not (tmp_path / "out").exists()


def test_a_second_run_into_the_same_copy_is_refused_while_one_writes(long_gop_ds: Path, tmp_path: Path) -> None:
    from lerobot_dali.cache_dirs import try_flock

    partial = tmp_path / ".out.partial"
    partial.mkdir()
    lock = try_flock(partial / ".reencode-lock")
    assert lock is not None
    try:
        with pytest.raises(FileExistsError, match="another lerobot-dali reencode is writing there"):
            reencode_dataset(long_gop_ds, tmp_path / "out")
    finally:
        lock.close()
    (tmp_path / "out").mkdir()  # an empty folder given (a mount point, say) receives the copy
    report = reencode_dataset(long_gop_ds, tmp_path / "out", cameras=["observation.images.cam0"])
    assert sorted(_files(tmp_path / "out")) == sorted(_files(long_gop_ds)) and not partial.exists()
    assert len(report.videos) == 2


def test_a_copy_on_a_filesystem_without_locks_is_written_with_a_warning(
    long_gop_ds: Path, tmp_path: Path, monkeypatch, caplog
) -> None:
    """NFS without its lock daemon refuses ``flock`` (ENOLCK): the re-encode failed with that OSError's traceback
    before writing anything; it writes the copy, saying that nothing keeps a second run out of the folder."""
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.reencode"):
        report = reencode_dataset(long_gop_ds, tmp_path / "out", cameras=["observation.images.cam0"], jobs=1)
    assert len(report.videos) == 2 and sorted(_files(tmp_path / "out")) == sorted(_files(long_gop_ds))
    assert [r.getMessage() for r in caplog.records if "takes no file locks" in r.getMessage()] == [
        f"{tmp_path / '.out.partial'}: its filesystem takes no file locks (NFS without its lock daemon, Lustre without "
        "-o flock), so nothing stops a second reencode into it at once from mixing its files with this one's: run one "
        "at a time"
    ]


def test_cli_reencode_prints_what_random_access_costs(
    long_gop_ds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out_root = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        assert (
            main(["reencode", str(long_gop_ds), str(out_root), "--gop", "3", "--cameras", "observation.images.cam1"])
            == 0
        )
    copied = len(_files(long_gop_ds)) - 2 - 1  # (info.json rewritten with the new codec, not copied)
    assert f"copying {copied} other file(s), writing meta/info.json with the new codec" in caplog.text
    out = capsys.readouterr().out.splitlines()
    videos = sorted(k for k in _files(long_gop_ds) if k.startswith("videos/observation.images.cam1/"))
    frames = {v: len(_instants(long_gop_ds / v)) for v in videos}

    def mean(root: Path) -> float:  # per frame: files weigh by their frames
        return sum(_mean_decoded_per_frame(root / v) * n for v, n in frames.items()) / sum(frames.values())

    megabytes = [sum((root / v).stat().st_size for v in videos) / 1e6 for root in (long_gop_ds, out_root)]
    assert out == [
        f"{out_root}: h264, keyframes at most 3 frames apart",
        f"  observation.images.cam1: 2 video files, {sum(LENGTHS)} frames, {megabytes[0]:.1f} -> "
        f"{megabytes[1]:.1f} MB; random access: about {mean(long_gop_ds):.1f} -> {mean(out_root):.1f} frames "
        "decoded per frame",
        "  kept as they were: 2 video files of observation.images.cam0",
        f"  {copied} other files copied unchanged",
    ]
    assert mean(long_gop_ds) > 5 and mean(out_root) == pytest.approx(2.0, abs=0.2)
    assert main(["reencode", str(long_gop_ds), str(out_root)]) == 2
    assert "reencode never overwrites" in capsys.readouterr().err
    shutil.rmtree(out_root)
    assert main(["reencode", str(long_gop_ds), str(out_root), "--cameras", "observation.images.nope"]) == 2
    assert "are not video features" in capsys.readouterr().err
    assert not out_root.exists()


def _add_silence(path: Path) -> None:
    """Remux ``path`` with an AAC track of silence beside its video (packets copied, nothing re-encoded)."""
    with_audio = path.with_suffix(".audio.mp4")
    with av.open(str(path)) as source, av.open(str(with_audio), "w", format="mp4") as target:
        video = target.add_stream_from_template(source.streams.video[0], opaque=True)
        audio = target.add_stream("aac", rate=48000, layout="mono")
        for packet in source.demux(video=0):
            if packet.dts is not None:
                packet.stream = video
                target.mux(packet)
        silence = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        silence.sample_rate, silence.pts = 48000, 0
        target.mux(audio.encode(silence))
        target.mux(audio.encode(None))
    with_audio.replace(path)


def test_an_audio_track_is_dropped_with_a_warning(
    long_gop_ds: Path, copy_ds, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = copy_ds(long_gop_ds)
    relative = "videos/observation.images.cam0/chunk-000/file-000.mp4"
    _add_silence(root / relative)
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"]["observation.images.cam0"]["info"]["has_audio"] = True
    info_path.write_text(json.dumps(info, indent=4))
    with av.open(str(root / relative)) as container:
        assert len(container.streams.audio) == 1
    out = reencode_dataset(root, tmp_path / "out", jobs=1).out
    assert f"{root / relative}: its audio is not copied" in capfd.readouterr().err
    with av.open(str(out / relative)) as container:
        assert not container.streams.audio
    assert _instants(out / relative) == _instants(root / relative)
    features = json.loads((out / "meta/info.json").read_text())["features"]
    assert features["observation.images.cam0"]["info"]["has_audio"] is False
    assert features["observation.images.cam1"]["info"]["has_audio"] is False  # (it had none)


def _h264_with_extra_frames(path: Path, extra: int, *, before: bool) -> tuple[Path, int]:
    """``path``'s frames re-encoded as H.264 into a new file beside it, with ``extra`` of them again before its first
    (at negative times) or after its last; the new file and how many frames ``path`` has."""
    edited = path.with_suffix(".edited.mp4")
    with av.open(str(path)) as source, av.open(str(edited), "w", format="mp4") as target:
        stream = source.streams.video[0]
        frames = list(source.decode(stream))
        out = target.add_stream("libx264", rate=FPS)
        out.width, out.height, out.pix_fmt = stream.codec_context.width, stream.codec_context.height, "yuv420p"
        out.codec_context.time_base = out.time_base = Fraction(1, FPS)
        out.options = {"bf": "0", "crf": "10", "g": "4"}
        extended = [*frames[-extra:], *frames] if before else [*frames, *frames[:extra]]
        for pts, frame in enumerate(extended, start=-extra if before else 0):
            copy = frame.reformat(format="yuv420p")
            copy.pts, copy.time_base = pts, Fraction(1, FPS)
            copy.pict_type = av.video.frame.PictureType.NONE  # (a decoded keyframe would force one at 0)
            target.mux(out.encode(copy))
        target.mux(out.encode(None))
    return edited, len(frames)


def _with_hidden_first_frames(path: Path, hidden: int) -> None:
    """Re-encode ``path`` in place as H.264 with ``hidden`` extra frames before its first, at negative times: the MP4
    muxer writes an edit list that starts at the first real frame, as a stream copy cut from a longer recording has,
    so FFmpeg decodes the extra frames without showing them."""
    _h264_with_extra_frames(path, hidden, before=True)[0].replace(path)


def _with_hidden_last_frames(path: Path, hidden: int) -> None:
    """Re-encode ``path`` in place as H.264 with ``hidden`` extra frames after its last, and an edit list that ends
    before them (as a recorder's stream copy cut at its end has): FFmpeg decodes them without showing them."""
    edited, shown = _h264_with_extra_frames(path, hidden, before=False)
    with_edit_list(edited, path, [(shown * 1000 // FPS, 0)])  # (ms: the frames before the extra ones)
    edited.unlink()


@pytest.mark.parametrize("where", ["first", "last"])
def test_frames_an_edit_list_hides_are_left_out_of_the_copy(
    long_gop_ds: Path, copy_ds, tmp_path: Path, caplog, capfd, where: str
) -> None:
    """A file whose edit list starts 2 frames in (FFmpeg's packet index holds 2 frames more than a decode shows) was
    refused: "the re-encode holds 18 frames, the source 20" (9 + 9 rows); one whose edit list ends 2 frames before
    its last, "23 frames, the source 25" (the frames it hides were taken for ones before 0 s). The copy holds the
    frames shown, each at its instant, with the pictures the source shows there."""
    root = copy_ds(long_gop_ds)
    relative = "videos/observation.images.cam0/chunk-000/file-000.mp4"
    shown = _instants(root / relative)
    {"first": _with_hidden_first_frames, "last": _with_hidden_last_frames}[where](root / relative, 2)
    assert build_packet_index(root / relative).frame_count == len(shown) + 2
    assert _instants(root / relative) == shown
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):  # (the worker logs at this level, to stderr)
        out = reencode_dataset(root, tmp_path / "out", jobs=1).out
    said = f"{root / relative}: 2 frame(s) its edit list hides are never shown and are left out of the copy"
    assert said in capfd.readouterr().err
    assert _instants(out / relative) == shown
    source, copy = reference_frames(root / relative), reference_frames(out / relative)
    assert [read_full_marker(copy[pts]) for pts in sorted(copy)] == [
        read_full_marker(source[pts]) for pts in sorted(source)
    ]


def _as_h264(path: Path, pix_fmt: str) -> None:
    """Re-encode ``path`` in place as H.264 in ``pix_fmt`` (yuvj420p: full range, as a webcam's MJPEG becomes), every
    frame at its timestamp and time base."""
    full_range = av.video.reformatter.ColorRange.JPEG if pix_fmt.startswith("yuvj") else None
    encoded = path.with_suffix(".h264.mp4")
    with av.open(str(path)) as source, av.open(str(encoded), "w", format="mp4") as target:
        stream = source.streams.video[0]
        out = target.add_stream("libx264", rate=stream.average_rate)
        out.width, out.height, out.pix_fmt = stream.codec_context.width, stream.codec_context.height, pix_fmt
        out.codec_context.time_base = out.time_base = stream.time_base
        if full_range is not None:
            out.codec_context.color_range = full_range
        out.options = {"bf": "0", "crf": "10"}
        for frame in source.decode(stream):
            converted = frame.reformat(format=pix_fmt, dst_color_range=full_range)
            converted.pts, converted.time_base = frame.pts, frame.time_base
            target.mux(out.encode(converted))
        target.mux(out.encode(None))
    encoded.replace(path)


@pytest.mark.parametrize("codec", ["vp9", "av1"])
def test_a_full_range_video_reencodes_in_an_encoder_without_yuvj420p(
    long_gop_ds: Path, copy_ds, tmp_path: Path, codec: str
) -> None:
    """libvpx-vp9 and libsvtav1 take no yuvj420p: a full-range source failed as "corrupt or truncated". Its frames go
    in as yuv420p with the source's (full) colour range, so the picture stays as it was."""
    root = copy_ds(long_gop_ds)
    camera = "observation.images.cam0"
    videos = sorted(k for k in _files(root) if k.startswith(f"videos/{camera}/"))
    for relative in videos:
        _as_h264(root / relative, "yuvj420p")
        with av.open(str(root / relative)) as container:
            assert container.streams.video[0].codec_context.pix_fmt == "yuvj420p"
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"][camera]["info"].update({"video.codec": "h264", "video.pix_fmt": "yuvj420p"})
    info_path.write_text(json.dumps(info, indent=4))
    report = reencode_dataset(root, tmp_path / "out", codec=codec, cameras=[camera], jobs=1)
    assert sorted(v.path for v in report.videos) == videos
    for relative in videos:
        out = tmp_path / "out" / relative
        with av.open(str(out)) as container:
            context = container.streams.video[0].codec_context
            assert (context.codec.canonical_name, context.pix_fmt) == (codec, "yuv420p")
            assert context.color_range == av.video.reformatter.ColorRange.JPEG
        before, after = reference_frames(root / relative), reference_frames(out)
        assert before.keys() == after.keys()
        for pts, frame in after.items():
            assert read_full_marker(frame) == read_full_marker(before[pts])
            assert np.abs(frame.astype(np.int16) - before[pts]).mean() < 6
    written = json.loads((tmp_path / "out/meta/info.json").read_text())["features"][camera]["info"]
    assert (written["video.codec"], written["video.pix_fmt"]) == (codec, "yuv420p")


def test_info_json_says_the_new_codec_under_v2_0s_video_info_too() -> None:
    """v2.0 keeps a video's encoding under ``video_info``, not ``info``: a copy's info.json kept the old codec there,
    and a loader trusting it routed the camera as before."""
    from lerobot_dali.reencode import _with_codec

    old = {"video.codec": "av1", "video.pix_fmt": "yuv444p", "has_audio": True, "video.fps": 30}
    features = {"cam": {"dtype": "video", "video_info": dict(old)}, "other": {"dtype": "video", "info": dict(old)}}
    raw = {"codebase_version": "v2.0", "features": features}
    new = _with_codec(raw, {"cam"}, "h264")
    assert new["features"]["cam"]["video_info"] == {
        "video.codec": "h264", "video.pix_fmt": "yuv420p", "has_audio": False, "video.fps": 30,
    }  # fmt: skip
    assert new["features"]["other"] == raw["features"]["other"] and raw["features"]["cam"]["video_info"] == old


@pytest.mark.parametrize(("width", "height", "odd"), [(95, 64, True), (96, 63, True), (96, 64, False)])
def test_an_encoder_refusal_names_an_odd_size_of_either_side(width: int, height: int, odd: bool) -> None:
    from lerobot_dali.reencode import _encoder_refused

    message = str(_encoder_refused("cam.mp4", "libx264", width, height, "yuv420p", RuntimeError("x")))
    assert message.startswith(f"cam.mp4: the libx264 encoder refused its {width}x{height} yuv420p frames (x)")
    assert ("H.264 and HEVC take no odd width or height" in message) is odd


def test_a_444_video_is_reencoded_in_420_with_a_warning(long_gop_ds: Path, copy_ds, tmp_path: Path, capfd) -> None:
    """A 4:4:4 source is re-encoded in 8-bit 4:2:0, which halves its colour resolution: each file says so, and
    info.json's pix_fmt follows."""
    root = copy_ds(long_gop_ds)
    camera = "observation.images.cam0"
    videos = sorted(k for k in _files(root) if k.startswith(f"videos/{camera}/"))
    for relative in videos:
        _as_h264(root / relative, "yuv444p")
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"][camera]["info"].update({"video.codec": "h264", "video.pix_fmt": "yuv444p"})
    info_path.write_text(json.dumps(info, indent=4))
    report = reencode_dataset(root, tmp_path / "out", cameras=[camera], jobs=1)
    err = capfd.readouterr().err
    for relative in videos:
        assert f"{root / relative}: yuv444p converted to yuv420p (8-bit 4:2:0) for the re-encode" in err
        with av.open(str(tmp_path / "out" / relative)) as container:
            assert container.streams.video[0].codec_context.pix_fmt == "yuv420p"
        before, after = reference_frames(root / relative), reference_frames(tmp_path / "out" / relative)
        assert [read_full_marker(after[pts]) for pts in sorted(after)] == [
            read_full_marker(before[pts]) for pts in sorted(before)
        ]
    assert sorted(v.path for v in report.videos) == videos
    written = json.loads((tmp_path / "out/meta/info.json").read_text())["features"][camera]["info"]
    assert written["video.pix_fmt"] == "yuv420p"


def test_the_copys_keyframes_are_its_gops_alone(make_ds, tmp_path: Path) -> None:
    """A decoded keyframe keeps its picture type: handed to the encoder as it was, each of the source's keyframes (3
    frames apart here) forced one more into the copy (0, 2, 3, 5, 6, ...: half again as many, a larger file)."""
    root = make_ds(
        episodes=2, frames_per_episode=[9, 8], cameras=1, size=(64, 96), fps=FPS, codec="av1", gop=3,
        episodes_per_file=2,
    )  # fmt: skip
    [video] = reencode_dataset(root, tmp_path / "out", jobs=1).videos
    assert _keyframe_gaps(root / video.path) == [3] * 5 + [2]
    assert _keyframe_gaps(tmp_path / "out" / video.path) == [2] * 8 + [1]


def _pts_in_decode_order(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        return [packet.pts for packet in container.demux(video=0) if packet.size]


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_long_gop_copy_has_no_b_frames(make_ds, tmp_path: Path, codec: str) -> None:
    """The copy's frames are encoded in display order (B-frames off) at any GOP: the source, written by
    ``make_dataset`` with B-frames, is reordered."""
    root = make_ds(episodes=1, frames_per_episode=16, cameras=1, size=(64, 64), fps=FPS, codec=codec, gop=8)
    [video] = reencode_dataset(root, tmp_path / "out", codec=codec, gop=8, jobs=1).videos
    source, copy = _pts_in_decode_order(root / video.path), _pts_in_decode_order(tmp_path / "out" / video.path)
    assert source != sorted(source) and len(source) == 16
    assert copy == sorted(copy) == sorted(source)


def _cropped_by_a_pixel(path: Path) -> None:
    """Re-encode ``path`` in place in AV1 one pixel narrower and lower (an odd size), every frame at its timestamp."""
    cropped = path.with_suffix(".odd.mp4")
    with av.open(str(path)) as source, av.open(str(cropped), "w", format="mp4") as target:
        stream = source.streams.video[0]
        out = target.add_stream("libsvtav1", rate=stream.average_rate)
        out.width, out.height = stream.codec_context.width - 1, stream.codec_context.height - 1
        out.pix_fmt, out.options = "yuv420p", {"preset": "8", "svtav1-params": SVTAV1_PARAMS}
        out.codec_context.time_base = out.time_base = stream.time_base
        for frame in source.decode(stream):
            odd = frame.reformat(width=out.width, height=out.height)
            odd.pts, odd.time_base = frame.pts, frame.time_base
            target.mux(out.encode(odd))
        target.mux(out.encode(None))
    cropped.replace(path)


def test_an_encoder_that_refuses_the_frames_is_not_blamed_on_the_file(
    long_gop_ds: Path, copy_ds, tmp_path: Path
) -> None:
    """libx264 does not open for an odd frame size: the sound file was called "corrupt or truncated"."""
    root = copy_ds(long_gop_ds)
    camera = "observation.images.cam0"
    videos = sorted(k for k in _files(root) if k.startswith(f"videos/{camera}/"))
    for relative in videos:
        _cropped_by_a_pixel(root / relative)
    message = (
        r"file-000\.mp4: the libx264 encoder refused its 95x63 yuv420p frames \(.*\) \(H\.264 and HEVC take no odd "
        r"width or height; AV1 and VP9 do\); the file itself is fine: re-encode the dataset in another codec"
    )
    with pytest.raises(ValueError, match=message):
        reencode_dataset(root, tmp_path / "out", cameras=[camera], jobs=1)
    report = reencode_dataset(root, tmp_path / "vp9", codec="vp9", cameras=[camera], jobs=1)
    for video in report.videos:
        assert _instants(tmp_path / "vp9" / video.path) == _instants(root / video.path)


def test_a_dataset_over_http_reencodes_as_the_local_folder(long_gop_ds: Path, tmp_path: Path) -> None:
    """The workers read the videos through the remote filesystem, the rest is fetched from it, nothing local."""
    from tests.http_server import serve_folder

    with serve_folder(long_gop_ds.parent) as server:
        report = reencode_dataset(f"{server.url}/{long_gop_ds.name}", tmp_path / "out", jobs=2)
        assert server.counts[("GET", "range")] > 0
    source, out = _files(long_gop_ds), _files(tmp_path / "out")
    assert source.keys() == out.keys() and len(report.videos) == 4
    for relative, path in out.items():
        if relative.startswith("videos/"):
            assert _instants(path) == _instants(source[relative]) and max(_keyframe_gaps(path)) <= 2
            before, after = reference_frames(source[relative]), reference_frames(path)
            assert all(read_full_marker(after[pts]) == read_full_marker(frame) for pts, frame in before.items())
        elif relative != "meta/info.json":
            assert path.read_bytes() == source[relative].read_bytes(), relative


def test_videos_are_found_by_info_jsons_video_path(long_gop_ds: Path, copy_ds, tmp_path: Path) -> None:
    """A template that puts the camera in the file name; an mp4 it does not name, or names with a key that is no video
    feature (a camera since removed), is copied as any other file, and is no video kept; a folder whose name starts
    with "." (huggingface_hub's ``.cache``) is not part of the dataset and is not copied."""
    root = copy_ds(long_gop_ds)
    info = json.loads((root / "meta/info.json").read_text())
    template = "videos/chunk-{chunk_index:03d}/{video_key}-file-{file_index:03d}.mp4"
    for old in sorted((root / "videos").rglob("*.mp4")):
        camera, chunk, name = old.relative_to(root / "videos").parts
        new = root / template.format(chunk_index=int(chunk[-3:]), video_key=camera, file_index=int(name[5:8]))
        new.parent.mkdir(parents=True, exist_ok=True)
        old.rename(new)
    shutil.rmtree(root / "videos/observation.images.cam0")
    shutil.rmtree(root / "videos/observation.images.cam1")
    stray = root / "videos/chunk-000/preview.mp4"
    shutil.copyfile(long_gop_ds / BAD, stray)
    removed = root / "videos/chunk-000/observation.images.old-file-000.mp4"
    shutil.copyfile(long_gop_ds / BAD, removed)
    (root / ".cache/huggingface").mkdir(parents=True)
    (root / ".cache/huggingface/download.lock").write_text("")
    (root / "meta/info.json").write_text(json.dumps({**info, "video_path": template}, indent=4))
    report = reencode_dataset(root, tmp_path / "out", jobs=2)
    assert (report.kept_videos, report.kept_cameras) == ((), ())
    assert (tmp_path / "out" / removed.relative_to(root)).read_bytes() == removed.read_bytes()
    assert not (tmp_path / "out/.cache").exists()
    assert sorted(v.path for v in report.videos) == [
        f"videos/chunk-000/observation.images.cam{c}-file-00{f}.mp4" for c in (0, 1) for f in (0, 1)
    ]
    assert {v.camera for v in report.videos} == {"observation.images.cam0", "observation.images.cam1"}
    assert (tmp_path / "out/videos/chunk-000/preview.mp4").read_bytes() == stray.read_bytes()
    for video in report.videos:
        assert _instants(tmp_path / "out" / video.path) == _instants(root / video.path)


class FakeHub(DirFileSystem):
    """The Hub's file system over a local folder holding ``datasets/<user>/<name>@<commit>``; at module level so
    that spawned workers unpickle it."""


def test_a_hub_dataset_reencodes_at_its_snapshots_commit(
    long_gop_ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metadata from the snapshot, videos and data read at the snapshot's commit (the branch may move meanwhile),
    and the resume plan keyed by the revision asked for."""
    import huggingface_hub
    from fsspec.implementations.local import LocalFileSystem

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "snapshots" / commit
    shutil.copytree(long_gop_ds / "meta", snapshot / "meta")
    shutil.copytree(long_gop_ds, tmp_path / "hub" / "datasets" / "user" / f"tiny@{commit}")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *args, **kwargs: str(snapshot))
    hub = FakeHub(path=str(tmp_path / "hub"), fs=LocalFileSystem())
    monkeypatch.setattr(huggingface_hub, "HfFileSystem", lambda **options: hub)
    report = reencode_dataset("user/tiny", tmp_path / "out", revision="main", jobs=2)
    source, out = _files(long_gop_ds), _files(tmp_path / "out")
    assert source.keys() == out.keys() and len(report.videos) == 4
    for video in report.videos:
        assert _instants(out[video.path]) == _instants(source[video.path])
    for relative in set(source) - {v.path for v in report.videos} - {"meta/info.json"}:
        assert out[relative].read_bytes() == source[relative].read_bytes(), relative


def test_a_hub_dataset_whose_episode_starts_are_wrong_still_reencodes(
    long_gop_ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-encoding copies whole video files and reads no episode's from_timestamp, so the open's refusal of episodes
    starting less than half a frame apart (which a loader reading them must refuse) is not its to make: a Hub
    dataset whose episode 1 starts 0.001 s after episode 0 in their file was refused (EpisodeMetadataError
    advising episodes=[...], which reencode has no way to pass); its local copy re-encoded."""
    import huggingface_hub
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fsspec.implementations.local import LocalFileSystem

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "snapshots" / commit
    hub_root = tmp_path / "hub" / "datasets" / "user" / f"tiny@{commit}"
    shutil.copytree(long_gop_ds, hub_root)
    column = "videos/observation.images.cam0/from_timestamp"
    path = next((hub_root / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    starts = table[column].to_pylist()
    starts[1] = starts[0] + 0.001
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(starts, pa.float64())), path)
    shutil.copytree(hub_root / "meta", snapshot / "meta")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *args, **kwargs: str(snapshot))
    hub = FakeHub(path=str(tmp_path / "hub"), fs=LocalFileSystem())
    monkeypatch.setattr(huggingface_hub, "HfFileSystem", lambda **options: hub)
    report = reencode_dataset("user/tiny", tmp_path / "out", revision="main", cameras=["observation.images.cam0"])
    assert len(report.videos) == 2
    assert (tmp_path / "out" / path.relative_to(hub_root)).read_bytes() == path.read_bytes()


def test_a_long_file_says_how_far_it_got(
    long_gop_ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker logs its file's progress every ``PROGRESS_EVERY_S`` (here every frame, in this process)."""
    from lerobot_dali import reencode

    monkeypatch.setattr(reencode, "PROGRESS_EVERY_S", 0.0)
    relative = "videos/observation.images.cam0/chunk-000/file-001.mp4"
    frames = len(_instants(long_gop_ds / relative))
    job = reencode._Job(
        str(long_gop_ds / relative), None, str(tmp_path / "out.mp4"), relative, "observation.images.cam0", "h264", 2,
        None, 1,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lerobot_dali.reencode"):
        video = reencode._reencode_file(job)
    assert video.frames == frames and not video.resumed
    lines = [r.getMessage() for r in caplog.records if r.getMessage().endswith("frames re-encoded")]
    assert lines == [f"{long_gop_ds / relative}: {done} of {frames} frames re-encoded" for done in range(frames)]


def test_an_av1_reencode_gives_its_worker_its_priority_back(
    long_gop_ds: Path, tmp_path: Path, realtime_allowed: None
) -> None:
    """A worker that opened SVT-AV1 as root ran real-time from then on, its later files' decoders with it
    (lerobot_dali.thread_priority). Here the worker's function runs in this process."""
    from lerobot_dali import reencode

    relative = "videos/observation.images.cam0/chunk-000/file-000.mp4"
    job = reencode._Job(
        str(long_gop_ds / relative), None, str(tmp_path / "out.mp4"), relative, "observation.images.cam0", "av1", 2,
        None, 1,
    )  # fmt: skip
    assert reencode._reencode_file(job).frames == len(_instants(long_gop_ds / relative))
    assert thread_policies()[threading.get_native_id()] == (os.SCHED_OTHER, 0)


def test_an_av1_copy_is_encoded_one_picture_at_a_time(
    long_gop_ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """As ``encode_video`` (tests/test_generate.py::test_av1_is_encoded_one_picture_at_a_time): SVT-AV1 at the level
    of parallelism it picks from the core count returned a later frame in a held-up one's place (``reencode --codec
    av1`` failed with EINVAL) or never ended the stream. A worker is a fresh process, so SVT says its level there."""
    monkeypatch.setenv("SVT_LOG", "3")
    report = reencode_dataset(long_gop_ds, tmp_path / "out", codec="av1", gop=2, cameras=["observation.images.cam0"])
    assert len(report.videos) == 2
    assert re.findall(r"Level of Parallelism: (\d+)", capfd.readouterr().err) == ["1", "1"]


def test_workers_exit_when_the_reencode_process_is_killed(long_gop_ds: Path, tmp_path: Path) -> None:
    """SIGKILL (or SIGTERM, the out-of-memory killer) leaves the pool no chance to close: its workers finished their
    file and then waited forever, reparented to init, and a re-run (the lock freed with the killed process) wrote
    the same ``.unfinished`` file beside them, failing on it once they renamed it."""
    import subprocess
    import sys
    import time

    import psutil

    out = tmp_path / "out"
    command = [sys.executable, "-m", "lerobot_dali", "reencode", str(long_gop_ds), str(out), "--jobs", "2"]
    run = subprocess.Popen(command, cwd=Path(__file__).parents[1], stderr=subprocess.DEVNULL)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        workers: list[psutil.Process] = []
        while len(workers) < 2 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
            children = psutil.Process(run.pid).children(recursive=True)
            workers = spawned_workers(children)
        assert len(workers) == 2, "the re-encode's two workers never started"
        assert_workers_end_with(run, workers, timeout=15)
    finally:
        kill_all(run, children)
    assert reencode_dataset(long_gop_ds, out, jobs=2).out == out  # the same command finishes the copy


def test_an_interrupted_move_into_an_empty_out_leaves_the_copy_whole_in_one_place(
    long_gop_ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into an existing empty OUT the finished copy was moved entry by entry: interrupted after the first (Ctrl-C,
    a kill), OUT held part of the copy and ``.OUT.partial`` the rest, and the same command refused OUT as taken.
    It is now renamed in one step; interrupted before that step, the same command finishes, every video kept."""
    moves: list[str] = []

    def interrupted(real: Any, out: Path, at: int) -> Any:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if out in (Path(dst), Path(dst).parent):
                moves.append(str(dst))
                if len(moves) == at:
                    raise KeyboardInterrupt
            real(src, dst, *args, **kwargs)

        return move

    for at in (2, 1):  # after the first move into OUT, then before it
        moves.clear()
        out = tmp_path / f"out{at}"
        out.mkdir()
        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", interrupted(os.replace, out, at))
            patch.setattr(os, "rename", interrupted(os.rename, out, at))
            with contextlib.suppress(KeyboardInterrupt):
                reencode_dataset(long_gop_ds, out, jobs=1)
        partial = tmp_path / f".out{at}.partial"
        in_out, in_partial = _files(out), _files(partial) if partial.exists() else {}
        assert not (in_out and in_partial), (sorted(in_out), sorted(in_partial))  # never split between the two
        if in_partial:
            report = reencode_dataset(long_gop_ds, out, jobs=1)
            assert report.videos and all(video.resumed for video in report.videos)
        assert sorted(_files(out)) == sorted(_files(long_gop_ds)) and not partial.exists()


def test_a_mount_point_out_is_refused_before_any_work(long_gop_ds: Path, tmp_path: Path, monkeypatch) -> None:
    """An empty OUT that is a mount point (a docker volume) failed once every video was re-encoded: the copy, written
    beside it, cannot be moved across filesystems (EXDEV)."""
    import lerobot_dali.new_folder as new_folder

    out = tmp_path / "volume"
    out.mkdir()
    monkeypatch.setattr(new_folder.os.path, "ismount", lambda path: Path(path) == out)
    with pytest.raises(ValueError, match=r"volume: it is a mount point, .* new folder inside it \(.*volume/NAME"):
        reencode_dataset(long_gop_ds, out, jobs=1)
    assert sorted(tmp_path.iterdir()) == [out] and not any(out.iterdir())


def test_each_videos_line_is_logged_on_its_own_line_not_after_the_bar(
    long_gop_ds: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a terminal (``lerobot-dali reencode`` draws its bar there) each file's INFO line was written after the
    bar (``... 0/4 [00:00<?, ?video/s]INFO lerobot_dali.reencode: ...``), as check's warnings were."""
    import logging
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    caplog.set_level(logging.INFO, logger="lerobot_dali.reencode")
    try:
        report = reencode_dataset(long_gop_ds, tmp_path / "out", gop=2, jobs=1, progress=True)
    finally:
        logging.getLogger().removeHandler(handler)
    err = capsys.readouterr().err
    assert "video/s]" in err, err  # the bar, drawn
    lines = [line.rsplit("\r", 1)[-1] for line in err.split("\n") if "frames decoded per frame" in line]
    assert len(lines) == len(report.videos), err
    assert all(line.startswith("INFO lerobot_dali.reencode: ") for line in lines), err


@pytest.mark.parametrize(
    ("source_pts", "shown", "copy_pts", "kept"),
    [
        ([-2, -1, 0, 1, 2], range(2, 5), [0, 1, 2], True),  # two frames hidden by an edit list's start: left out
        ([0, 1, 2, 3, 4], range(0, 3), [0, 1, 2], True),  # two hidden past its end: left out
        ([0, 1, 2, 3], range(0, 4), [1, 2, 3], False),  # the frame at 0 s lost by the encode
        ([-1, 0, 1, 2], range(1, 4), [0, 2], False),  # a shown frame lost in the middle
        ([0, 1, 2], range(0, 3), [0, 1, 2, 3], False),  # a frame more
        ([0, 1, 2, 3], range(0, 4), [0, 1, 3, 4], False),  # as many frames, two moved in time
    ],
)
def test_only_frames_the_edit_list_hides_may_be_missing_from_a_copy(
    source_pts: list[int], shown: range, copy_pts: list[int], kept: bool
) -> None:
    from types import SimpleNamespace

    from lerobot_dali.reencode import _check_same_frames

    def index(pts: list[int], shown: range) -> Any:
        return SimpleNamespace(
            shown_pts=np.array(pts)[shown.start : shown.stop], frame_count=len(pts), time_base=Fraction(1, 30),
            source_name="cam.mp4",
        )  # fmt: skip

    if kept:
        _check_same_frames(index(source_pts, shown), index(copy_pts, range(len(copy_pts))))
    else:
        with pytest.raises(VideoDecodeError, match="not kept"):
            _check_same_frames(index(source_pts, shown), index(copy_pts, range(len(copy_pts))))
