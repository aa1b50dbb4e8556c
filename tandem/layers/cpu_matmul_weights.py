"""Applies the CPU matmul mode to a loaded model (TANDEM_CPU_MATMUL, layers/matmul_choice.py).

`c` needs the C kernels (loaded first); `blas` and `onednn` give up batch invariance, and say so
in the log. Only `bf16` touches weights: every linear layer's weight
(and the LM head's, as a separate copy when it is tied to the embedding) is stored in bfloat16,
which `layers/linear.linear` then multiplies against bfloat16-rounded activations. The other
modes pick kernels, not weights.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from tandem.kernels import cpu as cpu_kernels
from tandem.layers.embedding import LMHead
from tandem.layers.linear import ColumnParallelLinear, RowParallelLinear
from tandem.layers.matmul_choice import cpu_matmul_mode, native_bf16
from tandem.layers.quantized import is_quantized

logger = logging.getLogger(__name__)


def apply_cpu_matmul_mode(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    mode = cpu_matmul_mode()
    if mode == "c" and device.type == "cpu" and not cpu_kernels.enabled():
        raise ValueError("TANDEM_CPU_MATMUL='c' needs the fused CPU kernels, which are off "
                         "(TANDEM_CPU_KERNELS='torch', or they could not be built: see the log); "
                         "use 'auto', 'blas' or 'onednn'.")
    if mode in ("blas", "onednn") and device.type == "cpu":
        logger.warning("TANDEM_CPU_MATMUL=%s: torch's kernels pick their rounding by the batch's "
                       "shape, so a token's logits may differ in the last bits between plain "
                       "decoding, speculative verification and prefill (greedy speculation may "
                       "then differ from plain output); the default 'auto' keeps them equal.",
                       mode)
    if mode != "bf16":
        return
    if device.type != "cpu" or dtype != torch.float32:
        logger.info("TANDEM_CPU_MATMUL=bf16 applies to float32 models on CPU; this one runs in "
                    "%s on %s and is left as it is.", dtype, device)
        return
    if not native_bf16():
        raise ValueError("TANDEM_CPU_MATMUL='bf16' needs a CPU with native bfloat16 "
                         "(avx512_bf16 or amx_bf16 in /proc/cpuinfo); this one has neither. "
                         "Use 'auto', 'blas' or 'onednn'.")
    converted = 0
    with torch.no_grad():
        for module in model.modules():
            if is_quantized(module) or (isinstance(module, LMHead) and module.tied_to is not None
                                        and is_quantized(module.tied_to)):
                continue  # quantized weights keep their blocks
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                module.weight.data = module.weight.data.to(torch.bfloat16)
                converted += module.weight.numel()
            elif isinstance(module, LMHead):
                if module.tied_to is not None:
                    module.matmul_weight = module.tied_to.weight.detach().to(torch.bfloat16)
                    converted += module.matmul_weight.numel()
                else:
                    module.weight.data = module.weight.data.to(torch.bfloat16)
                    converted += module.weight.numel()
    logger.info("CPU matmul: %.1fM linear weights in bfloat16 (TANDEM_CPU_MATMUL=bf16); "
                "activations, norms, attention and the KV cache stay float32.", converted / 1e6)
