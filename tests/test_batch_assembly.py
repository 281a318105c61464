"""A batch's rows and video requests are gathered per episode of the batch, with each sample's own values."""

from __future__ import annotations

import io
from types import SimpleNamespace

import av
import numpy as np
import pytest

from lerobot_dali import DALILeRobotIterator
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.frame_lookup import row_frame_numbers
from lerobot_dali.generate import camera_key, expected_action, expected_state
from lerobot_dali.packet_index_cache import PacketIndexCache

FPS = 30
# Episodes 0, 2 and 5 recur; frames at both edges of 20-frame episodes pad.
EPISODES = np.array([2, 0, 2, 5, 0, 2, 1, 5])
FRAMES = np.array([0, 19, 7, 18, 3, 19, 10, 0])


def _source(root, deltas: dict[str, list[float]], **options) -> BatchSource:
    it = DALILeRobotIterator(
        root, batch_size=4, delta_timestamps=deltas, shuffle=False, device="cpu", num_workers=0, **options
    )
    next(iter(it))  # (the spec is built with the pipeline)
    spec = it._spec
    it.close()
    return BatchSource(spec)


def test_batch_rows_are_each_samples_window_of_its_episode(make_ds) -> None:
    """Gathered with one fancy index per episode of the batch (was: one slice per sample and key, stacked):
    the values, dtypes and pad masks are each sample's own window, padded with its episode's edge rows."""
    root = make_ds(episodes=6, frames_per_episode=20, cameras=0)
    action_steps, state_steps = np.arange(-2, 10), np.array([-1, 0])
    source = _source(root, {"action": list(action_steps / FPS), "observation.state": list(state_steps / FPS)})
    out = dict(zip([f.name for f in source.fields], source.assemble(EPISODES, FRAMES), strict=True))

    action_rows = FRAMES[:, None] + action_steps
    state_rows = FRAMES[:, None] + state_steps
    episodes = EPISODES[:, None]
    assert out["action"].dtype == np.float32 and out["action"].shape == (8, 12, 7)
    np.testing.assert_array_equal(out["action"], expected_action(episodes, np.clip(action_rows, 0, 19)))
    np.testing.assert_array_equal(out["action_is_pad"], (action_rows < 0) | (action_rows > 19))
    assert out["observation.state"].dtype == np.float32 and out["observation.state"].shape == (8, 2, 6)
    np.testing.assert_array_equal(out["observation.state"], expected_state(episodes, np.clip(state_rows, 0, 19)))
    np.testing.assert_array_equal(out["observation.state_is_pad"], state_rows < 0)
    assert out["action_is_pad"][0].tolist() == [True, True] + [False] * 10  # frame 0
    assert out["action_is_pad"][1].tolist() == [False] * 3 + [True] * 9  # frame 19
    # Unwindowed keys: the sample's own row, (B,).
    assert out["frame_index"].dtype == np.int64 and out["frame_index"].tolist() == FRAMES.tolist()
    assert out["episode_index"].dtype == np.int64 and out["episode_index"].tolist() == EPISODES.tolist()
    assert out["index"].tolist() == (EPISODES * 20 + FRAMES).tolist()
    np.testing.assert_array_equal(out["timestamp"], (FRAMES / FPS).astype(np.float32))


