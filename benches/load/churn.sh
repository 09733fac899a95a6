#!/usr/bin/env bash
# Series churn: the whole pipeline (collector, aggregator, ingester with the file sink), a
# wave of SERIES new counter series (sent once each at RATE lines/s), then a steady
# 10 000-series workload for HOLD seconds; each daemon's RSS every 5 s. Shows whether a
# burst of series that then go idle gives its memory back, and when.
#
#   benches/load/churn.sh SERIES [RATE] [HOLD_SECS] [IDLE_SECS]
#   e.g. benches/load/churn.sh 1000000 500000 60 20
#
# IDLE_SECS is the collector's `expire_after_idle_secs` (default 300 in the daemon; a short
# one here, so that the burst expires within the run).
set -euo pipefail
cd "$(dirname "$0")/../.."

series=${1:?distinct series in the wave}
rate=${2:-500000}
hold=${3:-60}
idle=${4:-20}

. benches/load/lib.sh
need_binaries
make_work_dir
write_pipeline_configs ""
printf '[aggregation]\nexpire_after_idle_secs = %s\n' "$idle" >> "$work/collector.toml"
write_ingester_config $'[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
mkdir -p "$work/sink"
start_pipeline

rss_mb() { echo $(( $(awk '/^VmRSS/ {print $2}' /proc/$1/status) / 1024 )); }
sample() { echo "  t=$1s collector=$(rss_mb $collector)MB aggregator=$(rss_mb $aggregator)MB ingester=$(rss_mb $ingester)MB"; }

sample 0
taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --total-lines "$series" --series "$series" --series-offset 1000000000 >/dev/null
echo "wave of $series new series sent at $rate lines/s; steady 10 000 series at 10 000 lines/s for ${hold}s (collector expire_after_idle_secs = $idle)"
taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec 10000 \
    --duration-secs "$hold" --series 10000 >/dev/null &
steady=$!
pids+=("$steady")
for t in $(seq 5 5 "$hold"); do
    sleep 5
    sample "$t"
done
wait "$steady" || true
echo "  peak: collector=$(( $(peak_rss_kib $collector) / 1024 ))MB aggregator=$(( $(peak_rss_kib $aggregator) / 1024 ))MB ingester=$(( $(peak_rss_kib $ingester) / 1024 ))MB"
