#!/usr/bin/env bash
# What publishing KV-cache events costs: the standard workload (130-token prompts, 128 output
# tokens, greedy, EOS ignored) at LEVELS clients against sluice without and with
# `--kv-events` (a pyzmq subscriber reading every message, scripts/kv-events-listen.py),
# alternated ROUNDS times in one run so the host's drift falls on both alike.
#
#   ./scripts/bench-kv-events.sh MODEL.gguf [LEVELS] [OUT_DIR]
#
# Environment: ROUNDS (3), BENCH_PORT (8413), EVENTS_PORT (5557), REQUESTS (requests per
# client at each level, 2). Prints one line per run and the mean output tokens/s of each
# with the ratio on / off.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: bench-kv-events.sh MODEL.gguf [LEVELS] [OUT_DIR]}
levels=${2:-64}
out=${3:-benchmarks/kv-events}
rounds=${ROUNDS:-3}
port=${BENCH_PORT:-8413}
events_port=${EVENTS_PORT:-5557}
per_client=${REQUESTS:-2}
mkdir -p "$out"
cargo build --release -p sluice-server -p sluice-bench >&2
# shellcheck source=scripts/lib/server.sh
. scripts/lib/server.sh

run() {
    local label=$1
    shift
    start_server "$out/$label.log" "$port" \
        ./target/release/sluice serve --model "$model" --port "$port" --kv-cache-memory 1GiB "$@"
    local listener=""
    if [ "$label" = on ]; then
        .venv/bin/python scripts/kv-events-listen.py "tcp://127.0.0.1:$events_port" \
            >"$out/listener.$label.json" &
        listener=$!
        sleep 0.5
    fi
    for c in ${levels//,/ }; do
        ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --quiet \
            --prompt-tokens 130 --output-tokens 128 --num-requests "$((c * per_client))" \
            --warmup 2 --concurrency "$c" --json "$out/$label.$c.json" >/dev/null
        echo "$label $c $(jq -r '.[0].output_throughput' "$out/$label.$c.json")" \
            | tee -a "$out/results.txt"
    done
    if [ -n "$listener" ]; then
        kill -TERM "$listener"
        wait "$listener" || true
        echo "listener: $(cat "$out/listener.$label.json")"
    fi
    stop_server
}

: >"$out/results.txt"
for _ in $(seq 1 "$rounds"); do
    run off
    run on --kv-events "tcp://*:$events_port"
done

echo
echo "output tokens/s, mean of $rounds rounds ($(basename "$model"))"
printf "%8s %10s %10s %7s\n" clients off on ratio
mean() { awk -v k="$1" '$1 " " $2 == k { s += $3; n++ } END { if (n) printf "%.1f", s / n }' "$out/results.txt"; }
for c in ${levels//,/ }; do
    off=$(mean "off $c") on=$(mean "on $c")
    printf "%8s %10s %10s %6.3fx\n" "$c" "$off" "$on" "$(awk "BEGIN { print $on / $off }")"
done
