#!/usr/bin/env bash
# Offline test of the Kubernetes manifests (no cluster, no network but PyPI):
#
# 1. renders the base and every overlay with `kubectl kustomize` (kustomize
#    built into kubectl; a standalone `kustomize` is used when there is one);
# 2. validates every rendered object with kubernetes-validate --strict (no
#    unknown field anywhere) against the two latest Kubernetes versions whose
#    schemas it bundles; an object of a kind it has no schema for fails too;
# 3. structural checks (check.py): headless Services of the StatefulSets,
#    probes on each daemon's telemetry port, memory requests and limits,
#    PodDisruptionBudgets that select something, references that resolve, and
#    a placement Job that writes where the daemons read;
# 4. gives every daemon config file of every ConfigMap to that daemon's
#    `--check-config`, with the environment its pod has (POD_NAME,
#    POD_NAMESPACE, NODE_NAME, NODE_IP), and once without POD_NAME, which must
#    then be refused: the daemon expands `${env:...}` itself;
# 5. runs each rendering's placement Job script against a real etcd (Debian's
#    etcd-server, on 127.0.0.1) with the Job's environment: it must write both
#    placements with as many instances as the StatefulSets have, and a second
#    run must keep them.
#
# PyYAML and kubernetes-validate are installed with pip into a venv kept in
# ${XDG_CACHE_HOME:-~/.cache}/tessera-k8s-venv. The daemons' binaries come from
# $BIN_DIR (default target/debug, relative to the repository root).
#
# Usage: BIN_DIR=target/debug deploy/kubernetes/test.sh
# It prints each check; the last line is "N passed, M failed", and the exit
# status is non-zero on any failure.
set -euo pipefail

kubernetes_dir=$(cd "$(dirname "$0")" && pwd)
repo_dir=$(cd "$kubernetes_dir/../.." && pwd)
cd "$repo_dir"
bin_dir=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
case $bin_dir in
    /*) bin_path=$bin_dir ;;
    *) bin_path=$repo_dir/$bin_dir ;;
esac
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tessera-k8s-venv
work=$(mktemp -d)
etcd_pid=""

cleanup() {
    if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
log() {
    echo "test-kubernetes: $*" >&2
}
pass() {
    echo "PASS $*"
    passed=$((passed + 1))
}
fail() {
    echo "FAIL $*"
    failed=$((failed + 1))
}
# Ends the test at once when what the rest needs is missing.
give_up() {
    log "$*"
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
}

# --- tools -------------------------------------------------------------------

if [ ! -x "$venv/bin/python" ]; then
    log "creating the venv $venv"
    python3 -m venv "$venv" || give_up "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
if ! "$venv/bin/python" -c 'import yaml, kubernetes_validate' 2>/dev/null; then
    log "pip install pyyaml kubernetes-validate"
    "$venv/bin/pip" install --quiet pyyaml kubernetes-validate || give_up "pip install failed"
fi
"$venv/bin/python" -c 'import tomllib' 2>/dev/null || give_up "the venv's Python has no tomllib (Python 3.11 or later needed)"

if command -v kustomize >/dev/null; then
    render() { kustomize build "$1"; }
    renderer="kustomize $(kustomize version 2>/dev/null | head -n 1)"
elif kubectl kustomize --help >/dev/null 2>&1; then
    render() { kubectl kustomize "$1"; }
    renderer="kubectl kustomize ($(kubectl version --client 2>/dev/null | grep -i kustomize || echo "kustomize version unknown"))"
else
    give_up "neither kustomize nor kubectl (which has kustomize built in) is installed"
fi

for daemon in tessera tessera-collector tessera-aggregator tessera-ingester; do
    [ -x "$bin_path/$daemon" ] || give_up "$bin_dir/$daemon is missing: run \`cargo build --bins\` (or set BIN_DIR)"
done

# The two latest Kubernetes versions kubernetes-validate has schemas for.
mapfile -t versions < <("$venv/bin/python" -c '
from packaging.version import Version
import kubernetes_validate.utils as utils
for version in sorted(set(utils.all_versions()), key=Version)[-2:]:
    print(version)')
((${#versions[@]} == 2)) || give_up "kubernetes-validate lists fewer than two Kubernetes versions"
version_flags=()
for version in "${versions[@]}"; do version_flags+=(-k "$version"); done

echo "renderer: $renderer"
echo "kubernetes-validate $("$venv/bin/kubernetes-validate" --version), Kubernetes ${versions[*]}"
echo "binaries: $bin_dir"

# --- render, validate, check -------------------------------------------------

targets=(base)
for overlay in "$kubernetes_dir"/overlays/*/; do
    targets+=("overlays/$(basename "$overlay")")
done

