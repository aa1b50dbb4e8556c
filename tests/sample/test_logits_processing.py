"""compute_probs / apply_penalties / SamplingMetadata against hand-computed values and a plain
NumPy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tandem.sample import SamplingMetadata, apply_penalties, compute_probs
from tandem.sampling_params import SamplingParams

from . import make_md, ref_probs


# Six tokens with known probabilities, deliberately not in id order.
HAND_P = np.array([0.10, 0.40, 0.04, 0.15, 0.25, 0.06])
HAND_LOGITS = torch.tensor(np.log(HAND_P), dtype=torch.float32).unsqueeze(0)  # [1, 6]


def _probs(logits: torch.Tensor, **kw: object) -> np.ndarray:
    md = make_md([SamplingParams(**kw)], [0])
    return compute_probs(logits, md).numpy().astype(np.float64)


def _expect(support: list[int]) -> np.ndarray:
    out = np.zeros_like(HAND_P)
    out[support] = HAND_P[support] / HAND_P[support].sum()
    return out


@pytest.mark.parametrize("kw,support", [
    ({}, [0, 1, 2, 3, 4, 5]),
    ({"top_k": 3}, [1, 4, 3]),                 # 0.40, 0.25, 0.15
    ({"top_k": 1}, [1]),
    ({"top_p": 0.70}, [1, 4, 3]),              # 0.40 + 0.25 = 0.65 < 0.70, + 0.15 reaches it
    ({"top_p": 0.60}, [1, 4]),                 # 0.65 reaches 0.60
    ({"top_p": 0.30}, [1]),                    # the most likely token alone reaches it
    ({"min_p": 0.30}, [1, 4, 3]),              # threshold 0.12
    ({"min_p": 0.50}, [1, 4]),                 # threshold 0.20
    ({"min_p": 1.00}, [1]),
    # min-p 0.2 keeps 4 tokens, top-k 3 keeps 0.40/0.25/0.15 -> renormalised 0.5/0.3125/0.1875;
    # top-p 0.75 on THAT keeps 2 (on the unrenormalised mass it would keep 3).
    ({"min_p": 0.2, "top_k": 3, "top_p": 0.75}, [1, 4]),
])
def test_filters_hand_built(kw: dict, support: list[int]) -> None:
    np.testing.assert_allclose(_probs(HAND_LOGITS, **kw)[0], _expect(support), atol=1e-6)
    np.testing.assert_allclose(ref_probs(HAND_LOGITS[0].numpy(), **kw), _expect(support),
                               atol=1e-12)


@pytest.mark.parametrize("temperature", [0.3, 0.8, 1.0, 1.7])
def test_temperature_divides_logits(temperature: float) -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    expected = np.exp(logits[0].double().numpy() / temperature)
    np.testing.assert_allclose(_probs(logits, temperature=temperature)[0],
                               expected / expected.sum(), atol=1e-6)


def test_random_rows_match_reference() -> None:
    """One batch, every row with its own settings: each row must equal the reference."""
    gen = np.random.default_rng(1234)
    rows, vocab = 64, 50
    logits = torch.tensor(gen.normal(0, 2.0, (rows, vocab)), dtype=torch.float32)
    params = [SamplingParams(temperature=float(gen.choice([0.5, 0.9, 1.0, 1.6])),
                             top_k=int(gen.choice([0, 1, 3, 10])),
                             top_p=float(gen.choice([1.0, 0.95, 0.7, 0.3])),
                             min_p=float(gen.choice([0.0, 0.05, 0.2])))
              for _ in range(rows)]
    got = compute_probs(logits, make_md(params, list(range(rows)))).numpy()
    for i, p in enumerate(params):
        ref = ref_probs(logits[i].numpy(), p.temperature, p.top_k, p.top_p, p.min_p)
        np.testing.assert_allclose(got[i], ref, atol=1e-5, err_msg=f"row {i}: {p}")


def test_ties_are_broken_towards_lower_ids() -> None:
    flat = torch.zeros(1, 6)  # six tokens of 1/6 each
    np.testing.assert_allclose(_probs(flat, top_k=2)[0], [0.5, 0.5, 0, 0, 0, 0], atol=1e-7)
    np.testing.assert_allclose(_probs(flat, top_p=0.30)[0], [0.5, 0.5, 0, 0, 0, 0], atol=1e-7)
    for _ in range(3):  # and the same answer every time
        np.testing.assert_array_equal(_probs(flat, top_k=4), _probs(flat, top_k=4))


def test_greedy_row_is_one_hot_at_penalised_argmax() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0, 1.0], [3.0, 2.5, 0.0, 1.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0),  # 3.0 -> 1.5 < 2.5
              SamplingParams(temperature=1.0)]
    probs = compute_probs(logits, make_md(params, [0, 1], output_token_ids=[[0], [0]]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    expected = np.exp(logits[1].double().numpy())
    np.testing.assert_allclose(probs[1].numpy(), expected / expected.sum(), atol=1e-6)
    all_greedy = make_md([params[0]], [0], output_token_ids=[[0]])
    assert compute_probs(logits[:1], all_greedy)[0].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_penalties_hand_computed() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -0.5],
                           [2.0, -1.0, 0.5, 3.0, -0.5]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
              SamplingParams()]
    md = make_md(params, [0, 1], output_token_ids=[[1, 1, 3], [1, 1, 3]],
                 prompt_token_ids=[[0, 99], [0]])  # 99 is out of vocabulary: ignored
    before = logits.clone()
    out = apply_penalties(logits, md)
    # token 0: prompt only -> 2/2; token 1: output x2 -> -1*2 - 0.5*2 - 0.25;
    # token 2: unseen; token 3: output x1 -> 3/2 - 0.5 - 0.25; token 4: unseen.
    assert out[0].tolist() == pytest.approx([1.0, -3.25, 0.5, 0.75, -0.5])
    assert out[1].tolist() == before[1].tolist()  # row 1 has no penalties
    assert torch.equal(logits, before)             # input untouched

    probs = compute_probs(logits, make_md([SamplingParams(
        temperature=0.5, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)],
        [0], output_token_ids=[[1, 1, 3]], prompt_token_ids=[[0, 99]]), apply_penalty=True)
    expected = np.exp(np.array([1.0, -3.25, 0.5, 0.75, -0.5]) / 0.5)  # penalties, then 1/T
    np.testing.assert_allclose(probs[0].numpy(), expected / expected.sum(), atol=1e-6)


def test_negative_presence_and_frequency_raise_logits() -> None:
    logits = torch.zeros(1, 3)
    md = make_md([SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)], [0],
                 output_token_ids=[[2, 2]])
    assert apply_penalties(logits, md)[0].tolist() == pytest.approx([0.0, 0.0, 2.0])


def test_from_params_flags_and_values() -> None:
    md = make_md([SamplingParams(temperature=0.0), SamplingParams(top_k=-1, top_p=0.9)], [0, 1])
    assert md.temperature.tolist() == [0.0, 1.0]
    assert md.top_k.tolist() == [0, 0] and md.top_k.dtype == torch.int64
    assert md.top_p.tolist() == pytest.approx([1.0, 0.9])
    assert (md.all_greedy, md.all_random, md.no_penalties, md.no_filters) == (
        False, False, True, False)
    greedy_filters = make_md([SamplingParams(temperature=0.0, top_k=3)], [0])
    assert greedy_filters.all_greedy and greedy_filters.no_filters  # filters moot when greedy
    pen = make_md([SamplingParams(frequency_penalty=0.1)], [0])
    assert not pen.no_penalties and pen.all_random
    with pytest.raises(ValueError):
        SamplingMetadata.from_params([SamplingParams()], [[]], [[]], [], torch.device("cpu"))


def test_expand_repeats_rows_and_appends_prefixes() -> None:
    md = make_md([SamplingParams(temperature=0.5, top_k=4), SamplingParams(temperature=0.0)],
                 [7, 8], output_token_ids=[[1], [2, 3]], prompt_token_ids=[[9], [10]])
    ex = md.expand([3, 1], [[[], [5], [5, 6]], [[]]])
    assert ex.temperature.tolist() == [0.5, 0.5, 0.5, 0.0]
    assert ex.top_k.tolist() == [4, 4, 4, 0]
    assert ex.output_token_ids == [[1], [1, 5], [1, 5, 6], [2, 3]]
    assert ex.prompt_token_ids == [[9], [9], [9], [10]]
    assert ex.rngs[0] is md.rngs[0] and ex.rngs[2] is md.rngs[0] and ex.rngs[3] is md.rngs[1]
    assert ex.positions == [1, 2, 3, 2]  # copy j decides the token j places after the row's
    assert md.output_token_ids == [[1], [2, 3]]  # the original is not mutated
    sub = md.select([1])
    assert sub.all_greedy and sub.rngs[0] is md.rngs[1] and sub.positions == [2]
    assert md.shifted(2).positions == [3, 4]
    assert md.shifted([0, 3]).positions == [1, 5]  # each row its own offset
    assert math.isclose(float(md.select([0]).temperature[0]), 0.5)


def test_candidate_shortcut_equals_full_sort(monkeypatch) -> None:
    """Large vocabularies filter among the top candidates; the result must equal the full sort,
    including rows whose nucleus spills past the candidates and rows with tied probabilities."""
    from tandem.sample import logits_processing as lp

    gen = torch.Generator().manual_seed(0)
    vocab = 5000
    peaked = torch.randn(6, vocab, generator=gen) * 6.0
    flat = torch.randn(6, vocab, generator=gen) * 0.1          # nucleus spills past 1024
    tied = torch.zeros(6, vocab)
    tied[:, :3000:7] = 5.0                                     # hundreds of exact ties
    probs = torch.softmax(torch.cat([peaked, flat, tied]), dim=-1)
    n = probs.shape[0]
    top_p = torch.tensor([0.5, 0.9, 0.99, 1.0, 0.95, 0.7] * 3)
    top_k = torch.tensor([0, 5, 0, 1000, 0, 1024] * 3)
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.01, 0.0] * 3)
    assert len(top_p) == n
    fast = lp.filter_probs(probs, top_k, top_p, min_p)
    big_k = lp.filter_probs(probs, top_k * 3, top_p, min_p)   # top-k past the candidates
    monkeypatch.setattr(lp, "_CANDIDATES", vocab)
    full = lp.filter_probs(probs, top_k, top_p, min_p)
    assert torch.equal(fast > 0, full > 0)
    assert torch.allclose(fast, full, atol=1e-7, rtol=1e-5)
    assert torch.allclose(big_k, lp.filter_probs(probs, top_k * 3, top_p, min_p), atol=1e-7)
