"""The frame size a VP9 keyframe declares, from the first bytes of its uncompressed header (VP9 spec, 6.2).

VP9 lets any keyframe start a new frame size, so a stream copy of several videos of different sizes into one
file (as LeRobot's v3.0 concatenation does) is a valid stream whose frames change size part-way; the container
(MP4 ``vpcC``, Matroska) names one size only. The packet index reads each keyframe's header to find such streams
(:mod:`.keyframe_sizes`), and each clip for DALI its keyframes (:mod:`.clips`).

Only keyframes are read here: the first frame of the packet (a superframe's first frame starts the packet too).
"""

from __future__ import annotations

__all__ = ["VP9_HEADER_BYTES", "vp9_keyframe_size"]

#: Bytes of a keyframe that hold its frame size: 2 marker/profile bytes, the 3-byte sync code, at most 5 bits of
#: colour configuration and the two 16-bit sizes (rounded up).
VP9_HEADER_BYTES = 10
_FRAME_MARKER = 2
_SYNC_CODE = 0x498342
_CS_RGB = 7


def vp9_keyframe_size(head: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of the VP9 keyframe whose packet starts with ``head``, or None when ``head`` is no
    keyframe header (another frame type, a shown-again frame, a bad marker or sync code, or too few bytes)."""
    value = int.from_bytes(head[:VP9_HEADER_BYTES], "big")
    remaining = 8 * min(len(head), VP9_HEADER_BYTES)

    def bits(count: int) -> int | None:
        nonlocal remaining
        if count > remaining:
            return None
        remaining -= count
        return (value >> remaining) & ((1 << count) - 1)

    if bits(2) != _FRAME_MARKER:
        return None
    low, high = bits(1), bits(1)
    if low is None or high is None:
        return None
    profile = (high << 1) | low
    if profile == 3 and bits(1) is None:  # (reserved_zero)
        return None
    # show_existing_frame must be 0 and frame_type 0 (KEY_FRAME); then show_frame, error_resilient_mode.
    if bits(1) != 0 or bits(1) != 0 or bits(2) is None or bits(24) != _SYNC_CODE:
        return None
    if profile >= 2 and bits(1) is None:  # (ten_or_twelve_bit)
        return None
    color_space = bits(3)
    if color_space is None:
        return None
    odd_profile = profile in (1, 3)
    skipped = (1 + (3 if odd_profile else 0)) if color_space != _CS_RGB else (1 if odd_profile else 0)
    if bits(skipped) is None:  # (color_range; subsampling_x, subsampling_y, reserved_zero)
        return None
    width, height = bits(16), bits(16)
    if width is None or height is None:
        return None
    return width + 1, height + 1
