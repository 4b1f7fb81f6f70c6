"""Spatial co-location (HARLI sec. 6.2): each decode step runs on the inference partition the planner picks,
while the finetune job trains on the finetune partition beside it, continuously: a partition granted stays
granted across steps, and the unit thread runs units on it back to back. A partition is SMs of a GPU
(GreenPartitions: a stream on a green context) or cores of a CPU host (CorePartitions: the thread pinned to a
core set); both give a context per thread for decode, for co-run units and for the whole device.

The job has one owner at a time, and the owner changes only at a unit boundary (the UnitThread's lock is held
for a unit, or for a turn of the scheduler thread's work on the job):
  - while a finetune partition is granted, the unit thread owns the job: it polls it (checkpoint, stop,
    publish) and runs units between decode steps as well as during them; the scheduler thread runs no unit;
  - the grant changes before a step whose partition differs (whole device to decode, or another pair) and
    before an idle turn: the scheduler thread revokes it and waits for the unit in flight (a preemption,
    charged to the step as preempt_ms; units are sized to the bound controller.unit_bound_ms gives, or, while a
    partition is held across steps, to the preemption bound: co_run_bound_ms); the idle turn that takes it back
    runs no unit (on_idle);
  - with a planner, a co-run step is followed by a slice on the whole device where the slack admits one (the
    planner counts the tokens of a step so, and weighs the wait for the unit in flight against co-running):
    the partition is revoked for it and granted again at the next step; pinned or chosen live (no planner), it
    stays with the job between steps, but for a step whose batch decode on the chosen split's side would not
    serve in the target (its fit over that split's steps): that one runs on the whole device;
  - KV slots and lent memory stay the scheduler thread's (allocator/unified_allocator.py asserts it): when
    decode needs lent memory back it takes the job for the rebalance at the unit boundary (a preemption, in
    the step's memory_ms); growing the job's window is a request the unit thread serves by stopping at its
    next unit boundary, and the scheduler thread grows the window after a later step, waiting for nothing.
What runs units on the partition is the controller's runner: UnitThread on a worker, the simulated device's
in `harvest replay --simulate` (harvest/replay/simulated_job.py), so both run this one policy.
The co-run finetune time is not charged to the step's latency: it ran beside it, and its interference is
what the co-run model (stage 2) predicts and the online correction and margin learn.
"""

import contextlib
import ctypes
import math
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

from harvest.colocation.controller import (
    LOOP_OVERHEAD_MS,
    BatchCost,
    Controller,
    quantile,
    unit_bound_ms,
)
from harvest.colocation.finetune_job import FinetuneState

