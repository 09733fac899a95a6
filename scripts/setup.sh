#!/usr/bin/env bash
# Installs what building and testing tessera needs that a fresh Debian machine
# lacks: protoc (prost-build and etcd-client generate code with it), etcd,
# Prometheus and VictoriaMetrics (integration tests run against the real
# servers), docker-compose, jq and curl (the compose stack test). Idempotent.
set -euo pipefail

# `--build`: only what building needs (protoc), for running tessera.
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [ "${1:-}" != "--build" ]; then
    command -v etcd >/dev/null || need+=(etcd-server)
    command -v prometheus >/dev/null || need+=(prometheus)
    command -v promtool >/dev/null || need+=(prometheus)
    command -v victoria-metrics >/dev/null || need+=(victoria-metrics)
    command -v docker-compose >/dev/null || need+=(docker-compose)
    command -v jq >/dev/null || need+=(jq)
    command -v curl >/dev/null || need+=(curl)
fi

if ((${#need[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
