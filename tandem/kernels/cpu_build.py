"""Compiling and loading the CPU kernels (the C files of `SOURCES` below, here beside this one).

`TANDEM_CPU_KERNELS` chooses: `auto` (the default) compiles them with the system C compiler for
this CPU (`-march=native`) the first time (a compiler process per core; about 40 s on two
cores, most of it cpu_attention.c) and falls back to torch ops, with one log line saying
why, where there is no compiler; `c` requires them (the error says why they are missing);
`torch` never uses them. Any other value is refused at load. `TANDEM_CPU_MARCH` names another
compiler target than this CPU (`-march=` on x86, `-mcpu=` elsewhere: `haswell` or `x86-64-v3` for
an AVX2 build that also runs on older machines, or to see here what an AVX2-only CPU runs);
`native` is the default.

The library is cached under `$TANDEM_CACHE_DIR` (default `~/.cache/tandem`) in `kernels/`, named
by a hash of the source, the compiler's version, the flags and the CPU's model and flags: a
machine of another kind (the CPU changes between hosts) compiles its own copy instead of loading
one built for instructions it may lack. It is written to a temporary name and renamed, so
processes starting together (tensor-parallel ranks) never load a half-written file.

cpu_kernels.c is built without floating-point contraction, cpu_gemm.c and cpu_attention.c with it
(fused multiply-adds; every tile or pass runs the same code, so rows still never depend on their
batch), and, with GCC, with every multiply-add fused (`KEEP_FMAS`: its tuning for AMD Zen
otherwise leaves some unfused by the shape of the code around them). OpenMP (the matmul's and
attention's threads) is linked only when the process's OpenMP runtime is GNU libgomp, as in
torch's builds: the library then binds to that same libgomp (by its soname) and runs in torch's
thread pool. Under another runtime a second pool would spin against torch's, so the kernels are
built single-threaded there (and say so in the log at load).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

logger = logging.getLogger("tandem")

MODES = ("auto", "c", "torch")
HERE = Path(__file__).parent
# Every header, so that the library cache's key changes with any of them (a listed set missed
# attention_wide.h and attention_wide16.h, and a changed header reused the old library).
HEADERS = sorted(HERE.glob("*.h"))
SOURCES = {HERE / "cpu_kernels.c": ["-ffp-contract=off"],
           HERE / "cpu_attention.c": ["-ffp-contract=fast"],
           HERE / "cpu_gemm.c": ["-ffp-contract=fast"],
           HERE / "cpu_decoder.c": ["-ffp-contract=off"],
           HERE / "cpu_decoder_gemma.c": ["-ffp-contract=off"],
           HERE / "cpu_quant.c": ["-ffp-contract=off"],
           HERE / "cpu_quant_x.c": ["-ffp-contract=off"],
           HERE / "cpu_quant_half.c": ["-ffp-contract=off"],
           HERE / "cpu_quant_pack.c": ["-ffp-contract=off"],
           HERE / "cpu_quant_r16.c": ["-ffp-contract=off"],
           HERE / "cpu_quantize.c": ["-ffp-contract=off"],
           HERE / "cpu_gumbel.c": ["-ffp-contract=off"]}
FLAGS = ["-O3", "-fPIC", "-std=gnu11", "-Wno-psabi"]

_P, _I, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {  # name -> (argtypes, restype)
    "tandem_add_rms_norm": ([_P, _P, _P, _P, _P, _I, _I, _F, _INT], None),
    "tandem_silu_and_mul": ([_P, _P, _I, _I], None),
    "tandem_gelu_tanh_and_mul": ([_P, _P, _I, _I], None),
    "tandem_rope_write_kv": ([_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _F, _INT, _INT],
                             _INT),
    "tandem_kv_rows": ([_INT, _P, _I, _I, _P, _P], _INT),
    "tandem_paged_attention": ([_P, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _F, _I, _F,
                                _INT, _INT], _INT),
    "tandem_row_sum": ([_P, _I, _I, _P, _INT], None),
    "tandem_linear": ([_P, _P, _P, _P, _I, _I, _I, _INT], _INT),
    "tandem_evict": ([_P, _I], _INT),
    "tandem_q_block": ([_INT], _I),
    "tandem_q_block_bytes": ([_INT], _I),
    "tandem_qlinear": ([_P, _P, _P, _P, _I, _I, _I, _INT], _INT),
    "tandem_q_rows": ([_INT, _P, _I, _P, _I, _I, _P], _INT),
    "tandem_q_r16_bytes": ([_INT, _I], _I),
    "tandem_q_r16_pack": ([_INT, _P, _I, _I, _I, _P], _INT),
    "tandem_quantize": ([_P, _I, _I, _INT, _P, _INT], _INT),
    "tandem_gumbel_candidates": ([_P, _I, _I, _P, _P, _P, _P], None),
    "tandem_gumbel_argmax_sparse": ([_P, _P, _P, _P, _I, _P, _P, _INT], None),
    "tandem_argmax": ([_P, _I, _I, _P, _INT], None),
    "tandem_llama_stack": ([_P, _P, _I, _P, _I, _P, _P, _F, _F, _INT, _P, _P, _P, _P, _P, _I, _I,
                            _F, _INT], _INT),
    "tandem_gemma_stack": ([_P, _P, _I, _P, _I, _P, _P, _P, _F, _F, _P, _P, _P, _P, _P, _P, _P,
                            _I, _I, _F, _INT], _INT),
}


def cpu_kernels_mode() -> str:
    """TANDEM_CPU_KERNELS, validated: a value outside MODES is an error, never ignored."""
    mode = os.environ.get("TANDEM_CPU_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"TANDEM_CPU_KERNELS={mode!r} is not supported; choose one of "
                         f"{list(MODES)}.")
    return mode


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split()[2:])
    except OSError:
        return set()


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


def cpu_march() -> str:
    """TANDEM_CPU_MARCH, validated as a compiler target name (the compiler judges the rest)."""
    march = os.environ.get("TANDEM_CPU_MARCH", "native").strip() or "native"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", march):
        raise ValueError(f"TANDEM_CPU_MARCH={march!r} is not a compiler target name; use "
                         f"'native' (the default) or one such as 'haswell' or 'x86-64-v3'.")
    return march


def _arch_flag() -> str:
    x86 = platform.machine() in ("x86_64", "AMD64", "i686")
    return ("-march=" if x86 else "-mcpu=") + cpu_march()


# The compiler's macro for an instruction set -> the /proc/cpuinfo flag of a CPU that has it.
_X86_MACROS = {"__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
               "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512DQ__": "avx512dq",
               "__AVX512VL__": "avx512vl", "__AVX512BF16__": "avx512_bf16",
               "__AVX512FP16__": "avx512_fp16", "__AMX_TILE__": "amx_tile"}


def _check_target_runs_here(cc: str, arch: str) -> None:
    """A named target whose instructions this CPU lacks would compile, then die of an illegal
    instruction at the first call: refuse it here instead (x86, where the flags are known)."""
    flags = cpu_flags()
    if arch.endswith("=native") or platform.machine() != "x86_64" or not flags:
        return
    proc = subprocess.run([cc, arch, "-dM", "-E", "-x", "c", os.devnull], capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{cc} does not know {arch}: {proc.stderr.strip()[-500:]}")
    defined = {line.split()[1] for line in proc.stdout.splitlines() if line.count(" ") >= 2}
    missing = sorted(f for m, f in _X86_MACROS.items() if m in defined and f not in flags)
    if missing:
        raise RuntimeError(f"{arch} uses instructions this CPU lacks: {', '.join(missing)}")


# GCC tuned for some CPUs (AMD Zen: -march=native there) leaves multiply-adds in long chains of
# 256-bit vectors unfused ("avoid FMA chains", --param avoid-fma-max-bits=256), by a heuristic
# that reads the shape of the code around them: two instantiations of the same attention pass
# then rounded a row differently (one product rounded and added, the other fused), and a token's
# output followed the rows beside it. The files built with contraction form every FMA instead.
KEEP_FMAS = "--param=avoid-fma-max-bits=0"


def _keeps_fmas(cc: str) -> list[str]:
    """[KEEP_FMAS] where the compiler takes it (GCC), [] where it does not (clang has no such
    heuristic)."""
    proc = subprocess.run([cc, KEEP_FMAS, "-x", "c", "-c", os.devnull, "-o", os.devnull],
                          capture_output=True, text=True, timeout=30)
    return [KEEP_FMAS] if proc.returncode == 0 and not proc.stderr.strip() else []


def process_uses_libgomp() -> bool:
    """GNU libgomp is the OpenMP runtime loaded in this process (torch's, on Linux builds)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return False


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
    arch = _arch_flag()
    _check_target_runs_here(cc, arch)
    flags = FLAGS + [arch]
    openmp = ["-fopenmp"] if process_uses_libgomp() else []
    fused = _keeps_fmas(cc)
    per_file = {src: flags + extra + (fused if "-ffp-contract=fast" in extra else []) + openmp
                for src, extra in SOURCES.items()}
    link = flags + ["-shared"] + openmp
    texts = [p.read_text() for p in [*HEADERS, *SOURCES]]
    key = hashlib.sha256("\n".join([*texts, cc, *version, *map(str, per_file.values()), *link,
                                    platform.machine(), _cpu_identity()]).encode()
                         ).hexdigest()[:16]
    out = _cache_dir() / f"tandem_cpu_{key}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory() as objdir:
            objects = [os.path.join(objdir, src.stem + ".o") for src in per_file]
            # One compiler a core: a first start's build takes its longest file's time, not
            # the sum of them all (the compiler runs in its own process, outside the GIL).
            with ThreadPoolExecutor(max_workers=_cores()) as pool:
                builds = [pool.submit(_compile, cc, [*src_flags, "-c", "-o", obj, str(src)],
                                      f"{src.name} ({arch})")
                          for (src, src_flags), obj in zip(per_file.items(), objects)]
                for build in builds:
                    build.result()  # the first failure, in source order, is the one raised
            _compile(cc, [*link, "-o", tmp, *objects, "-lm"], "the kernel library")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _compile(cc: str, args: list[str], what: str) -> None:
    try:
        proc = subprocess.run([cc, *args], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{cc} took over 120 s to build {what}") from e
    if proc.returncode != 0:
        raise RuntimeError(f"{cc} failed to build {what}: {proc.stderr.strip()[-2000:]}")


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
