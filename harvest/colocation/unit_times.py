"""How long the job's finetune units take, per unit kind, and so what a temporal slice admits a unit at: its
kind's first time (kept apart), its recent times on the whole device (slice and idle units) and beside decode
(co-run units, spatial mode), the estimate a slice admits it at, and the host stalls forgotten when that
estimate kept the kind out of slices for too long (eval/README.md, "Temporal slice", says why).

Units of one kind differ in size (a head span, a slice's rows, an update's parts; the job sizes them, UnitSizer):
where the job says what its next unit's size should take (its sizer's line), the estimate may be that times a high
quantile of how far the kind's units ran over their line, the spread at its size, instead of its kind's largest
sizes at the spread of all sizes (estimate_ms; eval/results/cpu-2026-11-30/unit-estimate/)."""

import math
import statistics
from collections import deque

RECENT_UNITS_PER_KIND = 32
STALL_PATIENCE = 8
"""After this many slices in a row that could not admit a kind, its longest recent time is taken for a host
stall and forgotten, if the kind fits without it: the slice reserve covers stalls, and a kind out of every
slice would wait for idle turns to replace the time (none on a busy worker)."""
MIN_LINE_RATIOS = 8
"""A kind's whole-device units timed against their line before a slice admits it by the line (until then, by its
kind's times)."""
UNIT_QUANTILE_Z = 3.09
"""A unit is admitted if this high a quantile of its kind's recent times fits (the normal 99.9th percentile
of log unit time): slice lengths and the host make unit times spread, and an overrun breaks the step."""


