"""What every `tandem bench` command shares: prompts from a file, the machine's name, results
written as JSON (and plots, when matplotlib is installed)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
from pathlib import Path
from typing import Any, Optional

FALLBACK_PROMPTS = ["The future of AI is", "Explain to a ten-year-old why the sky is blue.",
                    "Write a short, friendly message inviting a coworker to lunch on Friday.",
                    "What is the difference between weather and climate?"]


def load_prompts(path: Optional[str], n: int) -> list[str]:
    """Prompts from a JSONL file (a "prompt" field per line) or a text file (one per line),
    cycled to n; a few built-in ones without a file."""
    if path is None:
        base = FALLBACK_PROMPTS
    else:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        base = [json.loads(line)["prompt"] if line.lstrip().startswith("{") else line
                for line in lines]
        if not base:
            raise ValueError(f"--prompts {path} holds no prompts")
    return [base[i % len(base)] for i in range(n)]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (`--rounds 0` is an error, never run as 1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def machine() -> dict[str, Any]:
    import torch

    from tandem.kernels import cpu as cpu_kernels
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cpu_matmul": os.environ.get("TANDEM_CPU_MATMUL", "auto"),
            # the instruction sets that ran: torch's own kernels, and ours (TANDEM_CPU_MARCH);
            # MKL's and oneDNN's limits where set (benchmarks/run_issue12.sh --isa avx2)
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_march": os.environ.get("TANDEM_CPU_MARCH", "native"),
            **{k.lower(): os.environ[k] for k in ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
               if k in os.environ},
            # after the run: whether the fused C kernels ran ("c") or torch ops did
            "cpu_kernels": "c" if cpu_kernels.enabled() else "torch",
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def summary(values: list[float]) -> dict[str, float]:
    """mean / median / p99 in milliseconds of values in seconds."""
    if not values:
        return {"mean_ms": 0.0, "median_ms": 0.0, "p99_ms": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"mean_ms": 1000 * statistics.fmean(values),
            "median_ms": 1000 * statistics.median(values), "p99_ms": 1000 * p99}


def rss_mb() -> float:
    """The process's resident memory now, in MiB (Linux; 0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


_MEMORY: dict[str, float] = {}  # make_llm's readings, for process_memory()


def process_memory() -> dict[str, float]:
    """The process's memory in MiB: before and after the engines were built (what loading added:
    weights plus the KV budget), now, and its peak."""
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {**_MEMORY, "rss_mb": rss_mb(), "peak_rss_mb": peak_kb / 1024}


def memory_line() -> str:
    m = process_memory()
    added = m.get("load_added_mb")
    return (f"memory: RSS {m['rss_mb']:.0f} MiB, peak {m['peak_rss_mb']:.0f} MiB"
            + (f", loading added {added:.0f} MiB" if added is not None else ""))


def write_json(path: Optional[str], result: dict[str, Any]) -> None:
    result = {"machine": machine(), "memory": process_memory(), **result}
    text = json.dumps(result, indent=2)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
        print(f"results written to {path}")
    else:
        print(text)


def pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the target model (as for tandem serve)")
    p.add_argument("--speculative-config", "-sc", default=None,
                   help="JSON, as for tandem serve (e.g. a draft model and k)")
    p.add_argument("--dtype", default="auto")
    add_weight_args(p)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add_prompt_args(p)


def add_weight_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", "-q", default=None,
                   help="as for tandem serve: gguf, none, q8_0, q4_0, q4_k (default: gguf for a "
                        "GGUF file, none otherwise)")
    p.add_argument("--load-format", default="auto",
                   help="as for tandem serve: auto, safetensors, gguf, or dummy (random weights "
                        "from config.json)")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default=None, help="JSONL (a 'prompt' per line) or text file")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--output-json", default=None, help="write results here (default: stdout)")


def make_llm(args: argparse.Namespace, speculative_config: Any = "from-args") -> Any:
    import torch

    from tandem import LLM
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = args.speculative_config if speculative_config == "from-args" else speculative_config
    if isinstance(spec, str):
        spec = json.loads(spec)
    before = rss_mb()
    _MEMORY.setdefault("rss_before_load_mb", before)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
              seed=args.seed, speculative_config=spec, enable_prefix_caching=False,
              quantization=args.quantization, load_format=args.load_format)
    after = rss_mb()
    # the first engine's load (a benchmark that builds several reports the first)
    _MEMORY.setdefault("rss_after_load_mb", after)
    _MEMORY.setdefault("load_added_mb", after - before)
    return llm
