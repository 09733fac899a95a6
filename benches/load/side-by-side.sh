#!/usr/bin/env bash
# brubeck and the whole tessera pipeline in one harness, alternated: for each step, brubeck
# (benches/load/brubeck-pipeline.sh) at BRUBECK_RATE, then tessera (benches/load/pipeline.sh)
# at TESSERA_RATE, SERIES counters, names in ORDER, 10 s of load each. Steps are
# `BRUBECK_RATE:TESSERA_RATE` pairs; either side may be `-` to skip it.
#
#   BRUBECK=/path/to/brubeck ORDER=random benches/load/side-by-side.sh SERIES STEP...
#   e.g. BRUBECK=/work/brubeck/brubeck ORDER=random benches/load/side-by-side.sh 1000000 1250000:4500000 1500000:6000000
set -euo pipefail
cd "$(dirname "$0")/../.."

series=${1:?distinct series}
shift
for step in "$@"; do
    brubeck_rate=${step%%:*}
    tessera_rate=${step#*:}
    if [ "$brubeck_rate" != - ]; then
        echo "### brubeck $brubeck_rate lines/s, $series names, ${ORDER:-sequential}"
        benches/load/brubeck-pipeline.sh "$brubeck_rate" "$series" 10 | tail -3
    fi
    if [ "$tessera_rate" != - ]; then
        echo "### tessera $tessera_rate lines/s, $series names, ${ORDER:-sequential}"
        benches/load/pipeline.sh "$tessera_rate" "$series" 10 | tail -5
    fi
done
