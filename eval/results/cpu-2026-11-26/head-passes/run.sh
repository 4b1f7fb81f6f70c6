# Side by side, two rounds: d366462 (a split head's part timed and scaled by 2K) and 9cd0389 (a split head timed
# whole, cut by its heavier pass), each a git worktree; the demo job alone on both cores at the 18.6 ms bound,
# 8 optimizer steps after 2 warm-up (the script of ../optimizer-parts; units_by_bound_round0.txt: before it counted
# units over the bound).
set -e
S=/work/main/eval/results/cpu-2026-11-26/optimizer-parts/units_by_bound.py
for round in 1 2; do
 for wt in after head; do
  cd /tmp/wt-$wt; echo "$(git rev-parse --short HEAD) 18.6 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  PYTHONPATH=. /work/main/.venv/bin/python $S 18.6 8 2>/dev/null | tail -1
 done
done
