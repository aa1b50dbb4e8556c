"""Triton kernels for the CUDA path (developed and tested on the CPU under Triton's interpreter).

One concept per module, each a `@triton.jit` kernel and a typed Python wrapper over torch
tensors: `norm.py` (residual add + RMSNorm), `rope_kv.py` (q/k norm + rotary + KV-cache write),
`paged_attention.py` (one unified paged-attention kernel for decode, verification and prefill
chunks), `activation.py` (SiLU- and GELU(tanh)-and-mul). With the three matmuls of a layer (qkv,
o, gate/up, down: four) a Llama-family layer is about 9 launches: add+norm, qkv, rope+KV write,
attention, o, add+norm, gate/up, act-and-mul, down.

Every kernel is batch invariant: a row's result depends on its own inputs only, never on how many
rows the launch has or where the row sits in it (fixed tile sizes chosen by head size and dtype,
reductions in a fixed order), so speculative verification and decoding agree bit for bit.
Wrappers take sizes from tensor shapes only (no `.item()`, no host sync), so they can be captured
in a CUDA graph over persistent int32 buffers (padded requests: 0 keys, slot -1).

Nothing here imports triton at `import tandem` time: `support.py` imports it guardedly, and
`available()` says whether the kernels can run (triton installed, and CUDA or the interpreter).
"""

from __future__ import annotations

from tandem.kernels.triton.support import available

__all__ = ["available"]
