"""SourceFile: the pipeline's source reaches DALI's worker processes through a file, not down each one's start."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lerobot_dali.new_folder import host_name
from lerobot_dali.worker_source import FOLDER, PREFIX, SourceFile, dali_dump


def test_a_source_is_read_back_from_its_file_until_removed() -> None:
    files = SourceFile()
    name = files.dumps({"episodes": np.arange(5)})
    assert isinstance(name, bytes) and os.path.exists(name)
    np.testing.assert_array_equal(SourceFile.loads(name)["episodes"], np.arange(5))
    files.remove()
    assert not os.path.exists(name)
    files.remove()  # (again: nothing left to remove)
    assert not os.path.exists(os.path.dirname(name))  # (its folder too)


@pytest.mark.parametrize("gone_before", [False, True])
def test_a_sources_files_share_one_folder_and_a_removed_one_is_made_again(gone_before: bool) -> None:
    """Each dump of one SourceFile goes to its process's one folder, which remove deletes whole; a dump after remove
    (the next build) writes a file again, in a new folder, not the pickle itself. A folder already gone when remove
    is called (``gone_before``: a cleaner of the temporary directory took it) fails nothing."""
    files = SourceFile()
    first, second = files.dumps([1]), files.dumps([2])
    assert os.path.dirname(first) == os.path.dirname(second)
    if gone_before:
        shutil.rmtree(os.path.dirname(first))
    files.remove()
    assert not os.path.exists(first) and not os.path.exists(second)
    try:
        third = files.dumps([3])
        assert os.path.exists(third) and SourceFile.loads(third) == [3]
    finally:
        files.remove()


def test_the_files_of_a_process_killed_during_a_build_are_removed_by_the_next() -> None:
    """A process killed while DALI started its workers (Ctrl-C twice, SIGKILL, the OOM killer) left its source's
    pickle (a few MB for a large dataset) in the temporary directory, one more each time."""
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lerobot_dali.worker_source import SourceFile; import os; "
            "print(os.fsdecode(SourceFile().dumps(list(range(1000)))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )  # (a process that dumps its source and ends without removing it, as a killed one does)
    left = Path(killed.stdout.strip())
    assert left.exists() and left.parent.name.startswith(f".{FOLDER}.source-{host_name()}-")
    files = SourceFile()
    mine = files.dumps([1, 2])
    try:
        assert not left.exists() and not left.parent.exists()
        assert os.path.exists(mine) and Path(os.fsdecode(mine)).parent.parent == Path(tempfile.gettempdir())
    finally:
        files.remove()


def test_a_source_that_does_not_pickle_raises_and_leaves_no_file() -> None:
    """A source that fails to pickle part-way raises the pickler's error, and the file begun for it is deleted, not
    left in the temporary directory (worker_source lines 76-78, reached by no test); the next source is written."""
    import pickle

    files = SourceFile()
    try:
        files.dumps([1])  # (the process's folder, made by the first source)
        folder = files._folder
        assert folder is not None and len(list(folder.iterdir())) == 1
        with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):  # (plain pickle takes none)
            files.dumps({"rows": np.arange(1000), "pick": lambda row: row % 2})
        assert len(list(folder.iterdir())) == 1
        assert SourceFile.loads(files.dumps([2])) == [2]
    finally:
        files.remove()


def test_dalis_pickler_takes_a_lambda_as_it_did_for_the_workers() -> None:
    files = SourceFile(dali_dump)
    try:
        assert SourceFile.loads(files.dumps({"pick": lambda row: row % 2}))["pick"](3) == 1
    finally:
        files.remove()


def test_each_worker_starts_with_the_sources_file_name_not_the_source(make_ds, process_starts) -> None:
    """DALI writes each worker's arguments down the pipe spawn starts it with, one worker after another; past the
    64 KiB a pipe holds, each write waits for its worker to import DALI and lerobot-dali and read it. A 15,000-episode
    dataset's source pickles to 0.8 MB: each of 4 starts held the training process 0.6-2.1 s. Its file's name is
    sent instead, the file removed once the workers have read it."""
    from lerobot_dali.iterator import DALILeRobotIterator

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", size=(64, 64))
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=2, shuffle=False)
    try:
        batch = next(iter(it))
    finally:
        it.close()
    assert len(batch["index"]) == 2
    # (DALI's WorkerArgs: each worker's sources, as they are sent)
    sent = [desc.source for args in process_starts for desc in getattr(args[0], "source_descs", {}).values()]
    assert len(sent) == 2 and len(set(sent)) == 1, sent  # (pickled once, DALI's own pickler's bytes till now)
    assert os.path.basename(sent[0]).startswith(PREFIX.encode()) and not os.path.exists(sent[0])  # (gone: read)


def test_a_temporary_directory_that_takes_no_file_sends_the_source_itself(
    tmp_path: Path, monkeypatch, caplog, make_ds
) -> None:
    """A full temporary directory (or one that is not a writable folder) failed every build with workers, with the
    OSError of the source's write (ENOSPC with 4 KB left), where the pickle sent down each start had needed none."""
    from lerobot_dali.iterator import DALILeRobotIterator

    unusable = tmp_path / "not-a-folder"
    unusable.write_bytes(b"")
    monkeypatch.setattr(tempfile, "tempdir", str(unusable))
    files = SourceFile()
    sent = files.dumps({"episodes": np.arange(5)})
    files.remove()
    np.testing.assert_array_equal(SourceFile.loads(sent)["episodes"], np.arange(5))
    assert "cannot write the worker processes' source" in caplog.text and "$TMPDIR" in caplog.text

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", size=(64, 64))
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=2, shuffle=False)
    try:
        assert next(iter(it))["index"].tolist() == [0, 1]
    finally:
        it.close()


def test_no_usable_temporary_directory_sends_the_source_itself(monkeypatch, caplog) -> None:
    """tempfile.gettempdir() raises FileNotFoundError where no candidate folder takes a file. Said once a process,
    whatever each build's error says (here each names its call)."""
    calls = []

    def nowhere() -> str:
        calls.append(None)
        raise FileNotFoundError(f"No usable temporary directory found in ['/tmp'] (call {len(calls)})")

    monkeypatch.setattr(tempfile, "gettempdir", nowhere)
    assert SourceFile.loads(SourceFile().dumps([1, 2])) == [1, 2]
    # (sent itself, a source is pickled as its SourceFile's dump does: DALI's takes a lambda)
    assert SourceFile.loads(SourceFile(dali_dump).dumps({"pick": lambda row: row % 2}))["pick"](3) == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(calls) == 2 and len(said) == 1 and "(call 1)" in said[0]
