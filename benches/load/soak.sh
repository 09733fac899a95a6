#!/usr/bin/env bash
# Soak: the whole pipeline for a long run with churning series, watching
# every daemon's memory.
#
# tessera-collector (pinned to CPU 0), tessera-aggregator and
# tessera-ingester (file sink) on CPU 1, and `tessera loadgen` sending
# counters at RATE lines/s over SERIES live series. Every minute the series
# move on by a tenth: a tenth are new, a tenth stop and expire (the
# collector's and aggregator's idle series, the ingester's running totals
# after `counter_expire_after_secs = 120`). Every 10 s the RSS of each daemon
# is sampled. At the end:
#
# - loss = counter increments sent - increase of the counter totals in the
#   file sink (the 10 s tiles, its one resolution: no `resolution` label); it must be 0;
# - per daemon: RSS after warm-up (the first third of the run) min / max, and
#   its slope by least squares in MB per hour, which should be about flat;
# - with RSS_LIMIT_MB set, the run fails if any daemon's RSS ever exceeds it.
#
#   benches/load/soak.sh [DURATION_SECS] [RATE] [SERIES]
#   defaults: 1800 s, 1 500 000 lines/s (half the whole pipeline's lossless
#   3 M lines/s at 1 M series, BENCHMARKS.md), 100 000 series
#   The short version scripts/test.sh runs:
#   BIN_DIR=target/debug RSS_LIMIT_MB=150 benches/load/soak.sh 90 20000 5000
#
# Prints the RSS samples to $SOAK_CSV (default: a temporary file, removed).
# Needs `sysctl -w net.core.rmem_max=33554432` for the 32 MiB receive buffer
# at high rates.
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${1:-1800}
rate=${2:-1500000}
series=${3:-100000}
step=$((series / 10))
minute=60
((duration >= 60)) || { echo "soak: run at least 60 s" >&2; exit 64; }

. benches/load/lib.sh
need_binaries
make_work_dir
write_pipeline_configs
write_ingester_config $'[mapping]\ncounter_expire_after_secs = 120\n[sink]\nkind = "file"\n'"dir = \"$work/sink\""$'\nrotate_secs = 2'
mkdir -p "$work/sink"
start_pipeline

# The sum of the last value of every loadgen counter in the closed files.
sink_total() {
    python3 - "$work/sink" <<'PY'
import os, re, sys
last = {}
pattern = re.compile(r'^(loadgen_counter_\d+_total(?:\{[^}]*\})?) (\S+)')
for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".om"):
        continue
    with open(os.path.join(sys.argv[1], name)) as lines:
        for line in lines:
            match = pattern.match(line)
            if match and 'resolution="' not in match.group(1):
                last[match.group(1)] = float(match.group(2))
print(f"{sum(last.values()):.0f}")
PY
}

csv=${SOAK_CSV:-$work/rss.csv}
echo "seconds,collector_mb,aggregator_mb,ingester_mb" > "$csv"
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
started=$SECONDS
(
    while :; do
        echo "$((SECONDS - started)),$(rss_mb $collector),$(rss_mb $aggregator),$(rss_mb $ingester)" >> "$csv"
        sleep 10
    done
) &
sampler=$!
pids+=($sampler)

sent=0
for ((offset_minute = 0; SECONDS - started < duration; offset_minute++)); do
    left=$((duration - (SECONDS - started)))
    run=$((left < minute ? left : minute))
    report=$(taskset -c 1 "$bin/tessera" loadgen --target "127.0.0.1:$udp_port" --rate-lines-per-sec "$rate" \
        --duration-secs "$run" --series "$series" --series-offset $((offset_minute * step)) \
        --mix counter=100 --json)
    lines=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
    sent=$((sent + lines))
done
kill "$sampler" 2>/dev/null || true

# Everything sent is in tiles that close within max_buffer_past, then in files within rotate_secs.
seen=0
for _ in $(seq 60); do
    seen=$(sink_total)
    [ "$seen" -ge "$sent" ] && break
    sleep 1
done
lost=$((sent - seen))

echo "soak: ${duration}s at $rate lines/s, $series live series moving on by $step a minute; sent $sent, seen $seen, lost $lost"
echo "  collector: kernel_drops=$(metric_sum $collector_http tessera_collector_kernel_drops_total) drops=$(metric_sum $collector_http tessera_collector_drops_total)"
echo "  aggregator: refused=$(metric_sum $aggregator_http tessera_aggregator_partials_rejected_total) expired=$(metric_sum $aggregator_http tessera_aggregator_series_expired_total)"
verdict=$(python3 - "$csv" "$duration" "${RSS_LIMIT_MB:-}" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
duration, limit = float(sys.argv[2]), sys.argv[3]
warm = [row for row in rows if float(row["seconds"]) >= duration / 3]
failed = False
for daemon in ("collector", "aggregator", "ingester"):
    key = f"{daemon}_mb"
    xs = [float(row["seconds"]) / 3600 for row in warm]
    ys = [float(row[key]) for row in warm]
    peak = max(float(row[key]) for row in rows)
    slope = 0.0
    if len(xs) > 1:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    over = limit and peak > float(limit)
    failed |= bool(over)
    print(f"  {daemon}: RSS after warm-up {min(ys):.0f}-{max(ys):.0f} MB, slope {slope:+.1f} MB/h, peak {peak:.0f} MB"
          + (f"  OVER the {limit} MB limit" if over else ""))
print("FAIL" if failed else "OK")
PY
)
echo "$verdict" | sed '$d'
if [ "$lost" -ne 0 ] || [ "$(echo "$verdict" | tail -1)" != OK ]; then
    echo "soak: FAILED (lost $lost; $(echo "$verdict" | tail -1))" >&2
    exit 1
fi
echo "soak: passed"
