"""Times decode steps of chosen shapes through a running `harvest serve` worker.

For a point (batch_size, seq_len) it sends batch_size pre-filled requests of prompt length ~seq_len at
once, and reads back, from the worker's own step hook (/harvest/steps), the steps that ran at exactly
that batch size: the first few warm up, the median of the next `num_repeats` is the sample, and the
sample's seq_len is the measured mean KV length of those steps.

A step's recorded latency must be that step alone. It is, when the worker runs SGLang's normal (not
overlap) scheduler: with the overlap scheduler on a CPU the forward is synchronous, so a step's result is
processed only after the next step's forward and its "latency" spans two steps (measured: 960 ms recorded
for 476 ms between step ends, bs 16 x 512). The profiler checks this on every point: the median recorded
latency over the median interval between consecutive step ends, ~1 for a one-step record.
"""

import asyncio
import statistics
from dataclasses import dataclass, field

import httpx

from base.errors import HarvestError
from harvest.worker.client import (
    generate_prefilled,
    read_last_step_seq,
    read_steps_since,
)
from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample
from predictor.sampling_plan import SamplePoint

NUM_WARMUP_STEPS = 2
SPARE_STEPS = 4  # requests join the batch over a scheduler loop or two; extra tokens keep the full batch long enough
SPARE_GROWTH = 4  # each attempt again with 4x the spare steps: a GPU step (2-3 ms) is shorter than the joins
NUM_ATTEMPTS = 4  # a busy host can stagger the joins past the spare steps; the point is then sent again


@dataclass(slots=True)
class DecodeProfiler:
    url: str
    admin_url: str
    grid: PartitionGrid
    num_repeats: int
    can_pin: bool = False
    """The worker is spatial (`--pin-partition`): every partition is measured by pinning it, with the
    finetune job resumed for co-run points and paused for solo ones."""
    latency_to_interval: list[float] = field(default_factory=list, init=False)
    """Per measured point: median step latency / median interval between step ends (1 = one-step records)."""
    _pinned: tuple[int, int] | None = field(default=None, init=False)
    _next_room: int = field(default=1_000_000, init=False)

    def measure(self, point: SamplePoint) -> Sample:
        for attempt in range(NUM_ATTEMPTS):
            try:
                return self._measure_once(point, SPARE_STEPS * SPARE_GROWTH ** attempt)
            except _TooFewSteps as e:
                if attempt == NUM_ATTEMPTS - 1:
                    raise HarvestError(str(e)) from None

    def _measure_once(self, point: SamplePoint, spare_steps: int) -> Sample:
        if self.can_pin:
            self._pin(point.infer_sms, point.ft_sms)
        elif (point.infer_sms, point.ft_sms) != (self.grid.num_sms, 0):
            raise HarvestError(
                f"partition ({point.infer_sms}, {point.ft_sms}) cannot be forced through this worker; "
                "only the whole-device solo partition is profiled live"
            )
        num_new_tokens = NUM_WARMUP_STEPS + self.num_repeats + spare_steps
        # KV grows by one token per step: start half the run below seq_len so the mean lands on it.
        prompt_len = max(1, point.seq_len - num_new_tokens // 2)
        since = read_last_step_seq(self.admin_url)
        asyncio.run(self._send_batch(point.batch_size, prompt_len, num_new_tokens))
        steps = [s for s in read_steps_since(self.admin_url, since) if s["batch_size"] == point.batch_size]
        timed = steps[NUM_WARMUP_STEPS:NUM_WARMUP_STEPS + self.num_repeats]
        if len(timed) < self.num_repeats:
            raise _TooFewSteps(
                f"only {len(steps)} steps ran at batch size {point.batch_size} (need "
                f"{NUM_WARMUP_STEPS + self.num_repeats}): raise --max-running-requests or KV capacity"
            )
        ends = [s["end_s"] for s in timed]
        intervals_ms = [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]
        latency_ms = statistics.median(s["latency_ms"] for s in timed)
        if intervals_ms:
            self.latency_to_interval.append(latency_ms / max(statistics.median(intervals_ms), 1e-3))
        return Sample(
            infer_sm_ratio=self.grid.ratio(point.infer_sms),
            ft_sm_ratio=self.grid.ratio(point.ft_sms),
            batch_size=point.batch_size,
            seq_len=statistics.fmean(s["kv_tokens"] / s["batch_size"] for s in timed),
            latency_ms=latency_ms,
        )

    def _pin(self, infer_sms: int, ft_sms: int) -> None:
        if self._pinned == (infer_sms, ft_sms):
            return
        for path in (f"/harvest/partition?infer={infer_sms}&ft={ft_sms}",
                     "/harvest/finetune/resume" if ft_sms else "/harvest/finetune/pause"):
            response = httpx.post(self.admin_url + path, timeout=30)
            if response.status_code != 200:
                raise HarvestError(f"the worker refused {path}: {response.text}")
        self._pinned = (infer_sms, ft_sms)

    async def _send_batch(self, batch_size: int, prompt_len: int, num_new_tokens: int) -> None:
        async with httpx.AsyncClient(timeout=600) as client:
            rooms = range(self._next_room, self._next_room + batch_size)
            self._next_room += batch_size
            # Distinct token ids per request, inside even a tiny test vocabulary (512 ids); their values do
            # not matter to a decode step's time.
            await asyncio.gather(*(generate_prefilled(client, self.url, [(room + i) % 500 + 3 for i in
                                                                         range(prompt_len)], num_new_tokens, room)
                                   for room in rooms))


class _TooFewSteps(Exception):
    pass
