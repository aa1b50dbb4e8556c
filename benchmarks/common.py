"""Shared helpers for the benchmark scripts: prompts, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"

_FALLBACK = ["The future of AI is", "Explain to a ten-year-old why the sky is blue.",
             "Write a short, friendly message inviting a coworker to lunch on Friday.",
             "What is the difference between weather and climate?"]


def prompts(n: int) -> list[str]:
    """The shared benchmark prompts (../shared/data/prompts.jsonl), cycled to n."""
    path = ROOT.parent / "shared" / "data" / "prompts.jsonl"
    base = ([json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
            if path.exists() else _FALLBACK)
    return [base[i % len(base)] for i in range(n)]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def save(name: str, result: dict) -> Path:
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                          "python": platform.python_version(), "torch": torch.__version__},
              **result}
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path
