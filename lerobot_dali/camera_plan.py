"""Each video camera's decode route, format and feed, planned once when an iterator is built.

Which decoder takes a camera (NVDEC, DALI's CPU decoder, or the CPU workers) follows from its files: their codecs, the
first file's format that every other file is held to, and the GPU. The plan reads those files' headers and packet
indexes, checks that the first rows find their frames, and says how each camera is decoded. It is apart from the
iterator, which keeps only the outcome (:class:`CameraPlanner`'s routes, formats and feeds) for its workers and its
graph, and is left its own life cycle: passes, batches, state, close.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .augment_config import AugmentConfig
from .batch_source import CameraFormat
from .camera_codecs import CameraSurvey, codec_counts, survey_camera, surveyed_positions
from .concurrent_calls import in_threads
from .cpu_backends import pyav_can_decode, torchcodec_unavailable
from .cpu_decode_options import CpuDecodeOptions, CpuDecoderBackend
from .dali_graph import CameraFeed, camera_feed
from .dataset_reader import LeRobotDatasetReader, VideoRef
from .decode_route import DecodePreference, DecodeRoute, route_for_codecs, route_for_video
from .depth_maps import DepthUnit
from .distributed import cpus_per_local_rank
from .errors import CodecUnsupportedError, cameras_hint
from .file_format_store import FileFormatStore
from .file_timing import check_file_timing
from .frame_lookup import TimestampSource, row_frame_numbers
from .packet_index import PacketIndex
from .packet_index_cache import load_episode_packet_index
from .packet_index_store import PacketIndexStore
from .said_once import say_once, warn_once
from .wording import counted
from .yuv_frames import has_color_matrix, nvdec_color_fix

__all__ = ["CameraPlanner", "CameraRouter", "dali_color_fixes", "route_for_survey"]

logger = logging.getLogger(__name__)


def route_for_survey(
    survey: CameraSurvey, route: DecodeRoute, preference: DecodePreference, *, on_gpu: bool
) -> DecodeRoute:
    """``route`` (the camera's first file's), or the workers' where DALI decodes it (NVDEC or its CPU decoder) and
    the camera's files (``survey``) differ in what that decoder holds them to: codec and colour tags (on NVDEC pixel
    format too), :func:`~.decode_route.route_for_codecs`. The iterator's choice, which ``diagnose`` shows."""
    if not route.dali_device:  # (the workers give each file a decoder of its own: only the size has to agree)
        return route
    if survey.first is None or not survey.unlike(CameraFormat.of(survey.first, route=route)):
        return route
    codecs = survey.codecs()
    formats = Counter(str(CameraFormat.of(f, route=route)) for f in survey.formats.values())
    return route_for_codecs(codecs, decode=preference, on_gpu=on_gpu, label=survey.camera,
                            formats=None if len(codecs) > 1 else formats)  # fmt: skip


