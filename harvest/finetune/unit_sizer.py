"""How many rows of a micro-batch one unit may carry so that it stays under `max_unit_ms` (HARLI sec. 6.1).

Torch-free. A unit of a kind costs a fixed part (per layer: the module calls and kernel launches; the head:
the vocabulary projection's weight read and its gradient's product, once per unit whatever its span) plus a
part per position, fitted per kind as a line through its recent units' distinct sizes. A unit's size is the
positions it computes, rows x sequence positions, padding included: attention, the MLP and the head compute over
padded positions as over real ones (fitted on non-padding tokens instead, a span of padding alone was never
timed and the head's line ran ~2x under its units: eval/README.md). Rows are cut so the
slowest kind but the head fits the bound; the head is cut along the sequence instead, and a span whose head
is still over the bound along the vocabulary (head_vocab_parts: its fixed cost is split too). The optimizer
update is cut over its parameters (optimizer_parts), at its whole update's measured time. A unit carries at
least as much per-position work as its fixed cost: where the bound leaves less room, it runs up to twice its
fixed cost rather than spend most of its time on it (cut on per-position cost alone, the demo job's head went to
spans of ~2 positions at an 18.6 ms bound and the job trained at a third of its uncut rate: eval/README.md).
Splitting rows, spans or the vocabulary does not change the result: the loss is a token sum over the
accumulation window (over vocabulary chunks, up to float rounding: the log-sum-exp is summed chunk by chunk).
"""

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

SIZES_PER_KIND = 8
"""Distinct unit sizes (positions) a kind's cost line is fitted over: the most recent ones."""
SPREAD_WINDOW = 32
"""A kind's last units whose time over its line's prediction sets how far under the bound it is sized."""
MIN_SPREAD_SAMPLES = 8
SPREAD_Z = 2.33
"""The standard normal's 99th percentile: a unit is sized so 99 % of its kind's units (log-normal spread around
the line) stay within the bound."""


