"""How far decode steps run over their batch's median, by batch: on the pinned worker's one core and on a harvest
worker's (1, 1) partition. Usage: python noise_shape.py PINNED_STEPS_GLOB HARVEST_STEPS_GLOB"""
import collections
import glob
import json
import statistics
import sys


def by_batch(pattern, keep):
    batches = collections.defaultdict(list)
    for path in glob.glob(pattern):
        for step in json.load(open(path)):
            if keep(step):
                batches[step["batch_size"]].append(step["latency_ms"])
    return batches


for name, pattern, keep in (("pinned worker, one core", sys.argv[1], lambda s: True),
                            ("harvest, (1, 1) steps", sys.argv[2], lambda s: s["ft_sms"] == 1)):
    print(name)
    for batch, times in sorted(by_batch(pattern, keep).items()):
        if len(times) < 8:
            continue
        times.sort()
        p50, p95, top = statistics.median(times), times[int(0.95 * (len(times) - 1))], times[-1]
        print(f"  batch {batch}: n {len(times)}, p50 {p50:.0f} ms, p95 - p50 {p95 - p50:.0f} ms, max - p50 {top - p50:.0f} ms, "
              f"p95 / p50 {p95 / p50:.2f}, max / p50 {top / p50:.2f}")
