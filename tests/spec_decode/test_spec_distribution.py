"""Speculative sampling draws from the target's exact distribution, end to end through the engine.

A 24-token word-level llama is small enough to enumerate the exact distribution of the first three
generated tokens (24^3 sequences) with transformers. Tens of thousands of speculative samples
(temperature 0.8, top_p 0.95, k = 2, a partly-agreeing draft) must fit it by chi-square, for both
draft sample methods, and the same test must reject samplers with planted errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from tandem import LLM, SamplingParams
from tandem.sample.rejection_sampler import RejectionSampler
from tandem.spec_decode.adaptive import AdaptiveK
from tiny_models import build_small_vocab_model

PROMPT = [5, 6, 7, 8]
TEMPERATURE, TOP_P = 0.8, 0.95
NUM_SAMPLES = 20000
ALPHA = 1e-3


def _processed(logits: torch.Tensor) -> np.ndarray:
    """Reference temperature + top-p (smallest sorted prefix reaching top_p), in float64."""
    p = torch.softmax(logits.double() / TEMPERATURE, dim=-1).numpy()
    out = np.zeros_like(p)
    for row in range(p.shape[0]):
        order = np.argsort(-p[row], kind="stable")
        mass_before = np.cumsum(p[row][order]) - p[row][order]
        keep = order[mass_before < TOP_P]
        out[row, keep] = p[row, keep] / p[row, keep].sum()
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    target = build_small_vocab_model(root / "target", seed=0, logit_scale=1.5)
    draft = build_small_vocab_model(root / "draft", seed=0, logit_scale=1.5, noise=1.0)
    return str(target), str(draft)


def exact_law(target: str, prompt: list[int]) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the target (temperature and top-p applied) as [V, V, V]."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    v = model.config.vocab_size
    grid = torch.tensor([[a, b] for a in range(v) for b in range(v)])  # [V*V, 2]
    seqs = torch.cat([torch.tensor(prompt).expand(len(grid), -1), grid], dim=1)
    with torch.no_grad():
        logits = model(seqs).logits                        # [V*V, len+2, V]
    p1 = _processed(logits[:1, len(prompt) - 1])[0]       # [V]
    p2 = _processed(logits[::v, len(prompt)])              # [V, V]: row a = P(t2 | t1 = a)
    p3 = _processed(logits[:, len(prompt) + 1]).reshape(v, v, v)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.fixture(scope="module")
def exact(pair) -> np.ndarray:
    """P(t1, t2, t3 | PROMPT) as a [V, V, V] array."""
    return exact_law(pair[0], PROMPT)


def _sample(pair, method: str, adaptive: bool = False,
            quantization: str | None = None) -> tuple[np.ndarray, float]:
    # Quantized weights run on the CPU kernels (the CPU also where a GPU is present).
    llm = LLM(pair[0], seed=1234, quantization=quantization,
              device="cpu" if quantization else "auto", speculative_config={
        "model": pair[1], "num_speculative_tokens": 2, "draft_sample_method": method,
        "adaptive": adaptive, "quantization": quantization,
        "rejection_sample_method": "standard"})  # gumbel: test_gumbel_distribution.py
    firsts, drafted, accepted = draw(llm, PROMPT, NUM_SAMPLES)
    return firsts, accepted / drafted


def draw(llm: LLM, prompt: list[int], num: int) -> tuple[np.ndarray, int, int]:
    """The first three tokens of `num` samples ([num, 3]; two requests of n = num / 2, as n is
    capped at 16384 as in vLLM), and the drafted and accepted counts behind them."""
    outs = llm.generate([prompt] * 2, SamplingParams(n=num // 2, temperature=TEMPERATURE,
                                                     top_p=TOP_P, max_tokens=4, ignore_eos=True),
                        use_tqdm=False)
    firsts = np.array([c.token_ids[:3] for out in outs for c in out.outputs])
    stats = [out.spec_decode_stats for out in outs]
    return (firsts, sum(s.num_draft_tokens for s in stats),
            sum(s.num_accepted_tokens for s in stats))


def _pvalue(samples: np.ndarray, exact: np.ndarray) -> float:
    v = exact.shape[0]
    flat = samples[:, 0] * v * v + samples[:, 1] * v + samples[:, 2]
    observed = np.bincount(flat, minlength=v ** 3).astype(float)
    expected = exact.reshape(-1) * len(samples)
    if observed[expected == 0].sum() > 0:
        return 0.0  # sampled a sequence the target (after top-p) forbids
    rare = expected < 5  # merged into one bin, as chi-square needs
    obs = np.append(observed[~rare], observed[rare].sum())
    exp = np.append(expected[~rare], expected[rare].sum())
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_speculative_samples_match_target_distribution(pair, exact, method):
    samples, acceptance = _sample(pair, method)
    # The draft must agree only partly, or rejections (and the residual) would go untested.
    assert 0.1 < acceptance < 0.95
    assert _pvalue(samples, exact) > ALPHA


def _resample_from_p(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return p.clone()


def _accept_with_q_over_p(p_x, q_x, u):
    return u * p_x < q_x


@pytest.mark.parametrize("method,bug", [("probabilistic", "recovery_weights"),
                                        ("greedy", "recovery_weights"),
                                        ("probabilistic", "accept_draft")])
def test_planted_sampler_errors_are_detected(pair, exact, method, bug, monkeypatch):
    planted = _resample_from_p if bug == "recovery_weights" else _accept_with_q_over_p
    monkeypatch.setattr(RejectionSampler, bug, staticmethod(planted))
    samples, _ = _sample(pair, method)
    assert _pvalue(samples, exact) < ALPHA


def test_adaptive_speculation_stays_exact_as_k_changes_every_step(pair, exact, monkeypatch):
    """Adaptive speculation with k cycling 2, 0, 1 step by step (0: no drafting at all, the draft
    catching up later): still the target's law."""
    chosen = []

    def cycle(self, batch_size: int) -> int:
        chosen.append((2, 0, 1)[len(chosen) % 3])
        return chosen[-1]

    monkeypatch.setattr(AdaptiveK, "choose", cycle)
    samples, acceptance = _sample(pair, "probabilistic", adaptive=True)
    assert set(chosen) == {0, 1, 2} and 0.1 < acceptance < 0.95
    assert _pvalue(samples, exact) > ALPHA


