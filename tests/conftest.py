"""Shared fixtures: tiny random models built once per session (never downloaded)."""

from __future__ import annotations

pytest_plugins = ["real_fixtures"]

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import (DENSE_ARCHS, build_thinking_model, build_tiny_model,  # noqa: E402
                         build_tli_draft)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, os.cpu_count() or 1))

PROMPTS = [
    "The future of AI is",
    "Hello, my name is",
    "Once upon a time there was a little robot who wanted to learn how to paint",
    "What is the difference between weather and climate?",
    "1 2 3 4 5",
    "The capital of France is",
    "Python code: def f(x):",
    "Speculative decoding uses a small draft model to propose tokens that a large target model "
    "verifies in one pass, which makes generation faster without changing the output.",
]


@pytest.fixture(autouse=True)
def _matmul_mode_per_test(monkeypatch):
    """The CPU matmul mode (TANDEM_CPU_MATMUL) is the last model load's, kept per process
    (layers/matmul_choice.py): each test starts from the mode the session had and leaves it so,
    whatever mode it loaded a model with. Without this, a test that loads with "blas" left the
    kernel tests after it multiplying on BLAS, whose rows follow their batch."""
    from tandem.layers import matmul_choice
    monkeypatch.setattr(matmul_choice, "_forced", list(matmul_choice._forced))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """One tiny model per architecture, plus an unrelated random llama to serve as a bad draft."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {arch: str(build_tiny_model(root / arch, arch)) for arch in
            ("llama", "qwen2", "qwen3", "gemma3")}
    dirs["llama_other"] = str(build_tiny_model(root / "llama_other", "llama", seed=123))
    return dirs


@pytest.fixture(scope="session")
def dense_dirs(tmp_path_factory) -> dict[str, str]:
    """Phi-3, Gemma 2, OLMo 2, Granite and a multimodal Gemma 3 (tiny_models.DENSE_ARCHS)."""
    root = tmp_path_factory.mktemp("dense")
    return {arch: str(build_tiny_model(root / arch, arch)) for arch in DENSE_ARCHS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs) -> str:
    return tiny_dirs["llama"]


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return list(PROMPTS)


@pytest.fixture(scope="session")
def tli_draft(tiny_dirs, tmp_path_factory) -> str:
    """A draft for tiny_dirs["llama"] with another tokenizer (SentencePiece-style, byte fallback):
    the target's layers with embedding rows copied from twin tokens, so it partly agrees."""
    return str(build_tli_draft(tiny_dirs["llama"], tmp_path_factory.mktemp("tli") / "draft",
                               noise=0.3))


@pytest.fixture(scope="session")
def think_model(tmp_path_factory) -> Path:
    """A tiny model that writes </think> a few tokens into its greedy answer to THINK_MESSAGES
    (tiny_models.py)."""
    return build_thinking_model(tmp_path_factory.mktemp("tiny-think"))


@pytest.fixture(scope="session")
def think_r1_server(think_model, tmp_path_factory):
    """`tandem serve --reasoning-parser deepseek_r1` on it (shared by the API and page tests;
    one intra-op thread, as the page tests' servers)."""
    from entrypoints.server_helpers import start_server, stop_server

    srv = start_server(str(think_model), ["--served-model-name", "think-r1",
                                          "--reasoning-parser", "deepseek_r1",
                                          "--enable-reasoning"],
                       tmp_path_factory.mktemp("logs") / "think_r1.log", {"OMP_NUM_THREADS": "1"})
    yield srv
    stop_server(srv.proc)
