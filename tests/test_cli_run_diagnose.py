"""The command line's ends a mutation pass over ``lerobot_dali/cli.py`` found unchecked: diagnose's lines of a machine
with a GPU (NVDEC or none, DALI or none) and of each camera's report (a failure, a refusal, its decodes), the options
it hands the diagnosis; run()'s flush of what main() left buffered and its Ctrl-C status; the unraisable
KeyboardInterrupt that Python 3.13 reports where 3.11 raises it; where standard output is still read."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from lerobot_dali import cli, diagnose
from lerobot_dali.cli import main
from lerobot_dali.cli_options import HELP_WIDTH
from lerobot_dali.diagnose import CameraReport, MachineReport


def _machine(**given: Any) -> MachineReport:
    """A machine with an H100 and NVDEC, DALI 1.40 (``given`` changes it)."""
    told: dict[str, Any] = {
        "cuda_available": True, "gpu_name": "NVIDIA H100", "compute_capability": (9, 0),
        "nvcuvid_library": "libnvcuvid.so.1", "dali_version": "1.40.0", "cpu_decoders": "pyav",
    }  # fmt: skip
    return MachineReport(**{**told, **given})


def _diagnosed(monkeypatch, capsys, machine: MachineReport, argv: list[str], reports: list[CameraReport] = ()):
    """``lerobot-dali diagnose argv`` on ``machine``, its dataset's diagnosis ``reports``: exit status, stdout and
    the keywords the diagnosis was given (None where none was made)."""
    taken: dict[str, Any] = {}

    def diagnosis(reader: Any, **options: Any) -> list[CameraReport]:
        assert reader == "the reader"
        taken.update(options)
        return list(reports)

    monkeypatch.setattr(diagnose, "diagnose_machine", lambda: machine)
    monkeypatch.setattr(diagnose, "diagnose_dataset", diagnosis)
    monkeypatch.setattr(cli, "_open_dataset", lambda args: "the reader")
    code = main(["diagnose", *argv])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, captured.out.splitlines(), taken or None


@pytest.mark.parametrize(
    ("machine", "gpu_line"),
    [
        (_machine(), "GPU NVIDIA H100 (compute capability (9, 0)), libnvcuvid libnvcuvid.so.1"),
        (
            _machine(nvcuvid_library=None),
            "GPU NVIDIA H100 (compute capability (9, 0)), libnvcuvid NOT FOUND: NVDEC unusable",
        ),
    ],
)
def test_diagnose_without_a_dataset_describes_the_gpu_and_nvdec(monkeypatch, capsys, machine, gpu_line) -> None:
    code, lines, taken = _diagnosed(monkeypatch, capsys, machine, [])
    assert (code, lines, taken) == (0, ["DALI 1.40.0", gpu_line, "CPU decoders: pyav"], None)


def test_diagnose_without_a_gpu_or_dali_says_so(monkeypatch, capsys) -> None:
    machine = _machine(cuda_available=False, gpu_name=None, compute_capability=None, dali_version=None)
    code, lines, taken = _diagnosed(monkeypatch, capsys, machine, [])
    assert (code, lines, taken) == (
        0,
        [
            "DALI not installed",
            "GPU none: every camera decodes on the CPU (DALI CPU for VP8/VP9/MJPEG, the CPU decoders otherwise)",
            "CPU decoders: pyav",
        ],
        None,
    )


def _camera(name: str, **given: Any) -> CameraReport:
    return CameraReport(f"observation.images.{name}", "h264", (48, 64), "nvdec", **given)


def test_diagnose_prints_each_cameras_route_refusal_and_decodes_and_exits_1_on_any_failure(monkeypatch, capsys):
    reports = [
        _camera("broken", error="VideoDecodeError: truncated"),
        CameraReport("observation.images.unsized", "vp9", None, "dali_cpu", {"dali_cpu": (True, 0.0125, "one frame")}),
        _camera(
            "refused", decodes={"nvdec": (True, 0.002, "ok frame"), "cpu_fallback": (False, 1.5, "no decoder")},
            refused="FrameTimestampError: a row finds no frame",
        ),
    ]  # fmt: skip
    code, lines, taken = _diagnosed(monkeypatch, capsys, _machine(), ["d"], reports)
    assert code == 1
    assert lines[3:] == [
        "camera observation.images.broken: FAILED VideoDecodeError: truncated",
        "camera observation.images.unsized: codec vp9 size unknown -> route dali_cpu",
        "  dali_cpu      ok     12.5 ms  one frame",
        "camera observation.images.refused: codec h264 48x64 (HxW) -> route nvdec",
        "  the iterator REFUSES it (timestamp_source='parquet_timestamp', tolerance_s=0.0001): "
        "FrameTimestampError: a row finds no frame",
        "  nvdec         ok      2.0 ms  ok frame",
        "  cpu_fallback  FAILED   1500.0 ms  no decoder",
    ]
    assert taken == {"machine": _machine(), "timestamp_source": "parquet_timestamp", "tolerance_s": 0.0001}


@pytest.mark.parametrize(
    "reports",
    [
        [],
        [CameraReport("observation.images.a", "vp9", (2, 3), "dali_cpu", {"dali_cpu": (True, 0.001, "")})],
        [CameraReport("observation.images.a", "vp9", (2, 3), "dali_cpu", {"dali_cpu": (True, 0.001, "")}),
         CameraReport("observation.images.b", "vp9", (2, 3), "dali_cpu", {"dali_cpu": (True, 0.001, "")})],
    ],
)  # fmt: skip
def test_diagnose_exits_0_where_every_camera_decodes_and_hands_on_the_options_given(monkeypatch, capsys, reports):
    argv = ["d", "--timestamp-source", "frame_index", "--tolerance-s", "0.25"]
    code, lines, taken = _diagnosed(monkeypatch, capsys, _machine(), argv, reports)
    assert (code, len(lines)) == (0, 3 + 2 * len(reports))
    assert taken == {"machine": _machine(), "timestamp_source": "frame_index", "tolerance_s": 0.25}


def test_a_failed_camera_before_a_healthy_one_still_fails_the_diagnosis(monkeypatch, capsys) -> None:
    reports = [
        _camera("a", decodes={"nvdec": (False, 0.001, "no")}),
        _camera("b", decodes={"nvdec": (True, 0.001, "")}),
    ]
    code, lines, _ = _diagnosed(monkeypatch, capsys, _machine(), ["d"], reports)
    assert code == 1 and lines[-1] == "  nvdec         ok      1.0 ms  "


def _ran(monkeypatch, capsys, code: int, interrupted: bool) -> tuple[int, str, str, list[str]]:
    """run() with main() returning ``code`` and the wait for the threads ``interrupted`` or not: the status it
    ends the process with, stdout, stderr and what ran at exit."""
    done: list[str] = []

    class Exited(Exception):
        pass

    def exit_(status: int) -> None:
        done.append("exit")
        raise Exited(status)

    monkeypatch.setattr(cli, "main", lambda: code)
    monkeypatch.setattr(cli, "_threads_joined_interrupted", lambda: interrupted)
    monkeypatch.setattr(cli.atexit, "_run_exitfuncs", lambda: done.append("atexit"))
    monkeypatch.setattr(cli.os, "_exit", exit_)
    with pytest.raises(Exited) as ended:
        cli.run()
    captured = capsys.readouterr()
    return ended.value.args[0], captured.out, captured.err, done


def test_run_ends_with_mains_status_after_the_atexit_handlers(monkeypatch, capsys) -> None:
    assert _ran(monkeypatch, capsys, 3, False) == (3, "", "", ["atexit", "exit"])


def test_run_interrupted_while_it_waits_for_a_thread_says_so_and_ends_130(monkeypatch, capsys) -> None:
    assert _ran(monkeypatch, capsys, 0, True) == (130, "", "lerobot-dali: interrupted\n", ["atexit", "exit"])


def test_run_flushes_what_main_left_in_the_buffers_before_it_ends_the_process() -> None:
    """os._exit() drops what the streams still buffer: run() flushes them first (stdout a pipe: block-buffered;
    stderr line-buffered, a line not ended)."""
    code = (
        "import sys\n"
        "from lerobot_dali import cli\n"
        "def main():\n"
        "    print('out')\n"
        "    sys.stderr.write('err without a newline')\n"
        "    return 4\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # (buffered, as usual)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err without a newline")


def _joined(monkeypatch, shutdown) -> tuple[bool, list[Any]]:
    """_threads_joined_interrupted() where threading._shutdown is ``shutdown``: its answer, and what reached the
    unraisable hook in place before (which is in place again after)."""
    reached: list[Any] = []
    hook = reached.append
    monkeypatch.setattr(sys, "unraisablehook", hook)
    monkeypatch.setattr(cli.threading, "_shutdown", shutdown)
    interrupted = cli._threads_joined_interrupted()
    assert sys.unraisablehook is hook
    return interrupted, reached


def test_a_ctrl_c_python_3_13_reports_as_unraisable_is_an_interruption_and_others_go_to_the_hook(monkeypatch):
    """Python 3.13 reports a KeyboardInterrupt in threading's shutdown to sys.unraisablehook (3.11 raises it): taken
    as the interruption, not passed on; any other unraisable error goes to the hook that was in place."""
    ctrl_c, other = SimpleNamespace(exc_value=KeyboardInterrupt()), SimpleNamespace(exc_value=ValueError("x"))
    assert _joined(monkeypatch, lambda: sys.unraisablehook(ctrl_c)) == (True, [])
    assert _joined(monkeypatch, lambda: sys.unraisablehook(other)) == (False, [other])
    assert _joined(monkeypatch, lambda: None) == (False, [])

    def raised() -> None:
        raise KeyboardInterrupt

    assert _joined(monkeypatch, raised) == (True, [])


def test_diagnose_refuses_a_tolerance_that_is_no_positive_number_before_it_looks_at_the_machine(monkeypatch, capsys):
    monkeypatch.setattr(diagnose, "diagnose_machine", lambda: pytest.fail("the machine diagnosed"))
    assert main(["diagnose", "d", "--tolerance-s", "-0.5"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "lerobot-dali diagnose: --tolerance-s must be a positive finite number of seconds, got -0.5\n",
    )


@pytest.fixture
def progress_loggers():
    """The loggers check's progress goes to, at NOTSET (as in a fresh process), their levels and the root's put back
    after."""
    names = ("", cli._CHECK_LINES, "lerobot_dali.concurrent_calls")
    loggers = [logging.getLogger(name or None) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers[1:]:
        logger.setLevel(logging.NOTSET)
    yield loggers[1:]
    for logger, level in zip(loggers, before, strict=True):
        logger.setLevel(level)


@pytest.mark.parametrize(
    ("json", "root", "levels"),
    [
        (False, logging.WARNING, [logging.INFO, logging.INFO]),  # (the progress shown without -v)
        (True, logging.WARNING, [logging.WARNING, logging.WARNING]),  # (--json: nothing but the JSON)
        (False, logging.DEBUG, [logging.DEBUG, logging.DEBUG]),  # (-vv: their debug lines too, not cut to INFO)
    ],
)
def test_check_shows_its_progress_at_info_unless_json_and_keeps_a_lower_level(
    progress_loggers, json: bool, root: int, levels: list[int]
) -> None:
    logging.getLogger().setLevel(root)
    cli._show_check_progress(argparse.Namespace(json=json))
    assert [logger.getEffectiveLevel() for logger in progress_loggers] == levels


def test_the_exit_statuses_wrap_under_their_meaning_and_never_break_a_flag(monkeypatch) -> None:
    """``--help``'s exit statuses: each meaning's next lines start under its first word (7 columns), within
    HELP_WIDTH, and a flag at a line's end goes whole to the next line (as the options' help: no ``--timestamp-``
    left at a line's end)."""
    lines = cli._exit_statuses().splitlines()
    assert lines[0] == "exit status:" and all(len(line) <= HELP_WIDTH for line in lines)
    for line in lines[1:]:
        assert re.match(r"  \d+ +\S|       \S", line), line
    monkeypatch.setattr(cli, "EXIT_STATUSES", ((2, "give " + "x" * 55 + " --timestamp-source frame_index"),))
    assert cli._exit_statuses().splitlines() == [
        "exit status:",
        "  2    give " + "x" * 55,
        "       --timestamp-source frame_index",
    ]
