#!/usr/bin/env bash
# Measures tessera-collector's lossless intake rate on this machine.
#
# The collector runs pinned to CPU 0 with one reader thread; `tessera
# loadgen` runs pinned to CPU 1 and sends exactly LINES lines at RATE
# lines/s. Lossless means: lines counted by the collector
# (tessera_collector_lines_received_total) == lines loadgen handed to the
# kernel, and no kernel drops. Forwarding is live: partials go to an
# aggregator if AGGREGATOR is set (host:port), else to a closed port, where
# they are queued and dropped (counted) — intake is what this measures.
#
#   benches/load/collector.sh RATE SERIES DATAGRAM_BYTES [LINES]
#   e.g. benches/load/collector.sh 4000000 10000 1400
#   ORDER=random|zipf: the order loadgen sends the names in (default sequential, the
#   order the collector inserted them, which flatters its table); VALUES_PER_SERIES=N
#   (default 4): a random pass repeats the first pass's order (the insertion order) once
#   every N passes
#   PROFILE_HZ=99: take a CPU profile at that frequency (/debug/pprof/profile)
#   for the whole run, to measure what profiling costs
#
# Needs `sysctl -w net.core.rmem_max=33554432` for the 32 MiB receive buffer.
set -euo pipefail
cd "$(dirname "$0")/../.."

rate=${1:?rate in lines/s}
series=${2:?distinct series}
datagram_bytes=${3:?datagram bytes}
lines=${4:-$((rate * 5))}
threads=${READER_THREADS:-1}
mix=${MIX:-counter=100}
tags=${TAGS:-0}
order=${ORDER:-sequential}
values_per_series=${VALUES_PER_SERIES:-4}

bin=${BIN_DIR:-target/release}
[ -x $bin/tessera-collector ] && [ -x $bin/tessera ] || cargo build --release --bin tessera-collector --bin tessera >&2

. benches/load/lib.sh
work=$(mktemp -d)
trap 'kill $collector 2>/dev/null || true; rm -rf "$work"' EXIT
udp_port=$(free_port DGRAM)
http_port=$(free_port)
write_collector_config "$work" "$udp_port" "$http_port" "$threads" "${AGGREGATOR:-127.0.0.1:9}"
taskset -c 0 $bin/tessera-collector --config "$work/collector.toml" --log-level warn 2>"$work/collector.log" &
collector=$!
wait_ready "$http_port"

cpu_before=$(cpu_ticks $collector)
sys_before=$(awk '{print $15}' /proc/$collector/stat)
start_profile "$http_port" $(( lines / rate + 3 )) "$work/profile.pb.gz"
start=$(date +%s.%N)
report=$(taskset -c 1 $bin/tessera loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --total-lines "$lines" --series "$series" --mix "$mix" --tags "$tags" --datagram-bytes "$datagram_bytes" \
    --order "$order" --values-per-series "$values_per_series" --json)
sent=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
achieved=$(echo "$report" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["lines_per_sec"]))')
# Wait until the collector has read everything the kernel queued.
previous=-1
while true; do
    received=$(metric_sum "$http_port" tessera_collector_lines_received_total 'listener="udp"')
    [ "$received" = "$previous" ] && break
    previous=$received
    sleep 0.5
done
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
cpu_after=$(cpu_ticks $collector)
sys_after=$(awk '{print $15}' /proc/$collector/stat)
ticks=$(getconf CLK_TCK)
cpu=$(echo "scale=2; ($cpu_after - $cpu_before) / $ticks / $elapsed * 100" | bc)
sys=$(echo "scale=2; ($sys_after - $sys_before) / $ticks / $elapsed * 100" | bc)
rss_kib=$(peak_rss_kib $collector)
kernel_drops=$(metric_sum "$http_port" tessera_collector_kernel_drops_total)
lost=$((sent - received))
finish_profile "$work/profile.pb.gz"
echo "order=$order rate=$rate achieved=$achieved series=$series datagram_bytes=$datagram_bytes threads=$threads sent=$sent received=$received lost=$lost kernel_drops=$kernel_drops collector_cpu=${cpu}% (system ${sys}%) peak_rss_kib=$rss_kib$profile_note"
