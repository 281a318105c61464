"""CPU fallback: decode requested frames in the external-source worker, for codecs the GPU cannot decode.

Runs where NVDEC lacks the codec (AV1 on A100/H100/H200) or there is no GPU and DALI's CPU decoder lacks
it (H.264, HEVC, AV1). Frames are found by presentation timestamp from the packet index, so the result is
the same frame a full sequential decode gives at that pts. Open decoders are kept in a small LRU per
process and opened lazily: a decoder inherited through fork shares FFmpeg state and file offsets with its
parent, so a process never uses one it did not open itself.

:class:`CpuFrameDecoder` keeps that LRU and picks each file's reader (:mod:`.packet_file_reader` for a local MP4 on
PyAV, :mod:`.pyav_reader` for other files, :mod:`.torchcodec_reader`; :mod:`.packet_decoder` for a remote MP4's
packets read by byte range). Apart from it: the options (:mod:`.cpu_decode_options`), which
decoders this machine has (:mod:`.cpu_backends`), the checks of every decoded frame (:mod:`.frame_checks`) and what a
frame becomes (:mod:`.frame_pixels`: RGB, resized to ``size`` in CPU mode; the decoder's planes, which the graph
converts where the pipeline runs on a GPU, as :class:`ColorConversion` says; a depth camera's codes). Callers import
the options, the backend checks, the damaged-frame checks and the pixel names from here too (``__all__``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, cast

import av
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from numpy.typing import ArrayLike

from . import open_files
from .clips import ClipPlan, check_request, plan_clip
from .cpu_backends import (
    TORCHCODEC_NOT_INSTALLED,
    cpu_decoders,
    pyav_can_decode,
    require_pyav_decoder,
    torchcodec_available,
    torchcodec_unavailable,
)
from .cpu_decode_options import (
    DEMUXER_BYTES_PER_PACKET,
    MIN_OPEN_DECODERS,
    ColorConversion,
    CpuDecodeOptions,
    CpuDecoderBackend,
    checked_cpu_decode,
    decoder_bytes,
)
from .distributed import usable_cpus
from .frame_checks import damaged_frame_error, is_damaged
from .frame_pixels import (
    WORKER_RESIZE_INTERPOLATION,
    Pixels,
    checked_size,
    frame_conversion,
    stacked_each,
    stacked_frames,
)
from .packet_decoder import PacketDecoder
from .packet_file_reader import PacketFileReader
from .packet_index import PacketIndex
from .pyav_reader import PyAvReader
from .said_once import say_once, warn_once
from .torchcodec_reader import MisplacedFrames, TorchCodecReader
from .value_checks import check_choice
from .video_source import VideoSource, local_video_path, source_cache_key, source_label

__all__ = [
    "WORKER_RESIZE_INTERPOLATION",
    "ColorConversion",
    "CpuDecodeOptions",
    "CpuDecoderBackend",
    "CpuFrameDecoder",
    "Pixels",
    "cpu_decoders",
    "damaged_frame_error",
    "is_damaged",
    "pyav_can_decode",
    "torchcodec_available",
    "torchcodec_unavailable",
]

logger = logging.getLogger(__name__)

#: Open files kept per process when the options leave it (``max_open_decoders=None``) and no pool says more.
DEFAULT_OPEN_DECODERS = 64
#: What an open remote file adds to its decoder: fsspec's read-ahead block (5 MiB for HTTP), with margin.
REMOTE_HANDLE_BYTES = 8 * 2**20


@functools.cache
def _note_torchcodec_skipped(why_not: str) -> None:
    """Once per job on a host: a torchcodec that is installed but cannot decode is passed over for PyAV."""
    if why_not != TORCHCODEC_NOT_INSTALLED:
        say_once(logger, logging.INFO, "CPU decode uses PyAV: %s.", why_not)


def _why_misplaced(index: PacketIndex) -> str:
    """What likely made torchcodec hand over other frames than those asked for in this file (:class:`MisplacedFrames`).

    An open GOP's leading pictures are decoded from the GOP before its keyframe; an edit list that hides that GOP's
    keyframe (a start cut by stream copy) is not reached by torchcodec's seek (0.17: it handed over the next frame)."""
    if index.hidden is not None and index.has_leading_pictures:
        return "its edit list hides the keyframes of GOPs that open GOPs' leading pictures are decoded from"
    return "keyframes flagged where decoding cannot start: intra refresh?"


def _is_path(source: VideoSource) -> bool:
    return isinstance(source, (str, os.PathLike))


