#!/usr/bin/env bash
# Installs what building and testing tessera needs that a fresh Debian machine
# lacks: protoc (prost-build and etcd-client generate code with it), etcd,
# Prometheus and VictoriaMetrics (integration tests run against the real
# servers), Chromium (the dashboard page is tested in a headless browser), e2fsprogs,
# losetup and fstrim (a failing disk under the ingester's queue is a loop device),
# Docker, docker-compose, jq and curl (the compose stack test), Python's venv
# (the Kubernetes manifests' test installs its validator in one), and
# carbon-cache, whisper-fetch and graphite-web (the Graphite target's tests), influxd (the
# InfluxDB target's), and
# starts the Docker daemon when it is installed but not running. Idempotent.
# The Kubernetes test also needs kubectl 1.22 or later (its built-in kustomize)
# or a standalone kustomize: Debian's kubernetes-client (1.20, kustomize v2) is
# too old, so this script does not install it.
set -euo pipefail

# `--build`: only what building needs (protoc), for running tessera.
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [ "${1:-}" != "--build" ]; then
    command -v etcd >/dev/null || need+=(etcd-server)
    command -v prometheus >/dev/null || need+=(prometheus)
    command -v promtool >/dev/null || need+=(prometheus)
    command -v victoria-metrics >/dev/null || need+=(victoria-metrics)
    command -v docker >/dev/null || need+=(docker.io)
    command -v docker-compose >/dev/null || need+=(docker-compose)
    command -v chromium >/dev/null || need+=(chromium)
    command -v mkfs.ext2 >/dev/null || need+=(e2fsprogs)
    command -v losetup >/dev/null || need+=(mount)
    command -v fstrim >/dev/null || need+=(util-linux)
    command -v jq >/dev/null || need+=(jq)
    command -v curl >/dev/null || need+=(curl)
    python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
    # The Graphite target's tests write to a real carbon-cache and read its
    # whisper files back with Debian's whisper-fetch.
    command -v carbon-cache >/dev/null || need+=(graphite-carbon)
    command -v whisper-fetch >/dev/null || need+=(python3-whisper)
    # Tagged series are read back through graphite-web's /render (seriesByTag).
    [ -e /usr/lib/python3/dist-packages/graphite/settings.py ] || need+=(graphite-web)
    # The InfluxDB target's tests write to a real InfluxDB 1.x.
    command -v influxd >/dev/null || need+=(influxdb)
fi

if ((${#need[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The compose test needs a running Docker daemon: start it when it is not up
# (systemd where there is one, else dockerd in the background).
if [ "${1:-}" != "--build" ] && ! docker info >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    echo "setup: starting the Docker daemon" >&2
    if ! $sudo service docker start >/dev/null 2>&1; then
        $sudo sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
    fi
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "setup: the Docker daemon did not start (see /var/log/dockerd.log)" >&2; exit 1; }
fi
