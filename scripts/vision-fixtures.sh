#!/usr/bin/env bash
# Regenerate the vision fixtures, tests/fixtures/vision/chat-greedy.jsonl (see its README): the
# tiny Gemma 3 pair (scripts/make-vision-models.sh, checked against SHA256SUMS), llama.cpp's
# server (scripts/llama-server.sh, built once), then scripts/vision-fixtures.py. Extra arguments
# go to it. Then scripts/vision-oracle.py checks the numpy reference of the tower
# (tests/fixtures/vision/reference.json, scripts/vision-ref.py's) against llama.cpp's tower.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=$("$root/scripts/make-vision-models.sh")
bin=$(LLAMA_TARGETS="llama-server" "$root/scripts/llama-server.sh")
python3 "$root/scripts/vision-fixtures.py" --bin "$bin" --models "$models" --out "$root/tests/fixtures/vision" "$@"
# The numpy reference of the tower against llama.cpp's own (libmtmd through ctypes).
"$("$root/scripts/lib/gguf-venv.sh")" "$root/scripts/vision-oracle.py" --bin "$bin" --models "$models" \
  --fixtures "$root/tests/fixtures/vision" 2>&1 | grep -E "reference|agrees|error" >&2
