"""The options lerobot-dali bench, pipelines/train.py and pipelines/lerobot_policy.py share take each other's spelling:
``--image-size 224x224`` (the bench's) and ``--image-size 224 224`` (train.py's), ``--pool-size`` (the bench's) and
``--episode-pool-size`` (the training scripts')."""

from __future__ import annotations

import argparse
import re

import pytest

from lerobot_dali.cli import _parser, main
from pipelines import lerobot_policy
from pipelines.train import parse_args

BENCH = ["bench", "--quick"]
TRAIN = ["--dataset", "d", "--steps", "1", "--device", "cpu"]
SIZE_TAKES = "--image-size takes a positive height and width up to 8192, HxW (224x224) or H W (224 224)"


@pytest.mark.parametrize("size", [["224x160"], ["224X160"], ["224", "160"]])
def test_image_size_is_taken_as_hxw_or_as_h_w_by_bench_and_train(size: list[str]) -> None:
    assert _parser().parse_args([*BENCH, "--image-size", *size]).image_size == (224, 160)
    assert parse_args([*TRAIN, "--image-size", *size]).image_size == (224, 160)
    assert parse_args([*TRAIN, "--image-size", "8192x8192"]).image_size == (8192, 8192)  # (the largest taken)


@pytest.mark.parametrize("flag", ["--pool-size", "--episode-pool-size"])
def test_the_episode_pool_size_is_taken_under_either_name(flag: str) -> None:
    assert _parser().parse_args([*BENCH, flag, "5"]).episode_pool_size == 5
    assert parse_args([*TRAIN, flag, "6"]).episode_pool_size == 6
    assert lerobot_policy.parse_args(["--dataset", "d", flag, "7"]).episode_pool_size == 7


def test_the_defaults_are_unchanged() -> None:
    from lerobot_dali.sample_order import DEFAULT_EPISODE_POOL_SIZE

    bench = _parser().parse_args(BENCH)
    assert (bench.image_size, bench.episode_pool_size) == (None, DEFAULT_EPISODE_POOL_SIZE)
    train = parse_args(TRAIN)
    assert (train.image_size, train.episode_pool_size) == (None, 64)


@pytest.mark.parametrize("size", [["224"], ["224x"], ["224", "x"], ["1", "2", "3"], ["2x3", "4"]])
def test_an_image_size_of_neither_form_is_refused_saying_both(size: list[str], capsys) -> None:
    for parse in (lambda: _parser().parse_args([*BENCH, "--image-size", *size]),
                  lambda: parse_args([*TRAIN, "--image-size", *size])):  # fmt: skip
        with pytest.raises(SystemExit):
            parse()
        err = capsys.readouterr().err
        assert f"{SIZE_TAKES.replace(' takes', ': takes')}, got {' '.join(size)!r}" in err, err


#: What train.py's argparse errors end in (usage_on_error=False), which the bench's do not.
SEE_HELP = re.compile(r" \(\S+ --help lists the options\)$")


def _image_size_help(parser: argparse.ArgumentParser) -> str | None:
    return next(action.help for action in parser._actions if "--image-size" in action.option_strings)


