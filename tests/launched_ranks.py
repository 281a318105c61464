"""The ranks of one launch on a node, as ``torchrun`` starts them: a fake agent process (a script named ``torchrun``)
that starts each rank as its child, with ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``, ``RANK`` and
``LOCAL_RANK`` set (its own environment has none of them), and waits for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path


def run_ranks(
    rank_code: str,
    ranks: int,
    *args: str,
    wrapper: list[str] | None = None,
    run_id: str = "none",
    python_options: tuple[str, ...] = (),
) -> list[str]:
    """The stdout of each of ``ranks`` processes running ``rank_code`` (Python, given ``args`` as ``sys.argv[1:]``)
    started by one fake agent, by rank;
    ``wrapper``: each runs under it (``["sh", "-c", '"$0" "$@"; true']``: a shell that runs the rank and lives on).
    ``python_options``: the agent's interpreter's (``("-u", "-B")``: its program the 4th argument, as in ``python -u
    -m torch.distributed.run``).
    Raises CalledProcessError (with the ranks' stderr) where a rank fails. Each call is another agent: another job."""
    agent = textwrap.dedent(f"""
        import json, os, subprocess, sys
        env = {{**os.environ, "TORCHELASTIC_RUN_ID": {run_id!r}, "TORCHELASTIC_RESTART_COUNT": "0"}}
        env.update(WORLD_SIZE="{ranks}", LOCAL_WORLD_SIZE="{ranks}")
        command = [*{wrapper or []!r}, sys.executable, "-c", {rank_code!r}, *{list(args)!r}]
        ranks = [
            subprocess.Popen(command, env={{**env, "RANK": str(r), "LOCAL_RANK": str(r)}}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for r in range({ranks})
        ]
        out = [r.communicate() for r in ranks]
        failed = [err for r, (_, err) in zip(ranks, out) if r.returncode]
        sys.stderr.write("".join(failed))
        print(json.dumps([o for o, _ in out]))
        sys.exit(1 if failed else 0)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder) / "torchrun"  # (an agent is told by its command line: python .../torchrun ...)
        program.write_text(agent)
        done = subprocess.run(
            [sys.executable, *python_options, program], capture_output=True, text=True, timeout=300, check=True, env=env
        )
    return json.loads(done.stdout)
