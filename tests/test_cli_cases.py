"""The command line's behaviour a mutation pass over ``lerobot_dali/cli.py`` found unchecked: info's whole text (an
unprobed camera, a two-frame video, the random-access note's threshold), check's lines (its timing, settings, problem
counts, a rows problem, a union's, exactly ``--show`` of them, advice marks past Z, several datasets all ok), the
one-line refusals of its flags and of a dataset missing a data file, ``-v``/``-vv``, and main's one-line errors (a
refusal, a PermissionError, a broken pipe, CUDA)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lerobot_dali import cli
from lerobot_dali.cli import _advice_mark, _check_time, _inside_dataset, _place_unsaid, _print_problems, main
from lerobot_dali.dataset_check import CheckReport, Problem
from lerobot_dali.errors import CudaUnavailableError
from lerobot_dali.remote_errors import REFUSED_HINT
from tests.conftest import shared_dataset


def _info_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    """``lerobot-dali info`` of ``argv``'s lines (exit 0)."""
    assert main(["info", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def _small(make_ds: Callable[..., Path]) -> str:
    """A small dataset every frame of which its rows find: 2 episodes of 4 rows, one vp9 camera, a file each."""
    return str(make_ds(episodes=2, frames_per_episode=4, cameras=1, size=(64, 64), codec="vp9", episodes_per_file=1))


def _check_settings(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The settings ``lerobot-dali check`` (exit 0) says it read with: ``timestamp_source=..., tolerance_s=...``."""
    assert main(["check", *argv, "--workers", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("): no problems"), first
    return first.split(" (", 1)[1].split("): ", 1)[0]


def _report(source: str, *problems: Problem) -> CheckReport:
    """A check's report of ``source`` holding ``problems``, each counted."""
    report = CheckReport(source)
    report.add_problems(list(problems))
    return report


def _printed(capsys: pytest.CaptureFixture[str], report: CheckReport, show: int) -> list[str]:
    """The lines check prints of ``report``'s problems, ``show`` of them in full."""
    _print_problems(report, show)
    return capsys.readouterr().out.splitlines()


class _Forbidden(Exception):
    """A client's refusal that is no OSError (aiohttp's ClientResponseError): an HTTP status, 403."""

    status = 403


def _info_failing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: BaseException) -> str:
    """What ``lerobot-dali info ds`` says on stderr (exit 2, nothing on stdout) where its work raises ``error``."""

    def failing(args: object) -> int:
        raise error

    monkeypatch.setattr(cli, "_info", failing)
    return _refused(capsys, "info", "ds")


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``lerobot-dali`` of ``argv`` says on stderr, refusing it (exit 2, nothing on stdout)."""
    assert main(list(argv)) == 2
    said = capsys.readouterr()
    assert said.out == "", said.out
    return said.err


def test_info_without_probing_says_a_video_camera_was_not_probed(make_ds: Callable[..., Path], capsys) -> None:
    """``info --no-probe`` opens no video file: a camera's line says so (not a codec read from nowhere, nor a
    KeyError on the resolution it never read), and still counts its files."""
    lines = _info_lines(capsys, _small(make_ds), "--no-probe")
    assert "  camera observation.images.cam0: not probed; 2 video files, 1 episode per file" in lines, lines


def test_info_of_a_healthy_dataset_says_its_metadata_features_and_camera_line_by_line(
    make_ds: Callable[..., Path], capsys
) -> None:
    """The whole of ``info``'s text for a dataset with nothing to warn of: where it comes from and its layout, its
    counts, each feature's dtype and shape in columns, the camera's probe and lookup; no note of mixed codecs (one
    codec), of random access (GOP 2) nor of info.json (it agrees). ``--json`` is the same summary indented by two."""
    root = _small(make_ds)
    assert _info_lines(capsys, root) == [
        f"{root}  (LeRobot v3.0, robot synthetic)",
        "  fps 30   episodes 2   frames 8   tasks 2   data files 2",
        "  features:",
        *(
            f"    {key:<40} {dtype:<8} {shape}"
            for key, dtype, shape in (
                ("observation.state", "float32", [6]),
                ("observation.images.cam0", "video", [64, 64, 3]),
                ("action", "float32", [7]),
                ("timestamp", "float32", [1]),
                *((name, "int64", [1]) for name in ("frame_index", "episode_index", "index", "task_index")),
            )
        ),
        "  camera observation.images.cam0: codec vp9 64x64 (HxW) 30 fps GOP 2; 2 video files, 1 episode per file",
        "    rows -> frames, first episode, tolerance 0.0001 s: parquet_timestamp ok, frame_index ok",
    ]
    assert main(["info", root, "--json"]) == 0
    assert capsys.readouterr().out.startswith(f'{{\n  "source": "{root}",\n  "codebase_version": "v3.0",\n')


def test_info_calls_a_two_frame_video_of_one_keyframe_a_gop_of_all_its_frames(
    make_ds: Callable[..., Path], capsys
) -> None:
    """A video of more than one frame and a single keyframe is ``GOP = all N frames``; ``one keyframe`` alone is for
    a one-frame video, where there is no spacing to speak of. Two frames is the smallest of the first kind."""
    root = make_ds(episodes=1, frames_per_episode=2, cameras=1, size=(64, 64), codec="vp9", gop=10)
    lines = _info_lines(capsys, str(root))
    assert (
        "  camera observation.images.cam0: codec vp9 64x64 (HxW) 30 fps GOP = all 2 frames (one keyframe); "
        "1 video file, 1 episode per file"
    ) in lines, lines


@pytest.mark.parametrize(
    ("opening_s", "said"),
    [(0.05, "1.3 s, 0.1 s of it opening the dataset"), (0.049, "1.3 s"), (0.0, "1.2 s")],
)
def test_the_check_time_names_the_open_from_the_first_tenth_of_a_second_it_shows(opening_s: float, said: str) -> None:
    """The open's part is named where it shows as at least 0.1 s once rounded (0.05 s and up): "0.0 s of it opening
    the dataset" says nothing, and an open of 0.05 to 0.1 s named nowhere would leave the total unexplained."""
    report = CheckReport("ds", seconds=1.25)
    report.opening_seconds = opening_s
    assert _check_time(report) == said


def test_a_problem_of_the_rows_is_said_of_the_rows_not_of_a_camera(capsys) -> None:
    """A problem of an episode's rows (no camera) is placed at ``rows``: "camera None" named a camera no one has."""
    problem = Problem("ds", 3, None, "DataFileError", "column 'frame_index' of data/file-000.parquet is not int")
    lines = _printed(capsys, _report("ds", problem), show=20)
    assert lines == ["episode 3, rows: DataFileError: column 'frame_index' of data/file-000.parquet is not int"]


def test_a_unions_problem_names_the_dataset_it_came_from_and_its_own_does_not(capsys) -> None:
    """In a union's check (``--concat``) each problem's line names its dataset where it is not the report's own (the
    first line names that one): which of the datasets holds the bad episode is otherwise lost."""
    own = Problem("a", 1, "cam", "VideoDecodeError", "videos/x.mp4: cut short")
    other = Problem("b", 2, "cam", "VideoDecodeError", "videos/y.mp4: cut short")
    lines = _printed(capsys, _report("a", own, other), show=20)
    assert lines == [
        "episode 1, camera cam: VideoDecodeError: videos/x.mp4: cut short",
        "b: episode 2, camera cam: VideoDecodeError: videos/y.mp4: cut short",
    ]


def test_exactly_show_problems_are_listed_with_no_count_of_more(capsys) -> None:
    """``--show N`` of a report of N problems lists them all, and no "... and 0 more" line after them; one more
    problem than shown is counted."""
    problems = [Problem("ds", i, "cam", "VideoDecodeError", f"videos/{i}.mp4: cut short") for i in range(3)]
    assert len(_printed(capsys, _report("ds", *problems), show=3)) == 3
    assert _printed(capsys, _report("ds", *problems), show=2)[-1] == (
        "... and 1 more (--show N lists more; --json lists them)"
    )


#: Advice two problems of a check share, word for word (no number of each one's own in it).
_SHARED_ADVICE = (
    "Re-encode the file with keyframes closer together, or read it with the CPU decoders, which do not mind it."
)


def test_advice_shared_word_for_word_is_said_once_without_the_elided_numbers_note(capsys) -> None:
    """Advice its problems share whole is said once after them, marked [A] in theirs, without the note that each
    one's own number is in its line: nothing was left out of it."""
    problems = [
        Problem("ds", i, "cam", "VideoDecodeError", f"videos/{i}.mp4: cut short. {_SHARED_ADVICE}") for i in (0, 1)
    ]
    assert _printed(capsys, _report("ds", *problems), show=20) == [
        "episode 0, camera cam: VideoDecodeError: videos/0.mp4: cut short. [A]",
        "episode 1, camera cam: VideoDecodeError: videos/1.mp4: cut short. [A]",
        f"[A] episodes 0-1: {_SHARED_ADVICE}",
    ]


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("episode 3 (v.mp4): query 1 s", "v.mp4: query 1 s"),
        ("camera c (v.mp4): query 1 s", "v.mp4: query 1 s"),
        ("dataset D: column 'frame_index' of d.parquet", "column 'frame_index' of d.parquet"),
        ("d.parquet (episode 3): the image of row 2", "d.parquet: the image of row 2"),
    ],
)
def test_a_problems_line_leaves_out_a_place_of_one_part_too(message: str, said: str) -> None:
    """A message naming one part of its line's place (its episode, camera or dataset alone) says it no more than one
    naming two or three: the line has said it."""
    assert _place_unsaid(Problem("D", 3, "c", "FrameTimestampError", message), message) == said


