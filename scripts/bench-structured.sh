#!/usr/bin/env bash
# Structured outputs against free text on one `sluice serve`: at each level of concurrent
# clients, four closed-loop runs one after another (so the host's drift hits them alike):
#   plain        token-id completions, EOS ignored, exactly OUTPUT tokens each;
#   json-schema  the same prompts on /v1/completions with benchmarks/structured/schema.json as
#                `response_format`: ends when the schema is complete, CAP tokens at most;
#   tools        /v1/chat/completions, a user message of PROMPT words and the 3 tools of
#                benchmarks/structured/tools.json with tool_choice "required" (a call forced by
#                grammar) and parallel_tool_calls false (one call, so the output ends with it
#                instead of a small model chaining calls up to the cap), CAP tokens at most;
#                its prompt also holds the chat template and the tools' definitions, several
#                hundred tokens;
#   chat         the tools run's unconstrained twin: /v1/chat/completions without tools, EOS
#                ignored, OUTPUT tokens, the same user messages after a system message shared
#                by every request (as the tool definitions are) and sized by a probe so the
#                prompt is as long as the tools run's: the tools ratio is taken against a run
#                with the same endpoint, prompt length and shared prefix.
# Throughput is output tokens per second from the server's usage. A constrained output ends
# with its grammar, so it is shorter than OUTPUT and its prefill weighs more per output token:
# the server's mean step time per run tells the engine's own cost apart. sluice's /metrics
# gives that and the grammar-mask time per constrained step: at 64 clients, the mask cost per
# step at about 64 constrained rows. Outputs cut at CAP fail validation and are counted apart.
#
#   ./scripts/bench-structured.sh MODEL.gguf [LEVELS] [OUT_DIR]
#
# LEVELS: concurrent clients (default 1,16,64). OUT_DIR (default benchmarks/structured/runs)
# gets MODEL.cN.KIND.{json,csv,md}, the server's log and summary.md (the table printed last).
# Environment: SLUICE_KV (--kv-cache-memory, default 512MiB), BENCH_PORT (8412),
# BENCH_REQUESTS (per run: N, or Kx for K per client; default 2x), BENCH_PROMPT (130),
# BENCH_OUTPUT (128), BENCH_CAP (max_tokens of the constrained runs, default 2x BENCH_OUTPUT:
# only a cap against runaway strings), BENCH_SCHEMA and BENCH_TOOLS (the input files),
# BENCH_TEMPERATURE (0), BENCH_PARALLEL_TOOL_CALLS (false; empty: not sent), SKIP_BUILD=1
# (use the binaries in target/release as they are).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?usage: bench-structured.sh MODEL.gguf [LEVELS] [OUT_DIR]}
levels=${2:-1,16,64}
out=${3:-benchmarks/structured/runs}
kv=${SLUICE_KV:-512MiB}
port=${BENCH_PORT:-8412}
requests=${BENCH_REQUESTS:-2x}
prompt=${BENCH_PROMPT:-130}
output=${BENCH_OUTPUT:-128}
cap=${BENCH_CAP:-$((2 * output))}
schema=${BENCH_SCHEMA:-benchmarks/structured/schema.json}
tools=${BENCH_TOOLS:-benchmarks/structured/tools.json}
temperature=${BENCH_TEMPERATURE:-0}
parallel=${BENCH_PARALLEL_TOOL_CALLS-false}
mkdir -p "$out"
name=$(basename "$model" .gguf)

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p sluice-server -p sluice-bench >&2
fi

./target/release/sluice serve --model "$model" --host 127.0.0.1 --port "$port" \
    --kv-cache-memory "$kv" >"$out/$name.serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "sluice serve exited; its log:" >&2
        cat "$out/$name.serve.log" >&2
        exit 1
    fi
    sleep 0.1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null

bench() {
    ./target/release/sluice-bench --base-url "http://127.0.0.1:$port" --quiet \
        --temperature "$temperature" "$@"
}
# `prompt_tokens_mean` of a run's JSON, rounded.
prompt_of() {
    python3 -c 'import json, sys; print(round(json.load(open(sys.argv[1]))[0]["prompt_tokens_mean"]))' "$1"
}

