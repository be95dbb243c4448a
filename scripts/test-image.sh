#!/usr/bin/env bash
# Build the Dockerfile's image and test it from outside the container, with podman (rootful,
# no daemon, runc, vfs storage) and base images made locally: no Docker daemon and no container
# registry are needed. scripts/test.sh runs it; docs/deployment.md ("Testing the image").
#
#   scripts/test-image.sh              # build, run one container, check it, stop it, remove the image
#   scripts/test-image.sh build        # build and tag $SLUICE_IMAGE (kept)
#   scripts/test-image.sh start N PORT # N containers sluice-test-0.. on host ports PORT, PORT+1, ..
#   scripts/test-image.sh check PORT   # /health 200, a completion with text, sluice_ metrics
#   scripts/test-image.sh stop         # stop and remove the containers `start` started
#   scripts/test-image.sh clean [all]  # remove $SLUICE_IMAGE (all: also the base and Rust images)
#
# Sourced (`. scripts/test-image.sh`), it runs nothing: it sets `set -euo pipefail` and
# CONTAINERS_CONF, and defines the functions image_build, containers_start N PORT [ARGS..]
# (ARGS replace the image's `serve`), container_check PORT [NAME], containers_stop,
# image_clean [all], and pm (podman with this script's settings).
#
# The images: localhost/debian:bookworm-slim (debootstrap --variant=minbase, Debian's mirrors),
# localhost/rust:<version>-bookworm (that base, the packages the build needs and this machine's
# rustup toolchain of the version the Dockerfile's RUST_IMAGE names, laid out as the official
# rust image has it), then the Dockerfile's image with RUST_IMAGE and RUNTIME_IMAGE pointed at
# them. The first two are kept for the next run, and so are the Dockerfile's cargo cache mounts
# (/var/tmp/buildah-cache); `clean all` removes them. Every step runs under `timeout`; every check
# is curl from the host, on the port the container's 8000 is published on. Builds take a lock,
# remove what killed or failed builds left, and check for free disk first (docs/testing.md).
#
# Settings (environment): SLUICE_IMAGE (localhost/sluice:test), BAKE_MODEL (1), TARGET_CPU
# (the Dockerfile's default), KEEP_IMAGE=1 keeps $SLUICE_IMAGE after the default run,
# SLUICE_TEST_PORT (18000), SLUICE_PUBLISH_ADDR (127.0.0.1), SLUICE_NETWORK=host (the host's
# network, each container on its own SLUICE_PORT, instead of published ports), BUILD_TIMEOUT
# (seconds for the image build, 5400), IMAGE_MIN_FREE_GB (8: the free space the build checks
# for first).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SLUICE_IMAGE=${SLUICE_IMAGE:-localhost/sluice:test}
BAKE_MODEL=${BAKE_MODEL:-1}
SLUICE_TEST_PORT=${SLUICE_TEST_PORT:-18000}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-5400}
IMAGE_MIN_FREE_GB=${IMAGE_MIN_FREE_GB:-8}
SLUICE_NETWORK=${SLUICE_NETWORK:-bridge}
SLUICE_PUBLISH_ADDR=${SLUICE_PUBLISH_ADDR:-127.0.0.1}
STATE=${SLUICE_IMAGE_STATE:-/var/tmp/sluice-image}
CONTAINER_PREFIX=sluice-test-
DEBIAN_SUITE=bookworm
BASE_IMAGE=localhost/debian:$DEBIAN_SUITE-slim

log() { printf '[test-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf '[test-image] error: %s\n' "$*" >&2
    exit 1
}

# podman as it works here: runc (crun fails on this kernel's cgroups), vfs storage (no
# overlayfs inside these VMs), no default ulimits (podman's are refused).
mkdir -p "$STATE"
printf '[containers]\ndefault_ulimits = []\n' >"$STATE/containers.conf"
export CONTAINERS_CONF=$STATE/containers.conf
PODMAN=(podman --storage-driver vfs --runtime runc)
pm() { "${PODMAN[@]}" "$@"; }
# tpm SECONDS ARGS..: pm under `timeout`.
tpm() { timeout "$1" "${PODMAN[@]}" "${@:2}"; }

# The Rust version of the Dockerfile's default RUST_IMAGE (rust:1.95.0-bookworm -> 1.95.0).
rust_version() {
    local v
    v=$(sed -n 's/^ARG RUST_IMAGE=rust:\([0-9.]*\)-.*/\1/p' "$ROOT/Dockerfile")
    [ -n "$v" ] || die "no 'ARG RUST_IMAGE=rust:<version>-...' line in $ROOT/Dockerfile"
    echo "$v"
}

