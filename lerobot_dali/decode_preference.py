"""What a user asks of frame decoding (``decode="auto"|"gpu"|"cpu"``): an enum and its ``Literal`` spelling, apart
from :mod:`~lerobot_dali.decode_route` (which loads DALI to probe the GPU), so naming them loads neither DALI nor
torch."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from .value_checks import check_choice

__all__ = ["DecodePreference", "DecodePreferenceName"]


class DecodePreference(Enum):
    """What the user asked for (``decode="auto"|"gpu"|"cpu"``)."""

    #: NVDEC where the GPU decodes the codec; otherwise DALI's CPU decoder (VP8/VP9/MJPEG) or the CPU
    #: fallback, with one log line saying why.
    AUTO = "auto"
    #: NVDEC or an error: for runs that must not silently decode on the CPU.
    GPU = "gpu"
    #: Never NVDEC: DALI's CPU decoder for VP8/VP9/MJPEG, the CPU fallback for the rest.
    CPU = "cpu"

    @classmethod
    def parse(cls, value: DecodePreference | str) -> DecodePreference:
        """``value`` (a member, or its value in any case) as a member; ValueError naming the values."""
        return check_choice(cls, "decode", value.lower() if isinstance(value, str) else value)


#: :class:`DecodePreference`'s values, as a type checker checks a string given for one (``decode="cpu"``).
DecodePreferenceName = Literal["auto", "gpu", "cpu"]
