#!/usr/bin/env bash
# Measures the whole pipeline as a user meets it: statsd in, counter totals
# out of the ingester's file sink.
#
# tessera-collector (one UDP reader) runs pinned to CPU 0; tessera-aggregator,
# tessera-ingester (file sink) and `tessera loadgen` share CPU 1. loadgen
# sends RATE lines/s for DURATION seconds and then, with `--verify`, reads the
# cumulative `loadgen_counter_*_total` series of the 10 s resolution back from
# the files: loss = lines sent - counter increase in the sink. Lossless means
# that is 0. End-to-end latency (tile end -> storage ack) p50/p99 comes from
# the ingester's own histogram; the aggregator's refusals and the collector's
# drops are printed beside it, by reason.
#
#   benches/load/pipeline.sh RATE SERIES [DURATION_SECS]
#   e.g. benches/load/pipeline.sh 1000000 1000000 10
#   MIX=counter=70,gauge=10,timer=10,set=5,distribution=5 TAGS=3 (default: counters only, no tags)
#   ORDER=random|zipf: the order loadgen sends the names in (default sequential, the
#   order the collector inserted them, which flatters its table); VALUES_PER_SERIES=N
#   (default 4): a random pass repeats the first pass's order (the insertion order) once
#   every N passes
#   READER_THREADS=N: the collector's UDP reader threads (default 1; its own default is one per core)
#   MERGE_THREADS=N (default: the aggregator's default, the cores available)
#   PROFILE_HZ=99: take a CPU profile of the collector at that frequency for
#   the whole run (/debug/pprof/profile), to measure what profiling costs
#   LIMIT=1: a catch-all [[rules.limit]] in the collector (every series under a limit)
#   WIRE_TLS=1: mutual TLS on both wire links (collector -> aggregator -> ingester),
#   certificates made with openssl for the run
#   ORIGIN=1: loadgen sends over the collector's Unix socket from a process a fake /proc
#   puts in a pod's container, and origin detection (a fake kubelet) tags every line with
#   six tags; ORIGIN=0 sends over the same socket with origin detection off (the pair to
#   compare with); unset, UDP as above
#
# Needs `sysctl -w net.core.rmem_max=33554432` for the 32 MiB receive buffer.
# For intake alone (the collector forwarding to a closed port), see collector.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

rate=${1:?rate in lines/s}
series=${2:?distinct series}
duration=${3:-10}
mix=${MIX:-counter=100}
tags=${TAGS:-0}
order=${ORDER:-sequential}
values_per_series=${VALUES_PER_SERIES:-4}

. benches/load/lib.sh
need_binaries
make_work_dir
merge_threads_line=""
[ -n "${MERGE_THREADS:-}" ] && merge_threads_line="merge_threads = $MERGE_THREADS"
write_pipeline_configs "$merge_threads_line"
write_ingester_config $'[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
mkdir -p "$work/sink"
target=(--target "127.0.0.1:$udp_port")
sender=()
if [ -n "${ORIGIN:-}" ]; then
    target=(--unix "$work/statsd.sock")
    printf '[unix]\npath = "%s"\n' "$work/statsd.sock" >> "$work/collector.toml"
    if [ "$ORIGIN" = 1 ]; then
        start_fake_kubelet
        printf '%s\n' "$origin_config" >> "$work/collector.toml"
        sender=(in_fake_container)
    fi
fi
start_pipeline

# Non-zero samples of a metric family, `labels=value` joined by spaces.
nonzero() {
    curl -sf "http://127.0.0.1:$1/metrics" | awk -v name="$2" '
        index($0, name) == 1 && $NF != 0 { sub(name, "", $1); printf "%s=%s ", $1, $NF }'
}
# p-quantile of the ingester's end-to-end histogram at the 10 s resolution.
quantile() {
    curl -sf "http://127.0.0.1:$ingester_http/metrics" | python3 -c '
import sys, re
q = float(sys.argv[1]); buckets = []
for line in sys.stdin:
    m = re.match(r"tessera_ingester_end_to_end_latency_seconds_bucket\{(.*)\} (\S+)", line)
    if m and "resolution=\"10s\"" in m.group(1):
        le = re.search(r"le=\"([^\"]+)\"", m.group(1)).group(1)
        buckets.append((float("inf") if le == "+Inf" else float(le), float(m.group(2))))
buckets.sort()
total = buckets[-1][1] if buckets else 0
if total == 0:
    print("n/a"); sys.exit()
for le, count in buckets:
    if count >= q * total:
        print(f"<= {le:g} s"); break
' "$1"
}

collector_before=$(cpu_ticks $collector)
aggregator_before=$(cpu_ticks $aggregator)

start_profile "$collector_http" "$duration" "$work/profile.pb.gz"
set +e
report=$("${sender[@]}" taskset -c 1 "$bin/tessera" loadgen "${target[@]}" --rate-lines-per-sec "$rate" \
    --duration-secs "$duration" --series "$series" --mix "$mix" --tags "$tags" --order "$order" --values-per-series "$values_per_series" --json \
    --verify "files=$work/sink" --verify-timeout-secs 60)
set -e
ticks=$(getconf CLK_TCK)
# CPU seconds over the whole run (sending, draining, verifying).
collector_cpu=$(echo "scale=1; ($(cpu_ticks $collector) - $collector_before) / $ticks" | bc)
aggregator_cpu=$(echo "scale=1; ($(cpu_ticks $aggregator) - $aggregator_before) / $ticks" | bc)
sent=$(echo "$report" | head -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
achieved=$(echo "$report" | head -1 | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["lines_per_sec"]))')
verdict=$(echo "$report" | tail -1)
rss() { echo $(( $(peak_rss_kib "$1") / 1024 )); }

echo "order=$order rate=$rate achieved=$achieved series=$series mix=$mix tags=$tags duration=${duration}s sent=$sent"
echo "  $verdict"
echo "  end_to_end_10s p50 $(quantile 0.5) p99 $(quantile 0.99)"
finish_profile "$work/profile.pb.gz"
echo "  collector: kernel_drops=$(metric_sum $collector_http tessera_collector_kernel_drops_total) drops: $(nonzero $collector_http tessera_collector_drops_total) cpu=${collector_cpu}s peak_rss=$(rss $collector)MB$profile_note"
echo "  aggregator: merged=$(metric_sum $aggregator_http tessera_aggregator_partials_merged_total) refused: $(nonzero $aggregator_http tessera_aggregator_partials_rejected_total) cpu=${aggregator_cpu}s peak_rss=$(rss $aggregator)MB"
if [ "${ORIGIN:-}" = 1 ]; then
    echo "  origin: tagged_lines=$(metric_sum $collector_http tessera_collector_origin_tagged_lines_total) untagged: $(nonzero $collector_http tessera_collector_origin_untagged_total)"
fi
