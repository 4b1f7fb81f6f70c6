"""The job set of one worker as the admin API, `--finetune` and the runtime see it: submit, list, show, pause,
resume, cancel; durable in its store; each job publishing its own adapter.

The set itself (harvest.jobs.job_set) is the one job the controller drives, in the scheduler thread (or the
spatial unit thread while it holds the job). The admin thread only submits (adds a member), flips flags, asks a
job to checkpoint and stop, and reads stats; the scheduler thread's next poll acts on them.
"""

import logging
import threading
import time

from base.errors import HarvestError
from harvest.jobs.job_intake import JobIntake
from harvest.jobs.job_set import JobSet, Member

logger = logging.getLogger(__name__)

NO_JOB_STATS = {"state": "none", "error": None, "tokens": 0, "num_units": 0}
"""The current job's stats where the worker holds no job yet."""


class UnknownJobError(HarvestError):
    """No job of that name (the admin API answers 404)."""


class WorkerJobs:
    PERSIST_EVERY_S = 1.0
    STOP_TIMEOUT_S = 120.0

    def __init__(self, intake: JobIntake) -> None:
        self.intake = intake
        self.job_set: JobSet = intake.job_set
        self._lock = threading.Lock()
        """One admin-side change at a time: submit, pause, cancel and the persister never interleave their writes."""
        self._closed = threading.Event()
        self._persister = threading.Thread(target=self._persist_loop, name="harvest-jobs-persist", daemon=True)

    def start(self, initial: dict | None = None) -> None:
        """Resume the stored set, then submit the `--finetune` job unless the store already holds it."""
        for member in self.intake.restore():
            logger.info("harvest: job %s restored (%s)", member.spec.name, self.job_set.job_state(member))
        if initial is not None and initial["name"] not in self.job_set.members:
            self.submit(**initial)
        self._persister.start()

    def close(self) -> None:
        self._closed.set()
        self._persist()

    # ---- admin thread ----

    def submit(self, name: str, yaml_text: str, **fields) -> dict:
        with self._lock:
            record = self.intake.submit(name, yaml_text, **fields)
        logger.info("harvest: job %s submitted (%.0f tokens)", name, record.spec.total_tokens)
        return self.show(name)

    def list(self) -> list[dict]:
        return [self.show(name) for name in list(self.job_set.members)]

    def show(self, name: str) -> dict:
        member = self._member(name)
        return {"name": name, **self.job_set.member_stats(member), "finetune": member.job.stats()}

    def pause(self, name: str) -> dict:
        with self._lock:
            self._act(self.job_set.pause, name)
            self._persist()
        return self.show(name)

    def resume(self, name: str) -> dict:
        with self._lock:
            self._act(self.job_set.resume, name)
            self._persist()
        return self.show(name)

    def cancel(self, name: str) -> dict:
        """Checkpoint the job and free its memory (its engine, window and optimizer state). Its published
        adapter stays loaded: requests naming it get its last version (unloading is SGLang's
        /unload_lora_adapter, the operator's call: tenants may still be served by it)."""
        with self._lock:
            member = self._act(self.job_set.cancel, name)
            self._persist()
        if not member.job.request_stop(self.STOP_TIMEOUT_S):
            raise HarvestError(f"job {name!r} did not checkpoint within {self.STOP_TIMEOUT_S:.0f} s")
        with self._lock:
            self._persist()
        return self.show(name)

    def stop_all(self, timeout_s: float) -> bool:
        """Shutdown: checkpoint every live job; the store keeps them live, so a restart resumes them."""
        deadline = time.monotonic() + timeout_s
        members = [m for m in list(self.job_set.members.values()) if not m.is_done]
        results = [m.job.request_stop(max(0.0, deadline - time.monotonic())) for m in members]  # each, no short cut
        with self._lock:
            self._persist()
        return all(results)

    # ---- any thread ----

    def stats(self) -> dict:
        """The set (active job, measured harvest rate, switches) and every job as `show` gives it."""
        return {**self.job_set.stats(), "jobs": {name: self.show(name) for name in list(self.job_set.members)}}

    def current(self) -> Member | None:
        """The job the device trains now, else the one it trained last, else the first submitted."""
        return self.job_set.current or next(iter(list(self.job_set.members.values())), None)

    def current_stats(self) -> dict:
        member = self.current()
        return NO_JOB_STATS if member is None else {"name": member.spec.name, **member.job.stats()}

    def publishers(self) -> dict:
        return {name: m.job.publisher for name, m in list(self.job_set.members.items())
                if getattr(m.job, "publisher", None) is not None}

    # ---- internals ----

    def _member(self, name: str) -> Member:
        member = self.job_set.members.get(name)
        if member is None:
            raise UnknownJobError(f"no job {name!r}; jobs: {', '.join(self.job_set.members) or 'none'}")
        return member

    def _act(self, verb, name: str) -> Member:
        self._member(name)
        verb(name)
        return self.job_set.members[name]

    def _persist(self) -> None:
        try:
            self.intake.persist()
        except OSError as e:  # a full disk must not take serving down: the next write tries again
            logger.error("harvest: writing the job set failed: %s", e)

    def _persist_loop(self) -> None:
        while not self._closed.wait(self.PERSIST_EVERY_S):
            with self._lock:
                self._persist()
