"""Where lerobot_dali keeps what it can rebuild: one root, so a user moves or clears every cache in one place.

``$LEROBOT_DALI_CACHE`` when set, else ``~/.cache/lerobot_dali``; each cache takes a subfolder (``bench``,
``packet_index``). Nothing under it is ever needed for correctness: deleting it only costs rebuild time.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_root"]

#: Environment variable that moves the cache root (e.g. onto a fast local disk shared by all ranks of a node).
CACHE_ENV = "LEROBOT_DALI_CACHE"


def cache_root() -> Path:
    """``$LEROBOT_DALI_CACHE`` (``~`` expanded) when set and non-empty, else ``~/.cache/lerobot_dali``."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "lerobot_dali"
