"""Which split a spatial worker without a profile runs, chosen by what each split trains live at the load of
the moment: the whole device to decode with the temporal slice after each step, or a finetune partition
beside decode (held across steps, spatial_controller.py). No profile: a profile's rates go stale as the host
and the load change (eval/results/cpu-2026-11-26/spatial-continuous.md), while the worker measures both here.

Time is cut into phases of at least PHASE_S; a phase runs one split, and its rate is the training work done over its
time: the tokens through the job's units (a token passes every unit of its optimizer step, so this rate does not
come in lumps as trained tokens do, counted once per micro-batch at its embedding). The idle turns between its steps
count too: the split changes how much of the time decode leaves idle (decode on fewer cores takes longer, and the
whole device's slices stretch its steps), and idle turns train on the whole device under either split, so work over
all the time is what the worker gets from the split. A gap longer than a phase counts for no split (a long idle
stretch would credit whichever split it fell in), nor do steps while the job has no ready work (its engine being
built). The split with the best recent rate runs next; another one gets a phase now and then to keep its rate
current, less often the further behind it was (EXPLORE_EVERY doubles up to its cap, and drops back when it comes
close). Within a partition's phase, a step whose batch decode on fewer cores would not serve in the target runs on
the whole device all the same (SpatialController._serving_split). A partition's step over the target all the same, a
miss its batches' fit did not see coming, ends its phase at once and caps the partition's batch below the one that
missed for CAP_PHASES (doubling each time it misses again, halving each phase it keeps the target): the larger the
batch, the less room decode's own stalls have under the target, so a stall misses at the largest batches first, and
the batches under the cap keep training beside decode (set aside whole instead, a partition's phases after a miss
went to the whole device at a fraction of its rate: eval/results/cpu-2026-11-29/amd-host/). A miss at a batch of one
sets the partition aside (a cap of 0) while decode on fewer cores may not keep the target at this load; the whole
device keeps it by the slice's own back-off.

Phase rates are noisy: a lull credits whichever split it fell in. So the worker starts on the even split (what a
user pins by hand, and what trains most once decode needs a core most of the time: `eval/results/cpu-2026-11-27/
load-sweep/`), and a split takes the lead from the one that has it only on CONFIRM_PHASES phases of its own: one
that beat it once runs again at once, and leads if its running rate still does. Each split's first phase counts
for none (a warm-up: the whole device's slice fit is still learning decode's cost, a partition's units their
co-run times). A warm-up lasts until what the split runs on has learned it (`is_learned`, the controller's say):
on the whole device, the slice's decode cost line and its overrun quantile. Until then its slices are cut to the
stand-in's worst case (each request costs a whole step), at a light load to nothing at all, so a phase that ended
sooner would rate the whole device far below what it trains (`eval/results/cpu-2026-11-29/chooser-whole-device/`).
It is learned once: the line is kept while other splits run. MAX_WARMUP_PHASES bounds it where the batch never
spreads enough to fit a line."""

import math
import time
from collections import deque
from dataclasses import dataclass

PHASE_S = 2.0
MIN_PHASE_STEPS = 8
"""A phase ends once PHASE_S of it were counted and it saw this many steps."""
MAX_WARMUP_PHASES = 15
"""A warm-up ends by this many phases' time counted, learned or not."""
RATE_WEIGHT = 0.5
"""Weight of a phase's rate in its split's running rate (the last two or three phases count)."""
EXPLORE_EVERY = (4, 32)
"""Phases between two runs of a split that is not the best: from the first number, doubled up to the second
while it stays far behind."""
CLOSE = 0.8
"""A split within this share of the best one's rate is close: it is tried again soon."""
CAP_PHASES = (4, 64)
CONFIRM_PHASES = 2
RECENT_PHASES = 32

WHOLE = None
"""The whole device to decode, finetune in the slice after each step."""
UNMEASURED = object()


