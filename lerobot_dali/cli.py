"""``lerobot-dali``: inspect datasets, generate test datasets, diagnose decode routes, benchmark.

Imports are deferred to each verb so ``lerobot-dali --help`` answers instantly without loading DALI or torch.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import itertools
import json
import logging
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .bench_types import LOADERS
from .cli_options import (
    HELP_WIDTH,
    ArgumentParser,
    add_episode_pool_size,
    add_image_size,
    add_timestamp_source,
    add_tolerance_s,
    described,
    parse_size,
)
from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from .sample_order import DEFAULT_EPISODE_POOL_SIZE
from .value_checks import check_seconds
from .video_encoding import CODECS, DEFAULT_CRF, LONG_GOP_FRAMES
from .wording import counted

if TYPE_CHECKING:
    from .dataset_check import CheckReport, Problem
    from .dataset_reader import LeRobotDatasetReader, LocatedDataset
    from .errors import MissingDataFileError

__all__ = ["EXIT_STATUSES", "main"]

#: What each exit status of every verb means, as ``--help`` and the README's "Command line" say it.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (0, "done, and nothing wrong found"),
    (
        1,
        "done, and the dataset has problems, each listed (check's problems, info's cameras whose first video does not "
        "open, diagnose's failed decodes and cameras the iterator refuses, bench's failed loaders): a file this user "
        "may not read is listed as a damaged one is, however many there are",
    ),
    (
        2,
        "not done, said in one line: a bad option, a dataset that is not there or does not open (its metadata or first "
        "data file missing, damaged or refused; check goes on with the other datasets), an output refused (not new or "
        "empty, inside a dataset, not writable), the network failing past its retries; reencode also for a source "
        "file that does not read or decode",
    ),
    (130, "interrupted (Ctrl-C)"),
    (141, "the reader of standard output left (| head)"),
)


def _exit_statuses() -> str:
    """:data:`EXIT_STATUSES` as ``--help`` ends, wrapped to :data:`~.cli_options.HELP_WIDTH` (it ran to 100 columns)."""
    import textwrap

    lines = ["exit status:"]
    for code, meaning in EXIT_STATUSES:
        lines += textwrap.wrap(
            meaning, HELP_WIDTH, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7, break_on_hyphens=False
        )
    return "\n".join(lines)


#: The errors of a write that OUT's filesystem or name makes: what ``reencode``, which also reads, says as OUT's.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG, errno.EFBIG})


class _CommandError(Exception):
    """What the user asked for cannot be done: :func:`main` prints ``lerobot-dali <verb>: <message>``, exits 2."""


def _open_dataset(args: argparse.Namespace, located: LocatedDataset | None = None) -> LeRobotDatasetReader:
    """``args.dataset`` opened (``located``: where :func:`~.dataset_reader.locate_dataset` found it, its revision
    resolved and its info.json read); a URL no installed filesystem reads, or a revision given twice, is a
    :class:`_CommandError` (the package's own errors pass through: :func:`main` names their type)."""
    from .dataset_reader import open_dataset, open_located

    selection = {name: getattr(args, name) for name in ("keys", "episodes") if getattr(args, name, None) is not None}
    with _opening(args.dataset if located is None else located.location.description):
        if located is not None:
            return open_located(located, cameras=args.cameras, **selection)
        return open_dataset(args.dataset, revision=args.revision, cameras=args.cameras, **selection)


@contextlib.contextmanager
def _opening(dataset: str | Sequence[str]) -> Iterator[None]:
    """Opening ``dataset`` (or datasets): an ImportError, ValueError or OSError is a :class:`_CommandError` naming
    it, unless the network's (transient: :func:`main` names it) or the package's own (a DatasetError)."""
    from .errors import DatasetError
    from .remote_errors import is_refused, is_transient

    try:
        yield
    except DatasetError:
        raise
    except (ImportError, ValueError, OSError) as e:
        if is_transient(e) or is_refused(e):
            raise  # (main names a network failure, and a refusal, as one)
        raise _cannot_open(dataset, e) from e


def _cannot_open(dataset: str | Sequence[str], error: BaseException) -> _CommandError:
    """The error for ``dataset`` (or datasets) that could not be opened."""
    return _CommandError(f"cannot open {_shown(repr(dataset))}: {_one_line(error)}")


def _shown(text: str) -> str:
    """``text`` naming a dataset as typed, its URL's credentials masked (:func:`~.url_secrets.masked`: a signed URL's
    ``sig``, a password): what the verbs print goes to a job's log, and ``check --json`` to a file."""
    from .url_secrets import masked

    return masked(text)


def _check_url(dataset: str | None) -> None:
    """A dataset URL's protocol has a filesystem installed (checked before a verb starts any work)."""
    if dataset is None or "://" not in dataset:
        return
    import fsspec

    try:
        fsspec.get_filesystem_class(dataset.split("://", 1)[0])
    except (ImportError, ValueError) as e:
        raise _cannot_open(dataset, e) from e


def _one_line(error: BaseException) -> str:
    from .remote_errors import first_line

    return f"{type(error).__name__}: {first_line(error, '')}"


def _info(args: argparse.Namespace) -> int:
    from .camera_codecs import counts_text
    from .dataset_summary import summarize

    _check_tolerance(args.tolerance_s)
    reader = _open_dataset(args)
    summary = summarize(reader, probe=not args.no_probe, tolerance_s=args.tolerance_s)
    failed = 1 if any("probe_error" in cam for cam in summary["cameras"].values()) else 0
    if args.json:
        print(json.dumps(summary, indent=2))
        return failed
    print(f"{summary['source']}  (LeRobot {summary['codebase_version']}, robot {summary['robot_type']})")
    print(
        f"  fps {summary['fps']:g}   episodes {summary['total_episodes']}   frames {summary['total_frames']}"
        f"   tasks {summary['total_tasks']}   data files {summary['data_files']}"
    )
    print("  features:")
    for key, feature in summary["features"].items():
        print(f"    {key:<40} {feature['dtype']:<8} {feature['shape']}")
    for key, cam in summary["cameras"].items():
        depth = " (depth map)" if cam["depth_map"] else ""
        print(
            f"  camera {key}{depth}: {_probed(cam)}; {counted(cam['video_files'], 'video file')}, "
            f"{_per_file(cam['episodes_per_file'])}"
        )
        if "probe_error" in cam:
            print(f"    {cam['probe_error']}")
        if cam.get("info_json_unlike"):
            print(
                f"    info.json declares {', '.join(cam['info_json_unlike'])}: reading follows the files; tools that "
                "read info.json are told wrong (correct meta/info.json)"
            )
        if len(cam.get("file_codecs", {})) > 1:
            print(
                f"    files mix codecs: {counts_text(cam['file_codecs'])}: the workers read them; NVDEC and DALI's CPU "
                "decoder decode one codec per camera (README: Cameras whose files mix codecs)"
            )
        spacing = cam.get("gop_frames") or cam.get("frame_count") or 0  # (one keyframe: the whole video)
        if spacing > LONG_GOP_FRAMES:
            print(
                f"    random access: about {(spacing + 1) / 2:g} frames decoded per frame (from the keyframe before "
                "it); about 1.5 re-encoded at GOP 2, LeRobot's default (lerobot-dali reencode)"
            )
        lookup = cam.get("frame_lookup")
        if lookup:
            verdicts = ", ".join(f"{source} {'ok' if said == 'ok' else 'fails'}" for source, said in lookup.items())
            advice, why = "", ""
            parquet = lookup.get(TimestampSource.PARQUET_TIMESTAMP.value)
            if parquet != "ok":
                if lookup.get("frame_index") == "ok":
                    advice = (
                        " -> read with timestamp_source='frame_index' (on the command line --timestamp-source "
                        "frame_index)"
                    )
                else:  # the lookup's own message says what would read it (e.g. the tolerance_s to raise to)
                    advice, why = " -> why:", f"      {parquet}"
            print(f"    rows -> frames, first episode, tolerance {args.tolerance_s:g} s: {verdicts}{advice}")
            if why:
                print(why)
    for key in summary["image_cameras"]:
        depth = " (depth map)" if key in summary["depth_image_cameras"] else ""
        print(f"  camera {key}{depth}: images in the data files (decoded by the workers)")
    return failed


def _per_file(spread: dict[str, int]) -> str:
    """Episodes per video file in words: ``2-5 episodes per file``, or one count where every file holds as many
    (``1 episode per file``, not ``1-1``)."""
    low, high = spread["min"], spread["max"]
    if low == high:
        return f"{counted(low, 'episode')} per file"
    return f"{low}-{high} episodes per file"


def _probed(camera: dict[str, Any]) -> str:
    """What the first video of a camera holds, in words: codec, HxW, frame rate, keyframe spacing, B-frames."""
    if "probe_error" in camera:
        return "first video does not open (below)"
    if "codec" not in camera:
        return "not probed"
    height, width = camera["resolution"]
    frames = camera["frame_count"]
    rate = f"{camera['fps']:g} fps" if camera["fps"] is not None else f"{frames} frame{'s' * (frames != 1)} (no fps)"
    if camera["gop_frames"] is not None:
        gop = f" GOP {camera['gop_frames']}"
    else:
        gop = f" GOP = all {frames} frames (one keyframe)" if frames > 1 else ", one keyframe"
    return f"codec {camera['codec']} {height}x{width} (HxW) {rate}{gop}{' B-frames' if camera['b_frames'] else ''}"


def _check(args: argparse.Namespace) -> int:
    """Each dataset checked in turn: exit 0 when none has a problem, 1 when one has, 2 when one does not open."""
    from .dataset_check import CheckReport
    from .errors import DatasetError

    if args.workers is not None and args.workers < 0:
        raise _CommandError(f"--workers must be an int >= 0 (0: this process), got {args.workers}")
    if args.show < 0:
        raise _CommandError(f"--show must be an int >= 0 (problems printed in full), got {args.show}")
    if args.redecode and not args.decode:
        raise _CommandError("--redecode decodes again the frames --decode skips: add --decode")
    each = _each_dataset(args)
    _show_check_progress(args)
    as_one = args.concat or args.rename_map is not None
    if as_one or len(args.dataset) == 1:
        report = _check_one(args, union=each) if as_one else _check_one(each[0])
        if args.json:
            print(json.dumps(report, indent=2))
        return 0 if report["ok"] else 1
    reports, worst = [], 0
    for own in each:
        dataset = _shown(own.dataset)
        try:
            report = _check_one(own)
        except (DatasetError, _CommandError, PermissionError) as e:  # (the others are still checked)
            # (with --json, stdout holds the JSON alone: the reason is in it, and said on stderr)
            said = str(e) if isinstance(e, _CommandError) else f"{type(e).__name__}: {e}"  # (its type is private)
            opening = "" if isinstance(e, _CommandError) else "cannot open: "  # (its message says 'cannot open ...')
            print(f"{dataset}: {opening}{said}", file=sys.stderr if args.json else sys.stdout)
            # (a report as the others', its fields summed or read alike: one problem, of opening)
            failed_open = CheckReport(dataset, problem_kinds={f"{type(e).__name__} opening the dataset": 1})
            report, worst = {**failed_open.to_json(), "error": said}, 2
        reports.append(report)
        worst = max(worst, 0 if report["ok"] else 1)
    failed = sum(not r["ok"] for r in reports)
    if args.json:
        print(json.dumps(reports, indent=2))
    else:
        print(f"{failed} of {len(reports)} datasets have problems" if failed else f"all {len(reports)} datasets ok")
    return worst


#: Where stderr is no terminal, check's progress: no bar, a few lines.
_CHECK_LINES = "lerobot_dali.check.progress"


def _show_check_progress(args: argparse.Namespace) -> None:
    """Check's progress lines at INFO (unless ``--json``), and the waits' before the episodes (in_threads' and
    one_by_one's): opening a v2.1 dataset reads every data file's footer, then each camera's files' headers are
    surveyed (the first time, 15,000 v2.1 episodes of two cameras: ~9 s, then ~12 s of CPU; remote, requests a file).
    Set before the datasets open: the footers' lines were at INFO of a logger still at WARNING."""
    for name in (_CHECK_LINES, "lerobot_dali.concurrent_calls") if not args.json else ():
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)


