"""``lerobot-dali diagnose`` shows each camera's route as the iterator takes it: the same router
(:class:`~lerobot_dali.camera_plan.CameraRouter`), its files surveyed through the same kind of stores. Checked against
a CPU iterator's own plan on the real datasets and on generated ones (one codec; files mixing VP9 and AV1; a file of
another size; a remote dataset; a union)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lerobot_dali import DALILeRobotIterator, camera_plan, concat_datasets, diagnose, open_dataset
from lerobot_dali.dataset_reader import LeRobotDatasetReader
from lerobot_dali.diagnose import MachineReport, diagnose_dataset
from lerobot_dali.errors import DatasetError
from tests.conftest import shared_dataset

CAM = "observation.images.cam0"
SPEC = dict(episodes=6, frames_per_episode=8, cameras=1, fps=10, gop=4, episodes_per_file=2, size=(64, 96), seed=3)
CUT = f"videos/{CAM}/chunk-000/file-001.mp4"  # episodes 2-3
CPU = MachineReport(cuda_available=False, gpu_name=None, compute_capability=None, nvcuvid_library=None,
                    dali_version=None, cpu_decoders="PyAV")  # fmt: skip
#: The iterator's options each real dataset builds with (their timestamps' quirks: datasets/README.md).
REAL = {
    "cr5_v30_av1": ({}, {"timestamp_source": "frame_index"}),
    "cr5_v21_av1": ({}, {"timestamp_source": "frame_index"}),
    "r1_v30_h264": ({"keys": ["action"]}, {"tolerance_s": 0.0201}),
    "gr00t_v20_h264": ({"cameras": ["observation.images.ego_view"]}, {"timestamp_source": "frame_index"}),
}


def _opener(name: str, make_ds: Callable[..., Path], copy_ds: Callable[[Path], Path]) -> Callable[[], Any]:
    """A function opening dataset ``name`` anew (a reader each for the iterator and diagnose)."""
    from tests import fake_remote  # noqa: F401  (registers the fakeremote:// protocol)

    if name in REAL:
        root, opening = shared_dataset(name), REAL[name][0]
        return lambda: open_dataset(root, **opening)
    vp9 = make_ds(**SPEC, codec="vp9")
    if name == "vp9":
        return lambda: open_dataset(vp9)
    if name == "union vp9 | av1":
        av1 = make_ds(**SPEC, codec="av1")
        return lambda: concat_datasets([open_dataset(vp9), open_dataset(av1)])
    cut = {"vp9+av1": make_ds(**SPEC, codec="av1"), "vp9+av1 remote": make_ds(**SPEC, codec="av1"),
           "vp9 64x128 file": make_ds(**{**SPEC, "size": (64, 128)}, codec="vp9"),
           SHORT: make_ds(**{**SPEC, "frames_per_episode": 7}, codec="vp9")}[name]  # fmt: skip
    root = copy_ds(vp9)
    shutil.copyfile(cut / CUT, root / CUT)
    if name.endswith("remote"):
        return lambda: open_dataset("fakeremote://", storage_options={"root": str(root)})
    return lambda: open_dataset(root)


def _iterator_routes(reader: LeRobotDatasetReader, **options: Any) -> dict[str, str] | str:
    """The route of each camera of a CPU iterator built on ``reader`` (its own plan), or why it was refused."""
    try:
        it = DALILeRobotIterator(reader, batch_size=2, device="cpu", num_workers=0, **options)
    except DatasetError as e:
        return f"{type(e).__name__}: {e}"
    it.close()
    return {camera: route.value for camera, route in it.routes.items()}


#: file-001 of 14 frames (2 episodes of 7) where episodes 2-3 have 8 rows each: its last row 0.1 s past its end.
SHORT = "vp9 file 2 frames short"
CASES = [*REAL, "vp9", "vp9+av1", "vp9+av1 remote", "vp9 64x128 file", SHORT, "union vp9 | av1"]


@pytest.mark.parametrize("name", CASES)
def test_diagnose_shows_the_route_the_iterator_takes(name, make_ds, copy_ds, tmp_path, monkeypatch) -> None:
    """Per camera, diagnose's route equals the route a CPU iterator took, or both refuse the camera alike (before:
    a VP9 camera with a 64x128 file among 64x96 ones read "route cpu_fallback" where the iterator refused it). A
    file whose last episode's last row lies past its end is refused by both: diagnose holds every row to it, as the
    iterator's defaults do."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    opener = _opener(name, make_ds, copy_ds)
    routes = _iterator_routes(opener(), **REAL.get(name, ({}, {}))[1])
    reports = diagnose_dataset(opener(), machine=CPU)
    shown = {r.camera: r.route for r in reports} if all(r.error is None for r in reports) else reports[0].error
    assert shown == routes
    if name == "vp9 64x128 file":
        assert isinstance(shown, str) and re.match(r"SchemaMismatchError: .*file-001\.mp4 .*is vp9 64x128", shown)
    elif name == SHORT:
        said = "ends at 1.400000 s (its header: 10 fps), but episode 3, its last, has 8 rows at 10 fps from its "
        assert (
            isinstance(shown, str) and f"{CUT} (camera '{CAM}') {said}from_timestamp 0.800000 s, the last at " in shown
        )
    else:
        assert isinstance(shown, dict) and set(shown.values()) == {"dali_cpu" if name == "vp9" else "cpu_fallback"}


