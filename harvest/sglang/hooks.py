"""harvest inside SGLang's scheduler process: the hooks on its decode loop and KV pool construction.

harvest gets into SGLang's scheduler subprocess (which owns the model, the KV pool and the device
context) through `launch_server(run_scheduler_process_func=...)`, and observes the decode loop through
SGLang's own plugin hook registry. No SGLang source is edited.

Hooked (the SGLang of version.py: disaggregation/decode.py event loops, model_runner_kv_cache_mixin.py):
  ModelRunner._init_pools         AROUND  KV pool over the unified allocator's chunks, chunk-aware slots
  Scheduler.get_init_info         AFTER   scheduler built: hand the job the served weights (served_weights.py),
                                          start the finetune job and the admin server
  CudaGraphRunner.maybe_init_pdmux AROUND  spatial mode: decode graphs captured per partition stream
  CudaGraphRunner.capture, capture_one_batch_size, can_run  AROUND  the partition streams' sets capped in
                                          batch size and timed; a batch over the cap decodes eagerly
  Scheduler.run_batch             AROUND  a decode step: plan it, note its shape and start time, run it on
                                          its partition's stream (step_streams.py)
  Scheduler.process_batch_result  AFTER   its tokens are out: time it, give finetune what it left
  Scheduler.on_idle               AFTER   no batch to run: one finetune unit, or none to run: wait for a request
                                          off the interpreter lock (request_wait.py)
  Scheduler._check_full_pool      AROUND  the idle leak check counts lent slots as accounted for
  Scheduler.load_lora_adapter_from_tensors  AROUND  a published adapter's load, timed and charged
  Scheduler.unload_lora_adapter   AROUND  an old version's unload, timed and charged

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import contextlib
import faulthandler
import functools
import logging
import os
import signal
import time

import psutil
import torch

from allocator import AllocatorConfig, UnifiedAllocator
from base.errors import HarvestError
from harvest.config import ServeConfig
from harvest.runtime import HarvestRuntime
from harvest.sglang.request_wait import RequestWait
from harvest.sglang.step_streams import StepStreams
from harvest.sglang.stream_groups import StreamGroups
from harvest.sglang.version import require_pinned_sglang
from harvest.step_stats import DecodeStep
from harvest.worker.start_failure import report_start_failure

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
CUDA_GRAPH_RUNNER = "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"

logger = logging.getLogger(__name__)

require_pinned_sglang()


def scheduler_process_target(config: ServeConfig):
    """The `run_scheduler_process_func` to give SGLang: picklable, carries harvest's config."""
    return functools.partial(run_scheduler_process, config)


def run_scheduler_process(config: ServeConfig, server_args, port_args, gpu_id, tp_rank, *args):
    from sglang.srt.managers import scheduler

    # `kill -USR2` on the sglang::scheduler process prints every thread's stack into the worker's log: where a
    # hung decode loop or finetune unit waits, on a host without py-spy (a lent GPU).
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    runtime = HarvestRuntime(config)
    if server_args.enable_lora:
        from harvest.sglang.cpu_lora import disable_pinned_memory_without_cuda

        disable_pinned_memory_without_cuda()
    install_hooks(runtime, serve_admin=tp_rank == 0)
    try:
        scheduler.run_scheduler_process(server_args, port_args, gpu_id, tp_rank, *args)
    finally:
        runtime.stop()


