"""The passes ``check --decode`` keeps (:mod:`.verified_decode_store`): what a check again skips is only what an
entry holds at the file's stamp now, and an entry that cannot be read or written costs decodes, never a wrong pass."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lerobot_dali import verified_decode_store
from lerobot_dali.file_format_store import STAMPS_PER_FILE
from lerobot_dali.verified_decode_store import (
    VerifiedDecodeStore,
    decoder_versions,
    local_image_verdict,
    local_verdict,
)


def test_a_verdict_is_the_files_stamp_now_and_the_frames(tmp_path: Path) -> None:
    video = tmp_path / "a.mp4"
    video.write_bytes(b"x" * 10)
    frames = np.arange(4)
    verdict = local_verdict(str(video), frames)
    assert verdict is not None and verdict[:2] == (str(video), 10) and verdict[2].startswith("stat:")
    assert local_verdict(str(video), frames) == verdict
    assert local_verdict(str(video), np.arange(1, 5)) != verdict  # (other frames)
    st = video.stat()
    video.write_bytes(b"y" * 10)
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))  # (size and mtime as they were: its ctime is another)
    assert local_verdict(str(video), frames) != verdict
    assert local_verdict(None, frames) is None and local_verdict(str(tmp_path / "gone.mp4"), frames) is None
    versions = decoder_versions()
    assert "pyav" in versions and any(name == "libavcodec" for name, _ in versions[-1])


def test_an_image_verdict_names_the_camera_rows_kind_size_and_pillow(tmp_path: Path, monkeypatch) -> None:
    """An episode's images of a camera in a data file: another camera, other rows, depth or colour, another size they
    are held to (the camera's first image, maybe in another file) or another Pillow is another pass."""
    data = tmp_path / "file-000.parquet"
    data.write_bytes(b"x" * 10)
    verdict = local_image_verdict(str(data), "cam", range(6, 12), depth=False, shape=(30, 40, 3))
    assert verdict is not None and verdict[:2] == (str(data), 10) and verdict[2].startswith("stat:")
    others = [
        local_image_verdict(str(data), "top", range(6, 12), depth=False, shape=(30, 40, 3)),
        local_image_verdict(str(data), "cam", range(6, 13), depth=False, shape=(30, 40, 3)),
        local_image_verdict(str(data), "cam", range(6, 12), depth=True, shape=(30, 40, 3)),
        local_image_verdict(str(data), "cam", range(6, 12), depth=False, shape=(30, 40, 1)),
        local_image_verdict(str(data), "cam", range(6, 12), depth=False, shape=None),
    ]
    monkeypatch.setattr(verified_decode_store, "_pillow", lambda: "0.0")
    others.append(local_image_verdict(str(data), "cam", range(6, 12), depth=False, shape=(30, 40, 3)))
    assert len({verdict, *others}) == 7 and {v[:3] for v in others} == {verdict[:3]}  # (one file, one stamp)
    assert local_image_verdict(None, "cam", range(6), depth=False, shape=None) is None


def test_passes_merge_and_each_file_keeps_its_newest_stamps(tmp_path: Path) -> None:
    store = VerifiedDecodeStore(tmp_path)
    store.keep("/data/a", [("/data/a/v.mp4", 1, "stat:1", "f0")])
    store.keep("/data/a", [("/data/a/v.mp4", 1, "stat:1", "f1"), ("/data/a/w.mp4", 2, "stat:2", "f0")])
    assert store.verdicts("/data/a") == [
        ("/data/a/v.mp4", 1, "stat:1", "f0"),
        ("/data/a/v.mp4", 1, "stat:1", "f1"),
        ("/data/a/w.mp4", 2, "stat:2", "f0"),
    ]
    assert store.verdicts("/data/b") == []  # (an entry per dataset)
    # A file rewritten again and again: only its last stamps' passes are kept.
    store.keep("/data/a", [("/data/a/v.mp4", 1, f"stat:{n}", "f0") for n in range(2, 2 + STAMPS_PER_FILE)])
    kept = store.verdicts("/data/a")
    assert {version for path, _, version, _ in kept if path.endswith("v.mp4")} == {
        f"stat:{n}" for n in range(2, 2 + STAMPS_PER_FILE)
    }
    assert ("/data/a/w.mp4", 2, "stat:2", "f0") in kept


@pytest.mark.parametrize("locks", [True, False], ids=["flock", "no-locks"])
def test_checks_keeping_passes_at_once_each_keep_theirs(tmp_path: Path, monkeypatch, locks) -> None:
    """Checks of one dataset at once (each of other episodes) each read the entry, merged their passes in and wrote it:
    the last to write dropped what another wrote meanwhile (gr00t_v20_h264, 5 checks of one episode each at once: 2
    episodes' passes lost in 1 of 13 runs). They now merge one at a time, under a lock beside the entry, or where the
    filesystem takes none (NFS without its lock daemon), by renames (8 checks of 5 files each there: 20-30 of 41
    passes lost in 10 of 10 runs; none now)."""
    if not locks:

        def no_locks(fd: int, operation: int) -> None:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

        monkeypatch.setattr(fcntl, "flock", no_locks)
    store = VerifiedDecodeStore(tmp_path)
    mine, theirs = ("/data/a/v.mp4", 1, "stat:1", "f0"), ("/data/a/w.mp4", 2, "stat:2", "f0")
    plain = verified_decode_store._with_newest
    other = threading.Thread(target=lambda: store.keep("/data/a", [theirs]))

    def merge_as_another_check_keeps(kept: list, new: list) -> list:
        if threading.current_thread() is threading.main_thread() and other.ident is None:
            other.start()  # (another check's write, between this one's read and its write)
            other.join(timeout=1.0)  # (at once, where nothing holds it back; under the lock it waits for this write)
        return plain(kept, new)

    monkeypatch.setattr(verified_decode_store, "_with_newest", merge_as_another_check_keeps)
    store.keep("/data/a", [mine])
    other.join()
    assert sorted(store.verdicts("/data/a")) == [mine, theirs]
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".verified"]  # (no lock, nothing taken left)


