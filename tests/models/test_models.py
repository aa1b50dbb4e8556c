"""Our model code against transformers' on the same tiny checkpoints (float32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem.attention.context import forward_context
from tandem.attention.metadata import build_attention_metadata
from tandem.loader.weights import iter_safetensors
from tandem.models.registry import build_model, model_class, supported_architectures

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]


def _ours(model_dir: str):
    cfg = AutoConfig.from_pretrained(model_dir)
    model = build_model(cfg, torch.float32, torch.device("cpu"), iter_safetensors(model_dir))
    for attn in model.attention_layers():
        attn.k_cache = torch.zeros(64 * 4, attn.num_kv_heads, attn.head_dim)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_with_chunks_and_batches(tiny_dirs, prompts, arch):
    """Two requests in one flat batch, the first prefilled in two chunks (the second chunk
    attends to paged KV written by the first); prompts longer than Gemma's tiny sliding window."""
    d = tiny_dirs[arch]
    ours = _ours(d)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d)
    a = tok.encode(prompts[2])
    b = tok.encode(prompts[7])
    tables = [list(range(0, 32)), list(range(32, 64))]
    split = len(a) // 2
    with torch.no_grad():
        ref_a = ref(torch.tensor([a])).logits[0]
        ref_b = ref(torch.tensor([b])).logits[0]

    def run(chunks):  # chunks: list of (request index, token ids, start)
        ids = torch.tensor([t for _, c, _ in chunks for t in c])
        pos = torch.tensor([p for _, c, s in chunks for p in range(s, s + len(c))])
        meta = build_attention_metadata([len(c) for _, c, _ in chunks],
                                        [s + len(c) for _, c, s in chunks],
                                        [tables[r] for r, _, _ in chunks], 4, torch.device("cpu"))
        with forward_context(meta), torch.no_grad():
            return ours.compute_logits(ours(ids, pos))

    first = run([(0, a[:split], 0)])
    second = run([(0, a[split:], split), (1, b, 0)])
    assert torch.allclose(first, ref_a[:split], atol=1e-3, rtol=0)
    assert torch.allclose(second[:len(a) - split], ref_a[split:], atol=1e-3, rtol=0)
    assert torch.allclose(second[len(a) - split:], ref_b, atol=1e-3, rtol=0)
    # One decode step for both requests in a single padded group.
    nxt = [int(ref_a[-1].argmax()), int(ref_b[-1].argmax())]
    dec = run([(0, [nxt[0]], len(a)), (1, [nxt[1]], len(b))])
    with torch.no_grad():
        want_a = ref(torch.tensor([a + [nxt[0]]])).logits[0, -1]
        want_b = ref(torch.tensor([b + [nxt[1]]])).logits[0, -1]
    assert (dec[0] - want_a).abs().max() <= 1e-3
    assert (dec[1] - want_b).abs().max() <= 1e-3


def test_unknown_architecture_lists_supported():
    cfg = AutoConfig.for_model("gpt2")
    cfg.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError) as e:
        model_class(cfg)
    assert "GPT2LMHeadModel" in str(e.value)
    for arch in supported_architectures():
        assert arch in str(e.value)
