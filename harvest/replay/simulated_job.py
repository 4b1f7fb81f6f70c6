"""The finetune job and the device as the worker's controller sees them, simulated: `harvest replay
--simulate` runs the worker's own Controller and SplitPlanner against these, so what is simulated is the
decision code that runs (only the device is made up: its clock, its unit times, its co-run throughput, and
the unit thread's units on a finetune partition: SimulatedUnitRunner).

Units take the profile's unit time on the whole device and train at the profile's whole-device solo rate
(the profile's finetune throughput; no noise: `latency_noise` is error between the profile's *decode*
model and the device). Co-run units train at the profile's co-run rate on the finetune partition for as
long as it is granted.
"""

import contextlib
import math
from dataclasses import dataclass

from harvest.colocation.finetune_job import FinetuneState


class SimClock:
    """Seconds of simulated time; the controller reads it as it would read time.perf_counter."""

    __slots__ = ("t_s",)

    def __init__(self) -> None:
        self.t_s = 0.0

    def __call__(self) -> float:
        return self.t_s

    def advance_ms(self, ms: float) -> None:
        self.t_s += ms / 1e3


@dataclass(frozen=True, slots=True)
class SimulatedUnit:
    kind: str
    duration_ms: float
    num_trained_tokens: float

    @property
    def num_tokens(self) -> float:
        """Tokens through the unit (UnitResult's): a simulated unit trains its share of tokens as it runs."""
        return self.num_trained_tokens


class SimulatedJob:
    """FinetuneJob's scheduler-thread interface; ready while the lent KV memory holds a window."""

    state = FinetuneState.RUNNING
    is_active = True
    engine = None

    def __init__(self, clock: SimClock, unit_ms: float, tokens_per_s: float) -> None:
        self.clock = clock
        self.is_ready = False
        self.is_paused = False
        self._unit = SimulatedUnit("unit", unit_ms, tokens_per_s * unit_ms / 1e3)
        self._bound_unit = self._unit
        """The unit the job's own bound cuts (request_unit_bound(None) goes back to it)."""
        self.requested_unit_ms: float | None = None
        self._co_run: SimulatedUnit | None = None

    def poll(self) -> None:
        pass

    def has_ready_work(self) -> bool:
        return self.is_ready and not self.is_paused

    def pause(self) -> None:
        self.is_paused = True

    def resume(self) -> None:
        self.is_paused = False

    @property
    def max_unit_ms(self) -> float:
        return self._unit.duration_ms

    def request_unit_bound(self, max_unit_ms: float | None) -> None:
        """FinetuneJob's: units of `max_unit_ms` from now on (None: the job's own), training at the same rate,
        on the whole device and on a partition (SimulatedUnitRunner's)."""
        self.requested_unit_ms = max_unit_ms
        unit = self._bound_unit
        if max_unit_ms is not None:
            unit = SimulatedUnit(unit.kind, max_unit_ms, unit.num_trained_tokens * max_unit_ms / unit.duration_ms)
        self._unit = unit

    def next_unit_kind(self) -> str:
        return self._unit.kind

    def next_unit_predicted_ms(self) -> None:
        return None  # units of one size: their kind's times are their size's

    def run_unit(self) -> SimulatedUnit:
        if self._co_run is not None:
            unit, self._co_run = self._co_run, None
            return unit
        self.clock.advance_ms(self._unit.duration_ms)
        return self._unit

    def stage_co_run(self, duration_ms: float, num_trained_tokens: float) -> None:
        """Make the next run_unit the work done beside a decode step (its time is already on the clock)."""
        self._co_run = SimulatedUnit("co_run", duration_ms, num_trained_tokens)

    def co_run(self, duration_ms: float, num_trained_tokens: float) -> SimulatedUnit:
        """Account the finetune partition's work beside a decode step as a unit of this job."""
        self.stage_co_run(duration_ms, num_trained_tokens)
        return self.run_unit()

    def wake_s(self) -> float:
        """When work may next become ready with nothing else changing (a job set's next arrival); inf: never."""
        return math.inf

    def note_no_room(self) -> None:
        pass


class SimulatedPartitions:
    """The simulated device's partitions: SMs in name only (no thread is pinned, no stream made)."""

    granularity = 1

    def __init__(self, num_sms: int) -> None:
        self.num_sms = num_sms

    def decode_context(self, infer_sms: int, ft_sms: int):
        return contextlib.nullcontext()

    def decode_stream(self, infer_sms: int, ft_sms: int):
        return None

    def finetune_context(self, infer_sms: int, ft_sms: int):
        return contextlib.nullcontext()

    def whole_device_context(self):
        return contextlib.nullcontext()


class SimulatedUnitRunner:
    """The worker's unit thread on the simulated device (SpatialController's runner): from its grant the job runs
    units of `unit_ms` (or of the bound the controller asked the job for) back to back on the partition, training
    at the profile's co-run rate there; a revoke waits on the simulated clock for the unit in flight to end."""

    def __init__(self, job, clock: SimClock, co_run_tokens_per_s, unit_ms: float) -> None:
        self.job, self.clock = job, clock
        self._co_run_tokens_per_s = co_run_tokens_per_s
        self.unit_ms = unit_ms
        self._partition: tuple[int, int] | None = None
        self._granted_s = self._taken_s = 0.0
        self._tokens = self._unit_tokens = 0.0

    def grant(self, partition: tuple[int, int]) -> None:
        self._partition = partition
        self._granted_s = self._taken_s = self.clock()

    def revoke(self) -> float:
        if self._partition is None:
            return 0.0
        unit_ms = self.job.requested_unit_ms or self.unit_ms
        waited_ms = -((self.clock() - self._granted_s) * 1e3) % unit_ms
        self.clock.advance_ms(waited_ms)
        self._accrue()
        self._partition = None
        return waited_ms

    def take_work(self) -> tuple[float, float]:
        self._accrue()
        work, self._tokens, self._unit_tokens = (self._tokens, self._unit_tokens), 0.0, 0.0
        return work

    def pending_work(self) -> tuple[float, float]:
        return self._tokens, self._unit_tokens

    def stats(self) -> None:
        return None

    def job_at_boundary(self, wait: bool):
        return contextlib.nullcontext(True)

    def withdraw(self) -> None:
        pass

    def close(self) -> None:
        self._partition = None

    def _accrue(self) -> None:
        """Account the partition's work since the last look as a unit of the job."""
        now = self.clock()
        if self._partition is not None and now > self._taken_s:
            duration_ms = (now - self._taken_s) * 1e3
            tokens = self._co_run_tokens_per_s(self._partition[1]) * duration_ms / 1e3
            unit = self.job.co_run(duration_ms, tokens)
            self._tokens += unit.num_trained_tokens
            self._unit_tokens += unit.num_tokens
        self._taken_s = now
