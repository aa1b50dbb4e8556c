"""The CPU kernels from Python: when they apply, and handing tensors to C.

A step on the CPU spends much of its non-matmul time in torch's per-op overhead: RMSNorm is five
ops inside `F.rms_norm`, rotary and the KV write another six, paged attention two gathers, a mask
and an SDPA call per layer. The kernels in cpu_kernels.c do each of these in one call, and
cpu_attention.c attends every request of a step straight from the paged cache; cpu_gemm.c
multiplies every float32 linear layer. Each computes a row alone with its reductions in a fixed
order, so a row's result never depends on its batch (speculation stays lossless at every batch
size and k).

Each wrapper returns None (or False) when it does not apply (kernels off, not float32 on the
CPU, a layout it does not take), and the caller then runs its torch code, which computes the
same math. Which one runs is decided at model load (`configure`, from TANDEM_CPU_KERNELS; see
cpu_build.py) for the whole process.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Optional

import torch

from tandem.attention.kv_format import FORMATS as KV_FORMATS
from tandem.kernels.cpu_build import (build_library, cpu_kernels_mode, cpu_march, load_library,
                                      process_uses_libgomp)

logger = logging.getLogger("tandem")

_state: dict[str, Optional[ctypes.CDLL]] = {"lib": None}  # the loaded library, or None: torch ops


def configure(device: torch.device) -> None:
    """Apply TANDEM_CPU_KERNELS and TANDEM_CPU_MARCH for a model loaded on `device` (both
    validated first)."""
    mode, march = cpu_kernels_mode(), cpu_march()
    if mode == "torch":
        if march != "native":
            logger.warning("TANDEM_CPU_MARCH=%s has no effect: TANDEM_CPU_KERNELS=torch builds "
                           "no kernels", march)
        _state["lib"] = None
        return
    if device.type != "cpu" or _state["lib"] is not None:
        return
    try:
        path = build_library()
        _state["lib"] = load_library(path)
        logger.info("CPU kernels: fused C kernels from %s (TANDEM_CPU_KERNELS=%s)", path, mode)
        if not process_uses_libgomp() and torch.get_num_threads() > 1:
            logger.warning("CPU kernels: this process's OpenMP runtime is not GNU libgomp, so the "
                           "kernels run on one thread (a second thread pool would spin against "
                           "torch's); TANDEM_CPU_MATMUL=blas runs the linear layers on torch's "
                           "threads instead, giving up batch invariance.")
    except (RuntimeError, OSError) as e:
        if march != "native":  # a target the user named and the compiler refused: say so
            raise ValueError(f"TANDEM_CPU_MARCH={march!r}: the CPU kernels could not be built "
                             f"for it: {e}. Use 'native' or a target the compiler knows.") from e
        if mode == "c":
            raise ValueError(f"TANDEM_CPU_KERNELS='c' needs the fused CPU kernels, which could "
                             f"not be built: {e}. Use 'auto' or 'torch'.") from e
        logger.warning("CPU kernels: using torch ops, the fused C kernels are unavailable: %s", e)


def enabled() -> bool:
    return _state["lib"] is not None


_F32 = torch.float32


def _ok(t: torch.Tensor) -> bool:
    """A float32 CPU tensor in row-major order (what the kernels read)."""
    return t.dtype is _F32 and t.is_cpu and t.is_contiguous()


_KV_CODES = {f.storage: f.code for f in KV_FORMATS.values()}  # kv_format.h's enum, by dtype


def _kv_code(k_cache: torch.Tensor, v_cache: torch.Tensor) -> Optional[int]:
    """The kernels' format code of a pair of KV caches (contiguous, on the CPU, of one storage
    dtype: attention/kv_format.py), or None: not a pair the kernels read."""
    if (k_cache.dtype is not v_cache.dtype or not (k_cache.is_cpu and v_cache.is_cpu)
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        return None
    return _KV_CODES.get(k_cache.dtype)


def kv_rows(rows: torch.Tensor, kv_code: int, row_bytes: int) -> Optional[tuple[torch.Tensor,
                                                                               torch.Tensor]]:
    """rows [N, D] float32 stored in cache format kv_code by the kernels' writer and read back
    by their reader: (stored [N, row_bytes] uint8, loaded [N, D] float32), for the tests; None
    where the library is off or the format does not take D."""
    lib = _state["lib"]
    if lib is None or not _ok(rows) or rows.dim() != 2:
        return None
    stored = torch.empty(rows.shape[0], row_bytes, dtype=torch.uint8)
    loaded = torch.empty(rows.shape)
    rc = lib.tandem_kv_rows(kv_code, rows.data_ptr(), rows.shape[0], rows.shape[1],
                            stored.data_ptr(), loaded.data_ptr())
    return (stored, loaded) if rc == 0 else None


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             unit_offset: bool) -> Optional[torch.Tensor]:
    """x [..., dim] -> x / rms(x) * weight (or 1 + weight); None where the kernel does not apply."""
    if _state["lib"] is None or not _ok(x) or weight.dtype is not _F32:
        return None
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _state["lib"].tandem_add_rms_norm(x.data_ptr(), None, None, out.data_ptr(),
                                      weight.data_ptr(), x.numel() // dim if dim else 0, dim,
                                      eps, int(unit_offset))
    return out


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float, unit_offset: bool) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(norm(residual + x), residual + x), the sum written into `residual` in place (a new
    tensor when residual is None: the sum is then x). None when the kernel does not apply."""
    lib = _state["lib"]
    if (lib is None or not _ok(x) or weight.dtype is not _F32
            or (residual is not None and not _ok(residual))):
        return None
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    normed = torch.empty_like(x)
    if residual is None:  # the stream starts as a copy of x: x itself is never written
        residual, stream, delta = torch.empty_like(x), x, None
    else:
        stream, delta = residual, x
    lib.tandem_add_rms_norm(stream.data_ptr(), _ptr(delta), residual.data_ptr(),
                            normed.data_ptr(), weight.data_ptr(), rows, dim, eps, unit_offset)
    return normed, residual


