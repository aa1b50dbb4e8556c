"""gumbel_sample (the candidate columns, then cpu_gumbel.c's choice among them) against
sample/gumbel.py's torch reference over whole rows: the same token on every row, at temperatures
from sharp to flat, with forbidden columns, tied probabilities, a TLI draft's column-to-token
map, a row with one allowed token, and big vocabularies; and without the kernels."""

from __future__ import annotations

import pytest
import torch

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import cpu_sampling
from tandem.sample.gumbel import gumbel_argmax_torch, gumbel_sample


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    cpu_kernels.configure(torch.device("cpu"))
    if not cpu_kernels.enabled():
        pytest.skip("the C kernels are off here")


def _rows(rows: int, vocab: int, temperature: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 4.0 / temperature
    probs = torch.softmax(logits, dim=-1)                          # [rows, vocab] float32
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (rows,), generator=g, dtype=torch.int64)
    return probs.contiguous(), keys


def _reference(probs: torch.Tensor, keys: torch.Tensor, token_ids=None) -> torch.Tensor:
    return gumbel_argmax_torch(torch.log(probs), keys, token_ids)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 3.0, 50.0])
@pytest.mark.parametrize("vocab", [7, 1000, 49152, 262144])
def test_the_kernel_picks_the_reference_token(temperature: float, vocab: int) -> None:
    probs, keys = _rows(48 if vocab < 262144 else 6, vocab, temperature,
                        seed=vocab + int(temperature * 10))
    assert torch.equal(gumbel_sample(probs, keys), _reference(probs, keys))


def test_masks_ties_a_single_allowed_token_and_a_tli_map() -> None:
    probs, keys = _rows(64, 5000, 1.0, seed=3)
    probs[:, ::3] = 0.0                                            # a grammar's mask
    probs[:8, 100:400] = probs[:8, 100:101]                        # tied probabilities
    probs[8] = 0.0
    probs[8, 4321] = 1.0                                           # one allowed token
    ids = torch.randperm(60000, generator=torch.Generator().manual_seed(4))[:5000]
    for token_ids in (None, ids):
        fast = gumbel_sample(probs, keys, token_ids)
        assert torch.equal(fast, _reference(probs, keys, token_ids))
        assert fast[8] == 4321 and bool((probs.gather(1, fast[:, None]) > 0).all())


def test_without_the_kernel_the_same_tokens(monkeypatch) -> None:
    probs, keys = _rows(32, 3000, 1.0, seed=6)
    fast = gumbel_sample(probs, keys)
    monkeypatch.setattr(cpu_sampling, "gumbel_argmax_sparse", lambda *args: None)
    assert torch.equal(gumbel_sample(probs, keys), fast)  # the C selection, torch's choice
    monkeypatch.setattr(cpu_sampling, "gumbel_candidates", lambda *args: None)
    assert torch.equal(gumbel_sample(probs, keys), fast)  # torch's selection and choice
    assert torch.equal(gumbel_sample(probs.t().contiguous().t(), keys), fast)


def test_the_kernel_is_a_sampler_that_follows_the_probabilities() -> None:
    """Different keys, one row: the chosen tokens' frequencies follow p (the reference is
    chi-square tested in test_gumbel_distribution)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    keys = torch.arange(n, dtype=torch.int64) * 0x9E3779B97F4A7C15 % (2 ** 61)
    counts = torch.bincount(gumbel_sample(p.expand(n, 4).contiguous(), keys), minlength=4)
    assert torch.allclose(counts / n, p, atol=0.015), counts


def test_a_row_with_nan_takes_its_first_nan_as_the_whole_row_would() -> None:
    """A broken distribution (a NaN row from a draft gone wrong) must not crash the draw: the
    whole row's argmax would take its first NaN column, and so does gumbel_sample."""
    probs, keys = _rows(3, 100, 1.0, seed=7)
    probs[0] = float("nan")
    probs[1, [40, 7]] = float("nan")
    got = gumbel_sample(probs, keys)
    assert got[:2].tolist() == [0, 7]
    assert torch.equal(got[2:], _reference(probs[2:], keys[2:]))
    everything_nan = torch.full((2, 50), float("nan"))
    assert gumbel_sample(everything_nan, keys[:2]).tolist() == [0, 0]