ensure_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v curl >/dev/null || missing+=(curl)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" = 0 ] || die "needs ${missing[*]}: install them, or run as root to let apt-get do it"
    log "installing ${missing[*]}"
    timeout 300 apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

image_exists() { tpm 60 image exists "$1"; }

# debian:bookworm-slim's stand-in: a minbase debootstrap with the same apt sources.
base_image() {
    if image_exists "$BASE_IMAGE"; then
        log "$BASE_IMAGE present"
        return
    fi
    log "making $BASE_IMAGE with debootstrap (a few minutes)"
    local rootfs=$STATE/rootfs
    rm -rf "$rootfs"
    timeout 1200 debootstrap --variant=minbase "$DEBIAN_SUITE" "$rootfs" http://deb.debian.org/debian \
        >"$STATE/debootstrap.log" 2>&1 \
        || die "debootstrap failed: see $STATE/debootstrap.log"
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $DEBIAN_SUITE $DEBIAN_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $DEBIAN_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # As the official slim image: no docs or man pages from later installs, no package cache.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    echo 'Binary::apt::APT::Keep-Downloaded-Packages "false";' >"$rootfs/etc/apt/apt.conf.d/docker-clean"
    # This machine's local trust anchors (e.g. an egress proxy's CA, without which PyPI and
    # crates.io fail certificate verification): the ca-certificates package that the builder
    # installs adds them to the system store, as on the host.
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        mkdir -p "$rootfs/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    timeout 600 tar -C "$rootfs" -c . | tpm 600 import --quiet \
        --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null \
        || die "podman import of the debootstrap rootfs failed"
    rm -rf "$rootfs"
}

# rust:<version>-bookworm's stand-in: the base, the build packages of the official image that
# the build needs, and this machine's toolchain of that version (rustc, cargo, the std library;
# no docs), with rustup's proxies, at the official image's RUSTUP_HOME, CARGO_HOME and PATH.
rust_image() {
    local version image sysroot ctx
    version=$(rust_version)
    image=localhost/rust:$version-$DEBIAN_SUITE
    RUST_IMAGE=$image
    if image_exists "$image"; then
        log "$image present"
        return
    fi
    log "making $image from this machine's Rust $version toolchain"
    command -v rustup >/dev/null || die "rustup not found: the Rust image copies its $version toolchain"
    sysroot=$(rustup run "$version" rustc --print sysroot 2>/dev/null) \
        || die "no Rust $version toolchain here: rustup toolchain install $version"
    sysroot=$(cd "$sysroot" && pwd -P)
    ctx=$STATE/rust-context
    rm -rf "$ctx"
    mkdir -p "$ctx/rustup/toolchains/$version-x86_64-unknown-linux-gnu" "$ctx/cargo/bin"
    # Hard links where possible (same file system): the build context costs no copy.
    for d in bin lib libexec etc; do
        [ -d "$sysroot/$d" ] || continue
        cp -al "$sysroot/$d" "$ctx/rustup/toolchains/$version-x86_64-unknown-linux-gnu/" 2>/dev/null \
            || cp -a "$sysroot/$d" "$ctx/rustup/toolchains/$version-x86_64-unknown-linux-gnu/"
    done
    cp "$(command -v rustup)" "$ctx/cargo/bin/rustup"
    for p in cargo rustc rustdoc cargo-clippy cargo-fmt clippy-driver rustfmt rust-gdb rust-lldb; do
        ln -s rustup "$ctx/cargo/bin/$p"
    done
    cat >"$ctx/rustup/settings.toml" <<EOF
version = "12"
default_toolchain = "$version-x86_64-unknown-linux-gnu"
profile = "minimal"
auto_self_update = "disable"

[overrides]
EOF
    cat >"$ctx/Containerfile" <<EOF
FROM $BASE_IMAGE
RUN apt-get update \\
    && apt-get install -y --no-install-recommends ca-certificates curl git gcc g++ libc6-dev \\
        make pkg-config xz-utils \\
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$version
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN rustc --version && cargo --version
EOF
    tpm 1200 build --network host --layers=false --force-rm -t "$image" -f "$ctx/Containerfile" "$ctx" \
        >"$STATE/rust-image.log" 2>&1 \
        || die "building $image failed: see $STATE/rust-image.log"
    tail -n 3 "$STATE/rust-image.log" >&2
    rm -rf "$ctx"
}

