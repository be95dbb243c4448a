#!/usr/bin/env bash
# Regenerate the Gemma 3 270M fixtures, tests/fixtures/gemma3-270m-*.jsonl (see
# tests/fixtures/README.md): the model (scripts/fetch-gemma.sh), llama.cpp's server
# (scripts/llama-server.sh, built once), the Q4_K_M file dequantized to F32 by llama-quantize
# (the weights sluice computes with in f32; ~1.1 GB, so it goes to $F32_DIR, default /tmp, and
# is never committed), then scripts/gemma-fixtures.py. Extra arguments go to it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/fetch-gemma.sh" "$root/models" >&2
bin=$(LLAMA_TARGETS="llama-server llama-quantize" "$root/scripts/llama-server.sh")
f32="${F32_DIR:-/tmp}/gemma-3-270m-f32.gguf"
if [ ! -s "$f32" ]; then
  # Write under a temporary name so an interrupted run leaves no half file behind.
  LD_LIBRARY_PATH=$bin "$bin/llama-quantize" --allow-requantize "$root/models/gemma-3-270m-q4_k_m.gguf" \
    "$f32.tmp" F32 2 >&2
  mv "$f32.tmp" "$f32"
fi
python3 "$root/scripts/gemma-fixtures.py" --bin "$bin" --model "$f32" --out "$root/tests/fixtures" "$@"
