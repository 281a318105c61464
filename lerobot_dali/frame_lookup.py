"""Query timestamps -> display frame indices of a video file, checked against a tolerance.

The check runs on the packet index alone, so a window whose timestamps miss the video fails before any
byte is decoded, with an error that says which dataset, episode, camera and query went wrong.
Timestamps here are absolute file times in seconds: episode ``from_timestamp`` + episode-local time.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike

from .errors import DataFileError, FrameRequestError, FrameTimestampError
from .file_timing import CORRECT_START, FEWER_FRAMES, MORE_FRAMES, REWRITE_AT_RATE, holds_a_frame_per_row
from .packet_index import PacketIndex
from .value_checks import check_choice, check_seconds
from .wording import counted

if TYPE_CHECKING:
    from .dataset_reader import LeRobotDatasetReader, VideoRef

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "ITERATORS_LOOKUP",
    "TIE_FRACTION",
    "EpisodeRows",
    "FrameLookup",
    "FrameRequestContext",
    "TimestampSource",
    "TimestampSourceName",
    "episode_frames",
    "file_frame_numbers",
    "frame_index_timestamps_s",
    "nearest_frame_indices",
    "row_frame_numbers",
]


#: How far a frame's pts may be from a row's time, by default: LeRobot's ``tolerance_s`` default.
DEFAULT_TOLERANCE_S = 1e-4

#: Two frames this close in distance to a query (as a fraction of a frame interval, plus a float32 step at the
#: query's time) are a tie, which goes to the earlier frame: 0.1 % of a 25 fps interval is 40 us, far below any real
#: offset between data and video. The float32 step covers a timestamp's rounding, which moves a query halfway
#: between two frames up to half a step to either side (its distances to them differ by up to a step): 40 us alone
#: covered it up to 512 s only.
TIE_FRACTION = 1e-3


#: How the advice of a wall-clock row names the option: the iterator's, and the command line's (check, bench, train).
_BY_FRAME_INDEX = "timestamp_source='frame_index'; on the command line --timestamp-source frame_index"


class TimestampSource(Enum):
    """Where the episode-local time of a data row comes from before it is looked up in the video."""

    #: The parquet ``timestamp`` column (LeRobot's convention); it must match the video's pts.
    PARQUET_TIMESTAMP = "parquet_timestamp"
    #: ``frame_index / fps``: for datasets whose parquet timestamps are wall-clock and irregular (e.g.
    #: ``cr5_*``) while the video is constant-rate; frame ``i`` of an episode is then at ``i / fps``.
    FRAME_INDEX = "frame_index"


#: :class:`TimestampSource`'s values, as a type checker checks a string given for one (``"frame_index"``).
TimestampSourceName = Literal["parquet_timestamp", "frame_index"]


@dataclass(frozen=True)
class FrameLookup:
    """How one dataset's rows find their video frames where that differs from what the iterator was given: the
    datasets of a union may come from different recorders, one writing wall-clock parquet timestamps (read by
    ``frame_index``), one jittering more than the tolerance. None keeps the iterator's."""

    timestamp_source: TimestampSource | None = None
    tolerance_s: float | None = None

    def __post_init__(self) -> None:
        if self.timestamp_source is not None:
            source = check_choice(TimestampSource, "timestamp_source", self.timestamp_source)
            object.__setattr__(self, "timestamp_source", source)
        if self.tolerance_s is not None:
            check_seconds("tolerance_s", self.tolerance_s)

    def over(self, timestamp_source: TimestampSource, tolerance_s: float) -> tuple[TimestampSource, float]:
        """This lookup's own settings, the given ones where it has none."""
        return (
            timestamp_source if self.timestamp_source is None else self.timestamp_source,
            tolerance_s if self.tolerance_s is None else float(self.tolerance_s),
        )

    def __str__(self) -> str:
        own = [f"{k}={v.value if isinstance(v, Enum) else v}" for k, v in vars(self).items() if v is not None]
        return ", ".join(own) or "the iterator's"


#: A dataset that reads its rows as the iterator says.
ITERATORS_LOOKUP = FrameLookup()


@dataclass(frozen=True, kw_only=True)
class FrameRequestContext:
    """What a request is for, so a failed lookup names it (all optional; empty parts are left out)."""

    dataset: str = ""
    episode_index: int | None = None
    camera: str = ""
    #: The rows' fps (info.json): a failed lookup compares it with the video's to say which fix applies.
    rows_fps: float | None = None
    #: Rows are looked up by ``frame_index / fps`` (:attr:`TimestampSource.FRAME_INDEX`), not their timestamps.
    by_frame_index: bool = False
    #: Where meta/episodes puts the end of the episode's video in the file, in seconds: ``from_timestamp + length /
    #: fps`` (not its ``to_timestamp``, which LeRobot never reads). A row past the last frame of a video whose frames
    #: end before it is told the file is cut short, not that the video has fewer frames than the rows.
    episode_end_s: float | None = None
    #: Where the episode's last row belongs in the file by its length, in seconds: ``from_timestamp + (length - 1) /
    #: rows_fps``. A row past the video's last frame and past this too (by more than the tolerance) has a time its place
    #: in the episode does not explain (timestamps that start a frame late, as GR00T's, or wall-clock ones): the video
    #: is not short.
    last_row_s: float | None = None
    #: The episode's ``from_timestamp`` in meta/episodes, in seconds: said with its end where that end is past the
    #: file's frames, or past the next episode's start.
    from_timestamp_s: float | None = None
    #: Where the episode before it in its video file ends by its rows (``from_timestamp + length / fps``; None where
    #: no episode read precedes it there), asked only as a failed lookup is said: the file's frames from there to this
    #: episode's ``from_timestamp``, which no episode reads, tell a late ``from_timestamp`` from a file cut short.
    previous_end_s: Callable[[], float | None] | None = None

    def __post_init__(self) -> None:
        if self.episode_index is not None and (isinstance(self.episode_index, bool) or self.episode_index < 0):
            raise ValueError(f"episode_index must be a non-negative int or None, got {self.episode_index!r}.")

    def describe(self) -> str:
        parts = []
        if self.dataset:
            parts.append(f"dataset {self.dataset}")
        if self.episode_index is not None:
            parts.append(f"episode {self.episode_index}")
        if self.camera:
            parts.append(f"camera {self.camera}")
        return ", ".join(parts)


