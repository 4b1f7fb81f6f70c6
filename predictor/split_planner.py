"""Per-step device split (HARLI sec. 5.2.3 and 6.2, objective beyond HARLI): the choice that trains the most
finetune tokens in the step's TPOT budget while its predicted decode latency, times the learned margin,
stays within the target.

Candidates: every co-run partition (infer_sms, ft_sms) the device forms, and the whole device to decode
(ft_sms = 0). Each is followed by a temporal slice: once the step's tokens are out, the whole device
finetunes for what is left of the budget (the controller sizes it on the *measured* step time). Over a
budget of W ms, a candidate whose decode takes d ms trains r_f * d + R * (W - d) tokens (r_f: the profile's
co-run finetune tokens/s on ft_sms; R: its solo tokens/s on the whole device; r_0 = 0), so the best
candidate is the feasible one that loses least against a pure slice, (R - r_f) * d. Without measured
finetune throughput in the profile, r_f and R fall back to SM shares (a proxy, stated in `rate_source`).

A decision must cost a few arithmetic operations (HARLI: 5 us per prediction). With d = solo_i * factor
(stage 2 is a factor per partition), everything but the stage-1 line is precomputed per inference
partition: its candidates in ascending order of the solo latency each allows (target / (factor * margin)),
and the suffix minimum of the loss coefficient (R - r_f) * factor. A decision evaluates the solo line once
per inference partition, bisects for the feasible suffix and reads its best candidate; rows come in
ascending order of a lower bound on their loss, so the first row that cannot beat the best so far ends the
search. observe() rebuilds the measured partition's candidate and row every REBUILD_EVERY of its steps; each
REFRESH_EVERY steps, every row if the device-wide margin moved, else the rows of partitions measured slow and
unused since (their value fades, OFFSET_FADE: residual_tracker.py says why).
"""

import math
from bisect import bisect_left, insort
from collections.abc import Collection
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from base.errors import HarvestError
from predictor.config import DEFAULT_CONFIG, PredictorConfig
from predictor.plan_margin import PlanMargin
from predictor.profile import Profile
from predictor.residual_tracker import PredictionStats, ResidualTracker

REFRESH_EVERY = 256
REFRESH_TOLERANCE = 0.05
REBUILD_EVERY = 4
PRUNE_SLACK = 1.1
OFFSET_FADE = 0.99
"""Per step, how much of a partition's slow offset its value keeps while it is not used (~100 steps of memory,
as the controller's decode cost fit): a partition slow steps priced out is tried again at the next refresh."""
_REBUILD_PHASE = 1 % REBUILD_EVERY  # a partition's row is rebuilt on its 1st, (1 + REBUILD_EVERY)th, ... step
TIE_TOLERANCE = 1e-9  # relative: losses this close train the same tokens up to rounding
_ROW_LOWER = attrgetter("lower")
_CANDIDATE_ORDER = attrgetter("allowance_ms", "loss_per_solo_ms", "ft_sms")  # ft_sms is unique in a row


@dataclass(slots=True, eq=False)
class Candidate:
    """A co-run partition (infer_sms, ft_sms) as a decision weighs it. Candidate and Row are slotted
    dataclasses, not NamedTuples: plan() reads their fields every step, and on CPython 3.11 a slot read costs
    what a tuple index does where a NamedTuple field or unpacking costs more; eq=False: a row is found in
    `_rows` by identity (eval/results/cpu-2026-11-27/planner-rows/NOTES.md)."""

    allowance_ms: float
    """The largest solo latency whose prediction, with the partition's correction and margin, fits the target."""
    loss_per_solo_ms: float
    """Finetune tokens/s lost against a pure slice, per ms of solo latency, at the optimistic correction."""
    ft_sms: int
    factor: float
    """Solo latency to the predicted co-run latency: the profile's slowdown times the partition's correction."""
    margin: float
    slowdown: float
    co_run_rate: float
    """Finetune tokens/s on ft_sms beside decode (the profile's, or the SM-share proxy)."""


@dataclass(slots=True, eq=False)
class Row:
    """An inference partition's candidates, precomputed so a decision costs its solo line and a bisection."""

    b0_ms: float
    c0_ms: float
    k0_ms: float
    """The solo line on infer_sms: b0_ms * padded batch + c0_ms + k0_ms * KV tokens."""
    infer_sms: int
    max_allowance_ms: float
    allowances_ms: list[float]
    """The candidates' allowances, ascending: a solo latency bisects to the first candidate it fits."""
    best_from: list[Candidate]
    """best_from[k]: the least-loss candidate among those from the k-th allowance on."""
    lower: float
    """A lower bound on the row's loss per ms of the whole device's solo latency: rows are kept in its order."""


