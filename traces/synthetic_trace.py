"""Seeded synthetic traces: Poisson arrivals, or bursty Gamma inter-arrivals (coefficient of variation
cv > 1 gives bursts, cv = 1 is Poisson). Request lengths are drawn, in pairs, from a shipped trace, so a
synthetic trace changes only the arrival process."""

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from base.errors import HarvestError
from traces.trace import Trace


@dataclass(frozen=True, slots=True)
class SyntheticTrace:
    KINDS: ClassVar[tuple[str, ...]] = ("poisson", "gamma")

    kind: str
    """`poisson` or `gamma`."""
    rate: float
    """Mean arrivals per second."""
    duration: float
    """Seconds of arrivals."""
    seed: int = 0
    cv: float = 1.0
    """Coefficient of variation of the inter-arrival time (gamma only; Poisson is 1)."""
    lengths: str = "conv"
    """Shipped trace whose (context, generated) pairs are resampled."""

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise HarvestError(f"synthetic trace kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}")
        if not (np.isfinite(self.rate) and self.rate > 0):
            raise HarvestError(f"synthetic trace rate must be > 0 requests/s, got {self.rate}")
        if not (np.isfinite(self.duration) and self.duration > 0):
            raise HarvestError(f"synthetic trace duration must be > 0 s, got {self.duration}")
        if not (np.isfinite(self.cv) and self.cv > 0):
            raise HarvestError(f"synthetic trace cv must be > 0, got {self.cv}")
        if self.kind == "poisson" and self.cv != 1.0:
            raise HarvestError("a poisson trace has cv = 1; use gamma:...,cv=... for bursty arrivals")
        if self.lengths not in ("conv", "code"):
            raise HarvestError(f"synthetic trace lengths must come from conv or code, got {self.lengths!r}")

    @classmethod
    def from_spec(cls, spec: str) -> "SyntheticTrace":
        """`poisson:rate=5,duration=600,seed=0` or `gamma:rate=5,cv=3,duration=600,seed=0`."""
        kind, _, params = spec.partition(":")
        types = {f.name: f.type for f in fields(cls) if f.name != "kind"}
        values: dict = {}
        for item in filter(None, params.split(",")):
            key, eq, value = item.partition("=")
            if not eq or key not in types:
                raise HarvestError(
                    f"synthetic trace {spec!r}: {item!r} is not one of {', '.join(f'{k}=' for k in types)}"
                )
            try:
                values[key] = value if types[key] is str else (int(value) if types[key] is int else float(value))
            except ValueError:
                raise HarvestError(f"synthetic trace {spec!r}: {key}={value!r} is not a number") from None
        missing = [k for k in ("rate", "duration") if k not in values]
        if missing:
            raise HarvestError(f"synthetic trace {spec!r} needs {' and '.join(f'{k}=' for k in missing)}")
        return cls(kind, **values)

    def generate(self, lengths_source: Trace) -> Trace:
        """Arrivals drawn here, request lengths in pairs from `lengths_source` (the shipped trace self.lengths
        names: the loader reads it, so this module stays below the loader)."""
        rng = np.random.default_rng(self.seed)
        mean_gap_s = 1.0 / self.rate
        # Gamma with shape 1/cv^2 and mean 1/rate has the asked coefficient of variation; shape 1 is exponential.
        shape = 1.0 / self.cv**2
        num_draws = int(self.rate * self.duration * 1.5 + 10 * np.sqrt(self.rate * self.duration) + 10)
        arrivals = np.empty(0)
        while not len(arrivals) or arrivals[-1] < self.duration:
            gaps = rng.gamma(shape, mean_gap_s / shape, size=num_draws)
            start = arrivals[-1] if len(arrivals) else 0.0
            arrivals = np.concatenate([arrivals, start + np.cumsum(gaps)])
        arrivals = arrivals[arrivals < self.duration]
        if not len(arrivals):
            raise HarvestError(f"synthetic trace {self.kind} at {self.rate}/s for {self.duration} s has no arrival")
        source = lengths_source
        picks = rng.integers(0, source.num_requests, size=len(arrivals))
        name = f"{self.kind}(rate={self.rate:g},duration={self.duration:g},seed={self.seed}" + (
            f",cv={self.cv:g})" if self.kind == "gamma" else ")"
        )
        return Trace(name, arrivals - arrivals[0], source.context_tokens[picks], source.generated_tokens[picks])
