"""What decode's cost fit (BatchCost, replayed over a run's step records) says is the largest batch served in 300 ms
(max_batch, at the 99th percentile of measured / fitted over all recent steps, or over those of the larger batches),
beside the misses the steps had at each batch. Run from the repository root with its .venv python:
python eval/results/cpu-2026-11-30/unit-estimate/overrun_by_batch.py STEP_DIR[:INFER_SMS]...
(STEP_DIR holds steps-steady@0.3.json and steps-steady@0.5.json; INFER_SMS picks a split's steps)."""
import json
import sys
from collections import defaultdict, deque

import numpy as np

from harvest.colocation.controller import BatchCost

TARGET_MS = 298  # 300 ms less the controller's loop overhead


def max_batches(steps, larger_only):
    cost, recent, out = BatchCost(max_running=8), deque(maxlen=256), []
    for batch, latency in steps:
        if cost.slope_ms is not None and cost.intercept_ms + cost.slope_ms * batch > 0:
            recent.append((batch, latency / (cost.intercept_ms + cost.slope_ms * batch)))
        cost.observe(batch, latency)
        if len(recent) >= 64 and cost.slope_ms:
            largest = max(b for b, _ in recent)
            ratios = sorted(r for b, r in recent if not larger_only or 2 * b >= largest)
            q = max(1.0, ratios[int(0.99 * (len(ratios) - 1))])
            out.append((TARGET_MS / q - cost.intercept_ms) / cost.slope_ms)
    return np.median(out), min(out)


for arg in sys.argv[1:]:
    path, _, sms = arg.partition(":")
    steps = []
    for scale in ("0.3", "0.5"):
        records = json.load(open(f"{path}/steps-steady@{scale}.json"))
        steps += [(s["batch_size"], s["latency_ms"] - s.get("preempt_ms", 0.0)) for s in records
                  if not sms or s.get("infer_sms") == int(sms)]
    by_batch = defaultdict(list)
    for batch, latency in steps:
        by_batch[batch].append(latency)
    misses = {b: f"{sum(x > TARGET_MS for x in v)}/{len(v)}" for b, v in sorted(by_batch.items()) if b >= 5}
    print(f"{arg}: all steps' quantile: max_batch median {max_batches(steps, False)[0]:.1f} min "
          f"{max_batches(steps, False)[1]:.1f} | larger batches': median {max_batches(steps, True)[0]:.1f} min "
          f"{max_batches(steps, True)[1]:.1f} | misses at batch >= 5: {misses}")
