#!/usr/bin/env bash
# Regenerate tests/fixtures/lora/smollm2-r16-greedy.jsonl (see its README): the adapter
# (scripts/make-lora-adapters.sh, checked against its sums), llama.cpp's server and quantize tool
# (scripts/llama-server.sh, built once), the default model's Q4_1 file dequantized to F32 by
# llama-quantize (the weights sluice computes with in f32; in $F32_DIR, default /tmp, never
# committed), then scripts/lora-fixtures.py with `--lora` on it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
adapters=$("$root/scripts/make-lora-adapters.sh")
bin=$(LLAMA_TARGETS="llama-server llama-quantize" "$root/scripts/llama-server.sh")
f32="${F32_DIR:-/tmp}/smollm2-135m-f32.gguf"
if [ ! -s "$f32" ]; then
  LD_LIBRARY_PATH=$bin "$bin/llama-quantize" --allow-requantize \
    "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$f32.tmp" F32 2 >&2
  mv "$f32.tmp" "$f32"
fi
python3 "$root/scripts/lora-fixtures.py" --bin "$bin" --model "$f32" \
  --adapter "$adapters/smollm2-r16.gguf" --out "$root/tests/fixtures/lora"
