#!/usr/bin/env bash
# brubeck (github/brubeck, a C statsd server; not part of this repository: build it yourself
# and give its path in BRUBECK) under the same load as the collector's memory runs:
# `tessera loadgen` sends SERIES counter series at RATE lines/s for SECS seconds to brubeck
# pinned to CPU 0 (loadgen on CPU 1); prints brubeck's peak RSS, its RSS 3 s after the load,
# and both per series over its idle RSS. Its carbon backend points at a closed port (brubeck
# keeps no queue: a flush it cannot deliver is dropped).
#
#   BRUBECK=/path/to/brubeck benches/load/brubeck.sh SERIES [RATE] [SECS]
#   e.g. BRUBECK=/tmp/brubeck/brubeck benches/load/brubeck.sh 1000000 2000000 12
set -euo pipefail
cd "$(dirname "$0")/../.."

series=${1:?distinct series}
rate=${2:-2000000}
secs=${3:-12}
brubeck=${BRUBECK:?the path of a brubeck binary}

. benches/load/lib.sh
need_binaries
make_work_dir
port=$(free_port DGRAM)
cat > "$work/brubeck.json" <<JSON
{
  "server_name": "bench",
  "dumpfile": "$work/brubeck.dump",
  "capacity": 15,
  "backends": [{ "type": "carbon", "address": "127.0.0.1", "port": 9, "frequency": 10 }],
  "samplers": [{ "type": "statsd", "address": "127.0.0.1", "port": $port, "workers": 1 }]
}
JSON
taskset -c 0 "$brubeck" --config "$work/brubeck.json" 2>"$work/brubeck.log" &
pids+=($!)
brubeck_pid=$!
sleep 1
kill -0 "$brubeck_pid" || { cat "$work/brubeck.log"; exit 1; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
base=$(rss_kib $brubeck_pid)
taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$port" --rate-lines-per-sec "$rate" \
    --duration-secs "$secs" --series "$series" >/dev/null
sleep 3
held=$(rss_kib $brubeck_pid)
peak=$(peak_rss_kib $brubeck_pid)
per_series() { echo "scale=0; ($1 - $2) * 1024 / $series" | bc; }
echo "brubeck series=$series rate=$rate secs=$secs: idle $(( base / 1024 )) MiB, peak $(( peak / 1024 )) MiB, $(per_series $peak $base) B/series; held after the load $(( held / 1024 )) MiB, $(per_series $held $base) B/series"
