"""The Triton kernels of tandem/kernels/triton on a CUDA machine, in bfloat16, against the torch
path they replace (the engine's own layers: RMSNorm.add, rotate_qk + write_kv, the gated
activations, and the SDPA backend over gathered keys for attention): is each one right, and how
long does each take.

Per kernel and shape (Qwen3-8B's layer: hidden 4096, 32 query heads, 8 KV heads, head size 128,
intermediate 12288, blocks of 16): the largest error of the Triton kernel and of the torch path,
both against the torch path run in float32 on the same bfloat16 inputs, and the median time of
each (CUDA events). A kernel passes when its error is at most twice the torch path's plus 1e-2
of the reference's scale. For attention it also checks batch invariance on the device: the
first request's last query row, run alone as a decode step, must equal its row in the batch bit
for bit. Writes benchmarks/results/triton.json; exits 1 if a check failed.

    python benchmarks/bench_triton.py [--iters 50] [--output PATH]

`--smoke` runs the same checks on the CPU under Triton's interpreter, in float32 on tiny shapes,
so that the script is exercised where no CUDA machine is at hand (tests/kernels_triton); its
times mean nothing. Without --smoke it refuses to run where CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN3_8B = dict(hidden=4096, inter=12288, heads=32, kv_heads=8, head_dim=128, page=16,
                tokens=[32, 160, 2048])
TINY = dict(hidden=64, inter=96, heads=4, kv_heads=2, head_dim=16, page=16, tokens=[3, 7])
# attention batches: (new tokens, keys) per request
SCENARIOS = {"decode 32 x 1 @ 1024": [(1, 1024)] * 32,
             "verify 32 x 5 @ 1024": [(5, 1024)] * 32,
             "prefill 2048": [(2048, 2048)],
             "chunk 512 @ 2048 + 16 decodes @ 1024": [(512, 2048)] + [(1, 1024)] * 16}
SMOKE_SCENARIOS = {"decode 3 x 1": [(1, 40), (1, 17), (1, 33)],
                   "verify 2 x 5": [(5, 40), (5, 21)],
                   "chunk 10 @ 30 + decode": [(10, 30), (1, 20)]}


def median_ms(fn: Callable[[], object], device: str, iters: int) -> float:
    import torch
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def judge(got, torch_out, reference) -> dict:
    """Errors of the kernel and of the torch path against the float32 reference."""
    ref = reference.float()
    scale = ref.abs().max().item() or 1.0
    err = (got.float() - ref).abs().max().item()
    base = (torch_out.float() - ref).abs().max().item()
    return {"max_err": err, "torch_max_err": base, "ok": err <= 2 * base + 1e-2 * scale}


def bench_norm(kt, s: dict, t: int, dtype, device: str, iters: int) -> dict:
    import torch

    from tandem.layers.norm import RMSNorm
    x = torch.randn(t, s["hidden"], device=device).to(dtype)
    residual = torch.randn_like(x)
    norm = RMSNorm(s["hidden"], 1e-6).to(device)
    norm.weight.data = (1 + 0.1 * torch.randn(s["hidden"], device=device)).to(dtype)
    ref32 = RMSNorm(s["hidden"], 1e-6).to(device)
    ref32.weight.data = norm.weight.data.float()
    res_out = torch.empty_like(x)
    got, _ = kt.norm.add_rms_norm(x, residual, norm.weight, 1e-6, residual_out=res_out)
    want, _ = norm.add(x, residual)
    return {**judge(got, want, ref32.add(x.float(), residual.float())[0]),
            "triton_ms": median_ms(lambda: kt.norm.add_rms_norm(
                x, residual, norm.weight, 1e-6, residual_out=res_out), device, iters),
            "torch_ms": median_ms(lambda: norm.add(x, residual), device, iters)}


def bench_act(kt, s: dict, t: int, dtype, device: str, iters: int) -> dict:
    import torch

    from tandem.layers.activation import silu_and_mul
    x = torch.randn(t, 2 * s["inter"], device=device).to(dtype)
    got = kt.activation.silu_and_mul(x)
    return {**judge(got, silu_and_mul(x), silu_and_mul(x.float())),
            "triton_ms": median_ms(lambda: kt.activation.silu_and_mul(x), device, iters),
            "torch_ms": median_ms(lambda: silu_and_mul(x), device, iters)}


def bench_rope(kt, s: dict, t: int, dtype, device: str, iters: int) -> dict:
    import torch

    from tandem.attention.sdpa_backend import write_kv
    from tandem.layers.norm import RMSNorm
    from tandem.layers.rotary import RotaryEmbedding, rotate_qk
    h, hkv, d = s["heads"], s["kv_heads"], s["head_dim"]
    qkv = torch.randn(t, (h + 2 * hkv) * d, device=device).to(dtype)
    rope = RotaryEmbedding(d, {"rope_theta": 1e6, "rope_type": "default"}).to(device)
    cos, sin = rope(torch.randint(0, 4096, (t,), device=device))
    norms = [RMSNorm(d, 1e-6).to(device) for _ in range(2)]
    for n in norms:
        n.weight.data = (1 + 0.1 * torch.randn(d, device=device)).to(dtype)
    slots = torch.randperm(2 * t, device=device)[:t]
    cache = [torch.zeros(2 * t, hkv, d, device=device, dtype=dtype) for _ in range(4)]

    def torch_path(heads, caches, qn, kn):
        q, k = rotate_qk(heads, (cos, sin), h, qn, kn)
        write_kv(caches[0], caches[1], k, heads[:, h + hkv:], slots)
        return q

    def triton_path(buf):
        return kt.rope_kv.rope_write_kv(buf, cos, sin, slots.int(), cache[2], cache[3], h, hkv,
                                        d, norms[0].weight, norms[1].weight, 1e-6)

    heads = qkv.view(t, h + 2 * hkv, d)
    n32 = [RMSNorm(d, 1e-6).to(device) for _ in range(2)]
    for a, b in zip(n32, norms):
        a.weight.data = b.weight.data.float()
    want = torch_path(heads, cache, *norms)
    ref_cache = [c.float() for c in cache[:2]]
    ref = torch_path(heads.float(), ref_cache, *n32)
    got = triton_path(qkv.clone())
    out = judge(got, want, ref)
    k_check = judge(cache[2][slots], cache[0][slots], ref_cache[0][slots])
    out["ok"] = out["ok"] and k_check["ok"] and torch.equal(cache[3], cache[1])  # v: a copy
    buf = qkv.clone()
    return {**out, "triton_ms": median_ms(lambda: triton_path(buf), device, iters),
            "torch_ms": median_ms(lambda: torch_path(heads, cache, *norms), device, iters)}


def bench_attention(kt, s: dict, reqs: list, dtype, device: str, iters: int) -> dict:
    import torch

    from tandem.attention.metadata import build_attention_metadata
    from tandem.attention.sdpa_backend import paged_attention
    h, hkv, d, page = s["heads"], s["kv_heads"], s["head_dim"], s["page"]
    qlens, slens = [q for q, _ in reqs], [n for _, n in reqs]
    blocks = [-(-n // page) for n in slens]
    order = (torch.randperm(sum(blocks)) + 1).tolist()
    tables, at = [], 0
    for b in blocks:
        tables.append(order[at:at + b])
        at += b
    width = max(blocks)
    k_cache = torch.randn((sum(blocks) + 1) * page, hkv, d, device=device).to(dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(sum(qlens), h, d, device=device).to(dtype)
    i32 = dict(dtype=torch.int32, device=device)
    bt = torch.tensor([tb + [0] * (width - len(tb)) for tb in tables], **i32)
    lens = torch.tensor(slens, **i32)
    starts = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), **i32)
    meta = build_attention_metadata(qlens, slens, tables, page, torch.device(device))
    scale = d ** -0.5

    def triton_path(qq=q, b=bt, n=lens, st=starts):
        return kt.paged_attention.unified_attention(qq, k_cache, v_cache, b, n, st, page, scale)

    got = triton_path()
    want = paged_attention(q, k_cache, v_cache, meta, scale, None)
    ref = paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale, None)
    last = qlens[0] - 1  # the first request's last query, alone as a decode step
    alone = triton_path(q[last:last + 1].clone(), bt[:1], lens[:1],
                        torch.tensor([0, 1], **i32))
    return {**judge(got, want, ref), "batch_invariant": torch.equal(alone[0], got[last]),
            "triton_ms": median_ms(triton_path, device, iters),
            "torch_ms": median_ms(lambda: paged_attention(q, k_cache, v_cache, meta, scale, None),
                                  device, iters)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, Triton's interpreter, float32, tiny shapes: checks the script")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "triton.json")
    args = ap.parse_args()
    if args.smoke:  # read when triton and the kernel modules are imported, both below
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench_triton.py needs a CUDA device (or --smoke)")
    try:
        import triton
    except ImportError:
        raise SystemExit("bench_triton.py needs triton (pip install triton)")
    from tandem.kernels.triton import activation, norm, paged_attention, rope_kv, support
    if args.smoke:  # the interpreter's dots row by row, as a GPU's (support.py says why)
        support.interpret_dots_by_rows()

    class Kernels:  # the modules, by the names the benches use
        pass
    kt = Kernels()
    kt.norm, kt.activation, kt.rope_kv, kt.paged_attention = norm, activation, rope_kv, \
        paged_attention
    torch.manual_seed(0)
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    shape = TINY if args.smoke else QWEN3_8B
    iters = 1 if args.smoke else args.iters
    rows = []
    for t in shape["tokens"]:
        for name, fn in (("add_rms_norm", bench_norm), ("silu_and_mul", bench_act),
                         ("rope_write_kv", bench_rope)):
            rows.append({"kernel": name, "case": f"{t} tokens",
                         **fn(kt, shape, t, dtype, device, iters)})
    for case, reqs in (SMOKE_SCENARIOS if args.smoke else SCENARIOS).items():
        rows.append({"kernel": "unified_attention", "case": case,
                     **bench_attention(kt, shape, reqs, dtype, device, iters)})
    for r in rows:
        r["speedup"] = r["torch_ms"] / r["triton_ms"] if r["triton_ms"] else None
        extra = "" if "batch_invariant" not in r else f" invariant={r['batch_invariant']}"
        print(f"{r['kernel']:18s} {r['case']:38s} triton {r['triton_ms']:8.3f} ms  torch "
              f"{r['torch_ms']:8.3f} ms  err {r['max_err']:.2e} (torch {r['torch_max_err']:.2e})"
              f"  {'ok' if r['ok'] else 'FAIL'}{extra}")
    name = "cpu (--smoke, interpreter)" if args.smoke else torch.cuda.get_device_name(0)
    result = {"device": name, "dtype": str(dtype), "torch": torch.__version__,
              "triton": triton.__version__, "shape": {k: v for k, v in shape.items()
                                                      if k != "tokens"}, "kernels": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"saved {args.output}")
    if not all(r["ok"] and r.get("batch_invariant", True) for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
