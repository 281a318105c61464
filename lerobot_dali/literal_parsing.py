"""One lock for the parses of Python literals this package's threads make (``ast.literal_eval``).

CPython 3.11 and 3.12 count the AST constructor's recursion depth per interpreter, not per thread, so two threads
parsing at once can fail with ``SystemError: AST constructor recursion depth mismatch``. The lock keeps this
package's threads apart; a parse in a thread of someone else's can still collide, so a caller treats ``SystemError``
as a failed parse, never as bad input that deletes or refuses anything. Stored packet indexes are no ``.npz`` any
more (whose headers ``np.load`` parses so; :mod:`.packet_index_file`): only :mod:`.worker_errors` parses.
"""

from __future__ import annotations

from . import fork_locks

__all__ = ["PARSE_LOCK"]

#: Held around every ``ast.literal_eval`` of this package that may run beside another thread.
PARSE_LOCK = fork_locks.lock()
