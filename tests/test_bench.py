"""``lerobot-dali bench --quick`` on the CPU: report schema, numbers that agree with each other, the files,
windows per mode and recipe, and a run that fails because a loader measured no frame."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from lerobot_dali.bench import METRIC_FIELDS, BenchConfig, clip_footprint, default_specs, load_plan
from lerobot_dali.bench_peers import lerobot_unavailable
from lerobot_dali.bench_types import BenchDataset
from lerobot_dali.cli import main
from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.errors import FrameTimestampError

QUICK_BATCH, QUICK_STEPS = 8, 6  # the --quick defaults the run below relies on
QUICK_CAMERAS = 2


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench_cache")


@pytest.fixture(scope="module")
def quick_run(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, str]:
    out = tmp_path_factory.mktemp("bench_out") / "run"
    import contextlib
    import io
    import os

    stdout = io.StringIO()
    temporary = tmp_path_factory.mktemp("tmpdir")  # where the measuring processes make their temporary folders
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(temporary)
    try:
        with contextlib.redirect_stdout(stdout):
            code = main(
                ["bench", "--device", "cpu", "--quick", "--limits", "--out", str(out), "--cache-dir", str(cache_dir)]
            )
    finally:
        if before is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = before
    assert list(temporary.iterdir()) == []  # the worker-time counters' folders are removed
    return code, out, stdout.getvalue()


def test_memory_sampler_counts_a_shared_page_once_per_process_in_rss_and_once_in_all_in_pss() -> None:
    """A batch in shared memory, mapped by a worker and the loop's process, is in both processes' RSS; the PSS sum
    holds it once. 256 MiB shared and touched by both, a forked child's pages of the parent split likewise."""
    import mmap
    import multiprocessing

    from lerobot_dali.bench_measure import TreeMemorySampler

    size = 256 * 2**20
    shared = mmap.mmap(-1, size)  # anonymous and MAP_SHARED: a fork maps the same pages
    np.frombuffer(shared, dtype=np.uint8)[:] = 1
    touched, done = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()

    def child() -> None:
        assert int(np.frombuffer(shared, dtype=np.uint8)[::4096].sum()) == size // 4096  # every page, read
        touched.set()
        done.wait(60)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        assert touched.wait(60)
        sampler = TreeMemorySampler()
        sampler._sample()
        rss, pss = sampler.peak_rss_bytes, sampler.peak_pss_bytes
        assert rss is not None and pss is not None
        # RSS: the 256 MiB in each of the two processes; PSS: once, split between them.
        assert rss >= 2 * size and pss >= size
        assert rss - pss >= size
    finally:
        done.set()
        process.join(60)
        shared.close()


def test_quick_bench_report_schema_and_consistent_numbers(quick_run: tuple[int, Path, str]) -> None:
    code, out, printed = quick_run
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["ok"] is True and report["failures"] == []
    assert report["config"]["batch_size"] == QUICK_BATCH and report["config"]["steps"] == QUICK_STEPS
    assert report["machine"]["cpu_decoders"].startswith("PyAV ")  # and torchcodec's state: which one decoded
    assert [d["codec"] for d in report["datasets"]] == ["av1", "h264"]
    assert all(d["frames_per_sample"] == QUICK_CAMERAS and d["delta_timestamps"] == {} for d in report["datasets"])
    results = report["results"]
    for r in results:
        assert list(r) == list(METRIC_FIELDS)  # every metric present, in the CSV's order
    by = {(r["dataset"], r["loader"]): r for r in results}
    for dataset in (d["label"] for d in report["datasets"]):
        for loader in ("lerobot-dali", "pyav-dataloader"):
            r = by[(dataset, loader)]
            assert r["status"] == "ok", r["note"]
            # 6 measured batches of 8 samples, one frame of each of 2 cameras per sample
            assert (r["batches"], r["samples"], r["frames"]) == (QUICK_STEPS, QUICK_STEPS * QUICK_BATCH, 96)
            assert r["frames_per_s"] > 0
            assert r["frames_per_s"] == pytest.approx(r["frames"] / r["window_s"])
            assert r["samples_per_s"] == pytest.approx(r["frames_per_s"] / QUICK_CAMERAS)
            assert 0 < r["batch_p50_ms"] <= r["batch_p95_ms"] <= r["batch_p99_ms"]
            assert r["batch_p99_ms"] / 1000 <= r["window_s"]
            assert r["first_batch_s"] > 0
            assert r["peak_rss_mb"] > 100  # the loader's process alone imports torch
            assert 0 < r["peak_pss_mb"] <= r["peak_rss_mb"]  # read together: a shared page splits in PSS
            assert 1 <= r["episodes_per_batch"] <= QUICK_BATCH
            assert r["gpu_max_allocated_mb"] is None and r["gpu_peak_used_mb"] is None
        # --limits: PyAV on every core decoded the same files; each loader is a fraction of that ceiling.
        (summary,) = [d for d in report["datasets"] if d["label"] == dataset]
        ceiling = summary["ceilings"]["ceilings"]["cpu_pyav"]
        assert ceiling["error"] is None and ceiling["frames"] > 0
        assert ceiling["frames_per_s"] == pytest.approx(ceiling["frames"] / ceiling["seconds"])
        assert summary["ceilings"]["best_frames_per_s"] == ceiling["frames_per_s"]
        for loader in ("lerobot-dali", "pyav-dataloader"):
            r = by[(dataset, loader)]
            assert r["fraction_of_decode_ceiling"] == pytest.approx(r["frames_per_s"] / ceiling["frames_per_s"])
        ours, plain = by[(dataset, "lerobot-dali")], by[(dataset, "pyav-dataloader")]
        assert set(ours["routes"].split()) == {"cam0=cpu_fallback", "cam1=cpu_fallback"}
        # The clip of one frame at GOP 2 is a sliver of the file it comes from.
        assert 0 < ours["clip_to_file_ratio"] < 0.2
        assert ours["clip_bytes_per_sample"] == pytest.approx(
            ours["clip_to_file_ratio"] * ours["video_bytes_per_sample"]
        )
        assert plain["clip_to_file_ratio"] is None
        # GOP 2 without B-frames: a keyframe decodes itself, the frame after it both (1.5 on average).
        assert 1 < summary["decoded_frames_per_frame"] < 2
        assert f"{dataset}: {summary['decoded_frames_per_frame']:.2f}" in printed
        # Worker time: decoding, and (local dataset) reading episode rows; the peer is not instrumented. (Which
        # is larger depends on the machine: 96x128 frames now decode about as fast as their rows are read.)
        assert ours["fetch_s"] > 0 and ours["decode_s"] > 0 and plain["decode_s"] is None
        ran_peers = [
            r for r in results if r["dataset"] == dataset and r["loader"] != "lerobot-dali" and r["status"] == "ok"
        ]
        best = max(r["frames_per_s"] for r in ran_peers)
        best_name = max(ran_peers, key=lambda r: r["frames_per_s"])["loader"]
        for r in [*ran_peers, ours]:
            assert r["vs_best_peer"] == pytest.approx(r["frames_per_s"] / best)
            assert r["best_peer"] == best_name
        # The printed row names the codec and the route, and the ratio's divisor is printed under the table.
        (line,) = [x for x in printed.splitlines() if x.startswith(dataset) and " lerobot-dali " in x]
        assert line.split()[1:4] == [summary["codec"], "lerobot-dali", "cpu_fallback"], line
        assert f"{dataset}: {best_name}" in printed
        assert summary["video_kb_per_frame"] > 0
        assert max(r["vs_best_peer"] for r in ran_peers) == pytest.approx(1.0)
        for loader in ("lerobot", "lerobot-streaming"):
            r = by[(dataset, loader)]
            if r["status"] == "skipped":
                assert "lerobot" in r["note"] and r["frames"] == 0 and r["vs_best_peer"] is None
    assert "frames/s" in printed and "lerobot-dali" in printed and "pyav-dataloader" in printed