@pytest.fixture(scope="module")
def exact_q8(pair) -> np.ndarray:
    """The Q8_0-quantized target's own law (its weights and 8-bit activations change the
    logits), read off the engine: the full log-softmax of its raw logits after every prefix."""
    v = 24
    llm = LLM(pair[0], quantization="q8_0", max_logprobs=-1, device="cpu")
    prefixes = ([PROMPT] + [PROMPT + [a] for a in range(v)]
                + [PROMPT + [a, b] for a in range(v) for b in range(v)])
    outs = llm.generate(prefixes, SamplingParams(temperature=0, max_tokens=1, logprobs=v),
                        use_tqdm=False)
    rows = torch.tensor([[o.outputs[0].logprobs[0][t].logprob for t in range(v)] for o in outs])
    p1 = _processed(rows[:1])[0]                           # log-softmax: the same p as logits
    p2 = _processed(rows[1:1 + v])                         # [V, V]
    p3 = _processed(rows[1 + v:]).reshape(v, v, v)
    return p1[:, None, None] * p2[:, :, None] * p3


def test_speculation_on_quantized_weights_samples_their_distribution(pair, exact_q8):
    samples, acceptance = _sample(pair, "probabilistic", quantization="q8_0")
    assert 0.1 < acceptance < 0.95
    assert _pvalue(samples, exact_q8) > ALPHA


def test_a_planted_error_on_quantized_weights_is_detected(pair, exact_q8, monkeypatch):
    monkeypatch.setattr(RejectionSampler, "recovery_weights", staticmethod(_resample_from_p))
    samples, _ = _sample(pair, "probabilistic", quantization="q8_0")
    assert _pvalue(samples, exact_q8) < ALPHA
