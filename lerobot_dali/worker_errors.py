"""Bring an exception raised in a DALI worker process back as itself.

DALI's parallel external source re-raises a worker's failure in the training process as a bare
``Exception`` carrying the worker's traceback text, chained to a ``RuntimeError`` with the message. A user
who catches ``FrameTimestampError`` or ``MissingDataFileError`` should not have to parse that, so the
original type is rebuilt from the traceback's last line when it is one of ours or a builtin.
"""

from __future__ import annotations

import builtins
import re

from . import errors

__all__ = ["original_worker_error"]

_LAST_LINE = re.compile(r"^(?P<qualname>[A-Za-z_][\w.]*): (?P<message>.*)\Z", re.MULTILINE | re.DOTALL)


def original_worker_error(error: BaseException) -> BaseException | None:
    """The worker's original exception if ``error`` (or its causes) carries one we can rebuild, else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if "Exception traceback received from worker" in text:
            rebuilt = _rebuild(text)
            if rebuilt is not None:
                return rebuilt
        current = current.__cause__ or current.__context__
    return None


def _rebuild(traceback_text: str) -> BaseException | None:
    # The exception line is the first line after the last traceback frame that is not indented.
    lines = traceback_text.rstrip().splitlines()
    for start in range(len(lines) - 1, -1, -1):
        match = _LAST_LINE.match("\n".join(lines[start:]))
        if match and not lines[start].startswith(" "):
            qualname, message = match["qualname"], match["message"]
            module, _, name = qualname.rpartition(".")
            if module == errors.__name__:
                cls = getattr(errors, name, None)
            elif module in ("", "builtins"):
                cls = getattr(builtins, name, None)
            else:
                cls = None
            if isinstance(cls, type) and issubclass(cls, Exception):
                try:
                    return cls(message)
                except TypeError:
                    return None
            return None
    return None
