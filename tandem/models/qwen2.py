"""Qwen2ForCausalLM: the Llama decoder with biased q/k/v projections."""

from __future__ import annotations

from tandem.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