@dataclass(slots=True)
class UnitSizer:
    max_unit_ms: float | None = None
    """Target upper bound on one unit's duration; None never splits on time."""
    max_slice_rows: int | None = None
    """Hard cap on rows per unit (deterministic splitting, for tests and tiny memory budgets)."""
    smoothing: float = 0.5
    """Weight of the newest sample in a size's moving average of its ms."""
    _ms: dict[str, dict[int, float]] = field(default_factory=dict)
    """kind -> positions -> moving average of its units' ms, the SIZES_PER_KIND most recently seen sizes."""
    _head_heavy_share: float = 0.5
    """Moving average of a split head's heavier pass (logits or gradient) as a share of its whole time."""
    _optimizer_ms: float | None = None
    """Moving average of a whole optimizer update's ms (its parts summed)."""
    _spread: dict[str, deque[float]] = field(default_factory=dict)
    """kind -> log(measured / predicted) of its last SPREAD_WINDOW units, each against the line before it."""

    def __post_init__(self) -> None:
        if self.max_unit_ms is not None and self.max_unit_ms <= 0:
            raise ValueError(f"max_unit_ms must be > 0, got {self.max_unit_ms}")
        if self.max_slice_rows is not None and self.max_slice_rows < 1:
            raise ValueError(f"max_slice_rows must be >= 1, got {self.max_slice_rows}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")

    def observe(self, kind: str, num_positions: int, duration_ms: float) -> None:
        if num_positions <= 0 or duration_ms <= 0:  # a unit under the clock's resolution says nothing of its cost
            return
        line = self.cost(kind)
        if line is not None:
            self._add_spread(kind, line[0] + line[1] * num_positions, duration_ms)
        sizes = self._ms.setdefault(kind, {})
        previous = sizes.pop(num_positions, None)  # re-inserted: the most recent size last
        sizes[num_positions] = duration_ms if previous is None else previous + self.smoothing * (duration_ms - previous)
        if len(sizes) > SIZES_PER_KIND:
            del sizes[next(iter(sizes))]

    def observe_split_head(self, num_positions: int, logits_ms: float, gradient_ms: float) -> None:
        """A head cut over vocabulary chunks, its two passes' units summed: the head's time at num_positions, and
        the share its heavier pass took (the passes differ: eval/README.md, "Temporal slice")."""
        whole_ms = logits_ms + gradient_ms
        self.observe("head", num_positions, whole_ms)
        if whole_ms > 0:
            share = max(logits_ms, gradient_ms) / whole_ms
            self._head_heavy_share += self.smoothing * (share - self._head_heavy_share)

    def observe_optimizer(self, duration_ms: float) -> None:
        """A whole optimizer update's ms: its parts summed, its grad_norm unit not (that one is not cut)."""
        if duration_ms <= 0:
            return
        previous = self._optimizer_ms
        if previous is not None:
            self._add_spread("optimizer", previous, duration_ms)
        self._optimizer_ms = duration_ms if previous is None else previous + self.smoothing * (duration_ms - previous)

    def _add_spread(self, kind: str, predicted_ms: float, measured_ms: float) -> None:
        if predicted_ms > 0:
            window = self._spread.setdefault(kind, deque(maxlen=SPREAD_WINDOW))
            window.append(math.log(measured_ms / predicted_ms))

    def overrun(self, kind: str) -> float:
        """How far over its line's prediction a unit of `kind` runs at the 99th percentile: exp(mean + SPREAD_Z
        std) of log(measured / predicted) over its last units, at least 1 (1 until MIN_SPREAD_SAMPLES are
        timed). Units are sized to the bound divided by it: a unit sized to the line alone runs over the bound
        whenever it runs slower than the line, and noise makes that common (eval/README.md)."""
        window = self._spread.get(kind)
        if window is None or len(window) < MIN_SPREAD_SAMPLES:
            return 1.0
        return max(1.0, math.exp(statistics.fmean(window) + SPREAD_Z * statistics.stdev(window)))

    def overruns(self) -> dict[str, float]:
        """Each timed kind's overrun (stats: how far under `max_unit_ms` its units are cut)."""
        return {kind: round(self.overrun(kind), 3) for kind in self._spread}

    def costs(self) -> dict[str, list[float]]:
        """Each timed kind's line, [fixed ms, ms per position] (stats: a fixed part of 0 is the fallback that
        puts a unit's whole time on its positions)."""
        return {kind: [round(fixed, 4), round(per_position, 6)] for kind in self._ms
                for fixed, per_position in [self.cost(kind)]}

    def predict_ms(self, kind: str, num_positions: int, vocab_parts: int = 0, optimizer_parts: int = 0) -> float | None:
        """A unit's time on its kind's line at its size: one of a head's 2 x `vocab_parts` chunk units at its
        heavier pass's share, one of `optimizer_parts` parts of an update at its share of the update's time. None:
        its kind is not timed yet, or has no size (grad_norm, an update not cut)."""
        if optimizer_parts:
            return None if self._optimizer_ms is None else self._optimizer_ms / optimizer_parts
        line = self.cost(kind)
        if line is None or num_positions <= 0:
            return None
        whole_ms = line[0] + line[1] * num_positions
        return whole_ms * self._head_heavy_share / vocab_parts if vocab_parts else whole_ms

    def optimizer_parts(self, max_parts: int) -> int:
        """P in [1, max_parts]: the parts an optimizer update is cut into so one stays under `max_unit_ms` at
        the update's measured time (each part's own fixed cost is in that time, so P errs high and settles);
        max_parts before an update is timed (the first one also builds the optimizer's state); 1 without a
        bound."""
        if self.max_unit_ms is None or max_parts <= 1:
            return 1
        if self._optimizer_ms is None:
            return max_parts
        return max(1, min(max_parts, math.ceil(self._optimizer_ms * self.overrun("optimizer") / self.max_unit_ms)))

    def cost(self, kind: str) -> tuple[float, float] | None:
        """(fixed ms, ms per position) of a unit of `kind`: a robust line through its recent sizes' times (the
        median of pairwise slopes, Theil-Sen: one stalled unit, like a first one that loaded data, does not
        tilt it), the fixed part at least 0. With one size timed, or no growth with size: for a layer kind all
        of it per position (the median ratio), which cuts shorter than the line, so other sizes get timed; for the
        head all of it fixed (the median time), its weight read, which no shorter span cuts but vocabulary
        chunks do (cut per position instead, it went to spans of a few positions that each still ran over the bound:
        eval/README.md). None: nothing timed."""
        sizes = self._ms.get(kind)
        if not sizes:
            return None
        points = list(sizes.items())
        slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:]]
        slope = statistics.median(slopes) if slopes else 0.0
        if slope <= 0 and kind == "head":
            return statistics.median(y for _, y in points), 0.0
        if slope <= 0:
            return 0.0, statistics.median(y / x for x, y in points)
        return max(0.0, statistics.median(y - slope * x for x, y in points)), slope

    def _positions_within_bound(self, kind: str) -> float:
        fixed, per_position = self.cost(kind)
        if per_position == 0:
            return math.inf
        return max(self.max_unit_ms / self.overrun(kind) - fixed, fixed) / per_position

    def rows_per_slice(self, num_rows: int, positions_per_row: int) -> int:
        """Rows per unit in [1, num_rows]: as many as fit `max_unit_ms` at every timed unit kind but the head,
        which is cut along the sequence instead (head_spans); one before any unit is timed."""
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        rows = num_rows
        if self.max_unit_ms is not None:
            # Nothing timed yet (the job's first step): one row per unit, the smallest it can be. A first step
            # of whole micro-batches overran the bound several times over and, in a worker that never idles,
            # did not finish (its units fit no slice).
            kinds = [kind for kind in self._ms if kind != "head"]
            positions = min((self._positions_within_bound(kind) for kind in kinds), default=None)
            rows = 1 if positions is None else math.floor(positions / max(positions_per_row, 1))
        if self.max_slice_rows is not None:
            rows = min(rows, self.max_slice_rows)
        return max(1, min(rows, num_rows))

    def head_vocab_parts(self, num_positions: int, max_parts: int) -> int:
        """K <= max_parts: the vocabulary chunks a head unit over `num_positions` positions is split into, in 2K
        units (K for the logits, K for the gradient), so one stays under `max_unit_ms` at the head's measured
        cost and its heavier pass's share of it (a half until a split head is timed); 0: one whole unit (it
        fits, nothing is timed yet, or max_parts is 0). The head's fixed cost, its weight read, is what a span
        of one position cannot cut; each of K chunks reads 1/K of it."""
        if self.max_unit_ms is None or not self._ms.get("head") or max_parts < 1:
            return 0
        fixed, per_position = self.cost("head")
        whole_ms = (fixed + per_position * num_positions) * self.overrun("head")  # at its 99th percentile
        if whole_ms <= self.max_unit_ms:
            return 0
        return min(max_parts, math.ceil(whole_ms * self._head_heavy_share / self.max_unit_ms))

    def head_spans(self, num_rows: int, seq_len: int) -> list[tuple[int, int]]:
        """Sequence positions [start, end) of each head unit of a row slice: as few equal spans as keep one
        under `max_unit_ms` at the head's measured cost (see the module's docstring). The head (vocabulary
        projection, loss and their backward) is per position, so a span's loss and gradient are exactly that
        span's share."""
        length = seq_len
        if self.max_unit_ms is not None and self._ms.get("head"):
            positions = self._positions_within_bound("head")
            length = seq_len if math.isinf(positions) else max(1, min(seq_len, math.floor(positions / num_rows)))
        length = math.ceil(seq_len / math.ceil(seq_len / length))  # equal spans, none longer
        return [(start, min(start + length, seq_len)) for start in range(0, seq_len, length)]
