"""Share of the slack the slices used, on whole-device steps: sum(slice ms) / sum(300 ms - step - idle wait),
per run, row and scale; and the steps over 300 ms with a slice in them.
Usage: python3 slack_use.py LOG_ROOT RUN... (LOG_ROOT/logs-RUN/steady-0-ROW/steps-steady@SCALE.json)."""
import json
import sys

root, runs = sys.argv[1], sys.argv[2:]
for run in runs:
    out = []
    for row in ("harvest-default", "harvest-temporal"):
        for scale in ("0.3", "0.5"):
            steps = json.load(open(f"{root}/logs-{run}/steady-0-{row}/steps-steady@{scale}.json"))
            whole = [s for s in steps if s.get("infer_sms") in (None, 2)]
            slack = sum(max(0.0, 300 - s["latency_ms"] - s["idle_wait_ms"]) for s in whole)
            used = sum(s["finetune_ms"] for s in whole)
            over = [s for s in steps if s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] > 300]
            out.append(f"{row[8:12]}@{scale} {used / slack if slack else 0:.2f} ({len(whole)} steps, "
                       f"{len(over)} over, {sum(1 for s in over if s['finetune_ms'] > 0)} with a slice)")
    print(run, " | ".join(out))
