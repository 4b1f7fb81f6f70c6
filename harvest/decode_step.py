"""What harvest knows about one decode step: set before the step runs, completed after it."""

from dataclasses import dataclass


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
    """An idle-time finetune unit running when the batch arrived (at most its whole time); charged too."""
    finetune_tokens: int = 0
    """Finetune tokens trained beside the step and in its slice."""
    is_slo_met: bool | None = None
    """latency + finetune_ms + idle_wait_ms within the TPOT target (None: no SLO tracked, no finetune job)."""

    @property
    def mean_seq_len(self) -> float:
        return self.kv_tokens / self.batch_size
