"""Finetune speed the profiler measured per finetune SM share; the trace simulator replays it."""

import math
from dataclasses import asdict, dataclass

from base.errors import HarvestError
from predictor.json_reader import JsonReader


@dataclass(frozen=True, slots=True)
class FinetuneThroughput:
    ft_sms: int
    """SMs the finetune job ran on (on a CPU, 1: the whole device, between decode steps)."""

    tokens_per_s_solo: float
    """Finetune tokens per second with no decode running."""

    tokens_per_s_colo: float | None
    """Finetune tokens per second beside decode; None where there is no co-run (CPU: temporal sharing)."""

    unit_ms: float
    """Mean time of one finetune scheduling unit (one layer's forward or backward of a micro-batch)."""

    samples_per_s_solo: float | None = None
    """Training samples (rows of the job's micro-batches) per second with no decode running; None when the
    profile did not record it (older profiles, synthetic ones)."""

    def __post_init__(self) -> None:
        if self.ft_sms < 1:
            raise HarvestError(f"finetune throughput ft_sms must be >= 1, got {self.ft_sms}")
        for name in ("tokens_per_s_solo", "unit_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise HarvestError(f"finetune throughput {name} must be > 0, got {value}")
        if self.tokens_per_s_colo is not None and not (
            math.isfinite(self.tokens_per_s_colo) and self.tokens_per_s_colo >= 0
        ):
            raise HarvestError(f"finetune throughput tokens_per_s_colo must be >= 0, got {self.tokens_per_s_colo}")
        if self.samples_per_s_solo is not None and not (
            math.isfinite(self.samples_per_s_solo) and self.samples_per_s_solo > 0
        ):
            raise HarvestError(f"finetune throughput samples_per_s_solo must be > 0, got {self.samples_per_s_solo}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, r: JsonReader) -> "FinetuneThroughput":
        values = (
            r.integer("ft_sms", 1),
            r.number("tokens_per_s_solo", 0.0, strict=True),
            r.optional_number("tokens_per_s_colo", 0.0),
            r.number("unit_ms", 0.0, strict=True),
            r.optional_number("samples_per_s_solo", 0.0),
        )
        try:
            return cls(*values)
        except HarvestError as e:
            raise HarvestError(f"{r.source}: {r.where}: {e}") from None