@dataclass(kw_only=True, eq=False)
class CameraRouter:
    """Each video camera's route, from its files surveyed through the stores an iterator keeps (built here, from the
    reader), and the iterator's build-time checks of it (its first rows find their frames, the workers' decoder loads):
    the part of :class:`CameraPlanner` that ``diagnose`` shares, so the route it shows, and a refusal, are the
    iterator's."""

    reader: LeRobotDatasetReader
    device_id: int | None  # None: the CPU
    #: How rows find their frames and how close they must be (the iterator's options): :meth:`check_rows_find_frames`.
    timestamp_source: TimestampSource
    tolerance_s: float
    cpu_decode: CpuDecodeOptions  # the workers' decoder: :meth:`check_backend`
    #: Per camera, the rows at each episode's end whose frames no sample reads
    #: (:meth:`~.windows.DeltaWindows.unread_tail`): the files' timing is held to the rows read (:mod:`.file_timing`).
    unread_tail: Mapping[str, int] = field(default_factory=dict)
    #: Every video file's packet index, kept on disk (a local one's too, keyed by its stat): a dataset of thousands
    #: of video files outgrows the workers' bounded caches, and each file dropped was demuxed again (92,000 episodes,
    #: 3 cameras, 30,000-frame files: ~60 ms each, ~6 a batch of 8), where loading one takes 1-4 ms.
    index_store: PacketIndexStore = field(init=False)
    #: A remote dataset's (the same store: its files are surveyed from their indexes), else None (a local dataset's
    #: files are surveyed from their headers and need no prefetch).
    remote_index_store: PacketIndexStore | None = field(init=False)
    format_store: FileFormatStore | None = field(init=False)  # a dataset's local files' headers (a union's local ones)
    depth_quantizers: Collection[str] = field(init=False)  # the depth video cameras
    #: Each video camera's files read when it was routed (:meth:`route`), up to the survey's bound.
    surveys: dict[str, CameraSurvey] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.remote_index_store = None if self.reader.location.is_local else PacketIndexStore()
        self.index_store = self.remote_index_store or PacketIndexStore()
        self.format_store = FileFormatStore() if self.reader.holds_local_files() else None
        self.depth_quantizers = self.reader.info.depth_quantizers(self.reader.camera_keys)

    def route(
        self,
        camera: str,
        preference: DecodePreference,
        *,
        others: Sequence[PacketIndex] | None = None,
        since: float | None = None,
    ) -> tuple[VideoRef, PacketIndex, DecodeRoute]:
        """``camera``'s first episode's file, its packet index and the camera's route: from that file (a union's
        camera whose datasets' first files, ``others`` where already read, differ in codec: the workers,
        :func:`~.decode_route.route_for_codecs`); where DALI decodes the camera, the workers too where its other
        files differ from the first (:meth:`_route_for_files`)."""
        if self.device_id is None:
            preference = DecodePreference.CPU
        video, index = self._packet_index(0, camera)
        if others is None:
            others = [self._packet_index(pos, camera)[1] for pos in self._other_firsts()]
        codecs = codec_counts([index, *others])
        if camera in self.depth_quantizers:  # 12-bit codes: NVDEC and DALI's decoders give 8-bit RGB only
            for codec in codecs:
                if not pyav_can_decode(codec):
                    raise CodecUnsupportedError(
                        f"depth camera {camera!r} ({video.path}) is {codec}, which PyAV cannot decode here; "
                        f"leave the camera out with {cameras_hint()}"
                    )
            route = DecodeRoute.CPU_FALLBACK
        elif len(codecs) > 1:
            route = route_for_codecs(codecs, decode=preference, on_gpu=self.device_id is not None, label=camera)
        else:
            route = route_for_video(
                video.path, index, decode=preference, device_id=self.device_id or 0,
                filesystem=self.reader.filesystem_of(video.path), label=camera,
            )  # fmt: skip
        return video, index, self._route_for_files(camera, route, preference, since=since)

    def _other_firsts(self) -> list[int]:
        """A union's other datasets' first episodes, whose files' codecs may differ from the first's (the camera then
        goes to the workers, a decoder per file: NVDEC and DALI's CPU decoder take one codec per camera)."""
        return [pos for pos in self.reader.first_episodes() if pos]

    def _route_for_files(
        self, camera: str, route: DecodeRoute, preference: DecodePreference, *, since: float | None = None
    ) -> DecodeRoute:
        """``route`` for ``camera``, its files surveyed (each one's header, up to a bound: :mod:`~.camera_codecs`),
        whatever decodes it: raises SchemaMismatchError naming the files whose frame size is not the first's (a batch
        is one tensor; before, a worker-decoded camera's odd file failed when a batch first reached it), and
        FrameTimestampError naming those whose rate or end cannot meet their rows (:mod:`.file_timing`). Where DALI
        decodes the camera (NVDEC or its CPU decoder), the workers instead where the files differ in what that
        decoder holds them to: codec (on NVDEC pixel format and colour too), :func:`~.decode_route.route_for_codecs`.
        Without this a file cut by LeRobot's delete_episodes (re-encoded as AV1 among H.264 files) failed when a
        batch first reached it."""
        # (a missing or damaged file fails as before when a batch reaches it, naming the camera and episodes)
        positions = surveyed_positions(self.reader, camera)
        survey = survey_camera(self.reader, camera, positions, skip_unreadable=True, store=self.remote_index_store,
                               format_store=self.format_store, since=since)  # fmt: skip
        survey.check_sizes(self.reader.info.features[camera].declared_size)
        check_file_timing(self.reader, survey, timestamp_source=self.timestamp_source, tolerance_s=self.tolerance_s,
                          unread_tail=self.unread_tail.get(camera, 0))  # fmt: skip
        self.surveys[camera] = survey
        return route_for_survey(survey, route, preference, on_gpu=self.device_id is not None)

    def _packet_index(self, pos: int, camera: str) -> tuple[VideoRef, PacketIndex]:
        """Episode ``pos``'s video of ``camera`` and its packet index."""
        return load_episode_packet_index(self.reader, pos, camera, store=self.index_store)

    def check_rows_find_frames(
        self, pos: int, indexes: Mapping[str, PacketIndex], *, rows: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Timestamps that miss the video (wall-clock time, rows shifted a frame, the wrong fps) fail here, when
        the iterator is built, rather than in a worker when a batch first reaches the row, maybe hours into
        training: episode ``pos``'s first and last rows (of ``rows``, its rows if already read; the last a sample
        reads: :attr:`unread_tail`) must find their frames in every camera's file."""
        if not indexes:
            return
        if rows is None:
            rows = self.reader.read_episode(pos, [])
        for camera, index in indexes.items():
            last = len(rows["timestamp"]) - 1 - self.unread_tail.get(camera, 0)  # (the last row a sample reads)
            row_frame_numbers(
                self.reader, pos, camera, rows, np.array([0, max(last, 0)]), index,
                timestamp_source=self.timestamp_source, tolerance_s=self.tolerance_s,
            )  # fmt: skip

    def other_first_files(self, camera: str) -> dict[int, tuple[VideoRef, PacketIndex]]:
        """A union's other datasets' first episodes' files of ``camera`` and their packet indexes, by position
        (:meth:`route`'s ``others``, :meth:`check_cameras`')."""
        return {pos: self._packet_index(pos, camera) for pos in self._other_firsts()}

    def check_cameras(
        self,
        routes: Mapping[str, DecodeRoute],
        indexes: Mapping[str, PacketIndex],
        rows: Mapping[str, np.ndarray] | None,
        others: Mapping[int, Mapping[str, tuple[VideoRef, PacketIndex]]],
    ) -> dict[str, CameraFormat]:
        """Each camera's format, that of its first file (``indexes``), after the iterator's build-time checks of the
        cameras ``routes`` (:meth:`CameraPlanner.choose_routes`' of every camera at once, ``diagnose``'s of one at a
        time): a union's other datasets' first files (``others``, by position: :meth:`other_first_files`) are held to
        it; each first episode's first and last rows (the first's ``rows``, where read) find their frames in its
        files, the datasets' at once; the workers' decoder loads (:meth:`check_backend`)."""
        formats = {camera: CameraFormat.of(index, route=routes[camera]) for camera, index in indexes.items()}
        held = {pos: self._held_to_formats(pos, files, formats) for pos, files in others.items()}

        def check_first(pos: int) -> None:
            if pos:
                self.check_rows_find_frames(pos, held[pos])
            else:
                self.check_rows_find_frames(pos, indexes, rows=rows)

        in_threads(check_first, [0, *held])  # (a union's datasets' at once)
        self.check_backend(routes)
        return formats

    def _held_to_formats(
        self, pos: int, files: Mapping[str, tuple[VideoRef, PacketIndex]], formats: Mapping[str, CameraFormat]
    ) -> dict[str, PacketIndex]:
        """The packet index of each camera's file of episode ``pos`` (``files``), each held to the camera's format."""
        episode = int(self.reader.episodes.episode_index[pos])
        for camera, expected in formats.items():
            video, index = files[camera]
            expected.check(index, path=video.path, episode=episode, camera=camera)
        return {camera: index for camera, (_, index) in files.items()}

    def check_backend(self, routes: Mapping[str, DecodeRoute]) -> None:
        """CodecUnsupportedError where ``cpu_decode`` asks for torchcodec, which cannot decode here, and the workers
        decode a camera: before, the iterator was built and the first batch failed. Depth cameras are left out: PyAV
        decodes their 12-bit codes whatever the backend."""
        workers = [
            camera
            for camera, route in routes.items()
            if route is DecodeRoute.CPU_FALLBACK and camera not in self.depth_quantizers
        ]
        if self.cpu_decode.backend is not CpuDecoderBackend.TORCHCODEC or not workers:
            return
        why_not = torchcodec_unavailable()
        if why_not is not None:
            raise CodecUnsupportedError(
                f"cpu_decode=CpuDecodeOptions(backend=torchcodec) for cameras {workers}, which the workers decode, but "
                f"{why_not}: use CpuDecoderBackend.PYAV or AUTO (torchcodec where it decodes, else PyAV), or make "
                "torchcodec load"
            )


