"""Times the finetune engine alone: what `harvest profile --finetune CFG` records as finetune_throughput.

The engine runs the job's own units (embed, per-layer forward and backward, head, optimizer) for a few
optimizer steps after warm-up, in this process, with no decode running: the solo rate. On a CPU the
device is one partition, so there is no co-run rate to measure: the worker interleaves whole units between
decode steps (temporal sharing), and the simulator inserts units of the measured mean duration into each
step's slack. The output_dir the YAML names is replaced by a scratch one, so no checkpoint lands there.
"""

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harvest.profiler.foreign_load import ForeignLoad
from predictor.finetune_throughput import FinetuneThroughput

NUM_WARMUP_STEPS = 1  # the first step pays one-time costs (allocator arenas, autograd graph set-up)


@dataclass(frozen=True, slots=True)
class FinetuneMeasurement:
    throughput: FinetuneThroughput
    num_steps: int
    num_units: int
    num_tokens: int
    num_samples: int
    measure_s: float
    """Wall time of the timed steps."""
    setup_s: float
    """Building the job (LlamaFactory parse, model, dataset) plus the warm-up steps."""
    foreign_cores: float
    """Cores other processes used during the timed steps (ForeignLoad): ~0 on a quiet host."""


class FinetuneProfiler:
    def __init__(self, config_path: str | Path, num_steps: int = 3, max_unit_ms: float | None = None):
        self.config_path = Path(config_path)
        self.num_steps = num_steps
        self.max_unit_ms = max_unit_ms

    def measure(self, ft_sms: int = 1) -> FinetuneMeasurement:
        from harvest.finetune import FinetuneConfig, FinetuneEngine

        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="harvest-profile-finetune-") as work_dir:
            overrides = {"output_dir": work_dir, "overwrite_output_dir": True, "save_steps": 10**9,
                         "max_steps": NUM_WARMUP_STEPS + self.num_steps}
            # LlamaFactory prints its training example on stdout, which carries only the profile summary.
            with contextlib.redirect_stdout(sys.stderr):
                engine = FinetuneEngine.from_yaml(self.config_path, overrides,
                                                  FinetuneConfig(device="cpu", max_unit_ms=self.max_unit_ms))
                for _ in range(NUM_WARMUP_STEPS):
                    engine.run_step()
                setup_s = time.perf_counter() - started
                results = []
                timed_started = time.perf_counter()
                with ForeignLoad([os.getpid()]) as load:
                    while not engine.is_finished:
                        results.append(engine.run_next_unit())
                measure_s = time.perf_counter() - timed_started
            args = engine.llamafactory.training_args
            samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        num_tokens = sum(r.num_trained_tokens for r in results)
        num_samples = samples_per_step * self.num_steps
        units_ms = sum(r.duration_ms for r in results)
        throughput = FinetuneThroughput(
            ft_sms=ft_sms,
            tokens_per_s_solo=num_tokens / (units_ms / 1e3),
            tokens_per_s_colo=None,
            unit_ms=units_ms / len(results),
            samples_per_s_solo=num_samples / (units_ms / 1e3),
        )
        return FinetuneMeasurement(throughput, self.num_steps, len(results), num_tokens, num_samples, measure_s,
                                   setup_s, load.cores)
