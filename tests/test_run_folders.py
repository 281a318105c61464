"""Run folders (``.<name>.<kind>-<host>-<pid>-<random>``) are removed by a later run on the same host once their
PID is dead; containers that share the host's name but number their processes their own way must not read each
other's live runs as dead."""

from __future__ import annotations

import errno
import functools
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_dali import new_folder

CONTAINER_A, CONTAINER_B = 4026532481, 4026532999


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _dead_runs_folder(out: Path) -> Path:
    """A run folder of ``out`` as a killed run on this host leaves it (its PID now no process's)."""
    name = new_folder.run_folder(out, "tmp").name
    return out.parent / name.replace(f"-{new_folder.os.getpid()}-", f"-{_dead_pid()}-")


def test_containers_sharing_the_host_name_leave_each_others_run_folders(tmp_path, monkeypatch) -> None:
    """With host networking (docker --network host, Kubernetes' hostNetwork) containers share the host's name; a
    shared volume's staging folder of a live run in one container was removed by a run in another, where its PID
    belongs to no process."""
    out = tmp_path / "out"
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_A, raising=False)
    left = _dead_runs_folder(out)  # (as seen from B: no process)
    left.mkdir()
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_B, raising=False)
    new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert left.exists()
    monkeypatch.setattr(
        new_folder, "_pid_namespace", lambda: CONTAINER_A, raising=False
    )  # its own container's next run
    new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert not left.exists()


