#!/usr/bin/env bash
# Timers through the whole pipeline into a real Prometheus, as native
# histograms or as summaries: what each costs the ingester and Prometheus,
# and whether every observation arrives.
#
# tessera-collector runs pinned to CPU 0; tessera-aggregator, tessera-ingester
# (remote write, `histograms = $HISTOGRAMS`), Prometheus (Debian's, with
# --enable-feature=native-histograms) and `tessera loadgen` share CPU 1.
# loadgen sends RATE timer lines/s over SERIES series for DURATION seconds;
# then the observations Prometheus holds at the 10 s resolution are counted
# (native: histogram_count, summary: _count) and compared with the lines sent.
#
#   benches/load/timers.sh RATE SERIES [DURATION_SECS]
#   HISTOGRAMS=native|summary|both (default native)
#
# Needs `sysctl -w net.core.rmem_max=33554432` for the 32 MiB receive buffer.
set -euo pipefail
cd "$(dirname "$0")/../.."

rate=${1:?rate in lines/s}
series=${2:?distinct series}
duration=${3:-20}
histograms=${HISTOGRAMS:-native}

. benches/load/lib.sh
need_binaries
make_work_dir
prometheus_port=$(free_port)
write_pipeline_configs 'policies = ["10s:2d"]'
write_ingester_config "[sink]
kind = \"remote_write\"
url = \"http://127.0.0.1:$prometheus_port/api/v1/write\"
histograms = \"$histograms\""
printf 'global:\n  scrape_interval: 1h\n' > "$work/prometheus.yml"

taskset -c 1 prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
    --web.listen-address="127.0.0.1:$prometheus_port" --web.enable-remote-write-receiver \
    --enable-feature=native-histograms --log.level=warn 2>"$work/prometheus.log" &
pids+=($!)
prometheus=$!
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$prometheus_port/-/ready" >/dev/null && break
    sleep 0.1
done
start_pipeline

# The single value of an instant query, or 0.
promql() {
    curl -sf "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1" |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
case $histograms in
    summary) stored_query='sum({__name__=~"loadgen_timer_[0-9]+_count"})' ;;
    *) stored_query='histogram_count(sum({__name__=~"loadgen_timer_[0-9]+",quantile=""}))' ;;
esac

ingester_before=$(cpu_ticks $ingester)
prometheus_before=$(cpu_ticks $prometheus)
report=$(taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --duration-secs "$duration" --series "$series" --mix timer=100 --json)
sent=$(echo "$report" | head -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
# Wait for the last tiles (10 s, then the watermark) to reach Prometheus.
stored=0
for _ in $(seq 60); do
    sleep 1
    stored=$(promql "$stored_query")
    [ "${stored%.*}" = "$sent" ] && break
done
ticks=$(getconf CLK_TCK)
ingester_cpu=$(echo "scale=1; ($(cpu_ticks $ingester) - $ingester_before) / $ticks" | bc)
prometheus_cpu=$(echo "scale=1; ($(cpu_ticks $prometheus) - $prometheus_before) / $ticks" | bc)
rss() { echo $(( $(peak_rss_kib "$1") / 1024 )); }
samples=$(metric_sum "$ingester_http" tessera_ingester_samples_written_total)

echo "histograms=$histograms rate=$rate series=$series duration=${duration}s sent=$sent stored=${stored%.*} lost=$((sent - ${stored%.*}))"
echo "  ingester: samples_written=$samples cpu=${ingester_cpu}s peak_rss=$(rss $ingester)MB queued_records=$(metric_sum "$ingester_http" tessera_ingester_queue_records) rejected_samples=$(metric_sum "$ingester_http" tessera_ingester_sink_rejected_samples_total) retries=$(metric_sum "$ingester_http" tessera_ingester_sink_retries_total)"
echo "  prometheus: cpu=${prometheus_cpu}s peak_rss=$(rss $prometheus)MB"
