"""Each surveyed video file's frame rate and end, held to its episodes' rows when the iterator is built.

The iterator looks up only its first episode's first and last rows in their frames when it is built. A later file
written at another frame rate than the rows, or whose frames end before its last episode's rows do (a
``from_timestamp`` or length in meta/episodes that is wrong, a recording cut short), failed when a batch first reached
one of its rows, maybe hours into training. Each file's header, read anyway to survey the camera
(:mod:`.camera_codecs`), says its rate and where its frames end: enough to refuse such a file when the iterator is
built, naming it, its episode and what to do. Within a file, an episode's rows running into the next episode's part
(a from_timestamp two frames late, a length one too long) are refused from the metadata alone. All of it is held to
info.json's fps, which the first episode's rows' timestamps were held to before (an fps they refuse is said first).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from .errors import FrameTimestampError
from .wording import counted, first_named

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .camera_codecs import CameraSurvey, FileFormat
    from .dataset_reader import LeRobotDatasetReader
    from .frame_lookup import TimestampSource

__all__ = [
    "CORRECT_START",
    "FEWER_FRAMES",
    "MORE_FRAMES",
    "RATE_SLACK",
    "REWRITE_AT_RATE",
    "check_file_timing",
    "check_rows_fit_parts",
    "holds_a_frame_per_row",
]

#: A video whose frame rate is under this fraction of the rows' fps has fewer frames than the rows.
FEWER_FRAMES = 0.99
#: A video whose frame rate is over this multiple of the rows' fps has more frames than the rows: a row may lie
#: between two of them (10 fps rows over 25 fps video), which a wider tolerance_s reads. Up to it, a rate other than
#: the rows' is a mismatch (29.97 fps video, 30 fps rows), which it does not.
MORE_FRAMES = 1.2
#: How far a file's rate may be from the rows' fps before the file is refused when the iterator is built: a header's
#: rate is FFmpeg's guess (or its average, frames over duration, which a last frame held longer moves), a remote
#: file's the mean over its frames' times (a WebM's rounded to milliseconds). The lookup, on each frame's time, finds
#: a 29.97 fps file among 30 fps rows when a batch reaches it.
RATE_SLACK = 0.01

#: How the advice says to write a file again at the rows' rate (here and in the lookup's, :mod:`.frame_lookup`).
REWRITE_AT_RATE = "e.g. ffmpeg -i <video> -vf 'setpts=N/({fps:g}*TB)' -r {fps:g} <new video>"
#: How the advice says to correct a from_timestamp (here and in the lookup's).
CORRECT_START = "correct videos/{camera}/from_timestamp in meta/episodes, or leave the episode out with episodes=[...]"


def check_file_timing(
    reader: LeRobotDatasetReader,
    survey: CameraSurvey,
    *,
    timestamp_source: TimestampSource,
    tolerance_s: float,
    unread_tail: int = 0,
) -> None:
    """Raise FrameTimestampError naming ``survey``'s files (a camera's, :func:`~.camera_codecs.survey_camera`) whose
    header says their frames cannot meet their rows: written at another rate than the rows' fps (slower, or faster
    by less than :data:`MORE_FRAMES`), or ending before the last episode of the file has its last row's frame, or
    where an episode's rows run into the next one's part of a file (:func:`check_rows_fit_parts`).

    A file's last episode's last row lies at ``from_timestamp + (length - 1) / fps`` (LeRobot writes frame ``i`` of
    an episode at ``i / fps``); it is refused where that lies past the file's end by more than half a frame and the
    lookup's tolerance, which no lookup reads. The end is where the last frame's display ends, as the header says: up
    to a frame early where a remux lost the last packet's duration, so a file a frame short is left to the lookup,
    which tells it when a batch reaches that row (``timestamp_source`` and ``tolerance_s``: the iterator's,
    which a union's dataset may override; rows read by ``frame_index`` are at ``i / fps`` too). ``unread_tail``: the
    rows at each episode's end whose frames no sample reads (``drop_n_last_frames`` beyond the camera's window), which
    are held to nothing: LeRobot never reads them either."""
    fps = reader.fps
    odd_rate = [
        (path, f) for path, f in survey.formats.items() if f.rate is not None and not _rate_meets_rows(f.rate, fps)
    ]
    if odd_rate:
        raise FrameTimestampError(_rate_refusal(survey, odd_rate, fps))
    rates = {path: f.rate for path, f in survey.formats.items() if f.rate is not None}
    check_rows_fit_parts(reader, survey.camera, unread_tail=unread_tail, rates=rates)
    files = reader.episodes.cameras[survey.camera]
    lasts = np.flatnonzero(np.isnan(files.next_from_timestamp_s))  # (each file's last episode, of those read)
    short = []
    for pos in lasts.tolist():
        path = reader.video(pos, survey.camera).path
        f = survey.formats.get(path)
        if f is None or f.end_s is None:
            continue
        last_row = int(reader.episodes.length[pos]) - 1 - unread_tail
        if last_row < 0:
            continue
        last_row_s = float(files.from_timestamp_s[pos]) + last_row / fps
        _, tolerance = reader.frame_lookup(pos).over(timestamp_source, tolerance_s)
        if last_row_s - f.end_s > max(0.5 / (f.rate or fps), tolerance):
            short.append((path, pos, f, last_row_s))
    if short:
        raise FrameTimestampError(_end_refusal(reader, survey.camera, short, fps, unread_tail))


def check_rows_fit_parts(
    reader: LeRobotDatasetReader, camera: str, *, unread_tail: int = 0, rates: Mapping[str, float] | None = None
) -> None:
    """Raise FrameTimestampError (as the lookup did when a batch reached the row) naming the first of ``reader``'s
    episodes whose rows run past its part of its ``camera`` file into the next episode's: its last row, at
    ``from_timestamp + (length - 1) / fps``, lies less than half a frame before the next episode's start, so that row
    would read the next episode's frame (``unread_tail``: the rows at its end whose frames no sample reads, left out).
    A file's last episode is held to the file's end instead (:func:`check_file_timing`).

    Half a frame is at the file's own rate where ``rates`` (path -> frames a second, from the files' headers) holds
    it, as the lookup measures it on the file's frames: info.json's ``video.fps`` may be wrong (r1_v30_h264 declares
    10 for 25 fps files), too slow refusing rows that read their own frames, too fast passing rows that a batch then
    fails on. A file not surveyed is held to the faster of the rows' rate and the declared one."""
    fps, table = reader.fps, reader.episodes
    files = table.cameras[camera]
    read = table.length - unread_tail  # (rows whose frames a sample reads)
    last_s = files.from_timestamp_s + (read - 1) / fps
    ahead_s = files.next_from_timestamp_s - last_s  # (NaN, a file's last: compares False)
    # Half a frame is at most the rows' (a file within RATE_SLACK of them, or faster): only episodes within it of
    # the next one's start look up their file's rate.
    over = (read > 0) & (ahead_s < 0.5 / (fps * (1 - RATE_SLACK)))
    half_frame_s = np.zeros(len(read))
    for pos in np.flatnonzero(over).tolist():
        half_frame_s[pos] = _half_frame_s(reader, camera, pos, rates or {})
    over &= ahead_s < half_frame_s
    if not over.any():
        return
    pos = int(np.flatnonzero(over)[0])
    episode, length = int(table.episode_index[pos]), int(table.length[pos])
    start, end = float(files.from_timestamp_s[pos]), float(files.next_from_timestamp_s[pos])
    past = max(1, int(read[pos]) - int(np.floor((end - half_frame_s[pos] - start) * fps)) - 1)
    more = f" ({int(over.sum())} episodes in all)" if over.sum() > 1 else ""
    raise FrameTimestampError(
        f"{reader.source_of(pos)}: camera {camera!r}: episode {episode}'s rows run past its part of "
        f"{reader.video(pos, camera).path}{more}: its {counted(length, 'row')} at {fps:g} fps from its from_timestamp "
        f"{start:.6f} s{_last_row_said(unread_tail, float(last_s[pos]), ' end at')}, but the next episode of the "
        f"file starts at {end:.6f} s (its from_timestamp), so its last {'row' if past == 1 else f'{past} rows'}"
        f"{' read' if unread_tail else ''} would read that episode's frames. "
        f"{_wrong_start(reader, camera, pos, past, end_s=float(last_s[pos]) + 1 / fps)}"
    )


