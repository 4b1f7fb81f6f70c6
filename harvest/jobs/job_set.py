"""Several finetune jobs behind the one job the controller drives: the JobSet has FinetuneJob's
scheduler-thread interface (poll, has_ready_work, next_unit_kind, run_unit, note_no_room, state, engine)
and picks whose unit runs next.

Policy (PromptTuner's, on harvest's measured rate): jobs with a deadline first, least slack first, where
slack = time to the deadline - the job's remaining tokens / the set's *measured* harvest rate (tokens
trained per wall second while the set had work); then higher priority; then fair share (least unit time
used). A deadline the measured rate cannot meet, given the deadlines already admitted (EDF feasibility),
is refused at submission with the numbers, unless the job is best effort.

Memory has one owner: the lender lends to the *active* job's engine only (`engine` is the active job's).
A switch happens only between optimizer updates of the active job (never mid-update: a part-applied
update belongs to no step), and evicts the outgoing job's window first (set_window(0) frees its lent
chunks into the allocator); the controller then sees a new engine and attaches the lender to it, which
grows the incoming job's window from free KV as for a fresh job. Simplest correct: a switch re-fetches
the window; the policy only switches when the pick changes at a step boundary, which bounds the churn.
"""

import time
from dataclasses import dataclass

from base.errors import HarvestError
from harvest.colocation.finetune_job import ENDED_PHASES, FinetuneState
from harvest.jobs.job_spec import JobConflictError, JobSpec


class DeadlineError(JobConflictError):
    """A deadline the measured harvest rate cannot meet (the admin API answers 409)."""


@dataclass(slots=True)
class Member:
    spec: JobSpec
    job: object
    """A FinetuneJob (or replay's SimulatedJob): what runs the units."""
    num_trained_tokens: float = 0.0
    used_ms: float = 0.0
    is_paused: bool = False
    is_cancelled: bool = False
    finished_s: float | None = None

    window: int | None = None
    """The job's window when it was switched out (restored when it is switched back in)."""

    @property
    def remaining_tokens(self) -> float:
        return max(0.0, self.spec.total_tokens - self.num_trained_tokens)

    @property
    def tokens_due(self) -> float:
        """What is still owed by the deadline (its deadline_tokens, or the whole job)."""
        return max(0.0, self.spec.tokens_due - self.num_trained_tokens)

    @property
    def is_done(self) -> bool:
        return (self.is_cancelled or self.finished_s is not None or self.remaining_tokens == 0
                or self.job.state in ENDED_PHASES)