def start_up_hook(hook):
    """A hook that runs while the scheduler starts: a HarvestError in it stops the worker with that one line
    (the supervisor prints it), not SGLang's traceback of it. SGLang's own handler is followed otherwise: the
    parent gets SIGQUIT and ends the worker's tree."""
    @functools.wraps(hook)
    def wrapped(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except HarvestError as e:
            logger.error("harvest: %s", e)
            report_start_failure(str(e))
            psutil.Process().parent().send_signal(signal.SIGQUIT)
            os._exit(2)

    return wrapped


def install_hooks(runtime: HarvestRuntime, serve_admin: bool) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType


    state = {"allocator": None, "stream_groups": None, "step_streams": None, "request_wait": None}

    @start_up_hook
    def around_maybe_init_pdmux(maybe_init_pdmux, graph_runner, *args, **kwargs):
        """Spatial mode: capture decode's graphs once per partition stream, on that stream (stream_groups.py)."""
        model_runner = graph_runner.model_runner
        partitions = None if model_runner.is_draft_worker else runtime.green_partitions(model_runner.gpu_id)
        if partitions is not None:
            import torch

            gpu_id = model_runner.gpu_id
            # capture_bs: SGLang's batch sizes, set before maybe_init_pdmux (cuda_graph_runner.py:655-672).
            pairs, max_bs = runtime.graph_plan(partitions, graph_runner.capture_bs)
            groups = StreamGroups(partitions, pairs, runtime.config.pinned_partition,
                                  runtime.graph_sets, max_bs,
                                  lambda: torch.cuda.mem_get_info(gpu_id)[0])
            groups.install(gpu_id)
            model_runner.decode_attn_backend_group = [model_runner._get_attention_backend()
                                                      for _ in range(groups.num_groups)]
            graph_runner.enable_pdmux = True
            graph_runner.harvest_stream_groups = state["stream_groups"] = runtime.stream_groups = groups
            runtime.stream_groups_note = f"{groups.num_groups} (one decode graph set per partition stream)"
            logger.info("harvest: decode CUDA graphs captured on %d streams, decode SMs %s, largest batch %s",
                        groups.num_groups, groups.decode_sms, groups.group_max_bs)
        return maybe_init_pdmux(graph_runner, *args, **kwargs)

    @start_up_hook
    def around_init_pools(init_pools, runner, *args, **kwargs):
        if not runtime.wants_kv_lending or runner.is_draft_worker:
            return init_pools(runner, *args, **kwargs)
        reason = kv_lending_unsupported(runner)
        allocator_config = None if reason else allocator_config_for(runner, runtime.config)
        if allocator_config is not None and allocator_config.num_chunks < 2:
            reason = (f"the KV pool is one chunk of {allocator_config.slots_per_chunk} slots and chunk 0 is never "
                      "lent: raise --max-total-tokens or lower --kv-block-kib")
        if reason is not None:
            runtime.refuse_kv_lending(reason)
            logger.warning("harvest: KV lending off: %s", reason)
            return init_pools(runner, *args, **kwargs)
        allocator = state["allocator"] = UnifiedAllocator(allocator_config)
        with chunked_pool_classes(allocator):
            result = init_pools(runner, *args, **kwargs)
        from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator
        from harvest.sglang.chunked_kv_pool import ChunkedMHATokenToKVPool

        if not (isinstance(runner.token_to_kv_pool, ChunkedMHATokenToKVPool)
                and isinstance(runner.token_to_kv_pool_allocator, ChunkTokenToKVPoolAllocator)):
            raise HarvestError("SGLang built its KV pool without harvest's chunked classes: "
                               "harvest's _init_pools hook does not match this SGLang")
        allocator.attach_kv_slots(runner.token_to_kv_pool_allocator)
        runtime.attach_kv_pool(allocator)
        logger.info("harvest: KV pool over %d chunks of %d slots (%d MiB each), lendable to the finetune job",
                    allocator.config.num_chunks, allocator.config.slots_per_chunk,
                    allocator.config.blocks_per_chunk * allocator.config.block_bytes >> 20)
        return result

    def around_check_full_pool(check, scheduler, pool_stats, uncached=0, *args, **kwargs):
        num_lent = getattr(scheduler.token_to_kv_pool_allocator, "num_lent_slots", 0)
        return check(scheduler, pool_stats, uncached + num_lent, *args, **kwargs)

    @start_up_hook
    def after_init_info(result, scheduler, *args, **kwargs):
        if runtime.config.finetune is not None and serve_admin:
            from harvest.sglang.adapter_publisher import AdapterTarget

            args = scheduler.server_args
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            runtime.adapter_target = AdapterTarget([*runtime.config.publish_to, f"http://{host}:{args.port}"], args)
        if runtime.config.finetune is not None:
            from harvest.sglang.served_weights import served_weights

            runtime.served_weights = served_weights(scheduler.tp_worker.model_runner)
        runtime.start(serve_admin, scheduler.gpu_id, scheduler.max_running_requests)
        return result

    def step_streams(scheduler) -> StepStreams:
        if state["step_streams"] is None:
            allocator = state["allocator"]
            state["step_streams"] = StepStreams(scheduler, state["stream_groups"],
                                                None if allocator is None else allocator.record_kv_stream)
        return state["step_streams"]

    def around_load_lora_from_tensors(load, scheduler, *args, **kwargs):
        started = time.perf_counter()
        result = load(scheduler, *args, **kwargs)
        runtime.adapter_changed("load", (time.perf_counter() - started) * 1e3, _lora_name(args))
        return result

    def around_unload_lora(unload, scheduler, *args, **kwargs):
        started = time.perf_counter()
        result = unload(scheduler, *args, **kwargs)
        runtime.adapter_changed("unload", (time.perf_counter() - started) * 1e3, _lora_name(args))
        return result

    def around_run_batch(run_batch, scheduler, batch, *args, **kwargs):
        if not batch.forward_mode.is_decode():
            return run_batch(scheduler, batch, *args, **kwargs)
        # seq_lens_cpu: [batch_size] int64; run_batch numbers the batch (forward_iter) on entry.
        step = DecodeStep(-1, batch.batch_size(), int(batch.seq_lens_cpu.sum()), time.perf_counter())
        runtime.step_launching(step)
        with runtime.decode_stream_context():
            result = step_streams(scheduler).run(lambda: run_batch(scheduler, batch, *args, **kwargs),
                                                 runtime.decode_stream, batch)
        step.forward_iter = batch.forward_iter
        runtime.step_launched(step)
        return result

    def after_process_batch_result(result, scheduler, batch, *args, **kwargs):
        if batch.forward_mode.is_decode():
            runtime.step_finished(batch.forward_iter, kv_demand_slots(scheduler) if runtime.lender else 0)
        return result

    def after_on_idle(result, scheduler, *args, **kwargs):
        wait_ms = runtime.on_idle(kv_demand_slots(scheduler) if runtime.lender else 0)
        # A transfer in flight (disaggregation's queues) is polled by the loop: only a fully idle one waits.
        if wait_ms > 0 and scheduler.is_fully_idle():
            if state["request_wait"] is None:
                state["request_wait"] = RequestWait(scheduler)
            state["request_wait"].wait(wait_ms)
        return result

    HookRegistry.register(f"{CUDA_GRAPH_RUNNER}.maybe_init_pdmux", around_maybe_init_pdmux, HookType.AROUND)
    HookRegistry.register(f"{CUDA_GRAPH_RUNNER}.capture", around_capture, HookType.AROUND)
    HookRegistry.register(f"{CUDA_GRAPH_RUNNER}.capture_one_batch_size", around_capture_one_batch_size,
                          HookType.AROUND)
    HookRegistry.register(f"{CUDA_GRAPH_RUNNER}.can_run", around_can_run, HookType.AROUND)
    HookRegistry.register(f"{MODEL_RUNNER}._init_pools", around_init_pools, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.get_init_info", after_init_info, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.run_batch", around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_batch_result", after_process_batch_result, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.on_idle", after_on_idle, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}._check_full_pool", around_check_full_pool, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.load_lora_adapter_from_tensors", around_load_lora_from_tensors,
                          HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.unload_lora_adapter", around_unload_lora, HookType.AROUND)
    HookRegistry.apply_hooks()


def around_capture(capture, graph_runner, *args, **kwargs):
    """SGLang's capture loop, less the (group, batch size) entries harvest skipped (stream_groups.py)."""
    result = capture(graph_runner, *args, **kwargs)
    groups = getattr(graph_runner, "harvest_stream_groups", None)
    if groups is not None:
        groups.drop_skipped(graph_runner.graphs, graph_runner.output_buffers)
    return result


def around_capture_one_batch_size(capture_one, graph_runner, bs, forward, stream_idx=None):
    """A partition stream's set holds batch sizes <= its cap only; each capture timed and its memory counted."""
    groups = getattr(graph_runner, "harvest_stream_groups", None)
    if groups is None:
        return capture_one(graph_runner, bs, forward, stream_idx)
    return groups.capture_one(lambda: capture_one(graph_runner, bs, forward, stream_idx), bs, stream_idx)


def around_can_run(can_run, graph_runner, forward_batch, *args, **kwargs):
    """A batch with no graph on the selected partition stream decodes eagerly there (StreamGroups.can_replay)."""
    groups = getattr(graph_runner, "harvest_stream_groups", None)
    if not can_run(graph_runner, forward_batch, *args, **kwargs):
        return False
    return groups is None or groups.can_replay(forward_batch.batch_size)


def _lora_name(args) -> str | None:
    """The adapter named by SGLang's load or unload request (its first argument)."""
    return getattr(args[0], "lora_name", None) if args else None


def kv_lending_unsupported(runner) -> str | None:
    """Why this worker's KV pool cannot be chunked (None: it can): harvest chunks SGLang's plain MHA pool
    with one-token pages."""
    from sglang.srt.utils.common import is_float4_e2m1fn_x2

    server_args = runner.server_args
    if runner.page_size != 1:
        return f"--page-size {runner.page_size}: lending tracks one-token KV slots"
    if runner.use_mla_backend or runner.is_hybrid_swa or runner.mambaish_config is not None:
        return "MLA and hybrid-attention KV pools are not chunked"
    if is_float4_e2m1fn_x2(runner.kv_cache_dtype) or runner.enable_hisparse:
        return "fp4 and HiSparse KV pools are not chunked"
    if server_args.attention_backend == "ascend" or server_args.prefill_only_disable_kv_cache:
        return "this attention backend's KV pool is not chunked"
    return None


def allocator_config_for(runner, serve_config: ServeConfig):
    """Unified allocator chunks covering the KV pool SGLang is about to build. T_release is one TPOT
    target: reclaim runs between decode steps, so lent memory is back within one step, and the HARLI
    reserve is one step's growth of the largest batch."""
    is_cuda = str(runner.device).startswith("cuda")
    return AllocatorConfig.for_kv_pool(
        runner.num_effective_layers, runner.model_config.get_num_kv_heads(1), runner.model_config.head_dim,
        torch.empty((), dtype=runner.kv_cache_dtype).element_size(), runner.max_total_num_tokens,
        granularity_bytes=serve_config.kv_block_kib * 1024, backend="cuda" if is_cuda else "host",
        device_index=runner.gpu_id if is_cuda else 0, release_ms=serve_config.tpot_slo_ms,
        tpot_target_ms=serve_config.tpot_slo_ms, max_batch=runner.max_running_requests)


@contextlib.contextmanager
def chunked_pool_classes(allocator):
    """While SGLang builds its pools, its MHATokenToKVPool and TokenToKVPoolAllocator are harvest's
    subclasses over the allocator's chunks (so the KV bytes are allocated once, in the chunks)."""
    from sglang.srt.model_executor import model_runner_kv_cache_mixin as pools

    from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator
    from harvest.sglang.chunked_kv_pool import ChunkedMHATokenToKVPool

    originals = pools.MHATokenToKVPool, pools.TokenToKVPoolAllocator
    pools.MHATokenToKVPool = functools.partial(ChunkedMHATokenToKVPool, chunk_pool=allocator.chunk_pool)
    pools.TokenToKVPoolAllocator = functools.partial(ChunkTokenToKVPoolAllocator,
                                                     slots_per_chunk=allocator.config.slots_per_chunk)
    try:
        yield
    finally:
        pools.MHATokenToKVPool, pools.TokenToKVPoolAllocator = originals


def kv_demand_slots(scheduler) -> int:
    """KV slots decode needs before its next step, by SGLang's own admission rule (disaggregation/decode.py
    pop_preallocated): each queued request's input plus its clipped max_new_tokens, and
    num_reserved_decode_tokens for every request queued or active."""
    from sglang.srt.disaggregation.decode import CLIP_MAX_NEW_TOKEN

    prealloc = scheduler.disagg_decode_prealloc_queue
    reserved = prealloc.num_reserved_decode_tokens
    queued = [r.req for r in prealloc.queue] + list(prealloc.retracted_queue)
    need = sum(len(req.origin_input_ids) + len(req.output_ids)
               + min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKEN) for req in queued)
    num_active = (len(scheduler.running_batch.reqs) + len(scheduler.disagg_decode_transfer_queue.queue)
                  + len(scheduler.waiting_queue))
    return need + reserved * (len(queued) + num_active)