def frame_index_timestamps_s(frame_indices: ArrayLike, *, fps: float) -> np.ndarray:
    """Episode-local times ``frame_index / fps`` (the :attr:`TimestampSource.FRAME_INDEX` opt-in)."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive finite number, got {fps!r}.")
    indices = np.asarray(frame_indices)
    if indices.size and (not np.issubdtype(indices.dtype, np.integer) or indices.min() < 0):
        raise ValueError(f"frame_indices must be non-negative integers, got {indices!r}.")
    return indices.astype(np.float64) / float(fps)


def nearest_frame_indices(
    index: PacketIndex,
    query_s: ArrayLike,
    *,
    tolerance_s: float,
    context: FrameRequestContext | None = None,
    episode_span_s: tuple[float, float | None] | None = None,
    rounding_s: ArrayLike = 0.0,
) -> np.ndarray:
    """Display index of the frame nearest each absolute query time (ties go to the earlier frame).

    A tie is two frames whose distances differ by less than :data:`TIE_FRACTION` of a frame interval plus a float32
    step at the query's time: parquet timestamps are float32, so a query exactly between two frames (10 fps data
    over 25 fps video) lands up to half a step (15 us at 10 min, 122 us at 1 h) to either side, and a strict
    comparison would pick frames by rounding noise.

    ``episode_span_s`` ``(from_s, to_s)``: the episode's part of the file, ``to_s`` where the next episode of the
    file starts (None: to the end). Files that hold several episodes put the next one's first frame right after this
    one's last, so a row past the episode's video would silently read the neighbour's frame within any tolerance;
    frames more than half an interval outside the span raise instead (:func:`episode_frames` says which frames are
    the episode's).

    ``rounding_s``: how far each query may lie from its row's time through the way the time is stored (half a float32
    step: ``_stored_time_rounding_s``), allowed on top of ``tolerance_s``.

    Raises FrameTimestampError when any ``|pts - query| > tolerance_s + rounding_s`` (or a query is not finite), or
    a frame falls outside ``episode_span_s``, naming the request, the worst query and the nearest pts;
    FrameRequestError for an empty request.
    """
    check_seconds("tolerance_s", tolerance_s)
    queries = np.asarray(query_s, dtype=np.float64).reshape(-1)
    if queries.size == 0:
        raise FrameRequestError(
            f"{_where(index, context)}: the request holds no timestamps; ask for at least one frame."
        )
    nearest, error_s = _nearest(index, queries)
    if not (error_s <= tolerance_s).all():  # also catches NaN queries, whose errors compare false
        allowed_s = tolerance_s + np.asarray(rounding_s, dtype=np.float64)
        if not (error_s <= allowed_s).all():
            _raise_out_of_tolerance(index, context, queries, nearest, error_s, tolerance_s, allowed_s)
    if episode_span_s is not None:
        _check_within_episode(index, context, queries, nearest, episode_span_s)
    return nearest


def _nearest(index: PacketIndex, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query time (float64 seconds), the display index of the nearest frame a decode shows (ties to the earlier;
    never one the edit list hides, which no decoder shows: LeRobot's neither) and how far its pts is from the query,
    unchecked."""
    frame_s = index.shown_pts_s
    upper = np.searchsorted(frame_s, queries, side="left")
    np.minimum(upper, len(frame_s) - 1, out=upper)
    lower = np.maximum(upper - 1, 0)
    lower_error_s = np.abs(frame_s[lower] - queries)
    upper_error_s = np.abs(frame_s[upper] - queries)
    # (the step at the file time: at least the step at the episode's time, which a float32 timestamp was rounded to)
    tie_s = TIE_FRACTION * index.frame_interval_s + _float32_step_s(queries)
    take_lower = lower_error_s <= upper_error_s + tie_s
    error_s = np.where(take_lower, lower_error_s, upper_error_s)
    nearest = np.where(take_lower, lower, upper).astype(np.int64)
    return nearest + index.shown.start, error_s


