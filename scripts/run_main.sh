#!/usr/bin/env bash
# The main job: vLLM's documented offline example on the bundled SmolLM2 with a draft model, then
# Gemma 3 270M drafted by SmolLM2 through Token-Level Intersection (another tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} .venv/bin/python examples/offline_inference.py "$@"
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} .venv/bin/python examples/offline_inference_tli.py "$@"