def _train_parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser train.py's parse_args builds, taken as it starts parsing."""

    class Captured(Exception):
        pass

    def capture(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Captured(parser)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(Captured) as captured:
            parse_args(TRAIN)
    return captured.value.args[0]


@pytest.mark.parametrize("size", [["0x5"], ["0", "5"], ["7x0"], ["-1", "5"], ["224"], ["1", "2", "3"]])
def test_bench_and_train_word_image_size_alike(size: list[str], tmp_path, monkeypatch, capsys, caplog) -> None:
    """Its help and its errors were worded two ways: the bench's "resize frames to HxW" and "--image-size must be HxW
    with both > 0, got 0x5", train.py's "resize cameras on the device" and "--image-size takes a positive height and
    width, got 0 5". One helper words them now, what is wrong said as the help says what is allowed."""
    import logging

    import lerobot_dali.bench
    from pipelines import train as train_module

    bench_help = _image_size_help(_parser()._subparsers._group_actions[0].choices["bench"])  # type: ignore[union-attr]
    assert bench_help == _image_size_help(_train_parser(monkeypatch))
    assert bench_help is not None and SIZE_TAKES.removeprefix("--image-size takes ") in bench_help
    monkeypatch.setattr(lerobot_dali.bench, "run_bench", lambda config: pytest.fail("the bench started"))
    said = []
    for run in (
        lambda: main([*BENCH, "--device", "cpu", "--cache-dir", str(tmp_path), "--image-size", *size]),
        lambda: train_module.main([*TRAIN, "--image-size", *size]),
    ):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"), pytest.raises(SystemExit) as status:
            raise SystemExit(run())  # (argparse's own error, a word of neither form, exits from the parser)
        assert status.value.code == 2
        line = caplog.records[0].getMessage() if caplog.records else capsys.readouterr().err.splitlines()[-1]
        said.append(SEE_HELP.sub("", line.split(": ", 1)[1].removeprefix("error: argument ")))
    assert said[0] == said[1] and said[0].replace(":", "", 1).startswith(SIZE_TAKES)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--image-size", "-1x5"], f"{SIZE_TAKES}, got -1x5"),
        (["--tolerance-s", "-1e-3"], "--tolerance-s must be a positive finite number of seconds, got -0.001"),
        (["--tolerance-s", "-inf"], "--tolerance-s must be a positive finite number of seconds, got -inf"),
        (["--tolerance-s", "-NaN"], "--tolerance-s must be a positive finite number of seconds, got nan"),
        # (past NVDEC's largest frame: a square of 16,256 was a VideoDecodeError blaming the video; 2**32 an
        # OverflowError traceback at the first batch)
        (["--image-size", "16256x16256"], f"{SIZE_TAKES}, got 16256x16256"),
        (["--image-size", "4294967296x64"], f"{SIZE_TAKES}, got 4294967296x64"),
        (["--image-size", "8193x64"], f"{SIZE_TAKES}, got 8193x64"),
    ],
)
def test_bench_takes_a_value_that_starts_as_a_negative_number_as_its_value(
    argv: list[str], said: str, tmp_path, monkeypatch, capsys
) -> None:
    """``--image-size -1x5`` stopped at argparse's "expected at least one argument" (it took ``-1x5`` for an option),
    where ``--image-size=-1x5`` reached the check that says what is allowed; both reach it now."""
    import lerobot_dali.bench

    monkeypatch.setattr(lerobot_dali.bench, "run_bench", lambda config: pytest.fail("the bench started"))
    for given in (argv, [f"{argv[0]}={argv[1]}"]):
        assert main([*BENCH, "--device", "cpu", "--cache-dir", str(tmp_path), *given]) == 2
        assert capsys.readouterr().err == f"lerobot-dali bench: {said}\n", given


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--image-size", "-1x5"], f"{SIZE_TAKES}, got -1x5"),
        (["--lr", "-1e-3"], "--lr must be a finite number > 0, got -0.001"),
        (["--lr", "-inf"], "--lr must be a finite number > 0, got -inf"),
        (["--grad-clip", "-1e-3"], "--grad-clip must be a finite number >= 0 (0: no clipping), got -0.001"),
        (["--tolerance-s", "-1e-3"], "--tolerance-s must be a positive finite number of seconds, got -0.001"),
        (["--dataset", "d", "e", "--weights", "-1e-3", "1"], "--weights must be finite numbers > 0, got -0.001 1.0"),
    ],
)
def test_the_training_scripts_take_a_value_that_starts_as_a_negative_number_as_its_value(
    argv: list[str], said: str, caplog
) -> None:
    """As the bench's: ``--lr -1e-3`` was argparse's "expected one argument", ``--lr=-1e-3`` train.py's own line."""
    import logging

    from pipelines import train as train_module

    # (FLAG=VALUE too, where one value follows the flag: argparse gives a flag of several values one so)
    joined = [*argv[:-2], f"{argv[-2]}={argv[-1]}"] if argv[-2].startswith("--") else None
    for given in (argv, joined) if joined else (argv,):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pipelines.train"):
            assert train_module.main([*TRAIN, *given]) == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [f"train.py: {said}"], given
    if argv[0] == "--tolerance-s":  # (lerobot_policy.py's parser is the same kind: its check said, not argparse's)
        with pytest.raises(ValueError, match="--tolerance-s must be a positive finite number of seconds"):
            lerobot_policy.parse_args(["--dataset", "d", "--tolerance-s", "-1e-3"])


