"""A simulated device that replays what real workers measured: decode step times and finetune unit times
from a recording, in the order they were recorded, so the controller meets the host's stalls, warm-ups and
load as it met them, the same every run.

Decode: each recorded step becomes its ratio to the profile's prediction at its own shape (batch size, KV
tokens), and the recorded steps are laid end to end as a timeline of the host; a simulated step starting at
time t takes the profile's prediction at its shape times the ratio of the recorded step running at t (the
timeline cycling). A slow or loaded host, a stall, the spread of one batch size: all are in the ratio, they
carry over to the batch sizes the simulated load makes, and every policy meets them at the same moments
(indexed by step, a policy that takes fewer steps would meet less of a loaded stretch).
Units: the recorded units (kind, time, trained tokens) in order; on wrapping, each kind's first unit (the
process's warm-up of it) is not replayed again.
"""

import bisect
import gzip
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from base.errors import HarvestError
from harvest.colocation.finetune_job import FinetuneState
from harvest.replay.simulated_job import SimClock, SimulatedUnit


@dataclass(frozen=True, slots=True)
class Recording:
    """Decode steps and finetune units measured on real workers (eval/recordings/README.md names each source)."""

    name: str
    decode_steps: tuple[tuple[int, int, float], ...]
    """(batch_size, kv_tokens, latency_ms) of decode-alone steps, in the order they ran."""
    units: tuple[SimulatedUnit, ...]
    """Finetune units in the order they ran, each kind's warm-up included."""
    max_unit_ms: float
    """The unit bound the recorded job was cut to."""

    def __post_init__(self) -> None:
        if not self.decode_steps or not self.units:
            raise HarvestError(f"recording {self.name}: needs decode steps and units")
        if any(b < 1 or ms <= 0 for b, _, ms in self.decode_steps) or any(u.duration_ms <= 0 for u in self.units):
            raise HarvestError(f"recording {self.name}: batch sizes must be >= 1 and times > 0")

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            d = json.load(f)
        return cls(
            d["name"],
            tuple((int(b), int(kv), float(ms)) for b, kv, ms in d["decode_steps"]),
            tuple(SimulatedUnit(kind, float(ms), float(tokens)) for kind, ms, tokens in d["units"]),
            float(d["max_unit_ms"]),
        )

    def decode_ratios(self, latency_model, infer_sms: int) -> list[float]:
        """Each recorded step's latency over the profile's prediction for decode alone at its shape."""
        return [ms / latency_model.predict_solo_ms(infer_sms, b, kv / b) for b, kv, ms in self.decode_steps]

    @property
    def first_repeat_index(self) -> int:
        """Where replaying wraps to: past every kind's first unit."""
        seen: set[str] = set()
        last_first = 0
        for i, unit in enumerate(self.units):
            if unit.kind not in seen:
                seen.add(unit.kind)
                last_first = i
        return last_first + 1


class RecordedDecodeNoise:
    """The device's error from the profile as recorded, by the time a step starts (in place of log-normal
    noise)."""

    __slots__ = ("_ends_s", "_ratios", "_span_s")

    def __init__(self, recording: Recording, latency_model, infer_sms: int) -> None:
        self._ratios = recording.decode_ratios(latency_model, infer_sms)
        self._ends_s = list(itertools.accumulate(ms / 1e3 for _, _, ms in recording.decode_steps))
        self._span_s = self._ends_s[-1]

    def at(self, t_s: float) -> float:
        return self._ratios[bisect.bisect_right(self._ends_s, t_s % self._span_s)]


class RecordedJob:
    """SimulatedJob's interface, its units the recording's in order; ready while the lent KV memory holds a
    window."""

    state = FinetuneState.RUNNING
    is_active = True
    engine = None
    requested_unit_ms = None

    def __init__(self, clock: SimClock, recording: Recording) -> None:
        self.clock = clock
        self.is_ready = False
        self._units = recording.units
        self._wrap_to = min(recording.first_repeat_index, len(self._units) - 1)
        self._next = 0
        self.num_units_run = 0
        self.max_unit_ms = recording.max_unit_ms

    def poll(self) -> None:
        pass

    def has_ready_work(self) -> bool:
        return self.is_ready

    def next_unit_kind(self) -> str:
        return self._units[self._next].kind

    def next_unit_predicted_ms(self) -> None:
        return None  # the recording keeps units' times, not their sizes: a slice admits them by kind

    def run_unit(self) -> SimulatedUnit:
        unit = self._units[self._next]
        self._next = self._next + 1 if self._next + 1 < len(self._units) else self._wrap_to
        self.num_units_run += 1
        self.clock.advance_ms(unit.duration_ms)
        return unit

    def co_run(self, duration_ms: float, num_trained_tokens: float) -> SimulatedUnit:
        return SimulatedUnit("co_run", duration_ms, num_trained_tokens)

    def request_unit_bound(self, max_unit_ms: float | None) -> None:
        """A recording's units are the ones the worker ran, at its bound: replayed as they were."""

    def wake_s(self) -> float:
        return math.inf

    def note_no_room(self) -> None:
        pass
