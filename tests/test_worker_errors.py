"""Errors raised in DALI worker processes reach the loop as the original type with the original message."""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

import lerobot_dali.iterator as iterator_module
from lerobot_dali import errors
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.worker_errors import carry_to_trainer, original_worker_error
from tests.process_tree import assert_workers_end_with, cmdline, kill_all, spawned_workers

MULTILINE = "x.mp4 (episode 2): cannot decode\nhint: re-encode it: ffmpeg -i x.mp4 y.mp4"


def _as_dali_raises(error: Exception) -> Exception:
    """The chain DALI 2.4 builds in the training process (``nvidia/dali/_multiproc``): the worker sends
    ``RuntimeError(str(error))`` and its formatted traceback; the pool raises ``Exception(text) from`` that."""
    try:
        raise error
    except Exception:
        text = traceback.format_exc()
    try:
        raise Exception("\n\nException traceback received from worker thread:\n\n" + text) from RuntimeError(str(error))
    except Exception as raised:
        return raised


def _carried_back(error: Exception) -> Exception:
    """``error`` raised twice in a worker (its status line written once), as the training process rebuilds it."""
    carry_to_trainer(error)
    carry_to_trainer(error)
    rebuilt = original_worker_error(_as_dali_raises(error))
    assert type(rebuilt) is type(error)
    return rebuilt


@pytest.mark.parametrize(
    "error",
    [
        errors.VideoDecodeError("videos/cam/file-001.mp4: decoding failed (episode 3, camera cam)"),
        errors.FrameTimestampError("ds, episode 0: query 1.0 s: no frame within tolerance_s=0.0001 (x: y)"),
        ValueError(MULTILINE),
        KeyError("observation.state"),
        FileNotFoundError("videos/x.mp4"),
        RuntimeError(""),
    ],
    ids=["ours", "ours-colons", "multiline", "keyerror", "builtin-subclass", "empty"],
)
def test_rebuilt_with_type_and_exact_message(error: Exception) -> None:
    rebuilt = original_worker_error(_as_dali_raises(error))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)


@pytest.mark.parametrize("status", [403, None])
def test_a_remote_file_error_keeps_its_status(status: int | None) -> None:
    """The text DALI hands over has no ``status``: a worker's RemoteFileError for a 403 was rebuilt with None."""
    said = "http://h/ds/videos/x.mp4: read was refused (not retried): log in\n(the server answered 403: Forbidden)"
    rebuilt = _carried_back(errors.RemoteFileError(said, status))
    assert (str(rebuilt), rebuilt.status, rebuilt.args) == (said, status, (said, status))


@pytest.mark.parametrize("status", [403, None])
def test_a_remote_file_error_whose_message_ends_like_a_status_line_keeps_it(status: int | None) -> None:
    """The status rides on the message's last line: a worker's RemoteFileError whose own last line read as one was
    rebuilt without that line, the number on it as its status (403 -> 404, the line not written; None -> 404)."""
    said = "http://h/ds/videos/x.mp4: read failed\n(lerobot_dali: RemoteFileError.status 404)"
    rebuilt = _carried_back(errors.RemoteFileError(said, status))
    assert (str(rebuilt), rebuilt.status, rebuilt.args) == (said, status, (said, status))


@pytest.mark.parametrize("status", [404, 410, None])
def test_a_missing_data_file_error_keeps_its_status(status: int | None) -> None:
    """MissingDataFileError has a ``status`` (the server's 404/410) since dce0a3e, which the text DALI hands over did
    not carry: a worker's was rebuilt with None. Its class's name rides on the status line, so neither error's line is
    taken for the other's."""
    said = "https://h/ds/data/chunk-000/file-000.parquet: the server has no such file (HTTP 404): check the revision"
    rebuilt = _carried_back(errors.MissingDataFileError(said, status))
    assert (str(rebuilt), rebuilt.status, rebuilt.args) == (said, status, (said,))
    other = f"{said}\n(lerobot_dali: RemoteFileError.status 503)"  # (another class's line: its own text, whole)
    rebuilt = original_worker_error(_as_dali_raises(errors.MissingDataFileError(other)))
    assert type(rebuilt) is errors.MissingDataFileError and (str(rebuilt), rebuilt.status) == (other, None)