def _half_frame_s(reader: LeRobotDatasetReader, camera: str, pos: int, rates: Mapping[str, float]) -> float:
    """Half a frame of episode ``pos``'s ``camera`` file: at its rate in ``rates``, else at the faster of the rows'
    and info.json's declared one."""
    rate = rates.get(reader.video(pos, camera).path)
    return 0.5 / (reader.info.fastest_fps(camera) if rate is None else rate)


def _wrong_start(reader: LeRobotDatasetReader, camera: str, pos: int, over: int, *, end_s: float) -> str:
    """Which ``from_timestamp`` is most likely wrong where episode ``pos``'s rows run ``over`` rows into the next
    episode's part of its file (they end at ``end_s``): its own, late, where as many of the file's frames before it
    are no episode's (from where the episode before it ends by its rows); the next one's, early, where it could not
    start earlier (the file's start); else either, or its length."""
    fps = reader.fps
    start = float(reader.episodes.cameras[camera].from_timestamp_s[pos])
    rows = counted(over, "frame")
    if _unread_before(reader, camera, pos) >= over:
        return (
            f"Its from_timestamp in meta/episodes is most likely {rows} late ({start - over / fps:.6f} s ends its rows "
            f"where the next episode starts; the file's frames from where the episode before it ends are no "
            f"episode's): {CORRECT_START.format(camera=camera)}"
        )
    if start - over / fps < -0.5 / fps:
        return (
            f"The next episode's from_timestamp in meta/episodes is most likely {rows} early ({end_s:.6f} s, where "
            f"these rows end; this one cannot start earlier): {CORRECT_START.format(camera=camera)}"
        )
    return (
        "The video holds fewer frames for the episode than it has rows (a frame dropped as it was recorded: LeRobot's "
        "streaming encoder drops one where its queue stays full), or the episode's length or either from_timestamp "
        "in meta/episodes is wrong: leave the episode out with episodes=[...], or regenerate the episode metadata"
    )