def test_the_files_of_a_dataset_at_the_filesystem_root_keep_their_paths_whole() -> None:
    """A dataset at ``/`` has no root to name its files from: they are named as the error names them, not with every
    slash taken out (``videosa.mp4``)."""
    problem = Problem("/", 0, "cam", "VideoDecodeError", "/videos/a.mp4: cut short")
    assert _inside_dataset(problem, "/videos/a.mp4: cut short") == "/videos/a.mp4: cut short"


@pytest.mark.parametrize(("at", "mark"), [(0, "A"), (25, "Z"), (26, "AA"), (27, "AB"), (51, "AZ"), (52, "BA"),
                                          (701, "ZZ"), (702, "AAA")])  # fmt: skip
def test_advice_marks_run_a_to_z_then_on_in_two_letters(at: int, mark: str) -> None:
    """Past 26 pieces of advice shared (a long check's), the marks go on as spreadsheet columns do: AA after Z,
    never a repeated or empty mark that points two groups of problems at one advice."""
    assert _advice_mark(at) == mark


def test_a_refusal_that_is_no_os_error_is_one_line_saying_what_to_pass(monkeypatch, capsys) -> None:
    """A server's 403 raised as no OSError (aiohttp's) got past the opening's handling: a traceback. It is one line
    now, exit 2, saying it was refused and which credentials to pass (not "the network failed": a retry never helps)."""
    err = _info_failing(monkeypatch, capsys, _Forbidden("403, message='Forbidden'"))
    assert err == f"lerobot-dali info: access refused (_Forbidden: 403, message='Forbidden'); {REFUSED_HINT}\n"


