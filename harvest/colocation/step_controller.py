"""Per decode step: shape -> plan split -> decode | finetune units -> account (HARLI sec. 6.2).

Temporal co-location (CPU hosts, GPUs without green contexts): decode owns the device during its step;
after the step, finetune units run while the step's time plus the units' stays within (a backed-off share
of) the TPOT target, and freely while no decode batch exists. A unit is admitted only if 1.25x the longest
recent unit of its kind fits in what is left.

Spatial co-location (green contexts) uses the planner's partition for each step: see spatial_controller.py.
"""

import contextlib
import time
from collections import deque

from harvest.colocation.finetune_job import ACTIVE_PHASES, FinetuneJob
from harvest.colocation.slo_tracker import SloTracker
from harvest.step_stats import DecodeStep

RECENT_UNITS_PER_KIND = 16
# Unit times of one kind vary with the chunk's length and with the host: admit a unit only if 1.25x the
# longest recent unit of its kind fits (the embedded model on this CPU: layer units ~9 ms, the head
# unit with its 49k-word vocabulary several times that, so one estimate for all kinds overruns).
UNIT_ESTIMATE_MARGIN = 1.25
# Filling every step's slack stretches TPOT to the target, requests stay longer, batches grow and decode
# alone slows past the target (measured on the embedded model, conv slice: batch 4 -> 7, 56 of 849 steps
# over the target by decode alone). So the share of the slack finetuning may fill backs off (halves)
# whenever a step takes more than this fraction of the target, and recovers slowly while steps are short.
BACKOFF_LATENCY_FRACTION = 0.7
FILL_RECOVERY_PER_STEP = 0.02
# Between the end of a step's result processing and the next step's launch SGLang spends ~1 ms
# receiving requests and building the batch (measured on this CPU); keep it out of the finetune budget.
LOOP_OVERHEAD_MS = 2.0


class StepController:
    def __init__(self, job: FinetuneJob, planner, slo: SloTracker, planner_source: str, lender=None):
        """`lender`: the KvLender whose chunks hold the job's weight window (None: no KV lending)."""
        self.job = job
        self.planner = planner
        self.slo = slo
        self.planner_source = planner_source
        self.lender = lender
        self._recent_unit_ms: dict[str, deque[float]] = {}
        self._decision = None
        self.fill_fraction = 1.0
        self.num_units_in_slack = 0
        self.num_units_idle = 0
        self.finetune_ms_in_slack = 0.0

    def decode_stream_context(self):
        return contextlib.nullcontext()  # decode owns the whole device during its step

    def close(self) -> None:
        pass

    def before_step(self, step: DecodeStep) -> None:
        if self.planner is None:
            self._decision = None
            return
        self._decision = self.planner.plan(step.batch_size, step.mean_seq_len, self.job.can_run_unit())
        step.predicted_ms = self._decision.predicted_ms

    def after_step(self, step: DecodeStep, kv_demand_slots: int = 0) -> None:
        """The step's tokens are out: give decode the KV memory it needs, then fill what is left of the
        step's TPOT budget with finetune units (both charged to the step)."""
        if self._decision is not None:
            self.planner.observe(self._decision, step.latency_ms)
        target_ms = self.slo.tpot_slo_ms
        if step.latency_ms > BACKOFF_LATENCY_FRACTION * target_ms:
            self.fill_fraction /= 2
        else:
            self.fill_fraction = min(1.0, self.fill_fraction + FILL_RECOVERY_PER_STEP)
        budget_ms = self.fill_fraction * (target_ms - step.latency_ms) - LOOP_OVERHEAD_MS
        if self._decision is not None:
            budget_ms = min(budget_ms, self._decision.slack_ms - LOOP_OVERHEAD_MS)
        started = time.perf_counter()
        did_memory_work = self._rebalance_memory(kv_demand_slots)
        ran_any = False
        while self.job.can_run_unit():
            spent_ms = (time.perf_counter() - started) * 1e3
            if self._next_unit_estimate_ms() > budget_ms - spent_ms:
                break
            if not self._run_unit():
                break
            ran_any = True
            self.num_units_in_slack += 1
        finetune_ms = (time.perf_counter() - started) * 1e3 if ran_any or did_memory_work else 0.0
        self.finetune_ms_in_slack += finetune_ms
        if not ran_any:
            self.job.note_no_room()
        step.finetune_ms = finetune_ms
        self.slo.record(step.latency_ms + finetune_ms)

    def on_idle(self, kv_demand_slots: int = 0) -> None:
        """No decode batch: run one unit (the loop comes back here between units to check for requests)."""
        self._rebalance_memory(kv_demand_slots)
        if self.job.can_run_unit() and self._run_unit():
            self.num_units_idle += 1

    def _rebalance_memory(self, kv_demand_slots: int) -> bool:
        """Reclaim lent KV memory decode needs, else grow the job's window; True if it did any work."""
        if self.lender is None:
            return False
        engine = self.job.engine if self.job.is_active else None
        if engine is not self.lender.engine:
            if engine is None:
                self.lender.detach_engine()
            else:
                self.lender.attach_engine(engine, engine.num_window_layers)
        # Growth waits while the operator pauses the job, not while it waits for memory: that is what it needs.
        return self.lender.rebalance(kv_demand_slots, can_grow=self.job.state in ACTIVE_PHASES)

    def _run_unit(self) -> bool:
        result = self.job.run_unit()
        if result is None:
            return False
        self._recent_unit_ms.setdefault(result.kind, deque(maxlen=RECENT_UNITS_PER_KIND)).append(result.duration_ms)
        return True

    def _next_unit_estimate_ms(self) -> float:
        # A kind never timed yet is admitted in idle loops only: they time the first ones.
        recent = self._recent_unit_ms.get(self.job.next_unit_kind())
        return UNIT_ESTIMATE_MARGIN * max(recent) if recent else float("inf")

    def stats(self) -> dict:
        decision = self._decision
        return {
            "mode": "temporal",
            "planner": self.planner_source,
            "split": None if decision is None else {
                "infer_sms": decision.infer_sms, "ft_sms": decision.ft_sms,
                "predicted_ms": round(decision.predicted_ms, 3), "slack_ms": round(decision.slack_ms, 3),
                "is_finetune_paused": decision.is_finetune_paused,
                "is_slo_unreachable": decision.is_slo_unreachable,
            },
            "predictor": None if self.planner is None else self.planner.stats().to_dict(),
            "fill_fraction": round(self.fill_fraction, 4),
            "units_in_slack": self.num_units_in_slack,
            "units_idle": self.num_units_idle,
            "finetune_ms_in_slack": round(self.finetune_ms_in_slack, 1),
            "slo": self.slo.snapshot(),
        }
