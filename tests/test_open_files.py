"""The files kept open across calls stay within the process's open-file limit (``ulimit -n``), however many files a
dataset has."""

from __future__ import annotations

import errno
import gc
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lerobot_dali
import lerobot_dali.iterator as iterator_module
from lerobot_dali import open_files
from lerobot_dali.batch_source import BatchSource
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.episode_rows import ParquetCache
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.packet_file_reader import PacketFileReader
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import MarkerVideo

#: One pass of the CPU route under a lowered soft limit, in a process of its own (the limit is the process's).
_PASS = """
import resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
from lerobot_dali import DALILeRobotIterator
it = DALILeRobotIterator(sys.argv[1], batch_size=8, shuffle=True, seed=0, episode_pool_size=24, device="cpu",
                         decode="cpu", num_workers=0, dali_threads=1)
batches = sum(1 for _ in it)
print(batches, len(it))
it.close()
"""


def test_the_cpu_route_keeps_a_v21_pool_within_a_low_open_file_limit(make_ds: Callable[..., Path]) -> None:
    """24 episodes x 2 cameras in the pool at ``ulimit -n 64``: 48 videos and 24 data files were kept open (the
    decoders' floor of 64 was above half the limit, the data files' 128 a fixed count), and a pass failed with
    EMFILE; within their shares it reads every batch."""
    root = make_ds(episodes=24, frames_per_episode=8, cameras=2, size=(64, 64), codec="h264", version="v2.1")
    env = {**os.environ, "PYTHONPATH": str(Path(lerobot_dali.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _PASS, str(root), "64"], capture_output=True, text=True, timeout=300, env=env
    )
    assert "Too many open files" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["24", "24"]


#: A mixture of the same dataset three times, without workers: its datasets' caches in one process, as the pass above.
_MIXTURE_PASS = """
import os, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
from lerobot_dali import DALILeRobotMixture

def open_now(suffix):
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # (the listing's own)
            pass
    return sum(link.endswith(suffix) for link in links)

mixture = DALILeRobotMixture([sys.argv[1]] * 3, batch_size=24, shuffle=True, seed=0, episode_pool_size=24,
                             device="cpu", decode="cpu", num_workers=0, dali_threads=1)
most = {".mp4": 0, ".parquet": 0}
for _ in mixture:
    most = {suffix: max(n, open_now(suffix)) for suffix, n in most.items()}
print(len(mixture), most[".mp4"], most[".parquet"])
mixture.close()
"""


def test_a_mixture_without_workers_keeps_its_datasets_files_within_one_share(make_ds: Callable[..., Path]) -> None:
    """Three datasets read in one process at ``ulimit -n 128``, 48 videos and 24 data files in each pool: each
    dataset's decoders kept its 48 videos (within half the limit, 64) and its data files an eighth (16), 192 files in
    all, and the first batch failed with EMFILE; together they keep the two shares (a dataset that found none left
    kept one file all the same: 65 videos and 18 data files after the first batch)."""
    root = make_ds(episodes=24, frames_per_episode=8, cameras=2, size=(64, 64), codec="h264", version="v2.1")
    env = {**os.environ, "PYTHONPATH": str(Path(lerobot_dali.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _MIXTURE_PASS, str(root), "128"], capture_output=True, text=True, timeout=300, env=env
    )
    assert "Too many open files" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    batches, videos, data_files = map(int, done.stdout.split())
    assert batches == 24, (videos, data_files)
    assert 48 <= videos <= 64 and 8 <= data_files <= 16


class _Cache:
    """A cache holding files (weakly referenced by the share, as the real ones are)."""


def test_caches_of_one_kind_keep_their_share_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 256)
    share, first, second, third = open_files.FileShare(open_files.DECODER_SHARE), _Cache(), _Cache(), _Cache()
    assert share.files_for(first) == 128  # alone: the whole share, as before there was a split
    share.holding(first, 100)
    assert share.files_for(second) == 28  # what the first leaves, within its split (64)
    share.holding(second, 28)
    assert share.files_for(first) == 64  # its split, trimmed to as it opens its next file
    share.holding(first, 64)
    share.holding(second, 64)
    assert share.files_for(third) == 0  # none left: it keeps none (one each passed the share by one per newcomer)
    assert [share.asked(c) for c in (first, second, third)] == [42, 42, None]  # each is asked for its split's rest
    assert share.asked(first) is None  # (once)
    share.leaving(first)  # (closed)
    # (the third, keeping none, counts in the first's split as it comes back; the first, closed, in none)
    assert [share.files_for(c) for c in (first, second, third)] == [42, 64, 64]


def test_a_newcomer_keeping_none_counts_in_the_others_split_until_it_holds_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked to trim once, a busy cache (a dataset whose pool needs more than the share) opened its next files within
    a split that left the newcomer out, holding none: it took the whole share back before the newcomer's next call,
    which found none left again, batch after batch (it reopened every file it read)."""
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 128)  # the share: 64
    share, busy, newcomer = open_files.FileShare(open_files.DECODER_SHARE), _Cache(), _Cache()
    share.holding(busy, 64)
    got = []
    for _ in range(3):  # a batch: the newcomer's one request, then the busy cache's 40 opens
        got.append(share.files_for(newcomer))
        share.holding(newcomer, min(got[-1], 1))  # (keeping none, it closed its file after use)
        held = min(64, share.asked(busy) or 64)
        for _ in range(40):
            held = min(held + 1, share.files_for(busy))
            share.holding(busy, held)
    assert got == [0, 32, 32] and held == 32
    share.leaving(newcomer)  # (closed): no more counted
    assert share.files_for(busy) == 64


def _open_under(folder: Path, suffix: str) -> int:
    links = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    return sum(link.startswith(str(folder.resolve())) and link.endswith(suffix) for link in links)


def test_a_decoder_with_all_its_files_gives_a_newcomer_its_split(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder that opens no more files kept all it had: the next dataset's decoder kept one beyond the share and
    reopened it at each request. Now the newcomer keeps none while none is left, and the other gives up what is beyond
    its split at its next call, an open file's or not."""
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 8)  # the decoders' share: 4
    monkeypatch.setattr(open_files, "DECODERS", open_files.FileShare(open_files.DECODER_SHARE))
    source = marker_video("h264", 2)
    paths = [shutil.copy(source, tmp_path / f"{i}.mp4") for i in range(5)]
    index = build_packet_index(source)
    options = CpuDecodeOptions(backend=CpuDecoderBackend.PYAV)
    first, second = CpuFrameDecoder(options=options), CpuFrameDecoder(options=options)
    for path in paths[:4]:
        first.decode(path, index, [5])
    second.decode(paths[4], index, [5])
    assert (first.open_decoders, second.open_decoders, _open_under(tmp_path, ".mp4")) == (4, 0, 4)
    first.decode(paths[3], index, [5])  # (open already)
    assert (first.open_decoders, _open_under(tmp_path, ".mp4")) == (2, 2)
    second.decode(paths[4], index, [5])
    assert (first.open_decoders, second.open_decoders, _open_under(tmp_path, ".mp4")) == (2, 1, 3)
    first.close()
    second.close()