# Builds of this script run one at a time (a lock in $STATE, held until the image is built;
# a `podman build` orphaned by a killed script inherits it), so that while one holds the
# lock, a build container of ours that exists is one a dead build left behind.
build_lock() {
    exec {BUILD_LOCK_FD}>"$STATE/build.lock"
    flock -w "$BUILD_TIMEOUT" "$BUILD_LOCK_FD" || die "another image build held $STATE/build.lock for ${BUILD_TIMEOUT}s"
}

# What earlier builds left that nothing uses: the stage containers of a build that failed or
# was killed by its timeout (under vfs each is a full copy of its image, over a GB for the
# Rust image's) and untagged images. Only containers of this script's images are removed.
reclaim() {
    local id image name ours
    ours=" $BASE_IMAGE localhost/rust:$(rust_version)-$DEBIAN_SUITE $SLUICE_IMAGE "
    while read -r id image name; do
        [ -n "$id" ] || continue
        case "$ours" in *" $image "*) ;; *) continue ;; esac
        log "removing $name ($image), left by an earlier build"
        tpm 300 rm -f "$id" >/dev/null || log "podman rm $name failed"
    done < <(tpm 60 ps --all --external --format '{{.ID}} {{.Image}} {{.Names}}' | grep -- '-working-container$' || true)
    tpm 300 image prune -f >/dev/null || true
}

