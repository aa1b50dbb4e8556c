"""Compiling and loading the fused CPU kernels (cpu_kernels.c) on this machine.

`TANDEM_CPU_KERNELS` chooses: `auto` (the default) compiles them with the system C compiler for
this CPU (`-march=native`) the first time and falls back to torch ops, with one log line saying
why, where there is no compiler; `c` requires them (the error says why they are missing);
`torch` never uses them. Any other value is refused at load.

The library is cached under `$TANDEM_CACHE_DIR` (default `~/.cache/tandem`) in `kernels/`, named
by a hash of the source, the compiler's version, the flags and the CPU's model and flags: a
machine of another kind (the CPU changes between hosts) compiles its own copy instead of loading
one built for instructions it may lack. It is written to a temporary name and renamed, so
processes starting together (tensor-parallel ranks) never load a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

logger = logging.getLogger("tandem")

MODES = ("auto", "c", "torch")
SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11"]

_P, _I, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {  # name -> (argtypes, restype)
    "tandem_add_rms_norm": ([_P, _P, _P, _P, _P, _I, _I, _F, _INT], None),
    "tandem_silu_and_mul": ([_P, _P, _I, _I], None),
    "tandem_rope_write_kv": ([_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _F, _INT], _INT),
    "tandem_paged_attention": ([_P, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _F, _I], _INT),
}


def cpu_kernels_mode() -> str:
    """TANDEM_CPU_KERNELS, validated: a value outside MODES is an error, never ignored."""
    mode = os.environ.get("TANDEM_CPU_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"TANDEM_CPU_KERNELS={mode!r} is not supported; choose one of "
                         f"{list(MODES)}.")
    return mode


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _arch_flag() -> str:
    return "-march=native" if platform.machine() in ("x86_64", "AMD64", "i686") else "-mcpu=native"


def _cache_dir() -> Path:
    root = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem")
    path = Path(root) / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, delete=True)
        probe.close()
        return path
    except OSError:
        path = Path(tempfile.gettempdir()) / f"tandem-kernels-{os.getuid()}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def build_library() -> Path:
    """The compiled library's path, compiling it first if this machine has no copy yet.
    Raises RuntimeError with the reason when it cannot be built."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"the C compiler {cc} does not run: {e}") from e
    flags = FLAGS + [_arch_flag()]
    key = hashlib.sha256("\n".join([SOURCE.read_text(), cc, *version, *flags, platform.machine(),
                                    _cpu_identity()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"tandem_cpu_{key}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed to compile {SOURCE.name}: "
                               f"{proc.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{cc} took over 120 s to compile {SOURCE.name}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
