"""Batch invariance, kernel by kernel: a row's result has the same bits alone and in any batch
(1 to 256 rows, at any place in it, beside any other rows), at any thread count (1 to 16, more
than this machine's cores), whatever path its batch's size selects. Each checker is shown to
catch a planted bug: a kernel that changes path with the batch's size."""

from __future__ import annotations

import contextlib
import random
from typing import Callable, Iterator, Optional

import pytest
import torch
import torch.nn.functional as F

from tandem.attention import sdpa_backend
from tandem.attention.metadata import build_attention_metadata
from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import quant
from tandem.layers import activation, matmul_choice
from tandem.layers.linear import linear
from tandem.layers.moe import SparseMoeBlock
from tandem.layers.quantized import QuantizedWeight, RawQuant
from tandem.sample import logits_processing
from tandem.sample.logits_processing import compute_probs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.random import SeededRandom
from tandem.sampling_params import SamplingParams

from test_quantized_kernels import random_blocks

THREADS = (1, 2, 3, 4, 5, 8, 16)
# Batch sizes each checker goes through (cycled): a lone row, the bounds paths used to switch
# at (16 queries, 64 rows), and up to 256 rows.
SIZES = (1, 2, 5, 16, 17, 1, 63, 64, 65, 100, 1, 256)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def assert_rows_invariant(run: Callable[[torch.Tensor], torch.Tensor], pool: torch.Tensor,
                          trials: int, seed: int = 0, sizes: tuple[int, ...] = SIZES) -> None:
    """run(x [n, ...]) -> [n, ...], row by row. For `trials` batches drawn from `pool` (sizes
    cycled, the probe row at a random place, random thread counts), the probe row's output
    equals what it gives alone on one thread."""
    rng = random.Random(seed)
    with threads(1):
        alone = [run(pool[i:i + 1])[0] for i in range(len(pool))]
    for trial in range(trials):
        n = sizes[trial % len(sizes)]
        rows = [rng.randrange(len(pool)) for _ in range(n)]
        t = THREADS[(trial + trial // len(THREADS)) % len(THREADS)]
        with threads(t):
            out = run(pool[rows])
        for place in {0, n - 1, rng.randrange(n)}:
            assert torch.equal(out[place], alone[rows[place]]), (
                f"row {rows[place]} at place {place} of {n} rows on {t} threads")


def test_float_matmul(fused):
    torch.manual_seed(0)
    w, b = torch.randn(96, 576) * 0.04, torch.randn(96)
    pool = torch.randn(40, 576)
    assert_rows_invariant(lambda x: linear(x, w, b), pool, trials=36)
    w_odd = torch.randn(7, 200)  # in not a multiple of the lanes: a zero-padded last block
    assert_rows_invariant(lambda x: linear(x, w_odd), torch.randn(20, 200), trials=12)


def test_a_planted_blas_call_above_64_rows_is_caught(fused):
    torch.manual_seed(0)
    w = torch.randn(96, 576) * 0.04
    pool = torch.randn(40, 576)
    buggy = lambda x: F.linear(x, w) if x.shape[0] > 64 else linear(x, w)  # noqa: E731
    with pytest.raises(AssertionError, match="rows"):
        assert_rows_invariant(buggy, pool, trials=len(SIZES))


@pytest.mark.parametrize("name", sorted(quant.KERNEL_TYPES))
def test_quantized_matmul(fused, name):
    k = 768 if name.endswith("_K") else 608
    raw = RawQuant(quant.KERNEL_TYPES[name], random_blocks(name, 40, k, seed=2), k, name)
    w = QuantizedWeight([raw])  # block types interleaved, F16/BF16 in rows
    assert isinstance(w.segments[0], RawQuant) == (name in ("F16", "BF16"))
    torch.manual_seed(1)
    assert_rows_invariant(lambda x: w.matmul(x, None), torch.randn(24, k), trials=12)


def test_norms_activations_and_the_row_sum(fused):
    torch.manual_seed(0)
    w = torch.randn(576)
    assert_rows_invariant(lambda x: cpu_kernels.rms_norm(x, w, 1e-6, False), torch.randn(20, 576),
                          trials=12)
    gu = torch.randn(20, 2 * 1536)
    assert_rows_invariant(activation.silu_and_mul, gu, trials=12)
    assert_rows_invariant(activation.gelu_tanh_and_mul, gu, trials=12)
    probs = torch.rand(12, 49152)
    assert_rows_invariant(logits_processing.row_sum, probs, trials=12)


def test_the_moe_block(fused):
    """Routing (a float router, softmax, top-k) and the experts grouped by expert: a row's sum
    runs over its experts in ascending order whatever else chose them (one row takes its own
    path, _one_row: the same arithmetic)."""
    torch.manual_seed(0)
    block = SparseMoeBlock(64, 32, num_experts=8, top_k=2, renormalize=True, act="silu")
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape) * 0.2)
    assert_rows_invariant(block, torch.randn(30, 64), trials=12)


