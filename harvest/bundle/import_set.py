"""Record which distributions harvest imports at run time: a decode worker with a LoRA job inside it, and a
standalone finetune run, each under `python -X importtime` (PYTHONPROFILEIMPORTTIME reaches SGLang's
subprocesses too). The bundle carries what this finds, not what sglang declares.

Run: python -m harvest.bundle.import_set  (writes harvest/bundle/runtime_imports.json)

Deferred imports: the worker process only where the import set starts one.
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.worker.client import prefilled_request

RUNTIME_IMPORTS_FILE = Path(__file__).with_name("runtime_imports.json")
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s?( *)([\w.]+)\s*$")


def top_level_modules(log_text: str) -> set[str]:
    return {m.group(2).split(".")[0] for line in log_text.splitlines() if (m := IMPORT_LINE.match(line))}


def distributions_of(modules: set[str]) -> dict[str, str]:
    """Top-level module -> distributions that provide it, as installed here; stdlib modules drop out."""
    owners = importlib.metadata.packages_distributions()
    found = {}
    for module in sorted(modules):
        for dist in owners.get(module, []):
            found[_normalise(dist)] = importlib.metadata.version(dist)
    return found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_worker(work_dir: Path, env: dict) -> str:
    from harvest.worker.process import WorkerProcess, free_ports

    job = write_tiny_job(work_dir, max_steps=2, output_dir=str(work_dir / "adapter"))
    model_dir = work_dir / "tiny-llama-2l"
    port, admin_port = free_ports(2)
    worker = WorkerProcess(["--model-path", str(model_dir), "--finetune", str(job), "--tpot-slo-ms", "500",
                            "--max-total-tokens", "2048"], port, admin_port, work_dir / "worker.log", env=env)
    worker.start()
    try:
        deadline = time.monotonic() + 180
        room = 0
        while time.monotonic() < deadline and not (work_dir / "adapter" / "finetune_log.jsonl").exists():
            room += 1
            httpx.post(f"{worker.url}/generate", json=prefilled_request(list(range(3, 20)), 8, room),
                       timeout=120).raise_for_status()
    finally:
        worker.stop()
    return (work_dir / "worker.log").read_text()


def _record_finetune(work_dir: Path, env: dict) -> str:
    job = write_tiny_job(work_dir, max_steps=2, output_dir=str(work_dir / "alone"))
    out = subprocess.run([sys.executable, "-m", "harvest.cli.main", "finetune", str(job), "--quiet"],
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"finetune run failed: {out.stderr[-2000:]}")
    return out.stderr


def record() -> dict:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        logs = {"worker_with_lora_job": _record_worker(Path(tmp), env),
                "finetune_alone": _record_finetune(Path(tmp), env)}
    per_run = {name: sorted(top_level_modules(text)) for name, text in logs.items()}
    modules = set().union(*map(set, per_run.values()))
    return {
        "how": "python -m harvest.bundle.import_set: -X importtime over a CPU decode worker running a tiny "
               "LoRA job, and `harvest finetune` alone; modules mapped by importlib.metadata.packages_distributions",
        "python": sys.version.split()[0],
        "distributions": distributions_of(modules),
        "modules_per_run": per_run,
    }


if __name__ == "__main__":
    RUNTIME_IMPORTS_FILE.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RUNTIME_IMPORTS_FILE}")
