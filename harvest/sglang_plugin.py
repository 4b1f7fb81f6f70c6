"""Every touch point between harvest and SGLang: the one module to revisit when SGLang changes.

harvest gets into SGLang's scheduler subprocess (which owns the model, the KV pool and the device
context) through `launch_server(run_scheduler_process_func=...)`, and observes the decode loop through
SGLang's own plugin hook registry. No SGLang source is edited.

Hooked (SGLang 0.5.12, disaggregation/decode.py event loops):
  Scheduler.get_init_info         AFTER   scheduler built: start the finetune job and the admin server
  Scheduler.run_batch             AROUND  a decode step: plan it, note its shape and start time
  Scheduler.process_batch_result  AFTER   its tokens are out: time it, give finetune what it left
  Scheduler.on_idle               AFTER   no batch to run: one finetune unit
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
        runtime.start(serve_admin)
        return result

    def around_run_batch(run_batch, scheduler, batch, *args, **kwargs):
        if not batch.forward_mode.is_decode():
            return run_batch(scheduler, batch, *args, **kwargs)
        # seq_lens_cpu: [batch_size] int64; run_batch numbers the batch (forward_iter) on entry.
        step = DecodeStep(-1, batch.batch_size(), int(batch.seq_lens_cpu.sum()), time.perf_counter())
        runtime.step_launching(step)
        with runtime.decode_stream_context():
            result = run_batch(scheduler, batch, *args, **kwargs)
        step.forward_iter = batch.forward_iter
        runtime.step_launched(step)
        return result

    def after_process_batch_result(result, scheduler, batch, *args, **kwargs):
        if batch.forward_mode.is_decode():
            runtime.step_finished(batch.forward_iter)
        return result

    HookRegistry.register(f"{SCHEDULER}.get_init_info", after_init_info, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.run_batch", around_run_batch, HookType.AROUND)
    def after_on_idle(result, scheduler, *args, **kwargs):
        runtime.on_idle()
        return result

    HookRegistry.register(f"{SCHEDULER}.process_batch_result", after_process_batch_result, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.on_idle", after_on_idle, HookType.AFTER)
    HookRegistry.apply_hooks()
