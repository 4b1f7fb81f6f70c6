"""Spatial co-location (HARLI sec. 6.2): each decode step runs on the inference partition the planner picks,
while finetune units run concurrently on the finetune partition; the temporal slice after the step
(controller.py) then gives the job the whole device. A partition is SMs of a GPU (GreenPartitions: a
stream on a green context) or cores of a CPU host (CorePartitions: the thread pinned to a core set); both
give a context per thread for decode, for co-run units and for the whole device.

The job has one owner at a time, handed over between the threads (a handshake, not shared access):
  - the scheduler thread owns it between steps: poll (checkpoint, stop), KV lending (grow, reclaim, drain),
    slice and idle units all run there;
  - before a step that co-runs, it hands the job to the unit thread (`_hand_over`), which runs units on the
    finetune partition while the step runs;
  - when the step's tokens are out it takes the job back (`_take_back`): no new unit starts, and it waits
    for the one in flight. Units are sized to the profile's shortest step (up to twice a unit's fixed cost
    where that is over half of it: unit_sizer.py), so the lender's reclaim, which comes right after, completes
    within about one decode step of the burst that needed it (stats: take_back_ms).
The co-run finetune time is not charged to the step's latency: it ran beside it, and its interference is
what the co-run model (stage 2) predicts and the online correction and margin learn; waiting for the unit
in flight is charged to the step's finetune time.
"""

import threading
import time

from harvest.colocation.controller import Controller


class SpatialController(Controller):
    mode = "spatial"

    def __init__(self, job, planner, slo, partitions, planner_source: str, lender=None,
                 pinned: tuple[int, int] | None = None):
        """`partitions`: GreenPartitions or CorePartitions. `pinned`: run every step on this (infer, ft)
        partition instead of the planner's choice (profiling and benchmarks; `harvest serve --pin-partition`)."""
        super().__init__(job, planner, slo, planner_source, lender)
        self.partitions = partitions
        self.pinned = pinned
        self._partition: tuple[int, int] | None = None
        self._co_run_tokens = 0
        self._co_run: dict[tuple[int, int], list[float]] = {}   # partition -> [tokens, ms, steps]
        self.max_take_back_ms = 0.0
        self._unit_lock = threading.Lock()
        self._may_run = threading.Event()
        self._closed = threading.Event()
        self._runner = threading.Thread(target=self._run_units, name="harvest-finetune-units", daemon=True)
        self._runner.start()

    def decode_stream_context(self):
        """Where the scheduler thread runs the step: the inference partition's cores on a CPU host (on a GPU
        the stream switch is decode_stream's, made with its hand-offs by harvest/sglang/step_streams.py)."""
        return self.partitions.decode_context(*(self._partition or (self.partitions.num_sms, 0)))

    @property
    def decode_stream(self):
        """Where the scheduler launches the step's kernels on a GPU: the inference partition's stream (None:
        SGLang's own streams, the whole device; always None for CPU core partitions)."""
        return None if self._partition is None else self.partitions.decode_stream(*self._partition)

    def before_step(self, step) -> None:
        super().before_step(step)
        if self.planner is None:
            self._start_co_run(None)

    def _start_co_run(self, decision) -> None:
        if self.pinned is not None:
            partition = self.pinned
        elif decision is not None and decision.ft_sms > 0:
            partition = (decision.infer_sms, decision.ft_sms)
        else:
            partition = None if decision is None else (decision.infer_sms, 0)
        self._partition = partition
        if partition is not None and partition[1] > 0 and self.job.has_ready_work():
            self._hand_over()

    def _end_co_run(self, step) -> int:
        waited_ms = self._take_back()
        tokens, self._co_run_tokens = self._co_run_tokens, 0
        if self._partition is not None and self._partition[1] > 0:
            totals = self._co_run.setdefault(self._partition, [0, 0.0, 0])
            totals[0] += tokens
            totals[1] += step.latency_ms + waited_ms
            totals[2] += 1
        return tokens

    def _decision_co_ran(self) -> bool:
        return self._partition is not None and self._partition[1] > 0

    def _co_run_ft_sms(self) -> int:
        return self._partition[1]

    def _hand_over(self) -> None:
        self._may_run.set()

    def _take_back(self) -> float:
        """Stop co-run units and wait for the one in flight; the ms waited."""
        started = time.perf_counter()
        self._may_run.clear()
        with self._unit_lock:
            pass
        waited_ms = (time.perf_counter() - started) * 1e3
        self.max_take_back_ms = max(self.max_take_back_ms, waited_ms)
        return waited_ms

    def on_idle(self, kv_demand_slots: int = 0) -> int:
        """No decode batch: units run on the whole device, from the scheduler thread, one per idle turn."""
        self._take_back()  # a step whose result never came (aborted) must not leave the job handed over
        self._partition = None
        return super().on_idle(kv_demand_slots)

    def close(self) -> None:
        self._closed.set()
        self._may_run.set()

    def _run_unit(self):
        """A slice or idle unit: the scheduler thread owns the job; the whole device."""
        with self._unit_lock, self.partitions.whole_device_context():
            return super()._run_unit()

    def _run_units(self) -> None:
        """The unit thread: runs units on the finetune partition while it holds the job."""
        while not self._closed.is_set():
            if not self._may_run.wait(timeout=0.1):
                continue
            ran = False
            with self._unit_lock:
                partition = self._partition
                if self._may_run.is_set() and partition is not None and partition[1] > 0 and \
                        self.job.has_ready_work():
                    with self.partitions.finetune_context(*partition):
                        result = super()._run_unit(co_run=True)
                    ran = result is not None
                    self._co_run_tokens += result.num_trained_tokens if ran else 0
            if not ran:
                self._may_run.wait(timeout=0.005)
                time.sleep(0.001)

    def stats(self) -> dict:
        co_run = {f"{i},{f}": {"tokens": int(t), "ms": round(ms, 1), "steps": int(n),
                               "tokens_per_s": round(t / ms * 1e3, 3) if ms else None}
                  for (i, f), (t, ms, n) in self._co_run.items()}
        return {**super().stats(),
                "partitions": {"kind": type(self.partitions).__name__, "num_units": self.partitions.num_sms,
                               "granularity": self.partitions.granularity},
                "pinned": None if self.pinned is None else list(self.pinned),
                "co_run": co_run, "take_back_ms_max": round(self.max_take_back_ms, 3)}
