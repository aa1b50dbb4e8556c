"""cpu_gumbel.c against sample/gumbel.py's torch reference: the same token on every row, at
temperatures from sharp to flat, with forbidden (-inf) columns, tied scores, a TLI draft's
column-to-token map, a row with one allowed token, and big vocabularies."""

from __future__ import annotations

import pytest
import torch

from tandem.kernels import cpu as cpu_kernels
from tandem.sample.gumbel import gumbel_argmax, gumbel_argmax_torch


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    cpu_kernels.configure(torch.device("cpu"))
    if not cpu_kernels.enabled():
        pytest.skip("the C kernels are off here")


def _rows(rows: int, vocab: int, temperature: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 4.0 / temperature
    scores = torch.log_softmax(logits, dim=-1)                     # [rows, vocab] float32
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (rows,), generator=g, dtype=torch.int64)
    return scores.contiguous(), keys


@pytest.mark.parametrize("temperature", [0.3, 1.0, 3.0, 50.0])
@pytest.mark.parametrize("vocab", [7, 1000, 49152])
def test_the_kernel_picks_the_reference_token(temperature: float, vocab: int) -> None:
    scores, keys = _rows(48, vocab, temperature, seed=vocab + int(temperature * 10))
    fast = cpu_kernels.gumbel_argmax(scores, keys, None)
    assert fast is not None
    assert torch.equal(fast, gumbel_argmax_torch(scores, keys))
    assert torch.equal(gumbel_argmax(scores, keys), fast)  # the public entry takes the kernel


def test_masks_ties_a_single_allowed_token_and_a_tli_map() -> None:
    scores, keys = _rows(64, 5000, 1.0, seed=3)
    scores[:, ::3] = -torch.inf                                    # a grammar's mask
    scores[:8, 100:400] = scores[:8, 100:101]                      # tied scores
    scores[8] = -torch.inf
    scores[8, 4321] = 0.0                                          # one allowed token
    ids = torch.randperm(60000, generator=torch.Generator().manual_seed(4))[:5000]
    for token_ids in (None, ids):
        fast = cpu_kernels.gumbel_argmax(scores, keys, token_ids)
        assert torch.equal(fast, gumbel_argmax_torch(scores, keys, token_ids))
        assert fast[8] == 4321 and bool((scores.gather(1, fast[:, None]) > -torch.inf).all())


def test_the_kernel_is_a_sampler_that_follows_the_scores() -> None:
    """Different keys, one row of scores: the chosen tokens' frequencies follow p (the kernel
    is the reference, and the reference is chi-square tested in test_gumbel_distribution)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    scores = torch.log(p).expand(n, 4).contiguous()
    keys = torch.arange(n, dtype=torch.int64) * 0x9E3779B97F4A7C15 % (2 ** 61)
    counts = torch.bincount(cpu_kernels.gumbel_argmax(scores, keys, None), minlength=4)
    assert torch.allclose(counts / n, p, atol=0.015), counts


def test_layouts_the_kernel_does_not_read_fall_back() -> None:
    scores, keys = _rows(4, 100, 1.0, seed=5)
    assert cpu_kernels.gumbel_argmax(scores.t().contiguous().t(), keys, None) is None
    assert cpu_kernels.gumbel_argmax(scores.double(), keys, None) is None
    assert torch.equal(gumbel_argmax(scores.double().float().t().contiguous().t(), keys),
                       gumbel_argmax_torch(scores, keys))
