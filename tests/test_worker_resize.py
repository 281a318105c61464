"""CPU mode resizes worker-decoded cameras in the worker (issue #6): the rule, the frames, everything else unchanged.

Expected frames are DALI's own ``fn.resize`` (linear, antialiased: what the pipeline did before) of an
independent full sequential PyAV decode of the same file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_dali.augment import AugmentConfig, ColorJitter, Normalize, RandomAffine, RandomResizedCrop, leading_resize
from lerobot_dali.cpu_decode import ColorConversion, CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.dali_graph import camera_feed
from lerobot_dali.decode_route import DecodeRoute
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_index_cache import load_packet_index
from lerobot_dali.torchcodec_reader import _resize_nhwc
from tests.video_fixtures import reference_frames

LENGTHS = [5, 1, 7, 4, 6]  # as tests/test_iterator.py, so the session's generated datasets are shared
SIZE = (56, 72)  # from 96x128: a real downscale, different factors in H and W
DELTAS = {"observation.images.cam0": [-0.2, 0.0], "action": [0.0, 0.1]}
# Bounds for the generated marker frames (hard black/white edges, the worst case for 4:2:0 chroma): measured
# mean 1.5-1.7 per frame and max 17 (AV1) / 13 (H.264); the neighbouring frame differs by a mean >= 17.
MEAN_BOUND, MAX_BOUND = 2.5, 32


def _dataset(make_ds, codec: str) -> Path:
    return make_ds(episodes=5, frames_per_episode=LENGTHS, cameras=2, codec=codec, fps=10, episodes_per_file=2, gop=4)


def _dali_resize(frames: list[np.ndarray], size: tuple[int, int]) -> np.ndarray:
    """DALI's CPU ``fn.resize`` as augment.py calls it, on full RGB frames."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=len(frames), num_threads=1, device_id=None)
    def resize():
        full = fn.external_source(source=lambda: frames, batch=True, layout="HWC")
        return fn.resize(full, size=list(size), antialias=True)

    pipe = resize()
    pipe.build()
    (out,) = pipe.run()
    return np.stack([np.array(out[i]) for i in range(len(frames))])


def _camera_reference(root: Path, camera: str, size: tuple[int, int]) -> np.ndarray:
    """Every frame of ``camera`` in dataset order (files hold 2 episodes each), resized by DALI."""
    full = []
    for file_index in range(3):
        path = root / f"videos/{camera}/chunk-000/file-{file_index:03d}.mp4"
        full += [frame for _, frame in sorted(reference_frames(path).items())]
    return _dali_resize(full, size)


def _assert_close(got: np.ndarray, expected: np.ndarray) -> None:
    diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    assert diff.mean() < MEAN_BOUND and diff.max() <= MAX_BOUND, (diff.mean(), diff.max())


# -- the rule ------------------------------------------------------------------------------------------------


CPU, GPU = False, True
FALLBACK = DecodeRoute.CPU_FALLBACK
CROP = RandomResizedCrop(size=(8, 8))
COLOUR = AugmentConfig(color_jitter=ColorJitter(brightness=0.2), normalize=Normalize(mean=(0.5,) * 3, std=(0.2,) * 3))
AFFINE = AugmentConfig(affine=RandomAffine(degrees=10.0))


@pytest.mark.parametrize(
    ("route", "on_gpu", "augment", "image_size", "expected"),
    [
        # plain resize of a worker-decoded camera on the CPU: the worker resizes
        (FALLBACK, CPU, None, (224, 224), (224, 224)),
        # on a GPU the device resizes
        (FALLBACK, GPU, None, (224, 224), None),
        # DALI's own decoders hand full frames to the graph
        (DecodeRoute.DALI_CPU, CPU, None, (224, 224), None),
        (DecodeRoute.NVDEC, GPU, None, (224, 224), None),
        # nothing to resize
        (FALLBACK, CPU, None, None, None),
        # a random crop takes image_size and must cut the full frame
        (FALLBACK, CPU, AugmentConfig(random_resized_crop=CROP), (224, 224), None),
        # ... unless a configured resize runs before it: the worker does that one, the crop follows
        (FALLBACK, CPU, AugmentConfig(resize=(120, 160), random_resized_crop=CROP), (224, 224), (120, 160)),
        # colour jitter and normalise work at any size; an affine follows the resize, on the resized frame
        (FALLBACK, CPU, COLOUR, (224, 224), (224, 224)),
        (FALLBACK, CPU, AFFINE, (96, 96), (96, 96)),
        # an affine without any resize needs the full frame
        (FALLBACK, CPU, AFFINE, None, None),
    ],
)
def test_worker_resize_rule(route, on_gpu, augment, image_size, expected) -> None:
    options = CpuDecodeOptions(color_conversion=ColorConversion.WORKER)
    feed = camera_feed(route, on_gpu=on_gpu, cpu_decode=options, augment=augment, image_size=image_size)
    assert feed.worker_size == expected
    assert not feed.planes


def test_leading_resize_follows_augment_frames_order() -> None:
    assert leading_resize(None, [48, 64]) == (48, 64)  # normalised to a tuple
    assert leading_resize(AugmentConfig(resize=(10, 20)), None) == (10, 20)
    assert leading_resize(AugmentConfig(resize=(10, 20)), (30, 40)) == (30, 40)  # output_size replaces the resize
    with pytest.raises(ValueError, match="output_size"):
        leading_resize(None, (0, 64))


def test_presized_without_a_leading_resize_is_rejected() -> None:
    from nvidia.dali import fn, pipeline_def

    from lerobot_dali.augment import augment_frames

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def graph():
        frames = fn.external_source(source=lambda: [np.zeros((1, 4, 4, 3), np.uint8)], batch=True, layout="FHWC")
        return augment_frames(frames, config=None, camera_index=0, presized=True)

    with pytest.raises(ValueError, match="presized=True needs a leading resize"):
        graph()