# The build needs room where podman stores images and containers (vfs: a full copy per stage
# container and per image) and under /var/tmp (the Dockerfile's cargo caches): 5.6 GB at the
# peak of a cold build, measured (docs/testing.md). A disk that cannot hold it fails here, saying so,
# rather than halfway through the build.
check_space() {
    local root dir free need_kb=$((IMAGE_MIN_FREE_GB * 1024 * 1024))
    root=$(tpm 60 info --format '{{.Store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
    for dir in "$root" /var/tmp; do
        mkdir -p "$dir"
        free=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
        if [ "$free" -lt "$need_kb" ]; then
            df -h "$dir" >&2
            tpm 60 system df >&2 || true
            die "$dir has $((free / 1024 / 1024)) GB free; the image build needs ${IMAGE_MIN_FREE_GB} GB (IMAGE_MIN_FREE_GB): free some, e.g. with '$ROOT/scripts/test-image.sh clean all'"
        fi
    done
}

# The Dockerfile's image, as the README builds it, with the local base images.
image_build() {
    ensure_tools
    build_lock
    reclaim
    check_space
    base_image
    rust_image
    local args=(--build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "RUNTIME_IMAGE=$BASE_IMAGE"
        --build-arg "BAKE_MODEL=$BAKE_MODEL")
    [ -n "${TARGET_CPU:-}" ] && args+=(--build-arg "TARGET_CPU=$TARGET_CPU")
    log "building $SLUICE_IMAGE from $ROOT/Dockerfile (log: $STATE/build.log)"
    # --format docker: OCI image configs have no HEALTHCHECK, which podman would drop.
    # --layers=false: one container per stage instead of one vfs copy of the image per
    # instruction; --force-rm: those containers are removed when the build fails too. The
    # cargo registry and target directory are the Dockerfile's cache mounts, which podman keeps
    # between builds.
    if ! tpm "$BUILD_TIMEOUT" build --format docker --network host --layers=false --force-rm \
        -t "$SLUICE_IMAGE" \
        "${args[@]}" -f "$ROOT/Dockerfile" "$ROOT" >"$STATE/build.log" 2>&1; then
        tail -n 40 "$STATE/build.log" >&2
        die "building $SLUICE_IMAGE failed (or ran past ${BUILD_TIMEOUT}s): see $STATE/build.log"
    fi
    tail -n 3 "$STATE/build.log" >&2
    log "built $SLUICE_IMAGE ($(tpm 60 image inspect --format '{{.Size}}' "$SLUICE_IMAGE" | numfmt --to=iec))"
    # Closed once built: the containers started next (their conmon) would inherit the
    # descriptor and hold the lock for as long as they run.
    exec {BUILD_LOCK_FD}>&-
}

# containers_start N PORT [ARGS..]: N containers of $SLUICE_IMAGE, sluice-test-0 on host port
# PORT, sluice-test-1 on PORT+1, ...; ARGS replace the image's CMD (`serve`), e.g.
# `serve --max-num-seqs 8`. Each listens on the image's port 8000, published as
# $SLUICE_PUBLISH_ADDR:PORT (as `docker run -p PORT:8000`); with SLUICE_NETWORK=host they share
# the host's network instead, each on its own SLUICE_PORT.
containers_start() {
    local n=$1 port=$2 i
    shift 2
    image_exists "$SLUICE_IMAGE" || die "no image $SLUICE_IMAGE: run '$0 build' first"
    for ((i = 0; i < n; i++)); do
        local name=$CONTAINER_PREFIX$i p=$((port + i)) net
        if [ "$SLUICE_NETWORK" = host ]; then
            net=(--network host -e "SLUICE_PORT=$p")
        else
            net=(-p "$SLUICE_PUBLISH_ADDR:$p:8000")
        fi
        # KV-cache events: each container publishes on its 5557, seen from the host on
        # SLUICE_EVENTS_PORT + i, under its own topic (the routing check tells them apart).
        if [ -n "${SLUICE_EVENTS_PORT:-}" ]; then
            local ep=$((SLUICE_EVENTS_PORT + i))
            if [ "$SLUICE_NETWORK" = host ]; then
                net+=(-e "SLUICE_KV_EVENTS=tcp://*:$ep")
            else
                net+=(-p "$SLUICE_PUBLISH_ADDR:$ep:5557" -e "SLUICE_KV_EVENTS=tcp://*:5557")
            fi
            net+=(-e "SLUICE_KV_EVENTS_TOPIC=kv@$name@smollm2")
        fi
        local kv
        for kv in ${SLUICE_CONTAINER_ENV:-}; do
            net+=(-e "$kv")
        done
        tpm 60 rm -f --time 0 "$name" >/dev/null 2>&1 || true
        log "starting $name on port $p"
        # --no-healthcheck: podman runs HEALTHCHECKs from systemd timers, and without systemd
        # it logs errors (even with --health-interval disable); container_check runs the
        # image's HEALTHCHECK command itself.
        tpm 120 run -d --name "$name" "${net[@]}" --stop-timeout 40 --no-healthcheck \
            "$SLUICE_IMAGE" "$@" >/dev/null \
            || die "podman run $name failed"
    done
}

# container_check PORT [NAME]: from the host, /health turns 200 (within 180 s), a completion
# returns text, /metrics has sluice_ metrics.
container_check() {
    local port=$1 name=${2:-${CONTAINER_PREFIX}0} url="http://127.0.0.1:$1" deadline body
    deadline=$((SECONDS + 180))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/health")" = 200 ]; do
        if [ "$(tpm 30 inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
            tpm 30 logs "$name" 2>&1 | tail -n 20 >&2 || true
            die "$name is not running (it exited or never started) and $url/health did not answer 200"
        fi
        if [ $SECONDS -ge $deadline ]; then
            tpm 30 logs "$name" 2>&1 | tail -n 20 >&2 || true
            die "$url/health did not answer 200 within 180 s"
        fi
        sleep 1
    done
    log "GET $url/health: 200"
    # The image's HEALTHCHECK command (curl inside the container) passes too.
    local hc
    hc=$(tpm 30 image inspect --format '{{json .HealthCheck.Test}}' "$SLUICE_IMAGE")
    hc=$(printf '%s' "$hc" | python3 -c 'import json, sys; t = json.load(sys.stdin) or []; print("\n".join(t[1:]) if t[:1] == ["CMD"] else "")')
    [ -n "$hc" ] || die "$SLUICE_IMAGE has no HEALTHCHECK (an OCI-format build drops it: --format docker)"
    local -a hc_cmd
    mapfile -t hc_cmd <<<"$hc"
    tpm 30 exec "$name" "${hc_cmd[@]}" || die "the image's HEALTHCHECK failed in $name: ${hc_cmd[*]}"
    log "HEALTHCHECK in $name: healthy"
    body=$(curl -sS --fail-with-body --max-time 60 "$url/v1/completions" \
        -H 'Content-Type: application/json' \
        -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}') \
        || die "POST $url/v1/completions failed: $body"
    local text
    text=$(printf '%s' "$body" | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])') \
        || die "POST $url/v1/completions: not a completion: $body"
    [ -n "${text//[[:space:]]/}" ] || die "POST $url/v1/completions: empty text: $body"
    log "POST $url/v1/completions: 200, text: $(printf '%q' "$text")"
    body=$(curl -sS --fail-with-body --max-time 10 "$url/metrics") \
        || die "GET $url/metrics failed: $body"
    local count
    count=$(printf '%s\n' "$body" | grep -c '^sluice_' || true)
    [ "$count" -gt 0 ] || die "GET $url/metrics: no sluice_ metrics"
    # The completion is counted: sluice_http_requests_total{route="/v1/completions",status="200"}.
    printf '%s\n' "$body" | grep -q '^sluice_http_requests_total{.*route="/v1/completions".*status="200".*} [1-9]' \
        || die "GET $url/metrics: sluice_http_requests_total did not count the completion"
    # Engine series carry the served model's name: sluice_generation_tokens_total{model="..."}.
    printf '%s\n' "$body" | grep -q '^sluice_generation_tokens_total{[^}]*model="[^"]*"[^}]*} [1-9]' \
        || die "GET $url/metrics: sluice_generation_tokens_total did not count its tokens"
    log "GET $url/metrics: $count sluice_ samples"
}

