"""The compiled CPU kernel library for the kernel tests: as built for this CPU and, on an
AVX-512 x86 machine, also as built for AVX2 only, so the 8-lane code (vec.h) runs here too;
`fused` switches a test's process to the library."""

from __future__ import annotations

import ctypes
import platform

import pytest

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import cpu_build

from models.kernel_builds import library_for_march


@pytest.fixture(scope="session")
def native_library() -> ctypes.CDLL:
    if cpu_build._compiler() is None:  # the torch path is what runs then, and is tested
        pytest.skip("no C compiler: fused CPU kernels unavailable")
    # With a compiler, a build error is a failure of ours (never a skip that hides it).
    return cpu_build.load_library(cpu_build.build_library())


@pytest.fixture(scope="session")
def avx2_library(native_library) -> ctypes.CDLL:
    """The library as built for AVX2 only (haswell), on an x86 machine with AVX-512."""
    flags = cpu_build.cpu_flags()
    if platform.machine() != "x86_64" or not {"avx512f", "avx2", "fma"} <= flags:
        pytest.skip("the native build is already the 8-lane one, or this is not x86")
    return library_for_march("haswell")


@pytest.fixture(scope="session", params=["native", "avx2"])
def library(request, native_library) -> ctypes.CDLL:
    if request.param == "native":
        return native_library
    return request.getfixturevalue("avx2_library")


@pytest.fixture
def fused(library, monkeypatch):
    monkeypatch.setitem(cpu_kernels._state, "lib", library)
