# Sourced by scripts/make-moe-models.sh and scripts/make-smollm3-models.sh: the checks of the
# tiny random-weight models against their SHA256SUMS, and llama-quantize's K-quant files. The
# caller sets root, out (the models folder), sums (the SHA256SUMS file), update (1: remake every
# file and rewrite the sums) and files (an array: every file made, in the order of the sums).

# The sha256 that SHA256SUMS gives NAME (nothing if none).
expected() { [ -f "$sums" ] && awk -v f="$1" '$2 == f { print $1 }' "$sums"; }
# Whether $out/NAME is there with that sha256.
matches() {
  local want
  want=$(expected "$1") || return 1
  [ -n "$want" ] && [ -f "$out/$1" ] && [ "$(sha256sum "$out/$1" | cut -d' ' -f1)" = "$want" ]
}
# Whether NAME must be (re)made.
stale() { [ "$update" = 1 ] || ! matches "$1"; }

# llama-quantize (in BIN) of $out/SRC into $out/DST as TYPE on 2 threads, more flags after;
# its log in $out/DST.log.
quantize() {
  local bin=$1 src=$2 dst=$3 type=$4
  shift 4
  LD_LIBRARY_PATH=$bin "$bin/llama-quantize" "$@" "$out/$src" "$out/$dst.tmp" "$type" 2 >"$out/$dst.log" 2>&1 \
    || { cat "$out/$dst.log" >&2; echo "error: llama-quantize failed on $src" >&2; exit 1; }
  mv "$out/$dst.tmp" "$out/$dst"
  echo "$out/$dst" >&2
}

# STEM-q4_k_m.gguf from STEM-f32.gguf (llama-quantize in BIN), and STEM-q4_k_m-f32.gguf.
q4_k_m() {
  local bin=$1 stem=$2
  files+=("$stem-q4_k_m.gguf")
  if stale "$stem-q4_k_m.gguf"; then
    quantize "$bin" "$stem-f32.gguf" "$stem-q4_k_m.gguf" Q4_K_M
  fi
  # The Q4_K_M file dequantized back to F32 by llama.cpp: the same numbers as the Q4_K_M
  # file's weights, so its fixtures are an exact oracle for a dequantizing implementation.
  files+=("$stem-q4_k_m-f32.gguf")
  if stale "$stem-q4_k_m-f32.gguf"; then
    quantize "$bin" "$stem-q4_k_m.gguf" "$stem-q4_k_m-f32.gguf" F32 --allow-requantize
  fi
}

# Rewrites SHA256SUMS if updating; then checks every file against it and fails, naming the
# file, on any mismatch; prints the models folder.
check_sums() {
  local rel=${sums#"$root"/} f bad=0
  if [ "$update" = 1 ]; then
    mkdir -p "$(dirname "$sums")"
    (cd "$out" && sha256sum "${files[@]}") >"$sums"
    echo "wrote $sums" >&2
  fi
  for f in "${files[@]}"; do
    if ! matches "$f"; then
      echo "error: $out/$f: sha256 $(sha256sum "$out/$f" | cut -d' ' -f1) does not match $(expected "$f" || true) in $rel" >&2
      bad=1
    fi
  done
  [ $bad = 0 ] || { echo "error: the models differ from those the fixtures were made from (see $(dirname "$rel")/README.md)" >&2; exit 1; }
  echo "$out"
}
