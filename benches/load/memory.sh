#!/usr/bin/env bash
# Memory per series: the whole pipeline (collector, aggregator, ingester with the file sink),
# SERIES series of one metric type sent at RATE lines/s for SECS seconds (every series
# several times a window once RATE * 1 s passes SERIES), then each daemon's peak RSS, its
# RSS before the load, and the difference per series.
#
#   benches/load/memory.sh SERIES [MIX] [RATE] [SECS]
#   e.g. benches/load/memory.sh 1000000 counter=100 2000000 15
#        benches/load/memory.sh 10000 timer=100 200000 15
#
# MIX is loadgen's `--mix` (counter=100, gauge=100, timer=100, set=100, ...). The collector
# runs with its defaults (one reader thread in the load scripts' config) on CPU 0, the rest
# on CPU 1. The bytes per series divide the growth of the peak over the idle daemon by the
# series: they include every copy the pipeline keeps of a series (tables, window cuts,
# encoded partials in flight, the rules' cache), and the allocator's slack.
set -euo pipefail
cd "$(dirname "$0")/../.."

series=${1:?distinct series}
mix=${2:-counter=100}
rate=${3:-$(( series * 2 > 2000000 ? 2000000 : series * 2 ))}
secs=${4:-15}

. benches/load/lib.sh
need_binaries
make_work_dir
write_pipeline_configs ""
write_ingester_config $'[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
mkdir -p "$work/sink"
start_pipeline
sleep 1

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
base_c=$(rss_kib $collector) base_a=$(rss_kib $aggregator) base_i=$(rss_kib $ingester)
taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --duration-secs "$secs" --series "$series" --mix "$mix" >/dev/null
# Let the last windows and tiles flush (a 1 min tile closes within a minute of its end).
sleep 3
sent_lines=$(( rate * secs ))
received=$(metric_sum "$collector_http" tessera_collector_lines_received_total 'listener="udp"')
per_series() { echo "scale=0; ($1 - $2) * 1024 / $series" | bc; }
now_c=$(rss_kib $collector) now_a=$(rss_kib $aggregator) now_i=$(rss_kib $ingester)
peak_c=$(peak_rss_kib $collector) peak_a=$(peak_rss_kib $aggregator) peak_i=$(peak_rss_kib $ingester)
echo "series=$series mix=$mix rate=$rate secs=$secs lines_received=$received (of about $sent_lines)"
echo "  collector:  idle $(( base_c / 1024 )) MiB, peak $(( peak_c / 1024 )) MiB, $(per_series $peak_c $base_c) B/series; held after the load $(( now_c / 1024 )) MiB, $(per_series $now_c $base_c) B/series"
echo "  aggregator: idle $(( base_a / 1024 )) MiB, peak $(( peak_a / 1024 )) MiB, $(per_series $peak_a $base_a) B/series; held after the load $(( now_a / 1024 )) MiB, $(per_series $now_a $base_a) B/series"
echo "  ingester:   idle $(( base_i / 1024 )) MiB, peak $(( peak_i / 1024 )) MiB, $(per_series $peak_i $base_i) B/series; held after the load $(( now_i / 1024 )) MiB, $(per_series $now_i $base_i) B/series"