_Reader = PyAvReader | TorchCodecReader | PacketDecoder | PacketFileReader


class CpuFrameDecoder:
    """Decode display frames of video files on the CPU, keeping a bounded LRU of open decoders per process.

    Safe to create before workers fork or to pickle into spawned workers: each process opens its own
    decoders on first use and drops (never uses) any it inherited. ``AUTO`` is resolved at first use: looking
    for torchcodec imports torch (about a second and 150 MB), which a worker whose cameras DALI decodes never needs.
    """

    def __init__(self, *, options: CpuDecodeOptions | None = None, files_in_use: int = 0) -> None:
        # (a string or a dict failed in a bare AttributeError, "'str' object has no attribute 'max_open_decoders'")
        self.options = checked_cpu_decode(options, name="options")
        #: Files the caller's requests cycle through (a worker: its episode pool's, per camera): kept open when
        #: the options leave the bound to it (``max_open_decoders=None``), memory permitting.
        self.files_in_use = files_in_use
        # key -> (open decoder, its estimated memory), least recently used first
        self._readers: OrderedDict[Hashable, tuple[_Reader, int]] = OrderedDict()
        #: Their estimated memory in all, kept as they come and go (summed afresh per eviction, it cost O(open
        #: files) per reopen: 37 us at 250 open, more than a 64x96 frame's decode share).
        self._open_bytes = 0
        self._pid = os.getpid()
        self._backend: CpuDecoderBackend | None = None
        #: Files torchcodec misread (:class:`MisplacedFrames`), by source key: PyAV decodes them.
        self._pyav_files: set[Hashable] = set()
        _check_max_open(self.options.max_open_decoders)

    def _resolve_backend(self) -> CpuDecoderBackend:
        backend = check_choice(CpuDecoderBackend, "backend", self.options.backend)  # (a member once built)
        if backend is not CpuDecoderBackend.AUTO:
            return backend
        why_not = torchcodec_unavailable()
        if why_not is None:
            return CpuDecoderBackend.TORCHCODEC
        _note_torchcodec_skipped(why_not)
        return CpuDecoderBackend.PYAV

    @property
    def open_decoders(self) -> int:
        """Decoders this process holds open (inherited ones do not count: they are never used)."""
        self._drop_inherited()
        return len(self._readers)

    @property
    def max_open(self) -> int:
        """The open files kept at most (besides the memory budget): the options', else 64 or the files in use,
        within the decoders' share of the process's open-file limit (:mod:`.open_files`): half, shared with the
        process's other decoders (a mixture without workers has one per dataset). 0: the others hold it all
        (the file opened now is closed after use)."""
        wanted = self.options.max_open_decoders
        if wanted is None:
            wanted = max(DEFAULT_OPEN_DECODERS, self.files_in_use)
        return min(wanted, open_files.DECODERS.files_for(self))

    @property
    def backend(self) -> CpuDecoderBackend:
        """The backend in use (AUTO resolved)."""
        if self._backend is None:
            self._backend = self._resolve_backend()
        return self._backend

    def decode(
        self,
        source: VideoSource,
        index: PacketIndex,
        frame_indices: ArrayLike,
        *,
        filesystem: Any | None = None,
        size: tuple[int, int] | None = None,
        pixels: Pixels = "rgb",
    ) -> Any:
        """Display frames ``frame_indices`` of ``source`` (request order, repeats allowed), as ``pixels`` says.

        ``"rgb"``: ``(N, H, W, 3)`` uint8, resized to ``size`` (H, W) while decoding (None: the video's size).
        ``"planes"``: the decoder's planes, for the graph to convert (:mod:`.yuv_frames`). ``"depth"``: a depth
        camera's 12-bit codes ``(N, H, W)`` uint16 (:mod:`.depth_maps`). Planes and depth always come from
        PyAV (torchcodec hands over RGB only; LeRobot reads depth with PyAV). ``index`` is the packet index of
        ``source``. Raises FrameRequestError for an empty or out-of-range request, MissingDataFileError,
        VideoDecodeError or CodecUnsupportedError naming the file. A one-frame RGB or depth request's array is the
        converted frame's own memory, not a copy (in :meth:`decode_each`, shared by requests of that one frame).
        """
        frames = self._frames(source, index, frame_indices, filesystem=filesystem, size=size, pixels=pixels)
        return stacked_frames(frames, pixels, label=index.source_name)

    def verify(
        self, source: VideoSource, index: PacketIndex, frame_indices: ArrayLike, *, filesystem: Any = None
    ) -> int:
        """Decode display frames ``frame_indices`` of ``source`` with PyAV and keep none: whether they decode,
        raising as :meth:`decode` does where they do not (damage FFmpeg flags included), with no memory for
        frames, however many. Returns how many distinct frames were decoded.

        Each GOP's frames are decoded from its keyframe by a decoder reset there, as a shuffled pass's requests
        enter it: one run through the GOPs conceals damage that such an entry meets (a keyframe whose first bytes
        are damaged: dav1d decodes it after the GOP before, refuses it after a reset). Costs up to twice one run.
        """
        frames = np.unique(check_request(index, frame_indices))
        gops = index.keyframe_slots(index.display_order[frames])
        decoded = 0
        for gop in np.unique(gops).tolist():
            pts = self._frames(source, index, frames[gops == gop], filesystem=filesystem, size=None, pixels=None)
            decoded += len(set(pts))
        return decoded

    def decode_each(
        self,
        source: VideoSource,
        index: PacketIndex,
        requests: Sequence[ArrayLike],
        *,
        filesystem: Any | None = None,
        size: tuple[int, int] | None = None,
        pixels: Pixels = "rgb",
    ) -> list[Any]:
        """:meth:`decode` of several requests of one file: their frames decode once, as one request, and each
        request's frames are copied once, none for one RGB frame (stacking the union first and indexing it cost
        two more, +27% at 640x480); RGB windows land in one array, a slice each
        (:func:`~.frame_pixels.stacked_each`). With closed GOPs the clip plan starts a segment at each needed
        keyframe, so the union decodes no more than its parts; open GOPs (leading pictures) would make it one
        unbroken run from the first frame to the last (354 packets for three two-frame requests, against 17), so
        there each GOP's requests go together."""
        arrays = [check_request(index, r) for r in requests]
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(arrays):
            # Open GOPs: where this request's plan starts (a leading picture's starts a GOP early).
            start = plan_clip(index, r).segments[0][0] if index.has_leading_pictures else -1
            groups.setdefault(start, []).append(i)
        out: list[Any] = [None] * len(arrays)
        for members in groups.values():
            union = np.unique(np.concatenate([arrays[i] for i in members]))
            frames = self._frames(source, index, union, filesystem=filesystem, size=size, pixels=pixels)
            rows = [np.searchsorted(union, arrays[i]).tolist() for i in members]
            for i, stacked in zip(members, stacked_each(frames, rows, pixels, label=index.source_name), strict=True):
                out[i] = stacked
        return out

    def decode_packets(
        self,
        index: PacketIndex,
        plan: ClipPlan,
        payloads: list[bytes],
        *,
        size: tuple[int, int] | None = None,
        pixels: Pixels = "rgb",
    ) -> Any:
        """:meth:`decode` of the frames at ``plan.relative_indices``, decoded from the planned packets alone.

        For remote MP4s: the payloads are exact ranged reads (what the prefetch cache serves), and feeding
        them to a decoder opened from ``index.template`` skips the remux and the demux a clip would cost, and
        every container read beyond the packets. The decoder is kept per file like an open file's, so a
        request costs no template probe and no decoder set-up. PyAV decodes whatever the backend (torchcodec
        takes files, not packets). Raises VideoDecodeError naming the file when the packets do not decode.
        """
        by_rank = self._packet_frames(index, plan, payloads, frame_conversion(pixels, size))
        frames = [by_rank[int(rank)] for rank in plan.relative_indices]
        return stacked_frames(frames, pixels, label=index.source_name)

    def _packet_frames(
        self, index: PacketIndex, plan: ClipPlan, payloads: list[bytes], convert: Callable[[av.VideoFrame], Any]
    ) -> dict[int, Any]:
        self._drop_inherited()
        self._trim_as_asked()
        key = ("packets", index.template, os.getpid())
        decoder = cast("PacketDecoder | None", self._reader(key))
        kept = True
        if decoder is None:
            decoder = PacketDecoder(index, threads=self.options.threads_per_decoder)
            kept = self._remember(key, decoder, index)
        else:
            self._readers.move_to_end(key)
        try:
            return decoder.frames_at(index, plan, payloads, convert)
        except Exception:
            self._forget(key)
            kept = False
            raise
        finally:
            if not kept:
                decoder.close()

    def _frames(
        self,
        source: VideoSource,
        index: PacketIndex,
        frame_indices: ArrayLike,
        *,
        filesystem: Any | None,
        size: tuple[int, int] | None,
        pixels: Pixels | None,
        backend: CpuDecoderBackend | None = None,
    ) -> list[Any]:
        """Each requested frame, converted as ``pixels`` says (None: its pts, the frame dropped at once).

        ``backend`` overrides the choice (PyAV for a file torchcodec misread)."""
        if pixels == "planes" and self.options.backend is CpuDecoderBackend.TORCHCODEC:
            raise ValueError("pixels='planes' needs PyAV; this decoder's options ask for torchcodec")
        convert = frame_conversion(pixels, size)
        size = None if size is None else checked_size(size)
        requested = np.asarray(frame_indices)
        plan = plan_clip(index, requested)  # validates the request before any file is opened
        requested = requested.astype(np.int64)
        self._drop_inherited()
        self._trim_as_asked()
        source_key = source_cache_key(source, filesystem=filesystem) if _is_path(source) else None
        if backend is None:
            backend = self.backend if pixels == "rgb" and source_key not in self._pyav_files else CpuDecoderBackend.PYAV
        if backend is CpuDecoderBackend.PYAV:
            require_pyav_decoder(index)
        # A lent file object may be closed by its owner, so its decoder is never kept.
        key = (source_key, backend, os.getpid()) if source_key is not None else None
        reader = self._reader(key) if key is not None else None
        kept = reader is not None
        if reader is None:
            threads, label = self.options.threads_per_decoder, source_label(source)
            # A local MP4 needs no demuxer: its index holds every packet's bytes (:mod:`.packet_file_reader`).
            path = local_video_path(source, filesystem=filesystem) if index.byte_exact else None
            if backend is CpuDecoderBackend.PYAV and path is not None:
                reader = PacketFileReader(path, index, threads=threads, label=label)
            elif backend is CpuDecoderBackend.PYAV:
                reader = PyAvReader(source, filesystem=filesystem, threads=threads, label=label)
            else:
                reader = TorchCodecReader(
                    source, filesystem=filesystem, threads=threads, label=label, stream_index=index.stream_index
                )
            if key is not None:
                kept = self._remember(key, reader, index, handle_bytes=_handle_bytes(reader, index, filesystem))
        else:  # (a kept reader: found under its key)
            self._readers.move_to_end(key)
        try:
            if isinstance(reader, PyAvReader):
                by_pts = reader.frames_at(index, plan, requested, convert)
            elif isinstance(reader, PacketFileReader):
                by_pts = reader.frames_at(index, requested, convert)
            else:
                by_pts = cast(TorchCodecReader, reader).frames_at(index, requested, size)
        except MisplacedFrames as e:
            if key is not None:
                self._forget(key)
            reader.close()
            require_pyav_decoder(index)  # (else the file's codec has no CPU decoder here but torchcodec's)
            warn_once(logger, "%s: torchcodec %s (%s); decoding this file with PyAV", index.source_name, e,
                      _why_misplaced(index))  # fmt: skip
            if source_key is not None:
                self._pyav_files.add(source_key)
            return self._frames(
                source,
                index,
                requested,
                filesystem=filesystem,
                size=size,
                pixels=pixels,
                backend=CpuDecoderBackend.PYAV,
            )
        except Exception:
            if key is not None:
                self._forget(key)
            reader.close()
            raise
        if not kept:
            reader.close()
        return [by_pts[int(p)] for p in index.pts_of_frames(requested).tolist()]

    def _forget(self, key: Hashable) -> None:
        """Drop ``key``'s decoder from the open ones, if there (the caller closes it)."""
        entry = self._readers.pop(key, None)
        if entry is not None:
            self._open_bytes -= entry[1]

    def _reader(self, key: Hashable) -> _Reader | None:
        entry = self._readers.get(key)
        return None if entry is None else entry[0]

    def _remember(self, key: Hashable, reader: _Reader, index: PacketIndex, *, handle_bytes: int = 0) -> bool:
        """Keep ``reader`` open under ``key`` within the bounds, closing the least recently used; False where the
        other decoders hold the whole share: the caller closes it after use."""
        limit = self.max_open
        if not limit:
            self._trim(0)
            return False
        threads = self.options.threads_per_decoder or _ffmpeg_auto_threads()
        self._forget(key)
        size = decoder_bytes(index.width, index.height, threads) + handle_bytes
        self._readers[key] = (reader, size)
        self._open_bytes += size
        budget = self.options.max_decoder_memory_bytes
        while len(self._readers) > limit or (len(self._readers) > MIN_OPEN_DECODERS and self._open_bytes > budget):
            if len(self._readers) > limit and limit < self.files_in_use and self.options.max_open_decoders is None:
                warn_once(
                    logger,
                    "CPU decode: up to %d files are in use (episode pool x cameras) but this process's open-file "
                    "limit (%d) keeps %d open (half of it, shared with the other datasets it decodes), so files "
                    "are reopened as requests move between them (~6 ms each at 640x480); raise it to %d or more "
                    "before starting (ulimit -n), times the datasets it decodes, or lower episode_pool_size",
                    self.files_in_use,
                    open_files.open_files_limit(),
                    limit,
                    2 * self.files_in_use,
                    key="cpu_decode.open_files_limit",
                )
            elif len(self._readers) <= min(limit, self.files_in_use):
                each = self._readers[key][1]
                warn_once(
                    logger,
                    "CPU decode: up to %d files are in use (episode pool x cameras) but %d open decoders of ~%.1f MB "
                    "fit max_decoder_memory_bytes=%d, so files are reopened as requests move between them (~6 ms "
                    "each at 640x480); raise CpuDecodeOptions(max_decoder_memory_bytes=...) (about %d per worker "
                    "holds them all), or lower episode_pool_size",
                    self.files_in_use,
                    len(self._readers) - 1,
                    each / 2**20,
                    budget,
                    self.files_in_use * each,
                    key="cpu_decode.max_decoder_memory_bytes",  # (each worker's numbers its own: said once a job)
                )
            self._evict_oldest()
        open_files.DECODERS.holding(self, len(self._readers))
        return True

    def _trim_as_asked(self) -> None:
        """Give up what another decoder of this process asked for on finding none of the share left
        (:meth:`.FileShare.asked`): one with all its files open opens none, so never trimmed to its split."""
        asked = open_files.DECODERS.asked(self)
        if asked is not None:
            self._trim(asked)

    def _trim(self, files: int) -> None:
        """Close the least recently used down to ``files`` open, and tell the share."""
        while len(self._readers) > files:
            self._evict_oldest()
        open_files.DECODERS.holding(self, len(self._readers))

    def _evict_oldest(self) -> None:
        _, (evicted, evicted_bytes) = self._readers.popitem(last=False)
        self._open_bytes -= evicted_bytes
        evicted.close()

    def _drop_inherited(self) -> None:
        if self._pid != os.getpid():
            # Inherited through fork: the parent still uses these; dropping them without closing keeps
            # the parent's FFmpeg state untouched.
            self._readers = OrderedDict()
            self._open_bytes = 0
            self._pid = os.getpid()

    def close(self) -> None:
        """Close this process's open decoders."""
        self._drop_inherited()
        self._trim(0)
        open_files.DECODERS.leaving(self)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "files_in_use": self.files_in_use}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(options=state["options"], files_in_use=state.get("files_in_use", 0))  # type: ignore[misc]


