#!/usr/bin/env bash
# Measures the ingester tier scaled out: the whole pipeline (collector,
# aggregator, N ingesters sharing an ingesters' placement in a real etcd)
# with `tessera loadgen` sending counters, into the file sink or a real
# Prometheus. Reports, per ingester, the samples it wrote, the CPU it used and
# CPU per sample; the total samples/s; and the loss loadgen reads back.
#
#   benches/load/ingesters.sh N SINK [RATE] [SERIES] [DURATION_SECS]
#   e.g. benches/load/ingesters.sh 3 files 200000 100000 20
#   SINK: files | prometheus
#   FAILOVER=1: also SIGKILL one ingester after the run's first third and
#   report the failover time (kill -> the survivors own every shard ->
#   they write the adopted series); TTL_SECS sets the lease TTL (default 10).
#
# Everything shares the machine's cores (no pinning: N ingesters on 2 cores
# compete with the rest), so the figure that carries over to bigger hosts is
# CPU per sample per ingester; compare runs of one session, alternating N.
set -euo pipefail
cd "$(dirname "$0")/../.."

count=${1:?number of ingesters}
sink=${2:?files or prometheus}
rate=${3:-200000}
series=${4:-100000}
duration=${5:-20}
ttl=${TTL_SECS:-10}

. benches/load/lib.sh
need_binaries
make_work_dir

etcd_port=$(free_port)
etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$(free_port)" \
    >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$etcd_port/health" >/dev/null && break; sleep 0.1; done

sink_lines=""
verify=""
if [ "$sink" = prometheus ]; then
    prometheus_port=$(free_port)
    printf 'global:\n  scrape_interval: 1h\nstorage:\n  tsdb:\n    out_of_order_time_window: 30m\n' >"$work/prometheus.yml"
    prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
        --web.listen-address="127.0.0.1:$prometheus_port" --web.enable-remote-write-receiver \
        --enable-feature=native-histograms >"$work/prometheus.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$prometheus_port/-/ready" >/dev/null && break; sleep 0.1; done
    sink_lines=$'kind = "remote_write"\n'"url = \"http://127.0.0.1:$prometheus_port/api/v1/write\""
    verify="prometheus=http://127.0.0.1:$prometheus_port"
else
    mkdir -p "$work/sink"
    verify="files=$work/sink"
fi

write_pipeline_configs ""
# The aggregator routes by the ingesters' placement instead of one endpoint.
sed -i '/^\[ingester\]$/,/^endpoints/d' "$work/aggregator.toml"
cat >>"$work/aggregator.toml" <<TOML
[ingester.placement]
kind = "etcd"
endpoints = ["http://127.0.0.1:$etcd_port"]
env = "bench"
TOML

instances=()
ingester_ports=()
ingester_https=()
for index in $(seq "$count"); do
    port=$(free_port)
    http=$(free_port)
    ingester_ports+=("$port")
    ingester_https+=("$http")
    instances+=(--instance "ing-$index=127.0.0.1:$port")
    file_lines=""
    if [ "$sink" = files ]; then
        file_lines=$'kind = "file"\n'"dir = \"$work/sink/ing-$index\""$'\nrotate_secs = 2'
        mkdir -p "$work/sink/ing-$index"
    fi
    cat >"$work/ingester-$index.toml" <<TOML
instance_id = "ing-$index"
listen = "127.0.0.1:$port"
data_dir = "$work/ingester-$index"
[sink]
${sink_lines}${file_lines}
[telemetry]
listen = "127.0.0.1:$http"
[placement]
liveness_ttl_secs = $ttl
[placement.etcd]
endpoints = ["http://127.0.0.1:$etcd_port"]
env = "bench"
TOML
done
"$bin/tessera" placement --etcd "http://127.0.0.1:$etcd_port" --environment bench --tier ingesters init \
    --shards 64 "${instances[@]}" >/dev/null

