#!/usr/bin/env bash
# The main job: vLLM's documented offline example, on the bundled SmolLM2 with a draft model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} .venv/bin/python examples/offline_inference.py "$@"
