"""A data file whose parquet footer places a column chunk outside the file (a negative offset, a negative size that
puts a row group's start past its end, a size reaching past the file's end): prefetch reckoned the row group's byte
range from it and asked a server for an impossible range (or clamped it in silence). Now the footer is judged once
per file when its ranges are first reckoned, and a DataFileError names the file and says to re-download it, before
any such range is asked. An iterator is refused as it is built, with Arrow's own DataFileError, as it was; no request
reads the whole file.
And ``RetryingFileSystem.cat_file`` refuses bounds that cross, which a server answers with the whole file."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_dali.dataset_reader import open_dataset
from lerobot_dali.episode_ranges import EpisodeRanges, row_group_spans
from lerobot_dali.errors import DataFileError
from lerobot_dali.file_stamps import FileStamp
from lerobot_dali.iterator import DALILeRobotIterator
from lerobot_dali.remote_retry import RetryingFileSystem
from tests.http_server import FolderServer

DATA = "data/chunk-000/file-000.parquet"
#: Episode 0's column ``task_index`` (the last column; dictionary-encoded) and ``observation.state`` (the first).
LAST, FIRST = 6, 0  # (columns: observation.state, action, timestamp, frame_index, episode_index, index, task_index)
DAMAGE = {
    "size_past_the_end": dict(size=10**7),
    "start_past_end": dict(size=-5000),
    "negative_offset": dict(offset=-5),
}


def _dataset(make_ds) -> Path:
    """One data file of 600 rows (121 KB: past the 64 KiB footer read, so its row group is a range of its own)."""
    return make_ds(episodes=2, frames_per_episode=300, episodes_per_file=2, size=(64, 64), codec="h264",
                   state_dim=16, action_dim=16)  # fmt: skip


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _field(header: int, value: int) -> bytes:
    """A Thrift compact i64 field (``header``: its delta and type byte), zigzag-encoded."""
    return bytes([header]) + _varint((value << 1) ^ (value >> 63))


def _damage(path: Path, column: int, *, offset: int | None = None, size: int | None = None) -> None:
    """Row group 0's ``column`` given data_page_offset ``offset`` and total_compressed_size ``size`` in the footer's
    Thrift (ColumnMetaData fields 7 and 9, one field apart, so ``0x16 size 0x26 offset``); the footer's length
    written again."""
    raw = path.read_bytes()
    footer_at = len(raw) - 8 - struct.unpack("<I", raw[-8:-4])[0]
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(column)
    old = _field(0x16, chunk.total_compressed_size) + _field(0x26, chunk.data_page_offset)
    new = _field(0x16, chunk.total_compressed_size if size is None else size)
    new += _field(0x26, chunk.data_page_offset if offset is None else offset)
    footer = raw[footer_at:-8]
    assert footer.count(old) == 1
    footer = footer.replace(old, new)
    path.write_bytes(raw[:footer_at] + footer + struct.pack("<I", len(footer)) + b"PAR1")


def _url(server: FolderServer, root: Path, base: Path) -> str:
    return f"{server.url}/{root.relative_to(base).as_posix()}"


def _data_requests(server: FolderServer) -> list[tuple[str, str | None, int, str]]:
    return [(r.method, r.range, r.status, r.kind) for r in server.records if r.path.endswith(DATA)]


def test_an_undamaged_row_group_spans_its_column_chunks(make_ds) -> None:
    """The one row group runs from just after the leading ``PAR1`` to the footer: its column chunks end to end."""
    path = _dataset(make_ds) / DATA
    raw = path.read_bytes()
    footer_at = len(raw) - 8 - struct.unpack("<I", raw[-8:-4])[0]
    spans = row_group_spans(str(path), len(raw), pq.ParquetFile(path).metadata)
    assert spans.dtype == np.int64 and spans.tolist() == [[4, footer_at]]  # (byte offsets: float64 rounds past 2**53)


def test_a_row_group_of_no_columns_spans_no_bytes(tmp_path) -> None:
    """Arrow writes a table of no columns as one row group of no column chunks: its span is the empty [0, 0)."""
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({}), path)
    meta = pq.ParquetFile(path).metadata
    assert (meta.num_row_groups, meta.row_group(0).num_columns) == (1, 0)
    assert row_group_spans(str(path), path.stat().st_size, meta).tolist() == [[0, 0]]


def test_a_dictionary_page_offset_of_0_is_ignored_as_arrow_ignores_it(make_ds, tmp_path) -> None:
    """A writer that puts 0 in a chunk's dictionary_page_offset (there is no page at byte 0: ``PAR1`` is) has Arrow
    reckon the chunk from its data page (ComputeColumnChunkRange takes an offset above 0 only): so does its span. The
    first column's offset 0 here: the row group then starts at that column's data page, not at byte 0."""
    path = tmp_path / "file.parquet"
    path.write_bytes((_dataset(make_ds) / DATA).read_bytes())
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(FIRST)
    assert chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < chunk.data_page_offset
    raw = path.read_bytes()
    footer_at = len(raw) - 8 - struct.unpack("<I", raw[-8:-4])[0]
    end = int(row_group_spans(str(path), len(raw), pq.ParquetFile(path).metadata)[0, 1])
    # ColumnMetaData fields 9 (data_page_offset) and 11 (dictionary_page_offset), one field apart
    old = _field(0x26, chunk.data_page_offset) + _field(0x26, chunk.dictionary_page_offset)
    footer = raw[footer_at:-8]
    assert footer.count(old) == 1
    footer = footer.replace(old, _field(0x26, chunk.data_page_offset) + _field(0x26, 0))
    path.write_bytes(raw[:footer_at] + footer + struct.pack("<I", len(footer)) + b"PAR1")
    meta = pq.ParquetFile(path).metadata
    assert meta.row_group(0).column(FIRST).dictionary_page_offset == 0
    size = path.stat().st_size
    assert row_group_spans(str(path), size, meta).tolist() == [[chunk.data_page_offset, end]]


def test_an_episodes_first_range_is_the_footer_read_arrow_makes_first(make_ds) -> None:
    """Arrow opens a parquet file by reading its last 64 KiB (footer and metadata): that is the first range prefetch
    asks for, so a cached file opens without a request (the 121 KB file's footer read starts past its byte 0)."""
    root = _dataset(make_ds)
    raw = (root / DATA).read_bytes()
    reads: list[tuple[int, int]] = []

    class Recorded(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            reads.append((self.tell(), size))
            return super().read(size)

    assert pq.ParquetFile(Recorded(raw)).metadata.num_rows == 600
    assert reads[0] == (len(raw) - 65536, 65536)
    assert EpisodeRanges(open_dataset(str(root))).parquet_ranges(0)[0][1:] == (len(raw) - 65536, len(raw))


def test_an_episodes_ranges_hold_the_row_group_of_its_last_row(make_ds) -> None:
    """Rewritten in groups of 299 rows (0-298, 299-597, 598-599): episode 0 (rows 0-299) ends on group 1's first
    row, episode 1 (rows 300-599) on group 2's last; each episode's ranges are the footer's and those groups'."""
    root = _dataset(make_ds)
    path = root / DATA
    pq.write_table(pq.read_table(path), path, row_group_size=299)
    spans = [tuple(span) for span in row_group_spans(str(path), path.stat().st_size, pq.ParquetFile(path).metadata)]
    assert len(spans) == 3
    ranges = EpisodeRanges(open_dataset(str(root)))
    assert [r[1:] for r in ranges.parquet_ranges(0)[1:]] == spans[:2]
    assert [r[1:] for r in ranges.parquet_ranges(1)[1:]] == spans[1:]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_footer_is_refused_before_any_range_is_asked(
    make_ds, copy_ds, tmp_path_factory, basetemp_server: FolderServer, damage: str
) -> None:
    root = copy_ds(_dataset(make_ds))
    column = FIRST if damage == "negative_offset" else LAST
    _damage(root / DATA, column, **DAMAGE[damage])
    url = _url(basetemp_server, root, tmp_path_factory.getbasetemp())
    ranges = EpisodeRanges(open_dataset(url))
    basetemp_server.reset_stats()
    with pytest.raises(DataFileError) as raised:
        ranges.parquet_ranges(0)
    chunk = pq.ParquetFile(_dataset(make_ds) / DATA).metadata.row_group(0).column(column)
    begin = chunk.dictionary_page_offset if damage != "negative_offset" else -5  # (-5: before the dictionary)
    end = begin + DAMAGE[damage].get("size", chunk.total_compressed_size)
    size = (root / DATA).stat().st_size
    assert str(raised.value) == (
        f"{url}/{DATA}: its parquet footer is damaged: row group 0's column {chunk.path_in_schema!r} claims bytes "
        f"[{begin}, {end}) of a file of {size} bytes; re-download the file (or re-write it from its source)"
    )
    footer = f"bytes={size - 64 * 1024}-{size - 1}"
    assert _data_requests(basetemp_server) == [("GET", footer, 206, "range")]  # (the footer Arrow reads, alone)
    with pytest.raises(DataFileError):  # (judged once: the second episode of the file is refused as well, asking none)
        ranges.parquet_ranges(1)
    assert len(_data_requests(basetemp_server)) == 1


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("damage", DAMAGE)
def test_an_iterator_over_a_damaged_footer_is_refused_reading_no_whole_file(
    make_ds, copy_ds, tmp_path_factory, basetemp_server: FolderServer, caplog, tmp_path, damage: str, workers: int
) -> None:
    root = copy_ds(_dataset(make_ds))
    _damage(root / DATA, FIRST if damage == "negative_offset" else LAST, **DAMAGE[damage])
    url = _url(basetemp_server, root, tmp_path_factory.getbasetemp())
    basetemp_server.reset_stats()
    said = rf"{url}/{DATA}: reading rows \[\d+, [36]00\) failed \(Invalid column metadata \(corrupt file\?\)\); "
    with pytest.raises(DataFileError, match=said + "the file is truncated or corrupt: re-download or rewrite it$"):
        # (refused as it is built where a column it reads of each file's first episode is damaged, else in the pass)
        it = DALILeRobotIterator(url, batch_size=4, device="cpu", num_workers=workers, cache_dir=tmp_path, cache_gb=1.0)
        try:
            for _ in it:
                pass
        finally:
            it.close()
    if damage == "negative_offset":  # (a column the build does not read: the prefetcher reckoned its ranges)
        warned = f"{url}: prefetching epoch 0 from position 0 failed (DataFileError: {url}/{DATA}: its parquet footer "
        assert (
            warned + "is damaged: row group 0's column 'observation.state.list.element' claims bytes [-5, "
            in caplog.text
        )
    asked = _data_requests(basetemp_server)
    assert asked and all(kind == "range" for method, _, _, kind in asked if method == "GET")
    size = (root / DATA).stat().st_size
    for _, spec, _, _ in asked:  # (each range one the file holds, and none all of it)
        if spec is not None:
            first, last = map(int, spec.removeprefix("bytes=").split("-"))
            assert 0 <= first <= last < size and last - first + 1 < size


def test_cat_file_refuses_bounds_that_cross_asking_nothing(make_ds, tmp_path_factory, basetemp_server) -> None:
    """Sent as ``Range: bytes=3000-99``, a server ignores the header and answers 200 with the whole file, which
    cat_file returned as the range (6,782 bytes for none)."""
    path = _dataset(make_ds) / DATA
    url = f"{_url(basetemp_server, path, tmp_path_factory.getbasetemp())}"
    fs = RetryingFileSystem(fsspec.filesystem("http"))
    basetemp_server.reset_stats()
    with pytest.raises(ValueError, match=rf"^bytes \[3000, 100\) of {url} asked: a range cannot start past its end$"):
        fs.cat_file(url, 3000, 100)
    assert basetemp_server.records == []
    assert fs.cat_file(url, 3000, 3100) == path.read_bytes()[3000:3100]


def test_cat_file_resolves_bounds_of_mixed_signs_by_the_file_s_size(make_ds, tmp_path_factory, basetemp_server) -> None:
    """``[-5, 100)`` of an unstamped file went to fsspec's HTTP read as ``Range: bytes=6777-99`` (its start resolved,
    its end not): ignored, the whole file (6,782 bytes) came back as the range. One bound from the end and one from
    the start are now resolved by the file's size first: crossing, refused; else read as that range and checked."""
    path = _dataset(make_ds) / DATA
    data = path.read_bytes()
    url = f"{_url(basetemp_server, path, tmp_path_factory.getbasetemp())}"
    fs = RetryingFileSystem(fsspec.filesystem("http"))
    basetemp_server.reset_stats()
    with pytest.raises(ValueError, match=rf"^bytes \[{len(data) - 5}, 100\) of {url} asked: a range cannot start"):
        fs.cat_file(url, -5, 100)
    assert [r.method for r in basetemp_server.records] == ["HEAD"]  # (its size: no range asked)
    assert fs.cat_file(url, -100, len(data) - 10) == data[-100:-10]
    assert fs.cat_file(url, 3000, -3000) == data[3000:-3000]
    assert fs.cat_file(url, -10 * len(data), 40) == data[:40]
    ranges = [r.range for r in basetemp_server.records if r.range is not None]
    assert ranges == [f"bytes={len(data) - 100}-{len(data) - 11}", f"bytes=3000-{len(data) - 3001}", "bytes=0-39"]


def test_cat_file_resolves_bounds_from_the_end_by_the_stamped_size(make_ds, tmp_path_factory, basetemp_server) -> None:
    """Bounds from the file's end of a stamped file went to fsspec unresolved: it asked the server for the size the
    stamp holds (a HEAD per read) and the answer was handed out unchecked."""
    path = _dataset(make_ds) / DATA
    data = path.read_bytes()
    url = f"{_url(basetemp_server, path, tmp_path_factory.getbasetemp())}"
    fs = RetryingFileSystem(fsspec.filesystem("http"))
    fs.pin({url: FileStamp(len(data))})
    basetemp_server.reset_stats()
    assert fs.cat_file(url, -100, -10) == data[-100:-10]
    with pytest.raises(ValueError, match=r"a range cannot start past its end$"):
        fs.cat_file(url, -5, 100)  # (no request)
    assert fs.cat_file(url, 3000, -3000) == data[3000:-3000]
    assert [(r.method, r.range) for r in basetemp_server.records] == [
        ("GET", f"bytes={len(data) - 100}-{len(data) - 11}"),
        ("GET", f"bytes=3000-{len(data) - 3001}"),
    ]


class _ResetFile(io.BytesIO):
    """A remote file whose reads fail as the network does: the connection reset (after the retries)."""

    def read(self, size: int | None = -1) -> bytes:
        raise ConnectionResetError(104, "Connection reset by peer")


def _read_through_damaged_parquet_as() -> None:
    from lerobot_dali.episode_rows import damaged_parquet_as

    with damaged_parquet_as(DataFileError, "data.parquet"):
        pq.ParquetFile(_ResetFile(b"PAR1" * 4))


def _opened_by_open_parquet() -> None:
    from lerobot_dali.episode_rows import open_parquet

    open_parquet(lambda path: _ResetFile(b"PAR1" * 4), "data.parquet")


@pytest.mark.parametrize("read", [_read_through_damaged_parquet_as, _opened_by_open_parquet])
def test_a_network_failure_reading_a_footer_is_raised_as_itself_not_as_a_damaged_file(read) -> None:
    """The file is not to blame for a reset connection: re-downloading it is not the fix, so it is not told as
    a DataFileError (both ways a footer is read)."""
    with pytest.raises(ConnectionResetError):
        read()