def episode_frames(index: PacketIndex, from_s: float, to_s: float | None) -> range:
    """Display indices of the frames of ``index`` that belong to the episode at ``[from_s, to_s)`` of the file,
    ``to_s`` where the next episode of the file starts (its ``from_timestamp``; None: no episode follows).

    Frames within half an interval of ``from_s`` count as the episode's; those from half an interval before ``to_s``
    on are the next episode's. Frames the file's edit list hides are no episode's (no decoder shows them).
    The lookup's check and the prefetch's byte span both use this, so what one accepts the other fetches.
    """
    half_interval_s = 0.5 * index.frame_interval_s
    seconds = index.shown_pts_s  # (the frames an edit list hides are no episode's: no decoder shows them)
    first = int(np.searchsorted(seconds, from_s - half_interval_s, side="left"))
    stop = len(seconds) if to_s is None else int(np.searchsorted(seconds, to_s - half_interval_s, side="left"))
    return range(index.shown.start + first, index.shown.start + stop)


def _check_within_episode(
    index: PacketIndex,
    context: FrameRequestContext | None,
    queries: np.ndarray,
    nearest: np.ndarray,
    span_s: tuple[float, float | None],
) -> None:
    from_s, to_s = span_s
    frames = episode_frames(index, from_s, to_s)
    outside = (nearest < frames.start) | (nearest >= frames.stop)
    if not outside.any():
        return
    worst = int(np.argmax(outside))
    pts_s = index.frame_pts_s[nearest]
    end = "the end of the file" if to_s is None else f"{to_s:.6f} s, where the next episode of the file starts"
    raise FrameTimestampError(
        f"{_where(index, context)}: query timestamp {queries[worst]:.6f} s reads video frame {int(nearest[worst])} "
        f"at {pts_s[worst]:.6f} s, outside this episode's part of the file ({from_s:.6f} s to {end}; "
        f"{int(outside.sum())} of {queries.size} queries): "
        f"{_outside_cause(bool(nearest[worst] < frames.start), index, context, to_s)}"
    )


def _outside_cause(
    before: bool, index: PacketIndex, context: FrameRequestContext | None, next_from_s: float | None
) -> str:
    """Why a row's frame lies outside its episode's part of the file: ``before`` its start, or past its end (where
    ``next_from_s``, the next episode of the file, starts; None: the end of the file)."""
    if before:
        return (
            "that frame belongs to a neighbouring episode, the one before it in the file: the episode's rows' "
            "timestamps or its from_timestamp in meta/episodes are wrong."
        )
    late = _late_past_next(index, context, next_from_s)
    if late:
        return late
    return (
        "that frame belongs to a neighbouring episode, the next in the file (from its from_timestamp on). The "
        "episode's data rows run past its video (the video holds fewer frames than its rows), or the rows' "
        "timestamps or a from_timestamp in meta/episodes are wrong."
    )


