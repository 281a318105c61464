"""Write a dataset folder so that it appears whole or not at all: a half-written dataset that looks complete
would train on missing episodes, and one left behind by a crash would block the re-run."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

__all__ = [
    "dataset_holding",
    "host_name",
    "is_inside",
    "partial_folder",
    "pid_alive",
    "refuse_inside_a_dataset",
    "refuse_inside_datasets",
    "refuse_resumable_taken",
    "refuse_taken",
    "refuse_unwritable",
    "remove_dead_run_folders",
    "run_folder",
    "write_new_folder",
    "write_resumable_folder",
]

logger = logging.getLogger(__name__)


def write_new_folder(out: str | os.PathLike[str], write: Callable[[Path], None], *, writer: str) -> Path:
    """Run ``write(folder)`` so that ``out`` holds a dataset only once every file of it is written.

    A new ``out`` is written as a hidden sibling (``.<name>.tmp-<host>-<pid>-<random>``, :func:`run_folder`) renamed
    to ``out`` at the end; an existing empty folder (a mount point, say) is written in place and emptied again if
    writing fails. Either way an interrupted or failed run (Ctrl-C, a full disk) leaves nothing that blocks a
    re-run; the sibling of a run killed outright (SIGKILL, the OOM killer) is deleted by the next run on its host
    (:func:`remove_dead_run_folders`). Missing parent folders are created.
    """
    root = refuse_taken(out, writer=writer)
    if root.is_dir():
        with _writing_alone(root, writer=writer):
            refuse_taken(root, writer=writer, locked_here=True)  # (again: a run that held it may have finished)
            try:
                write(root)
            except BaseException:
                for entry in list(root.iterdir()):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                raise
        return root
    absolute = _with_parent(root)
    remove_dead_run_folders(absolute, "tmp", writer=writer)
    staging = run_folder(absolute, "tmp")
    staging.mkdir()  # (not mkdtemp: its 0700 would become the dataset's mode)
    try:
        write(staging)
        _rename(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root


@contextlib.contextmanager
def _writing_alone(folder: Path, *, writer: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` while a run writes in it, else FileExistsError: two runs writing one
    existing empty folder in place mixed their files (5 of 5 racing runs), and one that failed emptied it, the other's
    whole dataset too (4 of 5). A filesystem that takes no locks (NFS without its lock daemon) is written without."""
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise FileExistsError(_WRITING_THERE.format(folder=folder, writer=writer)) from e
        except OSError as e:
            logger.debug("%s takes no lock (%s): written without one", folder, e)
        yield
    finally:
        os.close(handle)


#: What a run is told where another writes its dataset in place (:func:`_writing_alone`).
_WRITING_THERE = (
    "Refusing to write a dataset into {folder}: another {writer} run is writing one there. Wait for it, or pass "
    "another path."
)


def _being_written(folder: Path) -> bool:
    """Whether a run holds ``folder``'s :func:`_writing_alone` lock (False where it cannot be told)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (released as it is closed)
    except BlockingIOError:
        return True
    except OSError:  # (a filesystem that takes no locks)
        return False
    finally:
        os.close(handle)
    return False


def partial_folder(out: str | os.PathLike[str]) -> Path:
    """Where :func:`write_resumable_folder` writes ``out`` until it is whole: ``.<name>.partial`` beside it."""
    absolute = Path(os.path.abspath(out))
    return absolute.parent / f".{absolute.name}.partial"


def write_resumable_folder(
    out: str | os.PathLike[str], write: Callable[[Path], None], *, writer: str, bookkeeping: Collection[str] = ()
) -> Path:
    """Run ``write(folder)`` in :func:`partial_folder` and rename it to ``out`` once it returns, in one step (an
    existing empty ``out`` is replaced whole: moved entry by entry, an interruption split the work between the two
    folders, and the next call refused the half-filled ``out``). When ``write`` raises, the folder is kept, and the
    next call hands it to ``write`` again with what it holds: long work resumes instead of starting over.
    ``write`` must tell its finished files from unfinished ones, and a folder left by other work from one it can
    resume: by the ``bookkeeping`` files it keeps there (its plan, its lock), which stay until the folder is ``out``
    (an interruption just before the rename left a finished folder the next call could not tell from other work),
    then are deleted. ``out`` must not be a mount point (:func:`refuse_resumable_taken`); a symbolic link to an empty
    folder is written as that folder (:func:`_linked_folder`)."""
    root = refuse_resumable_taken(out, writer=writer)
    target = _linked_folder(root)
    staging = partial_folder(_with_parent(target))
    staging.mkdir(exist_ok=True)
    write(staging)
    _rename(staging, target)  # (rename(2) replaces an empty folder)
    for name in bookkeeping:
        (target / name).unlink(missing_ok=True)
    return root


def _linked_folder(root: Path) -> Path:
    """The folder a symbolic link ``root`` leads to (an empty one: rename(2) replaces it), else ``root``: a folder
    renamed onto the link failed with ENOTDIR once all the work was done, said as "it appeared while this one was
    written", and so did every re-run."""
    return Path(os.path.realpath(root)) if root.is_symlink() and root.is_dir() else root


