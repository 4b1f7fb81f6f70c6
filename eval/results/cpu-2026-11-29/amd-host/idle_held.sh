#!/bin/bash
cd /work/wt
flock /tmp/harvest-heavy.lock /work/main/.venv/bin/python -m harvest.cli.main bench colocate --window steady=conv:17s+12s --rate-scale 0.1,0.2 --rows harvest-default,harvest-temporal --repeats 1 --tpot-ms 300 --log-dir /tmp/idle/logs > /tmp/idle/out 2> /tmp/idle/err
echo done > /tmp/idle/done
