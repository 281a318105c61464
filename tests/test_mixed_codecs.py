"""A camera whose video files use different codecs, as LeRobot 0.4.4's ``delete_episodes`` and ``split_dataset``
leave an H.264 (or VP9) dataset: they re-encode the files they cut as AV1 and copy the others. Workers give each file
a decoder of its own, so such a camera reads there; NVDEC and DALI's CPU decoder decode a camera in one codec."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest

from lerobot_dali import DALILeRobotIterator, camera_codecs, camera_plan, concat_datasets, open_dataset
from lerobot_dali.batch_source import CameraFormat
from lerobot_dali.camera_plan import CameraPlanner
from lerobot_dali.dataset_check import check_dataset
from lerobot_dali.decode_route import DecodePreference, DecodeRoute, route_for_codecs
from lerobot_dali.errors import CodecUnsupportedError, SchemaMismatchError, VideoDecodeError
from lerobot_dali.frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import write_undecodable_mp4

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


def _every_sample_is_its_files_frame(dataset, *, routes: dict | None = None, **options) -> list[str]:
    """Reads every sample once; each frame must equal that frame of a full PyAV decode of its episode's file.
    Returns the codec of each file read, in path order; ``routes`` gets the iterator's routes."""
    it = DALILeRobotIterator(
        dataset, batch_size=5, device="cpu", shuffle=False, drop_last=False, return_uint8=True, **options
    )
    if routes is not None:
        routes.update(it.routes)
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


def test_a_worker_decoded_camera_whose_files_mix_codecs_reads_each_file_as_pyav_decodes_it(
    make_ds, copy_ds, caplog, monkeypatch
):
    """Before, the H.264 camera whose file-001 LeRobot's delete_episodes had re-encoded as AV1 was refused
    (SchemaMismatchError: 'is av1 64x96 (HxW), but the camera's first file is h264') by the iterator and by
    `lerobot-dali check`, though LeRobot reads it and the workers decode each file with a decoder of its own.
    A run surveys the camera's files (a run on NVDEC sends it to the workers), so check warns only past the
    survey's bound, where a run on NVDEC would refuse the AV1 file."""
    root = _mixed(make_ds, copy_ds, "h264", "av1")
    assert _every_sample_is_its_files_frame(root) == ["h264", "libdav1d", "h264"]
    with caplog.at_level(logging.WARNING):
        report = check_dataset(open_dataset(root), decode=True, workers=0)
    assert report.ok and report.frames_decoded == 48
    assert "mixes codecs" not in caplog.text
    monkeypatch.setattr("lerobot_dali.camera_codecs.CHECKED_FILES", 2)  # (3 files: past it, the first file only)
    with caplog.at_level(logging.INFO):
        assert check_dataset(open_dataset(root), workers=0).ok
    assert "has 3 video files, more than 2: only its first file's format is read" in caplog.text
    assert "mixes codecs (its first file is h264" in caplog.text and "decode='cpu'" in caplog.text
    # Only the size has to agree: a file of another size is refused still.
    first = CameraFormat.of(SimpleNamespace(codec="h264", height=64, width=96), route=DecodeRoute.CPU_FALLBACK)
    assert first.admits(SimpleNamespace(codec="av1", height=64, width=96))
    with pytest.raises(SchemaMismatchError, match=r"big\.mp4 .*is av1 96x96 \(HxW\), .*share one size"):
        first.check(SimpleNamespace(codec="av1", height=96, width=96), path="big.mp4", episode=4, camera=CAM)


_PAST = "video files, more than 2: only its first file's format is read when the iterator is built"