def _raise_out_of_tolerance(
    index: PacketIndex,
    context: FrameRequestContext | None,
    queries: np.ndarray,
    nearest: np.ndarray,
    error_s: np.ndarray,
    tolerance_s: float,
    allowed_s: np.ndarray,
) -> None:
    where = _where(index, context)
    if not np.isfinite(queries).all():
        bad = float(queries[~np.isfinite(queries)][0])
        raise FrameTimestampError(f"{where}: query timestamp {bad} s is not a finite number.")
    frame_s = index.shown_pts_s
    failing = error_s > allowed_s
    worst = int(np.argmax(np.where(failing, error_s, -1.0)))
    past_end = bool(queries[worst] > frame_s[-1])
    hidden_s = _hidden_frame_near(index, float(queries[worst]), tolerance_s)
    cut_short = _cut_short(index, context) if past_end else ""
    worst_allowed_s = float(np.broadcast_to(allowed_s, queries.shape)[worst])
    last_row_s = _last_row_passed_s(context, float(queries[worst]), worst_allowed_s) if past_end else None
    if hidden_s is not None:
        advice = (
            f"The video holds a frame at {hidden_s:.6f} s, but its edit list hides it: FFmpeg decodes it only as a "
            "reference for the frames shown and never shows it, nor does any other decoder (LeRobot's neither). The "
            "video was most likely cut from a longer recording without re-encoding, and the episode's rows are the "
            "recording's: check the episode's from_timestamp in meta/episodes, or leave the episode out with "
            "episodes=[...]."
        )
    elif queries[worst] < frame_s[0]:  # (a higher tolerance_s would read the first frames for the wrong rows)
        advice = (
            f"The row lies before the video's first frame ({frame_s[0]:.6f} s): the video starts later than the "
            "episode's rows (a stream cut from a longer recording, or B-frames muxed without an edit list, which "
            "delays every frame by the reorder delay). Set the episode's videos/<camera>/from_timestamp in "
            "meta/episodes to the time its first row's frame has in the file, or write the video again with its "
            "first frame at 0 s."
        )
    elif cut_short:
        advice = cut_short
    elif context is not None and context.by_frame_index and past_end:
        advice = (
            "The rows are looked up by frame_index / fps and this one lies past the video's last frame: the video "
            "holds fewer frames than the episode has rows (re-encode it, or leave the episode out with episodes=)."
        )
    elif context is not None and context.by_frame_index:
        advice = (
            "The rows are looked up by frame_index / fps: check the episode's from_timestamp in meta/episodes, and "
            "that the video's frame rate is info.json's fps."
        )
    elif last_row_s is not None:
        advice = (
            "The row lies past the video's last frame and past where the episode's last row belongs "
            f"({last_row_s:.6f} s: length - 1 rows at info.json's fps after its from_timestamp), so its "
            "timestamp is off, not the video: the parquet timestamps do not count from 0 in steps of 1 / fps (they "
            f"start late, e.g. a frame late, or are wall-clock time). Look frames up by frame_index / fps "
            f"({_BY_FRAME_INDEX})."
        )
    elif past_end:  # (a higher tolerance_s would read the last frame again for this row: a wrong frame)
        advice = (
            "The row lies past the video's last frame: the video holds fewer frames than the episode has rows "
            "(re-encode it, or leave the episode out with episodes=), or the parquet timestamps are wall-clock time "
            f"(look frames up by frame_index / fps: {_BY_FRAME_INDEX})."
        )
    else:
        advice = (
            "If the dataset's parquet timestamps are wall-clock time, look frames up by frame_index / fps "
            f"({_BY_FRAME_INDEX}); otherwise check the episode's from_timestamp or raise tolerance_s."
        )
    half_frame_s = float(np.median(np.diff(frame_s))) / 2 if frame_s.size > 1 else 0.0
    rows_fps = context.rows_fps if context is not None else None
    video_has_more_frames = bool(rows_fps and half_frame_s and 0.5 / half_frame_s > MORE_FRAMES * rows_fps)
    tick_s, tick_name = _frame_time_step(index)
    if hidden_s is not None or cut_short:
        pass  # (no frame rate or rounding explains a frame the edit list hides, or frames missing: the advice above)
    # e.g. 30 fps on a millisecond clock (an MKV remuxed to MP4, a recorder's clock): frames up to 0.5 ms off
    elif _rounded_frame_times(error_s[failing], tick_s / 2, half_frame_s, tolerance_s):
        advice = (
            f"The video's frame times are whole multiples of {tick_name}, so each frame lies up to "
            f"{tick_s / 2:.4g} s from the exact time of its row. Raise tolerance_s to {tick_s / 2 + 1e-4:.4g} "
            f"(on the command line --tolerance-s {tick_s / 2 + 1e-4:.4g}; still far below half a frame, so no row "
            "reads a neighbouring frame)."
        )
    # e.g. 10 fps rows over 25 fps video: every other row lies exactly halfway (wall-clock rows only near it)
    elif video_has_more_frames and abs(error_s[worst] - half_frame_s) <= max(tolerance_s, 1e-4):
        advice = (
            f"The row lies halfway between two video frames: the video has more frames per second "
            f"({0.5 / half_frame_s:.4g}) than the rows ({rows_fps:g}). Raise tolerance_s to "
            f"{half_frame_s + 1e-4:.4g} (half a video frame; on the command line --tolerance-s "
            f"{half_frame_s + 1e-4:.4g}) to read the earlier of the two."
        )
    elif rows_fps and half_frame_s and 0.5 / half_frame_s < FEWER_FRAMES * rows_fps:
        # (a higher tolerance_s or frame_index / fps would read some frames for two rows: wrong frames)
        advice = (
            f"The video has fewer frames per second ({0.5 / half_frame_s:.4g}) than info.json's fps ({rows_fps:g}), "
            "so some rows have no frame of their own: re-encode the video from its source at info.json's fps, or "
            "correct info.json's fps if the rows too are at the video's rate."
        )
    elif rows_fps and (stream_fps := _other_stream_rate(index, rows_fps, max(tick_s, tolerance_s))) is not None:
        by_frame_index = context is not None and context.by_frame_index
        advice = _rate_mismatch(stream_fps, rows_fps, float(error_s[worst]), half_frame_s, by_frame_index)
    raise FrameTimestampError(
        f"{where}: query timestamp {queries[worst]:.6f} s has no video frame within "
        f"tolerance_s={tolerance_s} (nearest frame {int(nearest[worst])} at "
        f"{index.frame_pts_s[nearest[worst]]:.6f} s, off by {error_s[worst]:.6f} s; {int(failing.sum())} of "
        f"{queries.size} queries fail; the video spans {frame_s[0]:.6f}-{frame_s[-1]:.6f} s). {advice}"
    )


def _other_stream_rate(index: PacketIndex, rows_fps: float, drift_s: float) -> float | None:
    """The frame rate of ``index``'s stream where it is not ``rows_fps`` (the rows' drift from the frames over the
    file exceeds ``drift_s``: the frame times' rounding, or the tolerance) and is up to :data:`MORE_FRAMES` times it;
    None where it is ``rows_fps``, or the frames are not evenly spaced (to within two steps of their times' rounding,
    and less than half a frame: frames dropped, or wall-clock times), which have no one rate. (A time base as coarse
    as a frame, an AVI's ``1/fps``, rounds a dropped frame's gap to two steps.)"""
    frame_s = index.shown_pts_s
    if frame_s.size < 2:
        return None
    step_s, _ = _frame_time_step(index)
    intervals_s = np.diff(frame_s)
    spread_s = float(np.ptp(intervals_s))
    if spread_s > 2 * step_s * (1 + 1e-6) or spread_s >= float(np.median(intervals_s)) / 2:
        return None
    span_s = float(frame_s[-1] - frame_s[0])
    stream_fps = (frame_s.size - 1) / span_s
    if abs(span_s - (frame_s.size - 1) / rows_fps) <= drift_s or stream_fps > MORE_FRAMES * rows_fps:
        return None
    return stream_fps


