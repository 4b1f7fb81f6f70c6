"""A device whose decode latency follows eqs. 2 and 3 exactly, plus measurement noise: the known truth
that tests and `harvest bench predictor` fit against. Defaults are Llama3-8B-on-H100-like: 5 ms to read
16 GB of weights, 128 KiB of KV per token at ~3 TB/s, sublinear scaling with SMs (HARLI fig. 9)."""

import random
from dataclasses import dataclass

from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample
from predictor.sampling_plan import SamplePoint


@dataclass(frozen=True, slots=True)
class SyntheticDevice:
    grid: PartitionGrid
    b0_ms: float = 0.05
    """Per padded request, on the whole device."""
    c0_ms: float = 6.0
    k0_ms: float = 4e-5
    """Per KV token, on the whole device."""
    sm_exponent: float = 0.6
    """Solo latency on a share r of the SMs is r ** -sm_exponent times the whole-device latency."""
    plateau_batch_size: int = 4
    a1: float = 1.0
    b1: float = 0.0
    k1: float = 0.5
    m1: float = 0.0
    noise: float = 0.02
    """Sigma of the multiplicative log-normal measurement noise."""

    def solo_ms(self, infer_sms: int, batch_size: int, seq_len: float) -> float:
        scale = self.grid.ratio(infer_sms) ** -self.sm_exponent
        padded = max(batch_size, self.plateau_batch_size)
        return scale * (self.b0_ms * padded + self.c0_ms + self.k0_ms * batch_size * seq_len)

    def slowdown(self, infer_sms: int, ft_sms: int) -> float:
        if ft_sms == 0:
            return 1.0
        r_i, r_f = self.grid.ratio(infer_sms), self.grid.ratio(ft_sms)
        return self.a1 + self.b1 * r_i + self.k1 * r_f + self.m1 * r_i * r_f

    def latency_ms(self, infer_sms: int, ft_sms: int, batch_size: int, seq_len: float) -> float:
        return self.slowdown(infer_sms, ft_sms) * self.solo_ms(infer_sms, batch_size, seq_len)

    def measure(self, points: list[SamplePoint], seed: int = 0) -> list[Sample]:
        rng = random.Random(seed)
        return [
            Sample(
                self.grid.ratio(p.infer_sms),
                self.grid.ratio(p.ft_sms),
                p.batch_size,
                float(p.seq_len),
                self.latency_ms(p.infer_sms, p.ft_sms, p.batch_size, p.seq_len) * rng.lognormvariate(0.0, self.noise),
            )
            for p in points
        ]
