"""The planning margin, learned online: how far above its (corrected) prediction a step may land.

The online correction (residual_tracker) removes the *bias* between profile and device; what is left is
spread: step-to-step noise, drift between two corrections. The planner must keep a step's prediction
times a high quantile of that spread within the target. Per partition, over its last WINDOW steps, the
quantile of log(measured / predicted) is estimated as mean + Z * std (log-normal spread: stable from a
few dozen samples, where an empirical 99.9th percentile would need thousands). A partition with fewer
than MIN_SAMPLES steps borrows the device-wide quantile (all partitions' steps), and before any step is
measured the planner assumes PRIOR. A drifting device widens the spread, and the margin with it.
"""

import math
from collections import deque

WINDOW = 128
MIN_SAMPLES = 16
Z = 3.09
"""The standard normal's 99.9th percentile: the attainment harvest aims at."""
PRIOR = 1.5
"""Margin before anything is measured: a profile may be off by tens of percent on a new device."""


class _Spread:
    __slots__ = ("_sum", "_sum_sq", "_window")

    def __init__(self) -> None:
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._sum = 0.0
        self._sum_sq = 0.0

    def factor(self) -> float:
        """exp(mean + Z * std) of the window, never below 1: the planner never plans past its prediction."""
        n = len(self._window)
        mean = self._sum / n
        var = (self._sum_sq - n * mean * mean) / (n - 1)
        quantile = mean + Z * math.sqrt(var) if var > 0.0 else mean
        return math.exp(quantile) if quantile > 0.0 else 1.0


class PlanMargin:
    """margin(partition): multiply a step's corrected prediction by it before comparing to the target."""

    def __init__(self, fixed: float | None = None) -> None:
        """`fixed`: plan for target * (1 - fixed) everywhere and learn nothing (an explicit override)."""
        self.fixed = None if fixed is None else 1.0 / (1.0 - fixed)
        self._device = _Spread()
        self._partitions: dict[tuple[int, int], _Spread] = {}

    def observe(self, partition: tuple[int, int], predicted_ms: float, measured_ms: float) -> None:
        if self.fixed is not None:
            return
        x = math.log(measured_ms / predicted_ms)
        xx = x * x
        spread = self._partitions.get(partition)
        if spread is None:
            spread = self._partitions[partition] = _Spread()
        # Both windows move by x in and their oldest out; in line, as this runs on every decode step.
        for moved in (self._device, spread):
            window = moved._window
            if len(window) == WINDOW:
                old = window[0]
                moved._sum += x - old
                moved._sum_sq += xx - old * old
            else:
                moved._sum += x
                moved._sum_sq += xx
            window.append(x)

    def device(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return self._device.factor() if len(self._device._window) >= MIN_SAMPLES else PRIOR

    def __call__(self, partition: tuple[int, int]) -> float:
        if self.fixed is not None:
            return self.fixed
        spread = self._partitions.get(partition)
        if spread is not None and len(spread._window) >= MIN_SAMPLES:
            return spread.factor()
        return self.device()

    def stats(self) -> dict:
        return {
            "source": "fixed (--plan-margin)" if self.fixed is not None else
                      f"learned: exp(mean + {Z} std) of log(measured / predicted), last {WINDOW} steps",
            "device": round(self.device(), 4),
            "partitions": {f"{i},{f}": round(self((i, f)), 4) for (i, f) in sorted(self._partitions)},
        }
