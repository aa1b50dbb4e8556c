"""benchmarks/bench_triton.py (the Triton kernels against the torch path on CUDA, bf16) exercised
on the CPU with `--smoke`: Triton's interpreter, float32, tiny shapes, every check of the real
run (errors, batch invariance). Its times mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_triton.py"


def test_triton_bench_smoke(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    out = tmp_path / "triton.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--output", str(out)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["device"] == "cpu (--smoke, interpreter)"
    kernels = {r["kernel"] for r in result["kernels"]}
    assert kernels == {"add_rms_norm", "silu_and_mul", "rope_write_kv", "unified_attention"}
    for row in result["kernels"]:
        assert row["ok"] and row["triton_ms"] > 0, row
        assert row.get("batch_invariant", True), row


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_triton_bench_refuses_without_cuda(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path / "x.json")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "needs a CUDA device" in run.stderr
    assert not (tmp_path / "x.json").exists()
