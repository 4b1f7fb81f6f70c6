"""The job set on disk: one JSON record per job (spec, state, checkpoint dir, tokens trained) under the
worker's state dir, each written atomically (temp file, fsync, rename), so a kill -9 leaves every record
either old or new, never torn. A restarted worker reads them back and resumes each job in its state."""

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harvest.jobs.job_spec import JobConflictError, JobSpec

RECORD_SUFFIX = ".job.json"


@dataclass(frozen=True, slots=True)
class JobRecord:
    spec: JobSpec
    state: str = "queued"
    """queued | running | paused | finished | cancelled | failed (the set's view, not the engine's phase)."""
    checkpoint_dir: str | None = None
    num_trained_tokens: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "state": self.state, "checkpoint_dir": self.checkpoint_dir,
                "num_trained_tokens": self.num_trained_tokens, "error": self.error}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "JobRecord":
        return cls(JobSpec.from_dict(raw["spec"]), raw["state"], raw.get("checkpoint_dir"),
                   raw.get("num_trained_tokens", 0.0), raw.get("error"))


class JobStore:
    MAX_JOBS = 64

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.state_dir / f"{name}{RECORD_SUFFIX}"

    def add(self, record: JobRecord) -> None:
        """A new job; refuses a duplicate name or one past MAX_JOBS (JobConflictError, nothing written)."""
        if self.path(record.spec.name).exists():
            raise JobConflictError(f"name: a job named {record.spec.name!r} already exists")
        num_jobs = sum(1 for _ in self.state_dir.glob(f"*{RECORD_SUFFIX}"))
        if num_jobs >= self.MAX_JOBS:
            raise JobConflictError(f"the worker holds {num_jobs} jobs, the most it takes; delete finished ones first")
        self._write(record)

    def update(self, name: str, **changes) -> JobRecord:
        record = replace(self.get(name), **changes)
        self._write(record)
        return record

    def get(self, name: str) -> JobRecord:
        path = self.path(name)
        if not path.exists():
            raise KeyError(name)
        return JobRecord.from_dict(json.loads(path.read_text()))

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def load(self) -> list[JobRecord]:
        """Every record, oldest submission first (the order the set was built in)."""
        records = [JobRecord.from_dict(json.loads(p.read_text()))
                   for p in self.state_dir.glob(f"*{RECORD_SUFFIX}")]
        return sorted(records, key=lambda r: (r.spec.submitted_s, r.spec.name))

    def _write(self, record: JobRecord) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record.to_dict(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(record.spec.name))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
