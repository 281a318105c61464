"""The commands and flags the READMEs show still match the code: every command of their ``bash`` blocks parses with
its program's own parser (its loader and recipe names are the bench's), the bench's loaders table names every
loader, the README's command-line table lists each verb's flags and choices as the CLI has them,
and every ``--flag`` they name is a flag of one of the project's programs (or of a tool they run it under); their
Python blocks pass the API only keywords it takes, and the reader's block runs as written; the defaults and limits
their prose states (``drop_last=True`` by default, the retries' 5) are the code's.

A renamed or removed flag or argument otherwise broke the documented commands silently: nothing ran them."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lerobot_dali import bench_limits
from lerobot_dali.bench_types import LOADERS
from lerobot_dali.cli import _parser
from pipelines.recipes import NAMED_RECIPES

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / name for name in ("README.md", "pipelines/README.md", "bench/README.md", "docker/README.md")]
#: Flags the READMEs give other tools: docker, torchrun, accelerate, hf, SLURM, venv, debootstrap.
OTHER_TOOLS_FLAGS = {
    "--build-arg", "--gpus", "--ipc", "--network", "--shm-size", "--variant", "--repo-type", "--system-site-packages",
    "--cpu", "--multi_gpu", "--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--nproc_per_node", "--standalone", "--signals-to-handle", "--shutdown-timeout", "--signal",
    "--pty",
}  # fmt: skip


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _captured_parser(main: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``main`` builds (the bench scripts build theirs inside ``main``), taken as it starts parsing."""

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        try:
            main()
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"{main} parsed no arguments")


def _script(path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(path.parent))  # (bench scripts import their siblings)
    name = f"_doc_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def parsers() -> Iterator[dict[str, argparse.ArgumentParser]]:
    """Each program the READMEs run, by the name its command line calls it: ``lerobot-dali`` and the scripts."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        found = {"lerobot-dali": _parser(), "bench/limits.py": _captured_parser(bench_limits.main, monkeypatch)}
        for name in ("train", "lerobot_policy"):
            module = importlib.import_module(f"pipelines.{name}")
            found[f"pipelines/{name}.py"] = _captured_parser(partial(module.parse_args, []), monkeypatch)
        scripts = ("batch_cpu", "batch_fallback", "nvdec_clips", "row_groups", "worker_start", "order_scale")
        for name in (*scripts, "training_cpu"):
            module = _script(ROOT / "bench" / f"{name}.py", monkeypatch)
            found[f"bench/{name}.py"] = _captured_parser(module.main, monkeypatch)
        yield found


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in parser._actions:
        flags |= {s for s in action.option_strings if s.startswith("--")} - {"--help"}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _flags(sub)
    return flags


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _bash_commands(doc: Path) -> Iterator[str]:
    """Each command of the doc's ``bash`` blocks: continuations joined, comments and ``&&`` chains split off."""
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#", " " + line)[0].strip()
            yield from (command.strip() for command in line.split("&&") if command.strip())


def _program_and_args(command: str) -> tuple[str, list[str]] | None:
    """Which program a documented command runs, and its arguments (a synopsis's ``[...]`` kept as optional flags
    given, a trailing ``...`` dropped); None for one that runs no program of the project."""
    argv = [word for word in shlex.split(command.replace("[", " ").replace("]", " ")) if word != "..."]
    if argv[:2] == ["docker", "build"]:
        return None
    for i, word in enumerate(argv):
        if word == "lerobot-dali" or (word in ("lerobot_dali", "lerobot_dali.cli") and argv[i - 1] == "-m"):
            return "lerobot-dali", argv[i + 1 :]  # (in docker run, the image: its entry point is lerobot-dali)
        if word.endswith(".py"):
            if word == "bench/remote_http.py":  # (its further arguments go to the bench, past the dataset)
                return "lerobot-dali", ["bench", *argv[i + 2 :]]
            return word, argv[i + 1 :]
    return None


