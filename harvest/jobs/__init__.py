"""Jobs: several finetune jobs in one worker, queued, scheduled by deadline slack, durable on disk."""

from harvest.jobs.job_set import JobSet
from harvest.jobs.job_spec import JobSpec
from harvest.jobs.job_store import JobStore

__all__ = ["JobSet", "JobSpec", "JobStore"]
