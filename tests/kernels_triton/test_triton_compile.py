"""The interpreter runs the kernels as numpy and accepts code the compiler refuses, so every
kernel is also compiled here, with the real compiler, to a cubin for Hopper (sm_90) in
bfloat16 (float32 for one attention variant): no GPU is needed to compile. The arguments are
the ones each wrapper launches with, recorded by calling it with a stand-in kernel."""

from __future__ import annotations

import pytest
import torch

from kernels_triton.conftest import fresh_kernels, triton_compiles

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
         torch.int32: "i32", torch.int64: "i64"}
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


class Recorder:
    """Stands for a kernel: `kernel[grid](*args, **kwargs)` keeps the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def compile_call(kernel, args: tuple, kwargs: dict, capability: int = 90):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = kernel.arg_names
    signature, constexprs, attrs = {}, {}, {}
    aligned = [["tt.divisibility", 16]]  # what a launch specializes on, as triton.jit does
    for i, (name, value) in enumerate(zip(names, args)):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = aligned
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int) and value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        elif isinstance(value, int):
            signature[name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = aligned
        else:
            signature[name] = "fp32"
    for name, value in kwargs.items():
        if name not in OPTIONS:
            signature[name] = "constexpr"
            constexprs[name] = value
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def launches(mods, module: str, kernel: str, call) -> list[tuple[tuple, dict]]:
    """Calls `call(mods)` with `module.kernel` recorded and the device check off."""
    mod = getattr(mods, module)
    real, check = getattr(mod, kernel), mod.check_tensors
    recorder = Recorder()
    setattr(mod, kernel, recorder)
    mod.check_tensors = lambda *a, **k: None
    try:
        call(mods)
    finally:
        setattr(mod, kernel, real)
        mod.check_tensors = check
    return [(real, args, kwargs) for args, kwargs in recorder.calls]


def attention(mods, dtype, h, hkv, d, window, softcap, one_request=False):
    page = 16
    i32 = dict(dtype=torch.int32)
    if one_request:  # the launch specializes num_reqs = 1 and a table 1 block wide as constants
        tables, lens, starts = torch.zeros(1, 1, **i32), torch.tensor([9], **i32), [0, 1]
    else:
        tables, lens, starts = torch.zeros(2, 4, **i32), torch.tensor([9, 5], **i32), [0, 1, 6]
    q = torch.zeros(starts[-1], h, d, dtype=dtype)
    cache = torch.zeros(4 * page, hkv, d, dtype=dtype)
    mods.paged_attention.unified_attention(q, cache, cache, tables, lens,
                                           torch.tensor(starts, **i32), page, 0.1, window, softcap)


CALLS = {
    "attention bf16 window softcap": ("paged_attention", "_unified_attention_kernel",
                                      lambda m: attention(m, torch.bfloat16, 32, 8, 128, 512,
                                                          50.0)),
    "attention fp32 ieee rep 1": ("paged_attention", "_unified_attention_kernel",
                                  lambda m: attention(m, torch.float32, 4, 4, 64, None, None)),
    "attention bf16 one request": ("paged_attention", "_unified_attention_kernel",
                                   lambda m: attention(m, torch.bfloat16, 4, 1, 64, None, None,
                                                       one_request=True)),
    "add_rms_norm bf16": ("norm", "_add_rms_norm_kernel",
                          lambda m: m.norm.add_rms_norm(
                              torch.zeros(3, 4096, dtype=torch.bfloat16),
                              torch.zeros(3, 4096, dtype=torch.bfloat16),
                              torch.zeros(4096, dtype=torch.bfloat16), 1e-6)),
    "rope_write_kv bf16 norms": ("rope_kv", "_rope_write_kv_kernel",
                                 lambda m: m.rope_kv.rope_write_kv(
                                     torch.zeros(3, 48 * 128, dtype=torch.bfloat16),
                                     torch.zeros(3, 1, 128), torch.zeros(3, 1, 128),
                                     torch.zeros(3, dtype=torch.int32),
                                     torch.zeros(64, 8, 128, dtype=torch.bfloat16),
                                     torch.zeros(64, 8, 128, dtype=torch.bfloat16), 32, 8, 128,
                                     torch.zeros(128, dtype=torch.bfloat16),
                                     torch.zeros(128, dtype=torch.bfloat16))),
    "gelu_tanh_and_mul bf16": ("activation", "_act_and_mul_kernel",
                               lambda m: m.activation.gelu_tanh_and_mul(
                                   torch.zeros(3, 2 * 3000, dtype=torch.bfloat16))),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_kernel_compiles_for_hopper(case, tmp_path):
    triton = pytest.importorskip("triton")
    if not hasattr(triton, "knobs"):
        pytest.skip("compiling without a GPU is written against triton >= 3.4's API")
    if not triton_compiles():
        pytest.skip("triton was imported with TRITON_INTERPRET=1: nothing compiles here")
    module, kernel, call = CALLS[case]
    with fresh_kernels(interpret=False) as mods, triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(tmp_path)
        recorded = launches(mods, module, kernel, call)
        assert len(recorded) == 1
        compiled = compile_call(*recorded[0])
    assert compiled.asm["cubin"]
    assert compiled.metadata.shared <= 64 * 1024  # well under Hopper's 227 KiB per block
