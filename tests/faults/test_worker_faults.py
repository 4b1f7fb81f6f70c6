"""Faults of a running `harvest serve` with a LoRA job, measured: kill -9 of the whole tree then resume,
SIGTERM with requests in flight, kill -9 of the supervisor alone, the job crashing under load.

Four workers in a chain share one job's output_dir (each resumes what the one before left), so the
suite starts as few workers as the cases allow."""

import asyncio
import json
import re
import shutil
import signal
import socket
import threading
import time

import httpx
import psutil
import pytest
from conftest import free_port
from test_colocation_e2e import write_job

from faults.figures import record
from harvest.worker.client import generate_prefilled, read_stats, wait_for_stats
from harvest.worker.process import WorkerProcess

pytestmark = pytest.mark.sglang

SAVE_STEPS = 4
ORPHAN_BOUND_S = 30.0  # worker notices within 0.5 s; SGLang's drain loop checks every 5 s; checkpoint < 1 s
WORKER_FLAGS = ["--tpot-slo-ms", "500", "--max-total-tokens", "4096"]
NUM_REQUESTS, INPUT_LEN, MAX_NEW_TOKENS = 6, 64, 64


def start(tmp_path, model_dir, job, name, *extra) -> WorkerProcess:
    """Worker `name`, its temporary files (its supervisor's among them) in `temp_dir(tmp_path, name)`."""
    args = ["--model-path", str(model_dir), "--finetune", str(job), *WORKER_FLAGS, *extra]
    temp_dir(tmp_path, name).mkdir()
    return WorkerProcess(args, free_port(), free_port(), tmp_path / f"{name}.log",
                         env={"TMPDIR": str(temp_dir(tmp_path, name))}).start()


def temp_dir(tmp_path, name):
    return tmp_path / f"{name}-tmp"


def tree(worker: WorkerProcess) -> list[psutil.Process]:
    supervisor = psutil.Process(worker.proc.pid)
    return [supervisor, *supervisor.children(recursive=True)]


def wait_gone(processes: list[psutil.Process], timeout_s: float) -> tuple[float, list[psutil.Process]]:
    """Seconds until none of `processes` runs (a zombie holds no port or memory), and those still running."""
    started = time.monotonic()
    while True:
        alive = [p for p in processes if _is_running(p)]
        if not alive or time.monotonic() - started > timeout_s:
            return time.monotonic() - started, alive
        time.sleep(0.1)


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def logged_steps(output_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (output_dir / "finetune_log.jsonl").read_text().splitlines()]


def resumed_at_step(worker: WorkerProcess, timeout_s: float = 120.0) -> int:
    """The step the job resumed from, as the worker logs it once the job is built (after /health answers)."""
    deadline = time.monotonic() + timeout_s
    while not (match := re.search(r"finetune job resumed at step (\d+)", worker.log_path.read_text())):
        assert time.monotonic() < deadline, f"the job did not resume; log: {worker.log_path}"
        time.sleep(0.2)
    return int(match.group(1))


def checkpoint_steps(output_dir) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*"))


async def _request(client: httpx.AsyncClient, url: str, seed: int, i: int) -> tuple[dict, float]:
    """One decode request; returns its result and when it finished (monotonic s)."""
    input_ids = [(seed + 7 * i + j) % 500 + 3 for j in range(INPUT_LEN)]
    result = await generate_prefilled(client, url, input_ids, MAX_NEW_TOKENS, seed + i)
    return result, time.monotonic()


async def _burst(url: str, seed: int) -> list:
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(_request(client, url, seed, i) for i in range(NUM_REQUESTS)),
                                    return_exceptions=True)


def burst_in_background(url: str, seed: int) -> tuple[threading.Thread, list]:
    """Requests as a client sends them while the test does its fault; each result is (output, finished_s)
    or the exception it raised."""
    results = []
    thread = threading.Thread(target=lambda: results.extend(asyncio.run(_burst(url, seed))))
    thread.start()
    return thread, results


def is_training(stats: dict) -> bool:
    return stats["finetune"]["state"] in ("running", "waiting", "starved")


def num_completed(results) -> int:
    return sum(not isinstance(r, BaseException) and len(r[0]["output_ids"]) == MAX_NEW_TOKENS for r in results)


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_model_dir):
    tmp_path = tmp_path_factory.mktemp("faults")
    job = write_job(tmp_path, tiny_model_dir, max_steps=100_000, save_steps=SAVE_STEPS)
    return tmp_path, tiny_model_dir, job, tmp_path / "adapter"