def _each_dataset(args: argparse.Namespace) -> list[argparse.Namespace]:
    """``args`` for each dataset: its own ``--timestamp-source`` and ``--tolerance-s`` (one given: each's)."""
    count = len(args.dataset)
    values = {}
    for flag, given in (("--timestamp-source", args.timestamp_source), ("--tolerance-s", args.tolerance_s)):
        values[flag] = _one_each(flag, given, count)
    for tolerance in values["--tolerance-s"]:
        _check_tolerance(tolerance)
    return [
        _with(args, dataset=dataset, timestamp_source=source, tolerance_s=tolerance)
        for dataset, source, tolerance in zip(args.dataset, *values.values(), strict=True)
    ]


def _one_each(flag: str, given: Sequence[Any], count: int) -> list[Any]:
    """A flag's values, one or one per dataset (``count``), as one per dataset."""
    if len(given) not in (1, count):
        raise _CommandError(f"{flag} takes one value, or one per dataset ({count}), got {len(given)}")
    return list(given) * count if len(given) == 1 else list(given)


def _check_tolerance(tolerance_s: float) -> None:
    try:
        check_seconds("--tolerance-s", tolerance_s)
    except ValueError as e:
        raise _CommandError(str(e)) from None


def _with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """``args`` with ``changes`` (one dataset of several, its selection)."""
    return argparse.Namespace(**{**vars(args), **changes})


