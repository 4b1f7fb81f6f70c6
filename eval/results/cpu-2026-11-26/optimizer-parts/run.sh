# Side by side, two rounds: the commit before (de7b3c2) and the optimizer-parts commit (d366462), each a
# git worktree, the demo job alone on both cores at the 18.6 ms bound, 8 optimizer steps after 2 warm-up.
set -e
S=/work/main/eval/results/cpu-2026-11-26/optimizer-parts/units_by_bound.py
for round in 1 2; do
 for wt in before after; do
  cd /tmp/wt-$wt; echo "$wt($(git rev-parse --short HEAD)) 18.6 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  PYTHONPATH=. /work/main/.venv/bin/python $S 18.6 8 2>/dev/null | tail -1
 done
done
