"""Which (partition, batch_size, seq_len) points the profiler measures, split into fit and held-out.

HARLI spends 6 min on stage 1 (10 partitions x bs 4/16/64 x every seq_len to 512) and 58 min on stage 2
(45 SM pairs). Eq. 2 is linear in seq_len, so two seq_len levels per batch size (the ends of the range,
the D-optimal design for a line) replace the sweep; the batch sizes are the powers of two, which both
span the bs slope and bracket every plateau knot the fit tries. Stage 2 has at most four coefficients
shared by all pairs, so a 3 x 3 spread of (infer, ft) pairs at HARLI's three representative batch
sizes suffices. Held-out points sit off the fit grid (random batch sizes and lengths, unmeasured pairs)
so the held-out error measures generalisation, not interpolation of the same points.
"""

import math
import random
from dataclasses import dataclass

import numpy as np

from harvest.errors import HarvestError
from predictor.partition_grid import PartitionGrid


@dataclass(frozen=True, slots=True)
class SamplePoint:
    infer_sms: int
    ft_sms: int
    batch_size: int
    seq_len: int
    is_held_out: bool


@dataclass(frozen=True, slots=True)
class SamplingPlan:
    grid: PartitionGrid
    max_batch_size: int
    """Largest decode batch the worker runs."""
    max_seq_len: int
    """Longest mean KV length per request to model."""
    max_kv_tokens: int | None = None
    """KV pool capacity in tokens; points with batch_size * seq_len above it are shortened."""
    num_repeats: int = 5
    """Timed decode steps per point (after warm-up); the profiler writes their median as the sample."""
    num_held_out_per_partition: int = 2
    num_colo_levels: int = 3
    """Spread of inference and of finetune SM counts for stage 2 (levels x levels pairs)."""
    num_held_out_pairs: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_seq_len < 1:
            raise HarvestError(
                f"max_batch_size and max_seq_len must be >= 1, got {self.max_batch_size}, {self.max_seq_len}"
            )
        if self.max_kv_tokens is not None and self.max_kv_tokens < 2:
            raise HarvestError(f"max_kv_tokens must be >= 2, got {self.max_kv_tokens}")
        if self.num_repeats < 1 or self.num_colo_levels < 1:
            raise HarvestError("num_repeats and num_colo_levels must be >= 1")

    def batch_sizes(self) -> list[int]:
        sizes = {2**n for n in range(int(math.log2(self.max_batch_size)) + 1)} | {self.max_batch_size}
        return sorted(sizes)

    def seq_levels(self) -> tuple[int, int]:
        return max(1, self.max_seq_len // 16), self.max_seq_len

    def colo_batch_sizes(self) -> list[int]:
        """HARLI's three representative batch sizes (4, 16, 64), spread over this worker's range."""
        low = min(4, self.max_batch_size)
        return sorted({low, round(math.sqrt(low * self.max_batch_size)), self.max_batch_size})

    def colo_pairs(self) -> list[tuple[int, int]]:
        infer = [i for i in self.grid.infer_options() if self.grid.ft_options(i)]
        pairs = []
        for i in _spread(infer, self.num_colo_levels):
            pairs += [(i, f) for f in _spread(list(self.grid.ft_options(i)), self.num_colo_levels)]
        return pairs

    def points(self) -> list[SamplePoint]:
        rng = random.Random(self.seed)
        low, high = self.seq_levels()
        points = []
        for infer_sms in self.grid.infer_options():
            points += self._shapes(infer_sms, 0, [(b, s) for b in self.batch_sizes() for s in (low, high)])
            points += self._shapes(infer_sms, 0, self._random_shapes(rng, self.num_held_out_per_partition), True)
        fit_pairs = self.colo_pairs()
        for pair in fit_pairs:
            points += self._shapes(*pair, [(b, s) for b in self.colo_batch_sizes() for s in (low, high)])
        unmeasured = [p for p in self.grid.pairs() if p not in fit_pairs]
        for pair in rng.sample(unmeasured, min(self.num_held_out_pairs, len(unmeasured))):
            points += self._shapes(*pair, self._random_shapes(rng, 2), True)
        return points

    @property
    def fit_points(self) -> list[SamplePoint]:
        return [p for p in self.points() if not p.is_held_out]

    @property
    def held_out_points(self) -> list[SamplePoint]:
        return [p for p in self.points() if p.is_held_out]

    def _random_shapes(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        return [(rng.randint(1, self.max_batch_size), rng.randint(1, self.max_seq_len)) for _ in range(n)]

    def _shapes(self, infer_sms: int, ft_sms: int, shapes, is_held_out: bool = False) -> list[SamplePoint]:
        points = []
        for batch_size, seq_len in shapes:
            if self.max_kv_tokens is not None:
                seq_len = min(seq_len, self.max_kv_tokens // batch_size)
            if seq_len < 1:
                continue
            point = SamplePoint(infer_sms, ft_sms, batch_size, seq_len, is_held_out)
            if point not in points:
                points.append(point)
        return points


def _spread(options: list[int], n: int) -> list[int]:
    """n options evenly spread from the first to the last (all of them if there are fewer)."""
    if len(options) <= n:
        return list(options)
    return sorted({options[round(k)] for k in np.linspace(0, len(options) - 1, n)})