def test_a_batch_looks_each_video_file_up_once_per_camera(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sample looked its video and its file's index up on its own (a path formatted and, for a local file, a
    stat: ~33 us): 8 index lookups per camera for 8 samples of 4 episodes in 2 files here. Now one per file and
    camera, and per batch again (the stat still sees a file changed since the last batch); each sample's frame
    numbers are what a lookup of its rows alone gives."""
    root = make_ds(episodes=6, frames_per_episode=20, cameras=2, episodes_per_file=3)
    cameras = [camera_key(0), camera_key(1)]
    steps = np.array([-3, 0, 2])
    source = _source(root, {camera: list(steps / FPS) for camera in cameras})
    spec, reader = source.spec, source.spec.reader
    looked_up: list[str] = []
    plain = PacketIndexCache.get

    def counted(self, video, **kwargs):
        looked_up.append(str(video))
        return plain(self, video, **kwargs)

    monkeypatch.setattr(PacketIndexCache, "get", counted)
    files = sorted({reader.video(p, c).path for p in (0, 1, 2, 5) for c in cameras})
    assert len(files) == 4  # episodes 0-2 in one file per camera, 5 in another
    for batch in (1, 2):
        source.assemble(EPISODES, FRAMES)
        assert sorted(looked_up) == sorted(files * batch)

    rows = [source._episode_rows(int(p)) for p in EPISODES]
    camera_rows = np.clip(FRAMES[:, None] + steps, 0, 19)
    for camera in cameras:
        requests = source._video_requests(camera, EPISODES, _groups(EPISODES), rows, camera_rows)
        assert len(requests) == len(EPISODES)
        for pos, own_rows, (path, index, numbers) in zip(EPISODES, camera_rows, requests, strict=True):
            video = reader.video(int(pos), camera)
            alone = row_frame_numbers(reader, int(pos), camera, source._episode_rows(int(pos)), own_rows, index,
                                      timestamp_source=spec.timestamp_source, tolerance_s=spec.tolerance_s)  # fmt: skip
            assert path == video.path and numbers.tolist() == alone.tolist()
            # 3 episodes per file at 30 fps: the episode's part of its file starts at its first frame
            first = round(video.from_timestamp_s * FPS)
            assert numbers.tolist() == (first + own_rows).tolist()


@pytest.mark.parametrize("pass_bytes", [1, 2**20])
def test_a_batchs_clips_are_each_requests_own_clip(make_ds, monkeypatch: pytest.MonkeyPatch, pass_bytes: int) -> None:
    """The clip route builds a batch's clips in passes (every plan, then per run of clips every read, then every
    remux: 1.4x less CPU than plan, read and remux per clip), over 2 files per camera here, in runs of one clip and
    of a whole file's: each clip is byte for byte what build_clip cuts for its request alone, with the same frames
    to take from it."""
    from lerobot_dali import batch_source
    from lerobot_dali.clips import build_clip

    monkeypatch.setattr(batch_source, "CLIP_PASS_BYTES", pass_bytes)

    root = make_ds(episodes=6, frames_per_episode=20, cameras=1, episodes_per_file=3, codec="h264", gop=4)
    camera = camera_key(0)
    steps = np.array([-3, 0, 2])
    source = _source(root, {camera: list(steps / FPS)})
    rows = [source._episode_rows(int(p)) for p in EPISODES]
    camera_rows = np.clip(FRAMES[:, None] + steps, 0, 19)
    requests = source._video_requests(camera, EPISODES, _groups(EPISODES), rows, camera_rows)
    assert len({path for path, _, _ in requests}) == 2
    clips, indices = source._clips(requests)
    assert len(clips) == len(indices) == len(EPISODES)
    for (path, index, numbers), data, relative in zip(requests, clips, indices, strict=True):
        alone = build_clip(path, index, numbers)
        assert data.dtype == np.uint8 and data.tobytes() == alone.data.tobytes()
        assert relative.dtype == np.int32 and relative.tolist() == alone.relative_indices.tolist()
    # Sample 0 (episode 2's frame 0, its file's frame 40, a keyframe) pads twice; sample 1 (frame 19) once at the end.
    assert indices[0].tolist() == [0, 0, 2] and indices[1][1] == indices[1][2] > indices[1][0]


def test_a_batchs_clips_join_runs_at_open_gop_keyframes(make_ds, tmp_path) -> None:
    """The batch's clip passes join a request's runs where build_clip does (at a keyframe that is no IDR: x264's
    open-GOP I pictures without leading pictures): each clip is build_clip's and decodes, in one pass, to its
    frames (cut apart, frames 4 and 33 came out as others)."""
    from lerobot_dali.clips import build_clip
    from lerobot_dali.packet_index import build_packet_index
    from tests.video_fixtures import encode_open_keyframes, reference_frames

    root = make_ds(episodes=6, frames_per_episode=20, cameras=1, episodes_per_file=3, codec="h264", gop=4)
    source = _source(root, {camera_key(0): [0.0]})
    path = encode_open_keyframes(tmp_path / "open_keyframes.mp4")
    index = build_packet_index(path)
    requests = [(str(path), index, np.array(numbers)) for numbers in ([4, 33], [33, 4, 4], [10], [0, 39, 20])]
    clips, relative = source._clips(requests)
    reference = reference_frames(path)
    for (_, _, numbers), data, indices in zip(requests, clips, relative, strict=True):
        alone = build_clip(path, index, numbers)
        assert data.tobytes() == alone.data.tobytes() and indices.tolist() == alone.relative_indices.tolist()
        with av.open(io.BytesIO(data.tobytes())) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        for number, at in zip(numbers.tolist(), indices.tolist(), strict=True):
            np.testing.assert_array_equal(frames[at], reference[int(index.frame_pts[number])])


def test_clip_runs_hold_up_to_the_pass_bytes_each_a_larger_clip_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from lerobot_dali import batch_source

    monkeypatch.setattr(batch_source, "CLIP_PASS_BYTES", 100)
    members, sizes = [3, 5, 6, 9, 11, 12], [40, 60, 1, 250, 99, 2]
    assert batch_source._clip_runs(members, sizes) == [[3, 5], [6], [9], [11], [12]]
    assert batch_source._clip_runs([4, 7], [100, 0]) == [[4, 7]]
    assert batch_source._clip_runs([1, 2], [0, 100]) == [[1, 2]]
    assert batch_source._clip_runs([], []) == []


def _groups(episode_pos: np.ndarray) -> list[np.ndarray]:
    from lerobot_dali.batch_source import _episode_groups

    groups = _episode_groups(episode_pos)
    assert [g.tolist() for g in groups] == [[0, 2, 5], [1, 4], [3, 7], [6]]  # first-sample order, ascending
    return groups


def test_episode_groups_match_each_episodes_samples_in_first_sample_order() -> None:
    """Fuzzed batches (a sort cut where the episode changes): each group is exactly the samples of one episode,
    ascending, and the groups follow the order of each episode's first sample."""
    from lerobot_dali.batch_source import _episode_groups

    rng = np.random.default_rng(0)
    for _ in range(300):
        episode_pos = rng.integers(0, rng.integers(1, 12), size=rng.integers(0, 40))
        expected = [np.flatnonzero(episode_pos == e).tolist() for e in dict.fromkeys(episode_pos.tolist())]
        assert [g.tolist() for g in _episode_groups(episode_pos)] == expected


