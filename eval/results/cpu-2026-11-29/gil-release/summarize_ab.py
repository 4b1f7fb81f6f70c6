"""Per run of the cpp_wrapper A/B (one `harvest bench colocate` per row, folders NAME/logs/): the (1, 1) partition's
granted rate (the job's tokens over the time it held (1, 1), the worker's `co_run`), the replay's tok/s and steps in
target, decode's median step time per batch (the partition's steps), the co-run units' median times, the host probe.
`python summarize_ab.py AB_DIR > ab.json`"""
import json
import statistics
import sys
from pathlib import Path

rows = []
for run_json in sorted(Path(sys.argv[1]).glob("*.json")):
    name = run_json.stem
    bench = json.loads(run_json.read_text())
    run = bench["runs"][0]
    run_dir = next((Path(sys.argv[1]) / name / "logs").iterdir())
    steps = json.loads((run_dir / "steps-steady.json").read_text())
    by_batch = {}
    for s in steps:
        by_batch.setdefault(s["batch_size"], []).append(s["latency_ms"])
    entry = {"run": name, "row": run["row"], "finetune_tokens_per_s": run["finetune_tokens_per_s"],
             "steps_within_target": run["steps_within_target"], "host": run.get("host"),
             "decode_ms_p50_by_batch": {b: round(statistics.median(v), 1) for b, v in sorted(by_batch.items())
                                        if len(v) >= 5}}
    stats_path = run_dir / "worker_stats-steady.json"
    if stats_path.exists():
        colocation = json.loads(stats_path.read_text()).get("colocation", {})
        granted = colocation.get("co_run", {}).get("1,1")
        if granted:
            entry["granted_tokens_per_s"] = granted["tokens_per_s"]
        entry["co_run_unit_ms_p50"] = {k: v["co_run"]["p50"] for k, v in colocation.get("unit_ms", {}).items()
                                       if "co_run" in v}
    trainer_logs = sorted(run_dir.glob("trainer/**/trainer_log.jsonl"))
    if trainer_logs:
        entry["trainer_cumulative_tokens_per_s"] = json.loads(trainer_logs[0].read_text().splitlines()[-1]).get("throughput")
    rows.append(entry)
print(json.dumps(rows, indent=1))
