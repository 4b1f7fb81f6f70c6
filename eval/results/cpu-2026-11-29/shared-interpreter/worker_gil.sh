#!/bin/bash
set -u
OUT=${OUT:-/tmp/spy}  # the worker under `harvest serve --pin-partition 1,1` at rate 0.5; py-spy on its scheduler process once the unit thread runs
ARGS="--window steady=conv:17s+12s --rate-scale 0.5 --repeats 1 --tpot-ms 300"
(
  while true; do
    P=$(pgrep -f "sglang::scheduler" | head -1)
    if [ -n "$P" ] && ls /proc/$P/task/*/comm 2>/dev/null | xargs cat 2>/dev/null | grep -q harvest-finetun; then break; fi
    sleep 1
  done
  sleep 4
  /work/main/.venv/bin/py-spy record --gil --threads -r 50 -d 15 -f raw -o $OUT/gil.txt -p $P > $OUT/spy1.log 2>&1
  /work/main/.venv/bin/py-spy record --idle --threads -r 50 -d 15 -f raw -o $OUT/idle.txt -p $P > $OUT/spy2.log 2>&1
) &
cd /work/main && /work/main/.venv/bin/python -m harvest.cli.main bench colocate $ARGS --rows harvest-pinned --log-dir $OUT/logs > $OUT/run.json 2> $OUT/run.err
echo "rc=$? $(date +%T)" >> $OUT/progress
