"""The finetune job and the device as the worker's controller sees them, simulated: `harvest replay
--simulate` runs the worker's own Controller and SplitPlanner against these, so what is simulated is the
decision code that runs (only the device is made up: its clock, its unit times, its co-run throughput).

Units take the profile's unit time on the whole device and train at the profile's whole-device solo rate
(the profile's finetune throughput; no noise: `latency_noise` is error between the profile's *decode*
model and the device). Co-run units train at the profile's co-run rate on the finetune partition for
the time decode runs beside them.
"""

import math
from dataclasses import dataclass

from harvest.colocation.controller import Controller
from harvest.colocation.finetune_job import FinetuneState
from harvest.step_stats import DecodeStep


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

    def next_unit_kind(self) -> str:
        return self._unit.kind

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


class SimulatedSpatialController(Controller):
    """SpatialController with the simulated device beside decode: co-run units train at the profile's
    co-run rate on ft_sms for as long as the step ran (no streams, no thread)."""

    mode = "spatial"

    def __init__(self, job, planner, slo, planner_source: str, co_run_tokens_per_s, clock: SimClock):
        super().__init__(job, planner, slo, planner_source, clock=clock, loop_overhead_ms=0.0)
        self._co_run_tokens_per_s = co_run_tokens_per_s
        self._ft_sms = 0

    def _start_co_run(self, decision, step: DecodeStep) -> None:
        self._ft_sms = decision.ft_sms if self.job.has_ready_work() else 0

    def _end_co_run(self, step: DecodeStep) -> float:
        if not self._ft_sms:
            return 0.0
        tokens = self._co_run_tokens_per_s(self._ft_sms) * step.latency_ms / 1e3
        return self.job.co_run(step.latency_ms, tokens).num_trained_tokens