@pytest.mark.parametrize("name", ["vp9+av1", "vp9+av1 remote", "union vp9 | av1"])
def test_diagnose_surveys_through_the_stores_the_iterator_does(name, make_ds, copy_ds, tmp_path, monkeypatch) -> None:
    """Each packet index loaded to route a camera and each survey of its files: the same episodes, through the same
    kind of stores in the same folders, whether diagnose or the iterator routes it (before: diagnose loaded the first
    file's index through no store, where the iterator keeps every index in its packet index store)."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    calls: list[tuple[Any, ...]] = []

    def store(kept: Any) -> tuple[str, str] | None:
        return None if kept is None else (type(kept).__name__, str(kept.directory))

    def load(reader, pos, camera, **kwargs: Any) -> Any:
        calls.append(("index", pos, camera, store(kwargs.get("store"))))
        return real_load(reader, pos, camera, **kwargs)

    def survey(reader, camera, positions, **kwargs: Any) -> Any:
        kept = (store(kwargs.get("store")), store(kwargs.get("format_store")))
        calls.append(("survey", camera, tuple(positions), kwargs.get("skip_unreadable"), *kept))
        return real_survey(reader, camera, positions, **kwargs)

    real_load, real_survey = camera_plan.load_episode_packet_index, camera_plan.survey_camera
    for module in (camera_plan, diagnose):  # (raising=False: diagnose routes through camera_plan, importing neither)
        monkeypatch.setattr(module, "load_episode_packet_index", load, raising=False)
        monkeypatch.setattr(module, "survey_camera", survey, raising=False)
    opener = _opener(name, make_ds, copy_ds)
    assert _iterator_routes(opener()) == {CAM: "cpu_fallback"}
    by_iterator, calls[:] = sorted(calls, key=str), []
    (report,) = diagnose_dataset(opener(), machine=CPU)
    assert report.route == "cpu_fallback"
    assert sorted(calls, key=str) == by_iterator
    remote = name.endswith("remote")  # (a remote dataset's files surveyed from the packet index store)
    assert [(c[4] is not None, c[5] is not None) for c in by_iterator if c[0] == "survey"] == [(remote, not remote)]
    assert ("index", 0, CAM, ("PacketIndexStore", str(tmp_path / "cache/packet_index"))) in by_iterator


@pytest.mark.parametrize("options", ["defaults", "the dataset's"])
@pytest.mark.parametrize("name", [*REAL, "vp9"])
def test_diagnose_refuses_a_camera_as_building_the_iterator_does(name, options, make_ds, copy_ds, tmp_path,
                                                                 monkeypatch) -> None:  # fmt: skip
    """With the same options, diagnose's verdict is the iterator's build: the error it raises (a camera's first
    episode's rows finding no frame, its message saying which option reads them), or the routes it takes. Before,
    diagnose showed a healthy route for each real dataset the iterator refuses with its default options."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    opener = _opener(name, make_ds, copy_ds)
    given = REAL.get(name, ({}, {}))[1] if options == "the dataset's" else {}
    built = _iterator_routes(opener(), **given)
    reports = diagnose_dataset(opener(), machine=CPU, **given)
    assert all(r.error is None for r in reports)
    refusals = [r.refused for r in reports if r.refused is not None]
    assert (refusals[0] if refusals else {r.camera: r.route for r in reports}) == built
    assert [r.ok for r in reports] == [not refusals]
    if name in REAL and options == "defaults":
        advice = "--tolerance-s 0.0201" if name == "r1_v30_h264" else "--timestamp-source frame_index"
        assert isinstance(built, str) and built.startswith("FrameTimestampError: ") and advice in built
    else:
        assert isinstance(built, dict)


@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_diagnose_refuses_the_torchcodec_backend_as_building_the_iterator_does(codec, make_ds, tmp_path,
                                                                               monkeypatch) -> None:  # fmt: skip
    """``cpu_decode=CpuDecodeOptions(backend=torchcodec)`` where torchcodec does not load: both refuse an H.264 camera
    (the workers decode it) with the same CodecUnsupportedError; both pass a VP9 one (DALI decodes it)."""
    from lerobot_dali import CpuDecodeOptions
    from lerobot_dali.cpu_backends import torchcodec_unavailable

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec=codec)
    torchcodec = CpuDecodeOptions(backend="torchcodec")
    built = _iterator_routes(open_dataset(root), cpu_decode=torchcodec)
    (report,) = diagnose_dataset(open_dataset(root), machine=CPU, cpu_decode=torchcodec)
    assert (report.refused or {CAM: report.route}) == built
    if codec == "vp9":
        assert built == {CAM: "dali_cpu"}
    elif torchcodec_unavailable() is not None:
        assert isinstance(built, str) and built.startswith("CodecUnsupportedError: cpu_decode=CpuDecodeOptions(")


