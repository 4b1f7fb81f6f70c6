"""Turns `harvest serve` flags into a running SGLang decode worker with harvest inside it.

harvest's own flags are parsed by the CLI; everything else is SGLang's and goes through SGLang's parser
unchanged, after harvest fills in what a decode worker on this host needs and the user left out.

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import argparse
import contextlib
import importlib.util
import io
import logging
import os
import warnings

from base.argv import flag_value, has_flag
from base.errors import HarvestError
from harvest.config import ServeConfig

logger = logging.getLogger(__name__)

# SGLang's CPU path: without the CPU engine flag rotary embedding reaches for vllm (shared/STACK.md).
CPU_ENGINE_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
CPU_FLAGS = {
    "--device": ["cpu"],
    "--attention-backend": ["torch_native"],
    "--disable-cuda-graph": [],
    # A CPU forward is synchronous, so overlap scheduling gains nothing there, and it processes a step's
    # result only after the next step ran: harvest would time two forwards as one step (eval/README.md,
    # "Serving overhead").
    "--disable-overlap-schedule": [],
}
GPU_FLAGS = {
    # Without a backend SGLang picks FA3 on Hopper (sglang 0.5.12 srt/server_args.py:2611,
    # `_get_default_attn_backend`), whose kernels are sgl_kernel's flash_ops, which the bundle strips
    # (wheel_repack.py, 1.07 GB); triton compiles its kernels with its own compiler, no nvcc.
    "--attention-backend": ["triton"],
}
JOB_FLAGS = {
    # The overlap schedule (SGLang's GPU default; srt/managers/scheduler.py:3923 picks
    # event_loop_overlap_disagg_decode) launches step n+1 before it processes step n's result
    # (srt/disaggregation/decode.py:1616-1624): the controller's before_step(n) would run before after_step(n-1)
    # and co-run time would be charged to the next step's partition.
    "--disable-overlap-schedule": [],
}
LONE_WORKER_FLAGS = {
    # A lone decode worker has no prefill worker to receive KV from: `fake` treats every request as prefilled.
    # SGLang's default is mooncake (srt/server_args.py:798), which the GPU bundle does not carry. In a PD
    # deployment (`harvest deploy`) mooncake moves the KV, over TCP where there is no RDMA device.
    "--disaggregation-transfer-backend": ["fake"],
}


NO_XGRAMMAR_FLAGS = {
    # SGLang builds its grammar backend when its scheduler starts, whenever it has a tokenizer
    # (srt/constrained/grammar_manager.py:30), and the default is xgrammar (srt/server_args.py:2971), which the
    # GPU bundle leaves out (bundle_builder.LEFT_OUT): the scheduler would die importing it. "none" serves
    # everything but structured output (JSON schema, regex, EBNF).
    "--grammar-backend": ["none"],
}


def host_flags(is_cpu_host: bool) -> dict[str, list[str]]:
    """SGLang flags every worker on this host needs, harvest's or a plain prefill worker."""
    installed = {} if importlib.util.find_spec("xgrammar") is not None else NO_XGRAMMAR_FLAGS
    return {**(CPU_FLAGS if is_cpu_host else GPU_FLAGS), **installed}


def worker_flags(is_cpu_host: bool, has_job: bool) -> dict[str, list[str]]:
    """SGLang flags a harvest decode worker gets unless the user gave them: the one place that decides them."""
    return {**host_flags(is_cpu_host), **(JOB_FLAGS if has_job else {}), **LONE_WORKER_FLAGS}




def build_sglang_argv(model_path: str, passthrough: list[str], is_cpu_host: bool, *, has_job: bool) -> list[str]:
    mode = flag_value(passthrough, "--disaggregation-mode")
    if mode not in (None, "decode"):
        raise HarvestError(f"--disaggregation-mode {mode}: harvest runs only as a decode worker")
    if has_job and has_flag(passthrough, "--sleep-on-idle"):
        raise HarvestError("--sleep-on-idle: SGLang would sleep up to a second every idle turn, so the finetune "
                           "job would train one unit a second while idle; harvest waits for requests itself "
                           "when there is no unit to run")
    argv = ["--model-path", model_path, "--disaggregation-mode", "decode", *passthrough]
    for flag, values in worker_flags(is_cpu_host, has_job).items():
        if not has_flag(passthrough, flag):
            argv += [flag, *values]
    return argv



class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise HarvestError(f"SGLang flags: {message}")


def parse_sglang_args(argv: list[str]):
    # Importing SGLang and validating its args prints a dozen warnings about this host; the worker's log
    # repeats what matters, and a bad flag must read as one line.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.server_args import ServerArgs

        parser = _RaisingParser(prog="harvest serve", add_help=False, allow_abbrev=False)
        ServerArgs.add_cli_args(parser)
        namespace = parser.parse_args(argv)
        try:
            server_args = ServerArgs.from_cli_args(namespace)
        except (ValueError, AssertionError) as e:  # SGLang validates its flags with both
            raise HarvestError(f"SGLang flags: {e}") from None
    if server_args.tp_size != 1 or server_args.dp_size != 1 or server_args.pp_size != 1:
        raise HarvestError("harvest co-locates on one decode GPU per worker: use --tp 1 --dp 1 --pp 1")
    return server_args


def launch(server_args, config: ServeConfig, is_cpu_host: bool) -> None:
    """Run the SGLang decode worker with harvest in its scheduler process; returns when it shuts down."""
    if is_cpu_host:
        os.environ.update(CPU_ENGINE_ENV)
    from sglang.srt.entrypoints.http_server import launch_server

    from harvest.sglang.hooks import scheduler_process_target
    from harvest.sglang.refused_requests import install_refused_request_hook

    install_refused_request_hook()
    if server_args.enable_lora:
        from harvest.sglang.lora_replace import install_atomic_replace

        install_atomic_replace()
    launch_server(server_args, run_scheduler_process_func=scheduler_process_target(config))
