"""Cameras stored as images in the data files (``dtype: "image"``): encoded bytes -> uint8 RGB or grey frames.

LeRobot datasets converted from other formats (LIBERO, many simulation sets) keep each frame as a PNG or
JPEG inside the parquet rows instead of a video. A window of such a camera is a set of rows, read exactly
like a tabular window (no timestamp lookup), and each row's image is decoded by Pillow in the worker; the
frames then enter the same DALI graph as video frames, so resizing and augmentation are the same.
Episodes' encoded images are kept per worker in a byte-bounded cache, since the episode pool samples each
admitted episode many times. Images tagged with an EXIF orientation are turned upright, as LeRobot decodes them.
Grey images stay one channel, as LeRobot's ``ToTensor`` keeps them; 16-bit images are refused rather than clipped
to 8 bits, unless the camera is flagged a depth map: those are read as depth (:func:`decode_depth_images`), as
LeRobot reads them. Other modes (alpha, palette, CMYK) are refused: LeRobot returns their stored bands as they are
(RGBA as 4 channels, LA as 2, a palette image's palette numbers as 1 grey channel), which no RGB or grey frame
matches.
"""

from __future__ import annotations

import io
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import DataFileError, cameras_hint
from .said_once import warn_once

if TYPE_CHECKING:
    from .dataset_reader import LeRobotDatasetReader

__all__ = ["EpisodeImageCache", "decode_depth_images", "decode_images", "image_label"]

logger = logging.getLogger(__name__)


#: Pillow modes of grey images, read as one channel (values 0 or 255 for 1-bit ones, as LeRobot's ``ToTensor``).
_GREY_MODES = frozenset({"1", "L"})
#: Single-band Pillow modes of 8 bits (or fewer) per sample.
_EIGHT_BIT_MODES = frozenset({"1", "L", "P"})
#: Pillow modes of more than 8 bits per sample (depth maps), which uint8 frames would clip.
_WIDE_MODES = ("I", "F")


def decode_images(encoded: Sequence[bytes], *, label: str, rows: Sequence[int] | None = None) -> np.ndarray:
    """(T, H, W, C) uint8 from T encoded images (any format Pillow reads): C = 1 for grey images (Pillow mode
    ``L`` or ``1``), 3 for RGB ones, the values LeRobot's ``ToTensor`` gives them (times 255).

    Raises DataFileError naming ``label`` and the image (its episode row from ``rows``, the images' rows within
    their episode, else its position) for an undecodable or 16-bit image, for one of another mode (RGBA, LA,
    palette, CMYK: LeRobot returns their stored bands, e.g. 4 channels for RGBA), or for images that differ in size
    or channels.
    """
    return _decode_window(
        encoded,
        label=label,
        rows=rows,
        kind="image",
        convert=_colour_frame,
        refusal=_colour_refusal,
    )


def _colour_refusal(image: Any) -> str:
    """Why ``image`` (open, Pillow), of a mode :func:`_colour_frame` refuses, is not read, and what to do."""
    mode, bands = image.mode, image.getbands()
    if mode.startswith(_WIDE_MODES):
        return (
            f"has more than 8 bits per sample (Pillow mode {mode!r}, e.g. a depth map not flagged is_depth_map in "
            "info.json), which would lose its precision as a colour camera; flag it is_depth_map or leave the camera "
            f"out with {cameras_hint()}"
        )
    stored = "palette numbers, not colours" if mode in ("P", "PA") else "as stored"
    return (
        f"has Pillow mode {mode!r}: LeRobot returns its {len(bands)} channel(s) {'/'.join(bands)} ({stored}), and "
        "this loader reads grey (L, 1) and RGB images only; re-encode the camera's images as RGB or L (Pillow's "
        f"image.convert('RGB') drops alpha and expands a palette), or leave the camera out with {cameras_hint()}"
    )


def first_image_shape(reader: LeRobotDatasetReader, episode_pos: int, camera: str) -> tuple[int, int, int] | None:
    """(H, W, C) of episode ``episode_pos``'s first image of image camera ``camera``, decoded as the workers decode
    it (a depth map's as depth), or None where the episode has none: what every image of a camera is held to,
    since a batch is one tensor. An image the workers could not decode raises here, naming the dataset."""
    first = reader.read_episode_images(episode_pos, camera)[:1].to_pylist()
    if not first:
        return None
    decode = decode_depth_images if camera in reader.info.depth_image_units([camera]) else decode_images
    height, width, channels = decode(first, label=image_label(reader, episode_pos, camera), rows=[0]).shape[1:]
    return height, width, channels


def image_label(reader: LeRobotDatasetReader, episode_pos: int, camera: str) -> str:
    """How errors name an episode's images of ``camera``: its data file, episode and camera."""
    episode = int(reader.episodes.episode_index[episode_pos])
    return f"{reader.data_path(episode_pos)} (episode {episode}, camera {camera})"


def decode_depth_images(encoded: Sequence[bytes], *, label: str, rows: Sequence[int] | None = None) -> np.ndarray:
    """(T, H, W, 1) float32 depth from T encoded single-channel images (16-bit or float, e.g. PNG or TIFF), their
    stored values, as LeRobot reads depth images (8-bit ones divided by 255, as its ``ToTensor`` divides them).

    Raises DataFileError naming ``label`` and the image (as :func:`decode_images`) for an undecodable or
    multi-channel image, or for images that differ in size.
    """
    return _decode_window(
        encoded,
        label=label,
        rows=rows,
        kind="depth image",
        convert=_depth_frame,
        refusal=lambda image: f"has Pillow mode {image.mode!r}, not one channel",
    )


