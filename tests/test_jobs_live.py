"""The job API on a real CPU worker (issue 33): bad submissions refused with nothing queued, two jobs training and
publishing under requests with one cancelled mid-way. (A kill -9 of a worker holding three jobs:
tests/test_jobs_restart.py.)"""

import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
import yaml
from conftest import free_port
from job_api import AUTH, TOKEN, TPOT_SLO_MS, job_yaml, jobs, submit, wait_for_job, worker_args

from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.replay.live_replay import LiveReplay
from harvest.worker.client import prefilled_request
from harvest.worker.process import WorkerProcess
from traces.trace_loader import load_trace

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("jobs-live")


@pytest.fixture(scope="module")
def worker(work):
    with WorkerProcess(worker_args(work, work / "jobs"), free_port(), free_port(), work / "worker.log").start() as w:
        yield w


def test_bad_submissions_are_refused_and_leave_the_set_as_it_was(worker, work):
    anchor = submit(worker, "anchor", job_yaml(work, "anchor"))
    assert anchor.status_code == 201, anchor.text
    short = submit(worker, "short", job_yaml(work, "short", max_steps=2), priority=5)
    assert short.status_code == 201, short.text
    wait_for_job(worker, "short", lambda j: j.get("state") == "finished", "the short job finishing")
    before = wait_for_job(worker, "anchor", lambda j: j.get("tokens", 0) > 0, "the anchor job training")

    good = job_yaml(work, "bad")
    changed = lambda key, value: yaml.safe_dump({**yaml.safe_load(good), key: value})
    cases = [  # (name, body, params, headers, status, fragment)
        ("syntax", "a: [1\n", {}, AUTH, 422, "yaml: not valid YAML"),
        ("unknown-key", changed("lora_rnk", 8), {}, AUTH, 422, "lora_rnk"),
        ("wrong-type", changed("lora_rank", "eight"), {}, AUTH, 422, "lora_rank"),
        ("unknown-model", changed("model_name_or_path", "/no/such/model"), {}, AUTH, 422, "/no/such/model"),
        ("past", good, {"deadline": "2020-01-01T00:00:00"}, AUTH, 422, "is in the past"),
        ("impossible", good, {"deadline": str(time.time() + 2)}, AUTH, 409, "at the measured"),
        ("huge", changed("cutoff_len", 10**8), {}, AUTH, 422, "cutoff_len: the job needs at least"),
        ("anchor", good, {}, AUTH, 409, "already exists"),
        ("oversized", "x: 1\n" * 20000, {}, AUTH, 413, "more than"),
        ("no-token", good, {}, {}, 401, "Authorization"),
        ("bad-token", good, {}, {"Authorization": "Bearer wrong"}, 401, "Authorization"),
        ("Bad/Name", good, {}, AUTH, 422, "name:"),
        ("orphan-tokens", good, {"deadline_tokens": 100}, AUTH, 422, "deadline_tokens: needs a deadline"),
    ]
    for name, body, params, headers, status, fragment in cases:
        response = httpx.post(f"{worker.admin_url}/harvest/jobs", params={"name": name, **params},
                              content=body.encode(), headers=headers, timeout=120)
        assert response.status_code == status, (name, response.text)
        assert fragment in response.json()["detail"], (name, response.text)
        assert "Traceback" not in response.text
    unknown = httpx.get(f"{worker.admin_url}/harvest/jobs/nope", timeout=60)
    assert unknown.status_code == 404 and "no job 'nope'" in unknown.json()["detail"]
    assert httpx.post(f"{worker.admin_url}/harvest/jobs/nope/pause", headers=AUTH, timeout=60).status_code == 404
    finished = httpx.post(f"{worker.admin_url}/harvest/jobs/short/pause", headers=AUTH, timeout=60)
    assert finished.status_code == 409 and "it is finished" in finished.json()["detail"]

    # The same through `harvest jobs`: a refusal is one line and exit 2, a list a line a job.
    bad = work / "bad.yaml"
    bad.write_text(changed("lora_rank", "eight"))
    cli = [sys.executable, "-m", "harvest.cli.main", "jobs"]
    refused = subprocess.run([*cli, "submit", str(bad), "--name", "via-cli", "--admin", worker.admin_url,
                              "--token", TOKEN], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("harvest jobs: error: the worker refused (422): lora_rank")
    listed = subprocess.run([*cli, "list", "--admin", worker.admin_url], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and [line.split()[:2] for line in listed.stdout.splitlines()] == [
        ["anchor", "running"], ["short", "finished"]], listed.stdout

    assert set(jobs(worker)) == {"anchor", "short"}
    assert sorted(p.name for p in (work / "jobs").glob("*.yaml")) == ["anchor.yaml", "short.yaml"]
    wait_for_job(worker, "anchor", lambda j: j["state"] == "running" and j["tokens"] > before["tokens"],
                 "the anchor job training on")
    assert httpx.delete(f"{worker.admin_url}/harvest/jobs/anchor", headers=AUTH, timeout=300).status_code == 200


def test_two_jobs_train_and_publish_and_one_is_cancelled_under_a_replay(worker, work):
    """Trace windows replayed back to back (harvest's live replay) from submission to after the cancel."""
    results, done = [], threading.Event()

    def replay():
        while not done.is_set():
            results.append(LiveReplay(worker.url, worker.admin_url, TPOT_SLO_MS, max_concurrency=8).run(
                load_trace("poisson:rate=4,duration=6,seed=3").cap_lengths(32, 16))["policies"]["live"]["decode"])

    replaying = threading.Thread(target=replay, daemon=True)
    replaying.start()
    try:
        for name in ("alpha", "beta"):
            response = submit(worker, name, job_yaml(work, name, publish_every_steps=5, save_steps=5),
                              publish_name=f"{name}-adapter")
            assert response.status_code == 201, response.text
            assert response.json()["adapter"] == f"{name}-adapter"
        for name in ("alpha", "beta"):
            wait_for_job(worker, name, lambda j: ((j.get("finetune") or {}).get("published") or {}).get("version", 0)
                         >= 1, f"job {name} publishing", timeout_s=300)

        cancelled = httpx.delete(f"{worker.admin_url}/harvest/jobs/alpha", headers=AUTH, timeout=300)
        assert cancelled.status_code == 200, cancelled.text
        alpha = cancelled.json()
        assert alpha["state"] == "cancelled" and alpha["finetune"]["state"] == "stopped"
        assert CheckpointStore(work / "out-alpha").latest() is not None  # written at the cancel
        assert "resident_bytes" not in alpha["finetune"] and "window" not in alpha["finetune"]  # memory returned
        beta_tokens = jobs(worker)["beta"]["tokens"]
        wait_for_job(worker, "beta", lambda j: j["state"] == "running" and j["tokens"] > beta_tokens,
                     "beta training after alpha's cancel")

        # The cancelled job's adapter stays loaded: a request naming it gets its last published version.
        named = {**prefilled_request([3, 4, 5, 6], 4, room=1), "lora_path": "alpha-adapter"}
        response = httpx.post(f"{worker.url}/generate", json=named, timeout=120)
        assert response.status_code == 200 and len(response.json()["output_ids"]) == 4, response.text
        metrics = httpx.get(f"{worker.admin_url}/metrics", timeout=60).text
        assert 'harvest_job_tokens{job="beta"}' in metrics and 'harvest_job_state{job="alpha",state="cancelled"} 1.0' \
            in metrics
    finally:
        done.set()
        replaying.join(150)
    assert results  # every window replayed, the last one finished after the cancel
    assert sum(r["num_tokens_returned"] for r in results) == sum(r["num_tokens_asked"] for r in results)
    assert [(r["num_failed_requests"], r["num_unfinished_requests"]) for r in results] == [(0, 0)] * len(results)