def _rate_mismatch(stream_fps: float, rows_fps: float, off_s: float, half_frame_s: float, by_frame_index: bool) -> str:
    """The advice for rows at ``rows_fps`` (info.json's) over a video stream at another ``stream_fps``: the row that
    failed is ``off_s`` from its nearest frame; ``by_frame_index``: rows are looked up by frame_index / fps already."""
    drift_ms = abs(1 / stream_fps - 1 / rows_fps) * 1e3
    by_index = "" if by_frame_index else f" and look frames up by frame_index / fps ({_BY_FRAME_INDEX})"
    return (
        f"The video's stream runs at {stream_fps:.4g} fps (its frames' timestamps), but info.json's fps is "
        f"{rows_fps:g}: the rows drift from their frames by {drift_ms:.3g} ms a frame ({off_s:.6f} s at this row), so "
        f"raising tolerance_s only moves the failure later, and from half a frame ({half_frame_s:.4g} s) on each "
        f"row reads another row's frame. Write the video again at {rows_fps:g} fps, frame k at k / {rows_fps:g} s "
        f"({REWRITE_AT_RATE.format(fps=rows_fps)}); or, if the "
        f"episode was recorded at the video's rate, set info.json's fps to {stream_fps:.10g}{by_index}."
    )


def _rows_by_metadata(context: FrameRequestContext | None) -> tuple[float, float, int, float] | None:
    """The episode's ``from_timestamp``, its end by its rows (``from_timestamp + length / fps``), its length and the
    rows' fps, where the context knows them all."""
    if context is None or context.from_timestamp_s is None or context.episode_end_s is None or not context.rows_fps:
        return None
    from_s, end_s, fps = context.from_timestamp_s, context.episode_end_s, context.rows_fps
    return from_s, end_s, round((end_s - from_s) * fps), fps


def _start_to_correct(context: FrameRequestContext | None) -> str:
    camera = context.camera if context is not None and context.camera else "<camera>"
    return f"{CORRECT_START.format(camera=camera)}."


def _late_past_next(index: PacketIndex, context: FrameRequestContext | None, next_from_s: float | None) -> str:
    """The advice for rows past the episode's part of the file where its end by meta/episodes (``from_timestamp +
    length / fps``) lies past ``next_from_s``, where the next episode of the file starts: the file's frames go on
    there, so the file is not short; a ``from_timestamp`` (or the episode's rows) is what is wrong. "" where it does
    not, or the values are not known."""
    rows = _rows_by_metadata(context)
    if rows is None or next_from_s is None:
        return ""
    from_s, end_s, length, fps = rows
    if not end_s > next_from_s + 0.5 * min(index.frame_interval_s, 1 / fps):
        return ""  # (the rows' own timestamps run past: the generic advice)
    over = max(round((end_s - next_from_s) * fps), 1)
    frames = counted(over, "frame")
    start_s = next_from_s - length / fps  # (where this episode would start to end where the next starts)
    if start_s < float(index.shown_pts_s[0]) - 0.5 * index.frame_interval_s:  # (before the file's first frame)
        cause = f"the next episode's from_timestamp is most likely {frames} early ({end_s:.6f} s, where these rows end)"
    elif _unread_before(index, context, from_s)[0] >= over:  # (the file's frames before it are no episode's)
        cause = (
            f"this episode's from_timestamp is most likely {frames} late ({start_s:.6f} s ends its rows where the next "
            f"episode starts: the file's frames from where the episode before it ends are no episode's)"
        )
    else:
        cause = (
            f"this episode's from_timestamp is {frames} late ({start_s:.6f} s ends its rows where the next episode "
            f"starts), or the next episode's {frames} early ({end_s:.6f} s)"
        )
    return (
        f"that frame belongs to a neighbouring episode, the next in the file (from its from_timestamp "
        f"{next_from_s:.6f} s on). By meta/episodes this episode's {counted(length, 'row')} at {fps:g} fps from its "
        f"from_timestamp {from_s:.6f} s end at {end_s:.6f} s, {frames} past that start, where the file's frames go "
        f"on: the video is not short, meta/episodes is: {cause}, or the episode has {counted(over, 'row')} more "
        f"than its part of the file holds frames. C{_start_to_correct(context)[1:]}"
    )


def _unread_before(index: PacketIndex, context: FrameRequestContext | None, from_s: float) -> tuple[int, float]:
    """How many of the file's frames lie between where the episode before this one in the file ends by its rows and
    this one's ``from_timestamp`` ``from_s``, which no episode reads, and where that one ends (0 and ``from_s`` where no
    episode read precedes it there)."""
    previous_end_s = context.previous_end_s() if context is not None and context.previous_end_s else None
    if previous_end_s is None:
        return 0, from_s
    half_interval_s = 0.5 * index.frame_interval_s
    seconds = index.shown_pts_s
    between = (seconds >= previous_end_s - half_interval_s) & (seconds < from_s - half_interval_s)
    return int(np.count_nonzero(between)), previous_end_s


