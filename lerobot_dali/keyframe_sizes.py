"""Streams whose frame size changes at a keyframe, found when the packet index is built.

AV1, VP9, H.264 and HEVC let any keyframe start a new frame size, so files of several sizes stream-copied into one
(as LeRobot's v3.0 concatenation makes one file of many episodes) are valid streams whose frames change size part-way,
while the container names one size. One camera's batches need one size; PyAV's route refuses such a frame only when
a batch reaches it, and DALI's decoders fail on it or decode it wrongly. So each keyframe's header is read: a VP9
keyframe names its size (:mod:`.vp9_frame_size`); an AV1, H.264 or HEVC keyframe whose in-band sequence headers
(:mod:`.sequence_headers`) differ from the first keyframe's (any, where the first carries none) is decoded alone by
FFmpeg, once per distinct headers.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
from av.video.codeccontext import VideoCodecContext

from . import fork_locks
from .errors import VideoDecodeError
from .random_access import nal_layout
from .sequence_headers import SEQUENCE_HEADER_CODECS, ReadBytes, keyframe_sequence_headers
from .vp9_frame_size import VP9_HEADER_BYTES, vp9_keyframe_size

__all__ = [
    "KEYFRAME_SIZE_CODECS",
    "PacketBytes",
    "ReadAt",
    "check_clip_keyframe_sizes",
    "check_keyframe_sizes",
]

#: Codecs whose keyframes are checked.
KEYFRAME_SIZE_CODECS = SEQUENCE_HEADER_CODECS | {"vp9"}
_CODEC_NAMES = {"av1": "AV1", "h264": "H.264", "hevc": "HEVC", "vp9": "VP9"}


#: Reads ``length`` bytes of the file from byte ``offset`` of it.
ReadAt = Callable[[int, int], bytes]

# Bytes read at once from a keyframe: a VP9 header, an AV1 sequence header, x264's SPS and PPS fit.
_CHUNK_BYTES = 64


class PacketBytes:
    """Bytes of a file's packets: from ``heads`` (row -> the packet's first bytes, where already read), else through
    ``read_at`` at the row's byte offset in ``table`` (columns pts, dts, offset, size; None: only ``heads``)."""

    def __init__(self, table: np.ndarray, heads: dict[int, bytes], read_at: ReadAt | None) -> None:
        self._table, self._heads, self._read_at = table, heads, read_at

    def reader(self, row: int) -> ReadBytes | None:
        """Reads packet ``row`` from a byte of it, :data:`_CHUNK_BYTES` or more a read; None when neither its head
        nor the file can be read."""
        buffer, buffer_start = self._heads.get(row, b""), 0
        read_at = self._read_at
        if not buffer and read_at is None:
            return None
        offset, size = int(self._table[row, 2]), int(self._table[row, 3])

        def read(start: int, length: int) -> bytes:
            nonlocal buffer, buffer_start
            inside = buffer_start <= start and start + length <= buffer_start + len(buffer)
            if not inside and read_at is not None:
                buffer_start, buffer = start, read_at(offset + start, min(max(length, _CHUNK_BYTES), size - start))
            return buffer[start - buffer_start : start - buffer_start + length]

        return read

    def size(self, row: int) -> int:
        """Packet ``row``'s size in bytes."""
        return int(self._table[row, 3])

    def whole(self, row: int) -> bytes | None:
        """Packet ``row``'s bytes, or None when the file cannot be read (only heads are known)."""
        size = int(self._table[row, 3])
        head = self._heads.get(row, b"")
        if len(head) >= size:
            return head[:size]
        return None if self._read_at is None else self._read_at(int(self._table[row, 2]), size)


def size_change_error(
    label: str, codec: str, *, seconds: float, found: tuple[int, int], size: tuple[int, int]
) -> VideoDecodeError:
    """The error for a keyframe shown at ``seconds`` of ``found`` size (width, height) in a stream of ``size``."""
    name = _CODEC_NAMES.get(codec, codec)
    return VideoDecodeError(
        f"{label}: the {name} stream changes frame size: its keyframe at {seconds:.6f} s is {found[0]}x{found[1]} "
        f"(WxH), the stream {size[0]}x{size[1]} (videos of several sizes stream-copied into one file?); one camera's "
        f"frames must share one size: re-encode the file at one size (e.g. ffmpeg -i IN -vf scale={size[0]}:{size[1]} "
        "OUT)."
    )


def _check_vp9_keyframe_size(head: bytes, *, size: tuple[int, int], label: str, seconds: float) -> None:
    """Raise :func:`size_change_error` when ``head`` starts a VP9 keyframe (shown at ``seconds``) whose size is not
    the stream's ``size`` (width, height)."""
    found = vp9_keyframe_size(head)
    if found is not None and found != size:
        raise size_change_error(label, "vp9", seconds=seconds, found=found, size=size)