@dataclass(kw_only=True, eq=False)
class CameraPlanner(CameraRouter):
    """What an iterator's cameras are planned from: its reader, device and stores (:class:`CameraRouter`'s, which the
    iterator keeps for its workers), the depth cameras, the frame lookup's options and what the graph does to
    frames. :meth:`choose_routes` picks each camera's route (and sets :attr:`camera_formats` and :attr:`color_fixes`),
    then :meth:`plan_feeds` each camera's feed."""

    depth_cameras: Collection[str]  # the depth video cameras and the depth image cameras
    depth_unit: DepthUnit
    image_size: tuple[int, int] | None
    augment: AugmentConfig | None
    num_workers: int
    #: Cameras DALI decodes: a batch's samples that read one file decode one clip (:mod:`.clip_sharing`).
    share_clips: bool = False
    camera_formats: dict[str, CameraFormat] = field(init=False, repr=False)
    color_fixes: dict[str, tuple[tuple[float, ...], ...]] = field(init=False, repr=False)
    #: Each video camera's pixel format that sizes its shipped planes (None: not known):
    #: :meth:`~.camera_codecs.CameraSurvey.planes_pix_fmt`.
    pix_fmts: dict[str, str | None] = field(init=False, repr=False)

    def choose_routes(
        self, preference: DecodePreference, first_rows: Mapping[str, np.ndarray] | None
    ) -> dict[str, DecodeRoute]:
        """A route per video camera (:meth:`~CameraRouter.route`, a union's other datasets' first files read at once
        for every camera), then checked (:meth:`~CameraRouter.check_cameras`: the first episode's first and last rows,
        ``first_rows`` where already read, looked up in its file; a union's other datasets' first episodes held to its
        format now, rather than when a batch first reaches them); that file's format kept as the camera's
        (``camera_formats``, which the workers hold every other file to)."""
        if first_rows is None and self.reader.num_episodes and self.reader.camera_keys:
            # (rows that refuse info.json's fps say so first: the files' timing is held to it, :mod:`.file_timing`;
            # the first rows' lookup below read them again, and failed alike, after the files were surveyed)
            self.reader.read_episode(0, [])
        routes = {}
        surveys_since = time.monotonic()  # (one wait, however many cameras: its progress shows past 2 s in all)
        indexes = {}
        firsts = self._other_firsts()
        others = in_threads(lambda pos: {c: self._packet_index(pos, c) for c in self.reader.camera_keys}, firsts)
        for camera in self.reader.camera_keys:
            theirs = [files[camera][1] for files in others]
            _, indexes[camera], routes[camera] = self.route(camera, preference, others=theirs, since=surveys_since)
        for camera, index in indexes.items():
            declared = self.reader.info.features[camera].declared_size
            if declared is not None and declared != (index.height, index.width):
                # (height x width, as the errors of a file of another size say it)
                warn_once(logger, "camera %r: info.json declares %dx%d (HxW) frames, its videos hold %dx%d (%s): "
                          "batches carry the videos' size%s; correct info.json where a policy is built from it", camera,
                          *declared, index.height, index.width, index.source_name,
                          "" if self.image_size is None else " before image_size resizes them")  # fmt: skip
        self.camera_formats = self.check_cameras(routes, indexes, first_rows, dict(zip(firsts, others, strict=True)))
        self.color_fixes = dali_color_fixes(self.camera_formats)
        self.pix_fmts = {
            camera: index.pix_fmt if camera not in self.surveys else self.surveys[camera].planes_pix_fmt()
            for camera, index in indexes.items()
        }
        return routes

    def plan_feeds(self, routes: Mapping[str, DecodeRoute]) -> dict[str, CameraFeed]:
        on_gpu = self.device_id is not None
        feeds = {
            camera: camera_feed(
                route,
                on_gpu=on_gpu,
                cpu_decode=self.cpu_decode,
                augment=self.augment,
                image_size=self.image_size,
                depth=camera in self.depth_quantizers,
                color_fix=self.color_fixes.get(camera),
                share_clips=self.share_clips,
            )
            for camera, route in routes.items()
        }
        if self.depth_cameras:
            say_once(logger, logging.INFO,
                "depth cameras %s: decoded by the workers and read in %s, never augmented",
                sorted(self.depth_cameras), self.depth_unit.value,
            )  # fmt: skip
        planes = sorted(camera for camera, feed in feeds.items() if feed.planes)
        if planes:
            say_once(logger, logging.INFO, "CPU-fallback cameras %s: workers ship YUV planes, the pipeline makes RGB",
                     planes)  # fmt: skip
        sizes = {camera: feed.worker_size for camera, feed in feeds.items() if feed.worker_size is not None}
        if sizes:
            say_once(logger, logging.INFO, "CPU mode: the decoding workers resize %s (not the pipeline)", sizes)
        decoded_by_workers = sorted(c for c, feed in feeds.items() if feed.route is DecodeRoute.CPU_FALLBACK)
        if decoded_by_workers:
            cpus = cpus_per_local_rank()
            say_once(logger, logging.INFO,
                "cameras %s are decoded on the CPU by %s, with %s for this rank: decoding is usually what "
                "bounds throughput here, so if the loop waits for batches, %s",
                decoded_by_workers,
                counted(self.num_workers, "worker process") if self.num_workers else "the main process (num_workers=0)",
                counted(cpus, "CPU"),
                "raise num_workers toward the CPU count" if self.num_workers < cpus
                else "give this rank more CPUs (fewer ranks per node): its workers "
                f"{'already match' if self.num_workers == cpus else 'already outnumber'} its CPUs, and workers beyond "
                "the CPU count decode no faster",
            )  # fmt: skip
        return feeds


