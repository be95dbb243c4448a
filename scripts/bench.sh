#!/usr/bin/env bash
# Makes the figures of BENCHMARKS.md on this machine: the GEMM and forward benches, then a sweep
# of `sluice serve` (default model and settings) with sluice-bench, as CSV, JSON and a PNG plot.
#
#   ./scripts/bench.sh [OUT_DIR]        (default: benchmarks/)
#
# Environment: SLUICE_BENCH_LEVELS (default 1,4,16,64), SLUICE_BENCH_REQUESTS (default 4x: four
# requests per client at each level), SLUICE_BENCH_PORT (default 8399), SLUICE_SERVE_ARGS
# (extra flags for `sluice serve`). Takes about 10 minutes on 2 cores; timings move with other
# load on the machine, so run it on a quiet one.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-benchmarks}
levels=${SLUICE_BENCH_LEVELS:-1,4,16,64}
requests=${SLUICE_BENCH_REQUESTS:-4x}
port=${SLUICE_BENCH_PORT:-8399}
mkdir -p "$out"

./scripts/fetch-model.sh
cargo build --release -p sluice-server -p sluice-bench

echo "== GEMM (cargo bench -p sluice-kernels --bench gemm)"
cargo bench -p sluice-kernels --bench gemm | tee "$out/gemm.md"
echo "== forward (cargo bench -p sluice-model --bench forward)"
SLUICE_BENCH_WEIGHTS=${SLUICE_BENCH_WEIGHTS:-auto,auto-noamx,f32} \
    cargo bench -p sluice-model --bench forward | tee "$out/forward.md"

echo "== server sweep"
# shellcheck disable=SC2086 # SLUICE_SERVE_ARGS is a list of flags
./target/release/sluice serve --host 127.0.0.1 --port "$port" ${SLUICE_SERVE_ARGS:-} \
    >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "sluice serve exited; its log:" >&2
        cat "$out/serve.log" >&2
        exit 1
    fi
    sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null
./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --sweep "$levels" \
    --num-requests "$requests" --prompt-tokens 130 --output-tokens 128 --quiet \
    --csv "$out/sweep.csv" --json "$out/sweep.json" --plot "$out/sweep.png" |
    tee "$out/sweep.md"
