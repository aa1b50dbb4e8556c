"""A synthetic draft/target pair with real text behaviour and a cost ratio we choose.

Target = SmolLM2-135M plus `extra` layers appended after its 30, each a copy of one of SmolLM2's
layers with its output projections (o_proj, down_proj) scaled by `eps`, so each adds a small
perturbation to the residual stream. The draft is SmolLM2 itself. `extra` sets the cost ratio,
`eps` how often the target's choice differs from the draft's. It is a synthetic pair: say so
wherever its numbers are quoted.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tandem.loader.gguf_loader import iter_gguf_tensors, load_gguf_config, load_gguf_tokenizer
from tandem.loader.model_source import resolve_model

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def build_target(out_dir: Path, extra: int, eps: float) -> Path:
    out_dir = Path(out_dir)
    stamp = out_dir / "synthetic.json"
    spec = {"extra_layers": extra, "eps": eps}
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf = resolve_model(SMOLLM2).gguf_file
    cfg = load_gguf_config(gguf)
    base_layers = cfg.num_hidden_layers
    tensors = dict(iter_gguf_tensors(gguf, cfg))
    for i in range(extra):
        src = i % base_layers
        for name, t in list(tensors.items()):
            prefix = f"model.layers.{src}."
            if name.startswith(prefix):
                new = name.replace(prefix, f"model.layers.{base_layers + i}.")
                scale = eps if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                tensors[new] = (t * scale).contiguous()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    cfg.num_hidden_layers = base_layers + extra
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(out_dir)
    load_gguf_tokenizer(gguf).save_pretrained(out_dir)
    stamp.write_text(json.dumps(spec))
    return out_dir


def build_random_draft(out_dir: Path, layers: int = 4, hidden: int = 256, seed: int = 0) -> Path:
    """A useless draft for SmolLM2-shaped targets: SmolLM2's tokenizer, independent random
    weights (a small llama), so it almost never agrees. For adaptive speculation's worst case."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    if (out_dir / "model.safetensors").exists():
        return out_dir
    gguf = resolve_model(SMOLLM2).gguf_file
    cfg = load_gguf_config(gguf)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = layers, hidden, 4 * hidden
    cfg.num_attention_heads, cfg.num_key_value_heads = 4, 4
    cfg.head_dim = hidden // 4
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out_dir)
    load_gguf_tokenizer(gguf).save_pretrained(out_dir)
    return out_dir
