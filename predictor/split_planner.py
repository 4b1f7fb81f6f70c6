"""Per-step SM split (HARLI sec. 5.2.3 and 6.2): the co-run partition whose predicted decode latency is
closest to the TPOT target without exceeding it.

A decision must cost a few arithmetic operations (HARLI: 5 us per prediction). Stage 2 is a factor per
partition, so everything but the stage-1 line is precomputed: per inference partition, the co-run
factors (slowdown times the partition's own correction) in descending order and the solo latency each
one allows, target / factor, ascending. A decision evaluates the solo line once per inference partition,
scaled by the device-wide correction, and bisects for the largest factor whose allowance covers it (no
division: measured 30% faster than dividing). observe() rebuilds only the measured partition's row.
"""

import math
from bisect import bisect_left
from dataclasses import dataclass

from base.errors import HarvestError
from predictor.config import DEFAULT_CONFIG, PredictorConfig
from predictor.profile import Profile
from predictor.residual_tracker import PredictionStats, ResidualTracker


@dataclass(slots=True)
class SplitDecision:
    infer_sms: int
    ft_sms: int
    """0 when the finetune job gets no SMs this step (paused, idle, or temporal sharing on a CPU)."""
    predicted_ms: float
    """Predicted decode latency with the online correction applied."""
    slack_ms: float
    """TPOT target minus predicted_ms; on a CPU the runtime fills it with finetune units."""
    is_finetune_paused: bool
    """The finetune job has ready work but no partition (or, on a CPU, no slack) leaves room for it."""
    is_slo_unreachable: bool
    """Even decode alone on every SM is predicted to miss the target."""
    model_ms: float
    """The profile's uncorrected prediction; observe() learns measured / model_ms."""


class SplitPlanner:
    def __init__(self, profile: Profile, tpot_slo_ms: float, config: PredictorConfig = DEFAULT_CONFIG) -> None:
        if not (math.isfinite(tpot_slo_ms) and tpot_slo_ms > 0):
            raise HarvestError(f"TPOT SLO must be a positive number of ms, got {tpot_slo_ms}")
        self.profile = profile
        self.tpot_slo_ms = float(tpot_slo_ms)
        model = profile.latency_model
        self._plateau = model.solo.plateau_batch_size
        self._tracker = ResidualTracker(config.ewma_alpha)
        self._full_sms = max(model.solo.infer_options)
        full = model.solo.coefficients(self._full_sms)
        self._full_line = (full.b0_ms, full.c0_ms, full.k0_ms)
        # infer_sms -> [(ft_sms, slowdown)]: the static part of every co-run prediction.
        self._slowdowns: dict[int, list[tuple[int, float]]] = {}
        for infer_sms, ft_sms in model.partitions():
            if ft_sms:
                self._slowdowns.setdefault(infer_sms, []).append((ft_sms, model.slowdown(infer_sms, ft_sms)))
        self._is_spatial = bool(self._slowdowns)
        self._row_index = {infer_sms: n for n, infer_sms in enumerate(self._slowdowns)}
        self._rows = [self._build_row(infer_sms) for infer_sms in self._slowdowns]
        self._global_correction = 1.0
        self._full_relative_correction = 1.0

    def _build_row(self, infer_sms: int) -> tuple:
        relative = self._tracker.relative_correction
        c = self.profile.latency_model.solo.coefficients(infer_sms)
        # (factor, ft_sms, relative correction), largest factor first; factor = slowdown * relative correction
        corrected = sorted(
            ((s * relative((infer_sms, f)), f, relative((infer_sms, f))) for f, s in self._slowdowns[infer_sms]),
            reverse=True,
        )
        allowances = [_allowance(self.tpot_slo_ms, factor) for factor, _, _ in corrected]
        return (c.b0_ms, c.c0_ms, c.k0_ms, infer_sms, allowances[-1], allowances, corrected)

    def plan(self, batch_size: int, seq_len: float, has_ready_work: bool) -> SplitDecision:
        if batch_size < 1 or seq_len < 0:
            raise HarvestError(f"a decode step needs batch_size >= 1 and seq_len >= 0, got {batch_size}, {seq_len}")
        padded = batch_size if batch_size > self._plateau else self._plateau
        num_kv_tokens = batch_size * seq_len
        target = self.tpot_slo_ms
        g = self._global_correction
        if has_ready_work and self._is_spatial:
            best = 0.0
            for b0, c0, k0, infer_sms, max_allowance, allowances, corrected in self._rows:
                solo = (b0 * padded + c0 + k0 * num_kv_tokens) * g
                if solo <= max_allowance:
                    factor, ft_sms, relative = corrected[bisect_left(allowances, solo)]
                    if factor * solo > best:
                        best = factor * solo
                        best_infer, best_ft, best_correction = infer_sms, ft_sms, relative * g
            if best > 0.0:
                return SplitDecision(best_infer, best_ft, best, target - best, False, False, best / best_correction)
        b0, c0, k0 = self._full_line
        model_ms = b0 * padded + c0 + k0 * num_kv_tokens
        predicted = model_ms * g * self._full_relative_correction
        slack = target - predicted
        is_paused = has_ready_work and (self._is_spatial or slack <= 0.0)
        return SplitDecision(self._full_sms, 0, predicted, slack, is_paused, predicted > target, model_ms)

    def observe(self, decision: SplitDecision, measured_ms: float) -> None:
        """Feed the measured latency of the step `decision` planned into the online correction."""
        if not (math.isfinite(measured_ms) and measured_ms > 0):
            raise HarvestError(f"measured decode latency must be a positive number of ms, got {measured_ms}")
        self._tracker.update(
            (decision.infer_sms, decision.ft_sms), decision.model_ms, decision.predicted_ms, measured_ms
        )
        self._global_correction = self._tracker.global_correction
        if decision.ft_sms:
            self._rows[self._row_index[decision.infer_sms]] = self._build_row(decision.infer_sms)
        else:
            self._full_relative_correction = self._tracker.relative_correction((self._full_sms, 0))

    def correction(self, infer_sms: int, ft_sms: int) -> float:
        return self._tracker.correction((infer_sms, ft_sms))

    def stats(self) -> PredictionStats:
        return self._tracker.stats()

    @property
    def num_candidates(self) -> int:
        return sum(len(row[5]) for row in self._rows) + 1


def _allowance(target_ms: float, factor: float) -> float:
    """The largest solo latency whose co-run prediction factor * solo stays <= target_ms after rounding."""
    allowance = target_ms / factor
    while factor * allowance > target_ms:
        allowance = math.nextafter(allowance, 0.0)
    return allowance