def test_a_file_this_user_may_not_read_after_the_open_is_one_line_naming_it(monkeypatch, capsys) -> None:
    """A PermissionError from a file read once the dataset is open (a video file's) was a traceback: one line now,
    exit 2, naming the file and its errno and saying what to change."""
    err = _info_failing(monkeypatch, capsys, PermissionError(13, "Permission denied", "/data/ds/videos/a.mp4"))
    assert err == (
        "lerobot-dali info: permission denied: /data/ds/videos/a.mp4 (errno 13): this user may not open it; give it "
        "access to the file and the folders above it (chmod, chown), or run as a user who has it\n"
    )


def test_a_permission_error_naming_no_file_is_one_line_with_its_own_words(monkeypatch, capsys) -> None:
    """A PermissionError that names no file (a library's own) is said with its type and message, not as
    "permission denied: None"."""
    err = _info_failing(monkeypatch, capsys, PermissionError("the cache folder is not ours"))
    assert err == (
        "lerobot-dali info: PermissionError: the cache folder is not ours: give this user access to the file and the "
        "folders above it, or run as one who has it\n"
    )


def test_a_broken_pipe_while_stdout_is_still_read_is_a_network_failure(monkeypatch, capsys) -> None:
    """A BrokenPipeError is a ConnectionError: where standard output's reader is still there (here pytest's capture,
    no pipe at all) it is the network's, said as a failure past its retries, exit 2, not a quiet exit 141."""
    err = _info_failing(monkeypatch, capsys, BrokenPipeError(32, "Broken pipe"))
    assert err == (
        "lerobot-dali info: the network failed past its retries (BrokenPipeError: [Errno 32] Broken pipe); check the "
        "connection, or retry more with LEROBOT_DALI_REMOTE_RETRIES\n"
    )


