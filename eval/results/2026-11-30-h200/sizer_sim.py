"""The unit sizer (harvest.finetune.unit_sizer) fed launch-bound layer units, as a 1B model's are on the H200: 3.5 ms
fixed plus 0.002 ms per position, times log-normal noise of spread sigma, micro-batches of 4 rows padded to 80-256
positions, 40 optimizer steps. Prints, per bound and sigma, how many units carried 1-4 rows, the forward line
fitted at the end (fixed ms, ms per position) and each kind's overrun. Run from the checkout's root on a CPU."""
import collections
import math
import random

from harvest.finetune.unit_sizer import UnitSizer


def run(bound_ms, fixed_ms, ms_per_position, sigma, num_steps=40, seed=0):
    rng = random.Random(seed)
    sizer = UnitSizer(max_unit_ms=bound_ms)
    rows_seen = collections.Counter()
    for _ in range(num_steps):
        length = rng.randint(80, 256)
        done = 0
        while done < 4:
            rows = min(sizer.rows_per_slice(4, length), 4 - done)
            rows_seen[rows] += 1
            for kind in ("forward", "recompute", "backward"):
                sizer.observe(kind, rows * length,
                              (fixed_ms + ms_per_position * rows * length) * math.exp(rng.gauss(0, sigma)))
            done += rows
    return dict(sorted(rows_seen.items())), tuple(round(x, 4) for x in sizer.cost("forward")), sizer.overruns()


for bound_ms in (10, 20):
    for sigma in (0.05, 0.15, 0.4):
        print(f"bound {bound_ms} ms, sigma {sigma}:", *run(bound_ms, 3.5, 0.002, sigma))
