"""Times the finetune engine alone: what `harvest profile --finetune CFG` records as finetune_throughput.

The engine runs the job's own units (embed, per-layer forward and backward, head, optimizer) for a few
optimizer steps after warm-up, in this process, with no decode running: the solo rate, on the whole device
or on each finetune partition (`measure_partitions`). The co-run rate beside decode is the worker's to
measure (live_profile.py); units on a CUDA device are timed to their stream's end (FinetuneEngine). The output_dir the YAML names is replaced by a scratch one, so no checkpoint lands there.
"""

import contextlib
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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
    def __init__(self, config_path: str | Path, num_steps: int = 3, max_unit_ms: float | None = None,
                 device: str = "cpu"):
        self.config_path = Path(config_path)
        self.num_steps = num_steps
        self.max_unit_ms = max_unit_ms
        self.device = device

    def measure(self, ft_sms: int = 1) -> FinetuneMeasurement:
        """The job alone on the whole device (`ft_sms`: the device's units, as the profile counts them)."""
        return self.measure_partitions({ft_sms: contextlib.nullcontext})[ft_sms]

    def measure_partitions(self, contexts: dict) -> dict[int, FinetuneMeasurement]:
        """The job alone on each partition: ft_sms -> a context factory that puts this thread's work on those
        units (ProfiledDevice.finetune_context: pinned cores, or a green-context stream). One engine, built and
        warmed on the whole device (on a CPU, OpenMP teams made first on every core: core_partitions.py),
        then `num_steps` optimizer steps per partition."""
        from harvest.finetune import FinetuneConfig, FinetuneEngine  # deferred: the engine loads torch

        started = time.perf_counter()
        measurements = {}
        with tempfile.TemporaryDirectory(prefix="harvest-profile-finetune-") as work_dir:
            overrides = {"output_dir": work_dir, "overwrite_output_dir": True, "save_steps": 10**9,
                         "max_steps": NUM_WARMUP_STEPS + self.num_steps * len(contexts)}
            # LlamaFactory prints its training example on stdout, which carries only the profile summary.
            with contextlib.redirect_stdout(sys.stderr):
                engine = FinetuneEngine.from_yaml(self.config_path, overrides, FinetuneConfig(
                    device=self.device, max_unit_ms=self.max_unit_ms))
                for _ in range(NUM_WARMUP_STEPS):
                    engine.run_step()
                setup_s = time.perf_counter() - started
                args = engine.llamafactory.training_args
                samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
                for ft_sms, context in contexts.items():
                    timed_started = time.perf_counter()
                    results, foreign_cores = _in_new_thread(_timed_steps, engine, self.num_steps, context)
                    measurements[ft_sms] = _measurement(ft_sms, results, self.num_steps, samples_per_step,
                                                        time.perf_counter() - timed_started, setup_s, foreign_cores)
        return measurements


def _timed_steps(engine, num_steps: int, context) -> tuple[list, float]:
    """num_steps optimizer steps of units inside `context`; (their results, foreign cores meanwhile)."""
    results = []
    last_step = engine.global_step + num_steps
    with context(), ForeignLoad([os.getpid()]) as load:
        while engine.global_step < last_step:
            results.append(engine.run_next_unit())
    return results, load.cores


def _in_new_thread(work, *args):
    """work(*args) in a thread of its own, as the worker's unit thread: on a CPU its OpenMP team is made
    inside the partition's cores (a team keeps the affinity it was made with, core_partitions.py), and a
    GPU stream context is per thread too. Its exception is raised here."""
    with ThreadPoolExecutor(1, thread_name_prefix="harvest-profile-finetune") as pool:
        return pool.submit(work, *args).result()


def _measurement(ft_sms: int, results: list, num_steps: int, samples_per_step: int, measure_s: float,
                 setup_s: float, foreign_cores: float) -> FinetuneMeasurement:
    num_tokens = sum(r.num_trained_tokens for r in results)
    num_samples = samples_per_step * num_steps
    units_ms = sum(r.duration_ms for r in results)
    throughput = FinetuneThroughput(
        ft_sms=ft_sms,
        tokens_per_s_solo=num_tokens / (units_ms / 1e3),
        tokens_per_s_colo=None,
        unit_ms=units_ms / len(results),
        samples_per_s_solo=num_samples / (units_ms / 1e3),
    )
    return FinetuneMeasurement(throughput, num_steps, len(results), num_tokens, num_samples, measure_s, setup_s,
                               foreign_cores)
