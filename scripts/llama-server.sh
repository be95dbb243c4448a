#!/usr/bin/env bash
# The peer to measure against: llama.cpp's `llama-server` (continuous batching over parallel
# slots, OpenAI-compatible), built from the source that the PyPI package llama-cpp-python ships
# (its vendored llama.cpp, version 0.3.36). Builds once into $LLAMA_DIR (default
# ~/.cache/sluice-peer-noamx) and prints the folder holding llama-server, llama-bench and
# llama-quantize. Takes about 10 minutes on 2 cores the first time. LLAMA_TARGETS (default
# "llama-server llama-bench llama-batched-bench llama-quantize") builds fewer, e.g.
# LLAMA_TARGETS="llama-server llama-quantize" for the MoE fixtures (scripts/make-moe-models.sh).
#
#   BIN=$(./scripts/llama-server.sh)
#   LD_LIBRARY_PATH=$BIN $BIN/llama-server -m MODEL.gguf -t 2 -np 64 -c 65536 --port 18181
#
# Measure both servers in ONE run, on the same GGUF file, the same request shape and the same
# cores, one server at a time (the other stopped): the machine's speed drifts by up to 30% over
# minutes, so only ratios taken in one run mean anything. `-np` = parallel slots (its batch),
# `-c` = total context shared by the slots.
set -euo pipefail
V=0.3.36
D=${LLAMA_DIR:-$HOME/.cache/sluice-peer-noamx}
BIN=$D/llama_cpp_python-$V/vendor/llama.cpp/build/bin
TARGETS=${LLAMA_TARGETS:-llama-server llama-bench llama-batched-bench llama-quantize}
built=1
for t in $TARGETS; do [ -x "$BIN/$t" ] || built=0; done
if [ $built = 1 ]; then echo "$BIN"; exit 0; fi
mkdir -p "$D"; cd "$D"
[ -f llama_cpp_python-$V.tar.gz ] || pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==$V -d . >&2
[ -d llama_cpp_python-$V ] || tar xzf llama_cpp_python-$V.tar.gz
command -v cmake >/dev/null || { apt-get update -qq >&2 && apt-get install -y -qq cmake >&2; }
cd llama_cpp_python-$V/vendor/llama.cpp
# Every x86 extension this CPU has, but AMX: ggml's AMX code dies on these hosts (SIGILL without
# tile permission; a segfault with it, 2026-11-26), so the build without it is llama.cpp's fastest
# that runs here.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { grep -qw "$1" <<<"$flags" && echo ON || echo OFF; }
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_BMI2="$(has bmi2)" \
  -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_AVX_VNNI="$(has avx_vnni)" \
  -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
  -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" >&2
# shellcheck disable=SC2086 # TARGETS is a list of words
cmake --build build -j2 --target $TARGETS >&2
echo "$BIN"
