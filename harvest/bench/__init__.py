"""Benchmarks of the whole worker (`harvest bench serve`) and of the job's units against their bound (`units`);
the subsystems keep their own `bench.py`.

Deferred imports: torch and the profiler's device probe only when a bench asks for the device's name.
"""

import os


def device_name(is_cpu_host: bool) -> str:
    """What a benchmark's JSON calls the machine it ran on: the CPU, and the GPU where there is one."""
    from harvest.profiler.profiled_device import cpu_model_name

    cpu = f"{cpu_model_name()}, {os.cpu_count()} cores"
    if is_cpu_host:
        return cpu
    import torch

    return f"GPU: {torch.cuda.get_device_name(0)} ({cpu})"
