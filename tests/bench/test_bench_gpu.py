"""benchmarks/bench_gpu.py (run by benchmarks/gpu.sh on a CUDA machine) exercised on the CPU with
`--smoke`: two tiny Qwen3-family models with dummy weights go through the same steps, so the
script is known to run end to end before a GPU is at hand. Its timings mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_script_runs_end_to_end_on_tiny_models(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke",
                    "--batches", "1", "3", "--tokens", "16", "--prompt-len", "8",
                    "--output", str(out)], check=True, timeout=300, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    result = json.loads(out.read_text())
    assert result["gpu"] == "cpu (--smoke)" and result["copy_bandwidth_GBps"] > 0
    assert result["synthetic_acceptance_rates"][0] == 0.8
    assert [run["batch"] for run in result["runs"]] == [1, 3]
    for run in result["runs"]:
        plain, spec = run["plain"], run["speculative"]
        assert plain["steps"] == 15  # one token per step after the prefill's first
        # At 0.8 synthetic acceptance with k = 4, a step yields 1 + 0.8 + ... + 0.8 ** 4 = 3.4
        # tokens on average.
        assert spec["steps"] < plain["steps"]
        assert run["floor_ms_per_step"] > 0
        assert run["speedup"] == spec["tokens_per_s"] / plain["tokens_per_s"]
