#!/usr/bin/env bash
# Series churn in waves, as issue 37 measured it: the whole pipeline (collector, aggregator,
# ingester with the file sink) on its defaults (the collector keeps idle series for 5 min, the
# ingester its totals for an hour), WAVES waves of SERIES new counter series each
# (`loadgen --series SERIES --series-offset k*SERIES`, RATE lines/s for 12 s), 15 s apart;
# each daemon's RSS after each wave, its peak, and what each one shed.
#
#   benches/load/waves.sh [WAVES] [SERIES] [RATE] [COLLECTOR_MIB AGGREGATOR_MIB INGESTER_MIB]
#   e.g. benches/load/waves.sh 4 1000000 500000 256 512 512
#
# BUDGETS=0 runs without budgets (the issue's table); MEMORY_CGROUPS=1 puts each daemon in a
# cgroup v1 memory cgroup with those limits and `memory_limit = "100%"` (needs root).
set -euo pipefail
cd "$(dirname "$0")/../.."

waves=${1:-4}
series=${2:-1000000}
rate=${3:-500000}
collector_mib=${4:-256}
aggregator_mib=${5:-512}
ingester_mib=${6:-512}

. benches/load/lib.sh
need_binaries
make_work_dir
write_pipeline_configs ""
write_ingester_config $'[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
set_memory_budgets "$collector_mib" "$aggregator_mib" "$ingester_mib"
mkdir -p "$work/sink"
start_pipeline

rss_mib() { echo $(( $(awk '/^VmRSS/ {print $2}' /proc/$1/status) / 1024 )); }
shed() {
    echo "shed: collector lines $(metric_sum "$collector_http" tessera_collector_drops_total 'reason="memory_limit"'), aggregator series $(metric_sum "$aggregator_http" tessera_aggregator_drops_total 'reason="memory_limit"'), ingester totals evicted $(metric_sum "$ingester_http" tessera_ingester_totals_evicted_total)"
}
echo "| distinct series so far | collector | aggregator | ingester | $(shed | cut -d: -f1) |"
for wave in $(seq 0 $((waves - 1))); do
    taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
        --duration-secs 12 --series "$series" --series-offset $((wave * series)) >/dev/null
    sleep 15
    echo "| $(( (wave + 1) * series )) | $(rss_mib $collector) MiB | $(rss_mib $aggregator) MiB | $(rss_mib $ingester) MiB | $(shed | cut -d: -f2) |"
done
echo "peak: collector $(( $(peak_rss_kib $collector) / 1024 )) MiB, aggregator $(( $(peak_rss_kib $aggregator) / 1024 )) MiB, ingester $(( $(peak_rss_kib $ingester) / 1024 )) MiB"
for daemon in collector aggregator ingester; do
    [ "${MEMORY_CGROUPS:-0}" = 1 ] && cgroup_report $daemon
    kill -0 "${!daemon}" 2>/dev/null || echo "$daemon is gone: $(tail -2 "$work/$daemon.log")"
done
echo "collector kernel drops $(metric_sum "$collector_http" tessera_collector_kernel_drops_total), lines received $(metric_sum "$collector_http" tessera_collector_lines_received_total 'listener="udp"') of $((waves * rate * 12))"
