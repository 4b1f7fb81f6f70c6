"""`harvest bench serve`: harvest's decode worker with finetuning off vs a plain SGLang decode worker.

Both workers run at once on the same model with the same SGLang flags: `harvest serve` (no --finetune) and
`python -m sglang.launch_server` given exactly the argv harvest builds for SGLang (`build_sglang_argv`, so
the CPU defaults and `--disaggregation-transfer-backend fake` match). Each round sends one fixed workload,
`num_requests` concurrent pre-filled requests of the same prompt and output length, to one worker and then
to the other, alternating which goes first, so slow drifts of a shared host hit both alike; the worker not
being measured gets no request.

Per-step latency is the gap between streamed chunks divided by the tokens each brought, at the full batch
(each request's first chunk and first/last EDGE_GAPS gaps dropped); the ratio is the median over rounds of
harvest/plain round medians with a bootstrap 95 % interval; `--control` runs an A/A pair through the same
harness. Why this method: eval/README.md, "Serving overhead".

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import asyncio
import datetime
import json
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

from harvest.bench import device_name
from harvest.models import resolve_model_path
from harvest.worker.client import (
    prefilled_request,
    read_last_step_seq,
    read_steps_since,
)
from harvest.worker.process import WorkerProcess, free_ports

TARGET_RATIO = 1.02
EDGE_GAPS = 4  # requests join and leave the batch over a few scheduler loops
NUM_BOOTSTRAP = 2000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model-path", default=None, help="local HF model dir (default: embedded SmolLM2-135M)")
    model.add_argument("--tiny", action="store_true", help="a tiny random Llama built under --log-dir (quick check)")
    parser.add_argument("--num-requests", type=int, default=8, help="concurrent requests per round (batch size)")
    parser.add_argument("--prompt-len", type=int, default=128, help="pre-filled prompt tokens per request")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens decoded per request")
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds; each sends the workload to both")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool tokens (SGLang flag)")
    parser.add_argument("--busy-idle", action="store_true",
                        help="leave SGLang's busy-polling idle loop on (default: --sleep-on-idle for both)")
    parser.add_argument("--sglang-flags", default="", help="more SGLang flags for both workers, one string")
    parser.add_argument("--log-dir", default="runs/bench-serve", help="worker logs (and the tiny model)")
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--control", action="store_true",
                        help="A/A: a second plain SGLang worker (`plain_a`) in harvest's place; the ratio then "
                        "measures this bench's own bias and noise")
    parser.add_argument("--timeline-out", default=None,
                        help="write every measured request's (arrival s, tokens) chunks here, as JSON")


def run(args: argparse.Namespace) -> dict:
    from base.cuda_driver import ensure_driver_or_stub  # deferred: test_gpu_twin's H100 stand-in patches it
    from harvest.sglang.launcher import CPU_ENGINE_ENV, build_sglang_argv

    if args.num_requests < 1 or args.rounds < 1 or args.max_new_tokens <= 2 * EDGE_GAPS + 1:
        raise ValueError(f"need --num-requests >= 1, --rounds >= 1, --max-new-tokens > {2 * EDGE_GAPS + 1}")
    log_dir = Path(args.log_dir)
    if args.tiny:
        from harvest.models.tiny_llama import build_tiny_llama

        model_path = build_tiny_llama(log_dir / "tiny-llama")
    else:
        model_path = resolve_model_path(args.model_path)
    is_cpu_host = ensure_driver_or_stub()  # puts the stub's folder on LD_LIBRARY_PATH for both children
    flags = ["--max-total-tokens", str(args.max_total_tokens), *shlex.split(args.sglang_flags)]
    if not args.busy_idle:
        flags.append("--sleep-on-idle")
    plain_argv = build_sglang_argv(str(model_path), flags, is_cpu_host, has_job=False)
    env = CPU_ENGINE_ENV if is_cpu_host else None
    ports = free_ports(3)
    plain_command = [sys.executable, "-m", "sglang.launch_server"]
    if args.control:
        tested = WorkerProcess(plain_argv, ports[0], 0, log_dir / "plain_a.log", command=plain_command, env=env)
    else:
        tested = WorkerProcess(["--model-path", str(model_path), *flags], ports[0], ports[1],
                               log_dir / "harvest.log", env=env)
    # The tested worker first, the baseline second: the ratio is tested / baseline.
    workers = {"plain_a" if args.control else "harvest": tested,
               "plain": WorkerProcess(plain_argv, ports[2], 0, log_dir / "plain.log", command=plain_command,
                                      env=env)}
    load_start = os.getloadavg()[0]
    try:
        for worker in workers.values():  # one at a time: start-up is the heaviest thing either does
            worker.start(args.start_timeout_s)
        result = _measure(workers, args)
    finally:
        for worker in workers.values():
            worker.stop()
    return {
        **result,
        "target_ratio": TARGET_RATIO,
        "meets_target": result["ratio_step_ms_p50"] <= TARGET_RATIO,
        "workload": {"num_requests": args.num_requests, "prompt_len": args.prompt_len,
                     "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                     "warmup_rounds": args.warmup_rounds, "edge_gaps_dropped": EDGE_GAPS},
        "model_path": str(model_path),
        "sglang_argv": shlex.join(plain_argv),
        "device": device_name(is_cpu_host),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
        "command": _command(args),
    }


def _measure(workers: dict[str, WorkerProcess], args: argparse.Namespace) -> dict:
    workload = Workload(args.num_requests, args.prompt_len, args.max_new_tokens)
    for _ in range(args.warmup_rounds):
        for worker in workers.values():
            asyncio.run(workload.send(worker.url))
    names = list(workers)  # [tested, baseline]
    is_harvest = "harvest" in workers
    hook_since = read_last_step_seq(workers["harvest"].admin_url) if is_harvest else 0
    rounds = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            rounds[name].append(asyncio.run(workload.send(workers[name].url)))
    hook_steps = read_steps_since(workers["harvest"].admin_url, hook_since) if is_harvest else []
    if args.timeline_out:
        Path(args.timeline_out).write_text(json.dumps(
            {name: [r.timelines for r in rounds[name]] for name in names} | {"harvest_hook_steps": hook_steps}))
    tested, baseline = names
    per_round_ratios = [statistics.median(t.gaps_ms) / statistics.median(b.gaps_ms)
                        for t, b in zip(rounds[tested], rounds[baseline])]
    summary = {name: _summarize(rounds[name]) for name in names}
    if is_harvest:
        full_batch = [s["latency_ms"] for s in hook_steps if s["batch_size"] == args.num_requests]
        summary["harvest"]["hook_num_steps"] = len(hook_steps)
        summary["harvest"]["hook_step_ms_p50_full_batch"] = (
            round(statistics.median(full_batch), 3) if full_batch else None)
    return {
        "ratio_step_ms_p50": round(statistics.median(per_round_ratios), 4),
        "ratio_step_ms_p50_ci95": [round(x, 4) for x in _bootstrap_median_ci95(per_round_ratios)],
        "ratio_step_ms_p50_pooled": round(summary[tested]["step_ms_p50"] / summary[baseline]["step_ms_p50"], 4),
        "ratio_tpot_ms_p50": round(summary[tested]["tpot_ms_p50"] / summary[baseline]["tpot_ms_p50"], 4),
        "ratio_of": f"{tested} / {baseline}",
        "per_round_ratios": [round(x, 4) for x in per_round_ratios],
        **summary,
    }


def _bootstrap_median_ci95(values: list[float]) -> tuple[float, float]:
    """Percentile bootstrap over rounds: how far the median ratio could move on this host's noise alone."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(NUM_BOOTSTRAP))
    return medians[int(0.025 * NUM_BOOTSTRAP)], medians[int(0.975 * NUM_BOOTSTRAP) - 1]


