"""Read a trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`, the Azure 2023 format) and resolve the
`--trace` argument: a shipped name (`conv`, `code`), a synthetic spec (`poisson:...`, `gamma:...`), or a path.

Every bad row is a HarvestError naming the file and line. TIMESTAMP is a date-time with any number of
fractional digits (Azure writes 7; `%f` takes at most 6) or a number of seconds.
"""

import csv
import datetime
import math
import re
from pathlib import Path

import numpy as np

from base.errors import HarvestError
from traces import azure_code, azure_conv
from traces.synthetic_trace import SyntheticTrace
from traces.trace import Trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")


def shipped_traces() -> dict[str, Path]:
    return {"conv": azure_conv.CSV_PATH, "code": azure_code.CSV_PATH}


def load_trace(spec: str) -> Trace:
    """A shipped trace by name, a synthetic trace from its spec, or a CSV file."""
    shipped = shipped_traces()
    if spec in shipped:
        return load_csv(shipped[spec], name=spec)
    if spec.split(":", 1)[0] in SyntheticTrace.KINDS:
        synthetic = SyntheticTrace.from_spec(spec)
        return synthetic.generate(load_csv(shipped[synthetic.lengths], name=synthetic.lengths))
    path = Path(spec)
    if not path.is_file():
        raise HarvestError(
            f"trace {spec!r} is not a file, a shipped trace ({', '.join(shipped)}) or a synthetic spec "
            "(poisson:rate=5,duration=600,seed=0 or gamma:rate=5,cv=3,duration=600,seed=0)"
        )
    return load_csv(path)


def load_csv(path: str | Path, name: str | None = None) -> Trace:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise HarvestError(f"cannot read trace {path}: {getattr(e, 'strerror', None) or e}") from None
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise HarvestError(f"{path}:1: header must be {','.join(COLUMNS)}, got {','.join(header or []) or 'nothing'}")
    times, contexts, generated = [], [], []
    for line_no, row in enumerate(rows, start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3:
            raise HarvestError(f"{path}:{line_no}: expected 3 fields ({','.join(COLUMNS)}), got {len(row)}")
        times.append(_parse_time(row[0].strip(), path, line_no))
        contexts.append(_parse_count(row[1], "ContextTokens", 0, path, line_no))
        generated.append(_parse_count(row[2], "GeneratedTokens", 1, path, line_no))
    if not times:
        raise HarvestError(f"{path}: no requests (only a header)")
    arrival = np.array(times, dtype=np.float64)
    # Requests are replayed in arrival order; a trace written out of order is sorted, not rejected.
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order[0]]
    return Trace(
        name or path.stem,
        arrival,
        np.array(contexts, dtype=np.int64)[order],
        np.array(generated, dtype=np.int64)[order],
    )


def _parse_time(text: str, path: Path, line_no: int) -> float:
    match = _DATETIME.match(text)
    if match:
        try:
            whole = datetime.datetime.fromisoformat(match.group(1).replace("T", " "))
        except ValueError:
            raise HarvestError(f"{path}:{line_no}: TIMESTAMP {text!r} is not a valid date-time") from None
        fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
        return whole.replace(tzinfo=datetime.UTC).timestamp() + fraction
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise HarvestError(
            f"{path}:{line_no}: TIMESTAMP {text!r} is neither a date-time (2023-11-16 18:15:46.6805900) "
            "nor a number of seconds >= 0"
        )
    return seconds


def _parse_count(text: str, column: str, minimum: int, path: Path, line_no: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise HarvestError(f"{path}:{line_no}: {column} {text!r} is not a whole number") from None
    if value < minimum:
        raise HarvestError(f"{path}:{line_no}: {column} must be >= {minimum}, got {value}")
    return value
