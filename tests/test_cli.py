"""The command line: info on the real datasets, make-dataset -> info round trip, diagnose, clear failures."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.utils import LocalEntryNotFoundError

from lerobot_dali.cli import main
from lerobot_dali.generate import make_dataset
from tests.conftest import refuse_opening, shared_dataset


def _info_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["info", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_cr5_v30_probes_av1_and_counts_files(capsys) -> None:
    info = _info_json(capsys, str(shared_dataset("cr5_v30_av1")))
    assert (info["codebase_version"], info["total_episodes"], info["total_frames"]) == ("v3.0", 12, 2733)
    camera = info["cameras"]["observation.images.top"]
    assert camera["codec"] == "av1" and camera["resolution"] == [480, 640]
    assert camera["video_files"] == 3 and camera["episodes_per_file"] == {"min": 2, "max": 5}
    assert camera["gop_frames"] == 2 and camera["b_frames"] is False


def test_info_says_which_timestamp_source_reads_each_dataset(capsys) -> None:
    """Every row of the first episode looked up by each source: cr5 (wall-clock) and gr00t (a frame ahead)
    read by frame_index only; r1 (10 fps rows, 25 fps video) by neither at the default tolerance."""
    cases = {
        "cr5_v30_av1": ("observation.images.top", ()),
        "gr00t_v20_h264": ("observation.images.ego_view", ("--cameras", "observation.images.ego_view")),
        "r1_v30_h264": ("observation.images.rgb", ()),
    }
    found = {}
    for name, (camera, extra) in cases.items():
        lookup = _info_json(capsys, str(shared_dataset(name)), *extra)["cameras"][camera]["frame_lookup"]
        found[name] = {source: said == "ok" for source, said in lookup.items()}
        if not found[name]["parquet_timestamp"]:
            assert "has no video frame within tolerance_s=0.0001" in lookup["parquet_timestamp"]
    assert found == {
        "cr5_v30_av1": {"parquet_timestamp": False, "frame_index": True},
        "gr00t_v20_h264": {"parquet_timestamp": False, "frame_index": True},
        "r1_v30_h264": {"parquet_timestamp": False, "frame_index": False},
    }
    assert main(["info", str(shared_dataset("cr5_v30_av1"))]) == 0
    printed = capsys.readouterr().out
    assert "parquet_timestamp fails, frame_index ok -> read with timestamp_source='frame_index'" in printed
    assert "(on the command line --timestamp-source frame_index)" in printed  # (what check and diagnose take)
    assert "3 video files, 2-5 episodes per file" in printed
    assert "random access" not in printed
    # Neither source reads r1 at the default tolerance: the text says why, and what would (no --json needed).
    assert main(["info", str(shared_dataset("r1_v30_h264"))]) == 0
    printed = capsys.readouterr().out
    assert "parquet_timestamp fails, frame_index fails -> why:" in printed
    assert "Raise tolerance_s to 0.0201 (half a video frame; on the command line --tolerance-s 0.0201)" in printed
    # r1's keyframes are 250 frames apart (cr5's 2): what a random frame costs, and what re-encoding would.
    assert "random access: about 125.5 frames decoded per frame (from the keyframe before it)" in printed
    assert "1 video file, 1 episode per file" in printed  # (it said "1-1 episodes per file")
    assert "    info.json declares video.fps 10 (the file: 25): reading follows the files;" in printed
    assert main(["info", str(shared_dataset("r1_v30_h264")), "--tolerance-s", "0.0201"]) == 0  # checks the advice
    assert "tolerance 0.0201 s: parquet_timestamp ok, frame_index ok" in capsys.readouterr().out
    assert main(["info", str(shared_dataset("r1_v30_h264")), "--tolerance-s", "-1"]) == 2
    assert "--tolerance-s must be a positive finite number of seconds, got -1.0" in capsys.readouterr().err


def test_info_cr5_v21_reports_the_same_dataset(capsys) -> None:
    info = _info_json(capsys, str(shared_dataset("cr5_v21_av1")))
    assert (info["codebase_version"], info["total_episodes"], info["total_frames"]) == ("v2.1", 12, 2733)
    assert info["cameras"]["observation.images.top"]["video_files"] == 12


def test_info_r1_reports_true_video_fps_and_b_frames(capsys) -> None:
    info = _info_json(capsys, str(shared_dataset("r1_v30_h264")))
    camera = info["cameras"]["observation.images.rgb"]
    assert camera["declared_fps"] == 10 and camera["fps"] == 25.0  # info.json is wrong; the file says 25
    assert camera["info_json_unlike"] == ["video.fps 10 (the file: 25)"]
    assert camera["codec"] == "h264" and camera["b_frames"] is True


def test_info_gr00t_fails_clearly_then_loads_with_cameras(capsys) -> None:
    root = str(shared_dataset("gr00t_v20_h264"))
    assert main(["info", root]) == 2
    err = capsys.readouterr().err
    assert "MissingDataFileError" in err and "observation.images.egoview" in err
    info = _info_json(capsys, root, "--cameras", "observation.images.ego_view")
    assert (info["codebase_version"], info["total_episodes"], info["total_frames"]) == ("v2.0", 5, 2096)


def test_make_dataset_then_info_then_diagnose(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    args = ["make-dataset", str(out), "--episodes", "3", "--frames-per-episode", "6", "--cameras", "2"]
    assert main([*args, "--size", "64x96", "--codec", "vp9", "--gop", "3", "--episodes-per-file", "2"]) == 0
    capsys.readouterr()
    info = _info_json(capsys, str(out))
    assert (info["total_episodes"], info["total_frames"]) == (3, 18)
    assert info["cameras"]["observation.images.cam1"]["resolution"] == [64, 96]
    assert info["cameras"]["observation.images.cam1"]["episodes_per_file"] == {"min": 1, "max": 2}
    lookup = info["cameras"]["observation.images.cam1"]["frame_lookup"]
    assert lookup == {"parquet_timestamp": "ok", "frame_index": "ok"}
    assert main(["info", str(out)]) == 0
    assert "camera observation.images.cam1: codec vp9 64x96 (HxW) 30 fps GOP 3;" in capsys.readouterr().out
    assert main(["diagnose", str(out)]) == 0
    report = capsys.readouterr().out
    assert "observation.images.cam0: codec vp9 64x96 (HxW) -> route dali_cpu" in report
    assert "  cpu_fallback  ok" in report and report.count(" 64x96") == 6  # the decoded frames are HxW too
    assert report.count(" ok ") == 4  # cpu_fallback and dali_cpu for each camera


def test_make_image_dataset_then_info(tmp_path: Path, capsys) -> None:
    out = tmp_path / "images"
    args = ["make-dataset", str(out), "--episodes", "2", "--frames-per-episode", "3", "--size", "64x64"]
    assert main([*args, "--cameras", "1", "--image-cameras"]) == 0
    capsys.readouterr()
    info = _info_json(capsys, str(out))
    assert info["cameras"] == {} and info["image_cameras"] == ["observation.images.cam0"]
    assert info["features"]["observation.images.cam0"] == {"dtype": "image", "shape": [64, 64, 3]}
    assert main(["info", str(out), "--no-probe"]) == 0
    assert "camera observation.images.cam0: images in the data files" in capsys.readouterr().out


def test_console_entry_point_runs_without_loading_dali() -> None:
    code = "import sys; from lerobot_dali.cli import main; main(['--help'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "make-dataset" in done.stdout
    code = (
        "import sys\nfrom lerobot_dali.cli import _parser\n_parser()\n"
        "assert 'nvidia.dali' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_augmentation_configs_and_recipes_load_without_dali() -> None:
    """Configs are checked where they are written (a recipe file, the command line): that needs no DALI, which
    loaded with them when they lived beside the graph (0.4 s, and a DALI install for a config check)."""
    code = (
        "import sys\nsys.path.insert(0, 'pipelines')\nimport recipes\n"
        "from lerobot_dali import AugmentConfig\nAugmentConfig.from_dict({'resize': [8, 8]})\n"
        "assert 'nvidia.dali' not in sys.modules, 'DALI loaded'"
    )
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo)
    assert done.returncode == 0, done.stderr


def test_bad_size_argument_is_rejected() -> None:
    with pytest.raises(SystemExit):
        main(["make-dataset", "x", "--size", "big"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--episodes", "0"), "make-dataset: --episodes must be in [1, "),
        (("--frames-per-episode", "-1"), "make-dataset: --frames-per-episode must be in [1, "),
        (("--cameras", "-1"), "make-dataset: --cameras must be in [0, "),
        (("--size", "0x0"), "size[0] (height) must be >= 64, got 0"),
        (("--size", "63x64"), "size[0] (height) must be >= 64, got 63"),
        (("--fps", "0"), "make-dataset: --fps must be >= 1, got 0"),
        (("--gop", "0"), "--gop (maximum keyframe interval in frames) must be >= 1, got 0"),
        (("--episodes-per-file", "0"), "make-dataset: --episodes-per-file must be >= 1, got 0"),
        (("--seed", "-1"), "make-dataset: --seed must be >= 0, got -1"),
        # Past what the codec encodes: a libsvtav1/libx264 error from inside PyAV once writing started, now said first.
        (
            ("--size", "20000x20000"),
            "size 20000x20000 (height x width) is more than libsvtav1 (codec av1) encodes: height at most 8704, width "
            "at most 16384, height x width at most 142606336 pixels; 8704x16384 works",
        ),
        (
            ("--codec", "h264", "--size", "16384x16384"),
            "size 16384x16384 (height x width) is more than libx264 (codec h264) encodes: height at most 16384, width "
            "at most 16384, height x width at most 264241152 pixels; 16254x16254 works",
        ),
        (("--codec", "hevc", "--size", "70000x64"), "height at most 65534, width at most 65534, "),
        (("--fps", "1000"), "--fps 1000 is more than libsvtav1 (codec av1) encodes: at most 240; pass fps 240 or less"),
        (
            ("--gop", "2147483648"),
            "--gop (maximum keyframe interval in frames) must be in [1, 2147483647], got 2147483648",
        ),
    ],
)
def test_make_dataset_bad_options_are_one_line_errors(
    tmp_path: Path, capsys, option: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "out"
    assert main(["make-dataset", str(out), "--episodes", "1", "--frames-per-episode", "1", *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lerobot-dali make-dataset: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_reencode_names_its_bad_options_as_flags(tmp_path: Path, capsys) -> None:
    """The library's argument names came through: "jobs must be >= 1", "crf for vp9 must be in [0, 63]" (a review)."""
    source = make_dataset(tmp_path / "ds", episodes=1, frames_per_episode=4, size=(64, 64), codec="vp9")
    for flags, said in ((["--jobs", "0"], "--jobs must be >= 1, got 0"),
                        (["--crf", "99", "--codec", "vp9"], "--crf for vp9 must be in [0, 63], got 99")):  # fmt: skip
        assert main(["reencode", str(source), str(tmp_path / "out"), *flags]) == 2
        assert capsys.readouterr().err.startswith(f"lerobot-dali reencode: {said}")


