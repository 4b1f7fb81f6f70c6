"""before.jsonl / after.jsonl -> a table (printed and table.md): attainment and decode-device finetune tok/s."""
import json
rows = {t: [json.loads(l) for l in open(f"{t}.jsonl")] for t in ("before", "after")}
lines = ["| trace | seed | decode alone | harvest before | harvest after | ft tok/s before | ft tok/s after |",
         "|---|---|---|---|---|---|---|"]
for b, a in zip(rows["before"], rows["after"]):
    assert (b["trace"], b["seed"]) == (a["trace"], a["seed"])
    lines.append(f"| {b['trace']} | {b['seed']} | {b['separate']['attainment']*100:.2f} % | "
                 f"{b['harvest']['attainment']*100:.2f} % | {a['harvest']['attainment']*100:.2f} % | "
                 f"{b['harvest']['decode_device_ft_tokens_per_s']:.1f} | {a['harvest']['decode_device_ft_tokens_per_s']:.1f} |")
open("table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