ingester_pids=()
for index in $(seq "$count"); do
    "$bin/tessera-ingester" --config "$work/ingester-$index.toml" --log-level warn 2>"$work/ingester-$index.log" &
    pids+=($!)
    ingester_pids+=($!)
done
"$bin/tessera-aggregator" --config "$work/aggregator.toml" --log-level warn 2>"$work/aggregator.log" &
pids+=($!)
aggregator=$!
"$bin/tessera-collector" --config "$work/collector.toml" --log-level warn 2>"$work/collector.log" &
pids+=($!)
for port in "${ingester_https[@]}" "$aggregator_http" "$collector_http"; do wait_ready "$port"; done

before=()
for pid in "${ingester_pids[@]}"; do before+=("$(cpu_ticks "$pid")"); done
aggregator_before=$(cpu_ticks $aggregator)

failover_report=""
if [ -n "${FAILOVER:-}" ]; then
    (
        sleep $((duration / 3))
        victim=${ingester_pids[$((count - 1))]}
        kill -9 "$victim"
        killed=$(date +%s.%N)
        # The sum of a metric over the surviving ingesters.
        survivors_sum() {
            local sum=0 index
            for index in $(seq $((count - 1))); do
                sum=$((sum + $(metric_sum "${ingester_https[$((index - 1))]}" "$1")))
            done
            echo "$sum"
        }
        until [ "$(survivors_sum tessera_ingester_owned_shards)" = 64 ]; do sleep 0.05; done
        owned=$(date +%s.%N)
        until [ "$(survivors_sum tessera_ingester_series_adopted_total)" != 0 ]; do sleep 0.05; done
        writing=$(date +%s.%N)
        echo "failover (TTL ${ttl}s): survivors own every shard after $(echo "$owned - $killed" | bc) s, write adopted series after $(echo "$writing - $killed" | bc) s" \
            >"$work/failover.txt"
    ) &
    failover_watch=$!
fi

set +e
report=$("$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --duration-secs "$duration" --series "$series" --mix counter=100 --json \
    --verify "$verify" --verify-timeout-secs 90)
set -e
if [ -n "${FAILOVER:-}" ]; then
    wait "$failover_watch" || true
    failover_report=$(cat "$work/failover.txt" 2>/dev/null || echo "failover: not observed")
fi
ticks=$(getconf CLK_TCK)
sent=$(echo "$report" | head -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
verdict=$(echo "$report" | tail -1)
echo "ingesters=$count sink=$sink rate=$rate series=$series duration=${duration}s sent=$sent"
echo "  $verdict"
[ -n "$failover_report" ] && echo "  $failover_report"
total_samples=0
for index in $(seq "$count"); do
    pid=${ingester_pids[$((index - 1))]}
    http=${ingester_https[$((index - 1))]}
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "  ing-$index: killed"
        continue
    fi
    samples=$(metric_sum "$http" tessera_ingester_samples_written_total)
    cpu=$(echo "scale=2; ($(cpu_ticks "$pid") - ${before[$((index - 1))]}) / $ticks" | bc)
    per_sample="n/a"
    [ "$samples" != 0 ] && per_sample="$(echo "scale=2; $cpu * 1000000 / $samples" | bc) µs"
    total_samples=$((total_samples + samples))
    echo "  ing-$index: samples=$samples cpu=${cpu}s cpu_per_sample=$per_sample owned_shards=$(metric_sum "$http" tessera_ingester_owned_shards) peak_rss=$(( $(peak_rss_kib "$pid") / 1024 ))MB"
done
aggregator_cpu=$(echo "scale=1; ($(cpu_ticks $aggregator) - $aggregator_before) / $ticks" | bc)
echo "  all ingesters: samples=$total_samples ($(echo "$total_samples / $duration" | bc) samples/s over the send)"
echo "  aggregator: cpu=${aggregator_cpu}s rerouted=$(metric_sum "$aggregator_http" tessera_aggregator_rerouted_total 'unit="series"') drops=$(metric_sum "$aggregator_http" tessera_aggregator_drops_total)"
