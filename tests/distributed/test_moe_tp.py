"""Qwen3-MoE at tensor_parallel_size=2 on real gloo processes: every rank holds half of every
expert's intermediate dimension and the whole router, and rank 0's routing of every verified
row (prefill, verify batches with a draft) equals transformers' routing of the final sequence."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.layers.moe import SparseMoeBlock
from tiny_moe import build_tiny_moe

PROMPT = "Once upon a time there was a little robot who wanted to learn how to paint"


def test_tp2_routing_and_tokens_equal_transformers(tmp_path, tiny_dirs):
    src = str(build_tiny_moe(tmp_path / "moe"))
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    prompt = AutoTokenizer.from_pretrained(src).encode(PROMPT)
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=16,
                            do_sample=False)[0].tolist()

    llm = LLM(src, tensor_parallel_size=2, speculative_config={
        "model": tiny_dirs["qwen3"], "num_speculative_tokens": 3, "adaptive": False})
    try:
        model = llm.llm_engine.model  # rank 0's shard
        blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        assert tuple(blocks[0].experts[0].gate_up_proj.weight.shape) == (2 * 16, 64)  # 32 / 2
        assert tuple(blocks[0].gate.weight.shape) == (8, 64)  # replicated
        inputs: list[tuple[list[int], list[int]]] = []
        routes: list[list[torch.Tensor]] = [[] for _ in blocks]
        model.register_forward_pre_hook(
            lambda m, args: inputs.append((args[0].tolist(), args[1].tolist())))
        for i, b in enumerate(blocks):
            b.gate.register_forward_hook(lambda m, a, out, i=i: routes[i].append(out[1].clone()))
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16,
                                                    ignore_eos=True), use_tqdm=False)
        assert prompt + list(out[0].outputs[0].token_ids) == want
    finally:
        llm.llm_engine.shutdown()

    ref_routes = [m for m in ref.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    ref_ids: list[torch.Tensor] = []
    for r in ref_routes:
        r.register_forward_hook(lambda m, a, out: ref_ids.append(out[2]))
    with torch.no_grad():
        ref(torch.tensor([want]))
    compared = verify_rows = 0
    for call, (ids, positions) in enumerate(inputs):
        for row, (t, p) in enumerate(zip(ids, positions)):
            if want[p] != t:
                break  # a rejected draft: the rows after it saw another context
            for layer in range(len(blocks)):
                assert torch.equal(routes[layer][call][row], ref_ids[layer][p]), (p, layer)
            compared += 1
            verify_rows += len(ids) > 1 and positions[0] >= len(prompt)
    assert compared >= len(want) - 1 and verify_rows > 0