@pytest.mark.parametrize(
    ("kind", "bound", "surveyed", "said"),
    [
        ("local", 3, [0, 2, 4], None), ("local", 2, [0], f"has 3 {_PAST}"),
        ("remote", 3, [0, 2, 4], None), ("remote", 2, [0], f"has 3 {_PAST}"),
        ("union", 2, [0, 2], f"has 3 remote {_PAST}"),
    ],
)  # fmt: skip
def test_a_cameras_files_up_to_their_bound_are_each_surveyed(
    make_ds, monkeypatch, caplog, kind: str, bound: int, surveyed: list[int], said: str | None
) -> None:
    """3 files, whose first episodes are 0, 2 and 4: a bound of 3 files (local, or remote) surveys each; of 2, the
    first episode's alone, and says so. A union of a local dataset of 1 file (episodes 0-1) and that remote one
    surveys its local file and the remote dataset's first episode, saying which files were past their bound."""
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    monkeypatch.setattr(camera_codecs, "CHECKED_FILES" if kind == "local" else "CHECKED_FILES_REMOTE", bound)
    root = make_ds(**SPEC, codec="h264")
    if kind == "local":
        reader = open_dataset(root)
    else:
        reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    if kind == "union":
        reader = concat_datasets([open_dataset(make_ds(**{**SPEC, "episodes": 2}, codec="h264")), reader])
    with caplog.at_level(logging.INFO, logger="lerobot_dali"):
        assert camera_codecs.surveyed_positions(reader, CAM) == surveyed
    assert (said in caplog.text) if said else ("more than" not in caplog.text), caplog.text


def test_a_remote_cameras_files_are_surveyed_by_their_headers_where_no_index_store_is_given(make_ds, monkeypatch):
    """Without a packet index store (`lerobot-dali info`'s survey), a remote dataset's files are read by their
    headers, not each indexed whole."""
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    monkeypatch.setattr(camera_codecs, "load_episode_packet_index", lambda *a, **k: pytest.fail("a file indexed"))
    reader = open_dataset("fakeremote://", storage_options={"root": str(make_ds(**SPEC, codec="h264"))})
    formats = camera_codecs.survey_camera(reader, CAM, [0, 2, 4]).formats.values()
    assert [(f.codec, f.height, f.width, f.rate) for f in formats] == [("h264", 64, 96, 10.0)] * 3


@pytest.mark.parametrize("odd", [5, 6])
def test_files_of_another_size_are_named_five_and_the_others_counted(odd: int) -> None:
    """A camera's first file 64x96 and ``odd`` files 64x128 after it (by their headers): five are named, a sixth is
    counted."""
    paths = [f"file-{k:03d}.mp4" for k in range(odd + 1)]
    formats = {path: camera_codecs.FileFormat("h264", 64, 128 if k else 96, "yuv420p", (2, False))
               for k, path in enumerate(paths)}  # fmt: skip
    survey = camera_codecs.CameraSurvey(CAM, formats, {path: 2 * k for k, path in enumerate(paths)})
    named = "; ".join(f"{paths[k]} (episode {2 * k}, camera '{CAM}') is h264 64x128 (HxW)" for k in range(1, 6))
    more = " (and 1 more file)" if odd == 6 else ""
    with pytest.raises(SchemaMismatchError) as info:
        survey.check_sizes()
    assert str(info.value) == (
        f"{named}{more}, but the camera's first file (file-000.mp4) is h264 64x96 (HxW); a camera's videos must share "
        "one size (a batch is one tensor): re-encode these files at 64x96"
    )


@pytest.mark.parametrize(
    ("version", "cut_codec"), [("v3.0", "av1"), ("v2.1", "h264")], ids=["v3.0-av1-file", "v2.1-h264-file"]
)
def test_a_dali_decoded_camera_whose_files_mix_codecs_goes_to_the_workers_when_built(
    make_ds, copy_ds, caplog, version: str, cut_codec: str
) -> None:
    """Before, the route came from the first file alone: a VP9 camera (DALI's CPU decoder) whose one file is AV1
    or H.264 (LeRobot's delete_episodes re-encodes the file it cuts) built, then failed when a batch first reached
    that file (SchemaMismatchError: 'is av1, but the camera's first file is vp9'), maybe hours into training. Now
    every file's header is read when the iterator is built and the camera goes to the workers, with a warning."""
    spec = {**SPEC, "version": version}
    cut = CUT if version == "v3.0" else f"videos/chunk-000/{CAM}/episode_000002.mp4"
    root = copy_ds(make_ds(**spec, codec="vp9"))
    shutil.copyfile(make_ds(**spec, codec=cut_codec) / cut, root / cut)
    routes: dict = {}
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        codecs = _every_sample_is_its_files_frame(root, routes=routes)
    assert routes == {CAM: DecodeRoute.CPU_FALLBACK}
    assert sum(codec == "vp9" or "vpx" in codec for codec in codecs) == len(codecs) - 1  # (libvpx-vp9 or vp9)
    files = "vp9 2 files, av1 1 file" if version == "v3.0" else "vp9 5 files, h264 1 file"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and CAM in r.getMessage()]
    assert len(warned) == 1 and f"{CAM} (files of {files}): decoded in the workers" in warned[0]
    assert "lerobot-dali reencode" in warned[0]
    # `lerobot-dali check` holds the files as the run does: no problem (before: episodes 2-3 refused).
    assert check_dataset(open_dataset(root), workers=0).ok


