#!/usr/bin/env bash
# Builds llama.cpp's llama-server and llama-quantize (CPU) into $TINYVLLM_PEERS_DIR/llama.cpp/build/bin, once.
# Source: LLAMA_CPP_GIT (a clone of llama.cpp, bare or not: its HEAD is exported; files missing from a partial
# snapshot, such as docs/ and models/, are not needed), else the llama.cpp vendored in the llama-cpp-python sdist
# (LLAMA_CPP_PYTHON_VERSION, default 0.3.36).
# ISA flags are listed by hand from /proc/cpuinfo (GGML_NATIVE=OFF); AMX stays off: some VMs advertise it
# but fault on AMX instructions. Runs under `nice -n 19`, with -j${JOBS:-2}.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [ -x "$LLAMA_SERVER" ] && [ -x "$LLAMA_QUANTIZE" ]; then echo "llama.cpp already built: $LLAMA_SERVER"; exit 0; fi
mkdir -p "$PEERS_DIR"
if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ] && [ -n "${LLAMA_CPP_GIT:-}" ]; then
  rm -rf "$LLAMA_SRC"; mkdir -p "$LLAMA_SRC"
  for entry in $(git --git-dir="$(git -C "$LLAMA_CPP_GIT" rev-parse --absolute-git-dir)" ls-tree HEAD --name-only); do
    git -C "$LLAMA_CPP_GIT" archive HEAD -- "$entry" 2>/dev/null | tar -x -C "$LLAMA_SRC" 2>/dev/null \
      || echo "llama.cpp source: $entry incomplete in $LLAMA_CPP_GIT"
  done
fi
if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  dl=$(mktemp -d "$PEERS_DIR/sdist.XXXX")
  nice -n 19 "$TINYVLLM_PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$dl" \
    "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
  tar -xzf "$dl"/llama_cpp_python-*.tar.gz -C "$dl"
  rm -rf "$LLAMA_SRC"; mv "$dl"/llama_cpp_python-*/vendor/llama.cpp "$LLAMA_SRC"; rm -rf "$dl"
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
isa=(-DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c)
     -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni)
     -DGGML_AVX512_BF16=$(has avx512_bf16) -DGGML_AVX_VNNI=$(has avx_vnni)
     -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
echo "ISA: ${isa[*]}"
examples=OFF  # trees before tools/ (early 2025) keep llama-server and llama-quantize under examples/
[ -d "$LLAMA_SRC/tools" ] || examples=ON
nice -n 19 cmake -S "$LLAMA_SRC" -B "$LLAMA_SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${isa[@]}" \
  -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$examples
nice -n 19 cmake --build "$LLAMA_SRC/build" --config Release --target llama-server llama-quantize -j"${JOBS:-2}"
"$LLAMA_SERVER" --version