@pytest.fixture(scope="module")
def killed_tree(chain):
    """W1: the job trains past a checkpoint, then every process of the tree gets SIGKILL at once."""
    tmp_path, model_dir, job, output_dir = chain
    worker = start(tmp_path, model_dir, job, "w1")
    wait_for_stats(worker.admin_url, lambda s: s["finetune"].get("step", 0) >= SAVE_STEPS + 2, "steps")
    processes = tree(worker)
    for process in processes:
        process.kill()
    worker.proc.wait()
    _, alive = wait_gone(processes, ORPHAN_BOUND_S)
    assert not alive
    return {"last_logged_step": logged_steps(output_dir)[-1], "checkpoints": checkpoint_steps(output_dir)}


@pytest.fixture(scope="module")
def resumed(chain, killed_tree):
    """W2: the same job with --finetune-resume."""
    tmp_path, model_dir, job, _ = chain
    worker = start(tmp_path, model_dir, job, "w2", "--finetune-resume")
    stats = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] != "starting", "the job built")
    yield worker, stats
    worker.stop(signal.SIGKILL)


def test_kill_9_of_the_tree_loses_at_most_one_checkpoint_interval(killed_tree, resumed):
    worker, stats = resumed
    assert is_training(stats), stats["finetune"]
    resumed_step = resumed_at_step(worker)
    lost = killed_tree["last_logged_step"] - resumed_step
    record("kill -9 of the whole tree, then --finetune-resume", steps_done=killed_tree["last_logged_step"],
           resumed_at_step=resumed_step, steps_lost=lost, checkpoint_interval=SAVE_STEPS)
    assert resumed_step == killed_tree["checkpoints"][-1]
    assert 0 <= lost <= SAVE_STEPS


@pytest.fixture(scope="module")
def sigterm_in_flight(chain, resumed):
    """W2 gets SIGTERM while a burst of requests is decoding."""
    _, _, _, output_dir = chain
    worker, _ = resumed
    processes = tree(worker)
    wait_for_stats(worker.admin_url, is_training, "the job running")
    thread, results = burst_in_background(worker.url, seed=100)
    wait_for_stats(worker.admin_url, lambda s: s["decode"]["decode_tokens"] > 0, "the burst decoding", 60)
    jobs_dirs_running = list(temp_dir(chain[0], "w2").glob("harvest-serve-*/jobs"))  # no --jobs-dir: the supervisor's
    started = time.monotonic()
    code = worker.stop(signal.SIGTERM, timeout_s=120)
    stop_s = time.monotonic() - started
    thread.join(60)
    gone_s, alive = wait_gone(processes, ORPHAN_BOUND_S)
    in_flight = sum(not isinstance(r, BaseException) and r[1] > started for r in results)
    return {"code": code, "results": results, "in_flight": in_flight, "stop_s": stop_s, "alive": alive,
            "gone_s": gone_s,
            "ports_free": is_port_free(worker.port) and is_port_free(worker.admin_port),
            "last_logged_step": logged_steps(output_dir)[-1], "checkpoints": checkpoint_steps(output_dir),
            "jobs_dirs_running": jobs_dirs_running, "serve_dirs_left": list(temp_dir(chain[0], "w2").glob("harvest-*"))}


def test_sigterm_with_requests_in_flight(sigterm_in_flight):
    r = sigterm_in_flight
    completed = num_completed(r["results"])
    record("SIGTERM with requests in flight", requests=NUM_REQUESTS, requests_in_flight_at_sigterm=r["in_flight"],
           requests_completed=completed,
           exit_code=r["code"], checkpoint_step=r["checkpoints"][-1], last_step=r["last_logged_step"],
           stop_s=round(r["stop_s"], 1), processes_left=len(r["alive"]), ports_free=r["ports_free"])
    assert completed == NUM_REQUESTS, r["results"]
    assert r["in_flight"] > 0, "every request finished before SIGTERM: nothing was in flight"
    assert r["code"] == 0
    assert r["checkpoints"][-1] == r["last_logged_step"], "the shutdown checkpoint is the last step"
    assert not r["alive"] and r["ports_free"]
    assert len(r["jobs_dirs_running"]) == 1 and not r["serve_dirs_left"], "the worker's own files are removed"


