#!/usr/bin/env bash
# On a lent CUDA machine (torch with CUDA, triton, transformers and pytest installed; no network
# needed), in about 6 minutes, writing JSON and logs to $OUT (or benchmarks/results):
#   1. the Triton kernels in bfloat16 against the torch path they replace (bench_triton.py:
#      errors, batch invariance on the device, times) -> triton.json;
#   2. CUDA graphs (tests/worker/test_cuda_graphs.py): graphed == eager greedy tokens in float32
#      and bfloat16, speculative greedy == plain under graphs, no host sync in a replayed step,
#      capture time and memory logged -> cuda_graph_tests.log;
#   3. decode speed, graphed (bench_gpu.py: random-weight Qwen3-8B-shaped target, Qwen3-0.6B-
#      shaped draft, bf16, synthetic acceptance 0.8, k = 4, batch 1, 8, 32, each step as a
#      multiple of its floor) -> gpu.json, then plain decoding eager at batch 1 and 32 for the
#      graphs' gain -> gpu_eager.json.
# Each part runs under its own time limit; a failed part is reported and the next still runs.
# Extra arguments go to the graphed bench_gpu.py run.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"; mkdir -p "$out"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
"$PY" -c "import torch, transformers, triton; assert torch.cuda.is_available(), 'no CUDA device'" \
    || exit 1
status=0
timeout 70 "$PY" benchmarks/bench_triton.py --iters 20 --output "$out/triton.json" \
    || { echo "bench_triton.py failed ($?)"; status=1; }
timeout 80 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/worker/test_cuda_graphs.py > "$out/cuda_graph_tests.log" 2>&1 \
    || { echo "CUDA graph tests failed: see $out/cuda_graph_tests.log"; status=1; }
echo "graph tests: $(tail -1 "$out/cuda_graph_tests.log")"
timeout 150 "$PY" benchmarks/bench_gpu.py --tokens 64 --output "$out/gpu.json" "$@" \
    || { echo "bench_gpu.py (graphs) failed ($?)"; status=1; }
timeout 60 "$PY" benchmarks/bench_gpu.py --tokens 32 --batches 1 32 --enforce-eager \
    --plain-only --output "$out/gpu_eager.json" \
    || { echo "bench_gpu.py (eager) failed ($?)"; status=1; }
exit $status
