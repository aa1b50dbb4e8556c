"""Decode speed on a CUDA machine: a random-weight Qwen3-8B-shaped target with a random-weight
Qwen3-0.6B-shaped draft in bfloat16 (load_format "dummy": only the configs exist), speculation
at a synthetic acceptance (NOT lossless: benchmarking only, see sample/synthetic_sampler.py).

For batch sizes 1, 8 and 32: decode tokens/s without and with speculation, time per engine step,
and each step as a multiple of its memory-bandwidth floor (`x_floor`): the bytes the step must
read, read once at the copy bandwidth measured here. `copy_bandwidth` counts the bytes read and
the bytes written, so it is the rate at which the GPU moves bytes, and a step's floor is its bytes
over that rate (not over half of it). A plain step reads every parameter of the target except an
untied input embedding (only the batch's rows of it are gathered; a tied one is read whole as the
LM head: Qwen3-8B reads about 15.1 GB) and its KV cache at the batch's mean depth; a speculative
step also runs the draft k times (its catch-up pass and k - 1 single-token passes), each reading
the draft's weights and KV. Writes benchmarks/results/gpu.json. Needs torch with CUDA and
transformers; no network. Run by benchmarks/gpu.sh.

By default the target's decode and verification steps replay CUDA graphs (captured for batch
sizes up to the largest batch asked for, so start-up captures only what runs); `--enforce-eager`
measures the eager Triton path instead, `--plain-only` skips speculation (a quick baseline).

`--smoke` runs the same steps on the CPU with two tiny models of the same families, so that the
script itself is exercised where no CUDA machine is at hand (tests/bench/test_bench_gpu.py); its
numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer builder (no download)

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                tie_word_embeddings=False)
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def write_config(out: Path, shape: dict, vocab_size: int = 151936,
                 max_position_embeddings: int = 4096) -> str:
    from transformers import Qwen3Config

    from tiny_models import build_bytelevel_tokenizer
    out.mkdir(parents=True, exist_ok=True)
    cfg = Qwen3Config(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                      rms_norm_eps=1e-6,
                      rope_theta=1000000.0, architectures=["Qwen3ForCausalLM"],
                      bos_token_id=1, eos_token_id=2, dtype="bfloat16", **shape)
    cfg.save_pretrained(out)
    build_bytelevel_tokenizer(out)  # ids past its length are padding of the 151,936 vocabulary
    return str(out)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, numel: int = 1 << 30) -> float:
    """Bytes per second of a copy (read + write) of `numel` bf16 values (2 GiB) on `device`."""
    a = torch.empty(numel, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync(device)
    return 10 * 2 * a.numel() * a.element_size() / (time.perf_counter() - t0)


def read_bytes(model) -> int:
    """Bytes of the weights one forward pass reads: every parameter, less an untied input
    embedding, of which a step gathers only its tokens' rows (a tied one is the LM head)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight
    if getattr(model.lm_head, "tied_to", None) is None:
        total -= embed.numel() * embed.element_size()
    return total


def kv_bytes_per_token(shape: dict) -> int:
    """K and V of one token over every layer and KV head, in bfloat16."""
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2


