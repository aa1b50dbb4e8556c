"""Our CPU kernels built for another target than this machine's, for tests that compare builds."""

from __future__ import annotations

import ctypes

import pytest

from tandem.kernels import cpu_build


def library_for_march(march: str) -> ctypes.CDLL:
    """Our kernels built (once, then cached) for `march` (TANDEM_CPU_MARCH) and loaded."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TANDEM_CPU_MARCH", march)
    try:
        return cpu_build.load_library(cpu_build.build_library())
    finally:
        patch.undo()