for target in "${targets[@]}"; do
    name=${target//\//-}
    rendered="$work/$name.yaml"
    echo
    echo "=== $target"
    if ! render "$kubernetes_dir/$target" >"$rendered" 2>"$work/$name.err"; then
        cat "$work/$name.err"
        fail "$target: rendering"
        continue
    fi
    objects=$(grep -c '^kind: ' "$rendered" || true)
    pass "$target: renders ($objects objects)"

    # --quiet prints only problems; a WARN is an object whose kind has no
    # schema, i.e. one that was not validated.
    if output=$("$venv/bin/kubernetes-validate" --strict --quiet "${version_flags[@]}" "$rendered" 2>&1) &&
        ! grep -q . <<<"$output"; then
        pass "$target: $objects objects valid (--strict) against Kubernetes ${versions[*]}"
    else
        echo "$output"
        fail "$target: kubernetes-validate --strict"
    fi

    files="$work/$name"
    if "$venv/bin/python" "$kubernetes_dir/check.py" "$rendered" "$files"; then
        pass "$target: structural checks"
    else
        fail "$target: structural checks"
    fi

    # Each daemon's config, with the environment of its pod; then without
    # POD_NAME, which the file names and the daemon must miss.
    for config in "$files"/*.toml; do
        [ -e "$config" ] || continue
        file=$(basename "$config")
        daemon=""
        case $file in
            collector*) daemon=collector ;;
            aggregator*) daemon=aggregator ;;
            ingester*) daemon=ingester ;;
            *) fail "$target: $file: no daemon reads a file of that name"; continue ;;
        esac
        pod_env=(POD_NAME="tessera-$daemon-0" POD_NAMESPACE=tessera NODE_NAME=node-1 NODE_IP=192.0.2.10)
        if output=$(env "${pod_env[@]}" "$bin_path/tessera-$daemon" --check-config --config "$config" 2>&1); then
            pass "$target: tessera-$daemon --check-config $file"
        else
            echo "$output"
            fail "$target: tessera-$daemon --check-config $file"
        fi
        if grep -q '^[^#]*\${env:POD_NAME}' "$config"; then
            output=$(env -u POD_NAME "${pod_env[@]:1}" "$bin_path/tessera-$daemon" --check-config --config "$config" 2>&1) && status=0 || status=$?
            if [ "$status" -eq 64 ] && grep -q 'POD_NAME' <<<"$output"; then
                pass "$target: tessera-$daemon refuses $file without POD_NAME"
            else
                echo "$output"
                fail "$target: tessera-$daemon without POD_NAME exited $status, not 64 naming POD_NAME (does it expand \${env:...}?)"
            fi
        fi
    done
done

# --- the placement Job's script against a real etcd --------------------------

echo
echo "=== the placement Job against etcd"
if ! command -v etcd >/dev/null; then
    fail "etcd not found: install etcd-server (scripts/setup.sh does)"
else
    etcd_port=$((23000 + RANDOM % 2000))
    etcd_url="http://127.0.0.1:$etcd_port"
    etcd --name test --data-dir "$work/etcd" \
        --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
        --listen-peer-urls "http://127.0.0.1:$((etcd_port + 2000))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 2000))" \
        --initial-cluster "test=http://127.0.0.1:$((etcd_port + 2000))" >"$work/etcd.log" 2>&1 &
    etcd_pid=$!
    export PATH="$bin_path:$PATH"
    for target in "${targets[@]}"; do
        name=${target//\//-}
        files="$work/$name"
        [ -f "$files/placement-init.sh" ] && [ -f "$files/placement-init.env" ] || continue
        # The Job's environment, with this etcd and an environment of its own
        # per rendering (so that each writes its first placements).
        mapfile -t job_env <"$files/placement-init.env"
        environment="test-$name"
        job_env+=(ETCD_ENDPOINTS="$etcd_url" TESSERA_ENVIRONMENT="$environment" POD_NAMESPACE=tessera ATTEMPTS=20)
        want_aggregators=$(sed -n 's/^AGGREGATORS=//p' "$files/placement-init.env")
        want_ingesters=$(sed -n 's/^INGESTERS=//p' "$files/placement-init.env")
        if env "${job_env[@]}" sh "$files/placement-init.sh" >"$work/$name-job.log" 2>&1; then
            aggregators=$(tessera placement show --etcd "$etcd_url" --environment "$environment" |
                grep -c '^tessera-aggregator-[0-9]* *tessera-aggregator-[0-9]*\.tessera-aggregator\.tessera\.svc:7400 ' || true)
            ingesters=$(tessera placement show --etcd "$etcd_url" --environment "$environment" --tier ingesters |
                grep -c '^tessera-ingester-[0-9]* *tessera-ingester-[0-9]*\.tessera-ingester\.tessera\.svc:7500 ' || true)
            if [ "$aggregators" = "$want_aggregators" ] && [ "$ingesters" = "$want_ingesters" ]; then
                pass "$target: the Job wrote $aggregators aggregators and $ingesters ingesters"
            else
                cat "$work/$name-job.log"
                fail "$target: the Job wrote $aggregators aggregators (want $want_aggregators) and $ingesters ingesters (want $want_ingesters)"
            fi
        else
            cat "$work/$name-job.log" "$work/etcd.log"
            fail "$target: the Job's script failed"
            continue
        fi
        if env "${job_env[@]}" sh "$files/placement-init.sh" >"$work/$name-rerun.log" 2>&1 &&
            grep -q "the aggregators' placement exists; keeping it" "$work/$name-rerun.log"; then
            pass "$target: the Job run again keeps the placements"
        else
            cat "$work/$name-rerun.log"
            fail "$target: the Job run again did not keep the placements"
        fi
    done
fi

echo
echo "$passed passed, $failed failed"
((failed == 0))
