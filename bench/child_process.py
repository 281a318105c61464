"""Run a bench script again as a child (``SCRIPT --child ARGS``): a fresh interpreter per measured setting, so
each has its own memory, caches and imports. The child prints one JSON object as its last stdout line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["run_child"]


def run_child(script: str, args: Sequence[str], *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JSON object ``script --child *args`` prints last; RuntimeError with its stderr's tail if it fails."""
    done = subprocess.run(
        [sys.executable, script, "--child", *args],
        capture_output=True, text=True, check=False, timeout=1800, env=None if env is None else dict(env),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"child {list(args)} of {script} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
