"""Spatial (core partitions, the planner per step) vs temporal (decode on every core, units after it) live,
side by side in one worker: phases alternate S T S T under the same steady load, so each policy's two
phases give its A/A noise. Temporal is the spatial worker pinned to the whole device, (cores, 0): decode
alone on every core, then the temporal slice, which is what TemporalController does.

    python eval/spatial_vs_temporal.py --profile P.json --out DIR [--phase-s 30] [--tpot-slo-ms 100]

Prints one JSON line per phase and a summary line; writes DIR/results.json.
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from harvest.worker.client import generate_prefilled, read_stats, read_steps_since
from harvest.worker.process import WorkerProcess


async def load(url: str, until_s: float, clients: int, prompt_len: int, new_tokens: int) -> int:
    """`clients` closed-loop clients, each sending its next request when the last one returns."""
    done = 0

    async def client_loop(k: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(timeout=300) as client:
            n = 0
            while time.monotonic() < until_s:
                ids = [(31 * k + 7 * n + j) % 500 + 3 for j in range(prompt_len)]
                await generate_prefilled(client, url, ids, new_tokens, 10_000 * k + n)
                n += 1
                done += 1

    await asyncio.gather(*(client_loop(k) for k in range(clients)))
    return done


def phase(worker, policy: str, pin: str, args) -> dict:
    response = httpx.post(worker.admin_url + "/harvest/partition" + pin, timeout=30)
    response.raise_for_status()
    before = read_stats(worker.admin_url)
    since = before["decode"]["decode_steps"]
    started = time.monotonic()
    requests = asyncio.run(load(worker.url, started + args.phase_s, args.clients, args.prompt_len, args.new_tokens))
    wall_s = time.monotonic() - started
    after = read_stats(worker.admin_url)
    steps = read_steps_since(worker.admin_url, since)
    within = [s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] <= args.tpot_slo_ms for s in steps]
    co_run = after["colocation"].get("co_run", {})
    return {"policy": policy, "wall_s": round(wall_s, 1), "requests": requests, "decode_steps": len(steps),
            "finetune_tokens_per_s": round((after["finetune"]["tokens"] - before["finetune"]["tokens"]) / wall_s, 2),
            "steps_within_target_pct": round(100.0 * sum(within) / len(within), 2) if within else None,
            "decode_p50_ms": sorted(s["latency_ms"] for s in steps)[len(steps) // 2] if steps else None,
            "co_run_steps_total": {k: v["steps"] for k, v in co_run.items()},
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", required=True)
    parser.add_argument("--finetune", default="harvest/finetune/demo/demo.yaml")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tpot-slo-ms", type=float, default=100.0)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=30620)
    parser.add_argument("--admin-port", type=int, default=30720)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    num_cores = len(os.sched_getaffinity(0))
    worker_args = ["--finetune", args.finetune, "--tpot-slo-ms", str(args.tpot_slo_ms), "--profile", args.profile]
    log = Path(tempfile.mkdtemp(prefix="harvest-svt-")) / "worker.log"
    phases = []
    with WorkerProcess(worker_args, args.port, args.admin_port, log) as worker:
        deadline = time.monotonic() + 600
        # the job past its first optimizer step (loading and warm-up units out of the phases), as bench colocate
        while read_stats(worker.admin_url)["finetune"].get("step", 0) < 1:
            if time.monotonic() > deadline:
                raise SystemExit("the finetune job did not finish its first step")
            time.sleep(1.0)
        for policy, pin in (("spatial", ""), ("temporal", f"?infer={num_cores}&ft=0")) * 2:
            phases.append(phase(worker, policy, pin, args))
            print(json.dumps(phases[-1]), flush=True)
    summary = {}
    for policy in ("spatial", "temporal"):
        rates = [p["finetune_tokens_per_s"] for p in phases if p["policy"] == policy]
        within = [p["steps_within_target_pct"] for p in phases if p["policy"] == policy]
        summary[policy] = {"finetune_tokens_per_s": rates, "mean": round(sum(rates) / len(rates), 2),
                           "a_a_spread_pct": round(100 * abs(rates[0] - rates[1]) / max(sum(rates) / 2, 1e-9), 1),
                           "steps_within_target_pct": within}
    result = {"config": vars(args), "num_cores": num_cores, "worker_log": str(log), "phases": phases,
              "summary": summary}
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
