"""Checks of the frames a decoder hands over: damage that FFmpeg conceals rather than fails on.

FFmpeg decodes a damaged frame, a keyframe that is no random-access point, or timestamps out of the decoder's order
without an error, into frames that are not the file's. The CPU fallback's readers check every frame they decode with
these, and ``lerobot-dali reencode`` refuses such a file as they do.
"""

from __future__ import annotations

import av
from av.video.frame import PictureType

from .errors import VideoDecodeError
from .packet_index import PacketIndex

__all__ = ["check_random_access", "damaged_frame_error", "is_damaged", "mid_gop_error", "out_of_order_error"]


def is_damaged(frame: av.VideoFrame, index: PacketIndex) -> bool:
    """Whether a decoded frame is damaged: FFmpeg flags it corrupt (``frame.is_corrupt``), or it has another size
    than the stream's (a damaged in-band header: AV1's sequence header made a GOP decode as 1x1 frames).

    FFmpeg conceals damaged data (grey or smeared blocks) instead of failing. Every frame decoded for a request
    is checked, not only the returned ones: a damaged H.264 keyframe flags itself alone, and the frames predicted
    from it come out wrong unflagged. No frame of valid data was flagged (the four real datasets and generated
    AV1/H.264/HEVC/VP9, open GOPs included, from every keyframe). It catches damaged H.264 keyframes and part of
    the rest (about a third of damaged H.264 non-key frames; nothing in HEVC or VP9). ``err_detect=explode``
    would catch little more and fails valid open-GOP H.264 read from a keyframe that is not an IDR picture.
    """
    return bool(frame.is_corrupt) or (frame.width, frame.height) != (index.width, index.height)


def damaged_frame_error(
    label: str, frame: av.VideoFrame, index: PacketIndex, seconds: float | None
) -> VideoDecodeError:
    """The error for a frame :func:`is_damaged` found, shown at ``seconds``."""
    where = "at an unknown time" if seconds is None else f"at pts {seconds:.6f} s"
    if frame.is_corrupt:
        return VideoDecodeError(
            f"{label}: the decoder flagged the frame {where} as corrupt (it concealed damaged data, so the frames "
            "decoded from it are wrong); the file is corrupt: restore it from its source or re-encode it."
        )
    return VideoDecodeError(
        f"{label}: the decoder produced a {frame.width}x{frame.height} frame {where} in a {index.width}x"
        f"{index.height} video: a damaged stream header (the frames decoded from it are wrong), or a stream that "
        "changes size, which one camera's frames cannot; restore the file from its source or re-encode it."
    )


def out_of_order_error(label: str, which: str) -> VideoDecodeError:
    """The error for frames a decoder shows out of their timestamps' order (``which``: the pair, as shown).

    A decoder shows frames in the order the bitstream says (H.264/HEVC picture order), and a sound file's
    timestamps say the same. Damaged composition offsets (``ctts``) reorder the timestamps alone, so frames
    would be handed out under each other's timestamps, with no error from the decoder.
    """
    return VideoDecodeError(
        f"{label}: the decoder shows frames in another order than their timestamps say ({which}); the file's "
        "timestamps (its composition offsets, ctts) are damaged: download or copy it again, or re-encode it."
    )


def check_random_access(
    label: str, frame: av.VideoFrame | None, key_pts: int, seconds: float, *, flagged: bool = True
) -> None:
    """Raise unless ``frame``, the first shown at or after the keyframe at ``key_pts`` (shown at ``seconds``) that
    decoding started from, is that keyframe's own intra-coded picture. ``flagged``: whether the file flags it a
    keyframe; else it is the file's first packet, where decoding starts as no keyframe comes before (a file cut
    mid-GOP), and the error says so.

    A file may flag pictures that are no random-access point as keyframes: x264's intra refresh marks the P-frame
    that starts each refresh cycle (an H.264 recovery point) a sync sample. The packet index drops those flags
    (:mod:`.random_access`), so this guards against what that check does not see. Decoding from there, FFmpeg withholds
    the pictures until the cycle completes, then shows frames predicted from references it never had (grey or
    green, unflagged: 6 of the 9 frames after the last refresh start of a 90-frame 96x64 file); fed after an
    earlier run of the same clip, it shows that P-frame predicted from the wrong pictures. No error either way.
    """
    if frame is not None and frame.pts == key_pts and frame.pict_type == PictureType.I:
        return
    shown = "is not shown" if frame is None or frame.pts != key_pts else "is not an intra picture"
    if not flagged:
        raise mid_gop_error(label, seconds, f"{shown} when decoding starts there")
    raise VideoDecodeError(
        f"{label}: the keyframe at pts {seconds:.6f} s {shown} when "
        "decoding starts there: the file flags a picture that is no random-access point as a keyframe (an H.264 "
        "recovery point of intra refresh), so frames decoded from it would not be the file's. Re-encode the video "
        "with real keyframes (lerobot-dali reencode)."
    )


def mid_gop_error(label: str, seconds: float, what: str) -> VideoDecodeError:
    """The error for frames of file ``label`` before its first keyframe, where its first packet (shown at ``seconds``)
    is no keyframe, a file cut mid-GOP: ``what`` befell that packet (not shown, refused by the decoder, or by the
    demuxer's seek)."""
    return VideoDecodeError(
        f"{label}: the file's first packet (pts {seconds:.6f} s) is no keyframe and {what}: the file starts mid-GOP "
        "(cut from a longer video), so its frames before its first keyframe cannot be decoded. Leave those frames "
        "out, or restore the file's start from its source."
    )
