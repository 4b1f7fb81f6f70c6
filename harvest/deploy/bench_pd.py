"""`harvest bench pd`: harvest's decode step in a real PD deployment vs the same worker on fake transfer.

Both run at once on this host, neither with a finetune job: `harvest deploy` (SGLang prefill worker,
harvest decode worker on mooncake, sglang-router) and a lone `harvest serve` on the `fake` backend. Each
round sends one fixed workload (`num_requests` concurrent greedy requests, same prompt and output length)
through the router and then to the lone worker, alternating which goes first, so slow drifts of a shared
host hit both alike. Both decode workers are harvest's, so every step is timed by the same in-scheduler hook
(/harvest/steps): a round's figure is the median latency of its steps at its fullest batch (recorded), and the
ratio is the median over rounds of (PD / fake). What the PD side adds to a step is whatever the transfer
engine, the bootstrap polling and the prefill worker take from the decode worker on the same cores.
"""

import argparse
import asyncio
import datetime
import os
import statistics
import time
from pathlib import Path

import httpx

from harvest.deploy import DeployConfig
from harvest.deploy.pd_deployment import free_deploy_ports, prepare_deployment
from harvest.models import EMBEDDED_MODEL_PLACEHOLDER
from harvest.worker.client import (
    generate,
    generate_request,
    prefilled_request,
    read_last_step_seq,
    read_steps_since,
)
from harvest.worker.process import WorkerProcess, free_ports

# An idle SGLang scheduler busy-polls a core (harvest/bench/serve.py): the worker not being measured would
# take half of a 2-core host from the one that is. Both decode workers sleep in zmq poll when idle instead.
SLEEP_ON_IDLE = ("--sleep-on-idle",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", default=None, help="local HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--num-requests", type=int, default=8, help="concurrent requests per round (batch size)")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens decoded per request")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds; each sends the workload to both")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool tokens of every worker")
    parser.add_argument("--log-dir", default="runs/bench-pd", help="worker logs")


def run(args: argparse.Namespace) -> dict:
    if args.num_requests < 1 or args.rounds < 1 or args.max_new_tokens < 4:
        raise ValueError("need --num-requests >= 1, --rounds >= 1, --max-new-tokens >= 4")
    log_dir = Path(args.log_dir)
    ports = free_deploy_ports() + free_ports(2)
    deployment = prepare_deployment(DeployConfig(
        model_path=args.model_path or EMBEDDED_MODEL_PLACEHOLDER, log_dir=log_dir / "pd", router_port=ports[0],
        router_metrics_port=ports[1], prefill_port=ports[2], bootstrap_port=ports[3], decode_port=ports[4],
        admin_port=ports[5], first_transfer_port=ports[6], max_total_tokens=args.max_total_tokens,
        serve_args=SLEEP_ON_IDLE,
    ))
    fake = WorkerProcess(["--model-path", deployment.config.model_path, "--max-total-tokens",
                          str(args.max_total_tokens), *SLEEP_ON_IDLE], ports[7], ports[8], log_dir / "fake.log")
    load_start = os.getloadavg()[0]
    try:
        deployment.start()
        fake.start()
        targets = {"pd": (deployment.url, deployment.admin_url, False), "fake": (fake.url, fake.admin_url, True)}
        _round(targets["pd"], args, 0)  # warm-up: the first transfer sets up mooncake's connections
        _round(targets["fake"], args, 0)
        per_round, batch = {"pd": [], "fake": []}, {"pd": [], "fake": []}
        for r in range(args.rounds):
            for name in (("pd", "fake") if r % 2 == 0 else ("fake", "pd")):
                step_ms, batch_size = _round(targets[name], args, r + 1)
                per_round[name].append(step_ms)
                batch[name].append(batch_size)
    finally:
        deployment.stop()
        fake.stop()
    ratios = [pd / fk for pd, fk in zip(per_round["pd"], per_round["fake"], strict=True)]
    return {
        "ratio_step_ms_p50": round(statistics.median(ratios), 4),
        "pd_step_ms_p50": round(statistics.median(per_round["pd"]), 3),
        "fake_step_ms_p50": round(statistics.median(per_round["fake"]), 3),
        "per_round": {"pd": [round(x, 3) for x in per_round["pd"]],
                      "fake": [round(x, 3) for x in per_round["fake"]], "ratio": [round(x, 4) for x in ratios],
                      "batch_pd": batch["pd"], "batch_fake": batch["fake"]},
        "workload": {"num_requests": args.num_requests, "prompt_len": args.prompt_len,
                     "max_new_tokens": args.max_new_tokens, "rounds": args.rounds},
        "host": {"cpus": os.cpu_count(), "loadavg_1m_start": round(load_start, 2),
                 "loadavg_1m_end": round(os.getloadavg()[0], 2)},
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _round(target: tuple[str, str, bool], args: argparse.Namespace, round_id: int) -> tuple[float, int]:
    """Send the workload once; the median latency of the decode worker's steps at the round's fullest batch,
    and that batch size."""
    url, admin_url, is_fake = target
    since = read_last_step_seq(admin_url)
    prompts = [[3 + (round_id * 31 + 7 * i + j) % 400 for j in range(args.prompt_len)]
               for i in range(args.num_requests)]

    async def send_all():
        async with httpx.AsyncClient(timeout=600) as client:
            await asyncio.gather(*(
                generate(client, url, prefilled_request(p, args.max_new_tokens, room=1000 * round_id + i)
                         if is_fake else generate_request(p, args.max_new_tokens))
                for i, p in enumerate(prompts)))

    asyncio.run(send_all())
    time.sleep(0.5)
    steps = read_steps_since(admin_url, since)
    if not steps:
        raise RuntimeError(f"no decode step recorded at {url}")
    # Transfers can arrive staggered enough that not all requests share a step: take the round's fullest batch.
    full = max(s["batch_size"] for s in steps)
    return statistics.median(s["latency_ms"] for s in steps if s["batch_size"] == full), full