def _act_and_mul(kernel: str, x: torch.Tensor) -> Optional[torch.Tensor]:
    """[T, 2I] -> act(x[:, :I]) * x[:, I:] by the library's `kernel`, or None when the kernel
    does not apply."""
    if _state["lib"] is None or x.dim() != 2 or not _ok(x):
        return None
    inter = x.shape[1] // 2
    out = x.new_empty(x.shape[0], inter)
    getattr(_state["lib"], kernel)(x.data_ptr(), out.data_ptr(), x.shape[0], inter)
    return out


def silu_and_mul(x: torch.Tensor) -> Optional[torch.Tensor]:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I], or None (see _act_and_mul)."""
    return _act_and_mul("tandem_silu_and_mul", x)


def gelu_tanh_and_mul(x: torch.Tensor) -> Optional[torch.Tensor]:
    """gelu(x[:, :I], approximate="tanh") * x[:, I:] for x [T, 2I], or None (see _act_and_mul)."""
    return _act_and_mul("tandem_gelu_tanh_and_mul", x)


def rope_write_kv(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                  slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int, head_dim: int,
                  q_norm: Optional[torch.nn.Module] = None,
                  k_norm: Optional[torch.nn.Module] = None) -> bool:
    """qkv [T, (H + 2 Hkv) D] in place: q and k heads RMS-normalised (when q_norm/k_norm are
    given) and rotated by rope (cos, sin [T, 1, D]); k and v written to the caches at
    slot_mapping, in their format (their dtype's: attention/kv_format.py). False (nothing done)
    when the kernel does not apply."""
    cos, sin = rope
    lib = _state["lib"]
    if (lib is None or qkv.dim() != 2
            or not (_ok(qkv) and _ok(cos) and _ok(sin)) or _kv_code(k_cache, v_cache) is None
            or slot_mapping.dtype is not torch.int64 or not slot_mapping.is_contiguous()
            or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim
            or cos.shape[-1] != head_dim):
        return False
    eps, unit_offset = 0.0, False
    if q_norm is not None:
        if (k_norm is None or q_norm.eps != k_norm.eps or q_norm.unit_offset != k_norm.unit_offset
                or q_norm.weight.dtype is not _F32 or k_norm.weight.dtype is not _F32):
            return False
        eps, unit_offset = q_norm.eps, q_norm.unit_offset
    # The kernel refuses (-1, before writing anything) head sizes it does not take.
    rc = lib.tandem_rope_write_kv(
        qkv.data_ptr(), qkv.shape[0], num_heads, num_kv_heads, head_dim, cos.data_ptr(),
        sin.data_ptr(), slot_mapping.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        _ptr(q_norm.weight if q_norm is not None else None),
        _ptr(k_norm.weight if k_norm is not None else None), eps, int(unit_offset),
        _kv_code(k_cache, v_cache))
    return rc == 0


def attention_takes(head_dim: int) -> bool:
    """Head sizes the attention kernel takes (cpu_attention.c: multiples of 16 up to 512), so a
    layer with another size goes straight to SDPA instead of asking the kernel every step."""
    return _state["lib"] is not None and head_dim % 16 == 0 and head_dim <= 512


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    out: torch.Tensor, requests: torch.Tensor, kv_slots: torch.Tensor,
                    scale: float, sliding_window: Optional[int],
                    softcap: Optional[float] = None) -> bool:
    """Attention of every request of a step (any number of queries each) straight from the
    paged cache, into out [T, H, D]; each query row's bits are its own (cpu_attention.c).

    q: [T, H, D] whose heads are contiguous within a token (any token stride: a view of the
    qkv projection works); requests: [G, 3] int64 (first query row, query count, keys);
    kv_slots: [G, Lmax] int64; softcap: scores capped as softcap * tanh(s / softcap) (Gemma 2);
    the caches' rows in their dtype's format (attention/kv_format.py). False (nothing done)
    when the kernel does not apply."""
    lib = _state["lib"]
    t, h, d = q.shape
    hkv = k_cache.shape[1]
    stride = q.stride()
    if (lib is None or stride[2] != 1 or stride[1] != d or q.dtype is not _F32 or not q.is_cpu
            or _kv_code(k_cache, v_cache) is None or not _ok(out)
            or not (requests.is_contiguous() and kv_slots.is_contiguous())):
        return False  # requests and kv_slots: int64 (metadata.py builds them so)
    # The kernel refuses (-1, before writing anything) head sizes and GQA ratios it does not take.
    rc = lib.tandem_paged_attention(
        q.data_ptr(), stride[0], k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
        requests.data_ptr(), kv_slots.data_ptr(), requests.shape[0], kv_slots.shape[1], h, hkv,
        d, scale, sliding_window or 0, softcap or 0.0, _kv_code(k_cache, v_cache),
        torch.get_num_threads())
    return rc == 0


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """x [T, in] @ weight [out, in].T (+ bias) -> [T, out] by cpu_gemm.c, on torch's thread
    count, each row's bits its own; None when the kernel does not apply (a layout or dtype it
    does not take). layers/matmul_choice.py decides where it runs (every float32 linear layer,
    by default)."""
    lib = _state["lib"]
    if (lib is None or x.dim() != 2 or not _ok(x) or not _ok(weight)
            or (bias is not None and not _ok(bias))):
        return None
    rows, k = x.shape
    y = x.new_empty(rows, weight.shape[0])
    rc = lib.tandem_linear(x.data_ptr(), weight.data_ptr(), _ptr(bias), y.data_ptr(), rows,
                           weight.shape[0], k, torch.get_num_threads())
    return y if rc == 0 else None


def evict(t: torch.Tensor) -> bool:
    """Evicts t's memory from the CPU caches; False where the library is off or cannot."""
    lib = _state["lib"]
    return lib is not None and lib.tandem_evict(t.data_ptr(), t.numel() * t.element_size()) == 0