def _unread_before(reader: LeRobotDatasetReader, camera: str, pos: int) -> int:
    """The rows' frames of the file between where the episode before episode ``pos`` in its file ends by its rows and
    ``pos``'s from_timestamp, which no episode reads (0 where none read precedes it there)."""
    previous_end_s = reader.previous_end_s(pos, camera)
    if previous_end_s is None:
        return 0
    return round((float(reader.episodes.cameras[camera].from_timestamp_s[pos]) - previous_end_s) * reader.fps)


def _last_row_said(unread_tail: int, last_s: float, plain: str) -> str:
    """Where an episode's last row read lies, said after its rows (``plain``, where every row is read)."""
    if not unread_tail:
        return f"{plain} {last_s:.6f} s"
    return (
        f", the last a sample reads at {last_s:.6f} s (its last {unread_tail} lie past every window: "
        "drop_n_last_frames)"
    )


def _rate_meets_rows(rate: float, fps: float) -> bool:
    """Whether frames at ``rate`` a second meet rows at ``fps``: the same rate (within :data:`RATE_SLACK`), or more
    than :data:`MORE_FRAMES` times it (every row has a frame near it)."""
    return abs(rate - fps) <= RATE_SLACK * fps or rate > MORE_FRAMES * fps


def _rate_refusal(survey: CameraSurvey, odd: list[tuple[str, FileFormat]], fps: float) -> str:
    camera = f"camera {survey.camera!r}"
    files = first_named(
        (f"{path} (episode {survey.episodes[path]}, {camera}) is written at {f.rate:.4g} fps" for path, f in odd),
        len(odd),
        "file",
    )
    fewer = any(f.rate is not None and f.rate < FEWER_FRAMES * fps for _, f in odd)
    why = "it has fewer frames than its rows" if fewer else "its frames drift off the rows' times"
    it, its = ("it", "its") if len(odd) == 1 else ("each", "their")
    return (
        f"{files} (its header), but the rows are at info.json's fps, {fps:g}: {why}, and rows would miss their "
        f"frames when a batch reaches them. Write {it} again at {fps:g} fps, frame k at k / {fps:g} s "
        f"({REWRITE_AT_RATE.format(fps=fps)}), or leave {its} episodes out with episodes=[...]"
    )


