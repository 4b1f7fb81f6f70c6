"""How the decode device shares its SMs and memory with the finetune job, one class per policy.

Each policy turns one decode step's shape into the step's time and the finetune work done meanwhile:
`step(t_s, batch_size, num_kv_tokens, kv_reserved_tokens) -> (elapsed_ms, charged_ms, decode_ms, infer_sms, ft_sms,
ft_tokens, ft_bytes, window_layers)`, where charged_ms is what counts against the TPOT target (the elapsed
time plus a wait for an idle-time unit the batch arrived during) and decode_ms the decode forward's part of
it, and `idle(t_s, until_s) -> (t_s, ft_tokens)` runs the device with no batch. The simulated device follows
the profile's latency model (times log-normal noise when ReplayConfig.latency_noise > 0, or times the
recorded ratios of a Recording, recorded_device.py), so with no noise and no recording the profile is exact.

- separate: decode alone on every SM; the finetune job has a device of its own (HARLI SeparateMode).
- static: a fixed split of SMs and memory, 60/40 by default (HARLI StaticMode); finetune always co-runs.
- harvest: the worker's own controller and planner (SpatialController or TemporalController, SplitPlanner)
  on a simulated clock, job and finetune partition (simulated_job.py), over the memory decode does not hold.
- oracle (opt-in): per step the best candidate with the device's true latency; a yardstick, not a policy.
- temporal: time slicing (FlexLLM / LLMStation style): decode alone on every SM, then as many whole
  finetune units as fit in the slack the profile predicts before the TPOT target.
"""

import math
import random

import numpy as np

from allocator.config import kv_reserve_slots
from base.errors import HarvestError
from harvest.colocation.controller import TemporalController, unit_bound_ms
from harvest.colocation.spatial_controller import SpatialController
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.recorded_device import RecordedDecodeNoise, RecordedJob, Recording
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from harvest.replay.simulated_job import (
    SimClock,
    SimulatedJob,
    SimulatedPartitions,
    SimulatedUnitRunner,
)
from harvest.step_stats import DecodeStep, SloTracker
from predictor import Profile, SplitPlanner


