#!/usr/bin/env bash
# `tessera local` (all three daemons in one process, file sink) under `tessera loadgen`, as a
# user first tries it: SERIES counter series at RATE lines/s for SECS seconds, names in ORDER,
# then loss (loadgen --verify against the files) and where the latency goes, from the one
# telemetry port: end-to-end (storage ack - tile end) p50 / p99 per resolution, and the
# mean of each hop's own lag (collector flush, aggregator flush, ingester intake).
#
#   benches/load/local.sh SERIES RATE [SECS]
#   e.g. ORDER=random benches/load/local.sh 1000000 1000000 20
#   ORDER=sequential|random|zipf (default random); BIN_DIR (default target/release);
#   LOADGEN=path of the `tessera` whose loadgen sends (default BIN_DIR's: set it to run an
#   older `tessera local`, from before `--order`, under today's loadgen)
#   SINK=file (default) or graphite: `--graphite` with brubeck's paths into a carbon
#   receiver that sums what it reads (benches/load/carbon_sum.py, standing in for carbon,
#   which cannot create a million whisper files a tile on this machine); loss = lines sent -
#   the sum of every `loadgen.counter.*` value, 25 s (two tiles) after the last line
#
# Needs `sysctl -w net.core.rmem_max=33554432` for the 32 MiB receive buffer.
set -euo pipefail
cd "$(dirname "$0")/../.."

series=${1:?distinct series}
rate=${2:?lines per second}
secs=${3:-20}
order=${ORDER:-random}

. benches/load/lib.sh
need_binaries
make_work_dir
statsd_port=$(free_port DGRAM)
http_port=$(free_port)
sink=${SINK:-file}
sink_flags=()
if [ "$sink" = graphite ]; then
    carbon_port=$(free_port)
    python3 benches/load/carbon_sum.py "$carbon_port" loadgen.counter. "$work/carbon.sum" &
    pids+=($!)
    carbon_pid=$!
    sink_flags=(--graphite "127.0.0.1:$carbon_port" --graphite-naming brubeck)
fi
"$bin/tessera" local --data-dir "$work/data" --plain --statsd "127.0.0.1:$statsd_port" \
    --telemetry "127.0.0.1:$http_port" "${sink_flags[@]}" >"$work/local.log" 2>&1 &
pids+=($!)
local_pid=$!
wait_ready "$http_port"
cpu_before=$(cpu_ticks $local_pid)
loadgen=("${LOADGEN:-$bin/tessera}" loadgen --target "127.0.0.1:$statsd_port" --series "$series" --mix counter=100
    --rate-lines-per-sec "$rate" --duration-secs "$secs" --order "$order")
if [ "$sink" = graphite ]; then
    report=$("${loadgen[@]}" --json | head -1)
    sleep 25
    kill -TERM "$carbon_pid"
    wait "$carbon_pid" 2>/dev/null || true
    sent=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
    verdict=$(python3 -c "import sys; sent, seen = int(sys.argv[1]), float(sys.argv[2]); print(f'verify (carbon): expected counter increase {sent}, seen {seen:.0f}, lost {sent - seen:.0f} ({100 * (sent - seen) / sent:.3f} %)')" "$sent" "$(cat "$work/carbon.sum")")
else
    verdict=$("${loadgen[@]}" --verify "files=$work/data/openmetrics" --verify-timeout-secs 120 | tail -1)
fi
cpu=$(echo "scale=1; ($(cpu_ticks $local_pid) - $cpu_before) / $(getconf CLK_TCK)" | bc)
curl -sf "http://127.0.0.1:$http_port/metrics" > "$work/metrics.txt"
python3 - "$work/metrics.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
buckets, sums = {}, {}
for line in text.splitlines():
    m = re.match(r'tessera_ingester_end_to_end_latency_seconds_bucket\{(.*)\} (\S+)', line)
    if m:
        resolution = re.search(r'resolution="([^"]+)"', m.group(1)).group(1)
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        buckets.setdefault(resolution, []).append((float('inf') if le == '+Inf' else float(le), float(m.group(2))))
    m = re.match(r'(tessera_\w+_(?:lag|latency)_seconds)_(sum|count)(?:\{(.*)\})? (\S+)', line)
    if m:
        key = (m.group(1), m.group(3) or '')
        sums.setdefault(key, {})[m.group(2)] = sums.get(key, {}).get(m.group(2), 0) + float(m.group(4))
def quantile(points, q):
    points.sort()
    total = points[-1][1]
    for le, count in points:
        if count >= q * total:
            return le
for resolution, points in sorted(buckets.items()):
    if points[-1][1] == 0:
        continue
    print(f"  end_to_end {resolution}: tiles {int(points[-1][1])}, p50 <= {quantile(points, 0.5)} s, p99 <= {quantile(points, 0.99)} s")
for (name, labels), parts in sorted(sums.items()):
    if parts.get('count'):
        print(f"  mean {name}{{{labels}}}: {parts['sum'] / parts['count']:.2f} s over {int(parts['count'])}")
PY
echo "  $verdict"
echo "  sink=$sink order=$order series=$series rate=$rate secs=$secs cpu=${cpu}s peak_rss=$(( $(peak_rss_kib $local_pid) / 1024 ))MB"
