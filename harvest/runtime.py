"""The harvest side of a decode worker: sees every decode step, keeps stats, serves the admin API.

Lives in SGLang's scheduler process; `harvest.sglang_plugin` calls it, with SGLang's objects already
reduced to a `DecodeStep`, so nothing here depends on SGLang.
"""

import logging
import time

from harvest.admin.metrics import HarvestMetrics
from harvest.config import ServeConfig
from harvest.decode_step import DecodeStep
from harvest.step_stats import StepStats

logger = logging.getLogger(__name__)


class HarvestRuntime:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.stats = StepStats(config.stats_window_steps)
        self.metrics = HarvestMetrics()
        self._running: dict[int, DecodeStep] = {}
        self._admin_server = None

    def start_admin(self) -> None:
        from harvest.admin.admin_server import AdminServer

        self._admin_server = AdminServer(self, self.config.admin)
        self._admin_server.start()

    def stop(self) -> None:
        if self._admin_server is not None:
            self._admin_server.stop()

    def step_launched(self, step: DecodeStep) -> None:
        self._running[step.forward_iter] = step

    def step_finished(self, forward_iter: int) -> DecodeStep | None:
        step = self._running.pop(forward_iter, None)
        if step is None:
            return None
        step.latency_ms = (time.perf_counter() - step.start_s) * 1e3
        self.stats.record(step)
        self.metrics.decode_steps.inc()
        self.metrics.decode_tokens.inc(step.batch_size)
        self.metrics.step_latency.observe(step.latency_ms / 1e3)
        self.metrics.batch_size.set(step.batch_size)
        return step

    def stats_snapshot(self, window_steps: int | None = None) -> dict:
        return {"decode": self.stats.snapshot(window_steps)}

    def steps_since(self, seq: int, limit: int) -> list[dict]:
        return self.stats.steps_since(seq, limit)

    def render_metrics(self) -> bytes:
        self.metrics.uptime.set(time.time() - self.stats.started_s)
        return self.metrics.render()
