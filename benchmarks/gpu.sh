#!/usr/bin/env bash
# Decode speed on a CUDA machine (torch with CUDA and transformers installed; no network needed):
# random-weight Qwen3-8B-shaped target, Qwen3-0.6B-shaped draft, bf16, synthetic acceptance 0.8.
# Runs in a few minutes; see benchmarks/bench_gpu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device'"
timeout 480 "$PY" benchmarks/bench_gpu.py "$@"
