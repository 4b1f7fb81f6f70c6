"""Decode steps: what harvest knows about one (DecodeStep) and their accounting (StepStats): counters
since start and a sliding window for percentiles; SloTracker, the target met or not per step.

Written by the scheduler thread once per step, read by the admin thread on request.
"""

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

HISTORY_STEPS = 20_000  # per-step records kept for /harvest/steps (a few MB; minutes of steps on a GPU)


@dataclass(slots=True)
class DecodeStep:
    forward_iter: int
    """SGLang's forward counter for the batch; matches the launch with its result processing."""
    batch_size: int
    kv_tokens: int
    """Sum of the requests' KV lengths: what the step's attention reads."""
    start_s: float
    latency_ms: float | None = None
    predicted_ms: float | None = None
    """What the planner predicted for the step (None without a planner)."""
    finetune_ms: float = 0.0
    """The temporal slice: finetune units run after the step, before the next one; charged to its TPOT."""
    idle_wait_ms: float = 0.0
    """An idle-time finetune unit running when the batch arrived (at most its whole time), and SGLang loading
    a published adapter before the step (publish_ms); charged too."""
    publish_ms: float = 0.0
    """The part of idle_wait_ms that SGLang spent loading a published adapter in the scheduler thread."""
    finetune_tokens: int = 0
    """Finetune tokens trained beside the step and in its slice."""
    is_slo_met: bool | None = None
    """latency + finetune_ms + idle_wait_ms within the TPOT target (None: no SLO tracked, no finetune job)."""
    ft_sms: int = 0
    """The finetune side of the step's partition: units co-ran beside decode (0: decode had the device)."""
    infer_sms: int | None = None
    """The decode side of the step's partition, as chosen before it (None: no planner and nothing pinned)."""
    preempt_ms: float = 0.0
    """The part of latency_ms spent, before decode launched, waiting for the finetune partition's unit in flight
    (decode took the device back from a partition the job held across steps)."""
    co_run_tail_ms: float = 0.0
    """The part of finetune_ms spent waiting for the co-run unit in flight when decode's tokens were out."""
    memory_ms: float = 0.0
    """The part of finetune_ms spent lending KV chunks to the job or reclaiming them for decode."""
    overrun_ms: float = 0.0
    """The part of finetune_ms by which the slice's units outran the estimates they were admitted by."""
    planned_ms: float = 0.0
    """The slice as the controller planned it: where, after the co-run tail and the memory work, the last
    unit it admitted was to end (the units before it as they ran, that one as estimated)."""

    @property
    def mean_seq_len(self) -> float:
        return self.kv_tokens / self.batch_size


