"""`harvest serve`'s own process: runs the SGLang worker as a child and owns its shutdown.

SGLang's server ends a SIGTERM drain by SIGKILLing its own process tree (exit -9), and a terminal's
Ctrl-C reaches every process in the group at once. The supervisor puts the worker in its own session,
turns SIGTERM and SIGINT into one orderly SIGTERM to it, waits for the drain, reaps every descendant,
and exits 0, so an operator or systemd sees a clean stop and no orphan.
"""

import logging
import multiprocessing
import os
import signal

import psutil

from harvest.config import ServeConfig

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 60.0
FINETUNE_STOP_TIMEOUT_S = 120.0  # one unit to finish plus writing the adapter and optimizer state  # SGLang polls its drain every 5 s; a few in-flight requests finish well within this


def supervise(server_args, config: ServeConfig, is_cpu_host: bool) -> int:
    worker = multiprocessing.get_context("spawn").Process(
        target=_run_worker, args=(server_args, config, is_cpu_host), name="harvest-worker"
    )
    worker.start()
    stopping = []

    def request_stop(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    descendants: list[psutil.Process] = []
    while worker.is_alive():
        descendants = _descendants(worker.pid) or descendants
        worker.join(timeout=0.5)
        if stopping and worker.is_alive():
            logger.warning("harvest: %s received, draining the worker", signal.Signals(stopping[0]).name)
            if config.finetune is not None:
                _checkpoint_finetune(config)
            os.kill(worker.pid, signal.SIGTERM)
            worker.join(timeout=DRAIN_TIMEOUT_S)
            if worker.is_alive():
                worker.kill()
    _reap(descendants)
    # The worker ends its own tree with SIGKILL after a requested drain: that is a clean stop.
    return 0 if stopping or worker.exitcode == 0 else 1


def _checkpoint_finetune(config: ServeConfig) -> None:
    """SGLang's drain ends in SIGKILL: the finetune job must checkpoint before it starts."""
    import httpx

    headers = {"Authorization": f"Bearer {config.admin.token}"} if config.admin.token else {}
    try:
        response = httpx.post(f"http://{config.admin.host}:{config.admin.port}/harvest/finetune/stop",
                              headers=headers, timeout=FINETUNE_STOP_TIMEOUT_S)
        logger.warning("harvest: finetune job %s", response.json().get("state", response.text))
    except httpx.HTTPError as e:
        logger.error("harvest: could not checkpoint the finetune job before shutdown: %s", e)


def _run_worker(server_args, config: ServeConfig, is_cpu_host: bool) -> None:
    os.setsid()  # terminal signals go to the supervisor only
    from harvest.sglang.launcher import launch

    launch(server_args, config, is_cpu_host)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _reap(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        process.kill()
    psutil.wait_procs(alive, timeout=5)
