#!/usr/bin/env bash
# What origin detection costs: the collector's intake over its Unix datagram socket with
# `[origin]` off and on, alternating in one run (ROUNDS pairs).
#
# The collector runs pinned to CPU 0 with its Unix socket only; `tessera loadgen --unix`
# runs pinned to CPU 1 and sends exactly LINES counter lines flat out (a Unix datagram
# socket blocks its sender when full, so nothing is lost: the rate is the figure). With
# origin detection on, the collector reads the sender's PID from each datagram, finds it
# in a fake /proc as the `app` container of the recorded kubelet pod list
# (crates/collector/tests/data/kubelet-pods.json, served by python3 http.server as the
# kubelet), and tags every line with that container's six low-cardinality tags, so every
# line takes the full parser and a longer series id. Forwarding goes to a closed port
# (queued and dropped, counted): this is the intake stage alone.
#
#   benches/load/origin.sh [LINES] [SERIES] [ROUNDS]
#   e.g. benches/load/origin.sh 20000000 10000 3
#   COLLECTOR_BEFORE=/path/to/an/older/tessera-collector: each round also runs that binary
#   with origin detection on, between the two runs of this one (a before/after alternated)
set -euo pipefail
cd "$(dirname "$0")/../.."

lines=${1:-20000000}
series=${2:-10000}
rounds=${3:-3}

. benches/load/lib.sh
need_binaries
make_work_dir

start_fake_kubelet

run() {
    local mode=$1 binary=${2:-$bin/tessera-collector} label=${3:-} http_port socket collector
    http_port=$(free_port)
    socket="$work/statsd-$mode.sock"
    cat > "$work/collector-$mode.toml" <<TOML
[udp]
enabled = false
[unix]
path = "$socket"
[telemetry]
listen = "127.0.0.1:$http_port"
[placement]
kind = "static"
path = "$work/placement.toml"
TOML
    if [ "$mode" = on ]; then
        printf '%s\n' "$origin_config" >> "$work/collector-$mode.toml"
    fi
    taskset -c 0 "$binary" --config "$work/collector-$mode.toml" --log-level error \
        2>"$work/collector-$mode.log" &
    collector=$!
    wait_ready "$http_port"
    local cpu_before start report received previous elapsed cpu
    cpu_before=$(cpu_ticks $collector)
    start=$(date +%s.%N)
    report=$(in_fake_container taskset -c 1 "$bin/tessera" loadgen --unix "$socket" --total-lines "$lines" \
        --series "$series" --mix counter=100 --json)
    previous=-1
    while true; do
        received=$(metric_sum "$http_port" tessera_collector_lines_received_total 'listener="unix"')
        [ "$received" = "$previous" ] && [ "$received" -ge "$lines" ] && break
        previous=$received
        sleep 0.2
    done
    elapsed=$(echo "$(date +%s.%N) - $start" | bc)
    cpu=$(echo "scale=1; ($(cpu_ticks $collector) - $cpu_before) / $(getconf CLK_TCK) / $elapsed * 100" | bc)
    local tagged untagged
    tagged=$(metric_sum "$http_port" tessera_collector_origin_tagged_lines_total)
    untagged=$(metric_sum "$http_port" tessera_collector_origin_untagged_total)
    printf 'origin %-3s%s lines=%s received=%s lines_per_sec=%.0f collector_cpu=%s%% tagged=%s untagged=%s peak_rss_kib=%s\n' \
        "$mode" "$label" "$lines" "$received" "$(echo "$received / $elapsed" | bc -l)" "$cpu" "${tagged:-0}" "${untagged:-0}" \
        "$(peak_rss_kib $collector)"
    kill $collector
    wait $collector 2>/dev/null || true
}

printf 'num_shards = 64\n[[instances]]\nid = "aggregator"\nendpoint = "127.0.0.1:9"\n' > "$work/placement.toml"
for round in $(seq "$rounds"); do
    run off
    if [ -n "${COLLECTOR_BEFORE:-}" ]; then
        run on "$COLLECTOR_BEFORE" " (before)"
    fi
    run on
done