def _check_max_open(max_open_decoders: int | None) -> None:
    """Say once where the options ask to keep more files open than the decoders' share of the open-file limit: kept,
    they would fail a later open (a data file's, a worker's pipe) with EMFILE hours into training; within the share
    the cost is reopened files, ~6 ms each."""
    share = open_files.open_files_share(open_files.DECODER_SHARE)
    if max_open_decoders is not None and max_open_decoders > share:
        warn_once(
            logger,
            "CPU decode: CpuDecodeOptions(max_open_decoders=%d) is more than half this process's soft limit on open "
            "files (%d), so %d are kept open at most; raise the limit before starting (`ulimit -n %d`) or lower "
            "max_open_decoders",
            max_open_decoders,
            open_files.open_files_limit(),
            share,
            int(max_open_decoders / open_files.DECODER_SHARE),
            key="cpu_decode.max_open_decoders",
        )


def _handle_bytes(reader: _Reader, index: PacketIndex, filesystem: Any | None) -> int:
    """What an open file holds besides its decoder: a container its demuxer's tables (none for a local MP4 read by
    byte range), a remote file fsspec's read-ahead block too."""
    if isinstance(reader, PacketFileReader):
        return 0
    remote = filesystem is not None and not isinstance(filesystem, LocalFileSystem)  # as is_local
    return DEMUXER_BYTES_PER_PACKET * index.frame_count + (REMOTE_HANDLE_BYTES if remote else 0)


def _ffmpeg_auto_threads() -> int:
    """The threads FFmpeg gives a decoder with ``thread_count=0``: the CPUs this process may use, plus one, at
    most 16."""
    return min(16, usable_cpus() + 1)
