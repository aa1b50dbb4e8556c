#!/usr/bin/env bash
# On a lent CUDA machine: the checks of cuda_check.py, then the engine-level tests on CUDA with
# dtype "auto" meaning float32 (cuda_float32.py), so the suite's float32 references (transformers
# on the CPU, exact distributions) compare like with like. Needs torch with CUDA, transformers,
# pytest, scipy and gguf; no network. The structured-output tests run where llguidance imports,
# and the tests spread over pytest-xdist workers where it is installed (the H200 image has it).
# Output: $OUT (or benchmarks/results) cuda_check.json and cuda_tests.log. The first H200 run
# (2026-12-04) found two CUDA-only bugs, both fixed since.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"; mkdir -p "$out"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
timeout 200 "$PY" benchmarks/cuda_check.py --out "$out"
extra=(--ignore=tests/sample/test_structured_outputs.py)
"$PY" -c "import llguidance" 2>/dev/null && extra=()
"$PY" -c "import xdist" 2>/dev/null && extra+=(-n "${CUDA_TEST_WORKERS:-6}")
timeout "${CUDA_TEST_TIMEOUT:-400}" "$PY" -m pytest -q -p no:cacheprovider -p cuda_float32 -rfE \
    --tb=short tests/engine tests/spec_decode tests/sample "${extra[@]}" > "$out/cuda_tests.log" 2>&1
echo "pytest exit $?; $(tail -1 "$out/cuda_tests.log")"
