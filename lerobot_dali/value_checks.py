"""Type checks for option values: ``bool`` is an ``int`` to Python, never to an option that counts things."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from enum import Enum
from typing import Any, TypeGuard, TypeVar

import numpy as np

__all__ = [
    "check_choice",
    "check_int",
    "check_int_fields",
    "check_seconds",
    "cli_flag",
    "is_int",
    "is_number",
    "plain_data",
    "required_whole_number",
    "whole_number",
]

_Choice = TypeVar("_Choice", bound=Enum)


def is_int(value: object) -> TypeGuard[int | np.integer]:
    """Whether ``value`` is an int or numpy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float, Python's or numpy's (``np.float32(0.2)``), not a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(value)


def plain_data(value: Any) -> Any:
    """``value`` as plain data of its own, as JSON gives it back: tuples as lists, mappings as dicts (copied), at any
    depth; compare values saved through different serializers (one keeps tuples) by it."""
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    return [plain_data(v) for v in value] if isinstance(value, tuple) else value


def whole_number(value: object) -> int | None:
    """A metadata count or index as an int, also where it is written as a whole float or a string of one (its
    value is not in doubt); None for anything else (a fraction, a bool, another type), which a cast would change."""
    if type(value) is int:  # (most often: episodes.jsonl's two per episode)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str | np.integer | np.floating):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)  # (exactly: a float holds 53 bits)
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def required_whole_number(name: str, value: object) -> int:
    """:func:`whole_number`, or ValueError naming ``name`` where ``value`` is none."""
    number = whole_number(value)
    if number is None:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return number


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int (numpy integers too): TypeError for another type, ValueError below ``minimum``."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_seconds(name: str, value: object) -> float:
    """``value`` as a tolerance in seconds: ValueError unless a positive finite number.

    0 is refused: a row's time and its frame's are computed apart in floating point (the episode's
    ``from_timestamp`` plus ``frame_index / fps``, against the frame's pts times the time base), so they may differ
    by rounding alone (``0.2 + 5 / 30`` against ``5632 / 15360``: 5.6e-17 s), and a row at its own frame failed, its
    message saying "off by 0.000000 s"."""
    if not is_number(value) or value < 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    if value == 0:
        raise ValueError(
            f"{name} must be more than 0 seconds: a row's time and its frame's are computed apart in floating point "
            f"and may differ by rounding alone, so 0 fails rows at their own frames; give a small tolerance, e.g. "
            f"{name}=1e-4 (the default, LeRobot's)"
        )
    return float(value)  # type: ignore[arg-type]


def check_choice(kind: type[_Choice], name: str, value: object) -> _Choice:
    """``value`` as a member of enum ``kind``: a member, or its value (a string in any case: ``"PyAV"`` is
    ``CpuDecoderBackend.PYAV``); ValueError naming ``name`` and the values."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        folded = value.casefold()
        for member in kind:
            if isinstance(member.value, str) and member.value.casefold() == folded:
                return member
    allowed = ", ".join(repr(member.value) for member in kind)
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def cli_flag(name: str) -> str:
    """The command-line flag of an options field (``batch_size`` -> ``--batch-size``), for messages."""
    return "--" + name.replace("_", "-")


def check_int_fields(
    owner: Any,
    minimums: Iterable[tuple[str, int]],
    *,
    label: Callable[[str], str] = str,
    optional: Collection[str] = (),
    error: type[Exception] = ValueError,
) -> None:
    """Raise ``error`` naming the first of ``owner``'s fields that is not an int at least its minimum.

    ``label`` names a field in the message (:func:`cli_flag` for command-line options); the fields in
    ``optional`` may also be None.
    """
    for name, minimum in minimums:
        value = getattr(owner, name)
        if value is None and name in optional:
            continue
        if not is_int(value) or value < minimum:
            raise error(f"{label(name)} must be an int >= {minimum}, got {value!r}")
