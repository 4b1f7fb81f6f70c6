# The same at an 8 ms bound (where the whole update, ~15 ms here, must be cut): one round each side.
set -e
S=/work/main/eval/results/cpu-2026-11-26/optimizer-parts/units_by_bound.py
for wt in before after; do
  cd /tmp/wt-$wt; echo "$wt($(git rev-parse --short HEAD)) 8 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  PYTHONPATH=. /work/main/.venv/bin/python $S 8 8 2>/dev/null | tail -1
done