def test_every_documented_command_parses(parsers: dict[str, argparse.ArgumentParser]) -> None:
    commands = [(doc.relative_to(ROOT), c, _program_and_args(c)) for doc in DOCS for c in _bash_commands(doc)]
    run = [(doc, command, found) for doc, command, found in commands if found is not None]
    assert len(run) >= 20, run
    rejected = []
    for doc, command, (program, args) in run:
        assert program in parsers, f"{doc}: {command!r} runs {program}, which this test does not know"
        try:
            parsed = parsers[program].parse_args(args)
        except SystemExit:
            rejected.append(f"{doc}: {command}")
            continue
        # (values the parser takes as any string, checked only when the run starts)
        if not set(getattr(parsed, "loaders", None) or ()) <= set(LOADERS):
            rejected.append(f"{doc}: {command} (loaders: {', '.join(LOADERS)})")
        if getattr(parsed, "recipe", None) not in (None, *NAMED_RECIPES):
            rejected.append(f"{doc}: {command} (recipes: {', '.join(NAMED_RECIPES)})")
    assert not rejected, "rejected:\n" + "\n".join(rejected)


def test_the_loaders_table_names_every_loader() -> None:
    table = (ROOT / "bench" / "README.md").read_text().split("### Loaders", 1)[1].split("\n\n", 2)[1]
    named = [name for row in table.splitlines()[2:] for name in re.findall(r"`([\w-]+)`", row.split("|")[1])]
    assert named == list(LOADERS)


