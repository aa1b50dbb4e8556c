"""The quantized kernels' Arm builds (quant_r16_vec.h), here on x86: the kernel sources and a
small harness (quant_cross_harness.c) built with Debian's aarch64 cross compiler and run under
qemu-user, for Armv8.2 with its dot-product instruction (sdot) and for plain Armv8.0 (widening
multiplies). The interleaved kernel promises every CPU kind the same bits,
so each Arm build must give exactly the bits of the library this process runs, for every block
type, row count (1, 7 and 16: decode, and passes of 6 x rows) and thread count. No Arm machine
was timed: qemu runs the instructions, not their speed."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from models.test_quantized_kernels import random_blocks
from tandem.kernels import cpu_build, quant
from tandem.layers.quantized import PackedQuant, QuantizedWeight, RawQuant

CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
KERNELS = Path(cpu_build.__file__).parent
SOURCES = ["cpu_quant.c", "cpu_quant_x.c", "cpu_quant_half.c", "cpu_quant_pack.c",
           "cpu_quant_r16.c"]
# The plain-C lanes (quant_r16_c.h) are checked on this CPU's x86-64 build instead
# (test_quantized_kernels.py): a third cross build here cost half a minute of the suite.
TARGETS = {"armv8.2-dotprod": "-march=armv8.2-a+dotprod", "armv8.0": "-march=armv8-a"}
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
N = 44  # groups of 16, 16 and 12 rows: a last group that fills 3 of NEON's 4 passes
ROW_COUNTS = (1, 7, 16)  # the kernel's passes take 6 x rows at a time


@pytest.fixture(scope="module")
def arm_harness(tmp_path_factory) -> dict[str, Path]:
    if not (shutil.which(CC) and shutil.which(QEMU) and Path(SYSROOT).is_dir()):
        pytest.skip("no Arm cross tools (Debian: apt-get install gcc-aarch64-linux-gnu "
                    "qemu-user); scripts/setup.sh installs them where it can")
    out = tmp_path_factory.mktemp("arm")
    built, procs = {}, {}
    for name, march in TARGETS.items():  # the three builds side by side
        exe = out / f"harness-{name}"
        cmd = [CC, *cpu_build.FLAGS, "-ffp-contract=off", "-fopenmp", march, "-Wall",
               "-Werror", f"-I{KERNELS}", *[str(KERNELS / s) for s in SOURCES],
               str(Path(__file__).with_name("quant_cross_harness.c")), "-o", str(exe), "-lm"]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)
        built[name] = exe
    for name, proc in procs.items():
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
    dis = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(built["armv8.2-dotprod"])],
                         capture_output=True, text=True).stdout
    assert "sdot" in dis  # the dotprod build really takes the instruction
    return built


def _run(exe: Path, name: str, raw: torch.Tensor, x: torch.Tensor, bias: torch.Tensor,
         threads: int, tmp: Path) -> torch.Tensor:
    k = x.shape[1]
    for f, t in (("w", raw), ("x", x), ("b", bias)):
        t.contiguous().numpy().tofile(tmp / f)
    args = [QEMU, "-L", SYSROOT, str(exe), str(quant.KERNEL_TYPES[name]), str(k), str(N),
            str(x.shape[0]), str(threads), str(tmp / "w"), str(tmp / "x"), str(tmp / "b"),
            str(tmp / "y")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    y = np.fromfile(tmp / "y", dtype=np.float32).reshape(x.shape[0], N)
    return torch.from_numpy(y)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_arm_builds_give_the_bits_of_this_cpu(native_library, arm_harness, monkeypatch,
                                               tmp_path, target):
    from tandem.kernels import cpu as cpu_kernels
    monkeypatch.setitem(cpu_kernels._state, "lib", native_library)
    gen = torch.Generator().manual_seed(11)
    # the long rows (4096, 2080: a group's bytes past CHUNK_ABOVE) take the passes' turns
    cases = [(name, k) for name in TYPES
             for k in ((512, 4096) if name.endswith("_K") else (608, 2080))]
    for t, (name, k) in enumerate(cases):
        raw = random_blocks(name, N, k, seed=20 + t)
        w = QuantizedWeight([RawQuant(quant.KERNEL_TYPES[name], raw, k, name)])
        assert isinstance(w.segments[0], PackedQuant)
        # 32s of very different sizes, so x's sub-steps per 32 (K-quants) are not all one
        x = torch.randn(max(ROW_COUNTS), k, generator=gen)
        x *= 2.0 ** -torch.randint(0, 6, (1, k // 32), generator=gen).repeat_interleave(32, 1)
        bias = torch.randn(N, generator=gen)
        for rows in ROW_COUNTS:
            expected = w.matmul(x[:rows], bias)
            assert expected.abs().max() > 0
            for threads in (1, 2):
                got = _run(arm_harness[target], name, raw, x[:rows], bias, threads, tmp_path)
                assert torch.equal(got, expected), (name, k, rows, threads,
                                                    (got - expected).abs().max().item())


def test_the_whole_kernel_library_builds_for_arm(arm_harness, tmp_path):
    """Every source with its own flags, as cpu_build compiles them but at -O1, warnings as
    errors, linked into one shared library that exports every function the Python side binds.
    -O1: this checks that the Arm sources compile, warn of nothing and link; the bits of -O3's
    code are the harness's test above. At -O3 cross-compiling cpu_attention.c alone took 109 s
    on an AMD EPYC (17 s at -O2, 7.5 at -O1), two minutes of the suite."""
    flags = ["-O1" if flag.startswith("-O") else flag for flag in cpu_build.FLAGS]

    def compile_one(src: Path, extra: list[str]) -> tuple[str, subprocess.CompletedProcess]:
        obj = str(tmp_path / (src.stem + ".o"))
        return obj, subprocess.run([CC, *flags, *extra, "-fopenmp", TARGETS["armv8.0"],
                                    "-Wall", "-Werror", "-c", "-o", obj, str(src)],
                                   capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:  # a core each
        done = list(pool.map(compile_one, cpu_build.SOURCES, cpu_build.SOURCES.values()))
    for src, (_, proc) in zip(cpu_build.SOURCES, done):
        assert proc.returncode == 0, (src.name, proc.stderr[-3000:])
    objects = [obj for obj, _ in done]
    lib = tmp_path / "libtandem_arm.so"
    proc = subprocess.run([CC, "-shared", "-fopenmp", "-o", str(lib), *objects, "-lm"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    symbols = subprocess.run(["aarch64-linux-gnu-nm", "-D", "--defined-only", str(lib)],
                             capture_output=True, text=True).stdout.split()
    assert set(cpu_build.SIGNATURES) <= set(symbols)