# -- the decoder ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_decoder_resizes_close_to_dali_resize_of_the_full_frame(make_ds, codec: str) -> None:
    path = _dataset(make_ds, codec) / "videos/observation.images.cam0/chunk-000/file-001.mp4"
    index = load_packet_index(path)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    wanted = [9, 0, 3, 3, 10]  # request order and repeats kept
    full = decoder.decode(path, index, wanted)
    small = decoder.decode(path, index, wanted, size=SIZE)
    assert full.shape == (5, 96, 128, 3) and small.shape == (5, *SIZE, 3) and small.dtype == np.uint8
    np.testing.assert_array_equal(full, np.stack([f for _, f in sorted(reference_frames(path).items())])[wanted])
    _assert_close(small, _dali_resize(list(full), SIZE))
    # the video's own size is no resize at all: bit-identical to the plain decode
    np.testing.assert_array_equal(decoder.decode(path, index, wanted, size=(96, 128)), full)
    # and its sides swapped are a resize (height 128, width 96), not the video's own size
    swapped = decoder.decode(path, index, wanted, size=(128, 96))
    assert swapped.shape == (5, 128, 96, 3)
    _assert_close(swapped, _dali_resize(list(full), (128, 96)))
    decoder.close()


@pytest.mark.parametrize("size", [(0, 10), (10,), (10, 20, 30), (10.0, 20), (True, 20), "224x224"])
def test_decoder_rejects_a_bad_size(make_ds, size) -> None:
    path = _dataset(make_ds, "h264") / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    with pytest.raises(ValueError, match="size must be a pair"):
        CpuFrameDecoder().decode(path, load_packet_index(path), [0], size=size)


def test_torchcodec_path_resize_matches_dali_resize(make_ds) -> None:
    # torchcodec does not load here; its readers' resize of the decoded batch is checked on PyAV frames.
    path = _dataset(make_ds, "av1") / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    full = np.stack([f for _, f in sorted(reference_frames(path).items())])
    got = _resize_nhwc(torch.from_numpy(full), SIZE)
    assert got.shape == (len(full), *SIZE, 3) and got.dtype == np.uint8
    diff = np.abs(got.astype(np.int32) - _dali_resize(list(full), SIZE).astype(np.int32))
    assert diff.mean() < 0.1 and diff.max() <= 16, (diff.mean(), diff.max())  # measured: mean 0.01, max 9
    np.testing.assert_array_equal(_resize_nhwc(torch.from_numpy(full), (96, 128)), full)


# -- the iterator --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_cpu_mode_frames_resized_in_worker_match_dali_resize(make_ds, caplog, codec: str) -> None:
    root = _dataset(make_ds, codec)
    with caplog.at_level(logging.INFO, logger="lerobot_dali.camera_plan"):
        it = DALILeRobotIterator(
            root, batch_size=23, delta_timestamps=DELTAS, shuffle=False, device="cpu", num_workers=0,
            drop_last=False, return_uint8=True, image_size=SIZE,
        )  # fmt: skip
    assert set(it.routes.values()) == {DecodeRoute.CPU_FALLBACK}
    assert [r.getMessage() for r in caplog.records if "decoding workers resize" in r.getMessage()] == [
        "CPU mode: the decoding workers resize {'observation.images.cam0': (56, 72), "
        "'observation.images.cam1': (56, 72)} (not the pipeline)"
    ]
    batch = next(iter(it))
    assert batch["observation.images.cam0"].shape == (23, 2, 3, *SIZE)
    assert batch["observation.images.cam1"].shape == (23, 3, *SIZE)
    ep = batch["episode_index"].numpy()
    frame = batch["frame_index"].numpy()
    starts = np.cumsum([0, *LENGTHS])[ep]
    # cam1: the sample's own frame; cam0: frames f-2 and f, clamped to the episode
    ref1 = _camera_reference(root, "observation.images.cam1", SIZE)
    _assert_close(batch["observation.images.cam1"].permute(0, 2, 3, 1).numpy(), ref1[starts + frame])
    ref0 = _camera_reference(root, "observation.images.cam0", SIZE)
    lengths = np.array(LENGTHS)[ep]
    for t, delta in enumerate((-2, 0)):
        rows = starts + np.clip(frame + delta, 0, lengths - 1)
        _assert_close(batch["observation.images.cam0"][:, t].permute(0, 2, 3, 1).numpy(), ref0[rows])
    # the bound tells frames apart: the neighbouring frame is far outside it
    shifted = np.abs(batch["observation.images.cam1"][1:].permute(0, 2, 3, 1).numpy().astype(int) - ref1[:-1])
    assert shifted.reshape(22, -1).mean(axis=1).min() > 4 * MEAN_BOUND


def test_worker_resize_leaves_everything_else_unchanged(make_ds) -> None:
    root = _dataset(make_ds, "av1")
    kwargs = dict(batch_size=8, delta_timestamps=DELTAS, shuffle=True, seed=3, device="cpu", num_workers=0)
    plain = list(DALILeRobotIterator(root, **kwargs))
    resized = list(DALILeRobotIterator(root, image_size=SIZE, **kwargs))
    assert len(plain) == len(resized) == 2
    for a, b in zip(plain, resized, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("observation.images.") and not key.endswith("_is_pad"):
                assert a[key].shape[:-2] == b[key].shape[:-2] and b[key].shape[-2:] == SIZE
                assert b[key].dtype == torch.float32 and 0.0 <= float(b[key].min()) <= float(b[key].max()) <= 1.0
            elif key == "task":
                assert a[key] == b[key]
            else:
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
