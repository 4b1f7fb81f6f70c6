"""Interleaved A/B: one worker with the job; pause/resume every PERIOD s while replaying; compare decode
latency per batch size in paused vs running phases (same noise for both).
Usage (repo root): PYTHONPATH=$PWD .venv/bin/python eval/results/cpu-2026-11-23/decode-beside-paused-job/pause_ab.py OUT_DIR PERIOD_S REPEATS"""
import json, sys, threading, time
from pathlib import Path
import httpx, numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from test_colocation_e2e import start_worker, write_job, replay_steps, conv_slice
from conftest import wait_for_stats
from harvest.models import ensure_embedded_model
from harvest.worker.client import read_stats, read_last_step_seq, read_steps_since
from harvest.replay.live_replay import LiveReplay

tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
period = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
model_dir = ensure_embedded_model()
job = write_job(tmp, model_dir)
phases = []
with start_worker(model_dir, tmp, "colo", "--finetune", str(job), "--tpot-slo-ms", "108") as w:
    wait_for_stats(w.admin_url, lambda s: s["finetune"]["state"] == "running", "the job running")
    base = f"{w.admin_url}/harvest/finetune"
    stop = threading.Event()
    def toggle():
        paused = False
        while not stop.is_set():
            phases.append((time.time(), paused))
            stop.wait(period)
            paused = not paused
            httpx.post(f"{base}/{'pause' if paused else 'resume'}")
    since = read_last_step_seq(w.admin_url)
    th = threading.Thread(target=toggle); th.start()
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
        LiveReplay(w.url, w.admin_url, 108, max_concurrency=16).run(conv_slice())
    stop.set(); th.join()
    steps = read_steps_since(w.admin_url, since)
    stats = read_stats(w.admin_url)
(tmp / "ab.json").write_text(json.dumps({"phases": phases, "steps": steps}))
def phase_of(t):
    p = None
    for t0, paused in phases:
        if t0 + 0.3 <= t: p = paused   # skip the 0.3 s after a toggle
    return p
rows = {True: [], False: []}
for s in steps:
    p = phase_of(s["end_s"] - s["latency_ms"] / 1e3)
    if p is not None: rows[p].append(s)
for paused, st in rows.items():
    lat = np.array([s["latency_ms"] for s in st]); bs = np.array([s["batch_size"] for s in st])
    print("paused" if paused else "running", len(st), "bs mean %.2f" % bs.mean(), "ft_ms mean %.1f" % np.mean([s["finetune_ms"] for s in st]))
    for b in range(1, 8):
        m = bs == b
        if m.sum() >= 5:
            print("   bs %d n %4d p50 %6.1f p90 %6.1f p99 %6.1f max %6.1f" % (b, m.sum(), *np.percentile(lat[m], [50, 90, 99, 100])))
print(json.dumps(stats["colocation"]["reaction"]), stats["colocation"]["units_in_slack"], stats["colocation"]["units_idle"])
