#!/usr/bin/env bash
# Runs every tessera test: unit, property, integration (against real etcd,
# Prometheus and VictoriaMetrics, installed here when absent), end to end
# (the real binaries), doc tests, the docker compose stack, and checks that
# the fuzz targets and benchmarks build, and a 90-second soak.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

# The fuzz targets are workspace members: this builds them too (with the shared target dir).
cargo build --workspace --all-targets
# The fault campaign's tests run after the rest, one at a time: each runs a whole
# cluster (and one a busy neighbour), which would starve the timing of the others.
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast -E 'not (package(tessera-chaos) & binary(campaign))'
    # `--workspace` with a filter, not `-p`: the same features as above, so nothing is rebuilt.
    cargo nextest run --workspace -E 'package(tessera-chaos) & binary(campaign)' --test-threads 1 --no-fail-fast
else
    cargo test --workspace --all-targets --no-fail-fast -- --skip the_replica_kill_scenario
    cargo test -p tessera-chaos --test campaign -- --test-threads 1
fi
cargo test --workspace --doc

# The docker compose stack, from images built here out of the debug binaries
# just built: statsd in, exact values out of Prometheus, dashboards' PromQL.
TESSERA_PROFILE=debug deploy/test-compose.sh --no-cargo

# The Kubernetes manifests, offline: rendered with kubectl's kustomize,
# validated against the Kubernetes schemas (kubernetes-validate, from PyPI into
# a cached venv), structural checks, each ConfigMap's file through its daemon's
# --check-config, and the placement Job's script against a real etcd.
BIN_DIR=target/debug deploy/kubernetes/test.sh

# A 90-second soak of the debug binaries with churning series (a tenth of the
# series new at the minute): no loss, and no daemon's RSS above the bound.
# The 30-minute version and its figures: BENCHMARKS.md, "Soak".
BIN_DIR=target/debug RSS_LIMIT_MB=150 benches/load/soak.sh 90 20000 5000
