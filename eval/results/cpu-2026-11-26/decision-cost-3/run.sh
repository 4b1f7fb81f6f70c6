#!/bin/bash
# Decision cost, side by side in one process (inproc.py: each tree's planner module loaded under its own
# import, the trees alternated in chunks of 2000 steps so host drift cancels; A' is a second instance of A,
# the A/A control), then `harvest bench predictor` three times at the new commit.
# Worktrees: /tmp/wt-base (04a7dfb, before), /tmp/wt-1123 (2037282, measured 3.25 us on 2026-11-23),
# /tmp/wt-new (f16cd3c, after). Run from this directory.
PY=/work/main/.venv/bin/python
HERE=$(pwd)
for round in 1 2 3; do
  echo "04a7dfb vs f16cd3c round $round: $(flock /tmp/harvest-heavy.lock $PY inproc.py /tmp/wt-base /tmp/wt-new) load $(cut -d' ' -f1 /proc/loadavg)"
  echo "2037282 vs f16cd3c round $round: $(flock /tmp/harvest-heavy.lock $PY inproc.py /tmp/wt-1123 /tmp/wt-new) load $(cut -d' ' -f1 /proc/loadavg)"
done
for round in 1 2 3; do
  (cd /tmp/wt-new && flock /tmp/harvest-heavy.lock $PY -m harvest.cli.main bench predictor \
     --profile predictor/profiles/synthetic-h100-llama3-8b.json --tpot-ms 40 2>/dev/null) > $HERE/bench-f16cd3c-$round.json
done
