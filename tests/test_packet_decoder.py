"""The decoder of a request's packets alone (remote MP4s, and local ones read by byte range)."""

from __future__ import annotations

import gc

import av

from lerobot_dali.clips import plan_clip, read_packet_payloads
from lerobot_dali.packet_decoder import PacketDecoder
from lerobot_dali.packet_index import build_packet_index
from tests.video_fixtures import MarkerVideo


def test_packet_decoding_keeps_no_frame_it_does_not_return(marker_video: MarkerVideo) -> None:
    """A clip's frames were all held until its last was decoded, so the decoder's frame pool grew to the clip's
    length and kept it (+6 MB per open 640x480 decoder after an 18-frame clip): frames are now converted as they
    come out and the others dropped at once."""
    path = marker_video("h264", 30)
    index = build_packet_index(path)
    plan = plan_clip(index, [28, 29])
    assert plan.frame_count == 30
    alive: list[int] = []

    def convert(frame: av.VideoFrame) -> int:
        alive.append(sum(type(o) is av.VideoFrame for o in gc.get_objects()))
        return int(frame.pts)

    decoder = PacketDecoder(index, threads=1)
    assert decoder.frames_at(index, plan, read_packet_payloads(path, index, plan), convert) == {28: 28, 29: 29}
    assert max(alive) <= 5, alive  # (the frame converted, those handed over with it, the decoder's references)
    decoder.close()
