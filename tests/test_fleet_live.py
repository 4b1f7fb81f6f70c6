"""Two `harvest serve --fleet` decode workers on one torchft lighthouse (issue 34): both train the job on their
own shard, their rounds average the adapter and each serves the averaged one under the job's name; a kill -9 of
one leaves the other serving and training; restarted, it takes the fleet's adapter from its peer and holds the
same adapter after its first round."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import psutil
import pytest
from conftest import free_port, kill_tree

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.worker.client import prefilled_request, read_stats, wait_for_stats
from harvest.worker.process import WorkerProcess, free_ports

pytestmark = pytest.mark.sglang

ADAPTER = "fleet-adapter"
ROUND_TOKENS = 1500  # the tiny job trains ~400 tokens a step: a round every few steps


def fleet_stats(worker) -> dict:
    return read_stats(worker.admin_url)["finetune"].get("fleet") or {}


def wait_for_fleet(worker, check, what: str, timeout_s: float = 240.0) -> dict:
    return wait_for_stats(worker.admin_url, lambda s: check(s["finetune"].get("fleet") or {}, s["finetune"]), what,
                          timeout_s=timeout_s)["finetune"]


def worker_process(work, lighthouse: str, index: int, incarnation: int,
                   ports: list[int] | None = None) -> WorkerProcess:
    job = write_tiny_job(work, max_steps=100000, output_dir=str(work / f"out-w{index}"), publish_every_steps=1,
                         publish_name=ADAPTER)
    args = ["--model-path", str(work / "tiny-llama-2l"), "--max-total-tokens", "4096", "--finetune", str(job),
            "--tpot-slo-ms", "500", "--fleet", lighthouse, "--replica-id", f"w{index}", "--fleet-shard", f"{index}/2",
            "--fleet-round-tokens", str(ROUND_TOKENS), "--no-finetune-compile"]
    log = work / f"w{index}-{incarnation}.log"
    port, admin_port = ports or free_ports(2)
    return WorkerProcess(args, port, admin_port, log)


def start_both(work, lighthouse: str) -> list[WorkerProcess]:
    """Workers 0 and 1 started side by side, so the first does not train alone through the second's start-up;
    if one fails to start, the other is stopped."""
    ports = free_ports(4)  # drawn at once: distinct, though no worker binds one before the others are drawn
    workers = [worker_process(work, lighthouse, index, 0, ports[2 * index:2 * index + 2]) for index in (0, 1)]
    with ThreadPoolExecutor(2) as pool:
        starts = [pool.submit(worker.start) for worker in workers]
    failed = [start.exception() for start in starts if start.exception() is not None]
    if failed:
        for worker in workers:
            worker.stop(timeout_s=60)
        raise failed[0]
    return workers


def same_adapter_at_one_round(a, b, timeout_s: float = 120.0) -> dict:
    """Poll both until they report the same last round; returns that round's stats of `a` (checksums equal)."""
    def both_at_one_round(fleet, _):
        other = fleet_stats(b)
        return fleet.get("round", 0) >= 1 and fleet["round"] == other.get("round") and \
            fleet["adapter_checksum"] == other["adapter_checksum"]

    return wait_for_fleet(a, both_at_one_round, "both workers holding one round's adapter", timeout_s)["fleet"]


def published_since(worker, fleet_round: int) -> dict:
    """Wait until the worker published the fleet's adapter of `fleet_round` or later; its publish stats."""
    return wait_for_fleet(worker, lambda _, job: ((job.get("published") or {}).get("fleet_round") or 0) >= fleet_round,
                          f"the fleet's adapter of round {fleet_round} or later published")["published"]


def served(worker) -> None:
    request = {**prefilled_request([3, 4, 5, 6], 4, room=7), "lora_path": ADAPTER}
    response = httpx.post(f"{worker.url}/generate", json=request, timeout=120)
    assert response.status_code == 200 and len(response.json()["output_ids"]) == 4, response.text


