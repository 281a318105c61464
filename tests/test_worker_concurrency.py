"""Every worker process computes a batch at once: DALI's parallel external source gives each batch to one worker
and schedules only its ``prefetch_queue_depth`` batches ahead, so the graph must ask for at least one per worker."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

import lerobot_dali.iterator as iterator_module
from lerobot_dali.batch_source import BatchSource, SourceSpec, batch_bytes_estimate
from lerobot_dali.cpu_decode_options import ColorConversion, CpuDecodeOptions
from lerobot_dali.dali_graph import source_queue_depth
from lerobot_dali.iterator import DALILeRobotIterator

#: Where the workers write when each batch's assembly ran (they inherit the environment at spawn).
TIMES_ENV = "LEROBOT_DALI_TEST_BATCH_TIMES"
SLEEP_S = 0.4


class _TimedSource(BatchSource):
    """Each batch takes SLEEP_S longer and leaves a file with its start and end (module level: spawned workers
    import it). Sleeping needs no core, so the overlap shows the scheduling, not the 2-core machine."""

    def assemble(self, *args, **kwargs):
        start = time.monotonic()
        time.sleep(SLEEP_S)
        out = super().assemble(*args, **kwargs)
        Path(os.environ[TIMES_ENV], f"{os.getpid()}-{start}").write_text(f"{start} {time.monotonic()}")
        return out


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:  # (an end sorts before a start at the same instant: touching is not overlapping)
        running += step
        most = max(most, running)
    return most


def test_most_at_once_counts_overlaps() -> None:
    assert _most_at_once([(0, 1), (1, 2), (2, 3)]) == 1
    assert _most_at_once([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3


@pytest.mark.parametrize(("prefetch", "workers", "depth"), [(2, 1, 3), (2, 2, 4), (2, 12, 14), (3, 2, 5), (1, 4, 5)])
def test_the_source_keeps_a_batch_per_worker_and_prefetch_more_in_hand(prefetch: int, workers: int, depth: int) -> None:
    assert source_queue_depth(prefetch, workers) == depth


@pytest.mark.parametrize(("budget", "depth"), [(None, 14), (10**9, 14), (1000, 8), (500, 3), (100, 2), (0, 2)])
def test_the_depth_is_cut_to_what_shared_memory_holds(budget: int | None, depth: int) -> None:
    """DALI holds prefetch + depth batches in shared memory: 100-byte batches in 1000 bytes are 10, so 8 ahead with
    prefetch 2; never fewer than prefetch (the depth before the workers were counted)."""
    assert source_queue_depth(2, 12, batch_bytes=100, shm_budget=budget) == depth


def test_a_batch_of_unknown_size_leaves_the_depth_uncut() -> None:
    """batch_bytes 0: nothing estimated (e.g. only tabular keys), so no shared-memory bound, not a division by 0."""
    assert source_queue_depth(2, 12, batch_bytes=0, shm_budget=1000) == 14


def test_a_batch_is_estimated_by_its_frames(make_ds) -> None:
    """RGB frames (CPU mode: the workers convert) at 3 bytes a pixel and window frame; a clip (VP9 on DALI's CPU
    decoder) at a sixteenth of that."""
    rgb = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec="av1", fps=10, episodes_per_file=2, gop=2)
    window = {"observation.images.cam0": [-0.1, 0.0, 0.1]}
    assert _estimate(rgb, batch_size=2) == 2 * 2 * 96 * 128 * 3
    assert _estimate(rgb, batch_size=2, delta_timestamps=window) == 2 * (3 + 1) * 96 * 128 * 3
    clips = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", fps=10, episodes_per_file=2, gop=2)
    assert _estimate(clips, batch_size=4) == 4 * 96 * 128 * 3 // 16


def test_planes_are_estimated_by_the_first_files_pixel_format(make_ds) -> None:
    """Planes (the graph converts) of an 8-bit 4:2:0 file at 1.5 bytes a pixel; of any other format, which the
    worker converts to RGB and ships at its size (4:4:4, 10-bit), at 3: counted at 1.5, a 4:4:4 camera's batches
    overfilled /dev/shm twice over."""
    root = make_ds(episodes=2, frames_per_episode=4, cameras=2, codec="av1", fps=10, episodes_per_file=2, gop=2)
    spec = _spec(root, batch_size=2, cpu_decode=CpuDecodeOptions(color_conversion=ColorConversion.GRAPH))
    assert dict(spec.pix_fmts) == {"observation.images.cam0": "yuv420p", "observation.images.cam1": "yuv420p"}
    assert batch_bytes_estimate(spec) == 2 * 2 * 96 * 128 * 3 // 2
    other = dataclasses.replace(spec, pix_fmts={**spec.pix_fmts, "observation.images.cam1": "yuv444p"})
    assert batch_bytes_estimate(other) == 2 * 96 * 128 * (3 + 6) // 2  # (1.5 + 3 bytes a pixel)
    ten_bit = dataclasses.replace(spec, pix_fmts=dict.fromkeys(spec.pix_fmts, "yuv420p10le"))
    assert batch_bytes_estimate(ten_bit) == 2 * 2 * 96 * 128 * 3
    unknown = dataclasses.replace(spec, pix_fmts={})
    assert batch_bytes_estimate(unknown) == batch_bytes_estimate(spec)
    # a side of odd length takes no half-size chroma plane: the worker ships RGB
    odd = dataclasses.replace(spec, camera_formats={c: f._replace(width=127) for c, f in spec.camera_formats.items()})
    assert batch_bytes_estimate(odd) == 2 * 2 * 96 * 127 * 3


def _as_yuv444(path: Path) -> None:
    """Re-encode the H.264 file at ``path`` in place as 4:4:4, the same frames at the same timestamps."""
    import av

    with av.open(str(path)) as source:
        stream = source.streams.video[0]
        frames = [(frame.pts, frame.to_ndarray(format="rgb24")) for frame in source.decode(stream)]
        rate, time_base = stream.average_rate, stream.time_base
    out_path = path.with_suffix(".new.mp4")
    with av.open(str(out_path), "w") as out:
        video = out.add_stream("libx264", rate=rate, options={"g": "2", "bf": "0"})
        video.width, video.height, video.pix_fmt, video.time_base = (
            frames[0][1].shape[1],
            frames[0][1].shape[0],
            "yuv444p",
            time_base,
        )
        for pts, image in frames:
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            out.mux(video.encode(frame))
        out.mux(video.encode())
    out_path.replace(path)


def test_planes_are_estimated_by_the_widest_format_of_the_cameras_files(make_ds, copy_ds) -> None:
    """A camera whose first file is 4:2:0 and whose second is 4:4:4 ships the second's frames at RGB size: estimated
    by its first file alone, its batches were counted at half what they take in /dev/shm."""
    root = copy_ds(make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="h264", fps=10, episodes_per_file=1,
                           gop=2))  # fmt: skip
    _as_yuv444(root / "videos/observation.images.cam0/chunk-000/file-001.mp4")
    spec = _spec(root, batch_size=2, cpu_decode=CpuDecodeOptions(color_conversion=ColorConversion.GRAPH))
    assert dict(spec.pix_fmts) == {"observation.images.cam0": "yuv444p"}
    assert batch_bytes_estimate(spec) == 2 * 96 * 128 * 3


def test_image_cameras_are_estimated_by_their_first_images_shape_depth_as_float32() -> None:
    """(H, W, C) a frame of the window: a colour image at 1 byte a value, a depth image at 4 (the worker ships
    float32 depth)."""
    spec = SimpleNamespace(
        camera_feeds={},
        delta_index={"depth": (-1, 0)},
        image_keys=("rgb", "depth"),
        image_shapes={"rgb": (4, 6, 3), "depth": (4, 6, 1)},
        depth_image_units={"depth": "mm"},
        batch_size=2,
    )
    assert batch_bytes_estimate(spec) == 2 * (4 * 6 * 3 + 2 * 4 * 6 * 1 * 4)  # type: ignore[arg-type]


def _estimate(root: Path, **options) -> int:
    return batch_bytes_estimate(_spec(root, **options))


def _spec(root: Path, **options) -> SourceSpec:
    it = DALILeRobotIterator(root, shuffle=False, device="cpu", num_workers=0, **options)
    try:
        iter(it)  # (builds the pipeline, and with it the workers' spec)
        return it._spec
    finally:
        it.close()


def test_a_small_dev_shm_keeps_fewer_batches_ahead_with_a_warning(make_ds, monkeypatch, caplog) -> None:
    """A /dev/shm that holds 5 batches in this rank's half: 3 ahead (5 less prefetch 2), not 6 (4 workers and 2),
    said once; every frame still read once."""
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="av1", fps=10, episodes_per_file=2, gop=2)
    batch = 2 * 96 * 128 * 3
    monkeypatch.setattr(iterator_module, "shm_bytes", lambda: 2 * 5 * batch + 1)
    depths: list[int] = []
    real_build = iterator_module.build_pipeline
    monkeypatch.setattr(
        iterator_module, "build_pipeline", lambda *a, **k: depths.append(k["source_depth"]) or real_build(*a, **k)
    )
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=4)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali"):
        keys = [key for b in it for key in _keys(b)]
    it.close()
    assert depths == [3]
    assert sorted(keys) == [(e, f) for e in range(2) for f in range(4)]
    (said,) = [r.getMessage() for r in caplog.records if "/dev/shm holds" in r.getMessage()]
    assert "compute 3 batches ahead instead of 6" in said and "--shm-size" in said


def test_a_mixtures_datasets_share_one_dev_shm_budget(make_ds, monkeypatch) -> None:
    """Each dataset of a mixture runs a pipeline of its own on the rank: /dev/shm's budget is shared by batch share.
    Half of it holding 6 of a part's batches kept 2 + 4 ahead in each (12 in all); now 2 + 2 each (the floor)."""
    from lerobot_dali.mixture import DALILeRobotMixture

    roots = [
        make_ds(episodes=n, frames_per_episode=4, cameras=1, codec="av1", fps=10, episodes_per_file=n, gop=2)
        for n in (2, 3)
    ]
    part_batch = 2 * 96 * 128 * 3
    monkeypatch.setattr(iterator_module, "shm_bytes", lambda: 2 * 6 * part_batch + 1)
    depths: list[int] = []
    real_build = iterator_module.build_pipeline
    monkeypatch.setattr(  # (the depth each part asks for; built without worker processes, which this test spares)
        iterator_module,
        "build_pipeline",
        lambda *a, **k: depths.append(k["source_depth"]) or real_build(*a, **{**k, "num_workers": 0}),
    )
    mixture = DALILeRobotMixture(roots, weights=[1, 1], batch_size=4, shuffle=False, device="cpu", num_workers=4)
    try:
        next(iter(mixture))
    finally:
        mixture.close()
    assert depths == [2, 2]