def test_a_batchs_distinct_clip_frames_are_each_clips_unique() -> None:
    """Computed for the whole batch at once (was: ``np.unique(..., return_inverse=True)`` per clip): each clip's
    distinct frames ascending and each window frame's place among them, both int32, as np.unique gives them."""
    from lerobot_dali.batch_source import _distinct_frames

    rng = np.random.default_rng(0)
    for window in (2, 3, 16):
        # Relative frames of clips with edge padding (repeats), out of order, and a clip of one frame repeated.
        indices = [rng.integers(0, 6, window).astype(np.int32) for _ in range(40)] + [np.full(window, 4, np.int32)]
        distinct, places = _distinct_frames(indices)
        assert len(distinct) == len(places) == len(indices)
        for clip, frames, place in zip(indices, distinct, places, strict=True):
            expected, inverse = np.unique(clip, return_inverse=True)
            assert frames.dtype == np.int32 and frames.tolist() == expected.tolist()
            assert place.dtype == np.int32 and place.tolist() == inverse.tolist()
            assert frames[place].tolist() == clip.tolist()


@pytest.mark.parametrize("shift_s", [0.5 / FPS, 15 / FPS])  # off its frames; on its neighbour's part of the file
def test_one_lookup_per_file_finds_and_fails_as_each_episode_alone(make_ds, shift_s: float) -> None:
    """A file's episodes are looked up together (was: one lookup per episode, ~36 us of array calls each): the
    frame numbers are each episode's own lookup's, and where one episode's rows miss, the first such episode raises
    what its own lookup raises."""
    from lerobot_dali.errors import FrameTimestampError
    from lerobot_dali.frame_lookup import file_frame_numbers

    root = make_ds(episodes=6, frames_per_episode=20, cameras=1, episodes_per_file=3)
    source = _source(root, {})
    spec, reader, camera = source.spec, source.spec.reader, camera_key(0)
    options = {"timestamp_source": spec.timestamp_source, "tolerance_s": spec.tolerance_s}
    videos = [reader.video(p, camera) for p in (0, 1, 2)]
    index = source._indexes.of_video(reader, videos[0])
    rows = [source._episode_rows(p) for p in (0, 1, 2)]
    wanted = [np.array([0, 19, 5]), np.array([3]), np.array([19, 0, 0, 7])]
    episodes = [(p, rows[p], wanted[p], videos[p]) for p in (2, 0, 1)]
    found = file_frame_numbers(reader, camera, index, episodes, **options)
    for (p, *_), numbers in zip(episodes, found, strict=True):
        alone = row_frame_numbers(reader, p, camera, rows[p], wanted[p], index, video=videos[p], **options)
        assert numbers.dtype == np.int64 and numbers.tolist() == alone.tolist() == (20 * p + wanted[p]).tolist()

    late = {**rows[0], "timestamp": rows[0]["timestamp"] + np.float32(shift_s)}
    with pytest.raises(FrameTimestampError) as alone_error:
        row_frame_numbers(reader, 0, camera, late, wanted[0], index, video=videos[0], **options)
    later = {**rows[1], "timestamp": rows[1]["timestamp"] + np.float32(shift_s)}
    bad = [(2, rows[2], wanted[2], videos[2]), (0, late, wanted[0], videos[0]), (1, later, wanted[1], videos[1])]
    with pytest.raises(FrameTimestampError) as together_error:
        file_frame_numbers(reader, camera, index, bad, **options)
    assert str(together_error.value) == str(alone_error.value)