class RoundResult:
    __slots__ = ("gaps_ms", "tpot_ms", "num_timed_steps", "num_tokens", "timelines")

    def __init__(self, gaps_ms: list[float], tpot_ms: list[float], num_timed_steps: int, num_tokens: int,
                 timelines: list[list[tuple[float, int]]]):
        self.gaps_ms = gaps_ms
        self.tpot_ms = tpot_ms
        self.num_timed_steps = num_timed_steps
        self.num_tokens = num_tokens
        self.timelines = timelines


class Workload:
    """`num_requests` concurrent streamed requests, same prompt length and output length, fresh rooms."""

    def __init__(self, num_requests: int, prompt_len: int, max_new_tokens: int):
        self.num_requests = num_requests
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self._next_room = 1

    async def send(self, url: str) -> RoundResult:
        rooms = range(self._next_room, self._next_room + self.num_requests)
        self._next_room += self.num_requests
        async with httpx.AsyncClient(timeout=600) as client:
            streams = await asyncio.gather(*(self._stream(client, url, i, room) for i, room in enumerate(rooms)))
        gaps_ms, tpot_ms, num_timed_steps, num_tokens = [], [], 0, 0
        for chunks in streams:
            per_token = _per_token_gaps_ms(chunks)
            kept = per_token[EDGE_GAPS:len(per_token) - EDGE_GAPS]
            gaps_ms += kept
            num_timed_steps = max(num_timed_steps, len(kept))
            num_tokens += chunks[-1][1]
            if chunks[-1][1] > chunks[0][1]:
                tpot_ms.append((chunks[-1][0] - chunks[0][0]) * 1e3 / (chunks[-1][1] - chunks[0][1]))
        if not gaps_ms:
            raise RuntimeError(f"{url}: no token gaps measured; is --max-new-tokens larger than {2 * EDGE_GAPS}?")
        return RoundResult(gaps_ms, tpot_ms, num_timed_steps, num_tokens, streams)

    async def _stream(self, client: httpx.AsyncClient, url: str, index: int, room: int) -> list[tuple[float, int]]:
        """(arrival time s, completion tokens so far) per streamed chunk."""
        # Distinct prompts of one length: no request shares a prefix with another.
        input_ids = [3 + (index * 7 + k) % 97 for k in range(self.prompt_len)]
        body = {**prefilled_request(input_ids, self.max_new_tokens, room), "stream": True}
        chunks = []
        async with client.stream("POST", f"{url}/generate", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                chunks.append((now, json.loads(line[5:])["meta_info"]["completion_tokens"]))
        if not chunks or chunks[-1][1] != self.max_new_tokens:
            raise RuntimeError(f"{url}: request {room} returned {chunks[-1][1] if chunks else 0} tokens, "
                               f"expected {self.max_new_tokens}")
        return chunks


def _per_token_gaps_ms(chunks: list[tuple[float, int]]) -> list[float]:
    """One entry per token after the first chunk: a chunk with n tokens spreads its gap over n entries."""
    gaps = []
    for (t0, n0), (t1, n1) in zip(chunks, chunks[1:]):
        if n1 > n0:
            gaps += [(t1 - t0) * 1e3 / (n1 - n0)] * (n1 - n0)
    return gaps


def _summarize(rounds: list[RoundResult]) -> dict:
    gaps = sorted(g for r in rounds for g in r.gaps_ms)
    return {
        "step_ms_p50": round(statistics.median(gaps), 3),
        "step_ms_p90": round(gaps[int(0.9 * (len(gaps) - 1))], 3),
        "step_ms_p50_per_round": [round(statistics.median(r.gaps_ms), 3) for r in rounds],
        "tpot_ms_p50": round(statistics.median(t for r in rounds for t in r.tpot_ms), 3),
        "num_timed_steps": sum(r.num_timed_steps for r in rounds),
        "num_token_gaps": len(gaps),
        "num_tokens": sum(r.num_tokens for r in rounds),
    }




def _command(args: argparse.Namespace) -> str:
    argv = ["harvest", "bench", "serve"]
    if args.tiny:
        argv.append("--tiny")
    elif args.model_path:
        argv += ["--model-path", args.model_path]
    argv += ["--num-requests", str(args.num_requests), "--prompt-len", str(args.prompt_len),
             "--max-new-tokens", str(args.max_new_tokens), "--rounds", str(args.rounds),
             "--warmup-rounds", str(args.warmup_rounds), "--max-total-tokens", str(args.max_total_tokens)]
    if args.busy_idle:
        argv.append("--busy-idle")
    if args.control:
        argv.append("--control")
    if args.sglang_flags:
        argv += ["--sglang-flags", args.sglang_flags]
    return shlex.join(argv)
