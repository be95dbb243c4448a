# shellcheck shell=bash
# Shared by the benchmark scripts (sourced, not run): start a server in the background and wait
# until it answers /health, and stop it.

# start_server LOG PORT COMMAND...: runs COMMAND with its output in LOG, waits up to 60 s for
# http://127.0.0.1:PORT/health, and sets $server_pid. Prints LOG and fails if the server exits
# first.
start_server() {
    local log=$1 port=$2
    shift 2
    "$@" >"$log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; return 1; }
        sleep 0.1
    done
    echo "no answer on port $port after 60 s: $log" >&2
    return 1
}

# stop_server: SIGTERM (the server drains), then waits for it.
stop_server() {
    kill -TERM "$server_pid"
    wait "$server_pid" || true
}