def test_a_cuda_device_this_process_does_not_see_is_one_line(monkeypatch, capsys) -> None:
    """``--device cuda`` where torch sees no GPU is the user's to change: one line with the library's message, its
    type left out (as a bad option's), exit 2."""
    err = _info_failing(monkeypatch, capsys, CudaUnavailableError("device='cuda' but torch sees no CUDA device"))
    assert err == "lerobot-dali info: device='cuda' but torch sees no CUDA device\n"


def test_check_says_the_settings_it_read_with_as_they_are_typed(make_ds: Callable[..., Path], capsys) -> None:
    """The report's first line says the timestamp source and tolerance the check used, the tolerance as typed
    (``2``, not Python's ``2.0``); a union's (``--concat``) one value where its datasets agree, else each's in a list,
    in the datasets' order."""
    path = _small(make_ds)
    assert _check_settings(capsys, path, "--tolerance-s", "2") == "timestamp_source=parquet_timestamp, tolerance_s=2"
    both = [path, path, "--concat"]
    assert _check_settings(capsys, *both, "--tolerance-s", "0.5", "0.5") == (
        "timestamp_source=parquet_timestamp, tolerance_s=0.5"
    )
    assert _check_settings(capsys, *both, "--tolerance-s", "0.0001", "2", "--timestamp-source", "frame_index") == (
        "timestamp_source=frame_index, tolerance_s=[0.0001, 2]"
    )
    assert _check_settings(capsys, *both, "--timestamp-source", "frame_index", "parquet_timestamp") == (
        "timestamp_source=[frame_index, parquet_timestamp], tolerance_s=0.0001"
    )


