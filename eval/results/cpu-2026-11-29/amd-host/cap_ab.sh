#!/bin/bash
# A/B: old chooser (set-aside, /work/wt at cd94659) vs new (batch cap, /work/main) vs pinned; 0.3 and 0.5; ABC CBA
one() { # $1 tree $2 row $3 label
  cd /work/$1
  flock /tmp/harvest-heavy.lock /work/main/.venv/bin/python -m harvest.cli.main bench colocate --window steady=conv:17s+12s --rate-scale 0.3,0.5 --rows $2 --repeats 1 --tpot-ms 300 --log-dir /tmp/cap/$3 > /tmp/cap/$3.out 2> /tmp/cap/$3.err
}
one wt harvest-default old0; one main harvest-default new0; one main two-process-pinned pinned0
one main two-process-pinned pinned1; one main harvest-default new1; one wt harvest-default old1
echo done > /tmp/cap/done
