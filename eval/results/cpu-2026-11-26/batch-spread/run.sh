#!/bin/bash
# Before (1ae73fc) and after (4176e36) the batch-spread margin, same traces and seeds (worktrees /tmp/wt-before,
# /tmp/wt-after); then the four acceptance replays on the synthetic H100 profile at 4176e36. From this directory.
HERE=$(pwd); PY=/work/main/.venv/bin/python
SPECS="poisson:rate=0.3 poisson:rate=0.5 poisson:rate=0.7 gamma:rate=0.3,cv=2"
for tree in before after; do
  rm -f $HERE/$tree.jsonl
  (cd /tmp/wt-$tree && flock /tmp/harvest-heavy.lock $PY $HERE/loaded_cpu.py $HERE/$tree.jsonl $SPECS)
done
mkdir -p sim
for t in conv code; do for n in 0.05 0.10; do
  (cd /tmp/wt-after && flock /tmp/harvest-heavy.lock $PY -m harvest.cli.main replay --trace $t --simulate \
     --latency-noise $n --with-oracle --no-plots --out /tmp/sim-spread/$t-$n) > sim/$t-$n.txt 2>&1
  cp /tmp/sim-spread/$t-$n/results.json sim/$t-$n.results.json; gzip -f sim/$t-$n.results.json
done; done