def test_make_dataset_unusable_out_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    for out, message in (("afile", "it exists and is not an empty directory"), ("full", "not an empty directory"),
                         ("afile/sub", "afile")):  # fmt: skip
        assert main(["make-dataset", str(tmp_path / out), "--episodes", "1", "--frames-per-episode", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("lerobot-dali make-dataset: ") and message in err and err.count("\n") == 1, err
    assert (tmp_path / "afile").read_text() == "x" and [p.name for p in (tmp_path / "full").iterdir()] == ["keep"]


def test_make_dataset_inside_a_dataset_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    """make-dataset wrote a dataset inside another (its data/ or meta/ folder, or one a link leads into), to be copied
    and uploaded with it: 3 of 3 such outs written. Refused now, as train.py refuses its outputs there; nothing is
    written, and a folder beside the dataset is taken."""
    dataset = tmp_path / "ds"
    (dataset / "meta").mkdir(parents=True)
    (dataset / "meta" / "info.json").write_text("{}")
    (dataset / "data").mkdir()
    (tmp_path / "link").symlink_to(dataset / "data")
    one = ["--episodes", "1", "--frames-per-episode", "1", "--cameras", "0"]
    for out in (dataset / "sub", dataset / "data" / "chunk-001" / "new", tmp_path / "link" / "new"):
        assert main(["make-dataset", str(out), *one]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"lerobot-dali make-dataset: Refusing to write a dataset into {out}: it is inside the dataset {dataset}. "
            "Pass a path outside it (make_dataset writes a dataset of its own).\n"
        )
    assert sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*")) == ["data", "meta", "meta/info.json"]
    assert main(["make-dataset", str(tmp_path / "beside"), *one]) == 0
    assert (tmp_path / "beside" / "meta" / "info.json").is_file()


#: A dataset's files whose reading is refused, as globbed from its root: its info.json, a data file, a video file.
_UNREADABLE = ("meta/info.json", "data/*/*.parquet", "videos/*/*/*.mp4")


@pytest.mark.parametrize("pattern", _UNREADABLE[:2])
def test_a_file_this_user_may_not_read_is_one_line_naming_it(
    make_ds: Callable[..., Path], copy_ds: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch, capsys, pattern: str
) -> None:
    """info.json or the first data file the user may not read (its permissions): the dataset does not open, one line
    naming the file, exit status 2 (the other datasets checked still); the iterator raises PermissionError naming it
    (builtins', where it opens it). A video file: test_every_verbs_exit_status_for_damaged_and_refused_videos."""
    from lerobot_dali import DALILeRobotIterator

    readable = make_ds(episodes=2, frames_per_episode=4, cameras=1, episodes_per_file=1)
    dataset = copy_ds(readable)
    refused = sorted(dataset.glob(pattern))[0]
    refuse_opening(monkeypatch, refused)
    for verb in ("info", "check"):
        assert main([verb, str(dataset)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(refused) in err and "permission denied" in err.lower(), err
    assert main(["check", str(dataset), str(readable)]) == 2  # (the other dataset is checked still)
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"{dataset}: cannot open {str(dataset)!r}: ") and str(refused) in said[0], said
    assert said[-1] == "1 of 2 datasets have problems" and f"{readable}: 2 episodes" in said[1], said
    with pytest.raises(PermissionError, match=re.escape(str(refused))):
        DALILeRobotIterator(str(dataset), batch_size=1, device="cpu", num_workers=0)


def _damaged(video: Path) -> None:
    video.write_bytes(video.read_bytes()[:300])  # (its header cut short: the container does not open)


@pytest.mark.parametrize("harm", ["damaged", "refused"])
def test_every_verbs_exit_status_for_damaged_and_refused_videos(
    harm: str, make_ds: Callable[..., Path], copy_ds: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A video file this user may not read stopped check at the first one (exit 2, one line naming it: the other
    files never looked at) and info too (2), where a damaged one was listed (exit 1, every one named): 2 of 2 refused
    videos left unlisted. Each verb now exits as --help's 'exit status' says, one refused or damaged video or two:
    listed (1) by info, check (one dataset or several) and diagnose, not done (2) by reencode."""
    readable = make_ds(episodes=3, frames_per_episode=4, cameras=1, episodes_per_file=1)
    dataset = copy_ds(readable)
    for count in (1, 2):  # (the second video harmed on top of the first)
        videos = sorted(dataset.glob("videos/*/*/*.mp4"))[:count]
        for video in videos[count - 1 :]:
            if harm == "damaged":
                _damaged(video)
            else:  # (its mode too, as chmod would: the ctime that tells caches of the file it changed)
                video.chmod(0o200)
                refuse_opening(monkeypatch, video)
        for argv, status in (
            (["check", str(dataset), "--workers", "0"], 1),
            (["check", str(dataset), str(readable), "--workers", "0"], 1),
            (["info", str(dataset)], 1),
            (["diagnose", str(dataset)], 1),
            # (refused: its encoding processes open the files, which this process's refusal does not reach)
            *([(["reencode", str(dataset), str(dataset.parent / f"copy{count}")], 2)] if harm == "damaged" else []),
        ):
            assert main(argv) == status, (argv, count)
            said = capsys.readouterr()
            if argv[0] == "check":
                problems = [line for line in said.out.splitlines() if line.startswith("episode ")]
                files = [str(video.relative_to(dataset)) for video in videos]  # (the first line names the dataset)
                assert all(any(file in line for line in problems) for file in files), (argv, said.out)
                assert not any(f"{dataset}/" in line for line in problems), (argv, said.out)
                assert said.out.count(f"{dataset}: 3 episodes") == 1
            elif argv[0] in ("info", "diagnose"):
                assert str(videos[0]) in said.out and not said.err.strip(), said
            else:
                assert said.err.count("\n") == 1 and not (dataset.parent / f"copy{count}").exists(), said.err
    assert main(["check", str(readable), "--workers", "0"]) == 0


def test_every_verbs_exit_status_for_usage_a_missing_dataset_and_a_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Bad usage (argparse's, or a value's own check) and a dataset that is not there are 2 for every verb, a Ctrl-C
    130, as --help's 'exit status' and the README's table say (both from EXIT_STATUSES)."""
    from lerobot_dali import cli

    missing = str(tmp_path / "missing")
    for verb, args in (
        ("info", [missing]),
        ("check", [missing]),
        ("diagnose", [missing]),
        ("reencode", [missing, str(tmp_path / "out")]),
        ("bench", ["--dataset", missing, "--out", str(tmp_path / "results"), "--quick", "--device", "cpu"]),
    ):
        assert main([verb, *args]) == 2, verb
        assert capsys.readouterr().err.startswith(f"lerobot-dali {verb}: DatasetNotFoundError: "), verb
        with pytest.raises(SystemExit) as usage:
            main([verb, *args, "--no-such-flag"])
        assert usage.value.code == 2
        capsys.readouterr()
    assert main(["check", missing, "--show", "-1"]) == 2
    assert main(["make-dataset", str(tmp_path / "ds"), "--episodes", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 2
    for verb in ("info", "check", "diagnose", "reencode", "bench", "make_dataset"):
        with monkeypatch.context() as patch:

            def interrupted(args: object) -> int:
                raise KeyboardInterrupt

            patch.setattr(cli, f"_{verb}", interrupted)
            argv = {"diagnose": [], "bench": [], "reencode": ["a", "b"], "make_dataset": ["x"]}.get(verb, ["d"])
            assert main([verb.replace("_", "-"), *argv]) == 130, verb
        assert capsys.readouterr().err == f"lerobot-dali {verb.replace('_', '-')}: interrupted\n"
    assert not (tmp_path / "results").exists() and not (tmp_path / "out").exists()


def test_the_exit_statuses_are_in_help_and_in_the_readme(capsys) -> None:
    from lerobot_dali.cli import EXIT_STATUSES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for verb in ([], ["check"], ["reencode"]):
        with pytest.raises(SystemExit):
            main([*verb, "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        for code, meaning in EXIT_STATUSES:
            assert f"{code} {meaning}" in shown, (verb, code)
    for code, meaning in EXIT_STATUSES:
        assert f"| {code} | {meaning.replace('|', chr(92) + '|')} |" in readme, code


def test_datasets_that_cannot_be_opened_are_one_line_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if s3fs were not installed

    def unreachable_hub(repo_id: str, **kwargs: object) -> str:
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nAn error happened")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable_hub)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # (offline, they say so instead)
    bench = ["bench", "--device", "cpu", "--out", str(tmp_path / "results"), "--dataset"]
    cases = [
        (["info", "s3://bucket/ds"], "Install s3fs"),
        (["diagnose", "s3://bucket/ds"], "Install s3fs"),
        ([*bench, "s3://bucket/ds"], "Install s3fs"),
        (["info", "nope://bucket/ds"], "Protocol not known: nope"),
        # (reencode's, as train.py's, was a traceback: the library's DatasetNotFoundError now)
        (
            ["reencode", "s3://bucket/ds", str(tmp_path / "out")],
            "DatasetNotFoundError: dataset 's3://bucket/ds': its filesystem is not installed here (Install s3fs",
        ),
        (["reencode", "nope://bucket/ds", str(tmp_path / "out")], "no filesystem reads its protocol (Protocol not"),
        (["info", "hf://datasets/a/b@v1", "--revision", "v2"], "give the revision in one place only"),
        (["info", "nobody/nothing"], "DatasetNotFoundError: dataset 'nobody/nothing' cannot be opened: the Hub"),
        (["diagnose", "nobody/nothing"], "DatasetNotFoundError: dataset 'nobody/nothing' cannot be opened: the Hub"),
        ([*bench, "nobody/nothing"], "DatasetNotFoundError: dataset 'nobody/nothing' cannot be opened: the Hub"),
    ]
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"lerobot-dali {argv[0]}: ") and said in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "results").exists() and not (tmp_path / "out").exists()


def test_an_out_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """make-dataset and reencode: an OUT on a full or read-only filesystem, or with a name too long, was a traceback
    with status 1 (the status of problems found); a broken or looping link as OUT was found only at the rename, once
    all the work was done (reencode's every re-run again). Each is one line now, status 2, a link before any work."""
    import errno
    import os

    from lerobot_dali import generate, reencode

    source = make_dataset(tmp_path / "ds", episodes=1, frames_per_episode=4, size=(64, 64), codec="vp9")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    make = ["make-dataset", "--episodes", "1", "--frames-per-episode", "4", "--size", "64x64", "--codec", "vp9"]
    for link, to in (("broken", tmp_path / "nowhere"), ("loop", tmp_path / "loop")):
        for argv in ([*make, str(tmp_path / link)], ["reencode", str(source), str(tmp_path / link)]):
            assert main(argv) == 2, argv
            assert capsys.readouterr().err == (
                f"lerobot-dali {argv[0]}: Cannot write a dataset to {tmp_path / link}: it is a symbolic link to "
                f"{str(to)!r}, which does not exist (or loops). Remove the link, or pass another path.\n"
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "ds", "loop"]  # (no work begun)

    def failing(code: int) -> Callable[..., None]:
        def write(*args: object, **kwargs: object) -> None:
            raise OSError(code, os.strerror(code), str(tmp_path / ".out.partial" / "x"))

        return write

    cases = [(generate, "make_dataset", make, errno.EROFS, "the filesystem is read-only: give an OUT on a writable "
              "one"), (reencode, "reencode_dataset", ["reencode", str(source)], errno.ENOSPC,
              "free space there, or give an OUT on another filesystem")]  # fmt: skip
    for module, name, argv, code, advice in cases:
        monkeypatch.setattr(module, name, failing(code))
        assert main([*argv, str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == (
            f"lerobot-dali {argv[0]}: cannot write {tmp_path / 'out'}: OSError: [Errno {code}] {os.strerror(code)}: "
            f"'{tmp_path / '.out.partial' / 'x'}'; {advice}\n"
        )
    monkeypatch.setattr(reencode, "reencode_dataset", failing(errno.EIO))  # (not OUT's: the source's, say)
    with pytest.raises(OSError, match="Input/output error"):
        main(["reencode", str(source), str(tmp_path / "out")])


def test_a_network_failure_past_its_retries_is_a_one_line_error(tmp_path: Path, monkeypatch, capsys) -> None:
    """huggingface_hub's client (httpx) raises no OSError: an unreachable Hub came out as a traceback."""
    from lerobot_dali import dataset_reader
    from tests.test_remote import ConnectError

    def unreachable(target: str, **kwargs: object) -> None:
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(dataset_reader, "resolve_location", unreachable)
    bench = ["bench", "--device", "cpu", "--quick", "--out", str(tmp_path / "results"), "--dataset"]
    for argv in (["info", "hf://datasets/a/b"], ["check", "hf://datasets/a/b"], [*bench, "hf://datasets/a/b"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err == (
            f"lerobot-dali {argv[0]}: the network failed past its retries (ConnectError: [Errno -2] Name or service "
            "not known); check the connection, or retry more with LEROBOT_DALI_REMOTE_RETRIES\n"
        ), err
    monkeypatch.setattr(dataset_reader, "resolve_location", lambda target, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # (any other failure is a bug to see whole)
        main(["info", "hf://datasets/a/b"])


def test_diagnose_dataset_after_cameras_is_refused(tmp_path: Path, capsys) -> None:
    """``--cameras`` takes every word after it, so a DATASET given last would be read as one more camera. The other
    options of a DATASET are refused without one too (before: --timestamp-source and --tolerance-s were ignored,
    exit 0, where --cameras and --revision were refused)."""
    dataset = str(tmp_path / "ds")
    cases = (
        (["--cameras", "observation.images.cam0", dataset], f"'observation.images.cam0' '{dataset}'"),
        (["--revision", "v1"], "give DATASET\n"),  # (no --cameras to give it before)
        (["--timestamp-source", "frame_index"], "give DATASET\n"),
        (["--tolerance-s", "0.5"], "give DATASET\n"),
        (["--tolerance-s", "1e-4", "--timestamp-source", "parquet_timestamp"], "give DATASET\n"),  # (the defaults)
    )
    for argv, said in cases:
        assert main(["diagnose", *argv]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured
        assert (
            captured.err.startswith(
                "lerobot-dali diagnose: --cameras, --revision, --timestamp-source and --tolerance-s need a DATASET"
            )
            and said in captured.err
        )


def test_diagnose_reports_an_unreadable_camera_and_goes_on(tmp_path: Path, capsys) -> None:
    root = make_dataset(
        tmp_path / "ds", episodes=1, frames_per_episode=3, cameras=2, size=(64, 64), codec="vp9", version="v2.1"
    )
    video = root / "videos/chunk-000/observation.images.cam0/episode_000000.mp4"
    video.write_bytes(video.read_bytes()[:300])  # truncated: no container index to read
    assert main(["diagnose", str(root)]) == 1
    report = capsys.readouterr().out
    assert "camera observation.images.cam0: FAILED VideoDecodeError: " in report and "truncated or corrupt" in report
    assert "observation.images.cam1: codec vp9 64x64 (HxW) -> route dali_cpu" in report
    assert report.count(" ok ") == 2  # cpu_fallback and dali_cpu of cam1


def test_diagnose_says_the_iterator_refuses_a_camera_and_what_reads_it(capsys, tmp_path, monkeypatch) -> None:
    """r1_v30_h264 (10 fps rows over 25 fps video): with the iterator's defaults its first episode's last row finds no
    frame, so diagnose exits 1 with the build's error, whose advice, given to diagnose, makes it exit 0 (before: a
    healthy route and exit 0 whatever the iterator did; no --tolerance-s)."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "cache"))
    dataset = str(shared_dataset("r1_v30_h264"))
    assert main(["diagnose", dataset]) == 1
    out = capsys.readouterr().out
    assert "camera observation.images.rgb: codec h264 360x640 (HxW) -> route cpu_fallback\n" in out
    refused = re.search(r"\n  the iterator REFUSES it \(timestamp_source='parquet_timestamp', tolerance_s=0.0001\): "
                        r"FrameTimestampError: .* query timestamp 78.900002 s .*on the command line (--tolerance-s "
                        r"0.0201)\) .*\n", out)  # fmt: skip
    assert refused is not None and " cpu_fallback  ok " in out
    assert main(["diagnose", dataset, *refused.group(1).split()]) == 0
    out = capsys.readouterr().out
    assert "REFUSES" not in out and " cpu_fallback  ok " in out


def test_ctrl_c_during_make_dataset_is_one_line_exit_130_and_leaves_no_out(tmp_path: Path, monkeypatch, capsys) -> None:
    import lerobot_dali.generate

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(lerobot_dali.generate, "encode_video", interrupted)
    out = tmp_path / "ds"
    assert main(["make-dataset", str(out), "--episodes", "1", "--frames-per-episode", "1"]) == 130
    assert capsys.readouterr().err == "lerobot-dali make-dataset: interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_make_dataset_shows_its_progress_without_verbose(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    argv = ["make-dataset", str(out), "--episodes", "2", "--frames-per-episode", "1", "--episodes-per-file", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "lerobot_dali", *argv, "--image-cameras", "--size", "64x64"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == f"{out}\n", done.stderr
    assert "INFO lerobot_dali.generate: file 2/2: episode 1," in done.stderr


def test_bench_checks_recipe_and_image_size_before_any_work(tmp_path: Path, monkeypatch, capsys) -> None:
    import lerobot_dali.bench

    def no_work(config: object) -> None:
        raise AssertionError("the bench started before its options were checked")

    monkeypatch.setattr(lerobot_dali.bench, "run_bench", no_work)
    cases = (
        (["--recipe", "nope"], "--recipe: Unknown recipe 'nope'; known recipes are act, diffusion, vla"),
        (["--recipe", str(tmp_path / "missing.toml")], "missing.toml does not exist"),
        (
            ["--image-size", "0x0"],
            "--image-size takes a positive height and width up to 8192, HxW (224x224) or H W (224 224), got 0x0",
        ),
    )
    for argv, said in cases:
        assert main(["bench", "--quick", "--device", "cpu", "--cache-dir", str(tmp_path / "cache"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("lerobot-dali bench: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "cache").exists()


def test_help_is_plain_text_and_make_dataset_options_say_what_they_take(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "lerobot-dali: inspect datasets" in out and "``" not in out
    with pytest.raises(SystemExit):
        main(["make-dataset", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for said in ("--size HxW both even and >= 64 (default 96x128)", "ignored for v2.1", "ignored with --image-cameras",
                 "h264 and hevc need --gop >= 3 for B-frames", "(default 8)", "(default v3.0)"):  # fmt: skip
        assert said in out, said


def test_info_describes_a_one_frame_video_and_a_single_keyframe(tmp_path: Path, capsys) -> None:
    one = make_dataset(tmp_path / "one", episodes=1, frames_per_episode=1, size=(64, 64), codec="vp9")
    long_gop = make_dataset(tmp_path / "gop", episodes=1, frames_per_episode=5, size=(64, 64), codec="vp9", gop=10)
    assert main(["info", str(one)]) == 0
    out = capsys.readouterr().out
    assert "codec vp9 64x64 (HxW) 1 frame (no fps), one keyframe;" in out and "None" not in out
    assert main(["info", str(long_gop)]) == 0
    out = capsys.readouterr().out
    assert "codec vp9 64x64 (HxW) 30 fps GOP = all 5 frames (one keyframe);" in out and "None" not in out
    assert "random access" not in out  # 5 frames: no long GOP to speak of
    longer = make_dataset(tmp_path / "longer", episodes=1, frames_per_episode=20, size=(64, 64), codec="vp9", gop=50)
    assert main(["info", str(longer)]) == 0
    assert "random access: about 10.5 frames decoded per frame" in capsys.readouterr().out


def test_output_to_a_reader_that_left_stops_quietly_not_as_a_network_failure(tmp_path: Path) -> None:
    """``lerobot-dali info --json | head -1``: the closed pipe (a BrokenPipeError, a ConnectionError) read as "the
    network failed past its retries", exit 2; it is the reader that left: no message, 128 + SIGPIPE, as other tools."""
    import os
    import signal

    root = make_dataset(tmp_path / "ds", episodes=1, frames_per_episode=2, size=(64, 64), image_cameras=True)
    for argv in (["info", str(root), "--json"], ["info", str(root)]):
        # The pipe has no reader from the start: with its read end closed after Popen, a parent held up past the
        # child's half second of work (a busy machine) closed it once the output was in it, and the child exited 0.
        reader_end, writer_end = os.pipe()
        os.close(reader_end)
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "lerobot_dali", *argv], stdout=writer_end, stderr=subprocess.PIPE, text=True
            )
        finally:
            os.close(writer_end)
        _, err = child.communicate(timeout=300)
        assert (child.returncode, err) == (128 + signal.SIGPIPE, ""), (argv, child.returncode, err)


def _check_r1_with_stderr_on_a_terminal(before: list[str]) -> tuple[int, str]:
    """``lerobot-dali check`` of r1 with ``before`` ahead of the verb, its stderr a terminal (a pty): exit code and
    stderr."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # (0 columns: tqdm draws nothing)
    argv = [*before, "check", str(shared_dataset("r1_v30_h264")), "--keys", "action", "--tolerance-s", "0.0201"]
    child = subprocess.Popen([sys.executable, "-m", "lerobot_dali", *argv], stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # (EIO: the child closed its end)
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return child.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def test_check_of_wall_clock_timestamps_names_the_flag_that_reads_them(capsys) -> None:
    """cr5's parquet timestamps are wall-clock: check's problems advised ``TimestampSource.FRAME_INDEX``, a Python
    name no command takes. They now name ``--timestamp-source frame_index`` (episode 0's rows fall between frames,
    episode 4's run past its video), and check passes with it."""
    argv = ["check", str(shared_dataset("cr5_v30_av1")), "--episodes", "0", "4", "--json"]
    assert main(argv) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [p["episode_index"] for p in problems] == [0, 4]
    assert all("on the command line --timestamp-source frame_index" in p["message"] for p in problems), problems
    assert main([*argv, "--timestamp-source", "frame_index"]) == 0


CR5_CAMERA = "observation.images.top"


def _unplaced(message: str, dataset: str, episode: int, camera: str) -> str:
    """A frame lookup's ``message`` as check's line says it: ``dataset D, episode E, camera C (D/FILE): ...`` (its
    place, which the line says before it; the dataset, which the report's first line names) as ``FILE: ...``."""
    place = f"dataset {dataset}, episode {episode}, camera {camera} ({dataset}/"
    assert message.startswith(place), message
    file, rest = message.removeprefix(place).split("): ", 1)
    return f"{file}: {rest}"


def test_check_says_each_problems_place_once_and_json_keeps_it(capsys) -> None:
    """cr5_v30_av1's and gr00t_v20_h264's lines said their place twice, ``episode 0, camera C: FrameTimestampError:
    dataset D, episode 0, camera C (FILE): query ...``, ~85 characters before what was wrong. A line says it once and
    keeps the file, named from the dataset's root (which the report's first line names), every other word of the
    message kept; --json keeps the message whole (its place and paths too), and a message naming another place than
    its line's (a missing camera's: its file alone) is printed whole but for its file's root."""
    for name, camera in (("cr5_v30_av1", CR5_CAMERA), ("gr00t_v20_h264", "observation.images.ego_view")):
        dataset = str(shared_dataset(name))
        argv = ["check", dataset, "--episodes", "0", "--show", "1"]
        assert main([*argv, "--json"]) == 1
        problems = json.loads(capsys.readouterr().out)["problems"]
        message = next(p["message"] for p in problems if p["camera"] == camera)
        assert message.startswith(f"dataset {dataset}, episode 0, camera {camera} ({dataset}/videos/")
        assert main([*argv, "--cameras", camera]) == 1
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("episode ")]
        assert line == f"episode 0, camera {camera}: FrameTimestampError: {_unplaced(message, dataset, 0, camera)}"
        assert line.count("episode 0") == 1 and line.count(camera) == 2  # (the line's place, and in the file's name)
        assert line.split(": FrameTimestampError: ")[1].startswith("videos/") and dataset not in line
    gr00t = str(shared_dataset("gr00t_v20_h264"))
    assert main(["check", gr00t, "--episodes", "0"]) == 1  # (its camera never recorded: its file, then why)
    missing = "\nepisode 0, camera observation.images.egoview: MissingDataFileError: videos/chunk-000/"
    assert missing in capsys.readouterr().out


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("dataset D, episode 3, camera c (v.mp4): query 1 s", "v.mp4: query 1 s"),  # (a frame lookup's)
        ("episode 3, camera c (v (2).mp4): query 1 s", "v (2).mp4: query 1 s"),  # (some of the place: the rest)
        ("dataset D, episode 3: column 'frame_index' of d.parquet", "column 'frame_index' of d.parquet"),
        ("d.parquet (episode 3, camera c): the image of row 2", "d.parquet: the image of row 2"),  # (an image's)
        ("v.mp4 (episode 3, camera 'c') is vp9, but", "v.mp4 is vp9, but"),  # (a file of another codec)
        ("dataset D, episode 4, camera c (v.mp4): query 1 s", None),  # (another episode's: whole)
        ("dataset E, episode 3, camera c (v.mp4): query 1 s", None),  # (another dataset's)
        ("episode 3, camera cc (v.mp4): query", None),  # (another camera's)
        ("v.mp4: episode 3's rows, camera c", None),  # (not where a place is named)
        ("v.mp4 is missing (episode 3, camera c)", None),
    ],
)
def test_a_problems_line_leaves_out_its_place_alone(message: str, said: str | None) -> None:
    """What check's line leaves out of a message is the dataset, episode and camera the line names before it, where
    an error names its place (at its start, a file after it; or after its file), and nothing else."""
    from lerobot_dali.cli import _place_unsaid
    from lerobot_dali.dataset_check import Problem

    problem = Problem("D", 3, "c", "FrameTimestampError", message)
    assert _place_unsaid(problem, message) == (message if said is None else said)


def test_check_says_advice_its_problems_share_once_and_json_keeps_every_message_whole(capsys) -> None:
    """cr5_v21_av1's 12 problems each printed its ~300 characters of advice, 11 alike (episode 5's rows fall between
    frames, the others' run past their videos). Each line now holds its problem's facts, marked [A] where its advice
    is the one said once after them (where each episode's last row belongs elided: its line says its video's end);
    a problem alone in its advice, or shown alone (--show 1), is printed whole but for its place, which its line
    says before it; --json keeps every message whole."""
    dataset = str(shared_dataset("cr5_v21_av1"))
    assert main(["check", dataset, "--json"]) == 1
    whole = {p["episode_index"]: p["message"] for p in json.loads(capsys.readouterr().out)["problems"]}
    assert len(whole) == 12 and all("--timestamp-source frame_index" in m for m in whole.values())
    messages = {episode: _unplaced(message, dataset, episode, CR5_CAMERA) for episode, message in whole.items()}
    assert main(["check", dataset]) == 1
    lines = capsys.readouterr().out.splitlines()
    problems = {int(line.split(",")[0].split()[1]): line for line in lines if line.startswith("episode ")}
    advice = [line for line in lines if line.startswith("[")]
    assert len(problems) == 12 and len(advice) == 1 and len(lines) == 2 + 12 + 1, lines
    assert problems[5].endswith(messages[5]) and "[A]" not in problems[5]
    assert advice[0].startswith("[A] episodes 0-4, 6-11 (…: each one's own number, in its line): The row lies past")
    said = advice[0].split("in its line): ", 1)[1]
    for episode in (e for e in messages if e != 5):
        own, mark = problems[episode].split(": FrameTimestampError: ", 1)[1].rsplit(" ", 1)
        assert mark == "[A]" and "The row lies past" not in own
        end = own.rsplit("-", 1)[1].split(" s)", 1)[0]  # (the video's end, where its last row belongs)
        assert f"{own} {said.replace('…', end)}" == messages[episode]  # (nothing left out)
    assert sum("The row lies past" in line for line in lines) == 1  # (11 before)
    assert main(["check", dataset, "--show", "1"]) == 1  # (alone: whole, and the rest counted)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        f"episode 0, camera observation.images.top: FrameTimestampError: {messages[0]}",
        "... and 11 more (--show N lists more; --json lists them)",
    ]
    assert main(["check", dataset, "--show", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line[:4] for line in lines[2:]] == ["epis", "epis", "[A] ", "... "] and "[A] episodes 0-1 (" in lines[4]
    v30 = str(shared_dataset("cr5_v30_av1"))  # (a union's, by dataset: v3.0's files hold several episodes each)
    assert main(["check", dataset, v30, "--concat", "--show", "24"]) == 1
    advice = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split(" (…")[0].split(": If ")[0] for line in advice] == [
        f"[A] {dataset}: episodes 0-4, 6-11; {v30}: episodes 4, 9, 11",
        f"[B] {dataset}: episode 5; {v30}: episodes 0-3, 5-8, 10",
    ]


def test_check_lists_a_camera_never_recorded_and_checks_the_others(capsys) -> None:
    """GR00T declares camera egoview, with no files: check stopped at opening (exit 2), and only a run with
    --cameras found the other camera's rows a frame ahead of its video. One run lists both (exit 1)."""
    root = str(shared_dataset("gr00t_v20_h264"))
    assert main(["check", root, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["rows"], report["video_files"]) == (5, 2096, 5)
    assert report["problem_kinds"] == {
        "FrameTimestampError in observation.images.ego_view": 5,
        "MissingDataFileError in observation.images.egoview": 1,
    }
    (missing,) = [p for p in report["problems"] if p["error"] == "MissingDataFileError"]
    assert missing["episode_index"] == 0 and missing["camera"] == "observation.images.egoview"
    assert missing["message"].endswith("(on the command line: --cameras observation.images.ego_view)")
    assert main(["check", root, "--timestamp-source", "frame_index", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problem_kinds"] == {
        "MissingDataFileError in observation.images.egoview": 1
    }
    assert main(["check", root, "--cameras", "observation.images.egoview"]) == 2  # (asked for: not left out)
    assert "MissingDataFileError" in capsys.readouterr().err


def test_check_lists_every_camera_without_files_and_checks_the_rest(tmp_path: Path, capsys) -> None:
    """Two of three cameras without a file: each listed once, of the first episode; the third checked as ever."""
    root = tmp_path / "ds"
    args = ["make-dataset", str(root), "--episodes", "2", "--frames-per-episode", "4", "--cameras", "3"]
    assert main([*args, "--size", "64x64", "--codec", "vp9", "--episodes-per-file", "1"]) == 0
    cameras = sorted(p.name for p in (root / "videos").iterdir())
    for camera in (cameras[0], cameras[2]):
        shutil.rmtree(root / "videos" / camera)
    capsys.readouterr()
    assert main(["check", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["rows"], report["video_files"]) == (2, 8, 2)  # (the camera left, its 2 files)
    assert [(p["episode_index"], p["camera"], p["error"]) for p in report["problems"]] == [
        (0, cameras[0], "MissingDataFileError"),
        (0, cameras[2], "MissingDataFileError"),
    ]
    assert report["problem_kinds"] == {f"MissingDataFileError in {c}": 1 for c in (cameras[0], cameras[2])}


def test_check_counts_one_video_file_skipped_as_one(capsys) -> None:
    """r1's one video, decoded by a check before, was "1 video files and 790 frames skipped"."""
    argv = ["check", str(shared_dataset("r1_v30_h264")), "--keys", "action", "--tolerance-s", "0.0201", "--decode"]
    assert main(argv) == 0
    assert ", 1 video file, 790 frames decoded checked in " in capsys.readouterr().out
    assert main(argv) == 0
    assert ", 0 frames decoded (1 video file and 790 frames skipped: decoded by an earlier" in capsys.readouterr().out


def test_check_says_how_long_the_whole_check_took_the_open_named(capsys, monkeypatch) -> None:
    """Check's "checked in N s" was the episodes' check alone: the open before it (info.json, the episode tables,
    v2.1's data files' footers: ~9 s of 15,000 episodes) was left out, so a slow open read "checked in 0.0 s". The
    number is the whole check's, the open's part named; --json says both (``seconds``, the check's own, as before)."""
    import time

    import lerobot_dali.dataset_reader
    import lerobot_dali.dataset_union

    def slow(opens: Callable[..., object]) -> Callable[..., object]:
        def opened(*args: object, **kwargs: object) -> object:
            time.sleep(0.3)
            return opens(*args, **kwargs)

        return opened

    monkeypatch.setattr(lerobot_dali.dataset_reader, "open_located", slow(lerobot_dali.dataset_reader.open_located))
    monkeypatch.setattr(lerobot_dali.dataset_union, "open_all", slow(lerobot_dali.dataset_union.open_all))
    r1 = str(shared_dataset("r1_v30_h264"))
    argv = ["check", r1, "--keys", "action", "--tolerance-s", "0.0201"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["opening_seconds"] >= 0.3 and report["seconds"] > 0  # (the check's own, as before)
    assert main(argv) == 0
    said = re.search(
        r" checked in (\d+\.\d) s, (\d+\.\d) s of it opening the dataset \(timestamp_source=",
        out := capsys.readouterr().out,
    )
    assert said is not None and float(said[1]) >= float(said[2]) >= 0.3, out
    assert main([*argv[:2], r1, *argv[2:], "--concat"]) == 0  # (a union's open: its datasets' together)
    said = re.search(r" checked in (\d+\.\d) s, (\d+\.\d) s of it opening the dataset ", out := capsys.readouterr().out)
    assert said is not None and float(said[2]) >= 0.3, out


def test_check_logs_a_line_on_its_own_line_not_after_the_progress_bar() -> None:
    """r1's data files hold columns info.json does not declare: the line check logs of them as it starts (a
    warning then; at INFO, shown by -v, where keys are chosen) was written after the bar's 0% (``... 0/1
    [00:00<?, ?episode/s]WARNING lerobot_dali...``)."""
    code, err = _check_r1_with_stderr_on_a_terminal(["-v"])
    assert code == 0, err
    assert "\r" in err and "episode/s]" in err  # the bar, drawn
    said = [line.rsplit("\r", 1)[-1] for line in err.replace("\r\n", "\n").split("\n") if "does not declare" in line]
    assert said and all(line.startswith("INFO lerobot_dali.dataset_reader: ") for line in said), err


def test_check_logs_plain_progress_lines_where_stderr_is_no_terminal() -> None:
    """Its stderr a file or a pipe (a CI log, a job's output), check drew its bar there too: every redraw stayed,
    joined by carriage returns. There it logs a few plain lines instead."""
    argv = ["check", str(shared_dataset("r1_v30_h264")), "--keys", "action", "--tolerance-s", "0.0201"]
    done = subprocess.run(
        [sys.executable, "-m", "lerobot_dali", *argv], capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr, done.stderr
    assert "INFO lerobot_dali.check.progress: lerobot-dali check: 1/1 episodes (" in done.stderr, done.stderr
    # (the columns r1's info.json leaves out were warned of on every run: with keys chosen, they are named at INFO;
    # its camera's declared 10 fps, over 25 fps video, is warned of)
    (warning,) = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert "info.json declares video.fps 10 (the file: 25)" in warning, done.stderr
    assert "does not declare" not in done.stderr, done.stderr


def test_check_logs_the_progress_of_its_survey_of_the_video_headers_too(make_ds, monkeypatch, caplog) -> None:
    """Before its first episode, check reads every video file's header (the first time, 15,000 v2.1 episodes of two
    cameras: ~12 s of CPU; a remote dataset's, requests a file): that survey's progress lines were at INFO of a
    logger left at WARNING, so a log showed nothing for that long."""
    root = make_ds(episodes=4, frames_per_episode=4, cameras=1, codec="h264", size=(64, 64), episodes_per_file=1)
    lines = _waits_lines_of_check(root, monkeypatch, caplog)
    assert any(
        line.startswith("lerobot-dali: camera observation.images.cam0's video headers: 4/4 files (") for line in lines
    ), lines


def test_check_logs_the_progress_of_the_data_file_footers_its_open_reads(make_ds, monkeypatch, caplog) -> None:
    """Opening a v2.1 dataset reads every episode's data file footer (the first time, 15,000 episodes: ~9 s): its
    progress lines were at INFO of a logger check set to INFO only once the dataset was open."""
    root = make_ds(episodes=3, frames_per_episode=4, cameras=1, codec="h264", size=(64, 64), version="v2.1")
    lines = _waits_lines_of_check(root, monkeypatch, caplog)
    assert any(line.startswith(f"lerobot-dali: {root}'s data file footers: 3/3 files (") for line in lines), lines


def _waits_lines_of_check(root, monkeypatch, caplog) -> list[str]:
    """The progress lines of the waits (concurrent_calls') that ``check root`` logs, shown at once (a small
    dataset's take no 2 s), the logger's level given back."""
    import logging

    from lerobot_dali import concurrent_calls

    monkeypatch.setattr(concurrent_calls, "PROGRESS_DELAY_S", 0.0)
    waits = logging.getLogger("lerobot_dali.concurrent_calls")
    level = waits.level
    try:
        assert main(["check", str(root), "--workers", "0"]) == 0
    finally:
        waits.setLevel(level)
    return [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.concurrent_calls"]


def test_progress_lines_come_at_each_tenth_and_at_the_end(caplog, monkeypatch) -> None:
    """A long run (an episode a second, on an injected clock): its first line once it has lasted FIRST_LINE_S (2 s),
    then a line at each tenth, and the end."""
    import logging
    from types import SimpleNamespace

    from lerobot_dali import progress_lines
    from lerobot_dali.progress_lines import ProgressLines

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: clock.now))
    lines = ProgressLines(100, desc="check", unit="episode", logger=logging.getLogger("test.progress"))
    with caplog.at_level(logging.INFO, logger="test.progress"):
        for _ in range(100):
            clock.now += 1.0
            lines.update(1)
        lines.finish()
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"check: {n}/100 episodes ({n} s)" for n in (2, *range(10, 101, 10))]


def test_a_quick_check_logs_its_progress_at_the_end_only(caplog, monkeypatch) -> None:
    """check of cr5's 12 episodes, done in a second or two, logged a line at every tenth it reached; a run done
    before the first line is due (FIRST_LINE_S) says its end alone (a clock that stands still: done in 0 s)."""
    import logging
    from types import SimpleNamespace

    from lerobot_dali import progress_lines

    monkeypatch.setattr(progress_lines, "time", SimpleNamespace(monotonic=lambda: 0.0))
    root = shared_dataset("cr5_v30_av1")
    with caplog.at_level(logging.INFO, logger="lerobot_dali.check.progress"):
        assert main(["check", str(root), "--workers", "0", "--timestamp-source", "frame_index"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.check.progress"]
    assert said == ["lerobot-dali check: 12/12 episodes (0 s)"]


def test_info_on_a_damaged_first_video_still_describes_the_rest(tmp_path: Path, capsys) -> None:
    """One camera's first video cut short: that camera says why it did not open, the other camera and the metadata
    are still described, exit 1 (a finding); it was one line about the file and nothing else, exit 2."""
    root = make_dataset(tmp_path / "ds", episodes=2, frames_per_episode=6, size=(64, 64), codec="vp9", cameras=2)
    video = sorted((root / "videos" / "observation.images.cam0").rglob("*.mp4"))[0]
    video.write_bytes(video.read_bytes()[:200])
    assert main(["info", str(root), "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    damaged, whole = info["cameras"]["observation.images.cam0"], info["cameras"]["observation.images.cam1"]
    assert str(video) in damaged["probe_error"] and "codec" not in damaged
    assert "probe_error" not in whole and (whole["codec"], whole["frame_count"]) == ("vp9", 12)
    assert info["total_frames"] == 12
    assert main(["info", str(root)]) == 1
    out = capsys.readouterr().out
    assert "camera observation.images.cam0: first video does not open (below)" in out and str(video) in out
    assert "camera observation.images.cam1: codec vp9 64x64 (HxW) 30 fps" in out


def test_diagnose_decodes_an_image_camera_and_names_a_broken_image(tmp_path: Path, capsys) -> None:
    """Image cameras (images in the data files) were left out of the report: a dataset of them printed the machine
    alone and exit 0, even with its first image undecodable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_dataset(tmp_path / "ds", episodes=1, frames_per_episode=2, size=(64, 96), image_cameras=True, cameras=2)
    assert main(["diagnose", str(root)]) == 0
    report = capsys.readouterr().out
    for camera in ("cam0", "cam1"):
        assert f"camera observation.images.{camera}: codec png 64x96 (HxW) -> route images (Pillow" in report
    assert report.count("  pillow        ok ") == 2 and report.count(" 64x96\n") == 2
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    key = "observation.images.cam1"
    images = table[key].to_pylist()
    images[0] = {"bytes": b"\x89PNG not really", "path": None}
    column = pa.array(images, type=table.schema.field(key).type)
    pq.write_table(table.set_column(table.schema.get_field_index(key), key, column), data)
    assert main(["diagnose", str(root)]) == 1
    report = capsys.readouterr().out
    assert "camera observation.images.cam1: codec unknown size unknown -> route images" in report
    assert "  pillow        FAILED" in report and "DataFileError" in report and "image 0" in report


def test_bench_help_states_the_defaults_bench_uses(capsys, monkeypatch) -> None:
    """Each of --batch-size, --num-workers, --steps and --warmup says its default for a full run and for --quick,
    and they are the values BenchConfig picks (on a machine of 16 CPUs, where min(4, cores) is 4)."""
    import re

    from lerobot_dali import bench

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    monkeypatch.setattr(bench, "usable_cpus", lambda: 16)
    for flag, field in (("--batch-size", "batch_size"), ("--num-workers", "num_workers"), ("--steps", "steps"),
                        ("--warmup", "warmup")):  # fmt: skip
        said = re.search(rf"{flag} \S+ [^(]*\(default ((?:[^;()]|\([^()]*\))+); quick (\d+)\)", out)
        assert said, f"{flag}: no '(default ...; quick N)' in --help"
        full, quick = said.groups()
        assert getattr(bench.BenchConfig(quick=True), field) == int(quick), flag
        if flag == "--warmup":  # (by the workers, whose default the help gives as well)
            assert full.startswith("2 x workers + 2,"), full
            assert bench.BenchConfig().warmup == 2 * bench.BenchConfig().num_workers + 2 == 10
            continue
        assert str(getattr(bench.BenchConfig(), field)) == full.replace("min(4, cores)", "4"), flag
    for flag, field in (("--pool-size", "episode_pool_size"), ("--device", "device")):  # defaults with no quick value
        said = re.search(rf"{flag} \S+ [^(]*\(default (\w+)", out)
        assert said and said.group(1) == str(getattr(bench.BenchConfig(), field)), (flag, out)


def test_the_command_ends_as_the_interpreter_would_with_an_executor_held_and_a_thread_started_late() -> None:
    """run() joined the threads it listed, then ended the process: an executor still held (an fsspec background
    cache's, a library's pool) kept its idle worker waiting for work forever, so the command never ended (the
    interpreter's exit wakes it first); and a thread started by one being joined was not waited for, its output
    lost. Both as the interpreter's exit now: the task's and the late thread's lines, and main()'s status."""
    code = (
        "import concurrent.futures, threading, time\n"
        "from lerobot_dali import cli\n"
        "def main():\n"
        "    global pool\n"
        "    pool = concurrent.futures.ThreadPoolExecutor(1)\n"
        "    pool.submit(print, 'task', flush=True)\n"
        "    late = lambda: (time.sleep(0.2), print('late thread', flush=True))\n"
        "    threading.Thread(target=lambda: (time.sleep(0.2), threading.Thread(target=late).start())).start()\n"
        "    return 5\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.split(), done.stderr) == (5, ["task", "late", "thread"], "")


def test_a_ctrl_c_while_the_command_waits_for_a_thread_ends_it_as_one_in_the_command_does() -> None:
    """A Ctrl-C while run() waited for a thread still running (a hung download, a library's worker) raised
    threading's KeyboardInterrupt out of run(): a traceback from threading._shutdown, the interpreter's own exit (the
    C++ destructors run() exists to avoid) and death by SIGINT (-2); on Python 3.13 a traceback printed and main()'s
    status. One line and 130 now, as a Ctrl-C during the command, atexit handlers still run. The thread sends the
    signal once the interpreter's shutdown has begun, so the wait is what it interrupts."""
    code = (
        "import atexit, os, signal, threading, time\n"
        "from lerobot_dali import cli\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # (a parent that ignores SIGINT: not here)
        "def lingering():\n"
        "    while not threading._SHUTTING_DOWN:\n"
        "        time.sleep(0.01)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(60)\n"
        "def main():\n"
        "    threading.Thread(target=lingering).start()\n"
        "    atexit.register(print, 'atexit ran', flush=True)\n"
        "    return 0\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert (done.returncode, done.stdout, done.stderr) == (130, "atexit ran\n", "lerobot-dali: interrupted\n")


@pytest.mark.parametrize("given", ['{"observation.images.cam0": ""}', '{" ": "observation.images.cam0"}'])
def test_check_refuses_a_rename_map_naming_an_empty_name_in_one_line(make_ds, capsys, given: str) -> None:
    """``check A B --concat --rename-map '{"cam0": ""}'``: the flag's check took it, and the command ended in a
    TypeError's traceback once the datasets were opened (' ' as a key: refused as a key the datasets do not read).
    Refused as the flag is read now: status 2, one line naming --rename-map and the entry."""
    path = str(make_ds(episodes=2, frames_per_episode=8, cameras=1, size=(64, 64), codec="h264"))
    with pytest.raises(SystemExit) as exited:
        main(["check", path, path, "--concat", "--rename-map", given])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    said = "lerobot-dali check: error: argument --rename-map: rename_map has entries with an empty name, "
    assert err.splitlines()[-1].startswith(f"{said}{json.loads(given)}:"), err


def test_check_concat_names_the_flag_to_change_where_a_rename_map_hides_a_camera(make_ds, capsys) -> None:
    """``check A B --concat --cameras ... --rename-map ...``: a refusal opening the datasets was said to be
    --cameras' whatever caused it, a map giving two cameras the name asked for, or one written the other way round,
    included (3 of 3 cases here); it names --rename-map where the map hides a camera the dataset has, --cameras
    where the dataset lacks it."""
    three, two = (
        str(make_ds(episodes=2, frames_per_episode=6, cameras=n, size=(64, 64), codec="h264")) for n in (3, 2)
    )
    cam0, cam1, top = "observation.images.cam0", "observation.images.cam1", "observation.images.top"
    for cameras, rename_map, said in (
        (cam0, {cam1: cam0}, f"--rename-map: {three}: rename_map gives ['{cam0}'] to several of its cameras"),
        (top, {top: cam1}, f"--rename-map: {three} has no camera ['{top}']; its cameras are "),
        (cam1, {cam1: top}, f"--rename-map: {three} has no camera ['{cam1}']; its cameras are "),  # (renamed away)
        (top, {}, f"--cameras: {three} has no camera ['{top}']; its cameras are "),
    ):
        assert (
            main(["check", three, two, "--concat", "--cameras", cameras, "--rename-map", json.dumps(rename_map)]) == 2
        )
        err = capsys.readouterr().err
        assert err.splitlines()[-1].startswith(f"lerobot-dali check: {said}"), err


def test_check_concat_tells_rename_maps_that_pass_back_to_the_flag_as_told(make_ds, capsys) -> None:
    """``check A B --concat --cameras top --rename-map '{}' '{"cam1": "top"}'``, A with 3 cameras, none 'top': it was
    told {'<its key>': 'top'} (and maps were told as Python dicts, which --rename-map, taking JSON, refuses). Each
    of the 3 maps told, passed back as A's, checks the union (status 0)."""
    three, two = (
        str(make_ds(episodes=2, frames_per_episode=6, cameras=n, size=(64, 64), codec="h264")) for n in (3, 2)
    )
    argv = ["check", three, two, "--concat", "--cameras", "observation.images.top", "--rename-map"]
    second = json.dumps({"observation.images.cam1": "observation.images.top"})
    assert main([*argv, "{}", second]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    found = re.search(r"with a rename_map \(one of (.*): DALILeRobotMixture's", err)
    assert found is not None, err
    told = re.findall(r"\{[^{}]*\}", found.group(1))
    assert [json.loads(text) for text in told] == [
        {f"observation.images.cam{i}": "observation.images.top"} for i in range(3)
    ]
    for text in told:
        assert main([*argv, text, second]) == 0, capsys.readouterr().err
