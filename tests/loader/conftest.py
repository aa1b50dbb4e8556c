"""Fixtures for the loader tests: the two bundled GGUF files loaded by tandem (once per test module) and by
transformers (the reference: once per test session, shared with tests/real through the session fixtures of
tests/real_fixtures.py), with the load times reported in pytest's terminal summary."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

BUNDLED_NAMES = ("gemma3", "smollm2")


@dataclass
class Loaded:
    name: str
    path: Path
    config: Any
    tensors: dict[str, torch.Tensor]
    seconds: float


@pytest.fixture(scope="module", params=BUNDLED_NAMES)
def ours(request: pytest.FixtureRequest, bundled_path: Callable[[str], Path],
         gguf_load_times: dict[str, dict[str, float]]) -> Iterator[Loaded]:
    """tandem's load of a bundled file: config + every tensor, timed."""
    from tandem.loader import gguf_loader, gguf_reader

    path = bundled_path(request.param)
    gguf_reader._read_gguf_cached.cache_clear()  # time the header parse too
    start = time.perf_counter()
    config = gguf_loader.load_gguf_config(path)
    tensors = dict(gguf_loader.iter_gguf_tensors(path, config))
    seconds = time.perf_counter() - start
    gguf_load_times.setdefault(request.param, {})["tandem"] = seconds
    yield Loaded(request.param, path, config, tensors, seconds)
    del tensors
    gc.collect()


@pytest.fixture(scope="module")
def reference(ours: Loaded, hf_reference_models: Any) -> Loaded:
    """transformers' own GGUF load of the same file (session-cached: loaded at most once per session)."""
    model = hf_reference_models.get(ours.name)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return Loaded(ours.name, ours.path, model.config, state, hf_reference_models.seconds[ours.name])
