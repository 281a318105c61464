"""Command-line options that ``lerobot-dali bench``, ``pipelines/train.py`` and ``pipelines/lerobot_policy.py`` share,
defined once here so that each takes the others' spelling too (README, "Command line"):

- ``--image-size 224x224`` (the bench's, and ``make-dataset --size``'s) or ``--image-size 224 224`` (train.py's);
- ``--episode-pool-size N`` (train.py's, lerobot_policy.py's) or ``--pool-size N`` (the bench's);
- ``--timestamp-source SOURCE`` and ``--tolerance-s S`` (every verb that reads frames), worded alike everywhere.

Their parsers are :class:`ArgumentParser`, which takes a value that starts as a negative number does as a value.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from .frame_lookup import DEFAULT_TOLERANCE_S, TimestampSource
from .value_checks import is_int

__all__ = [
    "HELP_WIDTH",
    "MAX_IMAGE_SIDE",
    "ArgumentParser",
    "HelpFormatter",
    "add_episode_pool_size",
    "add_image_size",
    "add_timestamp_source",
    "add_tolerance_s",
    "check_image_size",
    "described",
    "parse_size",
]

#: The largest height or width ``--image-size`` takes (NVDEC's largest frame). Past it a square of 16,256 FFmpeg's
#: scaler refused (EINVAL: the CPU route called the dataset's video corrupt), and past 2**31 the first batch failed
#: with an OverflowError, each once the run had started.
MAX_IMAGE_SIDE = 8192
#: The columns ``--help``'s description and epilog are wrapped to as they are written, since :class:`HelpFormatter`
#: keeps them as written (the flags' helps it wraps to the terminal): a terminal's 80.
HELP_WIDTH = 80
#: What ``--image-size`` takes, as its help and both of its errors say it (the bench's and train.py's alike).
_IMAGE_SIZE = f"a positive height and width up to {MAX_IMAGE_SIDE}, HxW (224x224) or H W (224 224)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter (the description and epilog as written: the verbs' table of exit statuses), but a help is
    wrapped at spaces alone, never inside a hyphenated word: argparse broke ``--image-cameras`` across two lines
    (``ignored with --image-`` / ``cameras``) and ``--drop-n-last-frames`` in train.py's, so a flag searched for in
    ``--help`` was not found whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def described(text: str) -> str:
    """``text`` (a module docstring's first paragraph) as a parser's description: wrapped to :data:`HELP_WIDTH`
    columns at spaces, its ````name```` markup left out. :class:`HelpFormatter` keeps a description as written, and the
    docstrings' first lines ran to 90 and 105 columns in ``--help``."""
    import textwrap

    return textwrap.fill(" ".join(text.replace("``", "").split()), HELP_WIDTH, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a word that starts as a negative number does (``-1x5``, ``-1e-3``, ``-1_000``) is a
    value, not an unknown option: ``--image-size -1x5`` and ``--lr -1e-3`` reach the checks that say what is allowed,
    as ``--image-size=-1x5`` did, where argparse up to Python 3.13 took those alone that are whole numbers (``-1``,
    ``-0.5``) and stopped at "expected one argument". This is the rule of Python 3.14's argparse, and holds while no
    option of the parser looks like a negative number (none does); ``-inf`` and ``-nan``, which ``float`` reads, are
    values too (the parsers have no one-dash options).

    ``usage_on_error=False`` (the training scripts, which a launcher starts on every rank): a mistake is its one line
    and a pointer to ``--help``, not after the usage (train.py's 16 lines, on each rank under torchrun); ``log``: the
    logger that says that line (the script's, whose lines carry the time and the launcher's rank, as its other errors
    do; with no logging configured, the line alone on stderr), else it is written to stderr as argparse writes it."""

    def __init__(
        self, *args: Any, usage_on_error: bool = True, log: logging.Logger | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.usage_on_error = usage_on_error
        self.log = log
        self._negative_number_matcher = re.compile(r"-\.?\d|-(inf|infinity|nan)$", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        """argparse's error, with a hint where a positional argument given after an option of several values
        (``check --episodes 0 1 DATASET``) was taken by it: argparse said only "the following arguments are required:
        dataset" or "invalid int value: 'DATASET'" (a review)."""
        bad = re.search(r"invalid \w+ value: '(.*)'$", message)
        missing = re.search(r"the following arguments are required: (dataset|out)", message)
        if missing or (bad and ("/" in bad.group(1) or os.path.exists(bad.group(1)))):
            message += (
                " (given after an option of several values, such as --cameras, --episodes or --tolerance-s, it was "
                "taken as one of them: give DATASET, and OUT, before such options)"
            )
        if not self.usage_on_error:
            line = f"{self.prog}: error: {message} ({self.prog} --help lists the options)"
            if self.log is not None:
                self.log.error("%s", line)
                self.exit(2)
            self.exit(2, f"{line}\n")
        super().error(message)


def parse_size(text: str) -> tuple[int, int]:
    """``HxW`` (``480x640``) as ``(height, width)``; :class:`argparse.ArgumentTypeError` for anything else."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 480x640 (HxW), got {text!r}") from None
    return h, w


class _ImageSize(argparse.Action):
    """``HxW`` as one word, or ``H W`` as two: ``(H, W)``."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        words: Sequence[str] = values
        try:
            if len(words) == 1:
                size = parse_size(words[0])
            elif len(words) == 2:
                size = (int(words[0]), int(words[1]))
            else:
                raise ValueError
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentError(self, f"takes {_IMAGE_SIZE}, got {' '.join(words)!r}") from None
        setattr(namespace, self.dest, size)


def add_image_size(parser: argparse.ArgumentParser | Any) -> None:
    """``--image-size``, ``HxW`` or ``H W``: ``(H, W)`` or None where not given (check it with
    :func:`check_image_size`)."""
    parser.add_argument(
        "--image-size",
        nargs="+",
        action=_ImageSize,
        metavar=("HxW|H", "W"),
        help=f"resize every camera's frames to {_IMAGE_SIZE} (in place of a recipe's image size)",
    )


def check_image_size(size: object) -> tuple[int, int] | None:
    """``--image-size``'s value (None: not given) as ``(height, width)``; ValueError worded as its help (the bench's
    and train.py's said it two other ways)."""
    if size is None:
        return None
    if isinstance(size, (tuple, list)) and len(size) == 2 and all(is_int(v) and 0 < v <= MAX_IMAGE_SIDE for v in size):
        return int(size[0]), int(size[1])
    shown = "x".join(map(str, size)) if isinstance(size, (tuple, list)) else repr(size)
    raise ValueError(f"--image-size takes {_IMAGE_SIZE}, got {shown}")


def add_episode_pool_size(parser: argparse.ArgumentParser | Any, *, default: int, help: str) -> None:
    """``--episode-pool-size N``, also spelled ``--pool-size N``, into ``episode_pool_size`` (the name messages give
    it, as ``--help`` and the usage line do)."""
    parser.add_argument("--episode-pool-size", "--pool-size", type=int, default=default, metavar="N", help=help)


def add_timestamp_source(
    parser: argparse.ArgumentParser | Any, *, per: str | None, default: bool = True, lead: str = ""
) -> None:
    """``--timestamp-source SOURCE``: how rows find their frames (``cr5_*``'s wall-clock parquet timestamps need
    ``frame_index``). ``per`` (``"--dataset"``): a list, one for every dataset or one per ``per``; None: one value.
    ``default=False`` leaves it None where not given, for a verb that refuses it without a dataset (diagnose).
    ``lead`` starts the help (``"with DATASET: "``). SOURCE is its metavar, for the usage to fit 80 columns (its
    choices ran it to 116); argparse still checks the choices, which the help names."""
    value = TimestampSource.PARQUET_TIMESTAMP.value
    parser.add_argument(
        "--timestamp-source", nargs="+" if per else None, type=str.lower, choices=[s.value for s in TimestampSource],
        default=(None if not default else [value] if per else value), metavar="SOURCE",
        help=f"{lead}how rows find their video frames, SOURCE one of %(choices)s (default {value}; frame_index: "
        f"frame_index / fps, for wall-clock parquet timestamps){_each(per)}",
    )  # fmt: skip


def add_tolerance_s(
    parser: argparse.ArgumentParser | Any, *, per: str | None, default: bool = True, lead: str = ""
) -> None:
    """``--tolerance-s S``: the most a row's time may be from its video frame's (``r1_v30_h264``'s rows between
    frames need half a frame). ``per``, ``default`` and ``lead`` as :func:`add_timestamp_source`'s."""
    parser.add_argument(
        "--tolerance-s", nargs="+" if per else None, type=float, metavar="S",
        default=(None if not default else [DEFAULT_TOLERANCE_S] if per else DEFAULT_TOLERANCE_S),
        help=f"{lead}the most a row's time may be from its video frame's pts, in seconds (default "
        f"{DEFAULT_TOLERANCE_S:g}){_each(per)}",
    )  # fmt: skip


def _each(per: str | None) -> str:
    """The help's tail of an option given once for every dataset or once per dataset (``per`` names how datasets
    are given: ``DATASET``, ``--dataset``)."""
    return f"; one for every dataset, or one per {per}" if per else ""