def _routed(index, device_id: int) -> SimpleNamespace:
    """What :meth:`CameraPlanner.route` reads of its planner: the camera's first file (cam.mp4, local; ``index``), on
    GPU ``device_id``, the camera's files' survey stood in for (the route as given)."""
    return SimpleNamespace(
        device_id=device_id,
        depth_quantizers=(),
        reader=SimpleNamespace(filesystem_of=lambda path: None),
        _packet_index=lambda pos, camera: (SimpleNamespace(path="cam.mp4"), index),
        _route_for_files=lambda camera, route, preference, since=None: route,
    )


def test_a_union_whose_first_files_differ_in_codec_is_refused_on_a_gpu_where_nvdec_is_asked(make_ds) -> None:
    """A union's camera whose datasets' first files are H.264 and AV1, on a GPU (a fake one, device 0): decode='gpu'
    is refused, naming both codecs, as the camera's own mixed files are; 'auto' sends it to the workers. The
    preference was untested here (on the CPU it is always 'cpu')."""
    h264, av1 = (build_packet_index(make_ds(**SPEC, codec=codec) / CUT) for codec in ("h264", "av1"))
    asked = f"decode='gpu' was asked for {CAM} (files of h264 1 file, av1 1 file), but NVDEC decodes a camera in one"
    planned = _routed(h264, 0)
    with pytest.raises(CodecUnsupportedError, match=re.escape(asked)):
        CameraPlanner.route(planned, CAM, DecodePreference.GPU, others=[av1])
    assert CameraPlanner.route(planned, CAM, DecodePreference.AUTO, others=[av1])[2] is DecodeRoute.CPU_FALLBACK


def test_a_camera_of_one_codec_is_probed_on_the_ranks_own_gpu(make_ds, monkeypatch) -> None:
    """A camera whose files share a codec takes the route of the NVDEC probe of its first file on this rank's GPU
    (device 3 of a node), asked with the decode preference: the probe's device was untested (every test's GPU is
    device 0, or none, probed as 0)."""
    index = build_packet_index(make_ds(**SPEC, codec="h264") / CUT)
    asked = []

    def probe(source, index, *, decode=DecodePreference.AUTO, device_id=0, filesystem=None, label=""):
        asked.append((source, device_id, decode, label))
        return DecodeRoute.NVDEC

    monkeypatch.setattr(camera_plan, "route_for_video", probe)
    assert CameraPlanner.route(_routed(index, 3), CAM, DecodePreference.GPU, others=[])[2] is DecodeRoute.NVDEC
    assert asked == [("cam.mp4", 3, DecodePreference.GPU, CAM)]


def test_a_union_surveys_each_datasets_files(make_ds, copy_ds) -> None:
    """Both datasets' first files are VP9, the first dataset's file-001 AV1: the union's camera goes to the workers
    when built (before: DALI's CPU decoder, refusing the file when a batch reached it). Files are told apart by
    dataset, whose file-000s share a name."""
    from lerobot_dali import camera_codecs

    union = concat_datasets([_mixed(make_ds, copy_ds, "vp9", "av1"), make_ds(**SPEC, codec="vp9")])
    assert camera_codecs.file_positions(union, CAM) == [0, 2, 4, 6, 8, 10]
    it = DALILeRobotIterator(union, batch_size=5, device="cpu", num_workers=0)
    assert it.routes == {CAM: DecodeRoute.CPU_FALLBACK}
    it.close()


def _planner_stand_in(root: Path) -> SimpleNamespace:
    """What CameraPlanner._route_for_files reads of a planner over ``root`` (a fake GPU, no stores)."""
    return SimpleNamespace(
        reader=open_dataset(root), device_id=0, remote_index_store=None, format_store=None, surveys={},
        timestamp_source=TimestampSource.PARQUET_TIMESTAMP, tolerance_s=DEFAULT_TOLERANCE_S, unread_tail={},
    )  # fmt: skip


