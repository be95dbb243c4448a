#!/usr/bin/env bash
# sluice and llama.cpp's server side by side, in one run: the same GGUF file, the same request
# shape (130-token prompts, 128 output tokens, EOS ignored), the same cores, one server at a
# time (the other stopped). The host's speed drifts by 30% or more between periods, so only
# the ratios of one run mean anything (BENCHMARKS.md holds only such runs).
#
#   ./scripts/compare-llama.sh MODEL.gguf [LEVELS] [OUT_DIR]
#
# LEVELS: concurrent clients (default 1,16,64). Prints, per server: start to ready, RSS when
# ready, output tokens/s per level, peak RSS over the run; then llama-bench's and sluice's
# 512-token prefill. The peer is built by scripts/llama-server.sh (about 10 minutes
# the first time).
# Environment: SLUICE_KV (sluice's --kv-cache-memory, default 512MiB), SLUICE_WEIGHTS (sluice's
# --weights, default auto; also the prefill bench's), COMPARE_PORT (8411),
# COMPARE_REQUESTS (requests per client at each level, default 2x), COMPARE_F32=1 (llama.cpp
# also serves an F32 copy of the file, made once by llama-quantize into ~/.cache/sluice-peer:
# on a small model that is often llama.cpp's fastest file at many clients). Ends with
# scripts/bench-summary.py's table of the figures and their ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: compare-llama.sh MODEL.gguf [LEVELS] [OUT_DIR]}
levels=${2:-1,16,64}
out=${3:-benchmarks/compare}
kv=${SLUICE_KV:-512MiB}
weights=${SLUICE_WEIGHTS:-auto}
bench_weights=$weights
port=${COMPARE_PORT:-8411}
requests=${COMPARE_REQUESTS:-2x}
max_clients=$(tr ',' '\n' <<<"$levels" | sort -n | tail -1)
mkdir -p "$out"
name=$(basename "$model" .gguf)

peer=$(./scripts/llama-server.sh)
cargo build --release -p sluice-server -p sluice-bench >&2

# Starts a server, waits until /health answers, records the seconds that took and the RSS,
# then runs the sweep against it and stops it.
measure() {
    local label=$1
    shift
    # Both servers start with the file in the page cache (the first would otherwise pay for
    # reading it from disk and the second not): ready then measures loading, not the disk.
    cat "$model" >/dev/null
    local start
    start=$(date +%s.%N)
    "$@" >"$out/$name.$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$label exited; its log:" >&2
            cat "$out/$name.$label.log" >&2
            return 1
        fi
        sleep 0.05
    done
    local ready rss
    ready=$(awk "BEGIN { print $(date +%s.%N) - $start }")
    rss=$(awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")
    echo "| $label | ready $(printf %.2f "$ready") s | RSS when ready $rss MiB |"
    ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --sweep "$levels" \
        --num-requests "$requests" --prompt-tokens 130 --output-tokens 128 --quiet \
        --json "$out/$name.$label.json" --csv "$out/$name.$label.csv" \
        --plot "$out/$name.$label.png" | tee "$out/$name.$label.md"
    echo "| $label | peak RSS over the run $(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status") MiB |"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

echo "## $name: sluice (--weights $weights) vs llama.cpp, levels $levels, $(nproc) cores, $(date -u +%F)"
measure sluice ./target/release/sluice serve --model "$model" --host 127.0.0.1 --port "$port" \
    --kv-cache-memory "$kv" --weights "$weights"
# llama.cpp: one slot per client, each with room for the request (130 + 128 tokens).
LD_LIBRARY_PATH=$peer measure llama.cpp "$peer/llama-server" -m "$model" -t "$(nproc)" \
    -np "$max_clients" -c $((max_clients * 320)) --host 127.0.0.1 --port "$port"

if [ "${COMPARE_F32:-0}" = 1 ]; then
    f32=${LLAMA_DIR:-$HOME/.cache/sluice-peer}/$name.F32.gguf
    if [ ! -f "$f32" ]; then
        mkdir -p "$(dirname "$f32")"
        LD_LIBRARY_PATH=$peer "$peer/llama-quantize" --allow-requantize "$model" "$f32.part" F32 >&2
        mv "$f32.part" "$f32"
    fi
    LD_LIBRARY_PATH=$peer measure llama.cpp-F32 "$peer/llama-server" -m "$f32" -t "$(nproc)" \
        -np "$max_clients" -c $((max_clients * 320)) --host 127.0.0.1 --port "$port"
fi

echo "## prefill of 512 tokens"
LD_LIBRARY_PATH=$peer "$peer/llama-bench" -m "$model" -t "$(nproc)" -p 512 -n 0 | tee "$out/$name.llama-bench.md"
SLUICE_MODEL=$(realpath "$model") SLUICE_BENCH_WEIGHTS=$bench_weights SLUICE_BENCH_BATCHES=1 \
    cargo bench -p sluice-model --bench forward | tee "$out/$name.forward.md"

python3 scripts/bench-summary.py "$out" "$name" | tee "$out/$name.summary.md"