@dataclass(slots=True)
class SplitRecord:
    unit_tokens_per_s: float | None = None
    num_phases: int = 0
    """Measured phases; the warm-up phase is not one."""
    is_warm: bool = False
    last_phase: int = -1
    explore_every: int = EXPLORE_EVERY[0]
    max_batch: int | None = None
    """The largest batch the partition serves until capped_until (None: no cap; 0: set aside)."""
    capped_until: int = 0
    capped_for: int = 0
    num_misses: int = 0


class SplitChooser:
    def __init__(self, pairs: list[tuple[int, int]], clock=time.perf_counter, phase_s: float = PHASE_S):
        """`pairs`: the (infer, ft) finetune partitions to choose among besides the whole device. Every call
        below takes `work`: the tokens through the job's units so far (Controller.unit_tokens)."""
        self.splits = [WHOLE, *(p for p in pairs if p[1] > 0)]
        self.clock = clock
        self.phase_s = phase_s
        self.records = {split: SplitRecord() for split in self.splits}
        self.current = even_split(self.splits[1:])
        self.leader = self.current
        self.phase = 0
        self._span_s = 0.0
        self._work = 0.0
        self._steps = 0
        self._missed = False
        self._missed_batch = 0
        """The smallest batch that missed in the current phase."""
        self._step_start: tuple[float, float] | None = None
        """(clock, work) when the step in flight started."""
        self._last_end: tuple[float, float] | None = None
        """When the last step's work ended; None after a step that measures no split (skip)."""
        self.recent: deque[dict] = deque(maxlen=RECENT_PHASES)

    def split_for_step(self, work: float, is_learned=lambda split: True) -> tuple[int, int] | None:
        """The split the next decode step runs on (None: the whole device); a phase that is over ends here.
        `is_learned(split)`: whether what the split runs on has learned what its warm-up is for."""
        now = (self.clock(), work)
        if self._last_end is not None and now[0] - self._last_end[0] <= self.phase_s:
            self._add(self._last_end, now)  # the time since the last step (idle turns too), and what ran in it
        if self._missed or (self._span_s >= self.phase_s and self._steps >= MIN_PHASE_STEPS
                            and self._warmup_is_over(is_learned)):
            self._end_phase()
        self._step_start = now
        return self.current

    def _warmup_is_over(self, is_learned) -> bool:
        return (self.records[self.current].is_warm or self._span_s >= MAX_WARMUP_PHASES * self.phase_s
                or is_learned(self.current))

    def record_step(self, work: float, is_slo_met: bool, batch_size: int) -> None:
        """A step of the current phase at `batch_size` is done, its slice too (the job had ready work): whether it
        kept the target on its split (a wait for an idle-time unit before it is not the split's)."""
        now = (self.clock(), work)
        self._add(self._step_start, now)
        self._last_end = now
        self._steps += 1
        if not is_slo_met and self.current is not WHOLE:
            self._missed_batch = batch_size if not self._missed else min(self._missed_batch, batch_size)
            self._missed = True

    def max_batch(self, split) -> float:
        """The largest batch `split` serves now: below the batch of its last misses while it is capped."""
        record = self.records[split]
        if record.max_batch is None or record.capped_until <= self.phase:
            return math.inf
        return record.max_batch

    def skip(self) -> None:
        """A step or an idle turn while the job had no ready work, or a step pinned through the admin API: the
        time until the next step measures no split."""
        self._last_end = None

    def _add(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        self._span_s += end[0] - start[0]
        self._work += end[1] - start[1]

    def _end_phase(self) -> None:
        rate = self._work / max(self._span_s, 1e-9)
        record = self.records[self.current]
        is_warmup = not record.is_warm
        self.recent.append({"phase": self.phase, "split": _name(self.current), "unit_tokens_per_s": round(rate, 3),
                            "steps": self._steps, "missed": self._missed, "warmup": is_warmup})
        record.is_warm = True
        if not is_warmup or self._missed:  # a miss in a warm-up is one all the same
            self._record(rate)
        self.phase += 1
        self.current = self._next()
        self._span_s, self._work, self._steps, self._missed, self._missed_batch = 0.0, 0.0, 0, False, 0

    def _record(self, rate: float) -> None:
        """The current split's phase is over: fold its rate in, cap its batch if it missed, space its tries."""
        split, record = self.current, self.records[self.current]
        best_before = self._best()
        record.unit_tokens_per_s = rate if record.unit_tokens_per_s is None else (
            RATE_WEIGHT * rate + (1 - RATE_WEIGHT) * record.unit_tokens_per_s)
        record.num_phases += 1
        record.last_phase = self.phase
        if self._missed:
            record.num_misses += 1
            cap = max(0, self._missed_batch - 1)
            record.max_batch = min(cap, self.max_batch(split))  # a cap in force only comes down
            record.capped_for = min(max(CAP_PHASES[0], 2 * record.capped_for), CAP_PHASES[1])
            record.capped_until = self.phase + record.capped_for
        elif split is not WHOLE:
            record.capped_for //= 2  # kept the target: the next miss caps it for less
        if best_before is not UNMEASURED and split != best_before:  # an exploration: how far behind was it?
            behind = record.unit_tokens_per_s < CLOSE * self.records[best_before].unit_tokens_per_s
            record.explore_every = min(2 * record.explore_every, EXPLORE_EVERY[1]) if behind else EXPLORE_EVERY[0]

    def _eligible(self) -> list:
        return [s for s in self.splits if s is WHOLE or self.max_batch(s) >= 1]

    def _best(self):
        """The best running rate among the leader and the splits measured CONFIRM_PHASES times (among all those
        measured while the leader is set aside and none is)."""
        measured = [s for s in self._eligible() if self.records[s].unit_tokens_per_s is not None]
        candidates = [s for s in measured
                      if s == self.leader or self.records[s].num_phases >= CONFIRM_PHASES] or measured
        return max(candidates, key=lambda s: self.records[s].unit_tokens_per_s, default=UNMEASURED)

    def _next(self):
        eligible = self._eligible()
        unmeasured = [s for s in eligible if self.records[s].unit_tokens_per_s is None]
        if unmeasured:  # the current split first: its warm-up is done
            return self.current if self.current in unmeasured else unmeasured[0]
        best = self.leader = self._best()
        rate = self.records[best].unit_tokens_per_s
        challengers = [s for s in eligible if self.records[s].num_phases < CONFIRM_PHASES
                       and self.records[s].unit_tokens_per_s > rate]
        if challengers:  # beat the leader on too few phases: once more, at once
            return challengers[0]
        due = [s for s in eligible if s != best
               and self.phase - self.records[s].last_phase > self.records[s].explore_every]
        return min(due, key=lambda s: self.records[s].last_phase) if due else best

    def stats(self) -> dict:
        return {"phase_s": self.phase_s, "phase": self.phase, "current": _name(self.current),
                "leader": _name(self.leader),
                "splits": {_name(s): {"unit_tokens_per_s": None if r.unit_tokens_per_s is None
                                      else round(r.unit_tokens_per_s, 3),
                                      "phases": r.num_phases, "misses": r.num_misses,
                                      "max_batch": None if self.max_batch(s) == math.inf else r.max_batch,
                                      "capped_until": r.capped_until, "explore_every": r.explore_every}
                           for s, r in self.records.items()},
                "recent_phases": list(self.recent)}


def even_split(pairs: list[tuple[int, int]]):
    """The finetune partition closest to half the device each for decode and the job (decode's side the larger
    where they differ); WHOLE where no pair has a finetune side. The chooser starts on it."""
    return max((p for p in pairs if p[1] > 0), key=lambda p: (min(p), p[0]), default=WHOLE)


def _name(split) -> str:
    return "whole" if split is WHOLE else f"{split[0]},{split[1]}"
