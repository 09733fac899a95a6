#!/usr/bin/env bash
# A cardinality bomb against the memory budgets: the whole pipeline (collector, aggregator,
# ingester with the file sink), each daemon with a `memory_limit`; a steady workload of
# 10 000 counter series at 10 000 lines/s for the whole run, verified exact at the end; and,
# from 10 s in, BOMB new gauge series sent once each at BOMB_RATE lines/s. Reports each
# daemon's RSS every 5 s and at its peak beside its budget, and what each daemon shed.
#
#   benches/load/bomb.sh [BOMB_SERIES] [BOMB_RATE] [COLLECTOR_MIB AGGREGATOR_MIB INGESTER_MIB]
#   e.g. benches/load/bomb.sh 5000000 100000 256 512 512
#
# BUDGETS=0 runs the same without any budget, for comparison. MEMORY_CGROUPS=1 runs each
# daemon in a cgroup v1 memory cgroup with those limits (the kernel's hard limit) and
# `memory_limit = "100%"` (the daemon reads its budget from its cgroup); needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."

bomb=${1:-5000000}
bomb_rate=${2:-100000}
collector_mib=${3:-256}
aggregator_mib=${4:-512}
ingester_mib=${5:-512}
bomb_secs=$(( (bomb + bomb_rate - 1) / bomb_rate ))
steady_secs=$(( bomb_secs + 30 ))

. benches/load/lib.sh
need_binaries
make_work_dir
write_pipeline_configs ""
write_ingester_config $'[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
set_memory_budgets "$collector_mib" "$aggregator_mib" "$ingester_mib"
mkdir -p "$work/sink"
start_pipeline

rss_mb() { echo $(( $(awk '/^VmRSS/ {print $2}' /proc/$1/status) / 1024 )); }
sample() { echo "  t=$1s collector=$(rss_mb $collector)MB aggregator=$(rss_mb $aggregator)MB ingester=$(rss_mb $ingester)MB"; }

taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec 10000 \
    --duration-secs "$steady_secs" --series 10000 --verify "files=$work/sink" --verify-timeout-secs 60 \
    > "$work/steady.txt" &
steady=$!
pids+=("$steady")
sleep 10
sample 10
echo "bomb: $bomb new gauge series at $bomb_rate lines/s (${bomb_secs}s); steady: 10 000 counters at 10 000 lines/s for ${steady_secs}s"
taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$bomb_rate" \
    --total-lines "$bomb" --series "$bomb" --series-offset 1000000000 --mix gauge=100 >/dev/null &
bomber=$!
pids+=("$bomber")
t=10
while kill -0 "$steady" 2>/dev/null; do
    sleep 5
    t=$((t + 5))
    sample "$t"
done
wait "$steady" || true
tail -1 "$work/steady.txt" | sed 's/^/  steady: /'
echo "  peak: collector=$(( $(peak_rss_kib $collector) / 1024 ))MB aggregator=$(( $(peak_rss_kib $aggregator) / 1024 ))MB ingester=$(( $(peak_rss_kib $ingester) / 1024 ))MB"
echo "  shed: collector lines=$(metric_sum "$collector_http" tessera_collector_drops_total 'reason="memory_limit"') aggregator series=$(metric_sum "$aggregator_http" tessera_aggregator_drops_total 'reason="memory_limit"') ingester totals evicted=$(metric_sum "$ingester_http" tessera_ingester_totals_evicted_total)"
for daemon in collector aggregator ingester; do
    [ "${MEMORY_CGROUPS:-0}" = 1 ] && echo "  $(cgroup_report $daemon)"
    kill -0 "${!daemon}" 2>/dev/null || echo "  $daemon is gone: $(tail -2 "$work/$daemon.log")"
done
echo "  budgets read: collector $(metric_sum "$collector_http" tessera_collector_memory_limit_bytes) aggregator $(metric_sum "$aggregator_http" tessera_aggregator_memory_limit_bytes) ingester $(metric_sum "$ingester_http" tessera_ingester_memory_limit_bytes) bytes"
echo "  collector series_limit drops=$(metric_sum "$collector_http" tessera_collector_drops_total 'reason="series_limit"') kernel_drops=$(metric_sum "$collector_http" tessera_collector_kernel_drops_total)"
