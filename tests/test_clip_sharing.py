"""Samples sharing one clip (``share_clips=True``): the groups, and DALI's graph handing each sample its own frames.

The graph is the NVDEC route's; here its decoder is DALI's CPU one (VP9), which is what CI can run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dali import DALILeRobotIterator
from lerobot_dali.clip_sharing import share_clips
from lerobot_dali.clips import build_clip, plan_clip
from lerobot_dali.dali_graph import FieldKind
from lerobot_dali.dali_video import decode_clip_batch
from lerobot_dali.frame_marker import read_full_marker
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import MarkerVideo


def test_samples_of_one_file_share_a_clip_of_at_most_max_frames(marker_video: MarkerVideo) -> None:
    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    paths = [path, "other.mp4", path, path, path, "other.mp4"]
    numbers = [np.array([10]), np.array([3]), np.array([10, 11]), np.array([40, 41]), np.array([60]), np.array([5])]
    share = share_clips(paths, [index] * len(paths), numbers, max_frames=4)
    groups = [g.tolist() for g in share.groups]
    # 0, 2 and 3 hold {10, 11, 40, 41}: 4 frames; 4 would make 5 and starts a group of its own
    assert groups == [[0, 2, 3], [1, 5], [4]]
    assert [f.tolist() for f in share.frames] == [[10, 11, 40, 41], [3, 5], [60]]
    assert share.takes(6).tolist() == [0, 1, 0, 0, 4, 1]
    assert [o.tolist() for o in share.orders(numbers)] == [[0], [0], [0, 1], [2, 3], [0], [1]]


def test_a_group_counts_and_clips_each_frame_once(marker_video: MarkerVideo) -> None:
    """Windows repeat their edge frames: a clip yields each distinct frame once, in a group or alone, and a group's
    own-clip packet count is kept for the builder's check (0 for a sample alone from the start)."""
    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    numbers = [np.array([6, 6, 7]), np.array([7, 9, 9]), np.array([20, 20, 21])]
    share = share_clips([path, path, "other.mp4"], [index] * 3, numbers, max_frames=3)
    assert [g.tolist() for g in share.groups] == [[0, 1], [2]]  # {6, 7, 9}: 3 distinct frames, within 3
    assert [f.tolist() for f in share.frames] == [[6, 7, 9], [20, 21]]
    assert [o.tolist() for o in share.orders(numbers)] == [[0, 0, 1], [1, 2, 2], [0, 0, 1]]
    # GOP 2: [6, 6, 7] is packets 6-7, [7, 9, 9] packets 6-9: 2 + 4 alone; together 6-9, 4 packets
    assert share.alone_frames == [6, 0]


def test_samples_of_a_file_to_decode_alone_are_groups_of_one(marker_video: MarkerVideo) -> None:
    """``alone_files`` (files whose shared clip grew when built): each of their samples is a group of its own, once,
    and another file's samples still share."""
    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    paths = [path, "other.mp4", path, "other.mp4"]
    numbers = [np.array([5]), np.array([3]), np.array([6, 6]), np.array([5])]
    share = share_clips(paths, [index] * 4, numbers, max_frames=8, alone_files={path})
    assert [g.tolist() for g in share.groups] == [[0], [1, 3], [2]]
    assert [f.tolist() for f in share.frames] == [[5], [3, 5], [6]]
    assert share.takes(4).tolist() == [0, 1, 2, 1]
    assert [o.tolist() for o in share.orders(numbers)] == [[0], [0], [0, 0], [1]]
    assert share.alone_frames == [0, 4, 0]  # (GOP 2: [3] is packets 2-3, [5] packets 4-5; together 2-5)


