"""What the step loop drives, once per decode step: before_step (plan) -> decode -> after_step (account,
then a temporal slice) -> stats; on_idle between steps. TemporalController and SpatialController are its
two forms: they differ only in what runs *during* a step (nothing, or finetune units on the partition the
planner gave them).

After every step, what is left of its TPOT budget, as measured, goes to finetune units on the whole device
(the temporal slice): a unit is admitted while a high quantile of its kind's recent times fits, within a
share of the slack that backs off when a step runs long or misses the target, less a reserve for how far
recent units ran past their estimates (host stalls), and no longer than keeps the batch it would grow, and
its spread, within what decode alone can serve in the target (BatchCost; eval/README.md, "Temporal slice",
says why each number is what it is). The step's record says what it was charged: the slice, and the wait of a
batch that arrived while an idle-time unit ran.
"""

import contextlib
import math
import time
from collections import deque

from harvest.colocation.finetune_job import ACTIVE_PHASES
from harvest.colocation.unit_times import UnitTimes
from harvest.step_stats import DecodeStep, SloTracker

BACKOFF_LATENCY_FRACTION = 0.7
FILL_RECOVERY_PER_STEP = 0.02
LOOP_OVERHEAD_MS = 2.0
BATCH_COST_DECAY = 0.99
"""Per-step forgetting of the decode cost fit (~100 steps of memory): the host and the context lengths drift."""
BATCH_SPREAD_DECAY = 0.999
"""Per-step forgetting of the batch sizes' spread (~1000 steps, many requests' lifetimes): the load's spread,
not one burst's."""
MIN_SPREAD_STEPS = 100
"""Until this many steps are seen, batches are taken to spread as independent arrivals make them (dispersion 1)."""
BATCH_SPREAD_Z = 3.09
"""The batch a slice leads to keeps this many of its standard deviations (on the square-root scale, BatchCost)
within what decode alone serves: the normal 99.9th percentile, the steps harvest aims to keep."""
RECENT_OVERRUNS = 256
MIN_OVERRUNS = 64
OVERRUN_QUANTILE = 0.99
RECENT_SLICES = 1000
RESERVE_QUANTILE = 0.999
"""The slice keeps back this high a quantile, over recent slices, of how far a slice's units ran past the
estimates they were admitted at: a unit the host stalls (preemption, another thread holding the GIL) overruns
any estimate of its own kind. A slice ends within its budget if no unit ran further past its estimate than
the reserve, so at most one slice in RECENT_SLICES overruns by a stall (the second longest of 1000): the
99.9 % of steps harvest aims at."""
PREEMPTION_BOUND_SHARE = 0.25
"""Units are cut to this share of the TPOT target where no profile gives a shorter bound: a step that waits for
the unit in flight on a finetune partition keeps three quarters of its target for decode."""


def unit_bound_ms(tpot_slo_ms: float, shortest_step_ms: float | None) -> float:
    """How long a job's unit may run (FinetuneConfig.max_unit_ms, unless set), the worker's and the simulator's.
    With a profile (`shortest_step_ms`, the planner's): no longer than the shortest decode step, so a pause, a
    batch arriving while the device is idle and finetuning, or a slice taking a finetune partition back takes
    effect within one step, but for a unit whose fixed cost is over half of it, which runs up to twice that cost
    (unit_sizer.py says why). Without one: the preemption bound, a share of the target (a spatial job then holds
    its partition across steps, and a step that takes it back waits for the unit in flight: preempt_ms_max)."""
    return tpot_slo_ms * PREEMPTION_BOUND_SHARE if shortest_step_ms is None else shortest_step_ms


