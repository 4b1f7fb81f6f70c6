"""A fleet of decode workers training one adapter, simulated (`harvest replay --simulate --decode-workers N`):
each worker runs the harvest policy's controller on its own load (fleet_worker.py), and the fleet's rounds
are cut over their unit logs as fleet_sync.py runs them, each round's all-reduce charged to every member's
finetune time (fleet_rounds.py, fleet_sync_cost.py). results.json's "fleet" section: one row per N.
"""

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
from harvest.fleet.round_policy import RoundPolicy
from harvest.replay.fleet_rounds import run_rounds
from harvest.replay.fleet_sync_cost import SyncCost
from harvest.replay.fleet_worker import WorkerRun, simulate_worker

DEFAULT_ROUND_S = 60.0
"""Rounds when neither --fleet-round-tokens nor --fleet-round-s is given: a minute of local training between
averages (at the H100 profile's 3000 tok/s, ~90 optimizer steps of 2 x 1024 tokens)."""
FLEET_LOADS = {
    "round-robin": "the window's requests dealt to the N workers in arrival order, as a round-robin router "
    "(sglang-router's round_robin) does: the fleet serves one window's traffic, each worker 1/N of it; every "
    "worker's load is set before it runs, so the workers simulate independently",
    "replica": "every worker replays the whole window (its latency noise seeded seed + k): the traffic grows "
    "with the fleet, each worker at one worker's load; with no noise the workers are identical",
}
WASTED = ("0 by design: a round's cut discards nothing. Tokens a member trains while its round is in flight stay "
          "on top of the new adapter and go into its next round (fleet_sync.py); a round not committed leaves its "
          "change unsent for the next one. Reported: in_flight_tokens (trained while a round was in flight) and "
          "unsynced_tokens (not yet in a finished round when the span ends)")


@dataclass(frozen=True, slots=True)
class FleetReplay:
    sizes: tuple[int, ...]
    """Fleet sizes to simulate, one row each (--decode-workers 1,2,8,64)."""
    load: str
    policy: RoundPolicy
    cost: SyncCost

    def __post_init__(self) -> None:
        if not self.sizes or any(n < 1 for n in self.sizes):
            raise HarvestError(f"--decode-workers must be whole numbers >= 1, got {','.join(map(str, self.sizes))}")
        if self.load not in FLEET_LOADS:
            raise HarvestError(f"--fleet-load must be one of {', '.join(FLEET_LOADS)}, got {self.load!r}")

    def run(self, simulation, trace, one_worker_tokens_per_s: float | None = None, on_size=None) -> dict:
        """`simulation`: the ReplaySimulation; `one_worker_tokens_per_s`: the harvest policy's decode-device rate
        on the whole trace (the rows' ratio_to_one_worker); on_size(n, seconds) after each row."""
        cache: dict[tuple, WorkerRun] = {}
        rows = []
        for n in self.sizes:
            t0 = time.perf_counter()
            workers = [self._worker(simulation, trace, n, k, cache) for k in range(n)]
            rows.append(self._row(n, workers, trace, simulation.config.tpot_slo_ms, one_worker_tokens_per_s))
            rows[-1]["simulation_s"] = round(time.perf_counter() - t0, 3)
            if on_size is not None:
                on_size(n, rows[-1]["simulation_s"])
        return {
            "load": self.load,
            "load_basis": FLEET_LOADS[self.load],
            "round_policy": {"every_tokens": self.policy.every_tokens, "every_s": self.policy.every_s},
            "sync_cost": {**dataclasses.asdict(self.cost),
                          "model": "round_ms = round_latency_ms + 2 (N - 1) / N x adapter_bytes / link (ring "
                          "all-reduce), charged to every member's finetune time; 0 for N = 1 (no fleet)"},
            "wasted": WASTED,
            "one_worker_tokens_per_s": one_worker_tokens_per_s,
            "rows": rows,
        }

    def _worker(self, simulation, trace, n: int, k: int, cache: dict) -> WorkerRun:
        whole = self.load == "replica" or n == 1
        config = simulation.config
        seed = config.seed + k
        key = ("whole" if whole else (n, k), seed if config.latency_noise > 0 else None)
        if key not in cache:
            ids = np.arange(trace.num_requests) if whole else np.arange(k, trace.num_requests, n)
            cache[key] = simulate_worker(simulation, trace, ids, dataclasses.replace(config, seed=seed))
        return cache[key]

    def _row(self, n: int, workers: list[WorkerRun], trace, tpot_slo_ms: float, one_worker: float | None) -> dict:
        span_s = max(trace.duration_s, *(w.run.end_s for w in workers))
        for w in workers:
            w.extend_to(span_s)
        round_ms = self.cost.round_ms(n)
        outcome = run_rounds([w.units for w in workers], self.policy if n > 1 else None, round_ms)
        raw_tokens = sum(w.units.num_tokens for w in workers)
        fleet_tokens = sum(outcome.tokens)
        finished = outcome.finished_rounds(span_s)
        paid_ms = sum(c - u for c, u in zip(outcome.charged_ms, outcome.unpaid_ms))
        finetune_ms = sum(outcome.finetune_ms)
        in_target = [float(np.mean(w.run.step_latency_ms <= tpot_slo_ms)) for w in workers if len(w.run.step_latency_ms)]
        per_worker = [t / span_s for t in outcome.tokens]
        fleet_tokens_per_s = fleet_tokens / span_s
        return {
            "num_workers": n,
            "span_s": round(span_s, 3),
            "num_rounds": len(finished),
            "rounds_per_hour": round(len(finished) / span_s * 3600, 3),
            "tokens_per_round": round(sum(r.tokens for r in finished) / len(finished), 1) if finished else None,
            "fleet_tokens_per_s": fleet_tokens_per_s,
            "worker_tokens_per_s_min": round(min(per_worker), 3),
            "worker_tokens_per_s_max": round(max(per_worker), 3),
            "ratio_to_one_worker": round(fleet_tokens_per_s / one_worker, 4) if one_worker else None,
            "steps_in_target_min": min(in_target) if in_target else None,
            "sync_ms_per_round": round(round_ms, 3),
            "sync_share": round(paid_ms / finetune_ms, 6) if finetune_ms else None,
            "sync_lost_tokens": round(raw_tokens - fleet_tokens, 1),
            "sync_unpaid_ms": round(sum(outcome.unpaid_ms), 3),
            "round_wait_s_mean": round(outcome.wait_s / (n * len(outcome.finished_rounds(float("inf")))), 3)
            if outcome.finished_rounds(float("inf")) else None,
            "wasted_tokens": 0,
            "in_flight_tokens": round(sum(outcome.in_flight_tokens), 1),
            "unsynced_tokens": round(fleet_tokens - sum(r.tokens for r in finished), 1) if n > 1 else None,
        }
