"""`harvest serve`'s own process: runs the SGLang worker as a child and owns its shutdown.

SGLang's server ends a SIGTERM drain by SIGKILLing its own process tree (exit -9), and a terminal's
Ctrl-C reaches every process in the group at once. The supervisor puts the worker in its own session,
turns SIGTERM and SIGINT into one orderly SIGTERM to it, waits for the drain, reaps every descendant,
and exits 0, so an operator or systemd sees a clean stop and no orphan. If the supervisor itself dies
(kill -9, OOM killer), a watchdog thread in the worker notices, has the job checkpoint and stops the worker
the same way; SGLang's scheduler and detokenizer die with the worker (they set PR_SET_PDEATHSIG).

Deferred imports: httpx only where the supervisor polls a worker.
"""

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable

import psutil

from base.errors import HarvestError
from harvest.config import ServeConfig
from harvest.worker.start_failure import START_FAILURE_ENV, read_start_failure

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 60.0  # SGLang polls its drain every 5 s; a few in-flight requests finish well within this
FINETUNE_STOP_TIMEOUT_S = 120.0  # one unit to finish plus writing the adapter and optimizer state
PARENT_POLL_S = 0.5


def supervise(launch: Callable, server_args, config: ServeConfig, is_cpu_host: bool) -> int:
    """Run `launch(server_args, config, is_cpu_host)` (harvest.sglang.launcher.launch: the caller names it, so
    the process handle does not import SGLang's side) in a spawned worker and own its shutdown."""
    # The worker's files for its life: the start-failure line, and its job set where no --jobs-dir keeps it.
    # The supervisor owns them: the worker's own tree ends in SGLang's SIGKILL, so nothing in it outlives the
    # drain to remove them (a kill -9 of the supervisor leaves them, as it leaves the checkpoint).
    serve_dir = tempfile.mkdtemp(prefix="harvest-serve-")
    os.environ[START_FAILURE_ENV] = os.path.join(serve_dir, "start-failure")  # the worker and scheduler inherit it
    if config.finetune is not None and config.jobs_dir is None:
        config = dataclasses.replace(config, jobs_dir=os.path.join(serve_dir, "jobs"))
    try:
        return _supervise(launch, server_args, config, is_cpu_host)
    finally:
        os.environ.pop(START_FAILURE_ENV, None)
        shutil.rmtree(serve_dir, ignore_errors=True)


def _supervise(launch: Callable, server_args, config: ServeConfig, is_cpu_host: bool) -> int:
    worker = multiprocessing.get_context("spawn").Process(
        target=_run_worker, args=(launch, server_args, config, is_cpu_host, os.getpid()), name="harvest-worker"
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
    failure = None if stopping else read_start_failure()
    if failure is not None:
        raise HarvestError(failure)
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


def _run_worker(launch: Callable, server_args, config: ServeConfig, is_cpu_host: bool, supervisor_pid: int) -> None:
    os.setsid()  # terminal signals go to the supervisor only
    threading.Thread(target=_stop_when_orphaned, args=(supervisor_pid, config), name="harvest-orphan-watchdog",
                     daemon=True).start()
    launch(server_args, config, is_cpu_host)


def _stop_when_orphaned(supervisor_pid: int, config: ServeConfig) -> None:
    """In the worker: once the supervisor is gone (the worker was re-parented), do what its SIGTERM would
    have done: checkpoint the job, then SGLang's own drain, which ends by killing the worker's tree. A
    drain that hangs is cut short with SIGKILL to the tree; nobody is left to wait for it."""
    while os.getppid() == supervisor_pid:
        time.sleep(PARENT_POLL_S)
    logger.error("harvest: the supervisor (pid %d) is gone; stopping the worker", supervisor_pid)
    if config.finetune is not None:
        _checkpoint_finetune(config)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(DRAIN_TIMEOUT_S)
    for process in _descendants(os.getpid()):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    os.kill(os.getpid(), signal.SIGKILL)


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
