#!/bin/bash
# Side by side, 2 rounds: f6ae1ed (sizer fed non-padding tokens, /tmp/wt-base) and the working tree (fed
# positions) with the spread quantile off, Z=1.645, Z=2.33; the demo job alone on both cores at 18.6 ms, 8 steps.
S=/tmp/q/units_by_bound.py
for round in 1 2; do
  echo "base $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"; (cd /tmp/wt-base && PYTHONPATH=. /work/main/.venv/bin/python $S 18.6 8 2>/dev/null | tail -1)
  for z in off 1.645 2.33; do
    echo "positions z=$z $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"; (cd /work/main && PYTHONPATH=. .venv/bin/python $S 18.6 8 $z 2>/dev/null | tail -1)
  done
done