def _late_before_end(index: PacketIndex, context: FrameRequestContext | None, missing: int) -> str:
    """The advice for rows ``missing`` frames past the end of the file where the file holds at least as many frames
    that no episode reads right before the episode's ``from_timestamp``, from where the episode before it in the file
    ends by its rows: its ``from_timestamp`` is late, the file not cut short. "" where it does not, or the values are
    not known (no episode read precedes it in the file)."""
    rows = _rows_by_metadata(context)
    if rows is None:
        return ""
    from_s, end_s, length, fps = rows
    unread, previous_end_s = _unread_before(index, context, from_s)
    if unread < missing:
        return ""
    frames_end_s = float(index.shown_pts_s[-1]) + index.frame_interval_s
    frames = counted(missing, "frame")
    return (
        f"The video's frames end at {frames_end_s:.6f} s, before the episode's end at {end_s:.6f} s by meta/episodes "
        f"({counted(length, 'row')} at {fps:g} fps from its from_timestamp {from_s:.6f} s), {frames} short, but the "
        f"file is not cut short: its {counted(unread, 'frame')} from {previous_end_s:.6f} s, where the episode before "
        "it in the file ends (its from_timestamp + its length / fps), to this episode's from_timestamp are no "
        f"episode's. The episode's from_timestamp in meta/episodes is most likely {frames} late "
        f"({frames_end_s - length / fps:.6f} s ends its rows at the file's last frame), or the episode has "
        f"{counted(missing, 'row')} more than the file "
        f"holds frames: {_start_to_correct(context)}"
    )


def _cut_short(index: PacketIndex, context: FrameRequestContext | None) -> str:
    """The advice for a row past the video's last frame where the video's frames end more than half a frame before
    the episode's end in meta/episodes (the file lost its last frames: a cut between two fragments of a fragmented
    MP4, or between two GOPs, leaves nothing in the file that says it is short); "" where they do not, or the end is
    not known."""
    stated_s = context.episode_end_s if context is not None else None
    frames_end_s = float(index.shown_pts_s[-1]) + index.frame_interval_s
    if stated_s is None or not frames_end_s < stated_s - 0.5 * index.frame_interval_s:
        return ""
    missing = round((stated_s - frames_end_s) / index.frame_interval_s)
    frames = counted(missing, "frame")
    rows_fps, count = context.rows_fps if context is not None else None, int(index.shown_pts_s.size)
    if rows_fps and holds_a_frame_per_row(count, stated_s, rows_fps):
        # (as many frames as rows up to the episode's end, but closer together: a whole file written at another rate)
        return (
            f"The video's frames end at {frames_end_s:.6f} s, before the episode's end at {stated_s:.6f} s in "
            f"meta/episodes, but it holds {count} frames, a frame for each row up to that end at info.json's fps "
            f"({rows_fps:g}): its frames are {index.frame_interval_s:.6f} s apart ({1 / index.frame_interval_s:.4g} "
            f"fps), not 1 / {rows_fps:g} s. The file was written at another frame rate than its rows': write it "
            f"again at {rows_fps:g} fps, frame k at k / {rows_fps:g} s ({REWRITE_AT_RATE.format(fps=rows_fps)})."
        )
    late = _late_before_end(index, context, missing)
    if late:
        return late
    return (
        f"The video's frames end at {frames_end_s:.6f} s, before the episode's end at {stated_s:.6f} s in "
        f"meta/episodes (about {frames} missing): the video file is most likely truncated (a partial "
        "download or copy). Download or copy it again from the dataset's source; if it is whole (as large as the "
        "source's), the video holds fewer frames than the episode has rows: re-encode it, or leave the episode out "
        "with episodes=[...]."
    )


def _last_row_passed_s(context: FrameRequestContext | None, query_s: float, allowed_s: float) -> float | None:
    """Where the episode's last row belongs, if ``query_s`` lies more than ``allowed_s`` (the lookup's tolerance) after
    it (else, or unknown: None)."""
    if context is None or context.last_row_s is None:
        return None
    return context.last_row_s if query_s > context.last_row_s + allowed_s else None


def _hidden_frame_near(index: PacketIndex, query_s: float, tolerance_s: float) -> float | None:
    """The time of a frame the edit list hides within ``tolerance_s`` of ``query_s`` (None if there is none)."""
    if index.hidden is None:
        return None
    frame_s = index.frame_pts_s
    near = np.flatnonzero(np.abs(frame_s - query_s) <= tolerance_s)
    return float(frame_s[near[0]]) if near.size else None


def _frame_time_step(index: PacketIndex) -> tuple[float, str]:
    """The step the video's frame times are rounded to, and its name: a millisecond where every frame time is a
    whole millisecond (MP4 stores a millisecond clock's times in a finer time base, e.g. 1/16000), else the time
    base."""
    tick_s = float(index.time_base)
    if tick_s < 1e-3 and np.allclose(index.frame_pts_s * 1e3, np.round(index.frame_pts_s * 1e3), rtol=0, atol=1e-6):
        return 1e-3, "a millisecond"
    return tick_s, f"the video's time base ({index.time_base} s)"