def test_quick_bench_writes_csv_and_png(quick_run: tuple[int, Path, str]) -> None:
    _, out, _ = quick_run
    report = json.loads((out / "bench.json").read_text())
    with open(out / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(METRIC_FIELDS)
    assert [(r["dataset"], r["loader"], r["status"]) for r in rows] == [
        (r["dataset"], r["loader"], r["status"]) for r in report["results"]
    ]
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report["files"] == {k: str(out / f"bench.{k}") for k in ("json", "csv", "png")}


def test_a_loader_that_measures_no_frame_fails_the_run(cache_dir: Path, quick_run, tmp_path: Path, capsys) -> None:
    dataset = cache_dir / default_specs(True)[0].folder  # generated by the quick run
    assert dataset.is_dir()
    out = tmp_path / "zero"
    # 360 samples and drop_last: a batch of 1000 never fills, so the loader runs and delivers nothing.
    code = main(["bench", "--device", "cpu", "--dataset", str(dataset), "--loaders", "pyav-dataloader",
                 "--batch-size", "1000", "--steps", "2", "--warmup", "1", "--out", str(out)])  # fmt: skip
    assert code == 1
    report = json.loads((out / "bench.json").read_text())
    (result,) = report["results"]
    assert result["status"] == "zero-frames" and result["frames"] == 0 and result["frames_per_s"] == 0.0
    assert report["ok"] is False and "measured 0 frames" in report["failures"][0]
    assert "FAILED" in capsys.readouterr().err


def test_results_that_cannot_be_written_are_one_line_after_the_table(
    cache_dir: Path, quick_run, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full --out filesystem ended the run in a traceback once every loader had run: the measurements lost. Now the
    table is printed and one line names the folder, exit status 2; an empty --out (taken for the default folder,
    unsaid) is refused before any work."""
    import errno
    import os

    from lerobot_dali import bench

    def failing(code: int, name: Path) -> Any:
        def write(*args: object, **kwargs: object) -> None:
            raise OSError(code, os.strerror(code), str(name))

        return write

    monkeypatch.setattr(bench, "write_report", failing(errno.ENOSPC, tmp_path / "full" / ".bench.csv.tmp"))
    dataset = cache_dir / default_specs(True)[0].folder
    code = main(["bench", "--device", "cpu", "--dataset", str(dataset), "--loaders", "pyav-dataloader",
                 "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "full")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and "pyav-dataloader" in out and "frames/s" in out, out
    assert err.strip().splitlines()[-1] == (
        f"lerobot-dali bench: cannot write its results to {tmp_path / 'full'}: OSError: [Errno 28] No space left on "
        f"device: '{tmp_path / 'full' / '.bench.csv.tmp'}'; free space there, or give an --out on another filesystem"
    ), err
    errors = ((errno.EACCES, "give an --out this user can write"), (errno.EROFS, "the filesystem is read-only: give "
              "an --out on a writable one"))  # fmt: skip
    for code, advice in errors:
        monkeypatch.setattr(bench, "write_report", failing(code, tmp_path / "o"))
        assert main(["bench", "--device", "cpu", "--dataset", str(dataset), "--loaders", "pyav-dataloader",
                     "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "o")]) == 2  # fmt: skip
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"'{tmp_path / 'o'}'; {advice}")
    for flag in ("--out", "--cache-dir"):
        assert main(["bench", "--device", "cpu", "--dataset", str(dataset), flag, " "]) == 2
        assert (
            capsys.readouterr().err == f"lerobot-dali bench: {flag} is empty: give a folder, or leave {flag} out "
            "for the default\n"
        )


def test_a_run_where_every_loader_is_skipped_fails(cache_dir: Path, quick_run, tmp_path: Path) -> None:
    """Zero frames measured is a failure even when no loader ran to measure them (LeRobot absent here)."""
    if lerobot_unavailable() is None:
        pytest.skip("lerobot imports here, so its loaders would run")
    dataset = cache_dir / default_specs(True)[0].folder
    out = tmp_path / "skipped"
    code = main(["bench", "--device", "cpu", "--dataset", str(dataset), "--loaders", "lerobot", "lerobot-streaming",
                 "--out", str(out)])  # fmt: skip
    assert code == 1
    report = json.loads((out / "bench.json").read_text())
    assert {r["status"] for r in report["results"]} == {"skipped"}
    assert report["ok"] is False and report["failures"] == ["no loader measured any frame (statuses: skipped)"]


def test_progress_shows_without_a_terminal_or_verbose_flag(cache_dir: Path, quick_run, tmp_path: Path) -> None:
    """A log file or ``docker run`` without ``-t`` has no bar: the run still says what it measures, as it goes."""
    import subprocess
    import sys

    dataset = cache_dir / default_specs(True)[0].folder
    cmd = [sys.executable, "-m", "lerobot_dali.cli", "bench", "--device", "cpu", "--dataset", str(dataset),
           "--loaders", "pyav-dataloader", "--steps", "4", "--warmup", "1", "--out", str(tmp_path / "p")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=True)
    lines = [line for line in done.stderr.splitlines() if "lerobot_dali.bench.progress" in line]
    assert re.search(rf"measuring pyav-dataloader on {re.escape(dataset.name)} \(1-minute load \d+\.\d\)$", lines[0])
    assert any("pyav-dataloader: 5/5 batches (" in line for line in lines)
    assert "frames/s" in lines[-1] and "DEBUG" not in done.stderr


def test_cameras_and_keys_select_what_every_loader_reads(tmp_path: Path) -> None:
    """gr00t declares a camera it never recorded: --cameras leaves it out for our loader, the PyAV peer and the
    decode ceiling alike. Selecting without --dataset is refused."""
    from tests.conftest import shared_dataset

    out = tmp_path / "gr00t"
    code = main(["bench", "--device", "cpu", "--dataset", str(shared_dataset("gr00t_v20_h264")), "--cameras",
                 "observation.images.ego_view", "--keys", "action", "--timestamp-source", "frame_index",
                 "--loaders", "lerobot-dali", "pyav-dataloader",
                 "--batch-size", "2", "--steps", "2", "--warmup", "1", "--num-workers", "1", "--limits",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    assert [r["status"] for r in report["results"]] == ["ok", "ok"]
    assert all(r["frames"] == 4 for r in report["results"])  # 2 batches of 2 samples, one camera each
    assert report["config"]["cameras"] == ["observation.images.ego_view"] and report["config"]["keys"] == ["action"]
    assert report["datasets"][0]["ceilings"]["best_frames_per_s"] > 0
    with pytest.raises(ValueError, match="--cameras and --keys select parts of --dataset"):
        BenchConfig(cameras=("observation.images.cam0",))


def test_several_datasets_bench_as_one(make_ds, tmp_path: Path, capsys) -> None:
    """Several --dataset: lerobot-dali reads them as one (concat_datasets), the PyAV peer as a ConcatDataset; the
    report names them all. --limits measures one dataset's files, so it is refused with several."""
    spec = dict(frames_per_episode=6, cameras=1, codec="vp9", fps=10, gop=3)
    paths = [str(make_ds(episodes=2, **spec)), str(make_ds(episodes=3, version="v2.1", seed=1, **spec))]
    out = tmp_path / "union"
    small = ["--batch-size", "2", "--steps", "2", "--warmup", "1", "--num-workers", "1", "--out", str(out)]
    loaders = ["--loaders", "lerobot-dali", "pyav-dataloader"]
    code = main(["bench", "--device", "cpu", "--dataset", *paths, *loaders, *small])
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    assert [(r["loader"], r["status"], r["frames"]) for r in report["results"]] == [
        ("lerobot-dali", "ok", 4),
        ("pyav-dataloader", "ok", 4),
    ]
    (summary,) = report["datasets"]
    assert summary["members"] == paths and (summary["episodes"], summary["frames"]) == (5, 30)
    assert report["config"]["dataset"] == paths
    assert main(["bench", "--device", "cpu", "--dataset", *paths, "--limits"]) == 2
    assert "--limits measures one dataset's files" in capsys.readouterr().err


def test_several_datasets_each_find_their_frames_their_own_way(make_ds, copy_ds, tmp_path: Path, capsys) -> None:
    """Datasets of different recorders bench as one with a --timestamp-source (or --tolerance-s) each, as
    ``concat_datasets`` takes them: here the second's parquet timestamps are wall-clock (a clock 1.5% fast). Every
    loader follows them; a count that is neither one nor one per dataset is refused."""
    from tests.test_dataset_union import _retimed

    spec = dict(frames_per_episode=6, cameras=1, codec="vp9", fps=10, gop=3)
    wall_clock = _retimed(copy_ds(make_ds(episodes=3, version="v2.1", seed=1, **spec)), lambda t: t * 0.985)
    paths = [str(make_ds(episodes=2, **spec)), str(wall_clock)]
    small = ["--batch-size", "2", "--steps", "2", "--warmup", "1", "--num-workers", "1"]
    run = ["bench", "--device", "cpu", "--dataset", *paths, "--loaders", "lerobot-dali", "pyav-dataloader", *small]

    def results(out: Path) -> list[tuple[str, str, str]]:
        report = json.loads((out / "bench.json").read_text())
        return [(r["loader"], r["status"], r["note"]) for r in report["results"]]

    assert main([*run, "--out", str(tmp_path / "one"), "--timestamp-source", "parquet_timestamp"]) == 1
    (_, ours_status, ours_note), (_, peer_status, peer_note) = results(tmp_path / "one")
    assert (ours_status, peer_status) == ("error", "error")
    assert "FrameTimestampError" in ours_note and str(wall_clock) in ours_note and "FrameTimestampError" in peer_note
    capsys.readouterr()
    own = ["--timestamp-source", "parquet_timestamp", "frame_index"]
    assert main([*run, "--out", str(tmp_path / "own"), *own]) == 0
    assert [status for _, status, _ in results(tmp_path / "own")] == ["ok", "ok"]
    config = json.loads((tmp_path / "own" / "bench.json").read_text())["config"]
    assert config["timestamp_source"] == ["parquet_timestamp", "frame_index"] and config["tolerance_s"] == 1e-4
    assert main([*run, "--tolerance-s", "1e-4", "1e-4", "0.1"]) == 2
    assert "--tolerance-s takes one value, or one per --dataset (2); got 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--timestamp-source takes one value, or one per --dataset, with several"):
        BenchConfig(dataset=paths[0], timestamp_source=("parquet_timestamp", "frame_index"))


@pytest.mark.parametrize("gop", [1, 5, 100])
def test_decoded_frames_per_frame_follow_the_keyframes(make_ds, gop: int) -> None:
    """The decode work of a window: every frame from the keyframe before each frame shown. A window reaching past
    both ends of 12-frame episodes shows frames 0 and 11 whatever the sample; their decode runs are counted here from
    the keyframes an independent PyAV decode flags (VP9 has no B-frames: decode order is display order)."""
    import av

    length, fps = 12, 10
    root = make_ds(episodes=3, frames_per_episode=length, cameras=1, codec="vp9", fps=fps, gop=gop, version="v2.1")
    reader = open_dataset(root)
    (camera,) = reader.camera_keys
    expected = set()
    for pos in range(reader.num_episodes):
        with av.open(str(reader.video(pos, camera).path)) as container:
            keyframes = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
        decoded = set()
        for shown in (0, length - 1):
            decoded |= set(range(max(k for k in keyframes if k <= shown), shown + 1))
        expected.add(len(decoded) / 2)
    (want,) = expected  # the same for every episode
    reach = (length - 1) / fps
    footprint = clip_footprint(reader, {camera: [-reach, reach]}, samples=5)
    assert footprint.decoded_per_frame == pytest.approx(want)
    assert want == {1: 1.0, 5: 1.5, 100: 6.0}[gop]


def test_the_table_says_which_datasets_a_short_gop_copy_would_serve(tmp_path: Path) -> None:
    """Above 8.5 frames decoded per frame (keyframes more than 16 frames apart, where ``info`` says so too)."""
    from lerobot_dali.bench_report import BenchReport, format_table
    from lerobot_dali.bench_types import LoaderResult

    decoded = {"r1": 101.96, "cr5": 1.38, "edge": 8.5, "long": 8.51}
    datasets = [{"label": label, "decoded_frames_per_frame": d} for label, d in decoded.items()]
    counts = {"batches": 1, "samples": 1, "frames": 1, "window_s": 1.0, "frames_per_s": 1.0, "samples_per_s": 1.0}
    results = tuple(LoaderResult(dataset=label, loader="lerobot-dali", status="ok", **counts) for label in decoded)

    def table(kept: slice) -> str:
        return format_table(BenchReport({}, {}, datasets[kept], results[kept], notes=(), out_dir=tmp_path))

    assert table(slice(None)).splitlines()[-1] == (
        "r1, long: keyframes far apart; a copy re-encoded at GOP 2 (lerobot-dali reencode DATASET OUT) decodes about "
        "1.5 frames per frame."
    )
    assert "reencode" not in table(slice(1, 3))


class _InterruptedHere(dict):  # type: ignore[type-arg]
    """A dataset summary whose encoding raises KeyboardInterrupt (a Ctrl-C, a kill) half-way through bench.json."""

    def items(self):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt


def test_a_bench_killed_while_writing_its_report_leaves_the_last_whole_one(tmp_path: Path) -> None:
    """write_report wrote bench.csv, bench.png and bench.json in place: a run interrupted half-way through bench.json
    left it cut short (not JSON: a later comparison failed on it), beside a bench.csv of the new run. Each is written
    whole or not at all now, bench.json last: the folder still holds the last run's report, file for file."""
    from lerobot_dali.bench_report import BenchReport, write_report
    from lerobot_dali.bench_types import LoaderResult

    config = {"mode": "single", "batch_size": 2, "num_workers": 0}
    counts = {"batches": 1, "samples": 2, "frames": 2, "window_s": 1.0, "frames_per_s": 2.0, "samples_per_s": 2.0}
    first = BenchReport(
        config,
        {"device": "cpu"},
        [{"label": "a"}],
        (LoaderResult(dataset="a", loader="lerobot-dali", status="ok", **counts),),
        (),
        tmp_path,
    )
    files = write_report(first, tmp_path, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.json", "bench.png"]
    written = {name: (tmp_path / name).read_bytes() for name in ("bench.csv", "bench.json", "bench.png")}
    assert json.loads(written["bench.json"])["files"] == files
    with open(tmp_path / "bench.csv", newline="") as f:
        assert [row["frames_per_s"] for row in csv.DictReader(f)] == ["2.0"]
    second = dataclasses.replace(
        first,
        datasets=[{"label": "b"}, _InterruptedHere(label="c")],
        results=(LoaderResult(dataset="b", loader="lerobot-dali", status="ok"),),
    )
    with pytest.raises(KeyboardInterrupt):
        write_report(second, tmp_path, [])
    assert json.loads((tmp_path / "bench.json").read_bytes()) == json.loads(written["bench.json"])
    with open(tmp_path / "bench.csv", newline="") as f:  # (whole: the new run's, which bench.json does not list yet)
        assert [row["dataset"] for row in csv.DictReader(f)] == ["b"]
    assert not [p.name for p in tmp_path.iterdir() if p.name not in written]  # (no temporary file left)


def test_wall_clock_timestamps_bench_by_frame_index(tmp_path: Path) -> None:
    """cr5's parquet timestamps are wall-clock: every loader reads it by frame_index / fps when asked, and the
    peer's frames are the file's frames at from_timestamp + frame_index / fps."""
    import pyarrow.parquet as pq

    from lerobot_dali.bench_peers import PyAVFrameDataset
    from tests.conftest import shared_dataset
    from tests.video_fixtures import reference_frames

    root = shared_dataset("cr5_v30_av1")
    out = tmp_path / "cr5"
    code = main(["bench", "--device", "cpu", "--dataset", str(root), "--timestamp-source", "frame_index",
                 "--loaders", "lerobot-dali", "pyav-dataloader", "--batch-size", "2", "--steps", "2", "--warmup", "1",
                 "--num-workers", "1", "--out", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    assert [r["status"] for r in report["results"]] == ["ok", "ok"]
    assert report["results"][0]["clip_to_file_ratio"] > 0  # the clip footprint reads frames by frame_index too

    camera = "observation.images.top"
    episode = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()[1]
    item = PyAVFrameDataset(root, timestamp_source="frame_index")[episode["dataset_from_index"] + 7]
    video = root / f"videos/{camera}/chunk-000/file-{episode[f'videos/{camera}/file_index']:03d}.mp4"
    frames = [frame for _, frame in sorted(reference_frames(video).items())]
    expected = frames[round(episode[f"videos/{camera}/from_timestamp"] * 10) + 7]
    np.testing.assert_array_equal((item[camera].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8), expected)
    with pytest.raises(FrameTimestampError):  # by the wall-clock timestamps, frames are off
        PyAVFrameDataset(root)[episode["dataset_from_index"] + 100]
    for bad, pattern in (
        ({"timestamp_source": "wall"}, "--timestamp-source"),
        ({"tolerance_s": -0.1}, "--tolerance-s must be a positive finite number"),
        ({"tolerance_s": float("inf")}, "--tolerance-s"),
        ({"tolerance_s": True}, "--tolerance-s"),
    ):
        with pytest.raises(ValueError, match=pattern):
            BenchConfig(**bad)


def test_sarm_mode_and_recipe_windows(cache_dir: Path, quick_run: tuple[int, Path, str]) -> None:
    reader = open_dataset(cache_dir / default_specs(True)[0].folder)
    plan = load_plan(BenchConfig(quick=True, mode="sarm", recipe="diffusion"), reader)
    cameras = ["observation.images.cam0", "observation.images.cam1"]
    # sarm replaces the recipe's camera window with 8 frames 1 s apart; state and action follow the recipe.
    assert plan.delta_timestamps == {
        **{c: [-7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0] for c in cameras},
        "observation.state": [-1 / 30, 0.0],
        "action": [k / 30 for k in range(-1, 15)],
    }
    assert plan.frames_per_sample == 16 and plan.image_size is None and plan.augment is None
    assert plan.drop_n_last_frames == 7  # the diffusion recipe's, as LeRobot's train script samples for it
    vla = load_plan(BenchConfig(quick=True, recipe="vla", augment=False, image_size=(64, 64)), reader)
    assert vla.image_size == (64, 64) and vla.augment is None and list(vla.delta_timestamps) == ["action"]


def test_device_cuda_without_a_gpu_is_one_line(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lerobot-dali bench --device cuda`` on a machine without a GPU was a traceback."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["bench", "--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"lerobot-dali bench: --device cuda but torch .* sees no CUDA GPU: .* --device cpu .*\n", err)


def test_bad_options_are_rejected_with_the_allowed_values(capsys, monkeypatch) -> None:
    assert main(["bench", "--loaders", "torchvision", "--quick"]) == 2
    assert "pyav-dataloader" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--steps must be an int >= 1"):
        BenchConfig(steps=0)
    assert main(["bench", "--repeats", "0", "--quick"]) == 2
    assert "--repeats must be an int >= 1, got 0" in capsys.readouterr().err
    # (the sample order's ValueError, a traceback in every lerobot-dali loader's process, which failed the run)
    monkeypatch.setattr("lerobot_dali.bench.run_bench", lambda config: pytest.fail("the bench started"))
    assert main(["bench", "--seed", "-1", "--quick", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "lerobot-dali bench: --seed must be an int >= 0, got -1\n"


def _quick_job(cache_dir: Path, loader: str, *, num_workers: int) -> Any:
    """A 3-batch job of 4 samples on the quick AV1 set the module's run generated."""
    from lerobot_dali.bench_measure import LoaderJob
    from lerobot_dali.bench_types import BenchDataset

    folder = default_specs(True)[0].folder
    plan = load_plan(BenchConfig(quick=True), open_dataset(cache_dir / folder))
    return LoaderJob(
        loader=loader, dataset=BenchDataset(folder, str(cache_dir / folder)), plan=plan, batch_size=4,
        num_workers=num_workers, pool_size=4, device="cpu", steps=3, warmup=1, seed=0, log_level=30,
    )  # fmt: skip


def test_cpu_mode_loader_runs_the_pipeline_on_the_cpu(cache_dir: Path, quick_run) -> None:
    """The GPU-only ``lerobot-dali-cpu-mode`` row builds its iterator on the CPU whatever the job's device (here
    the job's device is the CPU too, so only the loader's own choice is exercised)."""
    from lerobot_dali.bench_measure import run_in_child
    from lerobot_dali.bench_types import DALI_CPU_MODE_LOADER

    job = _quick_job(cache_dir, DALI_CPU_MODE_LOADER, num_workers=1)
    result = run_in_child(job)
    assert result.status == "ok" and result.frames == 3 * 4 * job.plan.frames_per_sample, result.note
    assert set(result.routes.split()) == {"cam0=cpu_fallback", "cam1=cpu_fallback"}


def test_the_bench_reads_the_whole_dataset_whatever_rank_the_environment_names(
    cache_dir: Path, quick_run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell left with RANK/WORLD_SIZE set (a torchrun job's) made lerobot-dali read a quarter of the episodes
    while the peers read them all."""
    from lerobot_dali.bench_measure import _build_loader
    from lerobot_dali.bench_types import DALI_LOADER

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    loader, _, close = _build_loader(_quick_job(cache_dir, DALI_LOADER, num_workers=0))
    try:
        assert (loader.rank, loader.world_size) == (0, 1)
    finally:
        close()


def test_sampled_frames_leave_out_each_episodes_last_frames() -> None:
    from lerobot_dali.bench_measure import sampled_frames

    # Episodes of 3, 5 and 1 frames at dataset indices 0-2, 3-7, 8; the last 2 of each left out.
    assert sampled_frames([3, 5, 1], 9, 2).tolist() == [0, 3, 4, 5]
    assert sampled_frames([3, 5, 1], 9, 0).tolist() == list(range(9))
    with pytest.raises(ValueError, match="the peer holds 10 frames where the dataset's episodes hold 9"):
        sampled_frames([3, 5, 1], 10, 2)


@pytest.mark.parametrize("loader", ["lerobot-dali", "pyav-dataloader"])
def test_a_recipes_drop_n_last_frames_is_sampled_alike_by_lerobot_dali_and_the_peers(
    cache_dir: Path, quick_run, loader: str
) -> None:
    """The bench sampled every frame whatever the recipe said, unlike the train script. With the last 50 of each
    60-frame episode left out, an epoch of either loader is exactly the first 10 frames of each of the 6 episodes."""
    import dataclasses

    from lerobot_dali.bench_measure import _build_loader

    job = _quick_job(cache_dir, loader, num_workers=0)
    job = dataclasses.replace(job, plan=dataclasses.replace(job.plan, drop_n_last_frames=50))
    iterable, _, close = _build_loader(job)
    try:
        seen = [
            (int(e), int(f))
            for batch in iterable
            for e, f in zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
        ]
    finally:
        close()
    assert sorted(seen) == [(e, f) for e in range(6) for f in range(10)]


def test_a_generated_dataset_is_written_again_when_the_generator_changed(tmp_path: Path) -> None:
    from lerobot_dali.bench import GENERATED_STAMP, GeneratedSpec, ensure_generated
    from lerobot_dali.new_folder import host_name

    spec = GeneratedSpec(codec="vp9", cameras=1, size=(64, 64), fps=10, gop=2, episodes=1, frames_per_episode=4)
    first = ensure_generated(spec, tmp_path)
    data = next((first / "data").rglob("*.parquet"))
    inode = data.stat().st_ino
    assert ensure_generated(spec, tmp_path) == first and data.stat().st_ino == inode  # reused
    (first / GENERATED_STAMP).write_text("{}")  # as an older generator's files would say
    host = host_name()
    (tmp_path / f".{spec.folder}.tmp-{host}-999999999-0123abcd").mkdir()  # a run that died while writing (no such pid)
    (tmp_path / f".{spec.folder}.stale-{host}-999999999-0123abcd").mkdir()
    kept = tmp_path / f".{spec.folder}.tmp-elsewhere-1-0123abcd"  # another host's, on a shared filesystem
    kept.mkdir()
    again = ensure_generated(spec, tmp_path)
    assert again == first and data.stat().st_ino != inode  # written again, in the same place
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept.name, spec.folder])  # no staging or stale copy


@pytest.mark.parametrize("module", ["generate", "frame_marker", "video_encoding"])
def test_a_change_to_any_module_that_decides_the_generated_bytes_changes_the_stamp(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoders and their options (preset, crf, B-frames, GOP) moved from generate.py to video_encoding.py,
    which the stamp left out: a changed encoder setting benched the files the old one wrote. A changed value in
    the code changes the stamp; a comment, a docstring or the layout does not (hashing the source wrote every
    cached set again for a reworded docstring)."""
    import importlib

    from lerobot_dali.bench import GeneratedSpec, _generator_stamp

    spec = GeneratedSpec(codec="vp9", cameras=1, size=(64, 64), fps=10, gop=2, episodes=1, frames_per_episode=4)
    before = _generator_stamp(spec)
    source = importlib.import_module(f"lerobot_dali.{module}")
    text = Path(str(source.__file__)).read_text()
    changed = tmp_path / f"{module}.py"
    monkeypatch.setattr(source, "__file__", str(changed))

    changed.write_text(text)
    assert _generator_stamp(spec) == before
    first_doc = text.index('"""') + 3
    changed.write_text("# a comment\n\n" + text[:first_doc] + "Reworded. " + text[first_doc:].replace("\n", "\n\n", 3))
    assert _generator_stamp(spec) == before  # a comment, a docstring, blank lines
    changed.write_text(text + "\nCHANGED = 1\n")
    assert _generator_stamp(spec) != before


def test_the_generated_sets_stamp_names_the_encoders_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another PyAV wheel (its bundled FFmpeg, libsvtav1, x264) encodes other bytes from the same code."""
    import av

    from lerobot_dali.bench import GeneratedSpec, _generator_stamp

    spec = GeneratedSpec(codec="vp9", cameras=1, size=(64, 64), fps=10, gop=2, episodes=1, frames_per_episode=4)
    before = _generator_stamp(spec)
    monkeypatch.setattr(av, "__version__", av.__version__ + ".post1")
    assert _generator_stamp(spec) != before
    monkeypatch.undo()
    codec = av.library_versions["libavcodec"]
    monkeypatch.setitem(av.library_versions, "libavcodec", (codec[0], codec[1] + 1, codec[2]))
    assert _generator_stamp(spec) != before


def test_a_run_that_finishes_second_keeps_the_first_runs_current_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs found the dataset missing; the second to finish moved the first's (current, maybe being read)
    dataset aside and deleted it."""
    from lerobot_dali import generate
    from lerobot_dali.bench import GeneratedSpec, ensure_generated

    spec = GeneratedSpec(codec="vp9", cameras=1, size=(64, 64), fps=10, gop=2, episodes=1, frames_per_episode=4)
    original = generate.make_dataset
    theirs: list[int] = []

    def other_run_finishes_meanwhile(out: Path, **kwargs: Any) -> Any:
        result = original(out, **kwargs)
        if not theirs:  # the other run (another process: its own staging folder), finishing while this one encodes
            theirs.append(0)
            with monkeypatch.context() as other:
                other.setattr(os, "getpid", lambda: 1)
                ensure_generated(spec, tmp_path)
            theirs[0] = (tmp_path / spec.folder / "meta" / "info.json").stat().st_ino
        return result

    monkeypatch.setattr(generate, "make_dataset", other_run_finishes_meanwhile)
    target = ensure_generated(spec, tmp_path)
    assert (target / "meta" / "info.json").stat().st_ino == theirs[0]  # theirs kept, ours dropped
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.folder]


def test_the_benchs_own_bookkeeping_between_epochs_is_not_timed(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a remote dataset each epoch end waited 0.3 s for the workers' counters inside the measured window
    (77 % of a short window): that wait is left out of the window and of the batch gaps."""
    from lerobot_dali import bench_measure
    from lerobot_dali.bench_measure import LoaderJob, measure_loader
    from lerobot_dali.bench_types import BenchDataset

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")  # 2 batches an epoch
    monkeypatch.setattr(bench_measure._IoCounters, "epoch_end", lambda self: time.sleep(2.0))
    plan = load_plan(BenchConfig(quick=True), open_dataset(root))
    job = LoaderJob(
        loader="pyav-dataloader", dataset=BenchDataset("tiny", str(root)), plan=plan, batch_size=4, num_workers=0,
        pool_size=4, device="cpu", steps=6, warmup=1, seed=0, log_level=30,
    )  # fmt: skip
    result = measure_loader(job)
    assert result.status == "ok" and result.batches == 6  # across three epoch ends
    # (two epoch ends fall inside the window: 4 s if timed; the 5 batches themselves took up to 0.53 s on a loaded
    # 2-core machine, so the bound sits well above that and below one wait)
    assert result.window_s < 2.0 and result.batch_p99_ms < 2000, (result.window_s, result.batch_p99_ms)


def test_progress_lines_tell_apart_datasets_whose_labels_share_a_long_start(
    make_ds, caplog: pytest.LogCaptureFixture
) -> None:
    """The progress lines cut a dataset's label to its first 24 characters: ``so100_pick_and_place_left_h264`` and
    ``so100_pick_and_place_left_av1`` both read ``so100_pick_and_place_lef``. A label is whole up to 40 characters,
    a longer one its start and end around " ... "."""
    import logging

    from lerobot_dali.bench_measure import LoaderJob, measure_loader
    from lerobot_dali.bench_types import BenchDataset

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")  # 2 batches an epoch
    plan = load_plan(BenchConfig(quick=True), open_dataset(root))
    long = "lerobot_so100_pick_and_place_left_arm_wrist_and_top_cameras_h264"
    shown = {}
    for label in ("so100_pick_and_place_left_h264", "so100_pick_and_place_left_av1", long):
        job = LoaderJob(
            loader="pyav-dataloader", dataset=BenchDataset(label, str(root)), plan=plan, batch_size=4,
            num_workers=0, pool_size=4, device="cpu", steps=1, warmup=1, seed=0, log_level=30,
        )  # fmt: skip
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lerobot_dali.bench.progress"):
            assert measure_loader(job).status == "ok"
        (shown[label],) = {m.split(" pyav-dataloader: ")[0] for r in caplog.records if " 2/2 " in (m := r.getMessage())}
    assert shown == {
        "so100_pick_and_place_left_h264": "so100_pick_and_place_left_h264",
        "so100_pick_and_place_left_av1": "so100_pick_and_place_left_av1",
        long: "lerobot_so100_pi ... nd_top_cameras_h264",  # (40 characters)
    }


def test_a_warning_during_a_measurement_is_logged_on_its_own_line_not_after_the_bar(
    make_ds, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a terminal a warning logged while a loader ran (the loader's own, a remote retry) was written after the
    bar (``... 2/6 [00:00<00:00, 9.1batch/s]WARNING ...``), as check's was."""
    import logging
    import sys

    from lerobot_dali import bench_measure
    from lerobot_dali.bench_measure import LoaderJob, measure_loader
    from lerobot_dali.bench_types import BenchDataset

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")  # 2 batches an epoch
    said = logging.getLogger("lerobot_dali.test_warning")
    monkeypatch.setattr(bench_measure._IoCounters, "epoch_end", lambda self: said.warning("between epochs"))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    plan = load_plan(BenchConfig(quick=True), open_dataset(root))
    job = LoaderJob(
        loader="pyav-dataloader", dataset=BenchDataset("tiny", str(root)), plan=plan, batch_size=4, num_workers=0,
        pool_size=4, device="cpu", steps=3, warmup=1, seed=0, log_level=30,
    )  # fmt: skip
    try:
        assert measure_loader(job).status == "ok"
    finally:
        logging.getLogger().removeHandler(handler)
    err = capsys.readouterr().err
    assert "batch/s]" in err or "batch]" in err, err  # the bar, drawn
    warnings = [line.rsplit("\r", 1)[-1] for line in err.split("\n") if "between epochs" in line]
    assert warnings and all(line.startswith("WARNING lerobot_dali.test_warning") for line in warnings), err


@pytest.mark.parametrize("loader", ["lerobot-dali", "pyav-dataloader"])
def test_episodes_per_batch_tell_apart_the_episodes_of_datasets_read_as_one(make_ds, loader: str) -> None:
    """Datasets read as one keep their own episode numbers: eps/batch counted episode 0 of two datasets once, so
    every batch here (one episode per dataset) counted 1 episode; the PyAV peer's items also lacked
    ``dataset_index``, which the other loaders' carry."""
    from lerobot_dali.bench_measure import LoaderJob, measure_loader
    from lerobot_dali.bench_types import BenchDataset

    spec = dict(episodes=1, frames_per_episode=8, cameras=1, size=(64, 64), codec="vp9")
    paths = (str(make_ds(**spec)), str(make_ds(seed=1, **spec)))
    dataset = BenchDataset("two", paths[0], members=paths)
    job = LoaderJob(
        loader=loader, dataset=dataset, plan=load_plan(BenchConfig(quick=True), dataset.open()), batch_size=8,
        num_workers=0, pool_size=2, device="cpu", steps=2, warmup=1, seed=0, log_level=30,
    )  # fmt: skip
    result = measure_loader(job)
    assert result.status == "ok" and result.episodes_per_batch > 1, result


def test_a_peer_that_fails_in_a_dataloader_worker_is_reported_with_the_workers_error(make_ds, copy_ds) -> None:
    """A DataLoader worker's error reads "Caught X in DataLoader worker process 0." and then the worker's traceback:
    the note's 500 characters ended inside the traceback, so the report never said what failed."""
    from lerobot_dali.bench_measure import LoaderJob, run_in_child
    from lerobot_dali.bench_types import BenchDataset
    from tests.test_dataset_union import _retimed

    root = copy_ds(make_ds(episodes=1, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9", fps=10))
    late = _retimed(root, lambda t: t + 0.05)  # every row half a frame after its frame
    job = LoaderJob(
        loader="pyav-dataloader", dataset=BenchDataset("late", str(late)), plan=load_plan(BenchConfig(quick=True),
        open_dataset(late)), batch_size=2, num_workers=1, pool_size=1, device="cpu", steps=1, warmup=1, seed=0,
        log_level=30,
    )  # fmt: skip
    result = run_in_child(job)
    assert result.status == "error" and result.note.startswith("FrameTimestampError: Caught FrameTimestampError in")
    assert "no frame within tolerance_s=0.0001 of" in result.note and "\n" not in result.note, result.note


@dataclasses.dataclass(frozen=True)
class _KilledWhenOpened(BenchDataset):
    """A dataset whose opening kills the measuring process outright, as the OOM killer would."""

    def open(self) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_measuring_process_leaves_no_temporary_folder(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measuring process killed outright left its private cache and its counters' folder in /tmp
    (``lerobot-dali-bench-cache-*``, ``lerobot-dali-io-*``) forever: they are now in a folder of the bench's, removed
    once the process ends; a killed bench's own is removed by the next run on the host."""
    from lerobot_dali.bench_measure import LoaderJob, run_in_child
    from lerobot_dali.bench_types import DALI_LOADER
    from lerobot_dali.new_folder import host_name

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # (the measuring process's temporary folder)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed_bench = tmp_path / f".lerobot-dali-bench.run-{host_name()}-999999999-0123abcd"
    (killed_bench / "lerobot-dali-io-x").mkdir(parents=True)
    root = make_ds(episodes=1, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9", fps=10)
    job = LoaderJob(
        loader=DALI_LOADER, dataset=_KilledWhenOpened("killed", str(root)), plan=load_plan(BenchConfig(quick=True),
        open_dataset(root)), batch_size=2, num_workers=0, pool_size=1, device="cpu", steps=1, warmup=1, seed=0,
        log_level=30,
    )  # fmt: skip
    result = run_in_child(job)
    assert result.status == "error" and "died (exit code -9)" in result.note, result.note
    assert list(tmp_path.iterdir()) == []


def test_gpu_only_loaders_are_left_out_on_the_cpu() -> None:
    from lerobot_dali.bench import BenchConfig, _loaders_for
    from lerobot_dali.bench_types import LOADERS

    cpu = _loaders_for(BenchConfig(), "cpu")
    gpu = _loaders_for(BenchConfig(), "cuda")
    assert gpu == list(LOADERS)
    gpu_only = (
        "lerobot-dali-shared-clips",
        "lerobot-dali-cpu-decode",
        "lerobot-dali-cpu-decode-rgb",
        "lerobot-dali-cpu-mode",
    )
    assert cpu == [name for name in LOADERS if name not in gpu_only]
    assert _loaders_for(BenchConfig(loaders=("lerobot-dali-cpu-decode-rgb", "lerobot-dali")), "cuda") == [
        "lerobot-dali",
        "lerobot-dali-cpu-decode-rgb",
    ]


def test_a_gpu_only_loader_named_on_the_cpu_is_reported_skipped_with_why(make_ds, tmp_path: Path, capsys) -> None:
    """``--loaders lerobot-dali-cpu-mode`` on a CPU machine was dropped without a word: the run failed with "no
    loader measured any frame (statuses: no loader ran)" and no row said why."""
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9", fps=10)
    argv = ["bench", "--device", "cpu", "--dataset", str(root), "--loaders", "lerobot-dali-cpu-mode"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    (row,) = json.loads((tmp_path / "out" / "bench.json").read_text())["results"]
    assert (row["loader"], row["status"]) == ("lerobot-dali-cpu-mode", "skipped"), row
    assert "--device cuda" in row["note"], row["note"]
    assert "statuses: skipped" in capsys.readouterr().err


def test_image_camera_datasets_are_planned_and_loaded_by_the_peer_as_by_the_iterator(make_ds) -> None:
    from lerobot_dali.bench_peers import PyAVFrameDataset
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=3, frames_per_episode=[4, 2, 5], cameras=2, size=(64, 64), fps=10, image_cameras=True)
    reader = open_dataset(root)
    plan = load_plan(BenchConfig(quick=True, mode="sarm"), reader)
    cameras = ("observation.images.cam0", "observation.images.cam1")
    assert plan.camera_keys == cameras and plan.frames_per_sample == 16  # 8 frames per image camera
    deltas = {"observation.images.cam0": [-0.1, 0.0]}  # cam1 without deltas: (C, H, W)
    peer = PyAVFrameDataset(root, delta_timestamps=deltas)
    ours = DALILeRobotIterator(root, batch_size=11, delta_timestamps=deltas, shuffle=False, device="cpu",
                               num_workers=0)  # fmt: skip
    batch = next(iter(ours))
    for i in range(len(peer)):
        item = peer[i]
        for key in (*cameras, "observation.images.cam0_is_pad"):
            assert item[key].shape == batch[key][i].shape, key
            torch.testing.assert_close(item[key], batch[key][i], atol=1e-6, rtol=0, msg=key)


def test_decode_ceiling_runs_start_at_keyframes_and_hold_whole_gops(make_ds) -> None:
    """Runs cut every run_frames frames inside a long GOP decoded its head again for each run, so the ceiling
    counted fewer frames than it decoded (gr00t: 1.58 decoded per counted) and read too low."""
    from lerobot_dali.bench_limits import decode_runs

    root = make_ds(episodes=1, frames_per_episode=75, cameras=1, size=(64, 96), codec="h264", gop=30)
    runs = decode_runs(root, max_frames=1000, run_frames=16)
    assert [(r.start, r.stop) for r in runs] == [(0, 30), (30, 60), (60, 75)]


def test_clip_cutting_rate_counts_every_frame_and_is_no_decode_ceiling(make_ds) -> None:
    """``clip_cutting`` cuts one clip per frame of the runs and stays out of ``best_frames_per_s``, which
    only decode ceilings set; without a GPU it is measured only when asked for."""
    from lerobot_dali.bench_limits import decode_runs, measure_ceilings

    root = make_ds(episodes=2, frames_per_episode=20, cameras=1, size=(64, 96), codec="h264", gop=4)
    runs = decode_runs(root, max_frames=40, run_frames=16)
    result = measure_ceilings(root, max_frames=40, run_frames=16, gpu=False, clips=True)
    cutting = result["clip_cutting"]
    assert cutting["error"] is None and cutting["frames"] == sum(r.stop - r.start for r in runs) == 40
    assert cutting["frames_per_s"] == pytest.approx(cutting["frames"] / cutting["seconds"])
    assert set(result["ceilings"]) == {"cpu_pyav"}
    assert result["best_frames_per_s"] == result["ceilings"]["cpu_pyav"]["frames_per_s"]
    assert "clip_cutting" not in measure_ceilings(root, max_frames=40, run_frames=16, gpu=False)


def test_each_loader_measures_with_an_on_disk_cache_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packet indexes and the remote prefetch cache live under LEROBOT_DALI_CACHE: a loader measured after
    another (or a later run) started warm from theirs. Each child gets a fresh folder, removed afterwards."""
    from lerobot_dali import bench_measure
    from lerobot_dali.bench_types import LoaderResult
    from lerobot_dali.cache_dirs import CACHE_ENV, cache_root

    seen: list[Path] = []

    def fake_measure(job: object) -> LoaderResult:
        seen.append(cache_root())
        assert seen[-1].is_dir() and not any(seen[-1].iterdir())
        return LoaderResult(dataset="d", loader="x", status="ok")

    class Pipe:
        def send(self, result: LoaderResult) -> None:
            self.result = result

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench_measure, "measure_loader", fake_measure)
    monkeypatch.setenv(CACHE_ENV, "/somewhere/shared")
    job = SimpleNamespace(log_level=30, loader="x")
    for _ in range(2):
        bench_measure._child_main(job, Pipe())  # what each spawned child runs
    assert len(set(seen)) == 2 and Path("/somewhere/shared") not in seen
    assert not any(path.exists() for path in seen)


def test_row_groups_script_measures_the_store_off_cold_and_warm(tmp_path) -> None:
    """bench/row_groups.py at toy scale, its threshold lowered so the store engages: the script keeps working."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "bench" / "row_groups.py"
    args = ["--episodes", "30", "--frames", "20", "--batches", "2", "--min-group-rows", "100", "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["rows"] == 600 and result["store_mb"] > 0  # one Arrow file: the cold run converted
    assert len(list((tmp_path / "store").rglob("*.arrow"))) == 1
    for run in ("reads_store_off", "reads_store_cold", "reads_store_warm"):
        assert result[run]["read_ms"] > 0 and result[run]["peak_rss_mb"] > 0
    assert result["iterator_store_off"]["samples_per_s"] > 0 and result["iterator_store_warm"]["samples_per_s"] > 0


def test_nvdec_clips_script_counts_the_frames_the_decoder_returned(make_ds) -> None:
    """bench/nvdec_clips.py on DALI's CPU decoder (VP9): a row per frames per clip and threads, whose frames/s is
    what the decoder gave back (each clip's frames), so a decoder returning fewer frames than asked would show."""
    import subprocess
    import sys

    root = make_ds(episodes=2, frames_per_episode=20, cameras=1, codec="vp9", gop=5, episodes_per_file=2)
    script = Path(__file__).resolve().parents[1] / "bench" / "nvdec_clips.py"
    args = [str(root), "--cpu", "--frames", "1", "6", "--threads", "1", "2", "--batch-size", "4", "--batches", "2"]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["frames_per_clip"], r["threads"]) for r in rows] == [(1, 1), (1, 2), (6, 1), (6, 2)]
    for row in rows:
        assert row["decoder"] == "cpu" and row["clips_per_s"] > 0 and row["clip_kb"] > 0
        assert row["frames_per_s"] == pytest.approx(row["clips_per_s"] * row["frames_per_clip"], rel=0.01)
        # (each rounded: clips/s to 0.1, batch_ms to 0.001; at 0.1 ms a 1.3 ms batch of 4 clips was 4% off)
        assert row["batch_ms"] == pytest.approx(4 / row["clips_per_s"] * 1e3, rel=0.01, abs=0.001)


def test_remote_http_script_benches_a_pool_smaller_than_the_generated_set(
    make_ds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bench's default pool the whole 12-episode set was prefetched before the clock started, so the
    remote run never timed the network; the script now asks for a pool of 4 unless told otherwise."""
    import importlib.util
    import subprocess

    from lerobot_dali.cli import _parser

    script = Path(__file__).resolve().parents[1] / "bench" / "remote_http.py"
    spec = importlib.util.spec_from_file_location("remote_http", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commands: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda command: commands.append(command) or 0)
    root = make_ds(episodes=1, frames_per_episode=2, cameras=1, size=(64, 64), codec="vp9")
    given = [[], ["--pool-size", "9"], ["--pool-size=8"], ["--episode-pool-size", "7"], ["--pool", "6"]]
    given += [["--episode-pool=5"], ["--loaders", "lerobot-dali", "--image-size", "64", "64"]]
    for options in given:
        assert module.main([str(root), "--device", "cpu", *options]) == 0
    # What the bench makes of each command, as argparse reads it (any spelling it takes, abbreviations included)
    parsed = [_parser().parse_args(command[1:]) for command in commands]
    assert [args.episode_pool_size for args in parsed] == [4, 9, 8, 7, 6, 5, 4]
    assert all(args.dataset[0].startswith("http") for args in parsed)
    assert (parsed[-1].loaders, parsed[-1].image_size) == (["lerobot-dali"], (64, 64))


def test_repeats_rotate_the_order_and_report_the_median_run_and_paired_ratios(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaders ran once each, lerobot-dali always first, on a machine whose load drifts: ``--repeats`` runs
    rounds in rotating order and reports each loader's median run, with the median of the rounds' ratios."""
    from lerobot_dali import bench
    from lerobot_dali.bench_report import format_table
    from lerobot_dali.bench_types import LoaderResult

    rates = {"lerobot-dali": [300.0, 100.0, 200.0], "pyav-dataloader": [100.0, 50.0, 200.0]}
    calls: list[str] = []

    def fake_run(job) -> LoaderResult:
        calls.append(job.loader)
        fps = rates[job.loader][sum(c == job.loader for c in calls) - 1]
        return LoaderResult(
            dataset=job.dataset.label, loader=job.loader, status="ok", batches=10, samples=40, frames=40,
            window_s=40 / max(fps, 1.0), frames_per_s=fps, samples_per_s=fps,
        )  # fmt: skip

    monkeypatch.setattr(bench, "run_in_child", fake_run)
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")
    config = BenchConfig(
        dataset=str(root), device="cpu", repeats=3, loaders=("lerobot-dali", "pyav-dataloader"), out=tmp_path / "out"
    )
    report = bench.run_bench(config)
    ours_first, peer_first = ["lerobot-dali", "pyav-dataloader"], ["pyav-dataloader", "lerobot-dali"]
    assert calls == ours_first + peer_first + ours_first
    ours, peer = report.results
    # rounds' ratios 3.0, 2.0, 1.0: median 2.0; frames/s median run 200 (not the run of the median ratio)
    assert (ours.repeats, ours.frames_per_s, ours.vs_best_peer) == (3, 200.0, 2.0)
    assert ours.frames_per_s_runs == "300.0 100.0 200.0" and ours.vs_best_peer_runs == "3.000 2.000 1.000"
    assert (peer.frames_per_s, peer.vs_best_peer, peer.best_peer) == (100.0, 1.0, "pyav-dataloader")
    assert ours.best_peer == "pyav-dataloader"
    # Rounds whose fastest peer differs name each divisor.
    rounds = [
        [dataclasses.replace(ours, vs_best_peer=2.0, best_peer="pyav-dataloader")],
        [dataclasses.replace(ours, vs_best_peer=1.5, best_peer="lerobot")],
    ]
    (mixed,) = bench._median_runs(rounds, ["lerobot-dali"])
    assert mixed.best_peer == "pyav-dataloader / lerobot" and mixed.vs_best_peer_runs == "2.000 1.500"
    table = format_table(report)
    assert "runs" in table.splitlines()[0] and "1.00-3.00 x3" in table

    rates["pyav-dataloader"] = [100.0, 0.0, 100.0]  # round 2 of the peer measures nothing
    calls.clear()

    def flaky(job) -> LoaderResult:
        result = fake_run(job)
        if result.frames_per_s == 0:
            return LoaderResult(dataset=result.dataset, loader=result.loader, status="zero-frames", note="no batch")
        return result

    monkeypatch.setattr(bench, "run_in_child", flaky)
    report = bench.run_bench(dataclasses.replace(config, out=tmp_path / "out2"))
    peer = report.results[1]
    assert peer.status == "zero-frames" and peer.note == "run 2 of 3: no batch" and not report.ok


def test_each_run_records_the_load_it_started_at(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The JSON's machine load is taken before the default datasets are generated (2.2 there, while the loaders
    then ran at a 1-minute load of 8-10 on 2 cores): each run now records, and its progress line says, its own."""
    from lerobot_dali import bench
    from lerobot_dali.bench_types import LoaderResult

    loads = iter([(2.2, 1.0, 1.0), (8.3, 3.0, 2.0), (9.5, 4.0, 2.0)])
    monkeypatch.setattr(bench.os, "getloadavg", lambda: next(loads))

    def fake_run(job) -> LoaderResult:
        return LoaderResult(
            dataset=job.dataset.label, loader=job.loader, status="ok", batches=2, samples=2, frames=2,
            window_s=1.0, frames_per_s=2.0, samples_per_s=2.0,
        )  # fmt: skip

    monkeypatch.setattr(bench, "run_in_child", fake_run)
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")
    config = BenchConfig(
        dataset=str(root), device="cpu", loaders=("lerobot-dali", "pyav-dataloader"), out=tmp_path / "out"
    )
    with caplog.at_level(logging.INFO, logger="lerobot_dali.bench.progress"):
        report = bench.run_bench(config)
    assert report.machine["load_average_1m"] == 2.2
    assert [r.load_1m for r in report.results] == [8.3, 9.5]
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())["results"]
    assert [r["load_1m"] for r in saved] == [8.3, 9.5]
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("measuring")]
    assert [m.rsplit(" (", 1)[1] for m in started] == ["1-minute load 8.3)", "1-minute load 9.5)"]


def _streaming_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders measured as if run, LeRobot's importable: lerobot-dali at 300 frames/s, the PyAV peer at 100 and
    StreamingLeRobotDataset at 900 (the ratios' divisor, where it counts as a peer)."""
    from lerobot_dali import bench, bench_peers
    from lerobot_dali.bench_types import LoaderResult

    rates = {"lerobot-dali": 300.0, "pyav-dataloader": 100.0, "lerobot-streaming": 900.0}

    def fake_run(job) -> LoaderResult:
        return LoaderResult(
            dataset=job.dataset.label, loader=job.loader, status="ok", batches=2, samples=2, frames=2,
            window_s=2 / rates[job.loader], frames_per_s=rates[job.loader], samples_per_s=rates[job.loader],
        )  # fmt: skip

    monkeypatch.setattr(bench, "run_in_child", fake_run)
    monkeypatch.setattr(bench_peers, "lerobot_unavailable", lambda: None)


def test_a_streaming_peer_whose_buffer_holds_the_measured_samples_is_not_divided_by(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """StreamingLeRobotDataset decodes its shuffle buffer before its first batch: on `--quick`'s small datasets its
    measured window only handed out decoded samples, came out fastest and so was every ratio's divisor."""
    from lerobot_dali import bench, bench_peers

    _streaming_fastest(monkeypatch)
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9")  # 8 frames
    config = BenchConfig(
        dataset=str(root), device="cpu", loaders=("lerobot-dali", "pyav-dataloader", "lerobot-streaming"),
        batch_size=1, steps=2, warmup=1, out=tmp_path / "out",
    )  # fmt: skip
    for buffered, fair in ((4, True), (5, True), (6, False), (1000, False)):  # 3 samples drawn of 8 frames
        monkeypatch.setattr(bench_peers, "streaming_buffer_size", lambda buffered=buffered: buffered)
        ours, _, streaming = bench.run_bench(dataclasses.replace(config, out=tmp_path / str(buffered))).results
        assert ours.best_peer == ("lerobot-streaming" if fair else "pyav-dataloader"), buffered
        assert ours.vs_best_peer == pytest.approx(300 / 900 if fair else 3.0)
        assert streaming.status == "ok" and streaming.frames_per_s == 900.0
        assert ("not a peer here" in streaming.note) != fair
        if not fair:
            assert f"shuffle buffer ({buffered} samples" in streaming.note and "dataset's 8 frames" in streaming.note


@pytest.mark.parametrize(
    ("episodes_per_file", "looks_up_by_index", "misplaced"),
    [(3, True, 0), (1, True, 2), (2, True, 1), (1, False, 0)],
    ids=["one_file", "file_per_episode", "two_files", "fixed_lerobot"],
)
def test_a_streaming_peer_that_would_read_other_frames_is_not_divided_by(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, episodes_per_file: int, looks_up_by_index: bool,
    misplaced: int,
) -> None:  # fmt: skip
    """StreamingLeRobotDataset (LeRobot 0.4-0.6.1) looks a row's frames up at its global index / fps in its
    episode's video file (LeRobot issue #4524): in a file per episode, or a second file, the episodes start at
    other times (0 s, or 0.1 s after the file's first), so its row measured the decoding of other frames (or
    failed): counted here from the episodes' from_timestamps, and only for a LeRobot that looks frames up so."""
    from lerobot_dali import bench, bench_peers

    _streaming_fastest(monkeypatch)
    monkeypatch.setattr(bench_peers, "streaming_buffer_size", lambda: 4)
    monkeypatch.setattr(bench_peers, "streaming_looks_up_by_index", lambda: looks_up_by_index)
    # 3 episodes of 3 frames at 30 fps: the second one's rows start at index 3 (0.1 s)
    root = make_ds(
        episodes=3, frames_per_episode=3, cameras=2, size=(64, 64), codec="vp9", episodes_per_file=episodes_per_file
    )
    config = BenchConfig(
        dataset=str(root), device="cpu", loaders=("lerobot-dali", "pyav-dataloader", "lerobot-streaming"),
        batch_size=1, steps=2, warmup=1, out=tmp_path / "out",
    )  # fmt: skip
    ours, _, streaming = bench.run_bench(config).results
    assert streaming.status == "ok" and streaming.frames_per_s == 900.0
    assert ours.best_peer == ("pyav-dataloader" if misplaced else "lerobot-streaming")
    if not misplaced:
        assert streaming.note is None or "not a peer" not in streaming.note
        return
    assert streaming.note == (
        "not a peer here: it looks each row's frames up at its index / fps in its episode's video file (LeRobot issue "
        f"#4524), and {misplaced} of the dataset's 3 episodes start elsewhere in theirs, so it decodes other frames "
        "than the rows name there, or fails"
    )


class _StreamingByIndex:  # what LeRobot 0.4.4 to 0.6.1 write
    def make_frame(self, item: dict[str, Any]) -> float:
        return item["index"] / self.fps  # type: ignore[attr-defined]


class _StreamingByTimestamp:  # what its fix (LeRobot PR #4702) writes
    def make_frame(self, item: dict[str, Any], from_timestamp: float) -> float:
        return from_timestamp + item["timestamp"]


@pytest.mark.parametrize(("streaming", "by_index"), [(_StreamingByIndex, True), (_StreamingByTimestamp, False)])
def test_a_streaming_dataset_looking_frames_up_by_index_is_told_from_its_source(
    monkeypatch: pytest.MonkeyPatch, streaming: type, by_index: bool
) -> None:
    import types

    from lerobot_dali import bench_peers

    module = types.ModuleType("lerobot.datasets.streaming_dataset")
    module.StreamingLeRobotDataset = streaming  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lerobot.datasets.streaming_dataset", module)
    assert bench_peers.streaming_looks_up_by_index() is by_index


def test_worker_start_script_counts_who_runs_the_training_script(tmp_path) -> None:
    """bench/worker_start.py at toy scale: skipping the script, only the main process runs it; importing it
    again, the iterator's worker and the mixture's two run it too."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "bench" / "worker_start.py"
    args = ["--imports", "json", "--workers", "1", "--datasets", "2", "--repeats", "1", "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["skip_main"]["script_runs"] == 1 and result["import_main"]["script_runs"] == 1 + 1 + 2
    for setting in ("skip_main", "import_main"):
        assert all(result[setting][key] > 0 for key in ("build_s", "worker_uss_mb", "mixture_first_batch_s"))


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 2), (64, 4)])
def test_default_workers_follow_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int
) -> None:
    """A container given 2 of a host's 64 cores started 4 workers per loader (``os.cpu_count`` sees the host)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert BenchConfig().num_workers == workers
    assert BenchConfig(quick=True).num_workers == 2


@pytest.mark.parametrize(("workers", "warmup"), [(0, 3), (1, 4), (4, 10), (12, 26)])
def test_the_default_warmup_outlasts_what_the_loaders_queue_ahead(workers: int, warmup: int) -> None:
    """With 12 workers a 3-batch warm-up left a DataLoader 24 queued batches to serve the window from (H200 run:
    p50 gap 7 ms, p99 1.6 s); the warm-up now takes 2 per worker and 2 more. Quick runs and a given one keep theirs."""
    assert BenchConfig(num_workers=workers).warmup == warmup
    assert BenchConfig(quick=True, num_workers=workers).warmup == 2
    assert BenchConfig(num_workers=workers, warmup=1).warmup == 1


def test_a_dataset_without_cameras_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    """A dataset of tabular features only (make-dataset --cameras 0) failed in the dataset summary with an
    IndexError traceback; the bench measures camera frames, so it is refused in one line before any loader runs."""
    from lerobot_dali.generate import make_dataset

    root = make_dataset(tmp_path / "tabular", episodes=2, frames_per_episode=3, cameras=0)
    out = tmp_path / "out"
    assert main(["bench", "--device", "cpu", "--quick", "--dataset", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lerobot-dali bench: DatasetError: ") and err.count("\n") == 1, err
    assert "no camera to load" in err and not out.exists()


@pytest.mark.parametrize("flag", ["--out", "--cache-dir"])
def test_an_out_or_cache_folder_that_cannot_be_written_is_a_one_line_error(flag: str, tmp_path: Path, capsys) -> None:
    """``--out`` a file failed with a FileExistsError traceback once every loader had run, losing the results;
    ``--cache-dir`` under a file, with a NotADirectoryError traceback before the datasets were generated."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # (--out with a dataset that is not there: without the check, the run stops there in one line of its own)
    dataset = ["--dataset", str(tmp_path / "missing")] if flag == "--out" else []
    for folder in (blocker, blocker / "sub"):
        assert main(["bench", "--device", "cpu", "--quick", *dataset, flag, str(folder)]) == 2
        err = capsys.readouterr().err
        assert err == f"lerobot-dali bench: {flag} {folder}: {blocker} is a file, not a folder; give a folder\n"


def test_the_codec_column_names_every_cameras_codec(make_ds, copy_ds, tmp_path: Path, capsys) -> None:
    """A dataset whose cameras were encoded apart (cam0 VP9, cam1 H.264): the report names both codecs, each
    camera's own, not the first camera's alone."""
    spec = dict(episodes=2, frames_per_episode=6, cameras=2, fps=10, gop=3)
    vp9, h264 = make_ds(codec="vp9", **spec), make_ds(codec="h264", **spec)
    mixed = copy_ds(vp9)
    for src in (h264 / "videos" / "observation.images.cam1").rglob("*.mp4"):
        dst = mixed / src.relative_to(h264)
        assert dst.is_file()
        dst.write_bytes(src.read_bytes())
    small = ["--batch-size", "2", "--steps", "1", "--warmup", "1", "--num-workers", "0", "--loaders", "lerobot-dali"]
    out = tmp_path / "out"
    assert main(["bench", "--device", "cpu", "--dataset", str(mixed), *small, "--out", str(out)]) == 0
    (summary,) = json.loads((out / "bench.json").read_text())["datasets"]
    cameras = {"observation.images.cam0": "vp9", "observation.images.cam1": "h264"}
    assert (summary["codec"], summary["camera_codecs"]) == ("vp9/h264", cameras)
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "lerobot-dali" in line and " ok" in line]
    assert row.split()[1] == "vp9/h264"


@pytest.mark.parametrize(
    "name", ["batch_cpu", "limits", "nvdec_clips", "order_scale", "row_groups", "training_cpu", "worker_start"]
)
def test_bench_scripts_help_says_what_they_do_in_whole_sentences(name: str) -> None:
    """Each script's --help opens with its docstring's first paragraph, not a line of it cut mid-sentence
    (row_groups.py's said "..., with" and stopped)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    description = done.stdout.split("\n\n")[1]  # (after the usage lines)
    assert description.rstrip().endswith((".", ")")), description


def test_a_failed_loaders_note_keeps_the_advice_at_the_end_of_its_error() -> None:
    """The note was cut at 500 characters, so ``bench --dataset gr00t_v20_h264 --cameras ...`` reported its
    FrameTimestampError without the advice it ends with (look frames up by frame_index / fps). A message of any
    length now keeps its start and its end."""
    from lerobot_dali.bench_measure import _error_note

    advice = "or the parquet timestamps are wall-clock time (look frames up by frame_index / fps)."
    message = "dataset D, episode 0, camera C (" + "videos/x" * 60 + "): query timestamp 20.8 s has no frame. " + advice
    assert 500 < len(message) < 900
    assert _error_note(FrameTimestampError(message)) == f"FrameTimestampError: {message}"
    note = _error_note(FrameTimestampError("x" * 5000 + advice))
    assert len(note) <= 1000 and note.startswith("FrameTimestampError: xxx") and note.endswith(advice)
    assert " ... " in note


def test_a_union_is_remote_where_any_member_is(tmp_path: Path) -> None:
    """A union's workers spawn, and its counters report fetches, where any member is remote: both asked only
    whether the first member was a local folder, so a local-first union with a member on a server forked its
    workers (fsspec's async clients refuse to run in a forked child) and reported no fetches."""
    local, url = str(tmp_path), "http://127.0.0.1:9/ds"
    assert not BenchDataset("one", local).remote
    assert BenchDataset("one", url).remote
    assert not BenchDataset("two local", local, members=(local, local)).remote
    assert BenchDataset("local first", local, members=(local, url)).remote
    assert BenchDataset("remote first", url, members=(url, local)).remote


def test_the_results_name_a_signed_or_password_url_without_its_credentials(make_ds, tmp_path: Path) -> None:
    """The results file keeps the config (``--dataset`` as typed), each dataset's summary (its path, its members) and
    label: a signed URL's signature (``?sig=``) and a URL's password were in 4 of 4 of them. Named without them now,
    as a dataset's description is; the dataset is still read from the URL as given."""
    from lerobot_dali.bench import _dataset_summary, bench_datasets

    signed, with_password = "https://h/ds?sig=SIGSECRET&scope=a", "https://alice:s3cret@h/ds2"
    for given in (signed, (signed, with_password)):
        config = BenchConfig(dataset=given, out=tmp_path)
        (dataset,) = bench_datasets(config)
        assert dataset.path == signed and dataset.label == ("ds?scope=a" if given == signed else "ds?scope=a+ds2")
        root = make_ds(episodes=1, frames_per_episode=8, cameras=1, size=(64, 64), codec="vp9")
        summary = _dataset_summary(dataset, open_dataset(root), load_plan(BenchConfig(quick=True), open_dataset(root)))
        said = json.dumps([config.to_dict(), summary])
        assert "SIGSECRET" not in said and "s3cret" not in said and "https://h/ds?scope=a" in said, said


@pytest.mark.parametrize("flag", ["--out", "--cache-dir"])
def test_an_out_or_cache_folder_inside_a_dataset_is_a_one_line_error(flag: str, tmp_path: Path, capsys) -> None:
    """``--out`` or ``--cache-dir`` inside a local dataset (its folder, one below, or a link into it) wrote the results
    or the generated datasets into it, to be copied and uploaded with it: 3 of 3 taken. Refused now before any
    loader runs, as train.py's outputs are."""
    dataset = tmp_path / "ds"
    (dataset / "meta").mkdir(parents=True)
    (dataset / "meta" / "info.json").write_text("{}")
    (tmp_path / "link").symlink_to(dataset / "meta")
    dataset_flag = ["--dataset", str(tmp_path / "missing")] if flag == "--out" else []
    for folder in (dataset, dataset / "results", tmp_path / "link" / "r"):
        assert main(["bench", "--device", "cpu", "--quick", *dataset_flag, flag, str(folder)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"lerobot-dali bench: {flag} {folder} is inside the dataset {dataset}: give a folder outside the dataset\n"
        )
    assert sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*")) == ["meta", "meta/info.json"]


def test_a_timestamp_source_in_another_case_reaches_the_peers_as_its_value(make_ds) -> None:
    # BenchConfig's check took 'FRAME_INDEX' (any case since b3ee995) but kept it as given, and the peers' PyAV reader
    # failed on it ("'FRAME_INDEX' is not a valid TimestampSource") once the run reached them: 3 of 3 spellings.
    from lerobot_dali.bench_peers import PyAVFrameDataset

    assert BenchConfig(timestamp_source="FRAME_INDEX").timestamp_source == "frame_index"
    both = BenchConfig(dataset=("a", "b"), timestamp_source=("Frame_Index", "PARQUET_TIMESTAMP"))
    assert both.timestamp_source == ("frame_index", "parquet_timestamp")
    root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec="vp9", fps=10, gop=2)
    assert len(PyAVFrameDataset(root, timestamp_source="FRAME_INDEX")) == 4