@pytest.fixture(scope="module")
def supervisor_killed(chain, sigterm_in_flight):
    """W3 resumes what SIGTERM saved, trains on, and its supervisor alone gets SIGKILL: the worker must
    notice, checkpoint the job and take its whole tree down."""
    tmp_path, model_dir, job, output_dir = chain
    worker = start(tmp_path, model_dir, job, "w3", "--finetune-resume")
    resumed_step = resumed_at_step(worker)
    wait_for_stats(worker.admin_url, lambda s: s["finetune"].get("step", 0) >= resumed_step + 1, "a step")
    processes = tree(worker)
    worker.proc.kill()
    worker.proc.wait()
    gone_s, alive = wait_gone(processes, ORPHAN_BOUND_S)
    return {"worker": worker, "resumed_step": resumed_step, "processes": processes, "alive": alive,
            "gone_s": gone_s, "ports_free": is_port_free(worker.port) and is_port_free(worker.admin_port),
            "last_logged_step": logged_steps(output_dir)[-1], "checkpoints": checkpoint_steps(output_dir)}


def test_sigterm_checkpoint_resumes_where_it_stopped(sigterm_in_flight, supervisor_killed):
    assert supervisor_killed["resumed_step"] == sigterm_in_flight["last_logged_step"]


def test_kill_9_of_the_supervisor_leaves_no_process(supervisor_killed):
    r = supervisor_killed
    record("kill -9 of the supervisor", processes=len(r["processes"]), processes_left=len(r["alive"]),
           all_gone_s=round(r["gone_s"], 1), bound_s=ORPHAN_BOUND_S, ports_free=r["ports_free"],
           checkpoint_step=r["checkpoints"][-1], last_step=r["last_logged_step"],
           steps_lost=r["last_logged_step"] - r["checkpoints"][-1])
    assert len(r["processes"]) >= 4, "supervisor, SGLang server, scheduler, detokenizer"
    assert not r["alive"], [p.pid for p in r["alive"]]
    assert r["ports_free"]
    assert "the supervisor" in r["worker"].log_path.read_text()
    assert r["checkpoints"][-1] == r["last_logged_step"], "the worker checkpointed the job before it stopped"


@pytest.fixture(scope="module")
def crashed_under_load(chain, supervisor_killed):
    """W4 resumes what the orphaned worker saved; under a burst its output_dir turns into a file, so the
    job's next write fails: a crash from outside, mid-run."""
    tmp_path, model_dir, job, output_dir = chain
    worker = start(tmp_path, model_dir, job, "w4", "--finetune-resume")
    wait_for_stats(worker.admin_url, is_training, "the job")
    thread, results = burst_in_background(worker.url, seed=200)
    wait_for_stats(worker.admin_url, lambda s: s["decode"]["decode_tokens"] > 0, "the burst decoding", 60)
    shutil.move(output_dir, tmp_path / "adapter-moved")
    output_dir.write_text("not a directory")
    deadline = time.monotonic() + 120
    while (failed := read_stats(worker.admin_url))["finetune"]["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.2)
    failed_s = time.monotonic()
    thread.join(300)
    in_flight = sum(not isinstance(r, BaseException) and r[1] > failed_s for r in results)
    after_crash = asyncio.run(_burst(worker.url, seed=300))  # and the requests that come after it
    yield worker, failed, results + after_crash, in_flight
    worker.stop(signal.SIGKILL)


def test_supervisor_kill_checkpoint_resumes_where_it_stopped(supervisor_killed, crashed_under_load):
    worker, *_ = crashed_under_load
    assert resumed_at_step(worker) == supervisor_killed["last_logged_step"]


def test_a_finetune_crash_fails_no_request(crashed_under_load):
    worker, failed, results, in_flight = crashed_under_load
    completed = num_completed(results)
    after = read_stats(worker.admin_url)
    record("finetune job crashes under load", requests=len(results), requests_in_flight_at_crash=in_flight,
           requests_failed=len(results) - completed,
           job_state=failed["finetune"]["state"], job_error=failed["finetune"]["error"],
           resident_bytes_reported=after["finetune"].get("resident_bytes"))
    assert failed["finetune"]["state"] == "failed", failed["finetune"]
    assert completed == len(results) == 2 * NUM_REQUESTS, results
    assert "resident_bytes" not in after["finetune"] and "resident_layers" not in after["finetune"]