def test_a_missing_data_file_error_pickles_with_its_camera_and_status() -> None:
    """The camera with no files (``check`` lists it and checks the others) goes along with the status."""
    import pickle

    error = errors.MissingDataFileError("videos/egoview/episode_000000.mp4 is missing", 404, camera="egoview")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.status, copy.camera) == (type(error), str(error), 404, "egoview")
    assert pickle.loads(pickle.dumps(errors.MissingDataFileError("x"))).camera is None


def test_unknown_types_are_not_rebuilt() -> None:
    class ThirdPartyError(Exception):
        pass

    assert original_worker_error(_as_dali_raises(ThirdPartyError("boom: x"))) is None
    assert original_worker_error(RuntimeError("no worker traceback here")) is None


def _small_dataset(make_ds) -> Path:
    """The workers' tests' dataset: 2 AV1 episodes of 4 frames in one file (one batch of 2 fails or dies fast)."""
    return make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="av1", fps=10, episodes_per_file=2, gop=2)


class _FailingSource(BatchSource):
    """Fails every batch with a message of several lines (module level: spawned workers import it)."""

    def assemble(self, *args, **kwargs):
        raise ValueError(MULTILINE)


#: What a Hub or https read answered 410 raises (remote_errors.not_served), its status 410.
GONE = "https://h/ds/data/chunk-000/file-000.parquet: the server has no such file (HTTP 410): check the revision"


class _GoneRowsSource(BatchSource):
    """Reads rows whose parquet file the server answers 410 for (module level: spawned workers import it)."""

    def assemble(self, *args, **kwargs):
        def gone(*args, **kwargs):
            raise errors.MissingDataFileError(GONE, 410)

        self.spec.reader.read_episode = gone
        return super().assemble(*args, **kwargs)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_missing_data_file_error_keeps_its_status_through_the_batch_and_a_worker(
    make_ds, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The batch names whose rows they were in a new error of the same type: it had no status (None for the 410), and
    a worker's was rebuilt from text without one. Both keep it now."""
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _GoneRowsSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=workers, cameras=[])
    with pytest.raises(errors.MissingDataFileError) as info:
        next(iter(it))
    it.close()
    assert type(info.value) is errors.MissingDataFileError
    assert (str(info.value), info.value.status) == (f"episode 0's rows: {GONE}", 410)


def test_a_workers_data_error_is_raised_alone_its_chain_at_debug(make_ds, monkeypatch, caplog) -> None:
    """A worker's error about the batch's data came back chained to DALI's hand-over of it: its message 4 times in a
    94-line traceback (DALI's RuntimeError, the worker's error and the batch's wrapping of it in the worker's
    traceback text, the rebuilt error). The rebuilt error is raised alone, its message once; how it was raised, the
    worker's traceback included, is logged at DEBUG."""
    import logging

    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _GoneRowsSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1, cameras=[])
    with caplog.at_level(logging.DEBUG, "lerobot_dali.iterator"), pytest.raises(errors.MissingDataFileError) as info:
        next(iter(it))
    it.close()
    assert (info.value.__cause__, info.value.__suppress_context__, info.value.status) == (None, True, 410)
    assert "".join(traceback.format_exception(info.value)).count(GONE) == 1
    (how,) = [r for r in caplog.records if r.getMessage() == "rank 0: how MissingDataFileError was raised"]
    assert "Exception traceback received from worker" in "".join(traceback.format_exception(how.exc_info[1]))


class _CountedFailingClips(BatchSource):
    """Fails every batch with a VideoDecodeError naming its file, counting its calls (num_workers=0: in-process)."""

    calls = 0

    def assemble(self, *args, **kwargs):
        type(self).calls += 1
        raise errors.VideoDecodeError("camera 'observation.images.cam0', batch of episodes [0]: x.webm: damaged")


def test_a_data_error_of_the_batch_in_process_is_not_assembled_again(make_ds, monkeypatch) -> None:
    """With num_workers=0 a batch's own VideoDecodeError (it names the file) was taken for DALI's decoder failing:
    each of the batch's samples was assembled again, alone, to find a clip DALI refuses, raising the same error a
    second time from there (85 lines). It is raised as it came (its batch assembled once)."""
    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="vp9", fps=10, episodes_per_file=2, gop=2)
    monkeypatch.setattr(iterator_module, "BatchSource", _CountedFailingClips)
    monkeypatch.setattr(_CountedFailingClips, "calls", 0)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0)
    with pytest.raises(errors.VideoDecodeError, match="x.webm: damaged"):
        next(iter(it))
    it.close()
    assert _CountedFailingClips.calls == 1


