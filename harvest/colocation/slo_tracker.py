"""Decode-step SLO attainment: each step's time, plus the finetune time charged to it, against the target."""

import threading
from collections import deque


class SloTracker:
    def __init__(self, tpot_slo_ms: float, window_steps: int):
        self.tpot_slo_ms = tpot_slo_ms
        self._lock = threading.Lock()
        self._window: deque[bool] = deque(maxlen=window_steps)
        self.num_steps = 0
        self.num_violations = 0

    def record(self, effective_ms: float) -> bool:
        """Record one step; True if it met the target."""
        is_met = effective_ms <= self.tpot_slo_ms
        with self._lock:
            self._window.append(is_met)
            self.num_steps += 1
            self.num_violations += not is_met
        return is_met

    def snapshot(self) -> dict:
        with self._lock:
            window = list(self._window)
        return {
            "tpot_slo_ms": self.tpot_slo_ms,
            "steps": self.num_steps,
            "violations": self.num_violations,
            "attainment_window": round(sum(window) / len(window), 5) if window else None,
            "attainment_total": round(1 - self.num_violations / self.num_steps, 5) if self.num_steps else None,
        }
