#!/usr/bin/env bash
# Plain decoding against speculation (`--speculative ngram`, or METHOD=draft:PATH for a draft
# model), in one run, one server at a time, alternated ROUNDS times so the host's drift falls
# on both alike:
#   - the editing workload (`sluice-bench --edit benchmarks/edit/inventory.py`: the file back
#     with one change, greedy, outputs end where the model ends them) at 1 client;
#   - the standard workload (130-token prompts, 128 output tokens, greedy, EOS ignored) at
#     LEVELS clients, where speculation must cost little.
#
#   ./scripts/bench-speculation.sh MODEL.gguf [LEVELS] [OUT_DIR]
#
# Environment: ROUNDS (2), SPEC_TOKENS (--num-speculative-tokens, 8), BENCH_PORT (8412),
# EDIT_REQUESTS (4), EDIT_FILE (benchmarks/edit/inventory.py), STD_REQUESTS (standard
# requests per client at each level, 1), PEER=1 (also llama.cpp's server, built by
# scripts/llama-server.sh, on the editing workload at 1 client, after sluice in each round),
# TEMPERATURE (the editing workload's, 0: greedy; sampled requests speculate too), METHOD
# (ngram, or draft:PATH), EDIT=0 (skip the editing workload). Prints one line per run and a
# summary of output tokens/s (mean over rounds) with the ratio speculation / plain.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: bench-speculation.sh MODEL.gguf [LEVELS] [OUT_DIR]}
levels=${2:-1,16,64}
out=${3:-benchmarks/speculation}
rounds=${ROUNDS:-2}
spec_tokens=${SPEC_TOKENS:-8}
port=${BENCH_PORT:-8412}
edit_requests=${EDIT_REQUESTS:-4}
edit_file=${EDIT_FILE:-benchmarks/edit/inventory.py}
std_requests=${STD_REQUESTS:-1}
temperature=${TEMPERATURE:-0}
method=${METHOD:-ngram}
spec=${method%%:*}
edit=${EDIT:-1}
mkdir -p "$out"
cargo build --release -p sluice-server -p sluice-bench >&2
# shellcheck source=scripts/lib/server.sh
. scripts/lib/server.sh

# Starts a server (the command after LABEL), logging to $out/LABEL.log, and waits for /health.
start() {
    local label=$1
    shift
    start_server "$out/$label.log" "$port" "$@"
}

# The editing workload at 1 client against the server up now; appends
# "LABEL edit 1 tok/s" to $out/results.txt.
edit_run() {
    local label=$1
    shift
    ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --quiet \
        --edit "$edit_file" --output-tokens 900 --num-requests "$edit_requests" --warmup 1 \
        --temperature "$temperature" --concurrency 1 --json "$out/$label.edit.json" "$@" \
        >/dev/null
    echo "$label edit 1 $(jq -r '.[0].output_throughput' "$out/$label.edit.json")" \
        | tee -a "$out/results.txt"
}

# sluice with extra flags: the editing workload, then the standard one at each level. Appends
# "label workload clients tok/s" lines to $out/results.txt.
run() {
    local label=$1
    shift
    start "$label" ./target/release/sluice serve --model "$model" --port "$port" \
        --kv-cache-memory 1GiB "$@"
    if [ "$edit" = 1 ]; then
        edit_run "$label"
    fi
    for c in ${levels//,/ }; do
        ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --quiet \
            --prompt-tokens 130 --output-tokens 128 --num-requests "$((c * std_requests))" \
            --warmup 2 --concurrency "$c" --json "$out/$label.std.$c.json" >/dev/null
        echo "$label standard $c $(jq -r '.[0].output_throughput' "$out/$label.std.$c.json")" \
            | tee -a "$out/results.txt"
    done
    stop_server
}

# llama.cpp's server on the editing workload (its defaults: no speculation).
peer_run() {
    local peer=$1
    LD_LIBRARY_PATH=$peer start llama.cpp "$peer/llama-server" -m "$model" -t "$(nproc)" \
        -np 1 -c 4096 --host 127.0.0.1 --port "$port"
    edit_run llama.cpp --no-server-metrics
    stop_server
}

peer=""
if [ "${PEER:-0}" = 1 ]; then
    peer=$(./scripts/llama-server.sh)
fi
: >"$out/results.txt"
for _ in $(seq 1 "$rounds"); do
    run plain
    run "$spec" --speculative "$method" --num-speculative-tokens "$spec_tokens"
    if [ -n "$peer" ]; then
        peer_run "$peer"
    fi
done

echo
echo "output tokens/s, mean of $rounds rounds ($(basename "$model"), --speculative $method --num-speculative-tokens $spec_tokens)"
printf "%-10s %8s %10s %10s %7s\n" workload clients plain "$spec" ratio
mean() { awk -v k="$1" '$1 " " $2 " " $3 == k { s += $4; n++ } END { if (n) printf "%.1f", s / n }' "$out/results.txt"; }
for key in $(awk '$1 == "plain" { print $2 ":" $3 }' "$out/results.txt" | sort -u -t: -k1,1 -k2,2n); do
    workload=${key%%:*} clients=${key##*:}
    plain=$(mean "plain $workload $clients") spec_mean=$(mean "$spec $workload $clients")
    printf "%-10s %8s %10s %10s %6.2fx\n" "$workload" "$clients" "$plain" "$spec_mean" \
        "$(awk "BEGIN { print $spec_mean / $plain }")"
    peer_mean=$(mean "llama.cpp $workload $clients")
    if [ -n "$peer_mean" ]; then
        printf "%-10s %8s %10s %10s %6.2fx  (llama.cpp's server, $spec / llama.cpp)\n" \
            "$workload" "$clients" "$peer_mean" "$spec_mean" "$(awk "BEGIN { print $spec_mean / $peer_mean }")"
    fi
done
