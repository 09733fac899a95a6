#!/usr/bin/env bash
# Every series a `tessera local` of BIN_DIR exports (name and labels; values and ports
# stripped) and every HELP/TYPE line, sorted: diff two builds' dumps to see that a change
# left the exported metrics alone. Runs across a minute boundary so that the 1 m tiles'
# series appear too, with a few statsd lines sent.
#
#   benches/load/metric-dump.sh BIN_DIR OUT_PREFIX    # writes OUT_PREFIX.txt and OUT_PREFIX.meta
#   e.g. benches/load/metric-dump.sh /tmp/before /tmp/before && benches/load/metric-dump.sh target/release /tmp/after
#        diff /tmp/before.txt /tmp/after.txt; diff /tmp/before.meta /tmp/after.meta
set -euo pipefail
bin=$(realpath "${1:?BIN_DIR}")
out=$(realpath -m "${2:?OUT_PREFIX}")
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$bin/tessera" local --plain --statsd 127.0.0.1:18125 --telemetry 127.0.0.1:19100 > "$out.log" 2>&1 &
pid=$!
for _ in $(seq 1 50); do curl -sf http://127.0.0.1:19100/metrics > /dev/null && break; sleep 0.2; done
for _ in $(seq 1 30); do printf 'dump.hits:1|c\ndump.t:3|ms\ndump.g:2|g\n' > /dev/udp/127.0.0.1/18125; sleep 0.5; done
sleep $((60 - $(date +%-S) + 20))
curl -sf http://127.0.0.1:19100/metrics > "$out.raw"
grep -v '^#' "$out.raw" | sed -E 's/ [^ ]+$//; s/127\.0\.0\.1:[0-9]+/127.0.0.1:PORT/' | grep -v '_bucket{' | sort > "$out.txt"
grep '^# \(TYPE\|HELP\)' "$out.raw" | sort > "$out.meta"
wc -l "$out.txt" "$out.meta"