RECENT_DECODE_STEPS = 1000
MIN_DECODE_STEPS = 64
PREEMPTION_MISS_SHARE = 0.0005
"""Steps a preemption may take past the target: half the 0.1 % harvest aims to miss at most (decode's own
stalls take the rest). Only a preempted step waits for the unit in flight, so a unit held across steps is sized
so the wait and decode's step time fit the target at decode's 1 - PREEMPTION_MISS_SHARE / (preempted share of
recent steps) quantile: the rarer the preemptions, the lower it (DECODE_QUANTILES bound it)."""
DECODE_QUANTILES = (0.5, 0.999)
CO_RUN_BOUND_MAX_SHARE = 0.5
"""A co-run unit is cut to at most this share of the target: its fixed cost is mostly amortized well before
(eval/README.md, "Spatial co-location on CPU cores"), while a pause, a stop or a publish waits for it too."""
IDLE_POLL_S = 0.005
"""How often the unit thread looks again at a job with no ready work while it holds a grant."""
PR_SET_NAME = 15
"""prctl(2): set the calling thread's name (15 bytes)."""
SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval in a worker whose job runs on a unit thread beside the scheduler thread (set
when the UnitThread is made, for the process's life, granted or not): a thread that wants the interpreter lock back
(after a torch op or a compiled graph released it) waits up to this long for the other to drop it between
bytecodes; at Python's default of 5 ms each such wait may last that long, and every torch op of decode's step is
such a return (eval/results/cpu-2026-11-29/shared-interpreter/)."""


@dataclass(slots=True)
class PartitionTime:
    """What the job did on one finetune partition (stats `co_run`)."""

    num_trained_tokens: float = 0
    num_unit_tokens: float = 0
    """Tokens through its units (Controller.unit_tokens): the work done there, not lumped at embeddings."""
    granted_ms: float = 0.0
    """Held by the job, closed grants only (stats adds the open one's time so far)."""
    num_grants: int = 0
    num_steps: int = 0


class SpatialController(Controller):
    mode = "spatial"

    def __init__(self, job, planner, slo, partitions, planner_source: str, lender=None,
                 pinned: tuple[int, int] | None = None, chooser=None, runner=None, clock=time.perf_counter,
                 loop_overhead_ms: float = LOOP_OVERHEAD_MS, size_co_run_units: bool = True,
                 max_running_requests: float = math.inf):
        """`partitions`: GreenPartitions or CorePartitions (the simulator's: SimulatedPartitions). `pinned`: run
        every step on this (infer, ft) partition instead of the planner's choice (profiling and benchmarks;
        `harvest serve --pin-partition`). `chooser`: a SplitChooser, which picks the split phase by phase where
        there is no planner. `runner`: what runs units on a granted partition (None: a UnitThread, the worker's;
        the simulator passes its simulated device's). `size_co_run_units`: size the units of a partition held
        across steps to the preemption bound (co_run_bound_ms); False: the job's own bound throughout (a
        bound set by hand, FinetuneConfig.max_unit_ms). `max_running_requests`: as Controller's."""
        super().__init__(job, planner, slo, planner_source, lender, clock=clock, loop_overhead_ms=loop_overhead_ms,
                         max_running_requests=max_running_requests)
        self.partitions = partitions
        self.pinned = pinned
        self.chooser = chooser
        self.size_co_run_units = size_co_run_units
        self._decode_ms: deque[float] = deque(maxlen=RECENT_DECODE_STEPS)
        """Decode's own time in recent steps (a preemption's wait left out), on whichever partition it ran."""
        self._preempted: deque[bool] = deque(maxlen=RECENT_DECODE_STEPS)
        """Per recent step: whether a preemption came with it (before it, at the idle turn before it, or after)."""
        self._num_preemptions_seen = 0
        self._decode_quantile_ms: float | None = None
        self._partition_cost: dict[tuple[int, int], BatchCost] = {}
        """Per chosen split: how decode on its inference side grows with the batch, the job beside it."""
        self.num_steps_given_back = 0
        self._job_was_ready = False
        self._partition: tuple[int, int] | None = None
        """The step's partition (decode's side is what decode_stream_context follows)."""
        self._granted: tuple[int, int] | None = None
        """The finetune partition the runner may run units on; written by the scheduler thread only."""
        self._granted_s = 0.0
        self._untallied_tokens = 0
        """Trained on partitions and taken from the runner, not yet in a step's finetune_tokens."""
        self._co_run: dict[tuple[int, int], PartitionTime] = {}
        self.max_preempt_ms = 0.0
        self.num_preemptions = 0
        self.num_grow_requests = 0
        self.runner = UnitThread(self) if runner is None else runner
        self._decode_side = contextlib.ExitStack()
        """The scheduler thread on decode's side of the granted partition (CPU cores), from grant to revoke."""

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
            self._start_co_run(None, step)

    def _start_co_run(self, decision, step) -> None:
        self._job_was_ready = self.job.has_ready_work()
        if self.pinned is not None:
            partition = self.pinned
        elif decision is not None:
            partition = (decision.infer_sms, decision.ft_sms)
        elif self.chooser is not None and self._job_was_ready:
            split = self.chooser.split_for_step(self.unit_tokens, self._is_learned)
            partition = self._serving_split(split, step.batch_size)
        else:
            partition = None  # the whole device; a chosen split too while the job has no unit to run (paused, building)
        grant = partition if partition is not None and partition[1] > 0 and self._job_was_ready else None
        if grant != self._granted:
            step.preempt_ms = self._revoke()
            if grant is not None:
                self._grant(grant)
        # Held across steps, the partition is taken back only by a preemption; with a planner it is taken back
        # for the slice after most co-run steps, whose units keep the job's bound.
        is_held = partition is not None and partition[1] > 0 and self._holds_partition_across_steps
        bound_ms = self.co_run_bound_ms() if is_held and self.size_co_run_units else None
        if bound_ms != self.job.requested_unit_ms:
            self.job.request_unit_bound(bound_ms)
        self._partition = partition
        step.infer_sms = self.partitions.num_sms if partition is None else partition[0]

    def _is_learned(self, split: tuple[int, int] | None) -> bool:
        """Whether the chooser may end `split`'s warm-up: on the whole device, once the slice's decode cost line
        and its overrun quantile are fitted (BatchCost.is_learned); a partition's units learn their co-run times
        in a phase."""
        return split is not None or self.batch_cost.is_learned

    def _serving_split(self, split: tuple[int, int] | None, batch_size: int) -> tuple[int, int] | None:
        """The chosen split, or the whole device for a step whose batch decode on the split's inference side
        would not serve in the target (its fit over the split's recent steps, at their overrun quantile): the
        split trains beside the batches decode keeps up with on fewer cores and gives the device back for the
        rest (at the wait for the unit in flight, which the co-run bound leaves room for), instead of missing
        them; so do batches from one that missed all the same on the split, while the chooser caps it
        (SplitChooser.max_batch). Until the split's steps have spread enough to fit a line,
        each request costs its steps' mean per request (BatchCost.max_batch's stand-in): a fresh worker at a
        heavy load gives back from the split's first steps on. Its steps on the whole device are its phase's
        all the same."""
        cost = self._partition_cost.get(split)
        fits = cost is None or batch_size <= cost.max_batch(self.slo.tpot_slo_ms - self.loop_overhead_ms,
                                                            cost.mean_ms_per_request)
        if split is None or (fits and batch_size <= self.chooser.max_batch(split)):
            return split
        self.num_steps_given_back += 1
        return None

    def after_step(self, step, kv_demand_slots: int = 0) -> None:
        co_ran_on = self._granted if self.chooser is not None else None
        super().after_step(step, kv_demand_slots)
        decode_ms = step.latency_ms - step.preempt_ms
        if co_ran_on is not None:
            cost = self._partition_cost.setdefault(co_ran_on, BatchCost(larger_batches_overrun=False))
            cost.observe(step.batch_size, decode_ms)
        self._decode_ms.append(decode_ms)
        self._preempted.append(self.num_preemptions != self._num_preemptions_seen)
        self._num_preemptions_seen = self.num_preemptions
        if len(self._decode_ms) >= MIN_DECODE_STEPS and len(self._decode_ms) % 16 == 0:  # sort less
            # The share counts one preemption more than seen: none in a short run is not a rate of 0.
            preempted_share = (sum(self._preempted) + 1) / (len(self._preempted) + 1)
            low, high = DECODE_QUANTILES
            q = min(high, max(low, 1 - PREEMPTION_MISS_SHARE / preempted_share))
            self._decode_quantile_ms = quantile(self._decode_ms, q)
        if self.chooser is None:
            return
        if self.pinned is None and self._job_was_ready:
            # A wait for an idle-time unit is the idle turn's, not the split's (it runs on the whole device).
            kept = step.latency_ms + step.finetune_ms <= self.slo.tpot_slo_ms
            self.chooser.record_step(self.unit_tokens, kept, step.batch_size)
        else:
            self.chooser.skip()  # a step pinned through the admin API, or one whose job had no ready work

    def co_run_bound_ms(self) -> float | None:
        """What the units of a partition held across steps are sized to: the preemption bound, the longest a
        step may wait for the unit in flight (the partition revoked before it, or lent memory reclaimed after
        it) and keep the target at the quantile of decode's recent step times PREEMPTION_MISS_SHARE says. On its
        own partition a unit waits for no decode step, so it is cut for that, not for the step: at least the
        job's bound (controller.unit_bound_ms), at most CO_RUN_BOUND_MAX_SHARE of the target. None: fewer than
        MIN_DECODE_STEPS steps seen, or the bound is no longer than the job's."""
        if self._decode_quantile_ms is None:
            return None
        target_ms = self.slo.tpot_slo_ms
        room_ms = min(target_ms - self._decode_quantile_ms - self.loop_overhead_ms, CO_RUN_BOUND_MAX_SHARE * target_ms)
        job_bound_ms = unit_bound_ms(target_ms, None if self.planner is None else self.planner.shortest_step_ms)
        return room_ms if room_ms > job_bound_ms else None

    @property
    def _holds_partition_across_steps(self) -> bool:
        """No planner, or a pinned partition: no slice takes the partition back after a step."""
        return self.planner is None or self.pinned is not None

    def _end_co_run(self, step) -> int:
        if self._granted is not None:
            time_on = self._co_run[self._granted]
            time_on.num_steps += 1
            self._take_work(time_on)
        tokens, self._untallied_tokens = self._untallied_tokens, 0
        return tokens

    def _take_work(self, time_on: PartitionTime) -> None:
        """What the runner trained on the granted partition since the last look: into its record, and into the
        next step's finetune tokens."""
        trained, work = self.runner.take_work()
        time_on.num_trained_tokens += trained
        time_on.num_unit_tokens += work
        self._untallied_tokens += trained

    def _run_slice(self, step, started: float, budget_ms: float) -> tuple[bool, float]:
        """A planner's step is its co-run and then a slice on the whole device (what its finetune tokens count),
        so the partition is taken back for a slice where a unit fits after the wait for the one in flight (both
        at the bound: the job is the runner's until then); the slice's time holds the wait, the partition training
        meanwhile. With no planner, or one partition pinned, the partition stays with the job between steps."""
        if self._granted is not None:
            if not self._is_slice_after_step():
                return False, 0.0
            room_ms = budget_ms - self.slice_reserve_ms - (self.clock() - started) * 1e3
            if 2 * self.job.max_unit_ms > room_ms:
                return False, 0.0
            self._revoke()
            self._partition = None
            _, excess_ms = super()._run_slice(step, started, budget_ms)
            return True, excess_ms
        return super()._run_slice(step, started, budget_ms)

    def _is_slice_after_step(self) -> bool:
        return self._granted is None or not self._holds_partition_across_steps

    def _decision_co_ran(self) -> bool:
        return self._granted is not None

    def _co_run_ft_sms(self) -> int:
        return self._granted[1]

    def _is_job_beside_decode(self) -> bool:
        return self._granted is not None

    # ---- the grant (scheduler thread) ----

    def _grant(self, partition: tuple[int, int]) -> None:
        self._granted, self._granted_s = partition, self.clock()
        self._co_run.setdefault(partition, PartitionTime()).num_grants += 1
        # The scheduler thread's whole loop stays on decode's cores while the job holds the rest, not only its
        # forwards: between them (batching, results, requests) it would otherwise run on the job's cores.
        self._decode_side.enter_context(self.partitions.decode_context(*partition))
        self.runner.grant(partition)

    def _revoke(self) -> float:
        """Take the job back from the runner: no unit starts from now; the ms waited for the one in flight."""
        granted = self._granted
        if granted is None:
            return 0.0
        self._granted = None
        waited_ms = self.runner.revoke()
        self._decode_side.close()
        time_on = self._co_run[granted]
        self._take_work(time_on)
        time_on.granted_ms += (self.clock() - self._granted_s) * 1e3
        self.num_preemptions += 1
        self.max_preempt_ms = max(self.max_preempt_ms, waited_ms)
        return waited_ms

    def _rebalance_memory(self, kv_demand_slots: int, can_grow: bool = True) -> bool:
        if self._granted is None or self.lender is None:
            return super()._rebalance_memory(kv_demand_slots, can_grow)
        if self.lender.engine is not None and self.lender.needs_reclaim(kv_demand_slots):
            with self.runner.job_at_boundary(wait=True):  # decode needs its KV back now
                self.num_preemptions += 1
                return super()._rebalance_memory(kv_demand_slots, can_grow)
        engine = self.job.engine if self.job.is_active else None
        if engine is not None and engine.is_shared:
            engine = None  # no window to lend to (the base rebalance says so and detaches once)
        if engine is not self.lender.engine or (can_grow and engine is not None and (
                self.lender.may_grow() or self.job.state == FinetuneState.WAITING)):
            with self.runner.job_at_boundary(wait=False) as has_job:
                if not has_job:
                    self.num_grow_requests += 1
                    return False
                return super()._rebalance_memory(kv_demand_slots, can_grow)
        self.runner.withdraw()  # a growth asked for at an earlier turn is not wanted now: units go on
        return False

    def on_idle(self, kv_demand_slots: int = 0) -> int:
        """No decode batch: units run on the whole device, from the scheduler thread, one per idle turn. A turn
        that finds a partition granted takes it back, waiting for its unit in flight, and runs none: the loop
        comes straight back (idle_turn_worked), so a batch arriving waits for one unit at most, never for the
        partition's and a whole-device one back to back (eval/results/cpu-2026-11-29/amd-host/)."""
        if self._granted is not None:
            started = self.clock()
            self._revoke()
            self._partition = None
            self.idle_turn_worked = True
            self._idle_unit_ms = (self.clock() - started) * 1e3
            return 0
        tokens = super().on_idle(kv_demand_slots)
        if self.chooser is not None and not self.idle_turn_worked:
            self.chooser.skip()  # no unit was ready: the time measures no split (an idle turn's unit does)
        return tokens

    def close(self) -> None:
        self._revoke()
        self.runner.close()

    def _run_unit(self, co_run: bool = False, predicted_ms: float | None = None):
        """A slice or idle unit: the scheduler thread owns the job; the whole device."""
        if co_run:
            return super()._run_unit(co_run=True)
        with self.runner.job_at_boundary(wait=True), self.partitions.whole_device_context():
            return super()._run_unit(predicted_ms=predicted_ms)

    def stats(self) -> dict:
        granted, granted_s = self._granted, self._granted_s
        co_run = {}
        for (i, f), time_on in list(self._co_run.items()):
            t, w, ms = time_on.num_trained_tokens, time_on.num_unit_tokens, time_on.granted_ms
            if (i, f) == granted:
                ms += (self.clock() - granted_s) * 1e3
                pending_t, pending_w = self.runner.pending_work()
                t, w = t + pending_t, w + pending_w
            co_run[f"{i},{f}"] = {"tokens": int(t), "unit_tokens": int(w), "ms_granted": round(ms, 1),
                                  "grants": time_on.num_grants,
                                  "steps": time_on.num_steps, "tokens_per_s": round(t / ms * 1e3, 3) if ms else None}
        return {**super().stats(),
                "partitions": {"kind": type(self.partitions).__name__, "num_units": self.partitions.num_sms,
                               "granularity": self.partitions.granularity},
                "pinned": None if self.pinned is None else list(self.pinned),
                "granted": None if granted is None else list(granted),
                "co_run": co_run, "chooser": None if self.chooser is None else self.chooser.stats(),
                "preemptions": self.num_preemptions, "steps_given_back": self.num_steps_given_back,
                "preempt_ms_max": round(self.max_preempt_ms, 3), "grow_requests": self.num_grow_requests,
                "co_run_unit_bound_ms": None if self.job.requested_unit_ms is None
                else round(self.job.requested_unit_ms, 3),
                "runner": self.runner.stats()}


class UnitThread:
    """The worker's runner: from a grant until its revoke, a thread that runs the job's units on the granted
    finetune partition back to back, polling the job between them. A thread per grant, not one for the worker's
    life: an OpenMP team lives as long as the thread that made it, and while one lives beside the scheduler
    thread's, libgomp counts more threads than cores and its workers stop spin-waiting between parallel regions,
    which slows decode and the slices on the whole device (eval/results/cpu-2026-11-29/chooser-whole-device/)."""

    NAME = "harvest-finetune-units"

    def __init__(self, controller: SpatialController):
        self.controller = controller
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread: threading.Thread | None = None
        self._revoked = threading.Event()
        """Set by the revoke: no unit starts, and a wait between units ends."""
        self._tokens = self._unit_tokens = 0
        self._job_lock = threading.Lock()
        self._tokens_lock = threading.Lock()
        self._wanted = threading.Event()
        """The scheduler thread wants the job at the next unit boundary (memory work): no unit starts."""
        self._unit_ms = self._unit_cpu_ms = 0.0
        self.num_threads_started = 0

    def grant(self, partition: tuple[int, int]) -> None:
        assert self._thread is None, "a grant follows the revoke of the one before"
        self._revoked.clear()
        self._thread = threading.Thread(target=self._run_units, args=(partition,), name=self.NAME, daemon=True)
        self._thread.start()
        self.num_threads_started += 1

    def revoke(self) -> float:
        """No unit starts from now; the ms waited for the one in flight (and the thread's end)."""
        started = time.perf_counter()
        self._revoked.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        return (time.perf_counter() - started) * 1e3

    def take_work(self) -> tuple[int, int]:
        """(tokens trained, tokens through units) on the partition since the last call."""
        with self._tokens_lock:
            work, self._tokens, self._unit_tokens = (self._tokens, self._unit_tokens), 0, 0
        return work

    def pending_work(self) -> tuple[int, int]:
        """What take_work would return now (stats, from any thread)."""
        return self._tokens, self._unit_tokens

    @contextlib.contextmanager
    def job_at_boundary(self, wait: bool):
        """The job for the scheduler thread's own turn: at the next unit boundary. `wait`: block for the unit in
        flight (a preemption); else yield False if one is in flight, and leave the request standing so the
        thread stops at its boundary and a later turn finds it free."""
        self._wanted.set()
        if not self._job_lock.acquire(blocking=wait):
            yield False
            return
        try:
            yield True
        finally:
            self._wanted.clear()
            self._job_lock.release()

    def withdraw(self) -> None:
        """Take back a request job_at_boundary(wait=False) left standing (the scheduler thread no longer wants
        the job), so the thread does not hold off its units for a turn that will not come. Scheduler thread only,
        outside job_at_boundary."""
        self._wanted.clear()

    def close(self) -> None:
        self.revoke()

    def stats(self) -> dict:
        """The co-run units' time, and the share of it this thread was on a core: on a CPU host the rest is
        waiting (for the interpreter lock, or for a core); on a GPU it includes waiting for the device."""
        unit_ms = self._unit_ms
        return {"unit_ms": round(unit_ms, 1), "unit_cpu_ms": round(self._unit_cpu_ms, 1),
                "on_cpu": round(self._unit_cpu_ms / unit_ms, 4) if unit_ms else None,
                "threads_started": self.num_threads_started}

    def _run_units(self, partition: tuple[int, int]) -> None:
        """The grant's thread: on the partition from its start (it was made on decode's cores), polls included."""
        _name_os_thread(self.NAME)
        with self.controller.partitions.finetune_context(*partition):
            while not self._revoked.is_set():
                if self._wanted.is_set():
                    self._revoked.wait(IDLE_POLL_S / 5)
                elif not self._run_co_run_unit():
                    self._revoked.wait(IDLE_POLL_S)

    def _run_co_run_unit(self) -> bool:
        """One unit on the granted partition (the thread is on it) while not revoked or wanted back; True if one
        ran."""
        controller = self.controller
        with self._job_lock:
            if self._revoked.is_set() or self._wanted.is_set():
                return False
            controller.job.poll()
            if not controller.job.has_ready_work():
                return False
            started, started_cpu = time.perf_counter(), time.thread_time()
            result = controller._run_unit(co_run=True)
            self._unit_ms += (time.perf_counter() - started) * 1e3
            self._unit_cpu_ms += (time.thread_time() - started_cpu) * 1e3
            if result is None:
                return False
            with self._tokens_lock:
                self._tokens += result.num_trained_tokens
                self._unit_tokens += result.num_tokens
            return True


def _name_os_thread(name: str) -> None:
    """Give the calling thread its name in the OS too (top -H, perf, /proc): Python names it for itself only."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
