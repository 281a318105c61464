"""The codec, size and pixel format of each of a camera's video files, read from their headers.

LeRobot 0.4's ``delete_episodes`` and ``split_dataset`` re-encode the files they cut as AV1 and copy the others, and
``info.json`` keeps naming the old codec: a camera's files may mix codecs. NVDEC and DALI's CPU decoder decode a
camera in one codec (NVDEC in one pixel format and colour space too), which the iterator used to take from the
camera's first file alone, so an odd file failed when a batch first reached it, maybe hours into training. The
iterator now surveys every file of every video camera when it is built, and ``lerobot-dali check`` every camera's: a
DALI-decoded camera whose files differ goes to the workers, which give each file a decoder of its own, and a file
whose frame size is not the first's is refused whatever decodes the camera (a batch is one tensor). Files whose
header does not open, or whose codec no decoder here takes, are left out, and fail as before when a batch reaches
them, naming the file.

A header (``av.open``: the container's header and codec parameters, no packet) costs 0.3-0.5 ms of CPU a local file
(H.264 96x128, AV1 640x480 alike), against 1.2-1.9 ms for the packet index of a v2.1 episode's file and 4.6 ms for a
v3.0 file of ~1,000 frames (which the workers would build again: a local file's index is kept per process, not on
disk). Building the iterator over 1,000 v2.1 episodes of two H.264 cameras in CPU mode (the workers decode them)
took 0.25-0.44 s before worker-decoded cameras were surveyed and takes 1.2-1.8 s the first time (2 busy cores;
threads gain more where there are more). A local file's format is kept on disk with its stamp
(:mod:`.file_format_store`), so later builds, and the node's other ranks, read only the files changed since: 15,000
episodes of two cameras (30,000 files) cost every build 12.6-12.8 s of CPU (19-28 s of wall time on 2 cores other
work shared), now the first one 11.7 s (20 s) and later ones 0.28-0.38 s (0.9 s). A remote file's packet index is read
instead, through the on-disk store: the workers need it anyway, and the node's other ranks and later runs load it,
where a header would cost each rank of each run its requests. Those 1,000 episodes over HTTP on 127.0.0.1 (no
latency; a listing without sizes) took 2.4-2.8 s to build before and take 11-14 s with an empty store (3 requests a
file, which the workers made when a batch first reached the file), 1.1 -> 4.0-4.6 s with a full one (a HEAD a file).
Past :data:`~lerobot_dali.checked_files.CHECKED_FILES` files of a camera (100,000; 2,000 remote), only each dataset's
first file is read.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import av
import numpy as np

from .checked_files import CHECKED_FILES, CHECKED_FILES_REMOTE
from .concurrent_calls import in_threads
from .errors import (
    DAMAGED_VIDEO_ADVICE,
    CodecUnsupportedError,
    DatasetError,
    SchemaMismatchError,
    VideoDecodeError,
    no_video_stream,
)
from .packet_index_cache import load_episode_packet_index
from .remote_errors import is_transient
from .said_once import say_once
from .video_source import open_video_source
from .wording import first_named
from .yuv_frames import codec_color, ships_half_chroma, stream_color

if TYPE_CHECKING:
    from .batch_source import CameraFormat
    from .dataset_reader import LeRobotDatasetReader
    from .file_format_store import FileFormatStore
    from .packet_index import PacketIndex
    from .packet_index_store import PacketIndexStore

__all__ = [
    "CameraSurvey",
    "FileFormat",
    "codec_counts",
    "counts_text",
    "file_positions",
    "read_file_format",
    "survey_camera",
    "surveyed_positions",
]

logger = logging.getLogger(__name__)


class FileFormat(NamedTuple):
    """What one video file's header declares: what decides whether a decoder set up for another file decodes it."""

    codec: str
    height: int
    width: int
    pix_fmt: str | None
    #: (``AVColorSpace``, full range).
    color: tuple[int, bool]
    #: Frames a second of the stream (FFmpeg's guess from its first frames' times, else its average rate); None where
    #: the header gives none. With :attr:`end_s`, what :mod:`.file_timing` holds the file's episodes' rows to.
    rate: float | None = None
    #: Where the stream's frames end, in seconds (its start and duration); None where the header does not say.
    end_s: float | None = None


