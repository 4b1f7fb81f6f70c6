"""A PD deployment's prefill worker where the decode worker publishes its adapter: SGLang's own server
(`python -m harvest.sglang.prefill_worker` takes `sglang.launch_server`'s flags) with LoRA on, so that it
loads each published version and computes the prompts of requests naming it. On a host without CUDA its
scheduler process makes host-memory pinning a no-op first, as harvest's decode worker does (cpu_lora.py),
and a version loaded again under its name replaces the last atomically (lora_replace.py).
Without publishing the deployment runs `sglang.launch_server` itself (pd_flags.prefill_command).

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import os
import sys

from harvest.sglang.cpu_lora import disable_pinned_memory_without_cuda
from harvest.sglang.lora_replace import install_atomic_replace


def run_scheduler_process(server_args, *args):
    from sglang.srt.managers import scheduler


    disable_pinned_memory_without_cuda()
    return scheduler.run_scheduler_process(server_args, *args)


def main(argv: list[str]) -> None:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree


    server_args = prepare_server_args(argv)
    install_atomic_replace()
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
