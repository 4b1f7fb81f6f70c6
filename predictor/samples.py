"""Measured decode latencies: one CSV row per (partition, batch shape) point the profiler timed."""

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from base.errors import HarvestError

CSV_COLUMNS = ("infer_sm_ratio", "ft_sm_ratio", "batch_size", "seq_len", "latency_ms")


@dataclass(frozen=True, slots=True)
class Sample:
    infer_sm_ratio: float
    """Fraction of the device's SMs the decode step ran on, in (0, 1]."""

    ft_sm_ratio: float
    """Fraction the finetune job ran on at the same time; 0 for a solo run."""

    batch_size: int
    """Requests in the decode batch."""

    seq_len: float
    """Mean KV length per request, so batch_size * seq_len KV tokens are read."""

    latency_ms: float
    """Measured time of the decode step."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.infer_sm_ratio) and 0.0 < self.infer_sm_ratio <= 1.0):
            raise HarvestError(f"infer_sm_ratio must be in (0, 1], got {self.infer_sm_ratio}")
        if not (math.isfinite(self.ft_sm_ratio) and 0.0 <= self.ft_sm_ratio < 1.0):
            raise HarvestError(f"ft_sm_ratio must be in [0, 1), got {self.ft_sm_ratio}")
        if self.infer_sm_ratio + self.ft_sm_ratio > 1.0 + 1e-9:
            raise HarvestError(
                f"infer_sm_ratio + ft_sm_ratio must be <= 1, got {self.infer_sm_ratio} + {self.ft_sm_ratio}"
            )
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise HarvestError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not (math.isfinite(self.seq_len) and self.seq_len >= 0.0):
            raise HarvestError(f"seq_len must be a finite number >= 0, got {self.seq_len}")
        if not (math.isfinite(self.latency_ms) and self.latency_ms > 0.0):
            raise HarvestError(f"latency_ms must be a finite number > 0, got {self.latency_ms}")

    @property
    def is_solo(self) -> bool:
        return self.ft_sm_ratio == 0.0

    @property
    def num_kv_tokens(self) -> float:
        return self.batch_size * self.seq_len


def load_samples(path: str | Path) -> list[Sample]:
    """Read a samples CSV; a bad row raises HarvestError naming the file, the line and the reason."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise HarvestError(f"cannot read samples file {path}: {e.strerror or e}") from None
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    if header is None:
        raise HarvestError(f"{path}: empty file, expected the header {','.join(CSV_COLUMNS)}")
    if tuple(h.strip() for h in header) != CSV_COLUMNS:
        raise HarvestError(f"{path}:1: header must be {','.join(CSV_COLUMNS)}, got {','.join(header)}")
    samples = []
    for line_number, row in enumerate(rows, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        try:
            samples.append(_parse_row(row))
        except HarvestError as e:
            raise HarvestError(f"{path}:{line_number}: {e}") from None
    if not samples:
        raise HarvestError(f"{path}: no samples after the header")
    return samples


def write_samples(path: str | Path, samples: list[Sample]) -> None:
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for s in samples:
            writer.writerow(
                [repr(s.infer_sm_ratio), repr(s.ft_sm_ratio), s.batch_size, repr(s.seq_len), repr(s.latency_ms)]
            )


def _parse_row(row: list[str]) -> Sample:
    if len(row) != len(CSV_COLUMNS):
        raise HarvestError(f"expected {len(CSV_COLUMNS)} fields ({','.join(CSV_COLUMNS)}), got {len(row)}")
    values = {}
    for name, cell in zip(CSV_COLUMNS, row, strict=True):
        try:
            values[name] = float(cell)
        except ValueError:
            raise HarvestError(f"{name} is not a number: {cell.strip()!r}") from None
    batch_size = values["batch_size"]
    if not batch_size.is_integer():
        raise HarvestError(f"batch_size must be a whole number, got {row[2].strip()!r}")
    values["batch_size"] = int(batch_size)
    return Sample(**values)
