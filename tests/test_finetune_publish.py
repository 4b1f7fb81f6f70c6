"""Publishing the adapter being trained into the worker that trains it (issue 13): the YAML keys, SGLang's
LoRA flags set from the job, and a real CPU worker serving the published adapter by name."""

import os
import subprocess
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
import yaml
from conftest import free_port

from base.errors import HarvestError
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.finetune.publishing import split_harvest_keys
from harvest.replay.live_replay import LiveReplay
from harvest.step_stats import miss_cause
from harvest.worker.client import (
    prefilled_request,
    read_last_step_seq,
    read_stats,
    read_steps_since,
    wait_for_stats,
)
from harvest.worker.process import WorkerProcess
from traces.trace_loader import load_trace

ADAPTER_NAME = "tiny-live"
STATIC_ADAPTER = "harvest-tiny"
ADMIN_TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TPOT_SLO_MS = 500.0
PUBLISH_EVERY_STEPS = 20  # the tiny job makes ~100 optimizer steps a second on this CPU


@pytest.mark.parametrize("raw, message", [
    ({"publish_every_steps": 0}, "publish_every_steps: 0 must be an integer >= 1"),
    ({"publish_every_steps": "2"}, "publish_every_steps: '2' must be an integer >= 1"),
    ({"publish_name": " x"}, "publish_name: ' x' must be a non-empty name"),
])
def test_bad_publishing_keys_name_the_key(raw, message):
    with pytest.raises(HarvestError, match=message.replace("(", r"\(")):
        split_harvest_keys(raw)


def test_publishing_keys_are_taken_out_and_default_to_the_output_dir_name():
    rest, publishing = split_harvest_keys({"lora_rank": 4, "output_dir": "runs/my-job", "publish_every_steps": 3})
    assert rest == {"lora_rank": 4, "output_dir": "runs/my-job"}
    assert (publishing.every_steps, publishing.name) == (3, "my-job")
    assert split_harvest_keys({"lora_rank": 4})[1] is None