def _colour_frame(image: Any) -> np.ndarray | None:
    """(H, W, 1) grey or (H, W, 3) RGB uint8; None for any other mode (more bits, alpha, a palette, CMYK)."""
    mode = image.mode
    if mode in _GREY_MODES:
        return np.asarray(image if mode == "L" else image.convert("L"))[..., None]
    return np.asarray(image) if mode == "RGB" else None


def _depth_frame(image: Any) -> np.ndarray | None:
    """(H, W, 1) float32 as stored (8-bit divided by 255, as LeRobot's ToTensor); None for several channels."""
    if len(image.getbands()) != 1:
        return None
    # (a 1-bit image's samples are 0 and 1, which ToTensor multiplies by 255 before dividing: 0 and 1, not 1/255)
    frame = np.array(image.convert("L") if image.mode == "1" else image, dtype=np.float32)
    if image.mode in _EIGHT_BIT_MODES:
        frame /= np.float32(255)
    return frame[..., None]


def _upright(image: Any) -> Any:
    """``image`` (open, Pillow) turned as its EXIF orientation says, as LeRobot's image features (``datasets.Image``)
    decode it: a JPEG or PNG tagged "rotate 90" came on its side, with height and width swapped."""
    from PIL import ExifTags, ImageOps

    image.load()  # (a PNG's EXIF may follow its pixels: asked after them, it costs nothing)
    if image.getexif().get(ExifTags.Base.Orientation) is None:
        return image
    return ImageOps.exif_transpose(image)


def _decode_window(
    encoded: Sequence[bytes],
    *,
    label: str,
    rows: Sequence[int] | None,
    kind: str,
    convert: Callable[[Any], np.ndarray | None],
    refusal: Callable[[Any], str],
) -> np.ndarray:
    """The window's images through ``convert`` (a Pillow image -> a frame, or None for a mode the camera cannot
    take, said by ``refusal`` of the image), stacked; DataFileError naming ``label`` and the image's row in
    ``rows`` (else its position)."""
    from PIL import Image, UnidentifiedImageError

    frames = []
    for i, data in enumerate(encoded):
        image_name = f"{kind} {i} of the window" if rows is None else f"the {kind} of the episode's row {int(rows[i])}"
        try:
            with Image.open(io.BytesIO(data)) as opened:
                image = _upright(opened)
                frame = convert(image)
                refused = refusal(image) if frame is None else ""
        # (SyntaxError: Pillow's "broken PNG file", a chunk header read from inside another chunk)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            # (Pillow's own message names its BytesIO object: 'cannot identify image file <_io.BytesIO ...>')
            why = (
                f"no format Pillow reads; its bytes begin {bytes(data[:8])!r}"
                if isinstance(e, UnidentifiedImageError)
                else str(e)
            )
            raise DataFileError(
                f"{label}: {image_name} cannot be decoded ({why}); the data file is corrupt: download or copy it "
                f"again, or leave out its episode (episodes=[...] of the others) or the camera ({cameras_hint()}); "
                "`lerobot-dali check --decode` lists every such image"
            ) from e
        if frame is None:
            raise DataFileError(f"{label}: {image_name} {refused}")
        frames.append(frame)
    shapes = {f.shape for f in frames}
    if len(shapes) > 1:
        raise DataFileError(
            f"{label}: the window's {kind}s differ in size or channels {sorted(shapes)}; a camera has one of each"
        )
    return np.stack(frames)


class EpisodeImageCache:
    """Per worker: ``(episode_pos, camera) -> encoded images``, least recently used first out past ``max_bytes``.

    ``read(episode_pos, camera)`` loads one episode's images (e.g. ``LeRobotDatasetReader.read_episode_images``).
    An episode larger than the bound is still returned, just not kept. ``entries_in_use``: the (episode, camera)
    pairs the caller's samples cycle through (a worker: its episode pool's, per image camera); a bound that cannot
    hold them is said once, with the bytes that would: samples then draw episodes at random among more than are
    kept, and most of them read their episode's whole image column again (parquet decodes whole row groups).
    """

    def __init__(self, read: Callable[[int, str], pa.Array], *, max_bytes: int, entries_in_use: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._read = read
        self._max_bytes = max_bytes
        self.entries_in_use = entries_in_use
        self._entries: OrderedDict[tuple[int, str], pa.Array] = OrderedDict()
        self._bytes = 0
        self._said_short = False

    def get(self, episode_pos: int, camera: str) -> pa.Array:
        key = (episode_pos, camera)
        images = self._entries.get(key)
        if images is not None:
            self._entries.move_to_end(key)
            return images
        images = self._read(episode_pos, camera)
        if images.nbytes > self._max_bytes:
            self._say_short(images.nbytes)
            return images
        self._entries[key] = images
        self._bytes += images.nbytes
        while self._bytes > self._max_bytes:
            self._say_short(self._bytes // len(self._entries))
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes
        return images

    def _say_short(self, each: int) -> None:
        """Said once where the bound drops an entry while holding fewer than are in use (``each``: bytes each)."""
        if self._said_short or not self.entries_in_use or len(self._entries) > self.entries_in_use:
            return
        self._said_short = True
        warn_once(
            logger,
            "image cameras: the worker's samples draw from up to %d episodes' images (episode pool x image "
            "cameras) of ~%.1f MB each, but image_cache_bytes=%d keeps fewer, so most samples read their "
            "episode's images from the data file again (~2 ms per MB); raise CpuDecodeOptions(image_cache_bytes="
            "...) (about %d per worker holds them all), or lower episode_pool_size",
            self.entries_in_use,
            each / 2**20,
            self._max_bytes,
            self.entries_in_use * each,
            key="image_cache_bytes",  # (each worker's numbers its own: said once a job)
        )

    @property
    def nbytes(self) -> int:
        return self._bytes