def test_a_file_lookup_by_frame_index_fails_as_the_first_bad_episode_alone(make_ds) -> None:
    """Looked up by ``frame_index / fps``, a negative frame_index makes the file's joint lookup raise DataFileError
    before it checks any episode's frames; the episodes are then looked up alone, in their order, so an earlier
    episode whose rows read a neighbour's frames raises its own FrameTimestampError first, as it would alone (this
    fallback was run by no test; without it the later episode's ValueError would be raised)."""
    from lerobot_dali.errors import DataFileError, FrameTimestampError
    from lerobot_dali.frame_lookup import TimestampSource, file_frame_numbers

    root = make_ds(episodes=6, frames_per_episode=20, cameras=1, episodes_per_file=3)
    source = _source(root, {})
    reader, camera = source.spec.reader, camera_key(0)
    options = {"timestamp_source": TimestampSource.FRAME_INDEX, "tolerance_s": source.spec.tolerance_s}
    videos = [reader.video(p, camera) for p in (0, 1, 2)]
    index = source._indexes.of_video(reader, videos[0])
    rows = [source._episode_rows(p) for p in (0, 1, 2)]
    wanted = [np.array([0, 19, 5]), np.array([3, 4]), np.array([19, 0])]
    good = [(p, rows[p], wanted[p], videos[p]) for p in (0, 1, 2)]
    found = file_frame_numbers(reader, camera, index, good, **options)
    assert [numbers.tolist() for numbers in found] == [(20 * p + wanted[p]).tolist() for p in (0, 1, 2)]
    negative = {**rows[1], "frame_index": rows[1]["frame_index"] - 10}  # (rows 3 and 4 at frame_index -7, -6)
    late = {**rows[0], "frame_index": rows[0]["frame_index"] + 15}  # (rows 5 and 19 on episode 1's frames)
    cases = [
        ([good[0], (1, negative, wanted[1], videos[1]), good[2]], 1, negative, DataFileError,
         r"episode 1: column 'frame_index' of .* holds -7, a negative frame number"),
        ([(0, late, wanted[0], videos[0]), (1, negative, wanted[1], videos[1])], 0, late, FrameTimestampError,
         "outside this episode's part of the file"),
    ]  # fmt: skip
    for bad, pos, episode_rows, error, said in cases:
        with pytest.raises(error, match=said) as alone_error:
            row_frame_numbers(reader, pos, camera, episode_rows, wanted[pos], index, video=videos[pos], **options)
        with pytest.raises(error) as together_error:
            file_frame_numbers(reader, camera, index, bad, **options)
        assert str(together_error.value) == str(alone_error.value)