def test_serve_refuses_lora_flags_that_conflict_with_the_job(tmp_path, harvest_cli):
    job = write_tiny_job(tmp_path, publish_every_steps=2)
    result = subprocess.run([*harvest_cli, "serve", "--finetune", str(job), "--tpot-slo-ms", "500",
                             "--max-lora-rank", "2", "--port", str(free_port()), "--admin-port", str(free_port())],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "--max-lora-rank 2 is below the job's lora_rank 4" in result.stderr
    assert "Traceback" not in result.stderr


def test_publish_with_no_job_is_a_409_naming_the_problem():
    from fastapi.testclient import TestClient

    from harvest.admin.admin_app import create_admin_app
    from harvest.config import AdminConfig, ServeConfig
    from harvest.runtime import HarvestRuntime

    client = TestClient(create_admin_app(HarvestRuntime(ServeConfig(admin=AdminConfig()))))
    response = client.post("/harvest/finetune/publish")
    assert response.status_code == 409 and "runs no finetune job" in response.json()["detail"]


def test_publish_before_the_first_optimizer_step_is_refused(tmp_path):
    from harvest.colocation import FinetuneJob
    from harvest.finetune import FinetuneConfig
    from harvest.sglang.adapter_publisher import AdapterPublisher

    job = FinetuneJob(FinetuneConfig(yaml_path=str(write_tiny_job(tmp_path, publish_every_steps=2))))
    with pytest.raises(HarvestError, match="does not publish its adapter"):
        job.request_publish(1.0)
    job.start()
    assert job.wait_built(300) and job.state.value == "running", job.error
    job.publisher = AdapterPublisher(["http://127.0.0.1:1"], ADAPTER_NAME)  # refused before it is used
    with pytest.raises(HarvestError, match="no optimizer step yet: nothing to publish"):
        job.request_publish(1.0)


def test_a_publish_is_its_own_unit_after_the_step_that_reaches_every_n(tmp_path):
    """The snapshot is not hidden inside a training unit: after the optimizer step that reaches
    publish_every_steps the next unit is "publish", timed on its own, so the controller fits it in slack by
    its own estimate; it runs while paused too (a paused job still publishes on request)."""
    from harvest.colocation import FinetuneJob
    from harvest.colocation.finetune_job import PUBLISH_UNIT
    from harvest.finetune import FinetuneConfig
    from harvest.sglang.adapter_publisher import AdapterPublisher

    job = FinetuneJob(FinetuneConfig(yaml_path=str(write_tiny_job(tmp_path, publish_every_steps=2, max_steps=50))))
    job.start()
    assert job.wait_built(300) and job.state.value == "running", job.error
    job.publisher = AdapterPublisher(["http://127.0.0.1:1"], ADAPTER_NAME)  # nothing listens: the load fails
    kinds = []
    while job.engine.global_step < 2:
        kinds.append(job.run_unit().kind)
    assert PUBLISH_UNIT not in kinds and job.next_unit_kind() == PUBLISH_UNIT
    job.pause()
    assert job.has_ready_work()
    result = job.run_unit()
    assert result.kind == PUBLISH_UNIT and result.duration_ms > 0 and result.num_trained_tokens == 0
    assert job.publisher.stats()["version_requested"] == 1 and not job.has_ready_work()


def test_a_publish_asked_for_in_the_middle_of_an_optimizer_update_waits_for_its_last_part(tmp_path):
    """A bounded job's update is parts over its parameters; between two the adapter is neither step's. A
    publish asked for there, even while paused, runs the parts left first and then publishes that step."""
    import torch

    from harvest.colocation import FinetuneJob
    from harvest.colocation.finetune_job import PUBLISH_UNIT
    from harvest.finetune import FinetuneConfig
    from harvest.finetune.publishing import adapter_tensors
    from harvest.sglang.adapter_publisher import AdapterPublisher

    config = FinetuneConfig(yaml_path=str(write_tiny_job(tmp_path, publish_name=ADAPTER_NAME, max_steps=50)),
                            max_unit_ms=1e-6)
    job = FinetuneJob(config)
    job.start()
    assert job.wait_built(300) and job.state.value == "running", job.error
    job.publisher = AdapterPublisher(["http://127.0.0.1:1"], ADAPTER_NAME)  # nothing listens: the load fails
    published = []
    job.publisher.publish = lambda tensors, config, step, started, fleet_round: published.append((tensors, step))
    while job.engine.global_step < 1:
        job.run_unit()
    while not job.engine.is_mid_update:
        assert not job.run_unit().is_step_end
    job.pause()
    outcome = []

    def ask():  # the load itself fails (nothing listens): the request ends in that error, after the snapshot
        try:
            job.request_publish(2.0)
        except HarvestError as e:
            outcome.append(str(e))

    asker = threading.Thread(target=ask)
    asker.start()
    kinds = []
    while asker.is_alive():
        job.poll()
        if job.has_ready_work():
            kinds.append(job.run_unit().kind)
        else:
            time.sleep(0.005)
    asker.join()
    assert len(outcome) == 1 and "not published within" in outcome[0]
    assert kinds[-1] == PUBLISH_UNIT and set(kinds[:-1]) == {"optimizer"}
    assert len(published) == 1 and published[0][1] == job.engine.global_step == 2
    current = adapter_tensors(job.engine.peft_model)
    assert published[0][0].keys() == current.keys()
    assert all(torch.equal(published[0][0][k], current[k]) for k in current)
    job.poll()
    assert not job.has_ready_work()  # still paused


@pytest.fixture(scope="module")
def publishing_worker(tmp_path_factory):
    """One worker for the module: its job publishes ADAPTER_NAME, and an adapter trained beforehand on the same
    base (a few steps at a large LR, so B is far from 0) is served from SGLang's own `--lora-paths` beside it."""
    from harvest.finetune import FinetuneEngine

    work = tmp_path_factory.mktemp("publish")
    static = FinetuneEngine.from_yaml(write_tiny_job(work, max_steps=3, learning_rate=0.01,
                                                     output_dir=str(work / "static-adapter")))
    while not static.is_finished:
        static.run_step()
    static.close()
    job = write_tiny_job(work, max_steps=100000, publish_every_steps=PUBLISH_EVERY_STEPS,
                         publish_name=ADAPTER_NAME)
    args = ["--model-path", yaml.safe_load(job.read_text())["model_name_or_path"], "--max-total-tokens", "4096",
            "--finetune", str(job), "--tpot-slo-ms", str(TPOT_SLO_MS), "--admin-token", ADMIN_TOKEN,
            "--lora-paths", f"{STATIC_ADAPTER}={work / 'static-adapter'}", "--no-finetune-compile"]
    with WorkerProcess(args, free_port(), free_port(), work / "worker.log").start() as worker:
        yield worker


@pytest.mark.sglang
def test_an_adapter_from_lora_paths_is_served_beside_the_published_one(publishing_worker):
    """The adapter harvest's engine writes is one SGLang loads from disk (its checkpoint names, stacked into
    qkv_proj and gate_up_proj: tests/test_finetune_sglang_lora.py) and decodes with."""
    request = {**prefilled_request([3, 4, 5, 6, 7, 8], 12, room=5), "lora_path": STATIC_ADAPTER}
    response = httpx.post(f"{publishing_worker.url}/generate", json=request, timeout=120)
    assert response.status_code == 200, response.text
    result = response.json()
    assert len(result["output_ids"]) == result["meta_info"]["completion_tokens"] == 12
    log = publishing_worker.log_path.read_text()
    assert "loaded weights for target modules ['down_proj', 'gate_up_proj', 'o_proj', 'qkv_proj']" in log


@pytest.mark.sglang
def test_the_job_publishes_every_n_steps_and_requests_get_it_by_name(publishing_worker):
    worker = publishing_worker
    stats = wait_for_stats(worker.admin_url, lambda s: (s["finetune"].get("published") or {}).get("version", 0) >= 1,
                           "the first published adapter")
    published = stats["finetune"]["published"]
    assert published["name"] == ADAPTER_NAME and published["error"] is None
    assert published["step"] >= PUBLISH_EVERY_STEPS and published["step"] % PUBLISH_EVERY_STEPS == 0
    assert published["snapshot_ms"] > 0 and published["load_ms"] > 0

    request = {**prefilled_request([3, 4, 5, 6, 7, 8], 8, room=1), "lora_path": ADAPTER_NAME}
    response = httpx.post(f"{worker.url}/generate", json=request, timeout=120)
    assert response.status_code == 200, response.text
    assert len(response.json()["output_ids"]) == 8
    unknown = {**prefilled_request([3, 4, 5], 2, room=2), "lora_path": "no-such-adapter"}
    rejected = httpx.post(f"{worker.url}/generate", json=unknown, timeout=120)
    assert rejected.status_code == 400 and "never been loaded" in rejected.text
    metrics = httpx.get(f"{worker.admin_url}/metrics", timeout=60).text
    version_line = next(line for line in metrics.splitlines() if line.startswith("harvest_published_version "))
    assert float(version_line.split()[1]) >= 1
    assert 'harvest_publish_cost_seconds{part="load"}' in metrics


@pytest.mark.sglang
def test_pause_resume_and_admin_auth(publishing_worker):
    """The admin POSTs need the worker's token, as `Bearer <token>`; paused, the job runs no new unit."""
    base = f"{publishing_worker.admin_url}/harvest/finetune"
    assert httpx.post(f"{base}/pause").status_code == 401
    assert httpx.post(f"{base}/pause", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{base}/pause", headers={"Authorization": ADMIN_TOKEN}).status_code == 401
    assert httpx.post(f"{base}/explode", headers=AUTH).status_code == 404
    assert httpx.get(f"{base}/pause").status_code == 405

    paused = httpx.post(f"{base}/pause", headers=AUTH, timeout=60)
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    units = wait_for_stats(publishing_worker.admin_url, lambda s: s["finetune"]["state"] == "paused",
                           "pause")["finetune"]["num_units"]
    time.sleep(3)
    assert read_stats(publishing_worker.admin_url)["finetune"]["num_units"] <= units + 1  # one may have been running
    resumed = httpx.post(f"{base}/resume", headers=AUTH, timeout=60)
    assert resumed.status_code == 200 and resumed.json()["state"] in ("running", "waiting", "starved")
    wait_for_stats(publishing_worker.admin_url, lambda s: s["finetune"]["num_units"] > units + 1, "units after resume",
                   timeout_s=60)


@pytest.mark.sglang
def test_publish_on_request_serves_the_last_step(publishing_worker):
    worker = publishing_worker
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/pause", headers=AUTH, timeout=60).status_code == 200
    step = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "paused", "pause")["finetune"]["step"]
    before = httpx.get(f"{worker.admin_url}/harvest/stats", timeout=60).json()["finetune"]["published"]["version"]
    response = httpx.post(f"{worker.admin_url}/harvest/finetune/publish", headers=AUTH, timeout=300)
    assert response.status_code == 200, response.text
    published = response.json()
    assert published["version"] > before and published["error"] is None
    assert published["step"] == httpx.get(f"{worker.admin_url}/harvest/stats", timeout=60).json()["finetune"]["step"]
    assert published["step"] >= step
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/resume", headers=AUTH, timeout=60).status_code == 200


def pause_until_every_version_is_served(worker) -> dict:
    """Pause the job (no new version) and wait until the last version it asked for is loaded, then let
    one request through: SGLang's load and unload times are charged to the next decode step, its steps."""
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/pause", headers=AUTH, timeout=60).status_code == 200
    time.sleep(1.0)  # a unit already running when the pause came may end a step and publish once more
    published = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "paused"
                               and s["finetune"]["published"]["version"]
                               == s["finetune"]["published"]["version_requested"],
                               "pause, and the last version requested published")["finetune"]["published"]
    response = httpx.post(f"{worker.url}/generate", json=prefilled_request([3, 4, 5], 4, room=3), timeout=120)
    assert response.status_code == 200, response.text
    return published


