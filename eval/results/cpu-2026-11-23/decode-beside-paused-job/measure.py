"""Decode latency per batch size on the e2e test's conv slice: a worker with the LoRA job (KV lending on),
the same with --no-kv-lending, and a worker without a job; run one after another.
Usage (repo root): PYTHONPATH=$PWD .venv/bin/python eval/results/cpu-2026-11-23/decode-beside-paused-job/measure.py OUT_DIR"""
import json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from test_colocation_e2e import start_worker, write_job, replay_steps
from conftest import wait_for_stats
from harvest.models import ensure_embedded_model
tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
model_dir = ensure_embedded_model()
out = {}
for name, extra in [("lend", []), ("nolend", ["--no-kv-lending"]), ("solo", None)]:
    (tmp / name).mkdir(exist_ok=True)
    args = [] if extra is None else ["--finetune", str(write_job(tmp / name, model_dir)), "--tpot-slo-ms", "108", *extra]
    with start_worker(model_dir, tmp, name, *args) as w:
        if extra is not None:
            wait_for_stats(w.admin_url, lambda s: s["finetune"]["state"] == "running", "running")
        out[name] = replay_steps(w, 108)
(tmp / "lend.json").write_text(json.dumps(out))
for name, st in out.items():
    lat = np.array([s["latency_ms"] for s in st]); bs = np.array([s["batch_size"] for s in st])
    print(name, len(st), "bs mean %.2f" % bs.mean(), "over108 %d" % (lat > 108).sum(), "ft %.1f" % np.mean([s["finetune_ms"] for s in st]))
    for b in range(1, 9):
        m = bs == b
        if m.sum() >= 5:
            print("   bs %d n %4d p50 %6.1f p90 %6.1f p99 %6.1f" % (b, m.sum(), *np.percentile(lat[m], [50, 90, 99])))
