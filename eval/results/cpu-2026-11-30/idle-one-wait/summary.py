"""Per window and tree: finetune tok/s of each run (in the bench's order: repeat 0 runs 0.1 -> 0.3 on one worker,
repeat 1 0.3 -> 0.1 on another), steps in target, the longest idle wait of a step (from the step records, which
stay in /tmp: run on the machine that ran the bench), the host probe. Trees: held = d98f95b (a partition held
through idle turns), one-wait = e9bef96 (taken back; that turn runs no unit)."""
import collections
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = {"wt": "held", "main": "one-wait"}
rows = collections.defaultdict(list)
for path in sorted(glob.glob(f"{HERE}/*-[12].json")):
    tree = NAMES[os.path.basename(path).split("-")[0]]
    for run in json.load(open(path))["runs"]:
        try:
            max_idle = round(max(x.get("idle_wait_ms", 0) for x in json.load(open(run["step_records"]))))
        except OSError:
            max_idle = None
        rows[run["window"], tree].append((run["repeat"], run["finetune_tokens_per_s"],
                                          round(run["steps_within_target"] * 100, 2), max_idle))
for (window, tree), runs in sorted(rows.items()):
    print(f"{window:11} {tree:9} tok/s {[r[1] for r in runs]} mean {statistics.fmean(r[1] for r in runs):.2f}"
          f"  in target % {[r[2] for r in runs]}  longest idle wait ms {[r[3] for r in runs]}")
