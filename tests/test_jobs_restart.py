"""The job API on a real CPU worker (issue 33): a kill -9 of a worker holding three jobs, restarted on the same
jobs dir. Its own module so that no other test's worker trains beside its two start-ups."""

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
from conftest import free_port, kill_tree
from job_api import AUTH, job_yaml, jobs, submit, wait_for_job, worker_args

from harvest.worker.process import WorkerProcess

pytestmark = pytest.mark.sglang


def test_kill_9_and_restart_resumes_the_set_in_its_states(tmp_path):
    jobs_dir = tmp_path / "restart-jobs"
    args = worker_args(tmp_path, jobs_dir)
    first = WorkerProcess(args, free_port(), free_port(), tmp_path / "restart-1.log").start()
    try:
        for name, priority in (("run", 2), ("queue", 1), ("held", 0)):
            response = submit(first, name, job_yaml(tmp_path, name, save_steps=5), priority=priority)
            assert response.status_code == 201, response.text
        assert httpx.post(f"{first.admin_url}/harvest/jobs/held/pause", headers=AUTH, timeout=60).status_code == 200
        run = wait_for_job(first, "run", lambda j: (j.get("finetune") or {}).get("step", 0) >= 12,
                           "the running job past two checkpoints")
        time.sleep(2)  # the persister's period, so the record holds the latest tokens
    finally:
        kill_tree(first.proc.pid)
        first.stop(timeout_s=30)
    step_at_kill = run["finetune"]["step"]

    with WorkerProcess(args, free_port(), free_port(), tmp_path / "restart-2.log").start() as second:
        resumed = wait_for_job(second, "run", lambda j: j.get("state") == "running" and
                               (j.get("finetune") or {}).get("step") is not None, "the running job resumed")
        states = {name: job["state"] for name, job in jobs(second).items()}
        assert states == {"run": "running", "queue": "queued", "held": "paused"}
        assert resumed["finetune"]["step"] >= step_at_kill - 5  # at most one checkpoint interval (save_steps) lost
