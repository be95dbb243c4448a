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

expected() { [ -f "$sums" ] && awk -v f="$1" '$2 == f { print $1 }' "$sums"; }
matches() {
  local want
  want=$(expected "$1") || return 1
  [ -n "$want" ] && [ -f "$out/$1" ] && [ "$(sha256sum "$out/$1" | cut -d' ' -f1)" = "$want" ]
}

files=()
for arch in $archs; do
  for fmt in f32 q8_0; do
    f=$arch-$fmt.gguf
    files+=("$f")
    if [ "$update" = 1 ] || ! matches "$f"; then
      "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch "$arch" --format "$fmt"
    fi
  done
done

for fmt in f32 mxfp4; do
  f=gpt-oss-$fmt.gguf
  files+=("$f")
  if [ "$update" = 1 ] || ! matches "$f"; then
    "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch gpt-oss --format "$fmt"
  fi
done
f=gpt-oss-harmony-mxfp4.gguf
files+=("$f")
if [ "$update" = 1 ] || ! matches "$f"; then
  "$python" "$root/scripts/tiny-moe.py" --tokenizer "$tok" --out "$out" --arch gpt-oss --format mxfp4 --harmony
fi
# The tiny gpt-oss as Hugging Face checkpoints (MXFP4 experts, and dequantized).
hf=(gpt-oss-hf-mxfp4/config.json gpt-oss-hf-mxfp4/model.safetensors
    gpt-oss-hf-f32/config.json gpt-oss-hf-f32/model.safetensors)
files+=("${hf[@]}")
for f in "${hf[@]}"; do
  if [ "$update" = 1 ] || ! matches "$f"; then
    "$python" "$root/scripts/tiny-gpt-oss-hf.py" --out "$out" >&2
    break
  fi
done

if [ "$kquants" != 0 ]; then
  bin=$(LLAMA_TARGETS="llama-quantize" "$root/scripts/llama-server.sh")
  for arch in $archs; do
    f=$arch-q4_k_m.gguf
    files+=("$f")
    if [ "$update" = 1 ] || ! matches "$f"; then
      LD_LIBRARY_PATH=$bin "$bin/llama-quantize" "$out/$arch-f32.gguf" "$out/$f.tmp" Q4_K_M 2 >"$out/$f.log" 2>&1 \
        || { cat "$out/$f.log" >&2; echo "error: llama-quantize failed on $arch-f32.gguf" >&2; exit 1; }
      mv "$out/$f.tmp" "$out/$f"
      echo "$out/$f" >&2
    fi
    # The Q4_K_M file dequantized back to F32 by llama.cpp: the same numbers as the Q4_K_M
    # file's weights, so its fixtures are an exact oracle for a dequantizing implementation.
    g=$arch-q4_k_m-f32.gguf
    files+=("$g")
    if [ "$update" = 1 ] || ! matches "$g"; then
      LD_LIBRARY_PATH=$bin "$bin/llama-quantize" --allow-requantize "$out/$f" "$out/$g.tmp" F32 2 >"$out/$g.log" 2>&1 \
        || { cat "$out/$g.log" >&2; echo "error: llama-quantize failed on $f" >&2; exit 1; }
      mv "$out/$g.tmp" "$out/$g"
      echo "$out/$g" >&2
    fi
  done
fi

if [ "$update" = 1 ]; then
  mkdir -p "$(dirname "$sums")"
  (cd "$out" && sha256sum "${files[@]}") >"$sums"
  echo "wrote $sums" >&2
fi

bad=0
for f in "${files[@]}"; do
  if ! matches "$f"; then
    echo "error: $out/$f: sha256 $(sha256sum "$out/$f" | cut -d' ' -f1) does not match $(expected "$f" || true) in tests/fixtures/moe/SHA256SUMS" >&2
    bad=1
  fi
done
[ $bad = 0 ] || { echo "error: the models differ from those the fixtures were made from (see tests/fixtures/moe/README.md)" >&2; exit 1; }
echo "$out"