def codec_counts(formats: Iterable[Any]) -> dict[str, int]:
    """How many of ``formats`` (:class:`FileFormat` or :class:`~lerobot_dali.packet_index.PacketIndex`, each a file)
    hold each codec, the first's codec first."""
    return dict(Counter(f.codec for f in formats))


def counts_text(counts: Mapping[str, int], *, colon: bool = False) -> str:
    """``{"h264": 2, "av1": 1}`` as ``"h264 2 files, av1 1 file"``; ``colon``: as ``"h264: 2 files; av1: 1 file"``,
    for descriptions with commas of their own."""
    between, after = ("; ", ": ") if colon else (", ", " ")
    return between.join(f"{what}{after}{n} file{'s' * (n != 1)}" for what, n in counts.items())


def read_file_format(reader: LeRobotDatasetReader, path: str) -> FileFormat:
    """The header of ``reader``'s video file ``path`` (remote: opened with the size its listing gave).

    Raises MissingDataFileError where it does not exist, VideoDecodeError where it has no video stream or does not
    open, CodecUnsupportedError where FFmpeg has no decoder for its stream (as the packet index does)."""
    stamp = reader.listed_stamp(path)
    fs = reader.filesystem_of(path)
    with open_video_source(path, filesystem=fs, size=None if stamp is None else stamp.size) as handle:
        try:
            with av.open(handle, mode="r") as container:
                if not container.streams.video:
                    raise VideoDecodeError(no_video_stream(path, container))
                context = container.streams.video[0].codec_context
                if context is None:  # (PyAV gives a stream no decoder takes no codec context)
                    raise CodecUnsupportedError(
                        f"{path}: FFmpeg finds no decoder for the video stream: its codec is one no decoder here "
                        "takes (re-encode it: H.264, HEVC, AV1 or VP9), or its header is damaged (copy it again)."
                    )
                return FileFormat(
                    context.codec.canonical_name, int(context.height), int(context.width), context.pix_fmt,
                    codec_color(context), *_stream_timing(container, container.streams.video[0]),
                )  # fmt: skip
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:  # (as build_packet_index reads it)
            if is_transient(e):
                raise
            raise VideoDecodeError(
                f"{path}: cannot read the video container ({e}); the file is truncated or corrupt: "
                f"{DAMAGED_VIDEO_ADVICE}"
            ) from e


def _stream_timing(container: Any, stream: Any) -> tuple[float | None, float | None]:
    """The frame rate and the end in seconds ``stream``'s header declares (:attr:`FileFormat.rate`, ``end_s``): its
    rate as FFmpeg guesses it from its first frames' times (the average, its frames over its duration, is off by a
    frame's share where a remux lost the last packet's duration: 30.6 for a 45-frame 29.97 fps file); its duration,
    else the container's (a WebM declares its segment's alone)."""
    rate = stream.guessed_rate or stream.average_rate
    end_s = None
    if stream.duration is not None and stream.time_base is not None:
        end_s = float((stream.start_time or 0) * stream.time_base + stream.duration * stream.time_base)
    elif container.duration is not None:
        end_s = container.duration / av.time_base
    return (float(rate) if rate else None), end_s


def _index_timing(index: PacketIndex) -> tuple[float, float]:
    """:func:`_stream_timing` from a packet index: its frames' mean rate (a WebM's millisecond times make one
    interval 33 ms, another 34), and where its last frame ends."""
    shown = index.shown_pts_s
    span_s = float(shown[-1] - shown[0]) if len(shown) > 1 else 0.0
    rate = (len(shown) - 1) / span_s if span_s > 0 else 1 / index.frame_interval_s
    return rate, float(shown[-1]) + index.frame_interval_s