def _check_one(args: argparse.Namespace, union: Sequence[argparse.Namespace] | None = None) -> dict[str, Any]:
    """One dataset's report (``CheckReport.to_json``; ``union``: ``args.dataset`` read as one, each's args), printed
    unless ``--json``; its seconds are the whole check's, the open's named (reading info.json and the episode tables,
    v2.1's data files' footers: ~9 s of 15,000 episodes, which the check's own 0.0 s left out)."""
    from .dataset_check import check_dataset
    from .progress_lines import progress_counter

    started = time.perf_counter()
    reader, missing = (_union(args, union), []) if union is not None else _open_to_check(args)
    opening_s = time.perf_counter() - started
    # (a union's args hold a list, one value or one per dataset, which the union holds itself)
    source, tolerance = (v[0] if isinstance(v, list) else v for v in (args.timestamp_source, args.tolerance_s))
    with progress_counter(
        reader.num_episodes,
        desc="lerobot-dali check",
        unit="episode",
        logger=logging.getLogger(_CHECK_LINES),
        enabled=not args.json,
    ) as progress:
        report = check_dataset(
            reader, timestamp_source=source, tolerance_s=tolerance, decode=args.decode, redecode=args.redecode,
            workers=args.workers, progress=progress,
        )  # fmt: skip
    report.opening_seconds = opening_s
    _list_missing_cameras(report, reader, missing)
    if args.json:
        return report.to_json()
    decoded = f", {counted(report.frames_decoded, 'frame')} decoded" if args.decode else ""
    if report.frames_verified_before:
        files = report.video_files_verified_before
        skipped_files = f"{counted(files, 'video file')} and " if files else ""
        decoded += (
            f" ({skipped_files}{counted(report.frames_verified_before, 'frame')} skipped: "
            "decoded by an earlier check, unchanged since; --redecode decodes them again)"
        )
    problems = counted(report.problem_count, "problem") if report.problem_count else "no problems"
    print(
        f"{report.source}: {counted(report.episodes, 'episode')}, {counted(report.rows, 'row')}, "
        f"{counted(report.video_files, 'video file')}"
        f"{decoded} checked in {_check_time(report)} (timestamp_source={_said(args.timestamp_source)}, "
        f"tolerance_s={_said(args.tolerance_s)}): {problems}"
    )
    for kind, count in report.problem_kinds.items():
        print(f"  {count:>6} x {kind}")
    _print_problems(report, args.show)
    return report.to_json()


def _check_time(report: CheckReport) -> str:
    """How long ``report``'s check took, the open included, and the open's part where it shows: ``12.3 s, 9.1 s of it
    opening the dataset``."""
    opening = f", {report.opening_seconds:.1f} s of it opening the dataset" if report.opening_seconds >= 0.05 else ""
    return f"{report.seconds + report.opening_seconds:.1f} s{opening}"


def _open_to_check(args: argparse.Namespace) -> tuple[LeRobotDatasetReader, list[MissingDataFileError]]:
    """``args.dataset`` opened, and, where ``--cameras`` chose none, the errors of the cameras info.json declares
    that have no video for the first episode (GR00T's ``egoview``, never recorded): opened without them, so a check
    lists them with every other problem in one run (it stopped at the first, and the next run found the frames'
    timestamps)."""
    from .dataset_reader import locate_dataset
    from .errors import MissingDataFileError

    if args.cameras is not None:
        return _open_dataset(args), []
    with _opening(args.dataset):
        located = locate_dataset(args.dataset, revision=args.revision)
    missing: list[MissingDataFileError] = []
    while True:
        left_out = {error.camera for error in missing}
        cameras = [camera for camera in located.info.camera_keys if camera not in left_out] if missing else None
        try:
            return _open_dataset(_with(args, cameras=cameras), located), missing
        except MissingDataFileError as e:
            if e.camera is None or e.camera in left_out:
                raise
            missing.append(e)


def _list_missing_cameras(
    report: CheckReport, reader: LeRobotDatasetReader, missing: list[MissingDataFileError]
) -> None:
    """``missing`` (:func:`_open_to_check`'s) added to ``report``'s problems, each of the first episode."""
    from .dataset_check import Problem

    first = int(reader.episodes.episode_index[0])
    report.add_problems([Problem(report.source, first, e.camera, type(e).__name__, str(e)) for e in missing])


