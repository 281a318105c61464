"""The decoder of a request's packets alone (remote MP4s, and local ones read by byte range)."""

from __future__ import annotations

import gc
import re
import shutil
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_dali.clips import plan_clip, read_packet_payloads
from lerobot_dali.cpu_decode import CpuDecodeOptions, CpuDecoderBackend, CpuFrameDecoder
from lerobot_dali.errors import VideoDecodeError
from lerobot_dali.packet_decoder import PacketDecoder
from lerobot_dali.packet_index import build_packet_index
from tests.test_corrupt_frames import _damage_keyframe
from tests.video_fixtures import MarkerVideo, reference_frames


def test_packet_decoding_keeps_no_frame_it_does_not_return(marker_video: MarkerVideo) -> None:
    """A clip's frames were all held until its last was decoded, so the decoder's frame pool grew to the clip's
    length and kept it (+6 MB per open 640x480 decoder after an 18-frame clip): frames are now converted as they
    come out and the others dropped at once."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [28, 29])
    assert plan.frame_count == 30
    alive: list[int] = []

    def frames_alive() -> int:  # (the whole process's: less those earlier tests left, counted before)
        return sum(type(o) is av.VideoFrame for o in gc.get_objects())

    def convert(frame: av.VideoFrame) -> int:
        alive.append(frames_alive() - before)
        return int(frame.pts)

    decoder = PacketDecoder(index, threads=1)
    gc.collect()
    before = frames_alive()
    assert decoder.frames_at(index, plan, read_packet_payloads(path, index, plan), convert) == {28: 28, 29: 29}
    assert max(alive) <= 5, alive  # (the frame converted, those handed over with it, the decoder's references)
    decoder.close()


def _open_input_containers() -> int:
    gc.collect()
    # (type(), not isinstance(): that asks each object its __class__, and torch's deprecated reduce_op warns when asked)
    return sum(type(o) is av.container.InputContainer for o in gc.get_objects())


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_packet_decoder_keeps_no_template_container(marker_video: MarkerVideo, codec: str) -> None:
    """The template's container was kept open for the decoder's life though only its codec context is used; it
    held FFmpeg's stream-probing decoder (+280 KB per open H.264 decoder): it is closed after set-up, and the codec
    context that outlives it decodes every frame exactly (B-frames in the H.264 and HEVC files)."""
    path = marker_video(codec, 6)
    index = build_packet_index(path)
    before = _open_input_containers()
    decoder = PacketDecoder(index, threads=1)
    assert _open_input_containers() == before
    plan = plan_clip(index, [3, 10, 11, 40])
    found = decoder.frames_at(
        index, plan, read_packet_payloads(path, index, plan), lambda frame: frame.to_ndarray(format="rgb24")
    )
    reference = reference_frames(path, keep_pts=index.pts_of_frames([3, 10, 11, 40]).tolist())
    assert len(found) == 4
    for frame, expected in zip((found[rank] for rank in sorted(found)), sorted(reference.items()), strict=True):
        np.testing.assert_array_equal(frame, expected[1])
    decoder.close()


def test_a_decoder_shared_by_files_of_one_template_names_the_file_decoded(
    marker_video: MarkerVideo, tmp_path: Path
) -> None:
    """Files whose stream template is the same (codec parameters and first keyframe: a simulator's episodes may all
    start alike) share one kept decoder, and its errors named the file it was opened for: the damaged file's fault was
    told of the sound one, which a user would download again for nothing."""
    sound = marker_video("h264", 30)
    damaged = tmp_path / "damaged.mp4"
    shutil.copy(sound, damaged)
    _damage_keyframe(damaged, build_packet_index(sound), 30)
    decoder = CpuFrameDecoder(options=CpuDecodeOptions(backend=CpuDecoderBackend.PYAV))
    try:
        for path in (sound, damaged):
            index = build_packet_index(path)
            assert index.template == build_packet_index(sound).template  # (else this tests nothing)
            plan = plan_clip(index, [31])
            payloads = read_packet_payloads(path, index, plan)
            if path == sound:
                decoder.decode_packets(index, plan, payloads)
                continue
            with pytest.raises(VideoDecodeError, match=rf"^{re.escape(str(damaged))}: the decoder flagged the frame"):
                decoder.decode_packets(index, plan, payloads)
    finally:
        decoder.close()


class _MisshowingCodec:
    """A codec context whose decoder misshows what it decodes: each frame twice (``repeat``), or the frame of pts
    ``inter_pts`` as an inter picture; a decoder of a damaged or odd stream may do either, and says nothing."""

    def __init__(self, codec: object, *, repeat: bool = False, inter_pts: int | None = None) -> None:
        self.codec, self.repeat, self.inter_pts = codec, repeat, inter_pts

    def decode(self, packet: av.Packet | None) -> list[av.VideoFrame]:
        frames = []
        for frame in self.codec.decode(packet):  # type: ignore[attr-defined]
            if frame.pts == self.inter_pts:
                frame.pict_type = av.video.frame.PictureType.P
            frames.extend([frame, frame] if self.repeat else [frame])
        return frames

    def flush_buffers(self) -> None:
        self.codec.flush_buffers()  # type: ignore[attr-defined]


def test_a_frame_shown_twice_is_refused_as_out_of_order(marker_video: MarkerVideo) -> None:
    """Each packet carries its own display rank as pts, so a frame shown twice (equal pts) is a decoder misshowing the
    stream, as a swap is: refused like one (pts equal counts as out of order), not handed over for the next frame."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [3, 4])
    decoder = PacketDecoder(index, threads=1)
    decoder.codec = _MisshowingCodec(decoder.codec, repeat=True)  # type: ignore[assignment]
    with pytest.raises(
        VideoDecodeError, match=r"shows frames in another order .*\(pts 0\.000000 s after 0\.000000 s\)"
    ):
        decoder.frames_at(index, plan, read_packet_payloads(path, index, plan), lambda frame: frame.pts)
    decoder.close()


