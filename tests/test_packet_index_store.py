"""Packet indexes stored on disk: exact round trip, stale stamps miss, corrupt files rebuilt, shared safely."""

from __future__ import annotations

import ast
import dataclasses
import errno
import json
import logging
import multiprocessing
import os
import pickle
import re
import shutil
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from lerobot_dali import packet_index, packet_index_cache
from lerobot_dali.errors import DatasetError, MissingDataFileError, RemoteFileError, VideoDecodeError
from lerobot_dali.file_stamps import FileStamp, FileStamps, stamp_from_stat
from lerobot_dali.packet_index import PacketIndex, build_packet_index
from lerobot_dali.packet_index_cache import PacketIndexCache
from lerobot_dali.packet_index_file import FILE_CHECKS
from lerobot_dali.packet_index_store import STORE_FORMAT, SUFFIX, PacketIndexStore, default_packet_index_dir
from lerobot_dali.remote_retry import RetryingFileSystem
from lerobot_dali.video_source import source_url
from tests.fake_remote import FakeRemoteFileSystem
from tests.process_tree import reports_of_processes_at_once
from tests.replace_on_warning import replaced_when_warned
from tests.video_fixtures import EPISODE_LENGTHS, MarkerVideo, remux, top_level_boxes, with_movie_duration

_FIELDS = (
    "source_name", "codec", "width", "height", "pix_fmt", "time_base", "file_size_bytes", "byte_exact",
    "stream_index", "keyframe_sizes_checked",
)  # fmt: skip
_ARRAYS = ("pts", "dts", "byte_offset", "size_bytes", "keyframe", "display_order", "display_rank", "frame_pts")
_URL = "hf://datasets/user/name/videos/observation.images.top/chunk-000/file-000.mp4"


def assert_identical(actual: PacketIndex, expected: PacketIndex) -> None:
    for name in _ARRAYS:
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype, name
        np.testing.assert_array_equal(a, e, err_msg=name)
    np.testing.assert_array_equal(actual.frame_pts_s, expected.frame_pts_s)
    for name in (*_FIELDS, "template", "frame_duration", "frame_count"):
        assert getattr(actual, name) == getattr(expected, name), name


@pytest.mark.parametrize(("codec", "gop"), [("h264", 30), ("av1", 2)], ids=["h264_bframes", "av1"])
def test_round_trip_is_exact(marker_video: MarkerVideo, tmp_path: Path, codec: str, gop: int) -> None:
    index = build_packet_index(marker_video(codec, gop))
    if codec == "h264":
        assert not np.array_equal(index.display_order, np.arange(index.frame_count))  # B-frames reorder
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(index.file_size_bytes, "sha256:" + "0" * 64)
    assert store.load(_URL, stamp) is None
    store.save(_URL, stamp, index)
    loaded = store.load(_URL, stamp)
    assert loaded is not None and loaded is not index
    assert loaded.frame_count == sum(EPISODE_LENGTHS)
    assert_identical(loaded, index)
    (stored,) = (tmp_path / "store").rglob("*.pidx")
    assert stored == store.path_for(_URL, stamp)
    assert not [p for p in (tmp_path / "store").rglob("*") if p.suffix == ".tmp"]
    raw = stored.read_bytes()
    header, regions = _layout(raw)
    assert header["url"] == _URL and header["packets"] == index.frame_count
    assert raw.startswith(b"LDPKTIDX") and regions["checksum"] == regions["template"] + len(index.template)
    assert struct.unpack("<I", raw[-4:])[0] == zlib.crc32(raw[:-4])
    assert store.load("hf://datasets/user/name/other.mp4", stamp) is None


def test_every_field_round_trips(marker_video: MarkerVideo, tmp_path: Path) -> None:
    index = dataclasses.replace(
        build_packet_index(marker_video("h264", 30)),
        source_name="vidéo ✓.mp4",
        codec="hevc",
        width=1921,
        height=1081,
        pix_fmt=None,
        time_base=Fraction(1001, 30000),
        file_size_bytes=2**40 + 3,
        byte_exact=False,
        template=b"",
        stream_index=2,
        keyframe_sizes_checked=True,
    )
    store = PacketIndexStore(tmp_path)
    url, stamp = "s3://bücket/a b.mp4", FileStamp(2**40 + 3, 'etag:"x"')
    store.save(url, stamp, index)
    loaded = store.load(url, stamp)
    assert loaded is not None and loaded.pix_fmt is None and loaded.template == b""
    assert_identical(loaded, index)


@pytest.mark.parametrize("checked", [True, False])
def test_whether_every_keyframe_size_was_checked_is_stored(
    marker_video: MarkerVideo, tmp_path: Path, checked: bool
) -> None:
    """A remote file's index judged only its first keyframes: loaded again, its clips must still be checked."""
    index = dataclasses.replace(build_packet_index(marker_video("av1", 2)), keyframe_sizes_checked=checked)
    store = PacketIndexStore(tmp_path)
    stamp = FileStamp(index.file_size_bytes, "blob:1")
    store.save(_URL, stamp, index)
    loaded = store.load(_URL, stamp)
    assert loaded is not None and loaded.keyframe_sizes_checked is checked


