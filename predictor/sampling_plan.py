"""Which (partition, batch_size, seq_len) points the profiler measures, split into fit and held-out.

HARLI spends 6 min on stage 1 (10 partitions x bs 4/16/64 x every seq_len to 512) and 58 min on stage 2
(45 SM pairs). Eq. 2 is linear in seq_len, so a few evenly spaced seq_len levels replace the sweep: the two
ends fix the line, the middle one shows whether it is a line (a residual pattern by seq_len). Batch sizes
run the 1-2-3 series (1, 2, 3, 4, 6, 8, 12, ...: two per octave), which spans the bs slope, brackets every
plateau knot the fit tries with a measured batch size on each side, and shows where a plateau ends.
Stage 2 has at most four coefficients shared by all pairs, so a 3 x 3 spread of (infer, ft) pairs at
HARLI's three representative batch sizes, at the two end lengths, suffices. Held-out points are random
shapes inside the fitted range (batch sizes 1..max, lengths between the lowest and the highest level)
and off the fit grid, plus unmeasured pairs, so the held-out error measures prediction between measured
points, not extrapolation past them nor a re-measurement of the same points.
"""

import math
import random
from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
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
    num_seq_levels: int = 3
    """Evenly spaced seq_len levels per batch size, from max_seq_len / 32 to max_seq_len (>= 2)."""
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
        if self.num_colo_levels < 1:
            raise HarvestError(f"num_colo_levels must be >= 1, got {self.num_colo_levels}")
        if self.num_seq_levels < 2:
            raise HarvestError(f"num_seq_levels must be >= 2, got {self.num_seq_levels}")

    def batch_sizes(self) -> list[int]:
        """The 1-2-3 series up to max_batch_size, and max_batch_size itself."""
        octaves = range(int(math.log2(self.max_batch_size)) + 1)
        sizes = {2**n for n in octaves} | {3 * 2**n for n in octaves} | {self.max_batch_size}
        return sorted(b for b in sizes if b <= self.max_batch_size)

    def seq_levels(self) -> tuple[int, ...]:
        low = max(1, self.max_seq_len // 32)
        return tuple(sorted({round(s) for s in np.linspace(low, self.max_seq_len, self.num_seq_levels)}))

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
        levels = self.seq_levels()
        low, high = levels[0], levels[-1]
        points = []
        for infer_sms in self.grid.infer_options():
            fit = self._shapes(infer_sms, 0, [(b, s) for b in self.batch_sizes() for s in levels])
            points += fit
            points += self._held_out_shapes(rng, infer_sms, 0, self.num_held_out_per_partition, fit)
        fit_pairs = self.colo_pairs()
        for pair in fit_pairs:
            points += self._shapes(*pair, [(b, s) for b in self.colo_batch_sizes() for s in (low, high)])
        unmeasured = [p for p in self.grid.pairs() if p not in fit_pairs]
        for pair in rng.sample(unmeasured, min(self.num_held_out_pairs, len(unmeasured))):
            points += self._held_out_shapes(rng, *pair, 2, [])
        if fit_pairs and not unmeasured:
            # Every pair is fitted (a few-core CPU host): held-out shapes inside them score stage 2 instead.
            for pair in fit_pairs:
                points += self._held_out_shapes(rng, *pair, self.num_held_out_per_partition,
                                                [p for p in points if (p.infer_sms, p.ft_sms) == pair])
        return points

    @property
    def fit_points(self) -> list[SamplePoint]:
        return [p for p in self.points() if not p.is_held_out]

    @property
    def held_out_points(self) -> list[SamplePoint]:
        return [p for p in self.points() if p.is_held_out]

    def _held_out_shapes(self, rng: random.Random, infer_sms: int, ft_sms: int, n: int,
                         fit: list[SamplePoint]) -> list[SamplePoint]:
        """n random shapes inside the fitted range, none of them a fit shape (fewer if the range has no more)."""
        levels = self.seq_levels()
        taken = {(p.batch_size, p.seq_len) for p in fit}
        points: list[SamplePoint] = []
        for _ in range(100 * n):
            if len(points) == n:
                break
            shape = (rng.randint(1, self.max_batch_size), rng.randint(levels[0], levels[-1]))
            for point in self._shapes(infer_sms, ft_sms, [shape], True):
                if (point.batch_size, point.seq_len) not in taken and point not in points:
                    points.append(point)
        return points

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
