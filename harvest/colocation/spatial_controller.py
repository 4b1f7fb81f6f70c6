"""Spatial co-location on a GPU with green contexts (HARLI sec. 6.2): each decode step runs on the
inference partition the planner picks, while finetune units run concurrently on the finetune partition;
the temporal slice after the step (controller.py) then gives the job the whole device.

The planner decides before every step; the decision only selects pre-created streams. Co-run units run in
their own thread so they overlap the step; a unit already launched when the plan turns to "pause"
finishes, and the next one waits for a plan that gives it SMs. Only one unit runs at a time (the job is
not thread-safe): slice units, run by the scheduler thread, take the same lock. The co-run finetune time
is not charged to the step: it ran beside it, and its interference is what the co-run model (stage 2)
predicts and the online correction and margin learn.
"""

import threading

from harvest.colocation.controller import Controller
from harvest.colocation.green_partitions import GreenPartitions


class SpatialController(Controller):
    mode = "spatial"

    def __init__(self, job, planner, slo, partitions: GreenPartitions, planner_source: str):
        super().__init__(job, planner, slo, planner_source)
        self.partitions = partitions
        self._whole_device = partitions.streams(max(i for i, _ in planner.profile.partitions), 0)[0]
        self._decode_stream = None
        self._finetune_stream = None
        self._unit_lock = threading.Lock()
        self._co_run_tokens = 0
        self._may_run = threading.Event()
        self._closed = threading.Event()
        self._runner = threading.Thread(target=self._run_units, name="harvest-finetune-units", daemon=True)
        self._runner.start()

    @property
    def decode_stream(self):
        """Where the scheduler launches the step's kernels: the inference partition's stream."""
        return self._decode_stream

    def _start_co_run(self, decision) -> None:
        self._decode_stream, self._finetune_stream = self.partitions.streams(decision.infer_sms, decision.ft_sms)
        if decision.ft_sms > 0:
            self._may_run.set()
        else:
            self._may_run.clear()

    def _end_co_run(self, step) -> int:
        self._may_run.clear()
        with self._unit_lock:
            tokens, self._co_run_tokens = self._co_run_tokens, 0
        return tokens

    def on_idle(self, kv_demand_slots: int = 0) -> int:
        """No decode batch: units run on the whole device, from the scheduler thread, one per idle turn."""
        self._decode_stream = None
        return super().on_idle(kv_demand_slots)

    def close(self) -> None:
        self._closed.set()
        self._may_run.set()

    def _run_unit(self):
        """A slice or idle unit: the scheduler thread, on the whole device, after any co-run unit."""
        import torch

        with self._unit_lock, torch.cuda.stream(self._whole_device):
            return super()._run_unit()

    def _run_units(self) -> None:
        import torch

        while not self._closed.is_set():
            if not self._may_run.wait(timeout=0.1):
                continue
            with self._unit_lock:
                stream = self._finetune_stream
                if not self._may_run.is_set() or stream is None or not self.job.has_ready_work():
                    ran = False
                else:
                    with torch.cuda.stream(stream):
                        result = super()._run_unit()
                    ran = result is not None
                    self._co_run_tokens += result.num_trained_tokens if ran else 0
            if not ran:
                self._may_run.wait(timeout=0.005)

    def stats(self) -> dict:
        return {**super().stats(),
                "partitions": {"num_sms": self.partitions.num_sms, "granularity": self.partitions.granularity}}
