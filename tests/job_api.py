"""The job API's client side for the live tests of a CPU worker (tests/test_jobs_live.py,
tests/test_jobs_restart.py): a tiny job's YAML, the worker's flags, submit, list, wait."""

import httpx
import yaml

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.worker.client import wait_for_stats

TOKEN = "jobs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TPOT_SLO_MS = 500.0


def job_yaml(work, name: str, **overrides) -> str:
    """A tiny job writing to its own output_dir; endless unless max_steps is given."""
    path = write_tiny_job(work, **{"max_steps": 100000, "output_dir": str(work / f"out-{name}"), **overrides})
    return path.read_text()


def worker_args(work, jobs_dir) -> list[str]:
    model = yaml.safe_load(job_yaml(work, "probe"))["model_name_or_path"]
    return ["--model-path", model, "--max-total-tokens", "4096", "--tpot-slo-ms", str(TPOT_SLO_MS), "--no-finetune-compile",
            "--admin-token", TOKEN, "--jobs-dir", str(jobs_dir), "--job-quantum-s", "1",
            "--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", "all", "--lora-backend", "torch_native"]


def submit(worker, name: str, text: str, **params) -> httpx.Response:
    return httpx.post(f"{worker.admin_url}/harvest/jobs", params={"name": name, **params}, content=text.encode(),
                      headers=AUTH, timeout=120)


def jobs(worker) -> dict:
    return {job["name"]: job for job in httpx.get(f"{worker.admin_url}/harvest/jobs", timeout=60).json()["jobs"]}


def wait_for_job(worker, name: str, check, what: str, timeout_s: float = 240.0) -> dict:
    def holds(stats) -> bool:
        job = stats["jobs"]["jobs"].get(name) or {}
        assert job.get("state") != "failed", f"job {name} failed while waiting for {what}: {job['finetune']['error']}"
        return check(job)

    return wait_for_stats(worker.admin_url, holds, what, timeout_s=timeout_s)["jobs"]["jobs"][name]
