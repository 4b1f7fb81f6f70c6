#!/bin/bash
# $1: label. The demo job's units alone on core 1 for 40 s (units_alone.py); py-spy --gil on 20 s of it.
HERE=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/ub}; mkdir -p $OUT
cd /work/main
.venv/bin/python $HERE/units_alone.py 40 > $OUT/$1.out 2> $OUT/$1.err &
P=$!
until grep -q ready $OUT/$1.out 2>/dev/null; do sleep 1; kill -0 $P || exit 1; done
sleep 5
.venv/bin/py-spy record --gil -r 100 -d 20 -f raw -o $OUT/$1.gil -p $P > $OUT/$1.spy 2>&1
wait $P