def test_stale_stamp_misses(marker_video: MarkerVideo, tmp_path: Path) -> None:
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path)
    stamp = FileStamp(index.file_size_bytes, "blob:1")
    store.save(_URL, stamp, index)
    assert store.load(_URL, FileStamp(index.file_size_bytes + 1, "blob:1")) is None
    assert store.load(_URL, FileStamp(index.file_size_bytes, "blob:2")) is None
    assert store.load(_URL, stamp) is not None


def _valid_file(store: PacketIndexStore, index: PacketIndex, stamp: FileStamp) -> bytes:
    store.save(_URL, stamp, index)
    return store.path_for(_URL, stamp).read_bytes()


def _layout(raw: bytes) -> tuple[dict[str, Any], dict[str, int]]:
    """The header of a stored index's bytes, and where each of its parts starts."""
    header_length = struct.unpack_from("<I", raw, 12)[0]
    header = json.loads(raw[16 : 16 + header_length])
    arrays, count = 16 + header_length, header["packets"]
    regions = {"magic": 0, "format": 8, "header_length": 12, "header": 16, "pts": arrays, "dts": arrays + 8 * count}
    regions |= {"size_bytes": arrays + 24 * count, "keyframe": arrays + 32 * count, "template": arrays + 33 * count}
    regions["checksum"] = len(raw) - 4
    return header, regions


def _rewritten(change: Callable[[dict[str, Any]], None], file_format: int = STORE_FORMAT) -> Callable[[Path], None]:
    """A file another writer made well (its checksum matches): its header changed by ``change``, its format set."""

    def rewrite(path: Path) -> None:
        raw = path.read_bytes()
        header, regions = _layout(raw)
        change(header)
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        body = b"LDPKTIDX" + struct.pack("<II", file_format, len(encoded)) + encoded + raw[regions["pts"] : -4]
        path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))

    return rewrite