def _print_problems(report: CheckReport, show: int) -> None:
    """``report``'s first ``show`` problems, each with its own facts; advice several of them end with once after
    them, marked [A], [B], ... in theirs (:mod:`.shared_advice`: 12 problems of cr5_v21_av1 repeated ~300 characters
    of it, 11 alike). ``--json`` has every message whole."""
    from .shared_advice import ELIDED, split_shared_advice

    shown = report.problems[:show]
    split = split_shared_advice([problem.message for problem in shown])
    for problem, own, shared in zip(shown, split.own, split.advice_of, strict=True):
        where = f"camera {problem.camera}" if problem.camera else "rows"
        dataset = "" if problem.dataset == report.source else f"{problem.dataset}: "  # (a union's datasets)
        mark = "" if shared is None else f" [{_advice_mark(shared)}]"
        said = _inside_dataset(problem, _place_unsaid(problem, own))  # (the line names it: said once)
        print(f"{dataset}episode {problem.episode_index}, {where}: {problem.error}: {said}{mark}")
    for at, advice in enumerate(split.advice):
        which = _problems_named(report, [shown[i] for i in split.sharing(at)])
        elided = f" ({ELIDED}: each one's own number, in its line)" if ELIDED in advice else ""
        print(f"[{_advice_mark(at)}] {which}{elided}: {advice}")
    if report.problem_count > show:
        print(f"... and {report.problem_count - show} more (--show N lists more; --json lists them)")


def _place_unsaid(problem: Problem, text: str) -> str:
    """``text``, the start of ``problem``'s message, without the dataset, episode and camera its line names before it:
    a frame lookup's ``dataset D, episode 0, camera C (FILE): ...`` is ``FILE: ...``, an image's ``FILE (episode 0,
    camera C): ...`` is ``FILE: ...`` (cr5_v30_av1's lines said their place twice, ~85 characters before what was
    wrong). Only the line's own place goes, the file stays; the error raised, and ``--json``, keep the message whole
    (scripts and logs read it alone)."""
    place = _place_pattern(problem)
    before = re.match(rf"(?:{place})(?: \((?P<file>.+?)\))?: ", text)  # (a lookup's: the place, then its file)
    if before is not None:
        rest = text[before.end() :]
        return f"{before['file']}: {rest}" if before["file"] else rest
    after = re.match(rf"(?P<file>\S.*?) \((?:{place})\)(?=[: ])", text)  # (an image's: the file, then the place)
    return text if after is None else after["file"] + text[after.end() :]


def _inside_dataset(problem: Problem, text: str) -> str:
    """``text`` with the files of ``problem``'s dataset named from its root (``videos/chunk-000/...``), which the
    report's first line (or a union's problem's line) names: each line repeated it. Only where the errors name the
    files under the root the dataset is named by (a local folder, a URL); a Hub dataset's, named at their pinned
    commit, keep their paths, as ``--json`` and the errors raised keep every path whole."""
    from .url_secrets import masked

    for root in dict.fromkeys((problem.dataset, masked(problem.dataset))):
        if root.rstrip("/"):  # (a dataset at / names nothing to take out)
            text = text.replace(f"{root.rstrip('/')}/", "")
    return text


def _place_pattern(problem: Problem) -> str:
    """A regex of ``problem``'s place as errors name it (:meth:`~.frame_lookup.FrameRequestContext.describe`): its
    dataset, episode and camera (quoted or not), any of them, in that order."""
    from .url_secrets import masked

    datasets = "|".join(re.escape(name) for name in dict.fromkeys((problem.dataset, masked(problem.dataset))))
    parts = [f"dataset (?:{datasets})", f"episode {problem.episode_index}"]
    if problem.camera:
        parts.append(f"camera (?:{re.escape(problem.camera)}|{re.escape(repr(problem.camera))})")
    named = [", ".join(chosen) for size in (3, 2, 1) for chosen in itertools.combinations(parts, size)]
    return "|".join(named)


def _advice_mark(at: int) -> str:
    """The mark of the ``at``-th advice shared: A-Z, then AA, AB, ..."""
    mark = ""
    at += 1
    while at:
        at, letter = divmod(at - 1, 26)
        mark = chr(ord("A") + letter) + mark
    return mark


def _problems_named(report: CheckReport, problems: Sequence[Problem]) -> str:
    """Which episodes ``problems`` are of: ``episodes 0-4, 6-11``; a union's by dataset (``ds: episode 3; ...``)."""
    from .shared_advice import episode_spans

    datasets = dict.fromkeys(problem.dataset for problem in problems)
    named = []
    for dataset in datasets:
        episodes = {problem.episode_index for problem in problems if problem.dataset == dataset}
        spans = f"{'episode' if len(episodes) == 1 else 'episodes'} {episode_spans(sorted(episodes))}"
        named.append(spans if dataset == report.source else f"{dataset}: {spans}")
    return "; ".join(named)


def _said(value: Any) -> str:
    """A setting as a report prints it: its value, or one per dataset where they differ."""
    text = [f"{v:g}" if isinstance(v, float) else str(v) for v in (value if isinstance(value, list) else [value])]
    return text[0] if len(set(text)) == 1 else f"[{', '.join(text)}]"


def _union(args: argparse.Namespace, each: Sequence[argparse.Namespace]) -> LeRobotDatasetReader:
    """``args.dataset`` read as one (``--concat``), keys named by ``--rename-map``, each dataset's rows finding their
    frames its own way (``each``: its args), as a run would read them."""
    from .dataset_union import concat_datasets, open_all
    from .errors import CameraSelectionError
    from .key_rename import flag_at_fault, rename_maps_for, without_cameras_left_out

    if not args.concat:
        raise _CommandError("--rename-map names the keys of datasets checked as one: add --concat")
    if len(args.dataset) < 2:
        raise _CommandError(f"--concat checks two datasets or more as one; got one ({_shown(args.dataset[0])})")
    if args.episodes is not None:
        raise _CommandError(
            "--concat takes no --episodes (each dataset's own): check a selection of episodes dataset by dataset"
        )
    maps = args.rename_map[0] if args.rename_map is not None and len(args.rename_map) == 1 else args.rename_map
    each_map = _one_each("--rename-map", [None] if maps is None else args.rename_map, len(args.dataset))
    try:  # (each dataset with its own keys for --cameras: a camera it declares but never recorded is not looked for)
        with _opening(args.dataset):  # (where one is located: its revision resolved, its info.json read)
            readers = open_all(
                args.dataset, lambda d, own: _open_dataset(_with(args, cameras=own, keys=None), d),
                cameras=args.cameras, rename_maps=each_map, revision=args.revision,
            )  # fmt: skip
    except CameraSelectionError as e:
        raise _CommandError(f"{flag_at_fault(e)}: {e}") from e
    try:
        renames = rename_maps_for(without_cameras_left_out(maps, readers), readers, cameras=args.cameras)
    except ValueError as e:
        raise _CommandError(f"--rename-map: {e}") from e
    own = {
        "timestamp_sources": [e.timestamp_source for e in each] if len(args.timestamp_source) > 1 else None,
        "tolerances_s": [e.tolerance_s for e in each] if len(args.tolerance_s) > 1 else None,
    }
    return concat_datasets(
        readers, cameras=args.cameras, keys=args.keys, rename_maps=[dict(rename.to_batch) for rename in renames], **own
    )