class UnitTimes:
    """Written by whichever thread owns the job (the scheduler thread, or the unit thread for co-run units);
    read by the admin thread for stats, so a kind's deque is built whole before it is published."""

    def __init__(self) -> None:
        self._first_ms: dict[str, float] = {}
        self._recent_ms: dict[str, deque[float]] = {}   # on the whole device: slice and idle units
        self._co_run_ms: dict[str, deque[float]] = {}   # beside decode, on the finetune partition
        self._estimates_ms: dict[str, float] = {}
        self._line_ratios: dict[str, deque[float]] = {}  # whole-device units' time over their predicted time
        self._line_factors: dict[str, float] = {}
        self._refusals: dict[str, int] = {}
        self._forgotten: dict[str, int] = {}

    def record(self, kind: str, duration_ms: float, co_run: bool = False, predicted_ms: float | None = None) -> None:
        """A unit of `kind` ran for `duration_ms`, where the job predicted `predicted_ms` at its size (None: no
        prediction). `co_run`: beside decode on the finetune partition, slower than on the whole device, so kept
        apart: it never prices a slice unit, which runs on the whole device."""
        times = self._co_run_ms if co_run else self._recent_ms
        recent = times.get(kind)
        if not co_run and predicted_ms and kind in self._first_ms:
            ratios = self._line_ratios.get(kind)
            if ratios is None:
                self._line_ratios[kind] = deque([duration_ms / predicted_ms], maxlen=RECENT_UNITS_PER_KIND)
            else:
                ratios.append(duration_ms / predicted_ms)
            self._line_factors.pop(kind, None)
        if kind not in self._first_ms:
            # Kept apart, no sample: without the engine's warm-up (FinetuneConfig.warm_up_units) a kind's first
            # unit is the process's first run of it (kernels loaded, allocations), 50-500x its other times.
            # With it, it is warm: first_ms near the kind's p50 shows the warm-up took that work off the decode
            # path, and one sample is all that is lost.
            self._first_ms[kind] = duration_ms
        elif recent is None:  # built whole before it is published: the admin thread never sees it empty
            times[kind] = deque([duration_ms], maxlen=RECENT_UNITS_PER_KIND)
        else:
            recent.append(duration_ms)
        if not co_run:
            self._estimates_ms.pop(kind, None)
        self._refusals.pop(kind, None)

    def estimate_ms(self, kind: str, untimed_bound_ms: float | None, predicted_ms: float | None = None) -> float:
        """A high quantile of the kind's recent times, at least the longest of them, its first time left out
        (record); or, if lower, `predicted_ms` (the job's prediction at the unit's size) times a high quantile of
        how far the kind's recent units ran over theirs, at least the furthest, once MIN_LINE_RATIOS were timed
        against one. The lower of the two: the kind's times are the tighter where its units are alike in size
        (small layer units: the line adds its own drift), the line where they differ (head spans, an update's
        parts). A kind timed fewer than 2 times after its first is estimated at twice `untimed_bound_ms` (the
        job's unit bound: units are cut to it, but the first ones before any is timed, so they may overrun it),
        or admitted in idle loops only if there is none (None).
        A host stall in the times keeps the kind out of slices for STALL_PATIENCE slices (forget_a_stall);
        eval/README.md, "Temporal slice", says why a more robust estimate is not used."""
        by_kind = self._kind_estimate_ms(kind, untimed_bound_ms)
        factor = None if predicted_ms is None else self._line_factor(kind)
        return by_kind if factor is None else min(by_kind, predicted_ms * factor)

    def _kind_estimate_ms(self, kind: str, untimed_bound_ms: float | None) -> float:
        cached = self._estimates_ms.get(kind)
        if cached is not None:
            return cached
        recent = list(self._recent_ms.get(kind, ()))  # a copy: the unit thread appends (spatial mode)
        if len(recent) < 2:
            return float("inf") if untimed_bound_ms is None else 2.0 * untimed_bound_ms
        estimate = self._estimates_ms[kind] = _estimate_of(recent)
        return estimate

    def _line_factor(self, kind: str) -> float | None:
        cached = self._line_factors.get(kind)
        if cached is not None:
            return cached
        ratios = list(self._line_ratios.get(kind, ()))
        if len(ratios) < MIN_LINE_RATIOS:
            return None
        factor = self._line_factors[kind] = _estimate_of(ratios)
        return factor

    def forget_a_stall(self, kind: str, room_ms: float, predicted_ms: float | None = None) -> bool:
        """A slice has `room_ms` but the kind's estimate (at `predicted_ms`, estimate_ms) is over it: on the
        STALL_PATIENCE-th such slice in a row, forget the longest recent time (or time over its line, whichever
        estimate was the lower) if the estimate without it fits. True if it forgot one."""
        refusals = self._refusals[kind] = self._refusals.get(kind, 0) + 1
        factor = None if predicted_ms is None else self._line_factor(kind)
        by_line = factor is not None and predicted_ms * factor < self._kind_estimate_ms(kind, None)
        recent = self._line_ratios.get(kind) if by_line else self._recent_ms.get(kind)
        if refusals < STALL_PATIENCE or recent is None or len(recent) < 3:
            return False
        rest = list(recent)
        longest = max(rest)
        rest.remove(longest)
        if _estimate_of(rest) * (predicted_ms if by_line else 1.0) > room_ms:
            return False
        recent.remove(longest)  # the scheduler thread owns the job here: no unit thread appends meanwhile
        self._estimates_ms.pop(kind, None)
        self._line_factors.pop(kind, None)
        self._refusals.pop(kind, None)
        self._forgotten[kind] = self._forgotten.get(kind, 0) + 1
        return True

    def longest_recent_ms(self) -> float | None:
        """The longest recent unit, on the whole device or beside decode: how long a pause may wait for one."""
        recent = list(self._recent_ms.values()) + list(self._co_run_ms.values())
        return max((max(r) for r in recent if r), default=None)

    def stats(self, untimed_bound_ms: float | None) -> dict:
        """Per unit kind, its recent times on the whole device, what a slice admits it at without a prediction
        (admit_ms; None: not admitted in a slice) and with one (admit_x_line: times the prediction; None: too few
        timed against one), and its recent times beside decode (co_run; spatial mode)."""
        def summary(times) -> dict:
            ordered = sorted(times)
            return {"n": len(ordered), "p50": round(ordered[len(ordered) // 2], 3) if ordered else None,
                    "max": round(ordered[-1], 3) if ordered else None}

        out = {}
        for kind, first_ms in list(self._first_ms.items()):
            estimate = self.estimate_ms(kind, untimed_bound_ms)
            factor = self._line_factor(kind)
            co_run = self._co_run_ms.get(kind)
            out[kind] = {"first_ms": round(first_ms, 3), **summary(self._recent_ms.get(kind, ())),
                         "stalls_forgotten": self._forgotten.get(kind, 0),
                         "admit_ms": None if math.isinf(estimate) else round(estimate, 3),
                         "admit_x_line": None if factor is None else round(factor, 3),
                         "co_run": None if co_run is None else summary(co_run)}
        return out


def _estimate_of(times: list[float]) -> float:
    logs = [math.log(ms) for ms in times]
    return max(max(times), math.exp(statistics.fmean(logs) + UNIT_QUANTILE_Z * statistics.stdev(logs)))
