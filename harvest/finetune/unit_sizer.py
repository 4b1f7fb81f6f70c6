"""How many rows of a micro-batch one unit may carry so that it stays under `max_unit_ms` (HARLI sec. 6.1).

Torch-free. Learns the cost of the slowest unit kind per token from measured unit durations; splitting
rows does not change the result because the loss is a token sum over the accumulation window.
"""

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class UnitSizer:
    max_unit_ms: float | None = None
    """Target upper bound on one unit's duration; None never splits on time."""
    max_slice_rows: int | None = None
    """Hard cap on rows per unit (deterministic splitting, for tests and tiny memory budgets)."""
    smoothing: float = 0.5
    """Weight of the newest sample in the per-kind moving average of ms per token."""
    _ms_per_token: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_unit_ms is not None and self.max_unit_ms <= 0:
            raise ValueError(f"max_unit_ms must be > 0, got {self.max_unit_ms}")
        if self.max_slice_rows is not None and self.max_slice_rows < 1:
            raise ValueError(f"max_slice_rows must be >= 1, got {self.max_slice_rows}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")

    def observe(self, kind: str, num_tokens: int, duration_ms: float) -> None:
        if num_tokens <= 0 or duration_ms < 0:
            return
        sample = duration_ms / num_tokens
        previous = self._ms_per_token.get(kind)
        self._ms_per_token[kind] = sample if previous is None else previous + self.smoothing * (sample - previous)

    def slowest_ms_per_token(self, exclude: tuple[str, ...] = ()) -> float | None:
        return max((ms for kind, ms in self._ms_per_token.items() if kind not in exclude), default=None)

    def rows_per_slice(self, num_rows: int, tokens_per_row: int) -> int:
        """Rows per unit in [1, num_rows]: as many as fit `max_unit_ms` at the slowest measured unit kind but
        the head, which is cut along the sequence instead (head_spans); one before any unit is timed."""
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        rows = num_rows
        ms_per_token = self.slowest_ms_per_token(exclude=("head",))
        if self.max_unit_ms is not None:
            # Nothing timed yet (the job's first step): one row per unit, the smallest it can be. A first step
            # of whole micro-batches overran the bound several times over and, in a worker that never idles,
            # did not finish (its units fit no slice).
            rows = 1 if not ms_per_token else math.floor(self.max_unit_ms / (ms_per_token * max(tokens_per_row, 1)))
        if self.max_slice_rows is not None:
            rows = min(rows, self.max_slice_rows)
        return max(1, min(rows, num_rows))

    def head_spans(self, num_rows: int, seq_len: int) -> list[tuple[int, int]]:
        """Sequence positions [start, end) of each head unit of a row slice: as few equal spans as keep one
        under `max_unit_ms` at the head's measured cost. The head (vocabulary projection, loss and their
        backward) is per position, so a span's loss and gradient are exactly that span's share."""
        ms_per_token = self._ms_per_token.get("head")
        length = seq_len
        if self.max_unit_ms is not None and ms_per_token:
            length = max(1, min(seq_len, math.floor(self.max_unit_ms / (num_rows * ms_per_token))))
        length = math.ceil(seq_len / math.ceil(seq_len / length))  # equal spans, none longer
        return [(start, min(start + length, seq_len)) for start in range(0, seq_len, length)]