# --- attention -------------------------------------------------------------------------------

BLOCK = 16


class Cache:
    """A paged KV cache of random keys and values, and a probe: one query of one request."""

    def __init__(self, hkv: int, d: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.k = torch.randn(400 * BLOCK, hkv, d, generator=g)
        self.v = torch.randn(400 * BLOCK, hkv, d, generator=g)
        self.k[:BLOCK] = self.v[:BLOCK] = 0  # the null block
        self.rng = random.Random(seed)
        self.free = list(range(1, 400))
        self.rng.shuffle(self.free)

    def table(self, keys: int) -> list[int]:
        return [self.free.pop() for _ in range((keys + BLOCK - 1) // BLOCK)]


def _attend(q: torch.Tensor, cache: Cache, query_lens: list[int], seq_lens: list[int],
            tables: list[list[int]], window: Optional[int], softcap: Optional[float],
            kernel: bool = True) -> torch.Tensor:
    meta = build_attention_metadata(query_lens, seq_lens, tables, BLOCK, torch.device("cpu"))
    if not kernel:
        meta.requests = None  # the planted bug: SDPA's padded groups
    return sdpa_backend.paged_attention(q, cache.k, cache.v, meta, q.shape[2] ** -0.5, window,
                                        softcap)


def assert_attention_invariant(h: int, hkv: int, d: int, window: Optional[int],
                               softcap: Optional[float], trials: int, seed: int = 0,
                               bug: Callable[[list[int]], bool] = lambda qlens: False,
                               keys: int = 150) -> None:
    """A probe query (request R at position p) attends alone as a decode step on one thread;
    then as query i of R's verification or prefill chunk of 1 to 48 queries, beside 0 to 20
    other requests of 1 to 48 queries each, R at a random place, on 1 to 16 threads."""
    cache = Cache(hkv, d, seed)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed + 1)
    r_table = cache.table(keys + 48)
    probes = [(rng.randrange(keys), torch.randn(1, h, d, generator=g)) for _ in range(4)]
    with threads(1):
        alone = [_attend(q, cache, [1], [p + 1], [r_table], window, softcap)[0]
                 for p, q in probes]
    others = [(n, n + rng.randrange(0, 120)) for n in (1, 1, 2, 5, 17, 33, 48, 3, 1, 21)]
    other_tables = [cache.table(s) for _, s in others]
    for trial in range(trials):
        p, q_probe = probes[trial % len(probes)]
        qlen = rng.choice((1, 2, 5, 16, 17, 21, 33, 48))
        i = rng.randrange(qlen)                     # the probe's place among R's queries
        seq = p + 1 + (qlen - 1 - i)                # R's keys after this step
        if seq - qlen < 0:
            continue
        picked = rng.sample(range(len(others)), rng.randrange(0, len(others) + 1))
        place = rng.randrange(len(picked) + 1)
        reqs = [others[j] + (other_tables[j],) for j in picked]
        reqs.insert(place, (qlen, seq, r_table))
        qs = [torch.randn(n, h, d, generator=g) for n, _, _ in reqs]
        qs[place][i] = q_probe[0]
        q = torch.cat(qs)
        t = THREADS[trial % len(THREADS)]
        lens = [n for n, _, _ in reqs]
        with threads(t):
            out = _attend(q, cache, lens, [s for _, s, _ in reqs],
                          [tb for _, _, tb in reqs], window, softcap, kernel=not bug(lens))
        row = sum(lens[:place]) + i
        assert torch.equal(out[row], alone[trial % len(probes)]), (
            f"query {i} of {qlen} at position {p}, request {place} of {len(reqs)}, {t} threads")


@pytest.mark.parametrize("h,hkv,d,window,softcap", [
    (9, 3, 64, None, None),    # SmolLM2's heads
    (4, 1, 256, 40, None),     # Gemma 3's, a sliding window
    (8, 8, 128, None, 30.0),   # no GQA, soft-capped scores (Gemma 2)
    (16, 2, 32, 7, 50.0),      # 8 query heads a KV head: more than one pass's rows
    (4, 2, 16, None, None),    # 16-number heads (tiny Qwen2, Phi-3, OLMo 2): with AVX2, rows
                               # of neighbouring queries summed three at a time
    (6, 1, 16, 9, None),       # and six heads a KV head, a sliding window
])
def test_attention(fused, h, hkv, d, window, softcap):
    assert_attention_invariant(h, hkv, d, window, softcap, trials=24)


def test_attention_over_several_key_chunks(fused):
    """Rows with up to 1,300 keys: chunks of 512 folded in order, the same bits whether one
    work item folds a row's chunks or each chunk runs as an item of its own (a lone request
    decoding at depth is split over the threads, a batch of them is not)."""
    assert_attention_invariant(9, 3, 64, None, None, trials=16, keys=1300)
    assert_attention_invariant(4, 1, 128, 700, None, trials=8, keys=1300, seed=1)


def test_a_planted_sdpa_call_above_16_queries_is_caught(fused):
    with pytest.raises(AssertionError, match="query"):
        assert_attention_invariant(9, 3, 64, None, None, trials=24,
                                   bug=lambda qlens: max(qlens) > 16)


def test_softcapped_attention_matches_a_reference(fused):
    """The kernel's capped scores against the reference's (tanh in torch): within rounding."""
    cache = Cache(2, 64, seed=3)
    tables = [cache.table(40), cache.table(9)]
    q = torch.randn(7 + 9, 8, 64, generator=torch.Generator().manual_seed(4))
    got = _attend(q, cache, [7, 9], [40, 9], tables, 5, 20.0)
    want = _attend(q, cache, [7, 9], [40, 9], tables, 5, 20.0, kernel=False)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    uncapped = _attend(q, cache, [7, 9], [40, 9], tables, 5, None)
    assert (got - uncapped).abs().max() > 1e-3  # the cap is applied


# --- the sampler -----------------------------------------------------------------------------

def _metadata(params: list[SamplingParams]) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata.from_params(params, [[5, 9]] * n, [[1, 2, 3]] * n,
                                        [SeededRandom(i) for i in range(n)],
                                        torch.device("cpu"))


PARAMS = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0.7),
          SamplingParams(temperature=1.0, top_k=40, min_p=0.02),
          SamplingParams(temperature=0.9, top_k=5000), SamplingParams(temperature=0),
          SamplingParams(temperature=1.2, top_p=0.5, repetition_penalty=1.3,
                         presence_penalty=0.5)]


