"""A request trace: arrival times and token counts, with the windowing, rate scaling and length capping
a replay asks for. Arrays, not row objects: the full conv trace is 19k rows and the simulator reads it
column-wise."""

from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    arrival_s: np.ndarray
    """Arrival time of each request in seconds from the trace start (first arrival at 0), non-decreasing."""
    context_tokens: np.ndarray
    """Prompt (KV) length each request arrives with at the decode worker."""
    generated_tokens: np.ndarray
    """Tokens each request decodes (>= 1)."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.context_tokens) != n or len(self.generated_tokens) != n:
            raise HarvestError(f"trace {self.name}: columns differ in length")
        if n and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise HarvestError(f"trace {self.name}: arrival times must be >= 0 and non-decreasing")
        if n and (self.context_tokens.min() < 0 or self.generated_tokens.min() < 1):
            raise HarvestError(f"trace {self.name}: context tokens must be >= 0 and generated tokens >= 1")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if self.num_requests else 0.0

    @property
    def num_generated_tokens(self) -> int:
        return int(self.generated_tokens.sum())

    def window(self, start_s: float, duration_s: float | None) -> "Trace":
        """Requests arriving in [start_s, start_s + duration_s), re-based so the window starts at 0."""
        if start_s < 0 or (duration_s is not None and duration_s <= 0):
            raise HarvestError(
                f"window needs start >= 0 and duration > 0 s, got start {start_s}, duration {duration_s}"
            )
        end_s = np.inf if duration_s is None else start_s + duration_s
        keep = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        if not keep.any():
            raise HarvestError(
                f"trace {self.name}: no request arrives in the window [{start_s:g}, {end_s:g}) s "
                f"(the trace spans {self.duration_s:.0f} s)"
            )
        label = f"{self.name}[{start_s:g}s+{'' if duration_s is None else f'{duration_s:g}s'}]"
        return Trace(label, self.arrival_s[keep] - start_s, self.context_tokens[keep], self.generated_tokens[keep])

    def scale_rate(self, factor: float) -> "Trace":
        """The same requests arriving `factor` times as fast (time compressed by `factor`)."""
        if not (np.isfinite(factor) and factor > 0):
            raise HarvestError(f"rate scale must be a positive number, got {factor}")
        if factor == 1:
            return self
        return Trace(f"{self.name}x{factor:g}", self.arrival_s / factor, self.context_tokens, self.generated_tokens)

    def cap_lengths(self, max_context_tokens: int | None, max_generated_tokens: int | None) -> "Trace":
        """Clip lengths, e.g. to a small model's context window (context + generated must fit in it)."""
        context, generated = self.context_tokens, self.generated_tokens
        if max_generated_tokens is not None:
            if max_generated_tokens < 1:
                raise HarvestError(f"max generated tokens must be >= 1, got {max_generated_tokens}")
            generated = np.minimum(generated, max_generated_tokens)
        if max_context_tokens is not None:
            if max_context_tokens < 0:
                raise HarvestError(f"max context tokens must be >= 0, got {max_context_tokens}")
            context = np.minimum(context, max_context_tokens)
        return Trace(f"{self.name}/capped", self.arrival_s, context, generated)

    def round_robin(self, num_parts: int, index: int) -> "Trace":
        """Requests index, index + num_parts, ...: what one of num_parts decode workers gets behind a
        round-robin router."""
        if not 0 <= index < num_parts:
            raise HarvestError(f"part {index} of {num_parts} does not exist")
        label = f"{self.name}/{index}of{num_parts}"
        return Trace(label, self.arrival_s[index::num_parts], self.context_tokens[index::num_parts],
                     self.generated_tokens[index::num_parts])

    def summary(self) -> dict:
        if not self.num_requests:
            return {"name": self.name, "num_requests": 0}
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "duration_s": round(self.duration_s, 3),
            "rate_per_s": round(self.num_requests / max(self.duration_s, 1e-9), 3),
            "context_tokens_p50": float(np.percentile(self.context_tokens, 50)),
            "context_tokens_p99": float(np.percentile(self.context_tokens, 99)),
            "generated_tokens_p50": float(np.percentile(self.generated_tokens, 50)),
            "generated_tokens_p99": float(np.percentile(self.generated_tokens, 99)),
            "num_generated_tokens": self.num_generated_tokens,
        }
