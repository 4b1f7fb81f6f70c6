set -e
S=eval/results/cpu-2026-11-25/head-vocab-chunks/units_by_bound.py
for round in 1 2; do
 for bound in 18.6 none; do
  cd /work/main; echo "after($(git rev-parse --short HEAD)) $bound $(date -u +%H:%M:%S)"; PYTHONPATH=. .venv/bin/python $S $bound 2>/dev/null | tail -1
  cd /tmp/wt-before; echo "before(ad958b6) $bound $(date -u +%H:%M:%S)"; PYTHONPATH=. /work/main/.venv/bin/python $S $bound 2>/dev/null | tail -1
 done
done
