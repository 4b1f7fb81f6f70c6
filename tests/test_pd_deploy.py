"""Acceptance (issue 14): a real PD deployment on one CPU host. A plain SGLang prefill worker, `harvest serve`
as the decode worker with a finetune job inside, and sglang-router; mooncake moves the KV over TCP.
Greedy outputs through the router equal a plain (non-PD) SGLang server's, token for token, also when the
burst's KV must come back from the job's lent chunks; a request naming the adapter the job publishes (into
both workers) equals PEFT's greedy output offline from the same adapter tensors on the same base; a prefill worker lost mid-run fails requests with a
clear error while the decode worker keeps serving and stops cleanly.

One deployment is shared by the module's cases (about a minute and a half to start on 2 cores)."""

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from test_kv_lending_e2e import write_job

from base.cuda_driver import ensure_driver_or_stub
from base.system_libs import library_path_with_system_libs
from harvest.deploy import DeployConfig, PDDeployment
from harvest.deploy.pd_deployment import free_deploy_ports, prefill_lora_flags
from harvest.sglang.launcher import CPU_ENGINE_ENV, host_flags
from harvest.worker.client import (
    generate,
    generate_request,
    prefilled_request,
    read_stats,
    wait_for_stats,
)
from harvest.worker.process import WorkerProcess, free_ports

pytestmark = pytest.mark.sglang

# As in test_kv_lending_e2e: 64 KiB blocks give the tiny Llama chunks of 1024 slots, 8192 tokens give 9
# chunks and the job's window takes the top two; the burst needs more than the unlent chunks hold.
MAX_TOTAL_TOKENS = 8192
DECODE_FLAGS = ["--kv-block-kib", "64", "--num-reserved-decode-tokens", "16"]
PROMPTS = [[3 + (5 * i + j) % 300 for j in range(8 + 9 * i)] for i in range(4)]
PROMPT_NEW_TOKENS = 12
NUM_BURST, BURST_INPUT_LEN, BURST_NEW_TOKENS = 7, 1100, 16
BURST = [[(7 * i + j) % 500 + 3 for j in range(BURST_INPUT_LEN)] for i in range(NUM_BURST)]
ADAPTER_NAME = "pd-live"
# Every published version has a checkpoint of the same step (save_steps), whose adapter PEFT loads offline.
PUBLISH_EVERY_STEPS = 200


async def generate_all(url: str, prompts: list[list[int]], max_new_tokens: int,
                       as_replay_sends: bool = False) -> list[list[int]]:
    """Greedy outputs of all prompts at once; `as_replay_sends`: the body `harvest replay` sends (with fake
    bootstrap fields, which a router must overwrite with its prefill worker's)."""
    def body(i, prompt):
        if as_replay_sends:
            return prefilled_request(prompt, max_new_tokens, room=i)
        return generate_request(prompt, max_new_tokens)

    async with httpx.AsyncClient(timeout=300) as client:
        replies = await asyncio.gather(*(generate(client, url, body(i, p)) for i, p in enumerate(prompts)))
    return [reply["output_ids"] for reply in replies]


def process_env() -> dict[str, str]:
    ensure_driver_or_stub()
    return {"LD_LIBRARY_PATH": library_path_with_system_libs(os.environ.get("LD_LIBRARY_PATH", ""))}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """Greedy outputs of a plain SGLang server (no PD, no harvest) on the same model and CPU flags."""
    is_cpu_host = ensure_driver_or_stub()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_model_dir),
               "--host", "127.0.0.1", "--max-total-tokens", str(MAX_TOTAL_TOKENS)]
    for flag, values in host_flags(is_cpu_host).items():
        command += [flag, *values]
    plain = WorkerProcess([], free_ports(1)[0], 0, tmp_path_factory.mktemp("plain") / "plain.log",
                          command=command, env={**process_env(), **(CPU_ENGINE_ENV if is_cpu_host else {})})
    with plain:
        prompts = asyncio.run(generate_all(plain.url, PROMPTS, PROMPT_NEW_TOKENS))
        burst = asyncio.run(generate_all(plain.url, BURST, BURST_NEW_TOKENS))
    return {"prompts": prompts, "burst": burst}


