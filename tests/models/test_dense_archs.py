"""Phi-3, Gemma 2, OLMo 2, Granite and a multimodal Gemma 3 checkpoint served as text, against
transformers on tiny random checkpoints built from transformers' own config classes
(tests/tiny_models.py `_dense_config`: LongRoPE over a partial rotary, soft-capping, sliding
windows, post-norms, Granite's multipliers, a vision tower to skip)."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.attention.context import forward_context
from tandem.attention.metadata import build_attention_metadata
from tandem.loader.hf_config import load_hf_config
from tandem.loader.model_source import resolve_model
from tandem.loader.weights import iter_safetensors
from tandem.models.registry import build_model

from tiny_models import DENSE_ARCHS

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def reference(model_dir: str):
    if "gemma3_mm" in model_dir:
        from transformers import Gemma3ForConditionalGeneration
        return Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def ours(model_dir: str, max_model_len=None):
    cfg = load_hf_config(resolve_model(model_dir))
    model = build_model(cfg, torch.float32, torch.device("cpu"), iter_safetensors(model_dir),
                        max_model_len)
    for attn in model.attention_layers():
        attn.k_cache = torch.zeros(64 * 4, attn.num_kv_heads, attn.head_dim)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    return model


def run(model, chunks, tables):
    """chunks: (request index, token ids, first position), one flat batch."""
    ids = torch.tensor([t for _, c, _ in chunks for t in c])
    pos = torch.tensor([p for _, c, s in chunks for p in range(s, s + len(c))])
    meta = build_attention_metadata([len(c) for _, c, _ in chunks],
                                    [s + len(c) for _, c, s in chunks],
                                    [tables[r] for r, _, _ in chunks], 4, torch.device("cpu"))
    with forward_context(meta), torch.no_grad():
        return model.compute_logits(model(ids, pos))


@pytest.mark.parametrize("arch", DENSE_ARCHS)
def test_logits_match_transformers(dense_dirs, prompts, arch):
    """A prompt prefilled in two chunks beside a second request, then one decode step for both
    (prompts longer than the sliding windows and Phi-3's original LongRoPE length)."""
    d = dense_dirs[arch]
    model, ref = ours(d), reference(d)
    tok = AutoTokenizer.from_pretrained(d)
    a, b = tok.encode(prompts[2]), tok.encode(prompts[7])
    tables = [list(range(0, 32)), list(range(32, 64))]
    split = len(a) // 2
    first = run(model, [(0, a[:split], 0)], tables)
    second = run(model, [(0, a[split:], split), (1, b, 0)], tables)
    with torch.no_grad():
        ref_a, ref_b = ref(torch.tensor([a])).logits[0], ref(torch.tensor([b])).logits[0]
    torch.testing.assert_close(first, ref_a[:split], atol=1e-4, rtol=0)
    torch.testing.assert_close(second[:len(a) - split], ref_a[split:], atol=1e-4, rtol=0)
    torch.testing.assert_close(second[len(a) - split:], ref_b, atol=1e-4, rtol=0)
    nxt = [int(ref_a[-1].argmax()), int(ref_b[-1].argmax())]
    dec = run(model, [(0, [nxt[0]], len(a)), (1, [nxt[1]], len(b))], tables)
    with torch.no_grad():
        want = [ref(torch.tensor([a + [nxt[0]]])).logits[0, -1],
                ref(torch.tensor([b + [nxt[1]]])).logits[0, -1]]
    torch.testing.assert_close(dec, torch.stack(want), atol=1e-4, rtol=0)


def test_phi3_short_longrope_factors(dense_dirs, prompts):
    """max_model_len within original_max_position_embeddings: the short factors, which
    transformers uses for sequences that short (the long ones differ: checked too)."""
    d = dense_dirs["phi3"]
    ids = AutoTokenizer.from_pretrained(d).encode(prompts[0])[:4]
    short, long = ours(d, max_model_len=4), ours(d)
    with torch.no_grad():
        want = reference(d)(torch.tensor([ids])).logits[0]
    got = run(short, [(0, ids, 0)], [list(range(32))])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert (run(long, [(0, ids, 0)], [list(range(32))]) - want).abs().max() > 1e-3


def hf_greedy(model_dir: str, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = reference(model_dir).generate(ids, max_new_tokens=n, min_new_tokens=n,
                                            do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("arch", DENSE_ARCHS)
def test_greedy_and_speculative_match_transformers(dense_dirs, tli_draft, prompts, arch, caplog):
    """The engine's greedy tokens equal transformers' generate; speculative decoding changes
    none of them, with the target as its own draft (same vocabulary: every verify step checks
    k drafts) and with a Llama draft over another tokenizer (TLI)."""
    d = dense_dirs[arch]
    tok = AutoTokenizer.from_pretrained(d)
    batch = prompts[:2]
    with caplog.at_level(logging.INFO, logger="tandem"):
        plain = [o.outputs[0].token_ids for o in LLM(d).generate(batch, GREEDY, use_tqdm=False)]
    if arch == "gemma3_mm":
        skips = [r for r in caplog.records if "vision tower" in r.getMessage()]
        assert len(skips) == 1
        assert "skipped 34 vision tower and projector tensors" in skips[0].getMessage()
    assert plain[0] == hf_greedy(d, tok.encode(batch[0]), GREEDY.max_tokens)
    for spec in ({"model": d, "num_speculative_tokens": 3, "adaptive": False},
                 {"model": tli_draft, "num_speculative_tokens": 2, "adaptive": False,
                  "use_heterogeneous_vocab": True}):
        llm = LLM(d, speculative_config={**spec, "method": "draft_model"})
        got = [o.outputs[0].token_ids for o in llm.generate(batch, GREEDY, use_tqdm=False)]
        assert got == plain, spec["model"]
        accepted = next(m.value for m in llm.get_metrics()
                        if m.name == "tandem:spec_decode_num_accepted_tokens")
        if spec["model"] == d:
            assert accepted > 16  # verification really ran over accepted drafts


@pytest.mark.parametrize("arch,field", [("phi3", "num_key_value_heads"),
                                        ("granite", "residual_multiplier"),
                                        ("gemma2", "query_pre_attn_scalar")])
def test_missing_config_field_is_named(dense_dirs, arch, field):
    """A config.json without the field (written for another model_type, say) is refused by name."""
    from transformers import PretrainedConfig

    full = load_hf_config(resolve_model(dense_dirs[arch])).to_dict()
    cfg = PretrainedConfig(**{k: v for k, v in full.items() if k != field})
    with pytest.raises(ValueError, match=f"needs the config field '{field}'"):
        build_model(cfg, torch.float32, torch.device("cpu"), None)