def _rename_map(text: str) -> dict[str, str]:
    from .key_rename import rename_map_from_json

    try:
        return rename_map_from_json(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _make_dataset(args: argparse.Namespace) -> int:
    from .generate import make_dataset

    progress = logging.getLogger("lerobot_dali.generate")  # a long run says how far it got, as bench does
    if progress.getEffectiveLevel() > logging.INFO:
        progress.setLevel(logging.INFO)
    try:
        out = make_dataset(
            args.out,
            episodes=args.episodes,
            frames_per_episode=args.frames_per_episode,
            cameras=args.cameras,
            size=args.size,
            fps=args.fps,
            codec=args.codec,
            gop=args.gop,
            episodes_per_file=args.episodes_per_file,
            version=args.version,
            seed=args.seed,
            image_cameras=args.image_cameras,
        )
    except (ValueError, FileExistsError, NotADirectoryError, PermissionError) as e:
        # A bad option (checked before anything is written) or an OUT that cannot become the dataset.
        print(f"lerobot-dali make-dataset: {_as_flag(str(e), _MAKE_DATASET_FLAGS)}", file=sys.stderr)
        return 2
    except OSError as e:  # (a full or read-only filesystem, a name too long: a traceback, status 1)
        return _not_written("make-dataset", args.out, e)
    print(out)
    return 0


#: The arguments of ``make_dataset`` that ``make-dataset`` takes as a flag of the same name.
_MAKE_DATASET_FLAGS = ("episodes_per_file", "frames_per_episode", "episodes", "cameras", "fps", "gop", "seed")


def _as_flag(message: str, names: Sequence[str]) -> str:
    """``message`` (the library's, about one of its arguments ``names``) naming the argument as the verb's flag: it
    said "frames_per_episode must be in [1, 1048576]", a name no one types (a review)."""
    said = re.match(rf"({'|'.join(names)})\b(?!\[)", message)
    return f"--{said.group(1).replace('_', '-')}{message[said.end() :]}" if said else message


def _not_written(verb: str, out: str, error: OSError, *, flag: str = "OUT") -> int:
    """Say that ``verb`` could not write ``out`` (``error``, a write's, the half-written folder removed or kept
    to resume as the verb does) in one line, with what to do about its ``flag``; exit status 2, as an output
    refused."""
    advice = {
        errno.ENOSPC: f"free space there, or give an {flag} on another filesystem",
        errno.EDQUOT: f"free space within the quota, or give an {flag} on another filesystem",
        errno.EROFS: f"the filesystem is read-only: give an {flag} on a writable one",
        errno.ENAMETOOLONG: f"give a shorter {flag}",
    }.get(error.errno or 0, f"give an {flag} this user can write")
    print(f"lerobot-dali {verb}: cannot write {out}: {_one_line(error)}; {advice}", file=sys.stderr)
    return 2


def _reencode(args: argparse.Namespace) -> int:
    from .errors import DatasetError
    from .reencode import reencode_dataset

    progress = logging.getLogger("lerobot_dali.reencode")  # one line per file, as make-dataset says how far it got
    if progress.getEffectiveLevel() > logging.INFO:
        progress.setLevel(logging.INFO)
    try:
        report = reencode_dataset(
            args.dataset, args.out, codec=args.codec, gop=args.gop, crf=args.crf, cameras=args.cameras,
            jobs=args.jobs, revision=args.revision, progress=sys.stderr.isatty(),
        )  # fmt: skip
    except DatasetError:
        raise  # (main names its type)
    except (ValueError, FileExistsError, NotADirectoryError, PermissionError) as e:
        print(f"lerobot-dali reencode: {_as_flag(str(e), ('jobs', 'crf', 'gop'))}", file=sys.stderr)
        return 2
    except OSError as e:
        from .remote_errors import is_transient

        if is_transient(e) or e.errno not in _WRITE_ERRNOS:  # (the source's: the network's, said by main)
            raise
        return _not_written("reencode", args.out, e)
    print(f"{report.out}: {report.codec}, keyframes at most {report.gop} frames apart")
    for camera in sorted({video.camera for video in report.videos}):
        videos = [video for video in report.videos if video.camera == camera]
        frames = sum(video.frames for video in videos)
        megabytes = [sum(getattr(video, f"bytes_{when}") for video in videos) / 1e6 for when in ("before", "after")]
        decoded = [
            sum(getattr(video, f"decoded_per_frame_{when}") * video.frames for video in videos) / frames
            for when in ("before", "after")
        ]
        print(
            f"  {camera}: {counted(len(videos), 'video file')}, {frames} frames, "
            f"{megabytes[0]:.1f} -> {megabytes[1]:.1f} MB; "
            f"random access: about {decoded[0]:.1f} -> {decoded[1]:.1f} frames decoded per frame"
        )
    resumed = sum(video.resumed for video in report.videos)
    if resumed:
        print(f"  {counted(resumed, 'video file')} re-encoded by an earlier run that did not finish (checked again)")
    if report.kept_videos:
        kept = counted(len(report.kept_videos), "video file")
        print(f"  kept as they were: {kept} of {', '.join(report.kept_cameras)}")
    print(f"  {counted(report.copied_files, 'other file')} copied unchanged")
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from .diagnose import diagnose_dataset, diagnose_machine

    given = args.cameras or args.revision or args.timestamp_source is not None or args.tolerance_s is not None
    if args.dataset is None and given:
        taken = f" before --cameras (--cameras took {' '.join(map(repr, args.cameras))})" if args.cameras else ""
        raise _CommandError(
            f"--cameras, --revision, --timestamp-source and --tolerance-s need a DATASET; give DATASET{taken}"
        )
    timestamp_source: str = args.timestamp_source or TimestampSource.PARQUET_TIMESTAMP.value
    tolerance_s: float = DEFAULT_TOLERANCE_S if args.tolerance_s is None else args.tolerance_s
    _check_tolerance(tolerance_s)
    machine = diagnose_machine()
    print(f"DALI {machine.dali_version or 'not installed'}")
    if machine.cuda_available:
        print(
            f"GPU {machine.gpu_name} (compute capability {machine.compute_capability}), "
            f"libnvcuvid {machine.nvcuvid_library or 'NOT FOUND: NVDEC unusable'}"
        )
    else:
        print("GPU none: every camera decodes on the CPU (DALI CPU for VP8/VP9/MJPEG, the CPU decoders otherwise)")
    print(f"CPU decoders: {machine.cpu_decoders}")
    if args.dataset is None:
        return 0
    reader = _open_dataset(args)
    failed = False
    options: dict[str, Any] = {"timestamp_source": timestamp_source, "tolerance_s": tolerance_s}
    for report in diagnose_dataset(reader, machine=machine, **options):
        failed |= not report.ok
        if report.error is not None:
            print(f"camera {report.camera}: FAILED {report.error}")
            continue
        size = "{}x{} (HxW)".format(*report.resolution) if report.resolution else "size unknown"
        print(f"camera {report.camera}: codec {report.codec} {size} -> route {report.route}")
        if report.refused is not None:
            said = ", ".join(f"{name}={value!r}" for name, value in options.items())
            print(f"  the iterator REFUSES it ({said}): {report.refused}")
        for route, (ok, seconds, detail) in report.decodes.items():
            print(f"  {route:<13} {'ok' if ok else 'FAILED'} {seconds * 1000:8.1f} ms  {detail}")
    return 1 if failed else 0


def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .bench import BenchConfig, ResultsNotWritten, format_table, run_bench
    from .bench_measure import show_progress

    show_progress()
    for dataset in args.dataset or ():
        _check_url(dataset)
    for flag, value in (("--out", args.out), ("--cache-dir", args.cache_dir)):
        if value is not None and not value.strip():  # (was taken for the default folder, unsaid)
            raise _CommandError(f"{flag} is empty: give a folder, or leave {flag} out for the default")
    try:
        config = BenchConfig(
            dataset=args.dataset if args.dataset is None or len(args.dataset) > 1 else args.dataset[0],
            batch_size=args.batch_size, num_workers=args.num_workers,
            episode_pool_size=args.episode_pool_size, image_size=args.image_size, augment=args.augment, mode=args.mode,
            device=args.device, recipe=args.recipe, quick=args.quick, out=Path(args.out) if args.out else None,
            steps=args.steps, warmup=args.warmup, repeats=args.repeats, limits=args.limits,
            loaders=tuple(args.loaders) if args.loaders else None, seed=args.seed,
            cameras=tuple(args.cameras) if args.cameras else None, keys=tuple(args.keys) if args.keys else None,
            timestamp_source=tuple(args.timestamp_source), tolerance_s=tuple(args.tolerance_s),
            **({"cache_dir": Path(args.cache_dir)} if args.cache_dir else {}),
        )  # fmt: skip
    except ValueError as e:
        print(f"lerobot-dali bench: {e}", file=sys.stderr)
        return 2
    try:
        report = run_bench(config)
    except ResultsNotWritten as e:  # (the measurements printed all the same: the run took minutes)
        print(format_table(e.report))
        return _not_written("bench", f"its results to {e.report.out_dir}", e.error, flag="--out")
    print(format_table(report))
    for note in report.notes:
        print(f"note: {note}")
    print(f"results: {report.out_dir}")
    for failure in report.failures:
        print(f"lerobot-dali bench: FAILED {failure}", file=sys.stderr)
    return 0 if report.ok else 1


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="lerobot-dali", description=described(__doc__.splitlines()[0]), epilog=_exit_statuses(),
    )  # fmt: skip
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="log INFO (-v) or DEBUG (-vv); before the verb: lerobot-dali -v check ...",
    )  # fmt: skip
    verbs = parser.add_subparsers(dest="verb", required=True)

    info = verbs.add_parser("info", help="describe a dataset: metadata and what its videos really hold")
    info.add_argument("dataset", help="local folder, Hub repo id (user/name) or fsspec URL (hf://datasets/...)")
    info.add_argument("--revision", help="Hub branch, tag or commit")
    info.add_argument("--cameras", nargs="+", metavar="KEY", help="only these camera keys")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--no-probe", action="store_true", help="do not open video files")
    add_tolerance_s(info, per=None, lead="in the first episode's lookup: ")
    info.set_defaults(run=_info)

    check = verbs.add_parser(
        "check", help="read every episode as training would (rows, frame lookups, files; --decode: frames) and list "
        "every problem",
    )  # fmt: skip
    check.add_argument(
        "dataset", nargs="+",
        help="local folder, Hub repo id (user/name) or fsspec URL (hf://datasets/...); several: each in turn",
    )  # fmt: skip
    check.add_argument("--revision", help="Hub branch, tag or commit")
    check.add_argument("--cameras", nargs="+", metavar="KEY", help="only these camera keys")
    check.add_argument("--keys", nargs="+", metavar="KEY", help="only these tabular features")
    check.add_argument(
        "--episodes", nargs="+", type=int, metavar="INDEX",
        help="check only these episode indices (episode_index values, e.g. 0 5 7; not a count)",
    )  # fmt: skip
    add_timestamp_source(check, per="DATASET")
    add_tolerance_s(check, per="DATASET")
    check.add_argument(
        "--decode", action="store_true",
        help="also decode every frame and image the rows read (but those of local files an earlier check decoded "
        "without a fault, unchanged since)",
    )  # fmt: skip
    check.add_argument(
        "--redecode", action="store_true",
        help="with --decode, decode those frames again too (a new lerobot_dali check, PyAV or FFmpeg decodes them "
        "again by itself)",
    )  # fmt: skip
    check.add_argument(
        "--workers", type=int, metavar="N",
        help="processes checking episodes (0: this one; default: the CPUs, at most 8, to decode (started at the "
        "first frame to decode), for remote files or for 2,000 episodes or more, else 0)",
    )  # fmt: skip
    check.add_argument(
        "--concat", action="store_true",
        help="check the datasets as one (concat_datasets): their layouts agree, and every file is held to the "
        "union's first",
    )  # fmt: skip
    check.add_argument(
        "--rename-map", nargs="+", type=_rename_map, metavar="JSON",
        help='with --concat, {"key": "union name"}: one for every dataset (each renames the keys it has), or one per '
        "dataset ('{}': none)",
    )  # fmt: skip
    check.add_argument("--show", type=int, default=20, metavar="N", help="problems printed in full (default 20)")
    check.add_argument("--json", action="store_true", help="print the whole report as JSON (several: a list)")
    check.set_defaults(run=_check)

    diagnose = verbs.add_parser("diagnose", help="GPU/NVDEC availability, per-camera route, one decode per route")
    diagnose.add_argument("dataset", nargs="?", help="dataset to route and test-decode (optional)")
    diagnose.add_argument("--revision", help="with DATASET: Hub branch, tag or commit")
    diagnose.add_argument(
        "--cameras", nargs="+", metavar="KEY",
        help="with DATASET: only these camera keys (give DATASET first: --cameras takes every word after it)",
    )  # fmt: skip
    add_timestamp_source(diagnose, per=None, default=False, lead="with DATASET: ")
    add_tolerance_s(diagnose, per=None, default=False, lead="with DATASET: ")
    diagnose.set_defaults(run=_diagnose)

    make = verbs.add_parser("make-dataset", help="write a synthetic LeRobot dataset with real encoded videos")
    make.add_argument("out", help="a new folder, or an empty one")
    make.add_argument(
        "--episodes", type=int, default=8, metavar="N", help="how many episodes to write: a count (default 8)"
    )
    make.add_argument(
        "--frames-per-episode", type=int, default=60, metavar="N", help="rows (and frames) in each episode (default 60)"
    )
    make.add_argument(
        "--cameras", type=int, default=1, metavar="N",
        help="how many cameras: observation.images.cam0, observation.images.cam1, ... (default 1)",
    )  # fmt: skip
    make.add_argument(
        "--size", type=parse_size, default=(96, 128), metavar="HxW", help="both even and >= 64 (default 96x128)"
    )
    make.add_argument(
        "--fps", type=int, default=30, metavar="N", help="frames per second, rows and videos (default 30)"
    )
    make.add_argument(
        "--codec", type=str.lower, choices=["av1", "h264", "hevc", "vp9"], default="av1",
        help="video codec (default av1; ignored with --image-cameras)",
    )  # fmt: skip
    make.add_argument(
        "--gop", type=int, default=2, metavar="N",
        help="most frames between keyframes; h264 and hevc need --gop >= 3 for B-frames (default 2; ignored with "
        "--image-cameras)",
    )  # fmt: skip
    make.add_argument(
        "--episodes-per-file",
        type=int,
        default=4,
        metavar="N",
        help="per data and video file (default 4; ignored for v2.1)",
    )
    make.add_argument(
        "--version", type=str.lower, choices=["v3.0", "v2.1"], default="v3.0", help="LeRobot layout (default v3.0)"
    )
    make.add_argument("--seed", type=int, default=0, metavar="N", help="shifts the task of each episode (default 0)")
    make.add_argument(
        "--image-cameras", action="store_true", help="store cameras as PNG images in the data files, not videos"
    )
    make.set_defaults(run=_make_dataset)

    reencode = verbs.add_parser(
        "reencode", help="copy a dataset with its videos re-encoded: keyframes close together, a codec NVDEC decodes"
    )
    reencode.add_argument("dataset", help="local folder, Hub repo id (user/name) or fsspec URL (hf://datasets/...)")
    reencode.add_argument("out", help="a new folder, or an empty one")
    reencode.add_argument(
        "--codec", type=str.lower, choices=CODECS, default="h264",
        help="the copy's video codec (default h264: NVDEC on every NVIDIA GPU; av1 has none on A100/H100/H200)",
    )  # fmt: skip
    reencode.add_argument(
        "--gop", type=int, default=2, metavar="N", help="most frames between keyframes (default 2, LeRobot's)"
    )
    crfs = ", ".join(f"{codec} {crf}" for codec, crf in DEFAULT_CRF.items())
    reencode.add_argument(
        "--crf", type=int, metavar="N", help=f"quality, lower is better (default the codec's: {crfs})"
    )
    reencode.add_argument(
        "--cameras", nargs="+", metavar="KEY", help="re-encode only these video keys (the rest are copied)"
    )
    reencode.add_argument("--jobs", type=int, metavar="N", help="files encoded at once (default: one per CPU)")
    reencode.add_argument("--revision", help="Hub branch, tag or commit")
    reencode.set_defaults(run=_reencode)

    bench = verbs.add_parser("bench", help="data-loading throughput: lerobot-dali vs PyAV DataLoader and LeRobot")
    bench.add_argument(
        "--dataset", nargs="+",
        help="dataset to load (default: generate LeRobot-like AV1 and H.264 ones); several: read as one "
        "(concat_datasets, against LeRobot's MultiLeRobotDataset)",
    )  # fmt: skip
    bench.add_argument("--cameras", nargs="+", metavar="KEY", help="with --dataset: read only these cameras")
    bench.add_argument("--keys", nargs="+", metavar="KEY", help="with --dataset: read only these tabular features")
    add_timestamp_source(bench, per="--dataset")
    add_tolerance_s(bench, per="--dataset")
    bench.add_argument(
        "--mode", type=str.lower, choices=["single", "sarm"], default="single",
        help="single: 1 frame per camera; sarm: 8 frames per camera 1 s apart, -7..0 s (default single)",
    )  # fmt: skip
    bench.add_argument("--recipe", help="act, diffusion, vla or a recipe .toml: windows, image size, augmentation")
    bench.add_argument("--batch-size", type=int, help="samples per batch, every loader (default 32; quick 8)")
    bench.add_argument(
        "--num-workers", type=int, help="worker processes, every loader (default min(4, cores); quick 2)"
    )
    add_episode_pool_size(
        bench,
        default=DEFAULT_EPISODE_POOL_SIZE,
        help=f"lerobot-dali episode pool size (default {DEFAULT_EPISODE_POOL_SIZE})",
    )
    add_image_size(bench)
    bench.add_argument("--augment", action=argparse.BooleanOptionalAction, help="default: the recipe's choice")
    bench.add_argument(
        "--device", type=str.lower, choices=["auto", "cpu", "cuda"], default="auto",
        help="lerobot-dali's pipeline and every loader's batches (default auto: cuda where torch sees a GPU, else cpu)",
    )  # fmt: skip
    bench.add_argument("--steps", type=int, help="measured batches per loader (default 30; quick 6)")
    bench.add_argument(
        "--warmup",
        type=int,
        help="batches before the measured window, >= 1 (default 2 x workers + 2, more than the loaders queue ahead; "
        "quick 2)",
    )
    bench.add_argument(
        "--repeats", type=int, default=1, help="runs per loader, in rotating order; the median is reported (default 1)"
    )
    bench.add_argument(
        "--quick", action="store_true",
        help="tiny datasets (2 cameras 96x128, 6 episodes of 2 s) and few steps, for CI: not a speed (the default "
        "run generates 3 cameras 480x640, 12 episodes of 10 s, once: minutes)",
    )  # fmt: skip
    bench.add_argument("--limits", action="store_true", help="also measure decode ceilings (bench/limits.py)")
    bench.add_argument(
        "--loaders", nargs="+", metavar="NAME",
        help=f"only these loaders, of {', '.join(LOADERS)} (default: all that apply)",
    )  # fmt: skip
    bench.add_argument(
        "--seed", type=int, default=0, metavar="N",
        help="every loader's shuffle (and lerobot-dali's augmentation), and the 24 samples clip/file and "
        "decoded/frame are counted on (default 0)",
    )  # fmt: skip
    bench.add_argument("--out", help="results folder (default bench/results/<timestamp> in the current folder)")
    bench.add_argument(
        "--cache-dir",
        help="where generated datasets are kept (default $LEROBOT_DALI_CACHE/bench, which is "
        "~/.cache/lerobot_dali/bench where that variable is not set)",
    )
    bench.set_defaults(run=_bench)
    for verb in verbs.choices.values():  # (each verb's --help says them too; ArgumentParser's formatter keeps them)
        verb.epilog = parser.epilog
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    from .errors import CudaUnavailableError, DatasetError

    try:
        code = int(args.run(args))
        sys.stdout.flush()  # (a reader that left, as `| head` does, fails here, not in the interpreter's exit)
        return code
    except BrokenPipeError as e:  # (a ConnectionError: transient where it is the network's)
        if _stdout_closed():  # the reader of the output left (`| head`): stop quietly, as other tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nothing left to flush at exit)
            return 128 + signal.SIGPIPE
        return _network_failed(args.verb, e)
    except DatasetError as e:
        print(f"lerobot-dali {args.verb}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except (_CommandError, CudaUnavailableError) as e:
        print(f"lerobot-dali {args.verb}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lerobot-dali {args.verb}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from .remote_errors import REFUSED_HINT, is_refused, is_transient

        if is_refused(e):  # (aiohttp's 403 is no OSError: _open_dataset's handling missed it, a traceback followed)
            print(f"lerobot-dali {args.verb}: access refused ({_one_line(e)}); {REFUSED_HINT}", file=sys.stderr)
            return 2
        if isinstance(e, PermissionError) and not is_transient(e):  # (a video file's, read after opening: a traceback)
            print(f"lerobot-dali {args.verb}: {_permission_denied(e)}", file=sys.stderr)
            return 2
        if not is_transient(e):
            raise
        return _network_failed(args.verb, e)


def run() -> NoReturn:
    """The ``lerobot-dali`` command: :func:`main`, then the process ends as the interpreter's exit would (its other
    threads joined, its ``atexit`` handlers run, output flushed) but without the C++ static destructors after them.
    pyarrow's thread pools, started by any parquet read, sometimes abort there ("terminate called without an active
    exception", exit 134 after a command that had succeeded: 3 of 160 ``info`` runs on a loaded 2-core machine;
    apache/arrow#34314)."""
    code = main()
    if _threads_joined_interrupted():  # (a Ctrl-C while a thread is waited for: as in the command itself)
        print("lerobot-dali: interrupted", file=sys.stderr)
        code = 130
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (a reader that left, a closed stream: nothing to say)
            stream.flush()
    os._exit(code)


def _threads_joined_interrupted() -> bool:
    """What the interpreter's exit calls first: threading's own exit functions (an executor still held wakes its idle
    workers, which a join alone waits for forever), then every non-daemon thread joined, those started meanwhile too;
    True where a Ctrl-C ended the wait. Python up to 3.12 raises its KeyboardInterrupt here (uncaught: a traceback
    from threading, and the interpreter's own exit with the C++ destructors run() avoids), 3.13 prints it as an
    unraisable error and stops waiting."""
    interrupted = False
    hook = sys.unraisablehook

    def noted(unraisable: Any) -> None:
        nonlocal interrupted
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            interrupted = True
        else:
            hook(unraisable)

    sys.unraisablehook = noted
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.unraisablehook = hook
    return interrupted


def _permission_denied(error: PermissionError) -> str:
    """What to do where the operating system refused this user a file (its mode, its owner, a folder above it)."""
    if error.filename is None:
        return (
            f"{_one_line(error)}: give this user access to the file and the folders above it, or run as one who has it"
        )
    return (
        f"permission denied: {error.filename} (errno {error.errno}): this user may not open it; give it access to the "
        "file and the folders above it (chmod, chown), or run as a user who has it"
    )


def _network_failed(verb: str, error: BaseException) -> int:
    from .retry_policy import RETRIES_ENV

    print(
        f"lerobot-dali {verb}: the network failed past its retries ({_one_line(error)}); "
        f"check the connection, or retry more with {RETRIES_ENV}",
        file=sys.stderr,
    )
    return 2


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head`` after its lines)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # (not a file: a test's capture)
        return False
    if not hasattr(select, "poll"):  # (Windows)
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


if __name__ == "__main__":
    run()
