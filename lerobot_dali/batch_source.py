"""The CPU half of one batch: positions -> episode rows -> windows -> video requests, in a DALI worker.

:class:`BatchSource` is the parallel external source's callable. It is stateless in what it returns: batch
``i`` of DALI epoch ``e`` is a pure function of the sample order, so any worker process can compute any
batch, and resume is exact. What it keeps are caches only (episode rows, packet indexes, open decoders),
each bounded and rebuilt after the process boundary.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from . import errors, io_stats
from .augment_config import AugmentConfig
from .augment_draws import draw_names, draw_params, stream_name
from .clip_sharing import SHARED_CLIP_FRAMES, share_clips
from .clips import ClipPlan, build_clip, joined_for_one_pass, plan_clip, read_packet_payloads, remux_clip
from .cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder, Pixels
from .dali_graph import CameraFeed, Field, FieldKind, augment_draw_field
from .dali_video import DALI_CPU_CODECS
from .dataset_info import INDEX_COLUMNS, Feature
from .dataset_reader import LeRobotDatasetReader, VideoRef
from .decode_route import DecodeRoute
from .depth_maps import DepthQuantizer, DepthUnit, in_unit
from .errors import DataFileError, DatasetError, MissingDataFileError, SchemaMismatchError, VideoDecodeError
from .frame_lookup import TimestampSource, file_frame_numbers
from .host_values import encode_host_values
from .image_frames import EpisodeImageCache, decode_depth_images, decode_images, image_label
from .open_files import out_of_files
from .packet_index import PacketIndex, build_packet_index
from .packet_index_cache import PacketIndexCache
from .packet_index_store import PacketIndexStore
from .parent_watch import exit_with_parent, leave_interrupts_to_parent
from .sample_order import SampleOrder
from .video_source import open_video_source
from .windows import PAD_SUFFIX, query_indices
from .worker_errors import carry_to_trainer
from .worker_start import log_like_trainer
from .yuv_frames import PlaneFrames, ships_half_chroma, stream_color

if TYPE_CHECKING:
    from .camera_codecs import FileFormat

__all__ = ["BatchSource", "CameraFormat", "SourceSpec", "batch_bytes_estimate", "output_fields"]

logger = logging.getLogger(__name__)


class CameraFormat(NamedTuple):
    """What every file of a video camera must share with its first: the size (a batch is one tensor); where DALI
    decodes the camera (NVDEC, or its CPU decoder for VP8/VP9/MJPEG), the codec and the colour tags (both decoders
    convert as BT.601: the graph's colour correction is the first file's); on NVDEC the pixel format (its probe
    decoded the first file's). Where
    the workers decode it, each file has a decoder of its own, of any codec, converting any pixel format and colour
    space: LeRobot 0.4's ``delete_episodes`` and ``split_dataset`` re-encode the files they cut as AV1 and keep the
    others, so a camera may mix codecs."""

    codec: str
    height: int
    width: int
    pix_fmt: str | None = None  # None: any (not on NVDEC)
    color: tuple[int, bool] | None = None  # (AVColorSpace, full range); None: any (not decoded by DALI)
    route: DecodeRoute = DecodeRoute.CPU_FALLBACK

    @classmethod
    def of(cls, index: PacketIndex | FileFormat, *, route: DecodeRoute) -> CameraFormat:
        """The format of a file (its packet index, or its header: :mod:`~lerobot_dali.camera_codecs`) as far as
        ``route`` holds the camera's other files to it."""
        if route.dali_device is None:
            return cls(index.codec, index.height, index.width, route=route)
        color = stream_color(index.template) if isinstance(index, PacketIndex) else index.color
        pix_fmt = index.pix_fmt if route is DecodeRoute.NVDEC else None
        return cls(index.codec, index.height, index.width, pix_fmt, color, route)

    @property
    def nvdec(self) -> bool:
        return self.route is DecodeRoute.NVDEC

    def admits(self, index: PacketIndex | FileFormat) -> bool:
        found = CameraFormat.of(index, route=self.route)
        return found == (self if self.route.dali_device else self._replace(codec=found.codec))

    def check(self, index: PacketIndex, *, path: str, episode: int, camera: str) -> None:
        """Raise SchemaMismatchError naming the file, episode and camera unless it :meth:`admits` ``index``
        (episode ``episode``'s file ``path`` of ``camera``)."""
        if self.admits(index):
            return
        found = CameraFormat.of(index, route=self.route)
        if (found.height, found.width) != (self.height, self.width) or found.codec == self.codec:
            raise SchemaMismatchError(
                f"{path} (episode {episode}, camera {camera!r}) is {found}, but the camera's first file is {self}; "
                "a camera's videos must share one size (where DALI decodes them, one codec and colour tags; on NVDEC, "
                "pixel format too: the first file set them up): re-encode this file"
            )
        decoder = "NVDEC" if self.nvdec else "DALI's CPU decoder"
        # (decode='cpu' still sends VP8/VP9/MJPEG to DALI's CPU decoder)
        workers = "" if self.codec in DALI_CPU_CODECS else "pass decode='cpu' (the workers decode each file) or "
        raise SchemaMismatchError(
            f"{path} (episode {episode}, camera {camera!r}) is {found.codec}, but the camera's first file is {self}, "
            f"which sent the camera to {decoder}, one codec per camera: {workers}copy the dataset with one codec "
            "(`lerobot-dali reencode`; LeRobot 0.4's delete_episodes and split_dataset re-encode the files they cut "
            "as AV1 and keep the others)"
        )

    def __str__(self) -> str:
        text = f"{self.codec} {self.height}x{self.width} (HxW)"
        if self.color is not None:
            text += "" if self.pix_fmt is None else f" {self.pix_fmt},"
            text += f" colour space {self.color[0]}{' full range' if self.color[1] else ''}"
        return text


@dataclass(frozen=True)
class SourceSpec:
    """Everything a worker needs, picklable and small (no open files)."""

    reader: LeRobotDatasetReader
    order: SampleOrder
    #: ``key -> delta_index`` (frames relative to the sample) for every key with a window.
    delta_index: dict[str, np.ndarray]
    batch_size: int
    drop_last: bool
    first_epoch: int
    #: Samples of ``first_epoch`` already consumed (resume); later epochs start at 0.
    start_position: int
    #: What each camera sends, in the dataset's camera order (:func:`~.dali_graph.camera_feed`).
    camera_feeds: dict[str, CameraFeed]
    tabular_keys: tuple[str, ...]
    timestamp_source: TimestampSource
    tolerance_s: float
    #: Tabular keys whose values are strings or structures (:mod:`.host_values`), not numbers.
    host_value_keys: tuple[str, ...] = ()
    #: Per worker: rows of recently read episodes kept, at least the episode pool's.
    rows_cache_episodes: int = 256
    #: Remote datasets: packet indexes on disk, built once (by the prefetcher or the first worker) for all.
    index_store: PacketIndexStore | None = None
    #: How worker-decoded (CPU-fallback) cameras are decoded: backend, threads per decoder, open decoders.
    cpu_decode: CpuDecodeOptions = dataclass_field(default_factory=CpuDecodeOptions)
    #: Cameras stored as images in the data files (:mod:`.image_frames`), after the video cameras.
    image_keys: tuple[str, ...] = ()
    #: Per video camera, the format of its first file (:class:`CameraFormat`): the route and the batch shape rest
    #: on it, so a file that differs fails naming itself.
    camera_formats: Mapping[str, CameraFormat] = dataclass_field(default_factory=dict)
    #: Per video camera, its first file's pixel format (None: not known), which sizes the planes its workers ship
    #: in :func:`batch_bytes_estimate` (the workers convert any format, so other files may differ).
    pix_fmts: Mapping[str, str | None] = dataclass_field(default_factory=dict)
    #: Depth-map cameras (their feeds say ``depth``): the quantiser of each, and the unit they are read in.
    depth_quantizers: Mapping[str, DepthQuantizer] = dataclass_field(default_factory=dict)
    #: Image cameras of depth, with the unit their images are stored in (None: not said, read as stored).
    depth_image_units: Mapping[str, str | None] = dataclass_field(default_factory=dict)
    depth_unit: DepthUnit = DepthUnit.MM
    #: Per image camera, (H, W, C) of its first image: a batch is one tensor, so every image must match (C: its
    #: channels, 1 for grey).
    image_shapes: Mapping[str, tuple[int, int, int]] = dataclass_field(default_factory=dict)
    #: The scalar features (declared shape (1,)) that batch as (B, 1), stored as one-element lists in the first
    #: episode's data file; every episode's rows are given that shape, every other scalar's (B,). None: each
    #: file's own.
    listed_scalars: frozenset[str] | None = None
    #: The stream's identity, which random augmentation draws are keyed by.
    seed: int = 0
    rank: int = 0
    augment: AugmentConfig | None = None
    #: The level lerobot-dali logs at in the training process, which the workers log at too.
    log_level: int = logging.WARNING


def lerobot_dtype(values: np.ndarray) -> np.ndarray:
    """``values`` in the dtype LeRobot's items have: they pass through ``torch.tensor`` as Python scalars, so
    every float column comes out float32 (float64 ones included) and every integer column int64."""
    if values.dtype.kind == "f" and values.dtype != np.float32:
        return values.astype(np.float32)
    if values.dtype.kind in "iu" and values.dtype != np.int64:
        return values.astype(np.int64)
    return np.ascontiguousarray(values)


#: The field that carries each camera's frames (others follow it), for draws per camera.
_CAMERA_KINDS = (FieldKind.FRAMES, FieldKind.PLANES_LUMA, FieldKind.CLIP)
#: Per worker: bytes of packet indices kept (34 a frame without B-frames, 46 with: 1-1.4 MB a 30,000-frame file). A
#: miss reloads the index from the disk store (4-7 ms such a file). A pool of 64 episodes x 3 cameras used 165 such
#: files per worker: at 65 bytes a frame, 64 / 128 / 256 MB found 16% / 41% / 83% of requests' indexes kept (batches
#: +50% at 128 MB); at 46, 256 MB keeps them all (96%: the misses are first uses).
INDEX_CACHE_BYTES = 256 * 2**20

#: Packet bytes a run of clips reads before remuxing them (:meth:`BatchSource._clips`): with 1 MiB a batch of clips of a
#: few KB took 1.3x less CPU, one of GOPs of 250 frames 1.05x less, where passes over its whole 15 MB cost 1.3x more.
CLIP_PASS_BYTES = 2**20

#: One sample's video request: (video path, packet index, display frame numbers of its rows).
Request = tuple[str, PacketIndex, np.ndarray]


def _is_local(fs: Any) -> bool:
    """Whether ``fs`` reads this machine's disk (:attr:`~.dataset_location.DatasetLocation.is_local`): its files are
    decoded by path, not read as byte ranges."""
    return isinstance(fs, LocalFileSystem)


def _shape_text(shape: tuple[int, ...]) -> str:
    height, width, channels = shape
    return f"{height}x{width} (HxW) with {channels} channel(s)"


def _decodes_distinct(spec: SourceSpec, camera: str) -> bool:
    """Whether a clip camera's window may repeat frames (edge padding), so its distinct frames are decoded once
    each and put in window order by the graph (``FieldKind.CLIP_ORDER``)."""
    return len(spec.delta_index.get(camera, ())) > 1


def batch_bytes_estimate(spec: SourceSpec) -> int:
    """About the bytes of one batch the workers hand over in shared memory: its frames (RGB; planes of 8-bit 4:2:0
    files with even sides at half that, others at RGB's size, by the camera's first file; depth as float32; a clip at
    a sixteenth of its frames' RGB, about a keyframe's share), which outweigh the tabular columns. It bounds the
    batches the workers may hold at once (:func:`~.dali_graph.source_queue_depth`)."""
    per_sample = 0
    for camera, feed in spec.camera_feeds.items():
        shape = spec.camera_formats.get(camera)
        if shape is None:
            continue
        height, width = feed.worker_size or (shape.height, shape.width)
        pixels = height * width * len(spec.delta_index.get(camera, (0,)))
        if feed.depth:
            per_sample += 4 * pixels
        elif feed.planes and not (height % 2 or width % 2) and ships_half_chroma(spec.pix_fmts.get(camera)):
            per_sample += 3 * pixels // 2
        elif feed.route.dali_device is None:
            per_sample += 3 * pixels
        else:
            per_sample += 3 * pixels // 16
    for key in spec.image_keys:
        height, width, channels = spec.image_shapes.get(key, (0, 0, 3))
        bytes_per_value = 4 if key in spec.depth_image_units else 1
        per_sample += height * width * channels * bytes_per_value * len(spec.delta_index.get(key, (0,)))
    return per_sample * spec.batch_size


def output_fields(spec: SourceSpec) -> list[Field]:
    """The external source's outputs, in order; the DALI graph and the iterator both read this list."""
    fields = [
        Field(key, FieldKind.HOST_VALUES if key in spec.host_value_keys else FieldKind.TABULAR)
        for key in spec.tabular_keys
    ]
    fields += [Field(key, FieldKind.TABULAR) for key in INDEX_COLUMNS if key not in spec.tabular_keys]
    fields += [Field(f"{key}{PAD_SUFFIX}", FieldKind.TABULAR) for key in spec.delta_index]
    for camera_index, (camera, feed) in enumerate(spec.camera_feeds.items()):
        if feed.depth:
            fields.append(Field(camera, FieldKind.DEPTH, camera_index=camera_index, channels=1))
        elif feed.planes:
            fields.append(Field(camera, FieldKind.PLANES_LUMA, camera_index=camera_index))
            fields.append(Field(f"{camera}.__chroma", FieldKind.PLANES_CHROMA, camera_index=camera_index))
            fields.append(Field(f"{camera}.__color_matrix", FieldKind.PLANES_MATRIX, camera_index=camera_index))
        elif feed.route.dali_device is None:
            presized = feed.worker_size is not None
            fields.append(Field(camera, FieldKind.FRAMES, camera_index=camera_index, presized=presized))
        else:
            device: Literal["cpu", "mixed"] = "mixed" if feed.route.dali_device == "mixed" else "cpu"
            fields.append(
                Field(camera, FieldKind.CLIP, decode_device=device, camera_index=camera_index, color_fix=feed.color_fix)
            )
            fields.append(Field(f"{camera}.__frames", FieldKind.CLIP_FRAMES, camera_index=camera_index))
            if feed.share_clips or _decodes_distinct(spec, camera):
                fields.append(Field(f"{camera}.__order", FieldKind.CLIP_ORDER, camera_index=camera_index))
            if feed.share_clips:
                fields.append(Field(f"{camera}.__take", FieldKind.CLIP_TAKE, camera_index=camera_index))
    first_image = len(spec.camera_feeds)
    fields += [
        Field(key, FieldKind.DEPTH, camera_index=first_image + i, channels=1)
        if key in spec.depth_image_units
        else Field(
            key, FieldKind.FRAMES, camera_index=first_image + i, channels=spec.image_shapes.get(key, (0, 0, 3))[2]
        )
        for i, key in enumerate(spec.image_keys)
    ]
    # Random augmentation parameters, one set per draw stream (one for all cameras when they share draws), of
    # what its cameras use (grey ones draw no saturation or hue).
    if spec.augment is not None:
        params: dict[str, dict[str, None]] = {}
        for field in fields:
            if field.kind in _CAMERA_KINDS:
                names = draw_names(spec.augment.for_channels(field.channels))
                params.setdefault(stream_name(spec.augment, field.camera_index), {}).update(dict.fromkeys(names))
        fields += [augment_draw_field(stream, param) for stream, names in params.items() for param in names]
    return fields


class BatchSource:
    """``batch_info -> tuple of outputs`` for DALI's parallel external source (``batch=True``)."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.fields = output_fields(spec)
        self._in_worker = False
        self._init_caches()

    def _init_caches(self) -> None:
        self._rows: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        #: Files whose samples share no clip (:meth:`_shared_clips`).
        self._unshared_files: set[str] = set()
        # The episodes a worker's samples cycle through: its pool's (all of the dataset's, where the pool is larger).
        pooled = min(self.spec.order.options.episode_pool_size, self.spec.reader.num_episodes)
        # Every pooled episode's rows at least: a sample of an episode the cache dropped reads its rows again.
        self._rows_kept = max(self.spec.rows_cache_episodes, pooled)
        # Every video file the pooled episodes use, per camera, at least: fewer rebuilt each index per request.
        files = pooled * max(1, len(self.spec.camera_feeds))
        # Each pooled episode's video refs, per camera: a ref formats and normalises its path (~4 us), and every batch
        # asks one per episode and camera.
        self._video_ref = functools.lru_cache(maxsize=self._rows_kept * len(self.spec.camera_feeds) or 1)(
            self.spec.reader.video
        )
        self._indexes = PacketIndexCache(max_entries=max(64, 2 * files), max_bytes=INDEX_CACHE_BYTES)
        # And open, those of the cameras the worker decodes itself (DALI decodes the others' clips): fewer reopened.
        decoded_here = sum(f.depth or f.planes or f.route.dali_device is None for f in self.spec.camera_feeds.values())
        self._decoder = CpuFrameDecoder(options=self.spec.cpu_decode, files_in_use=pooled * decoded_here)
        # Likewise the encoded images of every pooled episode, per image camera, while they fit the budget (else
        # said).
        self._images = EpisodeImageCache(
            self.spec.reader.read_episode_images,
            max_bytes=self.spec.cpu_decode.image_cache_bytes,
            entries_in_use=pooled * len(self.spec.image_keys),
        )

    def close(self) -> None:
        """Close the decoders and data files this process opened for its batches and drop its caches (later batches
        open them again). A pipeline without workers calls this source in the training process, and DALI's pipeline
        is a reference cycle: once closed it kept them (an epoch's decoders, data files and rows) until the cycle
        collector ran, so each iterator built and dropped held on to a few more open files."""
        self._decoder.close()
        self.spec.reader.close_files()
        self._init_caches()

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "fields": self.fields}

    def __setstate__(self, state: dict[str, Any]) -> None:  # in a worker process
        self.__dict__.update(state)
        self._in_worker = True
        self._init_caches()
        exit_with_parent()
        leave_interrupts_to_parent()
        log_like_trainer(self.spec.log_level)
        # (Only RGB may come from torchcodec: planes and depth always come from PyAV, and asking which backend AUTO
        # is looks for torchcodec, which imports torch.)
        rgb_decoded = any(
            feed.route is DecodeRoute.CPU_FALLBACK and not (feed.planes or feed.depth)
            for feed in self.spec.camera_feeds.values()
        )
        if self.spec.depth_quantizers or (rgb_decoded and self._decoder.backend is CpuDecoderBackend.TORCHCODEC):
            # torch ops here (depth dequantisation, torchcodec's resizes) on one thread, as in DataLoader's
            # workers: otherwise each worker's ops spread over every core and the workers thrash (2 workers on 2
            # cores, a depth camera: 137 frames/s against 2,124).
            import torch

            torch.set_num_threads(1)

    # -- positions ---------------------------------------------------------------------------------------
    def positions(self, epoch_offset: int, iteration: int) -> tuple[int, int, int] | None:
        """``(epoch, start, stop)`` of batch ``iteration`` in DALI epoch ``epoch_offset``, or None past the end."""
        spec = self.spec
        epoch = spec.first_epoch + epoch_offset
        first = spec.start_position if epoch_offset == 0 else 0
        total = spec.order.num_samples(epoch)
        start = first + iteration * spec.batch_size
        stop = min(total, start + spec.batch_size)
        if start >= total or (spec.drop_last and stop - start < spec.batch_size):
            return None
        return epoch, start, stop

    def __call__(self, batch_info: Any) -> tuple[Any, ...]:
        where = self.positions(batch_info.epoch_idx, batch_info.iteration)
        if where is None:
            raise StopIteration
        epoch, start, stop = where
        episode_pos, frame = self.spec.order.samples(epoch, start, stop)
        try:
            return self.assemble(episode_pos, frame, epoch=epoch, positions=np.arange(start, stop))
        except Exception as e:
            if type(e).__module__ == errors.__name__:
                if self._in_worker:
                    carry_to_trainer(e)
                raise  # ours name the file; they cross the worker boundary as themselves (worker_errors)
            episodes = sorted({int(self.spec.reader.episodes.episode_index[p]) for p in episode_pos})
            failed_at = f"reading samples [{start}, {stop}) of epoch {epoch} (episodes {episodes})"
            if type(e).__module__ == "builtins" and not isinstance(e, StopIteration):
                # They cross as themselves too, but an IndexError or OSError alone says nothing of which data.
                # (The copy keeps the type and message only: an OSError's errno and filename stay on __cause__.)
                try:
                    said = out_of_files(e) or e  # (no file at fault: the limit, said with what to do)
                    located = type(e)(f"{self.spec.reader.location.description}: {failed_at}: {_with_notes(said)}")
                except Exception:  # a builtin that takes other arguments (UnicodeDecodeError): as it is
                    located = None
                if located is None:
                    raise
                raise located from e
            # Third-party (pyarrow, fsspec, aiohttp, ...): DALI would hand over a bare Exception.
            raise DatasetError(
                f"{self.spec.reader.location.description}: {failed_at} failed with "
                f"{type(e).__module__}.{type(e).__qualname__}: {_with_notes(e)}"
            ) from e

    # -- assembly ----------------------------------------------------------------------------------------
    def assemble(
        self, episode_pos: np.ndarray, frame: np.ndarray, *, epoch: int = 0, positions: np.ndarray | None = None
    ) -> tuple[Any, ...]:
        """The outputs for samples ``(episode_pos[i], frame[i])``, in :func:`output_fields` order.

        ``epoch`` and ``positions`` (each sample's place in the rank's stream of that epoch) key the random
        augmentation draws; they are needed only when ``spec.augment`` draws any.
        """
        spec = self.spec
        rows = [self._episode_rows(int(p)) for p in episode_pos]
        lengths = np.array([len(r["frame_index"]) for r in rows], dtype=np.int64)
        # Rows each sample reads, (B, T) per key with a window; keys without one read the sample's own row.
        windows = {key: query_indices(frame, lengths, delta) for key, delta in spec.delta_index.items()}
        own_row = frame[:, None]
        groups = _episode_groups(episode_pos)
        values: dict[str, Any] = {}
        for key in (*spec.tabular_keys, *(k for k in INDEX_COLUMNS if k not in spec.tabular_keys)):
            values[key] = _gather_rows(rows, groups, key, windows[key][0] if key in windows else frame)
        for key, (_, is_pad) in windows.items():
            values[f"{key}{PAD_SUFFIX}"] = is_pad
        # Random augmentation parameters: per draw stream, keyed by (rank, epoch, position) of each sample.
        draws: dict[str, dict[str, np.ndarray]] = {}
        draw_keys = np.empty((0, 3), dtype=np.int64)
        crop_frame = spec.augment.resize if spec.augment is not None else None  # the frame a random crop cuts
        if any(f.kind is FieldKind.AUGMENT_DRAW for f in self.fields):
            if positions is None or len(positions) != len(frame):
                got = "none" if positions is None else len(positions)
                raise ValueError(
                    f"spec.augment draws random parameters keyed by each sample's position in the stream: "
                    f"assemble() needs positions for all {len(frame)} samples, got {got}"
                )
            # (an epoch re-sharded on resume counts on from its old ranks' positions: SampleOrder.key_offset)
            keys = np.asarray(positions) + spec.order.key_offset(epoch)
            draw_keys = np.stack([np.full(len(frame), spec.rank), np.full(len(frame), epoch), keys], axis=1)
            draw_keys = draw_keys.astype(np.int64)
        out: list[Any] = []
        for field in self.fields:
            if field.kind is FieldKind.TABULAR:
                out.append(lerobot_dtype(values[field.name]))
                continue
            if field.kind is FieldKind.HOST_VALUES:
                out.append(encode_host_values(values[field.name], key=field.name))
                continue
            if field.kind in (FieldKind.CLIP_FRAMES, FieldKind.CLIP_ORDER, FieldKind.CLIP_TAKE,
                              FieldKind.PLANES_CHROMA, FieldKind.PLANES_MATRIX):  # fmt: skip
                continue  # filled with the camera field they follow
            if field.kind is FieldKind.AUGMENT_DRAW:
                if field.stream not in draws:
                    draws[field.stream] = draw_params(
                        spec.augment, seed=spec.seed, stream=field.stream, keys=draw_keys, frame_size=crop_frame
                    )
                out.append(draws[field.stream][field.param])
                continue
            camera_rows = windows[field.name][0] if field.name in windows else own_row
            if field.name in spec.image_keys:
                out.append(self._image_frames(field.name, episode_pos, camera_rows))
                continue
            try:  # (looking the files up opens them: a missing or unreadable one raises here already)
                requests = self._video_requests(field.name, episode_pos, groups, rows, camera_rows)
                if field.kind is FieldKind.DEPTH:
                    out.append(self._depth(field.name, requests))
                elif field.kind is FieldKind.FRAMES:
                    out.append(self._decoded(requests, spec.camera_feeds[field.name].worker_size))
                elif field.kind is FieldKind.PLANES_LUMA:
                    planes = self._decoded_planes(requests)
                    out += [[p.luma for p in planes], [p.chroma for p in planes], [p.matrix for p in planes]]
                elif spec.camera_feeds[field.name].share_clips:
                    out += self._shared_clips(requests)
                else:
                    clips, indices = self._clips(requests)
                    if _decodes_distinct(spec, field.name):
                        out += [clips, *_distinct_frames(indices)]
                    else:
                        out += [clips, indices]
            except (VideoDecodeError, MissingDataFileError) as e:  # they name the file; say whose frames they were
                changed = spec.reader.changed_on_server(self._video_ref(int(p), field.name).path for p in episode_pos)
                episodes = sorted({int(spec.reader.episodes.episode_index[p]) for p in episode_pos})
                raise changed or type(e)(f"camera {field.name!r}, batch of episodes {episodes}: {e}") from e
        return tuple(out)

    def _episode_rows(self, episode_pos: int) -> dict[str, np.ndarray]:
        cached = self._rows.get(episode_pos)
        if cached is not None:
            self._rows.move_to_end(episode_pos)
            return cached
        with io_stats.timed("rows_s"):
            try:
                rows = self.spec.reader.read_episode(episode_pos, self.spec.tabular_keys)
            except (MissingDataFileError, DataFileError, SchemaMismatchError) as e:  # they name the file (a column of
                # another shape or type: the key too); say whose rows they were, a file holding several episodes
                changed = self.spec.reader.changed_on_server([self.spec.reader.data_path(episode_pos)])
                episode = int(self.spec.reader.episodes.episode_index[episode_pos])
                raise changed or type(e)(f"episode {episode}'s rows: {e}") from e  # (its type; its cause's status)
        if self.spec.listed_scalars is not None:
            rows = _scalar_layout(rows, self.spec.reader.info.features, self.spec.listed_scalars)
        self._rows[episode_pos] = rows
        while len(self._rows) > self._rows_kept:
            self._rows.popitem(last=False)
        return rows

    def _video_requests(
        self,
        camera: str,
        episode_pos: np.ndarray,
        groups: list[np.ndarray],
        rows: list[dict[str, np.ndarray]],
        camera_rows: np.ndarray,
    ) -> list[Request]:
        """Per sample: (video path, packet index, display frame numbers of the rows it shows).

        Looked up per file of the batch, not per sample: each episode's video ref once (``groups``:
        :func:`_episode_groups`), each file's index once per batch (a local file's cache key is a fresh ``stat``, so a
        file changed since the last batch is indexed again), and the frame numbers of all rows of its episodes in one
        lookup (:func:`~.frame_lookup.file_frame_numbers`).
        """
        spec = self.spec
        reader = spec.reader
        expected = spec.camera_formats.get(camera)
        indexes: dict[str, PacketIndex] = {}  # this batch's, per file (a v3.0 file holds many episodes)
        by_file: dict[str, list[tuple[np.ndarray, int, VideoRef]]] = {}  # (samples, episode_pos, video) per episode
        for members in groups:
            pos = int(episode_pos[members[0]])
            video = self._video_ref(pos, camera)
            if video.path not in indexes:
                index = indexes[video.path] = self._indexes.of_video(reader, video, store=spec.index_store)
                if expected is not None:
                    episode = int(reader.episodes.episode_index[pos])
                    expected.check(index, path=video.path, episode=episode, camera=camera)
            by_file.setdefault(video.path, []).append((members, pos, video))
        out: list[Request | None] = [None] * len(episode_pos)  # (groups hold every sample once)
        for path, episodes in by_file.items():
            index = indexes[path]
            wanted = [camera_rows[members] for members, _, _ in episodes]  # (samples, T) rows per episode
            numbers = file_frame_numbers(
                reader,
                camera,
                index,
                [(pos, rows[m[0]], w.reshape(-1), video) for (m, pos, video), w in zip(episodes, wanted, strict=True)],
                timestamp_source=spec.timestamp_source,
                tolerance_s=spec.tolerance_s,
            )
            for (members, _, _), found, rows_of in zip(episodes, numbers, wanted, strict=True):
                for i, sample_numbers in zip(members.tolist(), found.reshape(rows_of.shape), strict=True):
                    out[i] = (path, index, sample_numbers)
        return [request for request in out if request is not None]

    def _image_frames(self, camera: str, episode_pos: np.ndarray, camera_rows: np.ndarray) -> list[np.ndarray]:
        """Per sample: the decoded images of its window's rows, (T, H, W, C) uint8, or for a depth camera
        (T, H, W, 1) float32 depth in ``spec.depth_unit``."""
        reader, spec = self.spec.reader, self.spec
        depth = camera in spec.depth_image_units
        frames = []
        for pos, row_indices in zip(episode_pos, camera_rows, strict=True):
            with io_stats.timed("rows_s"):
                images = self._images.get(int(pos), camera)
            label = image_label(reader, int(pos), camera)
            encoded = [images[int(r)].as_py() for r in row_indices]
            with io_stats.timed("decode_s"):
                window = (decode_depth_images if depth else decode_images)(encoded, label=label, rows=row_indices)
            expected = spec.image_shapes.get(camera)
            if expected is not None and window.shape[1:] != expected:
                raise DataFileError(
                    f"{label}: images are {_shape_text(window.shape[1:])} but the camera's first image is "
                    f"{_shape_text(expected)}; a camera's images share one size and channel count (a batch is one "
                    "tensor): rewrite this episode's images"
                )
            frames.append(in_unit(window, spec.depth_image_units[camera], spec.depth_unit) if depth else window)
        return frames

    def _decoded(self, requests: list[Request], size: tuple[int, int] | None) -> list[np.ndarray]:
        """RGB frames per request, resized to ``size`` by the worker when given."""
        return self._decode_each(requests, size=size, pixels="rgb")

    def _decoded_planes(self, requests: list[Request]) -> list[PlaneFrames]:
        """The decoder's planes per request, for the graph to convert (``PLANES_*`` fields)."""
        return self._decode_each(requests, size=None, pixels="planes")

    def _depth(self, camera: str, requests: list[Request]) -> list[np.ndarray]:
        """A depth camera's depth per request, (T, H, W, 1) float32 in ``spec.depth_unit`` (``DEPTH`` field)."""
        quantizer = self.spec.depth_quantizers[camera]
        codes = self._decode_each(requests, size=None, pixels="depth")
        with io_stats.timed("decode_s"):
            return [quantizer.dequantize(c, self.spec.depth_unit)[..., None] for c in codes]

    def _decode_each(self, requests: list[Request], *, size: tuple[int, int] | None, pixels: Pixels) -> list[Any]:
        """Frames per request, the requests of one file decoded together: a GOP several samples need decodes
        once, not once per sample, which with long GOPs (250 frames in ``r1``, ``gr00t``) is most of the work.

        A local file's requests go to the decoder together (:meth:`CpuFrameDecoder.decode_each`), which pays one
        plan, seek and lookup per file and GOP run (-11% per batch at 96x128). Remote requests read their packets
        per request: those are grouped by the GOP they start in. Local or remote is each file's own (a union's
        datasets may be some local, some remote).
        """
        listed = list(requests)
        groups: dict[tuple[str, int], list[int]] = {}
        for i, (path, index, numbers) in enumerate(listed):
            local = _is_local(self.spec.reader.filesystem_of(path))
            groups.setdefault((path, -1 if local else index.start_keyframe(numbers)), []).append(i)
        out: list[Any] = [None] * len(listed)
        for (path, start), members in groups.items():
            index = listed[members[0]][1]
            if len(members) == 1:
                out[members[0]] = self._decode_request(path, index, listed[members[0]][2], size=size, pixels=pixels)
            elif start == -1:  # (a local file's)
                with io_stats.timed("decode_s"):
                    fs = self.spec.reader.filesystem_of(path)
                    decoded = self._decoder.decode_each(
                        path, index, [listed[i][2] for i in members], filesystem=fs, size=size, pixels=pixels
                    )
                for i, frames in zip(members, decoded, strict=True):
                    out[i] = frames
            else:
                union = np.unique(np.concatenate([listed[i][2] for i in members]))
                decoded_union = self._decode_request(path, index, union, size=size, pixels=pixels)
                for i in members:
                    out[i] = decoded_union[np.searchsorted(union, listed[i][2])]
        return out

    def _decode_request(
        self, path: str, index: PacketIndex, numbers: np.ndarray, *, size: tuple[int, int] | None, pixels: Pixels
    ) -> Any:
        """RGB frames (or planes, or depth codes) of display frames ``numbers`` of one file."""
        fs = self.spec.reader.filesystem_of(path)
        decoder = self._decoder
        if _is_local(fs):
            with io_stats.timed("decode_s"):
                return decoder.decode(path, index, numbers, filesystem=fs, size=size, pixels=pixels)
        # Remote files: FFmpeg would read the container header and then 32 KB at a time over the network.
        # MP4 packets are read by exact byte range instead (what the prefetch cache holds) and decoded
        # straight from memory; other containers are demuxed into a clip first.
        if index.byte_exact:
            with io_stats.timed("clip_s"):
                plan = plan_clip(index, numbers)
                payloads = read_packet_payloads(path, index, plan, filesystem=fs)
            with io_stats.timed("decode_s"):
                return decoder.decode_packets(index, plan, payloads, size=size, pixels=pixels)
        with io_stats.timed("clip_s"):
            clip = build_clip(path, index, numbers, filesystem=fs)
        with io_stats.timed("decode_s"):
            data = io.BytesIO(clip.data.tobytes())
            return decoder.decode(data, build_packet_index(data), clip.relative_indices, size=size, pixels=pixels)

    def _clips(self, requests: list[Request]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """One clip per request and the clip-relative indices of its frames (:meth:`_planned_clips`)."""
        clips, plans = self._planned_clips(requests)
        return clips, [plan.relative_indices for plan in plans]  # (int32 already)

    def _planned_clips(self, requests: list[Request]) -> tuple[list[np.ndarray], list[ClipPlan]]:
        """One clip per request (what :func:`~.clips.build_clip` makes of each), built in passes: every plan of the
        batch, then per file and run of clips holding up to :data:`CLIP_PASS_BYTES` of packets, every read, then
        every remux. Plan, read and remux per clip, their NumPy and FFmpeg steps taking turns, cost 1.4x the CPU for
        clips of a few KB; over a whole batch of 15 MB of packets (GOPs of 250 frames) the passes cost 1.3x instead.

        An MP4 is opened once per batch and its handle lent to each of its clips (ranged reads from any offset);
        opening it per clip was 22% of a VP9 batch's CPU work. Other containers are demuxed from their start, so each
        clip opens its own."""
        listed = list(requests)
        by_file: dict[str, list[int]] = {}
        for i, (path, _, _) in enumerate(listed):
            by_file.setdefault(path, []).append(i)
        clips: list[np.ndarray] = [np.empty(0, np.uint8)] * len(listed)
        with io_stats.timed("clip_s"):  # (once per batch: a timer per clip was ~3 us of its ~140)
            plans = [plan_clip(index, numbers) for _, index, numbers in listed]
            for path, members in by_file.items():
                fs = self.spec.reader.filesystem_of(path)
                first = listed[members[0]][1]  # (its size spares a remote open's HEAD; its clips read exact ranges)
                opened = (
                    open_video_source(path, filesystem=fs, size=first.file_size_bytes, exact_reads=True)
                    if first.byte_exact
                    else None
                )
                with opened or contextlib.nullcontext(path) as source:
                    for run in _clip_runs(members, [plans[i].payload_bytes(listed[i][1]) for i in members]):
                        payloads = [read_packet_payloads(source, listed[i][1], plans[i], filesystem=fs) for i in run]
                        for i, packets in zip(run, payloads, strict=True):
                            index = listed[i][1]
                            plans[i], packets = joined_for_one_pass(source, index, plans[i], packets, filesystem=fs)
                            clips[i] = remux_clip(index, plans[i], packets)
        return clips, plans

    def _shared_clips(self, requests: list[Request]) -> list[Any]:
        """The CLIP, CLIP_FRAMES, CLIP_ORDER and CLIP_TAKE outputs of a camera whose samples share clips: one clip
        per group (:func:`~.clip_sharing.share_clips`), sent with its first sample, the others sending none."""
        numbers = [wanted for _, _, wanted in requests]
        share = share_clips(
            [path for path, _, _ in requests], [index for _, index, _ in requests], numbers,
            max_frames=SHARED_CLIP_FRAMES, alone_files=self._unshared_files,
        )  # fmt: skip
        firsts = [members[0] for members in share.groups]
        clips, plans = self._planned_clips([(requests[s][0], requests[s][1], frames) for s, frames in
                                            zip(firsts, share.frames, strict=True)])  # fmt: skip
        out_clips = [np.empty(0, np.uint8)] * len(requests)
        out_indices = [np.empty(0, np.int32)] * len(requests)
        for s, clip, plan, alone in zip(firsts, clips, plans, share.alone_frames, strict=True):
            out_clips[s], out_indices[s] = clip, plan.relative_indices
            if alone and plan.frame_count > alone and requests[s][0] not in self._unshared_files:
                # Runs joined at open-GOP keyframes its packets showed (joined_for_one_pass): the shared clip grew
                # past its samples' own. Right frames, more decoding: this file's samples decode alone from now on.
                self._unshared_files.add(requests[s][0])
                logger.debug("%s: open-GOP keyframes join a shared clip's runs; its samples decode alone",
                             requests[s][0])  # fmt: skip
        return [out_clips, out_indices, share.orders(numbers), share.takes(len(requests))]


def _clip_runs(members: list[int], payload_bytes: list[int]) -> list[list[int]]:
    """``members`` in runs of consecutive clips whose packets add up to at most :data:`CLIP_PASS_BYTES` (a larger
    clip alone)."""
    runs: list[list[int]] = []
    held = 0
    for member, size in zip(members, payload_bytes, strict=True):
        if not runs or held + size > CLIP_PASS_BYTES:
            runs.append([])
            held = 0
        runs[-1].append(member)
        held += size
    return runs


def _distinct_frames(indices: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per clip, its distinct frames (ascending) and each window frame's place among them, int32: what
    ``np.unique(i, return_inverse=True)`` gives per clip, for a batch's clips (one window length) at once. Per clip,
    that was ~8 us of a clip's ~150 us of CPU work."""
    stacked = np.stack(indices)  # (clips, T)
    order = np.argsort(stacked, axis=1, kind="stable")
    ascending = np.take_along_axis(stacked, order, axis=1)
    first = np.ones(ascending.shape, dtype=bool)  # a value's first place in its clip's ascending frames
    np.not_equal(ascending[:, 1:], ascending[:, :-1], out=first[:, 1:])
    places = np.empty(ascending.shape, dtype=np.int32)
    np.put_along_axis(places, order, np.cumsum(first, axis=1, dtype=np.int32) - 1, axis=1)
    values, bounds = ascending[first], [0, *np.cumsum(first.sum(axis=1)).tolist()]
    distinct = [values[start:stop] for start, stop in itertools.pairwise(bounds)]  # (np.split's views, ~3x faster)
    return distinct, list(places)


def _episode_groups(episode_pos: np.ndarray) -> list[np.ndarray]:
    """The batch's samples by episode: one array of sample positions (ascending) per distinct episode, in order of
    each episode's first sample."""
    # One stable sort, cut where the episode changes (np.unique's inverse and counts, and np.split, were ~4x the time).
    if len(episode_pos) == 0:
        return []
    order = np.argsort(episode_pos, kind="stable")
    ordered = episode_pos[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    by_episode = [order[start:stop] for start, stop in itertools.pairwise([*starts.tolist(), len(order)])]
    return [by_episode[e] for e in np.argsort(order[starts]).tolist()]  # (the firsts are distinct: no ties)


def _gather_rows(
    rows: list[dict[str, np.ndarray]], groups: list[np.ndarray], key: str, row_indices: np.ndarray
) -> np.ndarray:
    """``key``'s values at ``row_indices`` (``(B,)`` or ``(B, T)``, episode-local rows of each sample's episode):
    one fancy index per episode of the batch (``groups``), what stacking each sample's rows gave, dtype included.
    """
    columns = [rows[members[0]][key] for members in groups]
    if len(groups) == 1:
        return columns[0][row_indices]
    out = np.empty(row_indices.shape + columns[0].shape[1:], dtype=np.result_type(*columns))
    for column, members in zip(columns, groups, strict=True):
        out[members] = column[row_indices[members]]
    return out


def _scalar_layout(
    rows: dict[str, np.ndarray], features: Mapping[str, Feature], listed: frozenset[str]
) -> dict[str, np.ndarray]:
    """``rows`` with each scalar feature's values (n,), or (n, 1) for those in ``listed``, however its file stores
    them (:attr:`SourceSpec.listed_scalars`). The index columns are scalars of every dataset, declared in
    ``features`` or not: a union's features are its first dataset's, and one lacking ``frame_index`` (derived, (n,))
    left another's stored as one-element lists (n, 1), which the pipeline refused mid-epoch."""
    out = dict(rows)
    for key, values in rows.items():
        feature = features.get(key)
        if key in INDEX_COLUMNS or (feature is not None and feature.is_scalar and not feature.is_host_value):
            out[key] = values.reshape((len(values), 1) if key in listed else (len(values),))
    return out


def _with_notes(error: BaseException) -> str:
    """``str(error)`` and its notes: a remote read that gave up notes its file there (``remote_retry``), and
    some errors have no message of their own (fsspec's timeout), so without the notes nothing names the file."""
    notes = [note for note in getattr(error, "__notes__", ()) if isinstance(note, str)]
    return "; ".join([str(error) or "(no message)", *notes])
