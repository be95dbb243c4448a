#!/usr/bin/env bash
# The random LoRA adapter of tests/fixtures/lora/ for the default model, in models/lora/ (or
# $LORA_MODELS): smollm2-r16.gguf (llama.cpp's layout) and smollm2-r16-peft/ (PEFT's), and a
# second adapter of other numbers, smollm2-r16-b.gguf, by
# scripts/tiny-lora.py with the pinned gguf and numpy (scripts/lib/gguf-venv.sh). Idempotent:
# files whose sha256 matches tests/fixtures/lora/SHA256SUMS are kept; ends by checking every
# file and fails, naming it, on a mismatch. LORA_UPDATE_SUMS=1 rewrites the sums after a change
# made on purpose. Prints the adapters' folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${LORA_MODELS:-$root/models/lora}
sums=$root/tests/fixtures/lora/SHA256SUMS
files=(smollm2-r16.gguf smollm2-r16-peft/adapter_config.json smollm2-r16-peft/adapter_model.safetensors
  smollm2-r16-b.gguf)
"$root/scripts/fetch-model.sh" "$root/models" >&2
matches() {
  local want
  want=$(awk -v f="$1" '$2 == f { print $1 }' "$sums" 2>/dev/null) || return 1
  [ -n "$want" ] && [ -f "$out/$1" ] && [ "$(sha256sum "$out/$1" | cut -d' ' -f1)" = "$want" ]
}
for f in "${files[@]}"; do
  if [ "${LORA_UPDATE_SUMS:-0}" = 1 ] || ! matches "$f"; then
    python=$("$root/scripts/lib/gguf-venv.sh")
    "$python" "$root/scripts/tiny-lora.py" --base "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$out" >&2
    # A second adapter of other numbers (tests/e2e/test_lora.py serves them side by side).
    "$python" "$root/scripts/tiny-lora.py" --base "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$out" --name smollm2-r16-b >&2
    rm -rf "$out/smollm2-r16-b-peft"
    break
  fi
done
if [ "${LORA_UPDATE_SUMS:-0}" = 1 ]; then
  (cd "$out" && sha256sum "${files[@]}") >"$sums"
fi
for f in "${files[@]}"; do
  matches "$f" || { echo "error: $out/$f does not match tests/fixtures/lora/SHA256SUMS" >&2; exit 1; }
done
echo "$out"