def test_four_workers_assemble_four_batches_at_once(make_ds, monkeypatch, tmp_path: Path) -> None:
    """At the default prefetch of 2, four workers assembled two batches at a time (the other two idle)."""
    root = make_ds(episodes=4, frames_per_episode=8, cameras=1, codec="av1", fps=10, episodes_per_file=4, gop=2)
    times = tmp_path / "times"
    times.mkdir()
    monkeypatch.setenv(TIMES_ENV, str(times))
    monkeypatch.setattr(iterator_module, "BatchSource", _TimedSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=4)
    try:
        batches = sum(1 for _ in it)
    finally:
        it.close()
    assert batches == 16
    intervals = [tuple(map(float, f.read_text().split())) for f in times.iterdir()]
    workers = {f.name.split("-")[0] for f in times.iterdir()}
    assert len(intervals) >= batches and len(workers) == 4
    assert _most_at_once(intervals) >= 3  # type: ignore[arg-type]  (4 expected; 2 before)


def _keys(batch: dict) -> list[tuple[int, int]]:
    return [(int(e), int(f)) for e, f in zip(batch["episode_index"], batch["frame_index"], strict=True)]


def test_more_workers_than_an_epoch_has_batches_lose_and_repeat_nothing(make_ds) -> None:
    """6 workers keep 6 batches in hand where an epoch has 4 (the last one partial): the batches scheduled past an
    epoch's end are dropped, each epoch covers every frame once, and a resume mid-epoch continues exactly."""
    root = make_ds(episodes=3, frames_per_episode=5, cameras=1, codec="vp9", fps=10, episodes_per_file=3, gop=2)
    options = dict(batch_size=4, shuffle=True, seed=11, device="cpu", num_workers=6, drop_last=False)
    it = DALILeRobotIterator(root, **options)
    whole = []
    for epoch in range(3):
        it.set_epoch(epoch)
        batches = [_keys(b) for b in it]
        assert [len(b) for b in batches] == [4, 4, 4, 3]
        assert Counter(key for b in batches for key in b) == Counter((e, f) for e in range(3) for f in range(5))
        whole += [key for b in batches for key in b]
    it.close()
    first = DALILeRobotIterator(root, **options)
    stream = iter(first)
    seen = _keys(next(stream)) + _keys(next(stream))
    state = first.state_dict()
    first.close()
    resumed = DALILeRobotIterator(root, **options)
    resumed.load_state_dict(state)
    for epoch in range(3):
        if epoch:
            resumed.set_epoch(epoch)
        seen += [key for b in resumed for key in _keys(b)]
    resumed.close()
    assert seen == whole


@pytest.mark.parametrize(
    ("workers", "prefetch", "batches"),
    [
        (1, 2, 6),  # 3 in the source (1 worker + 2), 2 in the pipeline, 1 more: the older count's 4 fell short
        (0, 2, 4),  # no source queue: 2 in flight + 1; the older count (3 x 1 + 1) stays
        (2, 1, 5),  # 3 + 1 + 1, as the older 2 x 2 + 1
        (12, 2, 37),  # 14 + 2 + 1 = 17; the older 3 x 12 + 1 looked further and still does
    ],
)
def test_a_remote_prefetcher_looks_ahead_past_every_batch_in_flight(workers: int, prefetch: int, batches: int) -> None:
    """The prefetcher keeps the episodes of the next ``lookahead`` samples local; a batch in flight past it reads its
    episodes remotely (slower, not wrong). With 1 worker the source's depth of 2026-12-04 put 5 batches in flight,
    and the lookahead covered 4."""
    from lerobot_dali.iterator import prefetch_lookahead

    assert prefetch_lookahead(8, prefetch, workers) == 8 * batches
