import math, sys
from harvest.colocation import controller as c
mode = sys.argv[1]
if mode == "nogrowth":
    c.BatchCost.stretch_limit_ms = lambda self, b, l, t: math.inf
elif mode == "nofade":
    pass
from harvest.cli.main import main
sys.argv = ["harvest", "replay", "--trace", "code", "--simulate", "--latency-noise", "0.05", "--out", "/tmp/sim26/p-" + mode]
main()
