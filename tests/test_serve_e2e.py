"""End to end: `harvest serve` runs a real SGLang decode worker (CPU, fake transfer) with harvest inside."""

import asyncio
import signal
import time

import httpx
import psutil
import pytest
from conftest import free_port

from harvest.worker.client import generate_prefilled, read_stats
from harvest.worker.process import WorkerProcess

pytestmark = pytest.mark.sglang

MAX_NEW_TOKENS = [5, 9, 16, 23]


def start_worker(model_dir, tmp_path, name) -> WorkerProcess:
    args = ["--model-path", str(model_dir), "--max-total-tokens", "4096"]
    return WorkerProcess(args, free_port(), free_port(), tmp_path / f"{name}.log").start()


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    worker = start_worker(tiny_model_dir, tmp_path_factory.mktemp("serve"), "worker")
    yield worker
    worker.stop()


async def _generate_concurrently(url: str, lengths: list[int]) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(
            *(generate_prefilled(client, url, list(range(3, 3 + 4 * (i + 1))), n, room=100 + i)
              for i, n in enumerate(lengths))
        )


def test_decode_steps_are_counted_by_harvest_inside_the_scheduler(worker):
    """harvest's in-process hook counts every decode step: decode tokens (sum of batch sizes) equal the
    tokens the requests got back less one each, exactly (a request's first token comes with its prefill,
    here the fake transfer's metadata; every later one from a decode forward), and steps lie between the
    longest request's decode tokens and the sum of all."""
    before = read_stats(worker.admin_url)["decode"]
    results = asyncio.run(_generate_concurrently(worker.url, MAX_NEW_TOKENS))
    after = read_stats(worker.admin_url)["decode"]

    assert [len(r["output_ids"]) for r in results] == MAX_NEW_TOKENS
    assert [r["meta_info"]["completion_tokens"] for r in results] == MAX_NEW_TOKENS
    num_decoded = sum(MAX_NEW_TOKENS) - len(MAX_NEW_TOKENS)
    assert after["decode_tokens"] - before["decode_tokens"] == num_decoded
    num_steps = after["decode_steps"] - before["decode_steps"]
    assert max(MAX_NEW_TOKENS) - 1 <= num_steps <= num_decoded
    assert after["step_latency_ms_p50"] > 0
    assert after["step_latency_ms_p99"] >= after["step_latency_ms_p50"]
    assert after["uptime_s"] > before["uptime_s"]


def test_an_idle_scheduler_waits_for_requests_off_the_interpreter_lock(worker):
    """With no decode batch and no finetune unit to run, the scheduler thread waits on its request sockets
    (request_wait.py) instead of spinning: the scheduler process uses under half a core while idle, where SGLang's
    spinning loop keeps one busy (and starves the process's other threads of the interpreter lock). A request
    still wakes it: the worker answers one after the idle spell."""
    scheduler = next(p for p in psutil.Process(worker.proc.pid).children(recursive=True)
                     if "sglang::scheduler" in " ".join(p.cmdline()))
    before, started = scheduler.cpu_times(), time.monotonic()
    time.sleep(3.0)
    after, elapsed = scheduler.cpu_times(), time.monotonic() - started
    busy_s = (after.user + after.system) - (before.user + before.system)
    assert busy_s < 0.5 * elapsed, f"the idle scheduler used {busy_s:.2f} s of CPU in {elapsed:.2f} s"
    results = asyncio.run(_generate_concurrently(worker.url, [4]))
    assert [len(r["output_ids"]) for r in results] == [4]


def test_metrics_and_admin_errors(worker):
    stats = read_stats(worker.admin_url)["decode"]
    metrics = httpx.get(f"{worker.admin_url}/metrics").text
    counted = [line for line in metrics.splitlines() if line.startswith("harvest_decode_steps_total ")]
    assert counted and float(counted[0].split()[1]) >= stats["decode_steps"]
    assert "harvest_step_latency_seconds_bucket" in metrics

    assert httpx.get(f"{worker.admin_url}/healthz").json() == {"status": "ok"}
    missing = httpx.get(f"{worker.admin_url}/harvest/nope")
    assert missing.status_code == 404 and "/harvest/stats" in missing.json()["detail"]
    bad_query = httpx.get(f"{worker.admin_url}/harvest/stats", params={"window_steps": "many"})
    assert bad_query.status_code == 422 and "window_steps" in str(bad_query.json()["detail"])
    windowed = httpx.get(f"{worker.admin_url}/harvest/stats", params={"window_steps": 1})
    assert windowed.status_code == 200 and windowed.json()["decode"]["window_steps"] == 1


def test_status_command_prints_the_stats_table(worker, harvest_cli):
    import subprocess

    out = subprocess.run([*harvest_cli, "status", "--admin", worker.admin_url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "decode_steps" in out.stdout and "step_latency_ms_p99" in out.stdout


def assert_stops_cleanly(worker: WorkerProcess, sig: signal.Signals) -> None:
    """SGLang ends its own drain by SIGKILLing its tree; harvest's supervisor must still exit 0 and
    leave no process behind."""
    tree = [psutil.Process(worker.proc.pid), *psutil.Process(worker.proc.pid).children(recursive=True)]
    assert len(tree) >= 3, "expected supervisor, SGLang server and its scheduler/detokenizer processes"
    assert asyncio.run(_generate_concurrently(worker.url, [4]))[0]["meta_info"]["completion_tokens"] == 4

    code = worker.stop(sig, timeout_s=90)

    assert code == 0
    assert worker.orphans == []
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_worker_stops_cleanly_on_sigint(worker):
    """On the module's worker, so it runs last. SIGTERM with requests in flight: tests/faults."""
    assert_stops_cleanly(worker, signal.SIGINT)
