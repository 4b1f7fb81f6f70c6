#!/bin/bash
cd /work/wt
flock /tmp/harvest-heavy.lock /work/main/.venv/bin/python -m harvest.cli.main bench colocate --rate-scale 0.1,0.2,0.3,0.5 --rows harvest-default,harvest-temporal,two-process-pinned --repeats 1 --tpot-ms 300 --log-dir /tmp/sweep/logs > /tmp/sweep/out 2> /tmp/sweep/err
echo done > /tmp/sweep/done