@pytest.mark.parametrize("flag", ["--pool-size", "--episode-pool-size"])
def test_an_episode_pool_size_refused_is_named_as_help_names_it_under_either_spelling(
    flag: str, tmp_path, monkeypatch, capsys, caplog
) -> None:
    """The bench named it --pool-size, typed --episode-pool-size too, which --help lists first and train.py names."""
    import logging

    import lerobot_dali.bench
    from pipelines import train as train_module

    monkeypatch.setattr(lerobot_dali.bench, "run_bench", lambda config: pytest.fail("the bench started"))
    assert main([*BENCH, "--device", "cpu", "--cache-dir", str(tmp_path), flag, "0"]) == 2
    assert capsys.readouterr().err == "lerobot-dali bench: --episode-pool-size must be an int >= 1, got 0\n"
    with caplog.at_level(logging.ERROR, logger="pipelines.train"):
        assert train_module.main([*TRAIN, flag, "0"]) == 2
    assert [r.getMessage() for r in caplog.records] == ["train.py: --episode-pool-size must be an int >= 1, got 0"]


def test_choice_flags_take_any_case_as_the_library_does(capsys: pytest.CaptureFixture[str]) -> None:
    # (each was "invalid choice: 'SARM' (choose from 'single', 'sarm')" while the library takes any case)
    bench = _parser().parse_args(
        [*BENCH, "--mode", "SARM", "--timestamp-source", "Frame_Index", "PARQUET_TIMESTAMP", "--device", "CPU"]
    )
    assert (bench.mode, bench.timestamp_source, bench.device) == ("sarm", ["frame_index", "parquet_timestamp"], "cpu")
    check = _parser().parse_args(["check", "d", "--timestamp-source", "FRAME_INDEX"])
    assert check.timestamp_source == ["frame_index"]
    make = _parser().parse_args(["make-dataset", "out", "--codec", "H264", "--version", "V2.1"])
    assert (make.codec, make.version) == ("h264", "v2.1")
    assert _parser().parse_args(["reencode", "d", "out", "--codec", "HEVC"]).codec == "hevc"
    with pytest.raises(SystemExit):
        _parser().parse_args([*BENCH, "--mode", "pair"])
    assert "invalid choice: 'pair'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["bench", "--help"])
    assert "{single,sarm}" in capsys.readouterr().out


