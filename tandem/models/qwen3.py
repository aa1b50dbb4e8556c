"""Qwen3ForCausalLM: the Llama decoder with per-head RMSNorm on q and k, no q/k/v bias."""

from __future__ import annotations

from tandem.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
