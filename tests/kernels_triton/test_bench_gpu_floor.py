"""benchmarks/bench_gpu.py's bandwidth floor (the GPU issue's fix, beside the Triton kernels it
measures): a step reads every parameter once, less an untied input embedding (only its rows are
gathered); a tied one is read whole as the LM head. The bytes go over the copy bandwidth, which
already counts reads and writes (tests/bench/test_bench_gpu.py runs the whole script)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]


def bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Head(nn.Module):
    def __init__(self, tied_to=None) -> None:
        super().__init__()
        self.tied_to = tied_to
        if tied_to is None:
            self.weight = nn.Parameter(torch.zeros(100, 8, dtype=torch.bfloat16))


class Model(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.zeros(100, 8, dtype=torch.bfloat16))
        self.model.layer = nn.Linear(8, 8, bias=False, dtype=torch.bfloat16)
        self.lm_head = Head(self.model.embed_tokens if tied else None)


def test_step_reads_weights_once_without_an_untied_embedding():
    mod = bench_gpu()
    layer, table = 8 * 8 * 2, 100 * 8 * 2
    assert mod.read_bytes(Model(tied=False)) == layer + table  # the LM head, not the embedding
    assert mod.read_bytes(Model(tied=True)) == layer + table   # the one table, read as the head
    qwen3_8b = 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 151936 * 4096
    assert 15.0e9 < 2 * qwen3_8b < 15.2e9  # the issue's ~15.1 GB a step (norms aside)
    assert mod.kv_bytes_per_token(mod.QWEN3_8B) == 2 * 36 * 8 * 128 * 2