def test_a_remote_matroska_cameras_frames_are_decoded_from_clips_exactly(make_ds, tmp_path) -> None:
    """A remote file that is not an MP4 (no byte-exact packet offsets: Matroska here) is decoded by the workers from
    a clip demuxed out of it (batch_source's non-MP4 remote path, run by no test): each sample's window, padded at
    its episode's edges, is the frames of an independent full PyAV decode of the file at its clamped rows."""
    import json
    import shutil

    import tests.fake_remote  # noqa: F401  (registers fakeremote://)
    from lerobot_dali import open_dataset
    from tests.video_fixtures import reference_frames, remux

    root = tmp_path / "mkv"
    shutil.copytree(make_ds(episodes=6, frames_per_episode=20, cameras=1, episodes_per_file=3), root)
    for mp4 in root.rglob("*.mp4"):
        remux(mp4, mp4.with_suffix(".mkv"), "matroska")
        mp4.unlink()
    info = json.loads((root / "meta/info.json").read_text())
    info["video_path"] = info["video_path"].replace(".mp4", ".mkv")
    (root / "meta/info.json").write_text(json.dumps(info))
    camera, steps = camera_key(0), np.array([-3, 0, 2])
    reader = open_dataset("fakeremote://", storage_options={"root": str(root)})
    # (Matroska's frame times are whole milliseconds: up to 0.5 ms from their rows')
    source = _source(reader, {camera: list(steps / FPS)}, tolerance_s=0.0006)
    out = dict(zip([f.name for f in source.fields], source.assemble(EPISODES, FRAMES), strict=True))

    files = {e: root / reader.video(int(e), camera).path for e in (0, 3)}  # episodes 0-2 in one file, 3-5 the other
    assert all(not source._indexes.of_video(reader, reader.video(int(e), camera)).byte_exact for e in files)
    decoded = {e: reference_frames(path) for e, path in files.items()}
    rows = np.clip(FRAMES[:, None] + steps, 0, 19)
    for episode, window, frames in zip(EPISODES, rows, out[camera], strict=True):
        reference = decoded[3 * (episode // 3)]
        pts = sorted(reference)
        expected = np.stack([reference[pts[20 * (episode % 3) + r]] for r in window])
        np.testing.assert_array_equal(frames, expected)
    queried = FRAMES[:, None] + steps
    np.testing.assert_array_equal(out[f"{camera}_is_pad"], (queried < 0) | (queried > 19))


def test_a_first_data_file_that_does_not_read_fails_at_its_episodes_rows_not_at_the_build(make_ds, copy_ds) -> None:
    """The first episode's rows, read once at the build for the scalars' batch shapes, do not read (its data file's
    frame_index page is damaged): the build goes on with each file's own shapes (batch_shapes lines 41-42 and 56,
    reached by no test), and the pass fails at that episode's rows, naming the episode and the file."""
    import re

    import pyarrow.parquet as pq

    from lerobot_dali import open_dataset
    from lerobot_dali.errors import DataFileError

    root = copy_ds(make_ds(episodes=4, frames_per_episode=20, cameras=1, episodes_per_file=2))
    data = root / "data/chunk-000/file-000.parquet"
    chunk = next(
        column
        for column in (pq.ParquetFile(data).metadata.row_group(0).column(i) for i in range(7))
        if column.path_in_schema == "frame_index"
    )
    raw = bytearray(data.read_bytes())
    start = chunk.data_page_offset + 27  # (inside its compressed values, past the page header)
    raw[start : start + 50] = bytes(50)
    data.write_bytes(bytes(raw))
    with pytest.raises(DataFileError, match="Corrupt snappy"):
        open_dataset(root).read_episode(0, ["frame_index"])

    it = DALILeRobotIterator(root, batch_size=4, shuffle=False, device="cpu", num_workers=0, cameras=[])
    assert it._listed_scalars is None
    with pytest.raises(DataFileError, match=rf"^episode 0's rows: {re.escape(str(data))}: reading rows \[0, 20\)"):
        next(iter(it))
    it.close()


def _positions_source(*, drop_last: bool, start_position: int) -> BatchSource:
    """A source over epochs 3 (10 samples) and 4 (8 samples) of a rank, batches of 4, resumed at ``start_position``
    of epoch 3: what :meth:`BatchSource.positions` reads of its spec only."""
    order = SimpleNamespace(num_samples={3: 10, 4: 8}.__getitem__)
    source = BatchSource.__new__(BatchSource)
    source.spec = SimpleNamespace(  # type: ignore[assignment]
        first_epoch=3, start_position=start_position, batch_size=4, drop_last=drop_last, order=order
    )
    return source


def test_batch_positions_start_at_the_resumed_sample_and_later_epochs_at_0() -> None:
    source = _positions_source(drop_last=False, start_position=4)
    # DALI epoch 0 is epoch 3 from its 4th sample, its last batch short; DALI epoch 1 is epoch 4 from its start.
    assert [source.positions(0, i) for i in range(3)] == [(3, 4, 8), (3, 8, 10), None]
    assert [source.positions(1, i) for i in range(3)] == [(4, 0, 4), (4, 4, 8), None]  # (8 of 8: no empty batch)
    # drop_last leaves out the short batch (2 of 4) but keeps a full one that ends the epoch.
    dropping = _positions_source(drop_last=True, start_position=4)
    assert [dropping.positions(0, i) for i in range(2)] == [(3, 4, 8), None]
    assert [dropping.positions(1, i) for i in range(3)] == [(4, 0, 4), (4, 4, 8), None]
    full = _positions_source(drop_last=True, start_position=2)
    assert [full.positions(0, i) for i in range(3)] == [(3, 2, 6), (3, 6, 10), None]


def test_rows_gathered_from_episodes_of_other_dtypes_take_their_common_dtype() -> None:
    """One episode's file stores ``a`` as int32, the next as float64: the batch holds both as float64, what stacking
    each sample's rows gives (not the first episode's int32, which cut 2.5 to 2)."""
    from lerobot_dali.batch_source import _gather_rows

    rows = [{"a": np.array([1, 2, 3], np.int32)}, {"a": np.array([1.5, 2.5], np.float64)}]
    groups = [np.array([0, 2]), np.array([1])]  # samples 0 and 2 of episode 0, sample 1 of episode 1
    gathered = _gather_rows(rows, groups, "a", np.array([2, 1, 0]))
    assert gathered.dtype == np.float64 and gathered.tolist() == [3.0, 2.5, 1.0]
    windows = _gather_rows(rows, groups, "a", np.array([[1, 2], [0, 1], [0, 0]]))
    assert windows.dtype == np.float64 and windows.tolist() == [[2.0, 3.0], [1.5, 2.5], [1.0, 1.0]]


def test_tabular_values_take_the_dtypes_lerobots_items_have() -> None:
    from lerobot_dali.batch_source import lerobot_dtype

    for values, dtype in (
        (np.array([1, 2], np.uint8), np.int64),
        (np.array([1, 2], np.uint32), np.int64),
        (np.array([1, 2], np.int16), np.int64),
        (np.array([0.5, 1.5], np.float16), np.float32),
        (np.array([0.5, 1.5], np.float64), np.float32),
        (np.array([True, False]), np.bool_),
    ):
        converted = lerobot_dtype(values)
        assert converted.dtype == dtype and converted.tolist() == values.tolist(), values.dtype


def test_scalar_rows_take_the_layout_of_the_first_data_file() -> None:
    """Declared (1,) scalars listed (stored as one-element lists in the first file) batch as (n, 1), other scalars
    and the index columns (declared or not) as (n,), whatever a later file stores; vectors stay as they are."""
    from lerobot_dali.batch_source import _scalar_layout
    from lerobot_dali.dataset_info import Feature

    features = {
        "reward": Feature("reward", "float32", (1,)),
        "done": Feature("done", "bool", (1,)),
        "action": Feature("action", "float32", (1,)),
    }
    rows = {
        "reward": np.array([0.5, 1.5]),  # (n,) in this file, listed in the first: (n, 1)
        "done": np.array([[True], [False]]),  # (n, 1) in this file, plain in the first: (n,)
        "frame_index": np.array([[3], [4]]),  # undeclared index column as one-element lists: (n,)
        "action": np.array([[1.0], [2.0]]),
    }
    out = _scalar_layout(rows, features, frozenset({"reward", "action"}))
    assert out["reward"].shape == (2, 1) and out["reward"].ravel().tolist() == [0.5, 1.5]
    assert out["done"].shape == (2,) and out["done"].tolist() == [True, False]
    assert out["frame_index"].shape == (2,) and out["frame_index"].tolist() == [3, 4]
    assert out["action"].shape == (2, 1)


def test_clip_runs_start_counting_again_at_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's bytes count from its first clip: 60 + 60 passes 100, so the second clip starts a run that the third
    (30) joins; counting on from the first run's 60 left every later clip alone."""
    from lerobot_dali import batch_source

    monkeypatch.setattr(batch_source, "CLIP_PASS_BYTES", 100)
    assert batch_source._clip_runs([1, 2, 3, 4], [60, 60, 30, 30]) == [[1], [2, 3], [4]]


def _fields_of(**spec: object) -> list:
    """:func:`output_fields` of a spec of no keys, cameras or augmentation but ``spec``'s."""
    from lerobot_dali.batch_source import output_fields

    empty = dict(
        tabular_keys=(),
        host_value_keys=(),
        delta_index={},
        camera_feeds={},
        image_keys=(),
        image_shapes={},
        depth_image_units={},
        augment=None,
    )
    return output_fields(SimpleNamespace(**{**empty, **spec}))  # type: ignore[arg-type]


def test_a_batch_carries_every_index_column_the_keys_leave_out_once() -> None:
    from lerobot_dali.dali_graph import FieldKind
    from lerobot_dali.windows import PAD_SUFFIX

    fields = _fields_of(tabular_keys=("action", "frame_index"), delta_index={"action": np.arange(2)})
    assert [f.name for f in fields] == [
        "action",
        "frame_index",
        "index",
        "episode_index",
        "timestamp",
        "task_index",
        f"action{PAD_SUFFIX}",
    ]
    assert all(f.kind is FieldKind.TABULAR for f in fields)


def _stub_reader(read_episode, **features: tuple[bool, bool]) -> SimpleNamespace:
    """A reader of one episode whose tabular ``features`` are ``name=(is_scalar, is_host_value)``."""
    info = SimpleNamespace(
        features={k: SimpleNamespace(is_scalar=s, is_host_value=h) for k, (s, h) in features.items()}
    )
    return SimpleNamespace(num_episodes=1, info=info, tabular_keys=list(features), read_episode=read_episode)


def test_first_episode_rows_and_listed_scalars_of_a_stub_reader() -> None:
    from lerobot_dali.batch_shapes import first_episode_rows, listed_scalars
    from lerobot_dali.errors import DatasetError

    asked: list[list[str]] = []
    rows = {"reward": np.zeros((3, 1)), "done": np.zeros(3)}
    reader = _stub_reader(lambda pos, keys: asked.append(keys) or rows, reward=(True, False), done=(True, False),
                          task=(True, True), state=(False, False))  # fmt: skip
    assert first_episode_rows(reader) is rows and asked == [["reward", "done"]]  # (not the host value, nor state)
    assert listed_scalars(reader, rows) == {"reward"}

    def fails(error: Exception):  # a read that raises ``error``
        def read(pos: int, keys: list[str]) -> None:
            raise error

        return _stub_reader(read, reward=(True, False))

    assert first_episode_rows(fails(DatasetError("unreadable"))) is None
    with pytest.raises(ValueError, match="a bug"):  # (not a data file's fault: not hidden)
        first_episode_rows(fails(ValueError("a bug")))


def test_image_shapes_leave_out_cameras_without_an_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from lerobot_dali import batch_shapes

    shapes = {"a": (4, 6, 3), "b": None}
    monkeypatch.setattr(batch_shapes, "first_image_shape", lambda reader, pos, key: shapes[key])
    assert batch_shapes.image_shapes(SimpleNamespace(image_keys=["a", "b"])) == {"a": (4, 6, 3)}


def test_remote_requests_of_one_gop_decode_their_frames_once_each_in_order() -> None:
    """A remote file's requests that start in one GOP decode the union of their frames once, ascending and each once,
    and each request gets its own frames back, in its own order (here a frame's picture is its number x 10)."""
    source = BatchSource.__new__(BatchSource)
    source.spec = SimpleNamespace(reader=SimpleNamespace(filesystem_of=lambda path: object()))  # type: ignore[assignment]
    decoded: list[list[int]] = []

    def decode_request(path, index, numbers, *, size, pixels):
        decoded.append(numbers.tolist())
        return np.asarray(numbers) * 10

    source._decode_request = decode_request  # type: ignore[method-assign]
    gop = SimpleNamespace(start_keyframe=lambda numbers: 0)
    requests = [("a.mp4", gop, np.array([5, 6, 6])), ("a.mp4", gop, np.array([1, 2, 5]))]
    out = source._decode_each(requests, size=None, pixels="rgb")  # type: ignore[arg-type]
    assert decoded == [[1, 2, 5, 6]]
    assert [frames.tolist() for frames in out] == [[50, 60, 60], [10, 20, 50]]


def test_a_clip_camera_is_decoded_where_its_route_decodes() -> None:
    """NVDEC's clips go to DALI's mixed decoder, DALI_CPU's to its CPU one."""
    from lerobot_dali.dali_graph import CameraFeed, DecodeRoute, FieldKind

    feeds = {"nvdec": CameraFeed(DecodeRoute.NVDEC), "dali_cpu": CameraFeed(DecodeRoute.DALI_CPU)}
    clips = {f.name: f.decode_device for f in _fields_of(camera_feeds=feeds) if f.kind is FieldKind.CLIP}
    assert clips == {"nvdec": "mixed", "dali_cpu": "cpu"}


def test_frames_a_worker_resized_are_marked_presized() -> None:
    """A worker that folds the resize into its conversion ships frames the graph must not resize again."""
    from lerobot_dali.dali_graph import CameraFeed, DecodeRoute

    feeds = {
        "small": CameraFeed(DecodeRoute.CPU_FALLBACK, worker_size=(8, 8)),
        "full": CameraFeed(DecodeRoute.CPU_FALLBACK),
    }
    presized = {f.name: f.presized for f in _fields_of(camera_feeds=feeds) if f.name in feeds}
    assert presized == {"small": True, "full": False}