def file_positions(reader: LeRobotDatasetReader, camera: str) -> list[int]:
    """Position of the first episode of each of ``camera``'s video files, in episode order (a union's datasets' files
    apart: each numbers its own)."""
    files = reader.episodes.cameras[camera]
    positions = np.arange(len(files.chunk_index))
    dataset = np.searchsorted(np.asarray(reader.first_episodes(), dtype=np.int64), positions, side="right")
    keys = np.stack([dataset, files.chunk_index, files.file_index], axis=1)
    return sorted(np.unique(keys, axis=0, return_index=True)[1].tolist()) if len(keys) else []


def surveyed_positions(reader: LeRobotDatasetReader, camera: str) -> list[int]:
    """:func:`file_positions`, or past their bound (:mod:`.checked_files`: 100,000 local, 2,000 remote; a union's
    local and remote files each held to their own) each dataset's first episode, with an INFO line: a union's local
    files past theirs leave its remote ones all surveyed, and the other way round."""
    positions = file_positions(reader, camera)
    is_local = [reader.episode_is_local(pos) for pos in positions]
    local = sum(is_local)
    past = {True: local > CHECKED_FILES, False: len(positions) - local > CHECKED_FILES_REMOTE}
    if not any(past.values()):
        return positions
    mixed = 0 < local < len(positions)
    for kind, most in ((True, CHECKED_FILES), (False, CHECKED_FILES_REMOTE)):
        if past[kind]:
            say_once(logger, logging.INFO,
                "%s: camera %s has %d %svideo files, more than %d: only its first file's format is read when the "
                "iterator is built (a file of another codec or size fails when a batch reaches it); `lerobot-dali "
                "check` reads them all",
                reader.location.description, camera, is_local.count(kind),
                ("local " if kind else "remote ") if mixed else "", most,
            )  # fmt: skip
    kept = [pos for pos, kind in zip(positions, is_local, strict=True) if not past[kind]]
    firsts = [pos for pos in reader.first_episodes() if past[reader.episode_is_local(pos)]]
    return sorted({*kept, *firsts})


@dataclass(frozen=True)
class CameraSurvey:
    """The headers of a camera's video files (:func:`survey_camera`)."""

    camera: str
    #: Path -> header of each file read, the camera's first file first.
    formats: dict[str, FileFormat]
    #: Path -> the episode index of its first episode (for messages).
    episodes: dict[str, int]

    @property
    def first(self) -> FileFormat | None:
        """The header of the camera's first file; None where it did not open."""
        return self.formats.get(next(iter(self.episodes), ""))

    def codecs(self) -> dict[str, int]:
        """:func:`codec_counts` of the files."""
        return codec_counts(self.formats.values())

    def planes_pix_fmt(self) -> str | None:
        """The pixel format a batch's shipped planes are sized by (:func:`~.yuv_frames.ships_half_chroma`): the first
        file's, or else the first file's read that ships RGB-sized data, since a batch may hold any file's frames."""
        full = (f.pix_fmt for f in self.formats.values() if not ships_half_chroma(f.pix_fmt))  # (the first's first)
        return next(full, None if self.first is None else self.first.pix_fmt)

    def check_sizes(self, declared: tuple[int, int] | None = None) -> None:
        """Raise SchemaMismatchError naming the files whose frame size is not the first file's: a batch is one tensor
        whatever decodes it. ``declared``: the (height, width) info.json declares; where the first file is not of it
        but another file is, the first is the odd one (a file replaced by another recording), and the files not of
        the declared size are named instead, to be re-encoded at it."""
        reference = self.first
        if reference is None:
            return
        size = reference.height, reference.width
        said = f"the camera's first file ({next(iter(self.episodes))}) is {reference.codec} {size[0]}x{size[1]} (HxW)"
        if (
            declared is not None
            and size != declared
            and any((f.height, f.width) == declared for f in self.formats.values())
        ):
            size = declared
            said = f"info.json declares {size[0]}x{size[1]} (HxW) frames for the camera, as its other files hold"
        odd = [(path, f) for path, f in self.formats.items() if (f.height, f.width) != size]
        if odd:
            camera = f"camera {self.camera!r}"
            files = first_named(
                (
                    f"{path} (episode {self.episodes[path]}, {camera}) is {f.codec} {f.height}x{f.width} (HxW)"
                    for path, f in odd
                ),
                len(odd),
                "file",
            )
            raise SchemaMismatchError(
                f"{files}, but {said}; a camera's videos must share one size (a batch is one tensor): re-encode "
                f"these files at {size[0]}x{size[1]}"
            )

    def unlike(self, reference: CameraFormat) -> list[str]:
        """The files ``reference`` (the first file's format under its route) does not admit."""
        return [path for path, f in self.formats.items() if not reference.admits(f)]


