"""The engine through the Triton path on the CPU: tiny models' decode and verification steps run
the Triton kernels under the interpreter (kernels/triton_route.routing), eagerly and through the
graph runner's stand-ins for CUDA graphs (padded to a bucket over the persistent buffers), and
give the CPU path's greedy tokens with close logprobs; padded and unpadded steps agree to the
bit; a batch larger than every bucket runs eagerly; enforce_eager never captures."""

from __future__ import annotations

import types
from typing import Any, Callable

import pytest

from tandem import LLM, SamplingParams
from tandem.kernels import triton_route

PROMPTS = ["The future of AI is", "Hello, my name is",
           "Once upon a time there was a little robot"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
FUNCTIONS = {"norm": ("rms_norm", "add_rms_norm"), "activation": ("silu_and_mul",
                                                                  "gelu_tanh_and_mul"),
             "rope_kv": ("rope_write_kv",), "paged_attention": ("unified_attention",)}


class Counted:
    """The interpreted kernel modules, each launch counted by name (the route really ran)."""

    def __init__(self, tk: types.SimpleNamespace) -> None:
        self.calls: dict[str, int] = {}
        for module, names in FUNCTIONS.items():
            setattr(self, module, types.SimpleNamespace(
                **{n: self._count(n, getattr(getattr(tk, module), n)) for n in names}))

    def _count(self, name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call


def run(model: str, params=GREEDY, **kwargs: Any):
    # a float32 cache on both paths: the Triton kernels read a cache of the model's dtype (on
    # CUDA "auto"'s choice), and the CPU path's default float16 cache would round it
    kwargs.setdefault("kv_cache_dtype", "float32")
    llm = LLM(model, max_num_seqs=4, disable_log_stats=True, **kwargs)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return outs, llm.llm_engine.executor.runners["target"]


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def logprobs(outs) -> list[float]:
    return [lp[t].logprob for o in outs for lp in o.outputs[0].logprobs for t in sorted(lp)]


DENSE = ("phi3", "gemma2", "olmo2", "granite")


@pytest.fixture(scope="module")
def models(tiny_dirs, dense_dirs) -> dict[str, str]:
    return {**tiny_dirs, **dense_dirs}


@pytest.fixture(scope="module")
def cpu_reference(models) -> dict[str, Any]:
    """The CPU path's outputs (C kernels), computed before any route is on."""
    return {arch: run(models[arch])[0] for arch in ("llama", "qwen3", "gemma3") + DENSE}


@pytest.fixture
def kernels(tk) -> Counted:
    counted = Counted(tk)
    with triton_route.routing(counted):
        yield counted


def test_llama_eager_and_graphed_steps_match_the_cpu_path(tiny_dirs, cpu_reference, kernels):
    ref = cpu_reference["llama"]
    eager, eager_runner = run(tiny_dirs["llama"], enforce_eager=True)
    assert not eager_runner.graphs and not eager_runner.replays  # enforce_eager never captures
    assert set(kernels.calls) == {"add_rms_norm", "silu_and_mul", "rope_write_kv",
                                  "unified_attention"}  # every layer on the Triton path
    assert tokens(eager) == tokens(ref)
    assert logprobs(eager) == pytest.approx(logprobs(ref), abs=1e-5)
    graphed, runner = run(tiny_dirs["llama"])  # enforce_eager=False, vLLM's default
    assert sorted(runner.graphs) == [(1, 1), (2, 1), (4, 1)]  # max_num_seqs 4: 1, 2, 4
    assert runner.replays == {(4, 1): 5}  # 3 requests padded to 4, every decode step
    assert tokens(graphed) == tokens(ref)
    assert logprobs(graphed) == logprobs(eager)  # padding changes no real row's bits


def test_verification_is_graphed_and_lossless(tiny_dirs, cpu_reference, kernels):
    spec = {"model": tiny_dirs["llama"], "num_speculative_tokens": 2, "adaptive": False}
    outs, runner = run(tiny_dirs["llama"], speculative_config=spec)
    assert sorted(runner.graphs) == [(b, q) for b in (1, 2, 4) for q in (1, 3)]
    assert runner.replays[(4, 3)] >= 1  # verifying 1 + 2 tokens of 3 requests, padded
    assert tokens(outs) == tokens(cpu_reference["llama"])


def test_larger_batches_than_every_bucket_run_eagerly(tiny_dirs, cpu_reference, kernels):
    # 3 requests finishing at 2, 4 and 6 tokens: 3 at once is above the largest size (2), eager;
    # then 2, then 1, each replayed from its graph
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (2, 4, 6)]
    outs, runner = run(tiny_dirs["llama"], params, cuda_graph_sizes=[1, 2])
    assert sorted(runner.graphs) == [(1, 1), (2, 1)]
    assert runner.replays == {(2, 1): 2, (1, 1): 2}
    assert tokens(outs) == [t[:n] for t, n in zip(tokens(cpu_reference["llama"]), (2, 4, 6))]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", *DENSE])
def test_every_architecture_matches_the_cpu_path(models, cpu_reference, kernels, arch):
    """Graphed: Qwen3's q/k norms; Gemma 3's (1 + w) norms, sliding windows and GELU; Phi-3's
    partial rotary (LongRoPE); Gemma 2's soft-capped attention; OLMo 2's norms over the whole
    projection; Granite's multipliers."""
    outs, runner = run(models[arch])
    assert runner.replays == {(4, 1): 5}
    assert "rope_write_kv" in kernels.calls and "unified_attention" in kernels.calls
    assert tokens(outs) == tokens(cpu_reference[arch])
    assert logprobs(outs) == pytest.approx(logprobs(cpu_reference[arch]), abs=1e-5)


def test_the_route_is_off_outside_the_block(tk):
    import torch
    x = torch.zeros(2, 4)
    assert triton_route.kernels_for(x) is None
    with triton_route.routing(tk):
        assert triton_route.kernels_for(x) is tk
        assert triton_route.kernels_for(x.double()) is None  # float32 only on the CPU
        assert triton_route.serves(torch.device("cpu"), torch.float32)
    assert triton_route.kernels_for(x) is None
    assert not triton_route.serves(torch.device("cpu"), torch.float32)
