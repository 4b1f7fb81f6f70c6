"""Every touch point between harvest and SGLang: the one module to revisit when SGLang changes.

harvest gets into SGLang's scheduler subprocess (which owns the model, the KV pool and the device
context) through `launch_server(run_scheduler_process_func=...)`, and observes the decode loop through
SGLang's own plugin hook registry. No SGLang source is edited.

Hooked (SGLang 0.5.12, disaggregation/decode.py event loops):
  Scheduler.get_init_info         AFTER   scheduler built: start harvest's admin server
  Scheduler.run_batch             AROUND  a decode step is launched: note its shape and start time
  Scheduler.process_batch_result  AFTER   its tokens are out: the step's wall time is known
"""

import functools
import logging
import time

import sglang

from harvest.config import ServeConfig
from harvest.decode_step import DecodeStep
from harvest.runtime import HarvestRuntime

SGLANG_VERSION = "0.5.12"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"

logger = logging.getLogger(__name__)

if sglang.__version__ != SGLANG_VERSION:
    raise ImportError(f"harvest's SGLang hooks were written for sglang {SGLANG_VERSION}, found {sglang.__version__}")


def scheduler_process_target(config: ServeConfig):
    """The `run_scheduler_process_func` to give SGLang: picklable, carries harvest's config."""
    return functools.partial(run_scheduler_process, config)


def run_scheduler_process(config: ServeConfig, server_args, port_args, gpu_id, tp_rank, *args):
    from sglang.srt.managers import scheduler

    runtime = HarvestRuntime(config)
    install_hooks(runtime, serve_admin=tp_rank == 0)
    try:
        scheduler.run_scheduler_process(server_args, port_args, gpu_id, tp_rank, *args)
    finally:
        runtime.stop()


def install_hooks(runtime: HarvestRuntime, serve_admin: bool) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def after_init_info(result, scheduler, *args, **kwargs):
        if serve_admin:
            runtime.start_admin()
        return result

    def around_run_batch(run_batch, scheduler, batch, *args, **kwargs):
        start_s = time.perf_counter()
        result = run_batch(scheduler, batch, *args, **kwargs)
        if batch.forward_mode.is_decode():
            # run_batch numbered the batch (forward_iter) on entry; seq_lens_cpu: [batch_size] int64
            runtime.step_launched(
                DecodeStep(batch.forward_iter, batch.batch_size(), int(batch.seq_lens_cpu.sum()), start_s)
            )
        return result

    def after_process_batch_result(result, scheduler, batch, *args, **kwargs):
        if batch.forward_mode.is_decode():
            runtime.step_finished(batch.forward_iter)
        return result

    HookRegistry.register(f"{SCHEDULER}.get_init_info", after_init_info, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.run_batch", around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_batch_result", after_process_batch_result, HookType.AFTER)
    HookRegistry.apply_hooks()
