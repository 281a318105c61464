"""Which FFmpeg encoder and options each codec name means, for the videos this package writes (synthetic
datasets, re-encoded ones): one table, so both encode alike and are checked alike."""

from __future__ import annotations

import os
from dataclasses import dataclass

from lerobot_dali.value_checks import is_int

__all__ = [
    "CODECS",
    "CODEC_OF_ENCODER",
    "DEFAULT_CRF",
    "LONG_GOP_FRAMES",
    "SVTAV1_PARAMS",
    "EncoderSettings",
    "check_bounded_int",
    "check_codec",
    "encoder_settings",
]


@dataclass(frozen=True)
class _CodecSpec:
    """How one codec name maps to an FFmpeg encoder and its options."""

    encoder: str
    default_crf: int
    max_crf: int
    extra_options: tuple[tuple[str, str], ...]


# Presets favour speed, but SVT-AV1 stays at preset 8: at 10 and above (LeRobot records with 12) it leaves
# whole blocks of the wrong colour in inter frames once gop > 2, which no frame marker can survive.
# SVT-AV1 also runs at level of parallelism 1 ("lp=1"). At its default (from the core count: 2 on 2 cores) it encodes
# pictures side by side and files each finished one in a ring of one slot per picture buffer (41 for 52x32 frames,
# 74 for 64x64 and up) at its decode order modulo the ring's size, never checking that the slot is free (4.1.0,
# packetization_process.c). Seen on a loaded 2-core machine: frame 74 came back in frame 33's place (pts 32, 74,
# 34; 74 - 33 = 41, that encode's ring), which the mp4 muxer refused (EINVAL), and a flush that waited forever in
# svt_av1_enc_get_packet, every encoder thread idle (a lost temporal unit: the end of the stream is never reached).
# At lp=1 a picture starts only once the one before it in decode order is packetized (enable_dec_order), so the
# ring fills in order and cannot overrun. The packets are byte for byte the same; an encode takes about 1.8x as long.
#: The ``svtav1-params`` of every AV1 encode (above); whoever opens libsvtav1 with options of their own adds them.
SVTAV1_PARAMS = "lp=1"
# x264 keeps B-frames on (every preset except "ultrafast" has them) and forces them with b-adapt=0,
# because loaders must cope with decode order differing from presentation order, as in many published
# LeRobot datasets.
_CODEC_SPECS: dict[str, _CodecSpec] = {
    "av1": _CodecSpec("libsvtav1", 30, 63, (("preset", "8"), ("svtav1-params", SVTAV1_PARAMS))),
    "h264": _CodecSpec("libx264", 23, 51, (("preset", "veryfast"), ("bf", "2"), ("x264-params", "b-adapt=0"))),
    "hevc": _CodecSpec("libx265", 28, 51, (("preset", "ultrafast"),)),
    "vp9": _CodecSpec("libvpx-vp9", 32, 63, (("deadline", "realtime"), ("cpu-used", "8"), ("b", "0"))),
}

#: Keyframe spacing above which ``info`` and the bench say what random access costs and that a copy re-encoded at
#: GOP 2 (``lerobot-dali reencode``) would cost about 1.5 decoded frames per frame (a random frame decodes > 8.5).
LONG_GOP_FRAMES = 16

CODECS: tuple[str, ...] = tuple(_CODEC_SPECS)
"""Codec names accepted by :func:`encoder_settings` (and so by ``encode_video``, ``make_dataset``, ``reencode``)."""

CODEC_OF_ENCODER: dict[str, str] = {spec.encoder: name for name, spec in _CODEC_SPECS.items()}
"""The codec each of the encoders above writes (``libsvtav1`` -> ``av1``)."""

DEFAULT_CRF: dict[str, int] = {name: spec.default_crf for name, spec in _CODEC_SPECS.items()}
"""Each codec's quality where none is given (what ``reencode --help`` lists)."""


@dataclass(frozen=True)
class EncoderSettings:
    """An FFmpeg encoder name and the options to open it with (``stream.options``)."""

    encoder: str
    options: dict[str, str]
    crf: int


def check_bounded_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """ValueError unless ``value`` is an int (not a bool) in ``[minimum, maximum]``."""
    if not is_int(value):
        raise ValueError(f"{name} must be an int, got {value!r}.")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}, got {value!r}.")


def check_codec(codec: str) -> None:
    """ValueError unless ``codec`` is one of :data:`CODECS`."""
    if codec not in _CODEC_SPECS:
        raise ValueError(f"Unknown codec {codec!r}; supported codecs are {', '.join(CODECS)}.")


def _checked_crf(codec: str, *, gop: int, crf: int | None) -> int:
    check_codec(codec)
    check_bounded_int("gop (maximum keyframe interval in frames)", gop, 1)
    spec = _CODEC_SPECS[codec]
    if crf is None:
        return spec.default_crf
    check_bounded_int(f"crf for {codec}", crf, 0, spec.max_crf)
    return int(crf)


def encoder_settings(codec: str, *, gop: int, crf: int | None = None, b_frames: bool = True) -> EncoderSettings:
    """The encoder for ``codec`` with keyframes at most ``gop`` frames apart, every GOP closed (decoding from
    any keyframe yields every frame from it on). ``crf`` defaults to the codec's usual value (30 for AV1,
    LeRobot's default). ``b_frames=False`` keeps decode order equal to display order (H.264, HEVC).
    Raises ValueError for an unknown codec or an out-of-range ``gop`` or ``crf``."""
    crf = _checked_crf(codec, gop=gop, crf=crf)
    # SVT-AV1 prints a banner to stderr on every encoder start unless its log level says otherwise.
    os.environ.setdefault("SVT_LOG", "1")
    spec = _CODEC_SPECS[codec]
    options = dict(spec.extra_options)
    options["crf"] = str(crf)
    if codec == "hevc":
        # libx265 ignores FFmpeg's "g", logs to stderr on its own unless told not to, and by default makes
        # open GOPs whose leading B-frames cannot be decoded after seeking to their keyframe.
        params = f"keyint={gop}:min-keyint=1:open-gop=0:log-level=none"
        options["x265-params"] = params + ("" if b_frames else ":bframes=0")
    else:
        options["g"] = str(gop)
    if codec == "h264" and not b_frames:
        options["bf"] = "0"
        del options["x264-params"]  # (b-adapt only forces B-frames)
    return EncoderSettings(spec.encoder, options, crf)