def test_the_command_line_table_lists_each_verbs_flags_and_choices(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Every verb but ``bench`` (whose full list is bench/README.md's) shows all its flags; choices as the CLI's."""
    rows = dict(re.findall(r"^\| `lerobot-dali ([\w-]+) (.*?)` \|", (ROOT / "README.md").read_text(), re.M))
    verbs = _verbs(parsers["lerobot-dali"])
    assert set(rows) == set(verbs)
    for verb, synopsis in rows.items():
        shown, flags = set(re.findall(r"--[\w-]+", synopsis)), _flags(verbs[verb])
        assert shown <= flags, f"{verb}: the README shows {sorted(shown - flags)}, which it does not take"
        if verb != "bench":
            assert flags <= shown, f"{verb}: the README's table leaves out {sorted(flags - shown)}"
        for flag, choices in re.findall(r"(--[\w-]+) \{([^}]*)\}", synopsis):
            action = next(a for a in verbs[verb]._actions if flag in a.option_strings)
            assert set(choices.split(",")) == set(action.choices or ()), f"{verb} {flag}"


def test_every_option_of_every_verb_says_what_it_does() -> None:
    """``lerobot-dali VERB --help`` gives each option and argument a help text that says more than its default: ``bench
    --seed`` had none, and ``make-dataset --cameras``/``--fps``/``--frames-per-episode`` and ``reencode --codec`` only
    ``(default ...)``."""
    bare = [
        f"{verb} {'/'.join(action.option_strings) or action.dest}: {action.help!r}"
        for verb, parser in _verbs(_parser()).items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and not re.search(r"[a-z]", re.sub(r"\([^()]*\)", "", action.help or ""))
    ]
    assert not bare, "options whose --help says nothing but a default:\n" + "\n".join(bare)


def _unnamed_flags(parser: argparse.ArgumentParser, doc: Path) -> list[str]:
    """The options of ``parser`` (by their first spelling; aliases are the main README's) that ``doc`` never names."""
    text = doc.read_text()
    return sorted(
        flag
        for action in parser._actions
        for flag in action.option_strings[:1]
        if flag.startswith("--") and flag != "--help" and not re.search(re.escape(flag) + r"(?![\w-])", text)
    )


def test_the_pipelines_readme_names_every_flag_of_its_scripts(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """pipelines/README.md names each option of train.py and lerobot_policy.py: train.py's ``--episode-piece-frames``,
    ``--lr``, ``--decode`` ... were in none of the docs."""
    unnamed = {
        script: _unnamed_flags(parsers[f"pipelines/{script}"], ROOT / "pipelines" / "README.md")
        for script in ("train.py", "lerobot_policy.py")
    }
    assert not any(unnamed.values()), f"flags pipelines/README.md does not name: {unnamed}"


def test_the_bench_readme_names_every_flag_of_the_bench(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """bench/README.md names each option of ``lerobot-dali bench`` (``--seed`` was in none of the docs)."""
    unnamed = _unnamed_flags(_verbs(parsers["lerobot-dali"])["bench"], ROOT / "bench" / "README.md")
    assert not unnamed, f"flags bench/README.md does not name: {unnamed}"


def test_the_docs_name_every_extra_of_the_package() -> None:
    """Each extra pyproject.toml defines is named as one (``.[name]``, or ``the `name` extra``) in a README, so a user
    finds how to install it: the ``torchcodec`` extra was in none."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = "\n".join(doc.read_text() for doc in DOCS)
    named = set(re.findall(r"\.\[([\w-]+)\]", text)) | set(re.findall(r"`([\w-]+)` extra", text))
    assert set(extras) <= named, f"extras no README names: {sorted(set(extras) - named)}"


def test_every_flag_the_docs_name_is_one_of_a_program(parsers: dict[str, argparse.ArgumentParser]) -> None:
    known = set().union(*(_flags(parser) for parser in parsers.values())) | OTHER_TOOLS_FLAGS | {"--help"}
    unknown = {
        str(doc.relative_to(ROOT)): sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", doc.read_text())) - known)
        for doc in DOCS
    }
    unknown = {doc: flags for doc, flags in unknown.items() if flags}
    assert not unknown, f"flags no program takes: {unknown}"


def _python_blocks() -> list[str]:
    return [block for doc in DOCS for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)]


def test_the_python_blocks_call_the_api_with_arguments_it_takes() -> None:
    """Every keyword a README's Python block passes to lerobot_dali's API is one the API takes (a mixture's other
    keywords are the iterator's, which it passes on), and every name it imports is there."""
    import lerobot_dali
    from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture

    takes_on = {DALILeRobotMixture: DALILeRobotIterator.__init__}
    calls = []
    for block in _python_blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module == "lerobot_dali":
                assert all(hasattr(lerobot_dali, alias.name) for alias in node.names), ast.unparse(node)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in lerobot_dali.__all__:
                api = getattr(lerobot_dali, node.func.id)
                taken = set(inspect.signature(api).parameters)
                if api in takes_on:
                    taken |= set(inspect.signature(takes_on[api]).parameters)
                given = {k.arg for k in node.keywords if k.arg is not None}
                assert given <= taken, f"{node.func.id} takes no {sorted(given - taken)}"
                calls.append(node.func.id)
    assert {"DALILeRobotIterator", "DALILeRobotMixture", "concat_datasets", "open_dataset"} <= set(calls), calls


def test_the_readers_block_runs_on_the_dataset_it_names() -> None:
    """The README's "Using the reader" block, run as written on ``cr5_v30_av1``: the attributes and methods it
    shows are the reader's."""
    from tests.conftest import shared_dataset

    block = next(b for b in _python_blocks() if "ds = open_dataset(" in b)
    named = re.search(r'open_dataset\("([^"]*)"\)', block)
    assert named is not None and Path(named.group(1)).name == "cr5_v30_av1"
    namespace: dict[str, Any] = {}
    exec(block.replace(named.group(1), str(shared_dataset("cr5_v30_av1"))), namespace)
    assert set(namespace["rows"]) >= {"index", "episode_index", "frame_index", "timestamp", "action"}
    stats = namespace["stats"]["action"]  # (a policy's normaliser: LeRobot's meta.stats, from meta/stats.json)
    assert {"mean", "std", "min", "max", "count"} <= set(stats) and stats["mean"].shape == (7,)


def test_the_public_api_documents_each_member_it_shows() -> None:
    """``help()`` on the iterator, the mixture and the reader gives each public method and property a docstring of its
    own, ``__iter__`` too (without one, help() showed the source's ``# -- iteration ---`` comment in its place)."""
    from lerobot_dali import DALILeRobotIterator, DALILeRobotMixture, LeRobotDatasetReader

    bare = []
    for cls in (DALILeRobotIterator, DALILeRobotMixture, LeRobotDatasetReader):
        for name, member in vars(cls).items():
            if name.startswith("_") and name not in ("__iter__", "__len__", "__enter__"):
                continue
            function = member.fget if isinstance(member, property) else member
            if callable(function) and not (getattr(function, "__doc__", None) or "").strip():
                bare.append(f"{cls.__name__}.{name}")
    assert not bare, f"no docstring: {bare}"


#: The names the READMEs' examples give these classes' instances (``mix.batch_shares``, ``it.epoch``, ``ds.video``).
_INSTANCE_NAMES = {"mix": "DALILeRobotMixture", "it": "DALILeRobotIterator", "ds": "LeRobotDatasetReader"}
_FILE_SUFFIXES = {"py", "json", "jsonl", "csv", "png", "toml", "cu", "safetensors", "typed", "io"}


def _package_namespace() -> dict[str, Any]:
    """What a README's dotted name may start with: each lerobot_dali module, by its name, and each class a module of
    the package defines at its top (``BatchSource``, ``CpuFrameDecoder``), by its name."""
    import lerobot_dali

    found: dict[str, Any] = {"lerobot_dali": lerobot_dali}
    for path in sorted((ROOT / "lerobot_dali").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = importlib.import_module(f"lerobot_dali.{path.stem}")
        found[path.stem] = module
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and isinstance(getattr(module, node.name, None), type):
                found.setdefault(node.name, getattr(module, node.name))
    return found


def _has(owner: Any, name: str) -> bool:
    """``owner.name`` exists: an attribute, a dataclass field, or an instance attribute its class sets on ``self``."""
    if hasattr(owner, name) or name in getattr(owner, "__dataclass_fields__", {}):
        return True
    return isinstance(owner, type) and any(
        re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]*)?=(?!=)", inspect.getsource(cls))
        for cls in owner.__mro__
        if cls.__module__.startswith("lerobot_dali")
    )


def test_every_dotted_name_the_docs_give_of_the_package_is_there() -> None:
    """Each ``module.NAME``, ``Class.member`` and ``lerobot_dali.module.NAME`` of this package a README names still
    exists: ``dali_graph.resize_in_worker`` (moved into ``dali_graph.camera_feed``) and ``clips.TEMPLATE_CACHE_SIZE``
    (moved to packet_index) were each named by bench/README.md after the code had moved on."""
    namespace = _package_namespace()
    checked, missing = [], []
    for doc in DOCS:
        for ref in sorted(set(re.findall(r"`((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*)`", doc.read_text()))):
            head, *path = ref.split(".")
            if path[-1] in _FILE_SUFFIXES or (owner := namespace.get(_INSTANCE_NAMES.get(head, head))) is None:
                continue  # (a file name, or a name of another library's: torch.distributed, accelerator.prepare)
            for name in path:
                if not _has(owner, name):
                    missing.append(f"{doc.relative_to(ROOT)}: {ref}")
                    break
                owner = getattr(owner, name, None)
            checked.append(ref)
    assert len(checked) >= 15, checked
    assert not missing, f"names the docs give that the package no longer has: {missing}"


def test_the_layout_gives_every_module_of_the_package_a_line() -> None:
    """The README's Layout gives each module of ``lerobot_dali/`` a line of its own (``- `name.py`: its job``) and
    names no module the package lacks: 23 modules (``cache_dirs.py``, ``diagnose.py``, ``errors.py`` ...) had none, and
    five of the bench's only a ``bench*.py``, so a contributor looking for where something lives was not told."""
    section = (ROOT / "README.md").read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    modules = {path.name for path in (ROOT / "lerobot_dali").glob("*.py")}
    lines = re.findall(r"^- `(\w+\.py)`: \S", section, re.M)
    assert len(modules) >= 100, sorted(modules)
    unlisted = sorted(modules - set(lines))
    twice = sorted({name for name in lines if lines.count(name) > 1})
    gone = sorted(set(re.findall(r"`(\w+\.py)`", section)) - modules)
    assert not unlisted, f"modules the README's Layout gives no line: {unlisted}"
    assert not twice, f"modules the README's Layout lists more than once: {twice}"
    assert not gone, f"modules the README's Layout names that lerobot_dali/ does not have: {gone}"


def _stated(doc: str) -> str:
    """``doc``'s text with its line breaks and runs of spaces as one space: a phrase is found across a wrapped line."""
    return " ".join((ROOT / doc).read_text().split())


def test_the_defaults_and_limits_the_readmes_state_are_the_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The READMEs' prose states defaults, limits and environment variables' defaults that no flag check reads
    (``drop_last=True`` by default, ``CLOSE_WAIT_S``'s 60 s, the retries' 5, the 1 GiB /dev/shm warning): each phrase
    is held to the value the code has, so a default changed in one place and not the other fails here, as does a
    phrase reworded without its value."""
    from lerobot_dali import CpuDecodeOptions, DALILeRobotIterator, RankBalance
    from lerobot_dali import iterator as iterator_module
    from lerobot_dali.cache_dirs import DEFAULT_CACHE_DAYS, PRUNE_EVERY_S
    from lerobot_dali.checked_files import CHECKED_FILES, CHECKED_FILES_REMOTE
    from lerobot_dali.clip_sharing import SHARED_CLIP_FRAMES
    from lerobot_dali.column_store import _KEEP_FREE, ColumnStore
    from lerobot_dali.concurrent_calls import MAX_THREADS
    from lerobot_dali.cpu_decode import DEFAULT_OPEN_DECODERS
    from lerobot_dali.cpu_decode_options import MIN_OPEN_DECODERS
    from lerobot_dali.dataset_location import HTTP_TIMEOUTS_S
    from lerobot_dali.dataset_reader import LOCAL_DATA_FILES_KEPT, REMOTE_DATA_FILES_KEPT
    from lerobot_dali.dataset_summary import CODEC_SURVEY_MAX_FILES
    from lerobot_dali.exit_close import _DEFAULT_EXIT_WAIT_S
    from lerobot_dali.nvdec_check import PROBE_MAX_MEAN_DIFF
    from lerobot_dali.open_files import DATA_FILE_SHARE, DECODER_SHARE
    from lerobot_dali.request_checks import _UNSIZED_BYTES, bytes_deadline_s
    from lerobot_dali.retry_policy import MAX_RETRY_AFTER_S, RETRIES_ENV, RetryPolicy
    from lerobot_dali.video_encoding import LONG_GOP_FRAMES
    from lerobot_dali.worker_errors import SMALL_SHM_BYTES
    from pipelines.preemption import EXIT_PREEMPTED
    from pipelines.recipes import get_recipe
    from pipelines.train import DEFAULT_CHUNK

    monkeypatch.delenv(RETRIES_ENV, raising=False)  # (the default, not this shell's)
    given = inspect.signature(DALILeRobotIterator.__init__).parameters
    options, store, mib = CpuDecodeOptions(), ColumnStore(), 2**20
    threads = {iterator_module.default_dali_threads(workers) for workers in range(-64, 256)}
    stated = {
        "README.md": {
            "`drop_last=True` by default": given["drop_last"].default is True,
            'by default (`rank_balance="pad"`)': given["rank_balance"].default is RankBalance.PAD,
            "within `tolerance_s` (default 1e-4 s": given["tolerance_s"].default == 1e-4,
            '`device="cuda"` (the default)': given["device"].default == "cuda",
            "`share_clips=True` makes fewer clips": given["share_clips"].default is False,
            "`cache_gb=8.0`": given["cache_gb"].default == 8.0,
            "`dali_threads` (default: the rank's CPUs left after `num_workers`, 2 to 8)": threads == set(range(2, 9)),
            "It waits up to 60 s for that pass": iterator_module.CLOSE_WAIT_S == 60,
            "waited for 10 s in all (`LEROBOT_DALI_EXIT_WAIT_S`)": _DEFAULT_EXIT_WAIT_S == 10,
            "(`LEROBOT_DALI_REMOTE_RETRIES`, default 5": RetryPolicy().retries == 5,
            "`LEROBOT_DALI_CACHE_DAYS` days (default 30": DEFAULT_CACHE_DAYS == 30,
            "sweeping each at most once a day": PRUNE_EVERY_S == 24 * 3600,
            "`cpu_decode=CpuDecodeOptions(image_cache_bytes=...)` (256 MiB)": options.image_cache_bytes == 256 * mib,
            "fits `max_decoder_memory_bytes` (256 MiB), and at least 8": (
                options.max_decoder_memory_bytes == 256 * mib and MIN_OPEN_DECODERS == 8
            ),
            "(pool size x cameras, at least 64, at most half the process's open-file limit, its data files an eighth, "
            "at most 128": (
                DEFAULT_OPEN_DECODERS == 64
                and DECODER_SHARE == 1 / 2
                and DATA_FILE_SHARE == 1 / 8
                and LOCAL_DATA_FILES_KEPT == 128
            ),
            "(128 local, 16 remote)": (LOCAL_DATA_FILES_KEPT, REMOTE_DATA_FILES_KEPT) == (128, 16),
            "the iterator warns at construction under 1 GiB": SMALL_SHM_BYTES == 2**30,
            "30 s to connect and 60 s between bytes": HTTP_TIMEOUTS_S == {"sock_connect": 30, "sock_read": 60},
            "60 s plus its bytes at 64 KiB/s (a 4 MiB block: 124 s": bytes_deadline_s(4 * mib) == 124,
            "reckoned as 256 MiB": _UNSIZED_BYTES // mib == 256,
            "up to 300 s": MAX_RETRY_AFTER_S == 300,
            "at least 4,096 rows and 8 times the episode": (store.min_group_rows, store.min_ratio) == (4096, 8),
            "left under 5% free": _KEEP_FREE == 0.05,
            "up to 8 distinct frames a clip": SHARED_CLIP_FRAMES == 8,
            "within 4 levels of brightness": PROBE_MAX_MEAN_DIFF == 4,
            "16 at a time": MAX_THREADS == 16,
            "up to 100,000 files of a camera, 2,000 remote": (CHECKED_FILES, CHECKED_FILES_REMOTE) == (100_000, 2_000),
            "keyframes more than 16 frames apart": LONG_GOP_FRAMES == 16,
            "(cameras of at most 16 files": CODEC_SURVEY_MAX_FILES == 16,
        },
        "pipelines/README.md": {
            "`--chunk` actions (default 10)": DEFAULT_CHUNK == 10,
            "exit with status 75": EXIT_PREEMPTED == 75,
            "(diffusion: 7, as LeRobot's train script": get_recipe("diffusion").drop_n_last_frames == 7,
        },
    }
    unsaid, untrue = [], []
    for doc, phrases in stated.items():
        text = _stated(doc)
        unsaid += [f"{doc}: {phrase!r}" for phrase in phrases if phrase not in text]
        untrue += [f"{doc}: {phrase!r}" for phrase, holds in phrases.items() if not holds]
    assert not unsaid, f"phrases the READMEs no longer say (reworded? update this test with them): {unsaid}"
    assert not untrue, f"defaults and limits the READMEs state that the code no longer has: {untrue}"
