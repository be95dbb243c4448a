#!/usr/bin/env bash
# LoRA adapters served beside the base, measured in one run (issue 57's targets): on MODEL
# (default Qwen2.5-Coder-1.5B-Instruct Q4_K_M), four random rank-16 adapters on all seven
# projections (scripts/tiny-lora.py), 130-token prompts, 128 output tokens, EOS ignored:
#
# - sluice, one server with the four adapters (--max-loras 4): the base alone at 1 and 16
#   clients, one adapter at 1 and 16, and 16 clients spread over the four adapters in turn;
# - llama.cpp's server on the same file with one adapter (`--lora`, applied to every request)
#   at 1 and 16 clients.
#
#   ./scripts/bench-lora.sh [MODEL] [OUT_DIR]    # OUT_DIR default /tmp/sluice-bench-lora (adapters ~70 MB each)
#
# One server at a time; the host drifts, so only the ratios of one run mean anything.
# Environment: BENCH_REQUESTS (requests per client, default 1x), BENCH_PORT (8412).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
out=${2:-/tmp/sluice-bench-lora}
requests=${BENCH_REQUESTS:-1x}
port=${BENCH_PORT:-8412}
mkdir -p "$out/adapters"
python=$(./scripts/lib/gguf-venv.sh)
for a in a b c d; do
    [ -f "$out/adapters/bench-$a.gguf" ] ||
        "$python" scripts/tiny-lora.py --base "$model" --out "$out/adapters" --name "bench-$a" >/dev/null
    rm -rf "$out/adapters/bench-$a-peft"
done
peer=$(./scripts/llama-server.sh)
cargo build --release -p sluice-server -p sluice-bench >&2

# wait_ready PID LABEL: until /health answers, or the server exits (its log then shown).
wait_ready() {
    for _ in $(seq 1 1200); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 "$1" 2>/dev/null || { echo "$2 exited:" >&2; cat "$out/$2.log" >&2; return 1; }
        sleep 0.1
    done
    return 1
}

# bench LABEL LEVEL MODELS: one sluice-bench level, its output tok/s printed as a table row.
bench() {
    ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --model "$3" \
        --sweep "$2" --num-requests "$requests" --prompt-tokens 130 --output-tokens 128 \
        --quiet --csv "$out/$1.csv" >"$out/$1.md"
    python3 - "$out/$1.csv" "$1" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"| {sys.argv[2]} | {r['concurrency']} | {float(r['output_throughput']):.1f} | "
          f"{float(r['ttft_p50_ms']):.0f} | {r['failed']} |")
PY
}

echo "## LoRA: $(basename "$model"), $(nproc) cores, $(date -u +%FT%TZ), requests $requests a client"
echo "| server, model | clients | output tok/s | TTFT p50 ms | failed |"
echo "| --- | ---: | ---: | ---: | ---: |"
cat "$model" >/dev/null
modules=$(for a in a b c d; do printf '%s=%s,' "$a" "$out/adapters/bench-$a.gguf"; done)
./target/release/sluice serve --model "$model" --host 127.0.0.1 --port "$port" \
    --lora-modules "${modules%,}" --max-loras 4 >"$out/sluice.log" 2>&1 &
pid=$!
wait_ready "$pid" sluice
base=$(basename "$model" .gguf)
bench sluice-base-1 1 "$base"
bench sluice-base-16 16 "$base"
bench sluice-adapter-1 1 a
bench sluice-adapter-16 16 a
bench sluice-four-adapters-16 16 a,b,c,d
kill "$pid"
wait "$pid" 2>/dev/null || true

LD_LIBRARY_PATH=$peer "$peer/llama-server" -m "$model" --lora "$out/adapters/bench-a.gguf" \
    -t "$(nproc)" -np 16 -c $((16 * 320)) --host 127.0.0.1 --port "$port" >"$out/llama.cpp.log" 2>&1 &
pid=$!
wait_ready "$pid" llama.cpp
bench llama.cpp-adapter-1 1 "$base"
bench llama.cpp-adapter-16 16 "$base"
kill "$pid"
wait "$pid" 2>/dev/null || true