def refuse_resumable_taken(out: str | os.PathLike[str], *, writer: str) -> Path:
    """:func:`refuse_taken`, and ValueError for an ``out`` that is a mount point (a docker volume, say), which the
    folder written beside it cannot be renamed onto (it failed with EXDEV once all the work was done)."""
    root = refuse_taken(out, writer=writer)
    if root.is_dir() and os.path.ismount(_linked_folder(root)):
        raise ValueError(
            f"Cannot write a dataset into {root}: it is a mount point, and {writer} writes the dataset beside it "
            f"first, then renames it into place, which cannot cross filesystems. Pass a new folder inside it "
            f"({root / 'NAME'})."
        )
    return root


def run_folder(out: Path, kind: str) -> Path:
    """A hidden sibling of ``out`` that is this run's alone, ``.<name>.<kind>-<host>-<pid>-<random>`` (not made
    here): the host and PID tell :func:`remove_dead_run_folders` whether the run that made it still runs."""
    return out.parent / f".{out.name}.{kind}-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_dead_run_folders(out: Path, kind: str, *, writer: str) -> None:
    """Delete the :func:`run_folder` siblings of ``out`` for ``kind`` that runs on this host left when killed (a PID
    no process has), logging each. Another host's are never touched (on a shared filesystem its PIDs say nothing
    here), nor a live run's."""
    prefix = f".{out.name}.{kind}-{host_name()}-"
    for left in out.parent.glob(glob.escape(prefix) + "*"):
        owner = re.fullmatch(r"(\d+)-[0-9a-f]{8}", left.name[len(prefix) :])
        if owner is None or pid_alive(int(owner.group(1))):
            continue
        shutil.rmtree(left, ignore_errors=True)
        if not left.exists():
            logger.info("removed %s, left by a %s run on this host (PID %s) that was killed", left, writer,
                        owner.group(1))  # fmt: skip


#: The inode of Linux's initial PID namespace (``PROC_PID_INIT_INO``): processes outside any container.
_INITIAL_PID_NAMESPACE = 4026531836


def host_name() -> str:
    """This host's name as a file name may hold it: folders named by host and PID tell this host's runs apart.

    Inside a PID namespace of its own (a container) the namespace is part of it: containers that share the host's
    name (host networking: docker's ``--network host``, Kubernetes' ``hostNetwork``) each number their processes
    their own way, so one container's live run read as a dead PID in another, which removed its folders (a shared
    volume's staging folders)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    namespace = _pid_namespace()
    return name if namespace in (None, _INITIAL_PID_NAMESPACE) else f"{name}.pidns{namespace}"


def _pid_namespace() -> int | None:
    """The inode of this process's PID namespace, None where it cannot be read (no /proc)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026532481]"
    except OSError:
        return None
    found = re.fullmatch(r"pid:\[(\d+)\]", link)
    return int(found.group(1)) if found else None


def pid_alive(pid: int) -> bool:
    """Whether a process of this PID namespace has ``pid`` (another user's too); False for none a system can have."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    except (OverflowError, OSError):  # (no PID this system can have)
        return False
    return True


def refuse_taken(out: str | os.PathLike[str], *, writer: str, locked_here: bool = False) -> Path:
    """``out`` as a Path; FileExistsError where it exists and is not an empty folder (checked again on writing:
    a caller that reads a source first calls this before, so a taken ``out`` costs no reading). ``locked_here``: this
    process holds ``out``'s write lock (:func:`_writing_alone`), so the lock is no sign of another run writing there."""
    root = Path(out)
    if root.is_symlink() and not root.exists():  # (found once all the work was done, at the rename: ENOTDIR)
        raise NotADirectoryError(
            f"Cannot write a dataset to {root}: it is a symbolic link to {os.readlink(root)!r}, which does not exist "
            "(or loops). Remove the link, or pass another path."
        )
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        if root.is_dir() and not locked_here and _being_written(root):  # (a run writing it now: no half dataset)
            raise FileExistsError(_WRITING_THERE.format(folder=root, writer=writer))
        half = (
            root.is_dir()
            and not (root / "meta" / "info.json").exists()
            and any((root / part).exists() for part in ("data", "videos", "images", "meta"))
        )  # (an existing empty folder is written in place, meta/info.json last: a run killed there leaves this)
        raise FileExistsError(
            f"Refusing to write a dataset into {root}: it exists and is not an empty directory"
            + (
                " (it holds a dataset's folders but no meta/info.json, which is written last: what a run killed "
                "while writing into this folder leaves; if so, delete its contents and run again)"
                if half
                else ""
            )
            + f". Pass a new path ({writer} never overwrites)."
        )
    return root