def test_multiline_error_from_a_real_worker(make_ds, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _FailingSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    with pytest.raises(ValueError) as info:
        next(iter(it))
    it.close()
    # the worker adds which samples it was reading; the message, several lines and all, comes back exactly
    located = f"{root}: reading samples [0, 2) of epoch 0 (episodes [0]): {MULTILINE}"
    assert type(info.value) is ValueError and str(info.value) == located


def _dali_shared_memory_mib() -> float:
    """MiB of DALI's worker shared memory mapped into this process."""
    total = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "nvidia_dali" in fields[5]:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            total += high - low
    return total / 2**20


def test_a_failed_pass_lets_the_workers_shared_memory_go_while_its_error_is_held(make_ds, monkeypatch) -> None:
    """The error's traceback went through DALI's frames, which held the closed pipeline: its workers' shared
    memory (a few batches: GBs for decoded frames) stayed mapped while the caller held the error, and after that
    until the cycle collector ran."""
    from nvidia.dali._multiproc.pool import WorkerPool  # private: the only handle on the workers' memory

    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _FailingSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    gc.collect()
    gc.disable()  # what is freed must be freed by reference counting, as it is in a loop that catches errors
    try:
        with pytest.raises(ValueError, match="reading samples") as info:
            next(iter(it))
        assert _dali_shared_memory_mib() == 0
        assert not [o for o in gc.get_objects() if type(o) is WorkerPool]
        assert "in receive_batch" in "".join(traceback.format_exception(info.value.__cause__))  # still printable
    finally:
        gc.enable()
        it.close()


def test_a_pipeline_that_fails_to_build_ends_the_workers_it_started(make_ds, monkeypatch) -> None:
    """A pipeline whose build failed after its workers started (DALI failing to set up its graph) was never closed:
    the workers ran on, one set per failed pass, until the cycle collector freed the error's frames (the error
    re-raised by a helper refers to itself through its traceback)."""
    import psutil

    root = _small_dataset(make_ds)
    real_build_pipeline = iterator_module.build_pipeline

    def failing_after_the_workers_start(*args, **kwargs):
        pipe, names = real_build_pipeline(*args, **kwargs)
        start = pipe.build

        def build():
            start()
            raise RuntimeError("Critical error when building pipeline: out of memory")

        pipe.build = build
        return pipe, names

    monkeypatch.setattr(iterator_module, "build_pipeline", failing_after_the_workers_start)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    gc.collect()
    gc.disable()  # what is ended must be ended by the iterator, as in a loop that catches errors between collections
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="out of memory"):
                next(iter(it))
            assert spawned_workers(psutil.Process().children()) == []
    finally:
        gc.enable()
        it.close()


class _SlowSource(BatchSource):
    """Each batch takes 0.4 s in the worker, so a timer lands while the loop waits for one."""

    def assemble(self, *args, **kwargs):
        time.sleep(0.4)
        return super().assemble(*args, **kwargs)


def test_close_in_a_signal_handler_while_the_loop_waits_for_workers(make_ds, monkeypatch) -> None:
    """A SIGTERM handler that closes the iterator (preemption) ran inside DALI's wait for a worker's batch; closing
    the workers there waited on a condition the interrupted wait held, for ever. The close now completes when the
    wait returns, and the loop gets IteratorClosedError."""
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _SlowSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=2, prefetch=1)
    previous = signal.signal(signal.SIGALRM, lambda *_: it.close())
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails the run instead of stalling it
    seen = []
    try:
        with pytest.raises(errors.IteratorClosedError):
            for batch in it:
                seen += batch["index"].tolist()
                if len(seen) == 2:
                    signal.setitimer(signal.ITIMER_REAL, 0.2)  # lands inside the wait for the next batch
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert it._pipeline is None and seen in ([0, 1], [0, 1, 2, 3])
    monkeypatch.undo()
    seen += [i for batch in it for i in batch["index"].tolist()]  # iterating again carries on
    it.close()
    assert seen == list(range(8))


class _KilledSource(BatchSource):
    """The worker dies on its first batch as under the out-of-memory killer: SIGKILL, no word to the pool."""

    def assemble(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)


class _BusErrorSource(BatchSource):
    """The worker dies as it does writing a batch into a full /dev/shm (Docker's 64 MiB): SIGBUS."""

    def assemble(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGBUS)


