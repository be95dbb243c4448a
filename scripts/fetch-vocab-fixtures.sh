#!/usr/bin/env bash
# Fetch llama.cpp's vocab-only GGUF test files that are too large to keep in the repository
# (tests/fixtures/tokenizer holds the small Llama SentencePiece one): Phi-3's SentencePiece
# vocabulary with its inputs and expected ids, and Baichuan's (SentencePiece, no expected ids of
# its own; tests/fixtures/tokenizer has ids llama.cpp gave for extra inputs). They ship in the
# source package of llama-cpp-python 0.3.36 (its vendored llama.cpp, MIT licensed), which
# scripts/llama-server.sh also builds from; an already downloaded copy is reused.
# Idempotent: files present with the right checksum are left alone.
#
#   ./scripts/fetch-vocab-fixtures.sh [DEST]    # DEST defaults to models/
set -euo pipefail

V=0.3.36
dest_dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/models}"
cache=${LLAMA_DIR:-$HOME/.cache/sluice-peer-noamx}
member_dir="llama_cpp_python-$V/vendor/llama.cpp/models"

# name sha256
files="
ggml-vocab-phi-3.gguf 967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326
ggml-vocab-phi-3.gguf.inp be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0
ggml-vocab-phi-3.gguf.out ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29
ggml-vocab-baichuan.gguf 4f5b955697f3bd3108070b1d5936c7eb9fc542b81c6932e59abddec75bca1963
"

check() { echo "$2  $1" | sha256sum --check --status; }

missing=0
while read -r name sum; do
    [ -n "$name" ] || continue
    check "$dest_dir/$name" "$sum" 2>/dev/null || missing=1
done <<<"$files"
if [ $missing = 0 ]; then
    echo "vocab fixtures present: $dest_dir"
    exit 0
fi

mkdir -p "$dest_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sdist="$cache/llama_cpp_python-$V.tar.gz"
if [ ! -f "$sdist" ]; then
    sdist="$tmp/llama_cpp_python-$V.tar.gz"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$V" -d "$tmp"
fi
members=()
while read -r name sum; do
    [ -n "$name" ] && members+=("$member_dir/$name")
done <<<"$files"
tar xzf "$sdist" -C "$tmp" "${members[@]}"
while read -r name sum; do
    [ -n "$name" ] || continue
    if ! check "$tmp/$member_dir/$name" "$sum"; then
        echo "error: sha256 of $name does not match $sum" >&2
        exit 1
    fi
    mv "$tmp/$member_dir/$name" "$dest_dir/$name"
done <<<"$files"
echo "vocab fixtures fetched: $dest_dir"
