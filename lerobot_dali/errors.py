"""Exceptions raised by lerobot_dali.

Every error names the file (or dataset, episode, camera) it is about and says what to do. They subclass
the builtin that fits, so callers who catch ``ValueError`` or ``FileNotFoundError`` keep working, and
they survive pickling so an error raised in a worker process reaches the training process intact.
"""

from __future__ import annotations

import difflib
from typing import Any

from .url_secrets import masked

__all__ = [
    "DAMAGED_VIDEO_ADVICE",
    "CameraSelectionError",
    "CodecUnsupportedError",
    "CudaUnavailableError",
    "DataFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeMetadataError",
    "FrameRequestError",
    "FrameTimestampError",
    "InvalidPathTemplateError",
    "IteratorClosedError",
    "IteratorForkedError",
    "MissingDataFileError",
    "RemoteFileError",
    "RenameMapError",
    "RenamedCameraError",
    "ResumeStateError",
    "SchemaMismatchError",
    "ShardingError",
    "StatsError",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "WorkerProcessError",
    "did_you_mean",
    "missing_video",
    "no_video_stream",
]


#: What to do about a video file that does not open or decode (truncated, corrupt): the errors saying so end with it.
DAMAGED_VIDEO_ADVICE = (
    "download or copy it again from the dataset's source (`lerobot-dali check --decode` lists every damaged file)"
)


def missing_video(label: str) -> MissingDataFileError:
    """The error for a video file the metadata names that does not exist, saying what to do."""
    return MissingDataFileError(
        f"Video file {label} does not exist: download or copy it again from the dataset's source, or leave out the "
        "episodes it holds (episodes=[...] of the others); `lerobot-dali check` lists every missing file"
    )


def no_video_stream(label: str, container: object) -> str:
    """What an error says of video file ``label`` whose PyAV ``container`` holds no video stream (an audio track,
    subtitles, data): another file than the camera's, so copying it again is what mends it."""
    kinds = sorted({str(stream.type) for stream in getattr(container, "streams", ())})
    return (
        f"{label}: the file has no video stream (it holds {kinds or 'no stream'}): {DAMAGED_VIDEO_ADVICE}, or leave "
        "out the episodes it holds (episodes=[...] of the others)"
    )


def did_you_mean(unknown: list[str], available: list[str]) -> str:
    """`` (did you mean [...]?)`` naming, for each of ``unknown``, the one key of ``available`` it most likely
    stands for: the key whose last dotted part is spelt nearest its own, and nearer than any other's ('top' and
    'observation.image.top' for 'observation.images.top', 'actoin' for 'action'; nothing for
    'observation.images.top' where the cameras are 'observation.images.cam0' and 'cam1', nor for 'camera_2' where
    they are 'camera_0' and 'camera_1', each as near); "" where none is. Only strings are spelt: an error naming a
    key given as ``3`` or ``None`` raised AttributeError here instead."""
    last: dict[str, list[str]] = {}
    for key in available:
        if isinstance(key, str):
            last.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    near: list[str] = []
    for name in (name for name in unknown if isinstance(name, str)):
        own = name.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(own, list(last), n=2, cutoff=0.8)
        ratios = [difflib.SequenceMatcher(None, own, part).ratio() for part in close]
        alone = len(close) == 1 or (len(close) == 2 and ratios[0] > ratios[1])
        near += last[close[0]][:1] if alone and len(last[close[0]]) == 1 else []
    return f" (did you mean {near}?)" if near else ""


def listing_hint(fs: object) -> str:
    """What to add where a glob or a listing of ``fs`` found nothing: over plain HTTP the files are found through
    the server's directory listings (HTML index pages), which many servers do not serve; elsewhere nothing."""
    from .request_checks import speaks_http  # (which imports this module)

    if not speaks_http(fs):
        return ""
    return (
        "; over HTTP files are found through the server's directory listings (HTML index pages), and this server "
        "may serve none: turn them on (nginx: autoindex on), or read the dataset by hf:// or s3://"
    )


def cameras_hint(cameras: list[str] | None = None) -> str:
    """How to leave cameras out, for the API and the command line alike."""
    if cameras == []:
        return "cameras=[] (the command line's --cameras cannot leave every camera out)"
    listed = "[...]" if cameras is None else repr(cameras)
    shown = " ".join(cameras) if cameras else "KEY ..."
    return f"cameras={listed} (on the command line: --cameras {shown})"


class _MaskedMessage:
    """For an error whose text names a dataset's paths: where they keep a URL's query (``memory://b/ds?token=...``),
    its credentials are masked as the error is made (:func:`.url_secrets.masked`), in its message, ``args`` and
    ``repr`` alike, wherever it is raised (3 of 3 errors, of a missing video, a cut one and a damaged parquet, named
    the token). A mixin, not an error of its own to catch."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(masked(arg) if isinstance(arg, str) else arg for arg in args))


class DatasetError(_MaskedMessage, ValueError):
    """Base class: the dataset (or its description) is not what a LeRobot dataset must be."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The dataset root, or its ``meta/info.json``, does not exist."""