def test_a_parquet_cache_with_all_its_files_gives_a_newcomer_its_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the decoders: the data files' share held by one cache, the next keeps none (a read's file closes at its
    end) until the first, at its next call, gives up what is beyond its split."""
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 16)  # the data files' share: 2
    monkeypatch.setattr(open_files, "DATA_FILES", open_files.FileShare(open_files.DATA_FILE_SHARE))
    paths = [str(tmp_path / f"f{i}.parquet") for i in range(3)]
    for path in paths:
        pq.write_table(pa.table({"x": np.arange(5)}), path)
    first, second = ParquetCache(fsspec.filesystem("file").open), ParquetCache(fsspec.filesystem("file").open)
    for path in paths[:2]:
        first.get(path)
    with second.reading(paths[2]) as parquet:
        assert parquet.read().column("x").to_pylist() == list(range(5))
    assert (len(first._open), len(second._open), _open_under(tmp_path, ".parquet")) == (2, 0, 2)
    first.get(paths[1])  # (open already)
    second.get(paths[2])
    assert (len(first._open), len(second._open), _open_under(tmp_path, ".parquet")) == (1, 1, 2)
    first.close()
    second.close()


class _Closing(_Cache):
    """A cache in a reference cycle that closes its files when freed, as an iterator's __del__ closes its own."""

    def __init__(self, share: open_files.FileShare) -> None:
        self.share, self.cycle = share, self
        share.holding(self, 2)

    def __del__(self) -> None:
        self.share.holding(self, 0)


class _Collecting(_Cache):
    """A cache hashed under the share's lock, where the collector then runs (as it may in any allocation there)."""

    def __hash__(self) -> int:
        gc.collect()
        return id(self)


@pytest.fixture
def collected_only_when_asked() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_cache_freed_by_the_collector_under_the_shares_lock_closes(collected_only_when_asked: None) -> None:
    """The cycle collector runs inside any allocation, one made under the share's lock too, and an iterator it frees
    closes its caches there (holding(cache, 0)): with a plain lock that thread hung for good (a loop of opens and
    freed caches hung at its 5,157th open at the default collector thresholds)."""
    share, holder = open_files.FileShare(open_files.DECODER_SHARE), _Cache()
    share.holding(holder, 3)
    _Closing(share)  # (freed by the collector only)
    done = threading.Event()

    def open_files_as_caches_do() -> None:
        share.holding(_Collecting(), 5)
        done.set()

    threading.Thread(target=open_files_as_caches_do, daemon=True).start()  # (a hang stays in its thread)
    assert done.wait(timeout=60), "the thread hung on the share's lock"
    whole = open_files.open_files_share(open_files.DECODER_SHARE)
    assert share.files_for(_Cache()) == min(whole // 2, whole - 3)  # (the freed cache holds none, nor the other)
    share.holding(holder, 3)
    assert (len(share._held), len(share._asked)) == (1, 0)  # (nor are they kept)


def test_an_iterator_keeps_no_data_file_open_from_its_checks(make_ds: Callable[..., Path]) -> None:
    """Batches read through the source's copy of the reader: the data file its checks opened stayed open, a cache of
    one file that halved the data files' split of the one reading batches."""
    root = make_ds(episodes=4, frames_per_episode=8, cameras=1, size=(64, 64), codec="h264", version="v2.1")
    it = DALILeRobotIterator(root, batch_size=2, device="cpu", decode="cpu", num_workers=0)
    assert _open_under(root, ".parquet") == 0
    it.close()


def test_the_shares_of_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 256)
    assert [open_files.open_files_share(s) for s in (open_files.DECODER_SHARE, open_files.DATA_FILE_SHARE)] == [128, 32]
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 4)
    assert open_files.open_files_share(open_files.DATA_FILE_SHARE) == 1


