#!/bin/bash
# Three more rounds: f6ae1ed (/tmp/wt-base), the working tree with the spread quantile off, and at Z=2.33.
S=/tmp/q/units_by_bound.py
for round in 3 4 5; do
  echo "base $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"; (cd /tmp/wt-base && PYTHONPATH=. /work/main/.venv/bin/python $S 18.6 8 2>/dev/null | tail -1)
  for z in off 2.33; do
    echo "positions z=$z $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"; (cd /work/main && PYTHONPATH=. .venv/bin/python $S 18.6 8 $z 2>/dev/null | tail -1)
  done
done
