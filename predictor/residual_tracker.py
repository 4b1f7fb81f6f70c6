"""Online correction (beyond HARLI): measured/predicted ratios pull a biased or stale profile back.

Residuals are kept in log space, log(measured / model), as a device-wide level plus a per-partition
offset: a profile taken on a cooler GPU is slow everywhere (the level, which every partition shares at
once), while a stale co-run model is off per partition (the offsets, zero until a partition is measured).
Both are EWMAs; while fewer than 1/alpha observations exist the step is 1/n, a running mean, so the
first measurements are not under-weighted (an offset's zero prior counts as one observation). The level
being shared lets the planner scale every prediction by it at once and rebuild only the measured row.

What the planner *values* a partition at (not whether it fits) forgets a slow offset: a partition measured
slower than the model once (a cold first step, a host stall) would otherwise never be picked again, so never
measured again (seen live: one 77 ms first co-run step kept a 2-core host on decode-only for a whole run).
The offset fades toward the device level by `fade` per device-wide step since the partition was last
measured, so the planner tries it again; its feasibility keeps the unfaded offset and its own margin.
"""

import math
from dataclasses import asdict, dataclass

Partition = tuple[int, int]


@dataclass(slots=True)
class PartitionResidual:
    offset: float = 0.0
    """log(measured / model) of this partition minus the device-wide level."""
    num_observed: int = 0
    last_observed: int = 0
    """The tracker's num_observed when this partition was last measured."""
    sum_predicted_ms: float = 0.0
    sum_measured_ms: float = 0.0
    sum_ape: float = 0.0


@dataclass(frozen=True, slots=True)
class PredictionStats:
    """Predicted (with the correction in force at the time) vs measured decode latency."""

    num_observed: int
    mape: float | None
    bias_pct: float | None
    """Mean of (measured - predicted) / predicted in percent: > 0 means the predictor runs optimistic."""
    last_predicted_ms: float | None
    last_measured_ms: float | None
    global_correction: float
    partitions: dict[Partition, dict]

    def to_dict(self) -> dict:
        partitions = [{"infer_sms": i, "ft_sms": f, **v} for (i, f), v in sorted(self.partitions.items())]
        return asdict(self) | {"partitions": partitions}


class ResidualTracker:
    __slots__ = ("_last", "_partitions", "_sum_bias", "alpha", "fade", "global_correction", "level", "num_observed")

    def __init__(self, alpha: float, fade: float = 1.0) -> None:
        self.alpha = alpha
        self.fade = fade
        self.level = 0.0
        self.global_correction = 1.0
        """exp(level), kept beside it: the planner reads it every step."""
        self.num_observed = 0
        self._partitions: dict[Partition, PartitionResidual] = {}
        self._sum_bias = 0.0
        self._last: tuple[float, float] | None = None

    def relative_corrections(self, partition: Partition) -> tuple[float, float]:
        """(this partition's correction divided by the device-wide one, 1 until it is measured; what the planner
        values the partition at): the second has a slow offset (> 0) faded by `fade` per step since the
        partition was last measured, a fast one kept. The planner checks the target with the first only."""
        residual = self._partitions.get(partition)
        if residual is None:
            return 1.0, 1.0
        offset = residual.offset
        checked = math.exp(offset)
        if offset <= 0.0:
            return checked, checked
        return checked, math.exp(offset * self.fade ** (self.num_observed - residual.last_observed))

    def faded_partitions(self, min_age: int) -> list[Partition]:
        """The partitions valued on a faded offset: measured slow, and not in the last `min_age` steps."""
        return [p for p, r in self._partitions.items()
                if r.offset > 0.0 and self.num_observed - r.last_observed >= min_age]

    def correction(self, partition: Partition) -> float:
        residual = self._partitions.get(partition)
        return math.exp(self.level + (0.0 if residual is None else residual.offset))

    def update(self, partition: Partition, model_ms: float, predicted_ms: float, measured_ms: float) -> PartitionResidual:
        """Fold one measured step in; returns the partition's residual. Runs once per decode step, so it is
        written for the interpreter (locals, no builtin calls where a comparison does)."""
        log_ratio = math.log(measured_ms / model_ms)
        residual = self._partitions.get(partition)
        if residual is None:
            residual = self._partitions[partition] = PartitionResidual()
        alpha = self.alpha
        n = self.num_observed = self.num_observed + 1
        step = 1.0 / n
        level = self.level = self.level + (alpha if alpha > step else step) * (log_ratio - self.level)  # noqa: FURB136
        self.global_correction = math.exp(level)
        m = residual.num_observed = residual.num_observed + 1
        residual.last_observed = n
        step = 1.0 / (m + 1)
        residual.offset += (alpha if alpha > step else step) * (log_ratio - level - residual.offset)  # noqa: FURB136
        error = measured_ms - predicted_ms
        ape = (error if error >= 0.0 else -error) / measured_ms * 100.0
        residual.sum_predicted_ms += predicted_ms
        residual.sum_measured_ms += measured_ms
        residual.sum_ape += ape
        self._sum_bias += error / predicted_ms * 100.0
        self._last = (predicted_ms, measured_ms)
        return residual

    def stats(self) -> PredictionStats:
        n = self.num_observed
        return PredictionStats(
            n,
            sum(r.sum_ape for r in self._partitions.values()) / n if n else None,
            self._sum_bias / n if n else None,
            self._last[0] if self._last else None,
            self._last[1] if self._last else None,
            self.global_correction,
            {
                p: {
                    "num_observed": r.num_observed,
                    "mean_predicted_ms": r.sum_predicted_ms / r.num_observed,
                    "mean_measured_ms": r.sum_measured_ms / r.num_observed,
                    "mape": r.sum_ape / r.num_observed,
                    "correction": self.correction(p),
                    "valued_at_correction": self.global_correction * self.relative_corrections(p)[1],
                }
                for p, r in self._partitions.items()
            },
        )
