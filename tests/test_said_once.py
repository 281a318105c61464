"""Warnings that every process of a job meets alike are said once: by the first process, at DEBUG by the others."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lerobot_dali import said_once

UNWRITABLE = "column store: cannot write to"


def test_a_cache_folder_that_takes_no_writes_is_warned_about_once_not_by_each_worker_each_epoch(
    make_ds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], caplog
) -> None:
    """Each DALI worker converts data files of big row groups to the column store, and workers start again each
    epoch: 2 ranks of 2 workers over 2 epochs warned 8 times of one read-only folder (each worker's stderr). The
    iterator's process may meet it first (it reads the first episode's scalars when built): then it says it."""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=40, frames_per_episode=2000, cameras=0, episodes_per_file=40)  # one 80,000-row group
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(not_a_folder))
    it = DALILeRobotIterator(root, batch_size=4, device="cpu", num_workers=2, seed=0)
    try:
        for epoch in range(2):
            it.set_epoch(epoch)
            for step, _ in enumerate(it):
                if step == 3:
                    break
    finally:
        it.close()
    err = capfd.readouterr().err
    here = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and UNWRITABLE in r.getMessage()]
    assert err.count(UNWRITABLE) + len(here) == 1, (err, here)
    assert "make it a writable folder" in err + "".join(here)


def _ranks_of_one_node(rank_code: str, ranks: int, tmp_path: Path) -> str:
    """The stderr of ``ranks`` processes running ``rank_code`` as torchrun starts them: siblings, children of one
    agent, with TORCHELASTIC_RUN_ID and each its RANK set."""
    agent = textwrap.dedent(f"""
        import os, subprocess, sys
        env = {{**os.environ, "TORCHELASTIC_RUN_ID": "job", "TMPDIR": {str(tmp_path)!r}}}
        env.update(WORLD_SIZE="{ranks}", LOCAL_WORLD_SIZE="{ranks}")
        ranks = [
            subprocess.Popen([sys.executable, "-c", {rank_code!r}], env={{**env, "RANK": str(r), "LOCAL_RANK": str(r)}})
            for r in range({ranks})
        ]
        sys.exit(max(r.wait() for r in ranks))
    """)
    done = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True, timeout=300, check=True)
    return done.stderr


def test_the_ranks_of_a_node_say_a_warning_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's ranks are siblings, children of its agent: the agent's folder is theirs."""
    monkeypatch.delenv(said_once.SAID_ENV)
    rank = textwrap.dedent("""
        import logging
        from lerobot_dali.said_once import warn_once
        logging.basicConfig(format="%(levelname)s %(message)s", level=logging.DEBUG)
        warn_once(logging.getLogger("lerobot_dali.test"), "the same for %s", "every rank")
    """)
    lines = sorted(_ranks_of_one_node(rank, 3, tmp_path).splitlines())
    assert lines == ["DEBUG the same for every rank"] * 2 + ["WARNING the same for every rank"], lines
    assert len(list(tmp_path.glob("lerobot-dali-said-*"))) == 1  # (the agent's)


SAY_OPENED = textwrap.dedent("""
    import logging
    from lerobot_dali.said_once import say_once
    logging.basicConfig(format="%(levelname)s %(message)s", level=logging.DEBUG)
    say_once(logging.getLogger("lerobot_dali.test"), logging.INFO, "the dataset opened")
""")
#: A launcher starting 2 ranks of ``$RANK_CODE`` at once, each with the variables that ``argv[1:]`` names set to its
#: rank, and waiting for them.
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    rank = [sys.executable, "-c", os.environ["RANK_CODE"]]
    ranks = [subprocess.Popen(rank, env={**os.environ, **dict.fromkeys(sys.argv[1:], str(r))}) for r in range(2)]
    sys.exit(max(r.wait() for r in ranks))
