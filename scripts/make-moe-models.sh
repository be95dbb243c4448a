#!/usr/bin/env bash
# The tiny random-weight MoE models that tests/fixtures/moe/ were recorded on, in
# models/tiny-moe/ (or $MOE_MODELS): for each of qwen3moe, qwen2moe and mixtral, ARCH-f32.gguf
# and ARCH-q8_0.gguf (scripts/tiny-moe.py, pinned gguf and numpy in a cached venv) and
# ARCH-q4_k_m.gguf (llama.cpp's llama-quantize on the F32 file, scripts/llama-server.sh) and
# ARCH-q4_k_m-f32.gguf (that file dequantized back to F32 by llama-quantize); and gpt-oss-f32.gguf
# and gpt-oss-mxfp4.gguf (its experts in MXFP4 as the real files hold them; Python only), and
# gpt-oss-harmony-mxfp4.gguf (the same weights with Harmony's tokens and chat template), and
# gpt-oss-hf-mxfp4/ and gpt-oss-hf-f32/ (the same model as Hugging Face checkpoints).
# Idempotent: files whose sha256 already matches tests/fixtures/moe/SHA256SUMS are kept. Ends by
# checking every file against SHA256SUMS and fails, naming the file, on any mismatch: a test that
# runs after this compares against the very weights the fixtures were made from.
#
#   scripts/make-moe-models.sh                 # all 19 files (builds llama.cpp once, ~10 min)
#   MOE_KQUANTS=0 scripts/make-moe-models.sh   # F32 and Q8_0 only: Python, no llama.cpp
#   MOE_UPDATE_SUMS=1 scripts/make-moe-models.sh   # after changing the weights on purpose:
#                                              # regenerate all and rewrite SHA256SUMS
#
# Prints the models folder on stdout. MOE_VENV (default ~/.cache/sluice-moe-venv) is the venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${MOE_MODELS:-$root/models/tiny-moe}
kquants=${MOE_KQUANTS:-1}
update=${MOE_UPDATE_SUMS:-0}
sums=$root/tests/fixtures/moe/SHA256SUMS
archs="qwen3moe qwen2moe mixtral"

python=$("$root/scripts/lib/gguf-venv.sh")
"$root/scripts/fetch-model.sh" "$root/models" >&2
tok=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"

# expected, matches, stale, q4_k_m and check_sums.
. "$root/scripts/lib/tiny-models.sh"

files=()
for arch in $archs; do
  for fmt in f32 q8_0; do
    f=$arch-$fmt.gguf
    files+=("$f")
    if stale "$f"; then
      "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch "$arch" --format "$fmt"
    fi
  done
done

for fmt in f32 mxfp4; do
  f=gpt-oss-$fmt.gguf
  files+=("$f")
  if stale "$f"; then
    "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch gpt-oss --format "$fmt"
  fi
done
f=gpt-oss-harmony-mxfp4.gguf
files+=("$f")
if stale "$f"; then
  "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch gpt-oss --format mxfp4 --harmony
fi
# The tiny gpt-oss as Hugging Face checkpoints (MXFP4 experts, and dequantized).
hf=(gpt-oss-hf-mxfp4/config.json gpt-oss-hf-mxfp4/model.safetensors
    gpt-oss-hf-f32/config.json gpt-oss-hf-f32/model.safetensors)
files+=("${hf[@]}")
for f in "${hf[@]}"; do
  if stale "$f"; then
    "$python" "$root/scripts/tiny-gpt-oss-hf.py" --out "$out" >&2
    break
  fi
done

if [ "$kquants" != 0 ]; then
  bin=$(LLAMA_TARGETS="llama-quantize" "$root/scripts/llama-server.sh")
  for arch in $archs; do
    q4_k_m "$bin" "$arch"
  done
fi

check_sums