def _rounded_frame_times(errors_s: np.ndarray, half_tick_s: float, half_frame_s: float, tolerance_s: float) -> bool:
    """Whether every failing row is off by no more than the frame times' rounding (half a tick, plus the float32
    slack of ``max(tolerance_s, 1e-4)``), a rounding above ``tolerance_s`` and well below half a frame."""
    if not (tolerance_s < half_tick_s < 0.25 * half_frame_s):
        return False
    return bool((errors_s <= half_tick_s + max(tolerance_s, 1e-4)).all())


def _where(index: PacketIndex, context: FrameRequestContext | None) -> str:
    described = context.describe() if context is not None else ""
    return f"{described} ({index.source_name})" if described else index.source_name


def row_frame_numbers(
    reader: LeRobotDatasetReader,
    episode_pos: int,
    camera: str,
    rows: Mapping[str, np.ndarray],
    row_indices: np.ndarray,
    index: PacketIndex,
    *,
    timestamp_source: TimestampSource,
    tolerance_s: float,
    video: VideoRef | None = None,
) -> np.ndarray:
    """Display frame numbers, in the camera's video file, of rows ``row_indices`` of one episode (``rows`` as
    ``reader.read_episode`` gives them): each row's time (its parquet ``timestamp``, or ``frame_index / fps``)
    after the episode's ``from_timestamp``, within ``tolerance_s`` and the episode's part of the file.
    ``timestamp_source`` and ``tolerance_s`` give way to the episode's dataset's own (``reader.frame_lookup``).
    ``video``: ``reader.video(episode_pos, camera)`` where the caller has it (a batch asks once per episode)."""
    if video is None:
        video = reader.video(episode_pos, camera)
    timestamp_source, tolerance_s = reader.frame_lookup(episode_pos).over(timestamp_source, tolerance_s)
    length = int(reader.episodes.length[episode_pos])
    context = FrameRequestContext(
        dataset=reader.source_of(episode_pos),
        episode_index=int(reader.episodes.episode_index[episode_pos]),
        camera=camera,
        rows_fps=reader.fps,
        by_frame_index=timestamp_source is TimestampSource.FRAME_INDEX,
        episode_end_s=video.from_timestamp_s + length / reader.fps,
        last_row_s=video.from_timestamp_s + (length - 1) / reader.fps,
        from_timestamp_s=video.from_timestamp_s,
        previous_end_s=partial(reader.previous_end_s, episode_pos, camera),
    )
    local_s = _local_times_s(reader, rows, row_indices, timestamp_source, episode_pos)
    by_timestamp = timestamp_source is not TimestampSource.FRAME_INDEX  # (frame_index / fps is float64: exact)
    return nearest_frame_indices(
        index,
        video.from_timestamp_s + local_s,
        tolerance_s=tolerance_s,
        context=context,
        episode_span_s=(video.from_timestamp_s, video.next_from_timestamp_s),
        rounding_s=_stored_time_rounding_s(rows["timestamp"][row_indices]) if by_timestamp else 0.0,
    )


def _local_times_s(
    reader: LeRobotDatasetReader,
    rows: Mapping[str, np.ndarray],
    row_indices: np.ndarray,
    source: TimestampSource,
    episode_pos: int,
) -> np.ndarray:
    """Episode-local times (float64 seconds) of rows ``row_indices`` of episode ``episode_pos``, by ``source``."""
    if source is not TimestampSource.FRAME_INDEX:
        return rows["timestamp"][row_indices].astype(np.float64)
    frame_index = np.asarray(rows["frame_index"][row_indices])
    fault = _frame_index_fault(frame_index, np.asarray(rows["frame_index"]))
    if fault:
        episode = FrameRequestContext(
            dataset=reader.source_of(episode_pos), episode_index=int(reader.episodes.episode_index[episode_pos])
        )
        raise DataFileError(
            f"{episode.describe()}: column 'frame_index' of {reader.data_path(episode_pos)} {fault}, and the video "
            "is looked up by frame_index / fps (timestamp_source='frame_index'): fix the data file, or look frames "
            "up by the parquet timestamps"
        )
    return frame_index_timestamps_s(frame_index, fps=reader.fps)


def _frame_index_fault(wanted: np.ndarray, frame_index: np.ndarray) -> str:
    """What is wrong with the frame numbers to look an episode's rows up by: a negative one (the least of those
    ``wanted``, else of the episode's ``frame_index`` column; frame_index_timestamps_s' own ValueError named neither
    the episode nor the file), or one of the column not above the row before's: a repeated number reads one frame
    for two rows, one that goes back reads swapped frames, either in silence (LeRobot numbers an episode's rows 0, 1,
    2, ...), or a column not of integers (a float one raised frame_index_timestamps_s' bare ValueError too). "" where
    none."""
    if not wanted.size:
        return ""
    if not np.issubdtype(frame_index.dtype, np.integer):
        return f"is {frame_index.dtype}, not integer frame numbers"
    if wanted.min() < 0:
        return f"holds {int(wanted.min())}, a negative frame number"
    return _column_fault(frame_index)


#: :func:`_column_fault`'s answer per column, by the column's ``id`` while it lives (a finalizer drops it as the
#: column goes): a batch looks up rows of an episode whose rows it read once, and the column's check, O(episode) at
#: each lookup, took 33 us of a 20,000-row episode's 63 us per sample.
_COLUMN_FAULTS: dict[int, str] = {}