def _end_refusal(
    reader: LeRobotDatasetReader,
    camera: str,
    short: list[tuple[str, int, FileFormat, float]],
    fps: float,
    unread_tail: int,
) -> str:

    def name(path: str, pos: int, f: FileFormat, last_row_s: float) -> str:
        episode = int(reader.episodes.episode_index[pos])
        start = float(reader.episodes.cameras[camera].from_timestamp_s[pos])
        length = int(reader.episodes.length[pos])
        return (
            f"{path} (camera {camera!r}) ends at {f.end_s:.6f} s (its header{_at_rate(f)}), but episode {episode}, its "
            f"last, has {counted(length, 'row')} at {fps:g} fps from its from_timestamp {start:.6f} s"
            f"{_last_row_said(unread_tail, last_row_s, ', the last at')}"
        )

    named = first_named(itertools.starmap(name, short), len(short), "file")
    missing = [round((last_row_s + 1 / fps - (f.end_s or 0.0)) * fps) for _, _, f, last_row_s in short]
    if all(_unread_before(reader, camera, pos) >= n for (_, pos, _, _), n in zip(short, missing, strict=True)):
        # (the file holds as many frames no episode reads right before the episode: its start is late, not the file
        # short)
        start = float(reader.episodes.cameras[camera].from_timestamp_s[short[0][1]])
        return (
            f"{named}: the file is not cut short, its frames from where the episode before it ends "
            f"(its from_timestamp + its length / fps) to this episode's from_timestamp are no episode's: the "
            f"episode's from_timestamp in meta/episodes is most likely {counted(missing[0], 'frame')} "
            f"late ({start - missing[0] / fps:.6f} s ends its rows at the file's last frame): "
            f"{CORRECT_START.format(camera=camera)}"
        )
    if all(_as_many_frames_as_rows(f, last_row_s, fps) for _, _, f, last_row_s in short):
        # (a frame for each row up to the episode's end, but closer together: a whole file written at another rate)
        return (
            f"{named}: it holds a frame for each row up to that end, closer together than 1 / "
            f"{fps:g} s: written at another frame rate than its rows'. Write it again at {fps:g} fps, frame k at k / "
            f"{fps:g} s ({REWRITE_AT_RATE.format(fps=fps)}), or leave its episodes out with episodes=[...]"
        )
    return (
        f"{named}: the file lost its last frames (a partial download or copy: download or copy it "
        "again; one cut short when recorded: re-encode the episode from its frames), or the episode's length or "
        "from_timestamp in meta/episodes is wrong (regenerate the episode metadata); or leave the episode out with "
        "episodes=[...]"
    )


def _at_rate(f: FileFormat) -> str:
    return "" if f.rate is None else f": {f.rate:.4g} fps"


def _as_many_frames_as_rows(f: FileFormat, last_row_s: float, fps: float) -> bool:
    """Whether ``f`` holds as many frames (at its own rate) as there are rows at ``fps`` up to the one at
    ``last_row_s``: a file written at another rate, not one cut short."""
    if f.rate is None or f.end_s is None or abs(f.rate - fps) <= RATE_SLACK * fps:
        return False
    return holds_a_frame_per_row(round(f.end_s * f.rate), last_row_s + 1 / fps, fps)


def holds_a_frame_per_row(frames: int, rows_end_s: float, fps: float) -> bool:
    """Whether a file of ``frames`` frames holds one for each row at ``fps`` up to ``rows_end_s`` (the last row's time
    and a row's length): where its frames end sooner, it was written at another rate, not cut short."""
    return round(rows_end_s * fps) == frames