class UnsupportedVersionError(DatasetError):
    """``codebase_version`` is one this loader cannot read."""


class InvalidPathTemplateError(DatasetError):
    """A ``data_path``/``video_path`` template is malformed or points outside the dataset root."""


class MissingDataFileError(DatasetError, FileNotFoundError):
    """A data parquet or video file that the metadata refers to is absent. ``status`` is the HTTP status its server
    answered (404, 410), as :class:`RemoteFileError`'s; None where no server was asked (a local file, a listing).
    ``camera``: the camera info.json declares that has no video for the first episode (never recorded, as GR00T's
    ``egoview``), which ``lerobot-dali check`` lists as a problem before checking the others; None otherwise."""

    def __init__(self, message: str, status: int | None = None, *, camera: str | None = None) -> None:
        super().__init__(message)
        self._status = status  # (kept through pickling: an error's __dict__ goes with its args)
        self.camera = camera

    @property
    def status(self) -> int | None:
        """Its own, else that of the MissingDataFileError it was raised from: a reader naming more (``data file ...
        is missing (listed in the episode metadata)``) raises its own from the one the server's answer made."""
        error, seen = self, {id(self)}
        while error._status is None and isinstance(error.__cause__, MissingDataFileError):
            if id(error.__cause__) in seen:
                break
            error = error.__cause__
            seen.add(id(error))
        return error._status

    @status.setter
    def status(self, status: int | None) -> None:
        self._status = status

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (a copy too) with its status, the one its cause gave included: the cause does not go along."""
        reduced: tuple[Any, ...] = super().__reduce__()  # type: ignore[assignment]  # (BaseException's: a tuple)
        state = reduced[2] if len(reduced) > 2 and isinstance(reduced[2], dict) else {}
        return (reduced[0], reduced[1], {**state, "_status": self.status})


class RemoteFileError(DatasetError):
    """A remote file (``http(s)://``, ``hf://``, an object store's) its server refused (HTTP 401/403), or whose
    requests kept failing past the retries (5xx, 429, timeouts, resets, answers cut short): the message names its URL
    (credentials masked) and what to do; ``status`` is the HTTP status last answered, None where there was none. The
    HTTP client's own error is its ``__cause__``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message, status)
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])


class CameraSelectionError(DatasetError):
    """``cameras=`` names a camera the dataset does not declare; or, datasets read together, (by the batches' names) a
    camera one of them lacks, or two of its cameras have, under the names its rename_map gives them."""


class RenameMapError(ValueError):
    """A rename_map that cannot be applied as given: it names a key the dataset does not read, or an empty name, gives
    a key a name another key has, or hides a camera asked for (renamed away, two given its name, written the other
    way round). The map is what to change (``--rename-map`` on the command line)."""


class RenamedCameraError(CameraSelectionError, RenameMapError):
    """``cameras=`` asks for a camera the dataset has but its rename_map hides (renames away, gives two cameras, or
    reaches only written the other way round)."""


class DataFileError(DatasetError):
    """A data parquet file exists but cannot be read: truncated, corrupt, or not parquet."""


class EpisodeMetadataError(DatasetError):
    """Episode metadata is missing, inconsistent, or disagrees with the data rows."""


class SchemaMismatchError(DatasetError):
    """A data column disagrees with the feature declared in ``info.json`` (shape, type, presence)."""


class StatsError(DatasetError):
    """The dataset's statistics (``meta/stats.json``, ``meta/episodes_stats.jsonl``) lack what was asked of them,
    e.g. the mean/std of a camera to normalise by."""


class DeltaTimestampsError(DatasetError):
    """``delta_timestamps`` names an unknown key or a delta that is not a multiple of 1/fps."""


class FrameTimestampError(DatasetError):
    """A requested frame timestamp has no video frame within ``tolerance_s``."""


class VideoDecodeError(DatasetError):
    """A video file is unreadable: truncated, corrupt, or missing the stream."""


class CodecUnsupportedError(VideoDecodeError):
    """No available decoder (NVDEC through DALI, DALI CPU, torchcodec, PyAV) handles this codec."""


class CudaUnavailableError(ValueError):
    """A CUDA device was asked for (``device="cuda"``, ``cuda:N``) that this process does not see: no driver, a
    CPU-only torch, or ``CUDA_VISIBLE_DEVICES`` hiding it."""


class ShardingError(ValueError):
    """The selected episodes cannot be split across the ranks as asked (e.g. fewer episodes than ranks)."""


class ResumeStateError(ValueError):
    """A saved stream state is malformed or does not fit the loader it is loaded into."""


class FrameRequestError(_MaskedMessage, ValueError):
    """A frame request to a video is malformed: no frames at all, or frame indices outside the file."""


class IteratorClosedError(RuntimeError):
    """A pass read on after ``close()`` (from any thread) or after a newer pass (another ``iter()``) began."""


class IteratorForkedError(RuntimeError):
    """An iterator used in a child of the process that built it (``os.fork``): its pipeline and workers are the
    parent's."""


class WorkerProcessError(RuntimeError):
    """A worker process died without reporting an error (a signal such as the out-of-memory killer's), or the
    worker processes did not start."""