def test_two_workers_average_serve_the_fleets_adapter_and_one_rejoins_after_kill_9(tmp_path):
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=500, heartbeat_timeout_ms=2000)
    url = lighthouse.address()
    workers = []
    try:
        workers = start_both(tmp_path, url)
        w0, w1 = workers
        wait_for_fleet(w0, lambda f, _: f.get("members") == 2, "a round of both workers")
        # The first round, begun as the fleet forms, carries no tokens: wait for one this worker trained into.
        wait_for_fleet(w0, lambda f, _: f.get("tokens_contributed", 0) > 0, "a committed round with w0's tokens")
        same_adapter_at_one_round(w0, w1)
        status = subprocess.run([sys.executable, "-m", "harvest.cli.main", "status", "--admin", w0.admin_url,
                                 "--admin", w1.admin_url], capture_output=True, text=True, timeout=60, check=False)
        assert status.returncode == 0 and "harvest fleet: 2 workers" in status.stdout, status.stderr
        assert "w0" in status.stdout and "w1" in status.stdout
        for worker in workers:
            published = published_since(worker, 1)
            assert published["name"] == ADAPTER and published["error"] is None
            served(worker)

        kill_tree(w1.proc.pid)
        w1.stop(timeout_s=30)
        round_at_kill = fleet_stats(w0)["round"]
        after = wait_for_fleet(w0, lambda f, _: f["round"] >= round_at_kill + 3 and f["members"] == 1,
                               "the survivor's rounds going on alone")
        assert after["state"] == "running"
        served(w0)

        workers[1] = w1 = worker_process(tmp_path, url, 1, 1).start()
        wait_for_fleet(w1, lambda f, _: f.get("round", 0) > round_at_kill, "the restarted worker in a later round")
        same_adapter_at_one_round(w0, w1)
        published_since(w1, round_at_kill + 1)  # the restarted worker serves the fleet's adapter once it loaded one
        served(w1)
    finally:
        for worker in workers:
            worker.stop(timeout_s=60)
        lighthouse.shutdown()


def test_a_worker_of_another_job_is_refused_at_start_with_one_line(tmp_path):
    """The fleet's member trains another job (another fingerprint): `harvest serve --fleet` exits 2 with one
    line naming it, leaves no process, and the member's rounds go on."""
    import threading

    import torch
    from torchft._torchft import LighthouseServer

    from harvest.fleet import FleetSync, RoundPolicy

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=2000)
    member = FleetSync([torch.zeros(4)], RoundPolicy(every_tokens=1), lighthouse.address(), "other", timeout_s=30,
                       fingerprint=12345)
    stop, rounds = threading.Event(), []

    def train():
        while not stop.is_set():
            member.on_step_end(10)
            rounds.append(member.wait())
            # Back to back, rounds took a core from the worker starting beside them; 50 ms apart (under the
            # lighthouse's 200 ms join timeout) the joining worker's first quorum still has the member in it.
            stop.wait(0.05)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        job = write_tiny_job(tmp_path, max_steps=100000, output_dir=str(tmp_path / "out"))
        port = free_port()
        result = subprocess.run(
            [sys.executable, "-m", "harvest.cli.main", "serve", "--model-path", str(tmp_path / "tiny-llama-2l"),
             "--port", str(port), "--admin-port", str(free_port()), "--finetune", str(job), "--tpot-slo-ms", "500",
             "--fleet", lighthouse.address(), "--replica-id", "w0", "--fleet-shard", "0/2"],
            capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 2, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("harvest serve: error:")]
        assert len(errors) == 1 and "trains another job or base model" in errors[0], result.stderr[-3000:]
        assert not [p for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or [])]
        done = len(rounds)
        while len(rounds) < done + 3:  # the member's fleet goes on without it
            assert trainer.is_alive()
            stop.wait(0.1)
        assert rounds[-1].committed and rounds[-1].members == 1
    finally:
        stop.set()
        trainer.join(60)
        member.close()
        lighthouse.shutdown()
