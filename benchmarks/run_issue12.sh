#!/usr/bin/env bash
# The numbers of benchmarks/LOG.md's "`tandem bench` on SmolLM2-135M (issue 12)" sections (their
# current figures: docs/performance.md's summary), in one go, on a quiet machine:
# SmolLM2-135M float32 (bundled GGUF), 2 threads. Writes benchmarks/results/*.json and docs/*.png.
#
# `--isa avx2` runs it all as on a CPU with AVX2 and FMA but no AVX-512 or AMX (an AMD EPYC of
# the Zen 1-3 kinds, an older Xeon): torch's own kernels, MKL and oneDNN are held to AVX2 and our
# kernels are built for haswell, for tandem and transformers alike. The memory, caches and clock
# stay this machine's, so it shows what the code does with AVX2, not how fast such a CPU is.
# Results go to benchmarks/results/avx2/ and docs/spec_avx2.png.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
B=".venv/bin/tandem bench"
SMOL=HuggingFaceTB/SmolLM2-135M-Instruct
P=../shared/data/prompts.jsonl
[ -f "$P" ] || P=""
R=benchmarks/results
PLOT=docs/spec.png
. benchmarks/isa.sh
hold_isa "$@"
if [ -n "$HELD" ]; then R=benchmarks/results/avx2 PLOT=docs/spec_avx2.png; fi
W=${TMPDIR:-/tmp}/tandem-bench
mkdir -p "$R" "$W"
# The cores' multiply-add ceiling, which a 16-row step bound by arithmetic is measured against.
WIDTHS=256
[ -z "${TANDEM_CPU_MARCH:-}" ] && grep -qw avx512f /proc/cpuinfo && WIDTHS="256 512"
if grep -qw fma /proc/cpuinfo && cc -O2 -fopenmp benchmarks/fma_peak.c -o "$W/fma_peak"; then
  "$W/fma_peak" $WIDTHS | tee $R/fma_peak.jsonl
fi
.venv/bin/python - "$W" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from synthetic_pair import build_random_draft, build_target
w = Path(sys.argv[1])
build_target(w / "target-90-0.02", 90, 0.02)
build_random_draft(w / "random-draft")
PY
$B latency --model $SMOL ${P:+--prompts $P} --num-prompts 4 --max-tokens 128 --threads 2 \
  --peers --rounds 3 --output-json $R/latency.json
$B throughput --model $SMOL ${P:+--prompts $P} --num-prompts 16 --max-tokens 128 --threads 2 \
  --peers --rounds 3 --output-json $R/throughput.json
# The bfloat16 matmul mode, only on CPUs that multiply bf16 natively (AVX512-BF16 or AMX).
if [ -z "${TANDEM_CPU_MARCH:-}" ] && grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  TANDEM_CPU_MATMUL=bf16 $B latency --model $SMOL ${P:+--prompts $P} --num-prompts 4 \
    --max-tokens 128 --threads 2 --peers --rounds 3 --output-json $R/latency_bf16.json
  TANDEM_CPU_MATMUL=bf16 $B throughput --model $SMOL ${P:+--prompts $P} --num-prompts 16 \
    --max-tokens 128 --threads 2 --peers --rounds 3 --output-json $R/throughput_bf16.json
fi
$B spec --model "$W/target-90-0.02" -sc "{\"model\": \"$SMOL\"}" --k 1 2 3 4 5 --adaptive \
  --rounds 3 ${P:+--prompts $P} --num-prompts 4 --max-tokens 64 --threads 2 --plot $PLOT \
  --output-json $R/spec_synthetic.json
$B spec --model $SMOL -sc "{\"model\": \"$W/random-draft\"}" --k 1 3 --adaptive \
  --rounds 5 ${P:+--prompts $P} --num-prompts 4 --max-tokens 64 --threads 2 \
  --output-json $R/spec_random_draft.json