""")
OMPI5 = {"PMIX_NAMESPACE": "prterun-node1-4242@1"}


@pytest.mark.parametrize(
    ("launcher", "per_rank", "job"),
    [
        ("slurmstepd", ["SLURM_PROCID", "SLURM_LOCALID"], {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}),  # srun
        ("prted", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK"], OMPI5),  # Open MPI 5, each node
        ("prterun", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK"], OMPI5),  # ... mpirun's node
        ("orted", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"], {}),  # Open MPI 4
        ("hydra_pmi_proxy", ["PMI_RANK"], {"PMI_SIZE": "2"}),  # MPICH, Intel MPI
    ],
)
def test_the_ranks_an_mpi_or_slurm_launcher_starts_on_a_node_say_a_line_once(
    launcher: str, per_rank: list[str], job: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their parent is the launcher's process for this launch on this node (/proc names it): each rank was its own
    job, so each of a node's 8 said every line."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    named = tmp_path / launcher  # (a process's name is its program's file name)
    named.symlink_to(sys.executable)
    env = {**os.environ, **job, "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path)}
    done = subprocess.run([named, "-c", LAUNCHER, *per_rank], env=env, capture_output=True, text=True, timeout=120)
    assert sorted(done.stderr.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr


@pytest.mark.parametrize("daemon", ["prted", "prte"])
def test_jobs_one_after_another_on_a_persistent_dvm_each_say_their_lines(
    daemon: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DVM's daemons (``prte``, then ``prun`` job after job) start the ranks of every job on a node: told apart by
    each job's PMIx namespace, a job said nothing the one before it had said."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    named = tmp_path / daemon
    named.symlink_to(sys.executable)
    dvm = textwrap.dedent("""
        import os, subprocess, sys
        for job in (1, 2):
            env = {**os.environ, "PMIX_NAMESPACE": f"prte-node1-4242@{job}"}
            rank = [sys.executable, "-c", os.environ["RANK_CODE"]]
            ranks = [subprocess.Popen(rank, env={**env, "PMIX_RANK": str(r)}) for r in range(2)]
            print(*sorted(r.wait() for r in ranks), file=sys.stderr)
    """)
    env = {**os.environ, "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path)}
    done = subprocess.run([named, "-c", dvm], env=env, capture_output=True, text=True, timeout=120)
    first, second, after = done.stderr.split("0 0\n")  # (each job's lines, then its ranks' exit codes)
    assert sorted(first.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr
    assert sorted(second.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr
    assert after == "", done.stderr


def test_the_ranks_deepspeed_starts_on_a_node_say_a_line_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's runner starts ``python -u -m deepspeed.launcher.launch`` on each node, the parent of its ranks."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    package = tmp_path / "deepspeed" / "launcher"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").touch()
    (package / "__init__.py").touch()
    (package / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path), "CROSS_RANK": "0", "LOCAL_SIZE": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    launch = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", "RANK", "LOCAL_RANK"]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=120)
    assert sorted(done.stderr.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr


@pytest.mark.parametrize(
    "runs",
    [
        'python -c "$RANK_CODE"; python -c "$RANK_CODE"',  # (bash execs the last: slurmstepd is then its parent)
        'python -c "$RANK_CODE"; python -c "$RANK_CODE"; true',
        'RANK=0 LOCAL_RANK=0 python -c "$RANK_CODE"; RANK=0 LOCAL_RANK=0 python -c "$RANK_CODE"; true',
    ],
)
def test_runs_one_after_another_from_a_batch_script_each_say_their_lines(
    runs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch script, the child of its batch step's slurmstepd with SLURM_PROCID 0 as a task has, lives on from run
    to run, as does a shell where RANK is set by hand: a run shares only with its own launch, not the run before."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    step = tmp_path / "slurmstepd"
    step.symlink_to(sys.executable)
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    env = {**os.environ, **batch, "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    script = f"import subprocess, sys; sys.exit(subprocess.run(['bash', '-c', {runs!r}]).returncode)"
    done = subprocess.run([step, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.stderr.splitlines() == ["INFO the dataset opened"] * 2, done.stderr


#: A launcher starting 2 ranks each under the wrapper that ``$WRAPPER`` (JSON; its program ``$WRAPPER_PROGRAM``, where
#: set) runs, with the variables that ``argv[1:]`` names set to its rank; ``$PYTHON`` is the rank's Python (a launcher
#: named by its argv[0] knows no ``sys.executable``).
WRAPPING_LAUNCHER = textwrap.dedent("""
    import json, os, subprocess, sys
    wrapper = json.loads(os.environ["WRAPPER"])
    ranks = [
        subprocess.Popen(wrapper, executable=os.environ.get("WRAPPER_PROGRAM"), env={**os.environ, **rank_env})
        for rank_env in (dict.fromkeys(sys.argv[1:], str(r)) for r in range(2))
    ]
    sys.exit(max(r.wait() for r in ranks))
