"""The sweep's tables: per window and repeat, each row's tok/s and steps in target, the default over max(temporal,
pinned split), and the default's phases per split at that scale (its stats are the worker's life so far: the
difference from the scale run before it); then per window the medians over repeats, each row's A/A spread (its
largest repeat over its smallest, less 1) and a verdict: ahead where the default's median is at least the best
other row's, within noise where it is at least that over (1 + the larger A/A spread of the two rows: a gap no
larger than two runs of the same row can show), else behind. Usage: python sweep_table.py sweep.json"""
import json
import statistics
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
pct = lambda x: "-" if x is None else f"{100 * x:.2f} %"
print("| window | repeat | decode alone in target | default tok/s (in target) | temporal | pinned split | default / max | phases whole / (1, 1) |")
print("|---|---|---|---|---|---|---|---|")
for w in wins:
    for rep in reps:
        c = cells.get((w, rep))
        if not c:
            continue
        g = lambda row, k="finetune_tokens_per_s": c.get(row, {}).get(k)
        dflt, tmp, pin = g("harvest-default"), g("harvest-temporal"), g("two-process-pinned")
        best = max(x for x in (tmp, pin) if x is not None)
        ratio = dflt / best if dflt and best else None
        ph = g("harvest-default", "phases_here") or {}
        print(f"| {w} | {rep} | {pct(g('decode-alone', 'steps_within_target'))} | {dflt} ({pct(g('harvest-default', 'steps_within_target'))}) | {tmp} ({pct(g('harvest-temporal', 'steps_within_target'))}) | {pin} ({pct(g('two-process-pinned', 'steps_within_target'))}) | {ratio:.2f} | {ph.get('whole')} / {ph.get('1,1')} |")
print()
print("| window | default median tok/s (A/A spread) | temporal | pinned split | default / best median | default's fewest steps in target | verdict |")
print("|---|---|---|---|---|---|---|")
for w in wins:
    per_row = {}
    for row in ("harvest-default", "harvest-temporal", "two-process-pinned"):
        values = [cells[(w, rep)][row]["finetune_tokens_per_s"] for rep in reps
                  if (w, rep) in cells and row in cells[(w, rep)]]
        if values:
            per_row[row] = (statistics.median(values), max(values) / min(values) - 1)
    steps = min(cells[(w, rep)]["harvest-default"]["steps_within_target"] for rep in reps
                if "harvest-default" in cells.get((w, rep), {}))
    best_row = max((r for r in per_row if r != "harvest-default"), key=lambda r: per_row[r][0])
    best, spread = per_row[best_row][0], max(per_row[best_row][1], per_row["harvest-default"][1])
    ratio = per_row["harvest-default"][0] / best
    verdict = "ahead" if ratio >= 1 else ("within noise" if ratio >= 1 / (1 + spread) else "behind")
    show = lambda row: "-" if row not in per_row else f"{per_row[row][0]:.1f} ({100 * per_row[row][1]:.0f} %)"
    print(f"| {w} | {show('harvest-default')} | {show('harvest-temporal')} | {show('two-process-pinned')} | {ratio:.2f} | {pct(steps)} | {verdict} |")
