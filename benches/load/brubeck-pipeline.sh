#!/usr/bin/env bash
# brubeck (github/brubeck, a C statsd server; not part of this repository: build it from its
# public source and give its path in BRUBECK) in pipeline.sh's harness, to set beside it:
# brubeck pinned to CPU 0 with one statsd worker (the collector's one reader), `tessera
# loadgen` and a carbon receiver (benches/load/carbon_sum.py, standing in for Graphite) on
# CPU 1. loadgen sends RATE lines/s of SERIES counters for DURATION seconds in ORDER; after
# two more flushes, loss = lines sent - the sum of every `loadgen.counter.*` value brubeck
# flushed to carbon (brubeck writes each counter's count per flush, scaled by the sample rate).
#
#   BRUBECK=/path/to/brubeck benches/load/brubeck-pipeline.sh RATE SERIES [DURATION_SECS]
#   e.g. BRUBECK=/work/brubeck/brubeck ORDER=random benches/load/brubeck-pipeline.sh 1000000 1000000 10
#   ORDER=sequential|random|zipf (default sequential, as pipeline.sh); VALUES_PER_SERIES (default 4)
#   FLUSH_SECS: brubeck's carbon frequency (default 10, the tile)
#
# Needs `sysctl -w net.core.rmem_max=33554432`: brubeck asks for a large receive buffer too.
set -euo pipefail
cd "$(dirname "$0")/../.."

rate=${1:?rate in lines/s}
series=${2:?distinct series}
duration=${3:-10}
order=${ORDER:-sequential}
values_per_series=${VALUES_PER_SERIES:-4}
flush=${FLUSH_SECS:-10}
brubeck=${BRUBECK:?the path of a brubeck binary}

. benches/load/lib.sh
need_binaries
make_work_dir
udp_port=$(free_port DGRAM)
carbon_port=$(free_port)
taskset -c 1 python3 benches/load/carbon_sum.py "$carbon_port" loadgen.counter. "$work/carbon.sum" &
pids+=($!)
carbon_pid=$!
cat > "$work/brubeck.json" <<JSON
{
  "server_name": "bench",
  "dumpfile": "$work/brubeck.dump",
  "capacity": 15,
  "backends": [{ "type": "carbon", "address": "127.0.0.1", "port": $carbon_port, "frequency": $flush }],
  "samplers": [{ "type": "statsd", "address": "127.0.0.1", "port": $udp_port, "workers": 1 }]
}
JSON
sleep 0.5
taskset -c 0 "$brubeck" --config "$work/brubeck.json" 2>"$work/brubeck.log" &
pids+=($!)
brubeck_pid=$!
sleep 1
kill -0 "$brubeck_pid" || { cat "$work/brubeck.log"; exit 1; }
before=$(cpu_ticks $brubeck_pid)
report=$(taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
    --duration-secs "$duration" --series "$series" --mix counter=100 --order "$order" \
    --values-per-series "$values_per_series" --json | head -1)
sleep $(( 2 * flush + 2 ))
cpu=$(echo "scale=1; ($(cpu_ticks $brubeck_pid) - $before) / $(getconf CLK_TCK)" | bc)
peak=$(( $(peak_rss_kib $brubeck_pid) / 1024 ))
kill -TERM "$carbon_pid"
wait "$carbon_pid" 2>/dev/null || true
sent=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
achieved=$(echo "$report" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["lines_per_sec"]))')
seen=$(cat "$work/carbon.sum")
echo "brubeck order=$order rate=$rate achieved=$achieved series=$series duration=${duration}s sent=$sent"
python3 -c "import sys; sent, seen = int(sys.argv[1]), float(sys.argv[2]); print(f'  verify: expected counter increase {sent}, seen {seen:.0f}, lost {sent - seen:.0f} ({100 * (sent - seen) / sent:.3f} %)')" "$sent" "$seen"
echo "  brubeck: cpu=${cpu}s peak_rss=${peak}MB"
