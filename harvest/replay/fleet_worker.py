"""One decode worker of a simulated fleet: the harvest policy's controller on the worker's own load, with
every finetune unit logged (when it ended, how long it ran, what it trained), so the fleet's rounds can be
cut at unit ends afterwards (fleet_rounds.py). The sync is charged to finetune time, never to a decode step,
so it changes what units train, not when they run: the decode simulation does not depend on the rounds."""

import math
from array import array
from dataclasses import dataclass

import numpy as np

from harvest.replay.colocation_policies import HarvestPolicy
from harvest.replay.decode_simulator import DecodeSimulator, DeviceRun
from harvest.replay.simulated_job import SimulatedJob, SimulatedUnit


class LoggedJob(SimulatedJob):
    """A SimulatedJob that logs its units: co-run units end with their decode step, slice and idle units when
    the clock has run them."""

    def __init__(self, clock, unit_ms: float, tokens_per_s: float) -> None:
        super().__init__(clock, unit_ms, tokens_per_s)
        self.end_s, self.unit_ms, self.tokens = array("d"), array("d"), array("d")

    def run_unit(self) -> SimulatedUnit:
        unit = super().run_unit()
        self.end_s.append(self.clock())
        self.unit_ms.append(unit.duration_ms)
        self.tokens.append(unit.num_trained_tokens)
        return unit


@dataclass(slots=True)
class UnitLog:
    """A worker's finetune units in time order: [num_units] each."""

    end_s: np.ndarray
    unit_ms: np.ndarray
    tokens: np.ndarray

    @property
    def num_tokens(self) -> float:
        return float(self.tokens.sum())


@dataclass(slots=True)
class WorkerRun:
    run: DeviceRun
    units: UnitLog
    idle_unit_ms: float
    """The length of an idle-time unit: the run is extended to the fleet's span in units of it."""

    def extend_to(self, end_s: float) -> None:
        """Idle until end_s, as DeviceRun.extend_to counts it (the same tokens), in unit-long pieces so rounds
        can still be cut there."""
        start_s, rate = self.run.end_s, self.run.idle_tokens_per_s
        self.run.extend_to(end_s)
        if end_s <= start_s or rate <= 0:
            return
        num = math.ceil((end_s - start_s) * 1e3 / self.idle_unit_ms)
        ends = np.minimum(start_s + self.idle_unit_ms / 1e3 * np.arange(1, num + 1), end_s)
        ends[-1] = end_s
        ms = np.diff(ends, prepend=start_s) * 1e3
        u = self.units
        self.units = UnitLog(np.concatenate([u.end_s, ends]), np.concatenate([u.unit_ms, ms]),
                             np.concatenate([u.tokens, ms / 1e3 * rate]))


def simulate_worker(simulation, trace, request_ids: np.ndarray, config) -> WorkerRun:
    """The harvest policy on the rows `request_ids` of `trace`; `simulation`: the ReplaySimulation (profile,
    memory, rates); `config`: its ReplayConfig with this worker's seed."""
    policy = HarvestPolicy(simulation.profile, simulation.memory, simulation.rates, config, make_job=LoggedJob)
    run = DecodeSimulator(policy).run(trace, request_ids)
    job: LoggedJob = policy.job
    units = UnitLog(np.frombuffer(job.end_s), np.frombuffer(job.unit_ms), np.frombuffer(job.tokens))
    return WorkerRun(run, units, policy.unit_ms)
