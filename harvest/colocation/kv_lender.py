"""KvLender: the decode worker's free KV-cache memory lent to the finetune job, step by step (HARLI sec. 4).

Owns the unified allocator that backs SGLang's KV pool. Between decode steps, in the scheduler thread
(the only thread that touches KV slots or lent memory):
  1. demand: the KV slots decode needs before its next step, on top of the HARLI reserve;
  2. reclaim: while free slots are under that floor, the allocator returns idle chunks or drains a partly
     used one; if that is not enough, the lender asks the job to shrink its window by one layer - at most one
     shrink per step, so decode never waits longer - and returns what it freed;
  3. grow: after a step that needed no reclaim, fetch the layer the job waits on, or grow the window
     by one layer, as far as the job wants.
The lender is the one place that decides what is lent and taken back: the allocator moves chunks when told and
says whether decode is short (`needs_reclaim`), the engine exposes window verbs (`set_window`, `shrink_window`),
and nothing below calls back up. The engine takes its window's memory from the allocator (`weight_memory`); a
chunk is lent when a layer is fetched and free KV can spare it.
"""

import time

from allocator.unified_allocator import UnifiedAllocator

# Allocator stats sort SGLang's free slot list, so only the scheduler thread may compute them; it refreshes
# the copy the admin API reads at most this often (the sort grows with the pool).
STATS_REFRESH_S = 0.5


class KvLender:
    def __init__(self, allocator: UnifiedAllocator):
        self.allocator = allocator
        self.engine = None
        self.max_window_layers = 0
        self.num_grows = 0
        self.num_shrinks = 0
        self.last_rebalance_ms = 0.0
        self.lends_to = "nothing: no job built yet"
        self._stats = self._fresh_stats()
        self._stats_s = time.monotonic()

    @property
    def weight_memory(self) -> UnifiedAllocator:
        return self.allocator

    def attach_engine(self, engine, max_window_layers: int) -> None:
        """The finetune engine is built: reclaim may shrink its window; growth stops at max_window_layers."""
        self.engine = engine
        self.max_window_layers = max_window_layers
        self.lends_to = "the job's weight window"

    def detach_engine(self) -> None:
        """The job failed or ended: its memory is gone, lent chunks go back to KV."""
        self.engine = None
        self.lends_to = "nothing: the job ended"
        self.allocator.return_idle_chunks()

    def note_nothing_to_lend(self, reason: str) -> None:
        """The job has no window (it computes on the served weights): the lender lends nothing, says why."""
        note = f"nothing: {reason}"
        if note != self.lends_to:
            self.lends_to = note
            self._stats, self._stats_s = self._fresh_stats(), time.monotonic()

    def rebalance(self, kv_demand_slots: int, can_grow: bool) -> bool:
        """Once per decode step and idle loop; True if it reclaimed or grew (its time is the finetune's)."""
        started = time.perf_counter()
        allocator, engine = self.allocator, self.engine
        allocator.set_kv_demand(kv_demand_slots)
        # Between steps nothing runs on the finetune tensors, so draining (copy, then remap) is safe.
        num_returned = allocator.maybe_reclaim(allow_drain=True)
        did_shrink = engine is not None and allocator.needs_reclaim()
        if did_shrink:
            self.num_shrinks += 1
            if engine.shrink_window():
                num_returned += allocator.maybe_reclaim(allow_drain=True)
        has_reclaimed = num_returned or did_shrink
        did_grow = False
        if can_grow and not has_reclaimed and engine is not None:
            if engine.num_window_layers and not engine.has_ready_work():
                # Waiting on a layer the memory had no room for: fetch what the window lacks, if KV spares it.
                engine.set_window(engine.num_window_layers)
                did_grow = engine.has_ready_work()
            elif engine.num_window_layers < self.max_window_layers:
                engine.set_window(engine.num_window_layers + 1)
                self.num_grows += 1
                did_grow = True
        self.last_rebalance_ms = (time.perf_counter() - started) * 1e3
        if time.monotonic() - self._stats_s > STATS_REFRESH_S:
            self._stats, self._stats_s = self._fresh_stats(), time.monotonic()
        return bool(has_reclaimed or did_grow)

    def needs_reclaim(self, kv_demand_slots: int) -> bool:
        """Whether decode's demand takes lent memory back now: the scheduler thread's only."""
        self.allocator.set_kv_demand(kv_demand_slots)
        return self.allocator.needs_reclaim()

    def may_grow(self) -> bool:
        """Whether a rebalance with room might grow the job's window (short of its most layers)."""
        engine = self.engine
        return engine is not None and engine.num_window_layers < self.max_window_layers

    def stats(self) -> dict:
        """The copy refreshed by the scheduler thread (safe to read from the admin thread)."""
        return self._stats

    def _fresh_stats(self) -> dict:
        return {**self.allocator.stats(), "lends_to": self.lends_to, "num_window_grows": self.num_grows,
                "num_shrink_calls": self.num_shrinks,
                "last_rebalance_ms": round(self.last_rebalance_ms, 3)}