@pytest.fixture(scope="module")
def deployment(tiny_model_dir, tmp_path_factory, reference):
    tmp = tmp_path_factory.mktemp("pd")
    job = write_job(tmp, tiny_model_dir)
    job.write_text(yaml.safe_dump({**yaml.safe_load(job.read_text()), "publish_every_steps": PUBLISH_EVERY_STEPS,
                                   "publish_name": ADAPTER_NAME, "save_steps": PUBLISH_EVERY_STEPS}))
    ports = free_deploy_ports()
    config = DeployConfig(
        model_path=str(tiny_model_dir), log_dir=tmp, router_port=ports[0], router_metrics_port=ports[1],
        prefill_port=ports[2], bootstrap_port=ports[3], decode_port=ports[4], admin_port=ports[5],
        first_transfer_port=ports[6], max_total_tokens=MAX_TOTAL_TOKENS,
        serve_args=(*DECODE_FLAGS, "--finetune", str(job), "--tpot-slo-ms", "500", "--no-finetune-compile"),
    )
    config = dataclasses.replace(config, prefill_lora_flags=prefill_lora_flags(config.serve_args, is_cpu_host=True))
    deployment = PDDeployment(config, ensure_driver_or_stub(), process_env()).start()
    yield deployment
    deployment.stop()


def test_router_output_equals_plain_sglang_with_a_finetune_job(deployment, reference):
    """Prompts are prefilled by the prefill worker, their KV moves over mooncake's TCP transport, and harvest's
    decode worker (finetune job training) decodes them: the same tokens as plain SGLang. The decode worker's
    own step counter shows the requests went through it. The replay's body (fake bootstrap fields) gives the
    same tokens too: the router replaced the fields, or decode would have run on a fake prefill."""
    before = wait_for_stats(deployment.admin_url, lambda s: s["finetune"].get("step", 0) >= 2, "finetune steps")
    outputs = asyncio.run(generate_all(deployment.url, PROMPTS, PROMPT_NEW_TOKENS))
    as_replay = asyncio.run(generate_all(deployment.url, PROMPTS, PROMPT_NEW_TOKENS, as_replay_sends=True))
    assert [len(o) for o in outputs] == [PROMPT_NEW_TOKENS] * len(PROMPTS)
    assert outputs == reference["prompts"]
    assert as_replay == reference["prompts"]
    # A response can reach the client before the hook has recorded the step that produced its last token.
    expected = before["decode"]["decode_tokens"] + 2 * len(PROMPTS) * (PROMPT_NEW_TOKENS - 1)
    after = wait_for_stats(deployment.admin_url, lambda s: s["decode"]["decode_tokens"] >= expected,
                           "the decode steps of both rounds", timeout_s=30)
    assert after["decode"]["decode_tokens"] >= expected
    assert after["finetune"]["step"] > before["finetune"]["step"], "the job stopped training"


def test_burst_through_the_router_reclaims_lent_chunks_with_exact_outputs(deployment, reference):
    """Long prompts arrive while the job's weight window holds lent KV chunks: the decode worker pre-allocates
    KV for each transfer, which needs the lent chunks back. Zero failed requests, outputs equal plain SGLang
    (as `--no-kv-lending` does, tests/test_kv_lending_e2e.py), and the job trains on."""
    before = wait_for_stats(deployment.admin_url, lambda s: s["memory"]["chunks_lent"] > 0, "a lent chunk")
    outputs = asyncio.run(generate_all(deployment.url, BURST, BURST_NEW_TOKENS))
    time.sleep(1.0)  # the lender's stats copy refreshes every 0.5 s
    after = read_stats(deployment.admin_url)
    memory = after["memory"]
    top_chunk_first_slot = (memory["chunks_total"] - 2) * 1024
    assert NUM_BURST * (BURST_INPUT_LEN + BURST_NEW_TOKENS) > top_chunk_first_slot, "the burst must reach lent chunks"
    assert memory["num_reclaimed_chunks"] > before["memory"]["num_reclaimed_chunks"], f"nothing reclaimed: {memory}"
    assert outputs == reference["burst"]
    assert after["finetune"]["state"] in ("running", "waiting", "starved")
    after_job = wait_for_stats(deployment.admin_url, lambda s: s["finetune"]["step"] > before["finetune"]["step"],
                               "the job to train after the burst", timeout_s=120)
    assert after_job["finetune"]["state"] != "failed"


