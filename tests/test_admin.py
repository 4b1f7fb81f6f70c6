"""The admin API and the step accounting behind it, without a worker."""

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from base.errors import HarvestError
from harvest.admin.admin_app import create_admin_app
from harvest.config import AdminConfig, ServeConfig
from harvest.finetune import FinetuneConfig
from harvest.runtime import HarvestRuntime
from harvest.step_stats import DecodeStep

REPO = Path(__file__).resolve().parents[1]


def make_runtime(window_steps=4) -> HarvestRuntime:
    return HarvestRuntime(ServeConfig(admin=AdminConfig(), stats_window_steps=window_steps))


def run_steps(runtime, latencies_ms, batch_size=3):
    for i, latency_ms in enumerate(latencies_ms):
        # A step launched latency_ms ago finishes now.
        start_s = time.perf_counter() - latency_ms / 1e3
        runtime.step_launched(DecodeStep(i, batch_size, kv_tokens=batch_size * 10, start_s=start_s))
        assert runtime.step_finished(i).latency_ms == pytest.approx(latency_ms, abs=0.5)


def test_window_percentiles_and_counters():
    runtime = make_runtime(window_steps=4)
    run_steps(runtime, [100.0, 1.0, 2.0, 3.0, 4.0])
    snapshot = runtime.stats_snapshot()["decode"]
    assert snapshot["decode_steps"] == 5
    assert snapshot["decode_tokens"] == 15
    assert snapshot["window_steps"] == 4  # the 100 ms step slid out
    assert snapshot["step_latency_ms_p50"] == pytest.approx(2.5, abs=0.5)
    assert snapshot["step_latency_ms_p99"] < 5
    assert runtime.stats_snapshot(window_steps=2)["decode"]["step_latency_ms_p50"] == pytest.approx(3.5, abs=0.5)


def test_unmatched_result_is_ignored():
    runtime = make_runtime()
    assert runtime.step_finished(forward_iter=42) is None
    assert runtime.stats_snapshot()["decode"]["decode_steps"] == 0


def test_admin_endpoints():
    runtime = make_runtime()
    run_steps(runtime, [5.0, 6.0])
    client = TestClient(create_admin_app(runtime))
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/harvest/stats").json()["decode"]["decode_steps"] == 2
    assert "harvest_decode_steps_total 2.0" in client.get("/metrics").text
    assert client.get("/harvest/stats", params={"window_steps": 0}).status_code == 422
    assert client.get("/harvest/stats", params={"window_steps": 10**6}).status_code == 422
    steps = client.get("/harvest/steps", params={"since": 1}).json()
    assert [r["seq"] for r in steps["steps"]] == [2] and steps["next"] == 2
    assert steps["steps"][0]["latency_ms"] == pytest.approx(6.0, abs=0.5)
    assert client.get("/harvest/steps", params={"since": 2}).json() == {"steps": [], "next": 2}
    assert client.get("/harvest/steps", params={"since": -1}).status_code == 422
    missing = client.get("/admin")
    assert missing.status_code == 404 and "/healthz" in missing.json()["detail"]


def test_an_error_in_a_stats_path_is_one_line_and_the_api_lives_on(monkeypatch):
    """A bug behind /harvest/stats answers 500 with its reason in one line (the log has the traceback); the
    next call and the other endpoints still answer."""
    runtime = make_runtime()
    run_steps(runtime, [5.0])
    client = TestClient(create_admin_app(runtime), raise_server_exceptions=False)
    real = runtime.stats_snapshot
    monkeypatch.setattr(runtime, "stats_snapshot", lambda window_steps=None: {"bad": 1 / 0})
    response = client.get("/harvest/stats")
    assert response.status_code == 500
    assert response.json()["detail"].startswith("GET /harvest/stats failed: ZeroDivisionError")
    monkeypatch.setattr(runtime, "stats_snapshot", real)
    assert client.get("/harvest/stats").json()["decode"]["decode_steps"] == 1
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_off_loopback_admin_needs_token(host):
    with pytest.raises(HarvestError, match="--admin-token"):
        AdminConfig(host=host)
    assert AdminConfig(host=host, token="s3cret").host == host


def test_loopback_admin_needs_no_token():
    for host in ["127.0.0.1", "localhost", "::1"]:
        assert AdminConfig(host=host).token is None


def test_a_pinned_partition_makes_a_cpu_worker_spatial_with_kv_lending():
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml"), tpot_slo_ms=100.0,
                         pinned_partition=(1, 1))
    runtime = HarvestRuntime(config)
    assert runtime.is_spatial and runtime.wants_kv_lending


@pytest.mark.parametrize(
    ("device", "profile", "is_spatial"),
    [
        ("cpu", "predictor/profiles/cpu-smollm2-135m.json", False),
        ("cpu", "predictor/profiles/synthetic-h100-llama3-8b.json", False),  # a GPU's co-run model on a CPU
        ("cuda", "predictor/profiles/cpu-smollm2-135m.json", False),  # a GPU, but no co-run model
        ("cuda", "predictor/profiles/synthetic-h100-llama3-8b.json", True),
    ],
)
def test_runtime_reads_its_profile_once_and_lends_kv_in_both_modes(device, profile, is_spatial, monkeypatch):
    """Spatial co-location needs a co-run profile of the device (a GPU's SMs; a CPU host's cores); both modes
    lend KV memory (the unit thread hands the job back between steps). Profile.load is wrapped to count
    the reads."""
    from predictor import Profile

    reads = []
    load = Profile.load.__func__
    monkeypatch.setattr(Profile, "load", classmethod(lambda cls, path, *a, **k: reads.append(str(path))
                                                     or load(cls, path, *a, **k)))
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig(device, yaml_path="job.yaml"), tpot_slo_ms=100.0,
                         profile_path=str(REPO / profile))
    runtime = HarvestRuntime(config)
    assert runtime.profile is not None and runtime.profile.device_name
    assert runtime.is_spatial is is_spatial and runtime.wants_kv_lending
    assert reads == [str(REPO / profile)], "the profile is read once at start-up"
    assert HarvestRuntime(ServeConfig(admin=AdminConfig(), profile_path=str(REPO / profile),
                                      tpot_slo_ms=100.0)).profile is None, "no job: no planner, no profile read"
    assert len(reads) == 1


def test_stats_with_a_nan_loss_answer_200_with_null():
    """Pins the 500 seen when a job's loss went NaN: JSON has no NaN, so every stats read failed."""
    from harvest.admin.admin_app import FiniteJSONResponse

    body = FiniteJSONResponse({"finetune": {"loss": float("nan"), "steps": [1.0, float("inf")], "step": 3}}).body
    assert json.loads(body) == {"finetune": {"loss": None, "steps": [1.0, None], "step": 3}}
