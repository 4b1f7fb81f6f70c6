#!/bin/bash
# The (1, 1) partition (`harvest serve --pin-partition 1,1`) at rate 0.5, old and new alternating: old from a
# worktree at 0d7781b (Python's 5 ms switch interval), new from the tree with spatial_controller.SWITCH_INTERVAL_S.
# thread_sampler.py writes every thread's schedstat every 5 s; thread_shares.py sums them.
# Run as: flock /tmp/harvest-heavy.lock ./switch_interval_ab.sh  (old2 came from an earlier run of the same shape)
set -u
HERE=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/absw}; mkdir -p $OUT
ARGS="--window steady=conv:17s+12s --rate-scale 0.5 --repeats 1 --tpot-ms 300"
run() { /work/main/.venv/bin/python $HERE/thread_sampler.py $OUT/$1.procs.jsonl & SAMP=$!
  cd $2 && /work/main/.venv/bin/python -m harvest.cli.main bench colocate $ARGS --rows $3 --log-dir $OUT/$1/logs > $OUT/$1.json 2> $OUT/$1.err
  echo "$1 rc=$? $(date +%T)" >> $OUT/progress; kill $SAMP; }
run new3 /work/main harvest-pinned
run old3 /work/wt harvest-pinned
run new4 /work/main harvest-pinned
