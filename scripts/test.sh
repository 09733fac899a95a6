#!/usr/bin/env bash
# Runs every tessera test: unit, property, integration (against real etcd,
# Prometheus and VictoriaMetrics, installed here when absent), end to end
# (the real binaries), doc tests, the docker compose stack, and checks that
# the fuzz targets and benchmarks build.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

cargo build --workspace --all-targets
cargo build --manifest-path fuzz/Cargo.toml --bins
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast
else
    cargo test --workspace --all-targets --no-fail-fast
fi
cargo test --workspace --doc

# The docker compose stack, from images built here out of the debug binaries
# just built: statsd in, exact values out of Prometheus, dashboards' PromQL.
TESSERA_PROFILE=debug deploy/test-compose.sh --no-cargo