def llama_stack(x: torch.Tensor, dims: torch.Tensor, table: torch.Tensor,
                final_norm: torch.Tensor, eps: float, qk_eps: float, qk_unit_offset: bool,
                rope: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                requests: torch.Tensor, kv_slots: torch.Tensor,
                scale: float) -> Optional[torch.Tensor]:
    """A Llama-family decoder stack in one call (cpu_decoder.c): x [T, hidden] embeddings ->
    the final norm's output [T, hidden]. dims: [6] int64 (hidden, intermediate, heads, KV
    heads, head size, quantized weights); table: [layers, 11] int64 addresses (models/llama_fused.py). None when
    a kernel refused (the caller then runs the layers one by one, rewriting the same slots)."""
    lib = _state["lib"]
    cos, sin = rope
    if lib is None or not (_ok(x) and _ok(cos) and _ok(sin)) or not slot_mapping.is_contiguous():
        return None
    out = torch.empty_like(x)
    rc = lib.tandem_llama_stack(
        x.data_ptr(), out.data_ptr(), x.shape[0], dims.data_ptr(), table.shape[0],
        table.data_ptr(), final_norm.data_ptr(), eps, qk_eps, int(qk_unit_offset),
        cos.data_ptr(), sin.data_ptr(), slot_mapping.data_ptr(), requests.data_ptr(),
        kv_slots.data_ptr(), requests.shape[0], kv_slots.shape[1], scale,
        torch.get_num_threads())
    return out if rc == 0 else None


def gemma_stack(x: torch.Tensor, dims: torch.Tensor, table: torch.Tensor, kinds: torch.Tensor,
                final_norm: torch.Tensor, eps: float, qk_eps: float,
                rope_local: tuple[torch.Tensor, torch.Tensor],
                rope_global: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                requests: torch.Tensor, kv_slots: torch.Tensor,
                scale: float) -> Optional[torch.Tensor]:
    """A Gemma 3 decoder stack in one call (cpu_decoder_gemma.c): x [T, hidden] embeddings ->
    the final norm's output [T, hidden]. dims as llama_stack's; table: [layers, 13] int64
    addresses, kinds: [layers, 2] int64 (window, local rope) (models/gemma3_fused.py). None
    when a kernel refused (the caller then runs the layers one by one, rewriting the same
    slots)."""
    lib = _state["lib"]
    ropes = (*rope_local, *rope_global)
    if (lib is None or not _ok(x) or not all(_ok(r) for r in ropes)
            or not slot_mapping.is_contiguous()):
        return None
    out = torch.empty_like(x)
    rc = lib.tandem_gemma_stack(
        x.data_ptr(), out.data_ptr(), x.shape[0], dims.data_ptr(), table.shape[0],
        table.data_ptr(), kinds.data_ptr(), final_norm.data_ptr(), eps, qk_eps,
        *(r.data_ptr() for r in ropes), slot_mapping.data_ptr(), requests.data_ptr(),
        kv_slots.data_ptr(), requests.shape[0], kv_slots.shape[1], scale,
        torch.get_num_threads())
    return out if rc == 0 else None