@pytest.mark.parametrize(
    ("limits", "fix"),
    [
        ((256, 256), ", or raise the soft limit of 256 open files: `ulimit -n 656` in the shell that starts training "
         "(past the hard limit of 256, which only an administrator raises)"),
        ((256, 4096), ", or raise the soft limit of 256 open files: `ulimit -n 656` in the shell that starts training"),
        ((resource.RLIM_INFINITY,) * 2, ": the open-file limit is unlimited, which Linux holds to 1048576 "
         "(fs.nr_open)"),
    ],
)  # fmt: skip
def test_workers_past_the_open_file_limit_are_refused_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, limits: tuple[int, int], fix: str
) -> None:
    """Past a low limit the refusal says the `ulimit -n` that starts them; an unlimited one (Linux's fs.nr_open, 2**20)
    said "raise the soft limit of -1 open files: `ulimit -n ...`" with a number below what it had."""
    monkeypatch.setattr(resource, "getrlimit", lambda kind: limits)
    workers = 200 if limits[0] == 256 else 600_000
    with pytest.raises(ValueError, match=r"^num_workers=\d+ cannot start: .* of its limit of \d+ are open") as e:
        open_files.refuse_workers_past_open_files(workers)
    assert str(e.value).endswith(f"pass fewer workers (--num-workers; this machine has {os.cpu_count()} CPUs){fix}")
    open_files.refuse_workers_past_open_files(0)
    open_files.refuse_workers_past_open_files(2)


def _emfile(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EMFILE, "Too many open files", "/data/f")


class _OutOfFilesSource(BatchSource):
    """Every batch meets the process's open-file limit (module level, as a worker's source must be)."""

    def assemble(self, *args: object, **kwargs: object) -> None:
        _emfile()


def test_the_open_file_limit_reached_says_to_raise_it(
    make_ds: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE names the limit and what to do; a video whose open meets it is not called undecodable, as a damaged
    file would be (it was a VideoDecodeError)."""
    monkeypatch.setattr(open_files, "open_files_limit", lambda: 256)
    monkeypatch.setattr(os, "open", _emfile)
    with pytest.raises(OSError) as info:
        PacketFileReader("/data/cam.mp4", None, threads=1, label="cam.mp4")  # type: ignore[arg-type]
    assert type(info.value) is OSError and info.value.errno == errno.EMFILE
    assert str(info.value) == (
        "[Errno 24] Too many open files (this process's soft limit: 256); raise it before starting "
        "(`ulimit -n 4096`), or keep fewer files open (a smaller episode_pool_size, "
        "CpuDecodeOptions(max_open_decoders=...)): '/data/f'"
    )
    assert open_files.out_of_files(info.value) is info.value  # (said once: a batch meeting it in a video's open)
    monkeypatch.undo()

    root = make_ds(episodes=2, frames_per_episode=4, cameras=1, codec="av1", fps=10, episodes_per_file=2, gop=2)
    monkeypatch.setattr(iterator_module, "BatchSource", _OutOfFilesSource)
    it = DALILeRobotIterator(root, batch_size=2, shuffle=False, device="cpu", num_workers=0)
    with pytest.raises(OSError, match=r"reading samples \[0, 2\) .*soft limit: \d+\); raise it before starting"):
        next(iter(it))
    it.close()


#: A video opened by the PyAV reader (the check's decoder, and the CPU route's for what it cannot read by packets)
#: in a process with no file descriptor left under its limit.
_PYAV_OPEN = """
import os, resource, sys
from lerobot_dali.pyav_reader import PyAvReader
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    PyAvReader(sys.argv[1], filesystem=None, threads=1, label="cam.mp4")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_video_the_pyav_reader_opens_at_the_limit_is_not_called_corrupt(make_ds: Callable[..., Path]) -> None:
    """It was a VideoDecodeError, 'the file is truncated or corrupt', as a damaged file's open is."""
    root = make_ds(episodes=1, frames_per_episode=4, cameras=1, codec="vp9", size=(64, 64))
    video = next(root.glob("videos/**/*.mp4"))
    said = subprocess.run(
        [sys.executable, "-c", _PYAV_OPEN, str(video)], capture_output=True, text=True, check=True
    ).stdout
    assert said.startswith("OSError [Errno 24] Too many open files (this process's soft limit: 64); raise it"), said