def test_a_damaged_entry_is_deleted_and_an_unwritable_folder_warned_of(tmp_path: Path, caplog) -> None:
    store = VerifiedDecodeStore(tmp_path / "store")
    store.keep("/data/a", [("/data/a/v.mp4", 1, "stat:1", "f0")])
    entry = store.entry_for("/data/a")
    entry.write_bytes(entry.read_bytes()[:-5])  # (a write cut short)
    with caplog.at_level(logging.WARNING):
        assert store.verdicts("/data/a") == []
    assert "verified decode cache" in caplog.text and not entry.exists()
    blocked = VerifiedDecodeStore(tmp_path / "a file")
    (tmp_path / "a file").write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        blocked.keep("/data/a", [("/data/a/v.mp4", 1, "stat:1", "f0")])  # (never raised)
    assert "every check decodes them again: make it a writable folder" in caplog.text
    assert blocked.verdicts("/data/a") == []


def test_a_filesystem_without_locks_or_hard_links_still_keeps_passes(tmp_path: Path, monkeypatch) -> None:
    """Merging by renames links the merged entry in; where the filesystem makes no hard links (FAT, some FUSE
    mounts: EPERM) it replaces the entry as a write without a lock does."""

    def refused(code: int) -> Any:
        def call(*args: object) -> None:
            raise OSError(code, os.strerror(code))

        return call

    monkeypatch.setattr(fcntl, "flock", refused(errno.ENOLCK))
    monkeypatch.setattr(os, "link", refused(errno.EPERM))
    store, verdict = VerifiedDecodeStore(tmp_path), ("/data/a/v.mp4", 1, "stat:1", "f0")
    store.keep("/data/a", [verdict])
    store.keep("/data/a", [(*verdict[:3], "f1")])
    assert store.verdicts("/data/a") == [verdict, (*verdict[:3], "f1")]
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".verified"]