class JobSet:
    POLICIES = ("slack", "fifo")

    def __init__(self, clock=time.time, prior_tokens_per_s: float | None = None, policy: str = "slack",
                 switch_margin_s: float = 30.0, fair_share_quantum_ms: float = 30_000.0) -> None:
        """`clock`: wall seconds (deadlines are wall times); `prior_tokens_per_s`: the harvest rate to judge
        deadlines by until one is measured (the profile's; None: admit until measured); `policy`: "slack"
        (the scheduler) or "fifo" (submission order, the baseline the simulation compares against).
        The active job keeps the device until another's slack is `switch_margin_s` smaller or, without
        deadlines, it has used `fair_share_quantum_ms` more: least slack alone switches every unit once two
        slacks meet (a waiting job's slack shrinks, the running one's does not), and each switch re-fetches
        a window."""
        if policy not in self.POLICIES:
            raise HarvestError(f"policy: {policy!r} is not one of {', '.join(self.POLICIES)}")
        self.policy = policy
        self.switch_margin_s = switch_margin_s
        self.fair_share_quantum_ms = fair_share_quantum_ms
        self.clock = clock
        self.prior_tokens_per_s = prior_tokens_per_s
        self.members: dict[str, Member] = {}
        self._active: Member | None = None
        self._last_active: Member | None = None
        self._busy_since_s: float | None = None
        self._busy_s = 0.0
        self._num_trained_tokens = 0.0
        self.num_switches = 0
        self.requested_unit_ms: float | None = None

    # ---- admin side ----

    def submit(self, spec: JobSpec, job) -> Member:
        """Admit a checked job; DeadlineError (nothing added) if its deadline cannot be met."""
        if spec.name in self.members:
            raise JobConflictError(f"name: a job named {spec.name!r} already exists")
        if spec.deadline_s is not None and not spec.is_best_effort:
            self.check_deadlines(spec)
        return self.add(Member(spec, job))

    def add(self, member: Member) -> Member:
        """Hold a member as it is (a restart's restored job: admitted before, not judged again)."""
        self.members[member.spec.name] = member
        return member

    def check_deadlines(self, spec: JobSpec) -> None:
        """EDF at the measured rate over the admitted deadlines plus this one; refuse with the numbers."""
        now = self.clock()
        if spec.deadline_s <= now:
            raise HarvestError(f"deadline_s: {spec.deadline_s:.0f} is in the past (now {now:.0f})")
        rate = self.harvest_tokens_per_s()
        if rate is None:
            return
        pending = [(m.spec.deadline_s, m.spec.name, m.tokens_due) for m in list(self.members.values())
                   if not m.is_done and m.spec.deadline_s is not None and not m.spec.is_best_effort]
        pending.append((spec.deadline_s, spec.name, spec.tokens_due))
        finish_s = now
        for deadline_s, name, remaining in sorted(pending):
            finish_s += remaining / rate
            if finish_s > deadline_s:
                whose = "its" if name == spec.name else f"job {name!r}'s"
                raise DeadlineError(
                    f"deadline_s: {spec.tokens_due:.0f} tokens at the measured {rate:.1f} tokens/s would "
                    f"finish {whose} work at {finish_s:.0f}, {finish_s - deadline_s:.0f} s after its deadline "
                    f"{deadline_s:.0f} (submit with best_effort to queue it anyway)")

    def pause(self, name: str) -> None:
        member = self._live(name, "pause")
        if hasattr(member.job, "pause"):
            member.job.pause()
        member.is_paused = True

    def resume(self, name: str) -> None:
        member = self._live(name, "resume")
        if hasattr(member.job, "resume"):
            member.job.resume()
        member.is_paused = False

    def cancel(self, name: str) -> Member:
        """Mark cancelled; the caller checkpoints and stops its job (request_stop), which frees its memory. The
        scheduler thread's next poll moves the device on (the admin thread never changes the active job)."""
        member = self._live(name, "cancel")
        member.is_cancelled = True
        return member

    def _live(self, name: str, verb: str) -> Member:
        member = self.members.get(name)
        if member is None:
            raise KeyError(name)
        if member.is_done:
            raise JobConflictError(f"cannot {verb} job {name!r}: it is {self.job_state(member)}")
        return member

    def job_state(self, member: Member) -> str:
        if member.is_cancelled:
            return "cancelled"
        if member.finished_s is not None or member.remaining_tokens == 0:
            return "finished"
        if member.job.state in ENDED_PHASES:
            return member.job.state.value
        if member.is_paused:
            return "paused"
        return "running" if member is self._active else "queued"

    # ---- policy ----

    def harvest_tokens_per_s(self) -> float | None:
        busy_s = self._busy_s + (self.clock() - self._busy_since_s if self._busy_since_s is not None else 0.0)
        if self._num_trained_tokens > 0 and busy_s > 0:
            return self._num_trained_tokens / busy_s
        return self.prior_tokens_per_s

    def slack_s(self, member: Member) -> float | None:
        """Seconds to spare if the job had the whole harvest from now; None: no deadline or no rate yet."""
        rate = self.harvest_tokens_per_s()
        if member.spec.deadline_s is None or rate is None:
            return None
        return member.spec.deadline_s - self.clock() - member.tokens_due / rate

    def rank_key(self, member: Member) -> tuple:
        """Smallest runs next; the active job is ranked with its switch margins taken off (hysteresis)."""
        if self.policy == "fifo":
            return (member.spec.submitted_s, member.spec.name)
        is_incumbent = member is self._active
        slack = self.slack_s(member)
        has_deadline = member.spec.deadline_s is not None
        order = slack if slack is not None else (member.spec.deadline_s if has_deadline else 0.0)
        if is_incumbent and has_deadline:
            order -= self.switch_margin_s
        used_ms = member.used_ms - (self.fair_share_quantum_ms if is_incumbent else 0.0)
        return (not has_deadline, order, -member.spec.priority, used_ms, member.spec.submitted_s, not is_incumbent)

    def pick(self) -> Member | None:
        """The member whose units run next. A paused one only while it has work a pause lets through (a publish
        asked for: FinetuneJob.has_ready_work)."""
        ready = [m for m in list(self.members.values()) if not m.is_done and self._can_run(m)
                 and (not m.is_paused or m.job.has_ready_work())]
        return min(ready, key=self.rank_key, default=None)

    @staticmethod
    def _can_run(member: Member) -> bool:
        """Built and not ended, whether or not its next unit is ready this instant: a job switched out had its
        window evicted, so its units are ready only once it is back in, and one waiting for a layer's fetch
        keeps its turn rather than be switched out for it."""
        return member.job.is_active and member.job.state not in ENDED_PHASES

    def _can_switch(self) -> bool:
        active = self._active
        if active is None or active.is_done or active.is_paused:
            return True
        engine = active.job.engine
        return engine is None or not getattr(engine, "is_mid_update", False)

    def _switch_to(self, member: Member | None) -> None:
        old = self._active
        if old is member:
            return
        if old is not None and old.job.engine is not None and hasattr(old.job.engine, "set_window"):
            old.window = old.job.engine.num_window_layers
            old.job.engine.set_window(0)  # its lent chunks go back before the lender attaches the new engine
        if member is not None and member.window is not None and member.job.engine is not None:
            member.job.engine.set_window(member.window)  # as memory allows; the lender grows it from there
            member.window = None
        self._active = member
        if member is not None:
            self._last_active = member
        if old is not None and member is not None:
            self.num_switches += 1

    # ---- the controller's job interface (scheduler thread) ----

    def poll(self) -> None:
        for member in list(self.members.values()):  # the admin thread may add one meanwhile
            member.job.poll()
            if member.remaining_tokens == 0 and member.finished_s is None:
                member.finished_s = self.clock()
        if self._can_switch():
            self._switch_to(self.pick())
        has_work = self._active is not None and self._active.job.has_ready_work()
        now = self.clock()
        if has_work and self._busy_since_s is None:
            self._busy_since_s = now
        elif not has_work and self._busy_since_s is not None:
            self._busy_s += now - self._busy_since_s
            self._busy_since_s = None

    def has_ready_work(self) -> bool:
        active = self._active
        return active is not None and not active.is_done and active.job.has_ready_work()

    @property
    def is_fetching(self) -> bool:
        """The active job's next unit waits for its layer's fetch: it becomes ready by itself, soon."""
        return self._active is not None and self._active.job.state == FinetuneState.WAITING

    @property
    def state(self) -> FinetuneState:
        if self._active is not None:
            return self._active.job.state
        live = [m for m in list(self.members.values()) if not m.is_done]
        if not live:
            return FinetuneState.FINISHED
        return FinetuneState.PAUSED if all(m.is_paused for m in live) else FinetuneState.WAITING

    @property
    def is_active(self) -> bool:
        return self._active is not None and self._active.job.is_active

    @property
    def engine(self):
        return self._active.job.engine if self._active is not None else None

    @property
    def max_unit_ms(self) -> float | None:
        return self._active.job.max_unit_ms if self._active is not None else None

    @property
    def current(self) -> Member | None:
        """The active member, else the one that was active last (None before any ran)."""
        return self._active or self._last_active

    @property
    def active_name(self) -> str | None:
        return self._active.spec.name if self._active is not None else None

    def request_unit_bound(self, max_unit_ms: float | None) -> None:
        """FinetuneJob.request_unit_bound, for whichever member runs next (each takes it at its next unit)."""
        self.requested_unit_ms = max_unit_ms

    def next_unit_kind(self) -> str:
        return self._active.job.next_unit_kind()

    def next_unit_predicted_ms(self) -> float | None:
        return self._active.job.next_unit_predicted_ms()

    def run_unit(self):
        member = self._active
        member.job.request_unit_bound(self.requested_unit_ms)
        result = member.job.run_unit()
        if result is not None:
            member.num_trained_tokens += result.num_trained_tokens
            member.used_ms += result.duration_ms
            self._num_trained_tokens += result.num_trained_tokens
            if member.remaining_tokens == 0:
                member.finished_s = self.clock()
        return result

    def note_no_room(self) -> None:
        if self._active is not None:
            self._active.job.note_no_room()

    def stats(self) -> dict:
        rate = self.harvest_tokens_per_s()
        return {
            "active": self.active_name,
            "harvest_tokens_per_s": None if rate is None else round(rate, 3),
            "num_switches": self.num_switches,
            "jobs": {name: self.member_stats(m) for name, m in list(self.members.items())},
        }

    def member_stats(self, member: Member) -> dict:
        rate = self.harvest_tokens_per_s()
        slack = self.slack_s(member)
        return {
            "state": self.job_state(member),
            "priority": member.spec.priority,
            "deadline_s": member.spec.deadline_s,
            "tokens": member.num_trained_tokens,
            "remaining_tokens": member.remaining_tokens,
            "slack_s": None if slack is None else round(slack, 3),
            "predicted_finish_s": (None if rate is None or member.is_done
                                   else round(self.clock() + member.remaining_tokens / rate, 3)),
            "adapter": member.spec.adapter_name,
        }
