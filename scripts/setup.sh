#!/usr/bin/env bash
# Installs what building and testing tessera needs that a fresh Debian machine
# lacks: protoc (prost-build and etcd-client generate code with it), etcd and
# Prometheus (integration tests run against the real servers). Idempotent.
set -euo pipefail

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v etcd >/dev/null || need+=(etcd-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)

if ((${#need[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