def quantile(values, q: float) -> float:
    """The q-quantile of `values` by rank (no interpolation: a value that was measured)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


class BatchCost:
    """How decode alone grows with the batch, and so how far the slices may stretch a step.

    A slice stretches TPOT, requests stay longer and batches grow (Little's law: the batch in flight scales
    with the time a step takes), so the slice is bounded by the batch it would lead to: stretching a step of
    latency L at batch b to T leads to a mean of about b x T / L requests, and decode alone at that batch, times
    a high quantile of how far decode runs over its fit on this host, must stay within the target; a request
    more than now must fit too, or nothing is sliced. Arrivals are random, so batches spread around that mean:
    independent arrivals make the batch Poisson, whose square root spreads by 1/2 at any mean (Anscombe), and a
    load `dispersion` times as spread out by sqrt(dispersion) / 2; the mean's square root is kept BATCH_SPREAD_Z
    such spreads under the square root of the batch decode alone serves, so bursts seldom carry batches past
    it. The fit is an exponentially weighted least-squares line of step latency on batch size;
    until batch sizes have spread enough to fit it, each request costs the step's mean per request (as if
    decode had no fixed cost: the most a request can add where cost grows with batch, as on CPUs) and the
    quantile is 1 / BACKOFF_LATENCY_FRACTION. eval/README.md ("Temporal slice") has why."""

    def __init__(self, decay: float = BATCH_COST_DECAY, max_running: float = math.inf,
                 larger_batches_overrun: bool = True):
        """`max_running`: the most requests the scheduler decodes at once (SGLang's max_running_requests): the
        batch grows no further, and a request past it waits for admission, which costs its TTFT, not its TPOT.
        `larger_batches_overrun`: the overrun quantile over the steps of the larger batches only (decode alone on
        the whole device: a stall is a larger share of a short step than of the long ones max_batch is asked
        about); False: over all steps (decode beside a finetune partition, SpatialController: its tail at the
        larger batches is heavier and too rare in a phase's steps to measure, and all steps' quantile keeps the
        give-back where a trainer pinned beside decode missed: eval/results/cpu-2026-11-30/unit-estimate/)."""
        self.decay = decay
        self.max_running = max_running
        self.larger_batches_overrun = larger_batches_overrun
        self._w = self._b = self._bb = self._y = self._by = 0.0
        self.slope_ms: float | None = None
        self.intercept_ms = 0.0
        self._overrun: deque[tuple[int, float]] = deque(maxlen=RECENT_OVERRUNS)  # (batch, measured / fitted)
        self._overrun_quantile: float | None = None
        self._spread_w = self._spread_b = self._spread_bb = 0.0
        self.dispersion = 1.0
        """Variance over mean of recent batch sizes: 1 for independent arrivals, more for bursts."""

    def observe(self, batch_size: int, latency_ms: float) -> None:
        if self.slope_ms is not None:
            fitted = self.intercept_ms + self.slope_ms * batch_size
            if fitted > 0:
                self._overrun.append((batch_size, latency_ms / fitted))
                if len(self._overrun) >= MIN_OVERRUNS and len(self._overrun) % 16 == 0:
                    largest = max(batch for batch, _ in self._overrun) if self.larger_batches_overrun else 0
                    ratios = [ratio for batch, ratio in self._overrun if 2 * batch >= largest]
                    self._overrun_quantile = max(1.0, quantile(ratios, OVERRUN_QUANTILE))
        d = BATCH_SPREAD_DECAY
        self._spread_w = d * self._spread_w + 1.0
        self._spread_b = d * self._spread_b + batch_size
        self._spread_bb = d * self._spread_bb + batch_size * batch_size
        if self._spread_w >= MIN_SPREAD_STEPS:
            mean = self._spread_b / self._spread_w
            self.dispersion = max(0.0, self._spread_bb / self._spread_w - mean * mean) / mean
        d = self.decay
        self._w = d * self._w + 1.0
        self._b = d * self._b + batch_size
        self._bb = d * self._bb + batch_size * batch_size
        self._y = d * self._y + latency_ms
        self._by = d * self._by + batch_size * latency_ms
        mean_b = self._b / self._w
        var_b = self._bb / self._w - mean_b * mean_b
        if self._w >= 20 and var_b >= 0.1:
            cov = self._by / self._w - mean_b * self._y / self._w
            self.slope_ms = max(0.0, cov / var_b)
            self.intercept_ms = self._y / self._w - self.slope_ms * mean_b

    @property
    def mean_ms_per_request(self) -> float | None:
        """The recent steps' time over their requests (None before a step): what a request costs if decode had
        no fixed cost, the most it can cost where the cost grows with the batch."""
        return self._y / self._b if self._b > 0 else None

    @property
    def is_learned(self) -> bool:
        """A line is fitted and its overrun quantile measured: no stand-in is in use."""
        return self.slope_ms is not None and self._overrun_quantile is not None

    @property
    def overrun_quantile(self) -> float:
        """How far decode runs over its fit: a high quantile of measured / fitted over the recent steps (with
        larger_batches_overrun, those whose batch is at least half the largest recent one)."""
        return 1.0 / BACKOFF_LATENCY_FRACTION if self._overrun_quantile is None else self._overrun_quantile

    def max_batch(self, target_ms: float, per_request_ms: float | None = None) -> float:
        """The largest batch decode serves in `target_ms` at the overrun quantile (inf: it does not grow with
        the batch, or no line is fitted and no `per_request_ms` stands in for it)."""
        if self.slope_ms is None:
            intercept, per_request = 0.0, per_request_ms
        else:
            intercept, per_request = self.intercept_ms, self.slope_ms
        if per_request is None or per_request <= 0:
            return math.inf
        return (target_ms / self.overrun_quantile - intercept) / per_request

    def stretch_limit_ms(self, batch_size: int, latency_ms: float, target_ms: float) -> float:
        """The longest a step of `latency_ms` at `batch_size` may take, slice included (0: no slice)."""
        max_batch = self.max_batch(target_ms, latency_ms / batch_size)
        if max_batch >= self.max_running:
            return math.inf  # the largest batch the scheduler runs is one decode alone serves: growth costs nothing
        root = math.sqrt(max_batch) - BATCH_SPREAD_Z * math.sqrt(self.dispersion) / 2 if max_batch > 0 else 0.0
        max_mean_batch = root * root if root > 0 else 0.0
        if max_mean_batch < batch_size + 1:
            return 0.0
        return latency_ms * max_mean_batch / batch_size


class Controller:
    mode = ""

    def __init__(self, job, planner, slo: SloTracker, planner_source: str, lender=None, clock=time.perf_counter,
                 loop_overhead_ms: float = LOOP_OVERHEAD_MS, max_running_requests: float = math.inf):
        """`planner`: a SplitPlanner, or None (no profile: each step's slice is the target minus its measured
        time). `lender`: the KvLender whose chunks hold the job's weight window (None: no KV lending).
        `clock`: seconds; the simulator passes its own. `loop_overhead_ms`: the scheduler's own time between
        a step's result and the next launch, kept out of the slice (the simulator has none).
        `max_running_requests`: the scheduler's cap on the batch (BatchCost.max_running)."""
        self.loop_overhead_ms = loop_overhead_ms
        self.job = job
        self.planner = planner
        self.slo = slo
        self.planner_source = planner_source
        self.lender = lender
        self.clock = clock
        self.unit_times = UnitTimes()
        self._decision = None
        self._idle_unit_ms = 0.0
        self._publish_ms = 0.0
        self.fill_fraction = 1.0
        self.batch_cost = BatchCost(max_running=max_running_requests)
        self.num_slices_cut_for_growth = 0
        self.num_units_in_slack = 0
        self.num_units_idle = 0
        self.idle_turn_worked = False
        """The last idle turn did the job's work (a unit, or a partition taken back from its unit in flight): the
        idle loop comes straight back for the next turn instead of waiting for a request."""
        self.finetune_ms_in_slack = 0.0
        self.max_idle_wait_ms = 0.0
        self._slice_excess_ms: deque[float] = deque(maxlen=RECENT_SLICES)
        self.slice_reserve_ms = 0.0
        self.unit_tokens = 0
        """Tokens through every unit run so far (a token counts once per unit it passes): training work."""

    # ---- the interface the step loop uses ----

    @property
    def decision(self):
        """The planner's decision for the current step (None without a planner)."""
        return self._decision

    @property
    def decode_stream(self):
        """The stream the step launches on (its partition's); None: SGLang's own streams, the whole device."""
        return None

    def decode_stream_context(self):
        """Where the scheduler thread runs the step (a CPU core partition's cores): here, where it is."""
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    def before_step(self, step: DecodeStep) -> None:
        # A batch that arrived while an idle-time unit ran waited for it: at most that unit's time.
        step.publish_ms = self._publish_ms
        step.idle_wait_ms = self._idle_unit_ms + self._publish_ms
        self._idle_unit_ms = self._publish_ms = 0.0
        if not self._is_job_beside_decode():
            self.job.poll()
        if self.planner is None:
            self._decision = None
            return
        self._decision = self.planner.plan(step.batch_size, step.mean_seq_len, self.job.has_ready_work())
        step.predicted_ms = self._decision.predicted_ms
        self._start_co_run(self._decision, step)

    def after_step(self, step: DecodeStep, kv_demand_slots: int = 0) -> None:
        """The step's tokens are out: give decode the KV memory it needs, fill what is left of the step's
        budget with finetune units, and record the step (step.finetune_tokens, step.is_slo_met)."""
        started = self.clock()
        self._observe(step, started)
        budget_ms = self._slice_budget_ms(step)
        # Reclaiming KV for decode always happens; growing the job's window only where the slice has room.
        did_memory_work = self._lend_or_reclaim(step, kv_demand_slots, can_grow=budget_ms > 0)
        did_slice_work, excess_ms = self._run_slice(step, started, budget_ms)
        self._account(step, started, budget_ms, excess_ms, did_slice_work or did_memory_work)

    # ---- after_step's phases ----

    def _observe(self, step: DecodeStep, started: float) -> None:
        """What the step measured: the co-run's tokens, the planner's correction, the share of slack the
        slice may fill (backs off when a step runs long), and decode's cost at this batch."""
        step.finetune_tokens = self._end_co_run(step)
        if self._decision_co_ran():
            step.ft_sms = self._co_run_ft_sms()
            step.co_run_tail_ms = (self.clock() - started) * 1e3
        decision = self._decision
        if decision is not None:
            # A wait for the finetune partition's unit in flight, before decode took the device back, is
            # in the step's time but not decode's.
            self.planner.observe(decision, step.latency_ms - step.preempt_ms)
        if step.latency_ms > BACKOFF_LATENCY_FRACTION * self.slo.tpot_slo_ms and self._is_slice_after_step():
            # A long step on a partition the job holds across steps is its split's (the chooser's to judge): no
            # slice follows it, and halving here would cut the slices of the whole device's next steps.
            self.fill_fraction /= 2
        else:
            self.fill_fraction = min(1.0, self.fill_fraction + FILL_RECOVERY_PER_STEP)
        if not self._decision_co_ran():
            # Not the wait for the partition's unit in flight: a preemption is not decode's cost at this batch,
            # and in the fit's overrun quantile it cut the slices of every step after it.
            self.batch_cost.observe(step.batch_size, step.latency_ms - step.preempt_ms)
        elif decision is not None and decision.ft_sms > 0:
            # A co-run step, scaled to decode alone by the planner's own prediction: a worker that co-runs on
            # nearly every step would otherwise never fit the line (eval/README.md, "Simulated replay").
            self.batch_cost.observe(step.batch_size, step.latency_ms * decision.alone_ms / decision.predicted_ms)

    def _slice_budget_ms(self, step: DecodeStep) -> float:
        """The temporal slice's budget: the share of the step's slack the slice may fill, no longer than keeps
        the batch it would grow within what decode alone serves in the target (0 or less: no slice)."""
        target_ms = self.slo.tpot_slo_ms
        spent_ms = step.latency_ms + step.idle_wait_ms
        budget_ms = self.fill_fraction * (target_ms - spent_ms) - self.loop_overhead_ms
        stretch_budget_ms = (self.batch_cost.stretch_limit_ms(step.batch_size, step.latency_ms, target_ms)
                             - spent_ms - self.loop_overhead_ms)
        if budget_ms > 0 and stretch_budget_ms < budget_ms:
            # The batch the slice would grow would take decode alone past the target: a shorter slice or
            # none, so requests finish before they overlap the next arrivals (eval/README.md).
            budget_ms = max(0.0, stretch_budget_ms)
            self.num_slices_cut_for_growth += 1
        return budget_ms

    def _lend_or_reclaim(self, step: DecodeStep, kv_demand_slots: int, can_grow: bool) -> bool:
        """The memory phase (step.memory_ms): True if it did any work."""
        memory_started = self.clock()
        did_memory_work = self._rebalance_memory(kv_demand_slots, can_grow=can_grow)
        step.memory_ms = (self.clock() - memory_started) * 1e3 if did_memory_work else 0.0
        return did_memory_work

    def _run_slice(self, step: DecodeStep, started: float, budget_ms: float) -> tuple[bool, float]:
        """Finetune units on the whole device while the next one's estimate fits the budget, less the reserve
        for stalls, from `started` on. Returns whether any ran and how far the one furthest past its estimate ran
        past it (the slice's excess, the reserve's sample)."""
        if self._is_job_beside_decode():
            return False, 0.0
        self.job.poll()
        num_units = 0
        admit_ms = budget_ms - self.slice_reserve_ms
        excess_ms = 0.0
        while self.job.has_ready_work():
            kind = self.job.next_unit_kind()
            predicted_ms = self.job.next_unit_predicted_ms()
            estimate_ms = self.unit_times.estimate_ms(kind, self.job.max_unit_ms, predicted_ms)
            room_ms = admit_ms - (self.clock() - started) * 1e3
            if estimate_ms > room_ms:
                if room_ms > 0 and self.unit_times.forget_a_stall(kind, room_ms, predicted_ms):
                    continue
                break
            result = self._run_unit(predicted_ms=predicted_ms)
            if result is None:
                break
            excess_ms = max(excess_ms, result.duration_ms - estimate_ms)
            step.overrun_ms += max(0.0, result.duration_ms - estimate_ms)
            # Where the plan ended the slice when it admitted this unit: the time already spent (units before
            # it as they ran, not as estimated) plus its estimate; admission keeps it within the budget.
            step.planned_ms = max(step.planned_ms, admit_ms - room_ms + estimate_ms
                                  - step.co_run_tail_ms - step.memory_ms)
            step.finetune_tokens += result.num_trained_tokens
            num_units += 1
            self.num_units_in_slack += 1
        if not num_units:
            self.job.note_no_room()
        return num_units > 0, excess_ms

    def _account(self, step: DecodeStep, started: float, budget_ms: float, excess_ms: float,
                 did_work: bool) -> None:
        """Charge the step what ran after it (slice, memory work, the co-run's tail) and the wait before it,
        learn the slice reserve, and record the step against the target."""
        finetune_ms = (self.clock() - started) * 1e3 if did_work or self._decision_co_ran() else 0.0
        if budget_ms > 0:  # a slice with no unit counts too: a reserve that leaves no room is forgotten
            recent = self._slice_excess_ms
            dropped_ms = recent[0] if len(recent) == recent.maxlen else 0.0
            recent.append(excess_ms)
            if excess_ms > 0 or dropped_ms > 0 or len(recent) % 64 == 0:  # most slices have none: sort less
                self.slice_reserve_ms = quantile(recent, RESERVE_QUANTILE)
        self.finetune_ms_in_slack += finetune_ms
        step.finetune_ms = finetune_ms
        self.max_idle_wait_ms = max(self.max_idle_wait_ms, step.idle_wait_ms)
        step.is_slo_met = self.slo.record(step.latency_ms + finetune_ms + step.idle_wait_ms)
        if not step.is_slo_met and self._is_slice_after_step():
            self.fill_fraction /= 2  # whatever overran (a unit, memory work, the wait), give decode room

    def charge_publish_ms(self, load_ms: float) -> None:
        """SGLang loading a published adapter in the scheduler thread, outside a step, delays the next step:
        charged to it as a wait, like an idle-time unit (step.publish_ms says how much of the wait it was)."""
        self._publish_ms += load_ms

    def on_idle(self, kv_demand_slots: int = 0) -> int:
        """No decode batch: run one unit (the loop comes back here between units to check for requests).
        Returns the finetune tokens it trained."""
        self.idle_turn_worked = False
        self._rebalance_memory(kv_demand_slots)
        self.job.poll()
        if not self.job.has_ready_work():
            return 0
        started = self.clock()
        result = self._run_unit(predicted_ms=self.job.next_unit_predicted_ms())
        self._idle_unit_ms = (self.clock() - started) * 1e3
        if result is None:
            return 0
        self.num_units_idle += 1
        self.idle_turn_worked = True
        return result.num_trained_tokens

    def stats(self) -> dict:
        decision = self._decision
        return {
            "mode": self.mode,
            "planner": self.planner_source,
            "split": None if decision is None else {
                "infer_sms": decision.infer_sms, "ft_sms": decision.ft_sms,
                "predicted_ms": round(decision.predicted_ms, 3), "slack_ms": round(decision.slack_ms, 3),
                "predicted_finetune_tokens_per_s": round(decision.finetune_tokens_per_s, 3),
                "margin": round(decision.margin, 4),
                "is_finetune_paused": decision.is_finetune_paused,
                "is_slo_unreachable": decision.is_slo_unreachable,
            },
            "predictor": None if self.planner is None else {
                **self.planner.stats().to_dict(), "margin": self.planner.margin_stats(),
                "finetune_rates": self.planner.rate_source,
            },
            "fill_fraction": round(self.fill_fraction, 4),
            "batch_cost_ms_per_request": None if self.batch_cost.slope_ms is None
            else round(self.batch_cost.slope_ms, 3),
            "decode_overrun_quantile": round(self.batch_cost.overrun_quantile, 3),
            "batch_dispersion": round(self.batch_cost.dispersion, 3),
            "slices_cut_for_growth": self.num_slices_cut_for_growth,
            "slice_reserve_ms": round(self.slice_reserve_ms, 3),
            "units_in_slack": self.num_units_in_slack,
            "units_idle": self.num_units_idle,
            "unit_tokens": self.unit_tokens,
            "finetune_ms_in_slack": round(self.finetune_ms_in_slack, 1),
            "reaction": self.reaction_stats(),
            "unit_ms": self.unit_time_stats(),
            "slo": self.slo.snapshot(),
        }

    def unit_time_stats(self) -> dict:
        """Per unit kind, its recent times and what the slice admits it at (UnitTimes.stats)."""
        return self.unit_times.stats(self.job.max_unit_ms)

    def reaction_stats(self) -> dict:
        """How soon decode gets the device back: a batch arriving during an idle-time unit waits for it."""
        longest = self.unit_times.longest_recent_ms()
        shortest_step = None if self.planner is None else self.planner.shortest_step_ms
        return {
            "longest_recent_unit_ms": None if longest is None else round(longest, 3),
            "max_idle_wait_ms": round(self.max_idle_wait_ms, 3),
            "shortest_step_ms": None if shortest_step is None else round(shortest_step, 3),
            "pause_within_one_step": None if longest is None or shortest_step is None else longest <= shortest_step,
        }

    # ---- what the two forms differ in ----

    def _start_co_run(self, decision, step: DecodeStep) -> None:
        """The step is about to launch on decision.infer_sms: start finetuning beside it, if anywhere."""

    def _end_co_run(self, step: DecodeStep) -> int:
        """The step's tokens are out: stop finetuning beside it; the tokens it trained meanwhile."""
        return 0

    def _is_slice_after_step(self) -> bool:
        """Whether a temporal slice may run after this step (not while a spatial job holds its partition)."""
        return True

    def _is_job_beside_decode(self) -> bool:
        """The unit thread holds the job between steps (spatial: a finetune partition is granted): the scheduler
        thread neither polls it nor runs slice units."""
        return False

    # ---- shared ----

    def _decision_co_ran(self) -> bool:
        return self._decision is not None and self._decision.ft_sms > 0

    def _co_run_ft_sms(self) -> int:
        return self._decision.ft_sms

    def _rebalance_memory(self, kv_demand_slots: int, can_grow: bool = True) -> bool:
        """Reclaim lent KV memory decode needs, else grow the job's window; True if it did any work."""
        if self.lender is None:
            return False
        engine = self.job.engine if self.job.is_active else None
        if engine is not None and engine.is_shared:
            # The job computes on the served weights: no window, so nothing to lend KV chunks to; reclaim
            # still runs (it finds nothing lent).
            self.lender.note_nothing_to_lend("the job computes on the served weights (shared mode): no window")
            engine = None
        if engine is not self.lender.engine:
            if engine is None:
                self.lender.detach_engine()
            else:
                self.lender.attach_engine(engine, engine.num_window_layers)
        # Growth waits while the operator pauses the job, not while it waits for memory: that is what it needs.
        return self.lender.rebalance(kv_demand_slots, can_grow=can_grow and self.job.state in ACTIVE_PHASES)

    def _run_unit(self, co_run: bool = False, predicted_ms: float | None = None):
        """Run the job's next unit and keep its time, and its time over `predicted_ms` (the job's prediction for
        it, next_unit_predicted_ms, asked by the caller; None for a co-run unit, `co_run`: beside decode, on the
        finetune partition, whose time never prices a slice)."""
        result = self.job.run_unit()
        if result is not None:
            self.unit_tokens += result.num_tokens
            if result.duration_ms > 0:
                self.unit_times.record(result.kind, result.duration_ms, co_run, predicted_ms)
        return result


class TemporalController(Controller):
    """Temporal co-location (CPU hosts, GPUs without green contexts, HARLI sec. 6.2): decode owns the whole
    device during its step; finetune units run only in the temporal slice after it and while no batch exists."""

    mode = "temporal"

    def _decision_co_ran(self) -> bool:
        return False  # whatever pair the planner named, decode ran alone on the whole device
