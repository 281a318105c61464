"""One training run at a time in a ``--checkpoint-dir``.

Two runs saving into one folder replace each other's checkpoints step by step and ``latest`` with them, unsaid (a
second job launched on the first one's folder, a relaunch while the first is still draining): a resume then continues
whichever saved last, and a rename of one run's save could fail on the other's. The global main process holds an
exclusive ``flock`` on ``CKPT/.run.lock`` from before the resume until the run ends; a run that finds it held stops
before training, naming the holder, on every rank. The kernel drops the lock with the process, so a killed run never
leaves it taken. Across nodes, on NFS, Linux takes ``flock`` as a lock of the whole file that the server arbitrates;
a filesystem that takes no locks (NFS without its lock daemon, Lustre mounted without ``-o flock``) runs unlocked, with
a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lerobot_dali.cache_dirs import locks_unsupported, try_flock
from pipelines.run_errors import RunRefused

__all__ = ["LOCK_NAME", "named_holder", "one_run_at_a_time"]

logger = logging.getLogger("pipelines.train")

#: The file in ``--checkpoint-dir`` a run holds locked; it names the run (process, host, start).
LOCK_NAME = ".run.lock"
#: Attempts at the lock where its file went away between the open and the lock (a run that made the folder ended,
#: removing it): the next attempt makes it again.
_ATTEMPTS = 3


@contextlib.contextmanager
def one_run_at_a_time(
    root: Path | None,
    *,
    rank: int,
    world_size: int,
    device: Any = None,
    still_usable: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Hold ``root``'s lock for the block (on ``rank`` 0; a collective of every rank where ``world_size`` > 1,
    ``device`` the process group's); :class:`RunRefused` on every rank where another run holds it, or where
    ``still_usable()`` raises a ValueError or OSError once the lock is held: the checks of the folder made before it
    (:func:`~pipelines.checkpoints.check_checkpoint_dir`: no checkpoint there without ``--resume``) made again, since a
    run that ended between them and the lock may have saved one. The lock file goes at the end, and the folders this
    made with it where nothing was saved in them (a run refused before its first save leaves none).
    ``root`` None: nothing to hold."""
    if root is None:
        yield
        return
    held: Any = None
    made: list[Path] = []
    try:
        refusal = ""
        failure: Exception | None = None  # (rank 0's, raised there once the other ranks know)
        if rank == 0:
            try:
                made = _missing_folders(root)
                held, refusal = _take(root)
            except OSError as e:
                refusal = _not_taken(root, e)
            except Exception as e:  # (said to the other ranks too, which would otherwise wait in the broadcast)
                refusal, failure = f"rank 0 failed taking --checkpoint-dir {root}'s lock ({type(e).__name__}: {e})", e
            if not refusal and failure is None and still_usable is not None:
                try:
                    still_usable()
                except (ValueError, OSError) as e:
                    refusal = str(e)
                except Exception as e:
                    refusal, failure = f"rank 0 failed checking --checkpoint-dir {root} ({type(e).__name__}: {e})", e
        refusal = _from_rank_0(refusal, world_size, device)
        if failure is not None:
            raise failure
        if refusal:
            raise RunRefused(refusal)
        yield
    finally:
        if held is not None:
            _release(held, root / LOCK_NAME)
        for folder in made:  # (deepest first; one holding a checkpoint stays: rmdir refuses it)
            try:
                folder.rmdir()
            except OSError:
                break


def _take(root: Path) -> tuple[Any, str]:
    """``root``'s lock held (naming this run in it) and no refusal, or None and the refusal naming its holder."""
    path = root / LOCK_NAME
    for _ in range(_ATTEMPTS):
        try:
            root.mkdir(parents=True, exist_ok=True)
            held = try_flock(path)
        except FileNotFoundError:  # (a folder above removed meanwhile, by a run ending that had made it)
            continue
        except OSError as e:
            if not locks_unsupported(e):
                raise
            logger.warning(
                "--checkpoint-dir %s: its filesystem takes no locks (%s), so a second run started on this folder while "
                "this one runs is not refused (the two would replace each other's checkpoints)", root, e.strerror,
            )  # fmt: skip
            return None, ""
        if held is not None:
            started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            with contextlib.suppress(OSError):  # (a full disk: the lock holds all the same, its holder unnamed)
                held.seek(0)
                held.truncate()
                held.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
                held.flush()
            return held, ""
        holder = named_holder(root)
        if holder is not None:
            return None, (
                f"--checkpoint-dir {root} is in use by another run ({holder or 'its holder unnamed'}): wait for it to "
                "end, or give another --checkpoint-dir (two runs saving there replace each other's checkpoints)"
            )
    return None, f"--checkpoint-dir {root}: its lock file {path} keeps being replaced; is another run starting there?"


def _not_taken(root: Path, e: OSError) -> str:
    """The refusal of a run whose lock on ``root`` could not be taken (a folder it may not write, a lock file made a
    folder)."""
    said = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(root / LOCK_NAME) else ""
    return f"--checkpoint-dir {root}: its lock file {root / LOCK_NAME} cannot be taken: {said}{where}"


def named_holder(root: Path) -> str | None:
    """What the run holding ``root``'s lock wrote in its file (or one killed there: a run that ends removes it);
    None where there is no such file."""
    try:
        return (root / LOCK_NAME).read_text(errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _missing_folders(root: Path) -> list[Path]:
    """``root`` and the folders above it that do not exist, deepest first: what making it makes."""
    missing = []
    for folder in (root, *root.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def _release(held: Any, path: Path) -> None:
    """The lock ``held`` on ``path`` let go, its file removed first (while still held, and only where it is still the
    one locked): a run that opened it meanwhile finds it gone once it has the lock, and takes the lock again on a new
    one (:func:`_take`)."""
    with contextlib.suppress(OSError):
        opened, now = os.fstat(held.fileno()), path.stat()
        if (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino):
            path.unlink()
    with contextlib.suppress(OSError):  # (a holder line a full disk kept from being written fails its flush again)
        held.close()


def _from_rank_0(refusal: str, world_size: int, device: Any) -> str:
    """Rank 0's ``refusal``, on every rank (a collective where there are several)."""
    import torch.distributed as dist

    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return refusal
    box = [refusal]
    dist.broadcast_object_list(box, src=0, device=device)
    return str(box[0])