def test_live_replay_through_the_router(deployment, tmp_path, harvest_cli):
    """`harvest replay --target ROUTER --admin DECODE_ADMIN` is a real PD replay: every request is prefilled,
    transferred and decoded (all tokens back, none failed), and the steps and the job's progress come from
    harvest's decode worker: its own step records, read here apart from the replay, account for every token
    and give the report's attainment. (The replay's logic without SGLang: tests/test_replay_live.py.)"""
    import json
    import subprocess

    import numpy as np

    from harvest.worker.client import read_steps_since
    from traces.trace_loader import load_trace

    trace_name, max_context, max_generated, tpot_ms = "poisson:rate=2,duration=3,seed=1", 64, 8, 500
    expected = load_trace(trace_name).cap_lengths(max_context, max_generated)
    wait_for_stats(deployment.admin_url, lambda s: s["finetune"].get("step", 0) >= 1, "the first finetune step")
    before = read_stats(deployment.admin_url)["decode"]
    since = before["decode_steps"]
    out = tmp_path / "replay"
    proc = subprocess.run([*harvest_cli, "replay", "--trace", trace_name, "--max-context-tokens", str(max_context),
                           "--max-generated-tokens", str(max_generated), "--concurrency", "4",
                           "--tpot-ms", str(tpot_ms), "--target", deployment.url, "--admin", deployment.admin_url,
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    decoded = expected.num_generated_tokens - expected.num_requests
    wait_for_stats(deployment.admin_url, lambda s: s["decode"]["decode_tokens"] >= before["decode_tokens"] + decoded,
                   "the replay's last steps recorded", timeout_s=30)
    steps = read_steps_since(deployment.admin_url, since)
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "live" and results["target"] == deployment.url
    live = results["policies"]["live"]
    decode = live["decode"]
    assert decode["num_requests"] == expected.num_requests > 0 and decode["num_failed_requests"] == 0
    assert decode["num_unfinished_requests"] == 0
    assert decode["num_tokens_returned"] == decode["num_tokens_asked"] == expected.num_generated_tokens
    # Steps decode every token but each request's first, which comes with its prefill.
    assert decode["num_tokens"] == sum(s["batch_size"] for s in steps) == decoded
    assert decode["num_steps"] == len(steps)
    within = [s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] <= tpot_ms for s in steps]
    assert decode["step_slo_attainment"] == pytest.approx(sum(within) / len(within))
    assert 0 < decode["tpot_ms_p50"] <= decode["tpot_ms_p90"] <= decode["tpot_ms_p99"]
    assert live["finetune"]["num_steps"] is not None
    # Tokens count at each micro-batch's embedding, samples at optimizer steps: a 3 s replay on a slow host may
    # end before the next step (tests/test_replay_live.py checks the samples' count exactly).
    assert live["finetune"]["tokens_per_s"] > 0 and live["finetune"]["samples_per_s"] >= 0, live["finetune"]
    assert len(live["tpot_cdf_ms"]) > 0 and np.all(np.diff(live["tpot_cdf_ms"]) >= 0)
    for name in ("tpot_cdf.png", "finetune_throughput.png", "sm_split_latency.png", "memory_window.png"):
        assert (out / name).stat().st_size > 1000


def peft_greedy(model_dir, adapter_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """PEFT offline: the base model with the adapter, greedy, in the served dtype (the tiny Llama's float32).
    A plain argmax loop, as the served requests (`ignore_eos`): `generate(min_new_tokens=...)` would forbid
    the end-of-sequence token instead of ignoring it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                      adapter_dir).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(max_new_tokens):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            outputs.append(ids[len(prompt):])
    return outputs


def test_a_request_naming_the_published_adapter_equals_peft_offline(deployment, reference, tiny_model_dir):
    """The job publishes its adapter into the prefill and the decode worker. Paused (no new version), the
    served version's step has a checkpoint of the same tensors: requests through the router naming the
    adapter return, greedy, token for token what PEFT generates from that checkpoint on the same base, and
    they differ from the base model's (the adapter does something). Resumed afterwards."""
    admin = f"{deployment.admin_url}/harvest/finetune"
    wait_for_stats(deployment.admin_url, lambda s: (s["finetune"].get("published") or {}).get("version", 0) >= 1,
                   "a published version")
    assert httpx.post(f"{admin}/pause", timeout=60).status_code == 200
    time.sleep(1.0)  # a unit already running when the pause came may end a step and publish once more
    published = wait_for_stats(deployment.admin_url, lambda s: s["finetune"]["published"]["version"]
                               == s["finetune"]["published"]["version_requested"],
                               "the last version requested published")["finetune"]["published"]
    assert published["error"] is None and published["step"] % PUBLISH_EVERY_STEPS == 0, published
    output_dir = yaml.safe_load((deployment.config.log_dir / "job.yaml").read_text())["output_dir"]
    checkpoint = Path(output_dir) / f"checkpoint-{published['step']}"
    prompts = PROMPTS[:2]

    async def with_adapter():
        async with httpx.AsyncClient(timeout=300) as client:
            return [(await generate(client, deployment.url, {**generate_request(p, PROMPT_NEW_TOKENS),
                                                              "lora_path": ADAPTER_NAME}))["output_ids"]
                    for p in prompts]

    served = asyncio.run(with_adapter())
    assert httpx.post(f"{admin}/resume", timeout=60).status_code == 200
    expected = peft_greedy(tiny_model_dir, checkpoint, prompts, PROMPT_NEW_TOKENS)
    assert served == expected
    assert served != reference["prompts"][:2], "the adapter changed no token: the test shows nothing"


def test_lost_prefill_worker_fails_requests_clearly_and_decode_stops_cleanly(deployment):
    """Runs last (it kills the prefill worker). A request through the router then fails fast with an HTTP
    error instead of hanging; the deployment names the lost worker; the decode worker stays healthy, its
    job keeps training, and it exits 0 on stop with no process left behind."""
    deployment.prefill.proc.send_signal(signal.SIGKILL)
    deployment.prefill.proc.wait(30)
    problems = deployment.check()
    assert len(problems) == 1 and "prefill worker exited" in problems[0]
    assert not deployment.is_fatal()

    started = time.monotonic()
    response = httpx.post(f"{deployment.url}/generate", json=generate_request(PROMPTS[0], 4), timeout=120)
    assert response.status_code >= 500 and response.text, response
    assert time.monotonic() - started < 120
    assert httpx.get(f"{deployment.decode.url}/health", timeout=10).status_code == 200
    step = read_stats(deployment.admin_url)["finetune"]["step"]
    wait_for_stats(deployment.admin_url, lambda s: s["finetune"]["step"] > step, "the job to keep training")

    processes = [psutil.Process(p.proc.pid) for p in (deployment.router, deployment.decode)]
    descendants = [c for p in processes for c in p.children(recursive=True)]
    codes = deployment.stop()
    assert codes["decode"] == 0 and codes["router"] in (0, -signal.SIGTERM)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes + descendants)
