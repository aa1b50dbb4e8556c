"""The row-wise Triton kernels under the interpreter, against the engine's own torch layers
(layers/norm.py, layers/rotary.py, layers/activation.py): residual add + RMSNorm, q/k norm +
rotary + KV write, SiLU- and GELU(tanh)-and-mul, in float32 and float16."""

from __future__ import annotations

import pytest
import torch

from tandem.layers.activation import gelu_tanh_and_mul, silu_and_mul
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import RotaryEmbedding, rotate_qk

F32, F16 = torch.float32, torch.float16


def tol(dtype: torch.dtype) -> dict:
    return dict(atol=1e-5, rtol=1e-5) if dtype == F32 else dict(atol=2e-3, rtol=2e-3)


def norm_module(dim: int, unit_offset: bool, dtype: torch.dtype, seed: int) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6, unit_offset)
    g = torch.Generator().manual_seed(seed)
    norm.weight.data = (norm.weight + 0.3 * torch.randn(dim, generator=g)).to(dtype)
    return norm


@pytest.mark.parametrize("dtype,n,unit_offset,with_residual", [
    (F32, 48, False, True), (F32, 48, True, False), (F16, 1100, False, True),
    (F16, 1100, True, True)])
def test_add_rms_norm_is_the_layer(tk, dtype, n, unit_offset, with_residual):
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(5, n, generator=g)).to(dtype)
    residual = torch.randn(5, n, generator=g).to(dtype) if with_residual else None
    norm = norm_module(n, unit_offset, dtype, 2)
    want, want_res = norm.add(x.clone(), None if residual is None else residual.clone())
    res_in = None if residual is None else residual.clone()
    got, got_res = tk.norm.add_rms_norm(x, res_in, norm.weight.data, 1e-6, unit_offset)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert torch.equal(got_res, want_res)  # the sum, rounded once to the dtype
    if residual is None:
        assert got_res is x  # x starts the stream: no copy
    else:
        assert got_res is res_in  # the sum written in place, as the CPU kernel does
    torch.testing.assert_close(tk.norm.rms_norm(x, norm.weight.data, 1e-6, unit_offset),
                               norm(x), **tol(dtype))


@pytest.mark.parametrize("dtype", [F32, F16])
def test_gated_activations_are_the_layers(tk, dtype):
    g = torch.Generator().manual_seed(3)
    x = (4 * torch.randn(3, 2 * 1100, generator=g)).to(dtype)  # two column blocks per row
    torch.testing.assert_close(tk.activation.silu_and_mul(x), silu_and_mul(x), **tol(dtype))
    torch.testing.assert_close(tk.activation.gelu_tanh_and_mul(x), gelu_tanh_and_mul(x),
                               **tol(dtype))
    up_only = x.clone()
    up_only[:, 1100:] = 0  # the second half is up: zero up, zero output
    assert not tk.activation.silu_and_mul(up_only).any()


@pytest.mark.parametrize("h,hkv,d,dtype,norms,unit_offset,rotary_dim", [
    (4, 2, 16, F32, False, False, None),
    (4, 2, 64, F32, True, False, 32),     # Qwen3-style norms, partial rotary
    (2, 1, 128, F16, True, True, None),   # Gemma 3-style (1 + w) norms
])
def test_rope_write_kv_is_the_layer(tk, h, hkv, d, dtype, norms, unit_offset, rotary_dim):
    t, page = 5, 16
    g = torch.Generator().manual_seed(4)
    qkv = (2 * torch.randn(t, (h + 2 * hkv) * d, generator=g)).to(dtype)
    positions = torch.tensor([0, 7, 300, 1999, 42])
    cos, sin = RotaryEmbedding(d, {"rope_theta": 10000.0, "rope_type": "default"},
                               rotary_dim=rotary_dim)(positions)
    q_norm = norm_module(d, unit_offset, dtype, 5) if norms else None
    k_norm = norm_module(d, unit_offset, dtype, 6) if norms else None
    heads = qkv.view(t, h + 2 * hkv, d)
    want_q, want_k = rotate_qk(heads.clone(), (cos.to(dtype), sin.to(dtype)), h, q_norm, k_norm)
    want_v = heads[:, h + hkv:].clone()
    slots = torch.tensor([3, 17, -1, 40, 0], dtype=torch.int32)  # token 2 is padding
    k_cache = torch.full((3 * page, hkv, d), 9.0, dtype=dtype)
    v_cache = torch.full((3 * page, hkv, d), 9.0, dtype=dtype)
    q = tk.rope_kv.rope_write_kv(qkv, cos.to(dtype), sin.to(dtype), slots, k_cache, v_cache, h,
                                 hkv, d, q_norm.weight.data if norms else None,
                                 k_norm.weight.data if norms else None, 1e-6, unit_offset)
    assert q.data_ptr() == qkv.data_ptr()  # rotated in place in the projection's output
    torch.testing.assert_close(q, want_q, **tol(dtype))
    real = slots >= 0
    written = slots[real].long()
    torch.testing.assert_close(k_cache[written], want_k[real], **tol(dtype))
    assert torch.equal(v_cache[written], want_v[real])
    untouched = torch.ones(3 * page, dtype=torch.bool)
    untouched[written] = False
    assert (k_cache[untouched] == 9.0).all() and (v_cache[untouched] == 9.0).all()
