"""Discrete-event simulation of one decode worker under a co-location policy: requests arrive pre-filled,
join the running batch when the KV pool can hold their whole length (continuous batching, FIFO, no
preemption), and every step decodes one token for each running request.

The loop costs O(1) per step plus O(log n) per request: the batch is kept as counts (batch size, KV tokens
in use and reserved) and a heap of the step numbers at which requests finish, never as a list walked per
step. The full conv trace (19k requests, ~4 M tokens) runs ~10^5 steps per policy.
"""

import heapq
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
from harvest.replay.colocation_policies import ColocationPolicy
from traces.trace import Trace

PROGRESS_EVERY_STEPS = 4096


@dataclass(slots=True)
class DeviceRun:
    """What one simulated device did: per step, per request, and the finetune work."""

    policy: str
    step_end_s: np.ndarray
    step_latency_ms: np.ndarray
    """What each step is charged against the TPOT target: decode, the finetune time after it, a wait."""
    step_decode_ms: np.ndarray
    """The decode forward's part of it: a step over the target with this within it missed because of the job."""
    step_batch_size: np.ndarray
    step_kv_tokens: np.ndarray
    step_infer_sms: np.ndarray
    step_ft_sms: np.ndarray
    step_ft_bytes: np.ndarray
    step_window_layers: np.ndarray
    request_ids: np.ndarray
    """Rows of the trace this device served."""
    arrival_s: np.ndarray
    admit_s: np.ndarray
    finish_s: np.ndarray
    num_tokens: np.ndarray
    """Tokens each served request decoded."""
    busy_ft_tokens: float
    """Finetune tokens trained during decode steps."""
    idle_ft_tokens: float
    """Finetune tokens trained while no request ran (up to end_s)."""
    end_s: float
    idle_tokens_per_s: float

    def extend_to(self, end_s: float) -> None:
        """Run idle (finetune only) until end_s, so devices of a fleet are compared over one span."""
        if end_s > self.end_s:
            self.idle_ft_tokens += (end_s - self.end_s) * self.idle_tokens_per_s
            self.end_s = end_s

    @property
    def ft_tokens(self) -> float:
        return self.busy_ft_tokens + self.idle_ft_tokens


class DecodeSimulator:
    def __init__(self, policy: ColocationPolicy, on_progress: Callable[[float], None] | None = None):
        self.policy = policy
        self.on_progress = on_progress

    def run(self, trace: Trace, request_ids: np.ndarray | None = None) -> DeviceRun:
        ids = np.arange(trace.num_requests) if request_ids is None else np.asarray(request_ids)
        arrival = trace.arrival_s[ids].tolist()
        context = trace.context_tokens[ids].tolist()
        generated = trace.generated_tokens[ids].tolist()
        policy = self.policy
        capacity = policy.kv_capacity_tokens
        longest = int(np.argmax(trace.context_tokens[ids] + trace.generated_tokens[ids])) if len(ids) else 0
        if len(ids) and context[longest] + generated[longest] > capacity:
            raise HarvestError(
                f"{policy.name}: request {int(ids[longest])} of {trace.name} needs {context[longest] + generated[longest]} "
                f"KV tokens but the pool holds {capacity}: cap lengths (--max-context-tokens) or raise --kv-capacity-tokens"
            )
        max_running = policy.config.max_running_requests
        step = policy.step
        on_progress = self.on_progress
        end_s, lat, dec_, bs_, kv_, inf_, ft_, ftb_, win_ = (
            array("d"),
            array("d"),
            array("d"),
            array("l"),
            array("q"),
            array("l"),
            array("l"),
            array("q"),
            array("l"),
        )
        n = len(ids)
        admit_s, finish_s = [0.0] * n, [0.0] * n
        waiting: deque[int] = deque()
        finishing: list[tuple[int, int]] = []  # (step number at which it finishes, request)
        t = 0.0
        num_steps = next_arrival = num_done = 0
        batch_size = kv_tokens = kv_reserved = 0
        busy_ft = idle_ft = 0.0
        idle_rate = policy.idle_tokens_per_s()
        while num_done < n:
            while next_arrival < n and arrival[next_arrival] <= t:
                waiting.append(next_arrival)
                next_arrival += 1
            while waiting and batch_size < max_running:
                r = waiting[0]
                need = context[r] + generated[r]
                if kv_reserved + need > capacity:
                    break
                waiting.popleft()
                batch_size += 1
                kv_tokens += context[r]
                kv_reserved += need
                admit_s[r] = t
                heapq.heappush(finishing, (num_steps + generated[r], r))
            if not batch_size:
                t, tokens = policy.idle(t, arrival[next_arrival])
                idle_ft += tokens
                continue
            elapsed_ms, ms, decode_ms, infer_sms, ft_sms, ft_tokens, ft_bytes, window = step(
                t, batch_size, kv_tokens, kv_reserved)
            t += elapsed_ms / 1e3
            busy_ft += ft_tokens
            num_steps += 1
            end_s.append(t), lat.append(ms), dec_.append(decode_ms), bs_.append(batch_size), kv_.append(kv_tokens)
            inf_.append(infer_sms), ft_.append(ft_sms), ftb_.append(ft_bytes), win_.append(window)
            kv_tokens += batch_size
            while finishing and finishing[0][0] == num_steps:
                _, r = heapq.heappop(finishing)
                need = context[r] + generated[r]
                batch_size -= 1
                kv_tokens -= need
                kv_reserved -= need
                finish_s[r] = t
                num_done += 1
            if on_progress is not None and num_steps % PROGRESS_EVERY_STEPS == 0:
                on_progress(t)
        if on_progress is not None:
            on_progress(t)
        return DeviceRun(
            policy.name,
            np.frombuffer(end_s, dtype=np.float64),
            np.frombuffer(lat, dtype=np.float64),
            np.frombuffer(dec_, dtype=np.float64),
            np.asarray(bs_),
            np.asarray(kv_),
            np.asarray(inf_),
            np.asarray(ft_),
            np.asarray(ftb_),
            np.asarray(win_),
            ids,
            np.array(arrival),
            np.array(admit_s),
            np.array(finish_s),
            np.array(generated, dtype=np.int64),
            busy_ft,
            idle_ft,
            t,
            idle_rate,
        )