def test_a_dali_decoded_cameras_mixed_files_are_refused_at_build_for_decode_gpu(make_ds, copy_ds) -> None:
    """decode='gpu' (NVDEC or fail) on a camera whose files mix codecs fails when the iterator is built, naming the
    codecs (a fake GPU: the route as NVDEC chose it for the first file)."""
    root = _mixed(make_ds, copy_ds, "vp9", "av1")
    built = _planner_stand_in(root)
    with pytest.raises(CodecUnsupportedError, match=r"decode='gpu' .*\(files of vp9 2 files, av1 1 file\), .*one "
                       r"codec; .*lerobot-dali reencode"):  # fmt: skip
        CameraPlanner._route_for_files(built, CAM, DecodeRoute.NVDEC, DecodePreference.GPU)
    # decode='auto': the workers.
    auto = CameraPlanner._route_for_files(built, CAM, DecodeRoute.NVDEC, DecodePreference.AUTO)
    assert auto is DecodeRoute.CPU_FALLBACK


def test_an_nvdec_camera_whose_files_differ_in_colour_tags_goes_to_the_workers(make_ds, copy_ds, caplog) -> None:
    """NVDEC's colour correction is the first file's: an H.264 file tagged BT.709 among BT.601 ones (one codec) went
    to NVDEC and failed when a batch reached it; now its camera goes to the workers when built (a fake GPU), as it
    does from DALI's CPU decoder, which converts as BT.601 too and takes the first file's correction (it kept such a
    camera, giving the BT.709 file BT.601's colours, until 2026-12-06)."""
    root = copy_ds(make_ds(**SPEC, codec="h264"))
    with av.open(str(root / CUT)) as source:
        frames = [frame.to_ndarray(format="rgb24") for frame in source.decode(video=0)]
    with av.open(str(root / CUT), "w") as container:
        stream = container.add_stream("libx264", rate=FPS, options={"g": "4", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.colorspace = 1  # BT.709
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    built = _planner_stand_in(root)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        route = CameraPlanner._route_for_files(built, CAM, DecodeRoute.NVDEC, DecodePreference.AUTO)
    assert route is DecodeRoute.CPU_FALLBACK
    assert (
        f"{CAM} (files of h264 64x96 (HxW) yuv420p, colour space 2: 2 files; h264 64x96 (HxW) yuv420p, colour space 1: "
        "1 file): decoded in the workers" in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        route = CameraPlanner._route_for_files(built, CAM, DecodeRoute.DALI_CPU, DecodePreference.AUTO)
    assert route is DecodeRoute.CPU_FALLBACK
    assert "h264 64x96 (HxW) colour space 2: 2 files; h264 64x96 (HxW) colour space 1: 1 file" in caplog.text


def test_a_remote_cameras_files_are_surveyed_through_the_packet_index_store(make_ds, copy_ds, tmp_path, monkeypatch):
    """Remote: each file's packet index answers the survey, loaded from the on-disk store or built and kept there
    (the workers need it anyway; the node's other ranks and later runs load it), not a header every rank reads."""
    from lerobot_dali import packet_index_cache
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    # (a fresh process's memory: another test's fakeremote:// files of the same stamps left their indexes in it)
    monkeypatch.setattr(packet_index_cache, "_DEFAULT_CACHE", packet_index_cache.PacketIndexCache())
    root = _mixed(make_ds, copy_ds, "vp9", "av1")
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    it = DALILeRobotIterator(remote, batch_size=5, device="cpu", num_workers=0)
    assert it.routes == {CAM: DecodeRoute.CPU_FALLBACK}
    it.close()
    assert len(list((tmp_path / "cache/packet_index").glob("*/*.pidx"))) == 3  # (before: the first file's alone)


def test_a_file_of_another_size_is_refused_when_the_iterator_is_built(make_ds, copy_ds) -> None:
    """Before, a VP9 camera's 64x128 file among 64x96 ones failed when a batch first reached it; now at build,
    naming the file."""
    root = copy_ds(make_ds(**SPEC, codec="vp9"))
    shutil.copyfile(make_ds(**{**SPEC, "size": (64, 128)}, codec="vp9") / CUT, root / CUT)
    refused = (
        r"file-001\.mp4 \(episode 2, camera 'observation.images.cam0'\) is vp9 64x128 \(HxW\), but the camera's "
        r"first file \(.*file-000\.mp4\) is vp9 64x96 \(HxW\); .*one size"
    )
    with pytest.raises(SchemaMismatchError, match=refused):
        DALILeRobotIterator(root, batch_size=5, device="cpu", num_workers=0)


def test_the_cameras_surveys_count_their_progress_from_one_start(make_ds, monkeypatch) -> None:
    """A build surveys its cameras' files one camera after another, one wait: each survey is given the build's start
    (``since``), from which its progress line shows past 2 s, not its own (2 cameras: their surveys given one time,
    within the build's; given none, each counts from its own start: surveys of under 2 s each, more together, show
    no progress)."""
    from lerobot_dali import camera_plan

    real, since = camera_plan.survey_camera, []

    def survey(reader, camera, positions, **kwargs):
        since.append(kwargs.get("since"))
        return real(reader, camera, positions, **kwargs)

    monkeypatch.setattr(camera_plan, "survey_camera", survey)
    root = make_ds(**{**SPEC, "cameras": 2}, codec="h264")
    began = time.monotonic()
    DALILeRobotIterator(root, batch_size=5, device="cpu", num_workers=0).close()
    assert len(since) == 2 and since[0] == since[1] and began <= since[0] <= time.monotonic()


def test_a_camera_on_nvdec_refuses_a_file_of_another_codec_past_the_survey(make_ds) -> None:
    """Past the survey's bound (or where a run skipped it) a file of another codec is still refused when read,
    saying what reads it: on NVDEC, decode='cpu' too."""
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
    mixed = {"vp9": 1, "h264": 1}
    assert route_for_codecs(mixed, decode="cpu", on_gpu=False, label=CAM) is DecodeRoute.CPU_FALLBACK
    with pytest.raises(
        CodecUnsupportedError, match=r"decode='gpu' .*\(files of vp9 1 file, h264 1 file\), .*one codec"
    ):
        route_for_codecs(mixed, decode="gpu", on_gpu=True, label=CAM)
    with pytest.raises(SchemaMismatchError, match=r"camera 'observation.images.cam0'.*64x96.*64x128.*one size"):
        concat_datasets([paths[0], make_ds(**{**SPEC, "size": (64, 128)}, codec="h264")])


def test_mixed_codecs_are_warned_of_where_a_dali_decoder_is_passed_over_and_refused_where_none_decodes_one(
    caplog, monkeypatch
) -> None:
    """decode='cpu' on a GPU passes no DALI decoder over for H.264 and AV1 files: said at INFO, where decode='auto'
    warns (NVDEC would take a copy in one codec). A codec PyAV and torchcodec lack is refused when routed, not when a
    batch reaches its file."""
    from lerobot_dali import decode_route

    mixed = {"h264": 2, "av1": 1}
    with caplog.at_level(logging.INFO, logger="lerobot_dali.decode_route"):
        assert route_for_codecs(mixed, decode="cpu", on_gpu=True, label="cam.cpu") is DecodeRoute.CPU_FALLBACK
        assert route_for_codecs(mixed, decode="auto", on_gpu=True, label="cam.auto") is DecodeRoute.CPU_FALLBACK
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "cam.cpu (files of h264 2 files, av1 1 file): decoded in the workers (route cpu_fallback), a "
         "decoder per file: NVDEC and DALI's CPU decoder take one codec"),
        (logging.WARNING, "cam.auto (files of h264 2 files, av1 1 file): decoded in the workers (route cpu_fallback), "
         "a decoder per file: NVDEC and DALI's CPU decoder take one codec; lerobot-dali reencode copies a dataset in "
         "one codec"),
    ]  # fmt: skip
    monkeypatch.setattr(decode_route, "torchcodec_available", lambda: False)
    with pytest.raises(CodecUnsupportedError, match=r"No decoder handles cam \(files of h264 1 file, evc 1 file\): "
                       r"PyAV/torchcodec have none for \['evc'\]"):  # fmt: skip
        route_for_codecs({"h264": 1, "evc": 1}, on_gpu=False, label="cam")


def test_info_says_a_camera_of_few_files_mixes_codecs(make_ds, copy_ds, capsys) -> None:
    """`lerobot-dali info` probed the first file alone: a camera whose file-001 is AV1 among H.264 files read
    "codec h264" like a uniform one, though NVDEC and DALI's CPU decoder refuse it. Where a file does not open, the
    codecs go unsaid (not those of the files that open)."""
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
    (root / CUT.replace("file-001", "file-002")).unlink()  # (a file that does not open: the codecs go unsaid)
    assert main(["info", str(root), "--json"]) == 0
    assert "file_codecs" not in json.loads(capsys.readouterr().out)["cameras"][CAM]


@pytest.mark.parametrize("codec", ["vp9", "av1"], ids=["dali-decoded", "worker-decoded"])
def test_a_file_no_decoder_takes_is_left_out_of_the_survey_and_fails_when_reached(make_ds, copy_ds, codec) -> None:
    """Before, an MP4 whose codec FFmpeg has no decoder for (here EVC) among a camera's files failed the survey with
    an AttributeError (its stream has no codec context): a DALI-decoded camera's iterator did not build, and
    `lerobot-dali check` crashed on any camera (it surveys them all). Now the survey leaves it out, as it does a
    file that does not open: the iterator builds and the batch that reaches it raises CodecUnsupportedError naming
    it, as check reports it."""
    root = copy_ds(make_ds(**SPEC, codec=codec))
    (root / CUT).unlink()
    write_undecodable_mp4(root / CUT, frames=4, fps=FPS, width=96, height=64)
    _an_epoch_raises(root, CodecUnsupportedError, r"file-001\.mp4: FFmpeg finds no decoder", batch_size=5)
    problems = check_dataset(open_dataset(root), workers=0).problems
    assert [(p.episode_index, p.error) for p in problems] == [
        (2, "CodecUnsupportedError"),
        (3, "CodecUnsupportedError"),
    ]


def _an_epoch_raises(root: Path, error: type[Exception], match: str, *, batch_size: int) -> None:
    """The iterator over ``root`` builds (CPU mode, in-process), and a pass over it raises ``error``."""
    it = DALILeRobotIterator(root, batch_size=batch_size, device="cpu", shuffle=False, num_workers=0)
    try:
        with pytest.raises(error, match=match):
            for _ in it:
                pass
    finally:
        it.close()


#: A camera the workers decode on this machine (device='cpu'): H.264 in v2.1 (a file an episode), AV1 in v3.0.
WORKER_CASES = pytest.mark.parametrize(
    ("version", "codec", "odd"),
    [("v2.1", "h264", f"videos/chunk-000/{CAM}/episode_000002.mp4"), ("v3.0", "av1", CUT)],
    ids=["v2.1-h264", "v3.0-av1"],
)


@WORKER_CASES
def test_a_worker_decoded_cameras_file_of_another_size_is_refused_when_the_iterator_is_built(
    make_ds, copy_ds, version: str, codec: str, odd: str
) -> None:
    """Before, the survey read DALI-decoded cameras' files alone: a worker-decoded camera's 64x128 file among 64x96
    ones built, then failed when a batch first reached it, maybe hours into training. Now the iterator refuses it
    when built, naming the file and both sizes, as `lerobot-dali check` reports it."""
    spec = {**SPEC, "version": version}
    root = copy_ds(make_ds(**spec, codec=codec))
    shutil.copyfile(make_ds(**{**spec, "size": (64, 128)}, codec=codec) / odd, root / odd)
    refused = (
        rf"{re.escape(odd)} \(episode 2, camera '{CAM}'\) is {codec} 64x128 \(HxW\), but the camera's first file "
        rf"\(.*\) is {codec} 64x96 \(HxW\); .*one size"
    )
    with pytest.raises(SchemaMismatchError, match=refused):
        DALILeRobotIterator(root, batch_size=5, device="cpu", shuffle=False, num_workers=0)
    problems = check_dataset(open_dataset(root), workers=0).problems
    in_file = [2] if version == "v2.1" else [2, 3]  # (v3.0: file-001 holds episodes 2-3)
    assert [(p.episode_index, p.error) for p in problems] == [(e, "SchemaMismatchError") for e in in_file]
    assert all(odd in p.message and "64x128" in p.message for p in problems)


@WORKER_CASES
def test_a_worker_decoded_cameras_clean_files_build_and_read_as_pyav_decodes_them(
    make_ds, version: str, codec: str, odd: str
) -> None:
    """The control: every file surveyed, a clean camera still goes to the workers and reads every frame."""
    root = make_ds(**{**SPEC, "version": version}, codec=codec)
    routes: dict = {}
    assert set(_every_sample_is_its_files_frame(root, routes=routes)) == {"h264" if codec == "h264" else "libdav1d"}
    assert routes == {CAM: DecodeRoute.CPU_FALLBACK}
    assert check_dataset(open_dataset(root), workers=0).ok


def test_a_worker_decoded_cameras_unreadable_file_still_fails_when_a_batch_reaches_it(make_ds, copy_ds) -> None:
    """The survey leaves out a file whose header does not open, as where DALI decodes the camera: the iterator builds,
    and the batch that reaches the file raises, naming it (the build does not refuse what it did not before)."""
    spec = {**SPEC, "version": "v2.1"}
    odd = f"videos/chunk-000/{CAM}/episode_000004.mp4"
    root = copy_ds(make_ds(**spec, codec="h264"))
    (root / odd).write_bytes(b"not a video" * 100)
    _an_epoch_raises(root, VideoDecodeError, r"episode_000004\.mp4", batch_size=8)


def test_a_remote_worker_decoded_cameras_files_are_surveyed_through_the_packet_index_store(
    make_ds, copy_ds, tmp_path, monkeypatch
) -> None:
    """Remote, each file's packet index answers the survey (kept in the store for the workers): a 64x128 AV1 file
    among 64x96 ones is refused when the iterator is built, and every file's index is in the store."""
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    root = copy_ds(make_ds(**SPEC, codec="av1"))
    shutil.copyfile(make_ds(**{**SPEC, "size": (64, 128)}, codec="av1") / CUT, root / CUT)
    remote = open_dataset("fakeremote://", storage_options={"root": str(root)})
    with pytest.raises(SchemaMismatchError, match=r"file-001\.mp4 .*is av1 64x128 \(HxW\), .*is av1 64x96"):
        DALILeRobotIterator(remote, batch_size=5, device="cpu", num_workers=0)
    assert len(list((tmp_path / "cache/packet_index").glob("*/*.pidx"))) == 3


def test_diagnose_names_the_route_a_camera_whose_files_mix_codecs_takes(make_ds, copy_ds) -> None:
    """`lerobot-dali diagnose` routed a camera by its first file alone: a VP9 camera with one AV1 file read "route
    dali_cpu", though the iterator surveys its files and sends it to the workers (cpu_fallback)."""
    from lerobot_dali.diagnose import diagnose_dataset, diagnose_machine

    root = _mixed(make_ds, copy_ds, "vp9", "av1")
    (report,) = diagnose_dataset(open_dataset(root), machine=diagnose_machine())
    assert (report.codec, report.route, report.error) == ("vp9", DecodeRoute.CPU_FALLBACK.value, None)
    (uniform,) = diagnose_dataset(open_dataset(make_ds(**SPEC, codec="vp9")), machine=diagnose_machine())
    assert uniform.route in (DecodeRoute.NVDEC.value, DecodeRoute.DALI_CPU.value)  # (one codec: a DALI decoder)


def test_a_file_past_the_survey_in_another_codec_fails_the_batch_that_reaches_it(make_ds, copy_ds, monkeypatch):
    """Past the survey's bound only the first file's format is read when the iterator is built: a VP9 camera goes
    to DALI's CPU decoder, and its AV1 file-001 (episodes 2-3) must be refused by name when a batch reaches it, not
    handed to a decoder that cannot read it (the batches computed ahead reach it before the loop sees batch 3)."""
    root = _mixed(make_ds, copy_ds, "vp9", "av1")
    monkeypatch.setattr("lerobot_dali.camera_codecs.CHECKED_FILES", 2)  # (3 files: past it, the first file only)
    it = DALILeRobotIterator(root, batch_size=8, device="cpu", shuffle=False, num_workers=0, return_uint8=True)
    assert it.routes == {CAM: DecodeRoute.DALI_CPU}
    with pytest.raises(SchemaMismatchError, match=(
        rf"file-001\.mp4 \(episode 2, camera '{re.escape(CAM)}'\) is av1, but the camera's first file is vp9 "
        r"64x96 \(HxW\) colour space 2, which sent the camera to DALI's CPU decoder"
    )):  # fmt: skip
        list(it)
    it.close()