@pytest.mark.parametrize("order", ["shifted last", "shifted first"])
def test_diagnose_refuses_a_unions_camera_as_building_the_iterator_does(order, make_ds, copy_ds, tmp_path,
                                                                        monkeypatch) -> None:  # fmt: skip
    """A union's datasets' first episodes are each looked up when the iterator is built; diagnose looked up the
    union's first only, so a union whose second dataset's first episode's rows miss its video (timestamps 0.5 s late)
    showed a healthy route, ok, where the iterator refuses it. Now both give the same FrameTimestampError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    plain = make_ds(**SPEC, codec="vp9")
    shifted = copy_ds(plain)
    data = shifted / "data/chunk-000/file-000.parquet"  # episodes 0-1
    table = pq.read_table(data)
    late = table.column("timestamp").to_numpy() + 0.5 * (table.column("episode_index").to_numpy() == 0)
    pq.write_table(table.set_column(table.schema.get_field_index("timestamp"), "timestamp", pa.array(late)), data)
    roots = [plain, shifted] if order == "shifted last" else [shifted, plain]
    opener = lambda: concat_datasets([open_dataset(root) for root in roots])  # noqa: E731
    built = _iterator_routes(opener())
    (report,) = diagnose_dataset(opener(), machine=CPU)
    assert isinstance(built, str) and built.startswith(f"FrameTimestampError: dataset {shifted}, episode 0, ")
    assert report.error is None and report.route == "dali_cpu" and report.refused == built and not report.ok


def test_a_cpu_router_chooses_for_the_cpu_without_probing_nvdec(make_ds, tmp_path, monkeypatch) -> None:
    """With no device (a CPU iterator) a camera's route is chosen for the CPU whatever ``decode`` asks: decode='auto'
    probed NVDEC with clips of the first file, and on a machine with a GPU gave a CPU iterator's camera NVDEC's
    route."""
    from lerobot_dali import decode_route

    def probe(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("NVDEC probed for a CPU iterator")

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(decode_route, "_cached_or_probed", probe)
    for codec, route in [("h264", "cpu_fallback"), ("vp9", "dali_cpu")]:
        root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec=codec)
        assert _iterator_routes(open_dataset(root), decode="auto") == {CAM: route}


def test_a_unions_camera_counts_each_datasets_first_file_once(make_ds, tmp_path, monkeypatch, caplog) -> None:
    """A union of a VP9 and an AV1 dataset: the camera goes to the workers, its codecs counted over the datasets'
    first files, one each (the union's first episode counted among the others' too read "vp9 2 files")."""
    import logging

    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    union = concat_datasets([open_dataset(make_ds(**SPEC, codec="vp9")), open_dataset(make_ds(**SPEC, codec="av1"))])
    with caplog.at_level(logging.DEBUG, logger="lerobot_dali.decode_route"):  # (said once a process: DEBUG after)
        assert _iterator_routes(union) == {CAM: "cpu_fallback"}
    assert f"{CAM} (files of vp9 1 file, av1 1 file): decoded in the workers" in caplog.text


def test_the_build_looks_up_the_first_and_last_rows_of_an_episode_in_every_camera(monkeypatch) -> None:
    """check_rows_find_frames finds the frames of an episode's first and last rows (of 8: rows 0 and 7; the last a
    sample reads: 4 where the last 3 are unread) in each camera's file, with the iterator's options (the lookup stood
    in for): a first row that misses its video (rows shifted a frame, wall-clock time) is refused when the iterator is
    built, not by a worker hours in."""
    from types import SimpleNamespace

    import numpy as np

    looked = []

    def lookup(reader, pos, camera, rows, ends, index, **options):
        looked.append((pos, camera, index, ends.tolist(), options))

    monkeypatch.setattr(camera_plan, "row_frame_numbers", lookup)
    router = SimpleNamespace(reader=None, timestamp_source="frame_index", tolerance_s=0.02, unread_tail={"b": 3})
    rows = {"timestamp": np.arange(8) / 10}
    camera_plan.CameraRouter.check_rows_find_frames(router, 2, {"a": "a.mp4's", "b": "b.mp4's"}, rows=rows)
    options = {"timestamp_source": "frame_index", "tolerance_s": 0.02}
    # (b's last 3 rows no sample reads, drop_n_last_frames past its window: its last row read is row 4)
    assert looked == [(2, "a", "a.mp4's", [0, 7], options), (2, "b", "b.mp4's", [0, 4], options)]


@pytest.mark.parametrize(
    ("workers", "advice"),
    [
        (2, "so if the loop waits for batches, raise num_workers toward the CPU count"),
        (4, "give this rank more CPUs (fewer ranks per node): its workers already match its CPUs"),
        (6, "give this rank more CPUs (fewer ranks per node): its workers already outnumber its CPUs"),
    ],
    ids=["fewer", "as_many", "more"],
)
def test_the_workers_cameras_line_advises_by_the_workers_and_cpus(monkeypatch, caplog, workers: int, advice: str):
    """The line of the cameras the workers decode says what to do by the rank's workers against its CPUs (4): fewer
    workers, raise them; as many or more, give the rank CPUs, its workers matching or outnumbering them."""
    import logging
    from types import SimpleNamespace

    from lerobot_dali import CpuDecodeOptions
    from lerobot_dali.decode_route import DecodeRoute

    monkeypatch.setattr(camera_plan, "cpus_per_local_rank", lambda: 4)
    planner = SimpleNamespace(
        device_id=None, cpu_decode=CpuDecodeOptions(), augment=None, image_size=None, depth_quantizers=(),
        color_fixes={}, share_clips=False, depth_cameras=(), num_workers=workers,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lerobot_dali.camera_plan"):
        camera_plan.CameraPlanner.plan_feeds(planner, {"cam": DecodeRoute.CPU_FALLBACK})
    [said] = [r.getMessage() for r in caplog.records if "are decoded on the CPU" in r.getMessage()]
    assert said.startswith(f"cameras ['cam'] are decoded on the CPU by {workers} worker processes, with 4 CPUs for")
    assert advice in said


def test_the_torchcodec_backend_is_refused_for_the_workers_cameras_but_not_depth_ones(monkeypatch) -> None:
    """cpu_decode=torchcodec where torchcodec does not load: refused naming the cameras the workers decode, but not for
    a depth camera (PyAV decodes its 12-bit codes whatever the backend) nor a camera DALI decodes; PyAV's backend
    passes."""
    from types import SimpleNamespace

    from lerobot_dali import CpuDecodeOptions
    from lerobot_dali.decode_route import DecodeRoute
    from lerobot_dali.errors import CodecUnsupportedError

    monkeypatch.setattr(camera_plan, "torchcodec_unavailable", lambda: "torchcodec is not installed")
    check = camera_plan.CameraRouter.check_backend
    router = SimpleNamespace(cpu_decode=CpuDecodeOptions(backend="torchcodec"), depth_quantizers={"depth"})
    check(router, {"depth": DecodeRoute.CPU_FALLBACK, "rgb": DecodeRoute.DALI_CPU})
    workers = {"depth": DecodeRoute.CPU_FALLBACK, "rgb": DecodeRoute.CPU_FALLBACK}
    said = (
        "cpu_decode=CpuDecodeOptions(backend=torchcodec) for cameras ['rgb'], which the workers decode, but torchcodec"
    )
    with pytest.raises(CodecUnsupportedError, match=re.escape(said)):
        check(router, workers)
    check(SimpleNamespace(cpu_decode=CpuDecodeOptions(backend="pyav"), depth_quantizers=set()), workers)