@pytest.mark.parametrize("vocab", [49152, 262144])
def test_the_sampling_distribution(fused, vocab):
    """A row's final distribution (penalties, temperature, softmax, min-p, top-k, top-p,
    renormalisation) beside rows with other parameters, greedy ones among them."""
    torch.manual_seed(0)
    logits = torch.randn(len(PARAMS), vocab) * 3

    def run(rows: torch.Tensor) -> torch.Tensor:
        kinds = [int(r[0].item()) for r in rows]
        return compute_probs(logits[kinds], _metadata([PARAMS[k] for k in kinds]))

    ids = torch.arange(len(PARAMS), dtype=torch.float32).unsqueeze(1)  # rows name their params
    assert_rows_invariant(run, ids, trials=12 if vocab == 49152 else 6,
                          sizes=(1, 3, 1, 8, 1, 16))


def test_a_planted_torch_sum_is_caught(fused, monkeypatch):
    """torch's sum splits a lone long row over the threads: its renormalisation then rounds
    otherwise than the same row's in a batch."""
    monkeypatch.setattr(logits_processing, "row_sum", lambda x: x.sum(dim=-1, keepdim=True))
    torch.manual_seed(0)
    logits = torch.randn(len(PARAMS), 49152) * 3

    def run(rows: torch.Tensor) -> torch.Tensor:
        kinds = [int(r[0].item()) for r in rows]
        return compute_probs(logits[kinds], _metadata([PARAMS[k] for k in kinds]))

    ids = torch.arange(len(PARAMS), dtype=torch.float32).unsqueeze(1)
    with pytest.raises(AssertionError, match="rows"):
        assert_rows_invariant(run, ids, trials=12, sizes=(1, 3, 1, 8, 1, 16))
