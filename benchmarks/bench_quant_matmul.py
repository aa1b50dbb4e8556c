"""One quantized matmul, timed (weights interleaved 16 rows at a time, the kernels' one layout).

    .venv/bin/python benchmarks/bench_quant_matmul.py --shapes Q4_K:12288:4096,Q8_0:3072:576 \
        --rows 1,5,16 --threads 2 --rounds 5

Each shape is `TYPE:OUT:IN` with random blocks of that ggml type (float16 scales kept in a sane
range). Each figure is the median over rounds of the best of `--reps` calls. Prints microseconds
per call and the weight's bytes per microsecond at one x row, with the CPU named (GGUF's row
order, which it once timed beside, is retired: benchmarks/LOG.md has those ratios). A
kernel-level figure: the engine's own speeds come from `tandem bench`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "llama_cpp"))
sys.path.insert(0, str(ROOT / "tests"))

from peer import cpu, cpu_line  # noqa: E402  (the CPU named as the peer benchmark names it)

from tandem.kernels import cpu as cpu_kernels, quant  # noqa: E402
from tandem.layers.quantized import QuantizedWeight, RawQuant  # noqa: E402

from models.test_quantized_kernels import random_blocks  # noqa: E402

def random_weight(name: str, out: int, k: int) -> QuantizedWeight:
    """Random blocks of `name` with sane float16 scales (the kernel tests' own)."""
    return QuantizedWeight([RawQuant(quant.KERNEL_TYPES[name], random_blocks(name, out, k), k,
                                     name)])


def best_us(w: QuantizedWeight, x: torch.Tensor, reps: int) -> float:
    w.matmul(x, None)  # warm: caches, the x buffer
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        w.matmul(x, None)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="Q4_1:3072:576,Q8_0:3072:576,Q4_K:3072:1024,"
                   "Q6_K:3072:1024,Q4_K:12288:4096")
    p.add_argument("--rows", default="1,2,4,5,8,16", help="x rows (batch) per call")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu_kernels.configure(torch.device("cpu"))  # builds or loads the kernel library
    print(cpu_line(cpu()), f"| {args.threads} threads")
    print(f"{'shape':>18} {'x rows':>6} {'us':>9} {'MB/ms (1 row)':>14}")
    for shape in args.shapes.split(","):
        name, out, k = shape.split(":")
        out, k = int(out), int(k)
        w = random_weight(name, out, k)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k)
            med = statistics.median(best_us(w, x, args.reps) for _ in range(args.rounds))
            rate = w.nbytes / med / 1e3 if m == 1 else None
            print(f"{shape:>18} {m:>6} {med:>9.1f} {'' if rate is None else f'{rate:.1f}':>14}")


if __name__ == "__main__":
    main()
