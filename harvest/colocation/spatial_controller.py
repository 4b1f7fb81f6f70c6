"""Spatial co-location on a GPU with green contexts (HARLI sec. 6.2): each decode step runs on the
inference partition the planner picks, while finetune units run concurrently on the finetune partition.

The planner decides before every step; the decision only selects pre-created streams. Finetune units run
in their own thread so they overlap the step; a unit already launched when the plan turns to "pause"
finishes (one layer of a micro-batch, ~10 ms), and the next one waits for a plan that gives it SMs.
The finetune time is not charged to the step: it ran beside it, and its interference is what the
co-run model (stage 2) predicts and the online correction learns.
"""

import contextlib
import threading

from harvest.colocation.finetune_job import FinetuneJob
from harvest.colocation.green_partitions import GreenPartitions
from harvest.colocation.slo_tracker import SloTracker
from harvest.step_stats import DecodeStep


class SpatialController:
    def __init__(self, job: FinetuneJob, planner, slo: SloTracker, partitions: GreenPartitions, planner_source: str):
        self.job = job
        self.planner = planner
        self.slo = slo
        self.partitions = partitions
        self.planner_source = planner_source
        self._decision = None
        self._decode_stream = None
        self._finetune_stream = None
        self._may_run = threading.Event()
        self._closed = threading.Event()
        self._runner = threading.Thread(target=self._run_units, name="harvest-finetune-units", daemon=True)
        self._runner.start()

    def decode_stream_context(self):
        """Where the scheduler launches the step's kernels: the inference partition's stream."""
        if self._decode_stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self._decode_stream)

    def before_step(self, step: DecodeStep) -> None:
        decision = self.planner.plan(step.batch_size, step.mean_seq_len, self.job.can_run_unit())
        self._decision = decision
        step.predicted_ms = decision.predicted_ms
        self._decode_stream, self._finetune_stream = self.partitions.streams(decision.infer_sms, decision.ft_sms)
        if decision.ft_sms > 0:
            self._may_run.set()
        else:
            self._may_run.clear()

    def after_step(self, step: DecodeStep, kv_demand_slots: int = 0) -> None:
        self.planner.observe(self._decision, step.latency_ms)
        self.slo.record(step.latency_ms)

    def on_idle(self, kv_demand_slots: int = 0) -> None:
        """No decode batch: the finetune job may use the whole device until the next step is planned."""
        import torch

        self._finetune_stream = torch.cuda.current_stream()
        self._may_run.set()

    def close(self) -> None:
        self._closed.set()
        self._may_run.set()

    def _run_units(self) -> None:
        import torch

        while not self._closed.is_set():
            if not self._may_run.wait(timeout=0.1):
                continue
            stream = self._finetune_stream
            if stream is None or not self.job.can_run_unit():
                self.job.note_no_room()
                self._may_run.wait(timeout=0.005)
                continue
            with torch.cuda.stream(stream):
                self.job.run_unit()

    def stats(self) -> dict:
        decision = self._decision
        return {
            "mode": "spatial",
            "planner": self.planner_source,
            "partitions": {"num_sms": self.partitions.num_sms, "granularity": self.partitions.granularity},
            "split": None if decision is None else {
                "infer_sms": decision.infer_sms, "ft_sms": decision.ft_sms,
                "predicted_ms": round(decision.predicted_ms, 3), "slack_ms": round(decision.slack_ms, 3),
                "is_finetune_paused": decision.is_finetune_paused,
                "is_slo_unreachable": decision.is_slo_unreachable,
            },
            "predictor": self.planner.stats().to_dict(),
            "slo": self.slo.snapshot(),
        }
