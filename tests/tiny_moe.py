"""A tiny random Qwen3-MoE model directory (transformers' own Qwen3MoeConfig and model), written
as a user's Hugging Face directory is: 8 experts, 2 per token, a dense layer among sparse ones."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_models import build_bytelevel_tokenizer


def build_tiny_moe(out_dir: Path, seed: int = 0, num_layers: int = 3, hidden: int = 64,
                   **overrides) -> Path:
    """Layers 0 and 2 sparse, layer 1 dense (mlp_only_layers), unless overridden. The router's
    weights are scaled up so that its top-k choices are clear (random init gives nearly uniform
    router probabilities, whose order float noise could decide), and embeddings and LM head as
    in tiny_models.build_tiny_model."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_bytelevel_tokenizer(out_dir)
    fields = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                  moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, max_position_embeddings=512, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    fields.update(overrides)
    cfg = Qwen3MoeConfig(**fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.mul_(4.0)
            elif name.endswith("lm_head.weight"):
                p.mul_(4.0)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
            elif ".mlp.experts." in name:  # transformers' init leaves stacked experts at 0.02
                p.normal_(0.0, 0.05)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
