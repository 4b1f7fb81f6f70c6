#!/bin/bash
# ABAB: main (0.5 ms) vs wt (0.1 ms), harvest-pinned at 0.5
for i in 1 2; do
 for v in main wt; do
  cd /work/$v
  flock /tmp/harvest-heavy.lock /work/main/.venv/bin/python -m harvest.cli.main bench colocate --window steady=conv:17s+12s --rate-scale 0.5 --rows harvest-pinned --repeats 1 --tpot-ms 300 --log-dir /tmp/ab/$v$i > /tmp/ab/$v$i.out 2> /tmp/ab/$v$i.err
 done
done
echo done > /tmp/ab/done