@pytest.mark.parametrize(("source", "match"), [
    (_KilledSource, r"killed by SIGKILL\).*sample 0 of epoch 0.*out-of-memory"),
    (_BusErrorSource, r"killed by SIGBUS\).*sample 0 of epoch 0.*full /dev/shm.*--ipc=host or --shm-size"),
])  # fmt: skip
def test_a_killed_worker_is_named_with_its_signal(make_ds, monkeypatch: pytest.MonkeyPatch, source, match) -> None:
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", source)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    with pytest.raises(errors.WorkerProcessError, match=match):
        next(iter(it))
    it.close()
    monkeypatch.undo()
    healthy = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    assert [b["index"].tolist() for b in healthy] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    healthy.close()


def _training_script(make_ds, tmp_path: Path, source: str) -> tuple[Path, Path]:
    """:func:`_small_dataset` and ``source`` written as a script reading it (argv[1])."""
    root = _small_dataset(make_ds)
    script = tmp_path / "train.py"
    script.write_text(source)
    return root, script


def test_workers_do_not_run_the_training_script_again(make_ds, tmp_path: Path) -> None:
    """Spawned workers imported the script (``__main__``) again: its top-level imports in every worker, and an
    unguarded script died with DALI's bare 'Workers initialization failed'. Now they skip it; where what they run
    names a class of the script they import it as spawn does, and an unguarded script is told why it failed."""
    runs = tmp_path / "runs.txt"
    root, script = _training_script(
        make_ds,
        tmp_path,
        "import sys\n"
        "open(sys.argv[2], 'a').write('ran\\n')\n"
        "from lerobot_dali import DALILeRobotIterator\n"
        "it = DALILeRobotIterator(sys.argv[1], batch_size=2, device='cpu', num_workers=2)\n"
        "print(sum(len(b['index']) for b in it))\n",
    )
    done = subprocess.run(
        [sys.executable, str(script), str(root), str(runs)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr
    assert runs.read_text() == "ran\n"  # the main process only, not its 2 workers

    needs_main = "import lerobot_dali.worker_start as w\nw.names_main = lambda callback: True\n"
    script.write_text(needs_main + script.read_text())
    done = subprocess.run(
        [sys.executable, str(script), str(root), str(runs)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "WorkerProcessError: DALI's 2 worker processes did not start" in done.stderr
    assert 'under `if __name__ == "__main__":`' in done.stderr
    guarded = script.read_text().replace("it = ", "def main():\n    it = ").replace("print(", "    print(")
    script.write_text(guarded + "if __name__ == '__main__':\n    main()\n")
    runs.unlink()
    done = subprocess.run(
        [sys.executable, str(script), str(root), str(runs)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr
    assert runs.read_text() == "ran\n" * 3  # the main process and, importing it again, each worker


def test_workers_exit_when_the_training_process_is_killed(make_ds, tmp_path: Path) -> None:
    """SIGKILL leaves DALI no chance to close its pool; its workers waited forever, reparented to init."""
    import psutil

    from lerobot_dali.parent_watch import exit_with_parent

    assert exit_with_parent() is False  # the main process has no parent to watch: never ended by this
    root, script = _training_script(
        make_ds,
        tmp_path,
        "import os, sys, time\n"
        "from lerobot_dali import DALILeRobotIterator\n"
        "if __name__ == '__main__':\n"
        "    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device='cpu', num_workers=2)\n"
        "    for epoch in range(2):\n"
        "        it.set_epoch(epoch)\n"
        "        assert sum(len(b['index']) for b in it) == 8  # the watch never ends a worker of a live parent\n"
        "    next(iter(it))\n"
        "    if os.fork() == 0:  # a child forked after the workers started holds the parent's end of their pipes\n"
        "        time.sleep(120)\n"
        "        os._exit(0)\n"
        "    print('READY', flush=True)\n"
        "    time.sleep(300)\n",
    )
    said = tmp_path / "stderr.txt"
    with said.open("w") as stderr:
        trainer = subprocess.Popen(
            [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    children: list[psutil.Process] = []
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "READY"
        children = psutil.Process(trainer.pid).children(recursive=True)
        workers = spawned_workers(children)
        assert len(workers) == 2, [cmdline(p) for p in children]
        assert_workers_end_with(trainer, workers, timeout=10)
    finally:
        kill_all(trainer, children)
    for worker in workers:  # (each says why it ended: nobody is left to see its exit status)
        assert f"worker {worker.pid}: the process that started it ({trainer.pid}) is gone; exiting" in said.read_text()


def _sigint_handler_after_leaving(queue) -> None:
    import signal

    from lerobot_dali.parent_watch import leave_interrupts_to_parent

    queue.put((leave_interrupts_to_parent(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN))


def _hold_a_lock_after_leaving(lock, connection) -> None:
    import os
    import signal
    import time

    from lerobot_dali.parent_watch import leave_interrupts_to_parent

    leave_interrupts_to_parent()
    with lock:  # (as a worker holds the lock of a DALI queue it shares with the trainer)
        os.kill(os.getpid(), signal.SIGUSR1)
        # (a pipe, as DALI's workers keep no thread to send with: a queue's thread may take the SIGTERM, and one that
        # landed inside the queue's close(), before it told that thread to stop, left the exit joining it for ever)
        connection.send("alive after SIGUSR1")
        for _ in range(1200):  # (a SIGTERM that lands just before a sleep is handled once it ends: 0.1 s, not 120 s)
            time.sleep(0.1)


def test_workers_leave_sigusr1_to_the_trainer_and_let_go_of_shared_locks_on_sigterm() -> None:
    """SLURM sends its preemption notice (SIGUSR1, ahead of time) and SIGTERM to every process of the job, torchrun
    SIGTERM to each rank's process group: a trainer that saves a checkpoint on them outlives them, and its workers
    died at once, one of them perhaps holding the lock of a DALI queue it shares with the trainer, which then waited
    for it for ever (its next batch, or closing the pool). SIGUSR1 is left to the trainer; SIGTERM ends a worker
    unwinding, its locks let go."""
    import multiprocessing
    import signal

    from lerobot_dali.parent_watch import leave_interrupts_to_parent

    spawn = multiprocessing.get_context("spawn")
    lock, (said, say) = spawn.Lock(), spawn.Pipe(duplex=False)
    child = spawn.Process(target=_hold_a_lock_after_leaving, args=(lock, say))
    child.start()
    say.close()  # (the child's end: a child ended by SIGUSR1 is an EOFError here, not a wait)
    try:
        assert said.poll(60) and said.recv() == "alive after SIGUSR1"
        child.terminate()  # SIGTERM
        child.join(timeout=60)
        assert child.exitcode == 128 + signal.SIGTERM
        assert lock.acquire(timeout=5), "the worker ended holding the lock"
    finally:
        child.kill()
    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    assert leave_interrupts_to_parent() is False  # the trainer keeps its own
    assert {s: signal.getsignal(s) for s in previous} == previous


_SIGTERM_WHILE_EXITING = """
import atexit, multiprocessing, os, signal, sys, time

def child():
    # (as DALI's exit handler, registered at its import: the pool closing sends SIGTERM while it runs)
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(2)))
    from lerobot_dali.parent_watch import leave_interrupts_to_parent
    assert leave_interrupts_to_parent()

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join(timeout=60)
    print("exitcode", process.exitcode)
"""


def test_a_worker_sent_sigterm_while_exiting_ends_without_a_traceback(tmp_path) -> None:
    """A worker's SIGTERM ends it unwinding (above), but one that came while it ran its exit handlers (the pool
    closing: DALI's own handler) raised there and printed "Exception ignored in atexit callback ... SystemExit: 143"
    at the end of a run. Once exiting, SIGTERM ends it as by default."""
    script = tmp_path / "sigterm_while_exiting.py"
    script.write_text(_SIGTERM_WHILE_EXITING)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr and "SystemExit" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.split() == ["exitcode", str(-signal.SIGTERM)], done.stdout


def _parent_watch_blocked_signals(queue) -> None:
    import re
    import threading

    from lerobot_dali.parent_watch import exit_with_parent

    assert exit_with_parent()
    (watch,) = [t for t in threading.enumerate() if t.name == "lerobot-dali-parent-watch"]
    for _ in range(100):  # (until the thread has set its mask, if it does: 5 s at most)
        status = Path(f"/proc/self/task/{watch.native_id}/status").read_text()
        blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
        if blocked:
            break
        time.sleep(0.05)
    queue.put(blocked)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the thread's signal mask from Linux's /proc")
def test_the_parent_watch_thread_leaves_interrupts_to_the_main_thread() -> None:
    """The kernel gives a signal sent to a process to any of its threads that does not block it, and Python runs the
    handler in the main thread only once that runs Python again: a SIGTERM the watching thread took waited until
    the worker's main thread woke for its next task. It blocks them, so they reach the main thread."""
    import multiprocessing

    queue = multiprocessing.get_context("spawn").Queue()
    child = multiprocessing.get_context("spawn").Process(target=_parent_watch_blocked_signals, args=(queue,))
    child.start()
    blocked = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert {s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) if blocked >> (s - 1) & 1} == {
        signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
    }  # fmt: skip


def test_workers_leave_ctrl_c_to_the_trainer() -> None:
    """Ctrl-C reaches the whole process group; each worker printed its own KeyboardInterrupt traceback while the
    trainer ended them anyway. Workers (multiprocessing children) ignore SIGINT; the main process never does."""
    import multiprocessing
    import signal

    from lerobot_dali.parent_watch import leave_interrupts_to_parent

    queue = multiprocessing.get_context("spawn").Queue()
    child = multiprocessing.get_context("spawn").Process(target=_sigint_handler_after_leaving, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == (True, True)
    child.join(timeout=60)
    # (set first: a shell starting the tests as a background job hands them SIGINT already ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert leave_interrupts_to_parent() is False
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_container_sized_dev_shm_is_warned_of_at_construction(
    make_ds, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Docker and Kubernetes give /dev/shm 64 MiB; the workers' batches (88 MiB for 32 samples of three 480x640
    cameras) died there of SIGBUS on the first batch, with advice about the out-of-memory killer."""
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "shm_bytes", lambda: 64 << 20)
    # (without workers nothing crosses /dev/shm; that case first: it is said once, so after the warning none would be)
    for workers, warned in ((0, False), (1, True)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="lerobot_dali.iterator"):
            DALILeRobotIterator(root, batch_size=2, device="cpu", num_workers=workers).close()
        assert ("/dev/shm is small: " in caplog.text and "64 MiB here" in caplog.text) is warned


def test_workers_log_at_the_training_process_level(make_ds, tmp_path: Path) -> None:
    """Spawned workers start without the trainer's logging: they take its level for lerobot-dali's records and,
    with no handler of their own, write them to stderr naming the worker."""
    root, script = _training_script(
        make_ds,
        tmp_path,
        "import logging, sys\n"
        "from lerobot_dali import DALILeRobotIterator\n"
        "def main():\n"
        "    logging.basicConfig(level=getattr(logging, sys.argv[2]), format='MAIN %(name)s: %(message)s')\n"
        "    it = DALILeRobotIterator(sys.argv[1], batch_size=2, device='cpu', num_workers=1)\n"
        "    print(sum(len(b['index']) for b in it))\n"
        "if __name__ == '__main__':\n"
        "    main()\n",
    )
    for level, shown in (("DEBUG", True), ("WARNING", False)):
        done = subprocess.run(
            [sys.executable, str(script), str(root), level], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr
        worker = [line for line in done.stderr.splitlines() if "(worker pid " in line]
        indexed = ("DEBUG lerobot_dali.packet_index (worker pid ", "DEBUG lerobot_dali.packet_index_store (worker pid ")
        assert any(line.startswith(indexed) for line in worker) is shown, worker  # (built, or loaded from the store)
        assert all(line.startswith(("DEBUG", "INFO", "WARNING")) for line in worker)


class _TerminatedSource(BatchSource):
    """The worker is sent SIGTERM on its first batch, as a preemption sends it to the process group."""

    def assemble(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # (the signal's handler ends the worker here)


def test_a_worker_ended_by_sigterm_is_named_as_a_preemption_not_the_oom_killer(make_ds, monkeypatch) -> None:
    """SIGTERM to the process group (Slurm, torchrun, Kubernetes) ends the workers unwinding, with status 143,
    while a trainer that handles it goes on to save a checkpoint: its next batch raised an error saying "exit
    status unknown" and blaming the out-of-memory killer. It names SIGTERM, says no sample was lost and that
    state_dict() is the position to save."""
    root = _small_dataset(make_ds)
    monkeypatch.setattr(iterator_module, "BatchSource", _TerminatedSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=1)
    with pytest.raises(errors.WorkerProcessError) as info:
        next(iter(it))
    it.close()
    message = str(info.value)
    assert "ended by SIGTERM" in message or "killed by SIGTERM" in message
    assert "out-of-memory" not in message, message
    assert "state_dict()" in message and "sample 0 of epoch 0" in message, message
    assert it.state_dict()["samples_consumed"] == 0