@pytest.mark.sglang
def test_publishing_during_a_replay_is_charged_to_steps_within_the_target(publishing_worker):
    """The job publishes every PUBLISH_EVERY_STEPS optimizer steps while a trace is replayed and, beside it,
    requests name the adapter one after another: every version the job asked for is served or replaced by a
    newer one before it was sent, no request naming the adapter is refused while versions are replaced
    (lora_replace.py), SGLang's scheduler-thread time for the versions is charged to decode steps
    (step.publish_ms, part of idle_wait_ms), and steps are within the TPOT target by the rule of the other
    SLO tests (latency + finetune_ms + idle_wait_ms, >= 99%)."""
    worker = publishing_worker
    before = pause_until_every_version_is_served(worker)
    since = read_last_step_seq(worker.admin_url)
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/resume", headers=AUTH, timeout=60).status_code == 200
    replaying, statuses = threading.Event(), []

    def name_the_adapter():
        with httpx.Client(timeout=120) as client:
            while replaying.is_set():
                request = {**prefilled_request([3, 4, 5, 6], 4, room=10_000 + len(statuses)), "lora_path": ADAPTER_NAME}
                statuses.append(client.post(f"{worker.url}/generate", json=request).status_code)

    replaying.set()
    by_name = threading.Thread(target=name_the_adapter)
    by_name.start()
    try:
        LiveReplay(worker.url, worker.admin_url, TPOT_SLO_MS, max_concurrency=8).run(
            load_trace("poisson:rate=4,duration=8,seed=3").cap_lengths(32, 16))
        # Two versions served while requests name the adapter, however few steps a slow host trained in the
        # replay (2026-11-27: 17): one replaced by the next is what is checked.
        wait_for_stats(worker.admin_url, lambda s: s["finetune"]["published"]["num_published"]
                       >= before["num_published"] + 2, "two versions served while the adapter is named")
    finally:
        replaying.clear()
        by_name.join()
    after = pause_until_every_version_is_served(worker)
    steps = read_steps_since(worker.admin_url, since)
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/resume", headers=AUTH, timeout=60).status_code == 200

    requested = after["version_requested"] - before["version_requested"]
    served = after["num_published"] - before["num_published"]
    dropped = after["num_dropped"] - before["num_dropped"]
    failed = after["num_failed"] - before["num_failed"]
    errors = [line for line in worker.log_path.read_text().splitlines() if "publishing adapter" in line]
    assert failed == 0 and after["error"] is None, (before, after, errors[-3:])
    assert served + dropped == requested, (before, after)
    assert served >= 2, (before, after)
    assert len(statuses) >= 5 and set(statuses) == {200}, statuses
    charged_ms = sum(s["publish_ms"] for s in steps)
    assert charged_ms == pytest.approx(after["scheduler_ms_total"] - before["scheduler_ms_total"], abs=0.01)
    assert all(s["idle_wait_ms"] >= s["publish_ms"] for s in steps)
    # Whether the steps keep the target while versions load is `harvest bench slo --publish-every-steps`'s
    # measure; here: every miss has a cause, and none is the slice as the controller planned it.
    misses = [(miss_cause(s, TPOT_SLO_MS), s) for s in steps if miss_cause(s, TPOT_SLO_MS)]
    assert not [m for m in misses if m[0] == "slice"], misses
    assert len(steps) > 50


def test_publish_to_needs_a_job_and_an_http_url():
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig

    with pytest.raises(HarvestError, match="--publish-to needs --tpot-slo-ms"):
        ServeConfig(admin=AdminConfig(), publish_to=("http://127.0.0.1:30010",))
    with pytest.raises(HarvestError, match="--publish-to '127.0.0.1:30010' is not an http"):
        ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig(yaml_path="job.yaml"), tpot_slo_ms=100,
                    publish_to=("127.0.0.1:30010",))


@pytest.mark.sglang
def test_a_request_refused_for_its_adapter_does_not_hold_up_shutdown(publishing_worker):
    """The 400 for an unknown adapter (first test) left SGLang counting a request in flight, and its graceful
    shutdown waited for it until the supervisor's kill (refused_requests.py). Runs last: it stops the worker."""
    started = time.monotonic()
    publishing_worker.stop(timeout_s=60)
    assert time.monotonic() - started < 30, "SGLang's graceful shutdown waited for a request still counted in flight"
