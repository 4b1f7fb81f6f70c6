"""The job API on a real CPU worker (issue 33): bad submissions refused with nothing queued, two jobs training and
publishing under requests with one cancelled mid-way, and a kill -9 of a worker holding three jobs."""

import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
import yaml
from conftest import free_port, kill_tree

from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.replay.live_replay import LiveReplay
from harvest.worker.client import prefilled_request, wait_for_stats
from harvest.worker.process import WorkerProcess
from traces.trace_loader import load_trace

pytestmark = pytest.mark.sglang

TOKEN = "jobs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TPOT_SLO_MS = 500.0


def job_yaml(work, name: str, **overrides) -> str:
    """A tiny job writing to its own output_dir; endless unless max_steps is given."""
    path = write_tiny_job(work, **{"max_steps": 100000, "output_dir": str(work / f"out-{name}"), **overrides})
    return path.read_text()


def worker_args(work, jobs_dir) -> list[str]:
    model = yaml.safe_load(job_yaml(work, "probe"))["model_name_or_path"]
    return ["--model-path", model, "--max-total-tokens", "4096", "--tpot-slo-ms", str(TPOT_SLO_MS),
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


def test_kill_9_and_restart_resumes_the_set_in_its_states(work):
    jobs_dir = work / "restart-jobs"
    args = worker_args(work, jobs_dir)
    first = WorkerProcess(args, free_port(), free_port(), work / "restart-1.log").start()
    try:
        for name, priority in (("run", 2), ("queue", 1), ("held", 0)):
            response = submit(first, name, job_yaml(work, name, save_steps=5), priority=priority)
            assert response.status_code == 201, response.text
        assert httpx.post(f"{first.admin_url}/harvest/jobs/held/pause", headers=AUTH, timeout=60).status_code == 200
        run = wait_for_job(first, "run", lambda j: (j.get("finetune") or {}).get("step", 0) >= 12,
                           "the running job past two checkpoints")
        time.sleep(2)  # the persister's period, so the record holds the latest tokens
    finally:
        kill_tree(first.proc.pid)
        first.stop(timeout_s=30)
    step_at_kill = run["finetune"]["step"]

    with WorkerProcess(args, free_port(), free_port(), work / "restart-2.log").start() as second:
        resumed = wait_for_job(second, "run", lambda j: j.get("state") == "running" and
                               (j.get("finetune") or {}).get("step") is not None, "the running job resumed")
        states = {name: job["state"] for name, job in jobs(second).items()}
        assert states == {"run": "running", "queue": "queued", "held": "paused"}
        assert resumed["finetune"]["step"] >= step_at_kill - 5  # at most one checkpoint interval (save_steps) lost
