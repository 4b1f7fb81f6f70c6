"""Prometheus metrics of one worker, in their own registry so they never mix with SGLang's."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Decode steps of interest sit between ~5 ms (H100, small batch) and a few hundred ms (CPU).
STEP_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class HarvestMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.decode_steps = Counter("harvest_decode_steps", "Decode steps observed", registry=self.registry)
        self.decode_tokens = Counter(
            "harvest_decode_tokens", "Tokens produced by decode steps (sum of batch sizes)", registry=self.registry
        )
        self.step_latency = Histogram(
            "harvest_step_latency_seconds", "Decode step wall time, launch to result processed",
            buckets=STEP_LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.batch_size = Gauge("harvest_batch_size", "Batch size of the last decode step", registry=self.registry)
        self.uptime = Gauge("harvest_uptime_seconds", "Seconds since the worker started", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
