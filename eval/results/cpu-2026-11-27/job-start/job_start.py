"""Seconds from a CPU worker serving to its job running (an idle worker, no requests).

    python job_start.py WORK_DIR LABEL [harvest serve flags...]   (run from the checkout to measure)
"""
import json, sys, time
from pathlib import Path
import httpx, yaml
from harvest.models.tiny_llama import build_tiny_llama
from harvest.worker.process import WorkerProcess, free_ports
from harvest.finetune.demo.tiny_job import TINY_JOB

work = Path(sys.argv[1]); work.mkdir(parents=True, exist_ok=True)
model = work / "tiny" if (work / "tiny").exists() else build_tiny_llama(work / "tiny")
job = {**TINY_JOB, "model_name_or_path": str(model), "output_dir": str(work / "adapter"), "max_steps": 1000}
(work / "job.yaml").write_text(yaml.safe_dump(job))
args = ["--model-path", str(model), "--max-total-tokens", "16384", "--finetune", str(work / "job.yaml"), "--tpot-slo-ms", "300", *sys.argv[3:]]
t0 = time.monotonic()
with WorkerProcess(args, *free_ports(2), work / f"{sys.argv[2]}.log").start() as w:
    serving = time.monotonic()
    while True:
        s = httpx.get(f"{w.admin_url}/harvest/stats", timeout=60).json()
        if s["finetune"].get("state") == "running":
            break
        time.sleep(0.2)
    running = time.monotonic()
print(json.dumps({"label": sys.argv[2], "start_to_serving_s": round(serving - t0, 1), "serving_to_running_s": round(running - serving, 1), "start_to_running_s": round(running - t0, 1)}))