def test_outside_a_container_the_host_name_is_the_hosts(monkeypatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node 7")
    for namespace in (None, 4026531836):  # (no /proc; the initial PID namespace)
        monkeypatch.setattr(new_folder, "_pid_namespace", lambda namespace=namespace: namespace)
        assert new_folder.host_name() == "node_7"
    monkeypatch.setattr(new_folder, "_pid_namespace", lambda: CONTAINER_A)
    assert new_folder.host_name() == f"node_7.pidns{CONTAINER_A}"


def test_a_second_run_into_a_folder_written_in_place_is_refused(tmp_path, monkeypatch) -> None:
    """Two runs writing one empty folder in place (the working directory; a mount point) mixed their files (5 of 5
    racing runs), and one that failed emptied the folder, the other's whole dataset too (4 of 5). The second is
    refused now, and the first writes its dataset whole."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)

    def second(folder: Path) -> None:
        (folder / "theirs.parquet").write_text("B")
        raise RuntimeError("the second run failed")

    def first(folder: Path) -> None:
        with pytest.raises(FileExistsError, match="another make_dataset run is writing"):
            new_folder.write_new_folder(out, second, writer="make_dataset")  # (past its check: nothing written yet)
        (folder / "data.parquet").write_text("A")
        (folder / "info.json").write_text("A")

    assert new_folder.write_new_folder(out, first, writer="make_dataset") == out
    assert sorted(p.name for p in out.iterdir()) == ["data.parquet", "info.json"]
    with pytest.raises(FileExistsError, match="not an empty directory"):
        new_folder.write_new_folder(out, second, writer="make_dataset")


def test_a_killed_runs_half_dataset_is_named_as_such_when_refused(tmp_path) -> None:
    """An existing empty folder is written in place, meta/info.json last: a run killed there (SIGKILL, the OOM killer)
    leaves data/ and videos/ without it, which every re-run refused as 'not an empty directory' without saying why."""
    half = tmp_path / "half"
    (half / "data" / "chunk-000").mkdir(parents=True)
    (half / "videos").mkdir()
    with pytest.raises(FileExistsError, match=r"no meta/info.json, which is written last: .* killed .* delete its"):
        new_folder.refuse_taken(half, writer="make_dataset")
    for part in ("images", "meta"):  # (the first folders a run writes, of an image-only dataset)
        (tmp_path / part / part).mkdir(parents=True)
        with pytest.raises(FileExistsError, match=r"no meta/info.json, which is written last"):
            new_folder.refuse_taken(tmp_path / part, writer="make_dataset")
    whole = tmp_path / "whole"
    (whole / "meta").mkdir(parents=True)
    (whole / "meta" / "info.json").write_text("{}")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for taken in (whole, other):
        with pytest.raises(FileExistsError) as refused:
            new_folder.refuse_taken(taken, writer="make_dataset")
        assert "info.json" not in str(refused.value) and "is not an empty directory. Pass a new path" in str(
            refused.value
        )


def test_a_run_still_writing_in_place_is_not_named_a_killed_ones_half_dataset(tmp_path) -> None:
    """A second run started once the first had written data/ (its check before reading: make_dataset's refuse_taken)
    was told the folder held what a killed run leaves, and to delete its contents: the first run's, still writing
    (1 of 1). It is told another run is writing there."""
    out = tmp_path / "out"
    out.mkdir()

    def first(folder: Path) -> None:
        (folder / "data" / "chunk-000").mkdir(parents=True)
        for check in (new_folder.refuse_taken, lambda o, writer: new_folder.write_new_folder(o, first, writer=writer)):
            with pytest.raises(FileExistsError) as refused:
                check(out, writer="make_dataset")
            assert "another make_dataset run is writing one there" in str(refused.value)
            assert "killed" not in str(refused.value)
        (folder / "meta").mkdir()
        (folder / "meta" / "info.json").write_text("{}")

    new_folder.write_new_folder(out, first, writer="make_dataset")
    with pytest.raises(FileExistsError, match="is not an empty directory. Pass a new path"):
        new_folder.refuse_taken(out, writer="make_dataset")


def test_a_folder_filled_by_a_run_that_finished_before_the_lock_is_refused_and_kept(tmp_path, monkeypatch) -> None:
    """Between the check and the lock another run may write the folder and finish: checked again under the lock, the
    folder is taken (the run writes nothing there, so a failure empties none of the other's files), and said so, not
    "another run is writing one there" (this run's own lock, read as another's)."""
    out = tmp_path / "out"
    out.mkdir()
    alone = new_folder._writing_alone

    def finished_meanwhile(folder: Path, *, writer: str):
        (folder / "info.json").write_text("theirs")
        return alone(folder, writer=writer)

    def fail(folder: Path) -> None:
        raise RuntimeError("this run failed")

    monkeypatch.setattr(new_folder, "_writing_alone", finished_meanwhile)
    with pytest.raises(FileExistsError, match="not an empty directory"):
        new_folder.write_new_folder(out, fail, writer="make_dataset")
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [("info.json", "theirs")]


def test_a_failed_run_in_place_unlinks_a_folder_link_it_made_leaving_the_folder_it_points_to(tmp_path) -> None:
    """Emptied entry by entry, a link to a folder is a link (rmtree refuses one, which hid the run's own error)."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("kept")

    def fail(folder: Path) -> None:
        (folder / "videos").symlink_to(elsewhere)
        (folder / "data").mkdir()
        (folder / "data" / "file.parquet").write_text("half")
        raise RuntimeError("this run failed")

    with pytest.raises(RuntimeError, match="this run failed"):
        new_folder.write_new_folder(out, fail, writer="make_dataset")
    assert list(out.iterdir()) == [] and (elsewhere / "keep.txt").read_text() == "kept"


def test_a_folder_on_a_filesystem_without_locks_is_written_in_place_without_one(tmp_path, monkeypatch) -> None:
    """NFS without its lock daemon answers flock with ENOLCK: no lock, but the dataset is written."""
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert new_folder.write_new_folder(out, lambda f: (f / "info.json").write_text("A"), writer="make_dataset") == out
    assert (out / "info.json").read_text() == "A"


def test_a_link_to_a_mount_point_is_refused_as_the_mount_point(tmp_path, monkeypatch) -> None:
    """The folder written beside the link's target cannot be renamed onto a mount point either (EXDEV, once all the
    work was done); a link is no mount point itself (os.path.ismount of the link says False)."""
    volume, link = tmp_path / "volume", tmp_path / "out"
    volume.mkdir()
    link.symlink_to(volume)
    monkeypatch.setattr(new_folder.os.path, "ismount", lambda path: Path(path) == volume)
    with pytest.raises(ValueError, match=r"out: it is a mount point"):
        new_folder.refuse_resumable_taken(link, writer="reencode")


def test_only_folders_named_as_run_folders_are_removed(tmp_path) -> None:
    """A user's folder that merely starts like a dead run's (a copy, a backup) is no run folder: it stays."""
    out = tmp_path / "out"
    dead = _dead_runs_folder(out)
    backup, shorter = Path(f"{dead}-backup"), Path(str(dead)[:-1])
    for folder in (dead, backup, shorter):
        folder.mkdir()
    new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert sorted(tmp_path.iterdir()) == sorted([backup, shorter])


def test_a_dead_runs_folder_that_cannot_be_removed_is_not_said_removed(tmp_path, monkeypatch, caplog) -> None:
    """rmtree(ignore_errors=True) says nothing of what it could not delete (another user's files): the log said the
    folder was removed while it stayed."""
    out = tmp_path / "out"
    dead = _dead_runs_folder(out)
    dead.mkdir()
    with caplog.at_level("INFO", logger="lerobot_dali.new_folder"):
        monkeypatch.setattr(new_folder.shutil, "rmtree", lambda path, ignore_errors: None)
        new_folder.remove_dead_run_folders(out, "tmp", writer="test")
        assert dead.exists() and "removed" not in caplog.text
        monkeypatch.undo()
        new_folder.remove_dead_run_folders(out, "tmp", writer="test")
    assert not dead.exists() and f"removed {dead}, left by a test run on this host" in caplog.text


def test_an_out_that_is_a_file_or_a_broken_link_is_refused_before_any_work(tmp_path) -> None:
    """Found only at the rename, once all the work was done (ENOTDIR), these are said first, each as what it is."""
    file, link = tmp_path / "file", tmp_path / "link"
    file.write_text("mine")
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(FileExistsError, match=r"file: it exists and is not an empty directory\. Pass a new path"):
        new_folder.refuse_taken(file, writer="make_dataset")
    with pytest.raises(NotADirectoryError, match=r"link: it is a symbolic link to '.*missing', which does not exist"):
        new_folder.refuse_taken(link, writer="make_dataset")
    assert file.read_text() == "mine" and link.is_symlink()


@pytest.mark.parametrize(
    ("answer", "alive"),
    [
        (None, True),
        (PermissionError, True),
        (ProcessLookupError, False),
        (OverflowError, False),  # (a PID past the C int: a folder's name may hold any number)
        (functools.partial(OSError, errno.EINVAL, "Invalid argument"), False),
    ],
)
def test_a_pid_is_alive_where_a_process_has_it_another_users_too(monkeypatch, answer, alive) -> None:
    """kill(pid, 0) tells: EPERM is another user's live process, whose run folder must stay."""

    def kill(pid: int, signal: int) -> None:
        if answer is not None:
            raise answer()

    monkeypatch.setattr(new_folder.os, "kill", kill)
    assert new_folder.pid_alive(1234) is alive


def test_the_dataset_holding_a_path_is_the_nearest_folder_with_meta_info_json_at_or_above_it(tmp_path) -> None:
    """A run's output given as a dataset's own folder is inside it too (its checkpoints would be uploaded with it)."""
    dataset = tmp_path / "dataset"
    (dataset / "meta").mkdir(parents=True)
    (dataset / "meta" / "info.json").write_text("{}")
    (tmp_path / "link").symlink_to(dataset / "meta")
    for path, holder in [(dataset, dataset), (dataset / "out" / "new", dataset), (tmp_path / "link", dataset)]:
        assert new_folder.dataset_holding(path) == holder
    assert new_folder.dataset_holding(tmp_path / "elsewhere") is None
    with pytest.raises(ValueError, match=r"--output_dir .*dataset is inside the dataset .*dataset: give a folder"):
        new_folder.refuse_inside_datasets("--output_dir", dataset)
    given = tmp_path / "given"  # (a dataset the run reads is named as the run was given it)
    given.symlink_to(dataset)
    with pytest.raises(ValueError, match=f"^--output_dir {dataset}/out is inside the dataset {given}: give a folder"):
        new_folder.refuse_inside_datasets("--output_dir", dataset / "out", ["hf://user/set", str(given)])


def test_a_folder_writable_but_not_searchable_is_refused_as_unwritable(tmp_path, monkeypatch) -> None:
    """Files are made in a folder only with its search (x) permission too: mode 0o200 is no folder to write in."""
    monkeypatch.setattr(new_folder.os, "access", lambda path, mode: mode == new_folder.os.W_OK)
    with pytest.raises(ValueError, match=f"--out {tmp_path}/out: {tmp_path} is not writable; give a folder"):
        new_folder.refuse_unwritable("--out", tmp_path / "out")


def test_a_rename_that_fails_for_another_reason_than_a_taken_out_raises_that_failure(tmp_path, monkeypatch) -> None:
    """Only an out that exists after the failed rename was written meanwhile by another run; a rename failing
    otherwise (another filesystem, EXDEV) is said as itself, and the staging folder goes."""

    def across_filesystems(self: Path, target: str) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "rename", across_filesystems)
    with pytest.raises(OSError, match="cross-device") as raised:
        new_folder.write_new_folder(tmp_path / "out", lambda f: (f / "info.json").write_text("A"), writer="test")
    assert not isinstance(raised.value, FileExistsError) and list(tmp_path.iterdir()) == []