def _column_fault(frame_index: np.ndarray) -> str:
    """:func:`_frame_index_fault` of the whole ``frame_index`` column, worked out once per column."""
    key = id(frame_index)
    fault = _COLUMN_FAULTS.get(key)
    if fault is None:
        fault = _steps_fault(frame_index)
        try:
            weakref.finalize(frame_index, _COLUMN_FAULTS.pop, key, None)
        except TypeError:  # (not weakly referenceable: worked out at each lookup)
            return fault
        _COLUMN_FAULTS[key] = fault
    return fault


def _steps_fault(frame_index: np.ndarray) -> str:
    if frame_index.min() < 0:
        return f"holds {int(frame_index.min())}, a negative frame number"
    steps = np.diff(frame_index.astype(np.int64, copy=False))  # (unsigned numbers that go back wrap around)
    if (steps > 0).all():
        return ""
    row = int(np.flatnonzero(steps <= 0)[0]) + 1
    before, value = int(frame_index[row - 1]), int(frame_index[row])
    if value == before:
        return f"repeats frame {value} at its row {row} (two rows would read one frame)"
    return f"goes back at its row {row} ({before} then {value}: rows would read each other's frames)"


def _float32_step_s(seconds: np.ndarray) -> np.ndarray:
    """The distance between consecutive float32 values at each of ``seconds`` (float64; computed in float64, as
    float64's step times 2**29, so no value overflows a cast)."""
    return np.spacing(np.abs(seconds)) * 2.0**29


def _stored_time_rounding_s(stored_s: np.ndarray) -> np.ndarray | float:
    """How far each of ``stored_s`` (a parquet ``timestamp`` column's values) may lie from the time it stands for:
    half a float32 step where they are float32, as LeRobot writes them (0 for float64). From 2,048 s on, half a step
    (122 us) is more than the default ``tolerance_s`` (100 us): 6,208 of the 108,000 rows of a one-hour episode at
    30 fps, each at its frame's time, missed their frames by it, while LeRobot (which rounds the frame times to float32
    as well) reads them all. Half a step stays far below half a frame (at 1 h: 122 us), so no row reads another."""
    if stored_s.dtype != np.float32:
        return 0.0
    return _float32_step_s(stored_s.astype(np.float64)) / 2


#: One episode's part of a file lookup: ``(episode_pos, rows, row_indices, video)`` as :func:`row_frame_numbers`
#: takes them.
EpisodeRows = tuple[int, Mapping[str, np.ndarray], np.ndarray, "VideoRef"]


def file_frame_numbers(
    reader: LeRobotDatasetReader,
    camera: str,
    index: PacketIndex,
    episodes: Sequence[EpisodeRows],
    *,
    timestamp_source: TimestampSource,
    tolerance_s: float,
) -> list[np.ndarray]:
    """:func:`row_frame_numbers` of each of ``episodes``, whose frames are in one video file (``index``'s), found in
    one lookup of all their rows: the array calls of a lookup per episode (~36 us each) were most of a batch's
    frame lookup. Where any row fails, each episode is looked up alone, so the first to fail raises as it would
    alone."""
    try:
        found = _lookup_together(reader, index, episodes, timestamp_source, tolerance_s)
    except ValueError:  # (a bad frame_index or tolerance: raised below in episode order, with the rows' own)
        found = None
    if found is not None:
        return found
    alone = partial(row_frame_numbers, timestamp_source=timestamp_source, tolerance_s=tolerance_s)
    return [
        alone(reader, pos, camera, rows, row_indices, index, video=video) for pos, rows, row_indices, video in episodes
    ]


def _lookup_together(
    reader: LeRobotDatasetReader,
    index: PacketIndex,
    episodes: Sequence[EpisodeRows],
    timestamp_source: TimestampSource,
    tolerance_s: float,
) -> list[np.ndarray] | None:
    """Each episode's frame numbers, or None where any row misses its frame or its episode's part of the file."""
    queries, tolerances, firsts, stops = [], [], [], []
    for pos, rows, row_indices, video in episodes:
        source, tolerance = reader.frame_lookup(pos).over(timestamp_source, tolerance_s)
        queries.append(video.from_timestamp_s + _local_times_s(reader, rows, row_indices, source, pos))
        tolerances.append(check_seconds("tolerance_s", tolerance))
        frames = episode_frames(index, video.from_timestamp_s, video.next_from_timestamp_s)
        firsts.append(frames.start)
        stops.append(frames.stop)
    counts = [len(q) for q in queries]
    if not queries or 0 in counts:
        return None
    nearest, error_s = _nearest(index, np.concatenate(queries).astype(np.float64, copy=False))
    # (false for a NaN query too; and for a float32 time that its rounding alone puts past tolerance_s, from 2,048 s
    # into an episode on, which its episode's own lookup allows for)
    held = error_s <= np.repeat(tolerances, counts)
    held &= (nearest >= np.repeat(firsts, counts)) & (nearest < np.repeat(stops, counts))
    if not held.all():
        return None
    bounds = [0, *itertools.accumulate(counts)]  # (np.split's views, without its array calls)
    return [nearest[start:stop] for start, stop in itertools.pairwise(bounds)]
