"""Simulated replay on the shipped core profile under load: decode alone (separate) vs harvest, per seed.
Run from a tree (its harvest is what is measured): python loaded_cpu.py OUT.jsonl SPEC [SPEC ...]

Ran 2026-11-26 11:00-11:20 UTC at 1ae73fc and 4176e36. Since then it drives `harvest replay --simulate` and
reads its results.json (the schema: eval/README.md, "results.json") instead of the replay's classes; the
simulation is the same (one policy per run; the policies of one run never shared a device or a trace)."""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROFILE = "predictor/profiles/cpu-cores-smollm2-135m.json"


def replay(trace: str, policy: str, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "harvest.cli.main", "replay", "--simulate", "--profile", PROFILE,
                    "--trace", trace, "--max-context-tokens", "512", "--max-generated-tokens", "64",
                    "--tpot-ms", "300", "--latency-noise", "0.1", "--policy", policy, "--no-plots",
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["policies"][policy]


with open(sys.argv[1], "a") as out, tempfile.TemporaryDirectory() as work:
    for spec in sys.argv[2:]:
        for seed in range(4):
            started = time.time()
            row = {"trace": spec, "seed": seed}
            for name in ("separate", "harvest"):
                p = replay(f"{spec},duration=1200,seed={seed}", name, Path(work) / name)
                row[name] = {"attainment": p["decode"]["step_slo_attainment"], "mean_batch": p["decode"]["mean_batch_size"],
                             "num_steps": p["decode"]["num_steps"],
                             "decode_device_ft_tokens_per_s": p["finetune"]["decode_device_tokens_per_s"]}
            row["wall_s"] = round(time.time() - started, 1)
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
