"""AllocatorMetrics: UnifiedAllocator.stats() as Prometheus gauges, in the registry the caller owns."""

from prometheus_client import CollectorRegistry, Gauge

CHUNK_STATES = ("total", "kv", "lent", "reserved", "free", "lent_idle")


class AllocatorMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.chunks = Gauge("harvest_allocator_chunks", "Chunks of the unified pool by state", ["state"],
                            registry=registry)
        self.lent_bytes = Gauge("harvest_allocator_lent_bytes", "Bytes of chunks lent to the finetune job",
                                registry=registry)
        self.fragmentation_bytes = Gauge("harvest_allocator_fragmentation_bytes",
                                         "Bytes of blocks backing finetune tensors that no tensor uses",
                                         registry=registry)
        self.reserve_bytes = Gauge("harvest_allocator_reserve_bytes", "KV bytes kept free for decode growth",
                                   registry=registry)

    def update(self, stats: dict) -> None:
        for state in CHUNK_STATES:
            self.chunks.labels(state=state).set(stats[f"chunks_{state}"])
        self.lent_bytes.set(stats["lent_bytes"])
        self.fragmentation_bytes.set(stats["fragmentation_bytes"])
        self.reserve_bytes.set(stats["reserve_bytes"])