def test_a_keyframe_shown_as_an_inter_picture_is_refused(marker_video: MarkerVideo) -> None:
    """A run's keyframe must show first as an intra picture: one shown as an inter picture (a sync sample that is no
    random-access point) is refused, naming its time, where its frames would be predicted from pictures never fed.
    The same request decodes exactly from a sound decoder (so the refusal is the keyframe's alone)."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [31, 32])
    payloads = read_packet_payloads(path, index, plan)
    decoder = PacketDecoder(index, threads=1)
    sound = decoder.codec
    decoder.codec = _MisshowingCodec(sound, inter_pts=0)  # type: ignore[assignment]  # (rank 0: the run's keyframe)
    with pytest.raises(
        VideoDecodeError, match=r"the keyframe at pts 1\.000000 s is not an intra picture when decoding"
    ):
        decoder.frames_at(index, plan, payloads, lambda frame: frame.pts)
    decoder.codec = sound
    found = decoder.frames_at(index, plan, payloads, lambda frame: frame.to_ndarray(format="rgb24"))
    reference = reference_frames(path, keep_pts=index.pts_of_frames([31, 32]).tolist())
    assert sorted(found) == [1, 2]  # (ranks in the clip: keyframe 30 is rank 0)
    for rank, pts in zip((1, 2), sorted(reference), strict=True):
        np.testing.assert_array_equal(found[rank], reference[pts])
    decoder.close()


def test_a_wanted_frame_that_never_comes_out_is_refused(marker_video: MarkerVideo) -> None:
    """An AV1 clip whose last packet (frame 29's) holds a temporal delimiter alone: the decoder takes it without error
    and shows no frame for it, so frame 29 of the two asked for never comes out; the request is refused, not answered
    with frame 28 alone."""
    path = marker_video("av1", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [28, 29])
    payloads = read_packet_payloads(path, index, plan)
    payloads[-1] = b"\x12\x00"  # (an OBU_TEMPORAL_DELIMITER of no payload)
    decoder = PacketDecoder(index, threads=1)
    with pytest.raises(VideoDecodeError, match="1 of 2 requested frames did not come out of the decoder"):
        decoder.frames_at(index, plan, payloads, lambda frame: int(frame.pts))
    decoder.close()


@pytest.mark.parametrize("position", [0, -1])
def test_a_packet_the_decoder_refuses_in_a_flagged_keyframes_run_is_a_decoding_failure(
    marker_video: MarkerVideo, position: int
) -> None:
    """An H.264 clip whose keyframe or last packet is an access unit delimiter alone, which FFmpeg refuses (invalid
    data): the clip starts at a keyframe flagged as one, so it is a damaged file's decoding failure, not a file cut
    mid-GOP (whose first packet is no keyframe)."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [28, 29])
    payloads = read_packet_payloads(path, index, plan)
    payloads[position] = (
        b"\x00\x00\x00\x02\x09\xf0"  # (a 2-byte NAL unit of type 9, as the stream's 4-byte lengths give it)
    )
    decoder = PacketDecoder(index, threads=1)
    with pytest.raises(
        VideoDecodeError, match=r"h264_g30\.mp4: decoding failed \(.*; 30 packets\); the file is corrupt"
    ):
        decoder.frames_at(index, plan, payloads, lambda frame: int(frame.pts))
    decoder.close()
