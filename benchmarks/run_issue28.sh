#!/usr/bin/env bash
# Issue 28's adaptive-speculation figures in one go, on a quiet machine (about 20 minutes natively,
# 25 held to AVX2): `tandem bench spec --adaptive` on the useless draft (a random 4-layer llama
# with SmolLM2's tokenizer, under SmolLM2) and the synthetic pair (SmolLM2 plus 60 perturbing
# layers, drafted by SmolLM2), on a few short requests (3 x 48 tokens) and on longer runs.
# Adaptive runs twice: "fresh" (from the load-time calibration every run) and "warm" (one
# controller across rounds). `--isa avx2` holds torch and our kernels to AVX2, as
# run_issue12.sh does. Writes benchmarks/results/issue28[/avx2]/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
R=benchmarks/results/issue28
. benchmarks/isa.sh
hold_isa "$@"
if [ -n "$HELD" ]; then R=$R/avx2; fi
W=${TMPDIR:-/tmp}/tandem-bench
mkdir -p "$R" "$W"
SMOL=HuggingFaceTB/SmolLM2-135M-Instruct
.venv/bin/python - "$W" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from synthetic_pair import build_random_draft, build_target
build_target(Path(sys.argv[1]) / "target-60-0.02", 60, 0.02)
build_random_draft(Path(sys.argv[1]) / "random-draft")
PY
P=../shared/data/prompts.jsonl
[ -f "$P" ] || P=""
B=".venv/bin/tandem bench spec ${P:+--prompts $P} --threads 2 --adaptive"
lscpu | grep -E "Model name|^Flags" | cut -c1-400 > "$R/cpu.txt"
run() { name=$1; shift; echo "== $name"; $B "$@" --output-json "$R/$name.json" | grep -E "^k=|^plain"; }
USELESS=(--model $SMOL -sc "{\"model\": \"$W/random-draft\"}" --k 1 3)
SYNTH=(--model "$W/target-60-0.02" -sc "{\"model\": \"$SMOL\"}" --k 1 2 3 4 5)
run useless_short "${USELESS[@]}" --rounds 9 --num-prompts 3 --max-tokens 48
run useless_long "${USELESS[@]}" --rounds 3 --num-prompts 4 --max-tokens 128
run synth_short "${SYNTH[@]}" --rounds 4 --num-prompts 3 --max-tokens 48
run synth_long "${SYNTH[@]}" --rounds 3 --num-prompts 4 --max-tokens 96