class StepStats:
    def __init__(self, window_steps: int):
        self._lock = threading.Lock()
        self._latencies_ms: deque[float] = deque(maxlen=window_steps)
        self._history: deque[dict] = deque(maxlen=HISTORY_STEPS)
        self.started_s = time.time()
        self.num_decode_steps = 0
        self.num_decode_tokens = 0
        self.last_step: DecodeStep | None = None

    def record(self, step: DecodeStep) -> None:
        with self._lock:
            self.num_decode_steps += 1
            self.num_decode_tokens += step.batch_size
            self.last_step = step
            self._latencies_ms.append(step.latency_ms)
            self._history.append({
                "seq": self.num_decode_steps, "end_s": round(time.time(), 6), "batch_size": step.batch_size,
                "kv_tokens": step.kv_tokens, "latency_ms": round(step.latency_ms, 4),
                "predicted_ms": None if step.predicted_ms is None else round(step.predicted_ms, 4),
                "finetune_ms": round(step.finetune_ms, 4), "idle_wait_ms": round(step.idle_wait_ms, 4),
                "publish_ms": round(step.publish_ms, 4),
                "finetune_tokens": step.finetune_tokens, "ft_sms": step.ft_sms,
                "infer_sms": step.infer_sms, "preempt_ms": round(step.preempt_ms, 4),
                "co_run_tail_ms": round(step.co_run_tail_ms, 4), "memory_ms": round(step.memory_ms, 4),
                "overrun_ms": round(step.overrun_ms, 4), "planned_ms": round(step.planned_ms, 4),
            })

    def steps_since(self, seq: int, limit: int) -> list[dict]:
        """Per-step records with sequence number > seq (oldest first), at most `limit`."""
        with self._lock:
            first_kept = self.num_decode_steps - len(self._history) + 1
            start = max(seq + 1 - first_kept, 0)
            return [self._history[i] for i in range(start, min(start + limit, len(self._history)))]

    def snapshot(self, window_steps: int | None = None) -> dict:
        """Counters plus latency percentiles over the last `window_steps` steps (default: whole window)."""
        with self._lock:
            window = np.array(self._latencies_ms, dtype=np.float64)[-(window_steps or len(self._latencies_ms)):]
            last = self.last_step
            out = {
                "uptime_s": round(time.time() - self.started_s, 3),
                "decode_steps": self.num_decode_steps,
                "decode_tokens": self.num_decode_tokens,
                "last_batch_size": last.batch_size if last else 0,
                "last_mean_seq_len": round(last.mean_seq_len, 1) if last else 0.0,
                "window_steps": len(window),
            }
        for name, q in (("p50", 50), ("p99", 99)):
            out[f"step_latency_ms_{name}"] = round(float(np.percentile(window, q)), 3) if len(window) else None
        return out


MISS_CAUSES = ("decode", "co_run", "wait", "memory", "overrun", "slice")

ROUNDING_MS = 1e-3


def miss_cause(step: dict, tpot_slo_ms: float) -> str | None:
    """Why a step record's time (decode + its slice + the wait before it) is past the target, None if it is
    not. Each cause is the first part of the step's time that, added up in this order, crosses the target:
    "decode": decode alone on the whole device (the job had no part in the step);
    "co_run": decode on its partition beside the job, the wait for the co-run unit after it, or a step whose
    decode alone fit but not with the wait for the partition's unit in flight before it (preempt_ms);
    "wait": an idle-time unit, or SGLang loading a published adapter, the batch waited for;
    "memory": lending KV to the job or reclaiming it for decode;
    "slice": the slice as planned (planned_ms: where the last unit admitted was to end): the controller
    admitted more than the step had room for, which its admission rule never does;
    "overrun": the rest of the slice's time: units that outran their estimates, the controller's own work
    around them, a host stall (noise, not the plan). Tests assert no "slice"; the rest are measured
    (`harvest bench slo`). Records without planned_ms read their slice less its overrun as planned."""
    total_ms = step["latency_ms"] + step["finetune_ms"] + step["idle_wait_ms"]
    if total_ms <= tpot_slo_ms:
        return None
    spent_ms = step["latency_ms"]
    if spent_ms > tpot_slo_ms:
        is_decode_alone = not step.get("ft_sms") and spent_ms - step.get("preempt_ms", 0.0) > tpot_slo_ms
        return "decode" if is_decode_alone else "co_run"
    for cause, part_ms in (("wait", step["idle_wait_ms"]), ("co_run", step.get("co_run_tail_ms", 0.0)),
                           ("memory", step.get("memory_ms", 0.0))):
        spent_ms += part_ms
        if spent_ms > tpot_slo_ms:
            return cause
    planned_ms = step.get("planned_ms")
    if planned_ms is None:
        planned_ms = step["finetune_ms"] - step.get("co_run_tail_ms", 0.0) - step.get("memory_ms", 0.0) \
            - step.get("overrun_ms", 0.0)
    # The records' parts are rounded to 0.1 us each: a plan that ends at the target exactly is within it.
    return "slice" if spent_ms + planned_ms > tpot_slo_ms + ROUNDING_MS else "overrun"


class SloTracker:
    """Decode-step SLO attainment: each step's time, plus the finetune time charged to it, against the target."""

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