# Prompt tokens of a chat request with a shared system message of $1 words (0: none) and a
# user message of PROMPT words, as the server counts them.
chat_prompt() {
    bench --chat --system-words "$1" --concurrency 1 --num-requests 1 --warmup 0 \
        --prompt-tokens "$prompt" --output-tokens 1 --no-server-metrics \
        --json "$out/$name.probe.json" >/dev/null
    prompt_of "$out/$name.probe.json"
}
bare=$(chat_prompt 0)
system=

echo "## $name: structured outputs, levels $levels, prompt $prompt, output $output" \
    "(constrained: up to $cap), $requests per run, $(nproc) cores, $(date -u +%F)"
for level in ${levels//,/ }; do
    for kind in plain json-schema tools chat; do
        base="$out/$name.c$level.$kind"
        case $kind in
            plain) args=(--prompt-tokens "$prompt" --output-tokens "$output") ;;
            json-schema)
                args=(--prompt-tokens "$prompt" --output-tokens "$cap" --json-schema "$schema")
                ;;
            tools)
                args=(--prompt-tokens "$prompt" --output-tokens "$cap" --tools "$tools"
                    ${parallel:+--parallel-tool-calls "$parallel"})
                ;;
            chat)
                # A system message standing in for the tool definitions: as long, and shared
                # by every request as they are (prefix caching sees the same), sized once by
                # a probe and one correction.
                if [ -z "$system" ]; then
                    want=$(prompt_of "$out/$name.c$level.tools.json")
                    system=$((want > bare ? want - bare : 1))
                    system=$((system + want - $(chat_prompt "$system")))
                    system=$((system > 1 ? system : 1))
                fi
                args=(--chat --system-words "$system" --prompt-tokens "$prompt"
                    --output-tokens "$output")
                ;;
        esac
        echo "### $level clients, $kind"
        bench --concurrency "$level" --num-requests "$requests" "${args[@]}" \
            --json "$base.json" --csv "$base.csv" | tee "$base.md"
    done
done

# One row per level from the JSON files: throughput of each workload (json-schema against
# plain, tools against chat), the server's mean step time per run, the mask time per
# constrained step, the validated outputs.
python3 - "$out" "$name" "$levels" <<'PY' | tee "$out/summary.md"
import json, sys

out, name, levels = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
KINDS = ("plain", "json-schema", "chat", "tools")


def load(level, kind):
    with open(f"{out}/{name}.c{level}.{kind}.json") as f:
        return json.load(f)[0]


def ms(x):
    return "-" if x is None else f"{x:.2f}"


print()
print("| clients | plain tok/s | schema tok/s (ratio) | chat tok/s | tools tok/s (ratio) "
      "| step ms plain / schema / chat / tools | mask ms per constrained step schema / tools "
      "| validated schema / tools | output tok schema / tools | prompt tok plain / chat / tools |")
print("|---|---|---|---|---|---|---|---|---|---|")
notes = []
for level in levels:
    runs = {k: load(level, k) for k in KINDS}

    def tput(k, against=None):
        t = runs[k]["output_throughput"]
        base = runs[against]["output_throughput"] if against else 0
        return f"{t:.1f} ({t / base:.2f})" if base > 0 else f"{t:.1f}"

    def server(k, field):
        s = runs[k].get("server")
        return None if s is None else s.get(field)

    def val(k):
        r = runs[k]
        failed = f", {r['failed']} failed" if r["failed"] else ""
        capped = f", {r['length_capped']} capped" if r["length_capped"] else ""
        return f"{r['validated']}/{r['checked']}{failed}{capped}"

    cols = [
        level,
        tput("plain"),
        tput("json-schema", "plain"),
        tput("chat"),
        tput("tools", "chat"),
        " / ".join(ms(server(k, "step_ms")) for k in KINDS),
        " / ".join(ms(server(k, "mask_ms")) for k in ("json-schema", "tools")),
        " / ".join(val(k) for k in ("json-schema", "tools")),
        " / ".join(f"{runs[k]['output_tokens_mean']:.0f}" for k in ("json-schema", "tools")),
        " / ".join(f"{runs[k]['prompt_tokens_mean']:.0f}" for k in ("plain", "chat", "tools")),
    ]
    print("| " + " | ".join(str(c) for c in cols) + " |")
    for k, r in runs.items():
        for what in ("first_invalid", "first_error"):
            if r.get(what):
                notes.append(f"{level} clients, {k}, {what.replace('_', ' ')}: {r[what]}")
if notes:
    print()
    print("\n".join(notes))
PY