def is_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``folder`` or inside it, symbolic links followed (a link to ``folder``, or into it, is):
    an output written there would land in ``folder`` (a dataset read from it)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def dataset_holding(path: str | os.PathLike[str]) -> Path | None:
    """The local LeRobot dataset ``path`` is or is inside (the nearest folder at or above it, symbolic links followed,
    that holds ``meta/info.json``), None where there is none: an output written there is copied and uploaded with it."""
    absolute = Path(os.path.realpath(path))
    return next((folder for folder in (absolute, *absolute.parents) if (folder / "meta" / "info.json").is_file()), None)


def refuse_inside_a_dataset(out: str | os.PathLike[str], *, writer: str) -> None:
    """ValueError where ``out`` is inside a local LeRobot dataset (:func:`dataset_holding`): a dataset written there
    would be copied and uploaded with that one, and its files read as that one's where they match its templates."""
    holder = dataset_holding(out)
    if holder is not None:
        raise ValueError(
            f"Refusing to write a dataset into {out}: it is inside the dataset {holder}. Pass a path outside it "
            f"({writer} writes a dataset of its own)."
        )


def refuse_inside_datasets(flag: str, folder: str | os.PathLike[str], datasets: Sequence[str] = ()) -> None:
    """ValueError where ``folder`` (a run's output: ``flag``'s) is a local dataset of ``datasets`` or inside one, or
    inside any other local dataset (:func:`dataset_holding`): checkpoints, records or results written there are copied
    and uploaded with the dataset (``pipelines/train.py``'s, ``lerobot_policy.py``'s and the bench's outputs;
    ``reencode`` and ``make-dataset`` refuse their copy there alike, :func:`refuse_inside_a_dataset`)."""
    named = next((d for d in datasets if "://" not in d and Path(d).is_dir() and is_inside(folder, d)), None)
    inside = named if named is not None else dataset_holding(folder)
    if inside is not None:
        raise ValueError(f"{flag} {folder} is inside the dataset {inside}: give a folder outside the dataset")


def refuse_unwritable(flag: str, folder: str | os.PathLike[str]) -> None:
    """ValueError unless ``folder`` is a folder this user can write, or one it can make: a file at or above it, or an
    unwritable folder above it, said before long work (a run's results, checkpoints) that would fail only once it
    writes. Nothing is made here: a run that fails before writing leaves no empty folder behind."""
    absolute = Path(os.path.abspath(folder))
    existing = next(p for p in (absolute, *absolute.parents) if p.exists() or p.is_symlink())
    if not existing.exists():  # (a broken link: the making of the folder raised FileExistsError, a traceback)
        raise ValueError(
            f"{flag} {absolute}: {existing} is a symbolic link to {os.readlink(existing)!r}, which does not exist (or "
            "loops); remove the link, or give another folder"
        )
    if not existing.is_dir():
        raise ValueError(f"{flag} {absolute}: {existing} is a file, not a folder; give a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {absolute}: {existing} is not writable; give a folder this user may write")


def _with_parent(root: Path) -> Path:
    """``root`` made absolute, its missing parent folders created."""
    absolute = Path(os.path.abspath(root))
    try:
        absolute.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        blocker = next(parent for parent in absolute.parents if parent.exists())
        raise NotADirectoryError(
            f"Cannot write a dataset to {root}: {blocker} is a file, not a directory: write it elsewhere, or move "
            f"{blocker} aside."
        ) from e
    return absolute


def _rename(staging: Path, root: Path) -> None:
    try:
        staging.rename(os.path.abspath(root))
    except OSError as e:
        if not root.exists():
            raise
        raise FileExistsError(  # another run wrote it meanwhile
            f"Refusing to write a dataset into {root}: it appeared while this one was written (another run?)"
        ) from e
