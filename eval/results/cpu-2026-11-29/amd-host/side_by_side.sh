#!/bin/bash
cd /work/main
exec flock /tmp/harvest-heavy.lock .venv/bin/python -m harvest.cli.main bench colocate --window steady=conv:17s+12s --rate-scale 0.3,0.5 --rows harvest-default,two-process-pinned --repeats 1 --tpot-ms 300 --log-dir /tmp/r1/logs > /tmp/r1/out 2> /tmp/r1/err