def test_the_training_scripts_choice_flags_take_any_case_as_lerobot_dalis_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # (602aabb made lerobot-dali's take any case; train.py's --device, --mixed-precision, --timestamp-source and
    # lerobot_policy.py's --device, --decode, --timestamp-source still said "invalid choice": 6 of 6)
    train = parse_args([*TRAIN[:-1], "CPU", "--mixed-precision", "BF16", "--timestamp-source", "FRAME_INDEX"])
    assert (train.device, train.mixed_precision, train.timestamp_source) == ("cpu", "bf16", "frame_index")
    policy = lerobot_policy.parse_args(
        ["--dataset", "d", "--device", "CPU", "--decode", "Cpu", "--timestamp-source", "Frame_Index"]
    )
    assert (policy.device, policy.decode, policy.timestamp_source) == ("cpu", "cpu", "frame_index")
    with pytest.raises(SystemExit):
        parse_args([*TRAIN[:-1], "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_a_dataset_given_after_an_option_of_several_values_is_named_so(tmp_path, capsys) -> None:
    """``check --episodes 0 1 DATASET`` and ``info --cameras cam DATASET``: the option took DATASET, and argparse said
    only "invalid int value: 'DATASET'" or "the following arguments are required: dataset" (a review)."""
    hint = "(given after an option of several values, such as --cameras, --episodes or --tolerance-s, it was taken "
    for argv, said in (
        (["check", "--episodes", "0", "1", str(tmp_path)], f"argument --episodes: invalid int value: '{tmp_path}' "),
        (["check", "--tolerance-s", "0.1", str(tmp_path)], f"invalid float value: '{tmp_path}' "),
        (["info", "--cameras", "cam", str(tmp_path)], "the following arguments are required: dataset "),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exited.value.code == 2 and said + hint in err, err
    with pytest.raises(SystemExit):
        main(["check", "--tolerance-s", "abc", str(tmp_path)])  # (no path taken: no hint)
    assert "invalid float value: 'abc'\n" in capsys.readouterr().err


@pytest.mark.parametrize(
    "helps",
    [
        *(lambda verb=verb: _parser().parse_args([*verb, "--help"]) for verb in ([], ["make-dataset"], ["check"])),
        *(
            lambda verb=verb: _parser().parse_args([verb, "--help"])
            for verb in ("info", "bench", "diagnose", "reencode")
        ),
        lambda: parse_args(["--help"]),
        lambda: lerobot_policy.parse_args(["--help"]),
    ],
    ids=[
        "lerobot-dali",
        "make-dataset",
        "check",
        "info",
        "bench",
        "diagnose",
        "reencode",
        "train.py",
        "lerobot_policy.py",
    ],
)
def test_help_never_breaks_a_flag_across_lines(helps, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """argparse wraps at hyphens: make-dataset's --codec help said "ignored with --image-" / "cameras", train.py's
    --recipe "--drop-n-last-" / "frames" (which its RawTextHelpFormatter ran to 188 characters a line). Each help
    wraps to the terminal at spaces alone; the verbs' exit statuses stay as written.

    The usage and the flags' own lines fit too: argparse cannot break a flag's choices, and check's, the bench's and
    train.py's ``--timestamp-source {parquet_timestamp,frame_index} [{parquet_timestamp,frame_index} ...]`` ran to
    116 columns in usage, 90 among the options (diagnose's to 81); its metavar is SOURCE, its help names the
    choices. So do the description and the exit statuses, which the formatter keeps as written: lerobot-dali's
    description ran to 90 columns, its exit statuses (every verb's epilog) to 100, train.py's and lerobot_policy.py's
    descriptions to 90 and 105; each is wrapped to 80 as it is written."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        helps()
    said = capsys.readouterr().out
    assert not re.search(r"--[a-z][a-z-]*-\n", said), re.findall(r".*--[a-z][a-z-]*-\n.*", said)
    assert max(len(line) for line in said.splitlines()) <= 80, [line for line in said.splitlines() if len(line) > 80]
    assert "``" not in said  # (a docstring's markup, which a description leaves out)


def test_timestamp_source_named_source_in_help_still_refuses_what_its_choices_lack(capsys, monkeypatch) -> None:
    """Its metavar SOURCE (for the usage to fit 80 columns) leaves argparse's check of its choices, named in its
    help. Every verb and script words it and ``--tolerance-s`` alike (four definitions each said it its own way:
    "max |frame pts - row time|", "most a row's time may be from its video frame")."""
    for argv in (["check", "d"], [*BENCH], ["diagnose", "d"]):
        with pytest.raises(SystemExit):
            _parser().parse_args([*argv, "--timestamp-source", "pts"])
        assert "--timestamp-source: invalid choice: 'pts'" in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        parse_args([*TRAIN, "--timestamp-source", "pts"])
    assert "--timestamp-source: invalid choice: 'pts'" in capsys.readouterr().err
    monkeypatch.setenv("COLUMNS", "80")
    how = (
        "how rows find their video frames, SOURCE one of parquet_timestamp, frame_index (default parquet_timestamp; "
        "frame_index: frame_index / fps, for wall-clock parquet timestamps)"
    )
    tolerance = "the most a row's time may be from its video frame's pts, in seconds (default 0.0001)"
    several = "; one for every dataset, or one per "
    helps = {
        "check": (lambda: _parser().parse_args(["check", "--help"]), " [SOURCE ...] ", f"{several}DATASET"),
        "bench": (lambda: _parser().parse_args(["bench", "--help"]), " [SOURCE ...] ", f"{several}--dataset"),
        "diagnose": (lambda: _parser().parse_args(["diagnose", "--help"]), " with DATASET: ", ""),
        "train.py": (lambda: parse_args(["--help"]), " [SOURCE ...] ", f"{several}--dataset"),
        "lerobot_policy.py": (lambda: lerobot_policy.parse_args(["--help"]), " ", ""),
    }  # fmt: skip
    for name, (helps_of, before, each) in helps.items():
        with pytest.raises(SystemExit):
            helps_of()
        said = " ".join(capsys.readouterr().out.split())
        assert f"--timestamp-source SOURCE{before}{how}{each}" in said, name
        assert f"{tolerance}{each}" in said, name
