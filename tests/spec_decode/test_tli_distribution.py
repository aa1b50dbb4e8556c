"""TLI with probabilistic drafting draws from the target's exact distribution, and a wrong q fails.

The toy pair: a peaked tiny byte-level llama (target) and a draft over a SentencePiece-style
vocabulary that shares only part of it: the target's layers, twin rows copied, draft-only tokens
scaled up so much of the draft's mass lies outside the intersection, and a noisy LM head. With
top-k 8 the target's law of the first three tokens has a few hundred sequences, enumerated exactly
with transformers. Ten thousand seeded speculative samples must fit it by chi-square; the same
test must reject a q not renormalised over the intersection, and a q taken before top-p.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.sample.logits_processing import compute_probs
from tandem.sample.random import Purpose
from tandem.sample.sampler import sample_from_probs
from tandem.spec_decode.draft_inputs import TLIDraft
from tiny_models import build_tiny_model, build_tli_draft

TEMPERATURE, TOP_K, TOP_P = 0.8, 8, 0.9
NUM_SAMPLES = 10000
ALPHA = 1e-3


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("tli-dist")
    target = build_tiny_model(root / "target", "llama", seed=0, head_scale=16.0)
    draft = build_tli_draft(target, root / "draft", outside_logit_boost=2.0, noise=0.5)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def prompt(pair) -> list[int]:
    return AutoTokenizer.from_pretrained(pair[0]).encode("The future of AI is")


def _processed(logits: torch.Tensor) -> np.ndarray:
    """Reference temperature, top-k, then top-p on the renormalised top-k (float64)."""
    p = torch.softmax(logits.double() / TEMPERATURE, dim=-1).numpy()
    out = np.zeros_like(p)
    for row in range(p.shape[0]):
        top = np.argsort(-p[row], kind="stable")[:TOP_K]
        pk = p[row][top] / p[row][top].sum()
        keep = top[np.cumsum(pk) - pk < TOP_P]
        out[row, keep] = p[row, keep] / p[row, keep].sum()
    return out


@pytest.fixture(scope="module")
def exact(pair, prompt) -> dict[tuple[int, int, int], float]:
    """P(t1, t2, t3 | prompt) for every sequence the target allows."""
    model = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()

    def law(prefix: list[int]) -> np.ndarray:
        with torch.no_grad():
            return _processed(model(torch.tensor([prompt + prefix])).logits[:, -1])[0]

    out = {}
    p1 = law([])
    for a in np.flatnonzero(p1):
        p2 = law([int(a)])
        for b in np.flatnonzero(p2):
            p3 = law([int(a), int(b)])
            for c in np.flatnonzero(p3):
                out[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    return out


def _sample(pair, prompt, method: str) -> tuple[np.ndarray, float]:
    llm = LLM(pair[0], seed=1234, speculative_config={
        "model": pair[1], "num_speculative_tokens": 2, "adaptive": False,
        "use_heterogeneous_vocab": True,
        "draft_sample_method": method, "rejection_sample_method": "standard"})
    out = llm.generate([prompt], SamplingParams(n=NUM_SAMPLES, temperature=TEMPERATURE,
                                                top_k=TOP_K, top_p=TOP_P, max_tokens=4,
                                                ignore_eos=True), use_tqdm=False)[0]
    return np.array([c.token_ids[:3] for c in out.outputs]), \
        out.spec_decode_stats.draft_acceptance_rate


def _pvalue(samples: np.ndarray, exact: dict) -> float:
    index = {seq: i for i, seq in enumerate(exact)}
    observed = np.zeros(len(index))
    for seq in map(tuple, samples.tolist()):
        if seq not in index:
            return 0.0  # a sequence the target (after top-k/top-p) forbids
        observed[index[seq]] += 1
    expected = np.array(list(exact.values())) * len(samples)
    rare = expected < 5  # merged into one bin, as chi-square needs
    obs = np.append(observed[~rare], observed[rare].sum())
    exp = np.append(expected[~rare], expected[rare].sum())
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_the_draft_puts_mass_outside_the_intersection(pair, prompt):
    """Otherwise the renormalisation over the intersection would go untested."""
    llm = LLM(pair[0], speculative_config={"model": pair[1],
                                           "num_speculative_tokens": 2, "adaptive": False,
                                           "use_heterogeneous_vocab": True})
    inputs: TLIDraft = llm.llm_engine.proposer.inputs
    draft = AutoModelForCausalLM.from_pretrained(pair[1], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = draft(torch.tensor([inputs.feedback.prompt(prompt)])).logits[0, -1]
    q = torch.softmax(logits / TEMPERATURE, dim=-1)
    assert 0.2 < float(q[~inputs.mapping.draft_mask.cpu()].sum()) < 0.99  # the mask: on the device


@pytest.mark.parametrize("method", ["probabilistic", "greedy"])
def test_tli_samples_match_target_distribution(pair, prompt, exact, method):
    samples, acceptance = _sample(pair, prompt, method)
    assert 0.05 < acceptance < 0.95  # rejections and the residual are exercised
    assert _pvalue(samples, exact) > ALPHA


def _q_not_renormalised(self, logits, md, masks=None):
    """Planted: samples from the masked, renormalised distribution but reports q normalised
    over the draft's whole vocabulary."""
    m = self.mapping
    logits = logits[:, :m.draft_vocab_size]
    q_sampled = compute_probs(logits.masked_fill(self.outside, float("-inf")), md, False)
    ids = sample_from_probs(q_sampled, md, Purpose.DRAFT)
    q_full = compute_probs(logits, md, apply_penalty=False)
    return ids, m.draft_to_target[ids], _in_target_space(m, q_full)


def _q_before_top_p(self, logits, md, masks=None):
    """Planted: samples after top-p but reports q without top-p."""
    m = self.mapping
    logits = logits[:, :m.draft_vocab_size].masked_fill(self.outside, float("-inf"))
    ids = sample_from_probs(compute_probs(logits, md, apply_penalty=False), md, Purpose.DRAFT)
    no_top_p = dataclasses.replace(md, top_p=torch.ones_like(md.top_p))
    return ids, m.draft_to_target[ids], _in_target_space(m, compute_probs(logits, no_top_p, False))


def _in_target_space(m, q_draft: torch.Tensor) -> torch.Tensor:
    q = q_draft.new_zeros(q_draft.shape[0], m.target_vocab_size)
    return q.index_copy_(1, m.target_ids, q_draft.index_select(1, m.draft_ids))


@pytest.mark.parametrize("bug", [_q_not_renormalised, _q_before_top_p])
def test_planted_errors_in_q_are_detected(pair, prompt, exact, bug, monkeypatch):
    monkeypatch.setattr(TLIDraft, "propose", bug)
    samples, _ = _sample(pair, prompt, "probabilistic")
    assert _pvalue(samples, exact) < ALPHA