def _flipped(region: str, past: int = 0) -> Callable[[Path], None]:
    """One bit flipped ``past`` bytes into a part of the file."""

    def flip(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[_layout(bytes(raw))[1][region] + past] ^= 0x10
        path.write_bytes(bytes(raw))

    return flip


_BIT_FLIPS = {
    "magic": _flipped("magic", 3),
    "format": _flipped("format"),
    "header_length": _flipped("header_length"),
    "header": _flipped("header", 9),  # (in the URL)
    "header_end": _flipped("pts", -1),
    "pts": _flipped("pts", 17),
    "dts": _flipped("dts"),
    "size_bytes": _flipped("size_bytes", 3),
    "keyframe": _flipped("keyframe", 1),
    "template": _flipped("template", 40),
    "checksum": _flipped("checksum", 3),
}


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(b"not a packet index"),
        lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
        lambda path: path.write_bytes(b""),
        lambda path: path.write_bytes(path.read_bytes()[:-1]),
        _rewritten(lambda header: None, STORE_FORMAT - 1),
        _rewritten(lambda header: header.update(url="s3://elsewhere.mp4")),
        _rewritten(lambda header: header.update(packets=header["packets"] - 1)),
        *_BIT_FLIPS.values(),
    ],
    ids=["garbage", "truncated", "empty", "last_byte_cut", "old_format", "other_key", "wrong_count", *_BIT_FLIPS],
)
def test_corrupt_file_is_deleted_and_rebuilt(
    marker_video: MarkerVideo, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    video = marker_video("h264", 30)
    index = build_packet_index(video)
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(index.file_size_bytes, "mtime:1")
    good = _valid_file(store, index, stamp)
    path = store.path_for(_URL, stamp)
    damage(path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        assert store.load(_URL, stamp) is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert str(path) in caplog.records[0].getMessage() and "deleting it" in caplog.records[0].getMessage()
    assert not path.exists()
    store.save(_URL, stamp, build_packet_index(video))
    assert path.read_bytes() == good
    rebuilt = store.load(_URL, stamp)
    assert rebuilt is not None
    assert_identical(rebuilt, index)


def _store_as_an_older_build(store: PacketIndexStore, url: str, stamp: FileStamp, index: PacketIndex) -> Path:
    """``index`` stored as a version before :data:`FILE_CHECKS` stored it (no ``file_checks``); its entry's path."""
    store.save(url, stamp, index)
    _rewritten(lambda header: header.pop("file_checks", None))(store.path_for(url, stamp))
    return store.path_for(url, stamp)


def test_an_index_stored_before_truncated_files_were_refused_is_checked_against_its_file(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index stored by a version that did not refuse truncated or zero-filled files (its header says no file
    checks) was served as it was: a cut fragmented MP4's held the 74 frames before the cut, a zero-filled faststart
    MP4's all 90, its last ones zeros, a fragmented MP4's zero-filled from its first moof the 30 its moov lists; the
    store format was kept so as not to rebuild every index. Such an entry is now served once its file's boxes pass
    (then stored with the checks, not checked again); a truncated file's is deleted and the file named as truncated."""
    flags = "frag_keyframe+empty_moov+default_base_moof"
    whole = remux(marker_video("h264", 30), tmp_path / "whole.mp4", movflags=flags)
    raw = whole.read_bytes()
    last_mdat = top_level_boxes(raw)[-2]
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(raw[: (last_mdat[1] + last_mdat[2]) // 2])
    faststart = remux(marker_video("h264", 30), tmp_path / "faststart.mp4", movflags="faststart").read_bytes()
    filled = tmp_path / "filled.mp4"
    filled.write_bytes(faststart[: len(faststart) - 100] + bytes(100))
    first_in_moov = remux(marker_video("h264", 30), tmp_path / "first.mp4", movflags="frag_keyframe").read_bytes()
    moof = next(start for kind, start, _ in top_level_boxes(first_in_moov) if kind == b"moof")
    moof_filled = tmp_path / "moof_filled.mp4"  # (its moov lists the first fragment's samples: a plain movie's boxes)
    moof_filled.write_bytes(first_in_moov[:moof] + bytes(len(first_in_moov) - moof))
    store = PacketIndexStore(tmp_path / "store")
    frames = {}
    for video in (whole, cut, filled, moof_filled):
        with monkeypatch.context() as old_build:  # (what a version without the checks built)
            old_build.setattr(packet_index, "_check_fragments", lambda *args, **kwargs: None)
            old_build.setattr(packet_index, "_check_zero_filled", lambda *args, **kwargs: None)
            index = build_packet_index(video)
        frames[video.name] = index.frame_count
        _store_as_an_older_build(store, source_url(video), stamp_from_stat(video.stat()), index)
    assert frames == {"whole.mp4": 90, "cut.mp4": 74, "filled.mp4": 90, "moof_filled.mp4": 30}
    served = PacketIndexCache().get(whole, store=store)
    assert_identical(served, build_packet_index(whole))
    entry = store.path_for(source_url(whole), stamp_from_stat(whole.stat()))
    assert _layout(entry.read_bytes())[0]["file_checks"] == FILE_CHECKS  # (stored again: not checked again)
    for video, said in [
        (cut, f"its mdat box at byte {last_mdat[1]} extends to byte {last_mdat[2]} but the file has"),
        (filled, "its last stored packet .* starts with zeros, as no h264 packet does"),
        (moof_filled, f"its box header at byte {moof} is zeros: the file is zero-filled from there"),
    ]:
        entry = store.path_for(source_url(video), stamp_from_stat(video.stat()))
        with pytest.raises(VideoDecodeError, match=rf"{video.name}: {said}.*; the file is truncated"):
            PacketIndexCache().get(video, store=store)
        assert not entry.exists()


def test_an_entry_replaced_while_found_unreadable_is_kept(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """A load that found a damaged file deleted the path after: a good index another process had renamed over it
    meanwhile went too, and was built again."""
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(index.file_size_bytes, "mtime:1")
    good = _valid_file(store, index, stamp)
    path = store.path_for(_URL, stamp)
    path.write_bytes(good[:100])  # the file this load reads: cut short
    with replaced_when_warned("lerobot_dali.packet_index_store", path, good) as warnings:
        assert store.load(_URL, stamp) is None
    assert len(warnings) == 1 and "unreadable" in warnings[0]
    assert path.read_bytes() == good
    kept = store.load(_URL, stamp)
    assert kept is not None
    assert_identical(kept, index)


def test_a_load_parses_no_python_literal_so_no_other_thread_can_break_it(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython 3.11 counts the AST constructor's depth per interpreter: ``np.load``'s header parse failed while
    another thread parsed Python (seen in CI), and the good stored index was taken for damage and deleted. A lock of
    ours could not keep out a thread of someone else's, here one parsing in a loop: a load now parses nothing."""
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(index.file_size_bytes, "mtime:1")
    good = _valid_file(store, index, stamp)
    loader, real_literal_eval = threading.get_ident(), ast.literal_eval

    def literal_eval(node: Any) -> Any:
        if threading.get_ident() == loader:
            raise SystemError("AST constructor recursion depth mismatch (before=123, after=302)")
        return real_literal_eval(node)

    monkeypatch.setattr(ast, "literal_eval", literal_eval)
    parsing, stop = threading.Event(), threading.Event()

    def parse_in_a_loop() -> None:
        while not stop.is_set():
            assert ast.literal_eval("{'descr': '<i8', 'fortran_order': False, 'shape': (3,)}")["shape"] == (3,)
            parsing.set()

    other = threading.Thread(target=parse_in_a_loop, daemon=True)
    other.start()
    try:
        assert parsing.wait(timeout=30)
        loads = [store.load(_URL, stamp) for _ in range(20)]
    finally:
        stop.set()
        other.join(timeout=30)
    assert all(loaded is not None for loaded in loads)
    assert loads[-1] is not None
    assert_identical(loads[-1], index)
    assert store.path_for(_URL, stamp).read_bytes() == good


def test_a_store_holding_npz_files_of_older_versions_works_and_prunes_them(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Format 4 and before stored ``.npz`` files at the same names: an older version sharing the folder keeps
    reading its own (neither version deletes the other's), and once no run uses them a sweep deletes them."""
    monkeypatch.setenv("LEROBOT_DALI_CACHE_DAYS", "7")
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(index.file_size_bytes, "mtime:1")
    path = store.path_for(_URL, stamp)
    old = path.with_suffix(".npz")
    old.parent.mkdir(parents=True)
    with open(old, "wb") as handle:
        np.savez(handle, format=np.array(4), url=np.array(_URL), pts=index.pts)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        assert store.load(_URL, stamp) is None
        store.save(_URL, stamp, index)
        loaded = store.load(_URL, stamp)
    assert not caplog.records and old.exists()
    assert loaded is not None
    assert_identical(loaded, index)
    aged = time.time() - 8 * 86400
    os.utime(old, (aged, aged))
    store.prune_unused()
    assert not old.exists() and path.exists()


def test_cache_rebuilds_over_a_corrupt_file(marker_video: MarkerVideo, tmp_path: Path) -> None:
    video = marker_video("av1", 2)
    store = PacketIndexStore(tmp_path / "store")
    stamp = FileStamp(video.stat().st_size, "mtime:1")
    path = store.path_for(source_url(str(video)), stamp)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 broken")
    index = PacketIndexCache().get(str(video), stamp=stamp, store=store)
    assert_identical(index, build_packet_index(video))
    reloaded = store.load(source_url(str(video)), stamp)
    assert reloaded is not None
    assert_identical(reloaded, index)


def test_unwritable_store_warns_once_per_folder(
    marker_video: MarkerVideo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only or misplaced $LEROBOT_DALI_CACHE logged a warning per file on every save, the same file again and
    again; the column store stops after one."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store folder should be")
    index = build_packet_index(marker_video("h264", 30))
    stores = [PacketIndexStore(blocker / "store"), PacketIndexStore(blocker / "store")]  # (a reader's, a worker's)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        for store in stores:
            for version in ("a", "b", "a"):
                store.save(_URL, FileStamp(1, version), index)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"cannot write to {blocker / 'store'}" in warnings[0], warnings
    assert "make it a writable folder or move the store with $LEROBOT_DALI_CACHE" in warnings[0]
    assert stores[0].load(_URL, FileStamp(1, "a")) is None


def test_a_full_store_is_written_no_more(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lerobot_dali import packet_index_store

    writes: list[int] = []
    real_atomic_file = packet_index_store.atomic_file

    class FullDisk:
        def write(self, data: bytes) -> None:
            writes.append(len(data))
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

    @contextmanager
    def over_quota(path: Path, **kwargs: Any) -> Iterator[FullDisk]:
        with real_atomic_file(path, **kwargs):  # (its temporary file: removed)
            yield FullDisk()

    monkeypatch.setattr(packet_index_store, "atomic_file", over_quota)
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path / "store")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        for version in ("a", "b"):
            store.save(_URL, FileStamp(1, version), index)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(writes) == 1 and len(warnings) == 1 and "Disk quota exceeded" in warnings[0], warnings
    assert "free space or move the store" in warnings[0]
    assert not list((tmp_path / "store").rglob("*.tmp"))


def test_one_entry_that_cannot_be_written_warns_once_and_others_are_stored(
    marker_video: MarkerVideo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = build_packet_index(marker_video("h264", 30))
    store = PacketIndexStore(tmp_path)
    blocked = FileStamp(1, "a")
    fan_out = store.path_for(_URL, blocked).parent
    fan_out.write_text("a file where the fan-out folder should be (another user's, in a shared cache)")
    other = next(FileStamp(1, v) for v in "bcdefghij" if store.path_for(_URL, FileStamp(1, v)).parent != fan_out)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        for stamp in (blocked, other, blocked):
            store.save(_URL, stamp, index)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cannot write packet index cache file" in warnings[0], warnings
    assert store.load(_URL, other) is not None


def test_default_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LEROBOT_DALI_CACHE", str(tmp_path / "c"))
    assert default_packet_index_dir() == tmp_path / "c" / "packet_index"
    assert PacketIndexStore().directory == tmp_path / "c" / "packet_index"
    monkeypatch.delenv("LEROBOT_DALI_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert PacketIndexStore().directory == tmp_path / "home" / ".cache" / "lerobot_dali" / "packet_index"
    assert pickle.loads(pickle.dumps(PacketIndexStore(tmp_path / "x"))).directory == tmp_path / "x"


def test_an_older_entry_of_a_fragmented_mp4_cut_where_its_mehd_box_says_is_refused(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older build's entry was checked against its file's boxes only: a fragmented MP4 whose mehd box (GPAC's,
    Bento4's) gives 3 s, cut between two fragments, was served as the 60 frames before the cut (1 of 1), and marked
    checked. Now an mehd longer than the index holds has the file indexed again, which refuses it; the whole file's
    entry, whose mehd matches, is served as stored."""
    flags = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
    source = remux(marker_video("h264", 30), tmp_path / "source.mp4", movflags=flags)
    whole, cut = with_movie_duration(source, tmp_path / "whole.mp4", 3.0), tmp_path / "cut.mp4"
    raw = whole.read_bytes()
    cut.write_bytes(raw[: top_level_boxes(raw)[-2][1]])  # (before the third fragment's moof)
    store = PacketIndexStore(tmp_path / "store")
    entries = {}
    for video in (whole, cut):
        with monkeypatch.context() as old_build:  # (what a version without the mehd check built)
            old_build.setattr(packet_index, "_check_movie_duration", lambda *args, **kwargs: None)
            index = build_packet_index(video)
        entries[video.name] = _store_as_an_older_build(store, source_url(video), stamp_from_stat(video.stat()), index)
        assert index.frame_count == {"whole.mp4": 90, "cut.mp4": 60}[video.name]
    assert_identical(PacketIndexCache().get(whole, store=store), build_packet_index(whole))
    assert _layout(entries["whole.mp4"].read_bytes())[0]["file_checks"] == FILE_CHECKS
    said = "cut.mp4: its tracks hold 2.067 s but its mehd box gives the movie 3.000 s (a cut between two of"
    with pytest.raises(VideoDecodeError, match=re.escape(said) + ".*; the file is truncated"):
        PacketIndexCache().get(cut, store=store)
    assert not entries["cut.mp4"].exists()


def test_an_older_entrys_mehd_check_has_a_bound_of_half_a_frame(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older build's entry holds 90 frames at 30 fps, its last at 46592/15360 = 91/30 s: 92/30 s held. An mehd one
    frame longer (3.1 s = 93/30) has the file indexed again, which refuses it; one exactly half a frame longer (37/12 s
    = 185/60, in a 600-tick timescale) is served as stored, with no build."""
    flags = "frag_keyframe+empty_moov+default_base_moof+skip_trailer"
    source = remux(marker_video("h264", 30), tmp_path / "source.mp4", movflags=flags)
    longer = with_movie_duration(source, tmp_path / "longer.mp4", 3.1)
    half = with_movie_duration(source, tmp_path / "half.mp4", 1850 / 600, timescale=600)
    store = PacketIndexStore(tmp_path / "store")
    entries, indexes = {}, {}
    for video in (longer, half):
        with monkeypatch.context() as old_build:  # (what a version without the mehd check built)
            old_build.setattr(packet_index, "_check_movie_duration", lambda *args, **kwargs: None)
            indexes[video.name] = index = build_packet_index(video)
        assert index.frame_count == 90 and int(index.pts.max()) == 46592 and index.time_base == Fraction(1, 15360)
        entries[video.name] = _store_as_an_older_build(store, source_url(video), stamp_from_stat(video.stat()), index)
    builds = []
    real_build = packet_index.build_packet_index
    monkeypatch.setattr(packet_index, "build_packet_index", lambda *a, **k: builds.append(a[0]) or real_build(*a, **k))
    assert_identical(PacketIndexCache().get(half, store=store), indexes["half.mp4"])
    assert builds == []
    assert _layout(entries["half.mp4"].read_bytes())[0]["file_checks"] == FILE_CHECKS
    said = "longer.mp4: its tracks hold 3.067 s but its mehd box gives the movie 3.100 s (a cut between two of"
    with pytest.raises(VideoDecodeError, match=re.escape(said) + ".*; the file is truncated"):
        PacketIndexCache().get(longer, store=store)
    assert builds == [longer] and not entries["longer.mp4"].exists()


def test_an_older_entry_of_a_file_changed_since_it_was_listed_is_refused_and_kept(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """A remote file listed (stamped) before it changed on the server: an older build's entry of the listed file was
    checked against the new file, passed, and was served for it (its byte offsets for another encoding's) and marked
    checked.
    Now the file's size, unlike the indexed one, refuses it as a build does, and the entry is kept unchecked."""
    _, fs, path = _remote(tmp_path, marker_video("h264", 30))
    stamp = FileStamps(fs, ["videos"])[path]
    store = PacketIndexStore(tmp_path / "store")
    index = build_packet_index(path, filesystem=fs)
    entry = _store_as_an_older_build(store, source_url(path, filesystem=fs), stamp, index)
    changed = marker_video("h264", 2)  # (every other frame a keyframe: another size)
    shutil.copyfile(changed, tmp_path / "remote" / path)
    said = rf"{path} has {changed.stat().st_size} bytes but was listed with {stamp.size}: it changed on the server"
    with pytest.raises(DatasetError, match=said):
        PacketIndexCache().get(path, filesystem=fs, stamp=stamp, store=store)
    assert "file_checks" not in _layout(entry.read_bytes())[0]


class _FailingReads(FakeRemoteFileSystem):
    """A remote whose files open, and whose reads each fail as ``faults`` say."""

    def _request(self, kind: str, path: str) -> str | None:
        return super()._request(kind, path) if kind == "read" else None


@pytest.mark.parametrize(("fault", "raised"), [("denied", RemoteFileError), ("missing", MissingDataFileError)])
def test_an_older_entry_whose_file_cannot_be_read_is_kept(
    marker_video: MarkerVideo, tmp_path: Path, fault: str, raised: type[Exception]
) -> None:
    """A read of the file that fails while an older build's entry is checked (a 403 once a token expired; the file
    removed while read) says nothing of the file: the entry was deleted and the file called damaged (11 of 11 such
    failures, at every read of the check). Now the failure is raised (a refusal as RemoteFileError, naming the file)
    and the entry kept: once the file reads again, it is checked and served."""
    video = marker_video("h264", 30)
    _, fs, path = _remote(tmp_path, video)
    stamp = FileStamps(fs, ["videos"])[path]
    store = PacketIndexStore(tmp_path / "store")
    index = build_packet_index(path, filesystem=fs)
    entry = _store_as_an_older_build(store, source_url(path, filesystem=fs), stamp, index)
    failing = RetryingFileSystem(_FailingReads(str(tmp_path / "remote"), fault_every=1, faults=(fault,)))
    with pytest.raises(raised):
        PacketIndexCache().get(path, filesystem=failing, stamp=stamp, store=store)
    assert "file_checks" not in _layout(entry.read_bytes())[0]
    assert_identical(PacketIndexCache().get(path, filesystem=fs, stamp=stamp, store=store), index)
    assert _layout(entry.read_bytes())[0]["file_checks"] == FILE_CHECKS


def _remote(tmp_path: Path, video: Path) -> tuple[FakeRemoteFileSystem, RetryingFileSystem, str]:
    folder = tmp_path / "remote" / "videos" / "cam" / "chunk-000"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(video, folder / "file-000.mp4")
    remote = FakeRemoteFileSystem(str(tmp_path / "remote"))
    return remote, RetryingFileSystem(remote), "videos/cam/chunk-000/file-000.mp4"


def test_stamped_cache_with_store_skips_the_remote(marker_video: MarkerVideo, tmp_path: Path) -> None:
    video = marker_video("h264", 30)
    remote, fs, path = _remote(tmp_path, video)
    stamps = FileStamps(fs, ["videos"])
    listing_requests = dict(remote.requests)
    assert listing_requests == {"ls": 3}
    store = PacketIndexStore(tmp_path / "store")

    first = PacketIndexCache()
    index = first.get(path, filesystem=fs, stamp=stamps[path], store=store)
    build_requests = dict(remote.requests - Counter(listing_requests))
    assert build_requests["open"] == 1 and "info" not in build_requests, build_requests
    assert_identical(index, build_packet_index(path, filesystem=fs))
    before = dict(remote.requests)
    assert first.get(path, filesystem=fs, stamp=stamps[path], store=store) is index
    assert dict(remote.requests) == before

    # A worker process: its own copies of the cache, stamps and store; the index comes from disk.
    worker_cache, worker_stamps, worker_store = pickle.loads(pickle.dumps((first, stamps, store)))
    worker_fs = worker_stamps.fs
    assert len(worker_cache) == 0
    loaded = worker_cache.get(path, filesystem=worker_fs, stamp=worker_stamps[path], store=worker_store)
    assert not worker_fs.fs.requests
    assert_identical(loaded, index)
    assert worker_stamps.info_calls == 0


def test_changed_file_is_indexed_again(marker_video: MarkerVideo, tmp_path: Path) -> None:
    _, fs, path = _remote(tmp_path, marker_video("h264", 30))
    store = PacketIndexStore(tmp_path / "store")
    old = PacketIndexCache().get(path, filesystem=fs, stamp=FileStamps(fs, ["videos"])[path], store=store)
    remote, fs, path = _remote(tmp_path, marker_video("av1", 2))  # same path, new content
    stamp = FileStamps(fs, ["videos"])[path]
    new = PacketIndexCache().get(path, filesystem=fs, stamp=stamp, store=store)
    assert remote.requests["open"] == 1
    assert (old.codec, new.codec) == ("h264", "av1")
    assert len(list((tmp_path / "store").rglob("*.pidx"))) == 2


def test_a_file_of_another_size_than_listed_is_refused_and_not_stored(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """The listed stamp keys the cached byte ranges and the episodes' times describe the listed file: a file that
    changed since is refused (it was logged and read on, mixing two versions of it)."""
    video = marker_video("h264", 30)
    store = PacketIndexStore(tmp_path / "store")
    stale = FileStamp(video.stat().st_size - 1, "mtime:1")
    with pytest.raises(DatasetError, match=r"bytes but was listed with \d+: it changed .* re-open the dataset"):
        PacketIndexCache().get(str(video), stamp=stale, store=store)
    assert not list((tmp_path / "store").rglob("*.pidx"))


def test_a_local_file_given_a_store_is_indexed_once_for_every_process(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose bounded cache dropped a local file's index loads it from the store (keyed by the file's stat)
    instead of demuxing the file again; a file rewritten since is indexed again; without a store nothing is kept."""
    video = tmp_path / "file-000.mp4"
    shutil.copyfile(marker_video("h264", 30), video)
    store = PacketIndexStore(tmp_path / "store")
    PacketIndexCache().get(str(video))
    assert not (tmp_path / "store").exists()
    for filesystem in (None, fsspec.filesystem("file")):
        index = PacketIndexCache().get(str(video), filesystem=filesystem, store=store)
        assert_identical(index, build_packet_index(video))
    assert len(list((tmp_path / "store").rglob("*.pidx"))) == 1  # (one file, named either way: one entry)

    built: list[tuple] = []
    real_build = packet_index_cache.build_packet_index
    monkeypatch.setattr(
        packet_index_cache, "build_packet_index", lambda *a, **k: built.append(a) or real_build(*a, **k)
    )
    worker_cache, worker_store = pickle.loads(pickle.dumps((PacketIndexCache(), store)))
    assert_identical(worker_cache.get(str(video), store=worker_store), index)
    assert built == []

    shutil.copyfile(marker_video("av1", 2), video)  # rewritten in place: same path, new content
    assert PacketIndexCache().get(str(video), store=store).codec == "av1"
    assert len(built) == 1
    with pytest.raises(MissingDataFileError, match="does not exist"):
        PacketIndexCache().get(str(tmp_path / "gone.mp4"), store=store)


def test_stamped_cache_needs_a_path(marker_video: MarkerVideo) -> None:
    with open(marker_video("h264", 30), "rb") as handle, pytest.raises(TypeError, match="a stamp identifies a path"):
        PacketIndexCache().get(handle, stamp=FileStamp(1, ""))


def _save_repeatedly(directory: str, video: str, times: int) -> None:
    index = build_packet_index(video)
    store = PacketIndexStore(directory)
    stamp = FileStamp(index.file_size_bytes, "etag:x")
    for _ in range(times):
        store.save(_URL, stamp, index)
        loaded = store.load(_URL, stamp)
        if loaded is None or not np.array_equal(loaded.pts, index.pts):
            raise AssertionError("a concurrent reader saw a partial file")


def test_concurrent_saves_from_two_processes(marker_video: MarkerVideo, tmp_path: Path) -> None:
    video = marker_video("h264", 30)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_save_repeatedly, args=(str(tmp_path), str(video), 40)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0]
    index = build_packet_index(video)
    loaded = PacketIndexStore(tmp_path).load(_URL, FileStamp(index.file_size_bytes, "etag:x"))
    assert loaded is not None
    assert_identical(loaded, index)
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".pidx"]


def _index_at_once(root: str, path: str, store_dir: str, stamp: FileStamp, barrier: Any, results: Any) -> None:
    """A DALI worker or a rank: indexes a remote video the moment another process does; reports its builds, its
    requests to the remote and the index's frame count."""
    from lerobot_dali import packet_index_cache

    builds: list[object] = []
    real = packet_index_cache.build_packet_index

    def slow_build(source: object, **kwargs: Any) -> PacketIndex:
        builds.append(source)
        time.sleep(0.5)  # (a moov read over HTTP: the other process misses the store meanwhile)
        return real(source, **kwargs)

    packet_index_cache.build_packet_index = slow_build  # type: ignore[assignment]
    remote = FakeRemoteFileSystem(root)
    barrier.wait(timeout=60)
    index = PacketIndexCache().get(
        path, filesystem=RetryingFileSystem(remote), stamp=stamp, store=PacketIndexStore(store_dir)
    )
    results.put((len(builds), remote.requests["open"], index.frame_count))


def test_two_processes_missing_one_index_at_once_read_the_video_once(marker_video: MarkerVideo, tmp_path: Path) -> None:
    """Two DALI workers (or ranks of a node) that missed the stored index at once both read the video to index it
    (over HTTP, the same requests twice); the second now waits for the first's lock and loads its stored index."""
    remote, fs, path = _remote(tmp_path, marker_video("h264", 30))
    stamp = FileStamps(fs, ["videos"])[path]
    reports = reports_of_processes_at_once(_index_at_once, (remote.root, path, str(tmp_path / "store"), stamp))
    assert sorted(builds for builds, _, _ in reports) == [0, 1], reports
    assert sum(opens for _, opens, _ in reports) == 1, reports
    assert {frames for _, _, frames in reports} == {sum(EPISODE_LENGTHS)}
    assert [p.suffix for p in (tmp_path / "store").rglob("*") if p.is_file()] == [".pidx"]  # (no lock file left)


def test_a_stalled_lock_holder_is_waited_on_for_a_while_and_a_lockless_store_not_at_all(
    marker_video: MarkerVideo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lerobot_dali import packet_index_store
    from lerobot_dali.cache_dirs import try_flock

    video = marker_video("h264", 30)
    index = build_packet_index(video)
    stamp = FileStamp(index.file_size_bytes, "etag:x")
    store = PacketIndexStore(tmp_path / "store")
    url = source_url(str(video))
    entry = store.path_for(url, stamp)
    entry.parent.mkdir(parents=True)
    held = try_flock(entry.with_suffix(".lock"))  # a process that stalls while it indexes the video
    assert held is not None
    monkeypatch.setattr(packet_index_store, "WAIT_S", 0.3)
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        started = time.monotonic()
        assert PacketIndexCache().get(str(video), stamp=stamp, store=store).frame_count == index.frame_count
    held.close()
    assert 0.3 <= time.monotonic() - started < 30
    assert "another process has been indexing" in caplog.text and "indexing it here too" in caplog.text
    assert store.load(url, stamp) is not None
    blocker = tmp_path / "file"  # a store where no lock file can be made: no wait, no warning
    blocker.write_text("a file where the store folder should be")
    monkeypatch.setattr(packet_index_store, "WAIT_S", 60.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        started = time.monotonic()
        PacketIndexCache().get(str(video), stamp=stamp, store=PacketIndexStore(blocker / "store"))
    assert time.monotonic() - started < 30 and "another process" not in caplog.text


def test_a_store_folder_that_cannot_be_opened_loads_nothing_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache folder that is a file (or another user's) holds no damaged entry: each load warned that its entry was
    unreadable and was being deleted, then that it could not be deleted, two warnings per video file and worker."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store folder should be")
    store = PacketIndexStore(blocker / "store")
    with caplog.at_level(logging.WARNING, logger="lerobot_dali.packet_index_store"):
        found = [store.load(_URL, FileStamp(1, version)) for version in ("a", "b")]
    assert found == [None, None]
    assert [r.getMessage() for r in caplog.records if r.name == "lerobot_dali.packet_index_store"] == []


def test_a_stored_index_names_no_credential_its_path_keeps_and_keys_a_file_by_its_other_parameters(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """A filesystem that keeps a URL's query in its paths (``memory://b/ds?token=...``): a stored index's header named
    the token (its URL and its source's name: 2 of 2 entries here). Named masked now: the file's key is its URL so
    masked, so a file of another parameter (``a=2``) is another entry, the file signed anew (another token) the same
    one; a local file's entry is where it was (its key unchanged: an entry stored before is found)."""
    import hashlib

    from lerobot_dali.dataset_location import resolve_location

    video = marker_video("h264", 30)
    stamp = FileStamp(video.stat().st_size, "etag:1")
    store = PacketIndexStore(tmp_path / "store")
    built = []
    for query in ("a=1&token=S3CRhead/T41Ltail", "a=2&token=S3CRhead/T41Ltail", "a=1&token=S3CRother"):
        location = resolve_location(f"memory://bucket/ds-key?{query}")  # (tells this process the token)
        path = location.path("videos/f.mp4")
        location.fs.pipe_file(path, video.read_bytes())
        built.append(PacketIndexCache().get(path, filesystem=location.fs, stamp=stamp, store=store))
    entries = sorted((tmp_path / "store").rglob(f"*{SUFFIX}"))
    assert len(entries) == 2  # (a=1 and a=2; the file signed anew found a=1's)
    assert not [e for e in entries if b"S3CR" in e.read_bytes() or b"T41L" in e.read_bytes()]
    assert built[0].source_name == "/bucket/ds-key?a=1&token=***/videos/f.mp4"
    assert_identical(built[2], built[0])
    local = PacketIndexCache().get(video, stamp=stamp, store=store)
    digest = hashlib.sha256(json.dumps([f"file://{video}", stamp.size, stamp.version]).encode()).hexdigest()
    assert store.path_for(f"file://{video}", stamp) == tmp_path / "store" / digest[:2] / f"{digest}{SUFFIX}"
    assert store.path_for(f"file://{video}", stamp).is_file() and local.source_name == str(video)
