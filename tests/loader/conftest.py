"""Fixtures for the loader tests: the two bundled GGUF files, loaded once per test module by tandem and by
transformers (the reference), with the load times reported in pytest's terminal summary."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from tandem.loader.model_source import bundled_gguf_path

BUNDLED_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "gemma3": "google/gemma-3-270m"}
LOAD_TIMES: dict[str, dict[str, float]] = {}  # model -> {"tandem": s, "transformers": s}


@dataclass
class Loaded:
    name: str
    path: Path
    config: Any
    tensors: dict[str, torch.Tensor]
    seconds: float


def gguf_path(name: str) -> Path:
    path = bundled_gguf_path(BUNDLED_IDS[name])
    if path is None:
        pytest.fail(f"bundled GGUF for {name} is not installed (see /work/shared/models.md)")
    return path


@pytest.fixture(scope="session")
def bundled_path() -> Any:
    """gguf_path, for test modules (which should not import conftest)."""
    return gguf_path


@pytest.fixture(scope="module", params=sorted(BUNDLED_IDS))
def ours(request: pytest.FixtureRequest) -> Iterator[Loaded]:
    """tandem's load of a bundled file: config + every tensor, timed."""
    from tandem.loader import gguf_loader

    path = gguf_path(request.param)
    gguf_loader._read_gguf_cached.cache_clear()  # time the header parse too
    start = time.perf_counter()
    config = gguf_loader.load_gguf_config(path)
    tensors = dict(gguf_loader.iter_gguf_tensors(path, config))
    seconds = time.perf_counter() - start
    LOAD_TIMES.setdefault(request.param, {})["tandem"] = seconds
    yield Loaded(request.param, path, config, tensors, seconds)
    del tensors
    gc.collect()


@pytest.fixture(scope="module")
def reference(ours: Loaded) -> Iterator[Loaded]:
    """transformers' own GGUF load of the same file (~12 s SmolLM2, ~35 s Gemma here), once per test module."""
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(ours.path.parent), gguf_file=ours.path.name,
                                                 dtype=torch.float32)
    seconds = time.perf_counter() - start
    LOAD_TIMES.setdefault(ours.name, {})["transformers"] = seconds
    state = {k: v.detach() for k, v in model.state_dict().items()}
    yield Loaded(ours.name, ours.path, model.config, state, seconds)
    del model, state
    gc.collect()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not LOAD_TIMES:
        return
    terminalreporter.section("GGUF load times (config + all tensors, float32)")
    for name, times in sorted(LOAD_TIMES.items()):
        parts = [f"{who} {secs:.1f} s" for who, secs in sorted(times.items(), reverse=True)]
        terminalreporter.write_line(f"{name}: " + ", ".join(parts))
