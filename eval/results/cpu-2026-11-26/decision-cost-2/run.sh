#!/bin/bash
# Decision cost side by side: f6ae1ed (before) and 48b5b99 (after), alternating, plus an A/A pair of f6ae1ed.
# Worktrees /tmp/wt-base (f6ae1ed), /tmp/wt-base2 (f6ae1ed), /tmp/wt-new (48b5b99); run from this directory.
for round in 1 2 3 4; do
  for w in base new base2; do
    (cd /tmp/wt-$w && flock /tmp/harvest-heavy.lock /work/main/.venv/bin/python -m harvest.cli.main bench predictor \
       --profile predictor/profiles/synthetic-h100-llama3-8b.json --tpot-ms 40 2>/dev/null) > bench-$w-$round.json
  done
done