""")
#: A rank run by a shell that does not exec it (it has more to do after).
SHELL_RUNS_A_RANK = '"$PYTHON" -c "$RANK_CODE"; exit $?'
#: Two runs one after another, from a shell.
TWO_RUNS = '"$PYTHON" -c "$RANK_CODE"; "$PYTHON" -c "$RANK_CODE"'


@pytest.mark.parametrize(
    ("launcher", "title", "wrapper", "per_rank", "job"),
    [
        # srun bash -c '...': Slurm's step manager of a step of tasks, titled so.
        ("slurmstepd", "slurmstepd: [7.0]", ["bash", "-c", SHELL_RUNS_A_RANK], ["SLURM_PROCID"], {"SLURM_JOB_ID": "7"}),
        # srun ./run.sh, whose last line is timeout ...: two wrappers; the script's process is named after it.
        ("slurmstepd", "slurmstepd: [7.0]", ["./run.sh"], ["SLURM_PROCID"], {"SLURM_JOB_ID": "7"}),
        ("prted", None, ["sh", "-c", SHELL_RUNS_A_RANK], ["OMPI_COMM_WORLD_RANK", "PMIX_RANK"], OMPI5),  # mpirun sh -c
        ("hydra_pmi_proxy", None, ["sh", "-ec", SHELL_RUNS_A_RANK], ["PMI_RANK"], {"PMI_SIZE": "2"}),
        ("orted", None, ["timeout", "120", "$PYTHON", "-c", "$RANK_CODE"], ["OMPI_COMM_WORLD_RANK"], {}),
        # torchrun --no-python ./run.sh: the agent is a Python process, told by TORCHELASTIC_RUN_ID.
        ("python", None, ["./run.sh"], ["RANK", "LOCAL_RANK"], {"TORCHELASTIC_RUN_ID": "job"}),
    ],
)
def test_the_ranks_a_launcher_starts_each_under_a_wrapper_say_a_line_once(
    launcher: str,
    title: str | None,
    wrapper: list[str],
    per_rank: list[str],
    job: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank's parent was its wrapper (a shell given a command or a script, ``timeout``), whose parent is the
    launcher: each rank kept a folder of its own, and every line of the job was said once per rank."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    named = tmp_path / launcher
    named.symlink_to(sys.executable)
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\ntimeout 120 "$PYTHON" -c "$RANK_CODE"\n')
    script.chmod(0o755)
    wrapper = [{"$PYTHON": sys.executable, "$RANK_CODE": SAY_OPENED}.get(part, part) for part in wrapper]  # (timeout's)
    env = {**os.environ, **job, "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path), "PYTHON": sys.executable}
    env["WRAPPER"] = json.dumps(wrapper)
    argv = [title or str(named), "-c", WRAPPING_LAUNCHER, *per_rank]
    done = subprocess.run(argv, executable=named, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert sorted(done.stderr.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr


#: A wrapper (Python, under another name) that runs the rank as its child and waits for it.
RUNS_A_RANK = (
    "import os, subprocess, sys; "
    "sys.exit(subprocess.run([os.environ['PYTHON'], '-c', os.environ['RANK_CODE']]).returncode)"
)


@pytest.mark.parametrize(
    ("program", "title"),
    [
        ("starter-suid", "Apptainer runtime parent: /images/train.sif"),  # srun apptainer exec (a setuid install)
        ("starter", "Apptainer runtime parent: /images/train.sif"),  # ... unprivileged
        ("starter", "Singularity runtime parent"),  # srun singularity exec (3.x, SingularityCE)
        ("uv", "uv"),  # srun uv run python ...: uv waits for its child
    ],
)
def test_the_ranks_a_launcher_starts_each_in_a_container_or_under_uv_run_say_a_line_once(
    program: str, title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apptainer's starter and ``uv run`` stay the parent of the command they run, and were no wrapper: each rank kept a
    folder of its own, and every line of the job was said once per rank."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    step, wrapper = tmp_path / "slurmstepd", tmp_path / program
    step.symlink_to(sys.executable)
    wrapper.symlink_to(sys.executable)
    env = {
        **os.environ,
        "SLURM_JOB_ID": "7",
        "RANK_CODE": SAY_OPENED,
        "TMPDIR": str(tmp_path),
        "PYTHON": sys.executable,
    }
    env.update(WRAPPER=json.dumps([title, "-c", RUNS_A_RANK]), WRAPPER_PROGRAM=str(wrapper))
    argv = ["slurmstepd: [7.0]", "-c", WRAPPING_LAUNCHER, "SLURM_PROCID"]
    done = subprocess.run(argv, executable=step, env=env, capture_output=True, text=True, timeout=120)
    assert sorted(done.stderr.splitlines()) == ["DEBUG the dataset opened", "INFO the dataset opened"], done.stderr


@pytest.mark.parametrize(
    ("title", "wraps"),
    [("Apptainer runtime parent: /images/train.sif", True), ("Apptainer instance: me [lab] /images/train.sif", False)],
)
def test_an_apptainer_starter_is_a_wrapper_only_where_it_runs_one_command(
    title: str, wraps: bool, tmp_path: Path
) -> None:
    """An instance's starter lives on from run to run, as an interactive shell does."""
    starter = tmp_path / "starter"
    starter.symlink_to(sys.executable)
    waits = "print(flush=True); import sys; sys.stdin.read()"
    process = subprocess.Popen([title, "-c", waits], executable=starter, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"\n"  # (started: its title is set)
        assert said_once._is_wrapper(process.pid) is wraps
    finally:
        process.communicate(b"")


@pytest.mark.parametrize(
    ("title", "shell", "commands"),
    [
        # srun --pty bash: an interactive shell in a step of tasks (no command given: it reads the terminal).
        ("slurmstepd: [7.0]", ["bash"], TWO_RUNS),
        ("slurmstepd: [7.0]", ["bash", "-i"], TWO_RUNS),
        # The batch step's script, and salloc's interactive step's shell.
        ("slurmstepd: [7.batch]", ["bash", "-c", TWO_RUNS], ""),
        ("slurmstepd: [7.interactive]", ["bash", "-c", TWO_RUNS], ""),
    ],
)
def test_runs_one_after_another_from_a_shell_in_a_slurm_step_each_say_their_lines(
    title: str, shell: list[str], commands: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell that lives on from run to run (interactive, a batch script) is no wrapper, even under Slurm's step
    manager: each run in it says its own lines."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    named = tmp_path / "slurmstepd"
    named.symlink_to(sys.executable)
    step = f"import subprocess, sys; sys.exit(subprocess.run({shell!r}, input={commands!r}, text=True).returncode)"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "RANK_CODE": SAY_OPENED, "TMPDIR": str(tmp_path)}
    env.update(PYTHON=sys.executable, PS1="", PS2="")
    done = subprocess.run([title, "-c", step], executable=named, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if "the dataset opened" in line]
    assert lines == ["INFO the dataset opened"] * 2, done.stderr


@pytest.mark.parametrize(
    ("arguments", "runs_a_command"),
    [
        (["-c", "python train.py"], True),
        (["-lc", "python train.py"], True),  # (a login shell given a command: srun bash -lc '...' loads modules)
        (["-o", "pipefail", "-c", "python train.py"], True),
        (["--norc", "./run.sh", "--lr", "3e-4"], True),
        ([], False),  # (reads its commands from the terminal)
        (["-l"], False),
        (["--login"], False),
        (["-i", "-c", "python train.py"], False),
        (["-o", "vi"], False),
        (["-"], False),  # (reads its commands from stdin)
    ],
)
def test_a_shell_is_a_wrapper_only_where_given_a_command_or_a_script(
    arguments: list[str], runs_a_command: bool
) -> None:
    assert said_once._runs_a_command(arguments) is runs_a_command


def test_a_warning_whose_numbers_differ_between_processes_is_said_once_by_its_key(tmp_path: Path, monkeypatch) -> None:
    """A cache's shortfall (images, open decoders) carries each worker's own measures: matched by text, every worker
    of every rank said it, again each epoch."""
    monkeypatch.delenv(said_once.SAID_ENV)
    rank = textwrap.dedent("""
        import logging, os
        from lerobot_dali.said_once import warn_once
        logging.basicConfig(format="%(levelname)s %(message)s", level=logging.DEBUG)
        log = logging.getLogger("lerobot_dali.test")
        warn_once(log, "short by %d", os.getpid(), key="shortfall")
        warn_once(log, "short by %d", os.getpid(), key="shortfall")  # (said already: by this process)
        warn_once(log, "other %d", os.getpid())  # (no key: by its text, each process's own)
    """)
    lines = _ranks_of_one_node(rank, 3, tmp_path).splitlines()
    assert sum(line.startswith("WARNING short by ") for line in lines) == 1, lines
    assert sum(line.startswith("DEBUG short by ") for line in lines) == 5, lines
    assert sum(line.startswith("WARNING other ") for line in lines) == 3, lines


def test_a_warning_about_the_dataset_is_said_once_by_the_ranks_of_a_node(tmp_path: Path, monkeypatch) -> None:
    """r1's data files hold columns info.json does not declare: each rank opening it warned, 8 times on a node of
    8 GPUs (2 here)."""
    from tests.conftest import shared_dataset

    monkeypatch.delenv(said_once.SAID_ENV)
    rank = textwrap.dedent(f"""
        import logging
        from lerobot_dali.dataset_reader import open_dataset, warn_undeclared_columns
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
        warn_undeclared_columns(open_dataset({str(shared_dataset("r1_v30_h264"))!r}))  # (as the iterator does)
    """)
    err = _ranks_of_one_node(rank, 2, tmp_path)
    assert err.count("the data files hold columns info.json does not declare") == 1, err
    assert err.startswith("WARNING lerobot_dali.dataset_reader: "), err


def test_the_ranks_of_a_node_say_what_the_job_shares_once_and_their_own_share_each(
    make_ds, tmp_path: Path, monkeypatch
) -> None:
    """Each rank building its iterator logged at INFO the dataset it opened and how its cameras decode, facts of the
    job: 8 lines each on a node of 8 GPUs. The first rank says them, the others at DEBUG; each rank still says its
    own samples."""
    root = make_ds(episodes=4, frames_per_episode=10, cameras=1, codec="h264", size=(64, 64))
    monkeypatch.delenv(said_once.SAID_ENV)
    rank = textwrap.dedent(f"""
        import logging
        from lerobot_dali.iterator import DALILeRobotIterator
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.DEBUG)
        DALILeRobotIterator({str(root)!r}, batch_size=2, device="cpu", num_workers=1).close()
    """)
    lines = _ranks_of_one_node(rank, 2, tmp_path).splitlines()

    def levels(text: str) -> list[str]:
        return sorted(line.split()[0] for line in lines if text in line)

    assert levels("lerobot_dali.dataset_reader: opened LeRobotDatasetReader(") == ["DEBUG", "INFO"], lines
    assert levels("are decoded on the CPU by 1 worker process,") == ["DEBUG", "INFO"], lines
    launched = "(from the launcher's RANK and WORLD_SIZE variables): 20 samples per epoch"
    assert levels(f"{root}: rank 0/2 {launched}") == ["INFO"], lines
    assert levels(f"{root}: rank 1/2 {launched}") == ["INFO"], lines


def test_a_filesystem_that_cannot_list_is_said_once_though_its_name_differs_by_process(tmp_path, monkeypatch) -> None:
    """The line names the filesystem by its repr, which holds its address in each process: matched by its text,
    every rank said it."""
    monkeypatch.delenv(said_once.SAID_ENV)
    rank = textwrap.dedent("""
        import logging
        from fsspec.implementations.memory import MemoryFileSystem
        from lerobot_dali.file_stamps import FileStamps
        logging.basicConfig(format="%(levelname)s %(message)s", level=logging.DEBUG)

        class Unlisted(MemoryFileSystem):
            def find(self, *args, **kwargs):
                raise NotImplementedError

        FileStamps(Unlisted(), ["/data"])
    """)
    lines = [line for line in _ranks_of_one_node(rank, 3, tmp_path).splitlines() if "cannot list /data" in line]
    assert sorted(line.split()[0] for line in lines) == ["DEBUG", "DEBUG", "INFO"], lines


def test_a_line_is_left_to_the_ranks_that_show_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script may log at INFO on rank 0 only, the others at WARNING: a rank that showed nothing took the line
    first, rank 0 then said it at DEBUG, and no log held it."""
    monkeypatch.delenv(said_once.SAID_ENV)
    said = tmp_path / "rank-1-said"
    rank = textwrap.dedent(f"""
        import logging, os, pathlib, time
        from lerobot_dali.said_once import say_once
        shows = os.environ["RANK"] == "0"
        logging.basicConfig(format="%(levelname)s %(message)s", level=logging.INFO if shows else logging.WARNING)
        said = pathlib.Path({str(said)!r})
        while shows and not said.exists():  # (rank 1 meets the line first)
            time.sleep(0.01)
        say_once(logging.getLogger("lerobot_dali.test"), logging.INFO, "the dataset opened")
        said.touch()
    """)
    assert _ranks_of_one_node(rank, 2, tmp_path).splitlines() == ["INFO the dataset opened"]


def test_a_folder_left_by_a_process_that_no_longer_runs_is_removed(tmp_path: Path, monkeypatch) -> None:
    """Named by PID and start time: a process that has the PID now is another one, and never inherits it."""
    host = said_once.host_name()
    mine = said_once._start_time(os.getpid())
    reused = tmp_path / f"lerobot-dali-said-{host}-{os.getpid()}-{int(mine or 0) + 1}"  # this PID, another start
    dead = tmp_path / f"lerobot-dali-said-{host}-999999999-1"
    dead_dvm = tmp_path / f"lerobot-dali-said-{host}-999999999-1-0123abcd"  # (one job's of a DVM daemon)
    other_host = tmp_path / "lerobot-dali-said-elsewhere-999999999-1"
    for folder in (reused, dead, dead_dvm, other_host):
        folder.mkdir()
        (folder / "said").touch()
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(said_once, "_launcher", lambda: None)  # (pytest itself may run under srun)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    said_once._made_folder.cache_clear()
    try:
        folder = said_once._folder()
    finally:
        said_once._made_folder.cache_clear()
    assert folder == tmp_path / f"lerobot-dali-said-{host}-{os.getpid()}-{mine}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, other_host.name])


def test_a_training_process_removes_its_folder_at_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a launcher's (its ranks may still run) or a killed process's is left for the next job to remove."""
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    code = "import logging; from lerobot_dali.said_once import warn_once; warn_once(logging.getLogger('x'), 'said')"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=True)
    assert list(tmp_path.iterdir()) == []


