"""The sweep's table: per window and repeat, each row's tok/s and steps in target, the default over max(temporal,
pinned split), and the default's phases per split at that scale (its stats are the worker's life so far: the
difference from the scale run before it). Usage: python sweep_table.py sweep.json"""
import json
import sys

d = json.loads(open(sys.argv[1]).read())
runs = d["runs"]
cells = {}
prev = {}
for r in runs:
    if r["row"] == "harvest-default" and r.get("phases_per_split"):
        key = (r["window"].split("@")[0], r["repeat"])
        before = prev.get(key, {})
        r["phases_here"] = {k: v - before.get(k, 0) for k, v in r["phases_per_split"].items()}
        prev[key] = r["phases_per_split"]
for r in runs:
    cells.setdefault((r["window"], r["repeat"]), {})[r["row"]] = r
wins = sorted({w for w, _ in cells}, key=lambda w: (w.split("@")[0] != "steady", float(w.split("@")[1])))
reps = sorted({rep for _, rep in cells})
print("| window | repeat | decode alone in target | default tok/s (in target) | temporal | pinned split | default / max | phases whole / (1, 1) |")
print("|---|---|---|---|---|---|---|---|")
ratios = {}
for w in wins:
    for rep in reps:
        c = cells.get((w, rep))
        if not c: continue
        g = lambda row, k="finetune_tokens_per_s": c.get(row, {}).get(k)
        dflt, tmp, pin = g("harvest-default"), g("harvest-temporal"), g("two-process-pinned")
        best = max(x for x in (tmp, pin) if x is not None)
        ratio = dflt / best if dflt and best else None
        ratios.setdefault(w, []).append(ratio)
        ph = g("harvest-default", "phases_here") or {}
        pct = lambda x: None if x is None else f"{100*x:.2f} %"
        print(f"| {w} | {rep} | {pct(g('decode-alone','steps_within_target'))} | {dflt} ({pct(g('harvest-default','steps_within_target'))}) | {tmp} ({pct(g('harvest-temporal','steps_within_target'))}) | {pin} ({pct(g('two-process-pinned','steps_within_target'))}) | {ratio:.2f} | {ph.get('whole')} / {ph.get('1,1')} |")
print()
for w, rs in ratios.items():
    print(w, [round(x, 2) for x in rs])