class ColocationPolicy:
    name = ""

    def __init__(self, profile: Profile, memory: DeviceMemory, rates: FinetuneRates, config: ReplayConfig,
                 recording: Recording | None = None):
        """`recording`: the device's times as real workers measured them (decode steps, and harvest's units);
        None: the profile, with ReplayConfig.latency_noise."""
        self.profile, self.memory, self.rates, self.config = profile, memory, rates, config
        self.model = profile.latency_model
        self.full_sms = max(self.model.solo.infer_options)
        self.kv_capacity_tokens = memory.kv_capacity_tokens
        self.recording = recording
        self._rng = random.Random(config.seed)
        self._noise = config.latency_noise
        self._recorded = None if recording is None else RecordedDecodeNoise(
            recording, self.model, self.full_sms)
        # HARLI sec. 4.4: keep free the KV decode may need while one layer is copied back to the host.
        swap_ms = memory.ft_layer_bytes / memory.host_link_bytes_per_s * 1e3
        self.reserve_tokens = kv_reserve_slots(swap_ms, config.tpot_slo_ms, config.max_running_requests)

    def device_ms(self, t_s: float, infer_sms: int, ft_sms: int, batch_size: int, seq_len: float) -> float:
        return self.model.predict_colo_ms(infer_sms, ft_sms, batch_size, seq_len) * self.noise(t_s)

    def noise(self, t_s: float) -> float:
        """The device's error from the profile on a step starting at t_s: recorded, drawn, or none."""
        if self._recorded is not None:
            return self._recorded.at(t_s)
        return self._rng.lognormvariate(0.0, self._noise) if self._noise else 1.0

    def lent_window(self, kv_reserved_tokens: int) -> tuple[int, int]:
        """(finetune bytes, window layers) the unreserved KV memory holds; (0, 0) if below the minimum."""
        m = self.memory
        free_bytes = (self.kv_capacity_tokens - kv_reserved_tokens - self.reserve_tokens) * m.kv_bytes_per_token
        window = min(m.ft_num_layers, (free_bytes - m.ft_resident_bytes) // m.ft_layer_bytes)
        if window < self.config.min_window_layers:
            return 0, 0
        return m.ft_resident_bytes + window * m.ft_layer_bytes, window

    def idle_tokens_per_s(self) -> float:
        """Finetune speed on the decode device while no request is running."""
        return self.rates.whole_device_tokens_per_s if self.lent_window(0)[1] else 0.0

    def step(self, t_s: float, batch_size: int, num_kv_tokens: int, kv_reserved_tokens: int) -> tuple:
        raise NotImplementedError

    def idle(self, t_s: float, until_s: float) -> tuple[float, float]:
        """No request runs from t_s until an arrival at until_s: (when the next step may start, tokens)."""
        return until_s, (until_s - t_s) * self.idle_tokens_per_s()


class SeparatePolicy(ColocationPolicy):
    name = "separate"

    def idle_tokens_per_s(self) -> float:
        return 0.0

    def step(self, t_s, batch_size, num_kv_tokens, kv_reserved_tokens):
        ms = self.device_ms(t_s, self.full_sms, 0, batch_size, num_kv_tokens / batch_size)
        return ms, ms, ms, self.full_sms, 0, 0.0, 0, 0


class StaticPolicy(ColocationPolicy):
    name = "static"

    def __init__(self, profile, memory, rates, config, recording=None):
        super().__init__(profile, memory, rates, config, recording)
        if not self.model.has_colo:
            raise HarvestError(
                f"static needs a spatial split, and the profile of {profile.device_name} has one partition "
                "(no co-run model): on this device static is not defined"
            )
        grid = profile.grid
        options = [i for i in grid.infer_options() if grid.ft_options(i) and i in self.model.solo.infer_options]
        self.infer_sms = min(options, key=lambda i: abs(i - config.static_infer_share * grid.num_sms))
        self.ft_sms = max(grid.ft_options(self.infer_sms))
        share = config.static_infer_share
        self.kv_capacity_tokens = int(memory.kv_capacity_tokens * share)
        ft_budget = int(memory.pool_bytes * (1 - share))
        window = min(memory.ft_num_layers, (ft_budget - memory.ft_resident_bytes) // memory.ft_layer_bytes)
        self.window = window if window >= config.min_window_layers else 0
        self.ft_bytes = memory.ft_resident_bytes + self.window * memory.ft_layer_bytes if self.window else 0
        self.colo_tokens_per_s = rates.colo(self.ft_sms) if self.window else 0.0

    def idle_tokens_per_s(self) -> float:
        return self.rates.solo(self.ft_sms) if self.window else 0.0

    def step(self, t_s, batch_size, num_kv_tokens, kv_reserved_tokens):
        ft_sms = self.ft_sms if self.window else 0
        ms = self.device_ms(t_s, self.infer_sms, ft_sms, batch_size, num_kv_tokens / batch_size)
        return ms, ms, ms, self.infer_sms, ft_sms, self.colo_tokens_per_s * ms / 1e3, self.ft_bytes, self.window


class TemporalPolicy(ColocationPolicy):
    name = "temporal"

    def step(self, t_s, batch_size, num_kv_tokens, kv_reserved_tokens):
        seq_len = num_kv_tokens / batch_size
        decode_ms = self.device_ms(t_s, self.full_sms, 0, batch_size, seq_len)
        ft_bytes, window = self.lent_window(kv_reserved_tokens)
        slack_ms = self.config.plan_target_ms - self.model.predict_solo_ms(self.full_sms, batch_size, seq_len)
        num_units = int(slack_ms // self.rates.unit_ms) if window and slack_ms > 0 else 0
        ft_ms = num_units * self.rates.unit_ms
        ft_tokens = self.rates.whole_device_tokens_per_s * ft_ms / 1e3
        return decode_ms + ft_ms, decode_ms + ft_ms, decode_ms, self.full_sms, 0, ft_tokens, ft_bytes, window


class HarvestPolicy(ColocationPolicy):
    name = "harvest"

    def __init__(self, profile, memory, rates, config, recording=None, make_job=SimulatedJob):
        """`make_job(clock, unit_ms, tokens_per_s)`: the job the controller drives (one SimulatedJob, or a
        SimulatedJobSet fed by a job-arrival trace); unused with a recording, whose units are the job's."""
        super().__init__(profile, memory, rates, config, recording)
        self.clock = SimClock()
        margin = config.plan_margin if config.plan_margin > 0 else None
        self.planner = SplitPlanner(profile, config.tpot_slo_ms, plan_margin=margin)
        # The worker's bound on a unit (FinetuneConfig.max_unit_ms), which the profile's units may be under.
        self.unit_ms = min(rates.unit_ms, unit_bound_ms(config.tpot_slo_ms, self.planner.shortest_step_ms))
        if recording is not None:
            self.job = RecordedJob(self.clock, recording)
        else:
            self.job = make_job(self.clock, self.unit_ms, rates.whole_device_tokens_per_s)
        slo = SloTracker(config.tpot_slo_ms, window_steps=1000)
        source = f"profile {profile.device_name} (simulated device)"
        if self.model.has_colo:
            self.planner.expect_switch(self.unit_ms)
            runner = SimulatedUnitRunner(self.job, self.clock, rates.colo, self.unit_ms)
            self.controller = SpatialController(self.job, self.planner, slo, SimulatedPartitions(self.full_sms),
                                                source, runner=runner, clock=self.clock, loop_overhead_ms=0.0,
                                                max_running_requests=config.max_running_requests)
        else:
            self.controller = TemporalController(self.job, self.planner, slo, source, clock=self.clock,
                                                 loop_overhead_ms=0.0, max_running_requests=config.max_running_requests)

    def step(self, t_s, batch_size, num_kv_tokens, kv_reserved_tokens):
        ft_bytes, window = self.lent_window(kv_reserved_tokens)
        self.job.is_ready = window > 0
        step = DecodeStep(0, batch_size, num_kv_tokens, self.clock())
        self.controller.before_step(step)
        decision = self.controller.decision
        decode_ms = self.device_ms(t_s, decision.infer_sms, decision.ft_sms, batch_size, num_kv_tokens / batch_size)
        self.clock.advance_ms(decode_ms)
        step.latency_ms = step.preempt_ms + decode_ms  # a revoke waited on the clock for the unit in flight
        self.controller.after_step(step)
        elapsed_ms = step.latency_ms + step.finetune_ms
        ft_sms = decision.ft_sms if window else 0
        return (elapsed_ms, elapsed_ms + step.idle_wait_ms, decode_ms, decision.infer_sms, ft_sms,
                step.finetune_tokens, ft_bytes, window)

    def idle(self, t_s, until_s):
        """The worker's idle loop: one unit per turn (the turn that takes a partition back runs none) until a
        request has arrived (it waits for the unit)."""
        self.clock.t_s = t_s
        self.job.is_ready = self.lent_window(0)[1] > 0
        tokens = 0.0
        while self.clock() < until_s:
            tokens += self.controller.on_idle()
            if self.controller.idle_turn_worked:
                continue
            wake_s = self.job.wake_s()  # a job arriving (job trace) before the batch does
            if wake_s >= until_s:
                return until_s, tokens
            self.clock.t_s = wake_s
        return self.clock(), tokens


class OraclePolicy(ColocationPolicy):
    """Not deployable, a yardstick for harvest's per-step choice: it knows each step's true latency on every
    candidate (the device's noise draw included) and takes the one that trains the most finetune tokens
    within the target, co-run plus a slice of the same units harvest runs."""

    name = "oracle"

    def __init__(self, profile, memory, rates, config, recording=None):
        super().__init__(profile, memory, rates, config, recording)
        solo = self.model.solo
        self.unit_ms = min(rates.unit_ms, SplitPlanner(profile, config.tpot_slo_ms).shortest_step_ms)
        self.unit_tokens = rates.whole_device_tokens_per_s * self.unit_ms / 1e3
        pairs = [(i, 0) for i in solo.infer_options if i == self.full_sms]
        if self.model.has_colo:
            pairs += [(i, f) for i, f in profile.partitions if f]
        self.infer_sms = np.array([i for i, _ in pairs])
        self.ft_sms = np.array([f for _, f in pairs])
        lines = [solo.coefficients(i) for i, _ in pairs]
        self.b0, self.c0, self.k0 = (np.array([getattr(c, n) for c in lines]) for n in ("b0_ms", "c0_ms", "k0_ms"))
        self.slowdown = np.array([self.model.slowdown(i, f) for i, f in pairs])
        self.co_run_tokens_per_ms = np.array([rates.colo(f) / 1e3 if f else 0.0 for _, f in pairs])
        self.plateau = solo.plateau_batch_size
        self.target = config.tpot_slo_ms

    def step(self, t_s, batch_size, num_kv_tokens, kv_reserved_tokens):
        ft_bytes, window = self.lent_window(kv_reserved_tokens)
        noise = self.noise(t_s)
        padded = max(batch_size, self.plateau)
        ms = (self.b0 * padded + self.c0 + self.k0 * num_kv_tokens) * self.slowdown * noise  # [num_candidates]
        if not window:
            return ms[0], ms[0], ms[0], self.full_sms, 0, 0.0, ft_bytes, window
        num_units = np.floor(np.maximum(self.target - ms, 0.0) / self.unit_ms)
        tokens = np.where(ms <= self.target, self.co_run_tokens_per_ms * ms + num_units * self.unit_tokens, -1.0)
        best = int(np.argmax(tokens)) if tokens.max() > 0 else 0
        elapsed = ms[best] + num_units[best] * self.unit_ms
        return (elapsed, elapsed, ms[best], int(self.infer_sms[best]), int(self.ft_sms[best]),
                max(tokens[best], 0.0), ft_bytes, window)

    def idle(self, t_s, until_s):
        if not self.lent_window(0)[1]:
            return until_s, 0.0
        num_units = math.ceil((until_s - t_s) * 1e3 / self.unit_ms)  # the same idle loop as harvest's
        return t_s + num_units * self.unit_ms / 1e3, num_units * self.unit_tokens


POLICY_CLASSES = {
    cls.name: cls for cls in (SeparatePolicy, StaticPolicy, HarvestPolicy, TemporalPolicy, OraclePolicy)
}