# containers_stop: SIGTERM (sluice drains and exits 0; SIGKILL after 40 s) and remove every
# sluice-test-* container; fails when one did not exit 0.
containers_stop() {
    local name code rc=0
    for name in $(tpm 60 ps -a --format '{{.Names}}' | grep "^$CONTAINER_PREFIX" || true); do
        tpm 60 stop --time 40 "$name" >/dev/null || log "podman stop $name failed"
        code=$(tpm 30 inspect --format '{{.State.ExitCode}}' "$name" 2>/dev/null || echo '?')
        log "stopped $name: exit code $code"
        if [ "$code" != 0 ]; then
            tpm 30 logs "$name" 2>&1 | tail -n 20 >&2 || true
            rc=1
        fi
        tpm 60 rm -f "$name" >/dev/null || log "podman rm $name failed"
    done
    return $rc
}

image_clean() {
    if image_exists "$SLUICE_IMAGE"; then
        log "removing $SLUICE_IMAGE"
        tpm 300 rmi -f "$SLUICE_IMAGE" >/dev/null || log "podman rmi $SLUICE_IMAGE failed"
    fi
    # Images left untagged by rebuilds (each a full vfs copy).
    tpm 300 image prune -f >/dev/null || true
    if [ "${1:-}" = all ]; then
        local version
        version=$(rust_version)
        tpm 300 rmi -f "localhost/rust:$version-$DEBIAN_SUITE" "$BASE_IMAGE" >/dev/null 2>&1 || true
        # The Dockerfile's cache mounts (podman keeps them by target path).
        rm -rf /var/tmp/buildah-cache/src/target /var/tmp/buildah-cache/usr/local/cargo/registry \
            /var/tmp/buildah-cache/usr/local/cargo/git "$STATE"
    fi
}

# Two replicas of the image behind the KV-event routing simulation (tests/e2e/kv_routing.py,
# .venv from scripts/setup-e2e.sh): each publishes KV-cache events; the picker that routes by
# them must beat round-robin's prefix-cache hit rate on shared system prompts. Small KV caches
# (17 MiB, ~48 blocks) so that round-robin's spreading of every prompt evicts.
replicas_behind_router() {
    local port=$((SLUICE_TEST_PORT + 100)) events=$((SLUICE_TEST_PORT + 200)) i servers=()
    SLUICE_EVENTS_PORT=$events SLUICE_CONTAINER_ENV="SLUICE_KV_CACHE_MEMORY=17MiB" \
        containers_start 2 "$port"
    for i in 0 1; do
        container_check "$((port + i))" "$CONTAINER_PREFIX$i"
        servers+=(--external "http://127.0.0.1:$((port + i))=tcp://127.0.0.1:$((events + i))=kv@$CONTAINER_PREFIX$i@smollm2")
    done
    log "two replicas behind the prefix-aware picker and round-robin"
    timeout 600 "$ROOT/.venv/bin/python" "$ROOT/tests/e2e/kv_routing.py" "${servers[@]}" \
        --requests 48 --prompts 4 --clients 2 --max-tokens 4 --require-better \
        || die "routing by the replicas' KV events did not beat round-robin"
    containers_stop || die "a replica did not exit 0 on SIGTERM"
}

main() {
    case "${1:-all}" in
        build) image_build ;;
        start)
            [ $# -ge 3 ] || die "usage: $0 start N PORT [serve ARGS..]"
            shift
            containers_start "$@"
            ;;
        check) container_check "${2:?usage: $0 check PORT [NAME]}" "${3:-}" ;;
        stop) containers_stop ;;
        clean) image_clean "${2:-}" ;;
        all)
            local start=$SECONDS
            image_build
            trap 'containers_stop >/dev/null 2>&1 || true; [ "${KEEP_IMAGE:-0}" = 1 ] || image_clean' EXIT
            containers_start 1 "$SLUICE_TEST_PORT"
            container_check "$SLUICE_TEST_PORT"
            containers_stop || die "the container did not exit 0 on SIGTERM"
            replicas_behind_router
            log "the image passed in $((SECONDS - start)) s"
            ;;
        *) die "unknown command $1: build, start N PORT, check PORT, stop, clean [all] or nothing (all)" ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