def check_keyframe_sizes(
    context: VideoCodecContext,
    rows: Iterable[int],
    packets: PacketBytes,
    *,
    pts: np.ndarray,
    time_base: Fraction,
    length_size: int,
    label: str,
) -> None:
    """Raise :func:`size_change_error` for the first of keyframe ``rows`` (decode positions) whose frame size is not
    the stream's (``context``: the demuxer's codec context). Keyframes ``packets`` cannot read go unchecked."""
    codec = context.codec.canonical_name
    size = (int(context.width), int(context.height))
    reference: tuple[bytes, ...] | None = None
    decoded: dict[tuple[bytes, ...], tuple[int, int] | None] = {}
    for row in rows:
        read = packets.reader(row)
        if read is None:
            continue
        found: tuple[int, int] | None
        if codec == "vp9":
            found = vp9_keyframe_size(read(0, VP9_HEADER_BYTES))
        else:
            headers = keyframe_sequence_headers(codec, read, packets.size(row), length_size=length_size)
            if reference is None and headers is not None:
                reference = headers  # (the first keyframe's, maybe none: the stream's size is the first frame's)
                continue
            if not headers or headers == reference:
                continue
            if headers not in decoded:
                payload = packets.whole(row)
                decoded[headers] = (
                    None if payload is None else _decoded_size(context.codec.name, context.extradata, payload)
                )
            found = decoded[headers]
        if found is not None and found != size:
            seconds = float(int(pts[row]) * time_base)
            raise size_change_error(label, codec, seconds=seconds, found=found, size=size)


def check_clip_keyframe_sizes(
    template: bytes, codec: str, keyframes: Iterable[tuple[float, bytes]], *, size: tuple[int, int], label: str
) -> None:
    """Raise :func:`size_change_error` for the first of a clip's ``keyframes`` (seconds shown, payload) whose frame
    size is not the stream's ``size`` (width, height): the packet index of a remote file reads only its first packets.

    ``template`` is the index's one-keyframe MP4 (:attr:`~lerobot_dali.packet_index.PacketIndex.template`): its
    keyframe's sequence headers are the stream's; a keyframe with others is decoded alone, once per process.
    """
    if codec == "vp9":
        for seconds, payload in keyframes:
            _check_vp9_keyframe_size(payload, size=size, label=label, seconds=seconds)
        return
    if codec not in SEQUENCE_HEADER_CODECS:
        return
    facts = _template_facts(template, codec)
    if facts is None:
        return
    for seconds, payload in keyframes:
        headers = keyframe_sequence_headers(codec, _reader(payload), len(payload), length_size=facts.length_size)
        if not headers or headers == facts.reference:
            continue
        if headers not in facts.decoded:
            facts.decoded[headers] = _decoded_size(facts.decoder, facts.extradata, payload)
        found = facts.decoded[headers]
        if found is not None and found != size:
            raise size_change_error(label, codec, seconds=seconds, found=found, size=size)


@dataclass(frozen=True)
class _TemplateFacts:
    decoder: str
    extradata: bytes | None
    length_size: int
    #: The sequence headers of the template's keyframe.
    reference: tuple[bytes, ...] | None
    #: Sequence headers -> the size of a keyframe carrying them, decoded alone (None: it decodes to nothing).
    decoded: dict[tuple[bytes, ...], tuple[int, int] | None] = field(default_factory=dict)


# Templates of the files whose clips were checked last, in this process (a template is a few KB).
_TEMPLATE_FACTS_SIZE = 64
_template_facts_cache: OrderedDict[bytes, _TemplateFacts | None] = OrderedDict()
_template_facts_lock = fork_locks.lock()


def _template_facts(template: bytes, codec: str) -> _TemplateFacts | None:
    """What :func:`check_clip_keyframe_sizes` needs of ``template``, read once per process; None for an Annex B
    stream (its NAL units are not read)."""
    with _template_facts_lock:
        if template in _template_facts_cache:
            _template_facts_cache.move_to_end(template)
            return _template_facts_cache[template]
    with av.open(io.BytesIO(template), mode="r") as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        payload = next((bytes(packet) for packet in container.demux(stream) if packet.size), b"")
    layout = nal_layout(codec, context.extradata)
    facts = None
    if layout is not None or codec == "av1":
        length_size = layout.length_size if layout is not None else 4
        reference = keyframe_sequence_headers(codec, _reader(payload), len(payload), length_size=length_size)
        facts = _TemplateFacts(context.codec.name, context.extradata, length_size, reference)
    with _template_facts_lock:
        _template_facts_cache[template] = facts
        while len(_template_facts_cache) > _TEMPLATE_FACTS_SIZE:
            _template_facts_cache.popitem(last=False)
    return facts


def _reader(data: bytes) -> ReadBytes:
    return lambda start, length: data[start : start + length]


def _decoded_size(decoder_name: str, extradata: bytes | None, payload: bytes) -> tuple[int, int] | None:
    """(width, height) of the first frame FFmpeg's ``decoder_name`` decodes from the keyframe ``payload`` alone (with
    the stream's ``extradata``), or None when it decodes none (a damaged packet is the decoders' to report)."""
    decoder = av.CodecContext.create(decoder_name, "r")
    assert isinstance(decoder, VideoCodecContext)  # (a video codec's name)
    decoder.extradata = extradata
    try:
        frames = [*decoder.decode(av.Packet(payload)), *decoder.decode(None)]
    except av.error.FFmpegError:
        return None
    return (frames[0].width, frames[0].height) if frames else None
