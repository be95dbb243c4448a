# shellcheck shell=bash
# Shared by the scripts that run test binaries elsewhere than `cargo test` does (sourced, not
# run): gpu-check.sh (on a GPU machine) and avx2-check.sh (under an emulator).

# test_binary NAME CARGO-TEST-ARGS...: builds one test target (with the caller's RUSTFLAGS and
# CARGO_TARGET_DIR) and prints its executable's path.
test_binary() {
    local name=$1
    shift
    cargo test --release "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$name"
}
