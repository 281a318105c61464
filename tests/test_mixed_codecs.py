"""A camera whose video files use different codecs, as LeRobot 0.4.4's ``delete_episodes`` and ``split_dataset``
leave an H.264 (or VP9) dataset: they re-encode the files they cut as AV1 and copy the others. Workers give each file
a decoder of its own, so such a camera reads there; NVDEC and DALI's CPU decoder decode a camera in one codec."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest

from lerobot_dali import DALILeRobotIterator, concat_datasets, open_dataset
from lerobot_dali.batch_source import CameraFormat
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.decode_route import DecodeRoute, route_for_codecs
from lerobot_dali.errors import CodecUnsupportedError, SchemaMismatchError
from lerobot_dali.packet_index import build_packet_index

FPS = 10
CAM = "observation.images.cam0"
#: file-000 holds episodes 0-1, file-001 2-3, file-002 4-5.
SPEC = dict(episodes=6, frames_per_episode=8, cameras=1, fps=FPS, gop=4, episodes_per_file=2, size=(64, 96), seed=3)
CUT = f"videos/{CAM}/chunk-000/file-001.mp4"


def _mixed(make_ds, copy_ds, codec: str, cut_codec: str) -> Path:
    """A ``codec`` dataset whose file-001 is the same frames in ``cut_codec``, as delete_episodes leaves one."""
    root = copy_ds(make_ds(**SPEC, codec=codec))
    shutil.copyfile(make_ds(**SPEC, codec=cut_codec) / CUT, root / CUT)
    return root


def _full_decodes(paths: set[str]) -> dict[str, list[np.ndarray]]:
    decoded = {}
    for path in sorted(paths):
        with av.open(path) as container:
            decoded[path] = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return decoded


def _every_sample_is_its_files_frame(dataset, **options) -> list[str]:
    """Reads every sample once; each frame must equal that frame of a full PyAV decode of its episode's file.
    Returns the codec of each file read, in path order."""
    it = DALILeRobotIterator(
        dataset, batch_size=5, device="cpu", shuffle=False, drop_last=False, return_uint8=True, **options
    )
    reader, samples = it.reader, []
    for batch in it:
        members = batch.get("dataset_index", batch["index"] * 0).tolist()
        for member, episode, frame_index, frame in zip(
            members, batch["episode_index"].tolist(), batch["frame_index"].tolist(), batch[CAM], strict=True
        ):
            pos = int(getattr(reader, "starts", [0])[member]) + episode  # (episodes 0, 1, ... of each dataset)
            samples.append((reader.video(pos, CAM), frame_index, frame.permute(1, 2, 0).numpy()))
    it.close()
    assert len(samples) == reader.num_frames
    decoded = _full_decodes({video.path for video, _, _ in samples})
    for video, frame_index, frame in samples:
        number = round(video.from_timestamp_s * FPS) + frame_index
        np.testing.assert_array_equal(frame, decoded[video.path][number])
    codecs = []
    for path in decoded:
        with av.open(path) as container:
            codecs.append(container.streams.video[0].codec_context.name)
    return codecs


def test_a_worker_decoded_camera_whose_files_mix_codecs_reads_each_file_as_pyav_decodes_it(make_ds, copy_ds, caplog):
    """Before, the H.264 camera whose file-001 LeRobot's delete_episodes had re-encoded as AV1 was refused
    (SchemaMismatchError: 'is av1 64x96 (HxW), but the camera's first file is h264') by the iterator and by
    `lerobot-dali check`, though LeRobot reads it and the workers decode each file with a decoder of its own."""
    root = _mixed(make_ds, copy_ds, "h264", "av1")
    assert _every_sample_is_its_files_frame(root) == ["h264", "libdav1d", "h264"]
    with caplog.at_level(logging.WARNING):
        report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert report.ok and report.frames_decoded == 48
    assert "mixes codecs (its first file is h264" in caplog.text and "decode='cpu'" in caplog.text
    # Only the size has to agree: a file of another size is refused still.
    first = CameraFormat.of(SimpleNamespace(codec="h264", height=64, width=96), route=DecodeRoute.CPU_FALLBACK)
    assert first.admits(SimpleNamespace(codec="av1", height=64, width=96))
    with pytest.raises(SchemaMismatchError, match=r"big\.mp4 .*is av1 96x96 \(HxW\), .*share one size"):
        first.check(SimpleNamespace(codec="av1", height=96, width=96), path="big.mp4", episode=4, camera=CAM)


def test_a_dali_decoded_camera_refuses_a_file_of_another_codec_saying_what_reads_it(make_ds, copy_ds) -> None:
    """DALI's CPU decoder (VP9 on a machine without NVDEC) takes VP8/VP9/MJPEG only: a VP9 camera's AV1 file is
    refused, by the iterator and by check, offering the copy with one codec; on NVDEC, decode='cpu' too."""
    root = _mixed(make_ds, copy_ds, "vp9", "av1")
    it = DALILeRobotIterator(root, batch_size=5, device="cpu", shuffle=False, num_workers=0)
    with pytest.raises(SchemaMismatchError, match=r"file-001\.mp4 \(episode 2, .*\) is av1, but the camera's first "
                       r"file is vp9 64x96 \(HxW\), which sent the camera to DALI's CPU decoder, one codec per camera: "
                       r"copy the dataset with one codec \(`lerobot-dali reencode`"):  # fmt: skip
        list(it)
    it.close()
    report = check_dataset(open_dataset(root), workers=0)
    assert {(p.episode_index, p.error) for p in report.problems} == {
        (2, "SchemaMismatchError"),
        (3, "SchemaMismatchError"),
    }
    h264, av1 = (build_packet_index(make_ds(**SPEC, codec=codec) / CUT) for codec in ("h264", "av1"))
    on_nvdec = CameraFormat.of(h264, route=DecodeRoute.NVDEC)
    with pytest.raises(SchemaMismatchError, match=r"is av1, .*to NVDEC, one codec per camera: pass decode='cpu'"):
        on_nvdec.check(av1, path="cut.mp4", episode=2, camera=CAM)


def test_a_union_whose_datasets_first_files_differ_in_codec_decodes_the_camera_in_the_workers(make_ds, caplog) -> None:
    """Before, concat_datasets refused a VP9 and an H.264 dataset ('differ in the video of camera ...: vp9 64x96 vs
    h264 64x96'); now the camera goes to the workers (DALI's CPU decoder takes VP9 only), every frame as PyAV
    decodes its file, and `check --concat` finds no problem."""
    paths = [make_ds(**SPEC, codec="vp9"), make_ds(**{**SPEC, "episodes": 2}, codec="h264")]
    union = concat_datasets(paths)
    codecs = _every_sample_is_its_files_frame(union)
    assert len(codecs) == 4 and codecs.count("h264") == 1 and all("vp9" in c for c in codecs if c != "h264")
    with caplog.at_level(logging.WARNING):
        assert check_dataset(concat_datasets(paths), workers=0).ok
    assert "mixes codecs" not in caplog.text  # (no run sends this camera to NVDEC)
    assert route_for_codecs(["h264", "vp9"], decode="cpu", on_gpu=False, label=CAM) is DecodeRoute.CPU_FALLBACK
    with pytest.raises(CodecUnsupportedError, match=r"decode='gpu' .*\(files of h264, vp9\), .*one codec"):
        route_for_codecs(["h264", "vp9"], decode="gpu", on_gpu=True, label=CAM)
    with pytest.raises(SchemaMismatchError, match=r"camera 'observation.images.cam0'.*64x96.*64x128.*one size"):
        concat_datasets([paths[0], make_ds(**{**SPEC, "size": (64, 128)}, codec="h264")])


def test_info_says_a_camera_of_few_files_mixes_codecs(make_ds, copy_ds, capsys) -> None:
    """`lerobot-dali info` probed the first file alone: a camera whose file-001 is AV1 among H.264 files read
    "codec h264" like a uniform one, though NVDEC and DALI's CPU decoder refuse it."""
    from lerobot_dali.cli import main

    root = _mixed(make_ds, copy_ds, "h264", "av1")
    assert main(["info", str(root), "--json"]) == 0
    camera = json.loads(capsys.readouterr().out)["cameras"][CAM]
    assert camera["codec"] == "h264" and camera["file_codecs"] == {"h264": 2, "av1": 1}
    assert main(["info", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"camera {CAM}: codec h264 64x96 (HxW)" in out and "files mix codecs: h264 2 files, av1 1 file" in out
    assert main(["info", str(make_ds(**SPEC, codec="h264")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cameras"][CAM]["file_codecs"] == {"h264": 3}