def test_where_no_temporary_folder_is_usable_each_process_says_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``$TMPDIR`` a file and no other candidate writable: tempfile.gettempdir() raised FileNotFoundError out of every
    warn_once and say_once, so a log line took training down."""
    not_a_folder = tmp_path / "tmp"
    not_a_folder.write_text("")
    monkeypatch.delenv(said_once.SAID_ENV)
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setattr("tempfile._candidate_tempdir_list", lambda: [str(not_a_folder)])  # (/tmp, /var/tmp, cwd: none)
    said_once._made_folder.cache_clear()
    log = logging.getLogger("lerobot_dali.test")
    try:
        with caplog.at_level(logging.DEBUG, logger=log.name):
            said_once.warn_once(log, "no temporary folder %d", 1)
            said_once.warn_once(log, "no temporary folder %d", 1)
            with said_once.shared_with_children():
                assert said_once.SAID_ENV not in os.environ  # (none to share)
    finally:
        said_once._made_folder.cache_clear()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "no temporary folder 1"),
        ("DEBUG", "no temporary folder 1"),
    ]


def test_a_child_forked_by_the_training_process_leaves_the_jobs_folder_to_it(tmp_path: Path, monkeypatch) -> None:
    """The training process removes its folder at exit, and a child it forks (``os.fork``) runs its exit handlers too:
    the child's exit removed the folder, and with it what the job had said, while the job went on."""
    monkeypatch.delenv(said_once.SAID_ENV)
    script = textwrap.dedent("""
        import logging, os, sys
        from lerobot_dali import said_once
        logging.basicConfig(format="%(levelname)s %(message)s", level=logging.DEBUG)
        said_once.warn_once(logging.getLogger("lerobot_dali.test"), "said")
        folder = said_once._folder()
        if os.fork() == 0:
            sys.exit(0)
        os.wait()
        print(len(list(folder.iterdir())) if folder.is_dir() else "removed")
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "WARNING said\n"
    assert done.stdout == "1\n"  # the folder, with the line said in it
    assert list(tmp_path.iterdir()) == []  # (the parent's own exit removed it)
