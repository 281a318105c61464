"""The marks of a GPU-only test module: ``pytestmark = GPU_ONLY`` (skipped where DALI sees no CUDA device)."""

from __future__ import annotations

import pytest
from nvidia.dali import backend


def cuda_devices() -> int:
    """CUDA devices DALI can use here (0 without a driver)."""
    try:
        return backend.GetCUDADeviceCount()
    except RuntimeError:
        return 0


GPU_ONLY = [pytest.mark.gpu, pytest.mark.skipif(cuda_devices() == 0, reason="needs a CUDA device")]
