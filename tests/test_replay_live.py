"""The live replay's logic against an in-process stand-in for a worker's HTTP surface. Against a real decode
worker, through a real PD deployment: tests/test_pd_deploy.py."""

import json

import numpy as np
import pytest


class StandInWorker:
    """An in-process stand-in for `harvest serve` (its HTTP surface only): each request takes one 5 ms
    step per token; the request with bootstrap_room == `stuck_room` never answers."""

    def __init__(self, stuck_room: int | None = None):
        self.stuck_room = stuck_room
        self.steps: list[dict] = []
        self.finetune_tokens = 1000
        self.finetune_samples = 30

    async def __call__(self, request):
        import asyncio
        import time

        import httpx

        if request.url.path == "/generate":
            body = json.loads(request.content)
            if body["bootstrap_room"] == self.stuck_room:
                await asyncio.sleep(3600)
            n = body["sampling_params"]["max_new_tokens"]
            for k in range(n):
                await asyncio.sleep(0.005)
                self.steps.append(
                    {
                        "seq": len(self.steps) + 1,
                        "end_s": time.time(),
                        "batch_size": 1,
                        "kv_tokens": len(body["input_ids"]) + k,
                        "latency_ms": 5.0,
                        # every 4th step: a slice after it that takes it past the 40 ms target
                        "finetune_ms": 36.0 if len(self.steps) % 4 == 3 else 0.0,
                        "idle_wait_ms": 0.0,
                    }
                )
            self.finetune_tokens += 64
            self.finetune_samples += 2
            return httpx.Response(200, json={"output_ids": [7] * n, "meta_info": {"completion_tokens": n}})
        if request.url.path == "/harvest/stats":
            return httpx.Response(
                200,
                json={
                    "decode": {"decode_steps": len(self.steps)},
                    "finetune": {"tokens": self.finetune_tokens, "samples": self.finetune_samples, "step": 0},
                },
            )
        if request.url.path == "/harvest/steps":
            since, limit = int(request.url.params["since"]), int(request.url.params["limit"])
            page = self.steps[since : since + limit]
            return httpx.Response(200, json={"steps": page, "next": page[-1]["seq"] if page else since})
        return httpx.Response(404)


def test_live_replay_logic_against_a_stand_in_worker():
    """Fast check of the live path without SGLang: per-step records are all collected, finetune progress
    is the admin counter's difference over the replay, and a request that never answers is cancelled
    after the drain and counted, not waited for forever."""
    import httpx

    from harvest.replay.live_replay import LiveReplay
    from traces.trace import Trace

    trace = Trace("t", np.linspace(0, 0.5, 12), np.full(12, 20), np.arange(1, 13))
    worker = StandInWorker(stuck_room=11)
    replay = LiveReplay(
        "http://w",
        "http://a",
        40.0,
        max_concurrency=4,
        drain_s=1.0,
        transport=httpx.MockTransport(worker),
    )
    results = replay.run(trace)
    decode = results["policies"]["live"]["decode"]
    assert decode["num_unfinished_requests"] == 1 and decode["num_failed_requests"] == 0
    assert decode["num_requests"] == 11
    assert decode["num_tokens_returned"] == decode["num_tokens"] == int(trace.generated_tokens[:11].sum())
    # a step's time is what its requests waited for: decode + the slice after it (as the simulator counts)
    num_over = sum(1 for k in range(decode["num_steps"]) if k % 4 == 3)
    assert decode["step_slo_attainment"] == pytest.approx(1 - num_over / decode["num_steps"])
    assert decode["step_latency_ms_p50"] == 5.0 and decode["step_latency_ms_max"] == 41.0
    assert decode["num_steps_over_target_by_decode_alone"] == 0
    finetune = results["policies"]["live"]["finetune"]
    assert finetune["tokens_per_s"] == pytest.approx(11 * 64 / decode["makespan_s"], rel=1e-3)
    # The worker's own sample count (optimizer steps x samples per step), not tokens over a constant.
    assert finetune["samples_per_s"] == pytest.approx(11 * 2 / decode["makespan_s"], rel=1e-3)
    assert any("unfinished" in note for note in results["notes"])