def dali_color_fixes(formats: Mapping[str, CameraFormat]) -> dict[str, tuple[tuple[float, ...], ...]]:
    """Per camera DALI decodes (NVDEC or its CPU decoder; its format holds the colour tags of its first file) whose
    stream is tagged with another colour matrix than BT.601 (which both decoders' output assumes), the correction
    the graph applies (:func:`~lerobot_dali.yuv_frames.nvdec_color_fix`)."""
    fixes = {}
    for camera, fmt in formats.items():
        if fmt.color is None:  # decoded by the workers (swscale, by its tags)
            continue
        colorspace, full_range = fmt.color
        fix = nvdec_color_fix(colorspace, full_range)
        decoder = "NVDEC" if fmt.nvdec else "DALI's CPU decoder"
        if not has_color_matrix(colorspace):
            warn_once(logger,
                "camera %s is tagged colour space %d, which %s converts as BT.601 and lerobot_dali cannot correct; its "
                "colours may differ from the workers' routes' (PyAV's)", camera, colorspace, decoder,
            )  # fmt: skip
        if fix is not None:
            fixes[camera] = tuple(tuple(row) for row in fix.tolist())
            say_once(logger, logging.INFO,
                "camera %s is tagged colour space %d: %s's BT.601 RGB is converted to it in the pipeline", camera,
                colorspace, decoder,
            )  # fmt: skip
    return fixes