def survey_camera(
    reader: LeRobotDatasetReader,
    camera: str,
    positions: Sequence[int],
    *,
    skip_unreadable: bool = False,
    store: PacketIndexStore | None = None,
    format_store: FileFormatStore | None = None,
    since: float | None = None,
) -> CameraSurvey:
    """The headers of ``camera``'s files of episodes ``positions`` (:func:`surveyed_positions`), read in threads.
    Raises what :func:`read_file_format` raises for the first file in order that fails; ``skip_unreadable``: those
    that raise a DatasetError (missing, damaged) are left out instead, for a check that lists them elsewhere.

    ``store`` (remote datasets; a union's remote ones): each file's packet index is loaded from it, or built and kept
    there, instead of its header read. The workers need every file's index anyway; the store shares it with the node's
    other ranks and later runs, where a header would be read again by every rank of every run (requests a file, not a
    process). ``format_store`` (local datasets; a union's local ones): the headers read are kept there, per dataset,
    and later builds read only the files changed since. ``since``: where the cameras are surveyed one after another, the
    :func:`time.monotonic` at which the first began (its progress shows once they have taken
    :data:`~lerobot_dali.concurrent_calls.PROGRESS_DELAY_S` in all)."""
    first_pos: dict[str, int] = {}  # (in order, each file once)
    for pos in positions:
        first_pos.setdefault(reader.video(pos, camera).path, pos)
    first_episode = {path: int(reader.episodes.episode_index[pos]) for path, pos in first_pos.items()}

    local = {path: reader.episode_is_local(pos) for path, pos in first_pos.items()}

    def read(path: str) -> FileFormat | None:
        try:
            if store is None or local[path]:
                return read_file_format(reader, path)
            _, index = load_episode_packet_index(reader, first_pos[path], camera, store=store)
            return FileFormat(index.codec, index.height, index.width, index.pix_fmt, stream_color(index.template),
                              *_index_timing(index))  # fmt: skip
        except DatasetError as e:
            if not skip_unreadable:
                raise
            logger.debug("camera %s: %s left out of the survey: %s", camera, path, e)
            return None

    def read_all(paths: list[str]) -> list[FileFormat | None]:
        desc = f"lerobot-dali: camera {camera}'s video headers"
        return in_threads(read, paths, progress=desc, unit="file", since=since)

    by_dataset: dict[str, list[str]] = {}  # (local files kept in format_store: a union's datasets each their own)
    others = []  # (read at once, in threads)
    for path, pos in first_pos.items():
        if format_store is not None and local[path]:
            by_dataset.setdefault(reader.source_of(pos), []).append(path)
        else:
            others.append(path)
    formats = dict(zip(others, read_all(others), strict=True)) if others else {}
    for dataset, paths in by_dataset.items():
        if format_store is not None:
            formats.update(zip(paths, format_store.formats(dataset, camera, paths, read_all), strict=True))
    return CameraSurvey(camera, {path: f for path in first_episode if (f := formats[path]) is not None}, first_episode)
