"""Publishing the adapter being trained into the worker that trains it (issue 13): the YAML keys, SGLang's
LoRA flags set from the job, and a real CPU worker serving the published adapter by name."""

import os
import subprocess
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
import yaml
from conftest import free_port, wait_for_stats

from base.errors import HarvestError
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.finetune.publishing import split_harvest_keys
from harvest.worker.client import prefilled_request
from harvest.worker.process import WorkerProcess

ADAPTER_NAME = "tiny-live"


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
    job.publisher = AdapterPublisher("http://127.0.0.1:1", ADAPTER_NAME)  # refused before it is used
    with pytest.raises(HarvestError, match="no optimizer step yet: nothing to publish"):
        job.request_publish(1.0)


@pytest.fixture(scope="module")
def publishing_worker(tmp_path_factory):
    work = tmp_path_factory.mktemp("publish")
    job = write_tiny_job(work, max_steps=100000, publish_every_steps=2, publish_name=ADAPTER_NAME)
    args = ["--model-path", yaml.safe_load(job.read_text())["model_name_or_path"], "--max-total-tokens", "4096",
            "--finetune", str(job), "--tpot-slo-ms", "500"]
    with WorkerProcess(args, free_port(), free_port(), work / "worker.log").start() as worker:
        yield worker


@pytest.mark.sglang
def test_the_job_publishes_every_n_steps_and_requests_get_it_by_name(publishing_worker):
    worker = publishing_worker
    stats = wait_for_stats(worker.admin_url, lambda s: (s["finetune"].get("published") or {}).get("version", 0) >= 1,
                           "the first published adapter")
    published = stats["finetune"]["published"]
    assert published["name"] == ADAPTER_NAME and published["error"] is None
    assert published["step"] >= 2 and published["step"] % 2 == 0
    assert published["snapshot_ms"] > 0 and published["load_ms"] > 0

    # Paused, the job publishes no new version: a version's replacement leaves a gap in which SGLang does
    # not know the name (unload, then load), and a request must not fall into it here.
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/pause", timeout=60).status_code == 200
    wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "paused"
                   and s["finetune"]["published"]["version"] == s["finetune"]["published"]["version_requested"],
                   "pause, and the last version requested published")
    request = {**prefilled_request([3, 4, 5, 6, 7, 8], 8, room=1), "lora_path": ADAPTER_NAME}
    response = httpx.post(f"{worker.url}/generate", json=request, timeout=120)
    assert response.status_code == 200, response.text
    assert len(response.json()["output_ids"]) == 8
    unknown = {**prefilled_request([3, 4, 5], 2, room=2), "lora_path": "no-such-adapter"}
    assert httpx.post(f"{worker.url}/generate", json=unknown, timeout=120).status_code == 400
    metrics = httpx.get(f"{worker.admin_url}/metrics", timeout=60).text
    version_line = next(line for line in metrics.splitlines() if line.startswith("harvest_published_version "))
    assert float(version_line.split()[1]) >= 1
    assert 'harvest_publish_cost_seconds{part="load"}' in metrics


@pytest.mark.sglang
def test_publish_on_request_serves_the_last_step(publishing_worker):
    worker = publishing_worker
    step = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "paused", "pause")["finetune"]["step"]
    before = httpx.get(f"{worker.admin_url}/harvest/stats", timeout=60).json()["finetune"]["published"]["version"]
    response = httpx.post(f"{worker.admin_url}/harvest/finetune/publish", timeout=300)
    assert response.status_code == 200, response.text
    published = response.json()
    assert published["version"] > before and published["error"] is None
    assert published["step"] == httpx.get(f"{worker.admin_url}/harvest/stats", timeout=60).json()["finetune"]["step"]
    assert published["step"] >= step
    assert httpx.post(f"{worker.admin_url}/harvest/finetune/resume", timeout=60).status_code == 200


@pytest.mark.sglang
def test_a_request_refused_for_its_adapter_does_not_hold_up_shutdown(publishing_worker):
    """The 400 for an unknown adapter (first test) left SGLang counting a request in flight, and its graceful
    shutdown waited for it until the supervisor's kill (refused_requests.py). Runs last: it stops the worker."""
    started = time.monotonic()
    publishing_worker.stop(timeout_s=60)
    assert time.monotonic() - started < 30, "SGLang's graceful shutdown waited for a request still counted in flight"
