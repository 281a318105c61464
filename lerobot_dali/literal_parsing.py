"""One lock for the parses of Python literals this package's threads make.

CPython 3.11 and 3.12 count the AST constructor's recursion depth per interpreter, not per thread, so two threads
parsing at once (``ast.literal_eval``, or ``np.load`` reading an ``.npy`` header) can fail with ``SystemError: AST
constructor recursion depth mismatch``. Seen in CI: a packet index loaded from the store in two threads at once
was taken for a damaged file and deleted. The lock keeps this package's threads apart; a parse in a thread of
someone else's can still collide, so a caller treats :func:`is_parse_race` errors as transient, not as bad input.
"""

from __future__ import annotations

import threading

__all__ = ["PARSE_LOCK", "is_parse_race"]

#: Held around every ``np.load`` and ``ast.literal_eval`` of this package that may run beside another thread.
PARSE_LOCK = threading.Lock()


def is_parse_race(error: BaseException) -> bool:
    """Whether ``error`` is CPython's parse collision between threads, which says nothing of the input."""
    return isinstance(error, SystemError) and "AST constructor recursion depth mismatch" in str(error)
