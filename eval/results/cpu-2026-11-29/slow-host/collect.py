"""Per replay in a `harvest bench colocate --log-dir` folder: finetune tok/s, steps in target, and decode's median
step time per batch size on the whole device and on a partition (from the worker's step records), plus the pinned
trainer's own cumulative throughput (LlamaFactory's trainer_log.jsonl). For runs whose bench was stopped before its
JSON: run from the checkout, `python collect.py LOG_DIR > runs.json`."""
import glob
import json
import statistics
import sys
from pathlib import Path


def decode_ms(steps: list[dict], batch: int, on_partition: bool) -> float | None:
    times = [s["latency_ms"] for s in steps if s["batch_size"] == batch and (s["ft_sms"] > 0) == on_partition]
    return round(statistics.median(times), 1) if times else None


def trainer_tokens_per_s(run_dir: Path) -> float | None:
    logs = sorted(run_dir.glob("trainer/**/trainer_log.jsonl"))
    if not logs:
        return None
    last = json.loads(logs[0].read_text().splitlines()[-1])
    return last.get("throughput")


runs = []
for run_dir in sorted(Path(sys.argv[1]).iterdir()):
    if not run_dir.is_dir():
        continue
    window, repeat, row = run_dir.name.split("-", 2)
    for replay_path in sorted(run_dir.glob("replay-*.json")):
        live = json.loads(replay_path.read_text())["policies"]["live"]
        steps = json.loads(replay_path.with_name(replay_path.name.replace("replay-", "steps-")).read_text())
        runs.append({
            "window": replay_path.stem.removeprefix("replay-"), "repeat": int(repeat), "row": row,
            "finetune_tokens_per_s": live["finetune"].get("tokens_per_s"),
            "steps_within_target": live["decode"]["step_slo_attainment"],
            "decode_ms_whole": {b: decode_ms(steps, b, False) for b in (1, 2, 4, 8)},
            "decode_ms_partition": {b: decode_ms(steps, b, True) for b in (1, 2, 4, 8)},
            "trainer_cumulative_tokens_per_s": trainer_tokens_per_s(run_dir),
        })
print(json.dumps(runs, indent=1))
