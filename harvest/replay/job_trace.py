"""A job-arrival trace for `harvest replay --simulate --jobs`: finetune jobs arriving on the request trace's
clock, each with its size in trained tokens, an optional deadline and a priority. Read from a JSONL file (one
job a line) or drawn: `synthetic:N,load=L,seed=S`, N jobs over the request trace at L x the harvest rate.
"""

import json
import math
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from base.errors import HarvestError
from harvest.jobs.job_spec import NAME_PATTERN


@dataclass(frozen=True, slots=True)
class JobArrival:
    arrival_s: float
    """On the request trace's clock (seconds from its start)."""
    name: str
    total_tokens: float
    """The job's size in trained tokens."""
    deadline_s: float | None = None
    """Absolute, on the trace's clock; None: no deadline."""
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise HarvestError(f"name: {self.name!r} must match {NAME_PATTERN.pattern}")
        for key in ("arrival_s", "total_tokens", "deadline_s"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise HarvestError(f"{key}: {value!r} is not a number")
        if self.arrival_s < 0:
            raise HarvestError(f"arrival_s: {self.arrival_s} must be >= 0")
        if not self.total_tokens > 0:
            raise HarvestError(f"total_tokens: {self.total_tokens} must be > 0")
        if self.deadline_s is not None and self.deadline_s <= self.arrival_s:
            raise HarvestError(f"deadline_s: {self.deadline_s} is not after arrival_s {self.arrival_s}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise HarvestError(f"priority: {self.priority!r} is not an integer")


def load_job_trace(path: str | Path) -> list[JobArrival]:
    """One JSON object per line; a bad line is a HarvestError naming the file, the line and the problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HarvestError(f"cannot read job trace {path}: {getattr(e, 'strerror', None) or e}") from None
    keys = {f.name for f in fields(JobArrival)}
    arrivals, line_of = [], {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise HarvestError("not a JSON object")
            unknown = sorted(set(raw) - keys)
            if unknown:
                raise HarvestError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})")
            arrival = JobArrival(**raw)
            if arrival.name in line_of:
                raise HarvestError(f"name: {arrival.name!r} is already line {line_of[arrival.name]}'s")
        except ValueError as e:
            raise HarvestError(f"{path}:{line_no}: not JSON ({e})") from None
        except TypeError as e:
            raise HarvestError(f"{path}:{line_no}: {e}") from None
        except HarvestError as e:
            raise HarvestError(f"{path}:{line_no}: {e}") from None
        line_of[arrival.name] = line_no
        arrivals.append(arrival)
    if not arrivals:
        raise HarvestError(f"{path}: no jobs in the job trace")
    return sorted(arrivals, key=lambda a: a.arrival_s)


def write_job_trace(arrivals: list[JobArrival], path: Path) -> None:
    path.write_text("".join(json.dumps(asdict(a)) + "\n" for a in arrivals))


@dataclass(frozen=True, slots=True)
class SyntheticJobs:
    """`synthetic:N,load=L,seed=S`: N jobs with Poisson arrivals over the request trace, sized so that they
    ask for L x the harvest rate, log-normal sizes, half with a deadline of 1.1-3x the job's solo time after
    its arrival, priorities 0 or 1."""

    num_jobs: int
    load: float = 0.9
    seed: int = 0

    @classmethod
    def from_spec(cls, spec: str) -> "SyntheticJobs":
        _, _, params = spec.partition(":")
        values: dict = {}
        for i, item in enumerate(filter(None, params.split(","))):
            key, eq, value = item.partition("=")
            if not eq and i == 0:
                key, value = "num_jobs", item
            elif key not in ("load", "seed"):
                raise HarvestError(f"--jobs {spec!r}: {item!r} is not N, load= or seed=")
            try:
                values[key] = float(value) if key == "load" else int(value)
            except ValueError:
                raise HarvestError(f"--jobs {spec!r}: {item!r} is not a number") from None
        if values.get("num_jobs", 0) < 1 or not values.get("load", 0.9) > 0:
            raise HarvestError(f"--jobs {spec!r}: give synthetic:N,load=L,seed=S with N >= 1 and L > 0")
        return cls(**values)

    def generate(self, tokens_per_s: float, span_s: float) -> list[JobArrival]:
        rng = random.Random(self.seed)
        mean_s = span_s / self.num_jobs
        mean_tokens = self.load * tokens_per_s * mean_s
        arrivals, t_s = [], 0.0
        for i in range(self.num_jobs):
            t_s += rng.expovariate(1.0 / mean_s)
            size = mean_tokens * math.exp(rng.gauss(0, 0.6) - 0.18)  # -sigma^2/2: the mean stays mean_tokens
            deadline = t_s + size / tokens_per_s * rng.uniform(1.1, 3.0) if rng.random() < 0.5 else None
            arrivals.append(JobArrival(round(t_s, 3), f"job{i:03d}", round(size), deadline and round(deadline, 3),
                                       rng.randint(0, 1)))
        return arrivals


def load_jobs(spec: str) -> list[JobArrival] | SyntheticJobs:
    """`--jobs`: a JSONL file, read and checked now, or a synthetic spec, drawn once the harvest rate is known."""
    if spec.startswith("synthetic:"):
        return SyntheticJobs.from_spec(spec)
    return load_job_trace(spec)