def test_only_cameras_dali_decodes_share_clips() -> None:
    """A worker-decoded camera (depth too) never shares clips: ``camera_feed`` drops the flag there, and a feed
    asking for it is refused."""
    from lerobot_dali.cpu_decode_options import CpuDecodeOptions
    from lerobot_dali.dali_graph import CameraFeed, DecodeRoute, camera_feed

    with pytest.raises(ValueError, match="only clips DALI decodes are shared"):
        CameraFeed(DecodeRoute.CPU_FALLBACK, share_clips=True)
    options = dict(on_gpu=False, cpu_decode=CpuDecodeOptions(), augment=None, image_size=None, share_clips=True)
    assert camera_feed(DecodeRoute.NVDEC, **options).share_clips  # type: ignore[arg-type]
    assert camera_feed(DecodeRoute.DALI_CPU, **options).share_clips  # type: ignore[arg-type]
    assert not camera_feed(DecodeRoute.CPU_FALLBACK, **options).share_clips  # type: ignore[arg-type]
    assert not camera_feed(DecodeRoute.CPU_FALLBACK, depth=True, **options).share_clips  # type: ignore[arg-type]


def test_a_group_whose_clip_would_hold_more_packets_decodes_alone(
    marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed GOPs: far apart frames share a clip of two runs. A file of open GOPs makes a clip one run, of
    everything between: there the samples decode alone."""
    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    numbers = [np.array([4]), np.array([80])]
    assert [g.tolist() for g in share_clips([path] * 2, [index] * 2, numbers, max_frames=8).groups] == [[0, 1]]

    def one_run(index: object, frames: np.ndarray) -> object:  # as a clip of open GOPs is planned
        wanted = np.asarray(frames)
        return plan_clip(index, np.arange(wanted.min() // 2 * 2, wanted.max() + 1))  # type: ignore[arg-type]

    monkeypatch.setattr("lerobot_dali.clip_sharing.plan_clip", one_run)
    split = [*numbers, np.array([81, 81])]  # (a window repeating its edge frame)
    share = share_clips([path] * 3, [index] * 3, split, max_frames=8)
    assert [g.tolist() for g in share.groups] == [[0], [1], [2]]
    assert [f.tolist() for f in share.frames] == [[4], [80], [81]]
    assert share.takes(3).tolist() == [0, 1, 2]
    assert [o.tolist() for o in share.orders(split)] == [[0], [0], [0, 0]]
    # split, each sample is alone: nothing shared whose built clip could outgrow its plan (a lone clip that grows
    # when built would grow alike without sharing)
    assert share.alone_frames == [0, 0, 0]


def _vp9(make_ds: Callable[..., Path]) -> Path:
    return make_ds(codec="vp9", episodes=6, frames_per_episode=24, cameras=2, episodes_per_file=3, gop=4)


@pytest.mark.parametrize("window", [None, [-0.1, 0.0, 0.1]])
def test_shared_clips_give_every_sample_its_own_frames(
    make_ds: Callable[..., Path], window: list[float] | None
) -> None:
    """Batches with ``share_clips`` equal those without, frame for frame, and each frame shows its own marker."""
    root = _vp9(make_ds)
    cameras = ["observation.images.cam0", "observation.images.cam1"]
    delta = None if window is None else {c: window for c in cameras}
    options = dict(batch_size=8, device="cpu", num_workers=0, return_uint8=True, delta_timestamps=delta, seed=5)
    shared = DALILeRobotIterator(root, share_clips=True, **options)  # type: ignore[arg-type]
    alone = DALILeRobotIterator(root, **options)  # type: ignore[arg-type]
    batches = 0
    for a, b in zip(shared, alone, strict=True):
        for c, camera in enumerate(cameras):
            assert torch.equal(a[camera], b[camera])
            frames = a[camera] if window else a[camera][:, None]
            for i in range(len(frames)):
                episode, frame = int(a["episode_index"][i]), int(a["frame_index"][i])
                steps = [0] if window is None else [round(d * 30) for d in window]
                want = [(episode, min(max(frame + step, 0), 23), c) for step in steps]
                assert [tuple(read_full_marker(picture)) for picture in frames[i]] == want
        batches += 1
    assert batches == 144 // 8
    source = shared._source
    assert source is not None
    assert [f.kind for f in source.fields].count(FieldKind.CLIP_TAKE) == 2
    episode_pos, frame = source.spec.order.samples(0, 0, 8)
    outputs = source.assemble(episode_pos, frame, positions=np.arange(8))
    take = outputs[[f.kind for f in source.fields].index(FieldKind.CLIP_TAKE)]
    assert (take != np.arange(8)).any()  # (some samples took another's frames: the groups were not all alone)
    assert FieldKind.CLIP_TAKE not in [f.kind for f in alone._source.fields]  # type: ignore[union-attr]


def test_the_shared_graph_matches_a_clip_decoded_alone(marker_video: MarkerVideo) -> None:
    """The graph fragment itself, with groups of 1, 2 and 3 samples and a window repeating a frame."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from lerobot_dali.dali_video import decode_shared_clips

    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    group_a, group_b = np.array([3, 40, 41]), np.array([10, 70])
    clip_a, clip_b = build_clip(path, index, group_a), build_clip(path, index, group_b)
    empty_clip, empty_frames = np.empty(0, np.uint8), np.empty(0, np.int32)
    clips = [clip_a.data, empty_clip, clip_b.data, empty_clip, empty_clip]
    frames = [clip_a.relative_indices, empty_frames, clip_b.relative_indices, empty_frames, empty_frames]
    take = np.array([0, 0, 2, 2, 0], np.int32)
    orders = [[0, 1], [2, 2, 1], [1, 0], [0], [1]]
    pipe = Pipeline(batch_size=5, num_threads=2, device_id=None)
    with pipe:
        nodes = [
            fn.external_source(source=_returning(v), batch=True)
            for v in (clips, frames, take, [np.array(o, np.int32) for o in orders])
        ]
        shared = decode_shared_clips(nodes[0], nodes[1], nodes[2], device="cpu", finish=lambda x: x)
        pipe.set_outputs(fn.sequence_rearrange(shared, new_order=nodes[3]))
    pipe.build()
    (out,) = pipe.run()
    alone_a, alone_b = decode_clip_batch(
        [clip_a.data, clip_b.data], [clip_a.relative_indices, clip_b.relative_indices], device_id=None
    )
    expected = [alone_a[[0, 1]], alone_a[[2, 2, 1]], alone_b[[1, 0]], alone_b[[0]], alone_a[[1]]]
    for got, want in zip((np.asarray(out[i]) for i in range(5)), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def _returning(batch: object) -> Callable[[], object]:
    return lambda: batch


def test_a_file_whose_shared_clip_grew_when_built_decodes_alone_after(
    make_ds: Callable[..., Path], marker_video: MarkerVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs joined at open-GOP keyframes that only the packets show (``joined_for_one_pass``) can make a shared clip
    longer than its samples' own clips together, after the plans said otherwise: that batch keeps its (right) frames,
    and the file's samples decode alone from then on. Here the plans' counts are made small to stand for that."""
    from lerobot_dali import clip_sharing
    from tests.test_batch_assembly import _source

    source = _source(_vp9(make_ds), {}, share_clips=True)
    path = str(marker_video("vp9", 2))
    index = build_packet_index(path)
    requests = [(path, index, np.array([5])), (path, index, np.array([81]))]  # 2 packets each (GOP 2), 4 shared
    real_plan = clip_sharing.plan_clip

    def one_packet(index: object, frames: np.ndarray) -> object:
        plan = real_plan(index, frames)  # type: ignore[arg-type]
        return type(plan)(plan.segments, plan.packet_positions[:1], plan.relative_indices)

    monkeypatch.setattr(clip_sharing, "plan_clip", one_packet)
    clips, indices, orders, take = source._shared_clips(requests)
    assert take.tolist() == [0, 0] and len(clips[1]) == 0  # shared: the plans said 1 packet each, 2 together
    assert [o.tolist() for o in orders] == [[0], [1]]
    assert indices[0].tolist() == build_clip(path, index, np.array([5, 81])).relative_indices.tolist()
    clips, indices, orders, take = source._shared_clips(requests)  # built, the clip held 4 packets: > 2
    assert take.tolist() == [0, 1] and all(len(c) > 0 for c in clips)
    assert [o.tolist() for o in orders] == [[0], [0]]


@pytest.mark.parametrize(
    ("batch_size", "start", "stop", "failing"),
    [(8, 0, 16, 0), (8, 8, 24, 16), (10, 130, 144, 140)],  # the first batch; a later one; the epoch's short last one
)
def test_a_shared_clip_that_fails_is_named_though_its_samples_clips_decode(
    make_ds: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, batch_size: int, start: int, stop: int, failing: int
) -> None:
    """After a pipeline failure the locator rebuilds the samples' own clips; a shared clip can fail where they all
    decode (packets only it holds), so the batches' shared clips are tried too, and the error names their file and
    the episodes of the samples sharing it, in the batch that failed (``start`` mid-epoch, or the epoch's last batch
    short: 144 samples in batches of 10 end with [140, 144))."""
    from lerobot_dali import decode_errors
    from lerobot_dali.batch_source import BatchSource
    from lerobot_dali.errors import VideoDecodeError

    it = DALILeRobotIterator(
        _vp9(make_ds), batch_size=batch_size, device="cpu", num_workers=0, seed=5, share_clips=True
    )
    try:
        next(iter(it))
        source = BatchSource(it._spec)
    finally:
        it.close()
    camera = [f.kind for f in source.fields].index(FieldKind.CLIP)  # (cam0's: the first camera)
    last = min(stop, failing + batch_size)
    episode_pos, frame = source.spec.order.samples(0, failing, last)
    outputs = source.assemble(episode_pos, frame, positions=np.arange(failing, last))
    takes = outputs[camera + 3]
    leader = next(k for k in range(last - failing) if np.count_nonzero(takes == k) > 1)
    bad = outputs[camera][leader].tobytes()
    episodes = sorted({int(source.spec.reader.episodes.episode_index[p]) for p in episode_pos[takes == leader]})
    path = source.spec.reader.video(int(episode_pos[leader]), source.fields[camera].name).path

    def decode(clips: list[np.ndarray], wanted: list[np.ndarray], *, device_id: int | None) -> None:
        if any(c.tobytes() == bad for c in clips):
            raise RuntimeError("Critical error in pipeline: corrupt")

    monkeypatch.setattr(decode_errors, "decode_clip_batch", decode)
    try:
        located = decode_errors.locate_clip_failure(source, 0, start, stop, device_id=None, cause=RuntimeError("x"))
    finally:
        source.close()
    assert len(episodes) > 1  # (the case: one clip of several episodes' frames)
    assert isinstance(located, VideoDecodeError)
    said = f"{path}: DALI cannot decode the frames of episodes {episodes} (one clip they share)"
    assert str(located).startswith(said)


@pytest.mark.parametrize("several", [False, True])
def test_train_s_share_clips_flag_reaches_every_dataset_s_pipeline(make_ds: Callable[..., Path], several: bool) -> None:
    """``pipelines/train.py --share-clips``: the iterator (or each dataset of a mixture) sends shared clips."""
    from pipelines.train import build_iterator, data_plan, open_readers, parse_args

    root = str(_vp9(make_ds))
    argv = ["--dataset", root, *([root] if several else []), "--steps", "1", "--device", "cpu", "--batch-size", "4"]
    for flag, shared in (([], False), (["--share-clips"], True)):
        options = parse_args([*argv, "--num-workers", "0", *flag])
        readers = open_readers(options)
        plan = data_plan(options, fps=readers[0].fps, camera_keys=list(readers[0].camera_keys))
        iterator = build_iterator(readers if several else readers[0], plan, options, device="cpu", rank=0, world_size=1)
        try:
            next(iter(iterator))
            parts = iterator.datasets if several else [iterator]
            for part in parts:
                assert part._source is not None
                kinds = [f.kind for f in part._source.fields]
                assert (FieldKind.CLIP_TAKE in kinds) is shared
        finally:
            iterator.close()


def test_lerobot_policy_s_share_clips_flag_reaches_its_iterator() -> None:
    """``pipelines/lerobot_policy.py --share-clips`` is parsed (off without it); the iterator it builds gets it."""
    import inspect

    from pipelines import lerobot_policy

    assert lerobot_policy.parse_args(["--dataset", "x", "--share-clips"]).share_clips is True
    assert lerobot_policy.parse_args(["--dataset", "x"]).share_clips is False
    assert "share_clips=options.share_clips" in inspect.getsource(lerobot_policy)
