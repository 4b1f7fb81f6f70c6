"""The worker's JobSet, fed by a job-arrival trace on the simulated clock: `harvest replay --simulate --jobs`
hands it to the harvest policy's controller in place of one SimulatedJob, so every unit's time and every
co-run's tokens come from the decode simulation, and the harvest rate the set measures is the simulated one.

The three job policies are one mechanism with the policy a parameter: "slack" (the scheduler), "fifo"
(submission order) and "one-at-a-time" (FIFO plus a worker restart after each job, as with today's
`--finetune`: one job per worker). A switch between jobs re-fetches the incoming job's window (switch_s of
no finetune work); a restart is modelled as restart_s of no finetune work, decode going on meanwhile.
Every job is submitted best effort, so all three policies schedule the same set.
"""

import math

from harvest.jobs.job_set import JobSet
from harvest.jobs.job_spec import JobSpec
from harvest.replay.job_trace import JobArrival
from harvest.replay.simulated_job import SimClock, SimulatedJob, SimulatedUnit

JOB_POLICIES = ("slack", "fifo", "one-at-a-time")


class SimulatedJobSet(JobSet):
    def __init__(self, clock: SimClock, unit_ms: float, tokens_per_s: float, arrivals: list[JobArrival],
                 policy: str, prior_tokens_per_s: float | None = None, switch_s: float = 2.0,
                 restart_s: float = 60.0) -> None:
        """`unit_ms`, `tokens_per_s`: each job's units, as HarvestPolicy sizes one job's; `prior_tokens_per_s`:
        the harvest rate the set judges slack by until it has measured one."""
        if policy not in JOB_POLICIES:
            raise ValueError(f"job policy {policy!r} is not one of {', '.join(JOB_POLICIES)}")
        super().__init__(clock, prior_tokens_per_s, policy="slack" if policy == "slack" else "fifo")
        self.job_policy = policy
        self.is_ready = False
        """Whether the lent KV memory holds a window (the harvest policy sets it each step)."""
        self._unit_ms, self._tokens_per_s = unit_ms, tokens_per_s
        self._pending = sorted(arrivals, key=lambda a: a.arrival_s)
        self._next = 0
        self.switch_s, self.restart_s = switch_s, restart_s
        self._blocked_until_s = 0.0
        self._num_switches_seen = 0
        self._finished_seen: set[str] = set()

    def poll(self) -> None:
        now = self.clock()
        while self._next < len(self._pending) and self._pending[self._next].arrival_s <= now:
            a = self._pending[self._next]
            self._next += 1
            self.submit(JobSpec(a.name, "", a.total_tokens, a.priority, a.deadline_s, True, None, a.arrival_s),
                        SimulatedJob(self.clock, self._unit_ms, self._tokens_per_s))
        for member in self.members.values():
            member.job.is_ready = self.is_ready
        super().poll()
        if self.num_switches > self._num_switches_seen:
            self._num_switches_seen = self.num_switches
            self._blocked_until_s = max(self._blocked_until_s, now + self.switch_s)
        finished = [m for n, m in self.members.items() if m.finished_s is not None and n not in self._finished_seen]
        for member in finished:
            self._finished_seen.add(member.spec.name)
            if self.job_policy == "one-at-a-time":
                self._blocked_until_s = max(self._blocked_until_s, member.finished_s) + self.restart_s

    def has_ready_work(self) -> bool:
        return self.clock() >= self._blocked_until_s and super().has_ready_work()

    def co_run(self, duration_ms: float, num_trained_tokens: float) -> SimulatedUnit:
        """The active job's work beside a decode step, credited to it as the unit thread's would be."""
        self.current.job.stage_co_run(duration_ms, num_trained_tokens)
        return self.run_unit()

    def wake_s(self) -> float:
        now = self.clock()
        times = [self._pending[self._next].arrival_s] if self._next < len(self._pending) else []
        if self._blocked_until_s > now and any(not m.is_done for m in self.members.values()):
            times.append(self._blocked_until_s)
        return min((t for t in times if t > now), default=math.inf)

    @property
    def num_trained_tokens(self) -> float:
        """Tokens trained towards the jobs' sizes (a job's last unit may overshoot it; that is not counted)."""
        return sum(min(m.num_trained_tokens, m.spec.total_tokens) for m in self.members.values())