def decode(llm, batch: int, prompt_len: int, tokens: int, device: str) -> dict:
    from tandem import SamplingParams
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}-{time.monotonic_ns()}",
                           [(7 * i + j) % 1000 + 10 for j in range(prompt_len)], params)
    engine.step()  # prefill (and the first tokens)
    sync(device)
    steps, t0 = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    sync(device)
    seconds = time.perf_counter() - t0
    generated = batch * (tokens - 1)
    return {"tokens_per_s": generated / seconds, "steps": steps,
            "ms_per_step": 1000 * seconds / max(steps, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.8,
                   help="synthetic conditional acceptance per position")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny models on the CPU: checks the script, measures nothing")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--plain-only", action="store_true", help="no speculative runs")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "gpu.json")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA device (or --smoke)")
    from tandem import LLM

    work = Path(tempfile.mkdtemp(prefix="tandem-gpu-"))  # configs and tokenizers only: small
    shapes = (TINY, TINY) if args.smoke else (QWEN3_8B, QWEN3_06B)
    vocab = 2048 if args.smoke else 151936
    target = write_config(work / "qwen3-8b-shaped", shapes[0], vocab)
    draft = write_config(work / "qwen3-0.6b-shaped", shapes[1], vocab)
    bandwidth = copy_bandwidth(device, 1 << 22 if args.smoke else 1 << 30)
    rates = [args.acceptance ** (i + 1) for i in range(args.k)]
    common = dict(dtype="bfloat16", load_format="dummy", max_model_len=2048,
                  enable_prefix_caching=False, gpu_memory_utilization=0.85, device=device,
                  enforce_eager=args.enforce_eager, max_num_seqs=max(args.batches))
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (--smoke)"
    results: dict = {"gpu": name, "torch": torch.__version__,
                     "copy_bandwidth_GBps": bandwidth / 1e9, "k": args.k,
                     "synthetic_acceptance_rates": rates, "enforce_eager": args.enforce_eager,
                     "runs": []}
    t0 = time.perf_counter()
    plain = LLM(model=target, **common)
    results["startup_s"] = time.perf_counter() - t0
    target_bytes = read_bytes(plain.llm_engine.executor.models["target"])
    results["target_read_GB"] = target_bytes / 1e9
    for b in args.batches:
        decode(plain, b, 16, 4, device)  # warm-up
        run = {"batch": b, "plain": decode(plain, b, args.prompt_len, args.tokens, device)}
        depth = b * (args.prompt_len + args.tokens // 2)  # keys read per layer, mean over steps
        run["step_read_GB"] = (target_bytes + depth * kv_bytes_per_token(shapes[0])) / 1e9
        run["floor_ms_per_step"] = 1000 * run["step_read_GB"] * 1e9 / bandwidth
        run["plain"]["floor_ms_per_step"] = run["floor_ms_per_step"]
        run["plain"]["x_floor"] = run["plain"]["ms_per_step"] / run["floor_ms_per_step"]
        results["runs"].append(run)
    del plain
    if device == "cuda":
        torch.cuda.empty_cache()
    if args.plain_only:
        for run in results["runs"]:
            print(f"batch {run['batch']:3d}: plain {run['plain']['tokens_per_s']:8.1f} tok/s "
                  f"({run['plain']['ms_per_step']:.2f} ms/step = {run['plain']['x_floor']:.2f}x "
                  f"its floor {run['floor_ms_per_step']:.2f} ms)")
        return save(results, args.output)
    spec = LLM(model=target, speculative_config={
        "model": draft, "num_speculative_tokens": args.k, "adaptive": False,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": rates}, **common)
    draft_bytes = read_bytes(spec.llm_engine.executor.models["draft"])
    results["draft_read_GB"] = draft_bytes / 1e9
    for run in results["runs"]:
        decode(spec, run["batch"], 16, 4, device)
        sp = run["speculative"] = decode(spec, run["batch"], args.prompt_len, args.tokens, device)
        run["speedup"] = sp["tokens_per_s"] / run["plain"]["tokens_per_s"]
        depth = run["batch"] * (args.prompt_len + args.tokens // 2)
        draft_read = args.k * (draft_bytes + depth * kv_bytes_per_token(shapes[1]))
        sp["floor_ms_per_step"] = 1000 * (run["step_read_GB"] * 1e9 + draft_read) / bandwidth
        sp["x_floor"] = sp["ms_per_step"] / sp["floor_ms_per_step"]
    for run in results["runs"]:
        plain_run, sp = run["plain"], run["speculative"]
        print(f"batch {run['batch']:3d}: plain {plain_run['tokens_per_s']:8.1f} tok/s "
              f"({plain_run['ms_per_step']:.2f} ms/step = {plain_run['x_floor']:.2f}x its floor "
              f"{plain_run['floor_ms_per_step']:.2f} ms), speculative "
              f"{sp['tokens_per_s']:8.1f} tok/s ({sp['ms_per_step']:.2f} ms/step = "
              f"{sp['x_floor']:.2f}x its floor {sp['floor_ms_per_step']:.2f} ms), "
              f"{run['speedup']:.2f}x")
    save(results, args.output)


def save(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
