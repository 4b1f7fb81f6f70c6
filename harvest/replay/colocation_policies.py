"""How the decode device shares its SMs and memory with the finetune job, one class per policy.

Each policy turns one decode step's shape into the step's latency and the finetune work done meanwhile:
`step(batch_size, num_kv_tokens, kv_reserved_tokens) -> (latency_ms, infer_sms, ft_sms, ft_tokens,
ft_bytes, window_layers)`. The simulated device follows the profile's latency model (times log-normal
noise when ReplayConfig.latency_noise > 0), so with no noise the profile is exact.

- separate: decode alone on every SM; the finetune job has a device of its own (HARLI SeparateMode).
- static: a fixed split of SMs and memory, 60/40 by default (HARLI StaticMode); finetune always co-runs.
- harvest: predictor.SplitPlanner per step (the worker's own decision code) over the memory decode
  does not hold; on a temporal-only profile (CPU) the planner's slack is filled with finetune units.
- temporal: time slicing (FlexLLM / LLMStation style): decode alone on every SM, then as many whole
  finetune units as fit in the slack the profile predicts before the TPOT target.
"""

import math
import random

from base.errors import HarvestError
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from predictor import Profile, SplitPlanner


class ColocationPolicy:
    name = ""

    def __init__(self, profile: Profile, memory: DeviceMemory, rates: FinetuneRates, config: ReplayConfig):
        self.profile, self.memory, self.rates, self.config = profile, memory, rates, config
        self.model = profile.latency_model
        self.full_sms = max(self.model.solo.infer_options)
        self.kv_capacity_tokens = memory.kv_capacity_tokens
        self._rng = random.Random(config.seed)
        self._noise = config.latency_noise
        # HARLI sec. 4.4: keep free the KV decode may need while one layer is copied back to the host.
        swap_ms = memory.ft_layer_bytes / memory.host_link_bytes_per_s * 1e3
        self.reserve_tokens = math.ceil(swap_ms / config.tpot_slo_ms * config.max_running_requests)

    def device_ms(self, infer_sms: int, ft_sms: int, batch_size: int, seq_len: float) -> float:
        ms = self.model.predict_colo_ms(infer_sms, ft_sms, batch_size, seq_len)
        return ms * self._rng.lognormvariate(0.0, self._noise) if self._noise else ms

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

    def step(self, batch_size: int, num_kv_tokens: int, kv_reserved_tokens: int) -> tuple:
        raise NotImplementedError


class SeparatePolicy(ColocationPolicy):
    name = "separate"

    def idle_tokens_per_s(self) -> float:
        return 0.0

    def step(self, batch_size, num_kv_tokens, kv_reserved_tokens):
        ms = self.device_ms(self.full_sms, 0, batch_size, num_kv_tokens / batch_size)
        return ms, self.full_sms, 0, 0.0, 0, 0


class StaticPolicy(ColocationPolicy):
    name = "static"

    def __init__(self, profile, memory, rates, config):
        super().__init__(profile, memory, rates, config)
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

    def step(self, batch_size, num_kv_tokens, kv_reserved_tokens):
        ft_sms = self.ft_sms if self.window else 0
        ms = self.device_ms(self.infer_sms, ft_sms, batch_size, num_kv_tokens / batch_size)
        return ms, self.infer_sms, ft_sms, self.colo_tokens_per_s * ms / 1e3, self.ft_bytes, self.window


class TemporalPolicy(ColocationPolicy):
    name = "temporal"

    def step(self, batch_size, num_kv_tokens, kv_reserved_tokens):
        seq_len = num_kv_tokens / batch_size
        decode_ms = self.device_ms(self.full_sms, 0, batch_size, seq_len)
        ft_bytes, window = self.lent_window(kv_reserved_tokens)
        slack_ms = self.config.plan_target_ms - self.model.predict_solo_ms(self.full_sms, batch_size, seq_len)
        num_units = int(slack_ms // self.rates.unit_ms) if window and slack_ms > 0 else 0
        ft_ms = num_units * self.rates.unit_ms
        ft_tokens = self.rates.whole_device_tokens_per_s * ft_ms / 1e3
        return decode_ms + ft_ms, self.full_sms, 0, ft_tokens, ft_bytes, window


class HarvestPolicy(ColocationPolicy):
    name = "harvest"

    def __init__(self, profile, memory, rates, config):
        super().__init__(profile, memory, rates, config)
        self.planner = SplitPlanner(profile, config.plan_target_ms)
        self.is_spatial = self.model.has_colo
        self._colo_tokens_per_s = {}
        if self.is_spatial:
            self._colo_tokens_per_s = {f: rates.colo(f) for _, f in profile.partitions if f}

    def step(self, batch_size, num_kv_tokens, kv_reserved_tokens):
        seq_len = num_kv_tokens / batch_size
        ft_bytes, window = self.lent_window(kv_reserved_tokens)
        decision = self.planner.plan(batch_size, seq_len, window > 0)
        decode_ms = self.device_ms(decision.infer_sms, decision.ft_sms, batch_size, seq_len)
        self.planner.observe(decision, decode_ms)
        if decision.ft_sms:
            ft_tokens = self._colo_tokens_per_s[decision.ft_sms] * decode_ms / 1e3
            return decode_ms, decision.infer_sms, decision.ft_sms, ft_tokens, ft_bytes, window
        if not self.is_spatial and window and decision.slack_ms > 0:
            ft_ms = (decision.slack_ms // self.rates.unit_ms) * self.rates.unit_ms
            if ft_ms > 0:
                ft_tokens = self.rates.whole_device_tokens_per_s * ft_ms / 1e3
                return decode_ms + ft_ms, decision.infer_sms, 0, ft_tokens, ft_bytes, window
        return decode_ms, decision.infer_sms, 0, 0.0, ft_bytes, window


POLICY_CLASSES = {cls.name: cls for cls in (SeparatePolicy, StaticPolicy, HarvestPolicy, TemporalPolicy)}