@dataclass(slots=True)
class SplitDecision:
    infer_sms: int
    ft_sms: int
    """SMs the finetune job co-runs on during the step; 0: none (a temporal slice may still follow)."""
    predicted_ms: float
    """Predicted decode latency with the online correction applied (the margin is not in it)."""
    slack_ms: float
    """TPOT target minus predicted_ms: what a temporal slice after the step is predicted to get."""
    finetune_tokens_per_s: float
    """The objective: predicted finetune tokens over the step's budget (co-run plus slice), per second."""
    margin: float
    """The factor predicted_ms had to stay within the target by."""
    is_finetune_paused: bool
    """The finetune job has ready work but no candidate leaves room for it."""
    is_slo_unreachable: bool
    """Even decode alone on every SM is predicted to miss the target."""
    model_ms: float
    """The profile's uncorrected prediction; observe() learns measured / model_ms."""
    alone_ms: float
    """Predicted decode latency alone on the whole device (corrected, as predicted_ms): a co-run step's measured
    latency times alone_ms / predicted_ms is what decode alone would have taken."""


class SplitPlanner:
    def __init__(
        self,
        profile: Profile,
        tpot_slo_ms: float,
        config: PredictorConfig = DEFAULT_CONFIG,
        plan_margin: float | None = None,
        pairs: Collection[tuple[int, int]] | None = None,
    ) -> None:
        """`plan_margin`: plan for tpot_slo_ms * (1 - plan_margin) instead of learning the margin. `pairs`: the
        (infer_sms, ft_sms) partitions the device forms (GreenPartitions.pairs); None: every profiled one."""
        if not (math.isfinite(tpot_slo_ms) and tpot_slo_ms > 0):
            raise HarvestError(f"TPOT SLO must be a positive number of ms, got {tpot_slo_ms}")
        if plan_margin is not None and not 0.0 <= plan_margin < 1.0:
            raise HarvestError(f"plan margin must be in [0, 1), got {plan_margin}")
        self.profile = profile
        self.tpot_slo_ms = float(tpot_slo_ms)
        model = profile.latency_model
        self._plateau = model.solo.plateau_batch_size
        self._tracker = ResidualTracker(config.ewma_alpha, OFFSET_FADE)
        self.margin = PlanMargin(plan_margin)
        self._full_sms = max(model.solo.infer_options)
        full = model.solo.coefficients(self._full_sms)
        self._full_line = (full.b0_ms, full.c0_ms, full.k0_ms)
        self.rate_source, co_run_rate, self._slice_rate = _finetune_rates(profile)
        # infer_sms -> [(ft_sms, slowdown, co-run tokens/s)]: the static part of every candidate.
        self._pairs: dict[int, list[tuple[int, float, float]]] = {}
        for infer_sms, ft_sms in model.partitions():
            if ft_sms and (pairs is None or (infer_sms, ft_sms) in pairs):
                entry = (ft_sms, model.slowdown(infer_sms, ft_sms), co_run_rate(ft_sms))
                self._pairs.setdefault(infer_sms, []).append(entry)
        self._is_spatial = bool(self._pairs)
        self._global_correction = 1.0
        self._full_relative_correction = 1.0
        self._full_margin = self.margin((self._full_sms, 0))
        self.switch_ms = 0.0
        """The expected wait for the finetune partition's unit in flight when the slice after a co-run step takes
        the device back (expect_switch sets it): the slice trains that long at the partition's co-run rate instead
        of the whole device's. Within a row a candidate is still picked on its loss per solo ms alone (as cheap as
        before); the whole device is weighed against it with this cost in."""
        self._refresh_rows()

    def expect_switch(self, unit_ms: float) -> None:
        """Co-run units last up to `unit_ms` (the job's unit bound): a slice taking the partition back finds one
        in flight, half done on average."""
        self.switch_ms = unit_ms / 2

    def _refresh_rows(self) -> None:
        """Recompute every candidate: the device-wide margin, which unmeasured partitions use, moved."""
        self._device_margin = self.margin.device()
        self._candidates = {
            i: {f: self._candidate(i, f, slowdown, rate) for f, slowdown, rate in pairs}
            for i, pairs in self._pairs.items()
        }
        self._row_of = {infer_sms: self._build_row(infer_sms) for infer_sms in self._pairs}
        self._rows = sorted(self._row_of.values(), key=_ROW_LOWER)
        self._prune_rows()

    def _prune_rows(self) -> None:
        """The rows that can beat decode alone plus a slice: a row's loss is at least its least loss coefficient
        times its solo latency, which is at least `ratio` (its smallest coefficient ratio to the whole device's
        line) times the whole device's (the row's `lower`: their product, the key `_rows` is kept in ascending
        order of); with PRUNE_SLACK for the correction moving between checks. Pruning costs optimality at
        worst, never the target (feasibility is checked per row)."""
        bound = PRUNE_SLACK * self._slice_rate * self._full_relative_correction
        self._active_rows = self._rows[:bisect_left(self._rows, bound, key=_ROW_LOWER)]

    def _candidate(self, infer_sms: int, ft_sms: int, slowdown: float, rate: float) -> Candidate:
        """The allowance (does it fit) uses the partition's correction; the loss (what it is worth), the
        optimistic one."""
        partition = (infer_sms, ft_sms)
        relative, valued = self._tracker.relative_corrections(partition)
        factor = slowdown * relative
        valued_factor = slowdown * valued
        margin = self.margin(partition)
        allowance = _allowance(self.tpot_slo_ms, factor * margin)
        return Candidate(allowance, (self._slice_rate - rate) * valued_factor, ft_sms, factor, margin, slowdown, rate)

    def _rebuild(self, partition: tuple[int, int]) -> None:
        """Recompute one candidate and its row, moved to its place in `_rows` (the caller prunes)."""
        i, f = partition
        old = self._candidates[i][f]
        self._candidates[i][f] = self._candidate(i, f, old.slowdown, old.co_run_rate)
        self._rows.remove(self._row_of[i])
        row = self._row_of[i] = self._build_row(i)
        insort(self._rows, row, key=_ROW_LOWER)

    def refresh(self) -> None:
        """Bring every row up to date with the correction and margins now (observe() does it lazily)."""
        self._refresh_rows()

    def _build_row(self, infer_sms: int) -> Row:
        c = self.profile.latency_model.solo.coefficients(infer_sms)
        candidates = sorted(self._candidates[infer_sms].values(), key=_CANDIDATE_ORDER)
        best = candidates[:]  # best[k]: the least-loss candidate among candidates[k:]
        least = best[-1]
        for k in range(len(best) - 2, -1, -1):
            if least.loss_per_solo_ms <= best[k].loss_per_solo_ms:
                best[k] = least
            else:
                least = best[k]
        b0, c0, k0 = self._full_line
        ratio = min(c.b0_ms / b0, c.c0_ms / c0, c.k0_ms / k0 if k0 > 0 else math.inf)
        lower = best[0].loss_per_solo_ms * ratio
        return Row(c.b0_ms, c.c0_ms, c.k0_ms, infer_sms, candidates[-1].allowance_ms,
                   [a.allowance_ms for a in candidates], best, lower)

    def plan(self, batch_size: int, seq_len: float, has_ready_work: bool) -> SplitDecision:
        if batch_size < 1 or seq_len < 0:
            raise HarvestError(f"a decode step needs batch_size >= 1 and seq_len >= 0, got {batch_size}, {seq_len}")
        padded = batch_size if batch_size > self._plateau else self._plateau  # noqa: FURB136 (a call costs more)
        num_kv_tokens = batch_size * seq_len
        target = self.tpot_slo_ms
        g = self._global_correction
        b0, c0, k0 = self._full_line
        model_ms = b0 * padded + c0 + k0 * num_kv_tokens
        predicted = model_ms * g * self._full_relative_correction
        slack = target - predicted
        if not has_ready_work:
            return SplitDecision(self._full_sms, 0, predicted, slack, 0.0, self._full_margin, False,
                                 predicted > target, model_ms, predicted)
        rate = self._slice_rate
        if slack > 0.0:
            least_loss = rate * predicted  # the whole device to decode, then a slice
            rows = self._active_rows
            switch_ms = self.switch_ms
        else:
            least_loss = rate * target  # no slice at all: any feasible pair beats it
            rows = self._rows
            switch_ms = 0.0
        best, best_solo, best_infer = None, 0.0, self._full_sms
        full_solo = model_ms * g
        for row in rows:
            lower = row.lower
            if lower > 0.0 and lower * full_solo > least_loss * (1.0 + TIE_TOLERANCE):
                break  # rows come in ascending `lower`: none left can train more than the best so far
            solo = (row.b0_ms * padded + row.c0_ms + row.k0_ms * num_kv_tokens) * g
            if solo <= row.max_allowance_ms:
                candidate = row.best_from[bisect_left(row.allowances_ms, solo)]
                loss = candidate.loss_per_solo_ms * solo + (rate - candidate.co_run_rate) * switch_ms
                # Equal finetune tokens (to TIE_TOLERANCE): the lower predicted decode latency, the lower TPOT.
                # Decode alone, the fastest decode, is only left for a pair that trains strictly more.
                if loss < least_loss * (1.0 - TIE_TOLERANCE) or (
                    best is not None and loss <= least_loss * (1.0 + TIE_TOLERANCE)
                    and candidate.factor * solo < best.factor * best_solo
                ):
                    least_loss = loss
                    best, best_solo, best_infer = candidate, solo, row.infer_sms
        tokens_per_s = rate - least_loss / target
        if best is None:
            return SplitDecision(self._full_sms, 0, predicted, slack, tokens_per_s, self._full_margin,
                                 slack <= 0.0, predicted > target, model_ms, predicted)
        alone = predicted
        predicted = best.factor * best_solo
        return SplitDecision(best_infer, best.ft_sms, predicted, target - predicted, tokens_per_s, best.margin,
                             False, False, best.slowdown * best_solo / g, alone)

    def observe(self, decision: SplitDecision, measured_ms: float) -> None:
        """Feed the measured latency of the step `decision` planned into the correction and the margin. Part of
        every step's decision cost (with plan), so it keeps to one correction update, one margin update and
        counters; rows are rebuilt only on the schedule below."""
        if not 0.0 < measured_ms < math.inf:
            raise HarvestError(f"measured decode latency must be a positive number of ms, got {measured_ms}")
        ft_sms = decision.ft_sms
        partition = (decision.infer_sms, ft_sms)
        self.margin.observe(partition, decision.predicted_ms, measured_ms)
        tracker = self._tracker
        residual = tracker.update(partition, decision.model_ms, decision.predicted_ms, measured_ms)
        self._global_correction = tracker.global_correction
        if not ft_sms:
            self._full_relative_correction = math.exp(residual.offset)
        if tracker.num_observed % REFRESH_EVERY == 0:
            # Decode alone is never held to a margin (its slice is sized on the measured step): reported only.
            self._full_margin = self.margin((self._full_sms, 0))
            if self._is_spatial and abs(self.margin.device() / self._device_margin - 1.0) > REFRESH_TOLERANCE:
                self._refresh_rows()
            elif self._is_spatial:
                for i, f in tracker.faded_partitions(REBUILD_EVERY):
                    if f in self._candidates.get(i, ()):
                        self._rebuild((i, f))
                self._prune_rows()
        elif ft_sms and residual.num_observed % REBUILD_EVERY == _REBUILD_PHASE:
            # Rebuilt every REBUILD_EVERY observations of the partition: in between its row plans with a
            # slightly older correction, and the margin, learned from those very predictions, covers that.
            self._rebuild(partition)
            self._prune_rows()

    def stats(self) -> PredictionStats:
        return self._tracker.stats()

    def margin_stats(self) -> dict:
        return self.margin.stats()

    @property
    def shortest_step_ms(self) -> float:
        """The profile's shortest decode step (one request, empty context, every SM): finetune units sized
        within it make a pause take effect within one decode step."""
        b0, c0, _ = self._full_line
        return b0 * self._plateau + c0

    @property
    def num_candidates(self) -> int:
        return sum(len(row.allowances_ms) for row in self._rows) + 1


def _finetune_rates(profile: Profile):
    """(source, co-run tokens/s at ft_sms, whole-device solo tokens/s) from the profile's measured
    finetune throughput; SM shares when it measured none (a proxy that ignores interference)."""
    measured = sorted((t for t in profile.finetune_throughput if t.tokens_per_s_colo is not None),
                      key=lambda t: t.ft_sms)
    whole = [t for t in profile.finetune_throughput if t.ft_sms == profile.num_sms]
    if measured and whole:
        sms = [0, *(t.ft_sms for t in measured)]
        rates = [0.0, *(t.tokens_per_s_colo for t in measured)]
        return ("profile: measured co-run finetune tokens/s per partition",
                lambda ft_sms: float(np.interp(ft_sms, sms, rates)), whole[0].tokens_per_s_solo)
    n = profile.num_sms
    return ("PROXY (the profile measured no co-run finetune throughput): finetune SM share",
            lambda ft_sms: ft_sms / n, 1.0)


def _allowance(target_ms: float, factor: float) -> float:
    """The largest solo latency whose co-run prediction factor * solo stays <= target_ms after rounding."""
    allowance = target_ms / factor
    while factor * allowance > target_ms:
        allowance = math.nextafter(allowance, 0.0)
    return allowance
