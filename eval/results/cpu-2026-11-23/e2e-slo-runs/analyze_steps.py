"""Step records of test_finetune_harvests_slack_within_the_tpot_slo (its steps.json, gzipped here): per phase
(solo = the job paused, colo = the job running) the batch sizes, decode latency per batch size, and what each
miss of the colo phase was charged (decode alone, the slice, an idle-time unit's wait).

    python analyze_steps.py before-guard-run1.steps.json.gz
"""

import collections
import gzip
import json
import sys

import numpy as np


def main(path: str) -> None:
    with gzip.open(path, "rt") as f:
        runs = json.load(f)
    target = 1.5 * np.percentile([s["latency_ms"] for s in runs["solo"]], 99)
    print(f"target {target:.1f} ms (1.5 x the solo phase's p99)")
    for name, steps in runs.items():
        charged = [s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] for s in steps]
        print(f"{name}: {len(steps)} steps, {np.mean([c <= target for c in charged]):.2%} within target, "
              f"{sum(s['latency_ms'] > target for s in steps)} over by decode alone, "
              f"slice {sum(s['finetune_ms'] for s in steps) / 1e3:.1f} s")
        by_batch = collections.defaultdict(list)
        for s in steps:
            by_batch[s["batch_size"]].append(s["latency_ms"])
        for batch, ms in sorted(by_batch.items()):
            print(f"  batch {batch}: {len(ms):5d} steps, p50 {np.median(ms):6.1f} ms, p90 "
                  f"{np.percentile(ms, 90):6.1f}, max {max(ms):6.1f}, over target {sum(m > target for m in ms)}")
    colo = runs["colo"]
    print("colo misses (step, batch, KV tokens, decode ms, slice ms, idle wait ms, previous step's slice ms):")
    for i, s in enumerate(colo):
        if s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] > target:
            print(f"  {i} {s['batch_size']} {s['kv_tokens']} {s['latency_ms']:.1f} {s['finetune_ms']:.1f} "
                  f"{s['idle_wait_ms']:.1f} {colo[i - 1]['finetune_ms'] if i else 0:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