def _check_refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``lerobot-dali check`` of ``argv`` says on stderr, refusing it (exit 2, nothing on stdout)."""
    return _refused(capsys, "check", *argv, "--workers", "0")


def test_check_concat_of_one_dataset_is_refused_naming_it(make_ds: Callable[..., Path], capsys) -> None:
    """``--concat`` reads two datasets or more as one: given one, it is refused, naming the dataset (a union of one
    would check nothing a plain check does not)."""
    path = _small(make_ds)
    assert _check_refused(capsys, path, "--concat") == (
        f"lerobot-dali check: --concat checks two datasets or more as one; got one ({path})\n"
    )


def test_check_concat_with_episodes_is_refused(make_ds: Callable[..., Path], capsys) -> None:
    """Episode indices are each dataset's own: ``--concat --episodes`` cannot say whose, so it is refused before any
    dataset opens, saying how to check a selection instead."""
    path = _small(make_ds)
    assert _check_refused(capsys, path, path, "--concat", "--episodes", "0") == (
        "lerobot-dali check: --concat takes no --episodes (each dataset's own): check a selection of episodes "
        "dataset by dataset\n"
    )


def _logged(*argv: str) -> str:
    """What ``python -m lerobot_dali argv`` (exit 0) logs (a process of its own: logging is set up once per process,
    before pytest's capture holds the root logger)."""
    done = subprocess.run([sys.executable, "-m", "lerobot_dali", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _levels_logged(root: str, *verbose: str) -> set[str]:
    """The levels of the lines ``lerobot-dali [verbose] info root`` logs."""
    said = _logged(*verbose, "info", root)
    return {line.split(" ", 1)[0] for line in said.splitlines() if line.startswith(("DEBUG ", "INFO "))}


def test_verbose_once_logs_info_and_twice_debug(make_ds: Callable[..., Path]) -> None:
    """``-v`` shows INFO lines (a dataset's columns info.json leaves out, what a long step is doing) without the
    DEBUG flood of every file read, which ``-vv`` adds; without either, neither. (A line said once per dataset is
    not said again by the next run: -vv's INFO lines may be gone.)"""
    root = _small(make_ds)
    assert _levels_logged(root) == set()
    assert _levels_logged(root, "-v") == {"INFO"}
    assert "DEBUG" in _levels_logged(root, "-vv")


def test_check_refuses_a_tolerance_that_is_no_positive_number_for_any_dataset(
    make_ds: Callable[..., Path], capsys
) -> None:
    """Each dataset's ``--tolerance-s`` is checked before any opens, the second of two as the first: a negative or
    NaN tolerance finds no frame, or every frame, and the check would say nothing true."""
    path = _small(make_ds)
    for argv, given in (([path, "--tolerance-s", "-1"], "-1.0"), ([path, path, "--tolerance-s", "1e-4", "nan"], "nan")):
        assert _check_refused(capsys, *argv) == (
            f"lerobot-dali check: --tolerance-s must be a positive finite number of seconds, got {given}\n"
        )


def test_info_says_what_random_access_costs_from_a_keyframe_spacing_of_17(make_ds: Callable[..., Path], capsys) -> None:
    """Keyframes 16 frames apart (LONG_GOP_FRAMES) cost a random frame ~8.5 decodes, said nowhere; 17 apart is the
    first spacing info warns of, with the cost (9 frames) and what a re-encoded copy would cost."""
    said = {}
    for gop in (16, 17):
        root = make_ds(episodes=1, frames_per_episode=40, cameras=1, size=(64, 64), codec="vp9", gop=gop)
        said[gop] = [line for line in _info_lines(capsys, str(root)) if "random access" in line]
    assert said == {
        16: [],
        17: [
            "    random access: about 9 frames decoded per frame (from the keyframe before it); about 1.5 re-encoded "
            "at GOP 2, LeRobot's default (lerobot-dali reencode)"
        ],
    }


def test_check_counts_the_problems_it_found_and_each_kind_of_them(capsys) -> None:
    """cr5_v30_av1's episodes 0 and 4 (wall-clock timestamps): two frame lookups that fail, said as "2 problems" at
    the end of the first line (not "no problems"), then their kind's count in a column of six; ``--show 0`` lists
    none of them in full, counting them instead; ``--json`` is the report indented by two."""
    dataset = str(shared_dataset("cr5_v30_av1"))
    assert main(["check", dataset, "--episodes", "0", "4", "--workers", "0"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{dataset}: 2 episodes, ") and lines[0].endswith(
        "(timestamp_source=parquet_timestamp, tolerance_s=0.0001): 2 problems"
    ), lines[0]
    assert lines[1] == "       2 x FrameTimestampError in observation.images.top"
    assert main(["check", dataset, "--episodes", "0", "4", "--workers", "0", "--show", "0"]) == 1  # (counts alone)
    assert capsys.readouterr().out.splitlines()[1:] == [
        "       2 x FrameTimestampError in observation.images.top",
        "... and 2 more (--show N lists more; --json lists them)",
    ]
    assert main(["check", dataset, "--episodes", "0", "4", "--workers", "0", "--json"]) == 1
    assert capsys.readouterr().out.startswith(f'{{\n  "source": "{dataset}",\n  "episodes": 2,\n')


def test_check_of_several_healthy_datasets_exits_0_saying_all_ok(make_ds: Callable[..., Path], capsys) -> None:
    """Datasets checked in turn, none with a problem: exit 0 and "all 2 datasets ok" (a job's status says whether to
    train), each's line counting what it read (no frames decoded: no ``--decode``); ``--json`` is their reports' list,
    indented by two."""
    path = _small(make_ds)
    assert main(["check", path, path, "--workers", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "all 2 datasets ok"
    assert lines[0].startswith(f"{path}: 2 episodes, 8 rows, 2 video files checked in "), lines[0]  # (no --decode)
    assert main(["check", path, path, "--workers", "0", "--json"]) == 0
    assert capsys.readouterr().out.startswith(f'[\n  {{\n    "source": "{path}",\n')


def test_check_of_a_dataset_missing_its_first_data_file_is_one_line(
    make_ds: Callable[..., Path], copy_ds: Callable[[Path], Path], capsys
) -> None:
    """A missing data file is no camera's to leave out (as a camera never recorded is): check does not open the
    dataset, says so in one line naming the file, exit 2, without trying the open again and again."""
    dataset = copy_ds(Path(_small(make_ds)))
    data = dataset / "data" / "chunk-000" / "file-000.parquet"
    data.unlink()
    assert main(["check", str(dataset), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lerobot-dali check: MissingDataFileError: {data} is missing: ") and err.count("\n") == 1


class _Refused(OSError):
    """A server's refusal raised as an OSError (fsspec's HTTP errors): status 403."""

    status = 403


@pytest.mark.parametrize(
    "error", [ConnectionResetError(104, "Connection reset by peer"), _Refused("403 Forbidden")], ids=repr
)
def test_a_network_failure_or_refusal_while_opening_passes_through_to_be_named_as_one(error: OSError) -> None:
    """The network's failure and a server's refusal in the open are main's to name (past the retries; what to pass),
    not "cannot open" as if the dataset were the fault; another OSError or ValueError is the dataset's, named."""
    with pytest.raises(type(error)) as raised, cli._opening("ds"):
        raise error
    assert raised.value is error
    with pytest.raises(cli._CommandError, match=r"^cannot open 'ds': ValueError: no such layout$"), cli._opening("ds"):
        raise ValueError("no such layout")


def test_a_url_no_installed_filesystem_reads_is_refused_before_any_work() -> None:
    """A dataset URL's protocol is looked up before a verb does anything (bench builds its dataset first): one no
    fsspec filesystem reads is refused naming the URL; a local path, or none, is not looked up."""
    with pytest.raises(cli._CommandError, match=r"^cannot open 'nosuch://bucket/ds': ValueError: .*nosuch"):
        cli._check_url("nosuch://bucket/ds")
    for dataset in (None, "/data/ds", "relative/ds"):
        assert cli._check_url(dataset) is None
    assert cli._check_url("memory://ds") is None


def test_make_dataset_and_reencode_say_how_far_they_got_without_being_asked(make_ds, tmp_path) -> None:
    """Writing or re-encoding a dataset takes minutes: each says what it is doing file by file at INFO, which the
    command line shows without ``-v`` (other verbs' INFO lines stay hidden, above)."""
    made = _logged("make-dataset", str(tmp_path / "made"), "--episodes", "1", "--frames-per-episode", "2")
    assert "INFO lerobot_dali.generate: file 1/1: episode 0, data/chunk-000/file-000.parquet and 1 video file" in made
    said = _logged("reencode", _small(make_ds), str(tmp_path / "reencoded"), "--jobs", "1")
    for i in range(2):  # (a line per video file re-encoded)
        file = f"videos/observation.images.cam0/chunk-000/file-00{i}.mp4"
        assert f"INFO lerobot_dali.reencode: {file}: 4 frames, " in said, said


def test_reencode_of_every_camera_says_what_it_wrote_and_keeps_nothing(make_ds, tmp_path, capsys) -> None:
    """reencode's summary of a dataset whose every camera it re-encoded: where and how, each camera's files, frames,
    size and random-access cost, the files copied; no "kept as they were" line (no camera was left out)."""
    out = tmp_path / "reencoded"
    assert main(["reencode", _small(make_ds), str(out), "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{out}: h264, keyframes at most 2 frames apart"
    assert re.fullmatch(
        r"  observation\.images\.cam0: 2 video files, 8 frames, \d+\.\d -> \d+\.\d MB; "
        r"random access: about 1\.5 -> 1\.5 frames decoded per frame",
        lines[1],
    ), lines[1]
    assert lines[2:] == ["  5 other files copied unchanged"]
