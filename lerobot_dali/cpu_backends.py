"""Which libraries can decode video on this machine's CPU: PyAV (always installed; the codecs of the FFmpeg its wheel
bundles) and torchcodec (where it imports and finds FFmpeg's shared libraries).

Asked without opening a file: by the decode route (can a codec fall back to the CPU at all), by the frame decoder
(which backend ``AUTO`` means here) and by the machine report (``lerobot-dali diagnose``, the benchmark).
"""

from __future__ import annotations

import functools

import av

from .errors import CodecUnsupportedError
from .packet_index import PacketIndex

__all__ = [
    "TORCHCODEC_NOT_INSTALLED",
    "cpu_decoders",
    "pyav_can_decode",
    "require_pyav_decoder",
    "torchcodec_available",
    "torchcodec_unavailable",
]


@functools.lru_cache(maxsize=64)
def pyav_can_decode(codec: str) -> bool:
    """Whether the FFmpeg bundled with PyAV has a decoder for ``codec`` (an FFmpeg codec name)."""
    try:
        av.codec.Codec(codec, "r")
    except (av.codec.codec.UnknownCodecError, ValueError):
        return False
    return True


def require_pyav_decoder(index: PacketIndex) -> None:
    """Raise CodecUnsupportedError naming the file unless PyAV can decode ``index``'s codec."""
    if not pyav_can_decode(index.codec):
        raise CodecUnsupportedError(
            f"{index.source_name}: PyAV has no decoder for codec {index.codec!r}; re-encode the video."
        )


#: Why torchcodec is not used where it is not installed: nothing to tell (one installed but unusable is told once).
TORCHCODEC_NOT_INSTALLED = "torchcodec is not installed"


def torchcodec_unavailable() -> str | None:
    """Why torchcodec cannot decode video here (``None``: it can).

    Importing is not enough: torchcodec >= 0.17 imports without FFmpeg (its image decoders need none) and
    fails only at the first video it opens, so ``pip install lerobot`` on a machine without FFmpeg's shared
    libraries leaves a torchcodec that imports but cannot decode. Its ``ffmpeg_major_version`` is ``None``
    then; older releases raised at import instead.
    """
    try:
        import torchcodec
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name == "torchcodec":
            return TORCHCODEC_NOT_INSTALLED
        return f"torchcodec does not import (ModuleNotFoundError: {e})"
    except Exception as e:  # torchcodec raises RuntimeError/OSError when its libraries do not load.
        first_line = str(e).splitlines()[0] if str(e) else ""
        return f"torchcodec does not import ({type(e).__name__}: {first_line})"
    if getattr(torchcodec, "ffmpeg_major_version", 0) is None:
        return (
            f"torchcodec {getattr(torchcodec, '__version__', '')} found no FFmpeg shared libraries it supports "
            "(install FFmpeg's libraries, e.g. apt install ffmpeg or conda install ffmpeg)"
        )
    return None


def cpu_decoders() -> str:
    """PyAV's version and torchcodec's state: an installed torchcodec that finds no FFmpeg is passed over."""
    pyav = f"PyAV {av.__version__} (FFmpeg {av.ffmpeg_version_info})"
    why_not = torchcodec_unavailable()
    if why_not is not None:
        return f"{pyav}; torchcodec unused: {why_not}"
    import torchcodec

    ffmpeg = getattr(torchcodec, "ffmpeg_major_version", "?")
    version = getattr(torchcodec, "__version__", "(version unknown)")  # a source build may have none
    return f"{pyav}; torchcodec {version} (FFmpeg {ffmpeg}), which CPU mode decodes with"


def torchcodec_available() -> bool:
    """Whether torchcodec imports and loads its FFmpeg libraries in this environment."""
    return torchcodec_unavailable() is None
